/* emu_runtime.cpp: the scheduler and the host API of the CUDA-on-CPU test emulator
 * (tests/cuda/emu/README.md, cuda_emu.h).
 *
 * Scheduler: a launch checks its configuration as the runtime does, then runs the blocks one
 * after another. The threads of a block are fibers (one stack each, kept across blocks) in the
 * calling OS thread, resumed in index order by a loop that runs every ready fiber until it
 * waits (at __syncthreads or a warp operation) or returns. __syncthreads releases its waiters
 * when every thread of the block that has not returned has reached it; a warp operation
 * releases the lanes of its mask when all of them have reached it. A pass with nothing ready
 * while some fiber has not returned is a deadlock: reported, then abort().
 *
 * Fibers switch with a few instructions of assembly on x86-64 (ucontext's swapcontext makes a
 * system call per switch, which is 50 times slower) and with ucontext elsewhere or when
 * CUEMU_UCONTEXT is defined. Under AddressSanitizer every switch is announced with
 * __sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber.
 *
 * Host API: device memory is host memory (posix_memalign, filled with 0xff bytes, a NaN in f32,
 * bf16 and f16, so a kernel reading what nobody wrote shows); allocations are tracked, so a
 * copy from or to something that is not device memory fails with cudaErrorInvalidValue as the
 * runtime would. Streams are names: launches and copies are synchronous. */
#include "cuda_emu.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <mutex>
#include <vector>
#include <set>

#if defined(__SANITIZE_ADDRESS__)
#define CUEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUEMU_ASAN 1
#endif
#endif
#ifdef CUEMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__) && !defined(CUEMU_UCONTEXT)
#define CUEMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

