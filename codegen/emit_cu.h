/* emit_cu.h: the CUDA training program (issue 6): `cplanc build` for a mesh whose device is a
 * CUDA profile (compiler/devices.def, DEV_CUDA). codegen/emit_cu.c owns it.
 *
 * The program is plan.c, plain C compiled by the system C compiler, and kernels.cu, CUDA C that
 * plan.c carries as a string and compiles at start with NVRTC for the present GPU (cached on
 * disk by runtime/cuda_rt.c). plan.c defines the same RtPlan as a CPU plan (runtime/cplanrt.h),
 * so runtime/train.c runs the training loop, data, metrics and checkpoints unchanged; its
 * micro_step, update and eval_step copy the inputs to the device, launch the kernels on one
 * stream and copy back the loss, metrics and gradient norm. Params, optimizer state and
 * activations live on the device; RtRun.params and .state are host mirrors (RtPlan.to_device,
 * .to_host). It links libcplanrt_cuda, libcplankernels_cuda, libcplanrt, cudart, cuBLASLt,
 * NVRTC and NCCL. */
#ifndef CPLAN_EMIT_CU_H
#define CPLAN_EMIT_CU_H

#include "../compiler/build.h"

#include <stdio.h>

/* build_program's CUDA path: lowers g to a training graph, writes plan.c and kernels.cu into a
 * temporary directory (and o->keep_c), and compiles and links o->out. False after a diagnostic:
 * a setting or op the CUDA backend does not support yet points at its .cplan line; a cplanc
 * built without the CUDA toolkit says so. */
bool cg_build_cuda(Graph *g, const TrainConf *t, const BuildOpts *o);

/* `cplanc emit --stage=c` (kernels false) and `--stage=cuda` (true) for a mesh of CUDA devices: the
 * plan.c or the kernels.cu that cg_build_cuda would compile, to out; a pipeline's stage files one
 * after the other, each after a "==== NAME ====" comment line (then its plan.c). No toolkit needed.
 * False after a diagnostic. */
bool cg_emit_cuda_program(FILE *out, bool kernels, Graph *g, const TrainConf *t);

/* The two files of a CUDA plan, for g after train_graph (plan.c to out_c, kernels.cu to
 * out_cu), or for the per-rank graph g = lw->g of a lowered plan (tp, sp, ZeRO: sp and lw from
 * build_lower; NULL otherwise), or for stage `stage` of a pipeline (pipe non-NULL: g is ignored,
 * out_c gets plan_sN.c, which links with cg_emit_pipeline_main's plan.c; each stage is first
 * called with out_c NULL, which records the types its crossings send in). False after a
 * diagnostic. */
struct StratPlan;
struct Lowered;
struct Pipeline;
bool cg_emit_cu(FILE *out_c, FILE *out_cu, const Graph *g, const struct StratPlan *sp, const struct Lowered *lw,
                const struct Pipeline *pipe, int stage, const TrainConf *t, const char *source_hash);

#endif
