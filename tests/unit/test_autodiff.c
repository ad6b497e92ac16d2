/* test_autodiff.c: autodiff (ad_backward) and the optimizer lowering (opt_lower).
 *
 * Codegen is not needed: a small double-precision interpreter below runs a training graph node
 * by node with the f64 reference kernels (kernels/cpu/ref.h), GRAD nodes through the matching
 * *_backward_f64 kernel with only the wanted gradient pointer set. Each case elaborates a tiny
 * .cplan model through the real front end, and checks every param's gradient against central
 * finite differences of the loss (together the cases cover every differentiable op, a value used
 * twice and a tied param), gradient accumulation over micro-batches, and one step of AdamW, SGD
 * with momentum and clipping, LAMB and LARS against values computed by hand here.
 * Prints "N passed, N failed" and exits non-zero on any failure. */
#include "ref.h"
#include "sema.h"
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
static bool covered[OP__COUNT]; /* forward ops whose GRAD the interpreter ran */

static void check(bool ok, const char *what, int line) {
  if (ok) {
    passed++;
    return;
  }
  failed++;
  fprintf(stderr, "test_autodiff.c:%d: FAILED: %s\n", line, what);
}
#define CHECK(c) check((c), #c, __LINE__)

/* ---- the interpreter ------------------------------------------------------------------ */

typedef struct Interp {
  const Graph *g;
  double **v; /* per node: its value (i32 values too, as doubles) */
} Interp;

static long numel(const Node *n) { return (long)shape_numel(&n->shape); }
static const Node *nd(const Interp *I, int i) { return &I->g->nodes[i]; }
static const Node *input(const Interp *I, const Node *n, int k) { return &I->g->nodes[n->in[k]]; }
static double *vin(const Interp *I, const Node *n, int k) { return I->v[n->in[k]]; }

static int dim(const Node *n, int k) { return (int)n->shape.d[k < 0 ? n->shape.rank + k : k]; }
static int ishape(const Node *n, int *out) {
  for (int k = 0; k < n->shape.rank; k++) out[k] = (int)n->shape.d[k];
  return n->shape.rank;
}
/* x seen as [outer, n, inner] around axis a. */
static void around(const Node *x, int a, int *outer, int *n, int *inner) {
  *outer = *inner = 1;
  for (int k = 0; k < a; k++) *outer *= dim(x, k);
  *n = dim(x, a);
  for (int k = a + 1; k < x->shape.rank; k++) *inner *= dim(x, k);
}

static int32_t *to_i32(const double *x, long n) {
  int32_t *o = malloc((size_t)(n ? n : 1) * sizeof *o);
  for (long i = 0; i < n; i++) o[i] = (int32_t)x[i];
  return o;
}

static Interp *interp_new(const Graph *g) {
  Interp *I = calloc(1, sizeof *I);
  I->g = g;
  I->v = calloc((size_t)g->n, sizeof *I->v);
  for (int i = 0; i < g->n; i++) I->v[i] = calloc((size_t)numel(&g->nodes[i]), sizeof(double));
  return I;
}

static void interp_free(Interp *I) {
  for (int i = 0; i < I->g->n; i++) free(I->v[i]);
  free(I->v);
  free(I);
}

/* ---- reductions: several axes are reduced one at a time, the last axis first ---------- */
typedef struct Red {
  int na, axes[CP_MAX_RANK];
  int outer[CP_MAX_RANK], n[CP_MAX_RANK], inner[CP_MAX_RANK];
  double *buf[CP_MAX_RANK + 1]; /* buf[0] = x, buf[j+1] = after reducing axes[j] */
} Red;

static void red_forward(const Node *f, const Node *x, const double *xv, Red *r) {
  int shape[CP_MAX_RANK], rank = ishape(x, shape);
  r->na = 0;
  for (int k = rank - 1; k >= 0; k--) {
    bool dropped = f->ndims < 0;
    for (int j = 0; j < f->ndims; j++) dropped |= f->dims[j] == k;
    if (dropped) r->axes[r->na++] = k;
  }
  r->buf[0] = (double *)xv;
  for (int j = 0; j < r->na; j++) {
    int a = r->axes[j], o = 1, in = 1;
    for (int k = 0; k < a; k++) o *= shape[k];
    for (int k = a + 1; k < rank; k++) in *= shape[k];
    r->outer[j] = o, r->n[j] = shape[a], r->inner[j] = in;
    r->buf[j + 1] = calloc((size_t)(o * in), sizeof(double));
    if (f->op == OP_SUM) k_sum_forward_f64(r->buf[j + 1], r->buf[j], o, shape[a], in);
    else if (f->op == OP_MEAN) k_mean_forward_f64(r->buf[j + 1], r->buf[j], o, shape[a], in);
    else k_max_forward_f64(r->buf[j + 1], r->buf[j], o, shape[a], in);
    shape[a] = 1;
  }
}

/* Frees the intermediate buffers of red_forward (buf[0] is the caller's input). */
static void red_free(Red *r) {
  for (int j = 1; j <= r->na; j++) free(r->buf[j]);
}

static void red_backward(const Node *f, const Red *r, const double *dy, double *dx, long nx) {
  long cur = r->na ? (long)r->outer[r->na - 1] * r->inner[r->na - 1] : nx;
  double *d = malloc(sizeof(double) * (size_t)cur);
  memcpy(d, dy, sizeof(double) * (size_t)cur);
  for (int j = r->na - 1; j >= 0; j--) {
    long prev = (long)r->outer[j] * r->n[j] * r->inner[j];
    double *dp = calloc((size_t)prev, sizeof(double));
    if (f->op == OP_SUM) k_sum_backward_f64(dp, d, r->outer[j], r->n[j], r->inner[j]);
    else if (f->op == OP_MEAN) k_mean_backward_f64(dp, d, r->outer[j], r->n[j], r->inner[j]);
    else k_max_backward_f64(dp, d, r->buf[j], r->outer[j], r->n[j], r->inner[j]);
    free(d);
    d = dp;
  }
  for (long i = 0; i < nx; i++) dx[i] += d[i];
  free(d);
}

