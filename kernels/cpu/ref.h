/* ref.h: the CPU reference kernels, forward and backward, for every op of compiler/ops.def.
 *
 * These are the plain, obviously-correct versions that every fast kernel (CPU or CUDA) is tested
 * against, and that the first CPU training path calls. Conventions, shared by all kernels:
 *  - data is contiguous and row-major; shapes are explicit int arguments;
 *  - reductions and axis ops see a tensor as [outer, n, inner] (n = the axis);
 *  - a backward kernel ACCUMULATES (+=) into its input gradients, because autodiff sums the
 *    gradients of every use of a value; a NULL gradient pointer means "not wanted";
 *  - a bad argument (shape mismatch, index out of range) is a bug in the caller: k_assert
 *    names the file and line and aborts, as cp_assert does in the compiler.
 *
 * Every typed kernel exists twice, from one source: `k_x` on float (what plans run) and `k_x_f64`
 * on double (what the gradient checks in tests/kernels/test_kernels_grad.c run, so that central
 * differences are precise). This header declares both by including itself once per type with
 * K_REAL/K_NAME defined; ref.c defines both the same way.
 * Checklist: a new kernel needs its prototype here, its body in ref.c, and a gradient check. */
#ifndef K_REAL /* ---- the untyped part, seen once ---------------------------------------- */
#ifndef CPLAN_KERNELS_REF_H
#define CPLAN_KERNELS_REF_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

_Noreturn void k_panic(const char *file, int line, const char *what);
#define k_assert(c) ((c) ? (void)0 : k_panic(__FILE__, __LINE__, #c))
/* Bad data, not a bug (a class index or token id out of range, as PyTorch's IndexError): prints
 * "error: OP: WHAT" and exits 1. */
_Noreturn void k_data_error(const char *op, const char *what, long i, long value, long v);
#define k_check_index(op, what, i, value, v)                                                          \
  ((value) >= 0 && (value) < (v) ? (void)0 : k_data_error(op, what, (long)(i), (long)(value), (long)(v)))
#define k_check_target(i, value, v) ((value) == -1 ? (void)0 : k_check_index("cross_entropy", "target", i, value, v))

#define K_MAXDIM 8 /* the highest rank the broadcast and permute kernels accept */

/* Python's % and // (PyTorch's remainder and floor_divide), the one definition every CPU kernel
 * uses: the remainder takes the divisor's sign, the quotient rounds toward -inf. Of i32 a zero
 * divisor gives 0 (PyTorch raises) and INT32_MIN // -1 wraps to INT32_MIN, as PyTorch's. */
static inline double k_mod_f(double a, double b) {
  double r = fmod(a, b);
  return r != 0 && (r < 0) != (b < 0) ? r + b : r;
}
static inline int32_t k_floordiv_i(int32_t a, int32_t b) {
  if (b == 0) return 0;
  if (b == -1) return (int32_t)(0u - (uint32_t)a);
  int32_t q = a / b;
  return a % b != 0 && (a < 0) != (b < 0) ? q - 1 : q;
}
static inline int32_t k_mod_i(int32_t a, int32_t b) {
  if (b == 0 || b == -1) return 0;
  int32_t r = a % b;
  return r != 0 && (r < 0) != (b < 0) ? r + b : r;
}

/* Elementwise unary ops; pow takes its exponent as the kernel's `c` argument, clamp_min and
 * clamp_max their bound (x < c ? c : x and x > c ? c : x: a NaN stays NaN, as in PyTorch).
 * Checklist: the order is ops.def's (OP_NEG ..), emit_c.c's unary_k and emit_cu_support.h's cps_un. */
typedef enum {
  K_NEG, K_EXP, K_LOG, K_SQRT, K_RSQRT, K_TANH, K_SIGMOID, K_RELU, K_GELU, K_SILU, K_SQUARE, K_POW,
  K_ABS, K_CLAMP_MIN, K_CLAMP_MAX, K_ERF, K_SIN, K_COS,
  K_UNARY_COUNT
} KUnary;

