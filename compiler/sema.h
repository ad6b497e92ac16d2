/* sema.h: semantic analysis. Names and scopes, compile-time evaluation, calls,
 * tensor patterns, and elaboration of a model into one flat Graph (sema.c);
 * the mesh and train settings tables and --set overrides (settings.c). */
#ifndef CPLAN_SEMA_H
#define CPLAN_SEMA_H

#include "../grammar/ast.h"
#include "ir.h"
#include "units.h"

/* ---- compile-time values (sema.c) ----------------------------------------- */
typedef enum ValueKind {
  V_ERR,    /* an error was already reported; propagate quietly */
  V_NONE,
  V_INT,    /* i */
  V_FLOAT,  /* f */
  V_BOOL,   /* i: 0 or 1 */
  V_STR,    /* s */
  V_QTY,    /* f: value in base units (units.def), unit: its kind */
  V_TENSOR, /* node: index into the Graph being built */
  V_TUPLE,  /* items */
  V_LIST,   /* items */
} ValueKind;

typedef struct Value Value;
struct Value {
  ValueKind kind;
  int64_t i;
  double f;
  const char *s;
  UnitKind unit;
  int node;
  Value *items;
  int nitems;
  Span span; /* where the value was written (for diagnostics) */
};

const char *value_kind_name(ValueKind k); /* "int", "tensor", ... for messages */

/* ---- the analysis context ------------------------------------------------- */
typedef struct Sema Sema;

/* Indexes the program's items: reports duplicate names (citing both), names that
 * clash with built-in operations, and bad const values. Never NULL. */
Sema *sema_new(Program *prog);
Program *sema_program(Sema *s);
/* The item with that name (any kind), or NULL. */
const Item *sema_find_item(Sema *s, const char *name);
/* Names of every item of a kind, for "did you mean" (count in *n). */
const char *const *sema_item_names(Sema *s, ItemKind kind, int *n);

/* Evaluates an expression that must be known at compile time: literals,
 * quantities, consts, arithmetic, comparisons, and/or/not, tuples and lists.
 * Reports a diagnostic and returns V_ERR otherwise. */
Value sema_eval_const(Sema *s, const Expr *e);

/* Elaborates `model` into a Graph: binds its parameters from `call` (an EX_CALL of
 * the model from `train.model`, or NULL to use the defaults), binds the batch dim
 * `B` of its inputs to `batch`, inlines every fn call, unrolls loops (one layer per
 * iteration), checks every shape and dtype, and names params by LANGUAGE §4.
 * Returns NULL after diagnostics. The graph passes ir_verify(). */
Graph *sema_build_model(Sema *s, const Item *model, const Expr *call, int64_t batch);
/* The backend's widest attention head (0: none): the models built after it compute an sdpa of
 * wider heads in PyTorch's math form, the [Tq, Tk] scores in memory (the CUDA kernels take
 * CPLAN_ATTN_MAX_HEAD_DIM). */
void sema_set_attention_limit(Sema *s, int max_head_dim);

/* ---- settings (settings.c) ----------------------------------------------- */
/* What a missing data file means: check's warning (the default), `run`'s error (it reads the data
 * now), or nothing, for the plan's training file when the program is given another
 * (`-- --data PATH`, which cplanc checks itself). Set for the training (data) and validation (val)
 * files (compiler/sema.c; read by settings.c). */
typedef enum DataNeed { NEED_WARN, NEED_ERROR, NEED_REPLACED } DataNeed;
void sema_need_data(Sema *s, DataNeed data, DataNeed val);
DataNeed sema_data_needed(const Sema *s, bool val);
/* The hint under a tokens file that is not there: how `cplanc data text` makes one at path. */
void sema_hint_make_tokens(const char *path);

typedef enum DeviceKind { DEV_CPU, DEV_CUDA } DeviceKind;

/* What `cplanc calibrate` measured: the optional keys of a profile file (docs/language.md §6),
 * written by tools/calibrate.c and read by settings.c profile_from_json. Per device (one rank of
 * the calibration run), base units. For the cost model: a figure that is 0 was not measured.
 * Checklist: a field added here is written by tools/calibrate.c and read in profile_from_json. */
