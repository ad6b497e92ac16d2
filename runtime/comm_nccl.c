/* comm_nccl.c: rt_nccl, the collectives of rt_comm over NCCL for GPU ranks (cplanrt_cuda.h).
 *
 * One process per GPU. MPI (rt_comm) starts the processes and carries rank 0's ncclUniqueId to
 * the others; after that every collective runs on NCCL. The communicators are created
 * non-blocking (ncclConfig_t.blocking = 0): a call returns ncclInProgress instead of blocking,
 * and nccl_wait polls ncclCommGetAsyncError until it is done, an error, or the deadline of
 * CPLAN_COMM_TIMEOUT seconds (default 300). So a dead or stuck peer ends the run with a message
 * naming the rank, the call and the group, never a hang; the same message path serves every
 * failed call (NCCL_CHECK), after which this rank's communicators are aborted and MPI_Abort
 * stops every rank (rt_comm_abort). */
#include "cplanrt_cuda.h"

#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct RtNccl {
  ncclComm_t comm;
  int rank, size;
  char name[64];   /* "world", "axis dp" */
  uint64_t bytes;  /* passed to collectives and sends */
};

#define MAX_COMMS 64
static RtComm *mpi_world; /* for aborting every rank */
static int world_rank = -1;
static RtNccl *live[MAX_COMMS]; /* every communicator of this rank, for the abort */

static void track(RtNccl *c, int add) {
  for (int i = 0; i < MAX_COMMS; i++)
    if (add ? live[i] == NULL : live[i] == c) {
      live[i] = add ? c : NULL;
      return;
    }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double timeout_s(void) {
  const char *e = getenv("CPLAN_COMM_TIMEOUT");
  double t = e && *e ? atof(e) : 300.0;
  return t > 0 ? t : 300.0;
}

static void die(const RtNccl *c, const char *msg) __attribute__((noreturn));
static void die(const RtNccl *c, const char *msg) {
  (void)c;
  for (int i = 0; i < MAX_COMMS; i++)
    if (live[i]) ncclCommAbort(live[i]->comm); /* frees NCCL's resources; peers see the error */
  if (mpi_world) rt_comm_abort(mpi_world, 1, msg);
  fprintf(stderr, "cplan: rank %d: %s\n", world_rank, msg);
  fflush(stderr);
  exit(1);
}

static void nccl_die(const RtNccl *c, const char *call, const char *what) __attribute__((noreturn));
static void nccl_die(const RtNccl *c, const char *call, const char *what) {
  char msg[768];
  snprintf(msg, sizeof msg, "%s failed on group '%s' (rank %d of %d): %s", call, c ? c->name : "world",
           c ? c->rank : world_rank, c ? c->size : 0, what);
  die(c, msg);
}

/* The call's result rc; while in progress, polls the communicator until done or the deadline. */
static void nccl_wait(RtNccl *c, const char *call, ncclResult_t rc) {
  double deadline = now_s() + timeout_s();
  while (rc == ncclInProgress) {
    if (now_s() > deadline) {
      char what[128];
      snprintf(what, sizeof what, "did not finish within %g s (CPLAN_COMM_TIMEOUT)", timeout_s());
      nccl_die(c, call, what);
    }
    struct timespec pause = {0, 100000}; /* 0.1 ms */
    nanosleep(&pause, NULL);
    if (ncclCommGetAsyncError(c->comm, &rc) != ncclSuccess) rc = ncclInternalError;
  }
  if (rc != ncclSuccess) {
    char what[512];
    const char *last = c && c->comm ? ncclGetLastError(c->comm) : NULL;
    snprintf(what, sizeof what, "%s%s%s", ncclGetErrorString(rc), last && *last ? ": " : "", last ? last : "");
    nccl_die(c, call, what);
  }
}

#define NCCL_CHECK(c, call) nccl_wait((c), #call, (call))

static ncclDataType_t nccl_type(RtNcclType t) {
  /* Checklist: one case per RtNcclType (and type_size below). */
  switch (t) {
  case RT_NCCL_F32: return ncclFloat32;
  case RT_NCCL_F64: return ncclFloat64;
  case RT_NCCL_I64: return ncclInt64;
  case RT_NCCL_U8: return ncclUint8;
  case RT_NCCL_BF16: return ncclBfloat16;
  case RT_NCCL_F16: return ncclFloat16;
  case RT_NCCL_I32: return ncclInt32;
  case RT_NCCL_TYPE_COUNT: break;
  }
  return ncclFloat32;
}

static size_t type_size(RtNcclType t) {
  return t == RT_NCCL_U8 ? 1 : t == RT_NCCL_BF16 || t == RT_NCCL_F16 ? 2 : t == RT_NCCL_F32 || t == RT_NCCL_I32 ? 4 : 8;
}

static void check_args(RtNccl *c, const char *op, int64_t count, RtNcclType t) {
  if (count < 0 || (unsigned)t >= RT_NCCL_TYPE_COUNT) {
    char what[128];
    snprintf(what, sizeof what, "bad count %lld or type %d", (long long)count, (int)t);
    nccl_die(c, op, what);
  }
}

static ncclConfig_t nonblocking(void) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

/* ---- communicators ------------------------------------------------------------------------------ */

RtNccl *rt_nccl_init(RtComm *world, int device) {
  mpi_world = world;
  world_rank = rt_comm_rank(world);
  RtNccl *c = calloc(1, sizeof *c);
  c->rank = world_rank;
  c->size = rt_comm_size(world);
  snprintf(c->name, sizeof c->name, "world");
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) nccl_die(c, "cudaSetDevice", cudaGetErrorString(e));
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (c->rank == 0) {
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) nccl_die(c, "ncclGetUniqueId", ncclGetErrorString(rc));
  }
  rt_comm_broadcast(world, &id, (int64_t)sizeof id, RT_COMM_U8, 0);
  ncclConfig_t cfg = nonblocking();
  ncclResult_t rc = ncclCommInitRankConfig(&c->comm, c->size, id, c->rank, &cfg);
  if (rc != ncclSuccess && rc != ncclInProgress) nccl_die(c, "ncclCommInitRankConfig", ncclGetErrorString(rc));
  nccl_wait(c, "ncclCommInitRankConfig", rc);
  track(c, 1);
  return c;
}

