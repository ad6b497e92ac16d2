/* test_ops.c: every op's shape rule (shapes, dtypes, canonical axes, and each error
 * case with its message), FLOP counts, name lookup, and ir_verify catching corrupted
 * graphs. Builds small graphs with ir_new/ir_add. Prints "N passed, N failed" and
 * exits non-zero on any failure. */
#include "ir.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
static Graph *g;
static char err[512];
static bool covered[OP__COUNT]; /* ops whose rule succeeded at least once */

static void check(bool ok, const char *what, int line) {
  if (ok) {
    passed++;
    return;
  }
  failed++;
  fprintf(stderr, "test_ops.c:%d: FAILED: %s\n", line, what);
}
#define CHECK(c) check((c), #c, __LINE__)

/* ---- builders ---------------------------------------------------------------------- */

/* An INPUT leaf of a dtype and shape: T(DT_F32, 2, 4, 8) is f32[4, 8]. */
static int T(DType dt, int rank, ...) {
  int i = ir_add(g, OP_INPUT, NULL, 0, SPAN_NONE);
  Node *n = &g->nodes[i];
  n->name = "x";
  n->ia[1] = -1;
  n->dtype = dt;
  n->shape.rank = rank;
  va_list ap;
  va_start(ap, rank);
  for (int k = 0; k < rank; k++) n->shape.d[k] = va_arg(ap, int);
  va_end(ap);
  VEC_PUSH(g->inputs, i);
  return i;
}

/* A CONST scalar, as sema makes one from a number literal. */
static int C(double v) {
  int i = ir_add(g, OP_CONST, NULL, 0, SPAN_NONE);
  g->nodes[i].fa[0] = v;
  g->nodes[i].dtype = DT_F32;
  return i;
}

/* An int literal next to an i32 tensor: sema makes it an i32 CONST. */
static int CI(int v) {
  int i = C(v);
  g->nodes[i].dtype = DT_I32;
  return i;
}

/* A node with up to three inputs (-1 ends the list). */
static int N(OpId op, int a, int b, int c) {
  int in[3] = {a, b, c}, nin = 0;
  while (nin < 3 && in[nin] >= 0) nin++;
  return ir_add(g, op, in, nin, SPAN_NONE);
}
#define N1(op, a) N(op, a, -1, -1)
#define N2(op, a, b) N(op, a, b, -1)

static Node *at(int i) { return &g->nodes[i]; }
static void set_dims(int i, int nd, const int64_t *d) {
  at(i)->ndims = nd;
  if (nd > 0) memcpy(at(i)->dims, d, sizeof(int64_t) * (size_t)nd);
}

/* The node's type as "f32[4, 8]". */
static const char *type_of(int i) { return cp_fmt("%s%s", dtype_name(at(i)->dtype), shape_str(&at(i)->shape)); }

/* Infers node i and expects success with this type. */
static void ok_(int i, const char *want, int line) {
  err[0] = 0;
  bool ok = ir_infer(g, i, err, sizeof err);
  if (ok) covered[at(i)->op] = true;
  check(ok, cp_fmt("%s should succeed (got error: %s)", ir_ops[at(i)->op].name, err), line);
  if (ok) check(strcmp(type_of(i), want) == 0, cp_fmt("%s gives %s, want %s", ir_ops[at(i)->op].name, type_of(i), want), line);
}
#define OK(i, want) ok_((i), (want), __LINE__)

/* Infers node i and expects a user error whose message contains `want`, is
 * prefixed by nothing odd and has no trailing period. */
static void err_(int i, const char *want, int line) {
  err[0] = 0;
  bool ok = ir_infer(g, i, err, sizeof err);
  check(!ok, cp_fmt("%s should fail with '%s'", ir_ops[at(i)->op].name, want), line);
  if (ok) return;
  size_t len = strlen(err);
  check(len > 0 && err[len - 1] != '.', cp_fmt("message '%s' is empty or ends with a period", err), line);
  check(strstr(err, want) != NULL, cp_fmt("message '%s' lacks '%s'", err, want), line);
}
#define ERR(i, want) err_((i), (want), __LINE__)

/* ---- shapes and dtypes ------------------------------------------------------------ */

static void test_shapes(void) {
  Shape a = {2, {4, 8}}, b = {1, {8}}, c = {1, {3}}, s = {0}, o;
  CHECK(strcmp(shape_str(&a), "[4, 8]") == 0);
  CHECK(strcmp(shape_str(&s), "[]") == 0);
  CHECK(shape_numel(&a) == 32 && shape_numel(&s) == 1);
  CHECK(shape_eq(&a, &a) && !shape_eq(&a, &b));
  CHECK(shape_broadcast(&a, &b, &o) && shape_eq(&o, &a));
  CHECK(!shape_broadcast(&a, &c, &o));
  Shape x = {3, {2, 1, 5}}, y = {2, {7, 1}}, xy = {3, {2, 7, 5}};
  CHECK(shape_broadcast(&x, &y, &o) && shape_eq(&o, &xy));
  DType t = DT_F32;
  CHECK(dtype_parse("bf16", &t) && t == DT_BF16);
  CHECK(dtype_parse("i32", &t) && t == DT_I32);
  CHECK(!dtype_parse("f64", &t));
  CHECK(dtype_size(DT_F32) == 4 && dtype_size(DT_BF16) == 2 && dtype_size(DT_F16) == 2 && dtype_size(DT_I32) == 4);
  CHECK(strcmp(dtype_name(DT_F16), "f16") == 0);
}

/* ---- leaves ------------------------------------------------------------------------- */

static void test_leaves(void) {
  OK(T(DT_F32, 2, 4, 8), "f32[4, 8]");
  OK(C(0.5), "f32[]");
  int p = ir_add(g, OP_PARAM, NULL, 0, SPAN_NONE);
  at(p)->shape = (Shape){1, {16}};
  at(p)->name = "w";
  OK(p, "f32[16]");
  ERR(T(DT_F32, 2, 4, 0), "dims must be positive");
  int c = C(1);
  at(c)->shape = (Shape){1, {2}};
  ERR(c, "must be a scalar");
  int r = N1(OP_ARANGE, -1);
  at(r)->ia[0] = 5;
  OK(r, "i32[5]");
  at(r)->ia[0] = 0;
  ERR(r, "arange: n must be >= 1, got 0");
}

/* ---- elementwise -------------------------------------------------------------------- */

