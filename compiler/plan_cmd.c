/* plan_cmd.c: `cplanc plan`. Until the search exists (a later issue) it explains a pinned
 * strategy (`strategy = auto` is explained as pure data parallelism): the degrees and logical
 * mesh, the pipeline stages, every param's placement, the activations of each layer (identical
 * layers are printed once) and every collective with its bytes per device and step. */
#include "plan_cmd.h"
#include "placement.h"
#include "train.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *layer_name(const Graph *g, int l) { return l < 0 ? NULL : g->layer_names.a[l]; }

/* "(pre)" / "h.0" / "(post)" for a forward node. */
static const char *where(const Graph *g, int i, int first_layered) {
  int l = g->nodes[i].layer;
  return l >= 0 ? layer_name(g, l) : i < first_layered ? "(pre)" : "(post)";
}

/* A layer is identical to layer 0 when its forward nodes have the same ops and placements. */
static bool layer_same(const StratPlan *sp, int l) {
  const Graph *g = sp->g;
  int a = 0, b = 0;
  for (;;) {
    while (a < g->n && !(g->nodes[a].layer == 0 && g->nodes[a].role == ROLE_FWD)) a++;
    while (b < g->n && !(g->nodes[b].layer == l && g->nodes[b].role == ROLE_FWD)) b++;
    if (a == g->n || b == g->n) return a == g->n && b == g->n;
    if (g->nodes[a].op != g->nodes[b].op ||
        strcmp(placement_str(&sp->pl[a]), placement_str(&sp->pl[b])) != 0)
      return false;
    a++, b++;
  }
}

static const char *axes_str(const StratPlan *sp) {
  StrBuf b = {0};
  sb_puts(&b, "[");
  for (int a = 0; a < sp->naxes; a++)
    sb_printf(&b, "%s%s = %lld", a ? ", " : "", strat_axis_name(sp->axes[a].role), (long long)sp->axes[a].n);
  sb_puts(&b, "]");
  return sb_str(&b);
}

static const char *node_label(const Graph *g, int i) {
  const Node *n = &g->nodes[i];
  if (n->name) return cp_fmt("%%%d %s \"%s\"", i, ir_ops[n->op].name, n->name);
  if (n->op == OP_GRAD) return cp_fmt("%%%d grad of %s", i, ir_ops[g->nodes[n->fwd].op].name);
  return cp_fmt("%%%d %s", i, ir_ops[n->op].name);
}

static void print_summary(FILE *f, const StratPlan *sp, const TrainConf *t) {
  const MeshConf *m = t->mesh;
  fprintf(f, "plan for %s on %s (%lld device%s)\n", sp->g->model_name, m && m->name ? m->name : "the local machine",
          (long long)(m ? m->ndevices : 1), m && m->ndevices == 1 ? "" : "s");
  if (t->strategy.is_auto)
    fprintf(f, "strategy = auto: the strategy search is a later issue; explaining pure data parallelism\n");
  fprintf(f, "strategy: dp = %lld, tp = %lld, pp = %lld, sp = %lld, zero = %lld, micro = %lld, accumulation = %lld\n",
          (long long)sp->dp, (long long)sp->tp, (long long)sp->pp, (long long)sp->sp, (long long)sp->zero,
          (long long)sp->micro, (long long)sp->accum);
  fprintf(f, "placement axes: %s (ranks: pp outermost, then dp, tp innermost)\n",
          sp->naxes ? axes_str(sp) : "none (every tensor whole on every device)");
}

