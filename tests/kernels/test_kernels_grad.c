/* test_kernels_grad.c: checks the CPU reference kernels (kernels/cpu/ref.c).
 *
 * 1. Gradient checks: for every differentiable kernel, the double build (k_*_f64) is run on
 *    random inputs, the loss L = sum(out * r) for a random r is differentiated by central finite
 *    differences, and compared with the backward kernel given dout = r. Gradients start at
 *    GRAD_SEED rather than 0, so a backward that assigns instead of accumulating fails.
 * 2. Forward checks against hand-computed values, on the float build that plans run.
 * Prints one line per check and "N passed, N failed"; exits non-zero on any failure. */
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEP 1e-5      /* finite-difference step: truncation ~STEP^2, rounding ~1e-16/STEP */
#define TOL 1e-6       /* relative error allowed between analytic and numeric gradients */
#define REL_FLOOR 1e-2 /* below this magnitude the error is measured absolutely */
#define GRAD_SEED 0.25 /* initial value of every gradient buffer (tests +=) */
#define MAXIN 4

static int n_pass, n_fail;

static void report(int ok, const char *what, const char *detail) {
  printf("%s %-34s %s\n", ok ? "ok  " : "FAIL", what, detail);
  if (ok)
    n_pass++;
  else
    n_fail++;
}

/* ---- deterministic random numbers ------------------------------------------------------------ */

static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;

static double rnd(double lo, double hi) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}

static double *rnd_buf(long n, double lo, double hi) {
  double *p = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  for (long i = 0; i < n; i++) p[i] = rnd(lo, hi);
  return p;
}

/* values in [lo, hi] in magnitude with a random sign: keeps relu away from its kink */
static double *rnd_away_from_zero(long n, double lo, double hi) {
  double *p = rnd_buf(n, lo, hi);
  for (long i = 0; i < n; i++)
    if (rnd(0, 1) < 0.5) p[i] = -p[i];
  return p;
}

/* ---- the gradient-check harness --------------------------------------------------------------- */

typedef struct Case Case;
struct Case {
  const char *name;
  int nin;              /* differentiable inputs x[0..nin) */
  double *x[MAXIN];     /* their values */
  long nx[MAXIN];       /* their sizes */
  long nout;            /* size of the output */
  int p[8];             /* shape and integer attribute arguments, per case */
  double f;             /* a float attribute (pow's exponent, eps, base, p) */
  int32_t *idx;         /* targets / indices */
  uint8_t *keep;        /* dropout mask */
  int op;               /* KUnary or KBinary */
  void (*fwd)(const Case *c, double *out);
  /* adds the gradients for dout into dx[i]; out is what fwd gave */
  void (*bwd)(const Case *c, double **dx, const double *dout, const double *out);
};

static double loss_of(const Case *c, double *out, const double *r) {
  c->fwd(c, out);
  double s = 0;
  for (long i = 0; i < c->nout; i++) s += out[i] * r[i];
  return s;
}

/* worst relative error of input i's analytic gradient; *gmax gets the largest numeric entry */
static double check_input(Case *c, int i, const double *grad, double *out, const double *r,
                          double *gmax) {
  double worst = 0;
  for (long e = 0; e < c->nx[i]; e++) {
    double save = c->x[i][e];
    c->x[i][e] = save + STEP;
    double lp = loss_of(c, out, r);
    c->x[i][e] = save - STEP;
    double lm = loss_of(c, out, r);
    c->x[i][e] = save;
    double num = (lp - lm) / (2 * STEP), ana = grad[e];
    double den = fmax(fmax(fabs(num), fabs(ana)), REL_FLOOR);
    worst = fmax(worst, fabs(num - ana) / den);
    *gmax = fmax(*gmax, fabs(num));
  }
  return worst;
}

static void grad_check(Case *c) {
  double *out = calloc((size_t)c->nout, sizeof(double)), *r = rnd_buf(c->nout, -1, 1);
  double *dx[MAXIN] = {0};
  for (int i = 0; i < c->nin; i++) {
    dx[i] = malloc(sizeof(double) * (size_t)c->nx[i]);
    for (long e = 0; e < c->nx[i]; e++) dx[i][e] = GRAD_SEED;
  }
  c->fwd(c, out);
  c->bwd(c, dx, r, out);
  double worst = 0, gmax = 0;
  for (int i = 0; i < c->nin; i++) {
    for (long e = 0; e < c->nx[i]; e++) dx[i][e] -= GRAD_SEED;
    worst = fmax(worst, check_input(c, i, dx[i], out, r, &gmax));
  }
  char detail[128], what[64];
  /* a gradient that is zero everywhere would pass vacuously: require a live one */
  snprintf(detail, sizeof detail, "max rel err %.2e (tol %.0e), max |grad| %.3f", worst, TOL, gmax);
  snprintf(what, sizeof what, "grad %s", c->name);
  report(worst <= TOL && gmax > 1e-3, what, detail);
  for (int i = 0; i < c->nin; i++) free(dx[i]);
  free(out);
  free(r);
}