/* ---- matmul: a [.., m, k] @ b [.., k, n]; a weight b is shared, a shared a is looped ---- */
typedef struct Mm {
  int nb, m, k, n, a_b, b_b;
} Mm;

static Mm mm_dims(const Node *f, const Node *a, const Node *b) {
  cp_assert(a->shape.rank >= 2 && b->shape.rank >= 2);
  Mm d = {.m = dim(a, -2), .k = dim(a, -1), .n = dim(b, -1), .a_b = a->shape.rank > 2, .b_b = b->shape.rank > 2};
  d.nb = (int)(numel(f) / ((long)d.m * d.n));
  if (d.a_b && d.b_b) cp_assert(numel(a) == (long)d.nb * d.m * d.k && numel(b) == (long)d.nb * d.k * d.n);
  return d;
}

static void mm_forward(const Mm *d, double *out, const double *a, const double *b) {
  if (!d->a_b && d->b_b) {
    for (int j = 0; j < d->nb; j++)
      k_matmul_forward_f64(out + (long)j * d->m * d->n, a, b + (long)j * d->k * d->n, 1, d->m, d->k, d->n, 1);
    return;
  }
  k_matmul_forward_f64(out, a, b, d->a_b ? d->nb : 1, d->m, d->k, d->n, d->b_b);
}

static void mm_backward(const Mm *d, double *da, double *db, const double *dy, const double *a, const double *b) {
  if (!d->a_b && d->b_b) {
    for (int j = 0; j < d->nb; j++)
      k_matmul_backward_f64(da, db ? db + (long)j * d->k * d->n : NULL, dy + (long)j * d->m * d->n, a,
                            b + (long)j * d->k * d->n, 1, d->m, d->k, d->n, 1);
    return;
  }
  k_matmul_backward_f64(da, db, dy, a, b, d->a_b ? d->nb : 1, d->m, d->k, d->n, d->b_b);
}

/* ---- one node ------------------------------------------------------------------------- */

static void concat_dims(const Interp *I, const Node *f, int *ns, int *outer, int *inner) {
  int n;
  around(f, (int)f->ia[0], outer, &n, inner);
  for (int k = 0; k < f->nin; k++) ns[k] = dim(input(I, f, k), (int)f->ia[0]);
}

/* Forward of node f into out. */
static void forward(Interp *I, const Node *f, double *out) {
  const Node *x = f->nin ? input(I, f, 0) : NULL;
  double *a = f->nin ? vin(I, f, 0) : NULL, *b = f->nin > 1 ? vin(I, f, 1) : NULL;
  long n = numel(f);
  int sa[CP_MAX_RANK], sb[CP_MAX_RANK], o, m, in;
  switch (f->op) {
  case OP_CONST: out[0] = f->fa[0]; return;
  case OP_ARANGE: for (long i = 0; i < n; i++) out[i] = (double)i; return;
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MAXIMUM: case OP_MINIMUM: case OP_MOD: case OP_FLOORDIV:
  case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: {
    int ra = ishape(x, sa), rb = ishape(input(I, f, 1), sb);
    k_binary_forward_f64((KBinary)(f->op - OP_ADD), out, a, sa, ra, b, sb, rb);
    return;
  }
  case OP_NEG: case OP_EXP: case OP_LOG: case OP_SQRT: case OP_RSQRT: case OP_TANH: case OP_SIGMOID:
  case OP_RELU: case OP_GELU: case OP_SILU: case OP_SQUARE: case OP_POW: case OP_ABS: case OP_CLAMP_MIN:
  case OP_CLAMP_MAX: case OP_ERF: case OP_SIN: case OP_COS:
    k_unary_forward_f64((KUnary)(f->op - OP_NEG), out, a, n, f->fa[0]);
    return;
  case OP_WHERE: {
    int so[CP_MAX_RANK], sc[CP_MAX_RANK], ro = ishape(f, so), rc = ishape(x, sc), ra = ishape(input(I, f, 1), sa),
        rb = ishape(input(I, f, 2), sb);
    k_where_forward_f64(out, so, ro, a, sc, rc, b, sa, ra, vin(I, f, 2), sb, rb);
    return;
  }
  case OP_SUM: case OP_MEAN: case OP_MAX: {
    Red r;
    red_forward(f, x, a, &r);
    memcpy(out, r.buf[r.na], sizeof(double) * (size_t)n);
    red_free(&r);
    return;
  }
  case OP_MATMUL: {
    Mm d = mm_dims(f, x, input(I, f, 1));
    mm_forward(&d, out, a, b);
    return;
  }
  case OP_TRANSPOSE:
    k_transpose_forward_f64(out, a, (int)(n / (dim(x, -1) * dim(x, -2))), dim(x, -2), dim(x, -1));
    return;
  case OP_PERMUTE: {
    int perm[CP_MAX_RANK];
    for (int k = 0; k < f->ndims; k++) perm[k] = (int)f->dims[k];
    k_permute_forward_f64(out, a, sa, ishape(x, sa), perm);
    return;
  }
  case OP_RESHAPE: memcpy(out, a, sizeof(double) * (size_t)n); return;
  case OP_CONCAT: {
    int ns[64];
    const double *xs[64];
    concat_dims(I, f, ns, &o, &in);
    for (int k = 0; k < f->nin; k++) xs[k] = vin(I, f, k);
    k_concat_forward_f64(out, xs, ns, f->nin, o, in);
    return;
  }
  case OP_SLICE:
    around(x, (int)f->ia[0], &o, &m, &in);
    k_slice_forward_f64(out, a, o, m, in, (int)f->ia[1], (int)f->ia[2]);
    return;
  case OP_SPLIT_HEADS: k_split_heads_forward_f64(out, a, dim(x, 0), dim(x, 1), dim(x, 2), (int)f->ia[0]); return;
  case OP_MERGE_HEADS: k_merge_heads_forward_f64(out, a, dim(x, 0), dim(x, 2), dim(x, 1) * dim(x, 3), dim(x, 1)); return;
  case OP_EMBEDDING: {
    const Node *idx = input(I, f, 1);
    int32_t *iv = to_i32(b, numel(idx));
    k_embedding_forward_f64(out, a, iv, (int)numel(idx), dim(x, 0), dim(x, 1));
    free(iv);
    return;
  }
  case OP_SOFTMAX: case OP_LOG_SOFTMAX:
    cp_assert(f->ia[0] == x->shape.rank - 1);
    (f->op == OP_LOG_SOFTMAX ? k_log_softmax_forward_f64 : f->ia[1] ? k_safe_softmax_forward_f64 : k_softmax_forward_f64)(
        out, a, (int)(n / dim(x, -1)), dim(x, -1));
    return;
  case OP_LAYER_NORM:
    k_layer_norm_forward_f64(out, NULL, NULL, a, b, vin(I, f, 2), (int)(n / dim(x, -1)), dim(x, -1), f->fa[0]);
    return;
  case OP_RMS_NORM: k_rms_norm_forward_f64(out, NULL, a, b, (int)(n / dim(x, -1)), dim(x, -1), f->fa[0]); return;
  case OP_ROPE: k_rope_forward_f64(out, a, (int)(n / (dim(x, -1) * dim(x, -2))), dim(x, -2), dim(x, -1), f->fa[0]); return;
  case OP_SDPA: {
    cp_assert(dim(x, 1) == dim(input(I, f, 1), 1) && dim(x, 2) == dim(input(I, f, 1), 2) && dim(x, 3) == dim(input(I, f, 2), 3));
    int nb = dim(x, 0) * dim(x, 1), t = dim(x, 2);
    double *att = calloc((size_t)nb * t * t, sizeof(double));
    k_sdpa_forward_f64(out, att, a, b, vin(I, f, 2), nb, t, dim(x, 3), (int)f->ia[0]);
    free(att);
    return;
  }
  case OP_DROPOUT: k_dropout_forward_f64(out, a, NULL, n, f->fa[0]); return; /* evaluation mode */
  case OP_CROSS_ENTROPY: {
    const Node *t = input(I, f, 1);
    int32_t *tv = to_i32(b, numel(t));
    out[0] = k_cross_entropy_forward_f64(NULL, a, tv, (int)numel(t), dim(x, -1));
    free(tv);
    return;
  }
  case OP_ARGMAX: {
    int32_t *r = malloc(sizeof *r * (size_t)n);
    around(x, (int)f->ia[0], &o, &m, &in);
    k_argmax_forward_f64(r, a, o, m, in);
    for (long i = 0; i < n; i++) out[i] = r[i];
    free(r);
    return;
  }
  case OP_FLOAT: {
    int32_t *xv = to_i32(a, n);
    k_float_forward_f64(out, xv, n);
    free(xv);
    return;
  }
  default: cp_panic(__FILE__, __LINE__, "interpreter: no forward for %s", ir_ops[f->op].name);
  }
}

