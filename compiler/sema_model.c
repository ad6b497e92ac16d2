/* sema_model.c: elaboration of a model into one flat Graph (sema_build_model).
 *
 * The model body runs once at compile time, as an interpreter would: every fn call
 * is inlined with that call's shapes, loops are unrolled (one layer per iteration
 * of the outermost loop), `if` picks a branch, and every tensor operation becomes a
 * Graph node whose shape rule (ops.c) is checked on the spot. Names follow Python:
 * a fn or model body is one scope, `if`/`for` bodies open none. Param paths follow
 * LANGUAGE.md §4 (call scopes `name = "..."` or FN_K, loop scopes LABEL.i).
 *
 * Errors bind V_ERR, which every later use propagates quietly, so one mistake is
 * reported once. Runaway elaboration (huge loops, exponential call trees) is cut
 * by fixed limits, never a hang. */
#include "sema_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum {
  MAX_NODES = 2000000,   /* a Graph larger than this is an error */
  MAX_LOOP = 100000,     /* iterations of one loop */
  MAX_WORK = 1000000,    /* statements, calls and loop iterations elaborated in one model */
  MAX_SIG = 8,           /* arguments of a primitive */
  MAX_DEPTH = 1000,      /* nesting of expressions and calls, well inside the C stack */
};

/* ---- state ------------------------------------------------------------------------ */

typedef struct FnCount {
  const char *fn;
  int n;
} FnCount;

/* A naming scope of param paths: the model root, a fn call, or a loop iteration. */
typedef struct PathScope {
  const char *path;      /* "" at the root, else "h.0.attn" */
  VEC(FnCount) counts;   /* unnamed calls per fn in this scope: FN_K */
} PathScope;

typedef struct Binding {
  const char *name;
  Value v;
} Binding;

/* One running body: the model's, or one fn call's. */
typedef struct Frame {
  const Item *item;      /* the fn or model */
  bool is_model;
  VEC(Binding) vars;     /* the one scope of the body */
  PathScope *scope;      /* current path scope (a loop iteration changes it) */
  Span site;             /* the call that opened the frame (the model: none) */
  bool returned;
  Value ret;
  struct Frame *caller;
} Frame;

typedef struct Build {
  Sema *s;
  Graph *g;
  int64_t batch;
  CpMap paths;         /* param path -> index into sites */
  VEC(Span) sites;       /* where each param path came from, for duplicate errors */
  VEC(Span) user_sites;  /* ... and the outermost call in the model's file (the warnings' note) */
  int loop_depth;        /* loops being unrolled, across calls: only depth 0 makes layers */
  int64_t work;
  int depth;             /* eval() recursion */
  int site_error;        /* diag_errors() just after an error reported at a call site ... */
  const void *site_frame;/* ... of this frame (so the call's backtrace note is not repeated) */
  bool stop;             /* a limit was hit: unwind without more errors */
  /* sdpa's attn_mask and attn_bias (call_sdpa): the call they belong to, and their values */
  const Expr *sdpa_call;
  Value sdpa_mask, sdpa_bias;
  bool sdpa_gqa; /* enable_gqa = true: k and v's heads repeated to q's (sdpa_gqa_heads) */
  double sdpa_dropout; /* dropout_p: on the probabilities, in the math form */
  double sdpa_scale;   /* scale: the scores' factor (0: none given, 1/sqrt(d)), as q times scale * sqrt(d) */
  int nce;             /* cross_entropy calls so far (each node's ordinal: ia[2], ce_count_sources) */
} Build;

static Value eval(Build *b, Frame *f, const Expr *e);
static void exec_block(Build *b, Frame *f, const Block *blk);

static bool halted(const Build *b) { return b->stop || diag_too_many(); }

static void limit_error(Build *b, Span at, const char *msg) {
  if (!b->stop) diag_error(at, "%s", msg);
  b->stop = true;
}

static bool count_work(Build *b, Span at) {
  if (++b->work <= MAX_WORK) return true;
  limit_error(b, at, cp_fmt("the model is too large to elaborate (more than %s statements and calls)",
                            cp_commas(MAX_WORK)));
  return false;
}

static Value tensor_val(int node, Span at) {
  return (Value){.kind = V_TENSOR, .node = node, .span = at};
}

static const Shape *shape_of(const Build *b, Value v) { return &b->g->nodes[v.node].shape; }

static const char *path_join(const char *a, const char *seg) {
  return a[0] ? cp_fmt("%s.%s", a, seg) : cp_strdup(seg);
}

static PathScope *new_scope(const char *path) {
  PathScope *ps = cp_alloc(sizeof *ps);
  ps->path = path;
  return ps;
}

/* K of the next unnamed call of `fn` in this scope. */
static int next_count(PathScope *ps, const char *fn) {
  for (int i = 0; i < ps->counts.n; i++)
    if (strcmp(ps->counts.a[i].fn, fn) == 0) return ps->counts.a[i].n++;
  VEC_PUSH(ps->counts, ((FnCount){fn, 1}));
  return 0;
}

/* ---- names ----------------------------------------------------------------------------- */

static Value *find_var(Frame *f, const char *name) {
  for (int i = f->vars.n - 1; i >= 0; i--)
    if (strcmp(f->vars.a[i].name, name) == 0) return &f->vars.a[i].v;
  return NULL;
}

static void bind(Frame *f, const char *name, Value v) {
  Value *p = find_var(f, name);
  if (p)
    *p = v;
  else
    VEC_PUSH(f->vars, ((Binding){name, v}));
}

static void hint_among(const char *name, const char *const *c, int n) {
  /* A name that differs only in case ('W' for the param 'w') first, then the closest by edits. */
  const char *best = NULL;
  for (int i = 0; i < n && !best; i++)
    if (c[i] && strcmp(c[i], name) != 0 && strcasecmp(c[i], name) == 0) best = c[i];
  if (!best) best = cp_closest(name, c, n);
  if (best) diag_hint("did you mean '%s'?", best);
}

/* "did you mean" among the names in scope, consts and fns, and primitives. */
static void hint_name(Build *b, Frame *f, const char *name, bool calls) {
  VEC(const char *) c = {0};
  if (!calls)
    for (int i = 0; i < f->vars.n; i++) VEC_PUSH(c, f->vars.a[i].name);
  int n;
  const char *const *names = sema_item_names(b->s, IT_FN, &n);
  for (int i = 0; i < n; i++) VEC_PUSH(c, names[i]);
  if (!calls) {
    names = sema_item_names(b->s, IT_CONST, &n);
    for (int i = 0; i < n; i++) VEC_PUSH(c, names[i]);
  }
  names = ir_op_names(&n);
  for (int i = 0; i < n; i++) VEC_PUSH(c, names[i]);
  hint_among(name, c.a, c.n);
}

/* Generated from the stdlib .cplan files by tools/embed_stdlib.cmake (grammar/parse.c reads them). */
extern const struct cp_stdlib_file { const char *name; const char *text; } cp_stdlib[];
extern const int cp_stdlib_count;

/* The standard-library file (its import name) whose text defines `fn NAME(` at the start of a
 * line, or NULL: for the hint on a call of a stdlib fn without its import. */
