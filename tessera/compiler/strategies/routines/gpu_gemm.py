"""Hand-written GPU GEMM routines (CUDA and HIP) as source chunks.

`gemm_routine(lang, dtype, tile_m, tile_n, tile_k, threads)` returns `(name, chunks)`; the chunks
(deduplicated by the renderer: the helpers are shared by every variant and by gpu_attention)
define

    __device__ void <name>(const T* A, long long a_rs, long long a_cs,
                           const T* B, long long b_rs, long long b_cs,
                           TO* C, long long ldc, long long K, long long mt, long long nt)

which all `threads` threads of a 1-D block call together. It overwrites

    C[i*ldc + j] = sum_k A[i*a_rs + k*a_cs] * B[k*b_rs + j*b_cs],   0 <= i < mt, 0 <= j < nt

for mt <= tile_m, nt <= tile_n and any K >= 0 (K = 0 stores zeros), then returns. Operands may
have any element strides: a transposed view is read in place. T is float / double, or
`unsigned short` holding f16 / bf16 bits; TO = T (f16/bf16 results are rounded to nearest even
from the f32 accumulator; NaN stays NaN). The routine starts with a barrier, so a caller may
call it again at once for its next tile; its shared memory is static (`__shared__` inside the
routine) and counts against the kernel's 48 KiB static limit.

Numerics. f32/f64 (and the SIMT f16/bf16 path): every C element is the chain
acc = fma(a_k, b_k, acc) for k = 0, 1, ..., K-1 from acc = 0 - the CPU routine's chain
(c_gemm.py), so GPU and CPU results are bitwise equal, and no knob changes a bit. Each fma is an
explicit fmaf/fma call and nothing else is computed in floating point, so the result does not
depend on --fmad / -ffp-contract (pass --fmad=false / -ffp-contract=off for the rest of a kernel).
Tensor cores (CUDA f16/bf16): k goes by in steps of 16 from 0, one mma.sync per step per output
fragment, accumulated in f32; the hardware's rounding inside one step is its own, so results
are bitwise reproducible run to run and for every tile knob on one GPU model, but not equal to
the CPU's chain (tests compare with a float64 reference).

Routines and why they are tiled as they are. H100 SXM: 132 SMs, 228 KiB shared memory and
64K registers per SM; FP32 67 TFLOP/s, FP64 34, dense bf16/f16 989 (wgmma). Shared memory and
registers are ptxas's (CUDA 13.2, sm_90) for a grid-stride test kernel; the fractions of peak
are estimates from the instruction mix, to be measured on a lent GPU:

* SIMT (f32, f64; HIP f16/bf16). A tile_m x tile_n block tile; each thread owns a TM x TN
  register tile (TM*TN = tile_m*tile_n/threads, at most 256 bytes of accumulators), its rows
  and columns in 16-byte groups spread across the tile, so each shared-memory read is one
  16-byte vector and a warp's reads are broadcasts or conflict-free. A and B are staged tile_k
  deep, transposed to k-major (As[k][m], Bs[k][n]; rows padded by 16 bytes so the transposing
  stores do not conflict) and double-buffered: slice s+1 is loaded into registers while slice s
  is computed, one barrier per slice. Global loads are per element (any strides), the operand's
  unit-stride index along consecutive threads (coalesced for either layout).
  f32 128 x 128 x 8, 256 threads (8 x 8 per thread: per k step 4 vector loads for 64 fmas):
  16.5 KiB shared, ~150 registers (143 in the renderer's kernel), one block of 8 warps per SM;
  expected 55-70% of the FP32 peak (cuBLAS sgemm ~75-80%).
  f64 64 x 64 x 8, 256 threads (4 x 4): 16.5 KiB, 80 registers, 3 blocks per SM; ~60% of FP64.
* Tensor cores (CUDA f16/bf16, sm_80+). mma.sync.m16n8k16 (f32 accumulation) on ldmatrix
  fragments; the warps split the block tile into warp tiles (128 x 128 with 4 warps: 64 x 64
  each, 4 x 8 mma tiles, 128 accumulators); cp.async (16 bytes, zero-filling past the edges)
  fills a ring of 2-4 tile_k-deep stages, as many as fit 48 KiB (3 for 128 x 128 x 32: 48 KiB
  exactly), one barrier per stage. Each operand keeps its global layout in shared memory
  (k- or m/n-contiguous, chosen at run time from the strides: one template instance per pair)
  and is read with ldmatrix or ldmatrix.trans; 16-byte chunks are XOR-swizzled so the 8 rows
  of every ldmatrix phase hit 8 different bank groups. Operands without a unit stride or not
  16-byte aligned take a scalar path into the same layout (slow, correct). Tiles smaller than
  the warps can split leave the extra warps loading only. 128 x 128 x 32 with 128 threads: 48 KiB,
  250 registers, 2 blocks (8 warps) per SM; expected 55-65% of cuBLAS on H100 (cuBLAS uses
  wgmma, TMA and deeper pipelines in dynamic shared memory), ~75% on A100.
* HIP f16/bf16: the SIMT routine with f32 accumulation. MFMA (gfx90a) is future work: its
  register layouts cannot be checked here without an AMD GPU or an emulator of them.

`TSG_PORTABLE_MMA` (a macro defined before the chunks) replaces the tensor-core PTX (cp.async,
ldmatrix, mma.sync, cvt) with C++ doing the same data movement through warp shuffles, so a CPU
emulator of the CUDA thread model runs the tensor-core routines' own indexing (the tests do).
C must not overlap A or B.
"""
from __future__ import annotations

