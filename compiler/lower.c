/* lower.c: SPMD lowering of a placed training graph into the graph one rank runs (lower.h).
 *
 * One pass in graph order. Each input of a node is resharded from the placement its producer
 * has (as later readers find it: reductions run in place, as strat_pin assumes) to the one the
 * node consumed it in (StratPlan.cons); each change is one collective node. The node is then
 * copied with local attributes, its shape rule re-run, and the result compared with the global
 * shape divided by its splits: a mismatch is a lowering bug, reported, never silently run. */
#include "lower.h"

#include <stdarg.h>
#include <string.h>

typedef struct Cached {
  int value, axis;   /* local node resharded, on this axis */
  Pl to;
  int node;          /* the collective's local node */
} Cached;

typedef struct Ctx {
  const StratPlan *sp;
  const Graph *g;
  Lowered *lw;
  int *cur;          /* per global node: the local node later readers take (after in-place reductions) */
  Pl *have;          /* [axis * g->n + node]: the placement of cur[node] */
  int **lin;         /* per global node: its local inputs */
  VEC(Cached) cache;
  VEC(Cached) regathered; /* zero 3: a forward all-gather of a param -> its backward one */
  const Pl *tp_pl;   /* per node: its placement on the tp axis (NULL: none) */
  Role role;         /* the role of the node being lowered (its reshards run in its phase) */
  int global;        /* the global node being lowered */
  char *err;
  size_t errlen;
  bool failed;
} Ctx;

static bool fail(Ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(Ctx *c, const char *fmt, ...) {
  if (c->failed) return false;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, c->errlen, fmt, ap);
  va_end(ap);
  c->failed = true;
  return false;
}

Shape lower_local_shape(const StratPlan *sp, int i) {
  Shape s = sp->g->nodes[i].shape;
  for (int a = 0; a < sp->naxes; a++) {
    Pl p = sp->pl[i].ax[a];
    if (p.kind == PL_S && p.dim < s.rank) s.d[p.dim] /= sp->axes[a].n;
  }
  return s;
}

static int add_coll(Ctx *c, OpId op, int value, int axis, int d1, int d2) {
  Graph *lg = c->lw->g;
  int k = ir_add(lg, op, &value, 1, lg->nodes[value].span);
  VEC_PUSH(c->lw->origin, c->global);
  Node *n = &lg->nodes[k];
  n->ia[0] = axis, n->ia[1] = d1, n->ia[2] = d2, n->ia[3] = c->sp->axes[axis].n;
  n->role = c->role; /* it runs right before the node that needs it, in that node's phase */
  n->layer = lg->nodes[value].layer;
  char e[256];
  if (!ir_infer(lg, k, e, sizeof e)) fail(c, "lowering: %s", e);
  c->lw->ncolls++;
  return k;
}

/* Whether the P -> R reshard of node j on axis a is the dp reduction of a gradient accumulator
 * (its STATE with ia[1] = 0, or the ACCUM into it), which the runtime does (lower.h). */
static bool runtime_reduces(const Ctx *c, int j, int a, Pl h, Pl w) {
  if (c->sp->axes[a].role != AX_DP || h.kind != PL_P || w.kind != PL_R) return false;
  const Node *n = &c->g->nodes[j];
  if (n->op == OP_ACCUM) n = &c->g->nodes[n->in[0]];
  return n->op == OP_STATE && n->ia[1] == 0;
}

static int scale_node(Ctx *c, int v, double f, int i);

/* The local node holding global node j's value in placement `want` on every axis.
 *
 * The dp axis (lower.h): a forward P is each rank's value over its own samples (a mean of its part,
 * or its sum), which the runtime averages as the loss; a gradient (the seed is divided by dp) is a
 * true partial sum when P and each rank's 1/dp share when R. So a forward P -> R on dp is the
 * all-reduce's sum divided by dp (the mean of the ranks' values, as the runtime averages the loss:
 * mean(h) + mean(g) under dp is the one-device value, not dp times mean(h) plus mean(g)); an R -> P
 * on dp keeps each rank's value (the mean of equal forward values, or a gradient's shares). A
 * gradient whole (R) on dp must be such a share wherever it came from: a whole param's gradient
 * sums the share of a term only params read (mean(g * g), seeded 1/dp) and the all-reduced
 * partial sums of one the samples read (mean(h * g)), so a gradient's all-reduce and all-gather on
 * dp are divided by dp, and its R -> S slice (into a ZeRO 2/3 accumulator, which holds true sums)
 * multiplied by dp.
 * On tp, P is a sum of parts: R -> P is each rank's 1/tp of the value. */
