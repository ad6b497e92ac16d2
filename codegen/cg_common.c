/* cg_common.c: the helpers both emitters (emit_c.c: CPU programs, emit_cu.c: CUDA programs) use. */
#include "cg_common.h"

#include "../compiler/lower.h"
#include "../compiler/placement.h"

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

void cg_all_to_all_blocks(const Node *n, const Node *x, CgBlocks *pack, CgBlocks *unpack) {
  int d1 = (int)n->ia[1], d2 = (int)n->ia[2];
  int64_t k = n->ia[3];
  const Shape *X = &x->shape, *Y = &n->shape;
  int64_t o2 = cg_dims_prod(X, 0, d2), i2 = cg_dims_prod(X, d2 + 1, X->rank);
  *pack = (CgBlocks){.k = k, .rows = o2, .width = Y->d[d2] * i2, .src_pitch = X->d[d2] * i2, .dst_pitch = Y->d[d2] * i2,
                     .src_step = Y->d[d2] * i2, .dst_step = o2 * Y->d[d2] * i2};
  /* a received block has x's shape with d2 at Y's size: Y's dims but d1 at x's size */
  int64_t o1 = cg_dims_prod(Y, 0, d1), i1 = cg_dims_prod(Y, d1 + 1, Y->rank);
  *unpack = (CgBlocks){.k = k, .rows = o1, .width = X->d[d1] * i1, .src_pitch = X->d[d1] * i1, .dst_pitch = Y->d[d1] * i1,
                       .src_step = o1 * X->d[d1] * i1, .dst_step = X->d[d1] * i1};
}

/* A float literal: 1 -> "1.0f", 1e-06 -> "1e-06f". */
const char *cg_tp_share(const Lowered *lw, int k) {
  double f = !lw ? 1 : k < 0 ? lw->loss_share : lw->metric_share[k];
  return f == 1 ? "" : cp_fmt(" * %.17g", f);
}

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

/* ---- reading the graph ---------------------------------------------------------------------- */

int64_t cg_rows(const Node *n) { return cg_dims_prod(&n->shape, 0, n->shape.rank - 1); }
int64_t cg_last_dim(const Node *n) { return n->shape.rank ? n->shape.d[n->shape.rank - 1] : 1; }

bool cg_reduce_dims(const Node *n, const Shape *x, int64_t *outer, int64_t *len, int64_t *inner) {
  if (n->ndims <= 0) { /* all axes, or none (a copy) */
    *outer = 1, *len = n->ndims < 0 ? shape_numel(x) : 1, *inner = n->ndims < 0 ? 1 : shape_numel(x);
    return true;
  }
  int a0 = (int)n->dims[0], a1 = (int)n->dims[n->ndims - 1];
  if (a1 - a0 + 1 != n->ndims) return false;
  *outer = cg_dims_prod(x, 0, a0), *len = cg_dims_prod(x, a0, a1 + 1), *inner = cg_dims_prod(x, a1 + 1, x->rank);
  return true;
}

uint64_t cg_dropout_key(const Graph *g, int i) {
  int64_t k = g->nodes[i].ia[0];
  return cg_node_key(k > 0 ? (int)(k - 1) : i);
}

void cg_dropout_map(const Node *n, int64_t tn, const char **local, const char **whole, const char **off) {
  const int r = n->shape.rank, bd = (int)n->ia[1] - 1, td = (int)n->ia[2] - 1, ta = (int)n->ia[3] - 1;
  const char *l = "{", *w = "{", *o = "{";
  for (int d = 0; d < r; d++) {
    long long ld = (long long)n->shape.d[d];
    const char *sep = d ? ", " : "";
    l = cp_fmt("%s%s%lld", l, sep, ld);
    if (d == bd) {
      w = cp_fmt("%s%scplan_plan.dp * cplan_plan.accum * %lld", w, sep, ld);
      o = cp_fmt("%s%s(run->dp_rank * cplan_plan.accum + run->micro_index) * %lld", o, sep, ld);
    } else if (d == td) {
      w = cp_fmt("%s%s%lld", w, sep, ld * (long long)tn);
      o = cp_fmt("%s%srun->axis_coord[%d] * %lld", o, sep, ta, ld);
    } else {
      w = cp_fmt("%s%s%lld", w, sep, ld);
      o = cp_fmt("%s%s0", o, sep);
    }
  }
  if (r == 0) l = "{1", w = "{1", o = "{0";
  *local = cp_fmt("%s}", l), *whole = cp_fmt("%s}", w), *off = cp_fmt("%s}", o);
}

