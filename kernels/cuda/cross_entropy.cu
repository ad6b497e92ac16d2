/* cross_entropy.cu: fused softmax + cross-entropy, forward and backward (kernels_cuda.h;
 * reference k_cross_entropy_* in kernels/cpu/ref.c). The [rows, v] softmax is never stored:
 *  - forward: one block per row computes max and sum exp in f32 in one pass over the row (an
 *    online softmax: a running max per thread), saves lse = max + log sum and
 *    the row's loss lse - logit[target]; then one block adds the losses up in f64, in a fixed
 *    order, into the mean over the counted rows and the count;
 *  - backward: one block per row adds (dloss / count) (exp(logit - lse) - onehot) to dlogits (or,
 *    with accumulate 0, writes it, and zeros on ignored rows);
 *  - fused (llm.c's fused classifier): the count first (one block), then one block per row computes
 *    the row's lse and loss as the forward does and overwrites the row with its gradient as the
 *    backward writes it (the row is read again from cache, not memory), then the mean: the logits
 *    are read once in the step, and their gradient needs no buffer of its own.
 * dloss and count are device scalars, so a step needs no host sync between the two. Rows are pitch
 * elements apart (pitch >= v: a row pitch, the logits of an odd vocab padded for cuBLASLt). */
#include "cuda_common.h"

/* the log-sum-exp of row x [v], in every thread of the block: one pass over the row (it is read
 * once from memory, not twice): each thread keeps a running max mt and the sum st of exp(x - mt),
 * rescaled when mt grows; then the block's max m and the sum of the threads' st exp(mt - m) */
/* P > 1: the row's first v / P * P elements P at a time (16-byte loads: the row 16-byte aligned), the
 * rest one at a time; each P rescale the running sum once, to the max of the sum's and theirs */
template <typename T, int P> __device__ __forceinline__ float ce_row_lse(const T *x, int v, float *sh) {
  float mt = -CPLAN_INF, st = 0.0f;
  const int vend = P > 1 ? v / P * P : 0;
  for (int j = threadIdx.x * P; j < vend; j += blockDim.x * P) {
    float xv[P], mx = mt;
    ldv<T, P>(xv, x + j);
#pragma unroll
    for (int u = 0; u < P; u++) mx = fmaxf(mx, xv[u]);
    if (mx == -CPLAN_INF) continue; /* all -inf so far: nothing to add */
    float add = 0.0f;
#pragma unroll
    for (int u = 0; u < P; u++) add += expf(xv[u] - mx);
    st = st * expf(mt - mx) + add, mt = mx; /* exp(-inf) = 0 on the first */
  }
  for (int j = vend + threadIdx.x; j < v; j += blockDim.x) {
    float xj = ld(x[j]);
    if (xj > mt) st = st * expf(mt - xj) + 1.0f, mt = xj; /* exp(-inf) = 0 on the first */
    else st += expf(xj - mt);
  }
  float m = block_reduce<true>(mt, sh);
  float s = block_reduce<false>(mt == -CPLAN_INF ? 0.0f : st * expf(mt - m), sh);
  return m + logf(s);
}

/* thread 0: row r's lse and loss (0 for an ignored row, NaN for a target outside [-1, v)) */
template <typename T>
__device__ __forceinline__ void ce_row_loss(float *losses, float *lse, const T *x, int tg, int r, int v, float l) {
  if (threadIdx.x == 0) {
    lse[r] = l;
    losses[r] = tg == -1 ? 0.0f : tg >= 0 && tg < v ? l - ld(x[tg]) : CPLAN_NAN;
  }
}

template <typename T, int P>
__device__ __forceinline__ void ce_rows(float *losses, float *lse, const T *logits, const int *targets, int rows,
                                        int v, int pitch) {
  __shared__ float sh[33];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *x = logits + (long long)r * pitch;
    ce_row_loss(losses, lse, x, targets[r], r, v, ce_row_lse<T, P>(x, v, sh));
  }
}

/* row x [v]'s gradient g (exp(x - l) - onehot(tg)) written over dx (acc: added to it); dx may be x
 * itself: each element is read before it is written, by the same thread. P as ce_row_lse */
