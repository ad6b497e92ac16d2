/* fast_nn.c: the fast f32 twins (kf_*) of the reference kernels; see fast_nn.h for the contract.
 *
 * How they are fast, without OpenMP or -ffast-math:
 *  - every inner loop is a plain contiguous loop over float that GCC/clang auto-vectorize; the
 *    transcendental functions are our own polynomial exp/log/tanh (Cephes coefficients, a few
 *    ulp) written with selects instead of branches, so loops calling them vectorize too (libm's
 *    expf/tanh do not, and the reference even calls the double ones);
 *  - a reduction the compiler may not reorder is written as 16 explicit float lanes (sum16 and
 *    friends), which it vectorizes as SIMD adds: fast, and more accurate than one running sum;
 *  - the op or shape is dispatched once per call, outside the loop, never per element;
 *  - row kernels (norms, softmax, loss) touch each row 2-3 times while it is in L1.
 * kernels/CMakeLists.txt compiles this file with -O3 -fno-math-errno (so sqrtf vectorizes) and
 * -march=native where the compiler has it. K_LOG and K_POW loops stay scalar (branchy/libm).
 * Single-threaded: OpenBLAS already uses the cores for GEMM, and these kernels are memory-bound. */
#include "fast_nn.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define LANES 16   /* float accumulators of the row reductions: two AVX or one AVX-512 vector */
#define CHUNK 256  /* elements staged in a stack buffer by the exp reductions */

/* ---- vectorizable math ------------------------------------------------------------------------ */

typedef union {
  float f;
  uint32_t u;
} FBits;

static inline float bits_f(uint32_t u) {
  FBits b;
  b.u = u;
  return b.f;
}

static inline uint32_t f_bits(float f) {
  FBits b;
  b.f = f;
  return b.u;
}

/* exp(x) in float, max error about 2 ulp; overflows to inf above 88.72 and underflows (through
 * the denormals) to 0 below -103.97, as expf does; NaN stays NaN. The scale 2^n is applied as
 * two halves so that n in [-150, 129] needs no special case. */
static inline float f_exp(float x) {
  x = x < -104.0f ? -104.0f : x;
  x = x > 89.0f ? 89.0f : x;
  /* n = round(x / ln 2) by the 1.5 * 2^23 trick: n sits in the low bits of t */
  float t = x * 1.44269504088896341f + 12582912.0f;
  float n = t - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t k = (int32_t)(f_bits(t) - 0x4B400000u);
  int32_t k1 = k / 2, k2 = k - k1;
  return y * bits_f((uint32_t)(k1 + 127) << 23) * bits_f((uint32_t)(k2 + 127) << 23);
}

/* log(x) in float, max error about 2 ulp; log(0) = -inf, log(x<0) = NaN, log(inf) = inf. */
static inline float f_log(float x) {
  int tiny = x < 1.17549435e-38f; /* denormals: scale up by 2^23 first */
  float xs = tiny ? x * 8388608.0f : x;
  uint32_t ix = f_bits(xs);
  int32_t e = (int32_t)((ix >> 23) & 0xffu) - 126 - (tiny ? 23 : 0);
  float m = bits_f((ix & 0x007fffffu) | 0x3f000000u); /* xs = m * 2^e, m in [0.5, 1) */
  int lo = m < 0.707106781186547524f;
  e = lo ? e - 1 : e;
  m = lo ? m + m - 1.0f : m - 1.0f;
  float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  float fe = (float)e;
  y = y * m * z - 2.12194440e-4f * fe - 0.5f * z;
  float r = m + y + 0.693359375f * fe;
  r = x == INFINITY ? INFINITY : r;
  r = x == 0.0f ? -INFINITY : r;
  return x < 0.0f || x != x ? NAN : r;
}

/* tanh(x) in float: an odd polynomial near 0 (where 1 - 2/(e^2x + 1) would cancel), the exp
 * form elsewhere; max error about 3 ulp. */
static inline float f_tanh(float x) {
  float ax = fabsf(x), z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float small = p * z * x + x;
  float big = copysignf(1.0f - 2.0f / (f_exp(2.0f * ax) + 1.0f), x);
  return ax < 0.625f ? small : big;
}

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* ---- row reductions in LANES float accumulators ----------------------------------------------- */

static float lanes_total(const float *acc, float tail) {
  float s = 0;
  for (int k = 0; k < LANES; k++) s += acc[k];
  return s + tail;
}

static float sum16(const float *x, long n) {
  float acc[LANES] = {0}, tail = 0;
  long i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int k = 0; k < LANES; k++) acc[k] += x[i + k];
  for (; i < n; i++) tail += x[i];
  return lanes_total(acc, tail);
}

static float dot16(const float *a, const float *b, long n) {
  float acc[LANES] = {0}, tail = 0;
  long i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int k = 0; k < LANES; k++) acc[k] += a[i + k] * b[i + k];
  for (; i < n; i++) tail += a[i] * b[i];
  return lanes_total(acc, tail);
}

