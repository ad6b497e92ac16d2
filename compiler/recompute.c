/* recompute.c: activation recomputation of a training graph (docs/language.md §6, `recompute`).
 *
 * Codegen plans memory by liveness in node order, so a forward value a GRAD reads lives from the
 * forward pass to that GRAD. This pass trades compute for that memory: it clones forward nodes into
 * the backward pass, right before the first GRAD of one of them, and points the GRADs of the cloned
 * nodes at the clones, so the originals die during the forward pass.
 *   full:      per layer (g->layer_names), every non-leaf forward node of the layer that the
 *              layer's GRADs read, with what those need inside the layer (Megatron's full
 *              recompute). Values entering the layer (the residual stream, params, inputs) are
 *              read as they are. The GRADs of other layers keep reading the originals: the layer's
 *              output lives until the next layer's backward, as its input there.
 *   selective: only the attention core, the memory that grows as T²: sdpa nodes (whose kernel
 *              keeps the softmax probabilities in an aux buffer for its backward), and for
 *              attention written by hand the softmax over a [.., T, T] score tensor with the
 *              same-shaped values around it (the scores, scale and mask before it, dropout after)
 *              and the node that reads them (probs @ v). The sdpa output is not T² and stays: the
 *              GRAD of its reader (merge_heads) reads the original.
 * The clones have role ROLE_BWD (evaluation never runs them), the layer and span of their
 * original, and run the same kernels on the same inputs, so training is unchanged. A GRAD of a
 * cloned node lists the clone's inputs and the clone ([dy, inputs..., fwd], as ops.c's shape rule
 * and lower.c want): emitters take the forward output, aux buffers (norm, softmax and attention
 * statistics) and the dropout key from n->fwd. A dropout's ia[0] names the node whose key it uses,
 * plus one (0: its own index; emit_c.c's dropout_key), and this pass sets it on the original and
 * the clone alike, so both draw the same mask whatever later passes renumber. */
#include "train.h"

#include <string.h>

static bool is_leaf(const Node *n) { return (ir_ops[n->op].flags & OPF_LEAF) != 0; }

/* Index of the first node that is not forward; every node from there on is backward or update. */
static int forward_end(const Graph *g) {
  int nf = 0;
  while (nf < g->n && g->nodes[nf].role == ROLE_FWD) nf++;
  for (int i = nf; i < g->n; i++) cp_assert(g->nodes[i].role != ROLE_FWD);
  return nf;
}

/* Whether forward node v can be a clone of layer l (full): computed inside the layer. */
static bool cloneable(const Graph *g, int nf, int v, int l) {
  return v < nf && g->nodes[v].layer == l && !is_leaf(&g->nodes[v]);
}

/* full: grp[v] = layer of v for the nodes the layer's GRADs read (each GRAD's forward node among
 * them), closed over their inputs inside the layer. */
static void mark_full(const Graph *g, int nf, int *grp) {
  for (int j = nf; j < g->n; j++) {
    const Node *n = &g->nodes[j];
    if (n->op != OP_GRAD) continue;
    int l = g->nodes[n->fwd].layer;
    if (l < 0) continue;
    for (int k = 1; k < n->nin; k++)
      if (cloneable(g, nf, n->in[k], l)) grp[n->in[k]] = l;
  }
  for (int v = nf - 1; v >= 0; v--) { /* inputs come first: one pass down closes the set */
    if (grp[v] < 0) continue;
    const Node *n = &g->nodes[v];
    for (int k = 0; k < n->nin; k++)
      if (cloneable(g, nf, n->in[k], grp[v])) grp[n->in[k]] = grp[v];
  }
}

/* A softmax over the last dim of a [.., T, T] tensor: attention probabilities. */
static bool is_attention_softmax(const Node *n) {
  int r = n->shape.rank;
  return n->op == OP_SOFTMAX && r >= 3 && n->shape.d[r - 1] == n->shape.d[r - 2];
}

/* Grows the hand-written attention probabilities (not sdpa, which keeps its own q, k, v) by one
 * step into their same-shaped, same-layer neighbourhood: the producers (scores, scale, mask) and
 * pointwise consumers (dropout). True when it grew. */
