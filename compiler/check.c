/* check.c: the report of `cplanc check`: what the model is (params, FLOPs,
 * activation memory, per layer), where it runs (the mesh) and what the plan asks
 * for (batch, steps, optimizer, total FLOPs, a rough time). Two forms: text for a
 * person, and one JSON object for tools. Both read the same Stats.
 *
 * The graph was built with B = g->batch; every per-sample figure divides by it. */
#include "check.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

/* Figures of one row of the layer table. */
typedef struct LayerStats {
  const char *name;   /* "h.0", "(pre)", "(post)" */
  int64_t params;
  double flops;       /* per sample */
  double act_bytes;   /* per sample */
} LayerStats;

typedef struct ScopeStats {
  const char *name;   /* first component of a param path */
  int64_t params;
} ScopeStats;

typedef struct Stats {
  const char *file;      /* the .cplan file of the model, or NULL */
  int64_t params;
  int ntensors;
  VEC(ScopeStats) scopes;
  double flops;          /* forward FLOPs per sample */
  int64_t seq;           /* dim 1 of the first input, 0 when it has none */
  double act_bytes;      /* forward intermediates per sample */
  DType act_dtype;       /* the compute dtype they are counted at */
  VEC(LayerStats) layers;/* (pre), each layer, (post) */
  double peak;           /* peak FLOP/s per device at the plan's precision, 0 without a mesh */
  double train_flops;    /* 3 x forward x batch x steps, 0 without a plan */
  double est_seconds;    /* at 50% of peak on every device */
} Stats;

static DType compute_dtype(const TrainConf *t) {
  if (!t) return DT_F32;
  return t->precision == PREC_BF16 ? DT_BF16 : t->precision == PREC_F16 ? DT_F16 : DT_F32;
}

/* Output bytes of a node at the compute dtype (integer tensors keep theirs). */
static double node_act_bytes(const Node *n, DType dt) {
  DType t = n->dtype == DT_I32 ? DT_I32 : dt;
  return (double)shape_numel(&n->shape) * (double)dtype_size(t);
}

static const char *scope_of(const char *path) {
  const char *dot = strchr(path, '.');
  return dot ? cp_strndup(path, (size_t)(dot - path)) : path;
}

static void stats_params(const Graph *g, Stats *st) {
  for (int i = 0; i < g->params.n; i++) {
    const Node *n = &g->nodes[g->params.a[i]];
    int64_t c = shape_numel(&n->shape);
    st->params += c;
    st->ntensors++;
    const char *sc = scope_of(n->name ? n->name : "?");
    int j = 0;
    while (j < st->scopes.n && strcmp(st->scopes.a[j].name, sc) != 0) j++;
    if (j == st->scopes.n) VEC_PUSH(st->scopes, ((ScopeStats){sc, 0}));
    st->scopes.a[j].params += c;
  }
}

/* The layer table: rows for nodes outside loops before the first layer
 * ("(pre)") and after it ("(post)"), one row per layer between. */
static void stats_layers(const Graph *g, Stats *st, double per) {
  int nl = g->layer_names.n, first = -1;
  for (int i = 0; i < g->n && first < 0; i++)
    if (g->nodes[i].layer >= 0) first = i;
  LayerStats *rows = cp_alloc(sizeof *rows * (size_t)(nl + 2));
  rows[0].name = "(pre)";
  rows[nl + 1].name = "(post)";
  for (int l = 0; l < nl; l++) rows[l + 1].name = g->layer_names.a[l];
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (n->role != ROLE_FWD) continue;
    int r = n->layer >= 0 && n->layer < nl ? n->layer + 1 : (first < 0 || i < first) ? 0 : nl + 1;
    if (n->op == OP_PARAM) rows[r].params += shape_numel(&n->shape);
    rows[r].flops += ir_node_flops(g, i) / per;
    if (!(ir_ops[n->op].flags & OPF_LEAF)) rows[r].act_bytes += node_act_bytes(n, st->act_dtype) / per;
  }
  for (int r = 0; r < nl + 2; r++) {
    bool empty = rows[r].params == 0 && rows[r].flops == 0 && rows[r].act_bytes == 0;
    if ((r == 0 || r == nl + 1) && empty) continue;
    VEC_PUSH(st->layers, rows[r]);
  }
}