/* sum((x - m)^2): the second pass of a two-pass variance */
static float sqdev16(const float *x, long n, float m) {
  float acc[LANES] = {0}, tail = 0;
  long i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int k = 0; k < LANES; k++) acc[k] += (x[i + k] - m) * (x[i + k] - m);
  for (; i < n; i++) tail += (x[i] - m) * (x[i] - m);
  return lanes_total(acc, tail);
}

static float max16(const float *x, long n) {
  float acc[LANES], tail = x[0];
  long i = 0;
  for (int k = 0; k < LANES; k++) acc[k] = x[0];
  for (; i + LANES <= n; i += LANES)
    for (int k = 0; k < LANES; k++) acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
  for (; i < n; i++) tail = x[i] > tail ? x[i] : tail;
  for (int k = 0; k < LANES; k++) tail = acc[k] > tail ? acc[k] : tail;
  return tail;
}

/* sum(exp(x - m)), staging the exps in CHUNK floats so the exp loop and the sum both vectorize */
static float sum_exp(const float *x, long n, float m) {
  float buf[CHUNK], s = 0;
  for (long i0 = 0; i0 < n; i0 += CHUNK) {
    long len = n - i0 < CHUNK ? n - i0 : CHUNK;
    for (long k = 0; k < len; k++) buf[k] = f_exp(x[i0 + k] - m);
    s += sum16(buf, len);
  }
  return s;
}

/* a sum in 8 double lanes, for the long reductions (gradient norms over millions of values) */
static double dsum8(const float *x, long n) {
  double acc[8] = {0}, s = 0;
  long i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += x[i + k];
  for (; i < n; i++) s += x[i];
  for (int k = 0; k < 8; k++) s += acc[k];
  return s;
}

/* ---- elementwise unary ------------------------------------------------------------------------ */

/* one vectorizable loop per op: v is x[i] */
#define MAP(expr)                                                                                  \
  for (long i = 0; i < n; i++) {                                                                   \
    float v = x[i];                                                                                \
    out[i] = (expr);                                                                               \
  }                                                                                                \
  return

/* erf in float: its odd Taylor series below 0.5 (relative error ~1e-8), else Abramowitz and
 * Stegun 7.1.26, 1 - t (a1 + t (a2 + ...)) e^(-x^2) with t = 1 / (1 + p |x|) (absolute error
 * 1.5e-7), with the sign of x; llvm.c's gen_erf and the CUDA code compute the same */
static inline float f_erf(float v) {
  float a = fabsf(v), z = v * v;
  float small = v * (1.1283791671f + z * (-0.3761263890f + z * (0.1128379167f + z * (-0.0268661706f +
                      z * (0.0052239776f + z * -0.0008548327f)))));
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float big = 1.0f - t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f +
                      t * 1.061405429f)))) * f_exp(-z);
  return a < 0.5f ? small : copysignf(big, v);
}

/* sin and cos in float as Cephes' sinf/cosf: |x| reduced by multiples of pi/4 (j even, pi/4 in
 * three parts), then the sine or cosine polynomial on [-pi/4, pi/4] by quadrant (j/2) mod 4.
 * Accurate to about 1e-7 for |x| <= 8192 (beyond, the reduction loses bits); j is clamped so no
 * input overflows the int. llvm.c's gen_sincos computes the same. */
static inline float f_sincos(float v, int want_cos) {
  float a = fabsf(v), jf = floorf(fminf(a * 1.27323954473516f, 16777216.0f));
  int j = (int)jf;
  j = (j + 1) & ~1;
  float y = (float)j, r = ((a - y * 0.78515625f) - y * 2.4187564849853515625e-4f) - y * 3.77489497744594108e-8f, z = r * r;
  float s = r + r * z * ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f);
  float c = 1.0f - 0.5f * z + z * z * ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f);
  int q = ((j >> 1) + want_cos) & 3; /* cos x = sin(x + pi/2): one quadrant on */
  float out = q == 0 ? s : q == 1 ? c : q == 2 ? -s : -c;
  return want_cos || v >= 0 ? (v != v ? v : out) : -out;
}

static float gelu_f(float v) {
  return v / (1.0f + f_exp(-2.0f * GELU_S * (v + GELU_C * v * v * v)));
}

void kf_unary_forward(KUnary op, float *out, const float *x, long n, float c) {
  k_assert(op >= 0 && op < K_UNARY_COUNT && n >= 0);
  switch (op) {
  case K_NEG: MAP(-v);
  case K_EXP: MAP(f_exp(v));
  case K_LOG: MAP(f_log(v));
  case K_SQRT: MAP(sqrtf(v));
  case K_RSQRT: MAP(1.0f / sqrtf(v));
  case K_TANH: MAP(f_tanh(v));
  case K_SIGMOID: MAP(1.0f / (1.0f + f_exp(-v)));
  case K_RELU: MAP(v > 0 ? v : 0.0f);
  /* 0.5 x (1 + tanh u) = x sigmoid(2u): no cancellation for negative x */
  case K_GELU: MAP(gelu_f(v));
  case K_SILU: MAP(v / (1.0f + f_exp(-v)));
  case K_SQUARE: MAP(v * v);
  case K_POW: MAP(c == 2.0f ? v * v : powf(v, c));
  case K_ABS: MAP(fabsf(v));
  case K_CLAMP_MIN: MAP(v < c ? c : v);
  case K_CLAMP_MAX: MAP(v > c ? c : v);
  case K_ERF: MAP(f_erf(v));
  case K_SIN: MAP(f_sincos(v, 0));
  case K_COS: MAP(f_sincos(v, 1));
  default: k_assert(!"bad KUnary");
  }
}

