/* sgemm_peak.c: the CPU ceiling the step benchmarks compare with: OpenBLAS sgemm at 1024^3,
 * 10 runs after a warm-up, on the threads OPENBLAS_NUM_THREADS allows. Prints GFLOP/s. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(void) {
  int n = 1024;
  float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
  if (!a || !b || !c) return 1;
  for (int i = 0; i < n * n; i++) {
    a[i] = 1.0f / (float)(i % 7 + 1);
    b[i] = 1.0f / (float)(i % 5 + 1);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int r = 0; r < 10; r++) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  printf("%.1f\n", 10 * 2.0 * n * n * n / s / 1e9);
  free(a);
  free(b);
  free(c);
  return 0;
}
