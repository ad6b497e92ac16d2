/* lt_model.c: a host model of the part of cuBLASLt's C API that runtime/cuda_rt.c calls, written
 * from cublasLt.h's documentation, so that cuda_rt.c itself (not the emulator's own GEMM) can be
 * checked with no GPU: cuda.lt_model links test_emu_gemm.c with cuda_rt.c and this file in place
 * of libcublasLt.
 *
 * What it models, as the header documents it:
 *   - column-major matrices: a layout is (type, rows, cols, ld >= rows), with BATCH_COUNT and
 *     STRIDED_BATCH_OFFSET; D = epilogue(alpha op(A) op(B) + beta C), op per TRANSA / TRANSB;
 *   - attribute sizes: a buffer whose size is not the attribute's gives INVALID_VALUE;
 *   - epilogues: BIAS (a vector of D's rows, in BIAS_DATA_TYPE, default D's type, broadcast over the
 *     columns), GELU (tanh form), GELU_AUX_BIAS (aux = the pre-activation, leading dim
 *     EPILOGUE_AUX_LD, a multiple of 8 and >= D's rows), DGELU (D times gelu'(aux)),
 *     DGELU_BGRAD (and the bias gradient: D's row sums, one per row of D), BGRADA (A's sums over
 *     k, one per row of D), BGRADB (B's sums over k, one per column of D); bias gradients are
 *     written in BIAS_DATA_TYPE (default D's type);
 *   - alignment: the heuristic assumes each matrix is aligned to its MIN_ALIGNMENT_*_BYTES
 *     preference (default 256) and cublasLtMatmul refuses (NOT_SUPPORTED) an operand less aligned
 *     than the algorithm was chosen for (a real GPU's kernel may instead misread it);
 *   - the heuristic returns at most one algorithm, none when the workspace limit is under the
 *     model's need (0: any limit works). lt_model_heuristics() counts the queries.
 * Accumulation in double, one rounding to D's type at the store. */
#include <cublasLt.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "host_types.h"
#include "lt_model.h"

typedef struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld, stride;
  int32_t batch;
} Layout;

typedef struct Desc {
  int32_t ta, tb;
  uint32_t epi;
  const void *bias;
  int32_t bias_type;
  void *aux;
  int64_t aux_ld;
} Desc;

typedef struct Pref {
  uint64_t workspace;
  uint32_t align[4]; /* A, B, C, D */
} Pref;

static long long heuristics;
long long lt_model_heuristics(void) { return heuristics; }

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  *h = (cublasLtHandle_t)malloc(16);
  return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}
const char *cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  default: return "CUBLAS_STATUS_(other)";
  }
}

