/* cg_plan.c: where values live and the arena plan (cg_plan.h), and the RtPlan tables both
 * emitters write. The emitters read this record; they do not place values themselves. */
#include "cg_plan.h"

#include "../compiler/lower.h"
#include "../compiler/memplan.h"
#include "../compiler/pipeline.h"
#include "../compiler/train.h"
#include "cg_common.h"
#include "codegen.h"
#include "cplan_config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const Node *nd(const CgPlan *p, int i) { return &p->g->nodes[i]; }
static int64_t numel(const Node *n) { return shape_numel(&n->shape); }
static int64_t align16(int64_t floats) { return (floats + 15) / 16 * 16; }

bool cg_executed(const Node *n) { return !(ir_ops[n->op].flags & OPF_LEAF); }

bool cg_in_phase(const Node *n, int ph) { return cg_executed(n) && (ph == CG_PH_TRAIN || n->role == ROLE_FWD); }

int cg_root(const CgPlan *p, int i) {
  while (p->nc[i].kind == CG_L_ALIAS) i = p->nc[i].alias;
  return i;
}

/* A transpose can stay virtual when only GEMMs read it: matmuls, the matmul's gradients, and its
 * own gradient (which lists it as an input only to keep it alive). */
static bool transpose_virtual(const Graph *g, int t) {
  for (int i = t + 1; i < g->n; i++) {
    const Node *n = &g->nodes[i];
    for (int k = 0; k < n->nin; k++) {
      if (n->in[k] != t) continue;
      if (n->op == OP_MATMUL) continue;
      if (n->op == OP_GRAD && (g->nodes[n->fwd].op == OP_MATMUL || n->fwd == t)) continue;
      return false;
    }
  }
  if (g->loss == t) return false;
  for (int k = 0; k < g->metrics.n; k++)
    if (g->metrics.a[k].node == t) return false;
  return true;
}

/* A GRAD that equals its dy: of reshape, and of add/sub (input a) without broadcasting. */
static bool grad_is_dy(const CgPlan *p, const Node *n) {
  const Node *f = nd(p, n->fwd);
  if (f->op == OP_RESHAPE) return true;
  const Node *x = nd(p, f->in[n->ia[0]]);
  if (!shape_eq(&x->shape, &f->shape) || x->dtype != f->dtype) return false;
  return f->op == OP_ADD || (f->op == OP_SUB && n->ia[0] == 0);
}

/* The forward ops one backward kernel computes several input gradients of. */
static bool multi_grad(OpId op) {
  return (op >= OP_ADD && op <= OP_MOD) || op == OP_LAYER_NORM || op == OP_RMS_NORM || op == OP_SDPA;
}

static void set_alias(CgPlan *p, int i, int to) {
  p->nc[i].kind = CG_L_ALIAS;
  p->nc[i].alias = to;
}

static void place_leaves(CgPlan *p) {
  const Graph *g = p->g;
  for (int k = 0; k < g->params.n; k++) {
    CgPlace *x = &p->nc[g->params.a[k]];
    x->kind = CG_L_PARAM, x->off = p->param_floats;
    p->param_floats += align16(numel(nd(p, g->params.a[k])));
  }
  for (int k = 0; k < g->states.n; k++) {
    CgPlace *x = &p->nc[g->states.a[k]];
    x->kind = CG_L_STATE, x->off = p->state_floats;
    p->state_floats += align16(numel(nd(p, g->states.a[k])));
  }
  for (int k = 0; k < g->inputs.n; k++) p->nc[g->inputs.a[k]].kind = CG_L_INPUT, p->nc[g->inputs.a[k]].off = k;
}

