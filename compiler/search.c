/* search.c: the auto-parallel search (search.h). Three parts, in this order:
 *   1. the ILP and its CBC and brute-force solvers;
 *   2. segments: the ILP of a set of forward nodes on the tp axis (one layer of each class, or
 *      the nodes outside every layer), built from the sharding rules and the cost model;
 *   3. the outer search: degrees, micro-batch size, ZeRO, recompute, schedule, and the pipeline
 *      DP over contiguous layer ranges, then the ranking.
 *
 * What is approximate: the backward of a node costs twice its forward compute; the backward
 * collective of an edge is the conjugate of its forward one (all-gather <-> reduce-scatter, an R
 * value consumed by a split op gets partial gradients, all-reduced); gradients of params the tp
 * axis replicates are reduced per micro-batch in the ILP (per step in reality: a small
 * overestimate); the boundary between layers of different classes is taken as replicated;
 * stages of a pipeline all use submeshes of the same shape (dp x tp). */
#include "search.h"
#include "lower.h"
#include "pipeline.h"
#include "train.h"

#include <coin/Cbc_C_Interface.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- 1. the ILP ------------------------------------------------------------------------------ */

double srch_ilp_cost(const IlpProblem *p, const int *choice) {
  double c = 0;
  for (int v = 0; v < p->nvars; v++) c += p->cost[v][choice[v]];
  for (int e = 0; e < p->nedges; e++) c += p->ecost[e][choice[p->eu[e]] * p->ncand[p->ev[e]] + choice[p->ev[e]]];
  return c;
}

static double ilp_mem(const IlpProblem *p, const int *choice) {
  double m = 0;
  for (int v = 0; v < p->nvars; v++) m += p->mem ? p->mem[v][choice[v]] : 0;
  return m;
}

bool srch_ilp_brute(const IlpProblem *p, int *choice, double *obj) {
  int *cur = calloc((size_t)p->nvars + 1, sizeof *cur);
  bool found = false;
  for (;;) {
    if (p->mem_limit <= 0 || ilp_mem(p, cur) <= p->mem_limit * (1 + 1e-9)) {
      double c = srch_ilp_cost(p, cur);
      if (!found || c < *obj - 1e-12) {
        *obj = c;
        memcpy(choice, cur, sizeof(int) * (size_t)p->nvars);
        found = true;
      }
    }
    int v = 0;
    while (v < p->nvars && ++cur[v] == p->ncand[v]) cur[v++] = 0;
    if (v == p->nvars) break;
  }
  free(cur);
  return found;
}

/* CBC works best on coefficients near 1: time in microseconds, memory in GiB. */
enum { TIME_SCALE = 1000000 };
static const double MEM_SCALE = 1.0 / (1 << 30);

bool srch_ilp_solve(const IlpProblem *p, int *choice, double *obj) {
  Cbc_Model *m = Cbc_newModel();
  Cbc_setLogLevel(m, 0);
  int *xcol = malloc(sizeof(int) * (size_t)(p->nvars + 1));
  int ncols = 0;
  for (int v = 0; v < p->nvars; v++) {
    xcol[v] = ncols;
    for (int k = 0; k < p->ncand[v]; k++, ncols++) Cbc_addCol(m, "", 0, 1, p->cost[v][k] * TIME_SCALE, 1, 0, NULL, NULL);
  }
  int *ycol = malloc(sizeof(int) * (size_t)(p->nedges + 1));
  for (int e = 0; e < p->nedges; e++) {
    ycol[e] = ncols;
    int na = p->ncand[p->eu[e]], nc = p->ncand[p->ev[e]];
    for (int k = 0; k < na * nc; k++, ncols++) Cbc_addCol(m, "", 0, 1, p->ecost[e][k] * TIME_SCALE, 0, 0, NULL, NULL);
  }
  int maxrow = 1;
  for (int v = 0; v < p->nvars; v++) maxrow += p->ncand[v];
  for (int e = 0; e < p->nedges; e++) {
    int na = p->ncand[p->eu[e]], nc = p->ncand[p->ev[e]];
    if (na + 1 > maxrow) maxrow = na + 1;
    if (nc + 1 > maxrow) maxrow = nc + 1;
  }
  int *idx = malloc(sizeof(int) * (size_t)maxrow);
  double *val = malloc(sizeof(double) * (size_t)maxrow);
  for (int v = 0; v < p->nvars; v++) { /* one choice per variable */
    for (int k = 0; k < p->ncand[v]; k++) idx[k] = xcol[v] + k, val[k] = 1;
    Cbc_addRow(m, "", p->ncand[v], idx, val, 'E', 1);
  }
  for (int e = 0; e < p->nedges; e++) { /* y's marginals are the two variables' x */
    int u = p->eu[e], w = p->ev[e], na = p->ncand[u], nc = p->ncand[w];
    for (int a = 0; a < na; a++) {
      for (int c = 0; c < nc; c++) idx[c] = ycol[e] + a * nc + c, val[c] = 1;
      idx[nc] = xcol[u] + a, val[nc] = -1;
      Cbc_addRow(m, "", nc + 1, idx, val, 'E', 0);
    }
    for (int c = 0; c < nc; c++) {
      for (int a = 0; a < na; a++) idx[a] = ycol[e] + a * nc + c, val[a] = 1;
      idx[na] = xcol[w] + c, val[na] = -1;
      Cbc_addRow(m, "", na + 1, idx, val, 'E', 0);
    }
  }
  if (p->mem_limit > 0 && p->mem) {
    int n = 0;
    for (int v = 0; v < p->nvars; v++)
      for (int k = 0; k < p->ncand[v]; k++) idx[n] = xcol[v] + k, val[n++] = p->mem[v][k] * MEM_SCALE;
    Cbc_addRow(m, "", n, idx, val, 'L', p->mem_limit * MEM_SCALE);
  }
  Cbc_solve(m);
  bool ok = Cbc_isProvenOptimal(m) && !Cbc_isProvenInfeasible(m);
  if (ok) {
    const double *x = Cbc_getColSolution(m);
    for (int v = 0; v < p->nvars; v++) {
      int best = 0;
      for (int k = 1; k < p->ncand[v]; k++)
        if (x[xcol[v] + k] > x[xcol[v] + best]) best = k;
      choice[v] = best;
    }
    *obj = srch_ilp_cost(p, choice);
    if (p->mem_limit > 0 && ilp_mem(p, choice) > p->mem_limit * (1 + 1e-6)) ok = false;
  }
  free(xcol), free(ycol), free(idx), free(val);
  Cbc_deleteModel(m);
  return ok;
}

/* ---- 2. segments ----------------------------------------------------------------------------- */

/* One strategy of one node on the tp axis. */
typedef struct Cand {
  Pl *in;               /* per input */
  Pl out;
  bool split;           /* the node's work is divided over the axis */
  double tf, tb;        /* seconds: forward, backward (compute, inner collectives, fixed edges) */
  double bytes;         /* bytes sent per device (fixed edges and inner collectives) */
  double act;           /* bytes saved for the backward pass */
  double par;           /* param elements held per device */
  double cheap_t;       /* forward seconds of a memory-bound node (selective recompute reruns it) */
} Cand;

typedef struct Var {
  int node;
  int nc;
  Cand *c;
} Var;

typedef struct Edge {
  int u, v;             /* variables */
  double *f, *b, *bytes;/* per pair (a * nc(v) + c) */
} Edge;

/* What a solved node decided, per graph node (for the segments solved after it). */
typedef struct Chosen {
  bool set;
  Pl out;
  const Pl *in;
  bool split;
} Chosen;

typedef struct Seg {
  const Graph *g;
  const CostModel *cm;
  int64_t n;
  CostLink link;
  const uint8_t *bmask; /* per node: bit d set when dim d of its output is a batch dim */
  const bool *saved;    /* per node: its output is kept for the backward pass */
  const bool *flows;    /* per node: the backward gives it a gradient (ad_grad_flows) */
  /* The build's placements on the tp axis (strat_tp_place), or NULL (srch_graph_problem: every
   * strategy of every node's rule is a candidate). When set, each node's one candidate is the
   * placement the build gives it: what is priced is what runs. */
  const Pl *pin_out;
  Pl *const *pin_cons;
  Pl *const *pin_from;  /* per node, per input: its placement before the reshard (strat_tp_place) */
  uint8_t *bwd_done;    /* per node: the backward collectives its gradient has been charged (bit per
                           Collective): the consumers' gradient contributions are summed, then
                           reduced once */
  VEC(Var) vars;
  VEC(Edge) edges;
  int64_t over;         /* > 0: a node none of whose strategies keeps its tensors within the kernels'
                           2^31 - 1 elements per rank; the fewest elements its best one holds */
  int over_node;        /* that node (the worst such) */
} Seg;

/* A param's elements on one device and its global dim 0: ZeRO shards a param over dp only when
 * dp divides its dim 0 (strategy.c place_leaf); the others stay whole on every replica, their
 * gradient all-reduced once per step as under ZeRO 0 (GPT-2's vocabulary of 50257). */
typedef struct ParDim {
  int64_t d0;           /* -1: a scalar */
  double par;
} ParDim;
typedef VEC(ParDim) ParDims;

/* Elements of the params in p that ZeRO cannot shard over dp replicas. */
static double par_unsharded(const ParDims *p, int64_t dp) {
  double u = 0;
  for (int i = 0; i < p->n; i++)
    if (p->a[i].d0 <= 0 || p->a[i].d0 % dp != 0) u += p->a[i].par;
  return u;
}

/* The summary of a solved segment, per micro-batch on one device. */
typedef struct SegCost {
  double tf, tb, bytes, act, par, cheap_t, cheap_act, out_act, max_act;
  ParDims pd;           /* the params of par, by dim 0 */
} SegCost;

static bool is_view(OpId op) {
  return op == OP_RESHAPE || op == OP_TRANSPOSE || op == OP_PERMUTE || op == OP_SPLIT_HEADS ||
         op == OP_MERGE_HEADS || op == OP_SLICE;
}

/* Ops whose backward does not read this input's value. */
static bool grad_ignores_inputs(OpId op) {
  return op == OP_ADD || op == OP_SUB || op == OP_NEG || op == OP_DROPOUT || op == OP_CONCAT || is_view(op);
}

/* Which forward outputs the backward pass keeps: inputs of ops whose gradient reads them (views
 * pass the need to their input and take no memory themselves). */
static bool *saved_outputs(const Graph *g) {
  bool *need = cp_alloc((size_t)g->n);
  for (int i = g->n - 1; i >= 0; i--) {
    const Node *n = &g->nodes[i];
    if (n->role != ROLE_FWD) continue;
    if (n->op == OP_CROSS_ENTROPY || n->op == OP_SDPA || n->op == OP_SOFTMAX || n->op == OP_LOG_SOFTMAX)
      need[i] = true; /* these backwards read their own output (softmax, attention's statistics) */
    if (is_view(n->op) && need[i]) need[n->in[0]] = true;
    if (grad_ignores_inputs(n->op)) continue;
    for (int k = 0; k < n->nin; k++) need[n->in[k]] = true;
  }
  for (int i = 0; i < g->n; i++)
    if (is_view(g->nodes[i].op) || (ir_ops[g->nodes[i].op].flags & OPF_LEAF)) need[i] = false;
  return need;
}

