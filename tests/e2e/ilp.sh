#!/usr/bin/env bash
# ilp.sh CPLANC SRCDIR: the search's placement ILP (docs/language.md §7, "Tensor-parallel placements").
# On a mesh of 2 (and 4) CPUs the search ranks, beside Megatron's rule, the plans whose params sit on
# the tp axis where the ILP put them (`tp*`); such a plan saved by `cplanc plan --json` carries every
# param's placement ("tp_params"), `build --plan` builds exactly it, and the program trains like the
# single device (the losses, gradient norms and params of e2e_close), with sequence parallelism and
# dp x tp too. A plan that names a param the model lacks, or a placement that is not R / S(d), is an
# error naming it. The ILP's placements combine with pp and ZeRO 1 and 3 (4 ranks).
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi
e2e_tokens tokens.bin

# ilp_plan OUT.json N SP: the search's best plan on N CPUs whose params the ILP placed (tp*), with
# sequence parallelism SP, as the plan's best (what `build --plan` builds)
ilp_plan() {
  "$cplanc" plan gpt_small.cplan --json --top 100 --set train.mesh=laptop --set "mesh.laptop.shape.cpu=$2" \
    >"all_$1" 2>"plan_$1.log" || { cat "plan_$1.log"; fail "cplanc plan --json on $2 CPUs"; }
  python3 - "all_$1" "$1" "$3" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
c = [p for p in d["candidates"] if "tp_params" in p and p["sp"] == int(sys.argv[3])]
if not c:
    sys.exit("FAILED: no ILP plan (tp_params) with sp = %s among %d candidates" % (sys.argv[3], len(d["candidates"])))
if d.get("ilp_solves", 0) < 1:
    sys.exit("FAILED: the search reports no ILP solved")
d["best"] = c[0]
json.dump(d, open(sys.argv[2], "w"))
PY
}

e2e_laptop <"$src/tests/e2e/gpt_small.cplan" >gpt_small.cplan
e2e_build one gpt_small.cplan
e2e_prog 0 one ./one --save one.st --metrics one.jsonl

for c in "2 1" "2 2" "4 1"; do
  read -r n sp <<<"$c"
  label="ilp-$n-sp$sp"
  ilp_plan "$label.json" "$n" "$sp"
  "$cplanc" build gpt_small.cplan -o "$label" --plan "$label.json" --set train.mesh=laptop \
    --set "mesh.laptop.shape.cpu=$n" 2>"build_$label.log" || { cat "build_$label.log"; fail "$label: build --plan"; }
  e2e_prog 0 "$label" "$mpirun" -np "$n" --oversubscribe "./$label" --save "$label.st" --metrics "$label.jsonl"
  e2e_close "$label" one.jsonl "$label.jsonl" one.st "$label.st"
  # priced as built: the plan's bytes per device are its explained collectives' (what the lowering runs)
  "$cplanc" plan gpt_small.cplan --plan "$label.json" --json --set train.mesh=laptop --set "mesh.laptop.shape.cpu=$n" \
    >"$label.pin.json" 2>"$label.pin.log" || { cat "$label.pin.log"; fail "$label: plan --plan --json"; }
  python3 - "$label" "$label.pin.json" <<'PY' || exit 1
import json, sys
label, path = sys.argv[1:]
p = json.load(open(path))
comm = sum(c["bytes"] * c["per_step"] for c in p["collectives"])
got = p["best"]["comm_bytes_per_device"]
if "tp_params" not in p["best"] or abs(got - comm) > 64:  # the loss's and norm's scalars are not priced
    sys.exit("FAILED: %s: the ranking prices %.0f bytes per device, the explained collectives %.0f (tp_params %s)"
             % (label, got, comm, "tp_params" in p["best"]))
PY
done

# placements no rule makes, as the ILP may choose them on another model: a whole QKV weight, a
# column-split attention output, a row-split first MLP weight reading a whole input, split norm
# weights and a table split along its channels
python3 - ilp-2-sp1.json <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
pick = {"c_attn.weight": "R", "c_attn.bias": "R", "attn.c_proj.weight": "S(1)", "attn.c_proj.bias": "S(0)",
        "c_fc.weight": "S(0)", "c_fc.bias": "R", "mlp.c_proj.weight": "R", "ln_1.weight": "S(0)", "ln_2.bias": "S(0)",
        "wte": "S(1)", "wpe": "S(0)"}
tpp = d["best"]["tp_params"]
for k in tpp:
    for suf, v in pick.items():
        if k.endswith(suf): tpp[k] = v
