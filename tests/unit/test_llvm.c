/* test_llvm.c: the LLVM kernel generator (codegen/llvm.c) and the fusion pass (compiler/fusion.c).
 *
 * Builds kernels covering every KUnary and KBinary op, broadcasting patterns (a bias row, a
 * middle dim, an outer product, size-1 dims, a scalar output, an empty output), chains through
 * exp/log/tanh/sigmoid/silu/gelu/pow/max/min/div, and the kernels the fusion pass makes for a
 * tiny .cplan model; writes them into one object in a temporary directory (kept when
 * CG_TEST_KEEP is set); writes a C harness that links the object with kernels/cpu/ref.c,
 * compiles it with the system `cc`, and runs it: the harness evaluates each kernel's DAG op by
 * op with the reference kernels and compares (|got - want| <= 1e-5 |want| + 1e-6). Then checks
 * with objdump that the kernels use vector registers and call nothing (exp & co. are inline),
 * the error paths (bad kernels, an unwritable path, duplicate names), and the fusion groups.
 * Prints "N passed, N failed" and exits non-zero on any failure. */
#include "../../codegen/llvm.h"
#include "../../compiler/fusion.h"
#include "sema.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int passed, failed;
static char dir[256];

static void check(int ok, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(int ok, int line, const char *fmt, ...) {
  if (ok) {
    passed++;
    return;
  }
  failed++;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "test_llvm.c:%d: FAILED: ", line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}
#define CHECK(cond, ...) check(!!(cond), __LINE__, __VA_ARGS__)

/* ---- building test kernels ------------------------------------------------------------------ */

typedef struct TK {
  CgKernel k;
  CgNode nodes[48];
  CgInput inputs[8];
  float lo, hi; /* input values are uniform in [lo, hi) */
  int quant;    /* round inputs to multiples of 0.25, so comparisons see ties */
} TK;

static TK tks[96];
static int ntk;

static TK *kernel(const char *name, float lo, float hi, int rank, ...) {
  TK *t = &tks[ntk++];
  memset(t, 0, sizeof *t);
  t->k.name = name;
  t->k.rank = rank;
  va_list ap;
  va_start(ap, rank);
  for (int d = 0; d < rank; d++) t->k.shape[d] = va_arg(ap, int);
  va_end(ap);
  t->lo = lo, t->hi = hi;
  t->k.nodes = t->nodes;
  t->k.inputs = t->inputs;
  return t;
}

static int add(TK *t, CgNode n) {
  t->nodes[t->k.nnodes] = n;
  return t->k.nnodes++;
}

/* A new input of this shape, and the node that reads it. */
static int in(TK *t, int rank, ...) {
  CgInput *x = &t->inputs[t->k.ninputs];
  x->rank = rank;
  va_list ap;
  va_start(ap, rank);
  for (int d = 0; d < rank; d++) x->shape[d] = va_arg(ap, int);
  va_end(ap);
  return add(t, (CgNode){.kind = CG_INPUT, .input = t->k.ninputs++});
}
static int cst(TK *t, float v) { return add(t, (CgNode){.kind = CG_CONST, .value = v}); }
static int un(TK *t, KUnary op, int a) { return add(t, (CgNode){.kind = CG_UNARY, .op = op, .a = a}); }
static int pw(TK *t, int a, float c) { return add(t, (CgNode){.kind = CG_UNARY, .op = K_POW, .a = a, .value = c}); }
static int bin(TK *t, KBinary op, int a, int b) { return add(t, (CgNode){.kind = CG_BINARY, .op = op, .a = a, .b = b}); }
static int sel(TK *t, int q, int a, int b) { return add(t, (CgNode){.kind = CG_SELECT, .a = q, .b = a, .c = b}); }

/* names for kernel symbols (ref.c's k_unary_names is not linked into this test) */
static const char *const unames[K_UNARY_COUNT] = {"neg", "exp", "log", "sqrt", "rsqrt", "tanh",
                                                  "sigmoid", "relu", "gelu", "silu", "square", "pow",
                                                  "abs", "clamp_min", "clamp_max", "erf", "sin", "cos"};
static const char *const bnames[K_BINARY_COUNT] = {"add", "sub", "mul", "div", "maximum", "minimum", "mod",
                                                   "floordiv", "eq", "ne", "lt", "le", "gt", "ge"};

static void unary_kernels(void) {
  for (int op = 0; op < K_UNARY_COUNT; op++) {
    /* log, sqrt, rsqrt, pow want positive inputs; the rest see both signs and large values */
    int pos = op == K_LOG || op == K_SQRT || op == K_RSQRT || op == K_POW;
    TK *t = kernel(cp_fmt("u_%s", unames[op]), pos ? 0.01f : -9.0f, pos ? 30.0f : 9.0f, 2, 7, 45);
    int x = in(t, 2, 7, 45);
    if (op == K_POW) pw(t, x, 1.5f);
    else if (op == K_CLAMP_MIN || op == K_CLAMP_MAX) add(t, (CgNode){.kind = CG_UNARY, .op = op, .a = x, .value = 0.7f});
    else un(t, op, x);
  }
  TK *t = kernel("u_exp_wide", -100.0f, 100.0f, 1, 1000); /* overflow to inf, underflow to 0 */
  un(t, K_EXP, in(t, 1, 1000));
  t = kernel("u_erf_small", -0.6f, 0.6f, 1, 1000); /* erf's series branch and the switch at 0.5 */
  un(t, K_ERF, in(t, 1, 1000));
  t = kernel("u_sin_wide", -8192.0f, 8192.0f, 1, 1000); /* positions x frequencies: the reduction's range */
  un(t, K_SIN, in(t, 1, 1000));
  t = kernel("u_cos_wide", -8192.0f, 8192.0f, 1, 1000);
  un(t, K_COS, in(t, 1, 1000));
  t = kernel("u_tanh_small", -0.7f, 0.7f, 1, 1000); /* the polynomial branch, relative error */
  un(t, K_TANH, in(t, 1, 1000));
  t = kernel("u_log_tiny", 1e-30f, 1e-20f, 1, 333);
  un(t, K_LOG, in(t, 1, 333));
  t = kernel("u_gelu_neg", -6.0f, 0.0f, 1, 256); /* where 1 + tanh(u) would cancel */
  un(t, K_GELU, in(t, 1, 256));
  for (int e = -3; e <= 4; e++) {
    t = kernel(cp_fmt("u_pow_int%d", e + 3), -3.0f, 3.0f, 1, 100);
    pw(t, in(t, 1, 100), (float)e);
  }
  t = kernel("u_pow_half", 0.0f, 5.0f, 1, 100);
  pw(t, in(t, 1, 100), 0.5f);
  t = kernel("u_pow_neg_frac", 0.1f, 5.0f, 1, 100);
  pw(t, in(t, 1, 100), -0.75f);
}

/* every binary op with a broadcast second operand: a [2, 3, 130] op b [3, 1]. Inner dims are
 * long enough (> ~60) that LLVM vectorizes the loop instead of unrolling it fully. */
static void binary_kernels(void) {
  for (int op = 0; op < K_BINARY_COUNT; op++) {
    TK *t = kernel(cp_fmt("b_%s", bnames[op]), -2.0f, 2.0f, 3, 2, 3, 130);
    t->quant = 1;
    bin(t, op, in(t, 3, 2, 3, 130), in(t, 2, 3, 1));
    if (op == K_DIV || op == K_MOD || op == K_FLOORDIV) t->quant = 0; /* no division by 0 from quantized values */
  }
}

static void pattern_kernels(void) {
  TK *t = kernel("t_gelu_affine", -3.0f, 3.0f, 3, 4, 3, 37); /* gelu(x * w + b), b a bias row */
  bin(t, K_MUL, in(t, 3, 4, 3, 37), in(t, 3, 4, 3, 37));
  un(t, K_GELU, bin(t, K_ADD, 1, in(t, 1, 37)));
  t = kernel("t_outer", -1.0f, 1.0f, 2, 5, 7); /* a [5, 1] - b [7] */
  bin(t, K_SUB, in(t, 2, 5, 1), in(t, 1, 7));
  t = kernel("t_middle", -1.0f, 1.0f, 3, 2, 9, 111); /* x [2, 9, 111] * y [2, 1, 111] */
  bin(t, K_MUL, in(t, 3, 2, 9, 111), in(t, 3, 2, 1, 111));
  t = kernel("t_ones", -1.0f, 1.0f, 4, 1, 5, 1, 7); /* size-1 dims, a scalar input */
  bin(t, K_ADD, in(t, 4, 1, 5, 1, 7), in(t, 0));
  t = kernel("t_scalar", -1.0f, 1.0f, 0); /* a rank-0 output */
  bin(t, K_MUL, in(t, 0), cst(t, 3.0f));
  t = kernel("t_empty", -1.0f, 1.0f, 2, 0, 4); /* nothing to do */
  un(t, K_EXP, in(t, 2, 0, 4));
  t = kernel("t_const_only", 0.0f, 1.0f, 1, 10); /* no input at all: a fill */
  un(t, K_SQRT, cst(t, 2.0f));
  t = kernel("t_cmp_const", -1.0f, 1.0f, 1, 64); /* (x >= 0.25) * x */
  t->quant = 1;
  int x = in(t, 1, 64);
  bin(t, K_MUL, bin(t, K_GE, x, cst(t, 0.25f)), x);
  /* where(x > 0 [2, 3, 70], y [3, 1], -inf): each operand broadcast differently, the -inf never
   * leaking (a select, not a blend) */
  t = kernel("t_select", -1.0f, 1.0f, 3, 2, 3, 70);
  x = in(t, 3, 2, 3, 70);
  sel(t, bin(t, K_GT, x, cst(t, 0.0f)), in(t, 2, 3, 1), cst(t, -INFINITY));
  t = kernel("t_select_cond_bcast", -1.0f, 1.0f, 2, 5, 80); /* cond [80], branches [5, 80] and [5, 1] */
  sel(t, in(t, 1, 80), in(t, 2, 5, 80), in(t, 2, 5, 1));
  t->quant = 1; /* a cond of 0.0 often, and of nonzero values other than 1 */
}

/* min(max(silu(x) / sigmoid(y) + tanh(x), log(z)), pow(z, 1.5)) - exp(x * 0.5) + relu(-x)^2 */
static void chain_kernel(void) {
  TK *t = kernel("t_chain", 0.05f, 4.0f, 2, 16, 50);
  int x = in(t, 2, 16, 50), y = in(t, 1, 50), z = in(t, 2, 16, 50);
  int q = bin(t, K_DIV, un(t, K_SILU, x), un(t, K_SIGMOID, y));
  int m = bin(t, K_MAXIMUM, bin(t, K_ADD, q, un(t, K_TANH, x)), un(t, K_LOG, z));
  m = bin(t, K_MINIMUM, m, pw(t, z, 1.5f));
  m = bin(t, K_SUB, m, un(t, K_EXP, bin(t, K_MUL, x, cst(t, 0.5f))));
  m = bin(t, K_ADD, m, un(t, K_SQUARE, un(t, K_RELU, un(t, K_NEG, x))));
  bin(t, K_MUL, m, un(t, K_RSQRT, un(t, K_SQRT, z)));
}

/* ---- the harness: a C program that runs each kernel and its op-by-op reference ------------- */

static const char *harness_types =
    "#include \"ref.h\"\n#include <math.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
    "typedef struct { int kind, op, a, b, c, input; float value; } HNode;\n"
    "typedef struct { const char *name; void (*fn)(float *restrict, const float *const *);\n"
    "  int rank, shape[8], ninputs, irank[8], ishape[8][8], nnodes; const HNode *nodes;\n"
    "  float lo, hi; int quant; } HKernel;\n";

static const char *harness_body =
    "static unsigned long long rng = 88172645463325252ull;\n"
    "static float uni(float lo, float hi, int quant) {\n"
    "  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;\n"
    "  float v = lo + (hi - lo) * (float)((double)(rng >> 11) / 9007199254740992.0);\n"
    "  return quant ? 0.25f * (float)(long)(v * 4.0f) : v;\n"
    "}\n"
    "typedef struct { float *v; int rank, shape[8]; long n; } Val;\n"
    "static int run(const HKernel *k) {\n"
    "  float *ins[8]; Val *v = calloc((size_t)k->nnodes, sizeof *v);\n"
    "  for (int i = 0; i < k->ninputs; i++) {\n"
    "    long n = k_numel(k->ishape[i], k->irank[i]);\n"
    "    ins[i] = malloc(sizeof(float) * (size_t)(n + 1));\n"
    "    for (long j = 0; j < n; j++) ins[i][j] = uni(k->lo, k->hi, k->quant);\n"
    "  }\n"
    "  for (int j = 0; j < k->nnodes; j++) {\n"
    "    const HNode *h = &k->nodes[j]; Val *o = &v[j];\n"
    "    if (h->kind == 0) { o->rank = k->irank[h->input]; memcpy(o->shape, k->ishape[h->input], sizeof o->shape);\n"
    "      o->n = k_numel(o->shape, o->rank); o->v = malloc(sizeof(float) * (size_t)(o->n + 1));\n"
    "      memcpy(o->v, ins[h->input], sizeof(float) * (size_t)o->n); }\n"
    "    else if (h->kind == 1) { o->rank = 0; o->n = 1; o->v = malloc(sizeof(float)); o->v[0] = h->value; }\n"
    "    else if (h->kind == 2) { *o = v[h->a]; o->v = malloc(sizeof(float) * (size_t)(o->n + 1));\n"
    "      k_unary_forward(h->op, o->v, v[h->a].v, o->n, h->value); }\n"
    "    else if (h->kind == 4) { int s2[8]; int r2 = k_bcast_shape(s2, v[h->b].shape, v[h->b].rank, v[h->c].shape, v[h->c].rank);\n"
    "      o->rank = k_bcast_shape(o->shape, v[h->a].shape, v[h->a].rank, s2, r2);\n"
    "      o->n = k_numel(o->shape, o->rank); o->v = malloc(sizeof(float) * (size_t)(o->n + 1));\n"
    "      k_where_forward(o->v, o->shape, o->rank, v[h->a].v, v[h->a].shape, v[h->a].rank, v[h->b].v, v[h->b].shape,\n"
    "                      v[h->b].rank, v[h->c].v, v[h->c].shape, v[h->c].rank); }\n"
    "    else { o->rank = k_bcast_shape(o->shape, v[h->a].shape, v[h->a].rank, v[h->b].shape, v[h->b].rank);\n"
    "      o->n = k_numel(o->shape, o->rank); o->v = malloc(sizeof(float) * (size_t)(o->n + 1));\n"
    "      k_binary_forward(h->op, o->v, v[h->a].v, v[h->a].shape, v[h->a].rank, v[h->b].v, v[h->b].shape, v[h->b].rank); }\n"
    "  }\n"
    "  long n = k_numel(k->shape, k->rank); const Val *last = &v[k->nnodes - 1];\n"
    "  float *want = calloc((size_t)n + 1, sizeof(float)), *zero = calloc((size_t)n + 1, sizeof(float));\n"
    "  float *got = malloc(sizeof(float) * (size_t)(n + 1));\n"
    "  k_binary_forward(K_ADD, want, last->v, last->shape, last->rank, zero, k->shape, k->rank);\n"
    "  k->fn(got, (const float *const *)ins);\n"
    "  double worst = 0; long bad = -1;\n"
    "  for (long i = 0; i < n; i++) {\n"
    "    double w = want[i], g = got[i], d = fabs(g - w);\n"
    "    if ((isnan(w) && isnan(g)) || w == g) continue;\n"
    "    double r = d / (fabs(w) * 1e-5 + 1e-6);\n"
    "    if (!(r <= worst)) { worst = r; bad = i; }\n"
    "  }\n"
    "  if (worst > 1) { printf(\"FAIL %s: element %ld got %.9g want %.9g\\n\", k->name, bad, got[bad], want[bad]); return 1; }\n"
    "  printf(\"ok %s (error %.3f of the tolerance)\\n\", k->name, worst);\n"
    "  return 0;\n"
    "}\n"
    "int main(void) {\n"
    "  int bad = 0;\n"
    "  for (size_t i = 0; i < sizeof hk / sizeof hk[0]; i++) bad += run(&hk[i]);\n"
    "  return bad != 0;\n"
    "}\n";

static void write_kernel_table(FILE *f, const CgKernel *ks, const TK *meta, int n) {
  for (int i = 0; i < n; i++) {
    const CgKernel *k = &ks[i];
    fprintf(f, "void %s(float *restrict out, const float *const *in);\n", k->name);
    fprintf(f, "static const HNode nodes_%d[] = {", i);
    for (int j = 0; j < k->nnodes; j++) {
      const CgNode *h = &k->nodes[j];
      const char *v = isinf(h->value) ? (h->value < 0 ? "-INFINITY" : "INFINITY") : cp_fmt("(float)%.9g", h->value);
      fprintf(f, "{%d, %d, %d, %d, %d, %d, %s},", (int)h->kind, h->op, h->a, h->b, h->c, h->input, v);
    }
    fprintf(f, "};\n");
  }
  fprintf(f, "static const HKernel hk[] = {\n");
  for (int i = 0; i < n; i++) {
    const CgKernel *k = &ks[i];
    fprintf(f, " {\"%s\", %s, %d, {", k->name, k->name, k->rank);
    for (int d = 0; d < k->rank; d++) fprintf(f, "%lld,", (long long)k->shape[d]);
    fprintf(f, "}, %d, {", k->ninputs);
    for (int j = 0; j < k->ninputs; j++) fprintf(f, "%d,", k->inputs[j].rank);
    fprintf(f, "}, {");
    for (int j = 0; j < k->ninputs; j++) {
      fprintf(f, "{");
      for (int d = 0; d < k->inputs[j].rank; d++) fprintf(f, "%lld,", (long long)k->inputs[j].shape[d]);
      fprintf(f, "},");
    }
    fprintf(f, "}, %d, nodes_%d, (float)%.9g, (float)%.9g, %d},\n", k->nnodes, i, meta ? meta[i].lo : -2.0,
            meta ? meta[i].hi : 2.0, meta ? meta[i].quant : 0);
  }
  fprintf(f, "};\n");
}

/* The repository root, from this file's path (CMake passes absolute source paths). */
static const char *repo_root(void) {
  static char root[1024];
  snprintf(root, sizeof root, "%s", __FILE__);
  for (int up = 0; up < 3; up++) {
    char *slash = strrchr(root, '/');
    if (!slash) return ".";
    *slash = 0;
  }
  return root;
}

static const char *tmp_path(const char *name) { return cp_fmt("%s/%s", dir, name); }


/* Runs a shell command; returns its exit status (-1 if it could not run). */
static int sh(const char *cmd) {
  int st = system(cmd);
  return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void show_file(const char *path) {
  FILE *f = fopen(path, "r");
  char line[512];
  for (int n = 0; f && n < 20 && fgets(line, sizeof line, f); n++) fprintf(stderr, "  | %s", line);
  if (f) fclose(f);
}

/* Writes a harness for the kernels, compiles it with cc against obj and ref.c, runs it, and
 * counts one check per kernel. */
static void run_harness(const CgKernel *ks, const TK *meta, int n, const char *obj, const char *tag) {
  const char *src = tmp_path(cp_fmt("harness_%s.c", tag)), *exe = tmp_path(cp_fmt("harness_%s", tag));
  const char *log = tmp_path(cp_fmt("harness_%s.log", tag));
  FILE *f = fopen(src, "w");
  CHECK(f != NULL, "cannot write %s", src);
  if (!f) return;
  fputs(harness_types, f);
  write_kernel_table(f, ks, meta, n);
  fputs(harness_body, f);
  fclose(f);
  const char *root = repo_root();
  int rc = sh(cp_fmt("cc -O1 -std=gnu11 -I'%s/kernels/cpu' -o '%s' '%s' '%s/kernels/cpu/ref.c' '%s' -lm >'%s' 2>&1",
                     root, exe, src, root, obj, log));
  CHECK(rc == 0, "cc failed on the %s harness (status %d)", tag, rc);
  if (rc != 0) {
    show_file(log);
    return;
  }
  rc = sh(cp_fmt("'%s' >'%s' 2>&1", exe, log));
  FILE *out = fopen(log, "r");
  char line[512];
  int oks = 0;
  while (out && fgets(line, sizeof line, out)) {
    if (strncmp(line, "ok ", 3) == 0) oks++;
    CHECK(strncmp(line, "ok ", 3) == 0, "%s harness: %.*s", tag, (int)strcspn(line, "\n"), line);
  }
  if (out) fclose(out);
  CHECK(rc == 0 && oks == n, "%s harness: status %d, %d of %d kernels agree with ref.c", tag, rc, oks, n);
}

/* ---- what the machine code looks like ---------------------------------------------------- */

typedef struct FnAsm {
  char name[128];
  int vec;   /* instructions on ymm/zmm registers */
  int calls; /* calls of anything but memcpy/memset/memmove (a copy loop becomes memcpy) */
} FnAsm;

/* Disassembles obj; one entry per function symbol. Returns the count, -1 without objdump. */
static int disassemble(const char *obj, FnAsm *fns, int max) {
  if (sh("command -v objdump >/dev/null 2>&1") != 0) return -1;
  FILE *p = popen(cp_fmt("objdump -dr --no-show-raw-insn '%s'", obj), "r");
  if (!p) return -1;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, p)) {
    char *lt = strchr(line, '<'), *gt = lt ? strstr(lt, ">:") : NULL;
    if (gt && n < max) { /* "0000000000000000 <name>:" */
      memset(&fns[n], 0, sizeof fns[n]);
      snprintf(fns[n].name, sizeof fns[n].name, "%.*s", (int)(gt - lt - 1), lt + 1);
      n++;
      continue;
    }
    if (n == 0) continue;
    if (strstr(line, "ymm") || strstr(line, "zmm")) fns[n - 1].vec++;
    if (strstr(line, "R_X86_64_PLT32") && !strstr(line, "memcpy") && !strstr(line, "memset") &&
        !strstr(line, "memmove"))
      fns[n - 1].calls++;
  }
  pclose(p);
  return n;
}

