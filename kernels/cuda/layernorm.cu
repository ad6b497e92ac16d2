/* layernorm.cu: layer_norm and rms_norm, forward and backward (kernels_cuda.h; references
 * k_layer_norm_* and k_rms_norm_* in kernels/cpu/ref.c).
 *
 * Forward and the dx part of the backward: one block per row (grid-stride over rows), the row's
 * statistics by block reductions, in f32, two passes for the variance as the reference does.
 * dw and db sum over all rows: a second kernel gives each column to one thread column of a
 * 32 x 32 block, which walks the rows in a fixed order, so the sums are deterministic without
 * atomics. RMS is the same code without the mean (and without b, db). */
#include "cuda_common.h"

template <typename T, bool RMS>
__device__ __forceinline__ void norm_forward(T *out, float *mean, float *rstd, const T *x, const T *w,
                                             const T *b, int rows, int c, float eps) {
  __shared__ float sh[33];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + (long long)r * c;
    float m = 0.0f;
    if (!RMS) {
      float s = 0.0f;
      for (int j = threadIdx.x; j < c; j += blockDim.x) s += ld(xr[j]);
      m = block_reduce<false>(s, sh) / (float)c;
    }
    float v = 0.0f;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      float d = ld(xr[j]) - m;
      v += d * d;
    }
    float rs = 1.0f / sqrtf(block_reduce<false>(v, sh) / (float)c + eps);
    T *yr = out + (long long)r * c;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      float y = (ld(xr[j]) - m) * rs * ld(w[j]);
      yr[j] = st<T>(RMS ? y : y + ld(b[j]));
    }
    if (threadIdx.x == 0) {
      if (!RMS && mean) mean[r] = m;
      if (rstd) rstd[r] = rs;
    }
  }
}

/* dx += rs (g - mean(g) - xhat mean(g xhat)), g = w dy (rms: without the mean(g) term) */
template <typename T, bool RMS>
__device__ __forceinline__ void norm_backward_dx(T *dx, const T *dout, const T *x, const T *w,
                                                 const float *mean, const float *rstd, int rows, int c) {
  __shared__ float sh[33];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + (long long)r * c, *dy = dout + (long long)r * c;
    float m = RMS ? 0.0f : mean[r], rs = rstd[r], sg = 0.0f, sgx = 0.0f;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      float g = ld(w[j]) * ld(dy[j]);
      sg += g;
      sgx += g * (ld(xr[j]) - m) * rs;
    }
    float gm = RMS ? 0.0f : block_reduce<false>(sg, sh) / (float)c;
    float gxm = block_reduce<false>(sgx, sh) / (float)c;
    T *dxr = dx + (long long)r * c;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      float xhat = (ld(xr[j]) - m) * rs;
      float g = ld(w[j]) * ld(dy[j]);
      dxr[j] = st<T>(ld(dxr[j]) + rs * (g - gm - xhat * gxm));
    }
  }
}

/* dw[j] += sum_r dy xhat, db[j] += sum_r dy: block (32, 32), blockIdx.x = a tile of 32 columns */
template <typename T, bool RMS>
__device__ __forceinline__ void norm_backward_dw(float *dw, float *db, const T *dout, const T *x,
                                                 const float *mean, const float *rstd, int rows, int c) {
  __shared__ float sw[32][33], sb[32][33];
  int j = blockIdx.x * 32 + threadIdx.x;
  float aw = 0.0f, ab = 0.0f;
  if (j < c)
    for (int r = threadIdx.y; r < rows; r += 32) {
      float dy = ld(dout[(long long)r * c + j]);
      float m = RMS ? 0.0f : mean[r];
      aw += dy * (ld(x[(long long)r * c + j]) - m) * rstd[r];
      ab += dy;
    }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float tw = 0.0f, tb = 0.0f;
    for (int y = 0; y < 32; y++) tw += sw[y][threadIdx.x], tb += sb[y][threadIdx.x];
    if (dw) dw[j] += tw;
    if (!RMS && db) db[j] += tb;
  }
}