namespace cuemu {

uint3 cur_thread, cur_block;
dim3 cur_block_dim, cur_grid_dim;

namespace {

/* ---- limits (those of sm_80 / sm_90) ------------------------------------------------------- */
const unsigned kMaxThreads = 1024, kMaxBlockX = 1024, kMaxBlockY = 1024, kMaxBlockZ = 64;
const unsigned kMaxGridX = 0x7fffffffu, kMaxGridYZ = 65535;
const size_t kSmemDefault = 48 * 1024, kSmemOptin = 227 * 1024;
const size_t kGuard = 64 * 1024; /* below each fiber stack */

/* ---- fibers -------------------------------------------------------------------------------- */
#ifdef CUEMU_ASM_SWITCH
extern "C" void cuemu_switch_ctx(void **save_sp, void *to_sp);
/* saves the callee-saved registers on the current stack, stores its pointer in *save_sp,
 * moves to to_sp and restores that stack's registers */
asm(R"(
  .text
  .p2align 4
  .globl cuemu_switch_ctx
  .hidden cuemu_switch_ctx
  .type cuemu_switch_ctx, @function
cuemu_switch_ctx:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuemu_switch_ctx, .-cuemu_switch_ctx
)");
#endif

enum State { READY, RUNNING, AT_BLOCK, AT_WARP, DONE };

struct Fiber {
#ifdef CUEMU_ASM_SWITCH
  void *sp;
#else
  ucontext_t uc;
#endif
  char *stack_lo; /* usable stack [stack_lo, stack_lo + stack_size), kGuard bytes of guard below */
  size_t stack_size;
  void *fake_stack; /* ASan's, while switched away */
  State state;
  uint3 tid;
  int lane, warp;
  /* the pending warp operation */
  unsigned w_mask;
  uint64_t w_value, w_out;
  int w_src, w_pred;
  unsigned w_ballot;
};

struct WarpGroup {
  unsigned mask, arrived;
};

struct Sched {
  Fiber *fibers = nullptr;
  int capacity = 0, n = 0;
  Fiber *cur = nullptr;
  int block_arrived = 0, exited = 0;
  unsigned warp_lanes[32];       /* the lanes each warp of the block has */
  WarpGroup groups[32][32];      /* per warp: the masks being waited for */
  int ngroups[32];
  void (*body)(void *) = nullptr;
  void *ctx = nullptr;
  LaunchSite site{};
  dim3 grid, block;
  size_t shmem = 0;
#ifdef CUEMU_ASM_SWITCH
  void *sched_sp = nullptr;
#else
  ucontext_t sched_uc;
#endif
  void *sched_fake = nullptr;
  const void *main_lo = nullptr; /* the scheduler's stack, for ASan */
  size_t main_size = 0;
  bool in_launch = false;
};
Sched S;
std::recursive_mutex launch_mutex;

size_t stack_bytes() {
  static size_t v = 0;
  if (!v) {
    const char *e = getenv("CUEMU_STACK_KB");
    long kb = e ? atol(e) : 0;
#ifdef CUEMU_ASAN
    if (kb <= 0) kb = 512;
#else
    if (kb <= 0) kb = 64;
#endif
    v = (size_t)kb * 1024;
  }
  return v;
}

[[noreturn]] void die(const char *fmt, ...) {
  va_list ap;
  fflush(stdout);
  fprintf(stderr, "cuda emu: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (S.in_launch)
    fprintf(stderr, "\n  in block (%u, %u, %u) of grid (%u, %u, %u), block (%u, %u, %u), of the kernel launched at %s:%d (%s)",
            cur_block.x, cur_block.y, cur_block.z, S.grid.x, S.grid.y, S.grid.z, S.block.x, S.block.y, S.block.z,
            S.site.file, S.site.line, S.site.func);
  fprintf(stderr, "\n");
  fflush(stderr);
  abort();
}

#ifndef CUEMU_ASAN
/* A fault in a fiber stack's guard page is an overflow: say so (ASan reports it itself). Any
 * other fault goes back to the previous action. */
struct sigaction old_segv;

void on_segv(int sig, siginfo_t *si, void *uc) {
  uintptr_t a = (uintptr_t)si->si_addr;
  for (int i = 0; i < S.capacity; i++) {
    uintptr_t lo = (uintptr_t)S.fibers[i].stack_lo;
    if (a < lo && a + kGuard >= lo) {
      char msg[512];
      int len = snprintf(msg, sizeof msg,
                         "cuda emu: thread %d overflowed its %zu KiB fiber stack in the kernel launched at %s:%d (%s); "
                         "CUEMU_STACK_KB=... gives the fibers more\n",
                         i, S.fibers[i].stack_size / 1024, S.site.file, S.site.line, S.site.func);
      if (len > 0 && write(2, msg, (size_t)len) < 0) _exit(134);
      signal(SIGABRT, SIG_DFL);
      abort();
    }
  }
  sigaction(SIGSEGV, &old_segv, nullptr); /* returning re-runs the access under the old action */
  (void)sig, (void)uc;
}

void watch_stack_overflows() {
  static bool done = false;
  if (done) return;
  done = true;
  struct sigaction cur;
  if (sigaction(SIGSEGV, nullptr, &cur) != 0 || (cur.sa_flags & SA_SIGINFO) || cur.sa_handler != SIG_DFL) return;
  static char alt[64 * 1024];
  stack_t ss;
  memset(&ss, 0, sizeof ss);
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  if (sigaltstack(&ss, nullptr) != 0) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &old_segv);
}
#endif

void ensure_fibers(int n) {
#ifndef CUEMU_ASAN
  watch_stack_overflows();
#endif
  if (n <= S.capacity) return;
  Fiber *f = (Fiber *)realloc((void *)S.fibers, sizeof(Fiber) * (size_t)n);
  if (!f) die("out of memory for %d fibers", n);
  for (int i = S.capacity; i < n; i++) {
    memset((void *)&f[i], 0, sizeof(Fiber));
    size_t sz = stack_bytes();
    char *m = (char *)mmap(nullptr, sz + kGuard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("cannot map a %zu-byte fiber stack: %s", sz, strerror(errno));
    mprotect(m, kGuard, PROT_NONE); /* the guard: an overflow faults rather than writing the next stack */
    f[i].stack_lo = m + kGuard;
    f[i].stack_size = sz;
  }
  S.fibers = f;
  S.capacity = n;
}

/* ---- switching ------------------------------------------------------------------------------ */
/* the fiber side, after it has been switched to */
inline void arrived_in_fiber(Fiber *f) {
#ifdef CUEMU_ASAN
  __sanitizer_finish_switch_fiber(f->fake_stack, &S.main_lo, &S.main_size);
#else
  (void)f;
#endif
}

/* from the running fiber back to the scheduler; final: the fiber has returned */
void to_scheduler(Fiber *f, bool final) {
#ifdef CUEMU_ASAN
  __sanitizer_start_switch_fiber(final ? nullptr : &f->fake_stack, S.main_lo, S.main_size);
#endif
#ifdef CUEMU_ASM_SWITCH
  cuemu_switch_ctx(&f->sp, S.sched_sp);
#else
  swapcontext(&f->uc, &S.sched_uc);
#endif
  if (final) die("a returned fiber was resumed");
  arrived_in_fiber(f);
}

void fiber_main() {
  Fiber *f = S.cur;
  arrived_in_fiber(f);
  S.body(S.ctx);
  f = S.cur;
  f->state = DONE;
  S.exited++;
  if (S.block_arrived > 0 && S.block_arrived + S.exited == S.n) {
    for (int i = 0; i < S.n; i++)
      if (S.fibers[i].state == AT_BLOCK) S.fibers[i].state = READY;
    S.block_arrived = 0;
  }
  to_scheduler(f, true);
}

#ifndef CUEMU_ASM_SWITCH
void fiber_main_uc() { fiber_main(); }
#endif

void fiber_start(Fiber *f) {
#ifdef CUEMU_ASAN
  /* The previous fiber on this stack returned from the kernel (which unpoisoned its frames) but
   * not from fiber_main: clear what fiber_main and the switch left at the top. Clearing the
   * whole stack at every start would cost more than running the kernels. */
  size_t clear = f->stack_size < 16384 ? f->stack_size : 16384;
  __asan_unpoison_memory_region(f->stack_lo + f->stack_size - clear, clear);
#endif
  f->fake_stack = nullptr;
#ifdef CUEMU_ASM_SWITCH
  uintptr_t top = ((uintptr_t)f->stack_lo + f->stack_size) & ~(uintptr_t)15;
  void **sp = (void **)top;
  *--sp = nullptr;               /* fiber_main's return address: it never returns */
  *--sp = (void *)&fiber_main;   /* where cuemu_switch_ctx's ret goes */
  for (int i = 0; i < 6; i++) *--sp = nullptr; /* rbp rbx r12 r13 r14 r15 */
  f->sp = sp;
#else
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = f->stack_lo;
  f->uc.uc_stack.ss_size = f->stack_size;
  f->uc.uc_link = nullptr;
  makecontext(&f->uc, fiber_main_uc, 0);
#endif
}

void resume(Fiber *f) {
  S.cur = f;
  cur_thread = f->tid;
  f->state = RUNNING;
#ifdef CUEMU_ASAN
  __sanitizer_start_switch_fiber(&S.sched_fake, f->stack_lo, f->stack_size);
#endif
#ifdef CUEMU_ASM_SWITCH
  cuemu_switch_ctx(&S.sched_sp, f->sp);
#else
  swapcontext(&S.sched_uc, &f->uc);
#endif
#ifdef CUEMU_ASAN
  __sanitizer_finish_switch_fiber(S.sched_fake, nullptr, nullptr);
#endif
  S.cur = nullptr;
}

Fiber *running(const char *what) {
  if (!S.cur) die("%s called outside a kernel", what);
  return S.cur;
}

/* ---- deadlock report ----------------------------------------------------------------------- */
[[noreturn]] void deadlock() {
  int at_block = 0, at_warp = 0;
  for (int i = 0; i < S.n; i++) at_block += S.fibers[i].state == AT_BLOCK, at_warp += S.fibers[i].state == AT_WARP;
  char detail[512] = "";
  for (int w = 0; w < 32 && !detail[0]; w++)
    for (int g = 0; g < S.ngroups[w]; g++) {
      unsigned missing = S.groups[w][g].mask & ~S.groups[w][g].arrived;
      int lane = __builtin_ctz(missing), t = w * 32 + lane;
      const char *why = S.fibers[t].state == DONE       ? "has returned"
                        : S.fibers[t].state == AT_BLOCK ? "waits at __syncthreads"
                                                        : "waits at a warp operation with another mask";
      snprintf(detail, sizeof detail, "; warp %d waits (mask 0x%08x) for lane %d, which %s", w, S.groups[w][g].mask,
               lane, why);
      break;
    }
  die("deadlock: of %d threads, %d wait at __syncthreads, %d at a warp operation, %d have returned%s", S.n, at_block,
      at_warp, S.exited, detail);
}

/* CUEMU_ORDER=reverse resumes the fibers from the last thread to the first: a kernel whose
 * results change with the order has a race (a missing __syncthreads, say) */
bool reverse_order() {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("CUEMU_ORDER");
    if (e && strcmp(e, "reverse") && strcmp(e, "forward")) die("CUEMU_ORDER=%s: want forward or reverse", e);
    v = e && !strcmp(e, "reverse");
  }
  return v == 1;
}

void run_block() {
  int n = S.n;
  unsigned bx = S.block.x, by = S.block.y;
  for (int i = 0; i < n; i++) {
    Fiber *f = &S.fibers[i];
    f->tid = uint3{(unsigned)i % bx, ((unsigned)i / bx) % by, (unsigned)i / (bx * by)};
    f->lane = i & 31;
    f->warp = i >> 5;
    f->state = READY;
    fiber_start(f);
  }
  for (int w = 0; w < 32; w++) {
    int lanes = n - w * 32;
    S.warp_lanes[w] = lanes <= 0 ? 0u : lanes >= 32 ? 0xffffffffu : (1u << lanes) - 1u;
    S.ngroups[w] = 0;
  }
  S.block_arrived = S.exited = 0;
  bool rev = reverse_order();
  while (S.exited < n) {
    bool progress = false;
    for (int k = 0; k < n; k++) {
      int i = rev ? n - 1 - k : k;
      if (S.fibers[i].state == READY) {
        resume(&S.fibers[i]);
        progress = true;
      }
    }
    if (!progress && S.exited < n) deadlock();
  }
}

/* the static state the launch configuration has to satisfy */
std::map<const void *, int> func_max_dyn_smem;
std::set<cudaStream_t> live_streams;
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

std::mutex stream_mutex;

bool stream_ok(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> lock(stream_mutex);
  return live_streams.count(s) > 0;
}

alignas(256) unsigned char dyn_smem_buf[kSmemOptin];

} // namespace

/* ---- device-side entry points ---------------------------------------------------------------- */
void syncthreads(void) {
  Fiber *f = running("__syncthreads");
  f->state = AT_BLOCK;
  if (++S.block_arrived + S.exited == S.n) {
    for (int i = 0; i < S.n; i++)
      if (S.fibers[i].state == AT_BLOCK) S.fibers[i].state = READY;
    S.block_arrived = 0;
    f->state = RUNNING;
    return;
  }
  to_scheduler(f, false);
}

uint64_t warp_exchange(unsigned mask, uint64_t value, int src, int pred, unsigned *ballot) {
  Fiber *f = running("a warp operation");
  int w = f->warp, lane = f->lane;
  unsigned bit = 1u << lane;
  if (!(mask & bit)) die("thread %d calls a warp operation with mask 0x%08x, which leaves out its own lane %d", w * 32 + lane, mask, lane);
  if (mask & ~S.warp_lanes[w])
    die("warp %d: mask 0x%08x names lanes the block does not have (it has 0x%08x)", w, mask, S.warp_lanes[w]);
  WarpGroup *g = nullptr;
  for (int i = 0; i < S.ngroups[w]; i++) {
    WarpGroup *h = &S.groups[w][i];
    if (h->mask == mask) g = h;
    else if (h->mask & mask)
      die("warp %d: lanes wait at warp operations with overlapping masks 0x%08x and 0x%08x", w, h->mask, mask);
  }
  if (!g) {
    g = &S.groups[w][S.ngroups[w]++];
    g->mask = mask;
    g->arrived = 0;
  }
  f->w_mask = mask, f->w_value = value, f->w_src = src, f->w_pred = pred;
  f->state = AT_WARP;
  g->arrived |= bit;
  if (g->arrived == mask) {
    Fiber *base = &S.fibers[w * 32];
    unsigned b = 0;
    for (int l = 0; l < 32; l++)
      if ((mask >> l & 1u) && base[l].w_pred) b |= 1u << l;
    for (int l = 0; l < 32; l++) {
      if (!(mask >> l & 1u)) continue;
      Fiber *x = &base[l];
      int s = x->w_src;
      if (s >= 0 && !(mask >> s & 1u))
        die("warp %d: lane %d reads lane %d, which is not in the mask 0x%08x", w, l, s, mask);
      x->w_out = s >= 0 ? base[s].w_value : x->w_value;
      x->w_ballot = b;
      x->state = READY;
    }
    *g = S.groups[w][--S.ngroups[w]]; /* drop the group */
    f->state = RUNNING;
  } else {
    to_scheduler(f, false);
  }
  if (ballot) *ballot = f->w_ballot;
  return f->w_out;
}

void *dynamic_smem(void) { return dyn_smem_buf; }

void *warp_scratch(void) {
  alignas(64) static unsigned char scratch[32][4096];
  return scratch[running("a warp operation")->warp];
}

void trap(const char *what) {
  if (S.cur)
    die("%s (thread (%u, %u, %u))", what, S.cur->tid.x, S.cur->tid.y, S.cur->tid.z);
  die("%s", what);
}

namespace {
struct Grid {
  dim3 grid, block;
  size_t shmem;
  LaunchSite site;
  void (*body)(void *);
  void *ctx;
  void (*release)(void *);
};

void run_grid_now(void *g_) {
  Grid *g = (Grid *)g_;
  dim3 grid = g->grid, block = g->block;
  size_t shmem = g->shmem;
  std::lock_guard<std::recursive_mutex> lock(launch_mutex);
  S.in_launch = true;
  S.grid = grid, S.block = block, S.shmem = shmem, S.site = g->site, S.body = g->body, S.ctx = g->ctx;
  S.n = (int)((unsigned long long)block.x * block.y * block.z);
  ensure_fibers(S.n);
  cur_grid_dim = grid;
  cur_block_dim = block;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        cur_block = uint3{x, y, z};
        /* dynamic shared memory: garbage (0xff: NaN) up to shmem, unaddressable beyond */
#ifdef CUEMU_ASAN
        __asan_unpoison_memory_region(dyn_smem_buf, sizeof dyn_smem_buf);
#endif
        memset(dyn_smem_buf, 0xff, shmem);
#ifdef CUEMU_ASAN
        __asan_poison_memory_region(dyn_smem_buf + shmem, sizeof dyn_smem_buf - shmem);
#endif
        run_block();
      }
#ifdef CUEMU_ASAN
  __asan_unpoison_memory_region(dyn_smem_buf, sizeof dyn_smem_buf);
#endif
  S.in_launch = false;
  g->release(g->ctx);
  delete g;
}
} // namespace

