#!/usr/bin/env bash
# tp.sh CPLANC SRCDIR: tensor parallelism (Megatron 1D) on CPU ranks under mpirun.
# gpt_small and llama_small built with strategy tp = 2 on a mesh of 2 CPUs (tp = 4 and dp = 2 x
# tp = 2 on 4) must train like the single-device program: the 6 losses and gradient norms within 2e-4
# relative and the consolidated params (--save: rank 0 gathers the shards into whole tensors) within 1e-4
# (also with sequence parallelism, sp = 2 on dp = 2 x tp = 2); a tp
# checkpoint (whole tensors) resumes on 1 device with the same losses. The metrics are compared
# too (2e-4 relative + 1e-6: an accuracy of 32 tokens exactly; its argmax vocab-parallel, without
# the all-gather of the logits), and a model whose vocabulary tp does not divide is padded exactly
# (vocab-parallel) and reports the same loss, params and checkpoints;
# slice_small (i32 tokens taken apart in the model) with sp too.
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi
e2e_tokens tokens.bin


for m in gpt_small llama_small; do
  e2e_laptop <"$src/tests/e2e/$m.cplan" >"$m.cplan"
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
# vocab_padded LABEL FILE ROWS VALID SETS...: `plan --explain` places the table wte of FILE padded to
# ROWS rows (VALID of them real) and split on tp (vocab-parallel), and its build said no warning
vocab_padded() {
  local label=$1 file=$2 rows=$3 valid=$4
  shift 4
  "$cplanc" plan "$file" --explain "$@" >"$label.explain" 2>&1 || { cat "$label.explain"; fail "$label: cplanc plan --explain"; }
  grep -qE "^  wte +f32\[$rows, 16\] +\[S\(0\)\]  \(padded for tp: $valid valid rows\)" "$label.explain" ||
    { cat "$label.explain"; fail "$label: wte is not padded to $rows rows and vocab-parallel"; }
  grep -q "log-sum-exp exchange" "$label.explain" || fail "$label: cross_entropy is not vocab-parallel"
  if grep -q "not vocab-parallel" "build_$label.log"; then cat "build_$label.log"; fail "$label: the build still warns"; fi
}
# argmax_exchanged LABEL M.jsonl: LABEL.explain (vocab_padded's) runs the argmax of the split logits
# vocab-parallel: an all-gather of each rank's row maxima and their indices inside the op, and no
# reshard of the logits (the all-gather of the whole logits it used to take); prints the comm bytes
# of the run's first step
argmax_exchanged() {
  local label=$1
  grep -qE "^  tp +all-gather +%[0-9]+ argmax: argmax exchange \(each device's row max and its index\), " "$label.explain" ||
    { cat "$label.explain"; fail "$label: the argmax is not vocab-parallel"; }
  if grep -qE " -> R for %[0-9]+ argmax," "$label.explain"; then
    cat "$label.explain"; fail "$label: the argmax's logits are still gathered whole"
  fi
  echo "$label: comm bytes of step 1: $(head -1 "$2" | python3 -c 'import json, sys; print(json.load(sys.stdin)["comm_bytes"])')"
}
# vocab_shape LABEL FILE.st ROWS: the file holds wte [ROWS, 16] (a padded table is saved unpadded)
vocab_shape() {
  python3 - "$@" <<'PY' || exit 1
import json, struct, sys
label, path, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
b = open(path, "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
if h["wte"]["shape"] != [rows, 16]:
    sys.exit("FAILED: %s: %s holds wte %s, expected [%d, 16]" % (label, path, h["wte"]["shape"], rows))
PY
}
# a vocabulary tp does not divide (13, adder_tiny): the compiler pads the table exactly to [14, 16]
# (compiler/vocab_pad.c): vocab-parallel lookups, a column-parallel tied head, the pad columns of
# the logits masked (-inf) before the vocab-parallel cross_entropy and the accuracy metric's
# vocab-parallel argmax (the ranks' row maxima and indices exchanged, the pad never the first
# maximum); the loss, metric, grad norms and params are the single device's, and the saved table is
# [13, 16]
# padded_tp NAME TP ROWS: NAME.cplan on one device and on TP ranks, its 13-row table padded to ROWS
padded_tp() {
  local m=$1 n=$2 rows=$3
  e2e_build "$m-1" "$m.cplan"
  e2e_prog 0 "$m-1" "./$m-1" --save "$m-1.st" --metrics "$m-1.jsonl"
  sets=(--set train.mesh=laptop --set mesh.laptop.shape.cpu="$n" --set train.strategy.tp="$n")
  e2e_build "$m-tp$n" "$m.cplan" "${sets[@]}"
  vocab_padded "$m-tp$n" "$m.cplan" "$rows" 13 "${sets[@]}"
  e2e_prog 0 "$m-tp$n" "$mpirun" -np "$n" --oversubscribe "./$m-tp$n" --save "$m-tp$n.st" --metrics "$m-tp$n.jsonl"
  e2e_close "$m tp=$n (vocab 13, padded to $rows)" "$m-1.jsonl" "$m-tp$n.jsonl" "$m-1.st" "$m-tp$n.st"
  argmax_exchanged "$m-tp$n" "$m-tp$n.jsonl"
}
e2e_laptop <"$src/tests/e2e/adder_tiny.cplan" >adder.cplan
padded_tp adder 2 14
vocab_shape "adder_tiny tp=2" adder-tp2.st 13
# tp = 4 (with 4 heads): 16 rows, 4 per rank, the last rank's one valid row and three pad rows
sed 's/heads: int = 2/heads: int = 4/' adder.cplan >adder4.cplan
grep -q 'heads: int = 4' adder4.cplan || fail "adder4.cplan was not made"
padded_tp adder4 4 16
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
e2e_prog 0 kdim-1 ./kdim-1 --save kdim-1.st --metrics kdim-1.jsonl --checkpoint-every 3 --checkpoint-dir ck-kdim-1
e2e_build kdim-tp2 kdim.cplan --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 --set train.strategy.tp=2
e2e_prog 0 kdim-tp2 "$mpirun" -np 2 --oversubscribe ./kdim-tp2 --save kdim-tp2.st --metrics kdim-tp2.jsonl \
  --checkpoint-every 3 --checkpoint-dir ck-kdim-tp2
e2e_close "kdim tp=2 (a K-split activation with a whole weight)" kdim-1.jsonl kdim-tp2.jsonl kdim-1.st kdim-tp2.st
# ... whose odd vocabulary (65) is padded to 66 and vocab-parallel; its checkpoints hold [65, 16]
# (and moments of 65 x 16): the tp = 2 one resumes on one device, the one-device one on tp = 2
vocab_padded kdim-tp2 kdim.cplan 66 65 --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 --set train.strategy.tp=2
vocab_shape "kdim tp=2 checkpoint" ck-kdim-tp2/step_000003/model.safetensors 65
e2e_prog 0 kdim-res1 ./kdim-1 --resume ck-kdim-tp2/step_000003 --metrics kdim-res1.jsonl
e2e_tail_close "kdim tp=2 -> 1 resume (padded table)" kdim-1.jsonl kdim-res1.jsonl 3
e2e_prog 0 kdim-res2 "$mpirun" -np 2 --oversubscribe ./kdim-tp2 --resume ck-kdim-1/step_000003 --metrics kdim-res2.jsonl
e2e_tail_close "kdim 1 -> tp=2 resume (padded table)" kdim-1.jsonl kdim-res2.jsonl 3
# an untied head [C, 65] (with a bias, as nn's linear) whose input arrives whole is column-parallel:
# tp = 2 does not divide its 65 columns, which used to be an error ("tp = 2 does not divide dim 1
# (65) of head"); it is padded to [16, 66] (its bias to [66]) like the table, exactly (argmax metric
# too), and its checkpoints hold [16, 65]
cat >untied.cplan <<'CPLAN'
model untied(vocab: int = 65, ctx: int = 16, C: int = 16, h: int = 2) {
  input idx:     i32[B, ctx]
  input targets: i32[B, ctx]
  param wte: [vocab, C] = normal(0.3)
  param wqkv: [C, 3 * C] = normal(0.3)
  param head: [C, vocab] = normal(0.3)
  param g: [C] = ones
  param hb: [vocab] = uniform(-0.1, 0.1)
  x = embedding(wte, idx)
  q, k, v = split(x @ wqkv, 3)
  y = x + merge_heads(sdpa(split_heads(q, h), split_heads(k, h), split_heads(v, h), causal = true))
  logits = rms_norm(y, g) @ head + hb
  loss = cross_entropy(logits, targets)
  metric accuracy = mean(argmax(logits) == targets)
}
train {
  model     = untied()
  data      = tokens("tokens.bin")
  batch     = 4
  steps     = 6
  optimizer = adamw(lr = 1e-2, weight_decay = 0.1)
  clip      = 1.0
  seed      = 3
}
mesh laptop {
  shape  = [cpu = 1]
  device = cpu
}
CPLAN
sets=(--set train.mesh=laptop --set mesh.laptop.shape.cpu=2 --set train.strategy.tp=2)
e2e_build untied-1 untied.cplan
e2e_prog 0 untied-1 ./untied-1 --save untied-1.st --metrics untied-1.jsonl
e2e_build untied-tp2 untied.cplan "${sets[@]}"
vocab_padded untied-tp2 untied.cplan 66 65 "${sets[@]}"
grep -qE "^  head +f32\[16, 66\] +\[S\(1\)\]  \(padded for tp: 65 valid columns\)" untied-tp2.explain ||
  { cat untied-tp2.explain; fail "untied tp=2: the head is not padded to [16, 66] and column-parallel"; }
grep -qE "^  hb +f32\[66\] +\[S\(0\)\]  \(padded for tp: 65 valid entries\)" untied-tp2.explain ||
  { cat untied-tp2.explain; fail "untied tp=2: the head's bias is not padded to [66] and split"; }
e2e_prog 0 untied-tp2 "$mpirun" -np 2 --oversubscribe ./untied-tp2 --save untied-tp2.st --metrics untied-tp2.jsonl \
  --checkpoint-every 3 --checkpoint-dir ck-untied
e2e_close "untied tp=2 (a column-parallel head of 65 columns, padded to 66)" untied-1.jsonl untied-tp2.jsonl untied-1.st untied-tp2.st
argmax_exchanged untied-tp2 untied-tp2.jsonl
python3 - ck-untied/step_000003/model.safetensors <<'PY' || exit 1
import json, struct, sys
b = open(sys.argv[1], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
if h["head"]["shape"] != [16, 65]:
    sys.exit("FAILED: untied tp=2: the checkpoint holds head %s, expected [16, 65]" % h["head"]["shape"])
PY
e2e_prog 0 untied-res1 ./untied-1 --resume ck-untied/step_000003 --metrics untied-res1.jsonl
e2e_tail_close "untied tp=2 -> 1 resume (padded head)" untied-1.jsonl untied-res1.jsonl 3
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
e2e_laptop <"$src/tests/e2e/$m.cplan" >"$m.cplan"
e2e_build "$m-1" "$m.cplan"
e2e_prog 0 "$m-1" "./$m-1" --save "$m-1.st" --metrics "$m-1.jsonl"
e2e_build "$m-sp" "$m.cplan" --set train.mesh=laptop --set mesh.laptop.shape.cpu=4 --set train.strategy.dp=2 \
  --set train.strategy.tp=2 --set train.strategy.sp=2
e2e_prog 0 "$m-sp" "$mpirun" -np 4 --oversubscribe "./$m-sp" --save "$m-sp.st" --metrics "$m-sp.jsonl"
e2e_close "$m dp=2 x tp=2 x sp=2" "$m-1.jsonl" "$m-sp.jsonl" "$m-1.st" "$m-sp.st"
echo "tp.sh: ok"
