/* ops.c: the op table (ops.def) as data, every op's shape rule and FLOP count,
 * and lookups by name.
 *
 * Shape rules follow docs/language.md §5 and §8. They run on a node whose inputs
 * already have shapes; they compute n->shape and n->dtype, canonicalise axis
 * attributes in place (negative axes become positive, reshape's -1 becomes the
 * inferred size) so that re-running a rule changes nothing (ir_verify relies on
 * it), and on a user error write a message for sema to print at the call's span.
 *
 * Dtype rules (§5): a scalar takes the tensor's dtype; i32 with a float gives the
 * float; two different float dtypes give f32; comparisons give f32; float ops
 * (exp, log, softmax, ...) on i32 give f32. An int CONST scalar (i32) counts as
 * "any dtype" (so `idx + 1` stays i32), a float one (f32) as a float, whatever its
 * value (so `idx * 0.5` and `idx * 1.0` are f32, as in PyTorch). float(x) converts
 * i32 to f32 explicitly. */
#include "ir.h"
#include "placement.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------- */

static bool fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Writes a user-facing message into err and returns false, so rules can
 * `return fail(...)`. */
static bool fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return false;
}

static const Node *in_node(const Graph *g, const Node *n, int k) { return &g->nodes[n->in[k]]; }

static const char *op_name(const Node *n) { return ir_ops[n->op].name; }

static bool is_float(DType t) { return t != DT_I32; }

/* The dtype of an op that computes in floating point. */
static DType float_of(DType t) { return is_float(t) ? t : DT_F32; }

/* Two tensor dtypes meeting in one op. */
static DType promote(DType a, DType b) {
  if (a == b) return a;
  if (a == DT_I32) return b;
  if (b == DT_I32) return a;
  return DT_F32;
}

/* Is x a scalar next to the tensor `other` (so it adopts other's dtype)? */
static bool is_scalar_operand(const Node *x, const Node *other) {
  return x->shape.rank == 0 && (x->op == OP_CONST || other->shape.rank > 0);
}

/* The dtype a scalar `s` gives together with tensor `t`. */
static DType scalar_with(const Node *s, const Node *t) {
  if (t->dtype != DT_I32) return t->dtype;
  if (s->op == OP_CONST) return s->dtype == DT_I32 ? DT_I32 : DT_F32; /* `idx + 1` i32, `idx * 1.0` f32 */
  return s->dtype; /* a computed scalar: i32 with a float gives the float */
}

static DType binary_dtype(const Node *a, const Node *b) {
  bool sa = is_scalar_operand(a, b), sb = is_scalar_operand(b, a);
  if (sa && !sb) return scalar_with(a, b);
  if (sb && !sa) return scalar_with(b, a);
  return promote(a->dtype, b->dtype);
}

/* Multiplies into *acc; false on overflow past 2^62 elements. */
static bool mul_ok(int64_t *acc, int64_t d) {
  if (d < 0) return false;
  if (d != 0 && *acc > ((int64_t)1 << 62) / d) return false;
  *acc *= d;
  return true;
}

/* Makes *axis a valid non-negative axis of a rank-`rank` tensor (Python style). */
static bool canon_axis(const Node *n, int64_t *axis, const Shape *s, char *err, size_t errlen) {
  int r = s->rank;
  if (r == 0) return fail(err, errlen, "%s: axis %lld is invalid for a scalar", op_name(n), (long long)*axis);
  if (*axis < -r || *axis >= r)
    return fail(err, errlen, "%s: axis %lld is out of range for shape %s (valid axes: %d to %d)", op_name(n),
                (long long)*axis, shape_str(s), -r, r - 1);
  if (*axis < 0) *axis += r;
  return true;
}

static Shape drop_dim(const Shape *s, int axis) {
  Shape o = {0};
  for (int k = 0; k < s->rank; k++)
    if (k != axis) o.d[o.rank++] = s->d[k];
  return o;
}

static bool need_bool(const Node *n, int64_t v, const char *what, char *err, size_t errlen) {
  if (v == 0 || v == 1) return true;
  return fail(err, errlen, "%s: '%s' must be true or false, got %lld", op_name(n), what, (long long)v);
}

/* ---- leaves ----------------------------------------------------------------------- */

/* Leaves get their shape from the builder; the rule only checks it is sane. */
static bool shape_leaf(const Graph *g, Node *n, char *err, size_t errlen) {
  if (n->shape.rank < 0 || n->shape.rank > CP_MAX_RANK)
    return fail(err, errlen, "%s: rank %d is out of range (at most %d dims)", op_name(n), n->shape.rank, CP_MAX_RANK);
  if (n->dtype < 0 || n->dtype >= DT__COUNT) return fail(err, errlen, "%s: invalid dtype", op_name(n));
  int64_t numel = 1;
  for (int k = 0; k < n->shape.rank; k++) {
    if (n->shape.d[k] < 1)
      return fail(err, errlen, "%s: dims must be positive, got %s", op_name(n), shape_str(&n->shape));
    if (!mul_ok(&numel, n->shape.d[k]))
      return fail(err, errlen, "%s: shape %s has too many elements", op_name(n), shape_str(&n->shape));
  }
  if (n->op == OP_CONST && n->shape.rank != 0)
    return fail(err, errlen, "const: must be a scalar, got %s", shape_str(&n->shape));
  return true;
}

/* ---- internal ops of training graphs (autodiff, optimizer) ------------------------------ */

/* Two all-gathers of the same value along the same axis and dim: the same whole value (ZeRO 3
 * gathers a param again for the backward, lower.c). */
static bool same_gather(const Graph *g, int a, int b) {
  const Node *x = &g->nodes[a], *y = &g->nodes[b];
  return x->op == OP_ALL_GATHER && y->op == OP_ALL_GATHER && x->in[0] == y->in[0] && x->ia[0] == y->ia[0] &&
         x->ia[1] == y->ia[1];
}

/* GRAD: inputs [dy, forward inputs..., forward node]; the type of forward input ia[0]. These
 * are made by passes, so a failure here is a bug in the pass, reported by ir_verify. */
