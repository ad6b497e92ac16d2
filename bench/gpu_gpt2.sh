#!/usr/bin/env bash
# gpu_gpt2.sh CPLANC [DIR]: issue 6's GPT-2 124M benchmark (bench/gpu_gpt2.cplan: T 1024, micro-batch
# 16, AdamW, bf16) for one H100-class GPU. Builds the CUDA training program, random tokens and the
# shared libraries the program needs that a bare GPU machine may lack (cJSON, Open MPI) into DIR
# (default build-gpurun), with DIR/run_gpu.sh, which runs it on the GPU machine and prints step ms,
# tokens/s and MFU against 989 TFLOP/s (H100/H200 dense bf16, the issue's yardstick) from the
# metrics (the median after the first 2 steps), then 6 steps with CPLAN_PROFILE=1 (GPU time per
# node class and the slowest nodes; the events add launch gaps to the node before); and 8 bf16 steps
# with CPLAN_ATTENTION=wmma, the attention kernels the default mma.sync ones replaced. Set
# GPT2_PRECISIONS (default "bf16") to time other precisions too (f32, f16). A benchmark: it
# prints, never asserts.
set -eu
cplanc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
here=$(cd "$(dirname "$0")" && pwd)
dir=${2:-build-gpurun}
mkdir -p "$dir/lib"
cd "$dir"
for p in ${GPT2_PRECISIONS:-bf16}; do
  "$cplanc" build "$here/gpu_gpt2.cplan" -o gpt2gpu_$p --set train.precision=$p
done
python3 - <<'PY'
import random, struct
count = 31 * 16 * 1024 + 1
rng = random.Random(1)
header = struct.pack("<256i", 20240520, 1, count, *([0] * 253))
open("gpu_gpt2_tokens.bin", "wb").write(header + struct.pack("<%dH" % count, *(rng.randrange(50257) for _ in range(count))))
PY
for l in $(ldd gpt2gpu_* | awk '/=> \/lib/ {print $3}' | grep -E "cjson|mpi|open-rte|open-pal|hwloc|event|udev"); do cp -L "$l" lib/; done
cat >run_gpu.sh <<'RUN'
#!/usr/bin/env bash
# on the GPU machine: ./run_gpu.sh [STEPS]
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
out=${OUT:-.}
nvidia-smi -L || { echo "no GPU"; exit 1; }
# run PROG LABEL STEPS [ENV=VALUE...]: train, then print the median step figures
run() {
  local prog=$1 label=$2 steps=$3
  shift 3
  echo "==== $label"
  env "$@" timeout 300 ./$prog --data gpu_gpt2_tokens.bin --steps "$steps" --metrics "$out/m_$label.jsonl" 2>&1 | tail -4
  python3 - "$out/m_$label.jsonl" "$label" <<'PY'
import json, statistics, sys
m = [json.loads(l) for l in open(sys.argv[1])][2:]
ms = statistics.median(x["ms"] for x in m); tps = statistics.median(x["tokens_per_s"] for x in m)
flops = 6 * 124439808 * tps + 6 * 12 * 1024 * 768 * tps  # llm.c's count: 6N per token + attention
print("%s: %.1f ms/step, %.0f tokens/s, %.1f TFLOP/s, MFU %.2f%% of 989 TFLOP/s" % (sys.argv[2], ms, tps, flops / 1e12, 100 * flops / 989e12))
PY
}
for prog in gpt2gpu_*; do
  run $prog ${prog#gpt2gpu_} "${1:-12}"
done
# the same bf16 program with the other tensor-core attention (WMMA, scores through shared memory)
[ -x gpt2gpu_bf16 ] && run gpt2gpu_bf16 bf16-attention-wmma 8 CPLAN_ATTENTION=wmma
echo "==== profile (bf16, CPLAN_PROFILE=1, 6 steps)"
[ -x gpt2gpu_bf16 ] && CPLAN_PROFILE=1 timeout 300 ./gpt2gpu_bf16 --data gpu_gpt2_tokens.bin --steps 6 --quiet 2>&1 | grep -A60 "^profile" | head -70
RUN
chmod +x run_gpu.sh
echo "gpu_gpt2.sh: built $dir (copy it to the GPU machine and run $dir/run_gpu.sh)"
