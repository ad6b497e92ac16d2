/* check.h: the report of `cplanc check` (check.c), and the whole-program mesh
 * check the driver runs before it (settings.c). */
#ifndef CPLAN_CHECK_H
#define CPLAN_CHECK_H

#include <stdio.h>

#include "ir.h"
#include "sema.h"

/* Checks every mesh item of the program, used or not, so `check` reports a bad
 * mesh even when no train block names it. Each mesh is checked once per Sema:
 * settings_train() reuses the result instead of reporting it twice. Returns false
 * after diagnostics. */
bool settings_check_meshes(Sema *s);

/* The report for a person: model, params, FLOPs, activations, layers, mesh, plan.
 * g was built with B = g->batch; the figures are per sample. t and m may be NULL
 * (a file with no train block). */
void check_print_text(FILE *out, const Graph *g, const TrainConf *t, const MeshConf *m);
/* The same as one pretty-printed JSON object (cJSON); `train` and `mesh` are null
 * when absent. */
void check_print_json(FILE *out, const Graph *g, const TrainConf *t, const MeshConf *m);

#endif