/* Kinds, views, GRAD groups, and the side buffers (the sides hook). */
void cg_plan_place(CgPlan *p) {
  const Graph *g = p->g;
  p->nc = cp_alloc(sizeof(CgPlace) * (size_t)(g->n ? g->n : 1));
  place_leaves(p);
  for (int i = 0; i < g->n; i++) {
    const Node *n = nd(p, i);
    CgPlace *x = &p->nc[i];
    x->leader = i;
    if (p->fu->group[i] >= 0) { /* the group's kernel call at its root computes it */
      x->leader = p->fu->groups[p->fu->group[i]].root;
      x->kind = x->leader == i ? CG_L_WORK : CG_L_FUSED;
      continue;
    }
    if (n->op == OP_CONST) x->kind = CG_L_CONST, x->off = p->nconst++;
    else if (n->op == OP_SCALAR_IN) x->kind = CG_L_SCALAR, x->off = p->nscalar++;
    else if (n->op == OP_RESHAPE || n->op == OP_ASSIGN || n->op == OP_ACCUM) set_alias(p, i, n->in[0]);
    else if (n->op == OP_TRANSPOSE && transpose_virtual(g, i)) set_alias(p, i, n->in[0]), x->trans = true;
    else if (n->op == OP_GRAD && grad_is_dy(p, n)) set_alias(p, i, n->in[0]);
    else if (x->kind == CG_L_NONE) x->kind = CG_L_WORK;
    p->sides(p->ctx, i, x);
  }
  /* GRADs of one forward node with one dy share a kernel call where one backward kernel computes
   * several input gradients: the first one makes the call. */
  int *first = cp_alloc(sizeof(int) * (size_t)(g->n + 1)), *next = cp_alloc(sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) first[i] = next[i] = -1; /* per forward node: its first such GRADs, chained */
  for (int j = 0; j < g->n; j++) {
    const Node *m = nd(p, j);
    if (m->op != OP_GRAD || p->nc[j].leader != j || p->nc[j].kind == CG_L_ALIAS || p->fu->group[j] >= 0 ||
        !multi_grad(nd(p, m->fwd)->op))
      continue;
    int i = first[m->fwd];
    while (i >= 0 && !(nd(p, i)->in[0] == m->in[0] && nd(p, i)->role == m->role)) i = next[i];
    if (i >= 0) p->nc[j].leader = i;
    else next[j] = first[m->fwd], first[m->fwd] = j;
  }
}

/* Plans one phase: positions in execution order, buffers from definition to last read, aux from
 * the forward node to its last GRAD, scratch at its node. Values the phase hands out (loss,
 * metrics, the gradient norm) live to the end. */
void cg_plan_phase(CgPlan *p, int ph) {
  const Graph *g = p->g;
  int *pos = cp_alloc(sizeof(int) * (size_t)g->n), *last = cp_alloc(sizeof(int) * (size_t)g->n);
  int *alast = cp_alloc(sizeof(int) * (size_t)g->n), np = 0;
  for (int i = 0; i < g->n; i++) pos[i] = last[i] = alast[i] = -1;
  for (int i = 0; i < g->n; i++)
    if (cg_in_phase(nd(p, i), ph)) pos[i] = np++;
  for (int i = 0; i < g->n; i++) {
    const Node *n = nd(p, i);
    if (pos[i] < 0) continue;
    int at = pos[p->nc[i].leader];
    for (int k = 0; k < n->nin; k++) {
      int r = cg_root(p, n->in[k]);
      if (last[r] < at) last[r] = at;
    }
    int r = cg_root(p, i);
    if (last[r] < at) last[r] = at;
    if (n->op == OP_GRAD && alast[n->fwd] < at) alast[n->fwd] = at;
  }
  VEC(int) outs = {0};
  VEC_PUSH(outs, g->loss);
  if (ph == CG_PH_TRAIN) VEC_PUSH(outs, g->grad_norm);
  for (int k = 0; ph == CG_PH_TRAIN && k < p->nkeep; k++) VEC_PUSH(outs, p->keep[k]);
  for (int k = 0; k < g->metrics.n; k++) VEC_PUSH(outs, g->metrics.a[k].node);
  for (int k = 0; k < outs.n; k++)
    if (outs.a[k] >= 0) last[cg_root(p, outs.a[k])] = np;

  VEC(MpBuf) bufs = {0};
  VEC(int64_t *) dest = {0};
  VEC(int) wof = {0}; /* per MpBuf: the node whose work buffer it is, or -1 */
  const CgUse *use = p->recording ? NULL : p->use[ph];
  for (int i = 0; i < g->n; i++) {
    if (pos[i] < 0) continue;
    const Node *n = nd(p, i);
    CgPlace *x = &p->nc[i];
    int at = pos[x->leader];
    if (x->kind == CG_L_WORK) {
      int64_t bytes = p->bytes ? p->bytes(p->ctx, i) : (int64_t)ir_node_bytes(g, i);
      int first = at, end = last[i] < at ? at : last[i];
      const CgUse *u = use ? &use[i] : NULL;
      if (u && u->lo >= 0) first = pos[u->lo] < at ? pos[u->lo] : at;
      if (u && u->lo < 0 && !u->outside) bytes = 0, end = first; /* no code names it */
      else if (u && u->lo >= 0 && !u->outside && end < np) end = pos[u->hi] > first ? pos[u->hi] : first;
      else if (u && u->hi >= 0 && pos[u->hi] > end) end = pos[u->hi];
      VEC_PUSH(bufs, ((MpBuf){bytes, first, end, 0}));
      VEC_PUSH(dest, &x->woff[ph]);
      VEC_PUSH(wof, i);
    }
    if (x->aux) {
      int e = alast[i] > at ? alast[i] : at;
      VEC_PUSH(bufs, ((MpBuf){x->aux, at, e, 0}));
      VEC_PUSH(dest, &x->aoff[ph]);
      VEC_PUSH(wof, -1);
    }
    if (x->scratch && !(ph == CG_PH_EVAL && n->op == OP_DROPOUT)) {
      VEC_PUSH(bufs, ((MpBuf){x->scratch, at, at, 0}));
      VEC_PUSH(dest, &x->soff[ph]);
      VEC_PUSH(wof, -1);
    }
  }
  if (p->recording) { /* the discarded emission needs no shared memory: each buffer its own bytes */
    int64_t end = 0;
    for (int k = 0; k < bufs.n; k++) bufs.a[k].offset = end, end += (bufs.a[k].size + MP_ALIGN - 1) / MP_ALIGN * MP_ALIGN;
    p->work[ph] = end;
  } else {
    p->work[ph] = mp_plan(bufs.a, bufs.n);
    cp_assert(mp_check(bufs.a, bufs.n, p->work[ph]) < 0);
  }
  for (int k = 0; k < bufs.n; k++) {
    *dest.a[k] = bufs.a[k].offset;
    if (wof.a[k] >= 0) p->nc[wof.a[k]].wlo[ph] = bufs.a[k].first, p->nc[wof.a[k]].whi[ph] = bufs.a[k].last;
  }
  p->pos[ph] = pos;
}