/* GRAD node n: the gradient of input k of forward node f, accumulated into dx (zeroed). */
static void backward(Interp *I, const Node *f, int k, const double *dy, double *dx) {
  const Node *x = input(I, f, 0);
  double *a = vin(I, f, 0), *b = f->nin > 1 ? vin(I, f, 1) : NULL;
  long n = numel(f);
  int sa[CP_MAX_RANK], sb[CP_MAX_RANK], o, m, in;
  covered[f->op] = true;
  switch (f->op) {
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MAXIMUM: case OP_MINIMUM: case OP_MOD: {
    int ra = ishape(x, sa), rb = ishape(input(I, f, 1), sb);
    k_binary_backward_f64((KBinary)(f->op - OP_ADD), k == 0 ? dx : NULL, k == 1 ? dx : NULL, dy, a, sa, ra, b, sb, rb);
    return;
  }
  case OP_NEG: case OP_EXP: case OP_LOG: case OP_SQRT: case OP_RSQRT: case OP_TANH: case OP_SIGMOID:
  case OP_RELU: case OP_GELU: case OP_SILU: case OP_SQUARE: case OP_POW: case OP_ABS: case OP_CLAMP_MIN:
  case OP_CLAMP_MAX: case OP_ERF: case OP_SIN: case OP_COS:
    k_unary_backward_f64((KUnary)(f->op - OP_NEG), dx, dy, a, I->v[f - I->g->nodes], n, f->fa[0]);
    return;
  case OP_WHERE: {
    cp_assert(k == 1 || k == 2); /* autodiff never asks for cond's */
    int so[CP_MAX_RANK], sc[CP_MAX_RANK], ro = ishape(f, so), rc = ishape(x, sc), ra = ishape(input(I, f, 1), sa),
        rb = ishape(input(I, f, 2), sb);
    k_where_backward_f64(k == 1 ? dx : NULL, k == 2 ? dx : NULL, dy, so, ro, a, sc, rc, sa, ra, sb, rb);
    return;
  }
  case OP_SUM: case OP_MEAN: case OP_MAX: {
    Red r;
    red_forward(f, x, a, &r);
    red_backward(f, &r, dy, dx, numel(x));
    red_free(&r);
    return;
  }
  case OP_MATMUL: {
    Mm d = mm_dims(f, x, input(I, f, 1));
    mm_backward(&d, k == 0 ? dx : NULL, k == 1 ? dx : NULL, dy, a, b);
    return;
  }
  case OP_TRANSPOSE:
    k_transpose_backward_f64(dx, dy, (int)(n / (dim(x, -1) * dim(x, -2))), dim(x, -2), dim(x, -1));
    return;
  case OP_PERMUTE: {
    int perm[CP_MAX_RANK];
    for (int j = 0; j < f->ndims; j++) perm[j] = (int)f->dims[j];
    k_permute_backward_f64(dx, dy, sa, ishape(x, sa), perm);
    return;
  }
  case OP_RESHAPE: case OP_DROPOUT:
    for (long i = 0; i < n; i++) dx[i] += dy[i];
    return;
  case OP_CONCAT: {
    int ns[64];
    double *dxs[64] = {0};
    concat_dims(I, f, ns, &o, &in);
    dxs[k] = dx;
    k_concat_backward_f64(dxs, dy, ns, f->nin, o, in);
    return;
  }
  case OP_SLICE:
    around(x, (int)f->ia[0], &o, &m, &in);
    k_slice_backward_f64(dx, dy, o, m, in, (int)f->ia[1], (int)f->ia[2]);
    return;
  case OP_SPLIT_HEADS: k_split_heads_backward_f64(dx, dy, dim(x, 0), dim(x, 1), dim(x, 2), (int)f->ia[0]); return;
  case OP_MERGE_HEADS: k_merge_heads_backward_f64(dx, dy, dim(x, 0), dim(x, 2), dim(x, 1) * dim(x, 3), dim(x, 1)); return;
  case OP_EMBEDDING: {
    const Node *idx = input(I, f, 1);
    int32_t *iv = to_i32(b, numel(idx));
    cp_assert(k == 0);
    k_embedding_backward_f64(dx, dy, iv, (int)numel(idx), dim(x, 0), dim(x, 1));
    free(iv);
    return;
  }
  case OP_SOFTMAX: case OP_LOG_SOFTMAX:
    (f->op == OP_SOFTMAX ? k_softmax_backward_f64 : k_log_softmax_backward_f64)(dx, dy, I->v[f - I->g->nodes],
                                                                              (int)(n / dim(x, -1)), dim(x, -1));
    return;
  case OP_LAYER_NORM: {
    int rows = (int)(n / dim(x, -1)), c = dim(x, -1);
    double *y = malloc(sizeof(double) * (size_t)n), *mean = malloc(sizeof(double) * (size_t)rows),
           *rstd = malloc(sizeof(double) * (size_t)rows);
    k_layer_norm_forward_f64(y, mean, rstd, a, b, vin(I, f, 2), rows, c, f->fa[0]);
    k_layer_norm_backward_f64(k == 0 ? dx : NULL, k == 1 ? dx : NULL, k == 2 ? dx : NULL, dy, a, b, mean, rstd, rows, c);
    free(y), free(mean), free(rstd);
    return;
  }
  case OP_RMS_NORM: {
    int rows = (int)(n / dim(x, -1)), c = dim(x, -1);
    double *y = malloc(sizeof(double) * (size_t)n), *rstd = malloc(sizeof(double) * (size_t)rows);
    k_rms_norm_forward_f64(y, rstd, a, b, rows, c, f->fa[0]);
    k_rms_norm_backward_f64(k == 0 ? dx : NULL, k == 1 ? dx : NULL, dy, a, b, rstd, rows, c);
    free(y), free(rstd);
    return;
  }
  case OP_ROPE: k_rope_backward_f64(dx, dy, (int)(n / (dim(x, -1) * dim(x, -2))), dim(x, -2), dim(x, -1), f->fa[0]); return;
  case OP_SDPA: {
    int nb = dim(x, 0) * dim(x, 1), t = dim(x, 2), d = dim(x, 3);
    double *att = calloc((size_t)nb * t * t, sizeof(double)), *y = malloc(sizeof(double) * (size_t)n);
    k_sdpa_forward_f64(y, att, a, b, vin(I, f, 2), nb, t, d, (int)f->ia[0]);
    k_sdpa_backward_f64(k == 0 ? dx : NULL, k == 1 ? dx : NULL, k == 2 ? dx : NULL, dy, att, a, b, vin(I, f, 2), nb, t, d);
    free(att), free(y);
    return;
  }
  case OP_CROSS_ENTROPY: {
    const Node *t = input(I, f, 1);
    int32_t *tv = to_i32(b, numel(t));
    cp_assert(k == 0);
    k_cross_entropy_backward_f64(dx, dy[0], a, tv, (int)numel(t), dim(x, -1));
    free(tv);
    return;
  }
  default: cp_panic(__FILE__, __LINE__, "interpreter: no backward for %s", ir_ops[f->op].name);
  }
}

