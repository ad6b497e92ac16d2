/* pipeline.c: cutting the per-rank graph into pipeline stages (pipeline.h). */
#include "pipeline.h"

#include <stdarg.h>
#include <string.h>

/* Nodes every stage that reads them gets its own copy of: leaves and input-less nodes (arange). */
static bool replicated(const Node *n) { return (ir_ops[n->op].flags & OPF_LEAF) || (n->nin == 0 && n->op != OP_PP_RECV); }

typedef VEC(int) IntVec;

/* Consumers of every node. */
static IntVec *consumers(const Graph *g) {
  IntVec *u = cp_alloc(sizeof(IntVec) * (size_t)(g->n ? g->n : 1));
  for (int i = 0; i < g->n; i++)
    for (int k = 0; k < g->nodes[i].nin; k++) VEC_PUSH(u[g->nodes[i].in[k]], i);
  return u;
}

/* The param a STATE, ACCUM or ASSIGN writes for (global node indices), -1 when none. */
static int param_of(const Graph *g, int i) {
  const Node *n = &g->nodes[i];
  if (n->op == OP_ACCUM || n->op == OP_ASSIGN) n = &g->nodes[n->in[0]];
  if (n->op == OP_STATE) return n->ia[0];
  return n->op == OP_PARAM ? (int)(n - g->nodes) : -1;
}

/* The stage of each layer's nodes, with nv stages (strat_layer_stage), and of the forward nodes outside layers: before the first
 * layer on stage 0, after the last on the last stage. -1 for nodes it does not decide. */
static int *layer_stages(const Graph *g, int nv) {
  int L = g->layer_names.n, first = g->n, last = -1;
  int *st = cp_alloc(sizeof(int) * (size_t)(g->n ? g->n : 1));
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].layer >= 0 && g->nodes[i].role == ROLE_FWD) {
      if (first == g->n) first = i;
      last = i;
    }
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    int64_t l = n->layer;
    st[i] = -1;
    if (l >= 0 && L > 0) st[i] = strat_layer_stage(L, nv, l);
    else if (n->role == ROLE_FWD && i > last)
      st[i] = nv - 1;
    else if (n->role == ROLE_FWD) /* before the first layer, or between layers: its inputs' stage */
      for (int k = 0; k < n->nin; k++)
        if (st[n->in[k]] > st[i]) st[i] = st[n->in[k]];
    if (n->role == ROLE_FWD && st[i] < 0) st[i] = 0;
  }
  return st;
}

/* The stage a backward sum of two gradient contributions runs on when both come from one stage
 * after its own layer's (the residual stream at a stage boundary: the gradients through the next
 * layer's residual add and through its first norm): that stage, which then sends the sum, one
 * tensor instead of two. -1 otherwise (the sum stays on its layer's stage, or the lowest of its
 * inputs' outside layers). */
static int sum_on_sender(const Graph *g, const int *st, const int *lst, int i) {
  const Node *x = &g->nodes[i];
  if (x->op != OP_ADD || x->role != ROLE_BWD || x->nin != 2) return -1;
  int a = x->in[0], b = x->in[1];
  if (g->nodes[a].role != ROLE_BWD || g->nodes[b].role != ROLE_BWD) return -1;
  if (st[a] < 0 || st[a] != st[b] || st[a] <= lst[i]) return -1;
  return st[a];
}

/* The stage of every node of the global graph (pipeline.h) among nv stages; -1 for replicated
 * nodes. own[i] is the owner stage of param i (and of states, through their param). */
