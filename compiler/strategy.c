/* strategy.c: pinned strategies. From TrainConf.strategy and the mesh, assigns a placement on
 * every logical mesh axis to every node of the training graph, and lists the collectives the
 * placements imply (docs/language.md §7).
 *
 * Logical axes: the devices are ranked pp-major, then dp, then tp innermost (Megatron's order:
 * tensor parallelism gets consecutive ranks, the fastest links; pipeline stages the slowest).
 * pp splits the layers contiguously; dp and tp are placement axes.
 *
 * Each placement axis is one pass over the graph in order. Leaves get the strategy's placement
 * (inputs S(batch) on dp, params R, or S(0) under zero 3, ...); a param first used by a matmul on
 * the tp axis becomes column-parallel (S(1)) when the activation arrives whole and row-parallel
 * (S(0)) when it arrives split along its last dim, which yields Megatron's column-then-row
 * pairs without naming layers. Every node then runs its sharding rule; when the rule rejects its
 * inputs, they are resharded (the rule's suggestion first, then P -> R or S, then S -> R) and
 * each reshard is recorded as a collective. */
#include "lower.h"
#include "placement.h"
#include "train.h"

#include <string.h>

const char *strat_axis_name(AxisRole r) { return r == AX_PP ? "pp" : r == AX_DP ? "dp" : "tp"; }

/* ---- the strategy's fields, for diagnostics -------------------------------------------- */

Span strat_field_span(const TrainConf *t, const char *key) {
  const StrategyConf *st = &t->strategy;
  for (int i = 0; i < st->nfields; i++)
    if (strcmp(st->fields[i].key, key) == 0) return st->fields[i].span;
  return st->span;
}

bool strat_degrees(const Program *prog, const TrainConf *t, int64_t *dp, int64_t *tp, int64_t *pp,
                   int64_t *micro) {
  const StrategyConf *st = &t->strategy;
  int64_t dev = t->mesh ? t->mesh->ndevices : 1;
  *tp = st->tp > 0 ? st->tp : 1;
  *pp = st->pp > 0 ? st->pp : 1;
  *dp = st->dp > 0 ? st->dp : dev / (*tp * *pp);
  bool ok = true;
  if (*dp < 1) *dp = 1;
  if (*dp * *tp * *pp != dev) {
    diag_error(strat_field_span(t, st->dp > 0 ? "dp" : st->tp > 0 ? "tp" : "pp"),
               "dp*tp*pp = %lld*%lld*%lld = %lld is not the mesh's %lld devices", (long long)*dp, (long long)*tp,
               (long long)*pp, (long long)(*dp * *tp * *pp), (long long)dev);
    diag_hint("leave dp out to give data parallelism the devices tp and pp do not use");
    ok = false;
  }
  if (st->sp > 1 && *tp <= 1) {
    diag_error(strat_field_span(t, "sp"), "sp = %lld without tp: sequence parallelism splits the sequence "
               "over the tensor-parallel group", (long long)st->sp);
    ok = false;
  } else if (st->sp > 1 && st->sp != *tp) {
    diag_error(strat_field_span(t, "sp"), "sp = %lld differs from tp = %lld: sequence parallelism uses the "
               "tensor-parallel group", (long long)st->sp, (long long)*tp);
    ok = false;
  }
  if (st->zero > 0 && *dp <= 1) {
    diag_error(strat_field_span(t, "zero"), "zero = %lld needs dp > 1: ZeRO shards over the data-parallel "
               "replicas", (long long)st->zero);
    ok = false;
  }
  if (ok && st->dp <= 0 && t->batch > 0 && t->batch % *dp != 0) { /* settings.c says so at check */
    diag_error(strat_field_span(t, st->tp > 0 ? "tp" : "pp"), "batch %lld is not divisible by dp = %lld, the devices tp*pp "
               "= %lld*%lld leave of the mesh's %lld", (long long)t->batch, (long long)*dp, (long long)*tp, (long long)*pp,
               (long long)dev);
    ok = false;
  }
  *micro = st->micro > 0 ? st->micro : (t->batch > 0 ? t->batch / *dp : 1);
  if (ok && st->dp <= 0 && t->batch > 0 && t->batch % (*dp * *micro) != 0) {
    diag_error(strat_field_span(t, st->micro > 0 ? "micro" : "dp"),
               "micro = %lld does not divide the per-replica batch %lld / dp %lld", (long long)*micro,
               (long long)t->batch, (long long)*dp);
    ok = false;
  }
  return ok;
}