/* ---- forward/backward adapters, one pair per kernel family ---------------------------------- */

static void unary_fwd(const Case *c, double *out) {
  k_unary_forward_f64((KUnary)c->op, out, c->x[0], c->nx[0], c->f);
}
static void unary_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  k_unary_backward_f64((KUnary)c->op, dx[0], dout, c->x[0], out, c->nx[0], c->f);
}

/* binary: a is [p0, p1, p2] and b is [p3, p4] (rank 2), so both broadcast */
static void binary_fwd(const Case *c, double *out) {
  int as[3] = {c->p[0], c->p[1], c->p[2]}, bs[2] = {c->p[3], c->p[4]};
  k_binary_forward_f64((KBinary)c->op, out, c->x[0], as, 3, c->x[1], bs, 2);
}
static void binary_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  int as[3] = {c->p[0], c->p[1], c->p[2]}, bs[2] = {c->p[3], c->p[4]};
  k_binary_backward_f64((KBinary)c->op, dx[0], dx[1], dout, c->x[0], as, 3, c->x[1], bs, 2);
}

/* reductions: op 0 sum, 1 mean, 2 max over [p0, p1, p2] */
static void reduce_fwd(const Case *c, double *out) {
  void (*f[3])(double *, const double *, int, int, int) = {k_sum_forward_f64, k_mean_forward_f64,
                                                           k_max_forward_f64};
  f[c->op](out, c->x[0], c->p[0], c->p[1], c->p[2]);
}
static void reduce_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  if (c->op == 0) k_sum_backward_f64(dx[0], dout, c->p[0], c->p[1], c->p[2]);
  if (c->op == 1) k_mean_backward_f64(dx[0], dout, c->p[0], c->p[1], c->p[2]);
  if (c->op == 2) k_max_backward_f64(dx[0], dout, c->x[0], c->p[0], c->p[1], c->p[2]);
}

/* matmul: nb, m, k, n, b_batched */
static void matmul_fwd(const Case *c, double *out) {
  k_matmul_forward_f64(out, c->x[0], c->x[1], c->p[0], c->p[1], c->p[2], c->p[3], c->p[4]);
}
static void matmul_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  k_matmul_backward_f64(dx[0], dx[1], dout, c->x[0], c->x[1], c->p[0], c->p[1], c->p[2], c->p[3],
                        c->p[4]);
}

static void transpose_fwd(const Case *c, double *out) {
  k_transpose_forward_f64(out, c->x[0], c->p[0], c->p[1], c->p[2]);
}
static void transpose_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  k_transpose_backward_f64(dx[0], dout, c->p[0], c->p[1], c->p[2]);
}

/* permute: shape p0..p2, perm p3..p5 */
static void permute_fwd(const Case *c, double *out) {
  k_permute_forward_f64(out, c->x[0], c->p, 3, c->p + 3);
}
static void permute_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  k_permute_backward_f64(dx[0], dout, c->p, 3, c->p + 3);
}

/* softmax (op 0) and log_softmax (op 1) over [p0, p1] */
static void softmax_fwd(const Case *c, double *out) {
  (c->op ? k_log_softmax_forward_f64 : k_softmax_forward_f64)(out, c->x[0], c->p[0], c->p[1]);
}
static void softmax_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  (c->op ? k_log_softmax_backward_f64 : k_softmax_backward_f64)(dx[0], dout, out, c->p[0], c->p[1]);
}

/* layer_norm: x [p0, p1], w, b [p1], eps f */
static void layer_norm_fwd(const Case *c, double *out) {
  k_layer_norm_forward_f64(out, NULL, NULL, c->x[0], c->x[1], c->x[2], c->p[0], c->p[1], c->f);
}
static void layer_norm_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  double mean[64], rstd[64], tmp[1024]; /* the forward's saved statistics */
  k_layer_norm_forward_f64(tmp, mean, rstd, c->x[0], c->x[1], c->x[2], c->p[0], c->p[1], c->f);
  k_layer_norm_backward_f64(dx[0], dx[1], dx[2], dout, c->x[0], c->x[1], mean, rstd, c->p[0],
                            c->p[1]);
}

