/* 16-bit float bits <-> float32 with integer operations and exact float products only (no
   _Float16, no F16C, no cuda_fp16): widening is exact; narrowing rounds to nearest even, overflows to inf, keeps
   subnormals, and a NaN stays a quiet NaN with its sign and top payload bits. The same text on
   the CPU and on GPUs (tessera's half.h), so they convert alike, bit for bit. */
{Q} float {P}_bf16_to_f32({U16} h) { return {P}_bits_f32(({U32})h << 16); }
{Q} {U16} {P}_f32_to_bf16(float f) {
  const {U32} u = {P}_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ({U16})((u >> 16) | 0x40u);
  return ({U16})((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* (straight-line code: selects, no branches, so a loop converting vectorises) */
/* c ? a : b on bits by masks: both computed, so a value from float arithmetic is not moved
   into a branch (which, floats being able to trap, would stay one) */
{Q} {U32} {P}_pick({U32} c, {U32} a, {U32} b) { const {U32} m = 0u - c; return (a & m) | (b & ~m); }
{Q} float {P}_f16_to_f32({U16} h) {
  const {U32} s = ({U32})(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  /* m 2^-24 as (0.5 + m 2^-24) - 0.5, both exact: no integer -> float conversion */
  const {U32} sub = s | {P}_f32_bits({P}_bits_f32(0x3f000000u | m) - 0.5f);
  const {U32} normal = s | (e == 31u ? 0x7f800000u : (e + 112u) << 23) | (m << 13);
  return {P}_bits_f32({P}_pick(e == 0u, sub, normal));
}
{Q} {U16} {P}_f32_to_f16(float f) {
  const {U32} u = {P}_f32_bits(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  const {U32} r = a - 0x38000000u;                       /* rebias the exponent 127 -> 15 */
  const {U32} normal = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;      /* 65520 and up: inf */
  /* below 2^-14: a subnormal in units of 2^-24 (below 2^-25: zero, by shifting 25) */
  const {U32} e = a >> 23, sh = (e < 102u || e > 126u) ? 25u : 126u - e;
  const {U32} m = (a & 0x7fffffu) | 0x800000u, q = m >> sh, rem = m & ((1u << sh) - 1u);
  const {U32} half = 1u << (sh - 1u);
  const {U32} up = ({U32})(rem > half) | (({U32})(rem == half) & q);   /* (this form vectorises) */
  const {U32} sub = q + (up & 1u);
  const {U32} nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  const {U32} out = a > 0x7f800000u ? nan : a >= 0x477ff000u ? 0x7c00u
                    : a < 0x38800000u ? sub : normal;
  return ({U16})(s | out);
}
/* double -> float rounded to odd (inexact: the odd one of the two neighbours), so rounding that
   to float16 is the double's own correct rounding (float keeps 13 more bits than float16) */
{Q} float {P}_f64_to_f32_odd(double d) {
  const float f = (float)d;
  const {U32} u = {P}_f32_bits(f);
  if ((double)f == d || d != d || (u & 1u)) return f;
  return {P}_bits_f32(fabs(d) > fabs((double)f) ? u + 1u : u - 1u);
}
/* uint64 or int64 -> float rounded to odd: a magnitude of 2^53 or more has its low 12 bits
   folded into bit 11 first (a sticky bit double keeps and float rounds away), so the double is
   exact */
{Q} float {P}_u64_to_f32_odd(unsigned long long m) {
  const unsigned long long a = m < (1ull << 53) ? m
                               : (m & ~0xfffull) | ((unsigned long long)((m & 0xfffull) != 0ull) << 11);
  return {P}_f64_to_f32_odd((double)a);
}
{Q} float {P}_i64_to_f32_odd(long long x) {
  const float f = {P}_u64_to_f32_odd(x < 0 ? 0ull - (unsigned long long)x : (unsigned long long)x);
  return x < 0 ? -f : f;
}
