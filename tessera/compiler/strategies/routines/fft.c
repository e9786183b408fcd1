/* Fast Fourier transforms of `lanes` lines at once. Inside, the lines are two planes of {T},
   element-major (element k of line v at k * lanes + v), so every butterfly works on `lanes`
   adjacent values: vector instructions across the lines. The lines come in and go out where
   they lie: rows of planes (the real parts re[v * ld + k], the imaginary parts a plane
   further), rows of pairs (re, im) as a complex array holds them, or lines along an outer
   axis (element k of every lane in one row).

   ts_fft_{S}(src, sld, sstep, sim, dst, dld, dstep, dim, n, lanes, kind, scale), kind: 0
   forward complex, 1 inverse complex (unnormalised: n x), 2 real to complex, 3 complex to
   real (unnormalised); element k of line v at src[v * sld + k * sstep] (its imaginary part
   sim further), the results likewise at dst times scale. A real line of even n is n/2 complex
   values (x_2j real, x_2j+1 imaginary: a row of reals is its own pairs) and comes back the
   same way from kind 3; an odd one is n complex values with zero imaginary parts in, the real
   parts out. Kind 2 gives n/2 + 1 frequencies; kind 3 takes n/2 + 1, the imaginary parts of
   the zero and Nyquist frequencies ignored. Returns nonzero when its memory cannot be had.

   Complex transforms: a Stockham autosort (decimation in frequency) over the factors of n,
   4s first, then 2, 3, 5, 7 and any odd prime up to TS_FFT_MAX_RADIX (a butterfly over the
   radix's symmetric pairs), two radix-4 stages at a time in one pass over the planes (a lone
   line's first pair vectorised across butterflies); a larger prime factor makes the whole
   line a Bluestein transform (a chirp convolution by FFTs of a 5-smooth length m >= 2n - 1).
   Real transforms of even n pack the line as n/2 complex values and untangle the halves; odd
   n go through the complex transform. The inverse is the conjugate of the forward transform
   of the conjugate.

   Planes larger than L2 run the stages in two phases of cache-sized blocks (ts_fft_blocked):
   the same butterflies in another order. ts_fft_pairs_{S}(src, dst, n, inverse, scale): one
   complex line out of place as a complex array holds it (re, im pairs), the first pass reading
   the pairs and the last writing them times scale (what a caller's gather and scatter do).

   Twiddles are computed once per (n, kind) in double precision, from an octant reduction done
   in integers (so e^{-2 pi i j/N} is exact where it is 1, -1, i or -i), and rounded once to {T}.
   Plans are cached for the process (a lock only to add one). Every output is one fixed chain
   of operations whatever the thread count: a stage's butterflies are independent, and the
   transposes move values without arithmetic. */
#define TS_FFT_MAX_RADIX 31
#define TS_FFT_MAX_STAGES 64
#define TS_FFT_PLANS 512
#define TS_FFT_PARALLEL 65536     /* complex elements of a stage worth threads of their own */
#define TS_FFT_PIECES 64          /* a parallel stage's butterflies, in this many pieces */
/* Where part k (w1r w1i w2r w2i w3r w3i) of radix-4 butterfly j's twiddles lies in its stage's
   table: six in a row, or (lm: a plan's lane16 stages) 16 butterflies' part k in a row, so that
   a line's first stages, vectorised across butterflies, load them as vectors. */
#define TS_FFT_TWI(lm, j, k) ((lm) ? ((j) >> 4) * 96 + (k) * 16 + ((j) & 15) : 6 * (j) + (k))

typedef struct ts_fft_plan_{S} {
  int64_t n, real;                  /* real: a plan for kind 2/3 of even n */
  int nf, passes;                   /* stages, and passes over the planes (pairs of 4s fused) */
  int lane16;                        /* stages 0 and 1 store their twiddles 16 butterflies by
                                        16, part by part (TS_FFT_TWI) */
  int radix[TS_FFT_MAX_STAGES];
  int64_t twoff[TS_FFT_MAX_STAGES]; /* each stage's twiddles in tw (complex elements) */
  {T}* tw;
  {T}* odd;                          /* per stage of an odd radix p: cos, sin(2 pi t/p), t < p */
  int64_t oddoff[TS_FFT_MAX_STAGES];
  int64_t m;                         /* Bluestein: the convolution's length (0: none) */
  struct ts_fft_plan_{S}* sub;       /* Bluestein: the m-point plan; real: the n/2-point plan */
  {T}* chirp;                        /* Bluestein: e^{-pi i k^2 / n}, k < n */
  {T}* kernel;                       /* Bluestein: FFT_m of the conjugate chirp, / m (planes) */
  {T}* rtw;                          /* real: e^{-2 pi i k / n}, k < n/2 */
  int64_t work;                      /* the passes' planes, {T}s per lane (ts_fft_work: a call's) */
} ts_fft_plan_{S};

static ts_fft_plan_{S}* ts_fft_cache_{S}[TS_FFT_PLANS];
static int ts_fft_count_{S} = 0;

/* cos and sin of an angle in [0, pi/4] by their Taylor series, + and * alone (no C library:
   the same bits on every target; written out by strategies/fft.py's cos_sin) */
{COS_SIN}

/* e^{-2 pi i j / N} in double: the quadrant and the octant from integers, then cos and sin of
   an angle in [0, pi/4]. */
static void ts_fft_unit_{S}(int64_t j, int64_t N, double* c, double* s) {
  int64_t r = ((j % N) + N) % N;
  int64_t q = (4 * r) / N, rem = 4 * r - q * N;   /* angle = (q + rem/N) pi/2 */
  double cs, sn;
  if (rem == 0) { cs = 1.0; sn = 0.0; }
  else if (2 * rem <= N) {
    double a = 1.5707963267948966 * (double)rem / (double)N;
    ts_fft_cos_sin_{S}(a, &cs, &sn);
  } else {
    double a = 1.5707963267948966 * (double)(N - rem) / (double)N;
    ts_fft_cos_sin_{S}(a, &sn, &cs);
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

static void ts_fft_run_{S}(const ts_fft_plan_{S}* p, {T}* re, {T}* im, int64_t lanes,
                           {T}* work, {T}** out);
static int64_t ts_fft_work_{S}(const ts_fft_plan_{S}* p, int64_t lanes);

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

/* whether stage i runs with stage i + 1 in one pass (two radix-4 stages, both before end) */
static int ts_fft_fused_{S}(const ts_fft_plan_{S}* p, int i, int end) {
  return p->radix[i] == 4 && i + 1 < end && p->radix[i + 1] == 4;
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
    {T}* w = ({T}*)malloc(sizeof({T}) * ((p->sub ? ts_fft_work_{S}(p->sub, 1) : 0) + 1));
    if (!p->sub || !p->chirp || !p->kernel || !w) { free(w); ts_fft_free_{S}(p); return 0; }
    for (int64_t k = 0; k < n; ++k) {
      double c, s;                                 /* k^2 mod 2n, exactly */
      int64_t k2 = (int64_t)(((unsigned __int128)k * (unsigned __int128)k) %
                             (unsigned __int128)(2 * n));
      ts_fft_unit_{S}(k2, 2 * n, &c, &s);
      p->chirp[2 * k] = ({T})c; p->chirp[2 * k + 1] = ({T})s;
    }
    {T}* kre = p->kernel;
    {T}* kim = p->kernel + p->m;
    for (int64_t k = 0; k < n; ++k) {              /* the conjugate chirp, wrapped around */
      kre[k] = p->chirp[2 * k]; kim[k] = -p->chirp[2 * k + 1];
      if (k) { kre[p->m - k] = kre[k]; kim[p->m - k] = kim[k]; }
    }
    ts_fft_run_{S}(p->sub, kre, kim, 1, w, 0);
    free(w);
    {T} inv = ({T})(1.0 / (double)p->m);
    for (int64_t k = 0; k < 2 * p->m; ++k) p->kernel[k] *= inv;
    return p;
  }
  int64_t tw = 0, odd = 0, L = n;
  /* (lines this long run alone, s = 1 at stage 0; shorter ones in blocks of lanes, whose
     vectors run across the lines and load each twiddle once: six in a row serve them best) */
  p->lane16 = p->nf >= 2 && p->radix[0] == 4 && p->radix[1] == 4 && n % 256 == 0 &&
              n >= TS_FFT_PARALLEL;
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
        ts_fft_unit_{S}(j * u * (n / L), n, &c, &s);   /* e^{-2 pi i j u / L}: n-th roots */
        int64_t at = r == 4 ? TS_FFT_TWI(p->lane16 && i < 2, j, 2 * u - 2)
                            : 2 * (j * (r - 1) + u - 1);
        t[at] = ({T})c; t[at + (r == 4 && p->lane16 && i < 2 ? 16 : 1)] = ({T})s;
      }
    if (r % 2)
      for (int u = 0; u < r; ++u) {                /* cos and sin of 2 pi u / r */
        double c, s;
        ts_fft_unit_{S}(u, r, &c, &s);
        p->odd[p->oddoff[i] + 2 * u] = ({T})c; p->odd[p->oddoff[i] + 2 * u + 1] = ({T})(-s);
      }
    L = m;
  }
  for (int i = 0; i < p->nf; ++p->passes) i += ts_fft_fused_{S}(p, i, p->nf) ? 2 : 1;
  p->work = (p->passes % 2 && p->passes > 1 ? 4 : 2) * n;
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

