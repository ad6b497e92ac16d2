/* test_kernels.c: every CUDA kernel of kernels/cuda against its CPU reference (kernels/cpu/ref.c,
 * ref_extra.c), in f32, bf16 and f16 (the fused AdamW and global norm: f32 and bf16), on shapes that are not multiples of the block sizes. Needs a GPU
 * (tests/gpu/run.sh); with none it says so and exits 1: it never skips.
 *
 * Inputs are random; a bf16 run rounds them to bf16 first and gives the reference exactly those
 * values, so the difference measures the kernel, not the input rounding. Pass rule per element:
 * |gpu - ref| <= atol + rtol |ref|, with (atol, rtol) stated per dtype in the table:
 *   f32:  1e-4, 1e-4  (f32 arithmetic against references that sum in f64)
 *   bf16: 2e-2, 2e-2  (outputs are stored in bf16: 8 bits of mantissa, 2^-8 relative rounding)
 *   f16:  3e-3, 3e-3  (outputs are stored in f16: 11 bits of mantissa, 2^-11 relative rounding)
 * The embedding backward must equal the reference bit for bit (it adds in the same order), and
 * the deterministic kernels must give the same bits on a second run. The vocab-parallel kernels
 * (tensor parallelism) are checked rank by rank against kernels/cpu/vocab_parallel.c, and their
 * parts combined against the whole-vocabulary reference: row max and embedding exact, per-rank
 * sums of exp within 1e-6 + 1e-5 |ref| (f32 in every dtype), the loss parts within 1e-5 + 1e-5 |ref|
 * and the gradients as cross_entropy's. The norms' _ws launchers (dw, db through a workspace, in
 * chunks of rows) have the plain launchers' tolerances (dw 1e-3 + 1e-4 |ref| in f32, 2e-2 + 1e-4
 * |ref| in bf16/f16; db 1e-3 + 1e-4 |ref|), run-twice bit checks, and dw alone / db alone must
 * give the bits of dw and db together. */
#include "cuda_ok.h"
#include "kernels_cuda.h"
#include "ref.h"
#include "ref_extra.h"
#include "vocab_parallel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures, checks;
static cudaStream_t stream;

/* ---- data ------------------------------------------------------------------------------------ */

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static float frand(void) { /* uniform in [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((rng >> 40) * (2.0 / 16777216.0) - 1.0);
}

/* f16 on the host: round to nearest even, as the kernels' stores (__float2half_rn) */
static uint16_t f16_from_f32(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up: inf */
  if (ax < 0x38800000u) {                                   /* below 2^-14: a subnormal */
    float v;
    memcpy(&v, &ax, 4);
    return (uint16_t)(sign | (uint32_t)nearbyintf(v * 16777216.0f));
  }
  uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax & 0x7fffffu) >> 13)), rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
  if (e == 0) {
    float v = ldexpf((float)m, -24);
    return sign ? -v : v;
  }
  bits = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e - 15 + 127) << 23) | (m << 13));
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* x rounded to the storage type dt (what the kernels read) */
static void lp_round(float *x, long n, CplanDtype dt) {
  if (dt == CPLAN_BF16) k_bf16_round(x, n);
  if (dt == CPLAN_F16)
    for (long i = 0; i < n; i++) x[i] = f16_to_f32(f16_from_f32(x[i]));
}

static float *randv(long n, float scale, CplanDtype dt) {
  float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  for (long i = 0; i < n; i++) x[i] = frand() * scale;
  lp_round(x, n, dt);
  return x;
}

static float *copyv(const float *x, long n) {
  float *y = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  memcpy(y, x, sizeof(float) * (size_t)n);
  return y;
}

static size_t esize(CplanDtype dt) { return dt == CPLAN_F32 ? 4 : 2; }

/* a device copy of x in dt */
static void *up(const float *x, long n, CplanDtype dt) {
  void *d;
  CUDA_OK(cudaMalloc(&d, esize(dt) * (size_t)(n > 0 ? n : 1)));
  if (dt == CPLAN_F32) {
    CUDA_OK(cudaMemcpy(d, x, 4 * (size_t)n, cudaMemcpyHostToDevice));
  } else {
    uint16_t *h = malloc(2 * (size_t)(n > 0 ? n : 1));
    for (long i = 0; i < n; i++) h[i] = dt == CPLAN_F16 ? f16_from_f32(x[i]) : k_bf16_from_f32(x[i]);
    CUDA_OK(cudaMemcpy(d, h, 2 * (size_t)n, cudaMemcpyHostToDevice));
    free(h);
  }
  return d;
}

static float *down(const void *d, long n, CplanDtype dt) {
  CUDA_OK(cudaStreamSynchronize(stream));
  float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (dt == CPLAN_F32) {
    CUDA_OK(cudaMemcpy(x, d, 4 * (size_t)n, cudaMemcpyDeviceToHost));
  } else {
    uint16_t *h = malloc(2 * (size_t)(n > 0 ? n : 1));
    CUDA_OK(cudaMemcpy(h, d, 2 * (size_t)n, cudaMemcpyDeviceToHost));
    for (long i = 0; i < n; i++) x[i] = dt == CPLAN_F16 ? f16_to_f32(h[i]) : k_bf16_to_f32(h[i]);
    free(h);
  }
  return x;
}

static void *zeros(long n, size_t es) {
  void *d;
  CUDA_OK(cudaMalloc(&d, es * (size_t)(n > 0 ? n : 1)));
  CUDA_OK(cudaMemset(d, 0, es * (size_t)(n > 0 ? n : 1)));
  return d;
}

/* ---- comparison -------------------------------------------------------------------------------- */

static double atol_of(CplanDtype dt) { return dt == CPLAN_BF16 ? 2e-2 : dt == CPLAN_F16 ? 3e-3 : 1e-4; }

/* one table row; frees got */
static void compare(const char *kernel, const char *what, CplanDtype dt, float *got, const float *ref, long n,
                    double atol, double rtol) {
  double maxabs = 0, maxrel = 0;
  long bad = 0, worst = -1;
  for (long i = 0; i < n; i++) {
    double d = fabs((double)got[i] - ref[i]), r = d / (fabs(ref[i]) > 1e-30 ? fabs(ref[i]) : 1e-30);
    if (!(d <= atol + rtol * fabs(ref[i]))) {
      bad++;
      if (worst < 0) worst = i;
    }
    if (d > maxabs || isnan(d)) maxabs = d;
    if (fabs(ref[i]) > 1e-3 && r > maxrel) maxrel = r;
  }
  checks++;
  failures += bad > 0;
  printf("%-22s %-10s %-5s %8ld  %10.3g %10.3g  %7.0e %7.0e  %s", kernel, what, cplan_dtype_name(dt), n, maxabs,
         maxrel, atol, rtol, bad ? "FAIL" : "ok");
  if (bad) printf("  (%ld bad; first [%ld]: %g vs %g)", bad, worst, (double)got[worst], (double)ref[worst]);
  printf("\n");
  free(got);
}

static void compare_dt(const char *kernel, const char *what, CplanDtype dt, float *got, const float *ref, long n) {
  compare(kernel, what, dt, got, ref, n, atol_of(dt), atol_of(dt));
}

/* bitwise equality of two device buffers (determinism) */
static void same_bits(const char *kernel, const char *what, CplanDtype dt, const void *a, const void *b, size_t bytes) {
  CUDA_OK(cudaStreamSynchronize(stream));
  unsigned char *ha = malloc(bytes), *hb = malloc(bytes);
  CUDA_OK(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost));
  int eq = memcmp(ha, hb, bytes) == 0;
  checks++;
  failures += !eq;
  printf("%-22s %-10s %-5s %8zu  %-21s  %-15s  %s\n", kernel, what, cplan_dtype_name(dt), bytes, "bitwise, run twice",
         "", eq ? "ok" : "FAIL");
  free(ha);
  free(hb);
}

/* ---- the kernels ---------------------------------------------------------------------------------- */

static void test_norm(CplanDtype dt, int rms) {
  const int rows = 37, c = 771;
  const float eps = 1e-5f;
  const char *k = rms ? "rmsnorm" : "layernorm";
  long n = (long)rows * c;
  float *x = randv(n, 2.0f, dt), *w = randv(c, 1.0f, dt), *b = randv(c, 0.5f, dt);
  for (long i = 0; i < n; i++) x[i] += 0.3f; /* a nonzero mean */
  lp_round(x, n, dt);
  float *out = malloc(4 * (size_t)n), *mean = malloc(4 * rows), *rstd = malloc(4 * rows);
  void *dx_ = up(x, n, dt), *dw_ = up(w, c, dt), *db_ = up(b, c, dt), *dout_ = zeros(n, esize(dt));
  float *dmean = zeros(rows, 4), *drstd = zeros(rows, 4);
  if (rms) {
    k_rms_norm_forward(out, rstd, x, w, rows, c, eps);
    LAUNCH_OK(cplan_cuda_rmsnorm_forward(dt, dout_, drstd, dx_, dw_, rows, c, eps, stream));
  } else {
    k_layer_norm_forward(out, mean, rstd, x, w, b, rows, c, eps);
    LAUNCH_OK(cplan_cuda_layernorm_forward(dt, dout_, dmean, drstd, dx_, dw_, db_, rows, c, eps, stream));
    compare(k, "fwd mean", dt, down(dmean, rows, CPLAN_F32), mean, rows, 1e-5, 1e-5);
  }
  compare_dt(k, "fwd out", dt, down(dout_, n, dt), out, n);
  compare(k, "fwd rstd", dt, down(drstd, rows, CPLAN_F32), rstd, rows, 1e-5, 1e-4);
  /* backward from the reference's statistics, into nonzero gradients (they accumulate) */
  float *dy = randv(n, 1.0f, dt), *gx = randv(n, 0.5f, dt), *gw = randv(c, 0.5f, CPLAN_F32), *gb = randv(c, 0.5f, CPLAN_F32);
  void *ddy = up(dy, n, dt), *dgx = up(gx, n, dt), *dgw = up(gw, c, CPLAN_F32), *dgb = up(gb, c, CPLAN_F32);
  CUDA_OK(cudaMemcpy(drstd, rstd, 4 * rows, cudaMemcpyHostToDevice));
  if (!rms) CUDA_OK(cudaMemcpy(dmean, mean, 4 * rows, cudaMemcpyHostToDevice));
  void *dgx2 = up(gx, n, dt), *dgw2 = up(gw, c, CPLAN_F32);
  if (rms) {
    k_rms_norm_backward(gx, gw, dy, x, w, rstd, rows, c);
    LAUNCH_OK(cplan_cuda_rmsnorm_backward(dt, dgx, dgw, ddy, dx_, dw_, drstd, rows, c, stream));
    LAUNCH_OK(cplan_cuda_rmsnorm_backward(dt, dgx2, dgw2, ddy, dx_, dw_, drstd, rows, c, stream));
  } else {
    k_layer_norm_backward(gx, gw, gb, dy, x, w, mean, rstd, rows, c);
    LAUNCH_OK(cplan_cuda_layernorm_backward(dt, dgx, dgw, dgb, ddy, dx_, dw_, dmean, drstd, rows, c, stream));
    LAUNCH_OK(cplan_cuda_layernorm_backward(dt, dgx2, dgw2, NULL, ddy, dx_, dw_, dmean, drstd, rows, c, stream));
    compare(k, "bwd db", dt, down(dgb, c, CPLAN_F32), gb, c, 1e-3, 1e-4);
  }
  compare_dt(k, "bwd dx", dt, down(dgx, n, dt), gx, n);
  compare(k, "bwd dw", dt, down(dgw, c, CPLAN_F32), gw, c, dt != CPLAN_F32 ? 2e-2 : 1e-3, 1e-4);
  same_bits(k, "bwd dx", dt, dgx, dgx2, esize(dt) * (size_t)n);
  same_bits(k, "bwd dw", dt, dgw, dgw2, 4 * (size_t)c);
  free(x), free(w), free(b), free(out), free(mean), free(rstd), free(dy), free(gx), free(gw), free(gb);
  void *bufs[] = {dx_, dw_, db_, dout_, dmean, drstd, ddy, dgx, dgw, dgb, dgx2, dgw2};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
}