void cg_plan_record(CgPlan *p) {
  p->recording = true;
  for (int ph = 0; ph < CG_PH__COUNT; ph++) {
    p->use[ph] = cp_alloc(sizeof(CgUse) * (size_t)(p->g->n + 1));
    for (int i = 0; i < p->g->n; i++) p->use[ph][i] = (CgUse){-1, -1, false};
  }
}

void cg_plan_name(const CgPlan *p, int ph, int r, int cur) {
  if (!p->use[ph]) return;
  CgUse *u = &p->use[ph][r];
  if (p->recording) {
    if (cur < 0) u->outside = true;
    else {
      if (u->lo < 0 || cur < u->lo) u->lo = cur;
      if (cur > u->hi) u->hi = cur;
    }
    return;
  }
  cp_assert(u->lo >= 0 || u->outside); /* the first emission named it */
  if (cur >= 0) cp_assert(p->pos[ph][cur] >= p->nc[r].wlo[ph] && p->pos[ph][cur] <= p->nc[r].whi[ph]);
  else cp_assert(u->outside);
}

bool cg_plan_idle(const CgPlan *p, int ph, int r) {
  return p->use[ph] && !p->recording && p->use[ph][r].lo < 0 && !p->use[ph][r].outside;
}

/* gnext from the leaders (cg_plan.h); returns the leaders it followed */
static int *plan_groups(CgPlan *p) {
  int n = p->g->n, *head = cp_alloc(sizeof(int) * (size_t)(n + 1)), *lead = cp_alloc(sizeof(int) * (size_t)(n + 1));
  p->gnext = cp_alloc(sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) head[i] = p->gnext[i] = -1;
  for (int j = n - 1; j >= 0; j--) {
    int l = p->nc[j].leader;
    if (l >= 0 && l < j) p->gnext[j] = head[l], head[l] = j;
  }
  for (int i = 0; i < n; i++) {
    if (p->nc[i].leader == i) p->gnext[i] = head[i];
    lead[i] = p->nc[i].leader;
  }
  return lead;
}

bool cg_plan_emit(CgPlan *p, FILE *body, bool (*emit)(void *ctx), void *ctx) {
  const int *lead = plan_groups(p);
  const char *e = getenv("CPLAN_PRUNE_ARENA");
  for (int pass = e && strcmp(e, "0") == 0; pass < 2; pass++) {
    if (!pass) cg_plan_record(p);
    cg_plan_phase(p, CG_PH_TRAIN);
    cg_plan_phase(p, CG_PH_EVAL);
    if (!emit(ctx)) return false;
    for (int i = 0; i < p->g->n; i++) cp_assert(p->nc[i].leader == lead[i]); /* gnext still follows them */
    if (pass) break;
    p->recording = false;
    if (fflush(body) != 0 || ftruncate(fileno(body), 0) != 0 || fseek(body, 0, SEEK_SET) != 0) {
      diag_error(SPAN_NONE, "cannot rewind the temporary file of plan.c: %s", strerror(errno));
      return false;
    }
  }
  return true;
}

int64_t cg_plan_peak(const CgPlan *p) {
  return p->work[CG_PH_TRAIN] > p->work[CG_PH_EVAL] ? p->work[CG_PH_TRAIN] : p->work[CG_PH_EVAL];
}

