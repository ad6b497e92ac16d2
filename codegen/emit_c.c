/* emit_c.c: the C emitter. Turns a training Graph into plan.c, the host program of one CPU device
 * (DESIGN.md §6): one function per phase, one kernel call per IR node (or per group of GRAD nodes
 * one backward kernel computes), each preceded by the IR node and its .cplan line.
 *
 * Where values live (cg_plan.h's rules):
 *   PARAM -> run->params + offset (P(off)); STATE -> run->state + offset (S(off));
 *   INPUT -> the runtime's input arrays; CONST -> a static array; SCALAR_IN -> a local;
 *   views (reshape, ASSIGN/ACCUM results, gradients that equal their dy) -> the buffer they view;
 *   everything else -> run->work at an offset memplan.c assigns by liveness (F(off), I(off)).
 * A transpose whose every reader is a matmul (or its gradient) is not materialized: the GEMM
 * reads its input with the transpose flag. */
#include "codegen.h"
#include "cg_common.h"
#include "cg_plan.h"

#include "../compiler/fusion.h"
#include "../compiler/lower.h"
#include "../compiler/pipeline.h"
#include "../compiler/memplan.h"
#include "../compiler/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct Cg {
  const Graph *g;
  const TrainConf *t;
  CgPlan pl;              /* where values live, the fused groups (compiler/fusion.h), the arena */
  FILE *out;
  char **irline;          /* the IR printer's line of each node */
  int ph;                 /* the phase being emitted */
  bool ok;
  CgGlobal gt;            /* tensor parallelism: the whole tensors' floats (cg_emit_global_tables) */
  const StratPlan *sp;    /* tensor parallelism: the placements and the lowering g came from */
  const Lowered *lw;      /* (NULL: a one-device or data-parallel plan) */
  const Pipeline *pipe;   /* pipeline parallelism: the stages (NULL: none); g is stage `stage`'s */
  int stage;
  int ppa;                /* the pp axis among the strategy axes */
  int only_role;          /* emit_phase_fn: only nodes of this role (-1: every role of the phase) */
  int cur;                /* the node whose calls are being emitted, or -1 (cg_plan_name) */
} Cg;

static int64_t last_work_bytes;
static const char *resume_hash_; /* cg_set_resume_hash's */
void cg_set_resume_hash(const char *hash) { resume_hash_ = hash; }
const char *cg_resume_hash(void) { return resume_hash_; }
static const Fusion *last_fusion;
/* the LLVM kernels of the last cg_emit_c: the fused groups' kernels, then the row kernels
 * (softmax, norms, last-axis sums), one per distinct (op, rows, n, eps) */
static CgKernel *last_kernels;
static int last_nkernels;
static VEC(CgKernel) row_kernels;
/* "s1_" while a pipeline stage is emitted: its kernels' symbols stay apart from other stages' */
static const char *sym_prefix = "";

int64_t cg_last_work_bytes(void) { return last_work_bytes; }

int cg_last_kernels(const CgKernel **kernels) {
  *kernels = last_kernels;
  return last_nkernels;
}

/* CPLAN_ROWS=0 in the environment calls the hand-written kf_ kernels instead of the LLVM row
 * kernels (an A/B switch for bench/cpu_step.sh, as CPLAN_FUSION=0 is for fusion). */
static bool rows_enabled(void) {
  const char *e = getenv("CPLAN_ROWS");
  return !(e && strcmp(e, "0") == 0);
}

/* The name of the row kernel for (op, rows, n, eps), added to row_kernels on first use: layers
 * of the same shape share one kernel. */
static const char *row_kernel(CgRowOp op, int64_t rows, int64_t n, float eps) {
  for (int k = 0; k < row_kernels.n; k++) {
    const CgKernel *r = &row_kernels.a[k];
    if (r->row == op && r->shape[0] == rows && r->shape[1] == n && r->eps == eps) return r->name;
  }
  static const char *const names[CG_ROW__COUNT] = {
      [CG_ROW_SOFTMAX_FWD] = "softmax",         [CG_ROW_SOFTMAX_BWD] = "softmax_bwd",
      [CG_ROW_LOG_SOFTMAX_FWD] = "log_softmax", [CG_ROW_LOG_SOFTMAX_BWD] = "log_softmax_bwd",
      [CG_ROW_LAYER_NORM_FWD] = "layer_norm",   [CG_ROW_LAYER_NORM_BWD] = "layer_norm_bwd",
      [CG_ROW_RMS_NORM_FWD] = "rms_norm",       [CG_ROW_RMS_NORM_BWD] = "rms_norm_bwd",
      [CG_ROW_SUM_FWD] = "sum",                 [CG_ROW_MEAN_FWD] = "mean"};
  CgKernel r = {.name = cp_fmt("%sk_row%d_%s", sym_prefix, row_kernels.n, names[op]), .rank = 2, .shape = {rows, n}, .row = op,
                .eps = eps};
  VEC_PUSH(row_kernels, r);
  return r.name;
}

/* ---- small helpers ------------------------------------------------------------------------- */

static const Node *nd(const Cg *c, int i) { return &c->g->nodes[i]; }
/* the devices on logical axis a of the strategy (tensor parallelism) */
static int64_t axis_n(const Cg *c, int a) { return c->sp->axes[a].n; }
static const Node *in(const Cg *c, int i, int k) { return &c->g->nodes[c->g->nodes[i].in[k]]; }
static int64_t numel(const Node *n) { return shape_numel(&n->shape); }

static bool unsupported(Cg *c, int i, const char *what) {
  diag_error(nd(c, i)->span, "%s is not supported on the cpu backend yet", what);
  c->ok = false;
  return false;
}


/* ---- where values live: cg_plan.c's rules, the CPU kernels' side buffers ------------------------ */

/* The side buffers of node i's kernels (CgPlan.sides). */
static void cpu_sides(const void *ctx, int i, CgPlace *x) {
  const Cg *c = ctx;
  const Node *n = nd(c, i);
  if (n->op == OP_LAYER_NORM) x->aux = 2 * cg_rows(n) * 4;
  if (n->op == OP_RMS_NORM) x->aux = cg_rows(n) * 4;
  if (n->op == OP_SDPA) /* the probabilities [nb, tq, tk] */
    x->aux = n->shape.d[0] * n->shape.d[1] * n->shape.d[2] * in(c, i, 1)->shape.d[2] * 4;
  if (n->op == OP_DROPOUT) x->scratch = numel(n);
  if (n->op == OP_ALL_GATHER) x->scratch = (int64_t)ir_node_bytes(c->g, i);
  if (n->op == OP_REDUCE_SCATTER) x->scratch = (int64_t)ir_node_bytes(c->g, n->in[0]);
  if (n->op == OP_ALL_TO_ALL) x->scratch = 2 * (int64_t)ir_node_bytes(c->g, n->in[0]); /* sent, received */
  if (n->op == OP_CROSS_ENTROPY && n->ia[0] > 0) { /* m and s for the backward, the gathered maxima */
    int64_t rows = cg_rows(in(c, i, 0));
    x->aux = 2 * rows * 4;
    x->scratch = rows * 4 * axis_n(c, (int)n->ia[0] - 1);
  }
  if (n->op == OP_ARGMAX && n->ia[1] > 0) /* vocab-parallel: this rank's (max, index) pairs, then every rank's */
    x->scratch = 2 * cg_rows(in(c, i, 0)) * 4 * (1 + axis_n(c, (int)n->ia[1] - 1));
  if (n->op == OP_GRAD && nd(c, n->fwd)->op == OP_DROPOUT) x->scratch = numel(n);
  if (n->op == OP_GRAD && nd(c, n->fwd)->op == OP_SDPA) { /* one key/value head's [group * tq, tk] */
    const int64_t *q = nd(c, nd(c, n->fwd)->in[0])->shape.d, *k = nd(c, nd(c, n->fwd)->in[1])->shape.d;
    x->scratch = q[1] / k[1] * q[2] * k[2] * 4;
  }
}

/* ---- operands -------------------------------------------------------------------------------- */

/* The C expression of node i's data pointer in the phase being emitted. */
static const char *ptr(const Cg *c, int i) {
  int r = cg_root(&c->pl, i);
  const CgPlace *x = &c->pl.nc[r];
  const Node *n = nd(c, r);
  switch (x->kind) {
  case CG_L_PARAM: return cp_fmt("P(%lld)", (long long)x->off);
  case CG_L_STATE: return cp_fmt("S(%lld)", (long long)x->off);
  case CG_L_INPUT: return cp_fmt("in%lld", (long long)x->off);
  case CG_L_CONST: return cp_fmt("K%d", r);
  case CG_L_SCALAR: return cp_fmt("sc%d", r);
  case CG_L_WORK:
    cg_plan_name(&c->pl, c->ph, r, c->cur);
    return cp_fmt("%s(%lld)", n->dtype == DT_I32 ? "I" : "F", (long long)x->woff[c->ph]);
  default: cp_unreachable();
  }
}

static const char *aux_ptr(const Cg *c, int i, int64_t extra_floats) {
  return cp_fmt("F(%lld)", (long long)(c->pl.nc[i].aoff[c->ph] + extra_floats * 4));
}

/* Emits a call of the row kernel for (op, rows, n, eps) with its out[] and in[] pointers (llvm.h
 * lists them per op). Returns false, emitting nothing, when row kernels are off or the shape is
 * not one they take; the caller then emits its kf_ call. */
static bool emit_row_call(Cg *c, CgRowOp op, int64_t rows, int64_t n, double eps, const char *const *outs,
                          const char *const *ins) {
  if (!rows_enabled() || rows < 0 || n < 1 || n > INT32_MAX || rows > INT32_MAX) return false;
  int nout, nin;
  cg_llvm_row_arity(op, &nout, &nin);
  StrBuf o = {0}, a = {0};
  for (int k = 0; k < nout; k++) sb_printf(&o, "%s%s", k ? ", " : "", outs[k]);
  for (int k = 0; k < nin; k++) sb_printf(&a, "%s%s", k ? ", " : "", ins[k]);
  fprintf(c->out, "  %s((float *const[]){%s}, (const float *const[]){%s});\n", row_kernel(op, rows, n, (float)eps),
          sb_str(&o), sb_str(&a));
  return true;
}

