/* train.c: rt_main, the main loop of every program `cplanc build` writes (see cplanrt.h).
 *
 * What is the same for every model lives here, so plan.c only holds the specialized step:
 * flags, opening and checking the data, the arenas, param initialization, the step loop with
 * gradient accumulation, evaluation, the metrics JSONL, the progress line, checkpoints and exact
 * resume, SIGINT/SIGTERM, and stopping on a non-finite loss.
 *
 * Data parallelism (plan->dp > 1): the program is one of plan->devices MPI ranks (comm.c).  Each
 * rank feeds its own slice of every global batch, the gradient accumulators are summed over the
 * ranks (one all-reduce of the fused buffer) and scaled by 1/dp before the update, which every
 * rank then applies alike, so the params stay identical (checked by a checksum at checkpoints and
 * at --save).  Loss and metrics are the means over ranks; rank 0 alone prints, writes metrics,
 * checkpoints and --save files; every rank reads --init and --resume files.  A failure on one
 * rank fails every rank: the ranks agree on each step's outcome.
 *
 * Tensor parallelism (plan->tp > 1, issue 4; pure tp for now): the ranks form the grid of
 * plan->plan_axes, each holding shards of the params and states; the generated code exchanges
 * activations over run->axis_comm.  Each shard element is initialized from its global index
 * (plan->global_index), so the values equal a one-device run's; the loss is the sum of the ranks'
 * parts.  --save, --save-init and checkpoints hold whole tensors (every rank assembles them over
 * the tp group, rank 0 writes), and --init and --resume read whole tensors and keep each rank's
 * shards, so files move freely between strategies (checkpoints record plan->resume_hash, which
 * leaves the strategy and mesh out).
 *
 * Everything the run prints goes to stderr (the progress line is for a terminal, the rest is a
 * log); the metrics file is the machine-readable record.  rt_main keeps no global state except
 * the signal flag, which it resets, and it restores the signal handlers it replaced, so it can be
 * called several times in one process (the tests do). */
#include "cplanrt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* OpenBLAS's thread count, when the program links OpenBLAS; weak so the runtime does not. */
extern void openblas_set_num_threads(int) __attribute__((weak));

#define RT_PI 3.14159265358979323846

/* ---- the counter-based generator ------------------------------------------------------------ */

/* uniform = the top 53 bits of splitmix64(splitmix64(splitmix64(seed) ^ key) ^ index) / 2^53:
 * each value depends only on its coordinates, so any shard of any tensor can be generated alone
 * and every strategy and rank count gets the same numbers. */
double rt_uniform(uint64_t seed, uint64_t key, uint64_t index) {
  uint64_t r = rt_splitmix64(rt_splitmix64(rt_splitmix64(seed) ^ key) ^ index);
  return (double)(r >> 11) * 0x1p-53;
}

/* 64-bit FNV-1a of the bytes of s (rt_uniform mixes it further). */
uint64_t rt_hash_str(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

int64_t rt_unpadded_index(int64_t k, int64_t pad_len, int64_t pad_valid, int64_t pad_inner) {
  if (pad_len <= 0) return k;
  int64_t i = k % pad_inner, j = k / pad_inner % pad_len, o = k / (pad_inner * pad_len);
  return j < pad_valid ? (o * pad_valid + j) * pad_inner + i : -1;
}

/* Param init, keyed by (plan->seed, rt_hash_str(path), element index i):
 *   normal(std): std * sqrt(-2 ln(1 - u1)) * cos(2 pi u2), u1 = rt_uniform(seed, key, 2i),
 *                u2 = rt_uniform(seed, key, 2i + 1) (Box-Muller, one value per element);
 *   uniform(lo, hi): lo + (hi - lo) * rt_uniform(seed, key, i);
 *   zeros, ones, full(v): constants.  Values are computed in double, then rounded to f32. */
static void init_param(const RtRun *run, int pk, float *dst) {
  const RtPlan *p = run->plan;
  const RtPlanParam *pp = &p->params[pk];
  uint64_t seed = (uint64_t)p->seed, key = rt_hash_str(pp->name);
  double a = pp->init_a, b = pp->init_b;
  for (int64_t i = 0; i < pp->numel; i++) {
    /* a shard's element takes the value of its global index: the same values as one device */
    int gk = p->param_global ? p->param_global[pk] : pk;
    uint64_t k = (uint64_t)(p->gparams && pp->numel != p->gparams[gk].numel ? p->global_index(0, pk, run->axis_coord, i) : i);
    double v = 0;
    /* a param padded for tp (compiler/vocab_pad.c): its pad elements are zero, the others take the
     * values of their indices in the unpadded tensor (the same values as one device) */
    const RtPlanParam *w = p->gparams ? &p->gparams[gk] : pp;
    int64_t u = rt_unpadded_index((int64_t)k, w->pad_len, w->pad_valid, w->pad_inner);
    k = (uint64_t)(u < 0 ? 0 : u);
    switch (u < 0 ? RT_INIT_ZEROS : pp->init) {
    case RT_INIT_ZEROS: v = 0; break;
    case RT_INIT_ONES: v = 1; break;
    case RT_INIT_FULL: v = a; break;
    case RT_INIT_NORMAL: {
      double u1 = rt_uniform(seed, key, 2 * k), u2 = rt_uniform(seed, key, 2 * k + 1);
      v = a * sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * RT_PI * u2);
      break;
    }
    case RT_INIT_UNIFORM: v = a + (b - a) * rt_uniform(seed, key, k); break;
    }
    dst[i] = (float)v;
  }
}

/* ---- flags ---------------------------------------------------------------------------------- */

typedef struct Opts {
  int64_t steps;                /* -1: plan->steps */
  const char *data, *init, *save_init, *save, *metrics, *ckpt_dir, *resume, *trace;
  int64_t ckpt_every;           /* -1: the plan's */
  int64_t threads;              /* 0: the online CPUs */
  int64_t quiet, help;
} Opts;

typedef enum FlagKind { FLAG_INT, FLAG_STR, FLAG_BOOL } FlagKind;

/* Checklist: a flag added here is read in setup()/train() and tested in test_rt_train.c. */
static const struct Flag {
  const char *name, *arg, *help;
  FlagKind kind;
  size_t off;
  int64_t min;                  /* FLAG_INT: the least value accepted */
} flags[] = {
  {"--steps", "N", "stop after step N (the LR schedule still spans the plan's steps)", FLAG_INT,
   offsetof(Opts, steps), 0},
  {"--data", "PATH", "train on PATH instead of the plan's data file", FLAG_STR,
   offsetof(Opts, data), 0},
  {"--init", "FILE", "load the initial params from a safetensors file (by param path)", FLAG_STR,
   offsetof(Opts, init), 0},
  {"--save-init", "FILE", "write the initial params to FILE, then train", FLAG_STR,
   offsetof(Opts, save_init), 0},
  {"--save", "FILE", "write the final params to FILE (safetensors)", FLAG_STR,
   offsetof(Opts, save), 0},
  {"--metrics", "FILE", "write one JSON object per step to FILE (JSONL)", FLAG_STR,
   offsetof(Opts, metrics), 0},
  {"--checkpoint-dir", "DIR", "write checkpoints under DIR (DIR/step_000500/); without --checkpoint-every, one at the end", FLAG_STR,
   offsetof(Opts, ckpt_dir), 0},
  {"--checkpoint-every", "N", "write a checkpoint every N steps (0: never)", FLAG_INT,
   offsetof(Opts, ckpt_every), 0},
  {"--resume", "DIR", "continue exactly from the latest checkpoint in DIR", FLAG_STR,
   offsetof(Opts, resume), 0},
  {"--trace", "FILE", "write every rank's measured spans (steps, data, collectives) to FILE as a Chrome/Perfetto trace", FLAG_STR,
   offsetof(Opts, trace), 0},
  {"--threads", "N", "compute threads (default: the online CPUs)", FLAG_INT,
   offsetof(Opts, threads), 1},
  {"--quiet", NULL, "print nothing but errors", FLAG_BOOL, offsetof(Opts, quiet), 0},
  {"--help", NULL, "print this help", FLAG_BOOL, offsetof(Opts, help), 0},
};
#define NFLAGS ((int)(sizeof flags / sizeof flags[0]))

/* The name errors start with: the program's, unless it runs from `cplanc run`'s cache, whose
 * file names (model-HASH) mean nothing to a person: then the model's. */
static const char *prog_name(const char *argv0, const RtPlan *p) {
  const char *s = argv0 ? strrchr(argv0, '/') : NULL;
  const char *name = s ? s + 1 : argv0 ? argv0 : "train";
  if (p->model && argv0 && strstr(argv0, ".cplan-cache/")) return p->model;
  return name;
}

static void usage(FILE *fp, const char *prog, const RtPlan *p) {
  fprintf(fp, "usage: %s [flags]\n\nTrains %s (built from %s) for %lld steps.\n\nflags:\n", prog,
          p->model ? p->model : "the model", p->source ? p->source : "?", (long long)p->steps);
  for (int i = 0; i < NFLAGS; i++) {
    char left[40];
    snprintf(left, sizeof left, "%s%s%s", flags[i].name, flags[i].arg ? " " : "",
             flags[i].arg ? flags[i].arg : "");
    fprintf(fp, "  %-24s %s\n", left, flags[i].help);
  }
  fprintf(fp, "\nexit status: 0 done (also after SIGINT/SIGTERM, which checkpoint first), "
              "1 error, 2 bad usage\n");
}

static int parse_int(const char *s, int64_t min, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || v < min || errno == ERANGE) return -1;
  *out = v;
  return 0;
}

/* Sets one flag from its value; -1 with a message in err on bad usage. */
static int set_flag(Opts *o, const struct Flag *f, const char *val, RtError *err) {
  char *field = (char *)o + f->off;
  if (f->kind == FLAG_BOOL) {
    if (val) return rt_errf(err, "%s takes no value", f->name);
    *(int64_t *)field = 1;
    return 0;
  }
  if (!val) return rt_errf(err, "%s needs a value (%s)", f->name, f->arg);
  if (f->kind == FLAG_STR) {
    if (!*val) return rt_errf(err, "%s needs a value (%s), got an empty one", f->name, f->arg);
    *(const char **)field = val;
    return 0;
  }
  if (parse_int(val, f->min, (int64_t *)field) != 0)
    return rt_errf(err, "%s: '%s' is not an integer >= %lld (and below 2^63)", f->name, val, (long long)f->min);
  return 0;
}

/* Accepts "--flag value" and "--flag=value". */
static int parse_flags(int argc, char **argv, Opts *o, RtError *err) {
  *o = (Opts){.steps = -1, .ckpt_every = -1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *eq = strchr(a, '=');
    size_t n = eq ? (size_t)(eq - a) : strlen(a);
    const struct Flag *f = NULL;
    for (int k = 0; k < NFLAGS; k++)
      if (strlen(flags[k].name) == n && !strncmp(flags[k].name, a, n)) f = &flags[k];
    if (!f) return rt_errf(err, "unknown flag '%s' (--help lists them)", a);
    const char *val = eq ? eq + 1 : NULL;
    if (!eq && f->kind != FLAG_BOOL) val = i + 1 < argc ? argv[++i] : NULL;
    if (set_flag(o, f, val, err) != 0) return -1;
  }
  if (o->init && o->resume) return rt_errf(err, "--init and --resume exclude each other");
  return 0;
}

