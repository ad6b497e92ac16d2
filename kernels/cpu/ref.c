/* ref.c: the CPU reference kernels (see ref.h for the conventions).
 *
 * Written for obviousness, not speed: naive loops, one output element at a time, sums kept in
 * double even in the float build so the reference is at least as accurate as anything tested
 * against it. The file includes itself twice: the untyped part (below) defines the helpers that
 * do not depend on the element type, then instantiates the typed part for float (k_x) and for
 * double (k_x_f64), so both come from one body and cannot drift apart. */
#ifndef K_REAL /* ---- the untyped part ----------------------------------------------------- */
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Noreturn void k_panic(const char *file, int line, const char *what) {
  fprintf(stderr, "%s:%d: internal error in a kernel: assertion failed: %s\n", file, line, what);
  abort();
}

_Noreturn void k_data_error(const char *op, const char *what, long i, long value, long v) {
  fflush(stdout);
  int target = strcmp(what, "target") == 0;
  fprintf(stderr, "error: %s: %s %ld at position %ld of the micro-batch is out of range: it must be in [0, %ld)%s\n",
          op, what, value, i, v, target ? " or -1 (ignored)" : "");
  if (target && value < 0) /* PyTorch's ignored target is -100: cplan ignores -1 unless told */
    fprintf(stderr, "hint: to ignore the targets %ld, pass them to the loss: cross_entropy(logits, targets, "
                    "ignore_index = %ld)\n", value, value);
  exit(1);
}

const char *const k_unary_names[K_UNARY_COUNT] = {
    "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "silu", "square", "pow",
    "abs", "clamp_min", "clamp_max", "erf", "sin", "cos"};
const char *const k_binary_names[K_BINARY_COUNT] = {
    "add", "sub", "mul", "div", "maximum", "minimum", "mod", "floordiv", "eq", "ne", "lt", "le", "gt", "ge"};

long k_numel(const int *shape, int rank) {
  long n = 1;
  for (int i = 0; i < rank; i++) {
    k_assert(shape[i] >= 0);
    n *= shape[i];
  }
  return n;
}

int k_bcast_shape(int *out, const int *ashape, int arank, const int *bshape, int brank) {
  int rank = arank > brank ? arank : brank;
  k_assert(arank >= 0 && brank >= 0 && rank <= K_MAXDIM);
  /* right-align: a missing leading dim acts as 1 */
  for (int d = 0; d < rank; d++) {
    int ad = d - (rank - arank), bd = d - (rank - brank);
    int a = ad >= 0 ? ashape[ad] : 1, b = bd >= 0 ? bshape[bd] : 1;
    k_assert(a == b || a == 1 || b == 1);
    out[d] = a == 1 ? b : a;
  }
  return rank;
}

long k_bcast_index(long oi, const int *oshape, int orank, const int *ishape, int irank) {
  k_assert(irank <= orank);
  long ii = 0, stride = 1;
  /* peel output coordinates from the last dim; a size-1 input dim does not advance */
  for (int d = orank - 1, j = irank - 1; j >= 0; d--, j--) {
    long c = oi % oshape[d];
    oi /= oshape[d];
    k_assert(ishape[j] == oshape[d] || ishape[j] == 1);
    if (ishape[j] != 1) ii += c * stride;
    stride *= ishape[j];
  }
  return ii;
}

/* flat index into x of output element oi of permute(x, perm) */
static long permute_src(long oi, const int *shape, int rank, const int *perm) {
  long xstride[K_MAXDIM], xi = 0;
  xstride[rank - 1] = 1;
  for (int d = rank - 2; d >= 0; d--) xstride[d] = xstride[d + 1] * shape[d + 1];
  for (int d = rank - 1; d >= 0; d--) {
    int od = shape[perm[d]];
    xi += (oi % od) * xstride[perm[d]];
    oi /= od;
  }
  return xi;
}

static void check_perm(const int *shape, int rank, const int *perm) {
  int seen[K_MAXDIM] = {0};
  k_assert(rank >= 1 && rank <= K_MAXDIM);
  for (int d = 0; d < rank; d++) {
    k_assert(perm[d] >= 0 && perm[d] < rank && !seen[perm[d]]);
    seen[perm[d]] = 1;
  }
  (void)shape;
}

/* permute of 4-byte elements of any type, moved as bits: i32 tensors' transpose, permute and
 * split/merge heads (emit_c.c lowers each to a permute) */
void k32_permute_forward(void *out, const void *x, const int *shape, int rank, const int *perm) {
  check_perm(shape, rank, perm);
  uint32_t *o = out;
  const uint32_t *s = x;
  long n = k_numel(shape, rank);
  for (long i = 0; i < n; i++) o[i] = s[permute_src(i, shape, rank, perm)];
}

void k_arange_forward(int32_t *out, int n) {
  k_assert(n >= 0);
  for (int i = 0; i < n; i++) out[i] = i;
}

#define K_REAL float
#define K_NAME(n) n
#include "ref.c"
#undef K_REAL
#undef K_NAME
#define K_REAL double
#define K_NAME(n) n##_f64
#include "ref.c"
#undef K_REAL
#undef K_NAME