static const FnAsm *find_fn(const FnAsm *fns, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(fns[i].name, name) == 0) return &fns[i];
  return NULL;
}

static bool host_has_avx(void) {
  return sh("grep -qw avx /proc/cpuinfo 2>/dev/null") == 0;
}

static void check_machine_code(const char *obj) {
  static FnAsm fns[128];
  int n = disassemble(obj, fns, 128);
  if (n < 0) {
    printf("note: objdump not found, vector-code checks skipped\n");
    return;
  }
  CHECK(n >= ntk, "objdump shows %d functions, want %d", n, ntk);
  for (int i = 0; i < n; i++)
    CHECK(fns[i].calls == 0, "%s calls a function (%d calls): transcendentals should be inline", fns[i].name, fns[i].calls);
  if (!host_has_avx()) {
    printf("note: this CPU has no AVX, ymm checks skipped\n");
    return;
  }
  const char *want_vec[] = {"t_gelu_affine", "u_exp", "u_log", "u_tanh", "u_gelu", "u_pow", "t_chain", "b_maximum", "b_lt", "t_middle"};
  for (size_t i = 0; i < sizeof want_vec / sizeof want_vec[0]; i++) {
    const FnAsm *fa = find_fn(fns, n, want_vec[i]);
    CHECK(fa && fa->vec > 0, "%s: no ymm/zmm instruction (%d): the loop was not vectorized", want_vec[i], fa ? fa->vec : -1);
  }
}

