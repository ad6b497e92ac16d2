/* llvm_ew.c: fused elementwise kernels from codegen/llvm.c against the reference kernels applied
 * op by op (kernels/cpu/ref.c), on 4M-element f32 tensors. Prints figures, asserts nothing.
 *
 * One file, two programs (bench/llvm_ew.sh builds and runs both):
 *   -DLLVM_EW_GEN, linked with libcplanfront: writes the kernels into an object file;
 *   otherwise, linked with ref.c and that object: times them.
 * GB/s counts the bytes a single fused pass must move (every input read once, the output written
 * once), for both sides, so the figures compare as speeds; memcpy of the output size is the
 * baseline for what the memory system gives. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROWS 4096
#define COLS 1024
#define N ((long)ROWS * COLS)

#ifdef LLVM_EW_GEN
#include "../codegen/llvm.h"

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT.o\n", argv[0]);
    return 2;
  }
  /* bench_gelu_affine: gelu(x * w + b), b [COLS] broadcast over rows */
  static const CgInput ga_in[3] = {{2, {ROWS, COLS}}, {2, {ROWS, COLS}}, {1, {COLS}}};
  static const CgNode ga[6] = {
      {.kind = CG_INPUT, .input = 0}, {.kind = CG_INPUT, .input = 1},
      {.kind = CG_BINARY, .op = K_MUL, .a = 0, .b = 1}, {.kind = CG_INPUT, .input = 2},
      {.kind = CG_BINARY, .op = K_ADD, .a = 2, .b = 3}, {.kind = CG_UNARY, .op = K_GELU, .a = 4}};
  /* bench_exp: exp(x); bench_axpy: x * 0.5 + y */
  static const CgInput one_in[2] = {{2, {ROWS, COLS}}, {2, {ROWS, COLS}}};
  static const CgNode ex[2] = {{.kind = CG_INPUT, .input = 0}, {.kind = CG_UNARY, .op = K_EXP, .a = 0}};
  static const CgNode ax[5] = {
      {.kind = CG_INPUT, .input = 0}, {.kind = CG_CONST, .value = 0.5f},
      {.kind = CG_BINARY, .op = K_MUL, .a = 0, .b = 1}, {.kind = CG_INPUT, .input = 1},
      {.kind = CG_BINARY, .op = K_ADD, .a = 2, .b = 3}};
  CgKernel ks[3] = {
      {"bench_gelu_affine", 2, {ROWS, COLS}, ga_in, 3, ga, 6},
      {"bench_exp", 2, {ROWS, COLS}, one_in, 1, ex, 2},
      {"bench_axpy", 2, {ROWS, COLS}, one_in, 2, ax, 5},
  };
  char err[512];
  if (!cg_llvm_object(ks, 3, argv[1], err, sizeof err)) {
    fprintf(stderr, "llvm_ew: %s\n", err);
    return 1;
  }
  return 0;
}

#else
#include "ref.h"

void bench_gelu_affine(float *restrict out, const float *const *in);
void bench_exp(float *restrict out, const float *const *in);
void bench_axpy(float *restrict out, const float *const *in);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct Bufs {
  float *x, *w, *b, *out, *t1, *t2;
} Bufs;

static Bufs B;
static const int full[2] = {ROWS, COLS}, row[1] = {COLS};

static void ref_gelu_affine(void) {
  k_binary_forward(K_MUL, B.t1, B.x, full, 2, B.w, full, 2);
  k_binary_forward(K_ADD, B.t2, B.t1, full, 2, B.b, row, 1);
  k_unary_forward(K_GELU, B.out, B.t2, N, 0);
}
static void gen_gelu_affine(void) {
  const float *in[3] = {B.x, B.w, B.b};
  bench_gelu_affine(B.out, in);
}
static void ref_exp(void) { k_unary_forward(K_EXP, B.out, B.x, N, 0); }
static void gen_exp(void) {
  const float *in[1] = {B.x};
  bench_exp(B.out, in);
}
static void ref_axpy(void) {
  const int scalar[1] = {1};
  float half = 0.5f;
  k_binary_forward(K_MUL, B.t1, B.x, full, 2, &half, scalar, 0);
  k_binary_forward(K_ADD, B.out, B.t1, full, 2, B.w, full, 2);
}
static void gen_axpy(void) {
  const float *in[2] = {B.x, B.w};
  bench_axpy(B.out, in);
}
static void copy(void) { memcpy(B.out, B.x, sizeof(float) * (size_t)N); }

/* Best of `reps` runs, in seconds (after one warm-up run). */
static double best(void (*f)(void), int reps) {
  double t = 1e30;
  f();
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    f();
    double dt = now() - t0;
    if (dt < t) t = dt;
  }
  return t;
}

static void row_out(const char *name, double bytes, void (*ref)(void), void (*gen)(void)) {
  double tr = best(ref, 3), tg = best(gen, 10);
  printf("%-18s  ref op by op %7.2f ms %6.2f GB/s   llvm fused %7.2f ms %6.2f GB/s   speedup %5.1fx\n",
         name, 1e3 * tr, bytes / tr / 1e9, 1e3 * tg, bytes / tg / 1e9, tr / tg);
}

int main(void) {
  float **all[] = {&B.x, &B.w, &B.b, &B.out, &B.t1, &B.t2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) *all[i] = malloc(sizeof(float) * (size_t)N);
  for (long i = 0; i < N; i++) {
    B.x[i] = (float)((i * 7919) % 2001 - 1000) / 400.0f;
    B.w[i] = (float)((i * 104729) % 2001 - 1000) / 700.0f;
  }
  for (int i = 0; i < COLS; i++) B.b[i] = (float)(i % 17) / 17.0f - 0.5f;
  double f4 = sizeof(float) * (double)N;
  printf("llvm_ew: %ld f32 elements (%d x %d), best of runs, 1 thread\n", N, ROWS, COLS);
  double tc = best(copy, 10);
  printf("%-18s  %7.2f ms %6.2f GB/s (read + write)\n", "memcpy baseline", 1e3 * tc, 2 * f4 / tc / 1e9);
  row_out("gelu(x*w + b)", 3 * f4 + 4.0 * COLS, ref_gelu_affine, gen_gelu_affine);
  row_out("exp(x)", 2 * f4, ref_exp, gen_exp);
  row_out("x*0.5 + y", 3 * f4, ref_axpy, gen_axpy);
  return 0;
}
#endif
