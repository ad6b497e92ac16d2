/* checkpoint.c: params files (--init, --save-init, --save) and training checkpoints.
 *
 * A checkpoint is DIR/step_000500/ with model.safetensors, optimizer.safetensors and state.json
 *   {"format": "cplan-ckpt/1", "model", "step", "seed", "plan_hash", "loss", "data_offset", "data_tokens"}
 * (see cplanrt.h).  It is built in DIR/step_000500.tmp/ and renamed, so a directory without the
 * .tmp suffix is complete; a crash leaves at most a .tmp directory, which the next save of that
 * step replaces and rt_ckpt_find ignores.  Resume is exact because everything else a step
 * depends on (data order, dropout masks, the schedule) is a function of the step number. */
#include "cplanrt.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_FORMAT "cplan-ckpt/1"
#define PATH_MAX_LEN 4096

/* ---- params files -------------------------------------------------------------------------- */

/* Metadata "format": "pt" is what safetensors.torch.save_file writes; Hugging Face loaders
 * check it. */
static const char *const meta_keys[] = {"format"};
static const char *const meta_values[] = {"pt"};

/* ---- tensors the compiler padded for tp (RtPlanParam.pad_*): files hold them unpadded ------------ */

/* The padded dim of a param of `rank` dims `shape` (the one of size pad_len with pad_inner elements
 * after it), or -1. */
static int padded_dim(int rank, const int64_t *shape, int64_t pad_len, int64_t pad_inner) {
  int64_t inner = 1;
  for (int d = rank - 1; d >= 0 && pad_len > 0; d--) {
    if (shape[d] == pad_len && inner == pad_inner) return d;
    inner *= shape[d];
  }
  return -1;
}

/* The unpadded elements of padded x (numel of them) of tensor `name`, in a malloc'ed buffer; NULL
 * after an error. The pad is zero throughout training (its gradient is exactly zero): a nonzero pad
 * element would make LAMB's and LARS's norms differ from one device's, so it is a cplan bug. */
static float *unpad(const float *x, int64_t numel, int64_t len, int64_t valid, int64_t inner, const char *path,
                    const char *name, RtError *err) {
  float *out = malloc((size_t)(numel / len * valid) * sizeof *out + 1);
  if (!out) {
    rt_errf(err, "%s: out of memory", path);
    return NULL;
  }
  for (int64_t k = 0; k < numel; k++) {
    int64_t u = rt_unpadded_index(k, len, valid, inner);
    if (u >= 0) out[u] = x[k];
    else if (x[k] != 0.0f) {
      rt_errf(err, "%s: element %lld of '%s', in the padding the compiler added for tp, is %g, not 0 (a bug in "
              "cplan: please report it)", path, (long long)k, name, (double)x[k]);
      free(out);
      return NULL;
    }
  }
  return out;
}

/* x (numel, padded) from its unpadded elements u, zeros in the pad */
static void repad(float *x, const float *u, int64_t numel, int64_t len, int64_t valid, int64_t inner) {
  for (int64_t k = numel - 1; k >= 0; k--) { /* from the end: u may be x itself, a prefix of it */
    int64_t i = rt_unpadded_index(k, len, valid, inner);
    x[k] = i >= 0 ? u[i] : 0.0f;
  }
}

int rt_params_save(const RtRun *run, const char *path, RtError *err) {
  const RtPlan *p = run->plan;
  RtStTensor *ts = calloc((size_t)p->nparams + 1, sizeof *ts);
  float **own = calloc((size_t)p->nparams + 1, sizeof *own);
  int rc = ts && own ? 0 : rt_errf(err, "%s: out of memory", path);
  for (int i = 0; i < p->nparams && rc == 0; i++) {
    const RtPlanParam *pp = &p->params[i];
    ts[i].name = pp->name;
    ts[i].dtype = RT_F32;
    ts[i].ndim = pp->rank;
    memcpy(ts[i].shape, pp->shape, sizeof ts[i].shape);
    ts[i].data = run->params + pp->offset;
    int d = padded_dim(pp->rank, pp->shape, pp->pad_len, pp->pad_inner);
    if (d >= 0) { /* the unpadded tensor */
      ts[i].shape[d] = pp->pad_valid;
      if (!(own[i] = unpad(ts[i].data, pp->numel, pp->pad_len, pp->pad_valid, pp->pad_inner, path, pp->name, err)))
        rc = -1;
      ts[i].data = own[i];
    }
  }
  if (rc == 0) rc = rt_st_write(path, ts, p->nparams, meta_keys, meta_values, 1, err);
  for (int i = 0; own && i < p->nparams; i++) free(own[i]);
  free(own);
  free(ts);
  return rc;
}

