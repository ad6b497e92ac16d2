/* test_emu.cu: the CUDA-on-CPU emulator itself (ctest cuda.emu_selftest; README.md here).
 * Plain CUDA: built here through emu_translate against the emulator; `nvcc -std=c++17 -o t
 * test_emu.cu` builds it for a GPU, where every check but the emulator-only ones (deadlock
 * report, under CPLAN_CUDA_EMU) must pass the same way, which is how the emulated semantics
 * were chosen: the CUDA programming guide's for shuffles, votes, barriers and launch limits
 * (with -I kernels/cuda, for cuda_common.h's mma16816).
 *
 * Checks: the builtin variables over a 3-D grid of 3-D blocks; a block reduction through
 * __shared__ and __syncthreads with warp shuffles under `if (threadIdx.x < 32)`; every shuffle
 * (xor, down, up, indexed) at widths 32, 16 and 4, of float, double and int; the votes;
 * atomicAdd; `extern __shared__` in a template kernel launched with <<<g, b, bytes>>>; the
 * launch errors the runtime gives (block and grid limits, dynamic shared memory over 48 KiB
 * without the opt-in, an unknown stream); copies from memory that is not the device's; and, in a
 * child process, that a deadlock is reported rather than hung. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "cuda_common.h" /* kernels/cuda: mma16816, pack2 */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>
#ifdef CPLAN_CUDA_EMU
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

static int failures, checks;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    checks++;                                                                                      \
    if (!(cond)) {                                                                                 \
      failures++;                                                                                  \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
      printf(__VA_ARGS__);                                                                         \
      printf("\n");                                                                                \
    }                                                                                              \
  } while (0)

#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));               \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* ---- builtins: every thread of a 3-D grid writes its coordinates once ------------------------- */
__global__ void k_coords(int *out) {
  unsigned bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned g = bid * (blockDim.x * blockDim.y * blockDim.z) + tid;
  atomicAdd(&out[6 * g], 1); /* how often this slot was written */
  out[6 * g + 1] = (int)(threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z);
  out[6 * g + 2] = (int)(blockIdx.x + 10 * blockIdx.y + 100 * blockIdx.z);
  out[6 * g + 3] = (int)(blockDim.x + 10 * blockDim.y + 100 * blockDim.z);
  out[6 * g + 4] = (int)(gridDim.x + 10 * gridDim.y + 100 * gridDim.z);
  out[6 * g + 5] = warpSize;
}

static void test_coords(void) {
  dim3 grid(3, 2, 2), block(5, 3, 4);
  int n = 12 * 60, *d, *h = (int *)malloc(sizeof(int) * 6 * n);
  CUDA_OK(cudaMalloc((void **)&d, sizeof(int) * 6 * n));
  CUDA_OK(cudaMemset(d, 0, sizeof(int) * 6 * n));
  k_coords<<<grid, block>>>(d);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(h, d, sizeof(int) * 6 * n, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int bz = 0; bz < 2; bz++)
    for (int by = 0; by < 2; by++)
      for (int bx = 0; bx < 3; bx++)
        for (int tz = 0; tz < 4; tz++)
          for (int ty = 0; ty < 3; ty++)
            for (int tx = 0; tx < 5; tx++) {
              int g = ((bz * 2 + by) * 3 + bx) * 60 + (tz * 3 + ty) * 5 + tx, *r = h + 6 * g;
              bad += r[0] != 1 || r[1] != tx + 10 * ty + 100 * tz || r[2] != bx + 10 * by + 100 * bz ||
                     r[3] != 5 + 30 + 400 || r[4] != 3 + 20 + 200 || r[5] != 32;
            }
  CHECK(bad == 0, "builtins: %d of %d threads saw wrong coordinates", bad, n);
  cudaFree(d);
  free(h);
}

/* ---- a block reduction as kernels/cuda/cuda_common.h writes it --------------------------------- */
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void k_block_sum(float *out, const float *x, int n) {
  __shared__ float sh[33];
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    float u = threadIdx.x < (blockDim.x + 31) / 32 ? sh[threadIdx.x] : 0.0f;
    u = warp_sum(u);
    if (threadIdx.x == 0) sh[32] = u;
  }
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = sh[32]; /* every thread sees the total */
}

