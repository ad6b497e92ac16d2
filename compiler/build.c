/* build.c: `cplanc build` and `cplanc run` (build.h). The passes after the front end run here in
 * order: train_graph (autodiff, optimizer) -> cg_emit_c (memory planning, plan.c) -> the system C
 * compiler, which links plan.c with libcplanrt, libcplankernels, OpenBLAS and cJSON. Where those
 * live comes from cplan_config.h, written by CMake, or from $CPLAN_HOME. */
#include "build.h"

#include "../codegen/codegen.h"
#include "../codegen/emit_cu.h"
#include "cplan_config.h"
#include "lower.h"
#include "pipeline.h"
#include "train.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

/* ---- the hash that names a build ----------------------------------------------------------- */

static void fnv(uint64_t *h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) *h = (*h ^ p[i]) * 0x100000001b3ULL;
}

static void fnv_str(uint64_t h[2], const char *s) {
  size_t n = s ? strlen(s) + 1 : 0; /* the terminator separates consecutive strings */
  fnv(&h[0], s ? s : "", n);
  fnv(&h[1], s ? s : "", n);
}

/* The strategy and the mesh (the sets that name them) change how a plan is split over devices,
 * not what it computes: checkpoints carry a hash without them, so a tensor-parallel checkpoint
 * resumes on one device. build_hash computes it alongside; cg_set_resume_hash hands it on. */
static bool strategy_set(const char *s) {
  return strncmp(s, "train.strategy", 14) == 0 || strncmp(s, "train.mesh", 10) == 0 || strncmp(s, "mesh.", 5) == 0;
}

