/* memplan.c: the memory planner. Buffers with known lifetimes get offsets in one arena by
 * greedy first-fit over sizes sorted largest first (the "greedy by size" heuristic TFLite and
 * MXNet use): a big buffer placed early leaves holes small ones fill. The placed buffers are filed
 * by lifetime in a segment tree whose nodes keep the merged byte ranges of theirs, so placing one
 * raises its offset past the ranges of O(log n) sets instead of walking every placed buffer that
 * lives at the same time (most of them, in a training step: saved activations live from the
 * forward pass to the backward): a 300-layer model's 70000 buffers in 0.2 s instead of 8 s. The
 * check is a sweep, O(n log n). */
#include "memplan.h"

#include "cplan.h"

#include <stdlib.h>
#include <string.h>

static int64_t align_up(int64_t x) { return (x + MP_ALIGN - 1) / MP_ALIGN * MP_ALIGN; }

static const MpBuf *sort_bufs; /* qsort has no context argument */

/* Larger first; ties by the earlier start, then by index, so plans are deterministic. */
static int by_size(const void *x, const void *y) {
  int i = *(const int *)x, j = *(const int *)y;
  const MpBuf *a = &sort_bufs[i], *b = &sort_bufs[j];
  if (a->size != b->size) return a->size > b->size ? -1 : 1;
  if (a->first != b->first) return a->first < b->first ? -1 : 1;
  return (i > j) - (i < j);
}

/* A set of byte ranges [lo, hi) of the arena, kept merged: sorted, disjoint and not touching. */
typedef struct Spans {
  int64_t *lo, *hi;
  int n, cap;
} Spans;