static void test_block_sum(void) {
  const int n = 10007, threads = 512, blocks = 3;
  float *hx = (float *)malloc(sizeof(float) * n), *ho = (float *)malloc(sizeof(float) * threads * blocks);
  for (int i = 0; i < n; i++) hx[i] = (float)(i % 13); /* small integers: the sum is exact */
  double want = 0;
  for (int i = 0; i < n; i++) want += hx[i];
  float *dx, *dout;
  CUDA_OK(cudaMalloc((void **)&dx, sizeof(float) * n));
  CUDA_OK(cudaMalloc((void **)&dout, sizeof(float) * threads * blocks));
  CUDA_OK(cudaMemcpy(dx, hx, sizeof(float) * n, cudaMemcpyHostToDevice));
  k_block_sum<<<blocks, threads>>>(dout, dx, n);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(ho, dout, sizeof(float) * threads * blocks, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < threads * blocks; i++) bad += ho[i] != (float)want;
  CHECK(bad == 0, "block sum: %d threads did not get %g (thread 0: %g)", bad, want, (double)ho[0]);
  cudaFree(dx), cudaFree(dout);
  free(hx), free(ho);
}

/* ---- shuffles and votes -------------------------------------------------------------------------- */
/* out[k][t]: shuffle k of thread t's value */
template <typename T> __global__ void k_shuffles(T *out, int width) {
  int t = threadIdx.x;
  T v = (T)(100 + t);
  int nt = blockDim.x;
  out[0 * nt + t] = __shfl_xor_sync(0xffffffffu, v, 1, width);
  out[1 * nt + t] = __shfl_xor_sync(0xffffffffu, v, 6, width);
  out[2 * nt + t] = __shfl_down_sync(0xffffffffu, v, 3, width);
  out[3 * nt + t] = __shfl_up_sync(0xffffffffu, v, 2, width);
  out[4 * nt + t] = __shfl_sync(0xffffffffu, v, 5, width);
  out[5 * nt + t] = __shfl_sync(0xffffffffu, v, (t * 7) % 32, width);
}

/* CUDA's definitions (programming guide, warp shuffle functions), lane l of segments of w */
static int want_shuffle(int k, int t, int w) {
  int lane = t % 32, warp0 = t - lane, seg = lane & ~(w - 1), src;
  switch (k) {
  case 0: src = lane ^ 1; return 100 + warp0 + (src >= seg + w ? lane : src);
  case 1: src = lane ^ 6; return 100 + warp0 + (src >= seg + w ? lane : src);
  case 2: return 100 + warp0 + ((lane % w) + 3 >= w ? lane : lane + 3);
  case 3: return 100 + warp0 + ((lane % w) - 2 < 0 ? lane : lane - 2);
  case 4: return 100 + warp0 + seg + 5 % w;
  default: return 100 + warp0 + seg + ((t * 7) % 32) % w;
  }
}

template <typename T> static void test_shuffles_of(const char *type) {
  const int nt = 64;
  T *d, h[6 * nt];
  CUDA_OK(cudaMalloc((void **)&d, sizeof h));
  int widths[3] = {32, 16, 4};
  for (int wi = 0; wi < 3; wi++) {
    k_shuffles<T><<<1, nt>>>(d, widths[wi]);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int k = 0; k < 6; k++) {
      int bad = 0, first = -1;
      for (int t = 0; t < nt; t++)
        if (h[k * nt + t] != (T)want_shuffle(k, t, widths[wi])) bad++, first = first < 0 ? t : first;
      CHECK(bad == 0, "shuffle %d of %s at width %d: %d lanes wrong (lane %d: %g, want %d)", k, type, widths[wi], bad,
            first, first < 0 ? 0.0 : (double)h[k * nt + first], first < 0 ? 0 : want_shuffle(k, first, widths[wi]));
    }
  }
  cudaFree(d);
}

__global__ void k_votes(unsigned *out) {
  int t = threadIdx.x;
  out[4 * t + 0] = __ballot_sync(0xffffffffu, t % 3 == 0);
  out[4 * t + 1] = __any_sync(0xffffffffu, t == 40);
  out[4 * t + 2] = __all_sync(0xffffffffu, t < 60);
  /* a subset of the lanes */
  out[4 * t + 3] = (t & 31) < 8 ? __ballot_sync(0x000000ffu, t & 1) : 7u;
}

