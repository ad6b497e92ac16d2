/* attn_layout.h: where the attention kernels find a batch-heads tensor (attention.cu; host C and
 * device code both include it, so nothing here includes anything).
 *
 * Element (z, i, c) of a [nb, t, d] tensor, z = b * heads + hh, lies at
 *   base + b * bstride + hh * hstride + i * ld + c      (in elements).
 * Contiguous [nb, t, d]: {d, 1, t * d, 0}. GPT-2's fused projection qkv [b, t, 3C] (C = heads * d)
 * read in place: q {3C, heads, t * 3C, d} at qkv, k and v the same at qkv + C and qkv + 2C; and
 * the merged heads [b, t, C]: {C, heads, t * C, d}. */
#ifndef CPLAN_ATTN_LAYOUT_H
#define CPLAN_ATTN_LAYOUT_H

/* The widest head the kernels take (their register and shared-memory tiles); on a GPU mesh, sema
 * computes a wider sdpa in PyTorch's math form (sema_model.c sdpa_math). */
#define CPLAN_ATTN_MAX_HEAD_DIM 256

typedef struct CplanAttnLayout {
  long long ld;      /* elements between rows i and i + 1 */
  int heads;         /* z = b * heads + hh */
  long long bstride; /* elements between batches b and b + 1 */
  long long hstride; /* elements between heads hh and hh + 1 */
} CplanAttnLayout;

#endif
