/* plan_cmd.c: `cplanc plan`. The search's ranking of strategies (search.c): a table of the top K
 * with predicted step time, memory and communication, --json (cplan-plan/1), --trace (the
 * simulated step) and --report (an HTML page). The explanation of one strategy: the degrees and
 * logical mesh, the pipeline stages, every param's placement, the activations of each layer
 * (identical layers are printed once) and every collective with its bytes per device and step. A
 * pinned strategy with --explain is explained as written, without a search. */
#include "plan_cmd.h"
#include "pipeline.h"
#include "placement.h"
#include "search.h"
#include "train.h"

#include <errno.h>
#include <limits.h>

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *layer_name(const Graph *g, int l) { return l < 0 ? NULL : g->layer_names.a[l]; }

/* "(pre)" / "h.0" / "(post)" for a forward node. */
static const char *where(const Graph *g, int i, int first_layered) {
  int l = g->nodes[i].layer;
  return l >= 0 ? layer_name(g, l) : i < first_layered ? "(pre)" : "(post)";
}

/* A layer is identical to layer 0 when its forward nodes have the same ops and placements. */
static bool layer_same(const StratPlan *sp, int l) {
  const Graph *g = sp->g;
  int a = 0, b = 0;
  for (;;) {
    while (a < g->n && !(g->nodes[a].layer == 0 && g->nodes[a].role == ROLE_FWD)) a++;
    while (b < g->n && !(g->nodes[b].layer == l && g->nodes[b].role == ROLE_FWD)) b++;
    if (a == g->n || b == g->n) return a == g->n && b == g->n;
    if (g->nodes[a].op != g->nodes[b].op ||
        strcmp(placement_str(&sp->pl[a]), placement_str(&sp->pl[b])) != 0)
      return false;
    a++, b++;
  }
}

static const char *axes_str(const StratPlan *sp) {
  StrBuf b = {0};
  sb_puts(&b, "[");
  for (int a = 0; a < sp->naxes; a++)
    sb_printf(&b, "%s%s = %lld", a ? ", " : "", strat_axis_name(sp->axes[a].role), (long long)sp->axes[a].n);
  sb_puts(&b, "]");
  return sb_str(&b);
}

static const char *node_label(const Graph *g, int i) {
  const Node *n = &g->nodes[i];
  if (n->name) return cp_fmt("%%%d %s \"%s\"", i, ir_ops[n->op].name, n->name);
  if (n->op == OP_GRAD) return cp_fmt("%%%d grad of %s", i, ir_ops[g->nodes[n->fwd].op].name);
  return cp_fmt("%%%d %s", i, ir_ops[n->op].name);
}

/* ---- what one device sends ----------------------------------------------------------------
 * The figures of the explanation are per device and per optimizer step: a collective runs on the
 * devices of the pipeline stage that needs its value (pipeline.h), values cross between stages
 * as the build cuts them (the interleaved schedule's chunks included), and each is sent in the
 * type the program stores it in. */

typedef VEC(int) IntList;

typedef struct Ex {
  const StratPlan *sp;
  const TrainConf *t;
  int chunks;        /* stages per device: 2 under the interleaved schedule, else 1 */
  int nst;           /* stages: pp x chunks; stage s runs on pp rank s mod pp */
  int *st;           /* per node: its stage (pp_global_stages); -1: leaves (copied) */
  int *own;          /* per param and state: the stage that owns it (first reader) */
  bool *pg;          /* per node: part of a param's gradient (kept f32 under bf16 / f16) */
  int *defer;        /* per node: a tied gradient's sum whose input defer[j] is accumulated on its
                        stage and sent once a step (pp_deferred_sums), -1 */
  int low;           /* bytes of an activation element under bf16 / f16; 0 under f32 */
} Ex;

typedef struct Cross {
  int v, from, to;   /* the value, its stage, the reader's stage */
  Role role;         /* the phase it crosses in: its producer's */
  double bytes;      /* per device, per execution */
} Cross;
typedef VEC(Cross) CrossList;

static bool ex_leaf(const Node *n) { return (ir_ops[n->op].flags & OPF_LEAF) || n->nin == 0; }

/* The stage of every node among nst stages and each param's owner: the cut the build makes
 * (pp_global_stages). */
static void ex_stages(Ex *e) {
  e->own = cp_alloc(sizeof(int) * (size_t)(e->sp->g->n + 1));
  e->st = pp_global_stages(e->sp, e->nst, e->own);
  const Graph *g = e->sp->g;
  e->defer = pp_deferred_sums(g, e->st);
  for (int j = 0; j < g->n && !pp_tied_once(e->sp->zero); j++) e->defer[j] = -1;
}

/* Whether param p's gradient contributions from other stages are accumulated there and sent to
 * its owner once a step (pipeline.h), not with each micro-batch. */
static bool ex_tied_once(const Ex *e, int p) {
  const Graph *g = e->sp->g;
  for (int j = 0; j < g->n; j++)
    for (int k = 0; k < g->n && e->defer[j] >= 0; k++) { /* the ACCUM reading the sum j */
      const Node *a = &g->nodes[k];
      if (a->op == OP_ACCUM && a->in[1] == j && g->nodes[a->in[0]].ia[0] == p) return true;
    }
  return false;
}

/* A value summed into a param's gradient accumulator (the CUDA backend's mark_pg: the sums and
 * transposes that feed it stay f32, as the weight GEMMs write them). */
static void ex_mark_pg(Ex *e, int j) {
  const Graph *g = e->sp->g;
  const Node *n = &g->nodes[j];
  if (e->pg[j] || ex_leaf(n) || n->dtype != DT_F32) return;
  e->pg[j] = true;
  if (n->op == OP_ADD && n->nin == 2 && shape_eq(&g->nodes[n->in[0]].shape, &n->shape) &&
      shape_eq(&g->nodes[n->in[1]].shape, &n->shape))
    ex_mark_pg(e, n->in[0]), ex_mark_pg(e, n->in[1]);
  if (n->op == OP_GRAD && g->nodes[n->fwd].op == OP_TRANSPOSE) ex_mark_pg(e, n->in[0]);
}

static Ex *ex_new(const StratPlan *sp, const TrainConf *t) {
  const Graph *g = sp->g;
  Ex *e = cp_alloc(sizeof *e);
  e->sp = sp, e->t = t;
  e->chunks = sp->pp > 1 && t->strategy.pipeline == PS_INTERLEAVED ? 2 : 1;
  e->nst = (int)sp->pp * e->chunks;
  e->low = t->precision == PREC_F32 ? 0 : 2;
  e->pg = cp_alloc((size_t)(g->n + 1));
  ex_stages(e);
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (n->op == OP_ACCUM && n->role != ROLE_UPD && g->nodes[n->in[0]].op == OP_STATE) ex_mark_pg(e, n->in[1]);
  }
  return e;
}

/* Bytes per element of node i's value as the program stores and sends it. f32 plans (and every
 * CPU program): the node's dtype. bf16 / f16 (CUDA, emit_cu.c decide_storage): activations, their
 * gradients and the params' low copy the forward and backward read are 2 bytes; the update, param
 * gradients, reductions, scalars, the loss and metrics, norm weight and embedding table gradients
 * stay f32. */
static int ex_elem(const Ex *e, int i) {
  const Graph *g = e->sp->g;
  const Node *n = &g->nodes[i];
  if (n->dtype != DT_F32 || !e->low) return (int)dtype_size(n->dtype);
  if (n->op == OP_PARAM) return e->low;
  if (ex_leaf(n) || n->role == ROLE_UPD || e->pg[i] || shape_numel(&n->shape) == 1) return 4;
  if (n->op == OP_ACCUM || n->op == OP_ASSIGN) return 4; /* into an f32 param or state */
  if (n->op == OP_SUM || n->op == OP_MEAN || n->op == OP_MAX || n->op == OP_CROSS_ENTROPY) return 4;
  if (i == g->loss || i == g->grad_norm) return 4;
  for (int k = 0; k < g->metrics.n; k++)
    if (g->metrics.a[k].node == i) return 4;
  if (n->op == OP_GRAD) {
    OpId f = g->nodes[n->fwd].op;
    if ((f == OP_LAYER_NORM || f == OP_RMS_NORM) && n->ia[0] >= 1) return 4;
    if (f == OP_EMBEDDING && n->ia[0] == 0) return 4;
  }
  return e->low;
}

