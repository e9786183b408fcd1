#include <stdlib.h>
#include <string.h>
/* A micro-kernel shape per instruction set: TS_ISA_MR rows of A broadcast against TS_ISA_NV
   vectors of B's columns, their product accumulators in registers (f32: AVX-512 8 x 32 in 16 of
   its 32 registers, AVX2 6 x 16 in 12 of 16, NEON 8 x 12 in 24 of 32), unless the shape measured
   best on this machine is defined first (TS_MICRO_MR, TS_MICRO_NV; the direct convolution's
   TS_MICRO_DMR, TS_MICRO_DNV: compiler/target/gemm_shape.py).
   The shape only decides which chains run side by side: every element is the same fma chain
   over k, so the same bits. ts_vstore_part stores a vector's first n lanes (0 < n < TS_VL);
   ts_vmax is the C target's ts_max lane by lane (a where a > b or a is NaN, else b);
   ts_vfirst(best, at, x, k) takes x as best and k as at in the lanes where x wins over best as
   argmax has it (larger, or NaN where best is not). */
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif
#if defined(__AVX512F__)
#define TS_ISA_MR 8
#define TS_ISA_NV 2
#define TS_VL_f32 16
#define TS_VL_f64 8
typedef __m512 ts_v_f32;
typedef __m512d ts_v_f64;
#define ts_vload_f32(p) _mm512_loadu_ps(p)
#define ts_vstore_f32(p, v) _mm512_storeu_ps(p, v)
#define ts_vset1_f32(x) _mm512_set1_ps(x)
#define ts_vfma_f32(a, b, c) _mm512_fmadd_ps(a, b, c)
#define ts_vzero_f32() _mm512_setzero_ps()
#define ts_vload_f64(p) _mm512_loadu_pd(p)
#define ts_vstore_f64(p, v) _mm512_storeu_pd(p, v)
#define ts_vset1_f64(x) _mm512_set1_pd(x)
#define ts_vfma_f64(a, b, c) _mm512_fmadd_pd(a, b, c)
#define ts_vzero_f64() _mm512_setzero_pd()
#define ts_vstore_part_f32(p, v, n) _mm512_mask_storeu_ps(p, (__mmask16)((1u << (n)) - 1u), v)
#define ts_vstore_part_f64(p, v, n) _mm512_mask_storeu_pd(p, (__mmask8)((1u << (n)) - 1u), v)
#define ts_vadd_f32(a, b) _mm512_add_ps(a, b)
#define ts_vadd_f64(a, b) _mm512_add_pd(a, b)
/* (vmaxps is a > b ? a : b: b on ties and where either is NaN, ts_max but where a is NaN,
   whose lanes keep a; one compare, which only port 5 runs, where there were two) */
#define ts_vmax_f32(a, b) _mm512_mask_max_ps(a, _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q), a, b)
#define ts_vmax_f64(a, b) _mm512_mask_max_pd(a, _mm512_cmp_pd_mask(a, a, _CMP_ORD_Q), a, b)
#define TS_VFIRST_512(S, M, best, at, x, k)                                               \
  do {                                                                                    \
    const M w_ = _mm512_cmp_##S##_mask(x, best, _CMP_GT_OQ) |                             \
                 _mm512_mask_cmp_##S##_mask(_mm512_cmp_##S##_mask(x, x, _CMP_UNORD_Q),    \
                                            best, best, _CMP_ORD_Q);                      \
    best = _mm512_mask_mov_##S(best, w_, x);                                              \
    at = _mm512_mask_mov_##S(at, w_, k);                                                  \
  } while (0)
#define ts_vfirst_f32(best, at, x, k) TS_VFIRST_512(ps, __mmask16, best, at, x, k)
#define ts_vfirst_f64(best, at, x, k) TS_VFIRST_512(pd, __mmask8, best, at, x, k)
#elif defined(__AVX2__) && defined(__FMA__)
#define TS_ISA_MR 6
#define TS_ISA_NV 2
#define TS_VL_f32 8
#define TS_VL_f64 4
typedef __m256 ts_v_f32;
typedef __m256d ts_v_f64;
#define ts_vload_f32(p) _mm256_loadu_ps(p)
#define ts_vstore_f32(p, v) _mm256_storeu_ps(p, v)
#define ts_vset1_f32(x) _mm256_set1_ps(x)
#define ts_vfma_f32(a, b, c) _mm256_fmadd_ps(a, b, c)
#define ts_vzero_f32() _mm256_setzero_ps()
#define ts_vload_f64(p) _mm256_loadu_pd(p)
#define ts_vstore_f64(p, v) _mm256_storeu_pd(p, v)
#define ts_vset1_f64(x) _mm256_set1_pd(x)
#define ts_vfma_f64(a, b, c) _mm256_fmadd_pd(a, b, c)
#define ts_vzero_f64() _mm256_setzero_pd()
#define ts_vstore_part_f32(p, v, n) \
  _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n)), \
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), v)
#define ts_vstore_part_f64(p, v, n) \
  _mm256_maskstore_pd(p, _mm256_cmpgt_epi64(_mm256_set1_epi64x((long long)(n)), \
                                            _mm256_setr_epi64x(0, 1, 2, 3)), v)
#define ts_vadd_f32(a, b) _mm256_add_ps(a, b)
#define ts_vadd_f64(a, b) _mm256_add_pd(a, b)
#define ts_vmax_f32(a, b) \
  _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q))
#define ts_vmax_f64(a, b) \
  _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q))
