/* softmax.cu: softmax over the last axis, forward (also PyTorch's _safe_softmax) and backward
 * (kernels_cuda.h; reference k_softmax_* and k_safe_softmax_forward in kernels/cpu/ref.c). One
 * block per row (grid-stride over rows): the max, the sum of exp(x - max) by block reductions in
 * f32, then the scaled outputs. */
#include "cuda_common.h"

/* SAFE: PyTorch's _safe_softmax, a row whose max is -inf (every score masked) gives 0, not NaN */
template <typename T, bool SAFE>
__device__ __forceinline__ void softmax_fwd(T *out, const T *x, int rows, int n) {
  __shared__ float sh[33];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + (long long)r * n;
    T *yr = out + (long long)r * n;
    float m = -CPLAN_INF;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, ld(xr[j]));
    m = block_reduce<true>(m, sh);
    if (SAFE && m == -CPLAN_INF) { /* m is the block's: every thread takes this branch */
      for (int j = threadIdx.x; j < n; j += blockDim.x) yr[j] = st<T>(0.0f);
      continue;
    }
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += expf(ld(xr[j]) - m);
    float inv = 1.0f / block_reduce<false>(s, sh);
    for (int j = threadIdx.x; j < n; j += blockDim.x) yr[j] = st<T>(expf(ld(xr[j]) - m) * inv);
  }
}

/* dx += y (dy - sum(dy y)) */
template <typename T>
__device__ __forceinline__ void softmax_bwd(T *dx, const T *dout, const T *out, int rows, int n) {
  __shared__ float sh[33];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *dy = dout + (long long)r * n, *y = out + (long long)r * n;
    T *dxr = dx + (long long)r * n;
    float dot = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) dot += ld(dy[j]) * ld(y[j]);
    dot = block_reduce<false>(dot, sh);
    for (int j = threadIdx.x; j < n; j += blockDim.x)
      dxr[j] = st<T>(ld(dxr[j]) + ld(y[j]) * (ld(dy[j]) - dot));
  }
}

#define SOFTMAX_ENTRIES(T, S)                                                                         \
  extern "C" __global__ void softmax_forward_##S(T *out, const T *x, int rows, int n) {               \
    softmax_fwd<T, false>(out, x, rows, n);                                                           \
  }                                                                                                   \
  extern "C" __global__ void safe_softmax_forward_##S(T *out, const T *x, int rows, int n) {          \
    softmax_fwd<T, true>(out, x, rows, n);                                                            \
  }                                                                                                   \
  extern "C" __global__ void softmax_backward_##S(T *dx, const T *dout, const T *out, int rows, int n) { \
    softmax_bwd<T>(dx, dout, out, rows, n);                                                           \
  }

SOFTMAX_ENTRIES(float, f32)
SOFTMAX_ENTRIES(bf16, bf16)
SOFTMAX_ENTRIES(fp16, f16)

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

static int softmax_forward(const char *me, bool safe, CplanDtype dt, void *out, const void *x, int rows, int n,
                           cudaStream_t stream) {
  CPLAN_REQUIRE(me, rows >= 0 && n > 0, "bad shape [%d, %d]", rows, n);
  CPLAN_REQUIRE(me, out && x, "out and x must not be NULL");
  if (rows == 0) return 0;
  unsigned grid = rows > (int)CPLAN_MAX_GRID ? CPLAN_MAX_GRID : (unsigned)rows;
  int th = cplan_row_threads(n);
  if (dt == CPLAN_F32 && safe) safe_softmax_forward_f32<<<grid, th, 0, stream>>>((float *)out, (const float *)x, rows, n);
  else if (dt == CPLAN_F32) softmax_forward_f32<<<grid, th, 0, stream>>>((float *)out, (const float *)x, rows, n);
  else if (dt == CPLAN_BF16 && safe) safe_softmax_forward_bf16<<<grid, th, 0, stream>>>((bf16 *)out, (const bf16 *)x, rows, n);
  else if (dt == CPLAN_BF16) softmax_forward_bf16<<<grid, th, 0, stream>>>((bf16 *)out, (const bf16 *)x, rows, n);
  else if (dt == CPLAN_F16 && safe) safe_softmax_forward_f16<<<grid, th, 0, stream>>>((fp16 *)out, (const fp16 *)x, rows, n);
  else if (dt == CPLAN_F16) softmax_forward_f16<<<grid, th, 0, stream>>>((fp16 *)out, (const fp16 *)x, rows, n);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_softmax_forward(CplanDtype dt, void *out, const void *x, int rows, int n,
                                          cudaStream_t stream) {
  return softmax_forward("cplan_cuda_softmax_forward", false, dt, out, x, rows, n, stream);
}

extern "C" int cplan_cuda_safe_softmax_forward(CplanDtype dt, void *out, const void *x, int rows, int n,
                                               cudaStream_t stream) {
  return softmax_forward("cplan_cuda_safe_softmax_forward", true, dt, out, x, rows, n, stream);
}

extern "C" int cplan_cuda_softmax_backward(CplanDtype dt, void *dx, const void *dout, const void *out,
                                           int rows, int n, cudaStream_t stream) {
  const char *me = "cplan_cuda_softmax_backward";
  CPLAN_REQUIRE(me, rows >= 0 && n > 0, "bad shape [%d, %d]", rows, n);
  CPLAN_REQUIRE(me, dx && dout && out, "dx, dout and out must not be NULL");
  if (rows == 0) return 0;
  unsigned grid = rows > (int)CPLAN_MAX_GRID ? CPLAN_MAX_GRID : (unsigned)rows;
  int th = cplan_row_threads(n);
  if (dt == CPLAN_F32)
    softmax_backward_f32<<<grid, th, 0, stream>>>((float *)dx, (const float *)dout, (const float *)out, rows, n);
  else if (dt == CPLAN_BF16)
    softmax_backward_bf16<<<grid, th, 0, stream>>>((bf16 *)dx, (const bf16 *)dout, (const bf16 *)out, rows, n);
  else if (dt == CPLAN_F16)
    softmax_backward_f16<<<grid, th, 0, stream>>>((fp16 *)dx, (const fp16 *)dout, (const fp16 *)out, rows, n);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}
#endif
