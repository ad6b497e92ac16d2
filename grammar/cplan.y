/* cplan.y: the grammar of .cplan files (docs/language.md §2-§6) and the AST it builds.
 *
 * A pure, reentrant bison parser over the flex scanner in cplan.l. Locations are
 * byte Spans (cplan.h). Two start tokens, emitted first by the scanner, select
 * what is parsed: a whole file (START_PROGRAM) or one expression (START_EXPR, for
 * `--set key=value`). Syntax errors are reported with diag_error() at the span of
 * the offending token, naming it and what was expected; `error` productions at the
 * item, statement and setting level let one parse report several errors.
 *
 * Precedence is spelled out as one nonterminal per level (low to high): or, and,
 * not, comparisons (non-associative), + -, * / // % @, unary -, calls/atoms. */

%code top {
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
}

%code requires {
#include "cplan.h"
#include "ast.h"

#ifndef YY_TYPEDEF_YY_SCANNER_T
#define YY_TYPEDEF_YY_SCANNER_T
typedef void *yyscan_t;
#endif

#define CP_MAX_BRACKETS 256 /* open brackets the scanner accepts before giving up */

typedef struct Ident { const char *name; Span span; } Ident;
typedef VEC(Expr *) ExprVec;
typedef VEC(Field) FieldVec;
typedef VEC(Param) ParamVec;
typedef VEC(Stmt *) StmtVec;
typedef VEC(Setting *) SettingVec;
typedef VEC(Item *) ItemVec;
typedef VEC(Ident) IdentVec;
typedef struct ArgList { ExprVec pos; FieldVec kw; } ArgList;

/* Everything the scanner and the parser share while reading one source. */
typedef struct LexState {
  int file;              /* source id */
  const char *text;      /* its text and length */
  int len;
  int pos;               /* bytes consumed by the scanner so far */
  int start_token;       /* emitted before anything else, then 0 */
  char brackets[CP_MAX_BRACKETS]; /* open brackets, innermost last */
  int opened_at[CP_MAX_BRACKETS]; /* their offsets */
  int depth;
  int last;              /* the last token returned (decides what a newline means) */
  int prev;              /* the one before it */
  bool fatal;            /* stop: report nothing more, the scanner returns end of file */
  bool bad_char;         /* an error was reported by the scanner since the last token */
  bool closing;          /* emitting closers for brackets left open (see item_follows) */
  int quiet_to;          /* no syntax errors at tokens before this offset */
  int else_reported;      /* end of the `else` last reported as starting a line */
  bool after_bad_char;   /* ... just before the last token (its syntax error is noise) */
  ItemVec items;         /* START_PROGRAM: the items parsed */
  Expr *expr;            /* START_EXPR: the expression */
} LexState;
}

%code provides {
int cpyylex(CPYYSTYPE *yylval, CPYYLTYPE *yylloc, yyscan_t scanner);
int cpyyparse(yyscan_t scanner, LexState *st);
}

%define api.prefix {cpyy}
%define api.pure full
%define api.location.type {Span}
%define parse.error custom
%define parse.lac full
%locations
%expect 0
%param {yyscan_t scanner}
%parse-param {LexState *st}
%initial-action { @$ = (Span){st->file, 0, 0}; }

%union {
  const char *str;
  Expr *expr;
  Stmt *stmt;
  Item *item;
  Setting *setting;
  TypeExpr *type;
  Param param;
  Field field;
  ArgList args;
  ExprVec exprs;
  FieldVec fields;
  ParamVec params;
  StmtVec stmts;
  SettingVec settings;
  IdentVec idents;
  int op;
}

%code {
#include "units.h"

#define YYMAXDEPTH 4000 /* deeper than any sane nesting; beyond it: "too deeply nested" */

#define YYLLOC_DEFAULT(Cur, Rhs, N)                          \
  do {                                                       \
    if (N) {                                                 \
      (Cur).file = YYRHSLOC(Rhs, 1).file;                    \
      (Cur).lo = YYRHSLOC(Rhs, 1).lo;                        \
      (Cur).hi = YYRHSLOC(Rhs, N).hi;                        \
    } else {                                                 \
      (Cur).file = YYRHSLOC(Rhs, 0).file;                    \
      (Cur).lo = (Cur).hi = YYRHSLOC(Rhs, 0).hi;             \
    }                                                        \
  } while (0)

static void cpyyerror(Span *loc, yyscan_t scanner, LexState *st, const char *msg);
static Expr *mk_binary(int op, Expr *l, Expr *r, Span at);
static Expr *mk_unary(int op, Expr *e, Span at);
static Expr *mk_call(Ident callee, ArgList args, Span at);
static Expr *mk_seq(ExprKind kind, ExprVec v, Span at);
static Expr *mk_fields(ExprKind kind, FieldVec v, Span at);
static Stmt *mk_stmt(StmtKind kind, Span at);
static Stmt *mk_named(StmtKind kind, Span at, Ident name);
static Stmt *mk_assign(Span at, IdentVec names, Expr *value);
static Item *mk_item(ItemKind kind, Span at, LexState *st);
static Block mk_block(StmtVec v);
static TypeExpr *mk_type(Ident name, ExprVec *dims, Span at);
static Field mk_field(Ident key, Expr *value);
static void add_item(LexState *st, Item *it);
static Expr *mk_name(Ident id);
}

