/* llvm.c: fused elementwise CPU kernels through the LLVM 14 C API (see llvm.h for the contract).
 *
 * The pipeline per call: check every kernel, build one function per kernel (a loop nest over
 * the collapsed output dims with the kernel's DAG evaluated in the innermost body), verify the
 * module, run the new pass manager's default<O3> for a TargetMachine of the host CPU (loop and
 * SLP vectorization on), then print the IR or emit an object file.
 *
 * exp/log/tanh are emitted inline as Cephes' single-precision polynomials rather than calls to
 * llvm.exp.f32 & co.: LLVM 14 through the C API has no vector math library to map those calls
 * to, so a loop calling them would stay scalar (or call expf eight times per vector). */
#include "llvm.h"

#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- kernel checks ------------------------------------------------------------------------ */

static bool fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return false;
}

static bool is_c_ident(const char *s) {
  if (!s || !*s || isdigit((unsigned char)*s)) return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && *s != '_') return false;
  return true;
}

/* Input k's shape broadcasts to the output shape: right-aligned dims equal or 1. */
static bool input_ok(const CgKernel *k, int i, char *err, size_t errlen) {
  const CgInput *in = &k->inputs[i];
  if (in->rank < 0 || in->rank > k->rank)
    return fail(err, errlen, "kernel %s: input %d has rank %d, the output has rank %d", k->name, i,
                in->rank, k->rank);
  for (int d = 0; d < in->rank; d++) {
    int64_t id = in->shape[d], od = k->shape[k->rank - in->rank + d];
    if (id != od && id != 1)
      return fail(err, errlen, "kernel %s: input %d dim %d is %lld, does not broadcast to %lld",
                  k->name, i, d, (long long)id, (long long)od);
  }
  return true;
}

static bool node_ok(const CgKernel *k, int j, char *err, size_t errlen) {
  const CgNode *n = &k->nodes[j];
  switch (n->kind) {
  case CG_INPUT:
    if (n->input < 0 || n->input >= k->ninputs)
      return fail(err, errlen, "kernel %s: node %d reads input %d of %d", k->name, j, n->input,
                  k->ninputs);
    return true;
  case CG_CONST: return true;
  case CG_UNARY:
    if (n->op < 0 || n->op >= K_UNARY_COUNT)
      return fail(err, errlen, "kernel %s: node %d has unary op %d", k->name, j, n->op);
    if (n->a < 0 || n->a >= j)
      return fail(err, errlen, "kernel %s: node %d reads node %d", k->name, j, n->a);
    return true;
  case CG_BINARY:
    if (n->op < 0 || n->op >= K_BINARY_COUNT)
      return fail(err, errlen, "kernel %s: node %d has binary op %d", k->name, j, n->op);
    if (n->a < 0 || n->a >= j || n->b < 0 || n->b >= j)
      return fail(err, errlen, "kernel %s: node %d reads nodes %d, %d", k->name, j, n->a, n->b);
    return true;
  case CG_SELECT:
    if (n->a < 0 || n->a >= j || n->b < 0 || n->b >= j || n->c < 0 || n->c >= j)
      return fail(err, errlen, "kernel %s: node %d reads nodes %d, %d, %d", k->name, j, n->a, n->b, n->c);
    return true;
  }
  return fail(err, errlen, "kernel %s: node %d has kind %d", k->name, j, (int)n->kind);
}

void cg_llvm_row_arity(CgRowOp op, int *nout, int *nin) {
  static const int arity[CG_ROW__COUNT][2] = {
      [CG_ROW_SOFTMAX_FWD] = {1, 1},     [CG_ROW_SOFTMAX_BWD] = {1, 2},
      [CG_ROW_LOG_SOFTMAX_FWD] = {1, 1}, [CG_ROW_LOG_SOFTMAX_BWD] = {1, 2},
      [CG_ROW_LAYER_NORM_FWD] = {3, 3},  [CG_ROW_LAYER_NORM_BWD] = {3, 5},
      [CG_ROW_RMS_NORM_FWD] = {2, 2},    [CG_ROW_RMS_NORM_BWD] = {2, 4},
      [CG_ROW_SUM_FWD] = {1, 1},         [CG_ROW_MEAN_FWD] = {1, 1}};
  bool ok = op > CG_ROW_NONE && op < CG_ROW__COUNT;
  *nout = ok ? arity[op][0] : 0;
  *nin = ok ? arity[op][1] : 0;
}

static bool row_check(const CgKernel *k, char *err, size_t errlen) {
  if (k->row <= CG_ROW_NONE || k->row >= CG_ROW__COUNT)
    return fail(err, errlen, "kernel %s: row op %d", k->name, (int)k->row);
  if (k->rank != 2 || k->shape[0] < 0 || k->shape[1] < 1 || k->shape[0] > INT32_MAX ||
      k->shape[1] > INT32_MAX)
    return fail(err, errlen, "kernel %s: a row kernel needs a shape [rows, n] with n >= 1", k->name);
  if (!(k->eps >= 0)) return fail(err, errlen, "kernel %s: eps %g", k->name, (double)k->eps);
  return true;
}

bool cg_llvm_check(const CgKernel *k, char *err, size_t errlen) {
  if (!is_c_ident(k->name))
    return fail(err, errlen, "kernel name '%s' is not a C identifier", k->name ? k->name : "(null)");
  if (k->row != CG_ROW_NONE) return row_check(k, err, errlen);
  if (k->rank < 0 || k->rank > CG_MAX_RANK)
    return fail(err, errlen, "kernel %s: rank %d (at most %d)", k->name, k->rank, CG_MAX_RANK);
  for (int d = 0; d < k->rank; d++)
    if (k->shape[d] < 0) return fail(err, errlen, "kernel %s: negative dim %d", k->name, d);
  if (k->ninputs < 0 || (k->ninputs > 0 && !k->inputs))
    return fail(err, errlen, "kernel %s: bad input list", k->name);
  for (int i = 0; i < k->ninputs; i++)
    if (!input_ok(k, i, err, errlen)) return false;
  if (k->nnodes <= 0 || !k->nodes) return fail(err, errlen, "kernel %s: no nodes", k->name);
  for (int j = 0; j < k->nnodes; j++)
    if (!node_ok(k, j, err, errlen)) return false;
  return true;
}

char *cg_llvm_prototype(const CgKernel *k, char *buf, size_t buflen) {
  if (k->row != CG_ROW_NONE) {
    snprintf(buf, buflen, "void %s(float *const *out, const float *const *in);", k->name);
    return buf;
  }
  snprintf(buf, buflen, "void %s(float *restrict out, const float *const *in);", k->name);
  return buf;
}

/* ---- the loop nest ---------------------------------------------------------------------------
 * The output is walked row-major. Each input gets an element stride per output dim (0 where it
 * is broadcast); dims of size 1 are dropped and adjacent dims merged wherever every input (and
 * the output) steps through them as through one dim, so a same-shape kernel is a single loop
 * and x[B,T,C] + b[C] is a loop over B*T around a loop over C. */

typedef struct Nest {
  int depth;                              /* loops, outermost first; 0 only for an empty output */
  int64_t n[CG_MAX_RANK];                 /* trip counts */
  int64_t ostride[CG_MAX_RANK];           /* output element strides */
  int64_t (*istride)[CG_MAX_RANK];        /* [ninputs][depth] input element strides */
} Nest;

/* Element strides of input i over the output's dims (before collapsing). */
static void input_strides(const CgKernel *k, int i, int64_t *st) {
  const CgInput *in = &k->inputs[i];
  int64_t s = 1;
  for (int d = k->rank - 1; d >= 0; d--) {
    int id = d - (k->rank - in->rank);
    if (id < 0 || in->shape[id] == 1) {
      st[d] = 0;
    } else {
      st[d] = s;
      s *= in->shape[id];
    }
  }
}

/* Fills nest from the kernel's shapes. Returns false for an empty output (no loops to run).
 * The stride tables have one row per tensor (the output, then every input: a fused kernel may
 * have dozens of inputs), so they live on the heap. */
