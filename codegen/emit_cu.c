/* emit_cu.c: the CUDA emitter (emit_cu.h, issue 6). Turns a training Graph into plan.c, the host
 * program of one GPU, and kernels.cu, the CUDA C it compiles at start with NVRTC.
 *
 * It reads the graph as codegen/emit_c.c does and keeps its conventions: the same fusion pass
 * (compiler/fusion.h), the same views (reshape, ASSIGN/ACCUM results, gradients equal to dy,
 * transposes only GEMMs read) and per-phase memory plan (both from codegen/cg_plan.c), one launch
 * per IR node or group, each preceded by the IR node and its .cplan line. What differs:
 *   - every buffer is device memory: params G.params (P), state G.state (S), the work arena
 *     G.work (F, I, B), inputs G.in[k], constants and the host's scalars (lr, bc1, bc2) in small
 *     device arrays (KC, KI, SC);
 *   - fused elementwise groups and the row kernels no launcher covers (log_softmax, last-axis
 *     sum and mean) are emitted by codegen/emit_cuda.c into kernels.cu; the rest of kernels.cu
 *     is the fixed support source of emit_cu_support.h;
 *   - matmuls go through cuBLASLt (runtime/cuda_rt.c), layer/rms norm, softmax, sdpa,
 *     cross_entropy, embedding and rope through the launchers of kernels/cuda (kernels_cuda.h);
 *   - the side buffers are those of the CUDA kernels: sdpa keeps lse [nb, t] (never the [t, t]
 *     matrix) and its backward a delta [nb, t]; cross_entropy keeps the per-row losses, lse and
 *     the counted rows.
 * The optimizer update: AdamW runs fused on kernels/cuda (fused_adamw); other optimizers, and
 * lowered plans, run the graph's update nodes like the rest (fused kernels), with the CPU backend's
 * formula.
 *
 * Precision (decide_storage). f32: every float buffer is f32. bf16 / f16: the params stay f32
 * (master weights, updated in f32 with f32 optimizer state) and G.plp holds their bf16 / f16 copy
 * (PL), refreshed after each update, which everything outside the update reads; activations and
 * their gradients are stored in the low type (L), with f32 arithmetic in every kernel and f32
 * accumulation in cuBLASLt; f32 stay the loss, metrics, reductions, norm statistics, and the
 * param gradients (GEMMs write them in f32, kernels/cuda's norm and embedding gradients are f32).
 * Generic kernels take each operand's storage code at launch; the fused kernels of emit_cuda.c
 * get typed pointers (typed_kernels); kernels/cuda gets CPLAN_BF16 / CPLAN_F16 and needs all its
 * tensors in that type (hw_typed), as cuBLASLt needs both operands of a GEMM; an operand stored f32
 * there (an f32 input, a reduction) is read as a low copy its launch casts first, as PyTorch's
 * autocast does (low_reads). f16 adds dynamic loss scaling: the loss gradient's constant
 * seed becomes a device scalar times the scale (2^16 at first); after the last micro-batch's
 * backward, cps_unscale divides the f32 gradient accumulators by it and flags inf/NaN; update
 * then skips the step (halving the scale) or applies it (doubling the scale after 1000 good
 * steps); the metrics loss_scale and skipped_steps report it, so the runtime needs nothing new.
 * Meshes: one process per GPU, with data parallelism (RtPlan.reduce_grads), or the per-rank graph
 * of a lowered plan (tp, sp, ZeRO; compiler/lower.h), whose collectives run as coll_* calls on
 * the axis groups (NCCL, or MPI through the host). Pipeline parallelism (compiler/pipeline.h):
 * one file per stage (plan_sN.c, each with its own device state G and kernels.cu) linked with
 * cg_emit_pipeline_main's plan.c; a stage's forward and backward run on the device arena of the
 * micro-batch's slot (RtRun.slot), its values cross to other stages through pinned host memory
 * and MPI on the pp group (pp_send, pp_recv). Anything unsupported is a diagnostic at its .cplan
 * line. */
#include "emit_cu.h"

#include "../compiler/fusion.h"
#include "../compiler/lower.h"
#include "../compiler/memplan.h"
#include "../compiler/pipeline.h"
#include "../compiler/train.h"
#include "../kernels/cuda/attn_layout.h"
#include "codegen.h"
#include "cg_common.h"
#include "cg_plan.h"
#include "cplan_config.h"
#include "emit_cu_support.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct Cu {
  const Graph *g;
  const TrainConf *t;
  CgPlan pl;                 /* where values live, the fusion groups, the arena (cg_plan.h) */
  FILE *out;
  char **irline;             /* the IR printer's line of each node */
  int ph;
  bool ok;
  VEC(const char *) knames;  /* the kernels plan.c launches, by index */
  CpMap kindex;              /* name -> index in knames */
  int *rd_off, *rd;          /* index_graph: each value's readers */
  int *grads_of, *next_grad; /* index_graph: each forward node's GRAD nodes */
  int lpc;                   /* the low-precision storage code: 0 (f32 plan), 1 bf16, 2 f16 */
  bool upd;                  /* emitting the update: params are the f32 master weights */
  bool *wlp;                 /* per node: a work buffer stored in the low type */
  bool *pg;                  /* per node: part of a param gradient (kept f32) */
  int **ftypes;              /* per fusion group: the storage codes of its output and leaves */
  int seed;                  /* f16: the constant seed of the loss gradient (times the scale), or -1 */
  bool ls;                   /* f16 loss scaling: the seed's graph, and under pp every stage (each unscales its
                                gradients and skips the steps every stage skips); the seed's stage reports it */
  double seed_val;
  int *acc_of;               /* per node: the ACCUM that is its only reader (a weight gradient), or -1 */
  int *reader;               /* per node: its only reader, -1 when none or several */
  bool *ep_done;             /* per node: an add of a bias that its matmul's GEMM did (the epilogue) */
  int *ep_of;                /* per matmul: that add (find_epilogues), or -1 */
  int *gelu_of;              /* per matmul with ep_of: the gelu of the add it computes too (GELU_AUX_BIAS), or -1;
                                per GRAD of a matmul's input: the gelu GRAD its GEMM computes (DGELU), or -1 */
  int *qkv;                  /* per node: the cps_qkv launch it makes (find_qkv: 1 forward, 2 backward), */
  int (*qkv_ops)[4];         /* else 0; qkv_ops[i]: its x and q, k, v (forward) or dx and dq, dk, dv */
  bool *qkv_skip;            /* per node: computed by such a launch */
  int *att_x, *att_r;        /* per sdpa (find_attn_inplace): the projection [b, t, 3C] its q, k, v are read in
                                and the sum [b, t, 3C] its dq, dk, dv are written into, or -1 (both or neither) */
  int *att_m;                /* per sdpa: the merge_heads [b, t, C] it writes its output into, or -1 */
  int *att_lead;             /* per node: the sdpa whose backward its launch is (a view of att_r), or -1 */
  int *att_skip;             /* per node: the sdpa that reads or writes it in place, or -1 */
  int64_t colsum_cols;       /* the widest bias gradient (colsum's workspace) */
  int *bgrad_of;             /* per GEMM GRAD (find_bgrads): the bias gradient its epilogue computes, or -1 */
  int *bgrad_host;           /* per bias gradient: the GEMM GRAD that computes it, or -1 */
  int *add_into;             /* per norm GRAD (dx): the buffer its kernel adds into in place of an add, or -1 */
  bool *add_skip;            /* per add node: done in place by such a kernel (find_inplace_adds) */
  VEC(int64_t) norm_shapes;  /* rows, c of each norm backward (its dw/db workspace, sized at start) */
  bool *acc_done;            /* per ACCUM node: its GEMM accumulates into the state (beta 1): no kernel */
  int64_t *pitch;            /* per node: its rows' pitch in elements when padded (find_pitched), else 0 */
  int *tgrad_of;             /* per weight-gradient GEMM GRAD (find_tgrads): the transpose's GRAD it writes, or -1 */
  bool *tgrad_skip;          /* per transpose GRAD: written by such a GEMM */
  bool *acc_add;             /* per add (find_accum_adds): both addends added into its ACCUM's accumulator */
  int *res_of;               /* per norm (find_res_norms): the add a + b it normalizes and computes too, or -1 */
  int *res_skip;             /* per such add: the norm whose launch computes it, or -1 */
  int *ce_fused;             /* per cross_entropy (find_ce_fused): its logits' gradient, written over the logits by
                                the forward's launch in training, or -1; per that gradient: the cross_entropy */
  const StratPlan *sp;       /* a lowered plan (tp, sp, ZeRO): the placements and the lowering g came */
  const Lowered *lw;         /* from (NULL: one device or pure data parallelism) */
  CgGlobal gt;               /* the lowered plan's whole tensors (cg_emit_global_tables) */
  const Pipeline *pipe;      /* pipeline parallelism: the stages (NULL: none); g is stage `stage`'s */
  int stage;
  int ppa;                   /* the pp axis's index in RtRun.axis_comm (after the strategy axes) */
  int only_role;             /* a stage's forward (ROLE_FWD) or backward (ROLE_BWD) function, else -1 */
  int cur;                   /* the node whose launches are being emitted, or -1 */
  int64_t *cast_at;          /* per node: where in its scratch the low copies of its f32 operands begin (size_casts),
                                or -1 */
} Cu;

#define EMIT(...) fprintf(c->out, __VA_ARGS__)

/* ---- small helpers ----------------------------------------------------------------------------- */

static const Node *nd(const Cu *c, int i) { return &c->g->nodes[i]; }
static const Node *in(const Cu *c, int i, int k) { return &c->g->nodes[c->g->nodes[i].in[k]]; }
static int64_t numel(const Node *n) { return shape_numel(&n->shape); }

static bool unsupported(Cu *c, int i, const char *what) {
  diag_error(nd(c, i)->span, "%s is not supported on the cuda backend yet", what);
  c->ok = false;
  return false;
}

/* The index of kernel `name` in plan.c's table, added on first use. */
static int kid(Cu *c, const char *name) {
  int k = cp_map_get(&c->kindex, name);
  if (k >= 0) return k;
  VEC_PUSH(c->knames, name);
  cp_map_put(&c->kindex, name, c->knames.n - 1);
  return c->knames.n - 1;
}

/* ---- where values live: cg_plan.c's rules, the CUDA kernels' side buffers ----------------------- */

/* The side buffers of node i's kernels (CgPlan.sides). */
static void cu_sides(const void *ctx, int i, CgPlace *x) {
  const Cu *c = ctx;
  const Node *n = nd(c, i);
  if (n->op == OP_LAYER_NORM) x->aux = 2 * cg_rows(n) * 4;                      /* mean, rstd */
  if (n->op == OP_RMS_NORM) x->aux = cg_rows(n) * 4;                            /* rstd */
  if (n->op == OP_SDPA) x->aux = n->shape.d[0] * n->shape.d[1] * n->shape.d[2] * 4; /* lse [nb, t] */
  if (n->op == OP_CROSS_ENTROPY) x->aux = 2 * cg_rows(in(c, i, 0)) * 4 + 64;  /* losses, lse, count */
  if (n->op == OP_DROPOUT) x->scratch = numel(n);                               /* the mask */
  if (n->op == OP_CROSS_ENTROPY && n->ia[0] > 0) /* vocab-parallel: the gathered row maxima (aux: m, s, count) */
    x->scratch = cg_rows(in(c, i, 0)) * c->sp->axes[n->ia[0] - 1].n * 4;
  if (n->op == OP_ARGMAX && n->ia[1] > 0) /* vocab-parallel: this rank's (max, index) pairs, then every rank's */
    x->scratch = 2 * cg_rows(in(c, i, 0)) * 4 * (1 + c->sp->axes[n->ia[1] - 1].n);
  if (n->op == OP_ALL_GATHER || n->op == OP_REDUCE_SCATTER) /* the blocks in rank order (f32 at most) */
    x->scratch = (numel(n) > numel(in(c, i, 0)) ? numel(n) : numel(in(c, i, 0))) * 4;
  if (n->op == OP_ALL_TO_ALL) x->scratch = 2 * numel(n) * 4; /* the blocks sent, received */
  if (n->op == OP_GRAD && nd(c, n->fwd)->op == OP_DROPOUT) x->scratch = numel(n);
  if (n->op == OP_GRAD && nd(c, n->fwd)->op == OP_SDPA) /* delta [nb, t] */
    x->scratch = nd(c, n->fwd)->shape.d[0] * nd(c, n->fwd)->shape.d[1] * nd(c, n->fwd)->shape.d[2] * 4;
}

/* ---- storage types under precision = bf16 / f16 ------------------------------------------------ */

/* node j is part of a param's gradient (the value an ACCUM adds into its f32 accumulator, and
 * the sums and transposes that feed it): it stays f32 when its producer can write f32 */
static void mark_pg(Cu *c, int j) {
  if (cg_root(&c->pl, j) != j || c->pg[j] || c->pl.nc[j].kind != CG_L_WORK || nd(c, j)->dtype == DT_I32) return;
  const Node *n = nd(c, j);
  c->pg[j] = true;
  if (n->op == OP_ADD && shape_eq(&in(c, j, 0)->shape, &n->shape) && shape_eq(&in(c, j, 1)->shape, &n->shape))
    mark_pg(c, n->in[0]), mark_pg(c, n->in[1]);
  if (n->op == OP_GRAD && nd(c, n->fwd)->op == OP_TRANSPOSE) mark_pg(c, n->in[0]);
  /* a gradient summed over ranks before its accumulator (ZeRO 2 and 3): summed in f32 */
  if (n->op == OP_REDUCE_SCATTER || n->op == OP_ALL_REDUCE) mark_pg(c, n->in[0]);
}

/* Pipeline parallelism, per crossing (its tag), from emit_files' passes over every stage before it
 * emits any: whether its receiver keeps it f32 (part of a param gradient there: a tied embedding's),
 * so that its sender does too; and the RtNcclType its sender stores it in, which is what crosses. */
static VEC(bool) wire_f32;
static VEC(const char *) wire_type;

/* Whether node i is one of the metrics the program hands out. */
static bool is_metric(const Graph *g, int i) {
  for (int k = 0; k < g->metrics.n; k++)
    if (g->metrics.a[k].node == i) return true;
  return false;
}

/* The storage code of node i's buffer: 0 f32 (and i32), 1 bf16, 2 f16. Under a low precision,
 * params are read as their low copy outside the update; work buffers are low unless
 * decide_storage kept them f32. */
static int scode(const Cu *c, int i) {
  int r = cg_root(&c->pl, i);
  const CgPlace *x = &c->pl.nc[r];
  if (!c->lpc || nd(c, r)->dtype == DT_I32) return 0;
  if (x->kind == CG_L_PARAM) return c->upd ? 0 : c->lpc;
  if (x->kind == CG_L_WORK) return c->wlp[r] ? c->lpc : 0;
  return 0;
}

/* Which work buffers hold the low type (c->wlp). f32 stay: the update; the loss, metrics and
 * reductions (sum, mean, max); what kernels/cuda writes in f32 (norm weight and bias gradients,
 * an embedding table's gradient); param gradients (mark_pg); the gradient of a matmul's operand
 * stored f32 (which its GEMMs read as a low copy, low_reads; its GEMM writes the gradient f32, as
 * the backward of autocast's cast does). The rest (activations and their gradients) are bf16 / f16. */
static void decide_storage(Cu *c) {
  const Graph *g = c->g;
  c->wlp = cp_alloc(sizeof(bool) * (size_t)(g->n + 1));
  c->pg = cp_alloc(sizeof(bool) * (size_t)(g->n + 1));
  c->seed = -1;
  if (!c->lpc) return;
  for (int i = 0; i < g->n; i++) {
    const Node *n = nd(c, i);
    if (n->op == OP_ACCUM && n->role != ROLE_UPD && c->pl.nc[cg_root(&c->pl, n->in[0])].kind == CG_L_STATE) mark_pg(c, n->in[1]);
    if (n->op == OP_PP_SEND && n->ia[1] < wire_f32.n && wire_f32.a[n->ia[1]]) mark_pg(c, n->in[0]);
    if (c->lpc == 2 && n->op == OP_GRAD && n->fwd == g->loss && nd(c, n->in[0])->op == OP_CONST &&
        c->pl.nc[n->in[0]].kind == CG_L_CONST)
      c->seed = n->in[0], c->seed_val = nd(c, n->in[0])->fa[0];
  }
  if (c->seed >= 0) /* a fused kernel would read the seed as a constant, not the scaled one */
    for (int gi = 0; gi < c->pl.fu->ngroups; gi++)
      for (int k = 0; k < c->pl.fu->groups[gi].nodes.n; k++) {
        const Node *m = nd(c, c->pl.fu->groups[gi].nodes.a[k]);
        for (int j = 0; j < m->nin; j++)
          if (m->in[j] == c->seed) c->seed = -1;
      }
  for (int i = 0; i < g->n; i++) {
    const Node *n = nd(c, i);
    if (c->pl.nc[i].kind != CG_L_WORK || n->dtype == DT_I32 || n->role == ROLE_UPD || c->pg[i]) continue;
    if (n->op == OP_SUM || n->op == OP_MEAN || n->op == OP_MAX || n->op == OP_CROSS_ENTROPY || numel(n) == 1) continue;
    if (i == g->loss || i == g->grad_norm || is_metric(g, i)) continue;
    if (n->op == OP_GRAD) {
      OpId f = nd(c, n->fwd)->op;
      if ((f == OP_LAYER_NORM || f == OP_RMS_NORM) && n->ia[0] >= 1) continue;
      if (f == OP_EMBEDDING && n->ia[0] == 0) continue;
      if (f == OP_MATMUL && !scode(c, n->in[1 + n->ia[0]])) continue; /* an operand it casts (low_reads): as autocast */
    }
    c->wlp[i] = true;
  }
}

/* packs storage codes, operand k at bits 2k (CPS_T of emit_cu_support.h) */
static int tcodes(const Cu *c, int n, const int *nodes) {
  int tt = 0;
  for (int k = 0; k < n; k++)
    if (nodes[k] >= 0) tt |= scode(c, nodes[k]) << (2 * k);
  return tt;
}

static int64_t sbytes(const Cu *c, int i) {
  if (c->pitch && c->pitch[i]) return numel(nd(c, i)) / cg_last_dim(nd(c, i)) * c->pitch[i] * (scode(c, i) ? 2 : 4);
  return scode(c, i) ? numel(nd(c, i)) * 2 : (int64_t)ir_node_bytes(c->g, i);
}

/* the bytes of node i's work buffer (CgPlan.bytes) */
static int64_t cu_bytes(const void *ctx, int i) { return sbytes(ctx, i); }

/* ---- operands --------------------------------------------------------------------------------- */

/* The C expression of node i's buffer in the phase being emitted. */
static const char *buf_ptr(const Cu *c, int i) {
  int r = cg_root(&c->pl, i);
  const CgPlace *x = &c->pl.nc[r];
  const Node *n = nd(c, r);
  if (r == c->seed) return "G.dls";
  switch (x->kind) {
  case CG_L_PARAM: return cp_fmt("%s(%lld)", scode(c, r) ? "PL" : "P", (long long)x->off);
  case CG_L_STATE: return cp_fmt("S(%lld)", (long long)x->off);
  case CG_L_INPUT: return cp_fmt("IN(%lld)", (long long)x->off);
  case CG_L_CONST: return cp_fmt("%s(%lld)", n->dtype == DT_I32 ? "KI" : "KC", (long long)x->off);
  case CG_L_SCALAR: return cp_fmt("SC(%lld)", (long long)x->off);
  case CG_L_WORK:
    cg_plan_name(&c->pl, c->ph, r, c->cur);
    return cp_fmt("%s(%lld)", n->dtype == DT_I32 ? "I" : scode(c, r) ? "L" : "F", (long long)x->woff[c->ph]);
  default: cp_unreachable();
  }
}

/* ---- autocast: f32 operands of the launches that read the low type ------------------------------ */

/* Under bf16 / f16 a cuBLASLt GEMM reads both operands in the low type, and kernels/cuda all its
 * tensors. An operand stored f32 (an f32 input, a reduction, a constant) is cast to it first, as
 * PyTorch's autocast does: node i's launch begins with a cps_cast of each such operand into a low
 * copy in i's scratch (emit_casts; after what cu_sides asked for, size_casts), and while i's
 * launches are emitted ptr names that copy. low_reads: the roots of the operands i's launch reads
 * in the low type (at most 8, each once), or none where i launches nothing of its own. */
static int low_reads(const Cu *c, int i, int *r) {
  const Node *n = nd(c, i), *f = n->op == OP_GRAD ? nd(c, n->fwd) : NULL;
  const CgPlace *x = &c->pl.nc[i];
  if (!c->lpc || n->role == ROLE_UPD || c->pl.fu->group[i] >= 0 || c->att_skip[i] >= 0 || c->att_lead[i] >= 0 ||
      c->qkv[i] || c->qkv_skip[i] || (f && c->tgrad_of[i] < 0 && (x->kind == CG_L_ALIAS || x->leader != i)))
    return 0;
  int v[8], k = 0;
  switch (f ? f->op : n->op) {
  case OP_MATMUL: /* the GRAD of A reads dy and B, that of B reads A and dy (its inputs: dy, A, B, Y) */
    if (f) v[k++] = n->in[0], v[k++] = n->in[n->ia[0] == 0 ? 2 : 1];
    else v[k++] = n->in[0], v[k++] = n->in[1];
    break;
  case OP_SOFTMAX: case OP_LAYER_NORM: case OP_RMS_NORM: case OP_ROPE: case OP_SDPA: case OP_EMBEDDING:
  case OP_CROSS_ENTROPY:
    if (!f) {
      for (int j = 0; j < n->nin; j++) v[k++] = n->in[j];
      break;
    }
    if (f->op != OP_CROSS_ENTROPY) v[k++] = n->in[0]; /* dy (cross_entropy's: the f32 loss gradient) */
    if (f->op == OP_SOFTMAX || f->op == OP_SDPA) v[k++] = n->fwd;
    if (f->op == OP_LAYER_NORM || f->op == OP_RMS_NORM) v[k++] = n->in[1], v[k++] = n->in[2];
    if (f->op == OP_CROSS_ENTROPY) v[k++] = n->in[1];
    for (int j = 0; f->op == OP_SDPA && j < f->nin; j++) v[k++] = f->in[j]; /* q, k, v [, the key mask] */
    break;
  default: return 0;
  }
  int m = 0;
  for (int j = 0; j < k; j++) {
    int q = cg_root(&c->pl, v[j]), seen = 0;
    for (int e = 0; e < m; e++) seen |= r[e] == q;
    if (!seen && nd(c, q)->dtype != DT_I32) r[m++] = q;
  }
  return m;
}

/* the bytes of root r's low copy: its elements (padded rows included), 256-byte aligned */
static int64_t cast_bytes(const Cu *c, int r) { return (sbytes(c, r) / 4 * 2 + 255) / 256 * 256; }

/* The low copy of root r that node i's launch reads, or NULL where it reads r as stored. */
static const char *cast_ptr(const Cu *c, int i, int r) {
  if (!c->cast_at || c->cast_at[i] < 0) return NULL;
  int q[8], n = low_reads(c, i, q);
  int64_t off = c->pl.nc[i].soff[c->ph] + c->cast_at[i];
  for (int k = 0; k < n; k++) {
    if (scode(c, q[k])) continue;
    if (q[k] == r) return cp_fmt("L(%lld)", (long long)off);
    off += cast_bytes(c, q[k]);
  }
  return NULL;
}

/* The C expression of node i's device pointer in the launches of node c->cur: its low copy where
 * that launch casts it, else its buffer. */
static const char *ptr(const Cu *c, int i) {
  const char *p = c->cur >= 0 ? cast_ptr(c, c->cur, cg_root(&c->pl, i)) : NULL;
  return p ? p : buf_ptr(c, i);
}

/* the storage code node c->cur's launches read node i in */
static int rcode(const Cu *c, int i) {
  return c->cur >= 0 && cast_ptr(c, c->cur, cg_root(&c->pl, i)) ? c->lpc : scode(c, i);
}

/* Scratch for the low copies (low_reads), after the bytes cu_sides gave each node; decided after
 * decide_storage and find_pitched (a copy's bytes follow its operand's). */
static void size_casts(Cu *c) {
  c->cast_at = cp_alloc(sizeof(int64_t) * (size_t)(c->g->n + 1));
  for (int i = 0; i < c->g->n; i++) {
    int r[8], n = low_reads(c, i, r);
    int64_t b = 0;
    for (int k = 0; k < n; k++) b += scode(c, r[k]) ? 0 : cast_bytes(c, r[k]);
    c->cast_at[i] = b ? (c->pl.nc[i].scratch + 255) / 256 * 256 : -1;
    if (b) c->pl.nc[i].scratch = c->cast_at[i] + b;
  }
}

static const char *aux_ptr(const Cu *c, int i, int64_t extra_floats) {
  return cp_fmt("F(%lld)", (long long)(c->pl.nc[i].aoff[c->ph] + extra_floats * 4));
}

