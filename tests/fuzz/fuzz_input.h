/* fuzz_input.h: what every fuzz target does first with its input: a fresh front end (no
 * diagnostics printed, an empty arena), the bytes parsed as the file fuzz.cplan, and the program
 * indexed by sema with its train block checked. NULL when it does not parse cleanly. */
#ifndef CPLAN_FUZZ_INPUT_H
#define CPLAN_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>

#include "ast.h"
#include "sema.h"

static Sema *fuzz_input(const uint8_t *data, size_t size, Program **prog, TrainConf **train) {
  diag_reset();
  diag_set_output(NULL);
  src_reset();
  cp_arena_reset();
  int file = src_add("fuzz.cplan", (const char *)data, size);
  *prog = parse_program_source(file);
  if (!*prog || diag_errors() > 0) return NULL;
  Sema *s = sema_new(*prog);
  bool none = false;
  *train = settings_train(s, NULL, &none);
  return s;
}

#endif
