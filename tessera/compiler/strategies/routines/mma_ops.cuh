
/* ---- tensor-core building blocks: cp.async, ldmatrix, mma.sync m16n8k16 (sm_80+) ----
   With TSG_PORTABLE_MMA the same operations are done by warp shuffles and plain loads and
   stores (for a CPU emulator of the thread model; not for speed). */
#ifndef TSG_PORTABLE_MMA
static __device__ __forceinline__ unsigned tsg_smem(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
/* 16 bytes global -> shared, the bytes past `bytes` zero-filled (none read when 0) */
static __device__ __forceinline__ void tsg_cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(tsg_smem(dst)), "l"(src), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void tsg_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void tsg_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
/* four 8x8 b16 matrices; lane l gives the address of row l%8 of matrix l/8 */
template <bool TRANS> __device__ __forceinline__ void tsg_ldmatrix4(unsigned (&r)[4],
                                                                      const void* p) {
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tsg_smem(p)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tsg_smem(p)));
}
/* d += a (16x16, row) * b (16x8, col), f32 accumulators */
template <int DT> __device__ __forceinline__ void tsg_mma16816(float (&d)[4],
                                                                 const unsigned (&a)[4],
                                                                 const unsigned (&b)[2]) {
  if (DT == 3)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* two f32 -> f16x2 / bf16x2 bits, rounded to nearest even, lo in the low half */
template <int DT> __device__ __forceinline__ unsigned tsg_pack2(float lo, float hi) {
  unsigned d;
  if (DT == 3) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
#else
template <int DT> __device__ __forceinline__ unsigned tsg_pack2(float lo, float hi) {
  return tsg_dt<DT>::out(lo) | (unsigned)tsg_dt<DT>::out(hi) << 16;
}
static __device__ __forceinline__ void tsg_cp_async16(void* dst, const void* src, int bytes) {
  unsigned char* d = (unsigned char*)dst;
  const unsigned char* s = (const unsigned char*)src;
  for (int i = 0; i < 16; ++i) d[i] = i < bytes ? s[i] : 0;
}
static __device__ __forceinline__ void tsg_cp_async_commit() {}
template <int N> __device__ __forceinline__ void tsg_cp_async_wait() {}
static __device__ __forceinline__ const tsg_u16* tsg_lane_ptr(const void* p, int lane) {
  const unsigned long long a = (unsigned long long)p;
  const unsigned lo = TSG_SHFL((unsigned)a, lane), hi = TSG_SHFL((unsigned)(a >> 32), lane);
  return (const tsg_u16*)(((unsigned long long)hi << 32) | lo);
}
template <bool TRANS> __device__ __forceinline__ void tsg_ldmatrix4(unsigned (&r)[4],
                                                                      const void* p) {
  const int l = threadIdx.x & 31;
  for (int m = 0; m < 4; ++m) {
    if (!TRANS) {                      /* row l/4, columns 2(l%4), 2(l%4)+1 */
      const tsg_u16* row = tsg_lane_ptr(p, m * 8 + l / 4);
      r[m] = row[2 * (l % 4)] | (unsigned)row[2 * (l % 4) + 1] << 16;
    } else {                           /* column l/4, rows 2(l%4), 2(l%4)+1 */
      const tsg_u16* r0 = tsg_lane_ptr(p, m * 8 + 2 * (l % 4));
      const tsg_u16* r1 = tsg_lane_ptr(p, m * 8 + 2 * (l % 4) + 1);
      r[m] = r0[l / 4] | (unsigned)r1[l / 4] << 16;
    }
  }
}
template <int DT> __device__ __forceinline__ float tsg_half(unsigned x, int hi) {
  return tsg_dt<DT>::in((tsg_u16)(hi ? x >> 16 : x & 0xffffu));
}
/* lane (g, t) = (l/4, l%4) holds a: rows g, g+8 x columns 2t.., 2t+8..; b: rows 2t.., 2t+8..
   x column g; d: rows g, g+8 x columns 2t, 2t+1 */
template <int DT> __device__ __forceinline__ void tsg_mma16816(float (&d)[4],
                                                                 const unsigned (&a)[4],
                                                                 const unsigned (&b)[2]) {
  const int l = threadIdx.x & 31, g = l / 4, t = l % 4;
  for (int u = 0; u < 4; ++u) {        /* the k pairs that lanes 4g+u (a) and 4n+u (b) hold */
    unsigned av[4], bv[2][2];
    for (int i = 0; i < 4; ++i) av[i] = TSG_SHFL(a[i], 4 * g + u);
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 2; ++i) bv[c][i] = TSG_SHFL(b[i], 4 * (2 * t + c) + u);
    for (int q = 0; q < 4; ++q) {      /* d[q]: row g + 8*(q/2), column 2t + q%2 */
      const int rh = q / 2, c = q % 2;
      for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e)
          d[q] = fmaf(tsg_half<DT>(av[rh + 2 * h], e), tsg_half<DT>(bv[c][h], e), d[q]);
    }
  }
}
#endif
/* 16-byte chunk c of row r of a shared tile whose rows hold CW chunks, XOR-swizzled so that
   8 consecutive rows' chunk c (one ldmatrix) fall in 8 different 16-byte bank groups */
template <int CW> __device__ __forceinline__ int tsg_swz(int r, int c) {
  return CW >= 8 ? c ^ (r & 7) : CW == 4 ? c ^ ((r >> 1) & 3) : CW == 2 ? c ^ ((r >> 2) & 1) : c;
}
template <int W> __device__ __forceinline__ int tsg_at(int r, int c) {  /* element (r, c) */
  return r * W + tsg_swz<W / 8>(r, c / 8) * 8 + c % 8;
}

/* Fill a ROWS x W tile (row r, column c = global + r*rs + c*cs; rows past rl and columns past
   cl zero; columns from cw on untouched). vec: cs == 1 and every row start 16-byte aligned:
   cp.async, else element loads. */
template <int ROWS, int W, int NT>
__device__ __forceinline__ void tsg_tile_fill(tsg_u16* tile, const tsg_u16* g, long long rs,
                                              long long cs, long long rl, long long cl,
                                              bool vec, int cw = W) {
  for (int e = threadIdx.x; e < ROWS * W / 8; e += NT) {
    const int r = e / (W / 8), c = e % (W / 8) * 8;
    if (c >= cw) continue;             /* columns nobody reads: left alone */
    tsg_u16* dst = tile + r * W + tsg_swz<W / 8>(r, c / 8) * 8;
    const long long left = cl - c;
    const int n = r < rl ? (left < 0 ? 0 : left > 8 ? 8 : (int)left) : 0;
    const tsg_u16* src = g + r * rs + c * cs;
    if (vec) {
      tsg_cp_async16(dst, n > 0 ? (const void*)src : (const void*)g, 2 * n);
    } else {
      for (int x = 0; x < 8; ++x) dst[x] = x < n ? src[x * cs] : (tsg_u16)0;
    }
  }
}

