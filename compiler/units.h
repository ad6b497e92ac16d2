/* units.h: lookup in units.def, the one table of quantity units. */
#ifndef CPLAN_UNITS_H
#define CPLAN_UNITS_H

typedef enum UnitKind { UK_NONE, UK_BYTES, UK_BANDWIDTH, UK_COMPUTE, UK_TIME } UnitKind;

typedef struct UnitInfo {
  const char *text;  /* as written: "GiB" */
  UnitKind kind;
  double factor;     /* multiply to get the base unit */
} UnitInfo;

extern const UnitInfo unit_table[];
extern const int unit_count;

const UnitInfo *unit_find(const char *text); /* NULL when unknown */
const char *unit_kind_name(UnitKind k);      /* "memory", "bandwidth", "compute", "time" */
const char *unit_kind_example(UnitKind k);   /* "80GiB", "300GBps", ... for hints */

#endif