/* dx[i] += dout[i] * f'(x[i]); v is x[i], y is out[i] (each read only by the ops that use it) */
#define GRAD(expr)                                                                                 \
  for (long i = 0; i < n; i++) dx[i] += dout[i] * (expr);                                          \
  return
#define V x[i]
#define Y out[i]

/* gelu'(v) = s + 2 v s (1 - s) S (1 + 3 C v^2) with s = sigmoid(2u), from tanh = 2s - 1;
 * 1 - s is e s when e = exp(-2u) is small, where 1 - s would cancel */
static inline float gelu_df(float v) {
  float e = f_exp(-2.0f * GELU_S * (v + GELU_C * v * v * v));
  float s = 1.0f / (1.0f + e), oms = e < 1.0f ? e * s : 1.0f - s;
  return s + 2.0f * v * s * oms * GELU_S * (1.0f + 3.0f * GELU_C * v * v);
}

static inline float silu_df(float v) {
  float e = f_exp(-v);
  float s = 1.0f / (1.0f + e), oms = e < 1.0f ? e * s : 1.0f - s;
  return s * (1.0f + v * oms);
}

void kf_unary_backward(KUnary op, float *dx, const float *dout, const float *x, const float *out,
                       long n, float c) {
  k_assert(op >= 0 && op < K_UNARY_COUNT && n >= 0);
  switch (op) {
  case K_NEG: GRAD(-1.0f);
  case K_EXP: GRAD(Y);
  case K_LOG: GRAD(1.0f / V);
  case K_SQRT: GRAD(0.5f / Y);
  case K_RSQRT: GRAD(-0.5f * Y / V);
  case K_TANH: GRAD(1.0f - Y * Y);
  case K_SIGMOID: GRAD(Y * (1.0f - Y));
  case K_RELU: GRAD(V > 0 ? 1.0f : 0.0f);
  case K_GELU: GRAD(gelu_df(V));
  case K_SILU: GRAD(silu_df(V));
  case K_SQUARE: GRAD(2.0f * V);
  case K_POW: GRAD(c * powf(V, c - 1.0f));
  case K_ABS: GRAD(V > 0 ? 1.0f : V < 0 ? -1.0f : 0.0f);
  case K_CLAMP_MIN: GRAD(V >= c ? 1.0f : 0.0f);
  case K_CLAMP_MAX: GRAD(V <= c ? 1.0f : 0.0f);
  case K_ERF: GRAD(1.1283791671f * f_exp(-V * V));
  case K_SIN: GRAD(f_sincos(V, 1));
  case K_COS: GRAD(-f_sincos(V, 0));
  default: k_assert(!"bad KUnary");
  }
}

#undef V
#undef Y

/* ---- elementwise binary with periods ---------------------------------------------------------- */

/* out[i] = a[i % na] OP b[i % nb] with the common period shapes as plain loops; E uses x, y */
#define BIN_LOOPS(E)                                                                               \
  do {                                                                                             \
    if (na == n && nb == n) {                                                                      \
      for (long i = 0; i < n; i++) {                                                               \
        float x = a[i], y = b[i];                                                                  \
        out[i] = (E);                                                                              \
      }                                                                                            \
    } else if (na == n && nb == 1) {                                                               \
      float y = b[0];                                                                              \
      for (long i = 0; i < n; i++) {                                                               \
        float x = a[i];                                                                            \
        out[i] = (E);                                                                              \
      }                                                                                            \
    } else if (na == 1 && nb == n) {                                                               \
      float x = a[0];                                                                              \
      for (long i = 0; i < n; i++) {                                                               \
        float y = b[i];                                                                            \
        out[i] = (E);                                                                              \
      }                                                                                            \
    } else if (na == n) {                                                                          \
      for (long r = 0; r < n; r += nb)                                                             \
        for (long j = 0; j < nb; j++) {                                                            \
          float x = a[r + j], y = b[j];                                                            \
          out[r + j] = (E);                                                                        \
        }                                                                                          \
    } else if (nb == n) {                                                                          \
      for (long r = 0; r < n; r += na)                                                             \
        for (long j = 0; j < na; j++) {                                                            \
          float x = a[j], y = b[r + j];                                                            \
          out[r + j] = (E);                                                                        \
        }                                                                                          \
    } else {                                                                                       \
      for (long i = 0; i < n; i++) {                                                               \
        float x = a[i % na], y = b[i % nb];                                                        \
        out[i] = (E);                                                                              \
      }                                                                                            \
    }                                                                                              \
  } while (0);                                                                                     \
  return