static const char *stdlib_defining(const char *name) {
  size_t len = strlen(name);
  for (int i = 0; i < cp_stdlib_count && cp_stdlib[i].name; i++)
    for (const char *p = cp_stdlib[i].text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
      if (strncmp(p, "fn ", 3) == 0 && strncmp(p + 3, name, len) == 0 && p[3 + len] == '(') return cp_stdlib[i].name;
  return NULL;
}

/* Whether a body binds `name` anywhere (for the hint on a use before the binding). */
static bool block_binds(const Block *blk, const char *name) {
  for (int i = 0; i < blk->n; i++) {
    const Stmt *st = blk->stmts[i];
    if (!st) continue;
    for (int k = 0; k < st->nnames; k++)
      if (st->names[k] && strcmp(st->names[k], name) == 0) return true;
    if (block_binds(&st->body, name) || block_binds(&st->orelse, name)) return true;
  }
  return false;
}

static Value lookup_name(Build *b, Frame *f, const Expr *e) {
  Value *p = find_var(f, e->str);
  if (p) {
    Value v = *p;
    v.span = e->span;
    return v;
  }
  int i = sema_item_index(b->s, e->str);
  if (i >= 0) {
    const Item *it = sema_program(b->s)->items[i];
    if (it->kind == IT_CONST) return sema_const_of(b->s, i, e->span);
    diag_error(e->span, "%s '%s' is not a value", sema_item_kind_name(it->kind), e->str);
    if (it->kind == IT_FN) diag_hint("call it: %s(...)", e->str);
    return sema_v_err();
  }
  diag_error(e->span, "unknown name '%s'", e->str);
  if (sema_hint_python_name(e->str)) return sema_v_err();
  if (block_binds(&f->item->body, e->str))
    diag_hint("'%s' is bound later in '%s'; a name must be bound before it is used", e->str, f->item->name);
  else
    hint_name(b, f, e->str, false);
  return sema_v_err();
}

/* Whether a value can be used as an operand; reports the use of a fn's missing result. */
static bool usable(Value v) {
  if (v.kind == V_NONE) {
    diag_error(v.span, "'%s' returns nothing", v.s ? v.s : "this call");
    return false;
  }
  return v.kind != V_ERR;
}

/* ---- nodes ---------------------------------------------------------------------------- */

static int add_node(Build *b, OpId op, const int *in, int nin, Span at) {
  if (b->g->n >= MAX_NODES) {
    limit_error(b, at, cp_fmt("the model has more than %s nodes", cp_commas(MAX_NODES)));
    return -1;
  }
  int *copy = NULL;
  if (nin > 0) {
    copy = cp_alloc((size_t)nin * sizeof *copy);
    memcpy(copy, in, (size_t)nin * sizeof *copy);
  }
  return ir_add(b->g, op, copy, nin, at);
}

/* Runs the shape rule of the node just added; on a user error reports it and drops
 * the node so the graph stays well formed. */
static Value infer(Build *b, int idx, Span at) {
  char err[512];
  if (ir_infer(b->g, idx, err, sizeof err)) return tensor_val(idx, at);
  diag_error(at, "%s", err);
  if (idx == b->g->n - 1) b->g->n--;
  return sema_v_err();
}

static bool is_num(Value v) { return v.kind == V_INT || v.kind == V_FLOAT; }

/* A number used as a tensor: a rank-0 CONST taking the other operand's dtype, except
 * that a float next to an i32 tensor gives f32. */
static Value make_const(Build *b, Value v, int other, Span at) {
  DType dt = v.kind == V_FLOAT ? DT_F32 : DT_I32;
  if (other >= 0) {
    DType t = b->g->nodes[other].dtype;
    dt = (v.kind == V_FLOAT && t == DT_I32) ? DT_F32 : t;
  }
  int i = add_node(b, OP_CONST, NULL, 0, at);
  if (i < 0) return sema_v_err();
  Node *n = &b->g->nodes[i];
  n->shape.rank = 0;
  n->dtype = dt;
  n->fa[0] = v.kind == V_INT ? (double)v.i : v.f;
  return tensor_val(i, at);
}

/* ---- operators ----------------------------------------------------------------------- */

static OpId tensor_op(AstOp op) {
  switch (op) {
  case AOP_ADD: return OP_ADD;
  case AOP_SUB: return OP_SUB;
  case AOP_MUL: return OP_MUL;
  case AOP_DIV: return OP_DIV;
  case AOP_MOD: return OP_MOD;
  case AOP_FLOORDIV: return OP_FLOORDIV;
  case AOP_MATMUL: return OP_MATMUL;
  case AOP_EQ: return OP_EQ;
  case AOP_NE: return OP_NE;
  case AOP_LT: return OP_LT;
  case AOP_LE: return OP_LE;
  case AOP_GT: return OP_GT;
  case AOP_GE: return OP_GE;
  default: return OP__COUNT;
  }
}

/* An operand of an i32 `/` as the hint writes it converted: float(TEXT) for a tensor, an int
 * literal with ".0" (so `idx / 2` reads float(idx) / 2.0). */
static const char *div_operand(Value v, Span at) {
  const char *t = sema_span_text(at);
  if (v.kind == V_TENSOR) return cp_fmt("float(%s)", t);
  bool digits = *t != 0;
  for (const char *p = t; *p; p++) digits &= *p >= '0' && *p <= '9';
  return digits ? cp_fmt("%s.0", t) : t;
}

/* float(x) of an i32 tensor node: the new node, or -1 on an error (reported). */
static int to_float(Build *b, int x, Span at) {
  int i = add_node(b, OP_FLOAT, &x, 1, at);
  return i < 0 || infer(b, i, at).kind == V_ERR ? -1 : i;
}

/* PyTorch's type promotion: an i32 tensor meeting a float one in an elementwise op is converted
 * first (a float(x) node), so the op computes in float on every backend, as `idx * x` does in
 * PyTorch. in[0..n) are the operands; false on an error (reported). */
static bool promote_i32(Build *b, int *in, int n, Span at) {
  bool has_i = false, has_f = false;
  for (int k = 0; k < n; k++) {
    bool i32 = b->g->nodes[in[k]].dtype == DT_I32;
    has_i |= i32;
    has_f |= !i32;
  }
  if (!has_i || !has_f) return true;
  for (int k = 0; k < n; k++)
    if (b->g->nodes[in[k]].dtype == DT_I32 && (in[k] = to_float(b, in[k], at)) < 0) return false;
  return true;
}

static int expand_node(Build *b, int x, const int64_t *sizes, int R, Span at);

/* The batch dims (all but the last two) of a matmul operand: rank-1 operands have none. */
static Shape mm_batch(const Shape *s) {
  Shape r = {.rank = s->rank > 2 ? s->rank - 2 : 0};
  memcpy(r.d, s->d, sizeof(int64_t) * (size_t)r.rank);
  return r;
}

/* torch.matmul broadcasts the batch dims in full; the kernels take an operand that is shared (its
 * batch all 1s) or has every batch of the output. An operand between the two ([B, kv, 1, d, T]
 * against [B, kv, g, T, d], or a [h, d, d] weight under [B, h, T, d]) is expanded to the output's
 * batch first (expand's gradient sums it back). Which operand expands must not depend on the
 * micro-batch (the search prices every one on one graph structure), so a batch dim of 1 counts as
 * broadcast wherever the other operand's is not 1, and a shorter batch always does. false on an
 * error (reported). */
static bool matmul_broadcast(Build *b, int *in, Span at) {
  Shape s[2] = {b->g->nodes[in[0]].shape, b->g->nodes[in[1]].shape}, bt[2] = {mm_batch(&s[0]), mm_batch(&s[1])}, out;
  if (s[0].rank < 2 || s[1].rank < 2 || !shape_broadcast(&bt[0], &bt[1], &out)) return true; /* shape_matmul says */
  for (int k = 0; k < 2; k++) {
    const Shape *o = &bt[k], *p = &bt[1 - k];
    bool ones = true, partial = o->rank < out.rank;
    for (int j = 0; j < o->rank; j++) {
      int pj = j - (o->rank - p->rank);
      ones &= o->d[j] == 1;
      partial |= o->d[j] == 1 && pj >= 0 && p->d[pj] != 1;
    }
    if (ones || !partial) continue;
    int64_t sizes[CP_MAX_RANK];
    memcpy(sizes, out.d, sizeof(int64_t) * (size_t)out.rank);
    sizes[out.rank] = s[k].d[s[k].rank - 2], sizes[out.rank + 1] = s[k].d[s[k].rank - 1];
    if ((in[k] = expand_node(b, in[k], sizes, out.rank + 2, at)) < 0) return false;
  }
  return true;
}

/* xs, ys: the operands' source text (a returned value's span can lie in the fn that made it). */
static Value tensor_binary(Build *b, AstOp op, Value x, Value y, Span at, Span xs, Span ys) {
  OpId id = tensor_op(op);
  if (id == OP__COUNT) {
    diag_error(at, "'%s' is not defined on tensors", ast_op_text(op));
    if (op == AOP_AND || op == AOP_OR) diag_hint("use '*' (and) or maximum (or) on 0/1 tensors");
    return sema_v_err();
  }
  Value v[2] = {x, y};
  for (int k = 0; k < 2; k++) {
    if (v[k].kind == V_TENSOR) continue;
    if (!is_num(v[k])) {
      diag_error(at, "cannot apply '%s' to %s and %s", ast_op_text(op), sema_value_desc(x),
                 sema_value_desc(y));
      return sema_v_err();
    }
    v[k] = make_const(b, v[k], v[1 - k].node, v[k].span);
    if (v[k].kind == V_ERR) return v[k];
  }
  int in[2] = {v[0].node, v[1].node};
  if (id == OP_DIV && b->g->nodes[in[0]].dtype == DT_I32 && b->g->nodes[in[1]].dtype == DT_I32) {
    /* PyTorch's `/` divides exactly and gives a float; C's truncation would give other numbers. */
    diag_error(at, "'/' of i32 tensors is not supported: PyTorch divides exactly (a float result), where an i32 "
                   "division would truncate");
    diag_hint("convert to f32 first, as PyTorch's x.float(): %s / %s; or floor-divide: %s // %s", div_operand(x, xs),
              div_operand(y, ys), sema_span_text(xs), sema_span_text(ys));
    return sema_v_err();
  }
  if (id != OP_MATMUL && !promote_i32(b, in, 2, at)) return sema_v_err();
  if (id == OP_MATMUL && !matmul_broadcast(b, in, at)) return sema_v_err();
  int i = add_node(b, id, in, 2, at);
  return i < 0 ? sema_v_err() : infer(b, i, at);
}

static Value unary_i32(Build *b, OpId id, int x, Span at);

static Value eval_unary(Build *b, Frame *f, const Expr *e) {
  Value a = eval(b, f, e->lhs);
  if (!usable(a)) return sema_v_err();
  if (a.kind != V_TENSOR) return sema_fold_unary(e->op, a, e->span);
  if (e->op != AOP_NEG) {
    diag_error(e->span, "'%s' is not defined on tensors", ast_op_text(e->op));
    return sema_v_err();
  }
  if (b->g->nodes[a.node].dtype == DT_I32) return unary_i32(b, OP_NEG, a.node, e->span);
  int i = add_node(b, OP_NEG, &a.node, 1, e->span);
  return i < 0 ? sema_v_err() : infer(b, i, e->span);
}

static Value eval_binary(Build *b, Frame *f, const Expr *e) {
  Value x = eval(b, f, e->lhs);
  if (!usable(x)) return sema_v_err();
  /* `and`/`or` short-circuit on compile-time bools, as in Python. */
  if ((e->op == AOP_AND || e->op == AOP_OR) && x.kind == V_BOOL && (e->op == AOP_AND ? !x.i : x.i))
    return sema_v_bool(x.i, e->span);
  Value y = eval(b, f, e->rhs);
  if (!usable(y)) return sema_v_err();
  if (x.kind == V_TENSOR || y.kind == V_TENSOR)
    return tensor_binary(b, e->op, x, y, e->span, e->lhs->span, e->rhs->span);
  return sema_fold_binary(e->op, x, y, e->span);
}

static Value eval_seq(Build *b, Frame *f, const Expr *e) {
  Value v = {.kind = e->kind == EX_TUPLE ? V_TUPLE : V_LIST, .span = e->span};
  v.items = cp_alloc((size_t)(e->nitems + 1) * sizeof *v.items);
  v.nitems = e->nitems;
  bool bad = false;
  for (int i = 0; i < e->nitems; i++) {
    v.items[i] = eval(b, f, e->items[i]);
    bad |= !usable(v.items[i]);
  }
  return bad ? sema_v_err() : v;
}

/* ---- argument matching (fns, primitives, models, initializers) --------------------- */

static int find_str(const char *const *names, int n, const char *s) {
  for (int i = 0; i < n; i++)
    if (names[i] && strcmp(names[i], s) == 0) return i;
  return -1;
}

/* Matches a call's arguments to the callee's parameter names, positional then
 * keyword: slot[i] is the expression for parameter i, or NULL. The `name = "..."`
 * keyword every call accepts goes to *scope_name (when scope_name is not NULL and
 * the callee has no parameter of that name). Reports extra, unknown and repeated
 * arguments. */
/* Keyword arguments a primitive takes off the call itself before its signature's (ops.def):
 * sdpa's (call_sdpa) and cross_entropy's (call_cross_entropy). */
typedef struct OwnArgs {
  const char *callee;
  const char *names[5];
  int n;
} OwnArgs;
static const OwnArgs own_args[] = {
    {"sdpa", {"attn_mask", "attn_bias", "enable_gqa", "dropout_p", "scale"}, 5},
    {"cross_entropy", {"ignore_index", "label_smoothing"}, 2},
    {"gelu", {"approximate"}, 1},
};

static const OwnArgs *own_args_of(const char *callee) {
  for (size_t i = 0; i < sizeof own_args / sizeof own_args[0]; i++)
    if (strcmp(own_args[i].callee, callee) == 0) return &own_args[i];
  return NULL;
}

static bool match_args(const Expr *call, const char *callee, const char *const *pn, int np,
                       const Expr **slot, const Expr **scope_name) {
  bool ok = true;
  for (int i = 0; i < call->nitems; i++) {
    if (i >= np) {
      diag_error(call->items[i]->span, "'%s' takes %d argument%s, got %d", callee, np,
                 np == 1 ? "" : "s", call->nitems);
      if (strcmp(callee, "transpose") == 0) /* x.transpose(1, 2) */
        diag_hint("transpose(x) swaps the last two dims (PyTorch's x.transpose(-2, -1)); other axes: permute(x, [0, 2, 1, 3])");
      ok = false;
      break;
    }
    slot[i] = call->items[i];
  }
  for (int k = 0; k < call->nfields; k++) {
    const Field *fd = &call->fields[k];
    const char *kw = fd->name ? fd->name : "";
    int j = find_str(pn, np, kw);
    if (j < 0 && scope_name && strcmp(kw, "name") == 0 && !*scope_name) {
      *scope_name = fd->value;
      continue;
    }
    if (j < 0 && !(scope_name && strcmp(kw, "name") == 0)) {
      diag_error(fd->name_span, "'%s' has no parameter '%s'", callee, kw);
      const char *all[MAX_SIG + 2];
      int na = 0;
      for (int i = 0; i < np && na < MAX_SIG; i++) all[na++] = pn[i];
      const OwnArgs *own = own_args_of(callee);
      for (int i = 0; own && i < own->n; i++) all[na++] = own->names[i];
      const char *torch = ir_pytorch_hint(cp_fmt("%s.%s", callee, kw)); /* gelu(x, approximate = ...) */
      if (!torch) torch = ir_pytorch_hint(cp_fmt("*.%s", kw));
      /* PyTorch's names of parameters cplan has under another name */
      static const char *const renamed[][3] = {{"dim", "axis", "..."}, {"is_causal", "causal", "true"}};
      int rn = -1;
      for (int i = 0; i < 2 && rn < 0; i++)
        if (strcmp(kw, renamed[i][0]) == 0 && find_str(pn, np, renamed[i][1]) >= 0) rn = i;
      if (rn >= 0)
        diag_hint("cplan calls PyTorch's '%s' '%s': %s = %s", kw, renamed[rn][1], renamed[rn][1], renamed[rn][2]);
      else if (torch)
        diag_hint("leave out PyTorch's '%s': %s", kw, torch);
      else if (cp_closest(kw, all, na) || !na)
        hint_among(kw, all, na);
      else {
        const char *list = "";
        for (int i = 0; i < na; i++) list = cp_fmt("%s%s%s", list, i ? ", " : "", all[i]);
        diag_hint("the parameters of '%s': %s", callee, list);
      }
      ok = false;
    } else if (j < 0 || slot[j]) {
      diag_error(fd->name_span, "argument '%s' of '%s' is given twice", kw, callee);
      if (j >= 0) diag_note(slot[j]->span, "first given here");
      ok = false;
    } else {
      slot[j] = fd->value;
    }
  }
  return ok;
}

/* ---- user fn calls ------------------------------------------------------------------- */

static const char *type_desc(TypeKind k) {
  switch (k) {
  case TY_INT: return "an int";
  case TY_FLOAT: return "a float";
  case TY_BOOL: return "a bool";
  case TY_STR: return "a str";
  case TY_TENSOR: return "a tensor";
  case TY_UNKNOWN: break;
  }
  return "a value";
}

static bool parse_dtype(const char *name, Span at, DType *out) {
  if (dtype_parse(name, out)) return true;
  static const char *const names[] = {"f32", "bf16", "f16", "i32"};
  diag_error(at, "unknown dtype '%s'", name);
  /* PyTorch's names: torch.float32, torch.long ... */
  static const char *const torch[][2] = {{"float32", "f32"}, {"float", "f32"},  {"bfloat16", "bf16"}, {"float16", "f16"},
                                         {"half", "f16"},    {"int32", "i32"},  {"int64", "i32"},     {"long", "i32"},
                                         {"int", "i32"},     {"bool", "f32"},   {"fp32", "f32"},      {"fp16", "f16"}};
  for (size_t i = 0; i < sizeof torch / sizeof torch[0]; i++)
    if (strcmp(torch[i][0], name) == 0) {
      diag_hint("PyTorch's %s is %s here%s (the dtypes: f32, bf16, f16, i32)", name, torch[i][1],
                strcmp(name, "bool") == 0 ? " (a comparison's 1.0/0.0)" : strcmp(name, "int64") == 0 || strcmp(name, "long") == 0 ? ": integer tensors are i32" : "");
      return false;
    }
  hint_among(name, names, 4);
  return false;
}

/* The dims of a pattern as written: "[B, T, C]" (dtypes are checked and reported
 * separately). */
static const char *pattern_str(const TypeExpr *t) {
  StrBuf sb = {0};
  sb_puts(&sb, "[");
  for (int i = 0; i < t->ndims; i++) {
    if (i) sb_puts(&sb, ", ");
    sb_puts(&sb, sema_span_text(t->dims[i]->span));
  }
  sb_puts(&sb, "]");
  return sb_str(&sb);
}

/* Checks one dim of a pattern against `actual`; binds names not bound earlier in
 * the signature (frame cf). */
static bool match_dim(Build *b, Frame *cf, const Expr *d, int64_t actual) {
  if (d->kind == EX_NAME && strcmp(d->str, "_") == 0) return true;
  if (d->kind == EX_NAME) {
    Value *p = find_var(cf, d->str);
    if (!p) {
      bind(cf, d->str, sema_v_int(actual, d->span));
      return true;
    }
    return p->kind == V_INT && p->i == actual;
  }
  Value v = eval(b, cf, d);
  return v.kind == V_INT && v.i == actual;
}

static bool match_pattern(Build *b, Frame *cf, const char *callee, const Param *p, Value v, Span at) {
  const TypeExpr *t = p->type;
  const Node *n = &b->g->nodes[v.node];
  DType want;
  if (t->dtype && !parse_dtype(t->dtype, t->dtype_span, &want)) return false;
  if (t->dtype && want != n->dtype) {
    diag_error(at, "argument '%s' of '%s': expected dtype %s, got %s", p->name, callee,
               dtype_name(want), dtype_name(n->dtype));
    diag_note(p->span, "parameter '%s' declared here", p->name);
    return false;
  }
  for (int i = 1; i < t->ndims; i++)
    if (t->dims[i]->kind == EX_STAR) {
      diag_error(t->dims[i]->span, "'*' may only be the first dim of a pattern");
      return false;
    }
  Shape sh = n->shape;
  int star = t->ndims > 0 && t->dims[0]->kind == EX_STAR;
  int fixed = t->ndims - star;
  /* The dim names bound before this parameter, for the message: "[*, C] with C = 6". */
  StrBuf bound = {0};
  for (int j = star; j < t->ndims; j++) {
    const Expr *d = t->dims[j];
    const Value *pv = d->kind == EX_NAME ? find_var(cf, d->str) : NULL;
    if (pv && pv->kind == V_INT)
      sb_printf(&bound, "%s%s = %lld", bound.len ? ", " : " with ", d->str, (long long)pv->i);
  }
  bool ok = star ? sh.rank >= fixed : sh.rank == fixed;
  for (int j = 0; ok && j < fixed; j++)
    ok = match_dim(b, cf, t->dims[star + j], sh.d[sh.rank - fixed + j]);
  if (!ok) {
    diag_error(at, "argument '%s' of '%s': expected shape %s%s, got %s", p->name, callee,
               pattern_str(t), bound.len ? sb_str(&bound) : "", shape_str(&sh));
    diag_note(p->span, "parameter '%s' declared here", p->name);
  }
  return ok;
}

/* Type-checks a value for parameter p and binds it in the callee's frame. */
static bool bind_param(Build *b, Frame *cf, const char *callee, const Param *p, Value v, Span at) {
  if (!usable(v)) return false;
  const TypeExpr *t = p->type;
  bool ok = true;
  if (t) switch (t->kind) {
    case TY_INT: ok = v.kind == V_INT; break;
    case TY_FLOAT:
      if (v.kind == V_INT) v = sema_v_float((double)v.i, v.span);
      ok = v.kind == V_FLOAT;
      break;
    case TY_BOOL: ok = v.kind == V_BOOL; break;
    case TY_STR: ok = v.kind == V_STR; break;
    case TY_TENSOR:
      ok = v.kind == V_TENSOR;
      if (ok && !match_pattern(b, cf, callee, p, v, at)) return false;
      break;
    case TY_UNKNOWN: {
      static const char *const types[] = {"int", "float", "bool", "str"};
      diag_error(t->span, "unknown type '%s'", t->name ? t->name : "");
      hint_among(t->name ? t->name : "", types, 4);
      return false;
    }
    }
  if (!ok) {
    diag_error(at, "argument '%s' of '%s' must be %s, got %s", p->name, callee, type_desc(t->kind),
               sema_value_desc(v));
    diag_note(p->span, "parameter '%s' declared here", p->name);
    return false;
  }
  bind(cf, p->name, v);
  return true;
}

/* "recursive call of 'a': a -> b -> a" */
static void report_recursion(Frame *f, const Item *fn, const Expr *e) {
  VEC(const char *) chain = {0};
  for (Frame *c = f; c; c = c->caller) {
    VEC_PUSH(chain, c->item->name);
    if (c->item == fn) break;
  }
  StrBuf sb = {0};
  for (int i = chain.n - 1; i >= 0; i--) sb_printf(&sb, "%s -> ", chain.a[i]);
  sb_puts(&sb, fn->name);
  diag_error(e->name_span, "recursive call of '%s': %s", fn->name, sb_str(&sb));
  diag_hint("fn calls are inlined at compile time, so recursion is not allowed");
}

/* Evaluates a call's arguments in the caller's frame in source order (positional,
 * then keywords), into vals[] by slot; *name_val gets the `name` keyword. */
static bool eval_args(Build *b, Frame *f, const Expr *e, const Expr **slot, int np, Value *vals,
                      const Expr *name_e, Value *name_val) {
  bool ok = true;
  for (int k = 0; k < e->nitems + e->nfields; k++) {
    const Expr *a = k < e->nitems ? e->items[k] : e->fields[k - e->nitems].value;
    if (a == name_e) {
      *name_val = eval(b, f, a);
      ok &= usable(*name_val);
      continue;
    }
    int j = 0;
    while (j < np && slot[j] != a) j++;
    if (j == np) continue;
    vals[j] = eval(b, f, a);
    ok &= usable(vals[j]);
  }
  return ok;
}

/* The scope a call opens: `name = "..."`, else FN_K. */
static PathScope *call_scope(Frame *f, const Item *fn, const Expr *name_e, Value name_v, bool *ok) {
  const char *seg;
  if (name_e) {
    if (name_v.kind != V_STR || !name_v.s[0]) {
      if (name_v.kind != V_ERR)
        diag_error(name_e->span, "'name' must be a non-empty str, got %s", sema_value_desc(name_v));
      *ok = false;
      return NULL;
    }
    seg = name_v.s;
  } else {
    seg = cp_fmt("%s_%d", fn->name, next_count(f->scope, fn->name));
  }
  return new_scope(path_join(f->scope->path, seg));
}

static Value call_fn(Build *b, Frame *f, const Expr *e, const Item *fn) {
  if (!count_work(b, e->span)) return sema_v_err();
  for (Frame *c = f; c; c = c->caller)
    if (c->item == fn) {
      report_recursion(f, fn, e);
      return sema_v_err();
    }
  int np = fn->nparams;
  const char **pn = cp_alloc((size_t)(np + 1) * sizeof *pn);
  for (int j = 0; j < np; j++) pn[j] = fn->params[j].name;
  const Expr **slot = cp_alloc((size_t)(np + 1) * sizeof *slot);
  Value *vals = cp_alloc((size_t)(np + 1) * sizeof *vals);
  const Expr *name_e = NULL;
  Value name_v = {0};
  if (!match_args(e, fn->name, pn, np, slot, &name_e)) return sema_v_err();
  bool ok = eval_args(b, f, e, slot, np, vals, name_e, &name_v);
  PathScope *ps = call_scope(f, fn, name_e, name_v, &ok);
  if (!ok) return sema_v_err();

  Frame cf = {.item = fn, .scope = ps, .site = e->span, .caller = f};
  for (int j = 0; j < np; j++) {
    const Param *p = &fn->params[j];
    if (slot[j]) {
      ok &= bind_param(b, &cf, fn->name, p, vals[j], slot[j]->span);
    } else if (p->def) {
      /* A default sees the parameters bound before it. */
      ok &= bind_param(b, &cf, fn->name, p, eval(b, &cf, p->def), p->def->span);
    } else {
      diag_error(e->span, "missing argument '%s' of '%s'", p->name, fn->name);
      diag_note(p->span, "parameter '%s' declared here", p->name);
      ok = false;
    }
  }
  if (!ok) return sema_v_err();
  int errors = diag_errors(), group = diag_group_begin();
  exec_block(b, &cf, &fn->body);
  diag_group_end(group);
  /* Attaches to the last error of the body: a backtrace of the calls that led there. */
  if (diag_errors() > errors && !b->stop &&
      !(b->site_error == diag_errors() && b->site_frame == (const void *)&cf))
    diag_note(e->span, "in this call of '%s'", fn->name);
  if (!cf.returned)
    return diag_errors() > errors ? sema_v_err()
                                  : (Value){.kind = V_NONE, .s = fn->name, .span = e->span};
  Value r = cf.ret;
  r.span = e->span;
  return r;
}

/* ---- primitive calls ------------------------------------------------------------------- */

typedef enum ArgKind { AK_T, AK_L, AK_I, AK_F, AK_B, AK_AX, AK_D } ArgKind;

typedef struct SigArg {
  char name[32];
  ArgKind kind;
  bool has_def;
  char def[32];
} SigArg;

typedef struct Sig {
  SigArg a[MAX_SIG];
  const char *names[MAX_SIG];
  int n;
} Sig;

static ArgKind parse_kind(const char *k, OpId id) {
  static const char *const kinds[] = {"T", "L", "i", "f", "b", "ax", "D"};
  for (int i = 0; i < 7; i++)
    if (strcmp(k, kinds[i]) == 0) return (ArgKind)i;
  cp_panic(__FILE__, __LINE__, "op '%s': bad kind '%s' in its signature", ir_ops[id].name, k);
}

/* The parsed OpInfo.sig of an op (static storage: it outlives arena resets). */
static const Sig *op_sig(OpId id) {
  static Sig cache[OP__COUNT];
  static bool done[OP__COUNT];
  Sig *sg = &cache[id];
  if (done[id]) return sg;
  memset(sg, 0, sizeof *sg);
  const char *p = ir_ops[id].sig ? ir_ops[id].sig : "";
  while (*p) {
    while (*p == ' ') p++;
    if (!*p) break;
    cp_assert(sg->n < MAX_SIG);
    SigArg *a = &sg->a[sg->n];
    char kind[8] = {0};
    size_t i = 0;
    while (*p && *p != ':' && i + 1 < sizeof a->name) a->name[i++] = *p++;
    cp_assert(*p == ':');
    p++;
    for (i = 0; *p && *p != '=' && *p != ' ' && i + 1 < sizeof kind;) kind[i++] = *p++;
    a->kind = parse_kind(kind, id);
    if (*p == '=') {
      p++;
      a->has_def = true;
      for (i = 0; *p && *p != ' ' && i + 1 < sizeof a->def;) a->def[i++] = *p++;
    }
    sg->names[sg->n] = a->name;
    sg->n++;
  }
  done[id] = true;
  return sg;
}

static const char *usage(const char *op, const Sig *sg) {
  StrBuf sb = {0};
  sb_printf(&sb, "%s(", op);
  for (int i = 0; i < sg->n; i++) {
    sb_printf(&sb, "%s%s", i ? ", " : "", sg->a[i].name);
    if (sg->a[i].has_def) sb_printf(&sb, " = %s", sg->a[i].def);
  }
  sb_puts(&sb, ")");
  return sb_str(&sb);
}

static Value default_value(const SigArg *a, Span at) {
  switch (a->kind) {
  case AK_I: return sema_v_int(strtoll(a->def, NULL, 10), at);
  case AK_F: return sema_v_float(strtod(a->def, NULL), at);
  case AK_B: return sema_v_bool(strcmp(a->def, "true") == 0, at);
  case AK_AX:
    if (strcmp(a->def, "all") == 0) return (Value){.kind = V_STR, .s = "all", .span = at};
    return sema_v_int(strtoll(a->def, NULL, 10), at);
  default: cp_panic(__FILE__, __LINE__, "a default for a tensor argument '%s'", a->name);
  }
}

static const char *kind_desc(ArgKind k) {
  switch (k) {
  case AK_T: return "a tensor";
  case AK_L: return "a list of tensors";
  case AK_I: return "an int";
  case AK_F: return "a float";
  case AK_B: return "a bool";
  case AK_AX: return "an int, a tuple of ints or all";
  case AK_D: return "a list of ints";
  }
  return "a value";
}

/* The attributes and inputs a primitive call fills, in signature order. */
typedef struct PrimNode {
  VEC(int) in;
  int64_t ia[4];
  int nia;
  double fa[4];
  int nfa;
  int64_t dims[CP_MAX_RANK];
  int ndims;
} PrimNode;

/* Ints of a list, tuple or single int into out[] (at most CP_MAX_RANK). */
static bool int_list(Value v, bool single_ok, int64_t *out, int *n) {
  if (single_ok && v.kind == V_INT) {
    out[0] = v.i;
    *n = 1;
    return true;
  }
  if ((v.kind != V_LIST && v.kind != V_TUPLE) || v.nitems > CP_MAX_RANK) return false;
  for (int i = 0; i < v.nitems; i++) {
    if (v.items[i].kind != V_INT) return false;
    out[i] = v.items[i].i;
  }
  *n = v.nitems;
  return true;
}

/* Adds one bound argument to the node under construction; false on a type error. */
static bool put_arg(Build *b, PrimNode *pn, const SigArg *a, Value v, int other) {
  switch (a->kind) {
  case AK_T:
    if (is_num(v)) v = make_const(b, v, other, v.span);
    if (v.kind != V_TENSOR) return false;
    VEC_PUSH(pn->in, v.node);
    return true;
  case AK_L:
    if (v.kind != V_LIST && v.kind != V_TUPLE) return false;
    for (int i = 0; i < v.nitems; i++)
      if (v.items[i].kind != V_TENSOR) return false;
    for (int i = 0; i < v.nitems; i++) VEC_PUSH(pn->in, v.items[i].node);
    return true;
  case AK_I:
  case AK_B:
    if (v.kind != (a->kind == AK_I ? V_INT : V_BOOL)) return false;
    cp_assert(pn->nia < 4);
    pn->ia[pn->nia++] = v.i;
    return true;
  case AK_F:
    if (!is_num(v)) return false;
    cp_assert(pn->nfa < 4);
    pn->fa[pn->nfa++] = v.kind == V_INT ? (double)v.i : v.f;
    return true;
  case AK_AX:
    if (v.kind == V_STR && strcmp(v.s, "all") == 0) {
      pn->ndims = -1;
      return true;
    }
    return int_list(v, true, pn->dims, &pn->ndims);
  case AK_D: return int_list(v, false, pn->dims, &pn->ndims);
  }
  return false;
}

/* split(x, n, axis): n SLICE nodes, after the SPLIT rule validated the call on a
 * scratch node that never enters the graph. */
static Value expand_split(Build *b, const PrimNode *pn, Span at) {
  int x = pn->in.a[0];
  Node scratch = {.op = OP_SPLIT, .in = (int *)&x, .nin = 1, .layer = b->g->cur_layer, .span = at};
  scratch.ia[0] = pn->ia[0];
  scratch.ia[1] = pn->ia[1];
  char err[512];
  if (!ir_ops[OP_SPLIT].shape(b->g, &scratch, err, sizeof err)) {
    diag_error(at, "%s", err);
    return sema_v_err();
  }
  const Shape *sh = &b->g->nodes[x].shape;
  int64_t n = pn->ia[0], axis = pn->ia[1] < 0 ? pn->ia[1] + sh->rank : pn->ia[1];
  cp_assert(n >= 1 && axis >= 0 && axis < sh->rank);
  int64_t part = sh->d[axis] / n;
  Value t = {.kind = V_TUPLE, .span = at, .nitems = (int)n};
  t.items = cp_alloc((size_t)n * sizeof *t.items);
  for (int64_t k = 0; k < n; k++) {
    int i = add_node(b, OP_SLICE, &x, 1, at);
    if (i < 0) return sema_v_err();
    b->g->nodes[i].ia[0] = axis;
    b->g->nodes[i].ia[1] = k * part;
    b->g->nodes[i].ia[2] = (k + 1) * part;
    t.items[k] = infer(b, i, at);
    if (t.items[k].kind == V_ERR) return sema_v_err();
  }
  return t;
}

/* One node op(x, y) of a desugaring, inferred: y is a number (a CONST of x's dtype); sub is y - x. */
static Value desugar_binary(Build *b, OpId op, int x, Value y, Span at) {
  Value c = make_const(b, y, x, at);
  if (c.kind == V_ERR) return c;
  int in[2] = {x, c.node};
  if (op == OP_SUB) in[0] = c.node, in[1] = x;
  int i = add_node(b, op, in, 2, at);
  return i < 0 ? sema_v_err() : infer(b, i, at);
}

/* abs of an i32 tensor: maximum(x, 0 - x), with the i32 kernels every backend has (the abs
 * kernel is a float one; i32 values have no gradient). */
static Value abs_i32(Build *b, int x, Span at) {
  Value neg = desugar_binary(b, OP_SUB, x, sema_v_int(0, at), at);
  if (neg.kind == V_ERR) return neg;
  int in[2] = {x, neg.node};
  int i = add_node(b, OP_MAXIMUM, in, 2, at);
  return i < 0 ? sema_v_err() : infer(b, i, at);
}

/* neg, relu, square and abs of an i32 tensor keep i32, as in PyTorch, computed with the i32
 * arithmetic every backend has: 0 - x, maximum(x, 0), x * x, maximum(x, 0 - x). (The float math,
 * exp, sqrt, sigmoid, pow, ..., converts its i32 operand first: call_prim.) */
static Value unary_i32(Build *b, OpId id, int x, Span at) {
  if (id == OP_ABS) return abs_i32(b, x, at);
  if (id != OP_SQUARE) return desugar_binary(b, id == OP_NEG ? OP_SUB : OP_MAXIMUM, x, sema_v_int(0, at), at);
  int in[2] = {x, x};
  int i = add_node(b, OP_MUL, in, 2, at);
  return i < 0 ? sema_v_err() : infer(b, i, at);
}

/* cross_entropy(logits, targets, ignore_index = N): the targets equal to N become -1, the target
 * every backend's kernels ignore, by i32 arithmetic: z = 1 - min(|clamp(t) - N|, 1) is 1 exactly
 * where t == N (else 0), and t + z * (-1 - N) maps those to -1, leaving the others as they are (an
 * out-of-range target still reaches the kernels' check). t is clamped to ±(2^30 - 1) for the test
 * so that nothing overflows; |N| ≤ 10^9 < 2^30 - 1, so a clamped t never equals N. */
static Value ignore_index_targets(Build *b, int t, int64_t ig, Span at) {
  const int64_t lim = (INT64_C(1) << 30) - 1;
  Value v = desugar_binary(b, OP_MAXIMUM, t, sema_v_int(-lim, at), at);
  if (v.kind != V_ERR) v = desugar_binary(b, OP_MINIMUM, v.node, sema_v_int(lim, at), at);
  if (v.kind != V_ERR) v = desugar_binary(b, OP_ADD, v.node, sema_v_int(-ig, at), at);
  if (v.kind != V_ERR) v = abs_i32(b, v.node, at);
  if (v.kind != V_ERR) v = desugar_binary(b, OP_MINIMUM, v.node, sema_v_int(1, at), at);
  if (v.kind != V_ERR) v = desugar_binary(b, OP_SUB, v.node, sema_v_int(1, at), at); /* 1 - min */
  if (v.kind != V_ERR) v = desugar_binary(b, OP_MUL, v.node, sema_v_int(-1 - ig, at), at);
  if (v.kind == V_ERR) return v;
  int in[2] = {t, v.node};
  int i = add_node(b, OP_ADD, in, 2, at);
  return i < 0 ? sema_v_err() : infer(b, i, at);
}

/* clamp(x, min, max), clamp_min, clamp_max: a clamp_min node (when there is a lower bound) then a
 * clamp_max node (an upper one), so min > max gives max everywhere as in PyTorch. An i32 tensor
 * with whole-number bounds is clamped with maximum/minimum of i32 constants (PyTorch keeps its
 * dtype); a fractional bound would make PyTorch's result float, which cplan asks to write. */
static Value expand_clamp(Build *b, int x, bool has_min, double lo, bool has_max, double hi, const char *opname,
                          Span at, Span xs) {
  Value v = tensor_val(x, at);
  if (b->g->nodes[x].dtype == DT_I32) {
    double bad = has_min && lo != floor(lo) ? lo : has_max && hi != floor(hi) ? hi : 0;
    if (bad != 0 || (has_min && fabs(lo) > 2147483647.0) || (has_max && fabs(hi) > 2147483647.0)) {
      diag_error(at, "%s of an i32 tensor with the bound %g: PyTorch's result would be float", opname,
                 bad != 0 ? bad : has_min ? lo : hi);
      diag_hint("convert first: %s(float(%s), ...), or use whole-number bounds", opname, sema_span_text(xs));
      return sema_v_err();
    }
    if (has_min) v = desugar_binary(b, OP_MAXIMUM, v.node, sema_v_int((int64_t)lo, at), at);
    if (has_max && v.kind != V_ERR) v = desugar_binary(b, OP_MINIMUM, v.node, sema_v_int((int64_t)hi, at), at);
    return v;
  }
  for (int k = 0; k < 2; k++) {
    if (!(k == 0 ? has_min : has_max)) continue;
    int i = add_node(b, k == 0 ? OP_CLAMP_MIN : OP_CLAMP_MAX, &v.node, 1, at);
    if (i < 0) return sema_v_err();
    b->g->nodes[i].fa[0] = k == 0 ? lo : hi;
    v = infer(b, i, at);
    if (v.kind == V_ERR) return v;
  }
  return v;
}

/* Evaluates one primitive argument; `axis = all` reads the word all. */
static Value eval_prim_arg(Build *b, Frame *f, const SigArg *a, const Expr *x) {
  if (a->kind == AK_AX && x->kind == EX_NAME && strcmp(x->str, "all") == 0 && !find_var(f, "all"))
    return (Value){.kind = V_STR, .s = "all", .span = x->span};
  return eval(b, f, x);
}

/* One node op(x) with the given dims (axes or a permutation) and ia[0], inferred. */
static int dims_node(Build *b, OpId op, int x, const int64_t *dims, int ndims, int64_t ia0, Span at) {
  int i = add_node(b, op, &x, 1, at);
  if (i < 0) return -1;
  Node *n = &b->g->nodes[i];
  n->ia[0] = ia0;
  n->ndims = ndims;
  if (ndims > 0) memcpy(n->dims, dims, sizeof(int64_t) * (size_t)ndims);
  return infer(b, i, at).kind == V_ERR ? -1 : i;
}

static int binary_node(Build *b, OpId op, int x, int y, Span at) {
  int in[2] = {x, y};
  int i = add_node(b, op, in, 2, at);
  return i < 0 || infer(b, i, at).kind == V_ERR ? -1 : i;
}

/* Is node i a boolean: 1.0/0.0 only, as a comparison gives (PyTorch's bool)? Comparisons, 0/1
 * constants, and what shape ops, products, minimum/maximum and where make of booleans. */
static bool is_bool_node(const Graph *g, int i) {
  const Node *n = &g->nodes[i];
  switch (n->op) {
  case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: return true;
  case OP_CONST: return n->dtype != DT_I32 && (n->fa[0] == 0 || n->fa[0] == 1);
  case OP_RESHAPE: case OP_PERMUTE: case OP_TRANSPOSE: case OP_SLICE: case OP_SPLIT_HEADS: case OP_MERGE_HEADS:
  case OP_CONCAT: case OP_MUL: case OP_MINIMUM: case OP_MAXIMUM: case OP_WHERE:
    for (int k = n->op == OP_WHERE; k < n->nin; k++)
      if (!is_bool_node(g, n->in[k])) return false;
    return true;
  default: return false;
  }
}

/* Does the mask or bias v (a tensor) broadcast to the scores' shape sc without growing it? */
static bool broadcasts_to(Build *b, Value v, const Shape *sc, const char *what) {
  const Shape *m = &b->g->nodes[v.node].shape;
  bool ok = m->rank <= sc->rank;
  for (int k = 1; ok && k <= m->rank; k++) ok = m->d[m->rank - k] == 1 || m->d[m->rank - k] == sc->d[sc->rank - k];
  if (!ok) {
    diag_error(v.span, "sdpa's %s %s does not broadcast to the scores [B, h, Tq, Tk] = %s", what, shape_str(m),
               shape_str(sc));
    if (strcmp(what, "attn_mask") == 0)
      diag_hint("a padding mask over the keys is [B, 1, 1, Tk]: reshape(idx != pad, [B, 1, 1, T])");
    else
      diag_hint("a bias per head is [h, Tq, Tk]; per sample and head [B, h, Tq, Tk]");
  }
  return ok;
}

/* An sdpa as PyTorch's math form: softmax(q @ kᵀ / sqrt(d) [+ attn_bias] [masked]) @ v, the
 * [Tq, Tk] scores in memory. It computes what the attention kernels do not take: values of another
 * width, an attn_mask other than a key mask (key_mask: that one becomes the kernels' 4th input),
 * attn_bias (call_sdpa; NULL without them), dropout_p (dropout > 0: a dropout of the probabilities)
 * and, on a GPU mesh, heads wider than its kernels (attn_max_d). causal masks as PyTorch's is_causal
 * does (top-left: query i sees keys j <= i), with where(arange(Tq)[:, None] >= arange(Tk), s, -inf);
 * attn_mask (1.0 attend, 0.0 not) with where(mask, s, -inf) after it. With a mask or bias, the
 * softmax is PyTorch's _safe_softmax (its math form from 2.5 on): a query row whose scores are all
 * -inf gives 0, as in the kernels, so that neither the row nor its gradient is NaN (softmax's
 * ia[1], which every backend's softmax kernel takes). */
static int repeat_node(Build *b, int x, int64_t r, int ax, Span at);

/* An attn_mask m (broadcasting to the scores [B, h, Tq, Tk]) that masks keys alone, [B | 1, 1, 1, Tk]
 * with the leading 1s left out (BERT's extended attention mask, PyTorch's key_padding_mask), as the
 * sdpa kernels' key mask km [B, Tk]: a reshape, then expand_node to B (always, so the nodes are the
 * same at every micro-batch). -1 for another mask, -2 after an error (reported). */
static int key_mask(Build *b, int m, int64_t batch, int64_t tk, Span at) {
  const Shape s = b->g->nodes[m].shape;
  int64_t have[4];
  for (int k = 0; k < 4; k++) have[k] = k < 4 - s.rank ? 1 : s.d[k - (4 - s.rank)];
  if (have[1] != 1 || have[2] != 1 || have[3] != tk) return -1;
  int64_t two[2] = {have[0], tk}, sizes[2] = {batch, tk};
  int x = dims_node(b, OP_RESHAPE, m, two, 2, 0, at);
  x = x < 0 ? -1 : expand_node(b, x, sizes, 2, at);
  return x < 0 ? -2 : x;
}

static Value sdpa_math(Build *b, int i, Span at, const Value *mask, const Value *bias, double dropout) {
  const Node n = b->g->nodes[i];
  const int64_t *Q = b->g->nodes[n.in[0]].shape.d, *K = b->g->nodes[n.in[1]].shape.d, *V = b->g->nodes[n.in[2]].shape.d;
  bool wide = b->s->attn_max_d > 0 && Q[3] > b->s->attn_max_d; /* the backend's kernels take no such heads */
  if (V[3] == Q[3] && !mask && !bias && !wide && dropout == 0) return tensor_val(i, at);
  const int64_t tq = Q[2], tk = K[2], d = Q[3], group = Q[1] / K[1];
  const Shape sc = {.rank = 4, .d = {Q[0], Q[1], tq, tk}};
  if ((mask && !broadcasts_to(b, *mask, &sc, "attn_mask")) || (bias && !broadcasts_to(b, *bias, &sc, "attn_bias")))
    return sema_v_err();
  b->g->n--;
  if (V[3] == Q[3] && mask && !bias && !wide && dropout == 0) { /* a key mask: the kernels take it */
    int km = key_mask(b, mask->node, Q[0], tk, at);
    if (km == -2) return sema_v_err();
    if (km >= 0) {
      int in[4] = {n.in[0], n.in[1], n.in[2], km};
      int s4 = add_node(b, OP_SDPA, in, 4, at);
      if (s4 < 0) return sema_v_err();
      b->g->nodes[s4].ia[0] = n.ia[0];
      return infer(b, s4, at);
    }
  }
  int kin = n.in[1], vin = n.in[2]; /* grouped-query: each key/value head repeated, as PyTorch's math form */
  if (group > 1 && ((kin = repeat_node(b, kin, group, 1, at)) < 0 || (vin = repeat_node(b, vin, group, 1, at)) < 0))
    return sema_v_err();
  int kt = dims_node(b, OP_TRANSPOSE, kin, NULL, 0, 0, at);
  int x = kt < 0 ? -1 : binary_node(b, OP_MATMUL, n.in[0], kt, at);
  if (x < 0) return sema_v_err();
  Value s = desugar_binary(b, OP_MUL, x, sema_v_float(1.0 / sqrt((double)d), at), at);
  if (s.kind != V_ERR && bias && (x = binary_node(b, OP_ADD, s.node, bias->node, at)) < 0) return sema_v_err();
  if (s.kind != V_ERR && bias) s = tensor_val(x, at);
  for (int pass = 0; pass < 2 && s.kind != V_ERR; pass++) {
    int m;
    if (pass == 0 && n.ia[0]) { /* causal */
      int64_t rq[2] = {tq, 1}, rk[2] = {1, tk};
      int aq = add_node(b, OP_ARANGE, NULL, 0, at), ak = aq < 0 ? -1 : add_node(b, OP_ARANGE, NULL, 0, at);
      if (ak < 0) return sema_v_err();
      b->g->nodes[aq].ia[0] = tq, b->g->nodes[ak].ia[0] = tk;
      if (infer(b, aq, at).kind == V_ERR || infer(b, ak, at).kind == V_ERR) return sema_v_err();
      if ((aq = dims_node(b, OP_RESHAPE, aq, rq, 2, 0, at)) < 0 || (ak = dims_node(b, OP_RESHAPE, ak, rk, 2, 0, at)) < 0)
        return sema_v_err();
      m = binary_node(b, OP_GE, aq, ak, at);
    } else if (pass == 1 && mask) {
      m = mask->node;
    } else {
      continue;
    }
    Value ninf = m < 0 ? sema_v_err() : make_const(b, sema_v_float(-INFINITY, at), s.node, at);
    if (ninf.kind == V_ERR) return ninf;
    int in[3] = {m, s.node, ninf.node};
    int w = add_node(b, OP_WHERE, in, 3, at);
    if (w < 0) return sema_v_err();
    s = infer(b, w, at);
  }
  if (s.kind == V_ERR) return s;
  /* With a mask or bias, PyTorch's _safe_softmax: a row with no key left is 0, not NaN (nor its
   * gradient, y (dy - sum(dy y)) with y = 0): the softmax node's ia[1] (ops.def). */
  int p = dims_node(b, OP_SOFTMAX, s.node, NULL, 0, -1, at);
  if (p >= 0 && (mask || bias)) b->g->nodes[p].ia[1] = 1;
  if (p >= 0 && dropout > 0) { /* PyTorch's dropout_p: on the probabilities */
    int dr = add_node(b, OP_DROPOUT, &p, 1, at);
    if (dr >= 0) b->g->nodes[dr].fa[0] = dropout;
    p = dr < 0 || infer(b, dr, at).kind == V_ERR ? -1 : dr;
  }
  int o = p < 0 ? -1 : binary_node(b, OP_MATMUL, p, vin, at);
  return o < 0 ? sema_v_err() : tensor_val(o, at);
}

static Value call_prim(Build *b, Frame *f, const Expr *e, OpId id);

/* A call without its own arguments (rest), and their values (got: kind V_ERR where absent). */
typedef struct OwnCall {
  Expr rest;
  Value got[5];
} OwnCall;

/* The call e as oc->rest, without the keyword arguments own_args_of(callee) names, whose values are
 * evaluated into oc->got; false after an error (reported). */
static bool take_own_args(Build *b, Frame *f, const Expr *e, const char *callee, OwnCall *oc) {
  const OwnArgs *own = own_args_of(callee);
  Expr *rest = &oc->rest;
  Value *got = oc->got;
  *rest = *e;
  rest->fields = cp_alloc(sizeof(Field) * (size_t)(e->nfields + 1));
  rest->nfields = 0;
  for (int j = 0; j < own->n; j++) got[j] = (Value){.kind = V_ERR};
  for (int k = 0; k < e->nfields; k++) {
    const Field *fd = &e->fields[k];
    int j = own->n;
    while (--j >= 0 && !(fd->name && strcmp(fd->name, own->names[j]) == 0)) {}
    if (j < 0) {
      rest->fields[rest->nfields++] = *fd;
      continue;
    }
    if (got[j].kind != V_ERR) {
      diag_error(fd->name_span, "argument '%s' of '%s' is given twice", fd->name, callee);
      return false;
    }
    got[j] = eval(b, f, fd->value);
    if (!usable(got[j])) return false;
  }
  return true;
}

/* sdpa(q, k, v, causal, attn_mask = m, attn_bias = a): PyTorch's attn_mask in its boolean form (m a
 * comparison's 1.0/0.0 or made of them: 1.0 takes part, as True does), and its float form, added
 * to the scores, under its own name attn_bias (a cplan tensor does not tell a boolean from a float).
 * Both broadcast to the scores [B, h, Tq, Tk]; the call is computed in the math form (sdpa_math). */
static Value call_sdpa(Build *b, Frame *f, const Expr *e) {
  OwnCall oc;
  if (!take_own_args(b, f, e, "sdpa", &oc)) return sema_v_err();
  Value mask = oc.got[0], bias = oc.got[1];
  for (int j = 0; j < 2; j++) {
    Value *v = &oc.got[j];
    bool is_mask = j == 0;
    if (v->kind == V_ERR) continue;
    if (v->kind != V_TENSOR || b->g->nodes[v->node].dtype == DT_I32) {
      diag_error(v->span, "argument '%s' of 'sdpa' must be a float tensor, got %s", own_args_of("sdpa")->names[j],
                 v->kind == V_TENSOR ? "an i32 tensor" : sema_value_desc(*v));
      if (is_mask) diag_hint("a mask is a comparison, 1.0 where a key takes part: attn_mask = %s != 0", sema_span_text(v->span));
      return sema_v_err();
    }
    if (is_mask && !is_bool_node(b->g, v->node)) {
      diag_error(v->span, "sdpa's attn_mask must be boolean, a comparison's 1.0/0.0 (PyTorch's bool mask: 1.0 takes part)");
      diag_hint("compare it (attn_mask = %s > 0.5); a float mask added to the scores is attn_bias = %s",
                sema_span_text(v->span), sema_span_text(v->span));
      return sema_v_err();
    }
  }
  Value gqa = oc.got[2], dp = oc.got[3];
  if (gqa.kind != V_ERR && gqa.kind != V_BOOL) {
    diag_error(gqa.span, "argument 'enable_gqa' of 'sdpa' must be a bool, got %s", sema_value_desc(gqa));
    return sema_v_err();
  }
  if (dp.kind != V_ERR && !is_num(dp)) {
    diag_error(dp.span, "argument 'dropout_p' of 'sdpa' must be a float, got %s", sema_value_desc(dp));
    return sema_v_err();
  }
  double p = dp.kind == V_ERR ? 0 : dp.kind == V_INT ? (double)dp.i : dp.f;
  if (!(p >= 0 && p < 1)) {
    diag_error(dp.span, "sdpa's dropout_p must lie in [0, 1), got %g", p);
    return sema_v_err();
  }
  Value sc = oc.got[4];
  if (sc.kind != V_ERR && !is_num(sc)) {
    diag_error(sc.span, "argument 'scale' of 'sdpa' must be a float, got %s", sema_value_desc(sc));
    return sema_v_err();
  }
  double scale = sc.kind == V_ERR ? 0 : sc.kind == V_INT ? (double)sc.i : sc.f;
  if (sc.kind != V_ERR && !(isfinite(scale) && scale > 0)) {
    diag_error(sc.span, "sdpa's scale must be a positive float, got %g", scale);
    return sema_v_err();
  }
  if (mask.kind == V_ERR && bias.kind == V_ERR && gqa.kind == V_ERR && p == 0 && scale == 0)
    return call_prim(b, f, &oc.rest, OP_SDPA);
  const Expr *outer = b->sdpa_call;
  Value om = b->sdpa_mask, ob = b->sdpa_bias;
  bool og = b->sdpa_gqa;
  double op = b->sdpa_dropout, os = b->sdpa_scale;
  b->sdpa_call = &oc.rest, b->sdpa_mask = mask, b->sdpa_bias = bias, b->sdpa_gqa = gqa.kind == V_BOOL && gqa.i;
  b->sdpa_dropout = p, b->sdpa_scale = scale;
  Value r = call_prim(b, f, &oc.rest, OP_SDPA);
  b->sdpa_call = outer, b->sdpa_mask = om, b->sdpa_bias = ob, b->sdpa_gqa = og, b->sdpa_dropout = op;
  b->sdpa_scale = os;
  return r;
}

/* gelu(x, approximate = "tanh"), PyTorch's argument: "tanh" (cplan's default, GPT-2's) is the GELU
 * op; "none" (PyTorch's default, exact) is 0.5 x (1 + erf(x / sqrt 2)), which fuses into one kernel. */
static Value call_gelu(Build *b, Frame *f, const Expr *e) {
  OwnCall oc;
  if (!take_own_args(b, f, e, "gelu", &oc)) return sema_v_err();
  Value ap = oc.got[0];
  if (ap.kind != V_ERR && (ap.kind != V_STR || (strcmp(ap.s, "tanh") != 0 && strcmp(ap.s, "none") != 0))) {
    diag_error(ap.span, "argument 'approximate' of 'gelu' must be \"tanh\" or \"none\", got %s",
               ap.kind == V_STR ? cp_fmt("\"%s\"", ap.s) : sema_value_desc(ap));
    return sema_v_err();
  }
  Value y = call_prim(b, f, &oc.rest, OP_GELU);
  if (y.kind != V_TENSOR || ap.kind == V_ERR || strcmp(ap.s, "tanh") == 0) return y;
  int x = b->g->nodes[y.node].in[0]; /* gelu's input, as call_prim converted it; the GELU node is dropped */
  cp_assert(y.node == b->g->n - 1);
  b->g->n--;
  Value s = desugar_binary(b, OP_MUL, x, sema_v_float(0.7071067811865476, e->span), e->span);
  int er = s.kind == V_ERR ? -1 : add_node(b, OP_ERF, &s.node, 1, e->span);
  if (er >= 0 && infer(b, er, e->span).kind == V_ERR) er = -1;
  Value h = er < 0 ? sema_v_err() : desugar_binary(b, OP_ADD, er, sema_v_float(1.0, e->span), e->span);
  Value xh = h.kind == V_ERR ? h : desugar_binary(b, OP_MUL, x, sema_v_float(0.5, e->span), e->span);
  int r = xh.kind == V_ERR ? -1 : binary_node(b, OP_MUL, xh.node, h.node, e->span);
  return r < 0 ? sema_v_err() : tensor_val(r, e->span);
}

/* Whether node i is the i32 constant v (a scalar). */
static bool is_i32_const(const Graph *g, int i, int64_t *v) {
  const Node *n = &g->nodes[i];
  if (n->op != OP_CONST || n->dtype != DT_I32 || n->shape.rank != 0) return false;
  *v = (int64_t)n->fa[0];
  return true;
}

/* where(x == c, -1, x) or where(x != c, x, -1): x with c ignored. Returns x, or -1. */
static int ignored_where(const Graph *g, int i, int64_t *c) {
  const Node *w = &g->nodes[i];
  if (w->op != OP_WHERE) return -1;
  const Node *cond = &g->nodes[w->in[0]];
  if (cond->op != OP_EQ && cond->op != OP_NE) return -1;
  int x = cond->in[0];
  if (!is_i32_const(g, cond->in[1], c)) {
    if (!is_i32_const(g, cond->in[0], c)) return -1;
    x = cond->in[1];
  }
  int64_t m;
  int keep = cond->op == OP_EQ ? 2 : 1, drop = 3 - keep;
  if (w->in[keep] != x || !is_i32_const(g, w->in[drop], &m) || m != -1) return -1;
  return x;
}

/* cross_entropy's mean is over the targets not ignored; under micro-batches and data parallelism the
 * runtime divides by their count over the whole step (docs/language.md, Batches), which it counts
 * in the data before the step: each cross_entropy node has its ordinal (ia[2] = k + 1, given as it is
 * made, call_cross_entropy; label_smoothing's term reads the same weight, a SCALAR_IN "ce_weight") and, when
 * its targets are a model input seen through reshapes, one slice of a dim other than the batch's,
 * ignore_index and where(t == c, -1, t), where the runtime finds them (dims[], ndims stays 0):
 * dims[0] = the input's ordinal + 1 (0: not countable, the runtime counts per micro-batch),
 * dims[1], dims[2] = values ignored besides -1 (-1: none), dims[3] = the sliced dim (-1: none),
 * dims[4], dims[5] = its range. Run last in sema_build_model (after ir_prune, before autodiff). */
static void ce_count_sources(Graph *g) {
  for (int i = 0; i < g->n; i++) {
    Node *ce = &g->nodes[i];
    if (ce->op != OP_CROSS_ENTROPY) continue;
    int64_t d[6] = {0, -1, -1, -1, 0, 0};
    int t = ce->in[1], nig = 0;
    if (ce->fa[1] == 1) d[1 + nig++] = (int64_t)ce->fa[0], t = g->nodes[t].in[0]; /* ignore_index_targets */
    ce->fa[0] = ce->fa[1] = 0;
    for (int steps = 0; steps < 64 && t >= 0; steps++) {
      const Node *n = &g->nodes[t];
      int64_t c;
      int x = ignored_where(g, t, &c);
      if (x >= 0) {
        if (c != -1 && c != d[1] && c != d[2]) {
          if (nig == 2) break;
          d[1 + nig++] = c;
        }
        t = x;
      } else if (n->op == OP_RESHAPE && d[3] < 0) {
        t = n->in[0];
      } else if (n->op == OP_SLICE && d[3] < 0) {
        d[3] = n->ia[0], d[4] = n->ia[1], d[5] = n->ia[2];
        t = n->in[0];
      } else if (n->op == OP_INPUT && n->dtype == DT_I32 && !(d[3] >= 0 && d[3] == n->ia[1])) {
        for (int q = 0; q < g->inputs.n; q++)
          if (g->inputs.a[q] == t) d[0] = q + 1;
        break;
      } else {
        break;
      }
    }
    if (d[0] == 0) d[1] = d[2] = d[3] = -1, d[4] = d[5] = 0;
    for (int q = 0; q < 6; q++) ce->dims[q] = d[q];
  }
}

/* cross_entropy(logits, targets, ignore_index = N, label_smoothing = e), PyTorch's arguments. N: the
 * targets equal to it become -1 (ignore_index_targets). e: (1 - e)·nll + e·mean over the classes of
 * -log_softmax(logits), both averaged over the rows not ignored: the cross_entropy node, then
 * sum(mean(-log_softmax(logits), -1) · keep) / sum(keep) with keep = (targets != -1) of the targets
 * the node reads. */
static Value call_cross_entropy(Build *b, Frame *f, const Expr *e) {
  OwnCall oc;
  if (!take_own_args(b, f, e, "cross_entropy", &oc)) return sema_v_err();
  Value ig = oc.got[0], eps = oc.got[1];
  if (ig.kind != V_ERR && ig.kind != V_INT) {
    diag_error(ig.span, "argument 'ignore_index' of 'cross_entropy' must be an int, got %s", sema_value_desc(ig));
    return sema_v_err();
  }
  if (ig.kind == V_INT && (ig.i < -1000000000 || ig.i > 1000000000)) {
    diag_error(ig.span, "ignore_index must lie within ±1e9, got %lld", (long long)ig.i);
    return sema_v_err();
  }
  if (eps.kind != V_ERR && !is_num(eps)) {
    diag_error(eps.span, "argument 'label_smoothing' of 'cross_entropy' must be a float, got %s", sema_value_desc(eps));
    return sema_v_err();
  }
  double ls = eps.kind == V_ERR ? 0 : eps.kind == V_INT ? (double)eps.i : eps.f;
  if (!(ls >= 0 && ls <= 1)) {
    diag_error(eps.span, "label_smoothing must lie in [0, 1], got %g", ls);
    return sema_v_err();
  }
  Value ce = call_prim(b, f, &oc.rest, OP_CROSS_ENTROPY);
  if (ce.kind == V_ERR) return ce;
  if (ig.kind == V_INT && ig.i != -1) { /* the node again, on the targets with ignore_index mapped to -1 */
    const Node n = b->g->nodes[ce.node];
    cp_assert(ce.node == b->g->n - 1);
    b->g->n--;
    Value t = ignore_index_targets(b, n.in[1], ig.i, ig.span);
    int i = t.kind == V_ERR ? -1 : binary_node(b, OP_CROSS_ENTROPY, n.in[0], t.node, e->span);
    if (i < 0) return sema_v_err();
    b->g->nodes[i].fa[0] = (double)ig.i, b->g->nodes[i].fa[1] = 1; /* for ce_count_sources */
    ce = tensor_val(i, e->span);
  }
  b->g->nodes[ce.node].ia[2] = ++b->nce;
  if (ls == 0) return ce;
  Span at = e->span;
  const Node n = b->g->nodes[ce.node];
  int lsm = dims_node(b, OP_LOG_SOFTMAX, n.in[0], NULL, 0, -1, at);
  int64_t last = -1;
  int per_row = lsm < 0 ? -1 : dims_node(b, OP_MEAN, lsm, &last, 1, 0, at); /* mean over the classes */
  Value keep = per_row < 0 ? sema_v_err() : desugar_binary(b, OP_NE, n.in[1], sema_v_int(-1, at), at);
  if (keep.kind == V_ERR) return keep;
  int kept = binary_node(b, OP_MUL, per_row, keep.node, at);
  int num = kept < 0 ? -1 : dims_node(b, OP_SUM, kept, NULL, -1, 0, at);
  int den = num < 0 ? -1 : dims_node(b, OP_SUM, keep.node, NULL, -1, 0, at);
  int ratio = den < 0 ? -1 : binary_node(b, OP_DIV, num, den, at); /* the mean of log p over classes, rows */
  /* over the step's counted rows, as the cross_entropy node's mean (its weight, RtRun.ce_weight) */
  int w = ratio < 0 ? -1 : add_node(b, OP_SCALAR_IN, NULL, 0, at);
  if (w >= 0) {
    Node *wn = &b->g->nodes[w];
    wn->shape.rank = 0, wn->dtype = DT_F32, wn->name = "ce_weight", wn->ia[0] = b->nce;
  }
  int smooth = w < 0 ? -1 : binary_node(b, OP_MUL, ratio, w, at);
  if (smooth < 0) return sema_v_err();
  Value a = desugar_binary(b, OP_MUL, ce.node, sema_v_float(1 - ls, at), at);
  Value c = a.kind == V_ERR ? a : desugar_binary(b, OP_MUL, smooth, sema_v_float(-ls, at), at);
  if (c.kind == V_ERR) return c;
  int r = binary_node(b, OP_ADD, a.node, c.node, at);
  return r < 0 ? sema_v_err() : tensor_val(r, at);
}

/* Whether node c is expand_node's mask: products and reshapes of arange(n) >= 0, true everywhere. */
static bool all_true(const Graph *g, int c) {
  const Node *n = &g->nodes[c];
  if (n->op == OP_RESHAPE) return all_true(g, n->in[0]);
  if (n->op == OP_MUL) return all_true(g, n->in[0]) && all_true(g, n->in[1]);
  const Node *a = n->op == OP_GE ? &g->nodes[n->in[0]] : NULL, *z = a ? &g->nodes[n->in[1]] : NULL;
  return a && a->op == OP_ARANGE && z->op == OP_CONST && z->fa[0] == 0;
}

/* The source of x when x repeats each head of a [B, hk, T, d] tensor r times in a row, as Hugging
 * Face's repeat_kv writes it (a dim of 1 inserted after the heads, expanded to r, merged back:
 * reshape(expand(reshape(k, [B, hk, 1, T, d]), [B, hk, r, T, d]), [B, hk * r, T, d])) and as
 * repeat_interleave(k, r, axis = 1) elaborates (expand is expand_node's where(ones, x, 0)); else -1. */
static int repeated_heads(const Graph *g, int x, int64_t *r) {
  const Node *m = &g->nodes[x], *e = m->nin ? &g->nodes[m->in[0]] : NULL;
  const Node *u = e && e->op == OP_WHERE ? &g->nodes[e->in[1]] : NULL;
  const Node *src = u && u->op == OP_RESHAPE ? &g->nodes[u->in[0]] : NULL;
  if (m->op != OP_RESHAPE || !src || src->shape.rank != 4 || e->shape.rank != 5 || u->shape.rank != 5 ||
      g->nodes[e->in[2]].op != OP_CONST || g->nodes[e->in[2]].fa[0] != 0 || !all_true(g, e->in[0]))
    return -1;
  const int64_t *S = src->shape.d, *E = e->shape.d, *U = u->shape.d, *M = m->shape.d;
  bool unsq = U[0] == S[0] && U[1] == S[1] && U[2] == 1 && U[3] == S[2] && U[4] == S[3];
  bool grown = E[0] == S[0] && E[1] == S[1] && E[3] == S[2] && E[4] == S[3];
  bool merged = M[0] == S[0] && M[1] == S[1] * E[2] && M[2] == S[2] && M[3] == S[3];
  if (!unsq || !grown || !merged || E[2] < 2) return -1;
  *r = E[2];
  return u->in[0];
}

/* Forms the backends compute only in a simpler shape, rewritten as PyTorch's results in that
 * shape: node i (inferred, the graph's last) is replaced. A sum, mean or max over axes that are not
 * adjacent (sum(x, axis = (0, 2))) becomes one reduction per run of adjacent axes, the last run
 * first so the earlier axes keep their numbers (a mean of equal-count means is the mean; max's
 * gradient still goes to the first maximal element in row-major order). A softmax or log_softmax
 * over an axis other than the last becomes a permute swapping it with the last, the op over the
 * last axis, and the same permute back. */
static Value rewrite_for_backends(Build *b, const Expr *call, int i, Span at) {
  const Node n = b->g->nodes[i];
  if (n.op == OP_SDPA) {
    bool own = call && call == b->sdpa_call; /* attn_mask / attn_bias of this call (not a nested one) */
    int64_t rk, rv;
    int sk = repeated_heads(b->g, n.in[1], &rk), sv = sk < 0 ? -1 : repeated_heads(b->g, n.in[2], &rv);
    if (sv >= 0 && rk == rv) /* k and v repeated alike: grouped-query attention (ir_prune drops the copies) */
      b->g->nodes[i].in[1] = sk, b->g->nodes[i].in[2] = sv;
    return sdpa_math(b, i, at, own && b->sdpa_mask.kind == V_TENSOR ? &b->sdpa_mask : NULL,
                     own && b->sdpa_bias.kind == V_TENSOR ? &b->sdpa_bias : NULL, own ? b->sdpa_dropout : 0);
  }
  if (n.nin != 1) return tensor_val(i, at);
  const int rank = b->g->nodes[n.in[0]].shape.rank;
  int x = n.in[0];
  if ((n.op == OP_SUM || n.op == OP_MEAN || n.op == OP_MAX) && n.ndims > 1) {
    bool adjacent = true;
    for (int k = 1; k < n.ndims; k++) adjacent &= n.dims[k] == n.dims[k - 1] + 1;
    if (adjacent) return tensor_val(i, at);
    b->g->n--; /* the dims are canonical and sorted (shape_reduce) */
    for (int hi = n.ndims - 1; hi >= 0;) {
      int lo = hi;
      while (lo > 0 && n.dims[lo - 1] == n.dims[lo] - 1) lo--;
      if ((x = dims_node(b, n.op, x, &n.dims[lo], hi - lo + 1, n.ia[0], at)) < 0) return sema_v_err();
      hi = lo - 1;
    }
    return tensor_val(x, at);
  }
  if ((n.op == OP_SOFTMAX || n.op == OP_LOG_SOFTMAX) && n.ia[0] != rank - 1) {
    b->g->n--; /* ia[0] is the canonical axis (shape_softmax) */
    int64_t perm[CP_MAX_RANK];
    for (int k = 0; k < rank; k++) perm[k] = k;
    perm[n.ia[0]] = rank - 1, perm[rank - 1] = n.ia[0];
    if ((x = dims_node(b, OP_PERMUTE, x, perm, rank, 0, at)) < 0 || (x = dims_node(b, n.op, x, NULL, 0, -1, at)) < 0 ||
        (x = dims_node(b, OP_PERMUTE, x, perm, rank, 0, at)) < 0)
      return sema_v_err();
    return tensor_val(x, at);
  }
  return tensor_val(i, at);
}

/* op(x) of a unary op, inferred: the node, or -1 on an error (reported). */
static int unary_node(Build *b, OpId op, int x, Span at) {
  if (op == OP_NEG && b->g->nodes[x].dtype == DT_I32) {
    Value v = unary_i32(b, OP_NEG, x, at);
    return v.kind == V_ERR ? -1 : v.node;
  }
  int i = add_node(b, op, &x, 1, at);
  return i < 0 || infer(b, i, at).kind == V_ERR ? -1 : i;
}

/* A reduction node over axes ax (the non-adjacent ones split as rewrite_for_backends does): the
 * node, or -1 on an error (reported). */
static int reduce_node(Build *b, OpId op, int x, const int64_t *ax, int nax, int64_t keep, Span at) {
  int i = dims_node(b, op, x, ax, nax, keep, at);
  Value v = i < 0 ? sema_v_err() : rewrite_for_backends(b, NULL, i, at);
  return v.kind == V_ERR ? -1 : v.node;
}

/* The reduction macros of ops.def (min, argmin, logsumexp, var, std) in the ops every backend
 * has; pn holds the call's arguments (axis in dims, keepdims in ia[0] but argmin's axis there,
 * var's correction in fa[0]). */
/* A macro's own shape rule on a scratch node of inputs in[0..nin) (*scratch: its canonical
 * attributes and shape), so that errors name the macro; false after an error. */
static bool macro_rule(Build *b, const PrimNode *pn, OpId id, int *in, int nin, Node *scratch, Span at) {
  *scratch = (Node){.op = id, .in = in, .nin = nin, .layer = b->g->cur_layer, .span = at, .ndims = pn->ndims};
  memcpy(scratch->ia, pn->ia, sizeof pn->ia);
  memcpy(scratch->dims, pn->dims, sizeof pn->dims);
  char err[512];
  if (ir_ops[id].shape(b->g, scratch, err, sizeof err)) return true;
  diag_error(at, "%s", err);
  return false;
}

static Value expand_reduction(Build *b, const PrimNode *pn, OpId id, Span at) {
  int x = pn->in.a[0], r = -1;
  Node scratch;
  if (!macro_rule(b, pn, id, &x, 1, &scratch, at)) return sema_v_err();
  const int64_t *ax = pn->dims;
  int nax = pn->ndims;
  int64_t keep = pn->ia[0];
  if (id == OP_MIN || id == OP_ARGMIN) {
    if (id == OP_ARGMIN && b->g->nodes[x].dtype == DT_I32 && (x = to_float(b, x, at)) < 0) return sema_v_err();
    int nx = unary_node(b, OP_NEG, x, at);
    if (nx >= 0 && id == OP_ARGMIN && (r = add_node(b, OP_ARGMAX, &nx, 1, at)) >= 0) {
      b->g->nodes[r].ia[0] = pn->ia[0];
      if (infer(b, r, at).kind == V_ERR) r = -1;
    }
    if (nx >= 0 && id == OP_MIN && (r = reduce_node(b, OP_MAX, nx, ax, nax, keep, at)) >= 0) r = unary_node(b, OP_NEG, r, at);
    return r < 0 ? sema_v_err() : tensor_val(r, at);
  }
  if (b->g->nodes[x].dtype == DT_I32 && (x = to_float(b, x, at)) < 0) return sema_v_err();
  if (id == OP_LOGSUMEXP) {
    int mk = reduce_node(b, OP_MAX, x, ax, nax, 1, at);
    int d = mk < 0 ? -1 : binary_node(b, OP_SUB, x, mk, at);
    int ex = d < 0 ? -1 : unary_node(b, OP_EXP, d, at);
    int sm = ex < 0 ? -1 : reduce_node(b, OP_SUM, ex, ax, nax, keep, at);
    int lg = sm < 0 ? -1 : unary_node(b, OP_LOG, sm, at);
    int m = lg < 0 ? -1 : reduce_node(b, OP_MAX, x, ax, nax, keep, at);
    r = m < 0 ? -1 : binary_node(b, OP_ADD, lg, m, at);
    return r < 0 ? sema_v_err() : tensor_val(r, at);
  }
  int mu = reduce_node(b, OP_MEAN, x, ax, nax, 1, at); /* var, std */
  int d = mu < 0 ? -1 : binary_node(b, OP_SUB, x, mu, at);
  int sq = d < 0 ? -1 : binary_node(b, OP_MUL, d, d, at);
  int ss = sq < 0 ? -1 : reduce_node(b, OP_SUM, sq, ax, nax, keep, at);
  if (ss < 0) return sema_v_err();
  double n = (double)shape_numel(&b->g->nodes[x].shape) / (double)shape_numel(&b->g->nodes[mu].shape);
  Value v = desugar_binary(b, OP_MUL, ss, sema_v_float(n - pn->fa[0] > 0 ? 1 / (n - pn->fa[0]) : NAN, at), at);
  if (v.kind == V_ERR || id == OP_VAR) return v;
  r = unary_node(b, OP_SQRT, v.node, at);
  return r < 0 ? sema_v_err() : tensor_val(r, at);
}

/* where(cond, a, b), inferred: the node or -1 (reported). */
static int where_node(Build *b, int cond, int x, int y, Span at) {
  int in[3] = {cond, x, y};
  int w = add_node(b, OP_WHERE, in, 3, at);
  return w < 0 || infer(b, w, at).kind == V_ERR ? -1 : w;
}

/* softplus, leaky_relu, elu and masked_fill (ops.def macros, PyTorch's; the forms are there). */
static Value expand_activation(Build *b, const PrimNode *pn, OpId id, Span at, Span mask_at) {
  int x = pn->in.a[0], r = -1;
  double a = pn->fa[0];
  if (id == OP_MASKED_FILL) {
    int m = pn->in.a[1], in[2] = {x, m};
    Node scratch;
    if (!macro_rule(b, pn, id, in, 2, &scratch, at)) return sema_v_err();
    if (!is_bool_node(b->g, m)) { /* PyTorch's mask is a bool tensor */
      diag_error(mask_at, "masked_fill's mask must be boolean, a comparison's 1.0/0.0 (PyTorch's bool tensor)");
      diag_hint("compare it: masked_fill(x, %s != 0, value)", sema_span_text(mask_at));
      return sema_v_err();
    }
    if (b->g->nodes[x].dtype == DT_I32 && a != floor(a)) {
      diag_error(at, "masked_fill of an i32 tensor needs a whole value, got %g (PyTorch would truncate it)", a);
      return sema_v_err();
    }
    Value v = make_const(b, b->g->nodes[x].dtype == DT_I32 ? sema_v_int((int64_t)a, at) : sema_v_float(a, at), x, at);
    r = v.kind == V_ERR ? -1 : where_node(b, m, v.node, x, at);
    return r < 0 ? sema_v_err() : tensor_val(r, at);
  }
  if (b->g->nodes[x].dtype == DT_I32 && (x = to_float(b, x, at)) < 0) return sema_v_err();
  if (id == OP_SOFTPLUS) {
    if (!(a > 0)) {
      diag_error(at, "softplus's beta must be positive, got %g", a);
      return sema_v_err();
    }
    Value bx = a == 1 ? tensor_val(x, at) : desugar_binary(b, OP_MUL, x, sema_v_float(a, at), at);
    int rl = bx.kind == V_ERR ? -1 : unary_node(b, OP_RELU, bx.node, at);
    int ab = rl < 0 ? -1 : unary_node(b, OP_ABS, bx.node, at), na = ab < 0 ? -1 : unary_node(b, OP_NEG, ab, at);
    int ex = na < 0 ? -1 : unary_node(b, OP_EXP, na, at);
    Value p1 = ex < 0 ? sema_v_err() : desugar_binary(b, OP_ADD, ex, sema_v_float(1.0, at), at);
    int lg = p1.kind == V_ERR ? -1 : unary_node(b, OP_LOG, p1.node, at);
    r = lg < 0 ? -1 : binary_node(b, OP_ADD, rl, lg, at);
    if (r >= 0 && a != 1) {
      Value s = desugar_binary(b, OP_MUL, r, sema_v_float(1 / a, at), at);
      r = s.kind == V_ERR ? -1 : s.node;
    }
    return r < 0 ? sema_v_err() : tensor_val(r, at);
  }
  Value pos = desugar_binary(b, OP_GT, x, sema_v_float(0.0, at), at), neg;
  if (pos.kind == V_ERR) return pos;
  if (id == OP_LEAKY_RELU) {
    neg = desugar_binary(b, OP_MUL, x, sema_v_float(a, at), at);
  } else { /* elu */
    Value m = desugar_binary(b, OP_MINIMUM, x, sema_v_float(0.0, at), at);
    int ex = m.kind == V_ERR ? -1 : unary_node(b, OP_EXP, m.node, at);
    Value em1 = ex < 0 ? sema_v_err() : desugar_binary(b, OP_ADD, ex, sema_v_float(-1.0, at), at);
    if (em1.kind == V_ERR) return em1;
    neg = a == 1 ? em1 : desugar_binary(b, OP_MUL, em1.node, sema_v_float(a, at), at);
  }
  r = neg.kind == V_ERR ? -1 : where_node(b, pos.node, x, neg.node, at);
  return r < 0 ? sema_v_err() : tensor_val(r, at);
}

/* stack(xs, axis) (ops.def macro): each x with a dim of 1 at axis, concatenated along it. */
static Value expand_stack(Build *b, const PrimNode *pn, Span at) {
  int n = pn->in.n, *in = cp_alloc(sizeof(int) * (size_t)(n ? n : 1));
  memcpy(in, pn->in.a, sizeof(int) * (size_t)n);
  Node scratch;
  if (!macro_rule(b, pn, OP_STACK, in, n, &scratch, at)) return sema_v_err();
  int axis = (int)scratch.ia[0];
  if (!promote_i32(b, in, n, at)) return sema_v_err(); /* torch.stack promotes as torch.cat */
  for (int k = 0; k < n; k++) {
    const Shape xs = b->g->nodes[in[k]].shape;
    int64_t d[CP_MAX_RANK];
    for (int j = 0, i = 0; j <= xs.rank; j++) d[j] = j == axis ? 1 : xs.d[i++];
    if ((in[k] = dims_node(b, OP_RESHAPE, in[k], d, xs.rank + 1, 0, at)) < 0) return sema_v_err();
  }
  int c = add_node(b, OP_CONCAT, in, n, at);
  if (c < 0) return sema_v_err();
  b->g->nodes[c].ia[0] = axis;
  return infer(b, c, at);
}

/* mse_loss, l1_loss and binary_cross_entropy_with_logits (ops.def macros): the mean over every
 * element of (x - y)^2, |x - y|, or relu(x) - x·y + log(1 + exp(-|x|)) (PyTorch's stable form). */
static Value expand_pair_loss(Build *b, const PrimNode *pn, OpId id, Span at) {
  int in[2] = {pn->in.a[0], pn->in.a[1]};
  Node scratch;
  if (!macro_rule(b, pn, id, in, 2, &scratch, at)) return sema_v_err();
  int x = in[0], y = in[1], r;
  if (b->g->nodes[y].dtype == DT_I32 && (y = to_float(b, y, at)) < 0) return sema_v_err();
  if (id == OP_BCE_WITH_LOGITS) {
    int xy = binary_node(b, OP_MUL, x, y, at), rl = xy < 0 ? -1 : unary_node(b, OP_RELU, x, at);
    int lin = rl < 0 ? -1 : binary_node(b, OP_SUB, rl, xy, at), ab = lin < 0 ? -1 : unary_node(b, OP_ABS, x, at);
    int na = ab < 0 ? -1 : unary_node(b, OP_NEG, ab, at), ex = na < 0 ? -1 : unary_node(b, OP_EXP, na, at);
    Value p1 = ex < 0 ? sema_v_err() : desugar_binary(b, OP_ADD, ex, sema_v_float(1.0, at), at);
    int lg = p1.kind == V_ERR ? -1 : unary_node(b, OP_LOG, p1.node, at);
    r = lg < 0 ? -1 : binary_node(b, OP_ADD, lin, lg, at);
  } else {
    int d = binary_node(b, OP_SUB, x, y, at);
    r = d < 0 ? -1 : unary_node(b, id == OP_MSE_LOSS ? OP_SQUARE : OP_ABS, d, at);
  }
  if (r >= 0) r = dims_node(b, OP_MEAN, r, NULL, -1, 0, at);
  return r < 0 ? sema_v_err() : tensor_val(r, at);
}

/* x broadcast to sizes (rank R >= x's; the dims that differ are 1 in x): a reshape adding the leading
 * 1s, then where(ones, x, 0) with ones the product of arange(n) >= 0 laid along each dim k, n the
 * grown size or 1. The nodes are the same whichever dims grow: a dim of size B grows at B = 1 only,
 * and the search prices every micro-batch on one graph structure (search.c solved_at). */
static int expand_node(Build *b, int x, const int64_t *sizes, int R, Span at) {
  const Shape xs = b->g->nodes[x].shape;
  int64_t have[CP_MAX_RANK] = {0};
  for (int k = 0; k < R; k++) have[k] = k < R - xs.rank ? 1 : xs.d[k - (R - xs.rank)];
  if (R != xs.rank && (x = dims_node(b, OP_RESHAPE, x, have, R, 0, at)) < 0) return -1;
  int cond = -1;
  for (int k = 0; k < R; k++) {
    int64_t sh[CP_MAX_RANK];
    for (int j = 0; j < R; j++) sh[j] = j == k && have[k] != sizes[k] ? sizes[k] : 1;
    int ar = add_node(b, OP_ARANGE, NULL, 0, at);
    if (ar < 0) return -1;
    b->g->nodes[ar].ia[0] = sh[k];
    Value zero = infer(b, ar, at).kind == V_ERR ? sema_v_err() : make_const(b, sema_v_int(0, at), ar, at);
    int one = zero.kind == V_ERR ? -1 : binary_node(b, OP_GE, ar, zero.node, at);
    if (one < 0 || (one = dims_node(b, OP_RESHAPE, one, sh, R, 0, at)) < 0) return -1;
    if (cond >= 0 && (one = binary_node(b, OP_MUL, cond, one, at)) < 0) return -1;
    cond = one;
  }
  if (cond < 0) return x;
  Value zero = make_const(b, sema_v_int(0, at), x, at);
  if (zero.kind == V_ERR) return -1;
  int in[3] = {cond, x, zero.node};
  int w = add_node(b, OP_WHERE, in, 3, at);
  return w < 0 || infer(b, w, at).kind == V_ERR ? -1 : w;
}

/* x with each element repeated r times in a row along axis ax: [.., n, 1, ..] grown to
 * [.., n, r, ..], then merged. */
static int repeat_node(Build *b, int x, int64_t r, int ax, Span at) {
  const Shape xs = b->g->nodes[x].shape;
  int64_t sizes[CP_MAX_RANK], out[CP_MAX_RANK];
  if (xs.rank >= CP_MAX_RANK) {
    diag_error(at, "repeat_interleave: x %s has %d dims; it needs one more, and a tensor has at most %d",
               shape_str(&xs), xs.rank, CP_MAX_RANK);
    return -1;
  }
  for (int k = 0, j = 0; k <= xs.rank; k++) sizes[k] = k == ax + 1 ? 1 : xs.d[j++];
  for (int k = 0; k < xs.rank; k++) out[k] = xs.d[k] * (k == ax ? r : 1);
  int y = dims_node(b, OP_RESHAPE, x, sizes, xs.rank + 1, 0, at);
  sizes[ax + 1] = r;
  if (y >= 0) y = expand_node(b, y, sizes, xs.rank + 1, at);
  return y < 0 ? -1 : dims_node(b, OP_RESHAPE, y, out, xs.rank, 0, at);
}

/* expand and repeat_interleave (ops.def macros) */
static Value expand_broadcast(Build *b, const PrimNode *pn, OpId id, Span at) {
  int x = pn->in.a[0];
  Node s;
  if (!macro_rule(b, pn, id, &x, 1, &s, at)) return sema_v_err();
  if (id == OP_EXPAND) {
    int r = expand_node(b, x, s.dims, s.ndims, at);
    return r < 0 ? sema_v_err() : tensor_val(r, at);
  }
  int y = repeat_node(b, x, s.ia[0], (int)s.ia[1], at);
  return y < 0 ? sema_v_err() : tensor_val(y, at);
}

/* sdpa(q, k, v, enable_gqa = true), PyTorch's: k and v [B, hk, T, d] with hk dividing q's heads hq
 * (query head i reads key/value head i / (hq / hk)). The attention kernels take the groups as they
 * are; the math form (sdpa_math) repeats k and v. Without enable_gqa, such heads get an error with
 * that hint. in: q, k, v. */
static bool sdpa_gqa_heads(Build *b, const int *in, bool gqa, Span at) {
  const Shape *q = &b->g->nodes[in[0]].shape, *k = &b->g->nodes[in[1]].shape, *v = &b->g->nodes[in[2]].shape;
  if (q->rank != 4 || k->rank != 4 || v->rank != 4 || q->d[1] == k->d[1] || k->d[1] != v->d[1]) return true;
  if (q->d[1] % k->d[1]) {
    diag_error(at, "sdpa: the key/value heads (%lld, k %s) must divide the query heads (%lld, q %s)%s",
               (long long)k->d[1], shape_str(k), (long long)q->d[1], shape_str(q), gqa ? " for enable_gqa" : "");
    return false;
  }
  if (!gqa) {
    diag_error(at, "sdpa: q %s has %lld heads and k %s %lld: grouped-query attention needs enable_gqa = true",
               shape_str(q), (long long)q->d[1], shape_str(k), (long long)k->d[1]);
    diag_hint("sdpa(q, k, v, enable_gqa = true), as PyTorch: each key/value head serves %lld query heads in a row",
              (long long)(q->d[1] / k->d[1]));
    return false;
  }
  return true;
}

static Value call_prim(Build *b, Frame *f, const Expr *e, OpId id) {
  const Sig *sg = op_sig(id);
  const char *opname = ir_ops[id].name;
  const Expr *slot[MAX_SIG] = {0};
  const Expr *name_e = NULL;
  if (!match_args(e, opname, sg->names, sg->n, slot, &name_e)) return sema_v_err();
  for (int j = 0; j < sg->n; j++)
    if (!slot[j] && !sg->a[j].has_def) {
      diag_error(e->span, "missing argument '%s' of '%s'", sg->a[j].name, opname);
      diag_hint("usage: %s", usage(opname, sg));
      return sema_v_err();
    }
  Value vals[MAX_SIG];
  bool ok = true;
  for (int k = 0; k < e->nitems + e->nfields; k++) {
    const Expr *x = k < e->nitems ? e->items[k] : e->fields[k - e->nitems].value;
    for (int j = 0; j < sg->n; j++)
      if (slot[j] == x) {
        vals[j] = eval_prim_arg(b, f, &sg->a[j], x);
        ok &= usable(vals[j]);
      }
  }
  if (!ok) return sema_v_err();
  if (id == OP_CLAMP && !slot[1] && !slot[2]) { /* PyTorch: "At least one of 'min' or 'max' must not be None" */
    diag_error(e->span, "clamp needs a bound: at least one of 'min' and 'max'");
    diag_hint("clamp(x, min = 0.0), clamp(x, max = 1.0) or clamp(x, -1.0, 1.0)");
    return sema_v_err();
  }
  int other = -1; /* the first tensor operand: numbers take its dtype (where's: a's or b's, not cond's) */
  for (int j = 0; j < sg->n; j++) {
    if (!slot[j]) vals[j] = default_value(&sg->a[j], e->span);
    if (other < 0 && sg->a[j].kind == AK_T && vals[j].kind == V_TENSOR && !(id == OP_WHERE && j == 0))
      other = vals[j].node;
  }
  if (id == OP_WHERE && other < 0 && vals[0].kind == V_TENSOR) other = vals[0].node;
  if (id == OP_ABS && vals[0].kind == V_INT) return sema_v_int(vals[0].i < 0 ? -vals[0].i : vals[0].i, e->span);
  if (id == OP_ABS && vals[0].kind == V_FLOAT) return sema_v_float(fabs(vals[0].f), e->span);
  if (id == OP_FLOAT) { /* Python's float() of a number; PyTorch's x.float() of an f32 tensor: itself */
    if (vals[0].kind == V_INT) return sema_v_float((double)vals[0].i, e->span);
    if (vals[0].kind == V_FLOAT) return vals[0];
    if (vals[0].kind == V_TENSOR && b->g->nodes[vals[0].node].dtype == DT_F32) return vals[0];
  }
  PrimNode pn = {0};
  for (int j = 0; j < sg->n; j++) {
    if (put_arg(b, &pn, &sg->a[j], vals[j], other)) continue;
    if (halted(b)) return sema_v_err();
    if ((sg->a[j].kind == AK_D || sg->a[j].kind == AK_AX) && (vals[j].kind == V_LIST || vals[j].kind == V_TUPLE) &&
        vals[j].nitems > CP_MAX_RANK)
      diag_error(vals[j].span, "argument '%s' of '%s' has %d dims: a tensor has at most %d", sg->a[j].name, opname,
                 vals[j].nitems, CP_MAX_RANK);
    else {
      int bad = -1; /* reshape(x, [B, T * C / 2.0]): the element that is not an int */
      for (int k = 0; (sg->a[j].kind == AK_D || sg->a[j].kind == AK_AX) && bad < 0 && k < vals[j].nitems &&
                      (vals[j].kind == V_LIST || vals[j].kind == V_TUPLE);
           k++)
        if (vals[j].items[k].kind != V_INT) bad = k;
      if (bad >= 0)
        diag_error(vals[j].items[bad].span, "argument '%s' of '%s' must be %s, but element %d is %s", sg->a[j].name,
                   opname, kind_desc(sg->a[j].kind), bad, sema_value_desc(vals[j].items[bad]));
      else
        diag_error(vals[j].span, "argument '%s' of '%s' must be %s, got %s", sg->a[j].name, opname,
                   kind_desc(sg->a[j].kind), sema_value_desc(vals[j]));
    }
    if ((id == OP_CLAMP || id == OP_CLAMP_MIN || id == OP_CLAMP_MAX) && vals[j].kind == V_TENSOR)
      diag_hint("clamp's bounds are numbers; with a tensor bound write maximum(x, lo) or minimum(x, hi)");
    if ((id == OP_MIN || id == OP_MAX) && vals[j].kind == V_TENSOR) /* PyTorch's torch.max(a, b) */
      diag_hint("%s reduces along an axis; elementwise, write %s(a, b)", opname, id == OP_MIN ? "minimum" : "maximum");
    if (id == OP_SPLIT && j == 1 && vals[j].kind == V_LIST) /* torch.split(x, [2, 6]): sizes */
      diag_hint("split(x, n) cuts n equal parts (torch.chunk); parts of other sizes are slices: slice(x, axis, start, end)");
    if (id == OP_LAYER_NORM && j == 1 && vals[j].kind == V_LIST) /* F.layer_norm(x, [C], w, b) */
      diag_hint("layer_norm normalizes the last dim and takes no normalized_shape: layer_norm(x, w, b)");
    return sema_v_err();
  }
  if (id == OP_SPLIT) return expand_split(b, &pn, e->span);
  if (id == OP_MIN || id == OP_ARGMIN || id == OP_LOGSUMEXP || id == OP_VAR || id == OP_STD)
    return expand_reduction(b, &pn, id, e->span);
  if (id == OP_EXPAND || id == OP_REPEAT_INTERLEAVE) return expand_broadcast(b, &pn, id, e->span);
  if (id == OP_MSE_LOSS || id == OP_L1_LOSS || id == OP_BCE_WITH_LOGITS) return expand_pair_loss(b, &pn, id, e->span);
  if (id == OP_SOFTPLUS || id == OP_LEAKY_RELU || id == OP_ELU || id == OP_MASKED_FILL)
    return expand_activation(b, &pn, id, e->span, pn.in.n > 1 ? vals[1].span : e->span);
  if (id == OP_STACK) return expand_stack(b, &pn, e->span);
  if (id == OP_UNSQUEEZE || id == OP_SQUEEZE || id == OP_FLATTEN) { /* a RESHAPE to the macro's shape */
    Node s;
    int x = pn.in.a[0];
    if (!macro_rule(b, &pn, id, &x, 1, &s, e->span)) return sema_v_err();
    int r = dims_node(b, OP_RESHAPE, x, s.shape.d, s.shape.rank, 0, e->span);
    return r < 0 ? sema_v_err() : tensor_val(r, e->span);
  }
  /* argmax of i32: the kernels compare floats, so its values as f32 (exact below 2^24) */
  if (id == OP_ARGMAX && b->g->nodes[pn.in.a[0]].dtype == DT_I32 && (pn.in.a[0] = to_float(b, pn.in.a[0], e->span)) < 0)
    return sema_v_err();
  if (id == OP_CLAMP || id == OP_CLAMP_MIN || id == OP_CLAMP_MAX) {
    bool has_min = id == OP_CLAMP_MIN || (id == OP_CLAMP && slot[1]);
    bool has_max = id == OP_CLAMP_MAX || (id == OP_CLAMP && slot[2]);
    double lo = id == OP_CLAMP_MAX ? -INFINITY : pn.fa[0], hi = id == OP_CLAMP ? pn.fa[1] : pn.fa[0];
    return expand_clamp(b, pn.in.a[0], has_min, lo, has_max, hi, opname, e->span, vals[0].span);
  }
  bool i32[3] = {false};
  for (int j = 0; j < pn.in.n && j < 3; j++) i32[j] = b->g->nodes[pn.in.a[j]].dtype == DT_I32;
  if (id == OP_WHERE && i32[0]) {
    diag_error(vals[0].span, "where's cond must be a comparison (1.0 where true, as PyTorch's bool), got an i32 tensor");
    diag_hint("compare it: where(%s != 0, ...)", sema_span_text(vals[0].span));
    return sema_v_err();
  }
  if (id == OP_WHERE && i32[1] && i32[2]) { /* i32, as torch.where; one i32 branch is promoted below */
  } else if (id == OP_WHERE || id == OP_MAXIMUM || id == OP_MINIMUM || id == OP_CONCAT) {
    int first = id == OP_WHERE; /* concat: torch.cat promotes its i32 inputs among float ones too */
    if (!promote_i32(b, pn.in.a + first, id == OP_CONCAT ? pn.in.n : 2, e->span)) return sema_v_err();
  } else if ((ir_ops[id].flags & OPF_ELEMENTWISE) && pn.in.n == 1 && i32[0] && id != OP_FLOAT) {
    if (id == OP_NEG || id == OP_RELU || id == OP_SQUARE || id == OP_ABS) return unary_i32(b, id, pn.in.a[0], e->span);
    if ((pn.in.a[0] = to_float(b, pn.in.a[0], e->span)) < 0) return sema_v_err(); /* exp(idx) is f32 */
  }
  if (id == OP_SDPA && !sdpa_gqa_heads(b, pn.in.a, e == b->sdpa_call && b->sdpa_gqa, e->span)) return sema_v_err();
  if (id == OP_SDPA && e == b->sdpa_call && b->sdpa_scale > 0) { /* PyTorch's scale: q times scale * sqrt(d) */
    const Shape *q = &b->g->nodes[pn.in.a[0]].shape;
    double c = b->sdpa_scale * sqrt((double)(q->rank ? q->d[q->rank - 1] : 1));
    Value qs = c == 1 ? tensor_val(pn.in.a[0], e->span) : desugar_binary(b, OP_MUL, pn.in.a[0], sema_v_float(c, e->span), e->span);
    if (qs.kind == V_ERR) return qs;
    pn.in.a[0] = qs.node;
  }
  int i = add_node(b, id, pn.in.a, pn.in.n, e->span);
  if (i < 0) return sema_v_err();
  Node *n = &b->g->nodes[i];
  memcpy(n->ia, pn.ia, sizeof pn.ia);
  memcpy(n->fa, pn.fa, sizeof pn.fa);
  memcpy(n->dims, pn.dims, sizeof pn.dims);
  n->ndims = pn.ndims;
  Value r = infer(b, i, e->span);
  return r.kind == V_ERR ? r : rewrite_for_backends(b, e, i, e->span);
}

/* ---- calls ------------------------------------------------------------------------------ */

static const char *const init_names[] = {"zeros", "ones", "full", "normal", "uniform"};

static Value eval_call(Build *b, Frame *f, const Expr *e) {
  const char *name = e->str ? e->str : "";
  int ii = sema_item_index(b->s, name);
  const Item *it = ii >= 0 ? sema_program(b->s)->items[ii] : NULL;
  if (it && it->kind == IT_FN) return call_fn(b, f, e, it);
  OpId id;
  const OpInfo *op = ir_op_by_name(name, &id);
  if (id == OP_SDPA) return call_sdpa(b, f, e);
  if (id == OP_CROSS_ENTROPY) return call_cross_entropy(b, f, e);
  if (id == OP_GELU) return call_gelu(b, f, e);
  if (op && op->sig && !(op->flags & OPF_LEAF)) return call_prim(b, f, e, id);
  if (it) {
    diag_error(e->name_span, "'%s' is a %s and cannot be called", name, sema_item_kind_name(it->kind));
    if (it->kind == IT_MODEL) diag_hint("a model is instantiated by a train block: model = %s(...)", name);
    return sema_v_err();
  }
  Value *local = find_var(f, name);
  if (local && local->kind == V_ERR) return sema_v_err();
  if (local) {
    diag_error(e->name_span, "'%s' is %s, not a function", name, sema_value_desc(*local));
    return sema_v_err();
  }
  diag_error(e->name_span, "unknown function '%s'", name);
  const char *lib = stdlib_defining(name);
  const char *torch = ir_pytorch_hint(name);
  if (find_str(init_names, 5, name) >= 0)
    diag_hint("'%s' initializes a param: param w: [n] = %s(...)", name, name);
  else if (lib)
    diag_hint("'%s' is defined in the standard library: add import \"%s\" (nothing is imported implicitly)", name, lib);
  else if (torch)
    diag_hint("for PyTorch's '%s', %s", name, torch);
  else
    hint_name(b, f, name, true);
  return sema_v_err();
}

static Value eval_expr(Build *b, Frame *f, const Expr *e) {
  switch (e->kind) {
  case EX_INT:
  case EX_FLOAT:
  case EX_QTY:
  case EX_STR:
  case EX_BOOL: return sema_eval_const(b->s, e);
  case EX_NAME: return lookup_name(b, f, e);
  case EX_UNARY: return eval_unary(b, f, e);
  case EX_BINARY: return eval_binary(b, f, e);
  case EX_CALL: return eval_call(b, f, e);
  case EX_TUPLE:
  case EX_LIST: return eval_seq(b, f, e);
  case EX_NAMED_LIST:
  case EX_OBJECT:
    diag_error(e->span, "%s are only used in settings", e->kind == EX_OBJECT ? "objects" : "named lists");
    return sema_v_err();
  case EX_STAR:
    diag_error(e->span, "'*' is only allowed first in a tensor pattern: [*, C]");
    return sema_v_err();
  }
  return sema_v_err();
}

static Value eval(Build *b, Frame *f, const Expr *e) {
  if (!e || halted(b)) return sema_v_err();
  if (b->depth >= MAX_DEPTH) {
    limit_error(b, e->span, cp_fmt("expressions and calls nest too deeply (more than %d levels)", MAX_DEPTH));
    return sema_v_err();
  }
  b->depth++;
  Value v = eval_expr(b, f, e);
  b->depth--;
  return v;
}

/* ---- statements ------------------------------------------------------------------------- */

/* A dim of an input or param: a positive compile-time int. */
static bool eval_dim(Build *b, Frame *f, const Expr *d, int64_t *out) {
  if (d->kind == EX_STAR || (d->kind == EX_NAME && strcmp(d->str, "_") == 0)) {
    diag_error(d->span, "'%s' is only allowed in a fn parameter's pattern", d->kind == EX_STAR ? "*" : "_");
    return false;
  }
  Value v = eval(b, f, d);
  if (v.kind == V_ERR) return false;
  if (v.kind != V_INT || v.i < 1) {
    if (v.kind == V_INT)
      diag_error(d->span, "a dimension must be at least 1, got %lld", (long long)v.i);
    else
      diag_error(d->span, "a dimension must be an int, got %s", sema_value_desc(v));
    return false;
  }
  *out = v.i;
  return true;
}

/* The dtype and dims of an input or param declaration. */
static bool decl_shape(Build *b, Frame *f, const Stmt *st, bool is_input, DType *dt, Shape *sh, int *bdim) {
  const TypeExpr *t = st->type;
  if (!t || t->kind != TY_TENSOR) {
    diag_error(t ? t->span : st->span, "%s needs a tensor type such as %s",
               is_input ? "an input" : "a param", is_input ? "i32[B, T]" : "[C]");
    return false;
  }
  *dt = DT_F32;
  if (t->dtype && !parse_dtype(t->dtype, t->dtype_span, dt)) return false;
  if (!is_input && *dt == DT_I32) { /* as PyTorch: only floating-point tensors can require gradients */
    diag_error(t->dtype_span, "a param must be a float tensor (f32, bf16 or f16), got %s", t->dtype);
    diag_hint("params are trained by their gradients; feed integer data with 'input NAME: i32[...]'");
    return false;
  }
  if (t->ndims > CP_MAX_RANK) {
    diag_error(t->span, "a tensor has at most %d dims, got %d", CP_MAX_RANK, t->ndims);
    return false;
  }
  sh->rank = t->ndims;
  bool ok = true;
  for (int k = 0; k < t->ndims; k++) {
    const Expr *d = t->dims[k];
    if (is_input && d->kind == EX_NAME && strcmp(d->str, "B") == 0) {
      if (*bdim >= 0) {
        diag_error(d->span, "the batch dim 'B' may appear only once");
        ok = false;
      }
      *bdim = k;
      sh->d[k] = b->batch;
      continue;
    }
    ok &= eval_dim(b, f, d, &sh->d[k]);
  }
  int64_t numel = 1; /* the bound of every shape rule (ir.c's MAX_NUMEL) */
  for (int k = 0; ok && k < sh->rank; k++) {
    if (sh->d[k] > 0 && numel > ((int64_t)1 << 62) / sh->d[k]) {
      diag_error(t->span, "%s shape %s has too many elements (at most 2^62)", is_input ? "the input's" : "the param's",
                 shape_str(sh));
      return false;
    }
    numel *= sh->d[k] > 0 ? sh->d[k] : 1;
  }
  return ok;
}

/* input NAME: DTYPE[dims] */
static void do_input(Build *b, Frame *f, const Stmt *st, const char *name) {
  if (!f->is_model) {
    diag_error(st->span, "'input' is only allowed in a model body");
    bind(f, name, sema_v_err());
    return;
  }
  for (int i = 0; i < b->g->inputs.n; i++) {
    const Node *o = &b->g->nodes[b->g->inputs.a[i]];
    if (strcmp(o->name, name) == 0) {
      diag_error(st->span, "input '%s' is declared twice", name);
      diag_note(o->span, "first declared here");
      return; /* the name keeps the first input */
    }
  }
  bind(f, name, sema_v_err());
  DType dt;
  Shape sh = {0};
  int bdim = -1;
  if (!decl_shape(b, f, st, true, &dt, &sh, &bdim)) return;
  int i = add_node(b, OP_INPUT, NULL, 0, st->span);
  if (i < 0) return;
  Node *n = &b->g->nodes[i];
  n->shape = sh;
  n->dtype = dt;
  n->name = name;
  n->ia[1] = bdim;
  if (b->g->inputs.n == 0 || b->g->inputs.a[b->g->inputs.n - 1] != i) VEC_PUSH(b->g->inputs, i);
  bind(f, name, tensor_val(i, st->span));
  if (bdim >= 0 && !find_var(f, "B")) bind(f, "B", sema_v_int(b->batch, st->span));
}

/* The initializer of a param: zeros, ones, full(v), normal(std), uniform(lo, hi). */
static bool parse_init(Build *b, Frame *f, const Expr *e, InitKind *kind, double *fa) {
  static const char *const args[][2] = {{0}, {0}, {"value"}, {"std"}, {"lo", "hi"}};
  static const int nargs[] = {0, 0, 1, 1, 2};
  const char *nm = e && (e->kind == EX_NAME || e->kind == EX_CALL) ? e->str : NULL;
  int k = nm ? find_str(init_names, 5, nm) : -1;
  if (k < 0) {
    diag_error(e ? e->span : SPAN_NONE,
               "expected an initializer: zeros, ones, full(v), normal(std) or uniform(lo, hi)");
    if (nm) hint_among(nm, init_names, 5);
    return false;
  }
  *kind = (InitKind)k;
  if (e->kind == EX_NAME) {
    if (nargs[k] == 0) return true;
    diag_error(e->span, "'%s' needs %s: %s(%s%s%s)", nm, nargs[k] == 1 ? "an argument" : "arguments",
               nm, args[k][0], nargs[k] == 2 ? ", " : "", nargs[k] == 2 ? args[k][1] : "");
    return false;
  }
  const Expr *slot[2] = {0};
  if (!match_args(e, nm, args[k], nargs[k], slot, NULL)) return false;
  for (int j = 0; j < nargs[k]; j++) {
    if (!slot[j]) {
      diag_error(e->span, "missing argument '%s' of '%s'", args[k][j], nm);
      return false;
    }
    Value v = eval(b, f, slot[j]);
    if (!usable(v)) return false;
    if (!is_num(v)) {
      diag_error(slot[j]->span, "argument '%s' of '%s' must be a number, got %s", args[k][j], nm,
                 sema_value_desc(v));
      return false;
    }
    fa[j] = v.kind == V_INT ? (double)v.i : v.f;
  }
  if (*kind == INIT_NORMAL && !(fa[0] > 0)) {
    diag_error(slot[0]->span, "the std of normal must be > 0, got %g", fa[0]);
    return false;
  }
  if (*kind == INIT_UNIFORM && !(fa[0] < fa[1])) {
    diag_error(e->span, "uniform(lo, hi) needs lo < hi, got %g and %g", fa[0], fa[1]);
    return false;
  }
  return true;
}

/* param NAME: DTYPE? [dims] = INIT */
static void do_param(Build *b, Frame *f, const Stmt *st, const char *name) {
  DType dt;
  Shape sh = {0};
  int bdim = -1;
  InitKind kind = INIT_ZEROS;
  double fa[2] = {0, 0};
  bool ok = decl_shape(b, f, st, false, &dt, &sh, &bdim);
  ok = parse_init(b, f, st->value, &kind, fa) && ok;
  bind(f, name, sema_v_err());
  if (!ok) return;
  const char *path = path_join(f->scope->path, name);
  Span site = f->is_model ? st->span : f->site;
  int prev = cp_map_get(&b->paths, path);
  if (prev >= 0) {
    diag_error(site, "two params have the path '%s'", path);
    diag_note(b->sites.a[prev], "the first one comes from here");
    diag_hint("give the calls different names: name = \"...\"");
    b->site_error = diag_errors();
    b->site_frame = f;
    return;
  }
  int i = add_node(b, OP_PARAM, NULL, 0, st->span);
  if (i < 0) return;
  Node *n = &b->g->nodes[i];
  n->shape = sh;
  n->dtype = dt;
  n->name = path;
  n->ia[0] = kind;
  n->fa[0] = fa[0];
  n->fa[1] = fa[1];
  if (b->g->params.n == 0 || b->g->params.a[b->g->params.n - 1] != i) VEC_PUSH(b->g->params, i);
  cp_map_put(&b->paths, path, b->sites.n);
  VEC_PUSH(b->sites, site);
  Span usite = st->span; /* a stdlib fn's param: the user's call that made it */
  const Frame *root = f;
  while (root->caller) root = root->caller;
  for (const Frame *p = f; p && !p->is_model; p = p->caller)
    if (p->site.file == root->item->name_span.file) usite = p->site;
  VEC_PUSH(b->user_sites, usite);
  bind(f, name, tensor_val(i, st->span));
}

/* a = e  /  a, b = e */
static void do_assign(Build *b, Frame *f, const Stmt *st) {
  Value v = eval(b, f, st->value);
  bool ok = usable(v);
  if (st->nnames == 1) {
    bind(f, st->names[0], ok ? v : sema_v_err());
    return;
  }
  if (ok && (v.kind == V_TUPLE || v.kind == V_LIST) && v.nitems == st->nnames) {
    for (int i = 0; i < st->nnames; i++) bind(f, st->names[i], v.items[i]);
    return;
  }
  if (ok) {
    if (v.kind == V_TUPLE || v.kind == V_LIST) {
      diag_error(st->value->span, "cannot unpack a %s of %d values into %d names",
                 value_kind_name(v.kind), v.nitems, st->nnames);
      if (v.kind == V_TUPLE && st->value->kind == EX_CALL && st->value->str && strcmp(st->value->str, "split") == 0)
        diag_hint("split(x, n) cuts n parts (torch.chunk; PyTorch's x.split(size) takes each part's size): for %d "
                  "names, split(x, %d, axis = ...)", st->nnames, st->nnames);
    } else
      diag_error(st->value->span, "cannot unpack %s into %d names", sema_value_desc(v), st->nnames);
  }
  for (int i = 0; i < st->nnames; i++) bind(f, st->names[i], sema_v_err());
}

static bool is_scalar_tensor(const Build *b, Value v) {
  return v.kind == V_TENSOR && shape_of(b, v)->rank == 0;
}

static const char *tensor_desc(const Build *b, Value v) {
  if (v.kind == V_TENSOR) return cp_fmt("a tensor of shape %s", shape_str(shape_of(b, v)));
  return sema_value_desc(v);
}

/* metric NAME = e */
static void do_metric(Build *b, Frame *f, const Stmt *st, const char *name) {
  Value v = eval(b, f, st->value);
  bind(f, name, sema_v_err());
  if (!usable(v)) return;
  if (!is_scalar_tensor(b, v)) {
    diag_error(st->value->span, "metric '%s' must be a scalar tensor, got %s", name, tensor_desc(b, v));
    diag_hint("reduce it, e.g. mean(...)");
    return;
  }
  for (int i = 0; i < b->g->metrics.n; i++)
    if (strcmp(b->g->metrics.a[i].name, name) == 0) {
      diag_error(st->span, "metric '%s' is reported twice", name);
      diag_note(b->g->metrics.a[i].span, "first reported here");
      return;
    }
  VEC_PUSH(b->g->metrics, ((Metric){name, v.node, st->span}));
  bind(f, name, v);
}

/* for i in A..B [as "label"] { body }: unrolled; each iteration of an outermost loop
 * is one layer. */
static void do_for(Build *b, Frame *f, const Stmt *st, const char *var) {
  Value lo = eval(b, f, st->value), hi = eval(b, f, st->value2);
  if (!usable(lo) || !usable(hi)) return;
  if (lo.kind != V_INT || hi.kind != V_INT) {
    Value bad = lo.kind != V_INT ? lo : hi;
    diag_error(bad.span, "the bounds of 'for' must be compile-time ints, got %s", sema_value_desc(bad));
    return;
  }
  if (hi.i > lo.i && (hi.i - lo.i > MAX_LOOP || hi.i - lo.i < 0)) {
    diag_error(span_join(st->value->span, st->value2->span),
               "the loop has too many iterations (at most %s)", cp_commas(MAX_LOOP));
    return;
  }
  const char *label = st->label ? st->label : "layers";
  PathScope *outer = f->scope;
  int saved_layer = b->g->cur_layer;
  bool layers = b->loop_depth == 0;
  b->loop_depth++;
  for (int64_t i = lo.i; i < hi.i && !f->returned && !halted(b) && count_work(b, st->span); i++) {
    f->scope = new_scope(path_join(outer->path, cp_fmt("%s.%lld", label, (long long)i)));
    if (layers) {
      VEC_PUSH(b->g->layer_names, f->scope->path);
      b->g->cur_layer = b->g->layer_names.n - 1;
    }
    bind(f, var, sema_v_int(i, st->value->span));
    exec_block(b, f, &st->body);
  }
  b->loop_depth--;
  b->g->cur_layer = saved_layer;
  f->scope = outer;
}

/* if cond { } else { }: the branch not taken is not checked at all. */
static void do_if(Build *b, Frame *f, const Stmt *st) {
  Value c = eval(b, f, st->value);
  if (!usable(c)) return;
  if (c.kind != V_BOOL) {
    diag_error(st->value->span, "the condition of 'if' must be a compile-time bool, got %s",
               sema_value_desc(c));
    if (c.kind == V_TENSOR) /* if x > 0: an elementwise choice */
      diag_hint("'if' chooses at compile time; an elementwise choice is where(cond, a, b)");
    return;
  }
  exec_block(b, f, c.i ? &st->body : &st->orelse);
}

static void exec_stmt(Build *b, Frame *f, const Stmt *st) {
  if (!count_work(b, st->span)) return;
  const char *name = st->nnames > 0 && st->names[0] ? st->names[0] : "_";
  switch (st->kind) {
  case ST_INPUT: do_input(b, f, st, name); break;
  case ST_PARAM: do_param(b, f, st, name); break;
  case ST_ASSIGN:
    if (st->nnames > 0) do_assign(b, f, st);
    break;
  case ST_METRIC: do_metric(b, f, st, name); break;
  case ST_FOR: do_for(b, f, st, name); break;
  case ST_IF: do_if(b, f, st); break;
  case ST_RETURN:
    if (f->is_model) {
      diag_error(st->span, "'return' is only allowed in a fn body");
      diag_hint("a model's result is the value it assigns to 'loss'");
      return;
    }
    f->ret = st->value ? eval(b, f, st->value) : (Value){.kind = V_NONE, .s = f->item->name};
    f->returned = true;
    break;
  }
}

static void exec_block(Build *b, Frame *f, const Block *blk) {
  for (int i = 0; i < blk->n && !f->returned && !halted(b); i++)
    if (blk->stmts[i]) exec_stmt(b, f, blk->stmts[i]);
}

/* ---- the model ------------------------------------------------------------------------- */

/* Binds the model's parameters from the train block's call (compile-time values) or
 * their defaults. */
static bool bind_model_params(Build *b, Frame *root, const Item *model, const Expr *call) {
  int np = model->nparams;
  const char **pn = cp_alloc((size_t)(np + 1) * sizeof *pn);
  for (int j = 0; j < np; j++) pn[j] = model->params[j].name;
  const Expr **slot = cp_alloc((size_t)(np + 1) * sizeof *slot);
  bool ok = true;
  if (call && call->kind == EX_CALL) ok = match_args(call, model->name, pn, np, slot, NULL);
  Span at = call ? call->span : model->name_span;
  for (int j = 0; j < np; j++) {
    const Param *p = &model->params[j];
    if (p->type && p->type->kind == TY_TENSOR) {
      diag_error(p->type->span, "a model parameter cannot be a tensor");
      diag_hint("declare tensors fed by the data with 'input %s: ...' in the body", p->name);
      ok = false;
      continue;
    }
    if (strcmp(p->name, "B") == 0) { /* inputs' B is the batch dim, and the body's B after them */
      diag_error(p->span, "a model parameter cannot be named 'B': B is the batch dim of the inputs");
      diag_hint("the plan binds B to the micro-batch: set the batch with train.batch (and strategy.micro)");
      ok = false;
      continue;
    }
    Value v;
    if (slot[j])
      v = sema_eval_const(b->s, slot[j]);
    else if (p->def)
      v = eval(b, root, p->def);
    else {
      diag_error(at, "missing argument '%s' of model '%s'", p->name, model->name);
      diag_note(p->span, "parameter '%s' declared here", p->name);
      ok = false;
      continue;
    }
    ok &= bind_param(b, root, model->name, p, v, slot[j] ? slot[j]->span : p->span);
  }
  return ok;
}

static void check_loss(Build *b, Frame *root, const Item *model) {
  Value *loss = find_var(root, "loss");
  if (!loss) {
    diag_error(model->name_span, "model '%s' never assigns 'loss'", model->name);
    diag_hint("assign the training objective, e.g. loss = cross_entropy(logits, targets)");
    return;
  }
  if (loss->kind == V_ERR) return;
  if (!is_scalar_tensor(b, *loss)) {
    diag_error(loss->span, "'loss' must be a scalar tensor, got %s", tensor_desc(b, *loss));
    if (loss->kind == V_TENSOR) diag_hint("reduce it, e.g. mean(...)");
    return;
  }
  b->g->loss = loss->node;
}

/* Warns, once per declaration and Sema (check elaborates a model twice), about an input or param
 * that no op reads: an input the data feeds for nothing (often a mix-up of inputs), a param that is
 * never trained; and about one whose values reach neither the loss nor a metric (read only by
 * values nothing uses), or a param that only metrics read: PyTorch leaves its .grad None. */
static void warn_unused(Sema *s, const Graph *g, Build *b) {
  bool *used = cp_alloc((size_t)(g->n + 1) * sizeof *used);
  bool *to_loss = cp_alloc((size_t)(g->n + 1) * sizeof *to_loss);
  bool *live = cp_alloc((size_t)(g->n + 1) * sizeof *live);
  for (int i = 0; i < g->n; i++)
    for (int k = 0; k < g->nodes[i].nin; k++) used[g->nodes[i].in[k]] = true;
  if (g->loss >= 0) to_loss[g->loss] = live[g->loss] = true;
  for (int m = 0; m < g->metrics.n; m++)
    if (g->metrics.a[m].node >= 0) live[g->metrics.a[m].node] = true;
  for (int i = g->n - 1; i >= 0; i--) /* inputs come before their readers */
    for (int k = 0; k < g->nodes[i].nin; k++) {
      to_loss[g->nodes[i].in[k]] |= to_loss[i];
      live[g->nodes[i].in[k]] |= live[i];
    }
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (n->op != OP_INPUT && n->op != OP_PARAM) continue;
    bool dead = g->loss >= 0 && (n->op == OP_PARAM ? !to_loss[i] : !live[i]);
    if (used[i] && !dead) continue;
    bool again = false;
    for (int k = 0; k < s->warned_unused.n && !again; k++) {
      Span w = s->warned_unused.a[k];
      again = w.file == n->span.file && w.lo == n->span.lo && w.hi == n->span.hi;
    }
    if (again) continue;
    VEC_PUSH(s->warned_unused, n->span);
    if (n->op == OP_INPUT && !used[i])
      diag_warning(n->span, "input '%s' is never used (the data still feeds it)", n->name);
    else if (n->op == OP_INPUT)
      diag_warning(n->span, "input '%s' reaches neither the loss nor a metric (the data still feeds it)", n->name);
    else if (!used[i])
      diag_warning(n->span, "param '%s' is never used: it gets no gradient and is never trained", n->name);
    else
      diag_warning(n->span, "param '%s' does not reach the loss%s: it gets no gradient and is never trained", n->name,
                   live[i] ? " (only metrics read it)" : "");
    int site = n->op == OP_PARAM ? cp_map_get(&b->paths, n->name) : -1;
    if (site >= 0 && site < b->user_sites.n && b->user_sites.a[site].file != n->span.file)
      diag_note(b->user_sites.a[site], "the param of this call");
  }
}

