/* fuzz_parse.c: libFuzzer target for the front end. Every input is a .cplan file:
 * it is parsed and, when it parses cleanly, indexed by sema, its train block
 * checked, and every model whose params all have defaults elaborated. Nothing may
 * crash, hang or leak (the arena is reset between inputs). */
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A model can be built without a train block when every param has a default. */
static bool all_defaults(const Item *it) {
  for (int i = 0; i < it->nparams; i++)
    if (!it->params[i].def) return false;
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Program *prog;
  TrainConf *train;
  Sema *s = fuzz_input(data, size, &prog, &train);
  if (!s) return 0;
  for (int i = 0; i < prog->nitems && !diag_too_many(); i++) {
    const Item *it = prog->items[i];
    if (it->kind == IT_MODEL && all_defaults(it)) sema_build_model(s, it, NULL, 2);
  }
  return 0;
}
