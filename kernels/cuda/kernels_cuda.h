/* kernels_cuda.h: the C interface of libcplankernels_cuda, the hand-written CUDA kernels
 * (DESIGN.md §2, issue 6). One .cu file per op family; each kernel has a launcher here.
 *
 * Conventions, shared by every launcher:
 *  - the stream is the last argument; the launcher checks its shapes and arguments, launches,
 *    and checks the launch (cudaGetLastError). It returns 0, or -1 with a message that
 *    cplan_cuda_error() returns (per thread) naming the launcher and what is wrong. Nothing is
 *    printed and nothing exits: the caller decides.
 *  - data is contiguous, row-major, in device memory, with the semantics of the CPU reference
 *    of kernels/cpu/ref.h (or ref_extra.h) named next to each launcher; a backward kernel
 *    ACCUMULATES (+=) into its gradients, as there.
 *  - activations are stored in `dt` (f32, bf16 or f16; the fused AdamW and global norm take f32
 *    or bf16); arithmetic is f32. Per-row statistics (mean,
 *    rstd, logsumexp) and parameter gradients of norms and embeddings are always f32.
 *  - every kernel is deterministic: the same inputs give the same bits on every run (no
 *    floating-point atomics).
 * Checklist: a new kernel needs its launcher here, its CPU reference in kernels/cpu, its
 * `extern "C" __global__` entries (tests/cuda/test_nvrtc.c finds them), and a row in
 * tests/gpu/test_kernels.c. */
#ifndef CPLAN_KERNELS_CUDA_H
#define CPLAN_KERNELS_CUDA_H

#include "attn_layout.h"

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum CplanDtype { CPLAN_F32 = 0, CPLAN_BF16 = 1, CPLAN_F16 = 2 } CplanDtype;

/* The message of this thread's last failed launcher ("" when none failed). */
const char *cplan_cuda_error(void);
const char *cplan_dtype_name(CplanDtype dt);

/* ---- layernorm.cu: k_layer_norm_*, k_rms_norm_* -------------------------------------------- */
/* x, out [rows, c]; w, b [c] (dt); mean, rstd [rows] f32 (either may be NULL) */
int cplan_cuda_layernorm_forward(CplanDtype dt, void *out, float *mean, float *rstd, const void *x,
                                 const void *w, const void *b, int rows, int c, float eps,
                                 cudaStream_t stream);
/* dx += (dt), dw += , db += (f32 [c]); any of the three may be NULL */
int cplan_cuda_layernorm_backward(CplanDtype dt, void *dx, float *dw, float *db, const void *dout,
                                  const void *x, const void *w, const float *mean, const float *rstd,
                                  int rows, int c, cudaStream_t stream);
int cplan_cuda_rmsnorm_forward(CplanDtype dt, void *out, float *rstd, const void *x, const void *w,
                               int rows, int c, float eps, cudaStream_t stream);
/* _res: the norm of x = a + res, with x written to xsum (llm.c's fused residual; x rounded to dt as
 * a separate add would store it) */
int cplan_cuda_layernorm_forward_res(CplanDtype dt, void *out, void *xsum, float *mean, float *rstd,
                                     const void *a, const void *res, const void *w, const void *b, int rows,
                                     int c, float eps, cudaStream_t stream);
int cplan_cuda_rmsnorm_forward_res(CplanDtype dt, void *out, void *xsum, float *rstd, const void *a,
                                   const void *res, const void *w, int rows, int c, float eps,
                                   cudaStream_t stream);
int cplan_cuda_rmsnorm_backward(CplanDtype dt, void *dx, float *dw, const void *dout, const void *x,
                                const void *w, const float *rstd, int rows, int c, cudaStream_t stream);