/* Token names are what syntax errors print ("expected ')' or ','"). */
%token END 0 "end of file"
%token START_PROGRAM "start of program" START_EXPR "start of expression"
%token <str> IDENT "identifier"
%token <expr> INT "integer" FLOAT "float" QTY "quantity" STRING "string"
%token NEWLINE "newline"
%token FN "'fn'" MODEL "'model'" MESH "'mesh'" TRAIN "'train'" PARAM "'param'"
%token INPUT "'input'" METRIC "'metric'" RETURN "'return'" FOR "'for'" IN "'in'"
%token AS "'as'" IF "'if'" ELSE "'else'" IMPORT "'import'" CONST "'const'"
%token TRUE "'true'" FALSE "'false'" AND "'and'" OR "'or'" NOT "'not'"
%token EQ "'=='" NE "'!='" LE "'<='" GE "'>='" FLOORDIV "'//'" DOTDOT "'..'"

%type <item> item fn_item
%type <stmt> stmt if_stmt
%type <stmts> stmt_list block
%type <settings> setting_list settings_block
%type <setting> setting
%type <expr> expr and_expr not_expr cmp_expr add_expr mul_expr unary primary dim
%type <exprs> exprs dims
%type <fields> fields field_list
%type <field> field
%type <args> args arglist
%type <param> param
%type <params> params param_list
%type <type> type
%type <idents> names
%type <str> keyword
%type <op> cmp_op mul_op
%type <expr> list_lit obj_lit paren

%%

start:
    START_PROGRAM item_list
  | START_PROGRAM item_list item      { add_item(st, $3); }
  | START_EXPR expr opt_newline       { st->expr = $2; }
  ;

opt_newline: %empty | NEWLINE ;

term: NEWLINE | ';' ;

/* item_list -> { item term | term } ; the last item needs no terminator */
item_list:
    %empty
  | item_list term
  | item_list item term               { add_item(st, $2); }
  ;

item:
    IMPORT STRING                     { $$ = mk_item(IT_IMPORT, @$, st); $$->path = $2->str;
                                        $$->imported_file = -1; }
  | CONST IDENT '=' expr              { $$ = mk_item(IT_CONST, @$, st); $$->name = $2;
                                        $$->name_span = @2; $$->value = $4; }
  | fn_item
  | MESH IDENT settings_block         { $$ = mk_item(IT_MESH, @$, st); $$->name = $2;
                                        $$->name_span = @2; $$->settings = $3.a;
                                        $$->nsettings = $3.n; }
  | TRAIN settings_block              { $$ = mk_item(IT_TRAIN, @$, st); $$->settings = $2.a;
                                        $$->nsettings = $2.n; }
  | TRAIN IDENT settings_block        { $$ = mk_item(IT_TRAIN, @$, st); $$->name = $2;
                                        $$->name_span = @2; $$->settings = $3.a;
                                        $$->nsettings = $3.n; }
  | error                             { $$ = NULL; }
  ;

/* fn_item -> ('fn' | 'model') NAME '(' params ')' block */
fn_item:
    FN IDENT '(' params ')' block     { $$ = mk_item(IT_FN, @$, st); $$->name = $2;
                                        $$->name_span = @2; $$->params = $4.a;
                                        $$->nparams = $4.n; $$->body = mk_block($6); }
  | MODEL IDENT '(' params ')' block  { $$ = mk_item(IT_MODEL, @$, st); $$->name = $2;
                                        $$->name_span = @2; $$->params = $4.a;
                                        $$->nparams = $4.n; $$->body = mk_block($6); }
  ;

params:
    %empty                            { $$ = (ParamVec){0}; }
  | param_list
  | param_list ','
  ;

param_list:
    param                             { $$ = (ParamVec){0}; VEC_PUSH($$, $1); }
  | param_list ',' param              { $$ = $1; VEC_PUSH($$, $3); }
  ;

/* param -> NAME ':' type ['=' expr] */
param:
    IDENT ':' type                    { $$ = (Param){.name = $1, .span = @$, .name_span = @1,
                                                     .type = $3}; }
  | IDENT ':' type '=' expr           { $$ = (Param){.name = $1, .span = @$, .name_span = @1,
                                                     .type = $3, .def = $5}; }
  ;

