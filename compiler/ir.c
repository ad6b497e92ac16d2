/* ir.c: the Graph IR's plumbing: shapes and dtypes, building a graph node by
 * node, the structural verifier that runs after every pass, the IR printer
 * (`cplanc emit --stage=ir`), and per-node FLOP and byte counts. The op-specific
 * knowledge (shape rules, FLOPs) lives in ops.c, reached through ir_ops[]. */
#include "ir.h"

#include <stdarg.h>
#include <string.h>

#define MAX_NUMEL ((int64_t)1 << 62) /* the largest tensor a shape rule accepts */

/* ---- shapes and dtypes ------------------------------------------------------------ */

/* Saturates at INT64_MAX instead of overflowing: shape rules see user shapes
 * before anything has bounded them. */
int64_t shape_numel(const Shape *s) {
  int64_t n = 1;
  for (int k = 0; k < s->rank && k < CP_MAX_RANK; k++)
    if (__builtin_mul_overflow(n, s->d[k], &n)) return INT64_MAX;
  return n;
}

bool shape_eq(const Shape *a, const Shape *b) {
  if (a->rank != b->rank) return false;
  for (int k = 0; k < a->rank; k++)
    if (a->d[k] != b->d[k]) return false;
  return true;
}

long ir_shape_strs;

char *shape_str(const Shape *s) {
  ir_shape_strs++;
  StrBuf b = {0};
  sb_puts(&b, "[");
  for (int k = 0; k < s->rank && k < CP_MAX_RANK; k++) sb_printf(&b, "%s%lld", k ? ", " : "", (long long)s->d[k]);
  sb_puts(&b, "]");
  return (char *)sb_str(&b);
}

static const char *const dtype_names[DT__COUNT] = {[DT_F32] = "f32", [DT_BF16] = "bf16", [DT_F16] = "f16",
                                                  [DT_I32] = "i32"};
static const size_t dtype_sizes[DT__COUNT] = {[DT_F32] = 4, [DT_BF16] = 2, [DT_F16] = 2, [DT_I32] = 4};

static bool dtype_valid(DType t) { return (int)t >= 0 && t < DT__COUNT; }

const char *dtype_name(DType t) { return dtype_valid(t) ? dtype_names[t] : "?"; }

bool dtype_parse(const char *s, DType *out) {
  for (int t = 0; t < DT__COUNT; t++) {
    if (strcmp(s, dtype_names[t]) != 0) continue;
    if (out) *out = (DType)t;
    return true;
  }
  return false;
}

size_t dtype_size(DType t) { return dtype_valid(t) ? dtype_sizes[t] : 0; }

/* NumPy: align from the right; each pair of dims must be equal or contain a 1. */
bool shape_broadcast(const Shape *a, const Shape *b, Shape *out) {
  Shape o = {.rank = a->rank > b->rank ? a->rank : b->rank};
  for (int k = 1; k <= o.rank; k++) {
    int64_t x = k <= a->rank ? a->d[a->rank - k] : 1;
    int64_t y = k <= b->rank ? b->d[b->rank - k] : 1;
    if (x != y && x != 1 && y != 1) return false;
    o.d[o.rank - k] = x == 1 ? y : x;
  }
  *out = o;
  return true;
}

