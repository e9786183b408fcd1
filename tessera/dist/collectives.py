"""Collectives on sharded tensors (and `redistribute`, tensor.py's: a tensor in another layout).

Every collective is built on the block moves of moves.py (the engine's one exchange,
tessera/dist/engine.py, and `tree_reduce`), so the bits do not depend on the engine, the MPI
library or the message size. An all-reduce moves the data a ring all-reduce does: each member reduces one chunk
of the flattened block (an all-to-all, then the tree in rank order) and the reduced chunks are
gathered.

The public forms (``tessera.collectives.all_reduce(grads, op="mean", axis="dp", mesh=mesh)``)
take a `DTensor`, a NumPy array (under MPI: this rank's value) or a dict/list/tuple of them.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShardingError
from ..pytree import flatten, tree_map
from .engine import on_gpu
from .layout import REDUCTIONS, ShardSpec, at_user_line
from .moves import all_to_all_blocks, gather_blocks, reduce_blocks, reduce_scatter_blocks
from .tensor import DTensor, redistribute, shard  # noqa: F401 (redistribute: a collective too)


# ---- the public collectives ---------------------------------------------------------------------
def _mesh_for(x, mesh):
    if isinstance(x, DTensor):
        if mesh is not None and mesh != x.mesh:
            raise ShardingError("the tensor lives on another mesh than the one given",
                                received=f"{x.mesh} and {mesh}")
        return x.mesh
    if mesh is None:
        raise ShardingError("a collective on an array needs mesh=")
    if mesh.engine.name != "mpi":
        raise ShardingError("a collective on a plain array needs one process per device "
                            "(mpiexec); on virtual devices each device's value is a DTensor's "
                            "block", hint="dist.shard(x, spec, mesh) or the result of an "
                                          "operator on sharded tensors")
    return mesh


def _as_blocks(x, mesh):
    if isinstance(x, DTensor):
        return x.blocks
    return {mesh.engine.ranks[0]: np.asarray(x)}


def _check_op(op):
    if op not in REDUCTIONS:
        raise ShardingError(f"unknown reduction {op!r}", expected=f"one of {REDUCTIONS}")


@at_user_line
def all_reduce(x, op="sum", axis=None, mesh=None, order="tree"):
    """Every device's value reduced (``op``: sum, mean, max or min) over the mesh ``axis``, in
    a fixed tree order: the same bits on every run, engine and message size. On a DTensor the
    blocks are the terms (a pending reduction over ``axis`` is thereby taken); the result is
    replicated over ``axis``. ``order="native"`` (arrays under MPI) opts out for speed: MPI's
    own MPI_Allreduce, whose rounding changes with the message size, rank count and library."""
    _check_op(op)
    if order not in ("tree", "native"):
        raise ShardingError(f"order must be 'tree' or 'native', not {order!r}")
    packed = _packed_all_reduce(x, op, axis, mesh, native=order == "native")
    if packed is not None:
        return packed

    def one(v):
        m = _mesh_for(v, mesh)
        a = m.check_axis(axis)
        out = _as_blocks(v, m)
        for ax in a:
            if isinstance(v, DTensor) and any(ax in d for d in v.layout.dims):
                raise ShardingError(f"all_reduce over {ax!r}, which splits a dimension of "
                                    "the tensor", hint="all_gather it, or reduce over "
                                                       "another axis")
            pending = v.layout.partial_axes.get(ax) if isinstance(v, DTensor) else None
            if pending is not None and pending != op:
                raise ShardingError(f"the tensor holds a pending {pending} over {ax!r}: an "
                                    f"all_reduce with op={op!r} would not give its value",
                                    hint=f"op={pending!r}, or dist.gather(x)")
            out = reduce_blocks(m, out, ax, op)
        if not isinstance(v, DTensor):
            return out[m.engine.ranks[0]]
        part = {k: p for k, p in v.layout.partial_axes.items() if k not in a}
        return DTensor(m, v.shape, v.dtype, v.layout.with_partial(part), out)
    return tree_map(one, x)


def _packed_all_reduce(x, op, axis, mesh, native=False):
    """A pytree of plain arrays (a data-parallel step's gradients) under MPI: the leaves of each
    dtype packed into one buffer and reduced by one all-reduce, as DDP's buckets are (the tree
    is elementwise: the same bits as leaf by leaf). None where that does not apply."""
    leaves, treedef = flatten(x)
    if mesh is None or mesh.engine.name != "mpi" or not leaves or \
            any(isinstance(v, DTensor) or on_gpu(v) for v in leaves):
        return None
    axes = mesh.check_axis(axis)
    arrays = [np.asarray(v) for v in leaves]
    out = [None] * len(arrays)
    for dtype in sorted({a.dtype for a in arrays}, key=lambda d: d.str):   # one order on every rank
        idx = [i for i, a in enumerate(arrays) if a.dtype == dtype]
        owned = len(idx) > 1          # a buffer of ours: reduced in place
        flat = np.concatenate([arrays[i].reshape(-1) for i in idx]) if owned else \
            arrays[idx[0]].reshape(-1)
        for ax in axes:
            flat = mesh.engine.native_all_reduce(mesh, (ax,), flat, op) if native else \
                mesh.engine.all_reduce_flat(mesh, (ax,), flat, op, out=flat if owned else None)
            owned = True
        at = 0
        for i in idx:
            n = arrays[i].size
            out[i] = flat[at:at + n].reshape(arrays[i].shape)
            at += n
    return treedef.unflatten(out)


@at_user_line
def all_gather(x, axis=None, mesh=None, dim=0):
    """On a DTensor: the dimension split over ``axis`` made whole on every member. On an array
    (under MPI): every member's array concatenated along ``dim`` in the axis' order."""
    def one(v):
        m = _mesh_for(v, mesh)
        (a,) = m.check_axis(axis)
        if not isinstance(v, DTensor):
            return gather_blocks(m, _as_blocks(v, m), a, dim)[m.engine.ranks[0]]
        dims = [list(d) for d in v.layout.dims]
        for d in dims:
            if a in d:
                d.remove(a)
        return redistribute(v, v.layout.with_dims(dims))
    return tree_map(one, x)


@at_user_line
def reduce_scatter(x, op="sum", axis=None, mesh=None, dim=0):
    """Every member's value reduced over ``axis`` (the tree order), each member keeping its
    part of ``dim``."""
    _check_op(op)

    def one(v):
        m = _mesh_for(v, mesh)
        (a,) = m.check_axis(axis)
        out = reduce_scatter_blocks(m, _as_blocks(v, m), a, op, dim)
        if not isinstance(v, DTensor):
            return out[m.engine.ranks[0]]
        dims = [list(d) for d in v.layout.dims]
        dims[dim % len(dims)].append(a)
        part = {k: p for k, p in v.layout.partial_axes.items() if k != a}
        layout = v.layout.with_dims(dims).with_partial(part)
        layout.check(v.shape, m, "reduce_scatter's result")
        return DTensor(m, v.shape, v.dtype, layout, out)
    return tree_map(one, x)


@at_user_line
def all_to_all(x, axis=None, mesh=None, split_dim=0, concat_dim=1):
    """Each member's value split along ``split_dim``, part j to member j, the parts received
    concatenated along ``concat_dim`` (experts' tokens in a mixture of experts). On a DTensor
    split over ``axis`` along ``concat_dim``: the split moves to ``split_dim``."""
    def one(v):
        m = _mesh_for(v, mesh)
        (a,) = m.check_axis(axis)
        if not isinstance(v, DTensor):
            return all_to_all_blocks(m, _as_blocks(v, m), a, split_dim,
                                     concat_dim)[m.engine.ranks[0]]
        dims = [list(d) for d in v.layout.dims]
        if a not in dims[concat_dim]:
            raise ShardingError(f"all_to_all over {a!r}: dimension {concat_dim} is not split "
                                "over it", received=repr(v.layout))
        dims[concat_dim].remove(a)
        dims[split_dim].append(a)
        return redistribute(v, v.layout.with_dims(dims))
    return tree_map(one, x)


@at_user_line
def scatter(x, axis=None, mesh=None, dim=0):
    """The value split along ``dim`` over ``axis``, each member keeping its part (the seeds'
    ZeRO step: no communication, the value being the same on every member)."""
    def one(v):
        if not isinstance(v, DTensor):
            if mesh is None:
                raise ShardingError("scatter of an array needs mesh=")
            return shard(v, _spec_for_dim(np.ndim(v), dim, axis), mesh)
        (a,) = v.mesh.check_axis(axis)
        dims = [list(d) for d in v.layout.dims]
        dims[dim % len(dims)].append(a)
        layout = v.layout.with_dims(dims)
        layout.check(v.shape, v.mesh, "scatter's result")
        return redistribute(v, layout)
    return tree_map(one, x)


def _spec_for_dim(rank, dim, axis):
    return ShardSpec((dim % rank,), (axis,))
