/* pipeline.h: pipeline parallelism (pipeline.c). The per-rank graph of the SPMD lowering
 * (lower.h) is cut into pp stage graphs, one per pipeline stage, along the stages strat_pin gave
 * the forward layers (contiguous layers; the nodes before the first layer on stage 0, those after
 * the last on the last stage).
 *
 * Which stage computes what:
 *   - a forward node: its layer's stage (StratPlan.stage);
 *   - a GRAD: its forward node's stage; a sum of gradient contributions (ADD): the lowest stage
 *     of its inputs (gradients flow towards stage 0);
 *   - a param is owned by the first stage that reads it; its gradient accumulator, its optimizer
 *     state and its update live there (ACCUM and ASSIGN: the owner's stage);
 *   - the rest of the update: the stage of the params it serves when that is one stage, except
 *     the global gradient norm. Each stage sums the squares of the gradients it owns (its part:
 *     PipeStage.norm_part, computed first, by RtPlan.grad_sumsq); the runtime adds the parts of the
 *     rank's stages and all-reduces the sum over the pp group; each stage's update then reads the
 *     sum as the SCALAR_IN "grad_sumsq" (RtRun.grad_sumsq) and computes the norm and the clipping
 *     factor itself. So no value crosses stages in the update, and a rank may run several stages
 *     (the interleaved schedule) without waiting on itself.
 * Leaves (params, inputs, constants, states) are copied into every stage that reads them. A param
 * read by several stages (GPT's tied embedding: stage 0 and the last) is held by each, updated by
 * its owner, and the runtime sends the updated value from the owner to the other holders after
 * each update. Their gradient contributions reach the owner once a step, as Megatron's embedding
 * group all-reduces the tied gradient once a step: a holder accumulates its contribution over the
 * micro-batches into an accumulator of its own (the owner's gradient state, copied: PipeStage.
 * part_to names the owner), and the runtime adds it into the owner's after the micro-batches,
 * before the gradient norm and the dp reduction (RtPlan.state_part_to). A contribution that
 * cannot be deferred so (read by another node, or summed after a collective) crosses with its
 * micro-batch like any other value.
 *
 * A value one stage computes and another reads crosses once: PP_SEND after the producer, PP_RECV
 * before the first reader (ops.def), in the phase of the reader (a forward value the other stage
 * reads only in its backward is sent in the backward, so evaluation, which runs the forward only,
 * never leaves a message unread). Each crossing has its own tag. Sends do not wait; receives do,
 * so a schedule whose dependencies are acyclic (1F1B, GPipe, Megatron's interleaved order:
 * runtime/train.c pp_order) cannot deadlock. Under the interleaved schedule a rank runs the
 * backward of its later stage before its earlier stage's, so a forward value read only in the
 * backward of a stage beyond the producer's next one on the same rank is refused (pp_partition). */
#ifndef CPLAN_PIPELINE_H
#define CPLAN_PIPELINE_H

#include "lower.h"

typedef struct PipeStage {
  Graph *g;          /* the graph the ranks of this stage run */
  int *gparam;       /* per param of g (g->params order): its index among the global params */
  bool *owned;       /* per param of g: this stage owns it (updates it, writes it to files) */
  int *gstate;       /* per state of g: its index among the global states */
  int *part_to;      /* per state of g: the owner stage its partial gradient accumulator is added
                        into once a step (a tied param's, pipeline.h), -1 */
  int norm_part;     /* the node of g holding this stage's part of the squared gradient norm, -1:
                        none (its part is 0) */
  int norm_split;    /* the update nodes of g before it compute that part (RtPlan.grad_sumsq); the
                        others, the rest of the update (RtPlan.update) */
} PipeStage;

typedef struct Pipeline {
  int pp;            /* stages: devices x chunks */
  int devices;       /* the pp degree: stage s runs on the pp group's rank s mod devices */
  int chunks;        /* stages per device: 1, or 2 under the interleaved schedule */
  PipeStage *stages;
  int ncross;        /* values crossing between stages (tags 0 .. ncross-1) */
  int *owner;        /* per global param (g->params order): its owner stage */
} Pipeline;

/* The stage of every node of sp's global training graph among nv stages (-1: leaves, which every
 * stage holds), and in own[] (n ints, filled) the owner stage of each param and state: the cut
 * pp_partition makes, and what `cplanc plan --explain` prices. */
int *pp_global_stages(const StratPlan *sp, int nv, int *own);

/* Per node of g, whose nodes run on stages st (-1: replicated): for a param's gradient sum whose
 * contribution from another stage is accumulated there and added into the owner's accumulator
 * once a step (above), the input (0, 1) that contribution is; -1 for every other node. pp_partition
 * applies it to the lowered graph; under ZeRO 2 and 3 the lowering reduce-scatters the sum first,
 * so no sum qualifies there (pp_tied_once): `plan --explain` applies it to the global graph. */
int *pp_deferred_sums(const Graph *g, const int *st);
static inline bool pp_tied_once(int64_t zero) { return zero < 2; }

/* Cuts lw's graph into sp->pp x chunks stage graphs (each passes ir_verify). With chunks > 1 (the
 * interleaved schedule, Megatron's virtual pipeline) the layers are cut into pp x chunks
 * contiguous stages and stage s runs on device s mod pp: each device holds `chunks` stages that
 * are not neighbours. NULL with a message in err when the layers are too few, a stage would be
 * empty or a graph fails to verify. */
Pipeline *pp_partition(const StratPlan *sp, const Lowered *lw, int chunks, char *err, size_t errlen);

#endif