int *pp_global_stages(const StratPlan *sp, int nv, int *own) {
  const Graph *g = sp->g;
  int n = g->n;
  int *st = cp_alloc(sizeof(int) * (size_t)(n ? n : 1)), *lst = layer_stages(g, nv);
  IntVec *use = consumers(g);
  for (int i = 0; i < n; i++) {
    const Node *x = &g->nodes[i];
    st[i] = -1;
    own[i] = -1;
    if (!replicated(x) && x->role == ROLE_FWD) st[i] = lst[i];
  }
  for (int i = 0; i < n; i++) {
    if (g->nodes[i].op != OP_PARAM) continue;
    int s = -1;
    for (int q = 0; q < use[i].n; q++) {
      int c = use[i].a[q];
      if (st[c] >= 0 && (s < 0 || st[c] < s)) s = st[c];
    }
    own[i] = s >= 0 ? s : 0;
  }
  for (int i = 0; i < n; i++) {
    const Node *x = &g->nodes[i];
    if (x->op == OP_STATE) own[i] = own[x->ia[0]];
    if (replicated(x) || x->role == ROLE_FWD) continue;
    int p = param_of(g, i);
    if (x->op == OP_GRAD) st[i] = st[x->fwd];
    else if ((x->op == OP_ACCUM || x->op == OP_ASSIGN) && p >= 0) st[i] = own[p];
    else if (sum_on_sender(g, st, lst, i) >= 0)
      st[i] = sum_on_sender(g, st, lst, i); /* contributions of one later stage: summed there, one crossing */
    else if (x->role == ROLE_BWD && x->layer >= 0 && lst[i] >= 0)
      st[i] = lst[i]; /* in a layer: its stage (gradient sums, recomputed forward nodes) */
    else if (x->role == ROLE_BWD)
      for (int k = 0; k < x->nin; k++) {
        int s = st[x->in[k]];
        if (s >= 0 && (st[i] < 0 || s < st[i])) st[i] = s;
      }
  }
  /* the update: the stage of the params a node serves when that is one stage ... */
  for (int i = n - 1; i >= 0; i--) {
    const Node *x = &g->nodes[i];
    if (st[i] >= 0 || replicated(x) || x->role != ROLE_UPD) continue;
    int s = -2;
    for (int q = 0; q < use[i].n && s != -3; q++) {
      int c = st[use[i].a[q]];
      s = c < 0 ? -3 : s == -2 || s == c ? c : -3;
    }
    if (s >= 0) st[i] = s;
  }
  /* ... else the highest stage of its inputs (the gradient norm); lastly the lowest reader's */
  for (int i = 0; i < n; i++) {
    const Node *x = &g->nodes[i];
    if (st[i] >= 0 || replicated(x)) continue;
    for (int k = 0; k < x->nin; k++) {
      int in = x->in[k], s = replicated(&g->nodes[in]) ? own[in] : st[in];
      if (s > st[i]) st[i] = s;
    }
  }
  for (int i = n - 1; i >= 0; i--) {
    if (st[i] >= 0 || replicated(&g->nodes[i])) continue;
    for (int q = 0; q < use[i].n; q++) {
      int c = st[use[i].a[q]];
      if (c >= 0 && (st[i] < 0 || c < st[i])) st[i] = c;
    }
    if (st[i] < 0) st[i] = 0;
  }
  return st;
}

typedef struct Cut {
  const StratPlan *sp;
  int pp;            /* the stages: pp x chunks (the interleaved schedule's virtual stages) */
  const Graph *lg;   /* the lowered graph */
  int *lst;          /* per lowered node: its stage (-1: replicated) */
  int *tag;          /* [j * pp + s]: the tag of value j's crossing to stage s, -1: none */
  Role *erole;       /* [j * pp + s]: the phase it crosses in (the first reader's role there) */
  IntVec *use;
  /* the gradient norm (pipeline.h): the lowered node of the squared norm's total (-1: none), the
   * additions and all-reduces that sum its terms (per stage, lst -2), the update nodes before the
   * total that feed it (pre), and the scalars computed from it (every stage that reads them has
   * them: lst -1) */
  int total;
  bool *chain, *pre, *post;
  /* tied gradients (pipeline.h): per lowered node, for a param's gradient sum deferred to the
   * step's end, the input (0, 1) that another stage accumulates itself (-1: none); per lowered
   * node v, the sum whose contribution v is (-1: none) */
  int *defer, *part_of;
  char *err;
  size_t errlen;
  bool failed;
} Cut;

static void failf(Cut *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failf(Cut *c, const char *fmt, ...) {
  if (c->failed) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, c->errlen, fmt, ap);
  va_end(ap);
  c->failed = true;
}