static const char *scratch_ptr(const Cu *c, int i, const char *macro) {
  return cp_fmt("%s(%lld)", macro, (long long)c->pl.nc[i].soff[c->ph]);
}

/* Launch arguments: pointers, integers, floats, each as the address of a compound literal. */
static const char *ap(const char *p) { return cp_fmt("&(void *){%s}", p); }
static const char *al(int64_t v) { return cp_fmt("&(long long){%lldLL}", (long long)v); }
static const char *ai(int v) { return cp_fmt("&(int){%d}", v); }
static const char *af(double v) { return cp_fmt("&(float){%s}", cg_flt(v)); }

/* lk(kernel, threads, {args}, node): a grid-stride launch over `threads` elements. */
static void emit_lk(Cu *c, const char *kernel, int64_t threads, int node, int nargs, const char *const *args) {
  StrBuf b = {0};
  for (int k = 0; k < nargs; k++) sb_printf(&b, "%s%s", k ? ", " : "", args[k]);
  EMIT("  lk(%d, %lldLL, (void *[]){%s}, %d); /* %s */\n", kid(c, kernel), (long long)threads, sb_str(&b), node, kernel);
}

static void emit_lrow(Cu *c, const char *kernel, int64_t rows, int node, int nargs, const char *const *args) {
  StrBuf b = {0};
  for (int k = 0; k < nargs; k++) sb_printf(&b, "%s%s", k ? ", " : "", args[k]);
  EMIT("  lrow(%d, %lldLL, (void *[]){%s}, %d); /* %s */\n", kid(c, kernel), (long long)rows, sb_str(&b), node, kernel);
}

/* node i's casts, before its launch */
static void emit_casts(Cu *c, int i) {
  int r[8], n = low_reads(c, i, r);
  for (int k = 0; k < n; k++) {
    if (scode(c, r[k])) continue;
    int64_t e = sbytes(c, r[k]) / 4;
    EMIT("  /* autocast: %%%d (f32) read as %s */\n", r[k], c->lpc == 1 ? "bf16" : "f16");
    const char *args[4] = {ai(c->lpc), ap(cast_ptr(c, i, r[k])), ap(buf_ptr(c, r[k])), al(e)};
    emit_lk(c, "cps_cast", e, i, 4, args);
  }
}

static void emit_zero(Cu *c, const char *p, int64_t bytes) {
  EMIT("  CU(cudaMemsetAsync(%s, 0, %lld, G.s));\n", p, (long long)bytes);
}

/* ---- broadcasting descriptions (CpsIdx, CpsRed of emit_cu_support.h) ------------------------ */

/* The stride in output space of each output dim for operand x (right-aligned; 0 where x has
 * no such dim or it is 1). */
static void out_strides(const Shape *x, const Shape *out, int64_t *st) {
  int64_t s = 1;
  for (int d = out->rank - 1; d >= 0; d--) {
    int xd = d - (out->rank - x->rank);
    if (xd < 0 || x->d[xd] == 1) st[d] = 0;
    else st[d] = s, s *= x->d[xd];
  }
}

static const char *ll_list(const int64_t *v, int n) {
  StrBuf b = {0};
  sb_puts(&b, "{");
  for (int k = 0; k < n; k++) sb_printf(&b, "%s%lld", k ? ", " : "", (long long)v[k]);
  if (!n) sb_puts(&b, "0");
  sb_puts(&b, "}");
  return sb_str(&b);
}

static const char *cps_idx(const Shape *a, const Shape *b, const Shape *out) {
  int64_t sa[CP_MAX_RANK], sb[CP_MAX_RANK];
  out_strides(a, out, sa);
  out_strides(b, out, sb);
  return cp_fmt("&(CpsIdx){%d, %s, %s, %s}", out->rank, ll_list(out->d, out->rank), ll_list(sa, out->rank),
                ll_list(sb, out->rank));
}

/* The dims operand x owns and the dims it is broadcast along, with their output strides. */
static const char *cps_red(const Shape *x, const Shape *out) {
  int64_t st[CP_MAX_RANK], os[CP_MAX_RANK], kn[CP_MAX_RANK], ks[CP_MAX_RANK], rn[CP_MAX_RANK], rs[CP_MAX_RANK];
  int nk = 0, nr = 0;
  out_strides(x, out, st);
  int64_t s = 1;
  for (int d = out->rank - 1; d >= 0; d--) os[d] = s, s *= out->d[d];
  for (int d = 0; d < out->rank; d++) {
    if (out->d[d] == 1) continue;
    if (st[d]) kn[nk] = out->d[d], ks[nk++] = os[d];
    else rn[nr] = out->d[d], rs[nr++] = os[d];
  }
  return cp_fmt("&(CpsRed){%d, %d, %s, %s, %s, %s}", nk, nr, ll_list(kn, nk), ll_list(ks, nk), ll_list(rn, nr),
                ll_list(rs, nr));
}

/* ---- forward nodes ------------------------------------------------------------------------------ */

static void emit_binary(Cu *c, int i) {
  const Node *n = nd(c, i), *a = in(c, i, 0), *b = in(c, i, 1);
  int op = (int)(n->op - OP_ADD);
  if (a->dtype != b->dtype) {
    unsupported(c, i, "arithmetic mixing i32 and float tensors");
    diag_hint("convert the i32 operand first: float(x)");
    return;
  }
  const char *args[7] = {ai(op), ai(tcodes(c, 3, (int[]){i, n->in[0], n->in[1]})), ap(ptr(c, i)), ap(ptr(c, n->in[0])),
                         ap(ptr(c, n->in[1])), cps_idx(&a->shape, &b->shape, &n->shape), al(numel(n))};
  emit_lk(c, a->dtype == DT_I32 ? "cps_binary_i32" : "cps_binary", numel(n), i, 7, args);
}

/* A unary kernel's `c`: pow's exponent, clamp_min's and clamp_max's bound. */
static double unary_c(const Node *n) {
  return n->op == OP_POW || n->op == OP_CLAMP_MIN || n->op == OP_CLAMP_MAX ? n->fa[0] : 0;
}

static void emit_unary(Cu *c, int i) {
  const Node *n = nd(c, i);
  if (n->dtype != DT_F32 || in(c, i, 0)->dtype != DT_F32) {
    unsupported(c, i, cp_fmt("%s of an i32 tensor", ir_ops[n->op].name));
    return;
  }
  const char *args[6] = {ai((int)(n->op - OP_NEG)), ai(tcodes(c, 2, (int[]){i, n->in[0]})), ap(ptr(c, i)),
                         ap(ptr(c, n->in[0])), al(numel(n)), af(unary_c(n))};
  emit_lk(c, "cps_unary", numel(n), i, 6, args);
}

/* where(cond, a, b): float operands (shape_where refuses i32 ones) */
static void emit_where(Cu *c, int i) {
  const Node *n = nd(c, i), *q = in(c, i, 0), *a = in(c, i, 1), *b = in(c, i, 2);
  int tt = tcodes(c, 4, (int[]){i, n->in[0], n->in[1], n->in[2]}) | (n->dtype == DT_I32 ? 3 : 0); /* 3: i32 */
  const char *args[8] = {ai(tt), ap(ptr(c, i)),
                         ap(ptr(c, n->in[0])), ap(ptr(c, n->in[1])), ap(ptr(c, n->in[2])),
                         cps_idx(&q->shape, &a->shape, &n->shape), cps_idx(&b->shape, &b->shape, &n->shape),
                         al(numel(n))};
  emit_lk(c, "cps_where", numel(n), i, 8, args);
}

static void emit_reduce(Cu *c, int i) {
  const Node *n = nd(c, i), *x = in(c, i, 0);
  int64_t o, l, r;
  if (x->dtype != DT_F32 && x->dtype != DT_I32) {
    unsupported(c, i, cp_fmt("%s of a %s tensor", ir_ops[n->op].name, dtype_name(x->dtype)));
    return;
  }
  if (!cg_reduce_dims(n, &x->shape, &o, &l, &r)) {
    unsupported(c, i, "a reduction over axes that are not adjacent");
    return;
  }
  int tt = tcodes(c, 2, (int[]){i, n->in[0]});
  if (x->dtype == DT_I32) { /* emit_c.c's loop: sum and max i32, mean a float */
    const char *args[7] = {ai(n->op == OP_SUM ? 0 : n->op == OP_MEAN ? 1 : 2), ai(tt), ap(ptr(c, i)),
                           ap(ptr(c, n->in[0])), al(o), al(l), al(r)};
    emit_lk(c, "cps_reduce_i32", o * r, i, 7, args);
    return;
  }
  if (n->op != OP_MAX && r == 1 && o == 1 && l >= 65536) { /* one long vector: two passes */
    EMIT("  lsum(%d, %s, %d, %s, %d, %lldLL, %d);\n", n->op == OP_MEAN, ptr(c, i), scode(c, i), ptr(c, n->in[0]),
         scode(c, n->in[0]), (long long)l, i);
    return;
  }
  if (n->op != OP_MAX && r == 1 && l >= 1) { /* the row kernel: one block per row */
    const char *args[6] = {ai(n->op == OP_MEAN), ai(tt), ap(ptr(c, i)), ap(ptr(c, n->in[0])), al(o), al(l)};
    emit_lrow(c, "cps_row_sum", o, i, 6, args);
    return;
  }
  const char *args[7] = {ai(n->op == OP_SUM ? 0 : n->op == OP_MEAN ? 1 : 2), ai(tt), ap(ptr(c, i)), ap(ptr(c, n->in[0])),
                         al(o), al(l), al(r)};
  emit_lk(c, "cps_reduce", o * r, i, 7, args);
}

/* The GEMM view of matmul f (cg_mm_dims) and its operands. */
typedef struct Mm {
  CgMm d;
  const char *a, *b;
  bool ta, tb;
  int abt; /* the storage code of both operands (as read: the low one under bf16 / f16) */
} Mm;

static bool mm_setup(Cu *c, const Node *f, int fi, Mm *mm) {
  const Node *a = nd(c, f->in[0]), *b = nd(c, f->in[1]);
  if (!cg_mm_dims(c->g, f, &mm->d)) return unsupported(c, fi, "a matmul whose batch dims broadcast partially");
  if (a->dtype != DT_F32 || b->dtype != DT_F32) return unsupported(c, fi, "a matmul of i32 tensors");
  mm->abt = c->upd ? 0 : c->lpc; /* an operand stored f32 is read as its low copy (low_reads) */
  mm->a = ptr(c, f->in[0]), mm->ta = c->pl.nc[f->in[0]].trans;
  mm->b = ptr(c, f->in[1]), mm->tb = c->pl.nc[f->in[1]].trans;
  return true;
}

/* acc: add to out (beta 1) instead of overwriting it; ld: the row pitches of a, b, out (NULL, 0:
 * contiguous rows; find_pitched) */
static void emit_gemm(Cu *c, const char *out, const char *a, const char *b, int64_t nb, int64_t m, int64_t n,
                      int64_t k, bool ta, bool tb, int64_t sa, int64_t sb, int64_t sc, const int64_t *ld, int node,
                      int abt, int ct, bool acc) {
  if (ld && (ld[0] || ld[1] || ld[2])) {
    EMIT("  gemm_ld(%s, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %lldLL, %lldLL, %lldLL, %lldLL, %lldLL, %lldLL, %d, %d, %d, "
         "%d);\n", out, a, b, (long long)nb, (long long)m, (long long)n, (long long)k, ta, tb, (long long)sa,
         (long long)sb, (long long)sc, (long long)ld[0], (long long)ld[1], (long long)ld[2], node, abt, ct, acc);
    return;
  }
  EMIT("  gemm(%s, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %lldLL, %lldLL, %lldLL, %d, %d, %d, %d);\n", out, a, b,
       (long long)nb, (long long)m, (long long)n, (long long)k, ta, tb, (long long)sa, (long long)sb, (long long)sc,
       node, abt, ct, acc);
}

/* The batch stride of matmul output (or output gradient) v, whose batches hold m rows: m rows of
 * its pitch when padded, else the graph's stride s. */
static int64_t pstride(const Cu *c, int v, int64_t m, int64_t s) {
  return c->pitch[v] && s ? m * c->pitch[v] : s;
}

/* Which GRAD nodes' only reader is an ACCUM into an f32 gradient accumulator (acc_of): a weight
 * gradient's GEMM (beta 1) or an accumulating backward kernel (group_outputs) then adds into the
 * accumulator itself and the ACCUM launches nothing (acc_done). Other GRAD emitters ignore acc_of
 * and keep the ACCUM. */
static void find_accums(Cu *c) {
  const Graph *g = c->g;
  int *uses = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  c->acc_of = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  c->acc_done = cp_alloc(sizeof(bool) * (size_t)(g->n + 1));
  c->reader = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  c->ep_done = cp_alloc(sizeof(bool) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) c->acc_of[i] = c->reader[i] = -1;
  for (int i = 0; i < g->n; i++) {
    const Node *n = nd(c, i);
    /* values a GRAD names but never reads: a matmul's output (its GRAD's last input); every input of
     * an add or a sub but dy (their derivatives are constants: cps_dbin, colsum) */
    OpId fo = n->op == OP_GRAD ? nd(c, n->fwd)->op : OP_GRAD;
    int nin = fo == OP_MATMUL ? n->nin - 1 : fo == OP_ADD || fo == OP_SUB ? 1 : n->nin;
    for (int k = 0; k < nin; k++) {
      int x = n->in[k];
      c->reader[x] = uses[x]++ ? -1 : i;
    }
  }
  for (int i = 0; i < g->n; i++) {
    const Node *a = nd(c, i);
    if (a->op != OP_ACCUM || a->role == ROLE_UPD) continue;
    int v = a->in[1];
    if (uses[v] == 1 && nd(c, v)->op == OP_GRAD && c->pl.nc[v].kind != CG_L_ALIAS && !scode(c, v) &&
        !scode(c, a->in[0]) && numel(nd(c, v)) == numel(nd(c, a->in[0])))
      c->acc_of[v] = i;
  }
}


/* x @ W + b as one GEMM with cuBLASLt's bias epilogue: matmul i's only reader is an add of a
 * vector of its last dim, fused with nothing else, stored like it (and the bias like the sum);
 * returns that add, or -1. The add stays in the graph (its backward is unchanged); it launches
 * nothing (ep_done). */
static int bias_add_of(const Cu *c, int i, const Mm *mm) {
  int j = c->reader[i];
  if (j < 0 || mm->d.sc == 0) return -1;
  const Node *a = nd(c, j), *n = nd(c, i);
  if (a->op != OP_ADD || a->in[0] == a->in[1] || a->role != n->role) return -1;
  int b = a->in[0] == i ? a->in[1] : a->in[0];
  const Node *bn = nd(c, b);
  int g = c->pl.fu->group[j];
  if (bn->shape.rank != 1 || n->shape.rank < 1 || bn->shape.d[0] != n->shape.d[n->shape.rank - 1] ||
      !shape_eq(&a->shape, &n->shape) || bn->dtype != DT_F32 || (g >= 0 && c->pl.fu->groups[g].nodes.n != 1))
    return -1;
  if (scode(c, j) != scode(c, i) || scode(c, b) != scode(c, j) || c->pl.nc[j].kind != CG_L_WORK) return -1;
  /* the bias must exist when the GEMM runs (a lowered plan may gather it after the matmul) */
  int br = cg_root(&c->pl, b);
  if (c->pl.nc[br].kind == CG_L_WORK && c->pl.nc[br].leader > i) return -1;
  return j;
}

/* node i has a launch of its own: no fusion group, or a group of just itself */
static bool alone(const Cu *c, int i) {
  int gi = c->pl.fu->group[i];
  return gi < 0 || c->pl.fu->groups[gi].nodes.n == 1;
}

/* Node v's readers (nodes with v among their inputs) are all in set[0..n). */
static bool read_only_by(const Cu *c, int v, const int *set, int n) {
  for (int j = c->rd_off[v]; j < c->rd_off[v + 1]; j++) {
    bool in_set = false;
    for (int k = 0; k < n; k++) in_set |= set[k] == c->rd[j];
    if (!in_set) return false;
  }
  return true;
}

/* The GRAD of forward node f for its input k, if exactly one; else -1. */
static int grad_of(const Cu *c, int f, int k) {
  int found = -1;
  for (int i = c->grads_of[f]; i >= 0; i = c->next_grad[i])
    if (nd(c, i)->ia[0] == k) {
      if (found >= 0) return -1;
      found = i;
    }
  return found;
}

/* The graph's indices the passes below query (instead of walking the graph per query): the
 * readers of each value (rd[rd_off[v] .. rd_off[v + 1]), a reader once however many of its inputs
 * v is) and the GRAD nodes of each forward node (grads_of[f], then next_grad[i], in graph order). */
static void index_graph(Cu *c) {
  const Graph *g = c->g;
  c->rd_off = cp_alloc(sizeof(int) * (size_t)(g->n + 2));
  c->grads_of = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  c->next_grad = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) c->grads_of[i] = c->next_grad[i] = -1;
  for (int pass = 0; pass < 2; pass++) {
    int *fill = pass ? cp_alloc(sizeof(int) * (size_t)(g->n + 1)) : NULL;
    if (pass) {
      for (int v = 0; v < g->n; v++) c->rd_off[v + 1] += c->rd_off[v];
      c->rd = cp_alloc(sizeof(int) * (size_t)(c->rd_off[g->n] + 1));
    }
    for (int i = 0; i < g->n; i++) {
      const Node *n = nd(c, i);
      for (int k = 0; k < n->nin; k++) {
        bool again = false; /* an earlier input of i is the same value */
        for (int j = 0; j < k && !again; j++) again = n->in[j] == n->in[k];
        if (again) continue;
        if (pass) c->rd[c->rd_off[n->in[k]] + fill[n->in[k]]++] = i;
        else c->rd_off[n->in[k] + 1]++;
      }
    }
  }
  for (int i = g->n - 1; i >= 0; i--) {
    const Node *n = nd(c, i);
    if (n->op == OP_GRAD && n->fwd >= 0 && n->fwd < g->n) c->next_grad[i] = c->grads_of[n->fwd], c->grads_of[n->fwd] = i;
  }
}

/* The nodes whose memory is each root's (cg_root), as a tree: kids[r], then sib[x], the nodes
 * that are views (CG_L_ALIAS) of r directly, and stack, room for a walk of one. A pass that makes a
 * node a view as it goes adds it (alias_kid); built per pass, from the plan as it stands. */
typedef struct Views {
  int *kids, *sib, *stack;
} Views;

static Views index_views(const Cu *c) {
  int n = c->g->n;
  Views v = {cp_alloc(sizeof(int) * (size_t)(n + 1)), cp_alloc(sizeof(int) * (size_t)(n + 1)),
             cp_alloc(sizeof(int) * (size_t)(n + 1))};
  for (int i = 0; i < n; i++) v.kids[i] = v.sib[i] = -1;
  for (int i = n - 1; i >= 0; i--)
    if (c->pl.nc[i].kind == CG_L_ALIAS) v.sib[i] = v.kids[c->pl.nc[i].alias], v.kids[c->pl.nc[i].alias] = i;
  return v;
}

static void alias_kid(Views *v, int x, int to) { v->sib[x] = v->kids[to], v->kids[to] = x; }

/* Whether an executed node other than `skip` reads the memory of root r (an input whose cg_root is
 * r) with its leader at or after `from` (after > 0) or at or before it (after < 0). */
static bool root_read(const Cu *c, Views *v, int r, int skip, int from, int after) {
  int top = 0;
  v->stack[top++] = r;
  while (top) {
    int x = v->stack[--top];
    for (int j = c->rd_off[x]; j < c->rd_off[x + 1]; j++) {
      int m = c->rd[j], lead = c->pl.nc[m].leader;
      if (m != skip && cg_executed(nd(c, m)) && (after > 0 ? lead >= from : lead <= from)) return true;
    }
    for (int k = v->kids[x]; k >= 0; k = v->sib[k]) v->stack[top++] = k;
  }
  return false;
}

/* The adds of a tree rooted at r whose leaves are l[0..3), each once: marks them in in_tree, and
 * lists them in tree[0 .. *nt) (a node as often as it is marked). */
static bool add_tree(const Cu *c, int r, const int *l, int *seen, bool *in_tree, int *tree, int *nt) {
  for (int k = 0; k < 3; k++)
    if (r == l[k]) return !seen[k]++;
  const Node *n = nd(c, r);
  if (n->op != OP_ADD || n->nin != 2 || !shape_eq(&nd(c, n->in[0])->shape, &n->shape) ||
      !shape_eq(&nd(c, n->in[1])->shape, &n->shape))
    return false;
  in_tree[r] = true, tree[(*nt)++] = r;
  return add_tree(c, n->in[0], l, seen, in_tree, tree, nt) && add_tree(c, n->in[1], l, seen, in_tree, tree, nt);
}

/* GPT-2's attention input, x @ W_qkv + b split into q, k and v heads: three slices of x's last
 * axis into its thirds, each read only by a split_heads with the same h, run as one cps_qkv launch
 * at the first slice; in the backward, the sum of the three slices' gradients (an add tree) runs
 * as one cps_qkv launch from the heads' gradients (llm.c's permute and unpermute), in place of
 * three slices, three split_heads, and, backward, three merges, three zeroed scatters and two adds.
 * The nodes it computes get the launching node as leader, so the memory plan keeps their inputs
 * alive until it. Decided before the memory plan. When the heads feed one sdpa whose gradients make
 * the sum, find_attn_inplace then drops both launches: the attention reads and writes in place. */
static void find_qkv(Cu *c) {
  const Graph *g = c->g;
  c->qkv = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  c->qkv_ops = cp_alloc(sizeof(int[4]) * (size_t)(g->n + 1));
  c->qkv_skip = cp_alloc(sizeof(bool) * (size_t)(g->n + 1));
  bool *in_tree = cp_alloc(sizeof(bool) * (size_t)(g->n + 1));
  int *tree = cp_alloc(sizeof(int) * (size_t)(g->n + 1)), nt = 0; /* the nodes in_tree marks */
  /* the executed forward slices of each node, as a list (slices[x], then next_slice[i]), so a
   * candidate costs its own slices, not a walk of the graph */
  int *slices = cp_alloc(sizeof(int) * (size_t)(g->n + 1)), *next_slice = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) slices[i] = -1;
  for (int i = g->n - 1; i >= 0; i--) {
    const Node *n = nd(c, i);
    if (n->op != OP_SLICE || n->role != ROLE_FWD || !cg_executed(n)) continue;
    next_slice[i] = slices[n->in[0]], slices[n->in[0]] = i;
  }
  for (int x = 0; x < g->n; x++) {
    const Node *xn = nd(c, x);
    if (slices[x] < 0 || xn->shape.rank != 3 || xn->dtype != DT_F32 || xn->shape.d[2] % 3) continue;
    int64_t cc = xn->shape.d[2] / 3;
    int sl[3] = {-1, -1, -1}, q[3], ns = 0;
    bool ok = true;
    for (int i = slices[x]; i >= 0 && ok; i = next_slice[i]) {
      const Node *n = nd(c, i);
      int p = (int)(n->ia[1] / cc);
      ok = n->ia[0] == 2 && n->ia[1] == p * cc && n->ia[2] == (p + 1) * cc && sl[p] < 0;
      if (ok) sl[p] = i, ns++;
    }
    if (!ok || ns != 3) continue;
    int64_t h = 0;
    for (int p = 0; p < 3 && ok; p++) {
      q[p] = c->reader[sl[p]];
      for (int e = c->rd_off[sl[p]]; e < c->rd_off[sl[p] + 1] && q[p] < 0; e++) /* its readers, in graph order */
        if (nd(c, c->rd[e])->op == OP_SPLIT_HEADS && nd(c, c->rd[e])->in[0] == sl[p]) q[p] = c->rd[e];
      ok = q[p] >= 0 && nd(c, q[p])->op == OP_SPLIT_HEADS && (p == 0 || nd(c, q[p])->ia[0] == h) &&
           c->pl.fu->group[q[p]] < 0 && c->pl.fu->group[sl[p]] < 0 && scode(c, q[p]) == scode(c, q[0]);
      if (!ok) break;
      h = nd(c, q[p])->ia[0];
      /* the slice's value is never computed: only its split_heads and gradients that do not read it name it */
      int allowed[3] = {q[p], grad_of(c, q[p], 0), grad_of(c, sl[p], 0)};
      ok = h > 0 && cc % h == 0 && read_only_by(c, sl[p], allowed, 3);
    }
    if (!ok) continue;
    int first = sl[0] < sl[1] ? (sl[0] < sl[2] ? sl[0] : sl[2]) : (sl[1] < sl[2] ? sl[1] : sl[2]);
    c->qkv[first] = 1;
    c->qkv_ops[first][0] = x;
    for (int p = 0; p < 3; p++) {
      c->qkv_ops[first][p + 1] = q[p];
      c->qkv_skip[q[p]] = true, c->pl.nc[q[p]].leader = first;
      if (sl[p] != first) c->qkv_skip[sl[p]] = true, c->pl.nc[sl[p]].leader = first;
    }
    /* the backward: g_p = GRAD(slice p) of dy h_p = GRAD(split_heads p) of dy d_p, summed by adds */
    int hg[3], gs[3], d[3];
    for (int p = 0; p < 3 && ok; p++) {
      hg[p] = grad_of(c, q[p], 0), gs[p] = grad_of(c, sl[p], 0);
      ok = hg[p] >= 0 && gs[p] >= 0 && nd(c, gs[p])->in[0] == hg[p] && c->reader[hg[p]] == gs[p] && c->reader[gs[p]] >= 0 &&
           c->pl.nc[hg[p]].leader == hg[p] && c->pl.nc[gs[p]].leader == gs[p] && c->pl.fu->group[hg[p]] < 0 &&
           c->pl.fu->group[gs[p]] < 0;
      if (ok) d[p] = nd(c, hg[p])->in[0], ok = scode(c, d[p]) == scode(c, d[0]);
    }
    if (!ok) continue;
    int r = gs[0];
    while (c->reader[r] >= 0 && nd(c, c->reader[r])->op == OP_ADD) r = c->reader[r];
    int seen[3] = {0, 0, 0};
    for (int k = 0; k < nt; k++) in_tree[tree[k]] = false; /* the last candidate's */
    nt = 0;
    ok = r != gs[0] && add_tree(c, r, gs, seen, in_tree, tree, &nt) && seen[0] == 1 && seen[1] == 1 && seen[2] == 1 &&
         scode(c, r) == scode(c, x) && c->pl.nc[r].kind == CG_L_WORK;
    /* a fused tree: its group must be the tree's adds */
    for (int k = 0; k < nt && ok; k++) {
      int i = tree[k], gi = c->pl.fu->group[i];
      ok = (gi < 0 || c->pl.fu->groups[gi].root == r) && (i == r || c->reader[i] >= 0);
    }
    int gr = c->pl.fu->group[r];
    for (int k = 0; ok && gr >= 0 && k < c->pl.fu->groups[gr].nodes.n; k++) ok = in_tree[c->pl.fu->groups[gr].nodes.a[k]];
    if (!ok) continue;
    c->qkv[r] = 2;
    c->qkv_ops[r][0] = r;
    for (int p = 0; p < 3; p++) {
      c->qkv_ops[r][p + 1] = d[p];
      c->qkv_skip[hg[p]] = c->qkv_skip[gs[p]] = true;
      c->pl.nc[hg[p]].leader = c->pl.nc[gs[p]].leader = r;
    }
    for (int k = 0; k < nt; k++)
      if (tree[k] != r) c->qkv_skip[tree[k]] = true, c->pl.nc[tree[k]].leader = r;
  }
}

