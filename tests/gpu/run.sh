#!/usr/bin/env bash
# run.sh: the GPU checks of issue 6, for a machine with an NVIDIA GPU (one H200: well under
# 5 minutes). Run from anywhere:  tests/gpu/run.sh [BUILD_DIR]   (default: build-gpu)
#  1. configures and builds with -DCPLAN_CUDA=ON (the CUDA toolkit and NCCL must be there);
#  2. test_gpu_kernels: every CUDA kernel against its CPU reference, f32, bf16 and f16, with the
#     tolerance per dtype in its table (tests/gpu/test_kernels.c), plus bitwise determinism; again
#     with the WMMA attention kernels (CPLAN_ATTENTION=wmma);
#  3. the CI checks again (ctest -R '^cuda\.'), which on a GPU also run the link smoke test and
#     train cuda.build's programs 2 steps;
#  4. tests/gpu/gpt_gpu.sh: the small GPT and LLaMA of tests/e2e, 20 steps on the GPU (the CUDA
#     training program of `cplanc build`, codegen/emit_cu.c) against the CPU backend (f32), in
#     f32 (losses and gradient norms within 1e-3 relative, params within 1e-3), bf16 and f16
#     (2e-2; f16 must skip no step);
#  5. bench/gpu_gpt2.sh: GPT-2 124M (T 1024, micro-batch 16, bf16): tokens/s, step ms and MFU
#     against 989 TFLOP/s, and the per-node-class profile (a benchmark: printed, not checked).
# With no GPU it fails (exit 1), it never skips. The lent GPU machines cannot build cplan (no bison,
# cJSON or LLVM there): for them, tests/gpu/prepare.sh builds the same checks here into one archive
# and its run.sh runs them there in one call.
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
step "the CUDA-on-CPU emulator's selftest, built by nvcc, on the GPU (its semantics; mma16816's fragment layout)"
"${NVCC:-/usr/local/cuda/bin/nvcc}" -std=c++17 -arch=native -I"$src/kernels/cuda" -o "$build/test_emu_gpu" \
  "$src/tests/cuda/emu/test_emu.cu" && (set -o pipefail; "$build/test_emu_gpu" | grep -E "FAIL|checks") || fail=1
step "CUDA kernels against the CPU references"
"$build/tests/test_gpu_kernels" || fail=1
step "the same with bf16 / f16 attention on the WMMA kernels (CPLAN_ATTENTION=wmma; the default is mma.sync)"
(set -o pipefail; CPLAN_ATTENTION=wmma "$build/tests/test_gpu_kernels" | grep -E "FAIL|checks") || fail=1
step "the runtime's cuBLASLt GEMMs, every epilogue, against a double reference"
"$build/tests/test_gpu_gemm" || fail=1

step "the CI checks (ctest -R '^cuda\\.')"
ctest --test-dir "$build" -R '^cuda\.' --output-on-failure || fail=1

step "the small GPT and LLaMA, 20 steps on the GPU against the CPU backend (f32 1e-3, bf16 and f16 2e-2)"
"$src/tests/gpu/gpt_gpu.sh" "$build/cplanc" "$src" || fail=1

step "GPT-2 124M, bf16 (bench/gpu_gpt2.sh)"
"$src/bench/gpu_gpt2.sh" "$build/cplanc" "$build-gpt2" >/dev/null && "$build-gpt2/run_gpu.sh" 10 || fail=1

step "summary"
if [ $fail -ne 0 ]; then echo "run.sh: FAILED (see above)"; exit 1; fi
echo "kernel checks, CI checks, the small GPT/LLaMA GPU-vs-CPU checks (f32, bf16, f16): passed; GPT-2 figures above"
