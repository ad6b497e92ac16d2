/* vocab_pad.c: exact vocabulary padding under tensor parallelism (train.h vocab_pad).
 *
 * tp splits an embedding table [V, C] by rows (vocab-parallel) and its tied head x @ transpose(wte)
 * by columns only when tp divides V. llm.c and Megatron pad the vocabulary (GPT-2's 50257 to
 * 50304), which changes the model: the pad classes are trained towards no probability. This pass
 * pads exactly instead, before autodiff: the table becomes [V', C] (V' the next multiple of tp, of
 * 128 too for V >= 1024) with V kept as its valid rows (PARAM ia[1]; ia[2] the padded dim, 0), and
 * every head's logits [..., V'] are masked, where(arange(V') < V, logits, -inf), before their
 * readers. An untied head weight [C, V] tp does not divide (which column-parallel splits) is padded
 * alike to [C, V'] (ia[2] = 1), with the same mask; so is a head's bias [V] (nn's linear: x @ w + b)
 * to [V'], the mask then after the add. So
 *   - the lookups never read rows >= V (the indices are below V);
 *   - cross_entropy's max and sum of exponentials see exp(-inf) = 0 in the pad columns (an exact
 *     +0) and its gradient there is 0, so the where's gradient to the head is 0 there and the
 *     table's pad rows (a head weight's pad columns) get exactly zero gradient: they are zero at
 *     init (runtime/train.c draws each valid element at its unpadded index) and
 *     stay zero under every optimizer (a zero gradient moves no zero param, weight decay of 0 is
 *     0), and zero rows change no norm (clipping, LAMB, LARS);
 *   - argmax never picks a pad column (-inf is below every valid logit).
 * The lookups of a padded table and the cross_entropy of masked logits carry V (ia[1]), the range
 * the kernels check indices and targets against, as on one device (the pad is never a valid index).
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

/* Whether every reader of node i satisfies ok(g, reader, i); false when it has none. */
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

/* The only reader of node i, or -1. */
static int single_reader(const Graph *g, int i) {
  int r = -1;
  for (int j = i + 1; j < g->n; j++)
    for (int k = 0; k < g->nodes[j].nin; k++)
      if (g->nodes[j].in[k] == i) {
        if (r >= 0 && r != j) return -1;
        r = j;
      }
  return r;
}

/* The node holding the logits of head matmul m: m itself, or m + b with b a bias [V] param only
 * that add reads (nn's linear), read only as above; -1 when neither. */
static int head_logits(const Graph *g, int m) {
  if (readers_all(g, m, logits_reader_ok)) return m;
  int a = single_reader(g, m);
  if (a < 0 || g->nodes[a].op != OP_ADD || g->nodes[a].in[0] != m || is_output(g, a)) return -1;
  int b = g->nodes[a].in[1];
  const Node *bn = &g->nodes[b];
  bool bias = bn->op == OP_PARAM && bn->shape.rank == 1 && bn->ia[1] == 0 && single_reader(g, b) == a &&
              bn->shape.d[0] == g->nodes[m].shape.d[g->nodes[m].shape.rank - 1];
  return bias && readers_all(g, a, logits_reader_ok) ? a : -1;
}

/* A head: x @ w (w the transposed table, or an untied head weight [C, V]), its logits (+ a bias)
 * read only as above. */
