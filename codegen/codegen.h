/* codegen.h: the emitters (DESIGN.md §2). Each turns a training Graph into source text that the
 * build step compiles and links with runtime/ (libcplanrt) and kernels/ (libcplankernels). */
#ifndef CPLAN_CODEGEN_H
#define CPLAN_CODEGEN_H

#include "../compiler/ir.h"
#include "../compiler/sema.h"
#include "llvm.h"

#include <stdio.h>

/* ---- emit_c.c: the C host program plan.c for one CPU device ---------------------------------
 *
 * g is a training graph (after train_graph()) whose batch dim is bound to the micro-batch; t its
 * train block. Writes plan.c: the RtPlan `cplan_plan` (params, states, inputs, data, schedule),
 * micro_step (FWD+BWD nodes), update (UPD nodes, then zeroing of the gradient accumulators),
 * eval_step (FWD nodes, no dropout), lr_at, and main() calling rt_main(). Every kernel call is
 * commented with its IR node and the .cplan line it came from. Activations and gradients live
 * at offsets of one arena that memplan.c assigns. source_hash identifies the build (checkpoints
 * record it). Returns false after diagnostics (an op or setting this backend does not support). */
bool cg_emit_c(FILE *out, const Graph *g, const TrainConf *t, const char *source_hash);
/* cg_emit_c for one rank of a tensor-parallel plan (issue 4): lw is lower_spmd's per-rank graph
 * of sp's training graph. The collectives become rt_comm calls on the mesh-axis groups, the
 * vocab-parallel embedding and cross_entropy run the kvp_ kernels with their exchanges, and the
 * plan gets the axes and a global_index function, so init, --save and checkpoints deal in whole
 * tensors (compiler/lower.h). */
struct StratPlan;
struct Lowered;
/* The hash checkpoints of the next plans record and accept (RtPlan.resume_hash): the build's
 * without the strategy and mesh, so a checkpoint resumes under another strategy. */
void cg_set_resume_hash(const char *hash);
const char *cg_resume_hash(void); /* NULL: none set */
bool cg_emit_c_spmd(FILE *out, const struct StratPlan *sp, const struct Lowered *lw, const TrainConf *t,
                    const char *source_hash);

/* The arena bytes the last successful cg_emit_c planned (its peak over the phases). */
/* Pipeline parallelism (compiler/pipeline.h): stage `stage`'s file plan_sN.c of a program that
 * links every stage's file and cg_emit_pipeline_main's plan.c (the stage table and main). Its
 * kernels' symbols carry the prefix "sN_" (cg_last_kernels lists this stage's). */
struct Pipeline;
bool cg_emit_c_stage(FILE *out, const struct StratPlan *sp, const struct Lowered *lw, const struct Pipeline *pipe,
                     int stage, const TrainConf *t, const char *source_hash);
/* plan.c of a pipeline-parallel program: the stage table cplan_stages and main, which runs stage
 * 0's plan (rt_main picks the rank's stage). cuda: the stage files are CUDA plans (emit_cu.c),
 * whose cplan_gpu_init_sN main calls first for each stage. */
void cg_emit_pipeline_main(FILE *out, int pp, bool cuda);

int64_t cg_last_work_bytes(void);

/* The fused elementwise and row kernels (compiler/fusion.h) the last cg_emit_c's plan.c calls: sets
 * *kernels and returns how many (0: none, *kernels may be NULL). They go to cg_llvm_object. */
int cg_last_kernels(const CgKernel **kernels);

/* ---- emit_cuda.c: the same kernels as CUDA C (issue 6) ----------------------------------------
 * Writes a standalone CUDA source with one `extern "C" __global__` kernel per CgKernel (a norm
 * backward adds NAME_dw), f32, shapes compiled in, launch conventions in its header comment; it
 * compiles with `nvcc --ptx` and NVRTC. False with a message in err for a malformed kernel. */
bool cg_emit_cuda(FILE *out, const CgKernel *ks, int n, const char *model, char *err, size_t errlen);

#endif