/* A copy of lowered node j in g with inputs in (attributes, name, layer, role). */
static int copy_node(Cut *c, Graph *g, int j, const int *in, int fwd) {
  const Node *o = &c->lg->nodes[j];
  int k = ir_add(g, o->op, in, o->nin, o->span);
  Node *n = &g->nodes[k];
  memcpy(n->ia, o->ia, sizeof n->ia);
  memcpy(n->fa, o->fa, sizeof n->fa);
  memcpy(n->dims, o->dims, sizeof n->dims);
  n->ndims = o->ndims, n->name = o->name, n->layer = o->layer, n->role = o->role;
  n->fwd = fwd;
  if (replicated(o)) {
    n->shape = o->shape;
    n->dtype = o->dtype;
    return k;
  }
  char e[256];
  if (!ir_infer(g, k, e, sizeof e)) failf(c, "pipeline stage: node %%%d (%s): %s", j, ir_ops[o->op].name, e);
  return k;
}

/* The gradient norm of the update (optimizer.c: sqrt of a chain of additions of one sum of
 * squares per param, the "terms"), found in the lowered graph: c->total, the lowered node of the
 * chain's last addition; c->chain, the additions of the chain and the all-reduces the lowering
 * put inside it (tensor parallelism reduces each term); c->pre, the nodes the terms need; c->post,
 * the nodes computed from the total alone (the all-reduce of ZeRO's partial sum, the sqrt, the
 * clipping factor). Chain nodes get stage -2 and post nodes -1 (copied where read). */
static void find_norm(Cut *c, const StratPlan *sp, const Lowered *lw) {
  const Graph *gg = sp->g, *lg = c->lg;
  int n = lg->n, gn = gg->grad_norm;
  c->chain = cp_alloc(sizeof(bool) * (size_t)(n ? n : 1));
  c->pre = cp_alloc(sizeof(bool) * (size_t)(n ? n : 1));
  c->post = cp_alloc(sizeof(bool) * (size_t)(n ? n : 1));
  c->total = -1;
  if (gn < 0 || gg->nodes[gn].nin != 1 || replicated(&gg->nodes[gg->nodes[gn].in[0]])) return;
  int gt = gg->nodes[gn].in[0];
  bool *gchain = cp_alloc(sizeof(bool) * (size_t)gg->n);
  gchain[gt] = gg->nodes[gt].op == OP_ADD;
  for (int i = gt; i >= 0; i--) /* the additions that sum the terms */
    for (int k = 0; gchain[i] && k < gg->nodes[i].nin; k++) {
      const Node *x = &gg->nodes[gg->nodes[i].in[k]];
      if (x->op == OP_ADD && x->role == ROLE_UPD) gchain[gg->nodes[i].in[k]] = true;
    }
  c->total = lw->map[gt];
  c->chain[c->total] = gchain[gt];
  c->pre[c->total] = true;
  for (int j = c->total; j >= 0; j--) {
    const Node *x = &lg->nodes[j];
    if (!c->pre[j]) continue;
    for (int k = 0; k < x->nin; k++) {
      int v = x->in[k];
      const Node *y = &lg->nodes[v];
      c->pre[v] = true;
      if (c->chain[j] && (y->op == OP_ADD || y->op == OP_ALL_REDUCE) && gchain[lw->origin.a[v]]) c->chain[v] = true;
    }
  }
  for (int j = 0; j < n; j++) {
    c->pre[j] = c->pre[j] && !c->chain[j] && lg->nodes[j].role == ROLE_UPD && !replicated(&lg->nodes[j]);
    if (c->chain[j]) c->lst[j] = -2;
  }
  for (int j = c->total + 1; j < n; j++) {
    const Node *x = &lg->nodes[j];
    bool any = false, all = x->role == ROLE_UPD && !replicated(x);
    for (int k = 0; k < x->nin && all; k++) {
      int v = x->in[k];
      any |= v == c->total || c->post[v];
      all = v == c->total || c->post[v] || replicated(&lg->nodes[v]);
    }
    if (any && all) c->post[j] = true, c->lst[j] = -1;
  }
}

/* The param gradient sums to defer (pipeline.h): a backward ADD of two contributions whose only
 * reader is the ACCUM into a gradient accumulator (a state, not saved), on the owner's stage with
 * one contribution, the other computed on another stage and read by nothing else, of the sum's
 * shape and type. */
