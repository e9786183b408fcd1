
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

