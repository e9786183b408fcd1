/* The timing driver of the direct convolution's shape probe (compiler/target/gemm_shape.py),
   appended to one candidate's float32 convolution library: 4 images of c channels hw x hw by
   a 3 x 3 kernel ('same' padding) to c channels, one task an image over every thread, as
   programs run it (each task takes the direct path: whole output rows, c a multiple of the
   channel vectors); the best of `reps` runs in seconds (0 when out of memory). */
#include <omp.h>
#include <time.h>

static double ts_conv_probe_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double ts_conv_shape_probe(int64_t c, int64_t hw, int reps) {
  const int64_t n = 4, P = hw * hw, K = 9 * c;
  float* x = (float*)malloc(sizeof(float) * (size_t)(2 * n * c * P + c * K));
  if (!x) return 0.0;
  float *y = x + n * c * P, *w = y + n * c * P;
  for (int64_t i = 0; i < n * c * P; ++i) x[i] = (float)(i % 17) * 0.0625f - 0.5f;
  for (int64_t i = 0; i < c * K; ++i) w[i] = (float)(i % 13) * 0.0625f - 0.375f;
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    double t0 = ts_conv_probe_now();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      ts_conv_tile_f32(w, K, x + i * c * P, y + i * c * P, P, K, c, P, 256, 0, P, 1, hw, hw, 1,
                       3, 3, 1, hw, hw, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 0, 0);
    double s = ts_conv_probe_now() - t0;
    if (r == 0 || s < best) best = s;
  }
  free(x);
  return best;
}

int tessera_entry(void** b) { (void)b; return 0; }
int tessera_entry_timed(void** b, double* t) { (void)b; (void)t; return 0; }
