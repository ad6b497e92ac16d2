#!/usr/bin/env bash
# cpu_step.sh [CPLANC] [STEPS]: the CPU training-step benchmark. Trains bench/gpt_bench.cplan
# (GPT, C 256, 4 layers, 8 heads, T 128, batch 8, vocab 512) for STEPS steps (default 20) on 2
# threads with cplan (`cplanc build`, then the program with --threads 2 --steps --metrics) and
# with PyTorch on the same model, initial params, data and thread count (bench/torch_step.py),
# and prints the median step time, tokens/s and achieved GFLOP/s of each and their ratio.
# FLOPs per step are cplan's count (`check --json`: 3 x forward, matmuls at 2 per multiply-add),
# the same for both. The first 2 steps are warm-up and left out of the median.
# A benchmark, not a test: it never asserts on time. The ceiling, measured on this machine at each
# run by bench/sgemm_peak.c: OpenBLAS sgemm 1024^3 on the same threads (DESIGN.md §9 quotes 68
# GFLOP/s on 2 cores; machines of this kind have measured ~300 since).
set -u
here=$(cd "$(dirname "$0")" && pwd)
cplanc=${1:-$here/../build/cplanc}
steps=${2:-20}
threads=2
py=${CPLAN_PYTHON:-/usr/bin/python3}   # Debian's python3-torch lives there, not in a pyenv
# shellcheck source=bench_lib.sh
. "$here/bench_lib.sh"
bench_init cpu_step.sh "$cplanc" gpt_bench.cplan
"$cplanc" check --json gpt_bench.cplan >plan.json 2>/dev/null || { echo "cplanc check failed"; exit 1; }

# Tokens for steps + 1 batches without wrapping around: uniform random below the vocab.
"$py" - "$steps" <<'PY' || exit 1
import json, sys
import numpy as np
plan = json.load(open("plan.json"))
n, t = plan["train"]["batch"], plan["seq_len"]
vocab = next(p["shape"][0] for p in plan["param_tensors"] if p["name"] == "wte")
count = (int(sys.argv[1]) + 1) * n * t + 1
toks = np.random.default_rng(1).integers(0, vocab, count).astype(np.uint16)
header = np.zeros(256, np.int32); header[:3] = [20240520, 1, count]
open("bench_tokens.bin", "wb").write(header.tobytes() + toks.tobytes())
PY

echo "cpu_step: gpt_bench.cplan, $steps steps, $threads threads ($(nproc) CPUs online)"
have_cplan=1
if ! "$cplanc" build gpt_bench.cplan -o prog >build.log 2>&1; then
  echo "cplan: 'cplanc build' failed, so only PyTorch is timed:"; sed 's/^/  /' build.log | tail -n 5
  have_cplan=0
elif ! ./prog --threads $threads --steps "$steps" --metrics cplan.jsonl --save-init init.safetensors \
         --quiet >train.log 2>&1; then
  echo "cplan: the program failed, so only PyTorch is timed:"; sed 's/^/  /' train.log | tail -n 5
  have_cplan=0
fi
init=()
[ -f init.safetensors ] && init=(--init init.safetensors)
OMP_NUM_THREADS=$threads "$py" "$here/torch_step.py" --plan plan.json "${init[@]}" \
  --tokens bench_tokens.bin --heads 8 --steps "$steps" --threads $threads >torch.jsonl \
  || { echo "torch_step.py failed"; exit 1; }
[ $have_cplan = 1 ] || rm -f cplan.jsonl

"$py" - <<'PY'
import json, os, statistics
plan = json.load(open("plan.json"))
tr = plan["train"]
flops = tr["training_flops"] / tr["steps"]          # per optimizer step
tokens = tr["batch"] * plan["seq_len"]
def summary(path):
    if not os.path.exists(path):
        return None
    recs = [json.loads(l) for l in open(path) if l.strip()]
    recs = [r for r in recs if "ms" in r and "step" in r]
    ms = statistics.median(r["ms"] for r in recs[2:] or recs)
    return ms, recs[-1]["loss"]
print(f"per step: {tokens} tokens, {flops / 1e9:.2f} GFLOP (forward + backward)")
print(f"{'':8} {'median ms':>10} {'tokens/s':>10} {'GFLOP/s':>8} {'last loss':>10}")
rows = {}
for name, path in (("cplan", "cplan.jsonl"), ("pytorch", "torch.jsonl")):
    s = summary(path)
    if s is None:
        print(f"{name:8} {'(not run)':>10}")
        continue
    rows[name] = s[0]
    print(f"{name:8} {s[0]:10.1f} {tokens / s[0] * 1e3:10.0f} {flops / s[0] / 1e6:8.1f} {s[1]:10.4f}")
if len(rows) == 2:
    print(f"cplan / pytorch speed: {rows['pytorch'] / rows['cplan']:.2f}x")
PY
if cc -O2 "$here/sgemm_peak.c" -o "$tmp/sgemm_peak" $(pkg-config --cflags --libs openblas) 2>/dev/null; then
  echo "ceiling: OpenBLAS sgemm 1024^3 on this machine: $(OPENBLAS_NUM_THREADS=$threads "$tmp/sgemm_peak") GFLOP/s on $threads threads, $(OPENBLAS_NUM_THREADS=1 "$tmp/sgemm_peak") on 1"
else
  echo "ceiling: (could not build bench/sgemm_peak.c)"
fi
