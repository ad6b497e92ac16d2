/* shard.c: the sharding rules of every op family (the `shard` column of ops.def).
 *
 * A rule sees the placements of a node's inputs on ONE mesh axis of n devices and either accepts
 * them (setting the output's placement) or says why not, suggesting in want[] the reshard that
 * would fix it. Accepted combinations are the op's strategies (Alpa's per-node strategy set);
 * shard_candidates() enumerates them. An R input may always stand where an S is needed: each
 * device slices its part locally (no communication). */
#include "placement.h"

#include <string.h>

static const Shape *in_shape(const Graph *g, const Node *n, int i) { return &g->nodes[n->in[i]].shape; }

static bool reject(ShardIO *io, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool reject(ShardIO *io, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(io->why, sizeof io->why, fmt, ap);
  va_end(ap);
  return false;
}

/* A split of a dim of `size` over n devices needs equal shards. */
static bool divisible(ShardIO *io, int64_t size, int dim) {
  if (size % io->n == 0) return true;
  return reject(io, "dim %d (%lld) is not divisible by %lld devices", dim, (long long)size, (long long)io->n);
}

static void want_all(ShardIO *io, int nin, Pl p) {
  for (int i = 0; i < nin && i < 8; i++) io->want[i] = p;
}

static int count_kind(const ShardIO *io, int nin, PlKind k) {
  int c = 0;
  for (int i = 0; i < nin; i++) c += io->in[i].kind == k;
  return c;
}

bool shard_leaf(const Graph *g, const Node *n, ShardIO *io) {
  (void)g, (void)n;
  io->out = pl_r();
  return true;
}

/* Ops that need every input whole (nothing pinned ever splits them). */
bool shard_none(const Graph *g, const Node *n, ShardIO *io) {
  (void)g;
  if (count_kind(io, n->nin, PL_R) == n->nin) return shard_leaf(g, n, io);
  want_all(io, n->nin, pl_r());
  return reject(io, "%s runs on whole tensors only", ir_ops[n->op].name);
}

/* The output dim an input dim lands on under NumPy broadcasting (-1: a broadcast dim of size 1). */
static int bcast_dim(const Graph *g, const Node *n, int i, int d) {
  const Shape *s = in_shape(g, n, i);
  int od = d + n->shape.rank - s->rank;
  return s->d[d] == 1 && n->shape.d[od] != 1 ? -1 : od;
}

/* Elementwise ops: every split input must land on the same output dim; R inputs are sliced
 * locally. P passes through linear ops only: add/sub of all-P inputs, neg/dropout of P, and
 * mul/div with one P operand (the numerator for div) and the rest R. */
static bool elementwise(const Graph *g, const Node *n, ShardIO *io, bool linear) {
  int od = -2, np = count_kind(io, n->nin, PL_P);
  for (int i = 0; i < n->nin; i++) {
    if (io->in[i].kind != PL_S) continue;
    int d = bcast_dim(g, n, i, io->in[i].dim);
    if (d < 0) {
      io->want[i] = pl_r();
      return reject(io, "input %d is split along dim %d, which it broadcasts", i, io->in[i].dim);
    }
    if (od != -2 && od != d) {
      io->want[i] = pl_r();
      return reject(io, "inputs are split along different dims");
    }
    od = d;
  }
  bool unary = n->nin == 1, addsub = n->op == OP_ADD || n->op == OP_SUB;
  bool ok_p = np == 0 || (linear && od == -2 &&
                          ((unary) || (addsub && np == n->nin) ||
                           ((n->op == OP_MUL || (n->op == OP_DIV && io->in[0].kind == PL_P)) && np == 1)));
  if (!ok_p) {
    for (int i = 0; i < n->nin; i++)
      if (io->in[i].kind == PL_P) {
        int d = od - (n->shape.rank - in_shape(g, n, i)->rank);
        io->want[i] = od >= 0 && d >= 0 ? pl_s(d) : pl_r();
      }
    return reject(io, "partial sums do not pass through %s%s", ir_ops[n->op].name,
                  od >= 0 ? " next to a split input" : "");
  }
  if (od >= 0 && !divisible(io, n->shape.d[od], od)) return false;
  io->out = np ? pl_p() : od >= 0 ? pl_s(od) : pl_r();
  return true;
}

bool shard_elementwise(const Graph *g, const Node *n, ShardIO *io) {
  bool linear = n->op == OP_ADD || n->op == OP_SUB || n->op == OP_MUL || n->op == OP_DIV || n->op == OP_NEG ||
                n->op == OP_DROPOUT;
  return elementwise(g, n, io, linear);
}

bool shard_nonlinear(const Graph *g, const Node *n, ShardIO *io) { return elementwise(g, n, io, false); }

static bool reduced(const Node *n, int d) {
  if (n->op == OP_ARGMAX) return n->ia[0] == d;
  if (n->ndims < 0) return true;
  for (int i = 0; i < n->ndims; i++)
    if (n->dims[i] == d) return true;
  return false;
}

/* sum/mean of a split dim leaves partial sums (P); max cannot (no max-reduce in the vocabulary).
 * argmax of the split last dim is vocab-parallel (Megatron): each device's row maximum and its
 * global index are all-gathered, two floats per row, and every device picks the first maximum:
 * the result is whole (R). Other split dims move down past the reduced ones unless keepdims. */
bool shard_reduce(const Graph *g, const Node *n, ShardIO *io) {
  bool sumlike = n->op == OP_SUM || n->op == OP_MEAN;
  Pl x = io->in[0];
  if (x.kind == PL_R) return shard_leaf(g, n, io);
  const Shape *s = in_shape(g, n, 0);
  if (n->op == OP_ARGMAX && x.kind == PL_S && x.dim == s->rank - 1 && reduced(n, x.dim)) {
    if (!divisible(io, s->d[x.dim], x.dim)) return false;
    double rows = (double)shape_numel(s) / (double)s->d[x.dim];
    io->extra_coll = COLL_ALL_GATHER;
    io->extra_bytes = pl_coll_bytes(COLL_ALL_GATHER, 2 * rows * 4 * (double)io->n, io->n);
    io->extra = "argmax exchange (each device's row max and its index)";
    io->out = pl_r();
    return true;
  }
  if (x.kind == PL_P || reduced(n, x.dim)) {
    if (!sumlike) {
      io->want[0] = pl_r();
      return reject(io, "%s of %s needs the whole tensor", ir_ops[n->op].name, x.kind == PL_P ? "partial sums" : "a split dim");
    }
    io->out = pl_p();
    return true;
  }
  int d = x.dim;
  bool keep = n->op != OP_ARGMAX && n->ia[0];
  if (!keep)
    for (int i = 0; i < x.dim; i++) d -= reduced(n, i);
  io->out = pl_s(d);
  return true;
}

/* What one matmul operand's placement means: a batch dim (landing on output dim od), the rows M
 * of a, the columns N of b, or the contracted dim K. */
typedef enum MmRole { MM_R, MM_P, MM_BATCH, MM_M, MM_N, MM_K } MmRole;

static MmRole mm_role(const Graph *g, const Node *n, int i, Pl p, int *od) {
  int r = in_shape(g, n, i)->rank, orank = n->shape.rank;
  if (p.kind == PL_R) return MM_R;
  if (p.kind == PL_P) return MM_P;
  if (p.dim == r - 1) { *od = orank - 1; return i == 0 ? MM_K : MM_N; }
  if (p.dim == r - 2) { *od = orank - (i == 0 ? 2 : 1); return i == 0 ? MM_M : MM_K; }
  *od = p.dim + (orank - 2) - (r - 2);
  return MM_BATCH;
}

/* matmul a[..., M, K] @ b[..., K, N], Alpa's strategies on one axis:
 *   batch split    a S(batch), b R or the same batch split   -> S(batch)
 *   row split      a S(M), b R                               -> S(-2)
 *   column split   a R, b S(N)   (Megatron column-parallel)  -> S(-1)
 *   reduction      a S(K), b S(K) (Megatron row-parallel)    -> P
 *   partial        a P, b R or a R, b P                      -> P
 *   replicated     a R, b R                                  -> R */
bool shard_matmul(const Graph *g, const Node *n, ShardIO *io) {
  if (in_shape(g, n, 0)->rank < 2 || in_shape(g, n, 1)->rank < 2) return shard_none(g, n, io);
  int oa = -1, ob = -1;
  MmRole ra = mm_role(g, n, 0, io->in[0], &oa), rb = mm_role(g, n, 1, io->in[1], &ob);
  const Shape *sa = in_shape(g, n, 0);
  if (ra == MM_R && rb == MM_R) return shard_leaf(g, n, io);
  if ((ra == MM_P && rb == MM_R) || (ra == MM_R && rb == MM_P) || ((ra == MM_K || ra == MM_R) && (rb == MM_K || rb == MM_R))) {
    if ((ra == MM_K || rb == MM_K) && !divisible(io, sa->d[sa->rank - 1], sa->rank - 1)) return false;
    io->out = pl_p();
    return true;
  }
  if ((ra == MM_BATCH || ra == MM_M) && (rb == MM_R || (rb == MM_BATCH && ob == oa))) {
    io->out = pl_s(oa);
    return divisible(io, n->shape.d[oa], oa);
  }
  if (ra == MM_R && (rb == MM_N || rb == MM_BATCH)) {
    io->out = pl_s(ob);
    return divisible(io, n->shape.d[ob], ob);
  }
  /* A split weight column wants the activation whole (tensor parallelism gathers activations);
   * a split activation wants the weight whole (ZeRO-3 gathers params). */
  if (rb == MM_N) io->want[0] = pl_r();
  else if (ra == MM_BATCH || ra == MM_M) io->want[1] = pl_r();
  else io->want[0] = pl_r();
  if (ra == MM_P || rb == MM_P) io->want[ra == MM_P ? 0 : 1] = pl_r();
  return reject(io, "matmul has no strategy for %s @ %s", pl_str(io->in[0]), pl_str(io->in[1]));
}

/* transpose swaps the last two dims; permute moves dim dims[i] to i. */
bool shard_transpose(const Graph *g, const Node *n, ShardIO *io) {
  Pl x = io->in[0];
  io->out = x;
  if (x.kind != PL_S) return true;
  int r = n->shape.rank;
  if (n->op == OP_TRANSPOSE) {
    io->out.dim = x.dim == r - 1 ? r - 2 : x.dim == r - 2 ? r - 1 : x.dim;
    return true;
  }
  for (int i = 0; i < n->ndims; i++)
    if (n->dims[i] == x.dim) io->out.dim = i;
  (void)g;
  return true;
}

static int64_t prefix(const Shape *s, int d) {
  int64_t p = 1;
  for (int i = 0; i < d; i++) p *= s->d[i];
  return p;
}

/* A split dim survives a reshape when an output dim starts at the same element stride: the same
 * dim, the leading dim of a merge ([B, T, C] -> [B·T, C]) or of a split. */
bool shard_reshape(const Graph *g, const Node *n, ShardIO *io) {
  Pl x = io->in[0];
  io->out = x;
  if (x.kind != PL_S) return true;
  const Shape *s = in_shape(g, n, 0), *o = &n->shape;
  int64_t pin = prefix(s, x.dim), din = s->d[x.dim];
  for (int e = 0; e < o->rank; e++) {
    int64_t dout = o->d[e];
    if (prefix(o, e) != pin || dout == 0) continue;
    if (dout == din || dout % din == 0 || (din % dout == 0 && dout % io->n == 0)) {
      io->out = pl_s(e);
      return divisible(io, dout, e);
    }
  }
  io->want[0] = pl_r();
  return reject(io, "the reshape %s -> %s does not keep split dim %d", shape_str(s), shape_str(o), x.dim);
}

/* concat: every input placed alike, never split along the concat axis (blocks would interleave). */
bool shard_concat(const Graph *g, const Node *n, ShardIO *io) {
  (void)g;
  for (int i = 1; i < n->nin; i++)
    if (!pl_eq(io->in[i], io->in[0])) {
      want_all(io, n->nin, io->in[0].kind == PL_S && io->in[0].dim != n->ia[0] ? io->in[0] : pl_r());
      return reject(io, "concat inputs are placed differently");
    }
  if (io->in[0].kind == PL_S && io->in[0].dim == n->ia[0]) {
    want_all(io, n->nin, pl_r());
    return reject(io, "concat along its split dim");
  }
  io->out = io->in[0];
  return true;
}

/* slice along a split dim is one of L/len equal parts: each device keeps its share of every part
 * when the producer lays its shards out per part (Megatron's fused QKV weight). */
bool shard_slice(const Graph *g, const Node *n, ShardIO *io) {
  Pl x = io->in[0];
  io->out = x;
  if (x.kind != PL_S || x.dim != n->ia[0]) return true;
  int64_t len = n->ia[2] - n->ia[1], L = in_shape(g, n, 0)->d[x.dim];
  if (len > 0 && L % len == 0 && n->ia[1] % len == 0) return divisible(io, len, x.dim);
  io->want[0] = pl_r();
  return reject(io, "slice [%lld, %lld) of split dim %d is not one of equal parts", (long long)n->ia[1],
                (long long)n->ia[2], x.dim);
}

/* split_heads [B, T, h·d] -> [B, h, T, d]: a split of the channels becomes a split of the heads. */
bool shard_split_heads(const Graph *g, const Node *n, ShardIO *io) {
  Pl x = io->in[0];
  io->out = x;
  if (x.kind != PL_S) return true;
  static const int map[3] = {0, 2, 1};
  if (x.dim > 2) return shard_none(g, n, io);
  io->out = pl_s(map[x.dim]);
  if (x.dim == 2 && n->ia[0] % io->n != 0) {
    io->want[0] = pl_r();
    return reject(io, "%lld devices do not divide the %lld heads", (long long)io->n, (long long)n->ia[0]);
  }
  return true;
}

/* merge_heads [B, h, T, d] -> [B, T, h·d]: the inverse map; a split of d inside each head cannot merge. */
bool shard_merge_heads(const Graph *g, const Node *n, ShardIO *io) {
  Pl x = io->in[0];
  io->out = x;
  if (x.kind != PL_S) return true;
  static const int map[3] = {0, 2, 1};
  if (x.dim > 2) {
    io->want[0] = pl_r();
    return reject(io, "merge_heads of a split head dim");
  }
  io->out = pl_s(map[x.dim]);
  (void)g;
  return true;
}

/* embedding(table [V, C], idx): idx split -> output split alike; table S(0) (vocab-parallel:
 * rows outside a device's range give zeros) -> P; table S(1) -> the channels split. */
bool shard_embedding(const Graph *g, const Node *n, ShardIO *io) {
  Pl t = io->in[0], x = io->in[1];
  if (x.kind == PL_P) {
    io->want[1] = pl_r();
    return reject(io, "embedding indices cannot be partial sums");
  }
  if (t.kind == PL_R) {
    io->out = x;
    return true;
  }
  if (x.kind == PL_S) {
    io->want[0] = pl_r();
    return reject(io, "embedding with both the table and the indices split");
  }
  if (t.kind == PL_P) {
    io->out = pl_p();
    return true;
  }
  if (t.dim == 0) {
    io->out = pl_p();
    return divisible(io, in_shape(g, n, 0)->d[0], 0);
  }
  io->out = pl_s(n->shape.rank - 1);
  return divisible(io, in_shape(g, n, 0)->d[1], 1);
}

/* The axis a row-wise op normalizes over: it must stay whole. */
static int row_axis(const Node *n) {
  if (n->op == OP_SOFTMAX || n->op == OP_LOG_SOFTMAX) return (int)n->ia[0];
  return n->shape.rank - 1;
}

/* softmax, log_softmax, layer_norm, rms_norm, rope: any split but the normalized axis; the
 * weights (layer_norm, rms_norm) are whole; no partial sums. */
bool shard_rowwise(const Graph *g, const Node *n, ShardIO *io) {
  Pl x = io->in[0];
  for (int i = 1; i < n->nin; i++)
    if (io->in[i].kind != PL_R) {
      io->want[i] = pl_r();
      return reject(io, "%s needs its weights whole", ir_ops[n->op].name);
    }
  if (x.kind == PL_P || (x.kind == PL_S && x.dim == row_axis(n))) {
    io->want[0] = pl_r();
    return reject(io, "%s of %s", ir_ops[n->op].name,
                  x.kind == PL_P ? "partial sums" : "a split normalized axis");
  }
  /* rope rotates each row by its position along dim -2: the kernels count positions from 0 */
  if (n->op == OP_ROPE && x.kind == PL_S && x.dim == n->shape.rank - 2) {
    io->want[0] = pl_r();
    return reject(io, "rope of a split position axis");
  }
  io->out = x;
  return x.kind != PL_S || divisible(io, n->shape.d[x.dim], x.dim);
}

/* sdpa(q [B, h, T, d], k, v [B, hk, T, d] [, km [B, Tk]]): split by batch or by heads (all three alike:
 * under grouped-query attention the devices' query heads then read their own key/value heads), or the
 * queries' T alone with k and v whole when not causal (the kernels' causal mask counts the query rows
 * from 0). The key mask km splits with the batch and is whole otherwise. */
bool shard_sdpa(const Graph *g, const Node *n, ShardIO *io) {
  const Pl q = io->in[0], kmw = q.kind == PL_S && q.dim == 0 ? pl_s(0) : pl_r(); /* the key mask q's split wants */
  const Pl km = n->nin == 4 ? io->in[3] : kmw;
  bool kv_whole = io->in[1].kind == PL_R && io->in[2].kind == PL_R;
  if (q.kind == PL_R && kv_whole && km.kind == PL_R) return shard_leaf(g, n, io);
  const int64_t hk = in_shape(g, n, 1)->d[1];
  bool bh = q.kind == PL_S && q.dim <= 1 && pl_eq(io->in[1], q) && pl_eq(io->in[2], q);
  bool tq = q.kind == PL_S && q.dim == 2 && kv_whole && !n->ia[0];
  if ((bh || tq) && pl_eq(km, kmw)) {
    io->out = q;
    return divisible(io, n->shape.d[q.dim], q.dim) && (!bh || q.dim != 1 || divisible(io, hk, 1));
  }
  Pl w = q.kind == PL_S && q.dim <= 1 ? q : pl_r();
  want_all(io, 3, w);
  if (n->nin == 4) io->want[3] = w.kind == PL_S && w.dim == 0 ? pl_s(0) : pl_r();
  if (bh || tq || (q.kind == PL_R && kv_whole))
    return reject(io, "sdpa's key mask must be %s with q %s, got %s", pl_str(kmw), pl_str(q), pl_str(km));
  return reject(io, "sdpa needs q, k, v split alike by batch or heads, got %s, %s, %s", pl_str(q),
                pl_str(io->in[1]), pl_str(io->in[2]));
}

/* cross_entropy(logits [..., V], targets [...]) -> a scalar mean, so any valid split gives P.
 * Split rows: targets split alike. Vocab-parallel (Megatron): logits S(-1), targets whole; the
 * rows' max and sum of exponentials are exchanged: an all-reduce of two scalars per row. */
bool shard_cross_entropy(const Graph *g, const Node *n, ShardIO *io) {
  Pl l = io->in[0], t = io->in[1];
  const Shape *s = in_shape(g, n, 0);
  if (l.kind == PL_R && t.kind == PL_R) return shard_leaf(g, n, io);
  if (l.kind == PL_S && l.dim == s->rank - 1 && t.kind == PL_R) {
    if (!divisible(io, s->d[l.dim], l.dim)) return false;
    double rows = (double)shape_numel(s) / (double)s->d[l.dim];
    io->extra_bytes = pl_coll_bytes(COLL_ALL_REDUCE, 2 * rows * 4, io->n);
    io->extra = "log-sum-exp exchange (max and sum of exp per row)";
    io->out = pl_p();
    return true;
  }
  if (l.kind == PL_S && pl_eq(l, t)) {
    io->out = pl_p();
    return divisible(io, s->d[l.dim], l.dim);
  }
  io->want[0] = l.kind == PL_P ? pl_r() : l;
  io->want[1] = l.kind == PL_S && l.dim < s->rank - 1 ? l : pl_r();
  return reject(io, "cross_entropy has no strategy for logits %s, targets %s", pl_str(l), pl_str(t));
}

static Pl conj_pl(Pl p) { return p.kind == PL_P ? pl_r() : p; }

/* GRAD: inputs [dy, the forward inputs as the forward node consumed them..., the forward output].
 * dy must be placed as the forward output, with P's conjugate R (the backward of an all-reduce is
 * the identity), except that a partial dy passes through an op that ran whole (every backward is
 * linear in dy). The input gradient is placed as its input was: S stays S, P becomes R, and an R
 * input of an op that ran split gets partial gradients (P). */
Pl shard_sliced_input(const Graph *g, const Node *n, int k, const Pl *cons, Pl out) {
  if (cons[k].kind != PL_R) return cons[k];
  const Shape *s = in_shape(g, n, k);
  if (n->op == OP_MATMUL && out.kind == PL_P && in_shape(g, n, 0)->rank >= 2 && in_shape(g, n, 1)->rank >= 2) {
    /* the reduction strategy with one operand split along K and the other whole: the whole one
     * takes its K block (a K of a is its last dim, of b the one before) */
    int od = -1;
    if (mm_role(g, n, 1 - k, cons[1 - k], &od) == MM_K) return pl_s(s->rank - (k == 0 ? 1 : 2));
    return cons[k];
  }
  if (n->op == OP_MATMUL && out.kind == PL_S && out.dim < n->shape.rank - 2 && s->rank >= 2) {
    /* the batch strategy with a whole operand that has the split batch dim (not broadcast along
     * it: an expanded weight): it takes its part of that dim, as an elementwise op's input does */
    int d = out.dim - (n->shape.rank - s->rank);
    return d >= 0 && d < s->rank - 2 && s->d[d] != 1 ? pl_s(d) : cons[k];
  }
  if (out.kind != PL_S || !(ir_ops[n->op].flags & OPF_ELEMENTWISE)) return cons[k];
  int d = out.dim - (n->shape.rank - s->rank);
  return d >= 0 && s->d[d] != 1 ? pl_s(d) : cons[k];
}

bool shard_grad(const Graph *g, const Node *n, ShardIO *io) {
  int k = (int)n->ia[0], nf = n->nin - 2;
  Pl fout = io->in[n->nin - 1], x = shard_sliced_input(g, &g->nodes[n->fwd], k, &io->in[1], io->in[n->nin - 1]);
  bool split = fout.kind != PL_R;
  for (int i = 0; i < nf; i++) split |= io->in[1 + i].kind != PL_R;
  /* Every backward is linear in dy, so partial sums pass through an op that ran whole; but norms
   * and softmax-like ops want dy whole (Megatron reduces before them, not their weights' grads). */
  bool rowwise = ir_ops[g->nodes[n->fwd].op].shard == shard_rowwise;
  if (io->in[0].kind == PL_P && !split && !rowwise) {
    io->out = pl_p();
    return true;
  }
  if (!pl_eq(io->in[0], conj_pl(fout))) {
    io->want[0] = conj_pl(fout);
    return reject(io, "the gradient arrives %s but the forward output was %s", pl_str(io->in[0]), pl_str(fout));
  }
  io->out = x.kind == PL_S ? x : x.kind == PL_P ? pl_r() : split ? pl_p() : pl_r();
  return true;
}

/* assign/accum(dst, value): the value must be placed as dst. */
bool shard_assign(const Graph *g, const Node *n, ShardIO *io) {
  (void)g, (void)n;
  if (!pl_eq(io->in[0], io->in[1])) {
    io->want[1] = io->in[0];
    return reject(io, "the value is %s but its destination is %s", pl_str(io->in[1]), pl_str(io->in[0]));
  }
  io->out = io->in[0];
  return true;
}

bool shard_node(const Graph *g, const Node *n, ShardIO *io) {
  for (int i = 0; i < 8; i++) io->want[i] = (Pl){PL_ANY, 0};
  io->extra = NULL;
  io->extra_bytes = 0;
  io->extra_coll = COLL_ALL_REDUCE;
  io->why[0] = 0;
  io->out = pl_r();
  return ir_ops[n->op].shard(g, n, io);
}

/* The candidates of one input: R, P, then S(d) for every dim. */
static int input_choices(const Graph *g, const Node *n, int i, Pl *out) {
  int c = 0, r = in_shape(g, n, i)->rank;
  out[c++] = pl_r();
  out[c++] = pl_p();
  for (int d = 0; d < r; d++) out[c++] = pl_s(d);
  return c;
}

int shard_candidates(const Graph *g, const Node *n, int64_t axis_n, Pl *ins, Pl *outs, int max) {
  int nin = n->nin, count = 0, idx[8] = {0}, nch[8];
  Pl ch[8][CP_MAX_RANK + 2];
  if (nin > 8) return 0;
  for (int i = 0; i < nin; i++) nch[i] = input_choices(g, n, i, ch[i]);
  for (;;) {
    Pl in[8];
    for (int i = 0; i < nin; i++) in[i] = ch[i][idx[i]];
    ShardIO io = {.in = in, .n = axis_n};
    if (shard_node(g, n, &io) && count < max) {
      memcpy(ins + (size_t)count * (size_t)nin, in, sizeof(Pl) * (size_t)nin);
      outs[count++] = io.out;
    }
    int i = 0;
    while (i < nin && ++idx[i] == nch[i]) idx[i++] = 0;
    if (i == nin) break;
  }
  return count;
}