from ....errors import ArgumentError, UnsupportedDTypeError

LANGS = ("cuda", "hip")
DTYPES = ("f32", "f64", "f16", "bf16")
DT_CODE = {"f32": 0, "f64": 1, "f16": 2, "bf16": 3}       # tsg_dt<DT> in the C++ below
STORAGE = {"f32": "float", "f64": "double", "f16": "unsigned short", "bf16": "unsigned short"}
_ARITH_BYTES = {"f32": 4, "f64": 8, "f16": 4, "bf16": 4}   # f16/bf16 are staged as f32 (SIMT)
SMEM_LIMIT = 48 << 10          # static shared memory per block
MAX_STAGES = 4

# (tile_m, tile_n, tile_k, threads) a caller can start from; see the module docstring.
DEFAULT_KNOBS = {
    "cuda": {"f32": (128, 128, 8, 256), "f64": (64, 64, 8, 256),
             "f16": (128, 128, 32, 128), "bf16": (128, 128, 32, 128)},
    "hip": {"f32": (128, 128, 8, 256), "f64": (64, 64, 8, 256),
            "f16": (128, 128, 8, 256), "bf16": (128, 128, 8, 256)},
}

# ---- shared helpers (one chunk per language, also used by gpu_attention) ----------------------

_LANG_MACROS = {
    "cuda": """\
#define TSG_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define TSG_SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l))
#define TSG_NOCONTRACT          /* NVRTC: every rounding-sensitive operation is an intrinsic */""",
    "hip": """\
#define TSG_SHFL_XOR(v, m) __shfl_xor((v), (m))
#define TSG_SHFL(v, l) __shfl((v), (l))
/* hipcc contracts a*b+c across statements by default; each routine body opts out */
#define TSG_NOCONTRACT _Pragma("clang fp contract(off)")""",
}

_COMMON = """\
typedef unsigned short tsg_u16;
/* Correctly rounded operations that no compiler fuses into an fma, and explicit fmas. */
static __device__ __forceinline__ float tsg_mul(float a, float b) {
  TSG_NOCONTRACT return __fmul_rn(a, b);
}
static __device__ __forceinline__ double tsg_mul(double a, double b) {
  TSG_NOCONTRACT return __dmul_rn(a, b);
}
static __device__ __forceinline__ float tsg_add(float a, float b) {
  TSG_NOCONTRACT return __fadd_rn(a, b);
}
static __device__ __forceinline__ double tsg_add(double a, double b) {
  TSG_NOCONTRACT return __dadd_rn(a, b);
}
static __device__ __forceinline__ float tsg_div(float a, float b) {
  TSG_NOCONTRACT return __fdiv_rn(a, b);
}
static __device__ __forceinline__ double tsg_div(double a, double b) {
  TSG_NOCONTRACT return __ddiv_rn(a, b);
}
static __device__ __forceinline__ float tsg_fma(float a, float b, float c) { return fmaf(a, b, c); }
static __device__ __forceinline__ double tsg_fma(double a, double b, double c) {
  return fma(a, b, c);
}
static __device__ __forceinline__ float tsg_max(float a, float b) { return b > a ? b : a; }
static __device__ __forceinline__ double tsg_max(double a, double b) { return b > a ? b : a; }

/* f16 / bf16 bits <-> f32: widening is exact; narrowing rounds to nearest even (overflow to
   inf, gradual subnormals), NaN stays a quiet NaN. Bit operations only: no f16 headers. */
static __device__ __forceinline__ float tsg_bf16_to_f32(tsg_u16 h) {
  return __uint_as_float((unsigned)h << 16);
}
static __device__ __forceinline__ tsg_u16 tsg_f32_to_bf16(float f) {
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (tsg_u16)((u >> 16) | 0x40u);
  return (tsg_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static __device__ __forceinline__ float tsg_f16_to_f32(tsg_u16 h) {
  const unsigned s = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0)                                        /* zero or subnormal: m * 2^-24, exact */
    return __uint_as_float(s | __float_as_uint(__fmul_rn((float)m, 5.9604644775390625e-8f)));
  return __uint_as_float(s | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (m << 13));
}
static __device__ __forceinline__ tsg_u16 tsg_f32_to_f16(float f) {
  const unsigned u = __float_as_uint(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (tsg_u16)(s | 0x7e00u | ((a >> 13) & 0x3ffu));   /* NaN */
  if (a >= 0x477ff000u) return (tsg_u16)(s | 0x7c00u);      /* 65520 and up round to inf */
  if (a < 0x38800000u)                              /* below 2^-14: subnormal, units 2^-24 */
    return (tsg_u16)(s | (unsigned)rintf(__fmul_rn(__uint_as_float(a), 16777216.0f)));
  const unsigned r = a - 0x38000000u;               /* rebias the exponent (127 -> 15) */
  return (tsg_u16)(s | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}
/* double -> float rounded to odd: then rounding to f16 equals rounding the double once */
static __device__ __forceinline__ float tsg_f64_to_f32_odd(double d) {
  const float f = (float)d;
  const unsigned u = __float_as_uint(f);
  if ((double)f == d || d != d || (u & 1u)) return f;
  return __uint_as_float(fabs(d) > fabs((double)f) ? u + 1u : u - 1u);
}

/* Storage type S, arithmetic type R and the conversions, per dtype code
   (0 f32, 1 f64, 2 f16, 3 bf16). */
template <int DT> struct tsg_dt;
template <> struct tsg_dt<0> {
  typedef float S; typedef float R;
  static __device__ __forceinline__ float in(float x) { return x; }
  static __device__ __forceinline__ float out(float x) { return x; }
  static __device__ __forceinline__ float ninf() { return __uint_as_float(0xff800000u); }
};
template <> struct tsg_dt<1> {
  typedef double S; typedef double R;
  static __device__ __forceinline__ double in(double x) { return x; }
  static __device__ __forceinline__ double out(double x) { return x; }
  static __device__ __forceinline__ double ninf() {
    return __longlong_as_double((long long)0xfff0000000000000ull);
  }
};
template <> struct tsg_dt<2> {
  typedef tsg_u16 S; typedef float R;
  static __device__ __forceinline__ float in(tsg_u16 x) { return tsg_f16_to_f32(x); }
  static __device__ __forceinline__ tsg_u16 out(float x) { return tsg_f32_to_f16(x); }
  static __device__ __forceinline__ float ninf() { return __uint_as_float(0xff800000u); }
};
template <> struct tsg_dt<3> {
  typedef tsg_u16 S; typedef float R;
  static __device__ __forceinline__ float in(tsg_u16 x) { return tsg_bf16_to_f32(x); }
  static __device__ __forceinline__ tsg_u16 out(float x) { return tsg_f32_to_bf16(x); }
  static __device__ __forceinline__ float ninf() { return __uint_as_float(0xff800000u); }
};

/* N elements read or written as one 16-byte (or smaller) vector access */
template <typename R, int N> struct alignas(sizeof(R) * N) tsg_vec { R v[N]; };
"""