static void rms_norm_fwd(const Case *c, double *out) {
  k_rms_norm_forward_f64(out, NULL, c->x[0], c->x[1], c->p[0], c->p[1], c->f);
}
static void rms_norm_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  double rstd[64], tmp[1024];
  k_rms_norm_forward_f64(tmp, rstd, c->x[0], c->x[1], c->p[0], c->p[1], c->f);
  k_rms_norm_backward_f64(dx[0], dx[1], dout, c->x[0], c->x[1], rstd, c->p[0], c->p[1]);
}

/* rope: [p0, p1, p2], base f */
static void rope_fwd(const Case *c, double *out) {
  k_rope_forward_f64(out, c->x[0], c->p[0], c->p[1], c->p[2], c->f);
}
static void rope_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  k_rope_backward_f64(dx[0], dout, c->p[0], c->p[1], c->p[2], c->f);
}

/* sdpa: nb p0, t p1, d p2, causal p3 */
static void sdpa_fwd(const Case *c, double *out) {
  double att[1024];
  k_sdpa_forward_f64(out, att, c->x[0], c->x[1], c->x[2], c->p[0], c->p[1], c->p[2], c->p[3]);
}
static void sdpa_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  double att[1024], tmp[1024];
  k_sdpa_forward_f64(tmp, att, c->x[0], c->x[1], c->x[2], c->p[0], c->p[1], c->p[2], c->p[3]);
  k_sdpa_backward_f64(dx[0], dx[1], dx[2], dout, att, c->x[0], c->x[1], c->x[2], c->p[0], c->p[1],
                      c->p[2]);
}

static void dropout_fwd(const Case *c, double *out) {
  k_dropout_forward_f64(out, c->x[0], c->keep, c->nx[0], c->f);
}
static void dropout_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  k_dropout_backward_f64(dx[0], dout, c->keep, c->nx[0], c->f);
}

/* cross_entropy: logits [p0, p1], targets idx; the output is the scalar loss */
static void ce_fwd(const Case *c, double *out) {
  out[0] = k_cross_entropy_forward_f64(NULL, c->x[0], c->idx, c->p[0], c->p[1]);
}
static void ce_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  k_cross_entropy_backward_f64(dx[0], dout[0], c->x[0], c->idx, c->p[0], c->p[1]);
}

/* embedding: n p0, v p1, c p2 */
static void emb_fwd(const Case *c, double *out) {
  k_embedding_forward_f64(out, c->x[0], c->idx, c->p[0], c->p[1], c->p[2]);
}
static void emb_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  k_embedding_backward_f64(dx[0], dout, c->idx, c->p[0], c->p[1], c->p[2]);
}

/* split_heads (op 0) / merge_heads (op 1): b p0, t p1, c p2, h p3 */
static void heads_fwd(const Case *c, double *out) {
  (c->op ? k_merge_heads_forward_f64 : k_split_heads_forward_f64)(out, c->x[0], c->p[0], c->p[1],
                                                                  c->p[2], c->p[3]);
}
static void heads_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  (c->op ? k_merge_heads_backward_f64 : k_split_heads_backward_f64)(dx[0], dout, c->p[0], c->p[1],
                                                                    c->p[2], c->p[3]);
}

/* slice: outer p0, n p1, inner p2, start p3, end p4 */
static void slice_fwd(const Case *c, double *out) {
  k_slice_forward_f64(out, c->x[0], c->p[0], c->p[1], c->p[2], c->p[3], c->p[4]);
}
static void slice_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  k_slice_backward_f64(dx[0], dout, c->p[0], c->p[1], c->p[2], c->p[3], c->p[4]);
}

/* concat of nin inputs: outer p0, inner p1, ns p2.. */
static void concat_fwd(const Case *c, double *out) {
  k_concat_forward_f64(out, (const double *const *)c->x, c->p + 2, c->nin, c->p[0], c->p[1]);
}
static void concat_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  k_concat_backward_f64(dx, dout, c->p + 2, c->nin, c->p[0], c->p[1]);
}

/* ---- the gradient cases ----------------------------------------------------------------------- */

static void run_case(Case c) {
  grad_check(&c);
  for (int i = 0; i < c.nin; i++) free(c.x[i]);
}

