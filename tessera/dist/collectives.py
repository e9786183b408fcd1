"""Collectives on sharded tensors, and `redistribute`, which moves a tensor to another layout.

Every collective is built on the engine's one exchange (tessera/dist/engine.py) and every
reduction on `tree_reduce`, so the bits do not depend on the engine, the MPI library or the
message size. An all-reduce moves the data a ring all-reduce does: each member reduces one chunk
of the flattened block (an all-to-all, then the tree in rank order) and the reduced chunks are
gathered.

The public forms (``tessera.collectives.all_reduce(grads, op="mean", axis="dp", mesh=mesh)``)
take a `DTensor`, a NumPy array (under MPI: this rank's value) or a dict/list/tuple of them.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShardingError
from ..pytree import tree_map
from .engine import on_gpu, tree_reduce
from .layout import REDUCTIONS, at_user_line


# ---- on blocks: {rank: ndarray} for the ranks this process holds --------------------------------
def gather_blocks(mesh, blocks, axis, dim):
    """Each member's block concatenated along ``dim`` in the axis' order."""
    sends = {r: [b] * mesh.shape[axis] for r, b in blocks.items()}
    got = mesh.engine.exchange(mesh, (axis,), sends)
    return {r: np.concatenate(got[r], axis=dim) for r in blocks}


def reduce_blocks(mesh, blocks, axis, op):
    """Every member's block reduced elementwise (tree in rank order); every member gets it."""
    p = mesh.shape[axis]
    if p == 1:                          # one term: the tree is the term itself
        return {r: tree_reduce([b], op) for r, b in blocks.items()}
    if mesh.engine.name == "mpi" and not any(map(on_gpu, blocks.values())):
        # MPI's buffers straight from and into the arrays (the same tree, the same bits)
        return {r: mesh.engine.all_reduce_flat(mesh, (axis,), b, op)
                for r, b in blocks.items()}
    shapes = {r: b.shape for r, b in blocks.items()}
    chunks = {r: np.array_split(b.reshape(-1), p) for r, b in blocks.items()}
    got = mesh.engine.exchange(mesh, (axis,), chunks)
    mine = {r: [tree_reduce(got[r], op)] * p for r in blocks}
    full = mesh.engine.exchange(mesh, (axis,), mine)
    return {r: np.concatenate(full[r]).reshape(shapes[r]) for r in blocks}


def reduce_scatter_blocks(mesh, blocks, axis, op, dim):
    """The members' blocks reduced, each member keeping its part of ``dim``."""
    p = mesh.shape[axis]
    sends = {r: np.split(b, p, axis=dim) for r, b in blocks.items()}
    got = mesh.engine.exchange(mesh, (axis,), sends)
    return {r: tree_reduce(got[r], op) for r in blocks}


def all_to_all_blocks(mesh, blocks, axis, split_dim, concat_dim):
    """Split each block along ``split_dim``, member j getting part j; the parts received are
    concatenated along ``concat_dim`` in the axis' order."""
    p = mesh.shape[axis]
    sends = {r: np.split(b, p, axis=split_dim) for r, b in blocks.items()}
    got = mesh.engine.exchange(mesh, (axis,), sends)
    return {r: np.concatenate(got[r], axis=concat_dim) for r in blocks}


def slice_blocks(mesh, blocks, axis, dim):
    """Each rank keeps its part of ``dim`` along ``axis`` (no communication)."""
    p = mesh.shape[axis]
    return {r: np.split(b, p, axis=dim)[mesh.coords(r)[axis]] for r, b in blocks.items()}