int *pp_deferred_sums(const Graph *g, const int *st) {
  IntVec *use = consumers(g);
  int *defer = cp_alloc(sizeof(int) * (size_t)(g->n ? g->n : 1));
  bool *taken = cp_alloc(sizeof(bool) * (size_t)(g->n ? g->n : 1));
  for (int j = 0; j < g->n; j++) defer[j] = -1;
  for (int j = 0; j < g->n; j++) {
    const Node *x = &g->nodes[j];
    if (x->op != OP_ADD || x->role != ROLE_BWD || x->nin != 2 || use[j].n != 1) continue;
    int acc = use[j].a[0];
    const Node *a = &g->nodes[acc];
    if (a->op != OP_ACCUM || a->nin != 2 || a->in[1] != j || st[acc] != st[j]) continue;
    const Node *sn = &g->nodes[a->in[0]];
    if (sn->op != OP_STATE || sn->ia[1] || !shape_eq(&sn->shape, &x->shape)) continue;
    for (int k = 0; k < 2; k++) {
      int v = x->in[k], u = x->in[1 - k];
      const Node *y = &g->nodes[v];
      if (st[u] != st[j] || st[v] < 0 || st[v] == st[j] || use[v].n != 1 || taken[v] || y->role != ROLE_BWD ||
          y->dtype != x->dtype || !shape_eq(&y->shape, &x->shape))
        continue;
      defer[j] = k, taken[v] = true;
      break;
    }
  }
  return defer;
}

static void find_deferred(Cut *c) {
  const Graph *lg = c->lg;
  c->use = consumers(lg);
  c->defer = pp_deferred_sums(lg, c->lst);
  c->part_of = cp_alloc(sizeof(int) * (size_t)(lg->n ? lg->n : 1));
  for (int j = 0; j < lg->n; j++) c->part_of[j] = -1;
  for (int j = 0; j < lg->n; j++)
    if (c->defer[j] >= 0) c->part_of[lg->nodes[j].in[c->defer[j]]] = j;
}

typedef struct Build {
  Cut *c;
  int s;
  Graph *g;
  int *local;        /* per lowered node: its copy here, -1 */
  int *recv;         /* per lowered node: its PP_RECV here, -1 */
  IntVec pending[3]; /* per role: sends to add before the first node of that role */
  Role cur;          /* the role of the nodes being copied */
  int *part;         /* per lowered node of the norm's sum: this stage's part of it (-1: none,
                        -2: not yet known) */
  int total_in;      /* the SCALAR_IN "grad_sumsq" that stands for the whole sum here, -1 */
  int *part_to;      /* per lowered STATE: the owner stage this stage's partial accumulator of it
                        goes to (a tied gradient), -1 */
} Build;

/* The squared gradient norm summed over every stage, which the runtime hands the update
 * (RtRun.grad_sumsq): what the readers of the lowered total read in this stage. */
static int total_in(Build *b) {
  if (b->total_in >= 0) return b->total_in;
  const Node *o = &b->c->lg->nodes[b->c->total];
  int k = ir_add(b->g, OP_SCALAR_IN, NULL, 0, o->span);
  Node *n = &b->g->nodes[k];
  n->name = "grad_sumsq", n->dtype = o->dtype, n->role = ROLE_UPD, n->layer = -1;
  char e[256];
  if (!ir_infer(b->g, k, e, sizeof e)) failf(b->c, "pipeline: the gradient norm's input: %s", e);
  return b->total_in = k;
}

static int leaf_copy(Build *b, int v) {
  if (v == b->c->total) return total_in(b);
  if (b->c->chain[v]) failf(b->c, "pipeline: %%%d, a part of the gradient norm's sum, is read outside it", v);
  if (b->local[v] >= 0) return b->local[v];
  const Node *o = &b->c->lg->nodes[v];
  int *in = cp_alloc(sizeof(int) * (size_t)(o->nin ? o->nin : 1));
  for (int k = 0; k < o->nin; k++) in[k] = leaf_copy(b, o->in[k]);
  int k = copy_node(b->c, b->g, v, in, -1);
  if (o->op == OP_STATE) b->g->nodes[k].ia[0] = leaf_copy(b, (int)o->ia[0]);
  return b->local[v] = k;
}

static void add_send(Build *b, int j, int to) {
  Cut *c = b->c;
  int pp = c->pp, in = b->local[j];
  int k = ir_add(b->g, OP_PP_SEND, &in, 1, c->lg->nodes[j].span);
  Node *n = &b->g->nodes[k];
  n->ia[0] = to, n->ia[1] = c->tag[j * pp + to];
  n->role = c->erole[j * pp + to];
  n->layer = c->lg->nodes[j].layer;
  char e[256];
  if (!ir_infer(b->g, k, e, sizeof e)) failf(c, "pipeline send: %s", e);
}