/* The transposes between the caller's rows and the stages' element-major planes: square tiles
   through vector registers (AVX-512: 16 floats or 8 doubles; AVX2: 8 or 4), the edges and
   other ISAs element by element in tiles of 8 (so each cache line is touched while held). */
#ifndef TS_FFT_TILES
#define TS_FFT_TILES
#if defined(__AVX512F__)
#include <immintrin.h>
#define TS_FFT_TILE_F32 16
#define TS_FFT_TILE_F64 8
static inline void ts_fft_tile_f32(const float* s, int64_t sld, float* d, int64_t dld) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(s + i * sld);
  for (int i = 0; i < 16; i += 2) {          /* pairs of rows: 2 x 2 blocks of single values */
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4)            /* 4 x 4 blocks within each 128-bit lane */
    for (int h = 0; h < 2; ++h) {
      __m512d a = _mm512_castps_pd(t[i + h]), b = _mm512_castps_pd(t[i + h + 2]);
      r[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      r[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    }
  for (int i = 0; i < 4; ++i) {              /* then the 128-bit lanes themselves */
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(d + i * dld, r[i]);
}
static inline void ts_fft_tile_f64(const double* s, int64_t sld, double* d, int64_t dld) {
  __m512d r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm512_loadu_pd(s + i * sld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm512_unpacklo_pd(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_pd(r[i], r[i + 1]);
  }
  for (int i = 0; i < 2; ++i) {              /* 128-bit pairs, then 256-bit halves */
    r[i] = _mm512_shuffle_f64x2(t[i], t[i + 2], 0x88);
    r[i + 2] = _mm512_shuffle_f64x2(t[i], t[i + 2], 0xdd);
    r[i + 4] = _mm512_shuffle_f64x2(t[i + 4], t[i + 6], 0x88);
    r[i + 6] = _mm512_shuffle_f64x2(t[i + 4], t[i + 6], 0xdd);
  }
  for (int i = 0; i < 2; ++i) {
    t[i] = _mm512_shuffle_f64x2(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f64x2(r[i], r[i + 4], 0xdd);
    t[i + 2] = _mm512_shuffle_f64x2(r[i + 2], r[i + 6], 0x88);
    t[i + 6] = _mm512_shuffle_f64x2(r[i + 2], r[i + 6], 0xdd);
  }
  for (int i = 0; i < 8; ++i) _mm512_storeu_pd(d + i * dld, t[i]);
}
#elif defined(__AVX2__)
#include <immintrin.h>
#define TS_FFT_TILE_F32 8
#define TS_FFT_TILE_F64 4
static inline void ts_fft_tile_f32(const float* s, int64_t sld, float* d, int64_t dld) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(s + i * sld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; ++h) {
      r[i + 2 * h] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], 0x44);
      r[i + 2 * h + 1] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], 0xee);
    }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(d + i * dld, t[i]);
}
static inline void ts_fft_tile_f64(const double* s, int64_t sld, double* d, int64_t dld) {
  __m256d r[4], t[4];
  for (int i = 0; i < 4; ++i) r[i] = _mm256_loadu_pd(s + i * sld);
  for (int i = 0; i < 4; i += 2) {
    t[i] = _mm256_unpacklo_pd(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_pd(r[i], r[i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    r[i] = _mm256_permute2f128_pd(t[i], t[i + 2], 0x20);
    r[i + 2] = _mm256_permute2f128_pd(t[i], t[i + 2], 0x31);
  }
  for (int i = 0; i < 4; ++i) _mm256_storeu_pd(d + i * dld, r[i]);
}
#endif
#endif

/* dst[c * dld + r] = src[r * sld + c] for r < rows, c < cols */
static void ts_fft_transpose_{S}(const {T}* restrict src, int64_t sld, {T}* restrict dst,
                                 int64_t dld, int64_t rows, int64_t cols) {
#ifdef TS_FFT_TILE_F32
  const int f32 = sizeof({T}) == 4;
  const int64_t b = f32 ? TS_FFT_TILE_F32 : TS_FFT_TILE_F64;
#else
  const int64_t b = 8;
#endif
  for (int64_t r0 = 0; r0 < rows; r0 += b)
    for (int64_t c0 = 0; c0 < cols; c0 += b) {
#ifdef TS_FFT_TILE_F32
      if (r0 + b <= rows && c0 + b <= cols) {
        if (f32) ts_fft_tile_f32((const float*)(src + r0 * sld + c0), sld,
                                 (float*)(dst + c0 * dld + r0), dld);
        else ts_fft_tile_f64((const double*)(src + r0 * sld + c0), sld,
                             (double*)(dst + c0 * dld + r0), dld);
        continue;
      }
#endif
      int64_t re = r0 + b < rows ? r0 + b : rows, ce = c0 + b < cols ? c0 + b : cols;
      for (int64_t c = c0; c < ce; ++c)
        for (int64_t r = r0; r < re; ++r) dst[c * dld + r] = src[r * sld + c];
    }
}

#ifndef TS_FFT_TW_MAP
#define TS_FFT_TW_MAP
/* Where butterfly j of a stage finds its twiddles: at j (map 0), or, in a block of a long
   line's first phase (ts_fft_blocked), at the whole line's butterfly of group g0 + j % G
   (G = 2^shift of the R groups) and row j / G. */
typedef struct { int64_t shift, g0, R; } ts_fft_tw_map;
static inline int64_t ts_fft_tj(const ts_fft_tw_map* t, int64_t j) {
  return t ? t->g0 + (j & (((int64_t)1 << t->shift) - 1)) + t->R * (j >> t->shift) : j;
}
#endif

/* (a + ib)(c + id), on plain {T}s (no fused multiply-add: -ffp-contract=off) */
#define TS_CMUL_RE(a, b, c, d) ((a) * (c) - (b) * (d))
#define TS_CMUL_IM(a, b, c, d) ((a) * (d) + (b) * (c))

/* The radix-4 butterfly: a0..a3 in, b0..b3 out, twiddles w1..w3 (each multiplied, 1
   included). b0 = t0 + t2, b2 = t0 - t2, b1 = t1 - i t3, b3 = t1 + i t3 before the twiddles,
   t0, t1 = a0 +/- a2 and t2, t3 = a1 +/- a3. */
#define TS_FFT_BFLY4(T, a0r, a0i, a1r, a1i, a2r, a2i, a3r, a3i, w1r, w1i, w2r, w2i, w3r, w3i,    \
                     b0r, b0i, b1r, b1i, b2r, b2i, b3r, b3i) do {                               \
    T t0r = a0r + a2r, t0i = a0i + a2i, t1r = a0r - a2r, t1i = a0i - a2i;                     \
    T t2r = a1r + a3r, t2i = a1i + a3i, t3r = a1r - a3r, t3i = a1i - a3i;                     \
    T c1r = t1r + t3i, c1i = t1i - t3r, c2r = t0r - t2r, c2i = t0i - t2i;                     \
    T c3r = t1r - t3i, c3i = t1i + t3r;                                                       \
    b0r = t0r + t2r; b0i = t0i + t2i;                                                         \
    b1r = TS_CMUL_RE(c1r, c1i, w1r, w1i); b1i = TS_CMUL_IM(c1r, c1i, w1r, w1i);               \
    b2r = TS_CMUL_RE(c2r, c2i, w2r, w2i); b2i = TS_CMUL_IM(c2r, c2i, w2r, w2i);               \
    b3r = TS_CMUL_RE(c3r, c3i, w3r, w3i); b3i = TS_CMUL_IM(c3r, c3i, w3r, w3i);               \
  } while (0)

/* One stage: L = r m points per transform, stride s (n lanes = L s); element q + s (j + u m)
   of the input goes into butterfly (j, q), whose output t lands at q + s (r j + t). */
static void ts_fft_stage_{S}(int r, int64_t m, int64_t s, int64_t ja, int64_t jb,
                             const {T}* restrict xr, const {T}* restrict xi, {T}* restrict yr,
                             {T}* restrict yi, const {T}* restrict tw, const {T}* restrict oc,
                             const ts_fft_tw_map* map, int lm) {
  int64_t sm = s * m;
  if (r == 4) {
    for (int64_t j = ja; j < jb; ++j) {
      const int64_t jt = ts_fft_tj(map, j);
      const {T} w1r = tw[TS_FFT_TWI(lm, jt, 0)], w1i = tw[TS_FFT_TWI(lm, jt, 1)],
                w2r = tw[TS_FFT_TWI(lm, jt, 2)], w2i = tw[TS_FFT_TWI(lm, jt, 3)],
                w3r = tw[TS_FFT_TWI(lm, jt, 4)], w3i = tw[TS_FFT_TWI(lm, jt, 5)];
      const {T}* ar = xr + s * j;
      const {T}* ai = xi + s * j;
      {T}* orr = yr + s * 4 * j;
      {T}* oi = yi + s * 4 * j;
      #pragma omp simd
      for (int64_t q = 0; q < s; ++q)
        TS_FFT_BFLY4({T}, ar[q], ai[q], ar[q + sm], ai[q + sm], ar[q + 2 * sm], ai[q + 2 * sm],
                     ar[q + 3 * sm], ai[q + 3 * sm], w1r, w1i, w2r, w2i, w3r, w3i,
                     orr[q], oi[q], orr[q + s], oi[q + s], orr[q + 2 * s], oi[q + 2 * s],
                     orr[q + 3 * s], oi[q + 3 * s]);
    }
  } else if (r == 2) {
    for (int64_t j = ja; j < jb; ++j) {
      const {T} wr = tw[2 * ts_fft_tj(map, j)], wi = tw[2 * ts_fft_tj(map, j) + 1];
      const {T}* ar = xr + s * j;
      const {T}* ai = xi + s * j;
      {T}* orr = yr + s * 2 * j;
      {T}* oi = yi + s * 2 * j;
      #pragma omp simd
      for (int64_t q = 0; q < s; ++q) {
        {T} dr = ar[q] - ar[q + sm], di = ai[q] - ai[q + sm];
        orr[q] = ar[q] + ar[q + sm]; oi[q] = ai[q] + ai[q + sm];
        orr[q + s] = TS_CMUL_RE(dr, di, wr, wi); oi[q + s] = TS_CMUL_IM(dr, di, wr, wi);
      }
    }
  } else {
    /* b_0 = sum a_u; for t = 1 .. (r-1)/2, over the pairs u, r - u:
       b_t, b_{r-t} = a_0 + sum cos(2 pi u t/r) (a_u + a_{r-u}) -/+ i sin(..) (a_u - a_{r-u}) */
    for (int64_t j = ja; j < jb; ++j) {
      const {T}* ar = xr + s * j;
      const {T}* ai = xi + s * j;
      {T}* orr = yr + s * r * j;
      {T}* oi = yi + s * r * j;
      for (int64_t q = 0; q < s; ++q) {
        {T} s0r = ar[q], s0i = ai[q];
        for (int u = 1; u <= r / 2; ++u) {
          s0r += ar[q + u * sm] + ar[q + (r - u) * sm];
          s0i += ai[q + u * sm] + ai[q + (r - u) * sm];
        }
        orr[q] = s0r; oi[q] = s0i;
      }
      for (int t = 1; t <= r / 2; ++t) {
        const {T}* w1 = tw + 2 * (ts_fft_tj(map, j) * (r - 1) + t - 1);
        const {T}* w2 = tw + 2 * (ts_fft_tj(map, j) * (r - 1) + r - t - 1);
        for (int64_t q = 0; q < s; ++q) {
          {T} er = ar[q], ei = ai[q], fr = 0, fi = 0;
          for (int u = 1; u <= r / 2; ++u) {
            int k = (int)(((int64_t)u * t) % r);
            {T} c = oc[2 * k], sn = oc[2 * k + 1];
            {T} pr = ar[q + u * sm], pi = ai[q + u * sm];
            {T} nr = ar[q + (r - u) * sm], ni = ai[q + (r - u) * sm];
            er += c * (pr + nr); ei += c * (pi + ni);
            fr += sn * (pr - nr); fi += sn * (pi - ni);
          }
          /* b_t = e - i f, b_{r-t} = e + i f; then the twiddles */
          {T} btr = er + fi, bti = ei - fr, bur = er - fi, bui = ei + fr;
          orr[q + s * t] = TS_CMUL_RE(btr, bti, w1[0], w1[1]);
          oi[q + s * t] = TS_CMUL_IM(btr, bti, w1[0], w1[1]);
          orr[q + s * (r - t)] = TS_CMUL_RE(bur, bui, w2[0], w2[1]);
          oi[q + s * (r - t)] = TS_CMUL_IM(bur, bui, w2[0], w2[1]);
        }
      }
    }
  }
}

/* Two radix-4 stages in one pass: (4, m, s) then (4, m/4, 4s), each value read and written
   once instead of twice. Butterfly j' of the second stage takes output t of the first's
   butterflies j' + u m/4 (u < 4), at stride s the same q: so for each (j', q) the 16 values
   stay in registers between the stages. The butterflies are the stages' own (bit for bit).
   TS_FFT_UNIT44 is one (j', q): IN(u, v, part) the first stage's input v of butterfly u,
   OUT(t, w, part) the second's output w of butterfly t (part r or i), TW(u, k) twiddle part k
   of the first stage's butterfly u (u = 4: the second stage's); c{t}{u} holds output t of
   the first stage's butterfly u. */
#define TS_FFT_FIRST(T, IN, TW, u)                                                          \
  T c0##u##r, c0##u##i, c1##u##r, c1##u##i, c2##u##r, c2##u##i, c3##u##r, c3##u##i;         \
  TS_FFT_BFLY4(T, IN(u, 0, r), IN(u, 0, i), IN(u, 1, r), IN(u, 1, i), IN(u, 2, r),           \
               IN(u, 2, i), IN(u, 3, r), IN(u, 3, i), TW(u, 0), TW(u, 1), TW(u, 2),          \
               TW(u, 3), TW(u, 4), TW(u, 5), c0##u##r, c0##u##i, c1##u##r, c1##u##i,         \
               c2##u##r, c2##u##i, c3##u##r, c3##u##i)
#define TS_FFT_SECOND(T, OUT, TW, t)                                                        \
  TS_FFT_BFLY4(T, c##t##0r, c##t##0i, c##t##1r, c##t##1i, c##t##2r, c##t##2i, c##t##3r,     \
               c##t##3i, TW(4, 0), TW(4, 1), TW(4, 2), TW(4, 3), TW(4, 4), TW(4, 5),        \
               OUT(t, 0, r), OUT(t, 0, i), OUT(t, 1, r), OUT(t, 1, i), OUT(t, 2, r),         \
               OUT(t, 2, i), OUT(t, 3, r), OUT(t, 3, i))
#define TS_FFT_UNIT44(T, IN, OUT, TW) do {                                                  \
    TS_FFT_FIRST(T, IN, TW, 0); TS_FFT_FIRST(T, IN, TW, 1);                                 \
    TS_FFT_FIRST(T, IN, TW, 2); TS_FFT_FIRST(T, IN, TW, 3);                                 \
    TS_FFT_SECOND(T, OUT, TW, 0); TS_FFT_SECOND(T, OUT, TW, 1);                             \
    TS_FFT_SECOND(T, OUT, TW, 2); TS_FFT_SECOND(T, OUT, TW, 3);                             \
  } while (0)

static void ts_fft_stage44_{S}(int64_t m, int64_t s, int64_t ja, int64_t jb,
                               const {T}* restrict xr, const {T}* restrict xi,
                               {T}* restrict yr, {T}* restrict yi, const {T}* restrict twa,
                               const {T}* restrict twb, const ts_fft_tw_map* map, int lma,
                               int lmb) {
  int64_t mq = m / 4, sm = s * m;
  if (s == 1 && ja % 16 == 0 && jb % 16 == 0) {
    /* one line's first stages: vectors across 16 butterflies j' (their outputs 16 apart),
       gathered in a tile and transposed into place */
    for (int64_t j0 = ja; j0 < jb; j0 += 16) {
      {T} tr[256], ti[256], w[5][6][16];          /* w[u][k][jj]: the twiddles, by lane */
      /* (16 butterflies from j0 have consecutive twiddles: a map's G is 16 at least) */
      const int64_t jt[5] = {ts_fft_tj(map, j0), ts_fft_tj(map, j0 + mq),
                             ts_fft_tj(map, j0 + 2 * mq), ts_fft_tj(map, j0 + 3 * mq),
                             ts_fft_tj(map, j0)};
      const {T}* tb[5];                           /* tb[u][16 k + jj]: the plan's or w's */
      for (int u = 0; u < 5; ++u) {
        const {T}* t = u < 4 ? twa : twb;
        if (u < 4 ? lma : lmb) { tb[u] = t + TS_FFT_TWI(1, jt[u], 0); continue; }
        for (int64_t jj = 0; jj < 16; ++jj)
          for (int k = 0; k < 6; ++k) w[u][k][jj] = t[6 * (jt[u] + jj) + k];
        tb[u] = &w[u][0][0];
      }
      #pragma omp simd
      for (int64_t jj = 0; jj < 16; ++jj) {
        int64_t j = j0 + jj;
#define TS_IN(u, v, part) x##part[j + (u) * mq + (v) * m]
#define TS_OUT(b, w, part) t##part[16 * ((b) + 4 * (w)) + jj]
#define TS_TW(u, k) tb[u][16 * (k) + jj]
        TS_FFT_UNIT44({T}, TS_IN, TS_OUT, TS_TW);
#undef TS_TW
#undef TS_IN
#undef TS_OUT
      }
      ts_fft_transpose_{S}(tr, 16, yr + 16 * j0, 16, 16, 16);
      ts_fft_transpose_{S}(ti, 16, yi + 16 * j0, 16, 16, 16);
    }
    return;
  }
  for (int64_t j = ja; j < jb; ++j) {
    {T} w[5][6];
    for (int u = 0; u < 5; ++u) {
      const int64_t jt = ts_fft_tj(map, u < 4 ? j + u * mq : j);
      for (int k = 0; k < 6; ++k)
        w[u][k] = u < 4 ? twa[TS_FFT_TWI(lma, jt, k)] : twb[TS_FFT_TWI(lmb, jt, k)];
    }
    const {T}* ar = xr + s * j;
    const {T}* ai = xi + s * j;
    {T}* zr = yr + 16 * s * j;
    {T}* zi = yi + 16 * s * j;
    #pragma omp simd
    for (int64_t q = 0; q < s; ++q) {
#define TS_IN(u, v, part) a##part[q + (u) * s * mq + (v) * sm]
#define TS_OUT(b, w, part) z##part[q + s * ((b) + 4 * (w))]
#define TS_TW(u, k) w[u][k]
      TS_FFT_UNIT44({T}, TS_IN, TS_OUT, TS_TW);
#undef TS_TW
#undef TS_IN
#undef TS_OUT
    }
  }
}

/* Stage i (and i + 1 with it where both are radix 4 and before end) of L points at stride s,
   its butterflies split among threads if par, twiddles by map. Returns the stages taken. */
static int ts_fft_pass_{S}(const ts_fft_plan_{S}* p, int i, int end, int64_t L, int64_t s,
                           int par, const ts_fft_tw_map* map, const {T}* xr, const {T}* xi,
                           {T}* yr, {T}* yi) {
  int r = p->radix[i], fuse = ts_fft_fused_{S}(p, i, end);
  const {T}* twa = p->tw + 2 * p->twoff[i];
  int64_t units = L / (fuse ? 16 : r), grain = fuse && s == 1 ? 16 : 1;
#define TS_FFT_UNITS(ja, jb)                                                                 \
  (fuse ? ts_fft_stage44_{S}(L / 4, s, ja, jb, xr, xi, yr, yi, twa,                         \
                             p->tw + 2 * p->twoff[i + 1], map, p->lane16 && i < 2,           \
                             p->lane16 && i + 1 < 2)                                         \
        : ts_fft_stage_{S}(r, L / r, s, ja, jb, xr, xi, yr, yi, twa, p->odd + p->oddoff[i],  \
                           map, p->lane16 && i < 2))
  if (par) {
    #pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < TS_FFT_PIECES; ++c)   /* (pieces of whole grains) */
      TS_FFT_UNITS(units / grain * c / TS_FFT_PIECES * grain,
                   c + 1 == TS_FFT_PIECES ? units
                                          : units / grain * (c + 1) / TS_FFT_PIECES * grain);
  } else {
    TS_FFT_UNITS(0, units);
  }
#undef TS_FFT_UNITS
  return fuse ? 2 : 1;
}

/* count complex pairs (re, im) from src into two planes, the imaginary parts negated if conj
   (as ts_fft_negate: -x, so a NaN's sign too) */
static inline void ts_fft_unpair_{S}({T}* restrict re, {T}* restrict im,
                                     const {T}* restrict src, int64_t count, int conj) {
  #pragma omp simd
  for (int64_t e = 0; e < count; ++e) {
    re[e] = src[2 * e];
    im[e] = conj ? -src[2 * e + 1] : src[2 * e + 1];
  }
}

/* two planes into count complex pairs at dst, the imaginary parts negated if conj, then times
   scale unless it is 1 (the generated scatter's product) */
static inline void ts_fft_pair_{S}({T}* restrict dst, const {T}* restrict re,
                                   const {T}* restrict im, int64_t count, int conj, {T} scale) {
  int scaled = scale != 1;
  #pragma omp simd
  for (int64_t e = 0; e < count; ++e) {
    {T} r = re[e], i = conj ? -im[e] : im[e];
    dst[2 * e] = scaled ? r * scale : r;
    dst[2 * e + 1] = scaled ? i * scale : i;
  }
}

/* A transform whose two planes pass TS_FFT_BLOCKED bytes (beyond a core's L2) runs its stages in
   two phases of cache-sized blocks, each value read and written twice in all instead of once
   per pass (2^20 points: 10 stages in 5 passes). The butterflies and their twiddles are the
   passes' own, only their order changes: the same bits.
   Split before stage k, R = L_k points left: at stage i < k the values of group g < R (the
   butterflies j = g mod R and their inputs) lie at a + s g + R s b (a < s, the stage's stride),
   which for G consecutive groups from g0, gathered as a + s gg + G s b, is a Stockham stage of
   G L_i / R points at the same stride whose butterfly j takes the line's twiddles of butterfly
   g0 + j % G + R (j / G); after stage k - 1 group g is the row [g a, (g + 1) a) (a = N / R,
   the lanes left). Phase one gathers G groups into a block, runs stages 0 .. k - 1 there and
   writes the rows to the work planes; phase two gathers G of the a columns (element q + a X,
   X < R), runs stages k .. nf - 1 as a transform of G lanes and scatters them into the line. */
#define TS_FFT_BLOCKED (1 << 20)   /* bytes of the two planes beyond which the stages block */
#define TS_FFT_BLOCK (1 << 18)     /* a block's two planes, bytes at most (16 rows at least) */
#ifndef TS_FFT_SPLIT
#define TS_FFT_SPLIT
#ifdef _OPENMP
#include <omp.h>
#define TS_FFT_THREADS() omp_get_max_threads()
#define TS_FFT_THREAD() omp_get_thread_num()
#else
#define TS_FFT_THREADS() 1
#define TS_FFT_THREAD() 0
#endif
/* k the first stage of phase two, R its points, a = N / R its lanes; G1 the groups a block of
   phase one takes, G2 the lanes of phase two; block: a block's elements per plane */
typedef struct { int k; int64_t R, a, G1, G2, block; } ts_fft_split;

/* the largest power of two dividing count, 16 at least (0: none; a cache line of float32, and
   the twiddles of 16 butterflies in a row for the vector path) and beyond 16 only while G rows
   of `bytes` stay within TS_FFT_BLOCK */
static int64_t ts_fft_rows(int64_t count, int64_t bytes) {
  int64_t G = 1;
  while (count % (2 * G) == 0 && (G < 16 || 2 * G * bytes <= TS_FFT_BLOCK)) G *= 2;
  return G >= 16 ? G : 0;
}

/* a row of bytes, a multiple of 64 (G >= 16), in pieces of 64 that the compiler moves inline
   (a call to memcpy per row cost as much as the row) */
static inline void ts_fft_copy(void* restrict d, const void* restrict s, size_t bytes) {
  for (size_t e = 0; e < bytes; e += 64)
    __builtin_memcpy((unsigned char*)d + e, (const unsigned char*)s + e, 64);
}
#endif

/* whether the stages of `lanes` lines block, and how: the split whose larger side is least */
static int ts_fft_split_{S}(const ts_fft_plan_{S}* p, int64_t lanes, ts_fft_split* sp) {
  int64_t N = p->n * lanes, L = p->n, best = 0;
  if (p->m || p->nf < 2 || 2 * N * (int64_t)sizeof({T}) <= TS_FFT_BLOCKED) return 0;
  for (int i = 0; i + 1 < p->nf; ++i) {
    L /= p->radix[i];
    int64_t a = N / L, worst = a > L ? a : L;
    if (!best || worst < best) { best = worst; sp->k = i + 1; sp->R = L; sp->a = a; }
  }
  sp->G1 = ts_fft_rows(sp->R, 2 * sp->a * (int64_t)sizeof({T}));
  sp->G2 = ts_fft_rows(sp->a, 2 * sp->R * (int64_t)sizeof({T}));
  sp->block = sp->G1 * sp->a > sp->G2 * sp->R ? sp->G1 * sp->a : sp->G2 * sp->R;
  return sp->G1 && sp->G2;
}

/* The work a run of `lanes` lines takes ({T} elements): the blocked stages' work planes and
   two blocks (two planes each) per thread, or the passes' planes. */
static int64_t ts_fft_work_{S}(const ts_fft_plan_{S}* p, int64_t lanes) {
  ts_fft_split sp;
  if (p->real) return ts_fft_work_{S}(p->sub, lanes);
  if (p->m) return 2 * p->m * lanes + ts_fft_work_{S}(p->sub, lanes);
  if (ts_fft_split_{S}(p, lanes, &sp))
    return 2 * p->n * lanes + 4 * sp.block * (int64_t)TS_FFT_THREADS();
  return p->work * lanes;
}

/* pairs (one line, ts_fft_pairs): phase one gathers from pairs->src, conjugated if
   pairs->conj, and phase two scatters to pairs->dst, conjugated and times pairs->scale; else
   in place on re and im */
typedef struct { const {T}* src; {T}* dst; int conj; {T} scale; } ts_fft_pairs_io_{S};

static void ts_fft_blocked_{S}(const ts_fft_plan_{S}* p, const ts_fft_split* sp, {T}* re,
                               {T}* im, int64_t lanes, {T}* work,
                               const ts_fft_pairs_io_{S}* pairs) {
  const int64_t N = p->n * lanes, R = sp->R, a = sp->a, G1 = sp->G1, G2 = sp->G2, B = sp->block;
  const int k = sp->k, nt = TS_FFT_THREADS();
  int shift = 0;
  while (((int64_t)1 << shift) < G1) ++shift;
  #pragma omp parallel num_threads(nt) if(N >= TS_FFT_PARALLEL)
  {
    {T}* mine = work + 2 * N + 4 * B * TS_FFT_THREAD();
    {T}* blk[2] = {mine, mine + 2 * B};           /* two blocks, planes re then im */
    #pragma omp for schedule(static)
    for (int64_t g0 = 0; g0 < R; g0 += G1) {
      const int64_t rows = N / (R * lanes), chunk = lanes * G1;  /* (s = lanes at stage 0) */
      for (int64_t b = 0; b < rows; ++b) {
        if (pairs) {
          ts_fft_unpair_{S}(blk[0] + chunk * b, blk[0] + B + chunk * b,
                            pairs->src + 2 * (g0 + R * b), chunk, pairs->conj);
          continue;
        }
        ts_fft_copy(blk[0] + chunk * b, re + lanes * (g0 + R * b), sizeof({T}) * chunk);
        ts_fft_copy(blk[0] + B + chunk * b, im + lanes * (g0 + R * b), sizeof({T}) * chunk);
      }
      const ts_fft_tw_map map = {shift, g0, R};
      int64_t L = p->n, s = lanes;
      int cur = 0;
      for (int i = 0; i < k;) {
        int last = i + (ts_fft_fused_{S}(p, i, k) ? 2 : 1) >= k;
        {T}* dr = last ? work + a * g0 : blk[1 - cur];
        {T}* di = last ? work + N + a * g0 : blk[1 - cur] + B;
        int step = ts_fft_pass_{S}(p, i, k, G1 * (L / R), s, 0, &map, blk[cur], blk[cur] + B,
                                   dr, di);
        for (int e = 0; e < step; ++e) { L /= p->radix[i]; s *= p->radix[i]; ++i; }
        cur = 1 - cur;
      }
    }
    #pragma omp for schedule(static)
    for (int64_t q0 = 0; q0 < a; q0 += G2) {
      for (int64_t X = 0; X < R; ++X) {
        ts_fft_copy(blk[0] + G2 * X, work + q0 + a * X, sizeof({T}) * G2);
        ts_fft_copy(blk[0] + B + G2 * X, work + N + q0 + a * X, sizeof({T}) * G2);
      }
      int64_t L = R, s = G2;
      int cur = 0;
      for (int i = k; i < p->nf; cur = 1 - cur) {
        int step = ts_fft_pass_{S}(p, i, p->nf, L, s, 0, 0, blk[cur], blk[cur] + B,
                                   blk[1 - cur], blk[1 - cur] + B);
        for (int e = 0; e < step; ++e) { L /= p->radix[i]; s *= p->radix[i]; ++i; }
      }
      for (int64_t X = 0; X < R; ++X) {
        if (pairs) {
          ts_fft_pair_{S}(pairs->dst + 2 * (q0 + a * X), blk[cur] + G2 * X,
                          blk[cur] + B + G2 * X, G2, pairs->conj, pairs->scale);
          continue;
        }
        ts_fft_copy(re + q0 + a * X, blk[cur] + G2 * X, sizeof({T}) * G2);
        ts_fft_copy(im + q0 + a * X, blk[cur] + B + G2 * X, sizeof({T}) * G2);
      }
    }
  }
}

/* The forward complex transform of `lanes` lines in place; work: ts_fft_work elements. With
   `out`, the passes may leave the result in the work planes instead (out[0], out[1]: where its
   real and imaginary parts lie): they alternate between the line and one pair of work planes
   whatever their count, so an odd count touches two pairs of planes, not three. */
static void ts_fft_run_{S}(const ts_fft_plan_{S}* p, {T}* re, {T}* im, int64_t lanes,
                           {T}* work, {T}** out) {
  int64_t n = p->n;
  ts_fft_split sp;
  if (out) { out[0] = re; out[1] = im; }
  if (ts_fft_split_{S}(p, lanes, &sp)) {
    ts_fft_blocked_{S}(p, &sp, re, im, lanes, work, 0);
    return;
  }
  if (p->m) {                                      /* Bluestein */
    int64_t m = p->m, N = n * lanes, M = m * lanes;
    {T}* ar = work;
    {T}* ai = work + M;
    const {T}* kre = p->kernel;
    const {T}* kim = p->kernel + m;
    for (int64_t k = 0; k < n; ++k) {
      {T} cr = p->chirp[2 * k], ci = p->chirp[2 * k + 1];
      for (int64_t v = 0; v < lanes; ++v) {
        {T} xr = re[k * lanes + v], xi = im[k * lanes + v];
        ar[k * lanes + v] = TS_CMUL_RE(xr, xi, cr, ci);
        ai[k * lanes + v] = TS_CMUL_IM(xr, xi, cr, ci);
      }
    }
    for (int64_t k = N; k < M; ++k) { ar[k] = 0; ai[k] = 0; }
    ts_fft_run_{S}(p->sub, ar, ai, lanes, work + 2 * M, 0);
    for (int64_t k = 0; k < m; ++k) {              /* times the kernel, conjugated */
      {T} br = kre[k], bi = kim[k];
      for (int64_t v = 0; v < lanes; ++v) {
        {T} xr = ar[k * lanes + v], xi = ai[k * lanes + v];
        ar[k * lanes + v] = TS_CMUL_RE(xr, xi, br, bi);
        ai[k * lanes + v] = -TS_CMUL_IM(xr, xi, br, bi);
      }
    }
    ts_fft_run_{S}(p->sub, ar, ai, lanes, work + 2 * M, 0);  /* the inverse: conj(F conj(.)) */
    for (int64_t k = 0; k < n; ++k) {
      {T} cr = p->chirp[2 * k], ci = p->chirp[2 * k + 1];
      for (int64_t v = 0; v < lanes; ++v) {
        {T} xr = ar[k * lanes + v], xi = -ai[k * lanes + v];
        re[k * lanes + v] = TS_CMUL_RE(xr, xi, cr, ci);
        im[k * lanes + v] = TS_CMUL_IM(xr, xi, cr, ci);
      }
    }
    return;
  }
  /* pass k reads where pass k - 1 wrote; an even count alternates between the line and one
     pair of work planes, an odd count of 3 or more goes line, A, B, A, ..., line, so that
     neither ends with a copy */
  int64_t N = n * lanes, L = n, s = lanes;
  {T}* sr = re;
  {T}* si = im;
  for (int i = 0, k = 0; i < p->nf; ++k) {
    {T}* dr;
    if (out || p->passes % 2 == 0 || p->passes == 1) dr = sr == re ? work : re;
    else if (k == p->passes - 1) dr = re;
    else dr = sr == work ? work + 2 * N : work;
    {T}* di = dr == re ? im : dr + N;
    int step = ts_fft_pass_{S}(p, i, p->nf, L, s, L * s >= TS_FFT_PARALLEL, 0, sr, si, dr,
                               di);
    sr = dr; si = di;
    for (int e = 0; e < step; ++e) { L /= p->radix[i]; s *= p->radix[i]; ++i; }
  }
  if (out) { out[0] = sr; out[1] = si; return; }
  if (sr != re) {                                  /* (one pass) */
    memcpy(re, sr, sizeof({T}) * N);
    memcpy(im, si, sizeof({T}) * N);
  }
}

static void ts_fft_negate_{S}({T}* x, int64_t count) {
  for (int64_t k = 0; k < count; ++k) x[k] = -x[k];
}

/* The real transforms' untangling of the pairs k, h - k (1 <= k <= h/2) of n = 2h points.
   forward (kind 2, after the transform): X_k = e - i W^k d, e and d = (Z_k +/- conj Z_{h-k})/2;
   inverse (kind 3, before it): Z_k = e + i W^-k d, e and d = X_k +/- conj X_{h-k}. The pair's
   other member from e' = conj e, d' = -conj d, W^{h-k} = -conj W^k. (Times 1 and -1 are exact:
   both directions are one code.) TS_FFT_UNTANGLE: one member's result from the pair's values
   a (at k) and b (at h - k), W^k or W^-k in w, f and sg the direction's factor and sign. */
#define TS_FFT_UNTANGLE(T, f, sg, wr, wi, ar, ai, br, bi, other, outr, outi) do {           \
    T er_ = (f) * ((ar) + (br)), ei_ = (f) * ((ai) - (bi));                                  \
    T dr_ = (f) * ((ar) - (br)), di_ = (f) * ((ai) + (bi));                                  \
    if (!(other)) {                                                                          \
      T pr_ = TS_CMUL_RE(wr, wi, dr_, di_), pi_ = TS_CMUL_IM(wr, wi, dr_, di_);              \
      outr = er_ + (sg) * pi_; outi = ei_ - (sg) * pr_;                                      \
    } else {                                                                                 \
      T qr_ = TS_CMUL_RE(-(wr), wi, -dr_, di_), qi_ = TS_CMUL_IM(-(wr), wi, -dr_, di_);      \
      outr = er_ + (sg) * qi_; outi = -ei_ - (sg) * qr_;                                     \
    }                                                                                        \
  } while (0)

/* (the inverse: the results' imaginary parts negated, as the inverse transform after it
   wants them: every k < h is one of a pair's) */
static void ts_fft_untangle_{S}({T}* re, {T}* im, const {T}* rtw, int64_t h, int64_t V,
                                int forward) {
  const {T} f = forward ? ({T})0.5 : ({T})1, sg = forward ? ({T})1 : ({T})-1;
  for (int64_t k = 1; 2 * k <= h; ++k) {
    int64_t l = h - k;
    {T} wr = rtw[2 * k], wi = sg * rtw[2 * k + 1];                     /* W^k, or W^-k */
    {T}* kr = re + k * V;
    {T}* ki = im + k * V;
    {T}* lr = re + l * V;
    {T}* li = im + l * V;
    /* (a loop per direction and per l == k: a branch inside kept gcc from vectorising) */
#define TS_FFT_UNTANGLE_LOOP(NEG, BOTH)                                                     \
    _Pragma("omp simd")                                                                      \
    for (int64_t v = 0; v < V; ++v) {                                                        \
      {T} ar = kr[v], ai = ki[v], br = lr[v], bi = li[v], xr, xi, yr, yi;                    \
      TS_FFT_UNTANGLE({T}, f, sg, wr, wi, ar, ai, br, bi, 0, xr, xi);                        \
      TS_FFT_UNTANGLE({T}, f, sg, wr, wi, ar, ai, br, bi, 1, yr, yi);                        \
      kr[v] = xr; ki[v] = NEG xi;                                                            \
      if (BOTH) { lr[v] = yr; li[v] = NEG yi; }                                              \
    }
    if (forward && l != k) { TS_FFT_UNTANGLE_LOOP(+, 1) }
    else if (forward) { TS_FFT_UNTANGLE_LOOP(+, 0) }
    else if (l != k) { TS_FFT_UNTANGLE_LOOP(-, 1) }
    else { TS_FFT_UNTANGLE_LOOP(-, 0) }
#undef TS_FFT_UNTANGLE_LOOP
  }
}

/* Lines in and out of the stages' element-major planes (element k of lane v at k * V + v).
   A line's element k lies at x + v * ld + k * step (its real part; the imaginary part `im`
   further): rows of planes (step 1, im a plane's size) or of pairs as a complex array holds
   them (step 2, im 1; a real line of even n read as n/2 pairs). They go a square tile at a
   time through a stack tile of rows (the parts apart, negated for conj), which the vector
   tiles transpose: the lines are read and written once, where a caller's gather into planes
   and scatter back cost more than the transposes (rfft 4096x1024: 25% of the call against
   11%). Full tiles of pairs run with constant bounds (vector deinterleaving). */
#define TS_FFT_SQ 16          /* a square tile's side (the widest vector tile, TS_FFT_TILE_F32) */

/* one tile: rows x cols elements from x (lane-major) to tr, ti (lane r's row at SQ r) */
static inline void ts_fft_rows_in_{S}(const {T}* restrict x, int64_t ld, int64_t im,
                                      int64_t step, int64_t rows, int64_t cols, {T}* tr,
                                      {T}* ti) {
  if (step == 2 && im == 1 && rows == TS_FFT_SQ && cols == TS_FFT_SQ) {
    for (int64_t r = 0; r < TS_FFT_SQ; ++r) {
      const {T}* s = x + r * ld;
      #pragma omp simd
      for (int64_t c = 0; c < TS_FFT_SQ; ++c) {
        tr[TS_FFT_SQ * r + c] = s[2 * c]; ti[TS_FFT_SQ * r + c] = s[2 * c + 1];
      }
    }
    return;
  }
  if (step == 1 && rows == TS_FFT_SQ && cols == TS_FFT_SQ) {   /* (rows of planes) */
    for (int64_t r = 0; r < TS_FFT_SQ; ++r) {
      #pragma omp simd
      for (int64_t c = 0; c < TS_FFT_SQ; ++c) {
        tr[TS_FFT_SQ * r + c] = x[r * ld + c]; ti[TS_FFT_SQ * r + c] = x[r * ld + im + c];
      }
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      tr[TS_FFT_SQ * r + c] = x[r * ld + c * step];
      ti[TS_FFT_SQ * r + c] = x[r * ld + c * step + im];
    }
}

/* one tile out: tr, ti (lane r's row at SQ r) to x, the imaginary parts only if both, times
   scale unless it is 1 */
static inline void ts_fft_rows_out_{S}(const {T}* tr, const {T}* ti, {T}* restrict x,
                                       int64_t ld, int64_t im, int64_t step, int64_t rows,
                                       int64_t cols, int both, {T} scale) {
  const int scaled = scale != 1;
  if (step == 2 && im == 1 && both && rows == TS_FFT_SQ && cols == TS_FFT_SQ) {
    for (int64_t r = 0; r < TS_FFT_SQ; ++r) {
      {T}* d = x + r * ld;
      if (scaled) {
        #pragma omp simd
        for (int64_t c = 0; c < TS_FFT_SQ; ++c) {
          d[2 * c] = tr[TS_FFT_SQ * r + c] * scale; d[2 * c + 1] = ti[TS_FFT_SQ * r + c] * scale;
        }
      } else {
        #pragma omp simd
        for (int64_t c = 0; c < TS_FFT_SQ; ++c) {
          d[2 * c] = tr[TS_FFT_SQ * r + c]; d[2 * c + 1] = ti[TS_FFT_SQ * r + c];
        }
      }
    }
    return;
  }
  if (step == 1 && rows == TS_FFT_SQ && cols == TS_FFT_SQ) {   /* (rows of planes) */
    for (int64_t r = 0; r < TS_FFT_SQ; ++r) {
      {T}* d = x + r * ld;
      #pragma omp simd
      for (int64_t c = 0; c < TS_FFT_SQ; ++c) {
        d[c] = scaled ? tr[TS_FFT_SQ * r + c] * scale : tr[TS_FFT_SQ * r + c];
        if (both) d[im + c] = scaled ? ti[TS_FFT_SQ * r + c] * scale : ti[TS_FFT_SQ * r + c];
      }
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      {T} a = tr[TS_FFT_SQ * r + c], b = ti[TS_FFT_SQ * r + c];
      x[r * ld + c * step] = scaled ? a * scale : a;
      if (both) x[r * ld + c * step + im] = scaled ? b * scale : b;
    }
}

/* Lines along an outer axis move a row of lanes at a time, each row in another page (rfft2's
   columns: 128 bytes every 4 KiB), which the hardware's prefetchers do not follow: the rows
   TS_FFT_AHEAD further are asked for while these move (the column transforms of rfft2
   4096x1024: 10.3 -> 6.9 ms). */
#ifndef TS_FFT_AHEAD
#define TS_FFT_AHEAD 16
static inline void ts_fft_prefetch(const void* p, size_t bytes, int write) {
  for (size_t e = 0; e < bytes + 64; e += 64) {
    if (e > bytes) e = bytes;                      /* (the last byte's line too) */
    if (write) __builtin_prefetch((const char*)p + e, 1, 3);
    else __builtin_prefetch((const char*)p + e, 0, 3);
    if (e == bytes) break;
  }
}

/* whether lines at x (ld between lines, step between elements, imaginary parts im further)
   lie element-major: a row of lanes per element, their values side by side (ld 1) or pairs
   side by side (ld 2, im 1), as a transform's lines along an outer axis do; then each element's
   row of lanes moves as it is, no tile transposed (lanes in rows of pairs go by tiles) */
static inline int ts_fft_lanes_apart(int64_t V, int64_t ld, int64_t im, int64_t step) {
  return V > 1 && !(step == 2 && im == 1) && (ld == 1 || (ld == 2 && im == 1));
}
#endif

/* the planes re_, im_ (count elements of V lanes) from x, the imaginary parts negated if conj */
static void ts_fft_gather_{S}(const {T}* restrict x, int64_t ld, int64_t im, int64_t step,
                              {T}* restrict re_, {T}* restrict im_, int64_t V, int64_t count,
                              int conj) {
  if (step == 1 && !conj) {
    ts_fft_transpose_{S}(x, ld, re_, V, V, count);
    ts_fft_transpose_{S}(x + im, ld, im_, V, V, count);
    return;
  }
  if (ts_fft_lanes_apart(V, ld, im, step)) {
    for (int64_t k = 0; k < count; ++k) {
      const {T}* s = x + k * step;
      {T}* a = re_ + k * V;
      {T}* b = im_ + k * V;
      if (k + TS_FFT_AHEAD < count)
        ts_fft_prefetch(s + TS_FFT_AHEAD * step, sizeof({T}) * (V - 1) * ld, 0);
      if (ld == 2 && V % TS_FFT_SQ == 0) {          /* (whole vectors, constant bounds) */
        for (int64_t v0 = 0; v0 < V; v0 += TS_FFT_SQ) {
          #pragma omp simd
          for (int64_t v = v0; v < v0 + TS_FFT_SQ; ++v) { a[v] = s[2 * v]; b[v] = s[2 * v + 1]; }
        }
      } else if (ld == 2) {
        #pragma omp simd
        for (int64_t v = 0; v < V; ++v) { a[v] = s[2 * v]; b[v] = s[2 * v + 1]; }
      } else {
        #pragma omp simd
        for (int64_t v = 0; v < V; ++v) { a[v] = s[v]; b[v] = s[im + v]; }
      }
      if (conj) ts_fft_negate_{S}(b, V);
    }
    return;
  }
  {T} tr[TS_FFT_SQ * TS_FFT_SQ], ti[TS_FFT_SQ * TS_FFT_SQ];
  for (int64_t v0 = 0; v0 < V; v0 += TS_FFT_SQ)
    for (int64_t k0 = 0; k0 < count; k0 += TS_FFT_SQ) {
      int64_t rows = V - v0 < TS_FFT_SQ ? V - v0 : TS_FFT_SQ;
      int64_t cols = count - k0 < TS_FFT_SQ ? count - k0 : TS_FFT_SQ;
      ts_fft_rows_in_{S}(x + v0 * ld + k0 * step, ld, im, step, rows, cols, tr, ti);
      for (int64_t r = 0; r < rows && conj; ++r) ts_fft_negate_{S}(ti + TS_FFT_SQ * r, cols);
      ts_fft_transpose_{S}(tr, TS_FFT_SQ, re_ + k0 * V + v0, V, rows, cols);
      ts_fft_transpose_{S}(ti, TS_FFT_SQ, im_ + k0 * V + v0, V, rows, cols);
    }
}

/* X_k of lanes v0 .. v0 + rows of a forward real transform (h = n/2) from the planes' Z into
   xr, xi: from the pair (a, h - a), a = min(k, h - k), k's member or its partner's (the
   untangling's own operations) */
static inline void ts_fft_untangled_{S}(const {T}* restrict re_, const {T}* restrict im_,
                                        int64_t V, int64_t v0, int64_t rows, int64_t k,
                                        int64_t h, const {T}* rtw, {T}* restrict xr,
                                        {T}* restrict xi) {
  const {T}* zr = re_ + v0;
  const {T}* zi = im_ + v0;
  if (k == 0 || k == h) {                          /* X_0 and X_h from Z_0, real */
    #pragma omp simd
    for (int64_t v = 0; v < rows; ++v) { xr[v] = k ? zr[v] - zi[v] : zr[v] + zi[v]; xi[v] = 0; }
    return;
  }
  int64_t other = 2 * k > h, a = other ? h - k : k, b = h - a;
  const {T} wr = rtw[2 * a], wi = rtw[2 * a + 1];
  #pragma omp simd
  for (int64_t v = 0; v < rows; ++v)
    TS_FFT_UNTANGLE({T}, ({T})0.5, ({T})1, wr, wi, zr[a * V + v], zi[a * V + v],
                    zr[b * V + v], zi[b * V + v], other, xr[v], xi[v]);
}

/* the planes' count elements of V lanes out to x (as ts_fft_gather reads them), the imaginary
   parts only if both, negated if conj, times scale unless it is 1 (the caller's product).
   rtw: a forward real transform's Z (h = count - 1 elements), untangled on the way (no pass
   of its own over the planes; a tile of partners h - k written backwards cost more than
   computing each pair twice). */
static void ts_fft_scatter_{S}(const {T}* restrict re_, const {T}* restrict im_, int64_t V,
                               {T}* restrict x, int64_t ld, int64_t im, int64_t step,
                               int64_t count, int both, int conj, {T} scale,
                               const {T}* rtw) {
  if (step == 1 && scale == 1 && !conj && !rtw) {
    ts_fft_transpose_{S}(re_, V, x, ld, count, V);
    if (both) ts_fft_transpose_{S}(im_, V, x + im, ld, count, V);
    return;
  }
  const int64_t h = count - 1;
  const int scaled = scale != 1;
  {T} tr[TS_FFT_SQ * TS_FFT_SQ], ti[TS_FFT_SQ * TS_FFT_SQ];
  {T} ur[TS_FFT_SQ * TS_FFT_SQ], ui[TS_FFT_SQ * TS_FFT_SQ];  /* untangled, element-major */
  if (ts_fft_lanes_apart(V, ld, im, step)) {
    for (int64_t k = 0; k < count; ++k)
      for (int64_t v0 = 0; v0 < V; v0 += TS_FFT_SQ) {
        int64_t rows = V - v0 < TS_FFT_SQ ? V - v0 : TS_FFT_SQ;
        const {T}* a = re_ + k * V + v0;
        const {T}* b = im_ + k * V + v0;
        if (rtw) {
          ts_fft_untangled_{S}(re_, im_, V, v0, rows, k, h, rtw, ur, ui);
          a = ur; b = ui;
        }
        {T}* d = x + k * step + v0 * ld;
        if (k + TS_FFT_AHEAD < count)
          ts_fft_prefetch(d + TS_FFT_AHEAD * step, sizeof({T}) * ((rows - 1) * ld + 1), 1);
        if (ld == 2 && both && !conj && !scaled && rows == TS_FFT_SQ) {   /* (most often) */
          #pragma omp simd
          for (int64_t v = 0; v < TS_FFT_SQ; ++v) { d[2 * v] = a[v]; d[2 * v + 1] = b[v]; }
          continue;
        }
        {T} r[TS_FFT_SQ], i[TS_FFT_SQ];
        #pragma omp simd
        for (int64_t v = 0; v < rows; ++v) {
          {T} c = conj ? -b[v] : b[v];
          r[v] = scaled ? a[v] * scale : a[v];
          i[v] = scaled ? c * scale : c;
        }
        if (ld == 2 && both) {
          #pragma omp simd
          for (int64_t v = 0; v < rows; ++v) { d[2 * v] = r[v]; d[2 * v + 1] = i[v]; }
        } else {
          #pragma omp simd
          for (int64_t v = 0; v < rows; ++v) d[ld * v] = r[v];
          if (both)
            for (int64_t v = 0; v < rows; ++v) d[ld * v + (ld == 2 ? 1 : im)] = i[v];
        }
      }
    return;
  }
  for (int64_t v0 = 0; v0 < V; v0 += TS_FFT_SQ)
    for (int64_t k0 = 0; k0 < count; k0 += TS_FFT_SQ) {
      int64_t rows = V - v0 < TS_FFT_SQ ? V - v0 : TS_FFT_SQ;
      int64_t cols = count - k0 < TS_FFT_SQ ? count - k0 : TS_FFT_SQ;
      const {T}* sr = re_ + k0 * V + v0;
      const {T}* si = im_ + k0 * V + v0;
      int64_t sld = V;
      if (rtw) {
        for (int64_t c = 0; c < cols; ++c)
          ts_fft_untangled_{S}(re_, im_, V, v0, rows, k0 + c, h, rtw, ur + TS_FFT_SQ * c,
                               ui + TS_FFT_SQ * c);
        sr = ur; si = ui; sld = TS_FFT_SQ;
      }
      ts_fft_transpose_{S}(sr, sld, tr, TS_FFT_SQ, cols, rows);
      if (both) ts_fft_transpose_{S}(si, sld, ti, TS_FFT_SQ, cols, rows);
      for (int64_t r = 0; r < rows && conj && both; ++r)
        ts_fft_negate_{S}(ti + TS_FFT_SQ * r, cols);
      ts_fft_rows_out_{S}(tr, ti, x + v0 * ld + k0 * step, ld, im, step, rows, cols, both,
                          scale);
    }
}

/* ts_fft_run, the result left where the passes stop unless in place: *re, *im follow it */
static inline void ts_fft_run_moving_{S}(const ts_fft_plan_{S}* p, {T}** re, {T}** im,
                                         int64_t lanes, {T}* work, int in_place) {
  {T}* out[2];
  ts_fft_run_{S}(p, *re, *im, lanes, work, in_place ? 0 : out);
  if (!in_place) { *re = out[0]; *im = out[1]; }
}

/* The transforms of `lanes` lines from src to dst (in place where they are the same rows of
   planes), element k of line v at src[v * sld + k * sstep] (its imaginary part sim further)
   and likewise at dst (dld, dstep, dim): rows of planes, rows of pairs (a complex array's; a
   real line of even n read as n/2 pairs), or lines along an outer axis, their lanes side by
   side. The results times scale unless it is 1. Kind 2 gives n/2 + 1 frequencies, kind 3
   takes n/2 + 1 (an even n's real line written as n/2 pairs, an odd one's real parts alone).
   The conjugations of the inverses and a forward real transform's untangling ride on the way
   in and out where the lines move (one pass over the planes each the fewer). */
static int ts_fft_{S}(const {T}* src, int64_t sld, int64_t sstep, int64_t sim, {T}* dst,
                     int64_t dld, int64_t dstep, int64_t dim, int64_t n, int64_t lanes,
                     int kind, {T} scale) {
  /* the elements each kind takes and gives per line */
  int even_real = kind >= 2 && n % 2 == 0;
  int64_t h = n / 2, count_in = kind == 3 ? h + 1 : (even_real ? h : n);
  int64_t count_out = kind == 2 ? h + 1 : (even_real ? h : n);
  int both = kind != 3 || even_real;
  int64_t V = lanes;
  /* one line of planes in place is its own element-major layout */
  int in_place = V == 1 && sstep == 1 && dstep == 1 && src == dst && sim == dim &&
                 scale == 1;
  if (n <= 1) {                                    /* a one-point transform is the identity */
    for (int64_t v = 0; n == 1 && v < V; ++v) {    /* (n == 0: nothing to write) */
      {T} r = src[v * sld], i = kind >= 2 ? 0 : src[v * sld + sim];
      dst[v * dld] = scale != 1 ? r * scale : r;
      if (both) dst[v * dld + dim] = scale != 1 ? i * scale : i;
    }
    return 0;
  }
  ts_fft_plan_{S}* own = 0;
  const ts_fft_plan_{S}* p = ts_fft_lookup_{S}(n, even_real, &own);
  if (!p) return 1;
  int64_t body = ts_fft_work_{S}(p, V), planes = in_place ? 0 : 2 * (n + 1) * V;
  {T}* work = ts_scratch_{S}((size_t)(body + planes));
  if (!work) { ts_fft_free_{S}(own); return 1; }
  {T}* re = in_place ? dst : work + body;
  {T}* im = in_place ? dst + dim : re + (n + 1) * V;
  int conj_in = kind == 1 && !in_place, conj_out = kind % 2 && !in_place;
  const {T}* untangle = 0;                          /* (the forward real one, on the way out) */
  if (!in_place) ts_fft_gather_{S}(src, sld, sim, sstep, re, im, V, count_in, conj_in);
  if (kind == 0 || (kind == 2 && !even_real)) {    /* (odd real lines: zero imaginary parts) */
    ts_fft_run_moving_{S}(p, &re, &im, V, work, in_place);
    if (kind == 2) for (int64_t v = 0; v < V; ++v) im[v] = 0;
  } else if (kind == 1) {
    if (in_place) ts_fft_negate_{S}(im, n * V);
    ts_fft_run_moving_{S}(p, &re, &im, V, work, in_place);
    if (in_place) ts_fft_negate_{S}(im, n * V);
  } else if (kind == 3 && !even_real) {            /* odd n: the Hermitian line, inverted */
    for (int64_t v = 0; v < V; ++v) im[v] = 0;
    for (int64_t k = 1; k <= h; ++k)
      for (int64_t v = 0; v < V; ++v) {
        re[(n - k) * V + v] = re[k * V + v]; im[(n - k) * V + v] = -im[k * V + v];
      }
    ts_fft_negate_{S}(im, n * V);
    ts_fft_run_moving_{S}(p, &re, &im, V, work, in_place);
  } else if (kind == 2) {
    /* Z = FFT_h(z); X_k = (Z_k + conj Z_{h-k})/2 - i W^k (Z_k - conj Z_{h-k})/2 */
    ts_fft_run_moving_{S}(p->sub, &re, &im, V, work, in_place);
    if (in_place) {
      for (int64_t v = 0; v < V; ++v) {
        {T} z0r = re[v], z0i = im[v];
        re[v] = z0r + z0i; im[v] = 0; re[h * V + v] = z0r - z0i; im[h * V + v] = 0;
      }
      ts_fft_untangle_{S}(re, im, p->rtw, h, V, 1);
    } else {
      untangle = p->rtw;
    }
  } else {
    /* Z_k = (X_k + conj X_{h-k}) + i W^-k (X_k - conj X_{h-k}); x = IFFT_h(Z), unnormalised */
    for (int64_t v = 0; v < V; ++v) {
      {T} x0 = re[v], xh = re[h * V + v];
      re[v] = x0 + xh; im[v] = -(x0 - xh);
    }
    ts_fft_untangle_{S}(re, im, p->rtw, h, V, 0);  /* (conjugated: the inverse's) */
    ts_fft_run_moving_{S}(p->sub, &re, &im, V, work, in_place);
    if (in_place) ts_fft_negate_{S}(im, h * V);
  }
  if (!in_place)
    ts_fft_scatter_{S}(re, im, V, dst, dld, dim, dstep, count_out, both, conj_out, scale,
                       untangle);
  ts_fft_free_{S}(own);
  return 0;
}

/* One complex line of n points out of place, in pairs (re, im) as a complex array holds them:
   src's line transformed (inverse: unnormalised, kind 1's) into dst, times scale. The line is
   read and written once, by the stages' first and last passes where they block: a long line's
   gather into planes and scatter back (8 MB each way at 2^20 float32 points) are the caller's
   no longer. The same operations, so the same bits, as ts_fft with the caller's gather and
   scatter. Returns nonzero when its memory cannot be had. */
static int ts_fft_pairs_{S}(const {T}* src, {T}* dst, int64_t n, int inverse, {T} scale) {
  if (n <= 1) {                                     /* (a point is its own transform) */
    if (n == 1) ts_fft_pair_{S}(dst, src, src + 1, 1, 0, scale);
    return 0;
  }
  ts_fft_plan_{S}* own = 0;
  const ts_fft_plan_{S}* p = ts_fft_lookup_{S}(n, 0, &own);
  if (!p) return 1;
  ts_fft_split sp;
  int blocked = ts_fft_split_{S}(p, 1, &sp);
  int64_t body = ts_fft_work_{S}(p, 1);
  {T}* work = ts_scratch_{S}((size_t)(body + (blocked ? 0 : 2 * n)));
  if (!work) { ts_fft_free_{S}(own); return 1; }
  if (blocked) {
    ts_fft_pairs_io_{S} io = {src, dst, inverse, scale};
    ts_fft_blocked_{S}(p, &sp, 0, 0, 1, work, &io);
  } else {                                          /* (the planes after the work) */
    {T}* re = work + body;
    ts_fft_unpair_{S}(re, re + n, src, n, inverse);
    ts_fft_run_{S}(p, re, re + n, 1, work, 0);
    ts_fft_pair_{S}(dst, re, re + n, n, inverse, scale);
  }
  ts_fft_free_{S}(own);
  return 0;
}
