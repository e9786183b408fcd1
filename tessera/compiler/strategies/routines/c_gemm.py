"""The CPU's GEMM routine: packed panels and a register-tiled micro-kernel (BLIS-style).

`ts_gemm_tile_<T>(A, rsa, csa, B, rsb, csb, C, ldc, K, mt, nt, kc)` overwrites the mt x nt block
at C with A @ B for operands of any strides (a transposed operand is read in place by the
packing). The caller hands out tiles to threads; the routine is single-threaded.

Determinism: every C element is fma(a_k, b_k, c) for k = 0, 1, ... from c = 0 - the same
chain whatever the tile, its edges, the K blocking or the instruction set (AVX-512, AVX2 and the
portable path all use fused multiply-adds), so tiles and threads never change a bit.
"""
from __future__ import annotations

MR = 6                         # micro-tile rows; columns are two vectors (NR = 2 * lanes)
DEFAULT_TILE = {"f32": (256, 512, 256), "f64": (128, 256, 256)}    # rows, cols per task; K block
MIN_TASKS = 8                  # split smaller products finer, so both cores get work

ISA = """\
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
#define TS_MR 6"""

SCRATCH = """\
static _Thread_local {T}* ts_scratch_buf_{S} = 0;
static _Thread_local size_t ts_scratch_cap_{S} = 0;

/* Grow-only working memory for the routines, one per thread (kept for the thread's life). */
static {T}* ts_scratch_{S}(size_t n) {
  if (n > ts_scratch_cap_{S}) {
    void* p = 0;
    if (posix_memalign(&p, 64, n * sizeof({T}))) return 0;
    free(ts_scratch_buf_{S});
    ts_scratch_buf_{S} = ({T}*)p;
    ts_scratch_cap_{S} = n;
  }
  return ts_scratch_buf_{S};
}"""

_ROUTINE = """\
#define TS_NR_{S} (2 * TS_VL_{S})
/* MR rows of A, k-major: pa[k * MR + r]; rows past mc are zero. */
static void ts_pack_a_{S}(int64_t mc, int64_t kc, const {T}* A, int64_t rsa, int64_t csa,
                          {T}* pa) {
  for (int64_t ir = 0; ir < mc; ir += TS_MR, pa += TS_MR * kc) {
    int64_t m = mc - ir < TS_MR ? mc - ir : TS_MR;
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

/* C[0:m, 0:n] (+)= a-panel @ b-panel over kc: MR x NR accumulators in registers. */
static void ts_micro_{S}(int64_t kc, const {T}* restrict a, const {T}* restrict b,
                         {T}* restrict c, int64_t ldc, int64_t m, int64_t n, int first) {
  ts_v_{S} c0[TS_MR], c1[TS_MR];
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
  for (int r = 0; r < TS_MR; ++r) {
    c0[r] = first ? ts_vzero_{S}() : ts_vload_{S}(src + r * ld);
    c1[r] = first ? ts_vzero_{S}() : ts_vload_{S}(src + r * ld + TS_VL_{S});
  }
  for (int64_t k = 0; k < kc; ++k) {
    ts_v_{S} b0 = ts_vload_{S}(b + k * TS_NR_{S});
    ts_v_{S} b1 = ts_vload_{S}(b + k * TS_NR_{S} + TS_VL_{S});
    for (int r = 0; r < TS_MR; ++r) {
      ts_v_{S} ar = ts_vset1_{S}(a[k * TS_MR + r]);
      c0[r] = ts_vfma_{S}(ar, b0, c0[r]);
      c1[r] = ts_vfma_{S}(ar, b1, c1[r]);
    }
  }
  for (int r = 0; r < TS_MR; ++r) {
    ts_vstore_{S}(src + r * ld, c0[r]);
    ts_vstore_{S}(src + r * ld + TS_VL_{S}, c1[r]);
  }
  if (!full)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) c[r * ldc + j] = edge[r * TS_NR_{S} + j];
}

static void ts_gemm_tile_{S}(const {T}* A, int64_t rsa, int64_t csa, const {T}* B, int64_t rsb,
                             int64_t csb, {T}* C, int64_t ldc, int64_t K, int64_t mt,
                             int64_t nt, int64_t KC) {
  if (K <= 0) {
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t j = 0; j < nt; ++j) C[i * ldc + j] = 0;
    return;
  }
  if (KC <= 0) KC = 256;
  int64_t mp = (mt + TS_MR - 1) / TS_MR * TS_MR;
  int64_t np = (nt + TS_NR_{S} - 1) / TS_NR_{S} * TS_NR_{S};
  {T}* pa = ts_scratch_{S}((size_t)(mp + np) * (size_t)(K < KC ? K : KC));
  if (!pa) {                     /* no memory for packing: the same fma chains, unpacked */
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t j = 0; j < nt; ++j) {
        {T} acc = 0;
        for (int64_t k = 0; k < K; ++k) acc = fma{F}(A[i * rsa + k * csa], B[k * rsb + j * csb], acc);
        C[i * ldc + j] = acc;
      }
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
}"""


def instantiate(template: str, dtype_short: str) -> str:
    t, f = {"f32": ("float", "f"), "f64": ("double", "")}[dtype_short]
    return template.replace("{S}", dtype_short).replace("{T}", t).replace("{F}", f)


def gemm_source(dtype_short: str) -> list[str]:
    """The chunks for one dtype ("f32" or "f64"): the ISA definitions and the scratch memory
    (shared with the other routines, emitted once), then the routine."""
    return [ISA, instantiate(SCRATCH, dtype_short), instantiate(_ROUTINE, dtype_short)]


# The routine for 16-bit operands ({S}: f16 or bf16; the conversions are the C target's): each task widens its operands into float32 scratch (its
# A rows and B columns, or its queries, the keys, values and its mask block), calls the float32
# routine (float32 accumulation, the same chains) and rounds each result once into the output.
# Scratch comes from malloc per call: a call's arithmetic (mt*nt*K, nq*Sk*D) dwarfs it. Never
# abort() in the user's process: without scratch the GEMM computes the same chains straight
# from the 16-bit operands; attention returns 1 and its kernel reports out of memory.
HALF_ROUTINE = """\
static void ts_gemm_tile_{S}(const uint16_t* A, int64_t rsa, int64_t csa, const uint16_t* B,
                             int64_t rsb, int64_t csb, uint16_t* C, int64_t ldc, int64_t K,
                             int64_t mt, int64_t nt, int64_t KC) {
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
}"""
