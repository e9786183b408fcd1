
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
          /* (the exp always, then a branchless select: with ?: over the call gcc left 16
             scalar exps a step) */
          ar[l] = ts_sel{F}(mn == mo, ({T})1, ts_exp{F}(mo - mz[l]));
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

