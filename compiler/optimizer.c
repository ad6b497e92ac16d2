/* optimizer.c: lowers gradient clipping and the optimizer (docs/language.md §8) to ordinary
 * Graph nodes with role ROLE_UPD, so that the search, the lowering and codegen treat the update
 * like any other part of the graph (ZeRO is then a placement of these nodes).
 *
 * The update reads the gradient accumulators (the values of the ACCUM nodes of autodiff.c), the
 * host-computed scalars SCALAR_IN "lr", "bc1" = 1 - beta1^t and "bc2" = 1 - beta2^t (t = step+1),
 * and writes params and optimizer state with ASSIGN. Each formula follows its PyTorch namesake's
 * order of operations, so float results match torch.optim closely.
 *
 * "Ratio 1 when a norm is 0" (LAMB, LARS) is built without a tiny epsilon: with
 * ok = (a > 0) * (b > 0) in {0, 1}, ratio = ok*num / (den + (1 - ok)) + (1 - ok), which is exactly
 * num/den when ok = 1 and exactly 1 when ok = 0 (the denominator is then >= 1, never 0).
 * LARS scales every param by its η, biases and norms included (only the decay is limited to
 * rank >= 2); a param at zero (a fresh bias) gets η = 1, as the SimCLR/torchlars LARS does.
 * Gradient accumulators are not zeroed here: the runtime zeroes unsaved STATEs at each step
 * boundary (RtPlanState.saved = 0). */
#include "train.h"

typedef struct Upd {
  Graph *g;
  const OptimizerConf *o;
  int param;   /* the PARAM node being updated (layer and span of new nodes) */
  int lr, bc1, bc2; /* SCALAR_IN nodes (bc1/bc2 -1 unless the optimizer uses them) */
} Upd;

static int finish(Graph *g, int i) {
  char err[512];
  if (!ir_infer(g, i, err, sizeof err)) cp_panic(__FILE__, __LINE__, "optimizer made a bad node %%%d: %s", i, err);
  return i;
}

static int add_upd(Graph *g, OpId op, const int *in, int nin, int like) {
  Span span = like >= 0 ? g->nodes[like].span : SPAN_NONE;
  int layer = like >= 0 ? g->nodes[like].layer : -1;
  int i = ir_add(g, op, in, nin, span);
  g->nodes[i].role = ROLE_UPD;
  g->nodes[i].layer = layer;
  return i;
}

/* ---- node builders (u->param gives layer and span) ------------------------------------- */

static int op2(Upd *u, OpId op, int a, int b) {
  int in[2] = {a, b};
  return finish(u->g, add_upd(u->g, op, in, 2, u->param));
}
static int op1(Upd *u, OpId op, int a) { return finish(u->g, add_upd(u->g, op, &a, 1, u->param)); }
static int cst(Upd *u, double v) {
  int i = add_upd(u->g, OP_CONST, NULL, 0, u->param);
  u->g->nodes[i].fa[0] = v;
  u->g->nodes[i].dtype = DT_F32;
  return finish(u->g, i);
}
static int add(Upd *u, int a, int b) { return op2(u, OP_ADD, a, b); }
static int sub(Upd *u, int a, int b) { return op2(u, OP_SUB, a, b); }
static int mul(Upd *u, int a, int b) { return op2(u, OP_MUL, a, b); }
static int dvd(Upd *u, int a, int b) { return op2(u, OP_DIV, a, b); }

/* sum(square(x)) over all axes: a rank-0 node. */
static int sumsq(Upd *u, int x) {
  int i = add_upd(u->g, OP_SUM, (int[]){op1(u, OP_SQUARE, x)}, 1, u->param);
  u->g->nodes[i].ndims = -1;
  return finish(u->g, i);
}
static int norm(Upd *u, int x) { return op1(u, OP_SQRT, sumsq(u, x)); }

/* num/den when a > 0 and b > 0, else 1 (see the file comment). */
static int safe_ratio(Upd *u, int num, int den, int a, int b) {
  int zero = cst(u, 0), one = cst(u, 1);
  int ok = mul(u, op2(u, OP_GT, a, zero), op2(u, OP_GT, b, zero));
  int notok = sub(u, one, ok);
  return add(u, dvd(u, mul(u, ok, num), add(u, den, notok)), notok);
}

