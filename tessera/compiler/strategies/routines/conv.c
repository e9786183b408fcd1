/* A convolution as an implicit GEMM (routines/c_conv.py): A is the weight's rows (output
   channels) by k = (c, kd, kh, kw), B the input's windows (k by output position), read from the
   input while packing, so the windows never exist in memory. Spatial axes are three (a 1-D or
   2-D convolution has leading axes of size 1): ts_conv_geom (window.c). */
/* The run of `run` output positions along one output row from (zo, yo, xo) of B's row with
   kernel offsets (oz, oy, ox) = k's (kz, ky, kx) times the dilation less the padding, from the
   channel at xc: the input under each position, 0 in the padding. */
static inline void ts_conv_run_{S}(const ts_conv_geom* g, const {T}* xc, int64_t zo, int64_t yo,
                                   int64_t xo, int64_t run, int64_t oz, int64_t oy, int64_t ox,
                                   {T}* o) {
  int64_t zi = zo * g->s[0] + oz, yi = yo * g->s[1] + oy, sx = g->s[2];
  if (zi < 0 || zi >= g->in[0] || yi < 0 || yi >= g->in[1]) {
    for (int64_t t = 0; t < run; ++t) o[t] = 0;
    return;
  }
  const {T}* row = xc + (zi * g->in[1] + yi) * g->in[2];
  int64_t xb = xo * sx + ox;                                   /* input column of the first */
  int64_t lo = xb >= 0 ? 0 : sx == 1 ? -xb : (-xb + sx - 1) / sx;        /* the run's part */
  int64_t hi = xb >= g->in[2] ? 0 : sx == 1 ? g->in[2] - xb              /* inside the row */
                                          : (g->in[2] - xb + sx - 1) / sx;
  if (lo > run) lo = run;
  if (hi > run) hi = run;
  if (hi < lo) hi = lo;
  for (int64_t t = 0; t < lo; ++t) o[t] = 0;
  if (sx == 1) {                          /* (a loop, not memcpy: runs are short) */
    const {T}* src = row + xb;
    for (int64_t t = lo; t < hi; ++t) o[t] = src[t];
  } else {
    for (int64_t t = lo; t < hi; ++t) o[t] = row[xb + t * sx];
  }
  for (int64_t t = hi; t < run; ++t) o[t] = 0;
}

/* The output positions [p0, p0 + n) as runs along output rows, each its first position's (zo,
   yo, xo) and its length, into runs (n / out[2] + 2 of them at most); returns the count. */
static int64_t ts_conv_runs(const ts_conv_geom* g, int64_t p0, int64_t n, int64_t* runs) {
  int64_t plane = g->out[1] * g->out[2], count = 0;
  int64_t zo = p0 / plane, yo = (p0 / g->out[2]) % g->out[1], xo = p0 % g->out[2];
  for (int64_t j = 0; j < n; ++count) {
    int64_t run = g->out[2] - xo < n - j ? g->out[2] - xo : n - j;
    int64_t* r = runs + 4 * count;
    r[0] = zo; r[1] = yo; r[2] = xo; r[3] = run;
    j += run;
    xo += run;
    if (xo == g->out[2]) {
      xo = 0;
      if (++yo == g->out[1]) { yo = 0; ++zo; }
    }
  }
  return count;
}

/* Row (c, kz, ky, kx) of B over a tile's runs (ts_conv_runs) into dst. A row of a few hundred
   positions cost as much in finding its runs (divisions) as in its copy: a tile finds them
   once for all its rows. */
static void ts_conv_fill_{S}(const ts_conv_geom* g, const {T}* X, int64_t c, int64_t kz,
                             int64_t ky, int64_t kx, const int64_t* runs, int64_t count,
                             {T}* dst) {
  const {T}* xc = X + c * g->cs;
  int64_t oz = kz * g->d[0] - g->p[0], oy = ky * g->d[1] - g->p[1], ox = kx * g->d[2] - g->p[2];
  for (int64_t q = 0; q < count; ++q, runs += 4) {
    ts_conv_run_{S}(g, xc, runs[0], runs[1], runs[2], runs[3], oz, oy, ox, dst);
    dst += runs[3];
  }
}

/* Output rows narrower than this (small images) pack by an index per position instead: a
   run's bounds and branches cost more than its copy. */
#define TS_CONV_SHORT_RUN 32

/* For a tile of short runs: idx[r * nt + j], where position j finds its input under kernel
   offset r (r = (kz, ky, kx) of the KK) in a channel's plane, -1 in the padding. */
static void ts_conv_index(const ts_conv_geom* g, const int64_t* runs, int64_t count,
                          int64_t nt, int32_t* idx) {
  int64_t r = 0;
  for (int64_t kz = 0; kz < g->k[0]; ++kz)
    for (int64_t ky = 0; ky < g->k[1]; ++ky)
      for (int64_t kx = 0; kx < g->k[2]; ++kx, ++r) {
        int32_t* o = idx + r * nt;
        for (int64_t q = 0; q < count; ++q) {
          const int64_t* u = runs + 4 * q;
          int64_t zi = u[0] * g->s[0] + kz * g->d[0] - g->p[0];
          int64_t yi = u[1] * g->s[1] + ky * g->d[1] - g->p[1];
          int in = zi >= 0 && zi < g->in[0] && yi >= 0 && yi < g->in[1];
          for (int64_t t = 0; t < u[3]; ++t) {
            int64_t xi = (u[2] + t) * g->s[2] + kx * g->d[2] - g->p[2];
            *o++ = in && xi >= 0 && xi < g->in[2]
                       ? (int32_t)((zi * g->in[1] + yi) * g->in[2] + xi) : -1;
          }
        }
      }
}

/* n values of B's row from the channel at xc by an index row (ts_conv_index) */
static inline void ts_conv_gather_{S}(const {T}* restrict xc, const int32_t* restrict idx,
                                      int64_t n, {T}* restrict dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = idx[j] >= 0 ? xc[idx[j]] : ({T})0;
}

/* One element of B, for the path without scratch memory. */
static {T} ts_conv_at_{S}(const ts_conv_geom* g, const {T}* X, int64_t k, int64_t p) {
  int64_t kk = g->k[0] * g->k[1] * g->k[2], r = k % kk, run[4];
  {T} v;
  ts_conv_runs(g, p, 1, run);
  ts_conv_fill_{S}(g, X, k / kk, r / (g->k[1] * g->k[2]), (r / g->k[2]) % g->k[1], r % g->k[2],
                   run, 1, &v);
  return v;
}