static void test_votes(void) {
  unsigned *d, h[4 * 64];
  CUDA_OK(cudaMalloc((void **)&d, sizeof h));
  k_votes<<<1, 64>>>(d);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int t = 0; t < 64; t++) {
    unsigned ballot = 0;
    for (int l = 0; l < 32; l++) ballot |= (unsigned)(((t / 32) * 32 + l) % 3 == 0) << l;
    bad += h[4 * t] != ballot || h[4 * t + 1] != (unsigned)(t >= 32) || h[4 * t + 2] != (unsigned)(t < 32) ||
           h[4 * t + 3] != ((t & 31) < 8 ? 0xaau : 7u);
  }
  CHECK(bad == 0, "votes: %d threads wrong", bad);
  cudaFree(d);
}

/* ---- dynamic shared memory in a template kernel ------------------------------------------------- */
template <typename T> __global__ void k_reverse(T *out, const T *x) {
  extern __shared__ T buf[];
  int t = threadIdx.x, n = blockDim.x;
  buf[t] = x[blockIdx.x * n + t];
  __syncthreads();
  out[blockIdx.x * n + t] = buf[n - 1 - t];
}

__global__ void k_count(int *out) {
  __shared__ int c;
  if (threadIdx.x == 0) c = 0;
  __syncthreads();
  atomicAdd(&c, (int)threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = c;
}

static void test_shared(void) {
  const int n = 1000, blocks = 4;
  double *hx = (double *)malloc(sizeof(double) * n * blocks), *ho = (double *)malloc(sizeof(double) * n * blocks);
  for (int i = 0; i < n * blocks; i++) hx[i] = i * 0.5;
  double *dx, *dout;
  CUDA_OK(cudaMalloc((void **)&dx, sizeof(double) * n * blocks));
  CUDA_OK(cudaMalloc((void **)&dout, sizeof(double) * n * blocks));
  CUDA_OK(cudaMemcpy(dx, hx, sizeof(double) * n * blocks, cudaMemcpyHostToDevice));
  k_reverse<double><<<blocks, n, n * sizeof(double)>>>(dout, dx);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(ho, dout, sizeof(double) * n * blocks, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int b = 0; b < blocks; b++)
    for (int t = 0; t < n; t++) bad += ho[b * n + t] != hx[b * n + n - 1 - t];
  CHECK(bad == 0, "extern __shared__: %d elements wrong", bad);
  int *dc, hc[3];
  CUDA_OK(cudaMalloc((void **)&dc, sizeof hc));
  k_count<<<3, 300>>>(dc);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(hc, dc, sizeof hc, cudaMemcpyDeviceToHost));
  CHECK(hc[0] == 299 * 300 / 2 && hc[2] == 299 * 300 / 2, "atomicAdd on __shared__: %d, want %d", hc[0], 299 * 300 / 2);
  cudaFree(dx), cudaFree(dout), cudaFree(dc);
  free(hx), free(ho);
}

/* ---- launch configuration errors, as the runtime reports them ------------------------------------ */
__global__ void k_nop(int *p) {
  if (p) p[0] = 1;
}

static void launch_fails(dim3 grid, dim3 block, size_t shmem, cudaStream_t s, cudaError_t want, const char *what) {
  k_nop<<<grid, block, shmem, s>>>(NULL);
  cudaError_t peek = cudaPeekAtLastError(), got = cudaGetLastError(), after = cudaGetLastError();
  CHECK(peek == want && got == want && after == cudaSuccess, "%s: got %s (%s), want %s; then %s", what,
        cudaGetErrorName(got), cudaGetErrorString(got), cudaGetErrorName(want), cudaGetErrorName(after));
}

