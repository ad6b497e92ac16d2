#!/usr/bin/env bash
# gpt_gpu.sh: the issue-6 check of the CUDA training program against the CPU backend.
#   gpt_gpu.sh CPLANC SRCDIR [MODEL...]           build, run and compare here (a machine with a GPU)
#   gpt_gpu.sh --prepare DIR CPLANC SRCDIR [MODEL...]   build the GPU programs and run the CPU side
#                                                 here, into DIR (for a GPU machine that cannot build
#                                                 cplan: copy DIR there)
#   gpt_gpu.sh --check DIR                        run DIR's GPU programs and compare (on the GPU machine)
# Each model (default: gpt_small llama_small of tests/e2e, and gpt_smallv: gpt_small with vocab 67,
# whose logits' rows are padded, on one GPU only) is built with train.steps = 20 for the
# default CPU mesh (f32) and for a mesh of one h100_sxm (the CUDA backend, codegen/emit_cu.c) once
# per precision in CPLAN_GPU_PRECISIONS (default "f32 bf16 f16"); all train 20 steps from the same
# initial params on the same data. Tolerances, relative, on the 20 losses and gradient norms:
# f32 1e-3, bf16 and f16 2e-2 (the issue's); final params: f32 within 1e-3 absolute (the low
# precisions' are printed, not checked: Adam turns bf16 rounding of tiny gradients into +-lr
# steps). f16 must skip no step (its loss_scale and skipped_steps metrics are read). Prints the worst
# differences; exit 0 when within, 1 not. Data parallelism: each model is also built for a mesh of
# two GPUs (dp 2, in the precisions of CPLAN_GPU_DP_PRECISIONS, default "f32 f16") and run by
# `mpirun -np 2` against the same one-device CPU run and tolerances: with one GPU per rank the
# gradients are summed by NCCL, two ranks on one GPU sum them through MPI (CPLAN_COMM=mpi). Tensor
# parallelism (tp 2), ZeRO 3 and pipeline parallelism (pp 2, 1F1B) over two ranks run the same way,
# in bf16.
# --prepare bundles a relocatable Open MPI (tests/gpu/ompi_bundle.sh) for a GPU machine without MPI. CPLAN_GPU_KEEP=DIR copies metrics, logs and generated
# sources there.
set -u
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
fail() { echo "gpt_gpu.sh: FAILED: $*"; exit 1; }
mode=all
if [ "${1:-}" = --prepare ]; then mode=prepare; dir=$2; shift 2; fi
if [ "${1:-}" = --check ]; then mode=check; dir=$(cd "$2" && pwd); shift 2; fi
precs=${CPLAN_GPU_PRECISIONS:-f32 bf16 f16}
# one program's limit (20 steps of a small model take seconds): a hung one costs this much of the
# device call, not all of it
per_run=${CPLAN_GPU_RUN_TIMEOUT:-60}
dp_precs=${CPLAN_GPU_DP_PRECISIONS:-f32 f16}

