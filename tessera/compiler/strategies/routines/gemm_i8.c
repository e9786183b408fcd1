/* The bias each operand is packed with, so that its bytes have the instruction's signedness. */
#if TS_Q_WIDE
#define TS_Q_CA_{S} 0
#define TS_Q_CB_{S} 0
#else
#define TS_Q_CA_{S} ((TS_Q_A_UNSIGNED - {UA}) * 128)
#define TS_Q_CB_{S} ((TS_Q_B_UNSIGNED - {UB}) * 128)
#endif

/* MR rows of A in groups of KG k: pa[(g * MR + r) * KG + q] = A[r, g * KG + q] + ca, zero past
   the tile's rows and kc; sa[r] += row r's sum over these k (only where B is biased). */
static void ts_pack_a_{S}(int64_t mc, int64_t kc, const {TA}* A, int64_t rsa, int64_t csa,
                          ts_q_t* pa, uint32_t* sa) {
  int64_t kq = (kc + TS_Q_KG - 1) / TS_Q_KG * TS_Q_KG;
  for (int64_t ir = 0; ir < mc; ir += TS_Q_MR, pa += TS_Q_MR * kq)
    for (int64_t r = 0; r < TS_Q_MR; ++r) {
      ts_q_t* dst = pa + r * TS_Q_KG;
      const {TA}* a = A + (ir + r) * rsa;
      int64_t k = 0, have = ir + r < mc ? kc : 0;
      if (TS_Q_CB_{S} && have) {
        uint32_t s = 0;
        if (csa == 1)                /* (a contiguous sum vectorises) */
          for (int64_t q = 0; q < kc; ++q) s += (uint32_t)(int32_t)a[q];
        else
          for (int64_t q = 0; q < kc; ++q) s += (uint32_t)(int32_t)a[q * csa];
        sa[ir + r] += s;
      }
#if !TS_Q_WIDE
      if (csa == 1)                /* a row's k are contiguous: four bytes at a time */
        for (; k + 4 <= have; k += 4) {
          uint32_t w;
          memcpy(&w, a + k, 4);
          w ^= TS_Q_CA_{S} ? 0x80808080u : 0u;
          memcpy(dst + k * TS_Q_MR, &w, 4);
        }
#endif
      for (; k < have; ++k)
        dst[k / TS_Q_KG * TS_Q_MR * TS_Q_KG + k % TS_Q_KG] = (ts_q_t)(a[k * csa] + TS_Q_CA_{S});
      for (; k < kq; ++k) dst[k / TS_Q_KG * TS_Q_MR * TS_Q_KG + k % TS_Q_KG] = 0;
    }
}

/* NR columns of B in groups of KG k: pb[(g * NR + j) * KG + q] = B[g * KG + q, j] + cb, zero
   past the tile's columns and kc; sb[j] += column j's sum of these packed values (only where A
   is biased). */
