/* emit_cuda.c: the fused kernels of a plan as CUDA C (`cplanc emit --stage=cuda`, issue 6).
 *
 * The input is the CgKernel list that cg_emit_c leaves behind (cg_last_kernels), the same list
 * codegen/llvm.c turns into CPU code, read with the same meaning (llvm.h): an elementwise kernel
 * is a DAG over f32 values evaluated at every output element, inputs broadcast NumPy-style; a
 * row kernel is one op over the last axis of [rows, n]. Every shape is compiled in, so index
 * arithmetic divides by constants. The source is standalone (only NVRTC's built-ins), so it
 * compiles with `nvcc --ptx` and with NVRTC, which is how a GPU program would load it
 * (runtime/cuda_rt.c: rt_nvrtc_compile).
 *
 * Launch conventions, written above each kernel too:
 *  - elementwise: any grid of 1-D blocks (a grid-stride loop covers the output);
 *    NAME(float *out, const float *in0, ...), in the order of CgKernel.inputs;
 *  - row kernels: one block per row (a grid-stride loop over the rows), blockDim.x a multiple
 *    of 32 up to 1024; operands as llvm.h's table, one pointer each, NULL where it says so.
 *    The dw/db of a norm's backward sum over the rows: a second kernel NAME_dw gives each column
 *    to one thread, which adds the rows in order (as ref.c does), so no atomics are needed.
 * The math follows llvm.c: gelu is x * sigmoid(2u) (the tanh form without cancellation), pow
 * with a small integer exponent is a product, reductions are f32 except sum and mean (f64). */
#include "codegen.h"

#include "../compiler/build.h"
#include "../compiler/train.h"
#include "emit_cu.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static bool fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return false;
}

/* ---- the prelude: helpers every kernel may call --------------------------------------------- */

static const char prelude[] =
    "#define CP_INF __int_as_float(0x7f800000)\n"
    "\n"
    "/* gelu, tanh form, as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */\n"
    "__device__ __forceinline__ float cp_gelu(float x) {\n"
    "  float u = 0.7978845608028654f * (x + 0.044715f * (x * x * x));\n"
    "  return x / (1.0f + expf(-(u + u)));\n"
    "}\n"
    "\n"
    "/* block-wide sum / max (blockDim.x a multiple of 32); sh: 33 shared slots; all threads get it */\n"
    "__device__ __forceinline__ float cp_block_sum(float v, float *sh) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  __syncthreads();\n"
    "  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x < 32) {\n"
    "    float u = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : 0.0f;\n"
    "    for (int o = 16; o > 0; o >>= 1) u += __shfl_xor_sync(0xffffffffu, u, o);\n"
    "    if (threadIdx.x == 0) sh[32] = u;\n"
    "  }\n"
    "  __syncthreads();\n"
    "  return sh[32];\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ float cp_block_max(float v, float *sh) {\n"
    "  for (int o = 16; o > 0; o >>= 1) { float u = __shfl_xor_sync(0xffffffffu, v, o); v = u > v ? u : v; }\n"
    "  __syncthreads();\n"
    "  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x < 32) {\n"
    "    float u = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : -CP_INF;\n"
    "    for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(0xffffffffu, u, o); u = w > u ? w : u; }\n"
    "    if (threadIdx.x == 0) sh[32] = u;\n"
    "  }\n"
    "  __syncthreads();\n"
    "  return sh[32];\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ double cp_block_sum_f64(double v, double *sh) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  __syncthreads();\n"
    "  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x < 32) {\n"
    "    double u = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : 0.0;\n"
    "    for (int o = 16; o > 0; o >>= 1) u += __shfl_xor_sync(0xffffffffu, u, o);\n"
    "    if (threadIdx.x == 0) sh[32] = u;\n"
    "  }\n"
    "  __syncthreads();\n"
    "  return sh[32];\n"
    "}\n";

/* ---- elementwise kernels ---------------------------------------------------------------------- */

/* A float literal that reads back as v: %.9g with an f suffix (and a decimal point), or the bits
 * of an infinity or NaN. */