static const char *elem_name(int bytes, DType dt, const Ex *e) {
  if (dt != DT_F32) return dtype_name(dt);
  return bytes == 4 ? "f32" : e->t->precision == PREC_F16 ? "f16" : "bf16";
}

/* A collective's bytes in the type the program sends (strat_pin prices the graph's f32). */
static double coll_bytes(const Ex *e, const CollOp *o) {
  if (o->what) return o->bytes; /* an exchange of f32 row statistics inside the op */
  return o->bytes * ex_elem(e, o->node) / (double)dtype_size(e->sp->g->nodes[o->node].dtype);
}

/* The stage a collective runs on: its consumer's (the lowering inserts it there). */
static int coll_stage(const Ex *e, const CollOp *o) {
  int s = e->st[o->consumer];
  if (s < 0) s = e->st[o->node];
  return s < 0 ? 0 : s;
}

/* ---- collectives the program runs beyond the placements' list ---------------------------------
 * StratPlan.colls holds one reshard per (value, axis, placement): a value resharded once serves
 * every later reader. The program (lower.c) makes its copies per phase instead: ZeRO 3 gathers a
 * param before its forward use and again for its backward (lower.c regather: the whole param is
 * freed in between, as DeepSpeed's stage 3 does), and a node recomputed in the backward reshards
 * its inputs again there. These are the collective nodes of the per-rank graph (lower_spmd, what
 * the build emits) that the list does not account for: per (value, axis, collective), those
 * beyond the list's count, in program order. */
typedef struct Extra {
  CollOp o;          /* node: the value; consumer: the node of the global graph that needs it */
  bool regather;     /* a ZeRO-3 param gathered again for its backward (a GRAD reads it) */
} Extra;
typedef VEC(Extra) ExtraList;

static Collective lowered_coll(OpId op) {
  switch (op) {
  case OP_ALL_REDUCE: return COLL_ALL_REDUCE;
  case OP_ALL_GATHER: return COLL_ALL_GATHER;
  case OP_REDUCE_SCATTER: return COLL_REDUCE_SCATTER;
  case OP_ALL_TO_ALL: return COLL_ALL_TO_ALL;
  default: return COLL_NONE; /* SHARD_SLICE: a local slice, nothing sent */
  }
}

static ExtraList ex_extras(const Ex *e) {
  ExtraList xs = {0};
  const StratPlan *sp = e->sp;
  if (sp->naxes == 0) return xs;
  char err[512] = "";
  Lowered *lw = lower_spmd(sp, err, sizeof err);
  if (!lw) return xs; /* the build refuses it too (a lowering limitation), with this message */
  const Graph *lg = lw->g;
  int *used = cp_alloc(sizeof(int) * (size_t)(sp->colls.n + 1));
  for (int x = 0; x < lg->n; x++) {
    const Node *n = &lg->nodes[x];
    Collective k = lowered_coll(n->op);
    if (k == COLL_NONE) continue;
    int v = n->in[0]; /* the value: a chain of reshards (one per axis) leads back to it */
    while (lowered_coll(lg->nodes[v].op) != COLL_NONE || lg->nodes[v].op == OP_SHARD_SLICE) v = lg->nodes[v].in[0];
    int node = lw->origin.a[v], axis = (int)n->ia[0], match = -1, spare = -1;
    for (int i = 0; i < sp->colls.n && spare < 0; i++) {
      const CollOp *o = &sp->colls.a[i];
      if (o->what || o->node != node || o->axis != axis || o->coll != k) continue;
      if (match < 0) match = i;
      if (!used[i]) spare = i;
    }
    if (spare >= 0) {
      used[spare] = 1;
      continue;
    }
    int consumer = lw->origin.a[x];
    const Node *c = &sp->g->nodes[consumer];
    Extra xe = {.o = {.node = node, .consumer = consumer, .axis = axis, .coll = k,
                      .per_step = c->role == ROLE_UPD ? 1 : (int)sp->accum}};
    if (match >= 0) xe.o.from = sp->colls.a[match].from, xe.o.to = sp->colls.a[match].to;
    else if (k == COLL_ALL_GATHER) xe.o.from = pl_s((int)n->ia[1]), xe.o.to = pl_r();
    else if (k == COLL_REDUCE_SCATTER) xe.o.from = pl_p(), xe.o.to = pl_s((int)n->ia[1]);
    else if (k == COLL_ALL_TO_ALL) xe.o.from = pl_s((int)n->ia[1]), xe.o.to = pl_s((int)n->ia[2]);
    else xe.o.from = pl_p(), xe.o.to = pl_r();
    /* the tensor on the axis group: the larger side (all-gather: its output; reduce-scatter: its
     * input); an all-to-all's both sides are one device's part */
    Shape a = lg->nodes[n->in[0]].shape, b = n->shape;
    double numel = (double)(shape_numel(&a) > shape_numel(&b) ? shape_numel(&a) : shape_numel(&b));
    if (k == COLL_ALL_TO_ALL) numel *= (double)sp->axes[axis].n;
    xe.o.bytes = pl_coll_bytes(k, numel * ex_elem(e, node), sp->axes[axis].n);
    xe.regather = c->op == OP_GRAD && sp->g->nodes[node].op == OP_PARAM && k == COLL_ALL_GATHER &&
                  sp->axes[axis].role == AX_DP;
    VEC_PUSH(xs, xe);
  }
  return xs;
}

/* How the explanation names the node an extra collective's value goes to. */
static const char *extra_for(const Ex *e, const Extra *x) {
  const Graph *g = e->sp->g;
  const Node *c = &g->nodes[x->o.consumer];
  if (c->op != OP_GRAD && c->role == ROLE_BWD) return cp_fmt("%s (recomputed)", node_label(g, x->o.consumer));
  return node_label(g, x->o.consumer);
}

/* The values that cross between stages (pipeline.c: each value once per reading stage), in the
 * order of their readers. */
static CrossList ex_crossings(const Ex *e) {
  const Graph *g = e->sp->g;
  CrossList cs = {0};
  bool *seen = cp_alloc((size_t)g->n * (size_t)e->nst + 1);
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (e->st[i] < 0 || n->role == ROLE_UPD) continue; /* the update reads its own stage's only */
    for (int k = 0; k < n->nin; k++) {
      int v = n->in[k];
      if (e->defer[i] == k) continue; /* a tied gradient's part: once a step, below */
      if (e->st[v] < 0 || e->st[v] == e->st[i] || seen[(size_t)v * (size_t)e->nst + (size_t)e->st[i]]) continue;
      seen[(size_t)v * (size_t)e->nst + (size_t)e->st[i]] = true;
      Shape ls = lower_local_shape(e->sp, v);
      double bytes = (double)shape_numel(&ls) * ex_elem(e, v);
      VEC_PUSH(cs, ((Cross){v, e->st[v], e->st[i], g->nodes[v].role, bytes}));
    }
  }
  return cs;
}

static const char *stage_name(const Ex *e, int s) {
  if (e->chunks == 1) return cp_fmt("stage %d", s);
  return cp_fmt("stage %d (pp rank %d)", s, s % (int)e->sp->pp);
}

/* Under the ILP's param placements (sp->pins): the tp placement Megatron's rule gives each node of
 * sp->g (NULL otherwise, or where the rule refuses), and the tp axis. */
static const Pl *rule_tp(const StratPlan *sp, int *axis) {
  *axis = -1;
  for (int a = 0; a < sp->naxes; a++)
    if (sp->axes[a].role == AX_TP) *axis = a;
  if (!sp->pins || *axis < 0) return NULL;
  Pl *rule = cp_alloc(sizeof(Pl) * (size_t)(sp->g->n + 1));
  Pl **cons = cp_alloc(sizeof(Pl *) * (size_t)(sp->g->n + 1));
  return strat_tp_place(sp->g, sp->tp, sp->sp > 1, NULL, rule, cons, NULL) ? rule : NULL;
}

