/* fast_nn.h: fast f32 CPU twins of the reference kernels (ref.h) that generated plans call for
 * everything but GEMM and attention: normalization, softmax, loss, elementwise unary, reductions,
 * and the layout kernels (heads, slice, concat, transpose, embedding).
 *
 * Every `kf_x` here has EXACTLY the signature and semantics of the float `k_x` in ref.h (the
 * period-broadcast binary ops, which ref.h lacks, are checked against a per-element loop): same argument order, same
 * k_assert checks, backward kernels ACCUMULATE (+=) into their gradients, NULL means "not wanted".
 * So switching a call in plan.c from k_x to kf_x changes only speed and rounding.
 *
 * Accuracy: all math is in float with vectorizable loops (own exp/log/tanh polynomials, a few ulp;
 * row reductions in 16 float lanes; the large reductions of kf_sum/mean_forward in double).
 * tests/kernels/test_fast_nn.c checks every kernel against its reference on odd and typical sizes
 * with |fast - ref| <= 1e-5 * |ref| + 1e-6 * max|ref| (the second term covers outputs that cancel
 * to near zero, such as layer_norm's dx).
 * Checklist: a new kernel needs its prototype here, its body in fast_nn.c, a case in
 * tests/kernels/test_fast_nn.c and a line in bench/kernels_cpu.c. */
#ifndef CPLAN_KERNELS_FAST_NN_H
#define CPLAN_KERNELS_FAST_NN_H

#include "ref.h"

/* elementwise unary (all KUnary ops) */
void kf_unary_forward(KUnary op, float *out, const float *x, long n, float c);
void kf_unary_backward(KUnary op, float *dx, const float *dout, const float *x, const float *out,
                       long n, float c);

/* Elementwise binary op where each operand repeats with a period: out[i] = a[i % na] op
 * b[i % nb] for i < n. That is NumPy broadcasting whenever an operand's shape, without leading
 * 1s, is a suffix of the output shape (a bias [C] against [B, T, C], a scalar, equal shapes).
 * The backward ACCUMULATES into da (na values) and db (nb values), either may be NULL; a
 * vectorized loop for every op and period shape. */
void kf_binary_period_forward(KBinary op, float *out, const float *a, long na, const float *b,
                              long nb, long n);
void kf_binary_period_backward(KBinary op, float *da, long na, float *db, long nb,
                               const float *dout, const float *a, const float *b, long n);

/* reductions over the middle axis of [outer, n, inner] */
void kf_sum_forward(float *out, const float *x, int outer, int n, int inner);
void kf_sum_backward(float *dx, const float *dout, int outer, int n, int inner);
void kf_mean_forward(float *out, const float *x, int outer, int n, int inner);
void kf_mean_backward(float *dx, const float *dout, int outer, int n, int inner);

/* transpose x [nb, m, n] -> [nb, n, m] */
void kf_transpose_forward(float *out, const float *x, int nb, int m, int n);
void kf_transpose_backward(float *dx, const float *dout, int nb, int m, int n);

/* where(cond, a, b)'s backward, as ref.c's k_where_backward (da, db may be NULL; both += dout where
 * cond picks them, summed over the dims they broadcast along; rank at most 8), by rows of the output's
 * last dim with each operand's broadcast strides instead of an index computed per element */
void kf_where_backward(float *da, float *db, const float *dout, const int *oshape, int orank, const float *cond,
                       const int *cshape, int crank, const int *ashape, int arank, const int *bshape, int brank);

/* softmax / log_softmax over the last axis of [rows, n] */
void kf_softmax_forward(float *out, const float *x, int rows, int n);
/* a row whose max is -inf gives 0 (PyTorch's _safe_softmax); its backward is kf_softmax_backward */
void kf_safe_softmax_forward(float *out, const float *x, int rows, int n);
void kf_softmax_backward(float *dx, const float *dout, const float *out, int rows, int n);
void kf_log_softmax_forward(float *out, const float *x, int rows, int n);
void kf_log_softmax_backward(float *dx, const float *dout, const float *out, int rows, int n);

/* layer_norm / rms_norm over the last axis of [rows, c] */
void kf_layer_norm_forward(float *out, float *mean, float *rstd, const float *x, const float *w,
                           const float *b, int rows, int c, float eps);
void kf_layer_norm_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                            const float *w, const float *mean, const float *rstd, int rows, int c);
void kf_rms_norm_forward(float *out, float *rstd, const float *x, const float *w, int rows, int c,
                         float eps);
void kf_rms_norm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                          const float *rstd, int rows, int c);

/* cross_entropy of logits [rows, v] against i32 targets (-1 ignored) */
float kf_cross_entropy_forward(int *count, const float *logits, const int32_t *targets, int rows,
                               int v);
void kf_cross_entropy_backward(float *dlogits, float dloss, const float *logits,
                               const int32_t *targets, int rows, int v);

/* embedding: out [n, c] = table [v, c] rows at idx [n] */
void kf_embedding_forward(float *out, const float *table, const int32_t *idx, int n, int v, int c);
void kf_embedding_backward(float *dtable, const float *dout, const int32_t *idx, int n, int v,
                           int c);

/* [b, t, c] <-> [b, h, t, c/h] */
void kf_split_heads_forward(float *out, const float *x, int b, int t, int c, int h);
void kf_split_heads_backward(float *dx, const float *dout, int b, int t, int c, int h);
void kf_merge_heads_forward(float *out, const float *x, int b, int t, int c, int h);
void kf_merge_heads_backward(float *dx, const float *dout, int b, int t, int c, int h);

/* slice / concat along the middle axis of [outer, n, inner] */
void kf_slice_forward(float *out, const float *x, int outer, int n, int inner, int start, int end);
void kf_slice_backward(float *dx, const float *dout, int outer, int n, int inner, int start,
                       int end);
void kf_concat_forward(float *out, const float *const *xs, const int *ns, int count, int outer,
                       int inner);
void kf_concat_backward(float *const *dxs, const float *dout, const int *ns, int count, int outer,
                        int inner);
/* the forwards of slice and concat on 4-byte elements of any type (i32), bytes moved as they are
 * (the kf_ ones call them) */
void k32_slice_forward(void *out, const void *x, int outer, int n, int inner, int start, int end);
void k32_concat_forward(void *out, const void *const *xs, const int *ns, int count, int outer, int inner);

#endif
