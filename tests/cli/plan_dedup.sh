#!/usr/bin/env bash
# plan_dedup.sh CPLANC: `cplanc plan` lists a plan once. The search tries recompute none, selective
# and full for every configuration; where a mode changes nothing in the program (recompute.c clones
# no node: `full` without a layer loop, `selective` without attention) or predicts exactly what
# recompute none does, only the recompute none row is listed. Checked on tests/golden/plan_auto.cplan
# with L = 0 (no layers, no attention: every row recompute none), on a model with one attention
# block outside any layer loop (selective recomputes its sdpa, full nothing: no full row), and with
# its 2 layers (each mode changes the program: all three are still listed).  A few seconds.
set -u
cplanc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_plan_dedup.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
cp "$here/../golden/plan_auto.cplan" "$tmp/m.cplan"
# one attention block, no layer loop
sed -e 's/for i in 0..L as "h" {/if true {/' "$here/../golden/plan_auto.cplan" >"$tmp/block.cplan"
cd "$tmp" || exit 1
export CPLAN_CPU_MEMORY=24GiB

# check LABEL JSON TEXT MODES: no two candidates differ in recompute only with the same predictions,
# the recompute modes listed are exactly MODES (comma-separated), and the table lists the JSON's
# candidates
check() {
  python3 - "$@" <<'PY' || exit 1
import json, re, sys
label, pj, tt, modes = sys.argv[1:]
def die(msg): sys.exit("FAILED: %s: %s" % (label, msg))
p = json.load(open(pj))
cands = p["candidates"]
keys = "dp tp pp sp zero micro microbatches pipeline".split()
seen = {}
for c in cands:
    k = tuple(c[x] for x in keys)
    if k in seen:
        a = seen[k]
        same = all(a[x] == c[x] for x in ("step_time_s", "memory_per_device_bytes", "comm_bytes_per_device"))
        if same:
            die("listed twice, recompute %s and %s: %s" % (a["recompute"], c["recompute"], k))
    seen.setdefault(k, c)
got = sorted({c["recompute"] for c in cands})
if got != sorted(modes.split(",")):
    die("recompute modes listed: %s, expected %s" % (got, modes))
rows = [l.split() for l in open(tt) if re.match(r"\s*\d+ +\d+ +\d+\*? +\d+ +\d+ ", l)]
if len(rows) != len(cands):
    die("the table has %d rows, --json %d candidates" % (len(rows), len(cands)))
for r, c in zip(rows, cands):
    if r[8] != c["recompute"] or int(r[1]) != c["dp"] or int(r[5]) != c["zero"]:
        die("table row %s is not candidate %s" % (r, c))
print("%s: %d plans listed, recompute %s" % (label, len(cands), ",".join(got)))
PY
}

run() { # LABEL FILE MODES SETS...
  local label=$1 file=$2 modes=$3
  shift 3
  "$cplanc" plan "$file" --top 40 --json "$@" >p.json 2>err.txt || { cat err.txt; fail "$label: plan --json"; }
  "$cplanc" plan "$file" --top 40 "$@" >t.txt 2>err.txt || { cat err.txt; fail "$label: plan"; }
  check "$label" p.json t.txt "$modes"
}

run "no layers" m.cplan none --set 'train.model=gpt(L = 0)'
run "attention outside layers" block.cplan none,selective
run "2 layers" m.cplan full,none,selective
echo "plan_dedup.sh: ok"
