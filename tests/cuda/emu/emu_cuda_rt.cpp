/* emu_cuda_rt.cpp: runtime/cplanrt_cuda.h for the CUDA-on-CPU test emulator (README.md, "Training
 * programs"), in place of runtime/cuda_rt.c and runtime/comm_nccl.c, so that a plan.c that
 * `cplanc build --keep-c` emitted for a CUDA mesh runs on the CPU:
 *   rt_cuda_init         the emulator's one device (emu_runtime.cpp)
 *   rt_nvrtc_compile     kernels.cu -> emu_translate --entries -> the host C++ compiler -> a shared
 *                        object in the cache directory ($CPLAN_NVRTC_CACHE/emu, else
 *                        ~/.cache/cplan/nvrtc/emu) under a hash of the source, the emulator's
 *                        headers and the command; the image is the path of that object
 *   rt_cuda_library_*    dlopen / dlsym of the trampolines cuemu_entry_NAME
 *   cudaLaunchKernel     calls the trampoline (grid, block, dynamic shared memory, stream, args)
 *   cudaEvent*           host clock (CPLAN_PROFILE=1)
 *   rt_cublaslt_matmul   a plain GEMM accumulating in double, every epilogue, rounded once at the store
 *   rt_nccl_*            the collectives of rt_comm (MPI) on host memory (device memory is host memory)
 * The program must export the emulator's symbols to the object (link with -rdynamic). */
#include <cuda_runtime_api.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <library_types.h>

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

extern "C" {
#include "cplanrt_cuda.h"
}
#include "emu_queue.h"

#ifndef CUEMU_CXX
#error "CUEMU_CXX, CUEMU_TRANSLATE, CUEMU_CXXFLAGS: the build defines them (tests/CMakeLists.txt)"
#endif

namespace {

/* ---- kernels compiled at run time ------------------------------------------------------------- */
typedef void (*EntryFn)(dim3, dim3, size_t, cudaStream_t, void **);
struct EmuKernel {
  uint64_t magic;
  EntryFn fn;
  std::string name;
};
const uint64_t kMagic = 0x6375656d756b726eull;
std::mutex mu;
std::set<const void *> kernels;

uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

uint64_t fnv_file(uint64_t h, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return fnv(h, path, strlen(path));
  char buf[65536];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) h = fnv(h, buf, got);
  fclose(f);
  return h;
}

/* runs argv (no shell), its output into log; 0 when it exits 0 */
int run(const std::vector<std::string> &args, const std::string &log) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    FILE *l = freopen(log.c_str(), "w", stdout);
    if (l) dup2(fileno(stdout), 2);
    std::vector<char *> v;
    for (const std::string &a : args) v.push_back((char *)a.c_str());
    v.push_back(nullptr);
    execvp(v[0], v.data());
    fprintf(stderr, "%s: %s\n", v[0], strerror(errno));
    _exit(127);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

std::vector<std::string> words(const char *s) {
  std::vector<std::string> w;
  std::string cur;
  for (const char *p = s;; p++) {
    if (*p == ' ' || *p == ';' || !*p) {
      if (!cur.empty()) w.push_back(cur), cur.clear();
      if (!*p) break;
    } else cur += *p;
  }
  return w;
}

std::string tail_of(const std::string &path, size_t max) {
  FILE *f = fopen(path.c_str(), "rb");
  if (!f) return "";
  std::string s;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, got);
  fclose(f);
  return s.size() > max ? s.substr(s.size() - max) : s;
}

/* ---- element access for the GEMM ------------------------------------------------------------- */
double load(const void *p, cudaDataType_t t, int64_t i) {
  switch (t) {
  case CUDA_R_16BF: return (double)__bfloat162float(((const __nv_bfloat16 *)p)[i]);
  case CUDA_R_16F: return (double)__half2float(((const __half *)p)[i]);
  default: return (double)((const float *)p)[i];
  }
}

/* rounds once: double -> float -> the storage type (f32 GEMM outputs are f32 sums rounded once) */
void store(void *p, cudaDataType_t t, int64_t i, double v) {
  float f = (float)v;
  switch (t) {
  case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(f); break;
  case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn(f); break;
  default: ((float *)p)[i] = f; break;
  }
}

/* gelu, tanh form (cuBLASLt's GELU epilogue), and its derivative */
double gelu(double x) {
  const double c = 0.7978845608028654;
  return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}