/* type -> 'int' | 'float' | 'bool' | 'str' | NAME? '[' dims ']' */
type:
    IDENT                             { $$ = mk_type((Ident){$1, @1}, NULL, @$); }
  | IDENT '[' dims ']'                { $$ = mk_type((Ident){$1, @1}, &$3, @$); }
  | '[' dims ']'                      { $$ = mk_type((Ident){NULL, @1}, &$2, @$); }
  ;

dims:
    %empty                            { $$ = (ExprVec){0}; }
  | dim                               { $$ = (ExprVec){0}; VEC_PUSH($$, $1); }
  | dims ',' dim                      { $$ = $1; VEC_PUSH($$, $3); }
  ;

dim:
    expr
  | '*'                               { $$ = ast_expr(EX_STAR, @$); }
  ;

/* block -> '{' { stmt term | term } [stmt] '}' */
block:
    '{' stmt_list '}'                 { $$ = $2; }
  | '{' stmt_list stmt '}'            { $$ = $2; if ($3) VEC_PUSH($$, $3); }
  ;

stmt_list:
    %empty                            { $$ = (StmtVec){0}; }
  | stmt_list term                    { $$ = $1; }
  | stmt_list stmt term               { $$ = $1; if ($2) VEC_PUSH($$, $2); }
  ;

stmt:
    INPUT IDENT ':' IDENT '[' dims ']'
                                      { $$ = mk_named(ST_INPUT, @$, (Ident){$2, @2});
                                        Span ts = span_join(@4, @7);
                                        $$->type = mk_type((Ident){$4, @4}, &$6, ts); }
  | INPUT IDENT ':' '[' dims ']'      { $$ = mk_named(ST_INPUT, @$, (Ident){$2, @2});
                                        $$->type = mk_type((Ident){NULL, @4}, &$5, span_join(@4, @6));
                                        diag_error(@4, "input '%s' needs a dtype", $2);
                                        diag_hint("write input %s: i32[...] (or f32, bf16, f16)", $2); }
  | PARAM IDENT ':' type '=' expr     { $$ = mk_named(ST_PARAM, @$, (Ident){$2, @2});
                                        $$->type = $4; $$->value = $6; }
  | names '=' expr                    { $$ = mk_assign(@$, $1, $3); }
  | names '=' expr ',' exprs          { /* `a, b = x, y`: the right side a tuple, as in Python */
                                        ExprVec v = {0}; VEC_PUSH(v, $3);
                                        for (int i = 0; i < $5.n; i++) VEC_PUSH(v, $5.a[i]);
                                        $$ = mk_assign(@$, $1, mk_seq(EX_TUPLE, v, span_join(@3, @5))); }
  | METRIC IDENT '=' expr             { $$ = mk_named(ST_METRIC, @$, (Ident){$2, @2});
                                        $$->value = $4; }
  | FOR IDENT IN expr DOTDOT expr block
                                      { $$ = mk_named(ST_FOR, @$, (Ident){$2, @2});
                                        $$->value = $4; $$->value2 = $6;
                                        $$->body = mk_block($7); }
  | FOR IDENT IN expr DOTDOT expr AS STRING block
                                      { $$ = mk_named(ST_FOR, @$, (Ident){$2, @2});
                                        $$->value = $4; $$->value2 = $6;
                                        $$->label = $8->str; $$->label_span = @8;
                                        $$->body = mk_block($9); }
  | if_stmt
  | RETURN expr                       { $$ = mk_stmt(ST_RETURN, @$); $$->value = $2; }
  | RETURN expr ',' exprs             { $$ = mk_stmt(ST_RETURN, @$);
                                        ExprVec v = {0}; VEC_PUSH(v, $2);
                                        for (int i = 0; i < $4.n; i++) VEC_PUSH(v, $4.a[i]);
                                        $$->value = mk_seq(EX_TUPLE, v, span_join(@2, @4)); }
  | error                             { $$ = NULL; }
  ;

/* if_stmt -> 'if' expr block ['else' (block | if_stmt)] */
if_stmt:
    IF expr block                     { $$ = mk_stmt(ST_IF, @$); $$->value = $2;
                                        $$->body = mk_block($3); }
  | IF expr block ELSE block          { $$ = mk_stmt(ST_IF, @$); $$->value = $2;
                                        $$->body = mk_block($3); $$->orelse = mk_block($5); }
  | IF expr block ELSE if_stmt        { $$ = mk_stmt(ST_IF, @$); $$->value = $2;
                                        $$->body = mk_block($3);
                                        StmtVec v = {0}; VEC_PUSH(v, $5);
                                        $$->orelse = mk_block(v); }
  ;

