/* test_fast_nn.c: checks every fast kernel of kernels/cpu/fast_nn.c against its reference twin
 * (ref.c, or fast.c for the period-broadcast binary ops), on odd sizes that leave loop tails
 * (rows 37, c 129) and on the sizes of a typical GPT step.
 * A value passes when |fast - ref| <= RTOL * |ref| + ATOL * max|ref| (the second term covers
 * outputs that cancel to near zero); unary forwards are held to MATH_RTOL, purely relative.
 * Infinities and NaNs must match exactly. Backward kernels
 * run twice: into zeroed gradients (precision) and into random ones (they must accumulate).
 * Prints one line per check and "N passed, N failed"; exits non-zero on any failure. */
#include "fast.h"
#include "fast_nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RTOL 1e-5
#define ATOL 1e-6
#define MATH_RTOL 1e-6 /* unary forwards, purely relative: the exp/log/tanh polynomials promise
                          a few ulp, and no elementwise function cancels */

static int n_pass, n_fail;

/* ---- buffers, random numbers, comparison ------------------------------------------------------ */

static void *pool[64];
static int npool;

static float *fbuf(long n) {
  if (npool == 64) abort();
  float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
  if (!p) abort();
  return pool[npool++] = p;
}

static void pool_free(void) {
  while (npool) free(pool[--npool]);
}

static unsigned long long rng_state = 0x2545f4914f6cdd1dull;

static float rnd(float lo, float hi) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (hi - lo) * (float)((double)(rng_state >> 11) / 9007199254740992.0);
}

static float *rand_buf(long n, float lo, float hi) {
  float *p = fbuf(n);
  for (long i = 0; i < n; i++) p[i] = rnd(lo, hi);
  return p;
}

static float *copy_buf(const float *src, long n) {
  float *p = fbuf(n);
  memcpy(p, src, sizeof(float) * (size_t)(n > 0 ? n : 0));
  return p;
}

/* the gradient buffers of a backward check: zero in pass 0, random in pass 1 (tests +=) */
static float *grad_buf(long n, int pass) {
  return pass ? rand_buf(n, -0.5f, 0.5f) : fbuf(n);
}

static void check_tol(const char *what, const char *size, const float *fast, const float *ref,
                      long n, double rtol, double atol, double floor) {
  double mx = 0, worst = 0;
  long bad = 0, at = -1;
  for (long i = 0; i < n; i++)
    if (isfinite(ref[i]) && fabs(ref[i]) > mx) mx = fabs(ref[i]);
  for (long i = 0; i < n; i++) {
    double d, tol = rtol * fabs(ref[i]) + atol * mx + floor, ratio;
    if (!isfinite(ref[i]))
      ratio = (isnan(ref[i]) && isnan(fast[i])) || fast[i] == ref[i] ? 0 : INFINITY;
    else
      d = fabs((double)fast[i] - ref[i]), ratio = d == 0 ? 0 : tol > 0 ? d / tol : INFINITY;
    if (!(ratio <= 1)) bad++;
    if (!(ratio <= worst)) worst = ratio, at = i;
  }
  char detail[160];
  if (at >= 0)
    snprintf(detail, sizeof detail, "%s: worst err/tol %.3g at %ld (fast %.9g ref %.9g)%s", size,
             worst, at, fast[at], ref[at], bad ? " MISMATCH" : "");
  else
    snprintf(detail, sizeof detail, "%s: exact", size);
  printf("%s %-32s %s\n", bad ? "FAIL" : "ok  ", what, detail);
  if (bad)
    n_fail++;
  else
    n_pass++;
}

static void check(const char *what, const char *size, const float *fast, const float *ref, long n) {
  check_tol(what, size, fast, ref, n, RTOL, ATOL, 0);
}

static void check1(const char *what, const char *size, float fast, float ref) {
  check(what, size, &fast, &ref, 1);
}

/* ---- elementwise ------------------------------------------------------------------------------ */