static int reshard(Ctx *c, int j, const Pl *want) {
  int v = c->cur[j], n = c->g->n;
  Pl hv[3];
  for (int a = 0; a < c->sp->naxes; a++) hv[a] = c->have[a * n + j];
  /* Where two axes split one dim, the later axis's shards are the outer blocks (init, save and load
   * lay params out so: lower_global_index), as a reduce-scatter or slice over the earlier axis of
   * the later's shard makes them. A value to be split along a dim by an earlier axis is so resharded
   * later axis first when the later axis also splits or gathers that dim (a param's whole gradient
   * into its dp x tp ZeRO 3 shard; a gradient tp splits, of a param tp keeps whole, reduce-scattered
   * over dp after tp's all-gather, not before). */
  bool later_first = false;
  for (int a = 0; a + 1 < c->sp->naxes; a++)
    for (int b = a + 1; b < c->sp->naxes; b++)
      if (want[a].kind == PL_S && hv[a].kind != PL_S && !pl_eq(hv[b], want[b]) &&
          (pl_eq(want[a], want[b]) || pl_eq(want[a], hv[b])))
        later_first = true;
  for (int step = 0; step < c->sp->naxes && !c->failed; step++) {
    int a = later_first ? c->sp->naxes - 1 - step : step;
    Pl h = hv[a], w = want[a];
    if (pl_eq(h, w)) continue;
    bool dp = c->sp->axes[a].role == AX_DP, fwd = c->g->nodes[j].role == ROLE_FWD, bwd = c->g->nodes[j].role == ROLE_BWD;
    if (h.kind == PL_R && w.kind == PL_P) { /* strategy.c's COLL_LOCAL_ZERO */
      if (!dp) v = scale_node(c, v, 1.0 / (double)c->sp->axes[a].n, c->global);
      hv[a] = w;
      continue;
    }
    if (runtime_reduces(c, j, a, h, w)) {
      c->have[a * n + j] = hv[a] = w;
      c->lw->runtime_reduced[c->g->nodes[j].op == OP_ACCUM ? c->g->nodes[j].in[0] : j] = true;
      c->lw->nruntime++;
      continue;
    }
    Collective k = pl_reshard(h, w);
    if (h.kind == PL_P && (k == COLL_ALL_REDUCE || k == COLL_REDUCE_SCATTER)) {
      /* in place: every later reader gets the reduced value (strategy.c's record()) */
      v = add_coll(c, k == COLL_ALL_REDUCE ? OP_ALL_REDUCE : OP_REDUCE_SCATTER, v, a, w.kind == PL_S ? w.dim : 0, 0);
      if (dp && k == COLL_ALL_REDUCE && (fwd || bwd)) v = scale_node(c, v, 1.0 / (double)c->sp->axes[a].n, c->global);
      c->cur[j] = v;
      hv[a] = w; /* and the reshards on other axes before it, which the reduced value has */
      for (int b = 0; b < c->sp->naxes; b++) c->have[b * n + j] = hv[b];
      continue;
    }
    int hit = -1;
    for (int q = 0; q < c->cache.n && hit < 0; q++)
      if (c->cache.a[q].value == v && c->cache.a[q].axis == a && pl_eq(c->cache.a[q].to, w) &&
          c->lw->g->nodes[c->cache.a[q].node].role == c->role) /* a phase reads its own copies */
        hit = c->cache.a[q].node;
    if (hit < 0) {
      if (k == COLL_ALL_GATHER) {
        hit = add_coll(c, OP_ALL_GATHER, v, a, h.dim, 0);
        if (dp && bwd) hit = scale_node(c, hit, 1.0 / (double)c->sp->axes[a].n, c->global);
      }
      else if (k == COLL_ALL_TO_ALL) hit = add_coll(c, OP_ALL_TO_ALL, v, a, h.dim, w.dim);
      else if (k == COLL_LOCAL_SLICE) {
        hit = add_coll(c, OP_SHARD_SLICE, v, a, w.dim, 0);
        if (dp && bwd) hit = scale_node(c, hit, (double)c->sp->axes[a].n, c->global);
      }
      else {
        fail(c, "lowering: no lowering of %s -> %s for node %%%d (%s)", pl_str(h), pl_str(w), j,
             ir_ops[c->g->nodes[j].op].name);
        return v;
      }
      Cached e = {v, a, w, hit};
      VEC_PUSH(c->cache, e);
    }
    v = hit;
    hv[a] = w;
  }
  return v;
}