static void resume_hash(const char *const *sets, int nsets, const char *train) {
  uint64_t h[2] = {0x6c62272e07bb0142ULL, 0x62b821756295c58dULL};
  fnv_str(h, "cplanc " CPLAN_VERSION);
  for (int f = 0; f < src_count(); f++) {
    if (src_path(f)[0] == '<') continue; /* the --set pseudo-sources: the sets below */
    fnv(&h[0], src_text(f), src_len(f));
    fnv(&h[1], src_text(f), src_len(f));
  }
  for (int k = 0; k < nsets; k++)
    if (!strategy_set(sets[k])) fnv_str(h, sets[k]);
  fnv_str(h, train ? train : "");
  cg_set_resume_hash(cp_fmt("%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]));
}

static void runtime_libs(const char *lib[2]);

const char *build_hash(const char *const *sets, int nsets, const char *train) {
  resume_hash(sets, nsets, train);
  uint64_t h[2] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL};
  fnv_str(h, "cplanc " CPLAN_VERSION);
  /* this cplanc and the libraries its programs link (size, modification time): a rebuilt or
   * reinstalled cplan of the same version rebuilds `cplanc run`'s cached programs */
  const char *files[3] = {"/proc/self/exe"};
  runtime_libs(files + 1);
  for (int k = 0; k < 3; k++) {
    struct stat st;
    if (stat(files[k], &st) == 0)
      fnv_str(h, cp_fmt("%lld %lld.%09ld", (long long)st.st_size, (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec));
  }
  for (int f = 0; f < src_count(); f++) {
    fnv_str(h, src_path(f));
    fnv(&h[0], src_text(f), src_len(f));
    fnv(&h[1], src_text(f), src_len(f));
  }
  for (int k = 0; k < nsets; k++) fnv_str(h, sets[k]);
  fnv_str(h, train ? train : "");
  return cp_fmt("%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]);
}

/* ---- running the C compiler ------------------------------------------------------------------- */

/* The stage files the last emit_any wrote (0: plan.c only). */
static int last_stages;

typedef CpArgv Argv;

static bool file_exists(const char *p) { return access(p, R_OK) == 0; }

/* The compile-and-link command for plan.c -> out. NULL after a diagnostic when the runtime or
 * kernel libraries are missing. */
/* The runtime and kernel libraries programs link with: CPLAN_HOME's, else this build tree's. */
static void runtime_libs(const char *lib[2]) {
  const char *home = getenv("CPLAN_HOME");
  if (home && *home) lib[0] = cp_fmt("%s/lib/libcplanrt.a", home), lib[1] = cp_fmt("%s/lib/libcplankernels.a", home);
  else lib[0] = CPLAN_BINARY_DIR "/runtime/libcplanrt.a", lib[1] = CPLAN_BINARY_DIR "/kernels/libcplankernels.a";
}

static Argv *cc_command(const char *plan_c, const char *obj, const char *out, int stages) {
  const char *home = getenv("CPLAN_HOME"), *cc = getenv("CPLAN_CC");
  const char *inc[2], *lib[2];
  if (home && *home) inc[0] = inc[1] = cp_fmt("%s/include", home);
  else inc[0] = CPLAN_SOURCE_DIR "/runtime", inc[1] = CPLAN_SOURCE_DIR "/kernels/cpu";
  runtime_libs(lib);
  for (int k = 0; k < 2; k++)
    if (!file_exists(lib[k])) {
      diag_error(SPAN_NONE, "cannot find the library %s that training programs link with", lib[k]);
      diag_hint("build cplan first (cmake --build), or set CPLAN_HOME to an installed cplan");
      return NULL;
    }
  Argv *a = cp_alloc(sizeof *a);
  cp_argv_words(a, cc && *cc ? cc : CPLAN_CC);
  cp_argv_words(a, "-std=gnu11 -O2 -march=native -w");
  VEC_PUSH(*a, cp_fmt("-I%s", inc[0]));
  VEC_PUSH(*a, cp_fmt("-I%s", inc[1]));
  cp_argv_words(a, CPLAN_EXTRA_CFLAGS);
  cp_argv_words(a, CPLAN_MPI_CFLAGS);
  cp_argv_words(a, CPLAN_SANITIZE_CFLAGS); /* empty unless cplan's own libraries are instrumented */
  VEC_PUSH(*a, plan_c);
  const char *slash = strrchr(plan_c, '/');
  for (int k = 0; k < stages; k++) VEC_PUSH(*a, cp_fmt("%.*splan_s%d.c", slash ? (int)(slash - plan_c + 1) : 0, plan_c, k));
  if (obj) VEC_PUSH(*a, obj);
  VEC_PUSH(*a, "-o");
  VEC_PUSH(*a, out);
  VEC_PUSH(*a, lib[0]);
  VEC_PUSH(*a, lib[1]);
  cp_argv_words(a, CPLAN_EXTRA_LIBS);
  cp_argv_words(a, CPLAN_MPI_LIBS);
  VEC_PUSH(*a, (const char *)NULL);
  return a;
}


static char *read_all(const char *path) {
  char *s = cp_read_text(path);
  return s ? s : cp_strdup("");
}

/* Compiles dir/plan.c, with dir/kernels.o when obj (the fused kernels), into out. */
static bool compile(const char *dir, bool obj, const char *out) {
  const char *plan_c = cp_fmt("%s/plan.c", dir), *log = cp_fmt("%s/cc.log", dir);
  Argv *a = cc_command(plan_c, obj ? cp_fmt("%s/kernels.o", dir) : NULL, out, last_stages);
  if (!a) return false;
  if (cp_run_logged(a, log)) return true;
  StrBuf cmd = {0};
  for (int k = 0; a->a[k]; k++) sb_printf(&cmd, "%s%s", k ? " " : "", a->a[k]);
  fprintf(stderr, "cplanc: internal error: the generated program does not compile. This is a bug in cplanc;\n"
                  "please report it with the file. The command was:\n  %s\n%s",
          sb_str(&cmd), read_all(log));
  diag_error(SPAN_NONE, "compiling the generated plan.c failed (internal error, see above)");
  return false;
}

/* ---- plan.c --------------------------------------------------------------------------------------- */



/* Tensor parallelism and ZeRO: the training graph is placed (strat_pin) and lowered to the graph
 * one rank runs (lower_spmd), which the emitter turns into plan.c with its collectives. The
 * training graph is built here with B bound to the global micro-batch dp * micro, as strat_pin
 * requires. NULL after a diagnostic. */
typedef struct Spmd {
  StratPlan *sp;
  Lowered *lw;
  Pipeline *pipe;    /* pp > 1: the stages (pipeline.h) */
} Spmd;

static bool is_spmd(const TrainConf *t) { return train_lowered(t); }

/* The interleaved schedule (Megatron's virtual pipeline: each of the pp devices runs 2 stages)
 * needs pp x 2 layers to cut and a micro-batch count that is a multiple of pp (runtime/train.c's
 * order sends micro-batches through the stages in groups of pp). */
static bool interleaved_ok(const StratPlan *sp, const TrainConf *t, int64_t dp, int64_t pp) {
  int64_t micro = train_micro(t), m = micro > 0 && dp > 0 ? t->batch / (dp * micro) : 0;
  int layers = sp->g->layer_names.n;
  if (layers < 2 * pp) {
    diag_error(strat_field_span(t, "pipeline"), "the interleaved schedule cuts the model into pp x 2 = %lld stages "
               "of whole layers, but model %s has %d layer%s", (long long)(2 * pp), sp->g->model_name, layers, layers == 1 ? "" : "s");
    if (layers >= 4) diag_hint("use `pipeline = \"1f1b\"`, or pp = %d at most", layers / 2);
    else diag_hint("use `pipeline = \"1f1b\"` (interleaving needs at least 4 layers)");
    return false;
  }
  if (m % pp != 0) {
    diag_error(strat_field_span(t, "pipeline"), "the interleaved schedule needs the micro-batch count to be a "
               "multiple of pp = %lld: batch %lld / (dp %lld x micro %lld) = %lld micro-batch%s", (long long)pp, (long long)t->batch,
               (long long)dp, (long long)micro, (long long)m, m == 1 ? "" : "es");
    diag_hint("choose `micro` so that batch / (dp x micro) is a multiple of %lld, or use `pipeline = \"1f1b\"`", (long long)pp);
    return false;
  }
  return true;
}

/* The name of a param the forward reads both before its first layer and after its last (a tied
 * embedding: the first and the last pipeline stage read it), else NULL. */
static const char *param_read_at_both_ends(const Graph *g) {
  int first = -1, last = -1;
  for (int j = 0; j < g->n; j++)
    if (g->nodes[j].role == ROLE_FWD && g->nodes[j].layer >= 0) last = j, first = first < 0 ? j : first;
  for (int i = 0; i < g->n && first >= 0; i++) {
    if (g->nodes[i].op != OP_PARAM) continue;
    bool before = false, after = false;
    for (int j = 0; j < g->n; j++) {
      const Node *r = &g->nodes[j];
      for (int k = 0; k < r->nin && r->role == ROLE_FWD; k++)
        if (r->in[k] == i) before |= j < first, after |= j > last;
    }
    if (before && after) return g->nodes[i].name ? g->nodes[i].name : "a param";
  }
  return NULL;
}

static bool spmd_lower(Graph *g, const TrainConf *t, Spmd *out) {
  int64_t dp, tp, pp, micro;
  if (!strat_degrees(NULL, t, &dp, &tp, &pp, &micro)) return false;
  /* g's B is bound to the global micro-batch dp * micro (train_graph_batch), as strat_pin wants */
  if (g->batch != dp * train_micro(t) || dp != train_dp(t)) {
    diag_error(t->strategy.span, "internal error: the model was elaborated for a micro-batch of %lld, the plan's "
               "is dp %lld x micro %lld", (long long)g->batch, (long long)dp, (long long)train_micro(t));
    return false;
  }
  (void)micro;
  TrainConf tc = *t;
  tc.strategy.dp = dp;
  tc.strategy.micro = train_micro(t);
  if (!train_graph(g, &tc)) return false;
  out->sp = strat_pin(NULL, g, &tc);
  if (!out->sp) return false;
  char err[512] = "";
  out->lw = lower_spmd(out->sp, err, sizeof err);
  if (!out->lw) {
    diag_error(t->strategy.span, "this strategy cannot be lowered to per-rank programs yet: %s", err);
    return false;
  }
  out->pipe = NULL;
  int chunks = pp > 1 && t->strategy.pipeline == PS_INTERLEAVED ? 2 : 1;
  if (chunks > 1 && !interleaved_ok(out->sp, t, dp, pp)) return false;
  if (pp > 1 && !(out->pipe = pp_partition(out->sp, out->lw, chunks, err, sizeof err))) {
    const char *tied = out->sp->zero >= 3 && dp > 1 ? param_read_at_both_ends(g) : NULL;
    /* (pp_partition's reason names the node it could not place, not the cause) */
    if (tied)
      diag_error(strat_field_span(t, "zero"), "zero = 3 with pp = %lld is not supported for a param that several "
                 "pipeline stages read ('%s', read before the first layer and after the last: a tied embedding); use "
                 "zero = 1 or 2", (long long)pp, tied);
    else diag_error(strat_field_span(t, "pp"), "this strategy cannot be cut into pipeline stages yet: %s", err);
    return false;
  }
  return true;
}

bool build_lower(Graph *g, const TrainConf *t, const StratPlan **sp, const Lowered **lw, const Pipeline **pipe) {
  Spmd s;
  if (!spmd_lower(g, t, &s)) return false;
  if (pipe) *pipe = s.pipe;
  else if (s.pipe) {
    diag_error(t->strategy.span, "internal error: build_lower does not take a pipeline-parallel strategy");
    return false;
  }
  *sp = s.sp, *lw = s.lw;
  return true;
}

/* The kernels of every stage of a pipeline (each stage's emission replaces cg_last_kernels'). */
static VEC(CgKernel) stage_kernels;

static void keep_kernels(void) {
  const CgKernel *ks;
  int n = cg_last_kernels(&ks);
  for (int k = 0; k < n; k++) VEC_PUSH(stage_kernels, ks[k]);
}

/* plan.c and, under pp, plan_s0.c ... into dir (NULL: every file to f, one after the other). */
static bool emit_pipeline(FILE *f, const char *dir, const Spmd *s, const TrainConf *t, const char *hash) {
  stage_kernels.n = 0;
  bool ok = true;
  for (int k = 0; k < s->pipe->pp && ok; k++) {
    FILE *o = f;
    const char *path = dir ? cp_fmt("%s/plan_s%d.c", dir, k) : NULL;
    if (path && !(o = fopen(path, "w"))) {
      diag_error(SPAN_NONE, "cannot write %s: %s", path, strerror(errno));
      return false;
    }
    if (!path) fprintf(o, "/* ==== plan_s%d.c ==== */\n", k);
    ok = cg_emit_c_stage(o, s->sp, s->lw, s->pipe, k, t, hash);
    keep_kernels();
    if (path && fclose(o) != 0 && ok) {
      diag_error(SPAN_NONE, "cannot write %s: %s", path, strerror(errno));
      ok = false;
    }
  }
  if (!dir) fprintf(f, "/* ==== plan.c ==== */\n");
  cg_emit_pipeline_main(f, s->pipe->pp, false);
  return ok;
}

/* plan.c of g: the training graph lowered per rank under tp or zero (then g must not have been
 * through train_graph yet), else g's training graph itself. */
static bool emit_any(FILE *f, const char *dir, Graph *g, const TrainConf *t, const char *hash) {
  last_stages = 0;
  if (!is_spmd(t)) return train_graph(g, t) && cg_emit_c(f, g, t, hash);
  Spmd s;
  if (!spmd_lower(g, t, &s)) return false;
  if (!s.pipe) return cg_emit_c_spmd(f, s.sp, s.lw, t, hash);
  last_stages = s.pipe->pp;
  return emit_pipeline(f, dir, &s, t, hash);
}

static bool write_plan_c(Graph *g, const TrainConf *t, const char *dir, const char *path, const char *hash) {
  FILE *f = fopen(path, "w");
  if (!f) {
    diag_error(SPAN_NONE, "cannot write %s: %s", path, strerror(errno));
    return false;
  }
  bool ok = emit_any(f, dir, g, t, hash);
  if (fclose(f) != 0 && ok) {
    diag_error(SPAN_NONE, "cannot write %s: %s", path, strerror(errno));
    ok = false;
  }
  return ok;
}

/* The fused elementwise kernels plan.c calls, generated through LLVM into path. *obj says
 * whether there is an object to link (a plan without fusable nodes has none). */
static bool write_kernels(const char *path, bool *obj) {
  const CgKernel *ks;
  int n = cg_last_kernels(&ks);
  if (last_stages) ks = stage_kernels.a, n = stage_kernels.n;
  char err[1024];
  *obj = n > 0;
  if (n == 0 || cg_llvm_object(ks, n, path, err, sizeof err)) return true;
  diag_error(SPAN_NONE, "generating the fused kernels failed (internal error): %s", err);
  return false;
}

static void remove_dir(const char *dir) {
  static const char *const files[] = {"plan.c", "cc.log", "kernels.o"};
  for (int k = 0; k < 3; k++) unlink(cp_fmt("%s/%s", dir, files[k]));
  for (int k = 0; k < last_stages; k++) unlink(cp_fmt("%s/plan_s%d.c", dir, k));
  rmdir(dir);
}

bool build_emit_c(FILE *out, Graph *g, const TrainConf *t) {
  return train_cuda(t) ? cg_emit_cuda_program(out, false, g, t) : emit_any(out, NULL, g, t, "emit");
}

bool build_emit_llvm(FILE *out, Graph *g, const TrainConf *t) {
  if (train_cuda(t)) {
    diag_error(t->mesh->span, "mesh '%s' has %s devices: the CUDA program compiles its fused kernels with NVRTC, not LLVM",
               t->mesh->name ? t->mesh->name : "?", t->mesh->device.name);
    diag_hint("--stage=cuda prints them; for the CPU program's, retarget the mesh with --set mesh.%s.device=cpu "
              "--set train.precision=f32", t->mesh->name ? t->mesh->name : "NAME");
    return false;
  }
  if (!train_graph(g, t)) return false;
  FILE *null = fopen("/dev/null", "w"); /* the kernels are those of plan.c: emit it, unread */
  bool ok = null && cg_emit_c(null, g, t, "emit");
  if (null) fclose(null);
  if (!ok) return false;
  const CgKernel *ks;
  int n = cg_last_kernels(&ks);
  char err[1024];
  char *ir = cg_llvm_ir(ks, n, err, sizeof err);
  if (!ir) {
    diag_error(SPAN_NONE, "generating the fused kernels failed (internal error): %s", err);
    return false;
  }
  fprintf(out, "; %d fused elementwise kernel%s of model %s\n%s", n, n == 1 ? "" : "s", g->model_name, ir);
  free(ir);
  return true;
}

bool build_program(Graph *g, const TrainConf *t, const BuildOpts *o) {
  if (train_cuda(t)) return cg_build_cuda(g, t, o); /* codegen/emit_cu.c */
  const char *tmp = getenv("TMPDIR");
  char *dir = cp_fmt("%s/cplan-build-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    diag_error(SPAN_NONE, "cannot create a temporary directory %s: %s", dir, strerror(errno));
    return false;
  }
  const char *plan_c = cp_fmt("%s/plan.c", dir);
  bool ok = write_plan_c(g, t, dir, plan_c, o->hash ? o->hash : "");
  for (int k = -1; ok && o->keep_c && k < last_stages; k++) {
    const char *name = k < 0 ? "plan.c" : cp_fmt("plan_s%d.c", k), *to = cp_fmt("%s/%s", o->keep_c, name);
    if (!cp_mkdir_p(o->keep_c) || !cp_copy_file(cp_fmt("%s/%s", dir, name), to)) {
      diag_error(SPAN_NONE, "--keep-c: cannot write %s: %s", to, strerror(errno));
      ok = false;
    }
  }
  bool obj = false;
  ok = ok && write_kernels(cp_fmt("%s/kernels.o", dir), &obj);
  ok = ok && compile(dir, obj, o->out);
  remove_dir(dir);
  if (ok && !o->quiet)
    fprintf(stderr, "cplanc: built %s (model %s, %d param tensors, arena %s)\n", o->out, g->model_name,
            g->params.n, cp_bytes_str((double)cg_last_work_bytes()));
  return ok;
}

/* ---- run: the cache -------------------------------------------------------------------------------- */

static const char *cache_dir(const char *file) {
  const char *env = getenv("CPLAN_CACHE");
  if (env && *env) return env;
  const char *slash = strrchr(file, '/');
  if (!slash) return ".cplan-cache";
  return cp_fmt("%.*s/.cplan-cache", (int)(slash - file), file);
}

/* The command that runs prog: prog itself, or for a mesh of several (CPU) devices
 * `mpirun -np DEVICES --oversubscribe prog` (one rank per device; oversubscribed because a
 * laptop's mesh may have more devices than MPI counts slots). Open MPI refuses to start as root
 * without its two consent variables: `cplanc run` gives that consent, as the user who typed it
 * is the one running the program. Inside an MPI job already, prog runs as it is. */
/* Inside an MPI job (the variables Open MPI, PMI/PMIx launchers and Slurm steps set); the same
 * test as the runtime's rt_comm_launched, which the compiler library does not link. */
static bool in_mpi_job(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") || getenv("SLURM_STEP_ID");
}

static Argv *launch_argv(const char *prog, int64_t devices, char **args, int nargs) {
  Argv *a = cp_alloc(sizeof *a);
  if (devices > 1 && !in_mpi_job()) {
    VEC_PUSH(*a, CPLAN_MPIEXEC);
    VEC_PUSH(*a, "-np");
    VEC_PUSH(*a, cp_fmt("%lld", (long long)devices));
    VEC_PUSH(*a, "--oversubscribe");
    if (geteuid() == 0) {
      setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
      setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
  }
  VEC_PUSH(*a, prog);
  for (int k = 0; k < nargs; k++) VEC_PUSH(*a, args[k]);
  VEC_PUSH(*a, (const char *)NULL);
  return a;
}

/* ---- run: stopping a multi-rank run ------------------------------------------------------------- */

/* The program stops on SIGINT/SIGTERM after its step, with a checkpoint, and exits 0 (train.c).
 * Open MPI's mpirun does not pass those signals on: on the first one it aborts the job (SIGCONT to
 * every rank, SIGTERM odls_base_sigkill_timeout = 1 s later, SIGKILL 1 s after that) and exits 1
 * whatever the ranks did, and its ranks run in process groups of their own, so a Ctrl-C at the
 * terminal reaches mpirun alone. (SIGINT and SIGTERM cannot be added to its forwarded signals,
 * ess_base_forward_signals.) So `cplanc run` does not exec mpirun: it starts it with SIGINT and
 * SIGTERM blocked (Open MPI unblocks every signal in the ranks it starts, which install their own
 * handlers), sends each SIGINT/SIGTERM it gets itself to the ranks (the processes under mpirun that
 * run the program; one is enough, the ranks agree to stop at the step's all-reduce), and exits
 * with mpirun's status: 0 when every rank stopped cleanly, a failed rank's status otherwise. The
 * program's own rule, the same signal again within a second is one request and a later one kills
 * it, holds as for one rank (below). Everything else (the tty, its job
 * control signals, stdin, stdout and stderr) mpirun keeps as under an exec. Needs /proc (Linux);
 * elsewhere cplanc execs mpirun as before. */

/* The parent of process pid, from /proc/PID/stat; -1 when it is gone. */
static long proc_ppid(long pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* after the command name, which may hold anything */
  long ppid;
  return p && sscanf(p + 1, " %*c %ld", &ppid) == 1 ? ppid : -1;
}

/* Whether process pid has a handler for sig (/proc/PID/status, SigCgt): a rank that has not yet
 * installed the program's handlers (it is still loading, or in MPI_Init) would die of sig, and one
 * that has put the default ones back is done. */
static bool proc_catches(long pid, int sig) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%ld/status", pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  unsigned long long mask = 0;
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "SigCgt: %llx", &mask) == 1;
  fclose(f);
  return found && sig >= 1 && sig <= 64 && (mask >> (sig - 1) & 1);
}

/* Sends sig to every process below `top` whose executable is the file prog (dev, ino) and that
 * catches it; returns how many it reached. */
static int signal_ranks(pid_t top, const struct stat *prog, int sig) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    char *end, path[64];
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 1 || pid == (long)top) continue;
    struct stat st;
    snprintf(path, sizeof path, "/proc/%ld/exe", pid);
    if (stat(path, &st) != 0 || st.st_dev != prog->st_dev || st.st_ino != prog->st_ino) continue;
    long p = pid;
    for (int depth = 0; p > 1 && p != (long)top && depth < 32; depth++) p = proc_ppid(p);
    if (p == (long)top && proc_catches(pid, sig) && kill((pid_t)pid, sig) == 0) n++;
  }
  closedir(d);
  return n;
}