static void grad_unary(void) {
  for (int op = 0; op < K_UNARY_COUNT; op++) {
    int positive = op == K_LOG || op == K_SQRT || op == K_RSQRT || op == K_POW;
    /* clamp's bound inside the inputs' range, so that both sides of it are checked */
    double f = op == K_CLAMP_MIN || op == K_CLAMP_MAX ? 0.3 : 2.5;
    Case c = {.name = k_unary_names[op], .nin = 1, .nx = {9}, .nout = 9, .op = op, .f = f,
              .fwd = unary_fwd, .bwd = unary_bwd};
    c.x[0] = positive ? rnd_buf(9, 0.5, 2.0) : rnd_away_from_zero(9, 0.1, 2.0);
    run_case(c);
  }
}

static void grad_binary(void) {
  for (int op = 0; op < K_BINARY_GRAD_END; op++) {
    char name[48];
    snprintf(name, sizeof name, "%s [2,1,4]x[3,1]", k_binary_names[op]);
    Case c = {.name = name, .nin = 2, .nx = {8, 3}, .nout = 24, .op = op, .p = {2, 1, 4, 3, 1},
              .fwd = binary_fwd, .bwd = binary_bwd};
    c.x[0] = rnd_buf(8, -2, 2);
    c.x[1] = rnd_away_from_zero(3, 0.5, 2); /* a divisor away from 0 */
    run_case(c);
  }
}

/* where(cond [2,1,4], a [3,1], b [4]) -> [2,3,4]: a's gradient sums over dims 0 and 2, b's over 0
 * and 1; cond mixes 0, 1 and other nonzero values (true) */
static const double where_cond[8] = {1, 0, 0, 2, -1, 0, 1, 0};
static const int where_os[3] = {2, 3, 4}, where_cs[3] = {2, 1, 4}, where_as[2] = {3, 1}, where_bs[1] = {4};
static void where_fwd(const Case *c, double *out) {
  k_where_forward_f64(out, where_os, 3, where_cond, where_cs, 3, c->x[0], where_as, 2, c->x[1], where_bs, 1);
}
static void where_bwd(const Case *c, double **dx, const double *dout, const double *out) {
  k_where_backward_f64(dx[0], dx[1], dout, where_os, 3, where_cond, where_cs, 3, where_as, 2, where_bs, 1);
}

static void grad_where(void) {
  Case c = {.name = "where [2,1,4]?[3,1]:[4]", .nin = 2, .nx = {3, 4}, .nout = 24, .fwd = where_fwd, .bwd = where_bwd};
  c.x[0] = rnd_buf(3, -2, 2);
  c.x[1] = rnd_buf(4, -2, 2);
  run_case(c);
}

static void grad_reductions(void) {
  static const char *names[3] = {"sum axis 1 of [2,3,4]", "mean axis 1 of [2,3,4]",
                                 "max axis 1 of [2,3,4]"};
  for (int op = 0; op < 3; op++) {
    Case c = {.name = names[op], .nin = 1, .nx = {24}, .nout = 8, .op = op, .p = {2, 3, 4},
              .fwd = reduce_fwd, .bwd = reduce_bwd};
    c.x[0] = rnd_buf(24, -1, 1);
    run_case(c);
  }
}

static void grad_linear(void) {
  Case mb = {.name = "matmul [2,3,4]@[2,4,5]", .nin = 2, .nx = {24, 40}, .nout = 30,
             .p = {2, 3, 4, 5, 1}, .fwd = matmul_fwd, .bwd = matmul_bwd};
  mb.x[0] = rnd_buf(24, -1, 1), mb.x[1] = rnd_buf(40, -1, 1);
  run_case(mb);
  Case mw = {.name = "matmul [2,3,4]@[4,5] (weight)", .nin = 2, .nx = {24, 20}, .nout = 30,
             .p = {2, 3, 4, 5, 0}, .fwd = matmul_fwd, .bwd = matmul_bwd};
  mw.x[0] = rnd_buf(24, -1, 1), mw.x[1] = rnd_buf(20, -1, 1);
  run_case(mw);
  Case tr = {.name = "transpose [2,3,4]", .nin = 1, .nx = {24}, .nout = 24, .p = {2, 3, 4},
             .fwd = transpose_fwd, .bwd = transpose_bwd};
  tr.x[0] = rnd_buf(24, -1, 1);
  run_case(tr);
  Case pm = {.name = "permute [2,3,4] (2,0,1)", .nin = 1, .nx = {24}, .nout = 24,
             .p = {2, 3, 4, 2, 0, 1}, .fwd = permute_fwd, .bwd = permute_bwd};
  pm.x[0] = rnd_buf(24, -1, 1);
  run_case(pm);
}

