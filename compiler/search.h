/* search.h: the auto-parallel search (DESIGN.md §5, issue 5), prefix srch_.
 *
 * Intra-op (as Alpa): per stage, an ILP picks one sharding strategy per forward node on the
 * model-parallel (tp) axis, from shard_candidates(), with resharding costs on the edges and a
 * per-device memory limit; solved with CBC. Identical layers are solved once: one layer of each
 * class stands for all of them, its input taken from the previous identical layer (periodic).
 * The data-parallel axis splits the batch; ZeRO shards over it.
 * Inter-op: dynamic programming over contiguous layer ranges for the pipeline stages, inside an
 * outer loop over (dp, tp, pp), micro-batch size, ZeRO stage, recompute and pipeline schedule.
 * Every field pinned in `strategy` is respected. */
#ifndef CPLAN_SEARCH_H
#define CPLAN_SEARCH_H

#include "cost.h"

/* ---- the ILP: one choice per variable, pairwise costs on edges -------------------------------- */
typedef struct IlpProblem {
  int nvars;
  int *ncand;          /* per variable: its choices (at least 1) */
  double **cost;       /* per variable, per choice */
  double **mem;        /* per variable, per choice: bytes counted against mem_limit */
  int nedges;
  int *eu, *ev;        /* edge e joins variables eu[e] and ev[e] */
  double **ecost;      /* per edge: ecost[e][a * ncand[ev[e]] + c] when eu takes a and ev takes c */
  double mem_limit;    /* <= 0: no limit */
} IlpProblem;

/* Solves p with CBC (x binary per choice, y continuous per edge pair, linked by the usual
 * marginal constraints). Fills choice[] and *obj; false when infeasible under the memory limit. */
bool srch_ilp_solve(const IlpProblem *p, int *choice, double *obj);
/* The same by exhaustive enumeration (tests; small problems only). */
bool srch_ilp_brute(const IlpProblem *p, int *choice, double *obj);
/* The objective of a choice (memory not checked). */
double srch_ilp_cost(const IlpProblem *p, const int *choice);
/* The ILP of one whole forward graph g on an axis of n devices (every node a variable, no
 * periodic layers), as the search builds its segments: tests compare CBC with enumeration on it. */
IlpProblem *srch_graph_problem(const Graph *g, const CostModel *cm, int64_t n);

/* ---- plans ----------------------------------------------------------------------------------- */
typedef struct SrchPlan {
  int64_t dp, tp, pp, sp, zero;
  int64_t micro;        /* samples per micro-batch per data-parallel replica (the value of B) */
  int64_t microbatches; /* micro-batches per optimizer step (gradient accumulation) */
  int64_t v;            /* interleaved schedule: model chunks per device (1 otherwise) */
  Recompute recompute;
  PipeSched sched;
  double step_time;     /* predicted seconds per optimizer step */
  double bubble;        /* fraction of the step the pipeline idles */
  double tokens_per_s, mfu, tflops;  /* model FLOP/s per device (3 x forward, no recompute) */
  double mem_params, mem_grads, mem_optim, mem_acts, mem_workspace, mem_total; /* worst stage */
  double comm_bytes;    /* bytes sent per device per step (worst stage) */
  double dp_sync;       /* seconds of the gradient reduction per step (on GPUs the part behind the
                           last backward is hidden) */
  double dp_hidden;     /* of which seconds run behind the last backward */
  double update;        /* seconds of the optimizer update per step */
  double p2p;           /* seconds of one activation send between stages */
  int *stage_layers;    /* per stage: its layers (contiguous) */
  double *stage_fwd, *stage_bwd; /* per stage, per micro-batch: seconds (tp collectives included) */
  const int *pins;      /* or NULL (Megatron's rule): the params' tp placements the search's ILP chose, per
                           node of pins_g (strategy.c PIN_NONE, -1 R, d S(d)) */
  const Graph *pins_g;
  int band;             /* the ranking's: plans within 0.5% of the band's fastest (search.c plan_sort) */
} SrchPlan;

typedef struct SrchResult {
  SrchPlan *plans;      /* feasible plans, fastest first (at most the top K asked for) */
  int n;
  int64_t considered;   /* configurations evaluated */
  int64_t ilp_solves;
  int ilp_vars;         /* variables of the largest ILP */
  double seconds;       /* wall time of the search */
  double model_flops;   /* per step */
  double tokens;        /* per step */
  double memory;        /* the per-device limit searched under */
  const char *model;
  int layers, layer_classes;
} SrchResult;

/* Searches the train block's strategy (what `strategy` pins is fixed). NULL after a diagnostic:
 * no plan fits (the message names the smallest per-device memory a plan needs) or the pinned
 * fields leave no configuration. */
SrchResult *srch_run(Sema *s, const TrainConf *t, int topk);

/* Writes the plan's choices into a StrategyConf (is_auto false, every field pinned). */
void srch_pin(const SrchPlan *p, StrategyConf *out);

/* For `cplanc build` under `strategy = auto`: runs the search quietly and writes its best plan to
 * *out (both backends run every plan the search makes). Returns false, leaving *out alone, when
 * there is none (the caller keeps today's default, train_dp). */
bool search_best_runnable(Sema *s, const TrainConf *t, StrategyConf *out);

#endif
