#!/usr/bin/env bash
# run_cli.sh CPLANC SRCDIR: `cplanc run` on the README's example, examples/adder.cplan, cut to
# 30 steps with --set.  The first run builds into the cache ($CPLAN_CACHE), trains, logs the
# first and last step and the final evaluation on stderr, and exits 0; a second run with the
# same file and overrides reuses the cached program (and passes the args after `--` to it); an
# edited file is rebuilt; the program's exit status comes back through `cplanc run`.
set -u
# shellcheck source=tests/e2e/e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
export CPLAN_CACHE=$tmp/cache
adder=$src/examples/adder.cplan
[ -f "$adder" ] || fail "no $adder"

e2e_prog 0 run1 "$cplanc" run "$adder" --set train.steps=30
e2e_says run1 "building" "step 1/30" "step 30/30" "eval step 30: val_loss" "val_accuracy"
[ -n "$(ls -A cache 2>/dev/null)" ] || fail "run1: nothing in the cache $CPLAN_CACHE"
loss=$(sed -n 's|^step 30/30 . loss \([0-9.]*\).*|\1|p' run1.err)
awk -v l="$loss" 'BEGIN { exit !(l > 0 && l < 2.6) }' ||
  fail "run1: the loss after 30 steps is '$loss', not below ln(13) = 2.56"

# the same file and overrides: no build, and the program gets --steps 2
e2e_prog 0 run2 "$cplanc" run "$adder" --set train.steps=30 -- --steps 2 --threads 1
if grep -q "building" run2.err; then cat run2.err; fail "run2: rebuilt instead of using the cache"; fi
e2e_says run2 "steps 0..2 of 30" "step 2/2"

# the peak RSS the program reports is its own, not cplanc's carried over the exec (within 2x of the
# same cached program run directly; cplanc's own is several times the adder's)
e2e_prog 0 rss_run "$cplanc" run "$adder" --set train.steps=30 -- --steps 2 --threads 1 --metrics rss_run.jsonl
prog=$(find cache -type f -perm -u+x | head -1)
e2e_prog 0 rss_direct "$prog" --steps 2 --threads 1 --metrics rss_direct.jsonl
rss() { sed -n 's/.*"peak_rss_bytes": *\([0-9]*\).*/\1/p' "$1" | tail -1; }
rr=$(rss rss_run.jsonl) rd=$(rss rss_direct.jsonl)
[ -n "$rr" ] && [ -n "$rd" ] && [ "$rr" -lt $((2 * rd)) ] ||
  fail "peak_rss_bytes under cplanc run is '$rr', the program alone '$rd' (from $prog)"
echo "peak RSS: $rr bytes under cplanc run, $rd alone"

# a rebuilt cplan (here: its runtime library, in a CPLAN_HOME layout) rebuilds the cached program
bin=$(cd "$(dirname "$cplanc")" && pwd)
mkdir -p home/include home/lib && cp "$src"/runtime/*.h "$src"/kernels/cpu/*.h home/include/ &&
  cp "$bin/runtime/libcplanrt.a" "$bin/kernels/libcplankernels.a" home/lib/ || fail "cannot lay out a CPLAN_HOME"
CPLAN_HOME=$tmp/home e2e_prog 0 home1 "$cplanc" run "$adder" --set train.steps=30 -- --steps 1
CPLAN_HOME=$tmp/home e2e_prog 0 home2 "$cplanc" run "$adder" --set train.steps=30 -- --steps 1
if grep -q "building" home2.err; then fail "home2: rebuilt with nothing changed"; fi
touch -d '+1 minute' home/lib/libcplanrt.a
CPLAN_HOME=$tmp/home e2e_prog 0 home3 "$cplanc" run "$adder" --set train.steps=30 -- --steps 1
e2e_says home3 "building"

# the program's errors come back: bad usage is 2, a failed run 1
e2e_prog 2 run_usage "$cplanc" run "$adder" --set train.steps=30 -- --no-such-flag
e2e_says run_usage "--no-such-flag"
mkdir -p empty_ckpt
e2e_prog 1 run_fail "$cplanc" run "$adder" --set train.steps=30 -- --resume empty_ckpt
e2e_says run_fail "empty_ckpt: no complete checkpoint"
# ...but the files the program reads first are checked by cplanc, before it builds: one error each
e2e_prog 1 run_noinit "$cplanc" run "$adder" --set train.steps=30 -- --init none.safetensors --resume run1.err
e2e_says run_noinit "error: \`-- --init none.safetensors\`: No such file" \
  "error: \`-- --resume run1.err\`: expected a directory, got a file" "2 errors generated"
if grep -q "building" run_noinit.err; then fail "run_noinit: built a program for a missing --init file"; fi

# a missing data file: `check` warns, `run` stops at the setting before building (exit 1, with the
# way to make one), unless the program is given another file with --data; a missing validation file
# stops it either way (the program reads both)
sed 's|tokens("tokens.bin")|tokens("none.bin")|' "$src/tests/e2e/gpt_small.cplan" >nodata.cplan
line=$(grep -n 'tokens("none.bin")' nodata.cplan | cut -d: -f1)
[ -n "$line" ] || fail "nodata.cplan: the edit of gpt_small.cplan did not apply"
e2e_prog 0 nodata_check "$cplanc" check nodata.cplan
e2e_says nodata_check "nodata.cplan:$line:22: warning: data file"
e2e_prog 1 nodata "$cplanc" run nodata.cplan
e2e_says nodata "nodata.cplan:$line:22: error: data file 'none.bin' not found" "^~~~" \
  "hint: \`cplanc data text FILE.txt -o none.bin\`" "-- --data PATH"
if grep -q "building" nodata.err; then fail "nodata: built a program for a missing data file"; fi
e2e_tokens tokens.bin
e2e_prog 0 nodata_given "$cplanc" run nodata.cplan -- --data tokens.bin --steps 1
e2e_says nodata_given "step 1/1"
if grep -q "warning: data file" nodata_given.err; then fail "nodata_given: warned of the plan's file that --data replaces"; fi
e2e_prog 1 nodata_missing "$cplanc" run nodata.cplan -- --data=none2.bin
e2e_says nodata_missing "error: \`-- --data none2.bin\`: No such file" "hint: \`cplanc data text FILE.txt -o none2.bin\`"
if grep -q "building" nodata_missing.err; then fail "nodata_missing: built a program for a missing --data file"; fi
sed 's|tokens("tokens.bin")|tokens("tokens.bin", val = "noval.bin")|' "$src/tests/e2e/gpt_small.cplan" >noval.cplan
grep -q noval.bin noval.cplan || fail "noval.cplan: the edit of gpt_small.cplan did not apply"
e2e_prog 1 noval "$cplanc" run noval.cplan -- --data tokens.bin
e2e_says noval "error: validation data file 'noval.bin' not found"

# the cache is keyed by the source text: the same path, edited, is a new build
cp "$adder" copy.cplan
e2e_prog 0 run3 "$cplanc" run copy.cplan --set train.steps=30 -- --steps 1
e2e_prog 0 run4 "$cplanc" run copy.cplan --set train.steps=30 -- --steps 1
if grep -q "building" run4.err; then fail "run4: rebuilt an unchanged file"; fi
echo "# edited" >>copy.cplan
e2e_prog 0 run5 "$cplanc" run copy.cplan --set train.steps=30 -- --steps 1
e2e_says run5 "building"
echo "ok"