double dgelu(double x) {
  const double c = 0.7978845608028654;
  double u = c * (x + 0.044715 * x * x * x), th = tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

} // namespace

struct RtCublasLt {
  int unused;
};

struct RtNccl {
  RtComm *comm;
  int owned; /* a group of rt_nccl_split_axes: rt_nccl_free frees its rt_comm */
  uint64_t bytes;
  char name[64];
};

extern "C" {

/* ---- devices ------------------------------------------------------------------------------------ */
int rt_cuda_fail(RtError *err, const char *call, cudaError_t e) {
  return rt_errf(err, "%s failed: %s: %s", call, cudaGetErrorName(e), cudaGetErrorString(e));
}

int rt_cuda_init(int index, RtCudaDevice *dev, RtError *err) {
  memset(dev, 0, sizeof *dev);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) return rt_errf(err, "no CUDA device found (the emulator has none)");
  dev->count = n;
  dev->index = index < 0 ? 0 : index % n;
  RT_CUDA_CHECK(cudaSetDevice(dev->index), err);
  struct cudaDeviceProp p;
  RT_CUDA_CHECK(cudaGetDeviceProperties(&p, dev->index), err);
  dev->cc_major = p.major, dev->cc_minor = p.minor, dev->sms = p.multiProcessorCount;
  dev->mem_bytes = p.totalGlobalMem;
  snprintf(dev->name, sizeof dev->name, "%s", p.name);
  return 0;
}

/* ---- "NVRTC": the host C++ compiler ------------------------------------------------------------- */
/* the real runtime's directory with /emu appended: emulated images never meet real cubins */
const char *rt_nvrtc_cache_dir(char *buf, size_t len, RtError *err) {
  return rt_cache_dir("CPLAN_NVRTC_CACHE", "nvrtc", "/emu", buf, len, err);
}

int rt_nvrtc_compile(const char *src, const char *name, int cc_major, int cc_minor, const char *const *opts, int nopts,
                     RtNvrtcImage *img, RtError *err) {
  memset(img, 0, sizeof *img);
  char dir[900];
  if (!rt_nvrtc_cache_dir(dir, sizeof dir, err)) return -1;
  std::vector<std::string> cmd = words(CUEMU_CXX);
  for (const std::string &w : words(CUEMU_CXXFLAGS)) cmd.push_back(w);
  uint64_t h = fnv(0xcbf29ce484222325ull, src, strlen(src));
  for (const std::string &w : cmd) h = fnv(h, w.c_str(), w.size() + 1);
  h = fnv_file(h, CUEMU_DIR "/cuda_emu.h"), h = fnv_file(h, CUEMU_DIR "/emu_queue.h");
  h = fnv_file(h, CUEMU_DIR "/include/mma.h");
  h = fnv_file(h, CUEMU_TRANSLATE);
  h = fnv(h, &cc_major, sizeof cc_major), h = fnv(h, &cc_minor, sizeof cc_minor);
  for (int i = 0; i < nopts; i++) h = fnv(h, opts[i], strlen(opts[i]) + 1);
  char base[1000];
  snprintf(base, sizeof base, "%s/%016llx", dir, (unsigned long long)h);
  std::string so = std::string(base) + ".so";
  snprintf(img->path, sizeof img->path, "%s", so.c_str());
  struct stat st;
  if (stat(so.c_str(), &st) == 0) {
    img->cache_hit = 1;
  } else {
    char tag[64];
    snprintf(tag, sizeof tag, ".%d", (int)getpid());
    std::string cu = std::string(base) + tag + ".cu", cpp = std::string(base) + tag + ".cpp",
                tmp = std::string(base) + tag + ".so", log = std::string(base) + tag + ".log";
    FILE *f = fopen(cu.c_str(), "wb");
    if (!f || fwrite(src, 1, strlen(src), f) != strlen(src) || fclose(f) != 0)
      return rt_errf(err, "%s: cannot write: %s", cu.c_str(), strerror(errno));
    if (run({CUEMU_TRANSLATE, "--entries", cu, cpp}, log) != 0)
      return rt_errf(err, "emu_translate %s (%s) failed:\n%s", cu.c_str(), name, tail_of(log, 2000).c_str());
    cmd.push_back(cpp), cmd.push_back("-o"), cmd.push_back(tmp);
    if (run(cmd, log) != 0)
      return rt_errf(err, "compiling %s (%s) for the emulator failed (%s):\n%s", cpp.c_str(), name, log.c_str(),
                     tail_of(log, 3000).c_str());
    if (rename(tmp.c_str(), so.c_str()) != 0) return rt_errf(err, "%s: cannot rename: %s", so.c_str(), strerror(errno));
    unlink(cu.c_str()), unlink(cpp.c_str()), unlink(log.c_str());
  }
  img->data = strdup(so.c_str());
  img->size = so.size() + 1;
  return img->data ? 0 : rt_errf(err, "out of memory");
}