/* A block of nv vectors of outputs from c: each its fma chain over k from 0 (ts_conv_plane). */
static inline __attribute__((always_inline)) void ts_conv_block_{S}(
    const {T}* W, int64_t K, const int64_t* off, const {T}* src, {T}* c, int64_t n,
    const int nv) {
  ts_v_{S} acc[TS_WINDOW_SV];
#pragma GCC unroll 4
  for (int v = 0; v < nv; ++v) acc[v] = ts_vzero_{S}();
  for (int64_t k = 0; k < K; ++k) {
    const ts_v_{S} a = ts_vset1_{S}(W[k]);
    const {T}* b = src + off[k];
#pragma GCC unroll 4
    for (int v = 0; v < nv; ++v) acc[v] = ts_vfma_{S}(a, ts_vload_{S}(b + v * TS_VL_{S}), acc[v]);
  }
  ts_window_store_{S}(acc, c, n, nv);
}

/* One output channel (mt == 1: a depthwise convolution's) over whole output rows of a 1-D or
   2-D convolution, a block of them at a time (ts_window_block): the rows the block reads
   laid out zero-padded (ts_window_rows), then each run of outputs summed in registers over k
   while the next task's input is prefetched: the chains of the packed path (a tap in the
   padding adds fma(w, 0)), its rows of B never written out. Returns 0 where the layout does
   not apply: the general path runs. */
static int ts_conv_plane_{S}(const ts_conv_geom* g, const {T}* W, int64_t K, const {T}* X,
                             int64_t j0, int64_t nt, {T}* C) {
  const int64_t kk = g->k[0] * g->k[1] * g->k[2], cg = K / kk;
  if (K % kk) return 0;
  const int64_t out2 = g->out[2], step = TS_WINDOW_SV * TS_VL_{S};
  const int64_t block = ts_window_block_{S}(g, cg, j0, nt);
  for (int64_t q = 0; q < nt; q += block) {
    const int64_t m = nt - q < block ? nt - q : block;
    int64_t line, *off, ahead_bytes;
    const {T}* pad = ts_window_rows_{S}(g, X, cg, j0 + q, m, ({T})0, &line, &off);
    if (!pad) return 0;               /* (the first block only: the others are no larger) */
    const {T}* ahead = ts_window_next_{S}(g, X, (j0 + q) / out2, m / out2, &ahead_bytes);
    if (cg > 1) ahead_bytes = 0;      /* (several channels: not one run) */
    for (int64_t r = 0; r < m / out2; ++r) {
      ts_window_ahead_{S}(ahead, ahead_bytes, r, m / out2);
      const {T}* src = pad + r * g->s[1] * line;
      {T}* c = C + q + r * out2;
      for (int64_t t0 = 0; t0 < out2; t0 += step) {
        int64_t n = out2 - t0 < step ? out2 - t0 : step, nv = (n + TS_VL_{S} - 1) / TS_VL_{S};
        if (nv == 4) ts_conv_block_{S}(W, K, off, src + t0, c + t0, n, 4);
        else if (nv == 3) ts_conv_block_{S}(W, K, off, src + t0, c + t0, n, 3);
        else if (nv == 2) ts_conv_block_{S}(W, K, off, src + t0, c + t0, n, 2);
        else ts_conv_block_{S}(W, K, off, src + t0, c + t0, n, 1);
      }
    }
  }
  return 1;
}

/* n values from src into row q of B's panels (kc rows each) from column col on. */
static inline void ts_conv_panel_put_{S}({T}* restrict pb, int64_t kc, int64_t q, int64_t col,
                                         const {T}* restrict src, int64_t n) {
  while (n > 0) {
    int64_t j = col % TS_NR_{S}, m = TS_NR_{S} - j < n ? TS_NR_{S} - j : n;
    {T}* dst = pb + (col / TS_NR_{S}) * TS_NR_{S} * kc + q * TS_NR_{S} + j;
    int64_t t = 0;                    /* (vectors: gcc makes a loop of short copies memmove) */
    for (; t + TS_VL_{S} <= m; t += TS_VL_{S}) ts_vstore_{S}(dst + t, ts_vload_{S}(src + t));
    for (; t < m; ++t) dst[t] = src[t];
    col += m;
    src += m;
    n -= m;
  }
}

/* The direct path's micro-tile (its shape TS_DMR x TS_DNV, measured apart from the GEMM's):
   TS_DMR output positions (each where it lies in the laid-out rows) by TS_DNV vectors of output
   channels: C[r][j] (+)= the sum over k of the window's value under position r (pad + off[k] +
   f[r], broadcast) times W's transposed panel (pb[k][j]), B never packed; C is the tile of
   positions by channels. The weight gradient runs it with the tables' roles swapped: a row per
   tap (fp: its line), k over the positions (off: each one's place). Each element is the fma
   chain over k of the packed path (the same products, exact before their one rounding, in the
   same order), so the same bits. Listed: the steps are the block's k that a list keeps
   (ts_conv_skips: off[2t] the step's offset, off[2t + 1] its row of pb, one stream: a register
   fewer), and row r of the tile is C + crow[r] (positions grouped by the taps they skip: their
   rows stay in place). */
