/* cplanrt_cuda.h: the CUDA part of the runtime (libcplanrt_cuda.a, built when CMake finds the
 * CUDA toolkit and NCCL; DESIGN.md §2, §6, issue 6). Conventions as cplanrt.h: functions return
 * 0 / a pointer on success and fill the caller's RtError on failure, except the NCCL
 * collectives, which cannot fail on one rank alone and stop every rank (as rt_comm does).
 *   cuda_rt.c    device discovery; NVRTC compilation with an on-disk cache; loading NVRTC
 *                images; the cuBLASLt GEMM with fused epilogues
 *   comm_nccl.c  rt_nccl: the collectives of rt_comm over NCCL, one process per GPU */
#ifndef CPLANRT_CUDA_H
#define CPLANRT_CUDA_H

#include "cplanrt.h"

#include <cuda_runtime_api.h>
#include <library_types.h>

/* ---- cuda_rt.c: devices ---------------------------------------------------------------------- */

typedef struct RtCudaDevice {
  int index;          /* the device this process uses */
  int count;          /* devices visible to it */
  int cc_major, cc_minor;
  int sms;            /* streaming multiprocessors */
  size_t mem_bytes;   /* global memory */
  char name[256];
} RtCudaDevice;

/* Finds the CUDA devices and makes device `index` (modulo the count: one process per GPU, index
 * = the local rank) current. No device, or a runtime that cannot talk to a driver, is the
 * error "no CUDA device found (REASON)": programs print it and exit 1. */
int rt_cuda_init(int index, RtCudaDevice *dev, RtError *err);

/* The error for a failed CUDA runtime call: "CALL failed: NAME: description". Returns -1. */
int rt_cuda_fail(RtError *err, const char *call, cudaError_t e);
#define RT_CUDA_CHECK(call, err)                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) return rt_cuda_fail((err), #call, e_);                                \
  } while (0)

/* ---- cuda_rt.c: NVRTC with an on-disk cache -----------------------------------------------------
 * rt_nvrtc_compile compiles CUDA C source to a cubin for sm_<cc_major><cc_minor> (the present
 * GPU's architecture: rt_cuda_init tells it; NVRTC itself needs no GPU) and keeps it in the
 * cache directory, $CPLAN_NVRTC_CACHE or else ~/.cache/cplan/nvrtc, under a hash of the source,
 * the architecture, the options and the NVRTC version. A later call with the same key reads
 * the file instead of compiling (img->cache_hit = 1). Cache files carry a checksum: a damaged
 * one is compiled again and rewritten. Files are written to a temporary name and renamed, so
 * ranks compiling the same source at once never read half a file. An unwritable cache is not
 * an error (the image is still returned). */
typedef struct RtNvrtcImage {
  void *data;         /* the cubin (malloc'd) */
  size_t size;
  int cache_hit;      /* 1 when read from the cache */
  char path[1024];    /* the cache file ("" when the cache is off) */
} RtNvrtcImage;

int rt_nvrtc_compile(const char *src, const char *name, int cc_major, int cc_minor, const char *const *opts,
                     int nopts, RtNvrtcImage *img, RtError *err);
void rt_nvrtc_image_free(RtNvrtcImage *img);
/* The cache directory (created if missing) in buf; NULL with the error when there is none. */
const char *rt_nvrtc_cache_dir(char *buf, size_t len, RtError *err);

/* Loads a cubin into the current context and finds a kernel in it (cudart's library API, which
 * reaches the driver itself, so programs link no libcuda). Launch with cudaLaunchKernel. */
int rt_cuda_library_load(const RtNvrtcImage *img, cudaLibrary_t *lib, RtError *err);
int rt_cuda_library_kernel(cudaLibrary_t lib, const char *name, cudaKernel_t *k, RtError *err);

/* ---- cuda_rt.c: GEMM through cuBLASLt ------------------------------------------------------------
 * Row-major: d [m, n] = alpha op(a) [m, k] op(b) [k, n] (+ beta d), batched with strides (0 for
 * a shared operand), then the epilogue. a stored [m, k] ([k, m] when trans_a), b stored [k, n]
 * ([n, k] when trans_b), d [m, n]; all contiguous. Types: f32 (optionally TF32 tensor cores), bf16
 * or f16 operands with f32 accumulation, and f32 output or the operands' type. Epilogues (bias: [n], in d's type):
 *   BIAS       d = ab + bias                      GELU, GELU_BIAS  gelu(ab (+ bias))
 *   GELU_AUX_BIAS  as GELU_BIAS, and aux [m, n] = ab + bias (the pre-activation, for DGELU)
 *   DGELU      d = ab * gelu'(aux)                 DGELU_BGRAD  as DGELU, and bias_grad [n] =
 *              the column sums of d (the bias gradient of the layer before the gelu)
 *   BGRAD_A    bias_grad [m] = the row sums of op(a) over k (dout's sums when a is dout^T: the
 *              bias gradient of the weight-gradient GEMM dW^T = dout^T x)
 *   BGRAD_B    bias_grad [n] = the column sums of op(b) over k (dout's sums when b is dout: the
 *              bias gradient of the weight-gradient GEMM dW = x^T dout)
 * bias_grad is f32 whatever d's type (cuBLASLt's BIAS_DATA_TYPE), and written, never added to. A
 * bias-gradient epilogue needs batch 1.
 * The workspace comes from the caller's arena (cuBLASLt picks no algorithm that needs more). */
