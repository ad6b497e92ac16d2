/* errors.cu: the launchers' error reporting (launch.h), host code only. */
#ifndef __CUDACC_RTC__
#include "launch.h"

#include <stdarg.h>
#include <stdio.h>

static thread_local char last_error[512];

extern "C" const char *cplan_cuda_error(void) { return last_error; }

extern "C" const char *cplan_dtype_name(CplanDtype dt) {
  return dt == CPLAN_F32 ? "f32" : dt == CPLAN_BF16 ? "bf16" : dt == CPLAN_F16 ? "f16" : "?";
}

int cplan_cuda_fail(const char *launcher, const char *fmt, ...) {
  int n = snprintf(last_error, sizeof last_error, "%s: ", launcher);
  if (n < 0 || n >= (int)sizeof last_error) n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
  va_end(ap);
  return -1;
}

int cplan_cuda_launched(const char *launcher) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  return cplan_cuda_fail(launcher, "launch failed: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
}
#endif
