/* kernels_cpu.c: per-kernel speed of the fast f32 CPU kernels (kernels/cpu/fast_nn.c) against
 * their reference twins (ref.c; fast.c for the period-broadcast binary ops), single-threaded, on
 * the tensor sizes of bench/gpt_bench.cplan's training step (B 8, T 128, C 256, 8 heads, vocab
 * 512, MLP 1024). For each kernel it prints the best time per call of each, the effective
 * bandwidth (bytes each call must read and write, over the time) and the speedup.
 * A benchmark, not a test: it never asserts. Built and run by bench/kernels_cpu.sh. */
#include "fast.h"
#include "fast_nn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BT = 1024, C = 256, H = 8, T = 128, B = 8, V = 512, FF = 1024, BIG = 4 << 20 };

static float *x1, *x2, *x3, *o1, *o2, *w, *bias, *st1, *st2;
static int32_t *idx, *tgt;

static void setup(void) {
  float **bufs[] = {&x1, &x2, &x3, &o1, &o2, &w, &bias, &st1, &st2};
  unsigned s = 12345;
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    *bufs[i] = malloc(sizeof(float) * BIG);
    if (!*bufs[i]) abort();
    for (long j = 0; j < BIG; j++) {
      s = s * 1103515245u + 12345u;
      (*bufs[i])[j] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f; /* [-1, 1) */
    }
  }
  for (long j = 0; j < BIG; j++) x3[j] = 1.5f + x3[j]; /* positive: sqrt, div, log */
  idx = malloc(sizeof(int32_t) * BT);
  tgt = malloc(sizeof(int32_t) * BT);
  if (!idx || !tgt) abort();
  for (int i = 0; i < BT; i++) idx[i] = (i * 7919) % V, tgt[i] = (i * 104729) % V;
}

/* ENTRY(name, bytes, reference call, fast call): one row of the table */
typedef struct {
  const char *name;
  double bytes; /* read + written per call */
  void (*ref)(void);
  void (*fast)(void);
} Bench;

/* The baseline of the period-broadcast ops: ref.h's general broadcasting, with the full operand
 * a as [n / nb, nb] and b as [nb] (a scalar when nb is 1). */
static void ref_period_fwd(KBinary op, float *out, const float *a, const float *b, long nb, long n) {
  int ash[2] = {(int)(n / nb), (int)nb}, bsh[1] = {(int)nb};
  k_binary_forward(op, out, a, ash, 2, b, bsh, 1);
}
static void ref_period_bwd(KBinary op, float *da, float *db, const float *dout, const float *a, const float *b,
                           long nb, long n) {
  int ash[2] = {(int)(n / nb), (int)nb}, bsh[1] = {(int)nb};
  k_binary_backward(op, da, db, dout, a, ash, 2, b, bsh, 1);
}

#define DEF(id, R, F)                                                                              \
  static void id##_r(void) { R; }                                                                  \
  static void id##_f(void) { F; }
#define ROW(id, label, bytes) {label, (double)(bytes) * sizeof(float), id##_r, id##_f}

static const float *cx[3];
static const int cn[3] = {256, 256, 256};
static float *dcx[3];

DEF(ln_f, k_layer_norm_forward(o1, st1, st2, x1, w, bias, BT, C, 1e-5f),
    kf_layer_norm_forward(o1, st1, st2, x1, w, bias, BT, C, 1e-5f))
DEF(ln_b, k_layer_norm_backward(o1, o2, o2 + C, x2, x1, w, st1, st2, BT, C),
    kf_layer_norm_backward(o1, o2, o2 + C, x2, x1, w, st1, st2, BT, C))
DEF(rms_f, k_rms_norm_forward(o1, st2, x1, w, BT, C, 1e-5f),
    kf_rms_norm_forward(o1, st2, x1, w, BT, C, 1e-5f))
DEF(rms_b, k_rms_norm_backward(o1, o2, x2, x1, w, st2, BT, C),
    kf_rms_norm_backward(o1, o2, x2, x1, w, st2, BT, C))
DEF(sm_f, k_softmax_forward(o1, x1, H * B * T, T), kf_softmax_forward(o1, x1, H * B * T, T))
DEF(sm_b, k_softmax_backward(o2, x2, o1, H * B * T, T),
    kf_softmax_backward(o2, x2, o1, H * B * T, T))
DEF(lsm_f, k_log_softmax_forward(o1, x1, BT, V), kf_log_softmax_forward(o1, x1, BT, V))
DEF(lsm_b, k_log_softmax_backward(o2, x2, o1, BT, V), kf_log_softmax_backward(o2, x2, o1, BT, V))
DEF(ce_f, (void)k_cross_entropy_forward(NULL, x1, tgt, BT, V),
    (void)kf_cross_entropy_forward(NULL, x1, tgt, BT, V))