static void grad_nn(void) {
  for (int op = 0; op < 2; op++) {
    Case c = {.name = op ? "log_softmax [3,5]" : "softmax [3,5]", .nin = 1, .nx = {15}, .nout = 15,
              .op = op, .p = {3, 5}, .fwd = softmax_fwd, .bwd = softmax_bwd};
    c.x[0] = rnd_buf(15, -2, 2);
    run_case(c);
  }
  Case ln = {.name = "layer_norm [3,6]", .nin = 3, .nx = {18, 6, 6}, .nout = 18, .p = {3, 6},
             .f = 1e-5, .fwd = layer_norm_fwd, .bwd = layer_norm_bwd};
  ln.x[0] = rnd_buf(18, -2, 2), ln.x[1] = rnd_buf(6, 0.5, 1.5), ln.x[2] = rnd_buf(6, -1, 1);
  run_case(ln);
  Case rn = {.name = "rms_norm [3,6]", .nin = 2, .nx = {18, 6}, .nout = 18, .p = {3, 6}, .f = 1e-5,
             .fwd = rms_norm_fwd, .bwd = rms_norm_bwd};
  rn.x[0] = rnd_buf(18, -2, 2), rn.x[1] = rnd_buf(6, 0.5, 1.5);
  run_case(rn);
  Case rp = {.name = "rope [2,4,6] base 100", .nin = 1, .nx = {48}, .nout = 48, .p = {2, 4, 6},
             .f = 100, .fwd = rope_fwd, .bwd = rope_bwd};
  rp.x[0] = rnd_buf(48, -1, 1);
  run_case(rp);
  for (int causal = 0; causal < 2; causal++) {
    Case sd = {.name = causal ? "sdpa causal [2,4,3]" : "sdpa [2,4,3]", .nin = 3,
               .nx = {24, 24, 24}, .nout = 24, .p = {2, 4, 3, causal}, .fwd = sdpa_fwd,
               .bwd = sdpa_bwd};
    for (int i = 0; i < 3; i++) sd.x[i] = rnd_buf(24, -1.5, 1.5);
    run_case(sd);
  }
  uint8_t keep[12] = {1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0};
  for (int masked = 0; masked < 2; masked++) {
    Case dr = {.name = masked ? "dropout p=0.25 with mask" : "dropout (eval, identity)", .nin = 1,
               .nx = {12}, .nout = 12, .f = 0.25, .keep = masked ? keep : NULL,
               .fwd = dropout_fwd, .bwd = dropout_bwd};
    dr.x[0] = rnd_buf(12, -1, 1);
    run_case(dr);
  }
}

static void grad_loss_and_layout(void) {
  int32_t targets[4] = {1, -1, 4, 0};
  Case ce = {.name = "cross_entropy [4,5] one -1", .nin = 1, .nx = {20}, .nout = 1, .p = {4, 5},
             .idx = targets, .fwd = ce_fwd, .bwd = ce_bwd};
  ce.x[0] = rnd_buf(20, -2, 2);
  run_case(ce);
  int32_t idx[5] = {1, 3, 1, 0, 1}; /* repeats: the backward must sum them */
  Case em = {.name = "embedding [5,3] at 5 indices", .nin = 1, .nx = {15}, .nout = 15,
             .p = {5, 5, 3}, .idx = idx, .fwd = emb_fwd, .bwd = emb_bwd};
  em.x[0] = rnd_buf(15, -1, 1);
  run_case(em);
  for (int op = 0; op < 2; op++) {
    Case hd = {.name = op ? "merge_heads [2,2,3,3]" : "split_heads [2,3,6] h=2", .nin = 1,
               .nx = {36}, .nout = 36, .op = op, .p = {2, 3, 6, 2}, .fwd = heads_fwd,
               .bwd = heads_bwd};
    hd.x[0] = rnd_buf(36, -1, 1);
    run_case(hd);
  }
  Case sl = {.name = "slice [2,5,3] axis 1 [1,4)", .nin = 1, .nx = {30}, .nout = 18,
             .p = {2, 5, 3, 1, 4}, .fwd = slice_fwd, .bwd = slice_bwd};
  sl.x[0] = rnd_buf(30, -1, 1);
  run_case(sl);
  Case cc = {.name = "concat [2,{2,1,3},3] axis 1", .nin = 3, .nx = {12, 6, 18}, .nout = 36,
             .p = {2, 3, 2, 1, 3}, .fwd = concat_fwd, .bwd = concat_bwd};
  for (int i = 0; i < 3; i++) cc.x[i] = rnd_buf(cc.nx[i], -1, 1);
  run_case(cc);
}

/* ---- forward checks against hand-computed values ------------------------------------------ */