static bool nest_build(const CgKernel *k, Nest *nest) {
  int rows = k->ninputs + 1, depth = 0;
  int64_t (*full)[CG_MAX_RANK] = calloc((size_t)rows, sizeof *full); /* row 0: output, 1..: inputs */
  int64_t (*st)[CG_MAX_RANK] = calloc((size_t)rows, sizeof *st);
  int64_t n[CG_MAX_RANK] = {0}, s = 1;
  for (int d = k->rank - 1; d >= 0; d--) {
    full[0][d] = s;
    s *= k->shape[d];
  }
  for (int i = 0; i < k->ninputs && s != 0; i++) input_strides(k, i, full[i + 1]);
  for (int d = 0; d < k->rank && s != 0; d++) {
    if (k->shape[d] == 1) continue;
    /* merge dim d into the previous kept loop when every tensor steps through them as one */
    bool merge = depth > 0;
    for (int r = 0; r < rows && merge; r++) merge = st[r][depth - 1] == full[r][d] * k->shape[d];
    if (merge) {
      n[depth - 1] *= k->shape[d];
      for (int r = 0; r < rows; r++) st[r][depth - 1] = full[r][d];
      continue;
    }
    n[depth] = k->shape[d];
    for (int r = 0; r < rows; r++) st[r][depth] = full[r][d];
    depth++;
  }
  if (depth == 0) { /* a scalar output, or all dims 1: one iteration */
    n[0] = 1;
    for (int r = 0; r < rows; r++) st[r][0] = 0;
    depth = 1;
  }
  nest->depth = depth;
  memcpy(nest->n, n, sizeof n);
  memcpy(nest->ostride, st[0], sizeof st[0]);
  for (int i = 0; i < k->ninputs; i++) memcpy(nest->istride[i], st[i + 1], sizeof st[0]);
  free(full);
  free(st);
  return s != 0;
}

/* ---- IR building helpers -------------------------------------------------------------------- */

typedef struct Gen {
  LLVMContextRef ctx;
  LLVMModuleRef mod;
  LLVMBuilderRef b;
  LLVMTypeRef f32, i32, i64, i1, pf, ppf;
  LLVMTypeRef sf32, si32; /* the scalar types; f32 and i32 are <lanes x ...> in row kernels */
  unsigned lanes;         /* 1: scalar code (elementwise kernels, row-kernel scalars) */
  LLVMValueRef fn;
  const CgKernel *k;
  const Nest *nest;
  LLVMValueRef *inptr; /* per input: its float* */
  LLVMValueRef out;
} Gen;

/* A constant at the current width: a scalar, or a splat when g->lanes > 1, so that the
 * transcendentals below serve scalar and vector code alike. */
static LLVMValueRef splat(Gen *g, LLVMValueRef s) {
  if (g->lanes <= 1) return s;
  LLVMValueRef e[64];
  for (unsigned i = 0; i < g->lanes; i++) e[i] = s;
  return LLVMConstVector(e, g->lanes);
}
static LLVMValueRef cf(Gen *g, double v) { return splat(g, LLVMConstReal(g->sf32, v)); }
static LLVMValueRef ci32(Gen *g, int v) {
  return splat(g, LLVMConstInt(g->si32, (unsigned long long)(long long)v, 1));
}
static LLVMValueRef ci64(Gen *g, int64_t v) { return LLVMConstInt(g->i64, (unsigned long long)v, 1); }
static LLVMValueRef fadd(Gen *g, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFAdd(g->b, a, b, ""); }
static LLVMValueRef fsub(Gen *g, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFSub(g->b, a, b, ""); }
static LLVMValueRef fmul(Gen *g, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFMul(g->b, a, b, ""); }
static LLVMValueRef fdiv(Gen *g, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFDiv(g->b, a, b, ""); }
static LLVMValueRef fcmp(Gen *g, LLVMRealPredicate p, LLVMValueRef a, LLVMValueRef b) {
  return LLVMBuildFCmp(g->b, p, a, b, "");
}
static LLVMValueRef sel(Gen *g, LLVMValueRef c, LLVMValueRef a, LLVMValueRef b) {
  return LLVMBuildSelect(g->b, c, a, b, "");
}

/* A call of the f32 overload of an LLVM intrinsic ("llvm.floor"), declared on first use. */
static LLVMValueRef intrinsic(Gen *g, const char *name, LLVMValueRef *args, unsigned nargs) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  LLVMTypeRef ty[1] = {g->f32};
  LLVMValueRef decl = LLVMGetIntrinsicDeclaration(g->mod, id, ty, 1);
  LLVMTypeRef fty = LLVMIntrinsicGetType(g->ctx, id, ty, 1);
  return LLVMBuildCall2(g->b, fty, decl, args, nargs, "");
}
static LLVMValueRef call1(Gen *g, const char *name, LLVMValueRef x) { return intrinsic(g, name, &x, 1); }

/* Horner: c[0] x^(n-1) + ... + c[n-1] */
static LLVMValueRef poly(Gen *g, LLVMValueRef x, const double *c, int n) {
  LLVMValueRef y = cf(g, c[0]);
  for (int i = 1; i < n; i++) y = fadd(g, fmul(g, y, x), cf(g, c[i]));
  return y;
}

/* 2^n for an i32 n in [-126, 127], built from the exponent bits */
static LLVMValueRef pow2i(Gen *g, LLVMValueRef n) {
  LLVMValueRef bits = LLVMBuildShl(g->b, LLVMBuildAdd(g->b, n, ci32(g, 127), ""), ci32(g, 23), "");
  return LLVMBuildBitCast(g->b, bits, g->f32, "");
}

/* ---- transcendentals (Cephes expf, logf, tanhf) ------------------------------------------- */

/* e^x: x = n ln2 + r, |r| <= ln2/2, e^r by a degree-7 polynomial, times 2^n (as two factors so
 * that n = 128 and the subnormal range need no special exponent bits). */
static LLVMValueRef gen_exp(Gen *g, LLVMValueRef x) {
  static const double P[] = {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3,
                             4.1665795894E-2, 1.6666665459E-1, 5.0000001201E-1};
  LLVMValueRef xc = sel(g, fcmp(g, LLVMRealOGT, x, cf(g, 89.0)), cf(g, 89.0), x);
  xc = sel(g, fcmp(g, LLVMRealOLT, xc, cf(g, -104.0)), cf(g, -104.0), xc);
  LLVMValueRef fx = call1(g, "llvm.floor", fadd(g, fmul(g, xc, cf(g, 1.44269504088896341)), cf(g, 0.5)));
  LLVMValueRef r = fsub(g, xc, fmul(g, fx, cf(g, 0.693359375)));
  r = fsub(g, r, fmul(g, fx, cf(g, -2.12194440e-4)));
  LLVMValueRef r2 = fmul(g, r, r);
  LLVMValueRef y = fadd(g, fadd(g, fmul(g, poly(g, r, P, 6), r2), r), cf(g, 1.0));
  LLVMValueRef n = LLVMBuildFPToSI(g->b, fx, g->i32, "");
  LLVMValueRef n1 = LLVMBuildAShr(g->b, n, ci32(g, 1), "");
  LLVMValueRef n2 = LLVMBuildSub(g->b, n, n1, "");
  y = fmul(g, fmul(g, y, pow2i(g, n1)), pow2i(g, n2));
  y = sel(g, fcmp(g, LLVMRealOGT, x, cf(g, 88.72283905206835)), cf(g, __builtin_inff()), y);
  y = sel(g, fcmp(g, LLVMRealOLT, x, cf(g, -103.97207708)), cf(g, 0.0), y);
  return sel(g, fcmp(g, LLVMRealUNO, x, x), x, y); /* NaN in, NaN out */
}

/* ln x: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln(m) by a polynomial in m - 1. Subnormal
 * inputs are scaled by 2^23 first; 0, negatives, +inf and NaN are patched at the end. */
