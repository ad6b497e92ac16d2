/* test_lower.c: the SPMD lowering (compiler/lower.c) of a small GPT and a LLaMA-style model under
 * tp = 2, tp = 4 and dp = 2 x tp = 2: the per-rank graph passes ir_verify (every shape rule re-run
 * on local shapes), holds one collective node per collective strat_pin lists (the two agree), the
 * fused QKV weight gets the blocked layout, and shard elements map to the right global ones; a
 * vocabulary tp does not divide is padded (vocab_pad.c) and split. */
#include "lower.h"
#include "train.h"
#include "ast.h"

#include <string.h>

#include "check.h"

static const char *gpt_src =
    "fn layernorm(x: [*, C]) {\n param weight: [C] = ones\n param bias: [C] = zeros\n"
    " return layer_norm(x, weight, bias)\n}\n"
    "fn linear(x: [*, I], out: int) {\n param weight: [I, out] = normal(0.02)\n param bias: [out] = zeros\n"
    " return x @ weight + bias\n}\n"
    "fn attention(x: [B, T, C], heads: int) {\n"
    " q, k, v = split(linear(x, 3 * C, name = \"c_attn\"), 3, axis = -1)\n"
    " y = sdpa(split_heads(q, heads), split_heads(k, heads), split_heads(v, heads), causal = true)\n"
    " return linear(merge_heads(y), C, name = \"c_proj\")\n}\n"
    "fn mlp(x: [*, C]) {\n return linear(gelu(linear(x, 4 * C, name = \"c_fc\")), C, name = \"c_proj\")\n}\n"
    "model m(vocab: int = 16, ctx: int = 8, C: int = 16, L: int = 2, heads: int = 4) {\n"
    " input idx: i32[B, ctx]\n input targets: i32[B, ctx]\n"
    " param wte: [vocab, C] = normal(0.02)\n param wpe: [ctx, C] = normal(0.02)\n"
    " x = embedding(wte, idx) + embedding(wpe, arange(ctx))\n"
    " for i in 0..L as \"h\" {\n"
    "  x = x + attention(layernorm(x, name = \"ln_1\"), heads, name = \"attn\")\n"
    "  x = x + mlp(layernorm(x, name = \"ln_2\"), name = \"mlp\")\n }\n"
    " logits = layernorm(x, name = \"ln_f\") @ transpose(wte)\n"
    " loss = cross_entropy(logits, targets)\n}\n";

static const char *llama_src =
    "fn rmsnorm(x: [*, C]) {\n param weight: [C] = ones\n return rms_norm(x, weight)\n}\n"
    "fn linear(x: [*, I], out: int) {\n param weight: [I, out] = normal(0.2)\n return x @ weight\n}\n"
    "fn attention(x: [B, T, C], heads: int) {\n"
    " q = split_heads(linear(x, C, name = \"wq\"), heads)\n k = split_heads(linear(x, C, name = \"wk\"), heads)\n"
    " v = split_heads(linear(x, C, name = \"wv\"), heads)\n"
    " y = sdpa(rope(q), rope(k), v, causal = true)\n return linear(merge_heads(y), C, name = \"wo\")\n}\n"
    "fn swiglu(x: [*, C], hidden: int) {\n gate = silu(linear(x, hidden, name = \"w1\"))\n"
    " up = linear(x, hidden, name = \"w3\")\n return linear(gate * up, C, name = \"w2\")\n}\n"
    "model m(vocab: int = 16, ctx: int = 8, C: int = 16, L: int = 2, heads: int = 4, hidden: int = 32) {\n"
    " input idx: i32[B, ctx]\n input targets: i32[B, ctx]\n param tok: [vocab, C] = normal(0.5)\n"
    " x = embedding(tok, idx)\n for i in 0..L {\n"
    "  x = x + attention(rmsnorm(x, name = \"attention_norm\"), heads, name = \"attention\")\n"
    "  x = x + swiglu(rmsnorm(x, name = \"ffn_norm\"), hidden, name = \"feed_forward\")\n }\n"
    " logits = linear(rmsnorm(x, name = \"norm\"), vocab, name = \"output\")\n"
    " loss = cross_entropy(logits, targets)\n}\n";