/* ---- error paths ------------------------------------------------------------------------ */

static void check_errors(void) {
  char err[256];
  CgNode nodes[2] = {{.kind = CG_INPUT, .input = 0}, {.kind = CG_UNARY, .op = K_EXP, .a = 0}};
  CgInput bad_in = {.rank = 2, .shape = {3, 5}};
  CgKernel k = {.name = "bad_shape", .rank = 2, .shape = {4, 5}, .inputs = &bad_in, .ninputs = 1,
                .nodes = nodes, .nnodes = 2};
  err[0] = 0;
  CHECK(!cg_llvm_check(&k, err, sizeof err) && strstr(err, "does not broadcast"), "bad shape: '%s'", err);
  CHECK(!cg_llvm_object(&k, 1, tmp_path("bad.o"), err, sizeof err) && strstr(err, "bad_shape"),
        "cg_llvm_object accepts a bad kernel: '%s'", err);
  bad_in.shape[0] = 4;
  nodes[1].a = 1; /* reads itself */
  CHECK(!cg_llvm_check(&k, err, sizeof err) && strstr(err, "reads node"), "self read: '%s'", err);
  nodes[1].a = 0;
  nodes[1].op = 99;
  CHECK(!cg_llvm_check(&k, err, sizeof err) && strstr(err, "unary op"), "bad op: '%s'", err);
  nodes[1].op = K_EXP;
  k.name = "9lives";
  CHECK(!cg_llvm_check(&k, err, sizeof err) && strstr(err, "C identifier"), "bad name: '%s'", err);
  k.name = "good";
  CHECK(cg_llvm_check(&k, err, sizeof err), "a good kernel is refused: %s", err);
  CgKernel two[2] = {k, k};
  CHECK(!cg_llvm_object(two, 2, tmp_path("dup.o"), err, sizeof err) && strstr(err, "two kernels"),
        "duplicate names: '%s'", err);
  CHECK(!cg_llvm_object(&k, 1, "/nonexistent-dir/x.o", err, sizeof err) && strstr(err, "cannot write"),
        "unwritable path: '%s'", err);
  char *ir = cg_llvm_ir(&k, 1, err, sizeof err);
  CHECK(ir && strstr(ir, "define void @good"), "cg_llvm_ir: %s", ir ? "no @good" : err);
  CHECK(ir && strstr(ir, "x float>"), "cg_llvm_ir: the exp loop is not vectorized in the IR");
  CHECK(ir && !strstr(ir, "@llvm.exp") && !strstr(ir, "@expf"), "cg_llvm_ir: exp is a call");
  free(ir);
  char proto[128];
  CHECK(strcmp(cg_llvm_prototype(&k, proto, sizeof proto), "void good(float *restrict out, const float *const *in);") == 0,
        "prototype: %s", proto);
}

