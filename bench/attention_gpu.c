/* attention_gpu.c: times the CUDA attention kernels (kernels/cuda/attention.cu) at one shape, a
 * benchmark: it prints, never asserts. The implementation is CPLAN_ATTENTION's (mma, the default;
 * wmma; simt), so run it once per value:
 *   for a in mma wmma simt; do CPLAN_ATTENTION=$a attention_gpu [NB T D ITERS [DTYPE]]; done
 * Defaults: GPT-2 124M's attention at micro-batch 16 (NB = 16 x 12 heads = 192, T 1024, D 64),
 * causal, 20 iterations, bf16 (or f16, f32). Random inputs in [-1, 1).
 *
 * Printed: the median of ITERS timed calls (after 2 untimed ones; each call timed between two
 * cudaDeviceSynchronize on the host clock) of the forward and of the backward (delta, dk/dv and
 * dq), and TFLOP/s by FlashAttention's count: the forward's two products, 4 NB T^2 D, halved when
 * causal; the backward 2.5 times that (its five products; ours recompute S and dP in both of its
 * kernels, seven, which the count leaves out). With a 6th argument `mask`, through the _m launchers
 * with a key-padding mask (BERT's attention_mask): each batch-head's last t/8 keys padded (the count
 * is the same, the masked keys' work is not taken out; bf16 and f16 then run on mma.sync whatever
 * CPLAN_ATTENTION says). The CUDA-on-CPU emulator runs it too, on a tiny shape (ctest
 * cuda.emu_attention_bench), so a GPU session finds it working. */
#include "../tests/gpu/cuda_ok.h"
#include "kernels_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* n random elements of dtype dt in [-1, 1) on the device */
static void *random_device(long n, CplanDtype dt, unsigned *seed) {
  size_t es = dt == CPLAN_F32 ? 4 : 2;
  unsigned char *h = malloc(es * (size_t)n);
  for (long i = 0; i < n; i++) {
    *seed = *seed * 1103515245u + 12345u;
    float f = (float)(*seed >> 8) / 8388608.0f - 1.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (dt == CPLAN_F32) memcpy(h + 4 * i, &f, 4);
    else if (dt == CPLAN_BF16) {
      uint16_t b = (uint16_t)(u >> 16); /* truncated: any bf16 will do */
      memcpy(h + 2 * i, &b, 2);
    } else {
      /* f16: |f| < 1, a normal number or zero; 10 mantissa bits, truncated */
      int e = (int)((u >> 23) & 0xff) - 127 + 15;
      uint16_t b = e <= 0 ? (uint16_t)((u >> 16) & 0x8000u) : (uint16_t)(((u >> 16) & 0x8000u) | (e << 10) | ((u >> 13) & 0x3ffu));
      memcpy(h + 2 * i, &b, 2);
    }
  }
  void *d;
  CUDA_OK(cudaMalloc(&d, es * (size_t)n));
  CUDA_OK(cudaMemcpy(d, h, es * (size_t)n, cudaMemcpyHostToDevice));
  free(h);
  return d;
}

