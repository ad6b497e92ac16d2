/* cuda_emu.h: the device side of the CUDA-on-CPU test emulator (tests/cuda/emu/README.md).
 *
 * emu_translate puts `#include "cuda_emu.h"` at the top of each kernels/cuda .cu file it copies
 * and turns `kern<<<grid, block, shmem, stream>>>(args)` into
 * `::cuemu::launch_at(__FILE__, __LINE__, __func__, kern, grid, block, shmem, stream)(args)`.
 * The copy is compiled as C++ by the host compiler. The toolkit's own headers give the types
 * (dim3, cudaError_t, __nv_bfloat16, __half with their exact host conversions) and the
 * declarations of the runtime API, which emu_runtime.cpp implements on host memory.
 *
 * A block's threads are fibers in one OS thread, blocks run one after another, a launch runs
 * to completion before it returns. __shared__ is `static` (the block's threads share it; the
 * next block reuses it). threadIdx / blockIdx / blockDim / gridDim are set by the scheduler
 * before it resumes a fiber. __syncthreads waits for every live thread of the block; the warp
 * operations (shuffles, votes, __syncwarp) wait for the lanes of their mask, not for the block. */
#ifndef CPLAN_CUDA_EMU_H
#define CPLAN_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h is C++: kernels are compiled as C++ by the host compiler"
#endif
#if defined(__CUDACC__) || defined(__CUDA_ARCH__)
#error "cuda_emu.h is for the host compiler, not nvcc"
#endif

#define CPLAN_CUDA_EMU 1

#include <cuda_runtime_api.h> /* the toolkit's: dim3, uint3, cudaError_t, the API declarations */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h> /* device printf, which nvcc provides without an include */
#include <string.h>

#include "emu_queue.h"

#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers ---------------------------------------------------------------------------------
 * crt/host_defines.h already maps __host__, __device__, __global__ to nothing for a host
 * compiler, and __forceinline__ to always_inline. */
#undef __shared__
#define __shared__ static
#undef __constant__
#define __constant__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __restrict__
#define __restrict__ __restrict
#endif
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif
#ifndef __grid_constant__
#define __grid_constant__
#endif