/* Builds, places and lowers model src under `strategy` on a mesh of `devices` CPUs. */
static Lowered *lower(const char *src, const char *strategy, int devices, StratPlan **out) {
  diag_reset();
  const char *text = cp_fmt("%smesh box {\n shape = [cpu = %d]\n}\ntrain {\n model = m()\n mesh = box\n"
                            " data = adder(digits = 2)\n batch = 8\n steps = 2\n strategy = %s\n}\n",
                            src, devices, strategy);
  int file = src_add("test.cplan", text, strlen(text));
  Program *prog = parse_program_source(file);
  if (!prog || diag_errors()) return NULL;
  Sema *s = sema_new(prog);
  bool none = false;
  TrainConf *t = settings_train(s, NULL, &none);
  if (!t) return NULL;
  int64_t dp, tp, pp, micro;
  if (!strat_degrees(prog, t, &dp, &tp, &pp, &micro)) return NULL;
  TrainConf tc = *t;
  tc.strategy.dp = dp;
  tc.strategy.micro = micro;
  Graph *g = sema_build_model(s, t->model, t->model_call, dp * micro);
  if (!g || !train_graph(g, &tc)) return NULL;
  StratPlan *sp = strat_pin(prog, g, &tc);
  if (!sp) return NULL;
  *out = sp;
  char err[512] = "";
  Lowered *lw = lower_spmd(sp, err, sizeof err);
  if (!lw) fprintf(stderr, "%s: %s\n", strategy, err);
  return lw;
}

static int param(const Graph *g, const char *name) {
  for (int k = 0; k < g->params.n; k++)
    if (strcmp(g->nodes[g->params.a[k]].name, name) == 0) return g->params.a[k];
  return -1;
}

static int count_op(const Graph *g, OpId op) {
  int n = 0;
  for (int i = 0; i < g->n; i++) n += g->nodes[i].op == op;
  return n;
}

/* One collective node per collective of the plan (inner ones, like cross-entropy's, excepted; local
 * slices of whole values, which the plan does not list as they send nothing, too). */
static void check_colls(const StratPlan *sp, const Lowered *lw) {
  int want = 0;
  for (int i = 0; i < sp->colls.n; i++) want += sp->colls.a[i].what == NULL;
  CHECK(lw->ncolls - count_op(lw->g, OP_SHARD_SLICE) + lw->nruntime == want); /* the dp gradient reductions: the runtime's */
  bool dp = false;
  for (int a = 0; a < sp->naxes; a++) dp |= sp->axes[a].role == AX_DP;
  CHECK(dp == (lw->nruntime > 0));
  int have = count_op(lw->g, OP_ALL_REDUCE) + count_op(lw->g, OP_ALL_GATHER) + count_op(lw->g, OP_REDUCE_SCATTER) +
             count_op(lw->g, OP_ALL_TO_ALL) + count_op(lw->g, OP_SHARD_SLICE);
  CHECK(have == lw->ncolls);
}

static void test_gpt(int64_t tp, const char *strategy, int devices) {
  StratPlan *sp = NULL;
  Lowered *lw = lower(gpt_src, strategy, devices, &sp);
  CHECK(lw != NULL);
  if (!lw) return;
  const Graph *g = sp->g;
  int w = param(g, "h.0.attn.c_attn.weight"), b = param(g, "h.0.attn.c_attn.bias");
  int fc = param(g, "h.0.mlp.c_fc.weight"), pr = param(g, "h.0.attn.c_proj.weight");
  CHECK(w >= 0 && b >= 0 && fc >= 0 && pr >= 0);
  if (w < 0 || b < 0 || fc < 0 || pr < 0) return;
  const Node *lwn = &lw->g->nodes[lw->map[w]];
  CHECK(lwn->shape.rank == 2 && lwn->shape.d[0] == 16 && lwn->shape.d[1] == 48 / tp);
  CHECK(lw->g->nodes[lw->map[pr]].shape.d[0] == 16 / tp);      /* row-parallel */
  CHECK(lw->blocks[w] == 3 && lw->blocks[b] == 3 && lw->blocks[fc] == 1 && lw->blocks[pr] == 1);
  check_colls(sp, lw);
  CHECK(count_op(lw->g, OP_ALL_REDUCE) > 0);
  /* blocked layout: rank 1's column j of c_attn.weight [16, 48] */
  int64_t coord[3] = {0, 0, 0};
  coord[sp->naxes - 1] = 1;
  int64_t part = 16 / tp; /* columns of each of q, k, v per rank */
  CHECK(lower_global_index(sp, lw, w, coord, 0) == part);
  CHECK(lower_global_index(sp, lw, w, coord, part) == 16 + part);
  CHECK(lower_global_index(sp, lw, w, coord, 48 / tp) == 48 + part); /* row 1 */
  /* row-parallel c_proj.weight [16, 16]: rank 1 holds rows 16/tp .. */
  CHECK(lower_global_index(sp, lw, pr, coord, 0) == part * 16);
}

