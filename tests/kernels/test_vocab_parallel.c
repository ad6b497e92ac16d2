/* test_vocab_parallel.c: the vocab-parallel kernels (kernels/cpu/vocab_parallel.c) against the
 * reference (ref.c) on split inputs. The global [rows, v] logits and [v, c] table are split into n
 * rank shards of rows [r*v/n, (r+1)*v/n) (lower.h's ranges, uneven when n does not divide v); the
 * collectives the plan would run are simulated here (all-gather of the row maxima, sum of the
 * sum-exps, sum of the embedding and loss parts), and the results must equal the single-device
 * kernels: forward loss and embedding, and the gradient shards against the columns (rows) of the
 * reference gradient, accumulated into random initial values (the kernels accumulate). Argmax
 * (all-gather of each rank's (max, index) pairs) must give k_argmax_forward's indices exactly,
 * with ties within and across ranks (the first maximum wins), -inf and NaN.
 * Prints one line per check and "N passed, N failed"; exits non-zero on any failure. */
#include "ref.h"
#include "vocab_parallel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 2e-6 /* relative to max |ref|: the same sums in a different grouping */

static int n_pass, n_fail;
static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;

static double urand(void) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

static float *fbuf(long n) {
  float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
  if (!p) abort();
  return p;
}

/* max |a - b| over n, relative to max |b| (1 when b is all zeros) */
static double rel_err(const float *a, const float *b, long n) {
  double e = 0, s = 0;
  for (long i = 0; i < n; i++) {
    e = fmax(e, fabs((double)a[i] - b[i]));
    s = fmax(s, fabs((double)b[i]));
  }
  return e / (s > 0 ? s : 1);
}

static void check(const char *what, int n, double err) {
  int ok = err <= TOL;
  printf("%s %s n=%d err=%.3g\n", ok ? "PASS" : "FAIL", what, n, err);
  ok ? n_pass++ : n_fail++;
}

/* this rank's first global row and row count */
static int lo(int r, int n, int v) { return (int)((long)r * v / n); }
static int len(int r, int n, int v) { return lo(r + 1, n, v) - lo(r, n, v); }

/* cross entropy over n ranks against the reference */
static void test_ce(int rows, int v, int n, float scale) {
  float *logits = fbuf((long)rows * v), *dref = fbuf((long)rows * v), *dsplit = fbuf((long)rows * v);
  int32_t *targets = calloc((size_t)rows, sizeof(int32_t));
  for (long i = 0; i < (long)rows * v; i++) {
    logits[i] = (float)((urand() * 2 - 1) * scale);
    dref[i] = dsplit[i] = (float)(urand() - 0.5);
  }
  for (int r = 0; r < rows; r++) targets[r] = r % 5 == 3 ? -1 : (int32_t)(urand() * v);
  int cref = 0;
  float ref = k_cross_entropy_forward(&cref, logits, targets, rows, v);
  k_cross_entropy_backward(dref, 0.7f, logits, targets, rows, v);

  float **shard = malloc(sizeof(float *) * (size_t)n);
  float *gathered = fbuf((long)n * rows), *m = fbuf(rows), *s = fbuf(rows), *part = fbuf(rows);
  for (int k = 0; k < n; k++) { /* each rank's shard: its columns of logits */
    shard[k] = fbuf((long)rows * len(k, n, v));
    for (int r = 0; r < rows; r++)
      memcpy(shard[k] + (long)r * len(k, n, v), logits + (long)r * v + lo(k, n, v),
             sizeof(float) * (size_t)len(k, n, v));
    kvp_ce_row_max(gathered + (long)k * rows, shard[k], rows, len(k, n, v)); /* all-gather */
  }
  kvp_ce_max_combine(m, gathered, rows, n);
  for (int k = 0; k < n; k++) { /* all-reduce (sum) */
    kvp_ce_row_sumexp(part, shard[k], m, rows, len(k, n, v));
    for (int r = 0; r < rows; r++) s[r] += part[r];
  }
  double loss = 0;
  int cnt = -1;
  for (int k = 0; k < n; k++)
    loss += kvp_ce_forward_part(&cnt, shard[k], m, s, targets, rows, len(k, n, v), lo(k, n, v), v, k == 0);
  float lossf = (float)loss;
  check("ce forward", n, rel_err(&lossf, &ref, 1) + (cnt != cref));
  for (int k = 0; k < n; k++) { /* gradient shards, accumulated into dsplit's columns */
    float *d = fbuf((long)rows * len(k, n, v));
    for (int r = 0; r < rows; r++)
      memcpy(d + (long)r * len(k, n, v), dsplit + (long)r * v + lo(k, n, v), sizeof(float) * (size_t)len(k, n, v));
    kvp_ce_backward(d, 0.7f, shard[k], m, s, targets, rows, len(k, n, v), lo(k, n, v), v);
    for (int r = 0; r < rows; r++)
      memcpy(dsplit + (long)r * v + lo(k, n, v), d + (long)r * len(k, n, v), sizeof(float) * (size_t)len(k, n, v));
    free(d);
    free(shard[k]);
  }
  check("ce backward", n, rel_err(dsplit, dref, (long)rows * v));
  free(shard), free(gathered), free(m), free(s), free(part);
  free(logits), free(dref), free(dsplit), free(targets);
}