enum { CP_PROFILE_POINTS = 16 }; /* the most points kept per curve (more are an error) */
typedef enum ProfileColl {       /* the JSON keys under "collectives", in this order */
  PC_ALL_REDUCE, PC_ALL_GATHER, PC_REDUCE_SCATTER, PC_BROADCAST, PC__COUNT
} ProfileColl;
typedef struct ProfilePoint { double x, y; } ProfilePoint;
typedef struct DeviceMeasured {
  int ngemm;
  ProfilePoint gemm[CP_PROFILE_POINTS]; /* "gemm_efficiency": x = n of an n x n x n f32 GEMM
                                           (OpenBLAS), y = its FLOP/s / flops_f32 (<= 1), by n */
  /* "kernel_efficiency": achieved bytes/s (input read + output written, one thread, as plans
   * call kf_*) / hbm; may exceed 1 (hbm is a 3-stream triad on all the rank's threads) */
  double eff_layer_norm, eff_softmax, eff_gelu; /* gelu stands for elementwise unary ops */
  int coll_ranks;                       /* "collectives.ranks": ranks they ran on; 0: none */
  struct {
    double alpha;                       /* seconds: fitted fixed cost of one call on coll_ranks */
    double beta;                        /* seconds per byte of the whole tensor (below) */
    int npoints;
    ProfilePoint points[CP_PROFILE_POINTS]; /* x = bytes of the whole tensor (all_reduce and
                                           broadcast: the buffer; all_gather: the output;
                                           reduce_scatter: the input), y = seconds per call */
  } coll[PC__COUNT];                    /* t(bytes) ~ alpha + beta * bytes, at coll_ranks ranks */
} DeviceMeasured;

/* A device's cost-model figures. Built-in profiles are in devices.def. */
typedef struct DeviceProfile {
  const char *name;      /* "a100_80gb", "cpu", "custom", or the profile file */
  DeviceKind kind;
  double memory;         /* bytes per device */
  double flops_f32;      /* peak FLOP/s in f32 */
  double flops_bf16;     /* peak FLOP/s in bf16/f16 (dense) */
  double hbm;            /* memory bandwidth, bytes/s */
  double intra_bw;       /* per-device bandwidth inside a node (NVLink), bytes/s */
  double inter_bw;       /* per-device bandwidth across nodes (InfiniBand), bytes/s */
  double intra_latency;  /* seconds */
  double inter_latency;  /* seconds */
  const char *source;    /* where the figures come from */
  const DeviceMeasured *measured; /* a calibrated profile file's measurements; NULL otherwise */
} DeviceProfile;

typedef struct MeshAxis {
  const char *name;
  int64_t size;
  double bandwidth;      /* bytes/s per device along this axis */
  double latency;        /* seconds */
  Span span;
} MeshAxis;

typedef struct MeshConf {
  const char *name;      /* NULL for the default one-device local mesh */
  Span span;
  MeshAxis axes[CP_MAX_RANK];
  int naxes;
  int64_t ndevices;      /* product of the axis sizes */
  DeviceProfile device;
} MeshConf;

typedef enum OptKind { OPT_SGD, OPT_ADAMW, OPT_LAMB, OPT_LARS } OptKind;
typedef struct OptimizerConf {
  OptKind kind;
  double lr, beta1, beta2, eps, weight_decay, momentum, trust;
  bool nesterov;
} OptimizerConf;

typedef enum SchedKind { SCHED_CONSTANT, SCHED_COSINE, SCHED_LINEAR } SchedKind;
typedef struct ScheduleConf {
  SchedKind kind;
  int64_t warmup;
  double end_lr;         /* cosine: min_lr; linear: end_lr */
} ScheduleConf;

typedef enum DataKind { DATA_TOKENS, DATA_ADDER, DATA_TENSORS } DataKind;
typedef struct DataConf {
  DataKind kind;
  const char *path;      /* resolved relative to the .cplan file; NULL for adder */
  const char *val_path;  /* NULL when none */
  int64_t digits;        /* adder */
  bool shuffle;
  Span span;
} DataConf;