/* The absolute error allowed in a unary forward on top of math_rtol: results near the float
 * underflow may flush to 0 a little early, and the reference's gelu, 0.5 x (1 + tanh u) in
 * double, is itself 0 (exactly) once tanh u rounds to -1, where the fast x sigmoid(2u) still
 * gives the true tiny value. */
static double math_floor(KUnary op) {
  return op == K_GELU ? 1e-15 : 1e-35;
}

/* gelu's exp argument 2u, rounded in float, is off by ~|2u| ulp: up to ~2e-6 relative for x < -4
 * (tiny outputs); it gets the general RTOL */
static double math_rtol(KUnary op) {
  return op == K_GELU ? RTOL : MATH_RTOL;
}

static int positive_domain(KUnary op) {
  return op == K_LOG || op == K_SQRT || op == K_RSQRT || op == K_POW;
}

static void test_unary(long n) {
  char size[32], what[64];
  snprintf(size, sizeof size, "n %ld", n);
  for (int op = 0; op < K_UNARY_COUNT; op++) {
    float *x = positive_domain(op) ? rand_buf(n, 0.05f, 5.0f) : rand_buf(n, -9.0f, 9.0f);
    float c = op == K_POW ? 1.7f : 0.0f;
    float *of = fbuf(n), *or = fbuf(n), *dout = rand_buf(n, -1, 1);
    kf_unary_forward(op, of, x, n, c);
    k_unary_forward(op, or, x, n, c);
    snprintf(what, sizeof what, "unary_forward %s", k_unary_names[op]);
    check_tol(what, size, of, or, n, math_rtol(op), 0, math_floor(op));
    for (int pass = 0; pass < 2; pass++) {
      float *df = grad_buf(n, pass), *dr = copy_buf(df, n);
      kf_unary_backward(op, df, dout, x, or, n, c);
      k_unary_backward(op, dr, dout, x, or, n, c);
      snprintf(what, sizeof what, "unary_backward %s%s", k_unary_names[op], pass ? " +=" : "");
      check(what, size, df, dr, n);
    }
    pool_free();
  }
}

/* exp, log, tanh, gelu at the edges of their ranges: overflow, underflow, denormals, 0, NaN */
static void test_unary_edges(void) {
  enum { N = 4096 };
  static const KUnary ops[] = {K_EXP, K_LOG, K_TANH, K_SIGMOID, K_GELU, K_SILU};
  float *x = fbuf(N + 8);
  for (int i = 0; i < N; i++) x[i] = -110.0f + 205.0f * (float)i / N; /* exp: both ends */
  float tail[8] = {0.0f, -0.0f, 1e-30f, 3e-42f, 1e-6f, INFINITY, -INFINITY, NAN};
  memcpy(x + N, tail, sizeof tail);
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    float *xs = copy_buf(x, N + 8);
    if (ops[k] == K_LOG) /* log: across the exponents, denormals included */
      for (int i = 0; i < N; i++) xs[i] = ldexpf(1.0f + (float)(i % 97) / 97.0f, i % 270 - 148);
    float *of = fbuf(N + 8), *or = fbuf(N + 8);
    kf_unary_forward(ops[k], of, xs, N + 8, 0);
    k_unary_forward(ops[k], or, xs, N + 8, 0);
    char what[64];
    snprintf(what, sizeof what, "unary_forward %s edges", k_unary_names[ops[k]]);
    check_tol(what, "sweep", of, or, N + 8, math_rtol(ops[k]), 0, math_floor(ops[k]));
  }
  pool_free();
}