/* Writes a message into err and returns false. */
static bool bad(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static bool bad(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return false;
}

/* ---- building graphs ----------------------------------------------------------------- */

Graph *ir_new(const char *model_name) {
  Graph *g = cp_alloc(sizeof *g);
  g->loss = -1;
  g->grad_norm = -1;
  g->seed = -1;
  g->accum = 1;
  g->cur_layer = -1;
  g->model_name = model_name ? cp_strdup(model_name) : NULL;
  return g;
}

int ir_add(Graph *g, OpId op, const int *in, int nin, Span span) {
  cp_assert(op >= 0 && op < OP__COUNT && nin >= 0);
  if (g->n == g->cap) {
    int nc = g->cap ? 2 * g->cap : 64;
    g->nodes = cp_realloc(g->nodes, (size_t)g->cap * sizeof *g->nodes, (size_t)nc * sizeof *g->nodes);
    g->cap = nc;
  }
  Node *n = &g->nodes[g->n];
  memset(n, 0, sizeof *n);
  n->op = op;
  n->nin = nin;
  if (nin > 0) {
    for (int k = 0; k < nin; k++) cp_assert(in[k] >= 0 && in[k] < g->n);
    n->in = cp_alloc((size_t)nin * sizeof *n->in);
    memcpy(n->in, in, (size_t)nin * sizeof *n->in);
  }
  n->fwd = -1;
  n->layer = g->cur_layer;
  n->role = ROLE_FWD;
  n->span = span;
  return g->n++;
}

/* How many tensor inputs an op takes, from its signature: one per `:T` entry;
 * an `:L` entry makes it variadic (at least the fixed ones plus one). */
static void op_arity(OpId op, int *fixed, bool *variadic) {
  *fixed = 0;
  *variadic = false;
  const char *s = ir_ops[op].sig;
  if (!s) return;
  for (const char *p = strchr(s, ':'); p; p = strchr(p + 1, ':')) {
    size_t len = strcspn(p + 1, " =");
    if (len == 1 && p[1] == 'T') ++*fixed;
    if (len == 1 && p[1] == 'L') *variadic = true;
  }
}

static bool arity_ok(const Node *n, char *err, size_t errlen) {
  if (n->op == OP_GRAD) return true; /* its arity follows its forward node: the rule checks it */
  int fixed;
  bool variadic;
  op_arity(n->op, &fixed, &variadic);
  if (variadic ? n->nin >= fixed + 1 : n->nin == fixed) return true;
  if (n->op == OP_SDPA && n->nin == fixed + 1) return true; /* its key mask (shape_sdpa) */
  snprintf(err, errlen, "%s: expected %s%d input%s, got %d", ir_ops[n->op].name, variadic ? "at least " : "",
           variadic ? fixed + 1 : fixed, (variadic ? fixed + 1 : fixed) == 1 ? "" : "s", n->nin);
  return false;
}

bool ir_infer(Graph *g, int i, char *err, size_t errlen) {
  cp_assert(i >= 0 && i < g->n);
  Node *n = &g->nodes[i];
  if (!arity_ok(n, err, errlen)) return false;
  if (!ir_ops[n->op].shape(g, n, err, errlen)) return false;
  /* Broadcasting and embedding can multiply sizes past what any index type holds. */
  if (shape_numel(&n->shape) > MAX_NUMEL)
    return bad(err, errlen, "%s: the result %s has too many elements", ir_ops[n->op].name, shape_str(&n->shape));
  return true;
}

/* ---- verifying graphs ----------------------------------------------------------------- */

/* Re-runs a non-leaf node's shape rule on a copy: the stored shape, dtype and
 * (already canonical) attributes must come out unchanged. */
static bool verify_rule(const Graph *g, int i, char *err, size_t errlen) {
  const Node *n = &g->nodes[i];
  Node c = *n;
  char msg[512];
  if (!ir_ops[n->op].shape(g, &c, msg, sizeof msg))
    return bad(err, errlen, "node %%%d (%s): its shape rule fails: %s", i, ir_ops[n->op].name, msg);
  if (!shape_eq(&c.shape, &n->shape) || c.dtype != n->dtype)
    return bad(err, errlen, "node %%%d (%s): stored type %s%s, but the rule gives %s%s", i, ir_ops[n->op].name,
               dtype_name(n->dtype), shape_str(&n->shape), dtype_name(c.dtype), shape_str(&c.shape));
  if (memcmp(c.ia, n->ia, sizeof c.ia) != 0 || c.ndims != n->ndims ||
      (n->ndims > 0 && memcmp(c.dims, n->dims, sizeof(int64_t) * (size_t)n->ndims) != 0))
    return bad(err, errlen, "node %%%d (%s): attributes are not canonical (the shape rule changes them)", i,
               ir_ops[n->op].name);
  return true;
}

static bool verify_node(const Graph *g, int i, char *err, size_t errlen) {
  const Node *n = &g->nodes[i];
  if ((int)n->op < 0 || n->op >= OP__COUNT) return bad(err, errlen, "node %%%d: invalid op %d", i, (int)n->op);
  const OpInfo *op = &ir_ops[n->op];
  if (op->flags & OPF_MACRO)
    return bad(err, errlen, "node %%%d: '%s' is a macro and must be expanded before it reaches a graph", i, op->name);
  if (n->nin < 0 || (n->nin > 0 && !n->in)) return bad(err, errlen, "node %%%d (%s): bad input list", i, op->name);
  for (int k = 0; k < n->nin; k++)
    if (n->in[k] < 0 || n->in[k] >= i)
      return bad(err, errlen, "node %%%d (%s): input %d is %%%d, not an earlier node", i, op->name, k, n->in[k]);
  if (!dtype_valid(n->dtype)) return bad(err, errlen, "node %%%d (%s): invalid dtype %d", i, op->name, (int)n->dtype);
  if (n->shape.rank < 0 || n->shape.rank > CP_MAX_RANK)
    return bad(err, errlen, "node %%%d (%s): invalid rank %d", i, op->name, n->shape.rank);
  for (int k = 0; k < n->shape.rank; k++)
    if (n->shape.d[k] < 1) return bad(err, errlen, "node %%%d (%s): invalid shape %s", i, op->name, shape_str(&n->shape));
  if (n->layer < -1 || n->layer >= g->layer_names.n)
    return bad(err, errlen, "node %%%d (%s): layer %d out of range", i, op->name, n->layer);
  if (n->role != ROLE_FWD && n->role != ROLE_BWD && n->role != ROLE_UPD)
    return bad(err, errlen, "node %%%d (%s): invalid role %d", i, op->name, (int)n->role);
  if ((n->op == OP_PARAM || n->op == OP_INPUT || n->op == OP_STATE || n->op == OP_SCALAR_IN) && !n->name)
    return bad(err, errlen, "node %%%d (%s): has no name", i, op->name);
  if (n->op == OP_INPUT && (n->ia[1] < -1 || n->ia[1] >= n->shape.rank))
    return bad(err, errlen, "node %%%d (input '%s'): batch dim %lld out of range", i, n->name, (long long)n->ia[1]);
  if (n->op == OP_PARAM && (n->ia[0] < INIT_ZEROS || n->ia[0] > INIT_UNIFORM))
    return bad(err, errlen, "node %%%d (param '%s'): invalid init kind %lld", i, n->name, (long long)n->ia[0]);
  char msg[512];
  if (!arity_ok(n, msg, sizeof msg)) return bad(err, errlen, "node %%%d: %s", i, msg);
  if (op->flags & OPF_LEAF) {
    Node c = *n;
    if (!op->shape(g, &c, msg, sizeof msg)) return bad(err, errlen, "node %%%d: %s", i, msg);
    return true;
  }
  return verify_rule(g, i, err, errlen);
}

/* Checks a list of node indices that must all be of one op (params, inputs). */
static bool verify_list(const Graph *g, const int *a, int n, OpId want, const char *what, char *err, size_t errlen) {
  for (int k = 0; k < n; k++)
    if (a[k] < 0 || a[k] >= g->n || g->nodes[a[k]].op != want)
      return bad(err, errlen, "%s %d is %%%d, not a %s node", what, k, a[k], ir_ops[want].name);
  return true;
}

static bool verify_scalar(const Graph *g, int node, const char *what, char *err, size_t errlen) {
  if (node < 0 || node >= g->n) return bad(err, errlen, "%s is %%%d, not a node of the graph", what, node);
  if (g->nodes[node].shape.rank != 0)
    return bad(err, errlen, "%s %%%d is not a scalar: %s", what, node, shape_str(&g->nodes[node].shape));
  return true;
}

bool ir_verify(const Graph *g, char *err, size_t errlen) {
  if (g->n < 0 || (g->n > 0 && !g->nodes)) return bad(err, errlen, "graph has a bad node array");
  for (int i = 0; i < g->n; i++)
    if (!verify_node(g, i, err, errlen)) return false;
  if (!verify_list(g, g->params.a, g->params.n, OP_PARAM, "param", err, errlen) ||
      !verify_list(g, g->inputs.a, g->inputs.n, OP_INPUT, "input", err, errlen))
    return false;
  int nparams = 0;
  for (int i = 0; i < g->n; i++) nparams += g->nodes[i].op == OP_PARAM;
  if (nparams != g->params.n)
    return bad(err, errlen, "graph has %d param nodes but lists %d params", nparams, g->params.n);
  if (g->loss != -1 && !verify_scalar(g, g->loss, "loss", err, errlen)) return false;
  if (g->grad_norm != -1 && !verify_scalar(g, g->grad_norm, "grad_norm", err, errlen)) return false;
  if (!verify_list(g, g->states.a, g->states.n, OP_STATE, "state", err, errlen)) return false;
  if (g->grads.n != 0 && g->grads.n != g->params.n)
    return bad(err, errlen, "graph lists %d grads for %d params", g->grads.n, g->params.n);
  for (int k = 0; k < g->grads.n; k++) {
    int gi = g->grads.a[k];
    if (gi != -1 && (gi < 0 || gi >= g->n || !shape_eq(&g->nodes[gi].shape, &g->nodes[g->params.a[k]].shape)))
      return bad(err, errlen, "grad of param '%s' is %%%d, not a node of its shape", g->nodes[g->params.a[k]].name, gi);
  }
  for (int k = 0; k < g->metrics.n; k++)
    if (!verify_scalar(g, g->metrics.a[k].node, cp_fmt("metric '%s'", g->metrics.a[k].name), err, errlen))
      return false;
  return true;
}

/* ---- printing ----------------------------------------------------------------------------- */

static void print_init(StrBuf *b, const Node *n) {
  switch ((InitKind)n->ia[0]) {
  case INIT_ZEROS: sb_puts(b, " zeros"); return;
  case INIT_ONES: sb_puts(b, " ones"); return;
  case INIT_FULL: sb_printf(b, " full(%g)", n->fa[0]); return;
  case INIT_NORMAL: sb_printf(b, " normal(%g)", n->fa[0]); return;
  case INIT_UNIFORM: sb_printf(b, " uniform(%g, %g)", n->fa[0], n->fa[1]); return;
  }
  sb_printf(b, " init?%lld", (long long)n->ia[0]);
}

static void print_leaf(StrBuf *b, const Node *n) {
  if (n->op == OP_CONST) {
    sb_printf(b, " %g", n->fa[0]);
    return;
  }
  sb_printf(b, " \"%s\"", n->name ? n->name : "?");
  if (n->op == OP_PARAM) print_init(b, n);
  if (n->op == OP_PARAM && n->ia[1] > 0) /* vocab_pad's */
    sb_printf(b, ", valid_%s=%lld", n->ia[2] ? "columns" : n->shape.rank == 1 ? "entries" : "rows", (long long)n->ia[1]);
  if (n->op == OP_INPUT && n->ia[1] >= 0) sb_printf(b, ", batch_dim=%lld", (long long)n->ia[1]);
}

static void print_axes(StrBuf *b, const Node *n) {
  if (n->ndims < 0) {
    sb_puts(b, "all");
    return;
  }
  sb_puts(b, n->ndims == 1 ? "" : "(");
  for (int k = 0; k < n->ndims && k < CP_MAX_RANK; k++) sb_printf(b, "%s%lld", k ? ", " : "", (long long)n->dims[k]);
  sb_puts(b, n->ndims == 1 ? "" : ")");
}

/* Prints the non-tensor arguments as `name=value`, reading slots in signature
 * order as sema's binder fills them (ir.h). */
static void print_attrs(StrBuf *b, const Node *n) {
  const char *s = ir_ops[n->op].sig;
  int ni = 0, nf = 0;
  bool first = n->nin == 0;
  while (s && *s) {
    size_t len = strcspn(s, " ");
    const char *colon = memchr(s, ':', len);
    if (colon) {
      size_t nlen = (size_t)(colon - s), klen = strcspn(colon + 1, " =");
      const char *k = colon + 1;
      bool is = klen == 1 && (*k == 'i' || *k == 'b'), fl = klen == 1 && *k == 'f';
      bool ax = klen == 2 && k[0] == 'a' && k[1] == 'x', dm = klen == 1 && *k == 'D';
      if (is || fl || ax || dm) {
        sb_printf(b, "%s%.*s=", first ? " " : ", ", (int)nlen, s);
        first = false;
      }
      if (is && *k == 'b') sb_puts(b, n->ia[ni++] ? "true" : "false");
      else if (is) sb_printf(b, "%lld", (long long)n->ia[ni++]);
      else if (fl) sb_printf(b, "%g", n->fa[nf++]);
      else if (ax) print_axes(b, n);
      else if (dm) {
        Shape d = {.rank = n->ndims < 0 ? 0 : n->ndims > CP_MAX_RANK ? CP_MAX_RANK : n->ndims};
        memcpy(d.d, n->dims, sizeof(int64_t) * (size_t)d.rank);
        sb_puts(b, shape_str(&d));
      }
    }
    s += len;
    while (*s == ' ') s++;
  }
}

static void print_node(FILE *out, const Graph *g, int i) {
  const Node *n = &g->nodes[i];
  StrBuf b = {0};
  sb_printf(&b, "%%%d = %s", i, ir_ops[n->op].name);
  for (int k = 0; k < n->nin; k++) sb_printf(&b, "%s %%%d", k ? "," : "", n->in[k]);
  if (ir_ops[n->op].flags & OPF_LEAF) print_leaf(&b, n);
  else print_attrs(&b, n);
  if (n->op == OP_SOFTMAX && n->ia[1]) sb_puts(&b, ", safe");
  sb_printf(&b, " : %s%s", dtype_name(n->dtype), shape_str(&n->shape));
  /* Then the comments: layer, role, source location, each after "  ; ". */
  StrBuf c = {0};
  if (n->layer >= 0 && n->layer < g->layer_names.n) sb_printf(&c, "  ; layer %s", g->layer_names.a[n->layer]);
  if (n->role != ROLE_FWD) sb_puts(&c, n->role == ROLE_BWD ? "  ; backward" : "  ; update");
  if (n->span.file >= 0 && n->span.file < src_count()) {
    int ln, col;
    src_linecol(n->span.file, n->span.lo, &ln, &col);
    sb_printf(&c, "  ; %s:%d:%d", src_path(n->span.file), ln, col);
  }
  const char *line = sb_str(&b), *comments = sb_str(&c);
  int pad = *comments ? 46 - (int)strlen(line) : 0;
  fprintf(out, "%s%*s%s\n", line, pad < 1 ? 1 : pad, "", comments[0] ? comments + 1 : "");
}

static const char *plural(int n, const char *word) { return cp_fmt("%d %s%s", n, word, n == 1 ? "" : "s"); }

void ir_print(FILE *out, const Graph *g) {
  int64_t nparam = 0;
  for (int k = 0; k < g->params.n; k++) nparam += shape_numel(&g->nodes[g->params.a[k]].shape);
  fprintf(out, "; graph %s (batch %lld): %s, %s (%s values), %s\n", g->model_name ? g->model_name : "?",
          (long long)g->batch, plural(g->n, "node"), plural(g->params.n, "param"), cp_commas(nparam),
          plural(g->inputs.n, "input"));
  for (int i = 0; i < g->n; i++) print_node(out, g, i);
  if (g->loss >= 0) fprintf(out, "; loss = %%%d\n", g->loss);
  else fputs("; loss: none\n", out);
  for (int k = 0; k < g->metrics.n; k++)
    fprintf(out, "; metric %s = %%%d\n", g->metrics.a[k].name, g->metrics.a[k].node);
}

/* ---- costs ----------------------------------------------------------------------------------- */

double ir_node_flops(const Graph *g, int i) {
  cp_assert(i >= 0 && i < g->n);
  return ir_ops[g->nodes[i].op].flops(g, &g->nodes[i]);
}

int64_t ir_seq_len(const Graph *g) {
  if (g->inputs.n == 0) return 0;
  const Node *in = &g->nodes[g->inputs.a[0]];
  bool seq = in->shape.rank >= 3 || (in->shape.rank == 2 && in->dtype == DT_I32);
  return seq ? in->shape.d[1] : 0;
}

double ir_node_bytes(const Graph *g, int i) {
  cp_assert(i >= 0 && i < g->n);
  const Node *n = &g->nodes[i];
  return (double)shape_numel(&n->shape) * (double)dtype_size(n->dtype);
}

void ir_prune(Graph *g) {
  if (g->loss < 0) return;
  bool *live = cp_alloc(sizeof(bool) * (size_t)(g->n + 1));
  live[g->loss] = true;
  for (int k = 0; k < g->metrics.n; k++)
    if (g->metrics.a[k].node >= 0) live[g->metrics.a[k].node] = true;
  for (int i = g->n - 1; i >= 0; i--) { /* inputs come before their readers */
    const Node *n = &g->nodes[i];
    live[i] |= n->op == OP_PARAM || n->op == OP_INPUT;
    for (int k = 0; live[i] && k < n->nin; k++) live[n->in[k]] = true;
  }
  int *map = cp_alloc(sizeof(int) * (size_t)(g->n + 1)), m = 0;
  for (int i = 0; i < g->n; i++) {
    map[i] = live[i] ? m : -1;
    if (!live[i]) continue;
    Node *n = &g->nodes[i];
    for (int k = 0; k < n->nin; k++) n->in[k] = map[n->in[k]];
    g->nodes[m++] = *n;
  }
  if (m == g->n) return;
  g->n = m;
  for (int k = 0; k < g->params.n; k++) g->params.a[k] = map[g->params.a[k]];
  for (int k = 0; k < g->inputs.n; k++) g->inputs.a[k] = map[g->inputs.a[k]];
  for (int k = 0; k < g->metrics.n; k++)
    if (g->metrics.a[k].node >= 0) g->metrics.a[k].node = map[g->metrics.a[k].node];
  g->loss = map[g->loss];
}