/* Elementwise binary ops with NumPy broadcasting, in ops.def's order (ADD to GE). floordiv and the
 * comparisons have no backward (OPF_NOGRAD in ops.def); K_BINARY_GRAD_END marks where they start.
 * The comparisons give 1.0/0.0 (a float even of i32 operands). mod and floordiv are Python's. */
typedef enum {
  K_ADD, K_SUB, K_MUL, K_DIV, K_MAXIMUM, K_MINIMUM, K_MOD,
  K_BINARY_GRAD_END,
  K_FLOORDIV = K_BINARY_GRAD_END, K_EQ, K_NE, K_LT, K_LE, K_GT, K_GE,
  K_BINARY_COUNT
} KBinary;

extern const char *const k_unary_names[K_UNARY_COUNT];
extern const char *const k_binary_names[K_BINARY_COUNT];

/* Broadcasting. Shapes are right-aligned as in NumPy. k_bcast_shape writes the result shape into
 * out (rank max(arank, brank), returned) and asserts the shapes are compatible. k_bcast_index maps
 * a flat index of the output to the flat index of an input of shape ishape. */
int k_bcast_shape(int *out, const int *ashape, int arank, const int *bshape, int brank);
long k_bcast_index(long oi, const int *oshape, int orank, const int *ishape, int irank);
long k_numel(const int *shape, int rank);

void k_arange_forward(int32_t *out, int n);
/* permute (k_permute_forward) of 4-byte elements of any type (i32), moved as bits, never through
 * float arithmetic */
void k32_permute_forward(void *out, const void *x, const int *shape, int rank, const int *perm);

#define K_REAL float
#define K_NAME(n) n
#include "ref.h"
#undef K_REAL
#undef K_NAME
#define K_REAL double
#define K_NAME(n) n##_f64
#include "ref.h"
#undef K_REAL
#undef K_NAME

#endif /* CPLAN_KERNELS_REF_H */
#else /* ---- the typed part, seen once for float and once for double --------------------- */

/* elementwise unary: out[i] = f(x[i]); backward gets both x and out (some derivatives use out). */
void K_NAME(k_unary_forward)(KUnary op, K_REAL *out, const K_REAL *x, long n, K_REAL c);
void K_NAME(k_unary_backward)(KUnary op, K_REAL *dx, const K_REAL *dout, const K_REAL *x,
                              const K_REAL *out, long n, K_REAL c);

/* elementwise binary with broadcasting; out has the k_bcast_shape of a and b. Backward sums over
 * the broadcast dims (by accumulating); maximum/minimum split the gradient evenly on ties, as
 * PyTorch does. */
void K_NAME(k_binary_forward)(KBinary op, K_REAL *out, const K_REAL *a, const int *ashape,
                              int arank, const K_REAL *b, const int *bshape, int brank);
void K_NAME(k_binary_backward)(KBinary op, K_REAL *da, K_REAL *db, const K_REAL *dout,
                               const K_REAL *a, const int *ashape, int arank, const K_REAL *b,
                               const int *bshape, int brank);

/* where(cond, a, b): out[i] = cond != 0 ? a : b, the three broadcast together (out has the
 * broadcast shape of all three, rank orank). Backward: da += dout where cond != 0, db += dout
 * elsewhere, each summed over the dims it broadcasts along; cond gets no gradient. */
void K_NAME(k_where_forward)(K_REAL *out, const int *oshape, int orank, const K_REAL *cond, const int *cshape,
                             int crank, const K_REAL *a, const int *ashape, int arank, const K_REAL *b,
                             const int *bshape, int brank);
void K_NAME(k_where_backward)(K_REAL *da, K_REAL *db, const K_REAL *dout, const int *oshape, int orank,
                              const K_REAL *cond, const int *cshape, int crank, const int *ashape, int arank,
                              const int *bshape, int brank);