template <typename T, int P>
__device__ __forceinline__ void ce_row_grad(T *dx, const T *x, float l, float g, int tg, int v, int acc) {
  const int vend = P > 1 ? v / P * P : 0;
  for (int j = threadIdx.x * P; j < vend; j += blockDim.x * P) {
    float xv[P], o[P] = {};
    ldv<T, P>(xv, x + j);
    if (acc) ldv<T, P>(o, dx + j);
#pragma unroll
    for (int u = 0; u < P; u++) o[u] += g * (expf(xv[u] - l) - (j + u == tg ? 1.0f : 0.0f));
    stv<T, P>(dx + j, o);
  }
  for (int j = vend + threadIdx.x; j < v; j += blockDim.x)
    dx[j] = st<T>((acc ? ld(dx[j]) : 0.0f) + g * (expf(ld(x[j]) - l) - (j == tg ? 1.0f : 0.0f)));
}

/* zeros over row dx [v] */
template <typename T, int P> __device__ __forceinline__ void ce_row_zero(T *dx, int v) {
  const int vend = P > 1 ? v / P * P : 0;
  const float z[P] = {};
  for (int j = threadIdx.x * P; j < vend; j += blockDim.x * P) stv<T, P>(dx + j, z);
  for (int j = vend + threadIdx.x; j < v; j += blockDim.x) dx[j] = st<T>(0.0f);
}

/* the forward, then each row overwritten by its gradient as ce_bwd writes it (count: computed
 * before, by ce_count) */
template <typename T, int P>
__device__ __forceinline__ void ce_fused(float *losses, float *lse, T *logits, const int *targets, const float *dloss,
                                         const int *count, int rows, int v, int pitch) {
  __shared__ float sh[33];
  float g = *count > 0 ? *dloss / (float)*count : 0.0f;
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    T *x = logits + (long long)r * pitch;
    int tg = targets[r];
    float l = ce_row_lse<T, P>(x, v, sh);
    ce_row_loss(losses, lse, x, tg, r, v, l);
    __syncthreads(); /* thread 0 read x[tg]: only now may the row be overwritten */
    if (tg == -1 || *count <= 0) ce_row_zero<T, P>(x, v); /* an ignored row gets no gradient at all */
    else ce_row_grad<T, P>(x, x, l, g, tg, v, 0);
  }
}

/* one block: *count = the rows with a target other than -1 */
__device__ __forceinline__ void ce_count(int *count, const int *targets, int rows) {
  __shared__ double sh[33];
  double c = 0.0;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) c += targets[r] != -1;
  c = block_sum_f64(c, sh);
  if (threadIdx.x == 0) *count = (int)c;
}

/* one block: *loss = sum(losses) / count, *count = rows with a target other than -1 */
__device__ __forceinline__ void ce_mean(float *loss, int *count, const float *losses, const int *targets, int rows) {
  __shared__ double sh[33];
  double s = 0.0, c = 0.0;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    s += losses[r];
    c += targets[r] != -1;
  }
  s = block_sum_f64(s, sh);
  c = block_sum_f64(c, sh);
  if (threadIdx.x == 0) {
    *count = (int)c;
    *loss = c > 0 ? (float)(s / c) : 0.0f;
  }
}

/* acc 1: dlogits +=; acc 0: dlogits = (its old values never read; ignored rows get zeros) */
template <typename T, int P>
__device__ __forceinline__ void ce_bwd(T *dlogits, const float *dloss, const int *count, const T *logits,
                                       const float *lse, const int *targets, int rows, int v, int pitch, int acc) {
  if (*count <= 0 && acc) return;
  float g = *count > 0 ? *dloss / (float)*count : 0.0f;
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    int tg = targets[r];
    T *dx = dlogits + (long long)r * pitch;
    if (tg == -1 || *count <= 0) { /* an ignored row gets no gradient at all */
      if (!acc) ce_row_zero<T, P>(dx, v);
      continue;
    }
    ce_row_grad<T, P>(dx, logits + (long long)r * pitch, lse[r], g, tg, v, acc);
  }
}