static LLVMValueRef gen_log(Gen *g, LLVMValueRef x) {
  static const double P[] = {7.0376836292E-2,  -1.1514610310E-1, 1.1676998740E-1,
                             -1.2420140846E-1, 1.4249322787E-1,  -1.6668057665E-1,
                             2.0000714765E-1,  -2.4999993993E-1, 3.3333331174E-1};
  LLVMValueRef small = fcmp(g, LLVMRealOLT, x, cf(g, 1.17549435e-38));
  LLVMValueRef xs = sel(g, small, fmul(g, x, cf(g, 8388608.0)), x);
  LLVMValueRef ix = LLVMBuildBitCast(g->b, xs, g->i32, "");
  LLVMValueRef e = LLVMBuildAnd(g->b, LLVMBuildLShr(g->b, ix, ci32(g, 23), ""), ci32(g, 0xff), "");
  e = LLVMBuildSub(g->b, e, sel(g, small, ci32(g, 126 + 23), ci32(g, 126)), "");
  LLVMValueRef mb = LLVMBuildOr(g->b, LLVMBuildAnd(g->b, ix, ci32(g, 0x007fffff), ""), ci32(g, 0x3f000000), "");
  LLVMValueRef m = LLVMBuildBitCast(g->b, mb, g->f32, "");
  LLVMValueRef lt = fcmp(g, LLVMRealOLT, m, cf(g, 0.707106781186547524));
  e = LLVMBuildSub(g->b, e, LLVMBuildZExt(g->b, lt, g->i32, ""), "");
  m = sel(g, lt, fsub(g, fadd(g, m, m), cf(g, 1.0)), fsub(g, m, cf(g, 1.0)));
  LLVMValueRef fe = LLVMBuildSIToFP(g->b, e, g->f32, "");
  LLVMValueRef z = fmul(g, m, m);
  LLVMValueRef y = fmul(g, fmul(g, poly(g, m, P, 9), m), z);
  y = fadd(g, y, fmul(g, fe, cf(g, -2.12194440e-4)));
  y = fadd(g, y, fmul(g, z, cf(g, -0.5)));
  LLVMValueRef r = fadd(g, fadd(g, m, y), fmul(g, fe, cf(g, 0.693359375)));
  r = sel(g, fcmp(g, LLVMRealOEQ, x, cf(g, __builtin_inff())), x, r);
  r = sel(g, fcmp(g, LLVMRealOEQ, x, cf(g, 0.0)), cf(g, -__builtin_inff()), r);
  r = sel(g, fcmp(g, LLVMRealOLT, x, cf(g, 0.0)), cf(g, __builtin_nanf("")), r);
  return sel(g, fcmp(g, LLVMRealUNO, x, x), x, r);
}

/* tanh x: an odd polynomial for |x| < 0.625 (where 1 - 2/(e^2x + 1) would cancel), else
 * 1 - 2/(e^2|x| + 1) with the sign of x. */
static LLVMValueRef gen_tanh(Gen *g, LLVMValueRef x) {
  static const double P[] = {-5.70498872745E-3, 2.06390887954E-2, -5.37397155531E-2,
                             1.33314422036E-1, -3.33332819422E-1};
  LLVMValueRef ax = call1(g, "llvm.fabs", x);
  LLVMValueRef z = fmul(g, x, x);
  LLVMValueRef ps = fadd(g, fmul(g, fmul(g, poly(g, z, P, 5), z), x), x);
  LLVMValueRef e = gen_exp(g, fadd(g, ax, ax));
  LLVMValueRef pl = fsub(g, cf(g, 1.0), fdiv(g, cf(g, 2.0), fadd(g, e, cf(g, 1.0))));
  LLVMValueRef args[2] = {pl, x};
  pl = intrinsic(g, "llvm.copysign", args, 2);
  return sel(g, fcmp(g, LLVMRealOLT, ax, cf(g, 0.625)), ps, pl);
}

/* erf x as kernels/cpu/fast_nn.c's f_erf: the odd Taylor series below 0.5, else Abramowitz and
 * Stegun 7.1.26 with the sign of x */
static LLVMValueRef gen_erf(Gen *g, LLVMValueRef x) {
  static const double S[] = {-0.0008548327, 0.0052239776, -0.0268661706, 0.1128379167, -0.3761263890, 1.1283791671};
  static const double A[] = {1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592, 0.0};
  LLVMValueRef ax = call1(g, "llvm.fabs", x), z = fmul(g, x, x);
  LLVMValueRef small = fmul(g, x, poly(g, z, S, 6));
  LLVMValueRef t = fdiv(g, cf(g, 1.0), fadd(g, cf(g, 1.0), fmul(g, cf(g, 0.3275911), ax)));
  LLVMValueRef big = fsub(g, cf(g, 1.0), fmul(g, poly(g, t, A, 6), gen_exp(g, LLVMBuildFNeg(g->b, z, ""))));
  LLVMValueRef args[2] = {big, x};
  big = intrinsic(g, "llvm.copysign", args, 2);
  return sel(g, fcmp(g, LLVMRealOLT, ax, cf(g, 0.5)), small, big);
}

/* sin x (want_cos 0) or cos x as kernels/cpu/fast_nn.c's f_sincos (Cephes): |x| reduced by an
 * even multiple j of pi/4, the sine or cosine polynomial chosen by the quadrant (j/2 + want_cos)
 * mod 4, the sign of x for sin; NaN in, NaN out. */
static LLVMValueRef gen_sincos(Gen *g, LLVMValueRef x, int want_cos) {
  static const double S[] = {-1.9515295891E-4, 8.3321608736E-3, -1.6666654611E-1};
  static const double C[] = {2.443315711809948E-5, -1.388731625493765E-3, 4.166664568298827E-2};
  LLVMValueRef a = call1(g, "llvm.fabs", x), ja = fmul(g, a, cf(g, 1.27323954473516));
  ja = call1(g, "llvm.floor", sel(g, fcmp(g, LLVMRealOGT, ja, cf(g, 16777216.0)), cf(g, 16777216.0), ja));
  LLVMValueRef j = LLVMBuildFPToSI(g->b, sel(g, fcmp(g, LLVMRealUNO, ja, ja), cf(g, 0.0), ja), g->i32, "");
  j = LLVMBuildAnd(g->b, LLVMBuildAdd(g->b, j, ci32(g, 1), ""), ci32(g, ~1), "");
  LLVMValueRef y = LLVMBuildSIToFP(g->b, j, g->f32, "");
  LLVMValueRef r = fsub(g, fsub(g, fsub(g, a, fmul(g, y, cf(g, 0.78515625))), fmul(g, y, cf(g, 2.4187564849853515625e-4))),
                        fmul(g, y, cf(g, 3.77489497744594108e-8)));
  LLVMValueRef z = fmul(g, r, r);
  LLVMValueRef s = fadd(g, r, fmul(g, fmul(g, r, z), poly(g, z, S, 3)));
  LLVMValueRef c = fadd(g, fsub(g, cf(g, 1.0), fmul(g, z, cf(g, 0.5))), fmul(g, fmul(g, z, z), poly(g, z, C, 3)));
  LLVMValueRef q = LLVMBuildAnd(g->b, LLVMBuildAdd(g->b, LLVMBuildAShr(g->b, j, ci32(g, 1), ""), ci32(g, want_cos), ""),
                                ci32(g, 3), "");
  LLVMValueRef odd = LLVMBuildICmp(g->b, LLVMIntEQ, LLVMBuildAnd(g->b, q, ci32(g, 1), ""), ci32(g, 1), "");
  LLVMValueRef neg = LLVMBuildICmp(g->b, LLVMIntUGE, q, ci32(g, 2), "");
  LLVMValueRef out = sel(g, odd, c, s);
  out = sel(g, neg, LLVMBuildFNeg(g->b, out, ""), out);
  if (!want_cos) out = sel(g, fcmp(g, LLVMRealOLT, x, cf(g, 0.0)), LLVMBuildFNeg(g->b, out, ""), out);
  return sel(g, fcmp(g, LLVMRealUNO, x, x), x, out);
}

/* x / (1 + e^-t): sigmoid (x = 1, t = x), silu (t = x) and gelu (t = 2u) */
static LLVMValueRef over_1_exp(Gen *g, LLVMValueRef num, LLVMValueRef t) {
  LLVMValueRef e = gen_exp(g, LLVMBuildFNeg(g->b, t, ""));
  return fdiv(g, num, fadd(g, cf(g, 1.0), e));
}

/* x^c for a compile-time c: multiplications for integer |c| <= 64, sqrt for 1/2, else e^(c ln x) */
static LLVMValueRef gen_pow(Gen *g, LLVMValueRef x, float c) {
  if (c == 0.5f) return call1(g, "llvm.sqrt", x);
  if (c == (float)(int)c && c >= -64 && c <= 64) {
    int e = (int)(c < 0 ? -c : c);
    LLVMValueRef r = cf(g, 1.0), sq = x;
    for (; e; e >>= 1) { /* square-and-multiply, unrolled at generation time */
      if (e & 1) r = fmul(g, r, sq);
      if (e > 1) sq = fmul(g, sq, sq);
    }
    return c < 0 ? fdiv(g, cf(g, 1.0), r) : r;
  }
  return gen_exp(g, fmul(g, cf(g, c), gen_log(g, x)));
}

