/* A convolution as an implicit GEMM (routines/c_conv.py): A is the weight's rows (output
   channels) by k = (c, kd, kh, kw), B the input's windows (k by output position), read from the
   input while packing, so the windows never exist in memory. Spatial axes are three (a 1-D or
   2-D convolution has leading axes of size 1). */
typedef struct {
  int64_t cs;                   /* the input's channel stride */
  int64_t in[3], k[3], out[3], s[3], d[3], p[3];
} ts_conv_geom;

/* Row k of B over output positions [p0, p0 + n): the input under each, 0 in the padding. */
static void ts_conv_row_{S}(const ts_conv_geom* g, const {T}* X, int64_t k, int64_t p0,
                            int64_t n, {T}* dst) {
  int64_t kk = g->k[0] * g->k[1] * g->k[2];
  int64_t c = k / kk, r = k % kk;
  int64_t kz = r / (g->k[1] * g->k[2]), ky = (r / g->k[2]) % g->k[1], kx = r % g->k[2];
  const {T}* xc = X + c * g->cs;
  int64_t plane = g->out[1] * g->out[2];
  int64_t zo = p0 / plane, yo = (p0 / g->out[2]) % g->out[1], xo = p0 % g->out[2];
  int64_t sx = g->s[2];
  for (int64_t j = 0; j < n;) {           /* a run of positions along one output row */
    int64_t run = g->out[2] - xo < n - j ? g->out[2] - xo : n - j;
    int64_t zi = zo * g->s[0] + kz * g->d[0] - g->p[0];
    int64_t yi = yo * g->s[1] + ky * g->d[1] - g->p[1];
    {T}* o = dst + j;
    if (zi < 0 || zi >= g->in[0] || yi < 0 || yi >= g->in[1]) {
      for (int64_t t = 0; t < run; ++t) o[t] = 0;
    } else {
      const {T}* row = xc + (zi * g->in[1] + yi) * g->in[2];
      int64_t xb = xo * sx + kx * g->d[2] - g->p[2];       /* input column of the run's first */
      int64_t lo = xb >= 0 ? 0 : sx == 1 ? -xb : (-xb + sx - 1) / sx;   /* the run's part */
      int64_t hi = xb >= g->in[2] ? 0 : sx == 1 ? g->in[2] - xb         /* inside the row */
                                              : (g->in[2] - xb + sx - 1) / sx;
      if (lo > run) lo = run;
      if (hi > run) hi = run;
      if (hi < lo) hi = lo;
      for (int64_t t = 0; t < lo; ++t) o[t] = 0;
      if (sx == 1) {                      /* (a loop, not memcpy: runs are short) */
        const {T}* src = row + xb;
        for (int64_t t = lo; t < hi; ++t) o[t] = src[t];
      } else {
        for (int64_t t = lo; t < hi; ++t) o[t] = row[xb + t * sx];
      }
      for (int64_t t = hi; t < run; ++t) o[t] = 0;
    }
    j += run;
    xo += run;
    if (xo == g->out[2]) {
      xo = 0;
      if (++yo == g->out[1]) { yo = 0; ++zo; }
    }
  }
}

/* One element of B, for the path without scratch memory. */
static {T} ts_conv_at_{S}(const ts_conv_geom* g, const {T}* X, int64_t k, int64_t p) {
  {T} v;
  ts_conv_row_{S}(g, X, k, p, 1, &v);
  return v;
}

/* Overwrites the mt x nt block at C (row stride ldc) with W[0:mt, 0:K] @ B[0:K, j0:j0+nt]:
   every element the fma chain over k = 0, 1, ... from 0 that the GEMM routine computes for the
   same product with B in memory, so a convolution has the bits of its im2col matmul. W's rows
   have stride ldw; X points at the group's first input channel of one image. */
