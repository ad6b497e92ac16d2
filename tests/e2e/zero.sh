#!/usr/bin/env bash
# zero.sh CPLANC SRCDIR: ZeRO stages 1, 2 and 3 on CPU ranks under mpirun. gpt_small and
# llama_small under dp = 2 x tp = 2 with zero = 1, dp = 4 with zero = 2 and dp = 4 with zero = 3
# must train like the single-device program (e2e_close: the 6 losses and gradient norms within
# 2e-4 relative, the consolidated params within 1e-4), and each rank's params + optimizer state +
# gradient accumulators must shrink as the stage promises; a zero = 3 checkpoint resumes on one
# device.
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi
e2e_tokens tokens.bin

# memory LABEL M1.jsonl M2.jsonl PARAMS STATE: this rank's param_bytes and state_bytes over the
# single-device run's at most PARAMS and STATE (fractions), from the last metrics lines
memory() {
  python3 - "$@" <<'PY' || exit 1
import json, sys
label, m1, m2, fp, fs = sys.argv[1:]
a = json.loads(open(m1).read().splitlines()[-1])
b = json.loads(open(m2).read().splitlines()[-1])
for key, most in (("param_bytes", float(fp)), ("state_bytes", float(fs))):
    r = b[key] / a[key]
    print("%s: %s %d of %d (%.3f, at most %.3f)" % (label, key, b[key], a[key], r, most))
    if r > most:
        sys.exit("FAILED: %s: %s is %.3f of the single device's, expected at most %.3f" % (label, key, r, most))
PY
}

for m in gpt_small llama_small; do
  e2e_laptop <"$src/tests/e2e/$m.cplan" >"$m.cplan"
  e2e_build "$m-1" "$m.cplan"
  e2e_prog 0 "$m-1" "./$m-1" --save "$m-1.st" --metrics "$m-1.jsonl"
  # stage: devices dp tp, then the most params and state may hold (fractions of one device's):
  # tp = 2 halves the matmul weights (not the norms: about 0.52 of the params), zero 1 shards the
  # optimizer moments over dp too (state = grads / tp + moments / (dp tp): about 1/6 + 1/6 under adamw),
  # zero 2 the gradients too, zero 3 the params too
  for cfg in "1 4 2 2 0.55 0.40" "2 4 4 1 1.0 0.26" "3 4 4 1 0.26 0.26"; do
    read -r z n dp tp fp fs <<<"$cfg"
    name="$m-z$z"
    e2e_build "$name" "$m.cplan" --set train.mesh=laptop --set "mesh.laptop.shape.cpu=$n" \
      --set "train.strategy.dp=$dp" --set "train.strategy.tp=$tp" --set "train.strategy.zero=$z"
    e2e_prog 0 "$name" "$mpirun" -np "$n" --oversubscribe "./$name" --save "$name.st" --metrics "$name.jsonl" \
      --checkpoint-every 3 --checkpoint-dir "ck-$name"
    e2e_says "$name" "$n ranks (mesh laptop): dp $dp x tp $tp x pp 1, ZeRO $z, each micro"
    e2e_close "$m zero=$z dp=$dp tp=$tp" "$m-1.jsonl" "$name.jsonl" "$m-1.st" "$name.st"
    memory "$m zero=$z dp=$dp tp=$tp" "$m-1.jsonl" "$name.jsonl" "$fp" "$fs"
  done
  # the zero = 3 checkpoint after 3 steps holds whole tensors: one device resumes it
  e2e_prog 0 "$m-resume" "./$m-1" --resume "ck-$m-z3/step_000003" --metrics "$m-res.jsonl"
  e2e_tail_close "$m zero=3 checkpoint -> 1 device" "$m-1.jsonl" "$m-res.jsonl" 3
done
echo "zero.sh: ok"