#define TS_DNR_{S} (TS_DNV * TS_VL_{S})
static inline __attribute__((always_inline)) void ts_conv_direct_micro_{S}(
    int64_t kc, const {T}* restrict pad, const int64_t* restrict off, const int listed,
    const int64_t* restrict fp, const {T}* restrict b, {T}* restrict c,
    const int64_t* restrict crow, int64_t ldc, int first) {
  ts_v_{S} acc[TS_DMR][TS_DNV];
  const {T}* xr[TS_DMR];                /* (each position's base: a load's one address mode) */
  {T}* cr[TS_DMR];
#if defined(__GNUC__)
  if (listed) __asm__("" : "+r"(b));    /* (b one register: gcc kept its parts in two) */
#endif
#pragma GCC unroll 16
  for (int r = 0; r < TS_DMR; ++r) xr[r] = pad + fp[r];
#pragma GCC unroll 16
  for (int r = 0; r < TS_DMR; ++r) cr[r] = c + (crow ? crow[r] : r * ldc);
#pragma GCC unroll 16
  for (int r = 0; r < TS_DMR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < TS_DNV; ++v)
      acc[r][v] = first ? ts_vzero_{S}() : ts_vload_{S}(cr[r] + v * TS_VL_{S});
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const int64_t o = listed ? off[2 * k] : off[k];
    const {T}* bk = b + (listed ? off[2 * k + 1] : k * TS_DNR_{S});
    ts_v_{S} bv[TS_DNV];
#pragma GCC unroll 4
    for (int v = 0; v < TS_DNV; ++v) bv[v] = ts_vload_{S}(bk + v * TS_VL_{S});
#pragma GCC unroll 16
    for (int r = 0; r < TS_DMR; ++r) {
      ts_v_{S} ar = ts_vset1_{S}(xr[r][o]);
#pragma GCC unroll 4
      for (int v = 0; v < TS_DNV; ++v) acc[r][v] = ts_vfma_{S}(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < TS_DMR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < TS_DNV; ++v) ts_vstore_{S}(cr[r] + v * TS_VL_{S}, acc[r][v]);
}

/* One K block of the direct path: each of W's transposed panels (pb: npc channels; in L1)
   against every group of the npos positions (a multiple of TS_DMR) of the tile C. */
static void ts_conv_direct_{S}(const {T}* pb, int64_t npc, const {T}* pad, const int64_t* off,
                               int64_t kc, const int64_t* fp, int64_t npos, {T}* C, int first) {
  for (int64_t jr = 0; jr < npc; jr += TS_DNR_{S})
    for (int64_t ir = 0; ir < npos; ir += TS_DMR)
      ts_conv_direct_micro_{S}(kc, pad, off, 0, fp + ir, pb + jr * kc, C + ir * npc + jr, 0,
                               npc, first);
}

/* W[0:mt, 0:kc] (rows ldw apart) transposed into the direct path's panels of TS_DNR channels,
   kall deep (kc of them here): pb[jr kall + k TS_DNR + j], zero past mt. With check, whether
   every value packed is finite (else 1). */
static int ts_conv_direct_pack_{S}(const {T}* W, int64_t ldw, int64_t mt, int64_t kc,
                                   int64_t kall, {T}* pb, int check) {
  int finite = 1;
  for (int64_t jr = 0; jr < mt; jr += TS_DNR_{S}, pb += TS_DNR_{S} * kall) {
    int64_t n = mt - jr < TS_DNR_{S} ? mt - jr : TS_DNR_{S};
    ts_transpose_{S}(W + jr * ldw, ldw, pb, TS_DNR_{S}, kc, n);
    for (int64_t k = 0; k < kc && n < TS_DNR_{S}; ++k)
      for (int64_t j = n; j < TS_DNR_{S}; ++j) pb[k * TS_DNR_{S} + j] = 0;
    if (check)                        /* (the panel still in L1; x - x is 0 for a finite x) */
      for (int64_t q = 0; q < kc * TS_DNR_{S}; ++q) finite &= pb[q] - pb[q] == 0;
  }
  return finite;
}

/* The direct path is taken where at least this share (%) of its channel vectors' lanes are
   output channels (the packed path's rows come TS_MR at a time). */
#define TS_CONV_DIRECT_USE 85

/* Taps in the padding, skipped. A window that reaches past the input's edge reads zeros there,
   and fma(w, 0, c) is c for a finite w (c is never -0: a chain from +0 reaches -0 only through a
   product that underflows past the subnormals), so the direct path leaves those taps out (a
   7x7 image's 3x3 windows are 18% padding, a 2x2 one's 56%). The positions are grouped by the
   taps their windows keep (image after image within a group), each micro-tile runs the union
   of its positions' taps, and their rows of the tile stay where they were. Where a K block's
   weights are not all finite (inf x 0 is NaN) or the kernel has more than 64 taps, every tap
   runs. */
#define TS_CONV_LISTS 16             /* the micro-tiles' distinct tap sets a tile keeps lists of */
#define TS_CONV_CLASSES 64           /* the positions' distinct tap sets grouped (more: in place) */
#define TS_CONV_SKIP_MIN 12          /* the share (%) of the steps skipped worth the lists */

/* Bit r set where tap r (of at most 64) of output position p's window lies inside the input. */
static uint64_t ts_conv_taps_in(const ts_conv_geom* g, int64_t p) {
  int64_t plane = g->out[1] * g->out[2];
  int64_t o[3] = {p / plane, p / g->out[2] % g->out[1], p % g->out[2]}, r = 0;
  uint64_t m = 0;
  for (int64_t kz = 0; kz < g->k[0]; ++kz)
    for (int64_t ky = 0; ky < g->k[1]; ++ky)
      for (int64_t kx = 0; kx < g->k[2]; ++kx, ++r) {
        int64_t i[3] = {o[0] * g->s[0] + kz * g->d[0] - g->p[0],
                        o[1] * g->s[1] + ky * g->d[1] - g->p[1],
                        o[2] * g->s[2] + kx * g->d[2] - g->p[2]};
        int in = 1;
        for (int a = 0; a < 3; ++a) in = in && i[a] >= 0 && i[a] < g->in[a];
        m |= (uint64_t)in << r;
      }
  return m;
}

/* Whether the windows' taps in the padding are worth lists: at most 64 taps, and at least
   TS_CONV_SKIP_MIN% of them over the output positions (decided at once, before any grouping:
   grouping 56 x 56 positions cost 4%). */
static int ts_conv_skipping(const ts_conv_geom* g) {
  double inside = 1.0;
  for (int a = 0; a < 3; ++a) {
    int64_t n = 0;
    for (int64_t o = 0; o < g->out[a]; ++o)
      for (int64_t k = 0; k < g->k[a]; ++k) {
        int64_t i = o * g->s[a] + k * g->d[a] - g->p[a];
        n += i >= 0 && i < g->in[a];
      }
    inside *= (double)n / (double)(g->out[a] * g->k[a]);
  }
  return g->k[0] * g->k[1] * g->k[2] <= 64 && 100 * (1 - inside) >= TS_CONV_SKIP_MIN;
}

/* The list of each micro-tile (TS_DMR slots from t TS_DMR, of which the first `real` are used)
   whose steps are kept for tap set m(slot) (OR of its slots'): tl[t], an index into lmask
   (lmask[0]: every tap, also where TS_CONV_LISTS sets would not do); returns the count. */
static int64_t ts_conv_lists_of(int64_t npos, int64_t real, const uint64_t* slotmask,
                                uint64_t full, int64_t* tl, uint64_t* lmask) {
  int64_t nl = 1;
  lmask[0] = full;
  for (int64_t t = 0; t < npos / TS_DMR; ++t) {
    uint64_t m = 0;
    for (int64_t r = t * TS_DMR; r < (t + 1) * TS_DMR && r < real; ++r) m |= slotmask[r];
    int64_t l = 0;
    while (l < nl && lmask[l] != m) ++l;
    if (l == nl) {
      if (nl < TS_CONV_LISTS) lmask[nl++] = m;
      else l = 0;
    }
    tl[t] = l;
  }
  return nl;
}

/* The slots of the direct path's npos rows: fp (each one's place in the layout), crow (its row
   of the tile, times npc), tl (each micro-tile's tap set, an index into lmask); returns the
   sets' count, or 0 where the micro-tiles would skip under TS_CONV_SKIP_MIN% of their steps
   (the lists' loads and the grouped positions' scattered reads cost 2-5%: 28 x 28 images, 5%
   of whose taps are padding, ran 2% slower): fp then the positions in order, and no lists.
   cls: nt + TS_CONV_CLASSES + npos int64s of scratch. */
static int64_t ts_conv_group(const ts_conv_geom* g, int64_t nimg, int64_t nt, int64_t j0,
                             int64_t isz, int64_t pline, int64_t npos, int64_t npc,
                             int64_t* fp, int64_t* crow, int64_t* tl, uint64_t* lmask,
                             int64_t* cls) {
  int64_t kk = g->k[0] * g->k[1] * g->k[2], out2 = g->out[2], nc = 0, s = 0;
  uint64_t full = kk >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << kk) - 1;
  uint64_t* cmask = (uint64_t*)(cls + nt);
  uint64_t* smask = cmask + TS_CONV_CLASSES;      /* each slot's taps */
  if (!ts_conv_skipping(g)) goto in_order;
  for (int64_t j = 0; j < nt; ++j) {            /* each position's taps inside the input */
    uint64_t m = ts_conv_taps_in(g, j0 + j);
    int64_t c = 0;
    while (c < nc && cmask[c] != m) ++c;
    if (c == nc) {
      if (nc == TS_CONV_CLASSES) goto in_order;
      cmask[nc++] = m;
    }
    cls[j] = c;
  }
  for (int64_t c = 0; c < nc; ++c)                 /* the slots class by class */
    for (int64_t i = 0; i < nimg; ++i)
      for (int64_t j = 0; j < nt; ++j)
        if (cls[j] == c) {
          int64_t q = i * nt + j;
          fp[s] = i * isz + j / out2 * g->s[1] * pline + j % out2;
          smask[s] = cmask[c];
          crow[s++] = q * npc;
        }
  for (; s < npos; ++s) {                        /* spare rows: the last position's, unused */
    fp[s] = fp[nimg * nt - 1];
    crow[s] = s * npc;
  }
  int64_t nl = ts_conv_lists_of(npos, nimg * nt, smask, full, tl, lmask), kept = 0;
  for (int64_t t = 0; t < npos / TS_DMR; ++t) kept += __builtin_popcountll(lmask[tl[t]]);
  if (100 * kept <= (100 - TS_CONV_SKIP_MIN) * kk * (npos / TS_DMR)) return nl;
in_order:                                        /* (too few to skip: the positions in order) */
  for (s = 0; s < npos; ++s) {
    int64_t q = s < nimg * nt ? s : nimg * nt - 1;
    fp[s] = q / nt * isz + q % nt / out2 * g->s[1] * pline + q % out2;
  }
  return 0;
}