/* The flag values that only make sense against the plan. */
static int check_flags(const Opts *o, const RtPlan *p, RtError *err) {
  if (o->threads > 65536) return rt_errf(err, "--threads %lld: at most 65536", (long long)o->threads);
  if (o->steps > p->steps)
    return rt_errf(err, "--steps %lld is beyond the plan's %lld steps (the schedule's length; rebuild with "
                   "--set train.steps=N to train longer)",
                   (long long)o->steps, (long long)p->steps);
  return 0;
}

/* ---- the trainer ---------------------------------------------------------------------------- */

/* What belongs to one pipeline stage of the rank (see Trainer.stages). */
typedef struct PpStage {
  const RtPlan *p;
  float *params, *state;
  unsigned char *work;
  void **bufs;
  const void **cbufs;
  float *gradbuf;
  int64_t grad_lo, grad_n;
  int nslots;
  unsigned char **slot_work;
  void ***slot_bufs;
} PpStage;

/* One forward (fwd = 1) or backward of micro-batch mb on the rank's stage `chunk`. */
typedef struct PpOp {
  int chunk, fwd;
  int64_t mb;
} PpOp;

typedef struct Trainer {
  const RtPlan *p;
  Opts o;
  const char *prog;
  RtRun run;
  /* data */
  const char *data_path;
  RtTokens *tok, *val_tok;
  RtAdder *adder;
  RtTensorSource *ts, *val_ts;
  int has_val;
  void **bufs;                  /* one micro-batch per input */
  const void **cbufs;           /* the same pointers, as micro_step takes them */
  double *mets, *msum;          /* metrics of a micro-batch, and their sum */
  /* the run */
  int64_t start, stop;
  const char *ckpt_dir;         /* NULL: no periodic checkpoints */
  int64_t ckpt_every, ckpt_keep;
  int64_t last_ckpt;            /* the step of the last checkpoint written, -1: none */
  FILE *metrics;
  int tty, verbose;
  int live;                     /* a progress line is on the terminal, not yet ended */
  double loss;                  /* of the last step */
  double time_sum;              /* seconds of the steps after the first, for the ETA */
  int64_t timed;
  /* data parallelism */
  RtComm *world;                /* NULL: a single-rank run (MPI is never initialized) */
  int rank, nranks;
  float *gradbuf;               /* the gradient accumulators packed, when not contiguous */
  int64_t grad_lo, grad_n;      /* or their span of run.state, all-reduced in place */
  int stop_agreed;              /* a signal reached some rank (multi-rank runs) */
  uint64_t comm_bytes;          /* rt_comm_bytes before this step */
  int ready;                    /* setup succeeded on every rank: the end-of-run collectives run */
  /* pipeline parallelism: the micro-batches in flight, each with its arena and input buffers */
  int nslots;
  unsigned char **slot_work;
  void ***slot_bufs;
  PpOp *ops;                    /* one step's forwards and backwards on this rank, in order */
  int64_t nops;
  /* The interleaved schedule: the rank runs nstages pipeline stages (RtPlan.pp_chunks), each with
   * its own plan, params, states, arenas and input buffers. The fields above that belong to one
   * stage (p, run.plan/params/state/work, bufs, cbufs, gradbuf, grad_lo, grad_n and the slots)
   * hold stage `cur`'s; stage_use swaps another in, so the code written for one stage (allocation,
   * init, the dp reduction, files) runs per stage. Outside a loop over the stages, cur is 0. */
  int nstages, cur;
  PpStage *stages;
  /* cross_entropy over the step's targets (ce_weights): RtRun.ce_weight's table, and the counts */
  double *cew, *ce_cnt;
  int64_t cew_n, ce_cnt_n;
} Trainer;

/* The rank's pipeline stages (1 unless interleaved). */
static int nstages(const Trainer *t) { return t->nstages > 1 ? t->nstages : 1; }

/* Stage k's fields, read without swapping it in. */
static PpStage stage_view(const Trainer *t, int k) {
  if (t->nstages <= 1 || k == t->cur)
    return (PpStage){t->p, t->run.params, t->run.state, t->run.work, t->bufs, t->cbufs, t->gradbuf, t->grad_lo,
                     t->grad_n, t->nslots, t->slot_work, t->slot_bufs};
  return t->stages[k];
}

/* This rank's params (what = 0), optimizer state and gradients (1) or work arenas (2) in bytes,
 * over its pipeline stages (each has one work arena per slot). */
static int64_t rank_bytes(const Trainer *t, int what) {
  int64_t b = 0;
  for (int k = 0; k < nstages(t); k++) {
    PpStage s = stage_view(t, k);
    b += what == 0 ? 4 * s.p->param_floats : what == 1 ? 4 * s.p->state_floats : s.p->work_bytes * (s.nslots > 1 ? s.nslots : 1);
  }
  return b;
}

/* Makes stage k the one the Trainer's per-stage fields hold. */
static void stage_use(Trainer *t, int k) {
  if (t->nstages <= 1 || k == t->cur) return;
  t->stages[t->cur] = stage_view(t, t->cur);
  const PpStage *n = &t->stages[k];
  t->p = t->run.plan = n->p;
  t->run.params = n->params, t->run.state = n->state, t->run.work = n->work;
  t->bufs = n->bufs, t->cbufs = n->cbufs;
  t->gradbuf = n->gradbuf, t->grad_lo = n->grad_lo, t->grad_n = n->grad_n;
  t->nslots = n->nslots, t->slot_work = n->slot_work, t->slot_bufs = n->slot_bufs;
  t->cur = k;
}

static volatile sig_atomic_t stop_signal;
static struct timespec stop_at; /* when stop_signal came */

/* The first SIGINT or SIGTERM asks the run to stop after its step (and checkpoint); another one
 * a second or more later kills a run that is slow to finish its step. One sooner is the same
 * request delivered twice: timeout(1) and some launchers signal the process, then its group. */