static void flush_pending(Build *b, Role r) {
  for (int rr = ROLE_FWD; rr <= (int)r; rr++) {
    for (int q = 0; q < b->pending[rr].n; q += 2) add_send(b, b->pending[rr].a[q], b->pending[rr].a[q + 1]);
    b->pending[rr].n = 0;
  }
}

static int input_of(Build *b, int v) {
  Cut *c = b->c;
  if (v == c->total || c->lst[v] < 0) return leaf_copy(b, v);
  if (c->lst[v] == b->s) return b->local[v];
  if (b->recv[v] >= 0) return b->recv[v];
  const Node *o = &c->lg->nodes[v];
  int pp = c->pp, k = ir_add(b->g, OP_PP_RECV, NULL, 0, o->span);
  Node *n = &b->g->nodes[k];
  n->ia[0] = c->lst[v], n->ia[1] = c->tag[v * pp + b->s], n->ia[2] = o->dtype;
  n->ndims = o->shape.rank;
  for (int d = 0; d < o->shape.rank; d++) n->dims[d] = o->shape.d[d];
  n->role = c->erole[v * pp + b->s];
  n->layer = o->layer;
  char e[256];
  if (!ir_infer(b->g, k, e, sizeof e)) failf(c, "pipeline receive: %s", e);
  return b->recv[v] = k;
}

/* Copies lowered node j into stage b->s with its receives and sends. */
static void copy_at(Build *b, int j) {
  Cut *c = b->c;
  const Node *o = &c->lg->nodes[j];
  int pp = c->pp;
  flush_pending(b, o->role);
  b->g->cur_layer = o->layer;
  int *in = cp_alloc(sizeof(int) * (size_t)(o->nin ? o->nin : 1));
  for (int k = 0; k < o->nin; k++) in[k] = input_of(b, o->in[k]);
  b->local[j] = copy_node(c, b->g, j, in, o->fwd >= 0 ? b->local[o->fwd] : -1);
  if (o->op == OP_GRAD && b->local[o->fwd] < 0) failf(c, "pipeline: the gradient %%%d is not on its forward node's stage", j);
  if (c->part_of[j] >= 0) { /* a tied gradient's contribution: accumulated here, sent once a step */
    int acc = c->use[c->part_of[j]].a[0], st = c->lg->nodes[acc].in[0];
    int ai[2] = {leaf_copy(b, st), b->local[j]};
    copy_node(c, b->g, acc, ai, -1);
    b->part_to[st] = c->lst[acc];
  }
  for (int to = 0; to < pp; to++) {
    if (to == b->s || c->tag[j * pp + to] < 0) continue;
    Role r = c->erole[j * pp + to];
    if (r == o->role) add_send(b, j, to);
    else {
      VEC_PUSH(b->pending[r], j);
      VEC_PUSH(b->pending[r], to);
    }
  }
}

/* This stage's part of lowered node j of the norm's sum: the sum of the terms it computes, -1
 * when it computes none of them. The additions and all-reduces of the sum are repeated over the
 * parts (an all-reduce of a scalar is linear; the ranks of its group all run this stage). */
static int norm_part(Build *b, int j) {
  Cut *c = b->c;
  if (b->part[j] != -2) return b->part[j];
  const Node *o = &c->lg->nodes[j];
  int r = -1;
  if (!c->chain[j]) /* a term: where it is computed (a replicated constant counts on stage 0) */
    r = c->lst[j] == b->s ? b->local[j] : c->lst[j] == -1 && b->s == 0 ? leaf_copy(b, j) : -1;
  else if (o->op == OP_ADD) {
    int x = norm_part(b, o->in[0]), y = norm_part(b, o->in[1]);
    r = x < 0 ? y : y < 0 ? x : copy_node(c, b->g, j, (int[]){x, y}, -1);
  } else {
    int x = norm_part(b, o->in[0]);
    r = x < 0 ? -1 : copy_node(c, b->g, j, &x, -1);
  }
  return b->part[j] = r;
}

/* Stage s's graph: its forward and backward nodes in the lowered order; then the update nodes
 * that compute its part of the squared gradient norm, ending with that part (norm_part: the
 * runtime's grad_sumsq function runs the update nodes before norm_split); then the rest of the
 * update, which reads the whole sum as a SCALAR_IN. */