/* The launch find_qkv decided at node i. */
static void emit_qkv(Cu *c, int i) {
  const int *o = c->qkv_ops[i];
  bool bwd = c->qkv[i] == 2;
  const Node *x = nd(c, o[0]), *q = nd(c, o[1]); /* backward: o[0] is i, q dq [b, h, t, dh] */
  int64_t h = bwd ? q->shape.d[1] : q->ia[0];
  int tt = scode(c, o[0]) | scode(c, o[1]) << 2;
  EMIT("  /* %s: %%%d <-> q, k, v %%%d %%%d %%%d in heads (cps_qkv) */\n", bwd ? "the three slices' gradients summed"
       : "three slices and split_heads", o[0], o[1], o[2], o[3]);
  const char *args[10] = {ai(bwd), ai(tt), ap(ptr(c, o[0])), ap(ptr(c, o[1])), ap(ptr(c, o[2])), ap(ptr(c, o[3])),
                          al(x->shape.d[0]), al(x->shape.d[1]), al(x->shape.d[2] / 3), al(h)};
  emit_lk(c, "cps_qkv", numel(x), i, 10, args);
}

/* The backward's residual sums: add(r, dx) where dx is a layer/rms norm's input gradient and r a
 * work buffer every other reader of which runs before the norm's backward: the norm's kernel adds
 * dx into r's buffer (accumulate_dx 1) and the add becomes a view of r, in place of writing dx and
 * then a pass that reads both. Decided before the memory plan (the add's readers keep r alive). */
static void find_inplace_adds(Cu *c) {
  const Graph *g = c->g;
  c->add_into = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  c->add_skip = cp_alloc(sizeof(bool) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) c->add_into[i] = -1;
  Views views = index_views(c);
  for (int a = 0; a < g->n; a++) {
    const Node *an = nd(c, a);
    if (an->op != OP_ADD || an->role != ROLE_BWD || !cg_executed(an) || !alone(c, a) || c->pl.nc[a].kind != CG_L_WORK ||
        an->in[0] == an->in[1] || c->qkv_skip[a] || c->qkv[a] || c->ep_done[a])
      continue;
    for (int side = 0; side < 2; side++) {
      int j = an->in[side], r = an->in[1 - side], rr = cg_root(&c->pl, r);
      const Node *jn = nd(c, j);
      if (jn->op != OP_GRAD || jn->ia[0] != 0 || (nd(c, jn->fwd)->op != OP_LAYER_NORM && nd(c, jn->fwd)->op != OP_RMS_NORM))
        continue;
      int lead = c->pl.nc[j].leader;
      if (c->pl.nc[j].kind != CG_L_WORK || c->reader[j] != a || c->acc_of[j] >= 0 || c->pl.nc[rr].kind != CG_L_WORK ||
          c->pl.nc[rr].leader >= lead || numel(nd(c, rr)) != numel(an) || !shape_eq(&jn->shape, &an->shape) ||
          scode(c, rr) != scode(c, j) || scode(c, a) != scode(c, j) || nd(c, rr)->dtype != DT_F32)
        continue;
      /* r's buffer changes at the norm's launch: nothing else may read it from then on */
      if (root_read(c, &views, rr, a, lead, 1)) continue;
      c->add_into[j] = rr, c->add_skip[a] = true;
      c->pl.nc[a].kind = CG_L_ALIAS, c->pl.nc[a].alias = rr, alias_kid(&views, a, rr);
      break;
    }
  }
}

/* Attention in place (kernels/cuda/attn_layout.h), in place of permutes:
 *  - an sdpa whose q, k and v are find_qkv's three heads of one projection x [b, t, 3C], and whose
 *    three gradients are find_qkv's backward launch's dq, dk, dv, reads q, k and v in x and writes
 *    dq, dk and dv into that launch's sum [b, t, 3C]: both cps_qkv launches go; the heads become
 *    views of x (which lives until the backward), the gradients views of the sum, whose buffer is
 *    live from the sdpa's backward on;
 *  - an sdpa whose value only a merge_heads m reads (besides its gradients) writes its output merged,
 *    into m's buffer (m, computed with it, lives from it on, and until the backward, which reads the
 *    output), and its backward reads dy merged too: m's gradient (a split_heads of the merged dy)
 *    becomes a view of that dy.
 * Storage types must agree (no conversion on the way). Decided before the memory plan. */
static void find_attn_inplace(Cu *c) {
  const Graph *g = c->g;
  int **arrs[5] = {&c->att_x, &c->att_r, &c->att_m, &c->att_lead, &c->att_skip};
  for (int k = 0; k < 5; k++) {
    *arrs[k] = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
    for (int i = 0; i <= g->n; i++) (*arrs[k])[i] = -1;
  }
  /* find_qkv's launches by their first operand (q, or dq backward): launch_at[q], then next_launch[j] */
  int *launch_at = cp_alloc(sizeof(int) * (size_t)(g->n + 1)), *next_launch = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int j = 0; j < g->n; j++) launch_at[j] = -1;
  for (int j = 0; j < g->n; j++)
    if (c->qkv[j]) next_launch[j] = launch_at[c->qkv_ops[j][1]], launch_at[c->qkv_ops[j][1]] = j;
  for (int s = 0; s < g->n; s++) {
    const Node *sn = nd(c, s);
    if (sn->op != OP_SDPA || sn->role != ROLE_FWD || !cg_executed(sn) || !alone(c, s) || c->pl.nc[s].kind != CG_L_WORK)
      continue;
    int gr[3], lead = -1;
    bool ok = true;
    for (int p = 0; p < 3 && ok; p++) {
      gr[p] = grad_of(c, s, p);
      ok = gr[p] >= 0 && alone(c, gr[p]) && (p == 0 ? (lead = c->pl.nc[gr[p]].leader) >= 0 : c->pl.nc[gr[p]].leader == lead) &&
           nd(c, gr[p])->in[0] == nd(c, gr[0])->in[0] && scode(c, gr[p]) == scode(c, s);
    }
    if (!ok) continue; /* a forward without its three gradients: as it was */
    int code = scode(c, s);
    /* the merge */
    int m = -1;
    for (int e = c->rd_off[s]; e < c->rd_off[s + 1]; e++) /* s's readers */
      if (nd(c, c->rd[e])->op == OP_MERGE_HEADS && nd(c, c->rd[e])->in[0] == s) m = m < 0 ? c->rd[e] : -2;
    int gm = m >= 0 ? grad_of(c, m, 0) : -1, dy2 = gm >= 0 ? nd(c, gm)->in[0] : -1;
    bool merge = m >= 0 && gm >= 0 && nd(c, m)->role == ROLE_FWD && alone(c, m) && c->pl.nc[m].kind == CG_L_WORK &&
                 c->pl.nc[m].leader == m && !c->ep_done[m] && !c->qkv[m] && !c->qkv_skip[m] && scode(c, m) == code &&
                 read_only_by(c, s, (int[]){m, gr[0], gr[1], gr[2], gm}, 5) && alone(c, gm) &&
                 c->pl.nc[gm].kind == CG_L_WORK && c->pl.nc[gm].leader == gm && c->acc_of[gm] < 0 &&
                 nd(c, gr[0])->in[0] == gm && read_only_by(c, gm, gr, 3) && c->pl.nc[dy2].kind == CG_L_WORK &&
                 scode(c, gm) == code && scode(c, dy2) == code;
    /* the projection and the gradients' sum */
    int first = -1, r = -1;
    for (int side = 0; side < 2; side++) /* the launches whose first operand is q or dq, the last that fits */
      for (int j = launch_at[side ? gr[0] : sn->in[0]]; j >= 0; j = next_launch[j]) {
        const int *o = c->qkv_ops[j];
        if (c->qkv[j] == 1 && o[1] == sn->in[0] && o[2] == sn->in[1] && o[3] == sn->in[2] && j > first) first = j;
        if (c->qkv[j] == 2 && o[1] == gr[0] && o[2] == gr[1] && o[3] == gr[2] && j > r) r = j;
      }
    int x = first >= 0 ? c->qkv_ops[first][0] : -1;
    bool qkv = first >= 0 && r >= 0 && c->pl.nc[x].kind == CG_L_WORK && scode(c, x) == code && scode(c, r) == code &&
               shape_eq(&nd(c, sn->in[1])->shape, &nd(c, sn->in[0])->shape); /* equal thirds: no groups, one T */
    for (int p = 0; p < 3 && qkv; p++) {
      int hq = sn->in[p];
      qkv = scode(c, hq) == code && read_only_by(c, hq, (int[]){s, gr[0], gr[1], gr[2], grad_of(c, hq, 0)}, 5) &&
            c->pl.nc[gr[p]].kind == CG_L_WORK && c->acc_of[gr[p]] < 0 && c->add_into[gr[p]] < 0 && c->reader[gr[p]] >= 0;
    }
    if (merge) {
      c->att_m[s] = m, c->att_skip[m] = c->att_skip[gm] = s;
      c->pl.nc[s].kind = CG_L_ALIAS, c->pl.nc[s].alias = m, c->pl.nc[m].leader = s;
      c->pl.nc[gm].kind = CG_L_ALIAS, c->pl.nc[gm].alias = dy2;
    }
    if (qkv) {
      c->att_x[s] = x, c->att_r[s] = r, c->qkv[first] = c->qkv[r] = 0, c->att_lead[lead] = s;
      c->att_skip[first] = s; /* the slice that launched cps_qkv */
      for (int j = 0; j < g->n; j++) {
        if (c->qkv_skip[j] && c->pl.nc[j].leader == first) c->att_skip[j] = s; /* the slices, the heads */
        if (c->qkv_skip[j] && c->pl.nc[j].leader == r) c->att_skip[j] = s, c->pl.nc[j].leader = lead; /* their grads */
      }
      for (int p = 0; p < 3; p++) {
        c->pl.nc[sn->in[p]].kind = CG_L_ALIAS, c->pl.nc[sn->in[p]].alias = x;
        c->pl.nc[gr[p]].kind = CG_L_ALIAS, c->pl.nc[gr[p]].alias = r;
        if (gr[p] != lead) c->att_skip[gr[p]] = s;
      }
      c->att_skip[r] = s, c->pl.nc[r].leader = lead;
    }
  }
}

/* Whether the work buffers of nodes x and y share arena bytes in the phase being emitted. */
static bool arena_overlap(const Cu *c, int x, int y) {
  int rx = cg_root(&c->pl, x), ry = cg_root(&c->pl, y);
  if (c->pl.nc[rx].kind != CG_L_WORK || c->pl.nc[ry].kind != CG_L_WORK) return false;
  if (cg_plan_idle(&c->pl, c->ph, rx) || cg_plan_idle(&c->pl, c->ph, ry)) return false; /* no bytes */
  int64_t ax = c->pl.nc[rx].woff[c->ph], ay = c->pl.nc[ry].woff[c->ph];
  return ax < ay + sbytes(c, ry) && ay < ax + sbytes(c, rx);
}

/* Decides the GEMM epilogues before the memory plan: the bias add's result (and a gelu's) is
 * written by the matmul's GEMM, so its buffer is live from the matmul on (its leader), and never
 * shares memory with the GEMM's operands, which die there; likewise a gelu's gradient computed by
 * the GEMM of its dy (DGELU). */
static void find_epilogues(Cu *c) {
  const Graph *g = c->g;
  c->ep_of = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  c->gelu_of = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) c->ep_of[i] = c->gelu_of[i] = -1;
  for (int i = 0; i < g->n; i++) {
    const Node *n = nd(c, i);
    Mm mm = {0};
    if (n->op != OP_MATMUL || !cg_executed(n) || c->pl.fu->group[i] >= 0 || !cg_mm_dims(c->g, n, &mm.d)) continue;
    int j = bias_add_of(c, i, &mm);
    if (j < 0) continue;
    c->ep_of[i] = j, c->pl.nc[j].leader = i;
    /* gelu(x @ W + b): the GEMM writes the gelu too, and the add's value (the pre-activation) as its aux */
    int k = -1;
    for (int e = c->rd_off[j]; e < c->rd_off[j + 1] && k < 0; e++) { /* j's readers, in graph order */
      const Node *r = nd(c, c->rd[e]);
      if (r->op == OP_GELU && r->in[0] == j && r->role == n->role) k = c->rd[e];
    }
    if (k < 0 || !alone(c, k)) continue;
    /* the add's value: read by the gelu and its gradient; named (not read) by the add's own gradients */
    int gk = grad_of(c, k, 0), allowed[4] = {k, gk, grad_of(c, j, 0), grad_of(c, j, 1)};
    if (!read_only_by(c, j, allowed, 4) || scode(c, k) != scode(c, j) || c->pl.nc[k].kind != CG_L_WORK ||
        nd(c, j)->shape.d[nd(c, j)->shape.rank - 1] % 8 != 0)
      continue;
    c->gelu_of[i] = k, c->ep_done[k] = true, c->pl.nc[k].leader = i;
    /* its gradient: dh = dy @ W2^T (the GRAD of the matmul that reads the gelu) times gelu'(pre) */
    if (gk < 0 || !alone(c, gk)) continue;
    int dh = nd(c, gk)->in[0];
    const Node *dn = nd(c, dh);
    if (dn->op != OP_GRAD || nd(c, dn->fwd)->op != OP_MATMUL || dn->ia[0] != 0 || c->reader[dh] != gk ||
        c->acc_of[dh] >= 0 || c->pl.fu->group[dh] >= 0 || c->pl.nc[dh].leader != dh || scode(c, dh) != scode(c, gk) ||
        c->pl.nc[gk].kind != CG_L_WORK)
      continue;
    c->gelu_of[dh] = gk, c->ep_done[gk] = true, c->pl.nc[gk].leader = dh;
  }
}

/* x is out's trailing dims (no 1s among them) and smaller: broadcast along the leading dims only */
static bool trailing_of(const Shape *x, const Shape *out) {
  if (x->rank < 1 || x->rank > out->rank || shape_numel(x) >= shape_numel(out)) return false;
  for (int k = 0; k < x->rank; k++)
    if (x->d[k] != out->d[out->rank - x->rank + k] || x->d[k] == 1) return false;
  return true;
}

/* The bias gradients a GEMM computes in its epilogue (cuBLASLt's bias-gradient epilogues, decided
 * after the other fusions). The gradient db of a vector b added along the last dim (x @ W + b) is
 * the column sums of dy; when db's only reader is its f32 accumulator and it is computed alone, the
 * GEMM reading dy computes them: the gelu gradient's GEMM when dy is one (DGELU_BGRAD, the sums of
 * its own result), else the weight gradient dW = x^T @ dy of the matmul that is the add's other input
 * (BGRAD_B: the sums of its b operand). That GEMM adds them into the accumulator (gemm_bgrad,
 * gemm_dgelu_bgrad), so db's node and its ACCUM launch nothing; db's buffer is left unused. */
static void find_bgrads(Cu *c) {
  const Graph *g = c->g;
  c->bgrad_of = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  c->bgrad_host = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) c->bgrad_of[i] = c->bgrad_host[i] = -1;
  /* the pass moves no leader and makes no view: indexed once, the GRADs by leader (led[l], then
   * next_led[j]) and the GRADs h with a gelu_of by the root of that (gelu_at[r], then next_gelu[h]),
   * each list in graph order */
  int *led = cp_alloc(sizeof(int) * (size_t)(g->n + 1)), *next_led = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  int *gelu_at = cp_alloc(sizeof(int) * (size_t)(g->n + 1)), *next_gelu = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) led[i] = gelu_at[i] = -1;
  for (int j = g->n - 1; j >= 0; j--) {
    if (nd(c, j)->op != OP_GRAD) continue;
    int l = c->pl.nc[j].leader;
    if (l >= 0 && l < g->n) next_led[j] = led[l], led[l] = j;
    if (c->gelu_of[j] >= 0) {
      int r = cg_root(&c->pl, c->gelu_of[j]);
      next_gelu[j] = gelu_at[r], gelu_at[r] = j;
    }
  }
  for (int i = 0; i < g->n; i++) {
    const Node *n = nd(c, i);
    if (n->op != OP_GRAD || !cg_executed(n) || !alone(c, i) || c->pl.fu->group[i] >= 0 ||
        c->pl.nc[i].kind == CG_L_ALIAS || c->pl.nc[i].leader != i || c->acc_of[i] < 0)
      continue;
    const Node *f = nd(c, n->fwd);
    int w = (int)n->ia[0];
    if ((f->op != OP_ADD && f->op != OP_SUB) || f->in[0] == f->in[1] || w > 1) continue;
    const Node *x = nd(c, f->in[w]);
    if (x->shape.rank != 1 || !trailing_of(&x->shape, &f->shape)) continue;
    bool solo = true; /* no other gradient computed with it (group_outputs) */
    for (int j = led[i]; j >= 0 && solo; j = next_led[j]) solo = j == i || c->pl.nc[j].kind == CG_L_ALIAS;
    if (!solo) continue;
    int dy = cg_root(&c->pl, n->in[0]), host = -1;
    for (int h = gelu_at[dy]; h >= 0 && host < 0; h = next_gelu[h])
      if (c->bgrad_of[h] < 0) host = h;
    int mi = f->in[1 - w];
    if (host < 0 && nd(c, mi)->op == OP_MATMUL) {
      int gw = grad_of(c, mi, 1);
      if (gw >= 0 && cg_executed(nd(c, gw)) && alone(c, gw) && c->pl.fu->group[gw] < 0 &&
          c->pl.nc[gw].kind != CG_L_ALIAS && c->pl.nc[gw].leader == gw && !scode(c, gw) && c->gelu_of[gw] < 0 &&
          c->bgrad_of[gw] < 0 && cg_root(&c->pl, nd(c, gw)->in[0]) == dy && scode(c, nd(c, gw)->in[0]) == scode(c, n->in[0]))
        host = gw;
    }
    if (host < 0) continue;
    c->bgrad_of[host] = i, c->bgrad_host[i] = host, c->acc_done[c->acc_of[i]] = true;
    if (numel(x) > c->colsum_cols) c->colsum_cols = numel(x);
  }
}

/* Logits in padded rows (llm.c pads GPT-2's vocab 50257 to 50304 for the same reason): a matmul
 * output whose rows are not a multiple of 16 bytes long (an odd vocab's logits) keeps cuBLASLt off
 * its fast kernels (TMA and 16-byte vector loads need 16-byte aligned rows) in all three GEMMs that
 * touch it. When such an output L is read only by a cross_entropy (whole rows, not vocab-parallel)
 * and the gradients, and its gradient dL only by L's matmul gradients (plain GEMMs), L and dL get
 * rows of a pitch rounded up to 128 bytes: the forward GEMM writes L's rows at that pitch
 * (gemm_ld's ldc), cross_entropy reads and writes at it (the _ld launchers), and the backward GEMMs
 * read dL at it (lda, ldb). The padding is never read or written. Decided before the memory plan
 * (sbytes). */
static void find_pitched(Cu *c) {
  const Graph *g = c->g;
  c->pitch = cp_alloc(sizeof(int64_t) * (size_t)(g->n + 1));
  for (int l = 0; l < g->n; l++) {
    const Node *ln = nd(c, l);
    CgMm mm;
    if (ln->op != OP_MATMUL || ln->role != ROLE_FWD || !cg_executed(ln) || !alone(c, l) || c->pl.nc[l].kind != CG_L_WORK ||
        c->pl.nc[l].leader != l || c->ep_of[l] >= 0 || !cg_mm_dims(g, ln, &mm) || ln->dtype != DT_F32 || l == g->loss)
      continue;
    int64_t es = scode(c, l) ? 2 : 4, align = 128 / es;
    if (mm.n * es % 16 == 0 || (mm.nb > 1 && mm.sc != mm.m * mm.n)) continue;
    int ce = -1;
    for (int j = 0; j < g->n; j++)
      if (nd(c, j)->op == OP_CROSS_ENTROPY && nd(c, j)->in[0] == l) ce = ce < 0 ? j : -2;
    if (ce < 0 || nd(c, ce)->ia[0] != 0 || !cg_executed(nd(c, ce))) continue;
    int dl = grad_of(c, ce, 0), g0 = grad_of(c, l, 0), g1 = grad_of(c, l, 1);
    if (is_metric(g, l) || !read_only_by(c, l, (int[]){ce, dl, g0, g1}, 4)) continue;
    bool ok = true;
    if (dl >= 0) {
      ok = cg_executed(nd(c, dl)) && alone(c, dl) && c->pl.nc[dl].kind == CG_L_WORK && c->pl.nc[dl].leader == dl &&
           c->acc_of[dl] < 0 && scode(c, dl) == scode(c, l) && read_only_by(c, dl, (int[]){g0, g1}, 2);
      for (int k = 0; k < 2 && ok; k++) {
        int gk = k ? g1 : g0;
        ok = gk < 0 || (nd(c, gk)->in[0] == dl && c->gelu_of[gk] < 0 && c->bgrad_of[gk] < 0 && alone(c, gk));
      }
    }
    if (!ok) continue;
    c->pitch[l] = (mm.n + align - 1) / align * align;
    if (dl >= 0) c->pitch[dl] = c->pitch[l];
  }
}

/* Weight gradients written transposed: for x @ transpose(W) with the transpose virtual (the GEMM
 * reads W transposed; GPT-2's tied head, logits = x @ wte^T), the gradient of transpose(W), dB =
 * x^T @ dY [C, V], was written by its GEMM and transposed back into W's [V, C] by cps_transpose.
 * When the transpose's GRAD tg is dB's only reader, dB's GEMM computes dB^T = dY^T @ x straight
 * into tg's buffer (dB becomes a view of it, computed at dB's place) and tg launches nothing: one
 * kernel, and a [V, C] pass of reads and writes, fewer; the GEMM's output rows are C long (an odd V
 * made them unaligned). Decided before the memory plan. */
static void find_tgrads(Cu *c) {
  const Graph *g = c->g;
  c->tgrad_of = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  c->tgrad_skip = cp_alloc(sizeof(bool) * (size_t)(g->n + 1));
  for (int i = 0; i <= g->n; i++) c->tgrad_of[i] = -1;
  for (int tg = 0; tg < g->n; tg++) {
    const Node *tn = nd(c, tg);
    if (tn->op != OP_GRAD || !cg_executed(tn) || !alone(c, tg) || c->pl.nc[tg].kind != CG_L_WORK ||
        c->pl.nc[tg].leader != tg)
      continue;
    int t = tn->fwd, db = tn->in[0];
    const Node *t_n = nd(c, t), *dbn = nd(c, db);
    if (t_n->op != OP_TRANSPOSE || t_n->shape.rank != 2 || !c->pl.nc[t].trans || dbn->op != OP_GRAD || dbn->ia[0] != 1 ||
        nd(c, dbn->fwd)->op != OP_MATMUL || nd(c, dbn->fwd)->in[1] != t)
      continue;
    if (!cg_executed(dbn) || !alone(c, db) || c->pl.nc[db].kind != CG_L_WORK || c->pl.nc[db].leader != db ||
        c->reader[db] != tg || c->acc_of[db] >= 0 || c->bgrad_of[db] >= 0 || c->pitch[db] || scode(c, db) != scode(c, tg))
      continue;
    c->tgrad_of[db] = tg, c->tgrad_skip[tg] = true;
    c->pl.nc[db].kind = CG_L_ALIAS, c->pl.nc[db].alias = tg, c->pl.nc[tg].leader = db;
  }
}

