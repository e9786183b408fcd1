/* The float32 routine's packed panels (ts_pack_a_f32's and ts_pack_b_f32's layouts) widened
   straight from 16-bit operands. */
static void ts_pack_a_wide_{S}(int64_t mc, int64_t kc, const uint16_t* A, int64_t rsa,
                               int64_t csa, float* pa) {
  for (int64_t ir = 0; ir < mc; ir += TS_MR, pa += TS_MR * kc) {
    int64_t m = mc - ir < TS_MR ? mc - ir : TS_MR;
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t r = 0; r < TS_MR; ++r)
        pa[k * TS_MR + r] = r < m ? ts_{S}_to_f32(A[(ir + r) * rsa + k * csa]) : 0.0f;
  }
}

static void ts_pack_b_wide_{S}(int64_t kc, int64_t nc, const uint16_t* B, int64_t rsb,
                               int64_t csb, float* pb) {
  for (int64_t jr = 0; jr < nc; jr += TS_NR_f32, pb += TS_NR_f32 * kc) {
    int64_t n = nc - jr < TS_NR_f32 ? nc - jr : TS_NR_f32;
    for (int64_t k = 0; k < kc; ++k) {
      const uint16_t* src = B + k * rsb + jr * csb;
      float* dst = pb + k * TS_NR_f32;
      if (n == TS_NR_f32 && csb == 1)
        for (int64_t j = 0; j < TS_NR_f32; ++j) dst[j] = ts_{S}_to_f32(src[j]);
      else
        for (int64_t j = 0; j < TS_NR_f32; ++j) dst[j] = j < n ? ts_{S}_to_f32(src[j * csb]) : 0.0f;
    }
  }
}

static void ts_gemm_tile_{S}(const uint16_t* A, int64_t rsa, int64_t csa, const uint16_t* B,
                             int64_t rsb, int64_t csb, uint16_t* C, int64_t ldc, int64_t K,
                             int64_t mt, int64_t nt, int64_t KC) {
#if defined(TS_GEMM_AMX_{S})   /* AMX's tile dot product (gemm_bf16_amx.c): its own bits */
  ts_gemm_amx_{S}(A, rsa, csa, B, rsb, csb, C, ldc, K, mt, nt, KC);
  return;
#elif defined(TS_GEMM_DOT_{S})  /* the ISA's dot product of pairs (gemm_bf16_dot.c): its own bits */
  ts_gemm_dot_{S}(A, rsa, csa, B, rsb, csb, C, ldc, K, mt, nt, KC);
  return;
#endif
  if (KC <= 0) KC = 256;
  int64_t mp = (mt + TS_MR - 1) / TS_MR * TS_MR, np = (nt + TS_NR_f32 - 1) / TS_NR_f32 * TS_NR_f32;
  int64_t kk = K < KC ? K : KC;
  float* w = K > 0 && mt > TS_FEW_ROWS && nt > 2 ?
      ts_scratch_f32((size_t)((mp + np) * kk + mt * nt)) : 0;
  if (w) {   /* packed as the float32 routine packs, widening on the way: no widened copies */
    float *pa = w, *pb = pa + mp * kk, *c = pb + np * kk;
    for (int64_t pc = 0; pc < K; pc += KC) {
      int64_t kc = K - pc < KC ? K - pc : KC;
      ts_pack_b_wide_{S}(kc, nt, B + pc * rsb, rsb, csb, pb);
      ts_pack_a_wide_{S}(mt, kc, A + pc * csa, rsa, csa, pa);
      ts_gemm_block_f32(pa, pb, c, nt, kc, mt, nt, pc == 0);
    }
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t j = 0; j < nt; ++j) C[i * ldc + j] = ts_f32_to_{S}(c[i * nt + j]);
    return;
  }
  float* a = (float*)malloc(sizeof(float) * (size_t)(mt * K + K * nt + mt * nt + 1));
  if (!a) {          /* no scratch: the routine's own chains, fma in k order from 0, unpacked */
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t j = 0; j < nt; ++j) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k)
          acc = fmaf(ts_{S}_to_f32(A[i * rsa + k * csa]), ts_{S}_to_f32(B[k * rsb + j * csb]), acc);
        C[i * ldc + j] = ts_f32_to_{S}(acc);
      }
    return;
  }
  float *b = a + mt * K, *c = b + K * nt;
  for (int64_t i = 0; i < mt; ++i)
    for (int64_t k = 0; k < K; ++k) a[i * K + k] = ts_{S}_to_f32(A[i * rsa + k * csa]);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < nt; ++j) b[k * nt + j] = ts_{S}_to_f32(B[k * rsb + j * csb]);
  ts_gemm_tile_f32(a, K, 1, b, nt, 1, c, nt, K, mt, nt, KC);
  for (int64_t i = 0; i < mt; ++i)
    for (int64_t j = 0; j < nt; ++j) C[i * ldc + j] = ts_f32_to_{S}(c[i * nt + j]);
  free(a);
}
