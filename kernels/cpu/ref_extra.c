/* ref_extra.c: the references of ref_extra.h. */
#include "ref_extra.h"

#include "ref.h"

#include <math.h>
#include <string.h>

void k_adamw_update(float *p, float *m, float *v, const float *grad, long n, float gscale, float lr, float beta1,
                    float beta2, float eps, float wd, float bc1, float bc2) {
  k_assert(n >= 0 && bc1 > 0 && bc2 > 0);
  float one_b1 = (float)(1.0 - (double)beta1), one_b2 = (float)(1.0 - (double)beta2);
  float decay = 1.0f - lr * wd, step = lr / bc1, sbc2 = sqrtf(bc2);
  for (long i = 0; i < n; i++) {
    float g = grad[i] * gscale, w = p[i];
    if (wd != 0.0f) w *= decay;
    float mi = m[i] * beta1 + g * one_b1;
    float vi = v[i] * beta2 + (g * g) * one_b2;
    float denom = sqrtf(vi) / sbc2 + eps;
    p[i] = w - step * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

double k_global_norm(const float *const *xs, const long *ns, int count) {
  double s = 0;
  for (int k = 0; k < count; k++)
    for (long i = 0; i < ns[k]; i++) s += (double)xs[k][i] * xs[k][i];
  return sqrt(s);
}

uint16_t k_bf16_from_f32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* a quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                                         /* round to nearest even */
  return (uint16_t)(u >> 16);
}

float k_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

void k_bf16_round(float *x, long n) {
  for (long i = 0; i < n; i++) x[i] = k_bf16_to_f32(k_bf16_from_f32(x[i]));
}
