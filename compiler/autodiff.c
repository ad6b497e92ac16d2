/* autodiff.c: reverse-mode differentiation of a forward Graph (DESIGN.md §4).
 *
 * The backward pass is appended after the forward nodes, so the graph stays in topological
 * order. Each forward node's input gradient is one GRAD node whose meaning is "the backward
 * kernel of that op, for that input" (ops.def): the op table, not this file, knows the math, and
 * the reference kernels (kernels/cpu/ref.h) compute it. This pass only decides which gradients
 * exist and how contributions of several consumers are summed. */
#include "train.h"

#include <string.h>

static bool is_float(DType t) { return t != DT_I32; }

/* where's condition and sdpa's key mask take no gradient */
bool ad_grad_input(const Node *n, int k) {
  return !(n->op == OP_WHERE && k == 0) && !(n->op == OP_SDPA && k == 3);
}

/* needs[i]: node i is a float value that depends on a param through differentiable ops, so a
 * gradient flows into it. Integer values (indices, targets) and no-grad ops cut the flow. */
static bool *depends_on_params(const Graph *g, int nfwd) {
  bool *needs = cp_alloc((size_t)(nfwd > 0 ? nfwd : 1) * sizeof *needs);
  for (int i = 0; i < nfwd; i++) {
    const Node *n = &g->nodes[i];
    if (n->op == OP_PARAM) {
      needs[i] = is_float(n->dtype);
      continue;
    }
    if (ir_ops[n->op].flags & (OPF_LEAF | OPF_NOGRAD)) continue;
    for (int k = 0; k < n->nin && !needs[i]; k++) needs[i] = ad_grad_input(n, k) && needs[n->in[k]];
    needs[i] = needs[i] && is_float(n->dtype);
  }
  return needs;
}

/* Appends a node made by this pass: role backward, the layer and span it differentiates. */
static int add_bwd(Graph *g, OpId op, const int *in, int nin, int like) {
  Span span = g->nodes[like].span;
  int layer = g->nodes[like].layer;
  int i = ir_add(g, op, in, nin, span);
  g->nodes[i].role = ROLE_BWD;
  g->nodes[i].layer = layer;
  return i;
}

static void infer_or_die(Graph *g, int i) {
  char err[512];
  if (!ir_infer(g, i, err, sizeof err)) cp_panic(__FILE__, __LINE__, "autodiff made a bad node %%%d: %s", i, err);
}

/* The seed d loss = 1/accum: each micro-batch's loss is a mean over its samples, and the
 * step's loss is the mean of the micro-batches' losses. */
static int seed(Graph *g, int64_t accum) {
  int i = add_bwd(g, OP_CONST, NULL, 0, g->loss);
  g->nodes[i].fa[0] = 1.0 / (double)accum;
  g->nodes[i].dtype = g->nodes[g->loss].dtype;
  infer_or_die(g, i);
  g->seed = i;
  return i;
}

/* Adds contribution `d` to the gradient of value v (an ADD when it already has one). */
static void contribute(Graph *g, int *grad, int v, int d) {
  if (grad[v] < 0) {
    grad[v] = d;
    return;
  }
  int in[2] = {grad[v], d};
  grad[v] = add_bwd(g, OP_ADD, in, 2, v);
  infer_or_die(g, grad[v]);
}

/* GRAD of input k of forward node f, given dy: inputs [dy, f's inputs..., f]. */
static int grad_node(Graph *g, int f, int k, int dy) {
  int nin = g->nodes[f].nin;
  int *in = cp_alloc((size_t)(nin + 2) * sizeof *in);
  in[0] = dy;
  memcpy(in + 1, g->nodes[f].in, (size_t)nin * sizeof *in);
  in[nin + 1] = f;
  int i = add_bwd(g, OP_GRAD, in, nin + 2, f);
  g->nodes[i].fwd = f;
  g->nodes[i].ia[0] = k;
  infer_or_die(g, i);
  return i;
}

/* A STATE "<path>.grad" and ACCUM(state, grad) per param with a gradient. */
static void accumulate(Graph *g) {
  for (int p = 0; p < g->params.n; p++) {
    int gi = g->grads.a[p], pi = g->params.a[p];
    if (gi < 0) continue;
    int s = add_bwd(g, OP_STATE, NULL, 0, pi);
    Node *sn = &g->nodes[s];
    sn->name = cp_fmt("%s.grad", g->nodes[pi].name);
    sn->shape = g->nodes[pi].shape;
    sn->dtype = g->nodes[pi].dtype;
    sn->ia[0] = pi;
    sn->ia[1] = 0;
    infer_or_die(g, s);
    VEC_PUSH(g->states, s);
    int in[2] = {s, gi};
    infer_or_die(g, add_bwd(g, OP_ACCUM, in, 2, pi));
  }
}

bool *ad_grad_flows(const Graph *g) {
  int nfwd = g->n;
  bool *needs = depends_on_params(g, nfwd);
  bool *flows = cp_alloc((size_t)(nfwd > 0 ? nfwd : 1) * sizeof *flows);
  if (g->loss >= 0 && g->loss < nfwd && needs[g->loss]) flows[g->loss] = true;
  for (int i = g->loss; i >= 0; i--) { /* as ad_backward walks: a consumer with a gradient feeds its inputs */
    const Node *n = &g->nodes[i];
    if (!flows[i] || (ir_ops[n->op].flags & (OPF_LEAF | OPF_NOGRAD))) continue;
    for (int k = 0; k < n->nin; k++) flows[n->in[k]] |= needs[n->in[k]] && ad_grad_input(n, k);
  }
  return flows;
}

