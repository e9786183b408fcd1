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