/* embedding over n ranks against the reference: forward parts sum, backward shards are rows */
static void test_embedding(int nidx, int v, int c, int n) {
  float *table = fbuf((long)v * c), *out = fbuf((long)nidx * c), *sum = fbuf((long)nidx * c);
  float *dout = fbuf((long)nidx * c), *dref = fbuf((long)v * c), *dsplit = fbuf((long)v * c);
  float *part = fbuf((long)nidx * c);
  int32_t *idx = calloc((size_t)nidx, sizeof(int32_t));
  for (long i = 0; i < (long)v * c; i++) table[i] = (float)urand(), dref[i] = dsplit[i] = (float)urand();
  for (long i = 0; i < (long)nidx * c; i++) dout[i] = (float)(urand() - 0.5), part[i] = 99; /* overwritten */
  for (int i = 0; i < nidx; i++) idx[i] = (int32_t)(urand() * v);
  idx[1] = idx[0]; /* a repeated row */
  k_embedding_forward(out, table, idx, nidx, v, c);
  k_embedding_backward(dref, dout, idx, nidx, v, c);
  for (int k = 0; k < n; k++) {
    const float *rowsk = table + (long)lo(k, n, v) * c;
    kvp_embedding_forward(part, rowsk, idx, nidx, lo(k, n, v), len(k, n, v), v, c);
    for (long i = 0; i < (long)nidx * c; i++) sum[i] += part[i]; /* the graph's all-reduce */
    kvp_embedding_backward(dsplit + (long)lo(k, n, v) * c, dout, idx, nidx, lo(k, n, v), len(k, n, v), v, c);
  }
  check("embedding forward", n, rel_err(sum, out, (long)nidx * c));
  check("embedding backward", n, rel_err(dsplit, dref, (long)v * c));
  free(table), free(out), free(sum), free(dout), free(dref), free(dsplit), free(part), free(idx);
}

/* argmax of the last dim over n ranks against k_argmax_forward: exact. Values are drawn from a
 * few levels so rows have ties within and across shards; `special` adds rows of -inf, NaN at the
 * start, NaN inside and all NaN. */
static void test_argmax(int rows, int v, int n, int levels, int special) {
  float *logits = fbuf((long)rows * v), *gathered = fbuf((long)n * 2 * rows);
  int32_t *ref = calloc((size_t)rows, sizeof(int32_t)), *out = calloc((size_t)rows, sizeof(int32_t));
  for (long i = 0; i < (long)rows * v; i++) logits[i] = (float)(int)(urand() * levels);
  if (special && rows >= 5) {
    for (int j = 0; j < v; j++) logits[j] = -INFINITY, logits[4L * v + j] = NAN; /* row 0 all -inf, row 4 all NaN */
    logits[1L * v] = NAN;                                                       /* row 1: NaN first: index 0 */
    for (int j = 0; j < v; j += 3) logits[2L * v + j] = NAN;                    /* row 2: NaNs skipped */
    for (int j = v / 2; j < v; j++) logits[3L * v + j] = -INFINITY;             /* row 3: pad columns masked */
  }
  k_argmax_forward(ref, logits, rows, v, 1);
  for (int k = 0; k < n; k++) { /* each rank's columns; the all-gather */
    float *shard = fbuf((long)rows * len(k, n, v));
    for (int r = 0; r < rows; r++)
      memcpy(shard + (long)r * len(k, n, v), logits + (long)r * v + lo(k, n, v), sizeof(float) * (size_t)len(k, n, v));
    kvp_argmax_local(gathered + (long)k * 2 * rows, shard, rows, len(k, n, v), lo(k, n, v));
    free(shard);
  }
  kvp_argmax_combine(out, gathered, rows, n);
  int wrong = 0;
  for (int r = 0; r < rows; r++) wrong += out[r] != ref[r];
  check(special ? "argmax (-inf, NaN)" : levels < 4 ? "argmax (ties)" : "argmax", n, wrong);
  free(logits), free(gathered), free(ref), free(out);
}

/* ties across ranks by hand: a row whose maximum appears on ranks 1 and 2 of 3 (not on rank 0):
 * the lower global index, rank 1's, wins on every rank */
static void test_argmax_tie(void) {
  const float row[9] = {0, 1, 2, 5, 3, 5, 1, 5, 4}; /* ranks of 3: [0, 1, 2] [5, 3, 5] [1, 5, 4] */
  float g[3 * 2];
  int32_t out = -1;
  for (int k = 0; k < 3; k++) kvp_argmax_local(g + k * 2, row + 3 * k, 1, 3, 3 * k);
  kvp_argmax_combine(&out, g, 1, 3);
  check("argmax tie across ranks -> index 3", 3, out != 3);
}

int main(void) {
  static const int ns[] = {1, 2, 3, 4, 5};
  for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
    test_ce(13, 12, ns[i], 3.0f);   /* 5 does not divide 12: uneven ranges */
    test_ce(6, 50, ns[i], 40.0f);   /* large logits: the max must be the global one */
    test_embedding(9, 12, 7, ns[i]);
    test_argmax(40, 13, ns[i], 2, 0); /* two levels: ties within and across shards; 13: uneven */
    test_argmax(40, 64, ns[i], 1000, 0);
    test_argmax(12, 14, ns[i], 3, 1);
  }
  test_argmax_tie();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
