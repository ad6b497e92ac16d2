/* test_search.c: the strategy search (search.c).
 *   - CBC's ILP optimum equals exhaustive enumeration: on random problems (with and without a
 *     memory limit, including infeasible ones) and on the ILP of real small graphs (an MLP and one
 *     GPT layer's attention block) at 2 and 4 devices;
 *   - known answers: a small GPT on 8 devices is pure data parallelism; a model too big for one
 *     device gets a plan that fits; GPT-3 175B on 1,024 A100 80GB is feasible and fits;
 *   - pinned fields are respected;
 *   - bytes per device per step are what the programs send (pp crossings, the tied embedding's
 *     gradient per micro-batch, ZeRO's f32 gathers). */
#include "search.h"

#include <math.h>
#include <string.h>

#include "check.h"

static unsigned rng = 12345;
static double urand(void) {
  rng = rng * 1103515245u + 12345u;
  return (double)((rng >> 8) & 0xffff) / 65536.0;
}

static IlpProblem *random_problem(int nv, double limit_frac) {
  IlpProblem *p = cp_alloc(sizeof *p);
  p->nvars = nv;
  p->ncand = cp_alloc(sizeof(int) * (size_t)nv);
  p->cost = cp_alloc(sizeof(double *) * (size_t)nv);
  p->mem = cp_alloc(sizeof(double *) * (size_t)nv);
  double maxmem = 0;
  for (int v = 0; v < nv; v++) {
    p->ncand[v] = 1 + (int)(urand() * 4);
    p->cost[v] = cp_alloc(sizeof(double) * 4);
    p->mem[v] = cp_alloc(sizeof(double) * 4);
    double m = 0;
    for (int k = 0; k < p->ncand[v]; k++) {
      p->cost[v][k] = urand() * 1e-3;      /* seconds, as the search's */
      p->mem[v][k] = urand() * 1e9;        /* bytes */
      if (p->mem[v][k] > m) m = p->mem[v][k];
    }
    maxmem += m;
  }
  p->eu = cp_alloc(sizeof(int) * 32);
  p->ev = cp_alloc(sizeof(int) * 32);
  p->ecost = cp_alloc(sizeof(double *) * 32);
  for (int v = 1; v < nv; v++) /* a chain plus some random skips, as in a graph */
    for (int u = 0; u < v; u++) {
      if (u != v - 1 && urand() > 0.3) continue;
      int e = p->nedges++;
      p->eu[e] = u, p->ev[e] = v;
      p->ecost[e] = cp_alloc(sizeof(double) * 16);
      for (int k = 0; k < p->ncand[u] * p->ncand[v]; k++) p->ecost[e][k] = urand() < 0.4 ? 0 : urand() * 2e-3;
    }
  p->mem_limit = limit_frac > 0 ? limit_frac * maxmem : 0;
  return p;
}

static void test_random(void) {
  int infeasible = 0, limited = 0;
  for (int it = 0; it < 300; it++) {
    int nv = 2 + it % 6;
    double frac = it % 3 == 0 ? 0 : it % 3 == 1 ? 0.6 : 0.25;
    IlpProblem *p = random_problem(nv, frac);
    int a[16], b[16];
    double oa = 0, ob = 0;
    bool fa = srch_ilp_solve(p, a, &oa), fb = srch_ilp_brute(p, b, &ob);
    CHECK(fa == fb);
    if (fa && fb) CHECK(fabs(oa - ob) <= 1e-9 + 1e-7 * ob);
    if (fa && fb && fabs(oa - ob) > 1e-9 + 1e-7 * ob)
      fprintf(stderr, "  random problem %d: CBC %.9g, enumeration %.9g\n", it, oa, ob);
    infeasible += !fb;
    limited += frac > 0 && fb;
  }
  CHECK(infeasible > 0); /* the cases exercise both outcomes */
  CHECK(limited > 20);
}

/* ---- real graphs --------------------------------------------------------------------------- */

static Sema *sema_of(const char *text, TrainConf **t) {
  diag_reset();
  int file = src_add("test.cplan", text, strlen(text));
  Program *prog = parse_program_source(file);
  if (!prog || diag_errors()) return NULL;
  Sema *s = sema_new(prog);
  bool none = false;
  *t = settings_train(s, NULL, &none);
  return *t ? s : NULL;
}

static const char *MLP =
    "model m(C: int = 1024) {\n input x: f32[B, 256, C]\n input y: i32[B, 256]\n param w1: [C, 4 * C] = normal(0.02)\n"
    " param w2: [4 * C, C] = normal(0.02)\n h = gelu(x @ w1)\n loss = cross_entropy(h @ w2, y)\n}\n";

static const char *GPT =
    "import \"nn\"\n"
    "model m(vocab: int = 64, ctx: int = 16, C: int = 32, L: int = 2, heads: int = 4) {\n"
    " input idx: i32[B, ctx]\n input targets: i32[B, ctx]\n"
    " param wte: [vocab, C] = normal(0.02)\n param wpe: [ctx, C] = normal(0.02)\n"
    " x = embedding(wte, idx) + embedding(wpe, arange(ctx))\n"
    " for i in 0..L as \"h\" {\n  x = x + attention(layernorm(x, name = \"ln_1\"), heads, name = \"attn\")\n"
    "  x = x + mlp(layernorm(x, name = \"ln_2\"), name = \"mlp\")\n }\n"
    " logits = layernorm(x, name = \"ln_f\") @ transpose(wte)\n loss = cross_entropy(logits, targets)\n}\n";