COMMON = {lang: f"/* ---- tessera GPU routines: shared helpers ({lang}) ---- */\n{macros}\n{_COMMON}"
          for lang, macros in _LANG_MACROS.items()}

# ---- SIMT GEMM (f32, f64; f16/bf16 staged as f32) ---------------------------------------------

_SIMT = """\
/* ---- tsg_gemm_simt: register-tiled SIMT GEMM, see tessera/compiler/target/gpu_gemm.py ----
   Thread (ty, tx) of the NY x NX grid owns rows  g*NY*VM + ty*VM + v  (g < TM/VM, v < VM) and
   columns g*NX*VN + tx*VN + w of the tile: VM, VN elements in one 16-byte read. */
template <int DT, int BM, int BN, int BK, int NT, int TM, int TN>
__device__ __forceinline__ void tsg_gemm_simt(
    const typename tsg_dt<DT>::S* __restrict__ A, long long a_rs, long long a_cs,
    const typename tsg_dt<DT>::S* __restrict__ B, long long b_rs, long long b_cs,
    typename tsg_dt<DT>::S* __restrict__ C, long long ldc, long long K, long long mt,
    long long nt) {
  TSG_NOCONTRACT
  typedef typename tsg_dt<DT>::S S;
  typedef typename tsg_dt<DT>::R R;
  enum { V = 16 / (int)sizeof(R), VM = TM < V ? TM : V, VN = TN < V ? TN : V,
         NX = BN / TN, NY = BM / TM, LDA = BM + V, LDB = BN + V,
         LA = (BM * BK + NT - 1) / NT, LB = (BK * BN + NT - 1) / NT };
  /* k-major stages, rows padded by 16 bytes: the transposing stores do not conflict */
  __shared__ R As[2][BK][LDA] __attribute__((aligned(16)));
  __shared__ R Bs[2][BK][LDB] __attribute__((aligned(16)));
  const int tid = threadIdx.x, tx = tid % NX, ty = tid / NX;
  /* this thread's global loads: element e = tid + t*NT of each slice, the operand's contiguous
     index running along consecutive threads (coalesced for either layout) */
  const bool a_kfast = !(a_rs == 1 && a_cs != 1), b_nfast = !(b_cs != 1 && b_rs == 1);
#define TSG_A_AT(t) const int e = tid + (t) * NT, i = a_kfast ? e / BK : e % BM,               \
                              k = a_kfast ? e % BK : e / BM
#define TSG_B_AT(t) const int e = tid + (t) * NT, j = b_nfast ? e % BN : e / BK,               \
                              k = b_nfast ? e / BN : e % BK
  R ra[LA], rb[LB], acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = R(0);
  const long long nk = (K + BK - 1) / BK;
  __syncthreads();                     /* the previous call's last reads are done */
  for (long long s = -1; s < nk; ++s) {
    const int cur = (int)(s & 1);
    if (s + 1 < nk) {                  /* fetch slice s+1 into registers (zero past the edges) */
      const long long k0 = (s + 1) * BK, kl = K - k0;
#pragma unroll
      for (int t = 0; t < LA; ++t) {
        TSG_A_AT(t);
        ra[t] = e < BM * BK && i < mt && k < kl ? tsg_dt<DT>::in(A[i * a_rs + (k0 + k) * a_cs])
                                                : R(0);
      }
#pragma unroll
      for (int t = 0; t < LB; ++t) {
        TSG_B_AT(t);
        rb[t] = e < BK * BN && j < nt && k < kl ? tsg_dt<DT>::in(B[(k0 + k) * b_rs + j * b_cs])
                                                : R(0);
      }
    }
    if (s >= 0) {                      /* slice s: kn steps, each TM x TN fmas */
      const long long kl = K - s * BK;
      const int kn = kl < BK ? (int)kl : BK;
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        if (kk < kn) {
          R a[TM], b[TN];
#pragma unroll
          for (int g = 0; g < TM / VM; ++g) {
            const tsg_vec<R, VM> q =
                *reinterpret_cast<const tsg_vec<R, VM>*>(&As[cur][kk][g * NY * VM + ty * VM]);
#pragma unroll
            for (int v = 0; v < VM; ++v) a[g * VM + v] = q.v[v];
          }
#pragma unroll
          for (int g = 0; g < TN / VN; ++g) {
            const tsg_vec<R, VN> q =
                *reinterpret_cast<const tsg_vec<R, VN>*>(&Bs[cur][kk][g * NX * VN + tx * VN]);
#pragma unroll
            for (int w = 0; w < VN; ++w) b[g * VN + w] = q.v[w];
          }
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = tsg_fma(a[i], b[j], acc[i][j]);
        }
      }
    }
    if (s + 1 < nk) {                  /* the other buffer: nobody reads it until the barrier */
#pragma unroll
      for (int t = 0; t < LA; ++t) {
        TSG_A_AT(t);
        if (e < BM * BK) As[cur ^ 1][k][i] = ra[t];
      }
#pragma unroll
      for (int t = 0; t < LB; ++t) {
        TSG_B_AT(t);
        if (e < BK * BN) Bs[cur ^ 1][k][j] = rb[t];
      }
    }
    __syncthreads();
  }
#undef TSG_A_AT
#undef TSG_B_AT
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int r = i / VM * NY * VM + ty * VM + i % VM;
    if (r < mt)
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int c = j / VN * NX * VN + tx * VN + j % VN;
        if (c < nt) C[r * ldc + c] = tsg_dt<DT>::out(acc[i][j]);
      }
  }
}
"""