/* Runs every node whose role is in `roles` (a bit mask of 1 << Role), in graph order. PARAM,
 * INPUT, STATE and SCALAR_IN values persist between runs (the test sets them). */
static void run(Interp *I, unsigned roles) {
  const Graph *g = I->g;
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (!(roles & (1u << n->role))) continue;
    long cnt = numel(n);
    double *out = I->v[i];
    switch (n->op) {
    case OP_PARAM: case OP_INPUT: case OP_STATE: case OP_SCALAR_IN: break;
    case OP_GRAD:
      memset(out, 0, sizeof(double) * (size_t)cnt);
      backward(I, nd(I, n->fwd), (int)n->ia[0], I->v[n->in[0]], out);
      break;
    case OP_ACCUM: case OP_ASSIGN: {
      double *dst = I->v[n->in[0]], *val = I->v[n->in[1]];
      for (long k = 0; k < cnt; k++) dst[k] = n->op == OP_ACCUM ? dst[k] + val[k] : val[k];
      memcpy(out, dst, sizeof(double) * (size_t)cnt);
      break;
    }
    default: forward(I, n, out);
    }
  }
}
#define FWD (1u << ROLE_FWD)
#define BWD (1u << ROLE_BWD)
#define UPD (1u << ROLE_UPD)

/* ---- building test graphs ---------------------------------------------------------------- */

static Graph *build(const char *src, int64_t batch) {
  diag_reset(); /* each case stands alone */
  int file = src_add("test.cplan", src, strlen(src));
  Program *prog = parse_program_source(file);
  if (!prog || diag_errors()) return NULL;
  Sema *s = sema_new(prog);
  const Item *m = sema_find_item(s, "m");
  if (!m) return NULL;
  Graph *g = sema_build_model(s, m, NULL, batch);
  return diag_errors() ? NULL : g;
}