static void print_summary(FILE *f, const Ex *e) {
  const StratPlan *sp = e->sp;
  const TrainConf *t = e->t;
  const MeshConf *m = t->mesh;
  fprintf(f, "plan for %s on %s (%lld device%s)\n", sp->g->model_name, m && m->name ? m->name : "the local machine",
          (long long)(m ? m->ndevices : 1), m && m->ndevices == 1 ? "" : "s");
  const char *sched = "";
  if (sp->pp > 1)
    sched = e->chunks > 1 ? cp_fmt(", schedule = interleaved (%d chunks per device)", e->chunks)
            : t->strategy.pipeline == PS_GPIPE ? ", schedule = gpipe" : ", schedule = 1f1b";
  fprintf(f, "strategy: dp = %lld, tp = %lld, pp = %lld, sp = %lld, zero = %lld, micro = %lld, accumulation = %lld%s\n",
          (long long)sp->dp, (long long)sp->tp, (long long)sp->pp, (long long)sp->sp, (long long)sp->zero,
          (long long)sp->micro, (long long)sp->accum, sched);
  fprintf(f, "placement axes: %s (ranks: pp outermost, then dp, tp innermost)\n",
          sp->naxes ? axes_str(sp) : "none (every tensor whole on every device)");
  int a;
  const Pl *rule = rule_tp(sp, &a);
  if (sp->pins) {
    int differ = 0;
    for (int q = 0; rule && q < sp->g->params.n; q++)
      differ += !pl_eq(rule[sp->g->params.a[q]], sp->pl[sp->g->params.a[q]].ax[a]);
    fprintf(f, "tp placements: every param's is the plan's (tp_params, as the search's ILP chose them; %d otherwise than "
               "Megatron's rule, marked below), the rule's around them\n", differ);
  }
}

static void print_stages(FILE *f, const Ex *e) {
  const StratPlan *sp = e->sp;
  if (sp->pp <= 1) return;
  const Graph *g = sp->g;
  if (e->chunks == 1) fprintf(f, "\npipeline stages (schedule %s; layers split contiguously):\n",
                              sp->pp > 1 && e->t->strategy.pipeline == PS_GPIPE ? "gpipe" : "1f1b");
  else
    fprintf(f, "\npipeline stages (schedule interleaved, %d chunks per device: the layers split contiguously into %d "
               "stages, stage s on pp rank s mod %lld):\n", e->chunks, e->nst, (long long)sp->pp);
  for (int s = 0; s < e->nst; s++) {
    StrBuf b = {0};
    for (int l = 0; l < g->layer_names.n; l++)
      if (strat_layer_stage(g->layer_names.n, e->nst, l) == s) sb_printf(&b, "%s%s", b.len ? ", " : "", g->layer_names.a[l]);
    fprintf(f, "  %s: %s%s%s\n", stage_name(e, s), s == 0 ? "(pre), " : "", sb_str(&b), s == e->nst - 1 ? ", (post)" : "");
  }
  CrossList cs = ex_crossings(e);
  for (int k = 0; k < cs.n; k++) {
    const Cross *c = &cs.a[k];
    Shape ls = lower_local_shape(sp, c->v);
    int el = ex_elem(e, c->v);
    fprintf(f, "  send %s %s%s: stage %d -> %d (%s per device per micro-batch)\n", node_label(g, c->v),
            elem_name(el, g->nodes[c->v].dtype, e), shape_str(&ls), c->from, c->to, cp_bytes_str(c->bytes));
  }
  for (int q = 0; q < g->params.n; q++) {
    int p = g->params.a[q];
    StrBuf b = {0};
    bool *held = cp_alloc((size_t)e->nst);
    for (int i = 0; i < g->n; i++)
      for (int k = 0; k < g->nodes[i].nin; k++)
        if (g->nodes[i].in[k] == p && e->st[i] >= 0 && g->nodes[i].role != ROLE_UPD) held[e->st[i]] = true;
    for (int s = 0; s < e->nst; s++)
      if (held[s] && s != e->own[p]) sb_printf(&b, "%s%d", b.len ? ", " : "", s);
    if (b.len)
      fprintf(f, "  param %s is also read by stage %s (tied): stage %d owns it (%s, and it sends the updated "
                 "value, f32, after each update)\n", g->nodes[p].name, sb_str(&b), e->own[p],
              ex_tied_once(e, p) ? "the others accumulate their gradient contributions over the micro-batches and send "
                                   "them to it once a step, f32"
                                 : "the gradient contributions are sent to it with each micro-batch");
  }
}

static void print_params(FILE *f, const StratPlan *sp) {
  const Graph *g = sp->g;
  int a;
  const Pl *rule = rule_tp(sp, &a);
  fprintf(f, "\nparams %s:\n", axes_str(sp));
  for (int q = 0; q < g->params.n; q++) {
    int p = g->params.a[q];
    fprintf(f, "  %-28s %s%-14s %s", g->nodes[p].name, dtype_name(g->nodes[p].dtype), shape_str(&g->nodes[p].shape),
            placement_str(&sp->pl[p]));
    if (rule && !pl_eq(rule[p], sp->pl[p].ax[a])) fprintf(f, "  (the ILP's; Megatron's rule: %s)", pl_str(rule[p]));
    const Node *pn = &g->nodes[p];
    if (pn->ia[1] > 0) /* vocab_pad's: the pad past the valid entries is zero, and files hold the valid ones */
      fprintf(f, "  (padded for tp: %lld valid %s)", (long long)pn->ia[1],
              pn->ia[2] ? "columns" : pn->shape.rank == 1 ? "entries" : "rows");
    fputc('\n', f);
  }
  fprintf(f, "optimizer state and gradient accumulators:\n");
  for (int k = 0; k < g->states.n; k++) {
    int s = g->states.a[k];
    fprintf(f, "  %-36s %s\n", g->nodes[s].name, placement_str(&sp->pl[s]));
  }
}

static void print_activations(FILE *f, const Ex *e, int first) {
  const StratPlan *sp = e->sp;
  const Graph *g = sp->g;
  fprintf(f, "\nactivations (forward) %s:\n", axes_str(sp));
  const char *cur = "";
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (n->role != ROLE_FWD || (ir_ops[n->op].flags & OPF_LEAF)) continue;
    if (n->layer > 0 && layer_same(sp, n->layer)) continue;
    const char *w = where(g, i, first);
    if (strcmp(w, cur) != 0) fprintf(f, "  %s\n", w);
    cur = w;
    fprintf(f, "    %-26s %s%-16s %s\n", node_label(g, i), elem_name(ex_elem(e, i), n->dtype, e), shape_str(&n->shape),
            placement_str(&sp->pl[i]));
  }
  int same = 0;
  for (int l = 1; l < g->layer_names.n; l++) same += layer_same(sp, l);
  if (same) fprintf(f, "  %d more layer%s (%s ... %s) identical to %s\n", same, same == 1 ? "" : "s",
                    g->layer_names.a[1], g->layer_names.a[g->layer_names.n - 1], g->layer_names.a[0]);
}

static int coll_layer(const StratPlan *sp, const CollOp *o) { return sp->g->nodes[o->consumer].layer; }

/* Adds collective o (bytes per execution) to its stage's devices' totals tot[device * 4 + axis];
 * false (counting it in *skipped) when it is in a layer identical to the first, which is printed
 * for all, else its axis and stage labels for the line. */
static bool coll_count(const Ex *e, const CollOp *o, double bytes, double *tot, int *skipped, const char **ax,
                       const char **at) {
  const StratPlan *sp = e->sp;
  int pp = (int)sp->pp, s = coll_stage(e, o), l = coll_layer(sp, o);
  tot[(s % pp) * 4 + o->axis] += bytes * o->per_step;
  if (l > 0 && layer_same(sp, l)) {
    (*skipped)++;
    return false;
  }
  *ax = strat_axis_name(sp->axes[o->axis].role), *at = pp > 1 ? cp_fmt(" (stage %d)", s) : "";
  return true;
}

/* Every collective (identical layers once) with its bytes per device per execution, then what one
 * device sends per step: under pp, the devices of one stage run its collectives and send its
 * crossings, so the figures are those of the busiest stage's devices (each stage's total listed). */
