/* settings.c: the mesh and train settings (LANGUAGE.md §6, §8). Checks every
 * settings body against the one table in settings.def (unknown and duplicate
 * keys, value kinds and units, ranges, call signatures of optimizers, schedules
 * and data sources), resolves device profiles (devices.def, profile files), fills
 * MeshConf and TrainConf with their defaults, and applies `--set` overrides to
 * the AST before any of that, so an override meets the same checks as the file.
 *
 * Values that are numbers, strings, bools or quantities go through
 * sema_eval_const(); names and calls that mean something only here (adamw(...),
 * tokens(...), cpu, auto, f32, profile(...)) are read from the AST. */
#include "check.h"
#include "cplan.h"
#include "sema.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the tables (settings.def, devices.def) --------------------------------- */

typedef enum SetKind {
  SK_INT, SK_NUM, SK_BOOL, SK_STR, SK_PATH, SK_MEM, SK_BW, SK_COMPUTE, SK_TIME, SK_PAIR, SK_ENUM,
  SK_SHAPE, SK_DEVICE, SK_LINK, SK_MODEL, SK_MESHREF, SK_DATA, SK_OPTIMIZER, SK_SCHEDULE,
  SK_PRECISION, SK_STRATEGY, SK_OBJECT,
} SetKind;

typedef enum Range { RG_ANY, RG_GE0, RG_GE1, RG_GT0, RG_UNIT, RG_0_3 } Range;

typedef enum Table {
  TB_NONE, TB_MESH, TB_LINK, TB_DEVICE, TB_TRAIN, TB_STRATEGY, TB_EVAL, TB_CKPT, TB_LOG,
} Table;

typedef enum CallGroup { CG_OPTIMIZER, CG_SCHEDULE, CG_DATA } CallGroup;

typedef struct SettingInfo {
  Table table;
  const char *key;
  SetKind kind;
  Range range;
  Table sub;           /* the table of an object value */
  bool required;
  const char *choices; /* "a|b|c" or NULL */
  const char *def;     /* the default, as the docs print it */
  const char *doc;
} SettingInfo;

typedef struct CallFnInfo {
  CallGroup group;
  const char *name;
  const char *doc;
} CallFnInfo;

typedef struct CallArgInfo {
  CallGroup group;
  const char *fn;
  const char *arg;
  SetKind kind;
  Range range;
  bool required;
  double dv, dv2; /* default value (and the second of a pair) */
  const char *def;
} CallArgInfo;

