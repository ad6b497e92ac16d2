#!/usr/bin/env bash
# tp.sh CPLANC SRCDIR: tensor parallelism (Megatron 1D) on CPU ranks under mpirun.
# gpt_small and llama_small built with strategy tp = 2 on a mesh of 2 CPUs (tp = 4 and dp = 2 x
# tp = 2 on 4) must train like the single-device program: the 6 losses and gradient norms within 2e-4
# relative and the consolidated params (--save: rank 0 gathers the shards into whole tensors) within 1e-4
# (also with sequence parallelism, sp = 2 on dp = 2 x tp = 2); a tp
# checkpoint (whole tensors) resumes on 1 device with the same losses; slice_small (i32 tokens taken apart
# in the model) with sp too.
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi
e2e_tokens tokens.bin


for m in gpt_small llama_small; do
  { cat "$src/tests/e2e/$m.cplan"; printf '\nmesh laptop {\n  shape  = [cpu = 1]\n  device = cpu\n}\n'; } >"$m.cplan"
  e2e_build "$m-1" "$m.cplan"
  e2e_prog 0 "$m-1" "./$m-1" --save "$m-1.st" --metrics "$m-1.jsonl"
  sets=(--set train.mesh=laptop --set mesh.laptop.shape.cpu=2 --set train.strategy.tp=2)
  e2e_build "$m-tp2" "$m.cplan" "${sets[@]}"
  e2e_prog 0 "$m-tp2" "$mpirun" -np 2 --oversubscribe "./$m-tp2" --save "$m-tp2.st" --metrics "$m-tp2.jsonl" \
    --checkpoint-every 3 --checkpoint-dir "ck-$m"
  e2e_close "$m tp=2" "$m-1.jsonl" "$m-tp2.jsonl" "$m-1.st" "$m-tp2.st"
  # tp = 4: one head per rank
  e2e_build "$m-tp4" "$m.cplan" --set train.mesh=laptop --set mesh.laptop.shape.cpu=4 --set train.strategy.tp=4
  e2e_prog 0 "$m-tp4" "$mpirun" -np 4 --oversubscribe "./$m-tp4" --save "$m-tp4.st" --metrics "$m-tp4.jsonl"
  e2e_close "$m tp=4" "$m-1.jsonl" "$m-tp4.jsonl" "$m-1.st" "$m-tp4.st"
  # dp = 2 x tp = 2 on 4 ranks: the runtime averages the gradients over the dp group
  sets=(--set train.mesh=laptop --set mesh.laptop.shape.cpu=4 --set train.strategy.dp=2 --set train.strategy.tp=2)
  e2e_build "$m-dp2tp2" "$m.cplan" "${sets[@]}"
  e2e_prog 0 "$m-dp2tp2" "$mpirun" -np 4 --oversubscribe "./$m-dp2tp2" --save "$m-dp2tp2.st" --metrics "$m-dp2tp2.jsonl"
  e2e_close "$m dp=2 x tp=2" "$m-1.jsonl" "$m-dp2tp2.jsonl" "$m-1.st" "$m-dp2tp2.st"
  # sequence parallelism (Megatron): the norms, residuals and dropout run on sequence shards
  e2e_build "$m-sp" "$m.cplan" "${sets[@]}" --set train.strategy.sp=2
  e2e_prog 0 "$m-sp" "$mpirun" -np 4 --oversubscribe "./$m-sp" --save "$m-sp.st" --metrics "$m-sp.jsonl"
  e2e_close "$m dp=2 x tp=2 x sp=2" "$m-1.jsonl" "$m-sp.jsonl" "$m-1.st" "$m-sp.st"
  e2e_says "$m-sp" "4 ranks (mesh laptop): dp 2 x tp 2 (sequence parallel) x pp 1, each micro"
  # the tp checkpoint after 3 steps holds whole tensors: one device resumes it
  e2e_prog 0 "$m-resume" "./$m-1" --resume "ck-$m/step_000003" --metrics "$m-res.jsonl"
  e2e_tail_close "$m tp=2 -> 1 resume" "$m-1.jsonl" "$m-res.jsonl" 3
done
# slice_small takes a token row apart in the model, so its embeddings' indices are computed and the
# table is not vocab-parallel: under sp the sequence-split logits are gathered for cross_entropy and
# the loss, replicated on tp, is reported as each rank's 1/tp share (lower.c tp_share)
m=slice_small
{ cat "$src/tests/e2e/$m.cplan"; printf '\nmesh laptop {\n  shape  = [cpu = 1]\n  device = cpu\n}\n'; } >"$m.cplan"
e2e_build "$m-1" "$m.cplan"
e2e_prog 0 "$m-1" "./$m-1" --save "$m-1.st" --metrics "$m-1.jsonl"
e2e_build "$m-sp" "$m.cplan" --set train.mesh=laptop --set mesh.laptop.shape.cpu=4 --set train.strategy.dp=2 \
  --set train.strategy.tp=2 --set train.strategy.sp=2
e2e_prog 0 "$m-sp" "$mpirun" -np 4 --oversubscribe "./$m-sp" --save "$m-sp.st" --metrics "$m-sp.jsonl"
e2e_close "$m dp=2 x tp=2 x sp=2" "$m-1.jsonl" "$m-sp.jsonl" "$m-1.st" "$m-sp.st"
echo "tp.sh: ok"