/* Runs the launcher a (mpirun ... prog ...) as above and exits with its status; returns (errno
 * set) only when it cannot be started. */
static void launch_and_wait(Argv *a, const char *prog) {
  struct stat ps;
  if (stat(prog, &ps) != 0 || access("/proc/self/exe", F_OK) != 0) {
    execvp(a->a[0], (char *const *)a->a); /* no /proc: as before */
    return;
  }
  sigset_t waited, old;
  sigemptyset(&waited);
  sigaddset(&waited, SIGINT);
  sigaddset(&waited, SIGTERM);
  sigaddset(&waited, SIGCHLD);
  int fds[2];
  if (pipe(fds) != 0) return;
  fcntl(fds[1], F_SETFD, FD_CLOEXEC); /* closed by a successful exec; an errno comes back else */
  struct sigaction dfl = {.sa_handler = SIG_DFL}, old_chld;
  sigaction(SIGCHLD, &dfl, &old_chld); /* an inherited SIG_IGN would reap mpirun behind waitpid */
  sigprocmask(SIG_BLOCK, &waited, &old);
  pid_t parent = getpid(), pid = fork();
  if (pid == 0) {
    close(fds[0]);
    sigaction(SIGCHLD, &old_chld, NULL);
    sigset_t m = old;
    sigaddset(&m, SIGINT);
    sigaddset(&m, SIGTERM);
    sigprocmask(SIG_SETMASK, &m, NULL);
#ifdef __linux__
    /* should cplanc die first (SIGKILL), mpirun aborts the job, as it did when it was cplanc */
    prctl(PR_SET_PDEATHSIG, SIGHUP);
    if (getppid() != parent) _exit(1);
#endif
    execvp(a->a[0], (char *const *)a->a);
    int e = errno;
    if (write(fds[1], &e, sizeof e) < 0) _exit(127);
    _exit(127);
  }
  int e = errno;
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    sigprocmask(SIG_SETMASK, &old, NULL);
    sigaction(SIGCHLD, &old_chld, NULL);
    errno = e;
    return;
  }
  ssize_t got;
  while ((got = read(fds[0], &e, sizeof e)) < 0 && errno == EINTR) {}
  close(fds[0]);
  int status;
  if (got == (ssize_t)sizeof e) { /* the exec failed */
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    sigprocmask(SIG_SETMASK, &old, NULL);
    sigaction(SIGCHLD, &old_chld, NULL);
    errno = e;
    return;
  }
  /* The first SIGINT/SIGTERM goes to the ranks; another within a second of it is the same request
   * (timeout(1) signals cplanc, then its group) and is not passed on, as the ranks would ignore it
   * but one that already stopped and put back the default handlers would die of it; a later one is
   * passed on and kills them (the program's rule). `pending` is a signal no rank has had yet
   * (mpirun is still starting them, or none has its handlers yet), tried again every 50 ms; should a later one come first, it
   * aborts the launch (SIGHUP makes mpirun end the job, as the signals did when cplanc was it). */
  int pending = 0, asked = 0;
  struct timespec first = {0, 0}, now;
  for (;;) {
    struct timespec tick = {0, 50 * 1000 * 1000};
    int sig = pending ? sigtimedwait(&waited, NULL, &tick) : sigwaitinfo(&waited, NULL);
    if (sig == SIGINT || sig == SIGTERM) {
      clock_gettime(CLOCK_MONOTONIC, &now);
      if (!asked) asked = 1, first = now, pending = sig;
      else if ((double)(now.tv_sec - first.tv_sec) + (double)(now.tv_nsec - first.tv_nsec) * 1e-9 >= 1.0) {
        if (pending) kill(pid, SIGHUP);
        else pending = sig;
      }
    }
    if (pending && signal_ranks(pid, &ps, pending) > 0) pending = 0;
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) _exit(1);
  }
  if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
  int sig = WTERMSIG(status); /* mpirun killed: so is cplanc, as when it was mpirun */
  signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  sigprocmask(SIG_UNBLOCK, &one, NULL);
  raise(sig);
  _exit(128 + sig);
}

