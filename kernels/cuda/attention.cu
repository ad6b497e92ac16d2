/* attention.cu: scaled dot-product attention, causal or not, forward and backward, in the
 * manner of FlashAttention-2 (kernels_cuda.h; reference k_sdpa_* in kernels/cpu/ref.c, which
 * keeps the [t, t] probabilities: these kernels never do).
 *
 * Layout: q, k, v, out [nb, t, d] (nb = batch * heads), scale = 1/sqrt(d). Head dims up to
 * DMAX (64 or 128, one entry each) are padded with zeros in registers and shared memory, so
 * the dot products run over DMAX with compile-time trip counts.
 *  - forward: a block of BR query rows (one thread each) walks the key/value tiles of BC rows
 *    staged in shared memory, with the online softmax: per tile, the running max m and sum l
 *    are rescaled once, and the output row is accumulated in registers. It saves lse = m + log l.
 *  - backward: delta_i = dout_i . out_i (one thread per row), then two kernels that recompute
 *    p_ij = exp(s_ij - lse_i) tile by tile: one owns a key row j and accumulates dk_j, dv_j over
 *    the query tiles; the other owns a query row i and accumulates dq_i over the key tiles.
 *    Splitting dq from dk/dv costs one more pass over the scores but needs no atomics, so the
 *    gradients are deterministic. Causal blocks skip the tiles the mask removes entirely. */
#include "cuda_common.h"

#define ATT_BR 64 /* rows per block: threads */

template <int DMAX> struct AttTile { enum { BC = DMAX > 64 ? 16 : 32 }; };

/* row i of a [t, d] matrix into registers, zero-padded to DMAX, times mul */
template <typename T, int DMAX>
__device__ __forceinline__ void load_row(float *r, const T *m, int i, int d, float mul) {
#pragma unroll
  for (int c = 0; c < DMAX; c++) r[c] = c < d ? ld(m[(long long)i * d + c]) * mul : 0.0f;
}

/* rows [r0, r0 + n) of a [t, d] matrix into shared s[n][DMAX] (zeros past t and d) */
template <typename T, int DMAX>
__device__ __forceinline__ void stage(float (*s)[DMAX], const T *m, int r0, int n, int t, int d) {
  for (int e = threadIdx.x; e < n * DMAX; e += blockDim.x) {
    int rr = e / DMAX, c = e % DMAX, row = r0 + rr;
    s[rr][c] = row < t && c < d ? ld(m[(long long)row * d + c]) : 0.0f;
  }
}

template <int DMAX> __device__ __forceinline__ float dot(const float *a, const float *b) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < DMAX; c++) s += a[c] * b[c];
  return s;
}

template <typename T, int DMAX>
__device__ __forceinline__ void att_fwd(T *out, float *lse, const T *q, const T *k, const T *v, int t,
                                        int d, int causal) {
  const int BC = AttTile<DMAX>::BC;
  __shared__ float ks[BC][DMAX], vs[BC][DMAX], ss[BC][ATT_BR]; /* ss: each thread's scores */
  long long z = blockIdx.y;
  const T *qz = q + z * t * d, *kz = k + z * t * d, *vz = v + z * t * d;
  int i = blockIdx.x * ATT_BR + threadIdx.x;
  float scale = 1.0f / sqrtf((float)d);
  float qr[DMAX], o[DMAX];
  if (i < t) load_row<T, DMAX>(qr, qz, i, d, scale);
#pragma unroll
  for (int c = 0; c < DMAX; c++) o[c] = 0.0f;
  float m = -CPLAN_INF, l = 0.0f;
  int kend = causal ? min(t, (int)(blockIdx.x + 1) * ATT_BR) : t;
  for (int k0 = 0; k0 < kend; k0 += BC) {
    __syncthreads();
    stage<T, DMAX>(ks, kz, k0, BC, t, d);
    stage<T, DMAX>(vs, vz, k0, BC, t, d);
    __syncthreads();
    if (i >= t) continue;
    float mt = m;
#pragma unroll 1
    for (int jj = 0; jj < BC; jj++) {
      int j = k0 + jj;
      bool ok = j < t && (!causal || j <= i);
      float s = ok ? dot<DMAX>(qr, ks[jj]) : -CPLAN_INF;
      ss[jj][threadIdx.x] = s;
      mt = fmaxf(mt, s);
    }
    if (mt == -CPLAN_INF) continue; /* every key of the tile masked */
    float corr = expf(m - mt);      /* 0 on the first tile (m = -inf) */
    l *= corr;
#pragma unroll
    for (int c = 0; c < DMAX; c++) o[c] *= corr;
#pragma unroll 1
    for (int jj = 0; jj < BC; jj++) {
      float p = expf(ss[jj][threadIdx.x] - mt); /* masked: exp(-inf) = 0 */
      l += p;
#pragma unroll
      for (int c = 0; c < DMAX; c++) o[c] += p * vs[jj][c];
    }
    m = mt;
  }
  if (i >= t) return;
  float inv = 1.0f / l;
  T *orow = out + (z * t + i) * d;
#pragma unroll
  for (int c = 0; c < DMAX; c++)
    if (c < d) orow[c] = st<T>(o[c] * inv);
  lse[z * t + i] = m + logf(l);
}

