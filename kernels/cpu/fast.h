/* fast.h: f32 CPU kernels that generated plans call where the reference (ref.h) is too slow.
 *
 * Same conventions as ref.h (contiguous row-major data, explicit int shapes, k_assert on bad
 * arguments) with one difference: kernels here WRITE their outputs unless the name or comment
 * says they accumulate, so callers need no memset before them.
 * Every kernel here is checked against its ref.h twin in tests/e2e/test_fast_kernels.c.
 * Checklist: a new kernel needs its prototype here, its body in fast.c and a comparison test. */
#ifndef CPLAN_KERNELS_FAST_H
#define CPLAN_KERNELS_FAST_H

#include "ref.h"

/* Batched GEMM through OpenBLAS: for each i < nb, C_i = beta*C_i + op(A_i) @ op(B_i), where
 * op(A_i) is m x k (stored k x m when ta), op(B_i) is k x n (stored n x k when tb), and
 * A_i = a + i*sa, B_i = b + i*sb, C_i = c + i*sc. A stride of 0 shares the operand; sc == 0
 * sums every batch into one C (beta applies once). Batches that are contiguous are folded into
 * one sgemm call. */
void k_gemm(float *c, const float *a, const float *b, int nb, int m, int n, int k, int ta, int tb,
            long sa, long sb, long sc, float beta);

/* (The period-broadcast binary ops, out[i] = a[i % na] op b[i % nb], are kf_binary_period_* in
 * fast_nn.h.) */

/* Elementwise binary op on i32 operands with NumPy broadcasting; comparisons write f32 1.0/0.0
 * into out (float *), arithmetic writes i32 (int32_t *). Division truncates toward zero. */
void k_binary_i32_forward(KBinary op, void *out, const int32_t *a, const int *ashape, int arank,
                          const int32_t *b, const int *bshape, int brank);

/* where(cond, a, b) of two i32 branches (k_where_forward's broadcasting): the elements are copied
 * whole, so every i32 value is exact. */
void k_where_i32_forward(int32_t *out, const int *oshape, int orank, const float *cond, const int *cshape, int crank,
                         const int32_t *a, const int *ashape, int arank, const int32_t *b, const int *bshape,
                         int brank);

/* dst[i] += x[i]: gradient accumulation. */
void k_accum(float *dst, const float *x, long n);

/* sdpa on q [nb, tq, d] and k, v [nb / group, tk, d] with the probabilities saved in att
 * [nb, tq, tk], as k_sdpa_forward (which takes tq = tk), with the two products done by sgemm.
 * causal is PyTorch's is_causal, top-left: query i sees keys j <= i. group > 1 is grouped-query
 * attention: query batch-head z reads key/value batch-head z / group (nb = batch * heads, heads =
 * kv heads * group), as k_sdpa_forward on k and v with each head repeated group times in a row.
 * km [nb / heads, tk] or NULL: a key mask, batch-head z seeing key j only where km[z / heads, j] != 0
 * (its probability 0); a query with no key left gets out = 0 and a row of 0 probabilities. */
void k_sdpa_fast_forward(float *out, float *att, const float *q, const float *k, const float *v,
                         const float *km, int nb, int tq, int tk, int d, int causal, int group, int heads);
/* Its backward; WRITES dq, dk, dv (any may be NULL; dk and dv [nb / group, tk, d], each summed over
 * its group's query heads); scratch holds group*tq*tk floats. */
void k_sdpa_fast_backward(float *dq, float *dk, float *dv, const float *dout, const float *att,
                          const float *q, const float *k, const float *v, int nb, int tq, int tk, int d,
                          int group, float *scratch);

#endif