#define CALLFN(...)
#define CALLARG(...)
enum {
#define SETTING(tb, key, ...) SR_##tb##_##key,
#include "settings.def"
#undef SETTING
  SR__COUNT
};
static const SettingInfo settings_table[] = {
#define SETTING(tb, key, kind, range, sub, req, choices, def, doc) \
  {TB_##tb, #key, kind, range, TB_##sub, req, choices, def, doc},
#include "settings.def"
#undef SETTING
};
#undef CALLFN
#undef CALLARG

#define SETTING(...)
#define CALLFN(...)
enum {
#define CALLARG(group, fn, arg, ...) CA_##fn##_##arg,
#include "settings.def"
#undef CALLARG
  CA__COUNT
};
static const CallArgInfo call_args[] = {
#define CALLARG(group, fn, arg, kind, range, req, dv, dv2, def) \
  {CG_##group, #fn, #arg, kind, range, req, dv, dv2, def},
#include "settings.def"
#undef CALLARG
};
#undef CALLFN
#define CALLARG(...)
static const CallFnInfo call_fns[] = {
#define CALLFN(group, fn, doc) {CG_##group, #fn, doc},
#include "settings.def"
#undef CALLFN
};
#undef CALLARG
#undef SETTING
enum { NCALLFNS = (int)(sizeof call_fns / sizeof call_fns[0]) };

static const DeviceProfile builtin_devices[] = {
#define DEVICE(name, kind, mem, f32, bf16, hbm, ibw, xbw, ilat, xlat, src) \
  {name, kind, mem, f32, bf16, hbm, ibw, xbw, ilat, xlat, src, NULL},
#include "devices.def"
#undef DEVICE
};
enum { NDEVICES = (int)(sizeof builtin_devices / sizeof builtin_devices[0]) };

static const char *const table_names[] = {
    [TB_NONE] = "", [TB_MESH] = "mesh", [TB_LINK] = "link", [TB_DEVICE] = "device",
    [TB_TRAIN] = "train", [TB_STRATEGY] = "strategy", [TB_EVAL] = "eval",
    [TB_CKPT] = "checkpoint", [TB_LOG] = "log",
};
static const char *const group_names[] = {"optimizer", "schedule", "data source"};

const char *precision_name(Precision p) {
  switch (p) {
  case PREC_F32: return "f32";
  case PREC_BF16: return "bf16";
  case PREC_F16: return "f16";
  }
  return "?";
}

const char *optimizer_name(OptKind k) {
  switch (k) {
  case OPT_SGD: return "sgd";
  case OPT_ADAMW: return "adamw";
  case OPT_LAMB: return "lamb";
  case OPT_LARS: return "lars";
  }
  return "?";
}

/* ---- small helpers ------------------------------------------------------------ */

/* The source text under a span (shortened), for "got a bandwidth (300GBps)". */
static const char *span_text(Span sp) {
  if (sp.file < 0 || sp.hi <= sp.lo || (size_t)sp.hi > src_len(sp.file)) return "";
  int n = sp.hi - sp.lo;
  if (n > 40) return cp_fmt("%.37s...", src_text(sp.file) + sp.lo);
  return cp_strndup(src_text(sp.file) + sp.lo, (size_t)n);
}

/* The first `n` bytes of a span: the `train` keyword of an unnamed block. */
static Span span_head(Span sp, int n) {
  if (sp.hi - sp.lo > n) sp.hi = sp.lo + n;
  return sp;
}

static void hint_closest(const char *name, const char *const *cands, int n) {
  const char *near = cp_closest(name, cands, n);
  if (near) diag_hint("did you mean '%s'?", near);
}

/* The keys of one table, for "did you mean". */
static const char *const *table_keys(Table tb, int *n) {
  const char **keys = cp_alloc(SR__COUNT * sizeof *keys);
  *n = 0;
  for (int i = 0; i < SR__COUNT; i++)
    if (settings_table[i].table == tb) keys[(*n)++] = settings_table[i].key;
  return keys;
}

static int table_find(Table tb, const char *key) {
  for (int i = 0; i < SR__COUNT; i++)
    if (settings_table[i].table == tb && strcmp(settings_table[i].key, key) == 0) return i;
  return -1;
}

/* "did you mean" for an unknown key; else where the key belongs, if elsewhere;
 * else the list of the table's keys. */
static void hint_keys(const char *key, Table tb, const char *const *keys, int n) {
  const char *near = cp_closest(key, keys, n);
  if (near) {
    diag_hint("did you mean '%s'?", near);
    return;
  }
  StrBuf b = {0};
  for (int i = 0; i < SR__COUNT; i++)
    if (settings_table[i].table != tb && strcmp(settings_table[i].key, key) == 0)
      sb_printf(&b, "%s%s", b.len ? ", " : "", table_names[settings_table[i].table]);
  if (b.len) {
    diag_hint("'%s' is a setting of %s, not of %s", key, sb_str(&b), table_names[tb]);
    return;
  }
  /* train { lr = 1e-3 }: an argument of the optimizer (or the schedule, the data source) */
  static const char *const group_keys[] = {"optimizer", "schedule", "data"};
  const CallArgInfo *arg = NULL;
  for (size_t i = 0; i < sizeof call_args / sizeof call_args[0]; i++)
    if (strcmp(call_args[i].arg, key) == 0 && (!arg || strcmp(call_args[i].fn, "adamw") == 0)) arg = &call_args[i];
  if (arg && strcmp(table_names[tb], "train") == 0) {
    diag_hint("'%s' is an argument of the %s: %s = %s(%s = ...)", key, group_names[arg->group], group_keys[arg->group],
              arg->fn, key);
    return;
  }
  for (int i = 0; i < n; i++) sb_printf(&b, "%s%s", i ? ", " : "", keys[i]);
  diag_hint("%s settings: %s", table_names[tb], sb_str(&b));
}

/* Splits "a|b|c" into an arena array. */
static const char *const *choices_split(const char *choices, int *n) {
  const char **out = cp_alloc(8 * sizeof *out);
  *n = 0;
  for (const char *p = choices; *p && *n < 8;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    out[(*n)++] = cp_strndup(p, len);
    p += len + (bar ? 1 : 0);
  }
  return out;
}

/* `"a", "b" or "c"` for messages. */
static const char *choices_text(const char *choices, bool quote) {
  int n;
  const char *const *c = choices_split(choices, &n);
  StrBuf b = {0};
  for (int i = 0; i < n; i++) {
    sb_printf(&b, "%s%s%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", quote ? "\"" : "", c[i],
              quote ? "\"" : "");
  }
  return sb_str(&b);
}

static bool choices_has(const char *choices, const char *s) {
  int n;
  const char *const *c = choices_split(choices, &n);
  for (int i = 0; i < n; i++)
    if (strcmp(c[i], s) == 0) return true;
  return false;
}

/* The directory of the .cplan file an item came from, with a trailing '/' (or ""). */
static const char *item_dir(const Item *it) {
  const char *path = it && it->file >= 0 ? src_path(it->file) : NULL;
  const char *slash = path ? strrchr(path, '/') : NULL;
  return slash ? cp_strndup(path, (size_t)(slash - path + 1)) : "";
}

/* Paths in settings are relative to the .cplan file (LANGUAGE.md §6). */
static const char *resolve_path(const Item *it, const char *path) {
  if (!path || path[0] == '/') return path;
  return cp_fmt("%s%s", item_dir(it), path);
}

static bool file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---- scalar values: kinds, units, ranges ------------------------------------------ */

/* What a setting of this kind expects, for "expected X, got Y". */
static const char *kind_expected(SetKind k, const char *choices) {
  switch (k) {
  case SK_INT: return "an integer";
  case SK_NUM: return "a number";
  case SK_BOOL: return "true or false";
  case SK_STR:
  case SK_PATH: return "a string";
  case SK_MEM: return "a memory quantity such as 80GiB";
  case SK_BW: return "a bandwidth such as 300GBps";
  case SK_COMPUTE: return "a compute rate such as 312TFLOPS";
  case SK_TIME: return "a time such as 2us";
  case SK_PAIR: return "a pair of numbers such as (0.9, 0.999)";
  case SK_ENUM: return choices ? cp_fmt("one of %s", choices_text(choices, true)) : "a string";
  case SK_SHAPE: return "a named list such as [node = 2, gpu = 8]";
  case SK_DEVICE: return "a device: cpu, a built-in profile, profile(\"file.json\") or { ... }";
  case SK_LINK: return "a block";
  case SK_MODEL: return "a model call such as gpt(L = 4)";
  case SK_MESHREF: return "a mesh name";
  case SK_DATA: return "a data source such as tokens(\"train.bin\")";
  case SK_OPTIMIZER: return "an optimizer such as adamw(lr = 3e-4)";
  case SK_SCHEDULE: return "a schedule such as cosine(warmup = 100, min_lr = 1e-5)";
  case SK_PRECISION: return "a precision: f32, bf16 or f16";
  case SK_STRATEGY: return "auto or an object such as { dp = 2, tp = 4 }";
  case SK_OBJECT: return "an object such as { every = 100 }";
  }
  return "a value";
}

static const char *qty_kind_text(UnitKind u) {
  switch (u) {
  case UK_BYTES: return "a memory quantity";
  case UK_BANDWIDTH: return "a bandwidth";
  case UK_COMPUTE: return "a compute rate";
  case UK_TIME: return "a time";
  case UK_NONE: break;
  }
  return "a number";
}

/* What an expression is, without evaluating it, when it cannot be a constant. */
static const char *expr_shape_text(const Expr *e) {
  switch (e->kind) {
  case EX_CALL: return cp_fmt("a call to '%s'", e->str);
  case EX_OBJECT: return "an object";
  case EX_NAMED_LIST: return "a named list";
  default: return NULL;
  }
}

static const char *value_text(const Value *v) {
  switch (v->kind) {
  case V_INT: return "an integer";
  case V_FLOAT: return "a number";
  case V_BOOL: return "a bool";
  case V_STR: return "a string";
  case V_QTY: return qty_kind_text(v->unit);
  case V_TUPLE: return "a tuple";
  case V_LIST: return "a list";
  case V_TENSOR: return "a tensor";
  case V_NONE: return "nothing";
  case V_ERR: break;
  }
  return "a value";
}

static void error_expected(const Expr *e, SetKind k, const char *choices, const char *got) {
  diag_error(e->span, "expected %s, got %s (%s)", kind_expected(k, choices), got, span_text(e->span));
  if (e->kind == EX_STR && e->str && *e->str) { /* lr = "1e-3", memory = "80GiB": quoted */
    char *end = NULL;
    (void)strtod(e->str, &end);
    if (end && end != e->str) diag_hint("write it without the quotes: %s", e->str);
  }
}

/* Checks a number against a range; `what` names the setting. */
static bool range_ok(const Expr *e, const char *what, Range r, double x) {
  const char *msg = NULL;
  switch (r) {
  case RG_ANY: return true;
  case RG_GE0: msg = x >= 0 ? NULL : "must be at least 0"; break;
  case RG_GE1: msg = x >= 1 ? NULL : "must be at least 1"; break;
  case RG_GT0: msg = x > 0 ? NULL : "must be greater than 0"; break;
  case RG_UNIT: msg = x >= 0 && x < 1 ? NULL : "must be in [0, 1)"; break;
  case RG_0_3: msg = x >= 0 && x <= 3 && x == floor(x) ? NULL : "must be 0, 1, 2 or 3"; break;
  }
  if (!msg) return true;
  diag_error(e->span, "'%s' %s, got %s", what, msg, span_text(e->span));
  return false;
}

/* Reads a scalar setting: int, number, bool, string, quantity, pair or enum.
 * On success fills *out (numbers also in out->f, ints also in out->i). */
static bool read_scalar(Sema *s, const Expr *e, SetKind k, Range r, const char *choices,
                        const char *what, Value *out) {
  const char *shape = expr_shape_text(e);
  if (shape) {
    error_expected(e, k, choices, shape);
    return false;
  }
  if (k == SK_ENUM && e->kind == EX_NAME && choices && choices_has(choices, e->str)) {
    diag_error(e->span, "expected %s, got the name '%s'", kind_expected(k, choices), e->str);
    diag_hint("write it as a string: \"%s\"", e->str);
    return false;
  }
  Value v = sema_eval_const(s, e);
  if (v.kind == V_ERR) return false;
  bool ok;
  switch (k) {
  case SK_INT: ok = v.kind == V_INT; v.f = (double)v.i; break;
  case SK_NUM:
    ok = v.kind == V_INT || v.kind == V_FLOAT;
    if (v.kind == V_INT) v.f = (double)v.i;
    break;
  case SK_BOOL: ok = v.kind == V_BOOL; break;
  case SK_STR: case SK_PATH: case SK_ENUM: ok = v.kind == V_STR; break;
  case SK_MEM: ok = v.kind == V_QTY && v.unit == UK_BYTES; break;
  case SK_BW: ok = v.kind == V_QTY && v.unit == UK_BANDWIDTH; break;
  case SK_COMPUTE: ok = v.kind == V_QTY && v.unit == UK_COMPUTE; break;
  case SK_TIME: ok = v.kind == V_QTY && v.unit == UK_TIME; break;
  case SK_PAIR:
    ok = (v.kind == V_TUPLE || v.kind == V_LIST) && v.nitems == 2;
    for (int i = 0; ok && i < 2; i++) {
      Value *it = &v.items[i];
      ok = it->kind == V_INT || it->kind == V_FLOAT;
      if (it->kind == V_INT) it->f = (double)it->i;
    }
    break;
  default: cp_unreachable();
  }
  if (!ok) {
    const char *got = value_text(&v);
    if (k == SK_PAIR && (v.kind == V_TUPLE || v.kind == V_LIST) && v.nitems != 2)
      got = cp_fmt("%s of %d", got, v.nitems);
    error_expected(e, k, choices, got);
    return false;
  }
  if (k == SK_ENUM && choices && !choices_has(choices, v.s)) {
    int n;
    const char *const *c = choices_split(choices, &n);
    diag_error(e->span, "'%s' must be %s, got \"%s\"", what, choices_text(choices, true), v.s);
    hint_closest(v.s, c, n);
    return false;
  }
  if (k == SK_PAIR) {
    ok = range_ok(e, what, r, v.items[0].f) && range_ok(e, what, r, v.items[1].f);
  } else if (k != SK_BOOL && k != SK_STR && k != SK_PATH && k != SK_ENUM) {
    ok = range_ok(e, what, r, v.f);
  }
  *out = v;
  return ok;
}

/* ---- settings bodies and objects: unknown, duplicate and missing keys ----------- */

/* One `key = value` of a settings body, block or object, seen the same way. */
typedef struct Entry {
  const char *key;
  Span key_span;
  const Expr *value;     /* NULL for a block */
  const Setting *block;  /* `key NAME { ... }` */
} Entry;

typedef VEC(Entry) Entries;

static Entries entries_of_settings(Setting *const *set, int n) {
  Entries es = {0};
  for (int i = 0; i < n; i++) {
    Entry e = {set[i]->key, set[i]->key_span, set[i]->is_block ? NULL : set[i]->value,
               set[i]->is_block ? set[i] : NULL};
    VEC_PUSH(es, e);
  }
  return es;
}

static Entries entries_of_fields(const Field *f, int n) {
  Entries es = {0};
  for (int i = 0; i < n; i++) {
    Entry e = {f[i].name, f[i].name_span, f[i].value, NULL};
    VEC_PUSH(es, e);
  }
  return es;
}

/* Checks the keys of a body against one table. found[row] gets the entry of each
 * known key (the first, for a duplicate); `link` blocks repeat and are left to
 * the mesh reader. Missing required keys are reported at `owner`. Returns false
 * after diagnostics (the entries found are still usable). */
static bool entries_check(const Entries *es, Table tb, Span owner, const Entry **found) {
  bool ok = true;
  for (int i = 0; i < es->n; i++) {
    const Entry *e = &es->a[i];
    int row = table_find(tb, e->key);
    if (row < 0) {
      int n;
      const char *const *keys = table_keys(tb, &n);
      diag_error(e->key_span, "unknown %s setting '%s'", table_names[tb], e->key);
      hint_keys(e->key, tb, keys, n);
      ok = false;
      continue;
    }
    const SettingInfo *si = &settings_table[row];
    if (si->kind == SK_LINK) {
      if (!e->block) {
        diag_error(e->key_span, "'%s' takes a block: %s AXIS { bandwidth = ...; latency = ... }", e->key,
                   e->key);
        ok = false;
      }
      continue;
    }
    if (e->block) {
      diag_error(e->key_span, "'%s' is not a block: write %s = ...", e->key, e->key);
      ok = false;
      continue;
    }
    if (found[row]) {
      diag_error(e->key_span, "duplicate setting '%s'", e->key);
      diag_note(found[row]->key_span, "first set here");
      ok = false;
      continue;
    }
    found[row] = e;
  }
  for (int row = 0; row < SR__COUNT; row++) {
    const SettingInfo *si = &settings_table[row];
    if (si->table != tb || !si->required || found[row]) continue;
    diag_error(owner, "missing required setting '%s' in %s", si->key, table_names[tb]);
    diag_hint("add %s = ... (%s)", si->key, si->doc);
    ok = false;
  }
  return ok;
}

/* An object value's entries checked against its table; false if it is no object. */
static bool object_check(const Expr *e, Table tb, SetKind k, const Entry **found) {
  if (e->kind != EX_OBJECT) {
    const char *shape = expr_shape_text(e);
    diag_error(e->span, "expected %s, got %s", kind_expected(k, NULL),
               shape ? shape : cp_fmt("'%s'", span_text(e->span)));
    return false;
  }
  Entries es = entries_of_fields(e->fields, e->nfields);
  return entries_check(&es, tb, e->span, found);
}

/* Reads the scalar entry of a row if present. *ok turns false on an error. */
static bool row_scalar(Sema *s, const Entry *const *found, int row, Value *out, bool *ok) {
  const Entry *e = found[row];
  if (!e) return false;
  const SettingInfo *si = &settings_table[row];
  if (!read_scalar(s, e->value, si->kind, si->range, si->choices, si->key, out)) {
    *ok = false;
    return false;
  }
  return true;
}

static void row_int(Sema *s, const Entry *const *found, int row, int64_t *dst, bool *ok) {
  Value v;
  if (row_scalar(s, found, row, &v, ok)) *dst = v.i;
}

static void row_num(Sema *s, const Entry *const *found, int row, double *dst, bool *ok) {
  Value v;
  if (row_scalar(s, found, row, &v, ok)) *dst = v.f;
}

static void row_str(Sema *s, const Entry *const *found, int row, const char **dst, bool *ok) {
  Value v;
  if (row_scalar(s, found, row, &v, ok)) *dst = v.s;
}

/* ---- calls: optimizers, schedules, data sources ----------------------------------- */

/* A call bound to its signature in settings.def: args[CA_*] is the expression
 * given for each argument (NULL: the default), vals[CA_*] its value. */
typedef struct BoundCall {
  const CallFnInfo *fn;
  const Expr *args[CA__COUNT];
  Value vals[CA__COUNT];
} BoundCall;

static const char *const *group_fn_names(CallGroup g, int *n) {
  const char **names = cp_alloc(NCALLFNS * sizeof *names);
  *n = 0;
  for (int i = 0; i < NCALLFNS; i++)
    if (call_fns[i].group == g) names[(*n)++] = call_fns[i].name;
  return names;
}

/* The rows of one function's arguments, in positional order. */
static int fn_args(const char *fn, int *rows) {
  int n = 0;
  for (int i = 0; i < CA__COUNT; i++)
    if (strcmp(call_args[i].fn, fn) == 0) rows[n++] = i;
  return n;
}

static const CallFnInfo *group_find(CallGroup g, const char *name) {
  for (int i = 0; i < NCALLFNS; i++)
    if (call_fns[i].group == g && strcmp(call_fns[i].name, name) == 0) return &call_fns[i];
  return NULL;
}

/* Finds the callee of a call (or bare name) in a group; reports an unknown one. */
static const CallFnInfo *call_callee(const Expr *e, CallGroup g, SetKind k) {
  if (e->kind != EX_CALL && e->kind != EX_NAME) {
    diag_error(e->span, "expected %s, got %s", kind_expected(k, NULL), span_text(e->span));
    return NULL;
  }
  const CallFnInfo *fn = group_find(g, e->str);
  if (!fn) {
    int n;
    const char *const *names = group_fn_names(g, &n);
    Span at = e->kind == EX_CALL ? e->name_span : e->span;
    diag_error(at, "unknown %s '%s'", group_names[g], e->str);
    const char *near = cp_closest(e->str, names, n);
    if (near) diag_hint("did you mean '%s'?", near);
    else {
      StrBuf b = {0};
      for (int i = 0; i < n; i++) sb_printf(&b, "%s%s", i ? ", " : "", names[i]);
      diag_hint("the %ss are: %s", group_names[g], sb_str(&b));
    }
  }
  return fn;
}

/* Binds positional then keyword arguments; reports too many, unknown, repeated
 * and missing ones, then checks each value's kind and range. */
static bool call_bind(Sema *s, const Expr *e, CallGroup g, SetKind k, BoundCall *bc) {
  memset(bc, 0, sizeof *bc);
  bc->fn = call_callee(e, g, k);
  if (!bc->fn) return false;
  int rows[CA__COUNT], n = fn_args(bc->fn->name, rows);
  bool ok = true;
  int npos = e->kind == EX_CALL ? e->nitems : 0, nkw = e->kind == EX_CALL ? e->nfields : 0;
  for (int i = 0; i < npos; i++) {
    if (i >= n) {
      diag_error(e->items[i]->span, "%s() takes %d positional argument%s, got %d", bc->fn->name, n,
                 n == 1 ? "" : "s", npos);
      ok = false;
      break;
    }
    bc->args[rows[i]] = e->items[i];
  }
  for (int i = 0; i < nkw; i++) {
    const Field *f = &e->fields[i];
    int row = -1;
    const char *names[CA__COUNT];
    for (int j = 0; j < n; j++) {
      names[j] = call_args[rows[j]].arg;
      if (strcmp(names[j], f->name) == 0) row = rows[j];
    }
    if (row < 0) {
      diag_error(f->name_span, "%s() has no argument '%s'", bc->fn->name, f->name);
      if (cp_closest(f->name, names, n)) hint_closest(f->name, names, n);
      else {
        StrBuf lb = {0};
        for (int j = 0; j < n; j++) sb_printf(&lb, "%s%s", j ? ", " : "", names[j]);
        diag_hint("the arguments of %s(): %s", bc->fn->name, sb_str(&lb));
      }
      ok = false;
    } else if (bc->args[row]) {
      diag_error(f->name_span, "argument '%s' of %s() given twice", f->name, bc->fn->name);
      diag_note(bc->args[row]->span, "first given here");
      ok = false;
    } else {
      bc->args[row] = f->value;
    }
  }
  for (int j = 0; j < n; j++) {
    const CallArgInfo *a = &call_args[rows[j]];
    if (!bc->args[rows[j]]) {
      if (a->required) {
        diag_error(e->kind == EX_CALL ? e->name_span : e->span, "%s() needs the argument '%s'",
                   bc->fn->name, a->arg);
        ok = false;
      }
      continue;
    }
    if (!read_scalar(s, bc->args[rows[j]], a->kind, a->range, NULL, a->arg, &bc->vals[rows[j]]))
      ok = false;
  }
  return ok;
}

/* The number of an argument: as given, else its default from the table. */
static double arg_num(const BoundCall *bc, int row) {
  return bc->args[row] ? bc->vals[row].f : call_args[row].dv;
}

static void arg_pair(const BoundCall *bc, int row, double *a, double *b) {
  *a = bc->args[row] ? bc->vals[row].items[0].f : call_args[row].dv;
  *b = bc->args[row] ? bc->vals[row].items[1].f : call_args[row].dv2;
}

static int64_t arg_int(const BoundCall *bc, int row) {
  return bc->args[row] ? bc->vals[row].i : (int64_t)call_args[row].dv;
}

/* ---- device profiles ----------------------------------------------------------------- */

/* Parses a quantity of memory such as "24GiB" (CPLAN_CPU_MEMORY). */
static bool parse_memory(const char *text, double *out) {
  char *end;
  double x = strtod(text, &end);
  const UnitInfo *u = unit_find(end);
  if (end == text || !u || u->kind != UK_BYTES || !(x > 0)) return false;
  *out = x * u->factor;
  return true;
}

/* This machine's physical memory; CPLAN_CPU_MEMORY overrides it so golden
 * outputs do not depend on the machine that runs the tests. */
static double cpu_memory(void) {
  const char *env = getenv("CPLAN_CPU_MEMORY");
  double m;
  if (env && *env) {
    if (parse_memory(env, &m)) return m;
    diag_warning(SPAN_NONE, "CPLAN_CPU_MEMORY='%s' is not a memory quantity such as 24GiB; ignored", env);
  }
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? (double)pages * (double)page : 8.0 * 1073741824.0;
}

static const DeviceProfile *builtin_find(const char *name) {
  for (int i = 0; i < NDEVICES; i++)
    if (strcmp(builtin_devices[i].name, name) == 0) return &builtin_devices[i];
  return NULL;
}

/* A built-in profile, with the cpu's memory filled in from the machine. */
static DeviceProfile builtin_profile(const DeviceProfile *d) {
  DeviceProfile p = *d;
  if (p.kind == DEV_CPU && p.memory == 0) {
    p.memory = cpu_memory();
    const char *env = getenv("CPLAN_CPU_MEMORY");
    if (env && *env) p.source = "measured: OpenBLAS sgemm 1024^3 on one thread (~150 GFLOP/s); memory: "
                                "CPLAN_CPU_MEMORY; hbm and links: rough estimates";
  }
  return p;
}

/* A number >= lo (> lo when open) at key of object o; false when absent or out of range. */
static bool measured_num(const cJSON *o, const char *key, double lo, bool open, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsNumber(v) || !(open ? v->valuedouble > lo : v->valuedouble >= lo) || !(v->valuedouble < 1e300))
    return false;
  *out = v->valuedouble;
  return true;
}

/* [[x, y], ...] with x > 0 and y > 0: at most CP_PROFILE_POINTS pairs. */
static bool measured_points(const cJSON *a, ProfilePoint *pts, int *n) {
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > CP_PROFILE_POINTS) return false;
  *n = 0;
  for (const cJSON *e = a->child; e; e = e->next) {
    const cJSON *x = cJSON_GetArrayItem(e, 0), *y = cJSON_GetArrayItem(e, 1);
    if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsNumber(x) || !cJSON_IsNumber(y) ||
        !(x->valuedouble > 0 && y->valuedouble > 0))
      return false;
    pts[(*n)++] = (ProfilePoint){x->valuedouble, y->valuedouble};
  }
  return true;
}

