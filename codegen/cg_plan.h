/* cg_plan.h: where the values of a training graph live in a generated program, for both emitters
 * (emit_c.c: CPU programs, emit_cu.c: CUDA programs), and the RtPlan tables they both write
 * (cg_plan.c).
 *
 * The rules are one set for both backends:
 *   PARAM, STATE, INPUT -> their own arrays (params and states at 16-float aligned offsets);
 *   CONST, SCALAR_IN -> a slot each (the CPU plan names them by node instead);
 *   reshape, ASSIGN and ACCUM results, gradients equal to their dy -> a view of that buffer;
 *   a transpose whose every reader is a GEMM -> a view, read with the GEMM's transpose flag;
 *   a fused group's members -> the registers of the group's kernel at its root (fusion.h);
 *   everything else -> a work buffer at an arena offset memplan.c assigns per phase by liveness.
 * GRADs of one forward node with one dy share one backward kernel call (the first one's).
 * What differs between the backends comes through two hooks: the side buffers a node's kernels
 * need (aux kept for the backward, scratch for one call), and the bytes of a work buffer (the
 * CUDA plan stores activations in bf16 / f16). */
#ifndef CPLAN_CG_PLAN_H
#define CPLAN_CG_PLAN_H

#include "../compiler/fusion.h"
#include "../compiler/ir.h"
#include "../compiler/sema.h"

#include <stdio.h>

enum { CG_PH_TRAIN, CG_PH_EVAL, CG_PH__COUNT }; /* micro_step and update; eval_step */

/* CG_L_FUSED: a member of a fused group other than its root: no buffer, no call. */
typedef enum CgLoc {
  CG_L_NONE, CG_L_PARAM, CG_L_STATE, CG_L_INPUT, CG_L_CONST, CG_L_SCALAR, CG_L_WORK, CG_L_ALIAS, CG_L_FUSED
} CgLoc;

typedef struct CgPlace {
  CgLoc kind;
  int64_t off;            /* PARAM/STATE: offset in floats; INPUT: which input; CONST/SCALAR: slot */
  int alias;              /* CG_L_ALIAS: the node whose buffer this one is */
  bool trans;             /* a transpose left to the GEMM (an alias of its input) */
  int leader;             /* the node whose kernel call computes it: itself, the first GRAD of a
                             backward kernel, or the root of its fused group */
  int64_t aux, scratch;   /* bytes: side outputs kept for the backward; a temporary */
  int64_t woff[CG_PH__COUNT], aoff[CG_PH__COUNT], soff[CG_PH__COUNT]; /* arena offsets per phase */
  int wlo[CG_PH__COUNT], whi[CG_PH__COUNT]; /* the work buffer's planned life: positions in the phase */
} CgPlace;

/* How the emitted code names a node's work buffer (cg_plan_name): the first and last node (index)
 * whose launches name it (lo -1: none), and whether code outside every node's launches does (the
 * phase's own code: the loss fetched, the gradients zeroed). */
typedef struct CgUse {
  int lo, hi;
  bool outside;
} CgUse;

typedef struct CgPlan {
  const Graph *g;
  const Fusion *fu;       /* the fused elementwise groups */
  /* the emitter's hooks, called with ctx */
  void (*sides)(const void *ctx, int i, CgPlace *x); /* sets x->aux and x->scratch of node i */
  int64_t (*bytes)(const void *ctx, int i);          /* node i's work buffer (NULL: ir_node_bytes) */
  const void *ctx;
  const int *keep;        /* more values the train phase hands out (a pipeline stage's norm part) */
  int nkeep;
  /* An emitter that emits twice (emit_cu.c) records, in the first emission it discards, how its
   * code names each work buffer (use, per phase and node; recording: that emission is running).
   * The plan of the second then follows the code, not the graph: a buffer no launch names gets no
   * space (a fold computes its value elsewhere: a GEMM epilogue writes the bias add's buffer, the
   * attention reads q, k, v in place), and one that only launches name lives from the first of
   * them to the last (a GRAD node lists the forward values, its kernel may read none of them).
   * NULL: the graph's liveness. pos: each node's position in its phase (cg_plan_phase). */
  CgUse *use[CG_PH__COUNT];
  bool recording;
  int *pos[CG_PH__COUNT];
  /* The nodes computed in node L's call after L, in index order: gnext[L] is the first, gnext of
   * that the next (-1 ends), from the leaders as they stand when cg_plan_emit emits (the
   * emitters' folds have set them by then). Walked by cg_group_next, so finding a backward
   * kernel's outputs is not a scan of the graph. */
  int *gnext;
  /* results */
  CgPlace *nc;            /* per node */
  int64_t work[CG_PH__COUNT];          /* arena bytes per phase */
  int64_t param_floats, state_floats;  /* the params' and states' arrays */
  int nconst, nscalar;                 /* CONST and SCALAR_IN slots */
} CgPlan;