/* Cross-entropy forward and backward in one launch (llm.c's fused classifier): when the loss
 * gradient dy of a cross_entropy is known before the forward (a constant seed, or f16's scaled seed)
 * and its logits L, a matmul's output, are read only by it and the gradients (the matmul's do not
 * read L), the training forward writes L's gradient dL over L as it computes the loss
 * (cplan_cuda_cross_entropy_fused_ld): the logits are read once, and dL, a view of L, needs no
 * buffer (GPT-2: 1.6 GB read and 1.6 GB of arena fewer). Evaluation runs the plain forward. Not under
 * pipeline parallelism. Decided before the memory plan. */
static void find_ce_fused(Cu *c) {
  const Graph *g = c->g;
  c->ce_fused = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i <= g->n; i++) c->ce_fused[i] = -1;
  if (c->pipe) return;
  for (int ce = 0; ce < g->n; ce++) {
    const Node *cn = nd(c, ce);
    if (cn->op != OP_CROSS_ENTROPY || cn->role != ROLE_FWD || cn->ia[0] != 0 || !cg_executed(cn) || !alone(c, ce))
      continue;
    int l = cn->in[0], dl = grad_of(c, ce, 0);
    if (dl < 0 || nd(c, l)->op != OP_MATMUL || c->pl.nc[l].kind != CG_L_WORK || c->pl.nc[l].leader != l || !alone(c, l))
      continue;
    const Node *dn = nd(c, dl);
    int dy = cg_root(&c->pl, dn->in[0]);
    bool early = dy == c->seed || c->pl.nc[dy].kind == CG_L_CONST;
    if (!early || is_metric(g, l) || l == g->loss || !cg_executed(dn) || !alone(c, dl) || c->pl.nc[dl].kind != CG_L_WORK ||
        c->pl.nc[dl].leader != dl || c->acc_of[dl] >= 0 || scode(c, dl) != scode(c, l) || c->pitch[dl] != c->pitch[l] ||
        !read_only_by(c, l, (int[]){ce, dl, grad_of(c, l, 0), grad_of(c, l, 1)}, 4))
      continue;
    c->ce_fused[ce] = dl, c->ce_fused[dl] = ce;
    c->pl.nc[dl].kind = CG_L_ALIAS, c->pl.nc[dl].alias = l;
  }
}

/* A residual add and the norm of its sum in one launch (llm.c's fused residual): a forward add
 * A = a + b of two tensors of its own shape, computed alone, whose sum a layernorm or rmsnorm N
 * normalizes, and which nothing reads before N, is computed by N's launch (the _res launchers:
 * the sum written as the add would store it, then normalized from cache): one launch and one read
 * of the sum fewer (GPT-2: 24 of its 25 residual adds). A's leader becomes N, so its inputs live
 * until N. Decided before the memory plan. */
static void find_res_norms(Cu *c) {
  const Graph *g = c->g;
  c->res_of = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  c->res_skip = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i <= g->n; i++) c->res_of[i] = c->res_skip[i] = -1;
  Views views = index_views(c);
  for (int nn = 0; nn < g->n; nn++) {
    const Node *n = nd(c, nn);
    if ((n->op != OP_LAYER_NORM && n->op != OP_RMS_NORM) || n->role != ROLE_FWD || !cg_executed(n) || !alone(c, nn) ||
        c->pl.nc[nn].kind != CG_L_WORK || c->pl.nc[nn].leader != nn)
      continue;
    int a = n->in[0];
    const Node *an = nd(c, a);
    if (an->op != OP_ADD || an->role != ROLE_FWD || !cg_executed(an) || !alone(c, a) || c->pl.nc[a].kind != CG_L_WORK ||
        c->pl.nc[a].leader != a || c->ep_done[a] || c->add_skip[a] || c->qkv[a] || c->qkv_skip[a] || c->att_skip[a] >= 0 ||
        an->in[0] == an->in[1] || an->dtype != DT_F32 || a == g->loss || scode(c, a) != scode(c, nn))
      continue;
    bool ok = true;
    for (int k = 0; k < 2 && ok; k++) {
      const Node *x = nd(c, an->in[k]);
      ok = x->dtype == DT_F32 && shape_eq(&x->shape, &an->shape) && scode(c, an->in[k]) == scode(c, a);
    }
    ok = ok && !is_metric(g, a) && !root_read(c, &views, a, nn, nn, -1); /* nothing reads the sum before the norm's launch */
    if (!ok) continue;
    c->res_of[nn] = a, c->res_skip[a] = nn, c->pl.nc[a].leader = nn;
  }
}

/* Whether GRAD v's emitter honors acc_of (adds into the accumulator itself): a matmul's gradient (a
 * GEMM with beta 1), a transpose's gradient written by such a GEMM (find_tgrads), an embedding
 * table's gradient (the kernel adds). */
static bool adds_into_acc(const Cu *c, int v) {
  const Node *n = nd(c, v);
  if (n->op != OP_GRAD || !cg_executed(n) || c->pl.nc[v].kind != CG_L_WORK) return false;
  if (c->tgrad_skip[v]) return true; /* its leader is the GEMM */
  const Node *f = nd(c, n->fwd);
  if (c->pl.nc[v].leader != v) return false;
  if (f->op == OP_MATMUL) return c->tgrad_of[v] < 0 && c->bgrad_of[v] < 0 && c->gelu_of[v] < 0 && !c->pitch[v];
  return f->op == OP_EMBEDDING && n->ia[0] == 0 && f->ia[0] == 0;
}

/* A weight used twice, as a tied head and embedding (GPT-2's wte): its gradient is the add of two
 * gradients, the accum's one input, each read only by the add. When both emitters can add into the
 * accumulator (adds_into_acc), both do, and neither the add nor the accum launches anything: the
 * [V, C] zeroing, add and accumulation passes go. Decided before the memory plan (the add's buffer
 * is left unused). */
static void find_accum_adds(Cu *c) {
  const Graph *g = c->g;
  c->acc_add = cp_alloc(sizeof(bool) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) {
    const Node *a = nd(c, i);
    if (a->op != OP_ACCUM || a->role == ROLE_UPD || scode(c, a->in[0])) continue;
    int s = a->in[1];
    const Node *sn = nd(c, s);
    if (sn->op != OP_ADD || c->reader[s] != i || !alone(c, s) || c->pl.nc[s].kind != CG_L_WORK || c->add_skip[s] ||
        c->ep_done[s] || sn->in[0] == sn->in[1] || scode(c, s) || numel(sn) != numel(nd(c, a->in[0])))
      continue;
    bool ok = true;
    for (int k = 0; k < 2 && ok; k++) {
      int v = sn->in[k];
      ok = c->reader[v] == s && c->acc_of[v] < 0 && !scode(c, v) && shape_eq(&nd(c, v)->shape, &sn->shape) &&
           adds_into_acc(c, v);
    }
    if (!ok) continue;
    c->acc_of[sn->in[0]] = c->acc_of[sn->in[1]] = i, c->acc_add[s] = true;
  }
}

/* The arguments the bias-gradient GEMMs add to theirs: the accumulator of bias gradient db, its
 * storage codes (it, dy), dy's rows and the sign (a sub's second input: -1). */
static const char *bgrad_args(Cu *c, int db) {
  const Node *n = nd(c, db), *f = nd(c, n->fwd), *x = nd(c, f->in[n->ia[0]]);
  int a = c->acc_of[db];
  EMIT("  /* and the bias gradient %%%d into the accumulator %s (the accum %%%d): cuBLASLt's bias-gradient epilogue */\n",
       db, nd(c, nd(c, a)->in[0])->name, a);
  /* the step's first micro-batch writes the sums straight into the accumulator (bgrad_dst); not
   * under pp, whose stages run micro-batches' backwards in their schedule's order */
  return cp_fmt("%s, %d, %lldLL, %s, %s", ptr(c, nd(c, a)->in[0]), scode(c, db) | rcode(c, n->in[0]) << 2,
                (long long)(numel(f) / numel(x)), f->op == OP_SUB && n->ia[0] == 1 ? "-1.0f" : "1.0f",
                c->pipe ? "0" : "run->micro_index == 0");
}

/* keep mask of dropout node f (the stream emit_c.c's dropout_mask draws) into mask */
static void emit_mask(Cu *c, int f, const char *mask, int node) {
  const Node *n = nd(c, f);
  const char *l, *w, *o;
  cg_dropout_map(n, n->ia[3] > 0 ? c->sp->axes[n->ia[3] - 1].n : 1, &l, &w, &o);
  EMIT("  { uint64_t s1 = rt_splitmix64(rt_splitmix64((uint64_t)cplan_plan.seed) ^ rt_splitmix64(0x%016llxULL ^ "
       "rt_splitmix64((uint64_t)run->step)));\n",
       (unsigned long long)cg_dropout_key(c->g, f));
  EMIT("    CpsIdx m = {%d, %s, %s, %s};\n", n->shape.rank, l, w, o);
  EMIT("    lk(%d, %lldLL, (void *[]){%s, %s, &(double){%.17g}, &s1, &m}, %d); } /* cps_dropout_mask */\n",
       kid(c, "cps_dropout_mask"), (long long)numel(n), ap(mask), al(numel(n)), n->fa[0], node);
}

static void emit_dropout(Cu *c, int i) {
  const Node *n = nd(c, i);
  bool off = c->ph == CG_PH_EVAL || n->fa[0] == 0;
  const char *mask = off ? "NULL" : scratch_ptr(c, i, "B");
  if (!off) emit_mask(c, i, mask, i);
  const char *args[7] = {ai(0), ai(tcodes(c, 2, (int[]){i, n->in[0]})), ap(ptr(c, i)), ap(ptr(c, n->in[0])), ap(mask),
                         al(numel(n)), af(n->fa[0])};
  emit_lk(c, "cps_dropout", numel(n), i, 7, args);
}

/* the `tt` of a shape kernel moving node x's elements into node i's (cps_mv): an i32 is code 3 */
static int move_codes(const Cu *c, int i, int x) {
  return nd(c, i)->dtype == DT_I32 ? 3 | 3 << 2 : tcodes(c, 2, (int[]){i, x});
}

static void emit_shape_op(Cu *c, int i) {
  const Node *n = nd(c, i), *x = in(c, i, 0);
  const int64_t *d = x->shape.d;
  int r = x->shape.rank;
  if (x->dtype != DT_F32 && x->dtype != DT_I32) {
    unsupported(c, i, cp_fmt("%s of a %s tensor", ir_ops[n->op].name, dtype_name(x->dtype)));
    return;
  }
  const char *o = ap(ptr(c, i)), *xp = ap(ptr(c, n->in[0])), *tt = ai(move_codes(c, i, n->in[0]));
  switch (n->op) {
  case OP_TRANSPOSE: {
    const char *args[6] = {tt, o, xp, al(cg_dims_prod(&x->shape, 0, r - 2)), al(d[r - 2]), al(d[r - 1])};
    emit_lk(c, "cps_transpose", numel(n), i, 6, args);
    break;
  }
  case OP_PERMUTE: {
    int64_t xs[CP_MAX_RANK], on[CP_MAX_RANK], st[CP_MAX_RANK], s = 1;
    for (int k = r - 1; k >= 0; k--) st[k] = s, s *= d[k];
    for (int k = 0; k < n->ndims; k++) on[k] = d[n->dims[k]], xs[k] = st[n->dims[k]];
    const char *p = cp_fmt("&(CpsPerm){%d, %s, %s}", n->ndims, ll_list(on, n->ndims), ll_list(xs, n->ndims));
    const char *args[6] = {ai(0), tt, o, xp, p, al(numel(n))};
    emit_lk(c, "cps_permute", numel(n), i, 6, args);
    break;
  }
  case OP_SLICE: {
    int ax = (int)n->ia[0];
    const char *args[9] = {ai(0), tt, o, xp, al(cg_dims_prod(&x->shape, 0, ax)), al(d[ax]),
                           al(cg_dims_prod(&x->shape, ax + 1, r)), al(n->ia[1]), al(n->ia[2])};
    emit_lk(c, "cps_slice", numel(n), i, 9, args);
    break;
  }
  case OP_SPLIT_HEADS: case OP_MERGE_HEADS: {
    bool merge = n->op == OP_MERGE_HEADS; /* merge: x [b, h, t, dh] */
    const char *args[8] = {ai(merge), tt, o, xp, al(d[0]), al(merge ? d[2] : d[1]), al(merge ? d[1] * d[3] : d[2]),
                           al(merge ? d[1] : n->ia[0])};
    emit_lk(c, "cps_heads", numel(n), i, 8, args);
    break;
  }
  default: cp_unreachable();
  }
}

static void emit_concat(Cu *c, int i) {
  const Node *n = nd(c, i);
  int ax = (int)n->ia[0];
  int64_t start = 0, outer = cg_dims_prod(&n->shape, 0, ax), inner = cg_dims_prod(&n->shape, ax + 1, n->shape.rank);
  for (int k = 0; k < n->nin; k++) {
    const Node *x = in(c, i, k);
    if ((x->dtype == DT_I32) != (n->dtype == DT_I32)) {
      unsupported(c, i, "concat mixing i32 and float tensors");
      diag_hint("convert the i32 operands first: float(x)");
      return;
    }
    if (x->dtype != DT_F32 && x->dtype != DT_I32) {
      unsupported(c, i, cp_fmt("concat of a %s tensor", dtype_name(x->dtype)));
      return;
    }
    int64_t len = x->shape.d[ax];
    const char *args[8] = {ai(move_codes(c, i, n->in[k])), ap(ptr(c, i)), ap(ptr(c, n->in[k])), al(outer),
                           al(n->shape.d[ax]), al(inner), al(start), al(len)};
    emit_lk(c, "cps_place", numel(x), i, 8, args);
    start += len;
  }
}

/* ---- a lowered plan's collectives (lower.h) ---------------------------------------------------- */

/* The RtNcclType of node i's buffer: i32, or its storage type (f32, bf16, f16). */
static const char *coll_type(const Cu *c, int i) {
  static const char *const t[] = {"RT_NCCL_F32", "RT_NCCL_BF16", "RT_NCCL_F16"};
  return nd(c, i)->dtype == DT_I32 ? "RT_NCCL_I32" : t[scode(c, i)];
}

static int64_t elem_bytes(const Cu *c, int i) { return nd(c, i)->dtype == DT_I32 ? 4 : scode(c, i) ? 2 : 4; }

/* The [outer, n * part, inner] view of a value split along dim d in n parts: outer and the
 * elements of one rank's part (part * inner) per outer index (emit_c.c's split_view). */
static void split_view(const Shape *whole, int d, int64_t n, int64_t *outer, int64_t *piece) {
  *outer = cg_dims_prod(whole, 0, d);
  *piece = whole->d[d] / n * cg_dims_prod(whole, d + 1, whole->rank);
}

/* dst [outer, k, piece] <- src [k, outer, piece] (gather), or dst [k, outer, piece] <- src
 * [outer, k, piece]: one 2D copy per block of es-byte elements */
static void emit_blocks(Cu *c, bool gather, const char *dst, const char *src, int64_t outer, int64_t k, int64_t piece,
                        int64_t es) {
  for (int64_t r = 0; r < k; r++) {
    int64_t blk = r * outer * piece * es, col = r * piece * es;
    EMIT("  CU(cudaMemcpy2DAsync((char *)%s + %lld, %lld, (const char *)%s + %lld, %lld, %lld, %lld, "
         "cudaMemcpyDeviceToDevice, G.s));\n", dst, (long long)(gather ? col : blk), (long long)((gather ? k : 1) * piece * es),
         src, (long long)(gather ? blk : col), (long long)((gather ? 1 : k) * piece * es), (long long)(piece * es),
         (long long)outer);
  }
}

/* The copies of b (cg_all_to_all_blocks), elements of es bytes, on the stream. */
static void emit_block_copies(Cu *c, const char *dst, const char *src, const CgBlocks *b, int64_t es) {
  for (int64_t r = 0; r < b->k; r++)
    EMIT("  CU(cudaMemcpy2DAsync((char *)%s + %lld, %lld, (const char *)%s + %lld, %lld, %lld, %lld, "
         "cudaMemcpyDeviceToDevice, G.s));\n", dst, (long long)(r * b->dst_step * es), (long long)(b->dst_pitch * es), src,
         (long long)(r * b->src_step * es), (long long)(b->src_pitch * es), (long long)(b->width * es), (long long)b->rows);
}

/* One collective node on its axis group (coll_* of emit_cu_support.h: NCCL, or MPI through the
 * host). The result has its own buffer, as the GRADs may still read the input. */
static void emit_collective(Cu *c, int i) {
  const Node *n = nd(c, i), *x = in(c, i, 0);
  int a = (int)n->ia[0], d = (int)n->ia[1];
  int64_t k = n->ia[3], outer, piece, es = elem_bytes(c, i);
  const char *o = ptr(c, i), *src = ptr(c, n->in[0]), *tmp = scratch_ptr(c, i, "B");
  if (x->dtype != DT_F32 && x->dtype != DT_I32) {
    unsupported(c, i, "a collective of a tensor of this dtype");
    return;
  }
  if (scode(c, n->in[0]) != scode(c, i)) { /* decide_storage keeps both sides in one type (mark_pg) */
    unsupported(c, i, "a collective whose input and result are stored in different types");
    return;
  }
  switch (n->op) {
  case OP_ALL_REDUCE:
    EMIT("  CU(cudaMemcpyAsync(%s, %s, %lld, cudaMemcpyDeviceToDevice, G.s));\n", o, src, (long long)sbytes(c, i));
    EMIT("  coll_all_reduce(run, %d, %s, %lldLL, %s);\n", a, o, (long long)numel(n), coll_type(c, i));
    break;
  case OP_ALL_GATHER: /* gathered [k, outer, piece] -> out [outer, k, piece] */
    split_view(&n->shape, d, k, &outer, &piece);
    EMIT("  coll_all_gather(run, %d, %s, %s, %lldLL, %s);\n", a, src, outer == 1 ? o : tmp, (long long)numel(x),
         coll_type(c, i));
    if (outer > 1) emit_blocks(c, true, o, tmp, outer, k, piece, es);
    break;
  case OP_REDUCE_SCATTER: /* x [outer, k, piece] -> blocks [k, outer, piece], this rank's summed */
    split_view(&x->shape, d, k, &outer, &piece);
    if (outer > 1) emit_blocks(c, false, tmp, src, outer, k, piece, es);
    EMIT("  coll_reduce_scatter(run, %d, %s, %s, %lldLL, %s);\n", a, outer == 1 ? src : tmp, o, (long long)numel(n),
         coll_type(c, i));
    break;
  case OP_ALL_TO_ALL: { /* S(d1) -> S(d2): block r of the input along d2 to rank r, rank r's block along d1 */
    CgBlocks pack, unpack;
    cg_all_to_all_blocks(n, x, &pack, &unpack);
    const char *rcv = cp_fmt("((char *)%s + %lld)", tmp, (long long)(numel(x) * es));
    emit_block_copies(c, tmp, src, &pack, es);
    EMIT("  coll_all_to_all(run, %d, %s, %s, %lldLL, %s);\n", a, tmp, rcv, (long long)(numel(x) / k), coll_type(c, i));
    emit_block_copies(c, o, rcv, &unpack, es);
    break;
  }
  case OP_SHARD_SLICE: /* x [outer, k, piece] -> out [outer, piece]: block axis_coord[a] */
    split_view(&x->shape, d, k, &outer, &piece);
    EMIT("  CU(cudaMemcpy2DAsync(%s, %lld, (const char *)%s + run->axis_coord[%d] * %lldLL, %lld, %lld, %lld, "
         "cudaMemcpyDeviceToDevice, G.s));\n", o, (long long)(piece * es), src, a, (long long)(piece * es),
         (long long)(k * piece * es), (long long)(piece * es), (long long)outer);
    break;
  default: cp_unreachable();
  }
}

/* A crossing between pipeline stages (pipeline.h) on the pp group, whose rank is the stage mod
 * the pp degree: pp_send / pp_recv of emit_cu_support.h (through pinned host memory and MPI; the
 * send does not wait for the receiver, the receive does). The value crosses in its sender's
 * storage type; a receiver that stores it in another casts it. */
static void emit_pp(Cu *c, int i) {
  const Node *n = nd(c, i);
  int x = n->op == OP_PP_SEND ? n->in[0] : i, tag = (int)n->ia[1];
  if (nd(c, x)->dtype != DT_F32 && nd(c, x)->dtype != DT_I32) {
    unsupported(c, i, "a pipeline crossing of this dtype");
    return;
  }
  if (tag >= wire_type.n || !wire_type.a[tag] || (n->op == OP_PP_SEND && strcmp(wire_type.a[tag], coll_type(c, x)) != 0))
    cp_panic(__FILE__, __LINE__, "crossing %d: the sender's type is not the one recorded", tag);
  int peer = (int)n->ia[0] % c->pipe->devices; /* the device of that stage */
  if (n->op == OP_PP_SEND)
    EMIT("  pp_send(run, %d, %s, %lldLL, %s, %d, %d); /* to stage %d */\n", c->ppa, ptr(c, x), (long long)numel(nd(c, x)),
         coll_type(c, x), peer, tag, (int)n->ia[0]);
  else
    EMIT("  pp_recv(run, %d, %s, %lldLL, %s, %s, %d, %d); /* from stage %d */\n", c->ppa, ptr(c, x),
         (long long)numel(nd(c, x)), coll_type(c, x), wire_type.a[tag], peer, tag, (int)n->ia[0]);
}

/* Records which crossings c's stage receives as part of a param gradient (wire_f32) and the type
 * each of its PP_SENDs sends in (wire_type). */
static void record_wire_types(const Cu *c) {
  for (int i = 0; i < c->g->n; i++) {
    const Node *n = nd(c, i);
    if (n->op != OP_PP_SEND && n->op != OP_PP_RECV) continue;
    int tag = (int)n->ia[1];
    while (wire_type.n <= tag) VEC_PUSH(wire_type, (const char *)NULL);
    while (wire_f32.n <= tag) VEC_PUSH(wire_f32, false);
    if (n->op == OP_PP_SEND) wire_type.a[tag] = coll_type(c, n->in[0]);
    else if (c->pg[i]) wire_f32.a[tag] = true;
  }
}

#define KL(...) EMIT("  kl_check(" __VA_ARGS__)

static const char *kdt(const Cu *c) { return c->lpc == 1 ? "CPLAN_BF16" : c->lpc == 2 ? "CPLAN_F16" : "CPLAN_F32"; }

/* The vocab-parallel cross entropy (kernels/cpu/vocab_parallel.h: the exchange sequence) on
 * kernels/cuda vocab_parallel.cu: the global row max m and sum of exponentials s stay in aux (then
 * the counted rows) for the backward; the result is this rank's part of the loss (P). */
/* cross_entropy's weight over the step's targets (RtRun.ce_weight, docs/language.md Batches): with
 * f the forward node, *out = *in times it, launched only when it is not 1 (one micro-batch a step and
 * rank: never) */
static void emit_ce_scale(Cu *c, const Node *f, const char *out, const char *in, int i) {
  if (f->ia[2] <= 0) return;
  EMIT("  if (%s != 1.0f)", cg_ce_weight(f));
  KL("cplan_cuda_cross_entropy_scale(%s, %s, %s, G.s), %d);\n", out, in, cg_ce_weight(f), i);
}

/* the loss gradient a cross_entropy's backward reads: dy, or dy times the weight in tmp (emit_ce_scale) */
static const char *ce_dy(Cu *c, const Node *f, const char *dy, const char *tmp, int i) {
  if (f->ia[2] <= 0) return dy;
  emit_ce_scale(c, f, tmp, dy, i);
  return cp_fmt("(%s != 1.0f ? %s : %s)", cg_ce_weight(f), tmp, dy);
}