static const char *shape_ints(const Shape *s) {
  StrBuf b = {0};
  sb_puts(&b, "(const int[]){");
  for (int k = 0; k < s->rank; k++) sb_printf(&b, "%s%lld", k ? ", " : "", (long long)s->d[k]);
  if (s->rank == 0) sb_puts(&b, "1");
  sb_puts(&b, "}");
  return sb_str(&b);
}


/* ---- forward kernels --------------------------------------------------------------------- */

#define EMIT(...) fprintf(c->out, __VA_ARGS__)

static const char *const unary_k[] = {"K_NEG", "K_EXP", "K_LOG", "K_SQRT", "K_RSQRT", "K_TANH",
                                       "K_SIGMOID", "K_RELU", "K_GELU", "K_SILU", "K_SQUARE", "K_POW",
                                       "K_ABS", "K_CLAMP_MIN", "K_CLAMP_MAX", "K_ERF", "K_SIN", "K_COS"};
static const char *const binary_k[] = {"K_ADD", "K_SUB", "K_MUL", "K_DIV", "K_MAXIMUM", "K_MINIMUM", "K_MOD",
                                        "K_FLOORDIV", "K_EQ", "K_NE", "K_LT", "K_LE", "K_GT", "K_GE"};

/* An operand repeats with period numel(x) over the output when x's shape, leading 1s dropped, is
 * a suffix of the output's shape. */
static bool periodic(const Shape *x, const Shape *out) {
  int lo = 0;
  while (lo < x->rank && x->d[lo] == 1) lo++;
  int r = x->rank - lo;
  if (r > out->rank) return false;
  for (int k = 0; k < r; k++)
    if (x->d[lo + k] != out->d[out->rank - r + k]) return false;
  return true;
}

static void emit_binary(Cg *c, int i) {
  const Node *n = nd(c, i), *a = in(c, i, 0), *b = in(c, i, 1);
  const char *op = binary_k[n->op - OP_ADD];
  if (a->dtype == DT_I32 && b->dtype == DT_I32) {
    EMIT("  k_binary_i32_forward(%s, %s, %s, %s, %d, %s, %s, %d);\n", op, ptr(c, i), ptr(c, n->in[0]),
         shape_ints(&a->shape), a->shape.rank, ptr(c, n->in[1]), shape_ints(&b->shape), b->shape.rank);
  } else if (a->dtype == DT_I32 || b->dtype == DT_I32) {
    unsupported(c, i, "arithmetic mixing i32 and float tensors");
    diag_hint("convert the i32 operand first: float(x)");
  } else if (periodic(&a->shape, &n->shape) && periodic(&b->shape, &n->shape)) {
    EMIT("  kf_binary_period_forward(%s, %s, %s, %lld, %s, %lld, %lld);\n", op, ptr(c, i), ptr(c, n->in[0]),
         (long long)numel(a), ptr(c, n->in[1]), (long long)numel(b), (long long)numel(n));
  } else {
    EMIT("  k_binary_forward(%s, %s, %s, %s, %d, %s, %s, %d);\n", op, ptr(c, i), ptr(c, n->in[0]),
         shape_ints(&a->shape), a->shape.rank, ptr(c, n->in[1]), shape_ints(&b->shape), b->shape.rank);
  }
}

/* A unary kernel's `c`: pow's exponent, clamp_min's and clamp_max's bound. */
static double unary_c(const Node *n) {
  return n->op == OP_POW || n->op == OP_CLAMP_MIN || n->op == OP_CLAMP_MAX ? n->fa[0] : 0;
}

static void emit_unary(Cg *c, int i) {
  const Node *n = nd(c, i);
  if (n->dtype != DT_F32 || in(c, i, 0)->dtype != DT_F32) {
    unsupported(c, i, cp_fmt("%s of an i32 tensor", ir_ops[n->op].name));
    return;
  }
  EMIT("  kf_unary_forward(%s, %s, %s, %lld, %s);\n", unary_k[n->op - OP_NEG], ptr(c, i), ptr(c, n->in[0]),
       (long long)numel(n), cg_flt(unary_c(n)));
}

/* where(cond, a, b): float, or two i32 branches copied whole (k_where_i32_forward) */
static void emit_where(Cg *c, int i) {
  const Node *n = nd(c, i), *q = in(c, i, 0), *a = in(c, i, 1), *b = in(c, i, 2);
  EMIT("  k_where%s_forward(", n->dtype == DT_I32 ? "_i32" : "");
  EMIT("%s, %s, %d, %s, %s, %d, %s, %s, %d, %s, %s, %d);\n", ptr(c, i), shape_ints(&n->shape),
       n->shape.rank, ptr(c, n->in[0]), shape_ints(&q->shape), q->shape.rank, ptr(c, n->in[1]), shape_ints(&a->shape),
       a->shape.rank, ptr(c, n->in[2]), shape_ints(&b->shape), b->shape.rank);
}

static void emit_reduce(Cg *c, int i) {
  const Node *n = nd(c, i), *x = in(c, i, 0);
  int64_t o, l, r;
  if (!cg_reduce_dims(n, &x->shape, &o, &l, &r)) {
    unsupported(c, i, "a reduction over axes that are not adjacent");
    return;
  }
  if (x->dtype == DT_I32) { /* in int64 (sum, max) or double (mean), to the node's dtype: no kernel */
    bool mean = n->op == OP_MEAN, max = n->op == OP_MAX;
    EMIT("  { const int32_t *x_ = (const int32_t *)(const void *)(%s); %s *y_ = (%s *)(void *)(%s);\n"
         "    for (int64_t o_ = 0; o_ < %lld; o_++) for (int64_t r_ = 0; r_ < %lld; r_++) {\n"
         "      %s a_ = %s;\n"
         "      for (int64_t l_ = 0; l_ < %lld; l_++) { int32_t v_ = x_[(o_ * %lld + l_) * %lld + r_]; %s; }\n"
         "      y_[o_ * %lld + r_] = (%s)(a_%s);\n"
         "    } }\n",
         ptr(c, n->in[0]), n->dtype == DT_I32 ? "int32_t" : "float", n->dtype == DT_I32 ? "int32_t" : "float", ptr(c, i),
         (long long)o, (long long)r, mean ? "double" : "int64_t", max ? "INT32_MIN" : "0", (long long)l, (long long)l,
         (long long)r, max ? "if (v_ > a_) a_ = v_" : "a_ += v_", (long long)r, n->dtype == DT_I32 ? "int32_t" : "float",
         mean ? cp_fmt(" / %lld.0", (long long)l) : "");
    return;
  }
  const char *out = ptr(c, i), *xp = ptr(c, n->in[0]);
  if (n->op != OP_MAX && r == 1 &&
      emit_row_call(c, n->op == OP_SUM ? CG_ROW_SUM_FWD : CG_ROW_MEAN_FWD, o, l, 0, &out, &xp))
    return;
  EMIT("  %s_%s_forward(%s, %s, %lld, %lld, %lld);\n", n->op == OP_MAX ? "k" : "kf", ir_ops[n->op].name, out, xp,
       (long long)o, (long long)l, (long long)r);
}

/* The GEMM view of matmul f (cg_mm_dims) and its operands: pointers, and whether each is stored
 * transposed (a virtual transpose). */
typedef struct Mm {
  CgMm d;
  const char *a, *b;
  bool ta, tb;
} Mm;

static bool mm_setup(Cg *c, const Node *f, int fi, Mm *mm) {
  if (!cg_mm_dims(c->g, f, &mm->d)) return unsupported(c, fi, "a matmul whose batch dims broadcast partially");
  mm->a = ptr(c, f->in[0]), mm->ta = c->pl.nc[f->in[0]].trans;
  mm->b = ptr(c, f->in[1]), mm->tb = c->pl.nc[f->in[1]].trans;
  return true;
}

static void emit_matmul(Cg *c, int i) {
  Mm mm;
  if (!mm_setup(c, nd(c, i), i, &mm)) return;
  EMIT("  k_gemm(%s, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %lld, %lld, %lld, 0.0f);\n", ptr(c, i), mm.a, mm.b,
       (long long)mm.d.nb, (long long)mm.d.m, (long long)mm.d.n, (long long)mm.d.k, mm.ta, mm.tb, (long long)mm.d.sa,
       (long long)mm.d.sb, (long long)mm.d.sc);
}


/* keep mask of dropout node i into mask (dropout_mask, emit_dropout_helper) */
static void emit_mask(Cg *c, int i, const char *mask, const char *comment) {
  const Node *n = nd(c, i);
  const char *l, *w, *o;
  cg_dropout_map(n, n->ia[3] > 0 ? axis_n(c, (int)n->ia[3] - 1) : 1, &l, &w, &o);
  EMIT("  dropout_mask(run, %s, %.17g, 0x%016llxULL, %d, (const int64_t[])%s, (const int64_t[])%s, (const int64_t[])%s);%s\n",
       mask, n->fa[0], (unsigned long long)cg_dropout_key(c->g, i), n->shape.rank, l, w, o, comment);
}

static void emit_dropout(Cg *c, int i) {
  const Node *n = nd(c, i);
  if (c->ph == CG_PH_EVAL || n->fa[0] == 0) {
    EMIT("  k_dropout_forward(%s, %s, NULL, %lld, %s); /* evaluation: the identity */\n", ptr(c, i),
         ptr(c, n->in[0]), (long long)numel(n), cg_flt(n->fa[0]));
    return;
  }
  const char *mask = cp_fmt("B(%lld)", (long long)c->pl.nc[i].soff[c->ph]);
  emit_mask(c, i, mask, "");
  EMIT("  k_dropout_forward(%s, %s, %s, %lld, %s);\n", ptr(c, i), ptr(c, n->in[0]), mask, (long long)numel(n),
       cg_flt(n->fa[0]));
}

