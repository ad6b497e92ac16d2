/* memplan.c: the memory planner. Buffers with known lifetimes get offsets in one arena by
 * greedy first-fit over sizes sorted largest first (the "greedy by size" heuristic TFLite and
 * MXNet use): a big buffer placed early leaves holes small ones fill. Placing one walks the placed
 * buffers in offset order up to where it fits: quadratic at worst, a fraction of a second for the
 * tens of thousands of buffers of a 500-layer model. The check is a sweep, O(n log n). */
#include "memplan.h"

#include "cplan.h"

#include <stdlib.h>
#include <string.h>

static int64_t align_up(int64_t x) { return (x + MP_ALIGN - 1) / MP_ALIGN * MP_ALIGN; }

static bool lives_overlap(const MpBuf *a, const MpBuf *b) { return a->first <= b->last && b->first <= a->last; }

static const MpBuf *sort_bufs; /* qsort has no context argument */

/* Larger first; ties by the earlier start, then by index, so plans are deterministic. */
static int by_size(const void *x, const void *y) {
  int i = *(const int *)x, j = *(const int *)y;
  const MpBuf *a = &sort_bufs[i], *b = &sort_bufs[j];
  if (a->size != b->size) return a->size > b->size ? -1 : 1;
  if (a->first != b->first) return a->first < b->first ? -1 : 1;
  return (i > j) - (i < j);
}

int64_t mp_plan(MpBuf *bufs, int n) {
  int *order = cp_alloc(sizeof(int) * (size_t)(n + 1));
  int *next = cp_alloc(sizeof(int) * (size_t)(n + 1)), *prev = cp_alloc(sizeof(int) * (size_t)(n + 1));
  int head = -1, tail = -1; /* the placed buffers by offset, a doubly linked list */
  for (int i = 0; i < n; i++) order[i] = i;
  sort_bufs = bufs;
  qsort(order, (size_t)n, sizeof *order, by_size);
  int64_t arena = 0;
  for (int k = 0; k < n; k++) {
    int bi = order[k];
    MpBuf *b = &bufs[bi];
    cp_assert(b->first <= b->last && b->size >= 0);
    b->offset = 0;
    if (b->size == 0) continue;
    /* First fit: the lowest aligned offset where b fits between the placed buffers that live at
     * the same time as it, walked in offset order (those that do not are passed over). */
    int64_t at = 0;
    int j = head;
    for (; j >= 0; j = next[j]) {
      const MpBuf *o = &bufs[j];
      if (!lives_overlap(b, o)) continue;
      if (o->offset >= at + b->size) break;
      int64_t end = align_up(o->offset + o->size);
      if (end > at) at = end;
    }
    b->offset = at;
    /* Into the list after the last buffer at or below `at`: it is before j (j's offset is past at) */
    int after = j >= 0 ? prev[j] : tail;
    while (after >= 0 && bufs[after].offset > at) after = prev[after];
    int before = after >= 0 ? next[after] : head;
    prev[bi] = after, next[bi] = before;
    if (after >= 0) next[after] = bi;
    else head = bi;
    if (before >= 0) prev[before] = bi;
    else tail = bi;
    if (align_up(b->offset + b->size) > arena) arena = align_up(b->offset + b->size);
  }
  return arena;
}

static int by_first(const void *x, const void *y) {
  const MpBuf *a = &sort_bufs[*(const int *)x], *b = &sort_bufs[*(const int *)y];
  return (a->first > b->first) - (a->first < b->first);
}

static int by_last(const void *x, const void *y) {
  const MpBuf *a = &sort_bufs[*(const int *)x], *b = &sort_bufs[*(const int *)y];
  return (a->last > b->last) - (a->last < b->last);
}

/* The index in act (n buffers sorted by offset) of the first whose offset is at least off. */
static int lower_bound(const MpBuf *bufs, const int *act, int n, int64_t off) {
  int lo = 0, hi = n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (bufs[act[mid]].offset < off) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* A sweep over time: when a buffer starts, those alive (act, by offset) are disjoint in memory if
 * the plan is sound so far, so it overlaps one of them exactly when it overlaps a neighbour. */
int mp_check(const MpBuf *bufs, int n, int64_t arena) {
  int *start = cp_alloc(sizeof(int) * (size_t)(n + 1)), *stop = cp_alloc(sizeof(int) * (size_t)(n + 1));
  int *act = cp_alloc(sizeof(int) * (size_t)(n + 1));
  int m = 0, nact = 0;
  for (int i = 0; i < n; i++) {
    const MpBuf *a = &bufs[i];
    if (a->size == 0) continue;
    if (a->offset % MP_ALIGN || a->offset < 0 || a->offset + a->size > arena) return i;
    start[m] = stop[m] = i, m++;
  }
  sort_bufs = bufs;
  qsort(start, (size_t)m, sizeof *start, by_first);
  qsort(stop, (size_t)m, sizeof *stop, by_last);
  for (int k = 0, e = 0; k < m; k++) {
    const MpBuf *a = &bufs[start[k]];
    for (; e < m && bufs[stop[e]].last < a->first; e++) { /* gone before a starts */
      int at = lower_bound(bufs, act, nact, bufs[stop[e]].offset);
      cp_assert(at < nact && act[at] == stop[e]); /* offsets of live buffers are distinct */
      memmove(act + at, act + at + 1, sizeof *act * (size_t)(nact - at - 1));
      nact--;
    }
    int at = lower_bound(bufs, act, nact, a->offset);
    int bad = -1; /* the later of the two, as the pairwise check named it */
    if (at < nact && bufs[act[at]].offset < a->offset + a->size) bad = act[at];
    else if (at > 0 && bufs[act[at - 1]].offset + bufs[act[at - 1]].size > a->offset) bad = act[at - 1];
    if (bad >= 0) return bad > start[k] ? bad : start[k];
    memmove(act + at + 1, act + at, sizeof *act * (size_t)(nact - at));
    act[at] = start[k], nact++;
  }
  return -1;
}