static void emit_vocab_ce(Cu *c, int i) {
  const Node *n = nd(c, i), *lg = in(c, i, 0);
  int a = (int)n->ia[0] - 1;
  int64_t rows = cg_rows(lg), vl = cg_last_dim(lg), k = c->sp->axes[a].n;
  const char *m = aux_ptr(c, i, 0), *sx = aux_ptr(c, i, rows), *cnt = aux_ptr(c, i, 2 * rows), *l = ptr(c, n->in[0]);
  const char *tmp = scratch_ptr(c, i, "F");
  KL("cplan_cuda_vp_ce_row_max(%s, %s, %s, %lld, %lld, G.s), %d);\n", kdt(c), m, l, (long long)rows, (long long)vl, i);
  EMIT("  coll_all_gather(run, %d, %s, %s, %lldLL, RT_NCCL_F32);\n", a, m, tmp, (long long)rows);
  KL("cplan_cuda_vp_ce_max_combine(%s, %s, %lld, %lld, G.s), %d);\n", m, tmp, (long long)rows, (long long)k, i);
  KL("cplan_cuda_vp_ce_row_sumexp(%s, %s, %s, %s, %lld, %lld, G.s), %d);\n", kdt(c), sx, l, m, (long long)rows,
     (long long)vl, i);
  EMIT("  coll_all_reduce(run, %d, %s, %lldLL, RT_NCCL_F32);\n", a, sx, (long long)rows);
  KL("cplan_cuda_vp_ce_forward_part(%s, %s, (int *)%s, %s, %s, %s, %s, %lld, %lld, (int)run->axis_coord[%d] * %lld, %lld, "
     "run->axis_coord[%d] == 0, G.s), %d);\n", kdt(c), ptr(c, i), cnt, l, m, sx, ptr(c, n->in[1]), (long long)rows,
     (long long)vl, a, (long long)vl, (long long)cg_index_bound(n, vl * k), a, i);
  emit_ce_scale(c, n, ptr(c, i), ptr(c, i), i);
}

/* The vocab-parallel argmax of the last dim (kernels/cpu/vocab_parallel.h) on kernels/cuda
 * vocab_parallel.cu: the ranks' row maxima and their global indices all-gathered (two floats per
 * row); the result is whole (R). The logits are read in their storage type. */
static void emit_vocab_argmax(Cu *c, int i) {
  const Node *n = nd(c, i), *lg = in(c, i, 0);
  int a = (int)n->ia[1] - 1, code = rcode(c, n->in[0]);
  int64_t rows = cg_rows(lg), vl = cg_last_dim(lg), k = c->sp->axes[a].n, off = c->pl.nc[i].soff[c->ph];
  if (vl * k > (1 << 24)) {
    unsupported(c, i, "a vocab-parallel argmax over more than 2^24 columns (its indices travel as floats)");
    return;
  }
  const char *pair = cp_fmt("F(%lld)", (long long)off), *gat = cp_fmt("F(%lld)", (long long)(off + 2 * rows * 4));
  KL("cplan_cuda_vp_argmax_local(%s, %s, %s, %lld, %lld, (int)run->axis_coord[%d] * %lld, G.s), %d);\n",
     code == 1 ? "CPLAN_BF16" : code == 2 ? "CPLAN_F16" : "CPLAN_F32", pair, ptr(c, n->in[0]), (long long)rows,
     (long long)vl, a, (long long)vl, i);
  EMIT("  coll_all_gather(run, %d, %s, %s, %lldLL, RT_NCCL_F32);\n", a, pair, gat, (long long)(2 * rows));
  KL("cplan_cuda_vp_argmax_combine((int32_t *)%s, %s, %lld, %lld, G.s), %d);\n", ptr(c, i), gat, (long long)rows,
     (long long)k, i);
}

/* kernels/cuda takes its tensors in one storage type: under bf16 / f16 the operands it reads are
 * low or cast (low_reads), and what it writes must be stored low */
static bool hw_typed(Cu *c, int node, int n, const int *ops) {
  for (int k = 0; k < n; k++)
    if (ops[k] >= 0 && nd(c, ops[k])->dtype != DT_I32 && rcode(c, ops[k]) != c->lpc)
      return unsupported(c, node, cp_fmt("under precision %s, '%s' writing an f32 tensor (a metric, the loss or part of "
                                         "a param gradient)", c->lpc == 1 ? "bf16" : "f16", ir_ops[nd(c, node)->op].name));
  return true;
}

/* ---- attention's operands, in place or not (find_attn_inplace) ---------------------------------- */

/* the CplanAttnLayout of sdpa s's q, k, v (qkv) or out (!qkv) heads [b, h, t, dh]: in place in a
 * [b, t, 3C] projection or [b, t, C] merge when `inplace`, else contiguous */
static const char *att_layout(const Cu *c, int s, bool inplace, int qkv) {
  const int64_t *q = nd(c, nd(c, s)->in[0])->shape.d; /* [b, h, t, dh] */
  int64_t h = q[1], t = q[2], dh = q[3], w = (qkv ? 3 : 1) * h * dh;
  if (!inplace) return cp_fmt("(CplanAttnLayout){%lld, 1, %lldLL, 0}", (long long)dh, (long long)(t * dh));
  return cp_fmt("(CplanAttnLayout){%lld, %lld, %lldLL, %lld}", (long long)w, (long long)h, (long long)(t * w), (long long)dh);
}

typedef struct AttOps {
  const char *p[3]; /* q, k, v (or dq, dk, dv) */
  const char *l;    /* q's layout (and dq's) */
  const char *lkv;  /* k and v's (and dk, dv's) */
  int64_t group;    /* query heads per key/value head (grouped-query attention) */
} AttOps;

/* q, k and v of sdpa s (its heads nodes hq[0..3)), or with base >= 0 the thirds of base's [b, t, 3C]
 * (find_attn_inplace takes no grouped-query or cross-attention in place). Grouped-query k and v
 * [b, hk, tk, dh], or keys of another length (cross-attention), have layouts of their own, so both
 * name their heads, as under a key mask. */
static AttOps att_ops(const Cu *c, int s, const int *hq, int base) {
  AttOps a;
  const int64_t *q = nd(c, nd(c, s)->in[0])->shape.d, *k = nd(c, nd(c, s)->in[1])->shape.d;
  for (int p = 0; p < 3; p++)
    a.p[p] = base < 0 ? ptr(c, hq[p])
                      : cp_fmt("(void *)((char *)%s + %lld)", ptr(c, base),
                               (long long)(p * q[1] * q[3] * (scode(c, base) ? 2 : 4)));
  a.group = q[1] / k[1];
  a.l = a.lkv = att_layout(c, s, base >= 0, 1);
  /* a key mask is read per sample, b = z / lq.heads: q's layout names its heads */
  if (a.group > 1 || k[2] != q[2] || (nd(c, s)->nin == 4 && base < 0)) {
    int64_t dh = q[3];
    a.l = cp_fmt("(CplanAttnLayout){%lld, %lld, %lldLL, %lldLL}", (long long)dh, (long long)q[1],
                 (long long)(q[1] * q[2] * dh), (long long)(q[2] * dh));
    a.lkv = cp_fmt("(CplanAttnLayout){%lld, %lld, %lldLL, %lldLL}", (long long)dh, (long long)k[1],
                   (long long)(k[1] * k[2] * dh), (long long)(k[2] * dh));
  }
  return a;
}

static void emit_nn(Cu *c, int i) {
  const Node *n = nd(c, i);
  const char *o = ptr(c, i), *x = ptr(c, n->in[0]);
  int64_t rows = cg_rows(n), cc = cg_last_dim(n);
  bool ev = c->ph == CG_PH_EVAL;
  switch (n->op) {
  case OP_SOFTMAX:
  case OP_LOG_SOFTMAX:
    if (n->ia[0] != n->shape.rank - 1) {
      unsupported(c, i, "softmax over an axis other than the last");
      return;
    }
    if (n->op == OP_SOFTMAX) {
      if (!hw_typed(c, i, 2, (int[]){i, n->in[0]})) return;
      KL("cplan_cuda_%ssoftmax_forward(%s, %s, %s, %lld, %lld, G.s), %d);\n", n->ia[1] ? "safe_" : "", kdt(c), o, x,
         (long long)rows, (long long)cc, i);
    } else {
      const char *args[5] = {ai(tcodes(c, 2, (int[]){i, n->in[0]})), ap(o), ap(x), al(rows), al(cc)};
      emit_lrow(c, "cps_log_softmax", rows, i, 5, args);
    }
    break;
  case OP_LAYER_NORM:
    if (!hw_typed(c, i, 4, (int[]){i, n->in[0], n->in[1], n->in[2]})) return;
    if (c->res_of[i] >= 0) { /* and the residual add it reads (find_res_norms) */
      const Node *a = nd(c, c->res_of[i]);
      KL("cplan_cuda_layernorm_forward_res(%s, %s, %s, %s, %s, %s, %s, %s, %s, %lld, %lld, %s, G.s), %d);\n", kdt(c), o,
         x, ev ? "NULL" : aux_ptr(c, i, 0), ev ? "NULL" : aux_ptr(c, i, rows), ptr(c, a->in[0]), ptr(c, a->in[1]),
         ptr(c, n->in[1]), ptr(c, n->in[2]), (long long)rows, (long long)cc, cg_flt(n->fa[0]), i);
      break;
    }
    KL("cplan_cuda_layernorm_forward(%s, %s, %s, %s, %s, %s, %s, %lld, %lld, %s, G.s), %d);\n", kdt(c), o,
       ev ? "NULL" : aux_ptr(c, i, 0), ev ? "NULL" : aux_ptr(c, i, rows), x, ptr(c, n->in[1]), ptr(c, n->in[2]),
       (long long)rows, (long long)cc, cg_flt(n->fa[0]), i);
    break;
  case OP_RMS_NORM:
    if (!hw_typed(c, i, 3, (int[]){i, n->in[0], n->in[1]})) return;
    if (c->res_of[i] >= 0) { /* and the residual add it reads (find_res_norms) */
      const Node *a = nd(c, c->res_of[i]);
      KL("cplan_cuda_rmsnorm_forward_res(%s, %s, %s, %s, %s, %s, %s, %lld, %lld, %s, G.s), %d);\n", kdt(c), o, x,
         ev ? "NULL" : aux_ptr(c, i, 0), ptr(c, a->in[0]), ptr(c, a->in[1]), ptr(c, n->in[1]), (long long)rows,
         (long long)cc, cg_flt(n->fa[0]), i);
      break;
    }
    KL("cplan_cuda_rmsnorm_forward(%s, %s, %s, %s, %s, %lld, %lld, %s, G.s), %d);\n", kdt(c), o,
       ev ? "NULL" : aux_ptr(c, i, 0), x, ptr(c, n->in[1]), (long long)rows, (long long)cc, cg_flt(n->fa[0]), i);
    break;
  case OP_ROPE:
    if (!hw_typed(c, i, 2, (int[]){i, n->in[0]})) return;
    KL("cplan_cuda_rope_forward(%s, %s, %s, %lld, %lld, %lld, %s, G.s), %d);\n", kdt(c), o, x,
       (long long)cg_dims_prod(&n->shape, 0, n->shape.rank - 2), (long long)n->shape.d[n->shape.rank - 2], (long long)cc,
       cg_flt(n->fa[0]), i);
    break;
  case OP_SDPA: {
    const int64_t *q = in(c, i, 0)->shape.d, *k = in(c, i, 1)->shape.d, *v = in(c, i, 2)->shape.d;
    if (v[3] != q[3]) {
      unsupported(c, i, "sdpa with values of another width");
      return;
    }
    if (q[3] > CPLAN_ATTN_MAX_HEAD_DIM) { /* sema computed it in the math form (sema_set_attention_limit) */
      unsupported(c, i, cp_fmt("sdpa with a head width of %lld (the CUDA attention kernel takes at most %d)",
                               (long long)q[3], CPLAN_ATTN_MAX_HEAD_DIM));
      return;
    }
    int km = n->nin == 4 ? n->in[3] : -1; /* the key mask: the _m launcher */
    if (!hw_typed(c, i, 5, (int[]){i, n->in[0], n->in[1], n->in[2], km})) return;
    AttOps a = att_ops(c, i, n->in, c->att_x[i]);
    if (c->att_m[i] >= 0) EMIT("  /* the output merged in place: %%%d */\n", c->att_m[i]);
    KL("cplan_cuda_attention_forward_%s(%s, %s, %s, %s, %s, %s, %s%lld, %lld, %lld, %lld, %d, %lld, %s, %s, %s, G.s), "
       "%d);\n", km >= 0 ? "m" : "l", kdt(c), o, aux_ptr(c, i, 0), a.p[0], a.p[1], a.p[2],
       km >= 0 ? cp_fmt("%s, ", ptr(c, km)) : "", (long long)(q[0] * q[1]), (long long)q[2], (long long)k[2],
       (long long)q[3], (int)n->ia[0], (long long)a.group, a.l, a.lkv, att_layout(c, i, c->att_m[i] >= 0, 0), i);
    break;
  }
  default: cp_unreachable();
  }
}

static void emit_forward(Cu *c, int i) {
  const Node *n = nd(c, i);
  if (cg_forward_skip(c->out, &c->pl, i)) return;
  switch (n->op) {
  case OP_ARANGE: {
    const char *args[2] = {ap(ptr(c, i)), al(n->ia[0])};
    emit_lk(c, "cps_arange", n->ia[0], i, 2, args);
    break;
  }
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MAXIMUM: case OP_MINIMUM: case OP_MOD: case OP_FLOORDIV:
  case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: emit_binary(c, i); break;
  case OP_NEG: case OP_EXP: case OP_LOG: case OP_SQRT: case OP_RSQRT: case OP_TANH: case OP_SIGMOID:
  case OP_RELU: case OP_GELU: case OP_SILU: case OP_SQUARE: case OP_POW: case OP_ABS: case OP_CLAMP_MIN:
  case OP_CLAMP_MAX: case OP_ERF: case OP_SIN: case OP_COS: emit_unary(c, i); break;
  case OP_WHERE: emit_where(c, i); break;
  case OP_SUM: case OP_MEAN: case OP_MAX: emit_reduce(c, i); break;
  case OP_MATMUL: {
    Mm mm;
    if (!mm_setup(c, n, i, &mm)) break;
    cp_assert(rcode(c, n->in[0]) == mm.abt && rcode(c, n->in[1]) == mm.abt);
    int ad = c->ep_of[i];
    if (ad >= 0) {
      const Node *a = nd(c, ad);
      int b = a->in[0] == i ? a->in[1] : a->in[0], gl = c->gelu_of[i];
      cp_assert(!arena_overlap(c, ad, n->in[0]) && !arena_overlap(c, ad, n->in[1]) && !arena_overlap(c, ad, b));
      c->ep_done[ad] = true;
      if (gl >= 0) {
        cp_assert(!arena_overlap(c, gl, n->in[0]) && !arena_overlap(c, gl, n->in[1]) && !arena_overlap(c, gl, ad));
        EMIT("  /* with the bias add %%%d and the gelu %%%d (cuBLASLt's GELU_AUX_BIAS epilogue: the add's value as aux) */\n",
             ad, gl);
        EMIT("  gemm_gelu(%s, %s, %s, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %lldLL, %lldLL, %lldLL, %d, %d, %d);\n",
             ptr(c, gl), ptr(c, ad), mm.a, mm.b, ptr(c, b), (long long)mm.d.nb, (long long)mm.d.m, (long long)mm.d.n,
             (long long)mm.d.k, mm.ta, mm.tb, (long long)mm.d.sa, (long long)mm.d.sb, (long long)mm.d.sc, i, mm.abt,
             scode(c, gl));
        break;
      }
      EMIT("  /* with the bias add %%%d (cuBLASLt's bias epilogue) */\n", ad);
      EMIT("  gemm_bias(%s, %s, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %lldLL, %lldLL, %lldLL, %d, %d, %d);\n", ptr(c, ad),
           mm.a, mm.b, ptr(c, b), (long long)mm.d.nb, (long long)mm.d.m, (long long)mm.d.n, (long long)mm.d.k, mm.ta,
           mm.tb, (long long)mm.d.sa, (long long)mm.d.sb, (long long)mm.d.sc, i, mm.abt, scode(c, ad));
      break;
    }
    emit_gemm(c, ptr(c, i), mm.a, mm.b, mm.d.nb, mm.d.m, mm.d.n, mm.d.k, mm.ta, mm.tb, mm.d.sa, mm.d.sb,
              pstride(c, i, mm.d.m, mm.d.sc), (int64_t[3]){0, 0, c->pitch[i]}, i, mm.abt, scode(c, i), false);
    break;
  }
  case OP_TRANSPOSE: case OP_PERMUTE: case OP_SLICE: case OP_SPLIT_HEADS: case OP_MERGE_HEADS: emit_shape_op(c, i); break;
  case OP_CONCAT: emit_concat(c, i); break;
  case OP_EMBEDDING: {
    const Node *t = in(c, i, 0);
    if (!hw_typed(c, i, 2, (int[]){i, n->in[0]})) break;
    if (n->ia[0] > 0) { /* vocab-parallel: this rank's rows, zeros elsewhere (P) */
      int a = (int)n->ia[0] - 1;
      KL("cplan_cuda_vp_embedding_forward(%s, %s, %s, %s, %lld, (int)run->axis_coord[%d] * %lld, %lld, %lld, %lld, G.s), %d);\n",
         kdt(c), ptr(c, i), ptr(c, n->in[0]), ptr(c, n->in[1]), (long long)numel(in(c, i, 1)), a, (long long)t->shape.d[0],
         (long long)t->shape.d[0], (long long)cg_index_bound(n, t->shape.d[0] * c->sp->axes[a].n), (long long)t->shape.d[1], i);
      break;
    }
    KL("cplan_cuda_embedding_forward(%s, %s, %s, %s, %lld, %lld, %lld, G.s), %d);\n", kdt(c), ptr(c, i),
       ptr(c, n->in[0]), ptr(c, n->in[1]), (long long)numel(in(c, i, 1)), (long long)cg_index_bound(n, t->shape.d[0]),
       (long long)t->shape.d[1], i);
    break;
  }
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_LAYER_NORM: case OP_RMS_NORM: case OP_ROPE: case OP_SDPA:
    emit_nn(c, i);
    break;
  case OP_DROPOUT: emit_dropout(c, i); break;
  case OP_CROSS_ENTROPY: {
    const Node *lg = in(c, i, 0);
    int64_t rows = cg_rows(lg);
    if (!hw_typed(c, i, 1, (int[]){n->in[0]})) break;
    if (n->ia[0] > 0) {
      emit_vocab_ce(c, i);
      break;
    }
    int64_t v = cg_last_dim(lg), ld = c->pitch[n->in[0]] ? c->pitch[n->in[0]] : v;
    if (c->ce_fused[i] >= 0 && c->ph == CG_PH_TRAIN) { /* and the gradient over the logits (find_ce_fused) */
      const char *dy = ce_dy(c, n, ptr(c, nd(c, c->ce_fused[i])->in[0]), aux_ptr(c, i, 2 * rows + 8), i);
      KL("cplan_cuda_cross_entropy_fused_ld(%s, %s, %s, %s, (int *)%s, %s, %s, %s, %lld, %lld, %lld, G.s), %d);\n",
         kdt(c), aux_ptr(c, i, 0), aux_ptr(c, i, rows), ptr(c, i), aux_ptr(c, i, 2 * rows), ptr(c, n->in[0]),
         ptr(c, n->in[1]), dy, (long long)rows, (long long)v, (long long)ld, i);
      emit_ce_scale(c, n, ptr(c, i), ptr(c, i), i);
      break;
    }
    KL("cplan_cuda_cross_entropy_forward_ld(%s, %s, %s, %s, (int *)%s, %s, %s, %lld, %lld, %lld, G.s), %d);\n", kdt(c),
       aux_ptr(c, i, 0), aux_ptr(c, i, rows), ptr(c, i), aux_ptr(c, i, 2 * rows), ptr(c, n->in[0]), ptr(c, n->in[1]),
       (long long)rows, (long long)v, (long long)ld, i);
    emit_ce_scale(c, n, ptr(c, i), ptr(c, i), i);
    break;
  }
  case OP_ARGMAX: {
    const Node *x = in(c, i, 0);
    int ax = (int)n->ia[0];
    if (n->ia[1] > 0) {
      emit_vocab_argmax(c, i);
      break;
    }
    const char *args[6] = {ai(tcodes(c, 2, (int[]){-1, n->in[0]})), ap(ptr(c, i)), ap(ptr(c, n->in[0])),
                           al(cg_dims_prod(&x->shape, 0, ax)), al(x->shape.d[ax]), al(cg_dims_prod(&x->shape, ax + 1, x->shape.rank))};
    emit_lk(c, "cps_argmax", numel(n), i, 6, args);
    break;
  }
  case OP_FLOAT: { /* i32 -> f32 (fusion.c never fuses it) */
    const char *args[4] = {ai(tcodes(c, 1, (int[]){i})), ap(ptr(c, i)), ap(ptr(c, n->in[0])), al(numel(n))};
    emit_lk(c, "cps_float", numel(n), i, 4, args);
    break;
  }
  case OP_ASSIGN:
    if (cg_root(&c->pl, n->in[1]) == cg_root(&c->pl, n->in[0])) break;
    if (scode(c, n->in[0]) == scode(c, n->in[1])) {
      EMIT("  CU(cudaMemcpyAsync(%s, %s, %lld, cudaMemcpyDeviceToDevice, G.s));\n", ptr(c, n->in[0]), ptr(c, n->in[1]),
           (long long)sbytes(c, n->in[0]));
    } else {
      const char *args[4] = {ai(tcodes(c, 2, (int[]){n->in[0], n->in[1]})), ap(ptr(c, n->in[0])), ap(ptr(c, n->in[1])),
                             al(numel(n))};
      emit_lk(c, "cps_cast", numel(n), i, 4, args);
    }
    break;
  case OP_ACCUM: {
    if (c->acc_done[i]) {
      EMIT("  /* (its gradient's kernels added into the accumulator) */\n");
      break;
    }
    const char *args[4] = {ai(tcodes(c, 2, (int[]){n->in[0], n->in[1]})), ap(ptr(c, n->in[0])), ap(ptr(c, n->in[1])),
                           al(numel(n))};
    emit_lk(c, "cps_accum", numel(n), i, 4, args);
    break;
  }
  case OP_ALL_REDUCE: case OP_ALL_GATHER: case OP_REDUCE_SCATTER: case OP_SHARD_SLICE: case OP_ALL_TO_ALL:
    emit_collective(c, i);
    break;
  case OP_PP_SEND: case OP_PP_RECV: emit_pp(c, i); break;
  default: unsupported(c, i, cp_fmt("the op '%s'", ir_ops[n->op].name));
  }
}

/* ---- backward nodes ---------------------------------------------------------------------------- */

/* The gradient buffers a group's launch writes, by forward input ("NULL" when not wanted or a
 * view of dy); zeroed first, as the kernels accumulate. A param gradient whose only reader is its
 * accumulator (acc_of) is the accumulator itself: the kernel adds into it, the accum launches
 * nothing. `writes` (bit k: the gradient of forward input k) names those the kernel can write
 * instead of add: they are not zeroed unless one of them is an accumulator; returns whether one is
 * (the launch must then add to them). */
static bool group_outputs_w(Cu *c, int lead, const char **dst, int nmax, int *ids, unsigned writes) {
  bool any_acc = false;
  for (int j = lead; j >= 0; j = cg_group_next(&c->pl, j)) {
    const Node *m = nd(c, j);
    if (m->op == OP_GRAD && c->pl.nc[j].leader == lead && c->pl.nc[j].kind != CG_L_ALIAS &&
        (c->acc_of[j] >= 0 || c->add_into[j] >= 0) && (writes >> m->ia[0] & 1))
      any_acc = true;
  }
  for (int k = 0; k < nmax; k++) dst[k] = "NULL";
  if (ids)
    for (int k = 0; k < nmax; k++) ids[k] = -1;
  for (int j = lead; j >= 0; j = cg_group_next(&c->pl, j)) {
    const Node *m = nd(c, j);
    if (m->op != OP_GRAD || c->pl.nc[j].leader != lead || c->pl.nc[j].kind == CG_L_ALIAS) continue;
    cp_assert(m->ia[0] < nmax);
    if (ids) ids[m->ia[0]] = j;
    if (c->add_into[j] >= 0) { /* added in place into the other addend of its only reader */
      dst[m->ia[0]] = ptr(c, c->add_into[j]);
      EMIT("  /* %%%d added into %%%d's buffer (the add %%%d, in place) */\n", j, c->add_into[j], c->reader[j]);
      continue;
    }
    int a = c->acc_of[j];
    if (a >= 0) {
      dst[m->ia[0]] = ptr(c, nd(c, a)->in[0]);
      c->acc_done[a] = true;
      EMIT("  /* %%%d into the accumulator %s (the accum %%%d) */\n", j, nd(c, nd(c, a)->in[0])->name, a);
      continue;
    }
    dst[m->ia[0]] = ptr(c, j);
    if (!(writes >> m->ia[0] & 1) || any_acc) emit_zero(c, dst[m->ia[0]], sbytes(c, j));
  }
  return any_acc;
}

static void group_outputs(Cu *c, int lead, const char **dst, int nmax, int *ids) {
  group_outputs_w(c, lead, dst, nmax, ids, 0);
}

