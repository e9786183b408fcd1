"""The CPU's pooling routine (pool.c): fold_windows over whole output rows of a plane, a block
of them at a time: the rows the block reads laid out (16 KiB, in L1) with the combination's
identity as padding and their columns split by the stride's phases (window.c, shared with the
convolution's one-channel stencil), each run of outputs folded in registers over the taps in
order while the next block's input is prefetched: the bits of the chain of elementwise maxima
or sums the operator decomposes into.

`ts_pool_tile_<T>(X, C, nt, j0, combine, <geometry>, nimg, xs, ys)` writes output positions
[j0, j0 + nt) of nimg planes (combine 0: the largest, NaN propagating; 1: the sum; 2, C int64:
each window's offset of its first largest tap, as argmax over the stacked windows finds it,
max_pool's gradient).

The pools' adjoint, col2im (col2im.c): `ts_col2im_tile_<T>(cols, out, <geometry>, nimg, xs,
ys)` rebuilds nimg planes from their windows' cotangent, each element summed over the kernel
offsets in order (+0 where an offset's slice does not reach it): the bits of the placed
slices' chain of additions.
"""
from __future__ import annotations

from . import c_gemm, routine_text

WINDOW = routine_text("window.c")
_ROUTINE = routine_text("pool.c")
_COL2IM = routine_text("col2im.c")


def pool_source(dtype_short: str) -> list[str]:
    """The chunks for one dtype ("f32" or "f64"): the ISA definitions and scratch memory, the
    window layout, then the routine."""
    return [c_gemm.ISA, c_gemm.instantiate(c_gemm.SCRATCH, dtype_short),
            c_gemm.instantiate(WINDOW, dtype_short), c_gemm.instantiate(_ROUTINE, dtype_short)]


def col2im_source(dtype_short: str) -> list[str]:
    """The chunks for one dtype: the ISA definitions, the window geometry, the routine."""
    return [c_gemm.ISA, c_gemm.instantiate(c_gemm.SCRATCH, dtype_short),
            c_gemm.instantiate(WINDOW, dtype_short), c_gemm.instantiate(_COL2IM, dtype_short)]
