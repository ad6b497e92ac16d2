/* test_fast_kernels.c: every kernel of kernels/cpu/fast.h against its reference (ref.h) on
 * random data: GEMM in each transpose and batching mode plans use, the periodic elementwise ops
 * and their gradients, and attention forward and backward. */
#include "fast.h"
#include "fast_nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

/* Every buffer a test allocates is remembered here and freed by free_all() when it ends. */
static void *allocs[256];
static int nallocs;

static float *track(float *p) {
  if (nallocs == (int)(sizeof allocs / sizeof allocs[0])) abort(); /* raise the table's size */
  allocs[nallocs++] = p;
  return p;
}

static void free_all(void) {
  while (nallocs) free(allocs[--nallocs]);
}

static float *rnd(long n) {
  float *p = track(malloc(sizeof(float) * (size_t)(n ? n : 1)));
  for (long i = 0; i < n; i++) p[i] = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
  return p;
}

static float *zeros(long n) { return track(calloc((size_t)(n ? n : 1), sizeof(float))); }

static void expect_close(const char *what, const float *a, const float *b, long n, float tol) {
  for (long i = 0; i < n; i++)
    if (!(fabsf(a[i] - b[i]) <= tol * (1.0f + fabsf(b[i])))) {
      fprintf(stderr, "FAILED %s: element %ld is %g, expected %g\n", what, i, a[i], b[i]);
      failures++;
      return;
    }
}

/* transposed copy of nb matrices r x c */
static float *transposed(const float *x, int nb, int r, int c) {
  float *t = track(malloc(sizeof(float) * (size_t)nb * r * c));
  k_transpose_forward(t, x, nb, r, c);
  return t;
}

static void test_gemm(void) {
  int nb = 3, m = 5, k = 7, n = 4;
  float *a = rnd(nb * m * k), *b = rnd(k * n), *bb = rnd(nb * k * n), *dy = rnd(nb * m * n);
  float *ref = zeros(nb * m * n), *out = zeros(nb * m * n);
  /* shared weight (one folded sgemm), and a transposed (virtual) weight */
  k_matmul_forward(ref, a, b, nb, m, k, n, 0);
  k_gemm(out, a, b, nb, m, n, k, 0, 0, (long)m * k, 0, (long)m * n, 0.0f);
  expect_close("gemm shared b", out, ref, nb * m * n, 1e-5f);
  float *bt = transposed(b, 1, k, n);
  k_gemm(out, a, bt, nb, m, n, k, 0, 1, (long)m * k, 0, (long)m * n, 0.0f);
  expect_close("gemm transposed b", out, ref, nb * m * n, 1e-5f);
  /* batched b */
  k_matmul_forward(ref, a, bb, nb, m, k, n, 1);
  k_gemm(out, a, bb, nb, m, n, k, 0, 0, (long)m * k, (long)k * n, (long)m * n, 0.0f);
  expect_close("gemm batched", out, ref, nb * m * n, 1e-5f);
  /* backward of the shared weight: dA = dY B^T, dB = sum A^T dY */
  float *da = zeros(nb * m * k), *db = zeros(k * n), *rda = zeros(nb * m * k), *rdb = zeros(k * n);
  k_matmul_backward(rda, rdb, dy, a, b, nb, m, k, n, 0);
  k_gemm(da, dy, b, nb, m, k, n, 0, 1, (long)m * n, 0, (long)m * k, 0.0f);
  k_gemm(db, a, dy, nb, k, n, m, 1, 0, (long)m * k, (long)m * n, 0, 0.0f);
  expect_close("gemm dA", da, rda, nb * m * k, 1e-5f);
  expect_close("gemm dB summed", db, rdb, k * n, 1e-5f);
  free_all();
}

static void test_binary(void) {
  long n = 6 * 8, nb = 8;
  float *a = rnd(n), *b = rnd(nb), *ref = zeros(n), *out = zeros(n);
  int ash[2] = {6, 8}, bsh[1] = {8};
  for (KBinary op = K_ADD; op < K_BINARY_GRAD_END; op++) {
    k_binary_forward(op, ref, a, ash, 2, b, bsh, 1);
    kf_binary_period_forward(op, out, a, n, b, nb, n);
    expect_close(k_binary_names[op], out, ref, n, 1e-6f);
    float *dy = rnd(n), *da = zeros(n), *db = zeros(nb), *rda = zeros(n), *rdb = zeros(nb);
    k_binary_backward(op, rda, rdb, dy, a, ash, 2, b, bsh, 1);
    kf_binary_period_backward(op, da, n, db, nb, dy, a, b, n);
    expect_close("binary backward da", da, rda, n, 1e-5f);
    expect_close("binary backward db", db, rdb, nb, 1e-5f);
  }
  free_all();
}

/* sdpa by loops in double: q [nb, tq, d], k and v [nb / group, tk, d]; query batch-head z reads
 * key/value batch-head z / group; causal is top-left (query i sees keys j <= i); km [nb / heads, tk]
 * (or NULL) masks key j of batch-head z where km[z / heads, j] == 0, and a query with no key left
 * gives 0s. out, att [nb, tq, tk] (zero at the start); with dy, the gradients (dk and dv summed over
 * each group). */