static bool grow_scores(const Graph *g, int nf, int *grp) {
  bool grew = false;
  for (int v = 0; v < nf; v++) {
    const Node *n = &g->nodes[v];
    if (is_leaf(n) || n->op == OP_SDPA) continue;
    bool pointwise = (ir_ops[n->op].flags & OPF_ELEMENTWISE) || n->op == OP_DROPOUT;
    for (int k = 0; k < n->nin; k++) {
      const Node *u = &g->nodes[n->in[k]];
      if (u->layer != n->layer || !shape_eq(&u->shape, &n->shape) || u->op == OP_SDPA) continue;
      if (grp[v] >= 0 && grp[n->in[k]] < 0 && !is_leaf(u)) grp[n->in[k]] = grp[v], grew = true;
      if (grp[n->in[k]] >= 0 && grp[v] < 0 && pointwise) grp[v] = grp[n->in[k]], grew = true;
    }
  }
  return grew;
}

/* selective: grp[v] = layer + 1 (0 outside layers) for the attention core: sdpa nodes; the
 * hand-written scores-to-probabilities region and the node that consumes it (probs @ v, whose
 * GRAD would otherwise keep the probabilities alive). */
static void mark_selective(const Graph *g, int nf, int *grp) {
  for (int v = 0; v < nf; v++) {
    const Node *n = &g->nodes[v];
    if (n->op == OP_SDPA || is_attention_softmax(n)) grp[v] = n->layer + 1;
  }
  while (grow_scores(g, nf, grp)) {
  }
  int *eat = cp_alloc((size_t)(nf > 0 ? nf : 1) * sizeof *eat); /* the consumers, found first */
  for (int v = 0; v < nf; v++) {
    const Node *n = &g->nodes[v];
    eat[v] = -1;
    for (int k = 0; k < n->nin && grp[v] < 0 && !is_leaf(n); k++) {
      const Node *u = &g->nodes[n->in[k]];
      if (grp[n->in[k]] >= 0 && u->op != OP_SDPA && u->layer == n->layer) eat[v] = grp[n->in[k]];
    }
  }
  for (int v = 0; v < nf; v++)
    if (eat[v] >= 0) grp[v] = eat[v];
}

/* at[q]: the first GRAD of a node of group q (its clones go right before it), or -1 when there
 * is none (then nothing of q is cloned). */
static int *insertion_points(const Graph *g, int nf, const int *grp, int ngroups) {
  int *at = cp_alloc((size_t)(ngroups > 0 ? ngroups : 1) * sizeof *at);
  for (int q = 0; q < ngroups; q++) at[q] = -1;
  for (int j = nf; j < g->n; j++) {
    const Node *n = &g->nodes[j];
    if (n->op != OP_GRAD) continue;
    int q = n->fwd < nf ? grp[n->fwd] : -1;
    if (q >= 0 && at[q] < 0) at[q] = j;
  }
  return at;
}

typedef struct Rebuild {
  const Graph *g;
  Node *nodes;  /* the new node array */
  int n;
  int *map;     /* old index -> new index of the node itself */
  int *clone;   /* old index -> new index of its clone, -1 before the clone exists */
} Rebuild;

static int *copy_ints(const int *a, int n) {
  int *b = cp_alloc((size_t)(n > 0 ? n : 1) * sizeof *b);
  if (n > 0) memcpy(b, a, (size_t)n * sizeof *b);
  return b;
}

/* Appends the clone of forward node v (group q): inputs cloned in the group read the clones. */
static void emit_clone(Rebuild *r, int v, int q, const int *grp) {
  const Node *o = &r->g->nodes[v];
  Node *c = &r->nodes[r->n];
  *c = *o;
  c->in = copy_ints(o->in, o->nin);
  for (int k = 0; k < o->nin; k++) {
    int u = o->in[k];
    c->in[k] = grp[u] == q && r->clone[u] >= 0 ? r->clone[u] : r->map[u];
  }
  c->role = ROLE_BWD;
  c->fwd = -1;
  if (o->op == OP_DROPOUT) { /* one mask: the original's key for both */
    if (r->nodes[r->map[v]].ia[0] == 0) r->nodes[r->map[v]].ia[0] = r->map[v] + 1;
    c->ia[0] = r->nodes[r->map[v]].ia[0];
  }
  r->clone[v] = r->n++;
}

