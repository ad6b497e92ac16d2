/* test_nvrtc.c: every CUDA source compiles with NVRTC to PTX for compute_80 and compute_90, and
 * the PTX has exactly the kernels the source promises (ctest cuda.nvrtc and cuda.emit). NVRTC
 * needs no GPU and no driver, so this runs in CI.
 *
 *   test_nvrtc [-I DIR]... [--entries LIST] FILE...
 *
 * The kernels a FILE promises: with --entries, the names listed for it in LIST (lines
 * "FILE: name name ..."; the hand-written kernels build their names with macros); otherwise the
 * names of its `extern "C" __global__ void NAME(` declarations (the generated kernels). The
 * .entry set of the PTX must equal that set, for each architecture. */
#include <nvrtc.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAMES 8192 /* a GPU program's kernels.cu has a kernel per fused group and storage type */

typedef struct Names {
  char *a[MAX_NAMES];
  int n;
} Names;

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
  s[n] = 0;
  fclose(f);
  return s;
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

static int is_ident(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

static void add_name(Names *ns, const char *s, size_t len) {
  for (int i = 0; i < ns->n; i++)
    if (strlen(ns->a[i]) == len && strncmp(ns->a[i], s, len) == 0) return;
  if (ns->n < MAX_NAMES) ns->a[ns->n++] = strndup(s, len);
}

/* the NAMEs of `extern "C" __global__ void NAME(` in src */
static void names_from_source(const char *src, Names *ns) {
  static const char key[] = "extern \"C\" __global__ void ";
  for (const char *p = strstr(src, key); p; p = strstr(p + 1, key)) {
    const char *s = p + sizeof key - 1, *e = s;
    while (is_ident(*e)) e++;
    if (*e == '(' && e > s) add_name(ns, s, (size_t)(e - s));
  }
}

/* the names listed for file in list ("FILE: a b c", '#' comments) */
static int names_from_list(const char *list, const char *file, Names *ns) {
  char *text = read_file(list);
  if (!text) return -1;
  size_t fl = strlen(file);
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    if (strncmp(line, file, fl) != 0 || line[fl] != ':') continue;
    for (char *p = line + fl + 1; *p;) {
      while (*p == ' ' || *p == '\t') p++;
      char *s = p;
      while (is_ident(*p)) p++;
      if (p > s) add_name(ns, s, (size_t)(p - s));
      else if (*p) p++;
    }
  }
  free(text);
  return 0;
}

/* the names of the .entry directives of ptx */
static void names_from_ptx(const char *ptx, Names *ns) {
  static const char key[] = ".entry ";
  for (const char *p = strstr(ptx, key); p; p = strstr(p + 1, key)) {
    const char *s = p + sizeof key - 1, *e = s;
    while (is_ident(*e)) e++;
    if (e > s) add_name(ns, s, (size_t)(e - s));
  }
}

static int has(const Names *ns, const char *s) {
  for (int i = 0; i < ns->n; i++)
    if (strcmp(ns->a[i], s) == 0) return 1;
  return 0;
}

/* compiles src for arch; 0 when the PTX has exactly the entries `want` */
static int check_arch(const char *path, const char *src, const char *arch, const char *const *incs, int nincs,
                      const Names *want) {
  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, src, base_name(path), 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) {
    printf("FAILED: %s: nvrtcCreateProgram: %s\n", path, nvrtcGetErrorString(r));
    return 1;
  }
  const char *opts[40];
  int nopts = 0;
  char archopt[64];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
  opts[nopts++] = archopt;
  opts[nopts++] = "-std=c++17";
  for (int i = 0; i < nincs && nopts < 38; i++) opts[nopts++] = incs[i];
  r = nvrtcCompileProgram(prog, nopts, opts);
  size_t logn = 0;
  nvrtcGetProgramLogSize(prog, &logn);
  char *log = malloc(logn + 1);
  log[0] = 0;
  if (logn) nvrtcGetProgramLog(prog, log);
  int fail = 0;
  if (r != NVRTC_SUCCESS) {
    printf("FAILED: %s for %s: %s\n%s\n", path, arch, nvrtcGetErrorString(r), log);
    fail = 1;
  } else {
    size_t n = 0;
    nvrtcGetPTXSize(prog, &n);
    char *ptx = malloc(n + 1);
    ptx[0] = 0;
    if (n) nvrtcGetPTX(prog, ptx);
    Names got = {0};
    names_from_ptx(ptx, &got);
    if (strlen(ptx) == 0) printf("FAILED: %s for %s: empty PTX\n", path, arch), fail = 1;
    for (int i = 0; i < want->n; i++)
      if (!has(&got, want->a[i])) printf("FAILED: %s for %s: no .entry %s in the PTX\n", path, arch, want->a[i]), fail = 1;
    for (int i = 0; i < got.n; i++)
      if (!has(want, got.a[i])) printf("FAILED: %s for %s: unexpected .entry %s\n", path, arch, got.a[i]), fail = 1;
    if (!fail) printf("ok: %s for %s: %d kernels, %zu bytes of PTX\n", base_name(path), arch, got.n, strlen(ptx));
    for (int i = 0; i < got.n; i++) free(got.a[i]);
    free(ptx);
  }
  free(log);
  nvrtcDestroyProgram(&prog);
  return fail;
}

int main(int argc, char **argv) {
  const char *incs[32];
  int nincs = 0, fail = 0, nfiles = 0;
  const char *list = NULL;
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-I") == 0 && i + 1 < argc && nincs < 16) {
      char *o = malloc(strlen(argv[i + 1]) + 3);
      sprintf(o, "-I%s", argv[++i]);
      incs[nincs++] = o;
      continue;
    }
    if (strcmp(argv[i], "--entries") == 0 && i + 1 < argc) {
      list = argv[++i];
      continue;
    }
    const char *path = argv[i];
    char *src = read_file(path);
    if (!src) {
      printf("FAILED: %s: cannot read\n", path);
      fail = 1;
      continue;
    }
    Names want = {0};
    if (list) {
      if (names_from_list(list, base_name(path), &want) != 0) {
        printf("FAILED: %s: cannot read\n", list);
        return 1;
      }
    } else {
      names_from_source(src, &want);
    }
    if (want.n == 0) {
      printf("FAILED: %s: promises no kernels (%s)\n", path, list ? "not in the entries list" : "no extern \"C\" __global__");
      fail = 1;
    } else {
      fail |= check_arch(path, src, "compute_80", incs, nincs, &want);
      fail |= check_arch(path, src, "compute_90", incs, nincs, &want);
    }
    for (int k = 0; k < want.n; k++) free(want.a[k]);
    free(src);
    nfiles++;
  }
  if (nfiles == 0) {
    fprintf(stderr, "usage: test_nvrtc [-I DIR]... [--entries LIST] FILE...\n");
    for (int k = 0; k < nincs; k++) free((void *)incs[k]);
    return 2;
  }
  printf("%s: %d files, NVRTC %d.%d\n", fail ? "FAILED" : "ok", nfiles, major, minor);
  for (int k = 0; k < nincs; k++) free((void *)incs[k]);
  return fail;
}