/* Whether the backward gives u a gradient through `consumer`'s input k (ad_backward's rule): u has
 * one, and the consumer has one and passes it on (a no-grad op, argmax or a comparison, does not;
 * nor does where to its cond). */
static bool gets_grad(const Seg *s, int u, int consumer, int k) {
  const Node *c = &s->g->nodes[consumer];
  return s->flows[u] && s->flows[consumer] && !(ir_ops[c->op].flags & (OPF_LEAF | OPF_NOGRAD)) && ad_grad_input(c, k);
}

/* Whether u is a param or a view of one (the head's transpose of a tied embedding): its gradient
 * is part of a param's gradient, which the program keeps in f32 whatever the precision. */
static bool param_value(const Graph *g, int u) {
  while (is_view(g->nodes[u].op) && g->nodes[u].nin > 0) u = g->nodes[u].in[0];
  return g->nodes[u].op == OP_PARAM;
}

/* Forward and backward seconds (and bytes) of changing u's value from `from` to `to` for a
 * consumer that runs split or not. The forward sends u at the compute dtype (a param's low-precision
 * copy); the backward its gradient, in f32 when it is a param's. */
static Collective bwd_coll(const Seg *s, int u, int consumer, int k, Pl from, Pl to, bool split) {
  Collective b = COLL_NONE;
  if (from.kind == PL_R && to.kind == PL_R) b = split ? COLL_ALL_REDUCE : COLL_NONE;
  else if (from.kind == PL_S && to.kind == PL_R) b = split ? COLL_REDUCE_SCATTER : COLL_NONE;
  else if (from.kind == PL_P) /* reduced forward; a split consumer's gradient of the sum is partial */
    b = to.kind == PL_S ? COLL_ALL_GATHER : split ? COLL_ALL_REDUCE : COLL_NONE;
  else if (from.kind == PL_S && to.kind == PL_S) b = from.dim != to.dim ? COLL_ALL_TO_ALL : COLL_NONE;
  else if (from.kind == PL_R && to.kind == PL_S) b = COLL_ALL_GATHER;
  return gets_grad(s, u, consumer, k) ? b : COLL_NONE;
}

static void edge_cost(const Seg *s, int u, int consumer, int k, Pl from, Pl to, bool split, double *tf,
                      double *tb, double *bytes) {
  double whole = cost_act_bytes(s->cm, s->g, u);
  double gwhole = param_value(s->g, u) ? (double)shape_numel(&s->g->nodes[u].shape) * s->cm->g_bytes : whole;
  Collective f = pl_reshard(from, to), b = bwd_coll(s, u, consumer, k, from, to, split);
  *tf = cost_collective(s->cm, f, whole, s->n, s->link);
  *tb = cost_collective(s->cm, b, gwhole, s->n, s->link);
  *bytes = pl_coll_bytes(f, whole, s->n) + pl_coll_bytes(b, gwhole, s->n);
}

static bool batch_split(const Seg *s, int node, Pl p) {
  return p.kind == PL_S && p.dim < 8 && (s->bmask[node] >> p.dim & 1);
}

/* The elements one rank holds of node u's value under placement p on the tp axis of n devices: a
 * split value its shard, a replicated or partial one the whole tensor. */
static int64_t rank_elems(const Graph *g, int u, Pl p, int64_t n) {
  int64_t e = shape_numel(&g->nodes[u].shape);
  return p.kind == PL_S ? (e + n - 1) / n : e;
}

/* The kernels index a tensor with 32 bits (cg_check_sizes, on the per-rank graph the lowering
 * makes): drops node i's strategies that put more than 2^31 - 1 elements of its output, or of an
 * input as the strategy reads it (a reshard materializes that), on one rank. When none is left the
 * candidates stay (the segment is then refused) and s->over records the fewest elements of them. */
static void cand_sizes(Seg *s, int i, Cand **cs, int *n) {
  const Node *nd = &s->g->nodes[i];
  int keep = 0;
  int64_t best = INT64_MAX;
  for (int k = 0; k < *n; k++) {
    const Cand *c = &(*cs)[k];
    int64_t big = rank_elems(s->g, i, c->out, s->n);
    for (int j = 0; j < nd->nin; j++) {
      int64_t e = rank_elems(s->g, nd->in[j], c->in[j], s->n);
      if (e > big) big = e;
    }
    if (big < best) best = big;
    if (big <= INT32_MAX) (*cs)[keep++] = *c;
  }
  if (keep > 0) {
    *n = keep;
    return;
  }
  if (best > s->over) s->over = best, s->over_node = i;
}

/* The candidates of node i: leaves R (params also S(d)); other nodes their sharding rule's
 * strategies, without splits of the batch (the dp axis's job). */
static void node_cands(Seg *s, int i, Var *var) {
  const Graph *g = s->g;
  const Node *n = &g->nodes[i];
  const CostModel *cm = s->cm;
  VEC(Cand) cs = {0};
  bool leaf = ir_ops[n->op].flags & OPF_LEAF;
  if (s->pin_out && s->n > 1) { /* the build's placement */
    Cand c = {.in = cp_alloc(sizeof(Pl) * (size_t)(n->nin + 1)), .out = s->pin_out[i]};
    c.split = c.out.kind == PL_S;
    for (int k = 0; k < n->nin; k++) {
      c.in[k] = leaf || !s->pin_cons[i] ? pl_r() : s->pin_cons[i][k];
      c.split |= !leaf && c.in[k].kind == PL_S;
    }
    VEC_PUSH(cs, c);
  } else if (leaf || s->n == 1) {
    Cand c = {.in = cp_alloc(sizeof(Pl) * (size_t)(n->nin + 1)), .out = pl_r()};
    for (int k = 0; k < n->nin; k++) c.in[k] = pl_r();
    VEC_PUSH(cs, c);
    if (n->op == OP_PARAM && s->n > 1)
      for (int d = 0; d < n->shape.rank; d++)
        if (n->shape.d[d] % s->n == 0) VEC_PUSH(cs, ((Cand){.in = c.in, .out = pl_s(d), .split = true}));
  } else {
    enum { MAXC = 256 };
    Pl *ins = cp_alloc(sizeof(Pl) * (size_t)(MAXC * (n->nin ? n->nin : 1))), outs[MAXC];
    int nc = shard_candidates(g, n, s->n, ins, outs, MAXC);
    for (int k = 0; k < nc; k++) {
      Pl *in = ins + (size_t)k * (size_t)n->nin;
      bool bad = batch_split(s, i, outs[k]), split = outs[k].kind == PL_S;
      for (int j = 0; j < n->nin; j++) {
        bad |= batch_split(s, n->in[j], in[j]);
        split |= in[j].kind == PL_S;
      }
      if (!bad) VEC_PUSH(cs, ((Cand){.in = in, .out = outs[k], .split = split}));
    }
    if (cs.n == 0) { /* every strategy splits the batch: run whole */
      Cand c = {.in = cp_alloc(sizeof(Pl) * (size_t)n->nin), .out = pl_r()};
      for (int k = 0; k < n->nin; k++) c.in[k] = pl_r();
      VEC_PUSH(cs, c);
    }
  }
  cand_sizes(s, i, &cs.a, &cs.n);
  for (int k = 0; k < cs.n; k++) {
    Cand *c = &cs.a[k];
    double div = c->split ? (double)s->n : 1, out_div = c->out.kind == PL_S ? (double)s->n : 1;
    if (n->op == OP_PARAM) {
      c->par = (double)shape_numel(&n->shape) / out_div;
      continue;
    }
    if (leaf) continue;
    double t = cost_node(cm, g, i, div);
    c->tf = t;
    /* No gradient flows through it (integer values, comparisons, float(), metrics): no backward. */
    c->tb = !s->flows[i] || (ir_ops[n->op].flags & OPF_NOGRAD) ? 0 : n->op == OP_CROSS_ENTROPY ? t : 2 * t;
    if (s->saved[i]) c->act = cost_act_bytes(cm, g, i) / out_div;
    if (cost_class(g, i) == CC_MEMORY && !is_view(n->op)) c->cheap_t = t;
    ShardIO io = {.in = c->in, .n = s->n};
    if (s->n > 1 && shard_node(g, n, &io) && io.extra_bytes > 0) {
      /* ring hops: an all-gather n - 1, an all-reduce 2 (n - 1) */
      double hops = (io.extra_coll == COLL_ALL_GATHER ? 1 : 2) * (double)(s->n - 1);
      c->tf += s->link.lat * hops + io.extra_bytes / s->link.bw;
      c->bytes += io.extra_bytes;
    }
  }
  var->node = i;
  var->nc = cs.n;
  var->c = cs.a;
}

/* Under the build's placements: input k of v's node, u's value, costs the reshard strat_pin
 * records for it forward (from the placement u's value has then: none where an earlier reshard is
 * reused or a reduction ran in place), and backward its gradient's change to u's placement, where
 * an input taken whole by an op that ran split is its slice (its gradient split alike); each
 * backward collective of u once, as the contributions are summed before it. */
static void add_pinned_in(Seg *s, Var *v, int k, int u) {
  const Graph *g = s->g;
  Cand *c = &v->c[0];
  const Node *n = &g->nodes[v->node];
  Pl from = s->pin_from[v->node] ? s->pin_from[v->node][k] : s->pin_out[u];
  Pl to = shard_sliced_input(g, n, k, c->in, c->out);
  double whole = cost_act_bytes(s->cm, g, u);
  double gwhole = param_value(g, u) ? (double)shape_numel(&g->nodes[u].shape) * s->cm->g_bytes : whole;
  Collective f = pl_reshard(from, c->in[k]), b = bwd_coll(s, u, v->node, k, s->pin_out[u], to, c->split);
  if (b != COLL_NONE && (s->bwd_done[u] >> b & 1)) b = COLL_NONE;
  if (b != COLL_NONE) s->bwd_done[u] |= (uint8_t)(1u << b);
  c->tf += cost_collective(s->cm, f, whole, s->n, s->link);
  c->tb += cost_collective(s->cm, b, gwhole, s->n, s->link);
  c->bytes += pl_coll_bytes(f, whole, s->n) + pl_coll_bytes(b, gwhole, s->n);
}

/* Adds the forward/backward cost of an edge between a variable and a fixed placement. */
static void add_fixed_in(Seg *s, Var *v, int k, int u, Pl from) {
  for (int c = 0; c < v->nc; c++) {
    double tf, tb, by;
    edge_cost(s, u, v->node, k, from, v->c[c].in[k], v->c[c].split, &tf, &tb, &by);
    v->c[c].tf += tf, v->c[c].tb += tb, v->c[c].bytes += by;
  }
}

