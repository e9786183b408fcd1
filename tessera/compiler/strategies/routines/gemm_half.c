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