/* compares got[0..n) (float) with want; tolerance 2e-6 absolute, near float resolution */
static void expect(const char *what, const float *got, const double *want, int n) {
  double worst = 0;
  for (int i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]));
  char detail[96];
  snprintf(detail, sizeof detail, "max abs err %.1e (tol 2e-6)", worst);
  report(worst <= 2e-6, what, detail);
}

static void fwd_values(void) {
  float x1 = 1.0f, g;
  k_unary_forward(K_GELU, &g, &x1, 1, 0);
  expect("fwd gelu(1.0) = 0.841192", &g, (double[]){0.841192}, 1);

  float sx[3] = {1, 2, 3}, sy[3];
  k_softmax_forward(sy, sx, 1, 3);
  expect("fwd softmax [1,2,3]", sy, (double[]){0.09003057, 0.24472847, 0.66524096}, 3);
  k_log_softmax_forward(sy, sx, 1, 3);
  expect("fwd log_softmax [1,2,3]", sy, (double[]){-2.40760596, -1.40760596, -0.40760596}, 3);

  /* mean 2.5, biased variance 1.25; eps 0 so the values are exact: (x - 2.5) / sqrt(1.25) */
  float lx[4] = {1, 2, 3, 4}, lw[4] = {1, 1, 2, 1}, lb[4] = {0, 0, 0, 1}, ly[4];
  k_layer_norm_forward(ly, NULL, NULL, lx, lw, lb, 1, 4, 0.0f);
  expect("fwd layer_norm [1,2,3,4]", ly, (double[]){-1.34164079, -0.44721360, 0.89442719, 2.34164079},
         4);
  k_rms_norm_forward(ly, NULL, lx, lw, 1, 4, 0.0f); /* rms = sqrt(7.5) */
  expect("fwd rms_norm [1,2,3,4]", ly, (double[]){0.36514837, 0.73029674, 2.19089023, 1.46059349},
         4);

  /* t = 2, d = 4: position 0 is unchanged; at position 1 pair 0 turns by 1 rad and pair 1 by
   * base^(-2/4) = 0.01 rad */
  float rx[8] = {1, 0, 0, 1, 1, 0, 0, 1}, ry[8];
  k_rope_forward(ry, rx, 1, 2, 4, 10000.0f);
  expect("fwd rope pos 0,1 d=4", ry,
         (double[]){1, 0, 0, 1, cos(1.0), sin(1.0), -sin(0.01), cos(0.01)}, 8);

  /* causal, t = 2, d = 1: row 0 sees only key 0; row 1 weighs keys 0,1 by softmax([0, 1]) */
  float q[2] = {1, 1}, k[2] = {0, 1}, v[2] = {1, 3}, o[2], att[4];
  k_sdpa_forward(o, att, q, k, v, 1, 2, 1, 1);
  double w1 = exp(1.0) / (1 + exp(1.0));
  expect("fwd sdpa causal T=2", o, (double[]){1.0, (1 - w1) * 1 + w1 * 3}, 2);
  expect("fwd sdpa causal T=2 att", att, (double[]){1, 0, 1 - w1, w1}, 4);

  /* rows: log 2; log(1 + e^-1); ignored. Mean over the 2 counted rows. */
  float logits[6] = {0, 0, 1, 2, 5, 5};
  int32_t tg[3] = {0, 1, -1};
  int count = 0;
  float loss = k_cross_entropy_forward(&count, logits, tg, 3, 2);
  expect("fwd cross_entropy with a -1", &loss, (double[]){(log(2.0) + log(1 + exp(-1.0))) / 2}, 1);
  report(count == 2, "fwd cross_entropy count = 2", "");
  float dl[6] = {0};
  k_cross_entropy_backward(dl, 1.0f, logits, tg, 3, 2);
  report(dl[4] == 0 && dl[5] == 0, "bwd cross_entropy: -1 row gets 0", "");

  float a[2] = {3, 3}, b[2] = {3, 1}, mo[2], da[2] = {0}, db[2] = {0}, ones[2] = {1, 1};
  int s2[1] = {2};
  k_binary_forward(K_MAXIMUM, mo, a, s2, 1, b, s2, 1);
  k_binary_backward(K_MAXIMUM, da, db, ones, a, s2, 1, b, s2, 1);
  report(mo[0] == 3 && da[0] == 0.5f && db[0] == 0.5f && da[1] == 1 && db[1] == 0,
         "maximum tie splits the gradient", "");
}