/* lower.h */
bool lower_blocked_source(const Graph *g, const Pl *pl, Pl *const *cons, int i, int64_t size) {
  const Node *n = &g->nodes[i];
  Pl p = pl[i];
  if (p.kind != PL_S || n->shape.d[p.dim] != size) return false;
  if (n->op == OP_PARAM) return true;
  bool any = false;
  for (int k = 0; k < n->nin; k++) {
    Pl got = cons[i][k];
    /* a whole input this op takes its part of (shard_sliced_input): a contiguous part, not the blocks */
    if (got.kind != PL_S && shard_sliced_input(g, n, k, cons[i], pl[i]).kind == PL_S) return false;
    if (got.kind != PL_S) continue;
    if (!pl_eq(pl[n->in[k]], got) || !lower_blocked_source(g, pl, cons, n->in[k], size)) return false;
    any = true;
  }
  return any;
}

/* Whether slice node i takes part of a dim tp splits in contiguous parts (its input not blocked):
 * each rank's part of the input is not the slice's, so the lowering refuses it. */
static bool contiguous_slice(const Graph *g, const Pl *pl, Pl *const *cons, int i) {
  const Node *o = &g->nodes[i];
  if (o->op != OP_SLICE || !cons[i]) return false;
  Pl in0 = cons[i][0];
  int64_t size = g->nodes[o->in[0]].shape.d[o->ia[0]];
  return in0.kind == PL_S && in0.dim == o->ia[0] && o->ia[2] - o->ia[1] < size &&
         !lower_blocked_source(g, pl, cons, o->in[0], size);
}

int lower_contiguous_slice(const Graph *g, const Pl *pl, Pl *const *cons) {
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].role == ROLE_FWD && contiguous_slice(g, pl, cons, i)) return i;
  return -1;
}

/* Local attributes of node i's copy n (see lower.h). */
static void localize(Ctx *c, int i, Node *n, const Shape *want) {
  const StratPlan *sp = c->sp;
  const Graph *g = c->g;
  const Node *o = &g->nodes[i];
  for (int a = 0; a < sp->naxes; a++) {
    int64_t k = sp->axes[a].n;
    Pl out = sp->pl[i].ax[a], in0 = o->nin ? sp->cons[a][i][0] : pl_r();
    switch (o->op) {
    case OP_SLICE:
      if (in0.kind == PL_S && in0.dim == o->ia[0]) {
        if (o->ia[1] % k || o->ia[2] % k) fail(c, "lowering: slice %%%d of a split dim by %lld", i, (long long)k);
        int64_t size = g->nodes[o->in[0]].shape.d[in0.dim];
        if (sp->axes[a].role == AX_TP ? contiguous_slice(g, c->tp_pl, sp->cons[a], i) : o->ia[2] - o->ia[1] < size)
          fail(c, "lowering: slice %%%d [%lld, %lld) of dim %d, which the %s axis splits in contiguous parts: each "
               "rank's part of it is not the slice's", i, (long long)o->ia[1], (long long)o->ia[2], in0.dim,
               sp->axes[a].role == AX_TP ? "tp" : "dp");
        n->ia[1] /= k, n->ia[2] /= k;
      }
      break;
    case OP_SPLIT_HEADS:
      if (out.kind == PL_S && out.dim == 1) n->ia[0] /= k;
      break;
    case OP_EMBEDDING:
      if (in0.kind == PL_S && in0.dim == 0) n->ia[0] = a + 1;
      break;
    case OP_CROSS_ENTROPY:
      if (in0.kind == PL_S && in0.dim == g->nodes[o->in[0]].shape.rank - 1) n->ia[0] = a + 1;
      break;
    case OP_ARGMAX: /* ia[0] is its axis */
      if (in0.kind == PL_S && in0.dim == o->ia[0] && in0.dim == g->nodes[o->in[0]].shape.rank - 1) n->ia[1] = a + 1;
      break;
    case OP_ARANGE:
      if (out.kind == PL_S) fail(c, "lowering: a split arange (%%%d)", i);
      break;
    case OP_DROPOUT: /* its mask's whole tensor (codegen cg_dropout_map): the dim tp splits, the axis */
      if (out.kind == PL_S && sp->axes[a].role == AX_TP) n->ia[2] = out.dim + 1, n->ia[3] = a + 1;
      break;
    default:
      break;
    }
  }
  if (o->op == OP_RESHAPE) {
    n->ndims = want->rank;
    for (int d = 0; d < want->rank; d++) n->dims[d] = want->d[d];
  }
}

