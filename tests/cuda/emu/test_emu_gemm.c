/* test_emu_gemm.c: rt_cublaslt_matmul of the emulator (emu_cuda_rt.cpp) against cplanrt_cuda.h's
 * contract, computed here independently in double: row-major d [m, n] = alpha op(a) op(b) + beta d,
 * every transpose pair, a strided batch, rows padded (row pitches), f32 and bf16 / f16 operands (f32 or low-precision d), and
 * every epilogue: BIAS, GELU, GELU_BIAS, GELU_AUX_BIAS (aux = the pre-activation), DGELU,
 * DGELU_BGRAD (bias_grad = d's column sums), BGRAD_A (bias_grad = op(a)'s row sums), BGRAD_B
 * (bias_grad = op(b)'s column sums), the bias gradient always f32; gelu' is checked against a
 * central difference of gelu. Exit 0 when every check holds.
 *
 * Built twice: cuda.emu_gemm links the emulator's GEMM (emu_cuda_rt.cpp); cuda.lt_model
 * (-DCPLAN_LT_MODEL) links runtime/cuda_rt.c, the real one, with tests/cuda/lt_model.c, a host
 * model of cuBLASLt's API in place of the library, and also checks that cuda_rt.c declares the
 * operands' alignment (each GEMM runs 256-byte aligned and at an offset of one element) and asks
 * the heuristic once per configuration. test_gpu_gemm (-DCPLAN_GPU_GEMM, built with the CUDA
 * toolkit, run by tests/gpu/prepare.sh's run_all.sh on a GPU) links the real cuda_rt.c and
 * cuBLASLt: the same GEMMs at sizes a GPU kernel tiles (m 64, n 128, k 96) against the same
 * reference, and a table of which epilogues the GPU's cuBLASLt refused (the programs then take
 * their fallbacks: a refusal is reported, wrong numbers fail). Operands go through device memory
 * (cudaMalloc, cudaMemcpy) except under the host model. */
#include "cplanrt_cuda.h"
#include "../host_types.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef CPLAN_LT_MODEL
#include "lt_model.h"
#endif

static int bad;

static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

