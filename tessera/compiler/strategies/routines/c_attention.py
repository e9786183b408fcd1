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
(D <= 128); ts_expf's own bound (libm.py) adds at most ~1 ulp per probability.

The caller hands (batch * head, query block) pairs to threads, e.g.

    #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < B * H * nqb; ++t) ... ts_attention_block_f32(..., q0, nq, ...)

with nq = block_q (DEFAULT_BLOCKS) except for the last block of a head; `driver_source` renders
that loop for [B, H] batches with arbitrary element strides (tests and benchmarks use it).

The routine calls `ts_expf` (f32) / `ts_exp` (f64), which must be defined earlier in the same
translation unit (tessera/ops/libm.py); it defines neither, and needs <math.h>, <stdint.h>.
"""
from __future__ import annotations

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

_TEMPLATE = r"""
/* ---- ts_attention_block_{S}: fused attention, one (batch, head), query rows q0 .. q0+nq ---- */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#define TSA_BQ_{S} {BQ}                 /* query rows per chunk */
#define TSA_BK_{S} {BK}                 /* keys per online-softmax block */
#define TSA_DC_{S} {DC}                 /* head dimensions per packed query slice */
#ifndef TSA_L
#define TSA_L 16                        /* query rows per softmax step (not the vector width) */
#endif
#define TSA_BQP_{S} ((TSA_BQ_{S} + TSA_L - 1) / TSA_L * TSA_L)
#define TSA_RK_{S} 6                    /* keys per score register tile */
#define TSA_RQ_{S} 6                    /* query rows per P.V register tile */
#if defined(__AVX512F__) && !defined(TS_ATTENTION_PORTABLE)
#include <immintrin.h>
#define TSA_SIMD_{S} 1
#define TSA_VL_{S} {VL}
#define TSA_NV_{S} 4                    /* vectors per register tile row: 6 x 4 of 32 zmm */
typedef {VEC} tsa_v_{S};
typedef {MASK} tsa_m_{S};
#define tsa_tail_{S}(n) ((n) >= TSA_VL_{S} ? (tsa_m_{S})~0u : (tsa_m_{S})((1u << (n)) - 1u))
#define tsa_loadm_{S}(m, p) _mm512_maskz_loadu_{P}(m, p)
#define tsa_storem_{S}(p, m, v) _mm512_mask_storeu_{P}(p, m, v)
#define tsa_load_{S}(p) _mm512_loadu_{P}(p)
#define tsa_store_{S}(p, v) _mm512_storeu_{P}(p, v)
#define tsa_set1_{S}(x) _mm512_set1_{P}(x)
#define tsa_fma_{S}(a, b, c) _mm512_fmadd_{P}(a, b, c)
#define tsa_mul_{S}(a, b) _mm512_mul_{P}(a, b)
#define tsa_zero_{S}() _mm512_setzero_{P}()
#elif defined(__AVX2__) && defined(__FMA__) && !defined(TS_ATTENTION_PORTABLE)
#include <immintrin.h>
#define TSA_SIMD_{S} 1
#define TSA_VL_{S} {VL2}
#define TSA_NV_{S} 2                    /* 6 x 2 of 16 ymm */
typedef {VEC2} tsa_v_{S};
typedef __m256i tsa_m_{S};
#define tsa_tail_{S}(n) {TAIL2}
#define tsa_loadm_{S}(m, p) _mm256_maskload_{P}(p, m)
#define tsa_storem_{S}(p, m, v) _mm256_maskstore_{P}(p, m, v)
#define tsa_load_{S}(p) _mm256_loadu_{P}(p)
#define tsa_store_{S}(p, v) _mm256_storeu_{P}(p, v)
#define tsa_set1_{S}(x) _mm256_set1_{P}(x)
#define tsa_fma_{S}(a, b, c) _mm256_fmadd_{P}(a, b, c)
#define tsa_mul_{S}(a, b) _mm256_mul_{P}(a, b)
#define tsa_zero_{S}() _mm256_setzero_{P}()
#else
#define TSA_SIMD_{S} 0
#endif

#if TSA_SIMD_{S}
/* Scores, transposed: s[k][0 .. nv vectors) (=|+=) sum over d < dn of k[k][d] * qt[d][...],
   k < RK keys. Each score is the fma chain over d in order. Key rows may alias (padding):
   everything is loaded before anything is stored. */
