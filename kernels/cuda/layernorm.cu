/* layernorm.cu: layer_norm and rms_norm, forward and backward (kernels_cuda.h; references
 * k_layer_norm_* and k_rms_norm_* in kernels/cpu/ref.c).
 *
 * Forward and the dx part of the backward: a warp per row up to 2048 columns (8 rows a block),
 * one block per row beyond (grid-stride over rows either way: NormRows), the row's statistics by
 * warp or block reductions, in f32, two passes for the variance as the reference does.
 * dw and db sum over all rows: a second kernel gives each column to one thread column of a
 * 32 x 32 block, which walks the rows in a fixed order, so the sums are deterministic without
 * atomics. That is only ceil(c / 32) blocks (24 for c = 768: latency-bound on a GPU of 132 SMs),
 * so the _ws launchers split the rows into chunks instead (norm_backward_dw_part below): one
 * block per (column tile, chunk) writes the chunk's partial sums to a workspace, and a third
 * kernel adds each column's partials in chunk order. Also deterministic, with no atomics. Up to
 * 1024 columns, with dw (db) wanted, the _ws launchers run one kernel for dx (if wanted) and the
 * chunks' partials (norm_backward_fused, llm.c's fused layernorm backward: dy and x are read once,
 * not twice), then the chunks' sum.
 * RMS is the same code without the mean (and without b, db).
 * The _res forwards normalize x = a + res (llm.c's fused residual): each thread first writes its
 * columns of the sum, rounded to the storage type, to xsum and then reads them back (its own writes,
 * from cache) for the statistics and the output, so the sum is not read again from memory by a
 * separate norm launch. */
#include "cuda_common.h"

/* Who handles a row: with blocks of (32, k) threads, a warp per row (k rows a block: no block
 * barrier, every reduction a few shuffles; the launchers' choice up to 2048 columns, GPT-2's 768
 * among them); with blocks of (n > 32, 1), the block. The row loop is uniform over the group. */
struct NormRows {
  int tid, n; /* this thread's index in the row's group, the group's size */
  int r0, step;
  bool warp;
};
__device__ __forceinline__ NormRows norm_rows() {
  NormRows g;
  g.warp = blockDim.x == 32;
  g.tid = threadIdx.x;
  g.n = blockDim.x;
  g.r0 = g.warp ? (int)(blockIdx.x * blockDim.y + threadIdx.y) : (int)blockIdx.x;
  g.step = g.warp ? (int)(gridDim.x * blockDim.y) : (int)gridDim.x;
  return g;
}
__device__ __forceinline__ float norm_sum(const NormRows &g, float v, float *sh) {
  return g.warp ? warp_reduce<false>(v) : block_reduce<false>(v, sh);
}

/* P: elements per access (VecW<T>::P with vec: c a multiple of P, every row 16-byte aligned; else 1) */
template <typename T, bool RMS, int P>
__device__ __forceinline__ void norm_forward_p(T *out, float *mean, float *rstd, const T *x, const T *res, T *xsum,
                                               const T *w, const T *b, int rows, int c, float eps) {
  __shared__ float sh[33];
  NormRows g = norm_rows();
  for (int r = g.r0; r < rows; r += g.step) {
    const T *xr = x + (long long)r * c;
    if (res) { /* x = a + res, stored; the passes below read it back (each thread its own columns) */
      const T *rr = res + (long long)r * c;
      T *sr = xsum + (long long)r * c;
      for (int j = g.tid * P; j < c; j += g.n * P) {
        float a[P], q[P];
        ldv<T, P>(a, xr + j), ldv<T, P>(q, rr + j);
#pragma unroll
        for (int u = 0; u < P; u++) a[u] += q[u];
        stv<T, P>(sr + j, a);
      }
      xr = sr;
    }
    float m = 0.0f;
    if (!RMS) {
      float s = 0.0f;
      for (int j = g.tid * P; j < c; j += g.n * P) {
        float xv[P];
        ldv<T, P>(xv, xr + j);
#pragma unroll
        for (int u = 0; u < P; u++) s += xv[u];
      }
      m = norm_sum(g, s, sh) / (float)c;
    }
    float v = 0.0f;
    for (int j = g.tid * P; j < c; j += g.n * P) {
      float xv[P];
      ldv<T, P>(xv, xr + j);
#pragma unroll
      for (int u = 0; u < P; u++) v += (xv[u] - m) * (xv[u] - m);
    }
    float rs = 1.0f / sqrtf(norm_sum(g, v, sh) / (float)c + eps);
    T *yr = out + (long long)r * c;
    for (int j = g.tid * P; j < c; j += g.n * P) {
      float xv[P], wv[P], bv[P] = {}, y[P];
      ldv<T, P>(xv, xr + j), ldv<T, P>(wv, w + j);
      if (!RMS) ldv<T, P>(bv, b + j);
#pragma unroll
      for (int u = 0; u < P; u++) y[u] = RMS ? (xv[u] - m) * rs * wv[u] : (xv[u] - m) * rs * wv[u] + bv[u];
      stv<T, P>(yr + j, y);
    }
    if (g.tid == 0) {
      if (!RMS && mean) mean[r] = m;
      if (rstd) rstd[r] = rs;
    }
  }
}

