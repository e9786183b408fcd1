"""Our own transcendentals for float32 as C text: branch-free, so loops that call them
vectorise, and the same arithmetic on every target (portable C, explicit fmaf).

Each chunk states the largest error measured against a float64 reference over the whole
float32 range (tests/test_math_accuracy.py checks the bounds). float64 still calls libm
(`ts_exp` and friends are thin wrappers) until it gets polynomials of its own.
"""

EXPF = """\
/* ts_expf: e^x = 2^n * e^r, n = round(x / ln 2), |r| <= ln2 / 2, e^r by a degree-7 Taylor
   polynomial; 2^n applied in two halves so results down to the subnormals are right.
   Error at most 1 ulp (0.90 measured). exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN. */
TS_INLINE float ts_expf(float x) {
  float xc = x > 88.8f ? 88.8f : (x < -104.0f ? -104.0f : x);
  xc = xc != xc ? 0.0f : xc;
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = fmaf(n, -0.693145751953125f, xc);
  r = fmaf(n, -1.42860682030941723e-06f, r);
  float p = 1.98412698e-4f;
  p = fmaf(p, r, 1.38888889e-3f);
  p = fmaf(p, r, 8.33333333e-3f);
  p = fmaf(p, r, 4.16666667e-2f);
  p = fmaf(p, r, 1.66666667e-1f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  int32_t ni = (int32_t)n;
  int32_t n1 = ni / 2, n2 = ni - ni / 2;
  uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, 4);
  memcpy(&s2, &b2, 4);
  float y = p * s1 * s2;
  return x != x ? x : y;
}"""

TANHF = """\
/* ts_tanhf: an odd Taylor polynomial below |x| = 0.3, else sign(x) * (1 - 2 / (e^2|x| + 1)).
   Error at most 4 ulp (2.4 measured). tanh(+-inf) = +-1, tanh(-0) = -0, NaN stays NaN. */
TS_INLINE float ts_tanhf(float x) {
  float a = fabsf(x);
  float x2 = x * x;
  float q = 1.45583438e-3f;
  q = fmaf(-x2, q, 3.59212803e-3f);
  q = fmaf(-x2, q, 8.86323552e-3f);
  q = fmaf(-x2, q, 2.18694885e-2f);
  q = fmaf(-x2, q, 5.39682540e-2f);
  q = fmaf(-x2, q, 0.133333333f);
  q = fmaf(-x2, q, 0.333333333f);
  float small = x == 0.0f ? x : fmaf(-x * x2, q, x);      /* keeps the sign of -0 */
  float big = 1.0f - 2.0f / (ts_expf(2.0f * a) + 1.0f);
  big = x < 0.0f ? -big : big;
  return a < 0.3f ? small : big;
}"""

ERFF = """\
/* ts_erff: an odd Taylor polynomial below |x| = 0.5; above, 1 - P(t)*e^(-x^2) with
   t = 1/(1 + x/2) and P(t) fitted to erfc(x)*e^(x^2) on [0.5, 10].
   Error at most 3 ulp (2.9 measured).
   erf(+-inf) = +-1, NaN stays NaN. */
TS_INLINE float ts_erff(float x) {
  float a = fabsf(x);
  float x2 = x * x;
  float p = -1.49256504e-5f;
  p = fmaf(p, x2, 1.20553330e-4f);
  p = fmaf(p, x2, -8.54832702e-4f);
  p = fmaf(p, x2, 5.22397763e-3f);
  p = fmaf(p, x2, -2.68661706e-2f);
  p = fmaf(p, x2, 0.112837917f);
  p = fmaf(p, x2, -0.376126389f);
  p = fmaf(p, x2, 1.12837917f);
  float small = x * p;
  float ac = a > 10.0f ? 10.0f : a;
  float t = 1.0f / (1.0f + 0.5f * ac);
  float q = -2.33768276e-3f;
  q = fmaf(q, t, -6.55435994e-2f);
  q = fmaf(q, t, 0.337415755f);
  q = fmaf(q, t, -0.599950075f);
  q = fmaf(q, t, 0.402248532f);
  q = fmaf(q, t, -0.108240269f);
  q = fmaf(q, t, 0.236240894f);
  q = fmaf(q, t, 0.234456614f);
  q = fmaf(q, t, 0.283721656f);
  q = fmaf(q, t, 0.281971574f);
  q = fmaf(q, t, 4.08629694e-6f);
  float big = 1.0f - q * ts_expf(-ac * ac);
  big = x < 0.0f ? -big : big;
  big = x != x ? x : big;
  return a < 0.5f ? small : big;
}"""

LIBM64 = """\
/* float64 transcendentals: libm for now. */
TS_INLINE double ts_exp(double x) { return exp(x); }
TS_INLINE double ts_tanh(double x) { return tanh(x); }
TS_INLINE double ts_erf(double x) { return erf(x); }"""

# the chunks an operator needs, in order (shared chunks are emitted once per program)
F32 = {"exp": (EXPF,), "tanh": (EXPF, TANHF), "erf": (EXPF, ERFF)}
F64 = {"exp": (LIBM64,), "tanh": (LIBM64,), "erf": (LIBM64,)}
