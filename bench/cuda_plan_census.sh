#!/usr/bin/env bash
# cuda_plan_census.sh CPLANC [CPLAN_FILE] [--set ...]: what one micro-step of a CUDA training program
# launches, read from its generated plan.c (no GPU needed): the GEMMs by epilogue, the kernels/cuda
# launchers, the generated kernels (cps_*: kernels.cu's support kernels, k_ew_*: fused elementwise
# groups) and the memsets with their bytes, then the device work arena. Default: bench/gpu_gpt2.cplan (GPT-2 124M, T 1024,
# micro-batch 16) in bf16 on one H100. A census, not a timing: it shows what the emitter's
# fusions removed (fewer launches, fewer bytes zeroed); the GPU's times come from bench/gpu_gpt2.sh.
set -eu
cplanc=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
file=${1:-$here/gpu_gpt2.cplan}
[ $# -gt 0 ] && shift
work=$(mktemp -d "${TMPDIR:-/tmp}/cplan-census-XXXXXX")
trap 'rm -rf "$work"' EXIT
"$cplanc" build "$file" -o "$work/prog" --keep-c "$work/keep" --set train.precision=bf16 "$@" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }
python3 - "$work/keep/plan.c" "$file" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
body = src[src.index("static void micro_step("):]
body = body[:body.index("\n}\n")]
count = {}
def add(k, n=1):
    count[k] = count.get(k, 0) + n
free = {}  # not launches: counted apart
for m in re.finditer(r"^  (gemm|gemm_ld|gemm_bias|gemm_gelu|gemm_dgelu|gemm_bgrad|gemm_dgelu_bgrad)\((.*)$", body, re.M):
    add("GEMM " + {"gemm": "plain (or beta 1)", "gemm_ld": "plain, rows padded (the logits: find_pitched)", "gemm_bias": "+ bias", "gemm_gelu": "+ bias + gelu (GELU_AUX_BIAS)",
                   "gemm_dgelu": "+ gelu gradient (DGELU)",
                   "gemm_bgrad": "+ bias gradient (BGRAD_B), beta 1",
                   "gemm_dgelu_bgrad": "+ gelu and bias gradients (DGELU_BGRAD)"}[m.group(1)])
    if m.group(1).endswith("_bgrad") and "run->micro_index == 0" in m.group(2):
        # at the step's first micro-batch the epilogue writes the accumulator itself (bgrad_dst)
        free["bias gradients written into their accumulators by the epilogue at the first micro-batch "
             "(cps_colsum_finish at the others)"] = free.get("bias gradients written into their accumulators by the "
                                                             "epilogue at the first micro-batch (cps_colsum_finish at the others)", 0) + 1
    elif m.group(1).endswith("_bgrad"):
        add("generated cps_colsum_finish (1 launch: a bias gradient into its accumulator)")
for m in re.finditer(r"kl_check\(cplan_cuda_([a-z0-9_]+)\(", body):
    add("kernels/cuda " + m.group(1))
for m in re.finditer(r"/\* (cps_[a-z_]+|k_ew)_?[0-9]* \*/", body):
    add("generated " + (m.group(1) if m.group(1).startswith("cps") else "fused elementwise (k_ew_*)"))
for m in re.finditer(r"^  colsum\(", body, re.M):
    add("generated colsum (2 launches: bias gradient)")
for m in re.finditer(r"^  coll_([a-z_]+)\(", body, re.M):
    add("collective " + m.group(1))
memsets = [int(b) for b in re.findall(r"cudaMemsetAsync\([^,]+, 0, (\d+), G\.s\)", body)]
print("census of one micro-step of %s (bf16 CUDA plan.c)" % sys.argv[2])
print("%6s  %s" % ("count", "launch"))
for k in sorted(count, key=lambda k: (-count[k], k)):
    print("%6d  %s" % (count[k], k))
launches = sum(count.values()) + sum(1 for k in count if k.startswith("generated colsum") for _ in range(count[k]))
for k in free:
    print("%6d  (no launch) %s" % (free[k], k))
print("%6d  memsets, %.1f MB zeroed" % (len(memsets), sum(memsets) / 1e6))
print("total: %d launches at the step's first micro-batch (GEMMs, kernels and colsum's second pass counted, memsets not)"
      % launches)
m = re.search(r"#define DEVICE_WORK_BYTES \d+LL /\* training ([^,]+), evaluation ([^*]+) \*/", src)
if m:
    print("device work arena: training %s, evaluation %s (the memory plan: cg_plan_emit)" % (m.group(1), m.group(2).strip()))
PY
