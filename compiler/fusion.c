/* fusion.c: the fusion pass (see fusion.h for the rule and how the emitter uses the result).
 *
 * Three sweeps over the graph: count consumers, decide each fusable node's group root from the
 * last node to the first (a node's only consumer is always decided before it), then number the
 * groups in root order and build each group's CgKernel for codegen/llvm.c. */
#include "fusion.h"

#include <string.h>

bool fusion_kernel_op(OpId op, bool *unary, int *kop) {
  static const struct { OpId op; bool unary; int k; } map[] = {
      {OP_ADD, false, K_ADD},       {OP_SUB, false, K_SUB},         {OP_MUL, false, K_MUL},
      {OP_DIV, false, K_DIV},       {OP_MAXIMUM, false, K_MAXIMUM}, {OP_MINIMUM, false, K_MINIMUM},
      {OP_MOD, false, K_MOD},       {OP_FLOORDIV, false, K_FLOORDIV},
      {OP_EQ, false, K_EQ},         {OP_NE, false, K_NE},           {OP_LT, false, K_LT},
      {OP_LE, false, K_LE},         {OP_GT, false, K_GT},           {OP_GE, false, K_GE},
      {OP_NEG, true, K_NEG},        {OP_EXP, true, K_EXP},          {OP_LOG, true, K_LOG},
      {OP_SQRT, true, K_SQRT},      {OP_RSQRT, true, K_RSQRT},      {OP_TANH, true, K_TANH},
      {OP_SIGMOID, true, K_SIGMOID}, {OP_RELU, true, K_RELU},       {OP_GELU, true, K_GELU},
      {OP_SILU, true, K_SILU},      {OP_SQUARE, true, K_SQUARE},    {OP_POW, true, K_POW},
      {OP_ABS, true, K_ABS},        {OP_CLAMP_MIN, true, K_CLAMP_MIN}, {OP_CLAMP_MAX, true, K_CLAMP_MAX},
      {OP_ERF, true, K_ERF},        {OP_SIN, true, K_SIN},          {OP_COS, true, K_COS},
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (map[i].op == op) {
      *unary = map[i].unary;
      *kop = map[i].k;
      return true;
    }
  return false;
}

/* A rank-0 CONST, inlined into kernels as a constant (whatever its dtype: its value is fa[0]). */
static bool is_scalar_const(const Node *n) { return n->op == OP_CONST && n->shape.rank == 0; }

/* Values the program reads after the graph runs: they need their own buffer. */
static bool *graph_outputs(const Graph *g) {
  bool *out = cp_alloc(sizeof(bool) * (size_t)(g->n + 1));
  if (g->loss >= 0) out[g->loss] = true;
  if (g->grad_norm >= 0) out[g->grad_norm] = true;
  for (int i = 0; i < g->metrics.n; i++) out[g->metrics.a[i].node] = true;
  for (int i = 0; i < g->grads.n; i++)
    if (g->grads.a[i] >= 0) out[g->grads.a[i]] = true;
  return out;
}

/* The GRADs fusion.c writes as expressions (grad_expr): of the unary elementwise ops with the
 * kernels' op, of mul, sub (input b: -dy) and div when nothing broadcasts, and of where's branches
 * (a select of dy and 0) when cond and the branch have the output's shape. The gradients of
 * add and of sub's input a are dy itself (the emitter makes them views, not kernels). */
static bool grad_fusable(const Graph *g, const Node *n) {
  const Node *f = &g->nodes[n->fwd];
  bool unary;
  int kop;
  if (f->op == OP_WHERE) { /* cond and the input it selects for, without broadcasting */
    const Node *q = &g->nodes[f->in[0]], *x = &g->nodes[f->in[n->ia[0]]];
    return f->dtype == DT_F32 && q->dtype == DT_F32 && x->dtype == DT_F32 && shape_eq(&q->shape, &f->shape) &&
           shape_eq(&x->shape, &f->shape);
  }
  if (!fusion_kernel_op(f->op, &unary, &kop) || f->dtype != DT_F32) return false;
  for (int k = 0; k < f->nin; k++) {
    const Node *x = &g->nodes[f->in[k]];
    if (x->dtype != DT_F32 || !shape_eq(&x->shape, &f->shape)) return false;
  }
  if (unary) return true;
  return f->op == OP_MUL || f->op == OP_DIV || (f->op == OP_SUB && n->ia[0] == 1);
}

static bool fusable(const Graph *g, int i, const bool *outputs) {
  const Node *n = &g->nodes[i];
  bool unary;
  int kop;
  if (n->dtype != DT_F32 || outputs[i] || n->shape.rank > CG_MAX_RANK) return false;
  if (n->op == OP_GRAD) return grad_fusable(g, n);
  if (!(ir_ops[n->op].flags & OPF_ELEMENTWISE) || (n->op != OP_WHERE && !fusion_kernel_op(n->op, &unary, &kop)))
    return false;
  for (int k = 0; k < n->nin; k++) {
    const Node *x = &g->nodes[n->in[k]];
    if (x->dtype != DT_F32 && !is_scalar_const(x)) return false;
  }
  return true;
}

/* The PARAM or STATE whose memory node x is (through ASSIGN/ACCUM results), or -1. */
static int mem_base(const Graph *g, int x) {
  while (g->nodes[x].op == OP_ASSIGN || g->nodes[x].op == OP_ACCUM) x = g->nodes[x].in[0];
  OpId op = g->nodes[x].op;
  return op == OP_PARAM || op == OP_STATE ? x : -1;
}

/* A member is computed at its root's position r, not at its own i: joining is wrong when an
 * ASSIGN or ACCUM between the two overwrites a PARAM or STATE the member reads. */
static bool reads_stable(const Graph *g, int i, int r) {
  const Node *n = &g->nodes[i];
  for (int k = 0; k < n->nin; k++) {
    int b = mem_base(g, n->in[k]);
    if (b < 0) continue;
    for (int j = i + 1; j < r; j++) {
      const Node *w = &g->nodes[j];
      if ((w->op == OP_ASSIGN || w->op == OP_ACCUM) && mem_base(g, w->in[0]) == b) return false;
    }
  }
  return true;
}

/* root[i]: the root of node i's group, -1 when i is not fused. */
static int *assign_roots(const Graph *g) {
  int *nuse = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  int *user = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  int *root = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  bool *outputs = graph_outputs(g);
  for (int i = 0; i < g->n; i++)
    for (int k = 0; k < g->nodes[i].nin; k++) {
      int x = g->nodes[i].in[k];
      if (nuse[x] && user[x] == i) continue; /* x * x: one consumer */
      nuse[x]++;
      user[x] = i;
    }
  for (int i = g->n - 1; i >= 0; i--) {
    root[i] = -1;
    if (!fusable(g, i, outputs)) continue;
    root[i] = i;
    if (nuse[i] != 1) continue;
    int c = user[i], r = root[c];
    if (r >= 0 && g->nodes[c].role == g->nodes[i].role &&
        shape_eq(&g->nodes[i].shape, &g->nodes[r].shape) && reads_stable(g, i, r))
      root[i] = r;
  }
  return root;
}

/* ---- building a group's kernel ---------------------------------------------------------- */

typedef struct KBuild {
  const Graph *g;
  FusionGroup *gr;
  int *kidx;              /* per graph node: its kernel node index, -1 if none yet */
  VEC(CgNode) nodes;
  VEC(CgInput) inputs;
} KBuild;

static int push_node(KBuild *b, CgNode n) {
  VEC_PUSH(b->nodes, n);
  return b->nodes.n - 1;
}

/* The kernel node that reads graph node x from outside the group (a constant or an input). */
static int outside_value(KBuild *b, int x) {
  const Node *n = &b->g->nodes[x];
  if (b->kidx[x] >= 0) return b->kidx[x];
  if (is_scalar_const(n)) {
    b->kidx[x] = push_node(b, (CgNode){.kind = CG_CONST, .value = (float)n->fa[0]});
    return b->kidx[x];
  }
  CgInput in = {.rank = n->shape.rank};
  for (int d = 0; d < n->shape.rank; d++) in.shape[d] = n->shape.d[d];
  VEC_PUSH(b->inputs, in);
  VEC_PUSH(b->gr->leaves, x);
  b->kidx[x] = push_node(b, (CgNode){.kind = CG_INPUT, .input = b->inputs.n - 1});
  return b->kidx[x];
}

static int kconst(KBuild *b, double v) { return push_node(b, (CgNode){.kind = CG_CONST, .value = (float)v}); }
static int kun(KBuild *b, int op, int a) { return push_node(b, (CgNode){.kind = CG_UNARY, .op = op, .a = a}); }
static int kbin(KBuild *b, int op, int a, int c) {
  return push_node(b, (CgNode){.kind = CG_BINARY, .op = op, .a = a, .b = c});
}

/* d f(x)/dx of a unary op from x and y = f(x), as ref.c's unary_df computes it. gelu's
 * 0.5 (1 + tanh u) and 1 - tanh^2 u are written with s = sigmoid(2u) (2s and 4s(1-s)), which
 * avoids the cancellation of 1 + tanh u for negative x, as llvm.c's forward gelu does. */
static int unary_df(KBuild *b, const Node *f, int x, int y) {
  switch (f->op) {
  case OP_NEG: return kconst(b, -1);
  case OP_EXP: return y;
  case OP_LOG: return kbin(b, K_DIV, kconst(b, 1), x);
  case OP_SQRT: return kbin(b, K_DIV, kconst(b, 0.5), y);
  case OP_RSQRT: return kbin(b, K_DIV, kbin(b, K_MUL, kconst(b, -0.5), y), x);
  case OP_TANH: return kbin(b, K_SUB, kconst(b, 1), kbin(b, K_MUL, y, y));
  case OP_SIGMOID: return kbin(b, K_MUL, y, kbin(b, K_SUB, kconst(b, 1), y));
  case OP_RELU: return kbin(b, K_GT, x, kconst(b, 0));
  case OP_SILU: {
    int s = kun(b, K_SIGMOID, x);
    return kbin(b, K_MUL, s, kbin(b, K_ADD, kconst(b, 1), kbin(b, K_MUL, x, kbin(b, K_SUB, kconst(b, 1), s))));
  }
  case OP_GELU: {
    const double gs = 0.7978845608028654, gc = 0.044715; /* sqrt(2/pi), as ref.c's GELU_S, GELU_C */
    int x2 = kbin(b, K_MUL, x, x);
    int u2 = kbin(b, K_MUL, kconst(b, 2 * gs), kbin(b, K_ADD, x, kbin(b, K_MUL, kconst(b, gc), kbin(b, K_MUL, x2, x))));
    int s = kun(b, K_SIGMOID, u2);
    int du = kbin(b, K_MUL, kconst(b, gs), kbin(b, K_ADD, kconst(b, 1), kbin(b, K_MUL, kconst(b, 3 * gc), x2)));
    int t = kbin(b, K_MUL, kbin(b, K_MUL, kconst(b, 2), x), kbin(b, K_MUL, s, kbin(b, K_SUB, kconst(b, 1), s)));
    return kbin(b, K_ADD, s, kbin(b, K_MUL, t, du));
  }
  case OP_SQUARE: return kbin(b, K_MUL, kconst(b, 2), x);
  case OP_POW: {
    CgNode p = {.kind = CG_UNARY, .op = K_POW, .a = x, .value = (float)(f->fa[0] - 1)};
    return kbin(b, K_MUL, kconst(b, f->fa[0]), push_node(b, p));
  }
  case OP_ABS: return kbin(b, K_SUB, kbin(b, K_GT, x, kconst(b, 0)), kbin(b, K_LT, x, kconst(b, 0)));
  case OP_CLAMP_MIN: return kbin(b, K_GE, x, kconst(b, f->fa[0]));
  case OP_CLAMP_MAX: return kbin(b, K_LE, x, kconst(b, f->fa[0]));
  case OP_ERF: return kbin(b, K_MUL, kconst(b, 1.1283791670955126), kun(b, K_EXP, kun(b, K_NEG, kbin(b, K_MUL, x, x))));
  case OP_SIN: return kun(b, K_COS, x);
  case OP_COS: return kun(b, K_NEG, kun(b, K_SIN, x));
  default: cp_unreachable();
  }
}

/* A GRAD member (grad_fusable): dy times the partial derivative. */
static int grad_expr(KBuild *b, const Node *n) {
  const Node *f = &b->g->nodes[n->fwd];
  int dy = outside_value(b, n->in[0]);
  if (f->op == OP_SUB) return kun(b, K_NEG, dy);
  if (f->op == OP_NEG) return kun(b, K_NEG, dy);
  if (f->op == OP_WHERE) { /* dy where cond gives this input the element, else 0 */
    int q = outside_value(b, n->in[1]), zero = kconst(b, 0);
    bool a = n->ia[0] == 1;
    return push_node(b, (CgNode){.kind = CG_SELECT, .a = q, .b = a ? dy : zero, .c = a ? zero : dy});
  }
  /* the forward inputs as this GRAD reads them (n->in[1 + k]: under ZeRO 3 a param gathered again) */
  if (f->op == OP_MUL) return kbin(b, K_MUL, dy, outside_value(b, n->in[1 + (1 - n->ia[0])]));
  if (f->op == OP_DIV) {
    int a = outside_value(b, n->in[1]), d = outside_value(b, n->in[2]);
    if (n->ia[0] == 0) return kbin(b, K_MUL, dy, kbin(b, K_DIV, kconst(b, 1), d));
    return kbin(b, K_MUL, dy, kun(b, K_NEG, kbin(b, K_DIV, a, kbin(b, K_MUL, d, d))));
  }
  bool needs_y = f->op == OP_EXP || f->op == OP_SQRT || f->op == OP_RSQRT || f->op == OP_TANH || f->op == OP_SIGMOID;
  bool needs_x = !(f->op == OP_EXP || f->op == OP_SQRT || f->op == OP_TANH || f->op == OP_SIGMOID);
  int x = needs_x ? outside_value(b, n->in[1]) : -1, y = needs_y ? outside_value(b, n->fwd) : -1;
  return kbin(b, K_MUL, dy, unary_df(b, f, x, y));
}

static void add_member(KBuild *b, int m) {
  const Node *n = &b->g->nodes[m];
  if (n->op == OP_GRAD) {
    b->kidx[m] = grad_expr(b, n);
    return;
  }
  if (n->op == OP_WHERE) {
    int q = outside_value(b, n->in[0]), x = outside_value(b, n->in[1]), y = outside_value(b, n->in[2]);
    b->kidx[m] = push_node(b, (CgNode){.kind = CG_SELECT, .a = q, .b = x, .c = y});
    return;
  }
  int ops[2] = {-1, -1}, kop;
  bool unary;
  cp_assert(fusion_kernel_op(n->op, &unary, &kop) && n->nin == (unary ? 1 : 2));
  for (int k = 0; k < n->nin; k++) ops[k] = outside_value(b, n->in[k]);
  CgNode kn = {.kind = unary ? CG_UNARY : CG_BINARY, .op = kop, .a = ops[0], .b = ops[1]};
  if (n->op == OP_POW || n->op == OP_CLAMP_MIN || n->op == OP_CLAMP_MAX) kn.value = (float)n->fa[0];
  b->kidx[m] = push_node(b, kn);
}

static void build_kernel(const Graph *g, FusionGroup *gr, int *kidx) {
  KBuild b = {.g = g, .gr = gr, .kidx = kidx};
  for (int j = 0; j < gr->nodes.n; j++) add_member(&b, gr->nodes.a[j]);
  const Node *r = &g->nodes[gr->root];
  CgKernel *k = &gr->kernel;
  k->name = cp_fmt("k_ew_%d", gr->root);
  k->rank = r->shape.rank;
  for (int d = 0; d < r->shape.rank; d++) k->shape[d] = r->shape.d[d];
  k->inputs = b.inputs.a;
  k->ninputs = b.inputs.n;
  k->nodes = b.nodes.a;
  k->nnodes = b.nodes.n;
  /* leave kidx all -1 for the next group */
  for (int j = 0; j < gr->nodes.n; j++) kidx[gr->nodes.a[j]] = -1;
  for (int j = 0; j < gr->leaves.n; j++) kidx[gr->leaves.a[j]] = -1;
  for (int j = 0; j < gr->nodes.n; j++) {
    const Node *n = &g->nodes[gr->nodes.a[j]];
    for (int q = 0; q < n->nin; q++) kidx[n->in[q]] = -1;
  }
}

Fusion *fusion_run(const Graph *g) {
  Fusion *f = cp_alloc(sizeof *f);
  int *root = assign_roots(g);
  int *gid = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  f->group = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++)
    if (root[i] == i) gid[i] = f->ngroups++;
  f->groups = cp_alloc(sizeof(FusionGroup) * (size_t)(f->ngroups + 1));
  f->kernels = cp_alloc(sizeof(CgKernel) * (size_t)(f->ngroups + 1));
  for (int i = 0; i < g->n; i++) {
    f->group[i] = root[i] >= 0 ? gid[root[i]] : -1;
    if (root[i] < 0) continue;
    FusionGroup *gr = &f->groups[f->group[i]];
    VEC_PUSH(gr->nodes, i);
    gr->root = root[i];
  }
  int *kidx = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) kidx[i] = -1;
  for (int j = 0; j < f->ngroups; j++) {
    build_kernel(g, &f->groups[j], kidx);
    f->kernels[j] = f->groups[j].kernel;
  }
  return f;
}

bool fusion_is_root(const Fusion *f, int i) {
  int j = f->group[i];
  return j >= 0 && f->groups[j].root == i;
}

void fusion_print(FILE *out, const Graph *g, const Fusion *f) {
  for (int j = 0; j < f->ngroups; j++) {
    const FusionGroup *gr = &f->groups[j];
    fprintf(out, "group %d: root %%%d = %s, nodes", j, gr->root, ir_ops[g->nodes[gr->root].op].name);
    for (int k = 0; k < gr->nodes.n; k++) fprintf(out, " %%%d", gr->nodes.a[k]);
    fprintf(out, ", leaves");
    for (int k = 0; k < gr->leaves.n; k++) {
      int x = gr->leaves.a[k];
      bool bc = !shape_eq(&g->nodes[x].shape, &g->nodes[gr->root].shape);
      fprintf(out, " %%%d%s", x, bc ? " (broadcast)" : "");
    }
    fprintf(out, ", kernel %s\n", gr->kernel.name);
  }
}