/* Appends old node j with its references renumbered; a GRAD of a cloned node reads the clone. */
static void emit_node(Rebuild *r, int j) {
  const Node *o = &r->g->nodes[j];
  Node *n = &r->nodes[r->n];
  *n = *o;
  n->in = copy_ints(o->in, o->nin);
  for (int k = 0; k < o->nin; k++) n->in[k] = r->map[o->in[k]];
  if (o->op == OP_GRAD) {
    int cf = r->clone[o->fwd];
    n->fwd = r->map[o->fwd];
    if (cf >= 0) { /* [dy, the clone's inputs..., the clone], as the shape rule and lower.c want */
      cp_assert(r->nodes[cf].nin == o->nin - 2);
      memcpy(n->in + 1, r->nodes[cf].in, (size_t)(o->nin - 2) * sizeof *n->in);
      n->in[o->nin - 1] = n->fwd = cf;
    }
  }
  if (o->op == OP_STATE) n->ia[0] = r->map[o->ia[0]];
  r->map[j] = r->n++;
}

static void remap_list(int *a, int n, const int *map) {
  for (int k = 0; k < n; k++)
    if (a[k] >= 0) a[k] = map[a[k]];
}

/* g with the clones of every group q (grp[v] = q) emitted before at[q]. */
static void rebuild(Graph *g, const int *grp, const int *at, int ngroups) {
  int nclones = 0;
  for (int v = 0; v < g->n; v++) nclones += grp[v] >= 0 && at[grp[v]] >= 0;
  Rebuild r = {.g = g};
  r.nodes = cp_alloc((size_t)(g->n + nclones) * sizeof *r.nodes);
  r.map = cp_alloc((size_t)g->n * sizeof *r.map);
  r.clone = cp_alloc((size_t)g->n * sizeof *r.clone);
  for (int v = 0; v < g->n; v++) r.clone[v] = -1;
  /* the groups by insertion point (at_first[j], then at_next[q]) and each group's nodes (first[q],
   * then next[v]), in increasing order, so each j costs its own groups, not all of them */
  int *at_first = cp_alloc((size_t)(g->n + 1) * sizeof *at_first), *at_next = cp_alloc((size_t)(ngroups + 1) * sizeof *at_next);
  int *first = cp_alloc((size_t)(ngroups + 1) * sizeof *first), *next = cp_alloc((size_t)(g->n + 1) * sizeof *next);
  for (int j = 0; j < g->n; j++) at_first[j] = -1;
  for (int q = ngroups - 1; q >= 0; q--)
    if (at[q] >= 0 && at[q] < g->n) at_next[q] = at_first[at[q]], at_first[at[q]] = q;
  for (int q = 0; q < ngroups; q++) first[q] = -1;
  for (int v = g->n - 1; v >= 0; v--)
    if (grp[v] >= 0 && grp[v] < ngroups) next[v] = first[grp[v]], first[grp[v]] = v;
  for (int j = 0; j < g->n; j++) {
    for (int q = at_first[j]; q >= 0; q = at_next[q])
      for (int v = first[q]; v >= 0 && v < j; v = next[v]) emit_clone(&r, v, q, grp);
    emit_node(&r, j);
  }
  cp_assert(r.n == g->n + nclones);
  remap_list(g->params.a, g->params.n, r.map);
  remap_list(g->inputs.a, g->inputs.n, r.map);
  remap_list(g->grads.a, g->grads.n, r.map);
  remap_list(g->states.a, g->states.n, r.map);
  for (int k = 0; k < g->metrics.n; k++) g->metrics.a[k].node = r.map[g->metrics.a[k].node];
  remap_list(&g->loss, 1, r.map);
  remap_list(&g->grad_norm, 1, r.map);
  remap_list(&g->seed, 1, r.map);
  g->nodes = r.nodes;
  g->n = g->cap = r.n;
}

bool recompute_apply(Graph *g, Recompute mode) {
  if ((mode != RC_FULL && mode != RC_SELECTIVE) || g->seed < 0) return true;
  if (mode == RC_FULL && g->layer_names.n == 0) {
    diag_warning(SPAN_NONE, "recompute = \"full\" recomputes each layer (each iteration of a `for` loop), and model '%s' "
                 "has none: nothing is recomputed", g->model_name ? g->model_name : "?");
    return true;
  }
  int nf = forward_end(g);
  int *grp = cp_alloc((size_t)g->n * sizeof *grp);
  for (int v = 0; v < g->n; v++) grp[v] = -1;
  int ngroups = g->layer_names.n + (mode == RC_SELECTIVE);
  if (mode == RC_FULL) mark_full(g, nf, grp);
  else mark_selective(g, nf, grp);
  int *at = insertion_points(g, nf, grp, ngroups);
  rebuild(g, grp, at, ngroups);
  char err[512];
  if (!ir_verify(g, err, sizeof err)) cp_panic(__FILE__, __LINE__, "recompute made a bad graph: %s", err);
  return true;
}
