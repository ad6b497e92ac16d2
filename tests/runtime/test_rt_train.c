/* test_rt_train.c: rt_main, the training main loop, driven by a plan written by hand.
 *
 * The plan is what codegen would emit for a bigram model over the adder data: one [13, 13]
 * logits table and a [13] bias, cross-entropy on the answer digits, gradients accumulated into
 * "grad" states, SGD with momentum (a saved state) in update().  Hooks make it produce a NaN
 * loss or raise SIGINT at a chosen step.  rt_main runs with argv arrays, its stderr captured,
 * and the checks read the files it writes: metrics JSONL, params, checkpoints.
 * Files go to a temporary directory (kept when RT_TEST_KEEP is set); RT_TEST_VERBOSE=1 shows
 * what each run printed.
 * Prints "N passed, N failed" and exits non-zero on any failure. */
#include "cplanrt.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int passed, failed;
static char dir[256];

static void check(int ok, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(int ok, int line, const char *fmt, ...) {
  if (ok) { passed++; return; }
  failed++;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL line %d: ", line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}
#define CHECK(cond, ...) check(!!(cond), __LINE__, __VA_ARGS__)

/* A path in the test directory; each call gets its own string (freed at exit), so paths stay
 * valid however many calls follow. */
static char *paths[1024];
static int npaths;
static const char *tmp_path(const char *name) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", dir, name);
  if (npaths == 1024) { fprintf(stderr, "too many paths\n"); exit(1); }
  return paths[npaths++] = strdup(buf);
}

/* ---- the hand-written plan ----------------------------------------------------------------- */

enum { V = RT_ADD_VOCAB, T = 9, MICRO = 8, ACCUM = 2, NW = V * V, NP = NW + V };

static int64_t nan_at_step = -1, sigint_at_step = -1;

static const RtPlanParam params[] = {
  {.name = "table", .rank = 2, .shape = {V, V}, .numel = NW, .offset = 0, .init = RT_INIT_NORMAL,
   .init_a = 0.02},
  {.name = "bias", .rank = 1, .shape = {V}, .numel = V, .offset = NW, .init = RT_INIT_UNIFORM,
   .init_a = -0.1, .init_b = 0.1},
};
static const RtPlanState states[] = {
  {.name = "table.grad", .numel = NW, .offset = 0, .saved = 0},
  {.name = "bias.grad", .numel = V, .offset = NW, .saved = 0},
  {.name = "table.momentum_buffer", .numel = NW, .offset = NP, .saved = 1},
  {.name = "bias.momentum_buffer", .numel = V, .offset = NP + NW, .saved = 1},
};
static const RtPlanInput inputs[] = {
  {.name = "idx", .rank = 2, .shape = {MICRO, T}, .dtype = RT_I32},
  {.name = "targets", .rank = 2, .shape = {MICRO, T}, .dtype = RT_I32},
};
static const char *const metric_names[] = {"acc"};

static double lr_at(int64_t step) { return 1.0 - 0.5 * (double)step / 60.0; }

/* Loss and accuracy of one micro-batch; adds its gradient / accum into grad when not NULL. */
static void forward(const RtRun *run, const void *const *in, double *loss, double *metrics,
                    float *grad) {
  const int32_t *idx = in[0], *tg = in[1];
  const float *w = run->params, *b = run->params + NW;
  int n = 0, correct = 0;
  double sum = 0;
  for (int i = 0; i < MICRO * T; i++) n += tg[i] >= 0;
  for (int i = 0; i < MICRO * T; i++) {
    if (tg[i] < 0) continue;
    double z[V], mx = -1e30, s = 0;
    int arg = 0;
    for (int k = 0; k < V; k++) {
      z[k] = (double)w[idx[i] * V + k] + b[k];
      if (z[k] > mx) mx = z[k], arg = k;
    }
    for (int k = 0; k < V; k++) s += exp(z[k] - mx);
    sum += -(z[tg[i]] - mx - log(s));
    correct += arg == tg[i];
    for (int k = 0; grad && k < V; k++) {
      double g = (exp(z[k] - mx) / s - (k == tg[i])) / n / ACCUM;
      grad[idx[i] * V + k] += (float)g;
      grad[NW + k] += (float)g;
    }
  }
  *loss = sum / n;
  metrics[0] = (double)correct / n;
}

static void micro_step(RtRun *run, const void *const *in, double *loss, double *metrics) {
  forward(run, in, loss, metrics, run->state);
  if (run->step == nan_at_step) *loss = NAN;
  if (run->step == sigint_at_step && run->micro_index == 0) raise(SIGINT);
}

static void eval_step(RtRun *run, const void *const *in, double *loss, double *metrics) {
  forward(run, in, loss, metrics, NULL);
}

/* SGD with momentum 0.9, as torch.optim.SGD; returns the gradient norm and zeroes the grads. */
static double update(RtRun *run) {
  float *p = run->params, *g = run->state, *m = run->state + NP;
  double lr = lr_at(run->step), ss = 0;
  for (int i = 0; i < NP; i++) {
    ss += (double)g[i] * g[i];
    m[i] = 0.9f * m[i] + g[i];
    p[i] -= (float)lr * m[i];
    g[i] = 0;
  }
  return sqrt(ss);
}

static RtPlan make_plan(void) {
  return (RtPlan){
    .model = "bigram", .source = "test_rt_train.c", .source_hash = "hand-1",
    .nparams = 2, .params = params, .param_floats = NP,
    .nstates = 4, .states = states, .state_floats = 2 * NP, .work_bytes = 100,
    .ninputs = 2, .inputs = inputs, .nmetrics = 1, .metric_names = metric_names,
    .data_kind = RT_DATA_ADDER, .digits = 2, .vocab = V, .seq_len = T,
    .batch = MICRO * ACCUM, .micro = MICRO, .accum = ACCUM, .steps = 60, .seed = 7,
    .eval_every = 25, .eval_batches = 2, .ckpt_keep = 2, .log_every = 10,
    .flops_per_step = 1e6, .lr_at = lr_at, .micro_step = micro_step, .update = update,
    .eval_step = eval_step,
  };
}

/* ---- running rt_main ------------------------------------------------------------------------- */

static char errtext[8192];

/* rt_main(argv = {"train", args..., NULL}) with stderr captured into errtext. */
static int run_main(const RtPlan *p, ...) {
  char *argv[32] = {"train"};
  int argc = 1;
  va_list ap;
  va_start(ap, p);
  for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 31;) argv[argc++] = a;
  va_end(ap);
  fflush(stderr);
  int saved = dup(STDERR_FILENO), fd = open(tmp_path("stderr.txt"), O_RDWR | O_CREAT | O_TRUNC, 0644);
  dup2(fd, STDERR_FILENO);
  int rc = rt_main(argc, argv, p);
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  ssize_t n = pread(fd, errtext, sizeof errtext - 1, 0);
  errtext[n > 0 ? n : 0] = '\0';
  close(fd);
  if (getenv("RT_TEST_VERBOSE")) fprintf(stderr, "$ rt_main ... -> %d\n%s", rc, errtext);
  return rc;
}