static void test_llama(int64_t tp, const char *strategy, int devices) {
  StratPlan *sp = NULL;
  Lowered *lw = lower(llama_src, strategy, devices, &sp);
  CHECK(lw != NULL);
  if (!lw) return;
  int wq = -1; /* the first layer's, whatever the loop's prefix */
  for (int k = 0; k < sp->g->params.n && wq < 0; k++)
    if (strstr(sp->g->nodes[sp->g->params.a[k]].name, "attention.wq.weight")) wq = sp->g->params.a[k];
  CHECK(wq >= 0);
  if (wq >= 0) {
    CHECK(lw->g->nodes[lw->map[wq]].shape.d[1] == 16 / tp);
    CHECK(lw->blocks[wq] == 1);
  }
  check_colls(sp, lw);
}

/* src with its vocabulary 16 made 15 */
static const char *vocab15(const char *src) {
  const char *at = strstr(src, "vocab: int = 16");
  if (!at) return src;
  return cp_fmt("%.*svocab: int = 15%s", (int)(at - src), src, at + strlen("vocab: int = 16"));
}

/* Exact vocabulary padding (vocab_pad.c): a vocabulary of 15 under tp = 2 pads the table to 16 rows
 * (vocab-parallel: 8 a rank) and llama's untied output head to 16 columns (column-parallel), each
 * with 15 valid, and masks the logits (a where before cross_entropy). */
static void test_vocab_pad(void) {
  CHECK(vocab_pad_rows(13, 2) == 14 && vocab_pad_rows(13, 4) == 16 && vocab_pad_rows(64, 4) == 64);
  CHECK(vocab_pad_rows(50257, 2) == 50304 && vocab_pad_rows(50257, 8) == 50304 && vocab_pad_rows(50257, 3) == 50304);
  CHECK(vocab_pad_rows(1025, 6) == 1152 && vocab_pad_rows(1025, 1) == 1025);
  StratPlan *sp = NULL;
  Lowered *lw = lower(vocab15(gpt_src), "{ tp = 2 }", 2, &sp);
  CHECK(lw != NULL);
  if (lw) {
    int wte = param(sp->g, "wte");
    const Node *n = &sp->g->nodes[wte];
    CHECK(n->shape.d[0] == 16 && n->ia[1] == 15 && n->ia[2] == 0);
    CHECK(sp->pl[wte].ax[0].kind == PL_S && sp->pl[wte].ax[0].dim == 0);
    CHECK(lw->g->nodes[lw->map[wte]].shape.d[0] == 8);
    CHECK(count_op(sp->g, OP_WHERE) == 1);
    check_colls(sp, lw);
  }
  lw = lower(vocab15(llama_src), "{ tp = 2 }", 2, &sp);
  CHECK(lw != NULL);
  if (lw) {
    int tok = param(sp->g, "tok"), out = param(sp->g, "output.weight");
    CHECK(tok >= 0 && out >= 0);
    if (tok < 0 || out < 0) return;
    CHECK(sp->g->nodes[tok].shape.d[0] == 16 && sp->g->nodes[tok].ia[1] == 15);
    const Node *o = &sp->g->nodes[out];
    CHECK(o->shape.d[1] == 16 && o->ia[1] == 15 && o->ia[2] == 1);
    CHECK(sp->pl[out].ax[0].kind == PL_S && sp->pl[out].ax[0].dim == 1);
    CHECK(lw->g->nodes[lw->map[out]].shape.d[1] == 8);
    check_colls(sp, lw);
  }
}

int main(void) {
  test_gpt(2, "{ tp = 2 }", 2);
  test_gpt(4, "{ tp = 4 }", 4);
  test_gpt(2, "{ dp = 2, tp = 2 }", 4);
  test_llama(2, "{ tp = 2 }", 2);
  test_llama(4, "{ tp = 4 }", 4);
  test_llama(2, "{ dp = 2, tp = 2 }", 4);
  test_vocab_pad();
  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