void kf_binary_period_forward(KBinary op, float *out, const float *a, long na, const float *b,
                              long nb, long n) {
  k_assert(na >= 1 && nb >= 1 && n % na == 0 && n % nb == 0);
  switch (op) {
  case K_ADD: BIN_LOOPS(x + y);
  case K_SUB: BIN_LOOPS(x - y);
  case K_MUL: BIN_LOOPS(x * y);
  case K_DIV: BIN_LOOPS(x / y);
  case K_MAXIMUM: BIN_LOOPS(x > y ? x : y);
  case K_MINIMUM: BIN_LOOPS(x < y ? x : y);
  case K_MOD: BIN_LOOPS((float)k_mod_f(x, y));
  case K_FLOORDIV: BIN_LOOPS(floorf(x / y));
  case K_EQ: BIN_LOOPS(x == y ? 1.0f : 0.0f);
  case K_NE: BIN_LOOPS(x != y ? 1.0f : 0.0f);
  case K_LT: BIN_LOOPS(x < y ? 1.0f : 0.0f);
  case K_LE: BIN_LOOPS(x <= y ? 1.0f : 0.0f);
  case K_GT: BIN_LOOPS(x > y ? 1.0f : 0.0f);
  case K_GE: BIN_LOOPS(x >= y ? 1.0f : 0.0f);
  default: k_assert(!"bad KBinary");
  }
}

/* The backward accumulates GX into da and GY into db (x = a, y = b, g = dout, all at index i);
 * ELEM binds them for one element. An operand of period 1 gets the sum over all of dout, kept in
 * double lanes since it may run over millions of values. */
#define ELEM(IA, IB, IG)                                                                           \
  float x = a[IA], y = b[IB], g = dout[IG];                                                        \
  (void)x, (void)y, (void)g
#define DSUM(DST, E, IA, IB)                                                                       \
  do {                                                                                             \
    double s8[8] = {0}, s1 = 0;                                                                    \
    long i = 0;                                                                                    \
    for (; i + 8 <= n; i += 8)                                                                     \
      for (int k = 0; k < 8; k++) {                                                                \
        long ii = i + k;                                                                           \
        ELEM(IA, IB, ii);                                                                          \
        s8[k] += (E);                                                                              \
      }                                                                                            \
    for (; i < n; i++) {                                                                           \
      long ii = i;                                                                                 \
      ELEM(IA, IB, ii);                                                                            \
      s1 += (E);                                                                                   \
    }                                                                                              \
    for (int k = 0; k < 8; k++) s1 += s8[k];                                                       \
    (DST)[0] += (float)s1;                                                                         \
  } while (0)
#define BIN_GRAD(GX, GY)                                                                           \
  do {                                                                                             \
    if (na == n && nb == n) {                                                                      \
      for (long i = 0; i < n; i++) {                                                               \
        ELEM(i, i, i);                                                                             \
        if (da) da[i] += (GX);                                                                     \
        if (db) db[i] += (GY);                                                                     \
      }                                                                                            \
    } else if (na == n && nb > 1) { /* b repeats per row of nb: a bias */                          \
      for (long r = 0; r < n; r += nb)                                                             \
        for (long j = 0; j < nb; j++) {                                                            \
          ELEM(r + j, j, r + j);                                                                   \
          if (da) da[r + j] += (GX);                                                               \
          if (db) db[j] += (GY);                                                                   \
        }                                                                                          \
    } else if (nb == n && na > 1) {                                                                \
      for (long r = 0; r < n; r += na)                                                             \
        for (long j = 0; j < na; j++) {                                                            \
          ELEM(j, r + j, r + j);                                                                   \
          if (da) da[j] += (GX);                                                                   \
          if (db) db[r + j] += (GY);                                                               \
        }                                                                                          \
    } else if (na == n) { /* b is a scalar */                                                      \
      if (da)                                                                                      \
        for (long i = 0; i < n; i++) {                                                             \
          ELEM(i, 0, i);                                                                           \
          da[i] += (GX);                                                                           \
        }                                                                                          \
      if (db) DSUM(db, GY, ii, 0);                                                                  \
    } else if (nb == n) { /* a is a scalar */                                                      \
      if (db)                                                                                      \
        for (long i = 0; i < n; i++) {                                                             \
          ELEM(0, i, i);                                                                           \
          db[i] += (GY);                                                                           \
        }                                                                                          \
      if (da) DSUM(da, GX, 0, ii);                                                                  \
    } else { /* any other pair of periods, in index order */                                       \
      for (long i = 0; i < n; i++) {                                                               \
        ELEM(i % na, i % nb, i);                                                                   \
        if (da) da[i % na] += (GX);                                                                \
        if (db) db[i % nb] += (GY);                                                                \
      }                                                                                            \
    }                                                                                              \
  } while (0);                                                                                     \
  return

