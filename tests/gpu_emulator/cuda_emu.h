/* cuda_emu.h: run CUDA C kernels on the CPU, to test generated GPU code where there is no GPU.

One file, two roles:
  - force-included (g++ -include) before a kernel source: the CUDA names the kernels use
    (qualifiers, threadIdx & co, __syncthreads, warp shuffles and votes, atomics, intrinsics, math);
  - compiled once with -DTSEMU_RUNTIME into the runtime library the kernels link against: the
    scheduler that runs a launch.

Execution model (see emulator.py for the Python side):
  - The blocks of a launch run one at a time, in order, on the calling OS thread, so `static`
    storage is one block's shared memory: __shared__ is `static`. emulator.py finds those
    variables in the module's symbol table (function-local statics, templates' included) and the
    runtime fills them with 0xFF bytes (NaN, -1) before every block, so a read of shared memory
    nobody wrote shows up. Dynamic shared memory (`extern __shared__ T a[];`, rewritten by
    emulator.py) is a fixed area poisoned the same way.
  - The threads of a block are fibers (user-level contexts, one stack each) on that OS thread.
    A fiber runs until it reaches a collective (__syncthreads, a warp shuffle or vote,
    __syncwarp) or returns; then the next one runs. This is deterministic, costs a few ns per
    switch (1024 OS threads on 2 cores cost milliseconds per barrier), and it exposes races: with
    threads run in order 0..n-1 (or n-1..0, and the blocks last to first: the `reverse` flag)
    each thread completes its whole phase before the next one starts, so a thread that reads
    what another writes without a barrier between reads stale or poisoned data in one order.
  - Warps have 32 lanes, or 64 with -DTSEMU_HIP (HIP source for gfx90a: cuda_emu.h stands in
    for hip_runtime.h and adds HIP's unmasked __shfl*, __ballot, __any, __all).
  - A collective needs every thread of the block (__syncthreads) or of the warp (warp
    operations, which accept only a mask naming the whole warp) to arrive. When no fiber can run
    and some have not returned, the launch is a deadlock (a barrier in divergent code, lanes that
    returned before a shuffle): reported at once with who waits where, no timeout needed.
  - Faults: buffers that emulator.py allocates sit between guard pages, with the slack bytes
    checked after the launch (an access up to a page beyond either end is caught; further, it
    may land in another mapping); a segfault, bus error, arithmetic trap, fiber stack overflow or a
    time limit ends the launch with a message (the signal handlers exist only during a launch).
Not emulated: memory-model subtleties beyond barriers, inline PTX (asm), textures, cooperative
groups, clusters, partial-warp masks, and the GPU's math library: sinf, powf, __expf, rsqrtf...
are glibc's or exact here. The emulator is lenient where NVRTC is strict (no 48 KiB limit on
__shared__ arrays, INFINITY defined, min(float, int) accepted): NVRTC and hipcc remain the
compile checks. */
#ifndef TSEMU_CUDA_EMU_H
#define TSEMU_CUDA_EMU_H

#include <cstddef>
#include <climits>

/* ---- the interface between kernel code and the runtime ------------------------------------ */
struct uint3 { unsigned x, y, z; };     /* threadIdx's type in CUDA */
typedef uint3 tsemu_dim3;
enum { TSEMU_SHFL_IDX, TSEMU_SHFL_UP, TSEMU_SHFL_DOWN, TSEMU_SHFL_XOR };
enum { TSEMU_BALLOT, TSEMU_ANY, TSEMU_ALL, TSEMU_SYNCWARP };
enum { TSEMU_COUNT, TSEMU_AND, TSEMU_OR };
#define TSEMU_MAX_DYNAMIC_SHARED (228u << 10)

extern "C" {
extern tsemu_dim3 tsemu_thread_idx, tsemu_block_idx, tsemu_block_dim, tsemu_grid_dim;
extern unsigned char tsemu_dynamic_shared[];
void tsemu_syncthreads(void);
int tsemu_syncthreads_vote(int predicate, int mode);
/* masks name lanes of a warp of 32 (CUDA) or 64 (HIP) */
unsigned long long tsemu_shfl(unsigned long long mask, unsigned long long value, int b,
                              int width, int mode, const char* op);
unsigned long long tsemu_vote(unsigned long long mask, int predicate, int mode, const char* op);
unsigned long long tsemu_activemask(void);
void tsemu_trap(const char* why);
}

#ifndef TSEMU_RUNTIME
/* ---- what kernel code sees --------------------------------------------------------------- */
#include <cstdio>
#include <cstring>
#include <type_traits>

/* NVRTC has no <stdint.h>: generated code may typedef these itself, which C++ allows only with
   the same types, so they are NVRTC's (64-bit as long long). Source that includes <stdint.h>
   gets TSEMU_SYSTEM_STDINT from emulator.py. */
#ifdef TSEMU_SYSTEM_STDINT
#include <stdint.h>
#else
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#endif
#ifndef INT32_MIN
#define INT32_MIN (-2147483647 - 1)
#endif
#ifndef INT32_MAX
#define INT32_MAX 2147483647
#endif
#ifndef UINT32_MAX
#define UINT32_MAX 4294967295u
#endif
#ifndef INT64_MIN
#define INT64_MIN (-9223372036854775807LL - 1)
#endif
#ifndef INT64_MAX
#define INT64_MAX 9223372036854775807LL
#endif
#ifndef UINT64_MAX
#define UINT64_MAX 18446744073709551615ULL
#endif
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif

#define __global__ __attribute__((visibility("default")))   /* the rest is hidden */
#define __device__
#define __host__
#define __constant__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
#define __CUDA_EMU__ 1
#define threadIdx tsemu_thread_idx
#define blockIdx tsemu_block_idx
#define blockDim tsemu_block_dim
#define gridDim tsemu_grid_dim
#ifdef TSEMU_HIP
static constexpr int warpSize = 64;     /* a wavefront of gfx90a */
#else
static constexpr int warpSize = 32;
#endif

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x = 1, unsigned y = 1, unsigned z = 1) : x(x), y(y), z(z) {}
};