template <typename T, bool RMS>
__device__ __forceinline__ void norm_forward(T *out, float *mean, float *rstd, const T *x, const T *res, T *xsum,
                                             const T *w, const T *b, int rows, int c, float eps, int vec) {
  if (vec) norm_forward_p<T, RMS, VecW<T>::P>(out, mean, rstd, x, res, xsum, w, b, rows, c, eps);
  else norm_forward_p<T, RMS, 1>(out, mean, rstd, x, res, xsum, w, b, rows, c, eps);
}

/* dx += rs (g - mean(g) - xhat mean(g xhat)), g = w dy (rms: without the mean(g) term); acc 0: dx =
 * (its old values never read) */
template <typename T, bool RMS>
__device__ __forceinline__ void norm_backward_dx(T *dx, const T *dout, const T *x, const T *w,
                                                 const float *mean, const float *rstd, int rows, int c, int acc) {
  __shared__ float sh[33];
  NormRows rg = norm_rows();
  for (int r = rg.r0; r < rows; r += rg.step) {
    const T *xr = x + (long long)r * c, *dy = dout + (long long)r * c;
    float m = RMS ? 0.0f : mean[r], rs = rstd[r], sg = 0.0f, sgx = 0.0f;
    for (int j = rg.tid; j < c; j += rg.n) {
      float g = ld(w[j]) * ld(dy[j]);
      sg += g;
      sgx += g * (ld(xr[j]) - m) * rs;
    }
    float gm = RMS ? 0.0f : norm_sum(rg, sg, sh) / (float)c;
    float gxm = norm_sum(rg, sgx, sh) / (float)c;
    T *dxr = dx + (long long)r * c;
    for (int j = rg.tid; j < c; j += rg.n) {
      float xhat = (ld(xr[j]) - m) * rs;
      float g = ld(w[j]) * ld(dy[j]);
      dxr[j] = st<T>((acc ? ld(dxr[j]) : 0.0f) + rs * (g - gm - xhat * gxm));
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
                                                   const T *res, T *xsum, const T *w, const T *b,       \
                                                   int rows, int c, float eps, int vec) {               \
    norm_forward<T, false>(out, mean, rstd, x, res, xsum, w, b, rows, c, eps, vec);                     \
  }                                                                                                     \
  extern "C" __global__ void rmsnorm_forward_##S(T *out, float *rstd, const T *x, const T *res,         \
                                                 T *xsum, const T *w, int rows, int c, float eps,       \
                                                 int vec) {                                             \
    norm_forward<T, true>(out, nullptr, rstd, x, res, xsum, w, nullptr, rows, c, eps, vec);             \
  }                                                                                                     \
  extern "C" __global__ void layernorm_backward_dx_##S(T *dx, const T *dout, const T *x, const T *w,    \
                                                       const float *mean, const float *rstd, int rows,  \
                                                       int c, int acc) {                                \
    norm_backward_dx<T, false>(dx, dout, x, w, mean, rstd, rows, c, acc);                               \
  }                                                                                                     \
  extern "C" __global__ void rmsnorm_backward_dx_##S(T *dx, const T *dout, const T *x, const T *w,      \
                                                     const float *rstd, int rows, int c, int acc) {     \
    norm_backward_dx<T, true>(dx, dout, x, w, nullptr, rstd, rows, c, acc);                             \
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

/* The workspace path, pass 1. Block (32, 8); blockIdx.x: a tile of 32 V columns (V = 2 for the
 * 2-byte types: each lane reads one 4-byte pair per row when `vec`, so a warp reads 128
 * contiguous bytes of a row in every dtype); blockIdx.y = k: rows [k chunk, (k + 1) chunk).
 * Thread row y sums rows k chunk + y, + 8, ... in order; the 8 sums are added in y order and
 * written to pw[k c + j] (and pb[k c + j]). Every column of every chunk is written. */
template <typename T> struct alignas(2 * sizeof(T)) norm_pair {
  T a, b;
};

/* thread row y's sums over rows r0 + y, + 8, ... < r1 of columns j, j + V - 1 (PAIRS: one
 * 4-byte load of both; else two loads each, the second of j itself when j + 1 = c, counted as
 * zero). The bodies have no branch, so the unrolled iterations' loads overlap. */
template <typename T, bool RMS, int V, bool PAIRS>
__device__ __forceinline__ void norm_dw_rows(float *aw, float *ab, const T *dout, const T *x, const float *mean,
                                             const float *rstd, int c, int j, int r0, int r1) {
  const int j1 = j + 1 < c ? j + 1 : j;
  const float keep = j + 1 < c ? 1.0f : 0.0f;
#pragma unroll 4
  for (int r = r0 + (int)threadIdx.y; r < r1; r += 8) {
    const long long o = (long long)r * c;
    const float m = RMS ? 0.0f : mean[r], rs = rstd[r];
    float dy[V], xv[V];
    if (V == 1) {
      dy[0] = ld(dout[o + j]), xv[0] = ld(x[o + j]);
    } else if (PAIRS) {
      norm_pair<T> p = *reinterpret_cast<const norm_pair<T> *>(dout + o + j);
      norm_pair<T> q = *reinterpret_cast<const norm_pair<T> *>(x + o + j);
      dy[0] = ld(p.a), dy[V - 1] = ld(p.b), xv[0] = ld(q.a), xv[V - 1] = ld(q.b);
    } else {
      dy[0] = ld(dout[o + j]), xv[0] = ld(x[o + j]);
      dy[V - 1] = keep * ld(dout[o + j1]), xv[V - 1] = ld(x[o + j1]);
    }
#pragma unroll
    for (int v = 0; v < V; v++) {
      aw[v] += dy[v] * (xv[v] - m) * rs;
      ab[v] += dy[v];
    }
  }
}

template <typename T, bool RMS, int V>
__device__ __forceinline__ void norm_backward_dw_part(float *pw, float *pb, const T *dout, const T *x,
                                                      const float *mean, const float *rstd, int rows, int c,
                                                      int chunk, int vec) {
  __shared__ float sw[8][32 * V + 1], sb[8][32 * V + 1];
  const int k = blockIdx.y, j = (blockIdx.x * 32 + threadIdx.x) * V;
  const int r0 = k * chunk, r1 = rows - r0 < chunk ? rows : r0 + chunk;
  float aw[V], ab[V];
#pragma unroll
  for (int v = 0; v < V; v++) aw[v] = 0.0f, ab[v] = 0.0f;
  if (j < c) {
    if (V == 2 && vec && j + 1 < c) norm_dw_rows<T, RMS, V, true>(aw, ab, dout, x, mean, rstd, c, j, r0, r1);
    else norm_dw_rows<T, RMS, V, false>(aw, ab, dout, x, mean, rstd, c, j, r0, r1);
  }
#pragma unroll
  for (int v = 0; v < V; v++) sw[threadIdx.y][threadIdx.x * V + v] = aw[v], sb[threadIdx.y][threadIdx.x * V + v] = ab[v];
  __syncthreads();
  if (threadIdx.y == 0) {
#pragma unroll
    for (int v = 0; v < V; v++) {
      if (j + v >= c) break;
      float tw = 0.0f, tb = 0.0f;
      for (int y = 0; y < 8; y++) tw += sw[y][threadIdx.x * V + v], tb += sb[y][threadIdx.x * V + v];
      pw[(long long)k * c + j + v] = tw;
      if (!RMS) pb[(long long)k * c + j + v] = tb;
    }
  }
}

/* Pass 2: column j of blockIdx.y's output (0: dw from pw, 1: db from pb) += the sum of its
 * nchunks partials, added in chunk order (loaded 16 at a time, so the loads overlap). */
extern "C" __global__ void norm_backward_dw_sum(float *dw, float *db, const float *pw, const float *pb, int c,
                                                int nchunks) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  float *out = blockIdx.y == 0 ? dw : db;
  const float *p = blockIdx.y == 0 ? pw : pb;
  if (j >= c || !out) return;
  float s = 0.0f;
  for (int k = 0; k < nchunks; k += 16) {
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; i++) v[i] = k + i < nchunks ? p[(long long)(k + i) * c + j] : 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++)
      if (k + i < nchunks) s += v[i];
  }
  out[j] += s;
}

