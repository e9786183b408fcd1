"""Moving blocks between the members of a mesh axis, and the plan of moves from one layout to
another: the layer under `DTensor` (tensor.py: `redistribute`), sharded functions (spmd.py) and
the public collectives (collectives.py).

Every exchange is the engine's one exchange (tessera/dist/engine.py) and every reduction
`tree_reduce`, so the bits do not depend on the engine, the MPI library or the message size.
Blocks are {rank: ndarray} for the ranks this process holds.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShardingError
from .engine import on_gpu, tree_reduce


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