names:
    IDENT                             { $$ = (IdentVec){0}; VEC_PUSH($$, ((Ident){$1, @1})); }
  | names ',' IDENT                   { $$ = $1; VEC_PUSH($$, ((Ident){$3, @3})); }
  ;

/* settings_block -> '{' { setting sep | sep } [setting] '}' ; sep -> newline | ';' | ',' */
settings_block:
    '{' setting_list '}'              { $$ = $2; }
  | '{' setting_list setting '}'      { $$ = $2; if ($3) VEC_PUSH($$, $3); }
  ;

setting_list:
    %empty                            { $$ = (SettingVec){0}; }
  | setting_list sep                  { $$ = $1; }
  | setting_list setting sep          { $$ = $1; if ($2) VEC_PUSH($$, $2); }
  ;

sep: NEWLINE | ';' | ',' ;

/* setting -> key '=' expr | key NAME settings_block */
setting:
    keyword '=' expr                  { $$ = cp_alloc(sizeof *$$); $$->key = $1;
                                        $$->key_span = @1; $$->span = @$; $$->value = $3; }
  | keyword IDENT settings_block      { $$ = cp_alloc(sizeof *$$); $$->key = $1;
                                        $$->key_span = @1; $$->span = @$; $$->is_block = true;
                                        $$->block_name = $2; $$->block_name_span = @2;
                                        $$->body = $3.a; $$->nbody = $3.n; }
  | error                             { $$ = NULL; }
  ;

/* A key of a setting, keyword argument, named list or object: any name, keywords too. */
keyword:
    IDENT
  | FN { $$ = "fn"; } | MODEL { $$ = "model"; } | MESH { $$ = "mesh"; }
  | TRAIN { $$ = "train"; } | PARAM { $$ = "param"; } | INPUT { $$ = "input"; }
  | METRIC { $$ = "metric"; } | RETURN { $$ = "return"; } | FOR { $$ = "for"; }
  | IN { $$ = "in"; } | AS { $$ = "as"; } | IF { $$ = "if"; } | ELSE { $$ = "else"; }
  | IMPORT { $$ = "import"; } | CONST { $$ = "const"; } | TRUE { $$ = "true"; }
  | FALSE { $$ = "false"; } | AND { $$ = "and"; } | OR { $$ = "or"; } | NOT { $$ = "not"; }
  ;

/* ---- expressions, lowest precedence first ---- */
expr:
    and_expr
  | expr OR and_expr                  { $$ = mk_binary(AOP_OR, $1, $3, @$); }
  ;

and_expr:
    not_expr
  | and_expr AND not_expr             { $$ = mk_binary(AOP_AND, $1, $3, @$); }
  ;

not_expr:
    cmp_expr
  | NOT not_expr                      { $$ = mk_unary(AOP_NOT, $2, @$); }
  ;

/* Comparisons do not chain: `a < b < c` is a syntax error. */
cmp_expr:
    add_expr
  | add_expr cmp_op add_expr          { $$ = mk_binary($2, $1, $3, @$); }
  ;

cmp_op:
    EQ { $$ = AOP_EQ; } | NE { $$ = AOP_NE; } | '<' { $$ = AOP_LT; }
  | LE { $$ = AOP_LE; } | '>' { $$ = AOP_GT; } | GE { $$ = AOP_GE; }
  ;

add_expr:
    mul_expr
  | add_expr '+' mul_expr             { $$ = mk_binary(AOP_ADD, $1, $3, @$); }
  | add_expr '-' mul_expr             { $$ = mk_binary(AOP_SUB, $1, $3, @$); }
  ;

mul_expr:
    unary
  | mul_expr mul_op unary             { $$ = mk_binary($2, $1, $3, @$); }
  ;

mul_op:
    '*' { $$ = AOP_MUL; } | '/' { $$ = AOP_DIV; } | FLOORDIV { $$ = AOP_FLOORDIV; }
  | '%' { $$ = AOP_MOD; } | '@' { $$ = AOP_MATMUL; }
  ;

unary:
    primary
  | '-' unary                         { $$ = mk_unary(AOP_NEG, $2, @$); }
  ;

primary:
    INT | FLOAT | QTY | STRING
  | TRUE                              { $$ = ast_expr(EX_BOOL, @$); $$->ival = 1; }
  | FALSE                             { $$ = ast_expr(EX_BOOL, @$); $$->ival = 0; }
  | IDENT                             { $$ = mk_name((Ident){$1, @1}); }
  | IDENT '(' args ')'                { $$ = mk_call((Ident){$1, @1}, $3, @$); }
  | paren
  | list_lit
  | obj_lit
  ;

