#!/usr/bin/env bash
# plan_measured.sh [CPLANC] [--quick | --profile P.json] [--steps N] [--only LIST] [--set K=V ...] [--json FILE]:
# the cost model against this machine.  Calibrates it as 2 CPU devices (`cplanc calibrate --np 2`;
# --quick: `--quick`, rough figures), plans bench/gpt_bench.cplan on a mesh of those 2 devices
# (`device = profile(...)`), and for the search's best plan and a few pinned strategies builds the
# plan `cplanc plan --json` predicted (`cplanc build --plan`, so what runs is exactly what was
# costed), runs it under `mpirun -np 2 --oversubscribe` for N steps (default 10) with --metrics and
# --trace, and prints per plan:
#   predicted step time (the plan's step_time_s)  vs  measured: the median of the metrics' ms,
#     leaving out the first 2 steps (warm-up);
#   predicted bytes sent per device per step (comm_bytes_per_device)  vs  measured: rank 0's
#     collectives of one step from the trace (every group; the metrics' comm_bytes counts the world
#     group only), each call's payload turned into the bytes a ring sends per device (all-reduce
#     2(n-1)/n of the buffer, reduce-scatter (n-1)/n of the input, all-gather n-1 own shards,
#     point-to-point the message), n = 2; beside them the sum of the plan's explained collectives
#     (`collectives` in the JSON: the placements the lowering runs) and the metrics' comm_bytes.
# --profile uses a profile calibrated before (2 ranks) instead of calibrating.
# --only picks plans by name (best,dp,tp,pp,zero1; also zero2, zero3: 2 micro-batches; tp_rule and tp_ilp:
# the fastest tp = 2 plan with the params placed by Megatron's rule, and by the search's ILP, at batch 7
# so that tp is the search's); --set adds `cplanc --set` overrides (a smaller
# model: --set train.model.L=2); --json writes the rows for tests/cli/plan_measured.sh.
# A benchmark, not a test: it prints, never asserts.  About 2 minutes on 2 cores (--quick with a
# small model and few steps: seconds).
set -u
here=$(cd "$(dirname "$0")" && pwd)
cplanc=$here/../build/cplanc
quick=0 steps=10 only="best,dp,tp,pp,zero1" json="" profile="" sets=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --profile) profile=$2; shift ;;
    --steps) steps=$2; shift ;;
    --only) only=$2; shift ;;
    --set) sets+=(--set "$2"); shift ;;
    --json) json=$2; shift ;;
    -*) echo "plan_measured.sh: unknown option $1"; exit 2 ;;
    *) cplanc=$1 ;;
  esac
  shift
done
[ -x "$cplanc" ] || { echo "plan_measured.sh: no cplanc at $cplanc (build it, or pass its path)"; exit 2; }
cplanc=$(cd "$(dirname "$cplanc")" && pwd)/$(basename "$cplanc")
[ -n "$json" ] && json=$(cd "$(dirname "$json")" && pwd)/$(basename "$json")
[ -n "$profile" ] && { [ -r "$profile" ] || { echo "plan_measured.sh: cannot read $profile"; exit 2; }; profile=$(cd "$(dirname "$profile")" && pwd)/$(basename "$profile"); }
mpirun=${MPIEXEC:-mpirun}
command -v "$mpirun" >/dev/null || { echo "plan_measured.sh: no mpirun"; exit 2; }
export CPLAN_MPIEXEC=$mpirun
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader

# name: the strategy pinned (everything else the search decides; the plan built is the one costed)
pin() {
  case $1 in
    best) ;;
    dp) echo train.strategy.dp=2 train.strategy.zero=0 train.strategy.recompute='"none"' ;;
    tp) echo train.strategy.tp=2 train.strategy.dp=1 train.strategy.recompute='"none"' ;;
    # a pinned tp places as Megatron's rule does: a batch of 7 (no dp = 2) leaves tp to the search,
    # which then ranks the ILP's placements too
    tp_rule|tp_ilp) echo train.batch=7 ;;
    pp) echo train.strategy.pp=2 train.strategy.dp=1 train.strategy.micro=2 train.strategy.pipeline='"1f1b"' train.strategy.recompute='"none"' ;;
    zero1) echo train.strategy.dp=2 train.strategy.zero=1 train.strategy.recompute='"none"' ;;
    zero2) echo train.strategy.dp=2 train.strategy.zero=2 train.strategy.micro=2 train.strategy.recompute='"none"' ;;
    zero3) echo train.strategy.dp=2 train.strategy.zero=3 train.strategy.micro=2 train.strategy.recompute='"none"' ;;
    *) return 1 ;;
  esac
}
for name in ${only//,/ }; do
  pin "$name" >/dev/null || { echo "plan_measured.sh: unknown plan '$name' (best, dp, tp, pp, zero1, zero2, zero3, tp_rule, tp_ilp)"; exit 2; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_plan_measured.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
{ cat "$here/gpt_bench.cplan"; printf '\nmesh laptop {\n  shape  = [cpu = 2]\n  device = profile("p.json")\n}\n'; } >g.cplan
sets=(--set train.mesh=laptop "${sets[@]}")

if [ -n "$profile" ]; then
  cp "$profile" p.json
  echo "profile: $profile"
else
  cal=(calibrate -o p.json --np 2)
  [ "$quick" = 1 ] && cal+=(--quick)
  "$cplanc" "${cal[@]}" >cal.log 2>&1 || { cat cal.log; echo "plan_measured.sh: calibration failed"; exit 1; }
  grep -E "fit \(ring|-> hbm|-> flops|^  (layer_norm|softmax|gelu) " cal.log | sed 's/^ */  /'
fi

# The batch and sequence of the (possibly overridden) model, for the tokens file.
"$cplanc" check --json g.cplan "${sets[@]}" >check.json 2>check.log || { cat check.log; exit 1; }
python3 - "$steps" <<'PY' || exit 1
import json, random, struct, sys
c = json.load(open("check.json"))
n, t = c["train"]["batch"], c["seq_len"]
vocab = next(p["shape"][0] for p in c["param_tensors"] if p["name"] == "wte")
count = (int(sys.argv[1]) + 1) * n * t + 1
rng = random.Random(1)
header = struct.pack("<256i", 20240520, 1, count, *([0] * 253))
open("bench_tokens.bin", "wb").write(header + struct.pack("<%dH" % count, *(rng.randrange(vocab) for _ in range(count))))
PY

names=()
for name in ${only//,/ }; do
  pins=$(pin "$name") || { echo "plan_measured.sh: unknown plan '$name' (best, dp, tp, pp, zero1, zero2, zero3, tp_rule, tp_ilp)"; exit 2; }
  ps=()
  for kv in $pins; do ps+=(--set "$kv"); done
  top=()
  case $name in tp_rule|tp_ilp) top=(--top 100) ;; esac
  "$cplanc" plan --json g.cplan "${sets[@]}" "${ps[@]}" "${top[@]}" >"plan_$name.json" 2>"plan_$name.log" ||
    { cat "plan_$name.log"; echo "plan_measured.sh: cplanc plan ($name) failed"; exit 1; }
  if [ "$name" = tp_rule ] || [ "$name" = tp_ilp ]; then # the fastest candidate placed that way, as the plan's best
    python3 - "plan_$name.json" "$name" <<'PY' || { echo "plan_measured.sh: no $name plan"; exit 1; }
import json, sys
path, name = sys.argv[1], sys.argv[2]
d = json.load(open(path))
c = [p for p in d["candidates"] if p["tp"] == 2 and ("tp_params" in p) == (name == "tp_ilp")]
if not c:
    sys.exit("plan_measured.sh: the search ranks no %s plan (the ILP placed the params as the rule does?)" % name)
d["best"] = c[0]
json.dump(d, open(path, "w"))
PY
  fi
  "$cplanc" build g.cplan "${sets[@]}" "${ps[@]}" --plan "plan_$name.json" -o "prog_$name" 2>"build_$name.log" ||
    { cat "build_$name.log"; echo "plan_measured.sh: cplanc build ($name) failed"; exit 1; }
  timeout 600 "$mpirun" --oversubscribe -np 2 "./prog_$name" --steps "$steps" --metrics "m_$name.jsonl" \
    --trace "t_$name.json" >"run_$name.log" 2>&1 ||
    { tail -20 "run_$name.log"; echo "plan_measured.sh: the $name run failed"; exit 1; }
  names+=("$name")
done

python3 - "$json" "$steps" "${names[@]}" <<'PY'
import json, statistics, sys
out, steps, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
n = 2  # every group of a 2-device mesh
wire = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": n - 1,
        "all_to_all": (n - 1) / n, "send": 1, "isend": 1, "broadcast": 1}
rows = []
for name in names:
    plan = json.load(open("plan_%s.json" % name))
    best = plan["best"]
    explained = sum(c["bytes"] * c.get("per_step", 1) for c in plan.get("collectives", []))
    m = [json.loads(l) for l in open("m_%s.jsonl" % name)]
    timed = m[2:] if len(m) > 2 else m
    ms = statistics.median(x["ms"] for x in timed)
    metrics_comm = statistics.median(x.get("comm_bytes", 0) for x in timed)
    ev = [e for e in json.load(open("t_%s.json" % name)) if e.get("ph") == "X" and e.get("cat") == "comm" and e["pid"] == 0]
    per_step, kinds = {}, {}
    for e in ev:
        s = e["args"].get("step", -1)
        b = e["args"].get("bytes", 0) * wire.get(e["name"], 1)
        per_step[s] = per_step.get(s, 0) + b
        if s == steps:  # steps count from 1, as the metrics lines do
            kinds[e["name"]] = kinds.get(e["name"], 0) + b
    comm = statistics.median(per_step.get(s, 0) for s in range(3 if steps > 2 else 1, steps + 1))
    pred_ms = best["step_time_s"] * 1e3
    pred_comm = best["comm_bytes_per_device"]
    rows.append({"name": name, "dp": best["dp"], "tp": best["tp"], "pp": best["pp"], "sp": best["sp"], "zero": best["zero"],
                 "micro": best["micro"], "microbatches": best["microbatches"], "pipeline": best.get("pipeline", "-"),
                 "predicted_ms": pred_ms, "measured_ms": ms, "time_ratio": ms / pred_ms,
                 "predicted_comm_bytes": pred_comm, "measured_comm_bytes": comm, "metrics_comm_bytes": metrics_comm,
                 "comm_ratio": comm / pred_comm if pred_comm else None, "explained_comm_bytes": explained, "comm_by_call": kinds})
hdr = ("plan", "dp", "tp", "pp", "sp", "zero", "micro", "mbs", "predicted", "measured", "ratio", "predicted", "measured", "ratio",
       "explained", "metrics")
fmt = "%-6s %3s %3s %3s %3s %4s %5s %4s %10s %10s %6s %11s %11s %6s %10s %10s"
print(fmt % hdr)
print(fmt % ("", "", "", "", "", "", "", "", "ms/step", "ms/step", "meas/", "MB/step/dev", "MB/step/dev", "meas/", "MB", "comm_bytes"))
print(fmt % ("", "", "", "", "", "", "", "", "", "(median)", "pred", "", "(trace)", "pred", "", "MB"))
for r in rows:
    cr = "%.3f" % r["comm_ratio"] if r["comm_ratio"] is not None else "-"
    print("%-6s %3d %3d %3d %3d %4d %5d %4d %10.1f %10.1f %6.2f %11.3f %11.3f %6s %10.3f %10.3f" %
          (r["name"], r["dp"], r["tp"], r["pp"], r["sp"], r["zero"], r["micro"], r["microbatches"], r["predicted_ms"],
           r["measured_ms"], r["time_ratio"], r["predicted_comm_bytes"] / 1e6, r["measured_comm_bytes"] / 1e6, cr,
           r["explained_comm_bytes"] / 1e6, r["metrics_comm_bytes"] / 1e6))
for r in rows:
    print("  %-6s measured bytes by call (one step, rank 0, as sent): %s" %
          (r["name"], ", ".join("%s %.3f MB" % (k, v / 1e6) for k, v in sorted(r["comm_by_call"].items()) if v > 0)))
print("ratio = measured / predicted; measured comm = rank 0's collectives from the trace as ring bytes sent per device;")
print("explained = the sum of the plan's collectives (--explain: the placements the lowering runs; pp sends not included);")
print("metrics comm_bytes = the payload of the world group's calls only (the runtime's scalar reductions, pure dp's gradients)")
if out:
    json.dump(rows, open(out, "w"), indent=1)
PY
