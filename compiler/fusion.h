/* fusion.h: the fusion pass. Groups chains of f32 elementwise nodes of a Graph into fused
 * kernels that codegen/llvm.c compiles, so the host program makes one call (one pass over
 * memory) where it would make several. The pass reads the Graph and never changes it.
 *
 * The rule. Nodes are visited from the last to the first. A node is FUSABLE when its op is
 * OPF_ELEMENTWISE, its dtype and every input's dtype are f32, and it is not a graph output
 * (the loss, a metric, a gradient of a param, the gradient norm); a GRAD node is FUSABLE too when
 * its gradient is an elementwise expression of dy, x and y = f(x): the GRADs of the unary ops
 * (d gelu, d silu, d exp, ...), and of mul, div and sub's input b when nothing broadcasts (the
 * GRADs of add and of sub's input a are dy itself: views, never fused). A fusable node JOINS the group
 * of its consumer when
 *   - it has exactly one consumer node (x * x counts once), and that consumer
 *     is a fusable member of a group,
 *   - it has the same role (forward / backward / update) as that consumer, and
 *   - it has the same shape as the group's root (so it is computed at every output element
 *     exactly once; an input that is broadcast stays a leaf, read with stride 0), and
 *   - no ASSIGN/ACCUM between it and the root overwrites a PARAM or STATE it reads (a member
 *     is computed at the root's position).
 * Otherwise a fusable node starts a new group of its own and is that group's ROOT: the one
 * member whose value is written to memory. Every fusable node is in exactly one group, so a
 * group may hold a single node (a plain elementwise op, still worth a generated kernel: it is
 * vectorized and specialized to its shapes). Rank-0 OP_CONST inputs become constants inside the
 * kernel (CG_CONST); they are not members (a CONST may feed several groups). Every other input
 * of a member that is not itself a member is a LEAF: a kernel input.
 *
 * How the emitter uses it (codegen/emit_c.c):
 *   Fusion *f = fusion_run(g);
 *   for each node i in order:
 *     if f->group[i] < 0: emit it as before;
 *     else if fusion_is_root(f, i): FusionGroup *gr = &f->groups[f->group[i]];
 *          emit  { const float *in[] = {buf(gr->leaves.a[0]), ...}; gr->kernel.name(buf(i), in); }
 *     else: emit nothing (a non-root member lives only in registers; it has no buffer).
 *   and compile every group's kernel into one object: cg_llvm_object of the kernels (the
 *   `kernels` array below is exactly that list, in group order).
 * Memory planning must not give non-root members a buffer; their only reader is in the group. */
#ifndef CPLAN_FUSION_H
#define CPLAN_FUSION_H

#include "../codegen/llvm.h"
#include "ir.h"

typedef struct FusionGroup {
  int root;          /* the node whose value the kernel writes (the group's output) */
  VEC(int) nodes;    /* member nodes in graph (topological) order; the root is last */
  VEC(int) leaves;   /* graph nodes read as kernel inputs: in[k] is the buffer of leaves.a[k] */
  CgKernel kernel;   /* the kernel: name "k_ew_<root>", shape of the root, inputs = leaves */
} FusionGroup;

typedef struct Fusion {
  int *group;          /* per graph node (g->n entries): its group index, -1 if not fused */
  FusionGroup *groups; /* in the order of their roots in the graph */
  int ngroups;
  CgKernel *kernels;   /* ngroups kernels, kernels[i] == groups[i].kernel: for cg_llvm_object */
} Fusion;

/* Runs the pass over g (which it does not change). Everything lives in the compiler's arena.
 * Never NULL; a graph without elementwise f32 nodes gives ngroups == 0. */
Fusion *fusion_run(const Graph *g);

/* True when node i is the root of its group (the node that carries the kernel call). */
bool fusion_is_root(const Fusion *f, int i);

/* The kernel op an elementwise OpId maps to: *unary set true and *kop a KUnary, or false and a
 * KBinary. Returns false when the op is not one the fused kernels implement. */
bool fusion_kernel_op(OpId op, bool *unary, int *kop);

/* `cplanc emit --stage=fusion`: one line per group, "group 3: root %12 = gelu, nodes %9 %10 %11
 * %12, leaves %4 %7 [broadcast %7], kernel k_ew_12". */
void fusion_print(FILE *out, const Graph *g, const Fusion *f);

#endif