/* A shape op of an i32 tensor: the bits of its 4-byte elements moved by k32_ kernels, transpose
 * and split/merge heads as the permute of a view of x (shape s, output dim k = s dim perm[k]). */
static void emit_shape_op_i32(Cg *c, int i) {
  const Node *n = nd(c, i), *x = in(c, i, 0);
  const int64_t *d = x->shape.d;
  int r = x->shape.rank;
  if (n->op == OP_SLICE) {
    int ax = (int)n->ia[0];
    EMIT("  k32_slice_forward(%s, %s, %lld, %lld, %lld, %lld, %lld);\n", ptr(c, i), ptr(c, n->in[0]),
         (long long)cg_dims_prod(&x->shape, 0, ax), (long long)d[ax], (long long)cg_dims_prod(&x->shape, ax + 1, r),
         (long long)n->ia[1], (long long)n->ia[2]);
    return;
  }
  Shape s = x->shape, perm = {.rank = r};
  for (int k = 0; k < r; k++) perm.d[k] = n->op == OP_PERMUTE ? n->dims[k] : k;
  if (n->op == OP_TRANSPOSE) perm.d[r - 2] = r - 1, perm.d[r - 1] = r - 2;
  if (n->op == OP_SPLIT_HEADS) /* [b, t, c] as [b, t, h, c/h] -> [b, h, t, c/h] */
    s = (Shape){.rank = 4, .d = {d[0], d[1], n->ia[0], d[2] / n->ia[0]}}, perm = (Shape){.rank = 4, .d = {0, 2, 1, 3}};
  if (n->op == OP_MERGE_HEADS) /* [b, h, t, dh] -> [b, t, h, dh], i.e. [b, t, h * dh] */
    perm = (Shape){.rank = 4, .d = {0, 2, 1, 3}};
  EMIT("  k32_permute_forward(%s, %s, %s, %d, %s);\n", ptr(c, i), ptr(c, n->in[0]), shape_ints(&s), s.rank,
       shape_ints(&perm));
}

static void emit_shape_op(Cg *c, int i) {
  const Node *n = nd(c, i), *x = in(c, i, 0);
  const char *o = ptr(c, i), *xp = ptr(c, n->in[0]);
  const int64_t *d = x->shape.d;
  if (x->dtype == DT_I32) {
    emit_shape_op_i32(c, i);
    return;
  }
  if (x->dtype != DT_F32) {
    unsupported(c, i, cp_fmt("%s of a %s tensor", ir_ops[n->op].name, dtype_name(x->dtype)));
    return;
  }
  switch (n->op) {
  case OP_TRANSPOSE:
    EMIT("  kf_transpose_forward(%s, %s, %lld, %lld, %lld);\n", o, xp, (long long)cg_dims_prod(&x->shape, 0, x->shape.rank - 2),
         (long long)d[x->shape.rank - 2], (long long)d[x->shape.rank - 1]);
    break;
  case OP_PERMUTE: {
    Shape perm = {.rank = n->ndims};
    for (int k = 0; k < n->ndims; k++) perm.d[k] = n->dims[k];
    EMIT("  k_permute_forward(%s, %s, %s, %d, %s);\n", o, xp, shape_ints(&x->shape), x->shape.rank, shape_ints(&perm));
    break;
  }
  case OP_SLICE: {
    int ax = (int)n->ia[0];
    EMIT("  kf_slice_forward(%s, %s, %lld, %lld, %lld, %lld, %lld);\n", o, xp, (long long)cg_dims_prod(&x->shape, 0, ax),
         (long long)d[ax], (long long)cg_dims_prod(&x->shape, ax + 1, x->shape.rank), (long long)n->ia[1],
         (long long)n->ia[2]);
    break;
  }
  case OP_SPLIT_HEADS:
    EMIT("  kf_split_heads_forward(%s, %s, %lld, %lld, %lld, %lld);\n", o, xp, (long long)d[0], (long long)d[1],
         (long long)d[2], (long long)n->ia[0]);
    break;
  case OP_MERGE_HEADS:
    EMIT("  kf_merge_heads_forward(%s, %s, %lld, %lld, %lld, %lld);\n", o, xp, (long long)d[0], (long long)d[2],
         (long long)(d[1] * d[3]), (long long)d[1]);
    break;
  default: cp_unreachable();
  }
}

static void emit_concat(Cg *c, int i) {
  const Node *n = nd(c, i);
  int ax = (int)n->ia[0];
  bool i32 = n->dtype == DT_I32;
  StrBuf xs = {0}, ns = {0};
  for (int k = 0; k < n->nin; k++) {
    DType dt = in(c, i, k)->dtype;
    if ((dt == DT_I32) != i32) {
      unsupported(c, i, "concat mixing i32 and float tensors");
      diag_hint("convert the i32 operands first: float(x)");
      return;
    }
    if (dt != DT_F32 && dt != DT_I32) {
      unsupported(c, i, cp_fmt("concat of a %s tensor", dtype_name(dt)));
      return;
    }
    sb_printf(&xs, "%s%s", k ? ", " : "", ptr(c, n->in[k]));
    sb_printf(&ns, "%s%lld", k ? ", " : "", (long long)in(c, i, k)->shape.d[ax]);
  }
  EMIT("  %s(%s, (const %s *const[]){%s}, (const int[]){%s}, %d, %lld, %lld);\n", i32 ? "k32_concat_forward" : "kf_concat_forward",
       ptr(c, i), i32 ? "void" : "float", sb_str(&xs), sb_str(&ns), n->nin, (long long)cg_dims_prod(&n->shape, 0, ax),
       (long long)cg_dims_prod(&n->shape, ax + 1, n->shape.rank));
}

static void emit_nn(Cg *c, int i) {
  const Node *n = nd(c, i);
  const char *o = ptr(c, i), *x = ptr(c, n->in[0]);
  int64_t rows = cg_rows(n), cc = cg_last_dim(n);
  switch (n->op) {
  case OP_SOFTMAX:
  case OP_LOG_SOFTMAX:
    if (n->ia[0] != n->shape.rank - 1) {
      unsupported(c, i, "softmax over an axis other than the last");
      return;
    }
    if (!n->ia[1] && emit_row_call(c, n->op == OP_SOFTMAX ? CG_ROW_SOFTMAX_FWD : CG_ROW_LOG_SOFTMAX_FWD, rows, cc, 0, &o, &x))
      break; /* the LLVM row kernels have no safe softmax (ops.def) */
    EMIT("  kf_%s%s_forward(%s, %s, %lld, %lld);\n", n->ia[1] ? "safe_" : "", ir_ops[n->op].name, o, x, (long long)rows,
         (long long)cc);
    break;
  case OP_LAYER_NORM: {
    const char *outs[3] = {o, c->ph == CG_PH_EVAL ? "NULL" : aux_ptr(c, i, 0),
                           c->ph == CG_PH_EVAL ? "NULL" : aux_ptr(c, i, rows)};
    const char *ins[3] = {x, ptr(c, n->in[1]), ptr(c, n->in[2])};
    if (emit_row_call(c, CG_ROW_LAYER_NORM_FWD, rows, cc, n->fa[0], outs, ins)) break;
    if (c->ph == CG_PH_EVAL) EMIT("  kf_layer_norm_forward(%s, NULL, NULL, %s, %s, %s, %lld, %lld, %s);\n", o, x,
                               ptr(c, n->in[1]), ptr(c, n->in[2]), (long long)rows, (long long)cc, cg_flt(n->fa[0]));
    else EMIT("  kf_layer_norm_forward(%s, %s, %s, %s, %s, %s, %lld, %lld, %s);\n", o, aux_ptr(c, i, 0),
              aux_ptr(c, i, rows), x, ptr(c, n->in[1]), ptr(c, n->in[2]), (long long)rows, (long long)cc,
              cg_flt(n->fa[0]));
    break;
  }
  case OP_RMS_NORM: {
    const char *outs[2] = {o, c->ph == CG_PH_EVAL ? "NULL" : aux_ptr(c, i, 0)}, *ins[2] = {x, ptr(c, n->in[1])};
    if (emit_row_call(c, CG_ROW_RMS_NORM_FWD, rows, cc, n->fa[0], outs, ins)) break;
    EMIT("  kf_rms_norm_forward(%s, %s, %s, %s, %lld, %lld, %s);\n", o, c->ph == CG_PH_EVAL ? "NULL" : aux_ptr(c, i, 0), x,
         ptr(c, n->in[1]), (long long)rows, (long long)cc, cg_flt(n->fa[0]));
    break;
  }
  case OP_ROPE:
    EMIT("  k_rope_forward(%s, %s, %lld, %lld, %lld, %s);\n", o, x, (long long)cg_dims_prod(&n->shape, 0, n->shape.rank - 2),
         (long long)n->shape.d[n->shape.rank - 2], (long long)cc, cg_flt(n->fa[0]));
    break;
  case OP_SDPA: {
    const int64_t *q = in(c, i, 0)->shape.d, *k = in(c, i, 1)->shape.d, *v = in(c, i, 2)->shape.d;
    if (v[3] != q[3]) {
      unsupported(c, i, "sdpa with values of another width");
      return;
    }
    EMIT("  k_sdpa_fast_forward(%s, %s, %s, %s, %s, %s, %lld, %lld, %lld, %lld, %d, %lld, %lld);\n", o, aux_ptr(c, i, 0),
         x, ptr(c, n->in[1]), ptr(c, n->in[2]), n->nin == 4 ? ptr(c, n->in[3]) : "NULL", (long long)(q[0] * q[1]),
         (long long)q[2], (long long)k[2], (long long)q[3], (int)n->ia[0], (long long)(q[1] / k[1]), (long long)q[1]);
    break;
  }
  default: cp_unreachable();
  }
}

/* ---- tensor parallelism: collectives and the vocab-parallel cross entropy ---------------------- */

