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
need ts_expf / ts_exp (tessera/ops/libm.py) earlier in the translation unit, as the renderer
emits them. Shared memory is static (`__shared__` in the routine, under the 48 KiB limit).

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
from .gpu_gemm import (COMMON, DT_CODE, MMA_OPS, SMEM_LIMIT, STORAGE, check_lang_dtype,
                       knob_error, register_tile)

DTYPES = ("f32", "f64", "f16", "bf16")
BLOCK_K = 64                   # keys per online-softmax block: part of the numerics
OUT_COLS = 64                  # output columns per register chunk
# (block_q, threads) a caller can start from; see the module docstring
DEFAULT_KNOBS = {"cuda": {"f32": (64, 256), "f64": (64, 256), "f16": (64, 128), "bf16": (64, 128)},
                 "hip": {"f32": (64, 256), "f64": (64, 256), "f16": (64, 256), "bf16": (64, 256)}}
_R_BYTES = {"f32": 4, "f64": 8, "f16": 4, "bf16": 4}
_SLICE = {"f32": 16, "f64": 8, "f16": 16, "bf16": 16}    # d slice (QK) and key slice (PV) depth

_EXP = {   # the dtype's exp for the template (an explicit specialisation: declared per dtype)
    "float": "template <> __device__ __forceinline__ float tsa_exp<float>(float x) "
             "{ return ts_expf(x); }\n",
    "double": "template <> __device__ __forceinline__ double tsa_exp<double>(double x) "
              "{ return ts_exp(x); }\n",
}

_EXP_DECL = """\
/* ts_expf / ts_exp for the attention routines: specialised per dtype, after them */
template <typename R> __device__ R tsa_exp(R x);
/* The keys rows q0 .. q0+nq-1 may see: past the last row's causal horizon all are masked. */
static __device__ __forceinline__ long long tsa_key_end(long long q0, long long nq,
                                                        long long Sk, int causal, long long off) {
  if (!causal) return Sk;
  const long long h = q0 + nq + off;
  return h < Sk ? (h > 0 ? h : 0) : Sk;
}
"""