/* the test's own period-broadcast gradient, in double: the truth the fast one is held to */
static void period_grad_f64(KBinary op, float *da, long na, float *db, long nb, const float *dout,
                            const float *a, const float *b, long n) {
  double *sa = calloc((size_t)na, sizeof(double)), *sb = calloc((size_t)nb, sizeof(double));
  if (!sa || !sb) abort();
  for (long i = 0; i < n; i++) {
    double pa, pb, x = a[i % na], y = b[i % nb];
    switch (op) {
    case K_ADD: pa = 1, pb = 1; break;
    case K_SUB: pa = 1, pb = -1; break;
    case K_MUL: pa = y, pb = x; break;
    case K_DIV: pa = 1 / y, pb = -x / (y * y); break;
    case K_MAXIMUM: pa = x > y ? 1 : x < y ? 0 : 0.5, pb = 1 - pa; break;
    case K_MINIMUM: pa = x < y ? 1 : x > y ? 0 : 0.5, pb = 1 - pa; break;
    case K_MOD: pa = 1, pb = -floor(x / y); break; /* PyTorch's remainder */
    default: abort(); /* a differentiable KBinary without a case here */
    }
    sa[i % na] += dout[i] * pa;
    sb[i % nb] += dout[i] * pb;
  }
  for (long i = 0; i < na; i++) da[i] += (float)sa[i];
  for (long i = 0; i < nb; i++) db[i] += (float)sb[i];
  free(sa);
  free(sb);
}

/* The reference of a period-broadcast op, one element at a time through ref.h's kernel. */
static void period_fwd_ref(KBinary op, float *out, const float *a, long na, const float *b, long nb, long n) {
  int one = 1;
  for (long i = 0; i < n; i++) k_binary_forward(op, out + i, a + i % na, &one, 1, b + i % nb, &one, 1);
}

static void test_binary_period(long na, long nb, long n) {
  char size[48], what[64];
  snprintf(size, sizeof size, "na %ld nb %ld n %ld", na, nb, n);
  for (int op = 0; op < K_BINARY_COUNT; op++) {
    /* values on a coarse grid, so maximum/minimum and the comparisons meet ties */
    float *a = fbuf(na), *b = fbuf(nb), *of = fbuf(n), *or = fbuf(n), *dout = rand_buf(n, -1, 1);
    float off = op == K_DIV || op == K_MOD || op == K_FLOORDIV ? 0.5f : 0; /* no division by 0 */
    for (long i = 0; i < na; i++) a[i] = (float)((int)rnd(0, 7) - 3) + off;
    for (long i = 0; i < nb; i++) b[i] = (float)((int)rnd(0, 7) - 3) + off;
    kf_binary_period_forward(op, of, a, na, b, nb, n);
    period_fwd_ref(op, or, a, na, b, nb, n);
    snprintf(what, sizeof what, "binary_period_forward %s", k_binary_names[op]);
    check(what, size, of, or, n);
    for (int pass = 0; op < K_BINARY_GRAD_END && pass < 2; pass++) {
      float *daf = grad_buf(na, pass), *dbf = grad_buf(nb, pass);
      float *dar = copy_buf(daf, na), *dbr = copy_buf(dbf, nb);
      kf_binary_period_backward(op, daf, na, dbf, nb, dout, a, b, n);
      period_grad_f64(op, dar, na, dbr, nb, dout, a, b, n);
      const char *acc = pass ? " +=" : "";
      snprintf(what, sizeof what, "binary_period_backward %s da%s", k_binary_names[op], acc);
      check(what, size, daf, dar, na);
      snprintf(what, sizeof what, "binary_period_backward %s db%s", k_binary_names[op], acc);
      check(what, size, dbf, dbr, nb);
    }
    pool_free();
  }
}

/* ---- reductions and layout -------------------------------------------------------------------- */

static void test_sum_mean(int outer, int n, int inner) {
  char size[48];
  snprintf(size, sizeof size, "%d x %d x %d", outer, n, inner);
  long nx = (long)outer * n * inner, no = (long)outer * inner;
  float *x = rand_buf(nx, -1, 1), *of = fbuf(no), *or = fbuf(no), *dout = rand_buf(no, -1, 1);
  kf_sum_forward(of, x, outer, n, inner);
  k_sum_forward(or, x, outer, n, inner);
  check("sum_forward", size, of, or, no);
  kf_mean_forward(of, x, outer, n, inner);
  k_mean_forward(or, x, outer, n, inner);
  check("mean_forward", size, of, or, no);
  float *df = grad_buf(nx, 1), *dr = copy_buf(df, nx);
  kf_sum_backward(df, dout, outer, n, inner);
  k_sum_backward(dr, dout, outer, n, inner);
  check("sum_backward +=", size, df, dr, nx);
  kf_mean_backward(df, dout, outer, n, inner);
  k_mean_backward(dr, dout, outer, n, inner);
  check("mean_backward +=", size, df, dr, nx);
  pool_free();
}