static bool shape_grad(const Graph *g, Node *n, char *err, size_t errlen) {
  if (n->fwd < 0 || n->fwd >= g->n) return fail(err, errlen, "grad: forward node %d out of range", n->fwd);
  const Node *f = &g->nodes[n->fwd];
  if (ir_ops[f->op].flags & (OPF_LEAF | OPF_NOGRAD))
    return fail(err, errlen, "grad: %s has no gradient", ir_ops[f->op].name);
  if (n->nin != f->nin + 2) return fail(err, errlen, "grad: expected %d inputs, got %d", f->nin + 2, n->nin);
  if (n->in[n->nin - 1] != n->fwd) return fail(err, errlen, "grad: the last input must be the forward node");
  for (int k = 0; k < f->nin; k++)
    if (n->in[1 + k] != f->in[k] && !same_gather(g, n->in[1 + k], f->in[k]))
      return fail(err, errlen, "grad: input %d is not the forward node's input %d", 1 + k, k);
  const Node *dy = in_node(g, n, 0);
  if (!shape_eq(&dy->shape, &f->shape))
    return fail(err, errlen, "grad: dy %s does not match the forward output %s", shape_str(&dy->shape), shape_str(&f->shape));
  if (n->ia[0] < 0 || n->ia[0] >= f->nin) return fail(err, errlen, "grad: input index %lld out of range", (long long)n->ia[0]);
  const Node *x = &g->nodes[f->in[n->ia[0]]];
  if (!is_float(x->dtype)) return fail(err, errlen, "grad: input %lld of %s is an integer tensor", (long long)n->ia[0], ir_ops[f->op].name);
  n->shape = x->shape;
  n->dtype = x->dtype;
  return true;
}

/* ASSIGN / ACCUM: dst (a PARAM or STATE) and a value of exactly its type. */
static bool shape_assign(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *dst = in_node(g, n, 0), *v = in_node(g, n, 1);
  if (dst->op != OP_PARAM && dst->op != OP_STATE)
    return fail(err, errlen, "%s: the destination must be a param or state, got %s", op_name(n), ir_ops[dst->op].name);
  if (!shape_eq(&dst->shape, &v->shape) || dst->dtype != v->dtype)
    return fail(err, errlen, "%s: value %s%s does not match the destination %s%s", op_name(n), dtype_name(v->dtype),
                shape_str(&v->shape), dtype_name(dst->dtype), shape_str(&dst->shape));
  n->shape = dst->shape;
  n->dtype = dst->dtype;
  return true;
}

/* The collectives of per-rank graphs (ops.def): the part of the value this rank holds after it. */
static bool shape_coll(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  int64_t k = n->ia[3], r = x->shape.rank, d1 = n->ia[1], d2 = n->ia[2];
  if (k < 1) return fail(err, errlen, "%s: %lld devices on the axis", op_name(n), (long long)k);
  bool two = n->op == OP_ALL_TO_ALL, one = n->op != OP_ALL_REDUCE;
  if ((one && (d1 < 0 || d1 >= r)) || (two && (d2 < 0 || d2 >= r)))
    return fail(err, errlen, "%s: dim out of range for %s", op_name(n), shape_str(&x->shape));
  n->shape = x->shape;
  n->dtype = x->dtype;
  if (n->op == OP_ALL_GATHER || two) n->shape.d[d1] *= k;
  int64_t split = n->op == OP_ALL_TO_ALL ? d2 : d1;
  if (n->op == OP_REDUCE_SCATTER || n->op == OP_SHARD_SLICE || two) {
    if (n->shape.d[split] % k != 0)
      return fail(err, errlen, "%s: %lld devices do not divide dim %lld of %s", op_name(n), (long long)k,
                  (long long)split, shape_str(&x->shape));
    n->shape.d[split] /= k;
  }
  return true;
}

static bool shape_pp(const Graph *g, Node *n, char *err, size_t errlen) {
  if (n->ia[0] < 0) return fail(err, errlen, "%s: bad peer stage %lld", op_name(n), (long long)n->ia[0]);
  if (n->op == OP_PP_SEND) {
    (void)in_node(g, n, 0);
    n->shape = (Shape){.rank = 0};
    n->dtype = DT_F32;
    return true;
  }
  if (n->ndims < 0 || n->ndims > CP_MAX_RANK) return fail(err, errlen, "pp_recv: bad rank %d", n->ndims);
  n->shape = (Shape){.rank = n->ndims};
  for (int d = 0; d < n->ndims; d++) n->shape.d[d] = n->dims[d];
  n->dtype = (DType)n->ia[2];
  return true;
}

static bool shape_arange(const Graph *g, Node *n, char *err, size_t errlen) {
  if (n->ia[0] < 1) return fail(err, errlen, "arange: n must be >= 1, got %lld", (long long)n->ia[0]);
  n->shape = (Shape){.rank = 1, .d = {n->ia[0]}};
  n->dtype = DT_I32;
  return true;
}

/* ---- elementwise -------------------------------------------------------------------- */

static bool broadcast_or_fail(const Node *n, const Shape *a, const Shape *b, Shape *out, char *err, size_t errlen) {
  if (shape_broadcast(a, b, out)) return true;
  /* Find the first mismatching dim, counted from the end as NumPy aligns them. */
  int k = 1;
  for (; k <= a->rank && k <= b->rank; k++) {
    int64_t x = a->d[a->rank - k], y = b->d[b->rank - k];
    if (x != y && x != 1 && y != 1) break;
  }
  const char *prefix = ir_ops[n->op].flags & OPF_OPERATOR ? "" : cp_fmt("%s: ", op_name(n));
  if (k > a->rank || k > b->rank)
    return fail(err, errlen, "%sshapes %s and %s do not broadcast", prefix, shape_str(a), shape_str(b));
  return fail(err, errlen, "%sshapes %s and %s do not broadcast (%lld vs %lld at dim %d)", prefix, shape_str(a),
              shape_str(b), (long long)a->d[a->rank - k], (long long)b->d[b->rank - k], -k);
}

