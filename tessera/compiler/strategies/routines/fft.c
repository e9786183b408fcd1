/* Fast Fourier transforms of one line, in place on interleaved complex {T} (re, im, re, ...).

   ts_fft_{S}(buf, n, kind), kind: 0 forward complex, 1 inverse complex (unnormalised: n x),
   2 real to complex (n reals in, n/2 + 1 complex out), 3 complex to real (n/2 + 1 complex in,
   the imaginary parts of the zero and Nyquist frequencies ignored; n reals out, unnormalised).
   buf holds 2n + 2 elements. Returns nonzero when its memory cannot be had.

   Complex transforms: a Stockham autosort (decimation in frequency) over the factors of n,
   4s first, then 2, 3, 5, 7 and any odd prime up to TS_FFT_MAX_RADIX (a butterfly over the
   radix's symmetric pairs); a larger prime factor makes the whole line a Bluestein transform
   (a chirp convolution by FFTs of a 5-smooth length m >= 2n - 1). Real transforms of even n
   pack the line as n/2 complex values and untangle the halves; odd n go through the complex
   transform. The inverse is the conjugate of the forward transform of the conjugate.

   Twiddles are computed once per (n, kind) in double precision, from an octant reduction done
   in integers (so e^{-2 pi i j/N} is exact where it is 1, -1, i or -i), and rounded once to {T}.
   Plans are cached for the process (a lock only to add one). Every output is one fixed chain
   of operations whatever the thread count: a stage's butterflies are independent. */
#define TS_FFT_MAX_RADIX 31
#define TS_FFT_MAX_STAGES 64
#define TS_FFT_PLANS 512
#define TS_FFT_PARALLEL 65536     /* complex elements of a stage worth threads of their own */

typedef struct ts_fft_plan_{S} {
  int64_t n, real;                  /* real: a plan for kind 2/3 of even n */
  int nf;
  int radix[TS_FFT_MAX_STAGES];
  int64_t twoff[TS_FFT_MAX_STAGES]; /* each stage's twiddles in tw (complex elements) */
  {T}* tw;
  {T}* odd;                          /* per stage of an odd radix p: cos, sin(2 pi t/p), t < p */
  int64_t oddoff[TS_FFT_MAX_STAGES];
  int64_t m;                         /* Bluestein: the convolution's length (0: none) */
  struct ts_fft_plan_{S}* sub;       /* Bluestein: the m-point plan; real: the n/2-point plan */
  {T}* chirp;                        /* Bluestein: e^{-pi i k^2 / n}, k < n */
  {T}* kernel;                       /* Bluestein: FFT_m of the conjugate chirp, / m */
  {T}* rtw;                          /* real: e^{-2 pi i k / n}, k < n/2 */
  int64_t work;                      /* scratch a call needs ({T} elements) */
} ts_fft_plan_{S};

static ts_fft_plan_{S}* ts_fft_cache_{S}[TS_FFT_PLANS];
static int ts_fft_count_{S} = 0;

/* e^{-2 pi i j / N} in double: the quadrant and the octant from integers, then cos and sin of
   an angle in [0, pi/4]. */
static void ts_fft_unit_{S}(int64_t j, int64_t N, double* c, double* s) {
  int64_t r = ((j % N) + N) % N;
  int64_t q = (4 * r) / N, rem = 4 * r - q * N;   /* angle = (q + rem/N) pi/2 */
  double cs, sn;
  if (rem == 0) { cs = 1.0; sn = 0.0; }
  else if (2 * rem <= N) {
    double a = 1.5707963267948966 * (double)rem / (double)N;
    cs = cos(a); sn = sin(a);
  } else {
    double a = 1.5707963267948966 * (double)(N - rem) / (double)N;
    cs = sin(a); sn = cos(a);
  }
  /* rotate (cs, sn) by q quarter turns: angle theta = q pi/2 + phi */
  double C, S;
  switch (q) {
    case 0: C = cs; S = sn; break;
    case 1: C = -sn; S = cs; break;
    case 2: C = -cs; S = -sn; break;
    default: C = sn; S = -cs; break;
  }
  *c = C; *s = -S;                                /* e^{-i theta} */
}

