/* ast.c: AST constructors and the printer behind `cplanc emit --stage=ast`.
 *
 * The printer writes one node per line, indented by nesting; expressions are
 * printed in source form with every binary and unary operation parenthesized, so
 * the tree shows how precedence was resolved. Items carry `@file:line:col`. */
#include "ast.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

Expr *ast_expr(ExprKind kind, Span span) {
  Expr *e = cp_alloc(sizeof *e);
  e->kind = kind;
  e->span = span;
  return e;
}

const char *ast_op_text(AstOp op) {
  switch (op) {
  case AOP_ADD: return "+";
  case AOP_SUB: return "-";
  case AOP_MUL: return "*";
  case AOP_DIV: return "/";
  case AOP_FLOORDIV: return "//";
  case AOP_MOD: return "%";
  case AOP_MATMUL: return "@";
  case AOP_EQ: return "==";
  case AOP_NE: return "!=";
  case AOP_LT: return "<";
  case AOP_LE: return "<=";
  case AOP_GT: return ">";
  case AOP_GE: return ">=";
  case AOP_AND: return "and";
  case AOP_OR: return "or";
  case AOP_NEG: return "-";
  case AOP_NOT: return "not";
  }
  return "?";
}

/* The shortest decimal that reads back as the same double; always looks like a
 * float (has '.', 'e', or is inf/nan) unless `plain` (quantities). */
static void print_number(FILE *out, double v, bool plain) {
  char buf[40];
  if (v == floor(v) && fabs(v) < 1e15) {
    fprintf(out, plain ? "%.0f" : "%.1f", v);
    return;
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  fputs(buf, out);
  if (!plain && !strpbrk(buf, ".eEni")) fputs(".0", out);
}

static void print_string(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
    else if (c == '\n') fputs("\\n", out);
    else if (c == '\t') fputs("\\t", out);
    else if (c < 0x20 || c == 0x7f) fprintf(out, "\\x%02x", c);
    else fputc(c, out);
  }
  fputc('"', out);
}

static void print_exprs(FILE *out, Expr *const *v, int n) {
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", out);
    ast_print_expr(out, v[i]);
  }
}

static void print_fields(FILE *out, const Field *f, int n, bool comma_first) {
  for (int i = 0; i < n; i++) {
    if (i || comma_first) fputs(", ", out);
    fprintf(out, "%s = ", f[i].name);
    ast_print_expr(out, f[i].value);
  }
}

void ast_print_expr(FILE *out, const Expr *e) {
  if (!e) {
    fputs("<null>", out);
    return;
  }
  switch (e->kind) {
  case EX_INT: fprintf(out, "%lld", (long long)e->ival); break;
  case EX_FLOAT: print_number(out, e->fval, false); break;
  case EX_QTY: print_number(out, e->fval, true); fputs(e->str, out); break;
  case EX_STR: print_string(out, e->str); break;
  case EX_BOOL: fputs(e->ival ? "true" : "false", out); break;
  case EX_NAME: fputs(e->str, out); break;
  case EX_STAR: fputc('*', out); break;
  case EX_UNARY:
    fputs(e->op == AOP_NOT ? "(not " : "(-", out);
    ast_print_expr(out, e->lhs);
    fputc(')', out);
    break;
  case EX_BINARY:
    fputc('(', out);
    ast_print_expr(out, e->lhs);
    fprintf(out, " %s ", ast_op_text(e->op));
    ast_print_expr(out, e->rhs);
    fputc(')', out);
    break;
  case EX_CALL:
    fprintf(out, "%s(", e->str);
    print_exprs(out, e->items, e->nitems);
    print_fields(out, e->fields, e->nfields, e->nitems > 0);
    fputc(')', out);
    break;
  case EX_TUPLE:
    fputc('(', out);
    print_exprs(out, e->items, e->nitems);
    fputs(e->nitems == 1 ? ",)" : ")", out);
    break;
  case EX_LIST:
    fputc('[', out);
    print_exprs(out, e->items, e->nitems);
    fputc(']', out);
    break;
  case EX_NAMED_LIST:
    fputc('[', out);
    print_fields(out, e->fields, e->nfields, false);
    fputc(']', out);
    break;
  case EX_OBJECT:
    fputc('{', out);
    print_fields(out, e->fields, e->nfields, false);
    fputc('}', out);
    break;
  }
}

static void indent(FILE *out, int depth) {
  for (int i = 0; i < depth; i++) fputs("  ", out);
}

