/* attention.cu: scaled dot-product attention, causal or not, forward and backward, in the
 * manner of FlashAttention-2 (kernels_cuda.h; reference k_sdpa_* in kernels/cpu/ref.c, which
 * keeps the [t, t] probabilities: these kernels never do; it has one length, these take tq
 * queries and tk keys).
 *
 * Layout: q, out [nb, tq, d] (nb = batch * heads), k, v [nb / group, tk, d], scale = 1/sqrt(d): with
 * group > 1, grouped-query attention (GQA; MQA at group = heads) as FlashAttention-2 runs it, k and
 * v read with fewer heads, never repeated in memory: query batch-head z = b * heads + hh reads kv
 * batch-head z / group = b * (heads / group) + hh / group. Each tensor lies in memory as its
 * CplanAttnLayout says (attn_layout.h: q and dq as lq, k, v, dk and dv as lkv, out and dout as lo;
 * lse and delta [nb, tq]). tq != tk is cross attention (an encoder-decoder's): its causal mask is
 * PyTorch's is_causal, top-left aligned, query i sees keys j <= i, the same test as at tq == tk, so
 * the tiles a causal block skips are the same too (a block of queries i0.. walks the key tiles up
 * to min(tk, its last query + 1); one of keys j0.. the query tiles from j0, none when j0 >= tq).
 * Every query sees key 0, so no softmax row is empty, unless a key-padding mask km [batch, tk] (in q's
 * dtype, the _m launchers; BERT's attention_mask) takes key j out where km[b, j] == 0: its scores are
 * -inf as a causal mask's, its dk and dv 0, and a tile of keys all masked adds nothing; a query with
 * no key left (every key masked) gets out = 0 and dq = 0, as PyTorch's sdpa (2.5 on) gives. The mask
 * is a template argument (KM): attention_kpm_* (f32) and attention_mma_kpm_* (bf16, f16) read it, the
 * others compile without it (ATT_KPM_ENTRIES). Head dims up to
 * DMAX (64, 128 or 256, one entry each: d <= 64, <= 128, <= 256; 256 is FlashAttention-2's limit
 * too) are padded with zeros in registers and shared memory, so the dot products run over DMAX
 * with compile-time trip counts. CPLAN_ATTN_MAX_HEAD_DIM (attn_layout.h) is the widest.
 *  - forward: a block of BR query rows (one thread each) walks the key/value tiles of BC rows
 *    staged in shared memory, with the online softmax: per tile, the running max m and sum l
 *    are rescaled once, and the output row is accumulated in registers. It saves lse = m + log l.
 *  - backward: delta_i = dout_i . out_i (one thread per row), then two kernels that recompute
 *    p_ij = exp(s_ij - lse_i) tile by tile: one owns a key row j and accumulates dk_j, dv_j over
 *    the query tiles (of each of the group's query heads in turn, into the same accumulators,
 *    stored once); the other owns a query row i and accumulates dq_i over the key tiles.
 *    Splitting dq from dk/dv costs one more pass over the scores but needs no atomics, so the
 *    gradients are deterministic. Causal blocks skip the tiles the mask removes entirely.
 *
 * Three implementations of that algorithm, one set of entry points each: f32 on the CUDA cores
 * (below; also bf16 / f16 with CPLAN_ATTENTION=simt), and bf16 / f16 on the tensor cores, through
 * nvcuda::wmma with the scores in shared memory (attention_tc_*, CPLAN_ATTENTION=wmma) or, the
 * default, through mma.sync with the scores in registers (attention_mma_*, last in this file).
 * WMMA has no 256 entries (its dk/dv kernel's accumulator fragments would not fit the registers):
 * with CPLAN_ATTENTION=wmma, heads above 128 run on mma.sync. The CUDA-core kernels hold a row
 * (two or four of them in the backward) in each thread's registers: they spill from 128 on (more at
 * 256), so only f32, which has no other kernels, has them at 256: with CPLAN_ATTENTION=simt, bf16
 * and f16 heads above 128 run on mma.sync too. */
#include "attn_layout.h"
#include "cuda_common.h"

#include <mma.h>

/* the offset of batch-head z's [t, d] matrix in a tensor laid out as L (attn_layout.h) */
__device__ __forceinline__ long long att_base(const CplanAttnLayout &L, long long z) {
  return z / L.heads * L.bstride + z % L.heads * L.hstride;
}

/* the key-padding mask's row for batch-head z of a tensor laid out as L (km: [batch, tk], NULL: none) */
template <typename T>
__device__ __forceinline__ const T *att_keys(const T *km, long long z, const CplanAttnLayout &L, int tk) {
  return km ? km + z / L.heads * tk : km;
}

/* key j takes part: no mask (kmz NULL), or its element is not 0 */
template <typename T> __device__ __forceinline__ bool key_on(const T *kmz, int j) { return !kmz || ld(kmz[j]) != 0.0f; }

#define ATT_BR 64 /* rows per block: threads */

/* key (query) rows per staged tile: at DMAX 256, 36 KiB of static shared memory (of 48) */
template <int DMAX> struct AttTile { enum { BC = DMAX > 64 ? 16 : 32 }; };

/* row i of a [t, d] matrix (rows lm elements apart) into registers, zero-padded to DMAX, times mul */
template <typename T, int DMAX>
__device__ __forceinline__ void load_row(float *r, const T *m, long long lm, int i, int d, float mul) {
#pragma unroll
  for (int c = 0; c < DMAX; c++) r[c] = c < d ? ld(m[(long long)i * lm + c]) * mul : 0.0f;
}

/* rows [r0, r0 + n) of a [t, d] matrix (rows lm elements apart) into shared s[n][DMAX] (zeros past
 * t and d) */
template <typename T, int DMAX>
__device__ __forceinline__ void stage(float (*s)[DMAX], const T *m, long long lm, int r0, int n, int t, int d) {
  for (int e = threadIdx.x; e < n * DMAX; e += blockDim.x) {
    int rr = e / DMAX, c = e % DMAX, row = r0 + rr;
    s[rr][c] = row < t && c < d ? ld(m[(long long)row * lm + c]) : 0.0f;
  }
}

template <int DMAX> __device__ __forceinline__ float dot(const float *a, const float *b) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < DMAX; c++) s += a[c] * b[c];
  return s;
}