static void add_fixed_out(Seg *s, Var *v, int wnode, const Chosen *w, int k) {
  for (int a = 0; a < v->nc; a++) {
    double tf, tb, by;
    edge_cost(s, v->node, wnode, k, v->c[a].out, w->in[k], w->split, &tf, &tb, &by);
    v->c[a].tf += tf, v->c[a].tb += tb, v->c[a].bytes += by;
  }
}

static void add_edge(Seg *s, int uv, int vv, int k, int u_node) {
  Var *U = &s->vars.a[uv], *V = &s->vars.a[vv];
  Edge *e = NULL;
  for (int i = 0; i < s->edges.n && !e; i++)
    if (s->edges.a[i].u == uv && s->edges.a[i].v == vv) e = &s->edges.a[i];
  if (!e) {
    size_t sz = sizeof(double) * (size_t)(U->nc * V->nc);
    Edge ne = {uv, vv, cp_alloc(sz), cp_alloc(sz), cp_alloc(sz)};
    VEC_PUSH(s->edges, ne);
    e = &s->edges.a[s->edges.n - 1];
  }
  for (int a = 0; a < U->nc; a++)
    for (int c = 0; c < V->nc; c++) {
      double tf, tb, by;
      edge_cost(s, u_node, V->node, k, U->c[a].out, V->c[c].in[k], V->c[c].split, &tf, &tb, &by);
      int j = a * V->nc + c;
      e->f[j] += tf, e->b[j] += tb, e->bytes[j] += by;
    }
}

/* Builds the segment of `nodes` (forward, graph order). A producer outside it in [plo, phi)
 * stands for the variable of node u + off (the previous identical layer: periodic); other outside
 * producers have their `chosen` placement (R when none). Consumers outside the segment with a
 * chosen strategy add their edge's cost to the producer. */
static void seg_build(Seg *s, const int *nodes, int nn, int plo, int phi, int off, const Chosen *chosen) {
  const Graph *g = s->g;
  /* per graph node: its variable or -1; kept all -1 between calls (a search builds a segment per
   * layer: an array of the graph's size for each made the search quadratic in the layers) */
  static int *var_of;
  static int var_cap;
  if (var_cap < g->n + 1) {
    free(var_of);
    var_cap = 2 * (g->n + 1);
    var_of = malloc(sizeof(int) * (size_t)var_cap);
    if (!var_of) cp_panic(__FILE__, __LINE__, "out of memory");
    for (int i = 0; i < var_cap; i++) var_of[i] = -1;
  }
  for (int k = 0; k < nn; k++) {
    Var v;
    node_cands(s, nodes[k], &v);
    var_of[nodes[k]] = s->vars.n;
    VEC_PUSH(s->vars, v);
  }
  for (int vv = 0; vv < s->vars.n; vv++) {
    int i = s->vars.a[vv].node;
    const Node *n = &g->nodes[i];
    for (int k = 0; k < n->nin; k++) {
      if (s->pin_out && s->n > 1) { /* one candidate each: every edge is a fixed cost of its consumer */
        if (!(ir_ops[n->op].flags & OPF_LEAF)) add_pinned_in(s, &s->vars.a[vv], k, n->in[k]);
        continue;
      }
      int u = n->in[k], uv = var_of[u];
      if (uv < 0 && u >= plo && u < phi) uv = var_of[u + off];
      if (uv >= 0) add_edge(s, uv, vv, k, u);
      else add_fixed_in(s, &s->vars.a[vv], k, u, s->pin_out ? s->pin_out[u] : chosen && chosen[u].set ? chosen[u].out : pl_r());
    }
  }
  for (int w = 0; chosen && !(s->pin_out && s->n > 1) && w < g->n; w++) {
    if (var_of[w] >= 0 || !chosen[w].set || g->nodes[w].role != ROLE_FWD) continue;
    for (int k = 0; k < g->nodes[w].nin; k++) {
      int u = g->nodes[w].in[k];
      if (var_of[u] >= 0 && !(u >= plo && u < phi)) add_fixed_out(s, &s->vars.a[var_of[u]], w, &chosen[w], k);
    }
  }
  for (int k = 0; k < nn; k++) var_of[nodes[k]] = -1;
}

/* The ILP of a segment: time per micro-batch, and memory wa·(activations kept under rc) + wp·par
 * against `limit` (<= 0: none). */
static IlpProblem *seg_problem(const Seg *s, double wa, double wp, Recompute rc, double limit) {
  IlpProblem *p = cp_alloc(sizeof *p);
  int nv = s->vars.n, ne = s->edges.n;
  p->nvars = nv;
  p->ncand = cp_alloc(sizeof(int) * (size_t)(nv + 1));
  p->cost = cp_alloc(sizeof(double *) * (size_t)(nv + 1));
  p->mem = cp_alloc(sizeof(double *) * (size_t)(nv + 1));
  for (int v = 0; v < nv; v++) {
    const Var *V = &s->vars.a[v];
    p->ncand[v] = V->nc;
    p->cost[v] = cp_alloc(sizeof(double) * (size_t)V->nc);
    p->mem[v] = cp_alloc(sizeof(double) * (size_t)V->nc);
    for (int c = 0; c < V->nc; c++) {
      p->cost[v][c] = V->c[c].tf + V->c[c].tb;
      double act = rc == RC_FULL || (rc == RC_SELECTIVE && V->c[c].cheap_t > 0) ? 0 : V->c[c].act;
      p->mem[v][c] = wa * act + wp * V->c[c].par;
    }
  }
  p->nedges = ne;
  p->eu = cp_alloc(sizeof(int) * (size_t)(ne + 1));
  p->ev = cp_alloc(sizeof(int) * (size_t)(ne + 1));
  p->ecost = cp_alloc(sizeof(double *) * (size_t)(ne + 1));
  for (int e = 0; e < ne; e++) {
    const Edge *E = &s->edges.a[e];
    int k = s->vars.a[E->u].nc * s->vars.a[E->v].nc;
    p->eu[e] = E->u, p->ev[e] = E->v;
    p->ecost[e] = cp_alloc(sizeof(double) * (size_t)k);
    for (int j = 0; j < k; j++) p->ecost[e][j] = E->f[j] + E->b[j];
  }
  p->mem_limit = limit;
  return p;
}

/* Adds up a solved segment and records its choices in `chosen` (for node i + shift). */
static SegCost seg_cost(const Seg *s, const int *choice, Chosen *chosen, int shift) {
  SegCost sc = {0};
  const Graph *g = s->g;
  for (int v = 0; v < s->vars.n; v++) {
    const Var *V = &s->vars.a[v];
    const Cand *c = &V->c[choice[v]];
    sc.tf += c->tf, sc.tb += c->tb, sc.bytes += c->bytes, sc.act += c->act, sc.par += c->par;
    sc.cheap_t += c->cheap_t;
    if (c->cheap_t > 0) sc.cheap_act += c->act;
    if (c->act > sc.max_act) sc.max_act = c->act;
    const Node *n = &g->nodes[V->node];
    if (n->op == OP_PARAM) VEC_PUSH(sc.pd, ((ParDim){n->shape.rank > 0 ? n->shape.d[0] : -1, c->par}));
    if (chosen) chosen[V->node + shift] = (Chosen){true, c->out, c->in, c->split};
  }
  for (int e = 0; e < s->edges.n; e++) {
    const Edge *E = &s->edges.a[e];
    int j = choice[E->u] * s->vars.a[E->v].nc + choice[E->v];
    sc.tf += E->f[j], sc.tb += E->b[j], sc.bytes += E->bytes[j];
  }
  return sc;
}

static Seg seg_new(const Graph *g, const CostModel *cm, int64_t n, CostLink link, const uint8_t *bmask,
                   const bool *saved, const bool *flows, const Pl *pin_out, Pl *const *pin_cons, Pl *const *pin_from,
                   uint8_t *bwd_done) {
  Seg s = {.g = g, .cm = cm, .n = n, .link = link, .bmask = bmask, .saved = saved, .flows = flows,
           .pin_out = pin_out, .pin_cons = pin_cons, .pin_from = pin_from, .bwd_done = bwd_done};
  return s;
}

IlpProblem *srch_graph_problem(const Graph *g, const CostModel *cm, int64_t n) {
  uint8_t *bmask = cp_alloc((size_t)g->n);
  for (int i = 0; i < g->n; i++) /* dim 0 of the inputs and of what inherits it: the batch */
    if (g->nodes[i].op == OP_INPUT && g->nodes[i].shape.rank > 0) bmask[i] = 1;
  Seg s = seg_new(g, cm, n, cost_group_link(cm, 1, n), bmask, saved_outputs(g), ad_grad_flows(g), NULL, NULL, NULL,
                  NULL);
  VEC(int) nodes = {0};
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].role == ROLE_FWD) VEC_PUSH(nodes, i);
  Seg *sp = cp_alloc(sizeof *sp);
  *sp = s;
  seg_build(sp, nodes.a, nodes.n, 0, 0, 0, NULL);
  return seg_problem(sp, 1, 0, RC_NONE, 0);
}

/* ---- 3. the outer search --------------------------------------------------------------------- */

typedef struct Layers {
  int L;
  int *lo, *hi;         /* per layer: its nodes [lo, hi) */
  int *cls;             /* per layer: its class */
  int ncls;
  int *rep;             /* per class: the layer that stands for it */
  bool *periodic;       /* per class: its representative's input comes from an identical layer */
  bool ok;              /* layers are contiguous (else everything is one segment) */
} Layers;

static bool layers_same(const Graph *g, const Layers *ly, int a, int b) {
  int na = ly->hi[a] - ly->lo[a];
  if (na != ly->hi[b] - ly->lo[b]) return false;
  for (int j = 0; j < na; j++) {
    const Node *x = &g->nodes[ly->lo[a] + j], *y = &g->nodes[ly->lo[b] + j];
    if (x->op != y->op || x->nin != y->nin || x->dtype != y->dtype || !shape_eq(&x->shape, &y->shape) ||
        x->ndims != y->ndims || memcmp(x->ia, y->ia, sizeof x->ia) != 0 || memcmp(x->fa, y->fa, sizeof x->fa) != 0)
      return false;
    for (int k = 0; k < x->nin; k++)
      if (x->in[k] - ly->lo[a] != y->in[k] - ly->lo[b]) return false;
  }
  return true;
}