static inline __attribute__((always_inline)) void
tsa_qk_tile_{S}(const int nv, const {T}* const* kp, const {T}* qt, int64_t dn, {T}* const* sp,
                int first) {
  tsa_v_{S} acc[TSA_RK_{S}][TSA_NV_{S}];
#pragma GCC unroll 8
  for (int k = 0; k < TSA_RK_{S}; ++k)
#pragma GCC unroll 8
    for (int c = 0; c < nv; ++c)
      acc[k][c] = first ? tsa_zero_{S}() : tsa_load_{S}(sp[k] + c * TSA_VL_{S});
  for (int64_t d = 0; d < dn; ++d) {
    const {T}* qd = qt + d * TSA_BQP_{S};
    tsa_v_{S} qv[TSA_NV_{S}];
#pragma GCC unroll 8
    for (int c = 0; c < nv; ++c) qv[c] = tsa_load_{S}(qd + c * TSA_VL_{S});
#pragma GCC unroll 8
    for (int k = 0; k < TSA_RK_{S}; ++k) {
      tsa_v_{S} kk = tsa_set1_{S}(kp[k][d]);
#pragma GCC unroll 8
      for (int c = 0; c < nv; ++c) acc[k][c] = tsa_fma_{S}(kk, qv[c], acc[k][c]);
    }
  }
#pragma GCC unroll 8
  for (int k = 0; k < TSA_RK_{S}; ++k)
#pragma GCC unroll 8
    for (int c = 0; c < nv; ++c) tsa_store_{S}(sp[k] + c * TSA_VL_{S}, acc[k][c]);
}

static void tsa_qk_{S}(int nk, const {T}* const* kp, const {T}* qt, int64_t nl, int64_t dn,
                       {T}* const* sp, int first) {
  (void)nk;
  switch (nl / TSA_VL_{S}) {
#if TSA_NV_{S} >= 4
    case 4: tsa_qk_tile_{S}(4, kp, qt, dn, sp, first); break;
    case 3: tsa_qk_tile_{S}(3, kp, qt, dn, sp, first); break;
#endif
    case 2: tsa_qk_tile_{S}(2, kp, qt, dn, sp, first); break;
    default: tsa_qk_tile_{S}(1, kp, qt, dn, sp, first); break;
  }
}

/* o[i][c0 .. c0 + nv vectors) = o * alpha[i] + sum over j < nk of p[i][j * BQP] * v[j][...],
   i < RQ rows; the last vector is masked by `tail`. Each output element: one multiply, then the
   fma chain over j in order. Rows may alias (padding): loaded before stored. */