static void emit_grad_binary(Cu *c, int i, const Node *f) {
  const Node *a = nd(c, f->in[0]), *b = nd(c, f->in[1]);
  const char *d[2];
  int ids[2], dyn = nd(c, i)->in[0];
  group_outputs(c, i, d, 2, ids);
  const char *dy = ptr(c, dyn);
  for (int w = 0; w < 2; w++) {
    if (strcmp(d[w], "NULL") == 0) continue;
    const Node *x = w ? b : a;
    if ((f->op == OP_ADD || f->op == OP_SUB) && trailing_of(&x->shape, &f->shape)) { /* a bias: column sums */
      EMIT("  colsum(%d, %s, %s, %lldLL, %lldLL, %s, %d);\n", tcodes(c, 2, (int[]){ids[w], dyn}), d[w], dy,
           (long long)(numel(f) / numel(x)), (long long)numel(x), f->op == OP_SUB && w ? "-1.0f" : "1.0f", i);
      if (numel(x) > c->colsum_cols) c->colsum_cols = numel(x);
      continue;
    }
    const char *args[10] = {ai((int)(f->op - OP_ADD)), ai(w), ai(tcodes(c, 4, (int[]){ids[w], dyn, f->in[0], f->in[1]})),
                            ap(d[w]), ap(dy), ap(ptr(c, f->in[0])), ap(ptr(c, f->in[1])),
                            cps_idx(&a->shape, &b->shape, &f->shape), cps_red(&x->shape, &f->shape), al(numel(x))};
    emit_lk(c, "cps_binary_bwd", numel(x), i, 10, args);
  }
}

/* A norm backward of [rows, cc]: gpu_init sizes the shared dw/db workspace for the largest need
 * (cplan_cuda_norm_backward_work of each shape). */
static void norm_shape(Cu *c, int64_t rows, int64_t cc) {
  for (int k = 0; k + 1 < c->norm_shapes.n; k += 2)
    if (c->norm_shapes.a[k] == rows && c->norm_shapes.a[k + 1] == cc) return;
  VEC_PUSH(c->norm_shapes, rows);
  VEC_PUSH(c->norm_shapes, cc);
}

/* sdpa's backward at its gradients' leader i: dq, dk and dv written (or added into an accumulator),
 * or written in place into the projection's gradient sum */
static void emit_sdpa_grad(Cu *c, int i) {
  const Node *n = nd(c, i);
  int s = n->fwd;
  const Node *f = nd(c, s);
  const int64_t *q = nd(c, f->in[0])->shape.d, *k = nd(c, f->in[1])->shape.d;
  const char *d[3];
  int ids[3];
  bool acc = false;
  AttOps g, in = att_ops(c, s, f->in, c->att_x[s]);
  if (c->att_r[s] >= 0) {
    g = att_ops(c, s, NULL, c->att_r[s]);
    for (int p = 0; p < 3; p++) d[p] = g.p[p], ids[p] = grad_of(c, s, p);
    EMIT("  /* dq, dk, dv in place in %%%d, the gradient of the projection %%%d */\n", c->att_r[s], c->att_x[s]);
  } else {
    /* the kernels write every row of dq, dk and dv: no zeroing unless one is an accumulator */
    acc = group_outputs_w(c, i, d, 3, ids, 7);
    g = in;
  }
  int km = f->nin == 4 ? f->in[3] : -1; /* the key mask: the _m launcher */
  if (!hw_typed(c, i, 9, (int[]){ids[0], ids[1], ids[2], n->in[0], s, f->in[0], f->in[1], f->in[2], km})) return;
  KL("cplan_cuda_attention_backward_%s(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s%lld, %lld, %lld, %lld, %d, %d, "
     "%lld, %s, %s, %s, G.s), %d);\n", km >= 0 ? "m" : "l", kdt(c), d[0], d[1], d[2], scratch_ptr(c, i, "F"),
     ptr(c, n->in[0]), ptr(c, s), aux_ptr(c, s, 0), in.p[0], in.p[1], in.p[2], km >= 0 ? cp_fmt("%s, ", ptr(c, km)) : "",
     (long long)(q[0] * q[1]), (long long)q[2], (long long)k[2], (long long)q[3], (int)f->ia[0], acc, (long long)g.group,
     g.l, g.lkv, att_layout(c, s, c->att_m[s] >= 0, 0), i);
}

static void emit_grad_nn(Cu *c, int i, const Node *f) {
  const Node *n = nd(c, i);
  const char *dx = ptr(c, i), *dy = ptr(c, n->in[0]), *x = ptr(c, f->in[0]);
  int64_t rows = cg_rows(f), cc = cg_last_dim(f), bytes = sbytes(c, i);
  const char *d[3];
  switch (f->op) {
  case OP_SOFTMAX:
    if (!hw_typed(c, i, 3, (int[]){i, n->in[0], n->fwd})) return;
    emit_zero(c, dx, bytes);
    KL("cplan_cuda_softmax_backward(%s, %s, %s, %s, %lld, %lld, G.s), %d);\n", kdt(c), dx, dy, ptr(c, n->fwd),
       (long long)rows, (long long)cc, i);
    break;
  case OP_LOG_SOFTMAX: {
    emit_zero(c, dx, bytes);
    const char *args[6] = {ai(tcodes(c, 3, (int[]){i, n->in[0], n->fwd})), ap(dx), ap(dy), ap(ptr(c, n->fwd)), al(rows),
                           al(cc)};
    emit_lrow(c, "cps_log_softmax_bwd", rows, i, 6, args);
    break;
  }
  case OP_LAYER_NORM: {
    bool acc = group_outputs_w(c, i, d, 3, NULL, 1); /* dx written (dw, db added) */
    if (!hw_typed(c, i, 3, (int[]){n->in[0], f->in[0], f->in[1]})) return;
    norm_shape(c, rows, cc);
    KL("cplan_cuda_layernorm_backward_ws(%s, %s, %s, %s, %s, %s, %s, %s, %s, %lld, %lld, %d, G.normwork, G.normwork_n, "
       "G.s), %d);\n", kdt(c), d[0], d[1], d[2], dy, x, ptr(c, f->in[1]), aux_ptr(c, n->fwd, 0), aux_ptr(c, n->fwd, rows),
       (long long)rows, (long long)cc, acc, i);
    break;
  }
    break;
  case OP_RMS_NORM: {
    bool acc = group_outputs_w(c, i, d, 2, NULL, 1); /* dx written (dw added) */
    if (!hw_typed(c, i, 3, (int[]){n->in[0], f->in[0], f->in[1]})) return;
    norm_shape(c, rows, cc);
    KL("cplan_cuda_rmsnorm_backward_ws(%s, %s, %s, %s, %s, %s, %s, %lld, %lld, %d, G.normwork, G.normwork_n, G.s), %d);\n",
       kdt(c), d[0], d[1], dy, x, ptr(c, f->in[1]), aux_ptr(c, n->fwd, 0), (long long)rows, (long long)cc, acc, i);
    break;
  }
  case OP_ROPE:
    if (!hw_typed(c, i, 2, (int[]){i, n->in[0]})) return;
    emit_zero(c, dx, bytes);
    KL("cplan_cuda_rope_backward(%s, %s, %s, %lld, %lld, %lld, %s, G.s), %d);\n", kdt(c), dx, dy,
       (long long)cg_dims_prod(&f->shape, 0, f->shape.rank - 2), (long long)f->shape.d[f->shape.rank - 2], (long long)cc,
       cg_flt(f->fa[0]), i);
    break;
  case OP_SDPA: emit_sdpa_grad(c, i); break;
  case OP_DROPOUT: {
    bool on = f->fa[0] > 0;
    const char *mask = on ? scratch_ptr(c, i, "B") : "NULL";
    emit_zero(c, dx, bytes);
    if (on) emit_mask(c, n->fwd, mask, i);
    const char *args[7] = {ai(1), ai(tcodes(c, 2, (int[]){i, n->in[0]})), ap(dx), ap(dy), ap(mask), al(numel(f)),
                           af(f->fa[0])};
    emit_lk(c, "cps_dropout", numel(f), i, 7, args);
    break;
  }
  case OP_CROSS_ENTROPY: {
    const Node *lg = nd(c, f->in[0]);
    int64_t r = cg_rows(lg);
    if (!hw_typed(c, i, 2, (int[]){i, f->in[0]})) break;
    if (f->ia[0] > 0) { /* vocab-parallel: this rank's columns, from the forward's global m and s */
      emit_zero(c, dx, bytes);
      int a = (int)f->ia[0] - 1;
      int64_t vl = cg_last_dim(lg);
      const char *dyw = ce_dy(c, f, dy, aux_ptr(c, n->fwd, 2 * r + 8), i);
      KL("cplan_cuda_vp_ce_backward(%s, %s, %s, (const int *)%s, %s, %s, %s, %s, %lld, %lld, (int)run->axis_coord[%d] * %lld, "
         "%lld, G.s), %d);\n", kdt(c), dx, dyw, aux_ptr(c, n->fwd, 2 * r), x, aux_ptr(c, n->fwd, 0), aux_ptr(c, n->fwd, r),
         ptr(c, f->in[1]), (long long)r, (long long)vl, a, (long long)vl, (long long)cg_index_bound(f, vl * c->sp->axes[a].n), i);
      break;
    }
    /* written, not added: no zeroing (the logits' gradient is never an accumulator) */
    cp_assert(c->pitch[i] == c->pitch[f->in[0]]); /* find_pitched pads both or neither */
    int64_t v = cg_last_dim(lg), ld = c->pitch[i] ? c->pitch[i] : v;
    const char *dyw = ce_dy(c, f, dy, aux_ptr(c, n->fwd, 2 * r + 8), i);
    KL("cplan_cuda_cross_entropy_backward_ld(%s, %s, %s, (const int *)%s, %s, %s, %s, %lld, %lld, %lld, 0, G.s), %d);\n",
       kdt(c), dx, dyw, aux_ptr(c, n->fwd, 2 * r), x, aux_ptr(c, n->fwd, r), ptr(c, f->in[1]), (long long)r, (long long)v,
       (long long)ld, i);
    break;
  }
  default: cp_unreachable();
  }
}

static void emit_grad_shape(Cu *c, int i, const Node *f) {
  const Node *n = nd(c, i), *x = nd(c, f->in[n->ia[0]]);
  const char *dx = ptr(c, i), *dy = ptr(c, n->in[0]), *tt = ai(tcodes(c, 2, (int[]){i, n->in[0]}));
  const int64_t *d = x->shape.d;
  int r = x->shape.rank;
  int64_t bytes = sbytes(c, i);
  switch (f->op) {
  case OP_TRANSPOSE: { /* dx = dy transposed back */
    const char *args[6] = {tt, ap(dx), ap(dy), al(cg_dims_prod(&x->shape, 0, r - 2)), al(d[r - 1]), al(d[r - 2])};
    emit_lk(c, "cps_transpose", numel(x), i, 6, args);
    break;
  }
  case OP_PERMUTE: {
    int64_t xs[CP_MAX_RANK], on[CP_MAX_RANK], st[CP_MAX_RANK], s = 1;
    for (int k = r - 1; k >= 0; k--) st[k] = s, s *= d[k];
    for (int k = 0; k < f->ndims; k++) on[k] = d[f->dims[k]], xs[k] = st[f->dims[k]];
    emit_zero(c, dx, bytes);
    const char *p = cp_fmt("&(CpsPerm){%d, %s, %s}", f->ndims, ll_list(on, f->ndims), ll_list(xs, f->ndims));
    const char *args[6] = {ai(1), tt, ap(dx), ap(dy), p, al(numel(x))};
    emit_lk(c, "cps_permute", numel(x), i, 6, args);
    break;
  }
  case OP_SLICE: {
    int ax = (int)f->ia[0];
    emit_zero(c, dx, bytes);
    const char *args[9] = {ai(1), tt, ap(dx), ap(dy), al(cg_dims_prod(&x->shape, 0, ax)), al(d[ax]),
                           al(cg_dims_prod(&x->shape, ax + 1, r)), al(f->ia[1]), al(f->ia[2])};
    emit_lk(c, "cps_slice", numel(f), i, 9, args);
    break;
  }
  case OP_CONCAT: {
    int ax = (int)f->ia[0];
    int64_t start = 0;
    for (int k = 0; k < n->ia[0]; k++) start += nd(c, f->in[k])->shape.d[ax];
    const char *args[9] = {ai(0), tt, ap(dx), ap(dy), al(cg_dims_prod(&f->shape, 0, ax)), al(f->shape.d[ax]),
                           al(cg_dims_prod(&f->shape, ax + 1, f->shape.rank)), al(start), al(start + d[ax])};
    emit_lk(c, "cps_slice", numel(x), i, 9, args);
    break;
  }
  case OP_SPLIT_HEADS: { /* dx = merge_heads(dy): dy [b, h, t, dh] */
    const char *args[8] = {ai(1), tt, ap(dx), ap(dy), al(d[0]), al(d[1]), al(d[2]), al(f->ia[0])};
    emit_lk(c, "cps_heads", numel(x), i, 8, args);
    break;
  }
  case OP_MERGE_HEADS: { /* dx = split_heads(dy): x [b, h, t, dh] */
    const char *args[8] = {ai(0), tt, ap(dx), ap(dy), al(d[0]), al(d[2]), al(d[1] * d[3]), al(d[1])};
    emit_lk(c, "cps_heads", numel(x), i, 8, args);
    break;
  }
  case OP_EMBEDDING:
    if (!hw_typed(c, i, 1, (int[]){n->in[0]})) break;
    if (f->ia[0] == 0 && c->acc_of[i] >= 0) { /* the kernel adds: straight into the accumulator */
      int a = c->acc_of[i];
      dx = ptr(c, nd(c, a)->in[0]);
      c->acc_done[a] = true;
      EMIT("  /* into the accumulator %s (the accum %%%d) */\n", nd(c, nd(c, a)->in[0])->name, a);
    } else
      emit_zero(c, dx, bytes);
    if (f->ia[0] > 0) { /* vocab-parallel: this rank's rows of the table's gradient */
      int a = (int)f->ia[0] - 1;
      KL("cplan_cuda_vp_embedding_backward(%s, %s, %s, %s, %lld, (int)run->axis_coord[%d] * %lld, %lld, %lld, %lld, G.s), %d);\n",
         kdt(c), dx, dy, ptr(c, f->in[1]), (long long)numel(nd(c, f->in[1])), a, (long long)d[0], (long long)d[0],
         (long long)cg_index_bound(f, d[0] * c->sp->axes[a].n), (long long)d[1], i);
      break;
    }
    KL("cplan_cuda_embedding_backward(%s, %s, %s, %s, %lld, %lld, %lld, G.s), %d);\n", kdt(c), dx, dy, ptr(c, f->in[1]),
       (long long)numel(nd(c, f->in[1])), (long long)cg_index_bound(f, d[0]), (long long)d[1], i);
    break;
  default: cp_unreachable();
  }
}

static void emit_grad(Cu *c, int i) {
  const Node *n = nd(c, i);
  Node fv = *nd(c, n->fwd); /* the forward node with the inputs this GRAD reads (emit_c.c) */
  fv.in = n->in + 1;
  const Node *f = &fv;
  if (c->tgrad_of[i] < 0 && cg_grad_skip(c->out, &c->pl, i)) return; /* a view of its transpose's gradient: computed */
  int64_t bytes = sbytes(c, i);
  const char *dx = ptr(c, i), *dy = ptr(c, n->in[0]), *x = ptr(c, f->in[n->ia[0]]);
  switch (f->op) {
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MAXIMUM: case OP_MINIMUM: case OP_MOD:
    emit_grad_binary(c, i, f);
    break;
  case OP_NEG: case OP_EXP: case OP_LOG: case OP_SQRT: case OP_RSQRT: case OP_TANH: case OP_SIGMOID:
  case OP_RELU: case OP_GELU: case OP_SILU: case OP_SQUARE: case OP_POW: case OP_ABS: case OP_CLAMP_MIN:
  case OP_CLAMP_MAX: case OP_ERF: case OP_SIN: case OP_COS: {
    emit_zero(c, dx, bytes);
    const char *args[8] = {ai((int)(f->op - OP_NEG)), ai(tcodes(c, 4, (int[]){i, n->in[0], f->in[n->ia[0]], n->fwd})),
                           ap(dx), ap(dy), ap(x), ap(ptr(c, n->fwd)), al(numel(n)), af(unary_c(f))};
    emit_lk(c, "cps_unary_bwd", numel(n), i, 8, args);
    break;
  }
  case OP_WHERE: { /* a (ia[0] 1) or b (2): dy where cond gives it that element */
    const Node *q = nd(c, f->in[0]), *xv = nd(c, f->in[n->ia[0]]);
    emit_zero(c, dx, bytes);
    const char *args[8] = {ai((int)n->ia[0]), ai(tcodes(c, 3, (int[]){i, n->in[0], f->in[0]})), ap(dx), ap(dy),
                           ap(ptr(c, f->in[0])), cps_idx(&q->shape, &q->shape, &f->shape),
                           cps_red(&xv->shape, &f->shape), al(numel(n))};
    emit_lk(c, "cps_where_bwd", numel(n), i, 8, args);
    break;
  }
  case OP_SUM: case OP_MEAN: case OP_MAX: {
    int64_t o, l, r;
    if (!cg_reduce_dims(f, &nd(c, f->in[0])->shape, &o, &l, &r)) {
      unsupported(c, n->fwd, "a reduction over axes that are not adjacent");
      return;
    }
    emit_zero(c, dx, bytes);
    if (f->op == OP_MAX) {
      const char *args[7] = {ai(tcodes(c, 3, (int[]){i, n->in[0], f->in[0]})), ap(dx), ap(dy), ap(x), al(o), al(l), al(r)};
      emit_lk(c, "cps_max_bwd", o * r, i, 7, args);
    } else {
      const char *args[7] = {ai(f->op == OP_MEAN), ai(tcodes(c, 2, (int[]){i, n->in[0]})), ap(dx), ap(dy), al(o), al(l),
                             al(r)};
      emit_lk(c, "cps_reduce_bwd", o * l * r, i, 7, args);
    }
    break;
  }
  case OP_MATMUL: {
    Mm mm;
    if (!mm_setup(c, f, n->fwd, &mm)) return;
    cp_assert(rcode(c, n->in[0]) == mm.abt && rcode(c, n->in[n->ia[0] == 0 ? 2 : 1]) == mm.abt);
    int a = c->acc_of[i]; /* a weight gradient added straight into its accumulator */
    if (c->tgrad_of[i] >= 0) a = c->acc_of[c->tgrad_of[i]]; /* as the gradient of the transpose (find_tgrads) */
    if (a >= 0) {
      dx = ptr(c, nd(c, a)->in[0]);
      c->acc_done[a] = true;
      EMIT("  /* into the accumulator %s (the accum %%%d) */\n", nd(c, nd(c, a)->in[0])->name, a);
    }
    int gg = c->gelu_of[i], bg = c->bgrad_of[i];
    if (gg >= 0) { /* dA = dY @ B^T, then the gelu's gradient: DGELU with the pre-activation as aux */
      int pre = nd(c, nd(c, gg)->fwd)->in[0];
      cp_assert(!arena_overlap(c, gg, n->in[0]) && !arena_overlap(c, gg, pre));
      EMIT("  /* with the gelu gradient %%%d (cuBLASLt's DGELU epilogue, aux: %%%d) */\n", gg, pre);
      const char *bga = bg >= 0 ? bgrad_args(c, bg) : NULL;
      EMIT("  gemm_dgelu%s(%s, %s, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %lldLL, %lldLL, %lldLL, %d, %d, %d%s%s);\n",
           bga ? "_bgrad" : "", ptr(c, gg), ptr(c, pre), dy, mm.b, (long long)mm.d.nb, (long long)mm.d.m,
           (long long)mm.d.k, (long long)mm.d.n, 0, !mm.tb, (long long)mm.d.sc, (long long)mm.d.sb, (long long)mm.d.sa, i,
           mm.abt, scode(c, gg), bga ? ", " : "", bga ? bga : "");
    } else if (n->ia[0] == 0) /* dA = dY @ B^T */
      emit_gemm(c, dx, dy, mm.b, mm.d.nb, mm.d.m, mm.d.k, mm.d.n, false, !mm.tb, pstride(c, n->in[0], mm.d.m, mm.d.sc),
                mm.d.sb, mm.d.sa, (int64_t[3]){c->pitch[n->in[0]], 0, 0}, i, mm.abt, scode(c, i), a >= 0);
    else if (bg >= 0) { /* dB = A^T @ dY, and the bias gradient: dY's column sums */
      const char *bga = bgrad_args(c, bg);
      EMIT("  gemm_bgrad(%s, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %lldLL, %lldLL, %lldLL, %d, %d, %d, %d, %s);\n", dx,
           mm.a, dy, (long long)mm.d.nb, (long long)mm.d.k, (long long)mm.d.n, (long long)mm.d.m, !mm.ta, 0,
           (long long)mm.d.sa, (long long)mm.d.sc, (long long)mm.d.sb, i, mm.abt, scode(c, i), a >= 0, bga);
    } else if (c->tgrad_of[i] >= 0) { /* dB^T = dY^T @ A, into the transpose's gradient (find_tgrads) */
      EMIT("  /* transposed, as the gradient %%%d of the transpose it feeds */\n", c->tgrad_of[i]);
      emit_gemm(c, dx, dy, mm.a, mm.d.nb, mm.d.n, mm.d.k, mm.d.m, true, mm.ta, pstride(c, n->in[0], mm.d.m, mm.d.sc),
                mm.d.sa, mm.d.sb, (int64_t[3]){c->pitch[n->in[0]], 0, 0}, i, mm.abt, scode(c, i), a >= 0);
    } else /* dB = A^T @ dY */
      emit_gemm(c, dx, mm.a, dy, mm.d.nb, mm.d.k, mm.d.n, mm.d.m, !mm.ta, false, mm.d.sa,
                pstride(c, n->in[0], mm.d.m, mm.d.sc), mm.d.sb, (int64_t[3]){0, c->pitch[n->in[0]], 0}, i, mm.abt,
                scode(c, i), a >= 0);
    break;
  }
  case OP_TRANSPOSE: case OP_PERMUTE: case OP_SLICE: case OP_CONCAT: case OP_SPLIT_HEADS: case OP_MERGE_HEADS:
  case OP_EMBEDDING:
    emit_grad_shape(c, i, f);
    break;
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_LAYER_NORM: case OP_RMS_NORM: case OP_ROPE: case OP_SDPA:
  case OP_DROPOUT: case OP_CROSS_ENTROPY:
    emit_grad_nn(c, i, f);
    break;
  default: unsupported(c, n->fwd, cp_fmt("the gradient of '%s'", ir_ops[f->op].name));
  }
}

/* ---- the phases ------------------------------------------------------------------------------------ */

static void emit_fused(Cu *c, int i) {
  const FusionGroup *gr = &c->pl.fu->groups[c->pl.fu->group[i]];
  if (gr->nodes.n > 1) EMIT("  /* fused: %d nodes, one pass */\n", gr->nodes.n);
  for (int k = 0; k < gr->nodes.n; k++) cg_comment(c->out, c->g, c->irline, gr->nodes.a[k]);
  const char **args = cp_alloc(sizeof(char *) * (size_t)(gr->leaves.n + 1));
  args[0] = ap(ptr(c, i));
  for (int k = 0; k < gr->leaves.n; k++) args[k + 1] = ap(ptr(c, gr->leaves.a[k]));
  /* the storage types the kernel's pointers take (typed_kernels), the same in every phase */
  int gi = c->pl.fu->group[i];
  int *ty = c->ftypes[gi];
  if (!ty) {
    ty = c->ftypes[gi] = cp_alloc(sizeof(int) * (size_t)(gr->leaves.n + 1));
    ty[0] = scode(c, i);
    for (int k = 0; k < gr->leaves.n; k++) ty[k + 1] = scode(c, gr->leaves.a[k]);
  }
  bool same = ty[0] == scode(c, i);
  for (int k = 0; k < gr->leaves.n; k++) same &= ty[k + 1] == scode(c, gr->leaves.a[k]);
  if (!same) unsupported(c, i, "a fused kernel whose operands change storage type between phases");
  emit_lk(c, gr->kernel.name, numel(nd(c, i)), i, gr->leaves.n + 1, args);
}

/* The bytes node i's launch moves, about: its operands and its result in their storage types (a
 * fused group: its leaves and its root; a gradient: dy and the forward's inputs), for the achieved
 * bandwidth of the CPLAN_PROFILE=1 report. */
static double prof_bytes(const Cu *c, int i, double *leaf_bytes) {
  const Node *n = nd(c, i);
  double b = (double)numel(n) * (scode(c, i) ? 2 : 4);
  int gi = c->pl.fu->group[i];
  if (gi >= 0) {
    /* a group's leaves once per group (leaf_bytes[gi], < 0 until then), not per member: a group of
     * many nodes and leaves (the update's sum over every param, 3600 adds at 300 layers) made this
     * quadratic. Whole numbers of bytes, so the sum is exact, in any order, below 2^53 (else summed
     * as before). */
    const FusionGroup *gr = &c->pl.fu->groups[gi];
    if (leaf_bytes[gi] < 0) {
      leaf_bytes[gi] = 0;
      for (int k = 0; k < gr->leaves.n; k++)
        leaf_bytes[gi] += (double)numel(nd(c, gr->leaves.a[k])) * (scode(c, gr->leaves.a[k]) ? 2 : 4);
    }
    if (b + leaf_bytes[gi] < 0x1p53) return b + leaf_bytes[gi];
    for (int k = 0; k < gr->leaves.n; k++) b += (double)numel(nd(c, gr->leaves.a[k])) * (scode(c, gr->leaves.a[k]) ? 2 : 4);
    return b;
  }
  for (int k = 0; k < n->nin - (n->op == OP_GRAD); k++) b += (double)numel(nd(c, n->in[k])) * (scode(c, n->in[k]) ? 2 : 4);
  return b;
}

