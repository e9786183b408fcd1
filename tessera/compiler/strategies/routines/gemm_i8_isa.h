#include <stdint.h>
#include <stdlib.h>
#include <string.h>
/* The int8 GEMM's instruction sets. Operands are packed in groups of TS_Q_KG consecutive k per
   32-bit lane (a row of A's group broadcast, NR columns of B's groups side by side), and one
   step adds a lane's TS_Q_KG products into its int32 accumulator:
     AVX-512 VNNI, AVX-VNNI: vpdpbusd, unsigned bytes (A) times signed bytes (B), in fours;
     NEON's dot product: sdot, signed bytes times signed bytes, in fours, four rows of A a vector;
     AVX-512BW, AVX2: vpmaddwd on operands widened to int16, in pairs;
     otherwise plain C, one k at a time.
   An operand whose signedness is not the instruction's is packed with its top bit flipped
   (x + 128 or x - 128) and the difference taken off afterwards with the operands' row and
   column sums (B's summed packed, ts_qv_sum: the dot product with ones). Loads from C are
   ts_qv_loadc: int32 accumulators, not packed bytes.
   Every product and sum is exact in int32 (wrapping past it), so the order never matters: each
   path gives the same bits as the others and as NumPy's int32 matmul. */
#if defined(__AVX512BW__) || defined(__AVX2__)
/* x86: the vector width (AVX-512BW: 8 x 32 lanes of 16, AVX2: 6 x 16 lanes of 8), then the
   step (VNNI's vpdpbusd on bytes in fours, else vpmaddwd on int16 in pairs) */
#include <immintrin.h>
#if defined(__AVX512BW__)
#define TS_Q_MR 8
#define TS_Q_VL 16
typedef __m512i ts_qv;
#define ts_qv_zero() _mm512_setzero_si512()
#define ts_qv_load(p) _mm512_loadu_si512((const void*)(p))
#define ts_qv_store(p, v) _mm512_storeu_si512((void*)(p), v)
#define ts_qv_bcast(p) _mm512_set1_epi32(ts_q_lane(p))
#define ts_qv_ones() _mm512_set1_epi8(1)
#define ts_qv_madd(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
#else
#define TS_Q_MR 6
#define TS_Q_VL 8
typedef __m256i ts_qv;
#define ts_qv_zero() _mm256_setzero_si256()
#define ts_qv_load(p) _mm256_loadu_si256((const __m256i*)(p))
#define ts_qv_store(p, v) _mm256_storeu_si256((__m256i*)(p), v)
#define ts_qv_bcast(p) _mm256_set1_epi32(ts_q_lane(p))
#define ts_qv_ones() _mm256_set1_epi8(1)
#define ts_qv_madd(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif
#define TS_Q_NV 2
#define ts_qv_loadc(p) ts_qv_load(p)
#if (defined(__AVX512BW__) && defined(__AVX512VNNI__)) || \
    (!defined(__AVX512BW__) && defined(__AVXVNNI__))
#define TS_Q_KG 4
#define TS_Q_A_UNSIGNED 1
#define TS_Q_B_UNSIGNED 0
typedef uint8_t ts_q_t;
#if defined(__AVX512BW__)
/* (in asm: gcc copies the accumulator around the intrinsic, one move before and after each) */
#define ts_qv_dot(acc, a, b) ({ ts_qv ts_acc_ = (acc); \
  __asm__("vpdpbusd %2, %1, %0" : "+v"(ts_acc_) : "v"(a), "v"(b)); ts_acc_; })
#else
#define ts_qv_dot(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
#endif
#define ts_qv_sum(acc, b) ts_qv_dot(acc, ts_qv_ones(), b)
#else
#define TS_Q_KG 2
#define TS_Q_WIDE 1             /* int16 operands: no bias, any signedness */
typedef int16_t ts_q_t;
#define ts_qv_dot(acc, a, b) ts_qv_madd(acc, a, b)
#endif
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#define TS_Q_MR 8
#define TS_Q_NV 3
#define TS_Q_VL 4
#define TS_Q_KG 4
#define TS_Q_A_UNSIGNED 0
#define TS_Q_B_UNSIGNED 0
#define TS_Q_SDOT 1             /* four rows of A per vector: the lane picks the row */
typedef uint8_t ts_q_t;
typedef int32x4_t ts_qv;
#define ts_qv_zero() vdupq_n_s32(0)
#define ts_qv_load(p) vreinterpretq_s32_u8(vld1q_u8(p))
#define ts_qv_store(p, v) vst1q_s32(p, v)
#define ts_qv_loadc(p) vld1q_s32(p)
#define ts_qv_sum(acc, b) vdotq_s32(acc, vreinterpretq_s8_s32(b), vdupq_n_s8(1))
#else
#define TS_Q_MR 4
#define TS_Q_NV 4
#define TS_Q_VL 1
#define TS_Q_KG 1
#define TS_Q_WIDE 1
typedef int16_t ts_q_t;
typedef int32_t ts_qv;
#define ts_qv_zero() 0
#define ts_qv_load(p) ((int32_t)*(p))
#define ts_qv_store(p, v) (*(p) = (v))
#define ts_qv_loadc(p) (*(p))
#define ts_qv_bcast(p) ((int32_t)*(p))
#define ts_qv_dot(acc, a, b) ((int32_t)((uint32_t)(acc) + (uint32_t)((a) * (b))))
#endif
#ifndef TS_Q_WIDE
#define TS_Q_WIDE 0
#endif
#define TS_Q_NR (TS_Q_NV * TS_Q_VL)

/* One 32-bit lane of packed operands (memcpy: no aliasing assumption). */
static inline __attribute__((unused)) int32_t ts_q_lane(const ts_q_t* p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}
