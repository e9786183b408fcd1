/* The geometry of a window operator (a convolution, a pool) over three spatial axes (1-D and
   2-D ones have leading axes of size 1), and the zero- or fill-padded layout of the input rows a
   task of whole output rows reads (routines/c_conv.py, c_pool.py). */
typedef struct {
  int64_t cs;                   /* the input's channel stride */
  int64_t in[3], k[3], out[3], s[3], d[3], p[3];
} ts_conv_geom;

/* Up to this many vectors of one output row are computed side by side in registers. */
#define TS_WINDOW_SV 4

/* The padded layout of the input rows that nr output rows of a 1-D or 2-D window operator read
   from cg channels: its size in elements (0 where it does not apply: 3-D, a negative padding),
   and its line, the distance between padded rows. Lines lie end to end (a row's last vector
   reads on into the next line, lanes its caller drops), a vector's overrun after the last. */
static int64_t ts_window_size_{S}(const ts_conv_geom* g, int64_t cg, int64_t nr, int64_t* line) {
  if (g->in[0] != 1 || g->k[0] != 1 || g->out[0] != 1 || g->p[1] < 0 || g->p[2] < 0 || nr <= 0)
    return 0;
  const int64_t s2 = g->s[2];
  const int64_t rows = (nr - 1) * g->s[1] + (g->k[1] - 1) * g->d[1] + 1;   /* padded rows read */
  const int64_t e2 = (g->out[2] - 1) * s2 + (g->k[2] - 1) * g->d[2] + 1;   /* columns read */
  const int64_t pw = (e2 + s2 - 1) / s2;                /* a phase's line */
  *line = s2 * pw;
  return cg * rows * s2 * pw + TS_VL_{S};
}

/* The rows output rows r0 .. r0 + nr - 1 read from cg channels of X copied into pad (of
   ts_window_size's elements) padded with `fill`, each row split into its s2 column phases so
   that every tap reads a contiguous line: tap k = (c, ky, kx) of the r-th of those output rows
   reads its outputs from pad + off[k] + r * s1 * line (off 0: not written, a layout of the same
   shape's already known). */
static void ts_window_lay_{S}(const ts_conv_geom* g, const {T}* X, int64_t cg, int64_t r0,
                              int64_t nr, {T} fill, {T}* pad, int64_t* off) {
  const int64_t out2 = g->out[2], s1 = g->s[1], s2 = g->s[2], d1 = g->d[1], d2 = g->d[2];
  const int64_t k1 = g->k[1], k2 = g->k[2];
  const int64_t rows = (nr - 1) * s1 + (k1 - 1) * d1 + 1;
  const int64_t e2 = (out2 - 1) * s2 + (k2 - 1) * d2 + 1;
  const int64_t pw = (e2 + s2 - 1) / s2, line = s2 * pw, size = cg * rows * line + TS_VL_{S};
  const ts_v_{S} vfill = ts_vset1_{S}(fill);    /* the padding first, all of it at once (a row
                                                   at a time cost most of a small image's) */
  int64_t j0 = 0;
  for (; j0 + TS_VL_{S} <= size; j0 += TS_VL_{S}) ts_vstore_{S}(pad + j0, vfill);
  for (; j0 < size; ++j0) pad[j0] = fill;
  for (int64_t c = 0; c < cg; ++c)
    for (int64_t y = 0; y < rows; ++y) {
      {T}* dst = pad + (c * rows + y) * line;
      const int64_t yi = r0 * s1 + y - g->p[1];
      if (yi < 0 || yi >= g->in[1]) continue;
      const {T}* src = X + c * g->cs + yi * g->in[2];
      int64_t n = g->in[2] < e2 - g->p[2] ? g->in[2] : e2 - g->p[2];
      if (s2 == 1) {                    /* (vectors: short rows, where memcpy's call costs) */
        int64_t j = 0;
        for (; j + TS_VL_{S} <= n; j += TS_VL_{S})
          ts_vstore_{S}(dst + g->p[2] + j, ts_vload_{S}(src + j));
        for (; j < n; ++j) dst[g->p[2] + j] = src[j];
      } else if (s2 == 2) {               /* both phases in one pass over pairs of columns */
        const int64_t q = g->p[2] & 1, base = g->p[2] >> 1;
        {T}* restrict a = dst + q * pw + base;               /* where even columns go */
        {T}* restrict b = dst + (1 - q) * pw + base + q;     /* and odd ones */
        for (int64_t m = 0; m < n / 2; ++m) {
          a[m] = src[2 * m];
          b[m] = src[2 * m + 1];
        }
        if (n & 1) a[n / 2] = src[n - 1];
      } else                            /* phase ph: padded columns ph, ph + s2, ... */
        for (int64_t ph = 0; ph < s2; ++ph) {
          const int64_t lo = g->p[2] > ph ? (g->p[2] - ph + s2 - 1) / s2 : 0;
          const int64_t hi = n + g->p[2] > ph ? (n + g->p[2] - ph + s2 - 1) / s2 : 0;
          const {T}* from = src + ph - g->p[2];
          for (int64_t j = lo; j < hi; ++j) dst[ph * pw + j] = from[j * s2];
        }
    }
  if (!off) return;                      /* (offsets known: a layout of the same shape) */
  for (int64_t kx = 0; kx < k2; ++kx)      /* each tap's line, row 0: a row of taps, then */
    off[kx] = (kx * d2 % s2) * pw + kx * d2 / s2;   /* the others from it (no division per tap: */
  for (int64_t c = 0, k = 0; c < cg; ++c)          /* small images lay out thousands) */
    for (int64_t ky = 0; ky < k1; ++ky, k += k2)
      for (int64_t kx = 0; k > 0 && kx < k2; ++kx)
        off[k + kx] = off[kx] + (c * rows + ky * d1) * line;
}

