/* llvm.h: fused elementwise CPU kernels generated through the LLVM 14 C API (DESIGN.md §6, §9).
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
} CgKind;

typedef struct CgNode {
  CgKind kind;
  int op;      /* CG_UNARY: a KUnary; CG_BINARY: a KBinary */
  int a, b;    /* operands: indices of earlier nodes of the same kernel */
  int input;   /* CG_INPUT: index into CgKernel.inputs (and into the in[] argument) */
  float value; /* CG_CONST: the value; CG_UNARY K_POW: the exponent */
} CgNode;

typedef struct CgInput {
  int rank;                  /* <= the kernel's rank; dims are right-aligned as in NumPy */
  int64_t shape[CG_MAX_RANK];/* each dim equals the output's or is 1 (broadcast) */
} CgInput;

typedef struct CgKernel {
  const char *name;           /* the C symbol; unique within one cg_llvm_object call */
  int rank;                   /* of the output, 0..CG_MAX_RANK */
  int64_t shape[CG_MAX_RANK]; /* of the output */
  const CgInput *inputs;      /* in[] argument order */
  int ninputs;
  const CgNode *nodes;        /* topological order; the LAST node is the output value */
  int nnodes;
} CgKernel;

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
 * float *const *in);" written into buf (truncated to buflen). Returns buf. */
char *cg_llvm_prototype(const CgKernel *k, char *buf, size_t buflen);

#endif