static const char *train_text(const char *model, const char *mesh, const char *extra) {
  return cp_fmt("%s\nmesh box {\n %s\n}\ntrain {\n model = m()\n mesh = box\n data = adder(digits = 2)\n"
                " batch = 64\n steps = 1\n precision = bf16\n %s\n}\n", model, mesh, extra);
}

/* The ILP of a whole small graph: CBC equals enumeration (the MLP has few enough variables). */
static void test_graph_ilp(void) {
  TrainConf *t;
  Sema *s = sema_of(train_text(MLP, "shape = [gpu = 4]\n device = a100_80gb", "strategy = auto"), &t);
  CHECK(s != NULL);
  if (!s) return;
  Graph *g = sema_build_model(s, t->model, t->model_call, 4);
  CHECK(g != NULL);
  if (!g) return;
  CostModel cm;
  cost_init(&cm, t);
  for (int n = 2; n <= 4; n += 2) {
    IlpProblem *p = srch_graph_problem(g, &cm, n);
    double space = 1;
    for (int v = 0; v < p->nvars; v++) space *= p->ncand[v];
    CHECK(space > 100); /* a real choice, not a forced one */
    CHECK(space < 5e6);
    int a[64], b[64];
    double oa = 0, ob = 0;
    CHECK(p->nvars <= 64);
    bool fa = srch_ilp_solve(p, a, &oa), fb = srch_ilp_brute(p, b, &ob);
    CHECK(fa && fb);
    CHECK(fabs(oa - ob) <= 1e-12 + 1e-7 * ob);
    /* Sharding beats running whole on every device: the optimum is below the all-R choice. */
    int r[64] = {0};
    CHECK(ob < srch_ilp_cost(p, r));
    /* Under a memory limit just above the optimum's memory minus a bit, both agree again. */
    double mem = 0;
    for (int v = 0; v < p->nvars; v++) mem += p->mem[v][b[v]];
    p->mem_limit = mem * 0.9;
    fa = srch_ilp_solve(p, a, &oa), fb = srch_ilp_brute(p, b, &ob);
    CHECK(fa == fb);
    if (fa && fb) CHECK(fabs(oa - ob) <= 1e-12 + 1e-7 * ob);
  }
}

static SrchResult *plan_of(const char *model, const char *mesh, const char *extra) {
  TrainConf *t;
  Sema *s = sema_of(train_text(model, mesh, extra), &t);
  if (!s) return NULL;
  return srch_run(s, t, 5);
}

static void test_known_answers(void) {
  /* A small GPT on 8 GPUs: pure data parallelism. */
  SrchResult *r = plan_of(GPT, "shape = [gpu = 8]\n device = a100_80gb", "strategy = auto");
  CHECK(r && r->n > 0);
  if (r && r->n > 0) {
    const SrchPlan *p = &r->plans[0];
    CHECK(p->dp == 8 && p->tp == 1 && p->pp == 1);
    CHECK(p->mem_total <= r->memory);
  }
  /* The same with tp pinned: every plan keeps tp = 2, and the ILP splits its matmuls. */
  r = plan_of(GPT, "shape = [gpu = 8]\n device = a100_80gb", "strategy = { tp = 2, zero = 0 }");
  CHECK(r && r->n > 0);
  for (int i = 0; r && i < r->n; i++) CHECK(r->plans[i].tp == 2 && r->plans[i].dp * r->plans[i].pp == 4 && r->plans[i].zero == 0);
  /* A model that does not fit one device's 3 GiB unsharded gets a plan that fits on 8. */
  const char *dev = "device = { kind = cuda; memory = %s; flops = 100TFLOPS; hbm = 1TBps }";
  const char *big = "model m(C: int = 4096) {\n input x: f32[B, 16, C]\n input y: i32[B, 16]\n"
                    " param w1: [C, 4 * C] = normal(0.02)\n param w2: [4 * C, C] = normal(0.02)\n"
                    " param w3: [C, 4 * C] = normal(0.02)\n param w4: [4 * C, C] = normal(0.02)\n"
                    " h = gelu(x @ w1) @ w2\n h = gelu(h @ w3) @ w4\n loss = cross_entropy(h, y)\n}\n";
  r = plan_of(big, cp_fmt("shape = [gpu = 1]\n %s", cp_fmt(dev, "64GiB")), "strategy = auto");
  CHECK(r && r->n > 0);
  double one = r && r->n ? r->plans[r->n - 1].mem_total : 0; /* even the smallest of the top 5 */
  for (int i = 0; r && i < r->n; i++) one = r->plans[i].mem_total < one ? r->plans[i].mem_total : one;
  CHECK(one > 3.0 * (1 << 30));
  r = plan_of(big, cp_fmt("shape = [gpu = 8]\n %s", cp_fmt(dev, "3GiB")), "strategy = auto");
  CHECK(r && r->n > 0);
  if (r && r->n > 0) {
    CHECK(r->plans[0].mem_total <= 3.0 * (1 << 30));
    CHECK(r->plans[0].tp > 1 || r->plans[0].zero >= 1);
  }
}

