/* test_placement.c: the resharding table (collective and bytes per device) and the sharding rules
 * of matmul, embedding, reductions (argmax's vocab-parallel one), sdpa, float, abs, clamp and where: each rule with a strategy it
 * accepts and one it rejects. */
#include "placement.h"

#include <math.h>
#include <string.h>

#include "check.h"

static int leaf(Graph *g, OpId op, Shape s, DType t) {
  int i = ir_add(g, op, NULL, 0, SPAN_NONE);
  g->nodes[i].shape = s;
  g->nodes[i].dtype = t;
  return i;
}

static int node(Graph *g, OpId op, const int *in, int nin) {
  int i = ir_add(g, op, in, nin, SPAN_NONE);
  char err[256];
  if (!ir_infer(g, i, err, sizeof err)) {
    fprintf(stderr, "shape: %s\n", err);
    failures++;
  }
  return i;
}

/* Runs node i's rule on (a, b, c) with n devices; returns validity, output in *out. */
static bool rule(const Graph *g, int i, int64_t n, Pl a, Pl b, Pl c, Pl *out) {
  Pl in[3] = {a, b, c};
  ShardIO io = {.in = in, .n = n};
  bool ok = shard_node(g, &g->nodes[i], &io);
  *out = io.out;
  return ok;
}

static void test_reshard(void) {
  CHECK(pl_reshard(pl_p(), pl_r()) == COLL_ALL_REDUCE);
  CHECK(pl_reshard(pl_p(), pl_s(1)) == COLL_REDUCE_SCATTER);
  CHECK(pl_reshard(pl_s(0), pl_r()) == COLL_ALL_GATHER);
  CHECK(pl_reshard(pl_s(0), pl_s(2)) == COLL_ALL_TO_ALL);
  CHECK(pl_reshard(pl_r(), pl_s(0)) == COLL_LOCAL_SLICE);
  CHECK(pl_reshard(pl_s(1), pl_s(1)) == COLL_NONE);
  CHECK(fabs(pl_coll_bytes(COLL_ALL_REDUCE, 1024, 4) - 1536) < 1e-9);    /* 2(n-1)/n */
  CHECK(fabs(pl_coll_bytes(COLL_ALL_GATHER, 1024, 4) - 768) < 1e-9);     /* (n-1)/n */
  CHECK(fabs(pl_coll_bytes(COLL_REDUCE_SCATTER, 1024, 4) - 768) < 1e-9);
  CHECK(fabs(pl_coll_bytes(COLL_ALL_TO_ALL, 1024, 4) - 192) < 1e-9);     /* (n-1)/n of a 256 B shard */
  CHECK(pl_coll_bytes(COLL_LOCAL_SLICE, 1024, 4) == 0);
  CHECK(pl_coll_bytes(COLL_ALL_REDUCE, 1024, 1) == 0);
  Placement p = {2, {pl_s(0), pl_r()}};
  CHECK(strcmp(placement_str(&p), "[S(0), R]") == 0);
}

static void test_matmul(void) {
  Graph *g = ir_new("t");
  int x = leaf(g, OP_INPUT, (Shape){3, {4, 8, 16}}, DT_F32), w = leaf(g, OP_PARAM, (Shape){2, {16, 32}}, DT_F32);
  int mm = node(g, OP_MATMUL, (int[]){x, w}, 2);
  Pl o;
  CHECK(rule(g, mm, 2, pl_s(0), pl_r(), pl_r(), &o) && pl_eq(o, pl_s(0)));  /* batch split */
  CHECK(rule(g, mm, 2, pl_s(1), pl_r(), pl_r(), &o) && pl_eq(o, pl_s(1)));  /* row split */
  CHECK(rule(g, mm, 2, pl_r(), pl_s(1), pl_r(), &o) && pl_eq(o, pl_s(2)));  /* column-parallel */
  CHECK(rule(g, mm, 2, pl_s(2), pl_s(0), pl_r(), &o) && o.kind == PL_P);    /* row-parallel */
  CHECK(rule(g, mm, 2, pl_p(), pl_r(), pl_r(), &o) && o.kind == PL_P);
  CHECK(!rule(g, mm, 2, pl_s(0), pl_s(1), pl_r(), &o));                      /* two dims on one axis */
  CHECK(!rule(g, mm, 2, pl_p(), pl_p(), pl_r(), &o));
  CHECK(!rule(g, mm, 3, pl_r(), pl_s(1), pl_r(), &o));                       /* 3 does not divide 32 */
  Pl ins[64 * 2], outs[64];
  int k = shard_candidates(g, &g->nodes[mm], 2, ins, outs, 64);
  CHECK(k >= 6); /* R, batch, row, column, reduction (and its sliced forms), partial */
}

