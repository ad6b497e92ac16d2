/* train.h: turning a forward Graph into a training graph (DESIGN.md §4).
 *
 * autodiff.c appends the backward pass (role ROLE_BWD) and the gradient accumulators;
 * optimizer.c appends clipping and the optimizer update (role ROLE_UPD) per docs/language.md §8.
 * Codegen runs FWD+BWD nodes once per micro-batch and UPD nodes once per optimizer step; the
 * runtime zeroes the unsaved STATEs (the "<path>.grad" accumulators) at every step boundary. */
#ifndef CPLAN_TRAIN_H
#define CPLAN_TRAIN_H

#include "ir.h"
#include "sema.h"

/* Appends the backward pass of g->loss, seeded with 1/accum: GRAD nodes (summed with ADD where a
 * value has several consumers), fills g->grads (parallel to g->params, -1 where the loss does not
 * depend on the param), sets g->accum, and adds per param with a gradient a STATE "<path>.grad"
 * and an ACCUM(state, grad) node. False (with a diagnostic) when the graph has no loss. */
bool ad_backward(Graph *g, int64_t accum);

/* Whether some param reaches g's loss through differentiable ops (true without a loss or params);
 * else an error at the loss, with a note at each op without a gradient that cuts a param off (as
 * PyTorch's "does not require grad"). check calls it too. */
bool ad_loss_trainable(const Graph *g);
/* Of a forward graph: per node, whether the backward pass gives it a gradient (it depends on a
 * param and the loss on it, both through differentiable ops), as ad_backward decides. */
bool *ad_grad_flows(const Graph *g);
/* Whether input k of n carries a gradient back (where's cond does not: it only selects). */
bool ad_grad_input(const Node *n, int k);

/* Appends global-norm clipping (g->grad_norm is always set) and the optimizer update of every
 * param that has a gradient, reading the ACCUM nodes ad_backward made. Requires ad_backward. */
bool opt_lower(Graph *g, const TrainConf *t);

/* The data-parallel degree of the plan: the pinned dp; else, on a mesh of CPU devices, or with
 * tp or pp pinned, the devices tp and pp leave (every device when neither is pinned: for now
 * `strategy = auto` means pure data parallelism on the CPU backend); else 1. */
int64_t train_dp(const TrainConf *t);

/* The micro-batch of one data-parallel rank: the pinned micro, else batch / train_dp(t). */
int64_t train_micro(const TrainConf *t);

/* Whether the plan is placed and lowered to per-rank programs (lower.h): tensor or pipeline
 * parallelism, or ZeRO. Pure data parallelism runs the one-device training graph on every rank. */
bool train_lowered(const TrainConf *t);

/* Whether nothing is left for the search to choose: one device, or a strategy that is not auto
 * and pins every field (the pipeline schedule only under pp). */
bool train_pinned(const TrainConf *t);

/* Whether the mesh's devices are CUDA GPUs: build, run and `emit --stage=c|cuda` take the CUDA
 * backend (codegen/emit_cu.c). */
bool train_cuda(const TrainConf *t);

/* The value B is bound to when the model is elaborated for building: train_micro, or for a
 * lowered plan the global micro-batch dp * train_micro (strat_pin splits it over dp). */
int64_t train_graph_batch(const TrainConf *t);

/* Activation recomputation (recompute.c): under RC_FULL, each layer's forward nodes its GRADs
 * read are cloned (role ROLE_BWD) right before the layer's backward and the GRADs rewired to the
 * clones, so only the values entering a layer live from the forward to the backward; under
 * RC_SELECTIVE only the attention core (sdpa, a hand-written softmax over [.., T, T] scores) is.
 * Every index of g is renumbered. RC_NONE and RC_SEARCH change nothing. */
bool recompute_apply(Graph *g, Recompute mode);

/* Exact vocabulary padding under tensor parallelism (vocab_pad.c): an embedding table [V, C] tp
 * does not divide, read only by lookups and by tied heads x @ transpose(table) whose logits only
 * cross_entropy and argmax read, becomes [vocab_pad_rows(V, tp), C] with V valid rows (PARAM
 * ia[1]; ia[2] the padded dim) and each head's logits masked with -inf past V, so it is
 * vocab-parallel and every value but the pad (zero throughout) is the unpadded model's. An untied
 * head weight [C, V] (and its bias [V]) is padded alike. Before autodiff; renumbers g. True when
 * it padded a param. */
bool vocab_pad(Graph *g, int64_t tp);
/* The forward graph g with the params vocab_pad pads under tp padded and the shapes downstream
 * re-inferred, but no mask inserted, so every node keeps its index (the search prices tp on it:
 * the where is one elementwise op over the logits); g itself when nothing is padded. */
const Graph *vocab_pad_priced(const Graph *g, int64_t tp);
/* Whether vocab_pad pads param p of g (not yet padded) under tp. */
bool vocab_pad_fits(const Graph *g, int p, int64_t tp);
/* The rows of a vocabulary of v padded for tp: the next multiple of tp (and of 128 from v = 1024
 * on, as llm.c's 50304 for GPT-2's 50257); v when tp divides it. */
int64_t vocab_pad_rows(int64_t v, int64_t tp);

/* ad_backward with accum = batch / (dp * micro) (B of g must be bound to the micro-batch), then
 * opt_lower, recompute_apply (t's strategy.recompute) and ir_verify. False after a diagnostic
 * (also when batch is not a multiple of dp * micro). */
bool train_graph(Graph *g, const TrainConf *t);

#endif