/* The measured keys of a `cplanc calibrate` profile (DeviceMeasured in sema.h); "calibration"
 * (host, date, ranks, threads of the run) is for people and is not read. */
static bool profile_measured(const cJSON *it, const char *path, Span at, DeviceMeasured *m) {
  static const char *const kernels[] = {"layer_norm", "softmax", "gelu"};
  static const char *const colls[PC__COUNT] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
  const char *key = it->string;
  if (strcmp(key, "calibration") == 0) return true;
  if (strcmp(key, "gemm_efficiency") == 0) {
    bool good = cJSON_IsArray(it) && cJSON_GetArraySize(it) <= CP_PROFILE_POINTS;
    m->ngemm = 0; /* a repeated key replaces the curve */
    for (const cJSON *e = good ? it->child : NULL; e && good; e = e->next) {
      ProfilePoint *pt = &m->gemm[m->ngemm++];
      good = measured_num(e, "n", 0, true, &pt->x) && measured_num(e, "efficiency", 0, true, &pt->y) && pt->y <= 1;
    }
    if (!good) diag_error(at, "%s: 'gemm_efficiency' must be a list of at most %d {\"n\": N, \"efficiency\": E} "
                          "with 0 < E <= 1", path, CP_PROFILE_POINTS);
    return good;
  }
  if (strcmp(key, "kernel_efficiency") == 0) {
    double *effs[] = {&m->eff_layer_norm, &m->eff_softmax, &m->eff_gelu};
    bool good = cJSON_IsObject(it);
    for (const cJSON *e = good ? it->child : NULL; e; e = e->next) {
      int k = -1;
      for (int i = 0; i < 3; i++)
        if (strcmp(kernels[i], e->string) == 0) k = i;
      if (k < 0) {
        diag_warning(at, "%s: unknown kernel '%s' in 'kernel_efficiency' (ignored)", path, e->string);
        hint_closest(e->string, kernels, 3);
      } else if (!measured_num(it, kernels[k], 0, true, effs[k])) {
        good = false;
      }
    }
    if (!good) diag_error(at, "%s: 'kernel_efficiency' must map layer_norm, softmax, gelu to positive numbers", path);
    return good;
  }
  /* "collectives": {"ranks": N, "all_reduce": {"alpha", "beta", "points": [[bytes, seconds], ...]}, ...} */
  double ranks = 0;
  if (!cJSON_IsObject(it) || !measured_num(it, "ranks", 2, false, &ranks) || ranks > 1 << 24 || ranks != (int)ranks) {
    diag_error(at, "%s: 'collectives' must be an object with 'ranks' (an integer >= 2)", path);
    return false;
  }
  m->coll_ranks = (int)ranks;
  bool ok = true;
  for (const cJSON *e = it->child; e; e = e->next) {
    int c = -1;
    for (int i = 0; i < PC__COUNT; i++)
      if (strcmp(colls[i], e->string) == 0) c = i;
    if (c < 0) {
      if (strcmp(e->string, "ranks") == 0) continue;
      diag_warning(at, "%s: unknown collective '%s' in 'collectives' (ignored)", path, e->string);
      hint_closest(e->string, colls, PC__COUNT);
    } else if (!measured_num(e, "alpha", 0, false, &m->coll[c].alpha) ||
               !measured_num(e, "beta", 0, false, &m->coll[c].beta) ||
               !measured_points(cJSON_GetObjectItemCaseSensitive(e, "points"), m->coll[c].points, &m->coll[c].npoints)) {
      diag_error(at, "%s: 'collectives.%s' needs 'alpha' and 'beta' (numbers >= 0) and 'points' (at most %d "
                 "[bytes, seconds] pairs)", path, e->string, CP_PROFILE_POINTS);
      ok = false;
    }
  }
  return ok;
}