/* vec: P = VecW<T>::P elements a load (every row 16-byte aligned: the launchers check), else 1 */
#define CE_ENTRIES(T, S)                                                                                   \
  extern "C" __global__ void cross_entropy_forward_##S(float *losses, float *lse, const T *logits,         \
                                                       const int *targets, int rows, int v, int pitch,     \
                                                       int vec) {                                          \
    if (vec) ce_rows<T, VecW<T>::P>(losses, lse, logits, targets, rows, v, pitch);                         \
    else ce_rows<T, 1>(losses, lse, logits, targets, rows, v, pitch);                                      \
  }                                                                                                        \
  extern "C" __global__ void cross_entropy_backward_##S(T *dlogits, const float *dloss, const int *count,  \
                                                        const T *logits, const float *lse,                 \
                                                        const int *targets, int rows, int v, int pitch,    \
                                                        int acc, int vec) {                                \
    if (vec) ce_bwd<T, VecW<T>::P>(dlogits, dloss, count, logits, lse, targets, rows, v, pitch, acc);      \
    else ce_bwd<T, 1>(dlogits, dloss, count, logits, lse, targets, rows, v, pitch, acc);                   \
  }                                                                                                        \
  extern "C" __global__ void cross_entropy_fused_##S(float *losses, float *lse, T *logits, const int *targets, \
                                                     const float *dloss, const int *count, int rows, int v,   \
                                                     int pitch, int vec) {                                \
    if (vec) ce_fused<T, VecW<T>::P>(losses, lse, logits, targets, dloss, count, rows, v, pitch);          \
    else ce_fused<T, 1>(losses, lse, logits, targets, dloss, count, rows, v, pitch);                       \
  }

CE_ENTRIES(float, f32)
CE_ENTRIES(bf16, bf16)
CE_ENTRIES(fp16, f16)

extern "C" __global__ void cross_entropy_count(int *count, const int *targets, int rows) {
  ce_count(count, targets, rows);
}

extern "C" __global__ void cross_entropy_mean(float *loss, int *count, const float *losses, const int *targets,
                                              int rows) {
  ce_mean(loss, count, losses, targets, rows);
}

/* *out = *in * w (w when in is NULL): a cross_entropy's loss, or its gradient, times its weight
 * (RtRun.ce_weight), or the weight itself */
extern "C" __global__ void cross_entropy_scale(float *out, const float *in, float w) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *out = in ? *in * w : w;
}

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

#include <stdint.h>

/* 16-byte loads: the row pitch a multiple of VecW<T>::P elements and the rows' base (bases) 16-byte
 * aligned */
static int ce_vec(CplanDtype dt, int pitch, const void *a, const void *b) {
  const int p = dt == CPLAN_F32 ? 4 : 8;
  return pitch % p == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0;
}