int rt_params_load(RtRun *run, const char *path, RtError *err) {
  const RtPlan *p = run->plan;
  RtStFile *f = rt_st_open(path, err);
  if (!f) return -1;
  int rc = 0;
  for (int i = 0; i < p->nparams && rc == 0; i++) {
    const RtPlanParam *pp = &p->params[i];
    int64_t shape[RT_ST_MAX_DIMS];
    memcpy(shape, pp->shape, sizeof shape);
    int d = padded_dim(pp->rank, pp->shape, pp->pad_len, pp->pad_inner);
    if (d >= 0) shape[d] = pp->pad_valid; /* the file's unpadded tensor (rt_params_save), read into a prefix */
    rc = rt_st_read(f, pp->name, RT_F32, pp->rank, shape, run->params + pp->offset, err);
    float *x = run->params + pp->offset;
    if (rc == 0 && d >= 0) repad(x, x, pp->numel, pp->pad_len, pp->pad_valid, pp->pad_inner);
    for (int64_t k = 0; rc == 0 && k < pp->numel; k++) /* training from it would only say the loss is NaN */
      if (!isfinite(run->params[pp->offset + k]))
        rc = rt_errf(err, "%s: tensor '%s' holds %g at element %lld", path, pp->name, (double)run->params[pp->offset + k],
                     (long long)k);
  }
  rt_st_close(f);
  return rc;
}

/* buf = a + b, or an error when that does not fit in PATH_MAX_LEN. */
static int join(char *buf, const char *a, const char *b, RtError *err) {
  if (snprintf(buf, PATH_MAX_LEN, "%s%s", a, b) >= PATH_MAX_LEN)
    return rt_errf(err, "%s%s: path too long", a, b);
  return 0;
}

/* ---- directories ----------------------------------------------------------------------------- */

int rt_make_dirs(const char *dir, RtError *err) {
  char buf[PATH_MAX_LEN];
  if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
    return rt_errf(err, "%s: path too long", dir);
  for (char *s = buf + 1;; s++) {
    int end = *s == '\0';
    if (*s == '/' || end) {
      *s = '\0';
      if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return rt_errf(err, "%s: cannot create directory: %s", buf, strerror(errno));
      if (end) break;
      *s = '/';
    }
  }
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return rt_errf(err, "%s: not a directory", dir);
  return 0;
}

const char *rt_cache_dir(const char *env, const char *kind, const char *sub, char *buf, size_t len, RtError *err) {
  const char *e = getenv(env), *home = getenv("HOME");
  int n;
  if (e && *e) n = snprintf(buf, len, "%s%s", e, sub);
  else if (home && *home) n = snprintf(buf, len, "%s/.cache/cplan/%s%s", home, kind, sub);
  else {
    rt_errf(err, "no %s cache directory: neither %s nor HOME is set", kind, env);
    return NULL;
  }
  if (n < 0 || (size_t)n >= len) {
    rt_errf(err, "the %s cache directory's path is too long", kind);
    return NULL;
  }
  return rt_make_dirs(buf, err) == 0 ? buf : NULL;
}

/* Removes a checkpoint directory: it only ever holds plain files, so one level suffices. */
static int remove_dir(const char *dir, RtError *err) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : rt_errf(err, "%s: %s", dir, strerror(errno));
  struct dirent *e;
  char path[PATH_MAX_LEN];
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  if (rmdir(dir) != 0) return rt_errf(err, "%s: cannot remove: %s", dir, strerror(errno));
  return 0;
}

/* Makes a rename inside dir durable (best effort: some file systems refuse to sync a dir). */
static void sync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

/* The step of a checkpoint directory name as rt_ckpt_save writes it ("step_%06lld"), or -1 (another
 * name: not one of ours). */
static int64_t ckpt_step_of(const char *name) {
  if (strncmp(name, "step_", 5) != 0 || name[5] == '\0' || strlen(name) > 5 + 18) return -1;
  for (const char *s = name + 5; *s; s++)
    if (*s < '0' || *s > '9') return -1;
  int64_t step = strtoll(name + 5, NULL, 10);
  char canon[32];
  snprintf(canon, sizeof canon, "step_%06lld", (long long)step);
  return strcmp(canon, name) == 0 ? step : -1;
}

