"""The builtins of a tile kernel's body (`tessera.tile` to users, which re-exports them).

    ctx = tile.context()                    the knobs (ctx.BM ...) and dimensions (ctx.K ...)
    a = tile.load(A, shape=(ctx.BM, ctx.BK), offset=None, other=0.0, prefetch=None)
    a_k = tile.load_partition(a, k)         a block of a streamed load, in a range_k loop
    for k in tile.range_k(0, ctx.K, ctx.BK, stages=None): ...   (stages: GPU pipelining)
    acc = tile.zeros((ctx.BM, ctx.BN), dtype=f32);  tile.full(shape, value, dtype)
    acc += tile.mma(a_k, b_k)               one FMA chain per element over k, in order
    tile.max / sum / min(x, axis=-1, keepdim=False)    in index order
    tile.exp(x), tile.where(c, a, b), + - * / ...      any elementwise operator of the registry
    tile.store(C, acc, offset=None)
    tile.atomic_add(H, tile, offset=None) / (H, value, index=idx)   integers only
    tile.program_id(axis), tile.num_programs(axis)

Called outside a kernel's body they raise a TracingError.
"""
from __future__ import annotations

from .. import dtypes as _dt
from ..ops import registry as _R
from . import semantic as _s
from .tracer import Context, tracer

__all__ = ["load", "load_partition", "store", "mma", "program_id", "num_programs", "context",
           "range_k", "zeros", "full", "max", "min", "sum", "atomic_add"]

load = _s.load
load_partition = _s.load_partition
store = _s.store
mma = _s.mma
program_id = _s.program_id
num_programs = _s.num_programs


def context() -> Context:
    """The launch's knobs and the problem's dimensions."""
    return Context(tracer())


def range_k(start, stop, step, stages=None):
    """`for k in tile.range_k(0, ctx.K, ctx.BK)`: k = start, start + step, ... below stop.
    `stages=n` (default: the largest prefetch= of the loads it partitions): on GPUs each
    partition is loaded n - 1 iterations ahead into a ring of n buffers; the same bits."""
    return _s.RangeK(start, stop, step, stages)


def zeros(shape, dtype=_dt.float32):
    return _s.full(shape, 0, dtype)


def full(shape, value, dtype=None):
    return _s.full(shape, value, dtype)


def max(x, axis=-1, keepdim=False):          # noqa: A001 (the seeds' name)
    return _s.reduce("max", x, axis, keepdim)


def min(x, axis=-1, keepdim=False):          # noqa: A001
    return _s.reduce("min", x, axis, keepdim)


def sum(x, axis=-1, keepdim=False):          # noqa: A001
    return _s.reduce("sum", x, axis, keepdim)


def atomic_add(x, value, offset=None, index=None):
    """`tile.atomic_add(H, tile)` adds a tile into H's block (placed as tile.store places it),
    `tile.atomic_add(H, 1, index=idx)` adds into H[idx[e]] for every valid element e (a
    histogram). Every program adds into H, which starts from the caller's values (in-out).
    Integers only (int32, int64): floating-point atomics would make results depend on the order
    the programs arrive in, which the numerics contract forbids."""
    return _s.atomic_add(x, value, offset=offset, index=index)


def __getattr__(name):
    """Every elementwise operator of the registry: tile.exp, tile.where, tile.maximum, ..."""
    op = _R.REGISTRY.get(name)
    if op is not None and isinstance(op.lowering, _R.Elementwise):
        def fn(*args, **attrs):
            return _s.elementwise(name, *args, **attrs)
        fn.__name__ = name
        fn.__doc__ = f"tile.{name}: {op.doc}"
        return fn
    raise AttributeError(f"module 'tessera.tile' has no attribute {name!r}")