static void sdpa_loops(const float *q, const float *k, const float *v, const float *km, const float *dy, int nb,
                       int tq, int tk, int d, int causal, int group, int heads, float *out, float *att, float *dq,
                       float *dk, float *dv) {
  double scale = 1.0 / sqrt((double)d);
  for (long z = 0; z < nb; z++) {
    const float *qz = q + z * tq * d, *kz = k + z / group * tk * d, *vz = v + z / group * tk * d;
    for (int i = 0; i < tq; i++) {
      int end = causal && i + 1 < tk ? i + 1 : tk;
      double p[256], m = -INFINITY, sum = 0, dot = 0;
      for (int j = 0; j < tk; j++) {
        double sc = 0;
        for (int c = 0; c < d; c++) sc += (double)qz[i * d + c] * kz[j * d + c];
        p[j] = j < end && (!km || km[z / heads * tk + j] != 0) ? sc * scale : -INFINITY;
        m = p[j] > m ? p[j] : m;
      }
      if (m == -INFINITY) continue; /* no key: out, att and the gradients 0 */
      for (int j = 0; j < tk; j++) sum += (p[j] = exp(p[j] - m));
      for (int j = 0; j < tk; j++) att[(z * tq + i) * tk + j] = (float)(p[j] /= sum);
      for (int c = 0; c < d; c++) {
        double o = 0;
        for (int j = 0; j < tk; j++) o += p[j] * vz[j * d + c];
        out[(z * tq + i) * d + c] = (float)o;
      }
      if (!dy) continue;
      const float *g = dy + (z * tq + i) * d;
      double dp[256];
      for (int j = 0; j < tk; j++) {
        dp[j] = 0;
        for (int c = 0; c < d; c++) dp[j] += (double)g[c] * vz[j * d + c];
        dot += p[j] * dp[j];
      }
      for (int j = 0; j < tk; j++) {
        double ds = p[j] * (dp[j] - dot) * scale;
        for (int c = 0; c < d; c++) {
          dq[(z * tq + i) * d + c] += (float)(ds * kz[j * d + c]);
          dk[(z / group * tk + j) * d + c] += (float)(ds * qz[i * d + c]);
          dv[(z / group * tk + j) * d + c] += (float)(p[j] * g[c]);
        }
      }
    }
  }
}

/* tq != tk: cross-attention; group > 1: grouped-query attention (heads = group: nb / group samples).
 * masked: a key mask, sample b's keys j with (j + b) % 3 == 1 out, and every key of sample 1 (its
 * rows have none left). */
static void test_sdpa(int causal, int group, int tq, int tk, int masked) {
  int nb = 4, d = 4, heads = group, batch = nb / heads;
  long sz = (long)nb * tq * d, ksz = (long)nb / group * tk * d, asz = (long)nb * tq * tk;
  float *q = rnd(sz), *k = rnd(ksz), *v = rnd(ksz), *dy = rnd(sz);
  float *o = zeros(sz), *ro = zeros(sz), *att = zeros(asz), *ratt = zeros(asz);
  float *rq = zeros(sz), *rk = zeros(ksz), *rv = zeros(ksz), *km = masked ? zeros((long)batch * tk) : NULL;
  for (int x = 0; masked && x < batch * tk; x++) km[x] = x / tk != 1 && (x % tk + x / tk) % 3 != 1;
  sdpa_loops(q, k, v, km, dy, nb, tq, tk, d, causal, group, heads, ro, ratt, rq, rk, rv);
  k_sdpa_fast_forward(o, att, q, k, v, km, nb, tq, tk, d, causal, group, heads);
  expect_close("sdpa out", o, ro, sz, 1e-5f);
  expect_close("sdpa att", att, ratt, asz, 1e-5f);
  /* dk, dv start as noise: the kernel writes them */
  float *dq = zeros(sz), *dk = rnd(ksz), *dv = rnd(ksz);
  k_sdpa_fast_backward(dq, dk, dv, dy, att, q, k, v, nb, tq, tk, d, group, zeros((long)group * tq * tk));
  expect_close("sdpa dq", dq, rq, sz, 1e-4f);
  expect_close("sdpa dk", dk, rk, ksz, 1e-4f);
  expect_close("sdpa dv", dv, rv, ksz, 1e-4f);
  free_all();
}

static void test_i32(void) {
  int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {1, 0, 6};
  int ash[2] = {2, 3}, bsh[1] = {3};
  float eq[6], want[6] = {1, 0, 0, 0, 0, 1};
  k_binary_i32_forward(K_EQ, eq, a, ash, 2, b, bsh, 1);
  expect_close("i32 eq", eq, want, 6, 0);
  int32_t sum[6];
  k_binary_i32_forward(K_ADD, sum, a, ash, 2, b, bsh, 1);
  if (sum[2] != 9 || sum[4] != 5) fprintf(stderr, "FAILED i32 add\n"), failures++;
}

int main(void) {
  srand(7);
  test_gemm();
  test_binary();
  static const int lens[][2] = {{6, 6}, {5, 9}, {9, 5}, {7, 1}};
  for (int group = 1; group <= 4; group *= 2)
    for (int l = 0; l < 4; l++) {
      for (int masked = 0; masked < 2; masked++) {
        test_sdpa(0, group, lens[l][0], lens[l][1], masked);
        test_sdpa(1, group, lens[l][0], lens[l][1], masked);
      }
    }
  test_i32();
  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  else printf("fast kernels: ok\n");
  return failures != 0;
}
