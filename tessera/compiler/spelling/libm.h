/* Our own transcendentals: float32 ts_expf, ts_tanhf, ts_erff, ts_logf and float64 ts_exp,
   ts_tanh, ts_erf (ts_log is still the C library's log), for every C-style target.

   This file is read by tessera/compiler/spelling/libm.py, not included: each line
   "// ---- NAME (needs A, B)" begins a chunk that runs to the next such line, and a program's
   source holds each chunk it needs once, after the chunks that one needs (this comment, before
   the first chunk, is never emitted). The source that includes them defines TS_INLINE (static
   inline) and includes <math.h>, <stdint.h> and <string.h> (memcpy), or the target's own.

   Why: libm calls stop gcc from vectorising a `#pragma omp simd` loop, and libm differs between
   targets. These functions are branch-free (selects through bit masks), portable C (no
   intrinsics: the same text is CUDA's and HIP's), with every FMA written as fmaf/fma (we compile
   with -ffp-contract=off) and bit tricks through memcpy. They are pure per-element arithmetic
   on correctly rounded IEEE operations (+ - * /, fma, rint), so a result never depends on
   vector versus scalar execution, thread count or target. Every product that feeds a plain
   addition is exact (a power-of-two scaling), so a compiler that contracts a*b+c into an fma by
   default (nvcc) computes the same values.

   Error bounds (each chunk's comment says how it was measured; tests/ops/test_math_accuracy.py
   asserts them on dense sweeps, random inputs and the special values):

       float32  ts_expf 0.61 ulp   ts_tanhf 0.76 ulp   ts_erff 0.99 ulp   ts_logf 0.92 ulp
       float64  ts_exp  0.63 ulp   ts_tanh  0.80 ulp   ts_erf  1.02 ulp   (log: libm, see ts_log)

   measured against a float64 reference over every float32 input, and against a long double
   reference over about 10^8 float64 inputs. Subnormal results are produced gradually (never
   flushed to zero), within 0.77 ulp of the subnormal spacing; no intermediate goes subnormal
   otherwise, so there is no slow path. Special values: NaN -> NaN; exp(+inf) = inf,
   exp(-inf) = 0, overflow -> inf, large negative -> 0; tanh(+-inf) = +-1, erf(+-inf) = +-1,
   tanh and erf odd (so -0 -> -0); log(0) = -inf, log(x < 0) = NaN, log(inf) = inf.

   The polynomial coefficients are near-minimax fits (Lawson's iteratively reweighted least
   squares against mpmath values, coefficients rounded to the working precision one at a time
   with a refit of the rest), except ts_exp's, which are the Taylor coefficients 1/k!.

   How the pieces are built (float32 and float64 alike, float64 with more terms):
   - ts_self / ts_sel: c ? a : b between float values through bit masks. gcc turns a float
     select inside a loop into a branch, and without -fno-trapping-math (which we cannot use, see
     the README) a loop with a branch vectorises only with AVX-512's masked instructions: on AVX2
     and NEON it stays scalar. A mask select is the same value bit for bit, and vectorises on
     every ISA.
   - exp's argument reduction and polynomial, which tanh reuses for e^(-2|x|): n = rint(v / ln2),
     r + er = v - n ln2 (ln2 in two parts, er the rounding error of r, n ln2hi exact), and
     c = e^(r + er) - 1 - r = r^2 P(r) + er (1 + r).
   - exp's tail: 1 + r added exactly in two parts (the mantissa is rounded once), then scaled by
     2^n1 2^n2 (n = n1 + n2, exponent bits built directly, no >> of a negative int) so that
     neither factor overflows; NaN kept.
   - tanh's tail: E = 2^n (1 + q) in two parts, (1 - E) / (1 + E) with one correction step from
     the quotient's residual; odd, NaN kept.
   - The integer value of n (an integral float of magnitude below 2^22): for float a plain
     (int32_t) cast, which vectorises; for double it is read from the bits of n + 1.5 * 2^52
     (ts_int_of, exact): AVX2 has no double -> int64 conversion, so a plain (int64_t) cast keeps
     the whole loop scalar there. */

