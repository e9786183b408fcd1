"""The CPU's attention routine: flash-attention style, one block of queries of one head.

`ts_attention_block_<T>(Q, q_rs, K, k_rs, V, v_rs, M, m_rs, m_cs, O, o_rs, q0, nq, Sk, D, Dv,
scale, causal, causal_offset)` writes rows q0 .. q0+nq of O = softmax(scale * Q K^T + M) V.
Keys are streamed in blocks of BK with an online softmax (running max and sum, the partial
output rescaled), so no Sq x Sk buffer exists. M (additive; NULL for none) is read with any
strides; `causal` drops key j for query i when j > i + causal_offset. A query that sees no key
gets 0.

Determinism: a query row's arithmetic depends only on its own inputs and on BK (fixed): not on
q0, nq, the other rows, or the thread. A key block the whole query block cannot see is skipped,
which for each row is exactly the no-op it would have been.
"""
from __future__ import annotations

from ...ops import cmath
from .c_gemm import ISA, SCRATCH, instantiate

DEFAULT_BLOCKS = {"block_q": 256}    # queries per task (each task transposes the keys once)
MIN_TASKS = 8                        # smaller problems get smaller query blocks
_RQ = 4                        # query rows that share each loaded key/value vector

_ROUTINE = """\
#define TS_AKV_{S} 4                          /* vectors per key block */
#define TS_BK_{S} (TS_AKV_{S} * TS_VL_{S})    /* keys per block */
static void ts_attention_block_{S}(const {T}* Q, int64_t q_rs, const {T}* K, int64_t k_rs,
                                   const {T}* V, int64_t v_rs, const {T}* M, int64_t m_rs,
                                   int64_t m_cs, {T}* O, int64_t o_rs, int64_t q0, int64_t nq,
                                   int64_t Sk, int64_t D, int64_t Dv, {T} scale, int causal,
                                   int64_t causal_offset) {
  const int64_t BK = TS_BK_{S};
  int64_t nqp = (nq + {RQ} - 1) / {RQ} * {RQ};
  /* scratch: K block transposed [D][BK], scores [nqp][BK], output [nqp][Dv], max and sum */
  {T}* kt = ts_scratch_{S}((size_t)(D * BK + nqp * BK + nqp * Dv + 2 * nqp + nqp * D));
  if (!kt) {                     /* no memory: report nothing, write NaN so it cannot pass */
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t c = 0; c < Dv; ++c) O[(q0 + r) * o_rs + c] = ({T})NAN;
    return;
  }
  {T}* s = kt + D * BK;
  {T}* o = s + nqp * BK;
  {T}* mx = o + nqp * Dv;
  {T}* sum = mx + nqp;
  {T}* q = sum + nqp;            /* the block's queries, zero rows past nq */
  for (int64_t r = 0; r < nqp * BK; ++r) s[r] = 0;     /* padding rows contribute 0 */
  for (int64_t r = 0; r < nqp; ++r) {
    mx[r] = -INFINITY;
    sum[r] = 0;
    for (int64_t c = 0; c < Dv; ++c) o[r * Dv + c] = 0;
    for (int64_t d = 0; d < D; ++d) q[r * D + d] = r < nq ? Q[(q0 + r) * q_rs + d] : ({T})0;
  }
  int64_t kend = Sk;
  if (causal) {                  /* keys past the last row's horizon are masked for every row */
    int64_t last = q0 + nq - 1 + causal_offset + 1;
    kend = last < Sk ? (last > 0 ? last : 0) : Sk;
  }
  for (int64_t kb = 0; kb < kend; kb += BK) {
    int64_t bk = Sk - kb < BK ? Sk - kb : BK;
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < BK; ++j) kt[d * BK + j] = j < bk ? K[(kb + j) * k_rs + d] : ({T})0;
    /* scores: each is fma(q_d, k_d, s) over d in order, RQ rows x BK keys in registers */
    for (int64_t r = 0; r < nqp; r += {RQ}) {
      ts_v_{S} acc[{RQ}][TS_AKV_{S}];
      for (int i = 0; i < {RQ}; ++i)
        for (int c = 0; c < TS_AKV_{S}; ++c) acc[i][c] = ts_vzero_{S}();
      for (int64_t d = 0; d < D; ++d) {
        ts_v_{S} kv[TS_AKV_{S}];
        for (int c = 0; c < TS_AKV_{S}; ++c) kv[c] = ts_vload_{S}(kt + d * BK + c * TS_VL_{S});
        for (int i = 0; i < {RQ}; ++i) {
          ts_v_{S} qi = ts_vset1_{S}(q[(r + i) * D + d]);
          for (int c = 0; c < TS_AKV_{S}; ++c) acc[i][c] = ts_vfma_{S}(qi, kv[c], acc[i][c]);
        }
      }
      for (int i = 0; i < {RQ}; ++i)
        for (int c = 0; c < TS_AKV_{S}; ++c) ts_vstore_{S}(s + (r + i) * BK + c * TS_VL_{S}, acc[i][c]);
    }
    for (int64_t r = 0; r < nq; ++r) {
      {T}* sr = s + r * BK;
      int64_t row = q0 + r;
      {T} bmax = -INFINITY;
      /* keys past the row's horizon (or past Sk) are dropped: j >= limit */
      int64_t limit = bk;
      if (causal && row + causal_offset + 1 - kb < limit) limit = row + causal_offset + 1 - kb;
      if (M) {
        const {T}* mrow = M + row * m_rs + kb * m_cs;
        for (int64_t j = 0; j < bk; ++j) sr[j] = sr[j] * scale + mrow[j * m_cs];
      } else {
        #pragma omp simd
        for (int64_t j = 0; j < BK; ++j) sr[j] = sr[j] * scale;
      }
      #pragma omp simd
      for (int64_t j = 0; j < BK; ++j) sr[j] = j < limit ? sr[j] : -INFINITY;
      #pragma omp simd reduction(max:bmax)
      for (int64_t j = 0; j < BK; ++j) bmax = sr[j] > bmax ? sr[j] : bmax;
      {T} m_new = bmax > mx[r] ? bmax : mx[r];
      if (m_new == -INFINITY) {               /* nothing visible yet: the row is unchanged */
        for (int64_t j = 0; j < BK; ++j) sr[j] = 0;
        continue;
      }
      {T} alpha = ts_exp{F}(mx[r] - m_new);
      mx[r] = m_new;
      {T} total = 0;
      #pragma omp simd
      for (int64_t j = 0; j < BK; ++j) sr[j] = ts_exp{F}(sr[j] - m_new);
      for (int64_t j = 0; j < BK; ++j) total += sr[j];       /* in order: no reassociation */
      sum[r] = sum[r] * alpha + total;
      {T}* orow = o + r * Dv;
      #pragma omp simd
      for (int64_t c = 0; c < Dv; ++c) orow[c] *= alpha;
    }
    /* o += p @ v: each output element is fma(p_j, v_j, o) over j in order; RQ rows x AKV
       vectors of o stay in registers while the block's keys stream past */
    int64_t dvv = Dv / TS_VL_{S} * TS_VL_{S};
    for (int64_t r = 0; r < nqp; r += {RQ}) {
      for (int64_t c0 = 0; c0 < dvv; c0 += TS_AKV_{S} * TS_VL_{S}) {
        int nv = (int)((dvv - c0) / TS_VL_{S} < TS_AKV_{S} ? (dvv - c0) / TS_VL_{S} : TS_AKV_{S});
        ts_v_{S} acc[{RQ}][TS_AKV_{S}];
        for (int i = 0; i < {RQ}; ++i)
          for (int c = 0; c < nv; ++c) acc[i][c] = ts_vload_{S}(o + (r + i) * Dv + c0 + c * TS_VL_{S});
        for (int64_t j = 0; j < bk; ++j) {
          const {T}* vrow = V + (kb + j) * v_rs + c0;
          ts_v_{S} vv[TS_AKV_{S}];
          for (int c = 0; c < nv; ++c) vv[c] = ts_vload_{S}(vrow + c * TS_VL_{S});
          for (int i = 0; i < {RQ}; ++i) {
            ts_v_{S} p = ts_vset1_{S}(s[(r + i) * BK + j]);
            for (int c = 0; c < nv; ++c) acc[i][c] = ts_vfma_{S}(p, vv[c], acc[i][c]);
          }
        }
        for (int i = 0; i < {RQ}; ++i)
          for (int c = 0; c < nv; ++c) ts_vstore_{S}(o + (r + i) * Dv + c0 + c * TS_VL_{S}, acc[i][c]);
      }
      for (int64_t i = r; i < r + {RQ}; ++i)      /* the columns past the last full vector */
        for (int64_t j = 0; j < bk; ++j) {
          const {T}* vrow = V + (kb + j) * v_rs;
          for (int64_t c = dvv; c < Dv; ++c)
            o[i * Dv + c] = fma{F}(s[i * BK + j], vrow[c], o[i * Dv + c]);
        }
    }
  }
  for (int64_t r = 0; r < nq; ++r)
    for (int64_t c = 0; c < Dv; ++c)
      O[(q0 + r) * o_rs + c] = sum[r] > 0 ? o[r * Dv + c] / sum[r] : ({T})0;
}"""


def attention_source(dtype_short: str) -> list[str]:
    """The chunks for one dtype: the ISA macros, exp, and the routine."""
    exp = cmath.F32["exp"] if dtype_short == "f32" else cmath.F64["exp"]
    return [ISA, instantiate(SCRATCH, dtype_short), *exp,
            instantiate(_ROUTINE.replace("{RQ}", str(_RQ)), dtype_short)]
