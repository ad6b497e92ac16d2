/* test_memplan.c: the memory planner (compiler/memplan.c) on random lifetimes: plans must be
 * sound (mp_check), aligned, reuse memory where lifetimes allow, and never exceed the sum of
 * the sizes. */
#include "memplan.h"

#include "cplan.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static int failures;

#define CHECK(c, ...)                                   \
  do {                                                  \
    if (!(c)) {                                         \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                     \
      fputc('\n', stderr);                              \
      failures++;                                       \
    }                                                   \
  } while (0)

/* A chain: buffer i lives [i, i+1]. Two buffers at a time, so the arena holds the two largest. */
static void test_chain(void) {
  MpBuf b[10];
  for (int i = 0; i < 10; i++) b[i] = (MpBuf){.size = 1000, .first = i, .last = i + 1};
  int64_t arena = mp_plan(b, 10);
  CHECK(mp_check(b, 10, arena) < 0, "chain plan unsound");
  CHECK(arena == 2 * 1024, "chain arena %lld, expected 2048", (long long)arena);
}

static void test_random(void) {
  srand(12345);
  for (int round = 0; round < 200; round++) {
    int n = 1 + rand() % 60;
    MpBuf *b = cp_alloc(sizeof(MpBuf) * (size_t)n);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
      int first = rand() % 50;
      b[i] = (MpBuf){.size = rand() % 5 == 0 ? 0 : 1 + rand() % 5000, .first = first, .last = first + rand() % 20};
      total += (b[i].size + MP_ALIGN - 1) / MP_ALIGN * MP_ALIGN;
    }
    int64_t arena = mp_plan(b, n);
    CHECK(mp_check(b, n, arena) < 0, "round %d: buffer %d overlaps another live one", round, mp_check(b, n, arena));
    CHECK(arena <= total, "round %d: arena %lld above the sum %lld", round, (long long)arena, (long long)total);
    for (int i = 0; i < n; i++) CHECK(b[i].offset % MP_ALIGN == 0, "round %d: unaligned offset", round);
  }
}

/* mp_check must catch an overlap (so the tests above can fail). */
static void test_check_catches(void) {
  MpBuf b[2] = {{.size = 100, .first = 0, .last = 3, .offset = 0}, {.size = 100, .first = 2, .last = 4, .offset = 64}};
  CHECK(mp_check(b, 2, 256) == 1, "overlap not detected");
  b[1].offset = 128;
  CHECK(mp_check(b, 2, 256) < 0, "a sound plan rejected");
}

/* The pairwise definitions mp_plan and mp_check must agree with: first fit, largest first (ties
 * by start, then index), over the conflicting placed buffers in offset order; and the
 * index of the later buffer of the first overlapping pair (-1: none). */
static int64_t up(int64_t x) { return (x + MP_ALIGN - 1) / MP_ALIGN * MP_ALIGN; }
static bool live(const MpBuf *a, const MpBuf *b) { return a->first <= b->last && b->first <= a->last; }

static int64_t ref_plan(MpBuf *b, int n) {
  int *placed = cp_alloc(sizeof(int) * (size_t)(n + 1)), np = 0;
  bool *done = cp_alloc(sizeof(bool) * (size_t)(n + 1));
  int64_t arena = 0;
  for (int it = 0; it < n; it++) {
    int x = -1; /* the next: largest, then earliest start, then lowest index */
    for (int i = 0; i < n; i++)
      if (!done[i] && (x < 0 || b[i].size > b[x].size || (b[i].size == b[x].size && b[i].first < b[x].first))) x = i;
    done[x] = true, b[x].offset = 0;
    if (!b[x].size) continue;
    for (int64_t at = 0;;) { /* raise at past every conflict it overlaps, until none does */
      bool moved = false;
      for (int k = 0; k < np; k++) {
        const MpBuf *o = &b[placed[k]];
        if (live(o, &b[x]) && o->offset < at + b[x].size && at < o->offset + o->size) {
          at = up(o->offset + o->size), moved = true;
        }
      }
      if (!moved) {
        b[x].offset = at;
        break;
      }
    }
    placed[np++] = x;
    if (up(b[x].offset + b[x].size) > arena) arena = up(b[x].offset + b[x].size);
  }
  return arena;
}