static void test_embedding(void) {
  Graph *g = ir_new("t");
  int t = leaf(g, OP_PARAM, (Shape){2, {64, 16}}, DT_F32), idx = leaf(g, OP_INPUT, (Shape){2, {4, 8}}, DT_I32);
  int e = node(g, OP_EMBEDDING, (int[]){t, idx}, 2);
  Pl o;
  CHECK(rule(g, e, 2, pl_s(0), pl_r(), pl_r(), &o) && o.kind == PL_P);       /* vocab-parallel */
  CHECK(rule(g, e, 2, pl_r(), pl_s(0), pl_r(), &o) && pl_eq(o, pl_s(0)));   /* data-parallel */
  CHECK(rule(g, e, 2, pl_s(1), pl_r(), pl_r(), &o) && pl_eq(o, pl_s(2)));
  CHECK(!rule(g, e, 2, pl_s(0), pl_s(0), pl_r(), &o));
  CHECK(!rule(g, e, 2, pl_r(), pl_p(), pl_r(), &o));
  CHECK(!rule(g, e, 3, pl_s(0), pl_r(), pl_r(), &o));                        /* 3 does not divide 64 */
}

static void test_reduce(void) {
  Graph *g = ir_new("t");
  int x = leaf(g, OP_INPUT, (Shape){3, {4, 8, 16}}, DT_F32);
  int s = ir_add(g, OP_SUM, (int[]){x}, 1, SPAN_NONE);
  g->nodes[s].dims[0] = 2, g->nodes[s].ndims = 1;
  char err[128];
  CHECK(ir_infer(g, s, err, sizeof err));
  int m = ir_add(g, OP_MAX, (int[]){x}, 1, SPAN_NONE);
  g->nodes[m].dims[0] = 2, g->nodes[m].ndims = 1;
  CHECK(ir_infer(g, m, err, sizeof err));
  Pl o;
  CHECK(rule(g, s, 2, pl_s(2), pl_r(), pl_r(), &o) && o.kind == PL_P);    /* S on the reduced dim */
  CHECK(rule(g, s, 2, pl_s(0), pl_r(), pl_r(), &o) && pl_eq(o, pl_s(0)));
  CHECK(rule(g, s, 2, pl_p(), pl_r(), pl_r(), &o) && o.kind == PL_P);
  CHECK(!rule(g, m, 2, pl_s(2), pl_r(), pl_r(), &o));                    /* no max-reduce */
  CHECK(!rule(g, m, 2, pl_p(), pl_r(), pl_r(), &o));
}

/* argmax of the split last dim: vocab-parallel, whole output and an all-gather of two floats per
 * row inside the op (4 x 8 rows, 2 devices: each sends its 32 x 2 x 4 bytes); of a split dim that is
 * not the last, or of partial sums, it needs the whole tensor. */
static void test_argmax(void) {
  Graph *g = ir_new("t");
  int x = leaf(g, OP_INPUT, (Shape){3, {4, 8, 16}}, DT_F32);
  int a = ir_add(g, OP_ARGMAX, (int[]){x}, 1, SPAN_NONE), b = ir_add(g, OP_ARGMAX, (int[]){x}, 1, SPAN_NONE);
  g->nodes[a].ia[0] = -1, g->nodes[b].ia[0] = 1;
  char err[128];
  CHECK(ir_infer(g, a, err, sizeof err) && ir_infer(g, b, err, sizeof err));
  Pl in[1] = {pl_s(2)};
  ShardIO io = {.in = in, .n = 2};
  CHECK(shard_node(g, &g->nodes[a], &io) && pl_eq(io.out, pl_r()));
  CHECK(io.extra && io.extra_coll == COLL_ALL_GATHER && fabs(io.extra_bytes - 32 * 2 * 4) < 1e-9);
  Pl o;
  CHECK(rule(g, a, 2, pl_s(0), pl_r(), pl_r(), &o) && pl_eq(o, pl_s(0)));
  CHECK(!rule(g, a, 3, pl_s(2), pl_r(), pl_r(), &o));                    /* 3 does not divide 16 */
  CHECK(!rule(g, a, 2, pl_p(), pl_r(), pl_r(), &o));
  CHECK(!rule(g, b, 2, pl_s(1), pl_r(), pl_r(), &o));                    /* not the last dim */
  CHECK(rule(g, b, 2, pl_s(2), pl_r(), pl_r(), &o) && pl_eq(o, pl_s(1)));
}

