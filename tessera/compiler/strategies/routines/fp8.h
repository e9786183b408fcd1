/* fp8 (OCP e4m3fn and e5m2) bits <-> float32 with integer operations and exact float products
   only (no cuda_fp8),
   after half.h and on its primitives: widening is exact; narrowing rounds to nearest even as
   ml_dtypes does, keeps subnormals, overflows to inf (e5m2) or NaN (e4m3fn, which has no inf),
   and a NaN stays NaN with its sign. The same text on the CPU and on GPUs. */
/* fp8: a finite float32's magnitude bits a, rounded to nearest even to a format with M mantissa
   bits and exponent bias B; the result's bits without the sign, possibly beyond the format's
   largest finite value (the caller decides what overflow is). Straight-line code, as half.h. */
{Q} {U32} {P}_f8_round({U32} a, int M, int B) {
  const int te = (int)(a >> 23) - 127 + B;                 /* the format's biased exponent */
  const int drop = 23 - M + (te < 1 ? 1 - te : 0);         /* bits dropped (more if subnormal) */
  const {U32} sh = ({U32})(drop > 25 ? 25 : drop);         /* 25: below half the least one */
  const {U32} m = (a & 0x7fffffu) | 0x800000u, q = m >> sh, rem = m & ((1u << sh) - 1u);
  const {U32} half = 1u << (sh - 1u);
  const {U32} up = ({U32})(rem > half) | (({U32})(rem == half) & q), r = q + (up & 1u);
  return te < 1 ? r : (({U32})(te - 1) << M) + r;          /* a carry moves up an exponent */
}
{Q} float {P}_f8e4m3_to_f32({U8} h) {
  const {U32} s = ({U32})(h & 0x80u) << 24, e = (h >> 3) & 0xfu, m = h & 7u;
  const {U32} sub = s | {P}_f32_bits({P}_bits_f32(0x3f000000u | (m << 15)) - 0.5f);  /* m 2^-9 */
  const {U32} normal = s | ((e + 120u) << 23) | (m << 20);
  return {P}_bits_f32({P}_pick((h & 0x7fu) == 0x7fu, s | 0x7fc00000u,
                               {P}_pick(e == 0u, sub, normal)));
}
{Q} {U8} {P}_f32_to_f8e4m3(float f) {
  const {U32} u = {P}_f32_bits(f), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  const {U32} r = {P}_f8_round(a, 3, 7);
  return ({U8})(s | ((a >= 0x7f800000u) | (r > 0x7eu) ? 0x7fu : r));  /* NaN, inf, > 448: NaN */
}
/* e5m2 is float16's top byte */
{Q} float {P}_f8e5m2_to_f32({U8} h) { return {P}_f16_to_f32(({U16})(({U16})h << 8)); }
{Q} {U8} {P}_f32_to_f8e5m2(float f) {
  const {U32} u = {P}_f32_bits(f), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  const {U32} r = {P}_f8_round(a, 2, 15);
  return ({U8})(s | (a > 0x7f800000u ? 0x7eu : (a == 0x7f800000u) | (r > 0x7bu) ? 0x7cu : r));
}