#else /* ---- the typed part, compiled once per element type ------------------------------ */

/* ---- elementwise unary ---------------------------------------------------------------------- */

#define GELU_S 0.7978845608028654 /* sqrt(2/pi) */
#define GELU_C 0.044715

static double K_NAME(unary_f)(KUnary op, double x, double c) {
  switch (op) {
  case K_NEG: return -x;
  case K_EXP: return exp(x);
  case K_LOG: return log(x);
  case K_SQRT: return sqrt(x);
  case K_RSQRT: return 1.0 / sqrt(x);
  case K_TANH: return tanh(x);
  case K_SIGMOID: return 1.0 / (1.0 + exp(-x));
  case K_RELU: return x > 0 ? x : 0.0;
  case K_GELU: return 0.5 * x * (1.0 + tanh(GELU_S * (x + GELU_C * x * x * x)));
  case K_SILU: return x / (1.0 + exp(-x));
  case K_SQUARE: return x * x;
  case K_POW: return pow(x, c);
  case K_ABS: return fabs(x);
  case K_CLAMP_MIN: return x < c ? c : x;
  case K_CLAMP_MAX: return x > c ? c : x;
  case K_ERF: return erf(x);
  case K_SIN: return sin(x);
  case K_COS: return cos(x);
  default: k_assert(!"bad KUnary");
  }
  return 0;
}

/* d f(x) / dx; y = f(x) is passed in because several derivatives are cheapest from it */
static double K_NAME(unary_df)(KUnary op, double x, double y, double c) {
  switch (op) {
  case K_NEG: return -1.0;
  case K_EXP: return y;
  case K_LOG: return 1.0 / x;
  case K_SQRT: return 0.5 / y;
  case K_RSQRT: return -0.5 * y / x;
  case K_TANH: return 1.0 - y * y;
  case K_SIGMOID: return y * (1.0 - y);
  case K_RELU: return x > 0 ? 1.0 : 0.0;
  case K_GELU: {
    double u = GELU_S * (x + GELU_C * x * x * x), th = tanh(u);
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * GELU_S * (1.0 + 3.0 * GELU_C * x * x);
  }
  case K_SILU: {
    double s = 1.0 / (1.0 + exp(-x));
    return s * (1.0 + x * (1.0 - s));
  }
  case K_SQUARE: return 2.0 * x;
  case K_POW: return c * pow(x, c - 1.0);
  /* PyTorch's: sign(x) (0 at 0); clamp passes the gradient inside the closed range */
  case K_ABS: return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
  case K_ERF: return 1.1283791670955126 * exp(-x * x); /* 2/sqrt(pi) e^(-x^2) */
  case K_SIN: return cos(x);
  case K_COS: return -sin(x);
  case K_CLAMP_MIN: return x >= c ? 1.0 : 0.0;
  case K_CLAMP_MAX: return x <= c ? 1.0 : 0.0;
  default: k_assert(!"bad KUnary");
  }
  return 0;
}

void K_NAME(k_unary_forward)(KUnary op, K_REAL *out, const K_REAL *x, long n, K_REAL c) {
  k_assert(op >= 0 && op < K_UNARY_COUNT && n >= 0);
  for (long i = 0; i < n; i++) out[i] = (K_REAL)K_NAME(unary_f)(op, x[i], c);
}

void K_NAME(k_unary_backward)(KUnary op, K_REAL *dx, const K_REAL *dout, const K_REAL *x,
                              const K_REAL *out, long n, K_REAL c) {
  k_assert(op >= 0 && op < K_UNARY_COUNT && n >= 0);
  for (long i = 0; i < n; i++) dx[i] += (K_REAL)(dout[i] * K_NAME(unary_df)(op, x[i], out[i], c));
}

/* ---- elementwise binary, broadcasting ------------------------------------------------------- */

static double K_NAME(binary_f)(KBinary op, double a, double b) {
  switch (op) {
  case K_ADD: return a + b;
  case K_SUB: return a - b;
  case K_MUL: return a * b;
  case K_DIV: return a / b;
  case K_MAXIMUM: return a > b ? a : b;
  case K_MINIMUM: return a < b ? a : b;
  case K_MOD: return k_mod_f(a, b);
  case K_FLOORDIV: return floor(a / b);
  case K_EQ: return a == b;
  case K_NE: return a != b;
  case K_LT: return a < b;
  case K_LE: return a <= b;
  case K_GT: return a > b;
  case K_GE: return a >= b;
  default: k_assert(!"bad KBinary");
  }
  return 0;
}

/* partial derivatives of op at (a, b): *pa = d/da, *pb = d/db */
static void K_NAME(binary_df)(KBinary op, double a, double b, double *pa, double *pb) {
  switch (op) {
  case K_ADD: *pa = 1, *pb = 1; break;
  case K_SUB: *pa = 1, *pb = -1; break;
  case K_MUL: *pa = b, *pb = a; break;
  case K_DIV: *pa = 1 / b, *pb = -a / (b * b); break;
  /* ties split the gradient evenly, as PyTorch's maximum/minimum do */
  case K_MAXIMUM: *pa = a > b ? 1 : a < b ? 0 : 0.5, *pb = 1 - *pa; break;
  case K_MINIMUM: *pa = a < b ? 1 : a > b ? 0 : 0.5, *pb = 1 - *pa; break;
  case K_MOD: *pa = 1, *pb = -floor(a / b); break; /* PyTorch's remainder */
  default: k_assert(!"KBinary without a gradient");
  }
}