extern "C" int cplan_cuda_cross_entropy_forward_ld(CplanDtype dt, float *losses, float *lse, float *loss, int *count,
                                                   const void *logits, const int32_t *targets, int rows, int v, int ld,
                                                   cudaStream_t stream) {
  const char *me = "cplan_cuda_cross_entropy_forward";
  CPLAN_REQUIRE(me, rows >= 0 && v > 0 && ld >= v, "bad shape [%d, %d] (row pitch %d)", rows, v, ld);
  CPLAN_REQUIRE(me, losses && lse && loss && count && logits && targets,
                "losses, lse, loss, count, logits and targets must not be NULL");
  unsigned grid = rows < 1 ? 1 : rows > (int)CPLAN_MAX_GRID ? CPLAN_MAX_GRID : (unsigned)rows;
  int th = cplan_row_threads(v), vec = ce_vec(dt, ld, logits, NULL);
  if (rows > 0) {
    if (dt == CPLAN_F32)
      cross_entropy_forward_f32<<<grid, th, 0, stream>>>(losses, lse, (const float *)logits, targets, rows, v, ld, vec);
    else if (dt == CPLAN_BF16)
      cross_entropy_forward_bf16<<<grid, th, 0, stream>>>(losses, lse, (const bf16 *)logits, targets, rows, v, ld, vec);
    else if (dt == CPLAN_F16)
      cross_entropy_forward_f16<<<grid, th, 0, stream>>>(losses, lse, (const fp16 *)logits, targets, rows, v, ld, vec);
    else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
    if (cplan_cuda_launched(me)) return -1;
  }
  cross_entropy_mean<<<1, 1024, 0, stream>>>(loss, count, losses, targets, rows);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_cross_entropy_forward(CplanDtype dt, float *losses, float *lse, float *loss, int *count,
                                                const void *logits, const int32_t *targets, int rows, int v,
                                                cudaStream_t stream) {
  return cplan_cuda_cross_entropy_forward_ld(dt, losses, lse, loss, count, logits, targets, rows, v, v, stream);
}

extern "C" int cplan_cuda_cross_entropy_fused_ld(CplanDtype dt, float *losses, float *lse, float *loss, int *count,
                                                 void *logits, const int32_t *targets, const float *dloss, int rows,
                                                 int v, int ld, cudaStream_t stream) {
  const char *me = "cplan_cuda_cross_entropy_fused";
  CPLAN_REQUIRE(me, rows >= 0 && v > 0 && ld >= v, "bad shape [%d, %d] (row pitch %d)", rows, v, ld);
  CPLAN_REQUIRE(me, losses && lse && loss && count && logits && targets && dloss,
                "losses, lse, loss, count, logits, targets and dloss must not be NULL");
  cross_entropy_count<<<1, 1024, 0, stream>>>(count, targets, rows);
  if (cplan_cuda_launched(me)) return -1;
  unsigned grid = rows < 1 ? 1 : rows > (int)CPLAN_MAX_GRID ? CPLAN_MAX_GRID : (unsigned)rows;
  int th = cplan_row_threads(v), vec = ce_vec(dt, ld, logits, NULL);
  if (rows > 0) {
    if (dt == CPLAN_F32)
      cross_entropy_fused_f32<<<grid, th, 0, stream>>>(losses, lse, (float *)logits, targets, dloss, count, rows, v, ld,
                                                        vec);
    else if (dt == CPLAN_BF16)
      cross_entropy_fused_bf16<<<grid, th, 0, stream>>>(losses, lse, (bf16 *)logits, targets, dloss, count, rows, v, ld,
                                                        vec);
    else if (dt == CPLAN_F16)
      cross_entropy_fused_f16<<<grid, th, 0, stream>>>(losses, lse, (fp16 *)logits, targets, dloss, count, rows, v, ld,
                                                        vec);
    else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
    if (cplan_cuda_launched(me)) return -1;
  }
  cross_entropy_mean<<<1, 1024, 0, stream>>>(loss, count, losses, targets, rows);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_cross_entropy_backward_ld(CplanDtype dt, void *dlogits, const float *dloss, const int *count,
                                                    const void *logits, const float *lse, const int32_t *targets,
                                                    int rows, int v, int ld, int accumulate, cudaStream_t stream) {
  const char *me = "cplan_cuda_cross_entropy_backward";
  CPLAN_REQUIRE(me, rows >= 0 && v > 0 && ld >= v, "bad shape [%d, %d] (row pitch %d)", rows, v, ld);
  CPLAN_REQUIRE(me, dlogits && dloss && count && logits && lse && targets,
                "dlogits, dloss, count, logits, lse and targets must not be NULL");
  if (rows == 0) return 0;
  unsigned grid = rows > (int)CPLAN_MAX_GRID ? CPLAN_MAX_GRID : (unsigned)rows;
  int th = cplan_row_threads(v), acc = accumulate != 0, vec = ce_vec(dt, ld, logits, dlogits);
  if (dt == CPLAN_F32)
    cross_entropy_backward_f32<<<grid, th, 0, stream>>>((float *)dlogits, dloss, count, (const float *)logits, lse,
                                                        targets, rows, v, ld, acc, vec);
  else if (dt == CPLAN_BF16)
    cross_entropy_backward_bf16<<<grid, th, 0, stream>>>((bf16 *)dlogits, dloss, count, (const bf16 *)logits, lse,
                                                         targets, rows, v, ld, acc, vec);
  else if (dt == CPLAN_F16)
    cross_entropy_backward_f16<<<grid, th, 0, stream>>>((fp16 *)dlogits, dloss, count, (const fp16 *)logits, lse,
                                                         targets, rows, v, ld, acc, vec);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_cross_entropy_scale(float *out, const float *in, float w, cudaStream_t stream) {
  const char *me = "cplan_cuda_cross_entropy_scale";
  CPLAN_REQUIRE(me, out, "out must not be NULL");
  cross_entropy_scale<<<1, 32, 0, stream>>>(out, in, w);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_cross_entropy_backward(CplanDtype dt, void *dlogits, const float *dloss, const int *count,
                                                 const void *logits, const float *lse, const int32_t *targets,
                                                 int rows, int v, cudaStream_t stream) {
  return cplan_cuda_cross_entropy_backward_ld(dt, dlogits, dloss, count, logits, lse, targets, rows, v, v, 1, stream);
}
#endif