static void print_colls(FILE *f, const Ex *e) {
  const StratPlan *sp = e->sp;
  const Graph *g = sp->g;
  int pp = (int)sp->pp, skipped = 0;
  double *tot = cp_alloc(sizeof(double) * (size_t)pp * 4); /* [device][axis 0..2, 3: pp] */
  fprintf(f, "\ncollectives (bytes sent per device; xN: executions per optimizer step%s):\n",
          pp > 1 ? "; stage: whose devices run it" : "");
  if (sp->colls.n == 0) fprintf(f, "  none\n");
  const char *ax, *at;
  for (int i = 0; i < sp->colls.n; i++) {
    const CollOp *o = &sp->colls.a[i];
    double bytes = coll_bytes(e, o);
    if (!coll_count(e, o, bytes, tot, &skipped, &ax, &at)) continue;
    if (o->what)
      fprintf(f, "  %-9s %-14s %s: %s, %s x%d%s\n", ax, pl_coll_name(o->coll), node_label(g, o->node), o->what,
              cp_bytes_str(bytes), o->per_step, at);
    else
      fprintf(f, "  %-9s %-14s %s %s -> %s for %s, %s x%d%s\n", ax, pl_coll_name(o->coll), node_label(g, o->node),
              pl_str(o->from), pl_str(o->to), node_label(g, o->consumer), cp_bytes_str(bytes), o->per_step, at);
  }
  ExtraList xs = ex_extras(e);
  for (int i = 0; i < xs.n; i++) {
    const CollOp *o = &xs.a[i].o;
    double bytes = o->bytes;
    if (!coll_count(e, o, bytes, tot, &skipped, &ax, &at)) continue;
    fprintf(f, "  %-9s %-14s %s %s -> %s again for %s, %s x%d%s\n", ax, pl_coll_name(o->coll), node_label(g, o->node),
            pl_str(o->from), pl_str(o->to), extra_for(e, &xs.a[i]), cp_bytes_str(bytes), o->per_step, at);
  }
  bool regather = false;
  for (int i = 0; i < xs.n; i++) regather |= xs.a[i].regather;
  if (regather)
    fprintf(f, "  (ZeRO 3 gathers each param again for its backward: the whole param is freed after its forward "
               "use, as in DeepSpeed's stage 3)\n");
  if (skipped) fprintf(f, "  ... and %d more in the layers identical to %s\n", skipped, g->layer_names.a[0]);
  if (pp > 1) {
    /* point to point on the pp group: the crossings (per micro-batch), a tied param's new value
     * from its owner to each other holder (f32, once per step), and the sum of the stages' parts
     * of the squared gradient norm (f64, runtime/train.c pp_update) */
    CrossList cs = ex_crossings(e);
    for (int k = 0; k < cs.n; k++) tot[(cs.a[k].from % pp) * 4 + 3] += cs.a[k].bytes * (double)sp->accum;
    double tied = 0;
    for (int q = 0; q < g->params.n; q++) {
      int p = g->params.a[q];
      bool *held = cp_alloc((size_t)e->nst);
      for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
          if (g->nodes[i].in[k] == p && e->st[i] >= 0 && g->nodes[i].role != ROLE_UPD) held[e->st[i]] = true;
      Shape ls = lower_local_shape(sp, p);
      bool once = ex_tied_once(e, p);
      for (int s = 0; s < e->nst; s++)
        if (held[s] && s != e->own[p]) {
          tot[(e->own[p] % pp) * 4 + 3] += (double)shape_numel(&ls) * 4, tied = 1;
          if (once) tot[(s % pp) * 4 + 3] += (double)shape_numel(&ls) * 4, tied = 2; /* its accumulated part */
        }
    }
    for (int d = 0; d < pp; d++) tot[d * 4 + 3] += pl_coll_bytes(COLL_ALL_REDUCE, 8, pp);
    fprintf(f, "  pp        send           each value of the stages above x%lld%s; all-reduce of the stages' parts of the "
               "squared gradient norm (f64) x1\n", (long long)sp->accum,
            tied == 2 ? "; the tied params' accumulated gradient parts and updated values x1"
            : tied ? "; the tied params' updated values x1" : "");
  }
  int busy = 0;
  double *dev = cp_alloc(sizeof(double) * (size_t)pp);
  for (int d = 0; d < pp; d++) {
    for (int a = 0; a < 4; a++) dev[d] += tot[d * 4 + a];
    if (dev[d] > dev[busy]) busy = d;
  }
  if (pp > 1) {
    StrBuf b = {0};
    for (int d = 0; d < pp; d++) sb_printf(&b, "%s%s", d ? ", " : "", cp_bytes_str(dev[d]));
    fprintf(f, "per device per step, by pp rank%s: %s; the totals are pp rank %d's (the busiest)\n",
            e->chunks > 1 ? " (its stages together)" : " (stage)", sb_str(&b), busy);
  }
  for (int a = 0; a < sp->naxes; a++)
    fprintf(f, "total on %s: %s per device per step\n", strat_axis_name(sp->axes[a].role),
            cp_bytes_str(tot[busy * 4 + a]));
  if (pp > 1) fprintf(f, "total on pp: %s per device per step\n", cp_bytes_str(tot[busy * 4 + 3]));
  if (sp->naxes + (pp > 1) > 1) fprintf(f, "total: %s per device per step\n", cp_bytes_str(dev[busy]));
}

static cJSON *pl_json(const StratPlan *sp, int i) { return cJSON_CreateString(placement_str(&sp->pl[i])); }

/* One collective of the explanation as a --json object, appended to colls (note: NULL, or why). */
static void coll_json(cJSON *colls, const Ex *e, const CollOp *c, const char *note, double bytes) {
  const StratPlan *sp = e->sp;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "node", c->node);
  cJSON_AddNumberToObject(o, "consumer", c->consumer);
  cJSON_AddStringToObject(o, "axis", strat_axis_name(sp->axes[c->axis].role));
  cJSON_AddStringToObject(o, "from", pl_str(c->from));
  cJSON_AddStringToObject(o, "to", pl_str(c->to));
  cJSON_AddStringToObject(o, "collective", pl_coll_name(c->coll));
  if (note) cJSON_AddStringToObject(o, "note", note);
  cJSON_AddNumberToObject(o, "bytes", bytes);
  cJSON_AddNumberToObject(o, "per_step", c->per_step);
  if (sp->pp > 1) cJSON_AddNumberToObject(o, "stage", coll_stage(e, c));
  cJSON_AddItemToArray(colls, o);
}

/* The explanation of a pinned strategy as JSON fields of root. */
static void add_explain_json(cJSON *root, const StratPlan *sp, const TrainConf *t) {
  const Graph *g = sp->g;
  cJSON *st = cJSON_AddObjectToObject(root, "strategy");
  cJSON_AddBoolToObject(st, "auto", t->strategy.is_auto);
  const char *keys[] = {"dp", "tp", "pp", "sp", "zero", "micro", "accumulation"};
  const int64_t vals[] = {sp->dp, sp->tp, sp->pp, sp->sp, sp->zero, sp->micro, sp->accum};
  for (int k = 0; k < 7; k++) cJSON_AddNumberToObject(st, keys[k], (double)vals[k]);
  cJSON *axes = cJSON_AddArrayToObject(root, "axes");
  for (int a = 0; a < sp->naxes; a++) {
    cJSON *ax = cJSON_CreateObject();
    cJSON_AddStringToObject(ax, "name", strat_axis_name(sp->axes[a].role));
    cJSON_AddNumberToObject(ax, "size", (double)sp->axes[a].n);
    cJSON_AddItemToArray(axes, ax);
  }
  Ex *e = ex_new(sp, t);
  cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "node", i);
    cJSON_AddStringToObject(o, "op", ir_ops[n->op].name);
    if (n->name) cJSON_AddStringToObject(o, "name", n->name);
    cJSON_AddStringToObject(o, "role", n->role == ROLE_FWD ? "forward" : n->role == ROLE_BWD ? "backward" : "update");
    if (n->layer >= 0) cJSON_AddStringToObject(o, "layer", g->layer_names.a[n->layer]);
    cJSON_AddStringToObject(o, "shape", shape_str(&n->shape));
    cJSON_AddItemToObject(o, "placement", pl_json(sp, i));
    /* the stage the build runs it on (a param, state or input: its owner, the first that reads it) */
    cJSON_AddNumberToObject(o, "stage", e->st[i] >= 0 ? e->st[i] : e->own[i] >= 0 ? e->own[i] : sp->stage[i]);
    cJSON_AddItemToArray(tensors, o);
  }
  cJSON *colls = cJSON_AddArrayToObject(root, "collectives");
  for (int i = 0; i < sp->colls.n; i++) coll_json(colls, e, &sp->colls.a[i], sp->colls.a[i].what, coll_bytes(e, &sp->colls.a[i]));
  ExtraList xs = ex_extras(e);
  for (int i = 0; i < xs.n; i++)
    coll_json(colls, e, &xs.a[i].o, xs.a[i].regather ? "gathered again for the backward (ZeRO 3)" : "again in the backward",
              xs.a[i].o.bytes);
}