static bool shape_binary(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *a = in_node(g, n, 0), *b = in_node(g, n, 1);
  if (!broadcast_or_fail(n, &a->shape, &b->shape, &n->shape, err, errlen)) return false;
  n->dtype = binary_dtype(a, b);
  return true;
}

static bool shape_compare(const Graph *g, Node *n, char *err, size_t errlen) {
  if (!shape_binary(g, n, err, errlen)) return false;
  n->dtype = DT_F32;
  return true;
}

static bool shape_unary(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  n->shape = x->shape;
  n->dtype = x->dtype;
  return true;
}

static bool shape_unary_float(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  n->shape = x->shape;
  n->dtype = float_of(x->dtype);
  return true;
}

/* clamp_min/clamp_max (and the clamp macro's check): a float tensor, same shape and dtype. */
static bool shape_clamp(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (!is_float(x->dtype))
    return fail(err, errlen, "%s: clamps float tensors, got %s%s", op_name(n), dtype_name(x->dtype),
                shape_str(&x->shape));
  n->shape = x->shape;
  n->dtype = x->dtype;
  return true;
}

/* where(cond, a, b): the broadcast of the three; the dtype of a and b as a binary op's (a number
 * takes the tensor's). cond is a comparison's 1/0 (f32): an i32 one is refused, as are i32
 * branches (the kernels select floats; float(x) converts). */
static bool shape_where(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *c = in_node(g, n, 0), *a = in_node(g, n, 1), *b = in_node(g, n, 2);
  Shape ab;
  if (!broadcast_or_fail(n, &a->shape, &b->shape, &ab, err, errlen)) return false;
  if (!broadcast_or_fail(n, &c->shape, &ab, &n->shape, err, errlen)) return false;
  if (c->dtype == DT_I32)
    return fail(err, errlen, "where: cond must be a comparison (1.0 where true), got i32%s", shape_str(&c->shape));
  if ((a->dtype == DT_I32) != (b->dtype == DT_I32)) /* sema promotes the i32 one first, as PyTorch does */
    return fail(err, errlen, "where: an i32 branch with a float one, got %s%s and %s%s: convert it with float(x)",
                dtype_name(a->dtype), shape_str(&a->shape), dtype_name(b->dtype), shape_str(&b->shape));
  n->dtype = a->dtype == DT_I32 ? DT_I32 : binary_dtype(a, b); /* two i32 branches: i32, as torch.where */
  return true;
}

/* ---- reductions ---------------------------------------------------------------------- */

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* dims[]/ndims: the axes (ndims -1: all); ia[0]: keepdims. Axes end sorted. */
static bool shape_reduce(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (!need_bool(n, n->ia[0], "keepdims", err, errlen)) return false;
  bool drop[CP_MAX_RANK] = {0};
  if (n->ndims < 0) {
    for (int k = 0; k < x->shape.rank; k++) drop[k] = true;
  } else {
    if (n->ndims > CP_MAX_RANK) return fail(err, errlen, "%s: too many axes (%d)", op_name(n), n->ndims);
    for (int k = 0; k < n->ndims; k++) {
      if (!canon_axis(n, &n->dims[k], &x->shape, err, errlen)) return false;
      if (drop[n->dims[k]])
        return fail(err, errlen, "%s: axis %lld is listed twice", op_name(n), (long long)n->dims[k]);
      drop[n->dims[k]] = true;
    }
    qsort(n->dims, (size_t)n->ndims, sizeof n->dims[0], cmp_i64);
  }
  Shape o = {0};
  for (int k = 0; k < x->shape.rank; k++) {
    if (!drop[k]) o.d[o.rank++] = x->shape.d[k];
    else if (n->ia[0]) o.d[o.rank++] = 1;
  }
  n->shape = o;
  n->dtype = n->op == OP_MEAN ? float_of(x->dtype) : x->dtype;
  return true;
}

/* ---- linear algebra ------------------------------------------------------------------ */

/* a [..., M, K] @ b [..., K, N] -> [broadcast(...), M, N]. A 1-D operand behaves as
 * in NumPy: a [K] is [1, K] and b [K] is [K, 1], and the added dim is removed. */
static bool shape_matmul(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *a = in_node(g, n, 0), *b = in_node(g, n, 1);
  const Shape *sa = &a->shape, *sb = &b->shape;
  if (sa->rank == 0 || sb->rank == 0)
    return fail(err, errlen, "matmul: operands must have at least 1 dim, got %s @ %s (use '*' to scale)", shape_str(sa),
                shape_str(sb));
  if (!is_float(a->dtype) || !is_float(b->dtype))
    return fail(err, errlen, "matmul: operands must be float tensors, got %s%s @ %s%s", dtype_name(a->dtype),
                shape_str(sa), dtype_name(b->dtype), shape_str(sb));
  Shape A = *sa, B = *sb;
  if (A.rank == 1) A = (Shape){.rank = 2, .d = {1, sa->d[0]}};
  if (B.rank == 1) B = (Shape){.rank = 2, .d = {sb->d[0], 1}};
  int64_t K = A.d[A.rank - 1], K2 = B.d[B.rank - 2];
  if (K != K2)
    return fail(err, errlen, "matmul: inner dimensions differ: %s @ %s (%lld vs %lld)", shape_str(sa), shape_str(sb),
                (long long)K, (long long)K2);
  Shape ba = {.rank = A.rank - 2}, bb = {.rank = B.rank - 2}, bo;
  memcpy(ba.d, A.d, sizeof(int64_t) * (size_t)ba.rank);
  memcpy(bb.d, B.d, sizeof(int64_t) * (size_t)bb.rank);
  if (!shape_broadcast(&ba, &bb, &bo))
    return fail(err, errlen, "matmul: batch dimensions %s and %s do not broadcast: %s @ %s", shape_str(&ba),
                shape_str(&bb), shape_str(sa), shape_str(sb));
  Shape o = bo;
  if (sa->rank > 1) o.d[o.rank++] = A.d[A.rank - 2];
  if (sb->rank > 1) o.d[o.rank++] = B.d[B.rank - 1];
  n->shape = o;
  n->dtype = promote(a->dtype, b->dtype);
  return true;
}