void run_grid(const void *kernel, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, LaunchSite site,
              void (*body)(void *), void *ctx, void (*release)(void *)) {
  std::lock_guard<std::recursive_mutex> lock(launch_mutex);
  if (S.in_launch) die("a kernel launched a kernel at %s:%d: dynamic parallelism is not emulated", site.file, site.line);
  unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  cudaError_t e = cudaSuccess;
  auto it = func_max_dyn_smem.find(kernel);
  size_t limit = it != func_max_dyn_smem.end() && (size_t)it->second > kSmemDefault ? (size_t)it->second : kSmemDefault;
  if (block.x < 1 || block.y < 1 || block.z < 1 || block.x > kMaxBlockX || block.y > kMaxBlockY ||
      block.z > kMaxBlockZ || threads > kMaxThreads || grid.x < 1 || grid.y < 1 || grid.z < 1 ||
      grid.x > kMaxGridX || grid.y > kMaxGridYZ || grid.z > kMaxGridYZ)
    e = cudaErrorInvalidConfiguration;
  else if (shmem > limit) e = cudaErrorInvalidValue;
  else if (!stream_ok(stream)) e = cudaErrorInvalidResourceHandle;
  if (e != cudaSuccess) {
    record(e);
    release(ctx);
    return;
  }
  enqueue(stream, run_grid_now, new Grid{grid, block, shmem, site, body, ctx, release});
}

