/* calibrate.c: cplan-calibrate, the measuring half of `cplanc calibrate` (compiler/calibrate_cmd.c
 * starts it, under mpirun for --np N > 1, and renames the file it writes into place).
 *
 * Every rank measures at the same time, as the ranks of a plan would run, with the threads a plan
 * rank gets (the online CPUs / ranks, as runtime/train.c picks them), and the figures are the mean
 * over the ranks:
 *   gemm        k_gemm (OpenBLAS sgemm, what plans call) on n x n x n → FLOP/s; flops_f32 is the
 *               best of the sizes, and each size's efficiency is its FLOP/s over that peak;
 *   stream      the triad a = b + s*c on 3 arrays of 128 MiB (past common last-level caches; --quick:
 *               16 MiB, cache-bound), on the rank's threads → hbm;
 *   kernels     kf_layer_norm_forward, kf_softmax_forward, kf_unary_forward(gelu) (one thread, as
 *               plans call them) → bytes/s (input read + output written) over hbm;
 *   collectives (N > 1) rt_comm all_reduce, all_gather, reduce_scatter, broadcast from 4 KiB to
 *               64 MiB → seconds per call; a fit t = alpha + beta * bytes per op, and from the
 *               all_reduce fit the ring model's link latency and bandwidth (intra_latency, intra_bw).
 * CPU only: NCCL collectives and GPU GEMMs are not measured (no GPU backend is built here).
 * The JSON keys are those compiler/settings.c profile_from_json reads (docs/language.md §6).
 * Checklist: a key added here is read (or explicitly ignored) in profile_from_json, described by
 * DeviceMeasured in compiler/sema.h and listed in docs/language.md §6. */
#include "cplanrt.h"
#include "fast.h"
#include "fast_nn.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024.0 * 1024.0)

typedef struct Opts {
  const char *out;   /* --out FILE: the profile to write (rank 0) */
  int quick;         /* --quick: small sizes, few repetitions (tests) */
  int expect_ranks;  /* --ranks N: the world size cplanc started; 0: any */
} Opts;

typedef struct Ctx {
  RtComm *world;
  int rank, size, threads;
  double target;     /* seconds to spend on one measured point */
} Ctx;

/* The collectives measured; the names are the JSON keys (and DeviceMeasured's order). */
enum { C_ALL_REDUCE, C_ALL_GATHER, C_REDUCE_SCATTER, C_BROADCAST, C_COUNT };
static const char *const coll_names[C_COUNT] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
enum { MAX_POINTS = 16 };

typedef struct Fit {
  int n;
  double bytes[MAX_POINTS], secs[MAX_POINTS];
  double alpha, beta; /* t = alpha + beta * bytes; 0, 0 when not fitted */
} Fit;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *xalloc(Ctx *c, size_t bytes) {
  void *p = malloc(bytes);
  if (!p) {
    char msg[128];
    snprintf(msg, sizeof msg, "cplan-calibrate: out of memory allocating %.0f MiB", (double)bytes / MIB);
    rt_comm_abort(c->world, 1, msg);
  }
  return p;
}

/* The mean over the ranks of one figure each. */
static double rank_mean(Ctx *c, double x) {
  if (c->size > 1) rt_comm_all_reduce(c->world, &x, 1, RT_COMM_F64);
  return x / c->size;
}

