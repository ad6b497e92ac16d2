#!/usr/bin/env bash
# emit_c.sh CPLANC SRCDIR: emits plan.c (`cplanc emit --stage=c`) for every example and e2e model
# and checks that it compiles (cc -fsyntax-only against the runtime and kernel headers), so a
# broken emission fails CI even where nothing is trained. GPU examples are retargeted to one CPU
# in f32 with a small batch through --set, as a user would.
set -u
cplanc=$1 src=$(cd "$2" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_emit_c.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check FILE [--set ...]
  local f=$1; shift
  local name; name=$(basename "$f" .cplan)
  if ! "$cplanc" emit --stage=c "$@" "$f" >"$tmp/$name.c" 2>"$tmp/$name.err"; then
    echo "FAILED: cplanc emit --stage=c $* $f"; grep -v warning "$tmp/$name.err" | head -20; fail=1; return
  fi
  grep -q "^const RtPlan cplan_plan = {" "$tmp/$name.c" || { echo "FAILED: $f: no cplan_plan"; fail=1; }
  grep -q "^int main(int argc, char \*\*argv) { return rt_main(argc, argv, &cplan_plan); }" "$tmp/$name.c" ||
    { echo "FAILED: $f: no main"; fail=1; }
  if ! cc -std=gnu11 -fsyntax-only -Wall -Wno-unused-function -Werror -I"$src/runtime" -I"$src/kernels/cpu" \
      "$tmp/$name.c" 2>"$tmp/$name.cc"; then
    echo "FAILED: plan.c of $f does not compile:"; head -20 "$tmp/$name.cc"; fail=1; return
  fi
  echo "ok: $f ($(wc -l <"$tmp/$name.c") lines)"
}
gpu=(--set train.precision=f32 --set train.batch=8)
check "$src/examples/gpt.cplan"
check "$src/examples/gpt2.cplan" "${gpu[@]}" --set mesh.dgx_h100.device=cpu
check "$src/examples/llama.cplan" "${gpu[@]}" --set mesh.workstation.device=cpu
for f in "$src"/tests/e2e/*.cplan; do check "$f"; done

# The memory plan follows the emitted code (cg_plan_emit): a value lives from its first call to its
# last, so the example GPT's work arena is below the one on the graph's liveness (CPLAN_PRUNE_ARENA=0:
# the gradient of an add keeps its operands alive through the backward there).
work() { sed -n 's/^    \.work_bytes = \([0-9]*\),.*/\1/p' "$1"; }
CPLAN_PRUNE_ARENA=0 "$cplanc" emit --stage=c "$src/examples/gpt.cplan" >"$tmp/unpruned.c" 2>/dev/null
wp=$(work "$tmp/gpt.c") wu=$(work "$tmp/unpruned.c")
if [ -n "$wp" ] && [ -n "$wu" ] && [ "$wp" -lt "$wu" ]; then echo "ok: gpt.cplan: work arena $wp bytes ($wu on the graph's liveness)"
else echo "FAILED: gpt.cplan: work arena '$wp' bytes, not below '$wu' on the graph's liveness"; fail=1; fi

# The unsupported precision is a diagnostic at the precision setting (check says it too), not a crash.
line=$(grep -n "^  precision = bf16" "$src/examples/llama.cplan" | cut -d: -f1)
if "$cplanc" emit --stage=c "$src/examples/llama.cplan" --set mesh.workstation.device=cpu >/dev/null 2>"$tmp/bf16.err" ||
   ! grep -q "llama.cplan:$line:15: error: precision bf16 needs a mesh of CUDA devices: the cpu backend runs f32 only" "$tmp/bf16.err"; then
  echo "FAILED: bf16 on the cpu backend is not diagnosed"; cat "$tmp/bf16.err"; fail=1
fi
# On a CUDA mesh --stage=c prints the GPU program's plan.c (no toolkit needed to emit it; cuda.build
# compares it with what build compiles), and --stage=llvm says the GPU program has no LLVM kernels.
if "$cplanc" emit --stage=c "$src/examples/llama.cplan" >"$tmp/gpu.c" 2>"$tmp/gpu.err" &&
   grep -q '^    .devices = 2,' "$tmp/gpu.c" && grep -q 'kernels.cu: compiled at start by NVRTC' "$tmp/gpu.c"; then
  echo "ok: llama.cplan on its CUDA mesh: the GPU program's plan.c ($(wc -l <"$tmp/gpu.c") lines)"
else echo "FAILED: emit --stage=c on a CUDA mesh"; grep -v warning "$tmp/gpu.err" | head; fail=1; fi
if "$cplanc" emit --stage=llvm "$src/examples/llama.cplan" >/dev/null 2>"$tmp/llvm.err" ||
   ! grep -q "error: mesh 'workstation' has h100_sxm devices: the CUDA program compiles its fused kernels with NVRTC" "$tmp/llvm.err"; then
  echo "FAILED: --stage=llvm on a CUDA mesh is not diagnosed"; cat "$tmp/llvm.err"; fail=1
fi
exit $fail