static int64_t dp_size(const StratPlan *sp) {
  for (int a = 0; a < sp->naxes; a++)
    if (sp->axes[a].role == AX_DP) return sp->axes[a].n;
  return 1;
}

/* ZeRO 3: a param sharded over dp is gathered for each use. The backward gathers it again
 * (once per forward gather, cached) instead of reading the forward's copy, so the whole param
 * lives only around its uses, as in DeepSpeed's stage 3, not from the forward to the backward. */
static int regather(Ctx *c, int v) {
  Graph *lg = c->lw->g;
  const Node *n = &lg->nodes[v];
  if (n->op != OP_ALL_GATHER || lg->nodes[n->in[0]].op != OP_PARAM || c->sp->axes[n->ia[0]].role != AX_DP) return v;
  if (n->role != ROLE_FWD) return v; /* gathered in the backward already (for a recomputed node) */
  for (int q = 0; q < c->regathered.n; q++)
    if (c->regathered.a[q].value == v) return c->regathered.a[q].node;
  int k = add_coll(c, OP_ALL_GATHER, n->in[0], (int)n->ia[0], (int)n->ia[1], 0);
  Cached e = {v, (int)n->ia[0], pl_r(), k};
  VEC_PUSH(c->regathered, e);
  return k;
}

/* A mean over a dim a tp axis splits (its input S, its output P): each rank's mean of its part
 * over n ranks is n times its share of the global mean, and the gradient each rank computes (dy over
 * its own count) n times the global one (dy over the global count). The factor, 1/n per such axis,
 * that the lowering multiplies node j's value (or its gradient's) by; 1 for any other node. (dp's
 * partial means stay means of means, averaged by the runtime: lower.h.) */
static double tp_mean_share(const Ctx *c, int j) {
  if (c->g->nodes[j].op != OP_MEAN) return 1;
  double f = 1;
  for (int a = 0; a < c->sp->naxes; a++)
    if (c->sp->axes[a].role == AX_TP && c->sp->cons[a][j][0].kind == PL_S && c->sp->pl[j].ax[a].kind == PL_P)
      f /= (double)c->sp->axes[a].n;
  return f;
}

/* v * f in the per-rank graph, made for global node i. */
static int scale_node(Ctx *c, int v, double f, int i) {
  Graph *lg = c->lw->g;
  const Node x = lg->nodes[v]; /* a copy: ir_add may move the nodes */
  int k = ir_add(lg, OP_CONST, NULL, 0, x.span);
  lg->nodes[k].fa[0] = f;
  lg->nodes[k].dtype = x.dtype;
  int in[2] = {v, k};
  int m = ir_add(lg, OP_MUL, in, 2, x.span);
  VEC_PUSH(c->lw->origin, i);
  VEC_PUSH(c->lw->origin, i);
  for (int q = k; q <= m; q++) lg->nodes[q].role = x.role, lg->nodes[q].layer = x.layer;
  char e[256];
  if (!ir_infer(lg, k, e, sizeof e) || !ir_infer(lg, m, e, sizeof e)) fail(c, "lowering: %s", e);
  return m;
}

