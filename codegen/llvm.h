/* llvm.h: fused elementwise kernels and row kernels (softmax, norms, sums) for the CPU,
 * generated through the LLVM 14 C API (DESIGN.md §6, §9).
 *
 * A CgKernel is a small DAG over f32 values, evaluated at every element of its output:
 *   - leaves: input tensors (CG_INPUT, each with its own shape, broadcast NumPy-style to the
 *     kernel's output shape) and scalar constants (CG_CONST);
 *   - inner nodes: the unary ops of kernels/cpu/ref.h (KUnary) and the binary ops (KBinary,
 *     comparisons give 1.0 / 0.0), with the same semantics as the reference kernels.
 * Every shape is known when the kernel is generated, so each kernel is a loop nest with constant
 * trip counts: the output is walked in row-major order, adjacent dims that every input walks
 * the same way are merged, and the innermost loop is contiguous (or broadcast) for the loop
 * vectorizer, which turns it into AVX/AVX2/AVX-512 code for the host CPU.
 *
 * The generated function of a kernel named NAME is
 *     void NAME(float *restrict out, const float *const *in);
 * `out` is the contiguous row-major output (kernel->shape); in[k] is the contiguous row-major
 * data of input k (kernel->inputs[k].shape). `out` must not overlap any input: the parameter is
 * `noalias`, which is what lets the vectorizer skip run-time overlap checks.
 *
 * Transcendentals (exp, log, tanh, and sigmoid, silu, gelu, pow built on them) are inline
 * polynomials (Cephes' single-precision ones, about 1 ulp), not calls to libm, so the loops that
 * use them vectorize too; the object file needs no library at all. gelu is the tanh
 * approximation of ref.c written as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), which is
 * the same function (1 + tanh(u) = 2 sigmoid(2u)) without the cancellation of 1 + tanh(u) for
 * negative x. pow with an integer exponent |c| <= 64 is a chain of multiplications; otherwise
 * exp(c log x) (NaN for x < 0, as powf gives for a non-integer exponent).
 *
 * Errors (a malformed kernel, an LLVM failure) come back as a message in err, never an abort. */
#ifndef CPLAN_CODEGEN_LLVM_H
#define CPLAN_CODEGEN_LLVM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../kernels/cpu/ref.h" /* KUnary, KBinary */

#define CG_MAX_RANK 8

typedef enum CgKind {
  CG_INPUT,  /* input tensor `input` */
  CG_CONST,  /* the scalar `value` */
  CG_UNARY,  /* op (KUnary) of node a; K_POW's exponent is `value` */
  CG_BINARY, /* op (KBinary) of nodes a and b */
  CG_SELECT, /* where: node a != 0 ? node b : node c */
} CgKind;

typedef struct CgNode {
  CgKind kind;
  int op;      /* CG_UNARY: a KUnary; CG_BINARY: a KBinary */
  int a, b, c; /* operands: indices of earlier nodes of the same kernel (c: CG_SELECT's third) */
  int input;   /* CG_INPUT: index into CgKernel.inputs (and into the in[] argument) */
  float value; /* CG_CONST: the value; CG_UNARY K_POW: the exponent, K_CLAMP_MIN/MAX: the bound */
} CgNode;

typedef struct CgInput {
  int rank;                  /* <= the kernel's rank; dims are right-aligned as in NumPy */
  int64_t shape[CG_MAX_RANK];/* each dim equals the output's or is 1 (broadcast) */
} CgInput;