static void ts_pack_b_{S}(int64_t kc, int64_t nc, const {TB}* B, int64_t rsb, int64_t csb,
                          ts_q_t* pb, uint32_t* sb) {
  int64_t kq = (kc + TS_Q_KG - 1) / TS_Q_KG * TS_Q_KG;
  int64_t fast = 0;                  /* the k a fast path packed (whole panels only) */
#if !TS_Q_WIDE
  int64_t whole = nc / TS_Q_NR * TS_Q_NR;     /* columns in whole panels */
  if (whole && rsb == 1) {           /* a column's k are contiguous (a transposed weight) */
    for (int64_t j = 0; j < whole; ++j)
      for (int64_t q = 0; q + 4 <= kc; q += 4) {
        uint32_t w;
        memcpy(&w, B + j * csb + q, 4);
        w ^= TS_Q_CB_{S} ? 0x80808080u : 0u;
        memcpy(pb + j / TS_Q_NR * TS_Q_NR * kq + q * TS_Q_NR + j % TS_Q_NR * 4, &w, 4);
      }
    fast = kc / 4 * 4;
  }
#if defined(__SSE2__)
  if (whole && csb == 1) {           /* rows of B, four at a time interleaved bytewise: each
                                        row read once, along its length */
    __m128i flip = _mm_set1_epi8(TS_Q_CB_{S} ? (char)0x80 : 0);
    for (int64_t k = 0; k + 4 <= kc; k += 4)
      for (int64_t c = 0; c < whole; c += 16) {
        const {TB}* s = B + k * rsb + c;
        __m128i r0 = _mm_loadu_si128((const __m128i*)s);
        __m128i r1 = _mm_loadu_si128((const __m128i*)(s + rsb));
        __m128i r2 = _mm_loadu_si128((const __m128i*)(s + 2 * rsb));
        __m128i r3 = _mm_loadu_si128((const __m128i*)(s + 3 * rsb));
        __m128i t0 = _mm_unpacklo_epi8(r0, r1), t1 = _mm_unpackhi_epi8(r0, r1);
        __m128i t2 = _mm_unpacklo_epi8(r2, r3), t3 = _mm_unpackhi_epi8(r2, r3);
        ts_q_t* d = pb + c / TS_Q_NR * TS_Q_NR * kq + k * TS_Q_NR + c % TS_Q_NR * 4;
        _mm_storeu_si128((__m128i*)d, _mm_xor_si128(_mm_unpacklo_epi16(t0, t2), flip));
        _mm_storeu_si128((__m128i*)(d + 16), _mm_xor_si128(_mm_unpackhi_epi16(t0, t2), flip));
        _mm_storeu_si128((__m128i*)(d + 32), _mm_xor_si128(_mm_unpacklo_epi16(t1, t3), flip));
        _mm_storeu_si128((__m128i*)(d + 48), _mm_xor_si128(_mm_unpackhi_epi16(t1, t3), flip));
      }
    fast = kc / 4 * 4;
  }
#endif
#endif
  for (int64_t jr = 0; jr < nc; jr += TS_Q_NR, pb += TS_Q_NR * kq) {
    int64_t n = nc - jr < TS_Q_NR ? nc - jr : TS_Q_NR;
    for (int64_t k = n == TS_Q_NR ? fast : 0; k < kq; ++k) {
      ts_q_t* dst = pb + k / TS_Q_KG * TS_Q_NR * TS_Q_KG + k % TS_Q_KG;
      int64_t have = k < kc ? n : 0;
      const {TB}* src = B + k * rsb + jr * csb;
      for (int64_t j = 0; j < have; ++j) dst[j * TS_Q_KG] = (ts_q_t)(src[j * csb] + TS_Q_CB_{S});
      for (int64_t j = have; j < TS_Q_NR; ++j) dst[j * TS_Q_KG] = 0;
    }
#if TS_Q_CA_{S}
    {                                  /* the panel's packed column sums */
      ts_qv t[TS_Q_NV];
      int32_t lanes[TS_Q_VL];
      for (int v = 0; v < TS_Q_NV; ++v) t[v] = ts_qv_zero();
      for (int64_t g = 0; g < kq / TS_Q_KG; ++g)
        for (int v = 0; v < TS_Q_NV; ++v)
          t[v] = ts_qv_sum(t[v], ts_qv_load(pb + (g * TS_Q_NR + v * TS_Q_VL) * TS_Q_KG));
      for (int v = 0; v < TS_Q_NV; ++v) {
        ts_qv_store(lanes, t[v]);
        for (int l = 0; l < TS_Q_VL; ++l) sb[jr + v * TS_Q_VL + l] += (uint32_t)lanes[l];
      }
    }
#endif
  }
}

/* C[0:m, 0:n] (+)= a-panel @ b-panel over `groups` groups of KG k: MR x NV int32 vector
   accumulators in registers. */
static void ts_micro_{S}(int64_t groups, const ts_q_t* restrict a, const ts_q_t* restrict b,
                         int32_t* restrict c, int64_t ldc, int64_t m, int64_t n, int first) {
  ts_qv acc[TS_Q_MR][TS_Q_NV];
  int32_t edge[TS_Q_MR * TS_Q_NR];
  int full = m == TS_Q_MR && n == TS_Q_NR;
  int32_t* src = c;
  int64_t ld = ldc;
  if (!full) {
    memset(edge, 0, sizeof(edge));
    if (!first)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j) edge[r * TS_Q_NR + j] = c[r * ldc + j];
    src = edge;
    ld = TS_Q_NR;
  }
#pragma GCC unroll 16
  for (int r = 0; r < TS_Q_MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < TS_Q_NV; ++v)
      acc[r][v] = first ? ts_qv_zero() : ts_qv_loadc(src + r * ld + v * TS_Q_VL);
  for (int64_t g = 0; g < groups; ++g) {
    ts_qv bv[TS_Q_NV];
#pragma GCC unroll 4
    for (int v = 0; v < TS_Q_NV; ++v) bv[v] = ts_qv_load(b + (g * TS_Q_NR + v * TS_Q_VL) * TS_Q_KG);
#if defined(TS_Q_SDOT)
#pragma GCC unroll 4
    for (int r = 0; r < TS_Q_MR; r += 4) {
      int8x16_t av = vreinterpretq_s8_u8(vld1q_u8(a + (g * TS_Q_MR + r) * TS_Q_KG));
#pragma GCC unroll 4
      for (int v = 0; v < TS_Q_NV; ++v) {
        int8x16_t bs = vreinterpretq_s8_s32(bv[v]);
        acc[r][v] = vdotq_laneq_s32(acc[r][v], bs, av, 0);
        acc[r + 1][v] = vdotq_laneq_s32(acc[r + 1][v], bs, av, 1);
        acc[r + 2][v] = vdotq_laneq_s32(acc[r + 2][v], bs, av, 2);
        acc[r + 3][v] = vdotq_laneq_s32(acc[r + 3][v], bs, av, 3);
      }
    }
#else
#pragma GCC unroll 16
    for (int r = 0; r < TS_Q_MR; ++r) {
      ts_qv ar = ts_qv_bcast(a + (g * TS_Q_MR + r) * TS_Q_KG);
#pragma GCC unroll 4
      for (int v = 0; v < TS_Q_NV; ++v) acc[r][v] = ts_qv_dot(acc[r][v], ar, bv[v]);
    }
#endif
  }