/* the _res forwards: the norm of x = a + res, x written to xsum (rounded to dt, as an add would
 * store it), on the warp-per-row (c <= 2048) or the block-per-row path */
static void test_norm_res(CplanDtype dt, int rms, int rows, int c) {
  const float eps = 1e-5f;
  char k[40];
  snprintf(k, sizeof k, "%s_res %dx%d", rms ? "rmsnorm" : "layernorm", rows, c);
  long n = (long)rows * c;
  float *a = randv(n, 2.0f, dt), *r = randv(n, 1.0f, dt), *w = randv(c, 1.0f, dt), *b = randv(c, 0.5f, dt);
  float *x = malloc(4 * (size_t)n), *out = malloc(4 * (size_t)n), *mean = malloc(4 * (size_t)rows);
  float *rstd = malloc(4 * (size_t)rows);
  for (long i = 0; i < n; i++) x[i] = a[i] + r[i] + 0.0f;
  lp_round(x, n, dt);
  void *da = up(a, n, dt), *dr = up(r, n, dt), *dw_ = up(w, c, dt), *db_ = up(b, c, dt);
  void *dout_ = zeros(n, esize(dt)), *dsum = zeros(n, esize(dt));
  float *dmean = zeros(rows, 4), *drstd = zeros(rows, 4);
  if (rms) {
    k_rms_norm_forward(out, rstd, x, w, rows, c, eps);
    LAUNCH_OK(cplan_cuda_rmsnorm_forward_res(dt, dout_, dsum, drstd, da, dr, dw_, rows, c, eps, stream));
  } else {
    k_layer_norm_forward(out, mean, rstd, x, w, b, rows, c, eps);
    LAUNCH_OK(cplan_cuda_layernorm_forward_res(dt, dout_, dsum, dmean, drstd, da, dr, dw_, db_, rows, c, eps, stream));
    compare(k, "fwd mean", dt, down(dmean, rows, CPLAN_F32), mean, rows, 1e-5, 1e-5);
  }
  compare(k, "fwd sum", dt, down(dsum, n, dt), x, n, 0, 0);
  compare_dt(k, "fwd out", dt, down(dout_, n, dt), out, n);
  compare(k, "fwd rstd", dt, down(drstd, rows, CPLAN_F32), rstd, rows, 1e-5, 1e-4);
  free(a), free(r), free(w), free(b), free(x), free(out), free(mean), free(rstd);
  void *bufs[] = {da, dr, dw_, db_, dout_, dsum, dmean, drstd};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
}

/* the _ws launchers (dw, db in chunks of rows through a workspace) on [rows, c]; off: dout and
 * x start one element into their allocations (not 4-byte aligned in bf16/f16: the scalar path).
 * dx (the kernel of test_norm) only on shapes under 1024 rows, to keep the emulator fast. */
static void test_norm_ws(CplanDtype dt, int rms, int rows, int c, int off) {
  const float eps = 1e-5f;
  char k[40];
  snprintf(k, sizeof k, "%s_ws %dx%d%s", rms ? "rmsnorm" : "layernorm", rows, c, off ? "+1" : "");
  long n = (long)rows * c;
  float *x = randv(n, 2.0f, dt), *w = randv(c, 1.0f, dt), *b = randv(c, 0.5f, dt);
  for (long i = 0; i < n; i++) x[i] += 0.3f;
  lp_round(x, n, dt);
  float *out = malloc(4 * (size_t)n), *mean = malloc(4 * (size_t)rows), *rstd = malloc(4 * (size_t)rows);
  if (rms) k_rms_norm_forward(out, rstd, x, w, rows, c, eps);
  else k_layer_norm_forward(out, mean, rstd, x, w, b, rows, c, eps);
  float *dy = randv(n, 1.0f, dt), *gx = randv(n, 0.5f, dt), *gw = randv(c, 0.5f, CPLAN_F32), *gb = randv(c, 0.5f, CPLAN_F32);
  float *xp = malloc(4 * (size_t)(n + 1)), *dyp = malloc(4 * (size_t)(n + 1));
  xp[0] = dyp[0] = 0.0f;
  memcpy(xp + 1, x, 4 * (size_t)n), memcpy(dyp + 1, dy, 4 * (size_t)n);
  void *dxa = up(off ? xp : x, n + off, dt), *dya = up(off ? dyp : dy, n + off, dt), *dw_ = up(w, c, dt);
  void *dx_ = (char *)dxa + off * esize(dt), *ddy = (char *)dya + off * esize(dt);
  float *dmean = up(rms ? rstd : mean, rows, CPLAN_F32), *drstd = up(rstd, rows, CPLAN_F32);
  void *dgx = up(gx, n, dt), *dgx2 = up(gx, n, dt);
  float *dgw = up(gw, c, CPLAN_F32), *dgw2 = up(gw, c, CPLAN_F32), *dgw3 = up(gw, c, CPLAN_F32);
  float *dgb = up(gb, c, CPLAN_F32), *dgb2 = up(gb, c, CPLAN_F32), *dgb3 = up(gb, c, CPLAN_F32);
  size_t need = cplan_cuda_norm_backward_work(rows, c);
  const int with_dx = rows < 1024;
  void *gx_ = with_dx ? dgx : NULL, *gx2_ = with_dx ? dgx2 : NULL;
  float *work;
  CUDA_OK(cudaMalloc((void **)&work, 4 * need)); /* not cleared: the launchers overwrite it */
  if (rms) {
    k_rms_norm_backward(gx, gw, dy, x, w, rstd, rows, c);
    LAUNCH_OK(cplan_cuda_rmsnorm_backward_ws(dt, gx_, dgw, ddy, dx_, dw_, drstd, rows, c, 1, work, need, stream));
    LAUNCH_OK(cplan_cuda_rmsnorm_backward_ws(dt, gx2_, dgw2, ddy, dx_, dw_, drstd, rows, c, 1, work, need, stream));
  } else {
    k_layer_norm_backward(gx, gw, gb, dy, x, w, mean, rstd, rows, c);
    LAUNCH_OK(cplan_cuda_layernorm_backward_ws(dt, gx_, dgw, dgb, ddy, dx_, dw_, dmean, drstd, rows, c, 1, work, need, stream));
    LAUNCH_OK(cplan_cuda_layernorm_backward_ws(dt, gx2_, dgw2, dgb2, ddy, dx_, dw_, dmean, drstd, rows, c, 1, work, need,
                                               stream));
    /* dw alone and db alone: the same sums */
    LAUNCH_OK(cplan_cuda_layernorm_backward_ws(dt, NULL, dgw3, NULL, ddy, dx_, NULL, dmean, drstd, rows, c, 1, work, need,
                                               stream));
    LAUNCH_OK(cplan_cuda_layernorm_backward_ws(dt, NULL, NULL, dgb3, ddy, dx_, NULL, dmean, drstd, rows, c, 1, work, need,
                                               stream));
    compare(k, "bwd db", dt, down(dgb, c, CPLAN_F32), gb, c, 1e-3, 1e-4);
  }
  if (with_dx) compare_dt(k, "bwd dx", dt, down(dgx, n, dt), gx, n);
  compare(k, "bwd dw", dt, down(dgw, c, CPLAN_F32), gw, c, dt != CPLAN_F32 ? 2e-2 : 1e-3, 1e-4);
  if (with_dx) same_bits(k, "bwd dx", dt, dgx, dgx2, esize(dt) * (size_t)n);
  same_bits(k, "bwd dw", dt, dgw, dgw2, 4 * (size_t)c);
  if (!rms) {
    same_bits(k, "bwd db", dt, dgb, dgb2, 4 * (size_t)c);
    same_bits(k, "dw alone", dt, dgw, dgw3, 4 * (size_t)c);
    same_bits(k, "db alone", dt, dgb, dgb3, 4 * (size_t)c);
  }
  if (with_dx) { /* accumulate_dx 0: dx written over a NaN-filled buffer, its old values never read */
    float *zx = calloc((size_t)n, 4), *zw = calloc((size_t)c, 4), *zb = calloc((size_t)c, 4);
    if (rms) k_rms_norm_backward(zx, zw, dy, x, w, rstd, rows, c);
    else k_layer_norm_backward(zx, zw, zb, dy, x, w, mean, rstd, rows, c);
    CUDA_OK(cudaMemset(dgx2, 0xff, esize(dt) * (size_t)n));
    if (rms) LAUNCH_OK(cplan_cuda_rmsnorm_backward_ws(dt, dgx2, NULL, ddy, dx_, dw_, drstd, rows, c, 0, work, need, stream));
    else
      LAUNCH_OK(cplan_cuda_layernorm_backward_ws(dt, dgx2, NULL, NULL, ddy, dx_, dw_, dmean, drstd, rows, c, 0, work, need,
                                                 stream));
    compare_dt(k, "bwd dx (written)", dt, down(dgx2, n, dt), zx, n);
    free(zx), free(zw), free(zb);
  }
  if (rows >= 1024) { /* a shape meant to cover several chunks must get them */
    long chunks = (long)(need / (2 * (size_t)c));
    checks++;
    failures += chunks < 8;
    printf("%-22s %-10s %-5s %8ld  %-39s  %s\n", k, "chunks", cplan_dtype_name(dt), chunks, "at least 8",
           chunks < 8 ? "FAIL" : "ok");
  }
  free(x), free(w), free(b), free(out), free(mean), free(rstd), free(dy), free(gx), free(gw), free(gb), free(xp), free(dyp);
  void *bufs[] = {dxa, dya, dw_, dmean, drstd, dgx, dgx2, dgw, dgw2, dgw3, dgb, dgb2, dgb3, work};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
}

/* a launcher's refusal: rc -1 and a message naming it and containing want */
static void refused(const char *launcher, int rc, const char *want) {
  const char *m = cplan_cuda_error();
  int ok = rc == -1 && strstr(m, launcher) && strstr(m, want);
  checks++;
  failures += !ok;
  printf("%-22s %-10s %-5s %8s  %-39s  %s\n", launcher + 11, "refused", "-", "-", want, ok ? "ok" : "FAIL");
  if (!ok) printf("  (rc %d, message \"%s\")\n", rc, m);
}

static void test_norm_ws_refusals(void) {
  const int rows = 4099, c = 96;
  size_t need = cplan_cuda_norm_backward_work(rows, c);
  float *p = zeros((long)rows * c, 4), *work = zeros((long)need, 4);
  refused("cplan_cuda_layernorm_backward_ws",
                  cplan_cuda_layernorm_backward_ws(CPLAN_F32, NULL, p, p, p, p, NULL, p, p, rows, c, 1, work, need - 1,
                                                   stream),
                  "workspace of");
  refused("cplan_cuda_layernorm_backward_ws",
                  cplan_cuda_layernorm_backward_ws(CPLAN_BF16, NULL, NULL, p, p, p, NULL, p, p, rows, c, 1, NULL, need,
                                                   stream),
                  "work must not be NULL");
  refused("cplan_cuda_rmsnorm_backward_ws",
                  cplan_cuda_rmsnorm_backward_ws(CPLAN_F16, NULL, p, p, p, NULL, p, rows, c, 1, work, need / 2, stream),
                  "workspace of");
  refused("cplan_cuda_rmsnorm_backward_ws",
                  cplan_cuda_rmsnorm_backward_ws(CPLAN_F32, p, p, p, p, NULL, p, rows, c, 1, work, need, stream),
                  "dx needs w");
  cudaFree(p), cudaFree(work);
}

