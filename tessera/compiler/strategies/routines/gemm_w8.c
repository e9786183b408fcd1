/* float32 activations times int8 weights (weight-only quantization): C = A @ float(B), B read
   as int8, a quarter of float32's bytes. Each int8 is exact in float32, so every element is the
   float32 routine's fma chain over k on the widened weights: the bits of op.matmul(x,
   w.astype(float32)). Few rows (decoding) stream B's bytes and widen them in registers; more
   rows widen the task's block of B once into scratch and run the float32 routine on it. */
#if defined(__AVX512F__)
#define ts_vload_w8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p))))
#elif defined(__AVX2__) && defined(__FMA__)
#define ts_vload_w8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p))))
#elif defined(__aarch64__) && defined(__ARM_NEON)
static inline float32x4_t ts_vload_w8(const int8_t* p) {
  int32_t w;                             /* exactly four bytes: never past a row's end */
  memcpy(&w, p, 4);
  int16x8_t h = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(w)));
  return vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
}
#else
#define ts_vload_w8(p) ((float)*(p))
#endif

/* g (1-4) rows of C += their A[:, k:k+4] times B's rows k..k+3 (ts_rows_pass_f32's chains). */
static inline __attribute__((always_inline)) void ts_rows_pass_w8(
    int g, const float* a, int64_t rsa, int64_t csa, const int8_t* b, int64_t rsb, float* c,
    int64_t ldc, int64_t nv, int64_t nt) {
  ts_v_f32 av[4][4];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q)
      if (r < g) av[r][q] = ts_vset1_f32(a[r * rsa + q * csa]);
  for (int64_t j = 0; j < nv; j += TS_VL_f32) {
    ts_v_f32 b0 = ts_vload_w8(b + j), b1 = ts_vload_w8(b + rsb + j);
    ts_v_f32 b2 = ts_vload_w8(b + 2 * rsb + j), b3 = ts_vload_w8(b + 3 * rsb + j);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
      if (r < g) {
        ts_v_f32 v = ts_vfma_f32(av[r][0], b0, ts_vload_f32(c + r * ldc + j));
        v = ts_vfma_f32(av[r][1], b1, v);
        v = ts_vfma_f32(av[r][2], b2, v);
        ts_vstore_f32(c + r * ldc + j, ts_vfma_f32(av[r][3], b3, v));
      }
  }
  for (int r = 0; r < g; ++r)
    for (int64_t j = nv; j < nt; ++j)
      for (int64_t q = 0; q < 4; ++q)
        c[r * ldc + j] = fmaf(a[r * rsa + q * csa], (float)b[q * rsb + j], c[r * ldc + j]);
}

#define TS_W8_CHUNK 256        /* columns of the four widened rows at a time: 4 KB on the stack */
static void ts_gemm_rows_w8(const float* A, int64_t rsa, int64_t csa, const int8_t* B,
                            int64_t rsb, float* C, int64_t ldc, int64_t K, int64_t mt,
                            int64_t nt) {
  int64_t nv = nt / TS_VL_f32 * TS_VL_f32;
  for (int64_t r = 0; r < mt; ++r)
    for (int64_t j = 0; j < nt; ++j) C[r * ldc + j] = 0;
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    const int8_t* b = B + k * rsb;
    const int8_t* ahead = b + (k + 32 < K ? 32 : 0) * rsb;
    for (int64_t j = 0; j < nt; j += 64)
      for (int q = 0; q < 4; ++q) __builtin_prefetch(ahead + q * rsb + j);
    if (mt > 4) {         /* two passes or more: widen the four rows once, a chunk at a time */
      for (int64_t j0 = 0; j0 < nt; j0 += TS_W8_CHUNK) {
        float wb[4 * TS_W8_CHUNK];
        int64_t n = nt - j0 < TS_W8_CHUNK ? nt - j0 : TS_W8_CHUNK;
        for (int q = 0; q < 4; ++q)
          for (int64_t j = 0; j < n; ++j) wb[q * TS_W8_CHUNK + j] = (float)b[q * rsb + j0 + j];
        int64_t nw = n / TS_VL_f32 * TS_VL_f32, r = 0;
        for (; r + 4 <= mt; r += 4)
          ts_rows_pass_f32(4, A + r * rsa + k * csa, rsa, csa, wb, TS_W8_CHUNK,
                           C + r * ldc + j0, ldc, nw, n);
        switch (mt - r) {
          case 3: ts_rows_pass_f32(3, A + r * rsa + k * csa, rsa, csa, wb, TS_W8_CHUNK, C + r * ldc + j0, ldc, nw, n); break;
          case 2: ts_rows_pass_f32(2, A + r * rsa + k * csa, rsa, csa, wb, TS_W8_CHUNK, C + r * ldc + j0, ldc, nw, n); break;
          case 1: ts_rows_pass_f32(1, A + r * rsa + k * csa, rsa, csa, wb, TS_W8_CHUNK, C + r * ldc + j0, ldc, nw, n); break;
        }
      }
      continue;
    }
    int64_t r = 0;
    for (; r + 4 <= mt; r += 4)
      ts_rows_pass_w8(4, A + r * rsa + k * csa, rsa, csa, b, rsb, C + r * ldc, ldc, nv, nt);
    switch (mt - r) {          /* (constant row counts, so the accumulators stay in registers) */
      case 3: ts_rows_pass_w8(3, A + r * rsa + k * csa, rsa, csa, b, rsb, C + r * ldc, ldc, nv, nt); break;
      case 2: ts_rows_pass_w8(2, A + r * rsa + k * csa, rsa, csa, b, rsb, C + r * ldc, ldc, nv, nt); break;
      case 1: ts_rows_pass_w8(1, A + r * rsa + k * csa, rsa, csa, b, rsb, C + r * ldc, ldc, nv, nt); break;
    }
  }
  for (; k < K; ++k)
    for (int64_t r = 0; r < mt; ++r)
      for (int64_t j = 0; j < nt; ++j)
        C[r * ldc + j] = fmaf(A[r * rsa + k * csa], (float)B[k * rsb + j], C[r * ldc + j]);
}

static void ts_gemm_tile_f32i8(const float* A, int64_t rsa, int64_t csa, const int8_t* B,
                               int64_t rsb, int64_t csb, float* C, int64_t ldc, int64_t K,
                               int64_t mt, int64_t nt, int64_t KC) {
  if (K > 0 && mt <= TS_FEW_ROWS && csb == 1 && nt > 2) {
    ts_gemm_rows_w8(A, rsa, csa, B, rsb, C, ldc, K, mt, nt);
    return;
  }
  float* b = (float*)malloc(sizeof(float) * (size_t)(K * nt + 1));
  if (!b) {          /* no scratch: the same fma chains in k order, unpacked. Never abort(). */
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t j = 0; j < nt; ++j) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k)
          acc = fmaf(A[i * rsa + k * csa], (float)B[k * rsb + j * csb], acc);
        C[i * ldc + j] = acc;
      }
    return;
  }
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < nt; ++j) b[k * nt + j] = (float)B[k * rsb + j * csb];
  ts_gemm_tile_f32(A, rsa, csa, b, nt, 1, C, ldc, K, mt, nt, KC);
  free(b);
}