/* The fused backward: block (32, 8) over rows [k chunk, (k + 1) chunk) (k = blockIdx.x); warp y takes
 * rows r0 + y, + 8, ... in order, writes each row's dx as norm_backward_dx does, and adds dy xhat
 * and dy into its own shared row of partial sums (dynamic shared memory: 2 x 8 x c floats); then
 * each column's 8 warp partials are added in warp order into pw[k c + j] (pb[k c + j]), which
 * norm_backward_fused_sum adds up in chunk order. */
template <typename T, bool RMS, int P>
__device__ __forceinline__ void norm_backward_fused_p(T *dx, float *pw, float *pb, const T *dout, const T *x,
                                                      const T *w, const float *mean, const float *rstd, int rows, int c,
                                                      int chunk, int acc) {
  extern __shared__ float nf_sm[]; /* [2][8][c]: dw, db partials per warp */
  float *sw = nf_sm + threadIdx.y * c, *sb = nf_sm + (8 + threadIdx.y) * c;
  const int lane = threadIdx.x, k = blockIdx.x;
  for (int j = lane * P; j < c; j += 32 * P) /* each lane zeroes the columns it adds into below */
#pragma unroll
    for (int u = 0; u < P; u++) sw[j + u] = 0.0f, sb[j + u] = 0.0f;
  const int r0 = k * chunk, r1 = rows - r0 < chunk ? rows : r0 + chunk;
  for (int r = r0 + (int)threadIdx.y; r < r1; r += 8) {
    const T *xr = x + (long long)r * c, *dy = dout + (long long)r * c;
    float m = RMS ? 0.0f : mean[r], rs = rstd[r], gm = 0.0f, gxm = 0.0f;
    if (dx) {
      float sg = 0.0f, sgx = 0.0f;
      for (int j = lane * P; j < c; j += 32 * P) {
        float wv[P], dv[P], xv[P];
        ldv<T, P>(wv, w + j), ldv<T, P>(dv, dy + j), ldv<T, P>(xv, xr + j);
#pragma unroll
        for (int u = 0; u < P; u++) {
          float g = wv[u] * dv[u];
          sg += g;
          sgx += g * (xv[u] - m) * rs;
        }
      }
      gm = RMS ? 0.0f : warp_reduce<false>(sg) / (float)c;
      gxm = warp_reduce<false>(sgx) / (float)c;
    }
    T *dxr = dx ? dx + (long long)r * c : nullptr;
    for (int j = lane * P; j < c; j += 32 * P) { /* the sums by the same code with dx or without */
      float dv[P], xv[P];
      ldv<T, P>(dv, dy + j), ldv<T, P>(xv, xr + j);
      if (dx) {
        float wv[P], o[P];
        ldv<T, P>(wv, w + j);
        if (acc) ldv<T, P>(o, dxr + j);
#pragma unroll
        for (int u = 0; u < P; u++) {
          float xhat = (xv[u] - m) * rs;
          o[u] = (acc ? o[u] : 0.0f) + rs * (wv[u] * dv[u] - gm - xhat * gxm);
        }
        stv<T, P>(dxr + j, o);
      }
#pragma unroll
      for (int u = 0; u < P; u++) {
        float xhat = (xv[u] - m) * rs;
        sw[j + u] += dv[u] * xhat;
        sb[j + u] += dv[u];
      }
    }
  }
  __syncthreads();
  for (int j = (int)(threadIdx.y * 32 + lane); j < c; j += 256) {
    float tw = 0.0f, tb = 0.0f;
    for (int y = 0; y < 8; y++) tw += nf_sm[y * c + j], tb += nf_sm[(8 + y) * c + j];
    if (pw) pw[(long long)k * c + j] = tw;
    if (!RMS && pb) pb[(long long)k * c + j] = tb;
  }
}