static void on_signal(int sig) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  if (!stop_signal) {
    stop_at = now;
    stop_signal = sig;
    return;
  }
  if ((double)(now.tv_sec - stop_at.tv_sec) + (double)(now.tv_nsec - stop_at.tv_nsec) * 1e-9 < 1.0) return;
  signal(sig, SIG_DFL);
  raise(sig);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void say(Trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A log line on stderr, unless --quiet; on a terminal it first clears the progress line. */
static void say(Trainer *t, const char *fmt, ...) {
  if (!t->verbose) return;
  if (t->live) fputs("\r\033[K", stderr);
  t->live = 0;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static int fail(const Trainer *t, const char *msg) {
  if (!*msg) return 1; /* another rank failed and said why */
  if (t->live) fputs("\r\033[K", stderr);
  if (t->nranks > 1) fprintf(stderr, "%s: rank %d: error: %s\n", t->prog, t->rank, msg);
  else fprintf(stderr, "%s: error: %s\n", t->prog, msg);
  return 1;
}

static int64_t input_numel(const RtPlanInput *in) {
  int64_t n = 1;
  for (int d = 0; d < in->rank; d++) n *= in->shape[d];
  return n;
}

/* ---- setup: data ------------------------------------------------------------------------------ */

/* Tokens and adder data feed (inputs, targets): two [micro, T] int32 inputs. */
static int check_seq_inputs(const RtPlan *p, RtError *err) {
  if (p->ninputs != 2) return rt_errf(err, "token data feeds 2 inputs, the model has %d", p->ninputs);
  for (int i = 0; i < 2; i++) {
    const RtPlanInput *in = &p->inputs[i];
    if (in->dtype != RT_I32 || in->rank != 2 || in->shape[0] != p->micro ||
        in->shape[1] != p->seq_len)
      return rt_errf(err, "input '%s' must be i32 [%lld, %lld] to take token data", in->name,
                     (long long)p->micro, (long long)p->seq_len);
  }
  return 0;
}

static int open_tokens(Trainer *t, RtError *err) {
  const RtPlan *p = t->p;
  int vocab = p->vocab > 0 && p->vocab < 65536 ? (int)p->vocab : 65536;
  if (!(t->tok = rt_tokens_open(t->data_path, vocab, err))) return -1;
  if (rt_tokens_steps(t->tok, p->batch, p->seq_len, err) < 0) return -1;
  if (p->val_path) {
    if (!(t->val_tok = rt_tokens_open(p->val_path, vocab, err))) return -1;
    if (rt_tokens_steps(t->val_tok, p->batch, p->seq_len, err) < 0) return -1;
    t->has_val = 1;
  }
  return 0;
}

static int open_adder(Trainer *t, RtError *err) {
  const RtPlan *p = t->p;
  if (t->o.data) return rt_errf(err, "--data: adder data is generated, it has no file");
  if (p->vocab > 0 && p->vocab < RT_ADD_VOCAB)
    return rt_errf(err, "adder data has %d tokens but the model's vocab is %lld", RT_ADD_VOCAB,
                   (long long)p->vocab);
  if (p->seq_len + 1 < 3 * (int64_t)p->digits + 3)
    return rt_errf(err, "adder(digits = %d) needs a sequence length of at least %d, the model "
                   "has %lld", p->digits, 3 * p->digits + 2, (long long)p->seq_len);
  if (!(t->adder = rt_adder_open(p->digits, p->seed, err))) return -1;
  t->has_val = 1;
  return 0;
}

/* Every plan input must be in the file with the plan's dtype and per-sample shape. */
static int check_tensors(const Trainer *t, const RtTensorSource *s, const char *path,
                         RtError *err) {
  const RtPlan *p = t->p;
  for (int i = 0; i < p->ninputs; i++) {
    const RtPlanInput *in = &p->inputs[i];
    const RtStTensor *st = rt_tsrc_input(s, i);
    int ok = st->dtype == in->dtype && st->ndim == in->rank;
    for (int d = 1; ok && d < in->rank; d++) ok = st->shape[d] == in->shape[d];
    if (!ok)
      return rt_errf(err, "%s: tensor '%s' is %s with %d dims, the model wants %s [N, ...] of "
                     "rank %d matching its input", path, in->name, rt_dtype_name(st->dtype),
                     st->ndim, rt_dtype_name(in->dtype), in->rank);
  }
  return 0;
}

static int open_tensors(Trainer *t, RtError *err) {
  const RtPlan *p = t->p;
  const char **names = calloc((size_t)p->ninputs + 1, sizeof *names);
  if (!names) return rt_errf(err, "out of memory");
  for (int i = 0; i < p->ninputs; i++) names[i] = p->inputs[i].name;
  int rc = -1;
  if ((t->ts = rt_tsrc_open(t->data_path, names, p->ninputs, err)) &&
      check_tensors(t, t->ts, t->data_path, err) == 0) {
    rc = 0;
    if (p->val_path) {
      rc = -1;
      if ((t->val_ts = rt_tsrc_open(p->val_path, names, p->ninputs, err)) &&
          check_tensors(t, t->val_ts, p->val_path, err) == 0)
        rc = 0, t->has_val = 1;
    }
  }
  free(names);
  return rc;
}

static int open_data(Trainer *t, RtError *err) {
  const RtPlan *p = t->p;
  t->data_path = t->o.data ? t->o.data : p->data_path;
  switch (p->data_kind) {
  case RT_DATA_TOKENS:
    if (check_seq_inputs(p, err) != 0) return -1;
    return open_tokens(t, err);
  case RT_DATA_ADDER:
    if (check_seq_inputs(p, err) != 0) return -1;
    return open_adder(t, err);
  case RT_DATA_TENSORS: return open_tensors(t, err);
  }
  return rt_errf(err, "unknown data kind %d", (int)p->data_kind);
}

/* Fills the input buffers with micro-batch m of step `step` (of evaluation batch `step`). */
static int fill_inputs(Trainer *t, int eval, int64_t step, int64_t m, RtError *err) {
  const RtPlan *p = t->p;
  int64_t j0 = (t->run.dp_rank * p->accum + m) * p->micro, j1 = j0 + p->micro;
  switch (p->data_kind) {
  case RT_DATA_TOKENS:
    return rt_tokens_batch(eval ? t->val_tok : t->tok, p->batch, p->seq_len, step, j0, j1,
                           t->bufs[0], t->bufs[1], err);
  case RT_DATA_ADDER:
    return rt_adder_batch(t->adder, eval, p->batch, p->seq_len, step, j0, j1, t->bufs[0],
                          t->bufs[1], err);
  case RT_DATA_TENSORS:
    for (int i = 0; i < p->ninputs; i++)
      if (rt_tsrc_batch(eval ? t->val_ts : t->ts, i, p->batch, step, j0, j1, t->bufs[i], err))
        return -1;
    return 0;
  }
  return -1;
}

static int64_t plan_dp(const RtPlan *p);
static RtComm *dp_group(Trainer *t);

/* The targets of d in one micro-batch's input x (RtCeTarget), or -1 when d does not fit the input. */
static int64_t ce_count_input(const RtCeTarget *d, const RtPlanInput *in, const int32_t *x) {
  int64_t outer = 1, len = 1, inner = 1, lo, hi, n = 0;
  for (int k = 0; k < in->rank; k++) {
    int64_t e = in->shape[k];
    if (d->dim < 0 || k == d->dim) len *= e;
    else if (k < d->dim) outer *= e;
    else inner *= e;
  }
  lo = d->dim < 0 ? 0 : d->lo, hi = d->dim < 0 ? len : d->hi;
  if (d->dim >= in->rank || lo < 0 || hi > len || lo > hi) return -1;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = lo; j < hi; j++) {
      const int32_t *r = x + (o * len + j) * inner;
      for (int64_t i = 0; i < inner; i++) n += r[i] != -1 && r[i] != d->ignore[0] && r[i] != d->ignore[1];
    }
  return n;
}

/* Whether the runtime counts d's targets: an i32 input, and not token data with nothing ignored but
 * -1 (which tokens never are: every micro-batch counts all of its targets). */
static int ce_countable(const RtPlan *p, const RtCeTarget *d) {
  if (d->input < 0 || d->input >= p->ninputs || p->inputs[d->input].dtype != RT_I32) return 0;
  return !(p->data_kind == RT_DATA_TOKENS && d->ignore[0] == -1 && d->ignore[1] == -1);
}

/* cross_entropy's mean over the targets not ignored in the whole step (docs/language.md, Batches):
 * before the micro-batches of step `step` (evaluation batch `step` when eval), counts each node's
 * targets n_m in every micro-batch m of this rank's data, sums them over the dp group into N and sets
 * RtRun.ce_weight[k * accum + m] = n_m * accum * dp / N (1 when N is 0, or the node's targets are not
 * an input). One micro-batch per step and rank: no weights. The micro-batches' data is read twice. */
static int ce_weights(Trainer *t, int eval, int64_t step, RtError *err) {
  const RtPlan *p = t->p;
  int64_t A = p->accum, D = plan_dp(p), nd = 0, kmax = 0;
  t->run.ce_weight = t->run.ce_weight_dp = NULL;
  if (A * D <= 1) return 0;
  for (int k = 0; k < nstages(t); k++) {
    const RtPlan *q = stage_view(t, k).p;
    for (int j = 0; j < q->nce; j++) {
      nd += ce_countable(q, &q->ce_targets[j]);
      if (q->ce_targets[j].ce + 1 > kmax) kmax = q->ce_targets[j].ce + 1;
    }
  }
  if (nd == 0) return 0;
  /* cew: ce_weight, then ce_weight_dp; ce_cnt: this rank's counts per micro-batch, then (summed over
   * dp in one all-reduce) each node's total and its counts per micro-batch */
  if (t->cew_n < 2 * kmax * A) {
    free(t->cew);
    if (!(t->cew = malloc((size_t)(2 * kmax * A) * sizeof *t->cew))) return rt_errf(err, "out of memory");
    t->cew_n = 2 * kmax * A;
  }
  if (t->ce_cnt_n < nd * (2 * A + 1)) {
    free(t->ce_cnt);
    if (!(t->ce_cnt = malloc((size_t)(nd * (2 * A + 1)) * sizeof *t->ce_cnt))) return rt_errf(err, "out of memory");
    t->ce_cnt_n = nd * (2 * A + 1);
  }
  double *cnt = t->ce_cnt, *tot = t->ce_cnt + nd * A, *cnt_dp = tot + nd, *cew_dp = t->cew + kmax * A;
  for (int64_t e = 0; e < 2 * kmax * A; e++) t->cew[e] = 1;
  int64_t j = 0;
  for (int k = 0; k < nstages(t); k++) {
    stage_use(t, k);
    const RtPlan *q = t->p;
    int64_t j0 = j;
    for (int64_t m = 0; m < A; m++) {
      j = j0;
      int fill = 0;
      for (int e = 0; e < q->nce; e++) {
        const RtCeTarget *d = &q->ce_targets[e];
        if (!ce_countable(q, d)) continue;
        if (!fill++ && fill_inputs(t, eval, step, m, err) != 0) {
          stage_use(t, 0);
          return -1;
        }
        int64_t c = ce_count_input(d, &q->inputs[d->input], (const int32_t *)t->bufs[d->input]);
        if (c < 0) {
          stage_use(t, 0);
          return rt_errf(err, "cross_entropy %d: its targets do not fit input '%s' (a bug in cplan)", d->ce,
                         q->inputs[d->input].name);
        }
        cnt[j++ * A + m] = (double)c;
      }
    }
  }
  stage_use(t, 0);
  for (j = 0; j < nd; j++) {
    tot[j] = 0;
    for (int64_t m = 0; m < A; m++) tot[j] += cnt[j * A + m];
  }
  memcpy(cnt_dp, cnt, (size_t)(nd * A) * sizeof *cnt);
  if (D > 1) rt_comm_all_reduce(dp_group(t), tot, nd * (A + 1), RT_COMM_F64);
  j = 0;
  for (int k = 0; k < nstages(t); k++) {
    const RtPlan *q = stage_view(t, k).p;
    for (int e = 0; e < q->nce; e++) {
      const RtCeTarget *d = &q->ce_targets[e];
      if (!ce_countable(q, d)) continue;
      for (int64_t m = 0; m < A && tot[j] > 0; m++) {
        t->cew[d->ce * A + m] = cnt[j * A + m] * (double)(A * D) / tot[j];
        cew_dp[d->ce * A + m] = cnt_dp[j * A + m] * (double)A / tot[j];
      }
      j++;
    }
  }
  t->run.ce_weight = t->cew;
  t->run.ce_weight_dp = cew_dp;
  t->run.ce_stride = A;
  return 0;
}

/* ---- data parallelism ------------------------------------------------------------------------ */

static int64_t plan_dp(const RtPlan *p) { return p->dp > 0 ? p->dp : 1; }
static int64_t plan_tp(const RtPlan *p) { return p->tp > 1 ? p->tp : 1; }
static int64_t plan_pp(const RtPlan *p) { return p->pp > 1 ? p->pp : 1; }
/* the group data parallelism reduces over: the dp axis's (the world without tensor parallelism) */
/* a lowered plan (tensor parallelism, ZeRO): params and states are this rank's shards */
static int lowered(const RtPlan *p) { return p->gparams != NULL; }
static RtComm *dp_group(Trainer *t) { return t->p->dp_axis >= 0 && lowered(t->p) ? t->run.axis_comm[t->p->dp_axis] : t->world; }
/* whether the runtime reduces state i over the dp group: a gradient accumulator held whole on
 * the dp axis (ZeRO 2 and 3 reduce-scatter theirs in the graph) */
static int runtime_reduced(const RtPlan *p, int i) {
  if (p->states[i].saved || (p->state_part_to && p->state_part_to[i] >= 0)) return 0; /* the owner's is */
  return !lowered(p) || p->states[i].reduce;
}
static int64_t plan_devices(const RtPlan *p) { return p->devices > 0 ? p->devices : 1; }

/* Every rank learns whether any rank failed (rc != 0 there) and returns -1 if so.  A rank that
 * did not fail gets an empty message: the failing rank has printed why. */
static int agree(Trainer *t, int rc, RtError *err) {
  if (t->nranks <= 1) return rc;
  double bad = rc != 0;
  rt_comm_all_reduce(t->world, &bad, 1, RT_COMM_F64);
  if (bad == 0) return 0;
  if (rc == 0 && err) err->msg[0] = 0;
  return -1;
}

/* Where the all-reduce of the gradient accumulators (the states with saved = 0) works: in place
 * on their span of run.state when no optimizer state lies inside it (the padding between them is
 * zero on every rank), else through a packed copy. */
static int plan_grads(Trainer *t, RtError *err) {
  const RtPlan *p = t->p;
  int64_t lo = INT64_MAX, hi = 0, n = 0;
  for (int i = 0; i < p->nstates; i++) {
    const RtPlanState *st = &p->states[i];
    if (!runtime_reduced(p, i)) continue;
    lo = st->offset < lo ? st->offset : lo;
    hi = st->offset + st->numel > hi ? st->offset + st->numel : hi;
    n += st->numel;
  }
  t->grad_lo = lo, t->grad_n = hi > lo ? hi - lo : 0;
  for (int i = 0; i < p->nstates && t->grad_n; i++) {
    const RtPlanState *st = &p->states[i];
    if (!runtime_reduced(p, i) && st->offset < hi && st->offset + st->numel > lo) {
      t->grad_lo = -1, t->grad_n = n;
      if (!(t->gradbuf = malloc((size_t)n * sizeof(float) + 1)))
        return rt_errf(err, "out of memory for the gradient buffer (%lld floats)", (long long)n);
      break;
    }
  }
  return 0;
}

/* Sums the gradient accumulators over the ranks and scales them by 1/dp: each rank seeded its
 * micro-batches with 1/accum, so the result is the mean over the global batch, as on one device.
 * A lowered plan's seed carries the 1/dp already: there they are only summed (cplanrt.h). */
static int all_reduce_grads(Trainer *t, RtError *err) {
  const RtPlan *p = t->p;
  float scale = lowered(p) ? 1.0f : (float)(1.0 / (double)plan_dp(p)), *g = t->gradbuf;
  if (p->reduce_grads) return p->reduce_grads(&t->run, dp_group(t), scale, err); /* on the device */
  if (!t->grad_n) return 0;
  if (!g) {
    g = t->run.state + t->grad_lo;
    rt_comm_all_reduce(dp_group(t), g, t->grad_n, RT_COMM_F32);
    if (scale != 1.0f)
      for (int64_t i = 0; i < t->grad_n; i++) g[i] *= scale;
    return 0;
  }
  int64_t k = 0;
  for (int i = 0; i < p->nstates; i++)
    if (runtime_reduced(p, i)) {
      memcpy(g + k, t->run.state + p->states[i].offset, (size_t)p->states[i].numel * sizeof *g);
      k += p->states[i].numel;
    }
  rt_comm_all_reduce(dp_group(t), g, k, RT_COMM_F32);
  k = 0;
  for (int i = 0; i < p->nstates; i++) {
    if (!runtime_reduced(p, i)) continue;
    float *dst = t->run.state + p->states[i].offset;
    for (int64_t e = 0; e < p->states[i].numel; e++) dst[e] = g[k + e] * scale;
    k += p->states[i].numel;
  }
  return 0;
}

/* Means over the ranks of sums[0..n) (each rank's sums over `per_rank` micro-batches), and
 * whether a stop signal reached any rank; a single rank just divides. */
static void reduce_means(Trainer *t, double *sums, int n, int64_t per_rank) {
  double div = (double)per_rank;
  if (t->nranks > 1) {
    sums[n] = stop_signal != 0;
    rt_comm_all_reduce(t->world, sums, n + 1, RT_COMM_F64);
    t->stop_agreed = sums[n] > 0;
    /* the tp ranks' losses are parts of one (summed); only the last pipeline stage has them */
    div *= (double)(t->nranks / (plan_tp(t->p) * plan_pp(t->p)));
  }
  for (int i = 0; i < n; i++) sums[i] /= div;
}

/* In pure dp the params are the same on every rank: compare a checksum of them (FNV-1a of the
 * bytes) before a rank-0 file claims to hold everyone's params. */
static int check_replicas(Trainer *t, RtError *err) {
  if (t->nranks <= 1) return 0;
  if (lowered(t->p)) return 0; /* ranks hold different shards */
  uint64_t h = 0xcbf29ce484222325ull;
  const unsigned char *b = (const unsigned char *)t->run.params;
  for (size_t i = 0; i < (size_t)t->p->param_floats * sizeof(float); i++) h = (h ^ b[i]) * 0x100000001b3ull;
  int64_t mine = (int64_t)h, *all = calloc((size_t)t->nranks, sizeof *all);
  if (!all) return rt_errf(err, "out of memory");
  rt_comm_all_gather(t->world, &mine, all, 1, RT_COMM_I64);
  int bad = -1;
  for (int q = 1; q < t->nranks && bad < 0; q++)
    if (all[q] != all[0]) bad = q;
  free(all);
  if (bad >= 0)
    return rt_errf(err, "the params of rank %d differ from rank 0's: the data-parallel replicas "
                   "diverged (a bug in cplan: please report it)", bad);
  return 0;
}

/* ---- lowered plans: whole tensors for files -------------------------------------------------- */

/* The index among the whole params (states) of this plan's param (state) k. */
static int global_k(const RtPlan *p, int state, int k) {
  const int *m = state ? p->state_global : p->param_global;
  return m ? m[k] : k;
}

/* Every rank gets the whole params (states when state) in the one-device layout: each rank places
 * its shard's elements at their global indices, if it is the first (coordinate 0) on every axis
 * that holds the tensor whole (and, in a pipeline, its stage owns it), and the world sums the
 * parts, which is exact as each element comes from exactly one rank. Out of memory stops every
 * rank. */
static float *whole(Trainer *t, int state) {
  float *w = calloc((size_t)(state ? t->p->gstate_floats : t->p->gparam_floats) + 1, sizeof *w);
  if (!w) rt_comm_abort(t->world, 1, "out of memory for the whole params");
  for (int s = 0; s < nstages(t); s++) { /* each of the rank's pipeline stages places its own */
    stage_use(t, s);
    const RtPlan *p = t->p;
    int n = state ? p->nstates : p->nparams;
    for (int k = 0; k < n; k++) {
      /* a pipeline stage writes what it owns (a partial gradient accumulator: its owner's state) */
      int lead = state ? !p->state_part_to || p->state_part_to[k] < 0 : !p->param_owned || p->param_owned[k];
      for (int a = 0; a < p->nplan_axes; a++)
        if (p->split_dim(state, k, a) < 0 && t->run.axis_coord[a] != 0) lead = 0;
      if (!lead) continue;
      int gk = global_k(p, state, k);
      int64_t ln = state ? p->states[k].numel : p->params[k].numel, gn = state ? p->gstates[gk].numel : p->gparams[gk].numel;
      int64_t lo = state ? p->states[k].offset : p->params[k].offset, go = state ? p->gstates[gk].offset : p->gparams[gk].offset;
      const float *src = (state ? t->run.state : t->run.params) + lo;
      for (int64_t l = 0; l < ln; l++) w[go + (ln == gn ? l : p->global_index(state, k, t->run.axis_coord, l))] = src[l];
    }
  }
  stage_use(t, 0);
  rt_comm_all_reduce(t->world, w, state ? t->p->gstate_floats : t->p->gparam_floats, RT_COMM_F32);
  return w;
}

/* This rank's shards out of whole tensors (whole's inverse), for each of its pipeline stages. */
static void scatter(Trainer *t, int state, const float *w) {
  for (int s = 0; s < nstages(t); s++) {
    stage_use(t, s);
    const RtPlan *p = t->p;
    int n = state ? p->nstates : p->nparams;
    for (int k = 0; k < n; k++) {
      int gk = global_k(p, state, k);
      int64_t ln = state ? p->states[k].numel : p->params[k].numel, gn = state ? p->gstates[gk].numel : p->gparams[gk].numel;
      int64_t lo = state ? p->states[k].offset : p->params[k].offset, go = state ? p->gstates[gk].offset : p->gparams[gk].offset;
      float *dst = (state ? t->run.state : t->run.params) + lo;
      for (int64_t l = 0; l < ln; l++) dst[l] = w[go + (ln == gn ? l : p->global_index(state, k, t->run.axis_coord, l))];
    }
  }
  stage_use(t, 0);
}

/* A run over whole tensors wp, ws (either may be NULL) with the one-device layout gp. */
static RtRun whole_run(const Trainer *t, RtPlan *gp, float *wp, float *ws) {
  *gp = *t->p;
  gp->params = gp->gparams, gp->param_floats = gp->gparam_floats;
  gp->states = gp->gstates, gp->state_floats = gp->gstate_floats;
  if (gp->ngparams) gp->nparams = gp->ngparams, gp->nstates = gp->ngstates; /* a pipeline stage's */
  gp->param_global = gp->state_global = NULL, gp->param_owned = NULL;
  gp->tp = 0;
  RtRun r = t->run;
  r.plan = gp, r.params = wp, r.state = ws;
  return r;
}

/* --save and --save-init: rank 0 writes the whole params. */
static int save_params(Trainer *t, const char *path, RtError *err) {
  if (!lowered(t->p)) return t->rank == 0 ? rt_params_save(&t->run, path, err) : 0;
  RtPlan gp;
  float *wp = whole(t, 0);
  RtRun r = whole_run(t, &gp, wp, NULL);
  int rc = t->rank == 0 ? rt_params_save(&r, path, err) : 0;
  free(wp);
  return rc;
}

/* ---- setup: memory, params, flags ------------------------------------------------------------ */

/* The order of one step's forwards and backwards on the rank whose first stage plan p is (2 x
 * accum x stages ops). GPipe: every forward, then every backward. 1F1B: P - 1 - stage forwards,
 * then one forward and one backward at a time, then the remaining backwards. Interleaved (V = 2
 * stages per rank, micro-batches M a multiple of P; Megatron's forward_backward_pipelining_with_
 * interleaving): virtual forward k runs micro-batch (k / PV) P + k mod P on the rank's stage
 * (k mod PV) / P, virtual backward k the same micro-batch on the stage V - 1 - that; first
 * (P - 1 - c) 2 + (V - 1) P forwards (all of them when M = P), then one forward and one backward
 * at a time, then the remaining backwards. Each stage runs its forwards and its backwards in
 * micro-batch order. Sends do not wait, receives do, and in this order every receive's send
 * comes first on its rank (tests/e2e/pp.sh runs it; no order of these ever waits on itself). */
static int64_t pp_order(const RtPlan *p, PpOp *ops) {
  int64_t P = plan_pp(p), V = p->pp_chunks > 1 ? p->pp_chunks : 1, M = p->accum, n = 0, c = p->stage;
  if (V == 1) {
    int64_t warm = p->pp_schedule == 1 ? M : P - 1 - c, f = 0, b = 0;
    if (warm > M) warm = M;
    for (; f < warm; f++) ops[n++] = (PpOp){0, 1, f};
    for (; f < M; f++, b++) ops[n++] = (PpOp){0, 1, f}, ops[n++] = (PpOp){0, 0, b};
    for (; b < M; b++) ops[n++] = (PpOp){0, 0, b};
    return n;
  }
  int64_t total = M * V, warm = M == P ? total : (P - 1 - c) * 2 + (V - 1) * P;
  if (warm > total) warm = total;
#define PP_FWD(k) ((PpOp){(int)((k) % (P * V) / P), 1, (k) / (P * V) * P + (k) % P})
#define PP_BWD(k) ((PpOp){(int)(V - 1 - (k) % (P * V) / P), 0, (k) / (P * V) * P + (k) % P})
  for (int64_t k = 0; k < warm; k++) ops[n++] = PP_FWD(k);
  for (int64_t k = 0; k < total - warm; k++) ops[n++] = PP_FWD(k + warm), ops[n++] = PP_BWD(k);
  for (int64_t k = total - warm; k < total; k++) ops[n++] = PP_BWD(k);
#undef PP_FWD
#undef PP_BWD
  return n;
}

/* Pipeline parallelism: the micro-batches stage `cur` has in flight at most in the order of
 * t->ops (1F1B: the stages from it to the last; GPipe: all of a step's), each with its own arena
 * and input buffers. Slot 0 is run.work and bufs. */
static int alloc_slots(Trainer *t, size_t work, RtError *err) {
  const RtPlan *p = t->p;
  int64_t in = 0, most = 1;
  for (int64_t k = 0; k < t->nops; k++)
    if (t->ops[k].chunk == t->cur) {
      in += t->ops[k].fwd ? 1 : -1;
      most = in > most ? in : most;
    }
  t->nslots = (int)most;
  t->slot_work = calloc((size_t)t->nslots, sizeof *t->slot_work);
  t->slot_bufs = calloc((size_t)t->nslots, sizeof *t->slot_bufs);
  if (!t->slot_work || !t->slot_bufs) return rt_errf(err, "out of memory");
  t->slot_work[0] = t->run.work;
  t->slot_bufs[0] = t->bufs;
  for (int q = 1; q < t->nslots; q++) {
    if (!(t->slot_work[q] = aligned_alloc(64, work ? work : 64))) return rt_errf(err, "out of memory for %d arenas", t->nslots);
    memset(t->slot_work[q], 0, work);
    if (!(t->slot_bufs[q] = calloc((size_t)p->ninputs + 1, sizeof(void *)))) return rt_errf(err, "out of memory");
    for (int i = 0; i < p->ninputs; i++)
      if (!(t->slot_bufs[q][i] = calloc((size_t)input_numel(&p->inputs[i]) + 1, 4))) return rt_errf(err, "out of memory");
  }
  return 0;
}

/* A GPU plan's to_device (to_dev 1) or to_host hook, for each of the rank's pipeline stages (each
 * keeps its own device state); 0, or -1 with the error. */
static int device_hook(Trainer *t, int to_dev, RtError *err) {
  int rc = 0;
  for (int k = 0; k < nstages(t) && rc == 0; k++) {
    stage_use(t, k);
    int (*f)(RtRun *, RtError *) = to_dev ? t->p->to_device : t->p->to_host;
    if (f) rc = f(&t->run, err);
  }
  stage_use(t, 0);
  return rc;
}

/* The f16 loss scaler's state (RtPlan.loss_scaler): read from the rank's first stage, set in each. */
static void scaler_hook(Trainer *t, double st[3], int set) {
  for (int k = 0; k < (set ? nstages(t) : 1); k++)
    if (stage_view(t, k).p->loss_scaler) stage_view(t, k).p->loss_scaler(st, set);
}

/* The params, states, arenas and input buffers of stage cur. */
static int alloc_stage(Trainer *t, RtError *err) {
  const RtPlan *p = t->p;
  RtRun *r = &t->run;
  size_t work = ((size_t)p->work_bytes + 63) / 64 * 64;
  r->plan = p;
  r->params = calloc((size_t)p->param_floats + 1, sizeof(float));
  r->state = calloc((size_t)p->state_floats + 1, sizeof(float));
  r->work = aligned_alloc(64, work ? work : 64);
  if (!r->params || !r->state || !r->work)
    return rt_errf(err, "out of memory: params %lld, state %lld and work %lld bytes",
                   (long long)p->param_floats * 4, (long long)p->state_floats * 4,
                   (long long)p->work_bytes);
  memset(r->work, 0, work); /* generated code never reads it first; this keeps runs identical */
  t->bufs = calloc((size_t)p->ninputs + 1, sizeof *t->bufs);
  t->cbufs = calloc((size_t)p->ninputs + 1, sizeof *t->cbufs);
  if (!t->bufs || !t->cbufs) return rt_errf(err, "out of memory");
  if (t->nranks > 1 && plan_grads(t, err) != 0) return -1;
  if (plan_pp(p) > 1 && alloc_slots(t, work, err) != 0) return -1;
  for (int i = 0; i < p->ninputs; i++) {
    t->bufs[i] = calloc((size_t)input_numel(&p->inputs[i]) + 1, 4);
    if (!t->bufs[i]) return rt_errf(err, "out of memory for input '%s'", p->inputs[i].name);
    t->cbufs[i] = t->bufs[i];
  }
  return 0;
}

/* The plan whose metrics the run reports: under pipeline parallelism the last stage's, the only
 * one that computes them (the other stages add nothing, so every rank reduces and reports the same
 * metrics), else the plan's own. */
static const RtPlan *metrics_plan(const Trainer *t) {
  const RtPlan *p = t->p;
  if (plan_pp(p) <= 1 || !p->stage_plans) return p;
  return p->stage_plans[plan_pp(p) * (p->pp_chunks > 1 ? p->pp_chunks : 1) - 1];
}

static int alloc_all(Trainer *t, RtError *err) {
  int nm = 0;
  if (plan_pp(t->p) > 1) {
    int64_t n = 2 * t->p->accum * nstages(t);
    if (!(t->ops = calloc((size_t)n, sizeof *t->ops))) return rt_errf(err, "out of memory");
    t->nops = pp_order(t->p, t->ops);
  }
  for (int k = 0; k < nstages(t); k++) {
    stage_use(t, k);
    if (alloc_stage(t, err) != 0) return -1;
    nm = t->p->nmetrics > nm ? t->p->nmetrics : nm;
  }
  stage_use(t, 0);
  nm = metrics_plan(t)->nmetrics > nm ? metrics_plan(t)->nmetrics : nm;
  t->mets = calloc((size_t)nm + 1, sizeof *t->mets);
  t->msum = calloc((size_t)nm + 2, sizeof *t->msum); /* + loss and stop flag */
  if (!t->mets || !t->msum) return rt_errf(err, "out of memory");
  return 0;
}

static void free_stage(Trainer *t) {
  for (int q = 1; q < t->nslots; q++) {
    free(t->slot_work ? t->slot_work[q] : NULL);
    for (int i = 0; t->slot_bufs && t->slot_bufs[q] && i < t->p->ninputs; i++) free(t->slot_bufs[q][i]);
    free(t->slot_bufs ? t->slot_bufs[q] : NULL);
  }
  free(t->slot_work);
  free(t->slot_bufs);
  for (int i = 0; t->bufs && i < t->p->ninputs; i++) free(t->bufs[i]);
  free(t->bufs);
  free(t->cbufs);
  free(t->gradbuf);
  free(t->run.params);
  free(t->run.state);
  free(t->run.work);
}

static void free_all(Trainer *t) {
  for (int k = 0; k < nstages(t); k++) {
    stage_use(t, k);
    free_stage(t);
  }
  stage_use(t, 0);
  free(t->stages);
  free(t->ops);
  free(t->mets);
  free(t->msum);
  free(t->cew);
  free(t->ce_cnt);
  rt_tokens_close(t->tok);
  rt_tokens_close(t->val_tok);
  rt_adder_close(t->adder);
  rt_tsrc_close(t->ts);
  rt_tsrc_close(t->val_ts);
  if (t->metrics) fclose(t->metrics);
}

/* Resumes from --resume (checking the checkpoint belongs to this plan), loads --init, or
 * initializes every param from its RtPlanParam. */
static int load_or_init(Trainer *t, RtError *err) {
  const RtPlan *p = t->p;
  if (t->o.resume) {
    char dir[4096];
    RtCkptInfo info;
    int64_t newer;
    if (rt_ckpt_find(t->o.resume, dir, sizeof dir, &newer, err) != 0 || rt_ckpt_info(dir, &info, err) != 0) return -1;
    if (newer >= 0)
      say(t, "warning: %s/step_%06lld has no state.json (damaged, or not a cplan checkpoint): resuming from the "
          "newest complete one, %s", t->o.resume, (long long)newer, dir);
    /* whether it is this plan's, before reading its tensors */
    const char *hash = p->resume_hash ? p->resume_hash : p->source_hash ? p->source_hash : "";
    if (strcmp(info.plan_hash, hash) != 0)
      return rt_errf(err, "%s: written by build '%s', this is build '%s': a resume would not be "
                     "exact (retrain, or --init %s/model.safetensors to start over from it)",
                     dir, info.plan_hash, hash, dir);
    if (info.seed != p->seed)
      return rt_errf(err, "%s: written with seed %lld, the plan has seed %lld", dir,
                     (long long)info.seed, (long long)p->seed);
    if (info.step > p->steps)
      return rt_errf(err, "%s: at step %lld, past the plan's %lld steps", dir, (long long)info.step, (long long)p->steps);
    if (lowered(p)) { /* every rank reads the whole tensors and keeps its shards */
      RtPlan gp;
      float *wp = calloc((size_t)p->gparam_floats + 1, 4), *ws = calloc((size_t)p->gstate_floats + 1, 4);
      RtRun r = whole_run(t, &gp, wp, ws);
      int rc = wp && ws ? rt_ckpt_load(&r, dir, &info, err) : rt_errf(err, "out of memory");
      if (rc == 0) scatter(t, 0, wp), scatter(t, 1, ws);
      free(wp), free(ws);
      if (rc != 0) return -1;
    } else if (rt_ckpt_load(&t->run, dir, &info, err) != 0)
      return -1;
    int64_t ntok = t->tok ? rt_tokens_count(t->tok) : -1;
    if (info.data_tokens >= 0 && ntok >= 0 && info.data_tokens != ntok)
      say(t, "warning: %s was written reading %lld tokens of data, --data %s has %lld: the run goes on from this "
          "data's position for step %lld, not where the checkpoint stopped reading", dir, (long long)info.data_tokens,
          t->data_path, (long long)ntok, (long long)info.step);
    t->start = info.step;
    t->last_ckpt = info.step;
    if (info.scaler[0] > 0) scaler_hook(t, info.scaler, 1);
    say(t, "resumed from %s at step %lld", dir, (long long)info.step);
    return 0;
  }
  if (t->o.init && lowered(p)) {
    RtPlan gp;
    float *wp = calloc((size_t)p->gparam_floats + 1, 4);
    RtRun r = whole_run(t, &gp, wp, NULL);
    int rc = wp ? rt_params_load(&r, t->o.init, err) : rt_errf(err, "out of memory");
    if (rc == 0) scatter(t, 0, wp);
    free(wp);
    return rc;
  }
  if (t->o.init) return rt_params_load(&t->run, t->o.init, err);
  for (int s = 0; s < nstages(t); s++) { /* each of the rank's pipeline stages */
    stage_use(t, s);
    for (int i = 0; i < t->p->nparams; i++) init_param(&t->run, i, t->run.params + t->p->params[i].offset);
  }
  stage_use(t, 0);
  return 0;
}

static int resolve_run(Trainer *t, RtError *err) {
  const RtPlan *p = t->p;
  if (plan_dp(p) * p->micro * p->accum != p->batch || p->micro <= 0 || p->accum <= 0)
    return rt_errf(err, "bad plan: batch %lld != dp %lld x micro %lld x accum %lld",
                   (long long)p->batch, (long long)plan_dp(p), (long long)p->micro,
                   (long long)p->accum);
  if (plan_dp(p) * plan_tp(p) * plan_pp(p) != plan_devices(p))
    return rt_errf(err, "bad plan: dp %lld on %lld devices (only pure data parallelism runs)",
                   (long long)plan_dp(p), (long long)plan_devices(p));
  t->stop = t->o.steps >= 0 ? t->o.steps : p->steps;
  t->ckpt_every = t->o.ckpt_every >= 0 ? t->o.ckpt_every : p->ckpt_every;
  t->ckpt_keep = p->ckpt_keep;
  t->ckpt_dir = t->o.ckpt_dir ? t->o.ckpt_dir : p->ckpt_dir;
  if (t->ckpt_every > 0 && !t->ckpt_dir) t->ckpt_dir = "ckpt";
  /* --checkpoint-dir alone asks for a checkpoint: write one at the end of the run. */
  if (t->o.ckpt_dir && t->ckpt_every <= 0) t->ckpt_every = t->stop > 0 ? t->stop : 1;
  int64_t threads = t->o.threads;
  if (threads <= 0) threads = sysconf(_SC_NPROCESSORS_ONLN) / (t->nranks > 1 ? t->nranks : 1);
  t->run.threads = threads > 0 ? (int)threads : 1;
  if (openblas_set_num_threads) openblas_set_num_threads(t->run.threads);
  return 0;
}

/* ---- output ------------------------------------------------------------------------------------ */

/* 124.4M, 1.2k: a count for people. */
static const char *human(char *buf, size_t n, double v, const char *unit) {
  const char *suf[] = {"", "k", "M", "G", "T", "P"};
  int i = 0;
  while (fabs(v) >= 1000 && i < 5) v /= 1000, i++;
  snprintf(buf, n, i ? "%.1f%s%s" : "%.0f%s%s", v, suf[i], unit);
  return buf;
}

static const char *duration(char *buf, size_t n, double s) {
  long long x = (long long)(s + 0.5);
  if (x >= 3600) snprintf(buf, n, "%lldh%02lldm", x / 3600, x / 60 % 60);
  else if (x >= 60) snprintf(buf, n, "%lldm%02llds", x / 60, x % 60);
  else snprintf(buf, n, "%llds", x);
  return buf;
}

static void banner(Trainer *t) {
  const RtPlan *p = t->p;
  char a[32], b[32], c[32], d[32];
  int64_t n = 0;
  for (int k = 0; k < nstages(t); k++) /* the rank's pipeline stages' */
    for (int i = 0; i < stage_view(t, k).p->nparams; i++) n += stage_view(t, k).p->params[i].numel;
  say(t, "%s (%s): %s params; arenas: params %s, state %s, work %s", p->model ? p->model : "?",
      p->source ? p->source : "?", human(a, sizeof a, (double)n, ""),
      human(b, sizeof b, (double)rank_bytes(t, 0), "B"),
      human(c, sizeof c, (double)rank_bytes(t, 1), "B"),
      human(d, sizeof d, (double)p->work_bytes, "B"));
  if (p->data_kind == RT_DATA_ADDER)
    say(t, "data: adder(digits = %d), evaluation on the held-out problems", p->digits);
  else if (p->data_kind == RT_DATA_TOKENS)
    say(t, "data: tokens %s (%s tokens)%s%s", t->data_path,
        human(a, sizeof a, (double)rt_tokens_count(t->tok), ""), t->has_val ? ", val " : "",
        t->has_val ? p->val_path : "");
  else
    say(t, "data: tensors %s (%lld rows)%s%s", t->data_path, (long long)rt_tsrc_rows(t->ts),
        t->has_val ? ", val " : "", t->has_val ? p->val_path : "");
  if (t->nranks > 1 && lowered(p))
    say(t, "%d ranks (mesh %s): dp %lld x tp %lld%s x pp %lld%s%s, each micro %lld x accum %lld of the batch of %lld",
        t->nranks, p->mesh ? p->mesh : "?", (long long)plan_dp(p), (long long)plan_tp(p),
        p->sp > 1 ? " (sequence parallel)" : "", (long long)plan_pp(p),
        plan_pp(p) > 1 ? (p->pp_chunks > 1 ? " (interleaved: 2 stages per rank)" : p->pp_schedule == 1 ? " (GPipe)" : " (1F1B)") : "",
        p->zero > 0 ? (p->zero == 1 ? ", ZeRO 1" : p->zero == 2 ? ", ZeRO 2" : ", ZeRO 3") : "", (long long)p->micro,
        (long long)p->accum, (long long)p->batch);
  else if (t->nranks > 1)
    say(t, "data parallel: %d ranks (mesh %s), each micro %lld x accum %lld of the batch of %lld; "
        "gradients all-reduced as %lld floats%s", t->nranks, p->mesh ? p->mesh : "?",
        (long long)p->micro, (long long)p->accum, (long long)p->batch, (long long)t->grad_n,
        t->gradbuf ? " (packed)" : " (in place)");
  char seq[48] = "";
  if (p->seq_len > 0) snprintf(seq, sizeof seq, ", seq %lld", (long long)p->seq_len);
  say(t, "batch %lld = %smicro %lld x accum %lld%s; steps %lld..%lld of %lld; threads %d",
      (long long)p->batch, t->nranks > 1 ? "ranks x " : "", (long long)p->micro,
      (long long)p->accum, seq, (long long)t->start, (long long)t->stop,
      (long long)p->steps, t->run.threads);
  if (t->start >= t->stop)
    say(t, "nothing to train: the run starts at step %lld, and %s stops it at step %lld", (long long)t->start,
        t->o.steps >= 0 ? "--steps" : "the plan", (long long)t->stop);
}

static double tokens_per_step(const RtPlan *p) {
  return (double)p->batch * (double)(p->seq_len > 0 ? p->seq_len : 1);
}

/* The live line on a terminal, else a log line every log_every steps, the first and the last.
 * tok/s (samples/s for a model whose samples are not sequences) is the whole run's; FLOP/s is
 * this rank's program's (flops_per_step counts the rank's graph), said so when there are several. */
static void progress(Trainer *t, int64_t s, double lr, double gn, double sec) {
  if (!t->verbose) return;
  const RtPlan *p = t->p;
  char tps[48], gf[48], eta[32];
  human(tps, sizeof tps - 12, tokens_per_step(p) / sec, "");
  strcat(tps, p->seq_len > 0 ? " tok/s" : " samples/s");
  human(gf, sizeof gf - 12, p->flops_per_step / sec, "FLOP/s");
  if (t->nranks > 1) strcat(gf, " per rank");
  double per = t->timed ? t->time_sum / (double)t->timed : sec;
  duration(eta, sizeof eta, per * (double)(t->stop - s - 1));
  if (t->tty) {
    fprintf(stderr, "\r\033[Kstep %lld/%lld | loss %.4f | lr %.2e | %s | %s | ETA %s",
            (long long)s + 1, (long long)t->stop, t->loss, lr, tps, gf, eta);
    fflush(stderr);
    t->live = 1;
    return;
  }
  int64_t every = p->log_every > 0 ? p->log_every : 10;
  if (s != t->start && s + 1 != t->stop && (s + 1) % every != 0) return;
  say(t, "step %lld/%lld | loss %.6f | lr %.4e | norm %.4f | %.1f ms | %s | %s | ETA %s",
      (long long)s + 1, (long long)t->stop, t->loss, lr, gn, 1e3 * sec, tps, gf, eta);
}

static void add_metrics(cJSON *j, const RtPlan *p, const char *prefix, const double *v) {
  char key[256];
  for (int i = 0; i < p->nmetrics; i++) {
    snprintf(key, sizeof key, "%s%s", prefix, p->metric_names[i]);
    cJSON_AddNumberToObject(j, key, v[i]);
  }
}

static int write_metrics(Trainer *t, cJSON *j, RtError *err) {
  if (!t->metrics) return 0;
  char *line = cJSON_PrintUnformatted(j);
  int ok = line && fprintf(t->metrics, "%s\n", line) > 0 && fflush(t->metrics) == 0;
  free(line);
  return ok ? 0 : rt_errf(err, "%s: cannot write the metrics", t->o.metrics ? t->o.metrics
                                                                             : t->p->log_file);
}

/* ---- the loop ------------------------------------------------------------------------------------ */

/* Evaluation: eval_batches batches of the validation data from its start; the mean loss and
 * metrics of their micro-batches go into j as val_loss and val_<metric>. */
static int evaluate(Trainer *t, int64_t s, cJSON *j, RtError *err) {
  const RtPlan *p = t->p, *mp = metrics_plan(t);
  double lsum = 0, loss;
  int64_t n = 0, nb = p->eval_batches > 0 ? p->eval_batches : 10;
  memset(t->msum, 0, (size_t)mp->nmetrics * sizeof *t->msum);
  for (int64_t b = 0; b < nb; b++) {
    if (ce_weights(t, 1, b, err) != 0) {
      if (t->nranks > 1) rt_comm_abort(t->world, 1, err->msg);
      return -1;
    }
    for (int64_t m = 0; m < p->accum; m++, n++)
      for (int k = 0; k < nstages(t); k++) { /* interleaved: the rank's stages in order */
        stage_use(t, k);
        if (fill_inputs(t, 1, b, m, err) != 0) {
          if (t->nranks > 1) rt_comm_abort(t->world, 1, err->msg);
          return -1;
        }
        t->run.micro_index = m;
        t->p->eval_step(&t->run, t->cbufs, &loss, t->mets);
        lsum += loss;
        for (int i = 0; i < t->p->nmetrics; i++) t->msum[i] += t->mets[i];
      }
  }
  t->run.ce_weight = NULL;
  stage_use(t, 0);
  if (plan_pp(p) > 1) rt_comm_wait_sends(t->run.axis_comm[p->pp_axis]);
  /* t->msum[nmetrics] carries the loss through the reduction */
  t->msum[mp->nmetrics] = lsum;
  reduce_means(t, t->msum, mp->nmetrics + 1, n);
  lsum = t->msum[mp->nmetrics];
  cJSON_AddNumberToObject(j, "val_loss", lsum);
  add_metrics(j, mp, "val_", t->msum);
  char line[1024];
  int k = snprintf(line, sizeof line, "eval step %lld: val_loss %.6f", (long long)s + 1, lsum);
  for (int i = 0; i < mp->nmetrics && k < (int)sizeof line; i++)
    k += snprintf(line + k, sizeof line - (size_t)k, " val_%s %.6f", mp->metric_names[i],
                  t->msum[i]);
  say(t, "%s", line);
  return 0;
}

/* Pipeline parallelism: after the update, the owner of a param other stages also read (a tied
 * embedding) sends them its new value, to the rank of each holder (pp group; a holder on the same
 * rank gets a copy). Every rank walks the same list of params and stages, so the sends and the
 * receives pair up in order; sends do not wait, so no receive waits on its own rank. */
static void sync_shared_params(Trainer *t) {
  const RtPlan *p = t->p, *const *sp = p->stage_plans;
  RtComm *g = t->run.axis_comm[p->pp_axis];
  int P = (int)plan_pp(p), n = P * nstages(t), me = (int)t->run.axis_coord[p->pp_axis];
  int *at = malloc(sizeof(int) * (size_t)n); /* per stage: the param's index there, -1 */
  if (!at) rt_comm_abort(t->world, 1, "out of memory");
  for (int gk = 0; gk < p->ngparams; gk++) {
    int owner = -1, holders = 0;
    for (int q = 0; q < n; q++) {
      at[q] = -1;
      for (int j = 0; j < sp[q]->nparams && at[q] < 0; j++)
        if (sp[q]->param_global[j] == gk) at[q] = j;
      if (at[q] >= 0 && sp[q]->param_owned[at[q]]) owner = q;
      holders += at[q] >= 0;
    }
    if (owner < 0 || holders < 2) continue;
    /* stage q is the rank's stage q / P when q mod P is its pp coordinate */
    float *src = owner % P == me ? stage_view(t, owner / P).params + sp[owner]->params[at[owner]].offset : NULL;
    if (src && sp[owner]->param_copy) sp[owner]->param_copy(at[owner], src, 0); /* a GPU plan's, from the device */
    for (int q = 0; q < n; q++) {
      if (q == owner || at[q] < 0) continue;
      int64_t numel = sp[q]->params[at[q]].numel;
      int tag = (1 << 20) + gk * n + q;
      float *dst = q % P == me ? stage_view(t, q / P).params + sp[q]->params[at[q]].offset : NULL;
      if (src && dst) memcpy(dst, src, (size_t)numel * sizeof *dst);
      else if (src) rt_comm_isend(g, src, numel, RT_COMM_F32, q % P, tag);
      else if (dst) rt_comm_recv(g, dst, numel, RT_COMM_F32, owner % P, tag);
      if (dst && sp[q]->param_copy) sp[q]->param_copy(at[q], dst, 1); /* a GPU plan's, to the device */
    }
  }
  free(at);
  rt_comm_wait_sends(g);
}

/* Op o of the step's order: a forward or backward of one micro-batch on one of the rank's stages,
 * on the micro-batch's slot of that stage. */
static void pp_run(Trainer *t, int64_t s, PpOp o, double *lsum, RtError *err) {
  stage_use(t, o.chunk);
  const RtPlan *p = t->p;
  int64_t m = o.mb;
  int q = (int)(m % t->nslots);
  t->run.work = t->slot_work[q];
  t->run.slot = q;
  t->run.micro_index = m;
  double t0 = rt_trace_now(), loss = 0;
  if (o.fwd) {
    t->bufs = t->slot_bufs[q];
    if (fill_inputs(t, 0, s, m, err) != 0) rt_comm_abort(t->world, 1, err->msg);
    rt_trace_span("data", t0, s + 1, m);
    t0 = rt_trace_now();
    p->forward(&t->run, (const void *const *)t->slot_bufs[q], &loss, t->mets);
    rt_trace_span("forward", t0, s + 1, m);
    *lsum += loss;
    for (int i = 0; i < p->nmetrics; i++) t->msum[i] += t->mets[i];
  } else {
    p->backward(&t->run, (const void *const *)t->slot_bufs[q]);
    rt_trace_span("backward", t0, s + 1, m);
  }
}

/* Pipeline parallelism, after the micro-batches: each partial gradient accumulator of a param
 * several stages read (a tied embedding's head contribution, compiler/pipeline.h) is added into
 * its owner's accumulator, to the rank of the owner (pp group; on the same rank, in place), once a
 * step. Every rank walks the same list, the sends first (they do not wait), then the receives. */
static void reduce_shared_grads(Trainer *t) {
  const RtPlan *p = t->p, *const *sp = p->stage_plans;
  RtComm *g = t->run.axis_comm[p->pp_axis];
  int P = (int)plan_pp(p), n = P * nstages(t), me = (int)t->run.axis_coord[p->pp_axis];
  for (int pass = 0; pass < 2; pass++)
    for (int q = 0; q < n; q++) {
      const RtPlan *hq = sp[q];
      for (int k = 0; hq->state_part_to && k < hq->nstates; k++) {
        int o = hq->state_part_to[k], j = -1;
        if (o < 0) continue;
        for (int i = 0; i < sp[o]->nstates && j < 0; i++)
          if (sp[o]->state_global[i] == hq->state_global[k]) j = i;
        if (j < 0 || sp[o]->states[j].numel != hq->states[k].numel)
          rt_comm_abort(t->world, 1, "a partial gradient has no accumulator on its owner stage (a bug in cplan)");
        int64_t numel = hq->states[k].numel;
        int tag = (1 << 22) + hq->state_global[k] * n + q;
        float *src = q % P == me ? stage_view(t, q / P).state + hq->states[k].offset : NULL;
        float *dst = o % P == me ? stage_view(t, o / P).state + sp[o]->states[j].offset : NULL;
        if (pass == 0) { /* the holder's part, to the host and on its way */
          if (src && hq->state_copy) hq->state_copy(k, src, 0);
          if (src && !dst) rt_comm_isend(g, src, numel, RT_COMM_F32, o % P, tag);
          continue;
        }
        if (!dst) continue;
        float *part = src;
        if (!part && !(part = malloc((size_t)numel * sizeof *part + 1)))
          rt_comm_abort(t->world, 1, "out of memory for a tied gradient");
        if (!src) rt_comm_recv(g, part, numel, RT_COMM_F32, q % P, tag);
        if (sp[o]->state_copy) sp[o]->state_copy(j, dst, 0);
        for (int64_t e = 0; e < numel; e++) dst[e] += part[e];
        if (sp[o]->state_copy) sp[o]->state_copy(j, dst, 1);
        if (part != src) free(part);
      }
    }
  rt_comm_wait_sends(g);
}

/* One step of the rank's pipeline stages: the micro-batches' forwards and backwards in the order
 * of pp_order, on each stage's nslots arenas; then each stage's slot 0 again (the update's). */
static void pp_micro_batches(Trainer *t, int64_t s, double *lsum, RtError *err) {
  for (int64_t k = 0; k < t->nops; k++) pp_run(t, s, t->ops[k], lsum, err);
  for (int k = nstages(t) - 1; k >= 0; k--) {
    stage_use(t, k);
    t->run.work = t->slot_work[0];
    t->run.slot = 0;
    t->bufs = t->slot_bufs[0];
  }
  rt_comm_wait_sends(t->run.axis_comm[t->p->pp_axis]);
  reduce_shared_grads(t);
}

/* The update of the rank's pipeline stages (pipeline.h): the squared gradient norm is the sum of
 * every stage's part (grad_sumsq: the gradients it owns), added over the rank's stages and then
 * over the pp group (f64); each stage's update reads it (RtRun.grad_sumsq) and returns the norm.
 * Then the params several stages hold are sent from their owners. Returns the gradient norm. */
static double pp_update(Trainer *t) {
  RtComm *g = t->run.axis_comm[t->p->pp_axis];
  double sq = 0, gn = 0;
  for (int k = 0; k < nstages(t); k++) {
    stage_use(t, k);
    sq += t->p->grad_sumsq(&t->run);
  }
  rt_comm_all_reduce(g, &sq, 1, RT_COMM_F64);
  t->run.grad_sumsq = sq;
  for (int k = nstages(t) - 1; k >= 0; k--) {
    stage_use(t, k);
    gn = t->p->update(&t->run);
  }
  rt_comm_wait_sends(g);
  sync_shared_params(t);
  return gn < 0 ? 0 : gn; /* NaN: an f16 step skipped on an overflow */
}

/* One optimizer step: accum micro-batches, then the update.  The loss and metrics are the means
 * of the micro-batches' (they are of equal size). */
static int one_step(Trainer *t, int64_t s, double *gn, RtError *err) {
  const RtPlan *p = t->p;
  int nm = metrics_plan(t)->nmetrics;
  double lsum = 0, loss;
  memset(t->msum, 0, (size_t)nm * sizeof *t->msum);
  t->run.step = s;
  if (ce_weights(t, 0, s, err) != 0) {
    if (t->nranks > 1) rt_comm_abort(t->world, 1, err->msg);
    return -1;
  }
  if (plan_pp(p) > 1) pp_micro_batches(t, s, &lsum, err);
  for (int64_t m = 0; m < p->accum && plan_pp(p) == 1; m++) {
    double t0 = rt_trace_now();
    if (fill_inputs(t, 0, s, m, err) != 0) {
      if (t->nranks > 1) rt_comm_abort(t->world, 1, err->msg); /* the others are in a collective */
      return -1;
    }
    rt_trace_span("data", t0, s + 1, m);
    t->run.micro_index = m;
    t0 = rt_trace_now();
    p->micro_step(&t->run, t->cbufs, &loss, t->mets);
    rt_trace_span("micro_step", t0, s + 1, m);
    lsum += loss;
    for (int i = 0; i < p->nmetrics; i++) t->msum[i] += t->mets[i];
  }
  double t0 = rt_trace_now();
  for (int k = 0; k < nstages(t) && plan_dp(p) > 1; k++) { /* each of the rank's pipeline stages */
    stage_use(t, k);
    if (all_reduce_grads(t, err) != 0) {
      if (t->nranks > 1) rt_comm_abort(t->world, 1, err->msg); /* the others are in a collective */
      return -1;
    }
  }
  stage_use(t, 0);
  if (t->nranks > 1) rt_trace_span("grad_sync", t0, s + 1, -1);
  t0 = rt_trace_now();
  *gn = plan_pp(p) > 1 ? pp_update(t) : p->update(&t->run);
  rt_trace_span("update", t0, s + 1, -1);
  for (int k = 0; k < nstages(t); k++) { /* metrics the update decided */
    stage_use(t, k);
    if (t->p->step_metrics && t->p->nmetrics > 0) t->p->step_metrics(&t->run, t->msum);
  }
  stage_use(t, 0);
  t->msum[nm] = lsum;
  reduce_means(t, t->msum, nm + 1, p->accum);
  t->loss = t->msum[nm];
  if (!isfinite(t->loss))
    return rt_errf(err, "step %lld/%lld: the loss is %s: stopping (a lower learning rate or `clip` may help)",
                   (long long)s + 1, (long long)t->stop, isnan(t->loss) ? "NaN" : "infinite");
  return 0;
}

static int write_checkpoint(Trainer *t, const char *dir, int64_t done, RtError *err) {
  if (device_hook(t, 0, err) != 0) return -1; /* a GPU plan's params and state */
  RtCkptInfo info = {.step = done, .seed = t->p->seed, .loss = t->loss, .data_offset = -1, .data_tokens = -1};
  const char *hash = t->p->resume_hash ? t->p->resume_hash : t->p->source_hash;
  snprintf(info.plan_hash, sizeof info.plan_hash, "%s", hash ? hash : "");
  scaler_hook(t, info.scaler, 0);
  if (t->p->data_kind == RT_DATA_TOKENS) {
    int64_t S = rt_tokens_steps(t->tok, t->p->batch, t->p->seq_len, NULL);
    info.data_offset = S > 0 ? done % S * t->p->batch * t->p->seq_len : -1;
    info.data_tokens = rt_tokens_count(t->tok);
  }
  if (check_replicas(t, err) != 0) return -1;
  if (lowered(t->p)) { /* the whole tensors, gathered by every rank, written by rank 0 */
    RtPlan gp;
    float *wp = whole(t, 0), *ws = whole(t, 1);
    RtRun r = whole_run(t, &gp, wp, ws);
    char path[4096];
    int rc = t->rank == 0 ? rt_ckpt_save(&r, dir, &info, path, sizeof path, err) : 0;
    free(wp), free(ws);
    t->last_ckpt = done;
    if (rc != 0) return -1;
    if (t->rank != 0) return 0;
    say(t, "checkpoint %s", path);
    return rt_ckpt_prune(dir, t->ckpt_keep, err);
  }
  if (t->rank != 0) { /* rank 0 writes it; a failure there reaches the others through agree() */
    t->last_ckpt = done;
    return 0;
  }
  char path[4096];
  if (rt_ckpt_save(&t->run, dir, &info, path, sizeof path, err) != 0) return -1;
  t->last_ckpt = done;
  say(t, "checkpoint %s", path);
  return rt_ckpt_prune(dir, t->ckpt_keep, err);
}

/* write_checkpoint, as a span of --trace (args.step: the steps done). */
static int checkpoint(Trainer *t, const char *dir, int64_t done, RtError *err) {
  double t0 = rt_trace_now();
  int rc = write_checkpoint(t, dir, done, err);
  rt_trace_span("checkpoint", t0, done, -1);
  return rc;
}

/* The arenas this rank allocated (alloc_all): params, optimizer state and gradients, work. */
static int64_t arena_bytes(const Trainer *t) { return rank_bytes(t, 0) + rank_bytes(t, 1) + rank_bytes(t, 2); }

static int eval_due(const Trainer *t, int64_t s) {
  const RtPlan *p = t->p;
  if (!t->has_val || p->eval_every <= 0 || !p->eval_step) return 0;
  return (s + 1) % p->eval_every == 0 || s + 1 == t->stop;
}

/* Step s and everything that follows it: metrics line, progress, eval, checkpoint. */
static int step_and_report(Trainer *t, int64_t s, RtError *err) {
  const RtPlan *p = t->p;
  double gn, t0 = now_s(), tt = rt_trace_now();
  if (one_step(t, s, &gn, err) != 0) return -1;
  rt_trace_span("step", tt, s + 1, -1);
  double sec = now_s() - t0, lr = p->lr_at ? p->lr_at(s) : 0;
  if (s > t->start) t->time_sum += sec, t->timed++;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "step", (double)(s + 1)); /* steps done, as the progress and checkpoints count */
  cJSON_AddNumberToObject(j, "loss", t->loss);
  cJSON_AddNumberToObject(j, "lr", lr);
  cJSON_AddNumberToObject(j, "grad_norm", gn);
  cJSON_AddNumberToObject(j, "ms", 1e3 * sec);
  cJSON_AddNumberToObject(j, "tokens_per_s", tokens_per_step(p) / sec);
  add_metrics(j, metrics_plan(t), "", t->msum);
  if (t->world) {
    uint64_t b = rt_comm_bytes(t->world); /* and the axis groups' (tp, ZeRO, pp traffic) */
    for (int a = 0; a < 4 && a < (int)(sizeof t->run.axis_comm / sizeof *t->run.axis_comm); a++)
      if (t->run.axis_comm[a]) b += rt_comm_bytes(t->run.axis_comm[a]);
    cJSON_AddNumberToObject(j, "comm_bytes", (double)(b - t->comm_bytes));
    t->comm_bytes = b;
    rt_trace_comm_step(s + 2); /* later collectives count in the next step's line */
  }
  /* on every line, so the last one (of a finished or an interrupted run) has them */
  cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)rt_peak_rss_bytes());
  cJSON_AddNumberToObject(j, "arena_bytes", (double)arena_bytes(t));
  cJSON_AddNumberToObject(j, "param_bytes", (double)rank_bytes(t, 0)); /* this rank's */
  cJSON_AddNumberToObject(j, "state_bytes", (double)rank_bytes(t, 1));
  progress(t, s, lr, gn, sec);
  tt = rt_trace_now();
  int rc = eval_due(t, s) ? evaluate(t, s, j, err) : 0;
  if (eval_due(t, s)) rt_trace_span("eval", tt, s + 1, -1);
  if (rc == 0) rc = write_metrics(t, j, err);
  cJSON_Delete(j);
  if (rc == 0 && t->ckpt_every > 0 && ((s + 1) % t->ckpt_every == 0 || s + 1 == t->stop))
    rc = checkpoint(t, t->ckpt_dir, s + 1, err);
  return rc;
}

