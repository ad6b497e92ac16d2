/* cg_common.c: the helpers both emitters (emit_c.c: CPU programs, emit_cu.c: CUDA programs) use. */
#include "cg_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *cg_c_string(const char *s) {
  if (!s) return "NULL";
  StrBuf b = {0};
  sb_puts(&b, "\"");
  for (const char *p = s; *p; p++) {
    if (*p == '"' || *p == '\\') sb_printf(&b, "\\%c", *p);
    else if ((unsigned char)*p < 32) sb_printf(&b, "\\%03o", (unsigned char)*p);
    else sb_printf(&b, "%c", *p);
  }
  sb_puts(&b, "\"");
  return sb_str(&b);
}

const char *cg_shape_list(const Shape *s) {
  StrBuf b = {0};
  sb_puts(&b, "{");
  for (int k = 0; k < s->rank; k++) sb_printf(&b, "%s%lld", k ? ", " : "", (long long)s->d[k]);
  sb_puts(&b, "}");
  return sb_str(&b);
}

/* Settings paths are relative to the working directory of the compile (the front end resolved
 * them against the .cplan file); the program gets them absolute so it runs from anywhere. */
const char *cg_abs_path(const char *p) {
  char cwd[4096];
  if (!p || p[0] == '/' || !getcwd(cwd, sizeof cwd)) return p;
  return cp_fmt("%s/%s", cwd, p[0] == '.' && p[1] == '/' ? p + 2 : p);
}

/* Product of dims [lo, hi) of a shape. */
int64_t cg_dims_prod(const Shape *s, int lo, int hi) {
  int64_t p = 1;
  for (int k = lo; k < hi; k++) p *= s->d[k];
  return p;
}

/* A float literal: 1 -> "1.0f", 1e-06 -> "1e-06f". */
const char *cg_flt(double v) {
  if (isnan(v)) return "NAN";
  if (isinf(v)) return v > 0 ? "INFINITY" : "-INFINITY";
  const char *s = cp_fmt("%.9g", v);
  return cp_fmt("%s%sf", s, strpbrk(s, ".e") ? "" : ".0");
}

/* CPLAN_FUSION=0 in the environment turns the fusion pass off: every node gets its own
 * reference or fast kernel call, as before fusion existed. A debugging and A/B switch (the
 * `cplanc run` cache does not key on it). */
bool cg_fusion_enabled(void) {
  const char *e = getenv("CPLAN_FUSION");
  return !(e && strcmp(e, "0") == 0);
}

Fusion *cg_no_fusion(const Graph *g) {
  Fusion *f = cp_alloc(sizeof *f);
  f->group = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) f->group[i] = -1;
  return f;
}

/* The source line a node came from, trimmed, or "" . */
const char *cg_src_line_text(Span sp) {
  if (sp.file < 0 || sp.file >= src_count()) return "";
  const char *t = src_text(sp.file);
  int lo = sp.lo, hi = sp.lo;
  while (lo > 0 && t[lo - 1] != '\n') lo--;
  while (t[hi] && t[hi] != '\n') hi++;
  while (lo < hi && (t[lo] == ' ' || t[lo] == '\t')) lo++;
  char *s = cp_strndup(t + lo, (size_t)(hi - lo));
  for (char *p = s; *p; p++)
    if ((p[0] == '*' && p[1] == '/') || (p[0] == '/' && p[1] == '*')) p[1] = ' ';
  return s;
}

uint64_t cg_node_key(int i) { /* splitmix64 of the node index: the dropout stream of node i */
  uint64_t z = (uint64_t)i + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