static void test_softmax(CplanDtype dt) {
  const int rows = 29, n = 1000;
  long e = (long)rows * n;
  float *x = randv(e, 4.0f, dt), *y = malloc(4 * (size_t)e), *dy = randv(e, 1.0f, dt), *gx = randv(e, 0.5f, dt);
  void *dx = up(x, e, dt), *dyv = zeros(e, esize(dt));
  k_softmax_forward(y, x, rows, n);
  LAUNCH_OK(cplan_cuda_softmax_forward(dt, dyv, dx, rows, n, stream));
  compare_dt("softmax", "fwd", dt, down(dyv, e, dt), y, e);
  lp_round(y, e, dt); /* the backward reads the stored (bf16) forward output */
  void *dout = up(dy, e, dt), *g = up(gx, e, dt), *yy = up(y, e, dt);
  k_softmax_backward(gx, dy, y, rows, n);
  LAUNCH_OK(cplan_cuda_softmax_backward(dt, g, dout, yy, rows, n, stream));
  compare_dt("softmax", "bwd dx", dt, down(g, e, dt), gx, e);
  free(x), free(y), free(dy), free(gx);
  cudaFree(dx), cudaFree(dyv), cudaFree(dout), cudaFree(g), cudaFree(yy);
}

/* cplan_cuda_safe_softmax_forward: every third row all -inf (0 out), every third half -inf */
static void test_safe_softmax(CplanDtype dt) {
  const int rows = 30, n = 300;
  long e = (long)rows * n;
  float *x = randv(e, 4.0f, dt), *y = malloc(4 * (size_t)e);
  for (long i = 0; i < e; i++)
    if (i / n % 3 == 0 || (i / n % 3 == 1 && i % 2)) x[i] = -INFINITY;
  void *dx = up(x, e, dt), *dyv = zeros(e, esize(dt));
  k_safe_softmax_forward(y, x, rows, n);
  LAUNCH_OK(cplan_cuda_safe_softmax_forward(dt, dyv, dx, rows, n, stream));
  compare_dt("safe_softmax", "fwd", dt, down(dyv, e, dt), y, e);
  free(x), free(y);
  cudaFree(dx), cudaFree(dyv);
}

static void test_attention_t(CplanDtype dt, int d, int causal, int t) {
  const int nb = 3;
  long e = (long)nb * t * d;
  char name[40], tt[16] = "";
  if (t != 200) snprintf(tt, sizeof tt, " t%d", t);
  snprintf(name, sizeof name, "attention d%d%s%s", d, tt, causal ? " causal" : "");
  float *q = randv(e, 1.0f, dt), *k = randv(e, 1.0f, dt), *v = randv(e, 1.0f, dt);
  float *out = malloc(4 * (size_t)e), *att = malloc(4 * (size_t)nb * t * t);
  k_sdpa_forward(out, att, q, k, v, nb, t, d, causal);
  void *dq_ = up(q, e, dt), *dk_ = up(k, e, dt), *dv_ = up(v, e, dt), *dout_ = zeros(e, esize(dt));
  float *lse = zeros((long)nb * t, 4), *delta = zeros((long)nb * t, 4);
  LAUNCH_OK(cplan_cuda_attention_forward(dt, dout_, lse, dq_, dk_, dv_, nb, t, d, causal, stream));
  float *got = down(dout_, e, dt);
  compare_dt(name, "fwd out", dt, got, out, e);
  float *dy = randv(e, 1.0f, dt), *gq = randv(e, 0.1f, dt), *gk = randv(e, 0.1f, dt), *gv = randv(e, 0.1f, dt);
  void *ddy = up(dy, e, dt), *dgq = up(gq, e, dt), *dgk = up(gk, e, dt), *dgv = up(gv, e, dt);
  void *dgq2 = up(gq, e, dt), *dgk2 = up(gk, e, dt), *dgv2 = up(gv, e, dt);
  k_sdpa_backward(gq, gk, gv, dy, att, q, k, v, nb, t, d);
  LAUNCH_OK(cplan_cuda_attention_backward(dt, dgq, dgk, dgv, delta, ddy, dout_, lse, dq_, dk_, dv_, nb, t, d, causal, stream));
  LAUNCH_OK(cplan_cuda_attention_backward(dt, dgq2, dgk2, dgv2, delta, ddy, dout_, lse, dq_, dk_, dv_, nb, t, d, causal, stream));
  compare_dt(name, "bwd dq", dt, down(dgq, e, dt), gq, e);
  compare_dt(name, "bwd dk", dt, down(dgk, e, dt), gk, e);
  compare_dt(name, "bwd dv", dt, down(dgv, e, dt), gv, e);
  same_bits(name, "bwd dq", dt, dgq, dgq2, esize(dt) * (size_t)e);
  same_bits(name, "bwd dk", dt, dgk, dgk2, esize(dt) * (size_t)e);
  /* accumulate 0 (_ex): the gradients are written over NaN-filled buffers, their old values never read */
  float *zq = calloc((size_t)e, 4), *zk = calloc((size_t)e, 4), *zv = calloc((size_t)e, 4);
  k_sdpa_backward(zq, zk, zv, dy, att, q, k, v, nb, t, d);
  CUDA_OK(cudaMemset(dgq2, 0xff, esize(dt) * (size_t)e));
  CUDA_OK(cudaMemset(dgk2, 0xff, esize(dt) * (size_t)e));
  CUDA_OK(cudaMemset(dgv2, 0xff, esize(dt) * (size_t)e));
  LAUNCH_OK(cplan_cuda_attention_backward_ex(dt, dgq2, dgk2, dgv2, delta, ddy, dout_, lse, dq_, dk_, dv_, nb, t, d, causal,
                                             0, stream));
  compare_dt(name, "bwd dq (written)", dt, down(dgq2, e, dt), zq, e);
  compare_dt(name, "bwd dk (written)", dt, down(dgk2, e, dt), zk, e);
  compare_dt(name, "bwd dv (written)", dt, down(dgv2, e, dt), zv, e);
  free(zq), free(zk), free(zv);
  free(q), free(k), free(v), free(out), free(att), free(dy), free(gq), free(gk), free(gv);
  void *bufs[] = {dq_, dk_, dv_, dout_, lse, delta, ddy, dgq, dgk, dgv, dgq2, dgk2, dgv2};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
}

/* the layout launchers (attn_layout.h) on GPT-2's shapes in place: q, k and v read from a fused
 * projection qkv [b, t, 3C] (C = h d), out and dout [b, t, C] (merged heads), dq, dk and dv written
 * into dqkv [b, t, 3C] over NaN (every element written, none read); against the contiguous
 * reference on the heads gathered out of qkv */
static void test_attention(CplanDtype dt, int d, int causal) { test_attention_t(dt, d, causal, 200); }

static void test_attention_layout(CplanDtype dt, int d) {
  const int b = 2, h = 3, t = 100, nb = b * h;
  const long C = (long)h * d, e = (long)nb * t * d, n3 = (long)b * t * 3 * C, n1 = (long)b * t * C;
  char name[40];
  snprintf(name, sizeof name, "attention_l d%d", d);
  float *qkv = randv(n3, 1.0f, dt), *dy = randv(n1, 1.0f, dt);
  float *hq = malloc(4 * (size_t)e), *hk = malloc(4 * (size_t)e), *hv = malloc(4 * (size_t)e), *hdy = malloc(4 * (size_t)e);
  /* (z, i, c), z = bb * h + hh: qkv[bb][i][p * C + hh * d + c] for part p; merged [bb][i][hh * d + c] */
#define AT3(p) ((((long)bb * t + i) * 3 + (p)) * C + (long)hh * d + c)
#define AT1 (((long)bb * t + i) * C + (long)hh * d + c)
#define ATZ (((long)(bb * h + hh) * t + i) * d + c)
  for (int bb = 0; bb < b; bb++)
    for (int hh = 0; hh < h; hh++)
      for (int i = 0; i < t; i++)
        for (int c = 0; c < d; c++)
          hq[ATZ] = qkv[AT3(0)], hk[ATZ] = qkv[AT3(1)], hv[ATZ] = qkv[AT3(2)], hdy[ATZ] = dy[AT1];
  float *ref = malloc(4 * (size_t)e), *att = malloc(4 * (size_t)nb * t * t);
  float *gq = calloc((size_t)e, 4), *gk = calloc((size_t)e, 4), *gv = calloc((size_t)e, 4);
  k_sdpa_forward(ref, att, hq, hk, hv, nb, t, d, 1);
  k_sdpa_backward(gq, gk, gv, hdy, att, hq, hk, hv, nb, t, d);
  void *dqkv = up(qkv, n3, dt), *ddy = up(dy, n1, dt), *dout = zeros(n1, esize(dt)), *dg = zeros(n3, esize(dt));
  float *lse = zeros((long)nb * t, 4), *delta = zeros((long)nb * t, 4);
  CUDA_OK(cudaMemset(dg, 0xff, esize(dt) * (size_t)n3));
  CplanAttnLayout l3 = {3 * C, h, (long long)t * 3 * C, d}, l1 = {C, h, (long long)t * C, d};
  size_t es = esize(dt);
  char *q0 = dqkv, *g0 = dg;
  LAUNCH_OK(cplan_cuda_attention_forward_l(dt, dout, lse, q0, q0 + es * C, q0 + 2 * es * C, nb, t, t, d, 1, 1, l3, l3, l1,
                                           stream));
  LAUNCH_OK(cplan_cuda_attention_backward_l(dt, g0, g0 + es * C, g0 + 2 * es * C, delta, ddy, dout, lse, q0, q0 + es * C,
                                            q0 + 2 * es * C, nb, t, t, d, 1, 0, 1, l3, l3, l1, stream));
  float *o1 = down(dout, n1, dt), *g3 = down(dg, n3, dt);
  float *got = malloc(4 * (size_t)e), *gotq = malloc(4 * (size_t)e), *gotk = malloc(4 * (size_t)e), *gotv = malloc(4 * (size_t)e);
  for (int bb = 0; bb < b; bb++)
    for (int hh = 0; hh < h; hh++)
      for (int i = 0; i < t; i++)
        for (int c = 0; c < d; c++)
          got[ATZ] = o1[AT1], gotq[ATZ] = g3[AT3(0)], gotk[ATZ] = g3[AT3(1)], gotv[ATZ] = g3[AT3(2)];
#undef AT3
#undef AT1
#undef ATZ
  compare_dt(name, "fwd out", dt, got, ref, e);
  compare_dt(name, "bwd dq", dt, gotq, gq, e);
  compare_dt(name, "bwd dk", dt, gotk, gk, e);
  compare_dt(name, "bwd dv", dt, gotv, gv, e);
  /* a layout whose heads do not divide batch * heads is refused */
  CplanAttnLayout bad = {3 * C, 4, (long long)t * 3 * C, d};
  int rc = cplan_cuda_attention_forward_l(dt, dout, lse, q0, q0 + es * C, q0 + 2 * es * C, nb, t, t, d, 1, 1, bad, bad, l1,
                                          stream);
  checks++;
  failures += rc == 0;
  printf("%-22s %-10s %-5s %8s  %-40s %s\n", name, "refused", cplan_dtype_name(dt), "-", "heads 4 of 6 batch-heads",
         rc ? "ok" : "FAIL");
  free(qkv), free(dy), free(hq), free(hk), free(hv), free(hdy), free(ref), free(att), free(gq), free(gk), free(gv);
  free(o1), free(g3);
  void *bufs[] = {dqkv, ddy, dout, dg, lse, delta};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
}