void K_NAME(k_binary_forward)(KBinary op, K_REAL *out, const K_REAL *a, const int *ashape,
                              int arank, const K_REAL *b, const int *bshape, int brank) {
  int oshape[K_MAXDIM];
  int orank = k_bcast_shape(oshape, ashape, arank, bshape, brank);
  long n = k_numel(oshape, orank);
  for (long i = 0; i < n; i++) {
    long ia = k_bcast_index(i, oshape, orank, ashape, arank);
    long ib = k_bcast_index(i, oshape, orank, bshape, brank);
    out[i] = (K_REAL)K_NAME(binary_f)(op, a[ia], b[ib]);
  }
}

void K_NAME(k_binary_backward)(KBinary op, K_REAL *da, K_REAL *db, const K_REAL *dout,
                               const K_REAL *a, const int *ashape, int arank, const K_REAL *b,
                               const int *bshape, int brank) {
  k_assert(op >= 0 && op < K_BINARY_GRAD_END);
  int oshape[K_MAXDIM];
  int orank = k_bcast_shape(oshape, ashape, arank, bshape, brank);
  long n = k_numel(oshape, orank);
  /* += through the index map is the sum over the broadcast dims */
  for (long i = 0; i < n; i++) {
    long ia = k_bcast_index(i, oshape, orank, ashape, arank);
    long ib = k_bcast_index(i, oshape, orank, bshape, brank);
    double pa, pb;
    K_NAME(binary_df)(op, a[ia], b[ib], &pa, &pb);
    if (da) da[ia] += (K_REAL)(dout[i] * pa);
    if (db) db[ib] += (K_REAL)(dout[i] * pb);
  }
}

/* ---- where, broadcasting three operands ----------------------------------------------------- */

void K_NAME(k_where_forward)(K_REAL *out, const int *oshape, int orank, const K_REAL *cond, const int *cshape,
                             int crank, const K_REAL *a, const int *ashape, int arank, const K_REAL *b,
                             const int *bshape, int brank) {
  long n = k_numel(oshape, orank);
  for (long i = 0; i < n; i++) {
    long ic = k_bcast_index(i, oshape, orank, cshape, crank);
    out[i] = cond[ic] != 0 ? a[k_bcast_index(i, oshape, orank, ashape, arank)]
                           : b[k_bcast_index(i, oshape, orank, bshape, brank)];
  }
}

void K_NAME(k_where_backward)(K_REAL *da, K_REAL *db, const K_REAL *dout, const int *oshape, int orank,
                              const K_REAL *cond, const int *cshape, int crank, const int *ashape, int arank,
                              const int *bshape, int brank) {
  long n = k_numel(oshape, orank);
  /* += through the index map is the sum over the broadcast dims */
  for (long i = 0; i < n; i++) {
    int take_a = cond[k_bcast_index(i, oshape, orank, cshape, crank)] != 0;
    if (take_a && da) da[k_bcast_index(i, oshape, orank, ashape, arank)] += dout[i];
    if (!take_a && db) db[k_bcast_index(i, oshape, orank, bshape, brank)] += dout[i];
  }
}

/* ---- reductions over [outer, n, inner] ------------------------------------------------------ */

void K_NAME(k_sum_forward)(K_REAL *out, const K_REAL *x, int outer, int n, int inner) {
  k_assert(outer >= 0 && n >= 0 && inner >= 0);
  for (int o = 0; o < outer; o++)
    for (int i = 0; i < inner; i++) {
      double s = 0;
      for (int j = 0; j < n; j++) s += x[((long)o * n + j) * inner + i];
      out[(long)o * inner + i] = (K_REAL)s;
    }
}

void K_NAME(k_sum_backward)(K_REAL *dx, const K_REAL *dout, int outer, int n, int inner) {
  k_assert(outer >= 0 && n >= 0 && inner >= 0);
  for (int o = 0; o < outer; o++)
    for (int j = 0; j < n; j++)
      for (int i = 0; i < inner; i++) dx[((long)o * n + j) * inner + i] += dout[(long)o * inner + i];
}

void K_NAME(k_mean_forward)(K_REAL *out, const K_REAL *x, int outer, int n, int inner) {
  k_assert(n > 0);
  K_NAME(k_sum_forward)(out, x, outer, n, inner);
  for (long i = 0; i < (long)outer * inner; i++) out[i] /= (K_REAL)n;
}

void K_NAME(k_mean_backward)(K_REAL *dx, const K_REAL *dout, int outer, int n, int inner) {
  k_assert(outer >= 0 && n > 0 && inner >= 0);
  for (int o = 0; o < outer; o++)
    for (int j = 0; j < n; j++)
      for (int i = 0; i < inner; i++)
        dx[((long)o * n + j) * inner + i] += (K_REAL)(dout[(long)o * inner + i] / (double)n);
}