template <typename T, bool RMS>
__device__ __forceinline__ void norm_backward_fused(T *dx, float *pw, float *pb, const T *dout, const T *x,
                                                    const T *w, const float *mean, const float *rstd, int rows, int c,
                                                    int chunk, int acc, int vec) {
  if (vec) norm_backward_fused_p<T, RMS, VecW<T>::P>(dx, pw, pb, dout, x, w, mean, rstd, rows, c, chunk, acc);
  else norm_backward_fused_p<T, RMS, 1>(dx, pw, pb, dout, x, w, mean, rstd, rows, c, chunk, acc);
}

/* out[j] += the sum of column j's nchunks partials p[k c + j] (blockIdx.y 0: dw from pw, 1: db from
 * pb), block (32, 8) over 32 columns: thread row y adds chunks y, y + 8, ... in order, then the 8
 * sums are added in y order (deterministic) */
extern "C" __global__ void norm_backward_fused_sum(float *dw, float *db, const float *pw, const float *pb, int c,
                                                   int nchunks) {
  __shared__ float sh[8][33];
  const int j = blockIdx.x * 32 + threadIdx.x;
  float *out = blockIdx.y == 0 ? dw : db;
  const float *p = blockIdx.y == 0 ? pw : pb;
  if (!out) return; /* uniform over the block */
  float s = 0.0f;
  if (j < c)
    for (int k = (int)threadIdx.y; k < nchunks; k += 8) s += p[(long long)k * c + j];
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float t = 0.0f;
    for (int y = 0; y < 8; y++) t += sh[y][threadIdx.x];
    out[j] += t;
  }
}

#define NORM_FUSED_ENTRIES(T, S)                                                                         \
  extern "C" __global__ void layernorm_backward_fused_##S(T *dx, float *pw, float *pb, const T *dout,    \
                                                          const T *x, const T *w, const float *mean,     \
                                                          const float *rstd, int rows, int c, int chunk, \
                                                          int acc, int vec) {                            \
    norm_backward_fused<T, false>(dx, pw, pb, dout, x, w, mean, rstd, rows, c, chunk, acc, vec);         \
  }                                                                                                      \
  extern "C" __global__ void rmsnorm_backward_fused_##S(T *dx, float *pw, const T *dout, const T *x,     \
                                                        const T *w, const float *rstd, int rows, int c,  \
                                                        int chunk, int acc, int vec) {                   \
    norm_backward_fused<T, true>(dx, pw, nullptr, dout, x, w, nullptr, rstd, rows, c, chunk, acc, vec);  \
  }

NORM_FUSED_ENTRIES(float, f32)
NORM_FUSED_ENTRIES(bf16, bf16)
NORM_FUSED_ENTRIES(fp16, f16)

#define NORM_PART_ENTRIES(T, S, V)                                                                      \
  extern "C" __global__ void layernorm_backward_dw_part_##S(float *pw, float *pb, const T *dout,         \
                                                            const T *x, const float *mean,              \
                                                            const float *rstd, int rows, int c,         \
                                                            int chunk, int vec) {                       \
    norm_backward_dw_part<T, false, V>(pw, pb, dout, x, mean, rstd, rows, c, chunk, vec);               \
  }                                                                                                     \
  extern "C" __global__ void rmsnorm_backward_dw_part_##S(float *pw, const T *dout, const T *x,          \
                                                          const float *rstd, int rows, int c, int chunk, \
                                                          int vec) {                                    \
    norm_backward_dw_part<T, true, V>(pw, nullptr, dout, x, nullptr, rstd, rows, c, chunk, vec);        \
  }

