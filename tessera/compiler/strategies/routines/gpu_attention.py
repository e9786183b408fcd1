"""Hand-written GPU flash-attention routines (CUDA and HIP) as source chunks.

`attention_routine(lang, dtype, block_q, threads)` returns `(name, chunks)`; the chunks define

    __device__ void <name>(const T* Q, long long q_rs, const T* K, long long k_rs,
                           const T* V, long long v_rs, const T* M, long long m_rs,
                           long long m_cs, T* O, long long o_rs, long long q0, long long nq,
                           long long Sk, long long D, long long Dv, R scale, int causal,
                           long long causal_offset)

with the semantics of the CPU routine `ts_attention_block_*` (c_attention.py: read its
docstring): for query rows r = q0 .. q0+nq-1 (nq <= block_q) of one (batch, head),

    O[r, :] = softmax_j(scale * Q[r, :] . K[j, :] + M[r, j]) @ V[j, :],   j = 0 .. Sk-1

rows of Q, K, V, O at r * <x>_rs (last axis contiguous), M NULL or an additive mask at
M[r*m_rs + j*m_cs] (either stride may be 0, -inf masks), causal: key j masked for query r when
j > r + causal_offset; a query that sees no key gets zeros. All `threads` threads of a 1-D block
call it together; it begins with a barrier, so it can be called again at once. T is float or
double (R = T), or unsigned short holding f16 / bf16 bits (R = float: `scale` is a float, the
softmax and accumulation are f32, the output is rounded to nearest even once). O must not
overlap the inputs (f32/f64 may use O's rows as the accumulator). Any D and Dv work; the chunks
need ts_expf / ts_exp (tessera/compiler/spelling/libm.h) earlier in the translation unit, as
the renderer emits them. Shared memory is static (`__shared__` in the routine, under the 48 KiB limit).

Numerics. Bitwise reproducible (fixed orders, no atomics). The SIMT routine (f32/f64, and HIP
f16/bf16) is bitwise equal to the CPU routine built with the same key block (the CPU's
`attention_source(dt, block_k=BLOCK_K)`; its default block_k is 128): each score is the fma
chain over d = 0, 1, ... from 0, then * scale, then + M (never contracted); key blocks
[0, BK), [BK, 2BK), ...; the block max is exact; alpha = 1 exactly when the max did not move,
else exp(m_old - m_new); the block's probabilities are summed in key order by one thread per row
and l = fma(l, alpha, sum); o = o * alpha, then fma(p_j, v_j, o) over the block's keys in order;
finally o / l. The only cross-thread reduction is the block max (exact in any order).
The tensor-core routine (CUDA f16/bf16) follows the same steps on mma fragments: the sums over
d and over keys are the hardware's within each k16 step, P is rounded to the input dtype for
P V (as FlashAttention does), and a row's sum is 4 lane partials added in a fixed order.

Tiling and costs (H100 SXM; shared memory and registers from ptxas, CUDA 13.2, sm_90; the
fractions of peak are estimates from the instruction mix, to be measured on a lent GPU):
* SIMT, defaults block_q=64, block_k=64, 256 threads. Scores: a block_q x block_k tile per key
  block, each thread a TM x TN register tile (4 x 4 at 256 threads, 4 x 8 at 128: rows ty*TM + i,
  keys tx + NX*j), an fma per (row, key, d). Q stays in shared memory (d-major) when D fits
  (D <= 80 for f32), else it is streamed in 16-deep d slices with K; K is staged in d slices
  (d-major, rows padded by one element: neither the transposing stores nor the key-interleaved
  reads conflict), the next slice fetched into registers while the current one is used.
  Softmax: the row max by xor shuffles over the NX <= 32 threads of a row, exp on every thread,
  probabilities to shared memory, one thread per row sums them in key order (block_k adds
  against block_q*block_k*D/threads fmas: ~3% at D = 64). O += P V in 64-column chunks, V staged
  16 keys at a time; the accumulator stays in registers when Dv <= 64 or for f16/bf16 (Dv > 64
  then recomputes the scores once per chunk: slower, still exact); f32/f64 with Dv > 64 keep it
  in O's rows (L2-resident), one read and write per element and key block.
  f32: 45.1 KiB shared, ~128 registers (2 blocks of 8 warps per SM); f64: 45.6 KiB (8-deep
  slices, Q streamed). Expected 30-45% of the FP32 peak: shared-memory bound (scalar reads).
* Tensor cores, CUDA f16/bf16 (sm_80+), defaults block_q=64 with 128 threads (a warp per 16
  query rows; more warps only help loading). S = Q K^T by mma.sync.m16n8k16 from ldmatrix
  fragments, Q and K staged 128 dimensions at a time by cp.async (swizzled as in the GEMM; Q
  loaded once when D <= 128), V's block in flight meanwhile; the online softmax on S's
  fragments (a row's scores in the 4 lanes of a quad: max and sum by xor shuffles); P packed to
  f16x2/bf16x2 in registers is directly the A operand of O += P V (V read with ldmatrix.trans);
  O's 128 columns per pass in registers (Dv > 128: a pass per 128 columns, scores recomputed).
  block_q=64, 128 threads: 48 KiB shared, ~170-185 registers, 2 blocks (8 warps) per SM.
  Expected 35-55% of PyTorch SDPA (FlashAttention-2/cuDNN) for D = 64: the tensor-core work is
  as FA2's, but every probability costs ~22 FP32 instructions of the deterministic polynomial
  ts_expf (FA2: one ex2.approx), which makes the loop ALU-bound.
"""
from __future__ import annotations