static void test_binary(void) {
  static const OpId ops[] = {OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAXIMUM, OP_MINIMUM, OP_MOD, OP_FLOORDIV};
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    OpId op = ops[k];
    OK(N2(op, T(DT_F32, 2, 4, 8), T(DT_F32, 1, 8)), "f32[4, 8]");
    OK(N2(op, T(DT_F32, 2, 4, 1), T(DT_F32, 3, 2, 1, 5)), "f32[2, 4, 5]");
    ERR(N2(op, T(DT_F32, 2, 4, 8), T(DT_F32, 1, 3)), "shapes [4, 8] and [3] do not broadcast");
  }
  ERR(N2(OP_MAXIMUM, T(DT_F32, 2, 4, 8), T(DT_F32, 1, 3)), "maximum: shapes [4, 8] and [3]");
  ERR(N2(OP_ADD, T(DT_F32, 3, 2, 4, 8), T(DT_F32, 2, 5, 8)), "(4 vs 5 at dim -2)");
  /* dtypes: a scalar takes the tensor's dtype; i32 with a float gives the float;
   * mixed floats give f32 */
  OK(N2(OP_MUL, T(DT_BF16, 1, 4), C(0.5)), "bf16[4]");
  OK(N2(OP_MUL, C(0.5), T(DT_F16, 1, 4)), "f16[4]");
  OK(N2(OP_ADD, T(DT_I32, 1, 4), CI(1)), "i32[4]");
  OK(N2(OP_MOD, T(DT_I32, 1, 4), CI(3)), "i32[4]"); /* Python's % and // keep i32 */
  OK(N2(OP_FLOORDIV, T(DT_I32, 2, 2, 4), T(DT_I32, 1, 4)), "i32[2, 4]");
  OK(N2(OP_MOD, T(DT_F32, 1, 4), C(0.5)), "f32[4]");
  OK(N2(OP_MUL, T(DT_I32, 1, 4), C(0.5)), "f32[4]");
  OK(N2(OP_MUL, T(DT_I32, 1, 4), C(1.0)), "f32[4]"); /* a float scalar gives f32 whatever its value, as PyTorch */
  OK(N2(OP_ADD, T(DT_I32, 1, 4), T(DT_BF16, 1, 4)), "bf16[4]");
  OK(N2(OP_ADD, T(DT_BF16, 1, 4), T(DT_F16, 1, 4)), "f32[4]");
  OK(N2(OP_ADD, T(DT_F32, 1, 4), T(DT_BF16, 0)), "f32[4]");
  OK(N2(OP_ADD, T(DT_I32, 0), T(DT_I32, 0)), "i32[]");
  /* each side is fine, the broadcast result has 2^90 elements */
  ERR(N2(OP_ADD, T(DT_F32, 3, 1 << 30, 1, 1 << 30), T(DT_F32, 3, 1, 1 << 30, 1)), "too many elements");
}

static void test_compare(void) {
  static const OpId ops[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    OK(N2(ops[k], T(DT_I32, 2, 4, 8), T(DT_I32, 2, 4, 8)), "f32[4, 8]");
    OK(N2(ops[k], T(DT_BF16, 2, 4, 1), C(-1)), "f32[4, 1]");
    ERR(N2(ops[k], T(DT_I32, 1, 4), T(DT_I32, 1, 5)), "do not broadcast");
  }
}

static void test_unary(void) {
  static const OpId keep[] = {OP_NEG, OP_RELU, OP_SQUARE};
  static const OpId flt[] = {OP_EXP, OP_LOG, OP_SQRT, OP_RSQRT, OP_TANH, OP_SIGMOID, OP_GELU, OP_SILU, OP_POW, OP_ERF, OP_SIN, OP_COS};
  for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
    OK(N1(keep[k], T(DT_BF16, 2, 3, 5)), "bf16[3, 5]");
    OK(N1(keep[k], T(DT_I32, 1, 7)), "i32[7]");
  }
  for (size_t k = 0; k < sizeof flt / sizeof flt[0]; k++) {
    OK(N1(flt[k], T(DT_F16, 2, 3, 5)), "f16[3, 5]");
    OK(N1(flt[k], T(DT_I32, 1, 7)), "f32[7]");
  }
}

/* abs keeps the dtype (i32 too: sema writes it with i32 maximum/sub); clamp_min/clamp_max and the
 * clamp macro's check want a float tensor; where broadcasts three and types like a binary op */
static void test_abs_clamp_where(void) {
  OK(N1(OP_ABS, T(DT_BF16, 2, 3, 5)), "bf16[3, 5]");
  OK(N1(OP_ABS, T(DT_I32, 1, 7)), "i32[7]");
  CHECK(ir_node_flops(g, g->n - 1) == 7);
  static const OpId cl[] = {OP_CLAMP_MIN, OP_CLAMP_MAX, OP_CLAMP};
  for (size_t k = 0; k < sizeof cl / sizeof cl[0]; k++) {
    OK(N1(cl[k], T(DT_F16, 2, 3, 5)), "f16[3, 5]");
    OK(N1(cl[k], T(DT_F32, 0)), "f32[]");
    ERR(N1(cl[k], T(DT_I32, 1, 4)), cp_fmt("%s: clamps float tensors, got i32[4]", ir_ops[cl[k]].name));
  }
  int c = N1(OP_CLAMP_MIN, T(DT_F32, 2, 4, 8));
  OK(c, "f32[4, 8]");
  CHECK(ir_node_flops(g, c) == 32);

  int cond = T(DT_F32, 2, 4, 1);
  OK(N(OP_WHERE, cond, T(DT_F32, 1, 8), C(0.0)), "f32[4, 8]");
  CHECK(ir_node_flops(g, g->n - 1) == 32);
  OK(N(OP_WHERE, T(DT_F32, 1, 8), T(DT_F32, 3, 2, 1, 1), T(DT_F32, 2, 3, 1)), "f32[2, 3, 8]");
  OK(N(OP_WHERE, cond, T(DT_BF16, 1, 1), C(-1)), "bf16[4, 1]");        /* a number takes the tensor's dtype */
  OK(N(OP_WHERE, cond, T(DT_BF16, 1, 8), T(DT_F16, 1, 8)), "f32[4, 8]"); /* two floats: f32, as binary ops */
  OK(N(OP_WHERE, T(DT_F32, 0), C(1.0), C(2.0)), "f32[]");
  ERR(N(OP_WHERE, cond, T(DT_F32, 1, 8), T(DT_F32, 1, 3)), "where: shapes [8] and [3] do not broadcast");
  ERR(N(OP_WHERE, T(DT_F32, 1, 5), T(DT_F32, 1, 8), C(0.0)), "where: shapes [5] and [8] do not broadcast");
  ERR(N(OP_WHERE, T(DT_I32, 1, 8), T(DT_F32, 1, 8), C(0.0)), "where: cond must be a comparison (1.0 where true), got i32[8]");
  OK(N(OP_WHERE, cond, T(DT_I32, 1, 8), CI(0)), "i32[4, 8]"); /* two i32 branches: i32, as torch.where */
  ERR(N(OP_WHERE, cond, T(DT_I32, 1, 8), C(0.5)), "an i32 branch with a float one, got i32[8] and f32[]: convert it with float(x)");
  ERR(N2(OP_WHERE, cond, cond), "where: expected 3 inputs, got 2");
}

/* ---- reductions ----------------------------------------------------------------------- */

