/* ---- tsg_gemm_simt: register-tiled SIMT GEMM, see
   tessera/compiler/strategies/routines/gpu_gemm.py ----
   Thread (ty, tx) of the NY x NX grid owns rows  g*NY*VM + ty*VM + v  (g < TM/VM, v < VM) and
   columns g*NX*VN + tx*VN + w of the tile: VM, VN elements in one 16-byte read. */
template <int DT, int BM, int BN, int BK, int NT, int TM, int TN>
__device__ __forceinline__ void tsg_gemm_simt(
    const typename tsg_dt<DT>::S* __restrict__ A, long long a_rs, long long a_cs,
    const typename tsg_dt<DT>::S* __restrict__ B, long long b_rs, long long b_cs,
    typename tsg_dt<DT>::S* __restrict__ C, long long ldc, long long K, long long mt,
    long long nt) {
  TSG_NOCONTRACT
  typedef typename tsg_dt<DT>::S S;
  typedef typename tsg_dt<DT>::R R;
  enum { V = 16 / (int)sizeof(R), VM = TM < V ? TM : V, VN = TN < V ? TN : V,
         NX = BN / TN, NY = BM / TM, LDA = BM + V, LDB = BN + V,
         LA = (BM * BK + NT - 1) / NT, LB = (BK * BN + NT - 1) / NT };
  /* k-major stages, rows padded by 16 bytes: the transposing stores do not conflict */
  __shared__ R As[2][BK][LDA] __attribute__((aligned(16)));
  __shared__ R Bs[2][BK][LDB] __attribute__((aligned(16)));
  const int tid = threadIdx.x, tx = tid % NX, ty = tid / NX;
  /* this thread's global loads: element e = tid + t*NT of each slice, the operand's contiguous
     index running along consecutive threads (coalesced for either layout) */
  const bool a_kfast = !(a_rs == 1 && a_cs != 1), b_nfast = !(b_cs != 1 && b_rs == 1);
#define TSG_A_AT(t) const int e = tid + (t) * NT, i = a_kfast ? e / BK : e % BM,                                             k = a_kfast ? e % BK : e / BM
#define TSG_B_AT(t) const int e = tid + (t) * NT, j = b_nfast ? e % BN : e / BK,                                             k = b_nfast ? e / BN : e % BK
  R ra[LA], rb[LB], acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = R(0);
  const long long nk = (K + BK - 1) / BK;
  __syncthreads();                     /* the previous call's last reads are done */
  for (long long s = -1; s < nk; ++s) {
    const int cur = (int)(s & 1);
    if (s + 1 < nk) {                  /* fetch slice s+1 into registers (zero past the edges) */
      const long long k0 = (s + 1) * BK, kl = K - k0;
#pragma unroll
      for (int t = 0; t < LA; ++t) {
        TSG_A_AT(t);
        ra[t] = e < BM * BK && i < mt && k < kl ? tsg_dt<DT>::in(A[i * a_rs + (k0 + k) * a_cs])
                                                : R(0);
      }
#pragma unroll
      for (int t = 0; t < LB; ++t) {
        TSG_B_AT(t);
        rb[t] = e < BK * BN && j < nt && k < kl ? tsg_dt<DT>::in(B[(k0 + k) * b_rs + j * b_cs])
                                                : R(0);
      }
    }
    if (s >= 0) {                      /* slice s: kn steps, each TM x TN fmas */
      const long long kl = K - s * BK;
      const int kn = kl < BK ? (int)kl : BK;
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        if (kk < kn) {
          R a[TM], b[TN];
#pragma unroll
          for (int g = 0; g < TM / VM; ++g) {
            const tsg_vec<R, VM> q =
                *reinterpret_cast<const tsg_vec<R, VM>*>(&As[cur][kk][g * NY * VM + ty * VM]);
#pragma unroll
            for (int v = 0; v < VM; ++v) a[g * VM + v] = q.v[v];
          }
#pragma unroll
          for (int g = 0; g < TN / VN; ++g) {
            const tsg_vec<R, VN> q =
                *reinterpret_cast<const tsg_vec<R, VN>*>(&Bs[cur][kk][g * NX * VN + tx * VN]);
#pragma unroll
            for (int w = 0; w < VN; ++w) b[g * VN + w] = q.v[w];
          }
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = tsg_fma(a[i], b[j], acc[i][j]);
        }
      }
    }
    if (s + 1 < nk) {                  /* the other buffer: nobody reads it until the barrier */
#pragma unroll
      for (int t = 0; t < LA; ++t) {
        TSG_A_AT(t);
        if (e < BM * BK) As[cur ^ 1][k][i] = ra[t];
      }
#pragma unroll
      for (int t = 0; t < LB; ++t) {
        TSG_B_AT(t);
        if (e < BK * BN) Bs[cur ^ 1][k][j] = rb[t];
      }
    }
    __syncthreads();
  }
#undef TSG_A_AT
#undef TSG_B_AT
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int r = i / VM * NY * VM + ty * VM + i % VM;
    if (r < mt)
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int c = j / VN * NX * VN + tx * VN + j % VN;
        if (c < nt) C[r * ldc + c] = tsg_dt<DT>::out(acc[i][j]);
      }
  }
}