/* The class of a node in the CPLAN_PROFILE=1 report: its op, a gradient's forward op, fused. */
static const char *prof_class(const Cu *c, int i) {
  const Node *n = nd(c, i);
  const char *op = n->op == OP_GRAD ? cp_fmt("grad(%s)", ir_ops[nd(c, n->fwd)->op].name) : ir_ops[n->op].name;
  if (c->pl.fu->group[i] >= 0) return cp_fmt("fused %s%s", op, n->role == ROLE_UPD ? " (update)" : "");
  return cp_fmt("%s%s", op, n->role == ROLE_UPD ? " (update)" : "");
}

static void emit_node_launches(Cu *c, int i);

/* Node i's launches (c->cur: the buffers they name are named at i, cg_plan_name). */
static void emit_node(Cu *c, int i) {
  c->cur = i;
  emit_node_launches(c, i);
  c->cur = -1;
}

static void emit_node_launches(Cu *c, int i) {
  if (c->att_skip[i] >= 0) {
    cg_comment(c->out, c->g, c->irline, i);
    EMIT("  /* (in place: the attention at %%%d reads or writes it) */\n", c->att_skip[i]);
    return;
  }
  if (c->att_lead[i] >= 0) { /* a view of the gradients' sum, which its launch writes */
    cg_comment(c->out, c->g, c->irline, i);
    EMIT("  PROF(%d);\n", i);
    emit_sdpa_grad(c, i);
    return;
  }
  if (c->qkv[i]) {
    cg_comment(c->out, c->g, c->irline, i);
    EMIT("  PROF(%d);\n", i);
    emit_qkv(c, i);
    return;
  }
  if (c->add_skip[i]) {
    cg_comment(c->out, c->g, c->irline, i);
    EMIT("  /* (in place: a norm's backward added its dx into %%%d) */\n", c->pl.nc[i].alias);
    return;
  }
  if (c->qkv_skip[i]) {
    cg_comment(c->out, c->g, c->irline, i);
    EMIT("  /* (computed by the cps_qkv launch at %%%d) */\n", c->pl.nc[i].leader);
    return;
  }
  if (c->ep_done[i]) {
    cg_comment(c->out, c->g, c->irline, i);
    EMIT("  /* (done by its matmul's GEMM) */\n");
    return;
  }
  if (c->res_skip[i] >= 0) {
    cg_comment(c->out, c->g, c->irline, i);
    EMIT("  /* (computed by the launch of the norm %%%d) */\n", c->res_skip[i]);
    return;
  }
  if (nd(c, i)->op == OP_GRAD && c->ce_fused[i] >= 0) {
    cg_comment(c->out, c->g, c->irline, i);
    EMIT("  /* (written over the logits by the fused cross_entropy %%%d) */\n", c->ce_fused[i]);
    return;
  }
  if (c->acc_add[i]) {
    cg_comment(c->out, c->g, c->irline, i);
    EMIT("  /* (both addends were added into the accumulator) */\n");
    return;
  }
  if (c->tgrad_skip[i]) {
    cg_comment(c->out, c->g, c->irline, i);
    EMIT("  /* (written transposed by the GEMM of %%%d) */\n", nd(c, i)->in[0]);
    return;
  }
  if (c->bgrad_host[i] >= 0) {
    cg_comment(c->out, c->g, c->irline, i);
    EMIT("  /* (the column sums of its dy: by the GEMM of %%%d, into the accumulator) */\n", c->bgrad_host[i]);
    return;
  }
  if (c->pl.fu->group[i] >= 0) {
    if (fusion_is_root(c->pl.fu, i)) EMIT("  PROF(%d);\n", i), emit_fused(c, i);
    return;
  }
  cg_comment(c->out, c->g, c->irline, i);
  EMIT("  PROF(%d);\n", i);
  emit_casts(c, i);
  if (nd(c, i)->op == OP_GRAD) emit_grad(c, i);
  else emit_forward(c, i);
}

static void emit_scalar_ins(Cu *c) {
  const OptimizerConf *o = &c->t->optimizer;
  for (int i = 0; i < c->g->n; i++) {
    const Node *n = nd(c, i);
    if (n->op != OP_SCALAR_IN || cg_ce_weight_in(n)) continue;
    const char *v = cg_scalar_in(o, n);
    if (!v && strcmp(n->name, "grad_sumsq") == 0) v = "run->grad_sumsq"; /* a pipeline stage's (pipeline.h) */
    if (!v) cp_panic(__FILE__, __LINE__, "unknown scalar input '%s'", n->name);
    EMIT("  G.hsc[%lld] = (float)(%s); /* %s */\n", (long long)c->pl.nc[i].off, v, n->name);
  }
  if (c->pl.nscalar) EMIT("  CU(cudaMemcpyAsync(G.dsc, G.hsc, %d, cudaMemcpyHostToDevice, G.s));\n", c->pl.nscalar * 4);
}

/* The device values a phase hands back (loss, metrics; the gradient norm), copied to G.hout. */
static void emit_fetch(Cu *c, const int *nodes, int n) {
  StrBuf b = {0};
  for (int k = 0; k < n; k++) sb_printf(&b, "%s%s", k ? ", " : "", nodes[k] >= 0 ? ptr(c, nodes[k]) : "NULL");
  EMIT("  fetch(%d, (float *const[]){%s});\n", n, sb_str(&b));
}

/* AdamW runs fused (unless CPLAN_FUSED_UPDATE=0 at build time): the global gradient norm and the
 * clip factor by cplan_cuda_global_norm, then every param's step by cplan_cuda_adamw_multi
 * (kernels/cuda: the formula of compiler/optimizer.c, 32 tensors a launch), in place of the
 * graph's update nodes (one fused group or more per param). The other optimizers keep the nodes. */
static bool fused_adamw(const Cu *c) {
  const char *e = getenv("CPLAN_FUSED_UPDATE");
  /* a lowered plan's norm sums shards over the axes: its graph has the collectives for that */
  return c->t->optimizer.kind == OPT_ADAMW && c->g->grad_norm >= 0 && !c->sp && !(e && strcmp(e, "0") == 0);
}

/* The state node of param node p whose name ends in suffix (".exp_avg"), or the gradient
 * accumulator (suffix NULL: the unsaved state of p); -1 if none. */
static int param_state(const Cu *c, int p, const char *suffix) {
  const Graph *g = c->g;
  size_t ls = suffix ? strlen(suffix) : 0;
  for (int k = 0; k < g->states.n; k++) {
    const Node *s = nd(c, g->states.a[k]);
    if (s->ia[0] != p || (suffix != NULL) != (s->ia[1] != 0)) continue;
    size_t ln = s->name ? strlen(s->name) : 0;
    if (!suffix || (ln >= ls && strcmp(s->name + ln - ls, suffix) == 0)) return g->states.a[k];
  }
  return -1;
}

/* adamw_fused(run): the tensor tables (built at the first step: the device arenas are fixed by
 * then), the norm into the grad_norm node's slot, the clip factor, the update. */
static void emit_adamw_fused(Cu *c) {
  const Graph *g = c->g;
  const OptimizerConf *o = &c->t->optimizer;
  StrBuf nt = {0}, at = {0};
  int n = 0;
  for (int k = 0; k < g->params.n; k++) {
    int p = g->params.a[k], acc = param_state(c, p, NULL), m = param_state(c, p, ".exp_avg"),
        v = param_state(c, p, ".exp_avg_sq");
    if (acc < 0) continue; /* no gradient: not updated (as torch) */
    if (m < 0 || v < 0) cp_panic(__FILE__, __LINE__, "AdamW param %s has no moments", nd(c, p)->name);
    const Node *pn = nd(c, p);
    long long off = (long long)c->pl.nc[cg_root(&c->pl, p)].off, len = (long long)shape_numel(&pn->shape);
    const char *ao = cp_fmt("S(%lld)", (long long)c->pl.nc[acc].off);
    sb_printf(&nt, "    nt[%d] = (CplanNormTensor){%s, CPLAN_F32, %lldLL};\n", n, ao, len);
    sb_printf(&at, "    at[%d] = (CplanAdamwTensor){P(%lld), %s, %s, CPLAN_F32, S(%lld), S(%lld), %lldLL, %s}; /* %s */\n", n,
              off, c->lpc == 1 ? cp_fmt("PL(%lld)", off) : "NULL", ao, (long long)c->pl.nc[m].off,
              (long long)c->pl.nc[v].off, len, cg_flt(pn->shape.rank >= 2 ? o->weight_decay : 0), pn->name);
    n++;
  }
  EMIT("\n/* AdamW, fused (codegen/emit_cu.c fused_adamw): the global gradient norm and the clip factor, then\n"
       " * every param's step, multi-tensor (kernels/cuda global_norm.cu, adamw.cu) */\n"
       "#define NUPD %d\nstatic void adamw_fused(const RtRun *run) {\n"
       "  static CplanNormTensor nt[NUPD + 1];\n  static CplanAdamwTensor at[NUPD + 1];\n"
       "  static double *work;\n  static size_t work_len;\n  static float *clip_scale;\n"
       "  if (!work) {\n%s%s"
       "    work_len = cplan_cuda_global_norm_work(nt, NUPD);\n"
       "    CU(cudaMalloc((void **)&work, work_len * sizeof *work + 8));\n"
       "    CU(cudaMalloc((void **)&clip_scale, 4));\n  }\n",
       n, sb_str(&nt), sb_str(&at));
  EMIT("  kl_check(cplan_cuda_global_norm(%s, %s, nt, NUPD, %s, work, work_len, G.s), -1);\n", ptr(c, g->grad_norm),
       c->t->clip > 0 ? "clip_scale" : "NULL", cg_flt(c->t->clip > 0 ? c->t->clip : 0));
  EMIT("  CplanAdamwHyper h = {(float)lr_at(run->step), %s, %s, %s, (float)(1.0 - pow(%.17g, (double)(run->step + 1))),\n"
       "                        (float)(1.0 - pow(%.17g, (double)(run->step + 1)))};\n",
       cg_flt(o->beta1), cg_flt(o->beta2), cg_flt(o->eps), o->beta1, o->beta2);
  EMIT("  kl_check(cplan_cuda_adamw_multi(at, NUPD, &h, %s, G.s), -1);\n}\n", c->t->clip > 0 ? "clip_scale" : "NULL");
}

/* Zeroes the gradient accumulators (the unsaved states) at the end of update: one memset over
 * their span when no saved state lies inside it (the padding between them is unused), else one
 * per accumulator. State offsets are in floats (S(off)). */
static void emit_zero_grads(Cu *c) {
  const Graph *g = c->g;
  int64_t lo = INT64_MAX, hi = 0;
  int n = 0;
  for (int k = 0; k < g->states.n; k++) {
    int i = g->states.a[k];
    if (nd(c, i)->ia[1]) continue;
    int64_t off = c->pl.nc[i].off * 4;
    lo = off < lo ? off : lo;
    hi = off + sbytes(c, i) > hi ? off + sbytes(c, i) : hi;
    n++;
  }
  bool span = n > 1;
  for (int k = 0; k < g->states.n && span; k++) {
    int i = g->states.a[k];
    int64_t off = c->pl.nc[i].off * 4;
    if (nd(c, i)->ia[1] && off < hi && off + sbytes(c, i) > lo) span = false;
  }
  if (span) {
    EMIT("  /* all %d of them: one span */\n", n);
    emit_zero(c, cp_fmt("S(%lld)", (long long)(lo / 4)), hi - lo);
    return;
  }
  for (int k = 0; k < g->states.n; k++) {
    const Node *s = nd(c, g->states.a[k]);
    if (!s->ia[1]) {
      EMIT("  /* %s */\n", s->name);
      emit_zero(c, ptr(c, g->states.a[k]), sbytes(c, g->states.a[k]));
    }
  }
}

static void emit_phase_fn(Cu *c, int ph, const char *sig, const char *why) {
  const Graph *g = c->g;
  c->ph = ph;
  EMIT("\n/* %s */\n%s {\n  ensure_device(run);\n", why, sig);
  /* a pipeline stage: update_grad_sumsq runs the update nodes before norm_split, update the rest */
  const PipeStage *ps = c->pipe ? &c->pipe->stages[c->stage] : NULL;
  if (ps && strstr(sig, "grad_sumsq")) {
    c->upd = true;
    emit_scalar_ins(c);
    for (int i = 0; i < ps->norm_split; i++)
      if (nd(c, i)->role == ROLE_UPD && cg_executed(nd(c, i))) emit_node(c, i);
    c->upd = false;
    if (ps->norm_part >= 0) emit_fetch(c, &ps->norm_part, 1);
    EMIT("  prof_flush(run);\n  return %s;\n}\n", ps->norm_part >= 0 ? "(double)G.hout[0]" : "0.0");
    return;
  }
  if (ph == CG_PH_TRAIN && strstr(sig, "update")) {
    c->upd = true;
    if (c->ls && ps) /* the squared norm is the sum over every stage's gradients: the same on all of them */
      EMIT("  /* f16: an overflow in any stage's gradients makes the step's squared gradient norm inf or NaN */\n"
           "  G.overflow = !isfinite(run->grad_sumsq);\n");
    if (c->ls)
      EMIT("  /* f16: an overflow in this step's gradients skips it%s */\n"
           "%s  int skip = ls_step();\n  if (!skip) {\n", ps ? "" : " (ls_check found it)",
           c->sp ? "  overflow_agree(run); /* any rank's overflow skips the step */\n" : "");
    if (fused_adamw(c)) {
      EMIT("  adamw_fused(run);\n");
      if (c->lpc == 2) EMIT("  /* the forward reads the params in f16 (adamw_fused wrote the bf16 copy only under bf16) */\n  lp_refresh();\n");
    } else {
      emit_scalar_ins(c);
      for (int i = ps ? ps->norm_split : 0; i < g->n; i++)
        if (nd(c, i)->role == ROLE_UPD && cg_executed(nd(c, i))) emit_node(c, i);
      if (c->lpc) EMIT("  /* the forward reads the params in %s */\n  lp_refresh();\n", c->lpc == 1 ? "bf16" : "f16");
    }
    if (c->ls) EMIT("  }\n");
    c->upd = false;
    EMIT("  /* the gradient accumulators start the next step at zero */\n");
    emit_zero_grads(c);
    if (g->grad_norm >= 0) emit_fetch(c, &g->grad_norm, 1);
    else EMIT("  CU(cudaStreamSynchronize(G.s));\n");
    EMIT("  prof_flush(run);\n");
    EMIT("  /* without the runtime's to_host hook, the host mirrors follow every update */\n"
         "  if (!G.hooked) download(run);\n");
    if (c->ls) EMIT("  if (skip) return NAN; /* a skipped step has no gradient norm */\n");
    /* every pipeline stage computes the norm (pipeline.h); -1 only in one without any gradient */
    EMIT("  return %s;\n}\n", g->grad_norm >= 0 ? "(double)G.hout[0]" : ps ? "-1.0" : "0.0");
    return;
  }
  /* a stage's backward reads the inputs its forward put in this slot */
  EMIT("%s", c->only_role == ROLE_BWD ? "  (void)inputs;\n" : "  put_inputs(inputs);\n");
  if (c->seed >= 0 && ph == CG_PH_TRAIN) EMIT("  ls_seed(); /* the loss gradient's seed times the loss scale */\n");
  for (int i = 0; i < g->n; i++) /* label_smoothing's term: its cross_entropy's weight in this micro-batch */
    if (cg_ce_weight_in(nd(c, i)))
      KL("cplan_cuda_cross_entropy_scale(%s, NULL, %s, G.s), %d);\n", ptr(c, i),
         cg_ce_weight_in_value(nd(c, i), c->sp != NULL), i);
  for (int i = 0; i < g->n; i++) {
    const Node *n = nd(c, i);
    if (!cg_in_phase(n, ph) || n->role == ROLE_UPD || (c->only_role >= 0 && (int)n->role != c->only_role)) continue;
    emit_node(c, i);
  }
  if (!strstr(sig, "double *loss")) { /* a pipeline stage's backward */
    if (c->ls) EMIT("  ls_check(run);\n");
    EMIT("  prof_flush(run);\n}\n");
    return;
  }
  int *outs = cp_alloc(sizeof(int) * (size_t)(g->metrics.n + 1));
  outs[0] = g->loss;
  for (int k = 0; k < g->metrics.n; k++) outs[k + 1] = g->metrics.a[k].node;
  if (g->loss < 0) { /* no loss: a zero in its place */
    EMIT("  G.hout[0] = 0.0f;\n");
  }
  if (c->ls && ph == CG_PH_TRAIN && !c->pipe) EMIT("  ls_check(run);\n");
  emit_fetch(c, outs, g->metrics.n + 1);
  EMIT("  prof_flush(run);\n");
  EMIT("  *loss = %s%s;\n", g->loss >= 0 ? "(double)G.hout[0]" : "0.0", cg_tp_share(c->lw, -1));
  for (int k = 0; k < g->metrics.n; k++)
    EMIT("  metrics[%d] = (double)G.hout[%d]%s; /* %s */\n", k, k + 1, cg_tp_share(c->lw, k), g->metrics.a[k].name);
  if (c->seed >= 0) {
    /* a pipeline stage's forward runs before the step's backwards: the scale and count at the step's start */
    if (ph == CG_PH_TRAIN && !c->pipe) EMIT("  ls_metrics(run, metrics, %d); /* loss_scale, skipped_steps */\n", g->metrics.n);
    else EMIT("  metrics[%d] = G.scale;\n  metrics[%d] = (double)G.skipped;\n  ls_share(metrics + %d);\n", g->metrics.n,
              g->metrics.n + 1, g->metrics.n);
  }
  if (!g->metrics.n && c->seed < 0) EMIT("  (void)metrics;\n");
  EMIT("}\n");
}



/* The fifth column of a lowered plan's states table: the runtime reduces state k over dp (lower.h). */
static int cu_state_reduce(const void *ctx, int k) {
  const Cu *c = ctx;
  int gk = c->pipe ? c->pipe->stages[c->stage].gstate[k] : k;
  return c->lw->runtime_reduced[c->sp->g->states.a[gk]];
}

static void emit_tables(Cu *c) {
  CgTables o = {.inputs_row0 = true, .more_metrics = c->seed >= 0 ? "\"loss_scale\", \"skipped_steps\"" : NULL,
                .state_reduce = c->sp ? cu_state_reduce : NULL, .ctx = c};
  cg_emit_tables(c->out, &c->pl, &o);
  if (c->sp) cg_emit_global_tables(c->out, c->sp, c->lw, c->pipe ? &c->pipe->stages[c->stage] : NULL, &c->gt);
}

/* The constants' bits (f32 or i32, one 4-byte slot each) for G.konst. */
static void emit_konst(Cu *c) {
  EMIT("\nstatic const uint32_t konst_bits[%d] = {", c->pl.nconst ? c->pl.nconst : 1);
  int k = 0;
  for (int i = 0; i < c->g->n; i++) {
    const Node *n = nd(c, i);
    if (c->pl.nc[i].kind != CG_L_CONST) continue;
    uint32_t u;
    if (n->dtype == DT_I32) {
      int32_t v = (int32_t)n->fa[0];
      memcpy(&u, &v, 4);
    } else {
      float v = (float)n->fa[0];
      memcpy(&u, &v, 4);
    }
    EMIT("%s0x%08xu", k++ ? ", " : "", u);
  }
  if (!k) EMIT("0");
  EMIT("};\n");
}

static void emit_plan(Cu *c, const char *hash) {
  const TrainConf *t = c->t;
  const MeshConf *m = t->mesh;
  /* a lowered graph keeps the global micro-batch (dp ranks' samples) as its batch */
  int64_t dp = c->sp ? c->sp->dp : train_dp(t);
  CgPlanHead h = {.hash = hash, .work_bytes = "0, /* the work arena is on the device: DEVICE_WORK_BYTES */",
                  .micro = c->sp ? c->g->batch / c->sp->dp : c->g->batch, .vocab = cg_vocab(c->g, c->sp),
                  .nmetrics = c->g->metrics.n + (c->seed >= 0 ? 2 : 0)};
  if (c->seed >= 0 && c->ls)
    EMIT("/* RtPlan.step_metrics: the micro-batches reported skipped_steps before the step's update decided\n"
         " * whether it overflowed (on every dp, tp or pp rank, overflow_agree); the count after it, as a\n"
         " * sum over the micro-batches whose mean is the count */\n"
         "static void ls_step_metrics(RtRun *run, double *sums) {\n"
         "  (void)run;\n"
         "  double m[2] = {G.scale, (double)G.skipped};\n"
         "  ls_share(m);\n"
         "  sums[%d] = (double)cplan_plan.accum * m[1];\n"
         "}\n\n", c->g->metrics.n + 1);
  cg_emit_plan_head(c->out, &c->pl, t, &h);
  EMIT("    .lr_at = lr_at,\n    %s,\n    .update = update,\n    .eval_step = eval_step,\n",
       c->pipe ? ".forward = pp_forward,\n    .backward = pp_backward" : ".micro_step = micro_step");
  cg_emit_plan_mesh(c->out, dp, m ? m->ndevices : 1, m);
  if (cg_resume_hash()) EMIT("    .resume_hash = %s,\n", cg_c_string(cg_resume_hash()));
  if (c->sp) cg_emit_plan_lowered(c->out, c->sp, &c->gt);
  if (c->pipe) cg_emit_plan_pipeline(c->out, c->sp, c->pipe, c->stage, c->ppa, t);
  EMIT("    .to_device = to_device,\n    .to_host = to_host,\n    .reduce_grads = %s,\n    .loss_scaler = %s,\n",
       dp > 1 ? "reduce_grads" : "NULL", c->ls ? "loss_scaler" : "NULL");
  if (c->seed >= 0 && c->ls) EMIT("    .step_metrics = ls_step_metrics,\n");
  if (c->pipe) EMIT("    .param_copy = param_copy,\n    .state_copy = state_copy,\n");
  EMIT("};\n");
  if (c->pipe) /* plan.c's main (cg_emit_pipeline_main) calls each stage's */
    EMIT("\nvoid cplan_gpu_init_s%d(int argc, char **argv);\nvoid cplan_gpu_init_s%d(int argc, char **argv) { gpu_init(argc, argv); }\n",
         c->stage, c->stage);
  else
    EMIT("\nint main(int argc, char **argv) {\n"
         "  if (!has_flag(argc, argv, \"--help\")) gpu_init(argc, argv);\n"
         "  return rt_main(argc, argv, &cplan_plan);\n}\n");
}

/* kernels.cu as a C string literal, one source line per line. */
static void emit_source_string(Cu *c, const char *name, const char *src) {
  EMIT("\n/* kernels.cu: compiled at start by NVRTC for the present GPU (cached on disk) */\nstatic const char %s[] =\n", name);
  const char *p = src;
  if (!*p) EMIT("    \"\"");
  while (*p) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p + 1) : strlen(p);
    EMIT("    \"");
    for (size_t k = 0; k < n; k++) {
      unsigned char ch = (unsigned char)p[k];
      if (ch == '\\' || ch == '"') EMIT("\\%c", ch);
      else if (ch == '\n') EMIT("\\n");
      else if (ch < 32) EMIT("\\%03o", ch);
      else EMIT("%c", ch);
    }
    EMIT("\"\n");
    p += n;
  }
  EMIT(";\n");
}

/* ---- entry ------------------------------------------------------------------------------------------ */

/* One process per GPU: data, tensor, sequence and pipeline parallelism and ZeRO over all of the
 * mesh's devices (c->sp, once lowered: dp x tp x pp = devices). */
static bool check_conf(Cu *c) {
  const TrainConf *t = c->t;
  const StrategyConf *st = &t->strategy;
  int64_t devices = t->mesh ? t->mesh->ndevices : 1, dp = train_dp(t);
  if (c->sp && c->sp->dp * c->sp->tp * c->sp->pp != devices) {
    diag_error(st->span.file >= 0 ? st->span : t->mesh->span,
               "mesh '%s' has %lld CUDA devices, but the strategy runs dp %lld x tp %lld x pp %lld: the cuda backend runs "
               "one process per GPU over all of them", t->mesh && t->mesh->name ? t->mesh->name : "?", (long long)devices,
               (long long)c->sp->dp, (long long)c->sp->tp, (long long)c->sp->pp);
    return false;
  }
  if (train_lowered(t)) return true; /* checked once lowered (c->sp) */
  if (dp != devices) {
    diag_error(st->span.file >= 0 ? st->span : t->mesh->span,
               "mesh '%s' has %lld CUDA devices, but the strategy runs dp = %lld: the cuda backend runs one process "
               "per GPU with data parallelism over all of them", t->mesh && t->mesh->name ? t->mesh->name : "?",
               (long long)devices, (long long)dp);
    diag_hint("use `strategy = { dp = %lld }`, or a mesh of %lld GPU%s", (long long)devices, (long long)dp,
              dp == 1 ? "" : "s");
    return false;
  }
  return true;
}