static PipeStage build_stage(Cut *c, const Lowered *lw, int s) {
  const Graph *lg = c->lg;
  Build b = {.c = c, .s = s, .g = ir_new(lg->model_name), .total_in = -1};
  b.local = cp_alloc(sizeof(int) * (size_t)lg->n);
  b.recv = cp_alloc(sizeof(int) * (size_t)lg->n);
  b.part = cp_alloc(sizeof(int) * (size_t)lg->n);
  b.part_to = cp_alloc(sizeof(int) * (size_t)lg->n);
  for (int j = 0; j < lg->n; j++) b.local[j] = b.recv[j] = b.part_to[j] = -1, b.part[j] = -2;
  for (int k = 0; k < lg->inputs.n; k++) leaf_copy(&b, lg->inputs.a[k]); /* every stage reads the data */
  for (int j = 0; j < lg->n && !c->failed; j++)
    if (c->lst[j] == s && c->defer[j] >= 0) /* the owner's side of a deferred sum: its own part */
      b.local[j] = input_of(&b, lg->nodes[j].in[1 - c->defer[j]]);
    else if (c->lst[j] == s && lg->nodes[j].role != ROLE_UPD) copy_at(&b, j);
  flush_pending(&b, ROLE_BWD);
  for (int j = 0; j < lg->n && !c->failed; j++)
    if (c->lst[j] == s && lg->nodes[j].role == ROLE_UPD && c->pre[j]) copy_at(&b, j);
  PipeStage ps = {.norm_part = c->total >= 0 && !c->failed ? norm_part(&b, c->total) : -1};
  ps.norm_split = b.g->n;
  for (int j = 0; j < lg->n && !c->failed; j++)
    if (c->lst[j] == s && lg->nodes[j].role == ROLE_UPD && !c->pre[j]) copy_at(&b, j);
  if (lg->grad_norm >= 0 && c->post[lg->grad_norm] && !c->failed) leaf_copy(&b, lg->grad_norm); /* every stage has the norm */
  flush_pending(&b, ROLE_UPD);
  /* the lists, in the lowered graph's orders */
  Graph *g = b.g;
  ps.g = g;
  ps.gparam = cp_alloc(sizeof(int) * (size_t)(lg->params.n + 1));
  ps.owned = cp_alloc(sizeof(bool) * (size_t)(lg->params.n + 1));
  ps.gstate = cp_alloc(sizeof(int) * (size_t)(lg->states.n + 1));
  ps.part_to = cp_alloc(sizeof(int) * (size_t)(lg->states.n + 1));
  for (int k = 0; k < lg->params.n; k++) {
    int v = b.local[lg->params.a[k]];
    if (v < 0) continue;
    ps.gparam[g->params.n] = k;
    ps.owned[g->params.n] = true; /* set by pp_partition */
    VEC_PUSH(g->params, v);
    int gr = lg->grads.n ? lg->grads.a[k] : -1; /* none for a deferred sum: only a part is here */
    VEC_PUSH(g->grads, gr >= 0 && b.local[gr] >= 0 && c->defer[gr] < 0 ? b.local[gr] : -1);
  }
  for (int k = 0; k < lg->inputs.n; k++) VEC_PUSH(g->inputs, b.local[lg->inputs.a[k]]);
  for (int k = 0; k < lg->states.n; k++) {
    int v = b.local[lg->states.a[k]];
    if (v < 0) continue;
    ps.gstate[g->states.n] = k;
    ps.part_to[g->states.n] = b.part_to[lg->states.a[k]];
    VEC_PUSH(g->states, v);
  }
  for (int k = 0; k < lg->layer_names.n; k++) VEC_PUSH(g->layer_names, lg->layer_names.a[k]);
  for (int k = 0; k < lg->metrics.n; k++) {
    Metric m = lg->metrics.a[k];
    if (b.local[m.node] < 0) continue;
    m.node = b.local[m.node];
    VEC_PUSH(g->metrics, m);
  }
  g->loss = lg->loss >= 0 ? b.local[lg->loss] : -1;
  g->grad_norm = lg->grad_norm >= 0 ? b.local[lg->grad_norm] : -1;
  g->seed = lg->seed >= 0 ? b.local[lg->seed] : -1;
  g->accum = lg->accum;
  g->batch = lg->batch;
  (void)lw;
  return ps;
}