/* The index of the first span that ends past x (n: none), searching from `from`. */
static int spans_after(const Spans *s, int from, int64_t x) {
  int lo = from, hi = s->n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (s->hi[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static void spans_add(Spans *s, int64_t lo, int64_t hi) {
  int i = spans_after(s, 0, lo - 1), j; /* spans i..j-1 overlap or touch [lo, hi): they merge into one */
  for (j = i; j < s->n && s->lo[j] <= hi; j++) {
    if (s->lo[j] < lo) lo = s->lo[j];
    if (s->hi[j] > hi) hi = s->hi[j];
  }
  if (j == i) { /* a new span at i */
    if (s->n == s->cap) {
      s->cap = s->cap ? 2 * s->cap : 4;
      s->lo = realloc(s->lo, sizeof *s->lo * (size_t)s->cap), s->hi = realloc(s->hi, sizeof *s->hi * (size_t)s->cap);
      if (!s->lo || !s->hi) cp_panic(__FILE__, __LINE__, "out of memory");
    }
    memmove(s->lo + i + 1, s->lo + i, sizeof *s->lo * (size_t)(s->n - i));
    memmove(s->hi + i + 1, s->hi + i, sizeof *s->hi * (size_t)(s->n - i));
    s->n++;
  } else if (j > i + 1) { /* spans i+1..j-1 go */
    memmove(s->lo + i + 1, s->lo + j, sizeof *s->lo * (size_t)(s->n - j));
    memmove(s->hi + i + 1, s->hi + j, sizeof *s->hi * (size_t)(s->n - j));
    s->n -= j - i - 1;
  }
  s->lo[i] = lo, s->hi[i] = hi;
}

/* The placed buffers, indexed by lifetime: a segment tree over the steps (renumbered to the
 * distinct ends of lifetimes) where a buffer is filed under the O(log) nodes whose ranges tile its
 * lifetime. Each node keeps the union of the bytes of the buffers filed at it (own) and of those
 * filed at it or below it (sub). The buffers whose lifetimes meet [f, l] are exactly those filed
 * at a node tiling [f, l] or below one (its sub), or at a node above one (its own). */
typedef struct Tree {
  Spans *own, *sub;
  int size; /* leaves: the renumbered steps */
  const Spans **q; /* a query's sets */
  int nq;
} Tree;

static void tree_add(Tree *t, int node, int nlo, int nhi, int f, int l, int64_t lo, int64_t hi) {
  spans_add(&t->sub[node], lo, hi);
  if (f <= nlo && nhi <= l) {
    spans_add(&t->own[node], lo, hi);
    return;
  }
  int mid = nlo + (nhi - nlo) / 2;
  if (f <= mid) tree_add(t, 2 * node, nlo, mid, f, l, lo, hi);
  if (l > mid) tree_add(t, 2 * node + 1, mid + 1, nhi, f, l, lo, hi);
}

static void tree_query(Tree *t, int node, int nlo, int nhi, int f, int l) {
  if (f <= nlo && nhi <= l) {
    if (t->sub[node].n) t->q[t->nq++] = &t->sub[node];
    return;
  }
  if (t->own[node].n) t->q[t->nq++] = &t->own[node];
  int mid = nlo + (nhi - nlo) / 2;
  if (f <= mid) tree_query(t, 2 * node, nlo, mid, f, l);
  if (l > mid) tree_query(t, 2 * node + 1, mid + 1, nhi, f, l);
}

static int cmp_int(const void *x, const void *y) { return (*(const int *)x > *(const int *)y) - (*(const int *)x < *(const int *)y); }

/* The index in v (sorted, distinct) of x. */
static int rank_of(const int *v, int n, int x) {
  int lo = 0, hi = n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (v[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

int64_t mp_plan(MpBuf *bufs, int n) {
  int *order = cp_alloc(sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) order[i] = i;
  sort_bufs = bufs;
  qsort(order, (size_t)n, sizeof *order, by_size);
  /* Steps renumbered to the distinct firsts and lasts: the order of ends, so which lifetimes meet,
   * stays as it was */
  int *steps = cp_alloc(sizeof(int) * (size_t)(2 * n + 1)), ns = 0;
  for (int i = 0; i < n; i++) {
    cp_assert(bufs[i].first <= bufs[i].last && bufs[i].size >= 0);
    steps[ns++] = bufs[i].first, steps[ns++] = bufs[i].last;
  }
  qsort(steps, (size_t)ns, sizeof *steps, cmp_int);
  int nd = 0;
  for (int k = 0; k < ns; k++)
    if (!nd || steps[k] != steps[nd - 1]) steps[nd++] = steps[k];
  Tree t = {.size = nd > 0 ? nd : 1};
  int depth = 1;
  while ((1 << (depth - 1)) < t.size) depth++;
  t.own = calloc((size_t)4 * (size_t)t.size, sizeof *t.own), t.sub = calloc((size_t)4 * (size_t)t.size, sizeof *t.sub);
  t.q = malloc(sizeof *t.q * (size_t)(4 * depth + 4));
  if (!t.own || !t.sub || !t.q) cp_panic(__FILE__, __LINE__, "out of memory");
  int *cur = malloc(sizeof *cur * (size_t)(4 * depth + 4));
  if (!cur) cp_panic(__FILE__, __LINE__, "out of memory");
  int64_t arena = 0;
  for (int k = 0; k < n; k++) {
    MpBuf *b = &bufs[order[k]];
    b->offset = 0;
    if (b->size == 0) continue;
    int f = rank_of(steps, nd, b->first), l = rank_of(steps, nd, b->last);
    /* First fit: the lowest aligned offset where b misses the bytes of every placed buffer that
     * lives at the same time as it. Raise `at` past any span (of any set) it meets, until none
     * does; offsets only grow, so each set is searched from where it was left. */
    t.nq = 0;
    tree_query(&t, 1, 0, t.size - 1, f, l);
    for (int s = 0; s < t.nq; s++) cur[s] = 0;
    int64_t at = 0;
    for (int clean = 0, s = 0; clean < t.nq;) { /* clean: sets in a row that b misses at `at` */
      const Spans *sp = t.q[s];
      int i = cur[s] = spans_after(sp, cur[s], at);
      if (i < sp->n && sp->lo[i] < at + b->size) at = sp->hi[i], clean = 0;
      else clean++, s = s + 1 == t.nq ? 0 : s + 1;
    }
    b->offset = at;
    int64_t end = align_up(at + b->size); /* its span: no aligned offset lies in between */
    tree_add(&t, 1, 0, t.size - 1, f, l, at, end);
    if (end > arena) arena = end;
  }
  for (int i = 0; i < 4 * t.size; i++) free(t.own[i].lo), free(t.own[i].hi), free(t.sub[i].lo), free(t.sub[i].hi);
  free(t.own), free(t.sub), free(t.q), free(cur);
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
