/* host_types.h: f32, bf16 and f16 elements of a cudaDataType_t buffer, read and written on the host
 * (bf16: round to nearest even; f16: the compiler's _Float16), for the GEMM tests and the cuBLASLt
 * model (tests/cuda/lt_model.c, tests/cuda/emu/test_emu_gemm.c). */
#ifndef CPLAN_HOST_TYPES_H
#define CPLAN_HOST_TYPES_H
#include <library_types.h>
#include <stdint.h>
#include <string.h>

static inline void ht_put(void *p, cudaDataType_t t, int64_t i, double v) {
  float f = (float)v;
  if (t == CUDA_R_16BF) {
    uint32_t u;
    memcpy(&u, &f, 4);
    ((uint16_t *)p)[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  } else if (t == CUDA_R_16F) ((_Float16 *)p)[i] = (_Float16)f;
  else ((float *)p)[i] = f;
}

static inline double ht_get(const void *p, cudaDataType_t t, int64_t i) {
  if (t == CUDA_R_16BF) {
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  if (t == CUDA_R_16F) return (double)((const _Float16 *)p)[i];
  return ((const float *)p)[i];
}
#endif