static void test_launch_errors(void) {
  launch_fails(1, 1025, 0, 0, cudaErrorInvalidConfiguration, "1025 threads");
  launch_fails(1, dim3(32, 32, 2), 0, 0, cudaErrorInvalidConfiguration, "2048 threads");
  launch_fails(1, dim3(1, 1, 65), 0, 0, cudaErrorInvalidConfiguration, "block z 65");
  launch_fails(dim3(1, 65536), 32, 0, 0, cudaErrorInvalidConfiguration, "grid y 65536");
  launch_fails(dim3(0), 32, 0, 0, cudaErrorInvalidConfiguration, "empty grid");
  launch_fails(1, 32, 48 * 1024 + 1, 0, cudaErrorInvalidValue, "48 KiB + 1 of dynamic shared memory");
  CHECK(strcmp(cudaGetErrorString(cudaErrorInvalidConfiguration), "invalid configuration argument") == 0,
        "the message of cudaErrorInvalidConfiguration");
  int *d;
  CUDA_OK(cudaMalloc((void **)&d, sizeof(int)));
  CUDA_OK(cudaFuncSetAttribute(k_nop, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
  /* the limits themselves are fine */
  k_nop<<<1, dim3(32, 32), 100 * 1024>>>(d);
  CHECK(cudaGetLastError() == cudaSuccess, "a launch of 1024 threads, with 100 KiB opted in, failed");
  k_nop<<<dim3(1, 65535), 1>>>(d);
  CHECK(cudaGetLastError() == cudaSuccess, "a launch of 65535 blocks along y failed");
  int one = 0;
  CUDA_OK(cudaMemcpy(&one, d, sizeof one, cudaMemcpyDeviceToHost));
  CHECK(one == 1, "the launch at the limits did not run");
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  k_nop<<<1, 32, 0, s>>>(d);
  CHECK(cudaGetLastError() == cudaSuccess, "a launch on a created stream failed");
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaStreamDestroy(s));
#ifdef CPLAN_CUDA_EMU /* a destroyed stream: undefined on a GPU, an error here */
  launch_fails(1, 32, 0, s, cudaErrorInvalidResourceHandle, "a destroyed stream");
#endif
  int host[4] = {0};
  CHECK(cudaMemcpy(host, host + 2, sizeof(int), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
        "a device-to-host copy from host memory did not fail");
  CHECK(cudaMemcpy(d, host, 2 * sizeof(int), cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
        "a copy past the end of an allocation did not fail");
  cudaGetLastError();
  cudaFree(d);
}


/* ---- nvcuda::wmma: a GEMM of 16 x 16 tiles, one warp per tile ----------------------------------- */
using namespace nvcuda;

/* c[M, N] = scale * a[M, K] b[K, N] (+ c when acc); a row-major, b row- or column-major (ldb) */
template <typename T, typename LB>
__global__ void k_wmma_gemm(float *c, const T *a, const T *b, int N, int K, int ldb, float scale, int acc) {
  int tm = blockIdx.y, tn = blockIdx.x;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  float *ct = c + (size_t)tm * 16 * N + tn * 16;
  if (acc) wmma::load_matrix_sync(fc, ct, N, wmma::mem_row_major);
  else wmma::fill_fragment(fc, 0.0f);
  for (int k0 = 0; k0 < K; k0 += 16) {
    wmma::load_matrix_sync(fa, a + (size_t)tm * 16 * K + k0, K);
    if (std::is_same<LB, wmma::row_major>::value) wmma::load_matrix_sync(fb, b + (size_t)k0 * ldb + tn * 16, ldb);
    else wmma::load_matrix_sync(fb, b + (size_t)tn * 16 * ldb + k0, ldb);
    wmma::mma_sync(fc, fa, fb, fc);
  }
  for (int i = 0; i < fc.num_elements; i++) fc.x[i] *= scale; /* element-wise, as programs may */
  wmma::store_matrix_sync(ct, fc, N, wmma::mem_row_major);
}

/* m32n8k16 with an f16 accumulator stored column-major: c[32, 8] = a[32, 16] b[16, 8] */
__global__ void k_wmma_32x8(__half *c, const __half *a, const __half *b) {
  wmma::fragment<wmma::matrix_a, 32, 8, 16, __half, wmma::col_major> fa;
  wmma::fragment<wmma::matrix_b, 32, 8, 16, __half, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 32, 8, 16, __half> fc;
  wmma::fill_fragment(fc, __float2half_rn(1.0f));
  wmma::load_matrix_sync(fa, a, 32); /* col-major a: element (r, k) at a[k * 32 + r] */
  wmma::load_matrix_sync(fb, b, 8);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 32, wmma::mem_col_major);
}

/* m16n16k8 in tf32: c[16, 16] = a[16, 8] b[8, 16], integers (exact) */
__global__ void k_wmma_tf32(float *c, const float *a, const float *b) {
  wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  wmma::load_matrix_sync(fa, a, 8);
  wmma::load_matrix_sync(fb, b, 8); /* col-major b: element (k, n) at b[n * 8 + k] */
  for (int i = 0; i < fa.num_elements; i++) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
  for (int i = 0; i < fb.num_elements; i++) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

static float to_float(__half h) { return __half2float(h); }
static float to_float(__nv_bfloat16 h) { return __bfloat162float(h); }
static void from_float(float f, __half *h) { *h = __float2half_rn(f); }
static void from_float(float f, __nv_bfloat16 *h) { *h = __float2bfloat16_rn(f); }

template <typename T, typename LB> static void test_wmma_of(const char *what, bool integers) {
  const int M = 32, N = 48, K = 64;
  const bool colb = std::is_same<LB, wmma::col_major>::value;
  const int ldb = colb ? K : N;
  T *ha = (T *)malloc(sizeof(T) * M * K), *hb = (T *)malloc(sizeof(T) * K * N);
  float *hc0 = (float *)malloc(sizeof(float) * M * N), *hc = (float *)malloc(sizeof(float) * M * N);
  unsigned s = 12345;
  for (int i = 0; i < M * K; i++) {
    s = s * 1103515245u + 12345u;
    from_float(integers ? (float)((int)(s >> 16) % 7 - 3) : (float)(s >> 8) / 16777216.0f - 0.5f, &ha[i]);
  }
  for (int i = 0; i < K * N; i++) {
    s = s * 1103515245u + 12345u;
    from_float(integers ? (float)((int)(s >> 16) % 7 - 3) : (float)(s >> 8) / 16777216.0f - 0.5f, &hb[i]);
  }
  for (int i = 0; i < M * N; i++) hc0[i] = (float)(i % 5);
  T *da, *db;
  float *dc;
  CUDA_OK(cudaMalloc((void **)&da, sizeof(T) * M * K));
  CUDA_OK(cudaMalloc((void **)&db, sizeof(T) * K * N));
  CUDA_OK(cudaMalloc((void **)&dc, sizeof(float) * M * N));
  CUDA_OK(cudaMemcpy(da, ha, sizeof(T) * M * K, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db, hb, sizeof(T) * K * N, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dc, hc0, sizeof(float) * M * N, cudaMemcpyHostToDevice));
  k_wmma_gemm<T, LB><<<dim3(N / 16, M / 16), 32>>>(dc, da, db, N, K, ldb, 0.5f, 1);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(hc, dc, sizeof(float) * M * N, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double want = hc0[i * N + j];
      for (int k = 0; k < K; k++)
        want += (double)to_float(ha[i * K + k]) * to_float(hb[colb ? j * K + k : k * N + j]);
      want *= 0.5;
      double d = fabs(hc[i * N + j] - want);
      worst = d > worst ? d : worst;
    }
  /* small integers: every product and sum is exact in f32; else f32 accumulation of 64 terms */
  CHECK(integers ? worst == 0 : worst <= 1e-5, "wmma %s: max |c - ref| = %g", what, worst);
  cudaFree(da), cudaFree(db), cudaFree(dc);
  free(ha), free(hb), free(hc0), free(hc);
}

static void test_wmma(void) {
  test_wmma_of<__half, wmma::row_major>("f16, b row-major, integers", true);
  test_wmma_of<__half, wmma::col_major>("f16, b col-major, integers", true);
  test_wmma_of<__nv_bfloat16, wmma::row_major>("bf16, b row-major, integers", true);
  test_wmma_of<__nv_bfloat16, wmma::col_major>("bf16, b col-major, integers", true);
  test_wmma_of<__half, wmma::col_major>("f16, b col-major, fractions", false);
  test_wmma_of<__nv_bfloat16, wmma::row_major>("bf16, b row-major, fractions", false);

  __half ha[32 * 16], hb[16 * 8], hc[32 * 8];
  for (int i = 0; i < 32 * 16; i++) ha[i] = __float2half_rn((float)(i % 5 - 2));
  for (int i = 0; i < 16 * 8; i++) hb[i] = __float2half_rn((float)(i % 3 - 1));
  __half *da, *db, *dc;
  CUDA_OK(cudaMalloc((void **)&da, sizeof ha));
  CUDA_OK(cudaMalloc((void **)&db, sizeof hb));
  CUDA_OK(cudaMalloc((void **)&dc, sizeof hc));
  CUDA_OK(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice));
  k_wmma_32x8<<<1, 32>>>(dc, da, db);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(hc, dc, sizeof hc, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int r = 0; r < 32; r++)
    for (int c = 0; c < 8; c++) {
      float want = 1.0f;
      for (int k = 0; k < 16; k++) want += __half2float(ha[k * 32 + r]) * __half2float(hb[k * 8 + c]);
      bad += __half2float(hc[c * 32 + r]) != want;
    }
  CHECK(bad == 0, "wmma m32n8k16, f16 accumulator, col-major a and c: %d of 256 wrong", bad);
  cudaFree(da), cudaFree(db), cudaFree(dc);

  float ta[16 * 8], tb[16 * 8], tc[16 * 16], *dta, *dtb, *dtc;
  for (int i = 0; i < 16 * 8; i++) ta[i] = (float)(i % 9 - 4), tb[i] = (float)(i % 7 - 3);
  CUDA_OK(cudaMalloc((void **)&dta, sizeof ta));
  CUDA_OK(cudaMalloc((void **)&dtb, sizeof tb));
  CUDA_OK(cudaMalloc((void **)&dtc, sizeof tc));
  CUDA_OK(cudaMemcpy(dta, ta, sizeof ta, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dtb, tb, sizeof tb, cudaMemcpyHostToDevice));
  k_wmma_tf32<<<1, 32>>>(dtc, dta, dtb);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(tc, dtc, sizeof tc, cudaMemcpyDeviceToHost));
  bad = 0;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) {
      float want = 0.0f;
      for (int k = 0; k < 8; k++) want += ta[r * 8 + k] * tb[c * 8 + k];
      bad += tc[r * 16 + c] != want;
    }
  CHECK(bad == 0, "wmma m16n16k8 tf32: %d of 256 wrong", bad);
  cudaFree(dta), cudaFree(dtb), cudaFree(dtc);

  /* tf32: to nearest, ties away from zero, at 10 mantissa bits */
#ifdef CPLAN_CUDA_EMU
  CHECK(wmma::__float_to_tf32(1.0f + 1.0f / 2048) == 1.0f + 1.0f / 1024 &&
            wmma::__float_to_tf32(1.0f + 1.0f / 4096) == 1.0f && wmma::__float_to_tf32(-(1.0f + 3.0f / 2048)) == -(1.0f + 2.0f / 1024),
        "__float_to_tf32 rounding");
#endif
}