def moves(src, dst) -> list:
    """The collectives taking a tensor from layout ``src`` to ``dst``, in order: pending
    reductions taken (a reduce-scatter where ``dst`` splits a dimension over that axis, else an
    all-reduce), an axis moved from the end of one dimension's split to another's by one
    all-to-all, axes leaving a dimension gathered (minor first), axes joining one sliced
    locally. Each is (kind, axis, details)."""
    out = []
    dims = [list(d) for d in src.dims]
    partial, want_partial = src.partial_axes, dst.partial_axes
    for axis, op in partial.items():
        if want_partial.get(axis) == op:
            continue
        if axis in want_partial:
            raise ShardingError(f"a pending {op} over {axis!r} cannot become a pending "
                                f"{want_partial[axis]}")
        target = [d for d, axes in enumerate(dst.dims) if axes == tuple(dims[d]) + (axis,)]
        if target:
            out.append(("reduce_scatter", axis, {"op": op, "dim": target[0]}))
            dims[target[0]].append(axis)
        else:
            out.append(("all_reduce", axis, {"op": op}))
    for axis in want_partial:
        if axis not in partial:
            raise ShardingError(f"a value cannot be made a pending reduction over {axis!r}")
    for d, axes in enumerate(dims):
        if axes and tuple(axes) != dst.dims[d][:len(axes)]:
            a = axes[-1]
            to = [e for e, want in enumerate(dst.dims) if e != d and want == tuple(dims[e]) + (a,)]
            if to:
                out.append(("all_to_all", a, {"split_dim": to[0], "concat_dim": d}))
                axes.pop()
                dims[to[0]].append(a)
    for d, axes in enumerate(dims):
        want = dst.dims[d]
        keep = 0
        while keep < min(len(axes), len(want)) and axes[keep] == want[keep]:
            keep += 1
        for a in reversed(axes[keep:]):
            out.append(("all_gather", a, {"dim": d}))
        del axes[keep:]
    for d, want in enumerate(dst.dims):
        for a in want[len(dims[d]):]:
            out.append(("slice", a, {"dim": d}))
    return out


def apply_moves(mesh, blocks: dict, steps) -> dict:
    for kind, axis, kw in steps:
        if kind == "reduce_scatter":
            blocks = reduce_scatter_blocks(mesh, blocks, axis, kw["op"], kw["dim"])
        elif kind == "all_reduce":
            blocks = reduce_blocks(mesh, blocks, axis, kw["op"])
        elif kind == "all_to_all":
            blocks = all_to_all_blocks(mesh, blocks, axis, kw["split_dim"], kw["concat_dim"])
        elif kind == "all_gather":
            blocks = gather_blocks(mesh, blocks, axis, kw["dim"])
        else:
            blocks = slice_blocks(mesh, blocks, axis, kw["dim"])
    return blocks


def bytes_moved(mesh, steps, local_bytes: int) -> list:
    """Bytes each rank receives for each step, from the block size before it (the cost the
    sharding rules weigh and comm_report lists): a gather receives the p-1 other blocks, an
    all-reduce (all-to-all, tree, all-gather) twice (p-1)/p of the block, a reduce-scatter and
    an all-to-all (p-1)/p of it, a slice nothing."""
    out, b = [], local_bytes
    for kind, axis, _ in steps:
        p = mesh.shape[axis]
        if kind == "all_gather":
            out.append((p - 1) * b)
            b *= p
        elif kind == "all_reduce":
            out.append(2 * (p - 1) * b // p)
        elif kind == "reduce_scatter":
            out.append((p - 1) * b // p)
            b //= p
        elif kind == "all_to_all":
            out.append((p - 1) * b // p)
        else:
            out.append(0)
            b //= p
    return out


def redistribute(x, layout):
    """``x`` (a DTensor) in ``layout`` (see `moves`); x itself when nothing changes."""
    from .tensor import DTensor
    if x.layout == layout:
        return x
    blocks = apply_moves(x.mesh, dict(x.blocks), moves(x.layout, layout))
    return DTensor(x.mesh, x.shape, x.dtype, layout, blocks)


# ---- the public collectives ---------------------------------------------------------------------
def _mesh_for(x, mesh):
    from .tensor import DTensor
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
    from .tensor import DTensor
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
        from .tensor import DTensor
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
    from ..pytree import flatten
    from .tensor import DTensor
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
        from .tensor import DTensor
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
        from .tensor import DTensor
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
        from .tensor import DTensor
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
        from .tensor import DTensor
        if not isinstance(v, DTensor):
            if mesh is None:
                raise ShardingError("scatter of an array needs mesh=")
            from .tensor import shard
            return shard(v, _spec_for_dim(np.ndim(v), dim, axis), mesh)
        (a,) = v.mesh.check_axis(axis)
        dims = [list(d) for d in v.layout.dims]
        dims[dim % len(dims)].append(a)
        layout = v.layout.with_dims(dims)
        layout.check(v.shape, v.mesh, "scatter's result")
        return redistribute(v, layout)
    return tree_map(one, x)


def _spec_for_dim(rank, dim, axis):
    from .layout import ShardSpec
    return ShardSpec((dim % rank,), (axis,))
