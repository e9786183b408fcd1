/* A transposition copy (routines/c_transpose.py): out[r * ldo + c] = in[c * ldi + r] for
   r < rows, c < cols, in blocks of TS_TB x TS_TB that stay in cache, each through registers in
   squares of TS_TK_{S} (8 x 8 float32 or 4 x 4 float64 on AVX2: loads along the input's rows,
   the square transposed by shuffles, stores along the output's); element by element elsewhere.
   A copy: the bits move unchanged. */
#define TS_TB 64
#if defined(__AVX2__)
#define TS_TK_f32 8
#define TS_TK_f64 4
static inline void ts_tsquare_f32(const float* in, int64_t ldi, float* out, int64_t ldo) {
  __m256 r0 = _mm256_loadu_ps(in), r1 = _mm256_loadu_ps(in + ldi);
  __m256 r2 = _mm256_loadu_ps(in + 2 * ldi), r3 = _mm256_loadu_ps(in + 3 * ldi);
  __m256 r4 = _mm256_loadu_ps(in + 4 * ldi), r5 = _mm256_loadu_ps(in + 5 * ldi);
  __m256 r6 = _mm256_loadu_ps(in + 6 * ldi), r7 = _mm256_loadu_ps(in + 7 * ldi);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
  __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
  __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
  __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
  _mm256_storeu_ps(out, _mm256_permute2f128_ps(s0, s4, 0x20));
  _mm256_storeu_ps(out + ldo, _mm256_permute2f128_ps(s1, s5, 0x20));
  _mm256_storeu_ps(out + 2 * ldo, _mm256_permute2f128_ps(s2, s6, 0x20));
  _mm256_storeu_ps(out + 3 * ldo, _mm256_permute2f128_ps(s3, s7, 0x20));
  _mm256_storeu_ps(out + 4 * ldo, _mm256_permute2f128_ps(s0, s4, 0x31));
  _mm256_storeu_ps(out + 5 * ldo, _mm256_permute2f128_ps(s1, s5, 0x31));
  _mm256_storeu_ps(out + 6 * ldo, _mm256_permute2f128_ps(s2, s6, 0x31));
  _mm256_storeu_ps(out + 7 * ldo, _mm256_permute2f128_ps(s3, s7, 0x31));
}
static inline void ts_tsquare_f64(const double* in, int64_t ldi, double* out, int64_t ldo) {
  __m256d r0 = _mm256_loadu_pd(in), r1 = _mm256_loadu_pd(in + ldi);
  __m256d r2 = _mm256_loadu_pd(in + 2 * ldi), r3 = _mm256_loadu_pd(in + 3 * ldi);
  __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);
  __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
  _mm256_storeu_pd(out, _mm256_permute2f128_pd(t0, t2, 0x20));
  _mm256_storeu_pd(out + ldo, _mm256_permute2f128_pd(t1, t3, 0x20));
  _mm256_storeu_pd(out + 2 * ldo, _mm256_permute2f128_pd(t0, t2, 0x31));
  _mm256_storeu_pd(out + 3 * ldo, _mm256_permute2f128_pd(t1, t3, 0x31));
}
#else
#define TS_TK_f32 1
#define TS_TK_f64 1
static inline void ts_tsquare_f32(const float* in, int64_t ldi, float* out, int64_t ldo) {
  (void)ldi; (void)ldo; *out = *in;
}
static inline void ts_tsquare_f64(const double* in, int64_t ldi, double* out, int64_t ldo) {
  (void)ldi; (void)ldo; *out = *in;
}
#endif

static void ts_transpose_{S}(const {T}* in, int64_t ldi, {T}* out, int64_t ldo, int64_t rows,
                             int64_t cols) {
  const int64_t sq = TS_TK_{S};
  for (int64_t r0 = 0; r0 < rows; r0 += TS_TB)
    for (int64_t c0 = 0; c0 < cols; c0 += TS_TB) {
      const int64_t rn = rows - r0 < TS_TB ? rows - r0 : TS_TB;
      const int64_t cn = cols - c0 < TS_TB ? cols - c0 : TS_TB;
      const int64_t rs = rn / sq * sq, cs = cn / sq * sq;
      for (int64_t r = 0; r < rs; r += sq)
        for (int64_t c = 0; c < cs; c += sq)
          ts_tsquare_{S}(in + (c0 + c) * ldi + r0 + r, ldi, out + (r0 + r) * ldo + c0 + c, ldo);
      for (int64_t r = 0; r < rn; ++r)                /* the block's edges */
        for (int64_t c = r < rs ? cs : 0; c < cn; ++c)
          out[(r0 + r) * ldo + c0 + c] = in[(c0 + c) * ldi + r0 + r];
    }
}