static uint64_t rng = 88172645463325252ull;
static double uniform(double lo, double hi) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return lo + (hi - lo) * (double)(rng >> 11) / 9007199254740992.0;
}

/* Random values: floats in [0.5, 1.5) (positive, so log and sqrt are defined), integer
 * inputs in [lo, hi) where "targets" may hold -1 (ignored by cross_entropy). */
static void fill(Interp *I, int hi) {
  const Graph *g = I->g;
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (n->op != OP_PARAM && n->op != OP_INPUT) continue;
    int lo = n->name && strcmp(n->name, "targets") == 0 ? -1 : 0;
    for (long k = 0; k < numel(n); k++)
      I->v[i][k] = n->dtype == DT_I32 ? (double)(lo + (int)uniform(0, hi - lo)) : uniform(0.5, 1.5);
  }
}

static double loss_of(Interp *I) {
  run(I, FWD);
  return I->v[I->g->loss][0];
}

static bool close_to(double a, double b, double tol) { return fabs(a - b) <= tol * (fabs(a) + fabs(b)) + 1e-9; }

/* Compares each param's autodiff gradient (and its accumulator) with central differences. */
static void grad_check(const char *name, const char *src, int hi, int line) {
  Graph *g = build(src, 2);
  check(g != NULL, cp_fmt("%s: the model elaborates", name), line);
  if (!g) return;
  bool ok = ad_backward(g, 1);
  char err[512] = "";
  check(ok && ir_verify(g, err, sizeof err), cp_fmt("%s: ad_backward + ir_verify (%s)", name, err), line);
  Interp *I = interp_new(g);
  fill(I, hi);
  run(I, FWD | BWD);
  int bad = 0, checked = 0;
  for (int p = 0; p < g->params.n; p++) {
    int pi = g->params.a[p], gi = g->grads.a[p];
    if (gi < 0) continue;
    long cnt = numel(nd(I, pi));
    double *an = malloc(sizeof(double) * (size_t)cnt);
    memcpy(an, I->v[gi], sizeof(double) * (size_t)cnt);
    for (long k = 0; k < cnt; k++) {
      double save = I->v[pi][k], h = 1e-5;
      I->v[pi][k] = save + h;
      double lp = loss_of(I);
      I->v[pi][k] = save - h;
      double lm = loss_of(I);
      I->v[pi][k] = save;
      double fd = (lp - lm) / (2 * h);
      checked++;
      if (!close_to(an[k], fd, 1e-6) && bad++ < 3)
        fprintf(stderr, "  %s: d loss / d %s[%ld]: autodiff %.10g, finite differences %.10g\n", name,
                nd(I, pi)->name, k, an[k], fd);
    }
    free(an);
  }
  check(bad == 0 && checked > 0, cp_fmt("%s: %d of %d gradient entries match finite differences", name, checked - bad, checked), line);
  /* The accumulators hold the gradient after one micro-batch. */
  int acc_ok = 0, nacc = 0;
  for (int i = 0; i < g->n; i++) {
    if (g->nodes[i].op != OP_ACCUM) continue;
    nacc++;
    int st = g->nodes[i].in[0], gv = g->nodes[i].in[1];
    acc_ok += memcmp(I->v[st], I->v[gv], sizeof(double) * (size_t)numel(nd(I, st))) == 0;
  }
  int ngrads = 0;
  for (int p = 0; p < g->params.n; p++) ngrads += g->grads.a[p] >= 0;
  check(acc_ok == nacc && nacc == ngrads, cp_fmt("%s: one accumulator per gradient", name), line);
  interp_free(I);
}
#define GRAD_CHECK(name, src, hi) grad_check(name, src, hi, __LINE__)

/* ---- the gradient cases -------------------------------------------------------------------- */

