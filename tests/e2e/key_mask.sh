#!/usr/bin/env bash
# key_mask.sh CPLANC SRCDIR: sdpa with a padding mask over the keys (attn_mask [B, 1, 1, T], BERT's)
# runs in the attention kernels with the mask as their [B, T] 4th input, never a [T, T] score matrix
# (emit --stage=ir: no softmax), and trains like the same mask broadcast to [B, 1, T, T] first, which
# is computed in the math form (e2e_close: losses, gradient norms, params), rows with no key left
# included (0 in both, as PyTorch's sdpa; the math form gave NaN before). key_mask_small trains on
# 2 and 4 CPU ranks like one device: dp = 2 (the mask split with the batch, plan --explain), tp = 2
# (the heads split, the mask whole), pp = 2 x dp = 2.
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi
e2e_tokens tokens.bin

e2e_laptop <"$src/tests/e2e/key_mask_small.cplan" >km.cplan
two=(--set train.mesh=laptop --set mesh.laptop.shape.cpu=2)
four=(--set train.mesh=laptop --set mesh.laptop.shape.cpu=4)

# the key mask: sdpa's 4th input [4, 16], no softmax; broadcast over the queries: the math form
"$cplanc" emit km.cplan --stage=ir >km.ir 2>km.ir.err || { cat km.ir.err; fail "emit --stage=ir km.cplan"; }
[ "$(grep -cE '= sdpa %[0-9]+, %[0-9]+, %[0-9]+, %[0-9]+, causal=(false|true) : f32\[4, 4, 16, 8\]' km.ir)" = 2 ] ||
  { grep "sdpa" km.ir; fail "the two sdpa do not take the key mask"; }
if grep -q " = softmax" km.ir; then grep " = softmax" km.ir; fail "a key mask computed in the math form"; fi
"$cplanc" emit km.cplan --stage=ir --set train.model.mask=2 >math.ir 2>&1 || { cat math.ir; fail "emit mask=2"; }
[ "$(grep -c " = softmax" math.ir)" = 2 ] && ! grep -q " = sdpa" math.ir || { grep "sdpa\|softmax" math.ir; fail "a [B, 1, T, T] mask not in the math form"; }

e2e_build km-1 km.cplan
e2e_prog 0 km-1 ./km-1 --save km-1.st --metrics km-1.jsonl
e2e_build math-1 km.cplan --set train.model.mask=2
e2e_prog 0 math-1 ./math-1 --save math-1.st --metrics math-1.jsonl
e2e_close "key mask against the math form" km-1.jsonl math-1.jsonl km-1.st math-1.st
# the mask matters: without it the model trains otherwise
sed 's/^  keep = reshape(idx % 5 != 0, /  keep = reshape(idx % 1 == 0, /' km.cplan >nomask.cplan
grep -q "idx % 1 == 0" nomask.cplan || fail "the sed of key_mask_small.cplan no longer applies"
e2e_build nomask-1 nomask.cplan
e2e_prog 0 nomask-1 ./nomask-1 --metrics nomask-1.jsonl
if [ "$(e2e_det nomask-1.jsonl)" = "$(e2e_det km-1.jsonl)" ]; then fail "the key mask changes nothing"; fi

# dp = 2: the mask [4, 16] split with the batch into the sdpa
"$cplanc" plan km.cplan "${two[@]}" --set train.strategy.dp=2 --explain >dp2.explain 2>&1 || { cat dp2.explain; fail "plan --explain dp=2"; }
grep -qE '^    %[0-9]+ where +f32\[4, 16\] +\[S\(0\)\]' dp2.explain || { cat dp2.explain; fail "dp=2: the key mask is not split with the batch"; }
e2e_build km-dp2 km.cplan "${two[@]}" --set train.strategy.dp=2
e2e_prog 0 km-dp2 "$mpirun" -np 2 --oversubscribe ./km-dp2 --save km-dp2.st --metrics km-dp2.jsonl
e2e_close "key mask dp=2" km-1.jsonl km-dp2.jsonl km-1.st km-dp2.st

e2e_build km-tp2 km.cplan "${two[@]}" --set train.strategy.tp=2
e2e_prog 0 km-tp2 "$mpirun" -np 2 --oversubscribe ./km-tp2 --save km-tp2.st --metrics km-tp2.jsonl
e2e_close "key mask tp=2" km-1.jsonl km-tp2.jsonl km-1.st km-tp2.st

e2e_build km-pp km.cplan "${four[@]}" --set train.strategy.pp=2 --set train.strategy.dp=2
e2e_prog 0 km-pp "$mpirun" -np 4 --oversubscribe ./km-pp --save km-pp.st --metrics km-pp.jsonl
e2e_close "key mask pp=2 x dp=2" km-1.jsonl km-pp.jsonl km-1.st km-pp.st
echo ok
