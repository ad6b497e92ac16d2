/* fast.c: the f32 CPU kernels of fast.h: GEMM through OpenBLAS, elementwise ops without the
 * per-element broadcast index arithmetic of the reference, and attention built on sgemm. */
#include "fast.h"
#include "fast_nn.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* ---- GEMM ------------------------------------------------------------------------------------ */

static void sgemm1(float *c, const float *a, const float *b, int m, int n, int k, int ta, int tb,
                   float beta) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, 1.0f, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

void k_gemm(float *c, const float *a, const float *b, int nb, int m, int n, int k, int ta, int tb,
            long sa, long sb, long sc, float beta) {
  k_assert(nb >= 1 && m >= 1 && n >= 1 && k >= 1);
  long mk = (long)m * k, kn = (long)k * n, mn = (long)m * n;
  /* A weight shared by every batch: the batches are rows of one taller A. */
  if (nb > 1 && !ta && sb == 0 && sa == mk && sc == mn) {
    sgemm1(c, a, b, nb * m, n, k, 0, tb, beta);
    return;
  }
  /* The gradient of a shared weight: A^T B summed over batches is one product with a longer k. */
  if (nb > 1 && sc == 0 && ta && !tb && sa == mk && sb == kn) {
    sgemm1(c, a, b, m, n, nb * k, 1, 0, beta);
    return;
  }
  for (int i = 0; i < nb; i++)
    sgemm1(c + i * sc, a + i * sa, b + i * sb, m, n, k, ta, tb, sc == 0 && i > 0 ? 1.0f : beta);
}

/* ---- elementwise ------------------------------------------------------------------------------ */

static float binary_f(KBinary op, float x, float y) {
  switch (op) {
  case K_ADD: return x + y;
  case K_SUB: return x - y;
  case K_MUL: return x * y;
  case K_DIV: return x / y;
  case K_MAXIMUM: return x > y ? x : y;
  case K_MINIMUM: return x < y ? x : y;
  case K_MOD: return (float)k_mod_f(x, y);
  case K_FLOORDIV: return floorf(x / y);
  case K_EQ: return x == y;
  case K_NE: return x != y;
  case K_LT: return x < y;
  case K_LE: return x <= y;
  case K_GT: return x > y;
  case K_GE: return x >= y;
  default: k_assert(!"binary op");
  }
  return 0;
}

static int32_t binary_i(KBinary op, int32_t x, int32_t y) {
  switch (op) {
  case K_ADD: return (int32_t)((uint32_t)x + (uint32_t)y);
  case K_SUB: return (int32_t)((uint32_t)x - (uint32_t)y);
  case K_MUL: return (int32_t)((uint32_t)x * (uint32_t)y);
  case K_DIV: return y == 0 || (x == INT32_MIN && y == -1) ? 0 : x / y;
  case K_MAXIMUM: return x > y ? x : y;
  case K_MINIMUM: return x < y ? x : y;
  case K_MOD: return k_mod_i(x, y);
  case K_FLOORDIV: return k_floordiv_i(x, y);
  default: return binary_f(op, (float)x, (float)y) != 0; /* comparisons, exact on small ints */
  }
}

void k_binary_i32_forward(KBinary op, void *out, const int32_t *a, const int *ashape, int arank,
                          const int32_t *b, const int *bshape, int brank) {
  int oshape[K_MAXDIM];
  int orank = k_bcast_shape(oshape, ashape, arank, bshape, brank);
  long n = k_numel(oshape, orank);
  for (long i = 0; i < n; i++) {
    int32_t x = a[k_bcast_index(i, oshape, orank, ashape, arank)];
    int32_t y = b[k_bcast_index(i, oshape, orank, bshape, brank)];
    if (op >= K_EQ) ((float *)out)[i] = (float)binary_i(op, x, y);
    else ((int32_t *)out)[i] = binary_i(op, x, y);
  }
}

