/* lower.h: SPMD lowering (lower.c). From the training graph and the placements strat_pin gave
 * every node, the graph ONE rank runs: every value whose placement is S(d) on a mesh axis has its
 * local (shard) shape, and the reshards the placements imply are explicit collective nodes
 * (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, SHARD_SLICE in ops.def). The placements are
 * strat_pin's (StratPlan.pl and .cons), never recomputed, so the build and `cplanc plan
 * --explain` agree.
 *
 * The per-rank graph is the same on every rank of an axis group (SPMD); what differs per rank
 * (which shard, which vocabulary rows) is read at run time from the rank's coordinate on the
 * axis. Attributes the lowering sets for that:
 *   EMBEDDING with its table S(0) on axis a (vocab-parallel): ia[0] = a + 1; the rank looks up
 *     rows [r*V/n, (r+1)*V/n) of the global table and yields zeros for other indices (P).
 *   CROSS_ENTROPY with logits S(last) on axis a (vocab-parallel): ia[0] = a + 1; the rows' max
 *     and sum of exponentials are all-reduced inside the op, and each rank's result is its part
 *     of the loss (the parts sum to the loss: P).
 *   ARGMAX of its last dim with its input S(last) on axis a (vocab-parallel): ia[1] = a + 1 (ia[0]
 *     stays its axis); each rank's row maxima and their global indices are all-gathered inside the
 *     op and every rank picks the first maximum (R).
 *   SLICE along a split dim: start and end divided by the axis size (see blocks below); an error
 *     unless the value has the blocked layout (its split comes from params, lower.c blocked_source).
 *   SPLIT_HEADS whose heads are split: h divided by the axis size.
 *   MEAN over a dim a tp axis splits (P): its value and its gradient's multiplied by 1/n (a MUL by
 *     a CONST after each, lower.c tp_mean_share), so the ranks' parts sum to the global mean.
 *   RESHAPE: dims = the local shape.
 *
 * Blocked layouts (the fused QKV weight). strat_pin column-splits c_attn's weight [C, 3C]; its
 * consumer splits the product into q, k and v thirds. A contiguous column split would give rank 0
 * all of q and half of k. Instead each rank's shard of such a tensor is the concatenation of its
 * part of every third ("blocked" layout, Megatron's): shard column j of rank r is global column
 * (j / (3C/3n)) * C + r * (C/n) + j % (C/n). The slices then stay local ([s/n, e/n) of the shard)
 * and each rank holds whole heads of q, k and v. The block count of every param (1: contiguous)
 * is in Lowered.blocks; init, save and load map shard elements to global ones through it, so
 * checkpoints hold the ordinary (unpermuted) tensor.
 *
 * Partial sums on the dp axis. Each rank's loss is the mean over its own samples, so its
 * gradients would be dp times its share of the global mean's. The lowering divides the gradient
 * seed (Graph.seed, 1/accum) by dp instead: every P on the dp axis of the backward and the update
 * is then a true partial sum, and every reduction of it (in the graph, or the runtime's) sums;
 * a gradient whole (R) on dp is each rank's 1/dp share of it (a term only params read is seeded so),
 * so the graph's all-reduces and all-gathers of gradients on dp divide by dp, an R -> P keeps the
 * shares, and a slice of one into a ZeRO 2/3 accumulator (true sums) multiplies by dp.
 * The loss and metrics (P on dp too) are means of means, averaged by the runtime; so is any forward
 * P the graph all-reduces over dp (mean(h) + mean(g): the ranks' mean of mean(h), then mean(g) whole).
 * On tp, R -> P gives each rank 1/tp of the value (lower.c reshard).
 *
 * The loss and metrics on the tp axis. The runtime sums the tp ranks' values as the parts of one
 * (vocab-parallel cross_entropy's P); a loss or metric tp replicates (R) is reported as each rank's
 * 1/tp share (Lowered.loss_share and metric_share, which the emitters multiply it by; the gradients
 * are seeded apart).
 *
 * Gradient accumulators partial (P) on the dp axis get no collective node: the runtime sums them
 * over the dp group once per step, after all micro-batches, and the update reads them as
 * replicated. ZeRO 2 and 3 place the accumulators S(0) on dp instead (strategy.c): the reduce-
 * scatter is then in the graph, after each micro-batch's gradient, and each rank keeps its part.
 * ZeRO 1 and 2: the update runs on each rank's part (S(0) optimizer state) and an all-gather
 * writes the whole param back; ZeRO 3 keeps params S(0) and gathers them before each use. */