/* The [outer, n * part, inner] view of a value split along dim d in n parts: outer and the
 * floats of one rank's part (part * inner) per outer index. */
static void split_view(const Shape *whole, int d, int64_t n, int64_t *outer, int64_t *piece) {
  *outer = cg_dims_prod(whole, 0, d);
  *piece = whole->d[d] / n * cg_dims_prod(whole, d + 1, whole->rank);
}

/* The copies of b (cg_all_to_all_blocks), elements of 4 bytes. */
static void emit_block_copies(Cg *c, const char *dst, const char *src, const CgBlocks *b) {
  EMIT("  for (long r = 0; r < %lld; r++)\n    for (long q = 0; q < %lld; q++)\n"
       "      memcpy(%s + r * %lld + q * %lld, %s + r * %lld + q * %lld, %lld);\n",
       (long long)b->k, (long long)b->rows, dst, (long long)b->dst_step, (long long)b->dst_pitch, src,
       (long long)b->src_step, (long long)b->src_pitch, (long long)(b->width * 4));
}

/* One collective node (ops.def) as rt_comm calls on its axis group. The result has its own
 * buffer (a copy for the in-place all-reduce), as the GRADs may still read the input. */
static void emit_collective(Cg *c, int i) {
  const Node *n = nd(c, i), *x = in(c, i, 0);
  int a = (int)n->ia[0], d = (int)n->ia[1];
  int64_t k = n->ia[3], outer, piece;
  const char *o = ptr(c, i), *src = ptr(c, n->in[0]), *grp = cp_fmt("run->axis_comm[%d]", a);
  const char *tmp = cp_fmt("F(%lld)", (long long)c->pl.nc[i].soff[c->ph]);
  /* f32 values, or i32 ones (under sp the targets are split along the sequence too): 4 bytes */
  const char *ty = x->dtype == DT_I32 ? "RT_COMM_I32" : "RT_COMM_F32";
  switch (n->op) {
  case OP_ALL_REDUCE:
    if (strcmp(o, src) != 0) EMIT("  memcpy(%s, %s, %lld);\n", o, src, (long long)ir_node_bytes(c->g, i));
    EMIT("  rt_comm_all_reduce(%s, %s, %lld, %s);\n", grp, o, (long long)numel(n), ty);
    break;
  case OP_ALL_GATHER: /* gathered [k, outer, piece] -> out [outer, k, piece] */
    split_view(&n->shape, d, k, &outer, &piece);
    EMIT("  rt_comm_all_gather(%s, %s, %s, %lld, %s);\n", grp, src, tmp, (long long)numel(x), ty);
    EMIT("  for (long r = 0; r < %lld; r++)\n    for (long q = 0; q < %lld; q++)\n"
         "      memcpy(%s + (q * %lld + r) * %lld, %s + (r * %lld + q) * %lld, %lld);\n",
         (long long)k, (long long)outer, o, (long long)k, (long long)piece, tmp, (long long)outer, (long long)piece,
         (long long)(piece * 4));
    break;
  case OP_REDUCE_SCATTER: /* x [outer, k, piece] -> blocks [k, outer, piece], this rank's summed */
    split_view(&x->shape, d, k, &outer, &piece);
    EMIT("  for (long r = 0; r < %lld; r++)\n    for (long q = 0; q < %lld; q++)\n"
         "      memcpy(%s + (r * %lld + q) * %lld, %s + (q * %lld + r) * %lld, %lld);\n",
         (long long)k, (long long)outer, tmp, (long long)outer, (long long)piece, src, (long long)k, (long long)piece,
         (long long)(piece * 4));
    EMIT("  rt_comm_reduce_scatter(%s, %s, %s, %lld, %s);\n", grp, tmp, o, (long long)numel(n), ty);
    break;
  case OP_SHARD_SLICE:
    split_view(&x->shape, d, k, &outer, &piece);
    EMIT("  for (long q = 0; q < %lld; q++)\n    memcpy(%s + q * %lld, %s + (q * %lld + run->axis_coord[%d]) * %lld, %lld);\n",
         (long long)outer, o, (long long)piece, src, (long long)k, a, (long long)piece, (long long)(piece * 4));
    break;
  case OP_ALL_TO_ALL: { /* S(d1) -> S(d2): block r of the input along d2 to rank r, rank r's block along d1 */
    CgBlocks pack, unpack;
    cg_all_to_all_blocks(n, x, &pack, &unpack);
    const char *rcv = cp_fmt("F(%lld)", (long long)(c->pl.nc[i].soff[c->ph] + numel(x) * 4));
    emit_block_copies(c, tmp, src, &pack);
    EMIT("  rt_comm_all_to_all(%s, %s, %s, %lld, %s);\n", grp, tmp, rcv, (long long)(numel(x) / k), ty);
    emit_block_copies(c, o, rcv, &unpack);
    break;
  }
  default: cp_unreachable();
  }
  if (x->dtype != DT_F32 && x->dtype != DT_I32) unsupported(c, i, "a collective of a tensor of this dtype");
}

/* A crossing between pipeline stages (pipeline.h) over the pp axis group, whose rank is the stage:
 * the send does not wait (rt_comm_isend copies), the receive does. */
static void emit_pp(Cg *c, int i) {
  const Node *n = nd(c, i);
  const Node *x = n->op == OP_PP_SEND ? in(c, i, 0) : n;
  const char *ty = x->dtype == DT_I32 ? "RT_COMM_I32" : "RT_COMM_F32";
  if (x->dtype != DT_F32 && x->dtype != DT_I32) unsupported(c, i, "a pipeline crossing of this dtype");
  int peer = (int)n->ia[0] % c->pipe->devices; /* the device of that stage */
  if (n->op == OP_PP_SEND)
    EMIT("  rt_comm_isend(run->axis_comm[%d], %s, %lld, %s, %d, %d); /* to stage %d */\n", c->ppa, ptr(c, n->in[0]),
         (long long)numel(x), ty, peer, (int)n->ia[1], (int)n->ia[0]);
  else
    EMIT("  rt_comm_recv(run->axis_comm[%d], %s, %lld, %s, %d, %d); /* from stage %d */\n", c->ppa, ptr(c, i),
         (long long)numel(x), ty, peer, (int)n->ia[1], (int)n->ia[0]);
}

/* The vocab-parallel cross entropy (kernels/cpu/vocab_parallel.h: the exchange sequence): m and
 * s stay in aux for the backward; the result is this rank's part of the loss (P). */
static void emit_vocab_ce(Cg *c, int i) {
  const Node *n = nd(c, i), *lg = in(c, i, 0);
  int a = (int)n->ia[0] - 1;
  int64_t rows = cg_rows(lg), vl = cg_last_dim(lg), k = axis_n(c, a);
  const char *m = aux_ptr(c, i, 0), *sx = aux_ptr(c, i, rows), *l = ptr(c, n->in[0]), *grp = cp_fmt("run->axis_comm[%d]", a);
  const char *tmp = cp_fmt("F(%lld)", (long long)c->pl.nc[i].soff[c->ph]);
  EMIT("  kvp_ce_row_max(%s, %s, %lld, %lld);\n", m, l, (long long)rows, (long long)vl);
  EMIT("  rt_comm_all_gather(%s, %s, %s, %lld, RT_COMM_F32);\n", grp, m, tmp, (long long)rows);
  EMIT("  kvp_ce_max_combine(%s, %s, %lld, %lld);\n", m, tmp, (long long)rows, (long long)k);
  EMIT("  kvp_ce_row_sumexp(%s, %s, %s, %lld, %lld);\n", sx, l, m, (long long)rows, (long long)vl);
  EMIT("  rt_comm_all_reduce(%s, %s, %lld, RT_COMM_F32);\n", grp, sx, (long long)rows);
  EMIT("  %s[0] = kvp_ce_forward_part(NULL, %s, %s, %s, %s, %lld, %lld, (int)run->axis_coord[%d] * %lld, %lld, "
       "run->axis_coord[%d] == 0) * %s;\n", ptr(c, i), l, m, sx, ptr(c, n->in[1]), (long long)rows, (long long)vl, a,
       (long long)vl, (long long)cg_index_bound(n, vl * k), a, cg_ce_weight(n));
}

/* The vocab-parallel argmax of the last dim (kernels/cpu/vocab_parallel.h): the ranks' row maxima
 * and their global indices all-gathered, two floats per row; the result is whole (R). */
static void emit_vocab_argmax(Cg *c, int i) {
  const Node *n = nd(c, i), *lg = in(c, i, 0);
  int a = (int)n->ia[1] - 1;
  int64_t rows = cg_rows(lg), vl = cg_last_dim(lg), k = axis_n(c, a), off = c->pl.nc[i].soff[c->ph];
  if (vl * k > (1 << 24)) {
    unsupported(c, i, "a vocab-parallel argmax over more than 2^24 columns (its indices travel as floats)");
    return;
  }
  const char *pair = cp_fmt("F(%lld)", (long long)off), *gat = cp_fmt("F(%lld)", (long long)(off + 2 * rows * 4));
  EMIT("  kvp_argmax_local(%s, %s, %lld, %lld, (int)run->axis_coord[%d] * %lld);\n", pair, ptr(c, n->in[0]),
       (long long)rows, (long long)vl, a, (long long)vl);
  EMIT("  rt_comm_all_gather(run->axis_comm[%d], %s, %s, %lld, RT_COMM_F32);\n", a, pair, gat, (long long)(2 * rows));
  EMIT("  kvp_argmax_combine(%s, %s, %lld, %lld);\n", ptr(c, i), gat, (long long)rows, (long long)k);
}