/* index j in [0, n) of the first maximum of x[o, :, i] */
static int K_NAME(argmax_at)(const K_REAL *x, int o, int n, int inner, int i) {
  int best = 0;
  for (int j = 1; j < n; j++)
    if (x[((long)o * n + j) * inner + i] > x[((long)o * n + best) * inner + i]) best = j;
  return best;
}

void K_NAME(k_max_forward)(K_REAL *out, const K_REAL *x, int outer, int n, int inner) {
  k_assert(outer >= 0 && n > 0 && inner >= 0);
  for (int o = 0; o < outer; o++)
    for (int i = 0; i < inner; i++)
      out[(long)o * inner + i] = x[((long)o * n + K_NAME(argmax_at)(x, o, n, inner, i)) * inner + i];
}

void K_NAME(k_max_backward)(K_REAL *dx, const K_REAL *dout, const K_REAL *x, int outer, int n,
                            int inner) {
  k_assert(outer >= 0 && n > 0 && inner >= 0);
  for (int o = 0; o < outer; o++)
    for (int i = 0; i < inner; i++) {
      int j = K_NAME(argmax_at)(x, o, n, inner, i);
      dx[((long)o * n + j) * inner + i] += dout[(long)o * inner + i];
    }
}

void K_NAME(k_argmax_forward)(int32_t *out, const K_REAL *x, int outer, int n, int inner) {
  k_assert(outer >= 0 && n > 0 && inner >= 0);
  for (int o = 0; o < outer; o++)
    for (int i = 0; i < inner; i++) out[(long)o * inner + i] = K_NAME(argmax_at)(x, o, n, inner, i);
}

void K_NAME(k_float_forward)(K_REAL *out, const int32_t *x, long n) {
  k_assert(n >= 0);
  for (long i = 0; i < n; i++) out[i] = (K_REAL)x[i];
}

/* ---- linear algebra ------------------------------------------------------------------------- */

void K_NAME(k_matmul_forward)(K_REAL *out, const K_REAL *a, const K_REAL *b, int nb, int m, int k,
                              int n, int b_batched) {
  k_assert(nb >= 0 && m >= 0 && k >= 0 && n >= 0);
  for (int z = 0; z < nb; z++) {
    const K_REAL *az = a + (long)z * m * k, *bz = b_batched ? b + (long)z * k * n : b;
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double s = 0;
        for (int p = 0; p < k; p++) s += (double)az[(long)i * k + p] * bz[(long)p * n + j];
        out[((long)z * m + i) * n + j] = (K_REAL)s;
      }
  }
}

void K_NAME(k_matmul_backward)(K_REAL *da, K_REAL *db, const K_REAL *dout, const K_REAL *a,
                               const K_REAL *b, int nb, int m, int k, int n, int b_batched) {
  k_assert(nb >= 0 && m >= 0 && k >= 0 && n >= 0);
  for (int z = 0; z < nb; z++) {
    const K_REAL *az = a + (long)z * m * k, *bz = b_batched ? b + (long)z * k * n : b;
    const K_REAL *gz = dout + (long)z * m * n;
    /* da = dout @ b^T */
    if (da)
      for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++) {
          double s = 0;
          for (int j = 0; j < n; j++) s += (double)gz[(long)i * n + j] * bz[(long)p * n + j];
          da[((long)z * m + i) * k + p] += (K_REAL)s;
        }
    /* db = a^T @ dout; a shared weight sums over the batch through += */
    if (db) {
      K_REAL *dbz = b_batched ? db + (long)z * k * n : db;
      for (int p = 0; p < k; p++)
        for (int j = 0; j < n; j++) {
          double s = 0;
          for (int i = 0; i < m; i++) s += (double)az[(long)i * k + p] * gz[(long)i * n + j];
          dbz[(long)p * n + j] += (K_REAL)s;
        }
    }
  }
}

void K_NAME(k_transpose_forward)(K_REAL *out, const K_REAL *x, int nb, int m, int n) {
  k_assert(nb >= 0 && m >= 0 && n >= 0);
  for (int z = 0; z < nb; z++)
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++)
        out[((long)z * n + j) * m + i] = x[((long)z * m + i) * n + j];
}

void K_NAME(k_transpose_backward)(K_REAL *dx, const K_REAL *dout, int nb, int m, int n) {
  k_assert(nb >= 0 && m >= 0 && n >= 0);
  for (int z = 0; z < nb; z++)
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++)
        dx[((long)z * m + i) * n + j] += dout[((long)z * n + j) * m + i];
}

void K_NAME(k_permute_forward)(K_REAL *out, const K_REAL *x, const int *shape, int rank,
                               const int *perm) {
  check_perm(shape, rank, perm);
  long n = k_numel(shape, rank);
  for (long i = 0; i < n; i++) out[i] = x[permute_src(i, shape, rank, perm)];
}