/* The same backwards with dw (db) in two passes over a device workspace `work` of at least
 * cplan_cuda_norm_backward_work(rows, c) floats (a function of rows and c only; overwritten, no
 * need to clear it): the rows are cut into up to 128 chunks, enough for ~2048 blocks, each
 * block writing one chunk's f32 partial sums of a column tile, then each column's partials are
 * added in chunk order and accumulated into dw (db). Deterministic; a different sum order than
 * the launchers above (f32 results differ by rounding). Less workspace (or a NULL work when dw
 * or db is wanted) is refused. dx as above when accumulate_dx is 1; with 0 it is written (=), its old
 * values never read (no zeroing first). */
size_t cplan_cuda_norm_backward_work(int rows, int c);
int cplan_cuda_layernorm_backward_ws(CplanDtype dt, void *dx, float *dw, float *db, const void *dout,
                                     const void *x, const void *w, const float *mean, const float *rstd,
                                     int rows, int c, int accumulate_dx, float *work, size_t work_floats,
                                     cudaStream_t stream);
int cplan_cuda_rmsnorm_backward_ws(CplanDtype dt, void *dx, float *dw, const void *dout, const void *x,
                                   const void *w, const float *rstd, int rows, int c, int accumulate_dx,
                                   float *work, size_t work_floats, cudaStream_t stream);

/* ---- softmax.cu: k_softmax_* over the last axis of [rows, n] --------------------------------- */
int cplan_cuda_softmax_forward(CplanDtype dt, void *out, const void *x, int rows, int n,
                               cudaStream_t stream);
/* k_safe_softmax_forward: a row whose max is -inf gives 0 (PyTorch's _safe_softmax) */
int cplan_cuda_safe_softmax_forward(CplanDtype dt, void *out, const void *x, int rows, int n,
                                    cudaStream_t stream);
/* dx += out * (dout - sum(dout * out)) */
int cplan_cuda_softmax_backward(CplanDtype dt, void *dx, const void *dout, const void *out, int rows,
                                int n, cudaStream_t stream);

/* ---- attention.cu: k_sdpa_* without the [t, t] matrix ----------------------------------------
 * q, k, v, out [nb, t, d] (nb = batch * heads), d <= 256. The forward saves lse [nb, t] (f32,
 * the logsumexp of each query's scaled scores); the backward recomputes the probabilities from
 * it, tile by tile, and needs delta [nb, t] (f32 scratch, overwritten). */
int cplan_cuda_attention_forward(CplanDtype dt, void *out, float *lse, const void *q, const void *k,
                                 const void *v, int nb, int t, int d, int causal, cudaStream_t stream);
int cplan_cuda_attention_backward(CplanDtype dt, void *dq, void *dk, void *dv, float *delta,
                                  const void *dout, const void *out, const float *lse, const void *q,
                                  const void *k, const void *v, int nb, int t, int d, int causal,
                                  cudaStream_t stream);
/* accumulate 0: dq, dk and dv are written (=), their old values never read (no zeroing first);
 * 1: cplan_cuda_attention_backward's += */
int cplan_cuda_attention_backward_ex(CplanDtype dt, void *dq, void *dk, void *dv, float *delta,
                                     const void *dout, const void *out, const float *lse, const void *q,
                                     const void *k, const void *v, int nb, int t, int d, int causal,
                                     int accumulate, cudaStream_t stream);
/* the same on tensors in place in larger ones (attn_layout.h), with grouped-query attention and
 * cross attention (tq queries, tk keys and values): q and dq laid out as lq, out and dout as lout,
 * [nb, tq, d] (nb query batch-heads); k, v, dk and dv as lkv, [nb / group, tk, d]: group (>= 1) query
 * heads share each kv head, query batch-head z reads kv batch-head z / group (lkv.heads * group ==
 * lq.heads; group 1: ordinary attention). GPT-2's fused qkv projection and merged heads are read and
 * written in place, with no permute, and GQA's k and v are never repeated; dk and dv sum the group's
 * query heads in the kernel (deterministic). lse and delta are [nb, tq]. tq, tk >= 1; causal with
 * tq != tk is PyTorch's is_causal (top-left aligned): query i sees keys j <= i (from i >= tk on, all
 * of them), so keys j >= tq get zero dk and dv. */