/* a JSON number that is a whole number in [lo, 2^53] */
static bool whole_in(const cJSON *x, double lo) {
  return cJSON_IsNumber(x) && x->valuedouble >= lo && x->valuedouble <= 9007199254740992.0 &&
         x->valuedouble == floor(x->valuedouble);
}

static int is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The steps of the complete checkpoints in dir, newest first, in a malloc'ed array; the newest step
 * directory without a state.json to *incomplete (-1: none; NULL: not wanted). */
static int list_ckpts(const char *dir, int64_t **steps, int *n, int64_t *incomplete, RtError *err) {
  *steps = NULL;
  *n = 0;
  if (incomplete) *incomplete = -1;
  DIR *d = opendir(dir);
  if (!d) return rt_errf(err, "%s: cannot open checkpoint directory: %s", dir, strerror(errno));
  int cap = 0;
  struct dirent *e;
  char path[PATH_MAX_LEN];
  while ((e = readdir(d)) != NULL) {
    int64_t s = ckpt_step_of(e->d_name);
    snprintf(path, sizeof path, "%s/%s/state.json", dir, e->d_name);
    if (s < 0) continue;
    if (!is_file(path)) {
      if (incomplete && s > *incomplete) *incomplete = s;
      continue;
    }
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      int64_t *grown = realloc(*steps, (size_t)cap * sizeof **steps);
      if (!grown) { closedir(d); return rt_errf(err, "%s: out of memory", dir); }
      *steps = grown;
    }
    (*steps)[(*n)++] = s;
  }
  closedir(d);
  for (int i = 1; i < *n; i++) /* insertion sort, newest first: there are few */
    for (int j = i; j > 0 && (*steps)[j] > (*steps)[j - 1]; j--) {
      int64_t t = (*steps)[j];
      (*steps)[j] = (*steps)[j - 1];
      (*steps)[j - 1] = t;
    }
  return 0;
}

/* ---- state.json ------------------------------------------------------------------------------ */

static int write_state(const char *path, const RtPlan *p, const RtCkptInfo *info, RtError *err) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "format", CKPT_FORMAT);
  cJSON_AddStringToObject(j, "model", p->model ? p->model : "");
  cJSON_AddNumberToObject(j, "step", (double)info->step);
  cJSON_AddNumberToObject(j, "seed", (double)info->seed);
  cJSON_AddStringToObject(j, "plan_hash", info->plan_hash);
  if (isfinite(info->loss)) cJSON_AddNumberToObject(j, "loss", info->loss);
  else cJSON_AddNullToObject(j, "loss");
  cJSON_AddNumberToObject(j, "data_offset", (double)info->data_offset);
  if (info->data_tokens >= 0) cJSON_AddNumberToObject(j, "data_tokens", (double)info->data_tokens);
  if (info->scaler[0] > 0) {
    cJSON_AddNumberToObject(j, "loss_scale", info->scaler[0]);
    cJSON_AddNumberToObject(j, "loss_scale_good_steps", info->scaler[1]);
    cJSON_AddNumberToObject(j, "skipped_steps", info->scaler[2]);
  }
  char *text = cJSON_Print(j);
  cJSON_Delete(j);
  if (!text) return rt_errf(err, "%s: out of memory", path);
  FILE *fp = fopen(path, "w");
  int ok = fp && fputs(text, fp) >= 0 && fputc('\n', fp) != EOF && fflush(fp) == 0 &&
           fsync(fileno(fp)) == 0;
  if (fp && fclose(fp) != 0) ok = 0;
  free(text);
  return ok ? 0 : rt_errf(err, "%s: cannot write: %s", path, strerror(errno));
}

static char *read_text(const char *path, RtError *err) {
  FILE *fp = rt_open_regular(path, err);
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *buf = n >= 0 && n < (1 << 20) ? malloc((size_t)n + 1) : NULL;
  if (!buf || fread(buf, 1, (size_t)n, fp) != (size_t)n) {
    rt_errf(err, "%s: cannot read", path);
    free(buf);
    buf = NULL;
  } else {
    buf[n] = '\0';
  }
  fclose(fp);
  return buf;
}

