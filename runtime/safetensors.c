/* safetensors.c: reading and writing safetensors files (checkpoints and the tensors data source).
 *
 * Format: an 8-byte little-endian header length H, H bytes of JSON
 *   {"__metadata__": {k: v, ...}, name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
 * then the data; offsets are relative to the end of the header.  Reading loads the whole file and
 * validates everything before handing out a tensor, so later code can trust sizes and offsets.
 * Writing goes through PATH.tmp and rename() so a crash never leaves half a checkpoint. */
#include "cplanrt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- errors ---------------------------------------------------------------------------------- */

int rt_errf(RtError *err, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* ---- dtypes ---------------------------------------------------------------------------------- */

/* Checklist: in the order of RtDtype. */
static const struct { const char *name; size_t size; } dtypes[RT_DTYPE_COUNT] = {
  {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
  {"I16", 2}, {"I8", 1},  {"U8", 1},  {"U16", 2},  {"BOOL", 1},
};

const char *rt_dtype_name(RtDtype d) { return (unsigned)d < RT_DTYPE_COUNT ? dtypes[d].name : "?"; }
size_t rt_dtype_size(RtDtype d) { return (unsigned)d < RT_DTYPE_COUNT ? dtypes[d].size : 0; }

static int dtype_from_name(const char *s) {
  for (int i = 0; i < RT_DTYPE_COUNT; i++)
    if (strcmp(dtypes[i].name, s) == 0) return i;
  return -1;
}

int64_t rt_st_numel(const RtStTensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

/* Byte size of a tensor, or -1 when it does not fit in 2^53 (the exact range of JSON numbers). */
static int64_t byte_size(RtDtype dtype, int ndim, const int64_t *shape) {
  const int64_t lim = (int64_t)1 << 53;
  int64_t n = (int64_t)rt_dtype_size(dtype);
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] != 0 && n > lim / shape[i]) return -1;
    n *= shape[i];
  }
  return n;
}

/* ---- writing --------------------------------------------------------------------------------- */

static cJSON *tensor_json(const RtStTensor *t, int64_t begin, int64_t end) {
  cJSON *o = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
  cJSON_AddStringToObject(o, "dtype", rt_dtype_name(t->dtype));
  for (int i = 0; i < t->ndim; i++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[i]));
  cJSON_AddItemToObject(o, "shape", shape);
  cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)begin));
  cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)end));
  cJSON_AddItemToObject(o, "data_offsets", offs);
  return o;
}

static int check_write_tensor(const char *path, const RtStTensor *ts, int i, RtError *err) {
  const RtStTensor *t = &ts[i];
  if (!t->name || !t->name[0] || strcmp(t->name, "__metadata__") == 0)
    return rt_errf(err, "%s: tensor %d has an invalid name '%s'", path, i, t->name ? t->name : "");
  if ((unsigned)t->dtype >= RT_DTYPE_COUNT || t->ndim < 0 || t->ndim > RT_ST_MAX_DIMS)
    return rt_errf(err, "%s: tensor '%s' has a bad dtype or rank", path, t->name);
  if (byte_size(t->dtype, t->ndim, t->shape) < 0)
    return rt_errf(err, "%s: tensor '%s' has a negative or too large shape", path, t->name);
  for (int k = 0; k < i; k++)
    if (strcmp(ts[k].name, t->name) == 0)
      return rt_errf(err, "%s: two tensors are named '%s'", path, t->name);
  return 0;
}

/* The order the data is laid out in: by element size, largest first (stable), so that every
 * tensor's data is aligned to its element size, as the safetensors library does. */
static void data_order(const RtStTensor *ts, int n, int *order) {
  for (int i = 0; i < n; i++) {
    int k = i;
    for (; k > 0 && rt_dtype_size(ts[order[k - 1]].dtype) < rt_dtype_size(ts[i].dtype); k--)
      order[k] = order[k - 1];
    order[k] = i;
  }
}

