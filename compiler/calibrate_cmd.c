/* calibrate_cmd.c: `cplanc calibrate` (calibrate_cmd.h). The measuring is done by the separate
 * program cplan-calibrate (tools/calibrate.c), because with --np N it must run as N MPI ranks;
 * this side finds it, starts it (under `mpirun -np N --oversubscribe`, the launch `cplanc run`
 * uses, see build.c launch_argv), and publishes the profile it wrote with an atomic rename, so
 * a failed or interrupted calibration never leaves a half-written profile at the -o path. */
#include "calibrate_cmd.h"

#include "cplan_config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

static bool executable(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* cplan-calibrate: in $CPLAN_HOME/bin when CPLAN_HOME is set (an installed cplan), else next to
 * this cplanc, else in the build tree cplanc was configured from. NULL after a diagnostic. */
static const char *find_tool(void) {
  const char *home = getenv("CPLAN_HOME");
  if (home && *home) {
    const char *p = cp_fmt("%s/bin/cplan-calibrate", home);
    if (executable(p)) return p;
    diag_error(SPAN_NONE, "cannot find %s (CPLAN_HOME is set)", p);
    return NULL;
  }
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) {
      const char *p = cp_fmt("%.*s/cplan-calibrate", (int)(slash - self), self);
      if (executable(p)) return p;
    }
  }
  if (executable(CPLAN_BINARY_DIR "/cplan-calibrate")) return CPLAN_BINARY_DIR "/cplan-calibrate";
  diag_error(SPAN_NONE, "cannot find the program cplan-calibrate next to cplanc or in %s", CPLAN_BINARY_DIR);
  diag_hint("build cplan first (cmake --build), or set CPLAN_HOME to an installed cplan");
  return NULL;
}

/* name as execv needs it: itself when it has a slash, else its first executable in PATH; NULL
 * when there is none. */
static const char *which(const char *name) {
  if (strchr(name, '/')) return executable(name) ? name : NULL;
  const char *path = getenv("PATH");
  for (const char *d = path ? path : ""; *name && *d;) {
    size_t len = strcspn(d, ":");
    const char *p = cp_fmt("%.*s/%s", (int)len, d, name);
    if (len > 0 && executable(p)) return p;
    d += len + (d[len] == ':');
  }
  return NULL;
}

/* The MPI launcher: $CPLAN_MPIEXEC, or the one CMake found; NULL after a diagnostic when it
 * cannot be run. */
static const char *find_launcher(int np) {
  const char *env = getenv("CPLAN_MPIEXEC");
  const char *l = env && *env ? env : CPLAN_MPIEXEC;
  const char *path = which(l);
  if (path) return path;
  diag_error(SPAN_NONE, "--np %d needs the MPI launcher '%s'%s, which cannot be run", np, *l ? l : "mpirun",
             env && *env ? " (CPLAN_MPIEXEC)" : "");
  diag_hint("install Open MPI (mpirun), set CPLAN_MPIEXEC to the launcher, or measure one rank with --np 1");
  return NULL;
}

/* Runs argv (NULL-terminated) with this process's stdout and stderr; its exit status, or -1 after
 * a diagnostic when it could not run or died of a signal. */
static int run_tool(const char *const *argv) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    diag_error(SPAN_NONE, "cannot start %s: %s", argv[0], strerror(errno));
    return -1;
  }
  if (pid == 0) {
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "cplanc: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) {
      diag_error(SPAN_NONE, "waiting for %s: %s", argv[0], strerror(errno));
      return -1;
    }
  if (WIFSIGNALED(st)) {
    diag_error(SPAN_NONE, "%s was killed by signal %d", argv[0], WTERMSIG(st));
    return -1;
  }
  return WEXITSTATUS(st);
}

/* The file cplan-calibrate wrote: a JSON object with positive flops_f32 and hbm (the loader,
 * settings.c profile_from_json, checks the rest when a mesh uses it). */
static bool profile_ok(const char *path) {
  const char *text = cp_read_text(path);
  if (!text) return false;
  cJSON *j = cJSON_Parse(text);
  const cJSON *fl = cJSON_GetObjectItemCaseSensitive(j, "flops_f32"), *hbm = cJSON_GetObjectItemCaseSensitive(j, "hbm");
  bool ok = cJSON_IsObject(j) && cJSON_IsNumber(fl) && fl->valuedouble > 0 && cJSON_IsNumber(hbm) &&
            hbm->valuedouble > 0;
  cJSON_Delete(j);
  return ok;
}

bool calibrate_run(const CalibrateOpts *o) {
  struct stat st;
  if (stat(o->out, &st) == 0 && S_ISDIR(st.st_mode)) {
    diag_error(SPAN_NONE, "-o %s: is a directory; give the profile's file name (profile.json)", o->out);
    return false;
  }
  /* The measurement takes seconds: find out first that the result can be written. */
  const char *tmp = cp_fmt("%s.tmp", o->out);
  FILE *probe = fopen(tmp, "w");
  if (!probe) {
    diag_error(SPAN_NONE, "cannot write %s: %s", tmp, strerror(errno));
    diag_hint("-o takes a file in an existing, writable directory");
    return false;
  }
  fclose(probe);
  const char *tool = find_tool(), *launcher = o->np > 1 ? find_launcher(o->np) : NULL;
  if (!tool || (o->np > 1 && !launcher)) {
    unlink(tmp);
    return false;
  }
  VEC(const char *) argv = {0};
  if (o->np > 1) {
    VEC_PUSH(argv, launcher);
    VEC_PUSH(argv, "-np");
    VEC_PUSH(argv, cp_fmt("%d", o->np));
    VEC_PUSH(argv, "--oversubscribe");
    if (geteuid() == 0) { /* Open MPI's consent to run as root, as `cplanc run` gives it */
      setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
      setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
  }
  VEC_PUSH(argv, tool);
  VEC_PUSH(argv, "--out");
  VEC_PUSH(argv, tmp);
  VEC_PUSH(argv, "--ranks");
  VEC_PUSH(argv, cp_fmt("%d", o->np));
  if (o->quick) VEC_PUSH(argv, "--quick");
  VEC_PUSH(argv, (const char *)NULL);
  int rc = run_tool(argv.a);
  if (rc != 0) {
    if (rc > 0) diag_error(SPAN_NONE, "calibration failed: %s exited with status %d", argv.a[0], rc);
    unlink(tmp);
    return false;
  }
  if (!profile_ok(tmp)) {
    diag_error(SPAN_NONE, "%s did not write a device profile to %s", tool, tmp);
    unlink(tmp);
    return false;
  }
  if (rename(tmp, o->out) != 0) {
    diag_error(SPAN_NONE, "cannot rename %s to %s: %s", tmp, o->out, strerror(errno));
    unlink(tmp);
    return false;
  }
  printf("wrote %s; a mesh uses it with  device = profile(\"%s\")\n", o->out, o->out);
  return true;
}
