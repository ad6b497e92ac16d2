/* main.c: the `cplanc` driver. Parses the command line against the table of
 * subcommands, runs the passes in order (parse -> sema -> settings -> elaborate ->
 * report), and maps the outcome to the exit status: 0 success, 1 user error (a
 * diagnostic was printed), 2 bad usage. */
#include "build.h"
#include "calibrate_cmd.h"
#include "check.h"
#include "cplan.h"
#include "ir.h"
#include "plan_cmd.h"
#include "search.h"
#include "sema.h"
#include "train.h"
#include "../codegen/cg_common.h"
#include "../kernels/cuda/attn_layout.h"
#include "../runtime/cplanrt.h"

#include <errno.h>

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { EXIT_OK = 0, EXIT_USER = 1, EXIT_USAGE = 2 };

typedef struct Options {
  const char *file;
  const char *train;  /* --train NAME */
  const char *model;  /* --model NAME */
  const char *stage;  /* emit --stage=... */
  bool json;
  bool explain;       /* plan --explain */
  VEC(const char *) sets; /* --set key=value */
  const char *out;    /* data: -o PATH */
  const char *val;    /* data: --val FRACTION */
  const char *kind;   /* data: the kind of input ("text") */
  const char *keep_c; /* build: --keep-c DIR */
  const char *plan;   /* build: --plan PLAN.json */
  const char *top;    /* plan: --top K */
  const char *trace;  /* plan: --trace FILE.json */
  const char *report; /* plan: --report FILE.html */
  const char *np;     /* calibrate: --np N */
  bool quick;         /* calibrate: --quick */
  bool need_data;     /* run: a missing data file is an error (sema_need_data) */
  char **rest;        /* run: the program's arguments, after `--` */
  int nrest;
} Options;

typedef int (*CmdFn)(Options *o);

static int cmd_check(Options *o);
static int cmd_emit(Options *o);
static int cmd_data(Options *o);
static int cmd_build(Options *o);
static int cmd_run(Options *o);
static int cmd_plan(Options *o);
static int cmd_calibrate(Options *o);

/* The subcommand table: --help, dispatch and "did you mean" read it.
 * Checklist: a new command needs a row here and a section in README.md. */
typedef struct Command {
  const char *name;
  CmdFn run;          /* NULL: planned, not available in this version */
  const char *summary;
  const char *usage;  /* the text of `cplanc NAME --help` */
} Command;

