/* test_llvm_rows.c: the row kernels of codegen/llvm.c (softmax, log_softmax, layer_norm,
 * rms_norm forward and backward; sum and mean over the last axis).
 *
 * Builds every row op at several shapes (n below, at and above the 16-lane vector width, odd
 * tails, a single column, zero rows), writes them into one object in a temporary directory
 * (kept when CG_TEST_KEEP is set), and writes a C harness that links the object with
 * kernels/cpu/ref.c, compiles it with the system `cc` and runs it: for each kernel it draws
 * random inputs, runs the reference kernel and the generated one on the same data (backward
 * outputs start non-zero, to see that both accumulate) and compares every output
 * (|got - want| <= 1e-5 |want| + 1e-6 max|want|). The norm kernels run a second time with the
 * optional outputs NULL. Then checks the error paths (a bad shape, a bad op) and the prototype.
 * Prints "N passed, N failed" and exits non-zero on any failure.
 *
 * With CG_ROWS_BENCH=LIB (a libcplankernels.a: bench/row_kernels.sh sets it) it also times every
 * op at the GPT benchmark's shapes against the kf_ kernel of kernels/cpu/fast_nn.c it replaces,
 * and prints one line per op (a benchmark: it never fails on time). */
#include "../../codegen/llvm.h"
#include "cplan.h"

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
  fprintf(stderr, "test_llvm_rows.c:%d: FAILED: ", line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}
#define CHECK(cond, ...) check(!!(cond), __LINE__, __VA_ARGS__)

