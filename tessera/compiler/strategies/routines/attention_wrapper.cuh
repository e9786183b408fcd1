/* {doc} */
static __device__ __forceinline__ void {name}(const {T}* Q, long long q_rs, const {T}* K,
    long long k_rs, const {T}* V, long long v_rs, const {T}* M, long long m_rs, long long m_cs,
    {T}* O, long long o_rs, long long q0, long long nq, long long Sk, long long D, long long Dv,
    {R} scale, int causal, long long causal_offset) {
  {call}(Q, q_rs, K, k_rs, V, v_rs, M, m_rs, m_cs, O, o_rs, q0, nq, Sk, D, Dv, scale, causal,
      causal_offset);
}