/* The steps [start, stop); a signal ends the loop after the step it arrived in, with a
 * checkpoint. Returns 1 when interrupted. */
static int train_loop(Trainer *t, RtError *err) {
  for (int64_t s = t->start; s < t->stop; s++) {
    if (agree(t, step_and_report(t, s, err), err) != 0) return -1;
    if (t->nranks > 1 ? t->stop_agreed : stop_signal) {
      const char *dir = t->ckpt_dir ? t->ckpt_dir : "ckpt";
      if (agree(t, t->last_ckpt != s + 1 ? checkpoint(t, dir, s + 1, err) : 0, err) != 0) return -1;
      say(t, "%s after step %lld: checkpoint in %s; continue with --resume %s",
          stop_signal == SIGINT ? "interrupted" : "terminated", (long long)s + 1, dir, dir);
      return 1;
    }
  }
  if (t->live) fputc('\n', stderr);
  t->live = 0;
  return 0;
}

static int open_metrics(Trainer *t, RtError *err) {
  const char *path = t->o.metrics ? t->o.metrics : t->p->log_file;
  if (!path || t->rank != 0) return 0;
  /* as llm.c: a resumed run appends to the log of the run it continues */
  t->metrics = fopen(path, t->o.resume ? "a" : "w");
  return t->metrics ? 0 : rt_errf(err, "%s: cannot open for writing", path);
}

