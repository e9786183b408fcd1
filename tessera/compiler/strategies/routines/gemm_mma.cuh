
/* The main loop for one pair of shared layouts. AMN: A is m-contiguous (As[k][m], read with
   ldmatrix.trans), else k-contiguous (As[m][k]); BKN: B is k-contiguous (Bs[n][k]), else
   n-contiguous (Bs[k][n], ldmatrix.trans). Warp (wm, wn) of WM x WN owns a WTM x WTN tile:
   MI x NI mma tiles of 16 x 8. */
/* The output C: 16-bit like the inputs (the f32 accumulator rounded once), or the f32
   accumulator itself (a tile kernel's acc += tile.mma(a, b)). */
template <typename TC, int DT> struct tsg_mma_out {
  static __device__ __forceinline__ TC cvt(float x) { return tsg_dt<DT>::out(x); }
};
template <int DT> struct tsg_mma_out<float, DT> {
  static __device__ __forceinline__ float cvt(float x) { return x; }
};

template <int DT, int BM, int BN, int BK, int NT, int WM, int WN, int ST, bool AMN, bool BKN,
          typename TC>
__device__ __forceinline__ void tsg_gemm_mma_body(
    tsg_u16* smem, const tsg_u16* A, long long a_rs, long long a_cs, const tsg_u16* B,
    long long b_rs, long long b_cs, TC* C, long long ldc, long long K, long long mt,
    long long nt, bool a_vec, bool b_vec) {
  enum { WTM = BM / WM, WTN = BN / WN, MI = WTM / 16, NI = WTN / 8,
         AW = AMN ? BM : BK, BW = BKN ? BK : BN, ASZ = BM * BK, BSZ = BK * BN };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp / WN, wn = warp % WN, lr = lane & 7, lm = lane >> 3;
  const bool busy = warp < WM * WN;    /* small tiles: the other warps only load */
  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
  const long long nk = (K + BK - 1) / BK;
  /* stage s -> ring slot s % ST: A then B */
#define TSG_ISSUE(s)                                                                          \
  if ((s) < nk) {                                                                             \
    const long long k0 = (long long)(s) * BK;                                                 \
    tsg_u16* as = smem + (int)((s) % ST) * (ASZ + BSZ);                                       \
    if (AMN) tsg_tile_fill<BK, BM, NT>(as, A + k0 * a_cs, a_cs, a_rs, K - k0, mt, a_vec);    \
    else tsg_tile_fill<BM, BK, NT>(as, A + k0 * a_cs, a_rs, a_cs, mt, K - k0, a_vec);        \
    if (BKN) tsg_tile_fill<BN, BK, NT>(as + ASZ, B + k0 * b_rs, b_cs, b_rs, nt, K - k0,      \
                                       b_vec);                                                \
    else tsg_tile_fill<BK, BN, NT>(as + ASZ, B + k0 * b_rs, b_rs, b_cs, K - k0, nt, b_vec);  \
  }                                                                                           \
  tsg_cp_async_commit();
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) { TSG_ISSUE(s) }
  for (long long s = 0; s < nk; ++s) {
    tsg_cp_async_wait<ST - 2>();       /* stage s has landed (for this thread) ... */
    __syncthreads();                   /* ... for every thread, and slot (s-1) % ST is free */
    TSG_ISSUE(s + ST - 1)
    const tsg_u16* as = smem + (int)(s % ST) * (ASZ + BSZ);
    const tsg_u16* bs = as + ASZ;
    if (!busy) continue;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) {   /* matrices: (m0-7,k0-7) (m8-15,k0-7) (m0-7,k8-15) ... */
        const int m = wm * WTM + i * 16;
        if (AMN)
          tsg_ldmatrix4<true>(af[i], as + tsg_at<AW>(kk + lr + 8 * (lm >> 1), m + 8 * (lm & 1)));
        else
          tsg_ldmatrix4<false>(af[i], as + tsg_at<AW>(m + lr + 8 * (lm & 1), kk + 8 * (lm >> 1)));
      }
#pragma unroll
      for (int j = 0; j < NI; j += 2) {  /* (k0-7,n0-7) (k8-15,n0-7) (k0-7,n8-15) (k8-15,n8-15) */
        const int n = wn * WTN + j * 8;
        unsigned r[4];
        if (BKN)
          tsg_ldmatrix4<false>(r, bs + tsg_at<BW>(n + lr + 8 * (lm >> 1), kk + 8 * (lm & 1)));
        else
          tsg_ldmatrix4<true>(r, bs + tsg_at<BW>(kk + lr + 8 * (lm & 1), n + 8 * (lm >> 1)));
        bf[j][0] = r[0]; bf[j][1] = r[1]; bf[j + 1][0] = r[2]; bf[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) tsg_mma16816<DT>(acc[i][j], af[i], bf[j]);
    }
  }
#undef TSG_ISSUE
  tsg_cp_async_wait<0>();              /* only empty groups can be left; drain them anyway */
  const int g = lane >> 2, t = lane & 3;
  if (!busy) return;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int r = wm * WTM + i * 16 + g + 8 * (q >> 1), c = wn * WTN + j * 8 + 2 * t + (q & 1);
        if (r < mt && c < nt) C[r * ldc + c] = tsg_mma_out<TC, DT>::cvt(acc[i][j][q]);
      }
}

template <int DT, int BM, int BN, int BK, int NT, int WM, int WN, int ST, typename TC>
__device__ __forceinline__ void tsg_gemm_mma(const tsg_u16* A, long long a_rs, long long a_cs,
                                             const tsg_u16* B, long long b_rs, long long b_cs,
                                             TC* C, long long ldc, long long K,
                                             long long mt, long long nt) {
  __shared__ tsg_u16 smem[ST * (BM * BK + BK * BN)] __attribute__((aligned(128)));
  /* each operand keeps its global layout in shared memory: the unit stride picks it */
  const bool amn = a_rs == 1 && a_cs != 1, bkn = b_rs == 1 && b_cs != 1;
  const long long a_ld = amn ? a_cs : a_rs, b_ld = bkn ? b_cs : b_rs;
  const bool a_vec = (amn || a_cs == 1) && ((unsigned long long)A & 15) == 0 && a_ld % 8 == 0;
  const bool b_vec = (bkn || b_cs == 1) && ((unsigned long long)B & 15) == 0 && b_ld % 8 == 0;
  __syncthreads();                     /* the previous call's last reads are done */
#define TSG_BODY(am, bk)                                                                      \
  tsg_gemm_mma_body<DT, BM, BN, BK, NT, WM, WN, ST, am, bk, TC>(smem, A, a_rs, a_cs, B, b_rs,  \
                                                                b_cs, C, ldc, K, mt, nt, a_vec,  \
                                                                b_vec)
  if (amn) {
    if (bkn) TSG_BODY(true, true); else TSG_BODY(true, false);
  } else {
    if (bkn) TSG_BODY(false, true); else TSG_BODY(false, false);
  }
#undef TSG_BODY
}

