/* cost.h: the cost model of the strategy search (DESIGN.md §5, issue 5).
 *
 * Compute: a roofline per op, max(FLOPs / (peak · efficiency of the op's class), bytes / (HBM ·
 * efficiency)), plus a launch overhead. Collectives: the alpha-beta model of NCCL's ring and tree
 * algorithms over the links of the mesh axes a device group spans. The pipeline bubble of a
 * schedule. Memory per device: params, grads and optimizer state (sharded by the ZeRO stage) and
 * the activations of the micro-batches in flight. Every figure comes from the mesh's device
 * profile (MeshConf.device, devices.def or a calibrated profile) and its link settings. */
#ifndef CPLAN_COST_H
#define CPLAN_COST_H

#include "placement.h"

/* The op classes efficiency factors apply to. */
typedef enum CostClass { CC_MATMUL, CC_ATTENTION, CC_MEMORY, CC__COUNT } CostClass;

typedef struct CostLink {
  double bw;             /* bytes/s per device: the slowest axis the group spans */
  double lat;            /* seconds per message: the slowest axis the group spans */
} CostLink;

typedef struct CostModel {
  const MeshConf *mesh;
  DeviceProfile dev;
  double peak;           /* FLOP/s per device at the plan's precision */
  double eff[CC__COUNT]; /* fraction of peak each class reaches (CC_MEMORY: of the HBM bandwidth) */
  double launch;         /* seconds of fixed overhead per kernel */
  double act_size;       /* bytes per activation element at the compute dtype */
  double w_bytes;        /* bytes per param element held for the weights (master + compute copy) */
  double g_bytes;        /* bytes per param element of gradient accumulators */
  double o_bytes;        /* bytes per param element of optimizer state */
  double workspace;      /* fixed bytes per device (framework, allocator slack, kernel workspace) */
  /* A calibrated CPU profile's measurements (`cplanc calibrate`), or NULL: matmuls then reach the
   * GEMM curve's efficiency at their size, memory-bound ops their kernel's measured efficiency,
   * collectives of the calibrated rank count the fitted alpha + beta * bytes (cost_collective). */
  const DeviceMeasured *meas;
} CostModel;

/* Fills the model from the train block's mesh (or the local machine) and precision/optimizer. */
void cost_init(CostModel *cm, const TrainConf *t);

/* The class of a node (matmuls, attention, everything else memory-bound). */
CostClass cost_class(const Graph *g, int i);
/* Forward seconds of node i when its work is divided by `split` devices. */
double cost_node(const CostModel *cm, const Graph *g, int i, double split);
/* Bytes node i's output takes at the compute dtype (integer tensors keep theirs). */
double cost_act_bytes(const CostModel *cm, const Graph *g, int i);

/* The links a group of n devices whose ranks are `stride` apart uses, on the physical mesh axes
 * (innermost axis last in MeshConf.axes, consecutive ranks): the slowest axis it spans. */
CostLink cost_group_link(const CostModel *cm, int64_t stride, int64_t n);
/* Seconds of collective c on n devices over link l; `bytes` is the whole tensor on the group (as
 * pl_coll_bytes takes it). All-reduce takes the faster of ring and tree. */
double cost_coll(Collective c, double bytes, int64_t n, CostLink l);
/* cost_coll, or on a calibrated CPU profile (CostModel.meas) for a group of the calibrated rank count
 * over the profile's own link (no `link` setting overrides it), the measured fit alpha + beta *
 * bytes of all-reduce, all-gather or reduce-scatter. */
double cost_collective(const CostModel *cm, Collective c, double bytes, int64_t n, CostLink l);
/* The measured GEMM efficiency (fraction of flops_f32) of an n x n x n GEMM: the calibrated curve,
 * linear in log n between its points, its end values outside them. */
double cost_gemm_eff(const DeviceMeasured *m, double n);
/* Seconds of a point-to-point send of `bytes` over link l. */
double cost_p2p(double bytes, CostLink l);

/* The fraction of a pipelined step spent idle: (pp-1)/(micro+pp-1) for 1F1B and GPipe, the
 * interleaved schedule divides the bubble's length by v (chunks per device). */
double cost_bubble(PipeSched s, int64_t pp, int64_t micro, int64_t v);
/* Micro-batches whose activations a stage holds at once: GPipe all of them, 1F1B pp - stage,
 * interleaved about pp + (pp - 1 - stage) / v ... capped by micro. */
double cost_inflight(PipeSched s, int64_t pp, int64_t stage, int64_t micro, int64_t v);

#endif
