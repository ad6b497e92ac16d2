#!/usr/bin/env bash
# emit.sh CPLANC SRCDIR NVCC TEST_NVRTC CUDA_INCLUDE: `cplanc emit --stage=cuda` for the examples
# and the fusion test model; each source must compile with `nvcc --ptx -arch=compute_80` (warnings
# are errors) and with NVRTC for compute_80 and compute_90 (test_nvrtc: every kernel the source
# declares is an .entry of the PTX). On a CPU mesh the kernels are the CPU program's fused groups
# (f32); on a CUDA mesh they are the GPU program's kernels.cu (its storage types, its support
# kernels), what `build` compiles (tests/cuda/build.sh compares the two).
# CPLAN_TEST_SANITIZED=1 (the ASan build): cplanc runs sanitized; nvcc and NVRTC (not our code) are
# left to the plain build's run of this test.
set -u
cplanc=$1 src=$(cd "$2" && pwd) nvcc=$3 test_nvrtc=$4 cuda_inc=$5
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_emit_cuda.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check FILE [--set ...]
  local f=$1; shift
  local name; name=$(basename "$f" .cplan)
  if ! "$cplanc" emit --stage=cuda "$@" "$f" >"$tmp/$name.cu" 2>"$tmp/$name.err"; then
    echo "FAILED: cplanc emit --stage=cuda $* $f"; grep -v warning "$tmp/$name.err" | head -20; fail=1; return
  fi
  local nk; nk=$(grep -c '^extern "C" __global__ void' "$tmp/$name.cu")
  if [ "$nk" -eq 0 ]; then echo "FAILED: $f: no kernels emitted"; fail=1; return; fi
  if [ "${CPLAN_TEST_SANITIZED:-0}" = 1 ]; then echo "ok: $f: $nk kernels (not compiled: sanitized build)"; return; fi
  if ! "$nvcc" --ptx -arch=compute_80 -Werror all-warnings -o "$tmp/$name.ptx" "$tmp/$name.cu" 2>"$tmp/$name.nvcc"; then
    echo "FAILED: nvcc --ptx on the CUDA of $f:"; head -20 "$tmp/$name.nvcc"; fail=1; return
  fi
  local ne; ne=$(grep -c '^.visible .entry' "$tmp/$name.ptx")
  if [ "$ne" -ne "$nk" ]; then echo "FAILED: $f: nvcc's PTX has $ne entries, the source $nk kernels"; fail=1; return; fi
  echo "ok: $f: $nk kernels, nvcc --ptx compute_80"
  "$test_nvrtc" -I "$cuda_inc" "$tmp/$name.cu" || fail=1
}
f32=(--set train.precision=f32 --set train.batch=8)
check "$src/examples/gpt.cplan"
check "$src/examples/llama.cplan" "${f32[@]}" --set mesh.workstation.device=cpu
check "$src/examples/llama.cplan" # its CUDA mesh: the GPU program's kernels.cu, bf16
check "$src/tests/e2e/fusion_ops.cplan"
check "$src/tests/pytorch/user_models/m8_select.cplan" # abs, clamp, where fused with broadcast operands
# a file without a train block: exit 1 with a diagnostic, not a crash
"$cplanc" emit --stage=cuda "$src/tests/golden/empty_file.cplan" >/dev/null 2>"$tmp/none.err"; rc=$?
if [ $rc -eq 1 ] && grep -q "error: .*no train block" "$tmp/none.err"; then echo "ok: no train block: exit 1 with a diagnostic"
else echo "FAILED: no train block: exit $rc"; cat "$tmp/none.err"; fail=1; fi
exit $fail