static void ts_fft_free_{S}(ts_fft_plan_{S}* p) {
  if (!p) return;
  free(p->tw); free(p->odd); free(p->chirp); free(p->kernel); free(p->rtw);
  ts_fft_free_{S}(p->sub);
  free(p);
}

static int ts_fft_run_{S}(const ts_fft_plan_{S}* p, {T}* x, {T}* work);

static int64_t ts_fft_smooth_{S}(int64_t n) {   /* the least 2^a 3^b 5^c >= n */
  int64_t best = 1;
  while (best < n) best *= 2;
  for (int64_t f5 = 1; f5 < 2 * n; f5 *= 5)
    for (int64_t f35 = f5; f35 < 2 * n; f35 *= 3) {
      int64_t v = f35;
      while (v < n) v *= 2;
      if (v < best) best = v;
    }
  return best;
}

static ts_fft_plan_{S}* ts_fft_complex_plan_{S}(int64_t n) {
  ts_fft_plan_{S}* p = (ts_fft_plan_{S}*)calloc(1, sizeof(*p));
  if (!p) return 0;
  p->n = n;
  int64_t rest = n;
  while (rest % 4 == 0) { p->radix[p->nf++] = 4; rest /= 4; }
  while (rest % 2 == 0) { p->radix[p->nf++] = 2; rest /= 2; }
  for (int64_t f = 3; rest > 1 && f <= TS_FFT_MAX_RADIX; f += 2)
    while (rest % f == 0) { p->radix[p->nf++] = (int)f; rest /= f; }
  if (rest > 1) {                                  /* a large prime factor: Bluestein */
    p->nf = 0;
    p->m = ts_fft_smooth_{S}(2 * n - 1);
    p->sub = ts_fft_complex_plan_{S}(p->m);
    p->chirp = ({T}*)malloc(sizeof({T}) * 2 * n);
    p->kernel = ({T}*)calloc(2 * p->m, sizeof({T}));
    {T}* w = ({T}*)malloc(sizeof({T}) * ((p->sub ? p->sub->work : 0) + 1));
    if (!p->sub || !p->chirp || !p->kernel || !w) { free(w); ts_fft_free_{S}(p); return 0; }
    for (int64_t k = 0; k < n; ++k) {
      double c, s;                                 /* k^2 mod 2n, exactly */
      int64_t k2 = (int64_t)(((unsigned __int128)k * (unsigned __int128)k) % (unsigned __int128)(2 * n));
      ts_fft_unit_{S}(k2, 2 * n, &c, &s);
      p->chirp[2 * k] = ({T})c; p->chirp[2 * k + 1] = ({T})s;
    }
    for (int64_t k = 0; k < n; ++k) {              /* the conjugate chirp, wrapped around */
      p->kernel[2 * k] = p->chirp[2 * k]; p->kernel[2 * k + 1] = -p->chirp[2 * k + 1];
      if (k) {
        p->kernel[2 * (p->m - k)] = p->chirp[2 * k];
        p->kernel[2 * (p->m - k) + 1] = -p->chirp[2 * k + 1];
      }
    }
    int bad = ts_fft_run_{S}(p->sub, p->kernel, w);
    free(w);
    if (bad) { ts_fft_free_{S}(p); return 0; }
    {T} inv = ({T})(1.0 / (double)p->m);
    for (int64_t k = 0; k < 2 * p->m; ++k) p->kernel[k] *= inv;
    p->work = 2 * p->m + p->sub->work;    /* the padded line, then the m-point work */
    return p;
  }
  int64_t tw = 0, odd = 0, L = n;
  for (int i = 0; i < p->nf; ++i) {
    int64_t m = L / p->radix[i];
    p->twoff[i] = tw; tw += m * (p->radix[i] - 1);
    p->oddoff[i] = odd; if (p->radix[i] % 2) odd += 2 * p->radix[i];
    L = m;
  }
  p->tw = ({T}*)malloc(sizeof({T}) * (2 * tw + 1));
  p->odd = ({T}*)malloc(sizeof({T}) * (odd + 1));
  if (!p->tw || !p->odd) { ts_fft_free_{S}(p); return 0; }
  L = n;
  for (int i = 0; i < p->nf; ++i) {
    int r = p->radix[i];
    int64_t m = L / r;
    {T}* t = p->tw + 2 * p->twoff[i];
    for (int64_t j = 0; j < m; ++j)
      for (int u = 1; u < r; ++u) {
        double c, s;
        ts_fft_unit_{S}(j * u, L, &c, &s);
        t[2 * (j * (r - 1) + u - 1)] = ({T})c; t[2 * (j * (r - 1) + u - 1) + 1] = ({T})s;
      }
    if (r % 2)
      for (int u = 0; u < r; ++u) {                /* cos and sin of 2 pi u / r */
        double c, s;
        ts_fft_unit_{S}(u, r, &c, &s);
        p->odd[p->oddoff[i] + 2 * u] = ({T})c; p->odd[p->oddoff[i] + 2 * u + 1] = ({T})(-s);
      }
    L = m;
  }
  p->work = 2 * n;
  return p;
}