template <typename T, int DMAX, bool KM>
__device__ __forceinline__ void att_fwd(T *out, float *lse, const T *q, const T *k, const T *v, const T *km,
                                        int tq, int tk, int d, int causal, int group, CplanAttnLayout lq,
                                        CplanAttnLayout lkv, CplanAttnLayout lo) {
  const int BC = AttTile<DMAX>::BC;
  __shared__ float ks[BC][DMAX], vs[BC][DMAX], ss[BC][ATT_BR]; /* ss: each thread's scores */
  long long z = blockIdx.y, bk = att_base(lkv, z / group);
  const T *qz = q + att_base(lq, z), *kz = k + bk, *vz = v + bk, *kmz = KM ? att_keys(km, z, lq, tk) : NULL;
  int i = blockIdx.x * ATT_BR + threadIdx.x;
  float scale = 1.0f / sqrtf((float)d);
  float qr[DMAX], o[DMAX];
  if (i < tq) load_row<T, DMAX>(qr, qz, lq.ld, i, d, scale);
#pragma unroll
  for (int c = 0; c < DMAX; c++) o[c] = 0.0f;
  float m = -CPLAN_INF, l = 0.0f;
  int kend = causal ? min(tk, (int)(blockIdx.x + 1) * ATT_BR) : tk;
  for (int k0 = 0; k0 < kend; k0 += BC) {
    __syncthreads();
    stage<T, DMAX>(ks, kz, lkv.ld, k0, BC, tk, d);
    stage<T, DMAX>(vs, vz, lkv.ld, k0, BC, tk, d);
    __syncthreads();
    if (i >= tq) continue;
    float mt = m;
#pragma unroll 1
    for (int jj = 0; jj < BC; jj++) {
      int j = k0 + jj;
      bool ok = j < tk && (!causal || j <= i) && key_on(kmz, j);
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
  if (i >= tq) return;
  float inv = KM && l == 0.0f ? 0.0f : 1.0f / l; /* a row with every key masked: 0, as PyTorch's sdpa */
  T *orow = out + att_base(lo, z) + (long long)i * lo.ld;
#pragma unroll
  for (int c = 0; c < DMAX; c++)
    if (c < d) orow[c] = st<T>(o[c] * inv);
  lse[z * tq + i] = m + logf(l);
}

/* delta[z, i] = dout_i . out_i over nb * t rows: a warp per row (its lanes read consecutive
 * elements: coalesced), the lanes' partial sums added in warp_reduce's fixed order */
template <typename T>
__device__ __forceinline__ void att_delta(float *delta, const T *dout, const T *out, long long rows, int t, int d,
                                          CplanAttnLayout lo) {
  int lane = threadIdx.x & 31;
  long long nw = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
    long long at = att_base(lo, r / t) + r % t * lo.ld;
    float s = 0.0f;
    for (int c = lane; c < d; c += 32) s += ld(dout[at + c]) * ld(out[at + c]);
    s = warp_reduce<false>(s);
    if (lane == 0) delta[r] = s;
  }
}

/* one thread per key row j of kv batch-head zk: dv_j += sum_i p_ij dout_i, dk_j += scale sum_i ds_ij q_i,
 * the sums over the queries of the group's query heads zk * group .. (acc = 0: = instead of +=, the
 * rows' old values never read) */
template <typename T, int DMAX, bool KM>
__device__ __forceinline__ void att_bwd_dkdv(T *dk, T *dv, const T *dout, const float *lse, const float *delta,
                                             const T *q, const T *k, const T *v, const T *km, int tq, int tk, int d,
                                             int causal, int acc, int group, CplanAttnLayout lq, CplanAttnLayout lkv,
                                             CplanAttnLayout lo) {
  const int BC = AttTile<DMAX>::BC;
  __shared__ float qs[BC][DMAX], dos[BC][DMAX], ls[BC], ds_[BC];
  long long zk = blockIdx.y, bk = att_base(lkv, zk);
  const T *kz = k + bk, *vz = v + bk;
  int j = blockIdx.x * ATT_BR + threadIdx.x;
  bool on = j < tk && (!KM || key_on(att_keys(km, zk, lkv, tk), j)); /* masked: no query sees it, dk = dv = 0 */
  float scale = 1.0f / sqrtf((float)d);
  float kr[DMAX], vr[DMAX], gk[DMAX], gv[DMAX];
  if (j < tk) {
    load_row<T, DMAX>(kr, kz, lkv.ld, j, d, 1.0f);
    load_row<T, DMAX>(vr, vz, lkv.ld, j, d, 1.0f);
  }
#pragma unroll
  for (int c = 0; c < DMAX; c++) gk[c] = gv[c] = 0.0f;
  int q0 = causal ? (int)blockIdx.x * ATT_BR : 0; /* earlier queries see none of these keys */
  /* the group's query heads in turn, into the same registers: dk and dv stored once, no atomics */
  for (long long z = zk * group; z < (zk + 1) * group; z++) {
    const T *qz = q + att_base(lq, z), *doz = dout + att_base(lo, z);
    const float *lz = lse + z * tq, *dz = delta + z * tq;
    for (int i0 = q0; i0 < tq; i0 += BC) {
      __syncthreads();
      stage<T, DMAX>(qs, qz, lq.ld, i0, BC, tq, d);
      stage<T, DMAX>(dos, doz, lo.ld, i0, BC, tq, d);
      for (int e = threadIdx.x; e < BC; e += blockDim.x) {
        ls[e] = i0 + e < tq ? lz[i0 + e] : 0.0f;
        ds_[e] = i0 + e < tq ? dz[i0 + e] : 0.0f;
      }
      __syncthreads();
      if (!on) continue;
#pragma unroll 1
      for (int ii = 0; ii < BC; ii++) {
        int i = i0 + ii;
        if (i >= tq || (causal && i < j)) continue;
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
  }
  if (j >= tk) return;
  T *dkr = dk + bk + (long long)j * lkv.ld, *dvr = dv + bk + (long long)j * lkv.ld;
#pragma unroll
  for (int c = 0; c < DMAX; c++)
    if (c < d) {
      if (dk) dkr[c] = st<T>((acc ? ld(dkr[c]) : 0.0f) + gk[c] * scale);
      if (dv) dvr[c] = st<T>((acc ? ld(dvr[c]) : 0.0f) + gv[c]);
    }
}

/* one thread per query row i: dq_i += scale sum_j ds_ij k_j */
template <typename T, int DMAX, bool KM>
__device__ __forceinline__ void att_bwd_dq(T *dq, const T *dout, const float *lse, const float *delta, const T *q,
                                           const T *k, const T *v, const T *km, int tq, int tk, int d, int causal,
                                           int acc, int group, CplanAttnLayout lq, CplanAttnLayout lkv,
                                           CplanAttnLayout lo) {
  const int BC = AttTile<DMAX>::BC;
  __shared__ float ks[BC][DMAX], vs[BC][DMAX];
  long long z = blockIdx.y, bq = att_base(lq, z), bk = att_base(lkv, z / group);
  const T *qz = q + bq, *kz = k + bk, *vz = v + bk, *doz = dout + att_base(lo, z);
  const T *kmz = KM ? att_keys(km, z, lq, tk) : NULL;
  int i = blockIdx.x * ATT_BR + threadIdx.x;
  float scale = 1.0f / sqrtf((float)d);
  float qr[DMAX], dor[DMAX], g[DMAX], lsi = 0.0f, di = 0.0f;
  if (i < tq) {
    load_row<T, DMAX>(qr, qz, lq.ld, i, d, 1.0f);
    load_row<T, DMAX>(dor, doz, lo.ld, i, d, 1.0f);
    lsi = lse[z * tq + i];
    di = delta[z * tq + i];
  }
#pragma unroll
  for (int c = 0; c < DMAX; c++) g[c] = 0.0f;
  int kend = causal ? min(tk, (int)(blockIdx.x + 1) * ATT_BR) : tk;
  for (int k0 = 0; k0 < kend; k0 += BC) {
    __syncthreads();
    stage<T, DMAX>(ks, kz, lkv.ld, k0, BC, tk, d);
    stage<T, DMAX>(vs, vz, lkv.ld, k0, BC, tk, d);
    __syncthreads();
    if (i >= tq) continue;
#pragma unroll 1
    for (int jj = 0; jj < BC; jj++) {
      int j = k0 + jj;
      if (j >= tk || (causal && j > i) || !key_on(kmz, j)) continue;
      float p = expf(dot<DMAX>(qr, ks[jj]) * scale - lsi);
      float ds = p * (dot<DMAX>(dor, vs[jj]) - di);
#pragma unroll
      for (int c = 0; c < DMAX; c++) g[c] += ds * ks[jj][c];
    }
  }
  if (i >= tq) return;
  T *dqr = dq + bq + (long long)i * lq.ld;
#pragma unroll
  for (int c = 0; c < DMAX; c++)
    if (c < d) dqr[c] = st<T>((acc ? ld(dqr[c]) : 0.0f) + g[c] * scale);
}

/* The extern "C" entries of one kernel set: NAME_forward_S_dDM, NAME_backward_dkdv_S_dDM and
 * NAME_backward_dq_S_dDM, calling FWD, DKDV and DQ<T, DM> with BOUNDS threads a block. */
#define ATT_ENTRY_SET(NAME, FWD, DKDV, DQ, FBOUNDS, BOUNDS, T, S, DM, X)                                  \
  extern "C" __global__ void __launch_bounds__(FBOUNDS) NAME##_forward_##S##_d##DM(                       \
      T *out, float *lse, const T *q, const T *k, const T *v, const T *km, int tq, int tk, int d,          \
      int causal, int group, CplanAttnLayout lq, CplanAttnLayout lkv, CplanAttnLayout lo) {               \
    FWD<T, DM X>(out, lse, q, k, v, km, tq, tk, d, causal, group, lq, lkv, lo);                           \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(BOUNDS) NAME##_backward_dkdv_##S##_d##DM(                  \
      T *dk, T *dv, const T *dout, const float *lse, const float *delta, const T *q, const T *k,          \
      const T *v, const T *km, int tq, int tk, int d, int causal, int acc, int group, CplanAttnLayout lq,  \
      CplanAttnLayout lkv, CplanAttnLayout lo) {                                                          \
    DKDV<T, DM X>(dk, dv, dout, lse, delta, q, k, v, km, tq, tk, d, causal, acc, group, lq, lkv, lo);     \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(BOUNDS) NAME##_backward_dq_##S##_d##DM(                    \
      T *dq, const T *dout, const float *lse, const float *delta, const T *q, const T *k, const T *v,     \
      const T *km, int tq, int tk, int d, int causal, int acc, int group, CplanAttnLayout lq,             \
      CplanAttnLayout lkv, CplanAttnLayout lo) {                                                          \
    DQ<T, DM X>(dq, dout, lse, delta, q, k, v, km, tq, tk, d, causal, acc, group, lq, lkv, lo);           \
  }
/* The key-padding mask is a compile-time choice (KM) of the kernels: NAME_kpm_* take it, NAME_* compile as
 * they did before it (its tests cost the unmasked kernels registers, and the CUDA-core ones spills). Only
 * the kernels a mask runs on have it, as each set doubles the compile time: f32's, here, and bf16 / f16's
 * default, mma.sync (a mask runs there whatever CPLAN_ATTENTION says). */
#define ATT_NO_KM , false
#define ATT_KM , true
#define ATT_ENTRIES(T, S, DM)                                                                                  \
  ATT_ENTRY_SET(attention, att_fwd, att_bwd_dkdv, att_bwd_dq, ATT_BR, ATT_BR, T, S, DM, ATT_NO_KM)
#define ATT_KPM_ENTRIES(T, S, DM)                                                                              \
  ATT_ENTRY_SET(attention_kpm, att_fwd, att_bwd_dkdv, att_bwd_dq, ATT_BR, ATT_BR, T, S, DM, ATT_KM)

ATT_ENTRIES(float, f32, 64)
ATT_ENTRIES(float, f32, 128)
ATT_ENTRIES(bf16, bf16, 64)
ATT_ENTRIES(fp16, f16, 64)
ATT_ENTRIES(bf16, bf16, 128)
ATT_ENTRIES(fp16, f16, 128)
ATT_ENTRIES(float, f32, 256) /* bf16 / f16 above 128 run on the tensor cores (their compile time, spills) */
ATT_KPM_ENTRIES(float, f32, 64)
ATT_KPM_ENTRIES(float, f32, 128)
ATT_KPM_ENTRIES(float, f32, 256)
/* the CUDA-core kernel of kind K (forward, backward_dkdv, backward_dq) for a launch with a mask: f32's
 * kpm kernel; bf16 / f16 with a mask never reach the CUDA-core launch (they run on mma.sync) */
#define ATT_SIMT_KPM_f32(K, DM) attention_kpm_##K##_f32_d##DM
#define ATT_SIMT_KPM_bf16(K, DM) attention_##K##_bf16_d##DM
#define ATT_SIMT_KPM_f16(K, DM) attention_##K##_f16_d##DM

extern "C" __global__ void attention_backward_delta_f32(float *delta, const float *dout, const float *out, long long rows,
                                                     int t, int d, CplanAttnLayout lo) {
  att_delta<float>(delta, dout, out, rows, t, d, lo);
}
extern "C" __global__ void attention_backward_delta_bf16(float *delta, const bf16 *dout, const bf16 *out, long long rows,
                                                     int t, int d, CplanAttnLayout lo) {
  att_delta<bf16>(delta, dout, out, rows, t, d, lo);
}
extern "C" __global__ void attention_backward_delta_f16(float *delta, const fp16 *dout, const fp16 *out, long long rows,
                                                     int t, int d, CplanAttnLayout lo) {
  att_delta<fp16>(delta, dout, out, rows, t, d, lo);
}

/* ---- tensor cores: bf16 / f16 attention on WMMA ---------------------------------------------
 * The same algorithm (FlashAttention-2: online softmax forward, lse saved; a dk/dv kernel per key
 * tile and a dq kernel per query tile, so no atomics and the gradients are deterministic), with
 * the products on tensor cores: nvcuda::wmma 16x16x16 tiles of bf16 / f16 operands accumulating
 * in f32. Blocks of 4 warps; each warp owns 16 rows (queries, or keys in dk/dv) and the block
 * walks tiles of 64 rows of the other side, staged in shared memory (dynamic, zero-padded past t
 * and d; head dims up to TD = 64 or 128: wider heads run on the mma.sync kernels below). The element layout of a WMMA accumulator is opaque, so
 * scores go through shared memory: the warp stores S (and dP), its lanes (two per row) apply the
 * scale, mask and softmax, and write P (dS) back in the operand type for the next product. The
 * forward's running output lives in shared memory too, where the lanes rescale its rows when the
 * running max changes; the backward's dk, dv and dq stay in accumulator fragments. P and dS are
 * rounded to the operand type before their products (as FlashAttention does); the statistics m,
 * l, lse and delta are f32. The f32 kernels above stay on the CUDA cores. */
#define TC_W 4         /* warps per block */
#define TC_R 64        /* rows per tile: 16 per warp */

/* rows [r0, r0 + n) of a [t, d] matrix (rows lm elements apart) into s[n][ld] (ld >= TD, a
 * multiple of 8), zeros past t and d: 16 bytes (8 elements) a load where d and lm are multiples of
 * 8 and m 16-byte aligned */
template <typename T, int TD>
__device__ __forceinline__ void tc_stage(T *s, int ld, const T *m, long long lm, int r0, int n, int t, int d) {
  if (d % 8 == 0 && lm % 8 == 0 && ((unsigned long long)m & 15) == 0) {
    for (int e = threadIdx.x; e < n * (TD / 8); e += blockDim.x) {
      int rr = e / (TD / 8), c = e % (TD / 8) * 8, row = r0 + rr;
      uint4 x = make_uint4(0u, 0u, 0u, 0u); /* 8 zeros of a 16-bit type */
      if (row < t && c < d) x = *(const uint4 *)(m + (long long)row * lm + c);
      *(uint4 *)(s + rr * ld + c) = x;
    }
    return;
  }
  for (int e = threadIdx.x; e < n * TD; e += blockDim.x) {
    int rr = e / TD, c = e % TD, row = r0 + rr;
    s[rr * ld + c] = row < t && c < d ? m[(long long)row * lm + c] : st<T>(0.0f);
  }
}

template <typename T, int TD> struct TcDims {
  enum {
    LQ = TD + 8,                       /* operand rows (T): a multiple of 8, 32-byte aligned tiles */
    LS = TC_R + 4,                     /* f32 score rows */
    LP = TC_R + 8,                     /* operand-type score rows */
    LO = TD + 4,                       /* f32 output rows */
    TILE = TC_R * LQ * (int)sizeof(T), /* one staged [64, TD] tile */
    FWD = 3 * TILE + TC_W * 16 * (LS * 4 + LP * (int)sizeof(T) + LO * 4),
    BWD = 4 * TILE + 2 * TC_R * 4 + TC_W * 16 * (2 * LS * 4 + 2 * LP * (int)sizeof(T))
  };
};

/* dst (16 x TC_R, f32, ld LS) = scale-free product of the warp's 16 rows of a ([.., LQ]) and the
 * TC_R rows of b ([TC_R, LQ]) transposed: a_w b^T over TD */
template <typename T, int TD>
__device__ __forceinline__ void tc_abt(float *dst, const T *aw, const T *b) {
  using namespace nvcuda;
  const int LQ = TcDims<T, TD>::LQ, LS = TcDims<T, TD>::LS;
#pragma unroll
  for (int nb = 0; nb < TC_R / 16; nb++) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::fill_fragment(c, 0.0f);
#pragma unroll
    for (int kb = 0; kb < TD / 16; kb++) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, aw + kb * 16, LQ);
      wmma::load_matrix_sync(fb, b + nb * 16 * LQ + kb * 16, LQ);
      wmma::mma_sync(c, fa, fb, c);
    }
    wmma::store_matrix_sync(dst + nb * 16, c, LS, wmma::mem_row_major);
  }
}

