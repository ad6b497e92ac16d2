#!/usr/bin/env bash
# rows.sh CPLANC SRCDIR: the LLVM-generated row kernels (softmax, log_softmax, layer_norm,
# rms_norm, last-axis mean; codegen/llvm.c) in a built program. Trains tests/e2e/rows_ops.cplan
# with them and with CPLAN_ROWS=0 (the hand-written kf_ kernels) and requires the same losses
# step by step (relative 1e-4), and that the default plan.c really calls row kernels.
set -u
cplanc=$1 src=$(cd "$2" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_e2e_rows.XXXXXX")
if [ "${CPLAN_KEEP:-0}" = 1 ]; then echo "keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
cd "$tmp" || exit 1
for i in $(seq 100); do printf 'the quick brown fox jumps over the lazy dog. '; done >text.txt
"$cplanc" data text text.txt -o tiny.bin >/dev/null || { echo "FAILED: cplanc data"; exit 1; }
cp "$src/tests/e2e/rows_ops.cplan" .
losses() { sed -n 's/.*"loss": *\([-0-9.eE+naif]*\).*/\1/p' "$1"; }
"$cplanc" build rows_ops.cplan -o llvm --keep-c c_llvm 2>build.log || { echo "FAILED: build"; cat build.log; exit 1; }
CPLAN_ROWS=0 "$cplanc" build rows_ops.cplan -o kf --keep-c c_kf 2>build.log || { echo "FAILED: build (CPLAN_ROWS=0)"; cat build.log; exit 1; }
fail=0
for op in softmax log_softmax layer_norm rms_norm; do
  grep -q "k_row[0-9]*_${op}" c_llvm/plan.c || { echo "FAILED: plan.c calls no LLVM row kernel for $op"; fail=1; }
done
if grep -q "k_row[0-9]" c_kf/plan.c; then echo "FAILED: CPLAN_ROWS=0 still calls row kernels"; fail=1; fi
for v in llvm kf; do ./$v --threads 1 --quiet --metrics $v.jsonl || { echo "FAILED: $v exited with $?"; exit 1; }; done
paste <(losses llvm.jsonl) <(losses kf.jsonl) >pairs.txt
[ "$(grep -c . pairs.txt)" = 20 ] || { echo "FAILED: expected 20 steps of losses"; cat pairs.txt; fail=1; }
awk '{ if ($1 != $1 + 0 || $2 != $2 + 0) exit 1; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * ($2 < 0 ? -$2 : $2)) exit 1 }' pairs.txt ||
  { echo "FAILED: row-kernel and kf_ losses differ"; cat pairs.txt; fail=1; }
awk 'NR == 1 { first = $1 } END { if (!($1 < first)) exit 1 }' pairs.txt || { echo "FAILED: the loss does not fall"; cat pairs.txt; fail=1; }
[ $fail = 0 ] && echo ok
exit $fail
