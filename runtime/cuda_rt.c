/* cuda_rt.c: devices, NVRTC with an on-disk cache, and cuBLASLt GEMMs (cplanrt_cuda.h).
 *
 * Nothing here prints or exits: failures come back in the RtError, with the CUDA, NVRTC or
 * cuBLASLt call that failed and its message, and the program decides (a training program
 * prints "no CUDA device found" and exits 1 when rt_cuda_init fails). */
#include "cplanrt_cuda.h"

#include <cublasLt.h>
#include <nvrtc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef CPLAN_CUDA_INCLUDE
#define CPLAN_CUDA_INCLUDE "/usr/local/cuda/include"
#endif

/* ---- devices -------------------------------------------------------------------------------- */

int rt_cuda_fail(RtError *err, const char *call, cudaError_t e) {
  return rt_errf(err, "%s failed: %s: %s", call, cudaGetErrorName(e), cudaGetErrorString(e));
}

int rt_cuda_init(int index, RtCudaDevice *dev, RtError *err) {
  memset(dev, 0, sizeof *dev);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return rt_errf(err, "no CUDA device found (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
  if (n <= 0) return rt_errf(err, "no CUDA device found (cudaGetDeviceCount gave 0 devices)");
  dev->count = n;
  dev->index = index < 0 ? 0 : index % n;
  RT_CUDA_CHECK(cudaSetDevice(dev->index), err);
  struct cudaDeviceProp p;
  RT_CUDA_CHECK(cudaGetDeviceProperties(&p, dev->index), err);
  dev->cc_major = p.major;
  dev->cc_minor = p.minor;
  dev->sms = p.multiProcessorCount;
  dev->mem_bytes = p.totalGlobalMem;
  snprintf(dev->name, sizeof dev->name, "%s", p.name);
  return 0;
}

/* ---- the NVRTC cache ----------------------------------------------------------------------------
 * A cache file: "CPLNVRC1", the cubin's size and FNV-1a hash (u64 each), then the cubin. */

static const char cache_magic[8] = {'C', 'P', 'L', 'N', 'V', 'R', 'C', '1'};

static void fnv(uint64_t *h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) *h = (*h ^ p[i]) * 0x100000001b3ULL;
}
static void fnv_str(uint64_t h[2], const char *s) {
  size_t n = strlen(s) + 1; /* the terminator separates consecutive strings */
  fnv(&h[0], s, n);
  fnv(&h[1], s, n);
}

const char *rt_nvrtc_cache_dir(char *buf, size_t len, RtError *err) {
  return rt_cache_dir("CPLAN_NVRTC_CACHE", "nvrtc", "", buf, len, err);
}

/* The cached image at path, when there is a whole, undamaged one. */
static int cache_read(const char *path, RtNvrtcImage *img) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  char magic[8];
  uint64_t size = 0, sum = 0, h = 0xcbf29ce484222325ULL;
  int ok = fread(magic, 1, 8, f) == 8 && memcmp(magic, cache_magic, 8) == 0 && fread(&size, 8, 1, f) == 1 &&
           fread(&sum, 8, 1, f) == 1 && size > 0 && size < ((uint64_t)1 << 32);
  void *data = ok ? malloc(size) : NULL;
  ok = ok && data && fread(data, 1, size, f) == size && fgetc(f) == EOF;
  if (ok) fnv(&h, data, size);
  fclose(f);
  if (!ok || h != sum) {
    free(data);
    return -1;
  }
  img->data = data;
  img->size = size;
  return 0;
}

/* Writes the image to path through a temporary file and a rename; failures leave no file. */
static void cache_write(const char *path, const RtNvrtcImage *img) {
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return;
  uint64_t size = img->size, sum = 0xcbf29ce484222325ULL;
  fnv(&sum, img->data, img->size);
  int ok = fwrite(cache_magic, 1, 8, f) == 8 && fwrite(&size, 8, 1, f) == 1 && fwrite(&sum, 8, 1, f) == 1 &&
           fwrite(img->data, 1, img->size, f) == img->size;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) unlink(tmp);
}