static Stats stats_compute(const Graph *g, const TrainConf *t, const MeshConf *m) {
  Stats st;
  memset(&st, 0, sizeof st);
  double per = g->batch > 0 ? (double)g->batch : 1.0;
  st.act_dtype = compute_dtype(t);
  if (t && t->model && t->model->file >= 0) st.file = src_path(t->model->file);
  for (int i = 0; i < g->n && !st.file; i++)
    if (g->nodes[i].span.file >= 0) st.file = src_path(g->nodes[i].span.file);
  stats_params(g, &st);
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (n->role != ROLE_FWD) continue;
    st.flops += ir_node_flops(g, i) / per;
    if (!(ir_ops[n->op].flags & OPF_LEAF)) st.act_bytes += node_act_bytes(n, st.act_dtype) / per;
  }
  st.seq = ir_seq_len(g);
  stats_layers(g, &st, per);
  if (m) st.peak = t && t->precision != PREC_F32 ? m->device.flops_bf16 : m->device.flops_f32;
  if (t) {
    st.train_flops = 3.0 * st.flops * (double)t->batch * (double)t->steps;
    if (m && st.peak > 0) st.est_seconds = st.train_flops / (0.5 * st.peak * (double)m->ndevices);
  }
  return st;
}

/* ---- text ---------------------------------------------------------------------- */

/* 10745088 -> "10.75M": a short count next to the exact one. */
static const char *short_count(double v) {
  if (v < 1e3) return cp_fmt("%.0f", v);
  if (v < 1e6) return cp_fmt("%.2fK", v / 1e3);
  if (v < 1e9) return cp_fmt("%.2fM", v / 1e6);
  if (v < 1e12) return cp_fmt("%.2fB", v / 1e9);
  return cp_fmt("%.2fT", v / 1e12);
}

static const char *duration_str(double s) {
  if (s < 1) return "under a second";
  if (s < 120) return cp_fmt("%.0f s", s);
  if (s < 7200) return cp_fmt("%.0f min", s / 60);
  if (s < 172800) return cp_fmt("%.1f h", s / 3600);
  return cp_fmt("%.1f days", s / 86400);
}

static const char *time_str(double s) {
  if (s < 1e-6) return cp_fmt("%.0f ns", s * 1e9);
  if (s < 1e-3) return cp_fmt("%.3g us", s * 1e6);
  if (s < 1) return cp_fmt("%.3g ms", s * 1e3);
  return cp_fmt("%.3g s", s);
}

static const char *optimizer_str(const OptimizerConf *o) {
  switch (o->kind) {
  case OPT_SGD:
    return cp_fmt("sgd(lr = %g, momentum = %g, weight_decay = %g%s)", o->lr, o->momentum, o->weight_decay,
                  o->nesterov ? ", nesterov = true" : "");
  case OPT_ADAMW:
  case OPT_LAMB:
    return cp_fmt("%s(lr = %g, betas = (%g, %g), eps = %g, weight_decay = %g)", optimizer_name(o->kind), o->lr,
                  o->beta1, o->beta2, o->eps, o->weight_decay);
  case OPT_LARS:
    return cp_fmt("lars(lr = %g, momentum = %g, weight_decay = %g, trust = %g)", o->lr, o->momentum,
                  o->weight_decay, o->trust);
  }
  return "?";
}

static const char *schedule_str(const ScheduleConf *s) {
  switch (s->kind) {
  case SCHED_CONSTANT: return "constant";
  case SCHED_COSINE: return cp_fmt("cosine(warmup = %lld, min_lr = %g)", (long long)s->warmup, s->end_lr);
  case SCHED_LINEAR: return cp_fmt("linear(warmup = %lld, end_lr = %g)", (long long)s->warmup, s->end_lr);
  }
  return "?";
}