/* grouped-query attention (the _l launchers' group): b 2, h query heads, h / group kv heads; q, out
 * and dout [b, h, t, d], k and v in place in a fused projection kv [b, t, 2, h / group, d] (rows
 * 2 (h / group) d apart), their gradients into dkv [b, t, 2, h / group, d]. The reference repeats
 * k and v on the heads (query head hh reads kv head hh / group), runs the plain reference and sums
 * dk and dv over each group. The backward runs with accumulate 1 onto random gradients, then with
 * accumulate 0 over NaN, twice (the same bits: the group's sum is in the kernel, no atomics). Then
 * the groups that do not fit the heads are refused. */
static void test_attention_gqa(CplanDtype dt, int d, int causal, int h, int group) {
  const int b = 2, t = 100, hk = h / group, nb = b * h;
  const long e = (long)nb * t * d, nkv = (long)b * t * 2 * hk * d;
  char name[40];
  snprintf(name, sizeof name, "attention_gqa%d d%d%s", group, d, causal ? " causal" : "");
  float *q = randv(e, 1.0f, dt), *kv = randv(nkv, 1.0f, dt), *dy = randv(e, 1.0f, dt);
  float *kr = malloc(4 * (size_t)e), *vr = malloc(4 * (size_t)e);
  /* (z, i, c), z = bb * h + hh, of the repeated k, v; (bb, i, p, hh / group, c) of kv */
#define ATZ (((long)(bb * h + hh) * t + i) * d + c)
#define AKV(p) ((((long)bb * t + i) * 2 + (p)) * hk * d + (long)(hh / group) * d + c)
  for (int bb = 0; bb < b; bb++)
    for (int hh = 0; hh < h; hh++)
      for (int i = 0; i < t; i++)
        for (int c = 0; c < d; c++) kr[ATZ] = kv[AKV(0)], vr[ATZ] = kv[AKV(1)];
  float *ref = malloc(4 * (size_t)e), *att = malloc(4 * (size_t)nb * t * t);
  float *gq = calloc((size_t)e, 4), *gk = calloc((size_t)e, 4), *gv = calloc((size_t)e, 4);
  float *gkv = calloc((size_t)nkv, 4); /* dk and dv summed over each group, laid out as kv */
  k_sdpa_forward(ref, att, q, kr, vr, nb, t, d, causal);
  k_sdpa_backward(gq, gk, gv, dy, att, q, kr, vr, nb, t, d);
  for (int bb = 0; bb < b; bb++)
    for (int hh = 0; hh < h; hh++)
      for (int i = 0; i < t; i++)
        for (int c = 0; c < d; c++) gkv[AKV(0)] += gk[ATZ], gkv[AKV(1)] += gv[ATZ];
#undef ATZ
#undef AKV
  size_t es = esize(dt);
  CplanAttnLayout lq = {d, h, (long long)h * t * d, (long long)t * d};
  CplanAttnLayout lkv = {2L * hk * d, hk, (long long)t * 2 * hk * d, d};
  void *dq_ = up(q, e, dt), *dkv = up(kv, nkv, dt), *ddy = up(dy, e, dt), *dout = zeros(e, es);
  float *lse = zeros((long)nb * t, 4), *delta = zeros((long)nb * t, 4);
  char *k0 = dkv, *v0 = k0 + es * hk * d;
  LAUNCH_OK(cplan_cuda_attention_forward_l(dt, dout, lse, dq_, k0, v0, nb, t, t, d, causal, group, lq, lkv, lq, stream));
  compare_dt(name, "fwd out", dt, down(dout, e, dt), ref, e);
  /* accumulate 1: onto random gradients */
  float *gq0 = randv(e, 0.1f, dt), *gkv0 = randv(nkv, 0.1f, dt);
  void *dgq = up(gq0, e, dt), *dgkv = up(gkv0, nkv, dt);
  char *gk0 = dgkv, *gv0 = gk0 + es * hk * d;
  LAUNCH_OK(cplan_cuda_attention_backward_l(dt, dgq, gk0, gv0, delta, ddy, dout, lse, dq_, k0, v0, nb, t, t, d, causal, 1,
                                            group, lq, lkv, lq, stream));
  for (long x = 0; x < e; x++) gq0[x] += gq[x];
  for (long x = 0; x < nkv; x++) gkv0[x] += gkv[x];
  compare_dt(name, "bwd dq", dt, down(dgq, e, dt), gq0, e);
  compare_dt(name, "bwd dk dv", dt, down(dgkv, nkv, dt), gkv0, nkv);
  /* accumulate 0: written over NaN, every element of dkv (k's and v's parts) written, none read */
  void *dgkv2 = zeros(nkv, es);
  char *gk2 = dgkv2, *gv2 = gk2 + es * hk * d;
  CUDA_OK(cudaMemset(dgq, 0xff, es * (size_t)e));
  CUDA_OK(cudaMemset(dgkv, 0xff, es * (size_t)nkv));
  CUDA_OK(cudaMemset(dgkv2, 0xff, es * (size_t)nkv));
  LAUNCH_OK(cplan_cuda_attention_backward_l(dt, dgq, gk0, gv0, delta, ddy, dout, lse, dq_, k0, v0, nb, t, t, d, causal, 0,
                                            group, lq, lkv, lq, stream));
  LAUNCH_OK(cplan_cuda_attention_backward_l(dt, NULL, gk2, gv2, delta, ddy, dout, lse, dq_, k0, v0, nb, t, t, d, causal, 0,
                                            group, lq, lkv, lq, stream));
  compare_dt(name, "bwd dq (written)", dt, down(dgq, e, dt), gq, e);
  compare_dt(name, "bwd dk dv (written)", dt, down(dgkv, nkv, dt), gkv, nkv);
  same_bits(name, "bwd dk dv", dt, dgkv, dgkv2, es * (size_t)nkv);
  /* refused: a group that does not divide q's heads, group 0, and k and v's heads not q's / group */
  CplanAttnLayout lkv1 = lkv;
  lkv1.heads = hk + 1;
  refused("cplan_cuda_attention_forward",
          cplan_cuda_attention_forward_l(dt, dout, lse, dq_, k0, v0, nb, t, t, d, causal, h + 1, lq, lkv, lq, stream),
          "group");
  refused("cplan_cuda_attention_forward",
          cplan_cuda_attention_forward_l(dt, dout, lse, dq_, k0, v0, nb, t, t, d, causal, 0, lq, lkv, lq, stream), "group 0");
  refused("cplan_cuda_attention_backward",
          cplan_cuda_attention_backward_l(dt, dgq, gk0, gv0, delta, ddy, dout, lse, dq_, k0, v0, nb, t, t, d, causal, 0,
                                          group, lq, lkv1, lq, stream),
          "heads times the group");
  free(q), free(kv), free(dy), free(kr), free(vr), free(ref), free(att), free(gq), free(gk), free(gv), free(gkv);
  free(gq0), free(gkv0);
  void *bufs[] = {dq_, dkv, ddy, dout, lse, delta, dgq, dgkv, dgkv2};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
}

/* cross attention (the _l launchers' tq != tk): tq queries and tk keys per head, causal as PyTorch's
 * is_causal (top-left: query i sees keys j <= i, every key from i >= tk on; with tq < tk the keys
 * j >= tq see no query, their dk and dv are 0), b 2, h query heads, h / group kv heads, all
 * contiguous. The reference is here (ref.c's k_sdpa_* have one length): the scores, the mask, the
 * softmax and the gradients in double. The backward runs with accumulate 1 onto random gradients,
 * then with accumulate 0 over NaN, dk and dv twice (the same bits); then empty lengths are refused.
 * masked: through the _m launchers, with a key-padding mask km [b, tk]: batch 0's last third of the
 * keys padded and every fifth key from 3 on, batch 1's last key and whole 64-key tiles from 64 to
 * 127 (key 0 always takes part, so no query row is empty); the masked keys' dk and dv are 0. masked 2:
 * every key of batch 0 masked, whose rows then have no key: out and dq 0 (PyTorch's sdpa from 2.5). */