static const char *flit(char *buf, size_t len, float v) {
  if (isnan(v) || isinf(v)) {
    uint32_t u;
    memcpy(&u, &v, 4);
    snprintf(buf, len, "__int_as_float(0x%08x)", u);
    return buf;
  }
  snprintf(buf, len, "%.9g", (double)v);
  if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
  strcat(buf, "f");
  return buf;
}

/* The loop nest of llvm.c in its CUDA form: the output dims, size-1 dims dropped and adjacent
 * dims merged where every input steps through them as one; strides per input. */
typedef struct Nest {
  int depth;
  int64_t n[CG_MAX_RANK];
  int64_t (*istride)[CG_MAX_RANK]; /* [ninputs][depth] */
  int64_t total;
} Nest;

static void nest_build(const CgKernel *k, Nest *ne) {
  int rows = k->ninputs + 1;
  int64_t(*full)[CG_MAX_RANK] = calloc((size_t)rows, sizeof *full);
  int64_t(*st)[CG_MAX_RANK] = calloc((size_t)rows, sizeof *st);
  int64_t s = 1;
  for (int d = k->rank - 1; d >= 0; d--) {
    full[0][d] = s;
    s *= k->shape[d];
  }
  for (int i = 0; i < k->ninputs; i++) { /* as llvm.c input_strides */
    const CgInput *in = &k->inputs[i];
    int64_t is = 1;
    for (int d = k->rank - 1; d >= 0; d--) {
      int id = d - (k->rank - in->rank);
      if (id < 0 || in->shape[id] == 1) full[i + 1][d] = 0;
      else {
        full[i + 1][d] = is;
        is *= in->shape[id];
      }
    }
  }
  int depth = 0;
  for (int d = 0; d < k->rank; d++) {
    if (k->shape[d] == 1) continue;
    bool merge = depth > 0;
    for (int r = 0; r < rows && merge; r++) merge = st[r][depth - 1] == full[r][d] * k->shape[d];
    if (merge) {
      ne->n[depth - 1] *= k->shape[d];
      for (int r = 0; r < rows; r++) st[r][depth - 1] = full[r][d];
      continue;
    }
    ne->n[depth] = k->shape[d];
    for (int r = 0; r < rows; r++) st[r][depth] = full[r][d];
    depth++;
  }
  if (depth == 0) { /* a scalar output, or every dim 1 */
    ne->n[0] = 1;
    for (int r = 0; r < rows; r++) st[r][0] = 0;
    depth = 1;
  }
  ne->depth = depth;
  ne->total = s;
  ne->istride = calloc((size_t)(k->ninputs > 0 ? k->ninputs : 1), sizeof *ne->istride);
  for (int i = 0; i < k->ninputs; i++) memcpy(ne->istride[i], st[i + 1], sizeof st[0]);
  free(full);
  free(st);
}

/* true when input i walks the collapsed nest as the output does (its offset is i itself) */
static bool same_walk(const Nest *ne, int i) {
  int64_t s = 1;
  for (int d = ne->depth - 1; d >= 0; d--) {
    if (ne->n[d] != 1 && ne->istride[i][d] != s) return false;
    s *= ne->n[d];
  }
  return true;
}

