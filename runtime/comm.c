/* comm.c: rt_comm, the communicator of multi-rank runs, over MPI (see cplanrt.h).
 *
 * Every MPI call goes through MPI_CHECK, which names the call, the rank and the group; the
 * communicators return errors (MPI_ERRORS_RETURN) instead of Open MPI's default of aborting with
 * a message that names none of them.  A collective cannot be failed on one rank alone, so a
 * failure stops every rank (MPI_Abort).  Each collective is also watched: a thread aborts the job
 * when one has not finished after CPLAN_COMM_TIMEOUT seconds, naming the rank and the collective,
 * so a dead or stuck peer ends the run instead of hanging it.  Each call is a span of --trace
 * (trace.c), named as the rt_comm function, with the bytes it added to the counter. */
#include "cplanrt.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct RtComm {
  MPI_Comm comm;
  int rank, size;
  char name[64];               /* "world", "axis dp" */
  uint64_t bytes;              /* passed to collectives and sends */
  /* rt_comm_isend's sends in flight, with the copies they send */
  MPI_Request *reqs;
  void **copies;
  int npend, cap;
};

static int world_rank = -1;    /* for messages from the watchdog and aborts */

/* ---- checking --------------------------------------------------------------------------------- */

static void comm_die(const RtComm *c, const char *call, int rc) __attribute__((noreturn));
/* The message of error code rc from call, then every rank stops. */
static void comm_die(const RtComm *c, const char *call, int rc) {
  char s[MPI_MAX_ERROR_STRING] = "";
  int n = 0;
  MPI_Error_string(rc, s, &n);
  fprintf(stderr, "cplan: rank %d: %s failed on group '%s' (rank %d of %d): %s\n", world_rank, call,
          c ? c->name : "world", c ? c->rank : world_rank, c ? c->size : 0, s);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1); /* MPI_Abort does not return; this keeps the compiler and the contract honest */
}

#define MPI_CHECK(c, call)                                                                       \
  do {                                                                                           \
    int rc_ = (call);                                                                            \
    if (rc_ != MPI_SUCCESS) comm_die((c), #call, rc_);                                           \
  } while (0)

static MPI_Datatype mpi_type(RtCommType t) {
  /* Checklist: one case per RtCommType (and type_size below). */
  switch (t) {
  case RT_COMM_F32: return MPI_FLOAT;
  case RT_COMM_F64: return MPI_DOUBLE;
  case RT_COMM_I64: return MPI_INT64_T;
  case RT_COMM_U8: return MPI_UINT8_T;
  case RT_COMM_I32: return MPI_INT32_T;
  case RT_COMM_TYPE_COUNT: break;
  }
  return MPI_DATATYPE_NULL;
}

static size_t type_size(RtCommType t) {
  return t == RT_COMM_F32 || t == RT_COMM_I32 ? 4 : t == RT_COMM_U8 ? 1 : 8;
}

/* An MPI count: larger ones would need derived types, which no plan needs yet. */
static int icount(const RtComm *c, int64_t count, const char *op) {
  if (count < 0 || count > INT_MAX) {
    fprintf(stderr, "cplan: rank %d: %s of %lld elements on group '%s': at most %d per call\n",
            world_rank, op, (long long)count, c->name, INT_MAX);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return (int)count;
}

/* ---- the watchdog ------------------------------------------------------------------------------ */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int started, abort_ok;       /* abort_ok: MPI_THREAD_MULTIPLE, MPI_Abort may run from it */
  double timeout;              /* seconds */
  const char *op;              /* the collective in progress, NULL: none */
  const char *group;
  struct timespec deadline;
} wd = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .timeout = 300};

