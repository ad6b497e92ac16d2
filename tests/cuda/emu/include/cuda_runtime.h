/* cuda_runtime.h of the CUDA-on-CPU test emulator (tests/cuda/emu/README.md): this directory
 * comes before the toolkit's in the include path of the emulated build, so the kernels'
 * launchers (kernels/cuda/launch.h) get the emulator instead of the toolkit's runtime header.
 * The API itself is the toolkit's cuda_runtime_api.h; emu_runtime.cpp implements it. */
#ifndef CPLAN_CUDA_EMU_RUNTIME_H
#define CPLAN_CUDA_EMU_RUNTIME_H

#ifdef __cplusplus
#include "../cuda_emu.h"

/* the C++ conveniences of the toolkit's cuda_runtime.h */
template <typename T> inline cudaError_t cudaMalloc(T **p, size_t size) { return ::cudaMalloc((void **)p, size); }
template <typename T> inline cudaError_t cudaFuncSetAttribute(T *f, enum cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute((const void *)f, attr, value);
}
#else
#include <cuda_runtime_api.h>
#endif

#endif
