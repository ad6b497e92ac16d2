#!/usr/bin/env bash
# dropout.sh CPLANC SRCDIR: dropout masks are the same under every strategy (docs §9 Randomness:
# each element draws at its index in the step's whole tensor). gpt_small with attention written by
# hand, dropout on the probabilities ([B, h, T, T], split by heads under tp) and after the MLP
# ([B, T, C], split along the sequence under sp), and sdpa's dropout_p: one device, then dp = 2,
# accumulation (micro 2), tp = 2, dp 2 x tp 2 x sp 2, pp = 2, tp 2 x pp 2, ZeRO 3 and full
# recompute must give the single device's 6 losses, gradient norms and params (e2e_close). Before
# the masks were keyed by each rank's micro-batch and shard, dp = 2 was 1% off.
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi
e2e_tokens tokens.bin

sed -e 's|^  y = sdpa(.*|  s = split_heads(q, heads) @ transpose(split_heads(k, heads)) * 0.35355339\n  y = dropout(softmax(s), 0.1) @ split_heads(v, heads) + sdpa(split_heads(q, heads), split_heads(k, heads), split_heads(v, heads), causal = true, dropout_p = 0.2)|' \
  -e 's|^  return linear(gelu(linear(x, 4 \* C, name = "c_fc")), C, name = "c_proj")|  return dropout(linear(gelu(linear(x, 4 * C, name = "c_fc")), C, name = "c_proj"), 0.1)|' \
  "$src/tests/e2e/gpt_small.cplan" >drop.cplan
e2e_laptop </dev/null >>drop.cplan
[ "$(grep -o dropout drop.cplan | wc -l)" = 3 ] || fail "drop.cplan: the edit of gpt_small.cplan did not apply"

e2e_build one drop.cplan --set train.mesh=laptop
e2e_prog 0 one ./one --save-init init.st --save one.st --metrics one.jsonl
# case NAME RANKS SETTINGS...
case_() {
  local name=$1 np=$2
  shift 2
  e2e_build "$name" drop.cplan --set train.mesh=laptop --set mesh.laptop.shape.cpu="$np" "$@"
  if [ "$np" = 1 ]; then
    e2e_prog 0 "$name" "./$name" --init init.st --save "$name.st" --metrics "$name.jsonl"
  else
    e2e_prog 0 "$name" "$mpirun" -np "$np" --oversubscribe "./$name" --init init.st --save "$name.st" --metrics "$name.jsonl"
  fi
  e2e_close "dropout $name" one.jsonl "$name.jsonl" one.st "$name.st"
}
case_ dp2 2 --set train.strategy.dp=2
case_ micro2 1 --set train.strategy.micro=2
case_ tp2 2 --set train.strategy.tp=2
case_ sp 4 --set train.strategy.dp=2 --set train.strategy.tp=2 --set train.strategy.sp=2
case_ pp2 2 --set train.strategy.pp=2 --set train.strategy.micro=2
case_ tp2pp2 4 --set train.strategy.tp=2 --set train.strategy.pp=2 --set train.strategy.micro=2
case_ zero3 2 --set train.strategy.dp=2 --set train.strategy.zero=3
case_ recompute 1 --set 'train.strategy.recompute="full"'
# the masks do change with the seed (the test is not comparing programs without dropout)
e2e_build seed2 drop.cplan --set train.mesh=laptop --set train.seed=4
e2e_prog 0 seed2 ./seed2 --init init.st --metrics seed2.jsonl
python3 -c "
import json, sys
a = [json.loads(l)['loss'] for l in open('one.jsonl')]; b = [json.loads(l)['loss'] for l in open('seed2.jsonl')]
sys.exit(0 if abs(a[0] - b[0]) > 1e-4 else 'FAILED: another seed drew the same dropout masks')" || fail "seed"
echo ok