/* maximum/minimum: the share of the gradient that goes to a; ties split it evenly */
static inline float share_max(float x, float y) { return x > y ? 1.0f : x < y ? 0.0f : 0.5f; }
static inline float share_min(float x, float y) { return x < y ? 1.0f : x > y ? 0.0f : 0.5f; }

void kf_binary_period_backward(KBinary op, float *da, long na, float *db, long nb,
                               const float *dout, const float *a, const float *b, long n) {
  k_assert(na >= 1 && nb >= 1 && n % na == 0 && n % nb == 0);
  switch (op) {
  case K_ADD: BIN_GRAD(g, g);
  case K_SUB: BIN_GRAD(g, -g);
  case K_MUL: BIN_GRAD(g * y, g * x);
  case K_DIV: BIN_GRAD(g / y, -g * x / (y * y));
  case K_MAXIMUM: BIN_GRAD(g * share_max(x, y), g * (1.0f - share_max(x, y)));
  case K_MINIMUM: BIN_GRAD(g * share_min(x, y), g * (1.0f - share_min(x, y)));
  case K_MOD: BIN_GRAD(g, -g * floorf(x / y));
  default: k_assert(!"binary op without a gradient");
  }
}

/* ---- reductions over [outer, n, inner] -------------------------------------------------------- */

#define DCHUNK 512 /* inner values summed at once in double accumulators on the stack */

void kf_sum_forward(float *out, const float *x, int outer, int n, int inner) {
  k_assert(outer >= 0 && n >= 0 && inner >= 0);
  for (long o = 0; o < outer; o++) {
    const float *xo = x + o * n * inner;
    if (inner == 1) {
      out[o] = (float)dsum8(xo, n);
      continue;
    }
    /* sum whole rows into a block of accumulators: contiguous loads instead of a stride */
    for (long i0 = 0; i0 < inner; i0 += DCHUNK) {
      long len = inner - i0 < DCHUNK ? inner - i0 : DCHUNK;
      double acc[DCHUNK] = {0};
      for (long j = 0; j < n; j++)
        for (long i = 0; i < len; i++) acc[i] += xo[j * inner + i0 + i];
      for (long i = 0; i < len; i++) out[o * inner + i0 + i] = (float)acc[i];
    }
  }
}

void kf_sum_backward(float *dx, const float *dout, int outer, int n, int inner) {
  k_assert(outer >= 0 && n >= 0 && inner >= 0);
  for (long o = 0; o < outer; o++)
    for (long j = 0; j < n; j++) {
      float *d = dx + (o * n + j) * inner;
      const float *g = dout + o * inner;
      for (long i = 0; i < inner; i++) d[i] += g[i];
    }
}

void kf_mean_forward(float *out, const float *x, int outer, int n, int inner) {
  k_assert(n > 0);
  kf_sum_forward(out, x, outer, n, inner);
  for (long i = 0; i < (long)outer * inner; i++) out[i] /= (float)n;
}

void kf_mean_backward(float *dx, const float *dout, int outer, int n, int inner) {
  k_assert(outer >= 0 && n > 0 && inner >= 0);
  for (long o = 0; o < outer; o++)
    for (long j = 0; j < n; j++) {
      float *d = dx + (o * n + j) * inner;
      const float *g = dout + o * inner;
      /* the reference's rounding: dout / n in double, rounded once */
      for (long i = 0; i < inner; i++) d[i] += (float)((double)g[i] / n);
    }
}

/* ---- transpose -------------------------------------------------------------------------------- */

#define TILE 32 /* a 32 x 32 float tile of source and destination both stay in L1 */

/* dst [n, m] (+)= src [m, n]^T, tile by tile */
static void transpose2(float *restrict dst, const float *restrict src, long m, long n, int acc) {
  for (long i0 = 0; i0 < m; i0 += TILE)
    for (long j0 = 0; j0 < n; j0 += TILE) {
      long ie = i0 + TILE < m ? i0 + TILE : m, je = j0 + TILE < n ? j0 + TILE : n;
      for (long j = j0; j < je; j++)
        for (long i = i0; i < ie; i++) {
          float v = src[i * n + j];
          dst[j * m + i] = acc ? dst[j * m + i] + v : v;
        }
    }
}

void kf_transpose_forward(float *out, const float *x, int nb, int m, int n) {
  k_assert(nb >= 0 && m >= 0 && n >= 0);
  for (long z = 0; z < nb; z++) transpose2(out + z * m * n, x + z * m * n, m, n, 0);
}

void kf_transpose_backward(float *dx, const float *dout, int nb, int m, int n) {
  k_assert(nb >= 0 && m >= 0 && n >= 0);
  /* dx [m, n] += dout [n, m]^T */
  for (long z = 0; z < nb; z++) transpose2(dx + z * m * n, dout + z * m * n, n, m, 1);
}

/* ---- where's backward ------------------------------------------------------------------------- */

/* The strides of an operand of shape ishape (rank irank <= orank) over the output's orank dims,
 * right-aligned as broadcasting aligns them: 0 along a dim it broadcasts over. */