/* profile("file.json"): the keys of DeviceProfile, numbers in base units, over a
 * base profile of the same kind (cpu, or h100_sxm for cuda) for what is left out; and the
 * optional measured keys of `cplanc calibrate` (fields 11 on, into p->measured). */
static bool profile_from_json(const cJSON *j, const char *path, Span at, DeviceProfile *p) {
  static const char *const fields[] = {"name", "kind", "memory", "flops_f32", "flops_bf16", "hbm",
                                       "intra_bw", "inter_bw", "intra_latency", "inter_latency", "source",
                                       "gemm_efficiency", "kernel_efficiency", "collectives", "calibration"};
  enum { NFIELDS = sizeof fields / sizeof fields[0], NMEASURED_FROM = 11 };
  double *nums[] = {NULL, NULL, &p->memory, &p->flops_f32, &p->flops_bf16, &p->hbm,
                    &p->intra_bw, &p->inter_bw, &p->intra_latency, &p->inter_latency, NULL};
  const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind");
  bool cuda = cJSON_IsString(kind) && strcmp(kind->valuestring, "cuda") == 0;
  *p = builtin_profile(builtin_find(cuda ? "h100_sxm" : "cpu"));
  p->name = path;
  p->source = cp_fmt("profile file %s", path);
  DeviceMeasured *measured = NULL;
  bool ok = true;
  for (const cJSON *it = j->child; it; it = it->next) {
    int f = -1;
    for (int i = 0; i < NFIELDS; i++)
      if (strcmp(fields[i], it->string) == 0) f = i;
    if (f < 0) {
      diag_warning(at, "%s: unknown profile key '%s' (ignored)", path, it->string);
      hint_closest(it->string, fields, NFIELDS);
    } else if (f >= NMEASURED_FROM) {
      if (!measured) measured = cp_alloc(sizeof *measured);
      if (!profile_measured(it, path, at, measured)) ok = false;
    } else if (nums[f]) {
      if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0)) {
        diag_error(at, "%s: '%s' must be a non-negative number in base units", path, it->string);
        ok = false;
      } else {
        *nums[f] = it->valuedouble;
      }
    } else if (!cJSON_IsString(it)) {
      diag_error(at, "%s: '%s' must be a string", path, it->string);
      ok = false;
    } else if (f == 1 && !choices_has("cpu|cuda", it->valuestring)) {
      diag_error(at, "%s: 'kind' must be \"cpu\" or \"cuda\", got \"%s\"", path, it->valuestring);
      ok = false;
    } else if (f == 10) {
      p->source = cp_fmt("profile file %s: %s", path, it->valuestring);
    }
  }
  p->measured = measured;
  return ok;
}

static bool device_profile_file(Sema *s, const Item *mesh, const Expr *e, DeviceProfile *p) {
  if (e->nitems != 1 || e->nfields != 0) {
    diag_error(e->span, "profile() takes one argument, the path of a JSON profile");
    return false;
  }
  Value v;
  if (!read_scalar(s, e->items[0], SK_PATH, RG_ANY, NULL, "profile", &v)) return false;
  const char *path = resolve_path(mesh, v.s);
  const char *text = cp_read_text(path);
  if (!text) {
    diag_error(e->items[0]->span, "cannot read the device profile '%s'", path);
    diag_hint("write one with `cplanc calibrate`, or use a built-in profile such as h100_sxm");
    return false;
  }
  cJSON *j = cJSON_Parse(text);
  if (!cJSON_IsObject(j)) {
    diag_error(e->items[0]->span, "'%s' is not a JSON object (a device profile)", path);
    cJSON_Delete(j);
    return false;
  }
  bool ok = profile_from_json(j, cp_strdup(v.s), e->items[0]->span, p);
  cJSON_Delete(j);
  return ok;
}

/* device = { kind = cuda; memory = 80GiB; flops = 312TFLOPS; hbm = 2TBps }. For
 * cuda, flops is the bf16 peak and f32 defaults to a sixteenth of it (A100:
 * 312/19.5); links come from h100_sxm. For cpu, the cpu profile fills the gaps. */
static bool device_object(Sema *s, const Expr *e, DeviceProfile *p) {
  const Entry *found[SR__COUNT] = {0};
  if (!object_check(e, TB_DEVICE, SK_DEVICE, found)) return false;
  bool ok = true;
  const char *kind = "cuda";
  const Expr *ke = found[SR_DEVICE_kind] ? found[SR_DEVICE_kind]->value : NULL;
  if (ke && ke->kind == EX_NAME) {
    static const char *const kinds[] = {"cuda", "cpu"};
    if (choices_has("cuda|cpu", ke->str)) {
      kind = ke->str;
    } else {
      diag_error(ke->span, "unknown device kind '%s': expected cuda or cpu", ke->str);
      hint_closest(ke->str, kinds, 2);
      ok = false;
    }
  } else {
    row_str(s, found, SR_DEVICE_kind, &kind, &ok);
  }
  bool cuda = strcmp(kind, "cuda") == 0;
  *p = builtin_profile(builtin_find(cuda ? "h100_sxm" : "cpu"));
  p->name = "custom";
  p->source = "the mesh's device block";
  static const int need[] = {SR_DEVICE_memory, SR_DEVICE_flops, SR_DEVICE_hbm};
  for (int i = 0; cuda && i < 3; i++) {
    if (found[need[i]]) continue;
    diag_error(e->span, "a cuda device block needs '%s'", settings_table[need[i]].key);
    ok = false;
  }
  row_num(s, found, SR_DEVICE_memory, &p->memory, &ok);
  row_num(s, found, SR_DEVICE_hbm, &p->hbm, &ok);
  double flops = 0;
  row_num(s, found, SR_DEVICE_flops, &flops, &ok);
  if (flops > 0) {
    p->flops_bf16 = flops;
    p->flops_f32 = cuda ? flops / 16 : flops;
  }
  row_num(s, found, SR_DEVICE_flops_f32, &p->flops_f32, &ok);
  return ok;
}

/* device = cpu | NAME | profile("file.json") | { ... } */
static bool mesh_device(Sema *s, const Item *mesh, const Expr *e, DeviceProfile *p) {
  if (e->kind == EX_OBJECT) return device_object(s, e, p);
  if (e->kind == EX_CALL && strcmp(e->str, "profile") == 0) return device_profile_file(s, mesh, e, p);
  const char *names[NDEVICES];
  StrBuf all = {0}; /* devices.def's names, for the hints */
  for (int i = 0; i < NDEVICES; i++) {
    names[i] = builtin_devices[i].name;
    sb_printf(&all, "%s%s", i ? ", " : "", names[i]);
  }
  if (e->kind == EX_NAME) {
    const DeviceProfile *d = builtin_find(e->str);
    if (d) {
      *p = builtin_profile(d);
      return true;
    }
    diag_error(e->span, "unknown device '%s'", e->str);
    const char *near = cp_closest(e->str, names, NDEVICES);
    if (near) diag_hint("did you mean '%s'?", near);
    else diag_hint("built-in devices: %s; or profile(\"file.json\")", sb_str(&all));
    return false;
  }
  if (e->kind == EX_CALL) {
    diag_error(e->name_span, "unknown device function '%s'", e->str);
    diag_hint("a device is cpu, a built-in profile, profile(\"file.json\") or { kind = cuda; ... }");
    return false;
  }
  diag_error(e->span, "expected %s, got %s", kind_expected(SK_DEVICE, NULL), span_text(e->span));
  if (e->kind == EX_STR) { /* device = "h100": a name, unquoted */
    const char *near = e->str && builtin_find(e->str) ? e->str : e->str ? cp_closest(e->str, names, NDEVICES) : NULL;
    if (near) diag_hint("a device is a name, without quotes: device = %s", near);
    else diag_hint("a device is a name, without quotes; built-in devices: %s", sb_str(&all));
  }
  return false;
}