static Layers find_layers(const Graph *g) {
  Layers ly = {.L = g->layer_names.n, .ok = true};
  int L = ly.L;
  ly.lo = cp_alloc(sizeof(int) * (size_t)(L + 1));
  ly.hi = cp_alloc(sizeof(int) * (size_t)(L + 1));
  ly.cls = cp_alloc(sizeof(int) * (size_t)(L + 1));
  ly.rep = cp_alloc(sizeof(int) * (size_t)(L + 1));
  ly.periodic = cp_alloc((size_t)(L + 1));
  int *count = cp_alloc(sizeof(int) * (size_t)(L + 1));
  for (int l = 0; l < L; l++) ly.lo[l] = g->n, ly.hi[l] = -1;
  for (int i = 0; i < g->n; i++) {
    int l = g->nodes[i].layer;
    if (l < 0 || g->nodes[i].role != ROLE_FWD) continue;
    if (i < ly.lo[l]) ly.lo[l] = i;
    ly.hi[l] = i + 1;
    count[l]++;
  }
  for (int l = 0; l < L; l++)
    if (count[l] == 0 || count[l] != ly.hi[l] - ly.lo[l] || (l > 0 && ly.lo[l] < ly.hi[l - 1])) ly.ok = false;
  if (!ly.ok) return ly;
  for (int l = 0; l < L; l++) {
    int c = 0;
    while (c < ly.ncls && !layers_same(g, &ly, ly.rep[c], l)) c++;
    if (c == ly.ncls) ly.rep[ly.ncls++] = l;
    ly.cls[l] = c;
    /* A representative whose previous layer is of its class gives a periodic boundary. */
    if (l > 0 && ly.cls[l - 1] == c && !ly.periodic[c]) ly.rep[c] = l, ly.periodic[c] = true;
  }
  return ly;
}

/* Everything solved for one (tp, sp, micro-batch size). */
typedef struct Solved {
  int64_t tp, sp, b;
  const Graph *g;
  SegCost *layer;       /* per class */
  int *cls;             /* per layer: its class (the layers' classes; under tp each layer its own) */
  SegCost pre, post;    /* nodes before the first layer / after the last */
  double pre_par, post_par, shared_par; /* param elements: pre only, post only, both (tied) */
  ParDims shared_pd;    /* the tied params, by dim 0 (pre's and post's: in pre.pd, post.pd) */
  double boundary;      /* bytes of one layer's output per device (pipeline sends, full recompute) */
  bool ok;
  bool refused;         /* not ok because the build refuses this tp (strat_tp_place) */
  const int *pins;      /* the ILP's variant: the params' tp placements it chose (ilp_pins); NULL: the rule's */
  int64_t over;         /* not ok because a tensor passes 2^31 - 1 elements per rank: the fewest
                           elements the worst node can hold (Seg.over) */
  int over_node;
  Chosen *chosen;
} Solved;

typedef struct Search {
  Sema *sema;
  const TrainConf *t;
  CostModel cm;
  int64_t N, B;
  double memory;
  VEC(Solved *) solved;
  VEC(const Graph *) graphs; /* by micro-batch size b (index b; NULL when not built) */
  int64_t maxb;
  int g1n;              /* nodes of the graph at B = 1 */
  uint8_t *bmask;
  int64_t big_per_b, big_fixed; /* the largest tensor's elements: per sample (batch dims), without */
  int big_per_b_node, big_fixed_node;
  Layers ly;
  int64_t ilp_solves;
  int ilp_vars;
  double flops_per_sample, tokens_per_sample;
  VEC(SrchPlan) plans;
  const int **pins_at;  /* per tp: the ILP's param placements (ilp_pins), NULL where they are the rule's */
  bool *pins_done;
  double min_mem;       /* the smallest per-device memory of the configurations that did not fit */
  SrchPlan min_plan;
  bool report;
} Search;

static const Graph *graph_at(Search *S, int64_t b) {
  if (b <= S->maxb && S->graphs.a[b]) return S->graphs.a[b];
  Graph *g = sema_build_model(S->sema, S->t->model, S->t->model_call, b);
  if (b <= S->maxb) S->graphs.a[b] = g;
  return g;
}

static bool solve(Search *S, Seg *s, IlpProblem *p, int *choice) {
  double obj;
  bool trivial = true;
  for (int v = 0; v < p->nvars && trivial; v++) trivial = p->ncand[v] == 1;
  if (trivial) { /* one choice each (the build's placements under tp): priced, not an ILP */
    memset(choice, 0, sizeof(int) * (size_t)p->nvars);
    return p->mem_limit <= 0 || ilp_mem(p, choice) <= p->mem_limit;
  }
  (void)s;
  S->ilp_solves++;
  if (p->nvars > S->ilp_vars) S->ilp_vars = p->nvars;
  return srch_ilp_solve(p, choice, &obj);
}

/* The ILP (Alpa's formulation, on the tp axis): every forward node of g chooses among its sharding
 * rule's strategies (params: R or S(d) for a dim n divides), each priced by the cost model, each edge
 * by the collective between the producer's and the consumer's placements, forward and backward;
 * CBC minimizes the sum. One ILP per layer class (every layer of a class takes its representative's
 * choices), then one for the rest. What the build takes from the solution is each param's placement
 * (the rule then places every other node given those: solved_at prices that, and the outer loop ranks
 * it beside Megatron's rule). Per node of g, PIN_NONE for the non-params; NULL when the ILP places
 * every param as the rule does (or finds no solution). Solved once per tp, on the graph of the first
 * micro-batch size priced (the placements the build takes do not depend on it). */
static const int *ilp_pins(Search *S, const Graph *g, int64_t n) {
  if (S->pins_done[n]) return S->pins_at[n];
  S->pins_done[n] = true;
  if (S->t->strategy.tp_pins) return S->pins_at[n] = strat_pins_of(g, &S->t->strategy, S->t->strategy.span);
  const bool *saved = saved_outputs(g), *flows = ad_grad_flows(g);
  CostLink link = cost_group_link(&S->cm, 1, n);
  Chosen *chosen = cp_alloc(sizeof(Chosen) * (size_t)g->n);
  const Layers *ly = &S->ly;
  bool *in_layer = cp_alloc((size_t)g->n);
  for (int c = 0; c <= ly->ncls; c++) {
    VEC(int) nodes = {0};
    int plo = 0, phi = 0, off = 0, lo = 0;
    if (c < ly->ncls) {
      int l = ly->rep[c];
      lo = ly->lo[l];
      for (int i = lo; i < ly->hi[l]; i++) VEC_PUSH(nodes, i);
      if (ly->periodic[c]) plo = ly->lo[l - 1], phi = ly->hi[l - 1], off = lo - plo;
    } else
      for (int i = 0; i < g->n; i++)
        if (g->nodes[i].role == ROLE_FWD && !in_layer[i]) VEC_PUSH(nodes, i);
    Seg *s = cp_alloc(sizeof *s);
    *s = seg_new(g, &S->cm, n, link, S->bmask, saved, flows, NULL, NULL, NULL, NULL);
    seg_build(s, nodes.a, nodes.n, plo, phi, off, c < ly->ncls ? NULL : chosen);
    if (s->over > 0) return NULL;
    IlpProblem *p = seg_problem(s, 1, 0, RC_NONE, 0);
    int *choice = cp_alloc(sizeof(int) * (size_t)(p->nvars + 1));
    if (!solve(S, s, p, choice)) return NULL;
    if (c == ly->ncls) {
      seg_cost(s, choice, chosen, 0);
      break;
    }
    for (int m = 0; m < ly->L; m++) {
      if (ly->cls[m] != c) continue;
      seg_cost(s, choice, chosen, ly->lo[m] - lo);
      for (int i = ly->lo[m]; i < ly->hi[m]; i++) in_layer[i] = true;
    }
  }
  Pl *rule = cp_alloc(sizeof(Pl) * (size_t)g->n);
  Pl **cons = cp_alloc(sizeof(Pl *) * (size_t)g->n);
  bool ruled = strat_tp_place(g, n, false, NULL, rule, cons, NULL);
  int *pin = cp_alloc(sizeof(int) * (size_t)g->n);
  bool differs = false;
  for (int i = 0; i < g->n; i++) {
    pin[i] = PIN_NONE;
    if (g->nodes[i].op != OP_PARAM || !chosen[i].set) continue;
    Pl o = chosen[i].out;
    pin[i] = o.kind == PL_S ? o.dim : -1;
    differs |= !ruled || !pl_eq(o.kind == PL_S ? o : pl_r(), rule[i]);
  }
  if (differs) S->pins_at[n] = pin;
  return S->pins_at[n];
}

/* Prices the layer classes and the rest for tp = n (sequence parallel when sp > 1) at micro-batch
 * b, every node placed as the build places it (strat_tp_place): by Megatron's rule, or (ilp) with
 * the params where the ILP puts them (ilp_pins; not ok when that is the rule's placement). */