/* A K block's steps per tap set l: pairs of the layout's offset and the row of W's panels of
   the block's k whose tap (pc + k) % kk the set keeps, in order; count[l] of them. */
static void ts_conv_skips(const int64_t* off, int64_t pc, int64_t kc, int64_t kk,
                          const uint64_t* lmask, int64_t nl, int64_t kcap, int64_t* lists,
                          int64_t* count) {
  for (int64_t l = 0; l < nl; ++l) {
    int64_t *lo = lists + 2 * l * kcap, n = 0;
    for (int64_t k = 0, r = pc % kk; k < kc; ++k, r = r + 1 < kk ? r + 1 : 0)   /* (r: k's tap) */
      if (r >= 64 || lmask[l] >> r & 1) {
        lo[2 * n] = off[k];
        lo[2 * n++ + 1] = k * TS_DNR_{S};
      }
    count[l] = n;
  }
}

/* One K block of the direct path over the slots of ts_conv_group: micro-tile t runs list tl[t]
   (tl 0: every one list 0, every tap), its rows of C at crow. (A function of its own: inlined
   into the tile's, its registers spill.) */
__attribute__((noinline))
static void ts_conv_direct_listed_{S}(const {T}* pb, int64_t npc, int64_t kc, const {T}* pad,
                                      const int64_t* lists, int64_t kcap, const int64_t* count,
                                      const int64_t* tl, const int64_t* fp, const int64_t* crow,
                                      int64_t npos, {T}* C, int first) {
  for (int64_t jr = 0; jr < npc; jr += TS_DNR_{S})
    for (int64_t ir = 0; ir < npos; ir += TS_DMR) {
      int64_t l = tl ? tl[ir / TS_DMR] : 0;
      ts_conv_direct_micro_{S}(count[l], pad, lists + 2 * l * kcap, 1, fp + ir, pb + jr * kc,
                               C + jr, crow + ir, npc, first);
    }
}

/* Overwrites the mt x nt block at C (row stride ldc) with W[0:mt, 0:K] @ B[0:K, j0:j0+nt]:
   every element the fma chain over k = 0, 1, ... from 0 that the GEMM routine computes for the
   same product with B in memory, so a convolution has the bits of its im2col matmul. W's rows
   have stride ldw; X points at the group's first input channel of one image.
   nimg > 1: the columns are every position of nimg images (j0 = 0, nt = the positions of one),
   image i's input at X + i xs and its block of the output at C + i ys (small images: a tile of
   one image's few positions would leave the micro-tiles' columns part empty and pack A for
   little work). The tile is computed in scratch memory and copied out image by image. */
