/* col2im: the windows' cotangent [K, *out] of a plane put back where each window read it
   (routines/c_pool.py): every input element the sum over the kernel offsets in order of the
   value its offset's slice puts there, +0 where that offset's slice does not reach it, from
   the first offset's (the chain of additions of placed slices the operator decomposes into,
   the same bits: a -0 survives only where every offset gives one). Geometry: ts_conv_geom's,
   `in` the image rebuilt, `out` the windows' grid. */

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

/* One axis of the geometry for kernel tap q: the phase h (the image positions h, h + s, ...
   its values land on), c (the window row, possibly negative, that lands on position h) and the
   range [lo, hi) of steps u whose position h + u s is in the image and whose row c + u is on
   the grid. */
static inline void ts_col2im_axis_{S}(int64_t q, int64_t in, int64_t out, int64_t s, int64_t d,
                                  int64_t p, int64_t* h, int64_t* c, int64_t* lo, int64_t* hi) {
  *h = ((q * d - p) % s + s) % s;
  *c = (*h + p - q * d) / s;                       /* (exact: h + p - q d = 0 mod s) */
  int64_t n = (in - *h + s - 1) / s;               /* positions of the phase in the image */
  *lo = *c < 0 ? -*c : 0;
  *hi = out - *c < n ? out - *c : n;
  if (*hi < *lo) *hi = *lo;
}

/* Whether every tap along one axis puts a value on image position x. */
static inline int ts_col2im_all_{S}(int64_t x, int64_t k, int64_t out, int64_t s, int64_t d,
                                int64_t p) {
  for (int64_t q = 0; q < k; ++q) {
    int64_t t = x + p - q * d;
    if (t < 0 || t % s || t / s >= out) return 0;
  }
  return 1;
}

/* nimg planes: plane i's windows' cotangent at cols + i xs ([K, *out]), its image at out + i
   ys. The chain of placed slices, each element's first offset's value then each later one's
   added (+0 where its slice puts nothing), is computed as: -0 (the sum's identity), plus every
   value that lands on the element in offset order, then + 0 where some offset puts nothing.
   The same bits: a +0 addend changes only a -0 sum (to +0), a sum is -0 only while every
   addend so far was -0, and x + -0 = x. So each offset adds one rectangle of its slice (the
   plan, made once per call: whole planes share the geometry) and no offset touches what it
   does not reach. Strided, each 2-D slab is summed apart by the strides' phases (rows qy,
   qy + s1, ... by columns qx, qx + s2, ...: a contiguous block of the phase buffer each, so
   every rectangle's rows are contiguous) and interleaved into the slab at the end, the + 0
   with it. */