/* where's backward: cond, a and b each of shape os or with broadcast dims (size 1, or left out),
 * into gradients that already hold values (they accumulate) */
static void test_where(const int *os, int orank, const int *cs, int crank, const int *as, int arank, const int *bs,
                       int brank) {
  char size[64];
  int at = snprintf(size, sizeof size, "[");
  for (int d = 0; d < orank && at < (int)sizeof size - 8; d++)
    at += snprintf(size + at, sizeof size - (size_t)at, "%s%d", d ? "," : "", os[d]);
  snprintf(size + at, sizeof size - (size_t)at, "] c%d a%d b%d", crank, arank, brank);
  long n = 1, nc = 1, na = 1, nb = 1;
  for (int d = 0; d < orank; d++) n *= os[d];
  for (int d = 0; d < crank; d++) nc *= cs[d];
  for (int d = 0; d < arank; d++) na *= as[d];
  for (int d = 0; d < brank; d++) nb *= bs[d];
  float *cond = rand_buf(nc, -1, 1), *dout = rand_buf(n, -1, 1);
  for (long i = 0; i < nc; i++) cond[i] = cond[i] > 0; /* a comparison's 1.0 / 0.0 */
  float *daf = grad_buf(na, 1), *dar = copy_buf(daf, na), *dbf = grad_buf(nb, 1), *dbr = copy_buf(dbf, nb);
  kf_where_backward(daf, dbf, dout, os, orank, cond, cs, crank, as, arank, bs, brank);
  k_where_backward(dar, dbr, dout, os, orank, cond, cs, crank, as, arank, bs, brank);
  check("where_backward da +=", size, daf, dar, na);
  check("where_backward db +=", size, dbf, dbr, nb);
  kf_where_backward(NULL, dbf, dout, os, orank, cond, cs, crank, as, arank, bs, brank);
  k_where_backward(NULL, dbr, dout, os, orank, cond, cs, crank, as, arank, bs, brank);
  check("where_backward db alone", size, dbf, dbr, nb);
  pool_free();
}

static void test_transpose(int nb, int m, int n) {
  char size[48];
  snprintf(size, sizeof size, "%d x %d x %d", nb, m, n);
  long nx = (long)nb * m * n;
  float *x = rand_buf(nx, -1, 1), *of = fbuf(nx), *or = fbuf(nx);
  kf_transpose_forward(of, x, nb, m, n);
  k_transpose_forward(or, x, nb, m, n);
  check("transpose_forward", size, of, or, nx);
  float *df = grad_buf(nx, 1), *dr = copy_buf(df, nx);
  kf_transpose_backward(df, x, nb, m, n);
  k_transpose_backward(dr, x, nb, m, n);
  check("transpose_backward +=", size, df, dr, nx);
  pool_free();
}

/* ---- row kernels ------------------------------------------------------------------------------ */

static void test_softmax(int rows, int n) {
  char size[48];
  snprintf(size, sizeof size, "%d x %d", rows, n);
  long nx = (long)rows * n;
  float *x = rand_buf(nx, -8, 8), *of = fbuf(nx), *or = fbuf(nx), *dout = rand_buf(nx, -1, 1);
  kf_softmax_forward(of, x, rows, n);
  k_softmax_forward(or, x, rows, n);
  check("softmax_forward", size, of, or, nx);
  for (int pass = 0; pass < 2; pass++) {
    float *df = grad_buf(nx, pass), *dr = copy_buf(df, nx);
    kf_softmax_backward(df, dout, or, rows, n);
    k_softmax_backward(dr, dout, or, rows, n);
    check(pass ? "softmax_backward +=" : "softmax_backward", size, df, dr, nx);
  }
  kf_log_softmax_forward(of, x, rows, n);
  k_log_softmax_forward(or, x, rows, n);
  check("log_softmax_forward", size, of, or, nx);
  for (int pass = 0; pass < 2; pass++) {
    float *df = grad_buf(nx, pass), *dr = copy_buf(df, nx);
    kf_log_softmax_backward(df, dout, or, rows, n);
    k_log_softmax_backward(dr, dout, or, rows, n);
    check(pass ? "log_softmax_backward +=" : "log_softmax_backward", size, df, dr, nx);
  }
  pool_free();
}