# ---- tensor-core GEMM (CUDA, f16/bf16, sm_80+) ------------------------------------------------

MMA_OPS = r"""
/* ---- tensor-core building blocks: cp.async, ldmatrix, mma.sync m16n8k16 (sm_80+) ----
   With TSG_PORTABLE_MMA the same operations are done by warp shuffles and plain loads and
   stores (for a CPU emulator of the thread model; not for speed). */
#ifndef TSG_PORTABLE_MMA
static __device__ __forceinline__ unsigned tsg_smem(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
/* 16 bytes global -> shared, the bytes past `bytes` zero-filled (none read when 0) */
static __device__ __forceinline__ void tsg_cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(tsg_smem(dst)), "l"(src), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void tsg_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void tsg_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
/* four 8x8 b16 matrices; lane l gives the address of row l%8 of matrix l/8 */
template <bool TRANS> __device__ __forceinline__ void tsg_ldmatrix4(unsigned (&r)[4],
                                                                      const void* p) {
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tsg_smem(p)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tsg_smem(p)));
}
/* d += a (16x16, row) * b (16x8, col), f32 accumulators */
template <int DT> __device__ __forceinline__ void tsg_mma16816(float (&d)[4],
                                                                 const unsigned (&a)[4],
                                                                 const unsigned (&b)[2]) {
  if (DT == 3)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* two f32 -> f16x2 / bf16x2 bits, rounded to nearest even, lo in the low half */
template <int DT> __device__ __forceinline__ unsigned tsg_pack2(float lo, float hi) {
  unsigned d;
  if (DT == 3) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
#else
template <int DT> __device__ __forceinline__ unsigned tsg_pack2(float lo, float hi) {
  return tsg_dt<DT>::out(lo) | (unsigned)tsg_dt<DT>::out(hi) << 16;
}
static __device__ __forceinline__ void tsg_cp_async16(void* dst, const void* src, int bytes) {
  unsigned char* d = (unsigned char*)dst;
  const unsigned char* s = (const unsigned char*)src;
  for (int i = 0; i < 16; ++i) d[i] = i < bytes ? s[i] : 0;
}
static __device__ __forceinline__ void tsg_cp_async_commit() {}
template <int N> __device__ __forceinline__ void tsg_cp_async_wait() {}
static __device__ __forceinline__ const tsg_u16* tsg_lane_ptr(const void* p, int lane) {
  const unsigned long long a = (unsigned long long)p;
  const unsigned lo = TSG_SHFL((unsigned)a, lane), hi = TSG_SHFL((unsigned)(a >> 32), lane);
  return (const tsg_u16*)(((unsigned long long)hi << 32) | lo);
}
template <bool TRANS> __device__ __forceinline__ void tsg_ldmatrix4(unsigned (&r)[4],
                                                                      const void* p) {
  const int l = threadIdx.x & 31;
  for (int m = 0; m < 4; ++m) {
    if (!TRANS) {                      /* row l/4, columns 2(l%4), 2(l%4)+1 */
      const tsg_u16* row = tsg_lane_ptr(p, m * 8 + l / 4);
      r[m] = row[2 * (l % 4)] | (unsigned)row[2 * (l % 4) + 1] << 16;
    } else {                           /* column l/4, rows 2(l%4), 2(l%4)+1 */
      const tsg_u16* r0 = tsg_lane_ptr(p, m * 8 + 2 * (l % 4));
      const tsg_u16* r1 = tsg_lane_ptr(p, m * 8 + 2 * (l % 4) + 1);
      r[m] = r0[l / 4] | (unsigned)r1[l / 4] << 16;
    }
  }
}
template <int DT> __device__ __forceinline__ float tsg_half(unsigned x, int hi) {
  return tsg_dt<DT>::in((tsg_u16)(hi ? x >> 16 : x & 0xffffu));
}
/* lane (g, t) = (l/4, l%4) holds a: rows g, g+8 x columns 2t.., 2t+8..; b: rows 2t.., 2t+8..
   x column g; d: rows g, g+8 x columns 2t, 2t+1 */
template <int DT> __device__ __forceinline__ void tsg_mma16816(float (&d)[4],
                                                                 const unsigned (&a)[4],
                                                                 const unsigned (&b)[2]) {
  const int l = threadIdx.x & 31, g = l / 4, t = l % 4;
  for (int u = 0; u < 4; ++u) {        /* the k pairs that lanes 4g+u (a) and 4n+u (b) hold */
    unsigned av[4], bv[2][2];
    for (int i = 0; i < 4; ++i) av[i] = TSG_SHFL(a[i], 4 * g + u);
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 2; ++i) bv[c][i] = TSG_SHFL(b[i], 4 * (2 * t + c) + u);
    for (int q = 0; q < 4; ++q) {      /* d[q]: row g + 8*(q/2), column 2t + q%2 */
      const int rh = q / 2, c = q % 2;
      for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e)
          d[q] = fmaf(tsg_half<DT>(av[rh + 2 * h], e), tsg_half<DT>(bv[c][h], e), d[q]);
    }
  }
}
#endif
/* 16-byte chunk c of row r of a shared tile whose rows hold CW chunks, XOR-swizzled so that
   8 consecutive rows' chunk c (one ldmatrix) fall in 8 different 16-byte bank groups */
template <int CW> __device__ __forceinline__ int tsg_swz(int r, int c) {
  return CW >= 8 ? c ^ (r & 7) : CW == 4 ? c ^ ((r >> 1) & 3) : CW == 2 ? c ^ ((r >> 2) & 1) : c;
}
template <int W> __device__ __forceinline__ int tsg_at(int r, int c) {  /* element (r, c) */
  return r * W + tsg_swz<W / 8>(r, c / 8) * 8 + c % 8;
}

/* Fill a ROWS x W tile (row r, column c = global + r*rs + c*cs; rows past rl and columns past
   cl zero; columns from cw on untouched). vec: cs == 1 and every row start 16-byte aligned:
   cp.async, else element loads. */
template <int ROWS, int W, int NT>
__device__ __forceinline__ void tsg_tile_fill(tsg_u16* tile, const tsg_u16* g, long long rs,
                                              long long cs, long long rl, long long cl,
                                              bool vec, int cw = W) {
  for (int e = threadIdx.x; e < ROWS * W / 8; e += NT) {
    const int r = e / (W / 8), c = e % (W / 8) * 8;
    if (c >= cw) continue;             /* columns nobody reads: left alone */
    tsg_u16* dst = tile + r * W + tsg_swz<W / 8>(r, c / 8) * 8;
    const long long left = cl - c;
    const int n = r < rl ? (left < 0 ? 0 : left > 8 ? 8 : (int)left) : 0;
    const tsg_u16* src = g + r * rs + c * cs;
    if (vec) {
      tsg_cp_async16(dst, n > 0 ? (const void*)src : (const void*)g, 2 * n);
    } else {
      for (int x = 0; x < 8; ++x) dst[x] = x < n ? src[x * cs] : (tsg_u16)0;
    }
  }
}
"""

