#!/usr/bin/env bash
# run_one.sh CPLANC FILE.cplan: one golden test. Runs cplanc in FILE's folder with
# the arguments of FILE's `# ARGS:` line (default: check) and compares stdout with
# the expected .out and stderr with the expected .err, and the exit status with
# `# EXIT:` (default 0). Expectations live beside a golden file, and in
# tests/golden/examples/ for examples/*.cplan. UPDATE=1 re-blesses them.
set -u
cplanc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
file=$2
dir=$(cd "$(dirname "$file")" && pwd)
base=$(basename "$file" .cplan)
here=$(cd "$(dirname "$0")" && pwd)
if [ "$dir" = "$here" ]; then exp="$here/$base"; else exp="$here/examples/$base"; fi

args=$(sed -n 's/^# ARGS: *//p' "$file" | head -n 1)
[ -n "$args" ] || args=check
want_exit=$(sed -n 's/^# EXIT: *//p' "$file" | head -n 1)
[ -n "$want_exit" ] || want_exit=0

out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
# Fixed figures for the host: the cpu profile reads the machine's memory otherwise.
(cd "$dir" && CPLAN_CPU_MEMORY=24GiB NO_COLOR=1 "$cplanc" $args "$base.cplan" >"$out" 2>"$err")
got_exit=$?

if [ "${UPDATE:-0}" = 1 ]; then
  mkdir -p "$(dirname "$exp")"
  cp "$out" "$exp.out"
  if [ -s "$err" ]; then cp "$err" "$exp.err"; else rm -f "$exp.err"; fi
  echo "updated $exp.out (exit $got_exit)"
  [ "$got_exit" = "$want_exit" ] || { echo "note: exit $got_exit, but the file says # EXIT: $want_exit"; exit 1; }
  exit 0
fi

fail=0
if [ "$got_exit" != "$want_exit" ]; then
  echo "exit status: expected $want_exit, got $got_exit"; fail=1
fi
if [ -f "$exp.out" ]; then
  diff -u "$exp.out" "$out" || { echo "stdout differs from $exp.out"; fail=1; }
else
  echo "missing $exp.out (run with UPDATE=1 to create it)"; fail=1
fi
if [ -f "$exp.err" ]; then
  diff -u "$exp.err" "$err" || { echo "stderr differs from $exp.err"; fail=1; }
elif [ -s "$err" ]; then
  echo "unexpected stderr:"; cat "$err"; fail=1
fi
exit $fail