static void emit_unary(FILE *f, int j, int op, int a, float c) {
  char lit[64];
  switch ((KUnary)op) {
  case K_NEG: fprintf(f, "    float v%d = -v%d;\n", j, a); return;
  case K_EXP: fprintf(f, "    float v%d = expf(v%d);\n", j, a); return;
  case K_LOG: fprintf(f, "    float v%d = logf(v%d);\n", j, a); return;
  case K_SQRT: fprintf(f, "    float v%d = sqrtf(v%d);\n", j, a); return;
  case K_RSQRT: fprintf(f, "    float v%d = 1.0f / sqrtf(v%d);\n", j, a); return;
  case K_TANH: fprintf(f, "    float v%d = tanhf(v%d);\n", j, a); return;
  case K_SIGMOID: fprintf(f, "    float v%d = 1.0f / (1.0f + expf(-v%d));\n", j, a); return;
  case K_RELU: fprintf(f, "    float v%d = v%d > 0.0f ? v%d : 0.0f;\n", j, a, a); return;
  case K_GELU: fprintf(f, "    float v%d = cp_gelu(v%d);\n", j, a); return;
  case K_SILU: fprintf(f, "    float v%d = v%d / (1.0f + expf(-v%d));\n", j, a, a); return;
  case K_SQUARE: fprintf(f, "    float v%d = v%d * v%d;\n", j, a, a); return;
  case K_ERF: fprintf(f, "    float v%d = erff(v%d);\n", j, a); return;
  case K_SIN: fprintf(f, "    float v%d = sinf(v%d);\n", j, a); return;
  case K_COS: fprintf(f, "    float v%d = cosf(v%d);\n", j, a); return;
  case K_POW:
    if (c == 0.5f) {
      fprintf(f, "    float v%d = sqrtf(v%d);\n", j, a);
    } else if (c == (float)(int)c && c >= -64 && c <= 64) { /* square-and-multiply, as llvm.c */
      int e = (int)(c < 0 ? -c : c);
      fprintf(f, "    float v%d;\n    { float r = 1.0f, sq = v%d;", j, a);
      for (; e; e >>= 1) {
        if (e & 1) fprintf(f, " r *= sq;");
        if (e > 1) fprintf(f, " sq *= sq;");
      }
      fprintf(f, " v%d = %s; }\n", j, c < 0 ? "1.0f / r" : "r");
    } else {
      fprintf(f, "    float v%d = powf(v%d, %s);\n", j, a, flit(lit, sizeof lit, c));
    }
    return;
  case K_ABS: fprintf(f, "    float v%d = fabsf(v%d);\n", j, a); return;
  /* as ref.c: a NaN stays NaN */
  case K_CLAMP_MIN:
  case K_CLAMP_MAX:
    flit(lit, sizeof lit, c);
    fprintf(f, "    float v%d = v%d %s %s ? %s : v%d;\n", j, a, op == K_CLAMP_MIN ? "<" : ">", lit, lit, a);
    return;
  case K_UNARY_COUNT: break;
  }
}

static void emit_binary(FILE *f, int j, int op, int a, int b) {
  static const char *const cmp[K_BINARY_COUNT] = {[K_EQ] = "==", [K_NE] = "!=", [K_LT] = "<",
                                                  [K_LE] = "<=", [K_GT] = ">",  [K_GE] = ">="};
  switch ((KBinary)op) {
  case K_ADD: fprintf(f, "    float v%d = v%d + v%d;\n", j, a, b); return;
  case K_SUB: fprintf(f, "    float v%d = v%d - v%d;\n", j, a, b); return;
  case K_MUL: fprintf(f, "    float v%d = v%d * v%d;\n", j, a, b); return;
  case K_DIV: fprintf(f, "    float v%d = v%d / v%d;\n", j, a, b); return;
  /* as ref.c: a > b ? a : b, so a NaN in a gives b */
  case K_MAXIMUM: fprintf(f, "    float v%d = v%d > v%d ? v%d : v%d;\n", j, a, b, a, b); return;
  case K_MINIMUM: fprintf(f, "    float v%d = v%d < v%d ? v%d : v%d;\n", j, a, b, a, b); return;
  case K_MOD: /* as ref.c's k_mod_f */
    fprintf(f, "    float v%d = fmodf(v%d, v%d);\n    if (v%d != 0.0f && (v%d < 0.0f) != (v%d < 0.0f)) v%d += v%d;\n", j, a, b, j,
            j, b, j, b);
    return;
  case K_FLOORDIV: fprintf(f, "    float v%d = floorf(v%d / v%d);\n", j, a, b); return;
  case K_EQ: case K_NE: case K_LT: case K_LE: case K_GT: case K_GE:
    fprintf(f, "    float v%d = v%d %s v%d ? 1.0f : 0.0f;\n", j, a, cmp[op], b);
    return;
  case K_BINARY_COUNT: break;
  }
}