void rt_nvrtc_image_free(RtNvrtcImage *img) {
  if (!img) return;
  free(img->data);
  img->data = NULL, img->size = 0;
}

int rt_cuda_library_load(const RtNvrtcImage *img, cudaLibrary_t *lib, RtError *err) {
  if (!img || !img->data) return rt_errf(err, "rt_cuda_library_load: no image");
  void *h = dlopen((const char *)img->data, RTLD_NOW | RTLD_LOCAL);
  if (!h) return rt_errf(err, "dlopen %s: %s", (const char *)img->data, dlerror());
  *lib = (cudaLibrary_t)h;
  return 0;
}

int rt_cuda_library_kernel(cudaLibrary_t lib, const char *name, cudaKernel_t *k, RtError *err) {
  std::string sym = std::string("cuemu_entry_") + name;
  void *f = dlsym((void *)lib, sym.c_str());
  if (!f) return rt_errf(err, "cudaLibraryGetKernel(%s) failed: cudaErrorSymbolNotFound: no such kernel", name);
  EmuKernel *e = new EmuKernel{kMagic, (EntryFn)f, name};
  std::lock_guard<std::mutex> g(mu);
  kernels.insert(e);
  *k = (cudaKernel_t)e;
  return 0;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t smem, cudaStream_t stream) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (!kernels.count(func)) return cudaErrorInvalidDeviceFunction;
  }
  const EmuKernel *e = (const EmuKernel *)func;
  (void)cudaGetLastError(); /* this launch's own error (launch_at records it) */
  e->fn(grid, block, smem, stream, args);
  return cudaGetLastError();
}

/* ---- events: host time, taken when the event's place in its stream is reached --------------------- */
struct EmuEvent {
  double ms;
  cudaStream_t s;
};
static void event_now(void *e) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ((EmuEvent *)e)->ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
cudaError_t cudaEventCreate(cudaEvent_t *ev) {
  if (!ev) return cudaErrorInvalidValue;
  *ev = (cudaEvent_t)calloc(1, sizeof(EmuEvent));
  return *ev ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags) {
  (void)flags;
  return cudaEventCreate(ev);
}
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  if (ev) cuemu::drain(((EmuEvent *)ev)->s); /* a pending record would write it */
  free(ev);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  if (!ev) return cudaErrorInvalidResourceHandle;
  ((EmuEvent *)ev)->s = s;
  cuemu::enqueue(s, event_now, ev);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  if (!ev) return cudaErrorInvalidResourceHandle;
  cuemu::drain(((EmuEvent *)ev)->s);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  if (!ms || !a || !b) return cudaErrorInvalidValue;
  *ms = (float)(((EmuEvent *)b)->ms - ((EmuEvent *)a)->ms);
  return cudaSuccess;
}

/* ---- cuBLASLt: a plain GEMM ------------------------------------------------------------------------ */
RtCublasLt *rt_cublaslt_create(RtError *err) {
  RtCublasLt *lt = (RtCublasLt *)calloc(1, sizeof *lt);
  if (!lt) rt_errf(err, "out of memory");
  return lt;
}
void rt_cublaslt_destroy(RtCublasLt *lt) { free(lt); }

static void gemm_now(void *g_);