json.dump(d, open("mix.json", "w"))
PY
"$cplanc" build gpt_small.cplan -o mix --plan mix.json --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 \
  2>build_mix.log || { cat build_mix.log; fail "mix: build --plan"; }
"$cplanc" plan gpt_small.cplan --plan mix.json --explain --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 \
  >mix.explain 2>&1 || { cat mix.explain; fail "mix: plan --plan --explain"; }
grep -qE '^  h.1.attn.c_attn.weight +f32\[32, 96\] +\[R\]  \(the ILP.s; Megatron.s rule: S\(1\)\)' mix.explain ||
  { cat mix.explain; fail "mix: plan --explain does not show the plan's placement of c_attn.weight"; }
e2e_prog 0 mix "$mpirun" -np 2 --oversubscribe ./mix --save mix.st --metrics mix.jsonl
e2e_close "mixed placements" one.jsonl mix.jsonl one.st mix.st
# the same placements on 4 ranks with pp = 2 (1f1b, 2 micro-batches), and dp = 2 with ZeRO 1 and 3
python3 - <<'PY' || exit 1
import json
d = json.load(open("mix.json"))
for name, upd in [("mix_pp", dict(dp=1, tp=2, pp=2, micro=2, microbatches=2, pipeline="1f1b")),
                  ("mix_z1", dict(dp=2, tp=2, pp=1, zero=1, micro=2)), ("mix_z3", dict(dp=2, tp=2, pp=1, zero=3, micro=1))]:
    e = json.loads(json.dumps(d))
    e["best"].update(upd)
    json.dump(e, open(name + ".json", "w"))
PY
for m in mix_pp mix_z1 mix_z3; do
  "$cplanc" build gpt_small.cplan -o "$m" --plan "$m.json" --set train.mesh=laptop --set mesh.laptop.shape.cpu=4 \
    2>"build_$m.log" || { cat "build_$m.log"; fail "$m: build --plan"; }
  e2e_prog 0 "$m" "$mpirun" -np 4 --oversubscribe "./$m" --save "$m.st" --metrics "$m.jsonl"
  e2e_close "$m" one.jsonl "$m.jsonl" one.st "$m.st"
done

# random placements (fixed seeds) of gpt_small's and llama_small's params on tp = 2, with and without
# sequence parallelism: each builds and trains as one device. Such placements found the blocked
# layout taken from a whole input's contiguous part (a whole QKV weight plus a split bias), rope on a
# sequence-split k, the all-to-all (S(1) -> S(2)) no backend ran, and slices of contiguous splits
# the build refused (now read whole).
e2e_laptop <"$src/tests/e2e/llama_small.cplan" >llama_small.cplan
e2e_build one_llama llama_small.cplan
e2e_prog 0 one_llama ./one_llama --save one_llama.st --metrics one_llama.jsonl
for m in gpt_small llama_small; do
  "$cplanc" check --json "$m.cplan" >"$m.check.json" 2>/dev/null || fail "check --json $m"
  python3 - "$m" <<'PY' || exit 1
import json, random, sys
m = sys.argv[1]
params = [(p["name"], p["shape"]) for p in json.load(open(m + ".check.json"))["param_tensors"]]
rng = random.Random(8 if m == "gpt_small" else 7)
for t in range(6):
    pins = {n: rng.choice(["R"] + ["S(%d)" % d for d, s in enumerate(sh) if s % 2 == 0]) for n, sh in params}
    best = dict(dp=1, tp=2, pp=1, sp=1 + t % 2, zero=0, micro=4, recompute="none", tp_params=pins)
    json.dump({"format": "cplan-plan/1", "best": best}, open("rnd_%s_%d.json" % (m, t), "w"))
PY
  ref=one.jsonl refst=one.st
  [ "$m" = llama_small ] && ref=one_llama.jsonl refst=one_llama.st
  for t in 0 1 2 3 4 5; do
    r=rnd_${m}_$t
    "$cplanc" build "$m.cplan" -o "$r" --plan "$r.json" --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 \
      2>"build_$r.log" || { cat "build_$r.log"; fail "$r: build --plan"; }
    e2e_prog 0 "$r" "$mpirun" -np 2 --oversubscribe "./$r" --save "$r.st" --metrics "$r.jsonl"
    e2e_close "$r" "$ref" "$r.jsonl" "$refst" "$r.st"
  done
done
# the case that found rope on a sequence-split k: wk row-split under sp (its input arrives split along
# the sequence and is resharded to the channels, an all-to-all; rope and the causal sdpa need whole
# positions)
python3 - <<'PY' || exit 1
import json
best = dict(dp=1, tp=2, pp=1, sp=2, zero=0, micro=4, recompute="none",
            tp_params={"layers.%d.attention.wk.weight" % l: "S(0)" for l in range(2)})