static void ts_conv_tile_{S}(const {T}* W, int64_t ldw, const {T}* X, {T}* C, int64_t ldc,
                             int64_t K, int64_t mt, int64_t nt, int64_t KC, int64_t j0,
                             int64_t cs, int64_t in0, int64_t in1, int64_t in2, int64_t k0,
                             int64_t k1, int64_t k2, int64_t out0, int64_t out1, int64_t out2,
                             int64_t s0, int64_t s1, int64_t s2, int64_t d0, int64_t d1,
                             int64_t d2, int64_t p0, int64_t p1, int64_t p2) {
  ts_conv_geom g = {cs, {in0, in1, in2}, {k0, k1, k2}, {out0, out1, out2}, {s0, s1, s2},
                    {d0, d1, d2}, {p0, p1, p2}};
  if (KC <= 0) KC = 256;
  int64_t kcap = K < KC ? K : KC;
  int64_t mp = (mt + TS_MR - 1) / TS_MR * TS_MR;
  int64_t np = (nt + TS_NR_{S} - 1) / TS_NR_{S} * TS_NR_{S};
  int narrow = mt == 1 || nt <= 2;
  {T}* pa = K <= 0 ? 0 : ts_scratch_{S}(mt == 1 ? (size_t)nt
                                       : narrow ? (size_t)kcap * (size_t)nt
                                       : (size_t)(mp + np) * (size_t)kcap + (size_t)np);
  if (!pa) {                     /* K = 0, or no memory: the same fma chains, element by element */
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t j = 0; j < nt; ++j) {
        {T} acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc = fma{F}(W[i * ldw + k], ts_conv_at_{S}(&g, X, k, j0 + j), acc);
        C[i * ldc + j] = acc;
      }
    return;
  }
  if (mt == 1) {                 /* one output row (a depthwise convolution): B's rows streamed */
    for (int64_t j = 0; j < nt; ++j) C[j] = 0;
    for (int64_t k = 0; k < K; ++k) {
      const {T} a = W[k];
      ts_conv_row_{S}(&g, X, k, j0, nt, pa);
      for (int64_t j = 0; j < nt; ++j) C[j] = fma{F}(a, pa[j], C[j]);
    }
    return;
  }
  if (narrow) {                  /* one or two columns: B's rows unpacked, no micro-tile */
    {T}* rows = pa;
    for (int64_t pc = 0; pc < K; pc += KC) {
      int64_t kc = K - pc < KC ? K - pc : KC;
      for (int64_t q = 0; q < kc; ++q) ts_conv_row_{S}(&g, X, pc + q, j0, nt, rows + q * nt);
      for (int64_t i = 0; i < mt; ++i) {
        {T}* c = C + i * ldc;
        const {T}* a = W + i * ldw + pc;
        if (pc == 0)
          for (int64_t j = 0; j < nt; ++j) c[j] = 0;
        for (int64_t q = 0; q < kc; ++q) {
          const {T}* b = rows + q * nt;
          for (int64_t j = 0; j < nt; ++j) c[j] = fma{F}(a[q], b[j], c[j]);
        }
      }
    }
    return;
  }
  {T}* pb = pa + mp * kcap;
  {T}* line = pb + np * kcap;
  for (int64_t pc = 0; pc < K; pc += KC) {
    int64_t kc = K - pc < KC ? K - pc : KC;
    for (int64_t q = 0; q < kc; ++q) {     /* B's rows into NR-column panels, k-major */
      ts_conv_row_{S}(&g, X, pc + q, j0, nt, line);
      int64_t whole = nt / TS_NR_{S} * TS_NR_{S};
      for (int64_t jr = 0; jr < whole; jr += TS_NR_{S}) {
        {T}* dst = pb + jr * kc + q * TS_NR_{S};
#pragma GCC unroll 4
        for (int v = 0; v < TS_NV; ++v)
          ts_vstore_{S}(dst + v * TS_VL_{S}, ts_vload_{S}(line + jr + v * TS_VL_{S}));
      }
      if (whole < nt) {
        {T}* dst = pb + whole * kc + q * TS_NR_{S};
        for (int64_t j = 0; j < TS_NR_{S}; ++j) dst[j] = whole + j < nt ? line[whole + j] : 0;
      }
    }
    ts_pack_a_{S}(mt, kc, W + pc, ldw, 1, pa);
    for (int64_t jr = 0; jr < nt; jr += TS_NR_{S})
      for (int64_t ir = 0; ir < mt; ir += TS_MR)
        ts_micro_{S}(kc, pa + ir * kc, pb + jr * kc, C + ir * ldc + jr, ldc,
                     mt - ir < TS_MR ? mt - ir : TS_MR,
                     nt - jr < TS_NR_{S} ? nt - jr : TS_NR_{S}, pc == 0);
  }
}
