/* bf16 operands on AMX's tile dot product (tdpbf16ps; ISA level x86-64-v4+amx, which no machine
   takes by itself). What the instruction computes, measured on Sapphire Rapids-class cores and
   as Intel's manual writes it: for each C element, over one instruction's 32 values of k (16
   pairs), two float32 FMA chains from +0, one over the even k and one over the odd, then
   c += (even + odd), each step rounded to nearest even; denormal operands read as zero and
   denormal results are flushed. This routine issues one instruction per 32 k from k = 0 (the
   last zero-padded: a zero product leaves a chain as it is), so every element is
     c = 0; for each chunk j of 32 k: c += (E_j + O_j)
   whatever the tiles, K blocks (multiples of 32), batch or thread count. Those are not the FMA
   path's bits (one chain over k in order) nor vdpbf16ps's (tests/targets/test_gemm_amx.py
   checks them against NumPy in this order). */
/* (after gemm_bf16_dot.c, whose DAZ and FTZ helpers it shares: the level has AVX-512 BF16) */
#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(TS_GEMM_DOT_bf16)
#define TS_GEMM_AMX_bf16 1
#define TS_AMX_K 32                  /* k per instruction: a tile row of 64 bytes */
#define TS_AMX_B 32                  /* C blocks of 32 x 32: four accumulator tiles */

/* The same chains one element at a time (no tiles: the permission refused, or no memory for
   packing). */
static void ts_amx_loops(const uint16_t* A, int64_t rsa, int64_t csa, const uint16_t* B,
                         int64_t rsb, int64_t csb, uint16_t* C, int64_t ldc, int64_t K,
                         int64_t mt, int64_t nt) {
  for (int64_t i = 0; i < mt; ++i)
    for (int64_t j = 0; j < nt; ++j) {
      float c = 0.0f;
      for (int64_t k0 = 0; k0 < K; k0 += TS_AMX_K) {
        float ch[2] = {0.0f, 0.0f};
        for (int64_t k = k0; k < k0 + TS_AMX_K && k < K; ++k)
          ch[k & 1] = ts_dot_ftz(fmaf(ts_dot_daz(A[i * rsa + k * csa]),
                                      ts_dot_daz(B[k * rsb + j * csb]), ch[k & 1]));
        c = ts_dot_ftz(c + ts_dot_ftz(ch[0] + ch[1]));
      }
      C[i * ldc + j] = ts_f32_to_bf16(c);
    }
}

/* A's rows in 16-row panels, each 32-k chunk a tile's 16 rows of 64 bytes:
   pa[((ir / 16) * chunks + q) * 512 + r * 32 + t] = A[ir + r, 32 q + t], zero past m (to a
   whole C block) and kc. */
static void ts_amx_pack_a(int64_t m, int64_t kc, int64_t kp, const uint16_t* A, int64_t rsa,
                          int64_t csa, uint16_t* pa) {
  int64_t chunks = kp / TS_AMX_K, mp = (m + TS_AMX_B - 1) / TS_AMX_B * TS_AMX_B;
  for (int64_t i = 0; i < mp; ++i) {
    uint16_t* d = pa + (i / 16) * chunks * 512 + (i % 16) * TS_AMX_K;
    const uint16_t* a = A + i * rsa;
    for (int64_t q = 0; q < chunks; ++q, d += 512) {
      int64_t k0 = q * TS_AMX_K, w = i >= m ? 0 : kc - k0 < TS_AMX_K ? kc - k0 : TS_AMX_K;
      if (csa == 1) {
        __mmask32 keep = w >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << w) - 1);
        _mm512_storeu_si512(d, _mm512_maskz_loadu_epi16(keep, a + k0));
      } else {
        for (int64_t t = 0; t < TS_AMX_K; ++t) d[t] = t < w ? a[(k0 + t) * csa] : 0;
      }
    }
  }
}

/* B's columns in panels of 32, pairs of k interleaved (the tile's VNNI rows):
   pb[((jr / 32) * (kp / 2) + p) * 64 + 2 j + h] = B[2p + h, jr + j], zero past n and kc. A
   32-k chunk of a panel is two B tiles side by side (rows of 128 bytes, 64 each). */