static int sh(const char *cmd) {
  int st = system(cmd);
  return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

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

/* The harness: checks one kernel of each table entry against ref.c. */
static const char *const harness_body =
    "static unsigned long long rng = 88172645463325252ull;\n"
    "static float rnd(float lo, float hi) {\n"
    "  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;\n"
    "  return lo + (hi - lo) * (float)((rng >> 11) * (1.0 / 9007199254740992.0));\n"
    "}\n"
    "static float *arr(long n, float lo, float hi) {\n"
    "  float *a = malloc(sizeof(float) * (size_t)(n ? n : 1));\n"
    "  for (long i = 0; i < n; i++) a[i] = rnd(lo, hi);\n"
    "  return a;\n"
    "}\n"
    "static float *dup(const float *a, long n) {\n"
    "  float *b = malloc(sizeof(float) * (size_t)(n ? n : 1));\n"
    "  memcpy(b, a, sizeof(float) * (size_t)n);\n"
    "  return b;\n"
    "}\n"
    "static int close_all(const char *name, const char *what, const float *got, const float *want, long n) {\n"
    "  float mx = 0;\n"
    "  for (long i = 0; i < n; i++) mx = fabsf(want[i]) > mx ? fabsf(want[i]) : mx;\n"
    "  for (long i = 0; i < n; i++)\n"
    "    if (!(fabsf(got[i] - want[i]) <= 1e-5f * fabsf(want[i]) + 1e-6f * mx + 1e-30f)) {\n"
    "      printf(\"MISMATCH %s %s[%ld]: got %.9g want %.9g\\n\", name, what, i, got[i], want[i]);\n"
    "      return 0;\n"
    "    }\n"
    "  return 1;\n"
    "}\n"
    "static int run(const Row *t) {\n"
    "  int R = t->rows, N = t->n, ok = 1;\n"
    "  long RN = (long)R * N;\n"
    "  float *x = arr(RN, -4, 4), *w = arr(N, -2, 2), *b = arr(N, -1, 1), *dy = arr(RN, -1, 1);\n"
    "  float *y0 = arr(RN, 0, 1), *y1 = dup(y0, RN), *m0 = arr(R, 0, 1), *m1 = dup(m0, R);\n"
    "  float *s0 = arr(R, 0, 1), *s1 = dup(s0, R), *dw0 = arr(N, -1, 1), *dw1 = dup(dw0, N);\n"
    "  float *db0 = arr(N, -1, 1), *db1 = dup(db0, N), *sv = arr(RN, 0, 1);\n"
    "  switch (t->op) {\n"
    "  case CG_ROW_SOFTMAX_FWD: case CG_ROW_LOG_SOFTMAX_FWD:\n"
    "    if (t->op == CG_ROW_SOFTMAX_FWD) k_softmax_forward(y0, x, R, N); else k_log_softmax_forward(y0, x, R, N);\n"
    "    t->fn((float *const[]){y1}, (const float *const[]){x});\n"
    "    ok &= close_all(t->name, \"y\", y1, y0, RN);\n"
    "    break;\n"
    "  case CG_ROW_SOFTMAX_BWD: case CG_ROW_LOG_SOFTMAX_BWD:\n"
    "    if (t->op == CG_ROW_SOFTMAX_BWD) {\n"
    "      k_softmax_forward(sv, x, R, N); k_softmax_backward(y0, dy, sv, R, N);\n"
    "    } else {\n"
    "      k_log_softmax_forward(sv, x, R, N); k_log_softmax_backward(y0, dy, sv, R, N);\n"
    "    }\n"
    "    t->fn((float *const[]){y1}, (const float *const[]){dy, sv});\n"
    "    ok &= close_all(t->name, \"dx\", y1, y0, RN);\n"
    "    break;\n"
    "  case CG_ROW_LAYER_NORM_FWD:\n"
    "    k_layer_norm_forward(y0, m0, s0, x, w, b, R, N, t->eps);\n"
    "    t->fn((float *const[]){y1, m1, s1}, (const float *const[]){x, w, b});\n"
    "    ok &= close_all(t->name, \"y\", y1, y0, RN) && close_all(t->name, \"mean\", m1, m0, R) &&\n"
    "          close_all(t->name, \"rstd\", s1, s0, R);\n"
    "    t->fn((float *const[]){y1, NULL, NULL}, (const float *const[]){x, w, b});\n"
    "    ok &= close_all(t->name, \"y (no mean, rstd)\", y1, y0, RN);\n"
    "    break;\n"
    "  case CG_ROW_RMS_NORM_FWD:\n"
    "    k_rms_norm_forward(y0, s0, x, w, R, N, t->eps);\n"
    "    t->fn((float *const[]){y1, s1}, (const float *const[]){x, w});\n"
    "    ok &= close_all(t->name, \"y\", y1, y0, RN) && close_all(t->name, \"rstd\", s1, s0, R);\n"
    "    t->fn((float *const[]){y1, NULL}, (const float *const[]){x, w});\n"
    "    ok &= close_all(t->name, \"y (no rstd)\", y1, y0, RN);\n"
    "    break;\n"
    "  case CG_ROW_LAYER_NORM_BWD:\n"
    "    k_layer_norm_forward(sv, m0, s0, x, w, b, R, N, 1e-5f);\n"
    "    k_layer_norm_backward(y0, dw0, db0, dy, x, w, m0, s0, R, N);\n"
    "    t->fn((float *const[]){y1, dw1, db1}, (const float *const[]){dy, x, w, m0, s0});\n"
    "    ok &= close_all(t->name, \"dx\", y1, y0, RN) && close_all(t->name, \"dw\", dw1, dw0, N) &&\n"
    "          close_all(t->name, \"db\", db1, db0, N);\n"
    "    k_layer_norm_backward(NULL, dw0, NULL, dy, x, w, m0, s0, R, N);\n"
    "    t->fn((float *const[]){NULL, dw1, NULL}, (const float *const[]){dy, x, w, m0, s0});\n"
    "    ok &= close_all(t->name, \"dw (dx, db NULL)\", dw1, dw0, N);\n"
    "    k_layer_norm_backward(y0, NULL, NULL, dy, x, w, m0, s0, R, N);\n"
    "    t->fn((float *const[]){y1, NULL, NULL}, (const float *const[]){dy, x, w, m0, s0});\n"
    "    ok &= close_all(t->name, \"dx (dw, db NULL)\", y1, y0, RN);\n"
    "    break;\n"
    "  case CG_ROW_RMS_NORM_BWD:\n"
    "    k_rms_norm_forward(sv, s0, x, w, R, N, 1e-5f);\n"
    "    k_rms_norm_backward(y0, dw0, dy, x, w, s0, R, N);\n"
    "    t->fn((float *const[]){y1, dw1}, (const float *const[]){dy, x, w, s0});\n"
    "    ok &= close_all(t->name, \"dx\", y1, y0, RN) && close_all(t->name, \"dw\", dw1, dw0, N);\n"
    "    k_rms_norm_backward(NULL, dw0, dy, x, w, s0, R, N);\n"
    "    t->fn((float *const[]){NULL, dw1}, (const float *const[]){dy, x, w, s0});\n"
    "    ok &= close_all(t->name, \"dw (dx NULL)\", dw1, dw0, N);\n"
    "    break;\n"
    "  case CG_ROW_SUM_FWD: case CG_ROW_MEAN_FWD:\n"
    "    if (t->op == CG_ROW_SUM_FWD) k_sum_forward(m0, x, R, N, 1); else k_mean_forward(m0, x, R, N, 1);\n"
    "    t->fn((float *const[]){m1}, (const float *const[]){x});\n"
    "    ok &= close_all(t->name, \"y\", m1, m0, R);\n"
    "    break;\n"
    "  default: ok = 0;\n"
    "  }\n"
    "  free(x); free(w); free(b); free(dy); free(y0); free(y1); free(m0); free(m1); free(s0); free(s1);\n"
    "  free(dw0); free(dw1); free(db0); free(db1); free(sv);\n"
    "  return ok;\n"
    "}\n"
    "int main(void) {\n"
    "  int ok = 0, n = (int)(sizeof table / sizeof table[0]);\n"
    "  for (int i = 0; i < n; i++) ok += run(&table[i]);\n"
    "  printf(\"%d of %d\\n\", ok, n);\n"
    "  return ok == n ? 0 : 1;\n"
    "}\n";

static const char *const op_names[CG_ROW__COUNT] = {
    [CG_ROW_SOFTMAX_FWD] = "softmax_fwd",       [CG_ROW_SOFTMAX_BWD] = "softmax_bwd",
    [CG_ROW_LOG_SOFTMAX_FWD] = "logsm_fwd",     [CG_ROW_LOG_SOFTMAX_BWD] = "logsm_bwd",
    [CG_ROW_LAYER_NORM_FWD] = "layer_norm_fwd", [CG_ROW_LAYER_NORM_BWD] = "layer_norm_bwd",
    [CG_ROW_RMS_NORM_FWD] = "rms_norm_fwd",     [CG_ROW_RMS_NORM_BWD] = "rms_norm_bwd",
    [CG_ROW_SUM_FWD] = "sum_fwd",               [CG_ROW_MEAN_FWD] = "mean_fwd"};

static const int64_t shapes[][2] = {{3, 1}, {5, 7}, {4, 16}, {3, 37}, {2, 200}, {0, 5}, {6, 64}, {2, 1000}, {2, 3001}};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static CgKernel ks[CG_ROW__COUNT * NSHAPES];
static int nks;

static void build_kernels(void) {
  for (int op = CG_ROW_NONE + 1; op < CG_ROW__COUNT; op++)
    for (int s = 0; s < NSHAPES; s++) {
      CgKernel *k = &ks[nks++];
      memset(k, 0, sizeof *k);
      k->name = cp_fmt("r_%s_%d", op_names[op], s);
      k->row = (CgRowOp)op;
      k->rank = 2;
      k->shape[0] = shapes[s][0];
      k->shape[1] = shapes[s][1];
      k->eps = s % 2 ? 1e-5f : 1e-3f;
    }
}

static void run_harness(const char *obj) {
  const char *src = cp_fmt("%s/harness.c", dir), *exe = cp_fmt("%s/harness", dir);
  const char *log = cp_fmt("%s/harness.log", dir);
  FILE *f = fopen(src, "w");
  CHECK(f != NULL, "cannot write %s", src);
  if (!f) return;
  fputs("#include \"codegen/llvm.h\"\n#include <math.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
        "#include <string.h>\n\ntypedef void (*RowFn)(float *const *, const float *const *);\n"
        "typedef struct Row { const char *name; RowFn fn; CgRowOp op; int rows, n; float eps; } Row;\n",
        f);
  char proto[256];
  for (int i = 0; i < nks; i++) fprintf(f, "%s\n", cg_llvm_prototype(&ks[i], proto, sizeof proto));
  fputs("static const Row table[] = {\n", f);
  for (int i = 0; i < nks; i++)
    fprintf(f, "  {\"%s\", %s, %d, %lld, %lld, %.9gf},\n", ks[i].name, ks[i].name, (int)ks[i].row,
            (long long)ks[i].shape[0], (long long)ks[i].shape[1], (double)ks[i].eps);
  fputs("};\n", f);
  fputs(harness_body, f);
  fclose(f);
  const char *root = repo_root();
  int rc = sh(cp_fmt("cc -O1 -std=gnu11 -I'%s' -I'%s/kernels/cpu' -o '%s' '%s' '%s/kernels/cpu/ref.c' '%s' -lm >'%s' 2>&1",
                     root, root, exe, src, root, obj, log));
  CHECK(rc == 0, "cc failed on the harness (status %d), see %s", rc, log);
  if (rc != 0) return;
  rc = sh(cp_fmt("'%s' >'%s' 2>&1", exe, log));
  CHECK(rc == 0, "harness: status %d", rc);
  if (rc != 0) sh(cp_fmt("head -20 '%s' >&2", log));
}

static void check_errors(void) {
  char err[256], proto[256];
  CgKernel k = {.name = "bad", .row = CG_ROW_SOFTMAX_FWD, .rank = 2, .shape = {4, 0}};
  CHECK(!cg_llvm_check(&k, err, sizeof err) && strstr(err, "bad"), "n = 0 is rejected: %s", err);
  k.shape[1] = 3;
  k.rank = 1;
  CHECK(!cg_llvm_check(&k, err, sizeof err), "rank 1 is rejected");
  k.rank = 2;
  k.row = CG_ROW__COUNT;
  CHECK(!cg_llvm_check(&k, err, sizeof err) && strstr(err, "row op"), "a bad op is rejected: %s", err);
  k.row = CG_ROW_LAYER_NORM_FWD;
  k.eps = -1;
  CHECK(!cg_llvm_check(&k, err, sizeof err), "a negative eps is rejected");
  k.eps = 1e-5f;
  k.shape[1] = 40; /* two full 16-lane chunks and a tail of 8 */
  CHECK(cg_llvm_check(&k, err, sizeof err), "a good row kernel passes: %s", err);
  CHECK(strcmp(cg_llvm_prototype(&k, proto, sizeof proto),
               "void bad(float *const *out, const float *const *in);") == 0, "prototype: %s", proto);
  int no, ni;
  cg_llvm_row_arity(CG_ROW_LAYER_NORM_BWD, &no, &ni);
  CHECK(no == 3 && ni == 5, "layer_norm backward arity %d %d", no, ni);
  char *ir = cg_llvm_ir(&k, 1, err, sizeof err);
  CHECK(ir && strstr(ir, "<16 x float>") && strstr(ir, "<8 x float>"), "the layer_norm kernel is vector code");
  free(ir);
}

/* The benchmark harness: per op, the best of 20 runs of the generated kernel and of kf_. */
static const char *const bench_body =
    "#include <time.h>\n"
    "static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }\n"
    "#define BEST(var, stmt) do { var = 1e9; for (int it_ = 0; it_ < 20; it_++) { double t0_ = now(); stmt; \\\n"
    "  double d_ = now() - t0_; if (d_ < var) var = d_; } } while (0)\n"
    "int main(void) {\n"
    "  for (int i = 0; i < (int)(sizeof table / sizeof table[0]); i++) {\n"
    "    const Row *t = &table[i]; int R = t->rows, N = t->n; long RN = (long)R * N;\n"
    "    float *x = malloc(4 * RN), *y = malloc(4 * RN), *dy = malloc(4 * RN), *w = malloc(4 * N), *b = malloc(4 * N);\n"
    "    float *m = malloc(4 * R), *s = malloc(4 * R), *dw = malloc(4 * N), *db = malloc(4 * N), *sv = malloc(4 * RN);\n"
    "    for (long j = 0; j < RN; j++) { x[j] = (float)((j * 7919) % 1000) / 250 - 2; dy[j] = x[j] / 3; y[j] = 0; }\n"
    "    for (long j = 0; j < N; j++) { w[j] = 1 + (float)(j % 7) / 10; b[j] = 0.1f; dw[j] = db[j] = 0; }\n"
    "    kf_softmax_forward(sv, x, R, N); kf_layer_norm_forward(y, m, s, x, w, b, R, N, 1e-5f);\n"
    "    double tg = 0, tk = 0;\n"
    "    switch (t->op) {\n"
    "    case CG_ROW_SOFTMAX_FWD: BEST(tg, t->fn((float *const[]){y}, (const float *const[]){x})); BEST(tk, kf_softmax_forward(y, x, R, N)); break;\n"
    "    case CG_ROW_LOG_SOFTMAX_FWD: BEST(tg, t->fn((float *const[]){y}, (const float *const[]){x})); BEST(tk, kf_log_softmax_forward(y, x, R, N)); break;\n"
    "    case CG_ROW_SOFTMAX_BWD: BEST(tg, t->fn((float *const[]){y}, (const float *const[]){dy, sv})); BEST(tk, kf_softmax_backward(y, dy, sv, R, N)); break;\n"
    "    case CG_ROW_LOG_SOFTMAX_BWD: BEST(tg, t->fn((float *const[]){y}, (const float *const[]){dy, sv})); BEST(tk, kf_log_softmax_backward(y, dy, sv, R, N)); break;\n"
    "    case CG_ROW_LAYER_NORM_FWD: BEST(tg, t->fn((float *const[]){y, m, s}, (const float *const[]){x, w, b})); BEST(tk, kf_layer_norm_forward(y, m, s, x, w, b, R, N, 1e-5f)); break;\n"
    "    case CG_ROW_LAYER_NORM_BWD: BEST(tg, t->fn((float *const[]){y, dw, db}, (const float *const[]){dy, x, w, m, s})); BEST(tk, kf_layer_norm_backward(y, dw, db, dy, x, w, m, s, R, N)); break;\n"
    "    case CG_ROW_RMS_NORM_FWD: BEST(tg, t->fn((float *const[]){y, s}, (const float *const[]){x, w})); BEST(tk, kf_rms_norm_forward(y, s, x, w, R, N, 1e-5f)); break;\n"
    "    case CG_ROW_RMS_NORM_BWD: BEST(tg, t->fn((float *const[]){y, dw}, (const float *const[]){dy, x, w, s})); BEST(tk, kf_rms_norm_backward(y, dw, dy, x, w, s, R, N)); break;\n"
    "    case CG_ROW_SUM_FWD: BEST(tg, t->fn((float *const[]){m}, (const float *const[]){x})); BEST(tk, kf_sum_forward(m, x, R, N, 1)); break;\n"
    "    case CG_ROW_MEAN_FWD: BEST(tg, t->fn((float *const[]){m}, (const float *const[]){x})); BEST(tk, kf_mean_forward(m, x, R, N, 1)); break;\n"
    "    default: break;\n"
    "    }\n"
    "    printf(\"%-28s [%6d, %7d]  llvm %8.1f us   kf_ %8.1f us   %.2fx\\n\", t->name, R, N, tg * 1e6, tk * 1e6, tk / tg);\n"
    "    free(x); free(y); free(dy); free(w); free(b); free(m); free(s); free(dw); free(db); free(sv);\n"
    "  }\n"
    "  return 0;\n"
    "}\n";

/* Writes the kernel table and a body into dir/NAME.c. */
static const char *write_harness(const char *name, const CgKernel *k, int n, const char *body) {
  const char *src = cp_fmt("%s/%s.c", dir, name);
  FILE *f = fopen(src, "w");
  if (!f) return NULL;
  fputs("#include \"codegen/llvm.h\"\n#include \"fast_nn.h\"\n#include <math.h>\n#include <stdio.h>\n"
        "#include <stdlib.h>\n#include <string.h>\n\ntypedef void (*RowFn)(float *const *, const float *const *);\n"
        "typedef struct Row { const char *name; RowFn fn; CgRowOp op; int rows, n; float eps; } Row;\n",
        f);
  char proto[256];
  for (int i = 0; i < n; i++) fprintf(f, "%s\n", cg_llvm_prototype(&k[i], proto, sizeof proto));
  fputs("static const Row table[] = {\n", f);
  for (int i = 0; i < n; i++)
    fprintf(f, "  {\"%s\", %s, %d, %lld, %lld, %.9gf},\n", k[i].name, k[i].name, (int)k[i].row,
            (long long)k[i].shape[0], (long long)k[i].shape[1], (double)k[i].eps);
  fputs("};\n", f);
  fputs(body, f);
  fclose(f);
  return src;
}

/* CG_ROWS_BENCH=LIB: times the row kernels at the GPT benchmark's shapes against kf_. */
static void bench(const char *lib) {
  static const int64_t shp[CG_ROW__COUNT][2] = {
      [CG_ROW_SOFTMAX_FWD] = {1024, 512},    [CG_ROW_SOFTMAX_BWD] = {1024, 512},
      [CG_ROW_LOG_SOFTMAX_FWD] = {1024, 512},[CG_ROW_LOG_SOFTMAX_BWD] = {1024, 512},
      [CG_ROW_LAYER_NORM_FWD] = {1024, 256}, [CG_ROW_LAYER_NORM_BWD] = {1024, 256},
      [CG_ROW_RMS_NORM_FWD] = {1024, 256},   [CG_ROW_RMS_NORM_BWD] = {1024, 256},
      [CG_ROW_SUM_FWD] = {1, 1 << 20},       [CG_ROW_MEAN_FWD] = {1024, 256}};
  CgKernel bk[CG_ROW__COUNT];
  int n = 0;
  for (int op = CG_ROW_NONE + 1; op < CG_ROW__COUNT; op++)
    bk[n++] = (CgKernel){.name = cp_fmt("b_%s", op_names[op]), .rank = 2, .shape = {shp[op][0], shp[op][1]},
                         .row = (CgRowOp)op, .eps = 1e-5f};
  char err[512];
  const char *obj = cp_fmt("%s/bench.o", dir), *exe = cp_fmt("%s/bench", dir), *root = repo_root();
  const char *src = write_harness("bench", bk, n, bench_body);
  bool ok = src && cg_llvm_object(bk, n, obj, err, sizeof err);
  CHECK(ok, "bench kernels: %s", ok ? "" : err);
  if (!ok) return;
  int rc = sh(cp_fmt("cc -O2 -std=gnu11 -I'%s' -I'%s/kernels/cpu' -o '%s' '%s' '%s' '%s' -lopenblas -lm -lpthread",
                     root, root, exe, src, obj, lib));
  CHECK(rc == 0, "cc failed on the bench harness (status %d)", rc);
  if (rc == 0) sh(cp_fmt("'%s'", exe));
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/cplan_test_llvm_rows_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  build_kernels();
  char err[512];
  const char *obj = cp_fmt("%s/rows.o", dir);
  bool ok = cg_llvm_object(ks, nks, obj, err, sizeof err);
  CHECK(ok, "cg_llvm_object: %s", err);
  if (ok) run_harness(obj);
  check_errors();
  const char *lib = getenv("CG_ROWS_BENCH");
  if (lib && *lib) bench(lib);
  if (!getenv("CG_TEST_KEEP")) sh(cp_fmt("rm -rf '%s'", dir));
  else printf("kept %s\n", dir);
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