static ts_fft_plan_{S}* ts_fft_real_plan_{S}(int64_t n) {    /* even n */
  ts_fft_plan_{S}* p = (ts_fft_plan_{S}*)calloc(1, sizeof(*p));
  if (!p) return 0;
  p->n = n; p->real = 1;
  p->sub = ts_fft_complex_plan_{S}(n / 2);
  p->rtw = ({T}*)malloc(sizeof({T}) * (n + 1));
  if (!p->sub || !p->rtw) { ts_fft_free_{S}(p); return 0; }
  for (int64_t k = 0; k < n / 2; ++k) {
    double c, s;
    ts_fft_unit_{S}(k, n, &c, &s);
    p->rtw[2 * k] = ({T})c; p->rtw[2 * k + 1] = ({T})s;
  }
  p->work = p->sub->work;
  return p;
}

/* The cached plan for (n, real); 0 without memory. Lookups take no lock: a slot is published
   once, with release order, after its plan is complete. */
static const ts_fft_plan_{S}* ts_fft_lookup_{S}(int64_t n, int real, ts_fft_plan_{S}** own) {
  int count = __atomic_load_n(&ts_fft_count_{S}, __ATOMIC_ACQUIRE);
  for (int i = 0; i < count; ++i) {
    ts_fft_plan_{S}* p = ts_fft_cache_{S}[i];
    if (p->n == n && p->real == real) return p;
  }
  ts_fft_plan_{S}* made = 0;
  const ts_fft_plan_{S}* found = 0;
  #pragma omp critical(ts_fft_plans_{S})
  {
    int c = __atomic_load_n(&ts_fft_count_{S}, __ATOMIC_ACQUIRE);
    for (int i = 0; i < c && !found; ++i)
      if (ts_fft_cache_{S}[i]->n == n && ts_fft_cache_{S}[i]->real == real)
        found = ts_fft_cache_{S}[i];
    if (!found) {
      made = real ? ts_fft_real_plan_{S}(n) : ts_fft_complex_plan_{S}(n);
      if (made && c < TS_FFT_PLANS) {
        ts_fft_cache_{S}[c] = made;
        __atomic_store_n(&ts_fft_count_{S}, c + 1, __ATOMIC_RELEASE);
        found = made; made = 0;
      }
    }
  }
  if (found) return found;
  *own = made;                                     /* the cache is full: the caller frees it */
  return made;
}

