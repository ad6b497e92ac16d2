#!/usr/bin/env bash
# row_kernels.sh [BUILD_DIR]: times the LLVM row kernels (codegen/llvm.c: softmax, log_softmax,
# layer_norm, rms_norm forward and backward, last-axis sum and mean) against the hand-written kf_
# kernels of kernels/cpu/fast_nn.c they replace in generated plans, one thread, at the GPT
# benchmark's shapes (1024 rows of 256 or 512; a sum over 2^20 values). Best of 20 runs each.
# A benchmark, not a test: it never asserts on time. It runs the unit test test_llvm_rows with
# CG_ROWS_BENCH set to the build's kernel library.
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
[ -x "$build/tests/test_llvm_rows" ] || { echo "row_kernels.sh: no $build/tests/test_llvm_rows (build first)"; exit 2; }
lib=$(cd "$build/kernels" && pwd)/libcplankernels.a
OPENBLAS_NUM_THREADS=1 CG_ROWS_BENCH=$lib "$build/tests/test_llvm_rows"
