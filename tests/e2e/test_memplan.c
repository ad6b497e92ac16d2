/* test_memplan.c: the memory planner (compiler/memplan.c) on random lifetimes: plans must be
 * sound (mp_check), aligned, reuse memory where lifetimes allow, and never exceed the sum of
 * the sizes. */
#include "memplan.h"

#include "cplan.h"

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

int main(void) {
  test_chain();
  test_random();
  test_check_catches();
  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  else printf("memplan: ok\n");
  return failures != 0;
}
