/* bf16 operands on the AVX-512 BF16 dot product of pairs (vdpbf16ps; ISA level x86-64-v4+bf16,
   which no machine takes by itself). Each C element is still one float32 chain over k, but in
   vdpbf16ps's order: for each pair of k (2p, 2p + 1) from p = 0, c += a[2p+1] b[2p+1], rounded,
   then c += a[2p] b[2p], rounded (a bf16 product is exact in float32, so each step is an fma);
   denormal operands read as zero and denormal results are flushed (the instruction's DAZ and
   FTZ). So its bits are not the FMA path's (whose chain is k = 0, 1, 2, ...) but they are the
   same for every tile, K block (kept even), batch and thread count; Intel's pseudo-code and Zen
   4 agree on them (tests/targets/test_gemm_bf16.py checks them against NumPy). */
#if defined(__AVX512BF16__)
#include <immintrin.h>
#define TS_GEMM_DOT_bf16 1
#define TS_D_MR 8                   /* micro-tile: 8 rows x 32 columns, 16 zmm accumulators */
#define TS_D_NR 32

/* A micro-panel whose rows have contiguous k: a pair is one 32-bit word of its row, so eight
   pairs of each of the eight rows (TS_D_MR) go through one 8 x 8 transpose of words. Returns
   the pairs packed (a multiple of eight). */
static int64_t ts_dot_pack_a_rows(int64_t whole, const uint16_t* A, int64_t rsa, uint32_t* pa) {
  int64_t p = 0;
  for (; p + 8 <= whole; p += 8) {
    __m256i x[8], t[8], u[8];
    for (int r = 0; r < 8; ++r) x[r] = _mm256_loadu_si256((const __m256i*)(A + r * rsa + 2 * p));
    for (int r = 0; r < 8; r += 2) {
      t[r] = _mm256_unpacklo_epi32(x[r], x[r + 1]);
      t[r + 1] = _mm256_unpackhi_epi32(x[r], x[r + 1]);
    }
    for (int h = 0; h < 8; h += 4) {
      u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
      u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
      u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
      u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    for (int q = 0; q < 4; ++q) {   /* u[q]: rows 0-3 at pairs q and q + 4; u[q + 4]: rows 4-7 */
      _mm256_storeu_si256((__m256i*)(pa + (p + q) * 8),
                          _mm256_permute2x128_si256(u[q], u[q + 4], 0x20));
      _mm256_storeu_si256((__m256i*)(pa + (p + q + 4) * 8),
                          _mm256_permute2x128_si256(u[q], u[q + 4], 0x31));
    }
  }
  return p;
}

/* A micro-panel whose rows are adjacent (a transposed operand): each pair interleaves the eight
   rows' values at k = 2p and 2p + 1. Returns the pairs packed (every whole pair). */
static int64_t ts_dot_pack_a_cols(int64_t whole, const uint16_t* A, int64_t csa, uint32_t* pa) {
  for (int64_t p = 0; p < whole; ++p) {
    __m128i lo = _mm_loadu_si128((const __m128i*)(A + 2 * p * csa));
    __m128i hi = _mm_loadu_si128((const __m128i*)(A + (2 * p + 1) * csa));
    _mm_storeu_si128((__m128i*)(pa + p * 8), _mm_unpacklo_epi16(lo, hi));
    _mm_storeu_si128((__m128i*)(pa + p * 8 + 4), _mm_unpackhi_epi16(lo, hi));
  }
  return whole;
}

/* A's rows in pairs of k: pa[(ir / MR * pairs + p) * MR + r] = (A[ir + r, 2p] | A[ir + r, 2p+1]
   << 16), zero past the rows and kc. */
static void ts_dot_pack_a(int64_t m, int64_t kc, const uint16_t* A, int64_t rsa, int64_t csa,
                          uint32_t* pa) {
  int64_t pairs = (kc + 1) / 2, whole = kc / 2;
  for (int64_t ir = 0; ir < m; ir += TS_D_MR, pa += TS_D_MR * pairs) {
    int64_t p0 = 0;                   /* pairs before p0 are packed by the vector paths */
    if (ir + TS_D_MR <= m && csa == 1)
      p0 = ts_dot_pack_a_rows(whole, A + ir * rsa, rsa, pa);
    else if (ir + TS_D_MR <= m && rsa == 1)
      p0 = ts_dot_pack_a_cols(whole, A + ir, csa, pa);
    for (int64_t r = 0; r < TS_D_MR; ++r) {
      const uint16_t* a = A + (ir + r) * rsa;
      int have = ir + r < m;
      for (int64_t p = p0; p < pairs; ++p) {
        uint32_t lo = have ? a[2 * p * csa] : 0;
        uint32_t hi = have && 2 * p + 1 < kc ? a[(2 * p + 1) * csa] : 0;
        pa[p * TS_D_MR + r] = lo | hi << 16;
      }
    }
  }
}

/* B's columns in panels of NR, pairs of k interleaved: pb[((jr / NR * pairs + p) * NR + j) * 2 +
   h] = B[2p + h, jr + j], zero past the columns and kc. Rows of B with contiguous columns are
   interleaved 32 at a time. */
static void ts_dot_pack_b(int64_t kc, int64_t n, const uint16_t* B, int64_t rsb, int64_t csb,
                          uint16_t* pb) {
  int64_t pairs = (kc + 1) / 2;
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                      8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t jr = 0; jr < n; jr += TS_D_NR, pb += 2 * TS_D_NR * pairs) {
    int64_t w = n - jr < TS_D_NR ? n - jr : TS_D_NR;
    for (int64_t p = 0; p < pairs; ++p) {
      uint16_t* d = pb + p * 2 * TS_D_NR;
      const uint16_t* r0 = B + 2 * p * rsb + jr * csb;
      int two = 2 * p + 1 < kc;
      if (w == TS_D_NR && csb == 1 && two) {
        __m512i x = _mm512_loadu_si512(r0), y = _mm512_loadu_si512(r0 + rsb);
        _mm512_storeu_si512(d, _mm512_permutex2var_epi16(x, lo, y));
        _mm512_storeu_si512(d + TS_D_NR, _mm512_permutex2var_epi16(x, hi, y));
        continue;
      }
      for (int64_t j = 0; j < TS_D_NR; ++j) {
        d[2 * j] = j < w ? r0[j * csb] : 0;
        d[2 * j + 1] = j < w && two ? r0[rsb + j * csb] : 0;
      }
    }
  }
}

