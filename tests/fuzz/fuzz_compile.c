/* fuzz_compile.c: libFuzzer target for the whole compiler behind the front end. Every input is a
 * .cplan file with a train block: parsed, checked, its model elaborated for the train block's
 * batch, then lowered as `cplanc emit --stage=c` does (autodiff, the optimizer, the strategy's
 * placement and lowering, pipeline stages, fusion, the memory plan) and plan.c printed to
 * /dev/null. A strategy the search would complete (`strategy = auto`, or fields left out on a mesh
 * of several devices) is skipped: the search takes seconds a try. Nothing may crash or hang;
 * leaks are not checked (-detect_leaks=0: the middle end allocates per compile, as cplanc exits). */
#include <stdio.h>

#include "build.h"
#include "fuzz_input.h"
#include "train.h"
#include "../../kernels/cuda/attn_layout.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static FILE *sink;
  if (!sink && !(sink = fopen("/dev/null", "w"))) return 0;
  Program *prog;
  TrainConf *t;
  Sema *s = fuzz_input(data, size, &prog, &t);
  if (!s || !t || diag_errors() > 0 || !train_pinned(t)) return 0;
  if (train_cuda(t)) sema_set_attention_limit(s, CPLAN_ATTN_MAX_HEAD_DIM);
  Graph *g = sema_train_graph(s, t, train_graph_batch(t));
  if (g) build_emit_c(sink, g, t);
  return 0;
}
