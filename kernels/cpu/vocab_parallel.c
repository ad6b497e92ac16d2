/* vocab_parallel.c: the vocab-parallel embedding, cross_entropy and argmax kernels (vocab_parallel.h).
 * Sums run in double, as ref.c does, so the split loss matches the single-device one closely. */
#include "vocab_parallel.h"
#include "ref.h"

#include <math.h>
#include <string.h>

/* true when global index i falls in this rank's rows [v0, v0 + vl) */
static int kvp_mine(int32_t i, int v0, int vl) { return i >= v0 && i < v0 + vl; }

void kvp_embedding_forward(float *out, const float *table, const int32_t *idx, int n, int v0,
                           int vl, int v, int c) {
  k_assert(n >= 0 && vl > 0 && c > 0 && v0 >= 0 && v > 0);
  for (long i = 0; i < n; i++) {
    k_check_index("embedding", "index", i, idx[i], v);
    if (kvp_mine(idx[i], v0, vl))
      memcpy(out + i * c, table + (long)(idx[i] - v0) * c, sizeof(float) * (size_t)c);
    else
      memset(out + i * c, 0, sizeof(float) * (size_t)c);
  }
}

void kvp_embedding_backward(float *dtable, const float *dout, const int32_t *idx, int n, int v0,
                            int vl, int v, int c) {
  k_assert(n >= 0 && vl > 0 && c > 0 && v0 >= 0 && v > 0);
  for (long i = 0; i < n; i++) {
    k_check_index("embedding", "index", i, idx[i], v);
    if (!kvp_mine(idx[i], v0, vl)) continue; /* another rank's row */
    float *row = dtable + (long)(idx[i] - v0) * c;
    for (int j = 0; j < c; j++) row[j] += dout[i * c + j];
  }
}

void kvp_ce_row_max(float *m, const float *logits, int rows, int vl) {
  k_assert(rows >= 0 && vl > 0);
  for (long r = 0; r < rows; r++) {
    float x = logits[r * vl];
    for (int j = 1; j < vl; j++) x = fmaxf(x, logits[r * vl + j]);
    m[r] = x;
  }
}

void kvp_ce_max_combine(float *m, const float *gathered, int rows, int n) {
  k_assert(rows >= 0 && n > 0);
  for (long r = 0; r < rows; r++) {
    float x = gathered[r];
    for (long k = 1; k < n; k++) x = fmaxf(x, gathered[k * rows + r]);
    m[r] = x;
  }
}

void kvp_ce_row_sumexp(float *s, const float *logits, const float *m, int rows, int vl) {
  k_assert(rows >= 0 && vl > 0);
  for (long r = 0; r < rows; r++) {
    double sum = 0;
    for (int j = 0; j < vl; j++) sum += exp((double)logits[r * vl + j] - m[r]);
    s[r] = (float)sum;
  }
}

/* the counted rows (targets != -1); checks every target */
static int kvp_count(const int32_t *targets, int rows, int v) {
  int count = 0;
  for (int r = 0; r < rows; r++) {
    k_check_target(r, targets[r], v);
    count += targets[r] != -1;
  }
  return count;
}

float kvp_ce_forward_part(int *count, const float *logits, const float *m, const float *s,
                          const int32_t *targets, int rows, int vl, int v0, int v, int lead) {
  k_assert(rows >= 0 && vl > 0 && v0 >= 0 && v > 0);
  int cnt = kvp_count(targets, rows, v);
  double loss = 0;
  for (long r = 0; r < rows; r++) {
    if (targets[r] == -1) continue;
    if (lead) loss += (double)m[r] + log((double)s[r]);
    if (kvp_mine(targets[r], v0, vl)) loss -= logits[r * vl + targets[r] - v0];
  }
  if (count) *count = cnt;
  return (float)(cnt ? loss / cnt : 0.0);
}

void kvp_ce_backward(float *dlogits, float dloss, const float *logits, const float *m,
                     const float *s, const int32_t *targets, int rows, int vl, int v0, int v) {
  k_assert(rows >= 0 && vl > 0 && v0 >= 0 && v > 0);
  int cnt = kvp_count(targets, rows, v);
  for (long r = 0; r < rows; r++) {
    if (targets[r] == -1) continue; /* an ignored row gets no gradient at all */
    double g = (double)dloss / cnt, lse = (double)m[r] + log((double)s[r]);
    for (int j = 0; j < vl; j++) {
      double p = exp(logits[r * vl + j] - lse);
      dlogits[r * vl + j] += (float)(g * (p - (v0 + j == targets[r])));
    }
  }
}

void kvp_argmax_local(float *pair, const float *logits, int rows, int vl, int v0) {
  k_assert(rows >= 0 && vl > 0 && v0 >= 0);
  for (long r = 0; r < rows; r++) {
    const float *x = logits + r * vl;
    int best = -1;
    if (v0 == 0 && isnan(x[0])) best = 0; /* k_argmax_forward's scan starts at a NaN: it wins */
    else
      for (int j = 0; j < vl; j++)
        if (best < 0 ? !isnan(x[j]) : x[j] > x[best]) best = j;
    pair[r] = best < 0 ? -INFINITY : x[best];
    pair[rows + r] = (float)(v0 + (best < 0 ? 0 : best));
  }
}

void kvp_argmax_combine(int32_t *out, const float *gathered, int rows, int n) {
  k_assert(rows >= 0 && n > 0);
  for (long r = 0; r < rows; r++) {
    long best = 0; /* a later rank wins only with a strictly greater maximum (NaN never does) */
    for (long k = 1; k < n; k++)
      if (gathered[k * 2 * rows + r] > gathered[best * 2 * rows + r]) best = k;
    out[r] = (int32_t)gathered[best * 2 * rows + rows + r];
  }
}