/* Pins t's strategy on its training graph (strat_degrees fills what is left out). NULL after a
 * diagnostic. */
static StratPlan *pin_strategy(Sema *s, const TrainConf *t, TrainConf *tc) {
  Program *prog = sema_program(s);
  int64_t dp, tp, pp, micro;
  if (!strat_degrees(prog, t, &dp, &tp, &pp, &micro)) return NULL;
  /* The graph of one global micro-batch (dp · micro samples): placements split it over dp. */
  *tc = *t;
  tc->strategy.dp = dp;
  tc->strategy.micro = micro;
  Graph *g = sema_build_model(s, t->model, t->model_call, dp * micro);
  if (!g || !train_graph(g, tc)) return NULL;
  StratPlan *sp = strat_pin(prog, g, tc);
  if (sp) sp->sp = t->strategy.sp > 1 ? t->strategy.sp : 1;
  return sp;
}

/* Today's explanation of a strategy: summary, stages, (placements,) collectives. */
static void explain_text(FILE *out, const StratPlan *sp, const TrainConf *t, bool explain) {
  const Graph *g = sp->g;
  int first = g->n;
  for (int i = 0; i < g->n && first == g->n; i++)
    if (g->nodes[i].layer >= 0) first = i;
  Ex *e = ex_new(sp, t);
  print_summary(out, e);
  print_stages(out, e);
  if (explain) {
    print_params(out, sp);
    print_activations(out, e, first);
  }
  print_colls(out, e);
}

/* ---- the search's ranking ------------------------------------------------------------------ */

static const char *rc_str(Recompute r) { return r == RC_FULL ? "full" : r == RC_SELECTIVE ? "selective" : "none"; }
static const char *sched_str(const SrchPlan *p) {
  if (p->pp <= 1) return "-";
  return p->sched == PS_GPIPE ? "gpipe" : p->sched == PS_INTERLEAVED ? "interleaved" : "1f1b";
}

static const char *secs_str(double s) {
  if (s >= 100) return cp_fmt("%.0f s", s);
  if (s >= 1) return cp_fmt("%.2f s", s);
  if (s >= 1e-3) return cp_fmt("%.2f ms", s * 1e3);
  return cp_fmt("%.1f us", s * 1e6);
}

static const char *count_str(double v) {
  if (v >= 1e9) return cp_fmt("%.2fG", v / 1e9);
  if (v >= 1e6) return cp_fmt("%.2fM", v / 1e6);
  if (v >= 1e3) return cp_fmt("%.1fK", v / 1e3);
  return cp_fmt("%.0f", v);
}

static const char *mesh_str(const TrainConf *t) {
  const MeshConf *m = t->mesh;
  if (!m) return "the local machine (1 device)";
  return cp_fmt("%s (%lld x %s)", m->name ? m->name : "the local machine", (long long)m->ndevices, m->device.name);
}

static void print_ranking(FILE *f, const SrchResult *r, const TrainConf *t) {
  fprintf(f, "search for %s on %s: batch %lld, memory limit %s per device\n", r->model, mesh_str(t),
          (long long)t->batch, cp_bytes_str(r->memory));
  fprintf(f, "  %d layer%s in %d class%s (each class priced once), %lld configurations", r->layers,
          r->layers == 1 ? "" : "s", r->layer_classes, r->layer_classes == 1 ? "" : "es", (long long)r->considered);
  if (r->ilp_solves) fprintf(f, ", %lld ILPs (largest: %d variables)", (long long)r->ilp_solves, r->ilp_vars);
  fprintf(f, "\n");
  fprintf(f, "\n%4s %5s %4s %4s %4s %4s %5s %5s %-9s %-11s %10s %10s %6s %11s %11s %6s\n", "rank", "dp", "tp", "pp",
          "sp", "zero", "micro", "mbs", "recompute", "schedule", "step", "tokens/s", "MFU", "memory/dev", "comm/dev",
          "bubble");
  for (int i = 0; i < r->n; i++) {
    const SrchPlan *p = &r->plans[i];
    fprintf(f, "%4d %5lld %4s %4lld %4lld %4lld %5lld %5lld %-9s %-11s %10s %10s %5.1f%% %11s %11s %5.1f%%\n", i + 1,
            (long long)p->dp, cp_fmt("%lld%s", (long long)p->tp, p->pins ? "*" : ""), (long long)p->pp, (long long)p->sp, (long long)p->zero,
            (long long)p->micro, (long long)p->microbatches, rc_str(p->recompute), sched_str(p),
            secs_str(p->step_time), count_str(p->tokens_per_s), 100 * p->mfu, cp_bytes_str(p->mem_total),
            cp_bytes_str(p->comm_bytes), 100 * p->bubble);
  }
  fprintf(f, "(micro: samples per micro-batch per replica; mbs: micro-batches per step; comm/dev: bytes sent per "
             "device per step)\n");
  bool ilp = false;
  for (int i = 0; i < r->n; i++) ilp |= r->plans[i].pins != NULL;
  if (ilp) fprintf(f, "(tp*: the params placed on tp as the search's ILP chose, not as Megatron's rule does; `plan "
                      "--json` saves them, `plan --plan F.json --explain` marks them)\n");
  const SrchPlan *b = &r->plans[0];
  fprintf(f, "\nbest: %s per step, %s per device (%.1f%% MFU), %s tokens/s\n", secs_str(b->step_time),
          cp_si_str(b->tflops, "FLOP/s"), 100 * b->mfu, count_str(b->tokens_per_s));
  fprintf(f, "  memory per device: params %s, grads %s, optimizer %s, activations %s, workspace %s = %s\n",
          cp_bytes_str(b->mem_params), cp_bytes_str(b->mem_grads), cp_bytes_str(b->mem_optim),
          cp_bytes_str(b->mem_acts), cp_bytes_str(b->mem_workspace), cp_bytes_str(b->mem_total));
  StrBuf sl = {0};
  for (int s = 0; s < b->pp; s++) sb_printf(&sl, "%s%d", s ? ", " : "", b->stage_layers[s]);
  fprintf(f, "  per micro-batch: forward %s, backward %s (stage 0); gradient sync %s, optimizer update %s per step\n",
          secs_str(b->stage_fwd[0]), secs_str(b->stage_bwd[0]), secs_str(b->dp_sync), secs_str(b->update));
  if (b->pp > 1) fprintf(f, "  layers per stage: %s\n", sb_str(&sl));
}