static void print_stages(FILE *f, const StratPlan *sp) {
  if (sp->pp <= 1) return;
  const Graph *g = sp->g;
  fprintf(f, "\npipeline stages (layers split contiguously):\n");
  for (int s = 0; s < sp->pp; s++) {
    StrBuf b = {0};
    for (int l = 0; l < g->layer_names.n; l++) {
      int stage = -1;
      for (int i = 0; i < g->n && stage < 0; i++)
        if (g->nodes[i].layer == l) stage = sp->stage[i];
      if (stage == s) sb_printf(&b, "%s%s", b.len ? ", " : "", g->layer_names.a[l]);
    }
    fprintf(f, "  stage %d: %s%s%s\n", s, s == 0 ? "(pre), " : "", sb_str(&b), s == sp->pp - 1 ? ", (post)" : "");
  }
  for (int i = 0; i < g->n; i++) { /* forward activations that cross a stage boundary */
    const Node *n = &g->nodes[i];
    if (n->role != ROLE_FWD) continue;
    for (int k = 0; k < n->nin; k++) {
      int p = n->in[k];
      bool seen = false; /* one send per value, however many readers it has */
      for (int j = p + 1; j < i && !seen; j++)
        for (int m = 0; m < g->nodes[j].nin; m++) seen |= g->nodes[j].in[m] == p && sp->stage[j] == sp->stage[i];
      for (int m = 0; m < k; m++) seen |= n->in[m] == p;
      if (seen || sp->stage[p] >= sp->stage[i] || (ir_ops[g->nodes[p].op].flags & OPF_LEAF)) continue;
      fprintf(f, "  send %%%d %s%s: stage %d -> %d (%s per micro-batch, its gradient back)\n", p,
              dtype_name(g->nodes[p].dtype), shape_str(&g->nodes[p].shape), sp->stage[p], sp->stage[i],
              cp_bytes_str(ir_node_bytes(g, p)));
    }
  }
  for (int q = 0; q < g->params.n; q++) {
    int p = g->params.a[q], lo = sp->stage[p], hi = lo;
    for (int i = 0; i < g->n; i++)
      for (int k = 0; k < g->nodes[i].nin; k++)
        if (g->nodes[i].in[k] == p && g->nodes[i].role == ROLE_FWD && sp->stage[i] > hi) hi = sp->stage[i];
    if (hi > lo)
      fprintf(f, "  param %s is used by stages %d and %d (tied): both hold it and all-reduce its gradient\n",
              g->nodes[p].name, lo, hi);
  }
}

static void print_params(FILE *f, const StratPlan *sp) {
  const Graph *g = sp->g;
  fprintf(f, "\nparams %s:\n", axes_str(sp));
  for (int q = 0; q < g->params.n; q++) {
    int p = g->params.a[q];
    fprintf(f, "  %-28s %s%-14s %s\n", g->nodes[p].name, dtype_name(g->nodes[p].dtype), shape_str(&g->nodes[p].shape),
            placement_str(&sp->pl[p]));
  }
  fprintf(f, "optimizer state and gradient accumulators:\n");
  for (int k = 0; k < g->states.n; k++) {
    int s = g->states.a[k];
    fprintf(f, "  %-36s %s\n", g->nodes[s].name, placement_str(&sp->pl[s]));
  }
}

static void print_activations(FILE *f, const StratPlan *sp, int first) {
  const Graph *g = sp->g;
  fprintf(f, "\nactivations (forward) %s:\n", axes_str(sp));
  const char *cur = "";
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    if (n->role != ROLE_FWD || (ir_ops[n->op].flags & OPF_LEAF)) continue;
    if (n->layer > 0 && layer_same(sp, n->layer)) continue;
    const char *w = where(g, i, first);
    if (strcmp(w, cur) != 0) fprintf(f, "  %s\n", w);
    cur = w;
    fprintf(f, "    %-26s %s%-16s %s\n", node_label(g, i), dtype_name(n->dtype), shape_str(&n->shape),
            placement_str(&sp->pl[i]));
  }
  int same = 0;
  for (int l = 1; l < g->layer_names.n; l++) same += layer_same(sp, l);
  if (same) fprintf(f, "  %d more layer%s (%s ... %s) identical to %s\n", same, same == 1 ? "" : "s",
                    g->layer_names.a[1], g->layer_names.a[g->layer_names.n - 1], g->layer_names.a[0]);
}

static int coll_layer(const StratPlan *sp, const CollOp *o) { return sp->g->nodes[o->consumer].layer; }

static void print_colls(FILE *f, const StratPlan *sp) {
  const Graph *g = sp->g;
  double total[3] = {0};
  int skipped = 0;
  fprintf(f, "\ncollectives (bytes sent per device; xN: executions per optimizer step):\n");
  if (sp->colls.n == 0) fprintf(f, "  none\n");
  for (int i = 0; i < sp->colls.n; i++) {
    const CollOp *o = &sp->colls.a[i];
    total[o->axis] += o->bytes * o->per_step;
    int l = coll_layer(sp, o);
    if (l > 0 && layer_same(sp, l)) {
      skipped++;
      continue;
    }
    const char *ax = strat_axis_name(sp->axes[o->axis].role);
    if (o->what)
      fprintf(f, "  %-9s %-14s %s: %s, %s x%d\n", ax, pl_coll_name(o->coll), node_label(g, o->node), o->what,
              cp_bytes_str(o->bytes), o->per_step);
    else
      fprintf(f, "  %-9s %-14s %s %s -> %s for %s, %s x%d\n", ax, pl_coll_name(o->coll), node_label(g, o->node),
              pl_str(o->from), pl_str(o->to), node_label(g, o->consumer), cp_bytes_str(o->bytes), o->per_step);
  }
  if (skipped) fprintf(f, "  ... and %d more in the layers identical to %s\n", skipped, g->layer_names.a[0]);
  for (int a = 0; a < sp->naxes; a++)
    fprintf(f, "total on %s: %s per device per step\n", strat_axis_name(sp->axes[a].role), cp_bytes_str(total[a]));
}

