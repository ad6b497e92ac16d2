/* source.c: the registry of source texts (files, the standard library, --set
 * values). Spans name a source by its index here, so any pass can print the line
 * a diagnostic points at, long after parsing. */
#include "cplan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct Source {
  char *path;
  char *text; /* NUL-terminated copy */
  size_t len;
  int *line_starts; /* offsets where each line begins */
  int nlines;
} Source;

static VEC(Source) sources;

Span span_join(Span a, Span b) {
  if (a.file < 0) return b;
  if (b.file < 0 || b.file != a.file) return a;
  Span s = a;
  if (b.lo < s.lo) s.lo = b.lo;
  if (b.hi > s.hi) s.hi = b.hi;
  return s;
}

int src_add(const char *path, const char *text, size_t len) {
  Source s = {0};
  s.path = cp_strdup(path);
  s.text = cp_strndup(text, len);
  s.len = len;
  VEC(int) starts = {0};
  VEC_PUSH(starts, 0);
  for (size_t i = 0; i < len; i++)
    if (text[i] == '\n') VEC_PUSH(starts, (int)i + 1);
  s.line_starts = starts.a;
  s.nlines = starts.n;
  VEC_PUSH(sources, s);
  return sources.n - 1;
}

int src_count(void) { return sources.n; }

static const Source *get(int file) {
  cp_assert(file >= 0 && file < sources.n);
  return &sources.a[file];
}

const char *src_path(int file) { return get(file)->path; }
const char *src_text(int file) { return get(file)->text; }
size_t src_len(int file) { return get(file)->len; }

void src_linecol(int file, int off, int *line, int *col) {
  const Source *s = get(file);
  if (off < 0) off = 0;
  if ((size_t)off > s->len) off = (int)s->len;
  int lo = 0, hi = s->nlines - 1;
  while (lo < hi) { /* last line start <= off */
    int mid = (lo + hi + 1) / 2;
    if (s->line_starts[mid] <= off) lo = mid;
    else hi = mid - 1;
  }
  *line = lo + 1;
  *col = off - s->line_starts[lo] + 1;
}

int src_load(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && !S_ISREG(st.st_mode)) {
    /* a directory, a FIFO or /dev/zero: never block or read forever on one */
    fclose(f);
    errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    return -1;
  }
  char buf[65536];
  size_t n;
  size_t total = 0;
  char *data = NULL;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
    data = cp_realloc(data, total, total + n);
    memcpy(data + total, buf, n);
    total += n;
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    errno = EIO;
    return -1;
  }
  return src_add(path, data ? data : "", total);
}

void src_reset(void) { memset(&sources, 0, sizeof sources); }
