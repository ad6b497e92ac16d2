/* test_nvrtc_cache.c: rt_nvrtc_compile and its on-disk cache (ctest cuda.nvrtc_cache; NVRTC needs
 * no GPU). In a fresh CPLAN_NVRTC_CACHE: a first compile misses and writes a cubin (ELF), a second
 * hits and gives the same bytes; another architecture or source misses; a damaged cache file is
 * compiled again; a source with an error gives NVRTC's message, not a crash; an unusable cache
 * directory still compiles. Also rt_cuda_init: with no GPU, the "no CUDA device found" error. */
#include "cplanrt_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      printf("FAILED: %s:%d: ", __FILE__, __LINE__);                                               \
      printf(__VA_ARGS__);                                                                         \
      printf("\n");                                                                                \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

static const char *src_a = "extern \"C\" __global__ void scale2(float *x, int n) {\n"
                           "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                           "  if (i < n) x[i] *= 2.0f;\n}\n";
static const char *src_b = "#include <cuda_bf16.h>\n"
                           "extern \"C\" __global__ void to_bf16(__nv_bfloat16 *y, const float *x, int n) {\n"
                           "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                           "  if (i < n) y[i] = __float2bfloat16_rn(x[i]);\n}\n";

static int compile(const char *src, int major, int minor, RtNvrtcImage *img, RtError *err) {
  memset(err, 0, sizeof *err);
  return rt_nvrtc_compile(src, "test.cu", major, minor, NULL, 0, img, err);
}

int main(void) {
  char dir[] = "/tmp/cplan_nvrtc_cache.XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  setenv("CPLAN_NVRTC_CACHE", dir, 1);
  RtError err;
  RtNvrtcImage a1, a2, a3, b1, bad;

  CHECK(compile(src_a, 9, 0, &a1, &err) == 0, "compile a for sm_90: %s", err.msg);
  CHECK(!a1.cache_hit && a1.size > 4 && memcmp(a1.data, "\x7f" "ELF", 4) == 0, "a first compile: a fresh ELF cubin");
  CHECK(access(a1.path, R_OK) == 0, "cache file %s written", a1.path);
  CHECK(compile(src_a, 9, 0, &a2, &err) == 0 && a2.cache_hit, "a second compile hits the cache: %s", err.msg);
  CHECK(a2.size == a1.size && memcmp(a1.data, a2.data, a1.size) == 0, "the cached image is the compiled one");
  CHECK(compile(src_a, 8, 0, &a3, &err) == 0 && !a3.cache_hit, "sm_80 misses: %s", err.msg);
  CHECK(strcmp(a3.path, a1.path) != 0, "another architecture, another file");
  CHECK(compile(src_b, 9, 0, &b1, &err) == 0 && !b1.cache_hit, "another source misses (and bf16 compiles): %s", err.msg);

  /* damage the cache file: flip a byte of the cubin */
  FILE *f = fopen(a1.path, "r+b");
  CHECK(f != NULL, "open %s", a1.path);
  if (f) {
    fseek(f, 100, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 100, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
  }
  rt_nvrtc_image_free(&a2);
  CHECK(compile(src_a, 9, 0, &a2, &err) == 0 && !a2.cache_hit, "a damaged file is compiled again: %s", err.msg);
  CHECK(a2.size == a1.size && memcmp(a1.data, a2.data, a1.size) == 0, "and gives the same image");
  rt_nvrtc_image_free(&a2);
  CHECK(compile(src_a, 9, 0, &a2, &err) == 0 && a2.cache_hit, "then hits again (rewritten)");

  CHECK(compile("extern \"C\" __global__ void k() { undeclared_thing(); }", 9, 0, &bad, &err) != 0,
        "a bad source fails");
  CHECK(strstr(err.msg, "NVRTC compilation for sm_90 failed") && strstr(err.msg, "undeclared_thing"),
        "with NVRTC's message: %s", err.msg);

  setenv("CPLAN_NVRTC_CACHE", "/proc/cplan-cannot-be-here", 1);
  RtNvrtcImage c1;
  CHECK(compile(src_a, 9, 0, &c1, &err) == 0 && !c1.cache_hit && c1.size == a1.size, "no usable cache: still compiles");
  rt_nvrtc_image_free(&c1);

  RtCudaDevice dev;
  memset(&err, 0, sizeof err);
  if (rt_cuda_init(0, &dev, &err) != 0)
    CHECK(strncmp(err.msg, "no CUDA device found (", 22) == 0, "rt_cuda_init without a GPU: %s", err.msg);
  else
    printf("note: a GPU is present (%s), so the no-device message was not checked\n", dev.name);

  rt_nvrtc_image_free(&a1), rt_nvrtc_image_free(&a2), rt_nvrtc_image_free(&a3), rt_nvrtc_image_free(&b1);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
  printf("%s: nvrtc cache\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
