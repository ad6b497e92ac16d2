/* cplan.h: what every part of the compiler shares: spans, sources, diagnostics,
 * allocation and small containers.
 *
 * Three kinds of failure are kept apart (STYLE.md habit 4):
 *  - user errors  -> diag_error() with a span; the pass keeps going where it can;
 *  - internal bugs -> cp_assert() / cp_unreachable(), which name the file and line;
 *  - external failures (file I/O, libraries) -> a diagnostic that names the call.
 */
#ifndef CPLAN_H
#define CPLAN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CPLAN_VERSION "0.1.0"
#define CP_MAX_RANK 8      /* tensors have at most this many dims */
#define CP_MAX_ERRORS 20   /* diagnostics stop the compile after this many errors */

/* ---- spans (source.c) --------------------------------------------------- */

/* A half-open byte range [lo, hi) in one registered source. file < 0: no location
 * (for example a value that came from nowhere in particular). */
typedef struct Span {
  int file;  /* index from src_add(), or -1 */
  int lo;    /* first byte */
  int hi;    /* one past the last byte (hi == lo: a point) */
} Span;

#define SPAN_NONE ((Span){-1, 0, 0})

Span span_join(Span a, Span b); /* the smallest span covering both (same file) */

/* Registers a source text under a display path (the text is copied). Returns its id. */
int src_add(const char *path, const char *text, size_t len);
int src_count(void);
const char *src_path(int file);
const char *src_text(int file);
size_t src_len(int file);
/* 1-based line and column (in bytes) of a byte offset. */
void src_linecol(int file, int off, int *line, int *col);
/* Reads a whole file into a registered source; returns -1 (and sets errno) on failure. */
int src_load(const char *path);
void src_reset(void); /* forget every source (fuzzing) */

/* ---- diagnostics (diag.c) ------------------------------------------------ */
/* Printed as a C compiler does:
 *   file:line:col: error: message
 *     the source line
 *     ^~~~~
 *   hint: did you mean 'gelu'?
 * A note or hint attaches to the diagnostic before it. */
void diag_error(Span at, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void diag_warning(Span at, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void diag_note(Span at, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void diag_hint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int diag_errors(void);    /* errors so far */
bool diag_too_many(void); /* CP_MAX_ERRORS reached: callers should stop */
void diag_reset(void);
/* While a group is open, an error whose text one already reported in the group has is not
 * repeated (a fn body meeting one mistake of its arguments at several calls: q, k and v). Returns
 * the previous group start for diag_group_end; groups nest, the outermost one counts. */
int diag_group_begin(void);
void diag_group_end(int prev);
void diag_set_output(FILE *f); /* default stderr; NULL silences (fuzzing) */
void diag_set_color(bool on);

/* The closest candidate to `name` by edit distance, or NULL when nothing is close
 * enough to suggest. Used by every "did you mean" hint. */
const char *cp_closest(const char *name, const char *const *cands, int n);

/* ---- allocation (util.c) -------------------------------------------------- */
/* Everything the compiler allocates lives in one arena that lives as long as the
 * compile; cp_arena_reset() frees it (used between fuzz inputs). Out of memory
 * aborts with a message: there is nothing sensible to recover. */
void *cp_alloc(size_t n); /* zeroed */
void *cp_realloc(void *p, size_t old, size_t n);
char *cp_strdup(const char *s);
char *cp_strndup(const char *s, size_t n);
char *cp_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cp_arena_reset(void);

/* Growable array of T in the arena: VEC(int) v = {0}; VEC_PUSH(v, 3); v.n, v.a[i]. */
#define VEC(T) struct { T *a; int n, cap; }
#define VEC_PUSH(v, x)                                                                  \
  do {                                                                                  \
    if ((v).n == (v).cap) {                                                             \
      int nc_ = (v).cap ? 2 * (v).cap : 8;                                              \
      (v).a = cp_realloc((v).a, (size_t)(v).cap * sizeof *(v).a, (size_t)nc_ * sizeof *(v).a); \
      (v).cap = nc_;                                                                    \
    }                                                                                   \
    (v).a[(v).n++] = (x);                                                               \
  } while (0)

/* String builder (heap in the arena). */
typedef struct StrBuf {
  char *s;
  size_t len, cap;
} StrBuf;
void sb_puts(StrBuf *b, const char *s);
void sb_printf(StrBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *sb_str(StrBuf *b); /* never NULL */

/* The whole text of a (small) file, in the arena; NULL when it cannot be opened (errno says why). */
char *cp_read_text(const char *path);
bool cp_copy_file(const char *from, const char *to);
bool cp_mkdir_p(const char *path); /* mkdir -p */

/* A string -> int map in the arena (open addressing; keys are not copied): CpMap m = {0}. */
typedef struct CpMap {
  const char **keys;
  int *vals;
  int cap, n;
} CpMap;
int cp_map_get(const CpMap *m, const char *key); /* -1 when absent */
void cp_map_put(CpMap *m, const char *key, int val);

/* A command line being built for cp_run_logged (NULL-terminated before it runs). */
typedef VEC(const char *) CpArgv;
void cp_argv_words(CpArgv *a, const char *s); /* appends each space-separated word of s */
/* Runs the NULL-terminated argv with stdout and stderr into the file log; true on exit status 0. */
bool cp_run_logged(const CpArgv *a, const char *log);

/* Thousands separators: 124439808 -> "124,439,808". Returns an arena string. */
char *cp_commas(int64_t v);
/* Human sizes: 1.5 KiB, 3.2 MiB ...; 1.2 GFLOP ...; arena strings. */
char *cp_bytes_str(double bytes);
char *cp_si_str(double v, const char *unit); /* 1.2e9, "FLOP" -> "1.20 GFLOP" */

/* ---- internal bugs -------------------------------------------------------- */
_Noreturn void cp_panic(const char *file, int line, const char *fmt, ...);
#define cp_assert(c) ((c) ? (void)0 : cp_panic(__FILE__, __LINE__, "assertion failed: %s", #c))
#define cp_unreachable() cp_panic(__FILE__, __LINE__, "unreachable")

#endif