/* Rank 0's printf, flushed so the table appears as it is measured (also under mpirun). */
static void say(const Ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const Ctx *c, const char *fmt, ...) {
  if (c->rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

static const char *bytes_str(double b, char *buf, size_t n) {
  if (b >= MIB) snprintf(buf, n, "%g MiB", b / MIB);
  else snprintf(buf, n, "%g KiB", b / 1024.0);
  return buf;
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

/* FLOP/s of k_gemm on n x n x n: repeated until c->target seconds, the best repetition. */
static double gemm_flops(Ctx *c, int n) {
  size_t e = (size_t)n * (size_t)n;
  float *a = xalloc(c, e * sizeof *a), *b = xalloc(c, e * sizeof *b), *out = xalloc(c, e * sizeof *out);
  for (size_t i = 0; i < e; i++) {
    a[i] = 1.0f / (float)(i % 7 + 1);
    b[i] = 1.0f / (float)(i % 5 + 1);
  }
  k_gemm(out, a, b, 1, n, n, n, 0, 0, 0, 0, 0, 0.0f); /* warm-up: threads, pages */
  double best = 1e30, start = now();
  int reps = 0;
  while (reps < 3 || (now() - start < c->target && reps < 1000)) {
    double t0 = now();
    k_gemm(out, a, b, 1, n, n, n, 0, 0, 0, 0, 0, 0.0f);
    double t = now() - t0;
    if (t < best) best = t;
    reps++;
  }
  free(a), free(b), free(out);
  return 2.0 * (double)n * (double)n * (double)n / best;
}

/* ---- memory bandwidth -------------------------------------------------------------------------- */

typedef struct Triad {
  float *a;
  const float *b, *x;
  size_t lo, hi;
} Triad;

static void *triad_part(void *arg) {
  Triad *t = arg;
  for (size_t i = t->lo; i < t->hi; i++) t->a[i] = t->b[i] + 3.0f * t->x[i];
  return NULL;
}

/* One triad over n floats on c->threads threads; seconds. */
static double triad_once(Ctx *c, float *a, const float *b, const float *x, size_t n) {
  pthread_t th[64];
  Triad parts[64];
  int nt = c->threads < 64 ? c->threads : 64;
  double t0 = now();
  for (int i = 0; i < nt; i++) {
    parts[i] = (Triad){a, b, x, n * (size_t)i / (size_t)nt, n * (size_t)(i + 1) / (size_t)nt};
    if (i > 0 && pthread_create(&th[i], NULL, triad_part, &parts[i]) != 0) {
      triad_part(&parts[i]); /* no thread: do its part here */
      th[i] = 0;
    }
  }
  triad_part(&parts[0]);
  for (int i = 1; i < nt; i++)
    if (th[i]) pthread_join(th[i], NULL);
  return now() - t0;
}

/* STREAM's triad figure (3 arrays of floats counted once each, no write-allocate), bytes/s, best
 * repetition; arrays of `bytes` each. */
static double stream_bw(Ctx *c, size_t bytes) {
  size_t n = bytes / sizeof(float);
  float *a = xalloc(c, n * sizeof *a), *b = xalloc(c, n * sizeof *b), *x = xalloc(c, n * sizeof *x);
  for (size_t i = 0; i < n; i++) a[i] = 0, b[i] = 1, x[i] = 2;
  triad_once(c, a, b, x, n);
  double best = 1e30, start = now();
  int reps = 0;
  while (reps < 3 || (now() - start < c->target && reps < 100)) {
    double t = triad_once(c, a, b, x, n);
    if (t < best) best = t;
    reps++;
  }
  if (a[n / 2] != 7.0f) rt_comm_abort(c->world, 1, "cplan-calibrate: the triad computed a wrong value");
  free(a), free(b), free(x);
  return 3.0 * (double)n * sizeof(float) / best;
}

/* ---- row kernels ------------------------------------------------------------------------------- */

enum { K_LN, K_SOFTMAX, K_GELU_F, KERNEL_COUNT };
static const char *const kernel_names[KERNEL_COUNT] = {"layer_norm", "softmax", "gelu"};

static void kernel_run(int k, float *out, const float *x, float *w, float *scratch, int rows, int cols) {
  switch (k) {
  case K_LN: kf_layer_norm_forward(out, scratch, scratch + rows, x, w, w + cols, rows, cols, 1e-5f); break;
  case K_SOFTMAX: kf_softmax_forward(out, x, rows, cols); break;
  default: kf_unary_forward(K_GELU, out, x, (long)rows * cols, 0.0f); break;
  }
}

/* Bytes/s of kernel k over a [rows, cols] f32 tensor of `bytes`: the input read and the output
 * written once each (the small per-row and per-column vectors are not counted). */
static double kernel_bw(Ctx *c, int k, size_t bytes) {
  int cols = k == K_SOFTMAX ? 1024 : 768;
  int rows = (int)(bytes / sizeof(float) / (size_t)cols);
  size_t n = (size_t)rows * (size_t)cols;
  float *x = xalloc(c, n * sizeof *x), *out = xalloc(c, n * sizeof *out);
  float *w = xalloc(c, 2 * (size_t)cols * sizeof *w), *scratch = xalloc(c, 2 * (size_t)rows * sizeof *scratch);
  for (size_t i = 0; i < n; i++) x[i] = (float)(i % 97) * 0.01f - 0.5f;
  for (int i = 0; i < 2 * cols; i++) w[i] = i < cols ? 1.0f : 0.0f;
  kernel_run(k, out, x, w, scratch, rows, cols);
  double best = 1e30, start = now();
  int reps = 0;
  while (reps < 3 || (now() - start < c->target && reps < 1000)) {
    double t0 = now();
    kernel_run(k, out, x, w, scratch, rows, cols);
    double t = now() - t0;
    if (t < best) best = t;
    reps++;
  }
  free(x), free(out), free(w), free(scratch);
  return 2.0 * (double)n * sizeof(float) / best;
}

/* ---- collectives ------------------------------------------------------------------------------- */

/* One call of collective op on `bytes` (the whole tensor: all_gather's output, reduce_scatter's
 * input, all_reduce's and broadcast's buffer), which holds a multiple of size floats. */
static void coll_call(Ctx *c, int op, float *send, float *recv, size_t bytes) {
  int64_t count = (int64_t)(bytes / sizeof(float));
  switch (op) {
  case C_ALL_REDUCE: rt_comm_all_reduce(c->world, send, count, RT_COMM_F32); break;
  case C_ALL_GATHER: rt_comm_all_gather(c->world, send, recv, count / c->size, RT_COMM_F32); break;
  case C_REDUCE_SCATTER: rt_comm_reduce_scatter(c->world, send, recv, count / c->size, RT_COMM_F32); break;
  default: rt_comm_broadcast(c->world, send, count, RT_COMM_F32, 0); break;
  }
}

/* Seconds per call, the mean over the ranks of each rank's fastest of 5 batches (a batch another
 * process interrupted is slower, never faster, so the minimum rejects that noise, as benchmark
 * harnesses do). The repetition count is rank 0's (from one timed call), broadcast so every rank
 * makes the same calls. */
static double coll_time(Ctx *c, int op, float *send, float *recv, size_t bytes) {
  coll_call(c, op, send, recv, bytes); /* warm-up */
  rt_comm_barrier(c->world);
  double t0 = now();
  coll_call(c, op, send, recv, bytes);
  double one = now() - t0;
  int64_t reps = (int64_t)(c->target / (one > 1e-7 ? one : 1e-7));
  reps = (reps < 15 ? 15 : reps > 2000 ? 2000 : reps) / 5;
  rt_comm_broadcast(c->world, &reps, 1, RT_COMM_I64, 0);
  double best = 0;
  for (int batch = 0; batch < 5; batch++) {
    rt_comm_barrier(c->world);
    t0 = now();
    for (int64_t r = 0; r < reps; r++) coll_call(c, op, send, recv, bytes);
    double t = (now() - t0) / (double)reps;
    if (batch == 0 || t < best) best = t;
  }
  return rank_mean(c, best);
}

/* Least squares of t = alpha + beta * bytes, weighted by 1/t^2 (relative errors: the points span
 * four orders of magnitude, and the small ones decide alpha). A negative intercept (noise) is
 * replaced by what the smallest point leaves after beta. */
static void fit_alpha_beta(Fit *f) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int i = 0; i < f->n; i++) {
    double w = 1.0 / (f->secs[i] * f->secs[i]), x = f->bytes[i], y = f->secs[i];
    sw += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
  }
  double det = sw * sxx - sx * sx;
  f->alpha = f->beta = 0;
  if (f->n < 2 || !(det > 0)) return;
  f->beta = (sw * sxy - sx * sy) / det;
  f->alpha = (sy - f->beta * sx) / sw;
  if (!(f->beta > 0)) { /* no growth with size: only noise was measured */
    f->alpha = f->beta = 0;
    return;
  }
  if (!(f->alpha > 0)) {
    double a = f->secs[0] - f->beta * f->bytes[0];
    f->alpha = a > 1e-9 ? a : 1e-9;
  }
}

static void measure_collectives(Ctx *c, const Opts *o, Fit fits[C_COUNT]) {
  static const double full[] = {4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864};
  static const double quick[] = {4096, 65536, 1048576};
  const double *sizes = o->quick ? quick : full;
  int nsizes = o->quick ? 3 : 8;
  size_t maxb = (size_t)sizes[nsizes - 1];
  float *send = xalloc(c, maxb), *recv = xalloc(c, maxb);
  for (size_t i = 0; i < maxb / sizeof(float); i++) send[i] = 1.0f, recv[i] = 0.0f;
  say(c, "\ncollectives (rt_comm over MPI, %d ranks; bus bandwidth as nccl-tests counts it)\n", c->size);
  say(c, "  %-15s %10s %12s %14s\n", "op", "bytes", "time", "bus bandwidth");
  for (int op = 0; op < C_COUNT; op++) {
    Fit *f = &fits[op];
    memset(f, 0, sizeof *f);
    for (int s = 0; s < nsizes; s++) {
      /* a whole number of floats per rank */
      size_t per = (size_t)sizes[s] / sizeof(float) / (size_t)c->size;
      size_t bytes = per * (size_t)c->size * sizeof(float);
      double t = coll_time(c, op, send, recv, bytes);
      /* nccl-tests' bus factor: what each link carries relative to the tensor */
      double p = c->size, bus = op == C_ALL_REDUCE ? 2 * (p - 1) / p : op == C_BROADCAST ? 1 : (p - 1) / p;
      char b[32];
      say(c, "  %-15s %10s %9.1f us %10.2f GB/s\n", coll_names[op], bytes_str((double)bytes, b, sizeof b),
          t * 1e6, (double)bytes * bus / t / 1e9);
      f->bytes[f->n] = (double)bytes;
      f->secs[f->n++] = t;
    }
    fit_alpha_beta(f);
  }
  free(send), free(recv);
}

/* ---- the phases --------------------------------------------------------------------------------- */

typedef struct Results {
  int ngemm, gemm_n[4];
  double gemm_flops[4], peak;        /* peak: the best, flops_f32 */
  double mem;                        /* bytes per rank: the RAM / ranks */
  double hbm;
  double keff[KERNEL_COUNT];         /* bytes/s over hbm */
  Fit fits[C_COUNT];                 /* ranks > 1 only */
  double intra_lat, intra_bw;        /* 0: not measured */
} Results;

static void measure_gemm(Ctx *c, const Opts *o, Results *r) {
  static const int full[] = {256, 512, 1024, 2048}, quick[] = {128, 256, 512};
  r->ngemm = o->quick ? 3 : 4;
  say(c, "\ngemm (k_gemm: OpenBLAS sgemm, f32, n x n x n, per rank)\n");
  for (int i = 0; i < r->ngemm; i++) {
    r->gemm_n[i] = o->quick ? quick[i] : full[i];
    rt_comm_barrier(c->world);
    r->gemm_flops[i] = rank_mean(c, gemm_flops(c, r->gemm_n[i]));
    if (r->gemm_flops[i] > r->peak) r->peak = r->gemm_flops[i];
    say(c, "  n = %-6d %8.1f GFLOP/s\n", r->gemm_n[i], r->gemm_flops[i] / 1e9);
  }
  say(c, "  peak      %8.1f GFLOP/s   -> flops_f32\n", r->peak / 1e9);
}

/* 3 x 128 MiB, past common last-level caches (quick: 16 MiB, cache-bound), less when the ranks
 * together would take over a quarter of the RAM. */
static void measure_memory(Ctx *c, const Opts *o, Results *r) {
  double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
  r->mem = floor(ram / c->size);
  size_t arr = o->quick ? (size_t)(16 * MIB) : (size_t)(128 * MIB);
  while (arr > 8 * MIB && 3.0 * (double)arr * c->size > ram / 4) arr /= 2;
  rt_comm_barrier(c->world);
  r->hbm = rank_mean(c, stream_bw(c, arr));
  say(c, "\nmemory bandwidth (triad on 3 x %.0f MiB, %d thread%s)\n  %.1f GB/s   -> hbm\n", (double)arr / MIB,
      c->threads, c->threads == 1 ? "" : "s", r->hbm / 1e9);
}

static void measure_kernels(Ctx *c, const Opts *o, Results *r) {
  size_t kb = o->quick ? (size_t)(4 * MIB) : (size_t)(64 * MIB);
  say(c, "\nrow kernels (kf_*, one thread, [rows, 768|1024] f32 of %.0f MiB: bytes read + written)\n",
      (double)kb / MIB);
  for (int k = 0; k < KERNEL_COUNT; k++) {
    rt_comm_barrier(c->world);
    double bw = rank_mean(c, kernel_bw(c, k, kb));
    r->keff[k] = bw / r->hbm;
    say(c, "  %-11s %6.1f GB/s   efficiency %.2f of hbm\n", kernel_names[k], bw / 1e9, r->keff[k]);
  }
}

/* The collectives, then the link of the ring model that all_reduce's fit gives:
 * t = 2(p-1) * latency + 2(p-1)/p * bytes / bandwidth. */
static void measure_links(Ctx *c, const Opts *o, Results *r) {
  if (c->size == 1) {
    say(c, "\ncollectives: not measured (one rank; use --np N): intra_bw, intra_latency keep the cpu defaults\n");
    return;
  }
  measure_collectives(c, o, r->fits);
  double p = c->size;
  const Fit *ar = &r->fits[C_ALL_REDUCE];
  if (ar->beta > 0) {
    r->intra_lat = ar->alpha / (2 * (p - 1));
    r->intra_bw = 2 * (p - 1) / p / ar->beta;
  }
  say(c, "  fit (ring all_reduce): latency %.2f us -> intra_latency, bandwidth %.2f GB/s -> intra_bw\n",
      r->intra_lat * 1e6, r->intra_bw / 1e9);
}

/* ---- the profile ------------------------------------------------------------------------------- */

static cJSON *points_json(const Fit *f) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < f->n; i++) {
    cJSON *p = cJSON_CreateArray();
    cJSON_AddItemToArray(p, cJSON_CreateNumber(f->bytes[i]));
    cJSON_AddItemToArray(p, cJSON_CreateNumber(f->secs[i]));
    cJSON_AddItemToArray(a, p);
  }
  return a;
}

