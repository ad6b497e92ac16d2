/* cuda_ok.h: CUDA_OK and LAUNCH_OK, the exit-on-error checks of the GPU test and benchmark programs
 * (tests/gpu/test_kernels.c, bench/attention_gpu.c): the call, where, and why, then exit 1. */
#ifndef CPLAN_TESTS_CUDA_OK_H
#define CPLAN_TESTS_CUDA_OK_H

#include "kernels_cuda.h"

#include <stdio.h>
#include <stdlib.h>

#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* a kernels/cuda launcher's nonzero return: its message (cplan_cuda_error) */
#define LAUNCH_OK(call)                                                                            \
  do {                                                                                             \
    if ((call) != 0) {                                                                             \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cplan_cuda_error());                     \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#endif