static Solved *solved_at(Search *S, int64_t n, int64_t sp, int64_t b, bool ilp) {
  for (int i = 0; i < S->solved.n; i++)
    if (S->solved.a[i]->tp == n && S->solved.a[i]->sp == sp && S->solved.a[i]->b == b &&
        (S->solved.a[i]->pins != NULL) == ilp)
      return S->solved.a[i];
  Solved *r = cp_alloc(sizeof *r);
  r->tp = n, r->sp = sp, r->b = b;
  if (ilp && (n == 1 || (S->pins_done[n] && !S->pins_at[n]))) return r; /* the rule's placement */
  if (!ilp) VEC_PUSH(S->solved, r);
  const Graph *g = graph_at(S, b);
  if (!g || g->n != S->g1n) return r; /* the structure the layers were found on */
  if (n > 1) g = vocab_pad_priced(g, n); /* the tables the build pads for this tp (train.h) */
  r->g = g;
  if (ilp && (n == 1 || !(r->pins = ilp_pins(S, g, n)))) return r;
  if (ilp) VEC_PUSH(S->solved, r);
  Pl *pin_out = NULL, **pin_cons = NULL, **pin_from = NULL;
  uint8_t *bwd_done = NULL;
  Layers lyp = S->ly;
  if (n > 1) {
    pin_out = cp_alloc(sizeof(Pl) * (size_t)g->n);
    pin_cons = cp_alloc(sizeof(Pl *) * (size_t)g->n);
    pin_from = cp_alloc(sizeof(Pl *) * (size_t)g->n);
    bwd_done = cp_alloc((size_t)g->n);
    int *blocks = cp_alloc(sizeof(int) * (size_t)g->n), src;
    if (strat_tp_place(g, n, sp > 1, r->pins, pin_out, pin_cons, pin_from)) lower_find_blocks(g, pin_out, pin_cons, blocks);
    else blocks = NULL;
    if (!blocks || lower_blocked_escape(g, pin_out, blocks, &src) >= 0 ||
        lower_contiguous_slice(g, pin_out, pin_cons) >= 0) { /* what the build refuses */
      r->refused = true;
      return r;
    }
    /* The build places the first layer apart from the rest where its input arrives otherwise (whole
     * from the embedding, split along the sequence from a layer under sp): every layer is priced
     * on its own placements. */
    lyp.ncls = lyp.L;
    lyp.rep = cp_alloc(sizeof(int) * (size_t)(lyp.L + 1));
    for (int l = 0; l < lyp.L; l++) lyp.rep[l] = l;
    lyp.cls = cp_alloc(sizeof(int) * (size_t)(lyp.L + 1));
    lyp.periodic = cp_alloc((size_t)(lyp.L + 1));
    for (int l = 0; l < lyp.L; l++) lyp.cls[l] = l;
  }
  r->cls = lyp.cls;
  const bool *saved = saved_outputs(g), *flows = ad_grad_flows(g);
  CostLink link = cost_group_link(&S->cm, 1, n);
  Chosen *chosen = cp_alloc(sizeof(Chosen) * (size_t)g->n);
  const Layers *ly = &lyp;
  r->layer = cp_alloc(sizeof(SegCost) * (size_t)(ly->ncls + 1));
  bool *in_layer = cp_alloc((size_t)g->n);
  for (int c = 0; c < ly->ncls; c++) {
    int l = ly->rep[c], lo = ly->lo[l], hi = ly->hi[l];
    VEC(int) nodes = {0};
    for (int i = lo; i < hi; i++) VEC_PUSH(nodes, i);
    Seg *s = cp_alloc(sizeof *s);
    *s = seg_new(g, &S->cm, n, link, S->bmask, saved, flows, pin_out, pin_cons, pin_from, bwd_done);
    int plo = 0, phi = 0, off = 0;
    if (ly->periodic[c]) plo = ly->lo[l - 1], phi = ly->hi[l - 1], off = lo - plo;
    seg_build(s, nodes.a, nodes.n, plo, phi, off, NULL);
    if (s->over > 0) {
      r->over = s->over, r->over_node = s->over_node;
      return r;
    }
    IlpProblem *p = seg_problem(s, 1, 0, RC_NONE, 0);
    int *choice = cp_alloc(sizeof(int) * (size_t)(p->nvars + 1));
    if (!solve(S, s, p, choice)) return r;
    /* Every layer of the class takes the representative's choices. */
    for (int m = 0; m < ly->L; m++) {
      if (ly->cls[m] != c) continue;
      SegCost sc = seg_cost(s, choice, chosen, ly->lo[m] - lo);
      if (m == l) r->layer[c] = sc;
      for (int i = ly->lo[m]; i < ly->hi[m]; i++) in_layer[i] = true;
    }
    int last = hi - 1;
    r->boundary = cost_act_bytes(&S->cm, g, last) / (chosen[last].out.kind == PL_S ? (double)n : 1);
  }
  /* The rest: nodes outside every layer, split into pre and post by position. */
  int first = ly->L > 0 ? ly->lo[0] : g->n;
  VEC(int) rest = {0};
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].role == ROLE_FWD && !in_layer[i]) VEC_PUSH(rest, i);
  Seg *s = cp_alloc(sizeof *s);
  *s = seg_new(g, &S->cm, n, link, S->bmask, saved, flows, pin_out, pin_cons, pin_from, bwd_done);
  seg_build(s, rest.a, rest.n, 0, 0, 0, chosen);
  if (s->over > 0) {
    r->over = s->over, r->over_node = s->over_node;
    return r;
  }
  IlpProblem *p = seg_problem(s, 1, 0, RC_NONE, 0);
  int *choice = cp_alloc(sizeof(int) * (size_t)(p->nvars + 1));
  if (!solve(S, s, p, choice)) return r;
  for (int v = 0; v < s->vars.n; v++) {
    const Var *V = &s->vars.a[v];
    const Cand *c = &V->c[choice[v]];
    int i = V->node;
    const Node *nd = &g->nodes[i];
    if (nd->op == OP_PARAM) { /* a param used before and after the layers is held by both ends */
      bool pre = false, post = false;
      for (int w = i + 1; w < g->n; w++)
        for (int k = 0; k < g->nodes[w].nin; k++)
          if (g->nodes[w].in[k] == i) *(w < first ? &pre : &post) = true;
      ParDim pd = {nd->shape.rank > 0 ? nd->shape.d[0] : -1, c->par};
      if (pre && post) {
        r->shared_par += c->par;
        VEC_PUSH(r->shared_pd, pd);
      } else if (pre || i < first) {
        r->pre_par += c->par;
        VEC_PUSH(r->pre.pd, pd);
      } else {
        r->post_par += c->par;
        VEC_PUSH(r->post.pd, pd);
      }
      continue;
    }
    SegCost *sc = i < first ? &r->pre : &r->post;
    sc->tf += c->tf, sc->tb += c->tb, sc->bytes += c->bytes, sc->act += c->act, sc->cheap_t += c->cheap_t;
    if (c->cheap_t > 0) sc->cheap_act += c->act;
    if (c->act > sc->max_act) sc->max_act = c->act;
  }
  for (int e = 0; e < s->edges.n; e++) {
    const Edge *E = &s->edges.a[e];
    int j = choice[E->u] * s->vars.a[E->v].nc + choice[E->v];
    SegCost *sc = s->vars.a[E->v].node < first ? &r->pre : &r->post;
    sc->tf += E->f[j], sc->tb += E->b[j], sc->bytes += E->bytes[j];
  }
  if (ly->L == 0) r->boundary = 0;
  r->chosen = chosen;
  r->ok = true;
  return r;
}

/* One configuration of the outer loop. */
typedef struct Config {
  int64_t dp, tp, pp, sp, b, m, zero, v;
  Recompute rc;
  PipeSched sched;
} Config;

/* Seconds and bytes of one layer of class c per micro-batch under recompute rc. */
static double layer_time(const SegCost *c, Recompute rc) {
  double t = c->tf + c->tb;
  if (rc == RC_FULL) t += c->tf;
  else if (rc == RC_SELECTIVE) t += c->cheap_t;
  return t;
}

static double layer_act(const SegCost *c, Recompute rc, double boundary) {
  if (rc == RC_FULL) return boundary;
  if (rc == RC_SELECTIVE) return c->act - c->cheap_act;
  return c->act;
}

typedef struct StageMem {
  double params, grads, optim, acts, work, total;
} StageMem;

static StageMem stage_mem(const Search *S, const Solved *so, const Config *k, int s, int l0, int l1) {
  const CostModel *cm = &S->cm;
  double par = 0, act = 0, work = 0;
  for (int l = l0; l < l1; l++) {
    const SegCost *c = &so->layer[so->cls[l]];
    par += c->par;
    act += layer_act(c, k->rc, so->boundary);
    if (k->rc == RC_FULL && c->act > work) work = c->act; /* one layer's activations while it reruns */
  }
  bool first = s == 0, last = s == k->pp - 1;
  if (first) par += so->pre_par, act += layer_act(&so->pre, k->rc == RC_FULL ? RC_NONE : k->rc, 0);
  if (last) par += so->post_par, act += layer_act(&so->post, k->rc == RC_FULL ? RC_NONE : k->rc, 0);
  if (first || last) par += so->shared_par;
  double dp = (double)k->dp;
  StageMem m;
  m.params = par * cm->w_bytes / (k->zero >= 3 ? dp : 1);
  m.grads = par * cm->g_bytes / (k->zero >= 2 ? dp : 1);
  m.optim = par * cm->o_bytes / (k->zero >= 1 ? dp : 1);
  m.acts = act * cost_inflight(k->sched, k->pp, s, k->m, k->v);
  /* the gradient of the largest activation (the logits, usually) is alive next to it */
  double transient = so->pre.max_act > so->post.max_act ? so->pre.max_act : so->post.max_act;
  m.work = cm->workspace + work + transient;
  if (k->zero >= 3) m.work += par / (double)(l1 - l0 > 0 ? l1 - l0 : 1) * cm->act_size * 2; /* gathered layer */
  m.total = m.params + m.grads + m.optim + m.acts + m.work;
  return m;
}

/* The param elements per device stage s holds (layers [l0, l1), the pre's on the first stage, the
 * post's on the last, the tied ones on both, or with `owned` on the first only: their owner, which
 * holds their gradient and runs their update) and, in *unsh, those of them ZeRO leaves whole on
 * every dp replica (par_unsharded). */
static double stage_par(const Search *S, const Solved *so, const Config *k, int s, int l0, int l1, bool owned,
                        double *unsh) {
  double par = 0, u = 0;
  for (int l = l0; l < l1; l++) {
    const SegCost *c = &so->layer[so->cls[l]];
    par += c->par, u += par_unsharded(&c->pd, k->dp);
  }
  bool first = s == 0, last = s == k->pp - 1;
  if (first) par += so->pre_par, u += par_unsharded(&so->pre.pd, k->dp);
  if (last) par += so->post_par, u += par_unsharded(&so->post.pd, k->dp);
  if (first || (last && !owned)) par += so->shared_par, u += par_unsharded(&so->shared_pd, k->dp);
  *unsh = u;
  return par;
}

/* Whether the last pipeline stage's gradient contribution to a tied param crosses once a step
 * (pipeline.h pp_deferred_sums), not with each micro-batch. */
static bool tied_once(const Config *k) { return pp_tied_once(k->zero); }

/* Seconds per micro-batch of stage s holding layers [l0, l1), and its bytes sent per micro-batch. */
static double stage_time(const Search *S, const Solved *so, const Config *k, int s, int l0, int l1, double *fwd,
                         double *bytes) {
  double f = 0, t = 0, by = 0;
  for (int l = l0; l < l1; l++) {
    const SegCost *c = &so->layer[so->cls[l]];
    f += c->tf, t += layer_time(c, k->rc), by += c->bytes;
  }
  if (s == 0) f += so->pre.tf, t += layer_time(&so->pre, RC_NONE), by += so->pre.bytes;
  if (s == k->pp - 1) f += so->post.tf, t += layer_time(&so->post, RC_NONE), by += so->post.bytes;
  if (k->pp > 1) { /* activations forward, their gradients back; interleaving sends v times as often */
    CostLink l = cost_group_link(&S->cm, k->dp * k->tp, 2);
    double p = cost_p2p(so->boundary, l) * (double)k->v;
    /* bytes this device sends: each of its v chunks its output forward and its input's gradient
     * back, except the first stage's gradient and the last stage's output. One value crosses each
     * way (pipeline.c sums the residual stream's gradient contributions on the sender's stage). */
    double sends = 2 * (double)k->v - (double)(s == 0) - (double)(s == k->pp - 1);
    f += p, t += 2 * p, by += sends * so->boundary;
    /* a param both ends of the pipeline read (a tied embedding): the last stage sends its gradient
     * contribution to the first (the owner), in f32: once a step (tied_once; pipeline.h), but
     * under ZeRO 2 and 3, which reduce-scatter the sum after each micro-batch, with each one */
    if (s == k->pp - 1 && so->shared_par > 0 && !tied_once(k)) {
      double tied = so->shared_par * S->cm.g_bytes;
      t += cost_p2p(tied, l), by += tied;
    }
  }
  if (k->zero >= 3 && k->dp > 1) { /* ZeRO-3: the sharded params gathered, at the compute dtype,
                                      before the forward and again for the backward (lower.c regather) */
    CostLink l = cost_group_link(&S->cm, k->tp, k->dp);
    double u, par = stage_par(S, so, k, s, l0, l1, false, &u), gb = (par - u) * S->cm.act_size;
    double g = cost_collective(&S->cm, COLL_ALL_GATHER, gb, k->dp, l);
    f += g, t += 2 * g, by += 2 * pl_coll_bytes(COLL_ALL_GATHER, gb, k->dp);
  }
  if (fwd) *fwd = f;
  if (bytes) *bytes = by;
  return t;
}