/* Bytes per device per step as the programs send them (plan --explain, measured comm_bytes). */
static const SrchPlan *pinned(const char *mesh, const char *strategy) {
  SrchResult *r = plan_of(GPT, mesh, strategy);
  CHECK(r && r->n > 0);
  return r && r->n > 0 ? &r->plans[0] : NULL;
}

static void test_comm_bytes(void) {
  const char *two = "shape = [gpu = 2]\n device = a100_80gb";
  /* pp 2, 8 micro-batches of 8 samples: the last stage sends the residual stream's gradient (one
   * bf16 [8, 16, 32] tensor: pipeline.c sums its two contributions there) in every micro-batch's
   * backward, and the tied embedding's gradient contribution (f32 [64, 32]), accumulated over the
   * micro-batches, once a step (as the first stage sends the updated embedding back). */
  const SrchPlan *p = pinned(two, "strategy = { dp = 1, tp = 1, pp = 2, micro = 8, recompute = \"none\", pipeline = \"1f1b\" }");
  CHECK(p && p->microbatches == 8);
  if (p) CHECK(p->comm_bytes == 8.0 * 16 * 32 * 2 * 8 + 64.0 * 32 * 4);
  /* ZeRO 1 reduce-scatters the f32 gradients and all-gathers the updated f32 params: the bytes of
   * ZeRO 0's all-reduce. ZeRO 2 reduce-scatters after each of its m micro-batches. */
  const char *z = "strategy = { dp = 2, tp = 1, pp = 1, micro = 8, zero = %d, recompute = \"none\" }";
  const SrchPlan *z0 = pinned(two, cp_fmt(z, 0)), *z1 = pinned(two, cp_fmt(z, 1)), *z2 = pinned(two, cp_fmt(z, 2));
  if (z0 && z1 && z2) {
    CHECK(z0->comm_bytes > 0);
    CHECK(fabs(z1->comm_bytes - z0->comm_bytes) <= 1e-9 * z0->comm_bytes);
    CHECK(fabs(z2->comm_bytes - z0->comm_bytes * (double)(z2->microbatches + 1) / 2) <= 1e-9 * z0->comm_bytes);
  }
}

/* GPT-3 175B with a padded vocabulary (50304 = 393 x 128, as llm.c and Megatron pad it; tp 8
 * divides it): the embedding and the tied head split over tp. With 50257
 * rows they stay whole under tp, and their gradient is all-reduced over tp each micro-batch, which
 * the search prices as built: then dp 128 x tp 8 with ZeRO 3 wins, without pp. */
static void test_gpt3(void) {
  const char *model =
      "import \"nn\"\n"
      "model m(vocab: int = 50304, ctx: int = 2048, C: int = 12288, L: int = 96, heads: int = 96) {\n"
      " input idx: i32[B, ctx]\n input targets: i32[B, ctx]\n"
      " param wte: [vocab, C] = normal(0.02)\n param wpe: [ctx, C] = normal(0.02)\n"
      " x = embedding(wte, idx) + embedding(wpe, arange(ctx))\n"
      " for i in 0..L as \"h\" {\n  x = x + attention(layernorm(x, name = \"ln_1\"), heads, name = \"attn\")\n"
      "  x = x + mlp(layernorm(x, name = \"ln_2\"), name = \"mlp\")\n }\n"
      " logits = layernorm(x, name = \"ln_f\") @ transpose(wte)\n loss = cross_entropy(logits, targets)\n}\n";
  TrainConf *t;
  Sema *s = sema_of(cp_fmt("%s\nmesh box {\n shape = [node = 128, gpu = 8]\n device = a100_80gb\n}\ntrain {\n"
                           " model = m()\n mesh = box\n data = adder(digits = 2)\n batch = 1536\n steps = 1\n"
                           " precision = bf16\n strategy = auto\n}\n", model), &t);
  CHECK(s != NULL);
  if (!s) return;
  SrchResult *r = srch_run(s, t, 5);
  CHECK(r && r->n > 0);
  if (!r || r->n == 0) return;
  const SrchPlan *p = &r->plans[0];
  CHECK(r->layer_classes == 1);  /* 96 identical layers solved once */
  CHECK(p->dp * p->tp * p->pp == 1024);
  CHECK(p->mem_total <= 80e9);
  CHECK(p->tp > 1 && p->pp > 1); /* 175B needs model parallelism in both directions */
  CHECK(p->mfu > 0.2 && p->mfu < 0.75);
}

int main(void) {
  test_random();
  test_graph_ilp();
  test_known_answers();
  test_comm_bytes();
  test_gpt3();
  if (failures) fprintf(stderr, "%d check%s failed\n", failures, failures == 1 ? "" : "s");
  return failures != 0;
}
