/* build.h: `cplanc build` and `cplanc run`: from an elaborated model to an executable training
 * program (train_graph, memory planning, cg_emit_c, the system C compiler), and the build cache
 * `run` keeps. The driver (main.c) runs the front end and hands over the graph. */
#ifndef CPLAN_BUILD_H
#define CPLAN_BUILD_H

#include "ir.h"
#include "sema.h"

typedef struct BuildOpts {
  const char *out;         /* the executable to write */
  const char *keep_c;      /* NULL, or a directory to copy plan.c into */
  const char *hash;        /* identifies the build (build_hash) */
  bool quiet;              /* no "built PROG" line */
} BuildOpts;

/* Lowers g (the train block's model, B bound to the micro-batch) to a training graph, emits
 * plan.c into a temporary directory and compiles and links it into o->out. False after a
 * diagnostic; a failing C compile is an internal error that shows the compiler's output. */
bool build_program(Graph *g, const TrainConf *t, const BuildOpts *o);

/* A lowered strategy (tensor or sequence parallelism, ZeRO, pipeline parallelism): g to a
 * training graph, placed (strat_pin) and lowered to the graph one rank runs, *lw->g (lower.h),
 * and under pp cut into stages, *pipe (pipeline.h; NULL without pp). pipe NULL: a pipeline is
 * refused. False after a diagnostic. The CUDA backend's way in (codegen/emit_cu.c). */
struct StratPlan;
struct Lowered;
struct Pipeline;
bool build_lower(Graph *g, const TrainConf *t, const struct StratPlan **sp, const struct Lowered **lw,
                 const struct Pipeline **pipe);

/* Lowers g to a training graph and prints plan.c (`cplanc emit --stage=c`). */
bool build_emit_c(FILE *out, Graph *g, const TrainConf *t);

/* Lowers g to a training graph and prints the optimized LLVM IR of the fused elementwise
 * kernels its plan.c calls (`cplanc emit --stage=llvm`). */
bool build_emit_llvm(FILE *out, Graph *g, const TrainConf *t);

/* Lowers g to a training graph and prints its fused kernels as CUDA C (`cplanc emit
 * --stage=cuda`; defined in codegen/emit_cuda.c); on a CUDA mesh the GPU program's kernels.cu
 * (cg_emit_cuda_program). build_emit_c likewise prints the GPU program's plan.c there. */
bool build_emit_cuda(FILE *out, Graph *g, const TrainConf *t);

/* A hex digest of every source text the front end read (the file, its imports, the --set
 * pseudo-sources), the overrides, the train block name and the cplanc version. */
const char *build_hash(const char *const *sets, int nsets, const char *train);

/* `cplanc run`: builds into the cache (CPLAN_CACHE, else .cplan-cache/ next to file) unless a
 * program with this hash is there, then replaces this process with it, passing args (nargs).
 * Returns only on failure (false after a diagnostic). */
bool build_run(Graph *g, const TrainConf *t, const char *file, const char *hash, char **args, int nargs);

#endif