/* vector types, aligned as on the GPU (float4 loads of a 16-byte aligned address) */
#define TSEMU_VEC(T, name, a2, a4)                                                              \
  struct __attribute__((aligned(a2))) name##2 { T x, y; };                                     \
  struct name##3 { T x, y, z; };                                                                \
  struct __attribute__((aligned(a4))) name##4 { T x, y, z, w; };                               \
  static inline name##2 make_##name##2(T x, T y) { return {x, y}; }                              \
  static inline name##3 make_##name##3(T x, T y, T z) { return {x, y, z}; }                      \
  static inline name##4 make_##name##4(T x, T y, T z, T w) { return {x, y, z, w}; }
TSEMU_VEC(float, float, 8, 16)
TSEMU_VEC(double, double, 16, 16)
TSEMU_VEC(int, int, 8, 16)
TSEMU_VEC(long long, longlong, 16, 16)
TSEMU_VEC(char, char, 2, 4)
TSEMU_VEC(unsigned char, uchar, 2, 4)
#undef TSEMU_VEC
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return {x, y, z, w};
}

/* ---- math: libm's C functions, declared here (math.h would bring glibc's int64_t), plus the
   float overloads CUDA declares (sqrt(float) is single precision on the GPU) ------------------ */
#define TSEMU_MATH1(fn)                                                                         \
  extern "C" double fn(double) noexcept;                                                        \
  extern "C" float fn##f(float) noexcept;                                                       \
  static inline float fn(float x) { return fn##f(x); }
#define TSEMU_MATH2(fn)                                                                         \
  extern "C" double fn(double, double) noexcept;                                                \
  extern "C" float fn##f(float, float) noexcept;                                                \
  static inline float fn(float x, float y) { return fn##f(x, y); }
TSEMU_MATH1(exp) TSEMU_MATH1(exp2) TSEMU_MATH1(exp10) TSEMU_MATH1(expm1) TSEMU_MATH1(log)
TSEMU_MATH1(log2) TSEMU_MATH1(log10) TSEMU_MATH1(log1p) TSEMU_MATH1(logb) TSEMU_MATH1(sqrt)
TSEMU_MATH1(cbrt) TSEMU_MATH1(sin) TSEMU_MATH1(cos) TSEMU_MATH1(tan) TSEMU_MATH1(asin)
TSEMU_MATH1(acos) TSEMU_MATH1(atan) TSEMU_MATH1(sinh) TSEMU_MATH1(cosh) TSEMU_MATH1(tanh)
TSEMU_MATH1(asinh) TSEMU_MATH1(acosh) TSEMU_MATH1(atanh) TSEMU_MATH1(erf) TSEMU_MATH1(erfc)
TSEMU_MATH1(lgamma) TSEMU_MATH1(tgamma) TSEMU_MATH1(fabs) TSEMU_MATH1(floor) TSEMU_MATH1(ceil)
TSEMU_MATH1(trunc) TSEMU_MATH1(round) TSEMU_MATH1(rint) TSEMU_MATH1(nearbyint)
TSEMU_MATH2(pow) TSEMU_MATH2(atan2) TSEMU_MATH2(fmod) TSEMU_MATH2(remainder) TSEMU_MATH2(fmin)
TSEMU_MATH2(fmax) TSEMU_MATH2(copysign) TSEMU_MATH2(hypot) TSEMU_MATH2(fdim)
TSEMU_MATH2(nextafter)
#undef TSEMU_MATH1
#undef TSEMU_MATH2
extern "C" double fma(double, double, double) noexcept;
extern "C" float fmaf(float, float, float) noexcept;
extern "C" double ldexp(double, int) noexcept;
extern "C" float ldexpf(float, int) noexcept;
extern "C" double frexp(double, int*) noexcept;
extern "C" float frexpf(float, int*) noexcept;
extern "C" double modf(double, double*) noexcept;
extern "C" float modff(float, float*) noexcept;
extern "C" int ilogbf(float) noexcept;
extern "C" int ilogb(double) noexcept;
extern "C" long long llrintf(float) noexcept;
extern "C" long long llrint(double) noexcept;
extern "C" long long llroundf(float) noexcept;
extern "C" long long llround(double) noexcept;
extern "C" void sincosf(float, float*, float*) noexcept;
extern "C" void sincos(double, double*, double*) noexcept;
static inline float fma(float a, float b, float c) { return fmaf(a, b, c); }
static inline float ldexp(float x, int e) { return ldexpf(x, e); }
static inline int abs(int x) { return x < 0 ? -x : x; }
static inline long long abs(long long x) { return x < 0 ? -x : x; }
static inline long long llabs(long long x) { return x < 0 ? -x : x; }
static inline float abs(float x) { return fabsf(x); }
static inline double abs(double x) { return fabs(x); }
static inline bool isnan(float x) { return __builtin_isnan(x); }
static inline bool isnan(double x) { return __builtin_isnan(x); }
static inline bool isinf(float x) { return __builtin_isinf(x); }
static inline bool isinf(double x) { return __builtin_isinf(x); }
static inline bool isfinite(float x) { return __builtin_isfinite(x); }
static inline bool isfinite(double x) { return __builtin_isfinite(x); }
static inline bool signbit(float x) { return __builtin_signbit(x); }
static inline bool signbit(double x) { return __builtin_signbit(x); }

/* min/max for any two arithmetic types, in their common type; floats as fmin/fmax (a NaN
   operand loses), like CUDA's overloads */
template <class A, class B, class T = decltype(A() + B())>
  requires(std::is_arithmetic_v<A> && std::is_arithmetic_v<B>)
static inline T min(A a, B b) {
  if constexpr (std::is_floating_point_v<T>) return __builtin_fmin(T(a), T(b));
  else return T(a) < T(b) ? T(a) : T(b);
}
template <class A, class B, class T = decltype(A() + B())>
  requires(std::is_arithmetic_v<A> && std::is_arithmetic_v<B>)
static inline T max(A a, B b) {
  if constexpr (std::is_floating_point_v<T>) return __builtin_fmax(T(a), T(b));
  else return T(a) > T(b) ? T(a) : T(b);
}

/* intrinsics. The emulator computes the fast approximate ones (__expf, rsqrtf, ...) exactly:
   a test of code that uses them needs a tolerance that covers the GPU's approximation. */
template <class To, class From> static inline To tsemu_bits(From x) {
  static_assert(sizeof(To) == sizeof(From));
  To r;
  __builtin_memcpy(&r, &x, sizeof r);
  return r;
}
static inline float __int_as_float(int x) { return tsemu_bits<float>(x); }
static inline int __float_as_int(float x) { return tsemu_bits<int>(x); }
static inline float __uint_as_float(unsigned x) { return tsemu_bits<float>(x); }
static inline unsigned __float_as_uint(float x) { return tsemu_bits<unsigned>(x); }
static inline double __longlong_as_double(long long x) { return tsemu_bits<double>(x); }
static inline long long __double_as_longlong(double x) { return tsemu_bits<long long>(x); }
static inline int __double2hiint(double x) { return int(tsemu_bits<unsigned long long>(x) >> 32); }
static inline int __double2loint(double x) { return int(tsemu_bits<unsigned long long>(x)); }
static inline double __hiloint2double(int hi, int lo) {
  return tsemu_bits<double>((unsigned long long)(unsigned)hi << 32 | (unsigned)lo);
}
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __drcp_rn(double a) { return 1.0 / a; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __expf(float x) { return expf(x); }
static inline float __exp10f(float x) { return exp10f(x); }
static inline float __logf(float x) { return logf(x); }
static inline float __log2f(float x) { return log2f(x); }
static inline float __log10f(float x) { return log10f(x); }
static inline float __sinf(float x) { return sinf(x); }
static inline float __cosf(float x) { return cosf(x); }
static inline float __tanf(float x) { return tanf(x); }
static inline float __powf(float x, float y) { return powf(x, y); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }
static inline int __float2int_rn(float x) { return (int)rintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline int __float2int_ru(float x) { return (int)ceilf(x); }
static inline long long __float2ll_rn(float x) { return llrintf(x); }
static inline long long __double2ll_rn(double x) { return llrint(x); }
static inline int __double2int_rn(double x) { return (int)rint(x); }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __double2float_rn(double x) { return (float)x; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned long long __brevll(unsigned long long x) {
  unsigned long long r = 0;
  for (int k = 0; k < 64; ++k, x >>= 1) r = r << 1 | (x & 1);
  return r;
}
static inline unsigned __brev(unsigned x) { return unsigned(__brevll(x) >> 32); }
static inline int __mulhi(int a, int b) { return int(((long long)a * b) >> 32); }
static inline unsigned __umulhi(unsigned a, unsigned b) {
  return unsigned(((unsigned long long)a * b) >> 32);
}
static inline int __mul24(int a, int b) { return (a << 8 >> 8) * (b << 8 >> 8); }
static inline unsigned __umul24(unsigned a, unsigned b) {
  return (a & 0xffffffu) * (b & 0xffffffu);
}
template <class T> static inline T __ldg(const T* p) { return *p; }
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __trap(void) { tsemu_trap("the kernel called __trap()"); }

/* ---- barriers, warp shuffles and votes --------------------------------------------------- */
static inline void __syncthreads(void) { tsemu_syncthreads(); }
static inline int __syncthreads_count(int p) { return tsemu_syncthreads_vote(p, TSEMU_COUNT); }
static inline int __syncthreads_and(int p) { return tsemu_syncthreads_vote(p, TSEMU_AND); }
static inline int __syncthreads_or(int p) { return tsemu_syncthreads_vote(p, TSEMU_OR); }
typedef unsigned long long tsemu_mask;
#ifdef TSEMU_HIP
typedef unsigned long long tsemu_lanes;    /* a lane mask as the language returns it */
#else
typedef unsigned tsemu_lanes;
#endif
static inline void __syncwarp(tsemu_mask mask = ~0ull) {
  tsemu_vote(mask, 0, TSEMU_SYNCWARP, "__syncwarp");
}
static inline tsemu_lanes __ballot_sync(tsemu_mask mask, int p) {
  return (tsemu_lanes)tsemu_vote(mask, p, TSEMU_BALLOT, "__ballot_sync");
}
static inline int __any_sync(tsemu_mask mask, int p) {
  return (int)tsemu_vote(mask, p, TSEMU_ANY, "__any_sync");
}
static inline int __all_sync(tsemu_mask mask, int p) {
  return (int)tsemu_vote(mask, p, TSEMU_ALL, "__all_sync");
}
static inline tsemu_lanes __activemask(void) { return (tsemu_lanes)tsemu_activemask(); }

template <class T>
static inline T tsemu_shuffle(tsemu_mask mask, T v, int b, int width, int mode, const char* op) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                "warp shuffles move values of at most 8 bytes");
  unsigned long long bits = 0;
  __builtin_memcpy(&bits, &v, sizeof v);
  bits = tsemu_shfl(mask, bits, b, width, mode, op);
  T r;
  __builtin_memcpy(&r, &bits, sizeof r);
  return r;
}
template <class T> static inline T __shfl_sync(tsemu_mask m, T v, int lane, int width = warpSize) {
  return tsemu_shuffle(m, v, lane, width, TSEMU_SHFL_IDX, "__shfl_sync");
}
template <class T>
static inline T __shfl_up_sync(tsemu_mask m, T v, unsigned d, int width = warpSize) {
  return tsemu_shuffle(m, v, (int)d, width, TSEMU_SHFL_UP, "__shfl_up_sync");
}
template <class T>
static inline T __shfl_down_sync(tsemu_mask m, T v, unsigned d, int width = warpSize) {
  return tsemu_shuffle(m, v, (int)d, width, TSEMU_SHFL_DOWN, "__shfl_down_sync");
}
template <class T>
static inline T __shfl_xor_sync(tsemu_mask m, T v, int lanes, int width = warpSize) {
  return tsemu_shuffle(m, v, lanes, width, TSEMU_SHFL_XOR, "__shfl_xor_sync");
}
#ifdef TSEMU_HIP
/* HIP's unmasked warp operations: the whole wavefront */
#define TSEMU_ALL_LANES 0xffffffffffffffffull
template <class T> static inline T __shfl(T v, int lane, int width = warpSize) {
  return tsemu_shuffle(TSEMU_ALL_LANES, v, lane, width, TSEMU_SHFL_IDX, "__shfl");
}
template <class T> static inline T __shfl_up(T v, unsigned d, int width = warpSize) {
  return tsemu_shuffle(TSEMU_ALL_LANES, v, (int)d, width, TSEMU_SHFL_UP, "__shfl_up");
}
template <class T> static inline T __shfl_down(T v, unsigned d, int width = warpSize) {
  return tsemu_shuffle(TSEMU_ALL_LANES, v, (int)d, width, TSEMU_SHFL_DOWN, "__shfl_down");
}
template <class T> static inline T __shfl_xor(T v, int lanes, int width = warpSize) {
  return tsemu_shuffle(TSEMU_ALL_LANES, v, lanes, width, TSEMU_SHFL_XOR, "__shfl_xor");
}
static inline unsigned long long __ballot(int p) {
  return tsemu_vote(TSEMU_ALL_LANES, p, TSEMU_BALLOT, "__ballot");
}
static inline int __any(int p) { return (int)tsemu_vote(TSEMU_ALL_LANES, p, TSEMU_ANY, "__any"); }
static inline int __all(int p) { return (int)tsemu_vote(TSEMU_ALL_LANES, p, TSEMU_ALL, "__all"); }
#define hipThreadIdx_x threadIdx.x
#define hipBlockIdx_x blockIdx.x
#define hipBlockDim_x blockDim.x
#define hipGridDim_x gridDim.x
#endif

/* ---- atomics: integers only. The fibers of a launch share one OS thread, but the GCC builtins
   keep them atomic should blocks ever run in parallel. Floating-point atomicAdd is refused:
   its result depends on the order threads arrive, which Tessera's numerics contract forbids. */
template <class T> using tsemu_same = std::type_identity_t<T>;
template <class T> static constexpr bool tsemu_int_atomic = std::is_integral_v<T> && sizeof(T) >= 4;
#define TSEMU_NO_FLOAT(name)                                                                    \
  static_assert(tsemu_int_atomic<T>, #name " on a floating-point (or narrow) value: the "        \
                "result would depend on the order threads arrive (Tessera's determinism contract "\
                "forbids it); reduce in a fixed order instead")
template <class T> static inline T atomicAdd(T* p, tsemu_same<T> v) {
  TSEMU_NO_FLOAT(atomicAdd);
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
template <class T> static inline T atomicSub(T* p, tsemu_same<T> v) {
  TSEMU_NO_FLOAT(atomicSub);
  return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);
}
template <class T> static inline T atomicAnd(T* p, tsemu_same<T> v) {
  TSEMU_NO_FLOAT(atomicAnd);
  return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST);
}
template <class T> static inline T atomicOr(T* p, tsemu_same<T> v) {
  TSEMU_NO_FLOAT(atomicOr);
  return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
template <class T> static inline T atomicXor(T* p, tsemu_same<T> v) {
  TSEMU_NO_FLOAT(atomicXor);
  return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST);
}
template <class T> static inline T atomicCAS(T* p, tsemu_same<T> expected, tsemu_same<T> v) {
  TSEMU_NO_FLOAT(atomicCAS);
  __atomic_compare_exchange_n(p, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;    // the old value either way
}
template <class T> static inline T tsemu_update(T* p, T (*f)(T, T), T v) {
  T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (!__atomic_compare_exchange_n(p, &old, f(old, v), false, __ATOMIC_SEQ_CST,
                                      __ATOMIC_SEQ_CST)) {
  }
  return old;
}
template <class T> static inline T atomicMax(T* p, tsemu_same<T> v) {
  TSEMU_NO_FLOAT(atomicMax);
  return tsemu_update<T>(p, [](T a, T b) { return a > b ? a : b; }, v);
}
template <class T> static inline T atomicMin(T* p, tsemu_same<T> v) {
  TSEMU_NO_FLOAT(atomicMin);
  return tsemu_update<T>(p, [](T a, T b) { return a < b ? a : b; }, v);
}
static inline unsigned atomicInc(unsigned* p, unsigned limit) {
  return tsemu_update<unsigned>(
      p, [](unsigned a, unsigned l) { return a >= l ? 0u : a + 1; }, limit);
}
static inline unsigned atomicDec(unsigned* p, unsigned limit) {
  return tsemu_update<unsigned>(
      p, [](unsigned a, unsigned l) { return (a == 0 || a > l) ? l : a - 1; }, limit);
}
template <class T> static inline T atomicExch(T* p, tsemu_same<T> v) {   // floats too, as CUDA
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomicExch moves 4 or 8 bytes");
  T old;
  __atomic_exchange(p, &v, &old, __ATOMIC_SEQ_CST);
  return old;
}
#undef TSEMU_NO_FLOAT

/* a symbol whose address tells emulator.py where the module was loaded */
extern "C" __attribute__((visibility("default"))) void tsemu_module_marker(void) {}

#else /* TSEMU_RUNTIME */
/* ---- the runtime ------------------------------------------------------------------------- */
#include <array>
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <utility>
/* fibers switch with a few x86-64 instructions, or with ucontext (other machines, or
   -DTSEMU_UCONTEXT to test that path) */
#if defined(__x86_64__) && !defined(TSEMU_UCONTEXT)
#define TSEMU_ASM_SWITCH 1
#else
#define TSEMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

extern "C" {
tsemu_dim3 tsemu_thread_idx, tsemu_block_idx, tsemu_block_dim, tsemu_grid_dim;
alignas(4096) unsigned char tsemu_dynamic_shared[TSEMU_MAX_DYNAMIC_SHARED];
}

namespace {
constexpr int kMaxThreads = 1024, kMaxArgs = 64, kFault = 2;
constexpr size_t kStack = 256 << 10;   // per fiber; pages are committed only when touched
enum State { READY, AT_BARRIER, AT_WARP, DONE };

struct Fiber {
  void* sp;                 // saved stack pointer while switched out
  char* stack;              // its mapping: a guard page, then kStack bytes
  tsemu_dim3 idx;
  int warp, lane;
  State state;
  unsigned warp_ops, block_ops;   // collectives done so far: their parity picks the exchange slot
#if !TSEMU_ASM_SWITCH
  ucontext_t ctx;
#endif
};

struct Warp {
  int lanes, arrived, width;
  const char* op;
  unsigned long long value[2][64];
};

struct Launch {
  void* fn;
  int nargs;
  void* args[kMaxArgs];
  int nthreads, warp_size;
  bool reverse;
  Fiber* cur;
  void* scheduler_sp;
  int barrier_arrived, block_vote[2];
  Warp warps[kMaxThreads / 32];
  char* err;
  size_t errlen;
  bool failed, active;
  pthread_t thread;
  sigjmp_buf escape;
#if !TSEMU_ASM_SWITCH
  ucontext_t scheduler_ctx;
#endif
};

Fiber fibers[kMaxThreads];
Launch L;
std::mutex launch_mutex;    // one launch at a time in the process
size_t page_size;

void fail(const char* fmt, ...) {
  if (L.failed) return;
  L.failed = true;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(L.err, L.errlen, fmt, ap);
  va_end(ap);
}

/* ---- fibers: an x86-64 context switch in a few instructions (callee-saved registers, the
   SSE and x87 control words); ucontext elsewhere ---------------------------------------------- */
extern "C" __attribute__((visibility("hidden"))) void tsemu_fiber_main(Fiber* f);
#if TSEMU_ASM_SWITCH
extern "C" void tsemu_swap(void** save_sp, void* to_sp);
extern "C" void tsemu_fiber_entry(void);
asm(R"(
  .pushsection .text
  .globl tsemu_swap
  .hidden tsemu_swap
  .type tsemu_swap,@function
tsemu_swap:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tsemu_swap,.-tsemu_swap
  .globl tsemu_fiber_entry
  .hidden tsemu_fiber_entry
  .type tsemu_fiber_entry,@function
tsemu_fiber_entry:
  movq %r12, %rdi
  call tsemu_fiber_main
  ud2
  .size tsemu_fiber_entry,.-tsemu_fiber_entry
  .popsection
)");

void fiber_start(Fiber& f) {
  // the frame tsemu_swap pops: control words, r15..r12, rbx, rbp, return address. After its
  // ret the stack is 16-byte aligned, as a call expects.
  uintptr_t top = (uintptr_t)(f.stack + page_size + kStack) & ~(uintptr_t)15;
  void** sp = (void**)(top - 80);
  uint64_t control = 0x1f80 | (uint64_t)0x037f << 32;   // round to nearest, no FTZ/DAZ: as CUDA
  sp[0] = (void*)control;
  for (int k = 1; k < 7; ++k) sp[k] = nullptr;
  sp[4] = &f;                                            // r12: the argument
  sp[7] = (void*)tsemu_fiber_entry;
  f.sp = sp;
}
void switch_in(Fiber& f) { tsemu_swap(&L.scheduler_sp, f.sp); }
void switch_out(Fiber& f) { tsemu_swap(&f.sp, L.scheduler_sp); }
#else
void fiber_trampoline(unsigned hi, unsigned lo) {
  tsemu_fiber_main((Fiber*)((uintptr_t)hi << 32 | lo));
}
void fiber_start(Fiber& f) {
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack + page_size;
  f.ctx.uc_stack.ss_size = kStack;
  f.ctx.uc_link = nullptr;
  uintptr_t p = (uintptr_t)&f;
  makecontext(&f.ctx, (void (*)())fiber_trampoline, 2, (unsigned)(p >> 32), (unsigned)p);
}
void switch_in(Fiber& f) { swapcontext(&L.scheduler_ctx, &f.ctx); }
void switch_out(Fiber& f) { swapcontext(&f.ctx, &L.scheduler_ctx); }
#endif

/* calling the kernel: every argument is pointer-sized (pointers, or integers passed by value) */
template <size_t... I> void call_kernel(void* fn, void** a, std::index_sequence<I...>) {
  using Kernel = void (*)(decltype((void)I, (void*)nullptr)...);
  reinterpret_cast<Kernel>(fn)(a[I]...);
}
template <size_t... N> constexpr auto make_callers(std::index_sequence<N...>) {
  using Caller = void (*)(void*, void**);
  return std::array<Caller, sizeof...(N)>{
      +[](void* fn, void** a) { call_kernel(fn, a, std::make_index_sequence<N>{}); }...};
}
const auto callers = make_callers(std::make_index_sequence<kMaxArgs + 1>{});

/* the running fiber waits (in a collective, or for ever once it failed) and gives the OS thread
   back to the scheduler; a collective's last arrival releases the others, itself included */
void wait_in(State s) { L.cur->state = s; }
void park() { switch_out(*L.cur); }
[[noreturn]] void stop() {
  L.cur->state = DONE;
  park();
  __builtin_trap();
}
}  // namespace

extern "C" void tsemu_fiber_main(Fiber* f) {
  callers[L.nargs](L.fn, L.args);
  f->state = DONE;
  switch_out(*f);
  __builtin_trap();     // a returned fiber is never resumed
}

/* ---- collectives ------------------------------------------------------------------------- */
namespace {
void release(State waiting, int first, int count) {
  for (int i = first; i < first + count; ++i)
    if (fibers[i].state == waiting) fibers[i].state = READY;
}

void block_barrier() {
  wait_in(AT_BARRIER);
  if (++L.barrier_arrived == L.nthreads) {
    L.barrier_arrived = 0;
    release(AT_BARRIER, 0, L.nthreads);
  }
  park();
}

/* a warp collective: deposit this lane's value, wait for every lane, return the slot array.
   Two slots by parity: a lane that runs ahead writes the other one, and cannot run two ahead. */
unsigned long long lanes_mask(int lanes) { return lanes == 64 ? ~0ull : (1ull << lanes) - 1; }

unsigned long long* warp_exchange(unsigned long long mask, unsigned long long value, int width,
                                  const char* op) {
  Fiber& f = *L.cur;
  Warp& w = L.warps[f.warp];
  unsigned long long full = lanes_mask(w.lanes);
  if ((mask & full) != full) {
    fail("%s with mask 0x%llx in warp %d (lanes 0..%d): the emulator runs warp operations only "
         "over the whole warp", op, mask, f.warp, w.lanes - 1);
    stop();
  }
  if (w.arrived == 0) {
    w.op = op;
    w.width = width;
  } else if (strcmp(w.op, op) != 0 || w.width != width) {
    fail("lanes of warp %d disagree: lane %d calls %s (width %d) while others wait in %s "
         "(width %d)", f.warp, f.lane, op, width, w.op, w.width);
    stop();
  }
  int slot = f.warp_ops++ & 1;
  w.value[slot][f.lane] = value;
  wait_in(AT_WARP);
  if (++w.arrived == w.lanes) {
    w.arrived = 0;
    release(AT_WARP, f.warp * L.warp_size, w.lanes);
  }
  park();
  return w.value[slot];
}
}  // namespace

extern "C" void tsemu_syncthreads(void) { block_barrier(); }

extern "C" int tsemu_syncthreads_vote(int predicate, int mode) {
  int slot = L.cur->block_ops++ & 1;
  if (L.barrier_arrived == 0) L.block_vote[slot] = 0;   // the first to arrive resets it
  L.block_vote[slot] += predicate != 0;
  block_barrier();
  int n = L.block_vote[slot];
  return mode == TSEMU_COUNT ? n : mode == TSEMU_AND ? n == L.nthreads : n > 0;
}

extern "C" unsigned long long tsemu_shfl(unsigned long long mask, unsigned long long value,
                                         int b, int width, int mode, const char* op) {
  if (width <= 0 || width > L.warp_size || (width & (width - 1))) {
    fail("%s with width %d: the width must be a power of two up to %d", op, width, L.warp_size);
    stop();
  }
  unsigned long long* v = warp_exchange(mask, value, width, op);
  // PTX shfl.sync: b counts modulo the warp; lanes form segments of `width`; a source outside
  // the caller's segment (or below it, for up) gives the caller its own value
  b &= L.warp_size - 1;
  int lane = L.cur->lane, lo = lane & ~(width - 1), hi = lo + width - 1, j = lane;
  switch (mode) {
    case TSEMU_SHFL_IDX: j = lo + (b & (width - 1)); break;
    case TSEMU_SHFL_UP: j = lane - b >= lo ? lane - b : lane; break;
    case TSEMU_SHFL_DOWN: j = lane + b <= hi ? lane + b : lane; break;
    case TSEMU_SHFL_XOR: j = (lane ^ b) <= hi ? lane ^ b : lane; break;
  }
  if (j >= L.warps[L.cur->warp].lanes) {
    fail("%s: lane %d of warp %d reads lane %d, which does not exist (blockDim %d)", op, lane,
         L.cur->warp, j, L.nthreads);
    stop();
  }
  return v[j];
}

extern "C" unsigned long long tsemu_vote(unsigned long long mask, int predicate, int mode,
                                         const char* op) {
  unsigned long long* v = warp_exchange(mask, predicate != 0, L.warp_size, op);
  unsigned long long ballot = 0;
  int lanes = L.warps[L.cur->warp].lanes;
  for (int j = 0; j < lanes; ++j) ballot |= v[j] << j;
  if (mode == TSEMU_BALLOT) return ballot;
  return mode == TSEMU_ANY ? ballot != 0 : ballot == lanes_mask(lanes);
}

/* every lane of the warp: threads never diverge here, and a lane-dependent answer would make
   the result depend on the order fibers run */
extern "C" unsigned long long tsemu_activemask(void) {
  return lanes_mask(L.warps[L.cur->warp].lanes);
}

extern "C" void tsemu_trap(const char* why) {
  fail("%s in block (%u,%u,%u) thread (%u,%u,%u)", why, tsemu_block_idx.x, tsemu_block_idx.y,
       tsemu_block_idx.z, L.cur->idx.x, L.cur->idx.y, L.cur->idx.z);
  stop();
}

/* ---- faults: segfaults, traps and the time limit end the launch with a message ----------- */
namespace {
const int kTimerSignal = SIGRTMIN + 7;
const int kFaultSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
struct sigaction saved_actions[5];
alignas(16) char alt_stack[64 << 10];
stack_t saved_alt_stack;
double time_limit;

void on_signal(int sig, siginfo_t* info, void* context) {
  if (!L.active || !pthread_equal(pthread_self(), L.thread)) {
    if (sig == kTimerSignal) return;   // a late tick
    // another thread's fault: hand it to the handler we replaced, by running the instruction again
    for (int k = 0; k < 4; ++k)
      if (kFaultSignals[k] == sig) sigaction(sig, &saved_actions[k], nullptr);
    return;
  }
  char where[96] = "outside any thread";
  if (L.cur)
    snprintf(where, sizeof where, "block (%u,%u,%u) thread (%u,%u,%u)", tsemu_block_idx.x,
             tsemu_block_idx.y, tsemu_block_idx.z, L.cur->idx.x, L.cur->idx.y, L.cur->idx.z);
  if (sig == kTimerSignal) {
    fail("the launch ran past its time limit of %g s (an endless loop?); stopped in %s",
         time_limit, where);
  } else {
    const char* access = sig == SIGSEGV || sig == SIGBUS ? "access" : "instruction";
#if defined(__x86_64__)
    if (sig == SIGSEGV)   // the page fault's error code says whether it was a write
      access = (((ucontext_t*)context)->uc_mcontext.gregs[REG_ERR] & 2) ? "write" : "read";
#endif
    char* addr = (char*)info->si_addr;
    bool overflow = false;
    for (int i = 0; i < L.nthreads; ++i)
      overflow |= addr >= fibers[i].stack && addr < fibers[i].stack + page_size;
    if (overflow)
      fail("stack overflow in %s (%zu KiB per thread): large local arrays?", where, kStack >> 10);
    else
      fail("%s (%s at address %p) in %s", strsignal(sig), access, (void*)addr, where);
  }
  siglongjmp(L.escape, 1);
}

timer_t timer;
bool timed;                 // a timer exists (armed once the escape point is set)

void install_handlers() {
  stack_t alt = {};
  alt.ss_sp = alt_stack;
  alt.ss_size = sizeof alt_stack;
  sigaltstack(&alt, &saved_alt_stack);
  struct sigaction sa = {};
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int k = 0; k < 4; ++k) sigaction(kFaultSignals[k], &sa, &saved_actions[k]);
  sigaction(kTimerSignal, &sa, &saved_actions[4]);
  struct sigevent ev = {};
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = kTimerSignal;
  ev._sigev_un._tid = gettid();
  timed = time_limit > 0 && timer_create(CLOCK_MONOTONIC, &ev, &timer) == 0;
}

void arm_timer() {
  if (!timed) return;
  struct itimerspec when = {};
  when.it_value.tv_sec = (time_t)time_limit;
  when.it_value.tv_nsec = (long)((time_limit - (double)(time_t)time_limit) * 1e9) + 1;
  timer_settime(timer, 0, &when, nullptr);
}

void remove_handlers() {
  if (timed) {
    // block the tick, delete the timer, drop a tick already pending, then restore
    sigset_t tick, old;
    sigemptyset(&tick);
    sigaddset(&tick, kTimerSignal);
    pthread_sigmask(SIG_BLOCK, &tick, &old);
    timer_delete(timer);
    struct timespec zero = {};
    while (sigtimedwait(&tick, nullptr, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  for (int k = 0; k < 4; ++k) sigaction(kFaultSignals[k], &saved_actions[k], nullptr);
  sigaction(kTimerSignal, &saved_actions[4], nullptr);
  sigaltstack(&saved_alt_stack, nullptr);
}

/* ---- running the blocks ------------------------------------------------------------------ */
bool ensure_stacks(int n) {
  for (int i = 0; i < n; ++i) {
    if (fibers[i].stack) continue;
    void* m = mmap(nullptr, page_size + kStack, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) return false;
    mprotect(m, page_size, PROT_NONE);     // overflow faults instead of corrupting a neighbour
    fibers[i].stack = (char*)m;
  }
  return true;
}

void describe_deadlock() {
  int at_barrier = 0, done = 0;
  for (int i = 0; i < L.nthreads; ++i) {
    at_barrier += fibers[i].state == AT_BARRIER;
    done += fibers[i].state == DONE;
  }
  char warp_note[256] = "";
  for (int i = 0; i < L.nthreads; ++i) {
    if (fibers[i].state != AT_WARP) continue;
    const Warp& w = L.warps[fibers[i].warp];
    snprintf(warp_note, sizeof warp_note, "; in warp %d, %d of %d lanes wait in %s",
             fibers[i].warp, w.arrived, w.lanes, w.op);
    break;
  }
  fail("deadlock in block (%u,%u,%u) of %d threads: %d wait at a block barrier, %d have "
       "returned%s (a barrier or warp operation that not every thread reaches: CUDA requires "
       "all threads of the block, or all lanes of the warp)", tsemu_block_idx.x,
       tsemu_block_idx.y, tsemu_block_idx.z, L.nthreads, at_barrier, done, warp_note);
}

bool run_block(const tsemu_dim3& b) {
  const int n = L.nthreads;
  for (int i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.idx = {i % tsemu_block_dim.x, i / tsemu_block_dim.x % tsemu_block_dim.y,
             i / (tsemu_block_dim.x * tsemu_block_dim.y)};
    f.warp = i / L.warp_size;
    f.lane = i % L.warp_size;
    f.state = READY;
    f.warp_ops = f.block_ops = 0;
    fiber_start(f);
  }
  for (int w = 0; w * L.warp_size < n; ++w) {
    L.warps[w].lanes = n - w * L.warp_size < L.warp_size ? n - w * L.warp_size : L.warp_size;
    L.warps[w].arrived = 0;
  }
  L.barrier_arrived = 0;
  tsemu_block_idx = b;
  for (int done = 0; done < n;) {
    bool ran = false;
    for (int k = 0; k < n; ++k) {
      Fiber& f = fibers[L.reverse ? n - 1 - k : k];
      if (f.state != READY) continue;
      L.cur = &f;
      tsemu_thread_idx = f.idx;
      switch_in(f);
      L.cur = nullptr;
      if (L.failed) return false;
      ran = true;
      done += f.state == DONE;
    }
    if (!ran) {
      describe_deadlock();
      return false;
    }
  }
  return true;
}

bool run_blocks(char* const* shared, const size_t* shared_bytes, int nshared,
                size_t dynamic_bytes) {
  const tsemu_dim3 g = tsemu_grid_dim;
  const long long blocks = (long long)g.x * g.y * g.z;
  for (long long k = 0; k < blocks; ++k) {
    long long i = L.reverse ? blocks - 1 - k : k;
    // shared memory starts poisoned in every block: a read of a slot nobody wrote is NaN / -1
    for (int v = 0; v < nshared; ++v) memset(shared[v], 0xff, shared_bytes[v]);
    if (dynamic_bytes) memset(tsemu_dynamic_shared, 0xff, dynamic_bytes);
    tsemu_dim3 b = {(unsigned)(i % g.x), (unsigned)(i / g.x % g.y), (unsigned)(i / g.x / g.y)};
    if (!run_block(b)) return false;
  }
  return true;
}
}  // namespace

/* Run one launch. Returns 0, or nonzero with a message in err. */
extern "C" int tsemu_launch(void* fn, int nargs, void** args, const unsigned* grid,
                            const unsigned* block, size_t dynamic_bytes, char* const* shared,
                            const size_t* shared_bytes, int nshared, int warp_size,
                            int reverse, double seconds, char* err, size_t errlen) {
  std::lock_guard<std::mutex> lock(launch_mutex);
  page_size = (size_t)sysconf(_SC_PAGESIZE);
  L.err = err;
  L.errlen = errlen;
  L.failed = false;
  err[0] = 0;
  long long threads = (long long)block[0] * block[1] * block[2];
  if (nargs < 0 || nargs > kMaxArgs || threads < 1 || threads > kMaxThreads ||
      dynamic_bytes > TSEMU_MAX_DYNAMIC_SHARED || (warp_size != 32 && warp_size != 64)) {
    fail("bad launch: %d arguments (at most %d), %lld threads per block (1 to %d), %zu bytes "
         "of dynamic shared memory (at most %u), warps of %d (32 or 64)", nargs, kMaxArgs,
         threads, kMaxThreads, dynamic_bytes, TSEMU_MAX_DYNAMIC_SHARED, warp_size);
    return 1;
  }
  if (!ensure_stacks((int)threads)) {
    fail("cannot map %lld fiber stacks", threads);
    return 1;
  }
  L.fn = fn;
  L.nargs = nargs;
  for (int k = 0; k < nargs; ++k) L.args[k] = args[k];
  L.nthreads = (int)threads;
  L.warp_size = warp_size;
  L.reverse = reverse != 0;
  L.cur = nullptr;
  tsemu_block_dim = {block[0], block[1], block[2]};
  tsemu_grid_dim = {grid[0], grid[1], grid[2]};
  time_limit = seconds;
  L.thread = pthread_self();
  int status = kFault;
  install_handlers();
  L.active = true;
  if (sigsetjmp(L.escape, 1) == 0) {
    arm_timer();
    status = run_blocks(shared, shared_bytes, nshared, dynamic_bytes) ? 0 : 1;
  }
  L.active = false;
  L.cur = nullptr;
  remove_handlers();
  return status;
}

/* ---- device memory between guard pages ---------------------------------------------------
   [guard page][slack, 0xff][data, 256-byte aligned][slack < 256 bytes, 0xff][guard page]:
   an access up to a page past either end faults, or lands in the slack, which tsemu_damaged
   checks. */
extern "C" void* tsemu_alloc(size_t nbytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t body = (nbytes + page - 1) / page * page;
  size_t rounded = (nbytes + 255) / 256 * 256;
  char* base = (char*)mmap(nullptr, body + 2 * page, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == (char*)MAP_FAILED) return nullptr;
  mprotect(base, page, PROT_NONE);
  mprotect(base + page + body, page, PROT_NONE);
  memset(base + page, 0xff, body);
  return base + page + body - rounded;
}

extern "C" void tsemu_free(void* data, size_t nbytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t body = (nbytes + page - 1) / page * page;
  size_t rounded = (nbytes + 255) / 256 * 256;
  munmap((char*)data - (body - rounded) - page, body + 2 * page);
}

/* The first slack byte that is no longer 0xff, as an offset from the data (negative: before
   it), with *damaged = 1; the slack is made whole again for the next launch. */
extern "C" long long tsemu_damaged(void* data, size_t nbytes, int* damaged) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t body = (nbytes + page - 1) / page * page;
  size_t rounded = (nbytes + 255) / 256 * 256;
  unsigned char* d = (unsigned char*)data;
  unsigned char *lead = d - (body - rounded), *end = d + nbytes, *first = nullptr;
  for (unsigned char* p = lead; p < d && !first; ++p)
    if (*p != 0xff) first = p;
  for (unsigned char* p = end; p < d + rounded && !first; ++p)
    if (*p != 0xff) first = p;
  *damaged = first != nullptr;
  if (!first) return 0;
  memset(lead, 0xff, (size_t)(d - lead));
  memset(end, 0xff, (size_t)(d + rounded - end));
  return (long long)(first - d);
}
#endif /* TSEMU_RUNTIME */
#endif /* TSEMU_CUDA_EMU_H */