static int setup(Trainer *t, RtError *err) {
  if (resolve_run(t, err) != 0 || open_data(t, err) != 0 || alloc_all(t, err) != 0 ||
      load_or_init(t, err) != 0)
    return -1;
  /* a GPU plan: the params and state (initialized or loaded here) go to the device once */
  if (device_hook(t, 1, err) != 0) return -1;
  if (t->o.save_init && save_params(t, t->o.save_init, err) != 0) return -1;
  if (open_metrics(t, err) != 0) return -1;
  if (t->o.trace && rt_trace_open(t->o.trace, t->rank, err) != 0) return -1;
  rt_trace_comm_step(t->start + 1); /* the first metrics line counts the bytes from here */
  banner(t);
  return 0;
}

static int run_all(Trainer *t) {
  RtError err = {""};
  if (agree(t, setup(t, &err), &err) != 0) return fail(t, err.msg);
  t->ready = 1;
  int rc = train_loop(t, &err);
  if (rc < 0) return fail(t, err.msg);
  if (rc == 1) {
    if (t->o.save) say(t, "--save %s skipped: the run did not finish", t->o.save);
    return 0;
  }
  if (t->o.save) {
    int bad = device_hook(t, 0, &err) != 0 || check_replicas(t, &err) != 0 ||
              save_params(t, t->o.save, &err) != 0;
    if (agree(t, bad ? -1 : 0, &err) != 0) return fail(t, err.msg);
    say(t, "saved the params to %s", t->o.save);
  }
  return 0;
}