static cJSON *plan_json(const SrchPlan *p) {
  cJSON *o = cJSON_CreateObject();
  const char *keys[] = {"dp", "tp", "pp", "sp", "zero", "micro", "microbatches"};
  const int64_t vals[] = {p->dp, p->tp, p->pp, p->sp, p->zero, p->micro, p->microbatches};
  for (int k = 0; k < 7; k++) cJSON_AddNumberToObject(o, keys[k], (double)vals[k]);
  cJSON_AddStringToObject(o, "recompute", rc_str(p->recompute));
  cJSON_AddStringToObject(o, "pipeline", p->pp > 1 ? sched_str(p) : "1f1b");
  if (p->v > 1) cJSON_AddNumberToObject(o, "chunks", (double)p->v);
  cJSON_AddNumberToObject(o, "step_time_s", p->step_time);
  cJSON_AddNumberToObject(o, "tokens_per_s", p->tokens_per_s);
  cJSON_AddNumberToObject(o, "mfu", p->mfu);
  cJSON_AddNumberToObject(o, "tflops_per_device", p->tflops / 1e12);
  cJSON_AddNumberToObject(o, "memory_per_device_bytes", p->mem_total);
  cJSON *m = cJSON_AddObjectToObject(o, "memory");
  cJSON_AddNumberToObject(m, "params", p->mem_params);
  cJSON_AddNumberToObject(m, "grads", p->mem_grads);
  cJSON_AddNumberToObject(m, "optimizer", p->mem_optim);
  cJSON_AddNumberToObject(m, "activations", p->mem_acts);
  cJSON_AddNumberToObject(m, "workspace", p->mem_workspace);
  cJSON_AddNumberToObject(o, "comm_bytes_per_device", p->comm_bytes);
  cJSON_AddNumberToObject(o, "bubble", p->bubble);
  cJSON *sl = cJSON_AddArrayToObject(o, "stage_layers");
  for (int s = 0; s < p->pp; s++) cJSON_AddItemToArray(sl, cJSON_CreateNumber(p->stage_layers[s]));
  if (p->pins) { /* every param's tp placement, as the search's ILP chose it (build --plan takes them) */
    cJSON *tpp = cJSON_AddObjectToObject(o, "tp_params");
    for (int i = 0; i < p->pins_g->n; i++)
      if (p->pins[i] != PIN_NONE)
        cJSON_AddStringToObject(tpp, p->pins_g->nodes[i].name, p->pins[i] < 0 ? "R" : cp_fmt("S(%d)", p->pins[i]));
  }
  return o;
}

/* ---- the simulated step (--trace, --report) ---------------------------------------------------- */

typedef struct Ev {
  int stage;
  char kind;           /* 'F' forward, 'B' backward (with recompute), 'S' gradient sync, 'U' update */
  int micro;
  double t0, t1;
} Ev;
typedef VEC(Ev) EvVec;

/* Replays the schedule with the plan's per-stage times: forward j of stage s waits for stage s-1's
 * and the send; backward j waits for stage s+1's. 1F1B runs pp - s forwards first, then one
 * backward per forward; GPipe all forwards, then all backwards. Interleaving is replayed as 1F1B
 * on v times as many chunks, each 1/v as long. */
static EvVec simulate(const SrchPlan *p) {
  EvVec ev = {0};
  int pp = (int)p->pp, v = (int)(p->v > 0 ? p->v : 1), m = (int)p->microbatches * v;
  double **fend = cp_alloc(sizeof(double *) * (size_t)pp), **bend = cp_alloc(sizeof(double *) * (size_t)pp);
  char **order = cp_alloc(sizeof(char *) * (size_t)pp);
  int *pos = cp_alloc(sizeof(int) * (size_t)pp), *nf = cp_alloc(sizeof(int) * (size_t)pp),
      *nb = cp_alloc(sizeof(int) * (size_t)pp);
  double *free_at = cp_alloc(sizeof(double) * (size_t)pp);
  for (int s = 0; s < pp; s++) {
    fend[s] = cp_alloc(sizeof(double) * (size_t)m);
    bend[s] = cp_alloc(sizeof(double) * (size_t)m);
    order[s] = cp_alloc((size_t)(2 * m + 1));
    int warm = p->sched == PS_GPIPE ? m : (pp - s < m ? pp - s : m), k = 0, f = 0, b = 0;
    for (; f < warm; f++) order[s][k++] = 'F';
    while (b < m) {
      order[s][k++] = 'B', b++;
      if (f < m) order[s][k++] = 'F', f++;
    }
  }
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < pp; s++) {
      while (pos[s] < 2 * m) {
        char op = order[s][pos[s]];
        double ready;
        if (op == 'F') {
          int j = nf[s];
          if (s > 0 && j >= nf[s - 1]) break;
          ready = s > 0 ? fend[s - 1][j] + p->p2p : 0;
        } else {
          int j = nb[s];
          if (j >= nf[s] || (s < pp - 1 && j >= nb[s + 1])) break;
          ready = s < pp - 1 ? bend[s + 1][j] + p->p2p : fend[s][j];
        }
        double t0 = ready > free_at[s] ? ready : free_at[s];
        double d = (op == 'F' ? p->stage_fwd[s] : p->stage_bwd[s]) / v;
        int j = op == 'F' ? nf[s]++ : nb[s]++;
        (op == 'F' ? fend : bend)[s][j] = free_at[s] = t0 + d;
        VEC_PUSH(ev, ((Ev){s, op, j / v, t0, t0 + d}));
        pos[s]++;
        progress = true;
      }
    }
  }
  double end = 0;
  for (int s = 0; s < pp; s++) end = free_at[s] > end ? free_at[s] : end;
  double sync0 = end - p->dp_hidden, sync1 = sync0 + p->dp_sync, upd = sync1 > end ? sync1 : end;
  for (int s = 0; s < pp; s++) { /* the gradient sync starts under the last backward (GPUs) */
    if (p->dp_sync > 0) VEC_PUSH(ev, ((Ev){s, 'S', 0, sync0, sync1}));
    VEC_PUSH(ev, ((Ev){s, 'U', 0, upd, upd + p->update}));
  }
  return ev;
}

static const char *ev_name(const Ev *e) {
  switch (e->kind) {
  case 'F': return cp_fmt("forward %d", e->micro);
  case 'B': return cp_fmt("backward %d", e->micro);
  case 'S': return "gradient sync (dp)";
  default: return "optimizer update";
  }
}

static bool write_trace(const char *path, const SrchPlan *p) {
  FILE *f = fopen(path, "w");
  if (!f) {
    diag_error(SPAN_NONE, "%s: cannot write the trace: %s", path, strerror(errno));
    return false;
  }
  EvVec ev = simulate(p);
  fprintf(f, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"source\": \"cplanc plan (simulated)\", "
             "\"step_time_s\": %.9g},\n\"traceEvents\": [\n", p->step_time);
  for (int s = 0; s < p->pp; s++)
    fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"stage %d\"}},\n", s, s);
  for (int i = 0; i < ev.n; i++) {
    const Ev *e = &ev.a[i];
    fprintf(f, "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": 0, \"ts\": %.3f, \"dur\": %.3f}%s\n",
            ev_name(e), e->kind == 'S' ? "comm" : "compute", e->stage, e->t0 * 1e6, (e->t1 - e->t0) * 1e6,
            i + 1 < ev.n ? "," : "");
  }
  fprintf(f, "]}\n");
  bool ok = fclose(f) == 0;
  if (!ok) diag_error(SPAN_NONE, "%s: cannot write the trace: %s", path, strerror(errno));
  return ok;
}

static void html_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '&') fputs("&amp;", f);
    else fputc(*s, f);
  }
}