int rt_cublaslt_matmul(RtCublasLt *lt, const RtGemm *g, void *workspace, size_t workspace_bytes, cudaStream_t stream,
                       RtError *err) {
  (void)workspace, (void)workspace_bytes;
  if (!lt || !g || g->m <= 0 || g->n <= 0 || g->k <= 0 || g->batch < 1 || !g->a || !g->b || !g->d)
    return rt_errf(err, "rt_cublaslt_matmul: bad shape or operands (m %d, n %d, k %d, batch %d)", g ? g->m : 0,
                   g ? g->n : 0, g ? g->k : 0, g ? g->batch : 0);
  int ab_ok = g->ab_type == CUDA_R_32F || g->ab_type == CUDA_R_16BF || g->ab_type == CUDA_R_16F;
  int d_ok = g->d_type == CUDA_R_32F || g->d_type == g->ab_type;
  if (!ab_ok || !d_ok)
    return rt_errf(err, "rt_cublaslt_matmul: operands must be f32, bf16 or f16, and d f32 or the operands' type");
  RtGemmEpilogue ep = g->epilogue;
  int needs_bias = ep == RT_GEMM_BIAS || ep == RT_GEMM_GELU_BIAS || ep == RT_GEMM_GELU_AUX_BIAS;
  int needs_aux = ep == RT_GEMM_GELU_AUX_BIAS || ep == RT_GEMM_DGELU || ep == RT_GEMM_DGELU_BGRAD;
  int needs_bgrad = ep == RT_GEMM_DGELU_BGRAD || ep == RT_GEMM_BGRAD_A || ep == RT_GEMM_BGRAD_B;
  if ((needs_bias && !g->bias) || (needs_aux && !g->aux) || (needs_bgrad && !g->bias_grad))
    return rt_errf(err, "rt_cublaslt_matmul: epilogue %d needs its bias, aux or bias_grad pointer", (int)ep);
  if (needs_bgrad && g->batch != 1)
    return rt_errf(err, "rt_cublaslt_matmul: a bias-gradient epilogue needs batch 1 (got %d)", g->batch);
  if (needs_aux && g->n % 8 != 0)
    return rt_errf(err, "rt_cublaslt_matmul: a gelu aux epilogue needs n (%d) to be a multiple of 8", g->n);
  if ((g->lda && g->lda < (g->trans_a ? g->m : g->k)) || (g->ldb && g->ldb < (g->trans_b ? g->k : g->n)) ||
      (g->ldd && g->ldd < g->n) || g->lda < 0 || g->ldb < 0 || g->ldd < 0 || g->lda > INT32_MAX || g->ldb > INT32_MAX ||
      g->ldd > INT32_MAX)
    return rt_errf(err, "rt_cublaslt_matmul: a row pitch shorter than its row or over 2^31 (lda %lld, ldb %lld, ldd %lld)",
                   (long long)g->lda, (long long)g->ldb, (long long)g->ldd);
  /* CUEMU_REFUSE_EPILOGUES: RtGemmEpilogue numbers, comma-separated, that this cuBLASLt finds no
   * algorithm for, as a real one may (the program's fallbacks are then taken) */
  if (const char *r = getenv("CUEMU_REFUSE_EPILOGUES"))
    for (const char *q = r; *q;) {
      char *end;
      long v = strtol(q, &end, 10);
      if (end == q) break;
      if (v == (long)ep)
        return rt_errf(err, "cuBLASLt has no algorithm for m %d n %d k %d (epilogue %d: CUEMU_REFUSE_EPILOGUES)", g->m,
                       g->n, g->k, (int)ep);
      q = *end == ',' ? end + 1 : end;
    }
  cuemu::enqueue(stream, gemm_now, new RtGemm(*g));
  return 0;
}