static void fwd_misc(void) {
  int os[3] = {2, 3, 4}, is[2] = {3, 1}, bs[3];
  /* output (1, 2, 3) = flat 23 maps to input (2, 0) = flat 2 */
  report(k_bcast_index(23, os, 3, is, 2) == 2, "broadcast index [2,3,4] -> [3,1]", "");
  int a0[3] = {2, 1, 4};
  int rank = k_bcast_shape(bs, a0, 3, is, 2);
  report(rank == 3 && bs[0] == 2 && bs[1] == 3 && bs[2] == 4, "broadcast shape [2,1,4]x[3,1]", "");

  int32_t ar[4];
  k_arange_forward(ar, 4);
  report(ar[0] == 0 && ar[3] == 3, "fwd arange(4)", "");

  float ax[6] = {1, 5, 2, 7, 7, 0};
  int32_t am[2];
  k_argmax_forward(am, ax, 2, 3, 1);
  report(am[0] == 1 && am[1] == 0, "fwd argmax, first maximum wins", "");

  int32_t fi[4] = {-3, 0, 7, 16777217};
  float ff[4];
  k_float_forward(ff, fi, 4);
  expect("fwd float (i32 -> f32, rounded past 2^24)", ff, (double[]){-3, 0, 7, 16777216}, 4);

  /* PyTorch's values: abs'(0) = 0; clamp's gradient is 1 on its bounds (the closed range); min >
   * max gives max everywhere with no gradient; a NaN stays NaN */
  float ux[4] = {-2, 0, 0.5f, 3}, uy[4], ug[4], one4[4] = {1, 1, 1, 1};
  k_unary_forward(K_ABS, uy, ux, 4, 0);
  expect("fwd abs", uy, (double[]){2, 0, 0.5, 3}, 4);
  memset(ug, 0, sizeof ug);
  k_unary_backward(K_ABS, ug, one4, ux, uy, 4, 0);
  expect("bwd abs: sign, 0 at 0", ug, (double[]){-1, 0, 1, 1}, 4);
  k_unary_forward(K_CLAMP_MIN, uy, ux, 4, 0.5f);
  memset(ug, 0, sizeof ug);
  k_unary_backward(K_CLAMP_MIN, ug, one4, ux, uy, 4, 0.5f);
  expect("fwd clamp_min 0.5", uy, (double[]){0.5, 0.5, 0.5, 3}, 4);
  expect("bwd clamp_min: 1 on the bound", ug, (double[]){0, 0, 1, 1}, 4);
  k_unary_forward(K_CLAMP_MAX, uy, ux, 4, 0.0f);
  memset(ug, 0, sizeof ug);
  k_unary_backward(K_CLAMP_MAX, ug, one4, ux, uy, 4, 0.0f);
  expect("fwd clamp_max 0", uy, (double[]){-2, 0, 0, 0}, 4);
  expect("bwd clamp_max: 1 on the bound", ug, (double[]){1, 1, 0, 0}, 4);
  float mid[4], ucl[4];
  k_unary_forward(K_CLAMP_MIN, mid, ux, 4, 1.0f); /* clamp(x, min = 1, max = -1) */
  k_unary_forward(K_CLAMP_MAX, ucl, mid, 4, -1.0f);
  expect("fwd clamp min > max: max everywhere", ucl, (double[]){-1, -1, -1, -1}, 4);
  float nan1[1] = {NAN}, nano[2];
  k_unary_forward(K_CLAMP_MIN, nano, nan1, 1, 0.0f);
  k_unary_forward(K_CLAMP_MAX, nano + 1, nan1, 1, 0.0f);
  report(isnan(nano[0]) && isnan(nano[1]), "fwd clamp of NaN is NaN", "");
  float wc[3] = {1, 0, 1}, wa[3] = {1, 2, 3}, wb[1] = {-INFINITY}, wy[3];
  int w3[1] = {3}, w0[1] = {1};
  k_where_forward(wy, w3, 1, wc, w3, 1, wa, w3, 1, wb, w0, 1);
  report(wy[0] == 1 && wy[1] == -INFINITY && wy[2] == 3, "fwd where with a -inf branch", "");
  wb[0] = NAN; /* the branch not taken never leaks (no 0 * NaN) */
  k_where_forward(wy, w3, 1, wc, w3, 1, wa, w3, 1, wb, w0, 1);
  report(wy[0] == 1 && isnan(wy[1]) && wy[2] == 3, "fwd where with a NaN branch", "");

  float ca[3] = {1, 2, 3}, cb[3] = {2, 2, 2}, cy[3];
  int s3[1] = {3};
  k_binary_forward(K_LT, cy, ca, s3, 1, cb, s3, 1);
  expect("fwd lt -> 1.0/0.0", cy, (double[]){1, 0, 0}, 3);
  k_binary_forward(K_EQ, cy, ca, s3, 1, cb, s3, 1);
  expect("fwd eq -> 1.0/0.0", cy, (double[]){0, 1, 0}, 3);

  /* split_heads channel layout: channel = head * (C/h) + j */
  float hx[8] = {0, 1, 2, 3, 4, 5, 6, 7}, hy[8];
  k_split_heads_forward(hy, hx, 1, 2, 4, 2); /* [1,2,4] -> [1,2,2,2] */
  expect("fwd split_heads layout", hy, (double[]){0, 1, 4, 5, 2, 3, 6, 7}, 8);
}

