/* ast.h: the syntax tree of a .cplan file, as the parser (cplan.y) builds it.
 *
 * Every node keeps its Span so any later pass can point at the source. The tree
 * is allocated in the compiler arena (cp_alloc) and never freed piecemeal.
 * Nothing here is evaluated: `3 * C` stays a binary expression until sema. */
#ifndef CPLAN_AST_H
#define CPLAN_AST_H

#include "../compiler/cplan.h"

typedef struct Expr Expr;
typedef struct Stmt Stmt;
typedef struct Item Item;
typedef struct Setting Setting;

/* ---- expressions ---------------------------------------------------------- */
typedef enum ExprKind {
  EX_INT,        /* ival */
  EX_FLOAT,      /* fval */
  EX_QTY,        /* fval: the number as written, str: the unit text ("GiB"); the lexer
                    has already checked the unit against units.def */
  EX_STR,        /* str: the decoded string */
  EX_BOOL,       /* ival: 0 or 1 */
  EX_NAME,       /* str: the identifier */
  EX_UNARY,      /* op (AOP_NEG, AOP_NOT), lhs */
  EX_BINARY,     /* op, lhs, rhs */
  EX_CALL,       /* str: callee name, name_span: its span; items: positional args;
                    fields: keyword args (name = value) in source order */
  EX_TUPLE,      /* items: (a, b) or () */
  EX_LIST,       /* items: [a, b] */
  EX_NAMED_LIST, /* fields: [k = v, ...] */
  EX_OBJECT,     /* fields: { k = v, ... } */
  EX_STAR,       /* '*' inside a dims list of a tensor pattern: [*, C] */
} ExprKind;

typedef enum AstOp {
  AOP_ADD, AOP_SUB, AOP_MUL, AOP_DIV, AOP_FLOORDIV, AOP_MOD, AOP_MATMUL,
  AOP_EQ, AOP_NE, AOP_LT, AOP_LE, AOP_GT, AOP_GE,
  AOP_AND, AOP_OR,
  AOP_NEG, AOP_NOT,
} AstOp;

const char *ast_op_text(AstOp op); /* "+", "//", "and", ... */

/* A `name = value` pair: keyword argument, named-list entry or object entry. */
typedef struct Field {
  const char *name;
  Span name_span;
  Expr *value;
} Field;

struct Expr {
  ExprKind kind;
  Span span;        /* the whole expression */
  int64_t ival;     /* EX_INT, EX_BOOL */
  double fval;      /* EX_FLOAT, EX_QTY */
  const char *str;  /* EX_NAME, EX_STR, EX_QTY unit, EX_CALL callee */
  Span name_span;   /* EX_CALL: the callee name */
  AstOp op;         /* EX_UNARY, EX_BINARY */
  Expr *lhs, *rhs;  /* EX_UNARY uses lhs only */
  Expr **items;     /* EX_CALL positional args, EX_TUPLE, EX_LIST */
  int nitems;
  Field *fields;    /* EX_CALL keyword args, EX_NAMED_LIST, EX_OBJECT */
  int nfields;
};

/* ---- types in signatures and declarations ------------------------------- */
typedef enum TypeKind {
  TY_INT, TY_FLOAT, TY_BOOL, TY_STR,
  TY_TENSOR,  /* dtype? [dims] */
  TY_UNKNOWN, /* a name that is not a type: sema reports it (name holds it) */
} TypeKind;

typedef struct TypeExpr {
  TypeKind kind;
  Span span;
  const char *name;   /* TY_UNKNOWN: the name as written */
  const char *dtype;  /* TY_TENSOR: "f32", "i32", ... or NULL when none was written */
  Span dtype_span;
  Expr **dims;        /* TY_TENSOR: each is an expression, EX_STAR, or EX_NAME "_" */
  int ndims;
} TypeExpr;

/* A parameter of a fn or model: name: type [= default]. */
typedef struct Param {
  const char *name;
  Span span;      /* the whole parameter */
  Span name_span;
  TypeExpr *type;
  Expr *def;      /* NULL: required */
} Param;

