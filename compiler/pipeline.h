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
 *   - the rest of the update: the stage of the params it serves when that is one stage, else (the
 *     global gradient norm) the highest stage of its inputs.
 * Leaves (params, inputs, constants, states) are copied into every stage that reads them. A param
 * read by several stages (GPT's tied embedding: stage 0 and the last) is held by each, updated by
 * its owner, and the runtime sends the updated value from the owner to the other holders after
 * each update; their gradient contributions reach the owner like any other value.
 *
 * A value one stage computes and another reads crosses once: PP_SEND after the producer, PP_RECV
 * before the first reader (ops.def), in the phase of the reader (a forward value the other stage
 * reads only in its backward is sent in the backward, so evaluation, which runs the forward only,
 * never leaves a message unread). Each crossing has its own tag. Sends do not wait; receives do,
 * so a schedule whose dependencies are acyclic (1F1B, GPipe) cannot deadlock. */
#ifndef CPLAN_PIPELINE_H
#define CPLAN_PIPELINE_H

#include "lower.h"

typedef struct PipeStage {
  Graph *g;          /* the graph the ranks of this stage run */
  int *gparam;       /* per param of g (g->params order): its index among the global params */
  bool *owned;       /* per param of g: this stage owns it (updates it, writes it to files) */
  int *gstate;       /* per state of g: its index among the global states */
} PipeStage;

typedef struct Pipeline {
  int pp;            /* stages: devices x chunks */
  int devices;       /* the pp degree: stage s runs on the pp group's rank s mod devices */
  int chunks;        /* stages per device: 1, or 2 under the interleaved schedule */
  PipeStage *stages;
  int ncross;        /* values crossing between stages (tags 0 .. ncross-1) */
  int *owner;        /* per global param (g->params order): its owner stage */
} Pipeline;

/* Cuts lw's graph into sp->pp x chunks stage graphs (each passes ir_verify). With chunks > 1 (the
 * interleaved schedule, Megatron's virtual pipeline) the layers are cut into pp x chunks
 * contiguous stages and stage s runs on device s mod pp: each device holds `chunks` stages that
 * are not neighbours. NULL with a message in err when the layers are too few, a stage would be
 * empty or a graph fails to verify. */
Pipeline *pp_partition(const StratPlan *sp, const Lowered *lw, int chunks, char *err, size_t errlen);

#endif