static void ts_conv_tile_{S}(const {T}* W, int64_t ldw, const {T}* X, {T}* C, int64_t ldc,
                             int64_t K, int64_t mt, int64_t nt, int64_t KC, int64_t j0,
                             int64_t cs, int64_t in0, int64_t in1, int64_t in2, int64_t k0,
                             int64_t k1, int64_t k2, int64_t out0, int64_t out1, int64_t out2,
                             int64_t s0, int64_t s1, int64_t s2, int64_t d0, int64_t d1,
                             int64_t d2, int64_t p0, int64_t p1, int64_t p2, int64_t nimg,
                             int64_t xs, int64_t ys) {
  ts_conv_geom g = {cs, {in0, in1, in2}, {k0, k1, k2}, {out0, out1, out2}, {s0, s1, s2},
                    {d0, d1, d2}, {p0, p1, p2}};
  if (nimg > 1 && (mt == 1 || nimg * nt <= 2)) {   /* one row (a last row tile): image by image */
    for (int64_t i = 0; i < nimg; ++i)
      ts_conv_tile_{S}(W, ldw, X + i * xs, C + i * ys, ldc, K, mt, nt, KC, j0, cs, in0, in1, in2,
                       k0, k1, k2, out0, out1, out2, s0, s1, s2, d0, d1, d2, p0, p1, p2, 1, 0, 0);
    return;
  }
  if (mt == 1 && K > 0 && ts_conv_plane_{S}(&g, W, K, X, j0, nt, C)) return;
  if (KC <= 0) KC = 256;
  int64_t cols = nimg * nt;                 /* the product's columns */
  int64_t kcap = K < KC ? K : KC;
  int64_t mp = (mt + TS_MR - 1) / TS_MR * TS_MR;
  int64_t np = (cols + TS_NR_{S} - 1) / TS_NR_{S} * TS_NR_{S};
  int narrow = mt == 1 || cols <= 2;
  int64_t nruns = nt / out2 + 2, kk = k0 * k1 * k2;          /* (ts_conv_runs' bound) */
  /* 1-D and 2-D tiles of whole output rows: each K block's channels of an image laid out
     padded once (ts_window_lay). Direct (the output channels fill the channel vectors): the
     micro-tiles read the windows' values where the layout holds them, into a tile of positions
     by channels transposed out at the end. Otherwise, rows of 16 or more: B's rows copied from
     the layout row by row into the panels (shorter rows cost about as much to lay out as to
     gather); shorter ones gathered by an index. */
  int64_t cgmax = kcap / kk + 2 < K / kk ? kcap / kk + 2 : K / kk, pline = 0;
  int64_t psize = narrow || j0 % out2 || nt % out2 ? 0
                  : ts_window_size_{S}(&g, cgmax, nt / out2, &pline);
  int64_t npc = (mt + TS_DNR_{S} - 1) / TS_DNR_{S} * TS_DNR_{S};   /* direct: channels, */
  int64_t npos = (nimg * nt + TS_DMR - 1) / TS_DMR * TS_DMR;        /* every image's positions */
  int laid = psize > 0 && psize <= ((int64_t)1 << 20);
  int64_t isz = psize;                   /* direct: the images laid out one after another */
  int direct = laid && nimg * isz <= ((int64_t)1 << 20) && 100 * mt >= TS_CONV_DIRECT_USE * npc;
  if (direct) psize = nimg * isz;
  int rowwise = laid && !direct && out2 >= TS_CONV_SHORT_RUN / 2;
  if (!direct && !rowwise) psize = 0;
  int indexed = !narrow && !direct && !rowwise && out2 < TS_CONV_SHORT_RUN &&
                in0 * in1 * in2 < INT32_MAX && kk * nt <= (1 << 20);
  size_t ioff = sizeof(int64_t) / sizeof({T});
  size_t table = (size_t)(4 * nruns) * ioff + 16 +
                 (indexed ? (size_t)(kk * nt) * sizeof(int32_t) / sizeof({T}) + 1 : 0) +
                 (psize ? (size_t)psize + (size_t)(cgmax * kk) * ioff + 32 : 0) +
                 (direct ? (size_t)(3 * npos + npos / TS_DMR + nt + 2 * TS_CONV_LISTS +
                                   TS_CONV_CLASSES + 2 * TS_CONV_LISTS * kcap) * ioff
                         : 0);
  size_t need = narrow ? (size_t)kcap * (size_t)nt
                : direct ? (size_t)npc * (size_t)kcap + (size_t)(npos * npc)
                         : (size_t)(mp + np) * (size_t)kcap + (size_t)np +
                           (nimg > 1 ? (size_t)mt * (size_t)cols : 0);
  {T}* pa = K <= 0 ? 0 : ts_scratch_{S}(need + table);
  if (!pa) {                     /* K = 0, or no memory: the same fma chains, element by element */
    for (int64_t i = 0; i < nimg; ++i)
      for (int64_t r = 0; r < mt; ++r)
        for (int64_t j = 0; j < nt; ++j) {
          {T} acc = 0;
          for (int64_t k = 0; k < K; ++k)
            acc = fma{F}(W[r * ldw + k], ts_conv_at_{S}(&g, X + i * xs, k, j0 + j), acc);
          C[i * ys + r * ldc + j] = acc;
        }
    return;
  }
  int64_t* runs = (int64_t*)(((uintptr_t)(pa + need) + 63) & ~(uintptr_t)63);
  int64_t count = ts_conv_runs(&g, j0, nt, runs);
  int32_t* idx = (int32_t*)(runs + 4 * nruns);
  if (indexed) ts_conv_index(&g, runs, count, nt, idx);
  {T}* pad = ({T}*)(((uintptr_t)(runs + 4 * nruns) + 63) & ~(uintptr_t)63);
  int64_t* off = (int64_t*)(((uintptr_t)(pad + psize) + 63) & ~(uintptr_t)63);
  if (mt == 1) {                 /* one output row (a depthwise convolution): B's rows streamed */
    for (int64_t j = 0; j < nt; ++j) C[j] = 0;
    for (int64_t k = 0; k < K; ++k) {
      const {T} a = W[k];
      int64_t r = k % kk;
      ts_conv_fill_{S}(&g, X, k / kk, r / (k1 * k2), (r / k2) % k1, r % k2, runs, count, pa);
      for (int64_t j = 0; j < nt; ++j) C[j] = fma{F}(a, pa[j], C[j]);
    }
    return;
  }
  if (narrow) {                  /* one or two columns: B's rows unpacked, no micro-tile */
    {T}* rows = pa;
    for (int64_t pc = 0; pc < K; pc += KC) {
      int64_t kc = K - pc < KC ? K - pc : KC;
      for (int64_t q = 0; q < kc; ++q) {
        int64_t r = (pc + q) % kk;
        ts_conv_fill_{S}(&g, X, (pc + q) / kk, r / (k1 * k2), (r / k2) % k1, r % k2, runs,
                         count, rows + q * nt);
      }
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
  if (direct) {                  /* the windows read where they are laid out, B never packed */
    int64_t* fp = off + cgmax * kk;      /* each slot's place in the layout, grouped by taps */
    int64_t *crow = fp + npos, *tl = crow + npos, *count = tl + npos / TS_DMR;
    uint64_t* lmask = (uint64_t*)(count + TS_CONV_LISTS);
    int64_t* cls = (int64_t*)(lmask + TS_CONV_LISTS);
    int64_t* lists = cls + nt + TS_CONV_CLASSES + npos;
    {T}* tile = pa + npc * kcap;         /* positions x channels, image after image */
    int64_t nl = ts_conv_group(&g, nimg, nt, j0, isz, pline, npos, npc, fp, crow, tl, lmask,
                               cls);          /* (0: no lists, positions in order) */
    for (int64_t pc = 0; pc < K; pc += KC) {
      int64_t kc = K - pc < KC ? K - pc : KC, c = pc / kk;
      int finite = ts_conv_direct_pack_{S}(W + pc, ldw, mt, kc, kc, pa, nl > 0);
      for (int64_t i = 0; i < nimg; ++i)
        ts_window_lay_{S}(&g, X + i * xs + c * cs, (pc + kc - 1) / kk - c + 1, j0 / out2,
                          nt / out2, 0, pad + i * isz, i ? 0 : off);
      if (!nl) {
        ts_conv_direct_{S}(pa, npc, pad, off + pc % kk, kc, fp, npos, tile, pc == 0);
        continue;
      }
      ts_conv_skips(off + pc % kk, pc, kc, kk, lmask, nl, kcap, lists, count);
      ts_conv_direct_listed_{S}(pa, npc, kc, pad, lists, kcap, count, finite ? tl : 0, fp, crow,
                                npos, tile, pc == 0);
    }
    for (int64_t i = 0; i < nimg; ++i)
      ts_transpose_{S}(tile + i * nt * npc, npc, C + i * ys, ldc, mt, nt);
    return;
  }
  {T}* pb = pa + mp * kcap;
  {T}* line = pb + np * kcap;
  {T}* out = nimg > 1 ? line + np : C;     /* (several images: the tile, then copied out) */
  int64_t ldo = nimg > 1 ? cols : ldc;
  for (int64_t pc = 0; pc < K; pc += KC) {
    int64_t kc = K - pc < KC ? K - pc : KC;
    int64_t c = pc / kk, r = pc % kk;       /* row pc's (c, kz, ky, kx), then counted up */
    int64_t kz = r / (k1 * k2), ky = (r / k2) % k1, kx = r % k2;
    if (rowwise) {                         /* B's rows from each image's laid-out rows */
      int64_t cg = (pc + kc - 1) / kk - c + 1;
      for (int64_t i = 0; i < nimg; ++i) {
        ts_window_lay_{S}(&g, X + i * xs + c * cs, cg, j0 / out2, nt / out2, 0, pad, off);
        for (int64_t q = 0; q < kc; ++q) {
          const {T}* src = pad + off[pc + q - c * kk];
          for (int64_t rr = 0; rr < nt / out2; ++rr)
            ts_conv_panel_put_{S}(pb, kc, q, i * nt + rr * out2, src + rr * s1 * pline, out2);
        }
      }
      for (int64_t q = 0; q < kc; ++q)     /* the last panel's columns past the product's */
        for (int64_t j = cols; j < np; ++j)
          pb[(j / TS_NR_{S}) * TS_NR_{S} * kc + q * TS_NR_{S} + j % TS_NR_{S}] = 0;
    }
    for (int64_t q = 0; q < kc && !rowwise; ++q) {     /* B's rows into NR-column panels */
      for (int64_t i = 0; i < nimg; ++i) {
        if (indexed)
          ts_conv_gather_{S}(X + i * xs + c * cs, idx + ((kz * k1 + ky) * k2 + kx) * nt, nt,
                             line + i * nt);
        else
          ts_conv_fill_{S}(&g, X + i * xs, c, kz, ky, kx, runs, count, line + i * nt);
      }
      if (++kx == k2) { kx = 0; if (++ky == k1) { ky = 0; if (++kz == k0) { kz = 0; ++c; } } }
      int64_t whole = cols / TS_NR_{S} * TS_NR_{S};
      for (int64_t jr = 0; jr < whole; jr += TS_NR_{S}) {
        {T}* dst = pb + jr * kc + q * TS_NR_{S};
#pragma GCC unroll 4
        for (int v = 0; v < TS_NV; ++v)
          ts_vstore_{S}(dst + v * TS_VL_{S}, ts_vload_{S}(line + jr + v * TS_VL_{S}));
      }
      if (whole < cols) {
        {T}* dst = pb + whole * kc + q * TS_NR_{S};
        for (int64_t j = 0; j < TS_NR_{S}; ++j) dst[j] = whole + j < cols ? line[whole + j] : 0;
      }
    }
    ts_gemm_block_rows_{S}(W + pc, ldw, pb, out, ldo, kc, mt, cols, pc == 0, pa);
  }
  if (nimg > 1)
    for (int64_t i = 0; i < nimg; ++i)
      for (int64_t r = 0; r < mt; ++r)
        memcpy(C + i * ys + r * ldc, out + r * ldo + i * nt, sizeof({T}) * (size_t)nt);
}

/* The weight gradient's direct path skips the same taps (its roles swapped: the tile's rows are
   taps, its steps the positions, a step of a row skipped where that position's window has the
   tap in the padding): the rows grouped by tap (perm[s]: slot s's row of the task's columns,
   crow its row of the tile times npc), each micro-tile's steps the positions where any of its
   taps is inside (tl, lmask: as ts_conv_group's). Returns the lists' count, or 0 (perm in
   order) where too few steps would be skipped. in: each output position's taps inside. */
static int64_t ts_conv_wgroup(const ts_conv_geom* g, int64_t j0, int64_t nt, int64_t npt,
                              int64_t npc, int64_t* perm, int64_t* crow, int64_t* tl,
                              uint64_t* lmask, uint64_t* smask, uint64_t* in) {
  int64_t kk = g->k[0] * g->k[1] * g->k[2], P = g->out[0] * g->out[1] * g->out[2], s = 0;
  uint64_t full = kk >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << kk) - 1;
  if (ts_conv_skipping(g) && nt > 0) {
    for (int64_t t = 0; t < kk; ++t)               /* the task's taps, tap by tap */
      for (int64_t j = (t - j0 % kk + kk) % kk; j < nt; j += kk) {
        perm[s] = j;
        smask[s] = (uint64_t)1 << t;
        crow[s++] = j * npc;
      }
    for (; s < npt; ++s) {                          /* spare rows: the last tap's line, unused */
      perm[s] = nt - 1;
      crow[s] = s * npc;
    }
    for (int64_t p = 0; p < P; ++p) in[p] = ts_conv_taps_in(g, p);
    int64_t nl = ts_conv_lists_of(npt, nt, smask, full, tl, lmask), kept = 0;
    for (int64_t l = 0; l < nl; ++l) {             /* (smask: each list's positions kept) */
      smask[l] = 0;
      for (int64_t p = 0; p < P; ++p) smask[l] += (in[p] & lmask[l]) != 0;
    }
    for (int64_t t = 0; t < npt / TS_DMR; ++t) kept += (int64_t)smask[tl[t]];
    if (100 * kept <= (100 - TS_CONV_SKIP_MIN) * P * (npt / TS_DMR)) return nl;
  }
  for (s = 0; s < npt; ++s) perm[s] = s < nt ? s : nt - 1;
  return 0;
}

/* A block's steps per list l (ts_conv_wgroup): pairs of the layout's offset (fk) and the row of
   the cotangent's panels of the steps k < kc, position p + k % len of an image, that any of
   the list's taps is inside at; count[l] of them. */
static void ts_conv_wskips(const int64_t* fk, const uint64_t* in, int64_t p, int64_t len,
                           int64_t kc, const uint64_t* lmask, int64_t nl, int64_t kcap,
                           int64_t* lists, int64_t* count) {
  for (int64_t l = 0; l < nl; ++l) {
    int64_t *lo = lists + 2 * l * kcap, n = 0;
    for (int64_t k = 0, q = 0; k < kc; ++k, q = q + 1 < len ? q + 1 : 0)   /* (q: k % len) */
      if (in[p + q] & lmask[l]) {
        lo[2 * n] = fk[k];
        lo[2 * n++ + 1] = k * TS_DNR_{S};
      }
    count[l] = n;
  }
}

/* The weight gradient's mt x nt block of dW [O/G, Cg*KK] at C (row stride ldc): the cotangent
   G times the input's windows B over k = (n, p), every position of image 0, then of image 1,
   ...; G's row o of image n at Gd + n gs + o P, B[(n, p), j] the input (image n at X + n xs)
   under position p and j = (c, kz, ky, kx) from j0. Both operands run along k in memory: each
   panel is a block of lines (G's rows; B's columns laid out from the input as the forward
   packing lays out its rows) transposed through registers (ts_transpose). Every element is the
   fma chain over k from 0 that the GEMM routine computes for the windows' matmul (ops/conv.py's
   decomposition), which never exists in memory. */
static void ts_conv_wgrad_tile_{S}(const {T}* Gd, int64_t gs, const {T}* X, int64_t xs, {T}* C,
                                   int64_t ldc, int64_t nimg, int64_t mt, int64_t j0, int64_t nt,
                                   int64_t KC, int64_t cs, int64_t in0, int64_t in1, int64_t in2,
                                   int64_t k0, int64_t k1, int64_t k2, int64_t out0, int64_t out1,
                                   int64_t out2, int64_t s0, int64_t s1, int64_t s2, int64_t d0,
                                   int64_t d1, int64_t d2, int64_t p0, int64_t p1, int64_t p2) {
  ts_conv_geom g = {cs, {in0, in1, in2}, {k0, k1, k2}, {out0, out1, out2}, {s0, s1, s2},
                    {d0, d1, d2}, {p0, p1, p2}};
  int64_t P = out0 * out1 * out2, K = nimg * P, kk = k0 * k1 * k2;
  if (KC <= 0) KC = 256;
  int64_t mp = (mt + TS_MR - 1) / TS_MR * TS_MR;
  int64_t np = (nt + TS_NR_{S} - 1) / TS_NR_{S} * TS_NR_{S};
  /* 1-D and 2-D: K blocks of whole output rows, so that each segment's input rows are laid out
     padded once (ts_window_lay). Direct (the output channels fill the channel vectors): the
     micro-tiles broadcast the taps' values from that layout against the cotangent's transposed
     panels, into a tile of taps by channels transposed out at the end. Otherwise, rows of 16
     or more: every column's line copied from the layout row by row. */
  int64_t c_lo = j0 / kk, cgt = nt > 0 ? (j0 + nt - 1) / kk - c_lo + 1 : 0, pline = 0;
  int64_t KR = KC < out2 ? out2 : KC / out2 * out2;
  int64_t psize = ts_window_size_{S}(&g, cgt, (K < KR ? K : KR) / out2, &pline);
  int laid = psize > 0 && psize <= ((int64_t)1 << 20);
  int64_t npc = (mt + TS_DNR_{S} - 1) / TS_DNR_{S} * TS_DNR_{S};   /* direct: channels, taps */
  int64_t npt = (nt + TS_DMR - 1) / TS_DMR * TS_DMR;
  /* direct: blocks of whole images where one fits a K block (m of them, laid out one after
     another: small images give the micro-tiles long chains), else of whole rows of one; not
     for images of fewer than 8 positions, whose cotangent rows are too short to transpose
     through registers (2x2: 0.75x the packed path's speed) */
  int64_t m = P <= KR ? (KR / P < nimg ? KR / P : nimg) : 1, isz = 0, ln = 0;
  if (laid) isz = ts_window_size_{S}(&g, cgt, (P < KR ? P : KR) / out2, &ln);
  int direct = laid && P >= 8 && m * isz <= ((int64_t)1 << 20) &&
               100 * mt >= TS_CONV_DIRECT_USE * npc;
  if (direct) psize = m * isz;
  int rowwise = laid && !direct && out2 >= TS_CONV_SHORT_RUN / 2;
  if (rowwise || direct) KC = KR;
  int64_t kcap = K < KC ? K : KC;
  /* otherwise small output rows: an index per (kernel offset, position) of an image */
  int indexed = !rowwise && !direct && out2 < TS_CONV_SHORT_RUN && in0 * in1 * in2 < INT32_MAX &&
                kk * P <= (1 << 20);
  int64_t nruns = indexed ? out0 * out1 + 2 : kcap / out2 + 2;    /* (ts_conv_runs' bounds) */
  size_t ioff = sizeof(int64_t) / sizeof({T});
  size_t table = (size_t)(4 * nruns) * ioff + 16 +
                 (indexed ? (size_t)(kk * P) * sizeof(int32_t) / sizeof({T}) + 1 : 0) +
                 (rowwise || direct ? (size_t)psize + (size_t)(cgt * kk) * ioff + 32 : 0) +
                 (direct ? (size_t)(4 * npt + npt / TS_DMR + kcap + 2 * TS_CONV_LISTS + P +
                                   2 * TS_CONV_LISTS * kcap) * ioff
                         : 0);
  size_t need = direct ? (size_t)npc * (size_t)kcap + (size_t)(npt * npc)
                       : (size_t)(mp + np + TS_NR_{S}) * (size_t)kcap;
  {T}* pa = K <= 0 ? 0 : ts_scratch_{S}(need + table);
  if (!pa) {                     /* K = 0, or no memory: the same fma chains, element by element */
    for (int64_t r = 0; r < mt; ++r)
      for (int64_t j = 0; j < nt; ++j) {
        {T} acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc = fma{F}(Gd[(k / P) * gs + r * P + k % P],
                       ts_conv_at_{S}(&g, X + (k / P) * xs, j0 + j, k % P), acc);
        C[r * ldc + j] = acc;
      }
    return;
  }
  {T}* pb = pa + mp * kcap;
  {T}* lines = pb + np * kcap;             /* a panel's columns of B, one line each */
  int64_t* runs = (int64_t*)(((uintptr_t)(pa + need) + 63) & ~(uintptr_t)63);
  int32_t* idx = (int32_t*)(runs + 4 * nruns);
  if (indexed) ts_conv_index(&g, runs, ts_conv_runs(&g, 0, P, runs), P, idx);
  {T}* pad = ({T}*)(((uintptr_t)(runs + 4 * nruns) + 63) & ~(uintptr_t)63);
  int64_t* off = (int64_t*)(((uintptr_t)(pad + psize) + 63) & ~(uintptr_t)63);
  if (direct) {                  /* the windows read where they are laid out, B never packed */
    int64_t* toff = off + cgt * kk;      /* each slot's tap's line in the layout */
    int64_t* fk = toff + npt;            /* each position's place in it, from a block's first */
    int64_t *perm = fk + kcap, *crow = perm + npt, *tl = crow + npt, *count = tl + npt / TS_DMR;
    uint64_t *lmask = (uint64_t*)(count + TS_CONV_LISTS), *smask = lmask + TS_CONV_LISTS;
    uint64_t* in = smask + npt;          /* each position's taps inside the input */
    int64_t* lists = (int64_t*)(in + P);
    {T}* tile = pa + npc * kcap;         /* taps x channels */
    for (int64_t q = 0; q < kcap; ++q)
      fk[q] = q / P * isz + q % P / out2 * s1 * ln + q % out2;
    int64_t nl = ts_conv_wgroup(&g, j0, nt, npt, npc, perm, crow, tl, lmask, smask, in);
    for (int64_t n = 0; n < nimg; n += m)  /* blocks of m images, or of rows of one, in order */
      for (int64_t p = 0; p < P; p += kcap) {
        int64_t len = P - p < kcap ? P - p : kcap, mi = nimg - n < m ? nimg - n : m;
        int finite = 1;
        for (int64_t i = 0; i < mi; ++i) {
          ts_window_lay_{S}(&g, X + (n + i) * xs + c_lo * cs, cgt, p / out2, len / out2, 0,
                            pad + i * isz, i ? 0 : off);
          finite &= ts_conv_direct_pack_{S}(Gd + (n + i) * gs + p, P, mt, len, mi * len,
                                            pa + i * len * TS_DNR_{S}, nl > 0);
        }
        for (int64_t j = 0; j < npt; ++j) toff[j] = off[perm[j] + j0 - c_lo * kk];
        if (!nl) {
          ts_conv_direct_{S}(pa, npc, pad, fk, mi * len, toff, npt, tile, n == 0 && p == 0);
          continue;
        }
        ts_conv_wskips(fk, in, p, len, mi * len, lmask, nl, kcap, lists, count);
        ts_conv_direct_listed_{S}(pa, npc, mi * len, pad, lists, kcap, count, finite ? tl : 0,
                                  toff, crow, npt, tile, n == 0 && p == 0);
      }
    ts_transpose_{S}(tile, npc, C, ldc, mt, nt);
    return;
  }
  for (int64_t pc = 0; pc < K; pc += KC) {
    int64_t kc = K - pc < KC ? K - pc : KC;
    for (int64_t k = pc; k < pc + kc;) {     /* the block's segments, one image's positions each */
      int64_t n = k / P, p = k % P, len = P - p < pc + kc - k ? P - p : pc + kc - k;
      int64_t koff = k - pc, count = indexed || rowwise ? 0 : ts_conv_runs(&g, p, len, runs);
      const {T}* xn = X + n * xs;
      if (rowwise) ts_window_lay_{S}(&g, xn + c_lo * cs, cgt, p / out2, len / out2, 0, pad, off);
      for (int64_t jr = 0; jr < nt; jr += TS_NR_{S}) {    /* B: a panel's lines, transposed */
        for (int64_t j = jr; j < jr + TS_NR_{S}; ++j) {
          {T}* line = lines + (j - jr) * len;
          int64_t jj = j0 + j, c = jj / kk, r = jj % kk;
          if (j >= nt)
            for (int64_t q = 0; q < len; ++q) line[q] = 0;
          else if (rowwise)
            for (int64_t rr = 0; rr < len / out2; ++rr) {
              const {T}* restrict src = pad + off[(c - c_lo) * kk + r] + rr * s1 * pline;
              {T}* restrict dst = line + rr * out2;
              for (int64_t q = 0; q < out2; ++q) dst[q] = src[q];
            }
          else if (indexed)
            ts_conv_gather_{S}(xn + c * cs, idx + r * P + p, len, line);
          else
            ts_conv_fill_{S}(&g, xn, c, r / (k1 * k2), (r / k2) % k1, r % k2, runs, count, line);
        }
        ts_transpose_{S}(lines, len, pb + jr * kc + koff * TS_NR_{S}, TS_NR_{S}, len, TS_NR_{S});
      }
      for (int64_t ir = 0; ir < mt; ir += TS_MR) {       /* A: G's rows, transposed */
        int64_t m = mt - ir < TS_MR ? mt - ir : TS_MR;
        {T}* dst = pa + ir * kc + koff * TS_MR;
        ts_transpose_{S}(Gd + n * gs + ir * P + p, P, dst, TS_MR, len, m);
        for (int64_t q = 0; q < len && m < TS_MR; ++q)
          for (int64_t r = m; r < TS_MR; ++r) dst[q * TS_MR + r] = 0;
      }
      k += len;
    }
    ts_gemm_block_{S}(pa, pb, C, ldc, kc, mt, nt, pc == 0);
  }
}
