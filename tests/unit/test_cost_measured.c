/* test_cost_measured.c: the cost model on a calibrated CPU profile (CostModel.meas, cost.c): the
 * GEMM curve interpolated by size, matmuls at the curve's efficiency for their size, norms,
 * softmax and elementwise ops at their kernels' measured bandwidth, the update at the elementwise
 * one, and collectives of the calibrated rank count at the fitted alpha + beta * bytes, only over
 * the profile's own link; without measurements, or on a GPU, the class factors as before. */
#include "cost.h"

#include <math.h>
#include <string.h>

#include "check.h"
#define NEAR(a, b) (fabs((a) - (b)) <= 1e-9 * fabs(b) + 1e-15)

static TrainConf *train_of(const char *mesh, Sema **sema) {
  diag_reset();
  const char *text = cp_fmt("model m() {\n input x: f32[B, 64, 256]\n param w: [256, 256] = normal(0.02)\n"
                            " param g: [256] = ones()\n param b: [256] = zeros()\n"
                            " y = gelu(softmax(layer_norm(x @ w, g, b)))\n loss = mean(y)\n}\nmesh box {\n %s\n}\n"
                            "train {\n model = m()\n mesh = box\n data = adder(digits = 2)\n batch = 8\n steps = 1\n"
                            " precision = f32\n}\n",
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

static DeviceMeasured measured(void) {
  DeviceMeasured m;
  memset(&m, 0, sizeof m);
  m.ngemm = 2;
  m.gemm[0] = (ProfilePoint){256, 1.0};
  m.gemm[1] = (ProfilePoint){1024, 0.5};
  m.eff_layer_norm = 1.2, m.eff_softmax = 0.6, m.eff_gelu = 0.5;
  m.coll_ranks = 2;
  m.coll[PC_ALL_REDUCE].alpha = 1e-5, m.coll[PC_ALL_REDUCE].beta = 2e-10, m.coll[PC_ALL_REDUCE].npoints = 1;
  m.coll[PC_ALL_REDUCE].points[0] = (ProfilePoint){1e6, 2.1e-4};
  return m;
}

static void test_gemm_curve(void) {
  DeviceMeasured m = measured();
  CHECK(NEAR(cost_gemm_eff(&m, 100), 1.0));   /* below the curve: its first point */
  CHECK(NEAR(cost_gemm_eff(&m, 256), 1.0));
  CHECK(NEAR(cost_gemm_eff(&m, 512), 0.75));  /* halfway in log n */
  CHECK(NEAR(cost_gemm_eff(&m, 1024), 0.5));
  CHECK(NEAR(cost_gemm_eff(&m, 8192), 0.5));  /* above: its last point */
  m.ngemm = 0;
  CHECK(NEAR(cost_gemm_eff(&m, 512), 0.75));  /* no curve: the matmul class factor */
}

static int find(const Graph *g, OpId op) {
  for (int i = 0; i < g->n; i++)
    if (g->nodes[i].op == op) return i;
  return -1;
}

/* max(flops / (peak * eff), bytes / (hbm * mem_eff)) + launch, as cost.c's roofline */
static double roofline(const CostModel *cm, const Graph *g, int i, double eff, double mem_eff) {
  const Node *n = &g->nodes[i];
  double bytes = cost_act_bytes(cm, g, i);
  for (int k = 0; k < n->nin; k++) bytes += cost_act_bytes(cm, g, n->in[k]);
  double tf = ir_node_flops(g, i) / (cm->peak * eff), tb = bytes / (cm->dev.hbm * mem_eff);
  return cm->launch + (tf > tb ? tf : tb);
}

static void test_nodes_and_collectives(void) {
  Sema *s;
  TrainConf *t = train_of("shape = [cpu = 2]\n device = cpu", &s);
  CHECK(t != NULL);
  if (!t) return;
  Graph *g = sema_build_model(s, t->model, t->model_call, 4); /* x @ w: 256 x 256 x 256 */
  CHECK(g != NULL);
  if (!g) return;
  int mm = find(g, OP_MATMUL), ln = find(g, OP_LAYER_NORM), sm = find(g, OP_SOFTMAX), ge = find(g, OP_GELU);
  CHECK(mm >= 0 && ln >= 0 && sm >= 0 && ge >= 0);
  if (mm < 0 || ln < 0 || sm < 0 || ge < 0) return;

  CostModel plain;
  cost_init(&plain, t);
  CHECK(plain.meas == NULL && plain.eff[CC_MEMORY] == 0.80);
  CHECK(NEAR(cost_node(&plain, g, mm, 1), roofline(&plain, g, mm, 0.75, 0.80)));

  DeviceMeasured m = measured();
  t->mesh->device.measured = &m;
  CostModel cm;
  cost_init(&cm, t);
  CHECK(cm.meas == &m);
  CHECK(cm.eff[CC_MEMORY] == 0.5); /* the elementwise kernel stands for the update */
  CHECK(NEAR(cost_node(&cm, g, mm, 1), roofline(&cm, g, mm, 1.0, 0.5)));  /* n = 256: the curve's 1.0 */
  /* split 8 ways: 256 x 256 x 32, the work of a 128^3 GEMM: below the curve, 1.0 */
  CHECK(NEAR(cost_node(&cm, g, mm, 8), cm.launch + (roofline(&cm, g, mm, 1.0, 0.5) - cm.launch) / 8));
  CHECK(NEAR(cost_node(&cm, g, ln, 1), roofline(&cm, g, ln, 0.5, 1.2)));
  CHECK(NEAR(cost_node(&cm, g, sm, 1), roofline(&cm, g, sm, 0.5, 0.6)));
  CHECK(NEAR(cost_node(&cm, g, ge, 1), roofline(&cm, g, ge, 0.5, 0.5)));
  CHECK(cost_node(&cm, g, ge, 1) > cost_node(&plain, g, ge, 1)); /* 0.5 of hbm, not 0.8 */

  CostLink l = cost_group_link(&cm, 1, 2);
  CHECK(l.bw == cm.dev.intra_bw && l.lat == cm.dev.intra_latency);
  CHECK(NEAR(cost_collective(&cm, COLL_ALL_REDUCE, 1e6, 2, l), 1e-5 + 2e-10 * 1e6)); /* the fit */
  CHECK(NEAR(cost_collective(&cm, COLL_ALL_REDUCE, 1e6, 4, l), cost_coll(COLL_ALL_REDUCE, 1e6, 4, l))); /* 4 ranks */
  CHECK(NEAR(cost_collective(&cm, COLL_ALL_GATHER, 1e6, 2, l), cost_coll(COLL_ALL_GATHER, 1e6, 2, l))); /* no points */
  CHECK(cost_collective(&cm, COLL_ALL_REDUCE, 0, 2, l) == 0);
  CostLink set = {l.bw / 2, l.lat}; /* a `link` setting overrides the measurement */
  CHECK(NEAR(cost_collective(&cm, COLL_ALL_REDUCE, 1e6, 2, set), cost_coll(COLL_ALL_REDUCE, 1e6, 2, set)));
  CHECK(NEAR(cost_collective(&plain, COLL_ALL_REDUCE, 1e6, 2, l), cost_coll(COLL_ALL_REDUCE, 1e6, 2, l)));
}

static void test_gpu_ignores(void) {
  Sema *s;
  TrainConf *t = train_of("shape = [gpu = 2]\n device = h100_sxm", &s);
  CHECK(t != NULL);
  if (!t) return;
  DeviceMeasured m = measured();
  t->mesh->device.measured = &m;
  CostModel cm;
  cost_init(&cm, t);
  CHECK(cm.meas == NULL && cm.eff[CC_MEMORY] == 0.80); /* the curves are CPU measurements */
}

int main(void) {
  test_gemm_curve();
  test_nodes_and_collectives();
  test_gpu_ignores();
  if (failures) fprintf(stderr, "%d check%s failed\n", failures, failures == 1 ? "" : "s");
  return failures != 0;
}