/* ---- mma16816 (cuda_common.h: mma.sync.m16n8k16, the PTX ISA's fragment layout) ---------------
 * c[16, 16] = c0 + a[16, 32] b[32, 16] (all row-major) on one warp: two n-tiles of 8, two k-steps of
 * 16, every fragment element loaded from global memory by the layout cuda_common.h writes out. On a
 * GPU this checks that layout against the tensor cores; here, the emulator against the same text. */
template <typename T> __global__ void k_mma16816(float *c, const T *a, const T *b) {
  int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  for (int nt = 0; nt < 2; nt++) {
    float acc[4];
    for (int e = 0; e < 4; e++) acc[e] = c[(g + (e >= 2 ? 8 : 0)) * 16 + nt * 8 + 2 * q + (e & 1)];
    for (int kt = 0; kt < 2; kt++) {
      unsigned fa[4], fb[2];
      for (int r = 0; r < 4; r++) {
        int row = g + (r & 1) * 8, col = kt * 16 + 2 * q + (r >> 1) * 8;
        fa[r] = pack2<T>(ld(a[row * 32 + col]), ld(a[row * 32 + col + 1]));
      }
      for (int r = 0; r < 2; r++) {
        int k = kt * 16 + 2 * q + r * 8, n = nt * 8 + g;
        fb[r] = pack2<T>(ld(b[k * 16 + n]), ld(b[(k + 1) * 16 + n]));
      }
      mma16816<T>(acc, fa, fb);
    }
    for (int e = 0; e < 4; e++) c[(g + (e >= 2 ? 8 : 0)) * 16 + nt * 8 + 2 * q + (e & 1)] = acc[e];
  }
}