/* Builds the header text, padded with spaces to a multiple of 8 so the data is aligned.
 * Tensors are listed in the caller's order; their data follows `order`. */
static char *build_header(const char *path, const RtStTensor *ts, int n, const int *order,
                          const char *const *keys, const char *const *vals, int n_meta,
                          size_t *len, RtError *err) {
  int64_t *begin = malloc((size_t)n * sizeof *begin + 1), off = 0;
  if (!begin) { rt_errf(err, "%s: out of memory", path); return NULL; }
  for (int k = 0; k < n; k++) {
    begin[order[k]] = off;
    off += byte_size(ts[order[k]].dtype, ts[order[k]].ndim, ts[order[k]].shape);
  }
  cJSON *root = cJSON_CreateObject();
  if (n_meta > 0) {
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    for (int i = 0; i < n_meta; i++) cJSON_AddStringToObject(meta, keys[i], vals[i]);
  }
  for (int i = 0; i < n; i++)
    cJSON_AddItemToObject(root, ts[i].name, tensor_json(&ts[i], begin[i],
                          begin[i] + byte_size(ts[i].dtype, ts[i].ndim, ts[i].shape)));
  free(begin);
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!text) { rt_errf(err, "%s: out of memory building the header", path); return NULL; }
  size_t l = strlen(text), padded = (l + 7) / 8 * 8;
  char *out = realloc(text, padded + 1);
  if (!out) { free(text); rt_errf(err, "%s: out of memory", path); return NULL; }
  memset(out + l, ' ', padded - l);
  out[padded] = 0;
  *len = padded;
  return out;
}

static int write_all(FILE *fp, const void *p, size_t n) { return fwrite(p, 1, n, fp) == n ? 0 : -1; }

static int write_body(FILE *fp, const char *hdr, size_t hlen, const RtStTensor *ts, int n,
                      const int *order) {
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  if (write_all(fp, le, 8) < 0 || write_all(fp, hdr, hlen) < 0) return -1;
  for (int k = 0; k < n; k++) {
    const RtStTensor *t = &ts[order[k]];
    if (write_all(fp, t->data, (size_t)byte_size(t->dtype, t->ndim, t->shape)) < 0) return -1;
  }
  if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) return -1;
  return 0;
}

int rt_write_replace(const char *path, int (*body)(FILE *fp, const void *ctx), const void *ctx, RtError *err) {
  struct stat st;
  char *target = NULL;
  if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode) && stat(path, &st) == 0) target = realpath(path, NULL);
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return rt_errf(err, "%s: exists and is not a regular file (a directory, device or FIFO): not replaced", path);
  const char *to = target ? target : path;
  size_t len = strlen(to);
  char *tmp = malloc(len + 5);
  int rc = tmp ? 0 : rt_errf(err, "%s: out of memory", path);
  FILE *fp = NULL;
  if (rc == 0) {
    memcpy(tmp, to, len);
    memcpy(tmp + len, ".tmp", 5);
    fp = fopen(tmp, "wb");
    if (!fp) rc = rt_errf(err, "%s: cannot create: %s", tmp, strerror(errno));
  }
  if (fp) {
    int bad = body(fp, ctx), e = errno;
    if (fclose(fp) != 0 && !bad) bad = -1, e = errno;
    if (bad) rc = rt_errf(err, "%s: write failed: %s", tmp, strerror(e));
    else if (rename(tmp, to) != 0) rc = rt_errf(err, "%s: cannot rename %s to it: %s", to, tmp, strerror(errno));
    if (rc) remove(tmp);
  }
  free(tmp);
  free(target);
  return rc;
}

typedef struct StBody {
  const char *hdr;
  size_t hlen;
  const RtStTensor *ts;
  int n;
  const int *order;
} StBody;

static int st_body(FILE *fp, const void *ctx) {
  const StBody *b = ctx;
  return write_body(fp, b->hdr, b->hlen, b->ts, b->n, b->order);
}

