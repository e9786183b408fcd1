/* col2im: the windows' cotangent [K, *out] of a plane put back where each window read it
   (routines/c_pool.py): every input element the sum over the kernel offsets in order of the
   value its offset's slice puts there, +0 where that offset's slice does not reach it, from
   the first offset's (the chain of additions of placed slices the operator decomposes into,
   the same bits: a -0 survives only where every offset gives one). Geometry: ts_conv_geom's,
   `in` the image rebuilt, `out` the windows' grid. */

/* A line of n values from one offset: x takes src[x + base] where that is one of src's m
   values, +0 elsewhere; set (first) or added. */
static inline void ts_col2im_line_{S}({T}* restrict row, const {T}* restrict src, int64_t n,
                                      int64_t base, int64_t m, int first) {
  int64_t lo = base >= 0 ? 0 : -base, hi = m - base < n ? m - base : n;
  if (lo > n) lo = n;
  if (hi < lo) hi = lo;
  if (first) {
    for (int64_t x = 0; x < lo; ++x) row[x] = 0;
    for (int64_t x = lo; x < hi; ++x) row[x] = src[x + base];
    for (int64_t x = hi; x < n; ++x) row[x] = 0;
  } else {
    for (int64_t x = 0; x < lo; ++x) row[x] = row[x] + ({T})0;
    for (int64_t x = lo; x < hi; ++x) row[x] = row[x] + src[x + base];
    for (int64_t x = hi; x < n; ++x) row[x] = row[x] + ({T})0;
  }
}

/* One element the long way (no scratch memory): the same chain over the offsets. */
static {T} ts_col2im_at_{S}(const ts_conv_geom* g, const {T}* cp, int64_t z, int64_t y,
                            int64_t x) {
  const int64_t P = g->out[0] * g->out[1] * g->out[2], at[3] = {z, y, x};
  {T} acc = 0;
  int64_t j = 0;
  for (int64_t kz = 0; kz < g->k[0]; ++kz)
    for (int64_t ky = 0; ky < g->k[1]; ++ky)
      for (int64_t kx = 0; kx < g->k[2]; ++kx, ++j) {
        const int64_t q[3] = {kz, ky, kx};
        int64_t o = 0, reach = 1;
        for (int a = 0; a < 3; ++a) {
          int64_t t = at[a] + g->p[a] - q[a] * g->d[a];
          reach = reach && t >= 0 && t % g->s[a] == 0 && t / g->s[a] < g->out[a];
          o = o * g->out[a] + (reach ? t / g->s[a] : 0);
        }
        {T} v = reach ? cp[j * P + o] : ({T})0;
        acc = j == 0 ? v : acc + v;
      }
  return acc;
}

/* nimg planes: plane i's windows' cotangent at cols + i xs ([K, *out]), its image at out + i
   ys. Each 2-D slab is summed apart by the strides' phases (rows qy, qy + s1, ... by columns
   qx, qx + s2, ...: a contiguous block of the phase buffer each): an offset's values land in
   one phase, shifted, and add +0 to the others; the phases are interleaved into the slab at
   the end (stride 1: the slab is the one phase). */
static void ts_col2im_tile_{S}(const {T}* cols, {T}* out, int64_t in0, int64_t in1, int64_t in2,
                               int64_t k0, int64_t k1, int64_t k2, int64_t out0, int64_t out1,
                               int64_t out2, int64_t s0, int64_t s1, int64_t s2, int64_t d0,
                               int64_t d1, int64_t d2, int64_t p0, int64_t p1, int64_t p2,
                               int64_t nimg, int64_t xs, int64_t ys) {
  ts_conv_geom g = {0, {in0, in1, in2}, {k0, k1, k2}, {out0, out1, out2}, {s0, s1, s2},
                    {d0, d1, d2}, {p0, p1, p2}};
  const int64_t P = out0 * out1 * out2, H = (in1 + s1 - 1) / s1, W = (in2 + s2 - 1) / s2;
  const int strided = s1 > 1 || s2 > 1;
  {T}* ph = strided ? ts_scratch_{S}((size_t)(s1 * s2 * H * W)) : 0;
  for (int64_t i = 0; i < nimg; ++i)
    for (int64_t z = 0; z < in0; ++z) {
      const {T}* cp = cols + i * xs;
      {T}* slab = out + i * ys + z * in1 * in2;
      if (strided && !ph) {
        for (int64_t y = 0; y < in1; ++y)
          for (int64_t x = 0; x < in2; ++x) slab[y * in2 + x] = ts_col2im_at_{S}(&g, cp, z, y, x);
        continue;
      }
      {T}* buf = strided ? ph : slab;
      const int64_t ld = strided ? W : in2;
      int64_t j = 0;
      for (int64_t kz = 0; kz < k0; ++kz)
        for (int64_t ky = 0; ky < k1; ++ky)
          for (int64_t kx = 0; kx < k2; ++kx, ++j) {
            const int64_t tz = z + p0 - kz * d0;
            const int zreach = tz >= 0 && tz % s0 == 0 && tz / s0 < out0;
            const int64_t hy = ((ky * d1 - p1) % s1 + s1) % s1;   /* the phase its values */
            const int64_t hx = ((kx * d2 - p2) % s2 + s2) % s2;   /* reach */
            const {T}* src = cp + j * P + (zreach ? tz / s0 : 0) * out1 * out2;
            for (int64_t qy = 0; qy < s1; ++qy)
              for (int64_t qx = 0; qx < s2; ++qx) {
                {T}* b = buf + (qy * s2 + qx) * H * W;
                const int64_t nh = (in1 - qy + s1 - 1) / s1, nw = (in2 - qx + s2 - 1) / s2;
                if (!zreach || qy != hy || qx != hx) {    /* +0 (set 0): the block at once */
                  ts_col2im_line_{S}(b, src, nh * ld, 0, 0, j == 0);
                  continue;
                }
                const int64_t cy = (qy + p1 - ky * d1) / s1, cx = (qx + p2 - kx * d2) / s2;
                for (int64_t u = 0; u < nh; ++u) {
                  const int inside = cy + u >= 0 && cy + u < out1;
                  ts_col2im_line_{S}(b + u * ld, src + (inside ? (cy + u) * out2 : 0), nw, cx,
                                     inside ? out2 : 0, j == 0);
                }
              }
          }
      if (strided)
        for (int64_t qy = 0; qy < s1; ++qy)
          for (int64_t qx = 0; qx < s2; ++qx) {
            const {T}* b = buf + (qy * s2 + qx) * H * W;
            for (int64_t u = 0; qy + u * s1 < in1; ++u)
              for (int64_t w = 0; qx + w * s2 < in2; ++w)
                slab[(qy + u * s1) * in2 + qx + w * s2] = b[u * W + w];
          }
    }
}