static inline __attribute__((always_inline)) void
tsa_pv_tile_{S}(const int nv, tsa_m_{S} tail, {T}* const* o, const {T}* const* p,
                const {T}* al, const {T}* v, int64_t v_rs, int64_t nk) {
  tsa_v_{S} acc[TSA_RQ_{S}][TSA_NV_{S}];
#pragma GCC unroll 8
  for (int i = 0; i < TSA_RQ_{S}; ++i) {
    tsa_v_{S} a = tsa_set1_{S}(al[i]);
#pragma GCC unroll 8
    for (int c = 0; c < nv; ++c)
      acc[i][c] = tsa_mul_{S}(c == nv - 1 ? tsa_loadm_{S}(tail, o[i] + c * TSA_VL_{S})
                                          : tsa_load_{S}(o[i] + c * TSA_VL_{S}), a);
  }
  for (int64_t j = 0; j < nk; ++j) {
    const {T}* vj = v + j * v_rs;
    tsa_v_{S} vv[TSA_NV_{S}];
#pragma GCC unroll 8
    for (int c = 0; c < nv; ++c)
      vv[c] = c == nv - 1 ? tsa_loadm_{S}(tail, vj + c * TSA_VL_{S})
                          : tsa_load_{S}(vj + c * TSA_VL_{S});
#pragma GCC unroll 8
    for (int i = 0; i < TSA_RQ_{S}; ++i) {
      tsa_v_{S} pi = tsa_set1_{S}(p[i][j * TSA_BQP_{S}]);
#pragma GCC unroll 8
      for (int c = 0; c < nv; ++c) acc[i][c] = tsa_fma_{S}(pi, vv[c], acc[i][c]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < TSA_RQ_{S}; ++i)
#pragma GCC unroll 8
    for (int c = 0; c < nv; ++c) {
      if (c == nv - 1) tsa_storem_{S}(o[i] + c * TSA_VL_{S}, tail, acc[i][c]);
      else tsa_store_{S}(o[i] + c * TSA_VL_{S}, acc[i][c]);
    }
}

static void tsa_pv_{S}(int nr, {T}* const* o, const {T}* const* p, const {T}* al,
                       const {T}* v, int64_t v_rs, int64_t nk, int64_t Dv) {
  (void)nr;
  const int64_t W = TSA_NV_{S} * TSA_VL_{S};
  for (int64_t c0 = 0; c0 < Dv; c0 += W) {
    const int64_t rem = Dv - c0;
    const int nv = rem >= W ? TSA_NV_{S} : (int)((rem + TSA_VL_{S} - 1) / TSA_VL_{S});
    const int last = (int)(rem - (int64_t)(nv - 1) * TSA_VL_{S});
    const tsa_m_{S} tail = tsa_tail_{S}(last);
    {T}* oc[TSA_RQ_{S}];
    for (int i = 0; i < TSA_RQ_{S}; ++i) oc[i] = o[i] + c0;
    switch (nv) {
#if TSA_NV_{S} >= 4
      case 4: tsa_pv_tile_{S}(4, tail, oc, p, al, v + c0, v_rs, nk); break;
      case 3: tsa_pv_tile_{S}(3, tail, oc, p, al, v + c0, v_rs, nk); break;
#endif
      case 2: tsa_pv_tile_{S}(2, tail, oc, p, al, v + c0, v_rs, nk); break;
      default: tsa_pv_tile_{S}(1, tail, oc, p, al, v + c0, v_rs, nk); break;
    }
  }
}
#else
/* Portable path: the same operations element by element (GCC vectorises the inner loops).
   Only the real (non-padding) keys and rows of a tile are processed. */
#define TSA_VL_{S} 4
#define TSA_NV_{S} 4
static void tsa_qk_{S}(int nk, const {T}* const* kp, const {T}* qt, int64_t nl, int64_t dn,
                       {T}* const* sp, int first) {
  for (int k = 0; k < nk; ++k) {
    {T}* sk = sp[k];
    const {T}* kk = kp[k];
    if (first)
      for (int64_t i = 0; i < nl; ++i) sk[i] = 0;
    for (int64_t d = 0; d < dn; ++d) {
      const {T} a = kk[d];
      const {T}* qd = qt + d * TSA_BQP_{S};
#pragma omp simd
      for (int64_t i = 0; i < nl; ++i) sk[i] = fma{F}(a, qd[i], sk[i]);
    }
  }
}

static void tsa_pv_{S}(int nr, {T}* const* o, const {T}* const* p, const {T}* al,
                       const {T}* v, int64_t v_rs, int64_t nk, int64_t Dv) {
  for (int i = 0; i < nr; ++i) {
    {T}* oi = o[i];
    const {T} a = al[i];
#pragma omp simd
    for (int64_t c = 0; c < Dv; ++c) oi[c] = oi[c] * a;
    for (int64_t j = 0; j < nk; ++j) {
      const {T} pj = p[i][j * TSA_BQP_{S}];
      const {T}* vj = v + j * v_rs;
#pragma omp simd
      for (int64_t c = 0; c < Dv; ++c) oi[c] = fma{F}(pj, vj[c], oi[c]);
    }
  }
}
#endif

/* qt[d][i] = Q[i][d0 + d] for the chunk's nb rows, 0 for the padding rows up to nl */
static void tsa_pack_q_{S}({T}* qt, const {T}* Q, int64_t q_rs, int64_t nb, int64_t nl,
                           int64_t d0, int64_t dn) {
  for (int64_t i = 0; i < nb; ++i) {
    const {T}* qi = Q + i * q_rs + d0;
    for (int64_t d = 0; d < dn; ++d) qt[d * TSA_BQP_{S} + i] = qi[d];
  }
  for (int64_t d = 0; d < dn; ++d)
    for (int64_t i = nb; i < nl; ++i) qt[d * TSA_BQP_{S} + i] = 0;
}

static void ts_attention_block_{S}(const {T}* Q, int64_t q_rs, const {T}* K, int64_t k_rs,
                                   const {T}* V, int64_t v_rs, const {T}* M, int64_t m_rs,
                                   int64_t m_cs, {T}* O, int64_t o_rs, int64_t q0, int64_t nq,
                                   int64_t Sk, int64_t D, int64_t Dv, {T} scale, int causal,
                                   int64_t causal_offset) {
  enum { BQ = TSA_BQ_{S}, BQP = TSA_BQP_{S}, BK = TSA_BK_{S}, DC = TSA_DC_{S},
         RK = TSA_RK_{S}, RQ = TSA_RQ_{S}, L = TSA_L, TW = TSA_NV_{S} * TSA_VL_{S} };
  _Alignas(64) {T} qt[DC * BQP];      /* the chunk's queries, transposed: qt[d][i] */
  _Alignas(64) {T} st[BK * BQP];      /* scores, then probabilities, transposed: st[j][i] */
  _Alignas(64) {T} mrow[BQP];         /* running max per row */
  _Alignas(64) {T} lrow[BQP];         /* running sum per row */
  _Alignas(64) {T} arow[BQP];         /* this block's rescaling factor per row */
  const int64_t off = causal_offset;
  for (int64_t c0 = 0; c0 < nq; c0 += BQ) {
    const int64_t nb = nq - c0 < BQ ? nq - c0 : BQ;
    const int64_t nl = (nb + L - 1) / L * L;   /* rows rounded up to whole softmax steps */
    const int64_t r0 = q0 + c0;                  /* the chunk's first query row */
    for (int64_t i = 0; i < nl; ++i) {
      mrow[i] = -INFINITY;
      lrow[i] = 0;
      arow[i] = 1;
    }
    for (int64_t i = 0; i < nb; ++i) {
      {T}* orow = O + (r0 + i) * o_rs;
      for (int64_t c = 0; c < Dv; ++c) orow[c] = 0;
    }
    int64_t kend = Sk;                  /* keys past the last row's horizon: masked for all */
    if (causal) {
      const int64_t h = r0 + nb + off;
      kend = h < Sk ? (h > 0 ? h : 0) : Sk;
    }
    const int q_once = D <= DC;         /* the whole head dimension fits: pack Q once */
    if (q_once) tsa_pack_q_{S}(qt, Q + r0 * q_rs, q_rs, nb, nl, 0, D);
    for (int64_t kb = 0; kb < kend; kb += BK) {
      const int64_t bk = Sk - kb < BK ? Sk - kb : BK;
      /* 1. scores st[j][i] = Q[i] . K[kb + j], for tiles of RK keys x TW rows */
      int64_t d0 = 0;
      do {
        const int64_t dn = D - d0 < DC ? D - d0 : DC;
        if (!q_once) tsa_pack_q_{S}(qt, Q + r0 * q_rs, q_rs, nb, nl, d0, dn);
        for (int64_t i0 = 0; i0 < nl; i0 += TW) {
          const int64_t ni = nl - i0 < TW ? nl - i0 : TW;
          int64_t jhi = bk;             /* keys the tile's last real row can see */
          if (causal) {
            const int64_t il = (i0 + ni < nb ? i0 + ni : nb) - 1;
            const int64_t h = r0 + il + off + 1 - kb;
            if (h <= 0) continue;
            jhi = h < jhi ? h : jhi;
          }
          for (int64_t j0 = 0; j0 < jhi; j0 += RK) {
            const {T}* kp[RK];
            {T}* sp[RK];
            for (int k = 0; k < RK; ++k) {
              const int64_t j = j0 + k < jhi ? j0 + k : jhi - 1;
              kp[k] = K + (kb + j) * k_rs + d0;
              sp[k] = st + j * BQP + i0;
            }
            const int nk = (int)(jhi - j0 < RK ? jhi - j0 : RK);
            tsa_qk_{S}(nk, kp, qt + i0, ni, dn, sp, d0 == 0);
          }
        }
        d0 += dn;
      } while (d0 < D);
      /* 2. the online-softmax step, L rows at a time (rows in lanes: elementwise per row) */
      for (int64_t i0 = 0; i0 < nl; i0 += L) {
        const int64_t il = (i0 + L < nb ? i0 + L : nb) - 1;    /* last real row of the step */
        int64_t jv = bk;                /* keys kb .. kb+jv: visible to at least one row */
        if (causal) {
          const int64_t h = r0 + il + off + 1 - kb;
          if (h <= 0) {                 /* no row sees this block: p = 0, states kept */
            for (int64_t j = 0; j < bk; ++j)
#pragma omp simd
              for (int l = 0; l < L; ++l) st[j * BQP + i0 + l] = 0;
            for (int l = 0; l < L; ++l) arow[i0 + l] = 1;
            continue;
          }
          jv = h < jv ? h : jv;
        }
        /* lane l (row r0+i0+l) drops key kb+j when l < t(j) = kb + j - r0 - i0 - off */
        const int ragged = causal && kb + jv - 1 - r0 - i0 - off > 0;
        {T} bm[L];
        for (int l = 0; l < L; ++l) bm[l] = -INFINITY;
        int64_t moff[L];                /* mask row offsets (padding lanes read the last row) */
        if (M)
          for (int l = 0; l < L; ++l) moff[l] = (r0 + (i0 + l <= il ? i0 + l : il)) * m_rs;
        for (int64_t j = 0; j < jv; ++j) {
          {T}* s = st + j * BQP + i0;
          if (!M) {
#pragma omp simd
            for (int l = 0; l < L; ++l) s[l] = s[l] * scale;
          } else if (m_rs == 0) {
            const {T} mj = M[(kb + j) * m_cs];
#pragma omp simd
            for (int l = 0; l < L; ++l) s[l] = s[l] * scale + mj;
          } else {
            const {T}* mj = M + (kb + j) * m_cs;
#pragma omp simd
            for (int l = 0; l < L; ++l) s[l] = s[l] * scale + mj[moff[l]];
          }
          if (ragged) {
            const int64_t t = kb + j - r0 - i0 - off;
#pragma omp simd
            for (int l = 0; l < L; ++l) s[l] = l < t ? -INFINITY : s[l];
          }
#pragma omp simd
          for (int l = 0; l < L; ++l) bm[l] = s[l] > bm[l] ? s[l] : bm[l];
        }
        {T} mz[L], blk[L];
        {T}* mr = mrow + i0;
        {T}* ar = arow + i0;
#pragma omp simd
        for (int l = 0; l < L; ++l) {
          const {T} mo = mr[l];
          const {T} mn = bm[l] > mo ? bm[l] : mo;
          mz[l] = mn == -INFINITY ? ({T})0 : mn;  /* nothing seen yet: exp(-inf - 0) = 0 */
          ar[l] = mn == mo ? ({T})1 : ts_exp{F}(mo - mz[l]);
          mr[l] = mn;
          blk[l] = 0;
        }
        for (int64_t j = 0; j < jv; ++j) {
          {T}* s = st + j * BQP + i0;
#pragma omp simd
          for (int l = 0; l < L; ++l) {
            const {T} p = ts_exp{F}(s[l] - mz[l]);
            s[l] = p;
            blk[l] = blk[l] + p;
          }
        }
        for (int64_t j = jv; j < bk; ++j)
#pragma omp simd
          for (int l = 0; l < L; ++l) st[j * BQP + i0 + l] = 0;
        {T}* lr = lrow + i0;
#pragma omp simd
        for (int l = 0; l < L; ++l) lr[l] = fma{F}(lr[l], ar[l], blk[l]);
      }
      /* 3. O = O * alpha + P V, RQ rows at a time, V read in place */
      for (int64_t g = 0; g < nb; g += RQ) {
        const int64_t gl = (g + RQ < nb ? g + RQ : nb) - 1;
        int64_t nk = bk;
        if (causal) {
          const int64_t h = r0 + gl + off + 1 - kb;
          if (h <= 0) continue;         /* (then every alpha of the tile is 1) */
          nk = h < nk ? h : nk;
        }
        {T}* op[RQ];
        const {T}* pp[RQ];
        {T} al[RQ];
        for (int i = 0; i < RQ; ++i) {
          const int64_t ii = g + i <= gl ? g + i : gl;
          op[i] = O + (r0 + ii) * o_rs;
          pp[i] = st + ii;
          al[i] = arow[ii];
        }
        tsa_pv_{S}((int)(gl - g + 1), op, pp, al, V + kb * v_rs, v_rs, nk, Dv);
      }
    }
    /* 4. normalise; a row that saw no key (l = 0) gets zeros */
    for (int64_t i = 0; i < nb; ++i) {
      const {T} l = lrow[i];
      {T}* orow = O + (r0 + i) * o_rs;
      if (l == 0) {
        for (int64_t c = 0; c < Dv; ++c) orow[c] = 0;
      } else {
#pragma omp simd
        for (int64_t c = 0; c < Dv; ++c) orow[c] = orow[c] / l;
      }
    }
  }
}
"""

_DRIVER = r"""
/* [B, H] batches of attention, (batch * head, query block) pairs over the threads. Strides are
   in elements: qs = {b, h, row} (last axis contiguous), likewise ks, vs, os; ms = {b, h, r, j}.
   nthreads <= 0: OpenMP's default. */
void tsa_run_{S}(const {T}* Q, const int64_t* qs, const {T}* K, const int64_t* ks,
                 const {T}* V, const int64_t* vs, const {T}* M, const int64_t* ms,
                 {T}* O, const int64_t* os, int64_t B, int64_t H, int64_t Sq, int64_t Sk,
                 int64_t D, int64_t Dv, {T} scale, int causal, int64_t causal_offset,
                 int64_t block_q, int nthreads) {
  const int64_t nqb = (Sq + block_q - 1) / block_q;
  const int64_t ntask = B * H * nqb;
  const int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t t = 0; t < ntask; ++t) {
    const int64_t bh = t / nqb, qb = t % nqb, b = bh / H, h = bh % H;
    const int64_t q0 = qb * block_q;
    const int64_t nq = Sq - q0 < block_q ? Sq - q0 : block_q;
    ts_attention_block_{S}(Q + b * qs[0] + h * qs[1], qs[2], K + b * ks[0] + h * ks[1], ks[2],
                           V + b * vs[0] + h * vs[1], vs[2],
                           M ? M + b * ms[0] + h * ms[1] : (const {T}*)0, ms[2], ms[3],
                           O + b * os[0] + h * os[1], os[2], q0, nq, Sk, D, Dv, scale, causal,
                           causal_offset);
  }
}

/* One call of the routine, as a caller would make it (tests drive partitions with it). */
void tsa_block_{S}(const {T}* Q, int64_t q_rs, const {T}* K, int64_t k_rs, const {T}* V,
                   int64_t v_rs, const {T}* M, int64_t m_rs, int64_t m_cs, {T}* O, int64_t o_rs,
                   int64_t q0, int64_t nq, int64_t Sk, int64_t D, int64_t Dv, {T} scale,
                   int causal, int64_t causal_offset) {
  ts_attention_block_{S}(Q, q_rs, K, k_rs, V, v_rs, M, m_rs, m_cs, O, o_rs, q0, nq, Sk, D, Dv,
                         scale, causal, causal_offset);
}
"""


def _fill(text: str, dtype_short: str, **extra) -> str:
    if dtype_short not in _ISA:
        raise ValueError(f"attention_source: no attention routine for dtype {dtype_short!r} "
                         f"(have {sorted(_ISA)})")
    subs = dict(_ISA[dtype_short], S=dtype_short, **{k: str(v) for k, v in extra.items()})
    for k, v in subs.items():
        text = text.replace("{" + k + "}", str(v))
    return text


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
HALF_ROUTINE = """\
#include <stdlib.h>
static int ts_attention_block_{S}(
    const uint16_t* Q, int64_t q_rs, const uint16_t* K, int64_t k_rs, const uint16_t* V,
    int64_t v_rs, const uint16_t* M, int64_t m_rs, int64_t m_cs, uint16_t* O, int64_t o_rs,
    int64_t q0, int64_t nq, int64_t Sk, int64_t D, int64_t Dv, float scale, int causal,
    int64_t causal_offset) {
  /* the block's rows renumbered from 0: causal_offset moves by q0 */
  float* q = (float*)malloc(sizeof(float) * (size_t)(nq * D + Sk * D + Sk * Dv + nq * Dv
                                                     + (M ? nq * Sk : 0) + 1));
  if (!q) return 1;                 /* the kernel reports it (Call.fail_code) */
  float *k = q + nq * D, *v = k + Sk * D, *o = v + Sk * Dv, *m = M ? o + nq * Dv : 0;
  for (int64_t r = 0; r < nq; ++r)
    for (int64_t d = 0; d < D; ++d) q[r * D + d] = ts_{S}_to_f32(Q[(q0 + r) * q_rs + d]);
  for (int64_t j = 0; j < Sk; ++j) {
    for (int64_t d = 0; d < D; ++d) k[j * D + d] = ts_{S}_to_f32(K[j * k_rs + d]);
    for (int64_t d = 0; d < Dv; ++d) v[j * Dv + d] = ts_{S}_to_f32(V[j * v_rs + d]);
  }
  if (M)
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t j = 0; j < Sk; ++j) m[r * Sk + j] = ts_{S}_to_f32(M[(q0 + r) * m_rs + j * m_cs]);
  ts_attention_block_f32(q, D, k, D, v, Dv, m, Sk, 1, o, Dv, 0, nq, Sk, D, Dv, scale, causal,
                         causal_offset + q0);
  for (int64_t r = 0; r < nq; ++r)
    for (int64_t d = 0; d < Dv; ++d) O[(q0 + r) * o_rs + d] = ts_f32_to_{S}(o[r * Dv + d]);
  free(q);
  return 0;
}"""
