/* calibrate_cmd.h: `cplanc calibrate -o PROFILE.json [--np N] [--quick]` (calibrate_cmd.c). */
#ifndef CPLAN_CALIBRATE_CMD_H
#define CPLAN_CALIBRATE_CMD_H

#include "cplan.h"

typedef struct CalibrateOpts {
  const char *out;   /* -o: the profile file to write */
  int np;            /* --np: ranks to measure on (1: no collectives) */
  bool quick;        /* --quick: small sizes, few repetitions (tests) */
} CalibrateOpts;

/* Runs cplan-calibrate (tools/calibrate.c), under the MPI launcher for np > 1, which prints its
 * table as it measures and writes OUT.tmp; checks that file and renames it to OUT. Returns false
 * after a diagnostic (bad path, no launcher or no cplan-calibrate, a failed measurement). */
bool calibrate_run(const CalibrateOpts *o);

#endif