static void test_reduce(void) {
  /* min, logsumexp, var and std are macros sema expands, with max's rule for their arguments */
  static const OpId ops[] = {OP_SUM, OP_MEAN, OP_MAX, OP_MIN, OP_LOGSUMEXP, OP_VAR, OP_STD};
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    OpId op = ops[k];
    int x = T(DT_F32, 3, 2, 3, 4);
    int r = N1(op, x);
    at(r)->ndims = -1;
    OK(r, "f32[]");
    at(r)->ia[0] = 1;
    OK(r, "f32[1, 1, 1]");
    r = N1(op, x);
    set_dims(r, 1, (int64_t[]){-1});
    OK(r, "f32[2, 3]");
    CHECK(at(r)->dims[0] == 2);
    r = N1(op, x);
    set_dims(r, 2, (int64_t[]){-1, 0});
    at(r)->ia[0] = 1;
    OK(r, "f32[1, 3, 1]");
    CHECK(at(r)->dims[0] == 0 && at(r)->dims[1] == 2);
    r = N1(op, x);
    set_dims(r, 2, (int64_t[]){1, -2});
    ERR(r, "axis 1 is listed twice");
    r = N1(op, x);
    set_dims(r, 1, (int64_t[]){3});
    ERR(r, "axis 3 is out of range for shape [2, 3, 4]");
    r = N1(op, x);
    set_dims(r, 1, (int64_t[]){-4});
    ERR(r, "out of range");
    r = N1(op, x);
    at(r)->ndims = -1;
    at(r)->ia[0] = 2;
    ERR(r, "'keepdims' must be true or false");
  }
  int m = N1(OP_MEAN, T(DT_I32, 1, 4));
  at(m)->ndims = -1;
  OK(m, "f32[]");
  int s = N1(OP_SUM, T(DT_I32, 1, 4));
  at(s)->ndims = -1;
  OK(s, "i32[]");
  int z = N1(OP_SUM, T(DT_F32, 0));
  set_dims(z, 1, (int64_t[]){0});
  ERR(z, "invalid for a scalar");
}

/* ---- linear algebra ---------------------------------------------------------------------- */

static void test_matmul(void) {
  OK(N2(OP_MATMUL, T(DT_F32, 3, 4, 256, 384), T(DT_F32, 2, 384, 1152)), "f32[4, 256, 1152]");
  ERR(N2(OP_MATMUL, T(DT_F32, 3, 4, 256, 384), T(DT_F32, 2, 512, 1152)),
      "matmul: inner dimensions differ: [4, 256, 384] @ [512, 1152] (384 vs 512)");
  OK(N2(OP_MATMUL, T(DT_F32, 4, 2, 1, 3, 4), T(DT_F32, 3, 5, 4, 6)), "f32[2, 5, 3, 6]");
  ERR(N2(OP_MATMUL, T(DT_F32, 3, 4, 2, 3), T(DT_F32, 3, 3, 3, 5)), "batch dimensions [4] and [3] do not broadcast");
  OK(N2(OP_MATMUL, T(DT_F32, 1, 4), T(DT_F32, 2, 4, 5)), "f32[5]");
  OK(N2(OP_MATMUL, T(DT_F32, 2, 3, 4), T(DT_F32, 1, 4)), "f32[3]");
  OK(N2(OP_MATMUL, T(DT_F32, 1, 4), T(DT_F32, 1, 4)), "f32[]");
  OK(N2(OP_MATMUL, T(DT_BF16, 2, 3, 4), T(DT_F16, 2, 4, 2)), "f32[3, 2]");
  ERR(N2(OP_MATMUL, T(DT_F32, 1, 4), T(DT_F32, 1, 5)), "(4 vs 5)");
  ERR(N2(OP_MATMUL, T(DT_F32, 0), T(DT_F32, 2, 4, 5)), "at least 1 dim");
  ERR(N2(OP_MATMUL, T(DT_I32, 2, 3, 4), T(DT_F32, 2, 4, 5)), "must be float tensors");

  OK(N1(OP_TRANSPOSE, T(DT_F32, 3, 2, 3, 4)), "f32[2, 4, 3]");
  ERR(N1(OP_TRANSPOSE, T(DT_F32, 1, 4)), "transpose: needs at least 2 dims");

  int x = T(DT_F32, 3, 2, 3, 4);
  int p = N1(OP_PERMUTE, x);
  set_dims(p, 3, (int64_t[]){-1, 0, 1});
  OK(p, "f32[4, 2, 3]");
  CHECK(at(p)->dims[0] == 2);
  p = N1(OP_PERMUTE, x);
  set_dims(p, 3, (int64_t[]){0, 0, 1});
  ERR(p, "not a permutation");
  p = N1(OP_PERMUTE, x);
  set_dims(p, 2, (int64_t[]){1, 0});
  ERR(p, "must list each of the 3 dims");
  p = N1(OP_PERMUTE, x);
  set_dims(p, 3, (int64_t[]){0, 1, 3});
  ERR(p, "out of range");
}

/* ---- shape ops ---------------------------------------------------------------------------- */

static void test_reshape(void) {
  int x = T(DT_BF16, 2, 4, 6);
  int r = N1(OP_RESHAPE, x);
  set_dims(r, 2, (int64_t[]){3, -1});
  OK(r, "bf16[3, 8]");
  CHECK(at(r)->dims[1] == 8);
  r = N1(OP_RESHAPE, x);
  set_dims(r, 3, (int64_t[]){2, 2, 6});
  OK(r, "bf16[2, 2, 6]");
  r = N1(OP_RESHAPE, x);
  set_dims(r, 2, (int64_t[]){-1, -1});
  ERR(r, "only one dim may be -1");
  r = N1(OP_RESHAPE, x);
  set_dims(r, 2, (int64_t[]){5, 5});
  ERR(r, "cannot reshape [4, 6] (24 elements) into [5, 5] (25 elements)");
  r = N1(OP_RESHAPE, x);
  set_dims(r, 2, (int64_t[]){5, -1});
  ERR(r, "not a multiple of 5");
  r = N1(OP_RESHAPE, x);
  set_dims(r, 2, (int64_t[]){0, 24});
  ERR(r, "dims must be positive or -1");
  r = N1(OP_RESHAPE, T(DT_F32, 1, 1));
  set_dims(r, 0, NULL);
  OK(r, "f32[]");
}