_MMA = r"""
/* The main loop for one pair of shared layouts. AMN: A is m-contiguous (As[k][m], read with
   ldmatrix.trans), else k-contiguous (As[m][k]); BKN: B is k-contiguous (Bs[n][k]), else
   n-contiguous (Bs[k][n], ldmatrix.trans). Warp (wm, wn) of WM x WN owns a WTM x WTN tile:
   MI x NI mma tiles of 16 x 8. */
template <int DT, int BM, int BN, int BK, int NT, int WM, int WN, int ST, bool AMN, bool BKN>
__device__ __forceinline__ void tsg_gemm_mma_body(
    tsg_u16* smem, const tsg_u16* A, long long a_rs, long long a_cs, const tsg_u16* B,
    long long b_rs, long long b_cs, tsg_u16* C, long long ldc, long long K, long long mt,
    long long nt, bool a_vec, bool b_vec) {
  enum { WTM = BM / WM, WTN = BN / WN, MI = WTM / 16, NI = WTN / 8,
         AW = AMN ? BM : BK, BW = BKN ? BK : BN, ASZ = BM * BK, BSZ = BK * BN };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp / WN, wn = warp % WN, lr = lane & 7, lm = lane >> 3;
  const bool busy = warp < WM * WN;    /* small tiles: the other warps only load */
  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
  const long long nk = (K + BK - 1) / BK;
  /* stage s -> ring slot s % ST: A then B */
#define TSG_ISSUE(s)                                                                          \
  if ((s) < nk) {                                                                             \
    const long long k0 = (long long)(s) * BK;                                                 \
    tsg_u16* as = smem + (int)((s) % ST) * (ASZ + BSZ);                                       \
    if (AMN) tsg_tile_fill<BK, BM, NT>(as, A + k0 * a_cs, a_cs, a_rs, K - k0, mt, a_vec);    \
    else tsg_tile_fill<BM, BK, NT>(as, A + k0 * a_cs, a_rs, a_cs, mt, K - k0, a_vec);        \
    if (BKN) tsg_tile_fill<BN, BK, NT>(as + ASZ, B + k0 * b_rs, b_cs, b_rs, nt, K - k0,      \
                                       b_vec);                                                \
    else tsg_tile_fill<BK, BN, NT>(as + ASZ, B + k0 * b_rs, b_rs, b_cs, K - k0, nt, b_vec);  \
  }                                                                                           \
  tsg_cp_async_commit();
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) { TSG_ISSUE(s) }
  for (long long s = 0; s < nk; ++s) {
    tsg_cp_async_wait<ST - 2>();       /* stage s has landed (for this thread) ... */
    __syncthreads();                   /* ... for every thread, and slot (s-1) % ST is free */
    TSG_ISSUE(s + ST - 1)
    const tsg_u16* as = smem + (int)(s % ST) * (ASZ + BSZ);
    const tsg_u16* bs = as + ASZ;
    if (!busy) continue;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) {   /* matrices: (m0-7,k0-7) (m8-15,k0-7) (m0-7,k8-15) ... */
        const int m = wm * WTM + i * 16;
        if (AMN)
          tsg_ldmatrix4<true>(af[i], as + tsg_at<AW>(kk + lr + 8 * (lm >> 1), m + 8 * (lm & 1)));
        else
          tsg_ldmatrix4<false>(af[i], as + tsg_at<AW>(m + lr + 8 * (lm & 1), kk + 8 * (lm >> 1)));
      }
#pragma unroll
      for (int j = 0; j < NI; j += 2) {  /* (k0-7,n0-7) (k8-15,n0-7) (k0-7,n8-15) (k8-15,n8-15) */
        const int n = wn * WTN + j * 8;
        unsigned r[4];
        if (BKN)
          tsg_ldmatrix4<false>(r, bs + tsg_at<BW>(n + lr + 8 * (lm >> 1), kk + 8 * (lm & 1)));
        else
          tsg_ldmatrix4<true>(r, bs + tsg_at<BW>(kk + lr + 8 * (lm & 1), n + 8 * (lm >> 1)));
        bf[j][0] = r[0]; bf[j][1] = r[1]; bf[j + 1][0] = r[2]; bf[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) tsg_mma16816<DT>(acc[i][j], af[i], bf[j]);
    }
  }
#undef TSG_ISSUE
  tsg_cp_async_wait<0>();              /* only empty groups can be left; drain them anyway */
  const int g = lane >> 2, t = lane & 3;
  if (!busy) return;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int r = wm * WTM + i * 16 + g + 8 * (q >> 1), c = wn * WTN + j * 8 + 2 * t + (q & 1);
        if (r < mt && c < nt) C[r * ldc + c] = tsg_dt<DT>::out(acc[i][j][q]);
      }
}

template <int DT, int BM, int BN, int BK, int NT, int WM, int WN, int ST>
__device__ __forceinline__ void tsg_gemm_mma(const tsg_u16* A, long long a_rs, long long a_cs,
                                             const tsg_u16* B, long long b_rs, long long b_cs,
                                             tsg_u16* C, long long ldc, long long K,
                                             long long mt, long long nt) {
  __shared__ tsg_u16 smem[ST * (BM * BK + BK * BN)] __attribute__((aligned(128)));
  /* each operand keeps its global layout in shared memory: the unit stride picks it */
  const bool amn = a_rs == 1 && a_cs != 1, bkn = b_rs == 1 && b_cs != 1;
  const long long a_ld = amn ? a_cs : a_rs, b_ld = bkn ? b_cs : b_rs;
  const bool a_vec = (amn || a_cs == 1) && ((unsigned long long)A & 15) == 0 && a_ld % 8 == 0;
  const bool b_vec = (bkn || b_cs == 1) && ((unsigned long long)B & 15) == 0 && b_ld % 8 == 0;
  __syncthreads();                     /* the previous call's last reads are done */
#define TSG_BODY(am, bk)                                                                      \
  tsg_gemm_mma_body<DT, BM, BN, BK, NT, WM, WN, ST, am, bk>(smem, A, a_rs, a_cs, B, b_rs, b_cs,  \
                                                            C, ldc, K, mt, nt, a_vec, b_vec)
  if (amn) {
    if (bkn) TSG_BODY(true, true); else TSG_BODY(true, false);
  } else {
    if (bkn) TSG_BODY(false, true); else TSG_BODY(false, false);
  }
#undef TSG_BODY
}
"""

