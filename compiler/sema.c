/* sema.c: the item index of a program (sema_new): one global namespace across the
 * main file and its imports, duplicate and reserved names, eager checking of consts;
 * lookups used by settings.c and the driver; small value helpers every sema file
 * uses. Evaluation lives in sema_eval.c, model elaboration in sema_model.c. */
#include "sema_impl.h"

#include <string.h>

/* ---- values -------------------------------------------------------------------- */

const char *value_kind_name(ValueKind k) {
  switch (k) {
  case V_ERR: return "error";
  case V_NONE: return "nothing";
  case V_INT: return "int";
  case V_FLOAT: return "float";
  case V_BOOL: return "bool";
  case V_STR: return "str";
  case V_QTY: return "quantity";
  case V_TENSOR: return "tensor";
  case V_TUPLE: return "tuple";
  case V_LIST: return "list";
  }
  return "value";
}

const char *sema_value_desc(Value v) {
  switch (v.kind) {
  case V_INT: return "an int";
  case V_NONE: return "nothing";
  case V_ERR: return "an error";
  case V_QTY: return cp_fmt("a %s quantity", unit_kind_name(v.unit));
  default: return cp_fmt("a %s", value_kind_name(v.kind));
  }
}

Value sema_v_int(int64_t i, Span at) { return (Value){.kind = V_INT, .i = i, .span = at}; }
Value sema_v_float(double f, Span at) { return (Value){.kind = V_FLOAT, .f = f, .span = at}; }
Value sema_v_bool(bool b, Span at) { return (Value){.kind = V_BOOL, .i = b, .span = at}; }
Value sema_v_err(void) { return (Value){.kind = V_ERR, .span = SPAN_NONE}; }

const char *sema_span_text(Span sp) {
  if (sp.file < 0 || sp.hi < sp.lo || (size_t)sp.hi > src_len(sp.file)) return "?";
  return cp_strndup(src_text(sp.file) + sp.lo, (size_t)(sp.hi - sp.lo));
}

const char *sema_item_kind_name(ItemKind k) {
  switch (k) {
  case IT_IMPORT: return "import";
  case IT_CONST: return "const";
  case IT_FN: return "fn";
  case IT_MODEL: return "model";
  case IT_MESH: return "mesh";
  case IT_TRAIN: return "train";
  }
  return "item";
}

/* ---- the index ----------------------------------------------------------------- */

/* Two parameters of one signature with the same name. */
static void check_param_names(const Item *it) {
  for (int i = 0; i < it->nparams; i++)
    for (int j = 0; j < i; j++)
      if (it->params[i].name && it->params[j].name &&
          strcmp(it->params[i].name, it->params[j].name) == 0) {
        diag_error(it->params[i].name_span, "parameter '%s' of '%s' is declared twice",
                   it->params[i].name, it->name);
        diag_note(it->params[j].name_span, "first declared here");
        break;
      }
}

static void index_item(Sema *s, int i) {
  const Item *it = s->prog->items[i];
  if (!it->name) return;
  int prev = cp_map_get(&s->index, it->name);
  if (prev >= 0) {
    const Item *first = s->prog->items[prev];
    diag_error(it->name_span, "'%s' is already defined", it->name);
    diag_note(first->name_span, "first defined here (as a %s)", sema_item_kind_name(first->kind));
    return;
  }
  cp_map_put(&s->index, it->name, i);
  OpId id;
  if ((it->kind == IT_FN || it->kind == IT_MODEL) && ir_op_by_name(it->name, &id)) {
    diag_error(it->name_span, "%s '%s' has the name of a built-in operation",
               sema_item_kind_name(it->kind), it->name);
    diag_hint("built-in operations cannot be redefined; choose another name");
  }
  if (it->kind == IT_FN || it->kind == IT_MODEL) check_param_names(it);
}

static void collect_names(Sema *s) {
  for (int k = 0; k <= IT_TRAIN; k++) {
    s->names[k] = cp_alloc((size_t)(s->prog->nitems + 1) * sizeof(char *));
    for (int i = 0; i < s->prog->nitems; i++) {
      const Item *it = s->prog->items[i];
      if (it->name && (int)it->kind == k && cp_map_get(&s->index, it->name) == i)
        s->names[k][s->nnames[k]++] = it->name;
    }
  }
}

Sema *sema_new(Program *prog) {
  Sema *s = cp_alloc(sizeof *s);
  static Program empty;
  s->prog = prog ? prog : &empty;
  int n = s->prog->nitems;
  s->cstate = cp_alloc((size_t)(n + 1) * sizeof *s->cstate);
  s->cval = cp_alloc((size_t)(n + 1) * sizeof *s->cval);
  for (int i = 0; i < n; i++)
    if (s->prog->items[i]) index_item(s, i);
  collect_names(s);
  /* Consts are lazy (any order works), but every one is checked once here so a
   * bad const is reported even when nothing uses it. */
  for (int i = 0; i < n && !diag_too_many(); i++) {
    const Item *it = s->prog->items[i];
    if (it && it->kind == IT_CONST && it->name && cp_map_get(&s->index, it->name) == i)
      sema_const_of(s, i, it->name_span);
  }
  return s;
}

Program *sema_program(Sema *s) { return s->prog; }

int sema_item_index(Sema *s, const char *name) {
  return name ? cp_map_get(&s->index, name) : -1;
}

const Item *sema_find_item(Sema *s, const char *name) {
  int i = sema_item_index(s, name);
  return i < 0 ? NULL : s->prog->items[i];
}

const char *const *sema_item_names(Sema *s, ItemKind kind, int *n) {
  if ((int)kind < 0 || kind > IT_TRAIN) {
    *n = 0;
    return NULL;
  }
  *n = s->nnames[kind];
  return s->names[kind];
}

void sema_need_data(Sema *s, DataNeed data, DataNeed val) {
  s->need_data = data;
  s->need_val = val;
}

DataNeed sema_data_needed(const Sema *s, bool val) { return val ? s->need_val : s->need_data; }