/* Gradient reduction over dp per step for a stage holding `par` param elements per device, `unsh`
 * of them not sharded by ZeRO (par_unsharded): seconds into *t, bytes one device sends into *by.
 * All param gradients and updated params travel in f32 (the program's accumulators and master
 * weights, whatever the precision). ZeRO 0 all-reduces the whole gradients once per step; 1
 * reduce-scatters them once per step (Megatron's distributed optimizer; the lowering does it where
 * the update first reads them); 2 and 3 hold only their part, so they reduce-scatter after every
 * micro-batch; 1 and 2 then gather the updated params (3 gathers them per use: stage_time). The
 * params ZeRO does not shard are all-reduced once per step. */
static void dp_sync(const Search *S, const Config *k, double par, double unsh, double *t, double *by) {
  *t = *by = 0;
  if (k->dp <= 1) return;
  const CostModel *cm = &S->cm;
  CostLink l = cost_group_link(cm, k->tp, k->dp);
  double f32 = cm->g_bytes; /* f32 gradient accumulators and master weights */
  double whole = (k->zero == 0 ? par : unsh) * f32, part = k->zero == 0 ? 0 : (par - unsh) * f32;
  if (whole > 0)
    *t += cost_collective(cm, COLL_ALL_REDUCE, whole, k->dp, l), *by += pl_coll_bytes(COLL_ALL_REDUCE, whole, k->dp);
  if (part > 0) {
    double times = k->zero >= 2 ? (double)k->m : 1;
    *t += times * cost_collective(cm, COLL_REDUCE_SCATTER, part, k->dp, l);
    *by += times * pl_coll_bytes(COLL_REDUCE_SCATTER, part, k->dp);
    if (k->zero <= 2)
      *t += cost_collective(cm, COLL_ALL_GATHER, part, k->dp, l), *by += pl_coll_bytes(COLL_ALL_GATHER, part, k->dp);
  }
}

/* The stages' layers, as the build cuts them (strat_stage_layers: what is priced is what runs),
 * into cut[] (pp + 1 boundaries; an interleaved device's chunks priced as one range); returns the
 * slowest stage's seconds, or INFINITY when a stage is over the memory limit, with *need the
 * worst stage's memory. */
static double pipeline_cut(const Search *S, const Solved *so, const Config *k, int *cut, double *need) {
  int L = S->ly.L, pp = (int)k->pp;
  double tmax = 0;
  *need = 0;
  cut[0] = 0;
  for (int s = 0; s < pp; s++) {
    cut[s + 1] = cut[s] + strat_stage_layers(L, pp, k->v > 1 ? k->v : 1, s);
    StageMem m = stage_mem(S, so, k, s, cut[s], cut[s + 1]);
    double t = stage_time(S, so, k, s, cut[s], cut[s + 1], NULL, NULL);
    if (m.total > *need) *need = m.total;
    if (t > tmax) tmax = t;
  }
  return *need <= S->memory ? tmax : INFINITY;
}

/* Evaluates one configuration; pushes it as a plan when it fits. */
static void evaluate(Search *S, const Solved *so, const Config *k) {
  int pp = (int)k->pp;
  int *cut = cp_alloc(sizeof(int) * (size_t)(pp + 1));
  double need;
  double tmax = pipeline_cut(S, so, k, cut, &need);
  SrchPlan p = {.dp = k->dp, .tp = k->tp, .pp = k->pp, .sp = k->sp, .zero = k->zero, .micro = k->b,
                .microbatches = k->m, .v = k->v, .recompute = k->rc, .sched = k->sched, .pins = so->pins,
                .pins_g = so->pins ? so->g : NULL};
  if (tmax == INFINITY) {
    if (need < S->min_mem) S->min_mem = need, S->min_plan = p;
    return;
  }
  p.stage_layers = cp_alloc(sizeof(int) * (size_t)pp);
  p.stage_fwd = cp_alloc(sizeof(double) * (size_t)pp);
  p.stage_bwd = cp_alloc(sizeof(double) * (size_t)pp);
  double max_par = 0, comm = 0, sync_t = 0;
  for (int s = 0; s < pp; s++) {
    double f, by;
    double t = stage_time(S, so, k, s, cut[s], cut[s + 1], &f, &by);
    p.stage_layers[s] = cut[s + 1] - cut[s];
    p.stage_fwd[s] = f, p.stage_bwd[s] = t - f;
    StageMem m = stage_mem(S, so, k, s, cut[s], cut[s + 1]);
    if (m.total > p.mem_total)
      p.mem_params = m.params, p.mem_grads = m.grads, p.mem_optim = m.optim, p.mem_acts = m.acts,
      p.mem_workspace = m.work, p.mem_total = m.total;
    double unsh, par = stage_par(S, so, k, s, cut[s], cut[s + 1], true, &unsh);
    if (par > max_par) max_par = par;
    double st, sb;
    dp_sync(S, k, par, unsh, &st, &sb);
    if (st > sync_t) sync_t = st;
    /* a tied param's owner (the first stage) sends its updated value to the last, and the last
     * its accumulated gradient contribution to the first (tied_once), once per step (f32) */
    double tied = pp > 1 && (s == 0 || (s == pp - 1 && tied_once(k))) ? so->shared_par * S->cm.g_bytes : 0;
    if (by * (double)k->m + tied + sb > comm) comm = by * (double)k->m + tied + sb;
  }
  double tied_t = pp > 1 ? cost_p2p(so->shared_par * S->cm.g_bytes, cost_group_link(&S->cm, k->dp * k->tp, 2)) *
                               (tied_once(k) ? 2 : 1) : 0;
  p.dp_sync = sync_t;
  const CostModel *cm = &S->cm;
  double upd_bytes = max_par * (cm->w_bytes + cm->g_bytes + 2 * cm->o_bytes) * 2 / (k->zero >= 1 ? (double)k->dp : 1);
  p.update = cm->dev.hbm > 0 ? upd_bytes / (cm->dev.hbm * cm->eff[CC_MEMORY]) : 0;
  double v = (double)k->v;
  /* On GPUs the gradient reduction runs in buckets behind the last backward (as DDP and Megatron
   * do); the CPU runtime reduces after the backward, so nothing hides there. */
  double hidden = cm->dev.kind == DEV_CUDA ? p.stage_bwd[0] : 0;
  double exposed = p.dp_sync > hidden ? p.dp_sync - hidden : 0;
  p.dp_hidden = p.dp_sync - exposed;
  p.step_time = ((double)k->m + (double)(pp - 1) / v) * tmax + exposed + p.update + tied_t;
  p.bubble = cost_bubble(k->sched, k->pp, k->m, k->v);
  p.p2p = pp > 1 ? cost_p2p(so->boundary, cost_group_link(&S->cm, k->dp * k->tp, 2)) : 0;
  p.comm_bytes = comm;
  double flops = 3 * S->flops_per_sample * (double)S->B;
  p.tflops = flops / p.step_time / (double)S->N;
  p.mfu = cm->peak > 0 ? p.tflops / cm->peak : 0;
  p.tokens_per_s = S->tokens_per_sample * (double)S->B / p.step_time;
  VEC_PUSH(S->plans, p);
}

static bool pinned_ok(int64_t pin, int64_t v) { return pin <= 0 || pin == v; }

/* How many features a plan uses beyond plain data parallelism (ties go to the simpler plan). */
static int plan_features(const SrchPlan *p) {
  return (p->tp > 1) + (p->pp > 1) + (p->sp > 1) + (p->zero > 0) + (int)p->zero + (p->recompute != RC_NONE) +
         (p->microbatches > 1) + (p->pins != NULL);
}

static int time_cmp(const void *a, const void *b) {
  const SrchPlan *x = a, *y = b;
  return x->step_time < y->step_time ? -1 : x->step_time > y->step_time;
}

/* Within a band (plan_sort), simpler first, then faster, then smaller. */
static int plan_cmp(const void *a, const void *b) {
  const SrchPlan *x = a, *y = b;
  if (x->band != y->band) return x->band < y->band ? -1 : 1;
  if (plan_features(x) != plan_features(y)) return plan_features(x) < plan_features(y) ? -1 : 1;
  if (x->step_time != y->step_time) return x->step_time < y->step_time ? -1 : 1;
  if (x->mem_total != y->mem_total) return x->mem_total < y->mem_total ? -1 : 1;
  return 0;
}

/* Fastest first; plans within 0.5% of a band's fastest step time (below the model's precision) go
 * simpler first, then faster, then smaller. (Bands, not a pairwise 0.5% test, so the order is one
 * order whatever else is ranked: a pairwise tolerance is not transitive.) */
static void plan_sort(SrchPlan *p, int n) {
  qsort(p, (size_t)n, sizeof(SrchPlan), time_cmp);
  for (int i = 0, band = 0; i < n; band++) {
    double lo = p[i].step_time;
    for (; i < n && p[i].step_time <= lo * 1.005; i++) p[i].band = band;
  }
  qsort(p, (size_t)n, sizeof(SrchPlan), plan_cmp);
}

/* Micro-batch sizes tried: the divisors of the per-replica batch up to 64, powers of two (and
 * the whole per-replica batch when it is small), so graphs are elaborated for few sizes. */
static bool try_micro(int64_t b, int64_t per) {
  if (per % b != 0) return false;
  if (b == per && b <= 64) return true;
  return (b & (b - 1)) == 0 && b <= 64;
}

/* The span of the train block's `memory` setting, or none. */
static bool memory_span(const Program *prog, const TrainConf *t, Span *at) {
  for (int i = 0; prog && i < prog->nitems; i++) {
    const Item *it = prog->items[i];
    if (it->kind != IT_TRAIN || it->span.lo != t->span.lo || it->span.file != t->span.file) continue;
    for (int j = 0; j < it->nsettings; j++)
      if (strcmp(it->settings[j]->key, "memory") == 0) {
        *at = it->settings[j]->span;
        return true;
      }
  }
  return false;
}