/* ---- deferred execution --------------------------------------------------------------------------
 * One queue per stream; the legacy default stream (0) waits for the blocking streams' earlier
 * work and they for its, so an op on one drains the others first; a non-blocking stream
 * (cudaStreamNonBlocking) is ordered with nothing else. */
namespace {
struct Op {
  void (*fn)(void *);
  void *ctx;
};
std::recursive_mutex queue_mutex;
std::map<cudaStream_t, std::deque<Op>> queues;
std::set<cudaStream_t> nonblocking;

cudaStream_t canon(cudaStream_t s) { return s == cudaStreamLegacy || s == cudaStreamPerThread ? nullptr : s; }

void drain_one(cudaStream_t s) {
  auto it = queues.find(s);
  if (it == queues.end()) return;
  while (!it->second.empty()) {
    Op op = it->second.front();
    it->second.pop_front();
    op.fn(op.ctx);
  }
}

void drain_blocking() {
  for (auto &q : queues)
    if (q.first && !nonblocking.count(q.first)) drain_one(q.first);
}
} // namespace

bool deferring() {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("CUEMU_DEFER");
    on = e && *e && strcmp(e, "0") != 0;
    if (on) atexit([] { drain_all(); }); /* what is left runs (and reports) at exit */
  }
  return on != 0;
}