void rt_nccl_split_axes(RtNccl *world, const int64_t *sizes, const char *const *names, int naxes, RtNccl **groups) {
  int64_t stride[RT_ST_MAX_DIMS + 1], prod = 1;
  if (naxes < 0 || naxes > RT_ST_MAX_DIMS) nccl_die(world, "rt_nccl_split_axes", "bad number of mesh axes");
  for (int i = naxes - 1; i >= 0; i--) stride[i] = prod, prod *= sizes[i];
  if (prod != world->size) {
    char what[160];
    snprintf(what, sizeof what, "a mesh of %lld devices cannot be split over %d ranks", (long long)prod, world->size);
    nccl_die(world, "rt_nccl_split_axes", what);
  }
  for (int i = 0; i < naxes; i++) {
    int64_t coord = world->rank / stride[i] % sizes[i];
    int color = (int)(world->rank - coord * stride[i]); /* the rank with this coordinate at 0 */
    RtNccl *g = calloc(1, sizeof *g);
    snprintf(g->name, sizeof g->name, "axis %s", names && names[i] ? names[i] : "?");
    ncclConfig_t cfg = nonblocking();
    g->rank = (int)coord;
    g->size = (int)sizes[i];
    ncclResult_t rc = ncclCommSplit(world->comm, color, (int)coord, &g->comm, &cfg);
    if (rc != ncclSuccess && rc != ncclInProgress) nccl_die(world, "ncclCommSplit", ncclGetErrorString(rc));
    nccl_wait(g, "ncclCommSplit", rc); /* non-blocking: the new communicator reports when it is ready */
    track(g, 1);
    groups[i] = g;
  }
}

int rt_nccl_rank(const RtNccl *c) { return c->rank; }
int rt_nccl_size(const RtNccl *c) { return c->size; }
const char *rt_nccl_name(const RtNccl *c) { return c->name; }
uint64_t rt_nccl_bytes(const RtNccl *c) { return c->bytes; }

void rt_nccl_free(RtNccl *c) {
  if (!c) return;
  NCCL_CHECK(c, ncclCommFinalize(c->comm));
  NCCL_CHECK(c, ncclCommDestroy(c->comm));
  track(c, 0);
  free(c);
}

void rt_nccl_abort(RtNccl *c, int code, const char *msg) {
  (void)code;
  die(c, msg);
}

/* ---- collectives -------------------------------------------------------------------------------- */

void rt_nccl_all_reduce(RtNccl *c, void *buf, int64_t count, RtNcclType t, cudaStream_t s) {
  check_args(c, "rt_nccl_all_reduce", count, t);
  NCCL_CHECK(c, ncclAllReduce(buf, buf, (size_t)count, nccl_type(t), ncclSum, c->comm, s));
  c->bytes += (uint64_t)count * type_size(t);
}