static void shape_text(char *buf, size_t len, int rank, const int64_t *shape) {
  int n = snprintf(buf, len, "[");
  for (int d = 0; d < rank && n < (int)len; d++)
    n += snprintf(buf + n, len - (size_t)n, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (n < (int)len) snprintf(buf + n, len - (size_t)n, "]");
}

static void emit_elementwise(FILE *f, const CgKernel *k) {
  Nest ne = {0};
  nest_build(k, &ne);
  char sh[256];
  shape_text(sh, sizeof sh, k->rank, k->shape);
  fprintf(f, "/* %s: out %s, %d input%s; any grid of 1-D blocks */\n", k->name, sh, k->ninputs,
          k->ninputs == 1 ? "" : "s");
  fprintf(f, "extern \"C\" __global__ void %s(float *__restrict__ out", k->name);
  for (int i = 0; i < k->ninputs; i++) {
    shape_text(sh, sizeof sh, k->inputs[i].rank, k->inputs[i].shape);
    fprintf(f, ",\n    const float *__restrict__ in%d /* %s */", i, sh);
  }
  fprintf(f, ") {\n");
  fprintf(f, "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < %lldLL;\n"
             "       i += (long long)gridDim.x * blockDim.x) {\n", (long long)ne.total);
  /* the coordinates some broadcast input needs, from the innermost dim out to the lowest used */
  bool used[CG_MAX_RANK] = {false};
  int dmin = ne.depth;
  for (int j = 0; j < k->nnodes; j++) {
    const CgNode *n = &k->nodes[j];
    if (n->kind != CG_INPUT || same_walk(&ne, n->input)) continue;
    for (int d = 0; d < ne.depth; d++)
      if (ne.istride[n->input][d]) used[d] = true, dmin = d < dmin ? d : dmin;
  }
  if (dmin < ne.depth) {
    fprintf(f, "    long long r = i;\n");
    for (int d = ne.depth - 1; d > dmin; d--) {
      if (used[d]) fprintf(f, "    long long c%d = r %% %lldLL;\n", d, (long long)ne.n[d]);
      fprintf(f, "    r /= %lldLL;\n", (long long)ne.n[d]);
    }
    if (dmin == 0) fprintf(f, "    long long c0 = r;\n");
    else fprintf(f, "    long long c%d = r %% %lldLL;\n", dmin, (long long)ne.n[dmin]);
  }
  /* only the nodes the output depends on (the others would be dead code) */
  bool *live = calloc((size_t)k->nnodes, sizeof *live);
  live[k->nnodes - 1] = true;
  for (int j = k->nnodes - 1; j >= 0; j--) {
    const CgNode *n = &k->nodes[j];
    if (!live[j]) continue;
    if (n->kind == CG_UNARY) live[n->a] = true;
    if (n->kind == CG_BINARY) live[n->a] = live[n->b] = true;
    if (n->kind == CG_SELECT) live[n->a] = live[n->b] = live[n->c] = true;
  }
  char lit[64];
  for (int j = 0; j < k->nnodes; j++) {
    const CgNode *n = &k->nodes[j];
    if (!live[j]) continue;
    switch (n->kind) {
    case CG_INPUT:
      if (same_walk(&ne, n->input)) {
        fprintf(f, "    float v%d = in%d[i];\n", j, n->input);
      } else {
        fprintf(f, "    float v%d = in%d[", j, n->input);
        int terms = 0;
        for (int d = 0; d < ne.depth; d++) {
          int64_t st = ne.istride[n->input][d];
          if (st == 0) continue;
          fprintf(f, "%sc%d", terms++ ? " + " : "", d);
          if (st != 1) fprintf(f, " * %lldLL", (long long)st);
        }
        fprintf(f, "%s];\n", terms ? "" : "0");
      }
      break;
    case CG_CONST: fprintf(f, "    float v%d = %s;\n", j, flit(lit, sizeof lit, n->value)); break;
    case CG_UNARY: emit_unary(f, j, n->op, n->a, n->value); break;
    case CG_BINARY: emit_binary(f, j, n->op, n->a, n->b); break;
    case CG_SELECT: fprintf(f, "    float v%d = v%d != 0.0f ? v%d : v%d;\n", j, n->a, n->b, n->c); break;
    }
  }
  fprintf(f, "    out[i] = v%d;\n  }\n}\n\n", k->nnodes - 1);
  free(live);
  free(ne.istride);
}

/* ---- row kernels -------------------------------------------------------------------------------- */

/* for (j over the row): the loop header every pass uses */
#define ROW_LOOP(f, n) fprintf((f), "    for (int j = threadIdx.x; j < %lld; j += blockDim.x) ", (long long)(n))

static void row_head(FILE *f, const CgKernel *k, const char *params, const char *what) {
  fprintf(f, "/* %s: %s over the last axis of [%lld, %lld]; one block per row, blockDim.x a multiple of 32 */\n",
          k->name, what, (long long)k->shape[0], (long long)k->shape[1]);
  fprintf(f, "extern \"C\" __global__ void %s(%s) {\n", k->name, params);
  fprintf(f, "  __shared__ float sh[33];\n");
  fprintf(f, "  for (long long r = blockIdx.x; r < %lldLL; r += gridDim.x) {\n", (long long)k->shape[0]);
}

static void emit_row_softmax(FILE *f, const CgKernel *k, bool log) {
  int64_t n = k->shape[1];
  row_head(f, k, "float *__restrict__ y, const float *__restrict__ x", log ? "log_softmax" : "softmax");
  fprintf(f, "    const float *xr = x + r * %lldLL; float *yr = y + r * %lldLL;\n", (long long)n, (long long)n);
  fprintf(f, "    float m = -CP_INF;\n");
  ROW_LOOP(f, n), fprintf(f, "m = xr[j] > m ? xr[j] : m;\n");
  fprintf(f, "    m = cp_block_max(m, sh);\n    float s = 0.0f;\n");
  ROW_LOOP(f, n), fprintf(f, "s += expf(xr[j] - m);\n");
  fprintf(f, "    s = cp_block_sum(s, sh);\n");
  if (log) {
    fprintf(f, "    float ls = logf(s);\n");
    ROW_LOOP(f, n), fprintf(f, "yr[j] = (xr[j] - m) - ls;\n");
  } else {
    fprintf(f, "    float inv = 1.0f / s;\n");
    ROW_LOOP(f, n), fprintf(f, "yr[j] = expf(xr[j] - m) * inv;\n");
  }
  fprintf(f, "  }\n}\n\n");
}

static void emit_row_softmax_bwd(FILE *f, const CgKernel *k, bool log) {
  int64_t n = k->shape[1];
  row_head(f, k, "float *__restrict__ dx, const float *__restrict__ dy, const float *__restrict__ y",
           log ? "log_softmax backward (dx +=)" : "softmax backward (dx +=)");
  fprintf(f, "    long long o = r * %lldLL;\n    float s = 0.0f;\n", (long long)n);
  if (log) {
    ROW_LOOP(f, n), fprintf(f, "s += dy[o + j];\n");
    fprintf(f, "    s = cp_block_sum(s, sh);\n");
    ROW_LOOP(f, n), fprintf(f, "dx[o + j] += dy[o + j] - expf(y[o + j]) * s;\n");
  } else {
    ROW_LOOP(f, n), fprintf(f, "s += dy[o + j] * y[o + j];\n");
    fprintf(f, "    s = cp_block_sum(s, sh);\n");
    ROW_LOOP(f, n), fprintf(f, "dx[o + j] += y[o + j] * (dy[o + j] - s);\n");
  }
  fprintf(f, "  }\n}\n\n");
}

static void emit_row_norm(FILE *f, const CgKernel *k, bool rms) {
  int64_t n = k->shape[1];
  char eps[64];
  flit(eps, sizeof eps, k->eps);
  if (rms)
    row_head(f, k, "float *__restrict__ y, float *__restrict__ rstd, const float *__restrict__ x, "
                   "const float *__restrict__ w", "rms_norm (rstd may be NULL)");
  else
    row_head(f, k, "float *__restrict__ y, float *__restrict__ mean, float *__restrict__ rstd, "
                   "const float *__restrict__ x, const float *__restrict__ w, const float *__restrict__ b",
             "layer_norm (mean, rstd may be NULL)");
  fprintf(f, "    long long o = r * %lldLL;\n    float m = 0.0f, s = 0.0f;\n", (long long)n);
  if (!rms) {
    ROW_LOOP(f, n), fprintf(f, "s += x[o + j];\n");
    fprintf(f, "    m = cp_block_sum(s, sh) / %lld.0f;\n    s = 0.0f;\n", (long long)n);
  }
  ROW_LOOP(f, n), fprintf(f, "{ float d = x[o + j] - m; s += d * d; }\n");
  fprintf(f, "    float rs = 1.0f / sqrtf(cp_block_sum(s, sh) / %lld.0f + %s);\n", (long long)n, eps);
  if (rms) ROW_LOOP(f, n), fprintf(f, "y[o + j] = x[o + j] * rs * w[j];\n");
  else ROW_LOOP(f, n), fprintf(f, "y[o + j] = (x[o + j] - m) * rs * w[j] + b[j];\n");
  fprintf(f, "    if (threadIdx.x == 0) {\n");
  if (!rms) fprintf(f, "      if (mean) mean[r] = m;\n");
  fprintf(f, "      if (rstd) rstd[r] = rs;\n    }\n  }\n}\n\n");
}

static void emit_row_norm_bwd(FILE *f, const CgKernel *k, bool rms) {
  int64_t rows = k->shape[0], n = k->shape[1];
  const char *params = rms ? "float *__restrict__ dx, float *__restrict__ dw, const float *__restrict__ dy, "
                             "const float *__restrict__ x, const float *__restrict__ w, const float *__restrict__ rstd"
                           : "float *__restrict__ dx, float *__restrict__ dw, float *__restrict__ db, "
                             "const float *__restrict__ dy, const float *__restrict__ x, const float *__restrict__ w, "
                             "const float *__restrict__ mean, const float *__restrict__ rstd";
  row_head(f, k, params, rms ? "rms_norm backward, the dx part (dx +=, may be NULL; dw: the _dw kernel)"
                             : "layer_norm backward, the dx part (dx +=, may be NULL; dw, db: the _dw kernel)");
  fprintf(f, "    if (!dx) return;\n");
  fprintf(f, "    long long o = r * %lldLL;\n", (long long)n);
  fprintf(f, "    float m = %s, rs = rstd[r], sg = 0.0f, sgx = 0.0f;\n", rms ? "0.0f" : "mean[r]");
  ROW_LOOP(f, n), fprintf(f, "{ float g = w[j] * dy[o + j]; sg += g; sgx += g * (x[o + j] - m); }\n");
  if (rms) fprintf(f, "    float gm = 0.0f; (void)sg;\n");
  else fprintf(f, "    float gm = cp_block_sum(sg, sh) / %lld.0f;\n", (long long)n);
  fprintf(f, "    float gxm = cp_block_sum(sgx, sh) * rs / %lld.0f;\n", (long long)n);
  ROW_LOOP(f, n), fprintf(f, "dx[o + j] += rs * ((w[j] * dy[o + j] - gm) - (x[o + j] - m) * rs * gxm);\n");
  fprintf(f, "  }\n}\n\n");
  fprintf(f, "/* %s_dw: the %s part of %s; one thread per column (any 1-D grid), rows added in order */\n",
          k->name, rms ? "dw" : "dw, db", k->name);
  fprintf(f, "extern \"C\" __global__ void %s_dw(%s) {\n", k->name, params);
  fprintf(f, "  for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < %lldLL;"
             " j += (long long)gridDim.x * blockDim.x) {\n", (long long)n);
  fprintf(f, "    float aw = 0.0f, ab = 0.0f;\n");
  fprintf(f, "    for (long long r = 0; r < %lldLL; r++) {\n", (long long)rows);
  fprintf(f, "      float d = dy[r * %lldLL + j];\n", (long long)n);
  fprintf(f, "      aw += d * ((x[r * %lldLL + j] - %s) * rstd[r]);\n", (long long)n, rms ? "0.0f" : "mean[r]");
  fprintf(f, "      ab += d;\n    }\n");
  fprintf(f, "    if (dw) dw[j] += aw;\n");
  if (!rms) fprintf(f, "    if (db) db[j] += ab;\n");
  else fprintf(f, "    (void)ab;\n");
  fprintf(f, "  }\n}\n\n");
}

static void emit_row_sum(FILE *f, const CgKernel *k, bool mean) {
  int64_t n = k->shape[1];
  fprintf(f, "/* %s: %s over the last axis of [%lld, %lld] in f64; one block per row, blockDim.x a multiple of 32 */\n",
          k->name, mean ? "mean" : "sum", (long long)k->shape[0], (long long)n);
  fprintf(f, "extern \"C\" __global__ void %s(float *__restrict__ y, const float *__restrict__ x) {\n", k->name);
  fprintf(f, "  __shared__ double sh[33];\n");
  fprintf(f, "  for (long long r = blockIdx.x; r < %lldLL; r += gridDim.x) {\n", (long long)k->shape[0]);
  fprintf(f, "    long long o = r * %lldLL;\n    double s = 0.0;\n", (long long)n);
  ROW_LOOP(f, n), fprintf(f, "s += (double)x[o + j];\n");
  fprintf(f, "    s = cp_block_sum_f64(s, sh);\n");
  if (mean) fprintf(f, "    if (threadIdx.x == 0) y[r] = (float)s / %lld.0f;\n", (long long)n);
  else fprintf(f, "    if (threadIdx.x == 0) y[r] = (float)s;\n");
  fprintf(f, "  }\n}\n\n");
}

static void emit_row(FILE *f, const CgKernel *k) {
  switch (k->row) {
  case CG_ROW_SOFTMAX_FWD: emit_row_softmax(f, k, false); return;
  case CG_ROW_LOG_SOFTMAX_FWD: emit_row_softmax(f, k, true); return;
  case CG_ROW_SOFTMAX_BWD: emit_row_softmax_bwd(f, k, false); return;
  case CG_ROW_LOG_SOFTMAX_BWD: emit_row_softmax_bwd(f, k, true); return;
  case CG_ROW_LAYER_NORM_FWD: emit_row_norm(f, k, false); return;
  case CG_ROW_RMS_NORM_FWD: emit_row_norm(f, k, true); return;
  case CG_ROW_LAYER_NORM_BWD: emit_row_norm_bwd(f, k, false); return;
  case CG_ROW_RMS_NORM_BWD: emit_row_norm_bwd(f, k, true); return;
  case CG_ROW_SUM_FWD: emit_row_sum(f, k, false); return;
  case CG_ROW_MEAN_FWD: emit_row_sum(f, k, true); return;
  case CG_ROW_NONE: case CG_ROW__COUNT: break;
  }
}

/* ---- entry points ------------------------------------------------------------------------------- */

bool cg_emit_cuda(FILE *out, const CgKernel *ks, int n, const char *model, char *err, size_t errlen) {
  CpMap names = {0};
  for (int i = 0; i < n; i++) {
    if (!cg_llvm_check(&ks[i], err, errlen)) return false;
    if (cp_map_get(&names, ks[i].name) >= 0) return fail(err, errlen, "two kernels are named %s", ks[i].name);
    cp_map_put(&names, ks[i].name, i);
  }
  fprintf(out, "/* %d fused kernel%s of model %s: CUDA C generated by cplanc (emit --stage=cuda).\n"
               " * f32, every shape compiled in; compiles with nvcc --ptx and with NVRTC. */\n\n",
          n, n == 1 ? "" : "s", model ? model : "?");
  fputs(prelude, out);
  fputc('\n', out);
  for (int i = 0; i < n; i++) {
    if (ks[i].row == CG_ROW_NONE) emit_elementwise(out, &ks[i]);
    else emit_row(out, &ks[i]);
  }
  return true;
}

bool build_emit_cuda(FILE *out, Graph *g, const TrainConf *t) {
  if (train_cuda(t)) return cg_emit_cuda_program(out, true, g, t); /* the GPU program's kernels.cu */
  if (!train_graph(g, t)) return false;
  FILE *null = fopen("/dev/null", "w"); /* the kernels are those of plan.c: emit it, unread */
  bool ok = null && cg_emit_c(null, g, t, "emit");
  if (null) fclose(null);
  if (!ok) return false;
  const CgKernel *ks;
  int n = cg_last_kernels(&ks);
  char err[1024];
  if (!cg_emit_cuda(out, ks, n, g->model_name, err, sizeof err)) {
    diag_error(SPAN_NONE, "generating the CUDA kernels failed (internal error): %s", err);
    return false;
  }
  return true;
}