/* A kernel whose forward and backward are wrong in the same way (a permutation inverted, a slice
 * offset dropped) still passes its gradient check, so the layouts are pinned by value here. */
static void fwd_layouts(void) {
  float x[24], y[24];
  for (int i = 0; i < 24; i++) x[i] = (float)i;
  k_transpose_forward(y, x, 1, 2, 3);
  expect("fwd transpose [2,3]", y, (double[]){0, 3, 1, 4, 2, 5}, 6);
  /* out [4,2,3]: out[a,b,c] = x[b,c,a], so out[1,0,2] = x[0,2,1] = 9, out[3,1,0] = x[1,0,3] = 15 */
  int shape[3] = {2, 3, 4}, perm[3] = {2, 0, 1};
  k_permute_forward(y, x, shape, 3, perm);
  expect("fwd permute (2,0,1) out[1,0,2]", &y[8], (double[]){9}, 1);
  expect("fwd permute (2,0,1) out[3,1,0]", &y[21], (double[]){15}, 1);
  k_slice_forward(y, x, 2, 3, 2, 1, 3); /* x [2,3,2] rows 1..2 of each outer */
  expect("fwd slice [2,3,2] axis 1 [1,3)", y, (double[]){2, 3, 4, 5, 8, 9, 10, 11}, 8);
  const float *parts[2] = {x, x + 10};
  int ns[2] = {1, 2};
  k_concat_forward(y, parts, ns, 2, 2, 1); /* [2,1,1] ++ [2,2,1] -> [2,3,1] */
  expect("fwd concat axis 1", y, (double[]){0, 10, 11, 1, 12, 13}, 6);
  float a[4] = {1, 2, 3, 4}, b[6] = {1, 0, 2, 0, 1, 3};
  k_matmul_forward(y, a, b, 1, 2, 2, 3, 0); /* [[1,2],[3,4]] @ [[1,0,2],[0,1,3]] */
  expect("fwd matmul [2,2]@[2,3]", y, (double[]){1, 2, 8, 3, 4, 18}, 6);
  int32_t idx[3] = {2, 0, 2};
  k_embedding_forward(y, x, idx, 3, 4, 2);
  expect("fwd embedding rows 2,0,2", y, (double[]){4, 5, 0, 1, 4, 5}, 6);
  k_sum_forward(y, x, 2, 3, 1);
  expect("fwd sum [2,3] axis 1", y, (double[]){3, 12}, 2);
  k_max_forward(y, x, 1, 2, 3); /* [2,3] axis 0 */
  expect("fwd max [2,3] axis 0", y, (double[]){3, 4, 5}, 3);
}

/* the float build is the same source; make sure it agrees with the double build */
static void fwd_float_matches_double(void) {
  double xd[9], yd[9];
  float xf[9], yf[9];
  for (int op = 0; op < K_UNARY_COUNT; op++) {
    for (int i = 0; i < 9; i++) xd[i] = 0.25 + 0.2 * i, xf[i] = (float)xd[i];
    k_unary_forward_f64((KUnary)op, yd, xd, 9, 2.5);
    k_unary_forward((KUnary)op, yf, xf, 9, 2.5f);
    double worst = 0;
    for (int i = 0; i < 9; i++) worst = fmax(worst, fabs(yf[i] - yd[i]) / fmax(1, fabs(yd[i])));
    char what[64], detail[64];
    snprintf(what, sizeof what, "f32 = f64 %s", k_unary_names[op]);
    snprintf(detail, sizeof detail, "max rel err %.1e (tol 1e-6)", worst);
    report(worst <= 1e-6, what, detail);
  }
}

int main(void) {
  grad_unary();
  grad_binary();
  grad_where();
  grad_reductions();
  grad_linear();
  grad_nn();
  grad_loss_and_layout();
  fwd_values();
  fwd_misc();
  fwd_layouts();
  fwd_float_matches_double();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