static bool shape_transpose(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (x->shape.rank < 2)
    return fail(err, errlen, "transpose: needs at least 2 dims (it swaps the last two), got %s", shape_str(&x->shape));
  n->shape = x->shape;
  int r = x->shape.rank;
  n->shape.d[r - 1] = x->shape.d[r - 2];
  n->shape.d[r - 2] = x->shape.d[r - 1];
  n->dtype = x->dtype;
  return true;
}

static const char *dims_str(const int64_t *d, int nd) {
  Shape s = {.rank = nd < 0 ? 0 : nd > CP_MAX_RANK ? CP_MAX_RANK : nd};
  memcpy(s.d, d, sizeof(int64_t) * (size_t)s.rank);
  return shape_str(&s);
}

static bool shape_permute(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  int r = x->shape.rank;
  if (n->ndims != r)
    return fail(err, errlen, "permute: dims %s must list each of the %d dims of %s once", dims_str(n->dims, n->ndims),
                r, shape_str(&x->shape));
  bool seen[CP_MAX_RANK] = {0};
  for (int k = 0; k < r; k++) {
    if (!canon_axis(n, &n->dims[k], &x->shape, err, errlen)) return false;
    if (seen[n->dims[k]])
      return fail(err, errlen, "permute: dims %s are not a permutation (dim %lld appears twice)",
                  dims_str(n->dims, n->ndims), (long long)n->dims[k]);
    seen[n->dims[k]] = true;
  }
  Shape o = {.rank = r};
  for (int k = 0; k < r; k++) o.d[k] = x->shape.d[n->dims[k]];
  n->shape = o;
  n->dtype = x->dtype;
  return true;
}

/* ---- shape ops ----------------------------------------------------------------------- */

/* dims: the new shape; one -1 is inferred (and replaced by its value). */
static bool shape_reshape(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (n->ndims < 0 || n->ndims > CP_MAX_RANK)
    return fail(err, errlen, "reshape: needs 0 to %d dims, got %d", CP_MAX_RANK, n->ndims);
  int infer = -1;
  int64_t known = 1;
  for (int k = 0; k < n->ndims; k++) {
    if (n->dims[k] == -1 && infer < 0) {
      infer = k;
    } else if (n->dims[k] == -1) {
      return fail(err, errlen, "reshape: only one dim may be -1, got %s", dims_str(n->dims, n->ndims));
    } else if (n->dims[k] < 1) {
      return fail(err, errlen, "reshape: dims must be positive or -1, got %s", dims_str(n->dims, n->ndims));
    } else if (!mul_ok(&known, n->dims[k])) {
      return fail(err, errlen, "reshape: shape %s has too many elements", dims_str(n->dims, n->ndims));
    }
  }
  int64_t numel = shape_numel(&x->shape);
  if (infer >= 0) {
    if (numel % known != 0)
      return fail(err, errlen, "reshape: cannot reshape %s (%lld elements) into %s: %lld is not a multiple of %lld",
                  shape_str(&x->shape), (long long)numel, dims_str(n->dims, n->ndims), (long long)numel,
                  (long long)known);
    n->dims[infer] = numel / known;
    known = numel;
  }
  if (known != numel)
    return fail(err, errlen, "reshape: cannot reshape %s (%lld elements) into %s (%lld elements)", shape_str(&x->shape),
                (long long)numel, dims_str(n->dims, n->ndims), (long long)known);
  n->shape.rank = n->ndims;
  memcpy(n->shape.d, n->dims, sizeof(int64_t) * (size_t)n->ndims);
  n->dtype = x->dtype;
  return true;
}

/* dims: the sizes (macro: sema expands it); -1 keeps x's dim, a dim of 1 grows, new dims lead. */
static bool shape_expand(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  const int r = x->shape.rank, R = n->ndims;
  if (R < r || R > CP_MAX_RANK)
    return fail(err, errlen, "expand: the sizes %s have fewer dims than x %s (or more than %d)", dims_str(n->dims, R),
                shape_str(&x->shape), CP_MAX_RANK);
  for (int k = 0; k < R; k++) {
    int64_t have = k < R - r ? 1 : x->shape.d[k - (R - r)], want = n->dims[k];
    if (want == -1 && k < R - r)
      return fail(err, errlen, "expand: a new leading dim cannot be -1, got sizes %s", dims_str(n->dims, R));
    if (want == -1) want = n->dims[k] = have;
    if (want < 1 || (have != 1 && want != have))
      return fail(err, errlen, "expand: x %s cannot expand to %s: dim %d is %lld, only a dim of 1 can grow (to %lld)",
                  shape_str(&x->shape), dims_str(n->dims, R), k, (long long)have, (long long)want);
  }
  n->shape.rank = R;
  memcpy(n->shape.d, n->dims, sizeof(int64_t) * (size_t)R);
  n->dtype = x->dtype;
  return true;
}

/* ia[0] = repeats, ia[1] = axis (macro: sema expands it). */
static bool shape_repeat_interleave(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (n->ia[0] < 1) return fail(err, errlen, "repeat_interleave: repeats must be at least 1, got %lld", (long long)n->ia[0]);
  if (!canon_axis(n, &n->ia[1], &x->shape, err, errlen)) return false;
  n->shape = x->shape;
  if (!mul_ok(&n->shape.d[n->ia[1]], n->ia[0]))
    return fail(err, errlen, "repeat_interleave: %s repeated %lld times is too large", shape_str(&x->shape),
                (long long)n->ia[0]);
  n->dtype = x->dtype;
  return true;
}

/* unsqueeze: ia[0] = axis in [-(rank + 1), rank] */
static bool shape_unsqueeze(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  const int r = x->shape.rank;
  if (r >= CP_MAX_RANK) return fail(err, errlen, "unsqueeze: x %s already has %d dims, the most a tensor has", shape_str(&x->shape), r);
  if (n->ia[0] < -(r + 1) || n->ia[0] > r)
    return fail(err, errlen, "unsqueeze: axis %lld is out of range for shape %s (valid axes: %d to %d)",
                (long long)n->ia[0], shape_str(&x->shape), -(r + 1), r);
  if (n->ia[0] < 0) n->ia[0] += r + 1;
  n->shape.rank = r + 1;
  for (int k = 0, j = 0; k <= r; k++) n->shape.d[k] = k == n->ia[0] ? 1 : x->shape.d[j++];
  n->dtype = x->dtype;
  return true;
}