static int read_state(const char *path, RtCkptInfo *info, RtError *err) {
  char *text = read_text(path, err);
  if (!text) return -1;
  cJSON *j = cJSON_Parse(text);
  free(text);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
  const cJSON *step = cJSON_GetObjectItemCaseSensitive(j, "step");
  const cJSON *seed = cJSON_GetObjectItemCaseSensitive(j, "seed");
  const cJSON *hash = cJSON_GetObjectItemCaseSensitive(j, "plan_hash");
  const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(j, "data_offset");
  const cJSON *ntok = cJSON_GetObjectItemCaseSensitive(j, "data_tokens");
  const cJSON *ls[3] = {cJSON_GetObjectItemCaseSensitive(j, "loss_scale"),
                        cJSON_GetObjectItemCaseSensitive(j, "loss_scale_good_steps"),
                        cJSON_GetObjectItemCaseSensitive(j, "skipped_steps")};
  int rc = 0;
  if (!j || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, CKPT_FORMAT) != 0 ||
      !cJSON_IsNumber(step) || !cJSON_IsNumber(seed) || !cJSON_IsString(hash)) {
    rc = rt_errf(err, "%s: not a %s state file (needs format, step, seed, plan_hash)", path,
                 CKPT_FORMAT);
  } else if (!whole_in(step, 0) || !whole_in(seed, -9007199254740992.0) || (off && !whole_in(off, -1))) {
    rc = rt_errf(err, "%s: step, seed and data_offset must be whole numbers (step and data_offset not negative), "
                 "got step %.17g, seed %.17g, data_offset %.17g", path, step->valuedouble, seed->valuedouble,
                 off && cJSON_IsNumber(off) ? off->valuedouble : -1.0);
  } else {
    info->step = (int64_t)step->valuedouble;
    info->seed = (int64_t)seed->valuedouble;
    info->loss = cJSON_IsNumber(loss) ? loss->valuedouble : NAN;
    info->data_offset = cJSON_IsNumber(off) ? (int64_t)off->valuedouble : -1;
    info->data_tokens = whole_in(ntok, 0) ? (int64_t)ntok->valuedouble : -1; /* older checkpoints: unknown */
    snprintf(info->plan_hash, sizeof info->plan_hash, "%s", hash->valuestring);
    for (int k = 0; k < 3; k++) info->scaler[k] = cJSON_IsNumber(ls[k]) ? ls[k]->valuedouble : 0;
    if (info->scaler[0] < 0 || !isfinite(info->scaler[0]))
      rc = rt_errf(err, "%s: loss_scale must be a positive number", path);
  }
  cJSON_Delete(j);
  return rc;
}

/* ---- checkpoints ----------------------------------------------------------------------------- */

static int write_states(const RtRun *run, const char *path, RtError *err) {
  const RtPlan *p = run->plan;
  RtStTensor *ts = calloc((size_t)p->nstates + 1, sizeof *ts);
  float **own = calloc((size_t)p->nstates + 1, sizeof *own);
  int n = 0, rc = ts && own ? 0 : rt_errf(err, "%s: out of memory", path);
  for (int i = 0; i < p->nstates && rc == 0; i++) {
    const RtPlanState *s = &p->states[i];
    if (!s->saved) continue;
    ts[n] = (RtStTensor){.name = s->name, .dtype = RT_F32, .ndim = 1, .shape = {s->numel}, .data = run->state + s->offset};
    if (s->pad_len > 0) { /* a padded param's: unpadded, as the param */
      ts[n].shape[0] = s->numel / s->pad_len * s->pad_valid;
      if (!(own[n] = unpad(ts[n].data, s->numel, s->pad_len, s->pad_valid, s->pad_inner, path, s->name, err)))
        rc = -1;
      ts[n].data = own[n];
    }
    n++;
  }
  if (rc == 0) rc = rt_st_write(path, ts, n, meta_keys, meta_values, 1, err);
  for (int i = 0; own && i < n; i++) free(own[i]);
  free(own);
  free(ts);
  return rc;
}