static const char *strategy_str(const StrategyConf *st) {
  if (st->is_auto) return "auto (everything searched)";
  static const char *const rc[] = {"none", "selective", "full"};
  static const char *const ps[] = {"1f1b", "gpipe", "interleaved"};
  StrBuf b = {0};
  const char *const names[] = {"dp", "tp", "pp", "sp", "micro"};
  const int64_t v[] = {st->dp, st->tp, st->pp, st->sp, st->micro};
  for (int i = 0; i < 5; i++)
    if (v[i] > 0) sb_printf(&b, "%s%s = %lld", b.len ? ", " : "", names[i], (long long)v[i]);
  if (st->zero >= 0) sb_printf(&b, "%szero = %lld", b.len ? ", " : "", (long long)st->zero);
  if (st->recompute != RC_SEARCH) sb_printf(&b, "%srecompute = \"%s\"", b.len ? ", " : "", rc[st->recompute]);
  if (st->pipeline != PS_SEARCH) sb_printf(&b, "%spipeline = \"%s\"", b.len ? ", " : "", ps[st->pipeline]);
  return cp_fmt("{ %s } (the rest searched)", sb_str(&b));
}

static const char *data_str(const DataConf *d) {
  switch (d->kind) {
  case DATA_ADDER: return cp_fmt("adder(digits = %lld)", (long long)d->digits);
  case DATA_TOKENS:
  case DATA_TENSORS:
    return cp_fmt("%s %s%s%s%s", d->kind == DATA_TOKENS ? "tokens" : "tensors", d->path ? d->path : "?",
                  d->val_path ? " (val " : "", d->val_path ? d->val_path : "", d->val_path ? ")" : "");
  }
  return "?";
}

static const char *axes_str(const MeshConf *m) {
  StrBuf b = {0};
  for (int i = 0; i < m->naxes; i++)
    sb_printf(&b, "%s%s = %lld", i ? ", " : "", m->axes[i].name, (long long)m->axes[i].size);
  return cp_fmt("[%s]", sb_str(&b));
}

static void pct(FILE *out, double part, double whole) {
  if (whole > 0) fprintf(out, "  %5.1f%%", 100.0 * part / whole);
}

static void text_model(FILE *out, const Graph *g, const Stats *st) {
  fprintf(out, "model %s%s%s%s\n\n", g->model_name ? g->model_name : "?", st->file ? "  (" : "",
          st->file ? st->file : "", st->file ? ")" : "");
  const char *approx = st->params >= 1000 ? cp_fmt(" (%s)", short_count((double)st->params)) : "";
  fprintf(out, "  %-16s %s%s in %d tensor%s\n", "parameters", cp_commas(st->params), approx, st->ntensors,
          st->ntensors == 1 ? "" : "s");
  int w = 0;
  for (int i = 0; i < st->scopes.n; i++) w = (int)fmax(w, (double)strlen(st->scopes.a[i].name));
  for (int i = 0; i < st->scopes.n; i++) {
    fprintf(out, "    %-*s %16s", w, st->scopes.a[i].name, cp_commas(st->scopes.a[i].params));
    pct(out, (double)st->scopes.a[i].params, (double)st->params);
    fputc('\n', out);
  }
  fprintf(out, "  %-16s %s per sample", "forward FLOPs", cp_si_str(st->flops, "FLOP"));
  if (st->seq > 0)
    fprintf(out, ", %s per token (T = %lld)", cp_si_str(st->flops / (double)st->seq, "FLOP"), (long long)st->seq);
  fputc('\n', out);
  fprintf(out, "  %-16s %s per sample at %s\n", "activations", cp_bytes_str(st->act_bytes), dtype_name(st->act_dtype));
  fprintf(out, "  %-16s (all forward intermediates kept for the backward pass, before fusion and recompute)\n", "");
}

