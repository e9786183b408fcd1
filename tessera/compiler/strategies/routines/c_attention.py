"""The CPU's fused attention routine (flash-attention style), as C text.

`attention_source("f32")` returns C that defines

    static void ts_attention_block_f32(
        const float* Q, int64_t q_rs, const float* K, int64_t k_rs,
        const float* V, int64_t v_rs, const float* M, int64_t m_rs, int64_t m_cs,
        float* O, int64_t o_rs, int64_t q0, int64_t nq, int64_t Sk, int64_t D, int64_t Dv,
        float scale, int causal, int64_t causal_offset)

(and `ts_attention_block_f64` with `double` for "f64"). For query rows r = q0 .. q0+nq-1 of one
(batch, head) it writes

    O[r, :] = softmax_j(scale * Q[r, :] . K[j, :] + M[r, j]) @ V[j, :],   j = 0 .. Sk-1

Layout. Element (r, d) of Q is Q[r * q_rs + d]; K, V and O likewise with their row strides (the
last axis is contiguous, so [B, S, H, D] tensors are read in place). The pointers are already
offset to the (batch, head). M is NULL (no mask) or an additive mask with element (r, j) at
M[r * m_rs + j * m_cs]; either stride may be 0 (broadcast) and -inf means "masked". O must not
overlap Q, K, V or M: the routine uses O's rows as its accumulator.

Causal. With `causal` set, key j is masked for query r when j > r + causal_offset. Passing
causal_offset = Sk - Sq gives the bottom-right aligned mask, i.e. exactly
`np.tril(np.ones((Sq, Sk)), k=Sk - Sq)` (PyTorch's `is_causal` is top-left: offset 0).

Fully-masked rows. A query that sees no key (every key masked by the causal rule, by -inf in M, or
Sk == 0) gets an output row of zeros, not NaN. NaN inputs still propagate.

Algorithm. Rows are taken BQ (block_q) at a time: the chunk's queries are packed transposed once,
qt[d][i] (in slices of DC dimensions when D > DC). Keys go by in blocks of BK (block_k) from
key 0 upward. For each key block:
  1. scores, transposed (query rows in vector lanes): st[j][i] = fma chain of K[j][d] * qt[d][i]
     over d, register tiles of 6 keys x 4 vectors of rows (x 2 with AVX2), K read in place;
  2. the online-softmax step, 16 rows at a time, every operation elementwise over the rows:
     s = s * scale (+ M), causal/-inf masking, block max, new running max m,
     alpha = ts_expf(m_old - m_new), p = ts_expf(s - m_new) summed over the block's keys in
     order, l = fma(l, alpha, block_sum);
  3. O = O * alpha + P V, register tiles of 6 rows x 4 vectors of Dv (x 2 with AVX2), V read
     in place; O's own rows are the accumulator.
At the end O /= l. Key blocks past the chunk's causal horizon are skipped, so causal costs about
half. No Sq x Sk buffer exists: the scratch is (DC + BK) * BQ + 3 * BQ elements on the stack
(64 KiB for f32 with the defaults; 128 KiB for f64).

Numerics (DESIGN.md "deterministic"). Every operation on a row's values is the same whatever
q0/nq, the partition into blocks, the other rows or the thread count:
  * score(r, j) = fma(k_d, q_d, .) over d = 0, 1, ... from 0, then * scale, then + M;
  * the key blocks are [0, BK), [BK, 2BK), ... for every row (BK is fixed at code generation);
  * the block max is exact; the block sum adds p over the block's keys in key order;
    l = fma(l, alpha, block_sum), alpha = 1 exactly when the max did not move;
  * o(r, c) = o * alpha, then fma(p_j, v(j, c), o) over the block's keys in order.
Skipping a block that a row cannot see is exactly the no-op processing it would have been (with
finite V: a masked key adds fma(0, v, o) = o). The three code paths - AVX-512, AVX2+FMA (the
same tiles, half as wide) and portable C (no AVX2, or forced with -DTS_ATTENTION_PORTABLE) - do
the same operations in the same order, so they agree bit for bit (the tests check it).
Contraction is off in our CFLAGS: every fma is written.
Accuracy: float32 results are within a few 1e-7 of a float64 reference on unit-normal data
(D <= 128); ts_expf's own bound (spelling/libm.h) adds at most ~1 ulp per probability.

The caller hands (batch * head, query block) pairs to threads, e.g.

    #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < B * H * nqb; ++t) ... ts_attention_block_f32(..., q0, nq, ...)

with nq = block_q (DEFAULT_BLOCKS) except for the last block of a head; `driver_source` renders
that loop for [B, H] batches with arbitrary element strides (tests and benchmarks use it).

The routine calls `ts_expf` (f32) / `ts_exp` (f64), which must be defined earlier in the same
translation unit (tessera/compiler/spelling/libm.h); it defines neither, and needs <math.h>,
<stdint.h>.
"""
from __future__ import annotations