void K_NAME(k_permute_backward)(K_REAL *dx, const K_REAL *dout, const int *shape, int rank,
                                const int *perm) {
  check_perm(shape, rank, perm);
  long n = k_numel(shape, rank);
  for (long i = 0; i < n; i++) dx[permute_src(i, shape, rank, perm)] += dout[i];
}

/* ---- softmax -------------------------------------------------------------------------------- */

/* max and log(sum(exp(x - max))) of one row: the stable log-sum-exp is max + lse */
static void K_NAME(row_lse)(const K_REAL *x, int n, double *max, double *lse) {
  double m = x[0], s = 0;
  for (int j = 1; j < n; j++)
    if (x[j] > m) m = x[j];
  for (int j = 0; j < n; j++) s += exp(x[j] - m);
  *max = m;
  *lse = log(s);
}

/* softmax rows; safe: a row whose max is -inf (every score masked) gives 0, PyTorch's _safe_softmax */
static void K_NAME(softmax_rows)(K_REAL *out, const K_REAL *x, int rows, int n, int safe) {
  k_assert(rows >= 0 && n > 0);
  for (long r = 0; r < rows; r++) {
    double m, lse;
    K_NAME(row_lse)(x + r * n, n, &m, &lse);
    for (int j = 0; j < n; j++) out[r * n + j] = safe && m == -INFINITY ? 0 : (K_REAL)exp(x[r * n + j] - m - lse);
  }
}

void K_NAME(k_softmax_forward)(K_REAL *out, const K_REAL *x, int rows, int n) {
  K_NAME(softmax_rows)(out, x, rows, n, 0);
}

void K_NAME(k_safe_softmax_forward)(K_REAL *out, const K_REAL *x, int rows, int n) {
  K_NAME(softmax_rows)(out, x, rows, n, 1);
}

void K_NAME(k_softmax_backward)(K_REAL *dx, const K_REAL *dout, const K_REAL *out, int rows, int n) {
  k_assert(rows >= 0 && n > 0);
  /* dx = y * (dy - sum(dy * y)) */
  for (long r = 0; r < rows; r++) {
    const K_REAL *y = out + r * n, *dy = dout + r * n;
    double dot = 0;
    for (int j = 0; j < n; j++) dot += (double)dy[j] * y[j];
    for (int j = 0; j < n; j++) dx[r * n + j] += (K_REAL)(y[j] * (dy[j] - dot));
  }
}

void K_NAME(k_log_softmax_forward)(K_REAL *out, const K_REAL *x, int rows, int n) {
  k_assert(rows >= 0 && n > 0);
  for (long r = 0; r < rows; r++) {
    double m, lse;
    K_NAME(row_lse)(x + r * n, n, &m, &lse);
    for (int j = 0; j < n; j++) out[r * n + j] = (K_REAL)(x[r * n + j] - m - lse);
  }
}

void K_NAME(k_log_softmax_backward)(K_REAL *dx, const K_REAL *dout, const K_REAL *out, int rows,
                                    int n) {
  k_assert(rows >= 0 && n > 0);
  /* dx = dy - softmax * sum(dy), with softmax = exp(out) */
  for (long r = 0; r < rows; r++) {
    const K_REAL *y = out + r * n, *dy = dout + r * n;
    double s = 0;
    for (int j = 0; j < n; j++) s += dy[j];
    for (int j = 0; j < n; j++) dx[r * n + j] += (K_REAL)(dy[j] - exp(y[j]) * s);
  }
}

/* ---- normalization -------------------------------------------------------------------------- */

void K_NAME(k_layer_norm_forward)(K_REAL *out, K_REAL *mean, K_REAL *rstd, const K_REAL *x,
                                  const K_REAL *w, const K_REAL *b, int rows, int c, K_REAL eps) {
  k_assert(rows >= 0 && c > 0 && eps >= 0);
  for (long r = 0; r < rows; r++) {
    const K_REAL *xr = x + r * c;
    double m = 0, v = 0;
    for (int j = 0; j < c; j++) m += xr[j];
    m /= c;
    for (int j = 0; j < c; j++) v += (xr[j] - m) * (xr[j] - m);
    double s = 1.0 / sqrt(v / c + eps); /* biased variance, as PyTorch's layer_norm */
    for (int j = 0; j < c; j++) out[r * c + j] = (K_REAL)((xr[j] - m) * s * w[j] + b[j]);
    if (mean) mean[r] = (K_REAL)m;
    if (rstd) rstd[r] = (K_REAL)s;
  }
}

void K_NAME(k_layer_norm_backward)(K_REAL *dx, K_REAL *dw, K_REAL *db, const K_REAL *dout,
                                   const K_REAL *x, const K_REAL *w, const K_REAL *mean,
                                   const K_REAL *rstd, int rows, int c) {
  k_assert(rows >= 0 && c > 0);
  for (long r = 0; r < rows; r++) {
    const K_REAL *xr = x + r * c, *dy = dout + r * c;
    double m = mean[r], s = rstd[r], g_mean = 0, g_xhat_mean = 0;
    /* with g = w * dy and xhat = (x - m) * s: dx = s * (g - mean(g) - xhat * mean(g * xhat)) */
    for (int j = 0; j < c; j++) {
      double g = (double)w[j] * dy[j];
      g_mean += g;
      g_xhat_mean += g * (xr[j] - m) * s;
    }
    g_mean /= c;
    g_xhat_mean /= c;
    for (int j = 0; j < c; j++) {
      double xhat = (xr[j] - m) * s;
      if (dx) dx[r * c + j] += (K_REAL)(s * ((double)w[j] * dy[j] - g_mean - xhat * g_xhat_mean));
      if (dw) dw[j] += (K_REAL)(dy[j] * xhat);
      if (db) db[j] += dy[j];
    }
  }
}