bool cg_forward_skip(FILE *out, const CgPlan *p, int i) {
  const Node *n = nd(p, i);
  if (n->op == OP_RESHAPE) fprintf(out, "  /* a view of %%%d: no copy */\n", n->in[0]);
  else if (n->op == OP_TRANSPOSE && p->nc[i].trans)
    fprintf(out, "  /* not materialized: the GEMMs reading it use the transpose flag */\n");
  else return false;
  return true;
}

bool cg_grad_skip(FILE *out, const CgPlan *p, int i) {
  if (p->nc[i].kind == CG_L_ALIAS) fprintf(out, "  /* the gradient is dy itself (%%%d): no kernel */\n", nd(p, i)->in[0]);
  else if (p->nc[i].leader != i) fprintf(out, "  /* computed together with %%%d */\n", p->nc[i].leader);
  else return false;
  return true;
}

/* ---- the RtPlan tables ---------------------------------------------------------------------- */

/* The padding of whole param p (RtPlanParam.pad_len, pad_valid, pad_inner) when vocab_pad padded
 * it, as C initializers after a comma; "" when it did not. */
static const char *param_pad(const Node *p) {
  if (p->op != OP_PARAM || p->ia[1] <= 0) return "";
  int d = (int)p->ia[2];
  int64_t inner = 1;
  for (int k = d + 1; k < p->shape.rank; k++) inner *= p->shape.d[k];
  return cp_fmt(", %lld, %lld, %lld", (long long)p->shape.d[d], (long long)p->ia[1], (long long)inner);
}

void cg_emit_param_row(FILE *out, const Node *p, int64_t off, bool whole) {
  static const char *const inits[] = {"RT_INIT_ZEROS", "RT_INIT_ONES", "RT_INIT_FULL", "RT_INIT_NORMAL", "RT_INIT_UNIFORM"};
  fprintf(out, "    {%s, %d, %s, %lld, %lld, %s, %.17g, %.17g%s},\n", cg_c_string(p->name), p->shape.rank,
          cg_shape_list(&p->shape), (long long)numel(p), (long long)off, inits[p->ia[0]], p->fa[0], p->fa[1],
          whole ? param_pad(p) : "");
}

void cg_emit_tables(FILE *out, const CgPlan *p, const CgTables *o) {
  const Graph *g = p->g;
  fprintf(out, "\nstatic const RtPlanParam params[] = {\n");
  for (int k = 0; k < g->params.n; k++) cg_emit_param_row(out, nd(p, g->params.a[k]), p->nc[g->params.a[k]].off, false);
  if (!g->params.n) fprintf(out, "    {0},\n");
  fprintf(out, "};\n\nstatic const RtPlanState states[] = {\n");
  for (int k = 0; k < g->states.n; k++) {
    const Node *s = nd(p, g->states.a[k]);
    fprintf(out, "    {%s, %lld, %lld, %d", cg_c_string(s->name), (long long)numel(s), (long long)p->nc[g->states.a[k]].off,
            (int)s->ia[1]);
    if (o->state_reduce) fprintf(out, ", %d", o->state_reduce(o->ctx, k));
    fprintf(out, "},\n");
  }
  if (!g->states.n) fprintf(out, "    {0},\n");
  fprintf(out, "};\n\nstatic const RtPlanInput inputs_[] = {\n");
  for (int k = 0; k < g->inputs.n; k++) {
    const Node *x = nd(p, g->inputs.a[k]);
    fprintf(out, "    {%s, %d, %s, %s},\n", cg_c_string(x->name), x->shape.rank, cg_shape_list(&x->shape),
            x->dtype == DT_I32 ? "RT_I32" : "RT_F32");
  }
  if (!g->inputs.n && o->inputs_row0) fprintf(out, "    {0},\n");
  fprintf(out, "};\n\nstatic const char *const metric_names[] = {");
  for (int k = 0; k < g->metrics.n; k++) fprintf(out, "%s%s", k ? ", " : "", cg_c_string(g->metrics.a[k].name));
  if (o->more_metrics) fprintf(out, "%s%s", g->metrics.n ? ", " : "", o->more_metrics);
  else if (!g->metrics.n) fprintf(out, "NULL");
  fprintf(out, "};\n");
  if (!cg_ce_count(g)) return;
  fprintf(out, "\n/* the cross_entropy nodes and where their targets are counted (RtCeTarget) */\n"
               "static const RtCeTarget ce_targets[] = {\n");
  for (int i = 0; i < g->n; i++) {
    const Node *n = nd(p, i);
    if (!cg_ce_first(g, i)) continue;
    fprintf(out, "    {%d, %d, {%lld, %lld}, %d, %lld, %lld},\n", (int)n->ia[2] - 1, (int)n->dims[0] - 1,
            (long long)n->dims[1], (long long)n->dims[2], (int)n->dims[3], (long long)n->dims[4], (long long)n->dims[5]);
  }
  fprintf(out, "};\n");
}

