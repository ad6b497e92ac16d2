/* trace.c: --trace FILE.json, the measured spans of a run as a Chrome/Perfetto trace, and the
 * per-rank peak memory report (see cplanrt.h).
 *
 * Recording is process-wide (comm.c records every collective without being handed a Trainer):
 * while no trace is open every hook is one branch.  Events are kept in memory and written once, at
 * the end, so recording never does I/O inside a measured span.  Multi-rank runs merge through
 * rt_comm (send/recv to rank 0) rather than through FILE.rankN files, which would need a file
 * system shared by every node.  Timestamps are CLOCK_REALTIME (the one clock that is comparable
 * across hosts, within NTP's error), shifted so the earliest span of any rank starts at 0. */
#include "cplanrt.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* A run of 1000s of steps records ~10 events a step; past this, later events are dropped (and
 * counted) rather than letting a long run grow without bound. */
#define TRACE_MAX_EVENTS (1 << 22)

typedef struct TraceEvent {
  const char *name;             /* a string literal (phase or MPI call) */
  double ts, dur;               /* microseconds since tr.base_ns */
  int64_t step, micro;          /* -1: none */
  uint64_t bytes;               /* comm lane: the bytes rt_comm_bytes counted for the call */
  int lane;                     /* RT_TRACE_COMPUTE, RT_TRACE_COMM */
  char group[24];               /* comm lane: "world", "axis dp" (the RtComm may be gone by then) */
} TraceEvent;

static struct {
  int on;
  FILE *out;                    /* rank 0 only */
  char path[4096];
  TraceEvent *ev;
  size_t n, cap;
  uint64_t dropped;
  int64_t base_ns;              /* CLOCK_REALTIME at rt_trace_open: ts stay small and precise */
  int64_t comm_step;            /* the step whose metrics line counts the next collective's bytes */
} tr;

static int64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double rt_trace_now(void) {
  if (!tr.on) return 0;
  return 1e-3 * (double)(realtime_ns() - tr.base_ns);
}

int rt_trace_on(void) { return tr.on; }

int rt_trace_open(const char *path, int rank, RtError *err) {
  rt_trace_close();
  if (rank == 0) {
    /* opened now so a bad path fails before training, not after it */
    if (!(tr.out = fopen(path, "w"))) return rt_errf(err, "--trace %s: cannot open for writing", path);
  }
  snprintf(tr.path, sizeof tr.path, "%s", path);
  tr.base_ns = realtime_ns();
  tr.on = 1;
  return 0;
}

void rt_trace_close(void) {
  if (tr.out) fclose(tr.out);
  free(tr.ev);
  memset(&tr, 0, sizeof tr);
}

static TraceEvent *push(const char *name, int lane, double t0) {
  if (tr.n == tr.cap) {
    size_t cap = tr.cap ? 2 * tr.cap : 1024;
    TraceEvent *ev = tr.n < TRACE_MAX_EVENTS ? realloc(tr.ev, cap * sizeof *ev) : NULL;
    if (!ev) {
      tr.dropped++;
      return NULL;
    }
    tr.ev = ev, tr.cap = cap;
  }
  TraceEvent *e = &tr.ev[tr.n++];
  double t1 = rt_trace_now();
  *e = (TraceEvent){.name = name, .ts = t0, .dur = t1 > t0 ? t1 - t0 : 0, .step = -1, .micro = -1,
                    .lane = lane};
  return e;
}

void rt_trace_span(const char *name, double t0, int64_t step, int64_t micro) {
  if (!tr.on) return;
  TraceEvent *e = push(name, RT_TRACE_COMPUTE, t0);
  if (e) e->step = step, e->micro = micro;
}

void rt_trace_comm(const char *name, const char *group, uint64_t bytes, double t0) {
  if (!tr.on) return;
  TraceEvent *e = push(name, RT_TRACE_COMM, t0);
  if (!e) return;
  e->step = tr.comm_step, e->bytes = bytes;
  snprintf(e->group, sizeof e->group, "%s", group ? group : "?");
}

void rt_trace_comm_step(int64_t step) { tr.comm_step = step; }

/* ---- writing --------------------------------------------------------------------------------- */

/* A growing text buffer; on out of memory it stops growing and remembers it. */
typedef struct Buf {
  char *s;
  size_t n, cap;
  int oom;
} Buf;

static void bprintf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(Buf *b, const char *fmt, ...) {
  for (int tries = 0; tries < 2 && !b->oom; tries++) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = (b->cap + (size_t)k + 1) * 2;
    char *s = realloc(b->s, cap);
    if (!s) b->oom = 1;
    else b->s = s, b->cap = cap;
  }
}

/* This rank's events as JSON array elements, each line starting with ",\n" after the first, so
 * the ranks' texts concatenate. shift: microseconds from the run's earliest span to tr.base_ns. */
