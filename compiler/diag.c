/* diag.c: diagnostics as a C compiler prints them:
 *
 *   gpt.cplan:12:7: error: unknown function 'gelu2'
 *      12 |   x = gelu2(x)
 *         |       ^~~~~
 *   hint: did you mean 'gelu'?
 *
 * Errors are counted; after CP_MAX_ERRORS the passes stop (diag_too_many) and a
 * last line says so once. Notes and hints belong to the diagnostic before them
 * and are dropped with it when it was suppressed. An error already reported (the same
 * place and text: a pass that meets one node twice, as the emitters do for the train
 * and eval phases) is not repeated or counted again, nor is one of the same text in an open
 * group (diag_group_begin: one call of a fn from a model body). */
#include "cplan.h"

#include <stdlib.h>
#include <string.h>

static FILE *out_file;
static bool out_set;
static bool color;
static int nerrors;
static bool suppressed; /* the last error was past the limit: drop its notes */
static bool said_limit;
static struct { Span at; char *text; } said[CP_MAX_ERRORS]; /* the errors reported */
static int group_from = -1; /* the first error of the open group, -1 when none */
static bool said_in_group; /* the last error repeated one of the open group */

static FILE *out(void) { return out_set ? out_file : stderr; }

void diag_set_output(FILE *f) {
  out_file = f;
  out_set = true;
}
void diag_set_color(bool on) { color = on; }
int diag_errors(void) { return nerrors; }
bool diag_too_many(void) { return nerrors >= CP_MAX_ERRORS; }

void diag_reset(void) {
  for (int k = 0; k < nerrors && k < CP_MAX_ERRORS; k++) free(said[k].text), said[k].text = NULL;
  nerrors = 0;
  suppressed = false;
  said_limit = false;
  group_from = -1;
}

int diag_group_begin(void) {
  int prev = group_from;
  if (group_from < 0) group_from = nerrors;
  return prev;
}
void diag_group_end(int prev) {
  group_from = prev;
  if (prev < 0 && said_in_group) suppressed = false; /* what follows (the call's note) belongs to the group */
  said_in_group = false;
}

/* Length of the valid UTF-8 sequence at s (at most max bytes), 0 if invalid. */
static size_t utf8_len(const char *s, size_t max) {
  unsigned char c = (unsigned char)s[0];
  size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
  if (n == 0 || n > max) return 0;
  for (size_t i = 1; i < n; i++)
    if (((unsigned char)s[i] & 0xC0) != 0x80) return 0;
  return n;
}

/* Prints the line holding span.lo with a gutter, then ^~~~ under [lo, hi). */
static void print_source_line(FILE *f, Span sp) {
  const char *text = src_text(sp.file);
  size_t len = src_len(sp.file);
  int line, col;
  src_linecol(sp.file, sp.lo, &line, &col);
  size_t start = (size_t)(sp.lo - (col - 1));
  size_t end = start;
  while (end < len && text[end] != '\n') end++;
  if (end > start && text[end - 1] == '\r') end--;
  /* Very long lines (minified garbage) are cut around the caret. */
  size_t from = start, to = end;
  if (to - from > 200) {
    size_t at = (size_t)sp.lo;
    from = at > start + 80 ? at - 80 : start;
    to = from + 200 < end ? from + 200 : end;
  }
  fprintf(f, "%5d | ", line);
  for (size_t i = from; i < to;) {
    unsigned char c = (unsigned char)text[i];
    size_t n = c >= 0x80 ? utf8_len(text + i, to - i) : 1;
    if (n == 0) { /* not UTF-8: show a '?' per byte so the caret stays aligned */
      fputc('?', f);
      i++;
      continue;
    }
    if (n > 1) fwrite(text + i, 1, n, f);
    else fputc(c == '\t' ? ' ' : (c < 32 || c == 127) ? '?' : c, f);
    i += n;
  }
  fputs("\n      | ", f);
  size_t lo = (size_t)sp.lo, hi = (size_t)sp.hi;
  if (hi > end) hi = end;
  for (size_t i = from; i < lo && i < to;) { /* one column per printed character */
    size_t n = (unsigned char)text[i] >= 0x80 ? utf8_len(text + i, to - i) : 1;
    fputc(' ', f);
    i += n ? n : 1;
  }
  if (color) fputs("\033[1;32m", f);
  fputc('^', f);
  for (size_t i = lo + 1; i < hi && i < to; i++)
    if (((unsigned char)text[i] & 0xC0) != 0x80) fputc('~', f);
  if (color) fputs("\033[0m", f);
  fputc('\n', f);
}

static void vreport(const char *kind, const char *kcolor, Span at, const char *fmt, va_list ap);
static void report(const char *kind, const char *kcolor, Span at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void report(const char *kind, const char *kcolor, Span at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(kind, kcolor, at, fmt, ap);
  va_end(ap);
}

static void vreport(const char *kind, const char *kcolor, Span at, const char *fmt, va_list ap) {
  FILE *f = out();
  if (!f) return;
  if (at.file >= 0 && at.file < src_count()) {
    int line, col;
    src_linecol(at.file, at.lo, &line, &col);
    fprintf(f, "%s:%d:%d: ", src_path(at.file), line, col);
  } else {
    fputs("cplanc: ", f);
  }
  if (color) fprintf(f, "%s%s:\033[0m ", kcolor, kind);
  else fprintf(f, "%s: ", kind);
  vfprintf(f, fmt, ap);
  fputc('\n', f);
  if (at.file >= 0 && at.file < src_count()) print_source_line(f, at);
}

void diag_error(Span at, const char *fmt, ...) {
  if (nerrors >= CP_MAX_ERRORS) {
    suppressed = true;
    if (!said_limit && out()) {
      fprintf(out(), "cplanc: too many errors (%d), stopping\n", CP_MAX_ERRORS);
      said_limit = true;
    }
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *text = malloc((size_t)(len > 0 ? len : 0) + 1);
  if (!text) return;
  va_start(ap, fmt);
  vsnprintf(text, (size_t)(len > 0 ? len : 0) + 1, fmt, ap);
  va_end(ap);
  for (int k = 0; k < nerrors; k++)
    if (((said[k].at.file == at.file && said[k].at.lo == at.lo && said[k].at.hi == at.hi) ||
         (group_from >= 0 && k >= group_from)) &&
        said[k].text && strcmp(said[k].text, text) == 0) {
      suppressed = true; /* and its notes */
      said_in_group = group_from >= 0;
      free(text);
      return;
    }
  said_in_group = false;
  said[nerrors].at = at, said[nerrors].text = text;
  nerrors++;
  suppressed = false;
  report("error", "\033[1;31m", at, "%s", text);
}

void diag_warning(Span at, const char *fmt, ...) {
  if (nerrors >= CP_MAX_ERRORS) {
    suppressed = true;
    return;
  }
  suppressed = false;
  va_list ap;
  va_start(ap, fmt);
  vreport("warning", "\033[1;35m", at, fmt, ap);
  va_end(ap);
}

void diag_note(Span at, const char *fmt, ...) {
  if (suppressed) return;
  va_list ap;
  va_start(ap, fmt);
  vreport("note", "\033[1;36m", at, fmt, ap);
  va_end(ap);
}

void diag_hint(const char *fmt, ...) {
  if (suppressed || !out()) return;
  FILE *f = out();
  va_list ap;
  va_start(ap, fmt);
  fputs(color ? "\033[1;36mhint:\033[0m " : "hint: ", f);
  vfprintf(f, fmt, ap);
  fputc('\n', f);
  va_end(ap);
}