static void emit_forward(Cg *c, int i) {
  const Node *n = nd(c, i);
  if (cg_forward_skip(c->out, &c->pl, i)) return;
  switch (n->op) {
  case OP_ARANGE: EMIT("  k_arange_forward(%s, %lld);\n", ptr(c, i), (long long)n->ia[0]); break;
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MAXIMUM: case OP_MINIMUM: case OP_MOD: case OP_FLOORDIV:
  case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: emit_binary(c, i); break;
  case OP_NEG: case OP_EXP: case OP_LOG: case OP_SQRT: case OP_RSQRT: case OP_TANH: case OP_SIGMOID:
  case OP_RELU: case OP_GELU: case OP_SILU: case OP_SQUARE: case OP_POW: case OP_ABS: case OP_CLAMP_MIN:
  case OP_CLAMP_MAX: case OP_ERF: case OP_SIN: case OP_COS: emit_unary(c, i); break;
  case OP_WHERE: emit_where(c, i); break;
  case OP_SUM: case OP_MEAN: case OP_MAX: emit_reduce(c, i); break;
  case OP_MATMUL: emit_matmul(c, i); break;
  case OP_TRANSPOSE: case OP_PERMUTE: case OP_SLICE: case OP_SPLIT_HEADS: case OP_MERGE_HEADS: emit_shape_op(c, i); break;
  case OP_CONCAT: emit_concat(c, i); break;
  case OP_EMBEDDING: {
    const Node *t = in(c, i, 0);
    if (n->ia[0] > 0) { /* vocab-parallel: this rank's rows, zeros elsewhere (P) */
      int a = (int)n->ia[0] - 1;
      EMIT("  kvp_embedding_forward(%s, %s, %s, %lld, (int)run->axis_coord[%d] * %lld, %lld, %lld, %lld);\n", ptr(c, i),
           ptr(c, n->in[0]), ptr(c, n->in[1]), (long long)numel(in(c, i, 1)), a, (long long)t->shape.d[0],
           (long long)t->shape.d[0], (long long)cg_index_bound(n, t->shape.d[0] * axis_n(c, a)), (long long)t->shape.d[1]);
      break;
    }
    EMIT("  kf_embedding_forward(%s, %s, %s, %lld, %lld, %lld);\n", ptr(c, i), ptr(c, n->in[0]), ptr(c, n->in[1]),
         (long long)numel(in(c, i, 1)), (long long)cg_index_bound(n, t->shape.d[0]), (long long)t->shape.d[1]);
    break;
  }
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_LAYER_NORM: case OP_RMS_NORM: case OP_ROPE: case OP_SDPA:
    emit_nn(c, i);
    break;
  case OP_DROPOUT: emit_dropout(c, i); break;
  case OP_CROSS_ENTROPY: {
    const Node *lg = in(c, i, 0);
    if (n->ia[0] > 0) {
      emit_vocab_ce(c, i);
      break;
    }
    EMIT("  %s[0] = kf_cross_entropy_forward(NULL, %s, %s, %lld, %lld) * %s;\n", ptr(c, i), ptr(c, n->in[0]),
         ptr(c, n->in[1]), (long long)cg_rows(lg), (long long)cg_last_dim(lg), cg_ce_weight(n));
    break;
  }
  case OP_ARGMAX: {
    const Node *x = in(c, i, 0);
    int ax = (int)n->ia[0];
    if (n->ia[1] > 0) {
      emit_vocab_argmax(c, i);
      break;
    }
    EMIT("  k_argmax_forward(%s, %s, %lld, %lld, %lld);\n", ptr(c, i), ptr(c, n->in[0]),
         (long long)cg_dims_prod(&x->shape, 0, ax), (long long)x->shape.d[ax],
         (long long)cg_dims_prod(&x->shape, ax + 1, x->shape.rank));
    break;
  }
  case OP_FLOAT: /* i32 -> f32 (fusion.c never fuses it) */
    EMIT("  k_float_forward(%s, %s, %lld);\n", ptr(c, i), ptr(c, n->in[0]), (long long)numel(n));
    break;
  case OP_ASSIGN:
    if (cg_root(&c->pl, n->in[1]) != cg_root(&c->pl, n->in[0]))
      EMIT("  memcpy(%s, %s, %lld);\n", ptr(c, n->in[0]), ptr(c, n->in[1]), (long long)ir_node_bytes(c->g, i));
    break;
  case OP_ACCUM:
    EMIT("  k_accum(%s, %s, %lld);\n", ptr(c, n->in[0]), ptr(c, n->in[1]), (long long)numel(n));
    break;
  case OP_ALL_REDUCE: case OP_ALL_GATHER: case OP_REDUCE_SCATTER: case OP_SHARD_SLICE: case OP_ALL_TO_ALL:
    emit_collective(c, i);
    break;
  case OP_PP_SEND: case OP_PP_RECV: emit_pp(c, i); break;
  default: unsupported(c, i, cp_fmt("the op '%s'", ir_ops[n->op].name));
  }
}

/* ---- backward kernels --------------------------------------------------------------------- */

/* The gradient buffers a group's kernel writes, indexed by forward input ("NULL" when not
 * wanted or when that gradient is a view of dy). Zeroes those the kernel accumulates into. */
static void group_outputs(Cg *c, int lead, const char **dst, int nmax, bool zero) {
  const Node *l = nd(c, lead);
  for (int k = 0; k < nmax; k++) dst[k] = "NULL";
  for (int j = lead; j >= 0; j = cg_group_next(&c->pl, j)) {
    const Node *m = nd(c, j);
    if (m->op != OP_GRAD || c->pl.nc[j].leader != lead || c->pl.nc[j].kind == CG_L_ALIAS) continue;
    cp_assert(m->ia[0] < nmax);
    dst[m->ia[0]] = ptr(c, j);
    if (zero) EMIT("  memset(%s, 0, %lld);\n", dst[m->ia[0]], (long long)ir_node_bytes(c->g, j));
  }
  (void)l;
}

static void emit_grad_binary(Cg *c, int i, const Node *f) {
  const Node *a = nd(c, f->in[0]), *b = nd(c, f->in[1]);
  const char *d[2];
  group_outputs(c, i, d, 2, true);
  const char *op = binary_k[f->op - OP_ADD], *dy = ptr(c, nd(c, i)->in[0]);
  if (periodic(&a->shape, &f->shape) && periodic(&b->shape, &f->shape))
    EMIT("  kf_binary_period_backward(%s, %s, %lld, %s, %lld, %s, %s, %s, %lld);\n", op, d[0], (long long)numel(a), d[1],
         (long long)numel(b), dy, ptr(c, f->in[0]), ptr(c, f->in[1]), (long long)numel(f));
  else
    EMIT("  k_binary_backward(%s, %s, %s, %s, %s, %s, %d, %s, %s, %d);\n", op, d[0], d[1], dy, ptr(c, f->in[0]),
         shape_ints(&a->shape), a->shape.rank, ptr(c, f->in[1]), shape_ints(&b->shape), b->shape.rank);
}

static void emit_grad_matmul(Cg *c, int i, const Node *f) {
  const Node *n = nd(c, i);
  Mm mm;
  if (!mm_setup(c, f, n->fwd, &mm)) return;
  const char *dy = ptr(c, n->in[0]);
  if (n->ia[0] == 0) /* dA = dY @ B^T */
    EMIT("  k_gemm(%s, %s, %s, %lld, %lld, %lld, %lld, 0, %d, %lld, %lld, %lld, 0.0f);\n", ptr(c, i), dy, mm.b,
         (long long)mm.d.nb, (long long)mm.d.m, (long long)mm.d.k, (long long)mm.d.n, !mm.tb, (long long)mm.d.sc,
         (long long)mm.d.sb, (long long)mm.d.sa);
  else /* dB = A^T @ dY */
    EMIT("  k_gemm(%s, %s, %s, %lld, %lld, %lld, %lld, %d, 0, %lld, %lld, %lld, 0.0f);\n", ptr(c, i), mm.a, dy,
         (long long)mm.d.nb, (long long)mm.d.k, (long long)mm.d.n, (long long)mm.d.m, !mm.ta, (long long)mm.d.sa,
         (long long)mm.d.sc, (long long)mm.d.sb);
}