static void test_gradients(void) {
  GRAD_CHECK("unary", "model m() {\n"
                      "  input x: f32[B, 3]\n"
                      "  param a: [3] = zeros\n"
                      "  y = dropout(x * a, 0.1)\n"
                      "  z = y - 1\n"
                      "  loss = sum(neg(y)) + sum(exp(y)) + sum(log(y)) + sum(sqrt(y)) + sum(rsqrt(y)) + sum(tanh(y))"
                      " + sum(sigmoid(z)) + sum(relu(z)) + sum(gelu(z)) + sum(erf(z)) + sum(sin(z)) + sum(cos(y)) + sum(silu(z)) + sum(square(z)) + sum(pow(y, 1.5))"
                      " + sum(float(y) * float(z))\n" /* float of f32: the identity, its gradient passing */
                      "}\n", 1);
  GRAD_CHECK("binary, broadcasting, a value used twice",
             "model m() {\n"
             "  param a: [2, 1, 4] = zeros\n"
             "  param b: [3, 1] = zeros\n"
             "  param c: [4] = zeros\n"
             "  s = a + b\n"
             "  loss = sum(s * s) + mean((a - b) * c) + sum(a / (b + 2)) + sum(maximum(a, b) * c) + sum(minimum(a * c, b))\n"
             "}\n", 1);
  /* Python's %: gradient 1 to a, -floor(a / b) to b; // has none (a loss term through it alone
   * changes nothing) */
  GRAD_CHECK("mod (by a number, by a param, a negative divisor), floordiv",
             "model m() {\n"
             "  param a: [2, 1, 4] = zeros\n"
             "  param b: [3, 1] = zeros\n"
             "  param c: [4] = zeros\n"
             "  s = a + b\n"
             "  loss = sum((a * 3.0) % 0.7 * c) + sum(s % (b * 0.3)) + sum((c * 5.0) % -0.9) + sum((s // 0.4) * c)\n"
             "}\n", 1);
  /* params are in [0.5, 1.5]: the bounds and comparisons split them; where(a - 1.0, b, c): a float
   * cond that depends on a param gets no gradient through where */
  GRAD_CHECK("abs, clamp (both bounds, one, min > max), where (broadcast, a number branch, a param cond)",
             "model m() {\n"
             "  param a: [2, 1, 4] = zeros\n"
             "  param b: [3, 1] = zeros\n"
             "  param c: [4] = zeros\n"
             "  s = a + b\n"
             "  loss = sum(abs(s - 2.0) * c) + sum(clamp(s, min = 1.6, max = 2.4) * c) + sum(clamp(a * 2.0, min = 2.0))"
             " + sum(clamp(b, max = 1.0) * b) + sum(clamp(s, 2.5, 1.5) * c) + sum(where(s > 2.0, a * c, b))"
             " + sum(where(c < 1.0, s, 0.0) * s) + sum(where(a - 1.0, b, c)) + sum(clamp_min(c, 1.0) + clamp_max(b, 1.1))\n"
             "}\n", 1);
  GRAD_CHECK("reductions",
             "model m() {\n"
             "  param x: [2, 3, 4] = zeros\n"
             "  param w: [2, 1, 4] = zeros\n"
             "  loss = sum(square(sum(x, axis = 1, keepdims = true)) * w) + sum(square(mean(x, axis = (0, 2))))"
             " + sum(max(x * w, axis = -1)) + max(x) + mean(x * x) + sum(square(sum(x, axis = (1, 2))))\n"
             "}\n", 1);
  GRAD_CHECK("matmul, transpose, permute, reshape",
             "model m() {\n"
             "  input x: f32[B, 3, 4]\n"
             "  param w: [4, 5] = zeros\n"
             "  param r: [3, 3] = zeros\n"
             "  q = x @ w\n"
             "  s = q @ transpose(q)\n"
             "  t = r @ q\n"
             "  p = permute(t, [2, 0, 1])\n"
             "  loss = sum(square(s)) + sum(p * reshape(transpose(q), [5, B, 3])) + sum(reshape(t, [-1]) * 0.5)\n"
             "}\n", 1);
  GRAD_CHECK("concat, slice, split, split_heads, merge_heads",
             "model m() {\n"
             "  input x: f32[B, 4, 6]\n"
             "  param w: [6, 6] = zeros\n"
             "  h = x @ w\n"
             "  p, q = split(h, 2, axis = -1)\n"
             "  c = concat([q, p, h], axis = -1)\n"
             "  s = slice(c, 1, 1, 3)\n"
             "  sh = split_heads(s, 3)\n"
             "  loss = sum(merge_heads(square(sh)) * s) + sum(square(p) * q)\n"
             "}\n", 1);
  GRAD_CHECK("embedding, norms, rope, sdpa, softmax, cross_entropy, tied head, float of i32",
             "model m(V: int = 7, T: int = 4, C: int = 8) {\n"
             "  input idx: i32[B, T]\n"
             "  input targets: i32[B, T]\n"
             "  param wte: [V, C] = zeros\n"
             "  param wpe: [T, C] = zeros\n"
             "  param lw: [C] = ones\n"
             "  param lb: [C] = zeros\n"
             "  param rw: [C] = ones\n"
             "  param wq: [C, 3 * C] = zeros\n"
             "  param unused: [V] = zeros\n"
             "  x = embedding(wte, idx) + embedding(wpe, arange(T))\n"
             "  q, k, v = split(layer_norm(x, lw, lb) @ wq, 3, axis = -1)\n"
             "  y = sdpa(rope(split_heads(q, 2)), rope(split_heads(k, 2)), split_heads(v, 2), causal = true)\n"
             "  y = rms_norm(merge_heads(y) + x, rw)\n"
             "  logits = y @ transpose(wte)\n"
             "  metric acc = mean(argmax(logits + unused) == targets)\n"
             "  metric half = mean(float(idx) / 2.0)\n"
             "  loss = cross_entropy(logits, targets) + mean(softmax(logits) * logits) + mean(log_softmax(y) * x)"
             " + mean(sum(y, axis = -1) * float(idx + 1))\n"
             "}\n", 7);
  /* Checklist: a new differentiable op in ops.def needs a case above. */
  for (int op = 0; op < OP__COUNT; op++) {
    if (ir_ops[op].flags & (OPF_LEAF | OPF_NOGRAD | OPF_MACRO | OPF_INTERNAL)) continue;
    check(covered[op], cp_fmt("the gradient of '%s' is checked by a case", ir_ops[op].name), __LINE__);
  }
}

/* A param only a metric reads has no gradient, no accumulator and no update; integer inputs
 * and no-grad ops get no GRAD nodes. */
static void test_structure(void) {
  Graph *g = build("model m(V: int = 5) {\n"
                   "  input idx: i32[B, 3]\n"
                   "  input targets: i32[B, 3]\n"
                   "  param wte: [V, 4] = zeros\n"
                   "  param u: [V] = zeros\n"
                   "  logits = embedding(wte, idx) @ transpose(wte)\n"
                   "  metric acc = mean(argmax(logits + u) == targets)\n"
                   "  loss = cross_entropy(logits, targets)\n"
                   "}\n", 2);
  CHECK(g != NULL);
  if (!g) return;
  int nfwd = g->n;
  CHECK(ad_backward(g, 4));
  CHECK(g->accum == 4);
  CHECK(g->grads.n == 2 && g->grads.a[0] >= 0 && g->grads.a[1] == -1);
  int ngrad = 0, nstate = 0, bad_role = 0;
  for (int i = nfwd; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    bad_role += n->role != ROLE_BWD;
    if (n->op == OP_GRAD) {
      ngrad++;
      const Node *x = &g->nodes[g->nodes[n->fwd].in[n->ia[0]]];
      CHECK(x->dtype != DT_I32 && !(ir_ops[g->nodes[n->fwd].op].flags & OPF_NOGRAD));
    }
    if (n->op == OP_STATE) {
      nstate++;
      CHECK(strcmp(n->name, "wte.grad") == 0 && n->ia[0] == g->params.a[0] && n->ia[1] == 0);
    }
    if (n->op == OP_CONST) CHECK(n->fa[0] == 0.25);
  }
  CHECK(bad_role == 0);
  CHECK(ngrad == 5); /* cross_entropy, matmul (a and b), transpose, embedding (not idx) */
  CHECK(nstate == 1 && g->states.n == 1);
}

