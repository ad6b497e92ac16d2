/* vocab_pad.c: exact vocabulary padding under tensor parallelism (train.h vocab_pad).
 *
 * tp splits an embedding table [V, C] by rows (vocab-parallel) and its tied head x @ transpose(wte)
 * by columns only when tp divides V. llm.c and Megatron pad the vocabulary (GPT-2's 50257 to
 * 50304), which changes the model: the pad classes are trained towards no probability. This pass
 * pads exactly instead, before autodiff: the table becomes [V', C] (V' the next multiple of tp, of
 * 128 too for V >= 1024) with V kept as its valid rows (PARAM ia[1]; ia[2] the padded dim, 0), and
 * every head's logits [..., V'] are masked, where(arange(V') < V, logits, -inf), before their
 * readers. An untied head weight [C, V] tp does not divide (which column-parallel splits) is padded
 * alike to [C, V'] (ia[2] = 1), with the same mask. So
 *   - the lookups never read rows >= V (the indices are below V);
 *   - cross_entropy's max and sum of exponentials see exp(-inf) = 0 in the pad columns (an exact
 *     +0) and its gradient there is 0, so the where's gradient to the head is 0 there and the
 *     table's pad rows (a head weight's pad columns) get exactly zero gradient: they are zero at
 *     init (runtime/train.c draws each valid element at its unpadded index) and
 *     stay zero under every optimizer (a zero gradient moves no zero param, weight decay of 0 is
 *     0), and zero rows change no norm (clipping, LAMB, LARS);
 *   - argmax never picks a pad column (-inf is below every valid logit).
 * Files hold the [V, C] tensor (RtPlanParam.pad_*: trimmed on save, zero-padded on load), so
 * checkpoints stay strategy-invariant. A table read any other way (a head whose logits reach
 * another op, label smoothing's log_softmax, ...) is not padded: it stays whole on tp
 * (strategy.c's warning says so). */
#include "train.h"

#include <math.h>
#include <string.h>

int64_t vocab_pad_rows(int64_t v, int64_t tp) {
  if (tp <= 1 || v % tp == 0) return v;
  int64_t m = v >= 1024 ? 128 : tp; /* large: also a multiple of 128, as nanoGPT's 50304 */
  while (m % tp) m += 128;
  return (v + m - 1) / m * m;
}

/* Whether every reader of node i (in g's first n nodes) satisfies ok(g, reader, i); false when none. */
static bool readers_all(const Graph *g, int i, bool (*ok)(const Graph *, int, int)) {
  bool any = false;
  for (int j = i + 1; j < g->n; j++)
    for (int k = 0; k < g->nodes[j].nin; k++)
      if (g->nodes[j].in[k] == i) {
        if (!ok(g, j, i)) return false;
        any = true;
        break;
      }
  return any;
}

static bool is_output(const Graph *g, int i) {
  if (g->loss == i) return true;
  for (int k = 0; k < g->metrics.n; k++)
    if (g->metrics.a[k].node == i) return true;
  return false;
}

/* A reader of a head's logits that the mask keeps exact: cross_entropy's logits, argmax over the classes. */
static bool logits_reader_ok(const Graph *g, int j, int l) {
  const Node *r = &g->nodes[j];
  if (r->op == OP_CROSS_ENTROPY) return r->in[0] == l && r->in[1] != l;
  return r->op == OP_ARGMAX && r->ia[0] == g->nodes[l].shape.rank - 1;
}

/* A head: x @ w (w the transposed table, or an untied head weight [C, V]), logits read only as above. */
static bool head_ok(const Graph *g, int j, int w) {
  const Node *m = &g->nodes[j];
  return m->op == OP_MATMUL && m->in[1] == w && m->in[0] != w && m->shape.rank >= 2 && !is_output(g, j) &&
         readers_all(g, j, logits_reader_ok);
}

static bool table_reader_ok(const Graph *g, int j, int p) {
  const Node *r = &g->nodes[j];
  if (r->op == OP_EMBEDDING) return r->in[0] == p && r->in[1] != p;
  return r->op == OP_TRANSPOSE && r->shape.rank == 2 && !is_output(g, j) && readers_all(g, j, head_ok);
}

/* The dim of param p vocab_pad pads under tp: 0 (a table [V, C]), 1 (an untied head weight [C, V]), or -1. */
static int pad_dim(const Graph *g, int p, int64_t tp) {
  const Node *n = &g->nodes[p];
  if (tp <= 1 || n->op != OP_PARAM || n->shape.rank != 2 || n->ia[1] != 0) return -1;
  if (n->shape.d[0] % tp != 0 && readers_all(g, p, table_reader_ok)) return 0;
  if (n->shape.d[1] % tp != 0 && readers_all(g, p, head_ok)) return 1;
  return -1;
}

bool vocab_pad_fits(const Graph *g, int p, int64_t tp) { return pad_dim(g, p, tp) >= 0; }

/* Pads the params that fit; per node of g, the valid columns of a head matmul whose logits get
 * the mask (0: none). */