int rt_st_write(const char *path, const RtStTensor *tensors, int n, const char *const *meta_keys,
                const char *const *meta_values, int n_meta, RtError *err) {
  for (int i = 0; i < n; i++)
    if (check_write_tensor(path, tensors, i, err) < 0) return -1;
  size_t hlen = 0;
  int *order = malloc((size_t)n * sizeof *order + 1);
  char *hdr = NULL;
  int rc = order ? 0 : rt_errf(err, "%s: out of memory", path);
  if (rc == 0) {
    data_order(tensors, n, order);
    hdr = build_header(path, tensors, n, order, meta_keys, meta_values, n_meta, &hlen, err);
    StBody b = {hdr, hlen, tensors, n, order};
    rc = hdr ? rt_write_replace(path, st_body, &b, err) : -1;
  }
  free(hdr);
  free(order);
  return rc;
}

/* ---- reading --------------------------------------------------------------------------------- */

struct RtStFile {
  char *path;
  unsigned char *buf;   /* the whole file */
  int n;
  RtStTensor *t;        /* names point into `names` */
  char **names;
  int n_meta;
  char **meta;          /* key, value, key, value, ... */
};

void rt_st_close(RtStFile *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) free(f->names[i]);
  for (int i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
  free(f->names);
  free(f->meta);
  free(f->t);
  free(f->buf);
  free(f->path);
  free(f);
}

FILE *rt_open_regular(const char *path, RtError *err) {
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) { /* before fopen: a FIFO's blocks */
    rt_errf(err, "%s: not a regular file", path);
    return NULL;
  }
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    rt_errf(err, "%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(fp);
    rt_errf(err, "%s: not a regular file", path);
    return NULL;
  }
  return fp;
}

/* Reads a whole file; the error names the path. */
static unsigned char *slurp(const char *path, size_t *size, RtError *err) {
  FILE *fp = rt_open_regular(path, err);
  if (!fp) return NULL;
  long sz = -1;
  if (fseek(fp, 0, SEEK_END) == 0) sz = ftell(fp);
  if (sz < 0 || fseek(fp, 0, SEEK_SET) != 0) {
    fclose(fp);
    rt_errf(err, "%s: cannot read: not a regular file", path);
    return NULL;
  }
  unsigned char *buf = malloc((size_t)sz + 1);
  if (!buf) { fclose(fp); rt_errf(err, "%s: out of memory (%ld bytes)", path, sz); return NULL; }
  if (fread(buf, 1, (size_t)sz, fp) != (size_t)sz) {
    fclose(fp);
    free(buf);
    rt_errf(err, "%s: read failed: %s", path, strerror(errno));
    return NULL;
  }
  fclose(fp);
  *size = (size_t)sz;
  return buf;
}

/* A JSON number that is an integer in [0, 2^53], else -1. */
static int64_t json_index(const cJSON *j) {
  if (!cJSON_IsNumber(j)) return -1;
  double d = j->valuedouble;
  if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(int64_t)d) return -1;
  return (int64_t)d;
}

static int parse_meta(RtStFile *f, const cJSON *m, RtError *err) {
  if (!cJSON_IsObject(m)) return rt_errf(err, "%s: __metadata__ is not an object", f->path);
  if (f->meta) return rt_errf(err, "%s: __metadata__ appears twice", f->path);
  int n = cJSON_GetArraySize(m);
  f->meta = calloc((size_t)(2 * n + 1), sizeof *f->meta);
  if (!f->meta) return rt_errf(err, "%s: out of memory", f->path);
  for (const cJSON *kv = m->child; kv; kv = kv->next) {
    if (!cJSON_IsString(kv))
      return rt_errf(err, "%s: __metadata__ value '%s' is not a string", f->path, kv->string);
    f->meta[2 * f->n_meta] = strdup(kv->string);
    f->meta[2 * f->n_meta + 1] = strdup(kv->valuestring);
    f->n_meta++;
    if (!f->meta[2 * f->n_meta - 2] || !f->meta[2 * f->n_meta - 1])
      return rt_errf(err, "%s: out of memory", f->path);
  }
  return 0;
}