static int nvrtc_fail(RtError *err, const char *call, nvrtcResult r, const char *name) {
  return rt_errf(err, "%s: %s failed: %s", name, call, nvrtcGetErrorString(r));
}

int rt_nvrtc_compile(const char *src, const char *name, int cc_major, int cc_minor, const char *const *opts, int nopts,
                     RtNvrtcImage *img, RtError *err) {
  memset(img, 0, sizeof *img);
  if (!src || !name || cc_major < 5 || cc_minor < 0 || nopts < 0 || nopts > 32)
    return rt_errf(err, "rt_nvrtc_compile: bad arguments");
  int vmaj = 0, vmin = 0;
  nvrtcVersion(&vmaj, &vmin);
  char arch[64], ver[32];
  snprintf(arch, sizeof arch, "--gpu-architecture=sm_%d%d", cc_major, cc_minor);
  snprintf(ver, sizeof ver, "nvrtc %d.%d", vmaj, vmin);
  uint64_t h[2] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL};
  fnv_str(h, ver);
  fnv_str(h, arch);
  for (int i = 0; i < nopts; i++) fnv_str(h, opts[i]);
  fnv_str(h, name);
  fnv_str(h, src);

  char dir[900];
  if (rt_nvrtc_cache_dir(dir, sizeof dir, NULL)) {
    snprintf(img->path, sizeof img->path, "%s/%016llx%016llx-sm_%d%d.cubin", dir, (unsigned long long)h[0],
             (unsigned long long)h[1], cc_major, cc_minor);
    if (cache_read(img->path, img) == 0) {
      img->cache_hit = 1;
      return 0;
    }
  }

  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) return nvrtc_fail(err, "nvrtcCreateProgram", r, name);
  const char *all[40];
  int n = 0;
  all[n++] = arch;
  all[n++] = "-std=c++17";
  all[n++] = "-I" CPLAN_CUDA_INCLUDE;
  for (int i = 0; i < nopts; i++) all[n++] = opts[i];
  r = nvrtcCompileProgram(prog, n, all);
  if (r != NVRTC_SUCCESS) {
    size_t len = 0;
    nvrtcGetProgramLogSize(prog, &len);
    char *log = malloc(len + 1);
    log[0] = 0;
    if (len) nvrtcGetProgramLog(prog, log);
    if (len > 400) strcpy(log + 397, "...");
    rt_errf(err, "%s: NVRTC compilation for sm_%d%d failed: %s", name, cc_major, cc_minor, log);
    free(log);
    nvrtcDestroyProgram(&prog);
    return -1;
  }
  size_t size = 0;
  r = nvrtcGetCUBINSize(prog, &size);
  if (r != NVRTC_SUCCESS || size == 0) {
    nvrtcDestroyProgram(&prog);
    return r != NVRTC_SUCCESS ? nvrtc_fail(err, "nvrtcGetCUBINSize", r, name) : rt_errf(err, "%s: empty cubin", name);
  }
  img->data = malloc(size);
  img->size = size;
  r = nvrtcGetCUBIN(prog, img->data);
  nvrtcDestroyProgram(&prog);
  if (r != NVRTC_SUCCESS) {
    rt_nvrtc_image_free(img);
    return nvrtc_fail(err, "nvrtcGetCUBIN", r, name);
  }
  if (img->path[0]) cache_write(img->path, img);
  return 0;
}

void rt_nvrtc_image_free(RtNvrtcImage *img) {
  free(img->data);
  img->data = NULL;
  img->size = 0;
}

int rt_cuda_library_load(const RtNvrtcImage *img, cudaLibrary_t *lib, RtError *err) {
  RT_CUDA_CHECK(cudaLibraryLoadData(lib, img->data, NULL, NULL, 0, NULL, NULL, 0), err);
  return 0;
}