/* the product itself, in its stream's order (g: the call's copy) */
static void gemm_now(void *g_) {
  const RtGemm *g = (const RtGemm *)g_;
  RtGemmEpilogue ep = g->epilogue;
  int needs_bias = ep == RT_GEMM_BIAS || ep == RT_GEMM_GELU_BIAS || ep == RT_GEMM_GELU_AUX_BIAS;
  int needs_aux = ep == RT_GEMM_GELU_AUX_BIAS || ep == RT_GEMM_DGELU || ep == RT_GEMM_DGELU_BGRAD;
  const int m = g->m, n = g->n, k = g->k;
  /* the row pitches (lda, ldb, ldd; 0: contiguous rows) */
  const int64_t lda = g->lda ? g->lda : g->trans_a ? m : k, ldb = g->ldb ? g->ldb : g->trans_b ? k : n;
  const int64_t ldd = g->ldd ? g->ldd : n;
  const cudaDataType_t at = g->ab_type, dt = g->d_type;
  std::vector<double> acc((size_t)m * n), bsum;
  if (ep == RT_GEMM_DGELU_BGRAD || ep == RT_GEMM_BGRAD_B) bsum.assign((size_t)n, 0.0);
  if (ep == RT_GEMM_BGRAD_A) bsum.assign((size_t)m, 0.0);
  for (int z = 0; z < g->batch; z++) {
    const char *a = (const char *)g->a, *b = (const char *)g->b;
    size_t es = at == CUDA_R_32F ? 4 : 2, ds = dt == CUDA_R_32F ? 4 : 2;
    a += (size_t)(z * g->stride_a) * es, b += (size_t)(z * g->stride_b) * es;
    char *d = (char *)g->d + (size_t)(z * g->stride_d) * ds;
    char *aux = needs_aux ? (char *)g->aux + (size_t)(z * g->stride_d) * ds : NULL;
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double s = 0;
        for (int l = 0; l < k; l++) {
          double x = load(a, at, g->trans_a ? (int64_t)l * lda + i : (int64_t)i * lda + l);
          double y = load(b, at, g->trans_b ? (int64_t)j * ldb + l : (int64_t)l * ldb + j);
          s += x * y;
        }
        /* cuBLASLt's f32 compute: alpha * ab + beta * c in f32, then the epilogue */
        float v = (float)(g->alpha * s);
        if (g->beta != 0.0f) v += g->beta * (float)load(d, dt, (int64_t)i * ldd + j);
        acc[(size_t)i * n + j] = v;
      }
    if (ep == RT_GEMM_BGRAD_A)
      for (int i = 0; i < m; i++)
        for (int l = 0; l < k; l++) bsum[(size_t)i] += load(a, at, g->trans_a ? (int64_t)l * lda + i : (int64_t)i * lda + l);
    if (ep == RT_GEMM_BGRAD_B)
      for (int l = 0; l < k; l++)
        for (int j = 0; j < n; j++) bsum[(size_t)j] += load(b, at, g->trans_b ? (int64_t)j * ldb + l : (int64_t)l * ldb + j);
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        int64_t o = (int64_t)i * n + j; /* aux's index (its leading dim is n) */
        double v = acc[(size_t)o];
        if (needs_bias) v = (float)(v + load(g->bias, dt, j));
        switch (ep) {
        case RT_GEMM_GELU:
        case RT_GEMM_GELU_BIAS: v = gelu(v); break;
        case RT_GEMM_GELU_AUX_BIAS: store(aux, dt, o, v), v = gelu(v); break;
        case RT_GEMM_DGELU: v = v * dgelu(load(aux, dt, o)); break;
        case RT_GEMM_DGELU_BGRAD:
          v = (float)(v * dgelu(load(aux, dt, o)));
          bsum[(size_t)j] += v;
          break;
        default: break;
        }
        store(d, dt, (int64_t)i * ldd + j, v);
      }
  }
  /* the bias gradient in f32 (BIAS_DATA_TYPE), whatever d's type */
  if (ep == RT_GEMM_DGELU_BGRAD || ep == RT_GEMM_BGRAD_B)
    for (int j = 0; j < n; j++) store(g->bias_grad, CUDA_R_32F, j, (float)bsum[(size_t)j]);
  if (ep == RT_GEMM_BGRAD_A)
    for (int i = 0; i < m; i++) store(g->bias_grad, CUDA_R_32F, i, (float)bsum[(size_t)i]);
  delete g;
}

/* ---- NCCL over rt_comm, on host memory ------------------------------------------------------------- */
static RtCommType comm_type(RtNcclType t) {
  switch (t) {
  case RT_NCCL_F32: return RT_COMM_F32;
  case RT_NCCL_F64: return RT_COMM_F64;
  case RT_NCCL_I64: return RT_COMM_I64;
  case RT_NCCL_I32: return RT_COMM_I32;
  default: return RT_COMM_U8;
  }
}
static size_t nccl_size(RtNcclType t) {
  static const size_t sz[RT_NCCL_TYPE_COUNT] = {4, 8, 8, 1, 2, 2, 4};
  return t >= 0 && t < RT_NCCL_TYPE_COUNT ? sz[t] : 1;
}