/* ROW kernels (CgKernel.row != CG_ROW_NONE): one op over the last axis of a [rows, n] tensor
 * (kernel->shape = {rows, n}, rank 2, n >= 1; inputs/nodes unused), with rows and n compiled in.
 * Their generated function is
 *     void NAME(float *const *out, const float *const *in);
 * with the operands below, in the semantics of the float k_x of kernels/cpu/ref.h: a backward
 * ACCUMULATES (+=) into its outputs, and an output marked "NULL ok" may be NULL (not wanted;
 * tested at run time, once per row). Shapes: x, y, dy, dx [rows, n]; w, b, dw, db [n]; mean,
 * rstd, and the output of sum/mean [rows].
 *   SOFTMAX_FWD, LOG_SOFTMAX_FWD  out {y}                      in {x}
 *   SOFTMAX_BWD, LOG_SOFTMAX_BWD  out {dx}                     in {dy, y}   (y: the forward output)
 *   LAYER_NORM_FWD                out {y, mean?, rstd?}        in {x, w, b}   eps = kernel->eps
 *   LAYER_NORM_BWD                out {dx?, dw?, db?}          in {dy, x, w, mean, rstd}
 *   RMS_NORM_FWD                  out {y, rstd?}               in {x, w}      eps = kernel->eps
 *   RMS_NORM_BWD                  out {dx?, dw?}               in {dy, x, w, rstd}
 *   SUM_FWD, MEAN_FWD             out {y [rows]}               in {x}
 * (? = NULL ok.) They are written with explicit vectors of 16 floats (a tail chunk of n % 16
 * lanes), so every pass over a row is vector code without fast-math flags: each reduction keeps
 * 16 partial sums (maxima) in float lanes, added up in lane order at the end of the row, which
 * is what kernels/cpu/fast_nn.c does too (relative error ~1e-7 on typical rows). SUM and MEAN,
 * which also reduce whole tensors (gradient norms over millions of values), add up in 16 double
 * lanes instead, rounding once at the end as ref.c does. */
typedef enum CgRowOp {
  CG_ROW_NONE = 0, /* an elementwise kernel (the DAG above) */
  CG_ROW_SOFTMAX_FWD,
  CG_ROW_SOFTMAX_BWD,
  CG_ROW_LOG_SOFTMAX_FWD,
  CG_ROW_LOG_SOFTMAX_BWD,
  CG_ROW_LAYER_NORM_FWD,
  CG_ROW_LAYER_NORM_BWD,
  CG_ROW_RMS_NORM_FWD,
  CG_ROW_RMS_NORM_BWD,
  CG_ROW_SUM_FWD,
  CG_ROW_MEAN_FWD,
  CG_ROW__COUNT
} CgRowOp;

typedef struct CgKernel {
  const char *name;           /* the C symbol; unique within one cg_llvm_object call */
  int rank;                   /* of the output, 0..CG_MAX_RANK */
  int64_t shape[CG_MAX_RANK]; /* of the output */
  const CgInput *inputs;      /* in[] argument order */
  int ninputs;
  const CgNode *nodes;        /* topological order; the LAST node is the output value */
  int nnodes;
  CgRowOp row;                /* CG_ROW_NONE (0): elementwise; else a row kernel (see above) */
  float eps;                  /* LAYER_NORM_FWD, RMS_NORM_FWD: the epsilon */
} CgKernel;

/* The number of out[] and in[] pointers a row kernel takes (0, 0 for CG_ROW_NONE). */
void cg_llvm_row_arity(CgRowOp op, int *nout, int *nin);

/* Checks that a kernel is well formed (ranks, broadcastable shapes, operand indices, op codes,
 * a non-empty C identifier as name). Returns false with a message naming the kernel. */
bool cg_llvm_check(const CgKernel *k, char *err, size_t errlen);

/* Generates the n kernels into one module, verifies it, optimizes it at O3 for the host CPU
 * (LLVMGetHostCPUName / LLVMGetHostCPUFeatures) and writes a relocatable, position-independent
 * ELF object to obj_path, to be linked into plan executables. Returns false with a message in
 * err (a malformed kernel, a duplicate name, an LLVM failure). */
bool cg_llvm_object(const CgKernel *ks, int n, const char *obj_path, char *err, size_t errlen);

/* The optimized LLVM IR text of the same module (for `cplanc emit --stage=llvm`), in a string
 * the caller frees with free(); NULL with a message in err on failure. */
char *cg_llvm_ir(const CgKernel *ks, int n, char *err, size_t errlen);

/* The C prototype of a kernel, for the host program: "void NAME(float *restrict out, const
 * float *const *in);" (a row kernel: "void NAME(float *const *out, const float *const *in);")
 * written into buf (truncated to buflen). Returns buf. */
char *cg_llvm_prototype(const CgKernel *k, char *buf, size_t buflen);

#endif