void sema_set_attention_limit(Sema *s, int max_head_dim) { s->attn_max_d = max_head_dim; }

Graph *sema_build_model(Sema *s, const Item *model, const Expr *call, int64_t batch) {
  if (!model || model->kind != IT_MODEL || !model->name) return NULL;
  int errors = diag_errors();
  if (batch < 1) {
    diag_error(model->name_span, "the batch dim B must be at least 1, got %lld", (long long)batch);
    return NULL;
  }
  Build b = {.s = s, .batch = batch};
  b.g = ir_new(model->name);
  b.g->batch = batch;
  b.g->loss = -1;
  b.g->cur_layer = -1;
  Frame root = {.item = model, .is_model = true, .scope = new_scope(""), .site = model->name_span};
  if (bind_model_params(&b, &root, model, call)) {
    exec_block(&b, &root, &model->body);
    if (!halted(&b)) check_loss(&b, &root, model);
  }
  if (diag_errors() > errors || b.stop) return NULL;
  warn_unused(s, b.g, &b);
  ir_prune(b.g);
  ce_count_sources(b.g);
  char err[512];
  if (!ir_verify(b.g, err, sizeof err))
    cp_panic(__FILE__, __LINE__, "the graph of model '%s' fails ir_verify: %s", model->name, err);
  return b.g;
}