/* The span of the train block's setting `key` (its value when --set gave it), or none. */
static bool setting_span(const Program *prog, const TrainConf *t, const char *key, Span *at) {
  for (int i = 0; prog && i < prog->nitems; i++) {
    const Item *it = prog->items[i];
    if (it->kind != IT_TRAIN || it->span.lo != t->span.lo || it->span.file != t->span.file) continue;
    for (int j = 0; j < it->nsettings; j++) {
      const Setting *st = it->settings[j];
      if (st->is_block || strcmp(st->key, key) != 0) continue;
      *at = st->value && st->value->span.file != st->span.file ? st->value->span : st->span;
      return true;
    }
  }
  return false;
}


/* ---- why no configuration is left ------------------------------------------------------------ */

/* What refuses a factorization dp·tp·pp of the devices before any micro-batch is tried. */
enum { WHY_HEADS = 1, WHY_LAYERS = 2, WHY_BATCH = 4 };

typedef struct DegStats {
  int64_t n;            /* factorizations */
  int64_t heads, layers;/* of which tp does not divide the heads; pp exceeds the layers */
  int64_t hl;           /* of which neither (these are refused, if at all, by the batch) */
  int64_t min_dp, min_tp, min_pp; /* among hl: the smallest dp */
  int64_t dps[4];       /* among hl: the smallest distinct dps */
  int ndps;
} DegStats;

typedef struct Why {
  DegStats all, pin;    /* every factorization; those the pinned dp, tp, pp and sp allow */
  int64_t heads;        /* the attention heads a refused tp does not divide */
  bool free;            /* a factorization passes heads, layers and batch (pins aside): */
  int64_t free_dp, free_tp, free_pp;
  /* factorizations that passed all that and the pins, then refused at every micro-batch size:
   * the pinned micro does not divide batch / dp; a tensor over 2^31 - 1 elements on a rank; the
   * pinned pipeline schedule does not fit; the model's graph or its ILP failed */
  int64_t micro, size, sched, other;
  int64_t micro_dp;     /* the first micro refusal's dp */
  /* the size refusal closest to fitting: elements per rank, the node (of size_g, its batch dims
   * times size_scale), the configuration */
  int64_t size_elems, size_scale, size_dp, size_tp, size_pp, size_b;
  const Graph *size_g;
  int size_node;
} Why;

static void why_degrees(DegStats *d, unsigned why, int64_t dp, int64_t tp, int64_t pp) {
  d->n++;
  if (why & WHY_HEADS) d->heads++;
  if (why & WHY_LAYERS) d->layers++;
  if (why & (WHY_HEADS | WHY_LAYERS)) return;
  if (d->hl++ == 0 || dp < d->min_dp) d->min_dp = dp, d->min_tp = tp, d->min_pp = pp;
  int k = 0;
  while (k < d->ndps && d->dps[k] < dp) k++;
  if (k < d->ndps && d->dps[k] == dp) return;
  if (k == (int)(sizeof d->dps / sizeof d->dps[0])) return;
  int last = d->ndps < (int)(sizeof d->dps / sizeof d->dps[0]) ? d->ndps++ : d->ndps - 1;
  for (int j = last; j > k; j--) d->dps[j] = d->dps[j - 1];
  d->dps[k] = dp;
}

static void why_size(Why *W, int64_t elems, const Graph *g, int node, int64_t scale, int64_t dp, int64_t tp, int64_t pp,
                     int64_t b) {
  if (elems >= W->size_elems) return;
  W->size_elems = elems, W->size_g = g, W->size_node = node, W->size_scale = scale;
  W->size_dp = dp, W->size_tp = tp, W->size_pp = pp, W->size_b = b;
}

/* Why the factorizations of d are refused by heads, layers or batch (every one of them is), after
 * `lead` ("no configuration ...: "), at `at`; the mesh setting gets a note. */
