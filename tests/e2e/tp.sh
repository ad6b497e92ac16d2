#!/usr/bin/env bash
# tp.sh CPLANC SRCDIR: tensor parallelism (Megatron 1D) on CPU ranks under mpirun.
# gpt_small and llama_small built with strategy tp = 2 on a mesh of 2 CPUs (tp = 4 and dp = 2 x
# tp = 2 on 4) must train like the single-device program: the 6 losses and gradient norms within 2e-4
# relative and the consolidated params (--save: rank 0 gathers the shards into whole tensors) within 1e-4
# (also with sequence parallelism, sp = 2 on dp = 2 x tp = 2); a tp
# checkpoint (whole tensors) resumes on 1 device with the same losses. The metrics are compared
# too (2e-4 relative + 1e-6), and a model whose vocabulary tp does not divide reports the same loss;
# slice_small (i32 tokens taken apart in the model) with sp too.
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
# a vocabulary tp does not divide (13, adder_tiny): the embedding stays whole, cross_entropy and the
# accuracy metric (argmax) run on whole logits on every tp rank, and the reported loss and metric are
# the single device's, not tp times them (the runtime sums the tp ranks' parts)
{ cat "$src/tests/e2e/adder_tiny.cplan"; printf '\nmesh laptop {\n  shape  = [cpu = 1]\n  device = cpu\n}\n'; } >adder.cplan
e2e_build adder-1 adder.cplan
e2e_prog 0 adder-1 ./adder-1 --save adder-1.st --metrics adder-1.jsonl
e2e_build adder-tp2 adder.cplan --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 --set train.strategy.tp=2
e2e_prog 0 adder-tp2 "$mpirun" -np 2 --oversubscribe ./adder-tp2 --save adder-tp2.st --metrics adder-tp2.jsonl
e2e_close "adder_tiny tp=2 (vocab 13)" adder-1.jsonl adder-tp2.jsonl adder-1.st adder-tp2.st
# the reduction strategy with one operand whole: the head reads the attention's merged heads (split
# along C, the contracted dim) with the whole table of an odd vocabulary (65): each rank multiplies
# its C block of the table's columns (lower.c slices it, shard_sliced_input), the partial logits
# are all-reduced; it used to fail to lower ("inner dimensions differ")
cat >kdim.cplan <<'CPLAN'
model kdim(vocab: int = 65, ctx: int = 16, C: int = 16, h: int = 2) {
  input idx:     i32[B, ctx]
  input targets: i32[B, ctx]
  param wte: [vocab, C] = normal(0.3)
  param wqkv: [C, 3 * C] = normal(0.3)
  q, k, v = split(embedding(wte, idx) @ wqkv, 3)
  y = merge_heads(sdpa(split_heads(q, h), split_heads(k, h), split_heads(v, h), causal = true))
  loss = cross_entropy(y @ transpose(wte), targets)
}
train {
  model     = kdim()
  data      = tokens("tokens.bin")
  batch     = 4
  steps     = 6
  optimizer = adamw(lr = 1e-2)
  seed      = 3
}
mesh laptop {
  shape  = [cpu = 1]
  device = cpu
}
CPLAN
e2e_build kdim-1 kdim.cplan
e2e_prog 0 kdim-1 ./kdim-1 --save kdim-1.st --metrics kdim-1.jsonl
e2e_build kdim-tp2 kdim.cplan --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 --set train.strategy.tp=2
e2e_prog 0 kdim-tp2 "$mpirun" -np 2 --oversubscribe ./kdim-tp2 --save kdim-tp2.st --metrics kdim-tp2.jsonl
e2e_close "kdim tp=2 (a K-split activation with a whole weight)" kdim-1.jsonl kdim-tp2.jsonl kdim-1.st kdim-tp2.st
# means over dims tp splits (the heads, the channels; a metric too): each rank's mean of its part and
# its gradient are scaled by 1/tp (lower.c tp_mean_share); it used to be a lowering error
sed -e 's/  loss = cross_entropy(y @ transpose(wte), targets)/  loss = cross_entropy(y @ transpose(wte), targets) + mean(a * a) + 0.1 * mean(mean(q, axis = -1))/' \
    -e 's/  y = merge_heads(sdpa(/  a = (sdpa(/' -e 's/, causal = true))$/, causal = true))\n  y = merge_heads(a)\n  metric m = mean(a)/' \
    kdim.cplan >means.cplan
grep -q 'metric m = mean(a)' means.cplan || fail "means.cplan was not made"
e2e_build means-1 means.cplan
e2e_prog 0 means-1 ./means-1 --save means-1.st --metrics means-1.jsonl
e2e_build means-tp2 means.cplan --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 --set train.strategy.tp=2
e2e_prog 0 means-tp2 "$mpirun" -np 2 --oversubscribe ./means-tp2 --save means-tp2.st --metrics means-tp2.jsonl
e2e_close "means tp=2 (means over split dims)" means-1.jsonl means-tp2.jsonl means-1.st means-tp2.st
# slice_small takes a token row apart in the model, so its embeddings' indices are computed and the
# table is not vocab-parallel: under sp the sequence-split logits are gathered for cross_entropy and
# the loss, replicated on tp, is reported as each rank's 1/tp share (Lowered.loss_share)
m=slice_small
{ cat "$src/tests/e2e/$m.cplan"; printf '\nmesh laptop {\n  shape  = [cpu = 1]\n  device = cpu\n}\n'; } >"$m.cplan"
e2e_build "$m-1" "$m.cplan"
e2e_prog 0 "$m-1" "./$m-1" --save "$m-1.st" --metrics "$m-1.jsonl"
e2e_build "$m-sp" "$m.cplan" --set train.mesh=laptop --set mesh.laptop.shape.cpu=4 --set train.strategy.dp=2 \
  --set train.strategy.tp=2 --set train.strategy.sp=2
e2e_prog 0 "$m-sp" "$mpirun" -np 4 --oversubscribe "./$m-sp" --save "$m-sp.st" --metrics "$m-sp.jsonl"
e2e_close "$m dp=2 x tp=2 x sp=2" "$m-1.jsonl" "$m-sp.jsonl" "$m-1.st" "$m-sp.st"
echo "tp.sh: ok"
