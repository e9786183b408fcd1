
/* ---- tsa_attention_mma: flash attention on tensor cores (CUDA f16/bf16, sm_80+), see
   tessera/compiler/strategies/routines/gpu_attention.py ----
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