bool ad_loss_trainable(const Graph *g) {
  if (g->loss < 0 || g->params.n == 0) return true;
  int nfwd = g->loss + 1;
  bool *needs = depends_on_params(g, nfwd);
  if (g->params.n > 0 && !needs[g->loss]) { /* as PyTorch's "does not require grad": nothing would train */
    diag_error(g->nodes[g->loss].span, "the loss of model '%s' has no gradient: no param reaches it through "
               "differentiable ops, so training would change nothing", g->model_name ? g->model_name : "?");
    bool *reach = cp_alloc((size_t)nfwd * sizeof *reach); /* the loss's ancestors */
    reach[g->loss] = true;
    for (int i = g->loss; i >= 0; i--) {
      const Node *n = &g->nodes[i];
      if (!reach[i]) continue;
      bool blocks = false;
      for (int k = 0; k < n->nin; k++) reach[n->in[k]] = true, blocks |= needs[n->in[k]];
      if ((ir_ops[n->op].flags & OPF_NOGRAD) && blocks)
        diag_note(n->span, "'%s' has no gradient: the params before it get none through it", ir_ops[n->op].name);
    }
    return false;
  }
  return true;
}

bool ad_backward(Graph *g, int64_t accum) {
  cp_assert(accum >= 1 && g->grads.n == 0);
  if (g->loss < 0) {
    diag_error(SPAN_NONE, "model '%s' has no loss: nothing to train", g->model_name ? g->model_name : "?");
    return false;
  }
  int nfwd = g->n;
  bool *needs = depends_on_params(g, nfwd);
  if (!ad_loss_trainable(g)) return false;
  int *grad = cp_alloc((size_t)nfwd * sizeof *grad);
  for (int i = 0; i < nfwd; i++) grad[i] = -1;
  g->accum = accum;
  if (needs[g->loss]) grad[g->loss] = seed(g, accum);
  /* Reverse order: when node i is reached, every consumer (all later) has contributed. */
  for (int i = g->loss; i >= 0; i--) {
    const Node *n = &g->nodes[i];
    if (grad[i] < 0 || (ir_ops[n->op].flags & (OPF_LEAF | OPF_NOGRAD))) continue;
    for (int k = 0; k < g->nodes[i].nin; k++) {
      int x = g->nodes[i].in[k];
      if (!needs[x] || !ad_grad_input(n, k)) continue;
      contribute(g, grad, x, grad_node(g, i, k, grad[i]));
    }
  }
  for (int p = 0; p < g->params.n; p++) VEC_PUSH(g->grads, grad[g->params.a[p]]);
  accumulate(g);
  return true;
}

int64_t train_dp(const TrainConf *t) {
  const StrategyConf *st = &t->strategy;
  if (st->dp > 0) return st->dp;
  int64_t rest = (st->tp > 1 ? st->tp : 1) * (st->pp > 1 ? st->pp : 1);
  if (t->mesh && t->mesh->ndevices % rest == 0) return t->mesh->ndevices / rest;
  return 1;
}

bool train_pinned(const TrainConf *t) {
  const StrategyConf *st = &t->strategy;
  if (!t->mesh || t->mesh->ndevices <= 1) return true;
  return !st->is_auto && st->dp > 0 && st->tp > 0 && st->pp > 0 && st->sp > 0 && st->micro > 0 && st->zero >= 0 &&
         st->recompute != RC_SEARCH && (st->pp == 1 || st->pipeline != PS_SEARCH);
}

bool train_cuda(const TrainConf *t) { return t->mesh && t->mesh->device.kind == DEV_CUDA; }

bool train_lowered(const TrainConf *t) { return t->strategy.tp > 1 || t->strategy.zero > 0 || t->strategy.pp > 1; }

int64_t train_graph_batch(const TrainConf *t) {
  int64_t b = train_micro(t);
  return train_lowered(t) ? b * train_dp(t) : b;
}

int64_t train_micro(const TrainConf *t) {
  if (t->strategy.micro > 0) return t->strategy.micro;
  int64_t dp = train_dp(t);
  return t->batch >= dp && dp > 0 ? t->batch / dp : t->batch;
}

/* The gradient accumulation the micro-batch implies: the global batch is dp * micro * accum
 * (language.md §6); unpinned fields default to one micro-batch per data-parallel rank. */
static int64_t accum_steps(const TrainConf *t) {
  int64_t micro = train_micro(t), dp = train_dp(t);
  if (micro <= 0 || t->batch % (micro * dp) != 0) {
    diag_error(t->span, "batch %lld is not divisible by dp*micro = %lld*%lld", (long long)t->batch,
               (long long)dp, (long long)micro);
    diag_hint("with `strategy = auto` on a mesh where the search finds no plan, dp is the device count");
    return -1;
  }
  return t->batch / (micro * dp);
}

bool train_graph(Graph *g, const TrainConf *t) {
  int64_t accum = accum_steps(t);
  if (accum >= 1 && t->strategy.tp > 1) vocab_pad(g, t->strategy.tp);
  if (accum < 1 || !ad_backward(g, accum) || !opt_lower(g, t) || !recompute_apply(g, t->strategy.recompute))
    return false;
  char err[512];
  if (!ir_verify(g, err, sizeof err)) cp_panic(__FILE__, __LINE__, "training graph fails ir_verify: %s", err);
  return true;
}
