/* ir.h: the Graph IR (DESIGN.md §3) and the op table that defines every operation.
 *
 * A Graph is an array of Node in topological order; edges are indices into it.
 * Every node keeps the Span of the .cplan text it came from. Each node has one
 * output; a primitive that returns a tuple (split) is expanded by sema into
 * several nodes (it is flagged OPF_MACRO and never appears in a Graph).
 *
 * The op table lives in ops.def; its shape rules and FLOP counts in ops.c. */
#ifndef CPLAN_IR_H
#define CPLAN_IR_H

#include "cplan.h"

typedef enum DType { DT_F32, DT_BF16, DT_F16, DT_I32, DT__COUNT } DType;

typedef struct Shape {
  int rank;
  int64_t d[CP_MAX_RANK];
} Shape;

typedef enum OpId {
#define OP(id, name, sig, flags, shape, flops, shard) OP_##id,
#include "ops.def"
#undef OP
  OP__COUNT
} OpId;

typedef enum Role { ROLE_FWD, ROLE_BWD, ROLE_UPD } Role;

/* How a param is initialised: PARAM nodes keep it in ia[0], arguments in fa[0..1]. */
typedef enum InitKind { INIT_ZEROS, INIT_ONES, INIT_FULL, INIT_NORMAL, INIT_UNIFORM } InitKind;

typedef struct Node {
  OpId op;
  int *in;            /* input node indices, each < this node's index */
  int nin;
  Shape shape;        /* of the output */
  DType dtype;        /* of the output */
  /* Attributes. Which slot means what is fixed per op by its signature in ops.def:
   * int (i) and bool (b) arguments fill ia[] in signature order, float (f)
   * arguments fill fa[] in order, an axis list (ax) or dims list (D) fills
   * dims[]/ndims (ndims = -1 for `all`). Shape rules may canonicalise them
   * (negative axes become positive), so re-running a rule changes nothing. */
  int64_t ia[4];
  double fa[4];
  int64_t dims[CP_MAX_RANK];
  int ndims;
  const char *name;   /* PARAM: its path ("h.0.attn.c_attn.weight"); INPUT: its name */
  int fwd;            /* GRAD: the forward node whose input gradient this is; -1 otherwise */
  int layer;          /* index into Graph.layer_names, or -1 outside every loop */
  Role role;
  Span span;          /* the .cplan text it came from */
} Node;

typedef struct Metric {
  const char *name;
  int node;
  Span span;
} Metric;

typedef struct Graph {
  Node *nodes;
  int n, cap;
  VEC(int) params;    /* PARAM node indices, in declaration order */
  VEC(int) inputs;    /* INPUT node indices, in declaration order */
  VEC(Metric) metrics;
  VEC(const char *) layer_names; /* "h.0", "h.1", ...: one per loop iteration */
  int loss;           /* node index of the scalar loss, -1 if none */
  /* Filled by autodiff and the optimizer lowering (training graphs only): */
  VEC(int) grads;     /* per param (parallel to params): its gradient for one micro-batch, -1
                         when the loss does not depend on it */
  VEC(int) states;    /* STATE nodes: optimizer moments and gradient accumulators */
  int grad_norm;      /* node of the global gradient norm (before clipping), -1 if none */
  int64_t accum;      /* micro-batches per optimizer step (the gradient seed is 1/accum) */
  int seed;           /* the CONST node of that seed (d loss), -1 before autodiff */
  int cur_layer;      /* the layer new nodes get (sema sets it while unrolling) */
  const char *model_name;
  int64_t batch;      /* the value B was bound to when the graph was built */
} Graph;

/* ---- the op table ------------------------------------------------------- */
enum {
  OPF_LEAF = 1 << 0,        /* input, param, const: no inputs, shape set by the builder */
  OPF_OPERATOR = 1 << 1,    /* reached through an operator (+, @, ==), not callable by name */
  OPF_ELEMENTWISE = 1 << 2, /* output shape = broadcast of the inputs */
  OPF_NOGRAD = 1 << 3,      /* not differentiable: comparisons, argmax, arange */
  OPF_MACRO = 1 << 4,       /* expanded by sema into other ops (split) */
  OPF_INTERNAL = 1 << 5,    /* made by passes (autodiff, optimizer), never by a call */
};