RtNccl *rt_nccl_init(RtComm *mpi_world, int device) {
  if (cudaSetDevice(device) != cudaSuccess) rt_comm_abort(mpi_world, 1, "rt_nccl_init: cudaSetDevice failed");
  RtNccl *c = (RtNccl *)calloc(1, sizeof *c);
  if (!c) rt_comm_abort(mpi_world, 1, "rt_nccl_init: out of memory");
  c->comm = mpi_world;
  snprintf(c->name, sizeof c->name, "%s", rt_comm_name(mpi_world));
  rt_comm_barrier(mpi_world);
  fprintf(stderr, "cuemu: rt_nccl_init: rank %d of %d (%s), collectives over MPI on host memory\n",
          rt_comm_rank(mpi_world), rt_comm_size(mpi_world), c->name);
  return c;
}

void rt_nccl_split_axes(RtNccl *world, const int64_t *sizes, const char *const *names, int naxes, RtNccl **groups) {
  std::vector<RtComm *> g((size_t)naxes);
  rt_comm_split_axes(world->comm, sizes, names, naxes, g.data());
  for (int i = 0; i < naxes; i++) {
    groups[i] = (RtNccl *)calloc(1, sizeof(RtNccl));
    if (!groups[i]) rt_comm_abort(world->comm, 1, "rt_nccl_split_axes: out of memory");
    groups[i]->comm = g[(size_t)i], groups[i]->owned = 1;
    snprintf(groups[i]->name, sizeof groups[i]->name, "%s", rt_comm_name(g[(size_t)i]));
  }
}

int rt_nccl_rank(const RtNccl *c) { return rt_comm_rank(c->comm); }
int rt_nccl_size(const RtNccl *c) { return rt_comm_size(c->comm); }
const char *rt_nccl_name(const RtNccl *c) { return c->name; }
uint64_t rt_nccl_bytes(const RtNccl *c) { return c->bytes; }

/* NCCL's sums of the 2-byte floats and u8 are not rt_comm's: every rank's bytes are gathered and
 * added in rank order (in f32 for bf16 and f16), for elements [lo, lo + count) of each rank's
 * send buffer of `stride` elements, into out. */
static void ordered_sum(RtNccl *c, const void *send, void *out, int64_t lo, int64_t count, int64_t stride, RtNcclType t) {
  int p = rt_comm_size(c->comm);
  size_t es = nccl_size(t), bytes = (size_t)stride * es;
  std::vector<unsigned char> all(bytes * (size_t)p);
  rt_comm_all_gather(c->comm, send, all.data(), (int64_t)bytes, RT_COMM_U8);
  for (int64_t i = 0; i < count; i++) {
    float sum = 0;
    for (int r = 0; r < p; r++) {
      const unsigned char *b = all.data() + (size_t)r * bytes;
      int64_t j = lo + i;
      sum += t == RT_NCCL_U8 ? (float)b[j]
             : t == RT_NCCL_F16 ? __half2float(((const __half *)b)[j])
                                : __bfloat162float(((const __nv_bfloat16 *)b)[j]);
    }
    if (t == RT_NCCL_U8) ((unsigned char *)out)[i] = (unsigned char)sum;
    else if (t == RT_NCCL_F16) ((__half *)out)[i] = __float2half_rn(sum);
    else ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn(sum);
  }
}

static bool small_float(RtNcclType t) { return t == RT_NCCL_BF16 || t == RT_NCCL_F16 || t == RT_NCCL_U8; }

/* a collective or a send / receive, run in its stream's order (the call's arguments) */
enum NcclKind { N_ALL_REDUCE, N_REDUCE_SCATTER, N_ALL_GATHER, N_ALL_TO_ALL, N_BROADCAST, N_SEND, N_RECV };
struct NcclOp {
  NcclKind kind;
  RtNccl *c;
  const void *send;
  void *recv;
  int64_t count;
  RtNcclType t;
  int peer; /* the root of a broadcast */
};