int cplan_cuda_attention_forward_l(CplanDtype dt, void *out, float *lse, const void *q, const void *k,
                                   const void *v, int nb, int tq, int tk, int d, int causal, int group,
                                   CplanAttnLayout lq, CplanAttnLayout lkv, CplanAttnLayout lout,
                                   cudaStream_t stream);
int cplan_cuda_attention_backward_l(CplanDtype dt, void *dq, void *dk, void *dv, float *delta,
                                    const void *dout, const void *out, const float *lse, const void *q,
                                    const void *k, const void *v, int nb, int tq, int tk, int d, int causal,
                                    int accumulate, int group, CplanAttnLayout lq, CplanAttnLayout lkv,
                                    CplanAttnLayout lout, cudaStream_t stream);
/* the same with a key-padding mask (BERT's attention_mask, PyTorch's key_padding_mask): km [batch, tk] in
 * q's dtype, batch = nb / lq.heads, query batch-head z = b * lq.heads + hh seeing key j only where
 * km[b * tk + j] != 0 (and, causal, j <= i); NULL: every key, as the _l launchers. A masked key gets
 * zero dk and dv. bf16 and f16 run on mma.sync with a mask, whatever CPLAN_ATTENTION says. A query row
 * that no key takes part in gets out = 0 and dq = 0 (lse -inf), as PyTorch's sdpa from 2.5 on. */
int cplan_cuda_attention_forward_m(CplanDtype dt, void *out, float *lse, const void *q, const void *k,
                                   const void *v, const void *km, int nb, int tq, int tk, int d, int causal,
                                   int group, CplanAttnLayout lq, CplanAttnLayout lkv, CplanAttnLayout lout,
                                   cudaStream_t stream);
int cplan_cuda_attention_backward_m(CplanDtype dt, void *dq, void *dk, void *dv, float *delta,
                                    const void *dout, const void *out, const float *lse, const void *q,
                                    const void *k, const void *v, const void *km, int nb, int tq, int tk, int d,
                                    int causal, int accumulate, int group, CplanAttnLayout lq,
                                    CplanAttnLayout lkv, CplanAttnLayout lout, cudaStream_t stream);

/* ---- activations.cu: k_unary_* K_GELU (tanh form) and K_SILU over n elements ------------------ */
int cplan_cuda_gelu_forward(CplanDtype dt, void *out, const void *x, int64_t n, cudaStream_t stream);
int cplan_cuda_gelu_backward(CplanDtype dt, void *dx, const void *dout, const void *x, int64_t n,
                             cudaStream_t stream);
int cplan_cuda_silu_forward(CplanDtype dt, void *out, const void *x, int64_t n, cudaStream_t stream);
int cplan_cuda_silu_backward(CplanDtype dt, void *dx, const void *dout, const void *x, int64_t n,
                             cudaStream_t stream);

/* ---- cross_entropy.cu: k_cross_entropy_* (softmax never stored) -------------------------------
 * logits [rows, v] (dt), targets [rows] i32, -1 ignored. The forward writes per-row losses and
 * lse [rows] (f32), then *loss = their mean over the counted rows (0 when none) and *count (all
 * device pointers). A target outside [-1, v) gives a NaN loss for its row (so the run stops as
 * diverged rather than reading out of bounds). The backward adds (*dloss / *count) (softmax -
 * onehot) to dlogits, reading lse instead of recomputing the row reductions. */
int cplan_cuda_cross_entropy_forward(CplanDtype dt, float *losses, float *lse, float *loss, int *count,
                                     const void *logits, const int32_t *targets, int rows, int v,
                                     cudaStream_t stream);
int cplan_cuda_cross_entropy_backward(CplanDtype dt, void *dlogits, const float *dloss,
                                      const int *count, const void *logits, const float *lse,
                                      const int32_t *targets, int rows, int v, cudaStream_t stream);
/* _ld: logits and dlogits rows ld >= v elements apart (a row pitch: padded rows, never read or
 * written); accumulate 0: dlogits is written (=), zeros on ignored rows, its old values never read */