/* Whether node i is the first cross_entropy node of its ordinal (ce_count_sources) in g. */
bool cg_ce_first(const Graph *g, int i) {
  const Node *n = &g->nodes[i];
  if (n->op != OP_CROSS_ENTROPY || n->ia[2] <= 0) return false;
  for (int j = 0; j < i; j++)
    if (g->nodes[j].op == OP_CROSS_ENTROPY && g->nodes[j].ia[2] == n->ia[2]) return false;
  return true;
}

const char *cg_ce_weight(const Node *n) {
  return n->ia[2] > 0 ? cp_fmt("rt_ce_weight(run, %d)", (int)n->ia[2] - 1) : "1.0f";
}

bool cg_ce_weight_in(const Node *n) {
  return n->op == OP_SCALAR_IN && n->name && strcmp(n->name, "ce_weight") == 0 && n->ia[0] > 0;
}

const char *cg_ce_weight_in_value(const Node *n, bool lowered) {
  return cp_fmt("rt_ce_weight%s(run, %d)", lowered ? "_dp" : "", (int)n->ia[0] - 1);
}

int cg_ce_count(const Graph *g) {
  int k = 0;
  for (int i = 0; i < g->n; i++) k += cg_ce_first(g, i);
  return k;
}

/* ---- the RtPlan fields ---------------------------------------------------------------------- */

void cg_emit_plan_head(FILE *out, const CgPlan *p, const TrainConf *t, const CgPlanHead *h) {
  const Graph *g = p->g;
  static const char *const kinds[] = {"RT_DATA_TOKENS", "RT_DATA_ADDER", "RT_DATA_TENSORS"};
  int64_t accum = g->accum > 0 ? g->accum : 1;
  int64_t seq = ir_seq_len(g);
  const MeshConf *m = t->mesh;
  if (m && m->naxes) {
    fprintf(out, "\n/* mesh %s: axis sizes, outermost first */\nstatic const int64_t mesh_axes[] = {", m->name ? m->name : "");
    for (int k = 0; k < m->naxes; k++) fprintf(out, "%s%lld", k ? ", " : "", (long long)m->axes[k].size);
    fprintf(out, "};\nstatic const char *const mesh_axis_names[] = {");
    for (int k = 0; k < m->naxes; k++) fprintf(out, "%s%s", k ? ", " : "", cg_c_string(m->axes[k].name));
    fprintf(out, "};\n");
  }
  fprintf(out, "\nconst RtPlan cplan_plan = {\n");
  fprintf(out, "    .model = %s,\n    .source = %s,\n    .source_hash = %s,\n", cg_c_string(g->model_name),
          cg_c_string(t->span.file >= 0 ? src_path(t->span.file) : ""), cg_c_string(h->hash));
  fprintf(out, "    .nparams = %d,\n    .params = params,\n    .param_floats = %lld,\n", g->params.n,
          (long long)p->param_floats);
  fprintf(out, "    .nstates = %d,\n    .states = states,\n    .state_floats = %lld,\n", g->states.n,
          (long long)p->state_floats);
  fprintf(out, "    .work_bytes = %s\n", h->work_bytes);
  fprintf(out, "    .ninputs = %d,\n    .inputs = inputs_,\n    .nmetrics = %d,\n    .metric_names = metric_names,\n",
          g->inputs.n, h->nmetrics);
  fprintf(out, "    .data_kind = %s,\n    .data_path = %s,\n    .val_path = %s,\n    .digits = %lld,\n",
          kinds[t->data.kind], cg_c_string(cg_abs_path(t->data.path)), cg_c_string(cg_abs_path(t->data.val_path)),
          (long long)t->data.digits);
  fprintf(out, "    .vocab = %lld,\n    .seq_len = %lld,\n", (long long)h->vocab, (long long)seq);
  fprintf(out, "    .batch = %lld,\n    .micro = %lld,\n    .accum = %lld,\n    .steps = %lld,\n    .seed = %lld,\n",
          (long long)t->batch, (long long)h->micro, (long long)accum, (long long)t->steps, (long long)t->seed);
  fprintf(out, "    .eval_every = %lld,\n    .eval_batches = %lld,\n", (long long)t->eval_every,
          (long long)t->eval_batches);
  fprintf(out, "    .ckpt_every = %lld,\n    .ckpt_keep = %lld,\n    .ckpt_dir = %s,\n", (long long)t->ckpt_every,
          (long long)t->ckpt_keep, cg_c_string(cg_abs_path(t->ckpt_dir)));
  fprintf(out, "    .log_every = %lld,\n    .log_file = %s,\n", (long long)t->log_every,
          cg_c_string(cg_abs_path(t->log_file)));
  fprintf(out, "    .flops_per_step = %.17g,\n", cg_step_flops(g));
  if (cg_ce_count(g)) fprintf(out, "    .nce = %d,\n    .ce_targets = ce_targets,\n", cg_ce_count(g));
}

