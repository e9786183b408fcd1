#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
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
#elif defined(__AVX2__) && defined(__FMA__)
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
#else
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
#endif
#define TS_MR 6