static cJSON *pl_json(const StratPlan *sp, int i) { return cJSON_CreateString(placement_str(&sp->pl[i])); }

static void print_json(FILE *f, const StratPlan *sp, const TrainConf *t) {
  const Graph *g = sp->g;
  cJSON *root = cJSON_CreateObject(), *st = cJSON_AddObjectToObject(root, "strategy");
  cJSON_AddBoolToObject(st, "auto", t->strategy.is_auto);
  const char *keys[] = {"dp", "tp", "pp", "sp", "zero", "micro", "accumulation"};
  const int64_t vals[] = {sp->dp, sp->tp, sp->pp, sp->sp, sp->zero, sp->micro, sp->accum};
  for (int k = 0; k < 7; k++) cJSON_AddNumberToObject(st, keys[k], (double)vals[k]);
  cJSON *axes = cJSON_AddArrayToObject(root, "axes");
  for (int a = 0; a < sp->naxes; a++) {
    cJSON *ax = cJSON_CreateObject();
    cJSON_AddStringToObject(ax, "name", strat_axis_name(sp->axes[a].role));
    cJSON_AddNumberToObject(ax, "size", (double)sp->axes[a].n);
    cJSON_AddItemToArray(axes, ax);
  }
  cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
  for (int i = 0; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "node", i);
    cJSON_AddStringToObject(o, "op", ir_ops[n->op].name);
    if (n->name) cJSON_AddStringToObject(o, "name", n->name);
    cJSON_AddStringToObject(o, "role", n->role == ROLE_FWD ? "forward" : n->role == ROLE_BWD ? "backward" : "update");
    if (n->layer >= 0) cJSON_AddStringToObject(o, "layer", g->layer_names.a[n->layer]);
    cJSON_AddStringToObject(o, "shape", shape_str(&n->shape));
    cJSON_AddItemToObject(o, "placement", pl_json(sp, i));
    cJSON_AddNumberToObject(o, "stage", sp->stage[i]);
    cJSON_AddItemToArray(tensors, o);
  }
  cJSON *colls = cJSON_AddArrayToObject(root, "collectives");
  for (int i = 0; i < sp->colls.n; i++) {
    const CollOp *c = &sp->colls.a[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "node", c->node);
    cJSON_AddNumberToObject(o, "consumer", c->consumer);
    cJSON_AddStringToObject(o, "axis", strat_axis_name(sp->axes[c->axis].role));
    cJSON_AddStringToObject(o, "from", pl_str(c->from));
    cJSON_AddStringToObject(o, "to", pl_str(c->to));
    cJSON_AddStringToObject(o, "collective", pl_coll_name(c->coll));
    if (c->what) cJSON_AddStringToObject(o, "note", c->what);
    cJSON_AddNumberToObject(o, "bytes", c->bytes);
    cJSON_AddNumberToObject(o, "per_step", c->per_step);
    cJSON_AddItemToArray(colls, o);
  }
  char *s = cJSON_Print(root);
  fprintf(f, "%s\n", s);
  free(s);
  cJSON_Delete(root);
}

void plan_cmd_run(FILE *out, Sema *s, const TrainConf *t, bool explain, bool json) {
  Program *prog = sema_program(s);
  int64_t dp, tp, pp, micro;
  if (!strat_degrees(prog, t, &dp, &tp, &pp, &micro)) return;
  /* The graph of one global micro-batch (dp · micro samples): placements split it over dp. */
  TrainConf tc = *t;
  tc.strategy.dp = dp;
  tc.strategy.micro = micro;
  Graph *g = sema_build_model(s, t->model, t->model_call, dp * micro);
  if (!g || !train_graph(g, &tc)) return;
  StratPlan *sp = strat_pin(prog, g, &tc);
  if (!sp) return;
  sp->sp = t->strategy.sp > 1 ? t->strategy.sp : 1;
  if (json) {
    print_json(out, sp, t);
    return;
  }
  int first = g->n;
  for (int i = 0; i < g->n && first == g->n; i++)
    if (g->nodes[i].layer >= 0) first = i;
  print_summary(out, sp, t);
  print_stages(out, sp);
  if (explain) {
    print_params(out, sp);
    print_activations(out, sp, first);
  }
  print_colls(out, sp);
}