/* ---- the ops ---------------------------------------------------------------------------------- */

static LLVMValueRef gen_unary(Gen *g, int op, LLVMValueRef x, float c) {
  switch ((KUnary)op) {
  case K_NEG: return LLVMBuildFNeg(g->b, x, "");
  case K_EXP: return gen_exp(g, x);
  case K_LOG: return gen_log(g, x);
  case K_SQRT: return call1(g, "llvm.sqrt", x);
  case K_RSQRT: return fdiv(g, cf(g, 1.0), call1(g, "llvm.sqrt", x));
  case K_TANH: return gen_tanh(g, x);
  case K_SIGMOID: return over_1_exp(g, cf(g, 1.0), x);
  case K_RELU: return sel(g, fcmp(g, LLVMRealOGT, x, cf(g, 0.0)), x, cf(g, 0.0));
  case K_GELU: { /* 0.5 x (1 + tanh u) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */
    LLVMValueRef x3 = fmul(g, fmul(g, x, x), x);
    LLVMValueRef u = fmul(g, cf(g, 0.7978845608028654), fadd(g, x, fmul(g, cf(g, 0.044715), x3)));
    return over_1_exp(g, x, fadd(g, u, u));
  }
  case K_SILU: return over_1_exp(g, x, x);
  case K_SQUARE: return fmul(g, x, x);
  case K_POW: return gen_pow(g, x, c);
  case K_ABS: return call1(g, "llvm.fabs", x);
  /* as ref.c: x < c ? c : x, so a NaN stays NaN */
  case K_CLAMP_MIN: return sel(g, fcmp(g, LLVMRealOLT, x, cf(g, c)), cf(g, c), x);
  case K_CLAMP_MAX: return sel(g, fcmp(g, LLVMRealOGT, x, cf(g, c)), cf(g, c), x);
  case K_ERF: return gen_erf(g, x);
  case K_SIN: return gen_sincos(g, x, 0);
  case K_COS: return gen_sincos(g, x, 1);
  case K_UNARY_COUNT: break;
  }
  return NULL; /* cg_llvm_check rejected it */
}

/* Python's mod of f32 (ref.h's k_mod_f: fmod, moved to the divisor's sign) without a libm call:
 * in f64, a - trunc(a / b) * b is fmod exactly while the quotient stays below 2^24. */
static LLVMValueRef gen_mod(Gen *g, LLVMValueRef a, LLVMValueRef b) {
  LLVMTypeRef sd = LLVMDoubleTypeInContext(g->ctx), d = g->lanes > 1 ? LLVMVectorType(sd, g->lanes) : sd;
  LLVMValueRef ad = LLVMBuildFPExt(g->b, a, d, ""), bd = LLVMBuildFPExt(g->b, b, d, "");
  unsigned id = LLVMLookupIntrinsicID("llvm.trunc", strlen("llvm.trunc"));
  LLVMTypeRef ty[1] = {d};
  LLVMValueRef quot = LLVMBuildFDiv(g->b, ad, bd, "");
  LLVMValueRef q = LLVMBuildCall2(g->b, LLVMIntrinsicGetType(g->ctx, id, ty, 1),
                                  LLVMGetIntrinsicDeclaration(g->mod, id, ty, 1), &quot, 1, "");
  LLVMValueRef r = LLVMBuildFPTrunc(g->b, LLVMBuildFSub(g->b, ad, LLVMBuildFMul(g->b, q, bd, ""), ""), g->f32, "");
  LLVMValueRef zero = cf(g, 0.0);
  LLVMValueRef off = LLVMBuildXor(g->b, fcmp(g, LLVMRealOLT, r, zero), fcmp(g, LLVMRealOLT, b, zero), "");
  return sel(g, LLVMBuildAnd(g->b, fcmp(g, LLVMRealONE, r, zero), off, ""), fadd(g, r, b), r);
}

static LLVMValueRef gen_binary(Gen *g, int op, LLVMValueRef a, LLVMValueRef b) {
  static const LLVMRealPredicate cmp[] = {
      [K_EQ] = LLVMRealOEQ, [K_NE] = LLVMRealUNE, [K_LT] = LLVMRealOLT,
      [K_LE] = LLVMRealOLE, [K_GT] = LLVMRealOGT, [K_GE] = LLVMRealOGE};
  switch ((KBinary)op) {
  case K_ADD: return fadd(g, a, b);
  case K_SUB: return fsub(g, a, b);
  case K_MUL: return fmul(g, a, b);
  case K_DIV: return fdiv(g, a, b);
  /* as ref.c: a > b ? a : b, so a NaN in a gives b */
  case K_MAXIMUM: return sel(g, fcmp(g, LLVMRealOGT, a, b), a, b);
  case K_MINIMUM: return sel(g, fcmp(g, LLVMRealOLT, a, b), a, b);
  case K_MOD: return gen_mod(g, a, b);
  case K_FLOORDIV: return call1(g, "llvm.floor", fdiv(g, a, b));
  case K_EQ: case K_NE: case K_LT: case K_LE: case K_GT: case K_GE:
    return sel(g, fcmp(g, cmp[op], a, b), cf(g, 1.0), cf(g, 0.0));
  case K_BINARY_COUNT: break;
  }
  return NULL;
}

static LLVMValueRef load_at(Gen *g, LLVMValueRef base, LLVMValueRef off) {
  LLVMValueRef p = LLVMBuildInBoundsGEP2(g->b, g->f32, base, &off, 1, "");
  LLVMValueRef v = LLVMBuildLoad2(g->b, g->f32, p, "");
  LLVMSetAlignment(v, 4);
  return v;
}

/* The kernel's DAG at one element: offs[i] is input i's element offset. Returns the output. */
static LLVMValueRef gen_element(Gen *g, LLVMValueRef *offs) {
  const CgKernel *k = g->k;
  LLVMValueRef *v = calloc((size_t)k->nnodes, sizeof *v), r;
  for (int j = 0; j < k->nnodes; j++) {
    const CgNode *n = &k->nodes[j];
    switch (n->kind) {
    case CG_INPUT: v[j] = load_at(g, g->inptr[n->input], offs[n->input]); break;
    case CG_CONST: v[j] = cf(g, n->value); break;
    case CG_UNARY: v[j] = gen_unary(g, n->op, v[n->a], n->value); break;
    case CG_BINARY: v[j] = gen_binary(g, n->op, v[n->a], v[n->b]); break;
    case CG_SELECT: v[j] = sel(g, fcmp(g, LLVMRealUNE, v[n->a], cf(g, 0.0)), v[n->b], v[n->c]); break;
    }
  }
  r = v[k->nnodes - 1];
  free(v);
  return r;
}

/* One loop of the nest at `level`, in rotated (do-while) form since every trip count is >= 1.
 * base[i] / obase: offsets of the inputs and the output at this loop's first iteration. Leaves
 * the builder in the loop's exit block. */
static void gen_loop(Gen *g, int level, LLVMValueRef *base, LLVMValueRef obase) {
  const Nest *ns = g->nest;
  int ni = g->k->ninputs;
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(g->b);
  LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "loop");
  LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "done");
  LLVMBuildBr(g->b, body);
  LLVMPositionBuilderAtEnd(g->b, body);
  LLVMValueRef i = LLVMBuildPhi(g->b, g->i64, "i");
  LLVMValueRef *offs = calloc((size_t)ni + 1, sizeof *offs);
  for (int k = 0; k < ni; k++)
    offs[k] = LLVMBuildAdd(g->b, base[k], LLVMBuildMul(g->b, i, ci64(g, ns->istride[k][level]), ""), "");
  LLVMValueRef ooff = LLVMBuildAdd(g->b, obase, LLVMBuildMul(g->b, i, ci64(g, ns->ostride[level]), ""), "");
  if (level + 1 < ns->depth) {
    gen_loop(g, level + 1, offs, ooff);
  } else {
    LLVMValueRef p = LLVMBuildInBoundsGEP2(g->b, g->f32, g->out, &ooff, 1, "");
    LLVMSetAlignment(LLVMBuildStore(g->b, gen_element(g, offs), p), 4);
  }
  free(offs);
  LLVMValueRef next = LLVMBuildAdd(g->b, i, ci64(g, 1), "");
  LLVMValueRef more = LLVMBuildICmp(g->b, LLVMIntSLT, next, ci64(g, ns->n[level]), "");
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
  LLVMBuildCondBr(g->b, more, body, exit);
  LLVMValueRef in_vals[2] = {ci64(g, 0), next};
  LLVMBasicBlockRef in_blocks[2] = {pre, latch};
  LLVMAddIncoming(i, in_vals, in_blocks, 2);
  LLVMPositionBuilderAtEnd(g->b, exit);
}