/* ---- one placement axis ------------------------------------------------------------------ */

typedef struct Ctx {
  const Program *prog;
  const TrainConf *t;
  StratPlan *sp;
  const Graph *g;
  int axis;
  AxisRole role;
  int64_t n;
  bool seqpar;       /* tp axis with sp: partial sums of [B, T, C] become S(1), not R */
  Pl *out;           /* per node, this axis: the placement it produces */
  Pl *avail;         /* per node: its value as later readers find it (after an in-place reduction) */
  Pl **cons;         /* per node: its inputs as it consumed them */
  Pl **from;         /* or NULL; per node: its inputs' placements before the reshards it needed */
  bool *lazy;        /* per node: a param not placed yet (tp axis) */
  const int *pin;    /* or NULL; per node: a param's tp placement the plan gives (PIN_NONE: the rule's;
                        -1: R; d >= 0: S(d)), StrategyConf.tp_pins */
  bool quiet;        /* the search's pricing (strat_tp_place): a refusal says nothing */
  bool failed;
  int *coll_at;      /* per node: the last of sp->colls[0 .. ncolls_at) on it, then coll_next[i] (NULL: none yet) */
  VEC(int) coll_next;
  int ncolls_at;
} Ctx;

static int root_param(const Graph *g, int i) {
  while (g->nodes[i].op == OP_TRANSPOSE) i = g->nodes[i].in[0];
  return g->nodes[i].op == OP_PARAM ? i : -1;
}

/* Whether param p is a head weight: cross_entropy reads x @ p, or that plus a bias. */
static bool head_of_ce(const Graph *g, int p) {
  for (int i = 0; i < g->n; i++) {
    if (g->nodes[i].op != OP_CROSS_ENTROPY) continue;
    const Node *l = &g->nodes[g->nodes[i].in[0]];
    if (l->op == OP_ADD) l = &g->nodes[l->in[0]];
    if (l->op == OP_MATMUL && l->in[1] == p) return true;
  }
  return false;
}

static bool param_dim_ok(Ctx *c, int p, int d, const char *why) {
  const Node *pn = &c->g->nodes[p];
  if (pn->shape.d[d] % c->n == 0) return true;
  c->failed = true;
  if (c->quiet) return false;
  diag_error(strat_field_span(c->t, "tp"), "tp = %lld does not divide dim %d (%lld) of %s %s, which %s",
             (long long)c->n, d, (long long)pn->shape.d[d], pn->name, shape_str(&pn->shape), why);
  diag_note(pn->span, "the param is declared here");
  if (d == 1 && head_of_ce(c->g, p)) /* what vocab_pad (train.h) takes */
    diag_hint("cplan pads a head weight [C, V] itself, exactly, when only `x @ %s` (or that plus a bias [V]) reads "
              "it and only cross_entropy (without label smoothing) and argmax read its logits", pn->name);
  return false;
}

/* Places a param on the tp axis at its first use (see the file comment), or where the plan pins it. */
static void place_lazy(Ctx *c, int i) {
  const Node *n = &c->g->nodes[i];
  for (int k = 0; k < n->nin; k++) {
    int p = n->in[k];
    if (!c->lazy[p]) continue;
    c->lazy[p] = false;
    const Node *pn = &c->g->nodes[p];
    if (c->pin && c->pin[p] != PIN_NONE) {
      int d = c->pin[p];
      if (d < 0) c->out[p] = c->avail[p] = pl_r();
      else if (param_dim_ok(c, p, d, "the plan's tp_params split")) c->out[p] = c->avail[p] = pl_s(d);
      continue;
    }
    Pl x = k > 0 ? c->avail[n->in[0]] : pl_r();
    if (n->op == OP_MATMUL && k == 1 && pn->shape.rank == 2) {
      bool row = x.kind == PL_S && x.dim == c->g->nodes[n->in[0]].shape.rank - 1;
      int d = row ? 0 : 1;
      if (param_dim_ok(c, p, d, row ? "row-parallel splits" : "column-parallel splits")) c->out[p] = c->avail[p] = pl_s(d);
    } else if (n->op == OP_EMBEDDING && k == 0 && c->g->nodes[n->in[1]].op == OP_INPUT) {
      if (pn->shape.d[0] % c->n == 0) c->out[p] = c->avail[p] = pl_s(0); /* vocab-parallel */
    } else if (ir_ops[n->op].flags & OPF_ELEMENTWISE) {
      for (int j = 0; j < n->nin; j++) {
        Pl o = c->avail[n->in[j]];
        int d = o.kind == PL_S ? o.dim - (c->g->nodes[n->in[j]].shape.rank - n->shape.rank) : -1;
        int pd = d - (n->shape.rank - pn->shape.rank);
        if (j != k && d >= 0 && pd >= 0 && pn->shape.d[pd] == n->shape.d[d] && pn->shape.d[pd] % c->n == 0) {
          c->out[p] = c->avail[p] = pl_s(pd);
          break;
        }
      }
    }
  }
}