static void lower_node(Ctx *c, int i) {
  const StratPlan *sp = c->sp;
  const Node *o = &c->g->nodes[i];
  Graph *lg = c->lw->g;
  int *in = cp_alloc(sizeof(int) * (size_t)(o->nin ? o->nin : 1));
  bool grad = o->op == OP_GRAD;
  c->role = o->role;
  c->global = i;
  for (int k = 0; k < o->nin; k++) {
    if (grad && k > 0) { /* the forward node's inputs as it consumed them, then the forward node */
      in[k] = k < o->nin - 1 ? regather(c, c->lin[o->fwd][k - 1]) : c->lw->map[o->fwd];
      continue;
    }
    Pl want[3];
    for (int a = 0; a < sp->naxes; a++) want[a] = shard_sliced_input(c->g, o, k, sp->cons[a][i], sp->pl[i].ax[a]);
    in[k] = reshard(c, o->in[k], want);
  }
  int li = ir_add(lg, o->op, in, o->nin, o->span);
  VEC_PUSH(c->lw->origin, i);
  Node *n = &lg->nodes[li];
  memcpy(n->ia, o->ia, sizeof n->ia);
  memcpy(n->fa, o->fa, sizeof n->fa);
  memcpy(n->dims, o->dims, sizeof n->dims);
  n->ndims = o->ndims, n->name = o->name, n->layer = o->layer, n->role = o->role;
  n->fwd = o->fwd >= 0 ? c->lw->map[o->fwd] : -1;
  if (o->op == OP_STATE) n->ia[0] = c->lw->map[o->ia[0]];
  if (i == c->g->seed) n->fa[0] /= (double)dp_size(sp); /* see lower.h: reductions over dp sum */
  Shape want = lower_local_shape(sp, i);
  c->lin[i] = in;
  c->lw->map[i] = c->cur[i] = li;
  for (int a = 0; a < sp->naxes; a++) c->have[a * c->g->n + i] = sp->pl[i].ax[a];
  if (ir_ops[o->op].flags & OPF_LEAF) {
    n->shape = want;
    n->dtype = o->dtype;
    return;
  }
  localize(c, i, n, &want);
  char e[256];
  if (!ir_infer(lg, li, e, sizeof e)) {
    fail(c, "lowering: node %%%d (%s): %s", i, ir_ops[o->op].name, e);
    return;
  }
  if (!shape_eq(&lg->nodes[li].shape, &want))
    fail(c, "lowering: node %%%d (%s) has local shape %s, its placement %s needs %s", i, ir_ops[o->op].name,
         shape_str(&lg->nodes[li].shape), placement_str(&sp->pl[i]), shape_str(&want));
  double f = tp_mean_share(c, grad ? o->fwd : i);
  if (f != 1 && !c->failed) c->cur[i] = scale_node(c, li, f, i); /* readers take the scaled value */
}

/* ---- blocked layouts ------------------------------------------------------------------------ */

static int tp_axis(const StratPlan *sp) {
  for (int a = 0; a < sp->naxes; a++)
    if (sp->axes[a].role == AX_TP) return a;
  return -1;
}

/* Marks node i (split along a dim of size `size` on the tp axis, placements pl) and the producers
 * it was computed from that are split alike with `b` blocks. */
static void mark_blocks(const Graph *g, const Pl *pl, int *blocks, int i, int64_t size, int b) {
  Pl p = pl[i];
  if (p.kind != PL_S || g->nodes[i].shape.d[p.dim] != size || blocks[i] == b) return;
  blocks[i] = b;
  for (int k = 0; k < g->nodes[i].nin; k++) mark_blocks(g, pl, blocks, g->nodes[i].in[k], size, b);
}