static void add_attr(Gen *g, LLVMValueRef fn, LLVMAttributeIndex idx, const char *name) {
  unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
  LLVMAddAttributeAtIndex(fn, idx, LLVMCreateEnumAttribute(g->ctx, kind, 0));
}

/* void NAME(float *noalias out, const float *const *in) */
static LLVMValueRef declare_kernel(Gen *g, const char *name) {
  LLVMTypeRef params[2] = {g->pf, g->ppf};
  LLVMTypeRef fty = LLVMFunctionType(LLVMVoidTypeInContext(g->ctx), params, 2, 0);
  LLVMValueRef fn = LLVMAddFunction(g->mod, name, fty);
  add_attr(g, fn, LLVMAttributeFunctionIndex, "nounwind");
  add_attr(g, fn, 1, "noalias"); /* what lets the vectorizer skip run-time overlap checks */
  add_attr(g, fn, 1, "nocapture");
  add_attr(g, fn, 2, "nocapture");
  add_attr(g, fn, 2, "readonly");
  return fn;
}

static void gen_kernel(Gen *g, const CgKernel *k) {
  int64_t (*istride)[CG_MAX_RANK] = calloc((size_t)k->ninputs + 1, sizeof *istride);
  Nest nest = {.istride = istride};
  bool any = nest_build(k, &nest);
  g->k = k;
  g->nest = &nest;
  g->fn = declare_kernel(g, k->name);
  LLVMPositionBuilderAtEnd(g->b, LLVMAppendBasicBlockInContext(g->ctx, g->fn, "entry"));
  g->out = LLVMGetParam(g->fn, 0);
  LLVMValueRef in = LLVMGetParam(g->fn, 1);
  g->inptr = calloc((size_t)k->ninputs + 1, sizeof *g->inptr);
  LLVMValueRef *zero = calloc((size_t)k->ninputs + 1, sizeof *zero);
  for (int i = 0; i < k->ninputs; i++) { /* the input pointers, loaded once */
    LLVMValueRef idx = ci64(g, i);
    LLVMValueRef slot = LLVMBuildInBoundsGEP2(g->b, g->pf, in, &idx, 1, "");
    g->inptr[i] = LLVMBuildLoad2(g->b, g->pf, slot, "");
    LLVMSetAlignment(g->inptr[i], 8);
    zero[i] = ci64(g, 0);
  }
  if (any) gen_loop(g, 0, zero, ci64(g, 0));
  LLVMBuildRetVoid(g->b);
  free(zero);
  free(g->inptr);
  free(istride);
}

/* ---- row kernels -----------------------------------------------------------------------------
 * A loop over the rows; per row, a few passes over its n columns (llvm.h lists them per op).
 * Each pass is written at vector width: a loop over the n / ROW_LANES full chunks with
 * <ROW_LANES x float> values, then one chunk of the n % ROW_LANES left (a narrower vector type,
 * legal in IR: the backend widens it), both from the same body callback. A pass may reduce:
 * its accumulators are vectors (ROW_LANES partial sums or maxima, so the adds need no
 * reassociation to vectorize) totalled lane by lane after the loop. */

#define ROW_LANES 16

typedef enum RedKind { RED_ADD, RED_MAX } RedKind;

typedef struct RowGen {
  Gen *g;
  const CgKernel *k;
  int64_t n;              /* the row length */
  LLVMValueRef out[3];    /* the out[] pointers, loaded once */
  LLVMValueRef in[5];     /* the in[] pointers */
  LLVMValueRef r;         /* the row index (i64) */
  LLVMValueRef s[4];      /* per-row scalars the passes read (max, mean, rstd, ...) */
} RowGen;

/* a pass body: computes its stores at columns [off, off + lanes) and its reductions' terms */
typedef void (*PassBody)(RowGen *R, LLVMValueRef off, LLVMValueRef *terms);

static void set_lanes(Gen *g, unsigned lanes) {
  g->lanes = lanes;
  g->f32 = lanes > 1 ? LLVMVectorType(g->sf32, lanes) : g->sf32;
  g->i32 = lanes > 1 ? LLVMVectorType(g->si32, lanes) : g->si32;
}

/* a scalar float at the current width */
static LLVMValueRef bcast(Gen *g, LLVMValueRef x) {
  if (g->lanes <= 1) return x;
  LLVMValueRef v = LLVMBuildInsertElement(g->b, LLVMGetUndef(g->f32), x, ci64(g, 0), "");
  LLVMTypeRef mty = LLVMVectorType(g->si32, g->lanes);
  return LLVMBuildShuffleVector(g->b, v, LLVMGetUndef(g->f32), LLVMConstNull(mty), "");
}

/* the address of element off of base, as a pointer to the current width's type */
static LLVMValueRef vaddr(Gen *g, LLVMValueRef base, LLVMValueRef off) {
  LLVMValueRef p = LLVMBuildInBoundsGEP2(g->b, g->sf32, base, &off, 1, "");
  return g->lanes > 1 ? LLVMBuildBitCast(g->b, p, LLVMPointerType(g->f32, 0), "") : p;
}
static LLVMValueRef vload(Gen *g, LLVMValueRef base, LLVMValueRef off) {
  LLVMValueRef v = LLVMBuildLoad2(g->b, g->f32, vaddr(g, base, off), "");
  LLVMSetAlignment(v, 4);
  return v;
}
static void vstore(Gen *g, LLVMValueRef base, LLVMValueRef off, LLVMValueRef v) {
  LLVMSetAlignment(LLVMBuildStore(g->b, v, vaddr(g, base, off)), 4);
}
/* base[off..] += v */
static void vacc(Gen *g, LLVMValueRef base, LLVMValueRef off, LLVMValueRef v) {
  vstore(g, base, off, fadd(g, vload(g, base, off), v));
}

static LLVMValueRef red2(Gen *g, RedKind kind, LLVMValueRef a, LLVMValueRef b) {
  if (kind == RED_ADD) return fadd(g, a, b);
  return sel(g, fcmp(g, LLVMRealOGT, b, a), b, a); /* as ref.c: a later element wins if greater */
}

/* the lanes of v combined in lane order, as a scalar */
static LLVMValueRef hreduce(Gen *g, RedKind kind, LLVMValueRef v) {
  unsigned lanes = g->lanes;
  if (lanes <= 1) return v;
  set_lanes(g, 1);
  LLVMValueRef t = LLVMBuildExtractElement(g->b, v, ci64(g, 0), "");
  for (unsigned i = 1; i < lanes; i++) t = red2(g, kind, t, LLVMBuildExtractElement(g->b, v, ci64(g, i), ""));
  set_lanes(g, lanes);
  return t;
}

typedef struct Loop {
  LLVMBasicBlockRef pre, body, exit;
  LLVMValueRef i;
  int64_t n;
} Loop;

/* for (i = 0; i < n; i++), n >= 1, as a do-while; the builder is left in the body */
static Loop loop_open(Gen *g, int64_t n) {
  Loop l = {.pre = LLVMGetInsertBlock(g->b), .n = n};
  l.body = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "loop");
  l.exit = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "done");
  LLVMBuildBr(g->b, l.body);
  LLVMPositionBuilderAtEnd(g->b, l.body);
  l.i = LLVMBuildPhi(g->b, g->i64, "i");
  return l;
}

/* closes the loop; returns the latch block (for the caller's other phis) */
static LLVMBasicBlockRef loop_close(Gen *g, Loop *l) {
  LLVMValueRef next = LLVMBuildAdd(g->b, l->i, ci64(g, 1), "");
  LLVMValueRef more = LLVMBuildICmp(g->b, LLVMIntSLT, next, ci64(g, l->n), "");
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
  LLVMBuildCondBr(g->b, more, l->body, l->exit);
  LLVMValueRef vals[2] = {ci64(g, 0), next};
  LLVMBasicBlockRef blocks[2] = {l->pre, latch};
  LLVMAddIncoming(l->i, vals, blocks, 2);
  LLVMPositionBuilderAtEnd(g->b, l->exit);
  return latch;
}

static void add_incoming(LLVMValueRef phi, LLVMValueRef v, LLVMBasicBlockRef from) {
  LLVMAddIncoming(phi, &v, &from, 1);
}