/* One stage: L = p m points per transform, stride s (n = L s). */
static void ts_fft_stage_{S}(int r, int64_t m, int64_t s, const {T}* restrict x,
                             {T}* restrict y, const {T}* restrict tw, const {T}* restrict oc) {
  int64_t total = m * s;
  if (r == 4) {
    #pragma omp parallel for schedule(static) if (total >= TS_FFT_PARALLEL)
    for (int64_t j = 0; j < m; ++j) {
      const {T} w1r = tw[6 * j], w1i = tw[6 * j + 1], w2r = tw[6 * j + 2], w2i = tw[6 * j + 3],
                w3r = tw[6 * j + 4], w3i = tw[6 * j + 5];
      for (int64_t q = 0; q < s; ++q) {
        const {T}* a = x + 2 * (q + s * j);
        {T} a0r = a[0], a0i = a[1], a1r = a[2 * s * m], a1i = a[2 * s * m + 1];
        {T} a2r = a[4 * s * m], a2i = a[4 * s * m + 1], a3r = a[6 * s * m], a3i = a[6 * s * m + 1];
        {T} t0r = a0r + a2r, t0i = a0i + a2i, t1r = a0r - a2r, t1i = a0i - a2i;
        {T} t2r = a1r + a3r, t2i = a1i + a3i, t3r = a1r - a3r, t3i = a1i - a3i;
        /* b0 = t0 + t2, b2 = t0 - t2, b1 = t1 - i t3, b3 = t1 + i t3 */
        {T} b1r = t1r + t3i, b1i = t1i - t3r, b2r = t0r - t2r, b2i = t0i - t2i;
        {T} b3r = t1r - t3i, b3i = t1i + t3r;
        {T}* o = y + 2 * (q + s * 4 * j);
        o[0] = t0r + t2r; o[1] = t0i + t2i;
        o[2 * s] = b1r * w1r - b1i * w1i; o[2 * s + 1] = b1r * w1i + b1i * w1r;
        o[4 * s] = b2r * w2r - b2i * w2i; o[4 * s + 1] = b2r * w2i + b2i * w2r;
        o[6 * s] = b3r * w3r - b3i * w3i; o[6 * s + 1] = b3r * w3i + b3i * w3r;
      }
    }
  } else if (r == 2) {
    #pragma omp parallel for schedule(static) if (total >= TS_FFT_PARALLEL)
    for (int64_t j = 0; j < m; ++j) {
      const {T} wr = tw[2 * j], wi = tw[2 * j + 1];
      for (int64_t q = 0; q < s; ++q) {
        const {T}* a = x + 2 * (q + s * j);
        {T} a0r = a[0], a0i = a[1], a1r = a[2 * s * m], a1i = a[2 * s * m + 1];
        {T} dr = a0r - a1r, di = a0i - a1i;
        {T}* o = y + 2 * (q + s * 2 * j);
        o[0] = a0r + a1r; o[1] = a0i + a1i;
        o[2 * s] = dr * wr - di * wi; o[2 * s + 1] = dr * wi + di * wr;
      }
    }
  } else {
    #pragma omp parallel for schedule(static) if (total >= TS_FFT_PARALLEL)
    for (int64_t j = 0; j < m; ++j) {
      {T} ar[TS_FFT_MAX_RADIX] = {0}, ai[TS_FFT_MAX_RADIX] = {0};
      for (int64_t q = 0; q < s; ++q) {
        const {T}* a = x + 2 * (q + s * j);
        for (int u = 0; u < r; ++u) { ar[u] = a[2 * s * m * u]; ai[u] = a[2 * s * m * u + 1]; }
        {T}* o = y + 2 * (q + s * r * j);
        /* b_0 = sum a_u; for t = 1 .. (r-1)/2, over the pairs u, r - u:
           b_t, b_{r-t} = a_0 + sum cos(2 pi u t/r) (a_u + a_{r-u}) -/+ i sin(..) (a_u - a_{r-u}) */
        {T} s0r = ar[0], s0i = ai[0];
        for (int u = 1; u <= r / 2; ++u) { s0r += ar[u] + ar[r - u]; s0i += ai[u] + ai[r - u]; }
        o[0] = s0r; o[1] = s0i;
        for (int t = 1; t <= r / 2; ++t) {
          {T} er = ar[0], ei = ai[0], fr = 0, fi = 0;
          for (int u = 1; u <= r / 2; ++u) {
            int k = (int)(((int64_t)u * t) % r);
            {T} c = oc[2 * k], sn = oc[2 * k + 1];
            er += c * (ar[u] + ar[r - u]); ei += c * (ai[u] + ai[r - u]);
            fr += sn * (ar[u] - ar[r - u]); fi += sn * (ai[u] - ai[r - u]);
          }
          /* b_t = e - i f, b_{r-t} = e + i f; then the twiddles */
          {T} btr = er + fi, bti = ei - fr, bur = er - fi, bui = ei + fr;
          const {T}* w1 = tw + 2 * (j * (r - 1) + t - 1);
          const {T}* w2 = tw + 2 * (j * (r - 1) + r - t - 1);
          o[2 * s * t] = btr * w1[0] - bti * w1[1]; o[2 * s * t + 1] = btr * w1[1] + bti * w1[0];
          o[2 * s * (r - t)] = bur * w2[0] - bui * w2[1];
          o[2 * s * (r - t) + 1] = bur * w2[1] + bui * w2[0];
        }
      }
    }
  }
}

