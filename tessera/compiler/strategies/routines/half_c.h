TS_INLINE float ts_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
TS_INLINE uint32_t ts_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
