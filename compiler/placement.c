/* placement.c: placements S(d) / R / P (docs/language.md §7) and the resharding table: which
 * collective changes one placement into another on a mesh axis, and how many bytes it moves. */
#include "placement.h"

Pl pl_r(void) { return (Pl){PL_R, 0}; }
Pl pl_p(void) { return (Pl){PL_P, 0}; }
Pl pl_s(int dim) { return (Pl){PL_S, dim}; }

bool pl_eq(Pl a, Pl b) { return a.kind == b.kind && (a.kind != PL_S || a.dim == b.dim); }

const char *pl_str(Pl p) {
  switch (p.kind) {
  case PL_R: return "R";
  case PL_P: return "P";
  case PL_S: return cp_fmt("S(%d)", p.dim);
  case PL_ANY: return "*";
  }
  cp_unreachable();
}

const char *placement_str(const Placement *p) {
  StrBuf b = {0};
  sb_puts(&b, "[");
  for (int i = 0; i < p->naxes; i++) sb_printf(&b, "%s%s", i ? ", " : "", pl_str(p->ax[i]));
  sb_puts(&b, "]");
  return sb_str(&b);
}

/* The resharding table. Checklist: a new placement kind needs a row here and a case in
 * tests/unit/test_placement.c. */
Collective pl_reshard(Pl from, Pl to) {
  if (pl_eq(from, to)) return COLL_NONE;
  switch (from.kind) {
  case PL_P: return to.kind == PL_R ? COLL_ALL_REDUCE : COLL_REDUCE_SCATTER;
  case PL_S: return to.kind == PL_R ? COLL_ALL_GATHER : to.kind == PL_S ? COLL_ALL_TO_ALL : COLL_LOCAL_ZERO;
  case PL_R: return to.kind == PL_S ? COLL_LOCAL_SLICE : COLL_LOCAL_ZERO;
  case PL_ANY: break;
  }
  cp_unreachable();
}

const char *pl_coll_name(Collective c) {
  static const char *const names[] = {"none", "all-reduce", "reduce-scatter", "all-gather",
                                      "all-to-all", "local slice", "local zero-fill"};
  return names[c];
}

double pl_coll_bytes(Collective c, double bytes, int64_t n) {
  double f = n > 1 ? (double)(n - 1) / (double)n : 0;
  switch (c) {
  case COLL_ALL_REDUCE: return 2 * f * bytes;
  case COLL_REDUCE_SCATTER:
  case COLL_ALL_GATHER: return f * bytes;
  case COLL_ALL_TO_ALL: return f * bytes / (double)(n > 0 ? n : 1);
  default: return 0;
  }
}
