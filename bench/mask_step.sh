#!/usr/bin/env bash
# mask_step.sh [CPLANC] [STEPS]: what the attention kernels' key mask saves on the CPU. Trains
# bench/bert_mask_bench.cplan (a BERT-style encoder, C 256, 4 layers, 8 heads, T 256, batch 8, with a
# padding mask over the keys) for STEPS steps (default 10) on 2 threads twice: with BERT's mask
# [B, 1, 1, T] (mask = 1: a key mask, which sdpa's kernels take, k_sdpa_fast_forward) and with the
# same mask broadcast to [B, 1, T, T] first (mask = 2: PyTorch's math form, the scores, their mask
# and softmax as separate nodes). It prints the arena `cplanc build` plans for each (the program's
# whole working memory), the median step time (the first 2 steps left out) and the losses, which
# agree: the two compute the same numbers. A benchmark, not a test: it never asserts on time.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cplanc=${1:-$here/../build/cplanc}
steps=${2:-10}
threads=2
py=${CPLAN_PYTHON:-/usr/bin/python3}   # Debian's numpy lives there, not in a pyenv
# shellcheck source=bench_lib.sh
. "$here/bench_lib.sh"
bench_init mask_step.sh "$cplanc" bert_mask_bench.cplan
# tokens below 8 for steps + 1 batches: token 0, which pads (the mask's keys out), about 1 in 8
"$py" - "$steps" <<'PY' || exit 1
import sys
import numpy as np
count = (int(sys.argv[1]) + 1) * 8 * 256 + 1
toks = np.random.default_rng(1).integers(0, 8, count).astype(np.uint16)
header = np.zeros(256, np.int32); header[:3] = [20240520, 1, count]
open("bench_tokens.bin", "wb").write(header.tobytes() + toks.tobytes())
PY

echo "mask_step: bert_mask_bench.cplan, $steps steps, $threads threads ($(nproc) CPUs online)"
for m in 1 2; do
  if ! "$cplanc" build bert_mask_bench.cplan -o prog$m --set train.model.mask=$m >build$m.log 2>&1; then
    echo "mask = $m: 'cplanc build' failed:"; tail -n 5 build$m.log; exit 1
  fi
  if ! ./prog$m --threads $threads --steps "$steps" --metrics m$m.jsonl --quiet >train$m.log 2>&1; then
    echo "mask = $m: the program failed:"; tail -n 5 train$m.log; exit 1
  fi
done

"$py" - <<'PY'
import json, re, statistics
print(f"{'':28} {'arena MiB':>10} {'median ms':>10} {'tokens/s':>10} {'last loss':>10}")
rows = {}
for m, name in ((1, "key mask [B,1,1,T] (kernel)"), (2, "mask [B,1,T,T] (math form)")):
    arena = float(re.search(r"arena ([0-9.]+) MiB", open(f"build{m}.log").read()).group(1))
    recs = [json.loads(l) for l in open(f"m{m}.jsonl") if l.strip()]
    recs = [r for r in recs if "ms" in r and "step" in r]
    ms = statistics.median(r["ms"] for r in recs[2:] or recs)
    rows[m] = (arena, ms)
    print(f"{name:28} {arena:10.1f} {ms:10.1f} {8 * 256 / ms * 1e3:10.0f} {recs[-1]['loss']:10.5f}")
print(f"key mask / math form: memory {rows[1][0] / rows[2][0]:.2f}x, speed {rows[2][1] / rows[1][1]:.2f}x")
PY