/* The profile (keys: docs/language.md §6); the measured curves after the summary keys. */
static cJSON *profile_json(const Ctx *c, const Opts *o, const Results *r, const char *host, const char *date) {
  char src[1024];
  snprintf(src, sizeof src,
           "cplanc calibrate on %s, %s: %d rank%s x %d thread%s%s; flops_f32: best OpenBLAS sgemm "
           "(bf16 runs at the f32 rate); hbm: stream triad; %s; inter_bw, inter_latency: not measured "
           "(one machine; cpu defaults); NCCL: not measured (CPU only)",
           host, date, c->size, c->size == 1 ? "" : "s", c->threads, c->threads == 1 ? "" : "s",
           o->quick ? ", quick" : "",
           r->intra_bw > 0 ? "intra_bw, intra_latency: ring fit of rt_comm all_reduce over MPI"
           : c->size > 1   ? "intra_bw, intra_latency: not fitted (all_reduce's time did not grow with its size: "
                             "noise; cpu defaults)"
                           : "intra_bw, intra_latency: not measured (one rank; cpu defaults)");
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "name", "calibrated cpu");
  cJSON_AddStringToObject(j, "kind", "cpu");
  cJSON_AddNumberToObject(j, "memory", r->mem);
  cJSON_AddNumberToObject(j, "flops_f32", r->peak);
  cJSON_AddNumberToObject(j, "flops_bf16", r->peak);
  cJSON_AddNumberToObject(j, "hbm", r->hbm);
  if (r->intra_bw > 0) {
    cJSON_AddNumberToObject(j, "intra_bw", r->intra_bw);
    cJSON_AddNumberToObject(j, "intra_latency", r->intra_lat);
  }
  cJSON_AddStringToObject(j, "source", src);
  cJSON *ge = cJSON_AddArrayToObject(j, "gemm_efficiency");
  for (int i = 0; i < r->ngemm; i++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "n", r->gemm_n[i]);
    cJSON_AddNumberToObject(e, "flops", r->gemm_flops[i]);
    cJSON_AddNumberToObject(e, "efficiency", r->gemm_flops[i] / r->peak);
    cJSON_AddItemToArray(ge, e);
  }
  cJSON *ke = cJSON_AddObjectToObject(j, "kernel_efficiency");
  for (int k = 0; k < KERNEL_COUNT; k++) cJSON_AddNumberToObject(ke, kernel_names[k], r->keff[k]);
  if (c->size > 1) {
    cJSON *co = cJSON_AddObjectToObject(j, "collectives");
    cJSON_AddNumberToObject(co, "ranks", c->size);
    for (int op = 0; op < C_COUNT; op++) {
      cJSON *e = cJSON_AddObjectToObject(co, coll_names[op]);
      cJSON_AddNumberToObject(e, "alpha", r->fits[op].alpha);
      cJSON_AddNumberToObject(e, "beta", r->fits[op].beta);
      cJSON_AddItemToObject(e, "points", points_json(&r->fits[op]));
    }
  }
  cJSON *cal = cJSON_AddObjectToObject(j, "calibration");
  cJSON_AddStringToObject(cal, "host", host);
  cJSON_AddStringToObject(cal, "date", date);
  cJSON_AddNumberToObject(cal, "ranks", c->size);
  cJSON_AddNumberToObject(cal, "threads", c->threads);
  cJSON_AddBoolToObject(cal, "quick", o->quick);
  return j;
}