int rt_cuda_library_kernel(cudaLibrary_t lib, const char *name, cudaKernel_t *k, RtError *err) {
  cudaError_t e = cudaLibraryGetKernel(k, lib, name);
  if (e != cudaSuccess) return rt_errf(err, "kernel %s: cudaLibraryGetKernel failed: %s", name, cudaGetErrorString(e));
  return 0;
}

/* ---- cuBLASLt ----------------------------------------------------------------------------------- */

/* The algorithm cuBLASLt's heuristic chose, per GEMM configuration: a training step runs the same
 * few dozen GEMMs every micro-batch, and the heuristic query costs far more host time than the
 * launch. The key holds everything the query sees: shapes, strides, types, transposes, epilogue,
 * the workspace limit and the operands' alignments (declared to the query, see lt_align). An open
 * addressing table; when it is full, the query runs every time (correct, only slower). */
typedef struct LtKey {
  int64_t m, n, k, batch, stride_a, stride_b, stride_d, ab_type, d_type, trans_a, trans_b, epilogue, tf32;
  int64_t workspace, align_a, align_b, align_d, lda, ldb, ldd;
} LtKey;

typedef struct LtSlot {
  int used;
  LtKey key;
  cublasLtMatmulAlgo_t algo;
} LtSlot;

#define LT_SLOTS 1024

struct RtCublasLt {
  cublasLtHandle_t h;
  LtSlot slot[LT_SLOTS];
};

static int lt_fail(RtError *err, const char *call, cublasStatus_t s) {
  return rt_errf(err, "%s failed: %s (%d)", call, cublasLtGetStatusName(s), (int)s);
}
#define LT_CHECK(call)                                                                           \
  do {                                                                                           \
    cublasStatus_t s_ = (call);                                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                           \
      rc = lt_fail(err, #call, s_);                                                              \
      goto done;                                                                                 \
    }                                                                                            \
  } while (0)

RtCublasLt *rt_cublaslt_create(RtError *err) {
  RtCublasLt *lt = calloc(1, sizeof *lt);
  cublasStatus_t s = cublasLtCreate(&lt->h);
  if (s != CUBLAS_STATUS_SUCCESS) {
    lt_fail(err, "cublasLtCreate", s);
    free(lt);
    return NULL;
  }
  return lt;
}

void rt_cublaslt_destroy(RtCublasLt *lt) {
  if (!lt) return;
  cublasLtDestroy(lt->h);
  free(lt);
}