/* paren -> '(' ')' | '(' expr ')' | '(' expr ',' [exprs [',']] ')' */
paren:
    '(' ')'                           { $$ = mk_seq(EX_TUPLE, (ExprVec){0}, @$); }
  | '(' expr ')'                      { $$ = $2; }
  | '(' expr ',' ')'                  { ExprVec v = {0}; VEC_PUSH(v, $2);
                                        $$ = mk_seq(EX_TUPLE, v, @$); }
  | '(' expr ',' exprs ')'            { ExprVec v = {0}; VEC_PUSH(v, $2);
                                        for (int i = 0; i < $4.n; i++) VEC_PUSH(v, $4.a[i]);
                                        $$ = mk_seq(EX_TUPLE, v, @$); }
  | '(' expr ',' exprs ',' ')'        { ExprVec v = {0}; VEC_PUSH(v, $2);
                                        for (int i = 0; i < $4.n; i++) VEC_PUSH(v, $4.a[i]);
                                        $$ = mk_seq(EX_TUPLE, v, @$); }
  ;

/* list_lit -> '[' ']' | '[' exprs [','] ']' | '[' field {',' field} [','] ']' */
list_lit:
    '[' ']'                           { $$ = mk_seq(EX_LIST, (ExprVec){0}, @$); }
  | '[' exprs ']'                     { $$ = mk_seq(EX_LIST, $2, @$); }
  | '[' exprs ',' ']'                 { $$ = mk_seq(EX_LIST, $2, @$); }
  | '[' fields ']'                    { $$ = mk_fields(EX_NAMED_LIST, $2, @$); }
  | '[' fields ',' ']'                { $$ = mk_fields(EX_NAMED_LIST, $2, @$); }
  ;

exprs:
    expr                              { $$ = (ExprVec){0}; VEC_PUSH($$, $1); }
  | exprs ',' expr                    { $$ = $1; VEC_PUSH($$, $3); }
  ;

fields:
    field                             { $$ = (FieldVec){0}; VEC_PUSH($$, $1); }
  | fields ',' field                  { $$ = $1; VEC_PUSH($$, $3); }
  ;

field:
    keyword '=' expr                  { $$ = mk_field((Ident){$1, @1}, $3); }
  ;

/* obj_lit -> '{' { field sep | sep } [field] '}' */
obj_lit:
    '{' field_list '}'                { $$ = mk_fields(EX_OBJECT, $2, @$); }
  | '{' field_list field '}'          { FieldVec v = $2; VEC_PUSH(v, $3);
                                        $$ = mk_fields(EX_OBJECT, v, @$); }
  ;

field_list:
    %empty                            { $$ = (FieldVec){0}; }
  | field_list sep                    { $$ = $1; }
  | field_list field sep              { $$ = $1; VEC_PUSH($$, $2); }
  ;

/* args -> positional arguments, then keyword arguments, with an optional trailing ',' */
args:
    %empty                            { $$ = (ArgList){{0}, {0}}; }
  | arglist
  | arglist ','
  ;

arglist:
    expr                              { $$ = (ArgList){{0}, {0}}; VEC_PUSH($$.pos, $1); }
  | field                             { $$ = (ArgList){{0}, {0}}; VEC_PUSH($$.kw, $1); }
  | arglist ',' expr                  { $$ = $1;
                                        if ($$.kw.n > 0) {
                                          diag_error(@3, "positional argument after keyword "
                                                     "argument '%s'", $$.kw.a[$$.kw.n - 1].name);
                                          diag_hint("write positional arguments first: "
                                                    "f(x, y, key = value)");
                                        }
                                        VEC_PUSH($$.pos, $3); }
  | arglist ',' field                 { $$ = $1; VEC_PUSH($$.kw, $3); }
  ;

%%

/* ---- AST construction ---------------------------------------------------- */

static void add_item(LexState *st, Item *it) {
  if (it) VEC_PUSH(st->items, it);
}

static Item *mk_item(ItemKind kind, Span at, LexState *st) {
  Item *it = cp_alloc(sizeof *it);
  it->kind = kind;
  it->span = at;
  it->file = st->file;
  it->imported_file = -1;
  return it;
}

static Expr *mk_name(Ident id) {
  Expr *e = ast_expr(EX_NAME, id.span);
  e->str = id.name;
  return e;
}

static Expr *mk_binary(int op, Expr *l, Expr *r, Span at) {
  Expr *e = ast_expr(EX_BINARY, at);
  e->op = (AstOp)op;
  e->lhs = l;
  e->rhs = r;
  return e;
}

static Expr *mk_unary(int op, Expr *x, Span at) {
  Expr *e = ast_expr(EX_UNARY, at);
  e->op = (AstOp)op;
  e->lhs = x;
  return e;
}

static Expr *mk_seq(ExprKind kind, ExprVec v, Span at) {
  Expr *e = ast_expr(kind, at);
  e->items = v.a;
  e->nitems = v.n;
  return e;
}

