/* fp8 (OCP e4m3fn and e5m2) bits <-> float32 with integer operations only (no cuda_fp8),
   after half.h and on its primitives: widening is exact; narrowing rounds to nearest even as
   ml_dtypes does, keeps subnormals, overflows to inf (e5m2) or NaN (e4m3fn, which has no inf),
   and a NaN stays NaN with its sign. The same text on the CPU and on GPUs. */
/* fp8: a finite float32's magnitude bits a, rounded to nearest even to a format with M mantissa
   bits and exponent bias B; the result's bits without the sign, possibly beyond the format's
   largest finite value (the caller decides what overflow is) */
{Q} {U32} {P}_f8_round({U32} a, int M, int B) {
  const int te = (int)(a >> 23) - 127 + B;                 /* the format's biased exponent */
  const int sh = 23 - M + (te < 1 ? 1 - te : 0);           /* bits dropped (more if subnormal) */
  if (sh > 24) return 0u;                                  /* below half the least subnormal */
  const {U32} m = (a & 0x7fffffu) | 0x800000u, q = m >> sh, rem = m & ((1u << sh) - 1u);
  const {U32} half = 1u << (sh - 1), r = q + (rem > half || (rem == half && (q & 1u)));
  return te < 1 ? r : (({U32})(te - 1) << M) + r;          /* a carry moves up an exponent */
}
{Q} float {P}_f8e4m3_to_f32({U8} h) {
  const {U32} s = ({U32})(h & 0x80u) << 24, e = (h >> 3) & 0xfu, m = h & 7u;
  if ((h & 0x7fu) == 0x7fu) return {P}_bits_f32(s | 0x7fc00000u);             /* NaN */
  if (e == 0) return {P}_bits_f32(s | {P}_f32_bits((float)m * 0.001953125f));  /* m * 2^-9 */
  return {P}_bits_f32(s | ((e + 120u) << 23) | (m << 20));
}
{Q} {U8} {P}_f32_to_f8e4m3(float f) {
  const {U32} u = {P}_f32_bits(f), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return ({U8})(s | 0x7fu);                   /* NaN and inf: NaN */
  const {U32} r = {P}_f8_round(a, 3, 7);
  return ({U8})(s | (r <= 0x7eu ? r : 0x7fu));                      /* above 448: NaN */
}
/* e5m2 is float16's top byte */
{Q} float {P}_f8e5m2_to_f32({U8} h) { return {P}_f16_to_f32(({U16})(({U16})h << 8)); }
{Q} {U8} {P}_f32_to_f8e5m2(float f) {
  const {U32} u = {P}_f32_bits(f), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return ({U8})(s | 0x7eu);                                 /* NaN */
  const {U32} r = a == 0x7f800000u ? 0x7cu : {P}_f8_round(a, 2, 15);
  return ({U8})(s | (r <= 0x7bu ? r : 0x7cu));                      /* above 57344: inf */
}