void enqueue(cudaStream_t s, void (*op)(void *), void *ctx) {
  if (!deferring()) {
    op(ctx);
    return;
  }
  std::lock_guard<std::recursive_mutex> lock(queue_mutex);
  s = canon(s);
  if (!s) drain_blocking();
  else if (!nonblocking.count(s)) drain_one(nullptr);
  queues[s].push_back(Op{op, ctx});
}

void drain(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(queue_mutex);
  s = canon(s);
  if (!s) drain_blocking();
  else if (!nonblocking.count(s)) drain_one(nullptr);
  drain_one(s);
}

void drain_all() {
  std::lock_guard<std::recursive_mutex> lock(queue_mutex);
  for (auto &q : queues) drain_one(q.first);
}

void stream_flags(cudaStream_t s, unsigned flags) {
  std::lock_guard<std::recursive_mutex> lock(queue_mutex);
  if (flags & cudaStreamNonBlocking) nonblocking.insert(s);
  else nonblocking.erase(s);
}

void stream_gone(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(queue_mutex);
  drain_one(s);
  queues.erase(s);
  nonblocking.erase(s);
}

} // namespace cuemu

/* ---- the host API ------------------------------------------------------------------------------- */
using cuemu::record;

namespace {
std::map<uintptr_t, size_t> allocs; /* device allocations: start -> bytes */
std::map<uintptr_t, size_t> pinned; /* cudaMallocHost's: start -> bytes */
std::mutex alloc_mutex;

/* [p, p + n) inside one allocation of m */
bool inside(const std::map<uintptr_t, size_t> &m, const void *p, size_t n) {
  std::lock_guard<std::mutex> lock(alloc_mutex);
  uintptr_t a = (uintptr_t)p;
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  return a >= it->first && a - it->first <= it->second && n <= it->second - (a - it->first);
}
bool is_device(const void *p, size_t n) { return inside(allocs, p, n); }
bool is_pinned(const void *p, size_t n) { return inside(pinned, p, n); }

cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
  if (!dst || !src) return record(cudaErrorInvalidValue);
  bool ok;
  switch (kind) {
  case cudaMemcpyHostToHost: ok = true; break;
  case cudaMemcpyHostToDevice: ok = is_device(dst, n); break;
  case cudaMemcpyDeviceToHost: ok = is_device(src, n); break;
  case cudaMemcpyDeviceToDevice: ok = is_device(dst, n) && is_device(src, n); break;
  case cudaMemcpyDefault: ok = true; break;
  default: return record(cudaErrorInvalidMemcpyDirection);
  }
  return ok ? cudaSuccess : record(cudaErrorInvalidValue);
}