static Expr *mk_fields(ExprKind kind, FieldVec v, Span at) {
  Expr *e = ast_expr(kind, at);
  e->fields = v.a;
  e->nfields = v.n;
  return e;
}

static Expr *mk_call(Ident callee, ArgList args, Span at) {
  Expr *e = ast_expr(EX_CALL, at);
  e->str = callee.name;
  e->name_span = callee.span;
  e->items = args.pos.a;
  e->nitems = args.pos.n;
  e->fields = args.kw.a;
  e->nfields = args.kw.n;
  return e;
}

static Field mk_field(Ident key, Expr *value) {
  return (Field){.name = key.name, .name_span = key.span, .value = value};
}

static Stmt *mk_stmt(StmtKind kind, Span at) {
  Stmt *s = cp_alloc(sizeof *s);
  s->kind = kind;
  s->span = at;
  return s;
}

/* names = value (a destructuring when there are several names) */
static Stmt *mk_assign(Span at, IdentVec names, Expr *value) {
  Stmt *s = mk_stmt(ST_ASSIGN, at);
  s->nnames = names.n;
  s->names = cp_alloc(sizeof(char *) * (size_t)names.n);
  s->name_spans = cp_alloc(sizeof(Span) * (size_t)names.n);
  for (int i = 0; i < names.n; i++) {
    s->names[i] = names.a[i].name;
    s->name_spans[i] = names.a[i].span;
  }
  s->value = value;
  return s;
}

static Stmt *mk_named(StmtKind kind, Span at, Ident name) {
  Stmt *s = mk_stmt(kind, at);
  s->names = cp_alloc(sizeof(char *));
  s->name_spans = cp_alloc(sizeof(Span));
  s->names[0] = name.name;
  s->name_spans[0] = name.span;
  s->nnames = 1;
  return s;
}

static Block mk_block(StmtVec v) {
  return (Block){v.a, v.n};
}

/* A type as written: a plain name (int, float, bool, str, or unknown for sema to
 * report), or a tensor pattern when dims are given (name is then its dtype). */
static TypeExpr *mk_type(Ident name, ExprVec *dims, Span at) {
  TypeExpr *t = cp_alloc(sizeof *t);
  t->span = at;
  if (dims) {
    t->kind = TY_TENSOR;
    t->dtype = name.name;
    t->dtype_span = name.span;
    t->dims = dims->a;
    t->ndims = dims->n;
    return t;
  }
  static const struct { const char *name; TypeKind kind; } scalars[] = {
    {"int", TY_INT}, {"float", TY_FLOAT}, {"bool", TY_BOOL}, {"str", TY_STR}};
  t->kind = TY_UNKNOWN;
  t->name = name.name;
  for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++)
    if (strcmp(scalars[i].name, name.name) == 0) t->kind = scalars[i].kind;
  return t;
}

/* ---- syntax errors ----------------------------------------------------------- */

/* Appends the source text of `at` to b, quoted with q, shortened and with
 * non-printable bytes escaped, so a message never carries raw garbage. */
static void put_text(StrBuf *b, LexState *st, Span at, char q) {
  int lo = at.lo, hi = at.hi;
  if (lo < 0 || hi > st->len || hi < lo) return;
  bool cut = hi - lo > 32;
  if (cut) hi = lo + 29;
  sb_printf(b, "%c", q);
  for (int i = lo; i < hi; i++) {
    unsigned char c = (unsigned char)st->text[i];
    if (c >= 0x20 && c < 0x7f) sb_printf(b, "%c", c);
    else sb_printf(b, "\\x%02x", c);
  }
  sb_printf(b, "%s%c", cut ? "..." : "", q);
}

/* "identifier 'foo'", "number '42'", "newline", "'else'" ... */
static void describe_token(StrBuf *b, LexState *st, yysymbol_kind_t k, Span at) {
  switch (k) {
  case YYSYMBOL_IDENT: sb_puts(b, "identifier "); put_text(b, st, at, '\''); return;
  case YYSYMBOL_INT:
  case YYSYMBOL_FLOAT: sb_puts(b, "number "); put_text(b, st, at, '\''); return;
  case YYSYMBOL_QTY: sb_puts(b, "quantity "); put_text(b, st, at, '\''); return;
  case YYSYMBOL_STRING: sb_puts(b, "string "); put_text(b, st, at, ' '); return;
  default: sb_puts(b, yysymbol_name(k)); return;
  }
}

static bool name_in(const char *name, const char *const *list) {
  for (; *list; list++)
    if (strcmp(name, *list) == 0) return true;
  return false;
}

