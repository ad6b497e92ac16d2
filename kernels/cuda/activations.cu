/* activations.cu: gelu (the tanh form) and silu, forward and backward (kernels_cuda.h;
 * reference k_unary_forward / k_unary_backward with K_GELU, K_SILU in kernels/cpu/ref.c, whose
 * formulas these are, in f32). Elementwise, grid-stride; a backward accumulates into dx. */
#include "cuda_common.h"

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

__device__ __forceinline__ float gelu_f(float x) {
  return 0.5f * x * (1.0f + tanhf(GELU_S * (x + GELU_C * x * x * x)));
}
__device__ __forceinline__ float gelu_df(float x) {
  float th = tanhf(GELU_S * (x + GELU_C * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_S * (1.0f + 3.0f * GELU_C * x * x);
}
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_df(float x) {
  float s = 1.0f / (1.0f + expf(-x));
  return s * (1.0f + x * (1.0f - s));
}

#define ACT_ENTRIES(T, S, NAME)                                                                    \
  extern "C" __global__ void NAME##_forward_##S(T *out, const T *x, long long n) {                 \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                    \
         i += (long long)gridDim.x * blockDim.x)                                                   \
      out[i] = st<T>(NAME##_f(ld(x[i])));                                                          \
  }                                                                                                \
  extern "C" __global__ void NAME##_backward_##S(T *dx, const T *dout, const T *x, long long n) {  \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                    \
         i += (long long)gridDim.x * blockDim.x)                                                   \
      dx[i] = st<T>(ld(dx[i]) + ld(dout[i]) * NAME##_df(ld(x[i])));                                \
  }

ACT_ENTRIES(float, f32, gelu)
ACT_ENTRIES(bf16, bf16, gelu)
ACT_ENTRIES(fp16, f16, gelu)
ACT_ENTRIES(float, f32, silu)
ACT_ENTRIES(bf16, bf16, silu)
ACT_ENTRIES(fp16, f16, silu)

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

#define ACT_LAUNCHERS(NAME)                                                                            \
  extern "C" int cplan_cuda_##NAME##_forward(CplanDtype dt, void *out, const void *x, int64_t n,      \
                                             cudaStream_t stream) {                                   \
    const char *me = "cplan_cuda_" #NAME "_forward";                                                  \
    CPLAN_REQUIRE(me, n >= 0, "negative size %lld", (long long)n);                                    \
    CPLAN_REQUIRE(me, n == 0 || (out && x), "out and x must not be NULL");                            \
    if (n == 0) return 0;                                                                             \
    unsigned g = cplan_blocks(n, 256, 65535u * 4);                                                    \
    if (dt == CPLAN_F32) NAME##_forward_f32<<<g, 256, 0, stream>>>((float *)out, (const float *)x, n); \
    else if (dt == CPLAN_BF16) NAME##_forward_bf16<<<g, 256, 0, stream>>>((bf16 *)out, (const bf16 *)x, n); \
    else if (dt == CPLAN_F16) NAME##_forward_f16<<<g, 256, 0, stream>>>((fp16 *)out, (const fp16 *)x, n); \
    else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);                                     \
    return cplan_cuda_launched(me);                                                                   \
  }                                                                                                   \
  extern "C" int cplan_cuda_##NAME##_backward(CplanDtype dt, void *dx, const void *dout, const void *x, \
                                              int64_t n, cudaStream_t stream) {                       \
    const char *me = "cplan_cuda_" #NAME "_backward";                                                 \
    CPLAN_REQUIRE(me, n >= 0, "negative size %lld", (long long)n);                                    \
    CPLAN_REQUIRE(me, n == 0 || (dx && dout && x), "dx, dout and x must not be NULL");                \
    if (n == 0) return 0;                                                                             \
    unsigned g = cplan_blocks(n, 256, 65535u * 4);                                                    \
    if (dt == CPLAN_F32)                                                                              \
      NAME##_backward_f32<<<g, 256, 0, stream>>>((float *)dx, (const float *)dout, (const float *)x, n); \
    else if (dt == CPLAN_BF16)                                                                        \
      NAME##_backward_bf16<<<g, 256, 0, stream>>>((bf16 *)dx, (const bf16 *)dout, (const bf16 *)x, n); \
    else if (dt == CPLAN_F16)                                                                         \
      NAME##_backward_f16<<<g, 256, 0, stream>>>((fp16 *)dx, (const fp16 *)dout, (const fp16 *)x, n); \
    else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);                                     \
    return cplan_cuda_launched(me);                                                                   \
  }

ACT_LAUNCHERS(gelu)
ACT_LAUNCHERS(silu)
#endif