/* acc[nb] (16 x TD in 16-column fragments) += p (16 x TC_R, ld LP) times b ([TC_R, LQ]) */
template <typename T, int TD>
__device__ __forceinline__ void tc_pb(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> *acc,
                                      const T *p, const T *b) {
  using namespace nvcuda;
  const int LQ = TcDims<T, TD>::LQ, LP = TcDims<T, TD>::LP;
#pragma unroll
  for (int kb = 0; kb < TC_R / 16; kb++) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, p + kb * 16, LP);
#pragma unroll
    for (int nb = 0; nb < TD / 16; nb++) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b + kb * 16 * LQ + nb * 16, LQ);
      wmma::mma_sync(acc[nb], fa, fb, acc[nb]);
    }
  }
}

template <typename T, int TD, bool KM>
__device__ __forceinline__ void tc_fwd(T *out, float *lse, const T *q, const T *k, const T *v, const T * /* km */, int tq,
                                       int tk, int d, int causal, int group, CplanAttnLayout lq, CplanAttnLayout lkv,
                                       CplanAttnLayout lo) {
  using namespace nvcuda;
  typedef TcDims<T, TD> Dm;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T *qs = (T *)tc_smem, *ks = (T *)(tc_smem + Dm::TILE), *vs = (T *)(tc_smem + 2 * Dm::TILE);
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, h = lane & 1;
  float *sw = (float *)(tc_smem + 3 * Dm::TILE) + w * 16 * Dm::LS;
  T *pw = (T *)(tc_smem + 3 * Dm::TILE + TC_W * 16 * Dm::LS * 4) + w * 16 * Dm::LP;
  float *ow = (float *)(tc_smem + 3 * Dm::TILE + TC_W * 16 * (Dm::LS * 4 + Dm::LP * (int)sizeof(T))) + w * 16 * Dm::LO;
  long long z = blockIdx.y, bk = att_base(lkv, z / group);
  static_assert(!KM, "a key-padding mask runs on mma.sync (ATT_KPM_ENTRIES)");
  const T *qz = q + att_base(lq, z), *kz = k + bk, *vz = v + bk;
  int i0 = blockIdx.x * TC_R, i = i0 + w * 16 + r;
  float scale = 1.0f / sqrtf((float)d);
  tc_stage<T, TD>(qs, Dm::LQ, qz, lq.ld, i0, TC_R, tq, d);
  for (int e = lane; e < 16 * Dm::LO; e += 32) ow[e] = 0.0f;
  float m = -CPLAN_INF, l = 0.0f;
  int kend = causal ? min(tk, i0 + TC_R) : tk;
  for (int k0 = 0; k0 < kend; k0 += TC_R) {
    __syncthreads();
    tc_stage<T, TD>(ks, Dm::LQ, kz, lkv.ld, k0, TC_R, tk, d);
    tc_stage<T, TD>(vs, Dm::LQ, vz, lkv.ld, k0, TC_R, tk, d);
    __syncthreads();
    tc_abt<T, TD>(sw, qs + w * 16 * Dm::LQ, ks);
    __syncwarp();
    float *srow = sw + r * Dm::LS, mt = m;
    for (int jj = h * (TC_R / 2); jj < (h + 1) * (TC_R / 2); jj++) {
      int j = k0 + jj;
      float s = i < tq && j < tk && (!causal || j <= i) ? srow[jj] * scale : -CPLAN_INF;
      srow[jj] = s;
      mt = fmaxf(mt, s);
    }
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    float corr = mt == -CPLAN_INF ? 1.0f : expf(m - mt), ls = 0.0f;
    T *prow = pw + r * Dm::LP;
    for (int jj = h * (TC_R / 2); jj < (h + 1) * (TC_R / 2); jj++) {
      T p = st<T>(mt == -CPLAN_INF ? 0.0f : expf(srow[jj] - mt));
      prow[jj] = p;
      ls += ld(p); /* the sum of what the product uses */
    }
    ls += __shfl_xor_sync(0xffffffffu, ls, 1);
    l = l * corr + ls;
    m = mt;
    if (corr != 1.0f)
      for (int c = h * (TD / 2); c < (h + 1) * (TD / 2); c++) ow[r * Dm::LO + c] *= corr;
    __syncwarp();
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[TD / 16];
#pragma unroll
    for (int nb = 0; nb < TD / 16; nb++) wmma::load_matrix_sync(acc[nb], ow + nb * 16, Dm::LO, wmma::mem_row_major);
    tc_pb<T, TD>(acc, pw, vs);
#pragma unroll
    for (int nb = 0; nb < TD / 16; nb++) wmma::store_matrix_sync(ow + nb * 16, acc[nb], Dm::LO, wmma::mem_row_major);
    __syncwarp();
  }
  if (i >= tq) return;
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T *orow = out + att_base(lo, z) + (long long)i * lo.ld;
  for (int c = h; c < d; c += 2) orow[c] = st<T>(ow[r * Dm::LO + c] * inv);
  if (h == 0) lse[z * tq + i] = m + logf(l);
}

/* the warp's 16 accumulated rows (rows row0.. of g, this batch-head's [t, d] gradient; NULL: not
 * wanted): g += mul * acc (add = 0: g = mul * acc, g's old values never read), through buf (16 x LO f32) */
template <typename T, int TD>
__device__ __forceinline__ void tc_add_rows(T *g, long long lg, const nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> *acc,
                                            float *buf, int row0, int t, int d, float mul, int add) {
  using namespace nvcuda;
  const int LO = TcDims<T, TD>::LO;
  int lane = threadIdx.x & 31, r = lane >> 1, h = lane & 1;
  __syncwarp();
#pragma unroll
  for (int nb = 0; nb < TD / 16; nb++) wmma::store_matrix_sync(buf + nb * 16, acc[nb], LO, wmma::mem_row_major);
  __syncwarp();
  if (g && row0 + r < t)
    for (int c = h; c < d; c += 2) {
      T *x = g + (long long)(row0 + r) * lg + c;
      *x = st<T>((add ? ld(*x) : 0.0f) + mul * buf[r * LO + c]);
    }
  __syncwarp();
}

/* dk/dv: the block owns 64 keys (16 per warp) of kv batch-head zk and walks the query tiles of the
 * group's query heads in turn, accumulating in the same fragments: dk and dv stored once, no atomics */
template <typename T, int TD, bool KM>
__device__ __forceinline__ void tc_bwd_dkdv(T *dk, T *dv, const T *dout, const float *lse, const float *delta,
                                            const T *q, const T *k, const T *v, const T * /* km */, int tq, int tk, int d,
                                            int causal, int acc, int group, CplanAttnLayout lq, CplanAttnLayout lkv,
                                            CplanAttnLayout lo) {
  using namespace nvcuda;
  typedef TcDims<T, TD> Dm;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T *ks = (T *)tc_smem, *vs = (T *)(tc_smem + Dm::TILE), *qs = (T *)(tc_smem + 2 * Dm::TILE),
    *dos = (T *)(tc_smem + 3 * Dm::TILE);
  float *lss = (float *)(tc_smem + 4 * Dm::TILE), *dls = lss + TC_R;
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, h = lane & 1;
  unsigned char *wb = tc_smem + 4 * Dm::TILE + 2 * TC_R * 4;
  float *sw = (float *)wb + w * 32 * Dm::LS, *dpw = sw + 16 * Dm::LS; /* also the output buffer */
  T *pw = (T *)(wb + TC_W * 32 * Dm::LS * 4) + w * 32 * Dm::LP, *dsw = pw + 16 * Dm::LP;
  long long zk = blockIdx.y, bk = att_base(lkv, zk);
  const T *kz = k + bk, *vz = v + bk;
  int j0 = blockIdx.x * TC_R, j = j0 + w * 16 + r;
  static_assert(!KM, "a key-padding mask runs on mma.sync (ATT_KPM_ENTRIES)");
  float scale = 1.0f / sqrtf((float)d);
  tc_stage<T, TD>(ks, Dm::LQ, kz, lkv.ld, j0, TC_R, tk, d);
  tc_stage<T, TD>(vs, Dm::LQ, vz, lkv.ld, j0, TC_R, tk, d);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> gk[TD / 16], gv[TD / 16];
#pragma unroll
  for (int nb = 0; nb < TD / 16; nb++) wmma::fill_fragment(gk[nb], 0.0f), wmma::fill_fragment(gv[nb], 0.0f);
  for (long long z = zk * group; z < (zk + 1) * group; z++) {
    const T *qz = q + att_base(lq, z), *doz = dout + att_base(lo, z);
    const float *lz = lse + z * tq, *dz = delta + z * tq; /* not z * tq at each tile: at TD 64, sm_80 spilled */
    for (int i0 = causal ? j0 : 0; i0 < tq; i0 += TC_R) { /* earlier queries see none of these keys */
      __syncthreads();
      tc_stage<T, TD>(qs, Dm::LQ, qz, lq.ld, i0, TC_R, tq, d);
      tc_stage<T, TD>(dos, Dm::LQ, doz, lo.ld, i0, TC_R, tq, d);
      for (int e = threadIdx.x; e < TC_R; e += blockDim.x) {
        lss[e] = i0 + e < tq ? lz[i0 + e] : 0.0f;
        dls[e] = i0 + e < tq ? dz[i0 + e] : 0.0f;
      }
      __syncthreads();
      tc_abt<T, TD>(sw, ks + w * 16 * Dm::LQ, qs);   /* S^T: [16 keys, 64 queries] */
      tc_abt<T, TD>(dpw, vs + w * 16 * Dm::LQ, dos); /* dP^T */
      __syncwarp();
      for (int ii = h * (TC_R / 2); ii < (h + 1) * (TC_R / 2); ii++) {
        int i = i0 + ii;
        bool ok = j < tk && i < tq && (!causal || i >= j);
        float p = ok ? expf(sw[r * Dm::LS + ii] * scale - lss[ii]) : 0.0f;
        pw[r * Dm::LP + ii] = st<T>(p);
        dsw[r * Dm::LP + ii] = st<T>(p * (dpw[r * Dm::LS + ii] - dls[ii]));
      }
      __syncwarp();
      tc_pb<T, TD>(gv, pw, dos); /* dv += P^T dO */
      tc_pb<T, TD>(gk, dsw, qs); /* dk += dS^T Q (times scale at the end) */
    }
  }
  tc_add_rows<T, TD>(dv ? dv + bk : dv, lkv.ld, gv, sw, j0 + w * 16, tk, d, 1.0f, acc);
  tc_add_rows<T, TD>(dk ? dk + bk : dk, lkv.ld, gk, sw, j0 + w * 16, tk, d, scale, acc);
}

