/* data.c: the data sources of docs/language.md §8 — tokens(path), adder(digits) and tensors(path).
 *
 * Every source answers "samples [j0, j1) of step s" for a global batch N, so a rank reads only
 * its own samples and the union over ranks equals one rank reading all of them.  The batch order
 * of each source is fixed by §8 (and, for the adder, by the comment in cplanrt.h); if you change
 * one, update both documents and tests/runtime/test_rt_data.c. */
#include "cplanrt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- shared checks ---------------------------------------------------------------------------- */

static int check_range(const char *what, int64_t n, int64_t seq, int64_t step, int64_t j0,
                       int64_t j1, RtError *err) {
  if (n <= 0 || seq <= 0 || step < 0 || j0 < 0 || j0 > j1 || j1 > n)
    return rt_errf(err, "%s: bad batch request: N=%lld T=%lld step=%lld samples [%lld, %lld)", what,
                   (long long)n, (long long)seq, (long long)step, (long long)j0, (long long)j1);
  return 0;
}

/* ---- tokens(path) ------------------------------------------------------------------------------ */

struct RtTokens {
  char *path;
  int64_t n;        /* token count */
  uint16_t *tok;
};

static int32_t le32(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

void rt_tokens_close(RtTokens *t) {
  if (!t) return;
  free(t->tok);
  free(t->path);
  free(t);
}

int64_t rt_tokens_count(const RtTokens *t) { return t->n; }

/* Validates the 1024-byte header against the file size; returns the token count or -1. */
static int64_t tokens_header(const char *path, FILE *fp, int64_t size, RtError *err) {
  unsigned char h[RT_TOKENS_HEADER_INTS * 4];
  if (size < (int64_t)sizeof h || fread(h, 1, sizeof h, fp) != sizeof h)
    return rt_errf(err, "%s: %lld bytes is shorter than the %zu-byte header of an llm.c token file",
                   path, (long long)size, sizeof h);
  if (le32(h) != RT_TOKENS_MAGIC)
    return rt_errf(err, "%s: bad magic %d (expected %d): not an llm.c token file", path, le32(h),
                   RT_TOKENS_MAGIC);
  if (le32(h + 4) != RT_TOKENS_VERSION)
    return rt_errf(err, "%s: unsupported version %d (expected %d: uint16 tokens)", path,
                   le32(h + 4), RT_TOKENS_VERSION);
  int64_t n = le32(h + 8), want = (int64_t)sizeof h + 2 * n;
  if (n < 0) return rt_errf(err, "%s: negative token count %lld in the header", path, (long long)n);
  if (size < want)
    return rt_errf(err, "%s: truncated: %lld bytes but the header says %lld tokens (%lld bytes)",
                   path, (long long)size, (long long)n, (long long)want);
  if (size > want)
    return rt_errf(err, "%s: %lld bytes but the header says %lld tokens (%lld bytes): %lld bytes too many",
                   path, (long long)size, (long long)n, (long long)want, (long long)(size - want));
  return n;
}

static int tokens_load(RtTokens *t, FILE *fp, int vocab, RtError *err) {
  unsigned char *raw = malloc((size_t)t->n * 2 + 1);
  t->tok = malloc((size_t)t->n * sizeof *t->tok + 1);
  if (!raw || !t->tok) { free(raw); return rt_errf(err, "%s: out of memory", t->path); }
  int rc = 0;
  if (fread(raw, 2, (size_t)t->n, fp) != (size_t)t->n)
    rc = rt_errf(err, "%s: read failed: %s", t->path, strerror(errno));
  for (int64_t i = 0; rc == 0 && i < t->n; i++) {
    t->tok[i] = (uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8);
    if (t->tok[i] >= vocab)
      rc = rt_errf(err, "%s: token %lld is %d, not below the model's vocab %d", t->path,
                   (long long)i, t->tok[i], vocab);
  }
  free(raw);
  return rc;
}

RtTokens *rt_tokens_open(const char *path, int vocab, RtError *err) {
  RtTokens *t = calloc(1, sizeof *t);
  if (!t || !(t->path = strdup(path))) {
    free(t);
    rt_errf(err, "%s: out of memory", path);
    return NULL;
  }
  FILE *fp = rt_open_regular(path, err);
  if (!fp) {
    rt_tokens_close(t);
    return NULL;
  }
  int64_t size = -1;
  if (fseek(fp, 0, SEEK_END) == 0) size = ftell(fp);
  int rc = (size < 0 || fseek(fp, 0, SEEK_SET) != 0)
               ? rt_errf(err, "%s: cannot read: not a regular file", path)
               : 0;
  if (rc == 0 && (t->n = tokens_header(path, fp, size, err)) < 0) rc = -1;
  if (rc == 0) rc = tokens_load(t, fp, vocab, err);
  fclose(fp);
  if (rc < 0) { rt_tokens_close(t); return NULL; }
  return t;
}

int64_t rt_tokens_steps(const RtTokens *t, int64_t n, int64_t seq, RtError *err) {
  if (n <= 0 || seq <= 0)
    return rt_errf(err, "%s: bad batch shape N=%lld T=%lld", t->path, (long long)n, (long long)seq);
  int64_t s = t->n > 0 ? (t->n - 1) / (n * seq) : 0;
  if (s == 0)
    return rt_errf(err, "%s: too small: %lld tokens, but one step of %lld samples of length %lld "
                   "needs N*T + 1 = %lld", t->path, (long long)t->n, (long long)n, (long long)seq,
                   (long long)(n * seq + 1));
  return s;
}

int rt_tokens_batch(const RtTokens *t, int64_t n, int64_t seq, int64_t step, int64_t j0,
                    int64_t j1, int32_t *inputs, int32_t *targets, RtError *err) {
  if (check_range(t->path, n, seq, step, j0, j1, err) < 0) return -1;
  int64_t steps = rt_tokens_steps(t, n, seq, err);
  if (steps < 0) return -1;
  int64_t o = (step % steps) * n * seq;
  for (int64_t j = j0; j < j1; j++) {
    const uint16_t *src = t->tok + o + j * seq;
    int32_t *in = inputs + (j - j0) * seq, *tg = targets + (j - j0) * seq;
    for (int64_t i = 0; i < seq; i++) {
      in[i] = src[i];
      tg[i] = src[i + 1];
    }
  }
  return 0;
}

/* ---- adder(digits) ----------------------------------------------------------------------------- */

#define ADDER_LIST_MAX_DIGITS 3 /* list the held-out problems when there are at most 10^6 problems */

struct RtAdder {
  int digits;
  uint64_t seed;
  uint64_t p10;     /* 10^digits */
  uint64_t *held;   /* held-out keys in increasing order, or NULL for large digits */
  int64_t n_held;
  uint64_t stride;  /* evaluation visits held[(i * stride) mod n_held] (see cplanrt.h) */
};

static uint64_t pow10u(int d) {
  uint64_t p = 1;
  while (d-- > 0) p *= 10;
  return p;
}

uint64_t rt_splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int rt_adder_held_out(int digits, uint64_t a, uint64_t b) {
  uint32_t key = (uint32_t)(a * pow10u(digits) + b); /* only the key mod 2^32 matters */
  return (uint32_t)(key * 2654435761u) % 10 == 0;
}

static uint64_t gcd_u64(uint64_t x, uint64_t y) {
  while (y) {
    uint64_t r = x % y;
    x = y, y = r;
  }
  return x;
}

/* The evaluation stride for H held-out problems: the least m >= max(1, floor(H * 618034 /
 * 10^6)) coprime with H.  Coprime makes i -> (i * m) mod H a permutation of [0, H), so one pass
 * of H samples sees every problem once; m near H / golden ratio spreads any run of consecutive
 * samples evenly over the key order (a short evaluation sees every a, not just the smallest). */
static uint64_t adder_eval_stride(uint64_t h) {
  uint64_t m = h * 618034u / 1000000u;
  if (m < 1) m = 1;
  while (gcd_u64(m, h) != 1) m++;
  return m;
}

static int adder_list_held(RtAdder *a, RtError *err) {
  uint64_t total = a->p10 * a->p10;
  a->held = malloc((size_t)(total / 5 + 1) * sizeof *a->held); /* about a tenth are held out */
  if (!a->held) return rt_errf(err, "adder: out of memory");
  for (uint64_t k = 0; k < total; k++)
    if (rt_adder_held_out(a->digits, k / a->p10, k % a->p10)) {
      if ((uint64_t)a->n_held >= total / 5 + 1)
        return rt_errf(err, "adder: held-out list overflow"); /* NEVER: the hash is near uniform */
      a->held[a->n_held++] = k;
    }
  a->stride = adder_eval_stride((uint64_t)a->n_held);
  return 0;
}

RtAdder *rt_adder_open(int digits, int64_t seed, RtError *err) {
  if (digits < 1 || digits > RT_ADDER_MAX_DIGITS) {
    rt_errf(err, "adder: digits = %d is out of range (1 to %d)", digits, RT_ADDER_MAX_DIGITS);
    return NULL;
  }
  RtAdder *a = calloc(1, sizeof *a);
  if (!a) { rt_errf(err, "adder: out of memory"); return NULL; }
  a->digits = digits;
  a->seed = (uint64_t)seed;
  a->p10 = pow10u(digits);
  if (digits <= ADDER_LIST_MAX_DIGITS && adder_list_held(a, err) < 0) {
    rt_adder_close(a);
    return NULL;
  }
  return a;
}

void rt_adder_close(RtAdder *a) {
  if (!a) return;
  free(a->held);
  free(a);
}

int rt_adder_digits(const RtAdder *a) { return a->digits; }

/* The counter-based draw of cplanrt.h: first attempt whose held-out status equals `want_held`. */
static void adder_draw(const RtAdder *a, uint64_t seed, int want_held, int64_t step, int64_t j,
                       uint64_t *pa, uint64_t *pb) {
  uint64_t base = rt_splitmix64(rt_splitmix64(rt_splitmix64(seed) ^ (uint64_t)step) ^ (uint64_t)j);
  for (uint64_t k = 0;; k++) {
    uint64_t r = rt_splitmix64(base ^ k);
    *pa = (r & 0xffffffffu) % a->p10;
    *pb = (r >> 32) % a->p10;
    if (rt_adder_held_out(a->digits, *pa, *pb) == want_held) return;
  }
}

void rt_adder_problem(const RtAdder *a, int eval, int64_t step, int64_t n, int64_t j,
                      uint64_t *pa, uint64_t *pb) {
  if (!eval) {
    adder_draw(a, a->seed, 0, step, j, pa, pb);
  } else if (a->held) {
    uint64_t h = (uint64_t)a->n_held, i = (uint64_t)(step * n + j) % h;
    uint64_t key = a->held[i * a->stride % h]; /* i, stride < h <= 2 * 10^5: no overflow */
    *pa = key / a->p10;
    *pb = key % a->p10;
  } else {
    adder_draw(a, ~a->seed, 1, step, j, pa, pb);
  }
}

/* Writes the d digits of v, most significant first. */
static int32_t *put_digits(int32_t *out, uint64_t v, int d) {
  for (int i = d - 1; i >= 0; i--, v /= 10) out[i] = (int32_t)(v % 10);
  return out + d;
}

int rt_adder_sequence(int digits, uint64_t a, uint64_t b, int64_t seq_len, int32_t *seq,
                      RtError *err) {
  int64_t need = 3 * (int64_t)digits + 3;
  if (seq_len < need)
    return rt_errf(err, "adder: the model's sequence length plus one is %lld, but digits = %d needs "
                   "at least 3d + 3 = %lld", (long long)seq_len, digits, (long long)need);
  int32_t *p = put_digits(seq, a, digits);
  *p++ = RT_ADD_PLUS;
  p = put_digits(p, b, digits);
  *p++ = RT_ADD_EQUALS;
  uint64_t c = a + b;
  for (int i = 0; i <= digits; i++, c /= 10) *p++ = (int32_t)(c % 10);
  while (p < seq + seq_len) *p++ = RT_ADD_END;
  return 0;
}

int rt_adder_batch(const RtAdder *a, int eval, int64_t n, int64_t seq, int64_t step, int64_t j0,
                   int64_t j1, int32_t *inputs, int32_t *targets, RtError *err) {
  if (check_range("adder", n, seq, step, j0, j1, err) < 0) return -1;
  int32_t *tmp = malloc((size_t)(seq + 1) * sizeof *tmp);
  if (!tmp) return rt_errf(err, "adder: out of memory");
  int64_t c0 = 2 * (int64_t)a->digits + 2, c1 = c0 + a->digits + 1; /* c's tokens in the sequence */
  int rc = 0;
  for (int64_t j = j0; j < j1 && rc == 0; j++) {
    uint64_t x, y;
    rt_adder_problem(a, eval, step, n, j, &x, &y);
    rc = rt_adder_sequence(a->digits, x, y, seq + 1, tmp, err);
    int32_t *in = inputs + (j - j0) * seq, *tg = targets + (j - j0) * seq;
    for (int64_t i = 0; rc == 0 && i < seq; i++) {
      in[i] = tmp[i];
      tg[i] = (i + 1 >= c0 && i + 1 < c1) ? tmp[i + 1] : -1;
    }
  }
  free(tmp);
  return rc;
}

/* ---- tensors(path) ----------------------------------------------------------------------------- */

struct RtTensorSource {
  RtStFile *file;
  int n;
  const RtStTensor **in; /* one per model input, in the caller's order */
  int64_t rows;
};

void rt_tsrc_close(RtTensorSource *s) {
  if (!s) return;
  rt_st_close(s->file);
  free(s->in);
  free(s);
}

static int tsrc_bind(RtTensorSource *s, const char *const *inputs, RtError *err) {
  const char *path = rt_st_path(s->file);
  for (int i = 0; i < s->n; i++) {
    const RtStTensor *t = rt_st_find(s->file, inputs[i]);
    if (!t) return rt_errf(err, "%s: no tensor named '%s' for the model input of that name", path, inputs[i]);
    if (t->dtype != RT_F32 && t->dtype != RT_I32)
      return rt_errf(err, "%s: tensor '%s' has dtype %s; the tensors data source reads F32 and I32",
                     path, inputs[i], rt_dtype_name(t->dtype));
    if (t->ndim < 1 || t->shape[0] < 1)
      return rt_errf(err, "%s: tensor '%s' has no samples (its first dim counts them)", path, inputs[i]);
    if (i > 0 && t->shape[0] != s->rows)
      return rt_errf(err, "%s: tensor '%s' has %lld samples but '%s' has %lld", path, inputs[i],
                     (long long)t->shape[0], inputs[0], (long long)s->rows);
    s->rows = t->shape[0];
    s->in[i] = t;
  }
  return 0;
}

RtTensorSource *rt_tsrc_open(const char *path, const char *const *inputs, int n_inputs,
                             RtError *err) {
  RtTensorSource *s = calloc(1, sizeof *s);
  if (!s || !(s->in = calloc((size_t)n_inputs + 1, sizeof *s->in))) {
    free(s);
    rt_errf(err, "%s: out of memory", path);
    return NULL;
  }
  s->n = n_inputs;
  s->file = rt_st_open(path, err);
  if (!s->file || tsrc_bind(s, inputs, err) < 0) {
    rt_tsrc_close(s);
    return NULL;
  }
  return s;
}

int64_t rt_tsrc_rows(const RtTensorSource *s) { return s->rows; }
const RtStTensor *rt_tsrc_input(const RtTensorSource *s, int i) { return i >= 0 && i < s->n ? s->in[i] : NULL; }

int rt_tsrc_batch(const RtTensorSource *s, int i, int64_t n, int64_t step, int64_t j0, int64_t j1,
                  void *out, RtError *err) {
  const char *path = rt_st_path(s->file);
  if (i < 0 || i >= s->n) return rt_errf(err, "%s: no input %d", path, i);
  if (check_range(path, n, 1, step, j0, j1, err) < 0) return -1;
  const RtStTensor *t = s->in[i];
  size_t row = rt_dtype_size(t->dtype) * (size_t)(rt_st_numel(t) / s->rows);
  for (int64_t j = j0; j < j1; j++) {
    int64_t r = (step * n + j) % s->rows;
    memcpy((char *)out + (size_t)(j - j0) * row, (const char *)t->data + (size_t)r * row, row);
  }
  return 0;
}

/* ---- writing token files (cplanc data) ------------------------------------------------------ */

static int write_tokens_body(FILE *fp, const uint16_t *tokens, int64_t n) {
  int32_t hdr[RT_TOKENS_HEADER_INTS] = {0};
  hdr[0] = RT_TOKENS_MAGIC;
  hdr[1] = RT_TOKENS_VERSION;
  hdr[2] = (int32_t)n;
  unsigned char le[4 * RT_TOKENS_HEADER_INTS];
  for (int i = 0; i < RT_TOKENS_HEADER_INTS; i++)
    for (int b = 0; b < 4; b++) le[4 * i + b] = (unsigned char)((uint32_t)hdr[i] >> (8 * b));
  if (fwrite(le, 1, sizeof le, fp) != sizeof le) return -1;
  for (int64_t i = 0; i < n; i++) {
    unsigned char t[2] = {(unsigned char)(tokens[i] & 0xff), (unsigned char)(tokens[i] >> 8)};
    if (fwrite(t, 1, 2, fp) != 2) return -1;
  }
  return fflush(fp);
}

typedef struct TokBody {
  const uint16_t *tokens;
  int64_t n;
} TokBody;

static int tok_body(FILE *fp, const void *ctx) {
  const TokBody *b = ctx;
  return write_tokens_body(fp, b->tokens, b->n);
}

int rt_tokens_write(const char *path, const uint16_t *tokens, int64_t n, RtError *err) {
  if (n < 0 || n > INT32_MAX) return rt_errf(err, "%s: %lld tokens do not fit the header's int32 count", path, (long long)n);
  TokBody b = {tokens, n};
  return rt_write_replace(path, tok_body, &b, err);
}