static void print_at(FILE *out, Span at) {
  if (at.file < 0 || at.file >= src_count()) return;
  int line, col;
  src_linecol(at.file, at.lo, &line, &col);
  fprintf(out, "  @%s:%d:%d", src_path(at.file), line, col);
}

static void print_type(FILE *out, const TypeExpr *t) {
  switch (t->kind) {
  case TY_INT: fputs("int", out); return;
  case TY_FLOAT: fputs("float", out); return;
  case TY_BOOL: fputs("bool", out); return;
  case TY_STR: fputs("str", out); return;
  case TY_UNKNOWN: fputs(t->name, out); return;
  case TY_TENSOR:
    if (t->dtype) fputs(t->dtype, out);
    fputc('[', out);
    print_exprs(out, t->dims, t->ndims);
    fputc(']', out);
    return;
  }
}

static void print_block(FILE *out, const Block *b, int depth);

static void print_stmt(FILE *out, const Stmt *s, int depth) {
  indent(out, depth);
  switch (s->kind) {
  case ST_INPUT:
  case ST_PARAM:
    fprintf(out, "%s %s: ", s->kind == ST_INPUT ? "input" : "param", s->names[0]);
    print_type(out, s->type);
    if (s->value) {
      fputs(" = ", out);
      ast_print_expr(out, s->value);
    }
    break;
  case ST_ASSIGN:
  case ST_METRIC:
    if (s->kind == ST_METRIC) fputs("metric ", out);
    for (int i = 0; i < s->nnames; i++) fprintf(out, "%s%s", i ? ", " : "", s->names[i]);
    fputs(" = ", out);
    ast_print_expr(out, s->value);
    break;
  case ST_FOR:
    fprintf(out, "for %s in ", s->names[0]);
    ast_print_expr(out, s->value);
    fputs("..", out);
    ast_print_expr(out, s->value2);
    if (s->label) {
      fputs(" as ", out);
      print_string(out, s->label);
    }
    fputc('\n', out);
    print_block(out, &s->body, depth + 1);
    return;
  case ST_IF:
    fputs("if ", out);
    ast_print_expr(out, s->value);
    fputc('\n', out);
    print_block(out, &s->body, depth + 1);
    if (s->orelse.n) {
      indent(out, depth);
      fputs("else\n", out);
      print_block(out, &s->orelse, depth + 1);
    }
    return;
  case ST_RETURN:
    fputs("return ", out);
    ast_print_expr(out, s->value);
    break;
  }
  fputc('\n', out);
}

static void print_block(FILE *out, const Block *b, int depth) {
  for (int i = 0; i < b->n; i++) print_stmt(out, b->stmts[i], depth);
}

static void print_settings(FILE *out, Setting *const *v, int n, int depth) {
  for (int i = 0; i < n; i++) {
    const Setting *s = v[i];
    indent(out, depth);
    if (s->is_block) {
      fprintf(out, "%s %s\n", s->key, s->block_name);
      print_settings(out, s->body, s->nbody, depth + 1);
      continue;
    }
    fprintf(out, "%s = ", s->key);
    ast_print_expr(out, s->value);
    fputc('\n', out);
  }
}

static void print_params(FILE *out, const Item *it) {
  fputc('(', out);
  for (int i = 0; i < it->nparams; i++) {
    const Param *p = &it->params[i];
    fprintf(out, "%s%s: ", i ? ", " : "", p->name);
    print_type(out, p->type);
    if (p->def) {
      fputs(" = ", out);
      ast_print_expr(out, p->def);
    }
  }
  fputc(')', out);
}

static void print_item(FILE *out, const Item *it) {
  switch (it->kind) {
  case IT_IMPORT:
    fputs("import ", out);
    print_string(out, it->path);
    break;
  case IT_CONST:
    fprintf(out, "const %s = ", it->name);
    ast_print_expr(out, it->value);
    break;
  case IT_FN:
  case IT_MODEL:
    fprintf(out, "%s %s", it->kind == IT_FN ? "fn" : "model", it->name);
    print_params(out, it);
    break;
  case IT_MESH: fprintf(out, "mesh %s", it->name); break;
  case IT_TRAIN:
    fputs("train", out);
    if (it->name) fprintf(out, " %s", it->name);
    break;
  }
  print_at(out, it->span);
  fputc('\n', out);
  if (it->kind == IT_FN || it->kind == IT_MODEL) print_block(out, &it->body, 1);
  if (it->kind == IT_MESH || it->kind == IT_TRAIN) print_settings(out, it->settings, it->nsettings, 1);
}

void ast_print(FILE *out, const Program *p) {
  if (!p) return;
  for (int i = 0; i < p->nitems; i++) print_item(out, p->items[i]);
}