int rt_ckpt_save(const RtRun *run, const char *dir, const RtCkptInfo *info, char *out,
                 size_t nout, RtError *err) {
  char tmp[PATH_MAX_LEN], fin[PATH_MAX_LEN], file[PATH_MAX_LEN], name[64];
  if (rt_make_dirs(dir, err) != 0) return -1;
  snprintf(name, sizeof name, "/step_%06lld", (long long)info->step);
  if (join(fin, dir, name, err) != 0 || join(tmp, fin, ".tmp", err) != 0) return -1;
  if (remove_dir(tmp, err) != 0) return -1; /* a leftover of a crash */
  if (mkdir(tmp, 0777) != 0)
    return rt_errf(err, "%s: cannot create directory: %s", tmp, strerror(errno));
  if (join(file, tmp, "/model.safetensors", err) != 0 || rt_params_save(run, file, err) != 0)
    return -1;
  if (join(file, tmp, "/optimizer.safetensors", err) != 0 || write_states(run, file, err) != 0)
    return -1;
  if (join(file, tmp, "/state.json", err) != 0 || write_state(file, run->plan, info, err) != 0)
    return -1;
  sync_dir(tmp);
  if (remove_dir(fin, err) != 0) return -1; /* the same step saved again */
  if (rename(tmp, fin) != 0)
    return rt_errf(err, "%s: cannot rename to %s: %s", tmp, fin, strerror(errno));
  sync_dir(dir);
  if (out) snprintf(out, nout, "%s", fin);
  return 0;
}

int rt_ckpt_find(const char *dir, char *out, size_t nout, int64_t *newer, RtError *err) {
  char path[PATH_MAX_LEN];
  *newer = -1;
  snprintf(path, sizeof path, "%s/state.json", dir);
  if (is_file(path)) { snprintf(out, nout, "%s", dir); return 0; }
  int64_t *steps, incomplete;
  int n;
  if (list_ckpts(dir, &steps, &n, &incomplete, err) != 0) return -1;
  if (n == 0) {
    free(steps);
    if (incomplete >= 0)
      return rt_errf(err, "%s: no complete checkpoint in it: step_%06lld/ has no state.json", dir, (long long)incomplete);
    return rt_errf(err, "%s: no complete checkpoint (step_NNNNNN/ with a state.json) in it", dir);
  }
  if (incomplete > steps[0]) *newer = incomplete;
  snprintf(out, nout, "%s/step_%06lld", dir, (long long)steps[0]);
  free(steps);
  return 0;
}

static int read_states(RtRun *run, const char *path, RtError *err) {
  const RtPlan *p = run->plan;
  RtStFile *f = rt_st_open(path, err);
  if (!f) return -1;
  int rc = 0;
  for (int i = 0; i < p->nstates && rc == 0; i++) {
    const RtPlanState *s = &p->states[i];
    float *dst = run->state + s->offset;
    int64_t n = s->pad_len > 0 ? s->numel / s->pad_len * s->pad_valid : s->numel; /* a padded param's: unpadded */
    memset(dst, 0, (size_t)s->numel * sizeof *dst);
    if (s->saved) rc = rt_st_read(f, s->name, RT_F32, 1, &n, dst, err);
    if (rc == 0 && s->saved && s->pad_len > 0) repad(dst, dst, s->numel, s->pad_len, s->pad_valid, s->pad_inner);
  }
  rt_st_close(f);
  return rc;
}

int rt_ckpt_info(const char *ckpt, RtCkptInfo *info, RtError *err) {
  char file[PATH_MAX_LEN];
  if (join(file, ckpt, "/state.json", err) != 0 || read_state(file, info, err) != 0) return -1;
  const char *base = strrchr(ckpt, '/');
  base = base ? base + 1 : ckpt;
  int64_t named = ckpt_step_of(base);
  if (named >= 0 && named != info->step)
    return rt_errf(err, "%s: state.json says step %lld, the directory's name step %lld", file, (long long)info->step,
                   (long long)named);
  return 0;
}

int rt_ckpt_load(RtRun *run, const char *ckpt, RtCkptInfo *info, RtError *err) {
  char file[PATH_MAX_LEN];
  if (rt_ckpt_info(ckpt, info, err) != 0) return -1;
  if (join(file, ckpt, "/model.safetensors", err) != 0 || rt_params_load(run, file, err) != 0)
    return -1;
  if (join(file, ckpt, "/optimizer.safetensors", err) != 0) return -1;
  return read_states(run, file, err);
}

int rt_ckpt_prune(const char *dir, int64_t keep, RtError *err) {
  if (keep <= 0) return 0;
  int64_t *steps;
  int n, rc = 0;
  if (list_ckpts(dir, &steps, &n, NULL, err) != 0) return -1;
  char path[PATH_MAX_LEN];
  for (int i = (int)(keep < n ? keep : n); i < n && rc == 0; i++) {
    snprintf(path, sizeof path, "%s/step_%06lld", dir, (long long)steps[i]);
    rc = remove_dir(path, err);
  }
  free(steps);
  return rc;
}