struct ShardIO; /* placement.h */

typedef struct OpInfo {
  const char *name;  /* the language name (and the IR printer's) */
  /* The call signature, read by sema's argument binder, space separated entries
   * `name:kind[=default]`. Kinds: T tensor (a number becomes a CONST node), L list or
   * tuple of tensors (all become inputs), i int, f float (an int is accepted),
   * b bool, ax axis (int, tuple of ints, or `all`), D dims (list or tuple of ints).
   * NULL for leaves. */
  const char *sig;
  unsigned flags;
  /* Computes n->shape and n->dtype from the inputs and attributes. On a user error
   * writes a message (no trailing period) into err and returns false. */
  bool (*shape)(const Graph *g, Node *n, char *err, size_t errlen);
  /* Forward FLOPs of the node (matmuls and attention count 2 per multiply-add). */
  double (*flops)(const Graph *g, const Node *n);
  /* The sharding rule (shard.c; ShardIO in placement.h): given the inputs' placements on one
   * mesh axis, the output's placement, or false with the reason the strategy is invalid. */
  bool (*shard)(const Graph *g, const Node *n, struct ShardIO *io);
} OpInfo;

extern const OpInfo ir_ops[OP__COUNT];

/* The op reached by a call name (NULL if none, or if only an operator reaches it). */
/* The callable op named name, its id in *id; NULL and OP__COUNT when there is none. */
const OpInfo *ir_op_by_name(const char *name, OpId *id);
/* Every callable op name, for "did you mean" (count in *n). */
const char *const *ir_op_names(int *n);
/* What to write for a PyTorch name cplan spells otherwise ("cat": "write concat([a, b], axis = -1)"), or NULL. */
const char *ir_pytorch_hint(const char *name);

/* ---- shapes and dtypes (ir.c) ------------------------------------------- */
int64_t shape_numel(const Shape *s);
bool shape_eq(const Shape *a, const Shape *b);
char *shape_str(const Shape *s); /* "[1, 1024, 768]" (arena) */
extern long ir_shape_strs;        /* shape_str calls so far: whether a message printed a shape */
const char *dtype_name(DType t); /* "f32" */
bool dtype_parse(const char *s, DType *out);
size_t dtype_size(DType t);
/* NumPy broadcasting of two shapes; false if they do not broadcast. */
bool shape_broadcast(const Shape *a, const Shape *b, Shape *out);

/* ---- building and checking graphs (ir.c) ---------------------------------- */
Graph *ir_new(const char *model_name);
/* Appends a node with these inputs; attributes zero, layer = g->cur_layer,
 * role forward. Returns its index. The caller fills attributes, then ir_infer. */
int ir_add(Graph *g, OpId op, const int *in, int nin, Span span);
/* Runs the op's shape rule on node i (false + message on a user error). */
bool ir_infer(Graph *g, int i, char *err, size_t errlen);
/* Structural check after every pass: topological order, shapes agree with the
 * rules, dtypes valid, loss scalar. Returns false with a message on the first
 * problem (an internal bug, not a user error). */
bool ir_verify(const Graph *g, char *err, size_t errlen);

/* Dead-code elimination of a model's graph (sema_build_model's last step, before autodiff): the
 * nodes neither the loss nor a metric reads are removed (params and inputs stay: they are the
 * model's whatever reads them), the others keep their order, and every index of g is renumbered.
 * A graph without a loss is left as it is. */
void ir_prune(Graph *g);
/* `cplanc emit --stage=ir`: one line per node. */
void ir_print(FILE *out, const Graph *g);
double ir_node_flops(const Graph *g, int i);
/* Bytes of the node's output. */
double ir_node_bytes(const Graph *g, int i);
/* The tokens one sample of g holds (its sequence length T): dim 1 of the first input when that
 * input is a sequence, `i32 [B, T, ...]` (token ids) or a float `[B, T, C, ...]`; 0 when the first
 * input is a float `[B, D]` feature vector or there is none (a sample is one token then). Tokens/s,
 * FLOP per token and the runtime's seq_len all read it. */
int64_t ir_seq_len(const Graph *g);

#endif
