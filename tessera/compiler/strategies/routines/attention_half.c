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
}