static void ts_col2im_tile_{S}(const {T}* cols, {T}* out, int64_t in0, int64_t in1, int64_t in2,
                               int64_t k0, int64_t k1, int64_t k2, int64_t out0, int64_t out1,
                               int64_t out2, int64_t s0, int64_t s1, int64_t s2, int64_t d0,
                               int64_t d1, int64_t d2, int64_t p0, int64_t p1, int64_t p2,
                               int64_t nimg, int64_t xs, int64_t ys) {
  ts_conv_geom g = {0, {in0, in1, in2}, {k0, k1, k2}, {out0, out1, out2}, {s0, s1, s2},
                    {d0, d1, d2}, {p0, p1, p2}};
  const int64_t P = out0 * out1 * out2, H = (in1 + s1 - 1) / s1, W = (in2 + s2 - 1) / s2;
  const int64_t K = k0 * k1 * k2, I2 = in1 * in2;
  const int strided = s1 > 1 || s2 > 1;
  const size_t ints = sizeof(int64_t) / sizeof({T});   /* ({T}s an int64 takes) */
  /* scratch: the phase buffer, the last axis' + 0 row, then (int64) the plan's rectangles
     (dst, src, rows, columns) per slab and offset, their count per slab, whether every offset
     reaches each slab and each row, and each column's place in its phase block */
  size_t nbuf = strided ? (size_t)(s1 * s2 * H * W) : 0;
  size_t need = nbuf + (size_t)in2 +              /* (8 more ints: room to align them) */
                ints * (size_t)(4 * in0 * K + 2 * in0 + in1 + in2 + 8);
  {T}* buf0 = K > 0 && I2 > 0 ? ts_scratch_{S}(need) : 0;
  if (!buf0) {                   /* no memory (or nothing to sum): element by element */
    for (int64_t i = 0; i < nimg; ++i)
      for (int64_t z = 0; z < in0; ++z)
        for (int64_t y = 0; y < in1; ++y)
          for (int64_t x = 0; x < in2; ++x)
            out[i * ys + z * I2 + y * in2 + x] = ts_col2im_at_{S}(&g, cols + i * xs, z, y, x);
    return;
  }
  {T}* zrow = buf0 + nbuf;                 /* + 0 or + -0 by column (every offset reaches) */
  int64_t* rect = (int64_t*)(((uintptr_t)(zrow + in2) + 63) & ~(uintptr_t)63);
  int64_t* nrect = rect + 4 * in0 * K;
  int64_t* zall = nrect + in0;
  int64_t* yall = zall + in0;
  int64_t* xat = yall + in1;
  for (int64_t x = 0; x < in2; ++x) xat[x] = (x % s2) * H * W + x / s2;
  for (int64_t x = 0; x < in2; ++x)
    zrow[x] = ts_col2im_all_{S}(x, k2, out2, s2, d2, p2) ? -({T})0 : ({T})0;
  for (int64_t y = 0; y < in1; ++y) yall[y] = ts_col2im_all_{S}(y, k1, out1, s1, d1, p1);
  const int64_t ld = strided ? W : in2;    /* rows of the phase blocks (strided) or the slab */
  for (int64_t z = 0; z < in0; ++z) {
    zall[z] = ts_col2im_all_{S}(z, k0, out0, s0, d0, p0);
    int64_t* r = rect + 4 * z * K, n = 0, j = 0;
    for (int64_t kz = 0; kz < k0; ++kz) {
      const int64_t tz = z + p0 - kz * d0;
      const int zreach = tz >= 0 && tz % s0 == 0 && tz / s0 < out0;
      for (int64_t ky = 0; ky < k1; ++ky) {
        int64_t hy, cy, ulo, uhi;
        ts_col2im_axis_{S}(ky, in1, out1, s1, d1, p1, &hy, &cy, &ulo, &uhi);
        for (int64_t kx = 0; kx < k2; ++kx, ++j) {
          int64_t hx, cx, wlo, whi;
          ts_col2im_axis_{S}(kx, in2, out2, s2, d2, p2, &hx, &cx, &wlo, &whi);
          if (!zreach || ulo == uhi || wlo == whi) continue;
          const int64_t base = strided ? (hy * s2 + hx) * H * W : 0;   /* its phase block */
          r[4 * n] = base + ulo * ld + wlo;
          r[4 * n + 1] = j * P + tz / s0 * out1 * out2 + (cy + ulo) * out2 + cx + wlo;
          r[4 * n + 2] = uhi - ulo;
          r[4 * n + 3] = whi - wlo;
          ++n;
        }
      }
    }
    nrect[z] = n;
  }
  for (int64_t i = 0; i < nimg; ++i)
    for (int64_t z = 0; z < in0; ++z) {
      const {T}* cp = cols + i * xs;
      {T}* slab = out + i * ys + z * I2;
      {T}* buf = strided ? buf0 : slab;
      const int64_t nb = strided ? (int64_t)nbuf : I2;
      for (int64_t e = 0; e < nb; ++e) buf[e] = -({T})0;
      const int64_t* r = rect + 4 * z * K;
      for (int64_t q = 0; q < nrect[z]; ++q, r += 4) {
        {T}* b = buf + r[0];
        const {T}* src = cp + r[1];
        for (int64_t u = 0; u < r[2]; ++u)
#pragma omp simd
          for (int64_t w = 0; w < r[3]; ++w) b[u * ld + w] = b[u * ld + w] + src[u * out2 + w];
      }
      for (int64_t y = 0; y < in1; ++y) {   /* + 0 where some offset put nothing */
        {T}* row = slab + y * in2;
        const int all = zall[z] && yall[y];
        if (strided) {
          const {T}* b = buf + (y % s1) * s2 * H * W + y / s1 * W;
          for (int64_t x = 0; x < in2; ++x) row[x] = b[xat[x]] + (all ? zrow[x] : ({T})0);
        } else {
#pragma omp simd
          for (int64_t x = 0; x < in2; ++x) row[x] = row[x] + (all ? zrow[x] : ({T})0);
        }
      }
    }
}