/* A dropout mask is drawn at each element's index in the step's whole tensor (codegen's
 * cg_dropout_map), so each dropout node needs its batch dim: the dim whose size follows B, found by
 * elaborating the model again at B + 1 (as the search finds its batch dims). ia[1] = dim + 1
 * (0: none, as a dropout of a param). Its stream is keyed by its index here (ia[0] = i + 1), which
 * recompute's clones, the per-rank lowering and pipeline stages keep. */
Graph *sema_train_graph(Sema *s, const TrainConf *t, int64_t batch) {
  Graph *g = sema_build_model(s, t->model, t->model_call, batch);
  bool any = false;
  for (int i = 0; g && i < g->n; i++)
    if (g->nodes[i].op == OP_DROPOUT) g->nodes[i].ia[0] = i + 1, any = true;
  const Graph *g2 = any ? sema_build_model(s, t->model, t->model_call, batch + 1) : NULL;
  for (int i = 0; g2 && g2->n == g->n && i < g->n; i++) {
    Node *n = &g->nodes[i];
    if (n->op != OP_DROPOUT || g2->nodes[i].op != OP_DROPOUT) continue;
    for (int d = 0; d < n->shape.rank && !n->ia[1]; d++)
      if (n->shape.d[d] != g2->nodes[i].shape.d[d]) n->ia[1] = d + 1;
  }
  return g;
}