template <typename T> static void test_mma16816_of(const char *what, bool integers) {
  T ha[16 * 32], hb[32 * 16];
  float hc0[16 * 16], hc[16 * 16];
  unsigned s = 777;
  for (int i = 0; i < 16 * 32; i++) {
    s = s * 1103515245u + 12345u;
    from_float(integers ? (float)((int)(s >> 16) % 9 - 4) : (float)(s >> 8) / 16777216.0f - 0.5f, &ha[i]);
    s = s * 1103515245u + 12345u;
    from_float(integers ? (float)((int)(s >> 16) % 7 - 3) : (float)(s >> 8) / 16777216.0f - 0.5f, &hb[i]);
  }
  for (int i = 0; i < 16 * 16; i++) hc0[i] = (float)(i % 11 - 5);
  T *da, *db;
  float *dc;
  CUDA_OK(cudaMalloc((void **)&da, sizeof ha));
  CUDA_OK(cudaMalloc((void **)&db, sizeof hb));
  CUDA_OK(cudaMalloc((void **)&dc, sizeof hc));
  CUDA_OK(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dc, hc0, sizeof hc0, cudaMemcpyHostToDevice));
  k_mma16816<T><<<1, 32>>>(dc, da, db);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(hc, dc, sizeof hc, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      double want = hc0[i * 16 + j];
      for (int k = 0; k < 32; k++) want += (double)to_float(ha[i * 32 + k]) * to_float(hb[k * 16 + j]);
      double d = fabs(hc[i * 16 + j] - want);
      worst = d > worst ? d : worst;
    }
  CHECK(integers ? worst == 0 : worst <= 1e-5, "mma16816 %s: max |c - ref| = %g", what, worst);
  cudaFree(da), cudaFree(db), cudaFree(dc);
}