void K_NAME(k_rms_norm_forward)(K_REAL *out, K_REAL *rstd, const K_REAL *x, const K_REAL *w,
                                int rows, int c, K_REAL eps) {
  k_assert(rows >= 0 && c > 0 && eps >= 0);
  for (long r = 0; r < rows; r++) {
    const K_REAL *xr = x + r * c;
    double ms = 0;
    for (int j = 0; j < c; j++) ms += (double)xr[j] * xr[j];
    double s = 1.0 / sqrt(ms / c + eps);
    for (int j = 0; j < c; j++) out[r * c + j] = (K_REAL)(xr[j] * s * w[j]);
    if (rstd) rstd[r] = (K_REAL)s;
  }
}

void K_NAME(k_rms_norm_backward)(K_REAL *dx, K_REAL *dw, const K_REAL *dout, const K_REAL *x,
                                 const K_REAL *w, const K_REAL *rstd, int rows, int c) {
  k_assert(rows >= 0 && c > 0);
  for (long r = 0; r < rows; r++) {
    const K_REAL *xr = x + r * c, *dy = dout + r * c;
    double s = rstd[r], g_xhat_mean = 0;
    /* as layer_norm without the mean terms: dx = s * (g - xhat * mean(g * xhat)) */
    for (int j = 0; j < c; j++) g_xhat_mean += (double)w[j] * dy[j] * xr[j] * s;
    g_xhat_mean /= c;
    for (int j = 0; j < c; j++) {
      double xhat = xr[j] * s;
      if (dx) dx[r * c + j] += (K_REAL)(s * ((double)w[j] * dy[j] - xhat * g_xhat_mean));
      if (dw) dw[j] += (K_REAL)(dy[j] * xhat);
    }
  }
}

/* ---- rope ----------------------------------------------------------------------------------- */

/* rotate every pair of src by sign * angle into dst (+= when acc); rope's backward is the
 * rotation by the opposite angle, so both directions share this loop */
static void K_NAME(rope_rotate)(K_REAL *dst, const K_REAL *src, int nb, int t, int d, double base,
                                double sign, int acc) {
  k_assert(nb >= 0 && t >= 0 && d > 0 && d % 2 == 0 && base > 0);
  for (int z = 0; z < nb; z++)
    for (int pos = 0; pos < t; pos++)
      for (int i = 0; i < d / 2; i++) {
        double ang = sign * pos * pow(base, -2.0 * i / d), cs = cos(ang), sn = sin(ang);
        long o = ((long)z * t + pos) * d + 2 * i;
        double x0 = src[o], x1 = src[o + 1];
        double y0 = x0 * cs - x1 * sn, y1 = x0 * sn + x1 * cs;
        dst[o] = (K_REAL)(acc ? dst[o] + y0 : y0);
        dst[o + 1] = (K_REAL)(acc ? dst[o + 1] + y1 : y1);
      }
}

void K_NAME(k_rope_forward)(K_REAL *out, const K_REAL *x, int nb, int t, int d, K_REAL base) {
  K_NAME(rope_rotate)(out, x, nb, t, d, base, 1.0, 0);
}

void K_NAME(k_rope_backward)(K_REAL *dx, const K_REAL *dout, int nb, int t, int d, K_REAL base) {
  K_NAME(rope_rotate)(dx, dout, nb, t, d, base, -1.0, 1);
}

/* ---- attention ------------------------------------------------------------------------------ */

void K_NAME(k_sdpa_forward)(K_REAL *out, K_REAL *att, const K_REAL *q, const K_REAL *k,
                            const K_REAL *v, int nb, int t, int d, int causal) {
  k_assert(nb >= 0 && t > 0 && d > 0);
  double scale = 1.0 / sqrt((double)d);
  for (long z = 0; z < nb; z++) {
    const K_REAL *qz = q + z * t * d, *kz = k + z * t * d, *vz = v + z * t * d;
    for (int i = 0; i < t; i++) {
      K_REAL *a = att + (z * t + i) * t;
      int nk = causal ? i + 1 : t; /* causal: keys after the query position are masked */
      double m = -INFINITY, s = 0;
      for (int j = 0; j < nk; j++) {
        double dot = 0;
        for (int c = 0; c < d; c++) dot += (double)qz[(long)i * d + c] * kz[(long)j * d + c];
        a[j] = (K_REAL)(dot * scale);
        if (a[j] > m) m = a[j];
      }
      for (int j = 0; j < nk; j++) s += exp(a[j] - m);
      for (int j = 0; j < t; j++) a[j] = j < nk ? (K_REAL)(exp(a[j] - m) / s) : 0;
      for (int c = 0; c < d; c++) {
        double o = 0;
        for (int j = 0; j < nk; j++) o += (double)a[j] * vz[(long)j * d + c];
        out[(z * t + i) * d + c] = (K_REAL)o;
      }
    }
  }
}

