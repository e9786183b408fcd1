/* Each window folded over its taps in order from the first (fold_windows: the pools;
   routines/c_pool.py): combine 0 the largest (ts_max: the later unless the earlier is larger or
   NaN), 1 the sum; the padding reads the combination's identity (-inf, 0). */

/* A block of nv vectors of outputs from c, each folded over the k taps. */
static inline __attribute__((always_inline)) void ts_pool_block_{S}(
    int64_t K, const int64_t* off, const {T}* src, {T}* c, int64_t n, const int nv,
    const int add) {
  ts_v_{S} acc[TS_WINDOW_SV];
#pragma GCC unroll 4
  for (int v = 0; v < nv; ++v) acc[v] = ts_vload_{S}(src + off[0] + v * TS_VL_{S});
  for (int64_t k = 1; k < K; ++k) {
    const {T}* b = src + off[k];
#pragma GCC unroll 4
    for (int v = 0; v < nv; ++v) {
      ts_v_{S} x = ts_vload_{S}(b + v * TS_VL_{S});
      acc[v] = add ? ts_vadd_{S}(acc[v], x) : ts_vmax_{S}(acc[v], x);
    }
  }
  ts_window_store_{S}(acc, c, n, nv);
}

static void ts_pool_rows_{S}(const {T}* pad, int64_t line, const int64_t* off, int64_t K,
                             int64_t out2, int64_t s1, int64_t nr, {T}* C, const int add,
                             const {T}* ahead, int64_t ahead_bytes) {
  const int64_t step = TS_WINDOW_SV * TS_VL_{S};
  for (int64_t r = 0; r < nr; ++r) {
    ts_window_ahead_{S}(ahead, ahead_bytes, r, nr);
    const {T}* src = pad + r * s1 * line;
    {T}* c = C + r * out2;
    for (int64_t t0 = 0; t0 < out2; t0 += step) {
      int64_t n = out2 - t0 < step ? out2 - t0 : step, nv = (n + TS_VL_{S} - 1) / TS_VL_{S};
      if (nv == 4) ts_pool_block_{S}(K, off, src + t0, c + t0, n, 4, add);
      else if (nv == 3) ts_pool_block_{S}(K, off, src + t0, c + t0, n, 3, add);
      else if (nv == 2) ts_pool_block_{S}(K, off, src + t0, c + t0, n, 2, add);
      else ts_pool_block_{S}(K, off, src + t0, c + t0, n, 1, add);
    }
  }
}

/* One output element the long way (3-D windows, or no scratch): the same fold. */
static {T} ts_pool_at_{S}(const ts_conv_geom* g, const {T}* X, int64_t p, int add) {
  int64_t o[3] = {p / (g->out[1] * g->out[2]), (p / g->out[2]) % g->out[1], p % g->out[2]};
  {T} acc = 0;
  int first = 1;
  for (int64_t kz = 0; kz < g->k[0]; ++kz)
    for (int64_t ky = 0; ky < g->k[1]; ++ky)
      for (int64_t kx = 0; kx < g->k[2]; ++kx) {
        int64_t q[3] = {kz, ky, kx}, at = 0, inside = 1;
        for (int a = 0; a < 3; ++a) {
          int64_t i = o[a] * g->s[a] + q[a] * g->d[a] - g->p[a];
          inside = inside && i >= 0 && i < g->in[a];
          at = at * g->in[a] + i;
        }
        {T} x = inside ? X[at] : add ? ({T})0 : ({T})(-INFINITY);
        acc = first ? x : add ? acc + x : (acc > x || acc != acc) ? acc : x;
        first = 0;
      }
  return acc;
}

/* fold_windows' argmax: each window's offset of its first largest tap (a NaN the largest),
   as argmax over the stacked windows finds it (the padding reads -inf: a window of padding and
   -inf alone gives 0). A vector of a row's outputs at a time, over the taps in order, the
   offsets kept as {T} (exact) beside the largest. */
static void ts_pool_first_rows_{S}(const {T}* pad, int64_t line, const int64_t* off, int64_t K,
                                   int64_t out2, int64_t s1, int64_t nr, int64_t* C,
                                   const {T}* ahead, int64_t ahead_bytes) {
  {T} lanes[TS_VL_{S}];
  for (int64_t r = 0; r < nr; ++r) {
    ts_window_ahead_{S}(ahead, ahead_bytes, r, nr);
    const {T}* src = pad + r * s1 * line;
    for (int64_t t0 = 0; t0 < out2; t0 += TS_VL_{S}) {   /* (a row's last vector reads on) */
      const int64_t n = out2 - t0 < TS_VL_{S} ? out2 - t0 : TS_VL_{S};
      ts_v_{S} best = ts_vload_{S}(src + off[0] + t0), at = ts_vzero_{S}();
      for (int64_t k = 1; k < K; ++k)
        ts_vfirst_{S}(best, at, ts_vload_{S}(src + off[k] + t0), ts_vset1_{S}(({T})k));
      ts_vstore_{S}(lanes, at);
      for (int64_t j = 0; j < n; ++j) C[r * out2 + t0 + j] = (int64_t)lanes[j];
    }
  }
}