Pipeline *pp_partition(const StratPlan *sp, const Lowered *lw, int chunks, char *err, size_t errlen) {
  const Graph *gg = sp->g, *lg = lw->g;
  int pp = (int)sp->pp * chunks;
  if (gg->layer_names.n < pp) {
    snprintf(err, errlen, "%d stages of %d chunks need at least %d layers, the model has %d", (int)sp->pp, chunks, pp,
             gg->layer_names.n);
    return NULL;
  }
  int *own = cp_alloc(sizeof(int) * (size_t)(gg->n ? gg->n : 1));
  int *gst = pp_global_stages(sp, pp, own);
  Cut c = {.sp = sp, .pp = pp, .lg = lg, .err = err, .errlen = errlen};
  c.lst = cp_alloc(sizeof(int) * (size_t)(lg->n ? lg->n : 1));
  for (int j = 0; j < lg->n; j++) c.lst[j] = replicated(&lg->nodes[j]) ? -1 : gst[lw->origin.a[j]];
  find_norm(&c, sp, lw);
  find_deferred(&c);
  /* the crossings: value j read on another stage */
  c.tag = cp_alloc(sizeof(int) * (size_t)(lg->n * pp + 1));
  c.erole = cp_alloc(sizeof(Role) * (size_t)(lg->n * pp + 1));
  for (int q = 0; q < lg->n * pp; q++) c.tag[q] = -1, c.erole[q] = ROLE_UPD;
  Pipeline *p = cp_alloc(sizeof *p);
  p->pp = pp;
  p->devices = (int)sp->pp;
  p->chunks = chunks;
  for (int i = 0; i < lg->n; i++) {
    const Node *n = &lg->nodes[i];
    if (c.lst[i] < 0) continue;
    for (int k = 0; k < n->nin; k++) {
      int v = n->in[k];
      if (v == c.total || c.lst[v] < 0 || c.lst[v] == c.lst[i] || c.defer[i] == k) continue;
      if (n->role == ROLE_UPD) { /* the update of a param is on its owner's stage (pipeline.h) */
        snprintf(err, errlen, "the update node %%%d (%s) reads %%%d of another stage", i, ir_ops[n->op].name, v);
        return NULL;
      }
      int q = v * pp + c.lst[i];
      if (c.tag[q] < 0) c.tag[q] = p->ncross++;
      if (n->role < c.erole[q]) c.erole[q] = n->role;
    }
  }
  /* A forward value another stage reads only in its backward is sent at the start of the
   * producer's backward. Under the interleaved schedule a rank runs its later stage's backward of
   * a micro-batch before its earlier stage's, so a reader beyond the later stage would wait on
   * its own backward: refused (none of the models tested here has such a value). */
  for (int v = 0; v < lg->n && chunks > 1; v++)
    for (int s = 0; s < pp; s++)
      if (c.tag[v * pp + s] >= 0 && c.erole[v * pp + s] != lg->nodes[v].role && s > c.lst[v] + (int)sp->pp) {
        snprintf(err, errlen, "stage %d reads the forward value %%%d of stage %d only in its backward, which the "
                 "interleaved schedule cannot order", s, v, c.lst[v]);
        return NULL;
      }
  p->stages = cp_alloc(sizeof(PipeStage) * (size_t)pp);
  for (int s = 0; s < pp && !c.failed; s++) p->stages[s] = build_stage(&c, lw, s);
  if (c.failed) return NULL;
  p->owner = cp_alloc(sizeof(int) * (size_t)(gg->params.n + 1));
  for (int k = 0; k < gg->params.n; k++) p->owner[k] = own[gg->params.a[k]];
  for (int s = 0; s < pp; s++) {
    PipeStage *ps = &p->stages[s];
    for (int k = 0; k < ps->g->params.n; k++) ps->owned[k] = p->owner[ps->gparam[k]] == s;
    bool work = false;
    for (int i = 0; i < ps->g->n; i++) work |= ps->g->nodes[i].role == ROLE_FWD && !replicated(&ps->g->nodes[i]);
    if (!work) {
      snprintf(err, errlen, "pipeline stage %d has no forward computation", s);
      return NULL;
    }
    char e[512];
    if (!ir_verify(ps->g, e, sizeof e)) {
      snprintf(err, errlen, "pipeline stage %d: %s", s, e);
      return NULL;
    }
  }
  return p;
}