/* "memory: peak RSS 52.1MB, arenas 14.2MB (params ..., state ..., work ...)" for this rank, or,
 * with several ranks, rank 0's line for each rank (gathered: every rank calls it). */
static void report_memory(Trainer *t) {
  /* a pipeline stage's arenas differ from the others' (and it has one work arena per slot) */
  int64_t mine[5] = {rt_peak_rss_bytes(), arena_bytes(t), rank_bytes(t, 0), rank_bytes(t, 1), rank_bytes(t, 2)},
          *all = mine;
  if (t->nranks > 1) {
    /* every rank is in this collective: without memory, none can go on */
    if (!(all = calloc(5 * (size_t)t->nranks, sizeof *all))) rt_comm_abort(t->world, 1, "out of memory");
    rt_comm_all_gather(t->world, mine, all, 5, RT_COMM_I64);
  }
  char a[32], b[32], c[32], d[32], e[32];
  for (int q = 0; q < t->nranks; q++) {
    char who[32] = "";
    const int64_t *m = all + 5 * q;
    if (t->nranks > 1) snprintf(who, sizeof who, "rank %d: ", q);
    say(t, "memory: %speak RSS %s, arenas %s (params %s, state %s, work %s)", who,
        human(a, sizeof a, (double)m[0], "B"), human(b, sizeof b, (double)m[1], "B"),
        human(c, sizeof c, (double)m[2], "B"), human(d, sizeof d, (double)m[3], "B"),
        human(e, sizeof e, (double)m[4], "B"));
  }
  if (all != mine) free(all);
}