namespace cuemu {

/* the builtins of the running thread (emu_runtime.cpp sets them) */
extern uint3 cur_thread, cur_block;
extern dim3 cur_block_dim, cur_grid_dim;

/* ---- scheduler entry points (emu_runtime.cpp) ---------------------------------------------- */
void syncthreads(void);
/* Every lane of mask deposits (value, the lane it reads, predicate), waits for the other lanes
 * of mask, and gets the value of its source lane (its own when src < 0) and the ballot. */
uint64_t warp_exchange(unsigned mask, uint64_t value, int src, int pred, unsigned *ballot);
void *dynamic_smem(void);
/* 4 KiB of scratch for the running thread's warp (the wmma emulation's collective results) */
void *warp_scratch(void);
[[noreturn]] void trap(const char *what);

/* a pointer converter for `extern __shared__ T name[]` (emu_translate) */
struct DynSmem {
  template <typename T> operator T *() const { return (T *)dynamic_smem(); }
};
inline DynSmem dyn_smem() { return DynSmem(); }

/* ---- launches --------------------------------------------------------------------------------- */
struct LaunchSite {
  const char *file;
  int line;
  const char *func;
};

/* Checks the configuration as the runtime does (setting the last error), then runs every block
 * of the grid: body(ctx) is one thread; release(ctx) after the grid. The grid runs before the call
 * returns, or, with CUEMU_DEFER=1, when its stream is next synchronized (emu_queue.h). */
void run_grid(const void *kernel, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, LaunchSite site,
              void (*body)(void *), void *ctx, void (*release)(void *));


template <typename... P> struct Pending {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t shmem;
  cudaStream_t stream;
  LaunchSite site;

  void operator()(P... p) const {
    struct Ctx {
      void (*k)(P...);
      std::tuple<P...> args;
    };
    /* the launch's copy of the arguments (it may run later); each thread gets its own copies of the
     * parameters, as on the device */
    run_grid((const void *)kernel, grid, block, shmem, stream, site,
             [](void *c) {
               Ctx *x = (Ctx *)c;
               std::apply(x->k, x->args);
             },
             new Ctx{kernel, std::tuple<P...>(p...)}, [](void *c) { delete (Ctx *)c; });
  }
};

/* what emu_translate makes of kern<<<grid, block[, shmem[, stream]]>>>(args): launch_at(site, kern,
 * grid, block, ...)(args), the arguments converted to the kernel's parameter types at the call */
template <typename... P>
inline Pending<P...> launch_at(const char *file, int line, const char *func, void (*kernel)(P...), dim3 grid,
                               dim3 block, size_t shmem = 0, cudaStream_t stream = 0) {
  return Pending<P...>{kernel, grid, block, shmem, stream, LaunchSite{file, line, func}};
}

/* cudaLaunchKernel(k, grid, block, void **args, smem, stream) of a kernel compiled at run time
 * (emu_cuda_rt.cpp): the trampoline `cuemu_entry_NAME` that emu_translate --entries appends for
 * each `extern "C" __global__` kernel unpacks args[i] as the kernel's i-th parameter type. */
template <typename... P, size_t... I>
inline void launch_packed(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem,
                          cudaStream_t stream, void **args, std::index_sequence<I...>) {
  (void)args;
  launch_at(name, 0, name, kernel, grid, block, shmem, stream)(*(typename std::remove_reference<P>::type *)args[I]...);
}
template <typename... P>
inline void launch_packed(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem,
                          cudaStream_t stream, void **args) {
  launch_packed(name, kernel, grid, block, shmem, stream, args, std::index_sequence_for<P...>{});
}

template <typename T> inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffles move at most 8 bytes");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}
template <typename T> inline T from_bits(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}
inline int lane_id() {
  unsigned t = cur_thread.x + cur_thread.y * cur_block_dim.x + cur_thread.z * cur_block_dim.x * cur_block_dim.y;
  return (int)(t & 31u);
}
inline void check_width(int width) {
  if (width < 1 || width > 32 || (width & (width - 1))) trap("shuffle width is not a power of 2 in [1, 32]");
}

} // namespace cuemu

/* ---- the PTX of inline asm that emu_translate rewrites (codegen/emit_cu_support.h) ---------- */
namespace cuemu {
namespace ptx {
inline unsigned short cvt_rn_f16_f32(float f) {
  __half_raw r = __float2half_rn(f);
  return r.x;
}
inline float cvt_f32_f16(unsigned short h) {
  __half_raw r;
  r.x = h;
  return __half2float(__half(r));
}
} // namespace ptx
} // namespace cuemu

/* ---- mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (kernels/cuda/cuda_common.h's
 * mma16816): every lane publishes its fragments (the PTX ISA's layout, written out there), the
 * warp waits, each lane computes its own four elements of C from the lanes that hold them (the
 * products in f32, exact for 16-bit operands, summed over k in order, then added to c), and the
 * warp waits again before any lane's fragments may change. All 32 lanes must call it. */
namespace cuemu {
inline float mma_element(const unsigned *reg, int half, bool bf16) {
  unsigned short h = (unsigned short)(half ? *reg >> 16 : *reg & 0xffffu);
  if (bf16) return from_bits<float>((uint64_t)h << 16);
  __half_raw r;
  r.x = h;
  return __half2float(__half(r));
}
inline void mma_m16n8k16(float *c, const unsigned *a, const unsigned *b, bool bf16) {
  struct Fragments {
    const unsigned *a, *b;
  } mine = {a, b};
  const Fragments **lanes = (const Fragments **)((char *)warp_scratch() + 2048); /* past wmma's results */
  int l = lane_id(), g = l >> 2, q = l & 3;
  lanes[l] = &mine;
  warp_exchange(0xffffffffu, 0, -1, 0, nullptr);
  float d[4];
  for (int e = 0; e < 4; e++) {
    int row = g + (e >= 2 ? 8 : 0), col = 2 * q + (e & 1);
    float acc = 0.0f;
    for (int k = 0; k < 16; k++) {
      const Fragments *fa = lanes[(row & 7) * 4 + (k & 7) / 2], *fb = lanes[col * 4 + (k & 7) / 2];
      float x = mma_element(&fa->a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k & 1, bf16);
      float y = mma_element(&fb->b[k >= 8 ? 1 : 0], k & 1, bf16);
      acc += x * y;
    }
    d[e] = c[e] + acc;
  }
  warp_exchange(0xffffffffu, 0, -1, 0, nullptr); /* every lane has read the others' fragments */
  for (int e = 0; e < 4; e++) c[e] = d[e];
}
} // namespace cuemu

