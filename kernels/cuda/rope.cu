/* rope.cu: rotary position embedding on [nb, t, d], forward and backward (kernels_cuda.h;
 * reference k_rope_* in kernels/cpu/ref.c). One thread per pair (x[2i], x[2i+1]) of a row,
 * rotated by pos * base^(-2i/d), pos = the row's index along t. The angle and its sine and
 * cosine are computed in f64: positions reach thousands of radians, where an f32 angle would
 * already be off by 1e-4. The backward rotates by the opposite angle and accumulates. */
#include "cuda_common.h"

template <typename T>
__device__ __forceinline__ void rope_rotate(T *dst, const T *src, long long rows, int t, int d, float base,
                                            double sign, bool acc) {
  int half = d / 2;
  long long pairs = rows * half;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < pairs; e += (long long)gridDim.x * blockDim.x) {
    long long row = e / half;
    int i = (int)(e % half), pos = (int)(row % t);
    double ang = sign * pos * pow((double)base, -2.0 * i / d), sn, cs;
    sincos(ang, &sn, &cs);
    long long o = row * d + 2 * i;
    float x0 = ld(src[o]), x1 = ld(src[o + 1]);
    float y0 = (float)(x0 * cs - x1 * sn), y1 = (float)(x0 * sn + x1 * cs);
    dst[o] = st<T>(acc ? ld(dst[o]) + y0 : y0);
    dst[o + 1] = st<T>(acc ? ld(dst[o + 1]) + y1 : y1);
  }
}

#define ROPE_ENTRIES(T, S)                                                                                 \
  extern "C" __global__ void rope_forward_##S(T *out, const T *x, long long rows, int t, int d, float base) { \
    rope_rotate<T>(out, x, rows, t, d, base, 1.0, false);                                                  \
  }                                                                                                        \
  extern "C" __global__ void rope_backward_##S(T *dx, const T *dout, long long rows, int t, int d,         \
                                               float base) {                                               \
    rope_rotate<T>(dx, dout, rows, t, d, base, -1.0, true);                                                \
  }

ROPE_ENTRIES(float, f32)
ROPE_ENTRIES(bf16, bf16)
ROPE_ENTRIES(fp16, f16)

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

static int rope_launch(const char *me, bool fwd, CplanDtype dt, void *dst, const void *src, int nb, int t, int d,
                       float base, cudaStream_t stream) {
  CPLAN_REQUIRE(me, nb >= 0 && t > 0 && d > 0, "bad shape [%d, %d, %d]", nb, t, d);
  CPLAN_REQUIRE(me, d % 2 == 0, "the last dim %d is odd: rope rotates pairs", d);
  CPLAN_REQUIRE(me, base > 0, "base %g must be positive", (double)base);
  CPLAN_REQUIRE(me, nb == 0 || (dst && src), "tensors must not be NULL");
  if (nb == 0) return 0;
  long long rows = (long long)nb * t;
  unsigned g = cplan_blocks(rows * (d / 2), 256, 65535u * 4);
  if (dt == CPLAN_F32 && fwd) rope_forward_f32<<<g, 256, 0, stream>>>((float *)dst, (const float *)src, rows, t, d, base);
  else if (dt == CPLAN_F32) rope_backward_f32<<<g, 256, 0, stream>>>((float *)dst, (const float *)src, rows, t, d, base);
  else if (dt == CPLAN_BF16 && fwd) rope_forward_bf16<<<g, 256, 0, stream>>>((bf16 *)dst, (const bf16 *)src, rows, t, d, base);
  else if (dt == CPLAN_F16 && fwd) rope_forward_f16<<<g, 256, 0, stream>>>((fp16 *)dst, (const fp16 *)src, rows, t, d, base);
  else if (dt == CPLAN_BF16) rope_backward_bf16<<<g, 256, 0, stream>>>((bf16 *)dst, (const bf16 *)src, rows, t, d, base);
  else if (dt == CPLAN_F16) rope_backward_f16<<<g, 256, 0, stream>>>((fp16 *)dst, (const fp16 *)src, rows, t, d, base);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_rope_forward(CplanDtype dt, void *out, const void *x, int nb, int t, int d, float base,
                                       cudaStream_t stream) {
  return rope_launch("cplan_cuda_rope_forward", true, dt, out, x, nb, t, d, base, stream);
}

extern "C" int cplan_cuda_rope_backward(CplanDtype dt, void *dx, const void *dout, int nb, int t, int d, float base,
                                        cudaStream_t stream) {
  return rope_launch("cplan_cuda_rope_backward", false, dt, dx, dout, nb, t, d, base, stream);
}
#endif