#define TS_VFIRST_256(S, V, best, at, x, k)                                               \
  do {                                                                                    \
    const V w_ = _mm256_or_##S(                                                           \
        _mm256_cmp_##S(x, best, _CMP_GT_OQ),                                              \
        _mm256_and_##S(_mm256_cmp_##S(x, x, _CMP_UNORD_Q),                                \
                       _mm256_cmp_##S(best, best, _CMP_ORD_Q)));                          \
    best = _mm256_blendv_##S(best, x, w_);                                                \
    at = _mm256_blendv_##S(at, k, w_);                                                    \
  } while (0)
#define ts_vfirst_f32(best, at, x, k) TS_VFIRST_256(ps, __m256, best, at, x, k)
#define ts_vfirst_f64(best, at, x, k) TS_VFIRST_256(pd, __m256d, best, at, x, k)
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define TS_ISA_MR 8
#define TS_ISA_NV 3
#define TS_VL_f32 4
#define TS_VL_f64 2
typedef float32x4_t ts_v_f32;
typedef float64x2_t ts_v_f64;
#define ts_vload_f32(p) vld1q_f32(p)
#define ts_vstore_f32(p, v) vst1q_f32(p, v)
#define ts_vset1_f32(x) vdupq_n_f32(x)
#define ts_vfma_f32(a, b, c) vfmaq_f32(c, a, b)
#define ts_vzero_f32() vdupq_n_f32(0.0f)
#define ts_vload_f64(p) vld1q_f64(p)
#define ts_vstore_f64(p, v) vst1q_f64(p, v)
#define ts_vset1_f64(x) vdupq_n_f64(x)
#define ts_vfma_f64(a, b, c) vfmaq_f64(c, a, b)
#define ts_vzero_f64() vdupq_n_f64(0.0)
#define ts_vstore_part_f32(p, v, n) \
  do {                                                                   \
    float t_[4];                                                         \
    vst1q_f32(t_, v);                                                    \
    for (int j_ = 0; j_ < (int)(n); ++j_) (p)[j_] = t_[j_];              \
  } while (0)
#define ts_vstore_part_f64(p, v, n) do { if ((n) > 0) (p)[0] = vgetq_lane_f64(v, 0); } while (0)
#define ts_vadd_f32(a, b) vaddq_f32(a, b)
#define ts_vadd_f64(a, b) vaddq_f64(a, b)
#define ts_vmax_f32(a, b) vbslq_f32(vorrq_u32(vcgtq_f32(a, b), vmvnq_u32(vceqq_f32(a, a))), a, b)
#define ts_vmax_f64(a, b) \
  vbslq_f64(vorrq_u64(vcgtq_f64(a, b), veorq_u64(vceqq_f64(a, a), vdupq_n_u64(~0ull))), a, b)
#define TS_VFIRST_NEON(B, M, best, at, x, k)                                              \
  do {                                                                                    \
    const M w_ = vorrq_u##B(                                                              \
        vcgtq_f##B(x, best), vbicq_u##B(vceqq_f##B(best, best), vceqq_f##B(x, x)));       \
    best = vbslq_f##B(w_, x, best);                                                       \
    at = vbslq_f##B(w_, k, at);                                                           \
  } while (0)
#define ts_vfirst_f32(best, at, x, k) TS_VFIRST_NEON(32, uint32x4_t, best, at, x, k)
#define ts_vfirst_f64(best, at, x, k) TS_VFIRST_NEON(64, uint64x2_t, best, at, x, k)
#else
#define TS_ISA_MR 6
#define TS_ISA_NV 2
#define TS_VL_f32 1
#define TS_VL_f64 1
typedef float ts_v_f32;
typedef double ts_v_f64;
#define ts_vload_f32(p) (*(p))
#define ts_vstore_f32(p, v) (*(p) = (v))
#define ts_vset1_f32(x) (x)
#define ts_vfma_f32(a, b, c) fmaf(a, b, c)
#define ts_vzero_f32() 0.0f
#define ts_vload_f64(p) (*(p))
#define ts_vstore_f64(p, v) (*(p) = (v))
#define ts_vset1_f64(x) (x)
#define ts_vfma_f64(a, b, c) fma(a, b, c)
#define ts_vzero_f64() 0.0
#define ts_vstore_part_f32(p, v, n) do { if ((n) > 0) *(p) = (v); } while (0)
#define ts_vstore_part_f64(p, v, n) do { if ((n) > 0) *(p) = (v); } while (0)
#define ts_vadd_f32(a, b) ((a) + (b))
#define ts_vadd_f64(a, b) ((a) + (b))
#define ts_vmax_f32(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define ts_vmax_f64(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define ts_vfirst_f32(best, at, x, k)                                                     \
  do {                                                                                    \
    const int w_ = (x) > (best) || ((x) != (x) && (best) == (best));                      \
    best = w_ ? (x) : (best);                                                             \
    at = w_ ? (k) : (at);                                                                 \
  } while (0)
#define ts_vfirst_f64(best, at, x, k) ts_vfirst_f32(best, at, x, k)
#endif
/* The micro-tiles: the GEMM's (TS_MR x TS_NV) and the direct convolution's (TS_DMR x TS_DNV:
   conv.c, broadcasts from the laid-out rows rather than a packed panel), each measured on this
   machine where it was (TS_MICRO_MR/NV, TS_MICRO_DMR/DNV), else the ISA's own. */
#if defined(TS_MICRO_MR) && defined(TS_MICRO_NV)
#define TS_MR TS_MICRO_MR
#define TS_NV TS_MICRO_NV
#else
#define TS_MR TS_ISA_MR
#define TS_NV TS_ISA_NV
#endif
#if defined(TS_MICRO_DMR) && defined(TS_MICRO_DNV)
#define TS_DMR TS_MICRO_DMR
#define TS_DNV TS_MICRO_DNV
#else
#define TS_DMR TS_ISA_MR
#define TS_DNV TS_ISA_NV
#endif