/* c (MR x NR float32, row stride ldc) (+)= the panels' product over `pairs` pairs of k. */
static void ts_dot_micro(int64_t pairs, const uint32_t* restrict a, const uint16_t* restrict b,
                         float* restrict c, int64_t ldc, int first) {
  __m512 acc[TS_D_MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < TS_D_MR; ++r) {
    acc[r][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc);
    acc[r][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + 16);
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * 2 * TS_D_NR);
    __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * 2 * TS_D_NR + TS_D_NR);
#pragma GCC unroll 8
    for (int r = 0; r < TS_D_MR; ++r) {
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[p * TS_D_MR + r]);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < TS_D_MR; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
  }
}

/* The same chains one element at a time (no memory for packing): the instruction's order,
   operands' denormals read as zero, each result's flushed. */
static float ts_dot_daz(uint16_t h) {
  return (h & 0x7f80u) ? ts_bf16_to_f32(h) : ts_bf16_to_f32((uint16_t)(h & 0x8000u));
}
static float ts_dot_ftz(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }

static void ts_dot_loops(const uint16_t* A, int64_t rsa, int64_t csa, const uint16_t* B,
                         int64_t rsb, int64_t csb, uint16_t* C, int64_t ldc, int64_t K,
                         int64_t mt, int64_t nt) {
  for (int64_t i = 0; i < mt; ++i)
    for (int64_t j = 0; j < nt; ++j) {
      float c = 0.0f;
      for (int64_t k = 0; k < K; k += 2) {
        float a0 = ts_dot_daz(A[i * rsa + k * csa]), b0 = ts_dot_daz(B[k * rsb + j * csb]);
        if (k + 1 < K)
          c = ts_dot_ftz(fmaf(ts_dot_daz(A[i * rsa + (k + 1) * csa]),
                              ts_dot_daz(B[(k + 1) * rsb + j * csb]), c));
        else
          c = ts_dot_ftz(c + 0.0f);
        c = ts_dot_ftz(fmaf(a0, b0, c));
      }
      C[i * ldc + j] = ts_f32_to_bf16(c);
    }
}

/* C (mt x nt, bf16, rounded once) = A (mt x K) @ B (K x nt) for bf16 operands of any strides:
   packed panels per K block (KC rounded up to even, so no pair straddles two blocks) and
   float32 accumulators in scratch between blocks. */
__attribute__((unused))
static void ts_gemm_dot_bf16(const uint16_t* A, int64_t rsa, int64_t csa, const uint16_t* B,
                             int64_t rsb, int64_t csb, uint16_t* C, int64_t ldc, int64_t K,
                             int64_t mt, int64_t nt, int64_t KC) {
  KC = KC <= 0 ? 512 : (KC + 1) / 2 * 2;
  int64_t mp = (mt + TS_D_MR - 1) / TS_D_MR * TS_D_MR;
  int64_t np = (nt + TS_D_NR - 1) / TS_D_NR * TS_D_NR;
  int64_t pairs = ((K < KC ? K : KC) + 1) / 2;
  void* w = 0;
  if (K > 0 && posix_memalign(&w, 64, sizeof(float) * (size_t)(mp * np) +
                              sizeof(uint32_t) * (size_t)((mp + np) * pairs)))
    w = 0;
  if (!w) {
    ts_dot_loops(A, rsa, csa, B, rsb, csb, C, ldc, K, mt, nt);
    return;
  }
  float* c = (float*)w;
  uint32_t* pa = (uint32_t*)(c + mp * np);
  uint16_t* pb = (uint16_t*)(pa + mp * pairs);
  for (int64_t pc = 0; pc < K; pc += KC) {
    int64_t kc = K - pc < KC ? K - pc : KC, kp = (kc + 1) / 2;
    ts_dot_pack_b(kc, nt, B + pc * rsb, rsb, csb, pb);
    ts_dot_pack_a(mt, kc, A + pc * csa, rsa, csa, pa);
    for (int64_t jr = 0; jr < nt; jr += TS_D_NR)
      for (int64_t ir = 0; ir < mt; ir += TS_D_MR)
        ts_dot_micro(kp, pa + ir * kp, pb + jr * 2 * kp, c + ir * np + jr, np, pc == 0);
  }
  for (int64_t i = 0; i < mt; ++i)
    for (int64_t j = 0; j < nt; ++j) C[i * ldc + j] = ts_f32_to_bf16(c[i * np + j]);
  free(w);
}
#endif