static float rnd(unsigned *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

#ifdef CPLAN_GPU_GEMM
static int M = 64, N = 128, K = 96;
#else
static int M = 5, N = 8, K = 7;
#endif
static int refused[RT_GEMM_BGRAD_B + 1], done[RT_GEMM_BGRAD_B + 1];
static void *workspace;
static size_t workspace_bytes;

static void put(void *p, cudaDataType_t t, int i, float v) { ht_put(p, t, i, v); }
static double get(const void *p, cudaDataType_t t, int i) { return ht_get(p, t, i); }

static void check(const char *what, double got, double want, double tol) {
  if (fabs(got - want) <= tol * (1.0 + fabs(want))) return;
  if (bad++ < 10) fprintf(stderr, "FAILED: %s: %.8g, expected %.8g\n", what, got, want);
}

/* count elements of size es, 256-byte aligned, at an offset of off elements */
static void *buf(size_t count, size_t es, int off, void **base) {
  size_t bytes = ((count + (size_t)off) * es + 255) / 256 * 256;
  *base = aligned_alloc(256, bytes);
  memset(*base, 0, bytes);
  return (char *)*base + (size_t)off * es;
}

/* The operand the GEMM gets for host buffer h (bytes long, at byte offset off of a 256-byte
 * aligned allocation): h itself under the host model, else a device copy (dev[i], freed by
 * back_from_device). */
#ifdef CPLAN_LT_MODEL
static void *on_device(void *h, size_t bytes, size_t off, void **dev) {
  (void)bytes, (void)off;
  *dev = NULL;
  return h;
}
static void back_from_device(void *h, const void *d, size_t bytes) { (void)h, (void)d, (void)bytes; }
#else
static void *on_device(void *h, size_t bytes, size_t off, void **dev) {
  if (cudaMalloc(dev, bytes + off + 256) != cudaSuccess) {
    fprintf(stderr, "FAILED: cudaMalloc of %zu bytes\n", bytes + off + 256);
    exit(1);
  }
  void *d = (char *)*dev + off;
  cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
  return d;
}
static void back_from_device(void *h, const void *d, size_t bytes) {
  if (cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) fprintf(stderr, "FAILED: cudaMemcpy back\n"), bad++;
}
#endif

/* pad > 0: every row of a, b and d is pad elements longer than its width (lda, ldb, ldd), the
 * padding of a and b NaN (read, it would spoil the product) and d's a sentinel that must survive */
static void one(RtCublasLt *lt, cudaDataType_t at, cudaDataType_t dt, int ta, int tb, int batch, RtGemmEpilogue ep,
                int off, int pad) {
  const int m = M, n = N, k = K;
  const size_t es = at == CUDA_R_32F ? 4 : 2, ds = dt == CUDA_R_32F ? 4 : 2;
  const int wa = ta ? m : k, wb = tb ? k : n, lda = wa + pad, ldb = wb + pad, ldd = n + pad;
  const int sa = (ta ? k : m) * lda, sb = (tb ? n : k) * ldb, sd = m * ldd; /* elements per batch */
  unsigned seed = (unsigned)(ta * 7 + tb * 13 + batch * 31 + (int)ep * 101 + (int)at * 3 + (int)dt + off + pad * 17);
  void *base[3];
  void *a = buf((size_t)batch * sa, es, off, &base[0]), *b = buf((size_t)batch * sb, es, off, &base[1]);
  void *d = buf((size_t)batch * sd, ds, off, &base[2]), *aux = calloc((size_t)m * n, ds);
  void *bias = calloc(n, ds), *bg = calloc(m > n ? m : n, sizeof(float));
  for (int i = 0; i < batch * sa; i++) put(a, at, i, i % lda < wa ? rnd(&seed) : NAN);
  for (int i = 0; i < batch * sb; i++) put(b, at, i, i % ldb < wb ? rnd(&seed) : NAN);
  for (int i = 0; i < (m > n ? m : n); i++) ((float *)bg)[i] = 100.0f; /* written, not added to */
  for (int i = 0; i < batch * sd; i++) put(d, dt, i, i % ldd < n ? rnd(&seed) : 7.0f);
  for (int i = 0; i < n; i++) put(bias, dt, i, rnd(&seed));
  for (int i = 0; i < m * n; i++) put(aux, dt, i, 2 * rnd(&seed));
  double *d0 = malloc(sizeof(double) * (size_t)batch * sd), *aux0 = malloc(sizeof(double) * (size_t)m * n);
  for (int i = 0; i < batch * sd; i++) d0[i] = get(d, dt, i);
  for (int i = 0; i < m * n; i++) aux0[i] = get(aux, dt, i);
  /* beta 1 with BGRAD_B: a weight gradient added into its accumulator, its bias gradient written */
  float alpha = ep == RT_GEMM_BGRAD_B ? 1.0f : 0.75f, beta = ep == RT_GEMM_NONE ? 0.5f : ep == RT_GEMM_BGRAD_B ? 1.0f : 0.0f;
  size_t ab = (size_t)off * es, db = (size_t)off * ds, bgn = (size_t)(m > n ? m : n) * sizeof(float);
  void *dev[6];
  RtGemm g = {.m = m, .n = n, .k = k, .trans_a = ta, .trans_b = tb, .batch = batch, .stride_a = sa,
              .stride_b = sb, .stride_d = sd, .lda = pad ? lda : 0, .ldb = pad ? ldb : 0, .ldd = pad ? ldd : 0,
              .ab_type = at, .d_type = dt,
              .a = on_device(a, (size_t)batch * sa * es, ab, &dev[0]),
              .b = on_device(b, (size_t)batch * sb * es, ab, &dev[1]),
              .d = on_device(d, (size_t)batch * sd * ds, db, &dev[2]), .alpha = alpha, .beta = beta, .epilogue = ep,
              .bias = on_device(bias, (size_t)n * ds, 0, &dev[3]), .aux = on_device(aux, (size_t)m * n * ds, 0, &dev[4]),
              .bias_grad = on_device(bg, bgn, 0, &dev[5])};
  RtError err = {""};
  done[ep]++;
  int rc = rt_cublaslt_matmul(lt, &g, workspace, workspace_bytes, 0, &err);
#ifdef CPLAN_GPU_GEMM
  if (rc != 0) { /* a real cuBLASLt may refuse an epilogue: the programs fall back */
    if (refused[ep]++ == 0) printf("refused: epilogue %d (types %d/%d): %s\n", (int)ep, (int)at, (int)dt, err.msg);
    rc = 1;
  }
#else
  if (rc != 0) fprintf(stderr, "FAILED: rt_cublaslt_matmul: %s\n", err.msg), bad++;
#endif
#ifndef CPLAN_LT_MODEL
  if (cudaDeviceSynchronize() != cudaSuccess) fprintf(stderr, "FAILED: the GEMM's kernel: %s\n", cudaGetErrorString(cudaGetLastError())), bad++;
#endif
  if (rc == 0) {
    back_from_device(d, g.d, (size_t)batch * sd * ds);
    back_from_device(aux, g.aux, (size_t)m * n * ds);
    back_from_device(bg, g.bias_grad, bgn);
  }
#ifndef CPLAN_LT_MODEL
  for (int i = 0; i < 6; i++) cudaFree(dev[i]);
#endif
  if (rc != 0) {
    free(base[0]), free(base[1]), free(base[2]), free(aux), free(bias), free(bg), free(d0), free(aux0);
    return;
  }
  double tol = dt == CUDA_R_32F ? 1e-5 : dt == CUDA_R_16BF ? 8e-3 : 1e-3;
  char what[160];
#define A_(z, i, l) get(a, at, (z) * sa + (ta ? (l) * lda + (i) : (i) * lda + (l)))
#define B_(z, l, j) get(b, at, (z) * sb + (tb ? (j) * ldb + (l) : (l) * ldb + (j)))
  for (int z = 0; z < batch; z++) {
    double *colsum = calloc((size_t)n, sizeof *colsum);
    for (int i = 0; i < m; i++) {
      for (int j = 0; j < n; j++) {
        double s = 0;
        for (int l = 0; l < k; l++) s += A_(z, i, l) * B_(z, l, j);
        double v = alpha * s + beta * d0[z * sd + i * ldd + j], want = v;
        if (ep == RT_GEMM_BIAS || ep == RT_GEMM_GELU_BIAS || ep == RT_GEMM_GELU_AUX_BIAS) v += get(bias, dt, j);
        if (ep == RT_GEMM_GELU_AUX_BIAS) {
          snprintf(what, sizeof what, "aux (%d,%d) epilogue %d", i, j, (int)ep);
          check(what, get(aux, dt, i * n + j), v, tol);
        }
        want = v;
        if (ep == RT_GEMM_GELU || ep == RT_GEMM_GELU_BIAS || ep == RT_GEMM_GELU_AUX_BIAS) want = gelu_ref(v);
        if (ep == RT_GEMM_DGELU || ep == RT_GEMM_DGELU_BGRAD) {
          double x = aux0[i * n + j], h = 1e-5;
          want = v * (gelu_ref(x + h) - gelu_ref(x - h)) / (2 * h);
        }
        colsum[j] += want;
        snprintf(what, sizeof what, "d[%d] (%d,%d), types %d/%d, trans %d%d, epilogue %d, pad %d", z, i, j, (int)at,
                 (int)dt, ta, tb, (int)ep, pad);
        check(what, get(d, dt, z * sd + i * ldd + j), want, tol);
      }
      for (int j = n; j < ldd; j++) {
        snprintf(what, sizeof what, "d[%d]'s padding (%d,%d), types %d/%d, trans %d%d, epilogue %d", z, i, j, (int)at,
                 (int)dt, ta, tb, (int)ep);
        check(what, get(d, dt, z * sd + i * ldd + j), 7.0, 0.0);
      }
    }
    if (ep == RT_GEMM_DGELU_BGRAD && batch == 1)
      for (int j = 0; j < n; j++) check("DGELU_BGRAD bias_grad", get(bg, CUDA_R_32F, j), colsum[j], tol * k);
    if (ep == RT_GEMM_BGRAD_A && batch == 1)
      for (int i = 0; i < m; i++) {
        double s = 0;
        for (int l = 0; l < k; l++) s += A_(0, i, l);
        check("BGRAD_A bias_grad", get(bg, CUDA_R_32F, i), s, tol * k);
      }
    if (ep == RT_GEMM_BGRAD_B && batch == 1)
      for (int j = 0; j < n; j++) {
        double s = 0;
        for (int l = 0; l < k; l++) s += B_(0, l, j);
        check("BGRAD_B bias_grad", get(bg, CUDA_R_32F, j), s, tol * k);
      }
    free(colsum);
  }
#undef A_
#undef B_
  free(base[0]), free(base[1]), free(base[2]), free(aux), free(bias), free(bg), free(d0), free(aux0);
}

int main(void) {
  RtError err = {""};
#ifdef CPLAN_GPU_GEMM
  RtCudaDevice dev;
  if (rt_cuda_init(0, &dev, &err) != 0) return fprintf(stderr, "test_gpu_gemm: %s\n", err.msg), 1;
  printf("test_gpu_gemm: %s (sm_%d%d): the runtime's cuBLASLt GEMMs against a double reference\n", dev.name,
         dev.cc_major, dev.cc_minor);
  workspace_bytes = (size_t)32 << 20;
  if (cudaMalloc(&workspace, workspace_bytes) != cudaSuccess) return fprintf(stderr, "FAILED: cudaMalloc\n"), 1;
#endif
  RtCublasLt *lt = rt_cublaslt_create(&err);
  if (!lt) return fprintf(stderr, "FAILED: rt_cublaslt_create: %s\n", err.msg), 1;
  const cudaDataType_t types[3] = {CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F};
  int runs = 0;
  /* pass 0 and 1 alike (256-byte aligned operands), pass 2 at an offset of one element */
  long long queries[3] = {0};
  for (int pass = 0; pass < 3; pass++) {
    for (int t = 0; t < 3; t++)
      for (int lowd = 0; lowd < (t ? 2 : 1); lowd++)
        for (int ta = 0; ta < 2; ta++)
          for (int tb = 0; tb < 2; tb++)
            for (int ep = RT_GEMM_NONE; ep <= RT_GEMM_BGRAD_B; ep++) {
              one(lt, types[t], lowd ? types[t] : CUDA_R_32F, ta, tb, 1, (RtGemmEpilogue)ep, pass == 2, 0);
              runs++;
            }
    for (int ta = 0; ta < 2; ta++) one(lt, CUDA_R_32F, CUDA_R_32F, ta, 1 - ta, 3, RT_GEMM_NONE, pass == 2, 0), runs++;
    /* rows padded by 3 elements (row pitches lda, ldb, ldd: an odd vocab's logits padded to 16
     * bytes), one batch and a strided batch of 3 */
    for (int t = 0; t < 3; t++)
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
          one(lt, types[t], types[t], ta, tb, 1, RT_GEMM_NONE, pass == 2, 3), runs++;
          one(lt, types[t], CUDA_R_32F, ta, tb, 1, RT_GEMM_BGRAD_B, pass == 2, 3), runs++;
          one(lt, types[t], types[t], ta, tb, 3, RT_GEMM_NONE, pass == 2, 3), runs++;
        }
#ifdef CPLAN_LT_MODEL
    queries[pass] = lt_model_heuristics();
#endif
  }
#ifdef CPLAN_LT_MODEL
  /* one query per configuration: the second pass (the same GEMMs) asks none; the third asks again
   * for every GEMM (their operands now 4- or 2-byte aligned: other configurations) */
  int per_pass = runs / 3;
  if (queries[0] != per_pass || queries[1] != queries[0] || queries[2] != queries[1] + per_pass)
    fprintf(stderr, "FAILED: heuristic queries after each pass %lld, %lld, %lld; expected %d, %d, %d\n", queries[0],
            queries[1], queries[2], per_pass, per_pass, 2 * per_pass), bad++;
#else
  (void)queries;
#endif
  /* the contract's refusals */
  RtGemm g = {.m = 2, .n = 4, .k = 2, .batch = 1, .ab_type = CUDA_R_32F, .d_type = CUDA_R_16BF, .a = &g, .b = &g, .d = &g};
  if (rt_cublaslt_matmul(lt, &g, NULL, 0, 0, &err) == 0) fprintf(stderr, "FAILED: f32 operands with a bf16 d accepted\n"), bad++;
  g.d_type = CUDA_R_32F, g.epilogue = RT_GEMM_DGELU;
  if (rt_cublaslt_matmul(lt, &g, NULL, 0, 0, &err) == 0) fprintf(stderr, "FAILED: DGELU without aux accepted\n"), bad++;
  float bgv[4];
  g.epilogue = RT_GEMM_BGRAD_B, g.bias_grad = bgv, g.batch = 2;
  if (rt_cublaslt_matmul(lt, &g, NULL, 0, 0, &err) == 0) fprintf(stderr, "FAILED: BGRAD_B with batch 2 accepted\n"), bad++;
  rt_cublaslt_destroy(lt);
  const char *names[] = {"NONE", "BIAS", "GELU", "GELU_BIAS", "GELU_AUX_BIAS", "DGELU", "DGELU_BGRAD", "BGRAD_A", "BGRAD_B"};
  for (int e = 0; e <= RT_GEMM_BGRAD_B; e++)
    if (refused[e]) printf("epilogue %-13s refused in %d of %d GEMMs (the programs fall back)\n", names[e], refused[e], done[e]);
  if (bad) return fprintf(stderr, "test_emu_gemm: %d checks failed\n", bad), 1;
#if defined(CPLAN_GPU_GEMM)
  printf("test_gpu_gemm: ok (%d GEMMs of m %d n %d k %d: f32, bf16, f16 operands; f32 and low-precision d; 4 transposes; "
         "9 epilogues; batch 3; 256-byte aligned and at an offset; the results of those not refused within tolerance)\n",
         runs, M, N, K);
#elif defined(CPLAN_LT_MODEL)
  printf("test_lt_model: ok: runtime/cuda_rt.c on the cuBLASLt model (%d GEMMs: f32, bf16, f16 operands; f32 and "
         "low-precision d; 4 transposes; 9 epilogues; batch 3; padded rows; 256-byte aligned and at an offset; %lld heuristic "
         "queries)\n", runs, queries[2]);
#else
  printf("test_emu_gemm: ok (%d GEMMs: f32, bf16, f16 operands; f32 and low-precision d; 4 transposes; 9 epilogues; batch 3;"
         " padded rows; 256-byte aligned and at an offset)\n", runs);
#endif
  return 0;
}
