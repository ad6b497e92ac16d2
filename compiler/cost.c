/* cost.c: the cost model (cost.h). Figures per device, in seconds and bytes.
 *
 * What is approximate, on purpose: efficiency factors are per op class, not per shape (on a
 * calibrated CPU profile, matmuls take the measured GEMM curve at their size and memory-bound ops
 * their kernel's measured bandwidth, which was measured out of cache: small tensors run faster);
 * collectives follow the alpha-beta model of one ring or tree over the slowest link the group
 * spans (NCCL's hierarchical algorithms are faster across nodes); nothing overlaps communication
 * with compute. */
#include "cost.h"

#include <math.h>
#include <string.h>

/* Fraction of peak reached per class. Sources: cuBLAS bf16 GEMMs of transformer shapes reach
 * 70-80% of an A100's 312 TFLOP/s (Megatron-LM, Narayanan et al. 2021, figure 10); fused
 * attention about 50-60% (FlashAttention-2, Dao 2023); memory-bound kernels 80% of HBM. */
static const double class_eff[CC__COUNT] = {0.75, 0.55, 0.80};

CostClass cost_class(const Graph *g, int i) {
  OpId op = g->nodes[i].op;
  if (op == OP_GRAD) op = g->nodes[g->nodes[i].fwd].op;
  return op == OP_MATMUL ? CC_MATMUL : op == OP_SDPA ? CC_ATTENTION : CC_MEMORY;
}

/* Bytes of optimizer state per param element (f32 slots). */
static double optim_bytes(const OptimizerConf *o) {
  switch (o->kind) {
  case OPT_ADAMW:
  case OPT_LAMB: return 8;
  case OPT_SGD: return o->momentum > 0 ? 4 : 0;
  case OPT_LARS: return 4;
  }
  cp_unreachable();
}

void cost_init(CostModel *cm, const TrainConf *t) {
  memset(cm, 0, sizeof *cm);
  cm->mesh = t && t->mesh ? t->mesh : settings_default_mesh();
  cm->dev = cm->mesh->device;
  bool low = t && t->precision != PREC_F32;
  cm->peak = low ? cm->dev.flops_bf16 : cm->dev.flops_f32;
  for (int c = 0; c < CC__COUNT; c++) cm->eff[c] = class_eff[c];
  if (cm->dev.kind == DEV_CPU && cm->dev.measured) {
    cm->meas = cm->dev.measured;
    /* elementwise kernels stand for the rest of the memory-bound ops and the optimizer update */
    if (cm->meas->eff_gelu > 0) cm->eff[CC_MEMORY] = cm->meas->eff_gelu;
  }
  bool gpu = cm->dev.kind == DEV_CUDA;
  cm->launch = gpu ? 4e-6 : 1e-6;
  cm->act_size = low ? 2 : 4;
  cm->w_bytes = low ? 6 : 4; /* f32 master weights, plus the bf16/f16 copy the kernels read */
  cm->g_bytes = 4;           /* f32 gradient accumulators */
  cm->o_bytes = t ? optim_bytes(&t->optimizer) : 8;
  cm->workspace = gpu ? 2.0 * (1 << 30) : 64.0 * (1 << 20); /* CUDA context, cuBLAS/NCCL buffers */
}

double cost_act_bytes(const CostModel *cm, const Graph *g, int i) {
  const Node *n = &g->nodes[i];
  double size = n->dtype == DT_I32 ? 4 : cm->act_size;
  return (double)shape_numel(&n->shape) * size;
}

double cost_gemm_eff(const DeviceMeasured *m, double n) {
  const ProfilePoint *p = m->gemm;
  int k = m->ngemm;
  if (k == 0) return class_eff[CC_MATMUL];
  if (n <= p[0].x) return p[0].y;
  for (int j = 1; j < k; j++)
    if (n <= p[j].x) {
      double f = log(n / p[j - 1].x) / log(p[j].x / p[j - 1].x);
      return p[j - 1].y + f * (p[j].y - p[j - 1].y);
    }
  return p[k - 1].y;
}

/* The measured bandwidth fraction of the kernel that stands for op (norms: layer_norm; softmax,
 * log_softmax, cross_entropy: softmax; anything else: elementwise), or `dflt` when not measured. */
static double kernel_eff(const DeviceMeasured *m, OpId op, double dflt) {
  double e = m->eff_gelu;
  if (op == OP_LAYER_NORM || op == OP_RMS_NORM) e = m->eff_layer_norm;
  if (op == OP_SOFTMAX || op == OP_LOG_SOFTMAX || op == OP_CROSS_ENTROPY) e = m->eff_softmax;
  return e > 0 ? e : dflt;
}