static void test_split_concat_slice(void) {
  int x = T(DT_F32, 2, 4, 12);
  int s = N1(OP_SPLIT, x);
  at(s)->ia[0] = 3;
  at(s)->ia[1] = -1;
  OK(s, "f32[4, 4]");
  CHECK(at(s)->ia[1] == 1);
  s = N1(OP_SPLIT, x);
  at(s)->ia[0] = 5;
  at(s)->ia[1] = 1;
  ERR(s, "split: 5 parts do not divide dim 1 of [4, 12] (size 12)");
  s = N1(OP_SPLIT, x);
  at(s)->ia[0] = 0;
  at(s)->ia[1] = 1;
  ERR(s, "must be >= 1");
  s = N1(OP_SPLIT, x);
  at(s)->ia[0] = 2;
  at(s)->ia[1] = 2;
  ERR(s, "axis 2 is out of range");

  /* expand and repeat_interleave (macros: the rules check the call and give the shape) */
  int e = N1(OP_EXPAND, T(DT_I32, 2, 4, 1));
  set_dims(e, 3, (int64_t[]){2, -1, 6});
  OK(e, "i32[2, 4, 6]");
  CHECK(at(e)->dims[1] == 4);
  e = N1(OP_EXPAND, T(DT_F32, 2, 4, 1));
  set_dims(e, 2, (int64_t[]){8, 6});
  ERR(e, "expand: x [4, 1] cannot expand to [8, 6]: dim 0 is 4, only a dim of 1 can grow (to 8)");
  e = N1(OP_EXPAND, T(DT_F32, 1, 4));
  set_dims(e, 2, (int64_t[]){-1, 4});
  ERR(e, "a new leading dim cannot be -1");
  e = N1(OP_EXPAND, T(DT_F32, 2, 4, 1));
  set_dims(e, 1, (int64_t[]){4});
  ERR(e, "fewer dims than x");
  int ri = N1(OP_REPEAT_INTERLEAVE, T(DT_F32, 3, 2, 3, 5));
  at(ri)->ia[0] = 4;
  at(ri)->ia[1] = -2;
  OK(ri, "f32[2, 12, 5]");
  CHECK(at(ri)->ia[1] == 1);
  ri = N1(OP_REPEAT_INTERLEAVE, T(DT_F32, 1, 3));
  at(ri)->ia[0] = 0;
  ERR(ri, "repeats must be at least 1, got 0");

  /* unsqueeze, squeeze, flatten (macros: reshapes) */
  int u = N1(OP_UNSQUEEZE, T(DT_I32, 2, 4, 5));
  at(u)->ia[0] = -1;
  OK(u, "i32[4, 5, 1]");
  CHECK(at(u)->ia[0] == 2);
  u = N1(OP_UNSQUEEZE, T(DT_F32, 1, 4));
  at(u)->ia[0] = 2;
  ERR(u, "unsqueeze: axis 2 is out of range for shape [4] (valid axes: -2 to 1)");
  int q = N1(OP_SQUEEZE, T(DT_F32, 3, 4, 1, 5));
  at(q)->ia[0] = -2;
  OK(q, "f32[4, 5]");
  q = N1(OP_SQUEEZE, T(DT_F32, 2, 4, 5));
  at(q)->ia[0] = 0;
  ERR(q, "squeeze: dim 0 of [4, 5] is 4, not 1");
  int fl = N1(OP_FLATTEN, T(DT_F32, 4, 2, 3, 4, 5));
  at(fl)->ia[0] = 1;
  at(fl)->ia[1] = -2;
  OK(fl, "f32[2, 12, 5]");
  fl = N1(OP_FLATTEN, T(DT_F32, 2, 3, 4));
  at(fl)->ia[0] = 1;
  at(fl)->ia[1] = 0;
  ERR(fl, "flatten: start_axis 1 comes after end_axis 0");

  /* softplus, leaky_relu, elu, masked_fill, stack (macros) */
  OK(N1(OP_SOFTPLUS, T(DT_F32, 2, 4, 3)), "f32[4, 3]");
  OK(N1(OP_LEAKY_RELU, T(DT_F32, 1, 3)), "f32[3]");
  OK(N1(OP_ELU, T(DT_I32, 1, 3)), "f32[3]");
  OK(N2(OP_MASKED_FILL, T(DT_I32, 2, 4, 3), T(DT_F32, 2, 4, 1)), "i32[4, 3]");
  ERR(N2(OP_MASKED_FILL, T(DT_F32, 2, 4, 1), T(DT_F32, 2, 4, 3)), "masked_fill: the mask [4, 3] does not broadcast to x [4, 1]");
  int st = N2(OP_STACK, T(DT_F32, 2, 4, 3), T(DT_F32, 2, 4, 3));
  at(st)->ia[0] = -1;
  OK(st, "f32[4, 3, 2]");
  CHECK(at(st)->ia[0] == 2);
  st = N2(OP_STACK, T(DT_F32, 2, 4, 3), T(DT_F32, 2, 4, 2));
  ERR(st, "stack: tensor 1 has shape [4, 2], tensor 0 has [4, 3]: stack needs one shape");
  st = N1(OP_STACK, T(DT_F32, 1, 4));
  at(st)->ia[0] = 2;
  ERR(st, "stack: axis 2 is out of range for a result of 2 dims (valid axes: -2 to 1)");

  /* mse_loss, l1_loss, binary_cross_entropy_with_logits (macros): a float input, a target of its shape */
  OK(N2(OP_MSE_LOSS, T(DT_F32, 2, 4, 1), T(DT_F32, 2, 4, 1)), "f32[]");
  OK(N2(OP_L1_LOSS, T(DT_F32, 1, 3), T(DT_I32, 1, 3)), "f32[]");
  OK(N2(OP_BCE_WITH_LOGITS, T(DT_F32, 2, 2, 3), T(DT_F32, 2, 2, 3)), "f32[]");
  ERR(N2(OP_MSE_LOSS, T(DT_F32, 2, 4, 1), T(DT_F32, 1, 4)), "mse_loss: target [4] differs in shape from input [4, 1]");
  ERR(N2(OP_L1_LOSS, T(DT_I32, 1, 3), T(DT_F32, 1, 3)), "l1_loss: input must be a float tensor, got i32[3]");

  int c = N2(OP_CONCAT, T(DT_F32, 2, 2, 3), T(DT_F32, 2, 2, 5));
  at(c)->ia[0] = -1;
  OK(c, "f32[2, 8]");
  CHECK(at(c)->ia[0] == 1);
  c = N(OP_CONCAT, T(DT_F32, 2, 2, 3), T(DT_F32, 2, 4, 3), T(DT_F32, 2, 1, 3));
  OK(c, "f32[7, 3]");
  c = N1(OP_CONCAT, T(DT_F32, 1, 3));
  OK(c, "f32[3]");
  c = N2(OP_CONCAT, T(DT_F32, 2, 2, 3), T(DT_F32, 3, 1, 2, 5));
  at(c)->ia[0] = 1;
  ERR(c, "tensor 1 has shape [1, 2, 5], of rank 3");
  c = N2(OP_CONCAT, T(DT_F32, 2, 2, 3), T(DT_F32, 2, 4, 5));
  at(c)->ia[0] = 1;
  ERR(c, "differ in dim 0 (4 vs 2)");
  c = N2(OP_CONCAT, T(DT_F32, 2, 2, 3), T(DT_F32, 2, 2, 5));
  at(c)->ia[0] = 2;
  ERR(c, "out of range");
  int zero = ir_add(g, OP_CONCAT, NULL, 0, SPAN_NONE);
  ERR(zero, "expected at least 1 input");

  int v = T(DT_F32, 2, 4, 10);
  int sl = N1(OP_SLICE, v);
  at(sl)->ia[0] = -1, at(sl)->ia[1] = 2, at(sl)->ia[2] = 5;
  OK(sl, "f32[4, 3]");
  CHECK(at(sl)->ia[0] == 1);
  sl = N1(OP_SLICE, v);
  at(sl)->ia[0] = 1, at(sl)->ia[1] = 5, at(sl)->ia[2] = 5;
  ERR(sl, "range 5..5 is invalid for dim 1 of [4, 10]");
  sl = N1(OP_SLICE, v);
  at(sl)->ia[0] = 1, at(sl)->ia[1] = 0, at(sl)->ia[2] = 11;
  ERR(sl, "need 0 <= start < end <= 10");
  sl = N1(OP_SLICE, v);
  at(sl)->ia[0] = 0, at(sl)->ia[1] = -1, at(sl)->ia[2] = 2;
  ERR(sl, "invalid");
  sl = N1(OP_SLICE, v);
  at(sl)->ia[0] = 0, at(sl)->ia[1] = 0, at(sl)->ia[2] = 4;
  OK(sl, "f32[4, 10]");
  /* negative start and end count from the end, as Python's x[:, -3:-1], and are canonicalised */
  sl = N1(OP_SLICE, v);
  at(sl)->ia[0] = 1, at(sl)->ia[1] = -3, at(sl)->ia[2] = -1;
  OK(sl, "f32[4, 2]");
  CHECK(at(sl)->ia[1] == 7 && at(sl)->ia[2] == 9);
  OK(sl, "f32[4, 2]");
  sl = N1(OP_SLICE, v);
  at(sl)->ia[0] = 1, at(sl)->ia[1] = -11, at(sl)->ia[2] = 2;
  ERR(sl, "range -11..2 is invalid");
}