#define NORM_ENTRIES(T, S)                                                                              \
  extern "C" __global__ void layernorm_forward_##S(T *out, float *mean, float *rstd, const T *x,       \
                                                   const T *w, const T *b, int rows, int c, float eps) { \
    norm_forward<T, false>(out, mean, rstd, x, w, b, rows, c, eps);                                     \
  }                                                                                                     \
  extern "C" __global__ void rmsnorm_forward_##S(T *out, float *rstd, const T *x, const T *w, int rows, \
                                                 int c, float eps) {                                    \
    norm_forward<T, true>(out, nullptr, rstd, x, w, nullptr, rows, c, eps);                             \
  }                                                                                                     \
  extern "C" __global__ void layernorm_backward_dx_##S(T *dx, const T *dout, const T *x, const T *w,    \
                                                       const float *mean, const float *rstd, int rows,  \
                                                       int c) {                                         \
    norm_backward_dx<T, false>(dx, dout, x, w, mean, rstd, rows, c);                                    \
  }                                                                                                     \
  extern "C" __global__ void rmsnorm_backward_dx_##S(T *dx, const T *dout, const T *x, const T *w,      \
                                                     const float *rstd, int rows, int c) {              \
    norm_backward_dx<T, true>(dx, dout, x, w, nullptr, rstd, rows, c);                                  \
  }                                                                                                     \
  extern "C" __global__ void layernorm_backward_dw_##S(float *dw, float *db, const T *dout, const T *x, \
                                                       const float *mean, const float *rstd, int rows,  \
                                                       int c) {                                         \
    norm_backward_dw<T, false>(dw, db, dout, x, mean, rstd, rows, c);                                   \
  }                                                                                                     \
  extern "C" __global__ void rmsnorm_backward_dw_##S(float *dw, const T *dout, const T *x,              \
                                                     const float *rstd, int rows, int c) {              \
    norm_backward_dw<T, true>(dw, nullptr, dout, x, nullptr, rstd, rows, c);                            \
  }

NORM_ENTRIES(float, f32)
NORM_ENTRIES(bf16, bf16)
NORM_ENTRIES(fp16, f16)

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

static int row_blocks(int rows) { return rows < 1 ? 1 : rows > (int)CPLAN_MAX_GRID ? (int)CPLAN_MAX_GRID : rows; }

