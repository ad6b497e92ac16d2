/* fuzz_parse.c: libFuzzer target for the front end. Every input is a .cplan file:
 * it is parsed and, when it parses cleanly, indexed by sema, its train block
 * checked, and every model whose params all have defaults elaborated. Nothing may
 * crash, hang or leak (the arena is reset between inputs). */
#include <stddef.h>
#include <stdint.h>

#include "ast.h"
#include "sema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A model can be built without a train block when every param has a default. */
static bool all_defaults(const Item *it) {
  for (int i = 0; i < it->nparams; i++)
    if (!it->params[i].def) return false;
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  diag_reset();
  diag_set_output(NULL);
  src_reset();
  cp_arena_reset();
  int file = src_add("fuzz.cplan", (const char *)data, size);
  Program *prog = parse_program_source(file);
  if (!prog || diag_errors() > 0) return 0;
  Sema *s = sema_new(prog);
  bool none = false;
  settings_train(s, NULL, &none);
  for (int i = 0; i < prog->nitems && !diag_too_many(); i++) {
    const Item *it = prog->items[i];
    if (it->kind == IT_MODEL && all_defaults(it)) sema_build_model(s, it, NULL, 2);
  }
  return 0;
}
