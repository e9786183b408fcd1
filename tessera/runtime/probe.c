/* The machine probe (tessera/runtime/probe.py builds it with the project's flags).
   Each thread runs CHAINS independent float32 FMA chains (with AVX-512, 16 vectors: more than
   FMA latency x FMA ports on current cores), on values it cannot know at compile time, and
   stores their sum, so the compiler can neither fold nor drop the loop. fmaf is written out
   because the project compiles with -ffp-contract=off. The timings are taken inside the parallel
   region between barriers, so waking the thread team is not counted. */
#include <math.h>
#include <stdint.h>
#include <omp.h>

/* Independent chains per thread: at least FMA latency x FMA ports vectors, and no more than the
   vector registers hold (a chain spilled to memory would measure the store port instead). */
#if defined(__AVX512F__)
#define CHAINS 256              /* 16 of the 32 zmm registers */
#elif defined(__AVX__)
#define CHAINS 96               /* 12 of the 16 ymm registers */
#elif defined(__aarch64__)
#define CHAINS 96               /* 24 of the 32 q registers */
#else
#define CHAINS 48
#endif

int tessera_probe_threads(void) { return omp_get_max_threads(); }
int tessera_probe_chains(void) { return CHAINS; }

/* p[0]: multiplier, p[1]: addend; out[thread]: the sum of that thread's chains. */
double tessera_probe_fma(const float* p, int64_t iters, float* out) {
  double t0 = 0.0, t1 = 0.0;
  #pragma omp parallel
  {
    float acc[CHAINS];
    const int t = omp_get_thread_num();
    const float m = p[0], a = p[1];
    for (int i = 0; i < CHAINS; ++i) acc[i] = 1e-3f * (float)(i + t + 1);
    #pragma omp barrier
    #pragma omp master
    t0 = omp_get_wtime();
    for (int64_t it = 0; it < iters; ++it) {
      #pragma omp simd
      for (int i = 0; i < CHAINS; ++i) acc[i] = fmaf(acc[i], m, a);
    }
    #pragma omp barrier
    #pragma omp master
    t1 = omp_get_wtime();
    float s = 0.0f;
    for (int i = 0; i < CHAINS; ++i) s += acc[i];
    out[t] = s;
  }
  return t1 - t0;
}

/* The same in float64: half the chains, so as many vectors (the same registers) as float32's. */
double tessera_probe_fma64(const double* p, int64_t iters, double* out) {
  double t0 = 0.0, t1 = 0.0;
  #pragma omp parallel
  {
    double acc[CHAINS / 2];
    const int t = omp_get_thread_num();
    const double m = p[0], a = p[1];
    for (int i = 0; i < CHAINS / 2; ++i) acc[i] = 1e-3 * (double)(i + t + 1);
    #pragma omp barrier
    #pragma omp master
    t0 = omp_get_wtime();
    for (int64_t it = 0; it < iters; ++it) {
      #pragma omp simd
      for (int i = 0; i < CHAINS / 2; ++i) acc[i] = fma(acc[i], m, a);
    }
    #pragma omp barrier
    #pragma omp master
    t1 = omp_get_wtime();
    double s = 0.0;
    for (int i = 0; i < CHAINS / 2; ++i) s += acc[i];
    out[t] = s;
  }
  return t1 - t0;
}

/* Touch both arrays with the same static partition the copy uses (first-touch placement). */
void tessera_probe_fill(float* restrict src, float* restrict dst, int64_t n) {
  #pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) { src[i] = (float)(i & 1023); dst[i] = 0.0f; }
}

double tessera_probe_copy(const float* restrict src, float* restrict dst, int64_t n) {
  double t0 = 0.0, t1 = 0.0;
  #pragma omp parallel
  {
    #pragma omp barrier
    #pragma omp master
    t0 = omp_get_wtime();
    #pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
    /* the implicit barrier of the loop: every thread has finished */
    #pragma omp master
    t1 = omp_get_wtime();
  }
  return t1 - t0;
}

int tessera_entry(void** b) { (void)b; return 0; }
int tessera_entry_timed(void** b, double* t) { (void)b; (void)t; return 0; }