static void text_layers(FILE *out, const Stats *st) {
  int w = 5;
  for (int i = 0; i < st->layers.n; i++) w = (int)fmax(w, (double)strlen(st->layers.a[i].name));
  fprintf(out, "\nlayers\n  %-*s  %14s  %14s  %16s\n", w, "layer", "params", "FLOPs/sample", "activations/sample");
  for (int i = 0; i < st->layers.n; i++) {
    const LayerStats *l = &st->layers.a[i];
    fprintf(out, "  %-*s  %14s  %14s  %16s\n", w, l->name, cp_commas(l->params), cp_si_str(l->flops, "FLOP"),
            cp_bytes_str(l->act_bytes));
  }
}

static void text_params(FILE *out, const Graph *g) {
  int w = 4, ws = 5;
  for (int i = 0; i < g->params.n; i++) {
    const Node *n = &g->nodes[g->params.a[i]];
    w = (int)fmax(w, (double)strlen(n->name ? n->name : "?"));
    ws = (int)fmax(ws, (double)strlen(shape_str(&n->shape)));
  }
  fprintf(out, "\nparam tensors\n  %-*s  %-*s  %14s\n", w, "path", ws, "shape", "count");
  for (int i = 0; i < g->params.n; i++) {
    const Node *n = &g->nodes[g->params.a[i]];
    fprintf(out, "  %-*s  %-*s  %14s\n", w, n->name ? n->name : "?", ws, shape_str(&n->shape),
            cp_commas(shape_numel(&n->shape)));
  }
}

static void text_mesh(FILE *out, const MeshConf *m, const TrainConf *t, const Stats *st) {
  fprintf(out, "\nmesh %s\n", m->name ? m->name : "(default: one device of this machine)");
  fprintf(out, "  %-16s %s = %lld device%s\n", "shape", axes_str(m), (long long)m->ndevices,
          m->ndevices == 1 ? "" : "s");
  fprintf(out, "  %-16s %s (%s)\n", "device", m->device.name, m->device.kind == DEV_CUDA ? "cuda" : "cpu");
  fprintf(out, "  %-16s %s per device\n", "memory", cp_bytes_str(m->device.memory));
  fprintf(out, "  %-16s %s per device at %s, %s in all\n", "peak", cp_si_str(st->peak, "FLOP/s"),
          t ? precision_name(t->precision) : "f32", cp_si_str(st->peak * (double)m->ndevices, "FLOP/s"));
  fprintf(out, "  %-16s %s/s\n", "memory bandwidth", cp_si_str(m->device.hbm, "B"));
  for (int i = 0; i < m->naxes; i++)
    fprintf(out, "  %-16s %s: %s/s, %s latency\n", i == 0 ? "links" : "", m->axes[i].name,
            cp_si_str(m->axes[i].bandwidth, "B"), time_str(m->axes[i].latency));
  fprintf(out, "  %-16s %s\n", "source", m->device.source ? m->device.source : "");
}

static void text_plan(FILE *out, const TrainConf *t, const MeshConf *m, const Stats *st) {
  fprintf(out, "\nplan%s%s\n", t->name ? " " : "", t->name ? t->name : "");
  fprintf(out, "  %-16s %s samples\n", "global batch", cp_commas(t->batch));
  fprintf(out, "  %-16s %s\n", "steps", cp_commas(t->steps));
  if (st->seq > 0) fprintf(out, "  %-16s %s\n", "tokens per step", cp_commas(t->batch * st->seq));
  fprintf(out, "  %-16s %s (forward + backward: 3 x forward x batch x steps)\n", "training FLOPs",
          cp_si_str(st->train_flops, "FLOP"));
  fprintf(out, "  %-16s %s\n", "optimizer", optimizer_str(&t->optimizer));
  fprintf(out, "  %-16s %s\n", "schedule", schedule_str(&t->schedule));
  if (t->clip > 0) fprintf(out, "  %-16s %g\n", "clip", t->clip);
  fprintf(out, "  %-16s %s\n", "precision", precision_name(t->precision));
  fprintf(out, "  %-16s %s\n", "strategy", strategy_str(&t->strategy));
  fprintf(out, "  %-16s %s per device\n", "memory budget", cp_bytes_str(t->memory));
  fprintf(out, "  %-16s %s\n", "data", data_str(&t->data));
  if (st->est_seconds > 0)
    fprintf(out, "  %-16s %s%s at 50%% of peak on %lld device%s (a rough figure; `cplanc plan` models it)\n",
            "estimated time", st->est_seconds < 1 ? "" : "~", duration_str(st->est_seconds), (long long)m->ndevices, m->ndevices == 1 ? "" : "s");
}

