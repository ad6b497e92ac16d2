#!/usr/bin/env bash
# pp.sh CPLANC SRCDIR: pipeline parallelism on CPU ranks under mpirun. gpt_small (its tied
# embedding is read by the first and the last stage) and llama_small, cut into pp = 2 stages with
# 4 micro-batches (micro = 1 of batch 4) under 1F1B and GPipe, and combined with dp = 2, tp = 2,
# zero = 1 and full recomputation, must train like the single-device program (e2e_close: the 6 losses and gradient norms
# within 2e-4 relative, the consolidated params within 1e-4); each stage holds only its layers'
# params; a pp checkpoint resumes on one device.
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi
e2e_tokens tokens.bin

for m in gpt_small llama_small; do
  { cat "$src/tests/e2e/$m.cplan"; printf '\nmesh laptop {\n  shape  = [cpu = 1]\n  device = cpu\n}\n'; } >"$m.cplan"
  e2e_build "$m-1" "$m.cplan"
  e2e_prog 0 "$m-1" "./$m-1" --save-init "$m-init.st" --save "$m-1.st" --metrics "$m-1.jsonl"
  # label, devices, then the strategy fields
  for cfg in "1f1b 2 pp=2 micro=1" "gpipe 2 pp=2 micro=1 pipeline=\"gpipe\"" "dp2 4 dp=2 pp=2 micro=1" \
             "tp2 4 tp=2 pp=2 micro=2" "zero1 4 dp=2 pp=2 zero=1 micro=1" \
             "full 2 pp=2 micro=1 recompute=\"full\""; do
    read -r label n fields <<<"$cfg"
    sets=(--set train.mesh=laptop --set "mesh.laptop.shape.cpu=$n")
    for f in $fields; do sets+=(--set "train.strategy.$f"); done
    name="$m-$label"
    e2e_build "$name" "$m.cplan" "${sets[@]}"
    e2e_prog 0 "$name" "$mpirun" -np "$n" --oversubscribe "./$name" --save "$name.st" --metrics "$name.jsonl" \
      --checkpoint-every 3 --checkpoint-dir "ck-$name"
    e2e_close "$m $fields" "$m-1.jsonl" "$name.jsonl" "$m-1.st" "$name.st"
  done
  # stage 0 holds the first layer (and the embeddings), stage 1 the second (and the head): each
  # fewer params than the whole model
  e2e_says "$m-1f1b" "rank 0:" "rank 1:"
  python3 - "$m-1.jsonl" "$m-1f1b.err" <<'PY' || exit 1
import json, re, sys
whole = json.loads(open(sys.argv[1]).read().splitlines()[-1])["param_bytes"]
def kb(x, u): return float(x) * {"B": 1, "kB": 1e3, "MB": 1e6}[u]
for r, x, u in re.findall(r"rank (\d): peak RSS .*?\(params ([\d.]+)(kB|MB|B),", open(sys.argv[2]).read()):
    if kb(x, u) >= 0.9 * whole:
        sys.exit("FAILED: pp=2 stage of rank %s holds %s%s of params, the whole model %d B" % (r, x, u, whole))
PY
  # --init of whole tensors into the stages (and --save-init out of them) under pp
  e2e_prog 0 "$m-init" "$mpirun" -np 2 --oversubscribe "./$m-1f1b" --init "$m-init.st" --save-init "$m-init2.st" \
    --save "$m-init.st.out" --metrics "$m-init.jsonl"
  cmp -s "$m-init.st" "$m-init2.st" || fail "$m: pp --save-init of the loaded params differs from the file loaded"
  e2e_close "$m pp=2 --init" "$m-1.jsonl" "$m-init.jsonl" "$m-1.st" "$m-init.st.out"
  # the pp checkpoint after 3 steps holds whole tensors: one device resumes it
  e2e_prog 0 "$m-resume" "./$m-1" --resume "ck-$m-1f1b/step_000003" --metrics "$m-res.jsonl"
  e2e_tail_close "$m pp=2 checkpoint -> 1 device" "$m-1.jsonl" "$m-res.jsonl" 3
done
echo "pp.sh: ok"