/* delta[z, i] = dout_i . out_i over nb * t rows */
template <typename T>
__device__ __forceinline__ void att_delta(float *delta, const T *dout, const T *out, long long rows, int d) {
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x) {
    float s = 0.0f;
    for (int c = 0; c < d; c++) s += ld(dout[r * d + c]) * ld(out[r * d + c]);
    delta[r] = s;
  }
}

/* one thread per key row j: dv_j += sum_i p_ij dout_i, dk_j += scale sum_i ds_ij q_i */
template <typename T, int DMAX>
__device__ __forceinline__ void att_bwd_dkdv(T *dk, T *dv, const T *dout, const float *lse, const float *delta,
                                             const T *q, const T *k, const T *v, int t, int d, int causal) {
  const int BC = AttTile<DMAX>::BC;
  __shared__ float qs[BC][DMAX], dos[BC][DMAX], ls[BC], ds_[BC];
  long long z = blockIdx.y;
  const T *qz = q + z * t * d, *kz = k + z * t * d, *vz = v + z * t * d, *doz = dout + z * t * d;
  int j = blockIdx.x * ATT_BR + threadIdx.x;
  float scale = 1.0f / sqrtf((float)d);
  float kr[DMAX], vr[DMAX], gk[DMAX], gv[DMAX];
  if (j < t) {
    load_row<T, DMAX>(kr, kz, j, d, 1.0f);
    load_row<T, DMAX>(vr, vz, j, d, 1.0f);
  }
#pragma unroll
  for (int c = 0; c < DMAX; c++) gk[c] = gv[c] = 0.0f;
  int q0 = causal ? (int)blockIdx.x * ATT_BR : 0; /* earlier queries see none of these keys */
  for (int i0 = q0; i0 < t; i0 += BC) {
    __syncthreads();
    stage<T, DMAX>(qs, qz, i0, BC, t, d);
    stage<T, DMAX>(dos, doz, i0, BC, t, d);
    for (int e = threadIdx.x; e < BC; e += blockDim.x) {
      ls[e] = i0 + e < t ? lse[z * t + i0 + e] : 0.0f;
      ds_[e] = i0 + e < t ? delta[z * t + i0 + e] : 0.0f;
    }
    __syncthreads();
    if (j >= t) continue;
#pragma unroll 1
    for (int ii = 0; ii < BC; ii++) {
      int i = i0 + ii;
      if (i >= t || (causal && i < j)) continue;
      float p = expf(dot<DMAX>(qs[ii], kr) * scale - ls[ii]);
      float dp = dot<DMAX>(dos[ii], vr);
      float ds = p * (dp - ds_[ii]);
#pragma unroll
      for (int c = 0; c < DMAX; c++) {
        gv[c] += p * dos[ii][c];
        gk[c] += ds * qs[ii][c];
      }
    }
  }
  if (j >= t) return;
  T *dkr = dk + (z * t + j) * d, *dvr = dv + (z * t + j) * d;
#pragma unroll
  for (int c = 0; c < DMAX; c++)
    if (c < d) {
      if (dk) dkr[c] = st<T>(ld(dkr[c]) + gk[c] * scale);
      if (dv) dvr[c] = st<T>(ld(dvr[c]) + gv[c]);
    }
}