void check_print_text(FILE *out, const Graph *g, const TrainConf *t, const MeshConf *m) {
  Stats st = stats_compute(g, t, m);
  text_model(out, g, &st);
  text_layers(out, &st);
  text_params(out, g);
  if (m) text_mesh(out, m, t, &st);
  if (t) text_plan(out, t, m, &st);
  else fprintf(out, "\nplan: none (this file has no train block)\n");
}

/* ---- JSON ------------------------------------------------------------------------ */

static cJSON *json_shape(const Shape *s) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < s->rank; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)s->d[i]));
  return a;
}

static cJSON *json_device(const DeviceProfile *d) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "name", d->name ? d->name : "");
  cJSON_AddStringToObject(o, "kind", d->kind == DEV_CUDA ? "cuda" : "cpu");
  cJSON_AddNumberToObject(o, "memory", d->memory);
  cJSON_AddNumberToObject(o, "flops_f32", d->flops_f32);
  cJSON_AddNumberToObject(o, "flops_bf16", d->flops_bf16);
  cJSON_AddNumberToObject(o, "hbm", d->hbm);
  cJSON_AddNumberToObject(o, "intra_bw", d->intra_bw);
  cJSON_AddNumberToObject(o, "inter_bw", d->inter_bw);
  cJSON_AddNumberToObject(o, "intra_latency", d->intra_latency);
  cJSON_AddNumberToObject(o, "inter_latency", d->inter_latency);
  cJSON_AddStringToObject(o, "source", d->source ? d->source : "");
  return o;
}

static cJSON *json_mesh(const MeshConf *m, const Stats *st) {
  cJSON *o = cJSON_CreateObject();
  if (m->name) cJSON_AddStringToObject(o, "name", m->name);
  else cJSON_AddNullToObject(o, "name");
  cJSON *axes = cJSON_AddArrayToObject(o, "axes");
  for (int i = 0; i < m->naxes; i++) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "name", m->axes[i].name);
    cJSON_AddNumberToObject(a, "size", (double)m->axes[i].size);
    cJSON_AddNumberToObject(a, "bandwidth", m->axes[i].bandwidth);
    cJSON_AddNumberToObject(a, "latency", m->axes[i].latency);
    cJSON_AddItemToArray(axes, a);
  }
  cJSON_AddNumberToObject(o, "devices", (double)m->ndevices);
  cJSON_AddItemToObject(o, "device", json_device(&m->device));
  cJSON_AddNumberToObject(o, "peak_flops", st->peak);
  return o;
}

static cJSON *json_optimizer(const OptimizerConf *op) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "kind", optimizer_name(op->kind));
  cJSON_AddNumberToObject(o, "lr", op->lr);
  if (op->kind == OPT_ADAMW || op->kind == OPT_LAMB) {
    cJSON *b = cJSON_AddArrayToObject(o, "betas");
    cJSON_AddItemToArray(b, cJSON_CreateNumber(op->beta1));
    cJSON_AddItemToArray(b, cJSON_CreateNumber(op->beta2));
    cJSON_AddNumberToObject(o, "eps", op->eps);
  } else {
    cJSON_AddNumberToObject(o, "momentum", op->momentum);
  }
  cJSON_AddNumberToObject(o, "weight_decay", op->weight_decay);
  if (op->kind == OPT_SGD) cJSON_AddBoolToObject(o, "nesterov", op->nesterov);
  if (op->kind == OPT_LARS) cJSON_AddNumberToObject(o, "trust", op->trust);
  return o;
}