/* dq: the block owns 64 queries (16 per warp) and walks the key tiles */
template <typename T, int TD, bool KM>
__device__ __forceinline__ void tc_bwd_dq(T *dq, const T *dout, const float *lse, const float *delta, const T *q,
                                          const T *k, const T *v, const T * /* km */, int tq, int tk, int d, int causal,
                                          int acc, int group, CplanAttnLayout lq, CplanAttnLayout lkv,
                                          CplanAttnLayout lo) {
  using namespace nvcuda;
  typedef TcDims<T, TD> Dm;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T *qs = (T *)tc_smem, *dos = (T *)(tc_smem + Dm::TILE), *ks = (T *)(tc_smem + 2 * Dm::TILE),
    *vs = (T *)(tc_smem + 3 * Dm::TILE);
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, h = lane & 1;
  unsigned char *wb = tc_smem + 4 * Dm::TILE + 2 * TC_R * 4;
  float *sw = (float *)wb + w * 32 * Dm::LS, *dpw = sw + 16 * Dm::LS;
  T *dsw = (T *)(wb + TC_W * 32 * Dm::LS * 4) + w * 32 * Dm::LP;
  long long z = blockIdx.y, bq = att_base(lq, z), bk = att_base(lkv, z / group);
  static_assert(!KM, "a key-padding mask runs on mma.sync (ATT_KPM_ENTRIES)");
  const T *qz = q + bq, *kz = k + bk, *vz = v + bk, *doz = dout + att_base(lo, z);
  int i0 = blockIdx.x * TC_R, i = i0 + w * 16 + r;
  float scale = 1.0f / sqrtf((float)d);
  float lsi = i < tq ? lse[z * tq + i] : 0.0f, di = i < tq ? delta[z * tq + i] : 0.0f;
  tc_stage<T, TD>(qs, Dm::LQ, qz, lq.ld, i0, TC_R, tq, d);
  tc_stage<T, TD>(dos, Dm::LQ, doz, lo.ld, i0, TC_R, tq, d);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> g[TD / 16];
#pragma unroll
  for (int nb = 0; nb < TD / 16; nb++) wmma::fill_fragment(g[nb], 0.0f);
  int kend = causal ? min(tk, i0 + TC_R) : tk;
  for (int k0 = 0; k0 < kend; k0 += TC_R) {
    __syncthreads();
    tc_stage<T, TD>(ks, Dm::LQ, kz, lkv.ld, k0, TC_R, tk, d);
    tc_stage<T, TD>(vs, Dm::LQ, vz, lkv.ld, k0, TC_R, tk, d);
    __syncthreads();
    tc_abt<T, TD>(sw, qs + w * 16 * Dm::LQ, ks);   /* S: [16 queries, 64 keys] */
    tc_abt<T, TD>(dpw, dos + w * 16 * Dm::LQ, vs); /* dP */
    __syncwarp();
    for (int jj = h * (TC_R / 2); jj < (h + 1) * (TC_R / 2); jj++) {
      int j = k0 + jj;
      bool ok = i < tq && j < tk && (!causal || j <= i);
      float p = ok ? expf(sw[r * Dm::LS + jj] * scale - lsi) : 0.0f;
      dsw[r * Dm::LP + jj] = st<T>(p * (dpw[r * Dm::LS + jj] - di));
    }
    __syncwarp();
    tc_pb<T, TD>(g, dsw, ks); /* dq += dS K (times scale at the end) */
  }
  tc_add_rows<T, TD>(dq + bq, lq.ld, g, sw, i0 + w * 16, tq, d, scale, acc);
}

#define ATT_TC_ENTRIES(T, S, TD)                                                                               \
  ATT_ENTRY_SET(attention_tc, tc_fwd, tc_bwd_dkdv, tc_bwd_dq, TC_W * 32, TC_W * 32, T, S, TD, ATT_NO_KM)

ATT_TC_ENTRIES(bf16, bf16, 64)
ATT_TC_ENTRIES(bf16, bf16, 128)
ATT_TC_ENTRIES(fp16, f16, 64)
ATT_TC_ENTRIES(fp16, f16, 128)

/* ---- tensor cores: bf16 / f16 attention on mma.sync, the scores in registers ----------------
 * The same algorithm again (FlashAttention-2, the same three kernels, deterministic), written as
 * FlashAttention-2 itself is: each warp owns 16 rows, and every product is a sequence of
 * mma.sync.m16n8k16 (cuda_common.h's mma16816) whose fragment layout is documented, so the
 * scores never leave the registers. The lanes holding a row (four: g = lane / 4 is the row, 2q
 * and 2q + 1 its columns in each 8-column tile) take its max and sum with two shuffles; the
 * accumulator layout of S (C) is the operand layout of P (A), so P and dS go from one product to
 * the next in registers, rounded to the operand type (as the WMMA kernels and FlashAttention do;
 * the forward's row sum l adds the rounded P that the product uses, as the WMMA kernel's does);
 * the forward's output is rescaled in registers. Operands come from shared memory, row-major
 * [rows, TD + 8] tiles (8 elements of padding: the fragment loads of a warp hit 32 distinct
 * banks) and, for a product whose B operand runs down the rows (P V, P^T dO, dS^T Q, dS K),
 * transposed [TD, tile + 8] tiles. The exponentials are exp2 of scores scaled by log2(e) / sqrt(d).
 *  - forward: a block of 64 queries walks 64-key tiles; Q's fragments stay in registers (at TD
 *    256: 32-key tiles, Q's fragments read from shared memory at each tile, as FlashAttention-2
 *    reads them for d 256, so the output's 128 registers a thread fit).
 *  - dk/dv: 64 keys a block, query tiles of 64 (32 at TD 128 and 256, to keep the scores, dk and dv
 *    in registers); a warp skips a causal tile whose queries all precede its keys. At TD 256 the
 *    block has 8 warps, two per 16 keys: both compute the keys' S^T and dP^T over all of TD, each
 *    accumulates half of dk's and dv's columns (FaDims::CS).
 *  - dq: 64 queries a block, key tiles of 64 (32 at TD 256).
 * Shared memory at TD 256 (bf16 / f16): forward 69.5 KiB, dk/dv 139.3 KiB, dq 119 KiB (of the 227
 * KiB a block may opt in to on sm_80 / sm_90). */
#define FA_W 4  /* warps per block: 16 rows each */
#define FA_R 64 /* rows a block owns */
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

template <typename T, int TD> struct FaDims {
  enum {
    BK = TD > 128 ? 32 : 64, /* keys per tile (forward, dq) */
    BQ = TD > 64 ? 32 : 64,  /* queries per tile (dk/dv) */
    QREG = TD <= 128,        /* the forward keeps Q's fragments in registers (else reads them from shared memory) */
    CS = TD > 128 ? 2 : 1,   /* dk/dv: warps sharing a warp's 16 keys, each with TD / CS columns of dk and dv */
    WKV = FA_W * CS,         /* dk/dv: warps per block */
    LD = TD + 8,             /* row-major tiles' row length */
    LK = BK + 8,             /* transposed key tiles' row length */
    LQ = BQ + 8,             /* transposed query tiles' row length */
    FWD = ((QREG ? 0 : FA_R * LD) + (QREG ? FA_R : BK) * LD + TD * LK) * (int)sizeof(T),
    DKDV = (2 * FA_R * LD + 2 * BQ * LD + 2 * TD * LQ) * (int)sizeof(T) + 2 * BQ * 4,
    DQ = (2 * FA_R * LD + 2 * BK * LD + TD * LK) * (int)sizeof(T)
  };
};
/* the opt-in limit of sm_80 / sm_90: 227 KiB of dynamic shared memory a block */
static_assert(FaDims<bf16, 256>::FWD <= 227 * 1024 && FaDims<bf16, 256>::DKDV <= 227 * 1024 &&
                  FaDims<bf16, 256>::DQ <= 227 * 1024 && TcDims<bf16, 128>::FWD <= 227 * 1024 &&
                  TcDims<bf16, 128>::BWD <= 227 * 1024,
              "attention tiles above 227 KiB of shared memory");

/* two adjacent 16-bit elements of shared memory as one register */
template <typename T> __device__ __forceinline__ unsigned fa_ld2(const T *p) {
#ifdef CPLAN_CUDA_EMU
  unsigned u;
  memcpy(&u, p, 4);
  return u;
#else
  return *(const unsigned *)p;
#endif
}

/* the A fragment (16 x 16) of a row-major tile s (row length ld) at its rows 0..15, columns k0.. */
template <typename T> __device__ __forceinline__ void fa_frag_a(unsigned *a, const T *s, int ld, int k0) {
  int lane = threadIdx.x & 31;
  const T *p = s + (lane >> 2) * ld + k0 + 2 * (lane & 3);
  a[0] = fa_ld2(p);
  a[1] = fa_ld2(p + 8 * ld);
  a[2] = fa_ld2(p + 8);
  a[3] = fa_ld2(p + 8 * ld + 8);
}

/* the B fragment (16 x 8) with B[k][n] = s[(n0 + n) * ld + k0 + k]: B's columns are s's rows */
template <typename T> __device__ __forceinline__ void fa_frag_b(unsigned *b, const T *s, int ld, int n0, int k0) {
  int lane = threadIdx.x & 31;
  const T *p = s + (n0 + (lane >> 2)) * ld + k0 + 2 * (lane & 3);
  b[0] = fa_ld2(p);
  b[1] = fa_ld2(p + 8);
}

template <typename T> __device__ __forceinline__ T fa_from_bits(unsigned short h);
template <> __device__ __forceinline__ bf16 fa_from_bits<bf16>(unsigned short h) { return __ushort_as_bfloat16(h); }
template <> __device__ __forceinline__ fp16 fa_from_bits<fp16>(unsigned short h) { return __ushort_as_half(h); }