bool cg_mm_dims(const Graph *g, const Node *f, CgMm *mm) {
  const Shape *sa = &g->nodes[f->in[0]].shape, *sb = &g->nodes[f->in[1]].shape;
  mm->m = sa->rank >= 2 ? sa->d[sa->rank - 2] : 1;
  mm->k = sa->d[sa->rank - 1];
  mm->n = sb->rank >= 2 ? sb->d[sb->rank - 1] : 1;
  int64_t ba = sa->rank > 2 ? cg_dims_prod(sa, 0, sa->rank - 2) : 1;
  int64_t bb = sb->rank > 2 ? cg_dims_prod(sb, 0, sb->rank - 2) : 1;
  /* Each operand is either shared or has every batch of the output, in the output's order. */
  mm->nb = shape_numel(&f->shape) / (mm->m * mm->n);
  mm->sa = ba == 1 ? 0 : mm->m * mm->k;
  mm->sb = bb == 1 ? 0 : mm->k * mm->n;
  mm->sc = mm->m * mm->n;
  return (ba == mm->nb || ba == 1) && (bb == mm->nb || bb == 1);
}

const char *cg_scalar_in(const OptimizerConf *o, const Node *n) {
  if (strcmp(n->name, "lr") == 0) return "lr_at(run->step)";
  if (strcmp(n->name, "bc1") == 0) return cp_fmt("1.0 - pow(%.17g, (double)(run->step + 1))", o->beta1);
  if (strcmp(n->name, "bc2") == 0) return cp_fmt("1.0 - pow(%.17g, (double)(run->step + 1))", o->beta2);
  return NULL;
}

int64_t cg_index_bound(const Node *n, int64_t whole) { return n->ia[1] > 0 ? n->ia[1] : whole; }

int64_t cg_vocab(const Graph *g, const StratPlan *sp) {
  if (g->inputs.n == 0) return 0;
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    const Node *tb = n->op == OP_EMBEDDING ? &g->nodes[n->in[0]] : NULL;
    if (tb && n->in[1] == g->inputs.a[0] && tb->op == OP_PARAM && tb->ia[1] > 0 && tb->ia[2] == 0)
      return tb->ia[1]; /* a table padded for tp (vocab_pad): its valid rows, not the pad */
    if (n->op == OP_EMBEDDING && n->in[1] == g->inputs.a[0]) /* vocab-parallel: this rank's rows */
      return g->nodes[n->in[0]].shape.d[0] * (sp && n->ia[0] > 0 ? sp->axes[n->ia[0] - 1].n : 1);
  }
  for (int i = 0; i < g->n; i++) { /* the loss may be all-reduced after a vocab-parallel cross_entropy */
    const Node *n = &g->nodes[i];
    if (n->op == OP_CROSS_ENTROPY && n->role != ROLE_UPD)
      return cg_last_dim(&g->nodes[n->in[0]]) * (sp && n->ia[0] > 0 ? sp->axes[n->ia[0] - 1].n : 1);
  }
  return 65536;
}

double cg_step_flops(const Graph *g) {
  double f = 0;
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].role != ROLE_UPD) f += ir_node_flops(g, i);
  return f * (double)(g->accum > 0 ? g->accum : 1);
}

/* ---- checks --------------------------------------------------------------------------------- */

