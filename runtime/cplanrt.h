/* cplanrt.h: the public interface of libcplanrt, the runtime that generated plan.c links with.
 *
 * It is the only header generated code includes.  Sections follow the source files:
 *   errors        (every file)  how failures are reported
 *   data.c                      the data sources of docs/language.md §8: tokens, adder, tensors
 *   safetensors.c               safetensors reading and writing (checkpoints, the tensors source)
 *   train.c                     rt_main, the training program's main loop; rt_uniform
 *   checkpoint.c                params files and checkpoints
 *   comm.c                      rt_comm: collectives over MPI for multi-rank runs
 *   trace.c                     --trace (Chrome/Perfetto spans) and peak memory
 *
 * Conventions: functions return 0 on success and -1 on failure, or a pointer that is NULL on
 * failure; on failure they fill the RtError the caller passes (which may be NULL) with one line
 * naming the file and what is wrong.  Nothing here calls exit() or prints. */
#ifndef CPLANRT_H
#define CPLANRT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- errors -------------------------------------------------------------------------------- */

#define RT_ERROR_MAX 512

typedef struct RtError {
  char msg[RT_ERROR_MAX]; /* "data/train.bin: bad magic 12345 (expected 20240520): ..." */
} RtError;

/* Formats a message into err (when not NULL) and returns -1, so `return rt_errf(...)` reads well. */
int rt_errf(RtError *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* fopen(path, "rb") of a regular file; a directory or a device is refused with "not a regular
 * file" rather than read as a huge or endless file. NULL with the error otherwise. */
FILE *rt_open_regular(const char *path, RtError *err);
/* Writes path through path.tmp and rename(): what write_body(fp, ctx) writes (nonzero: failed,
 * errno set). A symlink at path is written through (its target replaced); a path that exists and is
 * not a regular file (a device, a FIFO, a directory) is refused, never replaced. */
int rt_write_replace(const char *path, int (*write_body)(FILE *fp, const void *ctx), const void *ctx, RtError *err);

/* ---- data.c: tokens(path) ------------------------------------------------------------------- */

/* llm.c's token file: 256 little-endian int32 (magic, version, count, ...) then uint16 tokens. */
#define RT_TOKENS_MAGIC 20240520
#define RT_TOKENS_VERSION 1
#define RT_TOKENS_HEADER_INTS 256

typedef struct RtTokens RtTokens;

/* Reads and validates the whole file: magic, version, that the size matches the count, and that
 * every token is < vocab (the first bad one is named by position and value). */
RtTokens *rt_tokens_open(const char *path, int vocab, RtError *err);
void rt_tokens_close(RtTokens *t);
int64_t rt_tokens_count(const RtTokens *t);

/* Writes tokens (each < 65536) as an llm.c token file, through PATH.tmp and rename(). */
int rt_tokens_write(const char *path, const uint16_t *tokens, int64_t n, RtError *err);

/* S = floor((ntokens - 1) / (N*T)), the number of distinct steps before the data wraps around.
 * Returns -1 with an error saying how many tokens are needed when S would be 0. */
int64_t rt_tokens_steps(const RtTokens *t, int64_t n, int64_t seq, RtError *err);

/* Samples [j0, j1) of step `step` for global batch N and sequence length T (§8): sample j reads
 * tokens [o + j*T, o + j*T + T + 1) with o = (step mod S)*N*T.  Row r = j - j0 of `inputs` and
 * `targets` (each (j1 - j0) x T int32, row-major) gets the first T and the last T of them. */
int rt_tokens_batch(const RtTokens *t, int64_t n, int64_t seq, int64_t step, int64_t j0,
                    int64_t j1, int32_t *inputs, int32_t *targets, RtError *err);

/* ---- data.c: adder(digits = d) -------------------------------------------------------------- */

/* Tokens of the adder task (vocab 13). */
enum { RT_ADD_PLUS = 10, RT_ADD_EQUALS = 11, RT_ADD_END = 12, RT_ADD_VOCAB = 13 };
#define RT_ADDER_MAX_DIGITS 9 /* a*10^d + b must fit in 64 bits */

/* A problem is a + b with a, b < 10^d.  Its key is a*10^d + b.
 *
 * Sequence (3d+3 tokens, then RT_ADD_END up to T+1): the d digits of a (most significant first,
 * zero-padded), '+', the d digits of b, '=', the d+1 digits of c = a+b least significant FIRST
 * (zero-padded), e.g. d=2, 12+34: 1 2 + 3 4 = 6 4 0 end...  inputs = tokens[0, T), targets =
 * tokens[1, T+1) with every target -1 except those that are digits of c.
 *
 * Held out: ((key * 2654435761) mod 2^32) mod 10 == 0 (rt_adder_held_out).
 *
 * Training order (counter-based, the same under every strategy and rank count): sample j of step
 * s with seed `seed` is the first attempt k = 0, 1, ... whose problem is not held out, where
 *   r = splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ s) ^ j) ^ k),
 *   a = (r mod 2^32) mod 10^d,  b = (r div 2^32) mod 10^d,
 * and splitmix64(x) is the finalizer of Steele et al.'s SplitMix64 applied to x + 0x9e3779b97f4a7c15
 * (rt_splitmix64).  About one attempt in ten is rejected.
 *
 * Evaluation order: the held-out problems sorted by key, H of them; evaluation sample i (i = s*N
 * + j counted from the start of each evaluation) is the ((i mod H) * m mod H)-th, where the
 * stride m is the least integer >= max(1, floor(H * 618034 / 10^6)) coprime with H.  So one pass
 * of H samples visits every held-out problem once, and a short evaluation is spread over all of
 * them (by key order it would see only the smallest a).  For d <= 3 the list is
 * built when the source is opened; for larger d it has 10^(2d)/10 entries, too many to list, so
 * sample i is drawn instead exactly as training sample (s, j) but from seed ~seed and ACCEPTING
 * only held-out problems. */
typedef struct RtAdder RtAdder;

RtAdder *rt_adder_open(int digits, int64_t seed, RtError *err);
void rt_adder_close(RtAdder *a);
int rt_adder_digits(const RtAdder *a);
uint64_t rt_splitmix64(uint64_t x);
int rt_adder_held_out(int digits, uint64_t a, uint64_t b);
/* The problem of training (eval = 0) or evaluation (eval = 1) sample j of step s. */
void rt_adder_problem(const RtAdder *a, int eval, int64_t step, int64_t n, int64_t j,
                      uint64_t *pa, uint64_t *pb);
/* Writes the T+1 tokens of a + b into seq; -1 with an error when T+1 < 3d+3. */
int rt_adder_sequence(int digits, uint64_t a, uint64_t b, int64_t seq_len, int32_t *seq,
                      RtError *err);
/* Samples [j0, j1) of step s, as rt_tokens_batch. */
int rt_adder_batch(const RtAdder *a, int eval, int64_t n, int64_t seq, int64_t step, int64_t j0,
                   int64_t j1, int32_t *inputs, int32_t *targets, RtError *err);

/* ---- safetensors.c -------------------------------------------------------------------------- */

/* Checklist: if you add a dtype, update the table in safetensors.c. */
typedef enum RtDtype {
  RT_F64, RT_F32, RT_F16, RT_BF16, RT_I64, RT_I32, RT_I16, RT_I8, RT_U8, RT_U16, RT_BOOL,
  RT_DTYPE_COUNT
} RtDtype;

#define RT_ST_MAX_DIMS 8
#define RT_ST_MAX_HEADER (100 * 1024 * 1024) /* the safetensors library's own limit */

typedef struct RtStTensor {
  const char *name;               /* param path, e.g. "h.0.attn.c_attn.weight" */
  RtDtype dtype;
  int ndim;                       /* 0 is a scalar */
  int64_t shape[RT_ST_MAX_DIMS];
  void *data;                     /* elements, little-endian, row-major; in a file that
                                     rt_st_write did not write it may be unaligned */
} RtStTensor;

const char *rt_dtype_name(RtDtype d);   /* "F32" */
size_t rt_dtype_size(RtDtype d);        /* bytes per element */
int64_t rt_st_numel(const RtStTensor *t);

/* Writes PATH.tmp, syncs it, then renames it to PATH, so a crash never leaves half a file.
 * meta_keys/meta_values (n_meta pairs, may be 0) become the "__metadata__" object. */
int rt_st_write(const char *path, const RtStTensor *tensors, int n, const char *const *meta_keys,
                const char *const *meta_values, int n_meta, RtError *err);

typedef struct RtStFile RtStFile;

/* Loads the whole file and validates it: header length, JSON, known dtypes, shapes, offsets
 * inside the data and not overlapping, sizes equal to dtype size * shape, no duplicate names. */
RtStFile *rt_st_open(const char *path, RtError *err);
void rt_st_close(RtStFile *f);
const char *rt_st_path(const RtStFile *f);
int rt_st_count(const RtStFile *f);
const RtStTensor *rt_st_tensor(const RtStFile *f, int i); /* in header order */
const RtStTensor *rt_st_find(const RtStFile *f, const char *name); /* NULL when absent */
const char *rt_st_meta(const RtStFile *f, const char *key);   /* NULL when absent */
/* Copies tensor `name` into dst after checking it exists with this dtype and shape. */
int rt_st_read(const RtStFile *f, const char *name, RtDtype dtype, int ndim,
               const int64_t *shape, void *dst, RtError *err);

/* ---- data.c: tensors(path) ------------------------------------------------------------------ */

/* A safetensors file with one F32 or I32 tensor per model input, named as the inputs, whose first
 * dim counts samples (the same count for all).  Sample j of step s is row (s*N + j) mod rows. */
typedef struct RtTensorSource RtTensorSource;

RtTensorSource *rt_tsrc_open(const char *path, const char *const *inputs, int n_inputs,
                             RtError *err);
void rt_tsrc_close(RtTensorSource *s);
int64_t rt_tsrc_rows(const RtTensorSource *s);
const RtStTensor *rt_tsrc_input(const RtTensorSource *s, int i); /* for shape checks */
/* Copies rows for samples [j0, j1) of step s of input i into out, packed. */
int rt_tsrc_batch(const RtTensorSource *s, int i, int64_t n, int64_t step, int64_t j0,
                  int64_t j1, void *out, RtError *err);

/* ---- train.c: the training program's main loop ------------------------------------------------
 *
 * A program built by `cplanc build` is plan.c (generated) + this runtime. plan.c defines one
 * RtPlan, the specialized code of its step, and
 *     int main(int argc, char **argv) { return rt_main(argc, argv, &cplan_plan); }
 * Everything that is the same for every model lives here: flags, data feeding, the progress
 * line, metrics, checkpoints and resume, signals, NaN detection, param initialization.
 * Checklist: a field added here is filled by codegen/emit_c.c and read by train.c. */

/* How a param starts (the values of compiler/ir.h InitKind). */
typedef enum RtInit { RT_INIT_ZEROS, RT_INIT_ONES, RT_INIT_FULL, RT_INIT_NORMAL, RT_INIT_UNIFORM } RtInit;

typedef struct RtPlanParam {
  const char *name;             /* param path: "h.0.attn.c_attn.weight" (checkpoint tensor name) */
  int rank;
  int64_t shape[RT_ST_MAX_DIMS];
  int64_t numel;
  int64_t offset;               /* in floats, into RtRun.params */
  RtInit init;
  double init_a, init_b;        /* full(a), normal(std = a), uniform(lo = a, hi = b) */
  /* A param the compiler padded for tp (compiler/vocab_pad.c; pad_len 0: none): one dim of size
   * pad_len (pad_inner elements after it in row-major order) holds pad_valid real entries, then
   * zeros; files hold the unpadded tensor (whole tensors only: gparams; rt_unpadded_index) */
  int64_t pad_len, pad_valid, pad_inner;
} RtPlanParam;

typedef struct RtPlanState {
  const char *name;             /* "<param path>.exp_avg", "<param path>.grad", ... */
  int64_t numel;
  int64_t offset;               /* in floats, into RtRun.state */
  int saved;                    /* 1: optimizer state, saved in checkpoints; 0: gradient
                                   accumulators, zero at every step boundary */
  int reduce;                   /* a lowered plan's (gparams != NULL): 1 when the runtime reduces
                                   this gradient accumulator over dp (others: in the graph) */
  int64_t pad_len, pad_valid, pad_inner; /* the state of a padded param: as its RtPlanParam's */
} RtPlanState;

typedef struct RtPlanInput {
  const char *name;             /* the model input's name */
  int rank;
  int64_t shape[RT_ST_MAX_DIMS];/* per micro-batch: shape[0] is the micro-batch size */
  RtDtype dtype;                /* RT_I32 or RT_F32 */
} RtPlanInput;

typedef enum RtDataKind { RT_DATA_TOKENS, RT_DATA_ADDER, RT_DATA_TENSORS } RtDataKind;

/* Where the targets of cross_entropy node `ce` (its ordinal in the model) come from, so that its mean
 * is over the targets not ignored in the whole step rather than in each micro-batch (docs/language.md,
 * Batches): the elements of input `input` (-1: not an input, counted per micro-batch by the kernel
 * alone), restricted to [lo, hi) along dim `dim` (-1: all of it), whose values are none of -1,
 * ignore[0] and ignore[1]. */
typedef struct RtCeTarget {
  int ce, input;
  int64_t ignore[2];
  int dim;
  int64_t lo, hi;
} RtCeTarget;

typedef struct RtRun RtRun;
typedef struct RtComm RtComm;

typedef struct RtPlan {
  const char *model;            /* the model's name */
  const char *source;           /* the .cplan file it was built from */
  const char *source_hash;      /* identifies the build (checkpoints record it) */
  /* params, optimizer state and gradient buffers, each in one f32 array */
  int nparams;
  const RtPlanParam *params;
  int64_t param_floats;
  int nstates;
  const RtPlanState *states;
  int64_t state_floats;
  int64_t work_bytes;           /* the arena activations and gradients live in */
  /* inputs, in the model's declaration order; for tokens and adder data: (inputs, targets) */
  int ninputs;
  const RtPlanInput *inputs;
  int nmetrics;
  const char *const *metric_names;
  /* data (paths resolved when the plan was built) */
  RtDataKind data_kind;
  const char *data_path, *val_path; /* val_path NULL: no evaluation data */
  int digits;                   /* adder */
  int64_t vocab;                /* tokens are checked against it */
  int64_t seq_len;              /* T: dim 1 of the first input */
  /* the plan */
  int64_t batch, micro, accum;  /* batch = micro * accum on one device */
  int64_t steps;                /* the schedule's length (--steps may stop earlier) */
  int64_t seed;
  int64_t eval_every, eval_batches;
  int64_t ckpt_every, ckpt_keep;/* 0: no checkpoints unless flags ask */
  const char *ckpt_dir;
  int64_t log_every;
  const char *log_file;         /* metrics JSONL from the plan, NULL: none */
  double flops_per_step;        /* forward + backward FLOPs of one optimizer step */
  /* the generated code */
  double (*lr_at)(int64_t step);/* the schedule, step counted from 0 */
  /* One micro-batch: forward, backward, and ACCUM into the gradient buffers (the gradient is
   * seeded with 1/accum). inputs[i] points at plan->inputs[i]'s data. Writes the loss and the
   * metrics (nmetrics values) of this micro-batch. */
  void (*micro_step)(RtRun *run, const void *const *inputs, double *loss, double *metrics);
  /* After accum micro-steps: clipping, the optimizer update of params and state, and zeroing of
   * the gradient buffers. Returns the global gradient norm before clipping. */
  double (*update)(RtRun *run);
  /* Forward only, for evaluation: loss and metrics of one micro-batch. */
  void (*eval_step)(RtRun *run, const void *const *inputs, double *loss, double *metrics);
  /* Data parallelism (0 in a plan from before it means 1).  The program runs as `devices` MPI
   * ranks (mpirun -np devices); with dp = devices each rank computes samples
   * [rank*batch/dp, (rank+1)*batch/dp) of every step in accum micro-batches of micro (so batch =
   * dp * micro * accum), and the gradient accumulators are all-reduced before update: summed,
   * then scaled by 1/dp, except in a lowered plan (gparams != NULL), whose gradient seed already
   * carries the 1/dp (compiler/lower.h), where they are summed only, and only those held whole
   * on the dp axis (split_dim < 0: ZeRO 2 and 3 reduce-scatter theirs inside the graph). */
  int64_t dp;
  int64_t devices;              /* the mesh's device count = the ranks the program needs */
  const char *mesh;             /* the mesh's name, for messages (NULL: the default mesh) */
  int nmesh_axes;
  const int64_t *mesh_axes;     /* axis sizes, outermost first */
  const char *const *mesh_axis_names;
  /* A lowered plan (tensor parallelism or ZeRO; gparams is NULL in a plan without: pure data
   * parallelism runs the one-device program on every rank). The ranks form the grid of
   * the strategy's axes plan_axes (outermost first: dp, tp; degree-1 axes omitted), row-major
   * over the world ranks; dp_axis and tp_axis index it (-1: none). params and states are this
   * rank's shards; gparams and gstates are the whole tensors (laid out as a one-device plan lays
   * them out), and global_index maps element `local` of the shard of param k (state k when
   * state != 0) held at strategy coordinates coord to its index in the whole tensor. */
  int64_t tp;
  int64_t sp;                   /* sequence parallelism (Megatron's: over the tp group; 0, 1: none) */
  int zero;                     /* the ZeRO stage, 0-3 (for messages: the plan already does it) */
  int nplan_axes;
  const int64_t *plan_axes;
  const char *const *plan_axis_names;
  int dp_axis, tp_axis;
  const RtPlanParam *gparams;
  int64_t gparam_floats;
  const RtPlanState *gstates;
  int64_t gstate_floats;
  int64_t (*global_index)(int state, int k, const int64_t *coord, int64_t local);
  /* The dim of param k (state k when state != 0) split along strategy axis a, -1 when that axis
   * holds it whole (replicated, or partial for a gradient accumulator the runtime reduces). */
  int (*split_dim)(int state, int k, int a);
  /* Pipeline parallelism (pp > 1; 0 in a plan without). The program links one RtPlan per stage;
   * rt_main, given stage 0's, runs stage_plans[c] where c is the rank's coordinate on the pp axis,
   * the outermost of the rank grid (pp, then plan_axes); its group and coordinate are
   * RtRun.axis_comm[pp_axis] and axis_coord[pp_axis], pp_axis = nplan_axes. A stage's params are those it reads (param_global[k]: the index in
   * gparams, param_owned[k]: this stage updates it and writes it to files; a param several
   * stages read, a tied embedding, is owned by the first and sent to the others after each
   * update), its states those of its owned params (state_global[k]: the index in gstates). Its
   * micro-batches run as forward (with the loss and metrics on the last stage) and backward,
   * each on the arena of its slot, in the order of pp_schedule (0: 1F1B, 1: GPipe); values that
   * cross stages are sent inside them (rt_comm_isend / rt_comm_recv on the pp group). With
   * pp_chunks = 2 (the interleaved schedule, Megatron's virtual pipeline) stage_plans holds
   * pp x 2 stages and the rank at pp coordinate c runs two of them, c and c + pp, each with its
   * own params, states and arenas, in Megatron's interleaved 1F1B order; a crossing's peer is the
   * rank of its stage (stage mod pp). The update: each stage's grad_sumsq returns its part of the
   * squared gradient norm (the gradients it owns); the runtime sums the parts of the rank's
   * stages, all-reduces that over the pp group (f64), stores it in RtRun.grad_sumsq and calls each
   * stage's update, which returns the gradient norm (the same on every stage). */
  int64_t pp;
  int stage;
  const struct RtPlan *const *stage_plans;
  int pp_axis;
  int pp_schedule;
  void (*forward)(RtRun *run, const void *const *inputs, double *loss, double *metrics);
  void (*backward)(RtRun *run, const void *const *inputs);
  const int *param_global;
  const int *state_global;
  const unsigned char *param_owned;
  /* per state: -1, or the stage whose accumulator of the same global state (state_global) this
   * partial gradient accumulator is added into once a step, after the micro-batches (a tied
   * param: compiler/pipeline.h); its dp reduction and the norm are the owner's */
  const int *state_part_to;
  int ngparams, ngstates;       /* the whole params and states (gparams, gstates) */
  int pp_chunks;                /* stages per rank: 2 under the interleaved schedule (0, 1: one) */
  double (*grad_sumsq)(RtRun *run); /* a stage's part of the squared gradient norm */
  /* What checkpoints record and --resume accepts (NULL: source_hash): the build's hash without
   * the strategy and mesh settings, so a checkpoint of one strategy resumes under another. */
  const char *resume_hash;
  /* The CUDA backend (codegen/emit_cu.c; NULL in a CPU plan): params and optimizer state live on
   * the device and RtRun.params / .state are host mirrors. to_device copies the mirrors to the
   * device: the runtime calls it once the params are initialized or loaded (--init, --resume).
   * to_host copies the device values back: the runtime calls it before it reads the mirrors
   * (checkpoints, --save). Both return 0, or -1 with the error. A plan whose runtime never calls
   * to_device uploads on its first step and refreshes the mirrors after every update instead. */
  int (*to_device)(RtRun *run, RtError *err);
  int (*to_host)(RtRun *run, RtError *err);
  /* Data parallelism on the device (NULL: the runtime sums the host mirrors): sums the gradient
   * accumulators (the states with saved = 0) over `group`, the dp group, then multiplies them by
   * `scale`, on the device. Called once per step, after the micro-batches and before update, on
   * every rank of the group; 0, or -1 with the error. */
  int (*reduce_grads)(RtRun *run, RtComm *group, double scale, RtError *err);
  /* f16 dynamic loss scaling (NULL: none): the scaler's state st = {scale, steps since its last
   * change, steps skipped} is read (set = 0) into each checkpoint's state.json and restored
   * (set = 1) by --resume, as PyTorch's GradScaler.state_dict(). */
  void (*loss_scaler)(double st[3], int set);
  /* Pipeline parallelism on the device (NULL: the params live in run->params): copies param k of
   * this stage plan between the device and `host` (its numel floats; to_device 1: host to device,
   * 0: back). The runtime sends a param several stages hold (a tied embedding) from its owner's
   * host mirror after each update (sync_shared_params): it copies it out of the owner's device
   * first and into each holder's device after. */
  void (*param_copy)(int k, float *host, int to_device);
  /* The same for state k (its numel floats): the runtime adds a partial gradient accumulator
   * (state_part_to) into its owner's through the host mirrors. */
  void (*state_copy)(int k, float *host, int to_device);
  /* NULL, or: after the step's update, the plan (each pipeline stage plan that reports metrics)
   * may rewrite sums, its metrics summed over the step's micro-batches, before the runtime averages
   * them: a metric the update decides (f16's skipped_steps: the micro-batches report it before the
   * step's overflow is known, which under dp, tp or pp the ranks agree on in the update). */
  void (*step_metrics)(RtRun *run, double *sums);
  /* The cross_entropy nodes of this (stage) plan and where their targets come from (RtCeTarget).
   * Before each step (and evaluation batch) of more than one micro-batch, the runtime counts each
   * one's targets in every micro-batch's data, sums the counts over the dp group and sets
   * RtRun.ce_weight; the generated code multiplies the node's loss and its gradient by
   * rt_ce_weight(run, ce). */
  int nce;
  const RtCeTarget *ce_targets;
} RtPlan;

/* What the generated code reads and writes while it runs. */
struct RtRun {
  const RtPlan *plan;
  float *params;                /* plan->param_floats */
  float *state;                 /* plan->state_floats */
  unsigned char *work;          /* plan->work_bytes, 64-byte aligned */
  int64_t step;                 /* the optimizer step being computed, from 0 */
  int64_t micro_index;          /* 0 .. accum-1 within the step */
  int threads;
  int64_t dp_rank;              /* this rank's replica, 0 .. plan->dp-1 (dropout streams use it) */
  /* tensor parallelism: per strategy axis (plan->plan_axes) its group and this rank's coordinate */
  RtComm *axis_comm[3];
  int64_t axis_coord[3];
  double grad_sumsq;            /* pipeline stages: the squared gradient norm update reads */
  int slot;                     /* pipeline stages: the arena slot of the micro-batch being run, 0
                                   otherwise (work is that slot's host arena; a GPU plan keeps one
                                   device arena per slot) */
  /* NULL (every weight 1), or per cross_entropy node k and micro-batch m of the step,
   * ce_weight[k * ce_stride + m] = n_m * accum * dp / N: the node's own mean over the n_m targets of
   * micro-batch m it counts times that is its share of the mean over the N targets of the step, so
   * the means over the micro-batches and ranks the runtime takes are means over the targets */
  const double *ce_weight;
  /* the same per node and micro-batch with n_m the count over the dp group's ranks: n_m * accum / N,
   * ce_weight's mean over the ranks. label_smoothing's term in a lowered plan (tp, pp, ZeRO) reads it:
   * the lowering sums that term's rows over the dp group before the ratio (compiler/lower.h), so each
   * rank holds the group's ratio of the micro-batch, not its own */
  const double *ce_weight_dp;
  int64_t ce_stride;
};

/* The weight of cross_entropy node k in the micro-batch being run (RtRun.ce_weight). */
static inline float rt_ce_weight(const RtRun *run, int k) {
  return run->ce_weight ? (float)run->ce_weight[(int64_t)k * run->ce_stride + run->micro_index] : 1.0f;
}
/* ... and its mean over the dp group (RtRun.ce_weight_dp) */
static inline float rt_ce_weight_dp(const RtRun *run, int k) {
  return run->ce_weight_dp ? (float)run->ce_weight_dp[(int64_t)k * run->ce_stride + run->micro_index] : 1.0f;
}

/* Parses the program's flags (--help lists them), trains, and returns the exit status:
 * 0 success (also after SIGINT/SIGTERM, which finish the step and write a checkpoint), 1 an
 * error (bad data, NaN loss, I/O), 2 bad usage. */
int rt_main(int argc, char **argv, const RtPlan *plan);

/* The counter-based generator behind init values and dropout masks: a uniform double in
 * [0, 1) from (seed, a 64-bit key, an element index), the same on every rank and strategy. */
double rt_uniform(uint64_t seed, uint64_t key, uint64_t index);
uint64_t rt_hash_str(const char *s); /* the key of a param path */
/* The index in the unpadded tensor of element k of a tensor padded along one dim (RtPlanParam.pad_*),
 * or -1 for a pad element; k itself when pad_len is 0. */
int64_t rt_unpadded_index(int64_t k, int64_t pad_len, int64_t pad_valid, int64_t pad_inner);

/* ---- checkpoint.c: params files and checkpoints (added with train.c) -------------------------
 *
 * A checkpoint is a directory DIR/step_000500/ (500 = the steps done = the step a resume starts
 * at) holding model.safetensors (the params, F32, named by param path and shaped as declared, so
 * PyTorch's safetensors loads them), optimizer.safetensors (the states with saved = 1, F32, flat)
 * and state.json.  It is written as step_000500.tmp/ and renamed, so a step_NNNNNN directory is
 * always complete. */

typedef struct RtCkptInfo {
  int64_t step;                 /* steps done: the step a resume starts at */
  int64_t seed;                 /* plan->seed of the run that wrote it */
  double loss;                  /* the loss of the last step done (NaN when none) */
  int64_t data_offset;          /* tokens: the first token step `step` reads; -1 otherwise */
  int64_t data_tokens;          /* tokens: how many the run's --data held; -1 otherwise or unknown */
  char plan_hash[128];          /* plan->source_hash ("" when the plan has none) */
  double scaler[3];             /* f16 loss scaling (RtPlan.loss_scaler): the scale, the steps since
                                   its last change, the steps skipped; scaler[0] = 0: none */
} RtCkptInfo;

/* Writes the params as a safetensors file (through PATH.tmp and rename). */
int rt_params_save(const RtRun *run, const char *path, RtError *err);
/* Reads every param by path name; each must be present as F32 with its declared shape. */
int rt_params_load(RtRun *run, const char *path, RtError *err);
/* Writes DIR/step_<info->step>/ (creating DIR); its path goes to out (nout bytes). */
int rt_ckpt_save(const RtRun *run, const char *dir, const RtCkptInfo *info, char *out,
                 size_t nout, RtError *err);
/* The latest complete checkpoint under dir (or dir itself when it holds a state.json). *newer: the
 * step of the newest step_NNNNNN directory past it that lacks its state.json (damaged, or not
 * written by cplan), -1 when none. */
int rt_ckpt_find(const char *dir, char *out, size_t nout, int64_t *newer, RtError *err);
/* Reads ckpt's state.json into info: a whole step (the one its step_NNNNNN name says), seed and
 * data offset, a positive loss scale. */
int rt_ckpt_info(const char *ckpt, RtCkptInfo *info, RtError *err);
/* Restores params and saved states (other states are zeroed) and reads state.json into info. */
int rt_ckpt_load(RtRun *run, const char *ckpt, RtCkptInfo *info, RtError *err);
/* Deletes all but the newest `keep` complete checkpoints under dir (keep <= 0: none). */
int rt_ckpt_prune(const char *dir, int64_t keep, RtError *err);
/* mkdir -p: creates every missing component of dir; 0, or -1 with the error. */
int rt_make_dirs(const char *dir, RtError *err);
/* A cache directory, created: $ENV when that variable is set, else $HOME/.cache/cplan/KIND; sub
 * ("" or "/x") appended. buf on success, NULL with the error. */
const char *rt_cache_dir(const char *env, const char *kind, const char *sub, char *buf, size_t len, RtError *err);

/* ---- comm.c: rt_comm, the communicator of multi-rank runs (MPI backend, for CPU ranks) --------
 *
 * One interface for every collective a plan needs.  A communicator is the world or the group of
 * one mesh axis.  Unlike the rest of this header, a failed MPI call is not returned: the peers
 * are inside the same collective and cannot be told, so it prints the call, the rank and the
 * group, then MPI_Abort()s every rank.  A collective that does not finish within
 * CPLAN_COMM_TIMEOUT seconds (default 300) is a dead or stuck peer: a watchdog thread prints the
 * rank and the collective and aborts every rank, so a run never hangs forever.
 * Checklist: a type added to RtCommType is added to the MPI type table in comm.c. */

typedef enum RtCommType { RT_COMM_F32, RT_COMM_F64, RT_COMM_I64, RT_COMM_U8, RT_COMM_I32, RT_COMM_TYPE_COUNT } RtCommType;

typedef struct RtComm RtComm;

/* The world: MPI_Init_thread unless MPI is already initialized (MPI_Finalize then runs at exit).
 * A program started without mpirun is a world of one rank. */
RtComm *rt_comm_init(int *argc, char ***argv);
/* True when this process was started by an MPI launcher (mpirun, srun), read from the
 * environment without initializing MPI. */
int rt_comm_launched(void);
int rt_comm_rank(const RtComm *c);
int rt_comm_size(const RtComm *c);
const char *rt_comm_name(const RtComm *c); /* "world", "axis dp" */
/* The groups of a mesh whose axis sizes (outermost first, product = the world size) are
 * sizes[0..naxes): groups[i] holds the ranks that differ only in their coordinate along axis i
 * (row-major coordinates of the world rank), ordered by that coordinate.  Free each with
 * rt_comm_free. */
void rt_comm_split_axes(RtComm *world, const int64_t *sizes, const char *const *names, int naxes,
                        RtComm **groups);
void rt_comm_free(RtComm *group);
/* Sum over the group, in place. */
void rt_comm_all_reduce(RtComm *c, void *buf, int64_t count, RtCommType t);
/* Rank r receives the sum over the group of elements [r*count, (r+1)*count) of send. */
void rt_comm_reduce_scatter(RtComm *c, const void *send, void *recv, int64_t count, RtCommType t);
/* recv (size * count elements) gets every rank's count elements, in rank order. */
void rt_comm_all_gather(RtComm *c, const void *send, void *recv, int64_t count, RtCommType t);
/* Block j (count elements) of send goes to rank j; block i of recv comes from rank i. */
void rt_comm_all_to_all(RtComm *c, const void *send, void *recv, int64_t count, RtCommType t);
void rt_comm_broadcast(RtComm *c, void *buf, int64_t count, RtCommType t, int root);
void rt_comm_send(RtComm *c, const void *buf, int64_t count, RtCommType t, int peer, int tag);
void rt_comm_recv(RtComm *c, void *buf, int64_t count, RtCommType t, int peer, int tag);
/* A send that does not wait for the receiver: buf is copied (the caller may reuse it at once).
 * rt_comm_wait_sends waits for every such send of c to complete and frees the copies (the
 * runtime calls it after each step and evaluation; rt_comm_free calls it too). */
void rt_comm_isend(RtComm *c, const void *buf, int64_t count, RtCommType t, int peer, int tag);
void rt_comm_wait_sends(RtComm *c);
void rt_comm_barrier(RtComm *c);
/* Bytes this rank has passed to collectives and sends through c (a measure, not wire bytes). */
uint64_t rt_comm_bytes(const RtComm *c);
/* Prints "rank R: MSG" and stops every rank with exit status code. */
void rt_comm_abort(RtComm *c, int code, const char *msg) __attribute__((noreturn));
/* Frees the world; MPI_Finalize runs at exit when rt_comm_init initialized MPI. */
void rt_comm_finalize(RtComm *world);

/* ---- trace.c: --trace FILE.json and the peak memory report (added with issue 4) ---------------
 *
 * A trace is a Chrome/Perfetto JSON array of complete ("X") events: pid = the rank, tid = a lane
 * (RT_TRACE_COMPUTE: steps, micro-steps, updates, data loading, evaluation, checkpoints;
 * RT_TRACE_COMM: every rt_comm call, with its bytes and group in args), ts and dur in microseconds
 * from the earliest span of any rank.  Recording is process-wide and off until rt_trace_open; the
 * hooks cost one branch when it is off. */

enum { RT_TRACE_COMPUTE = 0, RT_TRACE_COMM = 1 };

/* Starts recording; rank 0 opens path for writing now (so a bad path fails before training). */
int rt_trace_open(const char *path, int rank, RtError *err);
int rt_trace_on(void);
/* Now in microseconds (0 when no trace is open): the t0 of a span. */
double rt_trace_now(void);
/* A compute-lane span named name (a string literal) from t0 to now; step, micro: -1 when none. */
void rt_trace_span(const char *name, double t0, int64_t step, int64_t micro);
/* A comm-lane span of one collective: the call, the group and the bytes rt_comm_bytes counted. */
void rt_trace_comm(const char *name, const char *group, uint64_t bytes, double t0);
/* The step whose metrics line (comm_bytes) counts the collectives from now on: comm events carry
 * it as args.step, so a trace's bytes add up to the metrics'. */
void rt_trace_comm_step(int64_t step);
/* Every rank calls it (a collective when world has several ranks): rank 0 writes every rank's
 * events to the path given to rt_trace_open.  Recording stops. */
int rt_trace_write(RtComm *world, RtError *err);
/* Stops recording and frees everything (also the file, when rt_trace_write was not called). */
void rt_trace_close(void);
/* The process's peak resident set size in bytes (getrusage ru_maxrss), -1 if unknown. */
int64_t rt_peak_rss_bytes(void);

#endif