/* One pass over the current row: body at every chunk; res[k] (scalars) the reductions of
 * terms[k] of kinds[k], k < nred. */
static void row_pass(RowGen *R, PassBody body, int nred, const RedKind *kinds, LLVMValueRef *res) {
  Gen *g = R->g;
  int64_t nfull = R->n / ROW_LANES, tail = R->n % ROW_LANES;
  LLVMValueRef terms[4], acc[4];
  for (int k = 0; k < nred; k++) res[k] = LLVMConstReal(g->sf32, kinds[k] == RED_ADD ? 0.0 : -__builtin_inff());
  if (nfull > 0) {
    set_lanes(g, ROW_LANES);
    Loop l = loop_open(g, nfull);
    for (int k = 0; k < nred; k++) {
      acc[k] = LLVMBuildPhi(g->b, g->f32, "acc");
      add_incoming(acc[k], splat(g, res[k]), l.pre);
    }
    body(R, LLVMBuildMul(g->b, l.i, ci64(g, ROW_LANES), ""), terms);
    LLVMValueRef next[4];
    for (int k = 0; k < nred; k++) next[k] = red2(g, kinds[k], acc[k], terms[k]);
    LLVMBasicBlockRef latch = loop_close(g, &l);
    for (int k = 0; k < nred; k++) {
      add_incoming(acc[k], next[k], latch);
      res[k] = hreduce(g, kinds[k], next[k]);
    }
  }
  if (tail > 0) {
    set_lanes(g, (unsigned)tail);
    body(R, ci64(g, nfull * ROW_LANES), terms);
    for (int k = 0; k < nred; k++) {
      LLVMValueRef t = hreduce(g, kinds[k], terms[k]);
      set_lanes(g, 1);
      res[k] = red2(g, kinds[k], res[k], t);
      set_lanes(g, (unsigned)tail);
    }
  }
  set_lanes(g, 1);
}

static LLVMValueRef row_ptr(RowGen *R, LLVMValueRef base) {
  LLVMValueRef off = LLVMBuildMul(R->g->b, R->r, ci64(R->g, R->n), "");
  return LLVMBuildGEP2(R->g->b, R->g->sf32, base, &off, 1, ""); /* not inbounds: base may be NULL */
}

/* if (p != NULL) { ... }: returns the join block; the builder is left in the then block */
static LLVMBasicBlockRef if_nonnull(Gen *g, LLVMValueRef p) {
  LLVMBasicBlockRef then = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "then");
  LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "join");
  LLVMBuildCondBr(g->b, LLVMBuildIsNotNull(g->b, p, ""), then, join);
  LLVMPositionBuilderAtEnd(g->b, then);
  return join;
}
static void end_if(Gen *g, LLVMBasicBlockRef join) {
  LLVMBuildBr(g->b, join);
  LLVMPositionBuilderAtEnd(g->b, join);
}

static LLVMValueRef cn(RowGen *R) { return LLVMConstReal(R->g->sf32, (double)R->n); }

/* ---- the passes (R->in / R->out hold the current row's pointers; s[] the row's scalars) ---- */

static void p_max_x(RowGen *R, LLVMValueRef off, LLVMValueRef *t) { t[0] = vload(R->g, R->in[0], off); }
static void p_sum_x(RowGen *R, LLVMValueRef off, LLVMValueRef *t) { t[0] = vload(R->g, R->in[0], off); }
static void p_sumsq_x(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  LLVMValueRef x = vload(R->g, R->in[0], off);
  t[0] = fmul(R->g, x, x);
}
/* sum of (x - s0)^2 */
static void p_sqdev_x(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  LLVMValueRef d = fsub(R->g, vload(R->g, R->in[0], off), bcast(R->g, R->s[0]));
  t[0] = fmul(R->g, d, d);
}
/* y = exp(x - s0), summed */
static void p_softmax_exp(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  Gen *g = R->g;
  t[0] = gen_exp(g, fsub(g, vload(g, R->in[0], off), bcast(g, R->s[0])));
  vstore(g, R->out[0], off, t[0]);
}
static void p_scale_y(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  (void)t;
  vstore(R->g, R->out[0], off, fmul(R->g, vload(R->g, R->out[0], off), bcast(R->g, R->s[1])));
}
static void p_sum_exp(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  Gen *g = R->g;
  t[0] = gen_exp(g, fsub(g, vload(g, R->in[0], off), bcast(g, R->s[0])));
}
/* y = (x - max) - log(sum) */
static void p_logsm_out(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  Gen *g = R->g;
  (void)t;
  LLVMValueRef d = fsub(g, vload(g, R->in[0], off), bcast(g, R->s[0]));
  vstore(g, R->out[0], off, fsub(g, d, bcast(g, R->s[1])));
}
/* softmax backward: in {dy, y}; dot, then dx += y (dy - dot) */
static void p_dot_dy_y(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  t[0] = fmul(R->g, vload(R->g, R->in[0], off), vload(R->g, R->in[1], off));
}
static void p_sm_dx(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  Gen *g = R->g;
  (void)t;
  LLVMValueRef dy = vload(g, R->in[0], off), y = vload(g, R->in[1], off);
  vacc(g, R->out[0], off, fmul(g, y, fsub(g, dy, bcast(g, R->s[0]))));
}
/* log_softmax backward: dx += dy - exp(y) sum(dy) */
static void p_lsm_dx(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  Gen *g = R->g;
  (void)t;
  LLVMValueRef dy = vload(g, R->in[0], off), y = vload(g, R->in[1], off);
  vacc(g, R->out[0], off, fsub(g, dy, fmul(g, gen_exp(g, y), bcast(g, R->s[0]))));
}
/* layer_norm forward: y = (x - m) s w + b; in {x, w, b}, s0 = m, s1 = s (w, b: column bases) */
static void p_ln_out(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  Gen *g = R->g;
  (void)t;
  LLVMValueRef xh = fmul(g, fsub(g, vload(g, R->in[0], off), bcast(g, R->s[0])), bcast(g, R->s[1]));
  vstore(g, R->out[0], off, fadd(g, fmul(g, xh, vload(g, R->in[1], off)), vload(g, R->in[2], off)));
}
/* rms_norm forward: y = x s w; in {x, w}, s1 = s */
static void p_rms_out(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  Gen *g = R->g;
  (void)t;
  LLVMValueRef xh = fmul(g, vload(g, R->in[0], off), bcast(g, R->s[1]));
  vstore(g, R->out[0], off, fmul(g, xh, vload(g, R->in[1], off)));
}
/* norm backward, in {dy, x, w, ...}, s0 = m (0 for rms), s1 = s: sums of g = w dy and g (x - m) */
static void p_norm_means(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  Gen *g = R->g;
  LLVMValueRef gg = fmul(g, vload(g, R->in[2], off), vload(g, R->in[0], off));
  t[0] = gg;
  t[1] = fmul(g, gg, fsub(g, vload(g, R->in[1], off), bcast(g, R->s[0])));
}
/* dx += s (w dy - gm - (x - m) s gxm), s2 = gm (0 for rms), s3 = gxm */
static void p_norm_dx(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  Gen *g = R->g;
  (void)t;
  LLVMValueRef s = bcast(g, R->s[1]);
  LLVMValueRef xh = fmul(g, fsub(g, vload(g, R->in[1], off), bcast(g, R->s[0])), s);
  LLVMValueRef gg = fmul(g, vload(g, R->in[2], off), vload(g, R->in[0], off));
  LLVMValueRef v = fsub(g, fsub(g, gg, bcast(g, R->s[2])), fmul(g, xh, bcast(g, R->s[3])));
  vacc(g, R->out[0], off, fmul(g, s, v));
}
/* dw += dy (x - m) s */
static void p_norm_dw(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  Gen *g = R->g;
  (void)t;
  LLVMValueRef xh = fmul(g, fsub(g, vload(g, R->in[1], off), bcast(g, R->s[0])), bcast(g, R->s[1]));
  vacc(g, R->out[1], off, fmul(g, vload(g, R->in[0], off), xh));
}
static void p_norm_db(RowGen *R, LLVMValueRef off, LLVMValueRef *t) {
  (void)t;
  vacc(R->g, R->out[2], off, vload(R->g, R->in[0], off));
}

/* ---- per-op row bodies ------------------------------------------------------------------------ */

static const RedKind RK_ADD[2] = {RED_ADD, RED_ADD}, RK_MAX[1] = {RED_MAX};

