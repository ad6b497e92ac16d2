/* global_norm.cu: the global gradient norm over a list of tensors, and the clipping factor
 * (kernels_cuda.h; reference k_global_norm in kernels/cpu/ref_extra.c). Deterministic:
 *  - norm_partials: block b sums the squares of one fixed chunk of one tensor in f64 (a fixed
 *    block size, a fixed reduction tree) into work[b];
 *  - norm_finish: one block adds work[0..nparts) up in f64, writes sqrt as f32 and
 *    min(1, clip / (norm + 1e-6)) as optimizer.c's clip_grads does.
 * The chunk layout depends only on the tensor sizes, so the sum is the same on every run. */
#include "cuda_common.h"

#define NORM_MT 32
#define NORM_CHUNK 16384

struct NormList {
  const void *x[NORM_MT];
  long long n[NORM_MT];
  int bf16[NORM_MT];
  int chunk0[NORM_MT + 1];
  int count;
};

extern "C" __global__ void norm_partials(NormList L, double *work) {
  __shared__ double sh[33];
  int b = blockIdx.x, k = 0;
  while (k + 1 < L.count && L.chunk0[k + 1] <= b) k++;
  long long start = (long long)(b - L.chunk0[k]) * NORM_CHUNK;
  long long end = min(start + NORM_CHUNK, L.n[k]);
  double s = 0.0;
  for (long long i = start + threadIdx.x; i < end; i += blockDim.x) {
    float x = L.bf16[k] ? ld(((const bf16 *)L.x[k])[i]) : ((const float *)L.x[k])[i];
    s += (double)x * x;
  }
  s = block_sum_f64(s, sh);
  if (threadIdx.x == 0) work[b] = s;
}

extern "C" __global__ void norm_finish(float *norm, float *clip_scale, const double *work, long long nparts,
                                       float clip) {
  __shared__ double sh[33];
  double s = 0.0;
  for (long long i = threadIdx.x; i < nparts; i += blockDim.x) s += work[i];
  s = block_sum_f64(s, sh);
  if (threadIdx.x == 0) {
    float nv = (float)sqrt(s);
    *norm = nv;
    if (clip_scale) *clip_scale = clip > 0.0f ? fminf(1.0f, clip / (nv + 1e-6f)) : 1.0f;
  }
}

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

extern "C" size_t cplan_cuda_global_norm_work(const CplanNormTensor *ts, int count) {
  size_t parts = 0;
  for (int k = 0; k < count; k++)
    if (ts[k].n > 0) parts += (size_t)((ts[k].n + NORM_CHUNK - 1) / NORM_CHUNK);
  return parts;
}

extern "C" int cplan_cuda_global_norm(float *norm, float *clip_scale, const CplanNormTensor *ts, int count, float clip,
                                      double *work, size_t work_len, cudaStream_t stream) {
  const char *me = "cplan_cuda_global_norm";
  CPLAN_REQUIRE(me, norm && count >= 0 && (count == 0 || ts), "bad arguments");
  size_t need = count ? cplan_cuda_global_norm_work(ts, count) : 0;
  CPLAN_REQUIRE(me, work_len >= need && (need == 0 || work), "work holds %zu doubles, %zu needed", work_len, need);
  long long done = 0; /* parts written so far: each launch writes after the previous ones */
  for (int k0 = 0; k0 < count; k0 += NORM_MT) {
    NormList L;
    memset(&L, 0, sizeof L);
    long long chunks = 0;
    for (int k = k0; k < count && k < k0 + NORM_MT; k++) {
      CPLAN_REQUIRE(me, ts[k].n >= 0 && (ts[k].n == 0 || ts[k].x), "tensor %d: bad size or NULL", k);
      CPLAN_REQUIRE(me, ts[k].dt == CPLAN_F32 || ts[k].dt == CPLAN_BF16, "tensor %d: unknown dtype", k);
      if (ts[k].n == 0) continue;
      int j = L.count++;
      L.x[j] = ts[k].x, L.n[j] = ts[k].n, L.bf16[j] = ts[k].dt == CPLAN_BF16, L.chunk0[j] = (int)chunks;
      chunks += (ts[k].n + NORM_CHUNK - 1) / NORM_CHUNK;
    }
    if (L.count == 0) continue;
    L.chunk0[L.count] = (int)chunks;
    norm_partials<<<(unsigned)chunks, 256, 0, stream>>>(L, work + done);
    if (cplan_cuda_launched(me)) return -1;
    done += chunks;
  }
  norm_finish<<<1, 1024, 0, stream>>>(norm, clip_scale, work, done, clip);
  return cplan_cuda_launched(me);
}
#endif