/* rows [r0, r0 + n) of a [t, d] matrix (rows lm elements apart) transposed into s[TD][ld]
 * (s[c * ld + r] = m[r0 + r][c]), zeros past t and d: 8 elements a load where d and lm are
 * multiples of 8 and m 16-byte aligned */
template <typename T, int TD>
__device__ __forceinline__ void fa_stage_t(T *s, int ld, const T *m, long long lm, int r0, int n, int t, int d) {
  if (d % 8 == 0 && lm % 8 == 0 && ((unsigned long long)m & 15) == 0) {
    for (int e = threadIdx.x; e < n * (TD / 8); e += blockDim.x) {
      int rr = e % n, c = e / n * 8, row = r0 + rr;
      union {
        uint4 v;
        unsigned short h[8];
      } x;
      x.v = make_uint4(0u, 0u, 0u, 0u);
      if (row < t && c < d) x.v = *(const uint4 *)(m + (long long)row * lm + c);
#pragma unroll
      for (int u = 0; u < 8; u++) s[(c + u) * ld + rr] = fa_from_bits<T>(x.h[u]);
    }
    return;
  }
  for (int e = threadIdx.x; e < n * TD; e += blockDim.x) {
    int rr = e % n, c = e / n, row = r0 + rr;
    s[c * ld + rr] = row < t && c < d ? m[(long long)row * lm + c] : st<T>(0.0f);
  }
}

/* acc[nt] (16 x 8 each, NT of them) = 0, then += a (16 rows of a row-major tile, TD columns) times
 * the B operand whose columns are the rows n0.. of the row-major tile b: a b^T over TD */
template <typename T, int TD, int NT>
__device__ __forceinline__ void fa_abt(float (*acc)[4], const T *a, const T *b, int ld) {
#pragma unroll
  for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < TD / 16; kk++) {
    unsigned fa[4];
    fa_frag_a(fa, a, ld, kk * 16);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
      unsigned fb[2];
      fa_frag_b(fb, b, ld, nt * 8, kk * 16);
      mma16816<T>(acc[nt], fa, fb);
    }
  }
}

/* an 8-column tile of an earlier product's accumulator (rows g: c[0..1], g + 8: c[2..3]) rounded
 * to T and packed: pf[0] row g, pf[1] row g + 8, which is half of an A fragment (fa_pb) */
template <typename T> __device__ __forceinline__ void fa_pack(unsigned *pf, float c0, float c1, float c2, float c3) {
  pf[0] = pack2<T>(c0, c1);
  pf[1] = pack2<T>(c2, c3);
}

/* the sum of the two values packed in u */
template <typename T> __device__ __forceinline__ float fa_sum2(unsigned u);
template <> __device__ __forceinline__ float fa_sum2<bf16>(unsigned u) {
  return __uint_as_float(u << 16) + __uint_as_float(u & 0xffff0000u);
}
template <> __device__ __forceinline__ float fa_sum2<fp16>(unsigned u) {
  return __half2float(__ushort_as_half((unsigned short)(u & 0xffffu))) + __half2float(__ushort_as_half((unsigned short)(u >> 16)));
}

/* acc[nd] (16 x TD) += p (16 x 16 * KT: fa_pack's 8-column tiles pf[0 .. 2 KT)) times the B
 * operand whose columns are the rows of the transposed tile bt (row length ld) */
template <typename T, int TD, int KT>
__device__ __forceinline__ void fa_pb(float (*acc)[4], const unsigned (*pf)[2], const T *bt, int ld) {
#pragma unroll
  for (int kk = 0; kk < KT; kk++) {
    unsigned fa[4] = {pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0], pf[2 * kk + 1][1]};
#pragma unroll
    for (int nd = 0; nd < TD / 8; nd++) {
      unsigned fb[2];
      fa_frag_b(fb, bt, ld, nd * 8, kk * 16);
      mma16816<T>(acc[nd], fa, fb);
    }
  }
}

/* the warp's rows ra (acc[.][0..1]) and ra + 8 (acc[.][2..3]) into g (a [t, d] matrix; NULL: not
 * wanted): g = mul * acc, plus g's old value when add */
template <typename T, int TD>
__device__ __forceinline__ void fa_store(T *g, long long lg, const float (*acc)[4], int ra, int t, int d, float mul0, float mul1,
                                         int add) {
  if (!g) return;
  int c0 = 2 * (threadIdx.x & 3);
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int row = ra + 8 * h;
    if (row >= t) continue;
    T *x = g + (long long)row * lg;
    float mul = h ? mul1 : mul0;
#pragma unroll
    for (int nd = 0; nd < TD / 8; nd++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        int c = nd * 8 + c0 + e;
        if (c < d) x[c] = st<T>((add ? ld(x[c]) : 0.0f) + mul * acc[nd][2 * h + e]);
      }
  }
}

/* -inf into the elements of the warp's scores s (16 x 8 NT: rows r0 + g and r0 + g + 8, columns
 * c0 + 8 nt + 2q and + 1) that the mask removes: past tr (rows) or tc (columns), causal, a key after its
 * query (qrows: the rows are queries, else keys), and a column whose element of kcols (the key-padding
 * mask's row, for qrows; NULL: none) is 0. A tile that needs none of it skips the call. */
template <int NT, typename T>
__device__ __forceinline__ void fa_mask(float (*s)[4], int r0, int c0, int tr, int tc, int causal, bool qrows,
                                        const T *kcols) {
  int lane = threadIdx.x & 31, g = lane >> 2, cq = 2 * (lane & 3);
#pragma unroll
  for (int nt = 0; nt < NT; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int row = r0 + g + (e < 2 ? 0 : 8), col = c0 + nt * 8 + cq + (e & 1);
      if (row >= tr || col >= tc || (causal && (qrows ? col > row : col < row)) || !key_on(kcols, col))
        s[nt][e] = -CPLAN_INF;
    }
}

template <typename T, int TD, bool KM>
__device__ __forceinline__ void fa_fwd(T *out, float *lse, const T *q, const T *k, const T *v, const T *km, int tq,
                                       int tk, int d, int causal, int group, CplanAttnLayout lq, CplanAttnLayout lkv,
                                       CplanAttnLayout lo) {
  typedef FaDims<T, TD> Dm;
  const int NT = Dm::BK / 8;
  extern __shared__ __align__(128) unsigned char fa_smem[];
  /* QREG: ks holds Q first, its fragments go to registers; else Q stays in qs, ahead of ks */
  T *qs = (T *)fa_smem, *ks = qs + (Dm::QREG ? 0 : FA_R * Dm::LD), *vt = ks + (Dm::QREG ? FA_R : Dm::BK) * Dm::LD;
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  long long z = blockIdx.y, bk = att_base(lkv, z / group);
  const T *qz = q + att_base(lq, z), *kz = k + bk, *vz = v + bk, *kmz = KM ? att_keys(km, z, lq, tk) : NULL;
  int i0 = blockIdx.x * FA_R, ra = i0 + w * 16 + (lane >> 2), rb = ra + 8;
  float sl2 = FA_LOG2E / sqrtf((float)d);
  tc_stage<T, TD>(qs, Dm::LD, qz, lq.ld, i0, FA_R, tq, d);
  __syncthreads();
  unsigned qf[Dm::QREG ? TD / 16 : 1][4];
  if (Dm::QREG) {
#pragma unroll
    for (int kk = 0; kk < TD / 16; kk++) fa_frag_a(qf[Dm::QREG ? kk : 0], qs + w * 16 * Dm::LD, Dm::LD, kk * 16);
  }
  float o[TD / 8][4];
#pragma unroll
  for (int nd = 0; nd < TD / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  float m0 = -CPLAN_INF, m1 = -CPLAN_INF, l0 = 0.0f, l1 = 0.0f; /* rows ra, rb; m in log2 units */
  int kend = causal ? min(tk, i0 + FA_R) : tk;
  for (int k0 = 0; k0 < kend; k0 += Dm::BK) {
    __syncthreads(); /* every warp is done with the last tile (or with Q) */
    tc_stage<T, TD>(ks, Dm::LD, kz, lkv.ld, k0, Dm::BK, tk, d);
    fa_stage_t<T, TD>(vt, Dm::LK, vz, lkv.ld, k0, Dm::BK, tk, d);
    __syncthreads();
    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < TD / 16; kk++) {
      if (!Dm::QREG) fa_frag_a(qf[0], qs + w * 16 * Dm::LD, Dm::LD, kk * 16);
#pragma unroll
      for (int nt = 0; nt < NT; nt++) {
        unsigned fb[2];
        fa_frag_b(fb, ks, Dm::LD, nt * 8, kk * 16);
        mma16816<T>(s[nt], qf[Dm::QREG ? kk : 0], fb);
      }
    }
    float x0 = m0, x1 = m1;
    /* no mask for a tile of keys all before tk and, causal, all at or before the warp's first query, with no
     * key-padding mask */
    if (k0 + Dm::BK > tk || (causal && k0 + Dm::BK - 1 > i0 + w * 16) || kmz)
      fa_mask<NT>(s, i0 + w * 16, k0, tq, tk, causal, true, kmz);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = s[nt][e] * sl2; /* -inf stays -inf */
        s[nt][e] = x;
        if (e < 2) x0 = fmaxf(x0, x);
        else x1 = fmaxf(x1, x);
      }
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
    float c0 = x0 == -CPLAN_INF ? 1.0f : exp2f(m0 - x0), c1 = x1 == -CPLAN_INF ? 1.0f : exp2f(m1 - x1);
    m0 = x0, m1 = x1;
    l0 *= c0, l1 *= c1;
#pragma unroll
    for (int nd = 0; nd < TD / 8; nd++) o[nd][0] *= c0, o[nd][1] *= c0, o[nd][2] *= c1, o[nd][3] *= c1;
    unsigned pf[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float mr = e < 2 ? m0 : m1;
        p[e] = mr == -CPLAN_INF ? 0.0f : exp2f(s[nt][e] - mr);
      }
      fa_pack<T>(pf[nt], p[0], p[1], p[2], p[3]);
      l0 += fa_sum2<T>(pf[nt][0]), l1 += fa_sum2<T>(pf[nt][1]); /* the sums of what the product uses */
    }
    fa_pb<T, TD, Dm::BK / 16>(o, pf, vt, Dm::LK);
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  fa_store<T, TD>(out + att_base(lo, z), lo.ld, o, ra, tq, d, l0 > 0.0f ? 1.0f / l0 : 0.0f,
                  l1 > 0.0f ? 1.0f / l1 : 0.0f, 0);
  if ((lane & 3) == 0) {
    if (ra < tq) lse[z * tq + ra] = m0 * FA_LN2 + logf(l0);
    if (rb < tq) lse[z * tq + rb] = m1 * FA_LN2 + logf(l1);
  }
}

/* dk/dv: the block owns 64 keys (16 per warp) of kv batch-head zk and walks the query tiles of the
 * group's query heads in turn, accumulating in the same registers: dk and dv stored once, no atomics */