/* Whether ZeRO may split dim 0 of a tensor of `shape` on the dp axis (placed before tp's): by dp,
 * and by dp x tp, as tp may split the same dim after it (a [2, 6, 6] param tp splits in heads has
 * local [1, 6, 6], which dp = 2 cannot split again). */
static bool zero_div0(const Ctx *c, const Shape *shape) {
  int64_t k = c->n * (c->sp->tp > 1 ? c->sp->tp : 1);
  return shape->rank > 0 && shape->d[0] % k == 0;
}

static void place_leaf(Ctx *c, int i) {
  const Node *n = &c->g->nodes[i];
  const StratPlan *sp = c->sp;
  c->out[i] = pl_r();
  bool dp = c->role == AX_DP;
  bool div0 = zero_div0(c, &n->shape);
  if (n->op == OP_INPUT && dp && n->ia[1] >= 0) c->out[i] = pl_s((int)n->ia[1]);
  else if (n->op == OP_PARAM && dp && sp->zero >= 3 && div0) c->out[i] = pl_s(0);
  else if (n->op == OP_PARAM && !dp) c->lazy[i] = true;
  else if (n->op == OP_STATE) {
    int p = (int)n->ia[0];
    bool grad = n->ia[1] == 0;
    if (!dp) c->out[i] = c->out[p];
    else if (grad) c->out[i] = sp->zero >= 2 && div0 ? pl_s(0) : c->out[p].kind == PL_S ? c->out[p] : pl_p();
    else c->out[i] = sp->zero >= 1 && div0 ? pl_s(0) : c->out[p];
  }
}

/* Records the reshard of node `from`'s value for `consumer` (collectives only; local slices are free).
 * Returns the placement the reshard starts from: `to` itself when an earlier reshard is reused. */
static Pl record(Ctx *c, int from, int consumer, Pl to) {
  Pl was = c->avail[from];
  Collective k = pl_reshard(was, to);
  if (k == COLL_NONE || k == COLL_LOCAL_SLICE || k == COLL_LOCAL_ZERO) return was;
  /* the collectives so far by node (a walk of them all per reshard was quadratic in the layers) */
  if (!c->coll_at) {
    c->coll_at = cp_alloc(sizeof(int) * (size_t)(c->g->n + 1));
    for (int i = 0; i < c->g->n; i++) c->coll_at[i] = -1;
  }
  for (; c->ncolls_at < c->sp->colls.n; c->ncolls_at++) {
    int node = c->sp->colls.a[c->ncolls_at].node;
    VEC_PUSH(c->coll_next, c->coll_at[node]);
    c->coll_at[node] = c->ncolls_at;
  }
  for (int i = c->coll_at[from]; i >= 0; i = c->coll_next.a[i]) {
    const CollOp *o = &c->sp->colls.a[i];
    if (o->node == from && o->axis == c->axis && pl_eq(o->to, to) && !o->what) return to; /* reused */
  }
  CollOp op = {.node = from, .consumer = consumer, .axis = c->axis, .from = c->avail[from], .to = to, .coll = k};
  VEC_PUSH(c->sp->colls, op);
  /* Reductions run in place: later readers get the reduced value, never reduce it twice. */
  if (op.from.kind == PL_P) c->avail[from] = to;
  return was;
}