from ....errors import UnsupportedDTypeError
from . import routine_text, specialise
from .gpu_gemm import (COMMON, DT_CODE, MMA_OPS, SMEM_LIMIT, STORAGE, check_lang_dtype,
                       knob_error, register_tile)

DTYPES = ("f32", "f64", "f16", "bf16")
BLOCK_K = 64                   # keys per online-softmax block: part of the numerics
OUT_COLS = 64                  # output columns per register chunk
# (block_q, threads) a caller can start from; see the module docstring. CUDA 16-bit: 128 queries
# on 8 warps ran B8 H16 S2048 D64 bf16 1.3x faster than 64 on 4 (an H200, 2026-11-26)
DEFAULT_KNOBS = {"cuda": {"f32": (64, 256), "f64": (64, 256),
                          "f16": (128, 256), "bf16": (128, 256)},
                 "hip": {"f32": (64, 256), "f64": (64, 256), "f16": (64, 256), "bf16": (64, 256)}}
_R_BYTES = {"f32": 4, "f64": 8, "f16": 4, "bf16": 4}
_SLICE = {"f32": 16, "f64": 8, "f16": 16, "bf16": 16}    # d slice (QK) and key slice (PV) depth

_EXP = {   # the dtype's exp for the template (an explicit specialisation: declared per dtype)
    "float": "template <> __device__ __forceinline__ float tsa_exp<float>(float x) "
             "{ return ts_expf(x); }\n",
    "double": "template <> __device__ __forceinline__ double tsa_exp<double>(double x) "
              "{ return ts_exp(x); }\n",
}

_EXP_DECL = routine_text("attention_common.cuh")

_ATTENTION = routine_text("attention_simt.cuh")

_ATTENTION_MMA = routine_text("attention_mma.cuh")

_WRAPPER = routine_text("attention_wrapper.cuh")