static void test_attention_cross(CplanDtype dt, int d, int causal, int tq, int tk, int h, int group, int masked) {
  const int b = 2, hk = h / group, nb = b * h;
  const long eq = (long)nb * tq * d, ek = (long)(nb / group) * tk * d;
  char name[56];
  snprintf(name, sizeof name, "attention_x%d d%d %d/%d%s%s", group, d, tq, tk, causal ? " causal" : "",
           masked == 2 ? " empty rows" : masked ? " key mask" : "");
  float *q = randv(eq, 1.0f, dt), *k = randv(ek, 1.0f, dt), *v = randv(ek, 1.0f, dt), *dy = randv(eq, 1.0f, dt);
  float *km = malloc(4 * (size_t)b * tk);
  for (int j = 0; j < tk; j++) {
    km[j] = masked != 2 && (!masked || j == 0 || (j < tk - tk / 3 && !(j >= 3 && j % 5 == 3))) ? 1.0f : 0.0f;
    km[tk + j] = !masked || j == 0 || (j < tk - 1 && !(j >= 64 && j < 128)) ? 1.0f : 0.0f;
  }
  float *ref = calloc((size_t)eq, 4), *gq = calloc((size_t)eq, 4), *gk = calloc((size_t)ek, 4), *gv = calloc((size_t)ek, 4);
  double *p = malloc(8 * (size_t)tk), *dp = malloc(8 * (size_t)tk), *acc = malloc(8 * (size_t)d);
  double scale = 1.0 / sqrt((double)d);
  for (int z = 0; z < nb; z++) {
    const float *qz = q + (long)z * tq * d, *dyz = dy + (long)z * tq * d;
    const float *kz = k + (long)(z / group) * tk * d, *vz = v + (long)(z / group) * tk * d;
    float *gkz = gk + (long)(z / group) * tk * d, *gvz = gv + (long)(z / group) * tk * d;
    const float *kmz = km + (long)(z / h) * tk;
    for (int i = 0; i < tq; i++) {
      int n = causal && i + 1 < tk ? i + 1 : tk; /* keys 0 .. n - 1 seen, but for the masked ones */
      double m = -INFINITY, l = 0, dsum = 0;
      for (int j = 0; j < n; j++) {
        double s = 0;
        for (int c = 0; c < d; c++) s += (double)qz[(long)i * d + c] * kz[(long)j * d + c];
        p[j] = kmz[j] != 0 ? s * scale : -INFINITY;
        m = fmax(m, p[j]);
      }
      if (m == -INFINITY) continue; /* no key: out and dq stay 0 */
      for (int j = 0; j < n; j++) l += p[j] = exp(p[j] - m);
      for (int c = 0; c < d; c++) acc[c] = 0;
      for (int j = 0; j < n; j++) {
        p[j] /= l;
        dp[j] = 0;
        for (int c = 0; c < d; c++) {
          acc[c] += p[j] * vz[(long)j * d + c];
          dp[j] += (double)dyz[(long)i * d + c] * vz[(long)j * d + c];
        }
        dsum += p[j] * dp[j];
      }
      for (int c = 0; c < d; c++) ref[((long)z * tq + i) * d + c] = (float)acc[c], acc[c] = 0;
      for (int j = 0; j < n; j++) {
        double ds = p[j] * (dp[j] - dsum) * scale;
        for (int c = 0; c < d; c++) {
          acc[c] += ds * kz[(long)j * d + c];
          gkz[(long)j * d + c] += (float)(ds * qz[(long)i * d + c]);
          gvz[(long)j * d + c] += (float)(p[j] * dyz[(long)i * d + c]);
        }
      }
      for (int c = 0; c < d; c++) gq[((long)z * tq + i) * d + c] = (float)acc[c];
    }
  }
  free(p), free(dp), free(acc);
  size_t es = esize(dt);
  CplanAttnLayout lq = {d, h, (long long)h * tq * d, (long long)tq * d};
  CplanAttnLayout lkv = {d, hk, (long long)hk * tk * d, (long long)tk * d};
  void *dq_ = up(q, eq, dt), *dk_ = up(k, ek, dt), *dv_ = up(v, ek, dt), *ddy = up(dy, eq, dt), *dout = zeros(eq, es);
  void *dkm = masked ? up(km, (long)b * tk, dt) : NULL;
  float *lse = zeros((long)nb * tq, 4), *delta = zeros((long)nb * tq, 4);
  /* unmasked: the _l launchers, which are the _m ones with no mask */
#define X_FWD()                                                                                                     \
  (masked ? cplan_cuda_attention_forward_m(dt, dout, lse, dq_, dk_, dv_, dkm, nb, tq, tk, d, causal, group, lq, lkv, \
                                           lq, stream)                                                              \
          : cplan_cuda_attention_forward_l(dt, dout, lse, dq_, dk_, dv_, nb, tq, tk, d, causal, group, lq, lkv, lq,  \
                                           stream))
#define X_BWD(gq_, gk_, gv_, acc_)                                                                                   \
  (masked ? cplan_cuda_attention_backward_m(dt, gq_, gk_, gv_, delta, ddy, dout, lse, dq_, dk_, dv_, dkm, nb, tq, tk, \
                                            d, causal, acc_, group, lq, lkv, lq, stream)                           \
          : cplan_cuda_attention_backward_l(dt, gq_, gk_, gv_, delta, ddy, dout, lse, dq_, dk_, dv_, nb, tq, tk, d,  \
                                            causal, acc_, group, lq, lkv, lq, stream))
  LAUNCH_OK(X_FWD());
  compare_dt(name, "fwd out", dt, down(dout, eq, dt), ref, eq);
  /* accumulate 1: onto random gradients */
  float *gq0 = randv(eq, 0.1f, dt), *gk0 = randv(ek, 0.1f, dt), *gv0 = randv(ek, 0.1f, dt);
  void *dgq = up(gq0, eq, dt), *dgk = up(gk0, ek, dt), *dgv = up(gv0, ek, dt);
  LAUNCH_OK(X_BWD(dgq, dgk, dgv, 1));
  for (long x = 0; x < eq; x++) gq0[x] += gq[x];
  for (long x = 0; x < ek; x++) gk0[x] += gk[x], gv0[x] += gv[x];
  compare_dt(name, "bwd dq", dt, down(dgq, eq, dt), gq0, eq);
  compare_dt(name, "bwd dk", dt, down(dgk, ek, dt), gk0, ek);
  compare_dt(name, "bwd dv", dt, down(dgv, ek, dt), gv0, ek);
  /* accumulate 0: written over NaN, every element written (the keys no query sees: 0), none read */
  void *dgk2 = zeros(ek, es), *dgv2 = zeros(ek, es);
  CUDA_OK(cudaMemset(dgq, 0xff, es * (size_t)eq));
  CUDA_OK(cudaMemset(dgk, 0xff, es * (size_t)ek));
  CUDA_OK(cudaMemset(dgv, 0xff, es * (size_t)ek));
  CUDA_OK(cudaMemset(dgk2, 0xff, es * (size_t)ek));
  CUDA_OK(cudaMemset(dgv2, 0xff, es * (size_t)ek));
  LAUNCH_OK(X_BWD(dgq, dgk, dgv, 0));
  LAUNCH_OK(X_BWD(NULL, dgk2, dgv2, 0));
#undef X_FWD
#undef X_BWD
  compare_dt(name, "bwd dq (written)", dt, down(dgq, eq, dt), gq, eq);
  compare_dt(name, "bwd dk (written)", dt, down(dgk, ek, dt), gk, ek);
  compare_dt(name, "bwd dv (written)", dt, down(dgv, ek, dt), gv, ek);
  same_bits(name, "bwd dk", dt, dgk, dgk2, es * (size_t)ek);
  same_bits(name, "bwd dv", dt, dgv, dgv2, es * (size_t)ek);
  /* refused: no queries, no keys */
  refused("cplan_cuda_attention_forward",
          cplan_cuda_attention_forward_l(dt, dout, lse, dq_, dk_, dv_, nb, 0, tk, d, causal, group, lq, lkv, lq, stream),
          "bad shape");
  refused("cplan_cuda_attention_backward",
          cplan_cuda_attention_backward_l(dt, dgq, dgk, dgv, delta, ddy, dout, lse, dq_, dk_, dv_, nb, tq, 0, d, causal,
                                          0, group, lq, lkv, lq, stream),
          "bad shape");
  free(q), free(k), free(v), free(dy), free(ref), free(gq), free(gk), free(gv), free(gq0), free(gk0), free(gv0);
  free(km);
  if (dkm) cudaFree(dkm);
  void *bufs[] = {dq_, dk_, dv_, ddy, dout, lse, delta, dgq, dgk, dgv, dgk2, dgv2};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
}

static void test_activation(CplanDtype dt, KUnary op) {
  const long n = 100003;
  const char *name = op == K_GELU ? "gelu" : "silu";
  float *x = randv(n, 5.0f, dt), *y = malloc(4 * (size_t)n), *dy = randv(n, 1.0f, dt), *gx = randv(n, 0.5f, dt);
  void *dx = up(x, n, dt), *dyv = zeros(n, esize(dt)), *dout = up(dy, n, dt), *g = up(gx, n, dt);
  k_unary_forward(op, y, x, n, 0);
  if (op == K_GELU) LAUNCH_OK(cplan_cuda_gelu_forward(dt, dyv, dx, n, stream));
  else LAUNCH_OK(cplan_cuda_silu_forward(dt, dyv, dx, n, stream));
  compare_dt(name, "fwd", dt, down(dyv, n, dt), y, n);
  k_unary_backward(op, gx, dy, x, y, n, 0);
  if (op == K_GELU) LAUNCH_OK(cplan_cuda_gelu_backward(dt, g, dout, dx, n, stream));
  else LAUNCH_OK(cplan_cuda_silu_backward(dt, g, dout, dx, n, stream));
  compare_dt(name, "bwd dx", dt, down(g, n, dt), gx, n);
  free(x), free(y), free(dy), free(gx);
  cudaFree(dx), cudaFree(dyv), cudaFree(dout), cudaFree(g);
}

static void test_cross_entropy(CplanDtype dt) {
  const int rows = 53, v = 5003;
  long e = (long)rows * v;
  float *x = randv(e, 6.0f, dt), *gx = randv(e, 0.01f, dt);
  int32_t *tg = malloc(4 * rows);
  for (int r = 0; r < rows; r++) tg[r] = r % 7 == 3 ? -1 : (int32_t)((r * 7919) % v);
  int count = 0;
  float loss = k_cross_entropy_forward(&count, x, tg, rows, v);
  void *dx = up(x, e, dt), *g = up(gx, e, dt);
  int32_t *dtg;
  CUDA_OK(cudaMalloc((void **)&dtg, 4 * rows));
  CUDA_OK(cudaMemcpy(dtg, tg, 4 * rows, cudaMemcpyHostToDevice));
  float *losses = zeros(rows, 4), *lse = zeros(rows, 4), *dloss = zeros(2, 4);
  int *dcount = zeros(1, 4);
  LAUNCH_OK(cplan_cuda_cross_entropy_forward(dt, losses, lse, dloss, dcount, dx, dtg, rows, v, stream));
  float *gl = down(dloss, 1, CPLAN_F32);
  int gc = 0;
  CUDA_OK(cudaMemcpy(&gc, dcount, 4, cudaMemcpyDeviceToHost));
  float fc = (float)gc, rc = (float)count;
  compare("cross_entropy", "fwd count", dt, copyv(&fc, 1), &rc, 1, 0, 0);
  compare("cross_entropy", "fwd loss", dt, gl, &loss, 1, 1e-5, 1e-5);
  float dl = 1.7f;
  CUDA_OK(cudaMemcpy(dloss, &dl, 4, cudaMemcpyHostToDevice));
  k_cross_entropy_backward(gx, dl, x, tg, rows, v);
  LAUNCH_OK(cplan_cuda_cross_entropy_backward(dt, g, dloss, dcount, dx, lse, dtg, rows, v, stream));
  compare("cross_entropy", "bwd dlogits", dt, down(g, e, dt), gx, e, dt != CPLAN_F32 ? 1e-3 : 1e-6,
          atol_of(dt));
  /* accumulate 0 (_ex): written over a NaN-filled buffer; the ignored rows (target -1) get zeros */
  float *zx = calloc((size_t)e, 4);
  k_cross_entropy_backward(zx, dl, x, tg, rows, v);
  CUDA_OK(cudaMemset(g, 0xff, esize(dt) * (size_t)e));
  LAUNCH_OK(cplan_cuda_cross_entropy_backward_ld(dt, g, dloss, dcount, dx, lse, dtg, rows, v, v, 0, stream));
  compare("cross_entropy", "bwd dlogits (written)", dt, down(g, e, dt), zx, e, dt != CPLAN_F32 ? 1e-3 : 1e-6, atol_of(dt));
  /* rows ld = v + 5 apart (the logits of an odd vocab padded for cuBLASLt): NaN in the padding
   * of the logits (read, it would spoil a row's loss), and dlogits' padding (NaN) left alone */
  const int ld = v + 5;
  long ep = (long)rows * ld;
  float *xp = malloc(sizeof(float) * (size_t)ep), *zp = malloc(sizeof(float) * (size_t)ep);
  for (long i = 0; i < ep; i++) {
    long r = i / ld, j = i % ld;
    xp[i] = j < v ? x[r * v + j] : NAN;
    zp[i] = j < v ? zx[r * v + j] : NAN;
  }
  void *dxp = up(xp, ep, dt), *gp = up(zp, ep, dt);
  CUDA_OK(cudaMemset(gp, 0xff, esize(dt) * (size_t)rows * v)); /* the first rows' values: NaN */
  LAUNCH_OK(cplan_cuda_cross_entropy_forward_ld(dt, losses, lse, dloss, dcount, dxp, dtg, rows, v, ld, stream));
  compare("cross_entropy", "fwd loss (row pitch)", dt, down(dloss, 1, CPLAN_F32), &loss, 1, 1e-5, 1e-5);
  CUDA_OK(cudaMemcpy(dloss, &dl, 4, cudaMemcpyHostToDevice));
  LAUNCH_OK(cplan_cuda_cross_entropy_backward_ld(dt, gp, dloss, dcount, dxp, lse, dtg, rows, v, ld, 0, stream));
  float *gpv = down(gp, ep, dt);
  int kept = 1;
  for (long i = 0; i < ep; i++)
    if (i % ld >= v) kept &= isnan(gpv[i]), gpv[i] = zp[i] = 0.0f; /* the padding: compared apart */
  compare("cross_entropy", "bwd dlogits (row pitch)", dt, gpv, zp, ep, dt != CPLAN_F32 ? 1e-3 : 1e-6, atol_of(dt));
  if (!kept) fprintf(stderr, "FAILED: cross_entropy %s: the backward wrote dlogits' row padding\n", cplan_dtype_name(dt)), failures++;
  /* fused: the forward, then the gradient over the logits themselves (at the pitch); count zeroed
   * first, as the launcher computes it before the rows need it */
  for (long i = 0; i < ep; i++)
    if (i % ld >= v) zp[i] = NAN;
  void *dxf = up(xp, ep, dt);
  CUDA_OK(cudaMemset(dcount, 0, 4));
  LAUNCH_OK(cplan_cuda_cross_entropy_fused_ld(dt, losses, lse, dloss + 1, dcount, dxf, dtg, dloss, rows, v, ld, stream));
  compare("cross_entropy", "fused loss", dt, down(dloss + 1, 1, CPLAN_F32), &loss, 1, 1e-5, 1e-5);
  float *gfv = down(dxf, ep, dt);
  kept = 1;
  for (long i = 0; i < ep; i++)
    if (i % ld >= v) kept &= isnan(gfv[i]), gfv[i] = zp[i] = 0.0f;
  compare("cross_entropy", "fused dlogits", dt, gfv, zp, ep, dt != CPLAN_F32 ? 1e-3 : 1e-6, atol_of(dt));
  if (!kept) fprintf(stderr, "FAILED: cross_entropy %s: the fused kernel wrote the row padding\n", cplan_dtype_name(dt)), failures++;
  cudaFree(dxf);
  free(zx), free(xp), free(zp);
  free(x), free(gx), free(tg);
  cudaFree(dx), cudaFree(g), cudaFree(dxp), cudaFree(gp), cudaFree(dtg), cudaFree(losses), cudaFree(lse), cudaFree(dloss),
      cudaFree(dcount);
}