static void ts_amx_pack_b(int64_t kc, int64_t kp, int64_t n, const uint16_t* B, int64_t rsb,
                          int64_t csb, uint16_t* pb) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                      8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  int64_t pairs = kp / 2;
  for (int64_t jr = 0; jr < n; jr += TS_AMX_B, pb += 2 * TS_AMX_B * pairs) {
    int64_t w = n - jr < TS_AMX_B ? n - jr : TS_AMX_B;
    for (int64_t p = 0; p < pairs; ++p) {
      uint16_t* d = pb + p * 2 * TS_AMX_B;
      const uint16_t* r0 = B + 2 * p * rsb + jr * csb;
      int have0 = 2 * p < kc, have1 = 2 * p + 1 < kc;
      if (w == TS_AMX_B && csb == 1 && have1) {
        __m512i x = _mm512_loadu_si512(r0), y = _mm512_loadu_si512(r0 + rsb);
        _mm512_storeu_si512(d, _mm512_permutex2var_epi16(x, lo, y));
        _mm512_storeu_si512(d + TS_AMX_B, _mm512_permutex2var_epi16(x, hi, y));
        continue;
      }
      for (int64_t j = 0; j < TS_AMX_B; ++j) {
        d[2 * j] = j < w && have0 ? r0[j * csb] : 0;
        d[2 * j + 1] = j < w && have1 ? r0[rsb + j * csb] : 0;
      }
    }
  }
}

TS_AMX_BLOCKS(ts_amx_blocks_bf16, _tile_dpbf16ps)

/* C (mt x nt, bf16, rounded once) = A (mt x K) @ B (K x nt) for bf16 operands of any strides:
   per K block (a multiple of 32), A and B packed as tiles (A's tiles loaded straight from a
   matrix whose rows are 4 KiB apart fall into one L1 set: 2.3x slower at 2048), each 32 x 32
   block of C in four accumulator tiles (tmm0-3) over the block's chunks (A in tmm4-5, B in
   tmm6-7), float32 accumulators in the thread's scratch between blocks. */
__attribute__((unused))
static void ts_gemm_amx_bf16(const uint16_t* A, int64_t rsa, int64_t csa, const uint16_t* B,
                             int64_t rsb, int64_t csb, uint16_t* C, int64_t ldc, int64_t K,
                             int64_t mt, int64_t nt, int64_t KC) {
  if (mt <= 0 || nt <= 0)
    return;
  KC = KC <= 0 ? 256 : (KC + TS_AMX_K - 1) / TS_AMX_K * TS_AMX_K;   /* the bits ignore it */
  int64_t mp = (mt + TS_AMX_B - 1) / TS_AMX_B * TS_AMX_B;
  int64_t np = (nt + TS_AMX_B - 1) / TS_AMX_B * TS_AMX_B;
  int64_t kmax = (K < KC ? (K + TS_AMX_K - 1) / TS_AMX_K * TS_AMX_K : KC);
  float* w = K > 0 && ts_amx_permitted() ?
      ts_scratch_f32((size_t)(mp * np) + (size_t)((mp + np) * kmax) / 2) : 0;
  if (!w) {
    ts_amx_loops(A, rsa, csa, B, rsb, csb, C, ldc, K, mt, nt);
    return;
  }
  float* c = w;
  uint16_t* pa = (uint16_t*)(c + mp * np);
  uint16_t* pb = pa + mp * kmax;
  ts_amx_configure();
  for (int64_t pc = 0; pc < K; pc += KC) {
    int64_t kc = K - pc < KC ? K - pc : KC, kp = (kc + TS_AMX_K - 1) / TS_AMX_K * TS_AMX_K;
    int64_t chunks = kp / TS_AMX_K;
    ts_amx_pack_b(kc, kp, nt, B + pc * rsb, rsb, csb, pb);
    ts_amx_pack_a(mt, kc, kp, A + pc * csa, rsa, csa, pa);
    ts_amx_blocks_bf16((const unsigned char*)pa, (const unsigned char*)pb, c, mp, np, chunks,
                       pc == 0);
  }
  _tile_release();
  for (int64_t i = 0; i < mt; ++i)
    for (int64_t j = 0; j < nt; ++j) C[i * ldc + j] = ts_f32_to_bf16(c[i * np + j]);
}
#endif
