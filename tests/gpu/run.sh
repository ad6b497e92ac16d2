#!/usr/bin/env bash
# run.sh: the GPU checks of issue 6, for a machine with an NVIDIA GPU (one H200: well under
# 5 minutes). Run from anywhere:  tests/gpu/run.sh [BUILD_DIR]   (default: build-gpu)
#  1. configures and builds with -DCPLAN_CUDA=ON (the CUDA toolkit and NCCL must be there);
#  2. test_gpu_kernels: every CUDA kernel against its CPU reference, f32 and bf16, with the
#     tolerance per dtype in its table (tests/gpu/test_kernels.c), plus bitwise determinism;
#  3. the CI checks again (ctest -R '^cuda\.'), which on a GPU also run the link smoke test.
# Not here yet (they need `cplanc build` to emit a CUDA training program, which it does not):
# the small GPT for 20 steps on the GPU against the CPU backend, and GPT-2 124M tokens/s and MFU.
# The script says so at the end and exits 2 when everything it can run passed: it never
# reports the issue's GPU checks as passed. With no GPU it fails (exit 1), it never skips.
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build-gpu}
jobs=$(nproc 2>/dev/null || echo 4)
step() { printf '\n==== %s\n' "$*"; }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "run.sh: no NVIDIA GPU visible (nvidia-smi -L failed): the GPU checks did NOT run" >&2
  exit 1
fi
nvidia-smi -L

step "build ($build)"
t0=$(date +%s)
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCPLAN_CUDA=ON >"$build.cmake.log" 2>&1 ||
  { tail -30 "$build.cmake.log"; echo "run.sh: configure FAILED"; exit 1; }
cmake --build "$build" -j"$jobs" >"$build.build.log" 2>&1 ||
  { grep -E "error|Error" "$build.build.log" | head -30; echo "run.sh: build FAILED"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"

fail=0
step "CUDA kernels against the CPU references"
"$build/tests/test_gpu_kernels" || fail=1

step "the CI checks (ctest -R '^cuda\\.')"
ctest --test-dir "$build" -R '^cuda\.' --output-on-failure || fail=1

step "summary"
if [ $fail -ne 0 ]; then echo "run.sh: FAILED (see above)"; exit 1; fi
echo "kernel checks and CI checks: passed"
echo "NOT RUN: small GPT 20 steps GPU vs CPU (1e-3 f32, 2e-2 bf16) and GPT-2 124M MFU:"
echo "         cplanc build does not emit a CUDA training program yet"
exit 2