static const Command commands[] = {
    {"check", cmd_check, "type-check a .cplan file and summarize the model, mesh and plan",
     "usage: cplanc check FILE [--json] [--train NAME] [--model NAME] [--set KEY=VALUE]...\n"
     "\n"
     "Parses and checks FILE (names, types, shapes, units, settings) and prints the\n"
     "parameter count, the param table, forward FLOPs and activation memory per sample,\n"
     "a per-layer table, the mesh and the training plan. Data files need not exist.\n"
     "\n"
     "  --json          print the summary as one JSON object on stdout\n"
     "  --train NAME    the train block to use when the file has several\n"
     "  --model NAME    summarize this model (default: the train block's model)\n"
     "  --set KEY=VALUE override a setting: train.steps=100, train.optimizer.lr=3e-4,\n"
     "                  train.model.L=4, mesh.laptop.shape.cpu=2 (repeatable)\n"},
    {"emit", cmd_emit, "print an intermediate form of the compilation",
     "usage: cplanc emit --stage=STAGE FILE [--train NAME] [--model NAME] [--plan PLAN.json]\n"
     "                   [--set KEY=VALUE]...\n"
     "\n"
     "--plan: the strategy of a `cplanc plan --json` file, as `build --plan` takes it.\n"
     "\n"
     "Stages available:\n"
     "  ast   the syntax tree, after imports are resolved\n"
     "  ir    the forward Graph IR of the model, one line per node\n"
     "  grad  the training graph: forward, backward (gradients, accumulation) and the\n"
     "        optimizer update of the train block, one line per node\n"
     "  c     the generated C program plan.c of the train block (what `build` compiles;\n"
     "        on a GPU mesh the CUDA program's)\n"
     "  llvm  the optimized LLVM IR of the fused elementwise kernels plan.c calls\n"
     "  cuda  the same fused kernels as standalone CUDA C (nvcc --ptx, NVRTC); on a GPU mesh\n"
     "        the CUDA program's kernels.cu\n"},
    {"plan", cmd_plan, "search the strategy and rank the best ones; explain a strategy's placements",
     "usage: cplanc plan FILE [--top K] [--explain] [--json] [--trace F.json] [--report F.html]\n"
     "                        [--plan F.json] [--train NAME] [--set KEY=VALUE]...\n"
     "\n"
     "Searches the train block's strategy (what `strategy` pins is kept) with the cost model\n"
     "of the mesh and prints the K fastest plans that fit the memory limit: dp, tp, pp, sp,\n"
     "zero, micro-batch, recompute, schedule, predicted step time, tokens/s, MFU, memory and\n"
     "bytes sent per device, pipeline bubble. With a pinned strategy, --explain prints that\n"
     "strategy as written: its degrees, stages, placements and every collective.\n"
     "\n"
     "  --top K         rows of the ranking (default 5)\n"
     "  --explain       also print every param's and activation's placement ([S(0), R], ...)\n"
     "                  and every collective of the best (or pinned) strategy\n"
     "  --json          print the plans as one JSON object (format cplan-plan/1; `build --plan`\n"
     "                  reads it) with the explanation of the best (or pinned) strategy\n"
     "  --trace F.json  write the simulated step of the best plan as a Chrome/Perfetto trace\n"
     "  --report F.html write a page with the pipeline timeline, the memory breakdown and a\n"
     "                  chart of the top K (step time against memory)\n"
     "  --plan F.json   the best plan of a saved `plan --json`, as a pinned strategy (with its\n"
     "                  params' tp placements): --explain prints what `build --plan` builds\n"
     "  --train NAME    the train block to use when the file has several\n"
     "  --set KEY=VALUE override a setting (see `cplanc check --help`)\n"},
    {"build", cmd_build, "compile a training program (CPU: one device, or dp/tp over MPI ranks)",
     "usage: cplanc build FILE -o PROG [--train NAME] [--set KEY=VALUE]... [--keep-c DIR] [--plan F.json]\n"
     "\n"
     "Compiles the train block of FILE into the executable PROG: autodiff, the optimizer,\n"
     "memory planning, then plan.c (C, one kernel call per IR node) compiled with the\n"
     "system C compiler and linked with the cplan runtime, its kernels and OpenBLAS.\n"
     "`PROG --help` lists the program's flags.\n"
     "\n"
     "  -o PROG         the executable to write\n"
     "  --keep-c DIR    also write the generated plan.c into DIR\n"
     "  --plan F.json   build the best plan of a saved `cplanc plan --json` (its strategy\n"
     "                  replaces the file's)\n"
     "  --train NAME    the train block to use when the file has several\n"
     "  --set KEY=VALUE override a setting (see `cplanc check --help`)\n"
     "\n"
     "Environment: CPLAN_HOME (an installed cplan: include/ and lib/), CPLAN_CC (the C\n"
     "compiler, default cc).\n"},
    {"run", cmd_run, "build (cached) and run a training program",
     "usage: cplanc run FILE [--train NAME] [--set KEY=VALUE]... [-- PROGRAM ARGS...]\n"
     "\n"
     "Builds FILE as `cplanc build` does into a cache, unless the same sources, overrides\n"
     "and cplanc version were built before, then runs the program with the arguments\n"
     "after `--`. The cache is .cplan-cache/ next to FILE, or $CPLAN_CACHE.\n"},
    {"calibrate", cmd_calibrate, "measure this machine and write a device profile for the cost model",
     "usage: cplanc calibrate -o PROFILE.json [--np N] [--quick]\n"
     "\n"
     "Measures this machine as N CPU devices (N MPI ranks, each with the CPUs / N threads a plan\n"
     "rank gets): OpenBLAS sgemm by size (flops_f32 and efficiency per size), a stream triad\n"
     "(hbm), the layer_norm, softmax and gelu kernels (efficiency against hbm) and, when N > 1,\n"
     "all_reduce, all_gather, reduce_scatter and broadcast by size from 4 KiB to 64 MiB\n"
     "(intra_bw and intra_latency from a ring fit). Prints the table as it measures and writes\n"
     "the profile that `device = profile(\"PROFILE.json\")` reads (docs/language.md, section 6).\n"
     "CPU only: NCCL and GPU kernels are not measured. About 5 s for N = 1, 10-20 s for N = 2.\n"
     "\n"
     "  -o FILE         the profile to write (through FILE.tmp and a rename)\n"
     "  --np N          ranks to measure on, started with `mpirun -np N --oversubscribe`\n"
     "                  (default 1: no collectives; use the mesh's device count)\n"
     "  --quick         small sizes and few repetitions: rough figures in about a second\n"
     "\n"
     "Environment: CPLAN_MPIEXEC (the MPI launcher, default the one found at configure time),\n"
     "CPLAN_HOME (an installed cplan: its bin/cplan-calibrate).\n"},
    {"data", cmd_data, "turn a text file into training data (byte-level tokens)",
     "usage: cplanc data text FILE -o OUT.bin [--val FRACTION]\n"
     "\n"
     "Writes the bytes of FILE as tokens (vocab 256) in llm.c's token format, which\n"
     "`data = tokens(\"OUT.bin\")` reads. With --val, the last FRACTION of the bytes\n"
     "(0 < FRACTION < 1) goes to a validation file beside OUT, named OUT with\n"
     "`.bin` replaced by `_val.bin`, and the rest to OUT.\n"},
};
enum { NCOMMANDS = sizeof commands / sizeof commands[0] };