NORM_PART_ENTRIES(float, f32, 1)
NORM_PART_ENTRIES(bf16, bf16, 2)
NORM_PART_ENTRIES(fp16, f16, 2)

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

#include <stdint.h>
#include <stdlib.h>

static int row_blocks(int rows) { return rows < 1 ? 1 : rows > (int)CPLAN_MAX_GRID ? (int)CPLAN_MAX_GRID : rows; }

/* the forward and dx kernels' launch (NormRows): a warp per row, 8 rows a block, up to 2048
 * columns (64 a lane); a block per row beyond */
#define NORM_WARP_MAX_C 2048
static dim3 norm_block(int c) { return c <= NORM_WARP_MAX_C ? dim3(32, 8) : dim3((unsigned)cplan_row_threads(c)); }
static unsigned norm_grid(int rows, int c) { return (unsigned)(c <= NORM_WARP_MAX_C ? row_blocks((rows + 7) / 8) : row_blocks(rows)); }

/* 16-byte accesses (VecW<T>::P elements): c a multiple of P and every pointer given (NULLs
 * skipped) 16-byte aligned, so that every row is; CPLAN_NORM_VEC=0 keeps the scalar loops */
static int norm_vec(CplanDtype dt, int c, const void *const *ptrs, int n) {
  static int off = -1;
  if (off < 0) {
    const char *e = getenv("CPLAN_NORM_VEC");
    off = e && strcmp(e, "0") == 0;
  }
  const int p = dt == CPLAN_F32 ? 4 : 8;
  if (off || c % p) return 0;
  for (int i = 0; i < n; i++)
    if (ptrs[i] && (uintptr_t)ptrs[i] % 16) return 0;
  return 1;
}

/* both norms' forwards; res: x + res, written to xsum, is normalized; rms: no mean, no b */
static int norm_fwd(const char *me, int rms, CplanDtype dt, void *out, void *xsum, float *mean, float *rstd,
                    const void *x, const void *res, const void *w, const void *b, int rows, int c, float eps,
                    cudaStream_t stream) {
  CPLAN_REQUIRE(me, rows >= 0 && c > 0, "bad shape [%d, %d]", rows, c);
  CPLAN_REQUIRE(me, eps >= 0, "eps %g < 0", (double)eps);
  CPLAN_REQUIRE(me, out && x && w && (rms || b), rms ? "out, x and w must not be NULL" : "out, x, w and b must not be NULL");
  CPLAN_REQUIRE(me, !res || xsum, "a residual needs xsum");
  if (rows == 0) return 0;
  dim3 gr(norm_grid(rows, c)), bl(norm_block(c));
  const void *ptrs[6] = {out, x, w, rms ? NULL : b, res, xsum};
  const int vec = norm_vec(dt, c, ptrs, 6);
#define NORM_FWD(T, S)                                                                                          \
  do {                                                                                                          \
    if (rms)                                                                                                    \
      rmsnorm_forward_##S<<<gr, bl, 0, stream>>>((T *)out, rstd, (const T *)x, (const T *)res, (T *)xsum,       \
                                                 (const T *)w, rows, c, eps, vec);                              \
    else                                                                                                        \
      layernorm_forward_##S<<<gr, bl, 0, stream>>>((T *)out, mean, rstd, (const T *)x, (const T *)res,          \
                                                   (T *)xsum, (const T *)w, (const T *)b, rows, c, eps, vec);   \
  } while (0)
  if (dt == CPLAN_F32) NORM_FWD(float, f32);
  else if (dt == CPLAN_BF16) NORM_FWD(bf16, bf16);
  else if (dt == CPLAN_F16) NORM_FWD(fp16, f16);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
#undef NORM_FWD
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_layernorm_forward(CplanDtype dt, void *out, float *mean, float *rstd,
                                            const void *x, const void *w, const void *b, int rows,
                                            int c, float eps, cudaStream_t stream) {
  return norm_fwd("cplan_cuda_layernorm_forward", 0, dt, out, NULL, mean, rstd, x, NULL, w, b, rows, c, eps, stream);
}

extern "C" int cplan_cuda_layernorm_forward_res(CplanDtype dt, void *out, void *xsum, float *mean, float *rstd,
                                                const void *a, const void *res, const void *w, const void *b,
                                                int rows, int c, float eps, cudaStream_t stream) {
  const char *me = "cplan_cuda_layernorm_forward_res";
  CPLAN_REQUIRE(me, a && res && xsum, "a, res and xsum must not be NULL");
  return norm_fwd(me, 0, dt, out, xsum, mean, rstd, a, res, w, b, rows, c, eps, stream);
}

extern "C" int cplan_cuda_rmsnorm_forward(CplanDtype dt, void *out, float *rstd, const void *x,
                                          const void *w, int rows, int c, float eps, cudaStream_t stream) {
  return norm_fwd("cplan_cuda_rmsnorm_forward", 1, dt, out, NULL, NULL, rstd, x, NULL, w, NULL, rows, c, eps, stream);
}

