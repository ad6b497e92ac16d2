/* embedding.cu: embedding lookup, forward and backward, of the whole table or (vp_*, tensor
 * parallelism) of one rank's rows of it (kernels_cuda.h; reference
 * k_embedding_* in kernels/cpu/ref.c).
 *
 * The backward is deterministic without sorting and without atomics: thread (p, col) owns
 * column col of the table rows r with r % P == p, and walks the indices in order, adding
 * dout[i, col] to dtable[idx[i], col] when idx[i] is one of its rows. No two threads touch the
 * same element, and every element receives its terms in index order, as in the reference, so
 * the f32 sums are the reference's bit for bit. The indices go by in tiles: the block's threads
 * classify a tile's indices together (8 each) and list those of class p, in order, in shared
 * memory (a prefix sum of their counts), so each thread walks only its class's indices (about
 * n / 64 of them) rather than all n. */
#include "cuda_common.h"

#define EMB_TILE 1024
#define EMB_COLS 128 /* threads per block: columns */
#define EMB_P 64     /* row classes: blocks along y */

/* rows [v0, v0 + vl) of a vocabulary of v (the whole table: 0, v; tensor parallelism: one rank's rows) */
template <typename T>
__device__ __forceinline__ void emb_fwd(T *out, const T *table, const int *idx, int n, int v0, int vl, int v, int c) {
  long long total = (long long)n * c;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
    long long i = e / c;
    int j = (int)(e % c), r = idx[i];
    if (r < 0 || r >= v) out[e] = st<T>(CPLAN_NAN);
    else if (r >= v0 && r - v0 < vl) out[e] = table[(long long)(r - v0) * c + j];
    else out[e] = st<T>(0.0f); /* another rank's row: the all-reduce adds it */
  }
}

template <typename T>
__device__ __forceinline__ void emb_bwd(float *dtable, const T *dout, const int *idx, int n, int v0, int vl, int c) {
  const int PER = EMB_TILE / EMB_COLS; /* consecutive indices a thread classifies */
  __shared__ int sel[EMB_TILE], selr[EMB_TILE], wsum[EMB_COLS / 32];
  int col = blockIdx.x * EMB_COLS + threadIdx.x, p = blockIdx.y, np = gridDim.y;
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  for (int i0 = 0; i0 < n; i0 += EMB_TILE) {
    int len = min(EMB_TILE, n - i0), e0 = threadIdx.x * PER, k = 0;
    unsigned mine = 0; /* which of this thread's indices are rows of class p */
    for (int u = 0; u < PER; u++) {
      int e = e0 + u, r = e < len ? idx[i0 + e] : -1;
      if (e < len && r >= v0 && r - v0 < vl && (r - v0) % np == p) mine |= 1u << u, k++;
    }
    /* their places in the tile's list, in index order: an exclusive prefix sum of the counts */
    int incl = k;
    for (int o = 1; o < 32; o <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    /* (no barrier needed first: the last tile's wsum and list were read before its last barrier,
     * or, the list, before this tile's next one) */
    if (lane == 31) wsum[wid] = incl;
    __syncthreads();
    int off = incl - k, total = 0;
    for (int q = 0; q < EMB_COLS / 32; q++) {
      if (q < wid) off += wsum[q];
      total += wsum[q];
    }
    for (int u = 0; u < PER; u++)
      if (mine >> u & 1) sel[off] = i0 + e0 + u, selr[off] = idx[i0 + e0 + u] - v0, off++;
    __syncthreads();
    if (col >= c) continue;
    for (int q = 0; q < total; q++)
      dtable[(long long)selr[q] * c + col] += ld(dout[(long long)sel[q] * c + col]);
  }
}

#define EMB_ENTRIES(T, S)                                                                                  \
  extern "C" __global__ void embedding_forward_##S(T *out, const T *table, const int *idx, int n, int v,   \
                                                   int c) {                                                \
    emb_fwd<T>(out, table, idx, n, 0, v, v, c);                                                            \
  }                                                                                                        \
  extern "C" __global__ void embedding_backward_##S(float *dtable, const T *dout, const int *idx, int n,    \
                                                    int v, int c) {                                        \
    emb_bwd<T>(dtable, dout, idx, n, 0, v, c);                                                             \
  }                                                                                                        \
  extern "C" __global__ void vp_embedding_forward_##S(T *out, const T *table, const int *idx, int n, int v0, \
                                                      int vl, int v, int c) {                              \
    emb_fwd<T>(out, table, idx, n, v0, vl, v, c);                                                          \
  }                                                                                                        \
  extern "C" __global__ void vp_embedding_backward_##S(float *dtable, const T *dout, const int *idx, int n, \
                                                       int v0, int vl, int c) {                            \
    emb_bwd<T>(dtable, dout, idx, n, v0, vl, c);                                                           \
  }

EMB_ENTRIES(float, f32)
EMB_ENTRIES(bf16, bf16)
EMB_ENTRIES(fp16, f16)

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

