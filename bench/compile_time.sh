#!/usr/bin/env bash
# compile_time.sh CPLANC [LAYERS...]: how long cplanc takes to write the training program of a deep
# model, by layer count (default 12 96 150 300 500): `emit --stage=c` of examples/gpt2.cplan (the
# CUDA program for 8 H100s: the search, the lowering, the CUDA emitter and its memory plan) and of
# tests/e2e/gpt_small.cplan (the C program for a CPU mesh), each with train.model.L set. It prints
# wall seconds and the plan.c size. A benchmark, not a test: it never asserts on time. Run it on an
# idle machine; another build on the same cores stretches the figures.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cplanc=${1:-$here/../build/cplanc}
[ $# -gt 0 ] && shift
layers=("$@")
[ ${#layers[@]} -gt 0 ] || layers=(12 96 150 300 500)
[ -x "$cplanc" ] || { echo "compile_time.sh: no cplanc at $cplanc (build it, or pass its path)"; exit 2; }
out=$(mktemp "${TMPDIR:-/tmp}/cplan_compile_time.XXXXXX")
trap 'rm -f "$out"' EXIT
printf "%-34s %7s %10s %12s\n" "model" "layers" "seconds" "plan.c MB"
for file in "$here/../examples/gpt2.cplan" "$here/../tests/e2e/gpt_small.cplan"; do
  for L in "${layers[@]}"; do
    start=$(date +%s.%N)
    if ! "$cplanc" emit --stage=c "$file" --set "train.model.L=$L" >"$out" 2>/dev/null; then
      printf "%-34s %7s %10s\n" "$(basename "$file")" "$L" "failed"
      continue
    fi
    end=$(date +%s.%N)
    awk -v f="$(basename "$file")" -v l="$L" -v s="$start" -v e="$end" -v b="$(stat -c %s "$out")" \
      'BEGIN { printf "%-34s %7s %10.2f %12.1f\n", f, l, e - s, b / 1e6 }'
  done
done