static int scalar_in(Graph *g, const char *name) {
  int i = add_upd(g, OP_SCALAR_IN, NULL, 0, -1);
  g->nodes[i].name = name;
  g->nodes[i].dtype = DT_F32;
  return finish(g, i);
}

/* A saved optimizer state "<param path>.<slot>" of the param's type. */
static int state(Upd *u, const char *slot) {
  Graph *g = u->g;
  int i = add_upd(g, OP_STATE, NULL, 0, u->param);
  Node *n = &g->nodes[i];
  n->name = cp_fmt("%s.%s", g->nodes[u->param].name, slot);
  n->shape = g->nodes[u->param].shape;
  n->dtype = g->nodes[u->param].dtype;
  n->ia[0] = u->param;
  n->ia[1] = 1;
  VEC_PUSH(g->states, i);
  return finish(g, i);
}

static void assign(Upd *u, int dst, int value) { op2(u, OP_ASSIGN, dst, value); }

/* Weight decay only for matrices and embeddings (language.md §8, as nanoGPT and llm.c). */
static double decay_of(const Upd *u) {
  return u->g->nodes[u->param].shape.rank >= 2 ? u->o->weight_decay : 0;
}

/* ---- the optimizers: grad is the (clipped) accumulated gradient ------------------------- */

/* torch.optim.SGD (dampening 0). The momentum buffer starts at zero, so the first step's
 * momentum*0 + d_p is exactly torch's buf = d_p. */
static void sgd(Upd *u, int grad) {
  const OptimizerConf *o = u->o;
  int p = u->param, d = grad;
  double wd = decay_of(u);
  if (wd != 0) d = add(u, d, mul(u, p, cst(u, wd)));
  if (o->momentum != 0) {
    int buf = state(u, "momentum_buffer");
    int nb = add(u, mul(u, buf, cst(u, o->momentum)), d);
    assign(u, buf, nb);
    d = o->nesterov ? add(u, d, mul(u, nb, cst(u, o->momentum))) : nb;
  }
  assign(u, p, sub(u, p, mul(u, d, u->lr)));
}

/* Adam moments, shared by AdamW and LAMB: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g². */
static void moments(Upd *u, int grad, int *m, int *v) {
  const OptimizerConf *o = u->o;
  int ms = state(u, "exp_avg"), vs = state(u, "exp_avg_sq");
  *m = add(u, mul(u, ms, cst(u, o->beta1)), mul(u, grad, cst(u, 1 - o->beta1)));
  *v = add(u, mul(u, vs, cst(u, o->beta2)), mul(u, op1(u, OP_SQUARE, grad), cst(u, 1 - o->beta2)));
  assign(u, ms, *m);
  assign(u, vs, *v);
}

/* torch.optim.AdamW: p *= 1 - lr wd; moments; denom = sqrt(v)/sqrt(bc2) + eps;
 * p -= (lr/bc1) * (m/denom). */
static void adamw(Upd *u, int grad) {
  int p = u->param;
  double wd = decay_of(u);
  if (wd != 0) p = mul(u, p, sub(u, cst(u, 1), mul(u, u->lr, cst(u, wd))));
  int m, v;
  moments(u, grad, &m, &v);
  int denom = add(u, dvd(u, op1(u, OP_SQRT, v), op1(u, OP_SQRT, u->bc2)), cst(u, u->o->eps));
  int step = dvd(u, u->lr, u->bc1);
  assign(u, u->param, sub(u, p, mul(u, step, dvd(u, m, denom))));
}

/* LAMB (§8): u = m̂/(√v̂ + eps) + wd p; p -= lr (‖p‖/‖u‖) u, ratio 1 when a norm is 0. */
static void lamb(Upd *u, int grad) {
  int p = u->param, m, v;
  moments(u, grad, &m, &v);
  int mhat = dvd(u, m, u->bc1), vhat = dvd(u, v, u->bc2);
  int upd = dvd(u, mhat, add(u, op1(u, OP_SQRT, vhat), cst(u, u->o->eps)));
  double wd = decay_of(u);
  if (wd != 0) upd = add(u, upd, mul(u, p, cst(u, wd)));
  int pn = norm(u, p), un = norm(u, upd);
  int ratio = safe_ratio(u, pn, un, pn, un);
  assign(u, p, sub(u, p, mul(u, mul(u, u->lr, ratio), upd)));
}