static void emit_grad_nn(Cg *c, int i, const Node *f) {
  const Node *n = nd(c, i);
  const char *dx = ptr(c, i), *dy = ptr(c, n->in[0]), *x = ptr(c, f->in[0]);
  int64_t rows = cg_rows(f), cc = cg_last_dim(f), bytes = (int64_t)ir_node_bytes(c->g, i);
  const char *d[3];
  switch (f->op) {
  case OP_SOFTMAX:
  case OP_LOG_SOFTMAX:
    EMIT("  memset(%s, 0, %lld);\n", dx, (long long)bytes);
    d[0] = dy;
    d[1] = ptr(c, n->fwd);
    if (emit_row_call(c, f->op == OP_SOFTMAX ? CG_ROW_SOFTMAX_BWD : CG_ROW_LOG_SOFTMAX_BWD, rows, cc, 0, &dx, d))
      break;
    EMIT("  kf_%s_backward(%s, %s, %s, %lld, %lld);\n", ir_ops[f->op].name, dx, dy, ptr(c, n->fwd), (long long)rows,
         (long long)cc);
    break;
  case OP_LAYER_NORM: {
    group_outputs(c, i, d, 3, true);
    const char *ins[5] = {dy, x, ptr(c, f->in[1]), aux_ptr(c, n->fwd, 0), aux_ptr(c, n->fwd, rows)};
    if (emit_row_call(c, CG_ROW_LAYER_NORM_BWD, rows, cc, 0, d, ins)) break;
    EMIT("  kf_layer_norm_backward(%s, %s, %s, %s, %s, %s, %s, %s, %lld, %lld);\n", d[0], d[1], d[2], dy, x,
         ptr(c, f->in[1]), aux_ptr(c, n->fwd, 0), aux_ptr(c, n->fwd, rows), (long long)rows, (long long)cc);
    break;
  }
  case OP_RMS_NORM: {
    group_outputs(c, i, d, 2, true);
    const char *ins[4] = {dy, x, ptr(c, f->in[1]), aux_ptr(c, n->fwd, 0)};
    if (emit_row_call(c, CG_ROW_RMS_NORM_BWD, rows, cc, 0, d, ins)) break;
    EMIT("  kf_rms_norm_backward(%s, %s, %s, %s, %s, %s, %lld, %lld);\n", d[0], d[1], dy, x, ptr(c, f->in[1]),
         aux_ptr(c, n->fwd, 0), (long long)rows, (long long)cc);
    break;
  }
  case OP_ROPE:
    EMIT("  memset(%s, 0, %lld);\n", dx, (long long)bytes);
    EMIT("  k_rope_backward(%s, %s, %lld, %lld, %lld, %s);\n", dx, dy, (long long)cg_dims_prod(&f->shape, 0, f->shape.rank - 2),
         (long long)f->shape.d[f->shape.rank - 2], (long long)cc, cg_flt(f->fa[0]));
    break;
  case OP_SDPA: {
    const int64_t *q = nd(c, f->in[0])->shape.d, *k = nd(c, f->in[1])->shape.d;
    group_outputs(c, i, d, 3, false);
    EMIT("  k_sdpa_fast_backward(%s, %s, %s, %s, %s, %s, %s, %s, %lld, %lld, %lld, %lld, %lld, F(%lld));\n", d[0], d[1],
         d[2], dy, aux_ptr(c, n->fwd, 0), x, ptr(c, f->in[1]), ptr(c, f->in[2]), (long long)(q[0] * q[1]),
         (long long)q[2], (long long)k[2], (long long)q[3], (long long)(q[1] / k[1]),
         (long long)c->pl.nc[i].soff[c->ph]);
    break;
  }
  case OP_DROPOUT: {
    const char *mask = cp_fmt("B(%lld)", (long long)c->pl.nc[i].soff[c->ph]);
    EMIT("  memset(%s, 0, %lld);\n", dx, (long long)bytes);
    if (f->fa[0] > 0)
      emit_mask(c, n->fwd, mask, " /* the forward's mask again */");
    EMIT("  k_dropout_backward(%s, %s, %s, %lld, %s);\n", dx, dy, f->fa[0] > 0 ? mask : "NULL", (long long)numel(f),
         cg_flt(f->fa[0]));
    break;
  }
  case OP_CROSS_ENTROPY: {
    const Node *lg = nd(c, f->in[0]);
    EMIT("  memset(%s, 0, %lld);\n", dx, (long long)bytes);
    if (f->ia[0] > 0) {
      int a = (int)f->ia[0] - 1;
      int64_t vl = cg_last_dim(lg), r = cg_rows(lg);
      EMIT("  kvp_ce_backward(%s, %s[0] * %s, %s, %s, %s, %s, %lld, %lld, (int)run->axis_coord[%d] * %lld, %lld);\n", dx,
           dy, cg_ce_weight(f), x, aux_ptr(c, n->fwd, 0), aux_ptr(c, n->fwd, r), ptr(c, f->in[1]), (long long)r,
           (long long)vl, a, (long long)vl, (long long)cg_index_bound(f, vl * axis_n(c, a)));
      break;
    }
    EMIT("  kf_cross_entropy_backward(%s, %s[0] * %s, %s, %s, %lld, %lld);\n", dx, dy, cg_ce_weight(f), x,
         ptr(c, f->in[1]), (long long)cg_rows(lg), (long long)cg_last_dim(lg));
    break;
  }
  default: cp_unreachable();
  }
}

static void emit_grad_shape(Cg *c, int i, const Node *f) {
  const Node *n = nd(c, i), *x = nd(c, f->in[n->ia[0]]);
  const char *dx = ptr(c, i), *dy = ptr(c, n->in[0]);
  const int64_t *d = x->shape.d;
  int64_t bytes = (int64_t)ir_node_bytes(c->g, i);
  switch (f->op) {
  case OP_TRANSPOSE:
    EMIT("  kf_transpose_forward(%s, %s, %lld, %lld, %lld);\n", dx, dy, (long long)cg_dims_prod(&x->shape, 0, x->shape.rank - 2),
         (long long)d[x->shape.rank - 1], (long long)d[x->shape.rank - 2]);
    break;
  case OP_PERMUTE: {
    Shape perm = {.rank = f->ndims};
    for (int k = 0; k < f->ndims; k++) perm.d[k] = f->dims[k];
    EMIT("  memset(%s, 0, %lld);\n", dx, (long long)bytes);
    EMIT("  k_permute_backward(%s, %s, %s, %d, %s);\n", dx, dy, shape_ints(&x->shape), x->shape.rank, shape_ints(&perm));
    break;
  }
  case OP_SLICE: {
    int ax = (int)f->ia[0];
    EMIT("  memset(%s, 0, %lld);\n", dx, (long long)bytes);
    EMIT("  kf_slice_backward(%s, %s, %lld, %lld, %lld, %lld, %lld);\n", dx, dy, (long long)cg_dims_prod(&x->shape, 0, ax),
         (long long)d[ax], (long long)cg_dims_prod(&x->shape, ax + 1, x->shape.rank), (long long)f->ia[1], (long long)f->ia[2]);
    break;
  }
  case OP_CONCAT: {
    int ax = (int)f->ia[0];
    int64_t start = 0;
    for (int k = 0; k < n->ia[0]; k++) start += nd(c, f->in[k])->shape.d[ax];
    EMIT("  kf_slice_forward(%s, %s, %lld, %lld, %lld, %lld, %lld);\n", dx, dy, (long long)cg_dims_prod(&f->shape, 0, ax),
         (long long)f->shape.d[ax], (long long)cg_dims_prod(&f->shape, ax + 1, f->shape.rank), (long long)start,
         (long long)(start + d[ax]));
    break;
  }
  case OP_SPLIT_HEADS:
    EMIT("  kf_merge_heads_forward(%s, %s, %lld, %lld, %lld, %lld);\n", dx, dy, (long long)d[0], (long long)d[1],
         (long long)d[2], (long long)f->ia[0]);
    break;
  case OP_MERGE_HEADS:
    EMIT("  kf_split_heads_forward(%s, %s, %lld, %lld, %lld, %lld);\n", dx, dy, (long long)d[0], (long long)d[2],
         (long long)(d[1] * d[3]), (long long)d[1]);
    break;
  case OP_EMBEDDING:
    EMIT("  memset(%s, 0, %lld);\n", dx, (long long)bytes);
    if (f->ia[0] > 0) {
      int a = (int)f->ia[0] - 1;
      EMIT("  kvp_embedding_backward(%s, %s, %s, %lld, (int)run->axis_coord[%d] * %lld, %lld, %lld, %lld);\n", dx, dy,
           ptr(c, f->in[1]), (long long)numel(nd(c, f->in[1])), a, (long long)d[0], (long long)d[0],
           (long long)cg_index_bound(f, d[0] * axis_n(c, a)), (long long)d[1]);
      break;
    }
    EMIT("  kf_embedding_backward(%s, %s, %s, %lld, %lld, %lld);\n", dx, dy, ptr(c, f->in[1]),
         (long long)numel(nd(c, f->in[1])), (long long)cg_index_bound(f, d[0]), (long long)d[1]);
    break;
  default: cp_unreachable();
  }
}