/* squeeze: ia[0] = axis, whose dim must be 1 */
static bool shape_squeeze(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (!canon_axis(n, &n->ia[0], &x->shape, err, errlen)) return false;
  if (x->shape.d[n->ia[0]] != 1)
    return fail(err, errlen, "squeeze: dim %lld of %s is %lld, not 1", (long long)n->ia[0], shape_str(&x->shape),
                (long long)x->shape.d[n->ia[0]]);
  n->shape.rank = x->shape.rank - 1;
  for (int k = 0, j = 0; k < x->shape.rank; k++)
    if (k != n->ia[0]) n->shape.d[j++] = x->shape.d[k];
  n->dtype = x->dtype;
  return true;
}

/* flatten: ia[0] = start_axis, ia[1] = end_axis (start <= end); a scalar becomes [1], as torch */
static bool shape_flatten(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  const int r = x->shape.rank;
  n->dtype = x->dtype;
  if (r == 0 && (n->ia[0] == 0 || n->ia[0] == -1) && (n->ia[1] == 0 || n->ia[1] == -1)) {
    n->ia[0] = n->ia[1] = 0;
    n->shape = (Shape){.rank = 1, .d = {1}};
    return true;
  }
  if (!canon_axis(n, &n->ia[0], &x->shape, err, errlen) || !canon_axis(n, &n->ia[1], &x->shape, err, errlen)) return false;
  if (n->ia[0] > n->ia[1])
    return fail(err, errlen, "flatten: start_axis %lld comes after end_axis %lld of %s", (long long)n->ia[0],
                (long long)n->ia[1], shape_str(&x->shape));
  n->shape.rank = 0;
  for (int k = 0; k < r; k++) {
    if (k <= n->ia[0] || k > n->ia[1]) n->shape.d[n->shape.rank++] = x->shape.d[k];
    else n->shape.d[n->shape.rank - 1] *= x->shape.d[k];
  }
  return true;
}

/* ia[0] = n parts, ia[1] = axis. A macro (sema emits n SLICEs); the rule checks
 * the call and gives the shape of one part. */
static bool shape_split(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (!canon_axis(n, &n->ia[1], &x->shape, err, errlen)) return false;
  int64_t parts = n->ia[0], dim = x->shape.d[n->ia[1]];
  if (parts < 1) return fail(err, errlen, "split: the number of parts must be >= 1, got %lld", (long long)parts);
  if (dim % parts != 0)
    return fail(err, errlen, "split: %lld parts do not divide dim %lld of %s (size %lld)", (long long)parts,
                (long long)n->ia[1], shape_str(&x->shape), (long long)dim);
  n->shape = x->shape;
  n->shape.d[n->ia[1]] = dim / parts;
  n->dtype = x->dtype;
  return true;
}

/* inputs: the tensors; ia[0]: axis. Every dim but the axis must agree. */
static bool shape_concat(const Graph *g, Node *n, char *err, size_t errlen) {
  if (n->nin < 1) return fail(err, errlen, "concat: needs at least one tensor");
  const Node *x0 = in_node(g, n, 0);
  if (!canon_axis(n, &n->ia[0], &x0->shape, err, errlen)) return false;
  int axis = (int)n->ia[0];
  Shape o = x0->shape;
  DType dt = x0->dtype;
  for (int i = 1; i < n->nin; i++) {
    const Node *xi = in_node(g, n, i);
    if (xi->shape.rank != o.rank)
      return fail(err, errlen, "concat: tensor %d has shape %s, of rank %d, but tensor 0 has shape %s, of rank %d", i,
                  shape_str(&xi->shape), xi->shape.rank, shape_str(&x0->shape), o.rank);
    for (int k = 0; k < o.rank; k++) {
      if (k == axis || xi->shape.d[k] == x0->shape.d[k]) continue;
      return fail(err, errlen,
                  "concat: tensor %d has shape %s, tensor 0 has %s: they differ in dim %d (%lld vs %lld), "
                  "only the concat axis %d may differ",
                  i, shape_str(&xi->shape), shape_str(&x0->shape), k, (long long)xi->shape.d[k],
                  (long long)x0->shape.d[k], axis);
    }
    o.d[axis] += xi->shape.d[axis];
    dt = promote(dt, xi->dtype);
  }
  n->shape = o;
  n->dtype = dt;
  return true;
}

/* stack (macro): tensors of one shape -> a new dim of their count at ia[0] (canonical, in
 * [0, rank]). */
static bool shape_stack(const Graph *g, Node *n, char *err, size_t errlen) {
  if (n->nin < 1) return fail(err, errlen, "stack: needs at least one tensor");
  const Node *x0 = in_node(g, n, 0);
  int r = x0->shape.rank;
  if (r + 1 > CP_MAX_RANK) return fail(err, errlen, "stack: tensors of %d dims would give %d, more than %d", r, r + 1, CP_MAX_RANK);
  if (n->ia[0] < -(r + 1) || n->ia[0] > r)
    return fail(err, errlen, "stack: axis %lld is out of range for a result of %d dims (valid axes: %d to %d)",
                (long long)n->ia[0], r + 1, -(r + 1), r);
  if (n->ia[0] < 0) n->ia[0] += r + 1;
  DType dt = x0->dtype;
  for (int i = 1; i < n->nin; i++) {
    const Node *xi = in_node(g, n, i);
    if (!shape_eq(&xi->shape, &x0->shape))
      return fail(err, errlen, "stack: tensor %d has shape %s, tensor 0 has %s: stack needs one shape", i,
                  shape_str(&xi->shape), shape_str(&x0->shape));
    dt = promote(dt, xi->dtype);
  }
  Shape o = {.rank = r + 1};
  for (int k = 0, j = 0; k <= r; k++) o.d[k] = k == n->ia[0] ? n->nin : x0->shape.d[j++];
  n->shape = o;
  n->dtype = dt;
  return true;
}

