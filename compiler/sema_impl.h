/* sema_impl.h: what the three sema files share, and nothing else includes.
 *   sema.c        the item index (sema_new and lookups), value helpers
 *   sema_eval.c   compile-time evaluation (sema_eval_const) and constant folding
 *   sema_model.c  elaboration of a model into a Graph (sema_build_model) */
#ifndef CPLAN_SEMA_IMPL_H
#define CPLAN_SEMA_IMPL_H

#include "sema.h"

typedef enum ConstState { CS_TODO, CS_BUSY, CS_DONE } ConstState;

struct Sema {
  Program *prog;
  CpMap index;          /* item name -> index in prog->items (the first one) */
  ConstState *cstate;     /* per item: lazy evaluation of consts, with cycle detection */
  Value *cval;            /* per item: the const's value once CS_DONE */
  const char **names[IT_TRAIN + 1]; /* item names per kind, for "did you mean" */
  int nnames[IT_TRAIN + 1];
  VEC(Span) warned_unused; /* the unused inputs and params warned about (sema_model.c warn_unused) */
  int attn_max_d;          /* > 0: a wider sdpa is computed in the math form (sema_set_attention_limit) */
  DataNeed need_data, need_val; /* what a missing data (validation) file means (sema_need_data) */
};

/* ---- sema.c: values ---- */
Value sema_v_int(int64_t i, Span at);
Value sema_v_float(double f, Span at);
Value sema_v_bool(bool b, Span at);
Value sema_v_err(void);
/* "an int", "a tensor", ... for messages. */
const char *sema_value_desc(Value v);
/* The item index of a name, or -1. */
int sema_item_index(Sema *s, const char *name);
/* The source text of a span (arena), "?" when it has none. */
const char *sema_span_text(Span sp);
/* "fn", "model", ... */
const char *sema_item_kind_name(ItemKind k);
/* After "unknown name": a hint for Python's spellings (True, False, None); whether it gave one. */
bool sema_hint_python_name(const char *name);

/* ---- sema_eval.c: constant folding shared with the model elaborator ---- */
/* The value of const item `item`, evaluated on first use; `use` is where it is used. */
Value sema_const_of(Sema *s, int item, Span use);
/* Folds an operator on two compile-time values (never tensors); reports errors at `at`. */
Value sema_fold_binary(AstOp op, Value a, Value b, Span at);
Value sema_fold_unary(AstOp op, Value a, Span at);

#endif
