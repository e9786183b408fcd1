"""The CPU's transposition routine (transpose.c): a copy kernel that swaps its two innermost
loops' contiguity (the input contiguous along one, the output along the other) runs as a
call per block of output rows, `ts_transpose_<T>(in, ldi, out, ldo, rows, cols)`:
out[r * ldo + c] = in[c * ldi + r], cache blocks transposed through registers, instead of a
loop whose every load starts a new cache line (a 1024-float stride: every line in one cache
set)."""
from __future__ import annotations

from . import c_gemm

TRANSPOSE = c_gemm.TRANSPOSE


def transpose_source(dtype_short: str) -> list[str]:
    return [c_gemm.ISA, c_gemm.instantiate(TRANSPOSE, dtype_short)]