template <typename T, int TD, bool KM>
__device__ __forceinline__ void fa_dkdv(T *dk, T *dv, const T *dout, const float *lse, const float *delta,
                                        const T *q, const T *k, const T *v, const T *km, int tq, int tk, int d,
                                        int causal, int acc, int group, CplanAttnLayout lq, CplanAttnLayout lkv,
                                        CplanAttnLayout lo) {
  typedef FaDims<T, TD> Dm;
  const int BQ = Dm::BQ, NT = BQ / 8, CS = Dm::CS, TW = TD / CS; /* TW: the warp's columns of dk, dv */
  extern __shared__ __align__(128) unsigned char fa_smem[];
  T *ks = (T *)fa_smem, *vs = ks + FA_R * Dm::LD, *qs = vs + FA_R * Dm::LD, *dos = qs + BQ * Dm::LD,
    *qt = dos + BQ * Dm::LD, *dot = qt + TD * Dm::LQ;
  float *lss = (float *)(dot + TD * Dm::LQ), *dls = lss + BQ;
  /* warp w: keys 16 (w / CS).., columns TW (w % CS).. of dk and dv (its S^T and dP^T over all of TD) */
  int w = (threadIdx.x >> 5) / CS, cw = (threadIdx.x >> 5) % CS * TW, lane = threadIdx.x & 31, cq = 2 * (lane & 3);
  long long zk = blockIdx.y, bk = att_base(lkv, zk);
  const T *kz = k + bk, *vz = v + bk;
  int j0 = blockIdx.x * FA_R, jw = j0 + w * 16, ja = jw + (lane >> 2);
  const T *kmz = KM ? att_keys(km, zk, lkv, tk) : NULL;
  /* the thread's two keys ja, ja + 8 take part (masked: no query sees them, their dk and dv are 0) */
  bool ona = ja < tk && key_on(kmz, ja), onb = ja + 8 < tk && key_on(kmz, ja + 8);
  float scale = 1.0f / sqrtf((float)d), sl2 = FA_LOG2E * scale;
  tc_stage<T, TD>(ks, Dm::LD, kz, lkv.ld, j0, FA_R, tk, d);
  tc_stage<T, TD>(vs, Dm::LD, vz, lkv.ld, j0, FA_R, tk, d);
  float gk[TW / 8][4], gv[TW / 8][4];
#pragma unroll
  for (int nd = 0; nd < TW / 8; nd++)
#pragma unroll
    for (int e = 0; e < 4; e++) gk[nd][e] = gv[nd][e] = 0.0f;
  for (long long z = zk * group; z < (zk + 1) * group; z++) {
    const T *qz = q + att_base(lq, z), *doz = dout + att_base(lo, z);
    const float *lz = lse + z * tq, *dz = delta + z * tq;
    for (int i0 = causal ? j0 : 0; i0 < tq; i0 += BQ) { /* earlier queries see none of these keys */
      __syncthreads();
      tc_stage<T, TD>(qs, Dm::LD, qz, lq.ld, i0, BQ, tq, d);
      tc_stage<T, TD>(dos, Dm::LD, doz, lo.ld, i0, BQ, tq, d);
      fa_stage_t<T, TD>(qt, Dm::LQ, qz, lq.ld, i0, BQ, tq, d);
      fa_stage_t<T, TD>(dot, Dm::LQ, doz, lo.ld, i0, BQ, tq, d);
      for (int e = threadIdx.x; e < BQ; e += blockDim.x) {
        lss[e] = i0 + e < tq ? lz[i0 + e] * FA_LOG2E : 0.0f;
        dls[e] = i0 + e < tq ? dz[i0 + e] : 0.0f;
      }
      __syncthreads();
      if (jw >= tk || (causal && i0 + BQ <= jw)) continue; /* no key of the warp's, or every query before them */
      float s[NT][4], dp[NT][4];
      fa_abt<T, TD, NT>(s, ks + w * 16 * Dm::LD, qs, Dm::LD);   /* S^T: [16 keys, BQ queries] */
      fa_abt<T, TD, NT>(dp, vs + w * 16 * Dm::LD, dos, Dm::LD); /* dP^T */
      unsigned pf[NT][2], df[NT][2];
      /* no mask when the queries are all before tq, the warp's keys before tk and, causal, no key after a query,
       * with no key-padding mask (tested in line here: fa_mask's call would cost this kernel more registers than
       * it has) */
      bool full = i0 + BQ <= tq && jw + 16 <= tk && (!causal || i0 >= jw + 15) && !kmz;
#pragma unroll
      for (int nt = 0; nt < NT; nt++) {
        float p[4], ds[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int ii = nt * 8 + cq + (e & 1), i = i0 + ii, j = ja + (e < 2 ? 0 : 8);
          bool ok = full || ((KM ? (e < 2 ? ona : onb) : j < tk) && i < tq && (!causal || i >= j));
          p[e] = ok ? exp2f(s[nt][e] * sl2 - lss[ii]) : 0.0f;
          ds[e] = p[e] * (dp[nt][e] - dls[ii]);
        }
        fa_pack<T>(pf[nt], p[0], p[1], p[2], p[3]);
        fa_pack<T>(df[nt], ds[0], ds[1], ds[2], ds[3]);
      }
      fa_pb<T, TW, BQ / 16>(gv, pf, dot + cw * Dm::LQ, Dm::LQ); /* dv += P^T dO */
      fa_pb<T, TW, BQ / 16>(gk, df, qt + cw * Dm::LQ, Dm::LQ); /* dk += dS^T Q (times scale at the store) */
    }
  }
  fa_store<T, TW>(dv ? dv + bk + cw : dv, lkv.ld, gv, ja, tk, d - cw, 1.0f, 1.0f, acc);
  fa_store<T, TW>(dk ? dk + bk + cw : dk, lkv.ld, gk, ja, tk, d - cw, scale, scale, acc);
}

/* dq: the block owns 64 queries (16 per warp) and walks the key tiles */
template <typename T, int TD, bool KM>
__device__ __forceinline__ void fa_dq(T *dq, const T *dout, const float *lse, const float *delta, const T *q,
                                      const T *k, const T *v, const T *km, int tq, int tk, int d, int causal,
                                      int acc, int group, CplanAttnLayout lq, CplanAttnLayout lkv,
                                      CplanAttnLayout lo) {
  typedef FaDims<T, TD> Dm;
  const int NT = Dm::BK / 8;
  extern __shared__ __align__(128) unsigned char fa_smem[];
  T *qs = (T *)fa_smem, *dos = qs + FA_R * Dm::LD, *ks = dos + FA_R * Dm::LD, *vs = ks + Dm::BK * Dm::LD,
    *kt = vs + Dm::BK * Dm::LD;
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  long long z = blockIdx.y, bq = att_base(lq, z), bk = att_base(lkv, z / group);
  const T *qz = q + bq, *kz = k + bk, *vz = v + bk, *doz = dout + att_base(lo, z);
  const T *kmz = KM ? att_keys(km, z, lq, tk) : NULL;
  int i0 = blockIdx.x * FA_R, iw = i0 + w * 16, ra = iw + (lane >> 2), rb = ra + 8;
  float scale = 1.0f / sqrtf((float)d), sl2 = FA_LOG2E * scale;
  float la = ra < tq ? lse[z * tq + ra] * FA_LOG2E : 0.0f, lb = rb < tq ? lse[z * tq + rb] * FA_LOG2E : 0.0f;
  if (KM) /* a row with every key masked (lse -inf): p = exp2(-inf - inf) = 0 for its masked scores, not NaN */
    la = la == -CPLAN_INF ? CPLAN_INF : la, lb = lb == -CPLAN_INF ? CPLAN_INF : lb;
  float da = ra < tq ? delta[z * tq + ra] : 0.0f, db = rb < tq ? delta[z * tq + rb] : 0.0f;
  tc_stage<T, TD>(qs, Dm::LD, qz, lq.ld, i0, FA_R, tq, d);
  tc_stage<T, TD>(dos, Dm::LD, doz, lo.ld, i0, FA_R, tq, d);
  float g[TD / 8][4];
#pragma unroll
  for (int nd = 0; nd < TD / 8; nd++) g[nd][0] = g[nd][1] = g[nd][2] = g[nd][3] = 0.0f;
  int kend = causal ? min(tk, i0 + FA_R) : tk;
  for (int k0 = 0; k0 < kend; k0 += Dm::BK) {
    __syncthreads();
    tc_stage<T, TD>(ks, Dm::LD, kz, lkv.ld, k0, Dm::BK, tk, d);
    tc_stage<T, TD>(vs, Dm::LD, vz, lkv.ld, k0, Dm::BK, tk, d);
    fa_stage_t<T, TD>(kt, Dm::LK, kz, lkv.ld, k0, Dm::BK, tk, d);
    __syncthreads();
    if (iw >= tq) continue;
    float s[NT][4], dp[NT][4];
    fa_abt<T, TD, NT>(s, qs + w * 16 * Dm::LD, ks, Dm::LD);   /* S: [16 queries, 64 keys] */
    fa_abt<T, TD, NT>(dp, dos + w * 16 * Dm::LD, vs, Dm::LD); /* dP */
    unsigned df[NT][2];
    /* no mask when the keys are all before tk, the warp's queries before tq and, causal, no key after a query,
     * with no key-padding mask */
    if (k0 + Dm::BK > tk || iw + 16 > tq || (causal && k0 + Dm::BK - 1 > iw) || kmz)
      fa_mask<NT>(s, iw, k0, tq, tk, causal, true, kmz);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float p = exp2f(s[nt][e] * sl2 - (e < 2 ? la : lb)); /* masked: exp2(-inf) = 0 */
        ds[e] = p * (dp[nt][e] - (e < 2 ? da : db));
      }
      fa_pack<T>(df[nt], ds[0], ds[1], ds[2], ds[3]);
    }
    fa_pb<T, TD, Dm::BK / 16>(g, df, kt, Dm::LK); /* dq += dS K (times scale at the store) */
  }
  fa_store<T, TD>(dq + bq, lq.ld, g, ra, tq, d, scale, scale, acc);
}

/* launch bounds: at head dims up to 64, the backward kernels keep three blocks (12 warps) a
 * multiprocessor (at most 170 registers a thread; sm_90 needs 168 and 156 with no spill), the
 * forward four (at most 128: sm_90 needs 128 with no spill); at 128 and 256 the compiler's choice
 * (at 256, sm_80 / sm_90 need 204 / 168 registers for the forward, 233 / 232 for dk/dv, 226 / 240
 * for dq, with no spill) */
