#!/usr/bin/env bash
# zero3_bytes.sh CPLANC SRCDIR: the bytes `cplanc plan --explain` lists for ZeRO 3 are the bytes the
# built program sends. gpt_small on 2 CPU ranks with dp = 2, zero = 3 and 2 micro-batches per step
# (recompute none, and full): the program gathers each param before its forward use and again for
# its backward (lower.c regather; under full recompute the recomputed forward gathers it a third
# time), reduce-scatters its gradient per micro-batch. Measured: rank 0's collectives of step 3
# from the program's --trace, each turned into the bytes a ring sends per device (all-reduce
# 2(n-1)/n of the buffer, reduce-scatter (n-1)/n of its input, all-gather n-1 own shards), as
# bench/plan_measured.sh does. The explanation (`plan --json`'s collectives, bytes x per_step) must
# equal it up to the runtime's few scalar all-reduces (loss and metric means: under 64 bytes), and
# with recompute none the ranking's comm_bytes_per_device must equal the explanation (it leaves out
# only the gradient norm's 4-byte all-reduce).  A few seconds.
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi
e2e_tokens tokens.bin

{ cat "$src/tests/e2e/gpt_small.cplan"; printf '\nmesh two {\n  shape  = [cpu = 2]\n  device = cpu\n}\n'; } >m.cplan
for rc in none full; do
  sets=(--set train.mesh=two --set train.strategy.dp=2 --set train.strategy.zero=3 --set train.strategy.micro=1
        --set "train.strategy.recompute=\"$rc\"")
  "$cplanc" plan m.cplan "${sets[@]}" --json >"plan_$rc.json" 2>"plan_$rc.log" ||
    { cat "plan_$rc.log"; fail "cplanc plan --json ($rc)"; }
  "$cplanc" plan m.cplan "${sets[@]}" --explain >"explain_$rc.txt" 2>>"plan_$rc.log" ||
    { cat "plan_$rc.log"; fail "cplanc plan --explain ($rc)"; }
  e2e_build "z3_$rc" m.cplan "${sets[@]}"
  e2e_prog 0 "run_$rc" "$mpirun" -np 2 --oversubscribe "./z3_$rc" --steps 3 --trace "t_$rc.json" --quiet
  python3 - "$rc" <<'PY' || exit 1
import json, re, sys
rc = sys.argv[1]
n = 2
wire = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": n - 1,
        "all_to_all": (n - 1) / n, "send": 1, "isend": 1, "broadcast": 1}
def die(msg): sys.exit("FAILED: zero 3, recompute %s: %s" % (rc, msg))
plan = json.load(open("plan_%s.json" % rc))
explained = sum(c["bytes"] * c.get("per_step", 1) for c in plan["collectives"])
ev = json.load(open("t_%s.json" % rc))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
comm = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "comm" and e["pid"] == 0 and e["args"].get("step") == 3]
measured = sum(e["args"].get("bytes", 0) * wire.get(e["name"], 1) for e in comm)
gathers = sum(1 for e in comm if e["name"] == "all_gather")
listed = sum(c["per_step"] for c in plan["collectives"] if c["collective"] == "all-gather")
print("zero 3, recompute %s: explained %d bytes per device per step, measured %d (%d all-gathers, %d listed)"
      % (rc, explained, measured, gathers, listed))
if gathers != listed:
    die("the program runs %d all-gathers per step, the explanation lists %d" % (gathers, listed))
if not (0 <= measured - explained < 64):
    die("explained %d bytes per device per step, the program sent %d" % (explained, measured))
# the text's total is the JSON's (printed with cp_bytes_str: to 2 decimals of KiB)
text = open("explain_%s.txt" % rc).read()
m = re.search(r"^total on dp: ([0-9.]+) KiB per device per step$", text, re.M)
if not m or abs(float(m.group(1)) * 1024 - explained) > 0.01 * 1024:
    die("--explain's total (%s) is not the JSON's %d bytes" % (m and m.group(0), explained))
if "again for" not in text or "gathers each param again for its backward" not in text:
    die("--explain does not list the backward's all-gathers")
table = plan["best"]["comm_bytes_per_device"]
if rc == "none" and not (0 <= explained - table <= 8):
    die("the ranking predicts %d bytes per device per step, the explanation %d" % (table, explained))
PY
done
echo "zero3_bytes.sh: ok"