static cJSON *json_schedule(const ScheduleConf *s) {
  static const char *const names[] = {"constant", "cosine", "linear"};
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "kind", names[s->kind]);
  if (s->kind != SCHED_CONSTANT) {
    cJSON_AddNumberToObject(o, "warmup", (double)s->warmup);
    cJSON_AddNumberToObject(o, s->kind == SCHED_COSINE ? "min_lr" : "end_lr", s->end_lr);
  }
  return o;
}

/* Pinned fields as numbers or strings; searched ones as null. */
static cJSON *json_strategy(const StrategyConf *st) {
  static const char *const rc[] = {"none", "selective", "full"};
  static const char *const ps[] = {"1f1b", "gpipe", "interleaved"};
  cJSON *o = cJSON_CreateObject();
  cJSON_AddBoolToObject(o, "auto", st->is_auto);
  const char *const names[] = {"dp", "tp", "pp", "sp", "micro"};
  const int64_t v[] = {st->dp, st->tp, st->pp, st->sp, st->micro};
  for (int i = 0; i < 5; i++) {
    if (v[i] > 0) cJSON_AddNumberToObject(o, names[i], (double)v[i]);
    else cJSON_AddNullToObject(o, names[i]);
  }
  if (st->zero >= 0) cJSON_AddNumberToObject(o, "zero", (double)st->zero);
  else cJSON_AddNullToObject(o, "zero");
  if (st->recompute != RC_SEARCH) cJSON_AddStringToObject(o, "recompute", rc[st->recompute]);
  else cJSON_AddNullToObject(o, "recompute");
  if (st->pipeline != PS_SEARCH) cJSON_AddStringToObject(o, "pipeline", ps[st->pipeline]);
  else cJSON_AddNullToObject(o, "pipeline");
  return o;
}

static void add_str_or_null(cJSON *o, const char *key, const char *s) {
  if (s) cJSON_AddStringToObject(o, key, s);
  else cJSON_AddNullToObject(o, key);
}

static cJSON *json_data(const DataConf *d) {
  static const char *const names[] = {"tokens", "adder", "tensors"};
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "kind", names[d->kind]);
  if (d->kind == DATA_ADDER) {
    cJSON_AddNumberToObject(o, "digits", (double)d->digits);
    return o;
  }
  add_str_or_null(o, "path", d->path);
  add_str_or_null(o, "val", d->val_path);
  if (d->kind == DATA_TOKENS) cJSON_AddBoolToObject(o, "shuffle", d->shuffle);
  return o;
}

static cJSON *json_every(int64_t every, const char *k2, int64_t v2) {
  if (every <= 0) return cJSON_CreateNull();
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "every", (double)every);
  cJSON_AddNumberToObject(o, k2, (double)v2);
  return o;
}