static void test_heads(void) {
  int x = T(DT_F32, 3, 2, 16, 384);
  int s = N1(OP_SPLIT_HEADS, x);
  at(s)->ia[0] = 6;
  OK(s, "f32[2, 6, 16, 64]");
  OK(N1(OP_MERGE_HEADS, s), "f32[2, 16, 384]");
  s = N1(OP_SPLIT_HEADS, x);
  at(s)->ia[0] = 5;
  ERR(s, "split_heads: 5 heads do not divide 384 channels");
  s = N1(OP_SPLIT_HEADS, x);
  at(s)->ia[0] = 0;
  ERR(s, "must be >= 1");
  s = N1(OP_SPLIT_HEADS, T(DT_F32, 2, 16, 384));
  at(s)->ia[0] = 2;
  ERR(s, "split_heads: expected [B, T, C], got [16, 384]");
  ERR(N1(OP_MERGE_HEADS, x), "merge_heads: expected [B, h, T, d], got [2, 16, 384]");
}

/* ---- indexing ------------------------------------------------------------------------------- */

static void test_embedding(void) {
  int tab = T(DT_F32, 2, 100, 32);
  OK(N2(OP_EMBEDDING, tab, T(DT_I32, 2, 4, 16)), "f32[4, 16, 32]");
  OK(N2(OP_EMBEDDING, T(DT_BF16, 2, 100, 32), T(DT_I32, 0)), "bf16[32]");
  ERR(N2(OP_EMBEDDING, tab, T(DT_F32, 2, 4, 16)), "embedding: indices must be i32, got f32[4, 16]");
  ERR(N2(OP_EMBEDDING, T(DT_F32, 1, 100), T(DT_I32, 1, 4)), "embedding: table must be [V, C], got [100]");
  ERR(N2(OP_EMBEDDING, T(DT_I32, 2, 100, 4), T(DT_I32, 1, 4)), "table must be a float tensor");
  ERR(N2(OP_EMBEDDING, tab, T(DT_I32, 8, 1, 1, 1, 1, 1, 1, 1, 2)), "too many dims");
}

/* ---- nn --------------------------------------------------------------------------------------- */

static void test_softmax(void) {
  static const OpId ops[] = {OP_SOFTMAX, OP_LOG_SOFTMAX};
  for (int k = 0; k < 2; k++) {
    int s = N1(ops[k], T(DT_BF16, 2, 4, 8));
    at(s)->ia[0] = -1;
    OK(s, "bf16[4, 8]");
    CHECK(at(s)->ia[0] == 1);
    s = N1(ops[k], T(DT_I32, 1, 8)); /* the kernels read floats: float(x) first, as PyTorch refuses it */
    ERR(s, "x must be a float tensor, got i32[8]: convert it with float(x)");
    s = N1(ops[k], T(DT_F32, 2, 4, 8));
    at(s)->ia[0] = 2;
    ERR(s, "axis 2 is out of range for shape [4, 8] (valid axes: -2 to 1)");
  }
}

static void test_norms(void) {
  int x = T(DT_F32, 3, 4, 16, 384), w = T(DT_F32, 1, 384), b = T(DT_F32, 1, 384);
  int ln = N(OP_LAYER_NORM, x, w, b);
  at(ln)->fa[0] = 1e-5;
  OK(ln, "f32[4, 16, 384]");
  ln = N(OP_LAYER_NORM, x, T(DT_F32, 1, 512), b);
  ERR(ln, "layer_norm: weight has shape [512], expected [384] (the last dim of x)");
  ln = N(OP_LAYER_NORM, x, w, T(DT_F32, 2, 1, 384));
  ERR(ln, "layer_norm: bias has shape [1, 384], expected [384]");
  ln = N(OP_LAYER_NORM, x, w, b);
  at(ln)->fa[0] = -1;
  ERR(ln, "eps must be");
  ERR(N(OP_LAYER_NORM, T(DT_F32, 0), w, b), "at least 1 dim");

  int rn = N2(OP_RMS_NORM, x, w);
  at(rn)->fa[0] = 1e-6;
  OK(rn, "f32[4, 16, 384]");
  ERR(N2(OP_RMS_NORM, x, T(DT_F32, 1, 383)), "rms_norm: weight has shape [383], expected [384]");
}

static void test_rope_dropout(void) {
  int r = N1(OP_ROPE, T(DT_F32, 4, 2, 4, 16, 64));
  at(r)->fa[0] = 10000;
  OK(r, "f32[2, 4, 16, 64]");
  r = N1(OP_ROPE, T(DT_F32, 3, 2, 16, 63));
  at(r)->fa[0] = 10000;
  ERR(r, "rope: the last dim must be even");
  r = N1(OP_ROPE, T(DT_F32, 1, 64));
  at(r)->fa[0] = 10000;
  ERR(r, "at least 2 dims");
  r = N1(OP_ROPE, T(DT_F32, 2, 16, 64));
  at(r)->fa[0] = 0;
  ERR(r, "base must be");

  int d = N1(OP_DROPOUT, T(DT_F32, 2, 4, 8));
  at(d)->fa[0] = 0.1;
  OK(d, "f32[4, 8]");
  at(d)->fa[0] = 1;
  ERR(d, "dropout: p must be in [0, 1), got 1");
  d = N1(OP_DROPOUT, T(DT_I32, 2, 4, 8));
  at(d)->fa[0] = 0.1;
  ERR(d, "dropout: x must be a float tensor, got i32[4, 8]");
  at(d)->fa[0] = -0.1;
  ERR(d, "dropout: p must be in [0, 1)");
}