/* The generic repair when a rule gives no advice: partial sums first, then splits. */
static bool repair_generic(Ctx *c, const Node *n, Pl *in, bool params_first) {
  bool changed = false;
  Pl sib = pl_r();
  for (int k = 0; k < n->nin; k++)
    if (in[k].kind == PL_S && c->g->nodes[n->in[k]].shape.rank == n->shape.rank) sib = in[k];
  for (int k = 0; k < n->nin; k++)
    if (in[k].kind == PL_P) {
      int r = c->g->nodes[n->in[k]].shape.rank;
      in[k] = sib.kind == PL_S && sib.dim < r ? sib : c->seqpar && r >= 3 ? pl_s(1) : pl_r();
      changed = true;
    }
  if (changed) return true;
  for (int pass = 0; pass < 2; pass++)
    for (int k = n->nin - 1; k >= 0; k--) {
      bool is_param = root_param(c->g, n->in[k]) >= 0;
      if (in[k].kind == PL_S && (pass == 1 || is_param == params_first)) {
        in[k] = pl_r();
        return true;
      }
    }
  return false;
}

static void apply_node(Ctx *c, int i) {
  const Node *n = &c->g->nodes[i];
  Pl *in = cp_alloc(sizeof(Pl) * (size_t)(n->nin ? n->nin : 1));
  bool grad = n->op == OP_GRAD, params_first = c->role == AX_DP && c->sp->zero >= 3;
  const Node *f = grad ? &c->g->nodes[n->fwd] : NULL;
  for (int k = 0; k < n->nin; k++) in[k] = c->avail[n->in[k]];
  /* ZeRO-1 reduce-scatters the accumulated gradients once per step, where the update first reads
   * them (DeepSpeed's and Megatron's distributed optimizer): each rank updates its part only. */
  for (int k = 0; k < n->nin && c->role == AX_DP && c->sp->zero == 1 && n->role == ROLE_UPD; k++) {
    const Node *a = &c->g->nodes[n->in[k]];
    bool acc = a->op == OP_ACCUM && c->g->nodes[a->in[0]].op == OP_STATE && c->g->nodes[a->in[0]].ia[1] == 0;
    if (acc && in[k].kind == PL_P && zero_div0(c, &a->shape)) in[k] = pl_s(0);
  }
  /* ZeRO-3 keeps params as S(0) shards only between uses: the forward gathers them first. */
  for (int k = 0; k < n->nin && params_first && n->role == ROLE_FWD; k++)
    if (c->g->nodes[n->in[k]].op == OP_PARAM && in[k].kind == PL_S) in[k] = pl_r();
  if (grad) { /* the forward inputs as the forward node consumed them, and its output */
    for (int k = 0; k < f->nin; k++) in[1 + k] = c->cons[n->fwd][k];
    in[n->nin - 1] = c->out[n->fwd];
  }
  /* cross_entropy's loss is the mean over its rows: with the rows split on tp (sequence-parallel
   * logits of a table tp does not split, or of computed indices) each rank's mean of its part would
   * be summed as a partial sum, tp times the loss, so the logits are gathered first (dp's means of
   * means are the runtime's) */
  if (c->role == AX_TP && n->op == OP_CROSS_ENTROPY && in[0].kind == PL_S &&
      in[0].dim < c->g->nodes[n->in[0]].shape.rank - 1)
    in[0] = in[1] = pl_r();
  /* a slice of part of a dim tp splits in contiguous parts (not the blocked layout of params'
   * products, lower.h): no rank holds the slice's part of it, so the slice reads it whole */
  if (c->role == AX_TP && n->op == OP_SLICE && in[0].kind == PL_S && in[0].dim == n->ia[0] &&
      n->ia[2] - n->ia[1] < c->g->nodes[n->in[0]].shape.d[n->ia[0]] &&
      !lower_blocked_source(c->g, c->out, c->cons, n->in[0], c->g->nodes[n->in[0]].shape.d[n->ia[0]]))
    in[0] = pl_r();
  ShardIO io = {.in = in, .n = c->n};
  int tries = 0;
  while (!shard_node(c->g, n, &io)) {
    bool advised = false;
    for (int k = 0; k < n->nin && k < 8; k++)
      if (io.want[k].kind != PL_ANY && !pl_eq(io.want[k], in[k]) && (!grad || k == 0)) {
        /* Sequence parallelism: [B, T, C] partial sums are reduce-scattered along T, not all-reduced;
         * not logits cross_entropy reads (its mean over rows split on tp would be summed: see above) */
        bool seq = c->seqpar && in[k].kind == PL_P && io.want[k].kind == PL_R &&
                   c->g->nodes[n->in[k]].shape.rank >= 3 && n->op != OP_GRAD && n->op != OP_CROSS_ENTROPY;
        in[k] = seq ? pl_s(1) : io.want[k];
        advised = true;
      }
    if (!advised && (grad || !repair_generic(c, n, in, params_first))) {
      cp_panic(__FILE__, __LINE__, "no strategy for node %%%d (%s): %s", i, ir_ops[n->op].name, io.why);
    }
    cp_assert(++tries < 16);
  }
  Pl *was = c->from ? cp_alloc(sizeof(Pl) * (size_t)(n->nin ? n->nin : 1)) : NULL;
  for (int k = 0; k < (grad ? 1 : n->nin); k++) {
    Pl w = record(c, n->in[k], i, in[k]);
    if (was) was[k] = w;
  }
  if (c->from) c->from[i] = was;
  if (io.extra) {
    CollOp op = {.node = i, .consumer = i, .axis = c->axis, .from = io.out, .to = io.out,
                 .coll = io.extra_coll, .bytes = io.extra_bytes, .what = io.extra};
    VEC_PUSH(c->sp->colls, op);
  }
  c->out[i] = c->avail[i] = io.out;
  c->cons[i] = in;
}