/* ---- meshes ----------------------------------------------------------------------------- */

/* shape = [node = 2, gpu = 8]: axes outermost first; devices = the product. */
static bool mesh_shape(Sema *s, const Expr *e, MeshConf *m) {
  if (e->kind != EX_NAMED_LIST) {
    const char *shape = expr_shape_text(e);
    diag_error(e->span, "expected %s, got %s", kind_expected(SK_SHAPE, NULL),
               shape ? shape : cp_fmt("'%s'", span_text(e->span)));
    if (e->kind == EX_LIST) diag_hint("name each axis: [gpu = 8]");
    return false;
  }
  if (e->nfields == 0 || e->nfields > CP_MAX_RANK) {
    diag_error(e->span, "a mesh shape has 1 to %d axes, got %d", CP_MAX_RANK, e->nfields);
    return false;
  }
  bool ok = true;
  m->ndevices = 1;
  for (int i = 0; i < e->nfields; i++) {
    const Field *f = &e->fields[i];
    for (int j = 0; j < i; j++) {
      if (strcmp(e->fields[j].name, f->name) != 0) continue;
      diag_error(f->name_span, "duplicate mesh axis '%s'", f->name);
      diag_note(e->fields[j].name_span, "first declared here");
      ok = false;
    }
    Value v;
    if (!read_scalar(s, f->value, SK_INT, RG_GE1, NULL, f->name, &v)) {
      ok = false;
      continue;
    }
    if (v.i > (1 << 24) || m->ndevices > ((int64_t)1 << 40) / v.i) {
      diag_error(f->value->span, "mesh axis '%s' of %lld devices is too large", f->name, (long long)v.i);
      ok = false;
      continue;
    }
    m->axes[m->naxes++] = (MeshAxis){f->name, v.i, 0, 0, f->name_span};
    m->ndevices *= v.i;
  }
  return ok;
}

/* Link defaults from the profile: the innermost axis is inside a node (NVLink),
 * outer axes cross nodes (InfiniBand). */
static void mesh_default_links(MeshConf *m) {
  for (int i = 0; i < m->naxes; i++) {
    bool inner = i == m->naxes - 1;
    m->axes[i].bandwidth = inner ? m->device.intra_bw : m->device.inter_bw;
    m->axes[i].latency = inner ? m->device.intra_latency : m->device.inter_latency;
  }
}

/* link AXIS { bandwidth = ...; latency = ... }, one block per axis. */
static bool mesh_links(Sema *s, const Entries *es, MeshConf *m, bool have_shape) {
  bool ok = true;
  const Setting *seen[CP_MAX_RANK] = {0};
  for (int i = 0; i < es->n; i++) {
    const Setting *b = es->a[i].block;
    if (!b || strcmp(b->key, "link") != 0) continue;
    const Entry *found[SR__COUNT] = {0};
    Entries body = entries_of_settings(b->body, b->nbody);
    if (!entries_check(&body, TB_LINK, b->block_name_span, found)) ok = false;
    int ax = -1;
    for (int j = 0; j < m->naxes; j++)
      if (b->block_name && strcmp(m->axes[j].name, b->block_name) == 0) ax = j;
    if (ax < 0 && have_shape) {
      const char *names[CP_MAX_RANK];
      for (int j = 0; j < m->naxes; j++) names[j] = m->axes[j].name;
      diag_error(b->block_name_span, "'%s' is not an axis of mesh '%s'", b->block_name ? b->block_name : "",
                 m->name);
      hint_closest(b->block_name ? b->block_name : "", names, m->naxes);
      ok = false;
    }
    if (ax >= 0 && seen[ax]) {
      diag_error(b->block_name_span, "duplicate link for axis '%s'", b->block_name);
      diag_note(seen[ax]->block_name_span, "first given here");
      ok = false;
      continue;
    }
    double bw = ax >= 0 ? m->axes[ax].bandwidth : 0, lat = ax >= 0 ? m->axes[ax].latency : 0;
    row_num(s, found, SR_LINK_bandwidth, &bw, &ok);
    row_num(s, found, SR_LINK_latency, &lat, &ok);
    if (ax < 0) continue;
    seen[ax] = b;
    m->axes[ax].bandwidth = bw;
    m->axes[ax].latency = lat;
  }
  return ok;
}

static MeshConf *mesh_check(Sema *s, const Item *it) {
  int before = diag_errors();
  MeshConf *m = cp_alloc(sizeof *m);
  m->name = it->name;
  m->span = it->name_span;
  Entries es = entries_of_settings(it->settings, it->nsettings);
  const Entry *found[SR__COUNT] = {0};
  entries_check(&es, TB_MESH, it->name_span, found);
  bool have_shape = found[SR_MESH_shape] && mesh_shape(s, found[SR_MESH_shape]->value, m);
  m->device = builtin_profile(builtin_find("cpu"));
  if (found[SR_MESH_device]) mesh_device(s, it, found[SR_MESH_device]->value, &m->device);
  mesh_default_links(m);
  mesh_links(s, &es, m, have_shape);
  return diag_errors() == before ? m : NULL;
}

/* Each mesh is checked once per Sema (settings_check_meshes, then settings_train
 * for the one it uses), so its diagnostics are printed once. The cache lives
 * outside the arena; a new Sema clears it. */
static struct {
  const Sema *sema;
  const Program *prog;
  int n;
  struct { const Item *item; MeshConf *conf; } e[64];
} mesh_cache;

MeshConf *settings_mesh(Sema *s, const Item *mesh) {
  if (mesh_cache.sema != s || mesh_cache.prog != sema_program(s)) {
    memset(&mesh_cache, 0, sizeof mesh_cache);
    mesh_cache.sema = s;
    mesh_cache.prog = sema_program(s);
  }
  for (int i = 0; i < mesh_cache.n; i++)
    if (mesh_cache.e[i].item == mesh) return mesh_cache.e[i].conf;
  MeshConf *m = mesh_check(s, mesh);
  if (mesh_cache.n < 64) {
    mesh_cache.e[mesh_cache.n].item = mesh;
    mesh_cache.e[mesh_cache.n++].conf = m;
  }
  return m;
}

MeshConf *settings_default_mesh(void) {
  MeshConf *m = cp_alloc(sizeof *m);
  m->name = NULL;
  m->span = SPAN_NONE;
  m->naxes = 1;
  m->ndevices = 1;
  m->axes[0] = (MeshAxis){"cpu", 1, 0, 0, SPAN_NONE};
  m->device = builtin_profile(builtin_find("cpu"));
  mesh_default_links(m);
  return m;
}

bool settings_check_meshes(Sema *s) {
  Program *p = sema_program(s);
  bool ok = true;
  for (int i = 0; i < p->nitems && !diag_too_many(); i++)
    if (p->items[i]->kind == IT_MESH && !settings_mesh(s, p->items[i])) ok = false;
  return ok;
}

/* ---- train ---------------------------------------------------------------------------- */

/* model = gpt(L = 4) or model = gpt: a model item (its arguments are bound by
 * sema_build_model). */
static const Item *train_model(Sema *s, const Expr *e) {
  if (e->kind != EX_CALL && e->kind != EX_NAME) {
    diag_error(e->span, "expected %s, got %s", kind_expected(SK_MODEL, NULL), span_text(e->span));
    return NULL;
  }
  Span at = e->kind == EX_CALL ? e->name_span : e->span;
  const Item *it = sema_find_item(s, e->str);
  int n;
  const char *const *models = sema_item_names(s, IT_MODEL, &n);
  if (it && it->kind == IT_MODEL) return it;
  if (it && it->kind == IT_FN) diag_error(at, "'%s' is a fn, not a model: train.model must name a model", e->str);
  else if (it) diag_error(at, "'%s' is not a model", e->str);
  else diag_error(at, "unknown model '%s'", e->str);
  const char *near = cp_closest(e->str, models, n);
  if (near) diag_hint("did you mean '%s'?", near);
  else if (n > 0) diag_hint("the models of this file: %s%s", models[0], n > 1 ? ", ..." : "");
  return NULL;
}

/* mesh = NAME: a mesh item. */
static MeshConf *train_mesh(Sema *s, const Expr *e, bool *ok) {
  if (e->kind != EX_NAME) {
    diag_error(e->span, "expected a mesh name, got %s", span_text(e->span));
    *ok = false;
    return NULL;
  }
  const Item *it = sema_find_item(s, e->str);
  if (!it || it->kind != IT_MESH) {
    int n;
    const char *const *meshes = sema_item_names(s, IT_MESH, &n);
    if (it) diag_error(e->span, "'%s' is not a mesh", e->str);
    else diag_error(e->span, "unknown mesh '%s'", e->str);
    hint_closest(e->str, meshes, n);
    *ok = false;
    return NULL;
  }
  MeshConf *m = settings_mesh(s, it);
  if (!m) *ok = false;
  return m;
}

void sema_hint_make_tokens(const char *path) {
  diag_hint("`cplanc data text FILE.txt -o %s` makes one of a text (byte-level tokens)", path);
}

/* A data file (val: the validation file) that does not exist: an error when the command reads it,
 * nothing when the program reads another, else a warning (sema_need_data). False after an error. */
static bool missing_data(const Sema *s, bool val, Span at, const char *path, bool tokens) {
  const char *what = val ? "validation data" : "data";
  DataNeed need = sema_data_needed(s, val);
  if (need == NEED_REPLACED) return true;
  if (need == NEED_WARN) {
    diag_warning(at, "%s file '%s' not found", what, path);
    return true;
  }
  diag_error(at, "%s file '%s' not found", what, path);
  if (tokens) sema_hint_make_tokens(path);
  if (!val) diag_hint("or train on another file: `cplanc run FILE.cplan -- --data PATH`");
  return false;
}