/* ---- fusion ------------------------------------------------------------------------------ */

static const char *fusion_src =
    "model m(C: int = 16) {\n"
    "  input x: f32[B, C]\n"
    "  param w: [C, C] = normal(0.02)\n"
    "  param b: [C] = zeros()\n"
    "  h = x @ w + b\n"          /* %3 matmul, %4 add (two consumers: its own group) */
    "  g = gelu(h) * 2.0\n"      /* %5 gelu, %6 const, %7 mul */
    "  y = sigmoid(g) - tanh(h)\n" /* %8, %9, %10 sub (two consumers) */
    "  z = exp(y) / (y + 3.0)\n" /* %11 exp, %12 const, %13 add, %14 div */
    "  loss = mean(z)\n"         /* %15 */
    "}\n";

static Graph *build_model(const char *src, int64_t batch) {
  diag_reset();
  int file = src_add("fusion_test.cplan", src, strlen(src));
  Program *prog = parse_program_source(file);
  if (!prog || diag_errors()) return NULL;
  Sema *s = sema_new(prog);
  const Item *m = sema_find_item(s, "m");
  Graph *g = m ? sema_build_model(s, m, NULL, batch) : NULL;
  return diag_errors() ? NULL : g;
}

static const char *ints(const int *a, int n) {
  StrBuf b = {0};
  for (int i = 0; i < n; i++) sb_printf(&b, "%s%d", i ? " " : "", a[i]);
  return sb_str(&b);
}