from . import routine_text, specialise

# Tuned on the 2-core AMD EPYC (AVX-512) for B=8, H=8, S=1024, D=64 f32, causal and not:
# block_q 64..192 and block_k 64..256 are all within ~2% of each other (block_k 32 is ~8% slower,
# block_q 256 with block_k 64 ~8%); 64/64 gives B*H*Sq/64 tasks.
# block_q is both the caller's task size and the routine's internal chunk of query rows;
# block_k is the key block of the online softmax (it fixes the rounding of the results): 64,
# the GPU routines' (gpu_attention.BLOCK_K), so f32 and f64 attention give the same bits on the
# CPU and on a GPU.
DEFAULT_BLOCKS = {"block_q": 64, "block_k": 64}
MIN_TASKS = 8                  # the scheduler halves block_q until a problem has this many tasks
MAX_STACK_BYTES = 512 << 10     # the routine's scratch lives on the (OpenMP thread's) stack
_DC = {"f32": 128, "f64": 128}   # head dimensions per packed query slice (Q packed once if D <= DC)

_ISA = {
    "f32": dict(T="float", F="f", VL=16, VEC="__m512", MASK="__mmask16", P="ps", VL2=8,
                VEC2="__m256", TAIL2="_mm256_cmpgt_epi32(_mm256_set1_epi32(n), "
                "_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))"),
    "f64": dict(T="double", F="", VL=8, VEC="__m512d", MASK="__mmask8", P="pd", VL2=4,
                VEC2="__m256d", TAIL2="_mm256_cmpgt_epi64(_mm256_set1_epi64x(n), "
                "_mm256_setr_epi64x(0, 1, 2, 3))"),
}

_TEMPLATE = routine_text("attention.c")

_DRIVER = routine_text("attention_driver.c")


def _fill(text: str, dtype_short: str, **extra) -> str:
    if dtype_short not in _ISA:
        raise ValueError(f"attention_source: no attention routine for dtype {dtype_short!r} "
                         f"(have {sorted(_ISA)})")
    return specialise(text, **_ISA[dtype_short], S=dtype_short, **extra)


def attention_source(dtype_short: str, block_q: int | None = None,
                     block_k: int | None = None) -> str:
    """C text defining `ts_attention_block_<dtype_short>` ("f32" or "f64").

    block_q: query rows per internal chunk (the caller should hand out blocks of this many rows);
    block_k: keys per online-softmax block. Both default to DEFAULT_BLOCKS.
    block_k is part of the numerics: results are bitwise reproducible for a fixed block_k.
    Needs `ts_expf` / `ts_exp` defined earlier in the translation unit, and <math.h>."""
    if dtype_short not in _ISA:
        raise ValueError(f"attention_source: no attention routine for dtype {dtype_short!r} "
                         f"(have {sorted(_ISA)})")
    bq = DEFAULT_BLOCKS["block_q"] if block_q is None else int(block_q)
    bk = DEFAULT_BLOCKS["block_k"] if block_k is None else int(block_k)
    if bq < 1 or bq > 4096:
        raise ValueError(f"attention_source: block_q must be in 1..4096, got {bq}")
    if bk < 1 or bk > 4096:
        raise ValueError(f"attention_source: block_k must be in 1..4096, got {bk}")
    size = 4 if dtype_short == "f32" else 8
    stack = (_DC[dtype_short] + bk + 3) * ((bq + 15) // 16 * 16) * size
    if stack > MAX_STACK_BYTES:
        raise ValueError(f"attention_source: block_q={bq}, block_k={bk} need {stack >> 10} KiB "
                         f"of stack per call (at most {MAX_STACK_BYTES >> 10} KiB)")
    return _fill(_TEMPLATE, dtype_short, BQ=bq, BK=bk, DC=_DC[dtype_short])


def driver_source(dtype_short: str) -> str:
    """C text of an exported driver `tsa_run_<dt>` (the OpenMP loop over (batch*head, query
    block) that a caller generates) and `tsa_block_<dt>` (one routine call). Needs
    attention_source's text before it and <omp.h>. For tests and benchmarks."""
    return "#include <omp.h>\n" + _fill(_DRIVER, dtype_short)


# The routine for 16-bit operands ({S}: f16 or bf16): see c_gemm.HALF_ROUTINE.
HALF_ROUTINE = routine_text("attention_half.c")