if [ $mode != check ]; then
  cplanc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  src=$(cd "$2" && pwd)
  compare=$src/tests/gpu/compare_runs.py
  shift 2
  models=${*:-gpt_small llama_small gpt_smallv}
  if [ $mode = prepare ]; then
    mkdir -p "$dir/lib" && dir=$(cd "$dir" && pwd)
    work=$dir
  else
    work=$(mktemp -d "${TMPDIR:-/tmp}/cplan-gpu-XXXXXX")
    keep() { [ -n "${CPLAN_GPU_KEEP:-}" ] && mkdir -p "$CPLAN_GPU_KEEP" && cp -r "$work"/*.jsonl "$work"/*.log "$work"/keep-* "$CPLAN_GPU_KEEP"/ 2>/dev/null; rm -rf "$work"; }
    trap keep EXIT
  fi
  cd "$work" || exit 1
  for i in $(seq 300); do printf '%d+%d=%d; ' "$i" $((i * 7 % 13)) $((i + i * 7 % 13)); done >tokens.txt
  "$cplanc" data text tokens.txt -o tokens.bin >/dev/null 2>&1 || fail "cplanc data text"
  : >runs.txt
  for m in $models; do
    # MODELv: MODEL with vocab 67 (the logits' rows padded for cuBLASLt, emit_cu.c find_pitched), one GPU only
    vocab=64
    case $m in *v) vocab=67 ;; esac
    { sed "s/(vocab: int = 64,/(vocab: int = $vocab,/" "$src/tests/e2e/${m%v}.cplan"; printf '\nmesh gpu1 {\n  shape  = [gpu = 1]\n  device = h100_sxm\n}\n'; } >"$m.cplan"
    "$cplanc" build "$m.cplan" -o "$m-cpu" --set train.steps=20 2>"$m-cpu.log" || { cat "$m-cpu.log"; fail "build $m (cpu)"; }
    timeout 120 "./$m-cpu" --quiet --save-init "$m-init.st" --save "$m-cpu.st" --metrics "$m-cpu.jsonl" ||
      fail "$m: the CPU program"
    for p in $precs; do
      keepc="--keep-c keep-$m-$p"
      [ $mode = prepare ] && keepc=
      "$cplanc" build "$m.cplan" -o "$m-gpu-$p" --set train.steps=20 --set train.mesh=gpu1 --set train.precision=$p \
        $keepc 2>"$m-gpu-$p.log" || { cat "$m-gpu-$p.log"; fail "build $m (cuda, $p)"; }
      echo "$m $p 1" >>runs.txt
    done
    case $m in *v) continue ;; esac
    # data parallelism over two ranks (one process per GPU; two on one GPU share it through MPI)
    for p in $dp_precs; do
      "$cplanc" build "$m.cplan" -o "$m-gpu-$p-dp2" --set train.steps=20 --set train.mesh=gpu1 \
        --set mesh.gpu1.shape.gpu=2 --set train.precision=$p 2>"$m-gpu-$p-dp2.log" ||
        { cat "$m-gpu-$p-dp2.log"; fail "build $m (cuda, $p, dp 2)"; }
      echo "$m $p 2 dp2" >>runs.txt
    done
    # tensor parallelism, ZeRO 3 and pipeline parallelism (1F1B, a sample per micro-batch) over two
    # ranks in bf16: lowered plans, collectives on the device, pipeline crossings through the host
    for s in tp2 zero3 pp2; do
      sset=(--set train.strategy.tp=2)
      [ $s = zero3 ] && sset=(--set train.strategy.zero=3)
      [ $s = pp2 ] && sset=(--set train.strategy.pp=2 --set train.strategy.micro=1)
      "$cplanc" build "$m.cplan" -o "$m-gpu-bf16-$s" --set train.steps=20 --set train.mesh=gpu1 \
        --set mesh.gpu1.shape.gpu=2 --set train.precision=bf16 "${sset[@]}" 2>"$m-gpu-bf16-$s.log" ||
        { cat "$m-gpu-bf16-$s.log"; fail "build $m (cuda, bf16, $s)"; }
      echo "$m bf16 2 $s" >>runs.txt
    done
  done
  if [ $mode = prepare ]; then
    for l in $(while read -r m p np tag; do ldd "./$m-gpu-$p$([ "$np" = 1 ] || echo "-$tag")"; done <runs.txt | awk '/=> \/lib/ {print $3}' | sort -u | grep -E "cjson|mpi|open-rte|open-pal|hwloc|event|udev"); do
      cp -L "$l" lib/
    done
    cp "$self" gpt_gpu.sh
    cp "$src/tests/gpu/compare_runs.py" compare_runs.py
    # the GPU machine has no MPI: a relocatable Open MPI for the dp runs
    if [ -x "$src/tests/gpu/ompi_bundle.sh" ]; then
      "$src/tests/gpu/ompi_bundle.sh" "$dir" >ompi_bundle.log 2>&1 || { cat ompi_bundle.log; fail "ompi_bundle.sh"; }
    fi
    echo "gpt_gpu.sh: prepared $dir (on the GPU machine: $dir/gpt_gpu.sh --check $dir)"
    exit 0
  fi
else
  work=$dir
  cd "$work" || exit 1
  export LD_LIBRARY_PATH=$work/lib:${LD_LIBRARY_PATH:-}
  compare=$work/compare_runs.py
  if ! command -v mpirun >/dev/null && [ -f "$work/ompi/env.sh" ]; then . "$work/ompi/env.sh"; fi
  # NCCL (the dp programs link it): the toolkit's, else the one of the PyTorch wheels (nvidia-nccl)
  if ldd "$work"/*-dp2 2>/dev/null | grep -q 'libnccl.so.2 => not found'; then
    nl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$nl" ] && export LD_LIBRARY_PATH=$nl:$LD_LIBRARY_PATH
  fi
fi
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# the GPU runs and the comparison
bad=0
while read -r m p np tag; do
  run=$m-gpu-$p
  if [ "$np" = 1 ]; then
    timeout "$per_run" "./$run" --data tokens.bin --init "$m-init.st" --save "$run.st" --metrics "$run.jsonl" 2>"$run.run.log" ||
      { tail -5 "$run.run.log"; echo "FAILED: $m $p: the CUDA program exited with status $?"; bad=1; continue; }
  else
    # NCCL needs a GPU per rank; ranks sharing one GPU sum the gradients through MPI
    run=$m-gpu-$p-$tag comm=nccl
    [ "$ngpu" -ge "$np" ] || comm=mpi
    command -v mpirun >/dev/null || { echo "FAILED: $m $p $tag: no mpirun (and no bundled Open MPI)"; bad=1; continue; }
    timeout "$per_run" mpirun -np "$np" --oversubscribe -x CPLAN_COMM=$comm -x LD_LIBRARY_PATH ${CPLAN_NVRTC_CACHE:+-x CPLAN_NVRTC_CACHE} "./$run" --data tokens.bin --init "$m-init.st" \
      --save "$run.st" --metrics "$run.jsonl" 2>"$run.run.log" ||
      { tail -8 "$run.run.log"; echo "FAILED: $m $p $tag: the CUDA program exited with status $?"; bad=1; continue; }
    p="$p-$tag-$comm"
  fi
  python3 "$compare" GPU "$m" "$p" "$m-cpu.jsonl" "$run.jsonl" "$m-cpu.st" "$run.st" || bad=1
done <runs.txt
[ $bad -eq 0 ] || exit 1
echo "gpt_gpu.sh: ok"