/* one thread per query row i: dq_i += scale sum_j ds_ij k_j */
template <typename T, int DMAX>
__device__ __forceinline__ void att_bwd_dq(T *dq, const T *dout, const float *lse, const float *delta, const T *q,
                                           const T *k, const T *v, int t, int d, int causal) {
  const int BC = AttTile<DMAX>::BC;
  __shared__ float ks[BC][DMAX], vs[BC][DMAX];
  long long z = blockIdx.y;
  const T *qz = q + z * t * d, *kz = k + z * t * d, *vz = v + z * t * d, *doz = dout + z * t * d;
  int i = blockIdx.x * ATT_BR + threadIdx.x;
  float scale = 1.0f / sqrtf((float)d);
  float qr[DMAX], dor[DMAX], g[DMAX], li = 0.0f, di = 0.0f;
  if (i < t) {
    load_row<T, DMAX>(qr, qz, i, d, 1.0f);
    load_row<T, DMAX>(dor, doz, i, d, 1.0f);
    li = lse[z * t + i];
    di = delta[z * t + i];
  }
#pragma unroll
  for (int c = 0; c < DMAX; c++) g[c] = 0.0f;
  int kend = causal ? min(t, (int)(blockIdx.x + 1) * ATT_BR) : t;
  for (int k0 = 0; k0 < kend; k0 += BC) {
    __syncthreads();
    stage<T, DMAX>(ks, kz, k0, BC, t, d);
    stage<T, DMAX>(vs, vz, k0, BC, t, d);
    __syncthreads();
    if (i >= t) continue;
#pragma unroll 1
    for (int jj = 0; jj < BC; jj++) {
      int j = k0 + jj;
      if (j >= t || (causal && j > i)) continue;
      float p = expf(dot<DMAX>(qr, ks[jj]) * scale - li);
      float ds = p * (dot<DMAX>(dor, vs[jj]) - di);
#pragma unroll
      for (int c = 0; c < DMAX; c++) g[c] += ds * ks[jj][c];
    }
  }
  if (i >= t) return;
  T *dqr = dq + (z * t + i) * d;
#pragma unroll
  for (int c = 0; c < DMAX; c++)
    if (c < d) dqr[c] = st<T>(ld(dqr[c]) + g[c] * scale);
}

#define ATT_ENTRIES(T, S, DM)                                                                             \
  extern "C" __global__ void __launch_bounds__(ATT_BR) attention_forward_##S##_d##DM(                     \
      T *out, float *lse, const T *q, const T *k, const T *v, int t, int d, int causal) {                 \
    att_fwd<T, DM>(out, lse, q, k, v, t, d, causal);                                                      \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(ATT_BR) attention_backward_dkdv_##S##_d##DM(               \
      T *dk, T *dv, const T *dout, const float *lse, const float *delta, const T *q, const T *k,          \
      const T *v, int t, int d, int causal) {                                                             \
    att_bwd_dkdv<T, DM>(dk, dv, dout, lse, delta, q, k, v, t, d, causal);                                 \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(ATT_BR) attention_backward_dq_##S##_d##DM(                 \
      T *dq, const T *dout, const float *lse, const float *delta, const T *q, const T *k, const T *v,     \
      int t, int d, int causal) {                                                                         \
    att_bwd_dq<T, DM>(dq, dout, lse, delta, q, k, v, t, d, causal);                                       \
  }

ATT_ENTRIES(float, f32, 64)
ATT_ENTRIES(float, f32, 128)
ATT_ENTRIES(bf16, bf16, 64)
ATT_ENTRIES(fp16, f16, 64)
ATT_ENTRIES(bf16, bf16, 128)
ATT_ENTRIES(fp16, f16, 128)

extern "C" __global__ void attention_backward_delta_f32(float *delta, const float *dout, const float *out,
                                                        long long rows, int d) {
  att_delta<float>(delta, dout, out, rows, d);
}
extern "C" __global__ void attention_backward_delta_bf16(float *delta, const bf16 *dout, const bf16 *out,
                                                         long long rows, int d) {
  att_delta<bf16>(delta, dout, out, rows, d);
}
extern "C" __global__ void attention_backward_delta_f16(float *delta, const fp16 *dout, const fp16 *out,
                                                        long long rows, int d) {
  att_delta<fp16>(delta, dout, out, rows, d);
}

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

static const char *att_shape(const char *me, int nb, int t, int d) {
  (void)me;
  if (nb < 0 || t < 1 || d < 1) return "bad shape";
  if (d > 128) return "head dim above 128";
  if (nb > 65535) return "more than 65535 batch * heads";
  return NULL;
}