static void test_mma16816(void) {
  test_mma16816_of<__nv_bfloat16>("bf16, integers", true);
  test_mma16816_of<__half>("f16, integers", true);
  test_mma16816_of<__nv_bfloat16>("bf16, fractions", false);
  test_mma16816_of<__half>("f16, fractions", false);
}

#ifdef CPLAN_CUDA_EMU
/* lanes 0..30 shuffle with the full mask while lane 31 waits at __syncthreads: on a GPU, a hang */
__global__ void k_deadlock(float *out) {
  float v = (float)threadIdx.x;
  if (threadIdx.x == 31) __syncthreads();
  else v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

/* recursion far past the 64 KiB fiber stack */
__device__ int deep(int n) {
  volatile char buf[512];
  buf[0] = (char)n;
  return n ? deep(n - 1) + buf[0] : 0;
}
__global__ void k_overflow(int *out) { out[threadIdx.x] = deep(100000); }

/* runs f in a child process: its stderr into msg, its wait status */
static int in_child(void (*f)(void), char *msg, size_t size) {
  fflush(stdout);
  int fds[2];
  if (pipe(fds) != 0) exit(1);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    f();
    _exit(0);
  }
  close(fds[1]);
  size_t len = 0;
  ssize_t got;
  while (len + 1 < size && (got = read(fds[0], msg + len, size - 1 - len)) > 0) len += (size_t)got;
  msg[len] = 0;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

static void run_deadlock(void) {
  float *d;
  cudaMalloc((void **)&d, 32 * sizeof(float));
  k_deadlock<<<1, 32>>>(d);
  cudaDeviceSynchronize(); /* the kernel has run (CUEMU_DEFER=1 runs it here) */
}

static void run_overflow(void) {
  int *d;
  cudaMalloc((void **)&d, 32 * sizeof(int));
  k_overflow<<<1, 32>>>(d);
  cudaDeviceSynchronize(); /* the kernel has run (CUEMU_DEFER=1 runs it here) */
}

/* lane 3 changes its copy of an operand: not portable (the element-to-lane mapping is unspecified) */
__global__ void k_wmma_divergent(float *c, const __half *a) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, a, 16);
  if (threadIdx.x == 3) fa.x[0] = __float2half_rn(2.0f);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

static void run_wmma_divergent(void) {
  __half *a;
  float *c;
  cudaMalloc((void **)&a, 256 * sizeof(__half));
  cudaMalloc((void **)&c, 256 * sizeof(float));
  cudaMemset(a, 0, 256 * sizeof(__half));
  k_wmma_divergent<<<1, 32>>>(c, a);
  cudaDeviceSynchronize(); /* the kernel has run (CUEMU_DEFER=1 runs it here) */
}