#pragma GCC unroll 16
  for (int r = 0; r < TS_Q_MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < TS_Q_NV; ++v) ts_qv_store(src + r * ld + v * TS_Q_VL, acc[r][v]);
  if (!full)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) c[r * ldc + j] = edge[r * TS_Q_NR + j];
}

/* Few rows or columns (or no memory for packing): the products straight from the operands,
   the columns innermost (in uint32: wrapping is defined). */
static void ts_gemm_loops_{S}(const {TA}* A, int64_t rsa, int64_t csa, const {TB}* B,
                              int64_t rsb, int64_t csb, int32_t* C, int64_t ldc, int64_t K,
                              int64_t mt, int64_t nt) {
  for (int64_t i = 0; i < mt; ++i) {
    uint32_t* c = (uint32_t*)(C + i * ldc);
    for (int64_t j = 0; j < nt; ++j) c[j] = 0;
    for (int64_t k = 0; k < K; ++k) {
      uint32_t x = (uint32_t)(int32_t)A[i * rsa + k * csa];
      const {TB}* b = B + k * rsb;
      for (int64_t j = 0; j < nt; ++j) c[j] += x * (uint32_t)(int32_t)b[j * csb];
    }
  }
}

/* C (mt x nt, int32) = A (mt x K) @ B (K x nt), exact modulo 2^32, for operands of any strides:
   ONNX's MatMulInteger without zero points, and NumPy's int32 matmul of the widened operands. */
static void ts_gemm_tile_{S}(const {TA}* A, int64_t rsa, int64_t csa, const {TB}* B, int64_t rsb,
                             int64_t csb, int32_t* C, int64_t ldc, int64_t K, int64_t mt,
                             int64_t nt, int64_t KC) {
#ifdef TS_Q_AMX_{S}
  if (mt >= 4 && nt >= 4 && ts_amx_tiles_{S}(A, rsa, csa, B, rsb, csb, C, ldc, K, mt, nt, KC))
    return;
#endif
  if (KC <= 0) KC = 512;
  int64_t mp = (mt + TS_Q_MR - 1) / TS_Q_MR * TS_Q_MR;
  int64_t np = (nt + TS_Q_NR - 1) / TS_Q_NR * TS_Q_NR;
  int64_t kq = ((K < KC ? K : KC) + TS_Q_KG - 1) / TS_Q_KG * TS_Q_KG;
  unsigned char* w = mt < 4 || nt < 4 || K <= 0 ? 0 :
      ts_scratch_q((size_t)(mp + np) * (4 + (size_t)kq * sizeof(ts_q_t)));
  if (!w) {
    ts_gemm_loops_{S}(A, rsa, csa, B, rsb, csb, C, ldc, K, mt, nt);
    return;
  }
  uint32_t *sa = (uint32_t*)w, *sb = sa + mp;
  ts_q_t* pa = (ts_q_t*)(sb + np);
  ts_q_t* pb = pa + mp * kq;
  memset(sa, 0, sizeof(uint32_t) * (size_t)(mp + np));
  for (int64_t pc = 0; pc < K; pc += KC) {
    int64_t kc = K - pc < KC ? K - pc : KC;
    int64_t groups = (kc + TS_Q_KG - 1) / TS_Q_KG;
    ts_pack_b_{S}(kc, nt, B + pc * rsb, rsb, csb, pb, sb);
    ts_pack_a_{S}(mt, kc, A + pc * csa, rsa, csa, pa, sa);
    for (int64_t jr = 0; jr < nt; jr += TS_Q_NR)
      for (int64_t ir = 0; ir < mt; ir += TS_Q_MR)
        ts_micro_{S}(groups, pa + ir * groups * TS_Q_KG, pb + jr * groups * TS_Q_KG,
                     C + ir * ldc + jr, ldc, mt - ir < TS_Q_MR ? mt - ir : TS_Q_MR,
                     nt - jr < TS_Q_NR ? nt - jr : TS_Q_NR, pc == 0);
  }
  /* with a' = a + ca, b' = b + cb: sum ab = sum a'b' - cb sum a - ca sum b' */
#if TS_Q_CA_{S} || TS_Q_CB_{S}
  {
    uint32_t ca = (uint32_t)(int32_t)TS_Q_CA_{S}, cb = (uint32_t)(int32_t)TS_Q_CB_{S};
    for (int64_t i = 0; i < mt; ++i) {
      uint32_t* c = (uint32_t*)(C + i * ldc);
      uint32_t row = cb * sa[i];
      for (int64_t j = 0; j < nt; ++j) c[j] -= row + ca * sb[j];
    }
  }
#endif
}