_ATTENTION = r"""
/* ---- tsa_attention: flash attention for one block of query rows, see
   tessera/compiler/target/gpu_attention.py ---- */

/* reg[t] = tile element e = threadIdx.x + t*NT of a ROWS x COLS tile, (r, c) = (e / COLS,
   e % COLS) at g[r*rs + c], zero past rl rows or cl columns (or past the tile). NT is a
   multiple of COLS: a thread's column is fixed and its rows are NT/COLS apart. */
template <int DT, int ROWS, int COLS, int NT, int N>
__device__ __forceinline__ void tsa_fetch(typename tsg_dt<DT>::R (&reg)[N],
                                          const typename tsg_dt<DT>::S* g, long long rs,
                                          long long rl, long long cl) {
  const int r0 = threadIdx.x / COLS, c = threadIdx.x % COLS;
  const typename tsg_dt<DT>::S* p = g + r0 * rs + c;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const int r = r0 + t * (NT / COLS);
    reg[t] = (ROWS % (NT / COLS) == 0 || r < ROWS) && r < rl && c < cl
                 ? tsg_dt<DT>::in(p[t * (NT / COLS) * rs]) : typename tsg_dt<DT>::R(0);
  }
}
/* ...and into shared memory: s[c*ld + r] (TRANS) or s[r*ld + c] */
template <int ROWS, int COLS, int NT, int N, bool TRANS, typename R>
__device__ __forceinline__ void tsa_put(R* s, int ld, const R (&reg)[N]) {
  const int r0 = threadIdx.x / COLS, c = threadIdx.x % COLS;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const int r = r0 + t * (NT / COLS);
    if (ROWS % (NT / COLS) == 0 || r < ROWS) s[TRANS ? c * ld + r : r * ld + c] = reg[t];
  }
}

/* Scores: BQ x BK as NY x NX threads of TMS x TNS (rows ty*TMS + i, keys tx + NX*j).
   Output: BQ x NC column chunks as NYO x NXO threads of TMO x TNO (rows ty*TMO + i, columns
   tx + NXO*j). DS: d slice; QD: Q resident when D <= QD; VS: keys per V slice. */
template <int DT, int BQ, int BK, int NT, int TMS, int TNS, int TMO, int TNO, int NC, int DS,
          int QD, int VS>
__device__ __forceinline__ void tsa_attention(
    const typename tsg_dt<DT>::S* __restrict__ Q, long long q_rs,
    const typename tsg_dt<DT>::S* __restrict__ K, long long k_rs,
    const typename tsg_dt<DT>::S* __restrict__ V, long long v_rs,
    const typename tsg_dt<DT>::S* __restrict__ M, long long m_rs, long long m_cs,
    typename tsg_dt<DT>::S* __restrict__ O, long long o_rs, long long q0, long long nq,
    long long Sk, long long D, long long Dv, typename tsg_dt<DT>::R scale, int causal,
    long long off) {
  TSG_NOCONTRACT
  typedef typename tsg_dt<DT>::S S;
  typedef typename tsg_dt<DT>::R R;
  enum { NX = BK / TNS, NXO = NC / TNO, LQ = (BQ * DS + NT - 1) / NT,
         LK = (BK * DS + NT - 1) / NT, LV = (VS * NC + NT - 1) / NT,
         GLOBAL_OK = sizeof(S) == sizeof(R) };    /* O's rows can hold the accumulator */
  __shared__ R Qs[QD][BQ + 1];         /* Q, d-major: all of it (D <= QD) or one d slice */
  __shared__ R Ks[DS][BK + 1];         /* one d slice of the key block, d-major */
  __shared__ R Vs[VS][NC];             /* one key slice of V's current column chunk */
  __shared__ R Ps[BQ][BK + 1];         /* the key block's probabilities */
  __shared__ R al[BQ], ls[BQ];         /* per row: the block's rescaling factor; running sum */
  const int tid = threadIdx.x, tx = tid % NX, ty = tid / NX, txo = tid % NXO, tyo = tid / NXO;
  const R ninf = tsg_dt<DT>::ninf();
  const S* Qb = Q + q0 * q_rs;
  S* Ob = O + q0 * o_rs;
  const long long kend = tsa_key_end(q0, nq, Sk, causal, off);
  __syncthreads();                     /* the previous call's last reads are done */
  if (kend <= 0) {                     /* no row sees a key */
    for (long long e = tid; e < nq * Dv; e += NT)
      Ob[e / Dv * o_rs + e % Dv] = tsg_dt<DT>::out(R(0));
    return;
  }
  const bool q_res = D <= QD;
  const int nd = D > DS ? (int)((D + DS - 1) / DS) : 1;     /* d slices (one even if D = 0) */
  const int nch = (int)((Dv + NC - 1) / NC);
  /* the accumulator: registers (one pass per column chunk, scores recomputed per pass) or,
     for f32/f64 with Dv > NC, O itself (one pass) */
  const bool in_regs = !GLOBAL_OK || Dv <= NC;
  const int npass = in_regs ? nch : 1;
  for (int pass = 0; pass < npass; ++pass) {
    __syncthreads();                   /* the previous pass's reads of ls and Qs are done */
    for (int r = tid; r < BQ; r += NT) ls[r] = R(0);
    if (q_res)
      for (int e = tid; e < BQ * QD; e += NT) {
        const int r = e / QD, d = e % QD;
        Qs[d][r] = r < nq && d < D ? tsg_dt<DT>::in(Qb[r * q_rs + d]) : R(0);
      }
    R mrow[TMS], o[TMO][TNO];
#pragma unroll
    for (int i = 0; i < TMS; ++i) mrow[i] = ninf;
#pragma unroll
    for (int i = 0; i < TMO; ++i)
#pragma unroll
      for (int j = 0; j < TNO; ++j) o[i][j] = R(0);
    for (long long kb = 0; kb < kend; kb += BK) {
      const long long bk = Sk - kb < BK ? Sk - kb : BK;
      const S* Kb = K + kb * k_rs;
      /* 1. scores s[i][j] = fma chain over d of K[key][d] * Q[row][d] */
      R s[TMS][TNS], rq[LQ], rk[LK];
#pragma unroll
      for (int i = 0; i < TMS; ++i)
#pragma unroll
        for (int j = 0; j < TNS; ++j) s[i][j] = R(0);
      if (!q_res) tsa_fetch<DT, BQ, DS, NT, LQ>(rq, Qb, q_rs, nq, D);
      tsa_fetch<DT, BK, DS, NT, LK>(rk, Kb, k_rs, bk, D);
      for (int sd = 0; sd < nd; ++sd) {
        __syncthreads();               /* everybody is done with Ks, Qs (and Ps, Vs) */
        if (!q_res) tsa_put<BQ, DS, NT, LQ, true>(&Qs[0][0], BQ + 1, rq);
        tsa_put<BK, DS, NT, LK, true>(&Ks[0][0], BK + 1, rk);
        __syncthreads();
        const long long d0 = (long long)sd * DS;
        if (sd + 1 < nd) {             /* the next slice, while this one is used */
          if (!q_res) tsa_fetch<DT, BQ, DS, NT, LQ>(rq, Qb + d0 + DS, q_rs, nq, D - d0 - DS);
          tsa_fetch<DT, BK, DS, NT, LK>(rk, Kb + d0 + DS, k_rs, bk, D - d0 - DS);
        }
        /* (d past D: q = k = 0, fma(0, 0, s) = s but for the sign of a zero score) */
        const R* qs = q_res ? &Qs[d0][0] : &Qs[0][0];
#pragma unroll
        for (int d = 0; d < DS; ++d) {
          R qv[TMS], kv[TNS];
#pragma unroll
          for (int i = 0; i < TMS; ++i) qv[i] = qs[d * (BQ + 1) + ty * TMS + i];
#pragma unroll
          for (int j = 0; j < TNS; ++j) kv[j] = Ks[d][tx + NX * j];
#pragma unroll
          for (int i = 0; i < TMS; ++i)
#pragma unroll
            for (int j = 0; j < TNS; ++j) s[i][j] = tsg_fma(kv[j], qv[i], s[i][j]);
        }
      }
      /* 2. scale, mask, causal; the block's row max; the online-softmax step. In-block
         indices are ints: key tx + NX*j is visible to row r when it is below `vis`. */
      const int bki = (int)bk;
#pragma unroll
      for (int i = 0; i < TMS; ++i) {
        const int r = ty * TMS + i;
        const long long h = q0 + r + off + 1 - kb;   /* the causal horizon, in block keys */
        const int vis = !causal || h >= bki ? bki : h > 0 ? (int)h : 0;
        const S* mp = M && r < nq ? M + (q0 + r) * m_rs + (kb + tx) * m_cs : (const S*)0;
        R bm = ninf;
#pragma unroll
        for (int j = 0; j < TNS; ++j) {
          const int key = tx + NX * j;
          R v = tsg_mul(s[i][j], scale);
          if (M)
            v = tsg_add(v, mp && key < bki ? tsg_dt<DT>::in(mp[j * NX * m_cs]) : R(0));
          if (key >= vis) v = ninf;
          s[i][j] = v;
          bm = tsg_max(bm, v);         /* NaN never wins, as on the CPU */
        }
#pragma unroll
        for (int x = NX / 2; x > 0; x >>= 1) bm = tsg_max(bm, TSG_SHFL_XOR(bm, x));
        const R mo = mrow[i], mn = tsg_max(mo, bm);
        const R mz = mn == ninf ? R(0) : mn;            /* nothing seen: exp(-inf - 0) = 0 */
        mrow[i] = mn;
#pragma unroll
        for (int j = 0; j < TNS; ++j) Ps[r][tx + NX * j] = tsa_exp<R>(s[i][j] - mz);
        if (tx == 0) al[r] = mn == mo ? R(1) : tsa_exp<R>(mo - mz);
      }
      __syncthreads();
      /* 3. the running sums: the block's probabilities added in key order, one row each */
      for (int r = tid; r < BQ; r += NT) {
        R blk = R(0);
        for (int j = 0; j < bk; ++j) blk = tsg_add(blk, Ps[r][j]);
        ls[r] = tsg_fma(ls[r], al[r], blk);
      }
      /* 4. o = o * alpha + P V over the block's keys in order, chunk by chunk */
      const bool last = kb + BK >= kend;
      const int nvs = (int)((bk + VS - 1) / VS);
      for (int ch = in_regs ? pass : 0; ch < (in_regs ? pass + 1 : nch); ++ch) {
        const long long c0 = (long long)ch * NC;
        const int ncol = Dv - c0 < NC ? (int)(Dv - c0) : NC;     /* columns of this chunk */
#pragma unroll
        for (int i = 0; i < TMO; ++i) {
          const int r = tyo * TMO + i;
          const R a = al[r];
          const S* orow = Ob + r * o_rs + c0;
#pragma unroll
          for (int j = 0; j < TNO; ++j) {
            const int c = txo + NXO * j;
            if (!in_regs)              /* f32/f64 only: S is R */
              o[i][j] = kb > 0 && r < nq && c < ncol ? tsg_dt<DT>::in(orow[c]) : R(0);
            o[i][j] = tsg_mul(o[i][j], a);
          }
        }
        R rv[LV];
        tsa_fetch<DT, VS, NC, NT, LV>(rv, V + kb * v_rs + c0, v_rs, bk, Dv - c0);
        for (int sv = 0; sv < nvs; ++sv) {
          __syncthreads();             /* Vs is free; (first time) ls is written */
          tsa_put<VS, NC, NT, LV, false>(&Vs[0][0], NC, rv);
          __syncthreads();
          const int j0 = sv * VS;
          if (sv + 1 < nvs)
            tsa_fetch<DT, VS, NC, NT, LV>(rv, V + (kb + j0 + VS) * v_rs + c0, v_rs,
                                          bk - j0 - VS, Dv - c0);
          /* (keys past Sk: p = v = 0, and o is never -0: fma(0, 0, o) = o) */
#pragma unroll
          for (int j = 0; j < VS; ++j) {
            R pv[TMO], vv[TNO];
#pragma unroll
            for (int i = 0; i < TMO; ++i) pv[i] = Ps[tyo * TMO + i][j0 + j];
#pragma unroll
            for (int jj = 0; jj < TNO; ++jj) vv[jj] = Vs[j][txo + NXO * jj];
#pragma unroll
            for (int i = 0; i < TMO; ++i)
#pragma unroll
              for (int jj = 0; jj < TNO; ++jj) o[i][jj] = tsg_fma(pv[i], vv[jj], o[i][jj]);
          }
        }
        if (last || !in_regs) {        /* store: the final o / l, or the running accumulator */
#pragma unroll
          for (int i = 0; i < TMO; ++i) {
            const int r = tyo * TMO + i;
            const R l = ls[r];
            S* orow = Ob + r * o_rs + c0;
            if (r < nq)
#pragma unroll
              for (int j = 0; j < TNO; ++j) {
                const int c = txo + NXO * j;
                if (c < ncol)
                  orow[c] = tsg_dt<DT>::out(!last ? o[i][j]
                                                  : l == R(0) ? R(0) : tsg_div(o[i][j], l));
              }
          }
        }
      }
    }
  }
}
"""

