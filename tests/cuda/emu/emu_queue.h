/* emu_queue.h: the emulator's stream queues (emu_runtime.cpp), for the device side (cuda_emu.h)
 * and the emulated runtime (emu_cuda_rt.cpp).
 *
 * Deferred execution (CUEMU_DEFER=1): the work of a stream (launches, async copies and memsets, the
 * GEMMs and NCCL calls of emu_cuda_rt.cpp) is queued and runs only when the host synchronizes with
 * that stream (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a copy to
 * pageable host memory, cudaFree, exit), so a host that reads a result, or reuses a buffer, before
 * the synchronization CUDA requires sees what a GPU may show it. The legacy default stream and the
 * blocking streams wait for each other; a cudaStreamNonBlocking stream for nothing else. Without
 * CUEMU_DEFER, op runs at once. */
#ifndef CUEMU_QUEUE_H
#define CUEMU_QUEUE_H
#include <cuda_runtime_api.h>

namespace cuemu {
bool deferring();
void enqueue(cudaStream_t s, void (*op)(void *), void *ctx); /* op(ctx) in s's order */
void drain(cudaStream_t s);                                  /* runs s's queued work (and what it waits for) */
void drain_all();
void stream_flags(cudaStream_t s, unsigned flags); /* cudaStreamNonBlocking or not */
void stream_gone(cudaStream_t s);                  /* runs its work, forgets it */
} // namespace cuemu
#endif