#define FA_BOUNDS_64 FA_W * 32, 3
#define FA_BOUNDS_128 FA_W * 32
#define FA_FBOUNDS_64 FA_W * 32, 4
#define FA_FBOUNDS_128 FA_W * 32
#define FA_BOUNDS_256 FA_W * 32 * 2 /* dk/dv: 8 warps (FaDims::WKV); dq: 4 */
#define FA_FBOUNDS_256 FA_W * 32
#define ATT_MMA_ENTRIES(T, S, TD)                                                                               \
  ATT_ENTRY_SET(attention_mma, fa_fwd, fa_dkdv, fa_dq, FA_FBOUNDS_##TD, FA_BOUNDS_##TD, T, S, TD, ATT_NO_KM)     \
  ATT_ENTRY_SET(attention_mma_kpm, fa_fwd, fa_dkdv, fa_dq, FA_FBOUNDS_##TD, FA_BOUNDS_##TD, T, S, TD, ATT_KM)

ATT_MMA_ENTRIES(bf16, bf16, 64)
ATT_MMA_ENTRIES(bf16, bf16, 128)
ATT_MMA_ENTRIES(fp16, f16, 64)
ATT_MMA_ENTRIES(fp16, f16, 128)
ATT_MMA_ENTRIES(bf16, bf16, 256)
ATT_MMA_ENTRIES(fp16, f16, 256)

#ifndef __CUDACC_RTC__ /* ---- host launchers ------------------------------------------------- */
#include "launch.h"

#include <stdio.h>
#include <stdlib.h>

/* Which kernels bf16 and f16 run on: CPLAN_ATTENTION=mma (the default: mma.sync, scores in
 * registers), wmma (WMMA, scores through shared memory) or simt (the CUDA-core kernels). f32
 * always runs on the CUDA cores. Another value is reported once and the default used. */
enum AttImpl { ATT_SIMT, ATT_WMMA, ATT_MMA };
static AttImpl att_impl(CplanDtype dt) {
  static int mode = -1;
  if (mode < 0) {
    const char *e = getenv("CPLAN_ATTENTION");
    mode = ATT_MMA;
    if (e && strcmp(e, "simt") == 0) mode = ATT_SIMT;
    else if (e && strcmp(e, "wmma") == 0) mode = ATT_WMMA;
    else if (e && *e && strcmp(e, "mma") != 0)
      fprintf(stderr, "cplan: CPLAN_ATTENTION=%s is not mma, wmma or simt: attention runs on mma\n", e);
  }
  return dt == CPLAN_BF16 || dt == CPLAN_F16 ? (AttImpl)mode : ATT_SIMT;
}

/* a tensor-core kernel with `threads` a block and `bytes` of dynamic shared memory (above 48 KiB: opted in) */
#define ATT_TC_GO(me, kern, grid, threads, bytes, ...)                                                             \
  do {                                                                                                    \
    cudaError_t e_ = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (bytes));  \
    if (e_ != cudaSuccess)                                                                                \
      return cplan_cuda_fail(me, "%s: %d bytes of shared memory: %s", #kern, (int)(bytes),               \
                             cudaGetErrorString(e_));                                                     \
    kern<<<grid, (threads), (bytes), stream>>>(__VA_ARGS__);                                               \
  } while (0)

/* a tensor-core forward (WMMA or mma.sync: 64 rows a block either way) with `bytes` of shared memory */
template <typename T>
static int att_tc_forward(const char *me,
                          void (*kern)(T *, float *, const T *, const T *, const T *, const T *, int, int, int, int,
                                       int, CplanAttnLayout, CplanAttnLayout, CplanAttnLayout),
                          int bytes, void *out, float *lse, const void *q, const void *k, const void *v, const void *km,
                          int nb, int tq, int tk, int d, int causal, int group, CplanAttnLayout lq, CplanAttnLayout lkv,
                          CplanAttnLayout lo, cudaStream_t stream) {
  dim3 grid((unsigned)((tq + TC_R - 1) / TC_R), (unsigned)nb);
  ATT_TC_GO(me, kern, grid, TC_W * 32, bytes, (T *)out, lse, (const T *)q, (const T *)k, (const T *)v, (const T *)km,
            tq, tk, d, causal, group, lq, lkv, lo);
  return cplan_cuda_launched(me);
}

static const char *att_shape(int nb, int tq, int tk, int d) {
  if (nb < 0 || tq < 1 || tk < 1 || d < 1) return "bad shape";
  if (d > CPLAN_ATTN_MAX_HEAD_DIM) return "head dim above 256";
  if (nb > 65535) return "more than 65535 batch * heads";
  return NULL;
}

/* what a launcher can check of a layout: whole heads per batch, rows at least d apart, strides
 * not negative (that the tensor's memory holds them is the caller's) */
static const char *att_layout(const CplanAttnLayout *l, int nb, int d) {
  if (l->heads < 1 || nb % l->heads) return "heads that do not divide batch * heads";
  if (l->ld < d || l->bstride < 0 || l->hstride < 0) return "rows closer than d, or negative strides";
  return NULL;
}

/* a launcher's checks of the shape, the three layouts and the group (query heads per kv head: they
 * divide q's heads, so nb too, and k and v have q's heads / group): 0, or cplan_cuda_fail's -1 */
static int att_check(const char *me, int nb, int tq, int tk, int d, int group, const CplanAttnLayout *lq,
                     const CplanAttnLayout *lkv, const CplanAttnLayout *lo) {
  const char *bad = att_shape(nb, tq, tk, d), *badq = att_layout(lq, nb, d), *bado = att_layout(lo, nb, d);
  CPLAN_REQUIRE(me, !bad, "%s: %d batch-heads, %d queries, %d keys, head dim %d", bad, nb, tq, tk, d);
  CPLAN_REQUIRE(me, !badq && !bado, "q's or out's layout: %s", badq ? badq : bado);
  CPLAN_REQUIRE(me, group >= 1 && lq->heads % group == 0 && (long long)lkv->heads * group == lq->heads,
                "group %d: q's %d heads are not k and v's %d heads times the group", group, lq->heads, lkv->heads);
  const char *badkv = att_layout(lkv, nb / group, d);
  CPLAN_REQUIRE(me, !badkv, "k and v's layout: %s", badkv);
  return 0;
}

static CplanAttnLayout att_contiguous(int t, int d) {
  CplanAttnLayout l = {d, 1, (long long)t * d, 0};
  return l;
}

extern "C" int cplan_cuda_attention_forward_m(CplanDtype dt, void *out, float *lse, const void *q, const void *k,
                                              const void *v, const void *km, int nb, int tq, int tk, int d,
                                              int causal, int group, CplanAttnLayout lq, CplanAttnLayout lkv,
                                              CplanAttnLayout lo, cudaStream_t stream) {
  const char *me = "cplan_cuda_attention_forward";
  if (att_check(me, nb, tq, tk, d, group, &lq, &lkv, &lo)) return -1;
  CPLAN_REQUIRE(me, out && lse && q && k && v, "out, lse, q, k and v must not be NULL");
  if (nb == 0) return 0;
  AttImpl impl = att_impl(dt);
  if (impl == ATT_SIMT && dt != CPLAN_F32 && d > 128) impl = ATT_MMA; /* no bf16 / f16 CUDA-core kernels there */
  if (km && dt != CPLAN_F32) impl = ATT_MMA; /* the masked kernels (ATT_KPM_ENTRIES) */
  if (impl != ATT_SIMT) {
#define ATT_TC_FWD(T, S, TD)                                                                                   \
  (impl == ATT_MMA ? att_tc_forward<T>(me,                                                                     \
                                       km ? attention_mma_kpm_forward_##S##_d##TD : attention_mma_forward_##S##_d##TD, \
                                       FaDims<T, TD>::FWD, out, lse, q, k, v,                                         \
                                       km, nb, tq, tk, d, causal, group, lq, lkv, lo, stream)                       \
                   : att_tc_forward<T>(me, attention_tc_forward_##S##_d##TD, TcDims<T, TD>::FWD, out, lse, q, k, v,  \
                                       km, nb, tq, tk, d, causal, group, lq, lkv, lo, stream))
    /* above 128, WMMA too runs on mma.sync (its dk/dv accumulators would not fit the registers) */
#define ATT_MMA_FWD256(T, S)                                                                                    \
  att_tc_forward<T>(me, km ? attention_mma_kpm_forward_##S##_d256 : attention_mma_forward_##S##_d256,          \
                    FaDims<T, 256>::FWD, out, lse, q, k, v, km, nb, tq, tk,                                     \
                    d, causal, group, lq, lkv, lo, stream)
    if (dt == CPLAN_BF16)
      return d <= 64 ? ATT_TC_FWD(bf16, bf16, 64) : d <= 128 ? ATT_TC_FWD(bf16, bf16, 128) : ATT_MMA_FWD256(bf16, bf16);
    return d <= 64 ? ATT_TC_FWD(fp16, f16, 64) : d <= 128 ? ATT_TC_FWD(fp16, f16, 128) : ATT_MMA_FWD256(fp16, f16);
#undef ATT_MMA_FWD256
#undef ATT_TC_FWD
  }
  dim3 grid((unsigned)((tq + ATT_BR - 1) / ATT_BR), (unsigned)nb);
#define ATT_SIMT_FWD(T, S, DM)                                                                                 \
  do {                                                                                                         \
    auto kern_ = km ? ATT_SIMT_KPM_##S(forward, DM) : attention_forward_##S##_d##DM;                          \
    kern_<<<grid, ATT_BR, 0, stream>>>((T *)out, lse, (const T *)q, (const T *)k, (const T *)v, (const T *)km, \
                                       tq, tk, d, causal, group, lq, lkv, lo);                                 \
  } while (0)
  if (dt == CPLAN_F32 && d <= 64) ATT_SIMT_FWD(float, f32, 64);
  else if (dt == CPLAN_F32 && d <= 128) ATT_SIMT_FWD(float, f32, 128);
  else if (dt == CPLAN_F32) ATT_SIMT_FWD(float, f32, 256);
  else if (dt == CPLAN_BF16 && d <= 64) ATT_SIMT_FWD(bf16, bf16, 64);
  else if (dt == CPLAN_BF16) ATT_SIMT_FWD(bf16, bf16, 128);
  else if (dt == CPLAN_F16 && d <= 64) ATT_SIMT_FWD(fp16, f16, 64);
  else if (dt == CPLAN_F16) ATT_SIMT_FWD(fp16, f16, 128);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
#undef ATT_SIMT_FWD
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_attention_forward_l(CplanDtype dt, void *out, float *lse, const void *q, const void *k,
                                              const void *v, int nb, int tq, int tk, int d, int causal,
                                              int group, CplanAttnLayout lq, CplanAttnLayout lkv, CplanAttnLayout lo,
                                              cudaStream_t stream) {
  return cplan_cuda_attention_forward_m(dt, out, lse, q, k, v, NULL, nb, tq, tk, d, causal, group, lq, lkv, lo,
                                        stream);
}

extern "C" int cplan_cuda_attention_forward(CplanDtype dt, void *out, float *lse, const void *q, const void *k,
                                            const void *v, int nb, int t, int d, int causal, cudaStream_t stream) {
  CplanAttnLayout l = att_contiguous(t, d);
  return cplan_cuda_attention_forward_l(dt, out, lse, q, k, v, nb, t, t, d, causal, 1, l, l, l, stream);
}

template <typename T>
static void att_bwd_launch(void *dq, void *dk, void *dv, float *delta, const void *dout, const void *out,
                           const float *lse, const void *q, const void *k, const void *v, const void *km, int nb,
                           int tq, int tk, int d, int causal, int acc, int group, CplanAttnLayout lq,
                           CplanAttnLayout lkv, CplanAttnLayout lo, cudaStream_t stream, int dm);

/* the dk/dv kernel's blocks over the nb / group kv batch-heads (grid_kv), the dq kernel's over the nb
 * query batch-heads (grid) */
#define ATT_BWD_DM(T, S, DM)                                                                                \
  do {                                                                                                      \
    auto dkdv_ = km ? ATT_SIMT_KPM_##S(backward_dkdv, DM) : attention_backward_dkdv_##S##_d##DM;          \
    auto dq_ = km ? ATT_SIMT_KPM_##S(backward_dq, DM) : attention_backward_dq_##S##_d##DM;                \
    if (dk || dv)                                                                                           \
      dkdv_<<<grid_kv, ATT_BR, 0, stream>>>((T *)dk, (T *)dv, (const T *)dout, lse, delta, (const T *)q,    \
                                            (const T *)k, (const T *)v, (const T *)km, tq, tk, d, causal,   \
                                            acc, group, lq, lkv, lo);                                       \
    if (dq)                                                                                                 \
      dq_<<<grid, ATT_BR, 0, stream>>>((T *)dq, (const T *)dout, lse, delta, (const T *)q, (const T *)k,    \
                                       (const T *)v, (const T *)km, tq, tk, d, causal, acc, group, lq, lkv, \
                                       lo);                                                                 \
  } while (0)
#define ATT_BWD(T, S, DW)                                                                                    \
  template <>                                                                                               \
  void att_bwd_launch<T>(void *dq, void *dk, void *dv, float *delta, const void *dout, const void *out,    \
                         const float *lse, const void *q, const void *k, const void *v, const void *km,     \
                         int nb, int tq, int tk, int d, int causal, int acc, int group, CplanAttnLayout lq, \
                         CplanAttnLayout lkv, CplanAttnLayout lo, cudaStream_t stream, int dm) {            \
    long long rows = (long long)nb * tq;                                                                    \
    attention_backward_delta_##S<<<cplan_blocks(rows * 32, 256, 65535u), 256, 0, stream>>>(                 \
        delta, (const T *)dout, (const T *)out, rows, tq, d, lo);                                           \
    dim3 grid((unsigned)((tq + ATT_BR - 1) / ATT_BR), (unsigned)nb),                                        \
        grid_kv((unsigned)((tk + ATT_BR - 1) / ATT_BR), (unsigned)(nb / group));                            \
    if (dm == 64) ATT_BWD_DM(T, S, 64);                                                                     \
    else if (dm == 128) ATT_BWD_DM(T, S, 128);                                                              \
    else ATT_BWD_DM(T, S, DW); /* 256: f32 only (dm 256 reaches no other) */                                \
  }
ATT_BWD(float, f32, 256)
ATT_BWD(bf16, bf16, 128)
ATT_BWD(fp16, f16, 128)
#undef ATT_BWD
#undef ATT_BWD_DM

/* delta on the CUDA cores (a row dot product), then the tensor-core dk/dv kernel (threads_kv a
 * block, bytes_kv of shared memory, a block row per kv batch-head) and dq kernel (bytes_q, a block
 * row per query batch-head) */
template <typename T>
static int att_tc_backward(const char *me,
                           void (*dkdv)(T *, T *, const T *, const float *, const float *, const T *, const T *,
                                        const T *, const T *, int, int, int, int, int, int, CplanAttnLayout,
                                        CplanAttnLayout, CplanAttnLayout),
                           void (*dqk)(T *, const T *, const float *, const float *, const T *, const T *, const T *,
                                       const T *, int, int, int, int, int, int, CplanAttnLayout, CplanAttnLayout,
                                       CplanAttnLayout),
                           void (*dlt)(float *, const T *, const T *, long long, int, int, CplanAttnLayout),
                           int threads_kv, int bytes_kv, int bytes_q, void *dq, void *dk, void *dv, float *delta,
                           const void *dout, const void *out, const float *lse, const void *q, const void *k,
                           const void *v, const void *km, int nb, int tq, int tk, int d, int causal, int acc,
                           int group, CplanAttnLayout lq, CplanAttnLayout lkv, CplanAttnLayout lo,
                           cudaStream_t stream) {
  long long rows = (long long)nb * tq;
  dlt<<<cplan_blocks(rows * 32, 256, 65535u), 256, 0, stream>>>(delta, (const T *)dout, (const T *)out, rows, tq, d,
                                                                lo);
  dim3 grid((unsigned)((tq + TC_R - 1) / TC_R), (unsigned)nb),
      grid_kv((unsigned)((tk + TC_R - 1) / TC_R), (unsigned)(nb / group));
  if (dk || dv)
    ATT_TC_GO(me, dkdv, grid_kv, threads_kv, bytes_kv, (T *)dk, (T *)dv, (const T *)dout, lse, delta, (const T *)q,
              (const T *)k, (const T *)v, (const T *)km, tq, tk, d, causal, acc, group, lq, lkv, lo);
  if (dq)
    ATT_TC_GO(me, dqk, grid, TC_W * 32, bytes_q, (T *)dq, (const T *)dout, lse, delta, (const T *)q, (const T *)k,
              (const T *)v, (const T *)km, tq, tk, d, causal, acc, group, lq, lkv, lo);
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_attention_backward_m(CplanDtype dt, void *dq, void *dk, void *dv, float *delta,
                                               const void *dout, const void *out, const float *lse, const void *q,
                                               const void *k, const void *v, const void *km, int nb, int tq, int tk,
                                               int d, int causal, int accumulate, int group, CplanAttnLayout lq,
                                               CplanAttnLayout lkv, CplanAttnLayout lo, cudaStream_t stream) {
  const char *me = "cplan_cuda_attention_backward";
  if (att_check(me, nb, tq, tk, d, group, &lq, &lkv, &lo)) return -1;
  CPLAN_REQUIRE(me, delta && dout && out && lse && q && k && v, "delta, dout, out, lse, q, k and v must not be NULL");
  if (nb == 0 || (!dq && !dk && !dv)) return 0;
  int acc = accumulate != 0;
  AttImpl impl = att_impl(dt);
  if (impl == ATT_SIMT && dt != CPLAN_F32 && d > 128) impl = ATT_MMA; /* as the forward */
  if (km && dt != CPLAN_F32) impl = ATT_MMA;
  if (impl != ATT_SIMT) {
#define ATT_TC_BWD(T, S, TD)                                                                                  \
  (impl == ATT_MMA                                                                                            \
       ? att_tc_backward<T>(me,                                                                               \
                            km ? attention_mma_kpm_backward_dkdv_##S##_d##TD : attention_mma_backward_dkdv_##S##_d##TD, \
                            km ? attention_mma_kpm_backward_dq_##S##_d##TD : attention_mma_backward_dq_##S##_d##TD,   \
                            attention_backward_delta_##S, FaDims<T, TD>::WKV * 32, FaDims<T, TD>::DKDV,            \
                            FaDims<T, TD>::DQ, dq, dk, dv, delta, dout, out, lse, q, k, v, km, nb, tq, tk, d, causal, \
                            acc, group, lq, lkv, lo, stream)                                                         \
       : att_tc_backward<T>(me, attention_tc_backward_dkdv_##S##_d##TD, attention_tc_backward_dq_##S##_d##TD,    \
                            attention_backward_delta_##S, TC_W * 32, TcDims<T, TD>::BWD, TcDims<T, TD>::BWD, dq,  \
                            dk, dv, delta, dout, out, lse, q, k, v, km, nb, tq, tk, d, causal, acc, group, lq, lkv,\
                            lo, stream))
    /* above 128, WMMA too runs on mma.sync (as the forward) */
#define ATT_MMA_BWD256(T, S)                                                                                   \
  att_tc_backward<T>(me, km ? attention_mma_kpm_backward_dkdv_##S##_d256 : attention_mma_backward_dkdv_##S##_d256, \
                     km ? attention_mma_kpm_backward_dq_##S##_d256 : attention_mma_backward_dq_##S##_d256,     \
                     attention_backward_delta_##S, FaDims<T, 256>::WKV * 32, FaDims<T, 256>::DKDV,            \
                     FaDims<T, 256>::DQ, dq, dk, dv, delta, dout, out, lse, q, k, v, km, nb, tq, tk, d, causal, acc, \
                     group, lq, lkv, lo, stream)
    if (dt == CPLAN_BF16)
      return d <= 64 ? ATT_TC_BWD(bf16, bf16, 64) : d <= 128 ? ATT_TC_BWD(bf16, bf16, 128) : ATT_MMA_BWD256(bf16, bf16);
    return d <= 64 ? ATT_TC_BWD(fp16, f16, 64) : d <= 128 ? ATT_TC_BWD(fp16, f16, 128) : ATT_MMA_BWD256(fp16, f16);
#undef ATT_MMA_BWD256
#undef ATT_TC_BWD
  }
  int dm = d <= 64 ? 64 : d <= 128 ? 128 : 256;
#define ATT_SIMT_BWD(T)                                                                                        \
  att_bwd_launch<T>(dq, dk, dv, delta, dout, out, lse, q, k, v, km, nb, tq, tk, d, causal, acc, group, lq, lkv, \
                    lo, stream, dm)
  if (dt == CPLAN_F32) ATT_SIMT_BWD(float);
  else if (dt == CPLAN_BF16) ATT_SIMT_BWD(bf16);
  else if (dt == CPLAN_F16) ATT_SIMT_BWD(fp16);
  else return cplan_cuda_fail(me, "unknown dtype %d", (int)dt);
#undef ATT_SIMT_BWD
  return cplan_cuda_launched(me);
}

extern "C" int cplan_cuda_attention_backward_l(CplanDtype dt, void *dq, void *dk, void *dv, float *delta,
                                               const void *dout, const void *out, const float *lse, const void *q,
                                               const void *k, const void *v, int nb, int tq, int tk, int d,
                                               int causal, int accumulate, int group, CplanAttnLayout lq,
                                               CplanAttnLayout lkv, CplanAttnLayout lo, cudaStream_t stream) {
  return cplan_cuda_attention_backward_m(dt, dq, dk, dv, delta, dout, out, lse, q, k, v, NULL, nb, tq, tk, d, causal,
                                         accumulate, group, lq, lkv, lo, stream);
}

extern "C" int cplan_cuda_attention_backward_ex(CplanDtype dt, void *dq, void *dk, void *dv, float *delta,
                                                const void *dout, const void *out, const float *lse, const void *q,
                                                const void *k, const void *v, int nb, int t, int d, int causal,
                                                int accumulate, cudaStream_t stream) {
  CplanAttnLayout l = att_contiguous(t, d);
  return cplan_cuda_attention_backward_l(dt, dq, dk, dv, delta, dout, out, lse, q, k, v, nb, t, t, d, causal,
                                         accumulate, 1, l, l, l, stream);
}

extern "C" int cplan_cuda_attention_backward(CplanDtype dt, void *dq, void *dk, void *dv, float *delta,
                                             const void *dout, const void *out, const float *lse, const void *q,
                                             const void *k, const void *v, int nb, int t, int d, int causal,
                                             cudaStream_t stream) {
  return cplan_cuda_attention_backward_ex(dt, dq, dk, dv, delta, dout, out, lse, q, k, v, nb, t, d, causal, 1, stream);
}
#endif