int cplan_cuda_cross_entropy_forward_ld(CplanDtype dt, float *losses, float *lse, float *loss, int *count,
                                        const void *logits, const int32_t *targets, int rows, int v, int ld,
                                        cudaStream_t stream);
int cplan_cuda_cross_entropy_backward_ld(CplanDtype dt, void *dlogits, const float *dloss,
                                         const int *count, const void *logits, const float *lse,
                                         const int32_t *targets, int rows, int v, int ld, int accumulate,
                                         cudaStream_t stream);
/* the forward, and the backward written (accumulate 0) over the logits themselves, in one pass (the
 * logits are read once; llm.c's fused classifier): *dloss must be known at the forward */
int cplan_cuda_cross_entropy_fused_ld(CplanDtype dt, float *losses, float *lse, float *loss, int *count,
                                      void *logits, const int32_t *targets, const float *dloss, int rows,
                                      int v, int ld, cudaStream_t stream);
/* *out = *in * w (device f32 scalars; out may be in; in NULL: *out = w): a loss or its gradient times
 * the cross_entropy's weight over the step's targets (docs/language.md, Batches), or that weight */
int cplan_cuda_cross_entropy_scale(float *out, const float *in, float w, cudaStream_t stream);

/* ---- embedding.cu: k_embedding_* ---------------------------------------------------------------
 * out [n, c] = table [v, c] rows at idx [n] (an index outside [0, v) gives a NaN row). The
 * backward adds to dtable (f32) in index order, as the reference: deterministic, and bit for
 * bit the reference's f32 sums. */
int cplan_cuda_embedding_forward(CplanDtype dt, void *out, const void *table, const int32_t *idx, int n,
                                 int v, int c, cudaStream_t stream);
int cplan_cuda_embedding_backward(CplanDtype dt, float *dtable, const void *dout, const int32_t *idx,
                                  int n, int v, int c, cudaStream_t stream);

/* ---- vocab_parallel.cu (and embedding.cu: vp_embedding_*): kvp_* (kernels/cpu/vocab_parallel.h), tp --
 * This rank holds vocabulary rows [v0, v0 + vl) (v0 >= 0, vl > 0) of which those below v are valid
 * (a table tp pads holds rows past v: compiler/vocab_pad.c); the plan
 * runs the collectives between the kernels as vocab_parallel.h says. table, out, dout, logits,
 * dlogits are dt; m, s [rows], gathered [n, rows], loss, dloss are f32 and count an int, all in
 * device memory. Embedding: out [n, c] is this rank's part (0 for another rank's rows, a NaN row
 * for an index outside [0, v), as embedding.cu; the CPU reference asserts instead); the backward
 * adds into this rank's f32 dtable [vl, c] in index order, bit for bit the reference's sums, and
 * skips indices outside [v0, v0 + vl). Cross entropy: m = this rank's row max, then the max over
 * the n all-gathered ones, s = this rank's sum of exp(l - m) (all-reduce it); the forward part
 * writes *loss (its f64 sum over the rows in a fixed order, / the count) and *count (count may be
 * NULL); a target outside [-1, v) makes *loss NaN. The backward adds (*dloss / *count)
 * (softmax - onehot) to this rank's columns (none when *count is 0); it is given the count the
 * forward part wrote, as the reference counts the same rows. Argmax of the last dim: pair [2, rows]
 * (f32) = this rank's row maxima and their global indices (as floats, so v0 + vl <= 2^24); the
 * plan all-gathers it into gathered [n, 2, rows] and combine writes out [rows] (i32), the first
 * maximum's global index, the same on every rank. */
int cplan_cuda_vp_embedding_forward(CplanDtype dt, void *out, const void *table, const int32_t *idx, int n, int v0,
                                    int vl, int v, int c, cudaStream_t stream);
int cplan_cuda_vp_embedding_backward(CplanDtype dt, float *dtable, const void *dout, const int32_t *idx, int n,
                                     int v0, int vl, int v, int c, cudaStream_t stream);
