/* sema_eval.c: compile-time values. sema_eval_const evaluates expressions that need
 * no model context (consts, settings, model arguments); the folding functions here
 * are also what sema_model.c uses when both operands of an operator are known.
 *
 * Arithmetic is exact where it can be: ints are 64-bit and overflow is an error,
 * `/` on ints must divide exactly, `//` and `%` floor as in Python. */
#include "sema_impl.h"

#include <math.h>
#include <string.h>

/* ---- folding --------------------------------------------------------------------- */

static Value fold_error(AstOp op, Value a, Value b, Span at) {
  diag_error(at, "cannot apply '%s' to %s and %s", ast_op_text(op), sema_value_desc(a),
             sema_value_desc(b));
  return sema_v_err();
}

static Value overflow(Span at) {
  diag_error(at, "integer overflow: the result does not fit in 64 bits");
  return sema_v_err();
}

static Value div_zero(Span at) {
  diag_error(at, "division by zero");
  return sema_v_err();
}

static bool is_cmp(AstOp op) { return op >= AOP_EQ && op <= AOP_GE; }

static bool cmp_result(AstOp op, int c) {
  switch (op) {
  case AOP_EQ: return c == 0;
  case AOP_NE: return c != 0;
  case AOP_LT: return c < 0;
  case AOP_LE: return c <= 0;
  case AOP_GT: return c > 0;
  case AOP_GE: return c >= 0;
  default: cp_unreachable();
  }
}

/* Floor division and remainder with Python's signs; y != 0, no overflow case. */
static int64_t floor_div(int64_t x, int64_t y) {
  int64_t q = x / y;
  if (x % y != 0 && ((x < 0) != (y < 0))) q--;
  return q;
}

static int64_t floor_mod(int64_t x, int64_t y) {
  int64_t r = x % y;
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return r;
}

static Value fold_int(AstOp op, int64_t x, int64_t y, Span at) {
  int64_t r;
  if (is_cmp(op)) return sema_v_bool(cmp_result(op, (x > y) - (x < y)), at);
  switch (op) {
  case AOP_ADD:
    if (__builtin_add_overflow(x, y, &r)) return overflow(at);
    return sema_v_int(r, at);
  case AOP_SUB:
    if (__builtin_sub_overflow(x, y, &r)) return overflow(at);
    return sema_v_int(r, at);
  case AOP_MUL:
    if (__builtin_mul_overflow(x, y, &r)) return overflow(at);
    return sema_v_int(r, at);
  case AOP_DIV:
    if (y == 0) return div_zero(at);
    if (y == -1 && x == INT64_MIN) return overflow(at);
    if (x % y != 0) {
      diag_error(at, "%lld / %lld is not an integer", (long long)x, (long long)y);
      diag_hint("'/' on two ints must divide exactly; use '//' for floor division");
      return sema_v_err();
    }
    return sema_v_int(x / y, at);
  case AOP_FLOORDIV:
    if (y == 0) return div_zero(at);
    if (y == -1) return x == INT64_MIN ? overflow(at) : sema_v_int(-x, at);
    return sema_v_int(floor_div(x, y), at);
  case AOP_MOD:
    if (y == 0) return div_zero(at);
    if (y == -1) return sema_v_int(0, at);
    return sema_v_int(floor_mod(x, y), at);
  default: return fold_error(op, sema_v_int(x, at), sema_v_int(y, at), at);
  }
}

static Value finite_val(double r, Span at) {
  if (!isfinite(r)) {
    diag_error(at, "the result is not a finite number");
    return sema_v_err();
  }
  return sema_v_float(r, at);
}

static Value fold_float(AstOp op, double x, double y, Span at) {
  if (is_cmp(op)) return sema_v_bool(cmp_result(op, (x > y) - (x < y)), at);
  switch (op) {
  case AOP_ADD: return finite_val(x + y, at);
  case AOP_SUB: return finite_val(x - y, at);
  case AOP_MUL: return finite_val(x * y, at);
  case AOP_DIV: return y == 0 ? div_zero(at) : finite_val(x / y, at);
  case AOP_FLOORDIV: return y == 0 ? div_zero(at) : finite_val(floor(x / y), at);
  case AOP_MOD: {
    if (y == 0) return div_zero(at);
    double r = fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return finite_val(r, at);
  }
  default: return fold_error(op, sema_v_float(x, at), sema_v_float(y, at), at);
  }
}

static bool is_num(Value v) { return v.kind == V_INT || v.kind == V_FLOAT; }
static double num(Value v) { return v.kind == V_INT ? (double)v.i : v.f; }