void cg_emit_plan_mesh(FILE *out, int64_t dp, int64_t devices, const MeshConf *m) {
  fprintf(out, "    .dp = %lld,\n    .devices = %lld,\n    .mesh = %s,\n", (long long)dp, (long long)devices,
          cg_c_string(m ? m->name : NULL));
  if (m && m->naxes)
    fprintf(out, "    .nmesh_axes = %d,\n    .mesh_axes = mesh_axes,\n    .mesh_axis_names = mesh_axis_names,\n",
            m->naxes);
}

/* ---- tensor parallelism: whole tensors and where a shard's elements go -------------------------- */

/* One param or state of the global graph: its global shape, its local one, and per strategy
 * axis the split dim (-1: whole) and the block count of the blocked layout (lower.h). */
static void emit_gi_row(FILE *out, const StratPlan *sp, const Lowered *lw, int gi) {
  const Node *gn = &sp->g->nodes[gi], *ln = &lw->g->nodes[lw->map[gi]];
  fprintf(out, "    {%d, {", gn->shape.rank);
  for (int d = 0; d < gn->shape.rank; d++) fprintf(out, "%s%lld", d ? ", " : "", (long long)gn->shape.d[d]);
  fprintf(out, "}, {");
  for (int d = 0; d < ln->shape.rank; d++) fprintf(out, "%s%lld", d ? ", " : "", (long long)ln->shape.d[d]);
  fprintf(out, "}, {");
  for (int a = 0; a < sp->naxes; a++) {
    Pl p = sp->pl[gi].ax[a];
    int split = p.kind == PL_S && p.dim < gn->shape.rank;
    fprintf(out, "%s%d", a ? ", " : "", split ? p.dim : -1);
  }
  fprintf(out, "}, {");
  for (int a = 0; a < sp->naxes; a++) fprintf(out, "%s%d", a ? ", " : "", sp->axes[a].role == AX_TP ? lw->blocks[gi] : 1);
  fprintf(out, "}},\n");
}

/* The global index of a shard element computed at run time from the tables must be
 * lower_global_index's: checked here on the first and last element of every shard. */
static int64_t gi_model(const StratPlan *sp, const Lowered *lw, int gi, const int64_t *coord, int64_t local) {
  const Node *gn = &sp->g->nodes[gi], *ln = &lw->g->nodes[lw->map[gi]];
  int64_t idx[CP_MAX_RANK], rest = local;
  for (int d = ln->shape.rank - 1; d >= 0; d--) idx[d] = rest % ln->shape.d[d], rest /= ln->shape.d[d];
  int64_t cur[CP_MAX_RANK];
  for (int d = 0; d < ln->shape.rank; d++) cur[d] = ln->shape.d[d];
  for (int a = 0; a < sp->naxes; a++) {
    Pl p = sp->pl[gi].ax[a];
    if (p.kind != PL_S || p.dim >= gn->shape.rank) continue;
    int64_t b = sp->axes[a].role == AX_TP ? lw->blocks[gi] : 1, part = cur[p.dim] / b, j = idx[p.dim];
    idx[p.dim] = (j / part) * (cur[p.dim] * sp->axes[a].n / b) + coord[a] * part + j % part;
    cur[p.dim] *= sp->axes[a].n;
  }
  int64_t g = 0;
  for (int d = 0; d < gn->shape.rank; d++) g = g * gn->shape.d[d] + idx[d];
  return g;
}

static void check_gi(const StratPlan *sp, const Lowered *lw, int gi) {
  int64_t n = numel(&lw->g->nodes[lw->map[gi]]), coord[3] = {0, 0, 0};
  if (sp->naxes == 0) return;
  for (int64_t r = 0; r < sp->axes[sp->naxes - 1].n; r++) {
    coord[sp->naxes - 1] = r;
    for (int64_t l = 0; l < n; l += n - 1 > 0 ? n - 1 : 1)
      cp_assert(gi_model(sp, lw, gi, coord, l) == lower_global_index(sp, lw, gi, coord, l));
  }
}