/* ---- builtin variables ----------------------------------------------------------------------- */
#define threadIdx (static_cast<const uint3 &>(::cuemu::cur_thread))
#define blockIdx (static_cast<const uint3 &>(::cuemu::cur_block))
#define blockDim (static_cast<const dim3 &>(::cuemu::cur_block_dim))
#define gridDim (static_cast<const dim3 &>(::cuemu::cur_grid_dim))
constexpr int warpSize = 32;

/* ---- synchronisation ------------------------------------------------------------------------- */
inline void __syncthreads() { ::cuemu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::cuemu::warp_exchange(mask, 0, -1, 0, nullptr); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __trap() { ::cuemu::trap("__trap() called"); }

/* ---- warp shuffles and votes ----------------------------------------------------------------- */
template <typename T> inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32) {
  ::cuemu::check_width(width);
  int lane = ::cuemu::lane_id(), base = lane & ~(width - 1);
  int src = base + (srcLane & (width - 1));
  return ::cuemu::from_bits<T>(::cuemu::warp_exchange(mask, ::cuemu::to_bits(var), src, 0, nullptr));
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32) {
  ::cuemu::check_width(width);
  int lane = ::cuemu::lane_id(), src = lane ^ laneMask;
  /* a lane may read earlier segments of width lanes, not later ones: then its own value */
  if (src >= (lane & ~(width - 1)) + width) src = -1;
  if (src > 31) src = -1;
  return ::cuemu::from_bits<T>(::cuemu::warp_exchange(mask, ::cuemu::to_bits(var), src, 0, nullptr));
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  ::cuemu::check_width(width);
  int lane = ::cuemu::lane_id();
  int src = (lane & (width - 1)) + (int)delta >= width ? -1 : lane + (int)delta;
  return ::cuemu::from_bits<T>(::cuemu::warp_exchange(mask, ::cuemu::to_bits(var), src, 0, nullptr));
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  ::cuemu::check_width(width);
  int lane = ::cuemu::lane_id();
  int src = (lane & (width - 1)) - (int)delta < 0 ? -1 : lane - (int)delta;
  return ::cuemu::from_bits<T>(::cuemu::warp_exchange(mask, ::cuemu::to_bits(var), src, 0, nullptr));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  unsigned b = 0;
  ::cuemu::warp_exchange(mask, 0, -1, pred != 0, &b);
  return b;
}
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline unsigned __activemask() { return 0xffffffffu; } /* see README: warps are not lockstep */

