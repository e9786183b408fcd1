#define TS_NR_{S} (TS_NV * TS_VL_{S})
/* MR rows of A, k-major: pa[k * MR + r]; rows past mc are zero. Rows contiguous along k (A
   itself, not a transposed view: ts_gemm_block_rows packs only a last partial panel of those)
   go through the transposition's 8 x 8 register squares (transpose.c):
   element by element, each k gathered MR rows apart, was a quarter of a 256 x 512 x 512
   product's time. */
static void ts_pack_a_{S}(int64_t mc, int64_t kc, const {T}* A, int64_t rsa, int64_t csa,
                          {T}* pa) {
  for (int64_t ir = 0; ir < mc; ir += TS_MR, pa += TS_MR * kc) {
    int64_t m = mc - ir < TS_MR ? mc - ir : TS_MR;
    if (csa == 1) {
      ts_transpose_{S}(A + ir * rsa, rsa, pa, TS_MR, kc, m);
      for (int64_t k = 0; k < kc && m < TS_MR; ++k)
        for (int64_t r = m; r < TS_MR; ++r) pa[k * TS_MR + r] = 0;
      continue;
    }
    if (rsa == 1 && m == TS_MR) {      /* a transposed A (x.T @ d): each k's MR rows side by
                                          side in memory */
      for (int64_t k = 0; k < kc; ++k)
        memcpy(pa + k * TS_MR, A + ir + k * csa, sizeof({T}) * TS_MR);
      continue;
    }
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

/* NR columns of B, k-major: pb[k * NR + j]; columns past nc are zero. Columns contiguous along
   k (a transposed view, x @ w.T) go through the transposition as A's rows do. */
static void ts_pack_b_{S}(int64_t kc, int64_t nc, const {T}* B, int64_t rsb, int64_t csb,
                          {T}* pb) {
  for (int64_t jr = 0; jr < nc; jr += TS_NR_{S}, pb += TS_NR_{S} * kc) {
    int64_t n = nc - jr < TS_NR_{S} ? nc - jr : TS_NR_{S};
    if (rsb == 1 && csb != 1) {
      ts_transpose_{S}(B + jr * csb, csb, pb, TS_NR_{S}, kc, n);
      for (int64_t k = 0; k < kc && n < TS_NR_{S}; ++k)
        for (int64_t j = n; j < TS_NR_{S}; ++j) pb[k * TS_NR_{S} + j] = 0;
      continue;
    }
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

/* C[0:m, 0:n] (+)= a-panel @ b-panel over kc: MR x NV vector accumulators in registers. A's
   element (r, k) at a[r * ars + k * aks]: a packed panel (1, MR) or MR rows in place (lda, 1). */
static inline __attribute__((always_inline)) void ts_micro_at_{S}(
    int64_t kc, const {T}* restrict a, int64_t ars, int64_t aks, const {T}* restrict b,
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
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {         /* (unrolled: 3-5% on AVX-512 and AVX2) */
    ts_v_{S} bv[TS_NV];
#pragma GCC unroll 4
    for (int v = 0; v < TS_NV; ++v) bv[v] = ts_vload_{S}(b + k * TS_NR_{S} + v * TS_VL_{S});
#pragma GCC unroll 16
    for (int r = 0; r < TS_MR; ++r) {
      ts_v_{S} ar = ts_vset1_{S}(a[k * aks + r * ars]);
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

static void ts_micro_{S}(int64_t kc, const {T}* restrict a, const {T}* restrict b,
                         {T}* restrict c, int64_t ldc, int64_t m, int64_t n, int first) {
  ts_micro_at_{S}(kc, a, 1, TS_MR, b, c, ldc, m, n, first);
}
static void ts_micro_rows_{S}(int64_t kc, const {T}* restrict a, int64_t ars,
                              const {T}* restrict b, {T}* restrict c, int64_t ldc, int64_t n,
                              int first) {
  ts_micro_at_{S}(kc, a, ars, 1, b, c, ldc, TS_MR, n, first);
}
/* One K block over packed panels: C[0:mt, 0:nt] (+)= pa @ pb. A row panel of A at a time
   against every column panel of B: A's panel stays in L1, B's panels stream from L2, and the
   micro-tiles walk along rows of C, which the prefetchers follow (C a column of micro-tiles
   at a time, rows ldc apart: 10% slower at 2048). */
static void ts_gemm_block_{S}(const {T}* pa, const {T}* pb, {T}* C, int64_t ldc, int64_t kc,
                              int64_t mt, int64_t nt, int first) {
  for (int64_t ir = 0; ir < mt; ir += TS_MR)
    for (int64_t jr = 0; jr < nt; jr += TS_NR_{S})
      ts_micro_{S}(kc, pa + ir * kc, pb + jr * kc, C + ir * ldc + jr, ldc,
                   mt - ir < TS_MR ? mt - ir : TS_MR, nt - jr < TS_NR_{S} ? nt - jr : TS_NR_{S},
                   first);
}

/* The same K block with A's rows along k (A[r][k] at A + r * rsa + k: A itself, not a
   transposed view): whole panels read in place (each k's MR broadcasts from MR rows), only a
   last partial one packed into pa; packing them was 7-15% of a product's time (two threads on
   a Xeon, 256 x 784 x 512 to 2048^3). The same chains as packed panels. */
static void ts_gemm_block_rows_{S}(const {T}* A, int64_t rsa, const {T}* pb, {T}* C,
                                   int64_t ldc, int64_t kc, int64_t mt, int64_t nt, int first,
                                   {T}* pa) {
  int64_t mf = mt / TS_MR * TS_MR;
  for (int64_t ir = 0; ir < mf; ir += TS_MR)
    for (int64_t jr = 0; jr < nt; jr += TS_NR_{S})
      ts_micro_rows_{S}(kc, A + ir * rsa, rsa, pb + jr * kc, C + ir * ldc + jr, ldc,
                        nt - jr < TS_NR_{S} ? nt - jr : TS_NR_{S}, first);
  if (mf < mt) {
    ts_pack_a_{S}(mt - mf, kc, A + mf * rsa, rsa, 1, pa);
    ts_gemm_block_{S}(pa, pb, C + mf * ldc, ldc, kc, mt - mf, nt, first);
  }
}

/* Few rows against B with contiguous rows (decoding's matrix-vector products, a small batch):
   B streams from memory, unpacked, four of its rows at a time (prefetched ahead), into the
   rows of C held in cache; each element is still the fma chain over k in order. */
#define TS_FEW_ROWS 8
/* g (1-4, a constant at each call) rows of C += their A[:, k:k+4] times B's rows k..k+3: the
   four B vectors loaded once for all g rows. */
static inline __attribute__((always_inline)) void ts_rows_pass_{S}(
    int g, const {T}* a, int64_t rsa, int64_t csa, const {T}* b, int64_t rsb, {T}* c,
    int64_t ldc, int64_t nv, int64_t nt) {
  ts_v_{S} av[4][4];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q)
      if (r < g) av[r][q] = ts_vset1_{S}(a[r * rsa + q * csa]);
  for (int64_t j = 0; j < nv; j += TS_VL_{S}) {
    ts_v_{S} b0 = ts_vload_{S}(b + j), b1 = ts_vload_{S}(b + rsb + j);
    ts_v_{S} b2 = ts_vload_{S}(b + 2 * rsb + j), b3 = ts_vload_{S}(b + 3 * rsb + j);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
      if (r < g) {
        ts_v_{S} v = ts_vfma_{S}(av[r][0], b0, ts_vload_{S}(c + r * ldc + j));
        v = ts_vfma_{S}(av[r][1], b1, v);
        v = ts_vfma_{S}(av[r][2], b2, v);
        ts_vstore_{S}(c + r * ldc + j, ts_vfma_{S}(av[r][3], b3, v));
      }
  }
  for (int r = 0; r < g; ++r)
    for (int64_t j = nv; j < nt; ++j)
      for (int64_t q = 0; q < 4; ++q)
        c[r * ldc + j] = fma{F}(a[r * rsa + q * csa], b[q * rsb + j], c[r * ldc + j]);
}
static void ts_gemm_rows_{S}(const {T}* A, int64_t rsa, int64_t csa, const {T}* B, int64_t rsb,
                             {T}* C, int64_t ldc, int64_t K, int64_t mt, int64_t nt) {
  int64_t nv = nt / TS_VL_{S} * TS_VL_{S};
  for (int64_t r = 0; r < mt; ++r) {
    for (int64_t j = 0; j < nv; j += TS_VL_{S}) ts_vstore_{S}(C + r * ldc + j, ts_vzero_{S}());
    for (int64_t j = nv; j < nt; ++j) C[r * ldc + j] = 0;
  }
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    const {T}* b = B + k * rsb;
    const {T}* ahead = b + (k + 16 < K ? 16 : 0) * rsb;
    for (int64_t j = 0; j < nv; j += TS_VL_{S})
      for (int q = 0; q < 4; ++q) __builtin_prefetch(ahead + q * rsb + j);
    int64_t r = 0;
    for (; r + 4 <= mt; r += 4)
      ts_rows_pass_{S}(4, A + r * rsa + k * csa, rsa, csa, b, rsb, C + r * ldc, ldc, nv, nt);
    switch (mt - r) {          /* (constant row counts, so the accumulators stay in registers) */
      case 3: ts_rows_pass_{S}(3, A + r * rsa + k * csa, rsa, csa, b, rsb, C + r * ldc, ldc, nv, nt); break;
      case 2: ts_rows_pass_{S}(2, A + r * rsa + k * csa, rsa, csa, b, rsb, C + r * ldc, ldc, nv, nt); break;
      case 1: ts_rows_pass_{S}(1, A + r * rsa + k * csa, rsa, csa, b, rsb, C + r * ldc, ldc, nv, nt); break;
    }
  }
  for (; k < K; ++k)
    for (int64_t r = 0; r < mt; ++r) {
      const {T}* b = B + k * rsb;
      {T}* c = C + r * ldc;
      {T} x = A[r * rsa + k * csa];
      ts_v_{S} a = ts_vset1_{S}(x);
      for (int64_t j = 0; j < nv; j += TS_VL_{S})
        ts_vstore_{S}(c + j, ts_vfma_{S}(a, ts_vload_{S}(b + j), ts_vload_{S}(c + j)));
      for (int64_t j = nv; j < nt; ++j) c[j] = fma{F}(x, b[j], c[j]);
    }
}

/* A product with a vector on either side (one row, or one or two columns): packing and a
   micro-tile would be mostly padding, so the same fma chains run unpacked; one row runs the
   columns in the inner loop, where they vectorise when contiguous. */
static void ts_gemm_narrow_{S}(const {T}* A, int64_t rsa, int64_t csa, const {T}* B,
                               int64_t rsb, int64_t csb, {T}* C, int64_t ldc, int64_t K,
                               int64_t mt, int64_t nt) {
  if (mt == 1 && rsb == 1) {   /* B's columns contiguous (x @ w.T, a query against its keys):
                                  eight columns' chains at once, each reading its column in order */
    int64_t j = 0;
    for (; j + 8 <= nt; j += 8) {
      const {T}* b = B + j * csb;
      {T} acc[8] = {0};
      for (int64_t k = 0; k < K; ++k) {
        {T} a = A[k * csa];
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) acc[r] = fma{F}(a, b[r * csb + k], acc[r]);
      }
      for (int r = 0; r < 8; ++r) C[j + r] = acc[r];
    }
    for (; j < nt; ++j) {
      {T} acc = 0;
      for (int64_t k = 0; k < K; ++k) acc = fma{F}(A[k * csa], B[j * csb + k], acc);
      C[j] = acc;
    }
    return;
  }
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
  if (mt <= TS_FEW_ROWS && csb == 1 && nt > 2) {
    ts_gemm_rows_{S}(A, rsa, csa, B, rsb, C, ldc, K, mt, nt);
    return;
  }
  if (mt == 1 || nt <= 2) {
    ts_gemm_narrow_{S}(A, rsa, csa, B, rsb, csb, C, ldc, K, mt, nt);
    return;
  }
  if (KC <= 0) KC = 256;
  int64_t blocks = (K + KC - 1) / KC;
  KC = (K + blocks - 1) / blocks;     /* as many K blocks, evened out (784: 3 x 262, not 3 x 256
                                         and a block of 16 that reloads all of C for little) */
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
    if (csa == 1)
      ts_gemm_block_rows_{S}(A + pc, rsa, pb, C, ldc, kc, mt, nt, pc == 0, pa);
    else {
      ts_pack_a_{S}(mt, kc, A + pc * csa, rsa, csa, pa);
      ts_gemm_block_{S}(pa, pb, C, ldc, kc, mt, nt, pc == 0);
    }
  }
}
