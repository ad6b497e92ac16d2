#!/usr/bin/env bash
# plan.sh [CPLANC]: the strategy search on the GPT-3 family (bench/gpt3.cplan: 1.3B, 2.7B, 6.7B,
# 13B and 175B, the batch sizes of the GPT-3 paper) on 8 to 1,024 A100 80GB (DGX nodes of 8, NVLink
# inside a node, 200 Gb/s InfiniBand between nodes).  For each model and GPU count it runs
# `cplanc plan --top 1` and prints the chosen plan, its predicted step time, TFLOP/s per GPU and
# MFU (model FLOPs 6·N·tokens without recompute, against 312 TFLOP/s bf16 dense), memory per GPU,
# and the wall time of the whole `cplanc plan` process (parse, elaborate, search, print): the
# search time.  Baseline for the figures: Megatron-LM reports 135-163 TFLOP/s per A100 (43-52%
# MFU) for GPT models of 1.7B-1T on 32-3072 GPUs (Narayanan et al. 2021, table 1); Alpa spends
# about 40 minutes compiling GPT-39B for 64 GPUs.  A benchmark: it prints, never asserts.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cplanc=${1:-$here/../build/cplanc}
[ -x "$cplanc" ] || { echo "plan.sh: no cplanc at $cplanc (build it, or pass its path)"; exit 2; }
python3 - "$cplanc" "$here/gpt3.cplan" <<'PY'
import re, subprocess, sys, time
cplanc, src = sys.argv[1], sys.argv[2]
models = [  # name, layers, hidden, heads, batch (sequences of 2048 tokens)
    ("1.3B", 24, 2048, 16, 512), ("2.7B", 32, 2560, 32, 512), ("6.7B", 32, 4096, 32, 1024),
    ("13B", 40, 5120, 40, 1024), ("175B", 96, 12288, 96, 1536)]
gpus = [8, 64, 256, 1024]
print("plan.sh: cplanc plan on bench/gpt3.cplan, A100 80GB, DGX nodes of 8 (search time = wall time of cplanc plan)")
hdr = ("model", "GPUs", "batch", "dp", "tp", "pp", "sp", "zero", "micro", "mbs", "recompute", "schedule",
       "step", "TFLOP/s/GPU", "MFU", "memory/GPU", "search")
fmt = "%-5s %5s %5s %4s %3s %3s %3s %4s %5s %4s %-9s %-11s %9s %11s %6s %11s %8s"
print(fmt % hdr)
worst = 0
for name, L, C, H, batch in models:
    for n in gpus:
        if batch % (n // min(n, 64)) and False:
            continue
        sets = ["--set", "train.model.L=%d" % L, "--set", "train.model.C=%d" % C, "--set", "train.model.heads=%d" % H,
                "--set", "train.batch=%d" % batch, "--set", "mesh.cluster.shape.node=%d" % (n // 8)]
        t0 = time.monotonic()
        r = subprocess.run([cplanc, "plan", src, "--top", "1"] + sets, capture_output=True, text=True)
        dt = time.monotonic() - t0
        worst = max(worst, dt)
        if r.returncode != 0:
            err = [l for l in r.stderr.splitlines() if "error:" in l]
            print("%-5s %5d %5d  %s   (%.2f s)" % (name, n, batch, err[0].split("error: ")[1] if err else "failed", dt))
            continue
        row = next(l for l in r.stdout.splitlines() if re.match(r"\s+1\s", l)).split()
        best = next(l for l in r.stdout.splitlines() if l.startswith("best:"))
        tf = re.search(r"([\d.]+) TFLOP/s per device", best)
        # rank dp tp pp sp zero micro mbs recompute schedule step(2) tokens mfu mem(2) comm(2) bubble
        step = row[10] + " " + row[11]
        print(fmt % (name, n, batch, row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[9], step,
                     tf.group(1) if tf else "?", row[13], row[14] + " " + row[15], "%.2f s" % dt))
print("slowest search: %.2f s" % worst)
PY