static void run_axis(Ctx *c) {
  const Graph *g = c->g;
  for (int i = 0; i < g->n && !c->failed; i++) {
    if (ir_ops[g->nodes[i].op].flags & OPF_LEAF) {
      place_leaf(c, i);
      c->avail[i] = c->out[i];
      c->cons[i] = NULL;
      continue;
    }
    if (c->role == AX_TP) place_lazy(c, i);
    if (c->failed) return;
    apply_node(c, i);
  }
}

bool strat_tp_place(const Graph *g, int64_t tp, bool seqpar, const int *pin, Pl *out, Pl **cons, Pl **from) {
  StratPlan tmp = {.g = g, .dp = 1, .tp = tp, .pp = 1, .sp = seqpar ? tp : 1, .micro = 1, .accum = 1};
  Ctx c = {.sp = &tmp, .g = g, .axis = 0, .role = AX_TP, .n = tp, .seqpar = seqpar, .out = out,
           .avail = cp_alloc(sizeof(Pl) * (size_t)(g->n + 1)), .cons = cons, .from = from, .lazy = cp_alloc((size_t)g->n + 1),
           .quiet = true, .pin = pin};
  run_axis(&c);
  return !c.failed;
}

/* ---- stages ---------------------------------------------------------------------------------- */

static void assign_stages(StratPlan *sp) {
  const Graph *g = sp->g;
  int L = g->layer_names.n, first = g->n, last = -1;
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].layer >= 0 && g->nodes[i].role == ROLE_FWD) {
      if (first == g->n) first = i;
      last = i;
    }
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    int s = 0;
    if (n->layer >= 0 && L > 0) s = strat_layer_stage(L, sp->pp, n->layer);
    else if (n->op == OP_GRAD) s = sp->stage[n->fwd];
    else if (n->op == OP_STATE) s = sp->stage[n->ia[0]];
    else if (n->role == ROLE_FWD && (ir_ops[n->op].flags & OPF_LEAF) == 0 && i > last) s = (int)sp->pp - 1;
    else if (n->role == ROLE_FWD && n->op == OP_PARAM && i > first) s = (int)sp->pp - 1;
    else
      for (int k = 0; k < n->nin; k++)
        if (sp->stage[n->in[k]] > s) s = sp->stage[n->in[k]];
    sp->stage[i] = s;
  }
}

/* ---- the entry point ------------------------------------------------------------------------- */

int strat_layer_stage(int64_t L, int64_t nv, int64_t l) {
  int64_t base = L / nv, extra = L % nv;
  return l < extra * (base + 1) ? (int)(l / (base + 1)) : (int)(extra + (l - extra * (base + 1)) / (base ? base : 1));
}

int strat_stage_layers(int64_t L, int64_t pp, int64_t v, int64_t s) {
  int n = 0;
  for (int64_t l = 0; l < L; l++) n += strat_layer_stage(L, pp * v, l) % pp == s;
  return n;
}

int strat_heads_misfit(const Graph *g, int64_t tp) {
  for (int i = 0; i < g->n && tp > 1; i++)
    if (g->nodes[i].op == OP_SPLIT_HEADS && g->nodes[i].ia[0] % tp != 0) return i;
  return -1;
}