bool build_run(Graph *g, const TrainConf *t, const char *file, const char *hash, char **args, int nargs) {
  const char *dir = cache_dir(file);
  if (!cp_mkdir_p(dir)) {
    diag_error(SPAN_NONE, "cannot create the build cache %s: %s", dir, strerror(errno));
    diag_hint("set CPLAN_CACHE to a writable directory");
    return false;
  }
  const char *prog = cp_fmt("%s/%s-%.16s", dir, g->model_name, hash);
  if (access(prog, X_OK) != 0) {
    /* Built under a temporary name and renamed, so a concurrent run never sees half a program. */
    const char *tmp = cp_fmt("%s.tmp%ld", prog, (long)getpid());
    BuildOpts o = {.out = tmp, .hash = hash, .quiet = true};
    fprintf(stderr, "cplanc: building %s\n", prog);
    if (!build_program(g, t, &o)) return false;
    if (rename(tmp, prog) != 0) {
      diag_error(SPAN_NONE, "cannot rename %s to %s: %s", tmp, prog, strerror(errno));
      return false;
    }
  }
  int64_t devices = t->mesh ? t->mesh->ndevices : 1;
  Argv *a = launch_argv(prog, devices, args, nargs);
  fflush(stdout);
  fflush(stderr);
  if (strcmp(a->a[0], prog) != 0) launch_and_wait(a, prog); /* returns only when it cannot start */
  else execvp(a->a[0], (char *const *)a->a);
  diag_error(SPAN_NONE, "cannot run %s: %s", a->a[0], strerror(errno));
  if (devices > 1) diag_hint("a plan for %lld devices runs under MPI: is %s installed?", (long long)devices, a->a[0]);
  return false;
}