static bool train_data(Sema *s, const Item *train, const Expr *e, DataConf *d) {
  BoundCall bc;
  d->span = e->span;
  if (!call_bind(s, e, CG_DATA, SK_DATA, &bc)) return false;
  const char *fn = bc.fn->name;
  if (strcmp(fn, "adder") == 0) {
    d->kind = DATA_ADDER;
    d->digits = arg_int(&bc, CA_adder_digits);
    if (d->digits > 9) {
      diag_error(bc.args[CA_adder_digits]->span, "adder digits must be at most 9, got %lld",
                 (long long)d->digits);
      return false;
    }
    return true;
  }
  bool tok = strcmp(fn, "tokens") == 0;
  int path_row = tok ? CA_tokens_path : CA_tensors_path, val_row = tok ? CA_tokens_val : CA_tensors_val;
  d->kind = tok ? DATA_TOKENS : DATA_TENSORS;
  d->path = resolve_path(train, bc.vals[path_row].s);
  d->val_path = bc.args[val_row] ? resolve_path(train, bc.vals[val_row].s) : NULL;
  d->shuffle = tok && bc.args[CA_tokens_shuffle] && bc.vals[CA_tokens_shuffle].i;
  /* check and build need no data: a missing file is only a warning there; run reads it now */
  bool ok = true;
  if (!file_exists(d->path)) ok &= missing_data(s, false, bc.args[path_row]->span, d->path, tok);
  if (d->val_path && !file_exists(d->val_path)) ok &= missing_data(s, true, bc.args[val_row]->span, d->val_path, tok);
  return ok;
}

static bool train_optimizer(Sema *s, const Expr *e, OptimizerConf *o) {
  BoundCall bc;
  if (!call_bind(s, e, CG_OPTIMIZER, SK_OPTIMIZER, &bc)) return false;
  const char *fn = bc.fn->name;
  memset(o, 0, sizeof *o);
  if (strcmp(fn, "sgd") == 0) {
    o->kind = OPT_SGD;
    o->lr = arg_num(&bc, CA_sgd_lr);
    o->momentum = arg_num(&bc, CA_sgd_momentum);
    o->weight_decay = arg_num(&bc, CA_sgd_weight_decay);
    o->nesterov = bc.args[CA_sgd_nesterov] && bc.vals[CA_sgd_nesterov].i;
  } else if (strcmp(fn, "adamw") == 0) {
    o->kind = OPT_ADAMW;
    o->lr = arg_num(&bc, CA_adamw_lr);
    arg_pair(&bc, CA_adamw_betas, &o->beta1, &o->beta2);
    o->eps = arg_num(&bc, CA_adamw_eps);
    o->weight_decay = arg_num(&bc, CA_adamw_weight_decay);
  } else if (strcmp(fn, "lamb") == 0) {
    o->kind = OPT_LAMB;
    o->lr = arg_num(&bc, CA_lamb_lr);
    arg_pair(&bc, CA_lamb_betas, &o->beta1, &o->beta2);
    o->eps = arg_num(&bc, CA_lamb_eps);
    o->weight_decay = arg_num(&bc, CA_lamb_weight_decay);
  } else {
    o->kind = OPT_LARS;
    o->lr = arg_num(&bc, CA_lars_lr);
    o->momentum = arg_num(&bc, CA_lars_momentum);
    o->weight_decay = arg_num(&bc, CA_lars_weight_decay);
    o->trust = arg_num(&bc, CA_lars_trust);
  }
  return true;
}

/* optimizer left out: adamw(lr = 3e-4) with adamw's defaults. */
static void default_optimizer(OptimizerConf *o) {
  BoundCall bc;
  memset(&bc, 0, sizeof bc);
  memset(o, 0, sizeof *o);
  o->kind = OPT_ADAMW;
  o->lr = arg_num(&bc, CA_adamw_lr);
  arg_pair(&bc, CA_adamw_betas, &o->beta1, &o->beta2);
  o->eps = arg_num(&bc, CA_adamw_eps);
  o->weight_decay = arg_num(&bc, CA_adamw_weight_decay);
}

static bool train_schedule(Sema *s, const Expr *e, ScheduleConf *sc) {
  BoundCall bc;
  if (!call_bind(s, e, CG_SCHEDULE, SK_SCHEDULE, &bc)) return false;
  const char *fn = bc.fn->name;
  if (strcmp(fn, "cosine") == 0) {
    *sc = (ScheduleConf){SCHED_COSINE, arg_int(&bc, CA_cosine_warmup), arg_num(&bc, CA_cosine_min_lr)};
  } else if (strcmp(fn, "linear") == 0) {
    *sc = (ScheduleConf){SCHED_LINEAR, arg_int(&bc, CA_linear_warmup), arg_num(&bc, CA_linear_end_lr)};
  } else {
    *sc = (ScheduleConf){SCHED_CONSTANT, 0, 0};
  }
  return true;
}

static bool train_precision(Sema *s, const Expr *e, Precision *p) {
  const char *name = NULL;
  if (e->kind == EX_NAME) name = e->str;
  else if (e->kind == EX_STR) name = e->str;
  static const char *const names[] = {"f32", "bf16", "f16"};
  for (int i = 0; name && i < 3; i++)
    if (strcmp(name, names[i]) == 0) {
      *p = (Precision)i;
      return true;
    }
  if (name) diag_error(e->span, "unknown precision '%s': expected f32, bf16 or f16", name);
  else diag_error(e->span, "expected %s, got %s", kind_expected(SK_PRECISION, NULL), span_text(e->span));
  if (name) hint_closest(name, names, 3);
  return false;
}

static bool train_strategy(Sema *s, const Expr *e, StrategyConf *st) {
  *st = (StrategyConf){.is_auto = true, .zero = -1, .recompute = RC_SEARCH, .pipeline = PS_SEARCH,
                       .span = e->span};
  if (e->kind == EX_NAME && strcmp(e->str, "auto") == 0) return true;
  if (e->kind == EX_NAME) {
    diag_error(e->span, "unknown strategy '%s': expected auto or an object such as { dp = 2, tp = 4 }",
               e->str);
    return false;
  }
  const Entry *found[SR__COUNT] = {0};
  bool ok = object_check(e, TB_STRATEGY, SK_STRATEGY, found);
  if (!ok && e->kind != EX_OBJECT) return false;
  row_int(s, found, SR_STRATEGY_dp, &st->dp, &ok);
  row_int(s, found, SR_STRATEGY_tp, &st->tp, &ok);
  row_int(s, found, SR_STRATEGY_pp, &st->pp, &ok);
  row_int(s, found, SR_STRATEGY_sp, &st->sp, &ok);
  row_int(s, found, SR_STRATEGY_micro, &st->micro, &ok);
  row_int(s, found, SR_STRATEGY_zero, &st->zero, &ok);
  const char *rc = NULL, *ps = NULL;
  row_str(s, found, SR_STRATEGY_recompute, &rc, &ok);
  row_str(s, found, SR_STRATEGY_pipeline, &ps, &ok);
  if (rc) st->recompute = strcmp(rc, "none") == 0 ? RC_NONE : strcmp(rc, "selective") == 0 ? RC_SELECTIVE : RC_FULL;
  if (ps) st->pipeline = strcmp(ps, "1f1b") == 0 ? PS_1F1B : strcmp(ps, "gpipe") == 0 ? PS_GPIPE : PS_INTERLEAVED;
  for (int row = 0; row < SR__COUNT; row++) {
    const Entry *f = found[row];
    if (settings_table[row].table != TB_STRATEGY || !f) continue;
    st->is_auto = false;
    if (st->nfields < (int)(sizeof st->fields / sizeof st->fields[0]))
      st->fields[st->nfields++] = (StrategyField){settings_table[row].key,
                                                  f->value ? span_join(f->key_span, f->value->span) : f->key_span};
  }
  return ok;
}

static void train_objects(Sema *s, const Item *it, const Entry *const *tf, TrainConf *t, bool *ok) {
  const Entry *found[SR__COUNT] = {0};
  if (tf[SR_TRAIN_eval]) {
    if (!object_check(tf[SR_TRAIN_eval]->value, TB_EVAL, SK_OBJECT, found)) *ok = false;
    t->eval_batches = 10;
    row_int(s, found, SR_EVAL_every, &t->eval_every, ok);
    row_int(s, found, SR_EVAL_batches, &t->eval_batches, ok);
    if (t->eval_every && !t->data.val_path && t->data.kind != DATA_ADDER && tf[SR_TRAIN_data])
      diag_warning(tf[SR_TRAIN_eval]->key_span, "eval is set but the data source has no 'val' file");
  }
  if (tf[SR_TRAIN_checkpoint]) {
    memset(found, 0, sizeof found);
    if (!object_check(tf[SR_TRAIN_checkpoint]->value, TB_CKPT, SK_OBJECT, found)) *ok = false;
    const char *dir = "ckpt";
    t->ckpt_keep = 3;
    row_int(s, found, SR_CKPT_every, &t->ckpt_every, ok);
    row_int(s, found, SR_CKPT_keep, &t->ckpt_keep, ok);
    row_str(s, found, SR_CKPT_dir, &dir, ok);
    t->ckpt_dir = resolve_path(it, dir);
  }
  t->log_every = 10;
  if (tf[SR_TRAIN_log]) {
    memset(found, 0, sizeof found);
    if (!object_check(tf[SR_TRAIN_log]->value, TB_LOG, SK_OBJECT, found)) *ok = false;
    const char *file = NULL;
    row_int(s, found, SR_LOG_every, &t->log_every, ok);
    row_str(s, found, SR_LOG_file, &file, ok);
    t->log_file = resolve_path(it, file);
  }
}

/* Pinned degrees must fit the batch and the mesh (LANGUAGE.md §6). sp shares
 * tp's devices, so it is not part of the product. */