// ---- ts_self
/* ts_self(c, a, b) = c ? a : b for float, without a branch (c is 0 or 1) */
TS_INLINE float ts_self(uint32_t c, float a, float b) {
  uint32_t m = -c, ua, ub;
  memcpy(&ua, &a, sizeof ua);
  memcpy(&ub, &b, sizeof ub);
  ua = (ua & m) | (ub & ~m);
  memcpy(&a, &ua, sizeof a);
  return a;
}

// ---- ts_expf (needs ts_self)
/* ts_expf(x) = e^x.  Max error 0.61 ulp (every float32 input, float64 reference).
   x = n ln2 + r, n = rint(x / ln2), |r| <= ln2/2, ln2 in two parts and the rounding error of r
   kept (er).  e^r = 1 + r + r^2 P(r) + er (1 + r), P of degree 5; 1 + r is added exactly in
   two parts, so the mantissa is rounded once, then scaled by 2^n1 2^n2 (n = n1 + n2, exponent
   bits built directly) so neither factor overflows.  Subnormal results are gradual (rounded
   twice: 0.76 ulp of the subnormal spacing); x < -104 gives +0, x > 89 gives +inf. */
TS_INLINE float ts_expf(float x) {
  float xc = ts_self(x > -104.0f, x, -104.0f);     /* NaN goes to -104; x is returned at the end */
  xc = ts_self(xc < 89.0f, xc, 89.0f);
  float n = rintf(xc * 1.44269502f);
  float r1 = fmaf(n, -0.693145752f, xc);        /* exact */
  float r = fmaf(n, -1.42860677e-06f, r1);
  float er = fmaf(n, -1.42860677e-06f, r1 - r);
  float p = 0.000199505521f;
  p = fmaf(p, r, 0.0013933084f);
  p = fmaf(p, r, 0.00833320152f);
  p = fmaf(p, r, 0.0416664854f);
  p = fmaf(p, r, 0.166666672f);
  p = fmaf(p, r, 0.5f);
  float c = fmaf(r * r, p, fmaf(er, r, er));
  float hi = 1.0f + r;
  float lo = (1.0f - hi) + r;                 /* 1 + r = hi + lo exactly */
  float m = hi + (lo + c);
  int32_t ni = (int32_t)n;                    /* n1 = floor(n/2) = h - 128 */
  uint32_t h = (uint32_t)(ni + 256) >> 1;
  uint32_t b1 = (h - 1u) << 23, b2 = (uint32_t)(ni + 255 - (int32_t)h) << 23;
  float s1, s2;
  memcpy(&s1, &b1, sizeof s1);
  memcpy(&s2, &b2, sizeof s2);
  float y = m * s1 * s2;
  return ts_self(x == x, y, x);
}

// ---- ts_tanhf (needs ts_self)
/* ts_tanhf(x) = tanh(x).  Max error 0.76 ulp (every float32 input, float64 reference).
   |x| < 2^-6: |x| - |x|^3/3 + 2|x|^5/15.  Otherwise tanh|x| = (1 - E) / (1 + E) with
   E = e^(-2|x|) = 2^n (1 + q) reduced as in ts_expf and carried in two parts (q too), so the
   numerator and denominator are nearly exact; the quotient gets one correction step from its
   residual.  |x| is clamped to 10 (tanh rounds to 1 from 9.01): nothing goes subnormal or
   infinite.  tanh(+-inf) = +-1, odd by construction (copysignf: tanh(-0) = -0). */