static void bcast_strides(long *st, const int *oshape, int orank, const int *ishape, int irank) {
  long s = 1;
  for (int d = orank - 1, j = irank - 1; d >= 0; d--, j--) {
    int size = j >= 0 ? ishape[j] : 1;
    k_assert(size == oshape[d] || size == 1);
    st[d] = size == 1 ? 0 : s;
    s *= size;
  }
}

void kf_where_backward(float *da, float *db, const float *dout, const int *oshape, int orank, const float *cond,
                       const int *cshape, int crank, const int *ashape, int arank, const int *bshape, int brank) {
  enum { R = 8 };
  k_assert(orank >= 0 && orank <= R && crank <= orank && arank <= orank && brank <= orank);
  long sc[R], sa[R], sb[R], inner = orank ? oshape[orank - 1] : 1, n = 1;
  int at[R] = {0};
  for (int d = 0; d < orank; d++) n *= oshape[d];
  bcast_strides(sc, oshape, orank, cshape, crank);
  bcast_strides(sa, oshape, orank, ashape, arank);
  bcast_strides(sb, oshape, orank, bshape, brank);
  long jc = orank ? sc[orank - 1] : 0, ja = orank ? sa[orank - 1] : 0, jb = orank ? sb[orank - 1] : 0;
  long oc = 0, oa = 0, ob = 0; /* the operands' offsets at the row's start */
  for (long r = 0; inner > 0 && r < n / inner; r++) {
    const float *g = dout + r * inner, *c = cond + oc;
    if (da) {
      float *dst = da + oa;
      for (long j = 0; j < inner; j++)
        if (c[j * jc] != 0) dst[j * ja] += g[j];
    }
    if (db) {
      float *dst = db + ob;
      for (long j = 0; j < inner; j++)
        if (c[j * jc] == 0) dst[j * jb] += g[j];
    }
    for (int d = orank - 2; d >= 0; d--) { /* the next row: an odometer over the outer dims */
      oc += sc[d], oa += sa[d], ob += sb[d];
      if (++at[d] < oshape[d]) break;
      oc -= sc[d] * oshape[d], oa -= sa[d] * oshape[d], ob -= sb[d] * oshape[d];
      at[d] = 0;
    }
  }
}

/* ---- softmax ---------------------------------------------------------------------------------- */

/* softmax rows; safe: a row whose max is -inf (every score masked) gives 0, PyTorch's _safe_softmax */
static void softmax_rows(float *out, const float *x, int rows, int n, bool safe) {
  k_assert(rows >= 0 && n > 0);
  for (long r = 0; r < rows; r++) {
    const float *xr = x + r * n;
    float *o = out + r * n, m = max16(xr, n);
    if (safe && m == -INFINITY) {
      memset(o, 0, sizeof(float) * (size_t)n);
      continue;
    }
    for (long j = 0; j < n; j++) o[j] = f_exp(xr[j] - m);
    float inv = 1.0f / sum16(o, n);
    for (long j = 0; j < n; j++) o[j] *= inv;
  }
}

void kf_softmax_forward(float *out, const float *x, int rows, int n) { softmax_rows(out, x, rows, n, false); }

void kf_safe_softmax_forward(float *out, const float *x, int rows, int n) { softmax_rows(out, x, rows, n, true); }

void kf_softmax_backward(float *dx, const float *dout, const float *out, int rows, int n) {
  k_assert(rows >= 0 && n > 0);
  for (long r = 0; r < rows; r++) {
    const float *y = out + r * n, *dy = dout + r * n;
    float *d = dx + r * n, dot = dot16(dy, y, n);
    for (long j = 0; j < n; j++) d[j] += y[j] * (dy[j] - dot);
  }
}

void kf_log_softmax_forward(float *out, const float *x, int rows, int n) {
  k_assert(rows >= 0 && n > 0);
  for (long r = 0; r < rows; r++) {
    const float *xr = x + r * n;
    float *o = out + r * n, m = max16(xr, n), ls = logf(sum_exp(xr, n, m));
    for (long j = 0; j < n; j++) o[j] = (xr[j] - m) - ls;
  }
}

void kf_log_softmax_backward(float *dx, const float *dout, const float *out, int rows, int n) {
  k_assert(rows >= 0 && n > 0);
  for (long r = 0; r < rows; r++) {
    const float *y = out + r * n, *dy = dout + r * n;
    float *d = dx + r * n, s = sum16(dy, n);
    for (long j = 0; j < n; j++) d[j] += dy[j] - f_exp(y[j]) * s;
  }
}

/* ---- normalization ---------------------------------------------------------------------------- */

/* Mean and variance are two float passes over the row in 16 lanes (the second sums (x - mean)^2,
 * so no E[x^2] - E[x]^2 cancellation): relative error ~1e-7 on typical rows. */