/* PyTorch's _safe_softmax: rows with every score -inf give 0, rows with some -inf as softmax does */
static void test_safe_softmax(int rows, int n) {
  char size[48];
  snprintf(size, sizeof size, "%d x %d", rows, n);
  long nx = (long)rows * n;
  float *x = rand_buf(nx, -8, 8), *of = fbuf(nx), *or = fbuf(nx), *plain = fbuf(nx);
  for (long r = 0; r < rows; r++)
    for (long j = 0; j < n; j++)
      if (r % 3 == 0 || (r % 3 == 1 && j % 2)) x[r * n + j] = -INFINITY; /* all masked, half masked, none */
  kf_safe_softmax_forward(of, x, rows, n);
  k_safe_softmax_forward(or, x, rows, n);
  check("safe_softmax_forward", size, of, or, nx);
  long zero = 0, nan = 0;
  k_softmax_forward(plain, x, rows, n);
  for (long i = 0; i < nx; i++) zero += i / n % 3 == 0 && or[i] == 0.0f, nan += isnan(plain[i]);
  check1("safe_softmax: masked rows are 0", size, (float)zero, (float)(((rows + 2) / 3) * (long)n));
  check1("softmax: masked rows are NaN", size, (float)nan, (float)(((rows + 2) / 3) * (long)n));
  for (long r = 0; r < rows; r++) /* the rows not all -inf: the two agree */
    if (r % 3 == 0) memcpy(plain + r * n, or + r * n, sizeof(float) * (size_t)n);
    else k_softmax_forward(plain + r * n, x + r * n, 1, n);
  check("safe_softmax = softmax unmasked", size, or, plain, nx);
  pool_free();
}

static void test_layer_norm(int rows, int c) {
  char size[48];
  snprintf(size, sizeof size, "%d x %d", rows, c);
  long nx = (long)rows * c;
  /* an offset mean, so a careless variance formula would show */
  float *x = rand_buf(nx, 1, 5), *w = rand_buf(c, 0.5f, 1.5f), *b = rand_buf(c, -0.5f, 0.5f);
  float *of = fbuf(nx), *or = fbuf(nx), *mf = fbuf(rows), *mr = fbuf(rows), *sf = fbuf(rows),
        *sr = fbuf(rows), *dout = rand_buf(nx, -1, 1);
  kf_layer_norm_forward(of, mf, sf, x, w, b, rows, c, 1e-5f);
  k_layer_norm_forward(or, mr, sr, x, w, b, rows, c, 1e-5f);
  check("layer_norm_forward out", size, of, or, nx);
  check("layer_norm_forward mean", size, mf, mr, rows);
  check("layer_norm_forward rstd", size, sf, sr, rows);
  kf_layer_norm_forward(of, NULL, NULL, x, w, b, rows, c, 1e-5f);
  check("layer_norm_forward no stats", size, of, or, nx);
  for (int pass = 0; pass < 3; pass++) { /* pass 2: dw, db not wanted */
    float *dxf = grad_buf(nx, pass), *dwf = grad_buf(c, pass), *dbf = grad_buf(c, pass);
    float *dxr = copy_buf(dxf, nx), *dwr = copy_buf(dwf, c), *dbr = copy_buf(dbf, c);
    kf_layer_norm_backward(dxf, pass == 2 ? NULL : dwf, pass == 2 ? NULL : dbf, dout, x, w, mr,
                           sr, rows, c);
    k_layer_norm_backward(dxr, pass == 2 ? NULL : dwr, pass == 2 ? NULL : dbr, dout, x, w, mr, sr,
                          rows, c);
    check(pass ? "layer_norm_backward dx +=" : "layer_norm_backward dx", size, dxf, dxr, nx);
    check(pass ? "layer_norm_backward dw +=" : "layer_norm_backward dw", size, dwf, dwr, c);
    check(pass ? "layer_norm_backward db +=" : "layer_norm_backward db", size, dbf, dbr, c);
  }
  kf_rms_norm_forward(of, sf, x, w, rows, c, 1e-5f);
  k_rms_norm_forward(or, sr, x, w, rows, c, 1e-5f);
  check("rms_norm_forward out", size, of, or, nx);
  check("rms_norm_forward rstd", size, sf, sr, rows);
  for (int pass = 0; pass < 3; pass++) {
    float *dxf = grad_buf(nx, pass), *dwf = grad_buf(c, pass);
    float *dxr = copy_buf(dxf, nx), *dwr = copy_buf(dwf, c);
    kf_rms_norm_backward(pass == 2 ? NULL : dxf, dwf, dout, x, w, sr, rows, c);
    k_rms_norm_backward(pass == 2 ? NULL : dxr, dwr, dout, x, w, sr, rows, c);
    check(pass ? "rms_norm_backward dx +=" : "rms_norm_backward dx", size, dxf, dxr, nx);
    check(pass ? "rms_norm_backward dw +=" : "rms_norm_backward dw", size, dwf, dwr, c);
  }
  pool_free();
}