static void test_sdpa(void) {
  int q = T(DT_F32, 4, 2, 4, 16, 64), k = T(DT_F32, 4, 2, 4, 32, 64), v = T(DT_F32, 4, 2, 4, 32, 48);
  int s = N(OP_SDPA, q, k, v);
  at(s)->ia[0] = 1;
  OK(s, "f32[2, 4, 16, 48]");
  ERR(N(OP_SDPA, q, T(DT_F32, 4, 2, 4, 32, 32), v), "q [2, 4, 16, 64] and k [2, 4, 32, 32] must agree in B and d");
  /* grouped-query: k and v with 2 (or 1) heads serve q's 4; 3 does not divide 4 */
  OK(N(OP_SDPA, q, T(DT_F32, 4, 2, 2, 32, 64), T(DT_F32, 4, 2, 2, 32, 48)), "f32[2, 4, 16, 48]");
  OK(N(OP_SDPA, q, T(DT_F32, 4, 2, 1, 32, 64), T(DT_F32, 4, 2, 1, 32, 48)), "f32[2, 4, 16, 48]");
  ERR(N(OP_SDPA, q, T(DT_F32, 4, 2, 3, 32, 64), T(DT_F32, 4, 2, 3, 32, 48)), "k's heads divide q's");
  ERR(N(OP_SDPA, q, T(DT_F32, 4, 2, 2, 32, 64), v), "must agree in B, h and T");
  ERR(N(OP_SDPA, q, k, T(DT_F32, 4, 2, 4, 31, 48)), "must agree in B, h and T");
  ERR(N(OP_SDPA, q, k, T(DT_F32, 4, 2, 3, 32, 48)), "must agree in B, h and T");
  ERR(N(OP_SDPA, T(DT_F32, 3, 2, 16, 64), k, v), "sdpa: q must be [B, h, T, d], got [2, 16, 64]");
  s = N(OP_SDPA, q, k, v);
  at(s)->ia[0] = 2;
  ERR(s, "'causal' must be true or false");
  /* the key mask, a 4th input sema adds: [B, Tk], float */
  int v64 = T(DT_F32, 4, 2, 4, 32, 64), in4[4] = {q, k, v64, T(DT_F32, 2, 2, 32)};
  OK(ir_add(g, OP_SDPA, in4, 4, SPAN_NONE), "f32[2, 4, 16, 64]");
  in4[3] = T(DT_F32, 2, 2, 16);
  ERR(ir_add(g, OP_SDPA, in4, 4, SPAN_NONE), "sdpa: the key mask must be [B, Tk] = [2, 32], got [2, 16]");
  in4[3] = T(DT_I32, 2, 2, 32);
  ERR(ir_add(g, OP_SDPA, in4, 4, SPAN_NONE), "key mask must be a float tensor");
  int in5[5] = {q, k, v64, in4[3], in4[3]};
  ERR(ir_add(g, OP_SDPA, in5, 5, SPAN_NONE), "sdpa: expected 3 inputs, got 5");
}

/* ---- loss and no-gradient ops ------------------------------------------------------------------ */

static void test_loss(void) {
  int lg = T(DT_F32, 3, 4, 16, 100);
  OK(N2(OP_CROSS_ENTROPY, lg, T(DT_I32, 2, 4, 16)), "f32[]");
  OK(N2(OP_CROSS_ENTROPY, T(DT_BF16, 1, 100), T(DT_I32, 0)), "f32[]");
  ERR(N2(OP_CROSS_ENTROPY, lg, T(DT_F32, 2, 4, 16)), "cross_entropy: targets must be i32");
  ERR(N2(OP_CROSS_ENTROPY, lg, T(DT_I32, 2, 4, 100)),
      "cross_entropy: targets have shape [4, 100], expected [4, 16] (the logits' shape [4, 16, 100] without the last dim)");
  ERR(N2(OP_CROSS_ENTROPY, T(DT_F32, 0), T(DT_I32, 0)), "got a scalar");
  ERR(N2(OP_CROSS_ENTROPY, T(DT_I32, 2, 4, 16), T(DT_I32, 1, 4)), "cross_entropy: logits must be a float tensor, got i32[4, 16]");

  int a = N1(OP_ARGMAX, lg);
  at(a)->ia[0] = -1;
  OK(a, "i32[4, 16]");
  CHECK(at(a)->ia[0] == 2);
  a = N1(OP_ARGMAX, lg);
  at(a)->ia[0] = 0;
  OK(a, "i32[16, 100]");
  a = N1(OP_ARGMAX, lg);
  at(a)->ia[0] = 3;
  ERR(a, "argmax: axis 3 is out of range");
  a = N1(OP_ARGMIN, lg); /* a macro (argmax of -x) with argmax's rule */
  at(a)->ia[0] = -1;
  OK(a, "i32[4, 16]");

  /* float: i32 -> f32, same shape (sema returns an f32 argument itself, so the rule refuses it) */
  OK(N1(OP_FLOAT, T(DT_I32, 2, 4, 16)), "f32[4, 16]");
  OK(N1(OP_FLOAT, T(DT_I32, 0)), "f32[]");
  CHECK(ir_node_flops(g, g->n - 1) == 1);
  ERR(N1(OP_FLOAT, T(DT_BF16, 1, 4)), "float: converts i32 tensors to f32 (an f32 one is returned as it is), got bf16[4]");
  ERR(N1(OP_FLOAT, lg), "got f32[4, 16, 100]");
}

static void test_arity(void) {
  ERR(N1(OP_ADD, T(DT_F32, 1, 4)), "add: expected 2 inputs, got 1");
  ERR(N2(OP_GELU, T(DT_F32, 1, 4), T(DT_F32, 1, 4)), "gelu: expected 1 input, got 2");
}

/* ---- FLOPs and bytes ------------------------------------------------------------------------------ */

