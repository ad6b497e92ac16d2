/* test_comm.c: every rt_comm collective on 4 ranks (started by mpirun from ctest) against
 * results computed by hand, the mesh-axis groups of a 2 x 2 mesh, and (with --dead-peer) the
 * watchdog: rank 3 never joins a barrier, so the others must stop the job with a message that
 * names the rank and the collective instead of hanging. */
#include "cplanrt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;
static int me;

#define CHECK(cond, ...)                                                                         \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "rank %d: FAILED %s:%d: ", me, __FILE__, __LINE__);                        \
      fprintf(stderr, __VA_ARGS__);                                                              \
      fputc('\n', stderr);                                                                       \
      failures++;                                                                                \
    }                                                                                            \
  } while (0)

enum { N = 5 }; /* elements per rank or block */

static void test_all_reduce(RtComm *w, int r, int size) {
  float f[N];
  double d[N];
  for (int i = 0; i < N; i++) f[i] = (float)(r + 1 + i), d[i] = 0.5 * (r + 1) + i;
  rt_comm_all_reduce(w, f, N, RT_COMM_F32);
  rt_comm_all_reduce(w, d, N, RT_COMM_F64);
  double rsum = size * (size + 1) / 2.0;
  for (int i = 0; i < N; i++) {
    CHECK(f[i] == (float)(rsum + size * i), "all_reduce f32[%d] = %g, want %g", i, f[i], rsum + size * i);
    CHECK(d[i] == 0.5 * rsum + size * i, "all_reduce f64[%d] = %g", i, d[i]);
  }
}

static void test_reduce_scatter(RtComm *w, int r, int size) {
  float send[4 * N], recv[N];
  for (int j = 0; j < size * N; j++) send[j] = (float)(r * 100 + j);
  rt_comm_reduce_scatter(w, send, recv, N, RT_COMM_F32);
  for (int k = 0; k < N; k++) {
    float want = (float)(100 * size * (size - 1) / 2 + size * (r * N + k));
    CHECK(recv[k] == want, "reduce_scatter[%d] = %g, want %g", k, recv[k], want);
  }
}

static void test_all_gather(RtComm *w, int r, int size) {
  double send[N], recv[4 * N];
  for (int k = 0; k < N; k++) send[k] = r * 10 + k;
  rt_comm_all_gather(w, send, recv, N, RT_COMM_F64);
  for (int q = 0; q < size; q++)
    for (int k = 0; k < N; k++)
      CHECK(recv[q * N + k] == q * 10 + k, "all_gather[%d] = %g", q * N + k, recv[q * N + k]);
}

static void test_all_to_all(RtComm *w, int r, int size) {
  int64_t send[4 * N], recv[4 * N];
  for (int j = 0; j < size; j++)
    for (int k = 0; k < N; k++) send[j * N + k] = r * 100 + j * 10 + k;
  rt_comm_all_to_all(w, send, recv, N, RT_COMM_I64);
  for (int i = 0; i < size; i++)
    for (int k = 0; k < N; k++)
      CHECK(recv[i * N + k] == i * 100 + r * 10 + k, "all_to_all[%d] = %lld", i * N + k,
            (long long)recv[i * N + k]);
}

static void test_broadcast_p2p(RtComm *w, int r, int size) {
  float b[N];
  for (int k = 0; k < N; k++) b[k] = r == 2 ? 7.5f + (float)k : -1;
  rt_comm_broadcast(w, b, N, RT_COMM_F32, 2);
  for (int k = 0; k < N; k++) CHECK(b[k] == 7.5f + (float)k, "broadcast[%d] = %g", k, b[k]);
  /* a ring: even ranks send first, odd ranks receive first */
  uint8_t out[N], in[N] = {0};
  for (int k = 0; k < N; k++) out[k] = (uint8_t)(r * 16 + k);
  int next = (r + 1) % size, prev = (r + size - 1) % size;
  if (r % 2 == 0) rt_comm_send(w, out, N, RT_COMM_U8, next, 7), rt_comm_recv(w, in, N, RT_COMM_U8, prev, 7);
  else rt_comm_recv(w, in, N, RT_COMM_U8, prev, 7), rt_comm_send(w, out, N, RT_COMM_U8, next, 7);
  for (int k = 0; k < N; k++) CHECK(in[k] == prev * 16 + k, "recv[%d] = %d from %d", k, in[k], prev);
  rt_comm_barrier(w);
}

/* Mesh [a = 2, b = 2]: rank r has coordinates (r / 2, r % 2). */
static void test_groups(RtComm *w, int r) {
  const int64_t sizes[2] = {2, 2};
  const char *const names[2] = {"a", "b"};
  RtComm *g[2];
  rt_comm_split_axes(w, sizes, names, 2, g);
  CHECK(rt_comm_size(g[0]) == 2 && rt_comm_size(g[1]) == 2, "group sizes %d %d", rt_comm_size(g[0]),
        rt_comm_size(g[1]));
  CHECK(rt_comm_rank(g[0]) == r / 2 && rt_comm_rank(g[1]) == r % 2, "group ranks %d %d",
        rt_comm_rank(g[0]), rt_comm_rank(g[1]));
  CHECK(!strcmp(rt_comm_name(g[0]), "axis a"), "group name '%s'", rt_comm_name(g[0]));
  double x[2] = {r, r};
  rt_comm_all_reduce(g[0], &x[0], 1, RT_COMM_F64); /* ranks {r%2, r%2 + 2} */
  rt_comm_all_reduce(g[1], &x[1], 1, RT_COMM_F64); /* ranks {2(r/2), 2(r/2) + 1} */
  CHECK(x[0] == 2 * (r % 2) + 2, "axis a sum %g", x[0]);
  CHECK(x[1] == 4 * (r / 2) + 1, "axis b sum %g", x[1]);
  CHECK(rt_comm_bytes(g[0]) == 8, "axis a bytes %llu", (unsigned long long)rt_comm_bytes(g[0]));
  rt_comm_free(g[0]);
  rt_comm_free(g[1]);
}

int main(int argc, char **argv) {
  RtComm *w = rt_comm_init(&argc, &argv);
  int r = me = rt_comm_rank(w), size = rt_comm_size(w);
  if (size != 4) {
    fprintf(stderr, "test_comm: run me with mpirun -np 4 (got %d ranks)\n", size);
    return 1;
  }
  if (argc > 1 && !strcmp(argv[1], "--dead-peer")) {
    if (r == 3) sleep(60); /* the dead peer: the others' barrier must time out */
    rt_comm_barrier(w);
    fprintf(stderr, "rank %d: FAILED: the barrier returned without rank 3\n", r);
    return 1;
  }
  test_all_reduce(w, r, size);
  test_reduce_scatter(w, r, size);
  test_all_gather(w, r, size);
  test_all_to_all(w, r, size);
  test_broadcast_p2p(w, r, size);
  test_groups(w, r);
  int bad = failures;
  rt_comm_all_reduce(w, &bad, 0, RT_COMM_F32); /* a zero-count call must work too */
  double total = failures;
  rt_comm_all_reduce(w, &total, 1, RT_COMM_F64);
  if (r == 0) printf(total == 0 ? "ok\n" : "FAILED: %g checks\n", total);
  rt_comm_finalize(w);
  return total == 0 ? 0 : 1;
}