static void test_cross_entropy(int rows, int v, int ignore_every) {
  char size[48];
  snprintf(size, sizeof size, "%d x %d", rows, v);
  long nx = (long)rows * v;
  float *x = rand_buf(nx, -6, 6);
  int32_t *t = malloc(sizeof(int32_t) * (size_t)rows);
  if (!t) abort();
  for (int r = 0; r < rows; r++)
    t[r] = ignore_every && r % ignore_every == 0 ? -1 : (int32_t)rnd(0, (float)v - 0.01f);
  int cf = -1, cr = -2;
  float lf = kf_cross_entropy_forward(&cf, x, t, rows, v);
  float lr = k_cross_entropy_forward(&cr, x, t, rows, v);
  check1("cross_entropy_forward loss", size, lf, lr);
  check1("cross_entropy_forward count", size, (float)cf, (float)cr);
  for (int pass = 0; pass < 2; pass++) {
    float *df = grad_buf(nx, pass), *dr = copy_buf(df, nx);
    kf_cross_entropy_backward(df, 1.7f, x, t, rows, v);
    k_cross_entropy_backward(dr, 1.7f, x, t, rows, v);
    check(pass ? "cross_entropy_backward +=" : "cross_entropy_backward", size, df, dr, nx);
  }
  free(t);
  pool_free();
}

static void test_embedding(int n, int v, int c) {
  char size[48];
  snprintf(size, sizeof size, "n %d v %d c %d", n, v, c);
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)n);
  if (!idx) abort();
  for (int i = 0; i < n; i++) idx[i] = (int32_t)rnd(0, (float)v / 2); /* many repeats */
  float *table = rand_buf((long)v * c, -1, 1), *of = fbuf((long)n * c), *or = fbuf((long)n * c);
  kf_embedding_forward(of, table, idx, n, v, c);
  k_embedding_forward(or, table, idx, n, v, c);
  check("embedding_forward", size, of, or, (long)n * c);
  float *dout = rand_buf((long)n * c, -1, 1), *df = grad_buf((long)v * c, 1);
  float *dr = copy_buf(df, (long)v * c);
  kf_embedding_backward(df, dout, idx, n, v, c);
  k_embedding_backward(dr, dout, idx, n, v, c);
  check("embedding_backward +=", size, df, dr, (long)v * c);
  free(idx);
  pool_free();
}

