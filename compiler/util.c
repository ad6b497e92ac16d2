/* util.c: the compiler's arena, strings, string builders and number formatting.
 *
 * One arena for the whole compile: passes allocate freely and nothing is freed
 * piecemeal, so no pass has to reason about ownership. cp_arena_reset() drops it
 * all at once (the fuzzer does this between inputs). */
#include "cplan.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct Chunk {
  struct Chunk *next;
  size_t used, cap;
  _Alignas(16) unsigned char mem[];
} Chunk;

static Chunk *arena;

static _Noreturn void out_of_memory(size_t n) {
  fprintf(stderr, "cplanc: out of memory (allocating %zu bytes)\n", n);
  abort();
}

void *cp_alloc(size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (!arena || arena->cap - arena->used < n) {
    size_t cap = n > (1u << 20) ? n : (1u << 20);
    Chunk *c = malloc(sizeof *c + cap);
    if (!c) out_of_memory(n);
    c->next = arena;
    c->used = 0;
    c->cap = cap;
    arena = c;
  }
  void *p = arena->mem + arena->used;
  arena->used += n;
  memset(p, 0, n);
  return p;
}

void *cp_realloc(void *p, size_t old, size_t n) {
  void *q = cp_alloc(n);
  if (p && old) memcpy(q, p, old < n ? old : n);
  return q;
}

void cp_arena_reset(void) {
  while (arena) {
    Chunk *next = arena->next;
    free(arena);
    arena = next;
  }
}

char *cp_strndup(const char *s, size_t n) {
  char *d = cp_alloc(n + 1);
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

char *cp_strdup(const char *s) { return cp_strndup(s, strlen(s)); }

static char *vfmt(const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  char *s = cp_alloc((size_t)n + 1);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  return s;
}

char *cp_fmt(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = vfmt(fmt, ap);
  va_end(ap);
  return s;
}

static void sb_reserve(StrBuf *b, size_t extra) {
  if (b->len + extra + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + extra + 1) cap *= 2;
  b->s = cp_realloc(b->s, b->cap, cap);
  b->cap = cap;
}

void sb_puts(StrBuf *b, const char *s) {
  size_t n = strlen(s);
  sb_reserve(b, n);
  memcpy(b->s + b->len, s, n + 1);
  b->len += n;
}

void sb_printf(StrBuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = vfmt(fmt, ap);
  va_end(ap);
  sb_puts(b, s);
}

const char *sb_str(StrBuf *b) { return b->s ? b->s : ""; }

char *cp_commas(int64_t v) {
  char digits[32];
  uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  int n = snprintf(digits, sizeof digits, "%llu", (unsigned long long)u);
  char *out = cp_alloc((size_t)n + (size_t)n / 3 + 2);
  char *p = out;
  if (v < 0) *p++ = '-';
  for (int i = 0; i < n; i++) {
    if (i > 0 && (n - i) % 3 == 0) *p++ = ',';
    *p++ = digits[i];
  }
  *p = 0;
  return out;
}

char *cp_bytes_str(double bytes) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (fabs(bytes) >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    u++;
  }
  return u == 0 ? cp_fmt("%.0f B", bytes) : cp_fmt("%.2f %s", bytes, units[u]);
}

char *cp_si_str(double v, const char *unit) {
  static const char *prefix[] = {"", "K", "M", "G", "T", "P", "E", "Z"};
  int p = 0;
  while (fabs(v) >= 1000.0 && p < 7) {
    v /= 1000.0;
    p++;
  }
  return p == 0 ? cp_fmt("%.0f %s", v, unit) : cp_fmt("%.2f %s%s", v, prefix[p], unit);
}

/* Levenshtein distance, capped; small strings only (identifiers). */
static int edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64) return 1000;
  int row[65];
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int prev = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int cur = row[j];
      int sub = prev + (a[i - 1] != b[j - 1]);
      int del = row[j] + 1, ins = row[j - 1] + 1;
      row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
      prev = cur;
    }
  }
  return row[lb];
}

const char *cp_closest(const char *name, const char *const *cands, int n) {
  const char *best = NULL;
  int bestd = 1000;
  size_t len = strlen(name);
  for (int i = 0; i < n; i++) {
    if (!cands[i] || strcmp(cands[i], name) == 0) continue;
    int d = edit_distance(name, cands[i]);
    if (d < bestd) {
      bestd = d;
      best = cands[i];
    }
  }
  /* Close enough: at most a third of the name's length (and at least 1). */
  int limit = (int)(len / 3) > 1 ? (int)(len / 3) : 1;
  if (len >= 4 && limit < 2) limit = 2;
  /* ... and not every character replaced ('z' is not a slip for 'C'). */
  return bestd <= limit && bestd < (int)len ? best : NULL;
}

_Noreturn void cp_panic(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "cplanc: internal error at %s:%d: ", file, line);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nthis is a bug in cplanc; please report it with the input that caused it\n");
  va_end(ap);
  abort();
}

char *cp_read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  StrBuf b = {0};
  char buf[8192];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf - 1, f)) > 0) {
    buf[n] = 0;
    sb_puts(&b, buf);
  }
  fclose(f);
  return (char *)sb_str(&b);
}

bool cp_copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
  bool ok = in && out;
  char buf[1 << 16];
  size_t n;
  while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
  if (in) fclose(in);
  if (out && fclose(out) != 0) ok = false;
  return ok;
}

bool cp_mkdir_p(const char *path) {
  char *p = cp_strdup(path);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0755) < 0 && errno != EEXIST) return false;
    *s = '/';
  }
  return mkdir(p, 0755) == 0 || errno == EEXIST;
}

void cp_argv_words(CpArgv *a, const char *s) {
  while (*s) {
    while (*s == ' ') s++;
    const char *e = s;
    while (*e && *e != ' ') e++;
    if (e > s) VEC_PUSH(*a, cp_strndup(s, (size_t)(e - s)));
    s = e;
  }
}

bool cp_run_logged(const CpArgv *a, const char *log) {
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
    execvp(a->a[0], (char *const *)a->a);
    fprintf(stderr, "cannot run %s: %s\n", a->a[0], strerror(errno));
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return false;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* ---- a string -> int map ------------------------------------------------------------------- */

static unsigned hash_str(const char *s) {
  unsigned h = 2166136261u; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

static void map_grow(CpMap *m) {
  CpMap old = *m;
  m->cap = old.cap ? 2 * old.cap : 64;
  m->keys = cp_alloc((size_t)m->cap * sizeof *m->keys);
  m->vals = cp_alloc((size_t)m->cap * sizeof *m->vals);
  m->n = 0;
  for (int i = 0; i < old.cap; i++)
    if (old.keys[i]) cp_map_put(m, old.keys[i], old.vals[i]);
}

int cp_map_get(const CpMap *m, const char *key) {
  if (!m->cap) return -1;
  for (unsigned i = hash_str(key) & (unsigned)(m->cap - 1);; i = (i + 1) & (unsigned)(m->cap - 1)) {
    if (!m->keys[i]) return -1;
    if (strcmp(m->keys[i], key) == 0) return m->vals[i];
  }
}

void cp_map_put(CpMap *m, const char *key, int val) {
  if (2 * (m->n + 1) > m->cap) map_grow(m);
  unsigned i = hash_str(key) & (unsigned)(m->cap - 1);
  while (m->keys[i] && strcmp(m->keys[i], key) != 0) i = (i + 1) & (unsigned)(m->cap - 1);
  if (!m->keys[i]) m->n++;
  m->keys[i] = key;
  m->vals[i] = val;
}