TS_INLINE float ts_tanhf(float x) {
  float a = fabsf(x);
  float a2 = a * a;
  float small = fmaf(a * a2, fmaf(a2, 0.13333334f, -0.33333334f), a);
  float u = ts_self(a < 10.0f, -2.0f * a, -20.0f);   /* NaN goes to -20 as well */
  float n = rintf(u * 1.44269502f);
  float r1 = fmaf(n, -0.693145752f, u);        /* exact */
  float r = fmaf(n, -1.42860677e-06f, r1);
  float er = fmaf(n, -1.42860677e-06f, r1 - r);
  float p = 0.000199505521f;
  p = fmaf(p, r, 0.0013933084f);
  p = fmaf(p, r, 0.00833320152f);
  p = fmaf(p, r, 0.0416664854f);
  p = fmaf(p, r, 0.166666672f);
  p = fmaf(p, r, 0.5f);
  float c = fmaf(r * r, p, fmaf(er, r, er));
  float qh = r + c, ql = c - (qh - r);        /* e^(r + er) - 1 = qh + ql */
  uint32_t b = (uint32_t)((int32_t)n + 127) << 23;
  float s;
  memcpy(&s, &b, sizeof s);
  float sq = s * qh;
  float eh = s + sq, el = fmaf(s, ql, (s - eh) + sq);   /* E = eh + el */
  float nh = 1.0f - eh, nl = ((1.0f - nh) - eh) - el;  /* 1 - E = nh + nl */
  float dh = 1.0f + eh, dl = ((1.0f - dh) + eh) + el;  /* 1 + E = dh + dl */
  float rc = 1.0f / dh;
  float t0 = nh * rc;
  float t = fmaf(fmaf(-t0, dh, nh) + fmaf(-t0, dl, nl), rc, t0);
  t = copysignf(ts_self(a < 0.015625f, small, t), x);
  return ts_self(x == x, t, x);
}

// ---- ts_erff (needs ts_self, ts_expf)
/* ts_erff(x) = erf(x); needs ts_expf.  Max error 0.99 ulp (every float32 input, float64
   reference).  |x| < 1: x + x P(x^2), P of degree 6 fitted to erf(x)/x - 1.  Above:
   1 - e^(-x^2) Q(|x| - 2.5), Q of degree 8 fitted to erfc(x) e^(x^2) on [1, 4] for absolute
   error in erfc; x^2 = h + l exactly and e^(-x^2) = e^(-h) (1 - l), so the square loses
   nothing.  |x| is clamped to 4 (erf rounds to 1 from 3.92): nothing goes subnormal.
   erf(+-inf) = +-1, odd by construction (erf(-0) = -0). */
TS_INLINE float ts_erff(float x) {
  float a = fabsf(x);
  float x2 = x * x;
  float p = 7.80690316e-05f;
  p = fmaf(p, x2, -0.00079978531f);
  p = fmaf(p, x2, 0.0051871622f);
  p = fmaf(p, x2, -0.0268533472f);
  p = fmaf(p, x2, 0.112835787f);
  p = fmaf(p, x2, -0.37612626f);
  p = fmaf(p, x2, 0.128379166f);
  float small = fmaf(x, p, x);
  float ac = ts_self(a < 4.0f, a, 4.0f);           /* NaN goes to 4 as well */
  float v = ac - 2.5f;                        /* exact */
  float q = 0.000107027117f;
  q = fmaf(q, v, 0.000225925367f);
  q = fmaf(q, v, 0.000544652285f);
  q = fmaf(q, v, -0.000660728663f);
  q = fmaf(q, v, 0.00230158982f);
  q = fmaf(q, v, -0.00813310221f);
  q = fmaf(q, v, 0.0249144733f);
  q = fmaf(q, v, -0.0743421242f);
  q = fmaf(q, v, 0.210807621f);
  float h = ac * ac;
  float l = fmaf(ac, ac, -h);
  float big = copysignf(fmaf(-ts_expf(-h), fmaf(-l, q, q), 1.0f), x);
  float y = ts_self(a < 1.0f, small, big);
  return ts_self(x == x, y, x);
}