void rt_nccl_reduce_scatter(RtNccl *c, const void *send, void *recv, int64_t count, RtNcclType t, cudaStream_t s) {
  check_args(c, "rt_nccl_reduce_scatter", count, t);
  NCCL_CHECK(c, ncclReduceScatter(send, recv, (size_t)count, nccl_type(t), ncclSum, c->comm, s));
  c->bytes += (uint64_t)count * (uint64_t)c->size * type_size(t);
}

void rt_nccl_all_gather(RtNccl *c, const void *send, void *recv, int64_t count, RtNcclType t, cudaStream_t s) {
  check_args(c, "rt_nccl_all_gather", count, t);
  NCCL_CHECK(c, ncclAllGather(send, recv, (size_t)count, nccl_type(t), c->comm, s));
  c->bytes += (uint64_t)count * type_size(t);
}

/* block j of send to rank j, block i of recv from rank i: one grouped send/recv per peer */
void rt_nccl_all_to_all(RtNccl *c, const void *send, void *recv, int64_t count, RtNcclType t, cudaStream_t s) {
  check_args(c, "rt_nccl_all_to_all", count, t);
  size_t blk = (size_t)count * type_size(t);
  NCCL_CHECK(c, ncclGroupStart());
  for (int p = 0; p < c->size; p++) {
    NCCL_CHECK(c, ncclSend((const char *)send + p * blk, (size_t)count, nccl_type(t), p, c->comm, s));
    NCCL_CHECK(c, ncclRecv((char *)recv + p * blk, (size_t)count, nccl_type(t), p, c->comm, s));
  }
  NCCL_CHECK(c, ncclGroupEnd());
  c->bytes += (uint64_t)blk * (uint64_t)c->size;
}

void rt_nccl_broadcast(RtNccl *c, void *buf, int64_t count, RtNcclType t, int root, cudaStream_t s) {
  check_args(c, "rt_nccl_broadcast", count, t);
  if (root < 0 || root >= c->size) nccl_die(c, "rt_nccl_broadcast", "root out of range");
  NCCL_CHECK(c, ncclBroadcast(buf, buf, (size_t)count, nccl_type(t), root, c->comm, s));
  c->bytes += (uint64_t)count * type_size(t);
}

void rt_nccl_send(RtNccl *c, const void *buf, int64_t count, RtNcclType t, int peer, cudaStream_t s) {
  check_args(c, "rt_nccl_send", count, t);
  if (peer < 0 || peer >= c->size) nccl_die(c, "rt_nccl_send", "peer out of range");
  NCCL_CHECK(c, ncclSend(buf, (size_t)count, nccl_type(t), peer, c->comm, s));
  c->bytes += (uint64_t)count * type_size(t);
}

void rt_nccl_recv(RtNccl *c, void *buf, int64_t count, RtNcclType t, int peer, cudaStream_t s) {
  check_args(c, "rt_nccl_recv", count, t);
  if (peer < 0 || peer >= c->size) nccl_die(c, "rt_nccl_recv", "peer out of range");
  NCCL_CHECK(c, ncclRecv(buf, (size_t)count, nccl_type(t), peer, c->comm, s));
}

void rt_nccl_sync(RtNccl *c, cudaStream_t s, const char *what) {
  double deadline = now_s() + timeout_s();
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) nccl_die(c, what, cudaGetErrorString(e));
    ncclResult_t rc = ncclSuccess;
    if (ncclCommGetAsyncError(c->comm, &rc) != ncclSuccess) rc = ncclInternalError;
    if (rc != ncclSuccess && rc != ncclInProgress) nccl_wait(c, what, rc); /* reports and stops */
    if (now_s() > deadline) {
      char msg[128];
      snprintf(msg, sizeof msg, "did not finish within %g s (CPLAN_COMM_TIMEOUT)", timeout_s());
      nccl_die(c, what, msg);
    }
    struct timespec pause = {0, 50000};
    nanosleep(&pause, NULL);
  }
}

void rt_nccl_barrier(RtNccl *c, cudaStream_t s) {
  /* the one value lives in device memory: a barrier is rare (start, end, checkpoints) */
  void *d = NULL;
  cudaError_t e = cudaMallocAsync(&d, sizeof(float), s);
  if (e != cudaSuccess) nccl_die(c, "rt_nccl_barrier: cudaMallocAsync", cudaGetErrorString(e));
  cudaMemsetAsync(d, 0, sizeof(float), s);
  rt_nccl_all_reduce(c, d, 1, RT_NCCL_F32, s);
  cudaFreeAsync(d, s);
  rt_nccl_sync(c, s, "rt_nccl_barrier");
}