static void render(Buf *b, int rank, double shift) {
  static const char *const lanes[] = {"compute", "comm"};
  bprintf(b, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}",
          rank, rank);
  for (int l = 0; l < 2; l++)
    bprintf(b, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
            rank, l, lanes[l]);
  for (size_t i = 0; i < tr.n; i++) {
    const TraceEvent *e = &tr.ev[i];
    double ts = e->ts + shift; /* >= 0 but for the rounding of the shift */
    bprintf(b, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
            "\"dur\":%.3f,\"args\":{", e->name, lanes[e->lane], rank, e->lane, ts > 0 ? ts : 0.0, e->dur);
    if (e->lane == RT_TRACE_COMM)
      bprintf(b, "\"bytes\":%llu,\"group\":\"%s\",\"step\":%lld}", (unsigned long long)e->bytes,
              e->group, (long long)e->step);
    else if (e->micro >= 0)
      bprintf(b, "\"step\":%lld,\"micro\":%lld}", (long long)e->step, (long long)e->micro);
    else if (e->step >= 0) bprintf(b, "\"step\":%lld}", (long long)e->step);
    else bprintf(b, "}");
    bprintf(b, "}");
  }
  if (tr.dropped)
    bprintf(b, ",\n{\"name\":\"dropped %llu events (over %d)\",\"ph\":\"i\",\"s\":\"p\",\"pid\":%d,"
            "\"tid\":0,\"ts\":0}", (unsigned long long)tr.dropped, TRACE_MAX_EVENTS, rank);
}

/* Microseconds from the earliest span of any rank to this rank's base (ranks share no base). */
static double shift_of(RtComm *world) {
  double first = tr.n ? tr.ev[0].ts : 0;
  for (size_t i = 1; i < tr.n; i++) first = tr.ev[i].ts < first ? tr.ev[i].ts : first;
  /* rounded, not truncated: ts are whole nanoseconds in microseconds, and 1e3 * ts can fall just
   * below its integer, which truncation made the earliest span start at 0.001 */
  int64_t mine = tr.base_ns + llround(1e3 * first), origin = mine;
  int n = world ? rt_comm_size(world) : 1;
  if (n > 1) {
    int64_t *all = malloc((size_t)n * sizeof *all);
    if (!all) rt_comm_abort(world, 1, "out of memory while merging the ranks' traces");
    rt_comm_all_gather(world, &mine, all, 1, RT_COMM_I64);
    for (int q = 0; q < n; q++) origin = all[q] < origin ? all[q] : origin;
    free(all);
  }
  return 1e-3 * (double)(tr.base_ns - origin);
}

/* Rank q's text goes to rank 0 as its length, then its bytes in chunks (MPI counts are int). */
static void send_text(RtComm *world, const Buf *b) {
  int64_t len = b->oom ? 0 : (int64_t)b->n;
  rt_comm_send(world, &len, 1, RT_COMM_I64, 0, 77);
  for (int64_t o = 0; o < len; o += (int64_t)1 << 30) {
    int64_t k = len - o < ((int64_t)1 << 30) ? len - o : (int64_t)1 << 30;
    rt_comm_send(world, b->s + o, k, RT_COMM_U8, 0, 78);
  }
}

static int recv_text(RtComm *world, int q, FILE *out) {
  int64_t len = 0;
  rt_comm_recv(world, &len, 1, RT_COMM_I64, q, 77);
  char *s = malloc(len > 0 ? (size_t)len : 1);
  /* the sender is already sending: without memory, no rank can go on */
  if (!s) rt_comm_abort(world, 1, "out of memory while merging the ranks' traces");
  for (int64_t o = 0; o < len; o += (int64_t)1 << 30) {
    int64_t k = len - o < ((int64_t)1 << 30) ? len - o : (int64_t)1 << 30;
    rt_comm_recv(world, s + o, k, RT_COMM_U8, q, 78);
  }
  int ok = len <= 0 || (fputs(",\n", out) >= 0 && fwrite(s, 1, (size_t)len, out) == (size_t)len);
  free(s);
  return ok ? 0 : -1;
}

int rt_trace_write(RtComm *world, RtError *err) {
  if (!tr.on) return 0;
  tr.on = 0; /* the merge's own messages are not part of the run */
  int rank = world ? rt_comm_rank(world) : 0, n = world ? rt_comm_size(world) : 1, rc = 0;
  Buf b = {0};
  render(&b, rank, shift_of(world));
  if (rank != 0) {
    send_text(world, &b);
  } else {
    FILE *out = tr.out;
    if (b.oom || fputs("[\n", out) < 0 || fwrite(b.s, 1, b.n, out) != b.n) rc = -1;
    for (int q = 1; q < n; q++)
      if (recv_text(world, q, out) != 0) rc = -1; /* keep receiving: the senders are waiting */
    if (fputs("\n]\n", out) < 0 || fflush(out) != 0) rc = -1;
  }
  free(b.s);
  if (rc != 0) rt_errf(err, "--trace %s: cannot write the trace", tr.path);
  return rc;
}

/* ---- memory -------------------------------------------------------------------------------------- */

/* VmHWM of /proc/self/status: this program's own peak (getrusage's ru_maxrss carries over an exec,
 * so under `cplanc run` it would be cplanc's); getrusage where there is no /proc. */
int64_t rt_peak_rss_bytes(void) {
  FILE *fp = fopen("/proc/self/status", "r");
  if (fp) {
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, fp))
      if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
    fclose(fp);
    if (kb >= 0) return (int64_t)kb * 1024;
  }
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
  return (int64_t)ru.ru_maxrss * 1024; /* Linux: kilobytes */
}
