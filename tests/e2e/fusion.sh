#!/usr/bin/env bash
# fusion.sh CPLANC SRCDIR: fused elementwise kernels (compiler/fusion.c, codegen/llvm.c) in built
# programs. Trains tests/e2e/fusion_ops.cplan (every fusable op and gradient) and
# tests/e2e/tiny_train.cplan (gelu, dropout, accumulation, AdamW) twice: with fusion and with
# CPLAN_FUSION=0 (one reference kernel call per node), and requires the same losses step by step
# (relative 1e-4: the kernels round in f32 where the reference ones use double). Checks that the
# fused plan.c really calls kernels (GRAD groups among them) and the unfused one none, and that
# `cplanc emit --stage=llvm` prints their IR.
set -u
cplanc=$1 src=$(cd "$2" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_e2e_fusion.XXXXXX")
if [ "${CPLAN_KEEP:-0}" = 1 ]; then echo "keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
cd "$tmp" || exit 1
fail=0
for i in $(seq 100); do printf 'the quick brown fox jumps over the lazy dog. '; done >text.txt
"$cplanc" data text text.txt -o tiny.bin >/dev/null || { echo "FAILED: cplanc data"; exit 1; }
cp "$src/tests/e2e/tiny_train.cplan" "$src/tests/e2e/fusion_ops.cplan" .

losses() { sed -n 's/.*"loss": *\([-0-9.eE+naif]*\).*/\1/p' "$1"; }

for m in fusion_ops tiny_train; do
  "$cplanc" build $m.cplan -o $m.fused --keep-c fused_$m 2>build.log || { echo "FAILED: build $m"; cat build.log; exit 1; }
  CPLAN_FUSION=0 "$cplanc" build $m.cplan -o $m.plain --keep-c plain_$m 2>build.log ||
    { echo "FAILED: build $m without fusion"; cat build.log; exit 1; }
  calls=$(grep -c "^  k_ew_[0-9]*(" fused_$m/plan.c)
  [ "$calls" -gt 0 ] || { echo "FAILED: $m: the fused plan.c calls no fused kernel"; fail=1; }
  if grep -q "k_ew_" plain_$m/plan.c; then echo "FAILED: $m: CPLAN_FUSION=0 still fuses"; fail=1; fi
  for v in fused plain; do
    ./$m.$v --threads 1 --steps 12 --quiet --metrics $v.jsonl || { echo "FAILED: $m.$v exited with $?"; exit 1; }
  done
  paste <(losses fused.jsonl) <(losses plain.jsonl) >pairs.txt
  n=$(grep -c . pairs.txt)
  worst=$(awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > w) w = r } END { printf "%.3g", w }' pairs.txt)
  echo "$m: $calls fused kernel calls, $n steps, max relative loss difference $worst"
  [ "$n" = 12 ] || { echo "FAILED: $m: expected 12 steps of losses"; fail=1; }
  awk '{ if ($1 != $1 + 0 || $2 != $2 + 0) exit 1; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * ($2 < 0 ? -$2 : $2)) exit 1 }' pairs.txt ||
    { echo "FAILED: $m: fused and unfused losses differ"; cat pairs.txt; fail=1; }
done

# GRAD nodes fuse (fusion_ops' backward has multi-node groups of gradients).
grep -A3 "fused: [0-9]* nodes" fused_fusion_ops/plan.c | grep -q "; backward" ||
  { echo "FAILED: no fused group of backward nodes in fusion_ops"; fail=1; }
"$cplanc" emit --stage=llvm fusion_ops.cplan >ir.ll 2>ir.err || { echo "FAILED: emit --stage=llvm"; cat ir.err; exit 1; }
defs=$(grep -c "^define void @k_ew_" ir.ll)
[ "$defs" = "$(grep -c '^void k_ew_' fused_fusion_ops/plan.c)" ] ||
  { echo "FAILED: --stage=llvm defines $defs kernels, plan.c declares another number"; fail=1; }
[ $fail = 0 ] && echo ok
exit $fail