static cublasLtEpilogue_t lt_epilogue(RtGemmEpilogue e) {
  /* Checklist: one case per RtGemmEpilogue. BGRAD_A is cuBLASLt's BGRADB and BGRAD_B its BGRADA:
   * the row-major call swaps the operands (see rt_cublaslt_matmul). */
  switch (e) {
  case RT_GEMM_NONE: return CUBLASLT_EPILOGUE_DEFAULT;
  case RT_GEMM_BIAS: return CUBLASLT_EPILOGUE_BIAS;
  case RT_GEMM_GELU: return CUBLASLT_EPILOGUE_GELU;
  case RT_GEMM_GELU_BIAS: return CUBLASLT_EPILOGUE_GELU_BIAS;
  case RT_GEMM_GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  case RT_GEMM_DGELU: return CUBLASLT_EPILOGUE_DGELU;
  case RT_GEMM_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
  case RT_GEMM_BGRAD_A: return CUBLASLT_EPILOGUE_BGRADB;
  case RT_GEMM_BGRAD_B: return CUBLASLT_EPILOGUE_BGRADA;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

static int lt_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int rows, int cols, int ld, int batch,
                     int64_t stride, RtError *err) {
  int rc = 0;
  *l = NULL;
  LT_CHECK(cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld));
  if (batch > 1) {
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
done:
  return rc;
}

/* The alignment in bytes (256 at most) that every matrix of a strided batch has: the base
 * pointer's and the batch stride's. The heuristic assumes 256 for every operand unless told
 * (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*), and an algorithm picked for 256 may refuse or misread a
 * less aligned operand; arena buffers are 64-byte aligned, views into them (a head's columns)
 * less. */
static uint32_t lt_align(const void *p, int batch, int64_t stride, cudaDataType_t t) {
  uint64_t a = (uint64_t)(uintptr_t)p;
  if (batch > 1) a |= (uint64_t)stride * (t == CUDA_R_32F ? 4u : 2u);
  uint32_t al = 256;
  while (al > 1 && a % al) al /= 2;
  return al;
}

static uint64_t lt_hash(const LtKey *k) {
  uint64_t h = 0xcbf29ce484222325ULL;
  fnv(&h, k, sizeof *k);
  return h;
}

/* The cached algorithm for key, or NULL (*slot: where to store it, NULL when the table is full). */
static const cublasLtMatmulAlgo_t *lt_cached(RtCublasLt *lt, const LtKey *key, LtSlot **slot) {
  *slot = NULL;
  for (uint64_t i = lt_hash(key) % LT_SLOTS, n = 0; n < LT_SLOTS; i = (i + 1) % LT_SLOTS, n++) {
    LtSlot *s = &lt->slot[i];
    if (!s->used) {
      *slot = s;
      return NULL;
    }
    if (memcmp(&s->key, key, sizeof *key) == 0) return &s->algo;
  }
  return NULL;
}

/* cuBLASLt is column-major, and a row-major X [r, c] is the column-major X^T [c, r]; so the
 * row-major d = op(a) op(b) runs as the column-major d^T = op(b)^T op(a)^T: cuBLASLt's first
 * operand is b, its second is a, and its d is [n rows, m cols] with leading dim n. */
int rt_cublaslt_matmul(RtCublasLt *lt, const RtGemm *g, void *workspace, size_t workspace_bytes, cudaStream_t stream,
                       RtError *err) {
  if (!lt || !g || g->m <= 0 || g->n <= 0 || g->k <= 0 || g->batch < 1 || !g->a || !g->b || !g->d)
    return rt_errf(err, "rt_cublaslt_matmul: bad shape or operands (m %d, n %d, k %d, batch %d)", g ? g->m : 0,
                   g ? g->n : 0, g ? g->k : 0, g ? g->batch : 0);
  int ab_ok = g->ab_type == CUDA_R_32F || g->ab_type == CUDA_R_16BF || g->ab_type == CUDA_R_16F;
  int d_ok = g->d_type == CUDA_R_32F || g->d_type == g->ab_type;
  if (!ab_ok || !d_ok)
    return rt_errf(err, "rt_cublaslt_matmul: operands must be f32, bf16 or f16, and d f32 or the operands' type");
  int needs_bias = g->epilogue == RT_GEMM_BIAS || g->epilogue == RT_GEMM_GELU_BIAS || g->epilogue == RT_GEMM_GELU_AUX_BIAS;
  int needs_aux = g->epilogue == RT_GEMM_GELU_AUX_BIAS || g->epilogue == RT_GEMM_DGELU || g->epilogue == RT_GEMM_DGELU_BGRAD;
  int needs_bgrad = g->epilogue == RT_GEMM_DGELU_BGRAD || g->epilogue == RT_GEMM_BGRAD_A || g->epilogue == RT_GEMM_BGRAD_B;
  if ((needs_bias && !g->bias) || (needs_aux && !g->aux) || (needs_bgrad && !g->bias_grad))
    return rt_errf(err, "rt_cublaslt_matmul: epilogue %d needs its bias, aux or bias_grad pointer", (int)g->epilogue);
  if (needs_bgrad && g->batch != 1)
    return rt_errf(err, "rt_cublaslt_matmul: a bias-gradient epilogue needs batch 1 (got %d)", g->batch);
  if (needs_aux && g->n % 8 != 0)
    return rt_errf(err, "rt_cublaslt_matmul: a gelu aux epilogue needs n (%d) to be a multiple of 8", g->n);
  /* the row pitches as stored (0: contiguous) */
  int64_t lda = g->lda ? g->lda : g->trans_a ? g->m : g->k, ldb = g->ldb ? g->ldb : g->trans_b ? g->k : g->n;
  int64_t ldd = g->ldd ? g->ldd : g->n;
  if (lda < (g->trans_a ? g->m : g->k) || ldb < (g->trans_b ? g->k : g->n) || ldd < g->n || lda > INT32_MAX ||
      ldb > INT32_MAX || ldd > INT32_MAX)
    return rt_errf(err, "rt_cublaslt_matmul: a row pitch shorter than its row or over 2^31 (lda %lld, ldb %lld, ldd %lld)",
                   (long long)lda, (long long)ldb, (long long)ldd);

  int rc = 0;
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasComputeType_t ct = g->ab_type == CUDA_R_32F && g->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LT_CHECK(cublasLtMatmulDescCreate(&op, ct, CUDA_R_32F));
  cublasOperation_t ta = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtEpilogue_t epi = lt_epilogue(g->epilogue);
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (needs_bias) LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
  if (needs_bgrad) {
    int32_t bt = CUDA_R_32F; /* the bias gradient in f32, also under a bf16 / f16 d */
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias_grad, sizeof g->bias_grad));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  if (needs_aux) {
    int64_t ldaux = g->n;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux, sizeof g->aux));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof ldaux));
  }
  /* cuBLASLt's A = our b: stored [k, n] (col-major n x k, ld n), or [n, k] when trans_b */
  if (lt_layout(&la, g->ab_type, g->trans_b ? g->k : g->n, g->trans_b ? g->n : g->k, (int)ldb, g->batch, g->stride_b, err))
    goto fail;
  /* cuBLASLt's B = our a: stored [m, k] (col-major k x m, ld k), or [k, m] when trans_a */
  if (lt_layout(&lb, g->ab_type, g->trans_a ? g->m : g->k, g->trans_a ? g->k : g->m, (int)lda, g->batch, g->stride_a, err))
    goto fail;
  if (lt_layout(&ld, g->d_type, g->n, g->m, (int)ldd, g->batch, g->stride_d, err)) goto fail;
  /* cuBLASLt's A is our b, its B our a; C is d */
  uint32_t al_a = lt_align(g->b, g->batch, g->stride_b, g->ab_type), al_b = lt_align(g->a, g->batch, g->stride_a, g->ab_type);
  uint32_t al_d = lt_align(g->d, g->batch, g->stride_d, g->d_type);
  /* int64_t fields only: no padding, so memcmp compares the whole key */
  LtKey key = {g->m,     g->n,      g->k,       g->batch,       g->stride_a, g->stride_b,
               g->stride_d, g->ab_type, g->d_type, g->trans_a, g->trans_b, g->epilogue,
               g->tf32 && g->ab_type == CUDA_R_32F, (int64_t)workspace_bytes, al_a, al_b, al_d, lda, ldb, ldd};
  LtSlot *slot;
  const cublasLtMatmulAlgo_t *algo = lt_cached(lt, &key, &slot);
  cublasLtMatmulHeuristicResult_t heur;
  if (!algo) {
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof workspace_bytes));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt->h, op, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found == 0) {
      rc = rt_errf(err, "cuBLASLt has no algorithm for m %d n %d k %d (epilogue %d) within %zu bytes of workspace",
                   g->m, g->n, g->k, (int)g->epilogue, workspace_bytes);
      goto done;
    }
    algo = &heur.algo;
  }
  LT_CHECK(cublasLtMatmul(lt->h, op, &g->alpha, g->b, la, g->a, lb, &g->beta, g->d, ld, g->d, ld, algo, workspace,
                          workspace_bytes, stream));
  if (slot) { /* only an algorithm that ran is kept */
    slot->used = 1;
    slot->key = key;
    slot->algo = heur.algo;
  }
  goto done;
fail:
  rc = -1;
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (ld) cublasLtMatrixLayoutDestroy(ld);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  return rc;
}