extern "C" int cplan_cuda_rmsnorm_forward_res(CplanDtype dt, void *out, void *xsum, float *rstd, const void *a,
                                              const void *res, const void *w, int rows, int c, float eps,
                                              cudaStream_t stream) {
  const char *me = "cplan_cuda_rmsnorm_forward_res";
  CPLAN_REQUIRE(me, a && res && xsum, "a, res and xsum must not be NULL");
  return norm_fwd(me, 1, dt, out, xsum, NULL, rstd, a, res, w, NULL, rows, c, eps, stream);
}

/* the dx kernels, shared by both backward launchers of each norm (w != NULL: checked) */
static int layernorm_dx(const char *me, CplanDtype dt, void *dx, const void *dout, const void *x, const void *w,
                        const float *mean, const float *rstd, int rows, int c, int acc, cudaStream_t stream) {
  if (dt == CPLAN_F32)
    layernorm_backward_dx_f32<<<norm_grid(rows, c), norm_block(c), 0, stream>>>((float *)dx, (const float *)dout,
                                                                  (const float *)x, (const float *)w, mean, rstd, rows, c, acc);
  else if (dt == CPLAN_BF16)
    layernorm_backward_dx_bf16<<<norm_grid(rows, c), norm_block(c), 0, stream>>>((bf16 *)dx, (const bf16 *)dout,
                                                                   (const bf16 *)x, (const bf16 *)w, mean, rstd, rows, c, acc);
  else if (dt == CPLAN_F16)
    layernorm_backward_dx_f16<<<norm_grid(rows, c), norm_block(c), 0, stream>>>((fp16 *)dx, (const fp16 *)dout,
                                                                   (const fp16 *)x, (const fp16 *)w, mean, rstd, rows, c, acc);
  return cplan_cuda_launched(me);
}