/* reductions over the middle axis of x [outer, n, inner] -> out [outer, inner] */
void K_NAME(k_sum_forward)(K_REAL *out, const K_REAL *x, int outer, int n, int inner);
void K_NAME(k_sum_backward)(K_REAL *dx, const K_REAL *dout, int outer, int n, int inner);
void K_NAME(k_mean_forward)(K_REAL *out, const K_REAL *x, int outer, int n, int inner);
void K_NAME(k_mean_backward)(K_REAL *dx, const K_REAL *dout, int outer, int n, int inner);
void K_NAME(k_max_forward)(K_REAL *out, const K_REAL *x, int outer, int n, int inner);
/* the gradient goes to the first maximum, as torch.max(x, dim) does */
void K_NAME(k_max_backward)(K_REAL *dx, const K_REAL *dout, const K_REAL *x, int outer, int n,
                            int inner);
/* argmax over the middle axis (no gradient); the first maximum wins */
void K_NAME(k_argmax_forward)(int32_t *out, const K_REAL *x, int outer, int n, int inner);
/* float(x): out[i] = x[i] converted (i32 -> float, exact below 2^24 in f32); no gradient */
void K_NAME(k_float_forward)(K_REAL *out, const int32_t *x, long n);

/* out [nb, m, n] = a [nb, m, k] @ b, where b is [nb, k, n], or [k, n] shared by every batch
 * when b_batched is 0 (a weight); then db sums over the batch. */
void K_NAME(k_matmul_forward)(K_REAL *out, const K_REAL *a, const K_REAL *b, int nb, int m, int k,
                              int n, int b_batched);
void K_NAME(k_matmul_backward)(K_REAL *da, K_REAL *db, const K_REAL *dout, const K_REAL *a,
                               const K_REAL *b, int nb, int m, int k, int n, int b_batched);

/* x [nb, m, n] -> out [nb, n, m] */
void K_NAME(k_transpose_forward)(K_REAL *out, const K_REAL *x, int nb, int m, int n);
void K_NAME(k_transpose_backward)(K_REAL *dx, const K_REAL *dout, int nb, int m, int n);
/* out dim i is x dim perm[i]; shape is x's shape */
void K_NAME(k_permute_forward)(K_REAL *out, const K_REAL *x, const int *shape, int rank,
                               const int *perm);
void K_NAME(k_permute_backward)(K_REAL *dx, const K_REAL *dout, const int *shape, int rank,
                                const int *perm);

/* softmax / log_softmax over the last axis of x [rows, n] */
void K_NAME(k_softmax_forward)(K_REAL *out, const K_REAL *x, int rows, int n);
/* PyTorch's _safe_softmax: a row of -inf gives 0 (not NaN); its backward is k_softmax_backward */
void K_NAME(k_safe_softmax_forward)(K_REAL *out, const K_REAL *x, int rows, int n);
void K_NAME(k_softmax_backward)(K_REAL *dx, const K_REAL *dout, const K_REAL *out, int rows, int n);
void K_NAME(k_log_softmax_forward)(K_REAL *out, const K_REAL *x, int rows, int n);
void K_NAME(k_log_softmax_backward)(K_REAL *dx, const K_REAL *dout, const K_REAL *out, int rows,
                                    int n);

/* layer_norm over the last axis of x [rows, c] with the biased variance; saves mean and rstd
 * [rows] for the backward (either may be NULL in the forward when no backward follows). */
void K_NAME(k_layer_norm_forward)(K_REAL *out, K_REAL *mean, K_REAL *rstd, const K_REAL *x,
                                  const K_REAL *w, const K_REAL *b, int rows, int c, K_REAL eps);
void K_NAME(k_layer_norm_backward)(K_REAL *dx, K_REAL *dw, K_REAL *db, const K_REAL *dout,
                                   const K_REAL *x, const K_REAL *w, const K_REAL *mean,
                                   const K_REAL *rstd, int rows, int c);
/* rms_norm: out = x / sqrt(mean(x^2) + eps) * w; saves rstd [rows] (may be NULL) */
void K_NAME(k_rms_norm_forward)(K_REAL *out, K_REAL *rstd, const K_REAL *x, const K_REAL *w,
                                int rows, int c, K_REAL eps);
void K_NAME(k_rms_norm_backward)(K_REAL *dx, K_REAL *dw, const K_REAL *dout, const K_REAL *x,
                                 const K_REAL *w, const K_REAL *rstd, int rows, int c);