def attention_plan(dtype: str, block_q: int, threads: int, block_k: int = BLOCK_K) -> dict:
    """The routine's thread grids, slices and shared memory for these knobs, checked."""
    what = f"attention_routine({dtype}, block_q={block_q}, threads={threads}, block_k={block_k})"
    if threads < 64 or threads > 1024 or threads % 64:
        raise knob_error(what, "threads must be a multiple of 64 in 64..1024", str(threads))
    if block_q < 1 or block_q > 256 or block_k < 1 or block_k > 256:
        raise knob_error(what, "block_q and block_k must be in 1..256", f"{block_q}, {block_k}")
    tms, tns = register_tile(block_q, block_k, threads)
    tmo, tno = register_tile(block_q, OUT_COLS, threads)
    size = _R_BYTES[dtype]
    if not tms or not tmo or block_k // tns > 32 or max(tms * tns, tmo * tno) * size > 256:
        raise knob_error(what, "block_q*block_k/threads and block_q*64/threads must be powers "
                          "of two that tile the blocks, at most 32 threads per score row and "
                          f"{256 // size} values per thread", f"{threads} threads",
                          hint="e.g. block_q=64, threads=128")
    ds = _SLICE[dtype]
    fixed = ds * (block_k + 1) + ds * OUT_COLS + block_q * (block_k + 1) + 2 * block_q
    qd = (SMEM_LIMIT // size - fixed) // (block_q + 1) // ds * ds
    qd = min(qd, 256)
    if qd < ds:
        raise knob_error(what, f"needs more than {SMEM_LIMIT} bytes of shared memory",
                          f"block_q={block_q}, block_k={block_k}", hint="lower block_q")
    return {"TMS": tms, "TNS": tns, "TMO": tmo, "TNO": tno, "NC": OUT_COLS, "DS": ds, "QD": qd,
            "VS": ds, "smem": (fixed + qd * (block_q + 1)) * size}


def uses_tensor_cores(lang: str, dtype: str) -> bool:
    return lang == "cuda" and dtype in ("f16", "bf16")


def attention_routine(lang: str, dtype: str, block_q: int, threads: int,
                      block_k: int = BLOCK_K) -> tuple[str, list[str]]:
    """(name, chunks) of the block-level flash-attention routine in the module docstring.

    lang "cuda" | "hip"; dtype "f32" | "f64" | "f16" | "bf16". CUDA f16/bf16 use tensor cores
    (`mma_attention_routine`: block_q a multiple of 16, one warp per 16 rows, block_k 64),
    everything else the SIMT routine. block_k (keys per online-softmax block) fixes the
    rounding: f32/f64 results equal the CPU routine's built with the same block_k. The chunks
    need ts_expf (f32, f16, bf16) or ts_exp (f64) defined before them."""
    check_lang_dtype(lang, dtype, "attention_routine")
    if uses_tensor_cores(lang, dtype):
        if int(block_k) != BLOCK_K:
            raise knob_error("attention_routine", f"the tensor-core routine's key block is "
                             f"{BLOCK_K}", f"block_k={block_k}")
        return mma_attention_routine(dtype, block_q, threads)
    return simt_attention_routine(lang, dtype, block_q, threads, block_k)


def simt_attention_routine(lang: str, dtype: str, block_q: int, threads: int,
                           block_k: int = BLOCK_K) -> tuple[str, list[str]]:
    """The SIMT routine for any dtype (f16/bf16 computed in f32): what HIP uses for every
    dtype and CUDA for f32/f64 (tests run its f16/bf16 form in the CUDA emulator)."""
    check_lang_dtype(lang, dtype, "simt_attention_routine")
    block_q, threads, block_k = int(block_q), int(threads), int(block_k)
    p = attention_plan(dtype, block_q, threads, block_k)
    r = "double" if dtype == "f64" else "float"
    name = f"tsa_attention_{dtype}_q{block_q}_k{block_k}_t{threads}"
    call = (f"tsa_attention<{DT_CODE[dtype]}, {block_q}, {block_k}, {threads}, {p['TMS']}, "
            f"{p['TNS']}, {p['TMO']}, {p['TNO']}, {p['NC']}, {p['DS']}, {p['QD']}, {p['VS']}>")
    doc = (f"flash attention, {block_q} query rows x {block_k}-key blocks, {threads} threads, "
           f"Q resident for D <= {p['QD']}, {p['smem']} B shared")
    wrapper = specialise(_WRAPPER, doc=doc, name=name, T=STORAGE[dtype], R=r, call=call)
    return name, [COMMON[lang], _EXP_DECL, _ATTENTION, _EXP[r], wrapper]


def mma_attention_plan(dtype: str, block_q: int, threads: int) -> dict:
    """The tensor-core routine's Q/K staging width and shared memory, checked."""
    what = f"attention_routine(cuda, {dtype}, block_q={block_q}, threads={threads})"
    if threads < 32 or threads > 512 or threads % 32:
        raise knob_error(what, "threads must be a multiple of 32 in 32..512", str(threads))
    if block_q % 16 or not 16 <= block_q <= 128 or block_q // 16 > threads // 32:
        raise knob_error(what, "the tensor-core routine needs block_q a multiple of 16 in "
                         "16..128 and a warp per 16 rows", f"{block_q} rows, {threads} threads",
                         hint="e.g. block_q=64, threads=128")
    qw = 128 if block_q <= 64 else 64
    return {"QW": qw, "smem": 2 * (block_q * qw + BLOCK_K * qw + BLOCK_K * 128)}


def mma_attention_routine(dtype: str, block_q: int, threads: int) -> tuple[str, list[str]]:
    """The CUDA tensor-core routine (f16/bf16 storage, f32 softmax and accumulation, sm_80+)."""
    check_lang_dtype("cuda", dtype, "mma_attention_routine")
    if dtype not in ("f16", "bf16"):
        raise UnsupportedDTypeError(f"mma_attention_routine: tensor cores take f16 or bf16, "
                                    f"not {dtype}")
    block_q, threads = int(block_q), int(threads)
    p = mma_attention_plan(dtype, block_q, threads)
    name = f"tsa_attention_mma_{dtype}_q{block_q}_t{threads}"
    call = f"tsa_attention_mma<{DT_CODE[dtype]}, {block_q}, {threads}, {p['QW']}>"
    doc = (f"tensor-core flash attention, {block_q} query rows (a warp per 16) x 64-key blocks, "
           f"{threads} threads, Q/K staged {p['QW']} dims at a time, {p['smem']} B shared")
    wrapper = specialise(_WRAPPER, doc=doc, name=name, T=STORAGE[dtype], R="float", call=call)
    return name, [COMMON["cuda"], MMA_OPS, _EXP_DECL, _ATTENTION_MMA, _EXP["float"], wrapper]