static int rmsnorm_dx(const char *me, CplanDtype dt, void *dx, const void *dout, const void *x, const void *w,
                      const float *rstd, int rows, int c, int acc, cudaStream_t stream) {
  if (dt == CPLAN_F32)
    rmsnorm_backward_dx_f32<<<norm_grid(rows, c), norm_block(c), 0, stream>>>((float *)dx, (const float *)dout,
                                                                (const float *)x, (const float *)w, rstd, rows, c, acc);
  else if (dt == CPLAN_BF16)
    rmsnorm_backward_dx_bf16<<<norm_grid(rows, c), norm_block(c), 0, stream>>>((bf16 *)dx, (const bf16 *)dout,
                                                                 (const bf16 *)x, (const bf16 *)w, rstd, rows, c, acc);
  else if (dt == CPLAN_F16)
    rmsnorm_backward_dx_f16<<<norm_grid(rows, c), norm_block(c), 0, stream>>>((fp16 *)dx, (const fp16 *)dout,
                                                                 (const fp16 *)x, (const fp16 *)w, rstd, rows, c, acc);
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
  if (dx && layernorm_dx(me, dt, dx, dout, x, w, mean, rstd, rows, c, 1, stream)) return -1;
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
  if (dx && rmsnorm_dx(me, dt, dx, dout, x, w, rstd, rows, c, 1, stream)) return -1;
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

/* ---- the workspace path (kernels_cuda.h): chunks of rows ---------------------------------------
 * R, the number of chunks, depends on rows and c only (so does the workspace): enough chunks
 * that ceil(c / 32) tiles x R >= 2048 (f32 blocks; half as many of the 2-byte types, whose
 * tiles are 64 columns wide), at most 128, and chunks of at least 64 rows (8 per thread row).
 * Rows [0, rows) are cut into chunks of ceil(rows / R) rounded up to a multiple of 8; the last
 * ones may be empty, so nchunks = ceil(rows / chunk) <= R are launched. */
enum { NORM_TARGET_TILES = 2048, NORM_MAX_CHUNKS = 128, NORM_MIN_CHUNK_ROWS = 64 };

static int norm_chunks(int rows, int c) {
  long long tiles = ((long long)c + 31) / 32, r = (NORM_TARGET_TILES + tiles - 1) / tiles;
  long long most = ((long long)rows + NORM_MIN_CHUNK_ROWS - 1) / NORM_MIN_CHUNK_ROWS;
  if (r > most) r = most;
  if (r > NORM_MAX_CHUNKS) r = NORM_MAX_CHUNKS;
  return r < 1 ? 1 : (int)r;
}

/* the fused path (norm_backward_fused): up to 1024 columns (2 x 8 x c floats of shared memory), chunks
 * of 32 rows (4 a warp), more when there would be over 2048 chunks; a function of rows only */
enum { NORM_FUSED_MAX_C = 1024, NORM_FUSED_ROWS = 32, NORM_FUSED_MAX_CHUNKS = 2048 };

static int norm_fused_chunk(int rows) {
  long long ch = ((long long)rows + NORM_FUSED_MAX_CHUNKS - 1) / NORM_FUSED_MAX_CHUNKS;
  ch = (ch + 7) / 8 * 8;
  return ch < NORM_FUSED_ROWS ? NORM_FUSED_ROWS : (int)ch;
}

extern "C" size_t cplan_cuda_norm_backward_work(int rows, int c) {
  if (rows < 0 || c <= 0) return 0;
  size_t n = (size_t)norm_chunks(rows, c);
  if (c <= NORM_FUSED_MAX_C) {
    size_t ch = (size_t)norm_fused_chunk(rows), nf = ((size_t)rows + ch - 1) / ch;
    if (nf > n) n = nf;
  }
  return 2 * n * (size_t)c;
}

/* dx (written, or added when acc) and dw (db) through the fused kernel (c <= NORM_FUSED_MAX_C) */
static int norm_fused_ws(const char *me, CplanDtype dt, int rms, void *dx, float *dw, float *db, const void *dout,
                         const void *x, const void *w, const float *mean, const float *rstd, int rows, int c, int acc,
                         float *work, cudaStream_t stream) {
  const int chunk = norm_fused_chunk(rows), nchunks = (rows + chunk - 1) / chunk;
  float *pw = dw ? work : nullptr, *pb = db ? work + (size_t)nchunks * (size_t)c : nullptr;
  const int bytes = 2 * 8 * c * (int)sizeof(float);
  const void *ptrs[4] = {dx, dout, x, dx ? w : NULL};
  const int vec = norm_vec(dt, c, ptrs, 4);
  dim3 blk(32, 8), grid((unsigned)nchunks);
#define NORM_FUSED_GO(kern, ...)                                                                                 \
  do {                                                                                                           \
    cudaError_t e_ = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);             \
    if (e_ != cudaSuccess)                                                                                       \
      return cplan_cuda_fail(me, "%s: %d bytes of shared memory: %s", #kern, bytes, cudaGetErrorString(e_));      \
    kern<<<grid, blk, (size_t)bytes, stream>>>(__VA_ARGS__);                                                     \
  } while (0)
  if (rms) {
    if (dt == CPLAN_F32)
      NORM_FUSED_GO(rmsnorm_backward_fused_f32, (float *)dx, pw, (const float *)dout, (const float *)x, (const float *)w,
                    rstd, rows, c, chunk, acc, vec);
    else if (dt == CPLAN_BF16)
      NORM_FUSED_GO(rmsnorm_backward_fused_bf16, (bf16 *)dx, pw, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)w,
                    rstd, rows, c, chunk, acc, vec);
    else
      NORM_FUSED_GO(rmsnorm_backward_fused_f16, (fp16 *)dx, pw, (const fp16 *)dout, (const fp16 *)x, (const fp16 *)w,
                    rstd, rows, c, chunk, acc, vec);
  } else {
    if (dt == CPLAN_F32)
      NORM_FUSED_GO(layernorm_backward_fused_f32, (float *)dx, pw, pb, (const float *)dout, (const float *)x,
                    (const float *)w, mean, rstd, rows, c, chunk, acc, vec);
    else if (dt == CPLAN_BF16)
      NORM_FUSED_GO(layernorm_backward_fused_bf16, (bf16 *)dx, pw, pb, (const bf16 *)dout, (const bf16 *)x,
                    (const bf16 *)w, mean, rstd, rows, c, chunk, acc, vec);
    else
      NORM_FUSED_GO(layernorm_backward_fused_f16, (fp16 *)dx, pw, pb, (const fp16 *)dout, (const fp16 *)x,
                    (const fp16 *)w, mean, rstd, rows, c, chunk, acc, vec);
  }
#undef NORM_FUSED_GO
  if (cplan_cuda_launched(me)) return -1;
  dim3 grid2((unsigned)((c + 31) / 32), 2u);
  norm_backward_fused_sum<<<grid2, blk, 0, stream>>>(dw, rms ? nullptr : db, pw, pb, c, nchunks);
  return cplan_cuda_launched(me);
}