static bool write_report(const char *path, const SrchResult *r, const TrainConf *t) {
  FILE *f = fopen(path, "w");
  if (!f) {
    diag_error(SPAN_NONE, "%s: cannot write the report: %s", path, strerror(errno));
    return false;
  }
  const SrchPlan *b = &r->plans[0];
  fprintf(f, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>cplan plan: ");
  html_escape(f, r->model);
  fprintf(f, "</title>\n<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee}"
             "svg text{font-size:11px;font-family:sans-serif}</style></head><body>\n<h1>");
  html_escape(f, r->model);
  fprintf(f, " on ");
  html_escape(f, mesh_str(t));
  fprintf(f, "</h1>\n<p>batch %lld, memory limit %s per device; %lld configurations, %lld ILPs, search %.3f s.</p>\n",
          (long long)t->batch, cp_bytes_str(r->memory), (long long)r->considered, (long long)r->ilp_solves, r->seconds);
  /* the top K */
  fprintf(f, "<h2>Top %d</h2>\n<table><tr><th>rank</th><th>dp</th><th>tp</th><th>pp</th><th>sp</th><th>zero</th>"
             "<th>micro</th><th>micro-batches</th><th>recompute</th><th>schedule</th><th>step</th><th>tokens/s</th>"
             "<th>MFU</th><th>memory/device</th><th>comm/device</th><th>bubble</th></tr>\n", r->n);
  for (int i = 0; i < r->n; i++) {
    const SrchPlan *p = &r->plans[i];
    fprintf(f, "<tr><td>%d</td><td>%lld</td><td>%lld</td><td>%lld</td><td>%lld</td><td>%lld</td><td>%lld</td>"
               "<td>%lld</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%.1f%%</td><td>%s</td><td>%s</td>"
               "<td>%.1f%%</td></tr>\n", i + 1, (long long)p->dp, (long long)p->tp, (long long)p->pp, (long long)p->sp,
            (long long)p->zero, (long long)p->micro, (long long)p->microbatches, rc_str(p->recompute), sched_str(p),
            secs_str(p->step_time), count_str(p->tokens_per_s), 100 * p->mfu, cp_bytes_str(p->mem_total),
            cp_bytes_str(p->comm_bytes), 100 * p->bubble);
  }
  fprintf(f, "</table>\n");
  /* the pipeline timeline of the best plan */
  EvVec ev = simulate(b);
  double end = 0;
  for (int i = 0; i < ev.n; i++) end = ev.a[i].t1 > end ? ev.a[i].t1 : end;
  int W = 1000, row = 22, H = (int)b->pp * row + 30;
  fprintf(f, "<h2>Pipeline timeline of the best plan (simulated step: %s)</h2>\n<svg width=\"%d\" height=\"%d\">\n",
          secs_str(end), W + 70, H);
  for (int s = 0; s < b->pp; s++) fprintf(f, "<text x=\"0\" y=\"%d\">stage %d</text>\n", s * row + 15, s);
  for (int i = 0; i < ev.n; i++) {
    const Ev *e = &ev.a[i];
    const char *col = e->kind == 'F' ? "#4c8bf5" : e->kind == 'B' ? "#f5a74c" : e->kind == 'S' ? "#9c4cf5" : "#4cb050";
    double x = 60 + (end > 0 ? e->t0 / end : 0) * W, w = end > 0 ? (e->t1 - e->t0) / end * W : 0;
    fprintf(f, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" stroke=\"#fff\" stroke-width=\"0.3\">"
               "<title>%s: %s</title></rect>\n", x, e->stage * row, w > 0.2 ? w : 0.2, row - 4, col, ev_name(e),
            secs_str(e->t1 - e->t0));
  }
  fprintf(f, "<text x=\"60\" y=\"%d\">0</text><text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", H - 5, W + 60,
          H - 5, secs_str(end));
  fprintf(f, "</svg>\n<p>blue: forward, orange: backward, purple: gradient sync, green: optimizer update.</p>\n");
  /* memory breakdown */
  const char *mn[] = {"params", "grads", "optimizer", "activations", "workspace"};
  const double mv[] = {b->mem_params, b->mem_grads, b->mem_optim, b->mem_acts, b->mem_workspace};
  const char *mc[] = {"#4c8bf5", "#f5a74c", "#9c4cf5", "#e05555", "#999999"};
  double lim = r->memory > b->mem_total && r->memory < 1e30 ? r->memory : b->mem_total;
  fprintf(f, "<h2>Memory per device of the best plan (worst stage): %s of %s</h2>\n<svg width=\"%d\" height=\"70\">\n",
          cp_bytes_str(b->mem_total), cp_bytes_str(r->memory), W + 70);
  double x = 0;
  for (int k = 0; k < 5; k++) {
    double w = lim > 0 ? mv[k] / lim * W : 0;
    fprintf(f, "<rect x=\"%.2f\" y=\"0\" width=\"%.2f\" height=\"30\" fill=\"%s\"><title>%s: %s</title></rect>\n", x, w,
            mc[k], mn[k], cp_bytes_str(mv[k]));
    fprintf(f, "<rect x=\"%d\" y=\"42\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"52\">%s %s</text>\n",
            k * 200, mc[k], k * 200 + 14, mn[k], cp_bytes_str(mv[k]));
    x += w;
  }
  fprintf(f, "<line x1=\"%d\" y1=\"0\" x2=\"%d\" y2=\"34\" stroke=\"#000\" stroke-width=\"2\"/>\n</svg>\n",
          (int)(lim > 0 ? r->memory / lim * W : 0) < W ? (int)(r->memory / lim * W) : W - 1,
          (int)(lim > 0 ? r->memory / lim * W : 0) < W ? (int)(r->memory / lim * W) : W - 1);
  /* top K: step time against memory */
  double tmax = 0, mmax = 0;
  for (int i = 0; i < r->n; i++) {
    if (r->plans[i].step_time > tmax) tmax = r->plans[i].step_time;
    if (r->plans[i].mem_total > mmax) mmax = r->plans[i].mem_total;
  }
  int PW = 500, PH = 300;
  fprintf(f, "<h2>Top %d: step time against memory per device</h2>\n<svg width=\"%d\" height=\"%d\">\n", r->n, PW + 80,
          PH + 40);
  fprintf(f, "<line x1=\"60\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000\"/><line x1=\"60\" y1=\"0\" x2=\"60\" y2=\"%d\" "
             "stroke=\"#000\"/>\n", PH, PW + 60, PH, PH);
  fprintf(f, "<text x=\"60\" y=\"%d\">0</text><text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s per device</text>\n", PH + 15,
          PW + 60, PH + 15, cp_bytes_str(mmax * 1.1));
  fprintf(f, "<text x=\"0\" y=\"12\">%s</text><text x=\"0\" y=\"%d\">step</text>\n", secs_str(tmax * 1.1), PH / 2);
  for (int i = r->n - 1; i >= 0; i--) {
    const SrchPlan *p = &r->plans[i];
    double px = 60 + p->mem_total / (mmax * 1.1) * PW, py = PH - p->step_time / (tmax * 1.1) * PH;
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\"><title>#%d dp %lld tp %lld pp %lld zero %lld micro "
               "%lld recompute %s: %s, %s</title></circle><text x=\"%.1f\" y=\"%.1f\">%d</text>\n", px, py,
            i == 0 ? "#e05555" : "#4c8bf5", i + 1, (long long)p->dp, (long long)p->tp, (long long)p->pp,
            (long long)p->zero, (long long)p->micro, rc_str(p->recompute), secs_str(p->step_time),
            cp_bytes_str(p->mem_total), px + 7, py + 4, i + 1);
  }
  fprintf(f, "</svg>\n</body></html>\n");
  bool ok = fclose(f) == 0;
  if (!ok) diag_error(SPAN_NONE, "%s: cannot write the report: %s", path, strerror(errno));
  return ok;
}

/* ---- one row per plan ------------------------------------------------------------------------
 * The search tries every recompute mode for every configuration. Where a mode changes nothing in
 * the program (recompute.c clones no node: `full` in a model without a layer loop, `selective`
 * in one without attention), its plans are the plain ones under another name; and two plans that
 * differ only in recompute with the same predictions say nothing the first does not. Such rows
 * are dropped in favour of recompute none. (ZeRO stages need dp > 1 and pipeline schedules pp > 1,
 * so the search never pairs those with a plan of the same effect.) */

/* The nodes of the training graph of plan p's micro-batch under recompute mode rc (clones are
 * extra nodes), or -1 when it cannot be built. */
static int train_nodes(Sema *s, const TrainConf *t, const SrchPlan *p, Recompute rc) {
  TrainConf tc = *t;
  tc.strategy.dp = p->dp, tc.strategy.micro = p->micro, tc.strategy.recompute = rc;
  Graph *g = sema_build_model(s, t->model, t->model_call, p->dp * p->micro);
  return g && train_graph(g, &tc) ? g->n : -1;
}

static bool same_config(const SrchPlan *a, const SrchPlan *b) {
  return a->dp == b->dp && a->tp == b->tp && a->pp == b->pp && a->sp == b->sp && a->zero == b->zero &&
         a->micro == b->micro && a->microbatches == b->microbatches && a->v == b->v && a->sched == b->sched;
}

static bool same_prediction(const SrchPlan *a, const SrchPlan *b) {
  return a->step_time == b->step_time && a->mem_total == b->mem_total && a->comm_bytes == b->comm_bytes &&
         a->bubble == b->bubble && a->mem_acts == b->mem_acts && a->mem_workspace == b->mem_workspace;
}