double cost_node(const CostModel *cm, const Graph *g, int i, double split) {
  const Node *n = &g->nodes[i];
  if (ir_ops[n->op].flags & OPF_LEAF) return 0;
  double flops = ir_node_flops(g, i) / split, bytes = cost_act_bytes(cm, g, i);
  for (int k = 0; k < n->nin; k++) bytes += cost_act_bytes(cm, g, n->in[k]);
  bytes /= split;
  CostClass c = cost_class(g, i);
  double eff = cm->eff[c], mem_eff = cm->eff[CC_MEMORY];
  if (cm->meas) {
    OpId op = n->op == OP_GRAD ? g->nodes[n->fwd].op : n->op;
    /* an m x k x n GEMM as the cube of the same work: its measured efficiency at that size */
    if (c == CC_MATMUL && cm->meas->ngemm > 0 && flops > 0) eff = cost_gemm_eff(cm->meas, cbrt(flops / 2));
    if (c == CC_MEMORY) mem_eff = kernel_eff(cm->meas, op, mem_eff);
  }
  double t_flops = cm->peak > 0 && eff > 0 ? flops / (cm->peak * eff) : 0;
  double t_bytes = cm->dev.hbm > 0 ? bytes / (cm->dev.hbm * mem_eff) : 0;
  return cm->launch + (t_flops > t_bytes ? t_flops : t_bytes);
}

CostLink cost_group_link(const CostModel *cm, int64_t stride, int64_t n) {
  const MeshConf *m = cm->mesh;
  CostLink l = {0, 0};
  double cum = 1;
  for (int i = m->naxes - 1; i >= 0; i--) { /* innermost first */
    const MeshAxis *a = &m->axes[i];
    double period = cum * (double)a->size;
    bool used = (double)stride * (double)(n - 1) >= cum && fmod((double)stride, period) != 0;
    if (used && a->size > 1) {
      if (l.bw == 0 || a->bandwidth < l.bw) l.bw = a->bandwidth;
      if (a->latency > l.lat) l.lat = a->latency;
    }
    cum = period;
  }
  if (l.bw == 0) { /* one device, or a group on no axis: the fastest link there is */
    l.bw = m->naxes ? m->axes[m->naxes - 1].bandwidth : cm->dev.intra_bw;
    l.lat = m->naxes ? m->axes[m->naxes - 1].latency : cm->dev.intra_latency;
  }
  if (l.bw <= 0) l.bw = cm->dev.intra_bw > 0 ? cm->dev.intra_bw : 1e9;
  return l;
}

double cost_coll(Collective c, double bytes, int64_t n, CostLink l) {
  if (n <= 1 || bytes <= 0) return 0;
  double f = (double)(n - 1), per = pl_coll_bytes(c, bytes, n) / l.bw;
  switch (c) {
  case COLL_ALL_REDUCE: {
    double ring = 2 * f * l.lat + per;
    double tree = 2 * ceil(log2((double)n)) * l.lat + 2 * bytes / l.bw; /* double binary tree, pipelined */
    return ring < tree ? ring : tree;
  }
  case COLL_REDUCE_SCATTER:
  case COLL_ALL_GATHER:
  case COLL_ALL_TO_ALL: return f * l.lat + per;
  default: return 0;
  }
}

double cost_collective(const CostModel *cm, Collective c, double bytes, int64_t n, CostLink l) {
  const DeviceMeasured *m = cm->meas;
  int pc = -1;
  if (c == COLL_ALL_REDUCE) pc = PC_ALL_REDUCE;
  if (c == COLL_ALL_GATHER) pc = PC_ALL_GATHER;
  if (c == COLL_REDUCE_SCATTER) pc = PC_REDUCE_SCATTER;
  if (m && pc >= 0 && n > 1 && n == m->coll_ranks && bytes > 0 && m->coll[pc].npoints > 0 &&
      l.bw == cm->dev.intra_bw && l.lat == cm->dev.intra_latency)
    return m->coll[pc].alpha + m->coll[pc].beta * bytes;
  return cost_coll(c, bytes, n, l);
}

double cost_p2p(double bytes, CostLink l) { return bytes > 0 ? l.lat + bytes / l.bw : 0; }

double cost_bubble(PipeSched s, int64_t pp, int64_t micro, int64_t v) {
  if (pp <= 1) return 0;
  double b = (double)(pp - 1);
  if (s == PS_INTERLEAVED && v > 1) b /= (double)v;
  return b / ((double)micro + b);
}

double cost_inflight(PipeSched s, int64_t pp, int64_t stage, int64_t micro, int64_t v) {
  double f;
  if (pp <= 1) f = 1;
  else if (s == PS_GPIPE) f = (double)micro;
  else if (s == PS_INTERLEAVED && v > 1) f = (double)(pp - stage) + (double)(pp - 1) / (double)v;
  else f = (double)(pp - stage);
  return f < (double)micro ? f : (double)micro;
}
