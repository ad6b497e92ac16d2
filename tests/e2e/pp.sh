#!/usr/bin/env bash
# pp.sh CPLANC SRCDIR: pipeline parallelism on CPU ranks under mpirun. gpt_small (its tied
# embedding is read by the first and the last stage) and llama_small, cut into pp = 2 stages with
# 4 micro-batches (micro = 1 of batch 4) under 1F1B and GPipe (gpt_small's tied gradient crossing
# once a step, in the trace), and combined with dp = 2, tp = 2,
# zero = 1 (and zero = 2 / 3) and full recomputation, must train like the single-device program (e2e_close: the 6 losses and gradient norms
# within 2e-4 relative, the consolidated params within 1e-4); each stage holds only its layers'
# params; a pp checkpoint resumes on one device. The interleaved schedule (2 stages per rank) on
# 4-layer variants: pp = 2 and dp = 2 x pp = 2 (2 micro-batches per replica: the all-warm-up
# order), gpt_small also with tp = 2 and with zero = 1 (the gradient norm's parts are partial sums
# over dp), against the 4-layer single-device program, its checkpoint resumed on one device; and
# the three strategies it refuses, with their errors at the strategy field. A model with a metric
# (computed by the last stage only) reports the one-device values under 1F1B and interleaved.
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi
e2e_tokens tokens.bin

for m in gpt_small llama_small; do
  e2e_laptop <"$src/tests/e2e/$m.cplan" >"$m.cplan"
  e2e_build "$m-1" "$m.cplan"
  e2e_prog 0 "$m-1" "./$m-1" --save-init "$m-init.st" --save "$m-1.st" --metrics "$m-1.jsonl"
  # label, devices, then the strategy fields
  # ZeRO 2 on gpt_small (its tied embedding's gradient reduce-scattered on both end stages), ZeRO 3
  # on llama_small (untied: gpt_small's is refused, below)
  zero23="zero2 4 dp=2 pp=2 zero=2 micro=1"
  [ $m = llama_small ] && zero23="zero3 4 dp=2 pp=2 zero=3 micro=1"
  for cfg in "1f1b 2 pp=2 micro=1" "gpipe 2 pp=2 micro=1 pipeline=\"gpipe\"" "dp2 4 dp=2 pp=2 micro=1" \
             "tp2 4 tp=2 pp=2 micro=2" "zero1 4 dp=2 pp=2 zero=1 micro=1" "$zero23" \
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
  # --init of whole tensors into the stages (and --save-init out of them) under pp; traced: gpt_small's
  # tied embedding gradient (the head's part, wte's 64 x 32 f32 = 8192 B) crosses from the last
  # stage once a step (Megatron: once a step), not with each of the 4 micro-batches
  e2e_prog 0 "$m-init" "$mpirun" -np 2 --oversubscribe "./$m-1f1b" --init "$m-init.st" --save-init "$m-init2.st" \
    --save "$m-init.st.out" --metrics "$m-init.jsonl" --trace "$m-init.trace.json"
  if [ $m = gpt_small ]; then
    python3 - "$m-init.trace.json" <<'PY' || exit 1
import collections, json, sys
t = json.load(open(sys.argv[1]))
per = collections.Counter()
for e in (t["traceEvents"] if isinstance(t, dict) else t):
    a = e.get("args", {})
    if e.get("pid") == 1 and e.get("name") == "isend" and a.get("bytes") == 8192:
        per[a["step"]] += 1
if not per or any(n != 1 for n in per.values()):
    sys.exit("FAILED: the last stage's sends of wte's gradient per step: %s, expected 1 a step" % dict(per))
print("pp=2: the tied gradient crosses once a step:", dict(per))
PY
  fi
  cmp -s "$m-init.st" "$m-init2.st" || fail "$m: pp --save-init of the loaded params differs from the file loaded"
  e2e_close "$m pp=2 --init" "$m-1.jsonl" "$m-init.jsonl" "$m-1.st" "$m-init.st.out"
  # a wrong rank count: every rank says how the program runs, the degrees included
  if [ $m = gpt_small ]; then
    timeout 60 "$mpirun" --oversubscribe -np 3 "./$m-tp2" 2>wrong.err && fail "-np 3 of a tp=2 x pp=2 program succeeded"
    [ "$(grep -c 'built for 4 devices (mesh laptop, dp=1, tp=2, pp=2); run it with mpirun -np 4, not 3' wrong.err)" = 3 ] ||
      { cat wrong.err; fail "-np 3: every rank should say how to run it"; }
  fi
  # the pp checkpoint after 3 steps holds whole tensors: one device resumes it
  e2e_prog 0 "$m-resume" "./$m-1" --resume "ck-$m-1f1b/step_000003" --metrics "$m-res.jsonl"
  e2e_tail_close "$m pp=2 checkpoint -> 1 device" "$m-1.jsonl" "$m-res.jsonl" 3
