/* vocab_parallel.cu: the vocab-parallel embedding, cross entropy and argmax of tensor parallelism
 * (kernels_cuda.h; reference kvp_* in kernels/cpu/vocab_parallel.c, whose header describes the
 * collectives the plan runs between the kernels). A rank holds vocabulary rows [v0, v0 + vl) of
 * the global vocabulary v; the kernels never communicate.
 *  - the embedding's part is embedding.cu's (vp_embedding_*: the same kernels on a range of rows);
 *  - row max and row sum of exp: one block per row (grid-stride over rows), a block reduction;
 *  - max combine: a thread per row over the n gathered maxima;
 *  - forward part: one block adds the rows' parts up in f64 in a fixed order (deterministic);
 *  - backward: one block per row adds (dloss / count) (softmax - onehot) to its columns;
 *  - argmax: one block per row, a block max of the non-NaN values (fmaxf skips NaN), then a block
 *    max of -j over the columns j holding it (the first one); a thread per row picks the rank.
 * Targets and indices outside their ranges give NaN (loss, embedding row) rather than reading out
 * of bounds, as cross_entropy.cu and embedding.cu do; the CPU reference asserts instead. */
#include "cuda_common.h"


template <typename T>
__device__ __forceinline__ void vp_row_max(float *m, const T *logits, int rows, int vl) {
  __shared__ float sh[33];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *x = logits + (long long)r * vl;
    float a = -CPLAN_INF;
    for (int j = threadIdx.x; j < vl; j += blockDim.x) a = fmaxf(a, ld(x[j]));
    a = block_reduce<true>(a, sh);
    if (threadIdx.x == 0) m[r] = a;
  }
}

__device__ __forceinline__ void vp_max_combine(float *m, const float *gathered, int rows, int n) {
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x) {
    float a = gathered[r];
    for (int k = 1; k < n; k++) a = fmaxf(a, gathered[(long long)k * rows + r]);
    m[r] = a;
  }
}

template <typename T>
__device__ __forceinline__ void vp_row_sumexp(float *s, const T *logits, const float *m, int rows, int vl) {
  __shared__ float sh[33];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *x = logits + (long long)r * vl;
    float mr = m[r], a = 0.0f;
    for (int j = threadIdx.x; j < vl; j += blockDim.x) a += expf(ld(x[j]) - mr);
    a = block_reduce<false>(a, sh);
    if (threadIdx.x == 0) s[r] = a;
  }
}

/* one block: *loss = (sum over counted rows of [lead] (m + log s) - [mine] logit[target]) / count */
template <typename T>
__device__ __forceinline__ void vp_ce_part(float *loss, int *count, const T *logits, const float *m, const float *s,
                                           const int *targets, int rows, int vl, int v0, int v, int lead) {
  __shared__ double sh[33];
  double l = 0.0, c = 0.0;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    int tg = targets[r];
    if (tg == -1) continue;
    c += 1.0;
    if (tg < 0 || tg >= v) { /* out of range: a NaN loss, as cross_entropy.cu */
      l += (double)CPLAN_NAN;
      continue;
    }
    if (lead) l += (double)m[r] + log((double)s[r]);
    if (tg >= v0 && tg - v0 < vl) l -= (double)ld(logits[(long long)r * vl + (tg - v0)]);
  }
  l = block_sum_f64(l, sh);
  c = block_sum_f64(c, sh);
  if (threadIdx.x == 0) {
    if (count) *count = (int)c;
    *loss = c > 0 ? (float)(l / c) : 0.0f;
  }
}

template <typename T>
__device__ __forceinline__ void vp_ce_bwd(T *dlogits, const float *dloss, const int *count, const T *logits,
                                          const float *m, const float *s, const int *targets, int rows, int vl,
                                          int v0) {
  if (*count <= 0) return; /* no counted row: no gradient */
  float g = *dloss / (float)*count;
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    int tg = targets[r];
    if (tg == -1) continue; /* an ignored row gets no gradient at all */
    int t = tg >= v0 && tg - v0 < vl ? tg - v0 : -1; /* the target's local column, if this rank's */
    const T *x = logits + (long long)r * vl;
    T *dx = dlogits + (long long)r * vl;
    float mr = m[r], ls = logf(s[r]);
    for (int j = threadIdx.x; j < vl; j += blockDim.x) {
      float p = expf(ld(x[j]) - mr - ls);
      dx[j] = st<T>(ld(dx[j]) + g * (p - (j == t ? 1.0f : 0.0f)));
    }
  }
}

