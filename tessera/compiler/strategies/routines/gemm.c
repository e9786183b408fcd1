#define TS_NR_{S} (TS_NV * TS_VL_{S})
/* MR rows of A, k-major: pa[k * MR + r]; rows past mc are zero. */
static void ts_pack_a_{S}(int64_t mc, int64_t kc, const {T}* A, int64_t rsa, int64_t csa,
                          {T}* pa) {
  for (int64_t ir = 0; ir < mc; ir += TS_MR, pa += TS_MR * kc) {
    int64_t m = mc - ir < TS_MR ? mc - ir : TS_MR;
    if (m == TS_MR) {                  /* whole micro-panels: no test per element */
      for (int64_t k = 0; k < kc; ++k)
#pragma GCC unroll 16
        for (int r = 0; r < TS_MR; ++r) pa[k * TS_MR + r] = A[(ir + r) * rsa + k * csa];
      continue;
    }
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t r = 0; r < TS_MR; ++r)
        pa[k * TS_MR + r] = r < m ? A[(ir + r) * rsa + k * csa] : ({T})0;
  }
}

/* NR columns of B, k-major: pb[k * NR + j]; columns past nc are zero. */
static void ts_pack_b_{S}(int64_t kc, int64_t nc, const {T}* B, int64_t rsb, int64_t csb,
                          {T}* pb) {
  for (int64_t jr = 0; jr < nc; jr += TS_NR_{S}, pb += TS_NR_{S} * kc) {
    int64_t n = nc - jr < TS_NR_{S} ? nc - jr : TS_NR_{S};
    for (int64_t k = 0; k < kc; ++k) {
      const {T}* src = B + k * rsb + jr * csb;
      if (n == TS_NR_{S} && csb == 1) {
        memcpy(pb + k * TS_NR_{S}, src, sizeof({T}) * TS_NR_{S});
      } else {
        for (int64_t j = 0; j < TS_NR_{S}; ++j)
          pb[k * TS_NR_{S} + j] = j < n ? src[j * csb] : ({T})0;
      }
    }
  }
}

/* C[0:m, 0:n] (+)= a-panel @ b-panel over kc: MR x NV vector accumulators in registers. */
static void ts_micro_{S}(int64_t kc, const {T}* restrict a, const {T}* restrict b,
                         {T}* restrict c, int64_t ldc, int64_t m, int64_t n, int first) {
  ts_v_{S} acc[TS_MR][TS_NV];
  {T} edge[TS_MR * TS_NR_{S}];
  int full = m == TS_MR && n == TS_NR_{S};
  {T}* src = c;
  int64_t ld = ldc;
  if (!full) {
    memset(edge, 0, sizeof(edge));
    if (!first)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j) edge[r * TS_NR_{S} + j] = c[r * ldc + j];
    src = edge;
    ld = TS_NR_{S};
  }
#pragma GCC unroll 16
  for (int r = 0; r < TS_MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < TS_NV; ++v)
      acc[r][v] = first ? ts_vzero_{S}() : ts_vload_{S}(src + r * ld + v * TS_VL_{S});
  for (int64_t k = 0; k < kc; ++k) {
    ts_v_{S} bv[TS_NV];
#pragma GCC unroll 4
    for (int v = 0; v < TS_NV; ++v) bv[v] = ts_vload_{S}(b + k * TS_NR_{S} + v * TS_VL_{S});
#pragma GCC unroll 16
    for (int r = 0; r < TS_MR; ++r) {
      ts_v_{S} ar = ts_vset1_{S}(a[k * TS_MR + r]);
#pragma GCC unroll 4
      for (int v = 0; v < TS_NV; ++v) acc[r][v] = ts_vfma_{S}(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < TS_MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < TS_NV; ++v) ts_vstore_{S}(src + r * ld + v * TS_VL_{S}, acc[r][v]);
  if (!full)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) c[r * ldc + j] = edge[r * TS_NR_{S} + j];
}

/* A product with a vector on either side (one row, or one or two columns): packing and a
   micro-tile would be mostly padding, so the same fma chains run unpacked; one row runs the
   columns in the inner loop, where they vectorise when contiguous. */
static void ts_gemm_narrow_{S}(const {T}* A, int64_t rsa, int64_t csa, const {T}* B,
                               int64_t rsb, int64_t csb, {T}* C, int64_t ldc, int64_t K,
                               int64_t mt, int64_t nt) {
  if (mt == 1) {
    for (int64_t j = 0; j < nt; ++j) C[j] = 0;
    for (int64_t k = 0; k < K; ++k) {
      {T} a = A[k * csa];
      const {T}* b = B + k * rsb;
      for (int64_t j = 0; j < nt; ++j) C[j] = fma{F}(a, b[j * csb], C[j]);
    }
    return;
  }
  for (int64_t j = 0; j < nt; ++j)      /* eight rows' chains at once, for the latency */
    for (int64_t i = 0; i < mt; i += 8) {
      int64_t m = mt - i < 8 ? mt - i : 8;
      const {T}* a = A + i * rsa;
      {T} acc[8] = {0};
      for (int64_t k = 0; k < K; ++k) {
        {T} b = B[k * rsb + j * csb];
        if (m == 8)
          for (int r = 0; r < 8; ++r) acc[r] = fma{F}(a[r * rsa + k * csa], b, acc[r]);
        else
          for (int64_t r = 0; r < m; ++r) acc[r] = fma{F}(a[r * rsa + k * csa], b, acc[r]);
      }
      for (int64_t r = 0; r < m; ++r) C[(i + r) * ldc + j] = acc[r];
    }
}

static void ts_gemm_tile_{S}(const {T}* A, int64_t rsa, int64_t csa, const {T}* B, int64_t rsb,
                             int64_t csb, {T}* C, int64_t ldc, int64_t K, int64_t mt,
                             int64_t nt, int64_t KC) {
  if (K <= 0) {
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t j = 0; j < nt; ++j) C[i * ldc + j] = 0;
    return;
  }
  if (mt == 1 || nt <= 2) {
    ts_gemm_narrow_{S}(A, rsa, csa, B, rsb, csb, C, ldc, K, mt, nt);
    return;
  }
  if (KC <= 0) KC = 256;
  int64_t mp = (mt + TS_MR - 1) / TS_MR * TS_MR;
  int64_t np = (nt + TS_NR_{S} - 1) / TS_NR_{S} * TS_NR_{S};
  {T}* pa = ts_scratch_{S}((size_t)(mp + np) * (size_t)(K < KC ? K : KC));
  if (!pa) {                     /* no memory for packing: the same fma chains, unpacked */
    ts_gemm_narrow_{S}(A, rsa, csa, B, rsb, csb, C, ldc, K, mt, nt);
    return;
  }
  {T}* pb = pa + mp * (K < KC ? K : KC);
  for (int64_t pc = 0; pc < K; pc += KC) {
    int64_t kc = K - pc < KC ? K - pc : KC;
    ts_pack_b_{S}(kc, nt, B + pc * rsb, rsb, csb, pb);
    ts_pack_a_{S}(mt, kc, A + pc * csa, rsa, csa, pa);
    for (int64_t jr = 0; jr < nt; jr += TS_NR_{S})
      for (int64_t ir = 0; ir < mt; ir += TS_MR)
        ts_micro_{S}(kc, pa + ir * kc, pb + jr * kc, C + ir * ldc + jr, ldc,
                     mt - ir < TS_MR ? mt - ir : TS_MR,
                     nt - jr < TS_NR_{S} ? nt - jr : TS_NR_{S}, pc == 0);
  }
}