static bool head_ok(const Graph *g, int j, int w) {
  const Node *m = &g->nodes[j];
  return m->op == OP_MATMUL && m->in[1] == w && m->in[0] != w && m->shape.rank >= 2 && !is_output(g, j) &&
         head_logits(g, j) >= 0;
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

/* Head matmul m of v classes: its logits get the mask, its bias (if any) is padded. The params it pads. */
static int mark_head(const Graph *g, int m, int64_t v, int *dim, int64_t *mask) {
  int l = head_logits(g, m);
  mask[l] = v;
  if (l == m) return 0;
  dim[g->nodes[l].in[1]] = 0;
  return 1;
}

/* What vocab_pad does to g under tp, per node: dim[i] the dim of param i it pads (-1: none; a head's
 * bias: 0) and mask[i] the valid classes of a head's logits node i to mask (0: none). The number of
 * params it pads. */
static int plan_pads(const Graph *g, int64_t tp, int *dim, int64_t *mask) {
  int n = 0;
  for (int i = 0; i < g->n; i++) dim[i] = -1, mask[i] = 0;
  for (int k = 0; k < g->params.n; k++) {
    int p = g->params.a[k], d = pad_dim(g, p, tp);
    if (d < 0) continue;
    dim[p] = d, n++;
    for (int j = p + 1; j < g->n; j++) {
      const Node *r = &g->nodes[j];
      if (d == 1 && r->op == OP_MATMUL && r->in[1] == p) n += mark_head(g, j, g->nodes[p].shape.d[d], dim, mask);
      if (d == 0 && r->op == OP_TRANSPOSE && r->in[0] == p)
        for (int m = j + 1; m < g->n; m++)
          if (g->nodes[m].op == OP_MATMUL && g->nodes[m].in[1] == j) n += mark_head(g, m, g->nodes[p].shape.d[d], dim, mask);
    }
  }
  return n;
}

/* Pads the params plan_pads chose (nodes of a graph of n nodes). */
static void apply_pads(Node *nodes, int n, const int *dim, int64_t tp) {
  for (int i = 0; i < n; i++) {
    if (dim[i] < 0) continue;
    Node *pn = &nodes[i];
    pn->ia[1] = pn->shape.d[dim[i]];
    pn->ia[2] = dim[i];
    pn->shape.d[dim[i]] = vocab_pad_rows(pn->shape.d[dim[i]], tp);
  }
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
  if (tp <= 1 || g->seed >= 0) return false; /* before autodiff only */
  int *dim = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  int64_t *mask = cp_alloc(sizeof(int64_t) * (size_t)(g->n + 1));
  if (!plan_pads(g, tp, dim, mask)) return false;
  apply_pads(g->nodes, g->n, dim, tp);
  Node *old = g->nodes;
  int n = g->n, cur = g->cur_layer;
  int *map = cp_alloc(sizeof(int) * (size_t)(n + 1));
  g->nodes = NULL, g->n = g->cap = 0;
  for (int j = 0; j < n; j++) {
    map[j] = copy_node(g, &old[j], map);
    if (!(ir_ops[old[j].op].flags & OPF_LEAF)) infer(g, map[j]); /* the shapes the padded params give */
    const Node *o = &old[j];
    if (o->op == OP_EMBEDDING && dim[o->in[0]] == 0) g->nodes[map[j]].ia[1] = old[o->in[0]].ia[1];
    if (o->op == OP_CROSS_ENTROPY && mask[o->in[0]]) g->nodes[map[j]].ia[1] = mask[o->in[0]];
    if (mask[j]) {
      g->cur_layer = old[j].layer;
      map[j] = add_mask(g, map[j], mask[j]);
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
  int *dim = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  int64_t *mask = cp_alloc(sizeof(int64_t) * (size_t)(g->n + 1));
  if (tp <= 1 || !plan_pads(g, tp, dim, mask)) return g;
  Graph *c = cp_alloc(sizeof *c);
  *c = *g;
  c->nodes = cp_alloc(sizeof(Node) * (size_t)g->n);
  memcpy(c->nodes, g->nodes, sizeof(Node) * (size_t)g->n); /* the inputs' arrays are shared: unchanged */
  c->cap = g->n;
  apply_pads(c->nodes, c->n, dim, tp);
  for (int i = 0; i < c->n; i++)
    if (!(ir_ops[c->nodes[i].op].flags & OPF_LEAF)) infer(c, i);
  return c;
}
