"""Fusion: the primitive graph cut into groups, each of which becomes one kernel.

Groups grow from their root (the value a kernel writes) towards its producers. A producer joins
when every one of its users is already in the group, so nothing a group computes is needed
elsewhere, and when the group can compute it in place instead of reading it from memory:

- pointwise: elementwise nodes, with broadcasting, computed as one expression per element;
- row: reductions sharing one domain and one set of reduced axes, with their elementwise
  prologue and epilogue (softmax, layernorm, logsumexp, ... however they were written);
- reduce: a reduction over leading axes with its elementwise prologue (column sums);
- contract: a matmul with its elementwise epilogue (scale, bias, activation, residual);
- copy/concat/gather/argreduce: alone.

A row kernel evaluates its prologue once per pass over the row (layernorm then softmax: four
passes). An expensive producer (a transcendental such as gelu's erf) that a matmul could take as
its epilogue stays out of such a row kernel: the matmul computes it once, while its tile is in
cache, and the row kernel reads the result.

Every value in a group carries an axis map: for each of its axes, the domain axis it walks
(None where it is broadcast or has size 1). Values outside the group are read from memory;
views (transpose, slice, broadcast, reshape) of such values are read in place, never copied.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from ..ops import registry as R
from .graph_ir import Graph, Node

LEAF = "leaf"       # map_from's answer for a user that reads its input from memory
EXPENSIVE_FLOPS = 8  # an elementwise op this costly (exp, erf, tanh polynomials) is not
                     # worth evaluating again on every pass of a row kernel


@dataclass(eq=False)
class Group:
    kind: str                      # pointwise | row | reduce | contract | argreduce | copy | ...
    root: Node
    domain: tuple                  # the iteration space (concrete sizes)
    reduced: tuple = ()            # domain axes reduced (row and reduce groups)
    nodes: list = field(default_factory=list)
    maps: dict = field(default_factory=dict)     # value id -> axis map
    anchor: Node | None = None     # the contraction of a contract group
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


def squeezes_only(n: Node) -> bool:
    """A reshape that only adds or drops size-1 axes: it renames axes and moves no element."""
    if n.op != "reshape":
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
    if is_reduce(user):
        return identity_map(v.type.shape)
    if is_view(user) and squeezes_only(user):
        walked = iter(m for m, d in zip(user_map, user.out.type.shape) if d != 1)
        return tuple(None if d == 1 else next(walked) for d in v.type.shape)
    return LEAF


def is_column(domain, axes) -> bool:
    """A reduction that keeps the innermost (non-trivial) axis: it accumulates whole rows."""
    inner = [k for k, d in enumerate(domain) if d != 1]
    return bool(inner) and inner[-1] not in axes and any(domain[a] != 1 for a in axes)


def fuse(g: Graph, enabled: bool = True) -> list[Group]:
    index = {n: i for i, n in enumerate(g.nodes)}
    users: dict[int, list[Node]] = {}
    for n in g.nodes:
        for v in n.inputs:
            users.setdefault(v.id, []).append(n)
    outputs = {v.id for v in g.outputs}
    group_of: dict[Node, Group] = {}
    groups = []
    for n in reversed(g.nodes):
        if n in group_of or n.op == "const":
            continue
        grp = _start(n)
        group_of[n] = grp
        if enabled:
            _grow(grp, n, index, users, outputs, group_of)
        grp.order(index)
        groups.append(grp)
    groups.sort(key=lambda grp: index[grp.root])
    return groups


def _start(n: Node) -> Group:
    shape = tuple(n.out.type.shape)
    desc = lowering_of(n)
    if isinstance(desc, (R.Elementwise, R.View)):
        pointwise = isinstance(desc, R.Elementwise) or squeezes_only(n)
        grp = Group("pointwise" if pointwise else "copy", n, shape)
        grp.maps[n.out.id] = identity_map(shape)
    elif isinstance(desc, R.Reduce):
        domain = tuple(n.inputs[0].type.shape)
        axes = tuple(sorted(n.attrs["axis"]))
        grp = Group("reduce" if is_column(domain, axes) else "row", n, domain, axes)
        grp.maps[n.out.id] = reduce_out_map(n, domain)
    elif isinstance(desc, R.Contract):
        grp = Group("contract", n, shape, anchor=n)
        grp.maps[n.out.id] = identity_map(shape)
    elif isinstance(desc, R.Attention):
        grp = Group("attention", n, shape, anchor=n)
    else:
        kind = {R.ArgReduce: "argreduce", R.Concat: "concat", R.Gather: "gather"}[type(desc)]
        grp = Group(kind, n, shape)
    grp.nodes.append(n)
    return grp


def _grow(grp: Group, root: Node, index, users, outputs, group_of):
    if grp.kind in ("argreduce", "concat", "gather"):
        return
    heap = []

    def push_producers(n):
        for v in n.inputs:
            if v.node is not None and v.node.op != "const" and v.node not in group_of:
                heapq.heappush(heap, -index[v.node])

    push_producers(root)
    nodes = {i: n for n, i in index.items()}
    while heap:
        p = nodes[-heapq.heappop(heap)]
        if p in group_of:
            continue
        if _absorb(grp, p, users, outputs, group_of):
            group_of[p] = grp
            grp.nodes.append(p)
            push_producers(p)


def _absorb(grp: Group, p: Node, users, outputs, group_of) -> bool:
    if p.out.id in outputs:
        return _absorb_output(grp, p, users, group_of)
    us = users.get(p.out.id, [])
    if not us or any(group_of.get(u) is not grp for u in us):
        return False
    if grp.kind == "copy":
        return False
    if grp.anchor is not None and any(u is grp.anchor for u in us):
        # the contraction reads its operands from memory; a view of one is read in place
        return is_view(p) and (grp.kind == "contract" or unit_inner_stride(p))
    if p.op == "reshape" and all(is_view(u) and u.out.id not in grp.maps for u in us):
        return True      # a view of a reshape reads the reshape's source: same flat layout
    if any(u.out.id not in grp.maps for u in us):
        return False     # a user that reads its operand from memory (a contraction's view)
    maps = {map_from(u, grp.maps[u.out.id], p.out) for u in us}
    if len(maps) != 1 or LEAF in maps:
        return False
    (m,) = maps
    desc = lowering_of(p)
    if isinstance(desc, R.Elementwise):
        if grp.kind == "row" and desc.flops >= EXPENSIVE_FLOPS and _row_passes(grp) > 1 and \
                _ends_an_epilogue(p, users):
            return False     # the matmul's epilogue computes it once instead
        grp.maps[p.out.id] = m
        return True
    if isinstance(desc, R.View):
        if squeezes_only(p) or grp.kind in ("pointwise", "row", "reduce", "contract"):
            grp.maps[p.out.id] = m
            return True
        return False
    if isinstance(desc, R.Reduce) and grp.kind in ("pointwise", "row"):
        return _absorb_reduce(grp, p, m)
    if isinstance(desc, R.Contract) and grp.kind == "pointwise":
        return _absorb_contract(grp, p, m)
    return False


def _row_passes(grp: Group) -> int:
    """How many times a row group's prologue runs per element: once per reduction, and once
    more for the output when the root spans the reduced axes."""
    reductions = sum(1 for n in grp.nodes if is_reduce(n))
    root_map = grp.maps[grp.root.out.id]
    return reductions + any(a in grp.reduced for a in root_map if a is not None)


def _ends_an_epilogue(p: Node, users) -> bool:
    """Could p end a matmul's epilogue: a chain of single-use elementwise nodes back to a float
    contraction of p's shape and dtype (what _absorb_contract will take)?"""
    stack = [p]
    while stack:
        n = stack.pop()
        for v in n.inputs:
            u = v.node
            if u is None or u.op == "const" or len(users.get(v.id, [])) != 1:
                continue
            if isinstance(lowering_of(u), R.Contract):
                if tuple(u.out.type.shape) == tuple(p.out.type.shape) and \
                        u.out.type.dtype == p.out.type.dtype and u.out.type.dtype.is_float:
                    return True
            elif is_elementwise(u):
                stack.append(u)
    return False


