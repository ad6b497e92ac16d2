/* parse.c: from files to a Program. Runs the scanner (cplan.l) and the parser
 * (cplan.y) over one source at a time, then resolves imports: a bare name is a
 * file of the embedded standard library, anything else a path relative to the
 * importing file. Each file is loaded once (keyed by its real path, or by
 * "<stdlib>/NAME.cplan"); an import that reaches a file still being loaded closes
 * a cycle and is an error. Imported items come before the importer's. */
#include "ast.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cplan.tab.h"
#define YYSTYPE CPYYSTYPE
#define YYLTYPE CPYYLTYPE
#include "cplan.lex.h"

/* Generated from the stdlib .cplan files by tools/embed_stdlib.cmake. */
extern const struct cp_stdlib_file { const char *name; const char *text; } cp_stdlib[];
extern const int cp_stdlib_count;

/* A file of the program being loaded. */
typedef struct Loaded {
  const char *key; /* real path, or "<stdlib>/NAME.cplan" */
  int file;        /* source id */
  bool done;       /* false while its imports are being loaded (a cycle if reached) */
} Loaded;

typedef struct Loader {
  VEC(Loaded) files;
  VEC(int) chain;    /* indices into files: the import chain being loaded */
  VEC(Item *) items; /* the program's items in load order */
} Loader;

/* Runs the parser over one registered source; `start` is the first token the
 * scanner emits (START_PROGRAM or START_EXPR). False when it failed to parse. */
static bool parse_source(int file, int start, LexState *st) {
  memset(st, 0, sizeof *st);
  st->file = file;
  st->start_token = start;
  size_t len = src_len(file);
  if (len > (size_t)INT_MAX / 2) {
    diag_error((Span){file, 0, 0}, "file too large (%zu bytes)", len);
    return false;
  }
  st->text = src_text(file);
  st->len = (int)len;
  yyscan_t scanner;
  if (cpyylex_init_extra(st, &scanner) != 0) {
    diag_error((Span){file, 0, 0}, "cannot start the scanner: %s", strerror(errno));
    return false;
  }
  YY_BUFFER_STATE buf = cpyy_scan_bytes(st->text, st->len, scanner);
  int rc = cpyyparse(scanner, st);
  cpyy_delete_buffer(buf, scanner);
  cpyylex_destroy(scanner);
  return rc == 0;
}

const char *stdlib_source(const char *name) {
  for (int i = 0; i < cp_stdlib_count && cp_stdlib[i].name; i++)
    if (strcmp(cp_stdlib[i].name, name) == 0) return cp_stdlib[i].text;
  return NULL;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int find_loaded(Loader *L, const char *key) {
  for (int i = 0; i < L->files.n; i++)
    if (strcmp(L->files.a[i].key, key) == 0) return i;
  return -1;
}

/* "import cycle: a.cplan -> b.cplan -> a.cplan", from the file that starts it. */
static void report_cycle(Loader *L, const Item *it, int first) {
  StrBuf b = {0};
  sb_puts(&b, "import cycle: ");
  int k = 0;
  while (k < L->chain.n && L->chain.a[k] != first) k++;
  for (; k < L->chain.n; k++) sb_printf(&b, "%s -> ", src_path(L->files.a[L->chain.a[k]].file));
  sb_puts(&b, src_path(L->files.a[first].file));
  diag_error(it->span, "%s", sb_str(&b));
}

/* The key of a bare import name ("nn"), checked against the embedded standard
 * library; NULL after a diagnostic. */
static const char *stdlib_key(const Item *it) {
  const char *text = stdlib_source(it->path);
  if (!text) {
    diag_error(it->span, "unknown standard library file '%s'", it->path);
    const char *names[64];
    int n = 0;
    for (int i = 0; i < cp_stdlib_count && cp_stdlib[i].name && n < 64; i++)
      names[n++] = cp_stdlib[i].name;
    const char *best = cp_closest(it->path, names, n);
    if (best) diag_hint("did you mean '%s'?", best);
    else diag_hint("a path to a file of your own ends in '.cplan'");
    return NULL;
  }
  return cp_fmt("<stdlib>/%s.cplan", it->path);
}

/* The path of an import relative to the importing file's directory. */
static const char *import_path(const Item *it) {
  const char *from = src_path(it->file);
  const char *slash = strrchr(from, '/');
  if (it->path[0] == '/' || !slash) return it->path;
  return cp_fmt("%.*s/%s", (int)(slash - from), from, it->path);
}

/* Checks that a user import names a readable regular file (not a directory or a
 * device that never ends) and returns its key; NULL after a diagnostic. */
static const char *file_key(const Item *it, const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    diag_error(it->span, "cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  if (!S_ISREG(sb.st_mode)) {
    diag_error(it->span, "cannot open '%s': not a regular file", path);
    return NULL;
  }
  char *real = realpath(path, NULL);
  if (!real) return cp_strdup(path);
  const char *key = cp_strdup(real);
  free(real);
  return key;
}

static void load_file(Loader *L, int file, const char *key);

/* Resolves one import item, loading its file unless it was loaded before. */
static void resolve_import(Loader *L, Item *it) {
  bool bare = !strchr(it->path, '/') && !ends_with(it->path, ".cplan");
  const char *key = NULL, *path = NULL;
  if (bare) key = stdlib_key(it);
  else key = file_key(it, path = import_path(it));
  if (!key) return;
  int seen = find_loaded(L, key);
  if (seen >= 0) {
    if (!L->files.a[seen].done) report_cycle(L, it, seen);
    else it->imported_file = L->files.a[seen].file;
    return;
  }
  int file;
  if (bare) {
    const char *text = stdlib_source(it->path);
    file = src_add(key, text, strlen(text));
  } else if ((file = src_load(path)) < 0) {
    diag_error(it->span, "cannot open '%s': %s", path, strerror(errno));
    return;
  }
  it->imported_file = file;
  load_file(L, file, key);
}

/* Parses one file, then its imports (depth first), then appends its items. */
static void load_file(Loader *L, int file, const char *key) {
  int idx = L->files.n;
  VEC_PUSH(L->files, ((Loaded){key, file, false}));
  VEC_PUSH(L->chain, idx);
  LexState st;
  parse_source(file, START_PROGRAM, &st);
  for (int i = 0; i < st.items.n && !diag_too_many(); i++)
    if (st.items.a[i]->kind == IT_IMPORT) resolve_import(L, st.items.a[i]);
  for (int i = 0; i < st.items.n; i++) VEC_PUSH(L->items, st.items.a[i]);
  L->files.a[idx].done = true;
  L->chain.n--;
}

Program *parse_program_source(int file) {
  Loader L = {0};
  const char *key = cp_strdup(src_path(file));
  char *real = realpath(key, NULL);
  if (real) {
    key = cp_strdup(real);
    free(real);
  }
  load_file(&L, file, key);
  Program *p = cp_alloc(sizeof *p);
  p->items = L.items.a;
  p->nitems = L.items.n;
  p->main_file = file;
  return p;
}

Program *parse_program(const char *path) {
  int file = src_load(path);
  if (file < 0) {
    diag_error(SPAN_NONE, "cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  return parse_program_source(file);
}

Expr *parse_expr_source(int file) {
  int before = diag_errors();
  LexState st;
  if (!parse_source(file, START_EXPR, &st) || diag_errors() > before) return NULL;
  return st.expr;
}