static cJSON *json_train(const TrainConf *t, const Stats *st) {
  cJSON *o = cJSON_CreateObject();
  add_str_or_null(o, "name", t->name);
  cJSON_AddStringToObject(o, "model", t->model && t->model->name ? t->model->name : "");
  cJSON_AddNumberToObject(o, "batch", (double)t->batch);
  cJSON_AddNumberToObject(o, "steps", (double)t->steps);
  if (st->seq > 0) cJSON_AddNumberToObject(o, "tokens_per_step", (double)(t->batch * st->seq));
  else cJSON_AddNullToObject(o, "tokens_per_step");
  cJSON_AddNumberToObject(o, "training_flops", st->train_flops);
  cJSON_AddItemToObject(o, "optimizer", json_optimizer(&t->optimizer));
  cJSON_AddItemToObject(o, "schedule", json_schedule(&t->schedule));
  if (t->clip > 0) cJSON_AddNumberToObject(o, "clip", t->clip);
  else cJSON_AddNullToObject(o, "clip");
  cJSON_AddStringToObject(o, "precision", precision_name(t->precision));
  cJSON_AddItemToObject(o, "strategy", json_strategy(&t->strategy));
  cJSON_AddNumberToObject(o, "memory", t->memory);
  cJSON_AddNumberToObject(o, "seed", (double)t->seed);
  cJSON_AddItemToObject(o, "data", json_data(&t->data));
  cJSON_AddItemToObject(o, "eval", json_every(t->eval_every, "batches", t->eval_batches));
  cJSON *ck = json_every(t->ckpt_every, "keep", t->ckpt_keep);
  if (t->ckpt_every > 0) cJSON_AddStringToObject(ck, "dir", t->ckpt_dir ? t->ckpt_dir : "");
  cJSON_AddItemToObject(o, "checkpoint", ck);
  cJSON *log = cJSON_AddObjectToObject(o, "log");
  cJSON_AddNumberToObject(log, "every", (double)t->log_every);
  add_str_or_null(log, "file", t->log_file);
  if (st->est_seconds > 0) cJSON_AddNumberToObject(o, "estimated_seconds_at_50pct_peak", st->est_seconds);
  else cJSON_AddNullToObject(o, "estimated_seconds_at_50pct_peak");
  return o;
}

static cJSON *json_model(const Graph *g, const Stats *st) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "model", g->model_name ? g->model_name : "");
  add_str_or_null(o, "file", st->file);
  cJSON_AddNumberToObject(o, "params", (double)st->params);
  cJSON *pt = cJSON_AddArrayToObject(o, "param_tensors");
  for (int i = 0; i < g->params.n; i++) {
    const Node *n = &g->nodes[g->params.a[i]];
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "name", n->name ? n->name : "");
    cJSON_AddItemToObject(p, "shape", json_shape(&n->shape));
    cJSON_AddNumberToObject(p, "count", (double)shape_numel(&n->shape));
    cJSON_AddItemToArray(pt, p);
  }
  cJSON *sc = cJSON_AddObjectToObject(o, "params_by_scope");
  for (int i = 0; i < st->scopes.n; i++) cJSON_AddNumberToObject(sc, st->scopes.a[i].name, (double)st->scopes.a[i].params);
  cJSON_AddNumberToObject(o, "flops_per_sample", st->flops);
  if (st->seq > 0) cJSON_AddNumberToObject(o, "flops_per_token", st->flops / (double)st->seq);
  else cJSON_AddNullToObject(o, "flops_per_token");
  if (st->seq > 0) cJSON_AddNumberToObject(o, "seq_len", (double)st->seq);
  else cJSON_AddNullToObject(o, "seq_len");
  cJSON_AddNumberToObject(o, "activation_bytes_per_sample", st->act_bytes);
  cJSON_AddStringToObject(o, "activation_dtype", dtype_name(st->act_dtype));
  cJSON *ls = cJSON_AddArrayToObject(o, "layers");
  for (int i = 0; i < st->layers.n; i++) {
    const LayerStats *l = &st->layers.a[i];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", l->name);
    cJSON_AddNumberToObject(j, "params", (double)l->params);
    cJSON_AddNumberToObject(j, "flops_per_sample", l->flops);
    cJSON_AddNumberToObject(j, "activation_bytes_per_sample", l->act_bytes);
    cJSON_AddItemToArray(ls, j);
  }
  return o;
}

void check_print_json(FILE *out, const Graph *g, const TrainConf *t, const MeshConf *m) {
  Stats st = stats_compute(g, t, m);
  cJSON *o = json_model(g, &st);
  if (m) cJSON_AddItemToObject(o, "mesh", json_mesh(m, &st));
  else cJSON_AddNullToObject(o, "mesh");
  if (t) cJSON_AddItemToObject(o, "train", json_train(t, &st));
  else cJSON_AddNullToObject(o, "train");
  char *text = cJSON_Print(o);
  if (text) fprintf(out, "%s\n", text);
  cJSON_free(text);
  cJSON_Delete(o);
}