/* After the run (rc: run_all's): the memory report and the --trace file.  Both are collectives,
 * so they run only when setup succeeded on every rank (then every rank gets here with the same
 * rc); a trace is written for a failed run too, for its spans up to the failure. */
static int finish(Trainer *t, int rc) {
  if (!t->ready) return rc;
  if (rc == 0) report_memory(t);
  if (!rt_trace_on()) return rc;
  RtError err = {""};
  if (agree(t, rt_trace_write(t->world, &err), &err) != 0) return fail(t, err.msg);
  say(t, "trace: %s (load it in ui.perfetto.dev or chrome://tracing)", t->o.trace);
  return rc;
}

/* A plan for several devices runs as that many MPI ranks; so does any program an MPI launcher
 * started (where the count must then match).  Single-device runs outside MPI never touch it.
 * A wrong rank count is an error on every rank (-1), and the world is not kept. */
static int join_ranks(Trainer *t, int *argc, char ***argv) {
  const RtPlan *p = t->p;
  int64_t devices = plan_devices(p);
  if (devices <= 1 && !rt_comm_launched()) return 0;
  t->world = rt_comm_init(argc, argv);
  t->rank = rt_comm_rank(t->world);
  t->nranks = rt_comm_size(t->world);
  t->run.dp_rank = t->rank;
  if (t->nranks == devices && lowered(p)) {
    /* the strategy's grid, row-major over the world ranks (cplanrt.h): pp outermost, then the
     * placement axes; the pp group and coordinate go after the placement axes' */
    int n = p->nplan_axes, pp = plan_pp(p) > 1, na = n + pp;
    int64_t sizes[4];
    const char *names[4];
    RtComm *groups[4];
    int64_t coord[4];
    if (pp) sizes[0] = plan_pp(p), names[0] = "pp";
    for (int a = 0; a < n; a++) sizes[pp + a] = p->plan_axes[a], names[pp + a] = p->plan_axis_names[a];
    rt_comm_split_axes(t->world, sizes, names, na, groups);
    for (int a = na - 1, r = t->rank; a >= 0; a--) coord[a] = r % sizes[a], r /= (int)sizes[a];
    for (int a = 0; a < n; a++) t->run.axis_comm[a] = groups[pp + a], t->run.axis_coord[a] = coord[pp + a];
    if (pp) t->run.axis_comm[n] = groups[0], t->run.axis_coord[n] = coord[0];
    t->run.dp_rank = p->dp_axis >= 0 ? t->run.axis_coord[p->dp_axis] : 0;
    if (plan_pp(p) > 1) { /* this rank runs its pipeline stage's plan; interleaved: c, c + pp, ... */
      int64_t c = t->run.axis_coord[p->pp_axis];
      t->p = t->run.plan = p->stage_plans[c];
      if (p->pp_chunks > 1) {
        if (!(t->stages = calloc((size_t)p->pp_chunks, sizeof *t->stages))) rt_comm_abort(t->world, 1, "out of memory");
        t->nstages = p->pp_chunks;
        for (int k = 0; k < p->pp_chunks; k++) t->stages[k].p = p->stage_plans[c + k * plan_pp(p)];
      }
    }
  }
  if (t->nranks == devices) return 0;
  if (devices == 1)
    fprintf(stderr, "%s: rank %d: error: this program was built for 1 device (%s%s); run it "
            "without mpirun (or with -np 1), not -np %d\n", t->prog, t->rank,
            p->mesh ? "mesh " : "the default mesh", p->mesh ? p->mesh : "", t->nranks);
  else {
    char deg[96]; /* the strategy's degrees */
    int k = snprintf(deg, sizeof deg, "dp=%lld", (long long)plan_dp(p));
    if (plan_tp(p) > 1) k += snprintf(deg + k, sizeof deg - (size_t)k, ", tp=%lld", (long long)plan_tp(p));
    if (plan_pp(p) > 1) snprintf(deg + k, sizeof deg - (size_t)k, ", pp=%lld", (long long)plan_pp(p));
    fprintf(stderr, "%s: rank %d: error: this program was built for %lld devices (mesh %s, %s); "
            "run it with mpirun -np %lld, not %d\n", t->prog, t->rank, (long long)devices,
            p->mesh ? p->mesh : "?", deg, (long long)devices, t->nranks);
  }
  rt_comm_finalize(t->world);
  t->world = NULL;
  return -1;
}