static const Command *command_named(const char *name) {
  for (int i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  cp_unreachable();
}

static void print_help(FILE *f) {
  fprintf(f,
          "cplanc %s: a compiler for parallel training plans\n\n"
          "usage: cplanc COMMAND [options] FILE\n\ncommands:\n",
          CPLAN_VERSION);
  for (int i = 0; i < NCOMMANDS; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n`cplanc COMMAND --help` describes a command. Exit status: 0 success,\n"
             "1 an error in the input (diagnosed), 2 bad usage.\n");
}

static int usage_error(const Command *c, const char *fmt, const char *arg) {
  fprintf(stderr, "cplanc: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n");
  if (c) fprintf(stderr, "%s", c->usage);
  else fprintf(stderr, "run 'cplanc --help' for the commands\n");
  return EXIT_USAGE;
}

/* Finishes a command: says how many errors there were and picks the status. */
static int finish(void) {
  int n = diag_errors();
  if (n == 0) return EXIT_OK;
  fprintf(stderr, "%d error%s generated.\n", n, n == 1 ? "" : "s");
  return EXIT_USER;
}

/* ---- the passes shared by check and emit ---------------------------------- */

typedef struct Front {
  Program *prog;
  Sema *sema;
  TrainConf *train;
  VEC(const Item *) models; /* the models to elaborate */
} Front;

/* The value of the training program's flag NAME among run's arguments after `--` (`NAME V` or
 * `NAME=V`; the last one, as the program reads them), or NULL. */
static const char *program_arg(const Options *o, const char *name) {
  const char *v = NULL;
  size_t n = strlen(name);
  for (int i = 0; i < o->nrest; i++) {
    if (strcmp(o->rest[i], name) == 0 && i + 1 < o->nrest) v = o->rest[++i];
    else if (strncmp(o->rest[i], name, n) == 0 && o->rest[i][n] == '=') v = o->rest[i] + n + 1;
  }
  return v;
}

/* run: the files the training program reads first (--data, --init, --resume DIR) exist, checked
 * here once rather than failing in every rank after the build. False after an error. */
static bool program_inputs(const Options *o) {
  static const struct { const char *flag; bool dir; } in[] = {
      {"--data", false}, {"--init", false}, {"--resume", true}};
  bool ok = true;
  for (size_t k = 0; k < sizeof in / sizeof in[0]; k++) {
    const char *p = program_arg(o, in[k].flag);
    struct stat st;
    if (!p) continue;
    bool absent = stat(p, &st) != 0;
    if (absent) {
      diag_error(SPAN_NONE, "`-- %s %s`: %s", in[k].flag, p, strerror(errno));
    } else if (in[k].dir != !!S_ISDIR(st.st_mode)) {
      diag_error(SPAN_NONE, "`-- %s %s`: expected a %s, got a %s", in[k].flag, p,
                 in[k].dir ? "directory" : "file", in[k].dir ? "file" : "directory");
    } else {
      continue;
    }
    if (absent && strcmp(in[k].flag, "--data") == 0) sema_hint_make_tokens(p);
    if (strcmp(in[k].flag, "--resume") == 0)
      diag_hint("--resume takes the --checkpoint-dir a run wrote (DIR/step_NNNNNN/), or one step's directory");
    ok = false;
  }
  return ok;
}

/* Parse, index, apply overrides, check the settings, and pick the models. */
static bool front_end(Options *o, Front *fe, bool need_settings) {
  memset(fe, 0, sizeof *fe);
  fe->prog = parse_program(o->file);
  if (!fe->prog || diag_errors()) return false;
  if (!need_settings) return true;
  fe->sema = sema_new(fe->prog);
  if (o->need_data) { /* the program's --data replaces the plan's training file */
    if (!program_inputs(o)) return false;
    sema_need_data(fe->sema, program_arg(o, "--data") ? NEED_REPLACED : NEED_ERROR, NEED_ERROR);
  }
  if (o->sets.n && !settings_apply_overrides(fe->sema, o->sets.a, o->sets.n, o->train)) return false;
  settings_check_meshes(fe->sema);
  bool none = false;
  fe->train = settings_train(fe->sema, o->train, &none);
  if (diag_errors()) return false;
  if (fe->train && train_cuda(fe->train)) sema_set_attention_limit(fe->sema, CPLAN_ATTN_MAX_HEAD_DIM);

  if (o->model) {
    const Item *m = sema_find_item(fe->sema, o->model);
    if (!m || m->kind != IT_MODEL) {
      int n;
      const char *const *names = sema_item_names(fe->sema, IT_MODEL, &n);
      const char *near = cp_closest(o->model, names, n);
      diag_error(SPAN_NONE, "--model: no model named '%s' in %s", o->model, o->file);
      if (near) diag_hint("did you mean '%s'?", near);
      return false;
    }
    VEC_PUSH(fe->models, m);
  } else if (fe->train) {
    VEC_PUSH(fe->models, fe->train->model);
  } else {
    /* No train block: every model of the main file, with its defaults. */
    for (int i = 0; i < fe->prog->nitems; i++) {
      const Item *it = fe->prog->items[i];
      if (it->kind == IT_MODEL && it->file == fe->prog->main_file) VEC_PUSH(fe->models, it);
    }
    if (fe->models.n == 0) {
      diag_error(SPAN_NONE, "%s defines no model and no train block: nothing to check", o->file);
      return false;
    }
  }
  return true;
}

/* The batch B is bound to: the micro-batch of one data-parallel rank (train_micro); 1 without
 * a plan. Reports divide by it to give per-sample figures. */
static int64_t graph_batch(const TrainConf *t) {
  if (!t) return 1;
  int64_t b = train_micro(t);
  return b > 0 ? b : 1;
}

static Graph *elaborate(Front *fe, const Item *model) {
  const TrainConf *t = fe->train && fe->train->model == model ? fe->train : NULL;
  int errors = diag_errors();
  long shapes = ir_shape_strs;
  Graph *g = sema_build_model(fe->sema, model, t ? t->model_call : NULL, graph_batch(t));
  /* Shapes in the errors printed B as the 1 the graph was built with. */
  if (!g && !t && diag_errors() > errors && ir_shape_strs > shapes)
    diag_note(model->name_span, "shapes in these messages take the batch dim B as 1: no train block of model '%s' "
              "sets the batch", model->name);
  return g;
}

/* adder data the model cannot take, known before any program runs (the program checks it too, as it
 * starts): its 13 tokens need a vocab of 13, and a problem of d digits a sequence of 3d + 2 tokens. */
static bool adder_fits(const Graph *g, const TrainConf *t) {
  if (!g || !t || t->data.kind != DATA_ADDER || g->inputs.n < 1) return true;
  const Node *x = &g->nodes[g->inputs.a[0]];
  int64_t vocab = cg_vocab(g, NULL), need = 3 * (int64_t)t->data.digits + 2;
  bool ok = true;
  if (vocab > 0 && vocab < RT_ADD_VOCAB) {
    diag_error(t->data.span, "adder data has %d tokens (digits, '+', '=', end) but model '%s' has a vocab of %lld",
               RT_ADD_VOCAB, g->model_name, (long long)vocab);
    diag_hint("give the model a vocab of at least %d", RT_ADD_VOCAB);
    ok = false;
  }
  if (x->shape.rank == 2 && x->shape.d[1] < need) {
    diag_error(t->data.span, "adder(digits = %lld) needs a sequence length of at least %lld (a + b = c, c reversed), "
               "model '%s' has %lld", (long long)t->data.digits, (long long)need, g->model_name, (long long)x->shape.d[1]);
    diag_note(x->span, "input '%s' is %s%s", x->name, dtype_name(x->dtype), shape_str(&x->shape));
    ok = false;
  }
  return ok;
}

/* ---- commands ------------------------------------------------------------------ */

static int cmd_check(Options *o) {
  Front fe;
  if (!front_end(o, &fe, true)) return finish();
  if (o->json && fe.models.n > 1) {
    diag_error(SPAN_NONE, "%s has %d models and no train block: pass --model NAME with --json", o->file,
               fe.models.n);
    return finish();
  }
  VEC(Graph *) graphs = {0};
  for (int i = 0; i < fe.models.n && !diag_too_many(); i++) VEC_PUSH(graphs, elaborate(&fe, fe.models.a[i]));
  /* what build would refuse of the trained model: a loss without a gradient, inputs the data cannot
   * feed, pinned degrees the model does not divide */
  for (int i = 0; i < graphs.n && !diag_errors(); i++)
    if (fe.train && fe.train->model == fe.models.a[i] && graphs.a[i] && ad_loss_trainable(graphs.a[i]) &&
        cg_check_inputs(graphs.a[i], fe.train, true) && adder_fits(graphs.a[i], fe.train))
      strat_check_pinned(sema_program(fe.sema), graphs.a[i], fe.train);
  if (diag_errors()) return finish();
  for (int i = 0; i < graphs.n; i++) {
    const Graph *g = graphs.a[i];
    const TrainConf *t = fe.train && fe.train->model == fe.models.a[i] ? fe.train : NULL;
    const MeshConf *m = t ? t->mesh : NULL;
    if (o->json) check_print_json(stdout, g, t, m);
    else {
      if (i) fputc('\n', stdout);
      check_print_text(stdout, g, t, m);
    }
  }
  return finish();
}

/* The train block's model, elaborated; NULL after a diagnostic (also when there is no train
 * block: build, run and `emit --stage=c` need one). */
/* A partly pinned strategy with the fields it leaves out at their defaults (language.md §3). */
static StrategyConf strategy_defaults(const TrainConf *t) {
  StrategyConf d = t->strategy;
  d.dp = train_dp(t), d.micro = train_micro(t);
  if (d.tp <= 0) d.tp = 1;
  if (d.pp <= 0) d.pp = 1;
  if (d.sp <= 0) d.sp = 1;
  if (d.zero < 0) d.zero = 0;
  if (d.recompute == RC_SEARCH) d.recompute = RC_NONE;
  if (d.pipeline == PS_SEARCH) d.pipeline = PS_1F1B;
  return d;
}

/* `strategy = auto` on a mesh of several devices: the search's best plan (search_best_runnable),
 * else, when it finds none, pure data parallelism (train_dp). A strategy that pins some fields
 * builds the others' defaults, unless that plan does not fit (device memory, or a tensor past the
 * kernels' 2^31 - 1 elements per rank) where one that pins those fields does: then the search
 * chooses the rest. One line on stderr says what the search chose. */
static void use_search(Sema *s, TrainConf *t) {
  const StrategyConf *st = &t->strategy;
  if (train_pinned(t)) return;
  StrategyConf best = *st;
  static const char *const rc[] = {"none", "selective", "full"}, *const ps[] = {"1f1b", "gpipe", "interleaved"};
  const char *why = "strategy = auto:";
  if (!st->is_auto) {
    TrainConf d = *t;
    d.strategy = strategy_defaults(t);
    StrategyConf def = d.strategy, ignored;
    /* defaults that do not cover the devices or divide the batch, an sp without or unlike tp, a ZeRO
     * without dp > 1 stay the build's errors (strat_degrees: `check` and `plan` say the same) */
    if (def.dp * def.tp * def.pp != t->mesh->ndevices || t->batch % (def.dp * def.micro) != 0 ||
        (def.sp > 1 && def.sp != def.tp) || (def.zero > 0 && def.dp <= 1))
      return;
    if (search_best_runnable(s, &d, &ignored) || !search_best_runnable(s, t, &best)) return;
    why = cp_fmt("strategy: the defaults of the fields it leaves out (dp %lld, micro %lld, zero %lld, recompute %s) "
                 "do not fit, so", (long long)def.dp, (long long)def.micro, (long long)def.zero, rc[def.recompute]);
  } else if (!search_best_runnable(s, t, &best)) {
    fprintf(stderr, "cplanc: strategy = auto: the search found no plan that fits (`cplanc plan` says why); building "
            "pure data parallelism instead\n");
    return;
  }
  fprintf(stderr, "cplanc: %s the search chose dp %lld, tp %lld, pp %lld, sp %lld, zero %lld, micro %lld, "
          "recompute %s%s%s%s (`cplanc plan` ranks the alternatives)\n", why, (long long)best.dp, (long long)best.tp,
          (long long)best.pp, (long long)(best.sp > 0 ? best.sp : 1), (long long)best.zero, (long long)best.micro,
          best.recompute >= 0 ? rc[best.recompute] : "none", best.pp > 1 ? ", schedule " : "",
          best.pp > 1 && best.pipeline >= 0 ? ps[best.pipeline] : "",
          best.tp_pins ? ", the params placed on tp by its ILP" : "");
  t->strategy = best;
}

static Graph *train_model(Options *o, Front *fe, const char *what) {
  if (!front_end(o, fe, true)) return NULL;
  if (!fe->train) {
    diag_error(SPAN_NONE, "%s needs a train block: %s has none", what, o->file);
    return NULL;
  }
  if (o->plan && !plan_load(o->plan, &fe->train->strategy)) return NULL;
  /* the kernels --stage=llvm and (on a CPU mesh) --stage=cuda print are those of the one-device
   * program; on a CUDA mesh --stage=cuda prints the kernels.cu of what build compiles */
  bool one = strcmp(what, "--stage=llvm") == 0 || (strcmp(what, "--stage=cuda") == 0 && !train_cuda(fe->train));
  if (!o->plan && !one) use_search(fe->sema, fe->train);
  /* a plan lowered per rank is elaborated for the global micro-batch (train.h) */
  Graph *g = sema_train_graph(fe->sema, fe->train, train_graph_batch(fe->train));
  /* degrees check refuses (sp without tp, say) are refused here with check's words, before the
   * backends' own checks: sp alone does not lower, so none of theirs would name the cause (what
   * needs the graph, strat_pin checks as it lowers) */
  int64_t dp, tp, pp, micro;
  return g && cg_check_inputs(g, fe->train, true) && adder_fits(g, fe->train) &&
         (one || fe->train->strategy.is_auto || strat_degrees(sema_program(fe->sema), fe->train, &dp, &tp, &pp, &micro))
         ? g : NULL;
}

/* --stage=c (plan.c), --stage=llvm and --stage=cuda (its fused kernels as LLVM IR, as CUDA C):
 * all need a train block. */
static int emit_c(Options *o, const char *stage) {
  Front fe;
  Graph *g = train_model(o, &fe, cp_fmt("--stage=%s", stage));
  if (g && strcmp(stage, "llvm") == 0) build_emit_llvm(stdout, g, fe.train);
  else if (g && strcmp(stage, "cuda") == 0) build_emit_cuda(stdout, g, fe.train);
  else if (g) build_emit_c(stdout, g, fe.train);
  return finish();
}

static int cmd_build(Options *o) {
  if (!o->out) return usage_error(command_named("build"), "build needs -o PROG%s", "");
  Front fe;
  Graph *g = train_model(o, &fe, "build");
  if (!g) return finish();
  BuildOpts bo = {.out = o->out, .keep_c = o->keep_c, .hash = build_hash(o->sets.a, o->sets.n, o->train)};
  build_program(g, fe.train, &bo);
  return finish();
}

static int cmd_run(Options *o) {
  Front fe;
  o->need_data = true;
  Graph *g = train_model(o, &fe, "run");
  if (g) build_run(g, fe.train, o->file, build_hash(o->sets.a, o->sets.n, o->train), o->rest, o->nrest);
  return finish();
}

static int cmd_plan(Options *o) {
  Front fe;
  if (!front_end(o, &fe, true)) return finish();
  if (!fe.train) diag_error(SPAN_NONE, "plan needs a train block: %s has none", o->file);
  else {
    PlanOpts po = {.explain = o->explain, .json = o->json, .trace = o->trace, .report = o->report};
    if (o->top) {
      char *end;
      long k = strtol(o->top, &end, 10);
      if (end == o->top || *end || k < 1 || k > 1000)
        return usage_error(command_named("plan"), "--top takes a number from 1 to 1000, got '%s'", o->top);
      po.top = (int)k;
    }
    if (!o->plan || plan_load(o->plan, &fe.train->strategy)) plan_cmd_run(stdout, fe.sema, fe.train, &po);
  }
  return finish();
}

static int cmd_calibrate(Options *o) {
  const Command *c = command_named("calibrate");
  if (!o->out) return usage_error(c, "calibrate needs -o PROFILE.json%s", "");
  CalibrateOpts co = {.out = o->out, .np = 1, .quick = o->quick};
  if (o->np) {
    char *end;
    long n = strtol(o->np, &end, 10);
    if (end == o->np || *end || n < 1 || n > 1024)
      return usage_error(c, "--np takes a number of ranks from 1 to 1024, got '%s'", o->np);
    co.np = (int)n;
  }
  calibrate_run(&co);
  return finish();
}

static int cmd_emit(Options *o) {
  static const char *const stages[] = {"ast", "ir", "grad", "c", "llvm", "cuda"};
  if (!o->stage) return usage_error(command_named("emit"), "emit needs --stage=STAGE%s", "");
  bool ast = strcmp(o->stage, "ast") == 0, grad = strcmp(o->stage, "grad") == 0;
  if (strcmp(o->stage, "c") == 0 || strcmp(o->stage, "llvm") == 0 || strcmp(o->stage, "cuda") == 0)
    return emit_c(o, o->stage);
  if (!ast && !grad && strcmp(o->stage, "ir") != 0) {
    const char *near = cp_closest(o->stage, stages, 6);
    fprintf(stderr, "cplanc: unknown stage '%s'%s%s%s\n", o->stage, near ? " (did you mean '" : "",
            near ? near : "", near ? "'?)" : "");
    fprintf(stderr, "%s", command_named("emit")->usage);
    return EXIT_USAGE;
  }
  Front fe;
  if (!front_end(o, &fe, !ast)) return finish();
  if (ast) {
    ast_print(stdout, fe.prog);
    return finish();
  }
  if (grad && !fe.train) {
    diag_error(SPAN_NONE, "--stage=grad needs a train block: %s has none", o->file);
    return finish();
  }
  for (int i = 0; i < fe.models.n && !diag_too_many(); i++) {
    Graph *g = elaborate(&fe, fe.models.a[i]);
    if (g && grad && !train_graph(g, fe.train)) continue;
    if (g) ir_print(stdout, g);
  }
  return finish();
}

/* `cplanc data text FILE -o OUT [--val F]`: byte-level tokens, as nanoGPT's
 * shakespeare_char does with characters, so any text trains with vocab 256. */
static int write_token_file(const char *path, const unsigned char *bytes, int64_t n) {
  uint16_t *toks = cp_alloc((size_t)(n > 0 ? n : 1) * sizeof *toks);
  for (int64_t i = 0; i < n; i++) toks[i] = bytes[i];
  RtError err = {0};
  if (rt_tokens_write(path, toks, n, &err) < 0) {
    diag_error(SPAN_NONE, "%s", err.msg);
    return -1;
  }
  printf("wrote %s token%s to %s\n", cp_commas(n), n == 1 ? "" : "s", path);
  return 0;
}

static const char *val_path(const char *out) {
  size_t n = strlen(out);
  if (n > 4 && strcmp(out + n - 4, ".bin") == 0) return cp_fmt("%.*s_val.bin", (int)(n - 4), out);
  return cp_fmt("%s_val.bin", out);
}

/* Whether paths a and b name the same existing file (a link or another spelling included). */
static bool same_file(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int cmd_data(Options *o) {
  const Command *c = command_named("data");
  if (!o->kind || strcmp(o->kind, "text") != 0)
    return usage_error(c, "unknown data kind '%s': the kind is 'text'", o->kind ? o->kind : "");
  if (!o->out) return usage_error(c, "data text needs -o OUT.bin%s", "");
  double frac = 0;
  if (o->val) {
    char *end;
    frac = strtod(o->val, &end);
    if (*end || !(frac > 0 && frac < 1)) return usage_error(c, "--val takes a fraction between 0 and 1, got '%s'", o->val);
  }
  int file = src_load(o->file);
  if (file < 0) {
    diag_error(SPAN_NONE, "cannot open '%s': %s", o->file, strerror(errno));
    return finish();
  }
  const char *outs[2] = {o->out, o->val ? val_path(o->out) : NULL};
  for (int k = 0; k < 2; k++)
    if (outs[k] && same_file(o->file, outs[k])) {
      diag_error(SPAN_NONE, "'%s' is the text being read: writing the tokens there would replace it", outs[k]);
      diag_hint("write the tokens to another file, e.g. -o %s.bin", o->file);
      return finish();
    }
  const unsigned char *bytes = (const unsigned char *)src_text(file);
  int64_t n = (int64_t)src_len(file), nval = (int64_t)(frac * (double)n);
  if (n - nval < 2) {
    diag_error(SPAN_NONE, "'%s' has %lld bytes: too little text to train on", o->file, (long long)n);
    return finish();
  }
  if (write_token_file(o->out, bytes, n - nval) == 0 && nval > 0)
    write_token_file(val_path(o->out), bytes + (n - nval), nval);
  return finish();
}

/* ---- command line ------------------------------------------------------------------ */

/* Matches --name VALUE and --name=VALUE; advances *i past what it consumed. */
static bool opt_value(int argc, char **argv, int *i, const char *name, const char **val, int *status) {
  size_t n = strlen(name);
  const char *a = argv[*i];
  if (strncmp(a, name, n) != 0) return false;
  if (a[n] == '=') {
    *val = a + n + 1;
    return true;
  }
  if (a[n] != 0) return false;
  if (*i + 1 >= argc) {
    fprintf(stderr, "cplanc: %s needs a value\n", name);
    *status = EXIT_USAGE;
    return true;
  }
  *val = argv[++*i];
  return true;
}

static int run_command(const Command *c, int argc, char **argv) {
  Options o = {0};
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = NULL;
    int status = 0;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(c->usage, stdout);
      return EXIT_OK;
    } else if (strcmp(a, "--json") == 0) {
      o.json = true;
    } else if (c->run == cmd_plan && strcmp(a, "--explain") == 0) {
      o.explain = true;
    } else if (opt_value(argc, argv, &i, "--set", &v, &status)) {
      if (v) VEC_PUSH(o.sets, v);
    } else if (opt_value(argc, argv, &i, "--train", &v, &status)) {
      o.train = v;
    } else if (opt_value(argc, argv, &i, "--model", &v, &status)) {
      o.model = v;
    } else if (opt_value(argc, argv, &i, "--stage", &v, &status)) {
      o.stage = v;
    } else if ((c->run == cmd_data || c->run == cmd_build || c->run == cmd_calibrate) &&
               opt_value(argc, argv, &i, "-o", &v, &status)) {
      o.out = v;
    } else if (c->run == cmd_build && opt_value(argc, argv, &i, "--keep-c", &v, &status)) {
      o.keep_c = v;
    } else if ((c->run == cmd_build || c->run == cmd_emit || c->run == cmd_plan) &&
               opt_value(argc, argv, &i, "--plan", &v, &status)) {
      o.plan = v;
    } else if (c->run == cmd_plan && opt_value(argc, argv, &i, "--top", &v, &status)) {
      o.top = v;
    } else if (c->run == cmd_plan && opt_value(argc, argv, &i, "--trace", &v, &status)) {
      o.trace = v;
    } else if (c->run == cmd_plan && opt_value(argc, argv, &i, "--report", &v, &status)) {
      o.report = v;
    } else if (c->run == cmd_run && strcmp(a, "--") == 0) {
      o.rest = argv + i + 1;
      o.nrest = argc - i - 1;
      break;
    } else if (c->run == cmd_calibrate && opt_value(argc, argv, &i, "--np", &v, &status)) {
      o.np = v;
    } else if (c->run == cmd_calibrate && strcmp(a, "--quick") == 0) {
      o.quick = true;
    } else if (c->run == cmd_data && opt_value(argc, argv, &i, "--val", &v, &status)) {
      o.val = v;
    } else if (a[0] == '-' && a[1]) {
      if (c->run == cmd_run) /* the program's flags go after -- */
        return usage_error(c, cp_fmt("unknown option '%%s' (the training program's flags go after --: "
                                     "cplanc run FILE -- %s ...)", a), a);
      return usage_error(c, "unknown option '%s'", a);
    } else if (c->run == cmd_data && !o.kind) {
      o.kind = a;
    } else if (c->run == cmd_calibrate) {
      return usage_error(c, "calibrate takes no input file ('%s')", a);
    } else if (o.file) {
      return usage_error(c, "more than one input file ('%s')", a);
    } else {
      o.file = a;
    }
    if (status) return status;
  }
  if (!o.file && c->run != cmd_calibrate) return usage_error(c, "%s needs a .cplan file", c->name);
  return c->run(&o);
}

int main(int argc, char **argv) {
  const char *nc = getenv("NO_COLOR");
  diag_set_color(isatty(2) && !(nc && *nc));
  if (argc < 2) {
    print_help(stderr);
    return EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    print_help(stdout);
    return EXIT_OK;
  }
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
    printf("cplanc %s (CUDA backend %s)\n", CPLAN_VERSION, CPLAN_HAVE_CUDA ? "built" : "not built");
    return EXIT_OK;
  }
  const char *names[NCOMMANDS];
  for (int i = 0; i < NCOMMANDS; i++) {
    names[i] = commands[i].name;
    if (strcmp(cmd, commands[i].name) != 0) continue;
    if (!commands[i].run) {
      fprintf(stderr, "cplanc: '%s' is not available in this version yet (see 'cplanc --help')\n", cmd);
      return EXIT_USAGE;
    }
    return run_command(&commands[i], argc - 2, argv + 2);
  }
  const char *near = cp_closest(cmd, names, NCOMMANDS);
  fprintf(stderr, "cplanc: unknown command '%s'\n", cmd);
  if (near) fprintf(stderr, "hint: did you mean '%s'?\n", near);
  else fprintf(stderr, "run 'cplanc --help' for the commands\n");
  return EXIT_USAGE;
}