/* rope on x [nb, t, d] (nb = all leading dims): pairs (x[2i], x[2i+1]) rotate by
 * pos * base^(-2i/d), pos = the index along t. d must be even. */
void K_NAME(k_rope_forward)(K_REAL *out, const K_REAL *x, int nb, int t, int d, K_REAL base);
void K_NAME(k_rope_backward)(K_REAL *dx, const K_REAL *dout, int nb, int t, int d, K_REAL base);

/* sdpa on q, k, v [nb, t, d] (nb = B*h): out = softmax(q k^T / sqrt(d), masked if causal) v.
 * att [nb, t, t] saves the probabilities (masked entries 0) for the backward. */
void K_NAME(k_sdpa_forward)(K_REAL *out, K_REAL *att, const K_REAL *q, const K_REAL *k,
                            const K_REAL *v, int nb, int t, int d, int causal);
void K_NAME(k_sdpa_backward)(K_REAL *dq, K_REAL *dk, K_REAL *dv, const K_REAL *dout,
                             const K_REAL *att, const K_REAL *q, const K_REAL *k, const K_REAL *v,
                             int nb, int t, int d);

/* dropout: out = x * keep / (1 - p) where keep[i] is 0 or 1; a NULL keep mask is the identity
 * (evaluation). The mask itself comes from the counter-based generator, outside the kernel. */
void K_NAME(k_dropout_forward)(K_REAL *out, const K_REAL *x, const uint8_t *keep, long n, K_REAL p);
void K_NAME(k_dropout_backward)(K_REAL *dx, const K_REAL *dout, const uint8_t *keep, long n,
                                K_REAL p);

/* cross_entropy of logits [rows, v] against i32 targets [rows]; -1 is ignored. Returns the mean
 * of -log softmax(logits)[target] over the counted rows (0 when none count) and, when count is
 * not NULL, the number counted, so callers can sum over micro-batches and divide once. Backward
 * adds dloss * (softmax - onehot) / count to dlogits. */
K_REAL K_NAME(k_cross_entropy_forward)(int *count, const K_REAL *logits, const int32_t *targets,
                                       int rows, int v);
void K_NAME(k_cross_entropy_backward)(K_REAL *dlogits, K_REAL dloss, const K_REAL *logits,
                                      const int32_t *targets, int rows, int v);

/* embedding: out [n, c] = table [v, c] rows at idx [n]; the backward scatter-adds in index order,
 * so repeated indices sum deterministically. */
void K_NAME(k_embedding_forward)(K_REAL *out, const K_REAL *table, const int32_t *idx, int n,
                                 int v, int c);
void K_NAME(k_embedding_backward)(K_REAL *dtable, const K_REAL *dout, const int32_t *idx, int n,
                                  int v, int c);

/* split_heads: x [b, t, c] -> out [b, h, t, c/h] with channel = head*(c/h) + j; merge_heads is the
 * inverse. Each backward is the other's forward, accumulated. */
void K_NAME(k_split_heads_forward)(K_REAL *out, const K_REAL *x, int b, int t, int c, int h);
void K_NAME(k_split_heads_backward)(K_REAL *dx, const K_REAL *dout, int b, int t, int c, int h);
void K_NAME(k_merge_heads_forward)(K_REAL *out, const K_REAL *x, int b, int t, int c, int h);
void K_NAME(k_merge_heads_backward)(K_REAL *dx, const K_REAL *dout, int b, int t, int c, int h);

/* slice x [outer, n, inner] along the middle axis to [start, end) */
void K_NAME(k_slice_forward)(K_REAL *out, const K_REAL *x, int outer, int n, int inner, int start,
                             int end);
void K_NAME(k_slice_backward)(K_REAL *dx, const K_REAL *dout, int outer, int n, int inner,
                              int start, int end);
/* concat count tensors xs[i] [outer, ns[i], inner] along the middle axis; dxs[i] may be NULL */
void K_NAME(k_concat_forward)(K_REAL *out, const K_REAL *const *xs, const int *ns, int count,
                              int outer, int inner);
void K_NAME(k_concat_backward)(K_REAL *const *dxs, const K_REAL *dout, const int *ns, int count,
                               int outer, int inner);

#endif