/* masked_fill (macro): x, a mask broadcasting to x's shape -> x's shape. */
static bool shape_masked_fill(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0), *m = in_node(g, n, 1);
  Shape o;
  if (!shape_broadcast(&x->shape, &m->shape, &o) || !shape_eq(&o, &x->shape))
    return fail(err, errlen, "masked_fill: the mask %s does not broadcast to x %s", shape_str(&m->shape),
                shape_str(&x->shape));
  n->shape = x->shape;
  n->dtype = x->dtype;
  return true;
}

/* ia[0] axis, ia[1] start, ia[2] end: x[..., start:end, ...] along the axis. */
static bool shape_slice(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (!canon_axis(n, &n->ia[0], &x->shape, err, errlen)) return false;
  int64_t dim = x->shape.d[n->ia[0]], s = n->ia[1], e = n->ia[2];
  /* A negative start or end counts from the end, as Python's x[..., -3:-1] (canonicalised in place). */
  if (s < 0 && s >= -dim) s += dim;
  if (e < 0 && e >= -dim) e += dim;
  if (s < 0 || s >= e || e > dim)
    return fail(err, errlen,
                "slice: range %lld..%lld is invalid for dim %lld of %s (size %lld): need 0 <= start < end <= %lld "
                "(negative values count from the end)",
                (long long)n->ia[1], (long long)n->ia[2], (long long)n->ia[0], shape_str(&x->shape), (long long)dim,
                (long long)dim);
  n->ia[1] = s, n->ia[2] = e;
  n->shape = x->shape;
  n->shape.d[n->ia[0]] = e - s;
  n->dtype = x->dtype;
  return true;
}

/* [B, T, C] -> [B, h, T, C/h]; ia[0]: h. */
static bool shape_split_heads(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  int64_t h = n->ia[0];
  if (x->shape.rank != 3) return fail(err, errlen, "split_heads: expected [B, T, C], got %s", shape_str(&x->shape));
  if (h < 1) return fail(err, errlen, "split_heads: the number of heads must be >= 1, got %lld", (long long)h);
  int64_t C = x->shape.d[2];
  if (C % h != 0)
    return fail(err, errlen, "split_heads: %lld heads do not divide %lld channels", (long long)h, (long long)C);
  n->shape = (Shape){.rank = 4, .d = {x->shape.d[0], h, x->shape.d[1], C / h}};
  n->dtype = x->dtype;
  return true;
}

/* [B, h, T, d] -> [B, T, h*d]. */
static bool shape_merge_heads(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (x->shape.rank != 4) return fail(err, errlen, "merge_heads: expected [B, h, T, d], got %s", shape_str(&x->shape));
  const int64_t *d = x->shape.d;
  n->shape = (Shape){.rank = 3, .d = {d[0], d[2], d[1] * d[3]}};
  n->dtype = x->dtype;
  return true;
}

/* ---- indexing ------------------------------------------------------------------------ */

static bool shape_embedding(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *t = in_node(g, n, 0), *idx = in_node(g, n, 1);
  if (t->dtype == DT_I32 && idx->dtype != DT_I32) /* F.embedding(idx, table): the other order */
    return fail(err, errlen, "embedding: the table comes first, embedding(table, idx) (PyTorch's F.embedding takes idx "
                "first), got %s%s and %s%s", dtype_name(t->dtype), shape_str(&t->shape), dtype_name(idx->dtype),
                shape_str(&idx->shape));
  if (t->shape.rank != 2) return fail(err, errlen, "embedding: table must be [V, C], got %s", shape_str(&t->shape));
  if (!is_float(t->dtype))
    return fail(err, errlen, "embedding: table must be a float tensor, got %s%s", dtype_name(t->dtype),
                shape_str(&t->shape));
  if (idx->dtype != DT_I32)
    return fail(err, errlen, "embedding: indices must be i32, got %s%s", dtype_name(idx->dtype),
                shape_str(&idx->shape));
  if (idx->shape.rank >= CP_MAX_RANK)
    return fail(err, errlen, "embedding: indices %s have too many dims (the result would exceed %d)",
                shape_str(&idx->shape), CP_MAX_RANK);
  n->shape = idx->shape;
  n->shape.d[n->shape.rank++] = t->shape.d[1];
  n->dtype = t->dtype;
  return true;
}

/* ---- nn ---------------------------------------------------------------------------------- */

/* ia[0]: axis. */
/* The float operand of a kernel that reads floats (softmax, the norms, rope, sdpa, dropout, the
 * logits of cross_entropy): an i32 one is an error, as PyTorch refuses integer tensors there (their
 * kernels would read its bits as floats); float(x) converts it. */
static bool need_float(const Node *n, const Node *x, const char *what, char *err, size_t errlen) {
  if (x->dtype != DT_I32) return true;
  return fail(err, errlen, "%s: %s must be a float tensor, got i32%s: convert it with float(%s), as PyTorch's x.float()",
              op_name(n), what, shape_str(&x->shape), what);
}

static bool shape_softmax(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (!need_float(n, x, "x", err, errlen)) return false;
  if (!canon_axis(n, &n->ia[0], &x->shape, err, errlen)) return false;
  if (n->ia[1] != 0 && (n->op != OP_SOFTMAX || n->ia[1] != 1)) /* the safe flag (ops.def) */
    return fail(err, errlen, "%s: invalid safe flag %lld", op_name(n), (long long)n->ia[1]);
  n->shape = x->shape;
  n->dtype = float_of(x->dtype);
  return true;
}

static bool check_eps(const Node *n, double eps, char *err, size_t errlen) {
  if (eps >= 0 && isfinite(eps)) return true;
  return fail(err, errlen, "%s: eps must be a finite number >= 0, got %g", op_name(n), eps);
}