DEF(ce_b, k_cross_entropy_backward(o1, 1.0f, x1, tgt, BT, V),
    kf_cross_entropy_backward(o1, 1.0f, x1, tgt, BT, V))
DEF(gelu_f, k_unary_forward(K_GELU, o1, x1, BT * FF, 0), kf_unary_forward(K_GELU, o1, x1, BT * FF, 0))
DEF(gelu_b, k_unary_backward(K_GELU, o2, x2, x1, o1, BT * FF, 0),
    kf_unary_backward(K_GELU, o2, x2, x1, o1, BT * FF, 0))
DEF(silu_f, k_unary_forward(K_SILU, o1, x1, BT * FF, 0), kf_unary_forward(K_SILU, o1, x1, BT * FF, 0))
DEF(silu_b, k_unary_backward(K_SILU, o2, x2, x1, o1, BT * FF, 0),
    kf_unary_backward(K_SILU, o2, x2, x1, o1, BT * FF, 0))
DEF(tanh_f, k_unary_forward(K_TANH, o1, x1, BT * FF, 0), kf_unary_forward(K_TANH, o1, x1, BT * FF, 0))
DEF(exp_f, k_unary_forward(K_EXP, o1, x1, BT * FF, 0), kf_unary_forward(K_EXP, o1, x1, BT * FF, 0))
DEF(sqrt_f, k_unary_forward(K_SQRT, o1, x3, BT * FF, 0), kf_unary_forward(K_SQRT, o1, x3, BT * FF, 0))
DEF(sq_f, k_unary_forward(K_SQUARE, o1, x1, BT * FF, 0),
    kf_unary_forward(K_SQUARE, o1, x1, BT * FF, 0))
DEF(relu_b, k_unary_backward(K_RELU, o2, x2, x1, o1, BT * FF, 0),
    kf_unary_backward(K_RELU, o2, x2, x1, o1, BT * FF, 0))
DEF(div_p, ref_period_fwd(K_DIV, o1, x1, x3, C * C, C * C),
    kf_binary_period_forward(K_DIV, o1, x1, C * C, x3, C * C, C * C))
DEF(mul_s, ref_period_fwd(K_MUL, o1, x1, x3, 1, C * C),
    kf_binary_period_forward(K_MUL, o1, x1, C * C, x3, 1, C * C))
DEF(mul_bias, ref_period_fwd(K_MUL, o1, x1, w, C, BT * C),
    kf_binary_period_forward(K_MUL, o1, x1, BT * C, w, C, BT * C))
DEF(mul_pb, ref_period_bwd(K_MUL, o1, o2, x2, x1, w, C, BT * C),
    kf_binary_period_backward(K_MUL, o1, BT * C, o2, C, x2, x1, w, BT * C))
DEF(sum_all, k_sum_forward(o1, x1, 1, BT * FF, 1), kf_sum_forward(o1, x1, 1, BT * FF, 1))
DEF(sum_cols, k_sum_forward(o1, x1, 1, BT, C), kf_sum_forward(o1, x1, 1, BT, C))
DEF(tr_f, k_transpose_forward(o1, x1, 1, V, C), kf_transpose_forward(o1, x1, 1, V, C))
DEF(tr_b, k_transpose_backward(o1, x1, 1, V, C), kf_transpose_backward(o1, x1, 1, V, C))
DEF(emb_f, k_embedding_forward(o1, x1, idx, BT, V, C), kf_embedding_forward(o1, x1, idx, BT, V, C))
DEF(emb_b, k_embedding_backward(o1, x1, idx, BT, V, C), kf_embedding_backward(o1, x1, idx, BT, V, C))
DEF(sh_f, k_split_heads_forward(o1, x1, B, T, C, H), kf_split_heads_forward(o1, x1, B, T, C, H))
DEF(sh_b, k_split_heads_backward(o1, x1, B, T, C, H), kf_split_heads_backward(o1, x1, B, T, C, H))
DEF(mh_f, k_merge_heads_forward(o1, x1, B, T, C, H), kf_merge_heads_forward(o1, x1, B, T, C, H))
DEF(mh_b, k_merge_heads_backward(o1, x1, B, T, C, H), kf_merge_heads_backward(o1, x1, B, T, C, H))
DEF(sl_f, k_slice_forward(o1, x1, BT, 3 * C, 1, C, 2 * C),
    kf_slice_forward(o1, x1, BT, 3 * C, 1, C, 2 * C))
DEF(sl_b, k_slice_backward(o1, x1, BT, 3 * C, 1, C, 2 * C),
    kf_slice_backward(o1, x1, BT, 3 * C, 1, C, 2 * C))
