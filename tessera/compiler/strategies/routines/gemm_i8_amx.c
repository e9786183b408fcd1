/* The int8 GEMM on AMX's tiles (x86-64-v4+amx, and x86-64-v4+vnni where the CPU has them:
   amx.h): tdpb{s,u}{s,u}d multiplies a 16 x 64 tile of A's bytes by a 64 x 16 tile of B's (k in
   groups of four per column) into 16 x 16 int32, for each signedness of the pair, so nothing is
   biased. Integer sums are exact modulo 2^32 in any order: the same bits as every other path.
   Returns 0 where it did not run (the tiles' state refused, no memory): the caller's own path
   then computes the product. */
#if (defined(__AMX_INT8__) && defined(__AMX_TILE__)) || TS_AMX_AT_RUN_TIME
#define TS_Q_AMX_{S} 1
#define TS_Q_AMX_K 64                /* k per instruction: a tile row of 64 bytes */
#define ts_q_amx_dot_{S}(c, a, b) TS_Q_AMX_OP_{UA}{UB}(c, a, b)
#define TS_Q_AMX_OP_00(c, a, b) _tile_dpbssd(c, a, b)
#define TS_Q_AMX_OP_10(c, a, b) _tile_dpbusd(c, a, b)
#define TS_Q_AMX_OP_01(c, a, b) _tile_dpbsud(c, a, b)
#define TS_Q_AMX_OP_11(c, a, b) _tile_dpbuud(c, a, b)

TS_AMX_BLOCKS(ts_amx_blocks_{S}, ts_q_amx_dot_{S})

TS_AMX_FN static int ts_amx_tiles_{S}(const {TA}* A, int64_t rsa, int64_t csa,
                                      const {TB}* B, int64_t rsb, int64_t csb, int32_t* C,
                                      int64_t ldc, int64_t K, int64_t mt, int64_t nt,
                                      int64_t KC) {
  /* K blocks of at most 512 (the tasks' 1024 is VNNI's): a block's panels of A and B, 16 KiB
     each, then share L1 (2048^3 on the Xeon VM: 7.0 to 5.6 ms) */
  KC = KC <= 0 || KC > 512 ? 512 : (KC + TS_Q_AMX_K - 1) / TS_Q_AMX_K * TS_Q_AMX_K;
  int64_t mp = (mt + 31) / 32 * 32, np = (nt + 31) / 32 * 32;
  int64_t kmax = K < KC ? (K + TS_Q_AMX_K - 1) / TS_Q_AMX_K * TS_Q_AMX_K : KC;
  unsigned char* w = K > 0 && ts_amx_permitted() ?
      ts_scratch_q(sizeof(int32_t) * (size_t)(mp * np) + (size_t)((mp + np) * kmax)) : 0;
  if (!w)
    return 0;
  int32_t* c = (int32_t*)w;
  uint8_t* pa = (uint8_t*)(c + mp * np);
  uint8_t* pb = pa + mp * kmax;
  ts_amx_configure();
  for (int64_t pc = 0; pc < K; pc += KC) {
    int64_t kc = K - pc < KC ? K - pc : KC;
    int64_t kp = (kc + TS_Q_AMX_K - 1) / TS_Q_AMX_K * TS_Q_AMX_K, chunks = kp / TS_Q_AMX_K;
    /* A: pa[((i / 16) * chunks + q) * 1024 + (i % 16) * 64 + t] = A[i, 64 q + t] */
    for (int64_t i = 0; i < mp; ++i) {
      const {TA}* a = A + i * rsa + pc * csa;
      uint8_t* d = pa + (i / 16) * chunks * 1024 + (i % 16) * 64;
      for (int64_t q = 0; q < chunks; ++q, d += 1024) {
        int64_t k0 = q * TS_Q_AMX_K, n = i >= mt ? 0 : kc - k0 < 64 ? kc - k0 : 64;
        if (csa == 1) {
          __mmask64 keep = n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
          _mm512_storeu_si512(d, _mm512_maskz_loadu_epi8(keep, a + k0));
        } else {
          for (int64_t t = 0; t < 64; ++t) d[t] = t < n ? (uint8_t)a[(k0 + t) * csa] : 0;
        }
      }
    }
    /* B in panels of 32 columns, k in fours per column (two tiles side by side):
       pb[((j / 32) * (kp / 4) + g) * 128 + (j % 32) * 4 + h] = B[4 g + h, j] */
    for (int64_t jr = 0; jr < np; jr += 32) {
      uint8_t* panel = pb + jr * kp;
      for (int64_t g = 0; g < kp / 4; ++g) {
        uint8_t* d = panel + g * 128;
        const {TB}* s = B + (pc + 4 * g) * rsb + jr * csb;
        if (jr + 32 <= nt && csb == 1 && 4 * g + 4 <= kc) {
          for (int64_t c16 = 0; c16 < 32; c16 += 16) {   /* four rows interleaved bytewise */
            __m128i r0 = _mm_loadu_si128((const __m128i*)(s + c16));
            __m128i r1 = _mm_loadu_si128((const __m128i*)(s + rsb + c16));
            __m128i r2 = _mm_loadu_si128((const __m128i*)(s + 2 * rsb + c16));
            __m128i r3 = _mm_loadu_si128((const __m128i*)(s + 3 * rsb + c16));
            __m128i t0 = _mm_unpacklo_epi8(r0, r1), t1 = _mm_unpackhi_epi8(r0, r1);
            __m128i t2 = _mm_unpacklo_epi8(r2, r3), t3 = _mm_unpackhi_epi8(r2, r3);
            _mm_storeu_si128((__m128i*)(d + c16 * 4), _mm_unpacklo_epi16(t0, t2));
            _mm_storeu_si128((__m128i*)(d + c16 * 4 + 16), _mm_unpackhi_epi16(t0, t2));
            _mm_storeu_si128((__m128i*)(d + c16 * 4 + 32), _mm_unpacklo_epi16(t1, t3));
            _mm_storeu_si128((__m128i*)(d + c16 * 4 + 48), _mm_unpackhi_epi16(t1, t3));
          }
          continue;
        }
        for (int64_t j = 0; j < 32; ++j)
          for (int64_t h = 0; h < 4; ++h)
            d[j * 4 + h] = jr + j < nt && 4 * g + h < kc ? (uint8_t)s[h * rsb + j * csb] : 0;
      }
    }
    ts_amx_blocks_{S}(pa, pb, c, mp, np, chunks, pc == 0);
  }
  _tile_release();
  for (int64_t i = 0; i < mt; ++i) memcpy(C + i * ldc, c + i * np, sizeof(int32_t) * (size_t)nt);
  return 1;
}
#endif
