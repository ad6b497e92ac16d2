#!/usr/bin/env bash
# plan_search.sh CPLANC: `cplanc plan` beyond the golden text: --json (cplan-plan/1 with best,
# candidates, search_seconds and the fields every plan must have), --trace (a Chrome trace with a
# forward and a backward per micro-batch and stage), --report (a page with three inline SVGs),
# `build --plan` with the saved plan (it builds, and the built program's strategy is the plan's),
# pinned tensor-parallel strategies priced as the build places them (plan --json's row against
# its explained collectives and params), and the errors: a file that is not a plan, a missing
# file, a bad --top.  A few seconds.
set -u
cplanc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_plan_search.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
cp "$here/../golden/plan_auto.cplan" "$tmp/m.cplan"
cd "$tmp" || exit 1

# the pipelined plan of the 20B model: trace and report
"$cplanc" plan "$here/../golden/plan_search_fit.cplan" --top 4 --json --trace t.json --report r.html >p.json ||
  fail "plan --json --trace --report"
python3 - <<'PY' || fail "the plan, trace or report is wrong"
import json
p = json.load(open("p.json"))
assert p["format"] == "cplan-plan/1", p["format"]
assert p["search_seconds"] > 0
assert len(p["candidates"]) == 4 and p["candidates"][0] == p["best"]
keys = "dp tp pp sp zero micro microbatches recompute step_time_s memory_per_device_bytes comm_bytes_per_device mfu".split()
for c in p["candidates"]:
    for k in keys:
        assert k in c, k
    assert c["dp"] * c["tp"] * c["pp"] == 16
    assert c["memory_per_device_bytes"] <= p["memory_limit_bytes"]
steps = [c["step_time_s"] for c in p["candidates"]]
assert steps == sorted(steps) or max(steps) - min(steps) < 0.01 * min(steps), steps
b = p["best"]
t = json.load(open("t.json"))
ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
mb = b["microbatches"] * b.get("chunks", 1)
assert sum(e["name"].startswith("forward") for e in ev) == mb * b["pp"], len(ev)
assert sum(e["name"].startswith("backward") for e in ev) == mb * b["pp"]
end = max(e["ts"] + e["dur"] for e in ev) / 1e6
assert 0.8 * b["step_time_s"] < end < 1.2 * b["step_time_s"], (end, b["step_time_s"])
r = open("r.html").read()
assert r.count("<svg") == 3 and "</html>" in r and "<script" not in r and "http" not in r
PY

# build --plan: the saved plan's strategy is the one built
"$cplanc" plan --json m.cplan >m.json || fail "plan --json m.cplan"
"$cplanc" build m.cplan --plan m.json -o prog 2>build.err || { cat build.err; fail "build --plan"; }
[ -x prog ] || fail "build --plan wrote no program"
python3 - <<'PY' || fail "could not write the tp plan"
import json
p = json.load(open("m.json")); p["best"].update(dp=1, tp=2, zero=0, micro=8); json.dump(p, open("tp.json", "w"))
PY
"$cplanc" build m.cplan --plan tp.json -o prog_tp --keep-c c 2>build.err || { cat build.err; fail "build --plan tp.json"; }
grep -q "\.tp = 2," c/plan.c || fail "the program built from tp.json is not tensor-parallel"

# tp splits the heads: on 6 devices (batch 12) the 4-head model gets no plan with tp 3 or 6, which
# the build would refuse; tp 2 is among the candidates
"$cplanc" plan m.cplan --set mesh.box.shape.cpu=6 --set train.batch=12 --top 100 --json >h.json 2>h.err ||
  { cat h.err; fail "plan on 6 devices"; }
python3 - <<'PY' || fail "a candidate's tp does not divide the 4 heads"
import json
tps = sorted(set(c["tp"] for c in json.load(open("h.json"))["candidates"]))
assert 2 in tps and all(4 % t == 0 for t in tps), tps
PY