bool cg_executed(const Node *n);             /* not a leaf: it has a kernel call */
bool cg_in_phase(const Node *n, int ph);     /* executed in phase ph (eval: forward nodes only) */
int cg_root(const CgPlan *p, int i);         /* the node that owns i's memory (views followed) */
void cg_plan_place(CgPlan *p);               /* fills p->nc, param_floats, state_floats, slots */
void cg_plan_phase(CgPlan *p, int ph);       /* the arena offsets of phase ph and p->work[ph] */
int64_t cg_plan_peak(const CgPlan *p);       /* the larger of the phases' arenas */
void cg_plan_record(CgPlan *p);              /* the first emission starts: cg_plan_name records */
/* The emitter names root r's work buffer in phase ph, in the launch of node cur (-1: outside every
 * node's): recorded in the first emission, checked against the plan in the second (an internal
 * error where the plan gave it no space or the launch falls outside its life). */
void cg_plan_name(const CgPlan *p, int ph, int r, int cur);
bool cg_plan_idle(const CgPlan *p, int ph, int r); /* the plan gave r's work buffer no space */
/* Plans both phases and emits the body (emit(ctx) into body, false on an error it diagnosed)
 * twice: the first emission records the names (cg_plan_record) and is discarded, the second runs
 * on the plan that follows them. Once, on the graph's liveness, with CPLAN_PRUNE_ARENA=0 at build
 * time (for comparisons). False when an emission failed or body could not be rewound. */
bool cg_plan_emit(CgPlan *p, FILE *body, bool (*emit)(void *ctx), void *ctx);
/* Node j of the call that `lead` makes, then the next (start with j = lead; -1 after the last). */
static inline int cg_group_next(const CgPlan *p, int j) { return p->gnext[j]; }
/* A node without a kernel call of its own writes the comment that says so and returns true:
 * forward, a reshape or a virtual transpose; a GRAD, a view of dy or one computed with another. */
bool cg_forward_skip(FILE *out, const CgPlan *p, int i);
bool cg_grad_skip(FILE *out, const CgPlan *p, int i);

/* ---- the RtPlan tables and fields both backends write (runtime/cplanrt.h) -------------------- */

/* params[], states[], inputs_[] and metric_names[]; what the backends differ in: */
typedef struct CgTables {
  int (*state_reduce)(const void *ctx, int k); /* a fifth state column: the runtime reduces state k
                                                  over dp (lower.h); NULL: four columns */
  const void *ctx;
  bool inputs_row0;          /* a {0} row when there are no inputs (the CPU table stays empty) */
  const char *more_metrics;  /* names appended to metric_names (f16 loss scaling's), or NULL */
} CgTables;
void cg_emit_tables(FILE *out, const CgPlan *p, const CgTables *o);
/* one row of an RtPlanParam table: param p at offset off (floats); whole: a row of the whole
 * tensors (gparams), with the padding vocab_pad gave p (RtPlanParam.pad_*) */
void cg_emit_param_row(FILE *out, const Node *p, int64_t off, bool whole);

/* The mesh's axis tables, then `const RtPlan cplan_plan = {` and its fields from .model to
 * .flops_per_step; the backends then add their functions and the rest. */
typedef struct CgPlanHead {
  const char *hash;          /* the build's source hash */
  const char *work_bytes;    /* the .work_bytes value, its comma and a comment */
  int64_t micro, vocab;
  int nmetrics;
} CgPlanHead;
void cg_emit_plan_head(FILE *out, const CgPlan *p, const TrainConf *t, const CgPlanHead *h);
/* cross_entropy nodes (RtPlan.ce_targets): whether node i is the first of its ordinal in g, and how
 * many ordinals g has */
bool cg_ce_first(const Graph *g, int i);
int cg_ce_count(const Graph *g);
bool cg_ce_weight_in(const Node *n);      /* a SCALAR_IN "ce_weight" (label_smoothing's term): ia[0] its ordinal + 1 */
/* its value: rt_ce_weight, or in a lowered plan (whose all-reduces make the term's sums the dp
 * group's) rt_ce_weight_dp (cplanrt.h) */
const char *cg_ce_weight_in_value(const Node *n, bool lowered);
const char *cg_ce_weight(const Node *n); /* the C expression of cross_entropy node n's weight (rt_ce_weight) */
/* .dp, .devices, .mesh and the mesh axes of the RtPlan */
void cg_emit_plan_mesh(FILE *out, int64_t dp, int64_t devices, const MeshConf *m);

/* ---- a lowered plan's (tensor parallelism, ZeRO; compiler/lower.h) -------------------------- */
struct StratPlan;
struct Lowered;
struct PipeStage;
typedef struct CgGlobal { int64_t gparam_floats, gstate_floats; } CgGlobal; /* the whole tensors' arrays */
/* plan_axes, the per-shard layout tables, global_index, split_dim, gparams and gstates (and, for
 * pipeline stage ps, param_global, state_global and param_owned); the whole tensors' sizes to o */
void cg_emit_global_tables(FILE *out, const struct StratPlan *sp, const struct Lowered *lw, const struct PipeStage *ps,
                           CgGlobal *o);
/* the RtPlan fields .tp to .split_dim of a lowered plan */
void cg_emit_plan_lowered(FILE *out, const struct StratPlan *sp, const CgGlobal *gt);
/* the RtPlan fields .pp to .grad_sumsq of pipeline stage `stage` (its file defines param_global,
 * state_global, param_owned and update_grad_sumsq); ppa: the pp axis's index in RtRun.axis_comm */
struct Pipeline;
void cg_emit_plan_pipeline(FILE *out, const struct StratPlan *sp, const struct Pipeline *pipe, int stage, int ppa,
                           const TrainConf *t);

#endif