static void test_flops(void) {
  int m = N2(OP_MATMUL, T(DT_F32, 3, 4, 256, 384), T(DT_F32, 2, 384, 1152));
  OK(m, "f32[4, 256, 1152]");
  CHECK(ir_node_flops(g, m) == 2.0 * 4 * 256 * 1152 * 384);
  int mv = N2(OP_MATMUL, T(DT_F32, 2, 3, 4), T(DT_F32, 1, 4));
  OK(mv, "f32[3]");
  CHECK(ir_node_flops(g, mv) == 2.0 * 3 * 4);
  int q = T(DT_F32, 4, 2, 4, 16, 64), k = T(DT_F32, 4, 2, 4, 32, 64);
  int s = N(OP_SDPA, q, k, k);
  at(s)->ia[0] = 1;
  OK(s, "f32[2, 4, 16, 64]");
  double scores = 2.0 * 4 * 16 * 32;
  CHECK(ir_node_flops(g, s) == 4 * scores * 64 + 5 * scores);
  int x = T(DT_F32, 2, 4, 8);
  int ge = N1(OP_GELU, x), ad = N2(OP_ADD, x, x), sg = N1(OP_SIGMOID, x), sm = N1(OP_SOFTMAX, x), su = N1(OP_SUM, x);
  at(su)->ndims = -1;
  OK(ge, "f32[4, 8]");
  OK(ad, "f32[4, 8]");
  OK(sg, "f32[4, 8]");
  OK(sm, "f32[4, 8]");
  OK(su, "f32[]");
  CHECK(ir_node_flops(g, ge) == 8 * 32 && ir_node_flops(g, ad) == 32 && ir_node_flops(g, sg) == 4 * 32);
  CHECK(ir_node_flops(g, sm) == 5 * 32 && ir_node_flops(g, su) == 32);
  CHECK(ir_node_flops(g, x) == 0);
  int ce = N2(OP_CROSS_ENTROPY, x, T(DT_I32, 1, 4));
  OK(ce, "f32[]");
  CHECK(ir_node_flops(g, ce) == 5 * 32);
  CHECK(ir_node_bytes(g, x) == 32 * 4);
  CHECK(ir_node_bytes(g, T(DT_BF16, 2, 4, 8)) == 64);
}

/* ---- lookups ------------------------------------------------------------------------------------- */

static void test_names(void) {
  OpId id = OP__COUNT;
  CHECK(ir_op_by_name("gelu", &id) == &ir_ops[OP_GELU] && id == OP_GELU);
  CHECK(ir_op_by_name("split", &id) != NULL && id == OP_SPLIT);
  CHECK(ir_op_by_name("matmul", &id) == NULL); /* only through @ */
  CHECK(ir_op_by_name("add", NULL) == NULL);
  CHECK(ir_op_by_name("param", NULL) == NULL);
  CHECK(ir_op_by_name("maximum", NULL) != NULL);
  CHECK(ir_op_by_name("float", &id) == &ir_ops[OP_FLOAT] && id == OP_FLOAT);
  CHECK(ir_op_by_name("abs", &id) == &ir_ops[OP_ABS] && id == OP_ABS);
  CHECK(ir_op_by_name("clamp", &id) == &ir_ops[OP_CLAMP] && id == OP_CLAMP);
  CHECK(ir_op_by_name("clamp_min", &id) == &ir_ops[OP_CLAMP_MIN] && id == OP_CLAMP_MIN);
  CHECK(ir_op_by_name("where", &id) == &ir_ops[OP_WHERE] && id == OP_WHERE);
  CHECK(ir_op_by_name("gelu2", NULL) == NULL);
  int n = 0;
  const char *const *names = ir_op_names(&n);
  bool has_gelu = false, has_add = false;
  for (int i = 0; i < n; i++) {
    has_gelu |= strcmp(names[i], "gelu") == 0;
    has_add |= strcmp(names[i], "add") == 0;
  }
  CHECK(n > 20 && has_gelu && !has_add);
}

/* ---- the verifier and the printer -------------------------------------------------------------------- */

/* A tiny model: logits = x @ w; loss = cross_entropy(logits, y). */
static Graph *tiny(void) {
  Graph *t = ir_new("tiny");
  Graph *save = g;
  g = t;
  int x = T(DT_F32, 2, 4, 8), y = T(DT_I32, 1, 4);
  at(x)->name = "x", at(y)->name = "y";
  VEC_PUSH(t->layer_names, "h.0");
  t->cur_layer = 0;
  int w = ir_add(t, OP_PARAM, NULL, 0, SPAN_NONE);
  at(w)->name = "h.0.w", at(w)->shape = (Shape){2, {8, 10}}, at(w)->ia[0] = INIT_NORMAL, at(w)->fa[0] = 0.02;
  VEC_PUSH(t->params, w);
  int m = N2(OP_MATMUL, x, w);
  OK(m, "f32[4, 10]");
  int sm = N1(OP_SOFTMAX, m);
  at(sm)->ia[0] = -1;
  OK(sm, "f32[4, 10]");
  t->cur_layer = -1;
  int ce = N2(OP_CROSS_ENTROPY, m, y);
  OK(ce, "f32[]");
  t->loss = ce;
  Metric mt = {"acc", ce, SPAN_NONE};
  VEC_PUSH(t->metrics, mt);
  g = save;
  return t;
}

static bool verifies(Graph *t) {
  err[0] = 0;
  return ir_verify(t, err, sizeof err);
}

static void test_verify(void) {
  Graph *t = tiny();
  CHECK(t->nodes[0].layer == -1 && t->nodes[3].layer == 0 && t->nodes[3].role == ROLE_FWD);
  CHECK(verifies(t));
  CHECK(t->nodes[3].in != NULL && t->nodes[3].in[1] == 2);

  /* each corruption must be caught, then undone */
  t->nodes[3].shape.d[1] = 11;
  CHECK(!verifies(t) && strstr(err, "rule gives") != NULL);
  t->nodes[3].shape.d[1] = 10;
  t->nodes[3].dtype = DT_BF16;
  CHECK(!verifies(t));
  t->nodes[3].dtype = DT_F32;
  t->nodes[3].in[0] = 4;
  CHECK(!verifies(t) && strstr(err, "not an earlier node") != NULL);
  t->nodes[3].in[0] = 0;
  t->nodes[4].ia[0] = -1; /* not canonical */
  CHECK(!verifies(t) && strstr(err, "canonical") != NULL);
  t->nodes[4].ia[0] = 1;
  t->loss = 3;
  CHECK(!verifies(t) && strstr(err, "not a scalar") != NULL);
  t->loss = 99;
  CHECK(!verifies(t));
  t->loss = 5;
  t->metrics.a[0].node = 4;
  CHECK(!verifies(t) && strstr(err, "metric 'acc'") != NULL);
  t->metrics.a[0].node = 5;
  t->params.a[0] = 0;
  CHECK(!verifies(t) && strstr(err, "not a param") != NULL);
  t->params.a[0] = 2;
  t->nodes[4].op = OP_SPLIT;
  CHECK(!verifies(t) && strstr(err, "macro") != NULL);
  t->nodes[4].op = OP_SOFTMAX;
  t->nodes[4].layer = 7;
  CHECK(!verifies(t) && strstr(err, "layer") != NULL);
  t->nodes[4].layer = 0;
  t->nodes[1].dtype = (DType)9;
  CHECK(!verifies(t) && strstr(err, "dtype") != NULL);
  t->nodes[1].dtype = DT_I32;
  t->nodes[2].shape.d[0] = 0;
  CHECK(!verifies(t));
  t->nodes[2].shape.d[0] = 8;
  t->nodes[4].nin = 2;
  CHECK(!verifies(t));
  t->nodes[4].nin = 1;
  t->nodes[0].ia[1] = 2; /* batch dim of a rank-2 input */
  CHECK(!verifies(t) && strstr(err, "batch dim") != NULL);
  t->nodes[0].ia[1] = 0;
  CHECK(verifies(t));
}