/* Input k must be [C], C = the last dim of x. */
static bool check_channel_vec(const Graph *g, const Node *n, int k, const char *what, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0), *w = in_node(g, n, k);
  int64_t C = x->shape.d[x->shape.rank - 1];
  if (w->shape.rank == 1 && w->shape.d[0] == C) return true;
  return fail(err, errlen, "%s: %s has shape %s, expected [%lld] (the last dim of x)", op_name(n), what,
              shape_str(&w->shape), (long long)C);
}

/* layer_norm(x, w, b, eps): fa[0] eps. */
static bool shape_layer_norm(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (x->shape.rank < 1) return fail(err, errlen, "layer_norm: x must have at least 1 dim, got a scalar");
  if (!check_channel_vec(g, n, 1, "weight", err, errlen) || !check_channel_vec(g, n, 2, "bias", err, errlen))
    return false;
  if (!need_float(n, x, "x", err, errlen) || !need_float(n, in_node(g, n, 1), "w", err, errlen) ||
      !need_float(n, in_node(g, n, 2), "b", err, errlen))
    return false;
  if (!check_eps(n, n->fa[0], err, errlen)) return false;
  n->shape = x->shape;
  n->dtype = float_of(x->dtype);
  return true;
}

/* rms_norm(x, w, eps): fa[0] eps. */
static bool shape_rms_norm(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (x->shape.rank < 1) return fail(err, errlen, "rms_norm: x must have at least 1 dim, got a scalar");
  if (!check_channel_vec(g, n, 1, "weight", err, errlen)) return false;
  if (!need_float(n, x, "x", err, errlen) || !need_float(n, in_node(g, n, 1), "w", err, errlen)) return false;
  if (!check_eps(n, n->fa[0], err, errlen)) return false;
  n->shape = x->shape;
  n->dtype = float_of(x->dtype);
  return true;
}

/* rope(x, base): positions along dim -2, pairs along the last dim; fa[0] base. */
static bool shape_rope(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  int r = x->shape.rank;
  if (r < 2) return fail(err, errlen, "rope: expected [..., T, d] with at least 2 dims, got %s", shape_str(&x->shape));
  if (!need_float(n, x, "x", err, errlen)) return false;
  if (x->shape.d[r - 1] % 2 != 0)
    return fail(err, errlen, "rope: the last dim must be even (it rotates pairs), got %s", shape_str(&x->shape));
  if (!(n->fa[0] > 0) || !isfinite(n->fa[0]))
    return fail(err, errlen, "rope: base must be a finite number > 0, got %g", n->fa[0]);
  n->shape = x->shape;
  n->dtype = float_of(x->dtype);
  return true;
}

/* sdpa(q [B,h,Tq,d], k [B,hk,Tk,d], v [B,hk,Tk,dv] [, km [B,Tk]]) -> [B,h,Tq,dv]; ia[0] causal. hk
 * divides h: grouped-query attention, query head i reading key/value head i / (h / hk) (sema checks
 * enable_gqa; the kernels take the groups without repeating k and v). km, a 4th input only sema adds
 * (an attn_mask that masks keys alone, rewrite_for_backends): key j of sample b takes part where
 * km[b, j] != 0; a query with no key left gives 0. */
static bool shape_sdpa(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *q = in_node(g, n, 0), *k = in_node(g, n, 1), *v = in_node(g, n, 2);
  const char *names[3] = {"q", "k", "v"};
  const Node *qkv[3] = {q, k, v};
  for (int i = 0; i < 3; i++)
    if (qkv[i]->shape.rank != 4)
      return fail(err, errlen, "sdpa: %s must be [B, h, T, d], got %s", names[i], shape_str(&qkv[i]->shape));
  const int64_t *Q = q->shape.d, *K = k->shape.d, *V = v->shape.d;
  if (Q[0] != K[0] || K[1] < 1 || Q[1] % K[1] || Q[3] != K[3])
    return fail(err, errlen,
                "sdpa: q %s and k %s must agree in B and d, and k's heads divide q's: expected k [%lld, %lld, Tk, %lld]",
                shape_str(&q->shape), shape_str(&k->shape), (long long)Q[0], (long long)Q[1], (long long)Q[3]);
  if (V[0] != K[0] || V[1] != K[1] || V[2] != K[2])
    return fail(err, errlen, "sdpa: k %s and v %s must agree in B, h and T: expected v [%lld, %lld, %lld, dv]",
                shape_str(&k->shape), shape_str(&v->shape), (long long)K[0], (long long)K[1], (long long)K[2]);
  if (!need_bool(n, n->ia[0], "causal", err, errlen)) return false;
  for (int i = 0; i < 3; i++)
    if (!need_float(n, qkv[i], names[i], err, errlen)) return false;
  if (n->nin == 4) {
    const Node *km = in_node(g, n, 3);
    if (km->shape.rank != 2 || km->shape.d[0] != Q[0] || km->shape.d[1] != K[2])
      return fail(err, errlen, "sdpa: the key mask must be [B, Tk] = [%lld, %lld], got %s", (long long)Q[0],
                  (long long)K[2], shape_str(&km->shape));
    if (!need_float(n, km, "key mask", err, errlen)) return false;
  }
  n->shape = (Shape){.rank = 4, .d = {Q[0], Q[1], Q[2], V[3]}};
  n->dtype = float_of(promote(promote(q->dtype, k->dtype), v->dtype));
  return true;
}

/* fa[0]: p. */
static bool shape_dropout(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (!(n->fa[0] >= 0 && n->fa[0] < 1)) return fail(err, errlen, "dropout: p must be in [0, 1), got %g", n->fa[0]);
  if (!need_float(n, x, "x", err, errlen)) return false;
  n->shape = x->shape;
  n->dtype = float_of(x->dtype);
  return true;
}

/* ---- loss and no-gradient ops --------------------------------------------------------------- */

