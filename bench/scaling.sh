#!/usr/bin/env bash
# scaling.sh [CPLANC] [STEPS]: bench/gpt_bench.cplan (GPT, C 256, 4 layers, T 128, batch 8:
# 3.3M params) on 1, 2 and 4 CPU ranks under mpirun (loopback, --oversubscribe), with dp = 2 and
# 4, tp = 2 and 4, dp = 2 x tp = 2 and pp = 2 (1F1B and interleaved, 4 micro-batches) pinned (`--set`), each run
# for STEPS steps (default 8) with --metrics and --trace.
# It prints per strategy: the median step time (the first 2 steps are warm-up), tokens/s, the
# time rank 0 spent in collectives per step (from the trace), and the bytes rank 0 sent per step:
# MEASURED = every collective of its trace turned into ring wire bytes (all-reduce 2(n-1)/n of the
# tensor, all-gather and reduce-scatter (n-1)/n of the whole tensor, sends their payload; n the
# group's size), next to PREDICTED = the sum of `cplanc plan --json`'s collectives (bytes x
# per_step: the same ring model applied by the compiler to the placements), and their ratio. The
# small scalar all-reduces of the runtime (loss means, agreement flags) are in the measured bytes
# only; pipeline sends are not in the plan's collectives (listed apart, p2p).
# A benchmark, not a test: it prints, never asserts on time.  Under 2 minutes on 2 cores.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cplanc=${1:-$here/../build/cplanc}
steps=${2:-8}
[ -x "$cplanc" ] || { echo "scaling.sh: no cplanc at $cplanc (build it, or pass its path)"; exit 2; }
cplanc=$(cd "$(dirname "$cplanc")" && pwd)/$(basename "$cplanc")
command -v "${MPIEXEC:-mpirun}" >/dev/null || { echo "scaling.sh: no mpirun"; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_scaling.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
{ cat "$here/gpt_bench.cplan"; printf '\nmesh laptop {\n  shape  = [cpu = 1]\n  device = cpu\n}\n'; } >gpt_bench.cplan

# Tokens for steps + 1 batches of 8 x 128 without wrapping: uniform random below the vocab of 512.
python3 - "$steps" <<'PY' || exit 1
import random, struct, sys
count = (int(sys.argv[1]) + 1) * 8 * 128 + 1
rng = random.Random(1)
header = struct.pack("<256i", 20240520, 1, count, *([0] * 253))
open("bench_tokens.bin", "wb").write(header + struct.pack("<%dH" % count, *(rng.randrange(512) for _ in range(count))))
PY

cpus=$(nproc)
echo "scaling: gpt_bench.cplan on 1, 2 and 4 CPU ranks (dp, tp, dp x tp, pp), $steps steps each (median of steps 3..$steps)"
echo "machine: $cpus CPUs online; each rank gets $cpus/N compute threads (at least 1)"
[ "$cpus" -lt 4 ] && echo "note: 4 ranks oversubscribe the $cpus cores (mpirun --oversubscribe): that row measures contention, not scaling"
rows=()
for cfg in "1 1" "dp2 2 dp=2" "dp4 4 dp=4" "tp2 2 tp=2" "tp4 4 tp=4" "dp2tp2 4 dp=2 tp=2" "pp2 2 pp=2 micro=2" \
           "pp2ilv 2 pp=2 micro=2 pipeline=\"interleaved\""; do
  read -r name n fields <<<"$cfg"
  sets=(--set train.mesh=laptop --set "mesh.laptop.shape.cpu=$n")
  for f in $fields; do sets+=(--set "train.strategy.$f"); done
  "$cplanc" build gpt_bench.cplan -o "prog_$name" "${sets[@]}" 2>"build_$name.log" || { cat "build_$name.log"; exit 1; }
  "$cplanc" plan --json gpt_bench.cplan "${sets[@]}" >"plan_$name.json" 2>/dev/null || { echo "cplanc plan failed"; exit 1; }
  run=("./prog_$name")
  [ "$n" -gt 1 ] && run=("${MPIEXEC:-mpirun}" --oversubscribe -np "$n" "./prog_$name")
  timeout 300 "${run[@]}" --steps "$steps" --metrics "m_$name.jsonl" --trace "t_$name.json" 2>"run_$name.log" ||
    { cat "run_$name.log"; echo "scaling.sh: the $name run failed"; exit 1; }
  rows+=("$name:$n:${fields// /,}")
done

python3 - "${rows[@]}" <<'PY'
import json, statistics, sys
hdr = ("strategy", "ranks", "step ms", "tokens/s", "comm ms", "measured", "predicted", "ratio", "p2p")
print("%-14s %5s %9s %9s %8s %12s %12s %6s %9s" % hdr)
print("%-14s %5s %9s %9s %8s %12s %12s %6s %9s" % ("", "", "(median)", "", "/step", "MB/step", "MB (plan)", "", "MB/step"))
for row in sys.argv[1:]:
    name, n, fields = row.split(":")
    n = int(n)
    deg = dict(f.split("=") for f in fields.split(",") if "=" in f)
    size = {"world": n, "axis dp": int(deg.get("dp", n // (int(deg.get("tp", 1)) * int(deg.get("pp", 1))))),
            "axis tp": int(deg.get("tp", 1)), "axis pp": int(deg.get("pp", 1))}
    m = [json.loads(l) for l in open("m_%s.jsonl" % name)]
    timed = m[2:] if len(m) > 2 else m
    ms = statistics.median(x["ms"] for x in timed)
    tps = statistics.median(x["tokens_per_s"] for x in timed)
    ev = [e for e in json.load(open("t_%s.json" % name))
          if e.get("ph") == "X" and e["pid"] == 0 and e["tid"] == 1 and e["args"].get("step", -1) >= 3]
    wire = p2p = 0.0
    for e in ev:
        b, g = e["args"].get("bytes", 0), size.get(e["args"].get("group", "world"), n)
        if e["name"] == "all_reduce": wire += b * 2 * (g - 1) / g
        elif e["name"] == "all_gather": wire += b * (g - 1)          # b: this rank's part
        elif e["name"] in ("reduce_scatter", "all_to_all"): wire += b * (g - 1) / g  # b: the whole tensor
        elif e["name"] in ("send", "isend"): p2p += b
        elif e["name"] == "broadcast": wire += b * (g - 1) / g
    k = max(1, len(timed))
    wire, p2p = wire / k, p2p / k
    comm_ms = sum(e["dur"] for e in ev) / 1e3 / k
    plan = json.load(open("plan_%s.json" % name))
    pred = sum(c["bytes"] * c.get("per_step", 1) for c in plan.get("collectives", []))
    ratio = "%.3f" % (wire / pred) if pred else "-"
    print("%-14s %5d %9.1f %9.0f %8.1f %12.3f %12.3f %6s %9.3f" % (fields or "1 device", n, ms, tps, comm_ms, wire / 1e6, pred / 1e6, ratio, p2p / 1e6))
    last = m[-1]
    if "peak_rss_bytes" in last:
        print("%-14s       rank 0: peak RSS %.1f MB, arenas %.1f MB (params %.1f MB)" % ("", last["peak_rss_bytes"] / 1e6,
              last["arena_bytes"] / 1e6, last.get("param_bytes", 0) / 1e6))
print("measured: rank 0's collectives per step as ring wire bytes; predicted: cplanc plan --json's collectives")
PY