static Value qty(double f, UnitKind u, Span at) {
  Value v = finite_val(f, at);
  if (v.kind == V_FLOAT) {
    v.kind = V_QTY;
    v.unit = u;
  }
  return v;
}

/* Quantities: same-kind sums, differences, ratios and comparisons; scaling by a
 * plain number. */
static Value fold_qty(AstOp op, Value a, Value b, Span at) {
  bool both = a.kind == V_QTY && b.kind == V_QTY;
  if (both && a.unit != b.unit) {
    diag_error(at, "cannot apply '%s' to %s and %s", ast_op_text(op), sema_value_desc(a),
               sema_value_desc(b));
    return sema_v_err();
  }
  if (both && is_cmp(op)) return sema_v_bool(cmp_result(op, (a.f > b.f) - (a.f < b.f)), at);
  if (both && (op == AOP_ADD || op == AOP_SUB))
    return qty(op == AOP_ADD ? a.f + b.f : a.f - b.f, a.unit, at);
  if (both && op == AOP_DIV) return b.f == 0 ? div_zero(at) : finite_val(a.f / b.f, at);
  if (op == AOP_MUL && a.kind == V_QTY && is_num(b)) return qty(a.f * num(b), a.unit, at);
  if (op == AOP_MUL && b.kind == V_QTY && is_num(a)) return qty(num(a) * b.f, b.unit, at);
  if (op == AOP_DIV && a.kind == V_QTY && is_num(b))
    return num(b) == 0 ? div_zero(at) : qty(a.f / num(b), a.unit, at);
  return fold_error(op, a, b, at);
}

Value sema_fold_binary(AstOp op, Value a, Value b, Span at) {
  if (a.kind == V_ERR || b.kind == V_ERR) return sema_v_err();
  if (a.kind == V_INT && b.kind == V_INT) return fold_int(op, a.i, b.i, at);
  if (is_num(a) && is_num(b)) return fold_float(op, num(a), num(b), at);
  if (a.kind == V_QTY || b.kind == V_QTY) return fold_qty(op, a, b, at);
  if (a.kind == V_BOOL && b.kind == V_BOOL) {
    switch (op) {
    case AOP_AND: return sema_v_bool(a.i && b.i, at);
    case AOP_OR: return sema_v_bool(a.i || b.i, at);
    case AOP_EQ: return sema_v_bool(a.i == b.i, at);
    case AOP_NE: return sema_v_bool(a.i != b.i, at);
    default: break;
    }
  }
  if (a.kind == V_STR && b.kind == V_STR) {
    if (is_cmp(op)) return sema_v_bool(cmp_result(op, strcmp(a.s, b.s)), at);
    if (op == AOP_ADD) return (Value){.kind = V_STR, .s = cp_fmt("%s%s", a.s, b.s), .span = at};
  }
  if ((op == AOP_AND || op == AOP_OR) && (a.kind != V_BOOL || b.kind != V_BOOL)) {
    diag_error(at, "'%s' needs two bools, got %s and %s", ast_op_text(op), sema_value_desc(a),
               sema_value_desc(b));
    return sema_v_err();
  }
  return fold_error(op, a, b, at);
}

Value sema_fold_unary(AstOp op, Value a, Span at) {
  if (a.kind == V_ERR) return a;
  if (op == AOP_NOT) {
    if (a.kind == V_BOOL) return sema_v_bool(!a.i, at);
    diag_error(at, "'not' needs a bool, got %s", sema_value_desc(a));
    return sema_v_err();
  }
  switch (a.kind) {
  case V_INT:
    if (a.i == INT64_MIN) return overflow(at);
    return sema_v_int(-a.i, at);
  case V_FLOAT: return sema_v_float(-a.f, at);
  case V_QTY: return qty(-a.f, a.unit, at);
  default:
    diag_error(at, "cannot negate %s", sema_value_desc(a));
    return sema_v_err();
  }
}

/* ---- evaluation without a model ------------------------------------------------- */

Value sema_const_of(Sema *s, int item, Span use) {
  const Item *it = s->prog->items[item];
  switch (s->cstate[item]) {
  case CS_DONE: {
    Value v = s->cval[item];
    if (v.kind != V_ERR && v.kind != V_TUPLE && v.kind != V_LIST) v.span = use;
    return v;
  }
  case CS_BUSY:
    diag_error(it->name_span, "const '%s' depends on itself", it->name);
    if (use.file >= 0 && use.lo != it->name_span.lo) diag_note(use, "through this use");
    return sema_v_err();
  case CS_TODO: break;
  }
  s->cstate[item] = CS_BUSY;
  Value v = it->value ? sema_eval_const(s, it->value) : sema_v_err();
  s->cval[item] = v;
  s->cstate[item] = CS_DONE;
  if (v.kind != V_ERR && v.kind != V_TUPLE && v.kind != V_LIST) v.span = use;
  return v;
}