static void why_degrees_report(const Search *S, const Why *W, const DegStats *d, Span at, const char *lead,
                               bool pinned) {
  const TrainConf *t = S->t;
  long long N = (long long)S->N, B = (long long)S->B;
  int L = S->ly.L;
  const char *ls = L == 1 ? "" : "s";
  if (d->n == 0) {
    diag_error(at, "%sdp·tp·pp must be the %lld devices", lead, N);
    return;
  }
  if (d->hl == 0) { /* only under pins: all tp misfit the heads or all pp exceed the layers */
    if (d->heads == d->n)
      diag_error(at, "%stp must divide the %lld attention heads", lead, (long long)W->heads);
    else if (d->layers == d->n)
      diag_error(at, "%spp must not exceed the %d layer%s", lead, L, ls);
    else
      diag_error(at, "%stp must divide the %lld attention heads and pp must not exceed the %d layer%s", lead,
                 (long long)W->heads, L, ls);
    return;
  }
  const char *with = pinned ? " with them" : "";
  if (d->min_dp > S->B)
    diag_error(at, "%sdp must divide the batch, and every dp·tp·pp = %lld%s leaves dp ≥ %lld > batch %lld", lead, N,
               with, (long long)d->min_dp, B);
  else {
    char list[160] = "";
    for (int k = 0; k < d->ndps; k++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%lld", k ? ", " : "", (long long)d->dps[k]);
    diag_error(at, "%sdp must divide the batch, and no dp·tp·pp = %lld%s leaves one that divides batch %lld "
               "(dp = %s%s)", lead, N, with, B, list, d->hl > d->ndps ? ", ..." : "");
  }
  Span ms;
  if (!pinned && setting_span(sema_program(S->sema), t, "mesh", &ms)) {
    const char *name = t->mesh && t->mesh->name ? t->mesh->name : "?";
    long long tppp = N / (long long)d->min_dp;
    if (d->heads > 0 && d->layers > 0)
      diag_note(ms, "mesh '%s' has %lld devices; tp must divide the %lld attention heads and pp must not exceed the "
                "%d layer%s: at most tp·pp = %lld (tp %lld, pp %lld) of them serve one replica", name, N,
                (long long)W->heads, L, ls, tppp, (long long)d->min_tp, (long long)d->min_pp);
    else if (d->heads > 0)
      diag_note(ms, "mesh '%s' has %lld devices; tp must divide the %lld attention heads: at most tp·pp = %lld "
                "(tp %lld, pp %lld) of them serve one replica", name, N, (long long)W->heads, tppp,
                (long long)d->min_tp, (long long)d->min_pp);
    else
      diag_note(ms, "mesh '%s' has %lld devices; pp must not exceed the %d layer%s: at most tp·pp = %lld (tp %lld, "
                "pp %lld) of them serve one replica", name, N, L, ls, tppp, (long long)d->min_tp, (long long)d->min_pp);
  }
  if (!pinned)
    diag_hint("a batch that is a multiple of %lld (dp %lld, tp %lld, pp %lld), or fewer devices",
              (long long)d->min_dp, (long long)d->min_dp, (long long)d->min_tp, (long long)d->min_pp);
}

/* The diagnostic when the search considered no configuration: what refused them, with numbers, at
 * the pinned field, the setting, or the train block that is the cause. */
static void why_report(const Search *S, const Why *W) {
  const TrainConf *t = S->t;
  const StrategyConf *st = &t->strategy;
  const Program *prog = sema_program(S->sema);
  long long N = (long long)S->N, B = (long long)S->B;
  int L = S->ly.L;
  if (!W->free) { /* heads, layers and batch refuse every factorization, pins or not */
    Span at = t->span;
    setting_span(prog, t, "batch", &at);
    why_degrees_report(S, W, &W->all, at, cp_fmt("no configuration of the %lld devices fits batch %lld: ", N, B), false);
    return;
  }
  if (W->micro + W->size + W->sched + W->other == 0) { /* the pinned degrees refuse the rest */
    char pins[160] = "";
    const char *first = NULL;
    const char *keys[] = {"dp", "tp", "pp", "sp"};
    int64_t vals[] = {st->dp, st->tp, st->pp, st->sp > 1 ? st->sp : 0};
    for (int k = 0; k < 4; k++)
      if (vals[k] > 0) {
        snprintf(pins + strlen(pins), sizeof pins - strlen(pins), "%s%s = %lld", first ? ", " : "", keys[k],
                 (long long)vals[k]);
        if (!first) first = keys[k];
      }
    Span at = first ? strat_field_span(t, first) : st->span;
    const char *lead = cp_fmt("no configuration satisfies the pinned %s on %lld devices and batch %lld: ", pins, N, B);
    why_degrees_report(S, W, &W->pin, at, lead, true);
    diag_hint("dp·tp·pp must be the device count, dp must divide the batch, tp the attention heads, pp must not "
              "exceed the %d layers; without the pins dp %lld, tp %lld, pp %lld would do", L, (long long)W->free_dp,
              (long long)W->free_tp, (long long)W->free_pp);
    return;
  }
  /* some degrees passed; every micro-batch size of them was refused */
  int64_t most = W->size;
  if (W->micro > most) most = W->micro;
  if (W->sched > most) most = W->sched;
  if (W->other > most) most = W->other;
  int64_t passed = W->micro + W->size + W->sched + W->other;
  if (W->size == most) {
    const Node *nd = &W->size_g->nodes[W->size_node];
    Shape sh = nd->shape;
    for (int d = 0; d < sh.rank && d < 8; d++)
      if (S->bmask[W->size_node] >> d & 1 && W->size_g->n == S->g1n) sh.d[d] *= W->size_scale;
    bool act = S->bmask[W->size_node] != 0; /* an activation: the micro-batch matters */
    Span at = act && st->micro > 0 ? strat_field_span(t, "micro") : t->span;
    if (act && st->micro > 0)
      diag_error(at, "with the pinned micro = %lld, every configuration puts a tensor of more than 2^31 - 1 elements "
                 "on one device, more than the kernels index (32-bit)", (long long)st->micro);
    else
      diag_error(at, "every configuration puts a tensor of more than 2^31 - 1 elements on one device, more than the "
                 "kernels index (32-bit)");
    const char *what = nd->op == OP_PARAM && nd->name ? cp_fmt("'%s'", nd->name) : cp_fmt("this %s", ir_ops[nd->op].name);
    diag_note(nd->span, "at best (dp %lld, tp %lld, pp %lld, micro %lld) %s %s holds %s elements on each device",
              (long long)W->size_dp, (long long)W->size_tp, (long long)W->size_pp, (long long)W->size_b, what,
              shape_str(&sh), cp_commas(W->size_elems));
    if (act && st->micro > 0) diag_hint("a smaller micro, or more tp, splits it further");
    else if (act) diag_hint("it is over the limit at one sample per micro-batch: more tp (or a shorter sequence) splits it further");
    else diag_hint("tp splits it: more devices for tp (tp must divide the device count and the attention heads), or a smaller model");
  } else if (W->micro == most) {
    diag_error(strat_field_span(t, "micro"), "no configuration satisfies the pinned micro = %lld on %lld "
               "devices and batch %lld: micro must divide batch / dp (batch %lld / dp %lld = %lld)",
               (long long)st->micro, N, B, B, (long long)W->micro_dp, B / (long long)W->micro_dp);
  } else if (W->sched == most) {
    diag_error(strat_field_span(t, "pipeline"), "no configuration satisfies the pinned interleaved schedule on "
               "%lld devices: it needs pp > 1, 2·pp dividing the %d layer%s and the micro-batches per step a multiple of pp",
               N, L, L == 1 ? "" : "s");
  } else {
    diag_error(t->span, "no configuration could be priced: the model's graph or its sharding ILP failed at every "
               "micro-batch size");
  }
  if (most < passed)
    diag_note(t->span, "of the %lld dp·tp·pp choices left: %lld put a tensor over 2^31 - 1 elements on a device, %lld "
              "do not fit the pinned micro, %lld the pinned schedule, %lld failed to price", (long long)passed,
              (long long)W->size, (long long)W->micro, (long long)W->sched, (long long)W->other);
}

static const char *rc_name(Recompute r) { return r == RC_FULL ? "full" : r == RC_SELECTIVE ? "selective" : "none"; }

static SrchResult *search(Sema *sema, const TrainConf *t, int topk, bool report) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  Search *S = cp_alloc(sizeof *S);
  S->sema = sema, S->t = t, S->report = report;
  cost_init(&S->cm, t);
  S->N = S->cm.mesh->ndevices;
  S->B = t->batch > 0 ? t->batch : 1;
  S->memory = t->memory > 0 ? t->memory : S->cm.dev.memory;
  if (S->memory <= 0) S->memory = INFINITY;
  S->min_mem = INFINITY;
  S->maxb = 64;
  S->graphs.a = cp_alloc(sizeof(Graph *) * (size_t)(S->maxb + 1));
  S->pins_at = cp_alloc(sizeof(int *) * (size_t)(S->N + 1));
  S->pins_done = cp_alloc((size_t)(S->N + 1));
  /* The structure and the batch dims: the graph at B = 1 and B = 2. */
  const Graph *g1 = graph_at(S, 1), *g2 = g1 ? graph_at(S, 2) : NULL;
  if (!g1 || !g2) return NULL;
  S->g1n = g1->n;
  S->bmask = cp_alloc((size_t)g1->n);
  if (g2->n == g1->n)
    for (int i = 0; i < g1->n; i++)
      for (int d = 0; d < g1->nodes[i].shape.rank && d < 8; d++)
        if (g1->nodes[i].shape.d[d] != g2->nodes[i].shape.d[d]) S->bmask[i] |= (uint8_t)(1u << d);
  S->ly = find_layers(g1);
  if (!S->ly.ok) { /* no usable layer structure: one segment of everything */
    S->ly.L = 0, S->ly.ncls = 0;
  }
  for (int i = 0; i < g1->n; i++) {
    if (g1->nodes[i].role == ROLE_FWD) S->flops_per_sample += ir_node_flops(g1, i);
    int64_t e = shape_numel(&g1->nodes[i].shape), *big = S->bmask[i] ? &S->big_per_b : &S->big_fixed;
    if (e > *big) *big = e, *(S->bmask[i] ? &S->big_per_b_node : &S->big_fixed_node) = i;
  }
  S->tokens_per_sample = ir_seq_len(g1) > 0 ? (double)ir_seq_len(g1) : 1;

  const StrategyConf *st = &t->strategy;
  int L = S->ly.L;
  int64_t considered = 0;
  Why W = {.size_elems = INT64_MAX};
  for (int64_t tp = 1; tp <= S->N; tp++) {
    if (S->N % tp) continue;
    for (int64_t pp = 1; pp * tp <= S->N; pp++) {
      if ((S->N / tp) % pp) continue;
      int64_t dp = S->N / (tp * pp);
      /* the lowering splits the heads over tp (strat_pin refuses a tp that does not divide them) */
      int h = strat_heads_misfit(g1, tp);
      unsigned why = (h >= 0 ? WHY_HEADS : 0) | (pp > 1 && pp > L ? WHY_LAYERS : 0) | (S->B % dp ? WHY_BATCH : 0);
      if (h >= 0) W.heads = g1->nodes[h].ia[0];
      bool pin = pinned_ok(st->dp, dp) && pinned_ok(st->tp, tp) && pinned_ok(st->pp, pp) && !(st->sp > 1 && st->sp != tp);
      why_degrees(&W.all, why, dp, tp, pp);
      if (pin) why_degrees(&W.pin, why, dp, tp, pp);
      if (why) continue;
      if (!W.free) W.free = true, W.free_dp = dp, W.free_tp = tp, W.free_pp = pp;
      if (!pin) continue;
      int64_t per = S->B / dp, before = considered;
      bool any_b = false, size = false, ilp = false;
      for (int64_t b = 1; b <= per && b <= (st->micro > 0 ? st->micro : 64); b++) { /* try_micro's sizes */
        if (st->micro > 0 ? b != st->micro || per % b : !try_micro(b, per)) continue;
        any_b = true;
        /* the kernels index a tensor with 32 bits (cg_check_sizes, on each rank's graph): at best tp
         * splits the largest weight and the largest activation at this micro-batch (solved_at then
         * keeps each node's strategies within the limit, or refuses the configuration) */
        int64_t lb_fixed = (S->big_fixed + tp - 1) / tp;
        double lb_act = ceil((double)S->big_per_b * (double)b / (double)tp);
        if (lb_fixed > INT32_MAX || lb_act > INT32_MAX) {
          bool act = lb_act > (double)lb_fixed;
          why_size(&W, act ? (int64_t)fmin(lb_act, 9e18) : lb_fixed, g1,
                   act ? S->big_per_b_node : S->big_fixed_node, act ? b : 1, dp, tp, pp, b);
          size = true;
          continue;
        }
        /* sequence parallelism: pinned, or both ways; only where it divides the sequence (strat_pin's rule) */
        for (int64_t sp = 1; sp <= tp; sp += tp > 1 ? tp - 1 : 1) {
        if ((st->sp > 1 ? sp != st->sp : st->sp == 1 && sp != 1) || (sp > 1 && !strat_sp_fits(g1, sp))) continue;
        /* Megatron's rule, then the ILP's param placements: a saved plan's only, when it gives them; not
         * when the strategy pins tp (a pinned tp places as the rule does, as `build` builds it) */
        int nvar = st->tp > 0 && !st->tp_pins ? 1 : 2;
        for (int var = st->tp_pins ? 1 : 0; var < nvar; var++) {
        Solved *so = solved_at(S, tp, sp, b, var == 1);
        if (!so->ok) {
          if (var == 1) continue; /* the rule's placement, or one the build refuses */
          if (so->over > 0) why_size(&W, so->over, so->g, so->over_node, 1, dp, tp, pp, b), size = true;
          else ilp = true;
          continue;
        }
        for (int64_t zero = 0; zero <= 3; zero++) {
          if (st->zero >= 0 ? zero != st->zero : (zero > 0 && dp == 1)) continue;
          for (int rc = RC_NONE; rc <= RC_FULL; rc++) {
            if (st->recompute != RC_SEARCH && rc != (int)st->recompute) continue;
            for (int sc = PS_1F1B; sc <= PS_INTERLEAVED; sc++) {
              if (st->pipeline != PS_SEARCH ? sc != (int)st->pipeline : (pp == 1 && sc != PS_1F1B)) continue;
              int64_t v = sc == PS_INTERLEAVED ? 2 : 1;
              if (v > 1 && (pp == 1 || L % (pp * v) != 0)) continue;
              Config k = {dp, tp, pp, sp, b, per / b, zero, v, (Recompute)rc, (PipeSched)sc};
              if (sc == PS_INTERLEAVED && k.m % pp != 0) continue; /* Megatron's interleaving needs it */
              evaluate(S, so, &k);
              considered++;
            }
          }
        }
        }
        }
      }
      if (considered > before) continue;
      /* every micro-batch of these degrees was refused: by the first reason that applies */
      if (!any_b) {
        if (W.micro++ == 0) W.micro_dp = dp;
      } else if (size) W.size++;
      else if (ilp) W.other++;
      else W.sched++;
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  SrchResult *r = cp_alloc(sizeof *r);
  r->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  r->considered = considered;
  r->ilp_solves = S->ilp_solves;
  r->ilp_vars = S->ilp_vars;
  r->model_flops = 3 * S->flops_per_sample * (double)S->B;
  r->tokens = S->tokens_per_sample * (double)S->B;
  r->memory = S->memory;
  r->model = g1->model_name;
  r->layers = L;
  r->layer_classes = S->ly.ncls;
  if (considered == 0) {
    if (report) why_report(S, &W);
    return NULL;
  }
  if (S->plans.n == 0) {
    if (report) {
      Span at = st->span;
      bool mem_set = memory_span(sema_program(sema), t, &at);
      const SrchPlan *m = &S->min_plan;
      diag_error(at, "no strategy fits in %s per device: the smallest plan needs %s per device", cp_bytes_str(S->memory),
                 cp_bytes_str(S->min_mem));
      diag_note(at, "that plan: dp = %lld, tp = %lld, pp = %lld, zero = %lld, micro = %lld, recompute = %s%s",
                (long long)m->dp, (long long)m->tp, (long long)m->pp, (long long)m->zero, (long long)m->micro,
                rc_name(m->recompute), m->pins ? ", its params placed on tp by the search's ILP" : "");
      diag_hint(mem_set ? "raise `memory` to at least %s, or plan on more devices"
                        : "use devices with at least %s of memory, or more of them",
                cp_bytes_str(S->min_mem));
    }
    return NULL;
  }
  plan_sort(S->plans.a, S->plans.n);
  r->n = topk > 0 && topk < S->plans.n ? topk : S->plans.n;
  r->plans = S->plans.a;
  return r;
}

SrchResult *srch_run(Sema *s, const TrainConf *t, int topk) { return search(s, t, topk, true); }

void srch_pin(const SrchPlan *p, StrategyConf *out) {
  Span at = out->span;
  *out = (StrategyConf){.is_auto = false, .dp = p->dp, .tp = p->tp, .pp = p->pp, .sp = p->sp, .micro = p->micro,
                        .zero = p->zero, .recompute = p->recompute, .pipeline = p->sched, .span = at};
  if (!p->pins) return;
  VEC(TpPin) pins = {0};
  for (int i = 0; i < p->pins_g->n; i++)
    if (p->pins[i] != PIN_NONE) VEC_PUSH(pins, ((TpPin){p->pins_g->nodes[i].name, p->pins[i]}));
  out->tp_pins = pins.a, out->ntp_pins = pins.n;
}

bool search_best_runnable(Sema *s, const TrainConf *t, StrategyConf *out) {
  SrchResult *r = search(s, t, 1, false);
  if (!r || r->n == 0) return false;
  srch_pin(&r->plans[0], out);
  return true;
}
