/* test_rt_data.c: the runtime's data sources and safetensors I/O against docs/language.md §8.
 *
 * Writes small files in a temporary directory (kept when RT_TEST_KEEP is set, so a script can
 * inspect them) and pins exact batches computed by hand, every error message's key words, the
 * adder's format and held-out split, and safetensors round trips and corrupted files.
 * Prints "N passed, N failed" and exits non-zero on any failure. */
#include "cplanrt.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* An operation failed (failed_op true) with a message containing every needle. */
static void check_err(int failed_op, const RtError *e, int line, const char *n1, const char *n2) {
  check(failed_op, line, "expected an error containing '%s'", n1);
  if (!failed_op) return;
  check(strstr(e->msg, n1) != NULL, line, "message '%s' lacks '%s'", e->msg, n1);
  if (n2) check(strstr(e->msg, n2) != NULL, line, "message '%s' lacks '%s'", e->msg, n2);
}
#define CHECK_ERR(op_failed, e, n1, n2) check_err(!!(op_failed), &(e), __LINE__, n1, n2)

static const char *tmp_path(const char *name) {
  static char buf[8][512];
  static int k;
  char *p = buf[k++ % 8];
  snprintf(p, 512, "%s/%s", dir, name);
  return p;
}

static int same_i32(const int32_t *a, const int32_t *b, int n) {
  for (int i = 0; i < n; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

/* ---- tokens ------------------------------------------------------------------------------------ */

/* Writes an llm.c token file with the given header fields, `n` tokens 100 + i (or `bad` at
 * position 5 when bad > 0). */
static const char *write_tokens(const char *name, int magic, int version, int count, int n, int bad) {
  const char *path = tmp_path(name);
  FILE *fp = fopen(path, "wb");
  int32_t h[256] = {magic, version, count};
  fwrite(h, 4, 256, fp);
  for (int i = 0; i < n; i++) {
    uint16_t t = (uint16_t)(bad > 0 && i == 5 ? bad : 100 + i);
    fwrite(&t, 2, 1, fp);
  }
  fclose(fp);
  return path;
}

static void test_tokens_batches(void) {
  RtError e = {""};
  const char *p = write_tokens("ok.bin", 20240520, 1, 23, 23, 0);
  RtTokens *t = rt_tokens_open(p, 200, &e);
  CHECK(t, "open ok.bin: %s", e.msg);
  if (!t) return;
  CHECK(rt_tokens_count(t) == 23, "count");
  /* N = 2, T = 3: S = floor(22 / 6) = 3; step 4 -> o = (4 mod 3) * 6 = 6. */
  CHECK(rt_tokens_steps(t, 2, 3, &e) == 3, "S = 3");
  int32_t in[6], tg[6];
  CHECK(rt_tokens_batch(t, 2, 3, 4, 0, 2, in, tg, &e) == 0, "batch: %s", e.msg);
  const int32_t want_in[6] = {106, 107, 108, 109, 110, 111}, want_tg[6] = {107, 108, 109, 110, 111, 112};
  CHECK(same_i32(in, want_in, 6) && same_i32(tg, want_tg, 6), "step 4 batch");
  /* Step 2: o = 12; sample 1 alone (what rank 1 of 2 reads) reads tokens [15, 19). */
  CHECK(rt_tokens_batch(t, 2, 3, 2, 1, 2, in, tg, &e) == 0, "range: %s", e.msg);
  const int32_t r_in[3] = {115, 116, 117}, r_tg[3] = {116, 117, 118};
  CHECK(same_i32(in, r_in, 3) && same_i32(tg, r_tg, 3), "step 2 sample 1");
  /* Step 3 wraps to step 0: sample 0 reads [0, 4). */
  CHECK(rt_tokens_batch(t, 2, 3, 3, 0, 1, in, tg, &e) == 0 && in[0] == 100 && tg[2] == 103, "wrap");
  CHECK_ERR(rt_tokens_batch(t, 2, 3, 0, 1, 3, in, tg, &e) < 0, e, "bad batch request", NULL);
  rt_tokens_close(t);
}

static void test_tokens_errors(void) {
  RtError e = {""};
  const char *p = write_tokens("magic.bin", 12345, 1, 23, 23, 0);
  CHECK_ERR(!rt_tokens_open(p, 200, &e), e, "magic.bin: bad magic 12345 (expected 20240520)", "llm.c");
  p = write_tokens("version.bin", 20240520, 2, 23, 23, 0);
  CHECK_ERR(!rt_tokens_open(p, 200, &e), e, "version.bin: unsupported version 2", NULL);
  p = write_tokens("trunc.bin", 20240520, 1, 23, 20, 0);
  CHECK_ERR(!rt_tokens_open(p, 200, &e), e, "trunc.bin: truncated: 1064 bytes", "23 tokens (1070 bytes)");
  p = write_tokens("long.bin", 20240520, 1, 23, 25, 0);
  CHECK_ERR(!rt_tokens_open(p, 200, &e), e, "long.bin", "4 bytes too many");
  p = write_tokens("vocab.bin", 20240520, 1, 23, 23, 200);
  CHECK_ERR(!rt_tokens_open(p, 200, &e), e, "vocab.bin: token 5 is 200", "vocab 200");
  RtTokens *edge = rt_tokens_open(tmp_path("ok.bin"), 123, &e); /* largest token 122 */
  CHECK(edge, "a token of vocab - 1 is accepted: %s", e.msg);
  rt_tokens_close(edge);
  CHECK_ERR(!rt_tokens_open(tmp_path("missing.bin"), 200, &e), e, "missing.bin: cannot open",
            "No such file");
  FILE *fp = fopen(tmp_path("short.bin"), "wb");
  fputs("tiny", fp);
  fclose(fp);
  CHECK_ERR(!rt_tokens_open(tmp_path("short.bin"), 200, &e), e, "short.bin: 4 bytes is shorter", NULL);
  /* 6 tokens, N = 2, T = 3: one step needs 7. */
  p = write_tokens("small.bin", 20240520, 1, 6, 6, 0);
  RtTokens *t = rt_tokens_open(p, 200, &e);
  CHECK(t, "open small.bin: %s", e.msg);
  if (!t) return;
  int32_t in[6], tg[6];
  CHECK_ERR(rt_tokens_steps(t, 2, 3, &e) < 0, e, "small.bin: too small: 6 tokens", "N*T + 1 = 7");
  CHECK_ERR(rt_tokens_batch(t, 2, 3, 0, 0, 2, in, tg, &e) < 0, e, "too small", NULL);
  CHECK(rt_tokens_steps(t, 1, 5, &e) == 1, "6 tokens make one step of 1 x 5");
  rt_tokens_close(t);
}

/* ---- adder ------------------------------------------------------------------------------------- */

/* What rt_tokens_write writes, rt_tokens_open reads back, token for token. */
static void test_tokens_write(void) {
  RtError e = {0};
  char path[320];
  snprintf(path, sizeof path, "%s/written.bin", dir);
  uint16_t toks[300];
  for (int i = 0; i < 300; i++) toks[i] = (uint16_t)(i * 7 % 256);
  CHECK(rt_tokens_write(path, toks, 300, &e) == 0, "write: %s", e.msg);
  RtTokens *t = rt_tokens_open(path, 256, &e);
  CHECK(t, "reopen written.bin: %s", e.msg);
  if (!t) return;
  CHECK(rt_tokens_count(t) == 300, "written count");
  int32_t in[10], tg[10];
  CHECK(rt_tokens_batch(t, 1, 10, 1, 0, 1, in, tg, &e) == 0, "batch: %s", e.msg);
  CHECK(in[0] == toks[10] && tg[9] == toks[20], "written tokens read back in order");
  rt_tokens_close(t);
  snprintf(path, sizeof path, "%s/no/such/dir/x.bin", dir);
  CHECK(rt_tokens_write(path, toks, 3, &e) < 0 && strstr(e.msg, "cannot create"), "unwritable path: %s", e.msg);
}

static void test_adder_format(void) {
  RtError e = {""};
  int32_t seq[12];
  CHECK(rt_adder_sequence(2, 12, 34, 12, seq, &e) == 0, "sequence: %s", e.msg);
  const int32_t want[12] = {1, 2, 10, 3, 4, 11, 6, 4, 0, 12, 12, 12};
  CHECK(same_i32(seq, want, 12), "12+34 tokens");
  CHECK(rt_adder_sequence(2, 99, 99, 9, seq, &e) == 0, "3d+3 exactly");
  const int32_t w99[9] = {9, 9, 10, 9, 9, 11, 8, 9, 1};
  CHECK(same_i32(seq, w99, 9), "99+99 = 198 reversed 8 9 1");
  CHECK_ERR(rt_adder_sequence(2, 1, 2, 8, seq, &e) < 0, e, "at least 3d + 3 = 9", NULL);
  /* Held-out rule: keys 0 and 12 are held out (d = 2), 1234 and 1 are not. */
  CHECK(rt_adder_held_out(2, 0, 0) && rt_adder_held_out(2, 0, 12), "held-out keys 0, 12");
  CHECK(!rt_adder_held_out(2, 12, 34) && !rt_adder_held_out(2, 0, 1), "keys 1234, 1 not held out");
  CHECK(rt_splitmix64(0) == 0xe220a8397b1dcdafull, "splitmix64(0) reference value");
}

static void test_adder_batch_shape(RtAdder *a) {
  RtError e = {""};
  /* T = 11: the sample of 12+34 is inputs = seq[0, 11), targets = seq[1, 12) masked to c. */
  int32_t in[2 * 11], tg[2 * 11];
  CHECK(rt_adder_batch(a, 1, 4, 11, 0, 0, 2, in, tg, &e) == 0, "eval batch: %s", e.msg);
  const int32_t in1[11] = {6, 1, 10, 7, 8, 11, 9, 3, 1, 12, 12};   /* eval sample 1: 61 + 78 */
  const int32_t tg1[11] = {-1, -1, -1, -1, -1, 9, 3, 1, -1, -1, -1};
  CHECK(same_i32(in + 11, in1, 11) && same_i32(tg + 11, tg1, 11), "eval sample 1 is 61+78");
  CHECK_ERR(rt_adder_batch(a, 0, 4, 7, 0, 0, 1, in, tg, &e) < 0, e, "3d + 3 = 9", NULL);
}

/* Reads a, b back from a sample's inputs and checks c against the targets. */
static int decode(int d, const int32_t *in, const int32_t *tg, uint64_t *a, uint64_t *b) {
  *a = *b = 0;
  for (int i = 0; i < d; i++) {
    *a = *a * 10 + (uint64_t)in[i];
    *b = *b * 10 + (uint64_t)in[d + 1 + i];
  }
  uint64_t c = *a + *b;
  for (int i = 0; i <= d; i++, c /= 10)
    if (tg[2 * d + 1 + i] != (int32_t)(c % 10)) return 0;
  return in[d] == RT_ADD_PLUS && in[2 * d + 1] == RT_ADD_EQUALS;
}

static void test_adder_split(int d, int eval, int64_t seed) {
  RtError e = {""};
  RtAdder *a = rt_adder_open(d, seed, &e);
  CHECK(a, "adder open: %s", e.msg);
  if (!a) return;
  enum { N = 64, STEPS = 40 };
  int64_t T = 3 * d + 4;
  int32_t *in = malloc(sizeof *in * N * T), *tg = malloc(sizeof *tg * N * T);
  int32_t *in2 = malloc(sizeof *in * N * T), *tg2 = malloc(sizeof *tg * N * T);
  int bad_split = 0, bad_sum = 0, bad_range = 0;
  for (int s = 0; s < STEPS; s++) {
    rt_adder_batch(a, eval, N, T, s, 0, N, in, tg, &e);
    rt_adder_batch(a, eval, N, T, s, 10, 20, in2, tg2, &e);
    bad_range += !same_i32(in + 10 * T, in2, (int)(10 * T)) || !same_i32(tg + 10 * T, tg2, (int)(10 * T));
    for (int j = 0; j < N; j++) {
      uint64_t x, y;
      bad_sum += !decode(d, in + j * T, tg + j * T, &x, &y);
      bad_split += rt_adder_held_out(d, x, y) != eval;
    }
  }
  CHECK(bad_split == 0, "d=%d %s: %d samples on the wrong side of the split", d,
        eval ? "eval" : "train", bad_split);
  CHECK(bad_sum == 0, "d=%d: %d samples with a wrong sum or layout", d, bad_sum);
  CHECK(bad_range == 0, "d=%d: samples [10, 20) differ from the full batch", d);
  free(in), free(tg), free(in2), free(tg2);
  rt_adder_close(a);
}

/* A short evaluation (16 batches of 64 of the ~100,000 held-out problems of d = 3) is spread
 * over every a: each tenth of [0, 1000) gets about a tenth of the 1024 samples. */
static void test_adder_eval_spread(void) {
  RtError e = {""};
  RtAdder *a = rt_adder_open(3, 1337, &e);
  CHECK(a, "adder open: %s", e.msg);
  if (!a) return;
  int per_tenth[10] = {0}, held = 1;
  for (int s = 0; s < 16; s++)
    for (int j = 0; j < 64; j++) {
      uint64_t x, y;
      rt_adder_problem(a, 1, s, 64, j, &x, &y);
      held &= rt_adder_held_out(3, x, y);
      per_tenth[x / 100]++;
    }
  int lo = 1024, hi = 0;
  for (int k = 0; k < 10; k++) {
    lo = per_tenth[k] < lo ? per_tenth[k] : lo;
    hi = per_tenth[k] > hi ? per_tenth[k] : hi;
  }
  CHECK(held, "d=3: every eval sample is held out");
  CHECK(lo >= 80 && hi <= 125, "d=3: 1024 eval samples per tenth of a range %d..%d, want ~102", lo, hi);
  rt_adder_close(a);
}

static void test_adder_order(void) {
  RtError e = {""};
  RtAdder *a = rt_adder_open(2, 7, &e), *b = rt_adder_open(2, 7, &e), *c = rt_adder_open(2, 8, &e);
  CHECK(a && b && c, "adder open: %s", e.msg);
  if (!a || !b || !c) return;
  test_adder_batch_shape(a);
  /* Evaluation visits the held-out problems (1000 for d = 2, sorted by key: 0, 12, 24, ...)
   * with stride 619 (cplanrt.h): sample i is held[i * 619 mod 1000]. */
  uint64_t x, y;
  rt_adder_problem(a, 1, 0, 4, 3, &x, &y);
  CHECK(x == 86 && y == 0, "eval sample 3 is 86+0, got %llu+%llu", (unsigned long long)x, (unsigned long long)y);
  static unsigned char seen[100 * 100];
  int held = 1, distinct = 1;
  for (int i = 0; i < 1000; i++) {
    rt_adder_problem(a, 1, 0, 1000, i, &x, &y);
    held &= rt_adder_held_out(2, x, y);
    distinct &= !seen[x * 100 + y];
    seen[x * 100 + y] = 1;
  }
  CHECK(held && distinct, "one eval pass visits 1000 distinct held-out problems");
  rt_adder_problem(a, 1, 1, 1000, 0, &x, &y);
  CHECK(x == 0 && y == 0, "eval wraps after the 1000 held-out problems");
  /* Training: the same (seed, step, j) gives the same problem; another seed differs somewhere. */
  int same = 1, differ = 0;
  uint64_t x2, y2;
  for (int j = 0; j < 32; j++) {
    rt_adder_problem(a, 0, 5, 32, j, &x, &y);
    rt_adder_problem(b, 0, 5, 32, j, &x2, &y2);
    same &= x == x2 && y == y2;
    rt_adder_problem(c, 0, 5, 32, j, &x2, &y2);
    differ |= x != x2 || y != y2;
  }
  CHECK(same && differ, "training order depends on (seed, step, j) only");
  rt_adder_close(a), rt_adder_close(b), rt_adder_close(c);
  CHECK_ERR(!rt_adder_open(0, 1, &e), e, "digits = 0 is out of range", NULL);
  CHECK_ERR(!rt_adder_open(10, 1, &e), e, "digits = 10", NULL);
}

/* ---- safetensors ----------------------------------------------------------------------------- */

/* The header is printable JSON text padded with spaces to a multiple of 8 bytes, as other
 * readers (Python's safetensors) expect. */
static void check_header_text(const char *path) {
  unsigned char buf[4096];
  FILE *fp = fopen(path, "rb");
  size_t n = fp ? fread(buf, 1, sizeof buf, fp) : 0;
  if (fp) fclose(fp);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0 && n >= 8; i--) hlen = hlen << 8 | buf[i];
  int ok = n >= 8 && hlen % 8 == 0 && hlen + 8 <= n && buf[8] == '{';
  for (uint64_t i = 8; ok && i < 8 + hlen; i++) ok = buf[i] >= 0x20 && buf[i] < 0x7f;
  CHECK(ok, "%s: header of %llu bytes is not space-padded printable JSON", path, (unsigned long long)hlen);
}

static void test_st_roundtrip(void) {
  RtError e = {""};
  float w[6] = {1.5f, -2, 3, 4, 5, 6.25f};
  int32_t ids[4] = {7, -8, 9, 10};
  double sc = 3.25;
  RtStTensor ts[3] = {
    {"h.0.attn.c_attn.weight", RT_F32, 2, {2, 3}, w},
    {"ids", RT_I32, 1, {4}, ids},
    {"scale", RT_F64, 0, {0}, &sc},
  };
  const char *keys[2] = {"format", "step"}, *vals[2] = {"pt", "12"};
  const char *p = tmp_path("ckpt.safetensors");
  CHECK(rt_st_write(p, ts, 3, keys, vals, 2, &e) == 0, "write: %s", e.msg);
  CHECK(access(tmp_path("ckpt.safetensors.tmp"), F_OK) != 0, "no .tmp file left behind");
  check_header_text(p);
  RtStFile *f = rt_st_open(p, &e);
  CHECK(f, "open: %s", e.msg);
  if (!f) return;
  CHECK(rt_st_count(f) == 3, "3 tensors");
  CHECK(rt_st_meta(f, "step") && strcmp(rt_st_meta(f, "step"), "12") == 0, "metadata step");
  CHECK(rt_st_meta(f, "nope") == NULL, "absent metadata");
  float w2[6];
  int64_t shape[2] = {2, 3};
  CHECK(rt_st_read(f, "h.0.attn.c_attn.weight", RT_F32, 2, shape, w2, &e) == 0 &&
        memcmp(w, w2, sizeof w) == 0, "weight round trip: %s", e.msg);
  const RtStTensor *t = rt_st_find(f, "ids");
  CHECK(t && t->dtype == RT_I32 && t->ndim == 1 && memcmp(t->data, ids, sizeof ids) == 0, "ids");
  t = rt_st_find(f, "scale");
  CHECK(t && t->ndim == 0 && memcmp(t->data, &sc, 8) == 0, "scalar");
  int64_t bad[2] = {3, 2};
  CHECK_ERR(rt_st_read(f, "h.0.attn.c_attn.weight", RT_F32, 2, bad, w2, &e) < 0, e,
            "has shape [2, 3], expected [3, 2]", NULL);
  CHECK_ERR(rt_st_read(f, "ids", RT_F32, 1, shape, w2, &e) < 0, e, "'ids' has dtype I32, expected F32", NULL);
  CHECK_ERR(rt_st_read(f, "h.1.mlp", RT_F32, 1, shape, w2, &e) < 0, e, "no tensor named 'h.1.mlp'", NULL);
  rt_st_close(f);
  /* Data is laid out largest element first, so an F16 listed before an F32 does not misalign it. */
  uint16_t half[3] = {1, 2, 3};
  RtStTensor mixed[3] = {{"half", RT_F16, 1, {3}, half}, {"w", RT_F32, 1, {2}, w}, {"s", RT_F64, 0, {0}, &sc}};
  CHECK(rt_st_write(tmp_path("mixed.safetensors"), mixed, 3, NULL, NULL, 0, &e) == 0, "write mixed");
  f = rt_st_open(tmp_path("mixed.safetensors"), &e);
  CHECK(f && rt_st_count(f) == 3, "open mixed: %s", e.msg);
  for (int i = 0; f && i < 3; i++) {
    t = rt_st_tensor(f, i);
    CHECK(strcmp(t->name, mixed[i].name) == 0, "header order kept");
    CHECK((uintptr_t)t->data % rt_dtype_size(t->dtype) == 0, "'%s' data aligned", t->name);
    CHECK(memcmp(t->data, mixed[i].data, (size_t)rt_st_numel(t) * rt_dtype_size(t->dtype)) == 0,
          "'%s' data", t->name);
  }
  rt_st_close(f);
  RtStTensor dup[2] = {ts[1], ts[1]};
  CHECK_ERR(rt_st_write(tmp_path("dup.safetensors"), dup, 2, NULL, NULL, 0, &e) < 0, e,
            "two tensors are named 'ids'", NULL);
  CHECK_ERR(rt_st_write(tmp_path("nodir/x.safetensors"), ts, 1, NULL, NULL, 0, &e) < 0, e,
            "x.safetensors.tmp: cannot create", NULL);
}

/* Writes a raw safetensors file: header length `hlen` (or the header's own length when 0), the
 * header text, then `data` zero bytes. */
static const char *write_raw(const char *name, uint64_t hlen, const char *hdr, int data) {
  const char *path = tmp_path(name);
  FILE *fp = fopen(path, "wb");
  uint64_t l = hlen ? hlen : strlen(hdr);
  fwrite(&l, 8, 1, fp);
  fputs(hdr, fp);
  for (int i = 0; i < data; i++) fputc(0, fp);
  fclose(fp);
  return path;
}

static void test_st_corrupt(void) {
  RtError e = {""};
  const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  RtStFile *f = rt_st_open(write_raw("ok.st", 0, ok, 8), &e);
  CHECK(f, "hand-written file opens: %s", e.msg);
  rt_st_close(f);
  FILE *fp = fopen(tmp_path("tiny.st"), "wb");
  fputs("abc", fp);
  fclose(fp);
  CHECK_ERR(!rt_st_open(tmp_path("tiny.st"), &e), e, "tiny.st: 3 bytes is too short", NULL);
  CHECK_ERR(!rt_st_open(write_raw("hlen.st", 1u << 30, ok, 8), &e), e, "hlen.st: header length 1073741824", NULL);
  CHECK_ERR(!rt_st_open(write_raw("json.st", 0, "{\"a\":{\"dtype\":", 8), &e), e, "json.st", "not a JSON object");
  CHECK_ERR(!rt_st_open(write_raw("range.st", 0, ok, 4), &e), e, "range.st: tensor 'a': data_offsets [0, 8] outside", NULL);
  CHECK_ERR(!rt_st_open(write_raw("size.st", 0,
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8), &e), e,
            "8 bytes at data_offsets but dtype F32 x shape needs 12", NULL);
  CHECK_ERR(!rt_st_open(write_raw("overlap.st", 0,
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8), &e), e,
            "tensors 'a' and 'b' overlap", NULL);
  CHECK_ERR(!rt_st_open(write_raw("dtype.st", 0,
            "{\"a\":{\"dtype\":\"F8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 8), &e), e,
            "unknown dtype 'F8'", NULL);
  CHECK_ERR(!rt_st_open(write_raw("shape.st", 0,
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8), &e), e,
            "negative dim", NULL);
  CHECK_ERR(!rt_st_open(write_raw("dupname.st", 0,
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8), &e), e,
            "two tensors are named 'a'", NULL);
  CHECK_ERR(!rt_st_open(write_raw("meta.st", 0, "{\"__metadata__\":{\"k\":3}}", 0), &e), e,
            "__metadata__ value 'k' is not a string", NULL);
  CHECK_ERR(!rt_st_open(tmp_path("none.st"), &e), e, "none.st: cannot open", NULL);
}

/* ---- tensors(path) ----------------------------------------------------------------------------- */

static void test_tensor_source(void) {
  RtError e = {""};
  float x[6] = {0, 1, 10, 11, 20, 21};
  int32_t y[3] = {100, 101, 102};
  uint16_t h[3] = {1, 2, 3};
  RtStTensor ts[3] = {{"x", RT_F32, 2, {3, 2}, x}, {"y", RT_I32, 1, {3}, y}, {"h", RT_F16, 1, {3}, h}};
  const char *p = tmp_path("data.safetensors");
  CHECK(rt_st_write(p, ts, 3, NULL, NULL, 0, &e) == 0, "write: %s", e.msg);
  const char *names[2] = {"x", "y"};
  RtTensorSource *s = rt_tsrc_open(p, names, 2, &e);
  CHECK(s, "tensor source: %s", e.msg);
  if (!s) return;
  CHECK(rt_tsrc_rows(s) == 3, "3 rows");
  /* N = 2, step 1: samples 0, 1 are rows (2 + 0) mod 3 = 2 and (2 + 1) mod 3 = 0. */
  float xb[4];
  int32_t yb[2];
  CHECK(rt_tsrc_batch(s, 0, 2, 1, 0, 2, xb, &e) == 0 && xb[0] == 20 && xb[1] == 21 && xb[2] == 0 &&
        xb[3] == 1, "x rows 2, 0");
  CHECK(rt_tsrc_batch(s, 1, 2, 1, 1, 2, yb, &e) == 0 && yb[0] == 100, "y sample 1 of step 1 is row 0");
  rt_tsrc_close(s);
  const char *n2[1] = {"z"}, *n3[1] = {"h"};
  CHECK_ERR(!rt_tsrc_open(p, n2, 1, &e), e, "data.safetensors: no tensor named 'z'", NULL);
  CHECK_ERR(!rt_tsrc_open(p, n3, 1, &e), e, "'h' has dtype F16", "F32 and I32");
  RtStTensor t2[2] = {{"x", RT_F32, 2, {3, 2}, x}, {"y", RT_I32, 1, {2}, y}};
  CHECK(rt_st_write(tmp_path("rows.safetensors"), t2, 2, NULL, NULL, 0, &e) == 0, "write rows");
  CHECK_ERR(!rt_tsrc_open(tmp_path("rows.safetensors"), names, 2, &e), e, "'y' has 2 samples but 'x' has 3", NULL);
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/cplan_rt_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
  test_tokens_batches();
  test_tokens_errors();
  test_tokens_write();
  test_adder_format();
  test_adder_order();
  test_adder_eval_spread();
  test_adder_split(2, 0, 1);
  test_adder_split(2, 1, 1);
  test_adder_split(1, 0, 3);
  test_adder_split(5, 0, 4);
  test_adder_split(5, 1, 4);   /* the drawn evaluation order of large d */
  test_st_roundtrip();
  test_st_corrupt();
  test_tensor_source();
  if (getenv("RT_TEST_KEEP")) {
    printf("files kept in %s\n", dir);
  } else {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