static bool train_consistent(const TrainConf *t, const Entry *const *tf) {
  const StrategyConf *st = &t->strategy;
  bool ok = true;
  if (t->batch > 0 && st->dp > 0 && st->micro > 0 && t->batch % (st->dp * st->micro) != 0) {
    diag_error(strat_field_span(t, t->batch % st->dp ? "dp" : "micro"),
               "batch %lld is not divisible by dp*micro = %lld*%lld", (long long)t->batch, (long long)st->dp,
               (long long)st->micro);
    ok = false;
  } else if (t->batch > 0 && st->dp > 0 && t->batch % st->dp != 0) {
    diag_error(strat_field_span(t, "dp"), "batch %lld is not divisible by dp = %lld", (long long)t->batch,
               (long long)st->dp);
    ok = false;
  } else if (t->batch > 0 && st->micro > 0 && t->batch % st->micro != 0) {
    diag_error(strat_field_span(t, "micro"), "batch %lld is not divisible by micro = %lld", (long long)t->batch,
               (long long)st->micro);
    ok = false;
  }
  if (!t->mesh) return ok;
  int64_t prod = 1;
  StrBuf names = {0}, vals = {0};
  const char *const labels[] = {"dp", "tp", "pp"};
  const int64_t degs[] = {st->dp, st->tp, st->pp};
  Span at = st->span; /* the one degree pinned, else the strategy */
  for (int i = 0, npinned = 0; i < 3; i++) {
    if (degs[i] <= 0) continue;
    at = ++npinned == 1 ? strat_field_span(t, labels[i]) : st->span;
    sb_printf(&names, "%s%s", names.len ? "*" : "", labels[i]);
    sb_printf(&vals, "%s%lld", vals.len ? "*" : "", (long long)degs[i]);
    prod = prod > ((int64_t)1 << 40) / degs[i] ? ((int64_t)1 << 40) + 1 : prod * degs[i];
  }
  if (names.len && t->mesh->ndevices % prod != 0) {
    diag_error(at, "%s = %s does not divide the mesh's %lld device%s", sb_str(&names), sb_str(&vals),
               (long long)t->mesh->ndevices, t->mesh->ndevices == 1 ? "" : "s");
    if (t->mesh->name) diag_note(t->mesh->span, "mesh '%s' is defined here", t->mesh->name);
    ok = false;
  }
  /* dp left out: the devices tp and pp leave (strat_degrees), which must divide the batch too */
  int64_t tpp = (st->tp > 0 ? st->tp : 1) * (st->pp > 0 ? st->pp : 1), dp = t->mesh->ndevices / tpp;
  if (ok && st->dp <= 0 && tpp > 1 && t->mesh->ndevices % tpp == 0 && t->batch > 0 && t->batch % dp != 0) {
    diag_error(at, "batch %lld is not divisible by dp = %lld, the devices %s = %s leave of the mesh's %lld",
               (long long)t->batch, (long long)dp, sb_str(&names), sb_str(&vals), (long long)t->mesh->ndevices);
    diag_hint("make batch a multiple of %lld, or pin dp", (long long)dp);
    ok = false;
  }
  if (st->sp > 0 && t->mesh->ndevices % st->sp != 0) {
    diag_error(strat_field_span(t, "sp"), "sp = %lld does not divide the mesh's %lld devices", (long long)st->sp,
               (long long)t->mesh->ndevices);
    ok = false;
  }
  (void)tf;
  return ok;
}

/* Reads every setting of a train block into t; false after diagnostics. */
static bool train_read(Sema *s, const Item *it, TrainConf *t) {
  Span owner = it->name ? it->name_span : span_head(it->span, 5);
  Entries es = entries_of_settings(it->settings, it->nsettings);
  const Entry *tf[SR__COUNT] = {0};
  bool ok = entries_check(&es, TB_TRAIN, owner, tf);
  if (tf[SR_TRAIN_model]) {
    t->model_call = tf[SR_TRAIN_model]->value;
    t->model = train_model(s, t->model_call);
    if (!t->model) ok = false;
  }
  t->mesh = tf[SR_TRAIN_mesh] ? train_mesh(s, tf[SR_TRAIN_mesh]->value, &ok) : settings_default_mesh();
  if (tf[SR_TRAIN_data] && !train_data(s, it, tf[SR_TRAIN_data]->value, &t->data)) ok = false;
  row_int(s, tf, SR_TRAIN_batch, &t->batch, &ok);
  row_int(s, tf, SR_TRAIN_steps, &t->steps, &ok);
  default_optimizer(&t->optimizer);
  if (tf[SR_TRAIN_optimizer] && !train_optimizer(s, tf[SR_TRAIN_optimizer]->value, &t->optimizer)) ok = false;
  t->schedule = (ScheduleConf){SCHED_CONSTANT, 0, 0};
  if (tf[SR_TRAIN_schedule] && !train_schedule(s, tf[SR_TRAIN_schedule]->value, &t->schedule)) ok = false;
  else if (tf[SR_TRAIN_schedule] && t->steps > 0 && t->schedule.warmup >= t->steps)
    diag_warning(tf[SR_TRAIN_schedule]->value->span, "warmup %lld is not below steps %lld: the learning rate never "
                 "leaves the warmup", (long long)t->schedule.warmup, (long long)t->steps);
  row_num(s, tf, SR_TRAIN_clip, &t->clip, &ok);
  bool cuda = t->mesh && t->mesh->device.kind == DEV_CUDA;
  t->precision = cuda ? PREC_BF16 : PREC_F32;
  if (tf[SR_TRAIN_precision] && !train_precision(s, tf[SR_TRAIN_precision]->value, &t->precision)) ok = false;
  else if (tf[SR_TRAIN_precision] && !cuda && t->precision != PREC_F32) { /* check says it, as build would */
    diag_error(tf[SR_TRAIN_precision]->value->span, "precision %s needs a mesh of CUDA devices: the cpu backend runs f32 only",
               precision_name(t->precision));
    if (t->mesh && t->mesh->name) diag_note(t->mesh->span, "mesh '%s' has %s devices", t->mesh->name, t->mesh->device.name);
    else if (t->mesh) diag_hint("without a 'mesh' setting the train block runs on one %s device of this machine", t->mesh->device.name);
    diag_hint("use `precision = f32` (or --set train.precision=f32), or a GPU mesh (device = h100_sxm, ...)");
    ok = false;
  }
  t->strategy = (StrategyConf){.is_auto = true, .zero = -1, .recompute = RC_SEARCH, .pipeline = PS_SEARCH,
                               .span = owner};
  if (tf[SR_TRAIN_strategy] && !train_strategy(s, tf[SR_TRAIN_strategy]->value, &t->strategy)) ok = false;
  t->memory = t->mesh ? t->mesh->device.memory : 0;
  row_num(s, tf, SR_TRAIN_memory, &t->memory, &ok);
  if (tf[SR_TRAIN_memory] && t->mesh && t->memory > t->mesh->device.memory)
    diag_warning(tf[SR_TRAIN_memory]->value->span, "memory budget %s exceeds the device's %s",
                 cp_bytes_str(t->memory), cp_bytes_str(t->mesh->device.memory));
  row_int(s, tf, SR_TRAIN_seed, &t->seed, &ok);
  train_objects(s, it, tf, t, &ok);
  if (!train_consistent(t, tf)) ok = false; /* on what was read; a failed read pins nothing */
  return ok;
}

/* Names of the train blocks for messages: "a, b" ("(unnamed)" for one without). */
static const char *train_list(const Item *const *trains, int n) {
  StrBuf b = {0};
  for (int i = 0; i < n; i++) sb_printf(&b, "%s%s", i ? ", " : "", trains[i]->name ? trains[i]->name : "(unnamed)");
  return sb_str(&b);
}

/* The train block selected by name, or the only one. NULL (diagnosed unless
 * there is none at all and no name was asked for, *none set). */
static Item *train_select(Sema *s, const char *train_name, bool *none) {
  Program *p = sema_program(s);
  VEC(Item *) trains = {0};
  for (int i = 0; i < p->nitems; i++)
    if (p->items[i]->kind == IT_TRAIN) VEC_PUSH(trains, p->items[i]);
  if (none) *none = false;
  if (train_name) {
    const char **names = cp_alloc(sizeof *names * (size_t)(trains.n + 1));
    int nn = 0;
    for (int i = 0; i < trains.n; i++) {
      if (trains.a[i]->name && strcmp(trains.a[i]->name, train_name) == 0) return trains.a[i];
      if (trains.a[i]->name) names[nn++] = trains.a[i]->name;
    }
    if (trains.n == 0) diag_error(SPAN_NONE, "--train %s: this file has no train block", train_name);
    else diag_error(SPAN_NONE, "--train %s: no train block named '%s' (this file has: %s)", train_name,
                    train_name, train_list((const Item *const *)trains.a, trains.n));
    hint_closest(train_name, names, nn);
    return NULL;
  }
  if (trains.n == 1) return trains.a[0];
  if (trains.n == 0) {
    if (none) *none = true;
    return NULL;
  }
  int unnamed = -1, nunnamed = 0; /* the one unnamed block among named ones is the default */
  for (int i = 0; i < trains.n; i++)
    if (!trains.a[i]->name) unnamed = i, nunnamed++;
  if (nunnamed == 1) return trains.a[unnamed];
  diag_error(SPAN_NONE, "this file has %d train blocks (%s): pass --train NAME", trains.n,
             train_list((const Item *const *)trains.a, trains.n));
  if (nunnamed > 1) diag_hint("name all but one: the unnamed train block is the default, the others are chosen by name");
  return NULL;
}

TrainConf *settings_train(Sema *s, const char *train_name, bool *none) {
  bool nothing = false;
  Item *it = train_select(s, train_name, &nothing);
  if (none) *none = nothing;
  if (!it) return NULL;
  TrainConf *t = cp_alloc(sizeof *t);
  t->name = it->name;
  t->span = it->name ? it->name_span : span_head(it->span, 5);
  return train_read(s, it, t) ? t : NULL;
}

/* ---- --set overrides ---------------------------------------------------------------------- */
/* The whole `key=value` text is registered as one source, so a diagnostic about
 * the key or the value points into it. The value is parsed from a second source
 * that is the same text with the key blanked out, so its byte offsets match; its
 * spans are then moved over to the first source. */

typedef struct Comp {
  const char *text;
  Span span;
} Comp;

enum { MAX_COMPS = 8 };

static void remap_spans(Expr *e, int from, int to) {
  if (!e) return;
  if (e->span.file == from) e->span.file = to;
  if (e->name_span.file == from) e->name_span.file = to;
  remap_spans(e->lhs, from, to);
  remap_spans(e->rhs, from, to);
  for (int i = 0; i < e->nitems; i++) remap_spans(e->items[i], from, to);
  for (int i = 0; i < e->nfields; i++) {
    if (e->fields[i].name_span.file == from) e->fields[i].name_span.file = to;
    remap_spans(e->fields[i].value, from, to);
  }
}