static void test_print(void) {
  Graph *t = tiny();
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ir_print(f, t);
  fclose(f);
  CHECK(strstr(buf, "%3 = matmul %0, %2 : f32[4, 10]") != NULL);
  CHECK(strstr(buf, "%2 = param \"h.0.w\" normal(0.02) : f32[8, 10]") != NULL);
  CHECK(strstr(buf, "%4 = softmax %3, axis=1 : f32[4, 10]") != NULL);
  CHECK(strstr(buf, "; layer h.0") != NULL);
  CHECK(strstr(buf, "; loss = %5") != NULL);
  CHECK(strstr(buf, "; metric acc = %5") != NULL);
  if (failed) fputs(buf, stderr);
  free(buf);
}

/* The internal ops of training graphs: state, scalar_in, grad, assign, accum. */
static void test_internal(void) {
  int p = ir_add(g, OP_PARAM, NULL, 0, SPAN_NONE);
  at(p)->shape = (Shape){2, {8, 3}};
  at(p)->name = "w";
  OK(p, "f32[8, 3]");
  int st = ir_add(g, OP_STATE, NULL, 0, SPAN_NONE);
  at(st)->shape = (Shape){2, {8, 3}};
  at(st)->name = "w.exp_avg";
  OK(st, "f32[8, 3]");
  int lr = ir_add(g, OP_SCALAR_IN, NULL, 0, SPAN_NONE);
  at(lr)->name = "lr";
  OK(lr, "f32[]");
  /* y = x @ w; the gradient of w (input 1) has w's type */
  int x = T(DT_F32, 2, 4, 8), y = N2(OP_MATMUL, x, p);
  OK(y, "f32[4, 3]");
  int dy = T(DT_F32, 2, 4, 3);
  int gin[4] = {dy, x, p, y};
  int gw = ir_add(g, OP_GRAD, gin, 4, SPAN_NONE);
  at(gw)->fwd = y;
  at(gw)->ia[0] = 1;
  OK(gw, "f32[8, 3]");
  at(gw)->ia[0] = 0;
  OK(gw, "f32[4, 8]");
  at(gw)->ia[0] = 2;
  ERR(gw, "input index 2 out of range");
  at(gw)->ia[0] = 1;
  at(gw)->in[0] = x;
  ERR(gw, "does not match the forward output");
  at(gw)->in[0] = dy;
  at(gw)->in[3] = x;
  ERR(gw, "the last input must be the forward node");
  at(gw)->in[3] = y;
  OK(gw, "f32[8, 3]");
  int idx = T(DT_I32, 1, 4), e = N2(OP_EMBEDDING, p, idx);
  OK(e, "f32[4, 3]");
  int gin2[4] = {dy, p, idx, e};
  int gi = ir_add(g, OP_GRAD, gin2, 4, SPAN_NONE);
  at(gi)->fwd = e;
  at(gi)->ia[0] = 1;
  ERR(gi, "is an integer tensor");
  at(gi)->ia[0] = 0;
  OK(gi, "f32[8, 3]");
  OK(N2(OP_ASSIGN, st, gw), "f32[8, 3]");
  OK(N2(OP_ACCUM, p, gw), "f32[8, 3]");
  ERR(N2(OP_ASSIGN, st, dy), "does not match the destination");
  ERR(N2(OP_ASSIGN, x, x), "the destination must be a param or state");
}

/* The collectives of per-rank graphs (lower.c): ia[0] axis, ia[1..2] dims, ia[3] devices. */
static int coll(OpId op, int x, int64_t d1, int64_t d2, int64_t n) {
  int i = N1(op, x);
  at(i)->ia[1] = d1, at(i)->ia[2] = d2, at(i)->ia[3] = n;
  return i;
}

static void test_collectives(void) {
  int x = T(DT_F32, 2, 4, 6);
  OK(coll(OP_ALL_REDUCE, x, 0, 0, 2), "f32[4, 6]");
  OK(coll(OP_ALL_GATHER, x, 1, 0, 2), "f32[4, 12]");
  OK(coll(OP_REDUCE_SCATTER, x, 0, 0, 2), "f32[2, 6]");
  OK(coll(OP_ALL_TO_ALL, x, 0, 1, 2), "f32[8, 3]");
  OK(coll(OP_SHARD_SLICE, x, 1, 0, 3), "f32[4, 2]");
  ERR(coll(OP_SHARD_SLICE, x, 1, 0, 4), "4 devices do not divide dim 1");
  ERR(coll(OP_ALL_GATHER, x, 2, 0, 2), "dim out of range");
  ERR(coll(OP_ALL_REDUCE, x, 0, 0, 0), "0 devices on the axis");
  for (int i = g->n - 8; i < g->n; i++) check(ir_node_flops(g, i) == 0, "collectives count no FLOPs", __LINE__);
}

/* Pipeline crossings (pipeline.c): ia[0] the peer stage, ia[1] the tag; pp_recv's shape from dims
 * and its dtype from ia[2]; pp_send yields a rank-0 token. */
static void test_pipeline(void) {
  int x = T(DT_F32, 2, 4, 6);
  int s = N1(OP_PP_SEND, x);
  at(s)->ia[0] = 1;
  OK(s, "f32[]");
  int r = ir_add(g, OP_PP_RECV, NULL, 0, SPAN_NONE);
  at(r)->ia[0] = 0, at(r)->ia[2] = DT_I32, at(r)->ndims = 2, at(r)->dims[0] = 3, at(r)->dims[1] = 5;
  OK(r, "i32[3, 5]");
  int bad = ir_add(g, OP_PP_RECV, NULL, 0, SPAN_NONE);
  at(bad)->ia[0] = -1;
  ERR(bad, "bad peer stage -1");
}

/* The checklist in ops.def: every op has a case here. */
static void test_coverage(void) {
  for (int op = 0; op < OP__COUNT; op++)
    check(covered[op], cp_fmt("no passing shape-rule case for op '%s'", ir_ops[op].name), __LINE__);
}

int main(void) {
  g = ir_new("test");
  test_shapes();
  test_leaves();
  test_binary();
  test_compare();
  test_unary();
  test_abs_clamp_where();
  test_reduce();
  test_matmul();
  test_reshape();
  test_split_concat_slice();
  test_heads();
  test_embedding();
  test_softmax();
  test_norms();
  test_rope_dropout();
  test_sdpa();
  test_loss();
  test_internal();
  test_arity();
  test_flops();
  test_names();
  test_verify();
  test_print();
  test_collectives();
  test_pipeline();
  test_coverage();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