DEF(cat_f, k_concat_forward(o1, cx, cn, 3, BT, 1), kf_concat_forward(o1, cx, cn, 3, BT, 1))
DEF(cat_b, k_concat_backward(dcx, x1, cn, 3, BT, 1), kf_concat_backward(dcx, x1, cn, 3, BT, 1))

static const Bench benches[] = {
    ROW(ln_f, "layer_norm_forward 1024x256", 3L * BT * C),
    ROW(ln_b, "layer_norm_backward 1024x256", 4L * BT * C),
    ROW(rms_f, "rms_norm_forward 1024x256", 2L * BT * C),
    ROW(rms_b, "rms_norm_backward 1024x256", 4L * BT * C),
    ROW(sm_f, "softmax_forward 8192x128", 2L * H * B * T * T),
    ROW(sm_b, "softmax_backward 8192x128", 4L * H * B * T * T),
    ROW(lsm_f, "log_softmax_forward 1024x512", 2L * BT * V),
    ROW(lsm_b, "log_softmax_backward 1024x512", 4L * BT * V),
    ROW(ce_f, "cross_entropy_forward 1024x512", 1L * BT * V),
    ROW(ce_b, "cross_entropy_backward 1024x512", 3L * BT * V),
    ROW(gelu_f, "unary_forward gelu 1M", 2L * BT * FF),
    ROW(gelu_b, "unary_backward gelu 1M", 4L * BT * FF),
    ROW(silu_f, "unary_forward silu 1M", 2L * BT * FF),
    ROW(silu_b, "unary_backward silu 1M", 4L * BT * FF),
    ROW(tanh_f, "unary_forward tanh 1M", 2L * BT * FF),
    ROW(exp_f, "unary_forward exp 1M", 2L * BT * FF),
    ROW(sqrt_f, "unary_forward sqrt 1M", 2L * BT * FF),
    ROW(sq_f, "unary_forward square 1M", 2L * BT * FF),
    ROW(relu_b, "unary_backward relu 1M", 4L * BT * FF),
    ROW(div_p, "binary_period_forward div 64K", 3L * C * C),
    ROW(mul_s, "binary_period_forward mul scalar 64K", 2L * C * C),
    ROW(mul_bias, "binary_period_forward mul [C] 256K", 2L * BT * C),
    ROW(mul_pb, "binary_period_backward mul [C] 256K", 5L * BT * C),
    ROW(sum_all, "sum_forward all 1M", 1L * BT * FF),
    ROW(sum_cols, "sum_forward columns 1024x256", 1L * BT * C),
    ROW(tr_f, "transpose_forward 512x256", 2L * V * C),
    ROW(tr_b, "transpose_backward 512x256", 3L * V * C),
    ROW(emb_f, "embedding_forward 1024x256", 2L * BT * C),
    ROW(emb_b, "embedding_backward 1024x256", 3L * BT * C),
    ROW(sh_f, "split_heads_forward 8x128x256", 2L * BT * C),
    ROW(sh_b, "split_heads_backward 8x128x256", 3L * BT * C),
    ROW(mh_f, "merge_heads_forward 8x128x256", 2L * BT * C),
    ROW(mh_b, "merge_heads_backward 8x128x256", 3L * BT * C),
    ROW(sl_f, "slice_forward 1024x768 -> 256", 2L * BT * C),
    ROW(sl_b, "slice_backward 1024x768 -> 256", 3L * BT * C),
    ROW(cat_f, "concat_forward 3 x 1024x256", 2L * 3 * BT * C),
    ROW(cat_b, "concat_backward 3 x 1024x256", 3L * 3 * BT * C),
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* best seconds per call over batches of calls, about 0.1 s in all */
static double best_time(void (*fn)(void)) {
  fn(); /* warm the caches and the page tables */
  double best = 1e30, start = now();
  for (int rep = 0; rep < 5 || now() - start < 0.1; rep++) {
    double t0 = now();
    fn();
    double dt = now() - t0;
    if (dt < best) best = dt;
    if (rep > 1000) break;
  }
  return best;
}

int main(void) {
  setup();
  cx[0] = x1, cx[1] = x2, cx[2] = x3;
  dcx[0] = o1, dcx[1] = o2, dcx[2] = st1;
  printf("kernels_cpu: fast_nn.c vs the reference, 1 thread, best of >= 5 calls\n");
  printf("%-38s %10s %10s %8s %8s %8s\n", "kernel", "ref us", "fast us", "ref GB/s", "fast GB/s",
         "speedup");
  for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++) {
    const Bench *b = &benches[i];
    double tr = best_time(b->ref), tf = best_time(b->fast);
    printf("%-38s %10.1f %10.1f %8.2f %8.2f %7.1fx\n", b->name, tr * 1e6, tf * 1e6,
           b->bytes / tr / 1e9, b->bytes / tf / 1e9, tr / tf);
  }
  return 0;
}
