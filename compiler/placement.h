/* placement.h: the placement vocabulary of docs/language.md §7, the resharding table, the per-op
 * sharding rules (the `shard` column of ops.def) and pinned strategies (strategy.c).
 *
 * A tensor's layout on a mesh is one Pl per (logical) mesh axis: S(d) split along tensor dim d,
 * R replicated, P partial sums pending a reduction. Rules work on ONE axis at a time: the axes
 * are independent, so a 2-D mesh [dp, tp] is two runs of the same rules. */
#ifndef CPLAN_PLACEMENT_H
#define CPLAN_PLACEMENT_H

#include "ir.h"
#include "sema.h"

typedef enum PlKind { PL_R, PL_S, PL_P, PL_ANY } PlKind; /* PL_ANY: "no preference" in wants */

typedef struct Pl {
  PlKind kind;
  int dim;            /* PL_S: the split tensor dim (non-negative) */
} Pl;

typedef struct Placement {
  int naxes;
  Pl ax[CP_MAX_RANK]; /* one per logical mesh axis */
} Placement;

Pl pl_r(void);
Pl pl_p(void);
Pl pl_s(int dim);
bool pl_eq(Pl a, Pl b);
const char *pl_str(Pl p);                 /* "S(0)", "R", "P" (arena) */
const char *placement_str(const Placement *p); /* "[S(0), R]" (arena) */

/* ---- resharding: one collective per change of placement on one axis ---- */
typedef enum Collective {
  COLL_NONE,           /* same placement */
  COLL_ALL_REDUCE,     /* P -> R */
  COLL_REDUCE_SCATTER, /* P -> S(d) */
  COLL_ALL_GATHER,     /* S(d) -> R */
  COLL_ALL_TO_ALL,     /* S(i) -> S(j) */
  COLL_LOCAL_SLICE,    /* R -> S(d): each device keeps its part, no communication */
  COLL_LOCAL_ZERO,     /* R or S -> P: one device keeps the value, the others hold zeros */
} Collective;

Collective pl_reshard(Pl from, Pl to);
const char *pl_coll_name(Collective c);   /* "all-reduce", ... */
/* Bytes one device sends (= receives) for collective c on an axis of n devices, with ring
 * algorithms. `bytes` is the size of the whole tensor on that axis's group (as it is when not
 * split along this axis): all-reduce 2(n-1)/n·bytes; all-gather and reduce-scatter (n-1)/n·bytes;
 * all-to-all (n-1)/n of each device's shard of bytes/n; local changes 0. */
double pl_coll_bytes(Collective c, double bytes, int64_t n);

/* ---- sharding rules (shard.c), one per op family, named in ops.def ---- */
typedef struct ShardIO {
  const Pl *in;        /* the placement of each input on this axis (n->nin of them) */
  int64_t n;           /* devices on this axis (divisibility checks) */
  Pl out;              /* result: the output's placement */
  Pl want[8];          /* on failure, the placement an input should be resharded to (PL_ANY: none) */
  double extra_bytes;  /* a collective inside the op (vocab-parallel cross-entropy, argmax), bytes/device */
  const char *extra;   /* its description, NULL when none */
  Collective extra_coll; /* its kind (all-reduce unless the rule says otherwise) */
  char why[200];       /* why the inputs' placements are not a valid strategy */
} ShardIO;

/* Given the inputs' placements on one axis, sets io->out and returns true when they form a valid
 * strategy of node n; otherwise writes io->why (and io->want where a reshard would fix it). */
typedef bool (*ShardFn)(const Graph *g, const Node *n, ShardIO *io);

bool shard_leaf(const Graph *g, const Node *n, ShardIO *io);
bool shard_elementwise(const Graph *g, const Node *n, ShardIO *io);
bool shard_nonlinear(const Graph *g, const Node *n, ShardIO *io);
bool shard_reduce(const Graph *g, const Node *n, ShardIO *io);
bool shard_matmul(const Graph *g, const Node *n, ShardIO *io);
bool shard_transpose(const Graph *g, const Node *n, ShardIO *io);
bool shard_reshape(const Graph *g, const Node *n, ShardIO *io);
bool shard_concat(const Graph *g, const Node *n, ShardIO *io);
bool shard_slice(const Graph *g, const Node *n, ShardIO *io);
bool shard_split_heads(const Graph *g, const Node *n, ShardIO *io);
bool shard_merge_heads(const Graph *g, const Node *n, ShardIO *io);
bool shard_embedding(const Graph *g, const Node *n, ShardIO *io);
bool shard_rowwise(const Graph *g, const Node *n, ShardIO *io);
bool shard_sdpa(const Graph *g, const Node *n, ShardIO *io);
bool shard_grad(const Graph *g, const Node *n, ShardIO *io);
bool shard_assign(const Graph *g, const Node *n, ShardIO *io);
bool shard_cross_entropy(const Graph *g, const Node *n, ShardIO *io);
bool shard_none(const Graph *g, const Node *n, ShardIO *io);

/* The placement input k of node n really has when its inputs are consumed as cons[0..nin) for an
 * output placed `out`: an R input of an elementwise op that does not broadcast along the output's
 * split dim is sliced locally (S(d), no communication: "R inputs are sliced locally" in
 * shard_elementwise), and so is the R operand of a matmul whose other operand is split along the
 * contracted dim K (its K block: the reduction strategy's partial sums); else cons[k]. The lowering
 * slices it, and its gradient is split alike. */
Pl shard_sliced_input(const Graph *g, const Node *n, int k, const Pl *cons, Pl out);