void cg_emit_global_tables(FILE *out, const StratPlan *sp, const Lowered *lw, const PipeStage *ps, CgGlobal *o) {
  const Graph *gg = sp->g;
  fprintf(out, "\n/* tensor parallelism: per param, then per state: global shape, local shape, per strategy axis\n"
       " * the split dim (-1: whole) and the blocks of the blocked layout (compiler/lower.h) */\n"
       "typedef struct GiInfo { int rank; int64_t gs[%d], ls[%d]; int dim[%d], blocks[%d]; } GiInfo;\n",
       CP_MAX_RANK, CP_MAX_RANK, sp->naxes, sp->naxes);
  fprintf(out, "static const int64_t plan_axes[] = {");
  for (int a = 0; a < sp->naxes; a++) fprintf(out, "%s%lld", a ? ", " : "", (long long)sp->axes[a].n);
  fprintf(out, "};\nstatic const char *const plan_axis_names[] = {");
  for (int a = 0; a < sp->naxes; a++) fprintf(out, "%s\"%s\"", a ? ", " : "", strat_axis_name(sp->axes[a].role));
  fprintf(out, "};\n");
  fprintf(out, "static const GiInfo gi_params[] = {\n");
  for (int k = 0; k < gg->params.n; k++) emit_gi_row(out, sp, lw, gg->params.a[k]), check_gi(sp, lw, gg->params.a[k]);
  fprintf(out, "};\nstatic const GiInfo gi_states[] = {\n");
  for (int k = 0; k < gg->states.n; k++) emit_gi_row(out, sp, lw, gg->states.a[k]), check_gi(sp, lw, gg->states.a[k]);
  if (!gg->states.n) fprintf(out, "    {0},\n");
  fprintf(out, "};\n");
  const char *kp = "k", *ks = "k";
  if (ps) { /* this stage's params and states among the global ones (pipeline.h) */
    fprintf(out, "static const int param_global[] = {");
    for (int k = 0; k < ps->g->params.n; k++) fprintf(out, "%s%d", k ? ", " : "", ps->gparam[k]);
    fprintf(out, "%s};\nstatic const int state_global[] = {", ps->g->params.n ? "" : "0");
    for (int k = 0; k < ps->g->states.n; k++) fprintf(out, "%s%d", k ? ", " : "", ps->gstate[k]);
    fprintf(out, "%s};\nstatic const unsigned char param_owned[] = {", ps->g->states.n ? "" : "0");
    for (int k = 0; k < ps->g->params.n; k++) fprintf(out, "%s%d", k ? ", " : "", ps->owned[k]);
    fprintf(out, "%s};\nstatic const int state_part_to[] = {", ps->g->params.n ? "" : "0");
    for (int k = 0; k < ps->g->states.n; k++) fprintf(out, "%s%d", k ? ", " : "", ps->part_to[k]);
    fprintf(out, "%s};\n", ps->g->states.n ? "" : "-1");
    kp = "param_global[k]", ks = "state_global[k]";
  }
  fprintf(out, "\n/* The global (row-major) index of element `local` of the shard that the rank at strategy\n"
       " * coordinates coord holds of param k (state: of state k).\n"
       " * Axes in order: where two split the same dim, the later splits the earlier's shard (lower.c). */\n"
       "static int64_t global_index(int state, int k, const int64_t *coord, int64_t local) {\n"
       "  const GiInfo *t = state ? &gi_states[%s] : &gi_params[%s];\n"
       "  int64_t idx[%d], cur[%d], rest = local, g = 0;\n"
       "  for (int d = t->rank - 1; d >= 0; d--) idx[d] = rest %% t->ls[d], rest /= t->ls[d], cur[d] = t->ls[d];\n"
       "  for (int a = 0; a < %d; a++) {\n"
       "    int d = t->dim[a];\n"
       "    if (d < 0) continue;\n"
       "    int64_t part = cur[d] / t->blocks[a], j = idx[d];\n"
       "    idx[d] = (j / part) * (cur[d] * plan_axes[a] / t->blocks[a]) + coord[a] * part + j %% part;\n"
       "    cur[d] *= plan_axes[a];\n"
       "  }\n"
       "  for (int d = 0; d < t->rank; d++) g = g * t->gs[d] + idx[d];\n"
       "  return g;\n}\n", ks, kp, CP_MAX_RANK, CP_MAX_RANK, sp->naxes);
  fprintf(out, "\nstatic int split_dim(int state, int k, int a) { return (state ? &gi_states[%s] : &gi_params[%s])->dim[a]; }\n",
       ks, kp);
  int64_t off = 0;
  fprintf(out, "\n/* the whole params and states, as a one-device plan lays them out (--save, checkpoints) */\n"
       "static const RtPlanParam gparams[] = {\n");
  for (int k = 0; k < gg->params.n; k++) {
    const Node *p = &gg->nodes[gg->params.a[k]];
    cg_emit_param_row(out, p, off, true);
    off += align16(numel(p));
  }
  o->gparam_floats = off;
  off = 0;
  fprintf(out, "};\nstatic const RtPlanState gstates[] = {\n");
  for (int k = 0; k < gg->states.n; k++) {
    const Node *st = &gg->nodes[gg->states.a[k]];
    const Node *pn = &gg->nodes[st->ia[0]]; /* a padded param's state of its shape is padded alike */
    const char *pad = numel(st) == numel(pn) ? param_pad(pn) : "";
    fprintf(out, "    {%s, %lld, %lld, %d%s%s},\n", cg_c_string(st->name), (long long)numel(st), (long long)off,
            (int)st->ia[1], *pad ? ", 0" : "", pad);
    off += align16(numel(st));
  }
  if (!gg->states.n) fprintf(out, "    {0},\n");
  fprintf(out, "};\n");
  o->gstate_floats = off;
}