/* LARS (§8): η = trust ‖p‖/(‖g‖ + wd ‖p‖) (1 when a norm is 0); v = momentum v + η (g + wd p);
 * p -= lr v. */
static void lars(Upd *u, int grad) {
  const OptimizerConf *o = u->o;
  int p = u->param;
  double wd = decay_of(u);
  int pn = norm(u, p), gn = norm(u, grad);
  int den = wd != 0 ? add(u, gn, mul(u, pn, cst(u, wd))) : gn;
  int eta = safe_ratio(u, mul(u, pn, cst(u, o->trust)), den, pn, gn);
  int d = wd != 0 ? add(u, grad, mul(u, p, cst(u, wd))) : grad;
  int buf = state(u, "momentum_buffer");
  int nb = add(u, mul(u, buf, cst(u, o->momentum)), mul(u, d, eta));
  assign(u, buf, nb);
  assign(u, p, sub(u, p, mul(u, nb, u->lr)));
}

/* ---- clipping and the driver --------------------------------------------------------- */

/* accum[p]: the ACCUM node holding param p's accumulated gradient, -1 if none. */
static int *find_accums(const Graph *g) {
  int *acc = cp_alloc((size_t)(g->params.n > 0 ? g->params.n : 1) * sizeof *acc);
  int *pos = cp_alloc((size_t)g->n * sizeof *pos); /* node -> index in g->params, plus one */
  for (int p = 0; p < g->params.n; p++) {
    acc[p] = -1;
    pos[g->params.a[p]] = p + 1;
  }
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (n->op != OP_ACCUM) continue;
    int p = pos[g->nodes[n->in[0]].ia[0]] - 1;
    cp_assert(p >= 0);
    acc[p] = i;
  }
  return acc;
}

/* norm = sqrt(Σ_p sum(square(g_p))); with clip, every g_p *= min(1, clip / (norm + 1e-6)),
 * as torch.nn.utils.clip_grad_norm_. Rewrites acc[] to the clipped gradients. */
static void clip_grads(Graph *g, int *acc, double clip) {
  Upd u = {.g = g, .param = -1};
  int total = -1;
  for (int p = 0; p < g->params.n; p++) {
    if (acc[p] < 0) continue;
    u.param = g->params.a[p];
    int s = sumsq(&u, acc[p]);
    total = total < 0 ? s : add(&u, total, s);
  }
  u.param = -1;
  if (total < 0) total = cst(&u, 0);
  g->grad_norm = op1(&u, OP_SQRT, total);
  if (clip <= 0) return;
  int scale = op2(&u, OP_MINIMUM, cst(&u, 1), dvd(&u, cst(&u, clip), add(&u, g->grad_norm, cst(&u, 1e-6))));
  for (int p = 0; p < g->params.n; p++) {
    if (acc[p] < 0) continue;
    u.param = g->params.a[p];
    acc[p] = mul(&u, acc[p], scale);
  }
}

bool opt_lower(Graph *g, const TrainConf *t) {
  cp_assert(g->grads.n == g->params.n);
  const OptimizerConf *o = &t->optimizer;
  int *acc = find_accums(g);
  clip_grads(g, acc, t->clip);
  bool adam = o->kind == OPT_ADAMW || o->kind == OPT_LAMB;
  Upd u = {.g = g, .o = o, .lr = scalar_in(g, "lr"), .bc1 = -1, .bc2 = -1};
  if (adam) {
    u.bc1 = scalar_in(g, "bc1");
    u.bc2 = scalar_in(g, "bc2");
  }
  for (int p = 0; p < g->params.n; p++) {
    if (acc[p] < 0) continue; /* as torch: a param without a gradient is not updated */
    u.param = g->params.a[p];
    switch (o->kind) {
    case OPT_SGD: sgd(&u, acc[p]); break;
    case OPT_ADAMW: adamw(&u, acc[p]); break;
    case OPT_LAMB: lamb(&u, acc[p]); break;
    case OPT_LARS: lars(&u, acc[p]); break;
    }
  }
  return true;
}