typedef enum Precision { PREC_F32, PREC_BF16, PREC_F16 } Precision;
typedef enum Recompute { RC_SEARCH = -1, RC_NONE, RC_SELECTIVE, RC_FULL } Recompute;
typedef enum PipeSched { PS_SEARCH = -1, PS_1F1B, PS_GPIPE, PS_INTERLEAVED } PipeSched;

/* What `strategy` pins; 0 (or *_SEARCH) means "left to the search". */
/* A param's placement on the tensor-parallel axis as the search's ILP chose it (a plan's
 * "tp_params"): split along dim (>= 0) or whole (-1). */
typedef struct TpPin {
  const char *param;
  int dim;
} TpPin;

/* a strategy field as written (`key = value`, in the file or a --set), for diagnostics */
typedef struct StrategyField {
  const char *key;
  Span span;
} StrategyField;

typedef struct StrategyConf {
  bool is_auto;          /* strategy = auto (nothing pinned) */
  int64_t dp, tp, pp, sp, micro;
  int64_t zero;          /* -1: search */
  Recompute recompute;
  PipeSched pipeline;
  Span span;
  /* every param's tp placement, when the search's ILP placed them (strategy.c place_lazy takes them
   * instead of Megatron's rule); NULL: the rule */
  const TpPin *tp_pins;
  int ntp_pins;
  StrategyField fields[12]; /* strat_field_span */
  int nfields;
} StrategyConf;

typedef struct TrainConf {
  const char *name;      /* NULL for an unnamed train block */
  Span span;
  const Item *model;     /* the model item */
  const Expr *model_call;/* the EX_CALL (or EX_NAME) written for `model` */
  MeshConf *mesh;
  DataConf data;
  int64_t batch, steps;
  OptimizerConf optimizer;
  ScheduleConf schedule;
  double clip;           /* 0: none */
  Precision precision;
  StrategyConf strategy;
  double memory;         /* per-device budget in bytes */
  int64_t seed;
  int64_t eval_every, eval_batches;        /* 0: no evaluation */
  int64_t ckpt_every, ckpt_keep;           /* 0: no checkpoints */
  const char *ckpt_dir;
  int64_t log_every;
  const char *log_file;  /* NULL: none */
} TrainConf;

/* The span of `strategy`'s field `key` (the whole `key = value`, in the file or a --set), or the
 * strategy's span (compiler/strategy.c). */
Span strat_field_span(const TrainConf *t, const char *key);

/* Applies `--set key=value` overrides to the program's settings (the AST), before
 * any checking, so they meet the same validation as the file. Keys:
 * train.KEY[.ARG], mesh.NAME.KEY[.ENTRY]; `train` means the selected train block
 * (`train_name`, or the only one). Bad keys or values are diagnosed against a
 * pseudo source holding the --set text. Returns false after diagnostics. */
bool settings_apply_overrides(Sema *s, const char *const *sets, int nsets, const char *train_name);

/* Checks a mesh item against the mesh settings table. NULL after diagnostics. */
MeshConf *settings_mesh(Sema *s, const Item *mesh);
/* The one-device mesh of the local machine (train without `mesh`). */
MeshConf *settings_default_mesh(void);
/* Selects the train block (by name, or the only one; NULL when the file has none
 * and train_name is NULL, with *none set), checks it against the train settings
 * table and resolves its model and mesh. NULL after diagnostics. */
TrainConf *settings_train(Sema *s, const char *train_name, bool *none);

/* The train block's model elaborated for batch (train_graph_batch), its dropout nodes keyed and
 * given their batch dims (a second elaboration at batch + 1): the graph build, run and emit lower.
 * NULL after diagnostics. */
Graph *sema_train_graph(Sema *s, const TrainConf *t, int64_t batch);

/* Table lookups used by check and the driver. */
const char *precision_name(Precision p);
const char *optimizer_name(OptKind k);

#endif
