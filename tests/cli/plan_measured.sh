#!/usr/bin/env bash
# The cost model against a run: bench/plan_measured.sh, quick (calibrate --quick --np 2, the
# gpt_bench model cut to C 128, 2 layers, T 64, 6 steps: about 12 ms a step), on the search's best
# plan and on pure dp = 2, each built from the plan `cplanc plan --json` costed and run under
# mpirun -np 2.  Checks
# that the best plan's measured median step time is within 10x either way of its prediction (a
# loaded 2-core machine is slow and noisy: a generous bound, not a performance claim), and that pure
# dp's bytes sent per device per step (the gradient all-reduce, deterministic) are within 2x of the
# predicted comm_bytes_per_device.  Prints the table and the ratios.
# Usage: plan_measured.sh CPLANC ROOT   (ctest sets MPIEXEC and the Open MPI variables)
set -u
cplanc=$1 root=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$root/bench/plan_measured.sh" "$cplanc" --quick --steps 6 --only best,dp --json "$dir/rows.json" \
  --set train.model.C=128 --set train.model.L=2 --set train.model.ctx=64 --set train.model.heads=4 \
  >"$dir/out" 2>&1
rc=$?
cat "$dir/out"
[ "$rc" = 0 ] || { echo "FAIL: bench/plan_measured.sh exited $rc"; exit 1; }
python3 - "$dir/rows.json" <<'PY'
import json, sys
rows = {r["name"]: r for r in json.load(open(sys.argv[1]))}
fail = []
best, dp = rows["best"], rows["dp"]
print("best plan (dp %d tp %d pp %d zero %d): measured / predicted step time = %.3f (%.2f ms / %.2f ms)"
      % (best["dp"], best["tp"], best["pp"], best["zero"], best["time_ratio"], best["measured_ms"], best["predicted_ms"]))
print("pure dp: measured / predicted bytes per device per step = %s (%.0f / %.0f)"
      % ("%.4f" % dp["comm_ratio"] if dp["comm_ratio"] else "-", dp["measured_comm_bytes"], dp["predicted_comm_bytes"]))
if not 0.1 <= best["time_ratio"] <= 10:
    fail.append("the best plan's step time is %.3fx its prediction (bound: 10x either way)" % best["time_ratio"])
if dp["dp"] != 2 or dp["tp"] != 1 or dp["pp"] != 1 or dp["zero"] != 0:
    fail.append("the dp row is not pure dp = 2: %r" % dp)
if not dp["predicted_comm_bytes"] > 0 or not dp["measured_comm_bytes"] > 0:
    fail.append("pure dp: no bytes predicted or measured")
elif not 0.5 <= dp["comm_ratio"] <= 2:
    fail.append("pure dp sends %.3fx the predicted bytes (bound: 2x)" % dp["comm_ratio"])
for f in fail:
    print("FAIL:", f)
sys.exit(1 if fail else 0)
PY
