/* launch.h: host-side helpers of the launchers (nvcc only: every .cu includes it under
 * #ifndef __CUDACC_RTC__). errors.cu defines them. */
#ifndef CPLAN_CUDA_LAUNCH_H
#define CPLAN_CUDA_LAUNCH_H

#include "kernels_cuda.h"

#include <cuda_runtime.h>
#include <string.h>

/* Records "launcher: message" as this thread's error (cplan_cuda_error) and returns -1. */
int cplan_cuda_fail(const char *launcher, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 0 when the last launch went through, else cplan_cuda_fail with the CUDA error. */
int cplan_cuda_launched(const char *launcher);

/* An argument check of a launcher: `return`s the failure. */
#define CPLAN_REQUIRE(launcher, cond, ...)                                                     \
  do {                                                                                         \
    if (!(cond)) return cplan_cuda_fail((launcher), __VA_ARGS__);                              \
  } while (0)

/* Blocks for n elements at `threads` per block, at most cap (grid-stride loops do the rest). */
static inline unsigned cplan_blocks(int64_t n, int threads, unsigned cap) {
  int64_t b = (n + threads - 1) / threads;
  return b < 1 ? 1u : b > (int64_t)cap ? cap : (unsigned)b;
}

/* Threads per block for a row of n elements: a multiple of 32 in [32, 1024]. */
static inline int cplan_row_threads(int n) {
  int t = 32;
  while (t < n && t < 1024) t *= 2;
  return t;
}

#define CPLAN_MAX_GRID 65535u

#endif