/* pair[r], pair[rows + r] = this rank's row max and the global index of its first occurrence
 * (kvp_argmax_local: NaN skipped, except a NaN at global index 0, which wins) */
template <typename T>
__device__ __forceinline__ void vp_argmax_local(float *pair, const T *logits, int rows, int vl, int v0) {
  __shared__ float sh[33];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *x = logits + (long long)r * vl;
    float a = -CPLAN_INF;
    for (int j = threadIdx.x; j < vl; j += blockDim.x) a = fmaxf(a, ld(x[j]));
    float m = block_reduce<true>(a, sh), b = -CPLAN_INF;
    for (int j = threadIdx.x; j < vl; j += blockDim.x)
      if (ld(x[j]) == m) {
        b = -(float)j; /* this thread's first */
        break;
      }
    b = block_reduce<true>(b, sh);
    if (threadIdx.x == 0) {
      float x0 = ld(x[0]);
      bool nan0 = v0 == 0 && x0 != x0;
      pair[r] = nan0 ? x0 : m;
      pair[rows + r] = (float)v0 + (nan0 || b == -CPLAN_INF ? 0.0f : -b);
    }
  }
}

__device__ __forceinline__ void vp_argmax_pick(int *out, const float *gathered, int rows, int n) {
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x) {
    int best = 0; /* a later rank wins only with a strictly greater maximum (NaN never does) */
    for (int k = 1; k < n; k++)
      if (gathered[2LL * k * rows + r] > gathered[2LL * best * rows + r]) best = k;
    out[r] = (int)gathered[2LL * best * rows + rows + r];
  }
}

#define VP_ENTRIES(T, S)                                                                                   \
  extern "C" __global__ void vp_ce_row_max_##S(float *m, const T *logits, int rows, int vl) {              \
    vp_row_max<T>(m, logits, rows, vl);                                                                    \
  }                                                                                                        \
  extern "C" __global__ void vp_ce_row_sumexp_##S(float *s, const T *logits, const float *m, int rows,     \
                                                  int vl) {                                                \
    vp_row_sumexp<T>(s, logits, m, rows, vl);                                                              \
  }                                                                                                        \
  extern "C" __global__ void vp_ce_forward_part_##S(float *loss, int *count, const T *logits, const float *m, \
                                                    const float *s, const int *targets, int rows, int vl,  \
                                                    int v0, int v, int lead) {                             \
    vp_ce_part<T>(loss, count, logits, m, s, targets, rows, vl, v0, v, lead);                              \
  }                                                                                                        \
  extern "C" __global__ void vp_ce_backward_##S(T *dlogits, const float *dloss, const int *count,          \
                                                const T *logits, const float *m, const float *s,           \
                                                const int *targets, int rows, int vl, int v0) {            \
    vp_ce_bwd<T>(dlogits, dloss, count, logits, m, s, targets, rows, vl, v0);                              \
  }                                                                                                        \
  extern "C" __global__ void vp_argmax_local_##S(float *pair, const T *logits, int rows, int vl, int v0) {   \
    vp_argmax_local<T>(pair, logits, rows, vl, v0);                                                        \
  }

VP_ENTRIES(float, f32)
VP_ENTRIES(bf16, bf16)
VP_ENTRIES(fp16, f16)

extern "C" __global__ void vp_ce_max_combine(float *m, const float *gathered, int rows, int n) {
  vp_max_combine(m, gathered, rows, n);
}

extern "C" __global__ void vp_argmax_combine(int *out, const float *gathered, int rows, int n) {
  vp_argmax_pick(out, gathered, rows, n);
}

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