static void test_embedding(CplanDtype dt, int n) {
  const int v = 97, c = 130;
  float *table = randv((long)v * c, 1.0f, dt), *out = malloc(4 * (size_t)n * c);
  float *dy = randv((long)n * c, 1.0f, dt), *gt = randv((long)v * c, 0.5f, CPLAN_F32);
  int32_t *idx = malloc(4 * n);
  for (int i = 0; i < n; i++) idx[i] = (int32_t)((i * i * 31 + 7) % v) / (i % 3 ? 1 : 4); /* many repeats */
  k_embedding_forward(out, table, idx, n, v, c);
  void *dt_ = up(table, (long)v * c, dt), *dout = zeros((long)n * c, esize(dt)), *ddy = up(dy, (long)n * c, dt);
  float *dgt = up(gt, (long)v * c, CPLAN_F32);
  int32_t *didx;
  CUDA_OK(cudaMalloc((void **)&didx, 4 * n));
  CUDA_OK(cudaMemcpy(didx, idx, 4 * n, cudaMemcpyHostToDevice));
  LAUNCH_OK(cplan_cuda_embedding_forward(dt, dout, dt_, didx, n, v, c, stream));
  compare("embedding", "fwd", dt, down(dout, (long)n * c, dt), out, (long)n * c, 0, 0);
  k_embedding_backward(gt, dy, idx, n, v, c);
  LAUNCH_OK(cplan_cuda_embedding_backward(dt, dgt, ddy, didx, n, v, c, stream));
  compare("embedding", "bwd (exact)", dt, down(dgt, (long)v * c, CPLAN_F32), gt, (long)v * c, 0, 0);
  free(table), free(out), free(dy), free(gt), free(idx);
  cudaFree(dt_), cudaFree(dout), cudaFree(ddy), cudaFree(dgt), cudaFree(didx);
}

static void test_rope(CplanDtype dt) {
  const int nb = 6, t = 300, d = 64;
  const float base = 10000.0f;
  long e = (long)nb * t * d;
  float *x = randv(e, 1.0f, dt), *y = malloc(4 * (size_t)e), *dy = randv(e, 1.0f, dt), *gx = randv(e, 0.5f, dt);
  void *dx = up(x, e, dt), *dyv = zeros(e, esize(dt)), *dout = up(dy, e, dt), *g = up(gx, e, dt);
  k_rope_forward(y, x, nb, t, d, base);
  LAUNCH_OK(cplan_cuda_rope_forward(dt, dyv, dx, nb, t, d, base, stream));
  compare_dt("rope", "fwd", dt, down(dyv, e, dt), y, e);
  k_rope_backward(gx, dy, nb, t, d, base);
  LAUNCH_OK(cplan_cuda_rope_backward(dt, g, dout, nb, t, d, base, stream));
  compare_dt("rope", "bwd dx", dt, down(g, e, dt), gx, e);
  free(x), free(y), free(dy), free(gx);
  cudaFree(dx), cudaFree(dyv), cudaFree(dout), cudaFree(g);
}

/* AdamW on three tensors (f32 master weights), two steps, the gradient in dt, scaled by 0.5 */
static void test_adamw(CplanDtype dt) {
  enum { NT = 3 };
  const long ns[NT] = {5000, 1, 70001};
  const float wds[NT] = {0.1f, 0.0f, 0.01f};
  float *p[NT], *m[NT], *v[NT], *g[NT];
  CplanAdamwTensor ts[NT];
  for (int k = 0; k < NT; k++) {
    p[k] = randv(ns[k], 1.0f, CPLAN_F32), m[k] = calloc((size_t)ns[k], 4), v[k] = calloc((size_t)ns[k], 4);
    g[k] = randv(ns[k], 0.3f, dt);
    ts[k] = (CplanAdamwTensor){.param = up(p[k], ns[k], CPLAN_F32), .param_lp = zeros(ns[k], 2),
                               .grad = up(g[k], ns[k], dt), .grad_dt = dt, .m = zeros(ns[k], 4),
                               .v = zeros(ns[k], 4), .n = ns[k], .weight_decay = wds[k]};
  }
  float half = 0.5f, *dscale = up(&half, 1, CPLAN_F32);
  for (int step = 1; step <= 2; step++) {
    CplanAdamwHyper h = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                         .bc1 = (float)(1 - pow(0.9, step)), .bc2 = (float)(1 - pow(0.95, step))};
    for (int k = 0; k < NT; k++)
      k_adamw_update(p[k], m[k], v[k], g[k], ns[k], half, h.lr, h.beta1, h.beta2, h.eps, wds[k], h.bc1, h.bc2);
    LAUNCH_OK(cplan_cuda_adamw_multi(ts, NT, &h, dscale, stream));
  }
  for (int k = 0; k < NT; k++) {
    char what[24];
    snprintf(what, sizeof what, "p[%d]", k);
    compare("adamw (f32 master)", what, dt, down(ts[k].param, ns[k], CPLAN_F32), p[k], ns[k], 1e-6, 1e-5);
    snprintf(what, sizeof what, "m,v[%d]", k);
    compare("adamw (f32 master)", what, dt, down(ts[k].m, ns[k], CPLAN_F32), m[k], ns[k], 1e-7, 1e-5);
    compare("adamw (f32 master)", what, dt, down(ts[k].v, ns[k], CPLAN_F32), v[k], ns[k], 1e-9, 1e-5);
    k_bf16_round(p[k], ns[k]);
    snprintf(what, sizeof what, "bf16 p[%d]", k);
    compare("adamw (f32 master)", what, CPLAN_BF16, down(ts[k].param_lp, ns[k], CPLAN_BF16), p[k], ns[k], 0, 8e-3);
    free(p[k]), free(m[k]), free(v[k]), free(g[k]);
    cudaFree(ts[k].param), cudaFree(ts[k].param_lp), cudaFree((void *)ts[k].grad), cudaFree(ts[k].m), cudaFree(ts[k].v);
  }
  cudaFree(dscale);
}

static void test_global_norm(CplanDtype dt) {
  enum { NT = 40 }; /* more than one launch's list */
  float *xs[NT];
  long ns[NT];
  CplanNormTensor ts[NT];
  for (int k = 0; k < NT; k++) {
    ns[k] = k == 7 ? 0 : 1000 + 977L * k * (k % 5);
    xs[k] = randv(ns[k], 1.0f, dt);
    ts[k] = (CplanNormTensor){.x = up(xs[k], ns[k], dt), .dt = dt, .n = ns[k]};
  }
  double norm = k_global_norm((const float *const *)xs, ns, NT);
  size_t work = cplan_cuda_global_norm_work(ts, NT);
  double *dwork = zeros((long)work, 8);
  float *dn = zeros(2, 4);
  const float clip = 1.0f;
  LAUNCH_OK(cplan_cuda_global_norm(dn, dn + 1, ts, NT, clip, dwork, work, stream));
  float *got = down(dn, 2, CPLAN_F32);
  float ref[2] = {(float)norm, fminf(1.0f, clip / ((float)norm + 1e-6f))};
  compare("global_norm", "norm,clip", dt, got, ref, 2, 0, 1e-6);
  for (int k = 0; k < NT; k++) free(xs[k]), cudaFree((void *)ts[k].x);
  cudaFree(dwork), cudaFree(dn);
}

/* ---- vocab parallel (tensor parallelism): each rank's launchers against kvp_* for that rank, and the
 * ranks' parts combined (the plan's collectives simulated here) against the whole-vocabulary
 * reference. Rank k of n holds vocabulary rows [k*v/n, (k+1)*v/n), as compiler/lower.h. */

static int vp_lo(int k, int n, int v) { return (int)((long)k * v / n); }

static int32_t *up_i32(const int32_t *x, int n) {
  int32_t *d;
  CUDA_OK(cudaMalloc((void **)&d, 4 * (size_t)(n > 0 ? n : 1)));
  CUDA_OK(cudaMemcpy(d, x, 4 * (size_t)n, cudaMemcpyHostToDevice));
  return d;
}

/* rows x cols of x (row length ld) from column c0 */
static float *vp_cols(const float *x, int rows, int ld, int c0, int cols) {
  float *y = malloc(4 * (size_t)rows * (size_t)cols);
  for (int r = 0; r < rows; r++) memcpy(y + (long)r * cols, x + (long)r * ld + c0, 4 * (size_t)cols);
  return y;
}

/* got against ref exactly, where a NaN in ref means a NaN is expected */
static void vp_compare_nan(const char *kernel, const char *what, CplanDtype dt, float *got, const float *ref, long n) {
  long bad = 0;
  for (long i = 0; i < n; i++) bad += isnan(ref[i]) ? !isnan(got[i]) : got[i] != ref[i];
  checks++;
  failures += bad > 0;
  printf("%-22s %-10s %-5s %8ld  %-21s  %-15s  %s", kernel, what, cplan_dtype_name(dt), n, "exact, NaN rows", "",
         bad ? "FAIL" : "ok");
  if (bad) printf("  (%ld bad)", bad);
  printf("\n");
  free(got);
}