bool cg_check_inputs(const Graph *g, const TrainConf *t, bool notes) {
  if (t->data.kind == DATA_TENSORS) return true;
  bool ok = g->inputs.n == 2;
  for (int k = 0; ok && k < 2; k++) {
    const Node *x = &g->nodes[g->inputs.a[k]];
    ok = x->dtype == DT_I32 && x->shape.rank == 2;
  }
  if (ok) ok = shape_eq(&g->nodes[g->inputs.a[0]].shape, &g->nodes[g->inputs.a[1]].shape);
  if (ok) return true;
  diag_error(t->data.span, "%s data feeds two i32 [B, T] inputs (inputs, targets), but model '%s' has %d input%s",
             t->data.kind == DATA_TOKENS ? "tokens" : "adder", g->model_name, g->inputs.n, g->inputs.n == 1 ? "" : "s");
  for (int k = 0; notes && k < g->inputs.n; k++) {
    const Node *x = &g->nodes[g->inputs.a[k]];
    diag_note(x->span, "input '%s' is %s%s", x->name, dtype_name(x->dtype), shape_str(&x->shape));
  }
  return false;
}

bool cg_check_sizes(const Graph *g, const char *backend) {
  for (int i = 0; i < g->n; i++)
    if (shape_numel(&g->nodes[i].shape) > INT32_MAX) {
      diag_error(g->nodes[i].span, "a tensor of %s elements is too large for the %s kernels (at most 2^31 - 1)",
                 cp_commas(shape_numel(&g->nodes[i].shape)), backend);
      return false;
    }
  return true;
}

/* ---- text ----------------------------------------------------------------------------------- */

/* The IR printer's lines, one per node (its header line dropped). */
char **cg_ir_lines(const Graph *g) {
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  cp_assert(m != NULL);
  ir_print(m, g);
  fclose(m);
  char **lines = cp_alloc(sizeof(char *) * (size_t)(g->n + 1));
  char *s = strchr(buf, '\n');
  for (int i = 0; i < g->n; i++) {
    lines[i] = "";
    if (!s) continue;
    char *e = strchr(s + 1, '\n');
    size_t n = e ? (size_t)(e - s - 1) : strlen(s + 1);
    char *line = cp_strndup(s + 1, n), *o = line;
    for (char *p = line; *p; p++) { /* squeeze the printer's column padding; no comment ends early */
      if (p[0] == ' ' && p[1] == ' ' && p[2] == ' ') continue;
      *o++ = (p[0] == '*' && p[1] == '/') ? '+' : *p;
    }
    *o = 0;
    lines[i] = line;
    s = e;
  }
  free(buf);
  return lines;
}

void cg_comment(FILE *out, const Graph *g, char *const *irline, int i) {
  const char *text = cg_src_line_text(g->nodes[i].span);
  fprintf(out, "  /* %s */\n", irline[i]);
  if (*text) fprintf(out, "  /*   | %s */\n", text);
}

void cg_emit_lr(FILE *out, const TrainConf *t) {
  const ScheduleConf *s = &t->schedule;
  fprintf(out, "\n/* the learning rate schedule (%s) */\nstatic double lr_at(int64_t step) {\n",
          s->kind == SCHED_CONSTANT ? "constant" : s->kind == SCHED_COSINE ? "cosine" : "linear");
  fprintf(out, "  const double lr = %.17g;\n", t->optimizer.lr);
  if (s->kind == SCHED_CONSTANT) {
    fprintf(out, "  (void)step;\n  return lr;\n}\n");
    return;
  }
  fprintf(out, "  const int64_t warmup = %lld, steps = %lld;\n  const double end = %.17g;\n", (long long)s->warmup,
          (long long)t->steps, s->end_lr);
  fprintf(out, "  if (step < warmup) return lr * (double)(step + 1) / (double)warmup;\n");
  fprintf(out, "  if (steps <= warmup) return end;\n");
  fprintf(out, "  double x = (double)(step - warmup) / (double)(steps - warmup);\n  if (x > 1) x = 1;\n");
  if (s->kind == SCHED_COSINE)
    fprintf(out, "  return end + 0.5 * (lr - end) * (1.0 + cos(3.14159265358979323846 * x));\n}\n");
  else fprintf(out, "  return lr + (end - lr) * x;\n}\n");
}

void cg_append(FILE *out, FILE *body) {
  rewind(body);
  char buf[8192];
  for (size_t got; (got = fread(buf, 1, sizeof buf, body)) > 0;) fwrite(buf, 1, got, out);
  fclose(body);
}