def _absorb_output(grp: Group, p: Node, users, group_of) -> bool:
    """A function output computed elementwise on the same domain as a pointwise group that uses
    it joins the group as a second store (an optimizer's new moment beside the new parameter):
    its inputs are read once, and it is never read back from memory."""
    us = users.get(p.out.id, [])
    if grp.kind != "pointwise" or not is_elementwise(p) or not us or \
            any(group_of.get(u) is not grp for u in us) or tuple(p.out.type.shape) != grp.domain:
        return False
    maps = {map_from(u, grp.maps[u.out.id], p.out) for u in us}
    if maps != {identity_map(grp.domain)}:
        return False
    grp.maps[p.out.id] = identity_map(grp.domain)
    grp.stores.append(p)
    return True


def unit_inner_stride(p: Node) -> bool:
    src = p.inputs[0]
    _, strides = p.opdef.lowering.strides(src.type, p.out.type, p.attrs)
    return not strides or strides[-1] == 1 or p.out.type.shape[-1] == 1


def _absorb_reduce(grp: Group, p: Node, m) -> bool:
    domain = tuple(p.inputs[0].type.shape)
    axes = tuple(sorted(p.attrs["axis"]))
    if not axes or is_column(domain, axes):
        return False     # column reductions keep their own kernel (and epilogues theirs)
    natural = reduce_out_map(p, domain)
    if grp.kind == "row":
        if domain != grp.domain or axes != grp.reduced or m != natural:
            return False
        grp.maps[p.out.id] = m
        return True
    # a pointwise group becomes a row group over the reduction's domain: its maps were over the
    # root's axes; the reduction's output says which domain axis each of those is
    if grp.domain == domain:
        rebase = {k: k for k in range(len(domain))}
        if m != natural:
            return False
    else:
        rebase = _rebase_through(m, natural)
    if rebase is None or any(d != 1 and k not in rebase for k, d in enumerate(grp.domain)):
        return False

    def moved(vm):
        return tuple(None if a is None else rebase[a] for a in vm)
    new_maps = {vid: moved(vm) for vid, vm in grp.maps.items()}
    grp.kind, grp.domain, grp.reduced, grp.maps = "row", domain, axes, new_maps
    grp.maps[p.out.id] = natural
    return True


def _rebase_through(m, natural):
    """Old domain axis -> new domain axis, read off the reduction's output: m says which old
    axis each output axis walks, `natural` which new one."""
    rebase = {}
    for old, new in zip(m, natural):
        if old is not None:
            if new is None or rebase.get(old, new) != new:
                return None
            rebase[old] = new
    return rebase


def _absorb_contract(grp: Group, p: Node, m) -> bool:
    shape = tuple(p.out.type.shape)
    if grp.stores:
        return False     # the GEMM epilogue writes one output
    if shape != grp.domain or m != identity_map(shape) or not p.out.type.dtype.is_float:
        return False
    if grp.root.out.type.dtype != p.out.type.dtype:
        return False     # the product is accumulated in the output buffer: same type
    if any(n is not p and not (is_elementwise(n) or is_view(n)) for n in grp.nodes):
        return False
    grp.kind, grp.anchor = "contract", p
    grp.maps[p.out.id] = m
    return True