static void test_vp_cross_entropy(CplanDtype dt, int rows, int v, int n, float scale) {
  char name[40];
  snprintf(name, sizeof name, "vp_ce v%d/%d", v, n);
  long e = (long)rows * v;
  const float dl = 1.7f;
  float *x = randv(e, scale, dt), *g0 = randv(e, 0.01f, dt), *gwhole = copyv(g0, e), *gall = malloc(4 * (size_t)e);
  int32_t *tg = malloc(4 * (size_t)rows);
  for (int r = 0; r < rows; r++) tg[r] = r % 5 == 3 ? -1 : (int32_t)(((long)r * 7919 + 11) % v);
  int cref = 0;
  float ref = k_cross_entropy_forward(&cref, x, tg, rows, v);
  k_cross_entropy_backward(gwhole, dl, x, tg, rows, v);
  float *cg = malloc(4 * (size_t)n * rows), *cm = malloc(4 * (size_t)rows), *cs = calloc((size_t)rows, 4);
  float *cpart = malloc(4 * (size_t)rows), *gs = calloc((size_t)rows, 4), **sh = malloc(sizeof(float *) * (size_t)n);
  void **dsh = malloc(sizeof(void *) * (size_t)n);
  float *dgath = zeros((long)n * rows, 4), *dm = zeros(rows, 4), *ds = zeros(rows, 4), *dpart = zeros(rows, 4);
  float *dloss = zeros(n + 1, 4), *ddl = up(&dl, 1, CPLAN_F32);
  int *dcount = zeros(n, 4);
  int32_t *dtg = up_i32(tg, rows);
  /* row max of each rank into the all-gathered [n, rows], then the global max */
  for (int k = 0; k < n; k++) {
    int v0 = vp_lo(k, n, v), vl = vp_lo(k + 1, n, v) - v0;
    sh[k] = vp_cols(x, rows, v, v0, vl);
    dsh[k] = up(sh[k], (long)rows * vl, dt);
    kvp_ce_row_max(cg + (long)k * rows, sh[k], rows, vl);
    LAUNCH_OK(cplan_cuda_vp_ce_row_max(dt, dgath + (long)k * rows, dsh[k], rows, vl, stream));
    compare(name, "row_max", dt, down(dgath + (long)k * rows, rows, CPLAN_F32), cg + (long)k * rows, rows, 0, 0);
  }
  kvp_ce_max_combine(cm, cg, rows, n);
  LAUNCH_OK(cplan_cuda_vp_ce_max_combine(dm, dgath, rows, n, stream));
  compare(name, "max_comb", dt, down(dm, rows, CPLAN_F32), cm, rows, 0, 0);
  /* each rank's sum of exp, all-reduced (summed in rank order) */
  for (int k = 0; k < n; k++) {
    int v0 = vp_lo(k, n, v), vl = vp_lo(k + 1, n, v) - v0;
    kvp_ce_row_sumexp(cpart, sh[k], cm, rows, vl);
    for (int r = 0; r < rows; r++) cs[r] += cpart[r];
    LAUNCH_OK(cplan_cuda_vp_ce_row_sumexp(dt, dpart, dsh[k], dm, rows, vl, stream));
    float *got = down(dpart, rows, CPLAN_F32);
    for (int r = 0; r < rows; r++) gs[r] += got[r];
    compare(name, "row_sumexp", dt, got, cpart, rows, 1e-6, 1e-5);
  }
  CUDA_OK(cudaMemcpy(ds, gs, 4 * (size_t)rows, cudaMemcpyHostToDevice));
  /* each rank's loss part; the parts sum to the loss */
  double lsum = 0;
  for (int k = 0; k < n; k++) {
    int v0 = vp_lo(k, n, v), vl = vp_lo(k + 1, n, v) - v0, cc = -1, gc = -2;
    float cl = kvp_ce_forward_part(&cc, sh[k], cm, cs, tg, rows, vl, v0, v, k == 0);
    LAUNCH_OK(cplan_cuda_vp_ce_forward_part(dt, dloss + k, dcount + k, dsh[k], dm, ds, dtg, rows, vl, v0, v, k == 0,
                                            stream));
    float *gl = down(dloss + k, 1, CPLAN_F32);
    CUDA_OK(cudaMemcpy(&gc, dcount + k, 4, cudaMemcpyDeviceToHost));
    float fgc = (float)gc, fcc = (float)cc;
    lsum += *gl;
    compare(name, "part count", dt, copyv(&fgc, 1), &fcc, 1, 0, 0);
    compare(name, "part loss", dt, gl, &cl, 1, 1e-5, 1e-5);
  }
  float fsum = (float)lsum;
  compare(name, "loss (sum)", dt, copyv(&fsum, 1), &ref, 1, 1e-5, 1e-5);
  LAUNCH_OK(cplan_cuda_vp_ce_forward_part(dt, dloss + n, NULL, dsh[0], dm, ds, dtg, rows, vp_lo(1, n, v), 0, v, 1,
                                          stream));
  same_bits(name, "part loss", dt, dloss, dloss + n, 4);
  /* each rank's gradient columns, accumulated into g0's; assembled, the whole gradient */
  for (int k = 0; k < n; k++) {
    int v0 = vp_lo(k, n, v), vl = vp_lo(k + 1, n, v) - v0;
    long el = (long)rows * vl;
    float *cgk = vp_cols(g0, rows, v, v0, vl);
    void *dg = up(cgk, el, dt), *dg2 = up(cgk, el, dt);
    kvp_ce_backward(cgk, dl, sh[k], cm, cs, tg, rows, vl, v0, v);
    LAUNCH_OK(cplan_cuda_vp_ce_backward(dt, dg, ddl, dcount + k, dsh[k], dm, ds, dtg, rows, vl, v0, v, stream));
    LAUNCH_OK(cplan_cuda_vp_ce_backward(dt, dg2, ddl, dcount + k, dsh[k], dm, ds, dtg, rows, vl, v0, v, stream));
    float *got = down(dg, el, dt);
    for (int r = 0; r < rows; r++) memcpy(gall + (long)r * v + v0, got + (long)r * vl, 4 * (size_t)vl);
    compare(name, "bwd rank", dt, got, cgk, el, dt != CPLAN_F32 ? 1e-3 : 1e-6, atol_of(dt));
    same_bits(name, "bwd rank", dt, dg, dg2, esize(dt) * (size_t)el);
    free(cgk), cudaFree(dg), cudaFree(dg2);
  }
  compare(name, "bwd (all)", dt, gall, gwhole, e, dt != CPLAN_F32 ? 1e-3 : 1e-6, atol_of(dt));
  /* a target outside [-1, v) makes the loss NaN (the CPU reference asserts) */
  int32_t badt = v;
  CUDA_OK(cudaMemcpy(dtg + rows - 1, &badt, 4, cudaMemcpyHostToDevice));
  LAUNCH_OK(cplan_cuda_vp_ce_forward_part(dt, dloss, NULL, dsh[0], dm, ds, dtg, rows, vp_lo(1, n, v), 0, v, 1, stream));
  float nan1 = NAN;
  vp_compare_nan(name, "bad target", dt, down(dloss, 1, CPLAN_F32), &nan1, 1);
  for (int k = 0; k < n; k++) free(sh[k]), cudaFree(dsh[k]);
  free(x), free(g0), free(gwhole), free(tg), free(cg), free(cm), free(cs), free(cpart), free(gs), free(sh), free(dsh);
  void *bufs[] = {dgath, dm, ds, dpart, dloss, ddl, dcount, dtg};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
}

/* argmax of the last dim over n ranks: each rank's (max, index) pairs against kvp_argmax_local
 * exactly (NaN where it gives NaN), the combined indices against kvp_argmax_combine and the whole
 * row's k_argmax_forward. Values from `levels` integers (exact in every dtype: ties within and
 * across ranks); rows 0..3: all -inf, NaN first (index 0), NaNs inside, all NaN. */