// ---- ts_logf
/* ts_logf(x) = ln x.  Max error 0.92 ulp (every float32 input, float64 reference).
   x = 2^k m with m in [sqrt(1/2), sqrt(2)) from the bits (subnormal x scaled by 2^23 first);
   f = m - 1 is exact, ln m = f + f^2 P(f) with P of degree 8, ln x = k ln2 + ln m with ln2
   in two parts.  log(+-0) = -inf, log(x < 0) = NaN, log(+inf) = +inf. */
TS_INLINE float ts_logf(float x) {
  /* no selects between float values, no && : gcc makes those branches, and a loop with a
     branch does not vectorise without -fno-trapping-math. Integer arithmetic and bit masks. */
  uint32_t tiny = x < 1.17549435e-38f;
  uint32_t scb = 0x3f800000u + tiny * (0x4b000000u - 0x3f800000u);   /* the scale: 1 or 2^23 */
  float scale;
  memcpy(&scale, &scb, sizeof scale);
  float xs = x * scale;
  uint32_t ix;
  memcpy(&ix, &xs, sizeof ix);
  int32_t k = (int32_t)((ix >> 23) & 255u) - 127 - 23 * (int32_t)tiny;
  uint32_t im = (ix & 0x007fffffu) | 0x3f800000u;
  uint32_t big = im > 0x3fb504f3u;                     /* m > 1.41421354f */
  im -= big << 23;                                     /* m / 2, exactly */
  k += (int32_t)big;
  float m;
  memcpy(&m, &im, sizeof m);
  float f = m - 1.0f;
  float p = -0.0762458667f;
  p = fmaf(p, f, 0.129145861f);
  p = fmaf(p, f, -0.132470921f);
  p = fmaf(p, f, 0.141805992f);
  p = fmaf(p, f, -0.166084528f);
  p = fmaf(p, f, 0.200020134f);
  p = fmaf(p, f, -0.250016093f);
  p = fmaf(p, f, 0.333333254f);
  p = fmaf(p, f, -0.499999881f);
  float kf = (float)k;
  float y = fmaf(f * f, p, fmaf(kf, 1.42860677e-06f, f));
  y = fmaf(kf, 0.693145752f, y);
  /* x > 0 finite: y; x = +-0: -inf; x < 0: NaN; +inf and NaN: x */
  uint32_t fin = -(uint32_t)(x < INFINITY), zero = -(uint32_t)(x == 0.0f);
  uint32_t ok = -(uint32_t)(x > 0.0f) & fin, xb, yb;
  memcpy(&xb, &x, sizeof xb);
  memcpy(&yb, &y, sizeof yb);
  uint32_t special = (0x7fc00000u & fin) | (xb & ~fin);
  special = (0xff800000u & zero) | (special & ~zero);
  yb = (yb & ok) | (special & ~ok);
  memcpy(&y, &yb, sizeof y);
  return y;
}

// ---- ts_sel
/* ts_sel(c, a, b) = c ? a : b for double, without a branch (c is 0 or 1) */
TS_INLINE double ts_sel(uint64_t c, double a, double b) {
  uint64_t m = -c, ua, ub;
  memcpy(&ua, &a, sizeof ua);
  memcpy(&ub, &b, sizeof ub);
  ua = (ua & m) | (ub & ~m);
  memcpy(&a, &ua, sizeof a);
  return a;
}
/* ts_int_of(v) = (int64_t)v for an integral v with |v| < 2^51, by integer arithmetic on the
   bits of v + 1.5 * 2^52 (exact); AVX2 has no vector double -> int64 conversion */
TS_INLINE int64_t ts_int_of(double v) {
  double t = v + 6755399441055744.0;
  uint64_t b;
  memcpy(&b, &t, sizeof b);
  return (int64_t)(b - 0x4338000000000000u);
}

