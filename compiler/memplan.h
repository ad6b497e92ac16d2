/* memplan.h: memory planning (DESIGN.md §6): every buffer of a phase gets an offset in one
 * arena so that buffers alive at the same time never overlap. */
#ifndef CPLAN_MEMPLAN_H
#define CPLAN_MEMPLAN_H

#include <stdint.h>

#define MP_ALIGN 64 /* bytes: every offset is a multiple (cache line, AVX-512 loads) */

/* One buffer: alive from the step that writes it (first) to the last step that reads it
 * (last), both inclusive, in the execution order of the schedule being planned. */
typedef struct MpBuf {
  int64_t size;   /* bytes (0: needs no space, gets offset 0) */
  int first, last;
  int64_t offset; /* out: bytes from the arena's start, MP_ALIGN-aligned */
} MpBuf;

/* Assigns every buffer an offset (greedy first-fit, largest first) and returns the arena size
 * needed: the end of the highest buffer, rounded up to MP_ALIGN. */
int64_t mp_plan(MpBuf *bufs, int n);

/* Checks a plan: offsets aligned, and no two buffers with overlapping lifetimes overlap in
 * memory. Returns the index of a bad buffer, or -1 when the plan is sound (tests use it). */
int mp_check(const MpBuf *bufs, int n, int64_t arena);

#endif