extern "C" int cplan_cuda_layernorm_forward(CplanDtype dt, void *out, float *mean, float *rstd,
                                            const void *x, const void *w, const void *b, int rows,
                                            int c, float eps, cudaStream_t stream) {
  const char *me = "cplan_cuda_layernorm_forward";
  CPLAN_REQUIRE(me, rows >= 0 && c > 0, "bad shape [%d, %d]", rows, c);
  CPLAN_REQUIRE(me, eps >= 0, "eps %g < 0", (double)eps);
  CPLAN_REQUIRE(me, out && x && w && b, "out, x, w and b must not be NULL");
  if (rows == 0) return 0;
  int th = cplan_row_threads(c);
  if (dt == CPLAN_F32)
    layernorm_forward_f32<<<row_blocks(rows), th, 0, stream>>>((float *)out, mean, rstd, (const float *)x,
                                                              (const float *)w, (const float *)b, rows, c, eps);
  else if (dt == CPLAN_BF16)
    layernorm_forward_bf16<<<row_blocks(rows), th, 0, stream>>>((bf16 *)out, mean, rstd, (const bf16 *)x,
                                                               (const bf16 *)w, (const bf16 *)b, rows, c, eps);
  else if (dt == CPLAN_F16)
    layernorm_forward_f16<<<row_blocks(rows), th, 0, stream>>>((fp16 *)out, mean, rstd, (const fp16 *)x,
                                                               (const fp16 *)w, (const fp16 *)b, rows, c, eps);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_rmsnorm_forward(CplanDtype dt, void *out, float *rstd, const void *x,
                                          const void *w, int rows, int c, float eps, cudaStream_t stream) {
  const char *me = "cplan_cuda_rmsnorm_forward";
  CPLAN_REQUIRE(me, rows >= 0 && c > 0, "bad shape [%d, %d]", rows, c);
  CPLAN_REQUIRE(me, eps >= 0, "eps %g < 0", (double)eps);
  CPLAN_REQUIRE(me, out && x && w, "out, x and w must not be NULL");
  if (rows == 0) return 0;
  int th = cplan_row_threads(c);
  if (dt == CPLAN_F32)
    rmsnorm_forward_f32<<<row_blocks(rows), th, 0, stream>>>((float *)out, rstd, (const float *)x,
                                                            (const float *)w, rows, c, eps);
  else if (dt == CPLAN_BF16)
    rmsnorm_forward_bf16<<<row_blocks(rows), th, 0, stream>>>((bf16 *)out, rstd, (const bf16 *)x,
                                                             (const bf16 *)w, rows, c, eps);
  else if (dt == CPLAN_F16)
    rmsnorm_forward_f16<<<row_blocks(rows), th, 0, stream>>>((fp16 *)out, rstd, (const fp16 *)x,
                                                             (const fp16 *)w, rows, c, eps);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_layernorm_backward(CplanDtype dt, void *dx, float *dw, float *db, const void *dout,
                                             const void *x, const void *w, const float *mean,
                                             const float *rstd, int rows, int c, cudaStream_t stream) {
  const char *me = "cplan_cuda_layernorm_backward";
  CPLAN_REQUIRE(me, rows >= 0 && c > 0, "bad shape [%d, %d]", rows, c);
  CPLAN_REQUIRE(me, dout && x && mean && rstd, "dout, x, mean and rstd must not be NULL");
  CPLAN_REQUIRE(me, !dx || w, "dx needs w");
  CPLAN_REQUIRE(me, dt == CPLAN_F32 || dt == CPLAN_BF16 || dt == CPLAN_F16, "unknown dtype %d", (int)dt);
  if (rows == 0) return 0;
  if (dx) {
    int th = cplan_row_threads(c);
    if (dt == CPLAN_F32)
      layernorm_backward_dx_f32<<<row_blocks(rows), th, 0, stream>>>((float *)dx, (const float *)dout,
                                                                    (const float *)x, (const float *)w, mean, rstd, rows, c);
    else if (dt == CPLAN_BF16)
      layernorm_backward_dx_bf16<<<row_blocks(rows), th, 0, stream>>>((bf16 *)dx, (const bf16 *)dout,
                                                                     (const bf16 *)x, (const bf16 *)w, mean, rstd, rows, c);
    else if (dt == CPLAN_F16)
      layernorm_backward_dx_f16<<<row_blocks(rows), th, 0, stream>>>((fp16 *)dx, (const fp16 *)dout,
                                                                     (const fp16 *)x, (const fp16 *)w, mean, rstd, rows, c);
    if (cplan_cuda_launched(me)) return -1;
  }
  if (dw || db) {
    dim3 blk(32, 32);
    unsigned grid = (unsigned)((c + 31) / 32);
    if (dt == CPLAN_F32)
      layernorm_backward_dw_f32<<<grid, blk, 0, stream>>>(dw, db, (const float *)dout, (const float *)x, mean, rstd, rows, c);
    else if (dt == CPLAN_BF16)
      layernorm_backward_dw_bf16<<<grid, blk, 0, stream>>>(dw, db, (const bf16 *)dout, (const bf16 *)x, mean, rstd, rows, c);
    else if (dt == CPLAN_F16)
      layernorm_backward_dw_f16<<<grid, blk, 0, stream>>>(dw, db, (const fp16 *)dout, (const fp16 *)x, mean, rstd, rows, c);
    if (cplan_cuda_launched(me)) return -1;
  }
  return 0;
}

extern "C" int cplan_cuda_rmsnorm_backward(CplanDtype dt, void *dx, float *dw, const void *dout, const void *x,
                                           const void *w, const float *rstd, int rows, int c, cudaStream_t stream) {
  const char *me = "cplan_cuda_rmsnorm_backward";
  CPLAN_REQUIRE(me, rows >= 0 && c > 0, "bad shape [%d, %d]", rows, c);
  CPLAN_REQUIRE(me, dout && x && rstd, "dout, x and rstd must not be NULL");
  CPLAN_REQUIRE(me, !dx || w, "dx needs w");
  CPLAN_REQUIRE(me, dt == CPLAN_F32 || dt == CPLAN_BF16 || dt == CPLAN_F16, "unknown dtype %d", (int)dt);
  if (rows == 0) return 0;
  if (dx) {
    int th = cplan_row_threads(c);
    if (dt == CPLAN_F32)
      rmsnorm_backward_dx_f32<<<row_blocks(rows), th, 0, stream>>>((float *)dx, (const float *)dout,
                                                                  (const float *)x, (const float *)w, rstd, rows, c);
    else if (dt == CPLAN_BF16)
      rmsnorm_backward_dx_bf16<<<row_blocks(rows), th, 0, stream>>>((bf16 *)dx, (const bf16 *)dout,
                                                                   (const bf16 *)x, (const bf16 *)w, rstd, rows, c);
    else if (dt == CPLAN_F16)
      rmsnorm_backward_dx_f16<<<row_blocks(rows), th, 0, stream>>>((fp16 *)dx, (const fp16 *)dout,
                                                                   (const fp16 *)x, (const fp16 *)w, rstd, rows, c);
    if (cplan_cuda_launched(me)) return -1;
  }
  if (dw) {
    dim3 blk(32, 32);
    unsigned grid = (unsigned)((c + 31) / 32);
    if (dt == CPLAN_F32)
      rmsnorm_backward_dw_f32<<<grid, blk, 0, stream>>>(dw, (const float *)dout, (const float *)x, rstd, rows, c);
    else if (dt == CPLAN_BF16)
      rmsnorm_backward_dw_bf16<<<grid, blk, 0, stream>>>(dw, (const bf16 *)dout, (const bf16 *)x, rstd, rows, c);
    else if (dt == CPLAN_F16)
      rmsnorm_backward_dw_f16<<<grid, blk, 0, stream>>>(dw, (const fp16 *)dout, (const fp16 *)x, rstd, rows, c);
    if (cplan_cuda_launched(me)) return -1;
  }
  return 0;
}
#endif