static void test_vp_argmax(CplanDtype dt, int rows, int v, int n, int levels) {
  char name[40];
  snprintf(name, sizeof name, "vp_argmax v%d/%d", v, n);
  long e = (long)rows * v;
  float *x = malloc(4 * (size_t)e), *cg = malloc(4 * 2 * (size_t)n * rows), *fref = malloc(4 * (size_t)rows);
  for (long i = 0; i < e; i++) x[i] = (float)(int)((frand() * 0.5f + 0.5f) * (float)levels);
  for (int j = 0; j < v; j++) x[j] = -INFINITY, x[3L * v + j] = NAN;
  x[1L * v] = NAN;
  for (int j = 0; j < v; j += 3) x[2L * v + j] = NAN;
  int32_t *ref = malloc(4 * (size_t)rows), *cout = malloc(4 * (size_t)rows), *hout = malloc(4 * (size_t)rows);
  k_argmax_forward(ref, x, rows, v, 1);
  float *dgath = zeros(2L * n * rows, 4);
  int32_t *dout = zeros(rows, 4);
  for (int k = 0; k < n; k++) {
    int v0 = vp_lo(k, n, v), vl = vp_lo(k + 1, n, v) - v0;
    float *shk = vp_cols(x, rows, v, v0, vl);
    void *dsh = up(shk, (long)rows * vl, dt);
    kvp_argmax_local(cg + 2L * k * rows, shk, rows, vl, v0);
    LAUNCH_OK(cplan_cuda_vp_argmax_local(dt, dgath + 2L * k * rows, dsh, rows, vl, v0, stream));
    vp_compare_nan(name, "local", dt, down(dgath + 2L * k * rows, 2L * rows, CPLAN_F32), cg + 2L * k * rows, 2L * rows);
    free(shk), cudaFree(dsh);
  }
  kvp_argmax_combine(cout, cg, rows, n);
  LAUNCH_OK(cplan_cuda_vp_argmax_combine(dout, dgath, rows, n, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(hout, dout, 4 * (size_t)rows, cudaMemcpyDeviceToHost));
  float *fgot = malloc(4 * (size_t)rows), *fcpu = malloc(4 * (size_t)rows);
  for (int r = 0; r < rows; r++) fgot[r] = (float)hout[r], fcpu[r] = (float)cout[r], fref[r] = (float)ref[r];
  compare(name, "combine", dt, copyv(fgot, rows), fcpu, rows, 0, 0);
  compare(name, "vs whole", dt, fgot, fref, rows, 0, 0);
  free(x), free(cg), free(fref), free(ref), free(cout), free(hout), free(fcpu);
  cudaFree(dgath), cudaFree(dout);
}

static void test_vp_embedding(CplanDtype dt, int v, int nr) {
  const int n = 300, c = 130;
  char name[40];
  snprintf(name, sizeof name, "vp_embedding v%d/%d", v, nr);
  float *table = randv((long)v * c, 1.0f, dt), *out = malloc(4 * (size_t)n * c), *sum = calloc((size_t)n * c, 4);
  float *dy = randv((long)n * c, 1.0f, dt), *part = malloc(4 * (size_t)n * c);
  int32_t *idx = malloc(4 * n);
  for (int i = 0; i < n; i++) idx[i] = (int32_t)((i * i * 31 + 7) % v) / (i % 3 ? 1 : 4); /* many repeats */
  k_embedding_forward(out, table, idx, n, v, c);
  void *ddy = up(dy, (long)n * c, dt), *dout = zeros((long)n * c, esize(dt));
  int32_t *didx = up_i32(idx, n);
  for (int k = 0; k < nr; k++) {
    int v0 = vp_lo(k, nr, v), vl = vp_lo(k + 1, nr, v) - v0;
    void *dtab = up(table + (long)v0 * c, (long)vl * c, dt);
    kvp_embedding_forward(part, table + (long)v0 * c, idx, n, v0, vl, v, c);
    LAUNCH_OK(cplan_cuda_vp_embedding_forward(dt, dout, dtab, didx, n, v0, vl, v, c, stream));
    float *got = down(dout, (long)n * c, dt);
    for (long i = 0; i < (long)n * c; i++) sum[i] += got[i]; /* the all-reduce */
    compare(name, "fwd rank", dt, got, part, (long)n * c, 0, 0);
    float *gt = randv((long)vl * c, 0.5f, CPLAN_F32), *dgt = up(gt, (long)vl * c, CPLAN_F32);
    kvp_embedding_backward(gt, dy, idx, n, v0, vl, v, c);
    LAUNCH_OK(cplan_cuda_vp_embedding_backward(dt, dgt, ddy, didx, n, v0, vl, v, c, stream));
    compare(name, "bwd (exact)", dt, down(dgt, (long)vl * c, CPLAN_F32), gt, (long)vl * c, 0, 0);
    /* indices out of range: -1, v and INT32_MAX give NaN rows and add nothing; another rank's gives 0 */
    int32_t bad[5] = {-1, v0, v, v0 == 0 ? v - 1 : 0, 2147483647};
    int32_t *dbad = up_i32(bad, 5);
    float *want = malloc(4 * 5 * (size_t)c);
    for (int i = 0; i < 5; i++)
      for (int j = 0; j < c; j++)
        want[i * c + j] = bad[i] < 0 || bad[i] >= v ? NAN : bad[i] >= v0 && bad[i] < v0 + vl ? table[(long)bad[i] * c + j] : 0.0f;
    LAUNCH_OK(cplan_cuda_vp_embedding_forward(dt, dout, dtab, dbad, 5, v0, vl, v, c, stream));
    vp_compare_nan(name, "fwd bad idx", dt, down(dout, 5L * c, dt), want, 5L * c);
    kvp_embedding_backward(gt, dy + c, bad + 1, 1, v0, vl, v, c); /* bad[1] is the only one that adds */
    if (nr == 1) kvp_embedding_backward(gt, dy + 3 * c, bad + 3, 1, v0, vl, v, c); /* and bad[3] on one rank */
    LAUNCH_OK(cplan_cuda_vp_embedding_backward(dt, dgt, ddy, dbad, 5, v0, vl, v, c, stream));
    compare(name, "bwd bad idx", dt, down(dgt, (long)vl * c, CPLAN_F32), gt, (long)vl * c, 0, 0);
    free(gt), free(want), cudaFree(dgt), cudaFree(dtab), cudaFree(dbad);
  }
  compare(name, "fwd (sum)", dt, sum, out, (long)n * c, 0, 0);
  free(table), free(out), free(dy), free(part), free(idx);
  cudaFree(ddy), cudaFree(dout), cudaFree(didx);
}

static void test_vp_refusals(void) {
  float *p = zeros(64, 4);
  int32_t *ip = zeros(64, 4);
  refused("cplan_cuda_vp_embedding_forward",
             cplan_cuda_vp_embedding_forward(CPLAN_F32, p, p, ip, 4, -1, 4, 11, 2, stream), "bad shape");
  /* rows past v are a padded table's (compiler/vocab_pad.c): [8, 12) of 11 valid is a rank's part */
  LAUNCH_OK(cplan_cuda_vp_embedding_forward(CPLAN_F32, p, p, ip, 4, 8, 4, 11, 2, stream));
  refused("cplan_cuda_vp_embedding_backward",
             cplan_cuda_vp_embedding_backward(CPLAN_F32, p, p, NULL, 4, 0, 4, 11, 2, stream), "must not be NULL");
  refused("cplan_cuda_vp_ce_row_max", cplan_cuda_vp_ce_row_max(CPLAN_F32, p, p, 4, 0, stream), "bad shape");
  refused("cplan_cuda_vp_ce_max_combine", cplan_cuda_vp_ce_max_combine(p, p + 8, 4, 0, stream), "bad shape");
  refused("cplan_cuda_vp_ce_row_sumexp", cplan_cuda_vp_ce_row_sumexp((CplanDtype)7, p, p, p, 2, 4, stream),
             "unknown dtype 7");
  refused("cplan_cuda_vp_ce_forward_part",
             cplan_cuda_vp_ce_forward_part(CPLAN_F32, p, NULL, p, p, p, ip, 2, 4, -1, 11, 1, stream), "bad shape");
  refused("cplan_cuda_vp_ce_backward",
             cplan_cuda_vp_ce_backward(CPLAN_BF16, p, p, NULL, p, p, p, ip, 2, 4, 0, 11, stream), "must not be NULL");
  /* argmax's indices travel as floats: exact below 2^24 */
  refused("cplan_cuda_vp_argmax_local", cplan_cuda_vp_argmax_local(CPLAN_F32, p, p, 2, 4, (1 << 24) - 2, stream),
          "bad shape");
  refused("cplan_cuda_vp_argmax_combine", cplan_cuda_vp_argmax_combine(NULL, p, 2, 2, stream), "must not be NULL");
  cudaFree(p), cudaFree(ip);
}

/* argv: the dtypes to check (f32, bf16, f16), all three when none is named; the refusal checks run
 * with f32. The emulator's ctest runs one dtype per test, so each fits its timeout. */
int main(int argc, char **argv) {
  static const char *names[3] = {"f32", "bf16", "f16"};
  int want[3] = {argc < 2, argc < 2, argc < 2};
  for (int a = 1; a < argc; a++) {
    int k = 0;
    while (k < 3 && strcmp(argv[a], names[k]) != 0) k++;
    if (k == 3) {
      fprintf(stderr, "test_kernels: unknown dtype '%s' (expected f32, bf16 or f16)\n", argv[a]);
      return 2;
    }
    want[k] = 1;
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    fprintf(stderr, "test_kernels: no CUDA device found (%s): the kernel checks did NOT run\n",
            e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 1;
  }
  struct cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  CUDA_OK(cudaStreamCreate(&stream));
  printf("CUDA kernels against the CPU references on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  printf("pass: |gpu - ref| <= atol + rtol |ref| per element\n\n");
  printf("%-22s %-10s %-5s %8s  %10s %10s  %7s %7s  %s\n", "kernel", "output", "dtype", "elements", "max abs", "max rel",
         "atol", "rtol", "result");
  CplanDtype dts[3] = {CPLAN_F32, CPLAN_BF16, CPLAN_F16};
  for (int i = 0; i < 3; i++) {
    if (!want[i]) continue;
    CplanDtype dt = dts[i];
    test_norm(dt, 0);
    test_norm(dt, 1);
    for (int rms = 0; rms < 2; rms++) {
      test_norm_res(dt, rms, 37, 771); /* c odd: element by element */
      test_norm_res(dt, rms, 37, 768); /* 16-byte accesses */
      test_norm_res(dt, rms, 5, 2600); /* a block per row (16-byte accesses) */
    }
    for (int rms = 0; rms < 2; rms++) {
      test_norm_ws(dt, rms, 37, 771, 0);
      test_norm_ws(dt, rms, 1, 771, 0);
      test_norm_ws(dt, rms, 4099, 96, 0); /* several chunks, the last one short */
      test_norm_ws(dt, rms, 517, 45, 0);  /* c odd: the last column pair is half */
      test_norm_ws(dt, rms, 1029, 130, 1);
      test_norm_ws(dt, rms, 5, 2600, 0); /* past 2048 columns: a block per row, not a warp */
      test_norm_ws(dt, rms, 40, 1024, 0);  /* the fused backward's widest: 64 KiB of shared memory */
      test_norm_ws(dt, rms, 70001, 8, 0);  /* over 2048 fused chunks of 32 rows: longer chunks */
    }
    test_softmax(dt);
    test_safe_softmax(dt);
    test_attention(dt, 64, 1);
    test_attention(dt, 40, 1);
    test_attention(dt, 96, 1);
    test_attention(dt, 36, 1); /* not a multiple of 8: the element-wise staging */
    test_attention(dt, 64, 0);
    /* the 256 instantiations (Megatron's 1T GPT's heads): t 100, two blocks of 64 rows, the second
     * short, and a short last tile of 32 or 16 */
    test_attention_t(dt, 160, 1, 100);
    test_attention_t(dt, 160, 0, 100);
    test_attention_t(dt, 256, 1, 100);
    test_attention_t(dt, 256, 0, 100);
    test_attention_layout(dt, 64);
    test_attention_layout(dt, 160);
    test_attention_layout(dt, 36); /* rows 3C = 324 apart, not a multiple of 8: element-wise staging */
    test_attention_gqa(dt, 64, 1, 4, 2);
    test_attention_gqa(dt, 96, 0, 8, 4);
    test_attention_gqa(dt, 160, 0, 4, 2);
    test_attention_gqa(dt, 160, 1, 4, 4); /* one kv head (MQA) */
    /* cross attention: more queries than keys and fewer, causal (top-left) or not; keys within one
     * tile (5), queries within one (5); d 96: the 128 instantiations; GQA with it */
    test_attention_cross(dt, 64, 1, 70, 130, 2, 1, 0);
    test_attention_cross(dt, 64, 1, 130, 70, 2, 1, 0);
    test_attention_cross(dt, 64, 0, 70, 130, 2, 1, 0);
    test_attention_cross(dt, 160, 1, 70, 130, 2, 1, 0);
    test_attention_cross(dt, 160, 0, 130, 70, 2, 1, 0);
    test_attention_cross(dt, 160, 1, 130, 5, 2, 1, 0);
    test_attention_cross(dt, 96, 1, 130, 5, 2, 1, 0);
    test_attention_cross(dt, 96, 0, 5, 130, 2, 1, 0);
    test_attention_cross(dt, 64, 1, 100, 37, 4, 2, 0);
    /* a key-padding mask: past and within tiles, a whole tile of 64 masked (batch 1), causal or not,
     * every instantiation (d 64, 96: 128, 160: 256), GQA */
    test_attention_cross(dt, 64, 0, 70, 130, 2, 1, 1);
    test_attention_cross(dt, 64, 1, 130, 130, 2, 1, 1);
    test_attention_cross(dt, 96, 0, 130, 150, 2, 1, 1);
    test_attention_cross(dt, 160, 1, 100, 130, 2, 1, 1);
    test_attention_cross(dt, 64, 0, 100, 140, 4, 2, 1);
    test_attention_cross(dt, 64, 1, 70, 130, 2, 1, 2);
    test_attention_cross(dt, 96, 0, 130, 70, 2, 1, 2);
    test_activation(dt, K_GELU);
    test_activation(dt, K_SILU);
    test_cross_entropy(dt);
    test_embedding(dt, 300);
    test_embedding(dt, 2500); /* the backward's index tiles of 1024: three */
    test_rope(dt);
    test_vp_cross_entropy(dt, 29, 37, 3, 6.0f);
    test_vp_cross_entropy(dt, 13, 37, 1, 40.0f);   /* one rank: the whole vocabulary */
    test_vp_cross_entropy(dt, 19, 4099, 3, 40.0f); /* rows longer than a block */
    test_vp_embedding(dt, 37, 3);
    test_vp_embedding(dt, 400, 3); /* more local rows than the backward's row classes */
    test_vp_embedding(dt, 37, 1);
    test_vp_argmax(dt, 23, 37, 3, 3);    /* few levels: ties within and across ranks */
    test_vp_argmax(dt, 9, 4099, 2, 200); /* rows longer than a block */
    test_vp_argmax(dt, 6, 12, 1, 2);     /* one rank: the whole vocabulary */
    if (dt == CPLAN_F16) continue; /* the fused AdamW and global norm take f32 or bf16 gradients */
    test_adamw(dt);
    test_global_norm(dt);
  }
  if (want[0]) {
    test_vp_refusals();
    test_norm_ws_refusals();
  }
  printf("\n%d checks, %d failed\n", checks, failures);
  cudaStreamDestroy(stream);
  return failures ? 1 : 0;
}