static LLVMValueRef scalar_at(Gen *g, LLVMValueRef base, LLVMValueRef r) { return load_at(g, base, r); }
static void store_at(Gen *g, LLVMValueRef base, LLVMValueRef r, LLVMValueRef v) {
  LLVMValueRef p = LLVMBuildInBoundsGEP2(g->b, g->sf32, base, &r, 1, "");
  LLVMSetAlignment(LLVMBuildStore(g->b, v, p), 4);
}
static LLVMValueRef rsqrt_of(Gen *g, LLVMValueRef sum, LLVMValueRef n, float eps) {
  LLVMValueRef v = fadd(g, fdiv(g, sum, n), cf(g, eps));
  return fdiv(g, cf(g, 1.0), call1(g, "llvm.sqrt", v));
}

static void row_softmax(RowGen *R, bool log) {
  Gen *g = R->g;
  row_pass(R, p_max_x, 1, RK_MAX, &R->s[0]);
  if (!log) {
    LLVMValueRef sum;
    row_pass(R, p_softmax_exp, 1, RK_ADD, &sum);
    R->s[1] = fdiv(g, cf(g, 1.0), sum);
    row_pass(R, p_scale_y, 0, NULL, NULL);
  } else {
    LLVMValueRef sum;
    row_pass(R, p_sum_exp, 1, RK_ADD, &sum);
    R->s[1] = gen_log(g, sum);
    row_pass(R, p_logsm_out, 0, NULL, NULL);
  }
}

static void row_softmax_bwd(RowGen *R, bool log) {
  if (!log) {
    row_pass(R, p_dot_dy_y, 1, RK_ADD, &R->s[0]);
    row_pass(R, p_sm_dx, 0, NULL, NULL);
  } else {
    row_pass(R, p_sum_x, 1, RK_ADD, &R->s[0]); /* in[0] is dy */
    row_pass(R, p_lsm_dx, 0, NULL, NULL);
  }
}

/* out {y, mean?, rstd?} in {x, w, b}; rms: out {y, rstd?} in {x, w} */
static void row_norm(RowGen *R, bool rms, LLVMValueRef *outbase) {
  Gen *g = R->g;
  LLVMValueRef sum;
  if (rms) {
    R->s[0] = cf(g, 0.0);
    row_pass(R, p_sumsq_x, 1, RK_ADD, &sum);
  } else {
    row_pass(R, p_sum_x, 1, RK_ADD, &sum);
    R->s[0] = fdiv(g, sum, cn(R));
    row_pass(R, p_sqdev_x, 1, RK_ADD, &sum);
  }
  R->s[1] = rsqrt_of(g, sum, cn(R), R->k->eps);
  row_pass(R, rms ? p_rms_out : p_ln_out, 0, NULL, NULL);
  for (int k = rms ? 1 : 0; k < 2; k++) { /* mean (layer_norm only), rstd */
    LLVMValueRef base = outbase[rms ? 1 : k + 1];
    LLVMBasicBlockRef join = if_nonnull(g, base);
    store_at(g, base, R->r, R->s[k]);
    end_if(g, join);
  }
}

/* out {dx?, dw?, db?} in {dy, x, w, mean, rstd}; rms: out {dx?, dw?} in {dy, x, w, rstd} */
static void row_norm_bwd(RowGen *R, bool rms, LLVMValueRef *inbase, LLVMValueRef *outbase) {
  Gen *g = R->g;
  R->s[0] = rms ? cf(g, 0.0) : scalar_at(g, inbase[3], R->r);
  R->s[1] = scalar_at(g, inbase[rms ? 3 : 4], R->r);
  LLVMBasicBlockRef join = if_nonnull(g, outbase[0]);
  LLVMValueRef sums[2];
  row_pass(R, p_norm_means, 2, RK_ADD, sums);
  R->s[2] = rms ? cf(g, 0.0) : fdiv(g, sums[0], cn(R));
  R->s[3] = fdiv(g, fmul(g, sums[1], R->s[1]), cn(R));
  row_pass(R, p_norm_dx, 0, NULL, NULL);
  end_if(g, join);
  join = if_nonnull(g, outbase[1]);
  row_pass(R, p_norm_dw, 0, NULL, NULL);
  end_if(g, join);
  if (!rms) {
    join = if_nonnull(g, outbase[2]);
    row_pass(R, p_norm_db, 0, NULL, NULL);
    end_if(g, join);
  }
}

/* total + the lanes of the double vector (or scalar) v, in lane order */
static LLVMValueRef dsum_lanes(Gen *g, LLVMValueRef v, unsigned lanes, LLVMValueRef total) {
  if (lanes <= 1) return fadd(g, total, v);
  for (unsigned i = 0; i < lanes; i++) total = fadd(g, total, LLVMBuildExtractElement(g->b, v, ci64(g, i), ""));
  return total;
}

/* x at [off, off + lanes) widened to double */
static LLVMValueRef load_f64(RowGen *R, LLVMValueRef off) {
  Gen *g = R->g;
  LLVMTypeRef f64 = LLVMDoubleTypeInContext(g->ctx);
  return LLVMBuildFPExt(g->b, vload(g, R->in[0], off), g->lanes > 1 ? LLVMVectorType(f64, g->lanes) : f64, "");
}

/* Sums run over whole tensors too (n in the millions: gradient norms), so unlike the norms'
 * row statistics they add up in 16 double lanes, as ref.c's double accumulator does. */
static void row_sum(RowGen *R, bool mean, LLVMValueRef *outbase) {
  Gen *g = R->g;
  LLVMTypeRef f64 = LLVMDoubleTypeInContext(g->ctx), vd = LLVMVectorType(f64, ROW_LANES);
  int64_t nfull = R->n / ROW_LANES, tail = R->n % ROW_LANES;
  LLVMValueRef total = LLVMConstReal(f64, 0.0);
  if (nfull > 0) {
    set_lanes(g, ROW_LANES);
    Loop l = loop_open(g, nfull);
    LLVMValueRef acc = LLVMBuildPhi(g->b, vd, "acc");
    add_incoming(acc, LLVMConstNull(vd), l.pre);
    LLVMValueRef next = fadd(g, acc, load_f64(R, LLVMBuildMul(g->b, l.i, ci64(g, ROW_LANES), "")));
    add_incoming(acc, next, loop_close(g, &l));
    total = dsum_lanes(g, next, ROW_LANES, total);
  }
  if (tail > 0) {
    set_lanes(g, (unsigned)tail);
    total = dsum_lanes(g, load_f64(R, ci64(g, nfull * ROW_LANES)), (unsigned)tail, total);
  }
  set_lanes(g, 1);
  LLVMValueRef sum = LLVMBuildFPTrunc(g->b, total, g->sf32, "");
  store_at(g, outbase[0], R->r, mean ? fdiv(g, sum, cn(R)) : sum);
}

/* Tensors of [rows, n] get the row's pointer; [n] ones (w, b, dw, db) and [rows] ones (mean,
 * rstd, sum outputs) keep their base. */
static bool row_operand(CgRowOp op, bool out, int k) {
  switch (op) {
  case CG_ROW_LAYER_NORM_FWD: case CG_ROW_RMS_NORM_FWD: return k == 0;
  case CG_ROW_LAYER_NORM_BWD: case CG_ROW_RMS_NORM_BWD: return out ? k == 0 : k < 2;
  case CG_ROW_SUM_FWD: case CG_ROW_MEAN_FWD: return !out;
  default: return true;
  }
}

static void row_body(RowGen *R, LLVMValueRef *inbase, LLVMValueRef *outbase) {
  CgRowOp op = R->k->row;
  switch (op) {
  case CG_ROW_SOFTMAX_FWD: case CG_ROW_LOG_SOFTMAX_FWD: row_softmax(R, op == CG_ROW_LOG_SOFTMAX_FWD); break;
  case CG_ROW_SOFTMAX_BWD: case CG_ROW_LOG_SOFTMAX_BWD: row_softmax_bwd(R, op == CG_ROW_LOG_SOFTMAX_BWD); break;
  case CG_ROW_LAYER_NORM_FWD: case CG_ROW_RMS_NORM_FWD: row_norm(R, op == CG_ROW_RMS_NORM_FWD, outbase); break;
  case CG_ROW_LAYER_NORM_BWD: case CG_ROW_RMS_NORM_BWD:
    row_norm_bwd(R, op == CG_ROW_RMS_NORM_BWD, inbase, outbase);
    break;
  case CG_ROW_SUM_FWD: case CG_ROW_MEAN_FWD: row_sum(R, op == CG_ROW_MEAN_FWD, outbase); break;
  case CG_ROW_NONE: case CG_ROW__COUNT: break;
  }
}