static void nccl_now(void *op_) {
  NcclOp *o = (NcclOp *)op_;
  RtNccl *c = o->c;
  size_t es = nccl_size(o->t);
  int64_t count = o->count, bytes = count * (int64_t)es;
  switch (o->kind) {
  case N_ALL_REDUCE:
    if (!small_float(o->t)) rt_comm_all_reduce(c->comm, o->recv, count, comm_type(o->t));
    else ordered_sum(c, o->recv, o->recv, 0, count, count, o->t);
    break;
  case N_REDUCE_SCATTER:
    if (!small_float(o->t)) rt_comm_reduce_scatter(c->comm, o->send, o->recv, count, comm_type(o->t));
    else ordered_sum(c, o->send, o->recv, count * rt_comm_rank(c->comm), count, count * rt_comm_size(c->comm), o->t);
    break;
  case N_ALL_GATHER: rt_comm_all_gather(c->comm, o->send, o->recv, bytes, RT_COMM_U8); break;
  case N_ALL_TO_ALL: rt_comm_all_to_all(c->comm, o->send, o->recv, bytes, RT_COMM_U8); break;
  case N_BROADCAST: rt_comm_broadcast(c->comm, o->recv, bytes, RT_COMM_U8, o->peer); break;
  /* NCCL has no tags: sends and receives between two ranks match in program order, as one tag does */
  case N_SEND: rt_comm_send(c->comm, o->send, bytes, RT_COMM_U8, o->peer, 4242); break;
  case N_RECV: rt_comm_recv(c->comm, o->recv, bytes, RT_COMM_U8, o->peer, 4242); break;
  }
  delete o;
}

static void nccl_enqueue(cudaStream_t s, NcclOp op) { cuemu::enqueue(s, nccl_now, new NcclOp(op)); }

void rt_nccl_all_reduce(RtNccl *c, void *buf, int64_t count, RtNcclType t, cudaStream_t s) {
  c->bytes += (uint64_t)count * nccl_size(t);
  nccl_enqueue(s, NcclOp{N_ALL_REDUCE, c, buf, buf, count, t, 0});
}

void rt_nccl_reduce_scatter(RtNccl *c, const void *send, void *recv, int64_t count, RtNcclType t, cudaStream_t s) {
  c->bytes += (uint64_t)count * nccl_size(t) * (uint64_t)rt_comm_size(c->comm);
  nccl_enqueue(s, NcclOp{N_REDUCE_SCATTER, c, send, recv, count, t, 0});
}

void rt_nccl_all_gather(RtNccl *c, const void *send, void *recv, int64_t count, RtNcclType t, cudaStream_t s) {
  c->bytes += (uint64_t)count * nccl_size(t) * (uint64_t)rt_comm_size(c->comm);
  nccl_enqueue(s, NcclOp{N_ALL_GATHER, c, send, recv, count, t, 0});
}

void rt_nccl_all_to_all(RtNccl *c, const void *send, void *recv, int64_t count, RtNcclType t, cudaStream_t s) {
  c->bytes += (uint64_t)count * nccl_size(t) * (uint64_t)rt_comm_size(c->comm);
  nccl_enqueue(s, NcclOp{N_ALL_TO_ALL, c, send, recv, count, t, 0});
}

void rt_nccl_broadcast(RtNccl *c, void *buf, int64_t count, RtNcclType t, int root, cudaStream_t s) {
  c->bytes += (uint64_t)count * nccl_size(t);
  nccl_enqueue(s, NcclOp{N_BROADCAST, c, buf, buf, count, t, root});
}

void rt_nccl_send(RtNccl *c, const void *buf, int64_t count, RtNcclType t, int peer, cudaStream_t s) {
  c->bytes += (uint64_t)count * nccl_size(t);
  nccl_enqueue(s, NcclOp{N_SEND, c, buf, NULL, count, t, peer});
}

void rt_nccl_recv(RtNccl *c, void *buf, int64_t count, RtNcclType t, int peer, cudaStream_t s) {
  nccl_enqueue(s, NcclOp{N_RECV, c, NULL, buf, count, t, peer});
}

void rt_nccl_sync(RtNccl *c, cudaStream_t s, const char *what) {
  cudaError_t e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s: cudaStreamSynchronize: %s", what, cudaGetErrorString(e));
    rt_nccl_abort(c, 1, msg);
  }
}

void rt_nccl_barrier(RtNccl *c, cudaStream_t s) {
  rt_nccl_sync(c, s, "barrier");
  rt_comm_barrier(c->comm);
}

void rt_nccl_abort(RtNccl *c, int code, const char *msg) { rt_comm_abort(c->comm, code, msg); }

void rt_nccl_free(RtNccl *c) {
  if (!c) return;
  if (c->owned) rt_comm_free(c->comm);
  free(c);
}

} // extern "C"
