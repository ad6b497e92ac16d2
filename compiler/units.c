/* units.c: the units table (units.def) as data, and lookups over it. */
#include "units.h"

#include <string.h>

const UnitInfo unit_table[] = {
#define UNIT(text, kind, factor) {text, kind, factor},
#include "units.def"
#undef UNIT
};
const int unit_count = (int)(sizeof unit_table / sizeof unit_table[0]);

const UnitInfo *unit_find(const char *text) {
  for (int i = 0; i < unit_count; i++)
    if (strcmp(unit_table[i].text, text) == 0) return &unit_table[i];
  return 0;
}

const char *unit_kind_name(UnitKind k) {
  switch (k) {
  case UK_BYTES: return "memory";
  case UK_BANDWIDTH: return "bandwidth";
  case UK_COMPUTE: return "compute";
  case UK_TIME: return "time";
  case UK_NONE: break;
  }
  return "plain number";
}

const char *unit_kind_example(UnitKind k) {
  switch (k) {
  case UK_BYTES: return "80GiB";
  case UK_BANDWIDTH: return "300GBps";
  case UK_COMPUTE: return "312TFLOPS";
  case UK_TIME: return "2us";
  case UK_NONE: break;
  }
  return "42";
}
