/* ref_extra.h: CPU references for the CUDA kernels that ref.h has no counterpart for (issue 6):
 * the fused AdamW step, the global norm, and bf16 rounding (so a test can feed the reference
 * exactly the values a bf16 kernel sees). Conventions as ref.h; f32 only, sums in f64. */
#ifndef CPLAN_KERNELS_REF_EXTRA_H
#define CPLAN_KERNELS_REF_EXTRA_H

#include <stdint.h>

/* One AdamW step on n elements, the formula and order of operations of compiler/optimizer.c
 * (torch.optim.AdamW), in f32: g = grad * gscale; p *= 1 - lr wd (when wd != 0);
 * m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p -= (lr / bc1) (m / (sqrt(v) / sqrt(bc2) + eps)). */
void k_adamw_update(float *p, float *m, float *v, const float *grad, long n, float gscale, float lr, float beta1,
                    float beta2, float eps, float wd, float bc1, float bc2);

/* sqrt(sum over the count tensors xs[i] (ns[i] elements) of sum(x^2)), summed in f64 */
double k_global_norm(const float *const *xs, const long *ns, int count);

/* bf16 <-> f32: round to nearest even (NaN stays NaN), as __float2bfloat16_rn; widening is exact */
uint16_t k_bf16_from_f32(float x);
float k_bf16_to_f32(uint16_t b);
/* x[i] = bf16(x[i]) in place: the f32 values a bf16 tensor holds */
void k_bf16_round(float *x, long n);

#endif