void k_where_i32_forward(int32_t *out, const int *oshape, int orank, const float *cond, const int *cshape, int crank,
                         const int32_t *a, const int *ashape, int arank, const int32_t *b, const int *bshape,
                         int brank) {
  long n = k_numel(oshape, orank);
  for (long i = 0; i < n; i++)
    out[i] = cond[k_bcast_index(i, oshape, orank, cshape, crank)] != 0 ? a[k_bcast_index(i, oshape, orank, ashape, arank)]
                                                                          : b[k_bcast_index(i, oshape, orank, bshape, brank)];
}

void k_accum(float *dst, const float *x, long n) {
  for (long i = 0; i < n; i++) dst[i] += x[i];
}

/* ---- attention ------------------------------------------------------------------------------- */

/* Grouped-query attention stacks the group's query heads (consecutive batch-heads, so contiguous
 * rows of q, out and att): each product is one sgemm of group * tq rows against the shared k or v,
 * and the key/value gradients' sums over the group are the inner dimension of theirs. */
void k_sdpa_fast_forward(float *out, float *att, const float *q, const float *k, const float *v,
                         const float *km, int nb, int tq, int tk, int d, int causal, int group, int heads) {
  k_assert(nb >= 0 && tq > 0 && tk > 0 && d > 0 && group > 0 && nb % group == 0 && heads > 0 &&
           heads % group == 0 && nb % heads == 0);
  float scale = 1.0f / sqrtf((float)d);
  int rows = group * tq;
  for (long zk = 0; zk < nb / group; zk++) {
    long o = zk * rows * d, ko = zk * tk * d;
    float *a = att + zk * rows * tk;
    const float *kmz = km ? km + zk * group / heads * tk : NULL; /* the group's heads are one sample's */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, tk, d, scale, q + o, d, k + ko, d, 0.0f,
                a, tk);
    for (int i = 0; i < rows; i++) {
      float *r = a + (long)i * tk;
      /* causal, as PyTorch's is_causal (top-left): query i sees keys j <= i; the others get 0, as
       * do the keys km masks; a row with no key left is all 0 (PyTorch's sdpa from 2.5 on) */
      int iq = i % tq, end = causal && iq + 1 < tk ? iq + 1 : tk;
      if (kmz)
        for (int j = 0; j < end; j++) r[j] = kmz[j] == 0 ? -INFINITY : r[j];
      kf_safe_softmax_forward(r, r, 1, end); /* in place, vectorized */
      for (int j = end; j < tk; j++) r[j] = 0;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, tk, 1.0f, a, tk, v + ko, d, 0.0f,
                out + o, d);
  }
}

void k_sdpa_fast_backward(float *dq, float *dk, float *dv, const float *dout, const float *att,
                          const float *q, const float *k, const float *v, int nb, int tq, int tk, int d,
                          int group, float *scratch) {
  k_assert(nb >= 0 && tq > 0 && tk > 0 && d > 0 && group > 0 && nb % group == 0);
  float scale = 1.0f / sqrtf((float)d);
  int rows = group * tq;
  for (long zk = 0; zk < nb / group; zk++) {
    long o = zk * rows * d, ko = zk * tk * d;
    const float *a = att + zk * rows * tk, *g = dout + o;
    if (dv) /* dV = P^T dO, summed over the group's rows */
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, tk, d, rows, 1.0f, a, tk, g, d, 0.0f, dv + ko, d);
    if (!dq && !dk) continue;
    /* dP = dO V^T, then dS = P * (dP - rowsum(dP * P)) * scale; masked P = 0 gives dS = 0 */
    float *ds = scratch;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, tk, d, 1.0f, g, d, v + ko, d, 0.0f, ds, tk);
    for (int i = 0; i < rows; i++) {
      float *r = ds + (long)i * tk;
      const float *p = a + (long)i * tk;
      float dot = 0;
      for (int j = 0; j < tk; j++) dot += r[j] * p[j];
      for (int j = 0; j < tk; j++) r[j] = p[j] * (r[j] - dot) * scale;
    }
    if (dq) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, tk, 1.0f, ds, tk, k + ko, d, 0.0f, dq + o, d);
    if (dk) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, tk, d, rows, 1.0f, ds, tk, q + o, d, 0.0f, dk + ko, d);
  }
}