void lower_find_blocks(const Graph *g, const Pl *pl, Pl *const *cons, int *blocks) {
  for (int i = 0; i < g->n; i++) blocks[i] = 1;
  if (!pl) return;
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (n->op != OP_SLICE || n->role != ROLE_FWD) continue;
    Pl x = cons[i][0];
    int64_t size = g->nodes[n->in[0]].shape.d[n->ia[0]], len = n->ia[2] - n->ia[1];
    if (x.kind == PL_S && x.dim == n->ia[0] && len < size && size % len == 0)
      mark_blocks(g, pl, blocks, n->in[0], size, (int)(size / len));
  }
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].op == OP_STATE) blocks[i] = blocks[g->nodes[i].ia[0]];
  for (int k = 0; k < g->grads.n; k++)
    if (g->grads.a[k] >= 0) blocks[g->grads.a[k]] = blocks[g->params.a[k]];
}

int lower_blocked_escape(const Graph *g, const Pl *pl, const int *blocks, int *src) {
  for (int c = 0; c < g->n && pl; c++) {
    const Node *n = &g->nodes[c];
    if (n->role != ROLE_FWD) continue;
    for (int k = 0; k < n->nin; k++) {
      int i = n->in[k];
      Pl p = pl[i];
      if (blocks[i] <= 1 || p.kind != PL_S || blocks[c] == blocks[i]) continue;
      int64_t size = g->nodes[i].shape.d[p.dim];
      if (n->op == OP_SLICE && n->ia[0] == p.dim && (n->ia[2] - n->ia[1]) * blocks[i] == size) continue;
      *src = i;
      return c;
    }
  }
  return -1;
}

int64_t lower_global_index(const StratPlan *sp, const Lowered *lw, int i, const int64_t *coord, int64_t local) {
  const Node *n = &sp->g->nodes[i];
  Shape ls = lower_local_shape(sp, i);
  int64_t idx[CP_MAX_RANK], rest = local;
  for (int d = ls.rank - 1; d >= 0; d--) idx[d] = rest % ls.d[d], rest /= ls.d[d];
  /* Axes in order: when dp and tp split the same dim (ZeRO over a tensor-parallel shard), dp
   * splits the tp shard, so its index is undone first; cur[d] is the size of dim d undone so far. */
  int64_t cur[CP_MAX_RANK];
  for (int d = 0; d < ls.rank; d++) cur[d] = ls.d[d];
  for (int a = 0; a < sp->naxes; a++) {
    Pl p = sp->pl[i].ax[a];
    if (p.kind != PL_S) continue;
    int64_t b = sp->axes[a].role == AX_TP ? lw->blocks[i] : 1, part = cur[p.dim] / b, j = idx[p.dim];
    /* block j / part of the dim, this rank's part of it, the offset inside */
    idx[p.dim] = (j / part) * (cur[p.dim] * sp->axes[a].n / b) + coord[a] * part + j % part;
    cur[p.dim] *= sp->axes[a].n;
  }
  int64_t g = 0;
  for (int d = 0; d < n->shape.rank; d++) g = g * n->shape.d[d] + idx[d];
  return g;
}

/* ---- the entry point -------------------------------------------------------------------- */

/* Lowered.loss_share of global node j's current value: 1/n per tp axis of n ranks where it is whole. */
static double tp_share(const Ctx *c, int j) {
  double f = 1;
  for (int a = 0; a < c->sp->naxes; a++)
    if (c->sp->axes[a].role == AX_TP && c->have[a * c->g->n + j].kind == PL_R) f /= (double)c->sp->axes[a].n;
  return f;
}