/* Sets `name = v` among an expression's fields: replaces it or appends it. */
static void fields_set(Expr *e, Comp c, Expr *v) {
  for (int i = 0; i < e->nfields; i++)
    if (strcmp(e->fields[i].name, c.text) == 0) {
      e->fields[i].value = v;
      return;
    }
  Field *nf = cp_alloc(sizeof *nf * (size_t)(e->nfields + 1));
  if (e->nfields) memcpy(nf, e->fields, sizeof *nf * (size_t)e->nfields);
  nf[e->nfields++] = (Field){c.text, c.span, v};
  e->fields = nf;
}

/* The name of a call's i-th positional argument, or NULL. */
static const char *positional_name(Sema *s, const Expr *call, SetKind k, int i) {
  if (k == SK_MODEL) {
    const Item *m = sema_find_item(s, call->str);
    return m && m->kind == IT_MODEL && i < m->nparams ? m->params[i].name : NULL;
  }
  int rows[CA__COUNT], n = fn_args(call->str, rows);
  return i < n ? call_args[rows[i]].arg : NULL;
}

/* An argument of a call: replaces a positional one of that name, else the keyword. */
static void call_set(Sema *s, Expr *call, SetKind k, Comp c, Expr *v) {
  for (int i = 0; i < call->nitems; i++) {
    const char *pn = positional_name(s, call, k, i);
    if (pn && strcmp(pn, c.text) == 0) {
      call->items[i] = v;
      return;
    }
  }
  fields_set(call, c, v);
}

/* The value a `KEY.ENTRY` override writes into: a call, a named list or an
 * object. A bare name becomes a call (adamw -> adamw()) or, for auto, an empty
 * object; a key the file leaves out gets its default container. */
static Expr *override_container(Setting *st, SetKind k, Comp key) {
  Expr *e = st ? st->value : NULL;
  bool callish = k == SK_MODEL || k == SK_OPTIMIZER || k == SK_SCHEDULE || k == SK_DATA;
  if (e && e->kind == EX_NAME && callish) {
    Expr *c = ast_expr(EX_CALL, e->span);
    c->str = e->str;
    c->name_span = e->span;
    return c;
  }
  if (e && e->kind == EX_NAME && k == SK_STRATEGY) return ast_expr(EX_OBJECT, e->span);
  if (e) return e;
  if (k == SK_OPTIMIZER) {
    Expr *c = ast_expr(EX_CALL, key.span);
    c->str = "adamw";
    c->name_span = key.span;
    return c;
  }
  if (k == SK_STRATEGY || k == SK_OBJECT || k == SK_DEVICE) return ast_expr(EX_OBJECT, key.span);
  if (k == SK_SHAPE) return ast_expr(EX_NAMED_LIST, key.span);
  return NULL;
}

static Setting *setting_append(Setting ***set, int *n, Comp key, Expr *value) {
  Setting **ns = cp_alloc(sizeof *ns * (size_t)(*n + 1));
  if (*n) memcpy(ns, *set, sizeof *ns * (size_t)*n);
  Setting *st = cp_alloc(sizeof *st);
  st->key = key.text;
  st->key_span = key.span;
  st->span = value ? span_join(key.span, value->span) : key.span;
  st->value = value;
  ns[(*n)++] = st;
  *set = ns;
  return st;
}

static Setting *setting_find(Setting **set, int n, const char *key) {
  for (int i = 0; i < n; i++)
    if (!set[i]->is_block && strcmp(set[i]->key, key) == 0) return set[i];
  return NULL;
}

static bool override_in(Sema *s, Setting ***set, int *nset, const Comp *c, int n, Expr *v, Table tb);

/* mesh.NAME.link.AXIS.KEY=VALUE: into the link block of that axis (made if absent;
 * the mesh check reports an axis that does not exist). */
static bool override_link(Sema *s, Setting ***set, int *nset, const Comp *c, int n, Expr *v) {
  if (n != 3) {
    diag_error(c[0].span, "link settings are set as mesh.NAME.link.AXIS.KEY=VALUE");
    return false;
  }
  Setting *blk = NULL;
  for (int i = 0; i < *nset; i++)
    if ((*set)[i]->is_block && strcmp((*set)[i]->key, "link") == 0 && (*set)[i]->block_name &&
        strcmp((*set)[i]->block_name, c[1].text) == 0)
      blk = (*set)[i];
  if (!blk) {
    blk = setting_append(set, nset, c[0], NULL);
    blk->is_block = true;
    blk->block_name = c[1].text;
    blk->block_name_span = c[1].span;
  }
  return override_in(s, &blk->body, &blk->nbody, c + 2, 1, v, TB_LINK);
}

/* A bare name given on the command line for a setting of fixed choices (row) is a string:
 * --set train.strategy.pipeline=gpipe, as a shell user writes it (in a file the quotes stay
 * required); one that is not a choice is reported as such. */
static Expr *bare_choice(int row, Expr *v) {
  if (row < 0 || settings_table[row].kind != SK_ENUM || v->kind != EX_NAME) return v;
  Expr *str = ast_expr(EX_STR, v->span);
  str->str = v->str;
  return str;
}

/* Applies KEY[.ENTRY]=v to one settings body checked against table tb. */
static bool override_in(Sema *s, Setting ***set, int *nset, const Comp *c, int n, Expr *v, Table tb) {
  int row = table_find(tb, c[0].text);
  if (row < 0) {
    int nk;
    const char *const *keys = table_keys(tb, &nk);
    diag_error(c[0].span, "unknown %s setting '%s'", table_names[tb], c[0].text);
    hint_keys(c[0].text, tb, keys, nk);
    return false;
  }
  SetKind k = settings_table[row].kind;
  if (k == SK_LINK) return override_link(s, set, nset, c, n, v);
  Setting *st = setting_find(*set, *nset, c[0].text);
  if (n == 1) {
    v = bare_choice(row, v);
    if (st) st->value = v;
    else setting_append(set, nset, c[0], v);
    return true;
  }
  if (n > 2) {
    diag_error(span_join(c[2].span, c[n - 1].span), "'%s.%s' has no entries to set", c[0].text, c[1].text);
    return false;
  }
  Expr *e = override_container(st, k, c[0]);
  if (!e || (e->kind != EX_CALL && e->kind != EX_OBJECT && e->kind != EX_NAMED_LIST)) {
    diag_error(c[1].span, "'%s' has no entry '%s' to set", c[0].text, c[1].text);
    diag_hint("set the whole value: %s=...", c[0].text);
    return false;
  }
  if (!st) st = setting_append(set, nset, c[0], e);
  st->value = e;
  if (e->kind == EX_CALL) call_set(s, e, k, c[1], v);
  else {
    Table sub = settings_table[row].sub;
    fields_set(e, c[1], bare_choice(sub != TB_NONE ? table_find(sub, c[1].text) : -1, v));
  }
  return true;
}

/* Splits the key text [0, len) of source `file` at dots. */
static int split_key(const char *text, int len, int file, Comp *c) {
  int n = 0, start = 0;
  for (int i = 0; i <= len; i++) {
    if (i < len && text[i] != '.') continue;
    if (n == MAX_COMPS) return -1;
    c[n++] = (Comp){cp_strndup(text + start, (size_t)(i - start)), (Span){file, start, i}};
    if (i == start) return -1;
    start = i + 1;
  }
  return n;
}

static bool override_target(Sema *s, const Comp *c, int n, Expr *v, const char *train_name) {
  static const char *const groups[] = {"train", "mesh"};
  if (strcmp(c[0].text, "train") == 0) {
    bool none = false;
    if (n < 2) {
      diag_error(c[0].span, "--set needs a setting after 'train.': for example train.steps=100");
      return false;
    }
    Item *it = train_select(s, train_name, &none);
    if (none) diag_error(c[0].span, "this file has no train block to set '%s' in", c[1].text);
    return it && override_in(s, &it->settings, &it->nsettings, c + 1, n - 1, v, TB_TRAIN);
  }
  if (strcmp(c[0].text, "mesh") == 0) {
    if (n < 3) {
      diag_error(c[0].span, "mesh overrides are written mesh.NAME.KEY=VALUE: for example mesh.laptop.shape.cpu=2");
      return false;
    }
    Item *it = (Item *)sema_find_item(s, c[1].text);
    if (!it || it->kind != IT_MESH) {
      int nm;
      const char *const *meshes = sema_item_names(s, IT_MESH, &nm);
      diag_error(c[1].span, "no mesh named '%s'", c[1].text);
      hint_closest(c[1].text, meshes, nm);
      return false;
    }
    return override_in(s, &it->settings, &it->nsettings, c + 2, n - 2, v, TB_MESH);
  }
  diag_error(c[0].span, "unknown settings group '%s': keys start with 'train.' or 'mesh.'", c[0].text);
  hint_closest(c[0].text, groups, 2);
  return false;
}

static bool override_one(Sema *s, const char *text, const char *train_name) {
  int len = (int)strlen(text);
  int full = src_add("<--set>", text, (size_t)len);
  const char *eq = strchr(text, '=');
  if (!eq || eq == text) {
    diag_error((Span){full, 0, len}, "--set expects KEY=VALUE, got '%s'", text);
    diag_hint("for example --set train.steps=100");
    return false;
  }
  int klen = (int)(eq - text);
  Comp c[MAX_COMPS];
  int n = split_key(text, klen, full, c);
  if (n < 0) {
    diag_error((Span){full, 0, klen}, "malformed key '%.*s': components are names joined by '.'", klen, text);
    return false;
  }
  if (klen + 1 >= len) {
    diag_error((Span){full, klen, klen + 1}, "missing value after '='");
    return false;
  }
  char *padded = cp_strdup(text);
  memset(padded, ' ', (size_t)klen + 1);
  int vf = src_add("<--set>", padded, (size_t)len);
  Expr *v = parse_expr_source(vf);
  if (!v) return false;
  remap_spans(v, vf, full);
  return override_target(s, c, n, v, train_name);
}

bool settings_apply_overrides(Sema *s, const char *const *sets, int nsets, const char *train_name) {
  bool ok = true;
  for (int i = 0; i < nsets && !diag_too_many(); i++)
    if (!override_one(s, sets[i], train_name)) ok = false;
  return ok;
}