static int parse_shape(RtStFile *f, const char *name, const cJSON *shape, RtStTensor *t,
                       RtError *err) {
  if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > RT_ST_MAX_DIMS)
    return rt_errf(err, "%s: tensor '%s': shape is not an array of at most %d dims", f->path, name,
                   RT_ST_MAX_DIMS);
  t->ndim = 0;
  for (const cJSON *d = shape->child; d; d = d->next) {
    int64_t v = json_index(d);
    if (v < 0) return rt_errf(err, "%s: tensor '%s': shape has a non-integer or negative dim", f->path, name);
    t->shape[t->ndim++] = v;
  }
  return 0;
}

/* Validates one tensor entry; begin/end are the byte offsets within the data section. */
static int parse_tensor(RtStFile *f, const cJSON *e, RtStTensor *t, int64_t *begin,
                        int64_t *end, int64_t data_len, RtError *err) {
  const char *name = e->string;
  if (!cJSON_IsObject(e)) return rt_errf(err, "%s: tensor '%s' is not an object", f->path, name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  if (!cJSON_IsString(dt)) return rt_errf(err, "%s: tensor '%s' has no dtype", f->path, name);
  int d = dtype_from_name(dt->valuestring);
  if (d < 0) return rt_errf(err, "%s: tensor '%s' has unknown dtype '%s'", f->path, name, dt->valuestring);
  t->dtype = (RtDtype)d;
  if (parse_shape(f, name, cJSON_GetObjectItemCaseSensitive(e, "shape"), t, err) < 0) return -1;
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
      (*begin = json_index(offs->child)) < 0 || (*end = json_index(offs->child->next)) < 0)
    return rt_errf(err, "%s: tensor '%s': data_offsets is not [begin, end]", f->path, name);
  if (*begin > *end || *end > data_len)
    return rt_errf(err, "%s: tensor '%s': data_offsets [%lld, %lld] outside the data (%lld bytes)",
                   f->path, name, (long long)*begin, (long long)*end, (long long)data_len);
  int64_t want = byte_size(t->dtype, t->ndim, t->shape);
  if (want != *end - *begin)
    return rt_errf(err, "%s: tensor '%s': %lld bytes at data_offsets but dtype %s x shape needs %lld",
                   f->path, name, (long long)(*end - *begin), dt->valuestring, (long long)want);
  return 0;
}

/* Sorting helpers for the overlap and duplicate checks. */
typedef struct { int64_t begin, end; int idx; } Span;
static int span_cmp(const void *a, const void *b) {
  const Span *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}
static int name_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int check_layout(RtStFile *f, Span *sp, RtError *err) {
  qsort(sp, (size_t)f->n, sizeof *sp, span_cmp);
  for (int i = 1; i < f->n; i++)
    if (sp[i].begin < sp[i - 1].end)
      return rt_errf(err, "%s: tensors '%s' and '%s' overlap in the data", f->path,
                     f->names[sp[i - 1].idx], f->names[sp[i].idx]);
  char **sorted = malloc((size_t)f->n * sizeof *sorted + 1);
  if (!sorted) return rt_errf(err, "%s: out of memory", f->path);
  memcpy(sorted, f->names, (size_t)f->n * sizeof *sorted);
  qsort(sorted, (size_t)f->n, sizeof *sorted, name_cmp);
  int rc = 0;
  for (int i = 1; i < f->n && rc == 0; i++)
    if (strcmp(sorted[i], sorted[i - 1]) == 0)
      rc = rt_errf(err, "%s: two tensors are named '%s'", f->path, sorted[i]);
  free(sorted);
  return rc;
}