bool sema_hint_python_name(const char *name) {
  if (strcmp(name, "True") == 0 || strcmp(name, "False") == 0)
    diag_hint("booleans are lowercase: '%s'", strcmp(name, "True") == 0 ? "true" : "false");
  else if (strcmp(name, "None") == 0) diag_hint("there is no None: leave the argument out for its default");
  else return false;
  return true;
}

static Value eval_name(Sema *s, const Expr *e) {
  int i = sema_item_index(s, e->str);
  if (i >= 0) {
    const Item *it = s->prog->items[i];
    if (it->kind == IT_CONST) return sema_const_of(s, i, e->span);
    diag_error(e->span, "'%s' is a %s, not a compile-time value", e->str,
               sema_item_kind_name(it->kind));
    return sema_v_err();
  }
  diag_error(e->span, "unknown name '%s'", e->str);
  if (sema_hint_python_name(e->str)) return sema_v_err();
  int n;
  const char *const *names = sema_item_names(s, IT_CONST, &n);
  const char *best = cp_closest(e->str, names, n);
  if (best) diag_hint("did you mean '%s'?", best);
  return sema_v_err();
}

static Value eval_seq(Sema *s, const Expr *e) {
  Value v = {.kind = e->kind == EX_TUPLE ? V_TUPLE : V_LIST, .span = e->span};
  v.items = cp_alloc((size_t)(e->nitems + 1) * sizeof *v.items);
  v.nitems = e->nitems;
  bool bad = false;
  for (int i = 0; i < e->nitems; i++) {
    v.items[i] = sema_eval_const(s, e->items[i]);
    bad |= v.items[i].kind == V_ERR;
  }
  return bad ? sema_v_err() : v;
}

/* `and` and `or` short-circuit, as in Python, so `false and x` never looks at x. */
static Value eval_logic(Sema *s, const Expr *e) {
  Value a = sema_eval_const(s, e->lhs);
  if (a.kind == V_BOOL && (e->op == AOP_AND ? !a.i : a.i)) return sema_v_bool(a.i, e->span);
  Value b = sema_eval_const(s, e->rhs);
  return sema_fold_binary(e->op, a, b, e->span);
}

static Value eval_const(Sema *s, const Expr *e) {
  switch (e->kind) {
  case EX_INT: return sema_v_int(e->ival, e->span);
  case EX_FLOAT: return sema_v_float(e->fval, e->span);
  case EX_BOOL: return sema_v_bool(e->ival != 0, e->span);
  case EX_STR: return (Value){.kind = V_STR, .s = e->str ? e->str : "", .span = e->span};
  case EX_QTY: {
    const UnitInfo *u = e->str ? unit_find(e->str) : NULL;
    if (!u) {
      diag_error(e->span, "unknown unit '%s'", e->str ? e->str : "");
      return sema_v_err();
    }
    return (Value){.kind = V_QTY, .f = e->fval * u->factor, .unit = u->kind, .span = e->span};
  }
  case EX_NAME: return eval_name(s, e);
  case EX_UNARY: return sema_fold_unary(e->op, sema_eval_const(s, e->lhs), e->span);
  case EX_BINARY:
    if (e->op == AOP_AND || e->op == AOP_OR) return eval_logic(s, e);
    {
      Value a = sema_eval_const(s, e->lhs);
      Value b = sema_eval_const(s, e->rhs);
      return sema_fold_binary(e->op, a, b, e->span);
    }
  case EX_TUPLE:
  case EX_LIST: return eval_seq(s, e);
  case EX_CALL:
  case EX_NAMED_LIST:
  case EX_OBJECT:
  case EX_STAR: break;
  }
  diag_error(e->span, "expected a compile-time value");
  return sema_v_err();
}

/* Deep left-leaning trees (`x + x + ... + x`) and long const chains recurse; cut
 * them off well before the C stack runs out. */
enum { MAX_DEPTH = 1000 };
static int depth;
static bool too_deep; /* reported once per outermost evaluation */

Value sema_eval_const(Sema *s, const Expr *e) {
  if (!e || diag_too_many()) return sema_v_err();
  if (depth >= MAX_DEPTH) {
    if (!too_deep) diag_error(e->span, "expression too deeply nested (more than %d levels)", MAX_DEPTH);
    too_deep = true;
    return sema_v_err();
  }
  depth++;
  Value v = eval_const(s, e);
  if (--depth == 0) too_deep = false;
  return v;
}