/* ---- statements --------------------------------------------------------- */
typedef struct Block {
  Stmt **stmts;
  int n;
} Block;

typedef enum StmtKind {
  ST_INPUT,  /* input NAME: DTYPE[dims]            names[0], type */
  ST_PARAM,  /* param NAME: DTYPE? [dims] = INIT   names[0], type, value (the init) */
  ST_ASSIGN, /* a = e  /  a, b = e                 names[0..n), value */
  ST_METRIC, /* metric NAME = e                    names[0], value */
  ST_FOR,    /* for i in A..B [as "L"] { }         names[0] (loop var), value (A), value2 (B),
                                                   label (NULL if none), body */
  ST_IF,     /* if e { } [else { } | else if ...]  value (cond), body, orelse (an `else if`
                                                   is an orelse holding one ST_IF) */
  ST_RETURN, /* return e                           value */
} StmtKind;

struct Stmt {
  StmtKind kind;
  Span span;
  const char **names;
  Span *name_spans;
  int nnames;
  TypeExpr *type;
  Expr *value;
  Expr *value2;
  const char *label;
  Span label_span;
  Block body;
  Block orelse;
};

/* ---- settings (mesh and train bodies) ------------------------------------ */
/* Either `key = value` (value set, is_block false) or `key NAME { settings }`
 * (is_block true, block_name and body set). Keys may be keywords (model, mesh). */
struct Setting {
  const char *key;
  Span key_span;
  Span span;            /* the whole entry */
  Expr *value;          /* key = value */
  bool is_block;
  const char *block_name; /* key NAME { ... } */
  Span block_name_span;
  Setting **body;
  int nbody;
};

/* ---- items ------------------------------------------------------------- */
typedef enum ItemKind { IT_IMPORT, IT_CONST, IT_FN, IT_MODEL, IT_MESH, IT_TRAIN } ItemKind;

struct Item {
  ItemKind kind;
  Span span;             /* the whole item */
  const char *name;      /* NULL for import and for an unnamed train */
  Span name_span;
  const char *path;      /* IT_IMPORT: as written ("nn", "lib/x.cplan") */
  int imported_file;     /* IT_IMPORT: the file id it resolved to, -1 if it failed */
  Expr *value;           /* IT_CONST */
  Param *params;         /* IT_FN, IT_MODEL */
  int nparams;
  Block body;            /* IT_FN, IT_MODEL */
  Setting **settings;    /* IT_MESH, IT_TRAIN */
  int nsettings;
  int file;              /* the source it came from */
};

/* The items of the main file and of everything it imports (each file once), in
 * load order: imported files' items come before the importer's. */
typedef struct Program {
  Item **items;
  int nitems;
  int main_file;
} Program;

/* ---- entry points (grammar/parse.c) ---------------------------------------- */
/* Parses `path` and, recursively, its imports. A bare import name ("nn") is a file
 * of the standard library embedded in the compiler; other paths are relative to
 * the importing file. Import cycles and unreadable files are diagnosed. Returns
 * NULL only when the main file cannot be read (diagnosed); otherwise the program,
 * possibly partial, with diag_errors() telling whether it is usable. */
Program *parse_program(const char *path);
/* As parse_program, for a source already registered (the fuzzer, tests). */
Program *parse_program_source(int file);
/* Parses one registered source holding a single expression (the value of a
 * `--set key=value` override). NULL after a diagnostic. */
Expr *parse_expr_source(int file);
/* The embedded standard library: source text of a bare import name, or NULL. */
const char *stdlib_source(const char *name);

/* ---- printing (grammar/ast.c) ------------------------------------------- */
void ast_print(FILE *out, const Program *p); /* `cplanc emit --stage=ast` */
void ast_print_expr(FILE *out, const Expr *e); /* source-like, fully parenthesized */

/* Constructors used by the parser and by --set overrides. */
Expr *ast_expr(ExprKind kind, Span span);

#endif