/* a copy that runs in its stream's order: its source is read when it runs, unless staged (a
 * pageable source, which CUDA copies to a staging buffer before the call returns) */
struct Copy {
  void *dst;
  const void *src;
  size_t n;
  std::vector<unsigned char> staged;
};
void run_copy(void *c_) {
  Copy *c = (Copy *)c_;
  memmove(c->dst, c->staged.empty() ? c->src : c->staged.data(), c->n);
  delete c;
}
struct Set {
  void *p;
  int value;
  size_t n;
};
void run_set(void *c_) {
  Set *c = (Set *)c_;
  memset(c->p, c->value, c->n);
  delete c;
}

/* cudaMemcpyAsync's semantics (and cudaMemcpy's on the legacy stream, sync: whether the host waits
 * for it): host to device from pageable memory is staged at the call; device to pageable host
 * memory, and any synchronous copy to the host, returns once done (after the stream's earlier
 * work); the others run in the stream's order. */
cudaError_t copy_on(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s, bool sync) {
  if (n == 0) return cudaSuccess;
  cudaError_t e = check_copy(dst, src, n, kind);
  if (e != cudaSuccess) return e;
  bool to_host = kind == cudaMemcpyDeviceToHost || (kind == cudaMemcpyDefault && !is_device(dst, n));
  bool from_host = kind == cudaMemcpyHostToDevice || (kind == cudaMemcpyDefault && !is_device(src, n));
  if (kind == cudaMemcpyHostToHost || (from_host && to_host)) {
    memmove(dst, src, n);
    return cudaSuccess;
  }
  if (to_host && (sync || !is_pinned(dst, n))) {
    cuemu::drain(s);
    memmove(dst, src, n);
    return cudaSuccess;
  }
  Copy *c = new Copy{dst, src, n, {}};
  if (from_host && !is_pinned(src, n)) c->staged.assign((const unsigned char *)src, (const unsigned char *)src + n);
  cuemu::enqueue(s, run_copy, c);
  return cudaSuccess;
}
} // namespace

