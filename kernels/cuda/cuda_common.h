/* cuda_common.h: device-side helpers every kernels/cuda .cu file includes.
 *
 * The same source is compiled twice: by nvcc into libcplankernels_cuda.a (with the host
 * launchers, which sit under #ifndef __CUDACC_RTC__), and by NVRTC in tests/cuda/test_nvrtc.c
 * (CI has no GPU, NVRTC needs none). So nothing here may include a host header: only
 * <cuda_bf16.h>, which NVRTC ships.
 *
 * Storage types: float, __nv_bfloat16 (bf16) or __half (fp16, for `precision = f16`). Arithmetic is always in float (sums, norms,
 * softmax statistics), and results are rounded to the storage type once, at the store. */
#ifndef CPLAN_CUDA_COMMON_H
#define CPLAN_CUDA_COMMON_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef __nv_bfloat16 bf16;
typedef __half fp16;

#define CPLAN_INF __int_as_float(0x7f800000)
#define CPLAN_NAN __int_as_float(0x7fc00000)

__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ld(fp16 x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T st(float x);
template <> __device__ __forceinline__ float st<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 st<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ fp16 st<fp16>(float x) { return __float2half_rn(x); }

/* Warp-wide sum or max; every lane gets the result. The butterfly order is fixed, so the result
 * is the same on every run (the kernels are deterministic). */
template <bool MAX> __device__ __forceinline__ float warp_reduce(float v) {
  for (int o = 16; o > 0; o >>= 1) {
    float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, u) : v + u;
  }
  return v;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Block-wide sum or max over blockDim.x threads (a multiple of 32, at most 1024); sh is shared
 * scratch of 33 floats. Every thread gets the result. Safe to call back to back. */
template <bool MAX> __device__ __forceinline__ float block_reduce(float v, float *sh) {
  v = warp_reduce<MAX>(v);
  __syncthreads(); /* the previous call's readers of sh[32] are done */
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    int nw = (int)(blockDim.x + 31) >> 5;
    float u = (int)threadIdx.x < nw ? sh[threadIdx.x] : (MAX ? -CPLAN_INF : 0.0f);
    u = warp_reduce<MAX>(u);
    if (threadIdx.x == 0) sh[32] = u;
  }
  __syncthreads();
  return sh[32];
}

/* block_reduce<false> in double (sh: 33 doubles) */
__device__ __forceinline__ double block_sum_f64(double v, double *sh) {
  v = warp_sum_f64(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    int nw = (int)(blockDim.x + 31) >> 5;
    double u = (int)threadIdx.x < nw ? sh[threadIdx.x] : 0.0;
    u = warp_sum_f64(u);
    if (threadIdx.x == 0) sh[32] = u;
  }
  __syncthreads();
  return sh[32];
}

/* ---- 16-byte vectors: P = 16 / sizeof(T) contiguous elements in one load or store ---------------
 * The address must be 16-byte aligned (a GPU faults otherwise; the emulator traps). ldv / stv move
 * P elements as floats: one 16-byte access when P > 1, one element when P = 1 (the scalar path of
 * the same loop). */
template <typename T> struct alignas(16) Pack16 {
  T v[16 / sizeof(T)];
};
template <typename T, int P> struct VecIO {
  static __device__ __forceinline__ void load(float *f, const T *p) {
#if defined(CPLAN_CUDA_EMU)
    if ((unsigned long long)p & 15ull) __trap();
#endif
    Pack16<T> q = *reinterpret_cast<const Pack16<T> *>(p);
#pragma unroll
    for (int u = 0; u < P; u++) f[u] = ld(q.v[u]);
  }
  static __device__ __forceinline__ void store(T *p, const float *f) {
#if defined(CPLAN_CUDA_EMU)
    if ((unsigned long long)p & 15ull) __trap();
#endif
    Pack16<T> q;
#pragma unroll
    for (int u = 0; u < P; u++) q.v[u] = st<T>(f[u]);
    *reinterpret_cast<Pack16<T> *>(p) = q;
  }
};
template <typename T> struct VecIO<T, 1> {
  static __device__ __forceinline__ void load(float *f, const T *p) { f[0] = ld(*p); }
  static __device__ __forceinline__ void store(T *p, const float *f) { *p = st<T>(f[0]); }
};
template <typename T, int P> __device__ __forceinline__ void ldv(float *f, const T *p) { VecIO<T, P>::load(f, p); }
template <typename T, int P> __device__ __forceinline__ void stv(T *p, const float *f) { VecIO<T, P>::store(p, f); }
/* the vector width of T: 8 for bf16 and f16, 4 for f32 */
template <typename T> struct VecW {
  static constexpr int P = 16 / sizeof(T);
};

/* ---- tensor cores: one mma.sync.m16n8k16 (bf16 or f16 operands, f32 accumulators) -----------
 * c (16 x 8) += a (16 x 16) b (16 x 8) over the warp, every lane passing its fragments in the PTX
 * ISA's layout ("Matrix Fragments for mma.m16n8k16 with floating point type"), with g = lane / 4
 * and q = lane % 4 (each 32-bit register holds two elements, the lower-indexed one in its low half):
 *   a[0] = A[g][2q, 2q+1]     a[1] = A[g+8][2q, 2q+1]   a[2] = A[g][2q+8, 2q+9]   a[3] = A[g+8][2q+8, 2q+9]
 *   b[0] = B[2q, 2q+1][g]     b[1] = B[2q+8, 2q+9][g]
 *   c[0], c[1] = C[g][2q, 2q+1]                         c[2], c[3] = C[g+8][2q, 2q+1]
 * Every lane of the warp must call it (mma.sync.aligned). sm_80 and later; the CUDA-on-CPU test
 * emulator (tests/cuda/emu) computes it from the same layout. */
template <typename T> __device__ __forceinline__ unsigned short bits16(T x);
template <> __device__ __forceinline__ unsigned short bits16<bf16>(bf16 x) { return __bfloat16_as_ushort(x); }
template <> __device__ __forceinline__ unsigned short bits16<fp16>(fp16 x) { return __half_as_ushort(x); }

/* two values rounded to T in one register: lo in the low half */
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi) {
  return (unsigned)bits16<T>(st<T>(lo)) | (unsigned)bits16<T>(st<T>(hi)) << 16;
}

template <typename T> __device__ __forceinline__ void mma16816(float *c, const unsigned *a, const unsigned *b);
#if defined(CPLAN_CUDA_EMU)
template <> __device__ __forceinline__ void mma16816<bf16>(float *c, const unsigned *a, const unsigned *b) {
  ::cuemu::mma_m16n8k16(c, a, b, true);
}
template <> __device__ __forceinline__ void mma16816<fp16>(float *c, const unsigned *a, const unsigned *b) {
  ::cuemu::mma_m16n8k16(c, a, b, false);
}
#else
#define CPLAN_MMA16816(T, PTXT)                                                                        \
  template <> __device__ __forceinline__ void mma16816<T>(float *c, const unsigned *a, const unsigned *b) { \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTXT "." PTXT ".f32 {%0, %1, %2, %3}, "         \
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                                       \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));                 \
  }
CPLAN_MMA16816(bf16, "bf16")
CPLAN_MMA16816(fp16, "f16")
#undef CPLAN_MMA16816
#endif

#endif