void K_NAME(k_sdpa_backward)(K_REAL *dq, K_REAL *dk, K_REAL *dv, const K_REAL *dout,
                             const K_REAL *att, const K_REAL *q, const K_REAL *k, const K_REAL *v,
                             int nb, int t, int d) {
  k_assert(nb >= 0 && t > 0 && d > 0);
  double scale = 1.0 / sqrt((double)d);
  /* masked entries have att = 0, so they get no gradient without knowing `causal` */
  for (long z = 0; z < nb; z++) {
    const K_REAL *qz = q + z * t * d, *kz = k + z * t * d, *vz = v + z * t * d;
    for (int i = 0; i < t; i++) {
      const K_REAL *a = att + (z * t + i) * t, *g = dout + (z * t + i) * d;
      double datt[t > 0 ? t : 1], dot = 0; /* VLA: t is a small test-sized dim in a reference */
      for (int j = 0; j < t; j++) {
        datt[j] = 0;
        for (int c = 0; c < d; c++) datt[j] += (double)g[c] * vz[(long)j * d + c];
        dot += datt[j] * a[j];
        if (dv)
          for (int c = 0; c < d; c++) dv[(z * t + j) * d + c] += (K_REAL)(a[j] * g[c]);
      }
      for (int j = 0; j < t; j++) {
        double ds = a[j] * (datt[j] - dot) * scale; /* softmax backward, then the scale */
        for (int c = 0; c < d; c++) {
          if (dq) dq[(z * t + i) * d + c] += (K_REAL)(ds * kz[(long)j * d + c]);
          if (dk) dk[(z * t + j) * d + c] += (K_REAL)(ds * qz[(long)i * d + c]);
        }
      }
    }
  }
}

/* ---- dropout -------------------------------------------------------------------------------- */

void K_NAME(k_dropout_forward)(K_REAL *out, const K_REAL *x, const uint8_t *keep, long n, K_REAL p) {
  k_assert(n >= 0 && p >= 0 && p < 1);
  double scale = 1.0 / (1.0 - p); /* inverted dropout: evaluation needs no rescaling */
  for (long i = 0; i < n; i++) out[i] = keep ? (K_REAL)(keep[i] ? x[i] * scale : 0) : x[i];
}

void K_NAME(k_dropout_backward)(K_REAL *dx, const K_REAL *dout, const uint8_t *keep, long n,
                                K_REAL p) {
  k_assert(n >= 0 && p >= 0 && p < 1);
  double scale = 1.0 / (1.0 - p);
  for (long i = 0; i < n; i++) dx[i] += keep ? (K_REAL)(keep[i] ? dout[i] * scale : 0) : dout[i];
}

/* ---- loss ----------------------------------------------------------------------------------- */

static int K_NAME(ce_count)(const int32_t *targets, int rows, int v) {
  int count = 0;
  for (int r = 0; r < rows; r++) {
    k_check_target(r, targets[r], v);
    count += targets[r] != -1;
  }
  return count;
}

K_REAL K_NAME(k_cross_entropy_forward)(int *count, const K_REAL *logits, const int32_t *targets,
                                       int rows, int v) {
  k_assert(rows >= 0 && v > 0);
  int cnt = K_NAME(ce_count)(targets, rows, v);
  double loss = 0;
  for (long r = 0; r < rows; r++) {
    if (targets[r] == -1) continue;
    double m, lse;
    K_NAME(row_lse)(logits + r * v, v, &m, &lse);
    loss += m + lse - logits[r * v + targets[r]];
  }
  if (count) *count = cnt;
  return (K_REAL)(cnt ? loss / cnt : 0.0);
}

void K_NAME(k_cross_entropy_backward)(K_REAL *dlogits, K_REAL dloss, const K_REAL *logits,
                                      const int32_t *targets, int rows, int v) {
  k_assert(rows >= 0 && v > 0);
  int cnt = K_NAME(ce_count)(targets, rows, v);
  for (long r = 0; r < rows; r++) {
    if (targets[r] == -1) continue; /* an ignored row gets no gradient at all */
    double m, lse, g = (double)dloss / cnt;
    K_NAME(row_lse)(logits + r * v, v, &m, &lse);
    for (int j = 0; j < v; j++) {
      double p = exp(logits[r * v + j] - m - lse);
      dlogits[r * v + j] += (K_REAL)(g * (p - (j == targets[r])));
    }
  }
}

/* ---- indexing ------------------------------------------------------------------------------- */

void K_NAME(k_embedding_forward)(K_REAL *out, const K_REAL *table, const int32_t *idx, int n,
                                 int v, int c) {
  k_assert(n >= 0 && v > 0 && c > 0);
  for (long i = 0; i < n; i++) {
    k_check_index("embedding", "index", i, idx[i], v);
    memcpy(out + i * c, table + (long)idx[i] * c, sizeof(K_REAL) * (size_t)c);
  }
}