void kf_layer_norm_forward(float *out, float *mean, float *rstd, const float *x, const float *w,
                           const float *b, int rows, int c, float eps) {
  k_assert(rows >= 0 && c > 0 && eps >= 0);
  for (long r = 0; r < rows; r++) {
    const float *xr = x + r * c;
    float *o = out + r * c;
    float m = sum16(xr, c) / (float)c;
    float s = 1.0f / sqrtf(sqdev16(xr, c, m) / (float)c + eps);
    for (long j = 0; j < c; j++) o[j] = (xr[j] - m) * s * w[j] + b[j];
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = s;
  }
}

/* mean(w * dy) and mean(w * dy * xhat) of one row, xhat = (x - m) * s */
static void ln_row_means(const float *x, const float *dy, const float *w, long c, float m, float s,
                         float *g_mean, float *gx_mean) {
  float ag[LANES] = {0}, agx[LANES] = {0}, tg = 0, tgx = 0;
  long i = 0;
  for (; i + LANES <= c; i += LANES)
    for (int k = 0; k < LANES; k++) {
      float g = w[i + k] * dy[i + k];
      ag[k] += g;
      agx[k] += g * (x[i + k] - m);
    }
  for (; i < c; i++) {
    float g = w[i] * dy[i];
    tg += g;
    tgx += g * (x[i] - m);
  }
  *g_mean = lanes_total(ag, tg) / (float)c;
  *gx_mean = lanes_total(agx, tgx) * s / (float)c;
}

void kf_layer_norm_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                            const float *w, const float *mean, const float *rstd, int rows, int c) {
  k_assert(rows >= 0 && c > 0);
  for (long r = 0; r < rows; r++) {
    const float *xr = x + r * c, *dy = dout + r * c;
    float m = mean[r], s = rstd[r];
    if (dx) { /* dx = s * (g - mean(g) - xhat * mean(g * xhat)) */
      float gm, gxm;
      ln_row_means(xr, dy, w, c, m, s, &gm, &gxm);
      float *d = dx + r * c;
      for (long j = 0; j < c; j++) d[j] += s * (w[j] * dy[j] - gm - (xr[j] - m) * s * gxm);
    }
    if (dw)
      for (long j = 0; j < c; j++) dw[j] += dy[j] * ((xr[j] - m) * s);
    if (db)
      for (long j = 0; j < c; j++) db[j] += dy[j];
  }
}

void kf_rms_norm_forward(float *out, float *rstd, const float *x, const float *w, int rows, int c,
                         float eps) {
  k_assert(rows >= 0 && c > 0 && eps >= 0);
  for (long r = 0; r < rows; r++) {
    const float *xr = x + r * c;
    float *o = out + r * c;
    float s = 1.0f / sqrtf(dot16(xr, xr, c) / (float)c + eps);
    for (long j = 0; j < c; j++) o[j] = xr[j] * s * w[j];
    if (rstd) rstd[r] = s;
  }
}

void kf_rms_norm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                          const float *rstd, int rows, int c) {
  k_assert(rows >= 0 && c > 0);
  for (long r = 0; r < rows; r++) {
    const float *xr = x + r * c, *dy = dout + r * c;
    float s = rstd[r];
    if (dx) { /* dx = s * (g - xhat * mean(g * xhat)) */
      float gm, gxm;
      ln_row_means(xr, dy, w, c, 0.0f, s, &gm, &gxm);
      float *d = dx + r * c;
      for (long j = 0; j < c; j++) d[j] += s * (w[j] * dy[j] - xr[j] * s * gxm);
    }
    if (dw)
      for (long j = 0; j < c; j++) dw[j] += dy[j] * (xr[j] * s);
  }
}

/* ---- loss ------------------------------------------------------------------------------------- */

static int ce_count(const int32_t *targets, int rows, int v) {
  int count = 0;
  for (int r = 0; r < rows; r++) {
    k_check_target(r, targets[r], v);
    count += targets[r] != -1;
  }
  return count;
}

float kf_cross_entropy_forward(int *count, const float *logits, const int32_t *targets, int rows,
                               int v) {
  k_assert(rows >= 0 && v > 0);
  int cnt = ce_count(targets, rows, v);
  double loss = 0; /* lse - logit[target] cancels when the model is sure: kept in double */
  for (long r = 0; r < rows; r++) {
    if (targets[r] == -1) continue;
    const float *lr = logits + r * v;
    float m = max16(lr, v);
    loss += (double)m + log((double)sum_exp(lr, v, m)) - lr[targets[r]];
  }
  if (count) *count = cnt;
  return (float)(cnt ? loss / cnt : 0.0);
}

void kf_cross_entropy_backward(float *dlogits, float dloss, const float *logits,
                               const int32_t *targets, int rows, int v) {
  k_assert(rows >= 0 && v > 0);
  int cnt = ce_count(targets, rows, v);
  for (long r = 0; r < rows; r++) {
    if (targets[r] == -1) continue; /* an ignored row gets no gradient at all */
    const float *lr = logits + r * v;
    float *d = dlogits + r * v;
    float g = (float)((double)dloss / cnt), m = max16(lr, v);
    float gs = g / sum_exp(lr, v, m);
    long t = targets[r];
    for (long j = 0; j < v; j++) d[j] += gs * f_exp(lr[j] - m) - (j == t ? g : 0.0f);
  }
}