_WRAPPER = """\
/* {doc} */
static __device__ __forceinline__ void {name}(const {T}* A, long long a_rs, long long a_cs,
    const {T}* B, long long b_rs, long long b_cs, {T}* C, long long ldc, long long K, long long mt,
    long long nt) {{
  {call}(A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, K, mt, nt);
}}
"""


def check_lang_dtype(lang: str, dtype: str, what: str) -> None:
    if lang not in LANGS:
        raise ArgumentError(f"{what}: unknown GPU language {lang!r}", expected=" or ".join(LANGS),
                            received=repr(lang))
    if dtype not in DTYPES:
        raise UnsupportedDTypeError(f"{what}: no GPU routine for dtype {dtype!r}",
                                    expected=", ".join(DTYPES), received=repr(dtype))


def knob_error(what: str, message: str, received: str, hint: str | None = None):
    return ArgumentError(f"{what}: {message}", received=received, hint=hint)


def register_tile(rows: int, cols: int, threads: int) -> tuple[int, int]:
    """(TM, TN): each of `threads` threads owns TM x TN of a rows x cols tile, TM*TN =
    rows*cols/threads, as square as powers of two allow (TN >= TM). (0, 0) if impossible."""
    per, rem = divmod(rows * cols, threads)
    if rem or per < 1 or per & (per - 1):
        return 0, 0
    tm = 1 << ((per.bit_length() - 1) // 2)
    tn = per // tm
    return (tm, tn) if rows % tm == 0 and cols % tn == 0 else (0, 0)


def simt_plan(dtype: str, tile_m: int, tile_n: int, tile_k: int, threads: int) -> dict:
    """The SIMT routine's derived sizes (register tile, shared memory), checked."""
    what = f"gemm_routine({dtype}, {tile_m}x{tile_n}x{tile_k}, threads={threads})"
    if threads < 32 or threads > 1024 or threads % 32:
        raise knob_error(what, "threads must be a multiple of 32 in 32..1024", str(threads))
    if min(tile_m, tile_n, tile_k) < 1 or max(tile_m, tile_n) > 512 or tile_k > 64:
        raise knob_error(what, "tiles must be 1..512 (tile_k 1..64)",
                          f"{tile_m}x{tile_n}x{tile_k}")
    tm, tn = register_tile(tile_m, tile_n, threads)
    size = _ARITH_BYTES[dtype]
    if not tm or tm * tn * size > 256:
        raise knob_error(what, "tile_m*tile_n/threads must be a power of two that tiles the "
                          f"block, at most {256 // size} accumulators per thread",
                          f"{tile_m * tile_n / threads:g} per thread",
                          hint="e.g. 128x128 (f32) or 64x64 (f64) with 256 threads")
    vec = 16 // size
    smem = 2 * tile_k * (tile_m + tile_n + 2 * vec) * size
    if smem > SMEM_LIMIT:
        raise knob_error(what, f"needs {smem} bytes of shared memory (limit {SMEM_LIMIT})",
                          f"tile_k={tile_k}", hint="lower tile_k")
    return {"TM": tm, "TN": tn, "smem": smem, "accumulators": tm * tn}


def mma_plan(dtype: str, tile_m: int, tile_n: int, tile_k: int, threads: int) -> dict:
    """The tensor-core routine's warp layout, pipeline depth and shared memory, checked."""
    what = f"gemm_routine(cuda, {dtype}, {tile_m}x{tile_n}x{tile_k}, threads={threads})"
    if threads not in (32, 64, 128, 256, 512):
        raise knob_error(what, "tensor-core routine needs 1, 2, 4, 8 or 16 warps", str(threads))
    if tile_m % 16 or tile_n % 16 or tile_k % 16 or min(tile_m, tile_n, tile_k) < 16 \
            or tile_k > 64 or max(tile_m, tile_n) > 256:
        raise knob_error(what, "tile_m, tile_n must be multiples of 16 up to 256 and tile_k "
                          "one of 16, 32, 48, 64", f"{tile_m}x{tile_n}x{tile_k}")
    warps, best = threads // 32, None
    for wm in range(1, warps + 1):             # warps past WM*WN only load (small tiles)
        for wn in range(1, warps // wm + 1):
            if tile_m % (16 * wm) or tile_n % (16 * wn):
                continue
            wtm, wtn = tile_m // wm, tile_n // wn
            key = (-wm * wn, abs(wtm - wtn), -wtn)    # busy warps, square tiles, wide ones
            if best is None or key < best[0]:
                best = (key, wm, wn)
    _, wm, wn = best
    acc = (tile_m // wm) * (tile_n // wn) // 32
    if acc > 128:
        raise knob_error(what, f"{acc} f32 accumulators per thread (at most 128)",
                          f"{tile_m}x{tile_n} over {warps} warps", hint="use more threads")
    stage = 2 * tile_k * (tile_m + tile_n)
    stages = min(MAX_STAGES, SMEM_LIMIT // stage)
    if stages < 2:
        raise knob_error(what, f"two {stage}-byte stages exceed {SMEM_LIMIT} bytes of shared "
                          "memory", f"{tile_m}x{tile_n}x{tile_k}", hint="lower tile_k")
    return {"WM": wm, "WN": wn, "stages": stages, "smem": stages * stage, "accumulators": acc}


def uses_tensor_cores(lang: str, dtype: str) -> bool:
    return lang == "cuda" and dtype in ("f16", "bf16")


def gemm_routine(lang: str, dtype: str, tile_m: int, tile_n: int, tile_k: int,
                 threads: int) -> tuple[str, list[str]]:
    """(name, chunks) of the block-level GEMM routine described in the module docstring.

    lang "cuda" | "hip"; dtype "f32" | "f64" | "f16" | "bf16" (inputs; the output has the same
    dtype). CUDA f16/bf16 use tensor cores (`mma_routine`, sm_80+), everything else the SIMT
    routine (`simt_routine`). Raises ArgumentError for knobs the routine cannot take (with the
    limit in the message), UnsupportedDTypeError for a dtype."""
    check_lang_dtype(lang, dtype, "gemm_routine")
    if uses_tensor_cores(lang, dtype):
        return mma_routine(dtype, tile_m, tile_n, tile_k, threads)
    return simt_routine(lang, dtype, tile_m, tile_n, tile_k, threads)


def simt_routine(lang: str, dtype: str, tile_m: int, tile_n: int, tile_k: int,
                 threads: int) -> tuple[str, list[str]]:
    """The SIMT routine for any dtype (f16/bf16 staged and accumulated in f32): what HIP uses
    for every dtype, and CUDA for f32/f64 (tests run its f16/bf16 form in the CUDA emulator)."""
    check_lang_dtype(lang, dtype, "simt_routine")
    tile_m, tile_n, tile_k, threads = int(tile_m), int(tile_n), int(tile_k), int(threads)
    p = simt_plan(dtype, tile_m, tile_n, tile_k, threads)
    name = f"tsg_gemm_{dtype}_{tile_m}x{tile_n}x{tile_k}_t{threads}"
    call = (f"tsg_gemm_simt<{DT_CODE[dtype]}, {tile_m}, {tile_n}, {tile_k}, {threads}, "
            f"{p['TM']}, {p['TN']}>")
    doc = (f"{tile_m}x{tile_n}x{tile_k} SIMT GEMM, {threads} threads of {p['TM']}x{p['TN']}, "
           f"{p['smem']} B shared")
    wrapper = _WRAPPER.format(doc=doc, name=name, T=STORAGE[dtype], call=call)
    return name, [COMMON[lang], _SIMT, wrapper]


def mma_routine(dtype: str, tile_m: int, tile_n: int, tile_k: int,
                threads: int) -> tuple[str, list[str]]:
    """The CUDA tensor-core routine (f16/bf16 inputs and output, f32 accumulation, sm_80+)."""
    check_lang_dtype("cuda", dtype, "mma_routine")
    if dtype not in ("f16", "bf16"):
        raise UnsupportedDTypeError(f"mma_routine: tensor cores take f16 or bf16, not {dtype}")
    tile_m, tile_n, tile_k, threads = int(tile_m), int(tile_n), int(tile_k), int(threads)
    p = mma_plan(dtype, tile_m, tile_n, tile_k, threads)
    name = f"tsg_gemm_mma_{dtype}_{tile_m}x{tile_n}x{tile_k}_t{threads}"
    call = (f"tsg_gemm_mma<{DT_CODE[dtype]}, {tile_m}, {tile_n}, {tile_k}, {threads}, "
            f"{p['WM']}, {p['WN']}, {p['stages']}>")
    doc = (f"{tile_m}x{tile_n}x{tile_k} tensor-core GEMM, {threads // 32} warps, "
           f"{p['WM']}x{p['WN']} of them computing, {p['stages']} stages, {p['smem']} B shared, "
           f"{p['accumulators']} f32 accumulators/thread")
    wrapper = _WRAPPER.format(doc=doc, name=name, T=STORAGE[dtype], call=call)
    return name, [COMMON["cuda"], MMA_OPS, _MMA, wrapper]