/* Binary operators: dropped from "expected" lists (rarely what was meant). */
static const char *const operators[] = {
  "'or'", "'and'", "'=='", "'!='", "'<'", "'<='", "'>'", "'>='", "'+'", "'-'",
  "'*'", "'/'", "'//'", "'%'", "'@'", NULL};
/* Tokens that only start something a summary word already names. */
static const char *const starters[] = {
  "identifier", "integer", "float", "quantity", "string", "'-'", "'('", "'['", "'{'", NULL};

/* Reports a syntax error at the offending token. The expected set is summarized so
 * the message stays short: operators are dropped, and the many tokens that start
 * an item, a statement, a setting or an expression become one phrase. */
static int yyreport_syntax_error(const yypcontext_t *ctx, yyscan_t scanner, LexState *st) {
  (void)scanner;
  if (st->fatal || diag_too_many() || st->after_bad_char) return 0;
  yysymbol_kind_t tok = yypcontext_token(ctx);
  Span at = *yypcontext_location(ctx);
  if (at.lo < st->quiet_to) return 0;
  yysymbol_kind_t exp[YYNTOKENS];
  int n = yypcontext_expected_tokens(ctx, exp, YYNTOKENS);
  bool has[YYNTOKENS] = {0};
  for (int i = 0; i < n; i++) has[exp[i]] = true;

  StrBuf b = {0};
  sb_puts(&b, "unexpected ");
  describe_token(&b, st, tok, at);

  const char *words[YYNTOKENS + 1];
  int nw = 0;
  if (has[YYSYMBOL_FN] && has[YYSYMBOL_MESH])
    words[nw++] = "an item (fn, model, mesh, train, const, import)";
  else if (has[YYSYMBOL_INPUT] && has[YYSYMBOL_RETURN] && has[YYSYMBOL_IDENT] && !has[YYSYMBOL_MESH])
    words[nw++] = "a statement";
  else if (has[YYSYMBOL_MESH] && has[YYSYMBOL_IDENT])
    words[nw++] = "a setting name";
  else if (has[YYSYMBOL_INT] && has[YYSYMBOL_IDENT])
    words[nw++] = "an expression";
  bool summarized = nw > 0;
  bool newline = has[YYSYMBOL_NEWLINE];
  /* After a complete operand, '(' (a call) and '=' (a keyword argument) are
   * possible but unlikely to be what is missing when a closer would also do. */
  bool closer = newline || has[YYSYMBOL_YYEOF];
  for (int i = 0; i < n; i++) {
    const char *name = yysymbol_name(exp[i]);
    if (!strcmp(name, "')'") || !strcmp(name, "']'") || !strcmp(name, "'}'") ||
        !strcmp(name, "','"))
      closer = true;
  }
  for (int i = 0; i < n; i++) {
    yysymbol_kind_t k = exp[i];
    const char *name = yysymbol_name(k);
    if (k == YYSYMBOL_START_PROGRAM || k == YYSYMBOL_START_EXPR || k == YYSYMBOL_YYerror) continue;
    if (name_in(name, operators)) continue;
    if (summarized && (name_in(name, starters) || (k >= YYSYMBOL_FN && k <= YYSYMBOL_NOT)))
      continue;
    if (newline && (strcmp(name, "';'") == 0 || strcmp(name, "','") == 0)) continue;
    if (closer && (strcmp(name, "'('") == 0 || strcmp(name, "'='") == 0)) continue;
    if (summarized && (k == YYSYMBOL_NEWLINE || k == YYSYMBOL_YYEOF))
      continue; /* "expected an item" / "a statement" ... says enough */
    words[nw++] = name;
  }
  if (nw > 5) nw = 5;
  if (nw > 0) {
    sb_puts(&b, ", expected ");
    for (int i = 0; i < nw; i++)
      sb_printf(&b, "%s%s", i == 0 ? "" : i == nw - 1 ? " or " : ", ", words[i]);
  }
  diag_error(at, "%s", sb_str(&b));
  if (tok == YYSYMBOL_YYEOF && st->depth > 0) {
    int lo = st->opened_at[st->depth - 1];
    diag_note((Span){st->file, lo, lo + 1}, "the '%c' opened here is never closed",
              st->brackets[st->depth - 1]);
  }
  if (tok == YYSYMBOL_NEWLINE && nw == 1 && strcmp(words[0], "'{'") == 0)
    diag_hint("the '{' that opens a body must be on the same line as its header");
  if (tok == YYSYMBOL_EQ || tok == YYSYMBOL_NE || tok == YYSYMBOL_LE || tok == YYSYMBOL_GE ||
      !strcmp(yysymbol_name(tok), "'<'") || !strcmp(yysymbol_name(tok), "'>'"))
    diag_hint("comparisons do not chain: write (a < b) and (b < c)");
  /* Python and PyTorch habits: x ** 2, x[0], for i in range(n). */
  const char *src = at.file >= 0 ? src_text(at.file) : NULL;
  char prev = 0;
  for (int p = at.lo - 1; src && p >= 0 && !prev; p--)
    if (src[p] != ' ' && src[p] != '\t') prev = src[p];
  const char *tname = yysymbol_name(tok);
  if (!strcmp(tname, "'*'") && prev == '*')
    diag_hint("there is no '**': write pow(x, 2.0) or square(x)");
  else if (!strcmp(tname, "'['") && prev && (isalnum((unsigned char)prev) || prev == '_' || prev == ')' || prev == ']'))
    diag_hint("tensors are not indexed with [...]: use slice(x, axis, start, end) (or split)");
  else if (nw == 1 && !strcmp(words[0], "'..'"))
    diag_hint("a loop runs over a range written A..B: for i in 0..n");
  else if ((!strcmp(tname, "'+'") || !strcmp(tname, "'-'") || !strcmp(tname, "'*'") || !strcmp(tname, "'/'") ||
            !strcmp(tname, "'@'")) && src && at.hi < st->len && src[at.hi] == '=')
    diag_hint("there is no '%c=': write y = y %c x", tname[1], tname[1]);
  else if (tok == YYSYMBOL_IDENT && src && prev >= '0' && prev <= '9' && at.lo > 0 && (src[at.lo - 1] == ' ' || src[at.lo - 1] == '\t')) {
    char unit[16];
    snprintf(unit, sizeof unit, "%.*s", at.hi - at.lo < 15 ? at.hi - at.lo : 15, src + at.lo);
    int q = at.lo, p0;
    while (q > 0 && (src[q - 1] == ' ' || src[q - 1] == '\t')) q--;
    for (p0 = q; p0 > 0 && q - p0 < 24 && (isalnum((unsigned char)src[p0 - 1]) || src[p0 - 1] == '.'); p0--) {}
    if (unit_find(unit))
      diag_hint("a unit follows its number without a space: %.*s%s", q - p0, src + p0, unit);
  } else if (tok == YYSYMBOL_IDENT && src && at.hi - at.lo == 3 && !strncmp(src + at.lo, "def", 3))
    diag_hint("a layer is a fn: fn NAME(x: [*, C], n: int) { ... return y }, its body in braces");
  else if (tok == YYSYMBOL_IDENT && src && at.hi - at.lo == 5 && !strncmp(src + at.lo, "class", 5))
    diag_hint("there are no classes: a module is a fn that declares its params, "
              "fn mlp(x: [*, C]) { param w: [C, 4 * C] = normal(0.02) ... return y }");
  else if (tok == YYSYMBOL_FOR && st->depth > 0 && (st->brackets[st->depth - 1] == '[' || st->brackets[st->depth - 1] == '('))
    diag_hint("there are no comprehensions: a loop is a statement, for i in 0..n { ... }");
  else if (!strcmp(tname, "':'") && st->depth > 0 && st->brackets[st->depth - 1] == '{' &&
           nw > 0 && !strcmp(words[nw - 1], "'{'"))
    diag_hint("a body is written in braces, not after ':': if cond { ... }, for i in 0..n { ... }");
  else if (!strcmp(tname, "':'") && st->depth > 0 &&
           (st->brackets[st->depth - 1] == '[' || st->brackets[st->depth - 1] == '(' || (nw > 0 && !strcmp(words[nw - 1], "'='"))))
    diag_hint("keys, settings and keyword arguments are written with '=': model = gpt(), [gpu = 8], f(x, axis = -1)");
  else if (nw == 1 && !strcmp(words[0], "':'"))
    diag_hint("a parameter needs its type: x: [*, C] (a tensor), n: int, p: float, flag: bool");
  /* a '(' or '[' left open on an earlier line: its newlines end nothing, so the error comes late */
  if (tok != YYSYMBOL_YYEOF && st->depth > 0 && src &&
      (st->brackets[st->depth - 1] == '(' || st->brackets[st->depth - 1] == '[')) {
    int lo = st->opened_at[st->depth - 1];
    bool earlier_line = false;
    for (int p = lo; p < at.lo && p < st->len; p++) earlier_line |= src[p] == '\n';
    if (earlier_line)
      diag_note((Span){st->file, lo, lo + 1}, "the '%c' opened here is not closed: inside it a newline ends nothing",
                st->brackets[st->depth - 1]);
  }
  return 0;
}

static void cpyyerror(Span *loc, yyscan_t scanner, LexState *st, const char *msg) {
  (void)scanner;
  if (st->fatal) return;
  if (strcmp(msg, "memory exhausted") == 0)
    diag_error(*loc, "too deeply nested (the parser stack is full)");
  else
    diag_error(*loc, "%s", msg);
  st->fatal = true;
}
