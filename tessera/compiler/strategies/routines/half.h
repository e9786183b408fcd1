TS_INLINE float ts_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
TS_INLINE uint32_t ts_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
TS_INLINE float ts_bf16_to_f32(uint16_t h) { return ts_bits_f32((uint32_t)h << 16); }
TS_INLINE uint16_t ts_f32_to_bf16(float f) {
  const uint32_t u = ts_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
TS_INLINE float ts_f16_to_f32(uint16_t h) {
  const uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {                  /* zero or subnormal: m * 2^-24, exact */
    const uint32_t sh = m ? (uint32_t)__builtin_clz(m) - 21u : 0u;   /* normalise m */
    return ts_bits_f32(m ? s | ((113u - sh) << 23) | ((m << sh) & 0x3ffu) << 13 : s);
  }
  return ts_bits_f32(s | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (m << 13));
}
TS_INLINE uint16_t ts_f32_to_f16(float f) {
  const uint32_t u = ts_f32_bits(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u | ((a >> 13) & 0x3ffu));   /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);      /* 65520 and up round to inf */
  if (a < 0x38800000u) {         /* below 2^-14: a subnormal in units of 2^-24 (or zero) */
    const uint32_t e = a >> 23;
    if (e < 102u) return (uint16_t)s;                          /* below 2^-25: to zero */
    const uint32_t m = (a & 0x7fffffu) | 0x800000u, sh = 126u - e;          /* 14 .. 24 */
    const uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
    return (uint16_t)(s | (q + (rem > half || (rem == half && (q & 1u)))));
  }
  const uint32_t r = a - 0x38000000u;                       /* rebias the exponent 127 -> 15 */
  return (uint16_t)(s | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}
/* double -> float rounded to odd (inexact: the odd one of the two neighbours), so rounding that
   to float16 is the double's own correct rounding (float keeps 13 more bits than float16) */
TS_INLINE float ts_f64_to_f32_odd(double d) {
  const float f = (float)d;
  const uint32_t u = ts_f32_bits(f);
  if ((double)f == d || d != d || (u & 1u)) return f;
  return ts_bits_f32(fabs(d) > fabs((double)f) ? u + 1u : u - 1u);
}