/* Writes text and a newline to path; 0, or 1 after a message. */
static int write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "cplan-calibrate: %s: %s\n", path, strerror(errno));
    return 1;
  }
  int bad = fputs(text, f) < 0 || fputc('\n', f) == EOF;
  if (fclose(f) != 0 || bad) {
    fprintf(stderr, "cplan-calibrate: %s: write failed: %s\n", path, strerror(errno));
    return 1;
  }
  return 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: cplan-calibrate --out FILE [--quick] [--ranks N]\n"
             "Measures this machine for cplan's cost model and writes a device profile (JSON).\n"
             "Run it through `cplanc calibrate -o FILE [--np N]`, which starts N ranks under mpirun.\n");
}

/* -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, Opts *o) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) o->out = argv[++i];
    else if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) o->expect_ranks = atoi(argv[++i]);
    else if (strcmp(argv[i], "--quick") == 0) o->quick = 1;
    else if (strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "cplan-calibrate: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!o->out) {
    fprintf(stderr, "cplan-calibrate: --out FILE is required\n");
    usage(stderr);
    return 2;
  }
  return -1;
}

int main(int argc, char **argv) {
  Opts o = {0};
  int st = parse_args(argc, argv, &o);
  if (st >= 0) return st;
  setvbuf(stdout, NULL, _IOLBF, 0);
  Ctx c = {.world = rt_comm_init(&argc, &argv)};
  c.rank = rt_comm_rank(c.world);
  c.size = rt_comm_size(c.world);
  if (o.expect_ranks > 0 && c.size != o.expect_ranks) {
    if (c.rank == 0)
      fprintf(stderr, "cplan-calibrate: started as %d rank%s, expected %d: the launcher did not start an "
              "MPI job of that size\n", c.size, c.size == 1 ? "" : "s", o.expect_ranks);
    rt_comm_finalize(c.world);
    return 1;
  }
  /* the threads of a plan rank (runtime/train.c) */
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  c.threads = cpus / c.size > 0 ? (int)(cpus / c.size) : 1;
  openblas_set_num_threads(c.threads);
  c.target = o.quick ? 0.02 : 0.4;
  double t_start = now();
  char host[256] = "this machine", date[32] = "";
  gethostname(host, sizeof host - 1);
  time_t tt = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%d", localtime(&tt));
  say(&c, "cplan calibrate: %s, %d rank%s x %d thread%s (%ld CPUs)%s\n", host, c.size, c.size == 1 ? "" : "s",
      c.threads, c.threads == 1 ? "" : "s", cpus, o.quick ? ", quick (small sizes: rough figures)" : "");
  if (c.size > cpus) say(&c, "note: more ranks than CPUs: the ranks share cores, as such a run would\n");
  say(&c, "CPU only: NCCL collectives and GPU kernels are not measured (no GPU backend in this build)\n");

  Results r = {0};
  measure_gemm(&c, &o, &r);
  measure_memory(&c, &o, &r);
  measure_kernels(&c, &o, &r);
  measure_links(&c, &o, &r);

  int64_t rc = 0;
  if (c.rank == 0) {
    cJSON *j = profile_json(&c, &o, &r, host, date);
    cJSON_AddNumberToObject(cJSON_GetObjectItemCaseSensitive(j, "calibration"), "seconds", now() - t_start);
    char *text = cJSON_Print(j);
    rc = text ? write_text(o.out, text) : 1;
    free(text);
    cJSON_Delete(j);
    say(&c, "\nmeasured in %.1f s\n", now() - t_start);
  }
  if (c.size > 1) rt_comm_broadcast(c.world, &rc, 1, RT_COMM_I64, 0);
  rt_comm_finalize(c.world);
  return (int)rc;
}