bool strat_sp_fits(const Graph *g, int64_t sp) {
  if (sp <= 1 || g->inputs.n == 0) return true;
  const Node *x = &g->nodes[g->inputs.a[0]];
  return x->shape.rank >= 2 && x->shape.d[1] % sp == 0;
}

/* Checks that need the graph: heads and layers, of degrees tp, pp, sp (0 or 1: none). */
static bool degree_checks(const Program *prog, const Graph *g, const TrainConf *t, int64_t tp, int64_t pp, int64_t sp) {
  bool ok = true;
  if (pp > 1 && pp > g->layer_names.n) {
    diag_error(strat_field_span(t, "pp"), "pp = %lld exceeds the model's %d layer%s: each stage needs at least one",
               (long long)pp, g->layer_names.n, g->layer_names.n == 1 ? "" : "s");
    ok = false;
  }
  int h = strat_heads_misfit(g, tp);
  if (h >= 0) {
    diag_error(strat_field_span(t, "tp"), "tp = %lld does not divide the %lld attention heads", (long long)tp,
               (long long)g->nodes[h].ia[0]);
    diag_note(g->nodes[h].span, "the heads are split here");
    return false;
  }
  /* a vocabulary tp does not divide: vocab_pad pads it (train_graph) when only lookups and tied heads
   * into cross_entropy or argmax read it; otherwise place_lazy keeps it whole */
  for (int i = 0; i < g->n && tp > 1; i++) {
    const Node *n = &g->nodes[i], *tb = n->op == OP_EMBEDDING ? &g->nodes[n->in[0]] : NULL;
    if (!tb || tb->op != OP_PARAM || g->nodes[n->in[1]].op != OP_INPUT || tb->shape.d[0] % tp == 0 ||
        vocab_pad_fits(g, n->in[0], tp))
      continue;
    int64_t pad = vocab_pad_rows(tb->shape.d[0], tp);
    diag_warning(strat_field_span(t, "tp"), "tp = %lld does not divide the %lld rows of '%s' %s: it stays whole on "
                 "every tp rank (not vocab-parallel), so its lookups, a head that reads it and their gradient's "
                 "all-reduce are not split", (long long)tp, (long long)tb->shape.d[0], tb->name, shape_str(&tb->shape));
    diag_note(tb->span, "the param is declared here");
    diag_hint("cplan pads such a table itself (exactly) when only lookups and a tied head x @ transpose(table) read it, "
              "its logits read only by cross_entropy (no label smoothing) and argmax; else pad the vocabulary to a "
              "multiple of tp, e.g. %lld%s: the extra rows are never looked up nor targets, and the model learns to "
              "give them no probability", (long long)pad,
              tb->shape.d[0] >= 1024 ? " (of 128 too, as nanoGPT's GPT-2 uses 50304)" : "");
  }
  if (!strat_sp_fits(g, sp)) {
    const Node *x = &g->nodes[g->inputs.a[0]];
    /* the length alone: the batch dim is the replica's micro-batch at check, the global one at build */
    if (x->shape.rank < 2)
      diag_error(strat_field_span(t, "sp"), "sp = %lld needs a sequence dim (dim 1) in input '%s', which has rank %d",
                 (long long)sp, x->name, x->shape.rank);
    else
      diag_error(strat_field_span(t, "sp"), "sp = %lld does not divide the sequence length %lld (dim 1 of input '%s')",
                 (long long)sp, (long long)x->shape.d[1], x->name);
    ok = false;
  }
  return ok;
}

static bool graph_checks(const Program *prog, const Graph *g, const TrainConf *t, const StratPlan *sp) {
  return degree_checks(prog, g, t, sp->tp, sp->pp, sp->sp);
}

bool strat_check_pinned(const Program *prog, const Graph *g, const TrainConf *t) {
  int64_t dp, tp, pp, micro; /* what build and plan refuse of a strategy that pins any field */
  if (!t->strategy.is_auto && !strat_degrees(prog, t, &dp, &tp, &pp, &micro)) return false;
  return degree_checks(prog, g, t, t->strategy.tp, t->strategy.pp, t->strategy.sp);
}

/* Bytes of each collective: the producer's tensor on this axis's group (divided by its splits on
 * the other axes), through the resharding table. */
