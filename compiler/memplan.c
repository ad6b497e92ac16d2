/* memplan.c: the memory planner. Buffers with known lifetimes get offsets in one arena by
 * greedy first-fit over sizes sorted largest first (the "greedy by size" heuristic TFLite and
 * MXNet use): a big buffer placed early leaves holes small ones fill. Quadratic in the number
 * of buffers, which is fine for the few thousand of an unrolled model. */
#include "memplan.h"

#include "cplan.h"

#include <stdlib.h>

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

static int by_offset(const void *x, const void *y) {
  int64_t a = sort_bufs[*(const int *)x].offset, b = sort_bufs[*(const int *)y].offset;
  return (a > b) - (a < b);
}

/* The lowest aligned offset where buffer b fits between the placed buffers that live at the
 * same time as it (conflicts, sorted by offset). */
static int64_t first_fit(const MpBuf *bufs, const int *conf, int nconf, int64_t size) {
  int64_t at = 0;
  for (int k = 0; k < nconf; k++) {
    const MpBuf *o = &bufs[conf[k]];
    if (o->offset >= at + size) break;
    int64_t end = align_up(o->offset + o->size);
    if (end > at) at = end;
  }
  return at;
}

int64_t mp_plan(MpBuf *bufs, int n) {
  int *order = cp_alloc(sizeof(int) * (size_t)(n + 1)), *placed = cp_alloc(sizeof(int) * (size_t)(n + 1));
  int *conf = cp_alloc(sizeof(int) * (size_t)(n + 1));
  int nplaced = 0;
  for (int i = 0; i < n; i++) order[i] = i;
  sort_bufs = bufs;
  qsort(order, (size_t)n, sizeof *order, by_size);
  int64_t arena = 0;
  for (int k = 0; k < n; k++) {
    MpBuf *b = &bufs[order[k]];
    cp_assert(b->first <= b->last && b->size >= 0);
    b->offset = 0;
    if (b->size == 0) continue;
    int nconf = 0;
    for (int j = 0; j < nplaced; j++)
      if (lives_overlap(b, &bufs[placed[j]])) conf[nconf++] = placed[j];
    qsort(conf, (size_t)nconf, sizeof *conf, by_offset);
    b->offset = first_fit(bufs, conf, nconf, b->size);
    placed[nplaced++] = order[k];
    if (align_up(b->offset + b->size) > arena) arena = align_up(b->offset + b->size);
  }
  return arena;
}

int mp_check(const MpBuf *bufs, int n, int64_t arena) {
  for (int i = 0; i < n; i++) {
    const MpBuf *a = &bufs[i];
    if (a->size == 0) continue;
    if (a->offset % MP_ALIGN || a->offset < 0 || a->offset + a->size > arena) return i;
    for (int j = 0; j < i; j++) {
      const MpBuf *b = &bufs[j];
      if (b->size == 0 || !lives_overlap(a, b)) continue;
      if (a->offset < b->offset + b->size && b->offset < a->offset + a->size) return i;
    }
  }
  return -1;
}
