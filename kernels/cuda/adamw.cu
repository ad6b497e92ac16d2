/* adamw.cu: AdamW on f32 master weights, fused and multi-tensor (kernels_cuda.h; reference
 * k_adamw_update in kernels/cpu/ref_extra.c, the formula of compiler/optimizer.c):
 *     g = grad * scale;  p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 *     p -= (lr / bc1) * (m / (sqrt(v) / sqrt(bc2) + eps))
 * One launch updates up to ADAMW_MT tensors: the kernel argument is the tensor list itself (a
 * struct well under the 4 KiB parameter limit), with the prefix sums of each tensor's chunks,
 * and block b finds its tensor by a scan of those. Each element is read and written once:
 * grad, p, m, v in, p, m, v (and the bf16 copy) out. */
#include "cuda_common.h"

#define ADAMW_MT 32
#define ADAMW_CHUNK 4096 /* elements per block */

struct AdamwList {
  float *p[ADAMW_MT];
  void *plp[ADAMW_MT];     /* bf16 copy or NULL */
  const void *g[ADAMW_MT];
  float *m[ADAMW_MT], *v[ADAMW_MT];
  long long n[ADAMW_MT];
  float wd[ADAMW_MT];
  int g_bf16[ADAMW_MT];
  int chunk0[ADAMW_MT + 1]; /* block b works on tensor k with chunk0[k] <= b < chunk0[k + 1] */
  int count;
};

struct AdamwScalars {
  float lr, b1, one_b1, b2, one_b2, eps, bc1, bc2;
};

extern "C" __global__ void adamw_multi(AdamwList L, AdamwScalars h, const float *grad_scale) {
  int b = blockIdx.x, k = 0;
  while (k + 1 < L.count && L.chunk0[k + 1] <= b) k++;
  long long start = (long long)(b - L.chunk0[k]) * ADAMW_CHUNK;
  long long end = min(start + ADAMW_CHUNK, L.n[k]);
  float scale = grad_scale ? *grad_scale : 1.0f;
  float decay = 1.0f - h.lr * L.wd[k], step = h.lr / h.bc1, sbc2 = sqrtf(h.bc2);
  float *p = L.p[k], *m = L.m[k], *v = L.v[k];
  bf16 *plp = (bf16 *)L.plp[k];
  for (long long i = start + threadIdx.x; i < end; i += blockDim.x) {
    float g = L.g_bf16[k] ? ld(((const bf16 *)L.g[k])[i]) : ((const float *)L.g[k])[i];
    g *= scale;
    float w = p[i];
    if (L.wd[k] != 0.0f) w *= decay;
    float mi = m[i] * h.b1 + g * h.one_b1;
    float vi = v[i] * h.b2 + (g * g) * h.one_b2;
    float denom = sqrtf(vi) / sbc2 + h.eps;
    w = w - step * (mi / denom);
    p[i] = w;
    m[i] = mi;
    v[i] = vi;
    if (plp) plp[i] = st<bf16>(w);
  }
}

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

extern "C" int cplan_cuda_adamw_multi(const CplanAdamwTensor *ts, int count, const CplanAdamwHyper *h,
                                      const float *grad_scale, cudaStream_t stream) {
  const char *me = "cplan_cuda_adamw_multi";
  CPLAN_REQUIRE(me, count >= 0 && (count == 0 || ts) && h, "bad tensor list");
  CPLAN_REQUIRE(me, h->lr >= 0 && h->beta1 >= 0 && h->beta1 < 1 && h->beta2 >= 0 && h->beta2 < 1 && h->eps >= 0,
                "bad hyperparameters lr %g beta1 %g beta2 %g eps %g", (double)h->lr, (double)h->beta1,
                (double)h->beta2, (double)h->eps);
  CPLAN_REQUIRE(me, h->bc1 > 0 && h->bc1 <= 1 && h->bc2 > 0 && h->bc2 <= 1,
                "bias corrections bc1 %g, bc2 %g must be in (0, 1]", (double)h->bc1, (double)h->bc2);
  AdamwScalars s = {h->lr, h->beta1, (float)(1.0 - (double)h->beta1), h->beta2, (float)(1.0 - (double)h->beta2),
                    h->eps, h->bc1, h->bc2};
  for (int k0 = 0; k0 < count; k0 += ADAMW_MT) {
    AdamwList L;
    memset(&L, 0, sizeof L);
    long long chunks = 0;
    for (int k = k0; k < count && k < k0 + ADAMW_MT; k++) {
      const CplanAdamwTensor *t = &ts[k];
      CPLAN_REQUIRE(me, t->n >= 0, "tensor %d: negative size", k);
      CPLAN_REQUIRE(me, t->n == 0 || (t->param && t->grad && t->m && t->v), "tensor %d: a NULL pointer", k);
      CPLAN_REQUIRE(me, t->grad_dt == CPLAN_F32 || t->grad_dt == CPLAN_BF16, "tensor %d: unknown grad dtype", k);
      if (t->n == 0) continue;
      int j = L.count++;
      L.p[j] = t->param, L.plp[j] = t->param_lp, L.g[j] = t->grad, L.m[j] = t->m, L.v[j] = t->v;
      L.n[j] = t->n, L.wd[j] = t->weight_decay, L.g_bf16[j] = t->grad_dt == CPLAN_BF16;
      L.chunk0[j] = (int)chunks;
      chunks += (t->n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
      CPLAN_REQUIRE(me, chunks < 0x7fffffffLL, "tensor %d: too many elements in one launch", k);
    }
    if (L.count == 0) continue;
    L.chunk0[L.count] = (int)chunks;
    adamw_multi<<<(unsigned)chunks, 256, 0, stream>>>(L, s, grad_scale);
    if (cplan_cuda_launched(me)) return -1;
  }
  return 0;
}

extern "C" int cplan_cuda_adamw(const CplanAdamwTensor *t, const CplanAdamwHyper *h, const float *grad_scale,
                                cudaStream_t stream) {
  if (!t) return cplan_cuda_fail("cplan_cuda_adamw", "NULL tensor");
  return cplan_cuda_adamw_multi(t, 1, h, grad_scale, stream);
}
#endif
