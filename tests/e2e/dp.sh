#!/usr/bin/env bash
# dp.sh CPLANC SRCDIR: data parallelism on CPU ranks under mpirun (loopback, --oversubscribe).
# gpt_small and llama_small, built for meshes of 2 and 4 CPU devices (dp = the device count,
# also with accumulation: micro = 1; and `strategy = auto`, the search's plan), must train like the
# single-device program: the 6 losses
# and gradient norms within 2e-4 relative and the params after training (--save) within 1e-4.  Also: a dp run
# resumed from a checkpoint matches the uninterrupted dp run exactly, a wrong -np is a clear
# error on every rank, and `cplanc run` starts mpirun itself.
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi
e2e_tokens tokens.bin


for m in gpt_small llama_small; do
  # a one-axis CPU mesh the --set overrides resize
  e2e_laptop <"$src/tests/e2e/$m.cplan" >"$m.cplan"
  e2e_build "$m-1" "$m.cplan"
  e2e_prog 0 "$m-1" "./$m-1" --save "$m-1.st" --metrics "$m-1.jsonl"
  for v in "2" "4" "2 micro"; do
    set -- $v
    n=$1 name=$m-dp$1${2:+-$2}
    sets=(--set train.mesh=laptop --set "mesh.laptop.shape.cpu=$n")
    if [ "${2:-}" = micro ]; then sets+=(--set train.strategy.micro=1); fi  # accumulation 2
    sets+=(--set "train.strategy.dp=$n") # pinned: `auto` is the search's choice (below)
    e2e_build "$name" "$m.cplan" "${sets[@]}"
    e2e_prog 0 "$name" "$mpirun" --oversubscribe -np "$n" "./$name" --save "$name.st" --metrics "$name.jsonl"
    e2e_says "$name" "data parallel: $n ranks"
    [ "$(grep -c 'step 6/6' "$name.err")" = 1 ] || fail "$name: rank 0 alone should print progress"
    e2e_close "$name" "$m-1.jsonl" "$name.jsonl" "$m-1.st" "$name.st"
  done
done

# strategy = auto on 2 devices: the search's plan (the build says which), trained like one device
for m in gpt_small llama_small; do
  e2e_build "$m-auto" "$m.cplan" --set train.mesh=laptop --set mesh.laptop.shape.cpu=2
  grep -q "strategy = auto: the search chose dp" "build_$m-auto.log" || { cat "build_$m-auto.log"; fail "$m-auto: no search"; }
  e2e_prog 0 "$m-auto" "$mpirun" --oversubscribe -np 2 "./$m-auto" --save "$m-auto.st" --metrics "$m-auto.jsonl"
  e2e_close "$m-auto" "$m-1.jsonl" "$m-auto.jsonl" "$m-1.st" "$m-auto.st"
done

# resume under dp: 3 steps, a checkpoint, then the rest; the same losses as without a stop
e2e_prog 0 resume1 "$mpirun" --oversubscribe -np 2 ./gpt_small-dp2-micro --steps 3 --checkpoint-dir ck --metrics r.jsonl
e2e_prog 0 resume2 "$mpirun" --oversubscribe -np 2 ./gpt_small-dp2-micro --resume ck --metrics r.jsonl
[ "$(e2e_det r.jsonl)" = "$(e2e_det gpt_small-dp2-micro.jsonl)" ] ||
  fail "resumed dp run differs from the uninterrupted one"

# a wrong rank count: exit status 2... from every rank, with the fix in the message
timeout 60 "$mpirun" --oversubscribe -np 3 ./gpt_small-dp2 2>wrong.err && fail "-np 3 of a dp=2 program succeeded"
[ "$(grep -c 'this program was built for 2 devices (mesh laptop, dp=2); run it with mpirun -np 2, not 3' wrong.err)" = 3 ] ||
  { cat wrong.err; fail "-np 3: every rank should say how to run it"; }
e2e_prog 2 wrong1 ./gpt_small-dp2
e2e_says wrong1 "run it with mpirun -np 2, not 1"

# cplanc run starts mpirun -np 2 itself
e2e_prog 0 run "$cplanc" run gpt_small.cplan --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 \
  --set train.strategy.dp=2 -- --metrics run.jsonl
e2e_says run "data parallel: 2 ranks" "step 6/6"
[ "$(e2e_det run.jsonl)" = "$(e2e_det gpt_small-dp2.jsonl)" ] || fail "cplanc run differs from mpirun ./prog"
echo ok