json.dump({"format": "cplan-plan/1", "best": best}, open("wk_rows.json", "w"))
PY
"$cplanc" build llama_small.cplan -o wk_rows --plan wk_rows.json --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 \
  2>build_wk_rows.log || { cat build_wk_rows.log; fail "wk_rows: build --plan"; }
e2e_prog 0 wk_rows "$mpirun" -np 2 --oversubscribe ./wk_rows --save wk_rows.st --metrics wk_rows.jsonl
e2e_close "wk rows under sp" one_llama.jsonl wk_rows.jsonl one_llama.st wk_rows.st
# an all-to-all (S(1) -> S(2)): under sp, w3 whole makes its product split along the sequence, which
# meets w1's, split along the channels
python3 - <<'PY' || exit 1
import json
best = dict(dp=1, tp=2, pp=1, sp=2, zero=0, micro=4, recompute="none",
            tp_params={"layers.%d.feed_forward.w3.weight" % l: "R" for l in range(2)})
json.dump({"format": "cplan-plan/1", "best": best}, open("a2a.json", "w"))
PY
"$cplanc" build llama_small.cplan -o a2a --plan a2a.json --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 \
  --keep-c a2a_c 2>build_a2a.log || { cat build_a2a.log; fail "a2a: build --plan"; }
grep -q "rt_comm_all_to_all(" a2a_c/plan.c || fail "a2a: the program makes no all-to-all"
e2e_prog 0 a2a "$mpirun" -np 2 --oversubscribe ./a2a --save a2a.st --metrics a2a.jsonl
e2e_close "all-to-all" one_llama.jsonl a2a.jsonl one_llama.st a2a.st

# Megatron's rule too: a slice along the sequence of the residual stream sp splits in contiguous
# parts reads it whole (tests/golden/emit_sp_slice_split.cplan, which used to be refused), on
# dp 2 x tp 2 x sp 2 as one device
sed -e 's/no_such_data.safetensors/slice.safetensors/' -e 's/steps    = 10/steps    = 6/' \
  "$src/tests/golden/emit_sp_slice_split.cplan" >sps.cplan
python3 - <<'PY' || exit 1
import json, random, struct
rng = random.Random(3)
vals = [rng.randrange(16) for _ in range(64 * 32)]
h = json.dumps({"tok": {"dtype": "I32", "shape": [64, 32], "data_offsets": [0, 4 * len(vals)]}}).encode()
h += b" " * (-len(h) % 8)
open("slice.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<%di" % len(vals), *vals))
PY
e2e_build sps1 sps.cplan --set mesh.box.shape.cpu=1 --set 'train.strategy={dp=1}'
e2e_prog 0 sps1 ./sps1 --save sps1.st --metrics sps1.jsonl
e2e_build sps4 sps.cplan
e2e_prog 0 sps4 "$mpirun" -np 4 --oversubscribe ./sps4 --save sps4.st --metrics sps4.jsonl
e2e_close "slice of a sequence-split residual" sps1.jsonl sps4.jsonl sps1.st sps4.st

# what a plan may not say
python3 - ilp-2-sp1.json <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
bad = json.loads(json.dumps(d)); bad["best"]["tp_params"]["no.such.param"] = "R"
json.dump(bad, open("bad_name.json", "w"))
bad = json.loads(json.dumps(d)); bad["best"]["tp_params"]["wte"] = "S(x)"
json.dump(bad, open("bad_pl.json", "w"))
bad = json.loads(json.dumps(d)); bad["best"]["tp_params"]["wte"] = "S(5)"
json.dump(bad, open("bad_dim.json", "w"))
PY
sets=(--set train.mesh=laptop --set mesh.laptop.shape.cpu=2)
e2e_prog 1 bad_name "$cplanc" build gpt_small.cplan -o bad --plan bad_name.json "${sets[@]}"
e2e_says bad_name "the plan places param 'no.such.param' on tp, but the model has no param of that name"
e2e_prog 1 bad_pl "$cplanc" build gpt_small.cplan -o bad --plan bad_pl.json "${sets[@]}"
e2e_says bad_pl 'bad_pl.json: best.tp_params.wte should be "R" or "S(d)"'
e2e_prog 1 bad_dim "$cplanc" build gpt_small.cplan -o bad --plan bad_dim.json "${sets[@]}"
e2e_says bad_dim "the plan splits param 'wte' [64, 32] along dim 5, which it does not have"
echo ok
