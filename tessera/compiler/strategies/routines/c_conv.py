"""The CPU's convolution routine (conv.c): an implicit GEMM on the GEMM routine's packing of A
and its micro-kernel, with B's panels packed straight from the input's windows.

`ts_conv_tile_<T>(W, ldw, X, C, ldc, K, mt, nt, kc, j0, <geometry>, nimg, xs, ys)` overwrites
an mt x nt block of output channels by output positions, of nimg images (small ones: every
position of each, image i's input at X + i xs, its output at C + i ys); each element is the
GEMM's fma chain over k = (c, kd, kh, kw) from 0, so the result has the bits of the im2col
matmul the operator decomposes into. A block of whole output rows of a 1-D or 2-D convolution
whose channels fill the channel vectors runs direct (`ts_conv_direct_<T>`: the windows' values
broadcast from the input rows laid out padded, against the weights' transposed panels, its
micro-tile TS_DMR x TS_DNV measured per machine: compiler/target/gemm_shape.py; on small
images the taps that fall in the padding left out, which changes no bit but a zero's sign where
products underflow); one output
channel (mt = 1, a depthwise convolution's) of whole rows as a stencil (`ts_conv_plane_<T>`,
laid out a block of rows at a time as the pools are, the next task's input prefetched): same
chains.

`ts_conv_wgrad_tile_<T>(G, gs, X, xs, C, ldc, nimg, mt, j0, nt, kc, <geometry>)` overwrites an
mt x nt block of a weight gradient dW [O/g, Cg*KK] (conv_weight_grad): the cotangent's rows
times the input's windows over k = (image, position), both packed by transposing lines along k
(ts_transpose), or direct as the forward is (the taps' values broadcast from the laid-out rows,
blocks of whole small images), each element the fma chain over k from 0 of the windows' matmul.
"""
from __future__ import annotations

from . import c_gemm, c_pool, routine_text

_ROUTINE = routine_text("conv.c")


def conv_source(dtype_short: str) -> list[str]:
    """The chunks for one dtype ("f32" or "f64"): the GEMM's (its packing, with the
    transposition, and micro-kernel), the window layout (window.c), then the convolution's."""
    return c_gemm.gemm_source(dtype_short) + [c_gemm.instantiate(c_pool.WINDOW, dtype_short),
                                              c_gemm.instantiate(_ROUTINE, dtype_short)]