/* The layout (ts_window_lay) of the rows that output positions [j0, j0 + nt) (whole rows)
   read, in scratch: returns it, its line and its offsets, or 0 where it does not apply (3-D, a
   negative padding, a task not of whole rows, more than 2^20 elements, no memory). */
static const {T}* ts_window_rows_{S}(const ts_conv_geom* g, const {T}* X, int64_t cg, int64_t j0,
                                     int64_t nt, {T} fill, int64_t* line, int64_t** off) {
  const int64_t out2 = g->out[2], K = cg * g->k[1] * g->k[2];
  if (j0 % out2 || nt % out2 || nt == 0) return 0;
  const int64_t size = ts_window_size_{S}(g, cg, nt / out2, line);
  const int64_t ioff = (int64_t)(sizeof(int64_t) / sizeof({T}));
  if (size == 0 || size > ((int64_t)1 << 20)) return 0;
  {T}* pad = ts_scratch_{S}((size_t)(size + (K + 1) * ioff));
  if (!pad) return 0;
  *off = (int64_t*)(((uintptr_t)(pad + size) + 7) & ~(uintptr_t)7);
  ts_window_lay_{S}(g, X, cg, j0 / out2, nt / out2, fill, pad, *off);
  return pad;
}

/* The output positions a block of [j0, j0 + nt) takes (whole rows) so that the input rows it
   reads from cg channels, laid out, fit in 16 KiB and stay in L1 while they are written and
   folded (a whole plane's went through L2 twice); nt where the task is not whole rows. */
static int64_t ts_window_block_{S}(const ts_conv_geom* g, int64_t cg, int64_t j0, int64_t nt) {
  const int64_t out2 = g->out[2], s2 = g->s[2];
  const int64_t e2 = (out2 - 1) * s2 + (g->k[2] - 1) * g->d[2] + 1;
  const int64_t line = s2 * ((e2 + s2 - 1) / s2);
  const int64_t fit =
      ((int64_t)(16384 / sizeof({T})) / (cg * line) - (g->k[1] - 1) * g->d[1] - 1) / g->s[1] + 1;
  return j0 % out2 || nt % out2 ? nt : (fit > 1 ? fit : 1) * out2;
}

/* The input a task of whole output rows r0 .. r0 + nr - 1 of one channel reads lies in one
   run of whole input rows; the run of the same length right after it is what the next task
   reads (the next rows, or the next plane where planes lie end to end), and with a static
   schedule a thread's next task is that one. Returns where that run starts and its bytes
   (*bytes 0: nothing to ask for). */
static const {T}* ts_window_next_{S}(const ts_conv_geom* g, const {T}* X, int64_t r0, int64_t nr,
                                     int64_t* bytes) {
  int64_t lo = r0 * g->s[1] - g->p[1];
  int64_t hi = (r0 + nr - 1) * g->s[1] + (g->k[1] - 1) * g->d[1] - g->p[1] + 1;
  lo = lo < 0 ? 0 : lo;
  hi = hi > g->in[1] ? g->in[1] : hi;
  *bytes = hi > lo ? (int64_t)sizeof({T}) * (hi - lo) * g->in[2] : 0;
  return X + hi * g->in[2];
}

/* Part r of nr of the `bytes` at p asked for into L2, a cache line at a time (a prefetch never
   faults: past the input's end it fetches a line nobody reads): memory streams the next
   task's input while the registers fold this one's laid-out rows, which read no memory. */
static inline void ts_window_ahead_{S}(const void* p, int64_t bytes, int64_t r, int64_t nr) {
  for (int64_t e = bytes * r / nr & ~(int64_t)63, end = bytes * (r + 1) / nr; e < end; e += 64)
    __builtin_prefetch((const char*)p + e, 0, 2);
}

/* nv vectors of a block's results stored at c, n of them (the row's last vector in part). */
static inline __attribute__((always_inline)) void ts_window_store_{S}(const ts_v_{S}* acc,
                                                                      {T}* c, int64_t n,
                                                                      const int nv) {
#pragma GCC unroll 4
  for (int v = 0; v < nv - 1; ++v) ts_vstore_{S}(c + v * TS_VL_{S}, acc[v]);
  if (n == nv * TS_VL_{S})
    ts_vstore_{S}(c + (nv - 1) * TS_VL_{S}, acc[nv - 1]);
  else
    ts_vstore_part_{S}(c + (nv - 1) * TS_VL_{S}, acc[nv - 1], n - (nv - 1) * TS_VL_{S});
}