static void emit_grad(Cg *c, int i) {
  const Node *n = nd(c, i);
  /* the forward node with the inputs this GRAD reads (the same values, but under ZeRO 3 a param
   * gathered again for the backward: lower.c) */
  Node fv = *nd(c, n->fwd);
  fv.in = n->in + 1;
  const Node *f = &fv;
  if (cg_grad_skip(c->out, &c->pl, i)) return;
  int64_t bytes = (int64_t)ir_node_bytes(c->g, i);
  const char *dx = ptr(c, i), *dy = ptr(c, n->in[0]), *x = ptr(c, f->in[n->ia[0]]);
  switch (f->op) {
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MAXIMUM: case OP_MINIMUM: case OP_MOD:
    emit_grad_binary(c, i, f);
    break;
  case OP_NEG: case OP_EXP: case OP_LOG: case OP_SQRT: case OP_RSQRT: case OP_TANH: case OP_SIGMOID:
  case OP_RELU: case OP_GELU: case OP_SILU: case OP_SQUARE: case OP_POW: case OP_ABS: case OP_CLAMP_MIN:
  case OP_CLAMP_MAX: case OP_ERF: case OP_SIN: case OP_COS:
    EMIT("  memset(%s, 0, %lld);\n", dx, (long long)bytes);
    EMIT("  kf_unary_backward(%s, %s, %s, %s, %s, %lld, %s);\n", unary_k[f->op - OP_NEG], dx, dy, x, ptr(c, n->fwd),
         (long long)numel(n), cg_flt(unary_c(f)));
    break;
  case OP_WHERE: { /* one call per wanted input (a: ia[0] 1, b: 2) */
    const Node *q = nd(c, f->in[0]), *a = nd(c, f->in[1]), *b = nd(c, f->in[2]);
    EMIT("  memset(%s, 0, %lld);\n", dx, (long long)bytes);
    EMIT("  kf_where_backward(%s, %s, %s, %s, %d, %s, %s, %d, %s, %d, %s, %d);\n", n->ia[0] == 1 ? dx : "NULL",
         n->ia[0] == 2 ? dx : "NULL", dy, shape_ints(&f->shape), f->shape.rank, ptr(c, f->in[0]), shape_ints(&q->shape),
         q->shape.rank, shape_ints(&a->shape), a->shape.rank, shape_ints(&b->shape), b->shape.rank);
    break;
  }
  case OP_SUM: case OP_MEAN: case OP_MAX: {
    int64_t o, l, r;
    if (!cg_reduce_dims(f, &nd(c, f->in[0])->shape, &o, &l, &r)) {
      unsupported(c, n->fwd, "a reduction over axes that are not adjacent");
      return;
    }
    EMIT("  memset(%s, 0, %lld);\n", dx, (long long)bytes);
    if (f->op == OP_MAX)
      EMIT("  k_max_backward(%s, %s, %s, %lld, %lld, %lld);\n", dx, dy, x, (long long)o, (long long)l, (long long)r);
    else
      EMIT("  kf_%s_backward(%s, %s, %lld, %lld, %lld);\n", ir_ops[f->op].name, dx, dy, (long long)o, (long long)l,
           (long long)r);
    break;
  }
  case OP_MATMUL: emit_grad_matmul(c, i, f); break;
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

/* ---- the phases --------------------------------------------------------------------------------- */

/* A fused group's one call, at its root: the comment lists every member. */
static void emit_fused(Cg *c, int i) {
  const FusionGroup *gr = &c->pl.fu->groups[c->pl.fu->group[i]];
  if (gr->nodes.n > 1) EMIT("  /* fused: %d nodes, one pass */\n", gr->nodes.n);
  for (int k = 0; k < gr->nodes.n; k++) cg_comment(c->out, c->g, c->irline, gr->nodes.a[k]);
  StrBuf in = {0};
  for (int k = 0; k < gr->leaves.n; k++) sb_printf(&in, "%s%s", k ? ", " : "", ptr(c, gr->leaves.a[k]));
  if (gr->leaves.n) EMIT("  %s(%s, (const float *const[]){%s});\n", gr->kernel.name, ptr(c, i), sb_str(&in));
  else EMIT("  %s(%s, NULL);\n", gr->kernel.name, ptr(c, i));
}

static void emit_node(Cg *c, int i) {
  c->cur = i;
  if (c->pl.fu->group[i] >= 0) {
    if (fusion_is_root(c->pl.fu, i)) emit_fused(c, i);
  } else {
    cg_comment(c->out, c->g, c->irline, i);
    if (nd(c, i)->op == OP_GRAD) emit_grad(c, i);
    else emit_forward(c, i);
  }
  c->cur = -1;
}

static void emit_scalar_ins(Cg *c) {
  const OptimizerConf *o = &c->t->optimizer;
  for (int i = 0; i < c->g->n; i++) {
    const Node *n = nd(c, i);
    if (n->op != OP_SCALAR_IN || cg_ce_weight_in(n)) continue;
    const char *v = cg_scalar_in(o, n);
    if (!v && strcmp(n->name, "grad_sumsq") == 0) v = "run->grad_sumsq"; /* a pipeline stage's (pipeline.h) */
    if (!v) cp_panic(__FILE__, __LINE__, "unknown scalar input '%s'", n->name);
    EMIT("  float sc%d[1] = {(float)(%s)}; /* %s */\n", i, v, n->name);
  }
}

/* The value of a scalar node as a double. */
static const char *scalar_value(Cg *c, int i) {
  return cp_fmt("(double)%s[0]", ptr(c, i));
}

static void emit_phase_fn(Cg *c, int ph, const char *sig, const char *why) {
  const Graph *g = c->g;
  c->ph = ph;
  EMIT("\n/* %s */\n%s {\n", why, sig);
  EMIT("  unsigned char *w = run->work;\n  (void)w;\n");
  if (ph == CG_PH_TRAIN && strstr(sig, "update")) {
    /* a pipeline stage: update_grad_sumsq runs the update nodes before norm_split, update the rest */
    const PipeStage *ps = c->pipe ? &c->pipe->stages[c->stage] : NULL;
    bool part = ps && strstr(sig, "grad_sumsq");
    emit_scalar_ins(c);
    for (int i = 0; i < g->n; i++)
      if (nd(c, i)->role == ROLE_UPD && cg_executed(nd(c, i)) && (!ps || (i < ps->norm_split) == part)) emit_node(c, i);
    if (part) {
      EMIT("  return %s;\n}\n", ps->norm_part >= 0 ? scalar_value(c, ps->norm_part) : "0.0");
      return;
    }
    EMIT("  /* the gradient accumulators start the next step at zero */\n");
    for (int k = 0; k < g->states.n; k++) {
      const Node *s = nd(c, g->states.a[k]);
      if (!s->ia[1]) EMIT("  memset(%s, 0, %lld); /* %s */\n", ptr(c, g->states.a[k]), (long long)ir_node_bytes(g, g->states.a[k]), s->name);
    }
    /* every pipeline stage computes the norm (pipeline.h); -1 only in one without any gradient */
    EMIT("  return %s;\n}\n", g->grad_norm >= 0 ? scalar_value(c, g->grad_norm) : c->pipe ? "-1.0" : "0.0");
    return;
  }
  for (int k = 0; k < g->inputs.n; k++) {
    const Node *x = nd(c, g->inputs.a[k]);
    const char *ty = x->dtype == DT_I32 ? "int32_t" : "float";
    EMIT("  %s *in%d = (%s *)inputs[%d]; /* %s */\n", ty, k, ty, k, x->name);
  }
  for (int i = 0; i < g->n; i++) /* label_smoothing's term: its cross_entropy's weight in this micro-batch */
    if (cg_ce_weight_in(nd(c, i)))
      EMIT("  float sc%d[1] = {%s};\n  (void)sc%d;\n", i, cg_ce_weight_in_value(nd(c, i), c->sp != NULL), i);
  for (int i = 0; i < g->n; i++) {
    const Node *n = nd(c, i);
    if (!cg_in_phase(n, ph) || n->role == ROLE_UPD || (c->only_role >= 0 && (int)n->role != c->only_role)) continue;
    emit_node(c, i);
  }
  if (!strstr(sig, "double *loss")) { /* a pipeline stage's backward */
    EMIT("}\n");
    return;
  }
  EMIT("  *loss = %s%s;\n", g->loss >= 0 ? scalar_value(c, g->loss) : "0.0", cg_tp_share(c->lw, -1));
  for (int k = 0; k < g->metrics.n; k++)
    EMIT("  metrics[%d] = %s%s; /* %s */\n", k, scalar_value(c, g->metrics.a[k].node), cg_tp_share(c->lw, k),
         g->metrics.a[k].name);
  if (!g->metrics.n) EMIT("  (void)metrics;\n");
  EMIT("}\n");
}



/* ---- the tables of the RtPlan ----------------------------------------------------------------- */

/* The fifth column of the states table: whether the runtime reduces state k over dp (a lowered
 * plan's accumulators, lower.h) (CgTables.state_reduce). */
static int cpu_state_reduce(const void *ctx, int k) {
  const Cg *c = ctx;
  int gk = c->pipe ? c->pipe->stages[c->stage].gstate[k] : k;
  return c->lw && c->lw->runtime_reduced[c->sp->g->states.a[gk]];
}

static void emit_tables(Cg *c) {
  const Graph *g = c->g;
  CgTables o = {.state_reduce = cpu_state_reduce, .ctx = c};
  cg_emit_tables(c->out, &c->pl, &o);
  for (int i = 0; i < g->n; i++) {
    const Node *n = nd(c, i);
    if (n->op != OP_CONST) continue;
    if (n->dtype == DT_I32) EMIT("static int32_t K%d[1] = {%lld};\n", i, (long long)n->fa[0]);
    else EMIT("static float K%d[1] = {%s};\n", i, cg_flt(n->fa[0]));
  }
}

/* ---- data and plan figures ------------------------------------------------------------------ */

static void emit_plan(Cg *c, const char *hash) {
  const Graph *g = c->g;
  const TrainConf *t = c->t;
  /* a lowered graph keeps the global micro-batch (dp ranks' samples) as its batch */
  CgPlanHead h = {.hash = hash,
                  .work_bytes = cp_fmt("%lld, /* training %s, evaluation %s */", (long long)last_work_bytes,
                                       cp_bytes_str((double)c->pl.work[CG_PH_TRAIN]),
                                       cp_bytes_str((double)c->pl.work[CG_PH_EVAL])),
                  .micro = c->sp ? g->batch / c->sp->dp : g->batch, .vocab = cg_vocab(g, c->sp), .nmetrics = g->metrics.n};
  cg_emit_plan_head(c->out, &c->pl, t, &h);
  if (c->pipe)
    EMIT("    .lr_at = lr_at,\n    .forward = pp_forward,\n    .backward = pp_backward,\n    .update = update,\n"
         "    .eval_step = eval_step,\n");
  else EMIT("    .lr_at = lr_at,\n    .micro_step = micro_step,\n    .update = update,\n    .eval_step = eval_step,\n");
  const MeshConf *m = t->mesh;
  cg_emit_plan_mesh(c->out, c->sp ? c->sp->dp : train_dp(t), m ? m->ndevices : 1, m);
  if (resume_hash_) EMIT("    .resume_hash = %s,\n", cg_c_string(resume_hash_));
  if (c->sp) cg_emit_plan_lowered(c->out, c->sp, &c->gt);
  if (c->pipe) cg_emit_plan_pipeline(c->out, c->sp, c->pipe, c->stage, c->ppa, t);
  EMIT("};\n");
  if (!c->pipe) EMIT("\nint main(int argc, char **argv) { return rt_main(argc, argv, &cplan_plan); }\n");
}

static void emit_prelude(Cg *c) {
  const Graph *g = c->g;
  const char *src = c->t->span.file >= 0 ? src_path(c->t->span.file) : "?";
  EMIT("/* plan.c: the training program of model '%s' from %s, generated by cplanc %s. Do not edit.\n"
       " *\n"
       " * micro_step runs the forward and backward pass of one micro-batch (%lld samples) and adds the\n"
       " * gradients into the accumulators; update clips and applies the %s update once per step;\n"
       " * eval_step runs the forward pass only. Params live in run->params (P), optimizer state and\n"
       " * gradient accumulators in run->state (S), everything else at planned offsets of the\n"
       " * run->work arena (F: f32, I: i32, B: bytes). */\n",
       g->model_name, src, CPLAN_VERSION, (long long)(c->sp ? g->batch / c->sp->dp : g->batch), /* this rank's */
       optimizer_name(c->t->optimizer.kind));
  EMIT("#include \"cplanrt.h\"\n#include \"fast.h\"\n#include \"fast_nn.h\"\n#include \"ref.h\"\n#include \"vocab_parallel.h\"\n\n#include <math.h>\n#include <stdint.h>\n"
       "#include <string.h>\n\n");
  EMIT("#define P(off) (run->params + (off))\n#define S(off) (run->state + (off))\n"
       "#define F(off) ((float *)(w + (off)))\n#define I(off) ((int32_t *)(w + (off)))\n#define B(off) ((uint8_t *)(w + (off)))\n");
  if (c->pipe) /* one of several stage files linked into one program: the names stay apart */
    EMIT("\n#define cplan_plan cplan_plan_s%d\nextern const RtPlan *const cplan_stages[];\n", c->stage);
  EMIT("\nextern const RtPlan cplan_plan;\n");
  if (c->pl.fu->ngroups) EMIT("\n/* fused elementwise kernels, generated through LLVM into kernels.o */\n");
  char proto[256];
  for (int k = 0; k < c->pl.fu->ngroups; k++) EMIT("%s\n", cg_llvm_prototype(&c->pl.fu->kernels[k], proto, sizeof proto));
  if (row_kernels.n) EMIT("\n/* row kernels (softmax, norms, last-axis sums), generated through LLVM */\n");
  for (int k = 0; k < row_kernels.n; k++) EMIT("%s\n", cg_llvm_prototype(&row_kernels.a[k], proto, sizeof proto));
}

static void emit_dropout_helper(Cg *c) {
  bool any = false;
  for (int i = 0; i < c->g->n; i++) any |= nd(c, i)->op == OP_DROPOUT;
  if (!any) return;
  EMIT("\n/* keep[i] for dropout node `key` in this micro-batch: the counter-based generator keyed by\n"
       " * (seed, node, step) at the element's index in the step's whole tensor (cg_dropout_map: per dim\n"
       " * the local size l, the whole size w and this rank's offset o), the same under every strategy */\n"
       "static void dropout_mask(const RtRun *run, uint8_t *keep, double p, uint64_t key, int r, const int64_t *l,\n"
       "                         const int64_t *w, const int64_t *o) {\n"
       "  uint64_t k = rt_splitmix64(key ^ rt_splitmix64((uint64_t)run->step));\n"
       "  int64_t n = 1, s = 1, idx[8] = {0}, stride[8];\n"
       "  for (int d = r - 1; d >= 0; d--) stride[d] = s, s *= w[d], n *= l[d];\n"
       "  for (int64_t i = 0; i < n; i++) {\n"
       "    uint64_t g = 0;\n"
       "    for (int d = 0; d < r; d++) g += (uint64_t)((idx[d] + o[d]) * stride[d]);\n"
       "    keep[i] = rt_uniform((uint64_t)cplan_plan.seed, k, g) >= p;\n"
       "    for (int d = r - 1; d >= 0 && ++idx[d] == l[d]; d--) idx[d] = 0;\n"
       "  }\n"
       "}\n");
}

/* ---- entry -------------------------------------------------------------------------------------- */

/* Without a lowered plan, the CPU backend runs pure data parallelism: dp over every device of the mesh
 * (build lowers any other strategy: cg_emit_c_spmd, and for pp one program per stage). */
static bool check_strategy(Cg *c) {
  const TrainConf *t = c->t;
  const StrategyConf *st = &t->strategy;
  int64_t devices = t->mesh ? t->mesh->ndevices : 1, dp = train_dp(t);
  if (c->sp && (c->sp->pp == 1 || c->pipe) && c->sp->dp * c->sp->tp * c->sp->pp == devices) return true;
  if (st->tp > 1 || st->pp > 1 || st->sp > 1 || st->zero > 0) {
    diag_error(st->span, "internal error: this strategy (tp, pp, sp or ZeRO) reached the one-program emitter without "
               "being lowered per rank");
    diag_hint("use `strategy = { dp = %lld }` or `strategy = auto`, and report this", (long long)devices);
    return false;
  }
  if (dp != devices) {
    diag_error(st->span, "dp = %lld but the mesh has %lld device%s: with data parallelism only, dp must be the "
               "device count", (long long)dp, (long long)devices, devices == 1 ? "" : "s");
    return false;
  }
  return true;
}

static bool check_conf(Cg *c) {
  const TrainConf *t = c->t;
  if (t->precision != PREC_F32) {
    diag_error(t->span, "precision %s is not supported on the cpu backend yet", precision_name(t->precision));
    diag_hint("use `precision = f32` (or --set train.precision=f32)");
    return false;
  }
  if (t->mesh && t->mesh->device.kind != DEV_CPU) {
    diag_error(t->mesh->span, "mesh '%s' has %s devices: this version builds for CPU devices only",
               t->mesh->name ? t->mesh->name : "?", t->mesh->device.name);
    return false;
  }
  return check_strategy(c) && cg_check_inputs(c->g, t, true);
}



/* The tables and the phase functions of plan.c's body, into c->out (cg_plan_emit's emit: twice). */
static bool emit_phases(void *ctx) {
  Cg *c = ctx;
  row_kernels.n = 0;
  emit_tables(c);
  if (c->sp) cg_emit_global_tables(c->out, c->sp, c->lw, c->pipe ? &c->pipe->stages[c->stage] : NULL, &c->gt);
  cg_emit_lr(c->out, c->t);
  emit_dropout_helper(c);
  if (c->pipe) {
    c->only_role = ROLE_FWD;
    emit_phase_fn(c, CG_PH_TRAIN, "static void pp_forward(RtRun *run, const void *const *inputs, double *loss, double *metrics)",
                  "one micro-batch, this stage's forward pass (what the backward reads stays in this slot's arena)");
    c->only_role = ROLE_BWD;
    emit_phase_fn(c, CG_PH_TRAIN, "static void pp_backward(RtRun *run, const void *const *inputs)",
                  "the same micro-batch (the same arena), this stage's backward pass and gradient accumulation");
    c->only_role = -1;
  } else
    emit_phase_fn(c, CG_PH_TRAIN, "static void micro_step(RtRun *run, const void *const *inputs, double *loss, double *metrics)",
                  "one micro-batch: the forward pass, the backward pass, gradient accumulation");
  if (c->pipe)
    emit_phase_fn(c, CG_PH_TRAIN, "static double update_grad_sumsq(RtRun *run)",
                  "once per step, before update: this stage's part of the squared gradient norm (its gradients')");
  emit_phase_fn(c, CG_PH_TRAIN, "static double update(RtRun *run)",
                "once per step: clipping and the optimizer update; returns the gradient norm before clipping");
  emit_phase_fn(c, CG_PH_EVAL, "static void eval_step(RtRun *run, const void *const *inputs, double *loss, double *metrics)",
                "evaluation: the forward pass only, dropout off");
  return c->ok;
}

static bool emit_c_impl(FILE *out, const Graph *g, const TrainConf *t, const char *source_hash, const StratPlan *sp,
                        const Lowered *lw, const Pipeline *pipe, int stage) {
  Cg c = {.g = g, .t = t, .out = out, .ok = true, .sp = sp, .lw = lw, .pipe = pipe, .stage = stage, .only_role = -1, .cur = -1};
  c.ppa = sp ? sp->naxes : 0; /* the runtime keeps the pp group after the placement axes' (cplanrt.h) */
  sym_prefix = pipe ? cp_fmt("s%d_", stage) : "";
  if (!check_conf(&c)) return false;
  Fusion *fu = cg_fusion_enabled() ? fusion_run(g) : cg_no_fusion(g);
  for (int k = 0; k < fu->ngroups && pipe; k++)
    fu->kernels[k].name = fu->groups[k].kernel.name = cp_fmt("%s%s", sym_prefix, fu->kernels[k].name);
  c.pl = (CgPlan){.g = g, .fu = fu, .sides = cpu_sides, .ctx = &c};
  if (pipe) c.pl.keep = &pipe->stages[stage].norm_part, c.pl.nkeep = 1; /* update_grad_sumsq's */
  last_fusion = fu;
  last_kernels = fu->kernels;
  last_nkernels = fu->ngroups;
  memset(&row_kernels, 0, sizeof row_kernels);
  cg_plan_place(&c.pl);
  if (!cg_check_sizes(g, "cpu")) return false;
  c.irline = cg_ir_lines(g);
  /* the body first, into a temporary file: the prelude declares the row kernels, which are
   * known only once every call is emitted */
  FILE *body = tmpfile();
  if (!body) {
    diag_error(t->span, "cannot create a temporary file for plan.c");
    return false;
  }
  c.out = body;
  if (!cg_plan_emit(&c.pl, body, emit_phases, &c)) {
    fclose(body);
    return false;
  }
  last_work_bytes = cg_plan_peak(&c.pl);
  if (last_work_bytes == 0) last_work_bytes = MP_ALIGN;
  emit_plan(&c, source_hash);
  c.out = out;
  emit_prelude(&c);
  cg_append(out, body);
  last_nkernels = c.pl.fu->ngroups + row_kernels.n;
  last_kernels = cp_alloc(sizeof(CgKernel) * (size_t)(last_nkernels + 1));
  if (c.pl.fu->ngroups) memcpy(last_kernels, c.pl.fu->kernels, sizeof(CgKernel) * (size_t)c.pl.fu->ngroups);
  if (row_kernels.n)
    memcpy(last_kernels + c.pl.fu->ngroups, row_kernels.a, sizeof(CgKernel) * (size_t)row_kernels.n);
  return c.ok;
}

bool cg_emit_c(FILE *out, const Graph *g, const TrainConf *t, const char *source_hash) {
  return emit_c_impl(out, g, t, source_hash, NULL, NULL, NULL, 0);
}

bool cg_emit_c_spmd(FILE *out, const StratPlan *sp, const Lowered *lw, const TrainConf *t, const char *source_hash) {
  return emit_c_impl(out, lw->g, t, source_hash, sp, lw, NULL, 0);
}

bool cg_emit_c_stage(FILE *out, const StratPlan *sp, const Lowered *lw, const struct Pipeline *pipe, int stage,
                     const TrainConf *t, const char *source_hash) {
  return emit_c_impl(out, pipe->stages[stage].g, t, source_hash, sp, lw, pipe, stage);
}