/* The forward complex transform of x (p->n points) in place; work: p->work elements. */
static int ts_fft_run_{S}(const ts_fft_plan_{S}* p, {T}* x, {T}* work) {
  int64_t n = p->n;
  if (p->m) {                                      /* Bluestein */
    int64_t m = p->m;
    {T}* a = work;
    for (int64_t k = 0; k < n; ++k) {
      {T} xr = x[2 * k], xi = x[2 * k + 1], cr = p->chirp[2 * k], ci = p->chirp[2 * k + 1];
      a[2 * k] = xr * cr - xi * ci; a[2 * k + 1] = xr * ci + xi * cr;
    }
    for (int64_t k = 2 * n; k < 2 * m; ++k) a[k] = 0;
    ts_fft_run_{S}(p->sub, a, work + 2 * m);
    for (int64_t k = 0; k < m; ++k) {              /* times the kernel, conjugated */
      {T} ar = a[2 * k], ai = a[2 * k + 1], br = p->kernel[2 * k], bi = p->kernel[2 * k + 1];
      a[2 * k] = ar * br - ai * bi; a[2 * k + 1] = -(ar * bi + ai * br);
    }
    ts_fft_run_{S}(p->sub, a, work + 2 * m);        /* the inverse, as conj(F conj(.)) */
    for (int64_t k = 0; k < n; ++k) {
      {T} ar = a[2 * k], ai = -a[2 * k + 1], cr = p->chirp[2 * k], ci = p->chirp[2 * k + 1];
      x[2 * k] = ar * cr - ai * ci; x[2 * k + 1] = ar * ci + ai * cr;
    }
    return 0;
  }
  {T}* src = x;
  {T}* dst = work;
  int64_t L = n, s = 1;
  for (int i = 0; i < p->nf; ++i) {
    int r = p->radix[i];
    int64_t m = L / r;
    ts_fft_stage_{S}(r, m, s, src, dst, p->tw + 2 * p->twoff[i], p->odd + p->oddoff[i]);
    {T}* t = src; src = dst; dst = t;
    L = m; s *= r;
  }
  if (src != x) memcpy(x, src, sizeof({T}) * 2 * n);
  return 0;
}

static void ts_fft_conj_{S}({T}* x, int64_t n) {
  for (int64_t k = 0; k < n; ++k) x[2 * k + 1] = -x[2 * k + 1];
}