void K_NAME(k_embedding_backward)(K_REAL *dtable, const K_REAL *dout, const int32_t *idx, int n,
                                  int v, int c) {
  k_assert(n >= 0 && v > 0 && c > 0);
  for (long i = 0; i < n; i++) { /* in index order: repeated rows sum the same way every run */
    k_check_index("embedding", "index", i, idx[i], v);
    for (int j = 0; j < c; j++) dtable[(long)idx[i] * c + j] += dout[i * c + j];
  }
}

/* ---- head layout ---------------------------------------------------------------------------- */

/* flat index of element (bb, hh, tt, j) in the [b, t, c] layout, channel = hh * (c/h) + j */
static long K_NAME(btc_index)(int bb, int hh, int tt, int j, int t, int c, int h) {
  return ((long)bb * t + tt) * c + (long)hh * (c / h) + j;
}

/* the one loop behind all four head kernels: move between [b,t,c] and [b,h,t,c/h] */
static void K_NAME(heads_copy)(K_REAL *dst, const K_REAL *src, int b, int t, int c, int h,
                               int to_heads, int acc) {
  k_assert(b >= 0 && t >= 0 && h > 0 && c % h == 0);
  int dh = c / h;
  for (int bb = 0; bb < b; bb++)
    for (int hh = 0; hh < h; hh++)
      for (int tt = 0; tt < t; tt++)
        for (int j = 0; j < dh; j++) {
          long hi = (((long)bb * h + hh) * t + tt) * dh + j;
          long ci = K_NAME(btc_index)(bb, hh, tt, j, t, c, h);
          long di = to_heads ? hi : ci, si = to_heads ? ci : hi;
          dst[di] = acc ? dst[di] + src[si] : src[si];
        }
}

void K_NAME(k_split_heads_forward)(K_REAL *out, const K_REAL *x, int b, int t, int c, int h) {
  K_NAME(heads_copy)(out, x, b, t, c, h, 1, 0);
}

void K_NAME(k_split_heads_backward)(K_REAL *dx, const K_REAL *dout, int b, int t, int c, int h) {
  K_NAME(heads_copy)(dx, dout, b, t, c, h, 0, 1);
}

void K_NAME(k_merge_heads_forward)(K_REAL *out, const K_REAL *x, int b, int t, int c, int h) {
  K_NAME(heads_copy)(out, x, b, t, c, h, 0, 0);
}

void K_NAME(k_merge_heads_backward)(K_REAL *dx, const K_REAL *dout, int b, int t, int c, int h) {
  K_NAME(heads_copy)(dx, dout, b, t, c, h, 1, 1);
}

/* ---- slice and concat ----------------------------------------------------------------------- */

void K_NAME(k_slice_forward)(K_REAL *out, const K_REAL *x, int outer, int n, int inner, int start,
                             int end) {
  k_assert(outer >= 0 && inner >= 0 && 0 <= start && start <= end && end <= n);
  int m = end - start;
  for (long o = 0; o < outer; o++)
    for (int j = 0; j < m; j++)
      for (int i = 0; i < inner; i++)
        out[(o * m + j) * inner + i] = x[(o * n + start + j) * inner + i];
}

void K_NAME(k_slice_backward)(K_REAL *dx, const K_REAL *dout, int outer, int n, int inner,
                              int start, int end) {
  k_assert(outer >= 0 && inner >= 0 && 0 <= start && start <= end && end <= n);
  int m = end - start;
  for (long o = 0; o < outer; o++)
    for (int j = 0; j < m; j++)
      for (int i = 0; i < inner; i++)
        dx[(o * n + start + j) * inner + i] += dout[(o * m + j) * inner + i];
}

static int K_NAME(concat_total)(const int *ns, int count) {
  int total = 0;
  k_assert(count >= 1);
  for (int q = 0; q < count; q++) {
    k_assert(ns[q] >= 0);
    total += ns[q];
  }
  return total;
}

void K_NAME(k_concat_forward)(K_REAL *out, const K_REAL *const *xs, const int *ns, int count,
                              int outer, int inner) {
  int total = K_NAME(concat_total)(ns, count);
  for (int q = 0, off = 0; q < count; off += ns[q], q++)
    for (long o = 0; o < outer; o++)
      for (int j = 0; j < ns[q]; j++)
        for (int i = 0; i < inner; i++)
          out[(o * total + off + j) * inner + i] = xs[q][(o * ns[q] + j) * inner + i];
}

void K_NAME(k_concat_backward)(K_REAL *const *dxs, const K_REAL *dout, const int *ns, int count,
                               int outer, int inner) {
  int total = K_NAME(concat_total)(ns, count);
  for (int q = 0, off = 0; q < count; off += ns[q], q++)
    if (dxs[q])
      for (long o = 0; o < outer; o++)
        for (int j = 0; j < ns[q]; j++)
          for (int i = 0; i < inner; i++)
            dxs[q][(o * ns[q] + j) * inner + i] += dout[(o * total + off + j) * inner + i];
}

#endif