static void test_deadlock(void) {
  char msg[4096];
  int status = in_child(run_deadlock, msg, sizeof msg);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strstr(msg, "cuda emu: deadlock") &&
            strstr(msg, "lane 31, which waits at __syncthreads") && strstr(msg, "test_emu.cu:"),
        "a deadlock: status %d, message '%s'", status, msg);
  printf("deadlock report (expected): %s", msg);
  status = in_child(run_overflow, msg, sizeof msg);
  /* the emulator's report, or AddressSanitizer's in a sanitized build */
  bool emu = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strstr(msg, "KiB fiber stack") &&
             strstr(msg, "test_emu.cu:");
  bool asan = strstr(msg, "AddressSanitizer: stack-overflow") != NULL;
  CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && (emu || asan), "a stack overflow: status %d, message '%s'",
        status, msg);
  printf("stack overflow report (expected): %.300s\n", msg);
  status = in_child(run_wmma_divergent, msg, sizeof msg);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strstr(msg, "lanes of the warp hold different fragments") &&
            strstr(msg, "thread (3, 0, 0)"),
        "a lane-dependent fragment: status %d, message '%s'", status, msg);
  printf("wmma report (expected): %s", msg);
}
#endif

#ifdef CPLAN_CUDA_EMU
__global__ void k_add_one(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}

/* CUEMU_DEFER=1 (cuda.emu_selftest_defer): work on a stream runs when the host waits for it, in
 * the stream's order; a legacy-stream copy does not wait for a non-blocking stream, nor it for the
 * copy; a pageable source is staged at the call, a pinned one read when the copy runs. */
static void test_defer(void) {
  if (!cuemu::deferring()) return;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float *d, *pinned, page[4] = {1, 2, 3, 4};
  cudaMalloc((void **)&d, 4 * sizeof(float));
  cudaMallocHost((void **)&pinned, 4 * sizeof(float));
  cudaMemcpyAsync(d, page, sizeof page, cudaMemcpyHostToDevice, s);
  page[0] = 100; /* staged: the copy keeps 1 */
  k_add_one<<<1, 4, 0, s>>>(d, 4);
  for (int i = 0; i < 4; i++) pinned[i] = -1;
  cudaMemcpyAsync(pinned, d, 4 * sizeof(float), cudaMemcpyDeviceToHost, s);
  CHECK(pinned[0] == -1 && pinned[3] == -1, "defer: a copy to pinned memory ran before the host waited (%g)",
        (double)pinned[0]);
  cudaStreamSynchronize(s);
  CHECK(pinned[0] == 2 && pinned[3] == 5, "defer: after the sync, pinned memory holds %g %g (expected 2 5)",
        (double)pinned[0], (double)pinned[3]);
  /* a copy from pinned memory reads it when it runs: the later value */
  pinned[1] = 7;
  cudaMemcpyAsync(d, pinned, 4 * sizeof(float), cudaMemcpyHostToDevice, s);
  pinned[1] = 8;
  cudaMemcpyAsync(page, d, sizeof page, cudaMemcpyDeviceToHost, s); /* pageable: returns done */
  CHECK(page[1] == 8, "defer: a copy from pinned memory read %g when queued (expected 8, the value when it ran)",
        (double)page[1]);
  /* the legacy stream's copy is not ordered with the non-blocking stream's kernel */
  page[2] = 50;
  cudaMemcpy(d, page, sizeof page, cudaMemcpyHostToDevice);
  k_add_one<<<1, 4, 0, s>>>(d, 4);
  cudaStreamSynchronize(s);
  cudaMemcpy(page, d, sizeof page, cudaMemcpyDeviceToHost);
  CHECK(page[2] == 50, "defer: the non-blocking stream's kernel ran after the legacy copy (%g): not a race here",
        (double)page[2]);
  cudaFreeHost(pinned);
  cudaFree(d);
  cudaStreamDestroy(s);
}
#endif

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    printf("test_emu: no CUDA device\n");
    return 1;
  }
  test_coords();
  test_block_sum();
  test_shuffles_of<float>("float");
  test_shuffles_of<double>("double");
  test_shuffles_of<int>("int");
  test_votes();
  test_shared();
  test_launch_errors();
  test_wmma();
  test_mma16816();
#ifdef CPLAN_CUDA_EMU
  test_deadlock();
  test_defer();
#endif
  printf("%d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
