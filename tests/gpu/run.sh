#!/usr/bin/env bash
# run.sh: the GPU checks of issue 6, for a machine with an NVIDIA GPU (one H200: well under
# 5 minutes). Run from anywhere:  tests/gpu/run.sh [BUILD_DIR]   (default: build-gpu)
#  1. configures and builds with -DCPLAN_CUDA=ON (the CUDA toolkit and NCCL must be there);
#  2. test_gpu_kernels: every CUDA kernel against its CPU reference, f32 and bf16, with the
#     tolerance per dtype in its table (tests/gpu/test_kernels.c), plus bitwise determinism;
#  3. the CI checks again (ctest -R '^cuda\.'), which on a GPU also run the link smoke test and
#     train cuda.build's programs 2 steps;
#  4. tests/gpu/gpt_gpu.sh: the small GPT and LLaMA of tests/e2e, 20 steps on the GPU (the CUDA
#     training program of `cplanc build`, codegen/emit_cu.c) against the CPU backend, f32: losses
#     and gradient norms within 1e-3 relative, params within 1e-3.
# Not here yet: the same in bf16 (2e-2; the CUDA backend builds f32 only), and GPT-2 124M tokens/s
# and MFU. The script says so at the end and exits 2 when everything it can run passed: it never
# reports those checks as passed. With no GPU it fails (exit 1), it never skips.
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

step "the small GPT and LLaMA, 20 steps on the GPU against the CPU backend (f32, 1e-3)"
"$src/tests/gpu/gpt_gpu.sh" "$build/cplanc" "$src" || fail=1

step "summary"
if [ $fail -ne 0 ]; then echo "run.sh: FAILED (see above)"; exit 1; fi
echo "kernel checks, CI checks and the small GPT/LLaMA f32 GPU-vs-CPU check: passed"
echo "NOT RUN: small GPT 20 steps in bf16 (2e-2): the CUDA backend builds f32 programs only;"
echo "         GPT-2 124M tokens/s and MFU: not written yet"
exit 2