static void finish_bytes(StratPlan *sp) {
  for (int i = 0; i < sp->colls.n; i++) {
    CollOp *o = &sp->colls.a[i];
    const Node *c = &sp->g->nodes[o->consumer];
    o->per_step = c->role == ROLE_UPD ? 1 : (int)sp->accum;
    if (o->what) { /* an exchange per row of the op's first input: the rows this device holds */
      int x = sp->g->nodes[o->node].in[0];
      for (int a = 0; a < sp->naxes; a++)
        if (a != o->axis && sp->pl[x].ax[a].kind == PL_S) o->bytes /= (double)sp->axes[a].n;
      continue;
    }
    double bytes = ir_node_bytes(sp->g, o->node);
    for (int a = 0; a < sp->naxes; a++)
      if (a != o->axis && sp->pl[o->node].ax[a].kind == PL_S) bytes /= (double)sp->axes[a].n;
    o->bytes = pl_coll_bytes(o->coll, bytes, sp->axes[o->axis].n);
  }
}

int *strat_pins_of(const Graph *g, const StrategyConf *st, Span at) {
  if (!st->tp_pins) return NULL;
  int *pin = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) pin[i] = PIN_NONE;
  bool ok = true;
  for (int k = 0; k < st->ntp_pins; k++) {
    const TpPin *tpn = &st->tp_pins[k];
    int p = -1;
    for (int i = 0; i < g->n && p < 0; i++)
      if (g->nodes[i].op == OP_PARAM && g->nodes[i].name && strcmp(g->nodes[i].name, tpn->param) == 0) p = i;
    if (p < 0) {
      diag_error(at, "the plan places param '%s' on tp, but the model has no param of that name", tpn->param);
      ok = false;
    } else if (tpn->dim >= g->nodes[p].shape.rank || tpn->dim < -1) {
      diag_error(at, "the plan splits param '%s' %s along dim %d, which it does not have", tpn->param,
                 shape_str(&g->nodes[p].shape), tpn->dim);
      ok = false;
    } else pin[p] = tpn->dim;
  }
  return ok ? pin : NULL;
}

StratPlan *strat_pin(const Program *prog, const Graph *g, const TrainConf *t) {
  StratPlan *sp = cp_alloc(sizeof *sp);
  sp->g = g;
  if (!strat_degrees(prog, t, &sp->dp, &sp->tp, &sp->pp, &sp->micro)) return NULL;
  sp->sp = t->strategy.sp > 1 ? t->strategy.sp : 1;
  sp->zero = t->strategy.zero > 0 ? t->strategy.zero : 0;
  sp->accum = g->accum > 0 ? g->accum : 1;
  if (!graph_checks(prog, g, t, sp)) return NULL;
  const int *pin = NULL;
  if (t->strategy.tp_pins && sp->tp > 1 && !(pin = strat_pins_of(g, &t->strategy, strat_field_span(t, "tp"))))
    return NULL;
  sp->pins = pin;
  const int64_t degs[3] = {sp->pp, sp->dp, sp->tp};
  for (int r = AX_DP; r <= AX_TP; r++)
    if (degs[r] > 1) sp->axes[sp->naxes++] = (PlanAxis){(AxisRole)r, degs[r]};
  sp->pl = cp_alloc(sizeof(Placement) * (size_t)g->n);
  sp->stage = cp_alloc(sizeof(int) * (size_t)g->n);
  Pl *out = cp_alloc(sizeof(Pl) * (size_t)g->n);
  for (int a = 0; a < sp->naxes; a++) {
    Ctx c = {.prog = prog, .t = t, .sp = sp, .g = g, .axis = a, .role = sp->axes[a].role, .n = sp->axes[a].n,
             .out = out, .avail = cp_alloc(sizeof(Pl) * (size_t)g->n), .cons = cp_alloc(sizeof(Pl *) * (size_t)g->n), .lazy = cp_alloc((size_t)g->n),
             .pin = pin};
    c.seqpar = c.role == AX_TP && sp->sp > 1;
    run_axis(&c);
    if (c.failed) return NULL;
    for (int i = 0; i < g->n; i++) sp->pl[i].ax[a] = out[i];
    sp->cons[a] = c.cons;
  }
  for (int i = 0; i < g->n; i++) sp->pl[i].naxes = sp->naxes;
  assign_stages(sp);
  finish_bytes(sp);
  return sp;
}