_ATTENTION_MMA = r"""
/* ---- tsa_attention_mma: flash attention on tensor cores (CUDA f16/bf16, sm_80+), see
   tessera/compiler/target/gpu_attention.py ----
   Warp w < BQ/16 owns query rows 16w .. 16w+15. Per key block of 64: S = Q K^T by mma.sync
   (Q and K staged QW dimensions at a time), the online softmax on S's fragments (a row's 64
   scores sit in the 4 lanes of a quad: max and sum by xor shuffles, a fixed order), P rounded
   to the input dtype and reused from registers as the A operand of O += P V (V staged 128
   columns at a time, in flight while S is computed). */
template <int DT, int BQ, int NT, int QW>
__device__ __forceinline__ void tsa_attention_mma(
    const tsg_u16* __restrict__ Q, long long q_rs, const tsg_u16* __restrict__ K,
    long long k_rs, const tsg_u16* __restrict__ V, long long v_rs,
    const tsg_u16* __restrict__ M, long long m_rs, long long m_cs, tsg_u16* __restrict__ O,
    long long o_rs, long long q0, long long nq, long long Sk, long long D, long long Dv,
    float scale, int causal, long long off) {
  TSG_NOCONTRACT
  enum { BK = 64, VC = 128, NS = BK / 8, NO = VC / 8 };
  __shared__ tsg_u16 Qs[BQ * QW] __attribute__((aligned(128)));
  __shared__ tsg_u16 Ks[BK * QW] __attribute__((aligned(128)));
  __shared__ tsg_u16 Vs[BK * VC] __attribute__((aligned(128)));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int lr = lane & 7, lm = lane >> 3;
  const bool busy = warp < BQ / 16;    /* more warps than row groups: the others only load */
  const float ninf = __uint_as_float(0xff800000u);
  const tsg_u16* Qb = Q + q0 * q_rs;
  tsg_u16* Ob = O + q0 * o_rs;
  const long long kend = tsa_key_end(q0, nq, Sk, causal, off);
  __syncthreads();                     /* the previous call's last reads are done */
  if (kend <= 0) {                     /* no row sees a key */
    for (long long e = threadIdx.x; e < nq * Dv; e += NT) Ob[e / Dv * o_rs + e % Dv] = 0;
    return;
  }
  const bool q_vec = ((unsigned long long)Qb & 15) == 0 && q_rs % 8 == 0;
  const bool k_vec = ((unsigned long long)K & 15) == 0 && k_rs % 8 == 0;
  const bool v_vec = ((unsigned long long)V & 15) == 0 && v_rs % 8 == 0;
  const bool q_res = D <= QW;          /* Q loaded once, else with each d chunk of K */
  const int nd = D > QW ? (int)((D + QW - 1) / QW) : 1;
  const int npass = (int)((Dv + VC - 1) / VC);   /* Dv > 128: scores recomputed per pass */
  for (int pass = 0; pass < npass; ++pass) {
    const long long c0 = (long long)pass * VC;
    const int vc = Dv - c0 < VC ? (int)(Dv - c0) : VC;
    float o[NO][4], mrow[2] = {ninf, ninf}, lpart[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < NO; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) o[j][q] = 0.0f;
    for (long long kb = 0; kb < kend; kb += BK) {
      const long long bk = Sk - kb < BK ? Sk - kb : BK;
      float s[NS][4];
#pragma unroll
      for (int j = 0; j < NS; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) s[j][q] = 0.0f;
      /* 1. S = Q K^T, d chunk by chunk (zero past D, whole k16 steps) */
      for (int c = 0; c < nd; ++c) {
        const long long d0 = (long long)c * QW;
        const int dr = (int)((D - d0 < QW ? D - d0 : QW) + 15) / 16 * 16;
        __syncthreads();               /* Qs, Ks and Vs are free */
        if (!q_res || (pass == 0 && kb == 0))
          tsg_tile_fill<BQ, QW, NT>(Qs, Qb + d0, q_rs, 1, nq, D - d0, q_vec, dr);
        tsg_tile_fill<BK, QW, NT>(Ks, K + kb * k_rs + d0, k_rs, 1, bk, D - d0, k_vec, dr);
        tsg_cp_async_commit();
        if (c == 0) {                  /* V's block, in flight during the scores */
          tsg_tile_fill<BK, VC, NT>(Vs, V + kb * v_rs + c0, v_rs, 1, bk, Dv - c0, v_vec,
                                    (vc + 15) / 16 * 16);
          tsg_cp_async_commit();
          tsg_cp_async_wait<1>();
        } else {
          tsg_cp_async_wait<0>();
        }
        __syncthreads();
        if (busy)
          for (int ks = 0; ks < dr; ks += 16) {
            unsigned a[4];
            tsg_ldmatrix4<false>(a, Qs + tsg_at<QW>(warp * 16 + lr + 8 * (lm & 1),
                                                    ks + 8 * (lm >> 1)));
#pragma unroll
            for (int j = 0; j < NS; j += 2) {
              unsigned b[4];
              tsg_ldmatrix4<false>(b, Ks + tsg_at<QW>(j * 8 + lr + 8 * (lm >> 1),
                                                      ks + 8 * (lm & 1)));
              const unsigned b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
              tsg_mma16816<DT>(s[j], a, b0);
              tsg_mma16816<DT>(s[j + 1], a, b1);
            }
          }
      }
      /* 2. scale, mask, causal; the online-softmax step for rows g and g+8 of the warp */
      if (busy) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp * 16 + g + 8 * h;
          const long long hz = q0 + r + off + 1 - kb;   /* the causal horizon, in block keys */
          const int vis = !causal || hz >= bk ? (int)bk : hz > 0 ? (int)hz : 0;
          const tsg_u16* mp = M && r < nq ? M + (q0 + r) * m_rs + kb * m_cs : (const tsg_u16*)0;
          float bm = ninf;
#pragma unroll
          for (int j = 0; j < NS; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = j * 8 + 2 * t + e;
              float v = tsg_mul(s[j][2 * h + e], scale);
              if (M) v = tsg_add(v, mp && key < bk ? tsg_dt<DT>::in(mp[key * m_cs]) : 0.0f);
              if (key >= vis) v = ninf;
              s[j][2 * h + e] = v;
              bm = tsg_max(bm, v);
            }
          bm = tsg_max(bm, TSG_SHFL_XOR(bm, 1));
          bm = tsg_max(bm, TSG_SHFL_XOR(bm, 2));
          const float mo = mrow[h], mn = tsg_max(mo, bm), mz = mn == ninf ? 0.0f : mn;
          const float alpha = mn == mo ? 1.0f : tsa_exp<float>(mo - mz);
          mrow[h] = mn;
          float sum = 0.0f;
#pragma unroll
          for (int j = 0; j < NS; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float p = tsa_exp<float>(s[j][2 * h + e] - mz);
              s[j][2 * h + e] = p;
              sum = tsg_add(sum, p);
            }
          lpart[h] = tsg_fma(lpart[h], alpha, sum);   /* this lane's share of the row sum */
#pragma unroll
          for (int j = 0; j < NO; ++j) {
            o[j][2 * h] = tsg_mul(o[j][2 * h], alpha);
            o[j][2 * h + 1] = tsg_mul(o[j][2 * h + 1], alpha);
          }
        }
      }
      /* 3. O += P V: S's fragments of keys 16kk .. 16kk+15 are the A fragment */
      tsg_cp_async_wait<0>();
      __syncthreads();
      if (busy)
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          const unsigned a[4] = {tsg_pack2<DT>(s[2 * kk][0], s[2 * kk][1]),
                                 tsg_pack2<DT>(s[2 * kk][2], s[2 * kk][3]),
                                 tsg_pack2<DT>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                 tsg_pack2<DT>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
          for (int j = 0; j < NO; j += 2) {
            if (j * 8 < vc) {
              unsigned b[4];
              tsg_ldmatrix4<true>(b, Vs + tsg_at<VC>(kk * 16 + lr + 8 * (lm & 1),
                                                     j * 8 + 8 * (lm >> 1)));
              const unsigned b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
              tsg_mma16816<DT>(o[j], a, b0);
              tsg_mma16816<DT>(o[j + 1], a, b1);
            }
          }
        }
    }
    /* 4. the row sums across the quad (the same order in every lane), o / l, stored */
    if (busy)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = tsg_add(lpart[h], TSG_SHFL_XOR(lpart[h], 1));
        l = tsg_add(l, TSG_SHFL_XOR(l, 2));
        const int r = warp * 16 + g + 8 * h;
        tsg_u16* orow = Ob + r * o_rs + c0;
        if (r < nq)
#pragma unroll
          for (int j = 0; j < NO; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int c = j * 8 + 2 * t + e;
              if (c < vc)
                orow[c] = tsg_dt<DT>::out(l == 0.0f ? 0.0f : tsg_div(o[j][2 * h + e], l));
            }
      }
  }
}
"""

_WRAPPER = """\
/* {doc} */
static __device__ __forceinline__ void {name}(const {T}* Q, long long q_rs, const {T}* K,
    long long k_rs, const {T}* V, long long v_rs, const {T}* M, long long m_rs, long long m_cs,
    {T}* O, long long o_rs, long long q0, long long nq, long long Sk, long long D, long long Dv,
    {R} scale, int causal, long long causal_offset) {{
  {call}(Q, q_rs, K, k_rs, V, v_rs, M, m_rs, m_cs, O, o_rs, q0, nq, Sk, D, Dv, scale, causal,
      causal_offset);
}}
"""


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
    wrapper = _WRAPPER.format(doc=doc, name=name, T=STORAGE[dtype], R=r, call=call)
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
    wrapper = _WRAPPER.format(doc=doc, name=name, T=STORAGE[dtype], R="float", call=call)
    return name, [COMMON["cuda"], MMA_OPS, _EXP_DECL, _ATTENTION_MMA, _EXP["float"], wrapper]
