"""Fusion groups and their axis maps: what fusion builds and every strategy reads.

A group is a set of primitive nodes that becomes one kernel, grown from its root (the value the
kernel writes). Every value in a group carries an axis map: for each of its axes, the domain axis
it walks (None where it is broadcast or has size 1). Values outside the group are read from
memory; views (transpose, slice, broadcast, reshape) of such values are read in place.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ops import registry as R
from .graph_ir import Node

LEAF = "leaf"       # map_from's answer for a user that reads its input from memory


@dataclass(eq=False)
class Group:
    kind: str                      # the strategy's name: pointwise | row | reduce | contract | ...
    root: Node
    domain: tuple                  # the iteration space (concrete sizes)
    reduced: tuple = ()            # domain axes reduced (row and reduce groups)
    nodes: list = field(default_factory=list)
    maps: dict = field(default_factory=dict)     # value id -> axis map
    anchor: Node | None = None     # the node a routine computes (a contraction, an attention)
    stores: list = field(default_factory=list)   # pointwise: more nodes whose values the kernel
                                                 # also writes (function outputs on its domain)

    def order(self, index):
        self.nodes.sort(key=index.__getitem__)


def lowering_of(n: Node):
    return n.opdef.lowering


def is_elementwise(n):
    return isinstance(lowering_of(n), R.Elementwise)


def is_reduce(n):
    return isinstance(lowering_of(n), R.Reduce)


def is_view(n):
    return isinstance(lowering_of(n), R.View)


def is_reshape(n):
    return is_view(n) and lowering_of(n).reshape


def squeezes_only(n: Node) -> bool:
    """A reshape that only adds or drops size-1 axes: it renames axes and moves no element."""
    if not is_reshape(n):
        return False
    a = [d for d in n.inputs[0].type.shape if d != 1]
    b = [d for d in n.out.type.shape if d != 1]
    return a == b


def identity_map(shape):
    return tuple(k if d != 1 else None for k, d in enumerate(shape))


def reduce_out_map(n: Node, domain) -> tuple:
    axes = set(n.attrs["axis"])
    kept = [k for k in range(len(domain)) if k not in axes]
    if n.attrs["keepdim"]:
        return tuple(None if (k in axes or domain[k] == 1) else k for k in range(len(domain)))
    return tuple(k if domain[k] != 1 else None for k in kept)


def map_from(user: Node, user_map: tuple, v) -> tuple | str:
    """The axis map of input v as `user` (whose own map is user_map) reads it."""
    if is_elementwise(user):
        pad = len(user.out.type.shape) - len(v.type.shape)
        return tuple(None if d == 1 else user_map[k + pad] for k, d in enumerate(v.type.shape))
    if is_reduce(user) or isinstance(lowering_of(user), (R.Spectral, R.ArgReduce)):
        return identity_map(v.type.shape)       # (their domain is their input's shape)
    if is_view(user) and squeezes_only(user):
        walked = iter(m for m, d in zip(user_map, user.out.type.shape) if d != 1)
        return tuple(None if d == 1 else next(walked) for d in v.type.shape)
    if user.op == "broadcast_to" and user.out.type.numel() <= 2 * v.type.numel():
        # at most doubling (a complex result's parts interleaved): computed twice, not stored
        pad = len(user.out.type.shape) - len(v.type.shape)
        return tuple(None if d == 1 and user.out.type.shape[k + pad] != 1 else user_map[k + pad]
                     for k, d in enumerate(v.type.shape))
    return LEAF


def is_column(domain, axes) -> bool:
    """A reduction that keeps the innermost (non-trivial) axis: it accumulates whole rows."""
    inner = [k for k, d in enumerate(domain) if d != 1]
    return bool(inner) and inner[-1] not in axes and any(domain[a] != 1 for a in axes)


def unit_inner_stride(p: Node) -> bool:
    src = p.inputs[0]
    _, strides = p.opdef.lowering.strides(src.type, p.out.type, p.attrs)
    return not strides or strides[-1] == 1 or p.out.type.shape[-1] == 1