int rt_main(int argc, char **argv, const RtPlan *plan) {
  Trainer t = {.p = plan, .prog = prog_name(argc > 0 ? argv[0] : NULL, plan), .last_ckpt = -1,
               .loss = NAN};
  RtError err = {""};
  if (parse_flags(argc, argv, &t.o, &err) != 0 || check_flags(&t.o, plan, &err) != 0) {
    fprintf(stderr, "%s: error: %s\n", t.prog, err.msg);
    return 2;
  }
  if (t.o.help) {
    usage(stdout, t.prog, plan);
    return 0;
  }
  /* The handlers go in before MPI_Init (which installs none for these two; it takes a while):
   * a signal from then on stops the run after its first step, with a checkpoint. */
  struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term;
  sigemptyset(&sa.sa_mask); /* the handler runs with both blocked: one stop_at */
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  stop_signal = 0;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  t.nranks = 1;
  if (join_ranks(&t, &argc, &argv) != 0) {
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return 2;
  }
  t.verbose = !t.o.quiet && t.rank == 0;
  t.tty = isatty(STDERR_FILENO);
  int rc = finish(&t, run_all(&t));
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  stop_signal = 0;
  free_all(&t);
  rt_trace_close();
  for (int a = 0; a < 3; a++)
    if (t.run.axis_comm[a]) rt_comm_free(t.run.axis_comm[a]);
  if (t.world) rt_comm_finalize(t.world);
  return rc;
}