static void test_sdpa(void) {
  Graph *g = ir_new("t");
  Shape s = {4, {2, 4, 8, 16}};
  int q = leaf(g, OP_INPUT, s, DT_F32), k = leaf(g, OP_INPUT, s, DT_F32), v = leaf(g, OP_INPUT, s, DT_F32);
  int a = node(g, OP_SDPA, (int[]){q, k, v}, 3);
  Pl o;
  CHECK(rule(g, a, 2, pl_s(1), pl_s(1), pl_s(1), &o) && pl_eq(o, pl_s(1))); /* heads */
  CHECK(rule(g, a, 2, pl_s(0), pl_s(0), pl_s(0), &o) && pl_eq(o, pl_s(0))); /* batch */
  CHECK(!rule(g, a, 2, pl_s(1), pl_r(), pl_s(1), &o));
  CHECK(!rule(g, a, 2, pl_s(3), pl_s(3), pl_s(3), &o));                     /* head dim */
  CHECK(!rule(g, a, 3, pl_s(1), pl_s(1), pl_s(1), &o));                     /* 3 does not divide 4 heads */
  /* with a key mask [B, Tk]: split with the batch, whole under a heads split */
  int km = leaf(g, OP_INPUT, (Shape){2, {2, 8}}, DT_F32);
  int m = node(g, OP_SDPA, (int[]){q, k, v, km}, 4);
  Pl in[4] = {pl_s(0), pl_s(0), pl_s(0), pl_s(0)};
  ShardIO io = {.in = in, .n = 2};
  CHECK(shard_node(g, &g->nodes[m], &io) && pl_eq(io.out, pl_s(0)));
  in[3] = pl_r();
  CHECK(!shard_node(g, &g->nodes[m], &io) && pl_eq(io.want[3], pl_s(0)) && strstr(io.why, "key mask"));
  in[0] = in[1] = in[2] = pl_s(1);
  CHECK(shard_node(g, &g->nodes[m], &io) && pl_eq(io.out, pl_s(1)));
  in[3] = pl_s(0);
  CHECK(!shard_node(g, &g->nodes[m], &io) && pl_eq(io.want[3], pl_r()));
  in[0] = in[1] = in[2] = pl_r();
  CHECK(!shard_node(g, &g->nodes[m], &io));
  in[3] = pl_r();
  CHECK(shard_node(g, &g->nodes[m], &io) && pl_eq(io.out, pl_r()));
}

/* float (i32 -> f32): elementwise, so splits pass through; partial sums of integers do not (they are
 * reduced in i32 first, as comparisons want theirs). */
static void test_float(void) {
  Graph *g = ir_new("t");
  int x = leaf(g, OP_INPUT, (Shape){2, {4, 8}}, DT_I32);
  int f = node(g, OP_FLOAT, (int[]){x}, 1);
  Pl o;
  CHECK(g->nodes[f].dtype == DT_F32);
  CHECK(rule(g, f, 2, pl_s(0), pl_r(), pl_r(), &o) && pl_eq(o, pl_s(0)));
  CHECK(rule(g, f, 2, pl_s(1), pl_r(), pl_r(), &o) && pl_eq(o, pl_s(1)));
  CHECK(rule(g, f, 2, pl_r(), pl_r(), pl_r(), &o) && pl_eq(o, pl_r()));
  CHECK(!rule(g, f, 2, pl_p(), pl_r(), pl_r(), &o));
  CHECK(!rule(g, f, 3, pl_s(1), pl_r(), pl_r(), &o)); /* 3 does not divide 8 */
}

/* abs, clamp_min/clamp_max and where are elementwise but not linear: splits pass through (a
 * broadcast cond or branch replicated), partial sums do not (|p1 + p2| is not |p1| + |p2|, and
 * where(c, P, 5) would add the 5 once per device). */
static void test_abs_clamp_where(void) {
  Graph *g = ir_new("t");
  int x = leaf(g, OP_INPUT, (Shape){2, {4, 8}}, DT_F32);
  int q = leaf(g, OP_INPUT, (Shape){1, {8}}, DT_F32); /* a cond broadcast along dim 0 */
  int five = leaf(g, OP_CONST, (Shape){0}, DT_F32);
  int ab = node(g, OP_ABS, (int[]){x}, 1), cl = node(g, OP_CLAMP_MIN, (int[]){x}, 1);
  int w = node(g, OP_WHERE, (int[]){q, x, five}, 3);
  Pl o;
  for (int k = 0; k < 2; k++) {
    int u = k ? cl : ab;
    CHECK(rule(g, u, 2, pl_s(1), pl_r(), pl_r(), &o) && pl_eq(o, pl_s(1)));
    CHECK(!rule(g, u, 2, pl_p(), pl_r(), pl_r(), &o));
  }
  CHECK(g->nodes[w].dtype == DT_F32 && g->nodes[w].shape.rank == 2);
  CHECK(rule(g, w, 2, pl_r(), pl_s(0), pl_r(), &o) && pl_eq(o, pl_s(0)));    /* rows split, cond replicated */
  CHECK(rule(g, w, 2, pl_s(0), pl_s(1), pl_r(), &o) && pl_eq(o, pl_s(1)));   /* cond's dim 0 is output dim 1 */
  CHECK(!rule(g, w, 2, pl_s(0), pl_s(0), pl_r(), &o));                        /* different output dims */
  CHECK(!rule(g, w, 2, pl_r(), pl_p(), pl_r(), &o));                          /* where(c, P, 5) */
  CHECK(!rule(g, w, 2, pl_r(), pl_p(), pl_p(), &o));
  CHECK(!rule(g, w, 3, pl_r(), pl_s(1), pl_r(), &o));                         /* 3 does not divide 8 */
}

int main(void) {
  test_reshard();
  test_matmul();
  test_embedding();
  test_reduce();
  test_argmax();
  test_sdpa();
  test_float();
  test_abs_clamp_where();
  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  else printf("test_placement: ok\n");
  return failures ? 1 : 0;
}
