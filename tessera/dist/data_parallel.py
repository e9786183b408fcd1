"""Data parallelism whose result does not depend on the number of ranks.

``dist.batch_mean(fn, batch, micro_batches=K, axis="dp", mesh=mesh)``: the global batch is cut
into K equal micro-batches; rank r of the P ranks on ``axis`` evaluates ``fn`` on its contiguous
block of K/P of them and combines their results by the fixed pairwise tree (`tree_reduce`), and
the ranks' subtotals are combined by the same tree across ranks; the total is divided by K. When
K/P is a power of two, each rank's block is a complete subtree of the tree over all K
micro-batches, so the mean has **the same bits on 1, 2, 4 ... ranks** (and on virtual devices):
a training run can move to more machines without changing a bit. (A sum over the whole local
batch, as DDP takes, changes its rounding with the rank count.)
"""
from __future__ import annotations

import numpy as np

from ..errors import ShardingError
from ..pytree import flatten
from .collectives import _packed_all_reduce
from .moves import reduce_blocks
from .engine import tree_reduce
from .layout import at_user_line


@at_user_line
def batch_mean(fn, batch, micro_batches: int, axis: str = "dp", mesh=None):
    """The mean over K micro-batches of ``fn(micro_batch)`` (a pytree of arrays: a loss and
    its gradients, say), computed in parallel over the mesh ``axis`` with bits independent of
    its size where K / size is a power of two. ``batch``: a pytree of arrays whose first
    dimension is the global batch (the same on every rank; each rank reads its part)."""
    if mesh is None:
        raise ShardingError("batch_mean needs mesh=")
    (a,) = mesh.check_axis(axis)
    k, p = int(micro_batches), mesh.shape[a]
    if k % p or (k // p) & (k // p - 1):
        raise ShardingError(f"{k} micro-batches over {p} ranks: each rank's share must be a "
                            "power of two for the bits not to depend on the rank count",
                            hint=f"micro_batches={p * 2 ** max(0, (k // p).bit_length() - 1)}")
    leaves, treedef = flatten(batch)
    n = {np.shape(x)[0] for x in leaves}
    if len(n) != 1 or next(iter(n)) % k:
        raise ShardingError(f"the batch's leading sizes {sorted(n)} do not split into {k} "
                            "equal micro-batches")
    size = next(iter(n)) // k
    blocks = {}
    for r in mesh.engine.ranks:
        c = mesh.coords(r)[a]
        parts = []
        for j in range(c * (k // p), (c + 1) * (k // p)):
            micro = treedef.unflatten([x[j * size:(j + 1) * size] for x in leaves])
            parts.append(fn(micro))
        blocks[r] = tree_sum(parts)
    out_leaves, out_def = flatten(next(iter(blocks.values())))
    # under MPI this rank's subtotals are packed into one all-reduce (None elsewhere)
    packed = _packed_all_reduce(next(iter(blocks.values())), "sum", a, mesh) \
        if len(blocks) == 1 else None
    if packed is not None:
        sums = flatten(packed)[0]
    else:
        sums = [next(iter(reduce_blocks(mesh, {r: np.asarray(flatten(b)[0][i])
                                                for r, b in blocks.items()}, a, "sum").values()))
                for i in range(len(out_leaves))]
    return out_def.unflatten([np.asarray(t) / np.asarray(k, np.asarray(t).dtype) for t in sums])


def tree_sum(parts):
    """The micro-batches' results summed leaf by leaf, by the fixed tree."""
    flat = [flatten(x)[0] for x in parts]
    treedef = flatten(parts[0])[1]
    return treedef.unflatten([tree_reduce([np.asarray(f[i]) for f in flat], "sum")
                              for i in range(len(flat[0]))])
