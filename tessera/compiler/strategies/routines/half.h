/* 16-bit float bits <-> float32 with integer operations only (no _Float16, no F16C, no
   cuda_fp16): widening is exact; narrowing rounds to nearest even, overflows to inf, keeps
   subnormals, and a NaN stays a quiet NaN with its sign and top payload bits. The same text on
   the CPU and on GPUs (tessera's half.h), so they convert alike, bit for bit. */
{Q} float {P}_bf16_to_f32({U16} h) { return {P}_bits_f32(({U32})h << 16); }
{Q} {U16} {P}_f32_to_bf16(float f) {
  const {U32} u = {P}_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ({U16})((u >> 16) | 0x40u);
  return ({U16})((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
{Q} float {P}_f16_to_f32({U16} h) {
  const {U32} s = ({U32})(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {                  /* zero or subnormal: m * 2^-24, exact */
    const {U32} sh = m ? {P}_clz(m) - 21u : 0u;   /* normalise m */
    return {P}_bits_f32(m ? s | ((113u - sh) << 23) | ((m << sh) & 0x3ffu) << 13 : s);
  }
  return {P}_bits_f32(s | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (m << 13));
}
{Q} {U16} {P}_f32_to_f16(float f) {
  const {U32} u = {P}_f32_bits(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return ({U16})(s | 0x7e00u | ((a >> 13) & 0x3ffu));   /* NaN */
  if (a >= 0x477ff000u) return ({U16})(s | 0x7c00u);      /* 65520 and up round to inf */
  if (a < 0x38800000u) {         /* below 2^-14: a subnormal in units of 2^-24 (or zero) */
    const {U32} e = a >> 23;
    if (e < 102u) return ({U16})s;                          /* below 2^-25: to zero */
    const {U32} m = (a & 0x7fffffu) | 0x800000u, sh = 126u - e;          /* 14 .. 24 */
    const {U32} q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
    return ({U16})(s | (q + (rem > half || (rem == half && (q & 1u)))));
  }
  const {U32} r = a - 0x38000000u;                       /* rebias the exponent 127 -> 15 */
  return ({U16})(s | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}
/* double -> float rounded to odd (inexact: the odd one of the two neighbours), so rounding that
   to float16 is the double's own correct rounding (float keeps 13 more bits than float16) */
{Q} float {P}_f64_to_f32_odd(double d) {
  const float f = (float)d;
  const {U32} u = {P}_f32_bits(f);
  if ((double)f == d || d != d || (u & 1u)) return f;
  return {P}_bits_f32(fabs(d) > fabs((double)f) ? u + 1u : u - 1u);
}