#ifndef CPLAN_LOWER_H
#define CPLAN_LOWER_H

#include "placement.h"

typedef struct Lowered {
  Graph *g;          /* the per-rank graph (params, inputs, metrics, grads, states mapped) */
  int *map;          /* per node of the global graph: its copy in g */
  int *blocks;       /* per node of the global graph: the blocked-layout count of its split dim on
                        the tp axis (1: contiguous; 3: fused q, k, v) */
  int ncolls;        /* collective nodes inserted */
  VEC(int) origin;   /* per node of g: the global node whose lowering made it (a collective: the
                        node that needs it) */
  bool *runtime_reduced; /* per node of the global graph: a gradient accumulator STATE the runtime
                        all-reduces over dp (the others are reduced in the graph, or not at all) */
  int nruntime;      /* reshards left to the runtime instead: the dp all-reduces of gradient
                        accumulators (runtime/train.c sums them over the dp group once per step,
                        after all micro-batches) */
  /* The factor each rank's loss and metrics (g's, as reported) are multiplied by for the runtime's
   * sum over the tp ranks (runtime/train.c reduce_means): 1 for a value whose ranks hold parts
   * (P, the vocab-parallel cross_entropy's), 1/n for one whole on each of the n ranks of a tp axis
   * (cross_entropy of whole logits, a metric of argmax). */
  double loss_share;
  double *metric_share;
} Lowered;

/* The per-rank graph of sp's training graph. NULL with a message in err when a placement has no
 * lowering yet (an internal limitation, not a user error). The result passes ir_verify. */
/* Blocked layouts on the tp axis (above), from its placements pl (NULL: no tp) and the
 * placements each node consumes its inputs at: blocks[i] for every node of g (1: contiguous). */
void lower_find_blocks(const Graph *g, const Pl *pl, Pl *const *cons, int *blocks);
/* A forward reader of a blocked value other than a slice taking one of its blocks or an op of
 * the same blocked chain (an elementwise op of the whole fused tensor, or its gather): it would
 * read the shard as if contiguous, so the lowering refuses it. Its index (*src the value), or -1. */
int lower_blocked_escape(const Graph *g, const Pl *pl, const int *blocks, int *src);
/* A forward slice of part of a dim tp splits (placements pl, inputs consumed as cons) whose input is
 * not in the blocked layout (a sequence-parallel activation, an input): each rank's part of it is not
 * the slice's, so the lowering refuses it. Its index, or -1. */
int lower_contiguous_slice(const Graph *g, const Pl *pl, Pl *const *cons);
/* Whether node i, split on the tp axis (placements pl, inputs consumed as cons) along a dim of
 * `size`, has the blocked layout a slice of it assumes (lower_find_blocks): it comes from params, whose
 * shards init, save and load lay out so, through ops split alike; not from a reshard into the split (a
 * contiguous part) or an input. */
bool lower_blocked_source(const Graph *g, const Pl *pl, Pl *const *cons, int i, int64_t size);
Lowered *lower_spmd(const StratPlan *sp, char *err, size_t errlen);

/* The global index (row-major, in the global shape) of element `local` of rank coordinate
 * coord[a] (per logical axis) of node i's shard. For params, states and their gradients. */
int64_t lower_global_index(const StratPlan *sp, const Lowered *lw, int i, const int64_t *coord,
                           int64_t local);

/* The shape of node i of sp's graph on one device: its global shape, split dims divided by their
 * axis's size. */
Shape lower_local_shape(const StratPlan *sp, int i);

#endif