/* The metrics lines of a JSONL file, parsed; returns the count (at most max). */
static int read_jsonl(const char *path, cJSON **out, int max) {
  FILE *fp = fopen(path, "r");
  char line[4096];
  int n = 0;
  while (fp && n < max && fgets(line, sizeof line, fp)) out[n++] = cJSON_Parse(line);
  if (fp) fclose(fp);
  return n;
}

static void free_jsonl(cJSON **j, int n) {
  for (int i = 0; i < n; i++) cJSON_Delete(j[i]);
}

/* The text of every "loss" value in the file, one per line, into buf. */
static void loss_texts(const char *path, char *buf, size_t n) {
  FILE *fp = fopen(path, "r");
  char line[4096];
  size_t k = 0;
  buf[0] = '\0';
  while (fp && fgets(line, sizeof line, fp)) {
    const char *s = strstr(line, "\"loss\":");
    if (!s) continue;
    size_t len = strcspn(s, ",}");
    k += (size_t)snprintf(buf + k, n - k, "%.*s\n", (int)len, s);
    if (k >= n) break;
  }
  if (fp) fclose(fp);
}

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static double num(const cJSON *j, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_generator(void) {
  CHECK(rt_hash_str("table") != rt_hash_str("bias"), "hash separates names");
  CHECK(rt_uniform(1, 2, 3) == rt_uniform(1, 2, 3), "uniform is a function");
  CHECK(rt_uniform(1, 2, 3) != rt_uniform(1, 2, 4), "uniform depends on the index");
  double lo = 1, hi = 0, sum = 0;
  for (int i = 0; i < 10000; i++) {
    double u = rt_uniform(5, 6, (uint64_t)i);
    lo = u < lo ? u : lo, hi = u > hi ? u : hi, sum += u;
  }
  CHECK(lo >= 0 && hi < 1 && fabs(sum / 10000 - 0.5) < 0.02, "uniform in [0,1), mean %g", sum / 1e4);
}

/* 50 steps: the loss falls, and every line of the metrics has its fields. */
static void test_train_metrics(void) {
  RtPlan p = make_plan();
  const char *m = tmp_path("m50.jsonl");
  int rc = run_main(&p, "--steps", "50", "--metrics", m, "--threads", "1", NULL);
  CHECK(rc == 0, "50 steps: rc %d: %s", rc, errtext);
  CHECK(strstr(errtext, "bigram") && strstr(errtext, "step 50/50") &&
        strstr(errtext, "eval step 25: val_loss"), "log lines: %s", errtext);
  cJSON *j[64];
  int n = read_jsonl(m, j, 64);
  CHECK(n == 50, "50 metrics lines, got %d", n);
  const char *keys[] = {"step", "loss", "lr", "grad_norm", "ms", "tokens_per_s", "acc"};
  for (int i = 0; i < n; i++) {
    CHECK(j[i] != NULL, "line %d is JSON", i);
    for (int k = 0; j[i] && k < 7; k++) CHECK(!isnan(num(j[i], keys[k])), "line %d: %s", i, keys[k]);
    int ev = i == 24 || i == 49;
    CHECK(j[i] && ev == !isnan(num(j[i], "val_loss")) && ev == !isnan(num(j[i], "val_acc")),
          "line %d: val_loss only at eval steps", i);
  }
  if (n == 50 && j[0] && j[49]) {
    CHECK(num(j[0], "step") == 1 && num(j[49], "step") == 50, "steps counted from 1 (the steps done)");
    CHECK(num(j[49], "loss") < 0.85 * num(j[0], "loss"), "loss falls: %g -> %g",
          num(j[0], "loss"), num(j[49], "loss"));
    CHECK(num(j[3], "lr") == lr_at(3), "lr from lr_at");
    CHECK(num(j[49], "val_loss") < num(j[24], "val_loss") + 0.5, "val loss sane");
  }
  free_jsonl(j, n);
  rc = run_main(&p, "--steps", "3", "--quiet", NULL);
  CHECK(rc == 0 && errtext[0] == '\0', "--quiet prints nothing: '%s'", errtext);
}

/* --save-init then --init gives the same run; another seed with --init too. */
static void test_init_roundtrip(void) {
  RtPlan p = make_plan();
  const char *init = tmp_path("init.safetensors");
  int rc = run_main(&p, "--steps", "3", "--save-init", init, "--metrics", tmp_path("a.jsonl"),
                    "--save", tmp_path("final.safetensors"), NULL);
  CHECK(rc == 0, "save-init: %s", errtext);
  RtError e = {""};
  RtStFile *f = rt_st_open(init, &e);
  CHECK(f != NULL, "open init: %s", e.msg);
  if (f) {
    const RtStTensor *w = rt_st_find(f, "table"), *b = rt_st_find(f, "bias");
    CHECK(w && w->dtype == RT_F32 && w->ndim == 2 && w->shape[0] == V && w->shape[1] == V,
          "table [13, 13] F32");
    double ss = 0, lo = 1, hi = -1;
    for (int i = 0; w && i < NW; i++) ss += ((float *)w->data)[i] * ((float *)w->data)[i];
    for (int i = 0; b && i < V; i++) {
      float v = ((float *)b->data)[i];
      lo = v < lo ? v : lo, hi = v > hi ? v : hi;
    }
    CHECK(fabs(sqrt(ss / NW) - 0.02) < 0.004, "normal(0.02): std %g", sqrt(ss / NW));
    CHECK(b && lo >= -0.1 && hi < 0.1 && hi - lo > 0.1, "uniform(-0.1, 0.1): [%g, %g]", lo, hi);
    CHECK(rt_st_meta(f, "format") && !strcmp(rt_st_meta(f, "format"), "pt"), "format pt");
    rt_st_close(f);
  }
  RtPlan q = make_plan();
  rc = run_main(&q, "--steps", "3", "--init", init, "--metrics", tmp_path("b.jsonl"), NULL);
  CHECK(rc == 0, "init: %s", errtext);
  char a[2048], b2[2048];
  loss_texts(tmp_path("a.jsonl"), a, sizeof a);
  loss_texts(tmp_path("b.jsonl"), b2, sizeof b2);
  CHECK(a[0] && !strcmp(a, b2), "--init reproduces the run:\n%s---\n%s", a, b2);
  /* another seed initializes other values, but --init replaces them */
  q.seed = 99;
  rc = run_main(&q, "--steps", "0", "--save-init", tmp_path("s99.safetensors"), "--quiet", NULL);
  int rc2 = run_main(&q, "--steps", "0", "--init", init, "--save-init",
                     tmp_path("s99i.safetensors"), "--quiet", NULL);
  RtStFile *f0 = rt_st_open(init, &e), *f1 = rt_st_open(tmp_path("s99.safetensors"), &e),
           *f2 = rt_st_open(tmp_path("s99i.safetensors"), &e);
  CHECK(rc == 0 && rc2 == 0 && f0 && f1 && f2, "seed 99 runs: %s", e.msg);
  if (f0 && f1 && f2) {
    CHECK(memcmp(rt_st_find(f0, "table")->data, rt_st_find(f1, "table")->data, NW * 4) != 0,
          "another seed, other init values");
    CHECK(memcmp(rt_st_find(f0, "table")->data, rt_st_find(f2, "table")->data, NW * 4) == 0 &&
          memcmp(rt_st_find(f0, "bias")->data, rt_st_find(f2, "bias")->data, V * 4) == 0,
          "--init loads every param");
  }
  rt_st_close(f0);
  rt_st_close(f1);
  rt_st_close(f2);
}

/* 3 steps, checkpoint, resume for 3 more == 6 straight steps, bit for bit. */
static void test_resume(void) {
  RtPlan p = make_plan();
  char a[4096], b[4096];
  const char *ck = tmp_path("ck");
  int rc = run_main(&p, "--steps", "6", "--metrics", tmp_path("six.jsonl"), NULL);
  CHECK(rc == 0, "6 steps: %s", errtext);
  rc = run_main(&p, "--steps", "3", "--metrics", tmp_path("three.jsonl"), "--checkpoint-dir", ck,
                "--checkpoint-every", "3", NULL);
  CHECK(rc == 0 && is_dir(tmp_path("ck/step_000003")), "checkpoint at 3: %s", errtext);
  CHECK(!is_dir(tmp_path("ck/step_000003.tmp")), "no .tmp left");
  rc = run_main(&p, "--steps", "6", "--metrics", tmp_path("three.jsonl"), "--resume", ck, NULL);
  CHECK(rc == 0 && strstr(errtext, "resumed from"), "resume: %s", errtext);
  loss_texts(tmp_path("six.jsonl"), a, sizeof a);
  loss_texts(tmp_path("three.jsonl"), b, sizeof b);
  CHECK(a[0] && !strcmp(a, b), "resumed losses equal the straight run's:\n%s---\n%s", a, b);
  RtError e = {""};
  RtStFile *f = rt_st_open(tmp_path("ck/step_000003/optimizer.safetensors"), &e);
  CHECK(f && rt_st_count(f) == 2 && rt_st_find(f, "table.momentum_buffer"),
        "optimizer.safetensors holds the saved states: %s", e.msg);
  rt_st_close(f);
  RtPlan other = make_plan();
  other.source_hash = "hand-2";
  rc = run_main(&other, "--steps", "6", "--resume", ck, NULL);
  CHECK(rc == 1 && strstr(errtext, "hand-1"), "another build refuses the checkpoint: %s", errtext);
}

/* A plan with f16 loss scaling's hook (RtPlan.loss_scaler): the scaler's state goes into each
 * checkpoint's state.json and --resume restores it, so a resumed run continues with the scale
 * the straight run has (here a stand-in scaler that doubles every second step). */
static double scaler_st[3];
static void fake_scaler(double st[3], int set) {
  for (int k = 0; k < 3; k++) {
    if (set) scaler_st[k] = st[k];
    else st[k] = scaler_st[k];
  }
}
static double update_scaled(RtRun *run) {
  if (++scaler_st[1] >= 2) scaler_st[0] *= 2, scaler_st[1] = 0;
  scaler_st[2] += run->step == 1; /* one skipped step */
  return update(run);
}
static void test_resume_scaler(void) {
  RtPlan p = make_plan();
  p.loss_scaler = fake_scaler, p.update = update_scaled;
  const char *ck = tmp_path("ck_scaler");
  scaler_st[0] = 65536, scaler_st[1] = scaler_st[2] = 0;
  int rc = run_main(&p, "--steps", "5", NULL);
  double straight[3] = {scaler_st[0], scaler_st[1], scaler_st[2]};
  CHECK(rc == 0 && straight[0] == 65536.0 * 4 && straight[1] == 1 && straight[2] == 1, "5 straight steps: %s", errtext);
  scaler_st[0] = 65536, scaler_st[1] = scaler_st[2] = 0;
  rc = run_main(&p, "--steps", "3", "--checkpoint-dir", ck, "--checkpoint-every", "3", NULL);
  CHECK(rc == 0, "3 steps with a checkpoint: %s", errtext);
  char text[4096] = "";
  FILE *fp = fopen(tmp_path("ck_scaler/step_000003/state.json"), "r");
  size_t len = fp ? fread(text, 1, sizeof text - 1, fp) : 0;
  if (fp) fclose(fp);
  text[len] = 0;
  cJSON *st[1] = {cJSON_Parse(text)};
  int n = st[0] != NULL;
  CHECK(n == 1 && num(st[0], "loss_scale") == 65536.0 * 2 && num(st[0], "loss_scale_good_steps") == 1 &&
            num(st[0], "skipped_steps") == 1,
        "state.json holds the scaler after 3 steps (scale 131072, 1 good step, 1 skipped)");
  free_jsonl(st, n);
  scaler_st[0] = 65536, scaler_st[1] = scaler_st[2] = 0; /* a new process starts at the initial scale */
  rc = run_main(&p, "--steps", "5", "--resume", ck, NULL);
  CHECK(rc == 0 && scaler_st[0] == straight[0] && scaler_st[1] == straight[1] && scaler_st[2] == straight[2],
        "the resumed run ends with the straight run's scaler (%g %g %g vs %g %g %g): %s", scaler_st[0],
        scaler_st[1], scaler_st[2], straight[0], straight[1], straight[2], errtext);
}

/* Checkpoints every step with keep = 2 leave the newest 2. */
static void test_keep(void) {
  RtPlan p = make_plan();
  const char *ck = tmp_path("keep");
  int rc = run_main(&p, "--steps", "5", "--checkpoint-dir", ck, "--checkpoint-every", "1",
                    "--quiet", NULL);
  CHECK(rc == 0, "keep run: %s", errtext);
  CHECK(!is_dir(tmp_path("keep/step_000001")) && !is_dir(tmp_path("keep/step_000003")) &&
        is_dir(tmp_path("keep/step_000004")) && is_dir(tmp_path("keep/step_000005")),
        "keep = 2 leaves steps 4 and 5");
}

/* SIGINT during step 2: the step finishes, a checkpoint is written, exit 0; resuming from it
 * continues the straight run exactly. */
static void test_sigint(void) {
  RtPlan p = make_plan();
  const char *ck = tmp_path("sig");
  sigint_at_step = 2;
  int rc = run_main(&p, "--steps", "6", "--checkpoint-dir", ck, "--metrics",
                    tmp_path("sig.jsonl"), NULL);
  sigint_at_step = -1;
  CHECK(rc == 0 && strstr(errtext, "interrupted") && strstr(errtext, "--resume"),
        "SIGINT: rc %d: %s", rc, errtext);
  CHECK(is_dir(tmp_path("sig/step_000003")), "checkpoint after the interrupted step");
  rc = run_main(&p, "--steps", "6", "--metrics", tmp_path("sig.jsonl"), "--resume", ck, NULL);
  char a[4096], b[4096];
  loss_texts(tmp_path("six.jsonl"), a, sizeof a);
  loss_texts(tmp_path("sig.jsonl"), b, sizeof b);
  CHECK(rc == 0 && a[0] && !strcmp(a, b), "resume after SIGINT:\n%s---\n%s", a, b);
}

static void write_bad_init(const char *name, const char *tname, int64_t rows) {
  float data[NW] = {0};
  RtStTensor t = {.name = tname, .dtype = RT_F32, .ndim = 2, .shape = {rows, V}, .data = data};
  rt_st_write(tmp_path(name), &t, 1, NULL, NULL, 0, NULL);
}

static void test_errors(void) {
  RtPlan p = make_plan();
  int rc = run_main(&p, "--bogus", NULL);
  CHECK(rc == 2 && strstr(errtext, "--bogus"), "unknown flag: %d %s", rc, errtext);
  rc = run_main(&p, "--steps", "x", NULL);
  CHECK(rc == 2 && strstr(errtext, "--steps"), "bad int: %d %s", rc, errtext);
  rc = run_main(&p, "--steps", NULL);
  CHECK(rc == 2, "missing value: %d %s", rc, errtext);
  rc = run_main(&p, "--steps", "61", NULL);
  CHECK(rc == 2, "steps beyond the plan: %d %s", rc, errtext);
  fflush(stdout);
  int out = dup(STDOUT_FILENO), null = open("/dev/null", O_WRONLY);
  dup2(null, STDOUT_FILENO);
  rc = run_main(&p, "--help", NULL);
  fflush(stdout);
  dup2(out, STDOUT_FILENO);
  close(out);
  close(null);
  CHECK(rc == 0, "--help");
  rc = run_main(&p, "--init", tmp_path("none.safetensors"), NULL);
  CHECK(rc == 1 && strstr(errtext, "none.safetensors"), "missing init: %d %s", rc, errtext);
  write_bad_init("short.safetensors", "table", 12);
  rc = run_main(&p, "--init", tmp_path("short.safetensors"), NULL);
  CHECK(rc == 1 && strstr(errtext, "table"), "wrong shape: %d %s", rc, errtext);
  write_bad_init("nobias.safetensors", "table", V);
  rc = run_main(&p, "--init", tmp_path("nobias.safetensors"), NULL);
  CHECK(rc == 1 && strstr(errtext, "bias"), "missing param: %d %s", rc, errtext);
  nan_at_step = 3;
  rc = run_main(&p, "--steps", "10", NULL);
  nan_at_step = -1;
  CHECK(rc == 1 && strstr(errtext, "step 4/10: the loss is NaN"), "NaN: %d %s", rc, errtext);
  p.digits = 3; /* needs T + 1 >= 12 */
  rc = run_main(&p, NULL);
  CHECK(rc == 1 && strstr(errtext, "sequence length"), "adder seq fit: %d %s", rc, errtext);
}

/* The same model on a token file: trains, and data errors exit 1 with the file named. */
static void test_tokens(void) {
  RtPlan p = make_plan();
  uint16_t tok[2000];
  for (int i = 0; i < 2000; i++) tok[i] = (uint16_t)(i * 7 % 11);
  rt_tokens_write(tmp_path("train.bin"), tok, 2000, NULL);
  tok[100] = 20;
  rt_tokens_write(tmp_path("badtok.bin"), tok, 2000, NULL);
  p.data_kind = RT_DATA_TOKENS;
  p.data_path = tmp_path("train.bin");
  p.val_path = tmp_path("train.bin");
  int rc = run_main(&p, "--steps", "26", "--metrics", tmp_path("tok.jsonl"), NULL);
  CHECK(rc == 0 && strstr(errtext, "val_loss"), "tokens run: %d %s", rc, errtext);
  rc = run_main(&p, "--data", tmp_path("missing.bin"), NULL);
  CHECK(rc == 1 && strstr(errtext, "missing.bin"), "missing data: %d %s", rc, errtext);
  rc = run_main(&p, "--data", tmp_path("badtok.bin"), NULL);
  CHECK(rc == 1 && strstr(errtext, "vocab"), "token >= vocab: %d %s", rc, errtext);
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/cplan_rt_train_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
  if (chdir(dir) != 0) { perror("chdir"); return 1; }
  test_generator();
  test_train_metrics();
  test_init_roundtrip();
  test_resume();
  test_resume_scaler();
  test_keep();
  test_sigint();
  test_errors();
  test_tokens();
  if (getenv("RT_TEST_KEEP")) {
    printf("files kept in %s\n", dir);
  } else {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  for (int i = 0; i < npaths; i++) free(paths[i]);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