int cplan_cuda_vp_ce_row_max(CplanDtype dt, float *m, const void *logits, int rows, int vl, cudaStream_t stream);
int cplan_cuda_vp_ce_max_combine(float *m, const float *gathered, int rows, int n, cudaStream_t stream);
int cplan_cuda_vp_ce_row_sumexp(CplanDtype dt, float *s, const void *logits, const float *m, int rows, int vl,
                                cudaStream_t stream);
int cplan_cuda_vp_ce_forward_part(CplanDtype dt, float *loss, int *count, const void *logits, const float *m,
                                  const float *s, const int32_t *targets, int rows, int vl, int v0, int v, int lead,
                                  cudaStream_t stream);
int cplan_cuda_vp_argmax_local(CplanDtype dt, float *pair, const void *logits, int rows, int vl, int v0,
                               cudaStream_t stream);
int cplan_cuda_vp_argmax_combine(int32_t *out, const float *gathered, int rows, int n, cudaStream_t stream);
int cplan_cuda_vp_ce_backward(CplanDtype dt, void *dlogits, const float *dloss, const int *count, const void *logits,
                              const float *m, const float *s, const int32_t *targets, int rows, int vl, int v0, int v,
                              cudaStream_t stream);

/* ---- rope.cu: k_rope_* on [nb, t, d], d even ------------------------------------------------ */
int cplan_cuda_rope_forward(CplanDtype dt, void *out, const void *x, int nb, int t, int d, float base,
                            cudaStream_t stream);
int cplan_cuda_rope_backward(CplanDtype dt, void *dx, const void *dout, int nb, int t, int d, float base,
                             cudaStream_t stream);

/* ---- adamw.cu: k_adamw_update (ref_extra.h), fused and multi-tensor ----------------------------
 * The formula of compiler/optimizer.c (torch.optim.AdamW) on f32 master weights `param` and f32
 * moments m, v; the gradient (f32 or bf16) is multiplied by *grad_scale first when grad_scale
 * is not NULL (clipping, loss-scale unscaling: a device scalar, so no host sync). When
 * param_lp is not NULL it receives the updated weights rounded to bf16 (what the bf16 forward
 * reads). bc1 = 1 - beta1^t, bc2 = 1 - beta2^t. */
typedef struct CplanAdamwTensor {
  float *param;       /* [n] f32 master weights */
  void *param_lp;     /* [n] bf16 copy, or NULL */
  const void *grad;   /* [n] in grad_dt */
  CplanDtype grad_dt;
  float *m, *v;       /* [n] f32 moments */
  int64_t n;
  float weight_decay; /* 0 for vectors (optimizer.c: decay only for rank >= 2) */
} CplanAdamwTensor;

typedef struct CplanAdamwHyper {
  float lr, beta1, beta2, eps, bc1, bc2;
} CplanAdamwHyper;

int cplan_cuda_adamw(const CplanAdamwTensor *t, const CplanAdamwHyper *h, const float *grad_scale,
                     cudaStream_t stream);
/* count tensors in ceil(count / 32) launches */
int cplan_cuda_adamw_multi(const CplanAdamwTensor *ts, int count, const CplanAdamwHyper *h,
                           const float *grad_scale, cudaStream_t stream);

/* ---- global_norm.cu: k_global_norm (ref_extra.h) ------------------------------------------------
 * *norm = sqrt(sum over the tensors of sum(x^2)), summed in f64 in a fixed order; when
 * clip_scale is not NULL it gets min(1, clip / (norm + 1e-6)) (1 when clip <= 0), the factor
 * optimizer.c applies, ready for cplan_cuda_adamw's grad_scale. work: device scratch of
 * cplan_cuda_global_norm_work(...) doubles. */
typedef struct CplanNormTensor {
  const void *x;
  CplanDtype dt;
  int64_t n;
} CplanNormTensor;

size_t cplan_cuda_global_norm_work(const CplanNormTensor *ts, int count);
int cplan_cuda_global_norm(float *norm, float *clip_scale, const CplanNormTensor *ts, int count,
                           float clip, double *work, size_t work_len, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