/* One output element's offset the long way (3-D windows, or no scratch): the same chain. */
static int64_t ts_pool_first_at_{S}(const ts_conv_geom* g, const {T}* X, int64_t p) {
  int64_t o[3] = {p / (g->out[1] * g->out[2]), (p / g->out[2]) % g->out[1], p % g->out[2]};
  {T} best = ({T})(-INFINITY);
  int64_t at = 0, k = 0;
  for (int64_t kz = 0; kz < g->k[0]; ++kz)
    for (int64_t ky = 0; ky < g->k[1]; ++ky)
      for (int64_t kx = 0; kx < g->k[2]; ++kx, ++k) {
        int64_t q[3] = {kz, ky, kx}, i = 0, inside = 1;
        for (int a = 0; a < 3; ++a) {
          int64_t c = o[a] * g->s[a] + q[a] * g->d[a] - g->p[a];
          inside = inside && c >= 0 && c < g->in[a];
          i = i * g->in[a] + c;
        }
        const {T} v = inside ? X[i] : ({T})(-INFINITY);
        if (v > best || (v != v && best == best)) {
          best = v;
          at = k;
        }
      }
  return at;
}

/* Output positions [j0, j0 + nt) of nimg planes (one channel of one image each): plane i's
   input at X + i xs, its output at C + i ys (C: {T}, or int64_t for combine 2); combine 0 the
   largest, 1 the sum, 2 the first largest's offset. Whole rows go a block at a time
   (ts_window_block), the next task's input prefetched while the registers fold. */
static void ts_pool_planes_{S}(const ts_conv_geom* g, const {T}* X, void* C, int64_t nt,
                               int64_t j0, int64_t combine, int64_t nimg, int64_t xs,
                               int64_t ys) {
  const int add = combine == 1, first = combine == 2;
  const int64_t out2 = g->out[2], s1 = g->s[1], K = g->k[1] * g->k[2];
  const int64_t block = ts_window_block_{S}(g, 1, j0, nt);
  {T}* Cv = ({T}*)C;
  int64_t* Ci = (int64_t*)C;
  for (int64_t i = 0; i < nimg; ++i)
    for (int64_t q = 0; q < nt; q += block) {
      const int64_t n = nt - q < block ? nt - q : block, at = i * ys + q;
      int64_t line, *off, ahead_bytes;
      const {T}* pad = ts_window_rows_{S}(g, X + i * xs, 1, j0 + q, n,
                                          add ? ({T})0 : ({T})(-INFINITY), &line, &off);
      if (!pad) {
        for (int64_t j = 0; j < n; ++j) {
          if (first) Ci[at + j] = ts_pool_first_at_{S}(g, X + i * xs, j0 + q + j);
          else Cv[at + j] = ts_pool_at_{S}(g, X + i * xs, j0 + q + j, add);
        }
        continue;
      }
      const {T}* ahead = ts_window_next_{S}(g, X + i * xs, (j0 + q) / out2, n / out2,
                                          &ahead_bytes);
      if (first)
        ts_pool_first_rows_{S}(pad, line, off, K, out2, s1, n / out2, Ci + at, ahead,
                               ahead_bytes);
      else if (add)
        ts_pool_rows_{S}(pad, line, off, K, out2, s1, n / out2, Cv + at, 1, ahead, ahead_bytes);
      else
        ts_pool_rows_{S}(pad, line, off, K, out2, s1, n / out2, Cv + at, 0, ahead, ahead_bytes);
    }
}

/* The routine's entry: C is {T}* for combine 0 and 1, int64_t* for 2 (ts_pool_planes) */
static void ts_pool_tile_{S}(const {T}* X, void* C, int64_t nt, int64_t j0, int64_t combine,
                             int64_t in0, int64_t in1, int64_t in2, int64_t k0, int64_t k1,
                             int64_t k2, int64_t out0, int64_t out1, int64_t out2, int64_t s0,
                             int64_t s1, int64_t s2, int64_t d0, int64_t d1, int64_t d2,
                             int64_t p0, int64_t p1, int64_t p2, int64_t nimg, int64_t xs,
                             int64_t ys) {
  ts_conv_geom g = {in0 * in1 * in2, {in0, in1, in2}, {k0, k1, k2}, {out0, out1, out2},
                    {s0, s1, s2}, {d0, d1, d2}, {p0, p1, p2}};
  ts_pool_planes_{S}(&g, X, C, nt, j0, combine, nimg, xs, ys);
}