/* Drops from r's plans (all of them, fastest first) those a plan with recompute none makes
 * redundant, then keeps the first topk. */
static void dedup_plans(Sema *s, const TrainConf *t, SrchResult *r, int topk) {
  int noop[3] = {-1, -1, -1}; /* per recompute mode: 1 when it clones nothing (-1: not known yet) */
  int kept = 0;
  for (int i = 0; i < r->n && kept < topk; i++) {
    const SrchPlan *p = &r->plans[i];
    bool drop = false;
    /* the ILP's placements that price exactly as the rule's of the same configuration (params it
     * placed otherwise that change nothing the model prices) */
    for (int j = 0; j < r->n && !drop && p->pins; j++)
      drop = !r->plans[j].pins && r->plans[j].recompute == p->recompute && same_config(p, &r->plans[j]) &&
             same_prediction(p, &r->plans[j]);
    for (int j = 0; j < r->n && !drop && p->recompute != RC_NONE; j++) {
      const SrchPlan *q = &r->plans[j];
      if (q->recompute != RC_NONE || !same_config(p, q)) continue;
      if (same_prediction(p, q)) drop = true;
      else {
        if (noop[p->recompute] < 0) {
          int n0 = train_nodes(s, t, p, RC_NONE), n1 = train_nodes(s, t, p, p->recompute);
          noop[p->recompute] = n0 >= 0 && n1 == n0;
        }
        drop = noop[p->recompute] == 1;
      }
    }
    if (!drop) r->plans[kept++] = *p;
  }
  r->n = kept;
}

void plan_cmd_run(FILE *out, Sema *s, const TrainConf *t, const PlanOpts *o) {
  bool pinned = !t->strategy.is_auto;
  TrainConf tc;
  /* A pinned strategy is checked (and, with --explain, explained) as it is written. */
  if (pinned) {
    StratPlan *sp = pin_strategy(s, t, &tc);
    if (!sp) return;
    if (o->explain && !o->json && !o->trace && !o->report) {
      explain_text(out, sp, t, true);
      return;
    }
  }
  SrchResult *r = srch_run(s, t, INT_MAX); /* every plan: dedup_plans keeps the first --top */
  if (!r) return;
  dedup_plans(s, t, r, o->top > 0 ? o->top : 5);
  /* The strategy explained: the pinned one as build uses it, or the search's best. */
  TrainConf best = *t;
  srch_pin(&r->plans[0], &best.strategy);
  const TrainConf *ex = pinned ? t : &best;
  if (o->trace && !write_trace(o->trace, &r->plans[0])) return;
  if (o->report && !write_report(o->report, r, t)) return;
  if (o->json) {
    StratPlan *sp = pin_strategy(s, ex, &tc);
    if (!sp) return;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "cplan-plan/1");
    cJSON_AddStringToObject(root, "model", r->model);
    cJSON_AddNumberToObject(root, "devices", t->mesh ? (double)t->mesh->ndevices : 1);
    cJSON_AddNumberToObject(root, "batch", (double)t->batch);
    cJSON_AddNumberToObject(root, "memory_limit_bytes", r->memory < 1e300 ? r->memory : 0);
    cJSON_AddNumberToObject(root, "search_seconds", r->seconds);
    cJSON_AddNumberToObject(root, "configurations", (double)r->considered);
    cJSON_AddNumberToObject(root, "ilp_solves", (double)r->ilp_solves);
    cJSON_AddItemToObject(root, "best", plan_json(&r->plans[0]));
    cJSON *c = cJSON_AddArrayToObject(root, "candidates");
    for (int i = 0; i < r->n; i++) cJSON_AddItemToArray(c, plan_json(&r->plans[i]));
    add_explain_json(root, sp, ex);
    char *str = cJSON_Print(root);
    fprintf(out, "%s\n", str);
    free(str);
    cJSON_Delete(root);
    return;
  }
  print_ranking(out, r, t);
  if (o->explain) {
    StratPlan *sp = pin_strategy(s, ex, &tc);
    if (!sp) return;
    fprintf(out, "\nthe %s strategy, explained:\n", pinned ? "pinned" : "best");
    explain_text(out, sp, ex, true);
  }
}

/* `build --plan FILE`: the best plan of a saved `cplanc plan --json`. */
bool plan_load(const char *path, StrategyConf *out) {
  const char *text = cp_read_text(path);
  if (!text) {
    diag_error(SPAN_NONE, "%s: cannot open the plan: %s", path, strerror(errno));
    return false;
  }
  cJSON *root = cJSON_Parse(text);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  const cJSON *best = cJSON_GetObjectItemCaseSensitive(root, "best");
  bool ok = false;
  if (!root) diag_error(SPAN_NONE, "%s: not JSON (near byte %ld)", path, (long)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - text : 0));
  else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "cplan-plan/1") != 0)
    diag_error(SPAN_NONE, "%s: not a plan: \"format\" should be \"cplan-plan/1\" (write it with `cplanc plan --json`)", path);
  else if (!cJSON_IsObject(best)) diag_error(SPAN_NONE, "%s: the plan has no \"best\" object", path);
  else {
    const char *keys[] = {"dp", "tp", "pp", "sp", "zero", "micro"};
    int64_t v[6];
    ok = true;
    for (int k = 0; k < 6 && ok; k++) {
      const cJSON *x = cJSON_GetObjectItemCaseSensitive(best, keys[k]);
      if (!cJSON_IsNumber(x) || x->valuedouble < (k == 4 ? 0 : 1) || x->valuedouble != (double)(int64_t)x->valuedouble) {
        diag_error(SPAN_NONE, "%s: best.%s should be a%s integer", path, keys[k], k == 4 ? " non-negative" : " positive");
        ok = false;
      } else v[k] = (int64_t)x->valuedouble;
    }
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(best, "recompute");
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(best, "pipeline");
    Recompute r = RC_NONE;
    PipeSched ps = PS_1F1B;
    if (ok && cJSON_IsString(rc)) {
      const char *s = rc->valuestring;
      if (strcmp(s, "none") == 0) r = RC_NONE;
      else if (strcmp(s, "selective") == 0) r = RC_SELECTIVE;
      else if (strcmp(s, "full") == 0) r = RC_FULL;
      else ok = false, diag_error(SPAN_NONE, "%s: best.recompute '%s' is not none, selective or full", path, s);
    }
    if (ok && cJSON_IsString(pl)) {
      const char *s = pl->valuestring;
      if (strcmp(s, "1f1b") == 0) ps = PS_1F1B;
      else if (strcmp(s, "gpipe") == 0) ps = PS_GPIPE;
      else if (strcmp(s, "interleaved") == 0) ps = PS_INTERLEAVED;
      else ok = false, diag_error(SPAN_NONE, "%s: best.pipeline '%s' is not 1f1b, gpipe or interleaved", path, s);
    }
    const cJSON *tpp = cJSON_GetObjectItemCaseSensitive(best, "tp_params"), *it;
    VEC(TpPin) pins = {0};
    if (ok && tpp && !cJSON_IsObject(tpp)) ok = false, diag_error(SPAN_NONE, "%s: best.tp_params should be an object", path);
    for (it = ok && tpp ? tpp->child : NULL; it; it = it->next) {
      int d = -1, len = 0;
      if (!cJSON_IsString(it) || (strcmp(it->valuestring, "R") != 0 &&
                                  (sscanf(it->valuestring, "S(%d)%n", &d, &len) != 1 || it->valuestring[len] || d < 0))) {
        diag_error(SPAN_NONE, "%s: best.tp_params.%s should be \"R\" or \"S(d)\" with d a dim of the param", path,
                   it->string);
        ok = false;
        break;
      }
      VEC_PUSH(pins, ((TpPin){cp_strdup(it->string), d}));
    }
    if (ok) {
      Span at = out->span;
      *out = (StrategyConf){.is_auto = false, .dp = v[0], .tp = v[1], .pp = v[2], .sp = v[3], .zero = v[4],
                            .micro = v[5], .recompute = r, .pipeline = ps, .span = at};
      if (tpp) out->tp_pins = pins.a, out->ntp_pins = pins.n;
    }
  }
  cJSON_Delete(root);
  return ok;
}