static void test_heads(int b, int t, int c, int h) {
  char size[48];
  snprintf(size, sizeof size, "%d x %d x %d, h %d", b, t, c, h);
  long nx = (long)b * t * c;
  float *x = rand_buf(nx, -1, 1), *of = fbuf(nx), *or = fbuf(nx);
  kf_split_heads_forward(of, x, b, t, c, h);
  k_split_heads_forward(or, x, b, t, c, h);
  check("split_heads_forward", size, of, or, nx);
  kf_merge_heads_forward(of, x, b, t, c, h);
  k_merge_heads_forward(or, x, b, t, c, h);
  check("merge_heads_forward", size, of, or, nx);
  float *df = grad_buf(nx, 1), *dr = copy_buf(df, nx);
  kf_split_heads_backward(df, x, b, t, c, h);
  k_split_heads_backward(dr, x, b, t, c, h);
  check("split_heads_backward +=", size, df, dr, nx);
  kf_merge_heads_backward(df, x, b, t, c, h);
  k_merge_heads_backward(dr, x, b, t, c, h);
  check("merge_heads_backward +=", size, df, dr, nx);
  pool_free();
}

static void test_slice(int outer, int n, int inner, int start, int end) {
  char size[64];
  snprintf(size, sizeof size, "%d x %d x %d [%d:%d]", outer, n, inner, start, end);
  long nx = (long)outer * n * inner, no = (long)outer * (end - start) * inner;
  float *x = rand_buf(nx, -1, 1), *of = fbuf(no), *or = fbuf(no), *dout = rand_buf(no, -1, 1);
  kf_slice_forward(of, x, outer, n, inner, start, end);
  k_slice_forward(or, x, outer, n, inner, start, end);
  check("slice_forward", size, of, or, no);
  float *df = grad_buf(nx, 1), *dr = copy_buf(df, nx);
  kf_slice_backward(df, dout, outer, n, inner, start, end);
  k_slice_backward(dr, dout, outer, n, inner, start, end);
  check("slice_backward +=", size, df, dr, nx);
  pool_free();
}

static void test_concat(int outer, int inner) {
  enum { COUNT = 3 };
  const int ns[COUNT] = {3, 0, 17};
  char size[48];
  snprintf(size, sizeof size, "%d x (3, 0, 17) x %d", outer, inner);
  long total = 20L * outer * inner;
  const float *xs[COUNT];
  float *dxf[COUNT], *dxr[COUNT];
  for (int q = 0; q < COUNT; q++) {
    long len = (long)outer * ns[q] * inner;
    xs[q] = rand_buf(len, -1, 1);
    dxf[q] = grad_buf(len, 1), dxr[q] = copy_buf(dxf[q], len);
  }
  float *of = fbuf(total), *or = fbuf(total), *dout = rand_buf(total, -1, 1);
  kf_concat_forward(of, xs, ns, COUNT, outer, inner);
  k_concat_forward(or, xs, ns, COUNT, outer, inner);
  check("concat_forward", size, of, or, total);
  dxf[0] = dxr[0] = NULL; /* the first input's gradient is not wanted */
  kf_concat_backward(dxf, dout, ns, COUNT, outer, inner);
  k_concat_backward(dxr, dout, ns, COUNT, outer, inner);
  check("concat_backward +=", size, dxf[2], dxr[2], (long)outer * ns[2] * inner);
  pool_free();
}

/* The k32_ moves of i32 tensors' shape ops: every element's bits arrive unchanged (NaN and
 * signalling-NaN patterns included), at the place the float reference kernel puts the element's
 * index (indices below 2^24 are exact floats). */
static void check_bits(const char *name, const uint32_t *got, const uint32_t *x, const float *where, long n) {
  long bad = 0;
  for (long i = 0; i < n; i++) bad += got[i] != x[(long)where[i]];
  printf("%s %s: %ld elements, %ld moved wrong\n", bad ? "FAIL" : "ok  ", name, n, bad);
  bad ? n_fail++ : n_pass++;
}

