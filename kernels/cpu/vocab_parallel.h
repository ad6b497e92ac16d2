/* vocab_parallel.h: f32 kernels of the vocab-parallel embedding, cross_entropy and argmax (tensor
 * parallelism, compiler/lower.h: EMBEDDING / CROSS_ENTROPY with ia[0] = axis + 1, ARGMAX with
 * ia[1] = axis + 1).
 *
 * A rank holds vocabulary rows [v0, v0 + vl) of the global vocabulary (lower.h: rank r of n
 * holds [r*V/n, (r+1)*V/n)); indices and targets must lie below v, the valid rows (V, or fewer
 * when tp pads the table: compiler/vocab_pad.c, the rows past v are padding). The kernels never communicate: they compute a rank's part, and the
 * caller (the generated plan) exchanges what the comments say over the axis group with rt_comm.
 * Only SUM all-reduce and all-gather are needed, since rt_comm has no MAX reduction.
 *
 * Cross entropy forward, per rank (rows = the batch rows, every rank has all rows and targets):
 *   kvp_ce_row_max(m_local)            -> all_gather m_local into g [n, rows]
 *   kvp_ce_max_combine(m, g)           -> m = the global row max, the same on every rank
 *   kvp_ce_row_sumexp(s, m)            -> all_reduce (sum) s: the global sum of exp(l - m)
 *   kvp_ce_forward_part(m, s)          -> this rank's part of the loss; the parts sum to the
 *                                         loss of k_cross_entropy_forward on the whole logits.
 * Backward: kvp_ce_backward with the same m and s gives this rank's columns of the gradient of
 * the (summed) loss, so the loss's seed gradient is dloss on every rank.
 *
 * Argmax over the last dim, per rank (every rank has all rows):
 *   kvp_argmax_local(pair)             -> all_gather pair [2 * rows] into g [n, 2 * rows]
 *   kvp_argmax_combine(out, g)         -> out = k_argmax_forward's indices on the whole logits,
 *                                         the same on every rank (R).
 * The first maximum wins, as k_argmax_forward: ranks hold increasing index ranges, so among the
 * ranks whose maximum is the global one the lowest rank holds the lowest index. NaN is exact too:
 * a NaN never beats an earlier value, except a NaN at global index 0, which wins (the scan starts
 * there). Indices travel as floats, exact below 2^24 (the emitters refuse larger vocabularies).
 * Checked against ref.h on split inputs in tests/kernels/test_vocab_parallel.c. */
#ifndef CPLAN_KERNELS_VOCAB_PARALLEL_H
#define CPLAN_KERNELS_VOCAB_PARALLEL_H

#include <stdint.h>

/* out [n, c] = the global table's rows at idx [n], where table holds rows [v0, v0 + vl) of a
 * [v, c] table: rows outside the range are 0 (the axis's all-reduce then sums the parts). */
void kvp_embedding_forward(float *out, const float *table, const int32_t *idx, int n, int v0,
                           int vl, int v, int c);
/* dtable (this rank's [vl, c] rows) += dout rows whose idx is in range, in index order as the
 * reference does, so repeated indices sum the same way. dout is the whole (replicated) gradient. */
void kvp_embedding_backward(float *dtable, const float *dout, const int32_t *idx, int n, int v0,
                            int vl, int v, int c);

/* m[r] = max of this rank's logits row r (logits [rows, vl]). */
void kvp_ce_row_max(float *m, const float *logits, int rows, int vl);
/* m[r] = max over k < n of gathered[k * rows + r] (the all-gathered local maxima). */
void kvp_ce_max_combine(float *m, const float *gathered, int rows, int n);
/* s[r] = sum over this rank's columns of exp(logits[r, j] - m[r]); all-reduce (sum) it. */
void kvp_ce_row_sumexp(float *s, const float *logits, const float *m, int rows, int vl);
/* This rank's part of the mean cross entropy over the counted rows (targets -1 are ignored;
 * targets are global indices < v): minus its in-range target logits, plus, on the lead rank only
 * (coordinate 0), every counted row's m + log s; divided by the count (written to *count when not
 * NULL). The parts of the n ranks sum to the loss. */
float kvp_ce_forward_part(int *count, const float *logits, const float *m, const float *s,
                          const int32_t *targets, int rows, int vl, int v0, int v, int lead);
/* dlogits [rows, vl] += dloss * (softmax - onehot) / count on this rank's columns, from the
 * global m and s of the forward. Ignored rows get no gradient. */
void kvp_ce_backward(float *dlogits, float dloss, const float *logits, const float *m,
                     const float *s, const int32_t *targets, int rows, int vl, int v0, int v);

/* pair[r] = the maximum of this rank's logits row r ([rows, vl], columns [v0, v0 + vl) of the
 * vocabulary) and pair[rows + r] = the global index of its first occurrence, as a float; NaNs are
 * skipped (a row of NaNs gives -inf at v0) except at global index 0, which gives (NaN, 0). */
void kvp_argmax_local(float *pair, const float *logits, int rows, int vl, int v0);
/* out[r] = the global index of the row's first maximum, from the all-gathered pairs gathered
 * [n, 2 * rows] of the n ranks in rank order. */
void kvp_argmax_combine(int32_t *out, const float *gathered, int rows, int n);

#endif