static void check_fusion(void) {
  Graph *g = build_model(fusion_src, 8);
  CHECK(g && g->n == 16, "the fusion model elaborates to 16 nodes (%d)", g ? g->n : -1);
  if (!g || g->n != 16) return;
  Fusion *f = fusion_run(g);
  fusion_print(stdout, g, f);
  CHECK(f->ngroups == 3, "3 groups, got %d", f->ngroups);
  if (f->ngroups != 3) return;
  const char *want_nodes[3] = {"4", "5 7 8 9 10", "11 13 14"};
  const char *want_leaves[3] = {"3 2", "4", "10"};
  const int want_root[3] = {4, 10, 14};
  for (int j = 0; j < 3; j++) {
    const FusionGroup *gr = &f->groups[j];
    CHECK(gr->root == want_root[j], "group %d root %d, want %d", j, gr->root, want_root[j]);
    CHECK(strcmp(ints(gr->nodes.a, gr->nodes.n), want_nodes[j]) == 0, "group %d nodes '%s', want '%s'", j,
          ints(gr->nodes.a, gr->nodes.n), want_nodes[j]);
    CHECK(strcmp(ints(gr->leaves.a, gr->leaves.n), want_leaves[j]) == 0, "group %d leaves '%s', want '%s'", j,
          ints(gr->leaves.a, gr->leaves.n), want_leaves[j]);
    CHECK(fusion_is_root(f, want_root[j]), "fusion_is_root(%d)", want_root[j]);
    CHECK(f->kernels[j].nnodes == gr->kernel.nnodes && f->kernels[j].name == gr->kernel.name, "kernels[%d]", j);
  }
  static const int want_group[16] = {-1, -1, -1, -1, 0, 1, -1, 1, 1, 1, 1, 2, -1, 2, 2, -1};
  CHECK(memcmp(f->group, want_group, sizeof want_group) == 0, "group per node: %s", ints(f->group, 16));
  CHECK(!fusion_is_root(f, 9) && !fusion_is_root(f, 6), "non-roots");
  /* group 1: gelu(%4) * 2 -> sigmoid, tanh(%4), sub: 1 input, 1 constant, 5 ops */
  const CgKernel *k1 = &f->kernels[1];
  CHECK(k1->ninputs == 1 && k1->nnodes == 7 && k1->rank == 2 && k1->shape[0] == 8 && k1->shape[1] == 16,
        "kernel 1: %d inputs, %d nodes, rank %d", k1->ninputs, k1->nnodes, k1->rank);
  CHECK(f->kernels[0].ninputs == 2 && f->kernels[0].inputs[1].rank == 1, "kernel 0: b is a broadcast input");
  char err[256];
  for (int j = 0; j < 3; j++) CHECK(cg_llvm_check(&f->kernels[j], err, sizeof err), "fusion kernel %d: %s", j, err);
  const char *obj = tmp_path("fused.o");
  bool ok = cg_llvm_object(f->kernels, f->ngroups, obj, err, sizeof err);
  CHECK(ok, "cg_llvm_object on the fusion kernels: %s", err);
  if (ok) run_harness(f->kernels, NULL, f->ngroups, obj, "fused");

  /* graph outputs are never fused away: the loss of an elementwise-only model is its own root */
  g = build_model("model m() {\n  input x: f32[B, 4]\n  loss = mean(exp(x) * 2.0)\n}\n", 2);
  CHECK(g != NULL, "second model elaborates");
  if (g) {
    f = fusion_run(g);
    CHECK(f->ngroups == 1 && f->groups[0].nodes.n == 2, "exp(x) * 2: one group of 2 (%d)", f->ngroups);
  }
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/cplan_test_llvm_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  unary_kernels();
  binary_kernels();
  pattern_kernels();
  chain_kernel();
  static CgKernel ks[96];
  for (int i = 0; i < ntk; i++) ks[i] = tks[i].k;
  char err[512];
  const char *obj = tmp_path("kernels.o");
  bool ok = cg_llvm_object(ks, ntk, obj, err, sizeof err);
  CHECK(ok, "cg_llvm_object: %s", err);
  if (ok) {
    run_harness(ks, tks, ntk, obj, "ops");
    check_machine_code(obj);
  }
  check_errors();
  check_fusion();
  if (!getenv("CG_TEST_KEEP")) sh(cp_fmt("rm -rf '%s'", dir));
  else printf("kept %s\n", dir);
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