static int ts_before(const struct timespec *a, const struct timespec *b) {
  return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

static void *watchdog(void *arg) {
  (void)arg;
  pthread_mutex_lock(&wd.mu);
  for (;;) {
    while (!wd.op) pthread_cond_wait(&wd.cv, &wd.mu);
    struct timespec dl = wd.deadline, now;
    const char *op = wd.op;
    pthread_cond_timedwait(&wd.cv, &wd.mu, &dl);
    clock_gettime(CLOCK_REALTIME, &now);
    if (wd.op == op && wd.deadline.tv_sec == dl.tv_sec && wd.deadline.tv_nsec == dl.tv_nsec &&
        !ts_before(&now, &dl)) {
      fprintf(stderr, "cplan: rank %d: %s on group '%s' did not finish within %g s "
              "(CPLAN_COMM_TIMEOUT): a peer is dead or stuck; stopping every rank\n",
              world_rank, op, wd.group, wd.timeout);
      fflush(stderr);
      if (wd.abort_ok) MPI_Abort(MPI_COMM_WORLD, 1);
      _exit(1); /* mpirun stops the other ranks when one exits without MPI_Finalize */
    }
  }
  return NULL;
}

/* Marks the start (op != NULL) or the end (op == NULL) of a watched call. */
static void watch(const RtComm *c, const char *op) {
  if (!wd.started) return;
  pthread_mutex_lock(&wd.mu);
  wd.op = op;
  if (op) {
    clock_gettime(CLOCK_REALTIME, &wd.deadline);
    double s = (double)wd.deadline.tv_sec + 1e-9 * (double)wd.deadline.tv_nsec + wd.timeout;
    wd.deadline.tv_sec = (time_t)s;
    wd.deadline.tv_nsec = (long)((s - (double)(time_t)s) * 1e9);
    wd.group = c->name;
  }
  pthread_cond_signal(&wd.cv);
  pthread_mutex_unlock(&wd.mu);
}

static void start_watchdog(int provided) {
  const char *e = getenv("CPLAN_COMM_TIMEOUT");
  if (e && *e) {
    char *end;
    double v = strtod(e, &end);
    if (!*end && v > 0) wd.timeout = v;
    else fprintf(stderr, "cplan: CPLAN_COMM_TIMEOUT='%s' is not a positive number of seconds; "
                 "using %g\n", e, wd.timeout);
  }
  wd.abort_ok = provided >= MPI_THREAD_MULTIPLE;
  pthread_t th;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  wd.started = pthread_create(&th, &at, watchdog, NULL) == 0;
  pthread_attr_destroy(&at);
}

/* ---- setup ---------------------------------------------------------------------------------------- */

static void finalize_at_exit(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

static RtComm *wrap(MPI_Comm comm, const char *name) {
  RtComm *c = calloc(1, sizeof *c);
  if (!c) {
    fprintf(stderr, "cplan: rank %d: out of memory\n", world_rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  c->comm = comm;
  snprintf(c->name, sizeof c->name, "%s", name);
  MPI_CHECK(c, MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  MPI_CHECK(c, MPI_Comm_rank(comm, &c->rank));
  MPI_CHECK(c, MPI_Comm_size(comm, &c->size));
  return c;
}

int rt_comm_launched(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_ID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}

RtComm *rt_comm_init(int *argc, char ***argv) {
  int inited = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&inited);
  if (!inited) {
    /* MULTIPLE lets the watchdog thread call MPI_Abort while the main thread is inside MPI */
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      fprintf(stderr, "cplan: MPI_Init_thread failed: is this machine's MPI installation working?\n");
      exit(1);
    }
    atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  RtComm *w = wrap(MPI_COMM_WORLD, "world");
  if (!wd.started) start_watchdog(provided);
  return w;
}

int rt_comm_rank(const RtComm *c) { return c->rank; }
int rt_comm_size(const RtComm *c) { return c->size; }
const char *rt_comm_name(const RtComm *c) { return c->name; }
uint64_t rt_comm_bytes(const RtComm *c) { return c->bytes; }

void rt_comm_split_axes(RtComm *world, const int64_t *sizes, const char *const *names, int naxes,
                        RtComm **groups) {
  int64_t stride[RT_ST_MAX_DIMS + 1], prod = 1;
  for (int i = naxes - 1; i >= 0; i--) stride[i] = prod, prod *= sizes[i];
  if (prod != world->size) {
    char msg[160];
    snprintf(msg, sizeof msg, "a mesh of %lld devices cannot be split over %d ranks",
             (long long)prod, world->size);
    rt_comm_abort(world, 1, msg);
  }
  for (int i = 0; i < naxes; i++) {
    int64_t coord = world->rank / stride[i] % sizes[i];
    int color = (int)(world->rank - coord * stride[i]); /* the rank with this coordinate at 0 */
    MPI_Comm sub;
    watch(world, "MPI_Comm_split");
    MPI_CHECK(world, MPI_Comm_split(world->comm, color, (int)coord, &sub));
    watch(world, NULL);
    char name[64];
    snprintf(name, sizeof name, "axis %s", names && names[i] ? names[i] : "?");
    groups[i] = wrap(sub, name);
  }
}

void rt_comm_free(RtComm *c) {
  if (!c) return;
  rt_comm_wait_sends(c);
  free(c->reqs);
  free(c->copies);
  if (c->comm != MPI_COMM_WORLD) MPI_CHECK(c, MPI_Comm_free(&c->comm));
  free(c);
}

void rt_comm_finalize(RtComm *world) { rt_comm_free(world); }

void rt_comm_abort(RtComm *c, int code, const char *msg) {
  fprintf(stderr, "cplan: rank %d: %s\n", world_rank, msg);
  fflush(stderr);
  MPI_Abort(c ? c->comm : MPI_COMM_WORLD, code);
  _exit(code);
}

/* ---- collectives ------------------------------------------------------------------------------- */

void rt_comm_all_reduce(RtComm *c, void *buf, int64_t count, RtCommType t) {
  double t0 = rt_trace_now();
  /* in chunks of at most 2^30 elements: MPI counts are int */
  const int64_t chunk = (int64_t)1 << 30;
  c->bytes += (uint64_t)count * type_size(t);
  watch(c, "MPI_Allreduce");
  for (int64_t o = 0; o < count; o += chunk) {
    int64_t n = count - o < chunk ? count - o : chunk;
    MPI_CHECK(c, MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)o * type_size(t), (int)n,
                               mpi_type(t), MPI_SUM, c->comm));
  }
  watch(c, NULL);
  rt_trace_comm("all_reduce", c->name, (uint64_t)count * type_size(t), t0);
}

void rt_comm_reduce_scatter(RtComm *c, const void *send, void *recv, int64_t count, RtCommType t) {
  double t0 = rt_trace_now();
  int n = icount(c, count, "MPI_Reduce_scatter_block");
  c->bytes += (uint64_t)count * (uint64_t)c->size * type_size(t);
  watch(c, "MPI_Reduce_scatter_block");
  MPI_CHECK(c, MPI_Reduce_scatter_block(send, recv, n, mpi_type(t), MPI_SUM, c->comm));
  watch(c, NULL);
  rt_trace_comm("reduce_scatter", c->name, (uint64_t)count * (uint64_t)c->size * type_size(t), t0);
}

void rt_comm_all_gather(RtComm *c, const void *send, void *recv, int64_t count, RtCommType t) {
  double t0 = rt_trace_now();
  int n = icount(c, count, "MPI_Allgather");
  c->bytes += (uint64_t)count * type_size(t);
  watch(c, "MPI_Allgather");
  MPI_CHECK(c, MPI_Allgather(send, n, mpi_type(t), recv, n, mpi_type(t), c->comm));
  watch(c, NULL);
  rt_trace_comm("all_gather", c->name, (uint64_t)count * type_size(t), t0);
}

void rt_comm_all_to_all(RtComm *c, const void *send, void *recv, int64_t count, RtCommType t) {
  double t0 = rt_trace_now();
  int n = icount(c, count, "MPI_Alltoall");
  c->bytes += (uint64_t)count * (uint64_t)c->size * type_size(t);
  watch(c, "MPI_Alltoall");
  MPI_CHECK(c, MPI_Alltoall(send, n, mpi_type(t), recv, n, mpi_type(t), c->comm));
  watch(c, NULL);
  rt_trace_comm("all_to_all", c->name, (uint64_t)count * (uint64_t)c->size * type_size(t), t0);
}

void rt_comm_broadcast(RtComm *c, void *buf, int64_t count, RtCommType t, int root) {
  double t0 = rt_trace_now();
  int n = icount(c, count, "MPI_Bcast");
  c->bytes += (uint64_t)count * type_size(t);
  watch(c, "MPI_Bcast");
  MPI_CHECK(c, MPI_Bcast(buf, n, mpi_type(t), root, c->comm));
  watch(c, NULL);
  rt_trace_comm("broadcast", c->name, (uint64_t)count * type_size(t), t0);
}

void rt_comm_send(RtComm *c, const void *buf, int64_t count, RtCommType t, int peer, int tag) {
  double t0 = rt_trace_now();
  int n = icount(c, count, "MPI_Send");
  c->bytes += (uint64_t)count * type_size(t);
  watch(c, "MPI_Send");
  MPI_CHECK(c, MPI_Send(buf, n, mpi_type(t), peer, tag, c->comm));
  watch(c, NULL);
  rt_trace_comm("send", c->name, (uint64_t)count * type_size(t), t0);
}

void rt_comm_isend(RtComm *c, const void *buf, int64_t count, RtCommType t, int peer, int tag) {
  double t0 = rt_trace_now();
  int n = icount(c, count, "MPI_Isend");
  size_t bytes = (size_t)count * type_size(t);
  if (c->npend == c->cap) {
    int cap = c->cap ? 2 * c->cap : 16;
    MPI_Request *r = realloc(c->reqs, sizeof *r * (size_t)cap);
    void **b = r ? realloc(c->copies, sizeof *b * (size_t)cap) : NULL;
    if (r) c->reqs = r;
    if (!r || !b) rt_comm_abort(c, 1, "out of memory for a send");
    c->copies = b, c->cap = cap;
  }
  void *copy = malloc(bytes + 1);
  if (!copy) rt_comm_abort(c, 1, "out of memory for a send");
  memcpy(copy, buf, bytes);
  c->bytes += bytes;
  MPI_CHECK(c, MPI_Isend(copy, n, mpi_type(t), peer, tag, c->comm, &c->reqs[c->npend]));
  c->copies[c->npend++] = copy;
  rt_trace_comm("isend", c->name, bytes, t0);
}

void rt_comm_wait_sends(RtComm *c) {
  if (!c || !c->npend) return;
  watch(c, "MPI_Waitall (sends)");
  MPI_CHECK(c, MPI_Waitall(c->npend, c->reqs, MPI_STATUSES_IGNORE));
  watch(c, NULL);
  for (int k = 0; k < c->npend; k++) free(c->copies[k]);
  c->npend = 0;
}

void rt_comm_recv(RtComm *c, void *buf, int64_t count, RtCommType t, int peer, int tag) {
  double t0 = rt_trace_now();
  int n = icount(c, count, "MPI_Recv");
  watch(c, "MPI_Recv");
  MPI_CHECK(c, MPI_Recv(buf, n, mpi_type(t), peer, tag, c->comm, MPI_STATUS_IGNORE));
  watch(c, NULL);
  rt_trace_comm("recv", c->name, 0, t0);
}

void rt_comm_barrier(RtComm *c) {
  double t0 = rt_trace_now();
  watch(c, "MPI_Barrier");
  MPI_CHECK(c, MPI_Barrier(c->comm));
  watch(c, NULL);
  rt_trace_comm("barrier", c->name, 0, t0);
}