/* passes 1 and 2 into dw (and db unless rms; either may be NULL, not both) */
static int norm_dw_ws(const char *me, CplanDtype dt, int rms, float *dw, float *db, const void *dout, const void *x,
                      const float *mean, const float *rstd, int rows, int c, float *work, cudaStream_t stream) {
  const int nr = norm_chunks(rows, c);
  long long chunk = ((long long)rows + nr - 1) / nr;
  chunk = (chunk + 7) / 8 * 8;
  const int nchunks = (int)(((long long)rows + chunk - 1) / chunk);
  float *pw = work, *pb = work + (size_t)nr * (size_t)c;
  const int v = dt == CPLAN_F32 ? 1 : 2;
  const int vec = v == 2 && c % 2 == 0 && (uintptr_t)dout % 4 == 0 && (uintptr_t)x % 4 == 0;
  dim3 blk(32, 8), grid((unsigned)(((long long)c + 32 * v - 1) / (32 * v)), (unsigned)nchunks);
  const int ch = (int)chunk;
  if (rms) {
    if (dt == CPLAN_F32)
      rmsnorm_backward_dw_part_f32<<<grid, blk, 0, stream>>>(pw, (const float *)dout, (const float *)x, rstd, rows, c, ch, vec);
    else if (dt == CPLAN_BF16)
      rmsnorm_backward_dw_part_bf16<<<grid, blk, 0, stream>>>(pw, (const bf16 *)dout, (const bf16 *)x, rstd, rows, c, ch, vec);
    else
      rmsnorm_backward_dw_part_f16<<<grid, blk, 0, stream>>>(pw, (const fp16 *)dout, (const fp16 *)x, rstd, rows, c, ch, vec);
  } else {
    if (dt == CPLAN_F32)
      layernorm_backward_dw_part_f32<<<grid, blk, 0, stream>>>(pw, pb, (const float *)dout, (const float *)x, mean, rstd,
                                                               rows, c, ch, vec);
    else if (dt == CPLAN_BF16)
      layernorm_backward_dw_part_bf16<<<grid, blk, 0, stream>>>(pw, pb, (const bf16 *)dout, (const bf16 *)x, mean, rstd,
                                                                rows, c, ch, vec);
    else
      layernorm_backward_dw_part_f16<<<grid, blk, 0, stream>>>(pw, pb, (const fp16 *)dout, (const fp16 *)x, mean, rstd,
                                                               rows, c, ch, vec);
  }
  if (cplan_cuda_launched(me)) return -1;
  dim3 grid2((unsigned)(((long long)c + 127) / 128), rms || !db ? 1u : 2u);
  if (!dw) grid2.y = 1, pw = pb, dw = db; /* db only */
  norm_backward_dw_sum<<<grid2, 128, 0, stream>>>(dw, rms ? nullptr : db, pw, pb, c, nchunks);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_layernorm_backward_ws(CplanDtype dt, void *dx, float *dw, float *db, const void *dout,
                                                const void *x, const void *w, const float *mean, const float *rstd,
                                                int rows, int c, int accumulate_dx, float *work,
                                                size_t work_floats, cudaStream_t stream) {
  const char *me = "cplan_cuda_layernorm_backward_ws";
  CPLAN_REQUIRE(me, rows >= 0 && c > 0, "bad shape [%d, %d]", rows, c);
  CPLAN_REQUIRE(me, dout && x && mean && rstd, "dout, x, mean and rstd must not be NULL");
  CPLAN_REQUIRE(me, !dx || w, "dx needs w");
  CPLAN_REQUIRE(me, dt == CPLAN_F32 || dt == CPLAN_BF16 || dt == CPLAN_F16, "unknown dtype %d", (int)dt);
  size_t need = cplan_cuda_norm_backward_work(rows, c);
  CPLAN_REQUIRE(me, !(dw || db) || work_floats >= need, "workspace of %zu floats, %zu needed for [%d, %d]",
                work_floats, need, rows, c);
  CPLAN_REQUIRE(me, !(dw || db) || work, "work must not be NULL");
  if (rows == 0) return 0;
  if ((dw || db) && c <= NORM_FUSED_MAX_C)
    return norm_fused_ws(me, dt, 0, dx, dw, db, dout, x, w, mean, rstd, rows, c, accumulate_dx != 0, work, stream);
  if (dx && layernorm_dx(me, dt, dx, dout, x, w, mean, rstd, rows, c, accumulate_dx != 0, stream)) return -1;
  if ((dw || db) && norm_dw_ws(me, dt, 0, dw, db, dout, x, mean, rstd, rows, c, work, stream)) return -1;
  return 0;
}

extern "C" int cplan_cuda_rmsnorm_backward_ws(CplanDtype dt, void *dx, float *dw, const void *dout, const void *x,
                                              const void *w, const float *rstd, int rows, int c, int accumulate_dx,
                                              float *work, size_t work_floats, cudaStream_t stream) {
  const char *me = "cplan_cuda_rmsnorm_backward_ws";
  CPLAN_REQUIRE(me, rows >= 0 && c > 0, "bad shape [%d, %d]", rows, c);
  CPLAN_REQUIRE(me, dout && x && rstd, "dout, x and rstd must not be NULL");
  CPLAN_REQUIRE(me, !dx || w, "dx needs w");
  CPLAN_REQUIRE(me, dt == CPLAN_F32 || dt == CPLAN_BF16 || dt == CPLAN_F16, "unknown dtype %d", (int)dt);
  size_t need = cplan_cuda_norm_backward_work(rows, c);
  CPLAN_REQUIRE(me, !dw || work_floats >= need, "workspace of %zu floats, %zu needed for [%d, %d]", work_floats, need,
                rows, c);
  CPLAN_REQUIRE(me, !dw || work, "work must not be NULL");
  if (rows == 0) return 0;
  if (dw && c <= NORM_FUSED_MAX_C)
    return norm_fused_ws(me, dt, 1, dx, dw, nullptr, dout, x, w, nullptr, rstd, rows, c, accumulate_dx != 0, work,
                         stream);
  if (dx && rmsnorm_dx(me, dt, dx, dout, x, w, rstd, rows, c, accumulate_dx != 0, stream)) return -1;
  if (dw && norm_dw_ws(me, dt, 1, dw, nullptr, dout, x, nullptr, rstd, rows, c, work, stream)) return -1;
  return 0;
}
#endif