static int ts_fft_{S}({T}* buf, int64_t n, int kind) {
  if (n <= 1) {                                    /* a one-point transform is the identity */
    if (n == 1 && kind >= 2) buf[1] = 0;
    return 0;
  }
  int even_real = kind >= 2 && n % 2 == 0;
  ts_fft_plan_{S}* own = 0;
  const ts_fft_plan_{S}* p = ts_fft_lookup_{S}(n, even_real, &own);
  if (!p) return 1;
  {T}* work = ts_scratch_{S}((size_t)p->work);
  if (!work) { ts_fft_free_{S}(own); return 1; }
  if (kind == 0) {
    ts_fft_run_{S}(p, buf, work);
  } else if (kind == 1) {
    ts_fft_conj_{S}(buf, n); ts_fft_run_{S}(p, buf, work); ts_fft_conj_{S}(buf, n);
  } else if (kind == 2 && !even_real) {            /* odd n: the reals as complex values */
    for (int64_t k = n - 1; k >= 0; --k) { buf[2 * k] = buf[k]; buf[2 * k + 1] = 0; }
    ts_fft_run_{S}(p, buf, work);
    buf[1] = 0;
  } else if (kind == 3 && !even_real) {            /* odd n: the Hermitian line, inverted */
    int64_t h = n / 2;
    buf[1] = 0;
    for (int64_t k = 1; k <= h; ++k) { buf[2 * (n - k)] = buf[2 * k]; buf[2 * (n - k) + 1] = -buf[2 * k + 1]; }
    ts_fft_conj_{S}(buf, n); ts_fft_run_{S}(p, buf, work);
    for (int64_t k = 0; k < n; ++k) buf[k] = buf[2 * k];
  } else if (kind == 2) {
    /* z_j = x_2j + i x_2j+1, Z = FFT_h(z); X_k = (Z_k + conj Z_{h-k})/2 - i W^k (Z_k - conj Z_{h-k})/2 */
    int64_t h = n / 2;
    ts_fft_run_{S}(p->sub, buf, work);
    {T} z0r = buf[0], z0i = buf[1];
    buf[0] = z0r + z0i; buf[1] = 0; buf[2 * h] = z0r - z0i; buf[2 * h + 1] = 0;
    for (int64_t k = 1; 2 * k <= h; ++k) {
      int64_t l = h - k;
      {T} ar = buf[2 * k], ai = buf[2 * k + 1], br = buf[2 * l], bi = buf[2 * l + 1];
      /* for k: Z = a, Z' = b;  for l: Z = b, Z' = a */
      {T} er = ({T})0.5 * (ar + br), ei = ({T})0.5 * (ai - bi);     /* (Z_k + conj Z_l)/2 */
      {T} dr = ({T})0.5 * (ar - br), di = ({T})0.5 * (ai + bi);     /* (Z_k - conj Z_l)/2 */
      {T} wr = p->rtw[2 * k], wi = p->rtw[2 * k + 1];
      {T} pr = wr * dr - wi * di, pi = wr * di + wi * dr;            /* W^k d */
      buf[2 * k] = er + pi; buf[2 * k + 1] = ei - pr;                /* e - i W^k d */
      if (l != k) {
        /* for l: e' = conj(e), d' = -conj(d), W^l = -conj(W^k) */
        {T} vr = -wr, vi = wi;
        {T} d2r = -dr, d2i = di;
        {T} qr = vr * d2r - vi * d2i, qi = vr * d2i + vi * d2r;
        buf[2 * l] = er + qi; buf[2 * l + 1] = -ei - qr;
      }
    }
  } else {
    /* Z_k = (X_k + conj X_{h-k}) + i W^-k (X_k - conj X_{h-k}); x = IFFT_h(Z), unnormalised */
    int64_t h = n / 2;
    {T} x0 = buf[0], xh = buf[2 * h];
    buf[0] = x0 + xh; buf[1] = x0 - xh;
    for (int64_t k = 1; 2 * k <= h; ++k) {
      int64_t l = h - k;
      {T} ar = buf[2 * k], ai = buf[2 * k + 1], br = buf[2 * l], bi = buf[2 * l + 1];
      {T} er = ar + br, ei = ai - bi, dr = ar - br, di = ai + bi;
      {T} wr = p->rtw[2 * k], wi = -p->rtw[2 * k + 1];                /* W^-k */
      {T} pr = wr * dr - wi * di, pi = wr * di + wi * dr;
      buf[2 * k] = er - pi; buf[2 * k + 1] = ei + pr;                /* e + i W^-k d */
      if (l != k) {
        {T} vr = -wr, vi = wi;                                       /* W^-l = -conj W^-k */
        {T} d2r = -dr, d2i = di;
        {T} qr = vr * d2r - vi * d2i, qi = vr * d2i + vi * d2r;
        buf[2 * l] = er - qi; buf[2 * l + 1] = -ei + qr;
      }
    }
    ts_fft_conj_{S}(buf, h); ts_fft_run_{S}(p->sub, buf, work); ts_fft_conj_{S}(buf, h);
  }
  ts_fft_free_{S}(own);
  return 0;
}