done
# ---- the interleaved schedule: 4 layers, pp = 2 x 2 stages per rank
for m in gpt_small llama_small; do
  e2e_build "$m-L4" "$m.cplan" --set train.model.L=4
  e2e_prog 0 "$m-L4" "./$m-L4" --save "$m-L4.st" --metrics "$m-L4.jsonl"
  cfgs=("ilv 2 pp=2 micro=1" "ilvdp2 4 dp=2 pp=2 micro=1")
  # llama_small's tp = 2 alone misses the 1e-4 on its params with 4 layers (recompute.sh)
  if [ "$m" = gpt_small ]; then cfgs+=("ilvtp2 4 tp=2 pp=2 micro=1" "ilvzero1 4 dp=2 pp=2 zero=1 micro=1"); fi
  for cfg in "${cfgs[@]}"; do
    read -r label n fields <<<"$cfg"
    sets=(--set train.model.L=4 --set train.mesh=laptop --set "mesh.laptop.shape.cpu=$n" --set 'train.strategy.pipeline="interleaved"')
    for f in $fields; do sets+=(--set "train.strategy.$f"); done
    name="$m-$label"
    e2e_build "$name" "$m.cplan" "${sets[@]}"
    e2e_prog 0 "$name" "$mpirun" -np "$n" --oversubscribe "./$name" --save "$name.st" --metrics "$name.jsonl" \
      --checkpoint-every 3 --checkpoint-dir "ck-$name"
    e2e_says "$name" "(interleaved: 2 stages per rank)"
    e2e_close "$m L=4 interleaved $fields" "$m-L4.jsonl" "$name.jsonl" "$m-L4.st" "$name.st"
    e2e_prog 0 "$name-resume" "./$m-L4" --resume "ck-$name/step_000003" --metrics "$name-res.jsonl"
    e2e_tail_close "$m interleaved $fields checkpoint -> 1 device" "$m-L4.jsonl" "$name-res.jsonl" 3
  done
done

# refused: a micro-batch count that is not a multiple of pp (4 / 4 = 1), too few layers for
# pp x 2 stages (gpt_small has 2); the error points at the strategy's pipeline field
{ sed 's/^  seed      = 1234$/  seed      = 1234\n  mesh      = laptop\n  strategy  = { pp = 2, pipeline = "interleaved", micro = MICRO }/' \
    "$src/tests/e2e/gpt_small.cplan"; printf '\nmesh laptop {\n  shape  = [cpu = 2]\n  device = cpu\n}\n'; } >ilv_bad.cplan
grep -q 'micro = MICRO' ilv_bad.cplan || fail "ilv_bad.cplan: the edit of gpt_small.cplan did not apply"
line=$(grep -n 'strategy  = {' ilv_bad.cplan | cut -d: -f1)
sed 's/MICRO/4/' ilv_bad.cplan >ilv_micro.cplan
sed 's/MICRO/1/' ilv_bad.cplan >ilv_layers.cplan
e2e_prog 1 ilv-micro "$cplanc" build ilv_micro.cplan -o ilv_micro --set train.model.L=4
e2e_says ilv-micro "ilv_micro.cplan:$line:25: error: the interleaved schedule needs the micro-batch count to be a multiple of pp = 2: batch 4 / (dp 1 x micro 4) = 1 micro-batch" "^~~~"
e2e_prog 1 ilv-layers "$cplanc" build ilv_layers.cplan -o ilv_layers
e2e_says ilv-layers "ilv_layers.cplan:$line:25: error: the interleaved schedule cuts the model into pp x 2 = 4 stages of whole layers, but model gpt_small has 2 layers" "^~~~"
# refused: ZeRO 3 with pp when the first and the last stage both read a param (gpt_small's tied wte);
# the error names it and the way out, at the zero field
sed 's/MICRO/1/; s/pp = 2, pipeline = "interleaved"/dp = 2, pp = 2, zero = 3/; s/cpu = 2]/cpu = 4]/' ilv_bad.cplan >z3_tied.cplan
e2e_prog 1 z3-tied "$cplanc" build z3_tied.cplan -o z3_tied
e2e_says z3-tied "z3_tied.cplan:$line:33: error: zero = 3 with pp = 2 is not supported for a param that several pipeline stages read ('wte', read before the first layer and after the last: a tied embedding); use zero = 1 or 2" "^~~~"
# a model with a metric: only the last stage computes it, every rank reduces and reports it (the
# metrics line of rank 0, the first stage, shows the same accuracy as one device), under 1F1B and
# interleaved
sed 's|^  loss = cross_entropy(logits, targets)$|&\n  metric accuracy = mean(argmax(logits) == targets)|' gpt_small.cplan >gpt_metric.cplan
grep -q '^  metric accuracy' gpt_metric.cplan || fail "gpt_metric.cplan: the edit of gpt_small.cplan did not apply"
e2e_build metric-1 gpt_metric.cplan --set train.model.L=4
e2e_prog 0 metric-1 ./metric-1 --metrics metric-1.jsonl --save metric-1.st
for cfg in "pp2 pp=2 micro=1" "ilv pp=2 micro=1 pipeline=\"interleaved\""; do
  read -r label fields <<<"$cfg"
  sets=(--set train.mesh=laptop --set mesh.laptop.shape.cpu=2 --set train.model.L=4)
  for f in $fields; do sets+=(--set "train.strategy.$f"); done
  e2e_build "metric-$label" gpt_metric.cplan "${sets[@]}"
  e2e_prog 0 "metric-$label" "$mpirun" -np 2 --oversubscribe "./metric-$label" --metrics "metric-$label.jsonl" \
    --save "metric-$label.st"
  e2e_close "metric $fields" metric-1.jsonl "metric-$label.jsonl" metric-1.st "metric-$label.st"
  python3 - metric-1.jsonl "metric-$label.jsonl" <<'PY' || exit 1
import json, sys
a, b = ([json.loads(l).get("accuracy") for l in open(p)] for p in sys.argv[1:])
if None in a or None in b or any(abs(x - y) > 1e-6 for x, y in zip(a, b)):
    sys.exit("FAILED: pp accuracy metric %s vs one device %s" % (b, a))
PY
done
echo "pp.sh: ok"
