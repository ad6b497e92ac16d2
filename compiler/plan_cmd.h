/* plan_cmd.h: `cplanc plan FILE [--explain] [--json] [--top K] [--trace F] [--report F.html]` and
 * the plan files `build --plan` reads (plan_cmd.c). */
#ifndef CPLAN_PLAN_CMD_H
#define CPLAN_PLAN_CMD_H

#include "sema.h"

typedef struct PlanOpts {
  bool explain;       /* every placement and collective of the strategy explained */
  bool json;          /* format cplan-plan/1 */
  int top;            /* rows of the ranking (0: 5) */
  const char *trace;  /* the simulated step as a Chrome/Perfetto trace, or NULL */
  const char *report; /* a self-contained HTML page, or NULL */
} PlanOpts;

/* Searches the train block's strategy (search.c) and prints the ranking, or with `explain` and a
 * pinned strategy explains it as written (the degrees, stages, placements and collectives).
 * Errors go through diag_error. */
void plan_cmd_run(FILE *out, Sema *s, const TrainConf *t, const PlanOpts *o);

/* Reads the "best" plan of a cplan-plan/1 file into *out (every field pinned; out->span kept).
 * False after a diagnostic ("path: what is wrong"). */
bool plan_load(const char *path, StrategyConf *out);

#endif
