#!/usr/bin/env bash
# train.sh CPLANC SRCDIR: the end-to-end path on one CPU. Builds tests/e2e/tiny_train.cplan with
# `cplanc build`, trains it on a repetitive text and checks that the loss falls by more than
# half; then `cplanc run` twice: the first builds into the cache, the second must reuse it.
set -u
cplanc=$1 src=$(cd "$2" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_e2e_train.XXXXXX")
if [ "${CPLAN_KEEP:-0}" = 1 ]; then echo "keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
cd "$tmp" || exit 1
cp "$src/tests/e2e/tiny_train.cplan" .
for i in $(seq 200); do printf 'the quick brown fox jumps over the lazy dog. '; done >text.txt
"$cplanc" data text text.txt -o tiny.bin >/dev/null || { echo "FAILED: cplanc data"; exit 1; }

"$cplanc" build tiny_train.cplan -o tiny --keep-c kept 2>build.log || { echo "FAILED: build"; cat build.log; exit 1; }
[ -s kept/plan.c ] || { echo "FAILED: --keep-c wrote no plan.c"; exit 1; }
./tiny --threads 1 --quiet --metrics m.jsonl || { echo "FAILED: the program exited with $?"; exit 1; }
# the first and the last step's loss, from the JSONL metrics ("loss": x)
losses=$(sed -n 's/.*"loss": *\([-0-9.eE+]*\).*/\1/p' m.jsonl)
first=$(echo "$losses" | head -n 1) last=$(echo "$losses" | tail -n 1)
n=$(echo "$losses" | grep -c .)
echo "tiny: $n steps, loss $first -> $last"
[ "$n" = 60 ] || { echo "FAILED: expected 60 steps of metrics, got $n"; head -3 m.jsonl; exit 1; }
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 0 && b < a / 2) }' ||
  { echo "FAILED: the loss did not fall by half"; exit 1; }

# cplanc run: builds into the cache once, then reuses it.
export CPLAN_CACHE=$tmp/cache
"$cplanc" run tiny_train.cplan -- --steps 2 --quiet 2>run1.log || { echo "FAILED: run"; cat run1.log; exit 1; }
grep -q "building" run1.log || { echo "FAILED: the first run did not build"; cat run1.log; exit 1; }
"$cplanc" run tiny_train.cplan -- --steps 2 --quiet 2>run2.log || { echo "FAILED: run 2"; cat run2.log; exit 1; }
if grep -q "building" run2.log; then echo "FAILED: the second run rebuilt"; exit 1; fi
"$cplanc" run tiny_train.cplan --set train.steps=3 -- --quiet 2>run3.log || { echo "FAILED: run 3"; cat run3.log; exit 1; }
grep -q "building" run3.log || { echo "FAILED: an override did not change the cache key"; exit 1; }
echo "ok"