static void test_moves_i32(void) {
  enum { B = 3, T = 5, C = 12, H = 4, N = B * T * C };
  uint32_t x[N], out[N];
  float idx[N], *w = fbuf(N);
  for (long i = 0; i < N; i++) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = i % 3 == 0 ? 0x7f800001u + (uint32_t)i : (uint32_t)(rng_state >> 32); /* sNaN bit patterns too */
    idx[i] = (float)i;
  }
  const int shape[3] = {B, T, C}, perm[3] = {2, 0, 1}, hshape[4] = {B, T, H, C / H}, hperm[4] = {0, 2, 1, 3};
  k32_permute_forward(out, x, shape, 3, perm);
  k_permute_forward(w, idx, shape, 3, perm);
  check_bits("k32_permute_forward (permute)", out, x, w, N);
  k32_permute_forward(out, x, hshape, 4, hperm);
  k_split_heads_forward(w, idx, B, T, C, H);
  check_bits("k32_permute_forward (split_heads)", out, x, w, N);
  k32_slice_forward(out, x, B, T, C, 1, 4);
  k_slice_forward(w, idx, B, T, C, 1, 4);
  check_bits("k32_slice_forward", out, x, w, B * 3 * C);
  const int ns[3] = {2, 0, 3};
  const void *xs[3] = {x, x + B * 2 * C, x + B * 2 * C};
  const float *fs[3] = {idx, idx + B * 2 * C, idx + B * 2 * C};
  k32_concat_forward(out, xs, ns, 3, B, C);
  k_concat_forward(w, fs, ns, 3, B, C);
  check_bits("k32_concat_forward", out, x, w, N);
  pool_free();
}

int main(void) {
  test_unary(37 * 129);
  test_unary(1 << 16);
  test_unary_edges();
  long shapes[][3] = {{4773, 4773, 4773}, {4773, 1, 4773}, {1, 4773, 4773}, {4773, 129, 4773},
                      {129, 4773, 4773}, {129, 37, 4773}, {1, 1, 1}, {262144, 256, 262144}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    test_binary_period(shapes[i][0], shapes[i][1], shapes[i][2]);
  test_sum_mean(3, 37, 129);
  test_sum_mean(1, 100003, 1);
  test_sum_mean(5, 7, 600);
  test_sum_mean(1, 1024, 256);
  test_transpose(2, 37, 129);
  test_transpose(1, 256, 512);
  { /* where: a per-row cond [B, h, Tq, 1], a padding mask [B, 1, Tq, Tk], a scalar branch,
     * same shapes, a rank-1 cond, a scalar output */
    const int o4[4] = {3, 4, 5, 37}, row[4] = {3, 4, 5, 1}, pad[4] = {3, 1, 5, 37}, one[1] = {1}, last[1] = {37};
    test_where(o4, 4, row, 4, o4, 4, one, 0);
    test_where(o4, 4, pad, 4, o4, 4, o4, 4);
    test_where(o4, 4, o4, 4, pad, 4, row, 4);
    test_where(o4, 4, last, 1, last, 1, o4, 4);
    test_where(one, 0, one, 0, one, 0, one, 0);
  }
  test_softmax(37, 129);
  test_softmax(64, 512);
  test_softmax(5, 1);
  test_safe_softmax(7, 33);
  test_safe_softmax(4, 256);
  test_layer_norm(37, 129);
  test_layer_norm(1024, 256);
  test_layer_norm(3, 3);
  test_cross_entropy(37, 129, 5);
  test_cross_entropy(256, 512, 0);
  test_cross_entropy(4, 33, 1); /* every row ignored: loss 0, no gradient */
  test_embedding(37, 50, 129);
  test_embedding(1024, 512, 256);
  test_heads(2, 37, 129, 3);
  test_heads(8, 128, 256, 8);
  test_slice(5, 37, 129, 3, 20);
  test_slice(1024, 768, 1, 256, 512);
  test_slice(3, 10, 4, 7, 7);
  test_concat(5, 129);
  test_concat(37, 1);
  test_moves_i32();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
