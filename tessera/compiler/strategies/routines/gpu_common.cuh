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

/* the 16-bit conversions: the CPU's text (half.h), on these primitives */
static __device__ __forceinline__ float tsg_bits_f32(unsigned u) { return __uint_as_float(u); }
static __device__ __forceinline__ unsigned tsg_f32_bits(float f) { return __float_as_uint(f); }
{HALF}

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