static bool ref_sound(const MpBuf *b, int n) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++)
      if (b[i].size && b[j].size && live(&b[i], &b[j]) && b[i].offset < b[j].offset + b[j].size &&
          b[j].offset < b[i].offset + b[i].size)
        return false;
  return true;
}

/* mp_plan gives the reference's offsets; mp_check agrees with the pairwise check on random plans,
 * most of them unsound. */
static void test_against_reference(void) {
  srand(777);
  for (int round = 0; round < 300; round++) {
    int n = 1 + rand() % 80;
    MpBuf *b = cp_alloc(sizeof(MpBuf) * (size_t)n), *r = cp_alloc(sizeof(MpBuf) * (size_t)n);
    for (int i = 0; i < n; i++) {
      int first = rand() % 40;
      b[i] = (MpBuf){.size = rand() % 6 == 0 ? 0 : 64 * (1 + rand() % 8) - rand() % 3, .first = first,
                     .last = first + rand() % 15};
      r[i] = b[i];
    }
    int64_t arena = mp_plan(b, n), rarena = ref_plan(r, n);
    CHECK(arena == rarena, "round %d: arena %lld, the reference's %lld", round, (long long)arena, (long long)rarena);
    for (int i = 0; i < n; i++)
      CHECK(b[i].offset == r[i].offset, "round %d: buffer %d at %lld, the reference's %lld", round, i,
            (long long)b[i].offset, (long long)r[i].offset);
    for (int i = 0; i < n; i++) b[i].offset = 64 * (rand() % 6); /* a random plan */
    bool sound = ref_sound(b, n);
    int bad = mp_check(b, n, 64 * 20);
    CHECK(sound == (bad < 0), "round %d: mp_check says %d, the pairwise check %s", round, bad, sound ? "sound" : "unsound");
  }
}

/* A bigger case, shaped like a training step's: activations that live from the forward pass to
 * the backward, temporaries of a step or a few, sizes from a few shapes (many ties) and some odd
 * ones; mp_plan must still give the reference's offsets. */
static void test_big_against_reference(void) {
  srand(4242);
  for (int round = 0; round < 3; round++) {
    int n = 2500 + round * 500, steps = 4 * n;
    MpBuf *b = cp_alloc(sizeof(MpBuf) * (size_t)n), *r = cp_alloc(sizeof(MpBuf) * (size_t)n);
    for (int i = 0; i < n; i++) {
      int kind = rand() % 4, first = rand() % steps, last;
      if (kind == 0) last = steps - 1 - first / 2 - rand() % 50; /* saved for the backward pass */
      else if (kind == 1) last = first + rand() % (steps / 10);
      else last = first + rand() % 4;
      if (last < first) last = first;
      int64_t size = rand() % 3 == 0 ? 64 * (1 + rand() % 200) - rand() % 64 : (int64_t)4096 << (rand() % 4);
      if (rand() % 20 == 0) size = 0;
      b[i] = r[i] = (MpBuf){.size = size, .first = first, .last = last};
    }
    int64_t arena = mp_plan(b, n), rarena = ref_plan(r, n);
    CHECK(arena == rarena, "big round %d: arena %lld, the reference's %lld", round, (long long)arena, (long long)rarena);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += b[i].offset != r[i].offset;
    CHECK(bad == 0, "big round %d: %d of %d buffers away from the reference's offsets", round, bad, n);
    CHECK(mp_check(b, n, arena) < 0, "big round %d: plan unsound", round);
  }
}

int main(void) {
  test_chain();
  test_random();
  test_check_catches();
  test_against_reference();
  test_big_against_reference();
  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  else printf("memplan: ok\n");
  return failures != 0;
}
