#!/usr/bin/env bash
# scaling.sh [CPLANC] [STEPS]: data-parallel scaling of bench/gpt_bench.cplan (GPT, C 256, 4
# layers, T 128, batch 8: 3.3M params) on 1, 2 and 4 CPU ranks under mpirun (loopback,
# --oversubscribe).  Each rank count is a build of the same model with a mesh of N CPU devices
# and dp = N pinned (`--set`), run for STEPS steps (default 8) with --metrics and --trace.
# It prints per rank count: the median step time (the first 2 steps are warm-up), tokens/s, the
# time rank 0 spent in collectives per step (from the trace), and the bytes communicated per step
# per rank: MEASURED = the metrics' comm_bytes (the payload rt_comm handed to MPI; for the
# gradient all-reduce, the gradient bytes) turned into ring all-reduce wire bytes (x 2(N-1)/N),
# next to PREDICTED = the sum of `cplanc plan --json`'s collectives (bytes x per_step, the same
# ring model applied by the compiler to the placements), and their ratio.  The small scalar
# all-reduces of the runtime (loss means, agreement flags) are in the measured bytes only.
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
echo "scaling: gpt_bench.cplan, dp on 1, 2 and 4 CPU ranks, $steps steps each (median of steps 3..$steps)"
echo "machine: $cpus CPUs online; each rank gets $cpus/N compute threads (at least 1)"
[ "$cpus" -lt 4 ] && echo "note: 4 ranks oversubscribe the $cpus cores (mpirun --oversubscribe): that row measures contention, not scaling"
rows=()
for n in 1 2 4; do
  sets=(--set train.mesh=laptop --set "mesh.laptop.shape.cpu=$n")
  [ "$n" -gt 1 ] && sets+=(--set "train.strategy.dp=$n")
  "$cplanc" build gpt_bench.cplan -o "prog$n" "${sets[@]}" 2>"build$n.log" || { cat "build$n.log"; exit 1; }
  "$cplanc" plan --json gpt_bench.cplan "${sets[@]}" >"plan$n.json" 2>/dev/null || { echo "cplanc plan failed"; exit 1; }
  run=("./prog$n")
  [ "$n" -gt 1 ] && run=("${MPIEXEC:-mpirun}" --oversubscribe -np "$n" "./prog$n")
  timeout 300 "${run[@]}" --steps "$steps" --metrics "m$n.jsonl" --trace "t$n.json" 2>"run$n.log" ||
    { cat "run$n.log"; echo "scaling.sh: the $n-rank run failed"; exit 1; }
  rows+=("$n")
done

python3 - "${rows[@]}" <<'PY'
import json, statistics, sys
hdr = ("ranks", "step ms", "tokens/s", "comm ms", "comm payload", "measured wire", "predicted", "ratio")
print("%5s %9s %9s %8s %13s %14s %10s %6s" % hdr)
print("%5s %9s %9s %8s %13s %14s %10s %6s" % ("", "(median)", "", "/step", "MB/step/rank", "MB/step/rank", "MB (plan)", ""))
for n in map(int, sys.argv[1:]):
    m = [json.loads(l) for l in open("m%d.jsonl" % n)]
    timed = m[2:] if len(m) > 2 else m
    ms = statistics.median(x["ms"] for x in timed)
    tps = statistics.median(x["tokens_per_s"] for x in timed)
    payload = statistics.median(x.get("comm_bytes", 0) for x in timed)
    wire = payload * 2 * (n - 1) / n
    plan = json.load(open("plan%d.json" % n))
    pred = sum(c["bytes"] * c.get("per_step", 1) for c in plan.get("collectives", []))
    ev = json.load(open("t%d.json" % n))
    comm_us = sum(e["dur"] for e in ev if e.get("ph") == "X" and e["pid"] == 0 and e["tid"] == 1
                  and e["args"].get("step", -1) >= 2)
    comm_ms = comm_us / 1e3 / max(1, len(timed))
    ratio = "%.4f" % (wire / pred) if pred else "-"
    print("%5d %9.1f %9.0f %8.1f %13.3f %14.3f %10.3f %6s" % (n, ms, tps, comm_ms, payload / 1e6, wire / 1e6, pred / 1e6, ratio))
    last = m[-1]
    if "peak_rss_bytes" in last:
        print("      rank 0 memory: peak RSS %.1f MB, arenas %.1f MB" % (last["peak_rss_bytes"] / 1e6, last["arena_bytes"] / 1e6))
print("measured wire = comm payload x 2(N-1)/N (ring all-reduce); predicted = sum of cplanc plan --json's collectives")
PY