static int64_t *find_heads(Graph *g, int64_t tp, int *npadded) {
  int64_t *heads = cp_alloc(sizeof(int64_t) * (size_t)(g->n + 1));
  *npadded = 0;
  for (int k = 0; k < g->params.n; k++) {
    int p = g->params.a[k], d = pad_dim(g, p, tp);
    if (d < 0) continue;
    Node *pn = &g->nodes[p];
    for (int j = p + 1; j < g->n; j++) {
      const Node *r = &g->nodes[j];
      if (d == 1 && r->op == OP_MATMUL && r->in[1] == p) heads[j] = pn->shape.d[1];
      if (d == 0 && r->op == OP_TRANSPOSE && r->in[0] == p)
        for (int m = j + 1; m < g->n; m++)
          if (g->nodes[m].op == OP_MATMUL && g->nodes[m].in[1] == j) heads[m] = pn->shape.d[0];
    }
    pn->ia[1] = pn->shape.d[d];
    pn->ia[2] = d;
    pn->shape.d[d] = vocab_pad_rows(pn->shape.d[d], tp);
    ++*npadded;
  }
  return heads;
}

static int copy_node(Graph *g, const Node *o, const int *map) {
  int *in = cp_alloc(sizeof(int) * (size_t)(o->nin + 1));
  for (int k = 0; k < o->nin; k++) in[k] = map[o->in[k]];
  int i = ir_add(g, o->op, in, o->nin, o->span);
  Node *d = &g->nodes[i];
  int *keep = d->in;
  *d = *o;
  d->in = keep;
  return i;
}

static int add_const(Graph *g, DType dt, double v, Span at) {
  int i = ir_add(g, OP_CONST, NULL, 0, at);
  g->nodes[i].shape.rank = 0;
  g->nodes[i].dtype = dt;
  g->nodes[i].fa[0] = v;
  return i;
}

static void infer(Graph *g, int i) {
  char err[512];
  if (!ir_infer(g, i, err, sizeof err)) cp_panic(__FILE__, __LINE__, "vocab padding made a bad node: %s", err);
}

/* where(arange(V') < valid, logits, -inf) after head l (V' = its last dim); returns the where. */
static int add_mask(Graph *g, int l, int64_t valid) {
  Span at = g->nodes[l].span;
  int ar = ir_add(g, OP_ARANGE, NULL, 0, at);
  g->nodes[ar].ia[0] = g->nodes[l].shape.d[g->nodes[l].shape.rank - 1];
  infer(g, ar);
  int lt[2] = {ar, add_const(g, DT_I32, (double)valid, at)};
  int cond = ir_add(g, OP_LT, lt, 2, at);
  infer(g, cond);
  int w[3] = {cond, l, add_const(g, DT_F32, -INFINITY, at)};
  int i = ir_add(g, OP_WHERE, w, 3, at);
  infer(g, i);
  return i;
}

bool vocab_pad(Graph *g, int64_t tp) {
  int npadded;
  if (tp <= 1 || g->seed >= 0) return false; /* before autodiff only */
  int64_t *heads = find_heads(g, tp, &npadded);
  if (!npadded) return false;
  Node *old = g->nodes;
  int n = g->n, cur = g->cur_layer;
  int *map = cp_alloc(sizeof(int) * (size_t)(n + 1));
  g->nodes = NULL, g->n = g->cap = 0;
  for (int j = 0; j < n; j++) {
    map[j] = copy_node(g, &old[j], map);
    if (!(ir_ops[old[j].op].flags & OPF_LEAF)) infer(g, map[j]); /* the shapes the padded tables give */
    if (heads[j]) {
      g->cur_layer = old[j].layer;
      map[j] = add_mask(g, map[j], heads[j]);
    }
  }
  g->cur_layer = cur;
  for (int k = 0; k < g->params.n; k++) g->params.a[k] = map[g->params.a[k]];
  for (int k = 0; k < g->inputs.n; k++) g->inputs.a[k] = map[g->inputs.a[k]];
  for (int k = 0; k < g->metrics.n; k++) g->metrics.a[k].node = map[g->metrics.a[k].node];
  if (g->loss >= 0) g->loss = map[g->loss];
  char err[512];
  if (!ir_verify(g, err, sizeof err)) cp_panic(__FILE__, __LINE__, "vocab padding made a bad graph: %s", err);
  return true;
}

const Graph *vocab_pad_priced(const Graph *g, int64_t tp) {
  int *dim = cp_alloc(sizeof(int) * (size_t)(g->params.n + 1));
  bool any = false;
  for (int k = 0; k < g->params.n; k++) any |= (dim[k] = pad_dim(g, g->params.a[k], tp)) >= 0;
  if (!any) return g;
  Graph *c = cp_alloc(sizeof *c);
  *c = *g;
  c->nodes = cp_alloc(sizeof(Node) * (size_t)g->n);
  memcpy(c->nodes, g->nodes, sizeof(Node) * (size_t)g->n); /* the inputs' arrays are shared: unchanged */
  c->cap = g->n;
  for (int k = 0; k < g->params.n; k++) {
    Node *pn = &c->nodes[g->params.a[k]];
    if (dim[k] < 0) continue;
    pn->ia[1] = pn->shape.d[dim[k]], pn->ia[2] = dim[k];
    pn->shape.d[dim[k]] = vocab_pad_rows(pn->shape.d[dim[k]], tp);
  }
  for (int i = 0; i < c->n; i++)
    if (!(ir_ops[c->nodes[i].op].flags & OPF_LEAF)) infer(c, i);
  return c;
}

