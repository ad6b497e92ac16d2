/* plan_cmd.h: `cplanc plan FILE [--explain] [--json]` (plan_cmd.c). */
#ifndef CPLAN_PLAN_CMD_H
#define CPLAN_PLAN_CMD_H

#include "sema.h"

/* Elaborates the train block's model for the strategy's global micro-batch, builds the training
 * graph, pins the strategy (strategy.c) and prints it: a summary, or with `explain` every
 * param's and activation's placement and every collective. Errors go through diag_error. */
void plan_cmd_run(FILE *out, Sema *s, const TrainConf *t, bool explain, bool json);

#endif