static void map_lists(const Ctx *c, Graph *lg) {
  const Graph *g = c->g;
  const int *m = c->lw->map;
  for (int k = 0; k < g->params.n; k++) VEC_PUSH(lg->params, m[g->params.a[k]]);
  for (int k = 0; k < g->inputs.n; k++) VEC_PUSH(lg->inputs, m[g->inputs.a[k]]);
  for (int k = 0; k < g->grads.n; k++) { /* shaped as this rank's param: reduce-scattered under zero 3 */
    int gk = g->grads.a[k], v = gk >= 0 ? m[gk] : -1;
    const Shape *want = &lg->nodes[m[g->params.a[k]]].shape;
    if (v >= 0 && shape_eq(&lg->nodes[c->cur[gk]].shape, want)) v = c->cur[gk]; /* reduced in place */
    /* a whole (R) gradient, sliced into its accumulator's part (a param only R terms read) */
    for (int q = c->cache.n - 1; v >= 0 && !shape_eq(&lg->nodes[v].shape, want) && q >= 0; q--)
      if (c->cache.a[q].value == c->cur[gk] && shape_eq(&lg->nodes[c->cache.a[q].node].shape, want)) v = c->cache.a[q].node;
    VEC_PUSH(lg->grads, v);
  }
  for (int k = 0; k < g->states.n; k++) VEC_PUSH(lg->states, m[g->states.a[k]]);
  for (int k = 0; k < g->layer_names.n; k++) VEC_PUSH(lg->layer_names, g->layer_names.a[k]);
  c->lw->metric_share = cp_alloc(sizeof(double) * (size_t)(g->metrics.n ? g->metrics.n : 1));
  for (int k = 0; k < g->metrics.n; k++) {
    Metric mt = g->metrics.a[k];
    c->lw->metric_share[k] = tp_share(c, mt.node);
    mt.node = c->cur[mt.node]; /* reduced, when a reduction followed */
    VEC_PUSH(lg->metrics, mt);
  }
  c->lw->loss_share = g->loss >= 0 ? tp_share(c, g->loss) : 1;
  lg->loss = g->loss >= 0 ? c->cur[g->loss] : -1;
  lg->grad_norm = g->grad_norm >= 0 ? c->cur[g->grad_norm] : -1;
  lg->seed = g->seed >= 0 ? m[g->seed] : -1;
  lg->accum = g->accum;
  lg->batch = g->batch;
}

Lowered *lower_spmd(const StratPlan *sp, char *err, size_t errlen) {
  const Graph *g = sp->g;
  Lowered *lw = cp_alloc(sizeof *lw);
  lw->g = ir_new(g->model_name);
  lw->map = cp_alloc(sizeof(int) * (size_t)g->n);
  lw->blocks = cp_alloc(sizeof(int) * (size_t)g->n);
  lw->runtime_reduced = cp_alloc(sizeof(bool) * (size_t)(g->n ? g->n : 1));
  Ctx c = {.sp = sp, .g = g, .lw = lw, .err = err, .errlen = errlen};
  c.cur = cp_alloc(sizeof(int) * (size_t)g->n);
  c.have = cp_alloc(sizeof(Pl) * (size_t)g->n * (size_t)(sp->naxes ? sp->naxes : 1));
  c.lin = cp_alloc(sizeof(int *) * (size_t)g->n);
  int a = tp_axis(sp);
  Pl *tp_pl = a < 0 ? NULL : cp_alloc(sizeof(Pl) * (size_t)(g->n ? g->n : 1));
  for (int i = 0; i < g->n && tp_pl; i++) tp_pl[i] = sp->pl[i].ax[a];
  lower_find_blocks(g, tp_pl, a < 0 ? NULL : sp->cons[a], lw->blocks);
  c.tp_pl = tp_pl;
  for (int i = 0; i < g->n && !c.failed; i++) {
    lw->g->cur_layer = g->nodes[i].layer;
    lower_node(&c, i);
  }
  int src = -1, esc = c.failed ? -1 : lower_blocked_escape(g, tp_pl, lw->blocks, &src); /* after a slice's own error */
  if (esc >= 0)
    fail(&c, "lowering: %%%d (%s) reads %%%d, which tp splits in %d blocks for the slices taken of it (Megatron's "
         "fused q/k/v layout), other than through those slices: a value both sliced in parts and read whole is not "
         "supported under tp yet", esc, ir_ops[g->nodes[esc].op].name, src, lw->blocks[src]);
  if (c.failed) return NULL;
  map_lists(&c, lw->g);
  if (!ir_verify(lw->g, err, errlen)) return NULL;
  return lw;
}