/* void NAME(float *const *out, const float *const *in) */
static void gen_row_kernel(Gen *g, const CgKernel *k) {
  LLVMTypeRef params[2] = {g->ppf, g->ppf};
  LLVMTypeRef fty = LLVMFunctionType(LLVMVoidTypeInContext(g->ctx), params, 2, 0);
  g->fn = LLVMAddFunction(g->mod, k->name, fty);
  add_attr(g, g->fn, LLVMAttributeFunctionIndex, "nounwind");
  for (unsigned a = 1; a <= 2; a++) {
    add_attr(g, g->fn, a, "nocapture");
    add_attr(g, g->fn, a, "readonly");
  }
  LLVMPositionBuilderAtEnd(g->b, LLVMAppendBasicBlockInContext(g->ctx, g->fn, "entry"));
  int nout, nin;
  cg_llvm_row_arity(k->row, &nout, &nin);
  LLVMValueRef inbase[5] = {0}, outbase[3] = {0};
  for (int pass = 0; pass < 2; pass++) /* the pointers, loaded once */
    for (int i = 0; i < (pass ? nin : nout); i++) {
      LLVMValueRef idx = ci64(g, i);
      LLVMValueRef slot = LLVMBuildInBoundsGEP2(g->b, g->pf, LLVMGetParam(g->fn, (unsigned)pass), &idx, 1, "");
      LLVMValueRef p = LLVMBuildLoad2(g->b, g->pf, slot, "");
      LLVMSetAlignment(p, 8);
      (pass ? inbase : outbase)[i] = p;
    }
  if (k->shape[0] > 0) {
    RowGen R = {.g = g, .k = k, .n = k->shape[1]};
    Loop l = loop_open(g, k->shape[0]);
    R.r = l.i;
    for (int i = 0; i < nin; i++) R.in[i] = row_operand(k->row, false, i) ? row_ptr(&R, inbase[i]) : inbase[i];
    for (int i = 0; i < nout; i++) R.out[i] = row_operand(k->row, true, i) ? row_ptr(&R, outbase[i]) : outbase[i];
    row_body(&R, inbase, outbase);
    loop_close(g, &l);
  }
  LLVMBuildRetVoid(g->b);
}

/* ---- module, target, passes --------------------------------------------------------------- */

typedef struct Compiled {
  LLVMContextRef ctx;
  LLVMModuleRef mod;
  LLVMTargetMachineRef tm;
} Compiled;

static void compiled_free(Compiled *c) {
  if (c->tm) LLVMDisposeTargetMachine(c->tm);
  if (c->mod) LLVMDisposeModule(c->mod);
  if (c->ctx) LLVMContextDispose(c->ctx);
}

/* A TargetMachine for the host CPU with its features; PIC so the object links into PIE. */
static bool host_machine(Compiled *c, char *err, size_t errlen) {
  static bool inited;
  if (!inited && (LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter()))
    return fail(err, errlen, "LLVM: cannot initialise the native target");
  inited = true;
  char *triple = LLVMGetDefaultTargetTriple(), *msg = NULL;
  LLVMTargetRef target;
  if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
    fail(err, errlen, "LLVM: no target for %s: %s", triple, msg ? msg : "?");
    LLVMDisposeMessage(msg);
    LLVMDisposeMessage(triple);
    return false;
  }
  char *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
  c->tm = LLVMCreateTargetMachine(target, triple, cpu, features, LLVMCodeGenLevelAggressive,
                                  LLVMRelocPIC, LLVMCodeModelDefault);
  LLVMSetTarget(c->mod, triple);
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(features);
  LLVMDisposeMessage(triple);
  if (!c->tm) return fail(err, errlen, "LLVM: cannot create a target machine for the host CPU");
  LLVMTargetDataRef dl = LLVMCreateTargetDataLayout(c->tm);
  LLVMSetModuleDataLayout(c->mod, dl);
  LLVMDisposeTargetData(dl);
  return true;
}

static bool optimize(Compiled *c, char *err, size_t errlen) {
  LLVMPassBuilderOptionsRef o = LLVMCreatePassBuilderOptions();
  LLVMPassBuilderOptionsSetLoopVectorization(o, 1);
  LLVMPassBuilderOptionsSetSLPVectorization(o, 1);
  LLVMPassBuilderOptionsSetLoopInterleaving(o, 1);
  LLVMPassBuilderOptionsSetLoopUnrolling(o, 1);
  LLVMErrorRef e = LLVMRunPasses(c->mod, "default<O3>", c->tm, o);
  LLVMDisposePassBuilderOptions(o);
  if (!e) return true;
  char *msg = LLVMGetErrorMessage(e);
  fail(err, errlen, "LLVM: optimization failed: %s", msg);
  LLVMDisposeErrorMessage(msg);
  return false;
}

/* Checks, builds, verifies and optimizes the n kernels into c (freed by the caller). */
static bool compile(Compiled *c, const CgKernel *ks, int n, char *err, size_t errlen) {
  for (int i = 0; i < n; i++)
    if (!cg_llvm_check(&ks[i], err, errlen)) return false;
  c->ctx = LLVMContextCreate();
  c->mod = LLVMModuleCreateWithNameInContext("cplan_kernels", c->ctx);
  if (!host_machine(c, err, errlen)) return false;
  Gen g = {.ctx = c->ctx, .mod = c->mod, .b = LLVMCreateBuilderInContext(c->ctx)};
  g.f32 = LLVMFloatTypeInContext(c->ctx);
  g.i32 = LLVMInt32TypeInContext(c->ctx);
  g.sf32 = g.f32;
  g.si32 = g.i32;
  g.lanes = 1;
  g.i64 = LLVMInt64TypeInContext(c->ctx);
  g.i1 = LLVMInt1TypeInContext(c->ctx);
  g.pf = LLVMPointerType(g.f32, 0);
  g.ppf = LLVMPointerType(g.pf, 0);
  bool ok = true;
  for (int i = 0; i < n && ok; i++) {
    if (LLVMGetNamedFunction(c->mod, ks[i].name))
      ok = fail(err, errlen, "two kernels are named %s", ks[i].name);
    else if (ks[i].row != CG_ROW_NONE)
      gen_row_kernel(&g, &ks[i]);
    else
      gen_kernel(&g, &ks[i]);
  }
  LLVMDisposeBuilder(g.b);
  if (!ok) return false;
  char *msg = NULL;
  if (LLVMVerifyModule(c->mod, LLVMReturnStatusAction, &msg)) {
    fail(err, errlen, "LLVM: the generated module does not verify (a bug in codegen/llvm.c): %s", msg);
    LLVMDisposeMessage(msg);
    return false;
  }
  LLVMDisposeMessage(msg);
  /* CPLAN_LLVM_RAW=FILE keeps the unoptimized IR, to replay the optimizer with opt-14 and its
   * -pass-remarks-missed=loop-vectorize when a loop does not vectorize */
  const char *raw = getenv("CPLAN_LLVM_RAW");
  if (raw && *raw) LLVMPrintModuleToFile(c->mod, raw, NULL);
  return optimize(c, err, errlen);
}

bool cg_llvm_object(const CgKernel *ks, int n, const char *obj_path, char *err, size_t errlen) {
  Compiled c = {0};
  bool ok = compile(&c, ks, n, err, errlen);
  char *msg = NULL;
  if (ok && LLVMTargetMachineEmitToFile(c.tm, c.mod, (char *)obj_path, LLVMObjectFile, &msg)) {
    ok = fail(err, errlen, "LLVM: cannot write %s: %s", obj_path, msg ? msg : "?");
    LLVMDisposeMessage(msg);
  }
  compiled_free(&c);
  return ok;
}

char *cg_llvm_ir(const CgKernel *ks, int n, char *err, size_t errlen) {
  Compiled c = {0};
  char *out = NULL;
  if (compile(&c, ks, n, err, errlen)) {
    char *text = LLVMPrintModuleToString(c.mod);
    out = strdup(text);
    LLVMDisposeMessage(text);
    if (!out) fail(err, errlen, "out of memory");
  }
  compiled_free(&c);
  return out;
}