typedef enum RtGemmEpilogue {
  RT_GEMM_NONE, RT_GEMM_BIAS, RT_GEMM_GELU, RT_GEMM_GELU_BIAS, RT_GEMM_GELU_AUX_BIAS, RT_GEMM_DGELU,
  RT_GEMM_DGELU_BGRAD, RT_GEMM_BGRAD_A, RT_GEMM_BGRAD_B
} RtGemmEpilogue;

typedef struct RtGemm {
  int m, n, k;
  int trans_a, trans_b;
  int batch;                    /* >= 1 */
  int64_t stride_a, stride_b, stride_d; /* elements between batches */
  int64_t lda, ldb, ldd;        /* the row pitch of a, b, d as stored (0: contiguous rows) */
  cudaDataType_t ab_type;       /* CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F */
  cudaDataType_t d_type;        /* CUDA_R_32F or ab_type */
  int tf32;                     /* f32 operands on TF32 tensor cores */
  const void *a, *b;
  void *d;
  float alpha, beta;
  RtGemmEpilogue epilogue;
  const void *bias;             /* BIAS, GELU_BIAS, GELU_AUX_BIAS */
  void *aux;                    /* GELU_AUX_BIAS (written), DGELU, DGELU_BGRAD (read): [m, n] in d_type */
  void *bias_grad;              /* DGELU_BGRAD, BGRAD_A, BGRAD_B (written): f32 */
} RtGemm;

typedef struct RtCublasLt RtCublasLt;
RtCublasLt *rt_cublaslt_create(RtError *err);
void rt_cublaslt_destroy(RtCublasLt *lt);
int rt_cublaslt_matmul(RtCublasLt *lt, const RtGemm *g, void *workspace, size_t workspace_bytes,
                       cudaStream_t stream, RtError *err);

/* ---- comm_nccl.c: rt_nccl, the GPU communicator ------------------------------------------------
 * The operations and group semantics of rt_comm (cplanrt.h, comm.c), on device buffers, enqueued
 * on a stream. MPI bootstraps it: rank 0's ncclUniqueId goes to every rank over the rt_comm
 * world, and the mesh-axis groups come from ncclCommSplit with the colors and keys of
 * rt_comm_split_axes. The communicators are non-blocking, so no call can hang the host: every
 * NCCL call is checked, and one still in progress is polled (ncclCommGetAsyncError) until
 * CPLAN_COMM_TIMEOUT seconds (default 300) have passed. A failure or a timeout prints the rank,
 * the call and the group, aborts this rank's communicators and stops every rank (MPI_Abort).
 * Collectives return once enqueued; rt_nccl_sync waits for the stream under the same deadline.
 * NCCL has no tags: sends and receives between two ranks match in program order. */
typedef enum RtNcclType {
  RT_NCCL_F32, RT_NCCL_F64, RT_NCCL_I64, RT_NCCL_U8, RT_NCCL_BF16, RT_NCCL_F16, RT_NCCL_I32, RT_NCCL_TYPE_COUNT
} RtNcclType;

typedef struct RtNccl RtNccl;

/* The world communicator over every rank of mpi_world, on CUDA device `device` (which it makes
 * current). Collective: every rank calls it. */
RtNccl *rt_nccl_init(RtComm *mpi_world, int device);
/* The groups of the mesh axes, as rt_comm_split_axes. Collective over world. */
void rt_nccl_split_axes(RtNccl *world, const int64_t *sizes, const char *const *names, int naxes, RtNccl **groups);
int rt_nccl_rank(const RtNccl *c);
int rt_nccl_size(const RtNccl *c);
const char *rt_nccl_name(const RtNccl *c);
uint64_t rt_nccl_bytes(const RtNccl *c);
void rt_nccl_all_reduce(RtNccl *c, void *buf, int64_t count, RtNcclType t, cudaStream_t s);
void rt_nccl_reduce_scatter(RtNccl *c, const void *send, void *recv, int64_t count, RtNcclType t, cudaStream_t s);
void rt_nccl_all_gather(RtNccl *c, const void *send, void *recv, int64_t count, RtNcclType t, cudaStream_t s);
void rt_nccl_all_to_all(RtNccl *c, const void *send, void *recv, int64_t count, RtNcclType t, cudaStream_t s);
void rt_nccl_broadcast(RtNccl *c, void *buf, int64_t count, RtNcclType t, int root, cudaStream_t s);
void rt_nccl_send(RtNccl *c, const void *buf, int64_t count, RtNcclType t, int peer, cudaStream_t s);
void rt_nccl_recv(RtNccl *c, void *buf, int64_t count, RtNcclType t, int peer, cudaStream_t s);
/* Waits for stream s (NCCL work and all), watching c for errors and the deadline. */
void rt_nccl_sync(RtNccl *c, cudaStream_t s, const char *what);
/* An all-reduce of one value, then rt_nccl_sync. */
void rt_nccl_barrier(RtNccl *c, cudaStream_t s);
/* Prints "rank R: MSG", aborts every communicator of this rank and stops every rank. */
void rt_nccl_abort(RtNccl *c, int code, const char *msg) __attribute__((noreturn));
/* ncclCommFinalize + ncclCommDestroy (a group, or the world last). */
void rt_nccl_free(RtNccl *c);

#endif