/* float(): of an i32 tensor one no-grad node (nothing flows back into the integers); of an f32
 * tensor no node at all (the value itself, so the gradient passes); of a number a number. */
static void test_float(void) {
  Graph *g = build("model m() {\n"
                   "  input x: f32[B, 3]\n"
                   "  input idx: i32[B, 3]\n"
                   "  param w: [3] = zeros\n"
                   "  h = float(x * w)\n"
                   "  loss = mean(h * float(idx)) + float(2)\n"
                   "}\n", 2);
  CHECK(g != NULL);
  if (!g) return;
  int nfwd = g->n, nfloat = 0;
  for (int i = 0; i < nfwd; i++) {
    const Node *n = &g->nodes[i];
    if (n->op != OP_FLOAT) continue;
    nfloat++;
    CHECK(n->dtype == DT_F32 && g->nodes[n->in[0]].dtype == DT_I32 && g->nodes[n->in[0]].op == OP_INPUT);
  }
  CHECK(nfloat == 1);
  CHECK(ad_backward(g, 1));
  CHECK(g->grads.n == 1 && g->grads.a[0] >= 0);
  for (int i = nfwd; i < g->n; i++)
    if (g->nodes[i].op == OP_GRAD) CHECK(g->nodes[g->nodes[i].fwd].op != OP_FLOAT);
}

/* Gradient accumulation: two micro-batches with seed 1/2 sum to the mean gradient. */
static void test_accumulation(void) {
  const char *src = "model m() {\n  input x: f32[B, 3]\n  param w: [3, 2] = zeros\n  loss = mean(square(x @ w))\n}\n";
  Graph *g1 = build(src, 2), *g2 = build(src, 2);
  CHECK(g1 && g2 && ad_backward(g1, 1) && ad_backward(g2, 2));
  if (!g1 || !g2) return;
  Interp *I1 = interp_new(g1), *I2 = interp_new(g2);
  fill(I2, 1);
  double x0[6], x1[6];
  memcpy(x0, I2->v[g2->inputs.a[0]], sizeof x0);
  for (int k = 0; k < 6; k++) x1[k] = uniform(-1, 1);
  memcpy(I1->v[g1->params.a[0]], I2->v[g2->params.a[0]], 6 * sizeof(double));
  run(I2, FWD | BWD);
  memcpy(I2->v[g2->inputs.a[0]], x1, sizeof x1);
  run(I2, FWD | BWD);
  int s2 = g2->states.a[0], s1 = g1->states.a[0];
  double want[6] = {0};
  const double *xs[2] = {x0, x1};
  for (int mb = 0; mb < 2; mb++) {
    memcpy(I1->v[g1->inputs.a[0]], xs[mb], sizeof x0);
    memset(I1->v[s1], 0, 6 * sizeof(double));
    run(I1, FWD | BWD);
    for (int k = 0; k < 6; k++) want[k] += 0.5 * I1->v[s1][k];
  }
  int ok = 0;
  for (int k = 0; k < 6; k++) ok += close_to(I2->v[s2][k], want[k], 1e-12);
  CHECK(ok == 6);
  interp_free(I1);
  interp_free(I2);
}

/* ---- the optimizers ---------------------------------------------------------------------------- */

/* loss = sum(x @ w + b) with x all ones [2, 2]: dw = 2 everywhere, db = 2 everywhere. */
static const char *opt_src = "model m() {\n  input x: f32[B, 2]\n  param w: [2, 2] = zeros\n"
                             "  param b: [2] = zeros\n  loss = sum(x @ w + b)\n}\n";

typedef struct OptRun {
  Graph *g;
  Interp *I;
} OptRun;

static OptRun opt_setup(TrainConf *t, const double *w0, const double *b0) {
  OptRun r = {build(opt_src, 2), NULL};
  cp_assert(r.g);
  char err[512] = "";
  bool ok = ad_backward(r.g, 1) && opt_lower(r.g, t) && ir_verify(r.g, err, sizeof err);
  check(ok, cp_fmt("opt_lower + ir_verify (%s)", err), __LINE__);
  r.I = interp_new(r.g);
  for (int k = 0; k < 4; k++) r.I->v[r.g->inputs.a[0]][k] = 1;
  memcpy(r.I->v[r.g->params.a[0]], w0, 4 * sizeof(double));
  memcpy(r.I->v[r.g->params.a[1]], b0, 2 * sizeof(double));
  return r;
}

/* One optimizer step t (from 1): zero the accumulators, micro-batch, update. */
static void opt_step(OptRun *r, double lr, double b1, double b2, int t) {
  const Graph *g = r->g;
  for (int s = 0; s < g->states.n; s++) {
    const Node *n = &g->nodes[g->states.a[s]];
    if (!n->ia[1]) memset(r->I->v[g->states.a[s]], 0, sizeof(double) * (size_t)numel(n));
  }
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (n->op != OP_SCALAR_IN) continue;
    r->I->v[i][0] = strcmp(n->name, "lr") == 0 ? lr : strcmp(n->name, "bc1") == 0 ? 1 - pow(b1, t) : 1 - pow(b2, t);
  }
  run(r->I, FWD | BWD);
  run(r->I, UPD);
}

static const double *param_val(OptRun *r, int p) { return r->I->v[r->g->params.a[p]]; }

static const double *state_val(OptRun *r, const char *name) {
  for (int s = 0; s < r->g->states.n; s++)
    if (strcmp(r->g->nodes[r->g->states.a[s]].name, name) == 0) return r->I->v[r->g->states.a[s]];
  return NULL;
}

static int count_close(const double *got, const double *want, int n) {
  int ok = 0;
  for (int k = 0; k < n; k++) {
    ok += close_to(got[k], want[k], 1e-12);
    if (!close_to(got[k], want[k], 1e-12)) fprintf(stderr, "  [%d]: got %.15g, want %.15g\n", k, got[k], want[k]);
  }
  return ok;
}