// ---- ts_exp (needs ts_sel)
/* ts_exp(x) = e^x for double, as ts_expf; P is the Taylor polynomial (1/k!, to r^13:
   truncation 4e-18).  Max error 0.63 ulp (10^8 inputs, long double reference).  Subnormal
   results gradual (0.77 ulp of the subnormal spacing); x < -746 gives +0, x > 710 gives +inf. */
TS_INLINE double ts_exp(double x) {
  double xc = ts_sel(x > -746.0, x, -746.0);      /* NaN goes to -746 */
  xc = ts_sel(xc < 710.0, xc, 710.0);
  double n = rint(xc * 1.4426950408889634);
  double r1 = fma(n, -0.6931471805598903, xc);        /* exact */
  double r = fma(n, -5.497923018708371e-14, r1);
  double er = fma(n, -5.497923018708371e-14, r1 - r);
  double p = 1.6059043836821613e-10;
  p = fma(p, r, 2.08767569878681e-09);
  p = fma(p, r, 2.505210838544172e-08);
  p = fma(p, r, 2.755731922398589e-07);
  p = fma(p, r, 2.7557319223985893e-06);
  p = fma(p, r, 2.48015873015873e-05);
  p = fma(p, r, 0.0001984126984126984);
  p = fma(p, r, 0.001388888888888889);
  p = fma(p, r, 0.008333333333333333);
  p = fma(p, r, 0.041666666666666664);
  p = fma(p, r, 0.16666666666666666);
  p = fma(p, r, 0.5);
  double c = fma(r * r, p, fma(er, r, er));
  double hi = 1.0 + r;
  double lo = (1.0 - hi) + r;                 /* 1 + r = hi + lo exactly */
  double m = hi + (lo + c);
  int64_t ni = ts_int_of(n);                    /* n1 = floor(n/2) = h - 1024 */
  uint64_t h = (uint64_t)(ni + 2048) >> 1;
  uint64_t b1 = (h - 1u) << 52, b2 = (uint64_t)(ni + 2047 - (int64_t)h) << 52;
  double s1, s2;
  memcpy(&s1, &b1, sizeof s1);
  memcpy(&s2, &b2, sizeof s2);
  double y = m * s1 * s2;
  return ts_sel(x == x, y, x);
}

// ---- ts_tanh (needs ts_sel)
/* ts_tanh(x) = tanh(x) for double, as ts_tanhf (|x| < 2^-20: |x| - |x|^3/3; |x| clamped to
   20).  Max error 0.80 ulp (10^8 inputs, long double reference). */
TS_INLINE double ts_tanh(double x) {
  double a = fabs(x);
  double small = fma(a * a * a, -0.3333333333333333, a);
  double u = ts_sel(a < 20.0, -2.0 * a, -40.0);
  double n = rint(u * 1.4426950408889634);
  double r1 = fma(n, -0.6931471805598903, u);        /* exact */
  double r = fma(n, -5.497923018708371e-14, r1);
  double er = fma(n, -5.497923018708371e-14, r1 - r);
  double p = 1.6059043836821613e-10;
  p = fma(p, r, 2.08767569878681e-09);
  p = fma(p, r, 2.505210838544172e-08);
  p = fma(p, r, 2.755731922398589e-07);
  p = fma(p, r, 2.7557319223985893e-06);
  p = fma(p, r, 2.48015873015873e-05);
  p = fma(p, r, 0.0001984126984126984);
  p = fma(p, r, 0.001388888888888889);
  p = fma(p, r, 0.008333333333333333);
  p = fma(p, r, 0.041666666666666664);
  p = fma(p, r, 0.16666666666666666);
  p = fma(p, r, 0.5);
  double c = fma(r * r, p, fma(er, r, er));
  double qh = r + c, ql = c - (qh - r);        /* e^(r + er) - 1 = qh + ql */
  uint64_t b = (uint64_t)(ts_int_of(n) + 1023) << 52;
  double s;
  memcpy(&s, &b, sizeof s);
  double sq = s * qh;
  double eh = s + sq, el = fma(s, ql, (s - eh) + sq);   /* E = eh + el */
  double nh = 1.0 - eh, nl = ((1.0 - nh) - eh) - el;  /* 1 - E = nh + nl */
  double dh = 1.0 + eh, dl = ((1.0 - dh) + eh) + el;  /* 1 + E = dh + dl */
  double rc = 1.0 / dh;
  double t0 = nh * rc;
  double t = fma(fma(-t0, dh, nh) + fma(-t0, dl, nl), rc, t0);
  t = copysign(ts_sel(a < 0x1p-20, small, t), x);
  return ts_sel(x == x, t, x);
}