extern "C" int cplan_cuda_embedding_forward(CplanDtype dt, void *out, const void *table, const int32_t *idx, int n,
                                            int v, int c, cudaStream_t stream) {
  const char *me = "cplan_cuda_embedding_forward";
  CPLAN_REQUIRE(me, n >= 0 && v > 0 && c > 0, "bad shape: n %d, table [%d, %d]", n, v, c);
  CPLAN_REQUIRE(me, n == 0 || (out && table && idx), "out, table and idx must not be NULL");
  if (n == 0) return 0;
  unsigned g = cplan_blocks((int64_t)n * c, 256, 65535u * 4);
  if (dt == CPLAN_F32)
    embedding_forward_f32<<<g, 256, 0, stream>>>((float *)out, (const float *)table, idx, n, v, c);
  else if (dt == CPLAN_BF16)
    embedding_forward_bf16<<<g, 256, 0, stream>>>((bf16 *)out, (const bf16 *)table, idx, n, v, c);
  else if (dt == CPLAN_F16)
    embedding_forward_f16<<<g, 256, 0, stream>>>((fp16 *)out, (const fp16 *)table, idx, n, v, c);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_embedding_backward(CplanDtype dt, float *dtable, const void *dout, const int32_t *idx,
                                             int n, int v, int c, cudaStream_t stream) {
  const char *me = "cplan_cuda_embedding_backward";
  CPLAN_REQUIRE(me, n >= 0 && v > 0 && c > 0, "bad shape: n %d, table [%d, %d]", n, v, c);
  CPLAN_REQUIRE(me, n == 0 || (dtable && dout && idx), "dtable, dout and idx must not be NULL");
  if (n == 0) return 0;
  dim3 grid((unsigned)((c + EMB_COLS - 1) / EMB_COLS), (unsigned)(v < EMB_P ? v : EMB_P));
  if (dt == CPLAN_F32) embedding_backward_f32<<<grid, EMB_COLS, 0, stream>>>(dtable, (const float *)dout, idx, n, v, c);
  else if (dt == CPLAN_BF16) embedding_backward_bf16<<<grid, EMB_COLS, 0, stream>>>(dtable, (const bf16 *)dout, idx, n, v, c);
  else if (dt == CPLAN_F16) embedding_backward_f16<<<grid, EMB_COLS, 0, stream>>>(dtable, (const fp16 *)dout, idx, n, v, c);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

/* rows [v0, v0 + vl) of a vocabulary of v, with vl > 0 */
static int emb_range_ok(int v0, int vl, int v) { return vl > 0 && v0 >= 0 && v > 0; } /* rows past v: a padded table's */

extern "C" int cplan_cuda_vp_embedding_forward(CplanDtype dt, void *out, const void *table, const int32_t *idx, int n,
                                               int v0, int vl, int v, int c, cudaStream_t stream) {
  const char *me = "cplan_cuda_vp_embedding_forward";
  CPLAN_REQUIRE(me, n >= 0 && c > 0 && emb_range_ok(v0, vl, v),
                "bad shape: n %d, rows [%d, %d + %d) of a [%d, %d] table", n, v0, v0, vl, v, c);
  CPLAN_REQUIRE(me, n == 0 || (out && table && idx), "out, table and idx must not be NULL");
  if (n == 0) return 0;
  unsigned g = cplan_blocks((int64_t)n * c, 256, 65535u * 4);
  if (dt == CPLAN_F32)
    vp_embedding_forward_f32<<<g, 256, 0, stream>>>((float *)out, (const float *)table, idx, n, v0, vl, v, c);
  else if (dt == CPLAN_BF16)
    vp_embedding_forward_bf16<<<g, 256, 0, stream>>>((bf16 *)out, (const bf16 *)table, idx, n, v0, vl, v, c);
  else if (dt == CPLAN_F16)
    vp_embedding_forward_f16<<<g, 256, 0, stream>>>((fp16 *)out, (const fp16 *)table, idx, n, v0, vl, v, c);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_vp_embedding_backward(CplanDtype dt, float *dtable, const void *dout, const int32_t *idx,
                                                int n, int v0, int vl, int v, int c, cudaStream_t stream) {
  const char *me = "cplan_cuda_vp_embedding_backward";
  CPLAN_REQUIRE(me, n >= 0 && c > 0 && emb_range_ok(v0, vl, v),
                "bad shape: n %d, rows [%d, %d + %d) of a [%d, %d] table", n, v0, v0, vl, v, c);
  CPLAN_REQUIRE(me, n == 0 || (dtable && dout && idx), "dtable, dout and idx must not be NULL");
  if (n == 0) return 0;
  dim3 grid((unsigned)((c + EMB_COLS - 1) / EMB_COLS), (unsigned)(vl < EMB_P ? vl : EMB_P));
  if (dt == CPLAN_F32)
    vp_embedding_backward_f32<<<grid, EMB_COLS, 0, stream>>>(dtable, (const float *)dout, idx, n, v0, vl, c);
  else if (dt == CPLAN_BF16)
    vp_embedding_backward_bf16<<<grid, EMB_COLS, 0, stream>>>(dtable, (const bf16 *)dout, idx, n, v0, vl, c);
  else if (dt == CPLAN_F16)
    vp_embedding_backward_f16<<<grid, EMB_COLS, 0, stream>>>(dtable, (const fp16 *)dout, idx, n, v0, vl, c);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}
#endif