void cg_emit_plan_lowered(FILE *out, const StratPlan *sp, const CgGlobal *gt) {
  int dpa = -1, tpa = -1;
  for (int a = 0; a < sp->naxes; a++) {
    if (sp->axes[a].role == AX_DP) dpa = a;
    if (sp->axes[a].role == AX_TP) tpa = a;
  }
  fprintf(out, "    .tp = %lld,\n    .sp = %lld,\n    .zero = %d,\n    .nplan_axes = %d,\n    .plan_axes = plan_axes,\n"
          "    .plan_axis_names = plan_axis_names,\n", (long long)sp->tp, (long long)sp->sp, (int)sp->zero, sp->naxes);
  fprintf(out, "    .dp_axis = %d,\n    .tp_axis = %d,\n    .gparams = gparams,\n    .gparam_floats = %lld,\n", dpa, tpa,
          (long long)gt->gparam_floats);
  fprintf(out, "    .gstates = gstates,\n    .gstate_floats = %lld,\n    .global_index = global_index,\n    .split_dim = split_dim,\n",
          (long long)gt->gstate_floats);
}

void cg_emit_plan_pipeline(FILE *out, const StratPlan *sp, const Pipeline *pipe, int stage, int ppa, const TrainConf *t) {
  fprintf(out, "    .pp = %d,\n    .stage = %d,\n    .stage_plans = cplan_stages,\n    .pp_axis = %d,\n    .pp_schedule = %d,\n"
          "    .param_global = param_global,\n    .state_global = state_global,\n    .param_owned = param_owned,\n"
          "    .state_part_to = state_part_to,\n"
          "    .ngparams = %d,\n    .ngstates = %d,\n    .pp_chunks = %d,\n    .grad_sumsq = update_grad_sumsq,\n",
          pipe->devices, stage, ppa, t->strategy.pipeline == PS_GPIPE ? 1 : 0, sp->g->params.n, sp->g->states.n,
          pipe->chunks);
}

void cg_emit_pipeline_main(FILE *out, int pp, bool cuda) {
  fprintf(out, "/* plan.c: the stages of a pipeline-parallel plan (plan_s0.c ... plan_s%d.c), generated by cplanc %s.\n"
               " * rt_main runs the stage of the rank's pp coordinate. Do not edit. */\n#include \"cplanrt.h\"\n\n%s",
          pp - 1, CPLAN_VERSION, cuda ? "#include <string.h>\n\n" : "");
  for (int s = 0; s < pp; s++) fprintf(out, "extern const RtPlan cplan_plan_s%d;\n", s);
  for (int s = 0; s < pp && cuda; s++) fprintf(out, "void cplan_gpu_init_s%d(int argc, char **argv);\n", s);
  fprintf(out, "const RtPlan *const cplan_stages[] = {");
  for (int s = 0; s < pp; s++) fprintf(out, "%s&cplan_plan_s%d", s ? ", " : "", s);
  fprintf(out, "};\n\nint main(int argc, char **argv) {\n");
  if (cuda) {
    /* the device is checked before MPI starts; each stage allocates its device memory when the
     * rank first runs it */
    fprintf(out, "  int help = 0;\n  for (int i = 1; i < argc; i++) help |= strcmp(argv[i], \"--help\") == 0;\n  if (!help) {\n");
    for (int s = 0; s < pp; s++) fprintf(out, "    cplan_gpu_init_s%d(argc, argv);\n", s);
    fprintf(out, "  }\n");
  }
  fprintf(out, "  return rt_main(argc, argv, &cplan_plan_s0);\n}\n");
}