// ---- ts_erf (needs ts_sel, ts_exp)
/* ts_erf(x) = erf(x) for double; needs ts_exp.  As ts_erff, with P of degree 12 on |x| < 1,
   and above 1 - e^(-x^2) Q(v), Q of degree 12 in v = 4 (1 / (1 + |x|/2) - 0.4583...) fitted
   on [1, 6] (1 + |x|/2 and its reciprocal carried in two parts); |x| clamped to 6.
   Max error 1.02 ulp (10^8 inputs, long double reference). */
TS_INLINE double ts_erf(double x) {
  double a = fabs(x);
  double x2 = x * x;
  double p = 4.541948124346697e-11;
  p = fma(p, x2, -1.0458467998177968e-09);
  p = fma(p, x2, 1.4398444058623819e-08);
  p = fma(p, x2, -1.630685232202712e-07);
  p = fma(p, x2, 1.6456347572372657e-06);
  p = fma(p, x2, -1.4925260382080065e-05);
  p = fma(p, x2, 0.0001205531469576689);
  p = fma(p, x2, -0.0008548326438043306);
  p = fma(p, x2, 0.0052239776131119955);
  p = fma(p, x2, -0.026866170643537707);
  p = fma(p, x2, 0.11283791670944038);
  p = fma(p, x2, -0.3761263890318344);
  p = fma(p, x2, 0.12837916709551256);
  double small = fma(x, p, x);
  double ac = ts_sel(a < 6.0, a, 6.0);
  double hh = 0.5 * ac, d = 1.0 + hh, bb = d - hh;
  double dl = (1.0 - bb) + (hh - (d - bb));       /* 1 + ac/2 = d + dl exactly */
  double t = 1.0 / d;                             /* 1 / (d + dl) = t + e t, e below */
  double e = fma(-t, dl, fma(-t, d, 1.0));
  double v = fma(e, t, t - 0.45835080175363646) * 4.0;
  double q = -1.9175459369017532e-09;
  q = fma(q, v, 1.3753447793345136e-08);
  q = fma(q, v, 7.97886235093438e-09);
  q = fma(q, v, -3.7313097646187595e-07);
  q = fma(q, v, 7.090439456146168e-07);
  q = fma(q, v, 7.0921913231853135e-06);
  q = fma(q, v, -2.1915527281651273e-05);
  q = fma(q, v, -0.00020104579271125212);
  q = fma(q, v, 0.0004087175153691185);
  q = fma(q, v, 0.009657588777939121);
  q = fma(q, v, 0.0555292458353252);
  q = fma(q, v, 0.19428004157333534);
  q = fma(q, v, 0.22144311502051298);
  double h = ac * ac;
  double l = fma(ac, ac, -h);
  double big = copysign(fma(-ts_exp(-h), fma(-l, q, q), 1.0), x);
  double y = ts_sel(a < 1.0, small, big);
  return ts_sel(x == x, y, x);
}

// ---- ts_log
/* ts_log(x): float64 log is still libm's (not vectorised, not ours); a polynomial like
   ts_logf's is future work. */
TS_INLINE double ts_log(double x) { return log(x); }
