/* test_cost.c: the cost model (cost.c): the pipeline bubble and in-flight micro-batches of each
 * schedule, the alpha-beta collectives (ring against tree), which links a device group uses on a
 * two-level mesh, the roofline of a matmul (compute-bound) and of an elementwise op (memory-bound),
 * and the per-param bytes of mixed precision with AdamW. */
#include "cost.h"

#include <math.h>
#include <string.h>

#include "check.h"
#define NEAR(a, b) (fabs((a) - (b)) <= 1e-9 * fabs(b) + 1e-15)

static void test_pipeline(void) {
  CHECK(cost_bubble(PS_1F1B, 1, 8, 1) == 0);
  CHECK(NEAR(cost_bubble(PS_1F1B, 4, 8, 1), 3.0 / 11));
  CHECK(NEAR(cost_bubble(PS_GPIPE, 4, 8, 1), 3.0 / 11));
  CHECK(NEAR(cost_bubble(PS_INTERLEAVED, 4, 8, 2), 1.5 / 9.5));
  CHECK(cost_inflight(PS_1F1B, 4, 0, 8, 1) == 4);   /* 1F1B: stage 0 holds pp micro-batches */
  CHECK(cost_inflight(PS_1F1B, 4, 3, 8, 1) == 1);   /* the last stage one */
  CHECK(cost_inflight(PS_GPIPE, 4, 3, 8, 1) == 8);  /* GPipe: all of them */
  CHECK(cost_inflight(PS_1F1B, 4, 0, 2, 1) == 2);   /* never more than there are */
  CHECK(NEAR(cost_inflight(PS_INTERLEAVED, 4, 0, 8, 2), 4 + 1.5));
}

static void test_collectives(void) {
  CostLink l = {100e9, 0};
  double S = 1e9;
  CHECK(NEAR(cost_coll(COLL_ALL_REDUCE, S, 8, l), 2 * 7.0 / 8 * S / 100e9)); /* no latency: the ring */
  CHECK(NEAR(cost_coll(COLL_ALL_GATHER, S, 8, l), 7.0 / 8 * S / 100e9));
  CHECK(NEAR(cost_coll(COLL_REDUCE_SCATTER, S, 8, l), 7.0 / 8 * S / 100e9));
  CHECK(cost_coll(COLL_LOCAL_SLICE, S, 8, l) == 0);
  CHECK(cost_coll(COLL_ALL_REDUCE, S, 1, l) == 0);
  CostLink slow = {100e9, 1e-3};
  /* small messages on a high-latency link: the tree's log2(n) latency beats the ring's n - 1 */
  double t = cost_coll(COLL_ALL_REDUCE, 1024, 64, slow);
  CHECK(NEAR(t, 2 * 6 * 1e-3 + 2 * 1024 / 100e9));
  CHECK(t < 2 * 63 * 1e-3);
  CHECK(NEAR(cost_p2p(1e9, l), 1e-2));
}

static TrainConf *train_of(const char *mesh, Sema **sema) {
  diag_reset();
  const char *text = cp_fmt("model m() {\n input x: f32[B, 1024, 4096]\n param w: [4096, 4096] = normal(0.02)\n"
                            " y = gelu(x @ w)\n loss = mean(y)\n}\nmesh box {\n %s\n}\ntrain {\n model = m()\n"
                            " mesh = box\n data = adder(digits = 2)\n batch = 16\n steps = 1\n precision = bf16\n}\n",
                            mesh);
  int file = src_add("test.cplan", text, strlen(text));
  Program *prog = parse_program_source(file);
  if (!prog || diag_errors()) return NULL;
  Sema *s = sema_new(prog);
  bool none = false;
  TrainConf *t = settings_train(s, NULL, &none);
  *sema = s;
  return t;
}

static void test_links(void) {
  Sema *s;
  TrainConf *t = train_of("shape = [node = 2, gpu = 8]\n device = a100_80gb", &s);
  CHECK(t != NULL);
  if (!t) return;
  CostModel cm;
  cost_init(&cm, t);
  CostLink in = cost_group_link(&cm, 1, 8), across = cost_group_link(&cm, 8, 2), all = cost_group_link(&cm, 1, 16);
  CostLink strided = cost_group_link(&cm, 2, 4);
  CHECK(in.bw == 300e9 && in.lat == 2e-6);        /* NVLink (devices.def) */
  CHECK(across.bw == 25e9 && across.lat == 5e-6); /* InfiniBand */
  CHECK(all.bw == 25e9);                          /* the slowest link spanned */
  CHECK(strided.bw == 300e9);                     /* ranks 0, 2, 4, 6: one node */
  /* mixed precision with AdamW: f32 master + bf16 copy, f32 grads, two f32 moments */
  CHECK(cm.w_bytes == 6 && cm.g_bytes == 4 && cm.o_bytes == 8 && cm.act_size == 2);
  CHECK(cm.peak == 312e12);
}

static void test_roofline(void) {
  Sema *s;
  TrainConf *t = train_of("shape = [gpu = 8]\n device = a100_80gb", &s);
  CHECK(t != NULL);
  if (!t) return;
  Graph *g = sema_build_model(s, t->model, t->model_call, 4);
  CHECK(g != NULL);
  if (!g) return;
  CostModel cm;
  cost_init(&cm, t);
  int mm = -1, ge = -1;
  for (int i = 0; i < g->n; i++) {
    if (g->nodes[i].op == OP_MATMUL) mm = i;
    if (g->nodes[i].op == OP_GELU) ge = i;
  }
  CHECK(mm >= 0 && ge >= 0);
  if (mm < 0 || ge < 0) return;
  double flops = 2.0 * 4 * 1024 * 4096 * 4096;
  CHECK(NEAR(cost_node(&cm, g, mm, 1), cm.launch + flops / (312e12 * 0.75)));          /* compute-bound */
  CHECK(NEAR(cost_node(&cm, g, mm, 8), cm.launch + flops / 8 / (312e12 * 0.75)));      /* split 8 ways */
  double bytes = 2.0 * 4 * 1024 * 4096 * 2;                                              /* in + out at bf16 */
  CHECK(NEAR(cost_node(&cm, g, ge, 1), cm.launch + bytes / (2.039e12 * 0.80)));          /* memory-bound */
  CHECK(cost_class(g, mm) == CC_MATMUL && cost_class(g, ge) == CC_MEMORY);
}

int main(void) {
  test_pipeline();
  test_collectives();
  test_links();
  test_roofline();
  if (failures) fprintf(stderr, "%d check%s failed\n", failures, failures == 1 ? "" : "s");
  return failures != 0;
}