/* ---- descriptors ---- */

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (ld < (int64_t)rows || rows == 0 || cols == 0) return CUBLAS_STATUS_INVALID_VALUE;
  Layout *x = calloc(1, sizeof *x);
  *x = (Layout){type, rows, cols, ld, 0, 1};
  *l = (cublasLtMatrixLayout_t)(void *)x;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  free(l);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size) {
  Layout *x = (Layout *)(void *)l;
  if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof x->batch) memcpy(&x->batch, buf, size);
  else if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof x->stride) memcpy(&x->stride, buf, size);
  else return CUBLAS_STATUS_INVALID_VALUE;
  return x->batch >= 1 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct, cudaDataType_t st) {
  if (ct != CUBLAS_COMPUTE_32F && ct != CUBLAS_COMPUTE_32F_FAST_TF32) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (st != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
  Desc *x = calloc(1, sizeof *x);
  x->epi = CUBLASLT_EPILOGUE_DEFAULT;
  x->bias_type = -1;
  *d = (cublasLtMatmulDesc_t)(void *)x;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  free(d);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
  Desc *x = (Desc *)(void *)d;
  void *dst;
  size_t want;
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_TRANSA: dst = &x->ta, want = sizeof x->ta; break;
  case CUBLASLT_MATMUL_DESC_TRANSB: dst = &x->tb, want = sizeof x->tb; break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE: dst = &x->epi, want = sizeof x->epi; break;
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER: dst = &x->bias, want = sizeof x->bias; break;
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: dst = &x->bias_type, want = sizeof x->bias_type; break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: dst = &x->aux, want = sizeof x->aux; break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: dst = &x->aux_ld, want = sizeof x->aux_ld; break;
  default: return CUBLAS_STATUS_INVALID_VALUE; /* not one cuda_rt.c sets: the model does not know it */
  }
  if (!buf || size != want) return CUBLAS_STATUS_INVALID_VALUE;
  memcpy(dst, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  Pref *x = calloc(1, sizeof *x);
  for (int i = 0; i < 4; i++) x->align[i] = 256;
  *p = (cublasLtMatmulPreference_t)(void *)x;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  free(p);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
  Pref *x = (Pref *)(void *)p;
  if (!buf) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (size != sizeof x->workspace) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&x->workspace, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  int i = attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES   ? 0
          : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ? 1
          : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ? 2
          : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES ? 3
                                                               : -1;
  if (i < 0 || size != sizeof x->align[0]) return CUBLAS_STATUS_INVALID_VALUE;
  memcpy(&x->align[i], buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

/* ---- the heuristic and the GEMM ---- */

static int is_bias(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
static int is_gelu(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
static int is_dgelu(uint32_t e) { return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
static int is_bgrad(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}
static int has_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || is_dgelu(e); }

/* whether the descriptors make one well-formed GEMM (the shapes agree) */
static int consistent(const Desc *o, const Layout *a, const Layout *b, const Layout *c, const Layout *d) {
  uint64_t am = o->ta ? a->cols : a->rows, ak = o->ta ? a->rows : a->cols;
  uint64_t bk = o->tb ? b->cols : b->rows, bn = o->tb ? b->rows : b->cols;
  if (ak != bk || am != d->rows || bn != d->cols || c->rows != d->rows || c->cols != d->cols) return 0;
  if (a->type != b->type || c->type != d->type) return 0;
  if (a->batch != d->batch || b->batch != d->batch || c->batch != d->batch) return 0;
  if (is_bgrad(o->epi) && d->batch != 1) return 0;
  if (has_aux(o->epi) && (o->aux_ld < (int64_t)d->rows || o->aux_ld % 8)) return 0;
  return 1;
}

/* the algorithm: the alignments it was chosen for (A, B, C, D) */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                                              cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                                              cublasLtMatrixLayout_t ld, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t res[], int *count) {
  heuristics++;
  if (!h || requested <= 0 || !count) return CUBLAS_STATUS_INVALID_VALUE;
  *count = 0;
  const Desc *o = (const Desc *)(void *)op;
  if (!consistent(o, (Layout *)(void *)la, (Layout *)(void *)lb, (Layout *)(void *)lc, (Layout *)(void *)ld))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const Pref *p = (const Pref *)(void *)pref;
  memset(&res[0], 0, sizeof res[0]);
  for (int i = 0; i < 4; i++) res[0].algo.data[i] = p->align[i];
  res[0].algo.data[7] = 0x4c544d4f44454cULL; /* "LTMODEL": an algorithm this heuristic made */
  res[0].state = CUBLAS_STATUS_SUCCESS;
  res[0].wavesCount = 1.0f;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

static double load(const void *p, cudaDataType t, int64_t i) { return ht_get(p, t, i); }
static void store(void *p, cudaDataType t, int64_t i, double v) { ht_put(p, t, i, v); }

static double gelu(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double dgelu(double x) {
  double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

static int aligned(const void *p, const Layout *l, uint64_t need) {
  size_t es = l->type == CUDA_R_32F ? 4 : 2;
  uint64_t a = (uint64_t)(uintptr_t)p;
  if (l->batch > 1) a |= (uint64_t)l->stride * es;
  return a % need == 0;
}

/* element (r, c) of op(X), X a column-major layout */
static double op_at(const void *x, const Layout *l, int trans, int64_t z, uint64_t r, uint64_t c) {
  return trans ? load(x, l->type, z * l->stride + (int64_t)c + (int64_t)r * l->ld)
               : load(x, l->type, z * l->stride + (int64_t)r + (int64_t)c * l->ld);
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta,
                              const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t stream) {
  (void)ws, (void)ws_bytes, (void)stream;
  const Desc *o = (const Desc *)(void *)op;
  const Layout *a = (const Layout *)(void *)la, *b = (const Layout *)(void *)lb, *c = (const Layout *)(void *)lc,
               *d = (const Layout *)(void *)ld;
  if (!h || !algo || algo->data[7] != 0x4c544d4f44454cULL || !A || !B || !D) return CUBLAS_STATUS_INVALID_VALUE;
  if (!consistent(o, a, b, c, d)) return CUBLAS_STATUS_INVALID_VALUE;
  if (!aligned(A, a, algo->data[0]) || !aligned(B, b, algo->data[1]) || !aligned(C, c, algo->data[2]) ||
      !aligned(D, d, algo->data[3]))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  uint32_t e = o->epi;
  if ((is_bias(e) || is_bgrad(e)) && !o->bias) return CUBLAS_STATUS_INVALID_VALUE;
  if (has_aux(e) && !o->aux) return CUBLAS_STATUS_INVALID_VALUE;
  cudaDataType bt = o->bias_type < 0 ? d->type : (cudaDataType)o->bias_type;
  float al = *(const float *)alpha, be = *(const float *)beta;
  uint64_t M = d->rows, N = d->cols, K = o->ta ? a->rows : a->cols;
  double *out = malloc(sizeof(double) * M * N);
  for (int64_t z = 0; z < d->batch; z++) {
    for (uint64_t j = 0; j < N; j++)
      for (uint64_t i = 0; i < M; i++) {
        double s = 0;
        for (uint64_t l = 0; l < K; l++) s += op_at(A, a, o->ta, z, i, l) * op_at(B, b, o->tb, z, l, j);
        double v = al * s;
        if (be != 0.0f) v += be * load(C, c->type, z * c->stride + (int64_t)i + (int64_t)j * c->ld);
        if (is_bias(e)) v += load(o->bias, bt, (int64_t)i);
        if (e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) store(o->aux, d->type, (int64_t)i + (int64_t)j * o->aux_ld, v);
        if (is_gelu(e)) v = gelu(v);
        if (is_dgelu(e)) v *= dgelu(load(o->aux, d->type, (int64_t)i + (int64_t)j * o->aux_ld));
        out[i + j * M] = v;
      }
    if (e == CUBLASLT_EPILOGUE_DGELU_BGRAD) /* one per row of D: the sum over its columns */
      for (uint64_t i = 0; i < M; i++) {
        double s = 0;
        for (uint64_t j = 0; j < N; j++) s += out[i + j * M];
        store((void *)o->bias, bt, (int64_t)i, s);
      }
    if (e == CUBLASLT_EPILOGUE_BGRADA) /* one per row of D: op(A)'s row, summed over k */
      for (uint64_t i = 0; i < M; i++) {
        double s = 0;
        for (uint64_t l = 0; l < K; l++) s += op_at(A, a, o->ta, z, i, l);
        store((void *)o->bias, bt, (int64_t)i, s);
      }
    if (e == CUBLASLT_EPILOGUE_BGRADB) /* one per column of D: op(B)'s column, summed over k */
      for (uint64_t j = 0; j < N; j++) {
        double s = 0;
        for (uint64_t l = 0; l < K; l++) s += op_at(B, b, o->tb, z, l, j);
        store((void *)o->bias, bt, (int64_t)j, s);
      }
    for (uint64_t j = 0; j < N; j++)
      for (uint64_t i = 0; i < M; i++) store(D, d->type, z * d->stride + (int64_t)i + (int64_t)j * d->ld, out[i + j * M]);
  }
  free(out);
  return CUBLAS_STATUS_SUCCESS;
}