extern "C" {

cudaError_t cudaMalloc(void **p, size_t size) {
  if (!p) return record(cudaErrorInvalidValue);
  *p = nullptr;
  if (size == 0) return cudaSuccess;
  void *m = nullptr;
  if (posix_memalign(&m, 256, size) != 0) return record(cudaErrorMemoryAllocation);
  memset(m, 0xff, size); /* cudaMalloc's memory is garbage: NaN, not zero */
  std::lock_guard<std::mutex> lock(alloc_mutex);
  allocs[(uintptr_t)m] = size;
  *p = m;
  return cudaSuccess;
}

/* cudaFree and cudaFreeHost wait for the device's work */
cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  cuemu::drain_all();
  std::lock_guard<std::mutex> lock(alloc_mutex);
  auto it = allocs.find((uintptr_t)p);
  if (it == allocs.end()) return record(cudaErrorInvalidValue);
  memset(p, 0xff, it->second);
  allocs.erase(it);
  free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t size) {
  if (!p) return record(cudaErrorInvalidValue);
  *p = malloc(size ? size : 1);
  if (!*p) return record(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(alloc_mutex);
  pinned[(uintptr_t)*p] = size ? size : 1;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
  if (!p) return cudaSuccess;
  cuemu::drain_all();
  std::lock_guard<std::mutex> lock(alloc_mutex);
  pinned.erase((uintptr_t)p);
  free(p);
  return cudaSuccess;
}

/* on the legacy default stream, which a cudaStreamNonBlocking stream does not wait for */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
  return copy_on(dst, src, n, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  if (!cuemu::stream_ok(s)) return record(cudaErrorInvalidResourceHandle);
  return copy_on(dst, src, n, kind, s, false);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t s) {
  if (!cuemu::stream_ok(s)) return record(cudaErrorInvalidResourceHandle);
  if (width > dpitch || width > spitch) return record(cudaErrorInvalidPitchValue);
  for (size_t r = 0; r < height; r++) {
    cudaError_t e = copy_on((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind, s, false);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

/* asynchronous with respect to the host, on the legacy default stream */
cudaError_t cudaMemset(void *p, int value, size_t n) { return cudaMemsetAsync(p, value, n, nullptr); }

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
  if (!cuemu::stream_ok(s)) return record(cudaErrorInvalidResourceHandle);
  if (n == 0) return cudaSuccess;
  if (!is_device(p, n)) return record(cudaErrorInvalidValue);
  cuemu::enqueue(s, run_set, new Set{p, value, n});
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  if (!s) return record(cudaErrorInvalidValue);
  *s = (cudaStream_t)malloc(1);
  {
    std::lock_guard<std::mutex> lock(cuemu::stream_mutex);
    cuemu::live_streams.insert(*s);
  }
  cuemu::stream_flags(*s, flags);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(cuemu::stream_mutex);
    if (!cuemu::live_streams.count(s)) return record(cudaErrorInvalidResourceHandle);
  }
  cuemu::stream_gone(s); /* its work still runs */
  std::lock_guard<std::mutex> lock(cuemu::stream_mutex);
  cuemu::live_streams.erase(s);
  free((void *)s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!cuemu::stream_ok(s)) return record(cudaErrorInvalidResourceHandle);
  cuemu::drain(s);
  return cudaSuccess;
}

/* the stream's work is done when asked (it runs now) */
cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }

cudaError_t cudaDeviceSynchronize(void) {
  cuemu::drain_all();
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = cuemu::last_error;
  cuemu::last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return cuemu::last_error; }

static const struct {
  cudaError_t e;
  const char *name, *text;
} error_table[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
};

const char *cudaGetErrorName(cudaError_t e) {
  for (const auto &x : error_table)
    if (x.e == e) return x.name;
  return "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t e) {
  for (const auto &x : error_table)
    if (x.e == e) return x.text;
  return "unrecognized error code";
}

cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return record(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev) {
  if (!dev) return record(cudaErrorInvalidValue);
  *dev = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : record(cudaErrorInvalidDevice); }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev) {
  if (!p) return record(cudaErrorInvalidValue);
  if (dev != 0) return record(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "cplan CUDA emulator (CPU fibers)");
  p->totalGlobalMem = (size_t)16 << 30;
  p->sharedMemPerBlock = cuemu::kSmemDefault;
  p->sharedMemPerBlockOptin = cuemu::kSmemOptin;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = (int)cuemu::kMaxThreads;
  p->maxThreadsDim[0] = (int)cuemu::kMaxBlockX, p->maxThreadsDim[1] = (int)cuemu::kMaxBlockY;
  p->maxThreadsDim[2] = (int)cuemu::kMaxBlockZ;
  p->maxGridSize[0] = (int)cuemu::kMaxGridX, p->maxGridSize[1] = p->maxGridSize[2] = (int)cuemu::kMaxGridYZ;
  p->major = 9, p->minor = 0;
  p->multiProcessorCount = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev) {
  if (!v) return record(cudaErrorInvalidValue);
  if (dev != 0) return record(cudaErrorInvalidDevice);
  switch (a) {
  case cudaDevAttrMaxThreadsPerBlock: *v = (int)cuemu::kMaxThreads; break;
  case cudaDevAttrWarpSize: *v = 32; break;
  case cudaDevAttrMultiProcessorCount: *v = 1; break;
  case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
  case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
  case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)cuemu::kSmemDefault; break;
  case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)cuemu::kSmemOptin; break;
  default: return record(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  if (!func) return record(cudaErrorInvalidDeviceFunction);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || (size_t)value > cuemu::kSmemOptin) return record(cudaErrorInvalidValue);
    cuemu::func_max_dyn_smem[func] = value;
  }
  return cudaSuccess;
}

} // extern "C"