# the stage cut the plan prices is the one built: 5 layers on pp 2 are 3 then 2 (Megatron's rule,
# the remainder in front; even where the 4096-token head would make 4 then 1 faster), in the
# plan's stage_layers and in each stage's params table of the program emit --plan prints
pp=(--set mesh.box.shape.cpu=2 --set train.model.L=5 --set train.model.vocab=4096 --set train.strategy.pp=2 --set 'train.strategy.pipeline="1f1b"')
"$cplanc" plan m.cplan "${pp[@]}" --json >pp.json 2>pp.err || { cat pp.err; fail "plan with pp 2"; }
grep -q '"stage_layers":[[:space:]]*\[3, 2\]' pp.json || { grep stage_layers pp.json; fail "the plan's stage_layers are not [3, 2]"; }
"$cplanc" emit --stage=c m.cplan "${pp[@]}" --plan pp.json >pp.c 2>pp.err || { cat pp.err; fail "emit --plan pp.json"; }
got=$(awk '/^\/\* ==== plan_s[0-9]+\.c/ { f = $3 } /^static const RtPlanParam params\[\]/ { t = 1; next }
           t && /^};/ { t = 0 } t && match($0, /"h\.[0-9]+\./) { print f, substr($0, RSTART + 1, RLENGTH - 2) }' pp.c | sort -u | tr '\n' ' ')
[ "$got" = "plan_s0.c h.0 plan_s0.c h.1 plan_s0.c h.2 plan_s1.c h.3 plan_s1.c h.4 " ] ||
  fail "the built stages hold the layers '$got', not h.0-h.2 then h.3-h.4"

# the search prices the placements the build makes: for a pinned strategy, the ranked row's bytes
# per device per step are the explained collectives' (what the lowering runs), and its gradient
# memory is the params as placed (f32, 4 bytes per element on a device). GPT-2's 50257-row
# embedding stays whole under tp (its tied head too), a 50304-row one is vocab-parallel; LLaMA's
# q, k and v read one norm's output (one gradient all-reduce, not three); sp, ZeRO, bf16 and f32.
# plan_nograd.cplan: values no gradient reaches send nothing backward, and a partial sum reduced
# for a split consumer (a column-parallel matmul reading the vocab-parallel embedding directly)
# has its gradient all-reduced.
ex="$here/../../examples"
while IFS='|' read -r file strat extra; do
  args=(plan "$ex/$file" --set "train.strategy=$strat")
  [ -n "$extra" ] && args+=(--set "$extra")
  "$cplanc" "${args[@]}" --json >pin.json 2>pin.err || { cat pin.err; fail "plan --json $file $strat $extra"; }
  python3 - "$file $strat $extra" <<'PY' || fail "the search does not price what the build runs: $file $strat $extra"
import json, re, sys
p = json.load(open("pin.json"))
b = p["best"]
names = [a["name"] for a in p["axes"]]
size = {a["name"]: a["size"] for a in p["axes"]}
comm = sum(c["bytes"] * c["per_step"] for c in p["collectives"])
elems = 0.0
for t in p["tensors"]:
    if t["op"] != "param":
        continue
    n = 1
    for d in re.findall(r"\d+", t["shape"].split("[", 1)[1]):
        n *= int(d)
    pl = t["placement"].strip("[]").split(", ")
    if "tp" in names and pl[names.index("tp")].startswith("S"):
        n /= size["tp"]
    elems += n
zero = b["zero"]
grads = elems * 4 / (size.get("dp", 1) if zero >= 2 else 1)
def close(a, e): return abs(a - e) <= max(1e-6 * abs(e), 64)  # the loss's and norm's scalars are not priced
ok = close(b["comm_bytes_per_device"], comm) and close(b["memory"]["grads"], grads)
print(f"{sys.argv[1]}: comm/dev {b['comm_bytes_per_device']:.0f} explained {comm:.0f}; grads {b['memory']['grads']:.0f} "
      f"placed {grads:.0f}", file=sys.stderr if ok else sys.stdout)
assert ok
PY
done <<'CASES'
gpt2.cplan|{dp=4, tp=2, sp=1, micro=16, zero=0, recompute="none"}|
gpt2.cplan|{dp=4, tp=2, sp=2, micro=16, zero=3, recompute="none"}|
gpt2.cplan|{dp=2, tp=4, sp=1, micro=16, zero=1, recompute="selective"}|
gpt2.cplan|{dp=4, tp=2, sp=2, micro=16, zero=1, recompute="none"}|train.model.vocab=50304
llama.cplan|{dp=1, tp=2, sp=1, micro=8, zero=0, recompute="none"}|
llama.cplan|{dp=1, tp=2, sp=2, micro=8, zero=0, recompute="none"}|train.precision="f32"
../tests/cli/plan_nograd.cplan|{dp=1, tp=2, sp=1, micro=8, zero=0, recompute="none"}|
CASES

# a partly pinned strategy builds the defaults of the fields it leaves out, unless they do not fit:
# GPT-2 at batch 512 with { dp = 8 } makes micro-batches of 64 (logits past 2^31 elements), so the
# search chooses micro, zero and recompute, keeping dp 8; with micro 16 pinned the defaults fit
"$cplanc" emit --stage=c "$ex/gpt2.cplan" --set 'train.strategy={dp=8}' >dp8.c 2>dp8.err || { cat dp8.err; fail "emit {dp=8}"; }
grep -q 'cplanc: strategy: the defaults of the fields it leaves out (dp 8, micro 64, zero 0, recompute none) do not fit, so the search chose dp 8, tp 1, pp 1' dp8.err ||
  { cat dp8.err; fail "{dp=8}: no line saying the search chose"; }
grep -q '^    \.dp = 8,' dp8.c && ! grep -q '^    \.micro = 64,' dp8.c || fail "{dp=8}: the program is not the search's dp 8 plan"
"$cplanc" emit --stage=c "$ex/gpt2.cplan" --set 'train.strategy={dp=8, micro=16}' >dp8m.c 2>dp8m.err ||
  { cat dp8m.err; fail "emit {dp=8, micro=16}"; }
grep -q 'search chose' dp8m.err && { cat dp8m.err; fail "{dp=8, micro=16}: the defaults fit, yet the search chose"; }
# defaults the build refuses for a reason other than fit stay its errors, the ones check and plan give:
# { sp = 2 } leaves tp at 1 (sp needs tp and equals it); the search must not pick tp 2 for it
"$cplanc" emit --stage=c "$ex/gpt2.cplan" --set 'train.strategy={sp=2}' >sp2.c 2>sp2.err && fail "{sp=2} without tp was accepted"
grep -q 'search chose' sp2.err && { cat sp2.err; fail "{sp=2}: the search filled in a tp"; }
grep -q 'error: sp = 2 without tp' sp2.err || { cat sp2.err; fail "{sp=2}: not check's error"; }
"$cplanc" check "$ex/gpt2.cplan" --set 'train.strategy={sp=2}' >/dev/null 2>sp2c.err && fail "check accepted {sp=2}"
grep -q 'error: sp = 2 without tp' sp2c.err || { cat sp2c.err; fail "{sp=2}: check's error differs"; }
# the build's strategy checks run once: a warning of theirs (tp leaves a table whole) is said once
"$cplanc" emit --stage=c "$here/../golden/check_tp_vocab_whole.cplan" >/dev/null 2>vw.err || { cat vw.err; fail "emit check_tp_vocab_whole"; }
[ "$(grep -c 'warning: tp = 4 does not divide the 50 rows' vw.err)" = 1 ] || { cat vw.err; fail "the tp warning is not said once"; }
# an sp that does not divide the sequence: the same words from check and build (the length, not a
# shape whose batch dim is the replica's at check and the global micro-batch's at build)
for cmd in check "emit --stage=c"; do
  "$cplanc" $cmd "$ex/gpt2.cplan" --set 'train.strategy={tp=2, sp=2}' --set train.model.ctx=1023 >/dev/null 2>sp3.err &&
    fail "$cmd accepted sp 2 on a sequence of 1023"
  grep -q "error: sp = 2 does not divide the sequence length 1023 (dim 1 of input 'idx')$" sp3.err ||
    { cat sp3.err; fail "$cmd: wrong words for sp 2 on a sequence of 1023"; }
done

# errors
echo '{"format": "other"}' >bad.json
"$cplanc" build m.cplan --plan bad.json -o x 2>err.txt && fail "a file that is not a plan was accepted"
grep -q 'bad.json: not a plan' err.txt || { cat err.txt; fail "wrong message for a non-plan"; }
"$cplanc" build m.cplan --plan missing.json -o x 2>err.txt && fail "a missing plan was accepted"
grep -q 'missing.json: cannot open the plan' err.txt || { cat err.txt; fail "wrong message for a missing plan"; }
"$cplanc" plan m.cplan --top 0 2>err.txt; [ $? = 2 ] || fail "--top 0 is not a usage error"
grep -q -- '--top takes a number' err.txt || { cat err.txt; fail "wrong message for --top 0"; }
echo "ok"
