/* cg_common.h: what the CPU emitter (emit_c.c) and the CUDA emitter (emit_cu.c) share
 * (cg_common.c): C literals of strings, shapes and floats, paths, the CPLAN_FUSION switch, the
 * source line a comment quotes, the dropout stream key of a node; the views of the graph both
 * read (rows, reductions, GEMMs, vocab, FLOPs), the checks both make, and the text both programs
 * hold (IR comments, the learning rate schedule). Where values live: cg_plan.h. */
#ifndef CPLAN_CG_COMMON_H
#define CPLAN_CG_COMMON_H

#include "../compiler/fusion.h"
#include "../compiler/ir.h"
#include "../compiler/sema.h"

#include <stdio.h>

const char *cg_c_string(const char *s);                 /* a C string literal of s ("NULL" for NULL) */
const char *cg_shape_list(const Shape *s);              /* "{2, 3}" */
const char *cg_abs_path(const char *p);                 /* p made absolute (NULL stays NULL) */
int64_t cg_dims_prod(const Shape *s, int lo, int hi);   /* d[lo] * ... * d[hi-1] */
/* k copies of `rows` rows of `width` elements, copy r from src + r * src_step (rows src_pitch apart)
 * to dst + r * dst_step (rows dst_pitch apart). */
typedef struct CgBlocks {
  int64_t k, rows, width, src_pitch, dst_pitch, src_step, dst_step;
} CgBlocks;
/* ALL_TO_ALL node n of input x (S(d1) -> S(d2) on k ranks, ops.def): pack, x into the send buffer
 * as k blocks (block r: x's part r along d2, for rank r); unpack, the k received blocks (block r
 * from rank r: its part along d1) into n's value. */
void cg_all_to_all_blocks(const Node *n, const Node *x, CgBlocks *pack, CgBlocks *unpack);
const char *cg_flt(double v);                           /* a float literal, NAN and INFINITY included */
struct Lowered;
/* " * F" after a reported value of a lowered plan whose ranks of a tp axis each hold it whole (the
 * runtime sums the tp ranks' values: Lowered.loss_share, metric_share[k]; k < 0: the loss), else "". */
const char *cg_tp_share(const struct Lowered *lw, int k);
bool cg_fusion_enabled(void);                           /* CPLAN_FUSION != 0 */
Fusion *cg_no_fusion(const Graph *g);                   /* a fusion result with no groups */
const char *cg_src_line_text(Span sp);                  /* the source line of sp, for comments */
uint64_t cg_node_key(int i);                            /* the dropout stream of node i */

/* ---- reading the graph ---------------------------------------------------------------------- */
struct StratPlan;
int64_t cg_rows(const Node *n);                         /* all dims but the last: the [rows, n] view */
int64_t cg_last_dim(const Node *n);                     /* the last dim (1 for a scalar) */
/* A reduction over contiguous axes as [outer, len, inner]; false for other axis sets. */
bool cg_reduce_dims(const Node *n, const Shape *x, int64_t *outer, int64_t *len, int64_t *inner);
/* The dropout stream of dropout node i: a clone made by recompute.c (and its original) names the
 * original in ia[0] as index + 1, so both draw one mask. */
uint64_t cg_dropout_key(const Graph *g, int i);
/* Where dropout node n's elements lie in the step's whole tensor (its mask index, docs §9
 * Randomness): per dim, C expressions of the run (RtRun *run, cplan_plan) for its local size, its
 * whole size and this rank's offset in it, each a brace list. The batch dim (ia[1] - 1, main.c) is
 * the step's global batch, its offset this micro-batch's first sample; a dim tp splits (ia[2] - 1
 * on axis ia[3] - 1, of tn ranks: lower.c) is tn times the local one, its offset the rank's part. */
void cg_dropout_map(const Node *n, int64_t tn, const char **local, const char **whole, const char **off);
/* The GEMM view of matmul f: batches of an operand are the product of its dims but the last two
 * (a 1-D operand has none); the logical operands are [batch..., M, K] and [batch..., K, N]. */
typedef struct CgMm {
  int64_t nb, m, k, n;    /* batches, M, K, N */
  int64_t sa, sb, sc;     /* elements between the batches of a, b and the output (0: shared) */
} CgMm;
bool cg_mm_dims(const Graph *g, const Node *f, CgMm *mm); /* false: batch dims broadcast partially */
/* The value of optimizer scalar input n (lr, bc1, bc2) as a C expression of `run`; NULL for
 * another name. */
const char *cg_scalar_in(const OptimizerConf *o, const Node *n);
/* The range an embedding's indices or a cross_entropy's targets must lie in: `whole` (the table's
 * rows, the classes), or the valid ones of a table or head tp pads (ia[1], compiler/vocab_pad.c). */
int64_t cg_index_bound(const Node *n, int64_t whole);
/* The bound on token values: dim 0 of the embedding table that reads input 0, else the last dim
 * of the loss's logits; vocab-parallel ones times their axis's devices (sp: the lowering's). */
int64_t cg_vocab(const Graph *g, const struct StratPlan *sp);
double cg_step_flops(const Graph *g);                   /* the FLOPs of one step, update excluded */

/* ---- checks both backends make ----------------------------------------------------------------- */
/* tokens and adder data feed two i32 [B, T] inputs; notes: also name each input of the model */
bool cg_check_inputs(const Graph *g, const TrainConf *t, bool notes);
/* every tensor fits the kernels' 32-bit element counts ("cpu", "cuda") */
bool cg_check_sizes(const Graph *g, const char *backend);

/* ---- text both programs hold ------------------------------------------------------------------- */
char **cg_ir_lines(const Graph *g);                     /* the IR printer's line of each node */
/* the comment above node i's kernel call: its IR line and its .cplan line */
void cg_comment(FILE *out, const Graph *g, char *const *irline, int i);
void cg_emit_lr(FILE *out, const TrainConf *t);         /* lr_at: the schedule of docs/language.md §8 */
void cg_append(FILE *out, FILE *body);                  /* body's text after out's; closes body */

#endif
