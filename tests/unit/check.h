/* check.h: the one CHECK harness of the C unit tests: a failed check prints its file, line and
 * expression and counts in `failures`; main returns failures != 0. */
#ifndef CPLAN_TEST_CHECK_H
#define CPLAN_TEST_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(c)                                                          \
  do {                                                                    \
    if (!(c)) {                                                           \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
      failures++;                                                         \
    }                                                                     \
  } while (0)

#endif