int main(int argc, char **argv) {
  int nb = argc > 1 ? atoi(argv[1]) : 192, t = argc > 2 ? atoi(argv[2]) : 1024, d = argc > 3 ? atoi(argv[3]) : 64;
  int iters = argc > 4 ? atoi(argv[4]) : 20;
  const char *dts = argc > 5 ? argv[5] : "bf16";
  CplanDtype dt = strcmp(dts, "f32") == 0 ? CPLAN_F32 : strcmp(dts, "f16") == 0 ? CPLAN_F16 : CPLAN_BF16;
  int masked = argc > 6 && strcmp(argv[6], "mask") == 0;
  if (nb < 1 || t < 1 || d < 1 || d > 128 || iters < 1 || (dt == CPLAN_BF16 && strcmp(dts, "bf16") != 0) ||
      (argc > 6 && !masked)) {
    fprintf(stderr, "usage: attention_gpu [NB T D(<=128) ITERS [bf16|f16|f32 [mask]]]\n");
    return 2;
  }
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
    fprintf(stderr, "attention_gpu: no CUDA device found\n");
    return 1;
  }
  const char *impl = getenv("CPLAN_ATTENTION");
  impl = impl && *impl ? impl : "mma";
  if (dt == CPLAN_F32) impl = "simt";
  else if (masked) impl = "mma";
  long e = (long)nb * t * d;
  unsigned seed = 1;
  void *q = random_device(e, dt, &seed), *k = random_device(e, dt, &seed), *v = random_device(e, dt, &seed);
  void *dout = random_device(e, dt, &seed), *out = random_device(e, dt, &seed);
  void *dq = random_device(e, dt, &seed), *dk = random_device(e, dt, &seed), *dv = random_device(e, dt, &seed);
  /* the key mask [nb, t] (one batch-head a sample: the layout's heads are 1), 1 but the last t/8 */
  void *km = NULL;
  if (masked) {
    size_t es = dt == CPLAN_F32 ? 4 : 2;
    unsigned char *h = calloc((size_t)nb * t, es);
    for (long i = 0; i < (long)nb * t; i++)
      if (i % t < t - t / 8) {
        uint32_t u = 0x3f800000u; /* 1.0 in f32; in bf16 0x3f80, in f16 0x3c00 */
        if (dt == CPLAN_F32) memcpy(h + 4 * i, &u, 4);
        else ((uint16_t *)h)[i] = dt == CPLAN_BF16 ? 0x3f80 : 0x3c00;
      }
    CUDA_OK(cudaMalloc(&km, es * (size_t)nb * t));
    CUDA_OK(cudaMemcpy(km, h, es * (size_t)nb * t, cudaMemcpyHostToDevice));
    free(h);
  }
  CplanAttnLayout l = {d, 1, (long long)t * d, 0};
  float *lse, *delta;
  CUDA_OK(cudaMalloc((void **)&lse, 4 * (size_t)nb * t));
  CUDA_OK(cudaMalloc((void **)&delta, 4 * (size_t)nb * t));
  double *fwd = malloc(sizeof(double) * iters), *bwd = malloc(sizeof(double) * iters);
  for (int it = -2; it < iters; it++) {
    CUDA_OK(cudaDeviceSynchronize());
    double t0 = now_ms();
    if (masked) LAUNCH_OK(cplan_cuda_attention_forward_m(dt, out, lse, q, k, v, km, nb, t, t, d, 1, 1, l, l, l, 0));
    else LAUNCH_OK(cplan_cuda_attention_forward(dt, out, lse, q, k, v, nb, t, d, 1, 0));
    CUDA_OK(cudaDeviceSynchronize());
    double t1 = now_ms();
    if (masked)
      LAUNCH_OK(cplan_cuda_attention_backward_m(dt, dq, dk, dv, delta, dout, out, lse, q, k, v, km, nb, t, t, d, 1, 0,
                                                1, l, l, l, 0));
    else LAUNCH_OK(cplan_cuda_attention_backward_ex(dt, dq, dk, dv, delta, dout, out, lse, q, k, v, nb, t, d, 1, 0, 0));
    CUDA_OK(cudaDeviceSynchronize());
    double t2 = now_ms();
    if (it >= 0) fwd[it] = t1 - t0, bwd[it] = t2 - t1;
  }
  qsort(fwd, (size_t)iters, sizeof(double), cmp_double);
  qsort(bwd, (size_t)iters, sizeof(double), cmp_double);
  double f_ms = fwd[iters / 2], b_ms = bwd[iters / 2];
  double flops = 4.0 * nb * (double)t * t * d / 2; /* causal */
  printf("attention %s nb %d t %d d %d causal%s, %s: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms (%.1f TFLOP/s), "
         "median of %d\n",
         dts, nb, t, d, masked ? " key mask" : "", impl, f_ms, flops / (f_ms * 1e9), b_ms, 2.5 * flops / (b_ms * 1e9), iters);
  void *bufs[] = {q, k, v, dout, out, dq, dk, dv, lse, delta, km};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
  free(fwd), free(bwd);
  return 0;
}