static int64_t last_device_work;

static const char *type_name(int code) { return code == 1 ? "cps_bf16" : code == 2 ? "cps_f16" : "float"; }

/* Replaces the first `from` in s[lo, hi) by `to`; false when there is none. */
static bool replace_in(StrBuf *b, const char *s, size_t lo, size_t hi, const char *from, const char *to, size_t *at) {
  size_t n = strlen(from);
  for (size_t p = lo; p + n <= hi; p++)
    if (memcmp(s + p, from, n) == 0) {
      sb_printf(b, "%.*s%s", (int)(p - *at), s + *at, to);
      *at = p + n;
      return true;
    }
  return false;
}

/* The fused kernels of emit_cuda.c take float pointers (NAME(float *__restrict__ out, const
 * float *__restrict__ in0 ...)); each launched kernel gets its operands' storage types there
 * instead (cps_bf16, cps_f16 convert on load and store), so the body is unchanged. */
static char *typed_kernels(const Cu *c, char *src, char *err, size_t errlen, bool *ok) {
  StrBuf b = {0};
  size_t at = 0;
  for (int gi = 0; gi < c->pl.fu->ngroups; gi++) {
    const int *ty = c->ftypes[gi];
    const FusionGroup *gr = &c->pl.fu->groups[gi];
    if (!ty) continue;
    /* the kernels come in group order: each signature is after the previous one (at) */
    const char *sig = strstr(src + at, cp_fmt("void %s(", gr->kernel.name)), *end = sig ? strstr(sig, ") {") : NULL;
    size_t lo = sig ? (size_t)(sig - src) : 0, hi = end ? (size_t)(end - src) : 0;
    bool found = sig && end && lo >= at &&
                 replace_in(&b, src, lo, hi, "float *__restrict__ out", cp_fmt("%s *__restrict__ out", type_name(ty[0])), &at);
    for (int k = 0; found && k < gr->leaves.n; k++)
      found = replace_in(&b, src, at, hi, cp_fmt("const float *__restrict__ in%d ", k),
                         cp_fmt("const %s *__restrict__ in%d ", type_name(ty[k + 1]), k), &at);
    if (!found) {
      snprintf(err, errlen, "the signature of the fused kernel %s is not the expected one", gr->kernel.name);
      *ok = false;
      return src;
    }
  }
  sb_puts(&b, src + at);
  free(src);
  return (char *)sb_str(&b);
}

/* f16: the loss gradient's seed (times the scale at run time) and the gradient accumulators
 * ls_check unscales (offset, length pairs into G.state) */
static void emit_loss_scaling(Cu *c) {
  const Graph *g = c->g;
  int n = 0;
  EMIT("#define LOSS_SCALING %d\n#define SEED_VALUE %.17g\nstatic const long long grad_tab[] = {", c->ls,
       c->seed >= 0 ? c->seed_val : 1.0);
  for (int k = 0; k < g->states.n; k++) {
    const Node *s = nd(c, g->states.a[k]);
    if (s->ia[1] || !c->ls) continue;
    EMIT("%s%lldLL, %lldLL", n++ ? ", " : "", (long long)c->pl.nc[g->states.a[k]].off, (long long)numel(s));
  }
  EMIT("%s};\n#define NGRADS %d\n", n ? "" : "0, 0", n);
}

/* The tables and the phase functions of plan.c's body, into c->out (cg_plan_emit's emit: twice). */
static bool emit_phases(void *ctx) {
  Cu *c = ctx;
  c->knames.n = c->norm_shapes.n = 0;
  c->kindex = (CpMap){0};
  emit_tables(c);
  cg_emit_lr(c->out, c->t);
  if (c->pipe) {
    c->only_role = ROLE_FWD;
    emit_phase_fn(c, CG_PH_TRAIN, "static void pp_forward(RtRun *run, const void *const *inputs, double *loss, double *metrics)",
                  "one micro-batch: the inputs to this slot's device buffers, this stage's forward pass (what the backward "
                  "reads stays in this slot's arena)");
    c->only_role = ROLE_BWD;
    emit_phase_fn(c, CG_PH_TRAIN, "static void pp_backward(RtRun *run, const void *const *inputs)",
                  "the same micro-batch (the same arena), this stage's backward pass and gradient accumulation");
    c->only_role = -1;
    emit_phase_fn(c, CG_PH_TRAIN, "static double update_grad_sumsq(RtRun *run)",
                  "once per step, before update: this stage's part of the squared gradient norm (its gradients')");
  } else
    emit_phase_fn(c, CG_PH_TRAIN, "static void micro_step(RtRun *run, const void *const *inputs, double *loss, double *metrics)",
                  "one micro-batch: the inputs to the device, the forward pass, the backward pass, gradient accumulation");
  if (fused_adamw(c)) emit_adamw_fused(c);
  emit_phase_fn(c, CG_PH_TRAIN, "static double update(RtRun *run)",
                "once per step: clipping and the optimizer update; returns the gradient norm before clipping");
  emit_phase_fn(c, CG_PH_EVAL, "static void eval_step(RtRun *run, const void *const *inputs, double *loss, double *metrics)",
                "evaluation: the forward pass only, dropout off");
  return c->ok;
}

/* out_c NULL (a pipeline stage): decide only, and record the types its crossings send in. */
bool cg_emit_cu(FILE *out_c, FILE *out_cu, const Graph *g, const StratPlan *sp, const Lowered *lw, const Pipeline *pipe,
                int stage, const TrainConf *t, const char *source_hash) {
  Cu cs = {.g = pipe ? pipe->stages[stage].g : g, .t = t, .ok = true, .sp = sp, .lw = lw, .pipe = pipe, .stage = stage,
           .ppa = sp ? sp->naxes : 0, .only_role = -1, .cur = -1}, *c = &cs;
  g = c->g;
  if (!check_conf(c) || !cg_check_inputs(g, t, false)) return false;
  c->pl = (CgPlan){.g = g, .fu = cg_fusion_enabled() ? fusion_run(g) : cg_no_fusion(g), .sides = cu_sides,
                   .bytes = cu_bytes, .ctx = c};
  if (pipe) c->pl.keep = &pipe->stages[stage].norm_part, c->pl.nkeep = 1; /* update_grad_sumsq's */
  c->lpc = t->precision == PREC_BF16 ? 1 : t->precision == PREC_F16 ? 2 : 0;
  c->ftypes = cp_alloc(sizeof(int *) * (size_t)(c->pl.fu->ngroups + 1));
  cg_plan_place(&c->pl);
  decide_storage(c);
  index_graph(c);
  find_accums(c);
  find_epilogues(c);
  find_qkv(c);
  find_inplace_adds(c);
  find_attn_inplace(c);
  find_bgrads(c);
  find_pitched(c);
  find_tgrads(c);
  find_accum_adds(c);
  find_ce_fused(c);
  find_res_norms(c);
  size_casts(c);
  c->ls = c->seed >= 0 || (pipe && c->lpc == 2);
  if (!cg_check_sizes(g, "cuda")) return false;
  if (c->lpc == 2 && c->seed < 0 && g->loss >= 0) {
    diag_error(t->span, "precision f16 needs loss scaling, but the loss gradient of model '%s' has no constant seed outside fused kernels",
               g->model_name);
    return false;
  }
  if (g->metrics.n + 3 > 63) {
    diag_error(t->span, "more than 63 metrics are not supported on the cuda backend yet");
    return false;
  }
  if (!out_c) {
    record_wire_types(c);
    return true;
  }
  c->irline = cg_ir_lines(g);
  /* the body first: the kernel table and kernels.cu are known once every launch is emitted */
  FILE *body = tmpfile();
  if (!body) {
    diag_error(t->span, "cannot create a temporary file for plan.c");
    return false;
  }
  c->out = body;
  if (!cg_plan_emit(&c->pl, body, emit_phases, c)) {
    fclose(body);
    return false;
  }
  int64_t work = cg_plan_peak(&c->pl);
  last_device_work = work;
  emit_plan(c, source_hash);
  if (!c->ok) {
    fclose(body);
    return false;
  }
  /* kernels.cu: the storage types, the fused kernels (emit_cuda.c, typed), the support kernels */
  char *fused = NULL, *cu = NULL;
  size_t flen = 0, culen = 0;
  FILE *m = open_memstream(&fused, &flen);
  char err[1024];
  bool ok = m && cg_emit_cuda(m, c->pl.fu->kernels, c->pl.fu->ngroups, g->model_name, err, sizeof err);
  if (m) fclose(m);
  if (ok) fused = typed_kernels(c, fused, err, sizeof err, &ok);
  if (!ok) {
    diag_error(SPAN_NONE, "generating the CUDA kernels failed (internal error): %s", err);
    fclose(body);
    return false;
  }
  m = open_memstream(&cu, &culen);
  if (m) {
    fputs(cu_types_src, m);
    fputs(fused, m);
    fputs(cu_support_src, m);
    fclose(m);
  }
  if (!cu) {
    diag_error(SPAN_NONE, "cannot build kernels.cu in memory");
    fclose(body);
    return false;
  }
  if (out_cu) fputs(cu, out_cu);
  /* plan.c: the prelude, the kernel table, kernels.cu, the helpers, then the body */
  c->out = out_c;
  const char *src = t->span.file >= 0 ? src_path(t->span.file) : "?";
  EMIT("/* plan.c: the CUDA training program of model '%s' from %s, generated by cplanc %s. Do not edit.\n"
       " *\n"
       " * One process per GPU. micro_step copies one micro-batch (%lld samples) to the device, runs the forward and\n"
       " * backward pass there and adds the gradients into the accumulators; update clips and applies\n"
       " * the %s update once per step; eval_step runs the forward pass only. Params live in G.params\n"
       " * (P), optimizer state and gradient accumulators in G.state (S), everything else at planned\n"
       " * offsets of the device arena G.work (F: f32, I: i32, B: bytes); run->params and run->state are\n"
       " * the host mirrors the runtime initializes and checkpoints (to_device, to_host). Fused and\n"
       " * support kernels come from kernels.cu below (NVRTC at start); matmuls run on cuBLASLt; norms,\n"
       " * softmax, attention, cross_entropy, embedding and rope on kernels/cuda (kernels_cuda.h). */\n",
       g->model_name, src, CPLAN_VERSION, (long long)(c->sp ? g->batch / c->sp->dp : g->batch), /* this rank's */
       optimizer_name(t->optimizer.kind));
  EMIT("#include \"cplanrt.h\"\n#include \"cplanrt_cuda.h\"\n#include \"kernels_cuda.h\"\n\n#include <math.h>\n"
       "#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\n");
  if (pipe) /* one of several stage files linked into one program: the names stay apart */
    EMIT("#define cplan_plan cplan_plan_s%d\nextern const RtPlan *const cplan_stages[];\n", stage);
  EMIT("extern const RtPlan cplan_plan;\n\n");
  EMIT("#define PP_STAGE %d /* pipeline parallelism: %s */\n#define PP_STAGES %d\n", pipe ? stage : -1,
       pipe ? "this stage's device memory is made when the rank first runs it" : "none", pipe ? pipe->pp : 0);
  EMIT("#define NKERNELS %d\n#define NINPUTS %d\n#define DEVICE_WORK_BYTES %lldLL /* training %s, evaluation %s */\n"
       "#define GEMM_WORKSPACE ((size_t)32 << 20) /* cuBLASLt's workspace */\n",
       c->knames.n, g->inputs.n, (long long)(work ? work : MP_ALIGN), cp_bytes_str((double)c->pl.work[CG_PH_TRAIN]),
       cp_bytes_str((double)c->pl.work[CG_PH_EVAL]));
  static const char *const ptext[] = {"f32", "bf16 activations, f32 master weights",
                                      "f16 activations, f32 master weights, dynamic loss scaling"};
  EMIT("#define LP_CODE %d /* precision %s: the storage code of activations and of the params' copy */\n"
       "#define PRECISION_TEXT \"%s\"\n",
       c->lpc, precision_name(t->precision), ptext[c->lpc]);
  emit_loss_scaling(c);
  EMIT("#define COLSUM_PARTS 64 /* row chunks of a bias gradient's column sums */\n#define COLSUM_MAX_COLS %lldLL\n",
       (long long)(c->colsum_cols ? c->colsum_cols : 1));
  EMIT("#define NNORM %d /* the norm backwards' shapes: rows, c (their dw/db workspace) */\nstatic const int norm_shapes[] = {",
       c->norm_shapes.n / 2);
  for (int k = 0; k < c->norm_shapes.n; k++) EMIT("%s%lld", k ? ", " : "", (long long)c->norm_shapes.a[k]);
  EMIT("%s};\n", c->norm_shapes.n ? "" : "0");
  EMIT("#define PROF_MAX 16384 /* events per phase (CPLAN_PROFILE=1) */\n#define PROF_NODES %d\n"
       "static const char *const prof_class[PROF_NODES + 1] = {\n", g->n);
  for (int i = 0; i < g->n; i++) EMIT("    %s,\n", cg_executed(nd(c, i)) ? cg_c_string(prof_class(c, i)) : "NULL");
  EMIT("    NULL};\n");
  /* per node: its FLOPs (the op table's count: causal attention counted whole, a gradient as its
   * forward) and about the bytes it moves; the report divides them by the node's measured time */
  EMIT("static const double prof_work[2 * PROF_NODES + 2] = {");
  double *leaf_bytes = cp_alloc(sizeof(double) * (size_t)(c->pl.fu->ngroups + 1));
  for (int k = 0; k < c->pl.fu->ngroups; k++) leaf_bytes[k] = -1;
  for (int i = 0; i < g->n; i++)
    EMIT("%s%.6g, %.6g", i ? ", " : "", cg_executed(nd(c, i)) ? ir_node_flops(g, i) : 0.0,
         cg_executed(nd(c, i)) ? prof_bytes(c, i, leaf_bytes) : 0.0);
  EMIT("%s0, 0};\n", g->n ? ", " : "");
  EMIT("\nstatic const char *const kernel_names[NKERNELS + 1] = {");
  for (int k = 0; k < c->knames.n; k++) EMIT("%s\"%s\"", k ? ", " : "", c->knames.a[k]);
  EMIT("%sNULL};\n", c->knames.n ? ", " : "");
  emit_source_string(c, "kernels_cu", cu);
  free(cu);
  emit_konst(c);
  fprintf(out_c, "\n%s", cu_host_src);
  cg_append(out_c, body);
  return c->ok;
}

/* ---- building: plan.c -> the program ------------------------------------------------------------------ */

/* The settings checked, then g lowered per rank (tp, sp, ZeRO, pp: sp, lw and pipe set) or to its
 * training graph (they stay NULL). False after a diagnostic. */
static bool lower_cuda(Graph *g, const TrainConf *t, const StratPlan **sp, const Lowered **lw, const Pipeline **pipe) {
  Cu probe = {.t = t};
  *sp = NULL, *lw = NULL, *pipe = NULL;
  if (!check_conf(&probe)) return false;
  return train_lowered(t) ? build_lower(g, t, sp, lw, pipe) : train_graph(g, t);
}

/* The crossings' types of a pipeline before any stage is emitted: which ones a receiver keeps f32,
 * then (the senders keeping those f32 too) what each sends in. */
static bool wire_types(const StratPlan *sp, const Lowered *lw, const Pipeline *pipe, const TrainConf *t,
                       const char *hash) {
  wire_type.n = 0, wire_f32.n = 0;
  bool ok = true;
  for (int pass = 0; pass < 2; pass++)
    for (int k = 0; pipe && k < pipe->pp && ok; k++) ok = cg_emit_cu(NULL, NULL, lw->g, sp, lw, pipe, k, t, hash);
  return ok;
}

bool cg_emit_cuda_program(FILE *out, bool kernels, Graph *g, const TrainConf *t) {
  const StratPlan *sp;
  const Lowered *lw;
  const Pipeline *pipe;
  if (!lower_cuda(g, t, &sp, &lw, &pipe) || !wire_types(sp, lw, pipe, t, "emit")) return false;
  FILE *null = fopen("/dev/null", "w");
  if (!null) {
    diag_error(SPAN_NONE, "cannot open /dev/null: %s", strerror(errno));
    return false;
  }
  bool ok = true;
  for (int k = 0; k < (pipe ? pipe->pp : 1) && ok; k++) {
    if (pipe) fprintf(out, "/* ==== %s_s%d.%s ==== */\n", kernels ? "kernels" : "plan", k, kernels ? "cu" : "c");
    ok = cg_emit_cu(kernels ? null : out, kernels ? out : NULL, lw ? lw->g : g, sp, lw, pipe, k, t, "emit");
  }
  fclose(null);
  if (ok && pipe && !kernels) {
    fprintf(out, "/* ==== plan.c ==== */\n");
    cg_emit_pipeline_main(out, pipe->pp, true);
  }
  return ok;
}

#if CPLAN_HAVE_CUDA
typedef CpArgv Argv;

/* cc plan.c (and a pipeline's stage files plan_s0.c ...) with the runtime, the CUDA runtime part
 * and kernels, and the CUDA libraries. */
static bool compile_cu(const char *dir, int stages, const char *out) {
  const char *home = getenv("CPLAN_HOME"), *cc = getenv("CPLAN_CC");
  const char *lib_rt, *lib_rtcu, *lib_kcu;
  Argv a = {0};
  cp_argv_words(&a, cc && *cc ? cc : CPLAN_CC);
  cp_argv_words(&a, "-std=gnu11 -O2 -w");
  if (home && *home) {
    VEC_PUSH(a, cp_fmt("-I%s/include", home));
    lib_rt = cp_fmt("%s/lib/libcplanrt.a", home), lib_rtcu = cp_fmt("%s/lib/libcplanrt_cuda.a", home);
    lib_kcu = cp_fmt("%s/lib/libcplankernels_cuda.a", home);
  } else {
    VEC_PUSH(a, "-I" CPLAN_SOURCE_DIR "/runtime");
    VEC_PUSH(a, "-I" CPLAN_SOURCE_DIR "/kernels/cuda");
    lib_rt = CPLAN_BINARY_DIR "/runtime/libcplanrt.a", lib_rtcu = CPLAN_BINARY_DIR "/runtime/libcplanrt_cuda.a";
    lib_kcu = CPLAN_BINARY_DIR "/kernels/cuda/libcplankernels_cuda.a";
  }
  const char *libs[3] = {lib_rtcu, lib_kcu, lib_rt};
  for (int k = 0; k < 3; k++)
    if (access(libs[k], R_OK) != 0) {
      diag_error(SPAN_NONE, "cannot find the library %s that CUDA training programs link with", libs[k]);
      diag_hint("build cplan with the CUDA toolkit first (cmake -DCPLAN_CUDA=ON, cmake --build)");
      return false;
    }
  cp_argv_words(&a, CPLAN_CUDA_CFLAGS);
  cp_argv_words(&a, CPLAN_MPI_CFLAGS);
  cp_argv_words(&a, CPLAN_SANITIZE_CFLAGS);
  VEC_PUSH(a, cp_fmt("%s/plan.c", dir));
  for (int k = 0; k < stages; k++) VEC_PUSH(a, cp_fmt("%s/plan_s%d.c", dir, k));
  VEC_PUSH(a, "-o");
  VEC_PUSH(a, out);
  for (int k = 0; k < 3; k++) VEC_PUSH(a, libs[k]);
  cp_argv_words(&a, CPLAN_CUDA_LIBS);
  cp_argv_words(&a, CPLAN_EXTRA_LIBS);
  cp_argv_words(&a, CPLAN_MPI_LIBS);
  VEC_PUSH(a, (const char *)NULL);
  const char *log = cp_fmt("%s/cc.log", dir);
  if (cp_run_logged(&a, log)) return true;
  StrBuf cmd = {0};
  for (int k = 0; a.a[k]; k++) sb_printf(&cmd, "%s%s", k ? " " : "", a.a[k]);
  fprintf(stderr, "cplanc: internal error: the generated CUDA program does not compile. This is a bug in cplanc;\n"
                  "please report it with the file. The command was:\n  %s\n%s",
          sb_str(&cmd), (cp_read_text(log) ? cp_read_text(log) : ""));
  diag_error(SPAN_NONE, "compiling the generated plan.c failed (internal error, see above)");
  return false;
}

static bool write_file(const char *path, FILE **f) {
  if ((*f = fopen(path, "w"))) return true;
  diag_error(SPAN_NONE, "cannot write %s: %s", path, strerror(errno));
  return false;
}

/* plan.c and kernels.cu into dir, or under pp each stage's plan_sN.c and kernels_sN.cu and the
 * pipeline's plan.c; the stage files' count to *stages */
static bool emit_files(const char *dir, Graph *g, const StratPlan *sp, const Lowered *lw, const Pipeline *pipe,
                       const TrainConf *t, const char *hash, int *stages) {
  *stages = pipe ? pipe->pp : 0;
  int64_t most = 0;
  bool ok = wire_types(sp, lw, pipe, t, hash);
  for (int k = 0; k < (pipe ? pipe->pp : 1) && ok; k++) {
    const char *pc = pipe ? cp_fmt("%s/plan_s%d.c", dir, k) : cp_fmt("%s/plan.c", dir);
    const char *pk = pipe ? cp_fmt("%s/kernels_s%d.cu", dir, k) : cp_fmt("%s/kernels.cu", dir);
    FILE *fc = NULL, *fk = NULL;
    ok = write_file(pc, &fc) && write_file(pk, &fk);
    ok = ok && cg_emit_cu(fc, fk, lw ? lw->g : g, sp, lw, pipe, k, t, hash);
    if (fc && fclose(fc) != 0) ok = false;
    if (fk && fclose(fk) != 0) ok = false;
    most = last_device_work > most ? last_device_work : most;
  }
  last_device_work = most;
  if (!ok || !pipe) return ok;
  FILE *f = NULL;
  if (!write_file(cp_fmt("%s/plan.c", dir), &f)) return false;
  cg_emit_pipeline_main(f, pipe->pp, true);
  return fclose(f) == 0;
}

bool cg_build_cuda(Graph *g, const TrainConf *t, const BuildOpts *o) {
  const StratPlan *sp;
  const Lowered *lw;
  const Pipeline *pipe;
  if (!lower_cuda(g, t, &sp, &lw, &pipe)) return false;
  const char *tmp = getenv("TMPDIR");
  char *dir = cp_fmt("%s/cplan-build-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    diag_error(SPAN_NONE, "cannot create a temporary directory %s: %s", dir, strerror(errno));
    return false;
  }
  int stages = 0;
  bool ok = emit_files(dir, g, sp, lw, pipe, t, o->hash ? o->hash : "", &stages);
  VEC(const char *) files = {0};
  VEC_PUSH(files, "plan.c");
  VEC_PUSH(files, stages ? "" : "kernels.cu");
  for (int k = 0; k < stages; k++) {
    VEC_PUSH(files, cp_fmt("plan_s%d.c", k));
    VEC_PUSH(files, cp_fmt("kernels_s%d.cu", k));
  }
  for (int k = 0; ok && o->keep_c && k < files.n; k++) {
    const char *to = cp_fmt("%s/%s", o->keep_c, files.a[k]);
    if (!*files.a[k]) continue;
    if ((mkdir(o->keep_c, 0755) != 0 && errno != EEXIST) || !cp_copy_file(cp_fmt("%s/%s", dir, files.a[k]), to)) {
      diag_error(SPAN_NONE, "--keep-c: cannot write %s: %s", to, strerror(errno));
      ok = false;
    }
  }
  ok = ok && compile_cu(dir, stages, o->out);
  for (int k = 0; k < files.n; k++)
    if (*files.a[k]) unlink(cp_fmt("%s/%s", dir, files.a[k]));
  unlink(cp_fmt("%s/cc.log", dir));
  rmdir(dir);
  if (ok && !o->quiet)
    fprintf(stderr, "cplanc: built %s (model %s, %d param tensors, CUDA%s, device work arena %s%s)\n", o->out, g->model_name,
            g->params.n, stages ? cp_fmt(", %d pipeline stages", stages) : "", cp_bytes_str((double)last_device_work),
            stages ? " per slot of the largest stage" : "");
  return ok;
}
#else
bool cg_build_cuda(Graph *g, const TrainConf *t, const BuildOpts *o) {
  (void)g, (void)o;
  diag_error(t->mesh ? t->mesh->span : t->span, "mesh '%s' has %s devices, but this cplanc was built without the CUDA toolkit",
             t->mesh && t->mesh->name ? t->mesh->name : "?", t->mesh ? t->mesh->device.name : "?");
  diag_hint("configure cplan with the CUDA toolkit and NCCL (cmake -DCPLAN_CUDA=ON) to build GPU programs");
  return false;
}
#endif