/* ---- bit casts and integer intrinsics -------------------------------------------------------- */
inline float __int_as_float(int x) { return ::cuemu::from_bits<float>((uint32_t)x); }
inline float __uint_as_float(unsigned x) { return ::cuemu::from_bits<float>(x); }
inline int __float_as_int(float x) { return (int)(uint32_t)::cuemu::to_bits(x); }
inline unsigned __float_as_uint(float x) { return (unsigned)::cuemu::to_bits(x); }
inline double __longlong_as_double(long long x) { return ::cuemu::from_bits<double>((uint64_t)x); }
inline long long __double_as_longlong(double x) { return (long long)::cuemu::to_bits(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline int __mul24(int a, int b) { return (int)((long long)((a << 8) >> 8) * ((b << 8) >> 8)); }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
template <typename T> inline T __ldg(const T *p) { return *p; }

/* ---- min / max (the device overloads; host std::min is a template and needs equal types) ----- */
#define CUEMU_MINMAX(T)                                                                           \
  inline T min(T a, T b) { return a < b ? a : b; }                                               \
  inline T max(T a, T b) { return a > b ? a : b; }
CUEMU_MINMAX(int)
CUEMU_MINMAX(unsigned)
CUEMU_MINMAX(long)
CUEMU_MINMAX(unsigned long)
CUEMU_MINMAX(long long)
CUEMU_MINMAX(unsigned long long)
#undef CUEMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
/* mixed int / unsigned, as the device overloads: the unsigned comparison */
inline unsigned min(int a, unsigned b) { return min((unsigned)a, b); }
inline unsigned min(unsigned a, int b) { return min(a, (unsigned)b); }
inline unsigned max(int a, unsigned b) { return max((unsigned)a, b); }
inline unsigned max(unsigned a, int b) { return max(a, (unsigned)b); }

/* ---- float math: the host libm stands in for the device's (ulp-level differences only) -------- */
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline void __sincosf(float x, float *s, float *c) { *s = sinf(x), *c = cosf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x != x ? 0.0f : x; }
inline float saturate(float x) { return __saturatef(x); }

/* ---- atomics: no fiber is preempted between the read and the write, so these are atomic ------- */
#define CUEMU_ATOMIC_ADD(T)                                                                        \
  inline T atomicAdd(T *p, T v) {                                                                  \
    T o = *p;                                                                                      \
    *p = o + v;                                                                                    \
    return o;                                                                                      \
  }                                                                                                \
  inline T atomicSub(T *p, T v) {                                                                  \
    T o = *p;                                                                                      \
    *p = o - v;                                                                                    \
    return o;                                                                                      \
  }                                                                                                \
  inline T atomicExch(T *p, T v) {                                                                 \
    T o = *p;                                                                                      \
    *p = v;                                                                                        \
    return o;                                                                                      \
  }
CUEMU_ATOMIC_ADD(int)
CUEMU_ATOMIC_ADD(unsigned)
CUEMU_ATOMIC_ADD(unsigned long long)
CUEMU_ATOMIC_ADD(float)
CUEMU_ATOMIC_ADD(double)
#undef CUEMU_ATOMIC_ADD
#define CUEMU_ATOMIC_INT(T)                                                                        \
  inline T atomicMax(T *p, T v) {                                                                  \
    T o = *p;                                                                                      \
    *p = o > v ? o : v;                                                                            \
    return o;                                                                                      \
  }                                                                                                \
  inline T atomicMin(T *p, T v) {                                                                  \
    T o = *p;                                                                                      \
    *p = o < v ? o : v;                                                                            \
    return o;                                                                                      \
  }                                                                                                \
  inline T atomicCAS(T *p, T cmp, T v) {                                                           \
    T o = *p;                                                                                      \
    if (o == cmp) *p = v;                                                                          \
    return o;                                                                                      \
  }                                                                                                \
  inline T atomicAnd(T *p, T v) {                                                                  \
    T o = *p;                                                                                      \
    *p = o & v;                                                                                    \
    return o;                                                                                      \
  }                                                                                                \
  inline T atomicOr(T *p, T v) {                                                                   \
    T o = *p;                                                                                      \
    *p = o | v;                                                                                    \
    return o;                                                                                      \
  }                                                                                                \
  inline T atomicXor(T *p, T v) {                                                                  \
    T o = *p;                                                                                      \
    *p = o ^ v;                                                                                    \
    return o;                                                                                      \
  }
CUEMU_ATOMIC_INT(int)
CUEMU_ATOMIC_INT(unsigned)
CUEMU_ATOMIC_INT(unsigned long long)
#undef CUEMU_ATOMIC_INT
inline unsigned atomicInc(unsigned *p, unsigned limit) {
  unsigned o = *p;
  *p = o >= limit ? 0u : o + 1u;
  return o;
}

#endif