/* Runs node n's rule (the op table's shard column). */
bool shard_node(const Graph *g, const Node *n, ShardIO *io);
/* Alpa-style enumeration: every assignment of R, P and S(d) to the inputs of n that its rule
 * accepts, up to max; fills ins[k*nin + i] and outs[k]. Returns the count. */
int shard_candidates(const Graph *g, const Node *n, int64_t axis_n, Pl *ins, Pl *outs, int max);

/* ---- pinned strategies (strategy.c) ---- */
typedef enum AxisRole { AX_PP, AX_DP, AX_TP } AxisRole;

typedef struct PlanAxis {
  AxisRole role;
  int64_t n;
} PlanAxis;

typedef struct CollOp {
  int node;            /* the producer whose value is resharded (or the op with an inner collective) */
  int consumer;        /* the node that needs it */
  int axis;            /* logical axis index */
  Pl from, to;
  Collective coll;     /* COLL_ALL_REDUCE ... ; for an inner collective from == to */
  double bytes;        /* per device, per execution */
  int per_step;        /* executions per optimizer step (micro-batches for fwd/bwd, 1 for update) */
  const char *what;    /* a note ("log-sum-exp exchange"), or NULL */
} CollOp;

typedef struct StratPlan {
  const Graph *g;
  int64_t dp, tp, pp, sp, zero, micro, accum;
  PlanAxis axes[3];    /* logical axes, outermost first: pp, dp, tp (degree-1 axes omitted) */
  int naxes;
  Placement *pl;       /* per node: its output placement (pp axis: R) */
  int *stage;          /* per node: its pipeline stage */
  VEC(CollOp) colls;
  /* per logical axis, per node: the placements of its inputs as it consumed them, after any
   * reshard (NULL for leaves; a GRAD's forward inputs are given as its forward node consumed
   * them). The SPMD lowering (lower.c) reads them, so build and `plan --explain` agree. */
  Pl **cons[3];
  const int *pins;    /* or NULL: the params' tp placements the plan pins (strat_pins_of) */
} StratPlan;

/* The strategy's degrees with what is left out filled in (dp takes the remaining devices), checked
 * against the model and mesh: errors point at the strategy field. False after diagnostics. */
bool strat_degrees(const Program *prog, const TrainConf *t, int64_t *dp, int64_t *tp, int64_t *pp,
                   int64_t *micro);
/* Assigns placements to every node of the training graph g (train_graph done, B bound to the
 * global micro-batch dp·micro) and lists the collectives. NULL after diagnostics. */
StratPlan *strat_pin(const Program *prog, const Graph *g, const TrainConf *t);
/* The tensor-parallel axis of strat_pin alone, for the search to price what the build runs: the
 * placement of every node of g (a forward graph, or a training graph) on a tp axis of `tp`
 * devices (with sequence parallelism when seqpar) into out[], and the placements each node
 * consumed its inputs in into cons[] (NULL for leaves), and into from[] the placements those
 * inputs had before the reshards (the collective it needed is pl_reshard(from, cons); from equals
 * cons where an earlier reshard of the same value is reused, or a reduction ran in place). The one rule for which params and
 * activations tp splits, along which dim, and which stay whole (a dim tp does not divide, as
 * GPT-2's 50257-row embedding and its tied head). False, quietly, where strat_pin would refuse
 * tp (a column- or row-parallel weight whose split dim tp does not divide). */
bool strat_tp_place(const Graph *g, int64_t tp, bool seqpar, const int *pin, Pl *out, Pl **cons, Pl **from);
/* pin (or NULL): per node of g, the tp placement a plan gives a param instead of the rule's: PIN_NONE
 * the rule's, -1 whole (R), d >= 0 split S(d). The search's ILP chooses them (search.c); a plan
 * carries them by param name (StrategyConf.tp_pins, strat_pins_of). */
enum { PIN_NONE = -2 };
/* The per-node pins of st->tp_pins on g (NULL when st has none, or after an error at `at`: a name
 * g has no param of, a dim the param does not have). */
int *strat_pins_of(const Graph *g, const StrategyConf *st, Span at);
const char *strat_axis_name(AxisRole r); /* "dp" */
/* The first split_heads of g whose head count tp does not divide (tensor parallelism splits the
 * heads), or -1: strat_pin refuses such a tp, and the search does not consider it. */
int strat_heads_misfit(const Graph *g, int64_t tp);
/* Whether sequence parallelism of degree sp divides the sequence (dim 1 of g's first input), as
 * strat_pin requires; true for sp <= 1. */
bool strat_sp_fits(const Graph *g, int64_t sp);
/* A strategy that pins any field, as build and plan take it (strat_degrees: dp*tp*pp against the
 * mesh, zero without dp, sp without tp), and its pinned tp, pp and sp against model g (heads,
 * layers, sequence length), with the errors strat_pin gives at the fields: for `check`, which
 * builds no plan. */
bool strat_check_pinned(const Program *prog, const Graph *g, const TrainConf *t);
/* The one rule for cutting L layers into nv pipeline stages (Megatron's, with the remainder in
 * front): contiguous, the first L mod nv stages one layer more. The stage of layer l. */
int strat_layer_stage(int64_t L, int64_t nv, int64_t l);
/* The layers device stage s of pp holds when each device runs v chunks (the interleaved schedule's
 * virtual stages: chunk c of device s is stage s + c·pp of pp·v under strat_layer_stage). */
int strat_stage_layers(int64_t L, int64_t pp, int64_t v, int64_t s);

#endif