static void test_adamw(void) {
  TrainConf t = {.optimizer = {.kind = OPT_ADAMW, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.5}};
  double w[4] = {0.5, -1, 2, 0.25}, b[2] = {1, -2}, m[6] = {0}, v[6] = {0};
  OptRun r = opt_setup(&t, w, b);
  for (int step = 1; step <= 2; step++) {
    double lr = step == 1 ? 0.1 : 0.05; /* as a schedule would change it */
    opt_step(&r, lr, 0.9, 0.99, step);
    for (int k = 0; k < 6; k++) {
      double *p = k < 4 ? &w[k] : &b[k - 4], g = 2, wd = k < 4 ? 0.5 : 0;
      *p *= 1 - lr * wd;
      m[k] = 0.9 * m[k] + 0.1 * g;
      v[k] = 0.99 * v[k] + 0.01 * g * g;
      double bc1 = 1 - pow(0.9, step), bc2 = 1 - pow(0.99, step);
      *p -= lr * (m[k] / bc1) / (sqrt(v[k] / bc2) + 1e-8);
    }
    CHECK(count_close(param_val(&r, 0), w, 4) == 4);
    CHECK(count_close(param_val(&r, 1), b, 2) == 2);
  }
  CHECK(state_val(&r, "w.exp_avg") && count_close(state_val(&r, "w.exp_avg"), m, 4) == 4);
  CHECK(state_val(&r, "b.exp_avg_sq") && count_close(state_val(&r, "b.exp_avg_sq"), v + 4, 2) == 2);
  CHECK(r.g->states.n == 2 + 4); /* two accumulators, two moments per param */
  CHECK(r.g->grad_norm >= 0 && close_to(r.I->v[r.g->grad_norm][0], sqrt(6 * 4.0), 1e-12));
  interp_free(r.I);
}

/* SGD with momentum, weight decay and clipping (norm sqrt(24), clip 1). */
static void test_sgd(bool nesterov) {
  TrainConf t = {.optimizer = {.kind = OPT_SGD, .lr = 0.1, .momentum = 0.9, .weight_decay = 0.1, .nesterov = nesterov},
                 .clip = 1.0};
  double w[4] = {0.5, -1, 2, 0.25}, b[2] = {1, -2}, buf[6] = {0};
  OptRun r = opt_setup(&t, w, b);
  for (int step = 1; step <= 2; step++) {
    opt_step(&r, 0.1, 0, 0, step);
    double scale = fmin(1, 1.0 / (sqrt(24.0) + 1e-6));
    for (int k = 0; k < 6; k++) {
      double *p = k < 4 ? &w[k] : &b[k - 4], d = 2 * scale;
      if (k < 4) d += 0.1 * *p;
      buf[k] = step == 1 ? d : 0.9 * buf[k] + d;
      *p -= 0.1 * (nesterov ? d + 0.9 * buf[k] : buf[k]);
    }
    CHECK(count_close(param_val(&r, 0), w, 4) == 4);
    CHECK(count_close(param_val(&r, 1), b, 2) == 2);
    CHECK(close_to(r.I->v[r.g->grad_norm][0], sqrt(24.0), 1e-12));
  }
  CHECK(state_val(&r, "w.momentum_buffer") && count_close(state_val(&r, "w.momentum_buffer"), buf, 4) == 4);
  interp_free(r.I);
}

/* LAMB: one step by the §8 formula; then a param at zero gets ratio 1. */
static void test_lamb(void) {
  TrainConf t = {.optimizer = {.kind = OPT_LAMB, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-6, .weight_decay = 0.01}};
  double w[4] = {0.5, -1, 2, 0.25}, b[2] = {0, 0};
  OptRun r = opt_setup(&t, w, b);
  opt_step(&r, 0.1, 0.9, 0.999, 1);
  double u[4], pn = 0, un = 0;
  for (int k = 0; k < 4; k++) {
    double mh = (0.1 * 2) / 0.1, vh = (0.001 * 4) / (1 - 0.999);
    u[k] = mh / (sqrt(vh) + 1e-6) + 0.01 * w[k];
    pn += w[k] * w[k], un += u[k] * u[k];
  }
  for (int k = 0; k < 4; k++) w[k] -= 0.1 * sqrt(pn) / sqrt(un) * u[k];
  CHECK(count_close(param_val(&r, 0), w, 4) == 4);
  double ub = 2 / (2 + 1e-6), bw[2] = {-0.1 * ub, -0.1 * ub}; /* ‖b‖ = 0: ratio 1, no decay (rank 1) */
  CHECK(count_close(param_val(&r, 1), bw, 2) == 2);
  interp_free(r.I);
}

/* LARS: η = trust ‖p‖/(‖g‖ + wd ‖p‖); v = η (g + wd p) on the first step; p -= lr v. */
static void test_lars(void) {
  TrainConf t = {.optimizer = {.kind = OPT_LARS, .lr = 0.1, .momentum = 0.9, .weight_decay = 0.1, .trust = 0.001}};
  double w[4] = {0.5, -1, 2, 0.25}, b[2] = {0, 0};
  OptRun r = opt_setup(&t, w, b);
  opt_step(&r, 0.1, 0, 0, 1);
  double pn = 0;
  for (int k = 0; k < 4; k++) pn += w[k] * w[k];
  pn = sqrt(pn);
  double eta = 0.001 * pn / (4 + 0.1 * pn);
  for (int k = 0; k < 4; k++) w[k] -= 0.1 * eta * (2 + 0.1 * w[k]);
  CHECK(count_close(param_val(&r, 0), w, 4) == 4);
  double bw[2] = {-0.1 * 2, -0.1 * 2}; /* ‖b‖ = 0: η = 1 */
  CHECK(count_close(param_val(&r, 1), bw, 2) == 2);
  interp_free(r.I);
}

int main(void) {
  test_gradients();
  test_structure();
  test_float();
  test_accumulation();
  test_adamw();
  test_sgd(false);
  test_sgd(true);
  test_lamb();
  test_lars();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