/* rows [v0, v0 + vl) of a vocabulary of v, with vl > 0 */
static int vp_range_ok(int v0, int vl, int v) { return vl > 0 && v0 >= 0 && v > 0; } /* rows past v: a padded table's */

/* one block per row, at most CPLAN_MAX_GRID (the kernels stride over the rest) */
static unsigned vp_row_grid(int rows) {
  return rows < 1 ? 1u : rows > (int)CPLAN_MAX_GRID ? CPLAN_MAX_GRID : (unsigned)rows;
}

extern "C" int cplan_cuda_vp_ce_row_max(CplanDtype dt, float *m, const void *logits, int rows, int vl,
                                        cudaStream_t stream) {
  const char *me = "cplan_cuda_vp_ce_row_max";
  CPLAN_REQUIRE(me, rows >= 0 && vl > 0, "bad shape [%d, %d]", rows, vl);
  CPLAN_REQUIRE(me, rows == 0 || (m && logits), "m and logits must not be NULL");
  if (rows == 0) return 0;
  unsigned grid = vp_row_grid(rows);
  int th = cplan_row_threads(vl);
  if (dt == CPLAN_F32) vp_ce_row_max_f32<<<grid, th, 0, stream>>>(m, (const float *)logits, rows, vl);
  else if (dt == CPLAN_BF16) vp_ce_row_max_bf16<<<grid, th, 0, stream>>>(m, (const bf16 *)logits, rows, vl);
  else if (dt == CPLAN_F16) vp_ce_row_max_f16<<<grid, th, 0, stream>>>(m, (const fp16 *)logits, rows, vl);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_vp_ce_max_combine(float *m, const float *gathered, int rows, int n, cudaStream_t stream) {
  const char *me = "cplan_cuda_vp_ce_max_combine";
  CPLAN_REQUIRE(me, rows >= 0 && n > 0, "bad shape: %d rows gathered from %d ranks", rows, n);
  CPLAN_REQUIRE(me, rows == 0 || (m && gathered), "m and gathered must not be NULL");
  if (rows == 0) return 0;
  vp_ce_max_combine<<<cplan_blocks(rows, 256, CPLAN_MAX_GRID), 256, 0, stream>>>(m, gathered, rows, n);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_vp_ce_row_sumexp(CplanDtype dt, float *s, const void *logits, const float *m, int rows,
                                           int vl, cudaStream_t stream) {
  const char *me = "cplan_cuda_vp_ce_row_sumexp";
  CPLAN_REQUIRE(me, rows >= 0 && vl > 0, "bad shape [%d, %d]", rows, vl);
  CPLAN_REQUIRE(me, rows == 0 || (s && logits && m), "s, logits and m must not be NULL");
  if (rows == 0) return 0;
  unsigned grid = vp_row_grid(rows);
  int th = cplan_row_threads(vl);
  if (dt == CPLAN_F32) vp_ce_row_sumexp_f32<<<grid, th, 0, stream>>>(s, (const float *)logits, m, rows, vl);
  else if (dt == CPLAN_BF16) vp_ce_row_sumexp_bf16<<<grid, th, 0, stream>>>(s, (const bf16 *)logits, m, rows, vl);
  else if (dt == CPLAN_F16) vp_ce_row_sumexp_f16<<<grid, th, 0, stream>>>(s, (const fp16 *)logits, m, rows, vl);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_vp_ce_forward_part(CplanDtype dt, float *loss, int *count, const void *logits,
                                             const float *m, const float *s, const int32_t *targets, int rows, int vl,
                                             int v0, int v, int lead, cudaStream_t stream) {
  const char *me = "cplan_cuda_vp_ce_forward_part";
  CPLAN_REQUIRE(me, rows >= 0 && vp_range_ok(v0, vl, v), "bad shape: [%d, %d] logits of columns [%d, %d + %d) of %d",
                rows, vl, v0, v0, vl, v);
  CPLAN_REQUIRE(me, loss && logits && m && s && targets, "loss, logits, m, s and targets must not be NULL");
  if (dt == CPLAN_F32)
    vp_ce_forward_part_f32<<<1, 1024, 0, stream>>>(loss, count, (const float *)logits, m, s, targets, rows, vl, v0, v,
                                                   lead);
  else if (dt == CPLAN_BF16)
    vp_ce_forward_part_bf16<<<1, 1024, 0, stream>>>(loss, count, (const bf16 *)logits, m, s, targets, rows, vl, v0, v,
                                                    lead);
  else if (dt == CPLAN_F16)
    vp_ce_forward_part_f16<<<1, 1024, 0, stream>>>(loss, count, (const fp16 *)logits, m, s, targets, rows, vl, v0, v,
                                                   lead);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_vp_argmax_local(CplanDtype dt, float *pair, const void *logits, int rows, int vl, int v0,
                                         cudaStream_t stream) {
  const char *me = "cplan_cuda_vp_argmax_local";
  CPLAN_REQUIRE(me, rows >= 0 && vl > 0 && v0 >= 0 && (long long)v0 + vl <= (1LL << 24),
                "bad shape: [%d, %d] logits of columns [%d, %d + %d) (indices travel as floats: below 2^24)", rows, vl,
                v0, v0, vl);
  CPLAN_REQUIRE(me, rows == 0 || (pair && logits), "pair and logits must not be NULL");
  if (rows == 0) return 0;
  unsigned grid = vp_row_grid(rows);
  int th = cplan_row_threads(vl);
  if (dt == CPLAN_F32) vp_argmax_local_f32<<<grid, th, 0, stream>>>(pair, (const float *)logits, rows, vl, v0);
  else if (dt == CPLAN_BF16) vp_argmax_local_bf16<<<grid, th, 0, stream>>>(pair, (const bf16 *)logits, rows, vl, v0);
  else if (dt == CPLAN_F16) vp_argmax_local_f16<<<grid, th, 0, stream>>>(pair, (const fp16 *)logits, rows, vl, v0);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_vp_argmax_combine(int32_t *out, const float *gathered, int rows, int n, cudaStream_t stream) {
  const char *me = "cplan_cuda_vp_argmax_combine";
  CPLAN_REQUIRE(me, rows >= 0 && n > 0, "bad shape: %d rows' pairs gathered from %d ranks", rows, n);
  CPLAN_REQUIRE(me, rows == 0 || (out && gathered), "out and gathered must not be NULL");
  if (rows == 0) return 0;
  vp_argmax_combine<<<cplan_blocks(rows, 256, CPLAN_MAX_GRID), 256, 0, stream>>>((int *)out, gathered, rows, n);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_vp_ce_backward(CplanDtype dt, void *dlogits, const float *dloss, const int *count,
                                         const void *logits, const float *m, const float *s, const int32_t *targets,
                                         int rows, int vl, int v0, int v, cudaStream_t stream) {
  const char *me = "cplan_cuda_vp_ce_backward";
  CPLAN_REQUIRE(me, rows >= 0 && vp_range_ok(v0, vl, v), "bad shape: [%d, %d] logits of columns [%d, %d + %d) of %d",
                rows, vl, v0, v0, vl, v);
  CPLAN_REQUIRE(me, dlogits && dloss && count && logits && m && s && targets,
                "dlogits, dloss, count, logits, m, s and targets must not be NULL");
  if (rows == 0) return 0;
  unsigned grid = vp_row_grid(rows);
  int th = cplan_row_threads(vl);
  if (dt == CPLAN_F32)
    vp_ce_backward_f32<<<grid, th, 0, stream>>>((float *)dlogits, dloss, count, (const float *)logits, m, s, targets,
                                                rows, vl, v0);
  else if (dt == CPLAN_BF16)
    vp_ce_backward_bf16<<<grid, th, 0, stream>>>((bf16 *)dlogits, dloss, count, (const bf16 *)logits, m, s, targets,
                                                 rows, vl, v0);
  else if (dt == CPLAN_F16)
    vp_ce_backward_f16<<<grid, th, 0, stream>>>((fp16 *)dlogits, dloss, count, (const fp16 *)logits, m, s, targets,
                                                rows, vl, v0);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}
#endif