/* ---- indexing and layout ---------------------------------------------------------------------- */

void kf_embedding_forward(float *out, const float *table, const int32_t *idx, int n, int v, int c) {
  k_assert(n >= 0 && v > 0 && c > 0);
  for (long i = 0; i < n; i++) {
    k_check_index("embedding", "index", i, idx[i], v);
    memcpy(out + i * c, table + (long)idx[i] * c, sizeof(float) * (size_t)c);
  }
}

/* dst[i] += src[i]; restrict: the callers' operands never overlap */
static void add_to(float *restrict dst, const float *restrict src, long n) {
  for (long i = 0; i < n; i++) dst[i] += src[i];
}

void kf_embedding_backward(float *dtable, const float *dout, const int32_t *idx, int n, int v,
                           int c) {
  k_assert(n >= 0 && v > 0 && c > 0);
  for (long i = 0; i < n; i++) { /* in index order: repeated rows sum the same way every run */
    k_check_index("embedding", "index", i, idx[i], v);
    add_to(dtable + (long)idx[i] * c, dout + i * c, c);
  }
}

/* move between [b, t, c] and [b, h, t, c/h], one head-row of c/h floats at a time */
static void heads_move(float *dst, const float *src, int b, int t, int c, int h, int to_heads,
                       int acc) {
  k_assert(b >= 0 && t >= 0 && h > 0 && c % h == 0);
  long dh = c / h;
  for (long bb = 0; bb < b; bb++)
    for (long hh = 0; hh < h; hh++)
      for (long tt = 0; tt < t; tt++) {
        long hi = ((bb * h + hh) * t + tt) * dh, ci = (bb * t + tt) * c + hh * dh;
        float *d = dst + (to_heads ? hi : ci);
        const float *s = src + (to_heads ? ci : hi);
        if (acc)
          add_to(d, s, dh);
        else
          memcpy(d, s, sizeof(float) * (size_t)dh);
      }
}

void kf_split_heads_forward(float *out, const float *x, int b, int t, int c, int h) {
  heads_move(out, x, b, t, c, h, 1, 0);
}

void kf_split_heads_backward(float *dx, const float *dout, int b, int t, int c, int h) {
  heads_move(dx, dout, b, t, c, h, 0, 1);
}

void kf_merge_heads_forward(float *out, const float *x, int b, int t, int c, int h) {
  heads_move(out, x, b, t, c, h, 0, 0);
}

void kf_merge_heads_backward(float *dx, const float *dout, int b, int t, int c, int h) {
  heads_move(dx, dout, b, t, c, h, 1, 1);
}

/* 4-byte elements of any type (f32, i32): bytes are moved, never converted */
void k32_slice_forward(void *out, const void *x, int outer, int n, int inner, int start, int end) {
  k_assert(outer >= 0 && inner >= 0 && 0 <= start && start <= end && end <= n);
  long m = end - start, len = m * inner;
  for (long o = 0; o < outer; o++)
    memcpy((char *)out + o * len * 4, (const char *)x + (o * n + start) * inner * 4, 4 * (size_t)len);
}

void kf_slice_forward(float *out, const float *x, int outer, int n, int inner, int start, int end) {
  k32_slice_forward(out, x, outer, n, inner, start, end);
}

void kf_slice_backward(float *dx, const float *dout, int outer, int n, int inner, int start,
                       int end) {
  k_assert(outer >= 0 && inner >= 0 && 0 <= start && start <= end && end <= n);
  long m = end - start, len = m * inner;
  for (long o = 0; o < outer; o++) add_to(dx + (o * n + start) * inner, dout + o * len, len);
}

static int concat_total(const int *ns, int count) {
  int total = 0;
  k_assert(count >= 1);
  for (int q = 0; q < count; q++) {
    k_assert(ns[q] >= 0);
    total += ns[q];
  }
  return total;
}

void k32_concat_forward(void *out, const void *const *xs, const int *ns, int count, int outer, int inner) {
  long total = concat_total(ns, count);
  for (long o = 0; o < outer; o++)
    for (long q = 0, off = 0; q < count; off += ns[q], q++) {
      long len = (long)ns[q] * inner;
      memcpy((char *)out + (o * total + off) * inner * 4, (const char *)xs[q] + o * len * 4, 4 * (size_t)len);
    }
}

void kf_concat_forward(float *out, const float *const *xs, const int *ns, int count, int outer,
                       int inner) {
  k32_concat_forward(out, (const void *const *)xs, ns, count, outer, inner);
}

void kf_concat_backward(float *const *dxs, const float *dout, const int *ns, int count, int outer,
                        int inner) {
  long total = concat_total(ns, count);
  for (long q = 0, off = 0; q < count; off += ns[q], q++)
    if (dxs[q])
      for (long o = 0; o < outer; o++) {
        long len = (long)ns[q] * inner;
        add_to(dxs[q] + o * len, dout + (o * total + off) * inner, len);
      }
}