extern "C" int cplan_cuda_attention_forward(CplanDtype dt, void *out, float *lse, const void *q, const void *k,
                                            const void *v, int nb, int t, int d, int causal, cudaStream_t stream) {
  const char *me = "cplan_cuda_attention_forward";
  const char *bad = att_shape(me, nb, t, d);
  CPLAN_REQUIRE(me, !bad, "%s: [%d, %d, %d]", bad, nb, t, d);
  CPLAN_REQUIRE(me, out && lse && q && k && v, "out, lse, q, k and v must not be NULL");
  if (nb == 0) return 0;
  dim3 grid((unsigned)((t + ATT_BR - 1) / ATT_BR), (unsigned)nb);
  if (dt == CPLAN_F32 && d <= 64)
    attention_forward_f32_d64<<<grid, ATT_BR, 0, stream>>>((float *)out, lse, (const float *)q, (const float *)k,
                                                          (const float *)v, t, d, causal);
  else if (dt == CPLAN_F32)
    attention_forward_f32_d128<<<grid, ATT_BR, 0, stream>>>((float *)out, lse, (const float *)q, (const float *)k,
                                                           (const float *)v, t, d, causal);
  else if (dt == CPLAN_BF16 && d <= 64)
    attention_forward_bf16_d64<<<grid, ATT_BR, 0, stream>>>((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
                                                           (const bf16 *)v, t, d, causal);
  else if (dt == CPLAN_F16 && d <= 64)
    attention_forward_f16_d64<<<grid, ATT_BR, 0, stream>>>((fp16 *)out, lse, (const fp16 *)q, (const fp16 *)k,
                                                           (const fp16 *)v, t, d, causal);
  else if (dt == CPLAN_BF16)
    attention_forward_bf16_d128<<<grid, ATT_BR, 0, stream>>>((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
                                                            (const bf16 *)v, t, d, causal);
  else if (dt == CPLAN_F16)
    attention_forward_f16_d128<<<grid, ATT_BR, 0, stream>>>((fp16 *)out, lse, (const fp16 *)q, (const fp16 *)k,
                                                            (const fp16 *)v, t, d, causal);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}

template <typename T>
static void att_bwd_launch(void *dq, void *dk, void *dv, float *delta, const void *dout, const void *out,
                           const float *lse, const void *q, const void *k, const void *v, int nb, int t, int d,
                           int causal, cudaStream_t stream, bool d64);

#define ATT_BWD(T, S)                                                                                       \
  template <>                                                                                               \
  void att_bwd_launch<T>(void *dq, void *dk, void *dv, float *delta, const void *dout, const void *out,    \
                         const float *lse, const void *q, const void *k, const void *v, int nb, int t, int d, \
                         int causal, cudaStream_t stream, bool d64) {                                      \
    long long rows = (long long)nb * t;                                                                     \
    attention_backward_delta_##S<<<cplan_blocks(rows, 256, 65535u), 256, 0, stream>>>(                      \
        delta, (const T *)dout, (const T *)out, rows, d);                                                   \
    dim3 grid((unsigned)((t + ATT_BR - 1) / ATT_BR), (unsigned)nb);                                         \
    if (d64) {                                                                                              \
      if (dk || dv)                                                                                         \
        attention_backward_dkdv_##S##_d64<<<grid, ATT_BR, 0, stream>>>((T *)dk, (T *)dv, (const T *)dout,   \
            lse, delta, (const T *)q, (const T *)k, (const T *)v, t, d, causal);                            \
      if (dq)                                                                                               \
        attention_backward_dq_##S##_d64<<<grid, ATT_BR, 0, stream>>>((T *)dq, (const T *)dout, lse, delta,  \
            (const T *)q, (const T *)k, (const T *)v, t, d, causal);                                        \
    } else {                                                                                                \
      if (dk || dv)                                                                                         \
        attention_backward_dkdv_##S##_d128<<<grid, ATT_BR, 0, stream>>>((T *)dk, (T *)dv, (const T *)dout,  \
            lse, delta, (const T *)q, (const T *)k, (const T *)v, t, d, causal);                            \
      if (dq)                                                                                               \
        attention_backward_dq_##S##_d128<<<grid, ATT_BR, 0, stream>>>((T *)dq, (const T *)dout, lse, delta, \
            (const T *)q, (const T *)k, (const T *)v, t, d, causal);                                        \
    }                                                                                                       \
  }
ATT_BWD(float, f32)
ATT_BWD(bf16, bf16)
ATT_BWD(fp16, f16)

extern "C" int cplan_cuda_attention_backward(CplanDtype dt, void *dq, void *dk, void *dv, float *delta,
                                             const void *dout, const void *out, const float *lse, const void *q,
                                             const void *k, const void *v, int nb, int t, int d, int causal,
                                             cudaStream_t stream) {
  const char *me = "cplan_cuda_attention_backward";
  const char *bad = att_shape(me, nb, t, d);
  CPLAN_REQUIRE(me, !bad, "%s: [%d, %d, %d]", bad, nb, t, d);
  CPLAN_REQUIRE(me, delta && dout && out && lse && q && k && v, "delta, dout, out, lse, q, k and v must not be NULL");
  if (nb == 0 || (!dq && !dk && !dv)) return 0;
  if (dt == CPLAN_F32) att_bwd_launch<float>(dq, dk, dv, delta, dout, out, lse, q, k, v, nb, t, d, causal, stream, d <= 64);
  else if (dt == CPLAN_BF16) att_bwd_launch<bf16>(dq, dk, dv, delta, dout, out, lse, q, k, v, nb, t, d, causal, stream, d <= 64);
  else if (dt == CPLAN_F16) att_bwd_launch<fp16>(dq, dk, dv, delta, dout, out, lse, q, k, v, nb, t, d, causal, stream, d <= 64);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
  return cplan_cuda_launched(me);
}
#endif