static bool shape_cross_entropy(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *lg = in_node(g, n, 0), *t = in_node(g, n, 1);
  if (lg->shape.rank < 1)
    return fail(err, errlen, "cross_entropy: logits must have a class dim [..., V], got a scalar");
  if (!need_float(n, lg, "logits", err, errlen)) return false;
  if (t->dtype != DT_I32)
    return fail(err, errlen, "cross_entropy: targets must be i32 class indices, got %s%s", dtype_name(t->dtype),
                shape_str(&t->shape));
  Shape want = drop_dim(&lg->shape, lg->shape.rank - 1);
  if (!shape_eq(&want, &t->shape))
    return fail(err, errlen, "cross_entropy: targets have shape %s, expected %s (the logits' shape %s without the last dim)",
                shape_str(&t->shape), shape_str(&want), shape_str(&lg->shape));
  n->shape = (Shape){0};
  n->dtype = DT_F32;
  return true;
}

/* mse_loss, l1_loss, binary_cross_entropy_with_logits (macros): a float input and a target of its
 * shape -> a scalar. */
static bool shape_pair_loss(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0), *y = in_node(g, n, 1);
  if (!need_float(n, x, "input", err, errlen)) return false;
  if (!shape_eq(&x->shape, &y->shape))
    return fail(err, errlen, "%s: target %s differs in shape from input %s (PyTorch broadcasts them with only a warning, "
                "which is nearly always a bug: reshape one to the other's shape)", op_name(n), shape_str(&y->shape),
                shape_str(&x->shape));
  n->shape = (Shape){0};
  n->dtype = DT_F32;
  return true;
}

/* ia[0]: axis; the result drops it. */
static bool shape_argmax(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (!canon_axis(n, &n->ia[0], &x->shape, err, errlen)) return false;
  n->shape = drop_dim(&x->shape, (int)n->ia[0]);
  n->dtype = DT_I32;
  return true;
}

/* float(x): an i32 tensor as f32, same shape. Sema never makes the node of an f32 argument (it
 * returns the argument), so anything but i32 here is a dtype float() does not convert. */
static bool shape_float(const Graph *g, Node *n, char *err, size_t errlen) {
  const Node *x = in_node(g, n, 0);
  if (x->dtype != DT_I32)
    return fail(err, errlen, "float: converts i32 tensors to f32 (an f32 one is returned as it is), got %s%s",
                dtype_name(x->dtype), shape_str(&x->shape));
  n->shape = x->shape;
  n->dtype = DT_F32;
  return true;
}

/* ---- FLOP counts (forward, per node) ------------------------------------------------------- */

static double out_numel(const Node *n) { return (double)shape_numel(&n->shape); }

static double flops_zero(const Graph *g, const Node *n) { return 0; }
/* A backward costs about what its forward does, per input gradient (2x for a matmul). */
static double flops_grad(const Graph *g, const Node *n) {
  return n->fwd >= 0 && n->fwd < g->n ? ir_ops[g->nodes[n->fwd].op].flops(g, &g->nodes[n->fwd]) : 0;
}
static double flops_ew1(const Graph *g, const Node *n) { return out_numel(n); }
static double flops_ew4(const Graph *g, const Node *n) { return 4 * out_numel(n); }
static double flops_ew8(const Graph *g, const Node *n) { return 8 * out_numel(n); }
static double flops_reduce(const Graph *g, const Node *n) { return (double)shape_numel(&in_node(g, n, 0)->shape); }
static double flops_softmax(const Graph *g, const Node *n) { return 5 * out_numel(n); }
static double flops_norm(const Graph *g, const Node *n) { return 8 * out_numel(n); }
static double flops_rope(const Graph *g, const Node *n) { return 3 * out_numel(n); }

/* 2·M·N·K per batch element: the output has batch·M·N elements, each a K-long dot. */
static double flops_matmul(const Graph *g, const Node *n) {
  const Shape *a = &in_node(g, n, 0)->shape;
  return 2 * out_numel(n) * (double)a->d[a->rank - 1];
}

/* Two matmuls (q·kᵀ: 2·Tq·Tk·d, p·v: 2·Tq·Tk·dv; causal is not halved) plus a
 * softmax over the Tq·Tk scores, per batch and head. */
static double flops_sdpa(const Graph *g, const Node *n) {
  const int64_t *q = in_node(g, n, 0)->shape.d, *v = in_node(g, n, 2)->shape.d;
  double bh = (double)q[0] * (double)q[1], scores = bh * (double)q[2] * (double)v[2];
  return 2 * scores * (double)(q[3] + v[3]) + 5 * scores;
}

static double flops_cross_entropy(const Graph *g, const Node *n) {
  return 5 * (double)shape_numel(&in_node(g, n, 0)->shape);
}

/* ---- the table ---------------------------------------------------------------------------- */

const OpInfo ir_ops[OP__COUNT] = {
#define OP(id, name, sig, flags, shape, flops, shard) [OP_##id] = {name, sig, flags, shape, flops, shard},
#include "ops.def"
#undef OP
};

static bool callable(const OpInfo *op) { return !(op->flags & (OPF_OPERATOR | OPF_LEAF | OPF_INTERNAL)); }

const OpInfo *ir_op_by_name(const char *name, OpId *id) {
  for (int i = 0; i < OP__COUNT; i++) {
    if (!callable(&ir_ops[i]) || strcmp(ir_ops[i].name, name) != 0) continue;
    if (id) *id = (OpId)i;
    return &ir_ops[i];
  }
  if (id) *id = OP__COUNT; /* callers test *id against the ops they treat apart */
  return NULL;
}

/* PyTorch's spelling of an operation, method or attribute that cplan writes otherwise (ops.def's
 * PYTORCH rows): what to write instead, or NULL. */
const char *ir_pytorch_hint(const char *name) {
  static const struct { const char *torch, *cplan; } rows[] = {
#define OP(id, name, sig, flags, shape, flops, shard)
#define PYTORCH(torch, cplan) {torch, cplan},
#include "ops.def"
#undef PYTORCH
#undef OP
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    if (strcmp(rows[i].torch, name) == 0) return rows[i].cplan;
  return NULL;
}

const char *const *ir_op_names(int *n) {
  static const char *names[OP__COUNT];
  static int count = -1;
  if (count < 0) {
    count = 0;
    for (int i = 0; i < OP__COUNT; i++)
      if (callable(&ir_ops[i])) names[count++] = ir_ops[i].name;
  }
  if (n) *n = count;
  return names;
}
