/* test_link.c: a program linked as a CUDA training program is (cudart, NVRTC, cuBLASLt, NCCL,
 * libcplanrt_cuda, libcplankernels_cuda, libcplanrt), run (ctest cuda.link, tests/cuda/link.sh).
 * Without a GPU it must do what the issue asks of programs: print "no CUDA device found" and
 * exit 1, never crash. With one, it runs a small smoke test of each library: a kernel launch
 * (gelu), a cuBLASLt GEMM with a bias epilogue, and a one-rank NCCL all-reduce. */
#include "cplanrt_cuda.h"
#include "kernels_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int fail(const char *what, const char *msg) {
  fprintf(stderr, "cplan: %s: %s\n", what, msg);
  return 1;
}

int main(int argc, char **argv) {
  RtError err = {{0}};
  RtCudaDevice dev;
  if (rt_cuda_init(0, &dev, &err) != 0) {
    fprintf(stderr, "cplan: %s\n", err.msg);
    return 1;
  }
  printf("device %d of %d: %s (sm_%d%d, %d SMs)\n", dev.index, dev.count, dev.name, dev.cc_major, dev.cc_minor, dev.sms);
  cudaStream_t s;
  RT_CUDA_CHECK(cudaStreamCreate(&s), &err);
  /* a (4 x 8) @ b (8 x 16) + bias, all ones: every element is 8 + 1 */
  enum { M = 4, K = 8, N = 16 };
  float ha[M * K], hb[K * N], hbias[N], hd[M * N];
  for (int i = 0; i < M * K; i++) ha[i] = 1;
  for (int i = 0; i < K * N; i++) hb[i] = 1;
  for (int i = 0; i < N; i++) hbias[i] = 1;
  float *a, *b, *bias, *d;
  void *ws;
  size_t wsb = 1 << 20;
  if (cudaMalloc((void **)&a, sizeof ha) || cudaMalloc((void **)&b, sizeof hb) || cudaMalloc((void **)&bias, sizeof hbias) ||
      cudaMalloc((void **)&d, sizeof hd) || cudaMalloc(&ws, wsb))
    return fail("cudaMalloc", "out of memory");
  cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice);
  cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice);
  cudaMemcpy(bias, hbias, sizeof hbias, cudaMemcpyHostToDevice);
  RtCublasLt *lt = rt_cublaslt_create(&err);
  if (!lt) return fail("cuBLASLt", err.msg);
  RtGemm g = {.m = M, .n = N, .k = K, .batch = 1, .ab_type = CUDA_R_32F, .d_type = CUDA_R_32F, .a = a, .b = b, .d = d,
              .alpha = 1, .beta = 0, .epilogue = RT_GEMM_BIAS, .bias = bias};
  if (rt_cublaslt_matmul(lt, &g, ws, wsb, s, &err) != 0) return fail("cuBLASLt", err.msg);
  if (cplan_cuda_gelu_forward(CPLAN_F32, d, d, M * N, s) != 0) return fail("gelu", cplan_cuda_error());
  RtComm *world = rt_comm_init(&argc, &argv);
  RtNccl *nc = rt_nccl_init(world, dev.index);
  rt_nccl_all_reduce(nc, d, M * N, RT_NCCL_F32, s);
  rt_nccl_sync(nc, s, "smoke");
  cudaMemcpy(hd, d, sizeof hd, cudaMemcpyDeviceToHost);
  float want = 9.0f * rt_nccl_size(nc); /* gelu(9) = 9 to f32 precision */
  for (int i = 0; i < M * N; i++)
    if (fabsf(hd[i] - want) > 1e-4f * want) return fail("smoke", "wrong GEMM, gelu or all-reduce result");
  printf("smoke ok: cuBLASLt GEMM + bias, gelu kernel, NCCL all-reduce over %d rank(s)\n", rt_nccl_size(nc));
  rt_nccl_free(nc);
  rt_cublaslt_destroy(lt);
  rt_comm_finalize(world);
  return 0;
}