static int parse_entries(RtStFile *f, const cJSON *root, const unsigned char *data,
                         int64_t data_len, RtError *err) {
  int cap = cJSON_GetArraySize(root);
  f->t = calloc((size_t)cap + 1, sizeof *f->t);
  f->names = calloc((size_t)cap + 1, sizeof *f->names);
  Span *sp = calloc((size_t)cap + 1, sizeof *sp);
  int rc = (f->t && f->names && sp) ? 0 : rt_errf(err, "%s: out of memory", f->path);
  for (const cJSON *e = root->child; e && rc == 0; e = e->next) {
    if (strcmp(e->string, "__metadata__") == 0) { rc = parse_meta(f, e, err); continue; }
    RtStTensor *t = &f->t[f->n];
    rc = parse_tensor(f, e, t, &sp[f->n].begin, &sp[f->n].end, data_len, err);
    if (rc == 0 && !(f->names[f->n] = strdup(e->string)))
      rc = rt_errf(err, "%s: out of memory", f->path);
    if (rc == 0) {
      t->name = f->names[f->n];
      t->data = (void *)(data + sp[f->n].begin);
      sp[f->n].idx = f->n;
      f->n++;
    }
  }
  if (rc == 0) rc = check_layout(f, sp, err);
  free(sp);
  return rc;
}

static int parse_file(RtStFile *f, size_t size, RtError *err) {
  if (size < 8)
    return rt_errf(err, "%s: %zu bytes is too short for a safetensors file (need the 8-byte header length)",
                   f->path, size);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | f->buf[i];
  if (hlen < 2 || hlen > RT_ST_MAX_HEADER || hlen > size - 8)
    return rt_errf(err, "%s: header length %llu is not possible in a file of %zu bytes: not a safetensors file",
                   f->path, (unsigned long long)hlen, size);
  cJSON *root = cJSON_ParseWithLength((const char *)f->buf + 8, (size_t)hlen);
  int rc;
  if (!root || !cJSON_IsObject(root))
    rc = rt_errf(err, "%s: the %llu-byte header is not a JSON object", f->path, (unsigned long long)hlen);
  else
    rc = parse_entries(f, root, f->buf + 8 + hlen, (int64_t)(size - 8 - hlen), err);
  cJSON_Delete(root);
  return rc;
}

RtStFile *rt_st_open(const char *path, RtError *err) {
  RtStFile *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path))) {
    free(f);
    rt_errf(err, "%s: out of memory", path);
    return NULL;
  }
  size_t size = 0;
  f->buf = slurp(path, &size, err);
  if (!f->buf || parse_file(f, size, err) < 0) { rt_st_close(f); return NULL; }
  return f;
}

const char *rt_st_path(const RtStFile *f) { return f->path; }
int rt_st_count(const RtStFile *f) { return f->n; }
const RtStTensor *rt_st_tensor(const RtStFile *f, int i) { return i >= 0 && i < f->n ? &f->t[i] : NULL; }

const RtStTensor *rt_st_find(const RtStFile *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
  return NULL;
}

const char *rt_st_meta(const RtStFile *f, const char *key) {
  for (int i = 0; i < f->n_meta; i++)
    if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
  return NULL;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t at = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndim && at < n; i++)
    at += (size_t)snprintf(buf + at, n - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (at < n) snprintf(buf + at, n - at, "]");
}

int rt_st_read(const RtStFile *f, const char *name, RtDtype dtype, int ndim, const int64_t *shape,
               void *dst, RtError *err) {
  const RtStTensor *t = rt_st_find(f, name);
  if (!t) return rt_errf(err, "%s: no tensor named '%s'", f->path, name);
  if (t->dtype != dtype)
    return rt_errf(err, "%s: tensor '%s' has dtype %s, expected %s", f->path, name,
                   rt_dtype_name(t->dtype), rt_dtype_name(dtype));
  int same = t->ndim == ndim;
  for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
  if (!same) {
    char got[128], want[128];
    shape_str(got, sizeof got, t->ndim, t->shape);
    shape_str(want, sizeof want, ndim, shape);
    return rt_errf(err, "%s: tensor '%s' has shape %s, expected %s", f->path, name, got, want);
  }
  memcpy(dst, t->data, (size_t)byte_size(t->dtype, t->ndim, t->shape));
  return 0;
}
