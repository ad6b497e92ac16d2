#!/usr/bin/env bash
# resume.sh CPLANC SRCDIR: exact resume with real built programs.  Each case trains straight for
# 6 steps, then again in pieces, each piece a new process continuing with --resume from the
# checkpoint of the one before, and wants the metrics JSONL (loss, lr, grad_norm, metrics,
# evaluations; not the timings) to be the same text, bit for bit:
#   gpt_small, token data, 2 threads                       3 steps, then 3
#   gpt_small with accumulation (micro 2 of batch 4)      3 steps (checkpoints at 2 and 3), then 3
#   adder_tiny: adder data, accumulation, a metric and an evaluation every 2 steps: 1, 3, then 2
set -u
# shellcheck source=tests/e2e/e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
cp "$src/tests/e2e/gpt_small.cplan" "$src/tests/e2e/adder_tiny.cplan" .
e2e_tokens tokens.bin

# same_run NAME PROG FLAGS -- STOPS...: a straight run against runs stopping at each of STOPS.
same_run() {
  local name=$1 prog=$2 flags=() stop n
  shift 2
  while [ "$1" != -- ]; do flags+=("$1"); shift; done
  shift
  e2e_prog 0 "$name.straight" "./$prog" --quiet --metrics "$name.straight.jsonl" "${flags[@]}"
  local resume=()
  for stop in "$@"; do
    e2e_prog 0 "$name.to$stop" "./$prog" --steps "$stop" --checkpoint-dir "$name.ck" \
      --metrics "$name.pieces.jsonl" "${flags[@]}" "${resume[@]}"
    [ -d "$name.ck/$(printf 'step_%06d' "$stop")" ] || fail "$name: no checkpoint for step $stop"
    if [ ${#resume[@]} -gt 0 ]; then e2e_says "$name.to$stop" "resumed from $name.ck"; fi
    resume=(--resume "$name.ck")
  done
  n=$(grep -c . "$name.straight.jsonl")
  [ "$n" = 6 ] || fail "$name: the straight run wrote $n metrics lines, not 6"
  # the losses must move, or equal texts would prove little
  [ "$(sed -n 's/.*"loss":\([^,]*\).*/\1/p' "$name.straight.jsonl" | sort -u | grep -c .)" = 6 ] ||
    fail "$name: the 6 losses are not all different"
  # every run also evaluates after its last step: drop the evaluations the straight run lacks
  awk 'NR == FNR { has[FNR] = /"val_loss"/; next }
       { if (!has[FNR]) gsub(/,"val_[A-Za-z0-9_.]*":[^,}]*/, ""); print }' \
    "$name.straight.jsonl" "$name.pieces.jsonl" >"$name.pieces.cut.jsonl"
  if ! diff <(e2e_det "$name.straight.jsonl") <(e2e_det "$name.pieces.cut.jsonl") >"$name.diff"; then
    cat "$name.diff"
    fail "$name: the resumed run differs from the straight run (< straight, > resumed)"
  fi
  echo "$name: resumed at steps $* matches the straight run bit for bit"
}

e2e_build gpt gpt_small.cplan
same_run gpt gpt --threads 2 --checkpoint-every 3 -- 3 6

# a damaged state.json is an error naming it, before any tensor is read or checkpoint written: a
# step that is not whole, not the step of its directory's name, or past the plan's steps; and a
# directory not named as the program names them (step_%06d) is not a checkpoint
bad_state() { # bad_state LABEL STEP WANT
  rm -rf "bad$1" && mkdir "bad$1" && cp -r gpt.ck/step_000006 "bad$1/"
  sed -i "s/\"step\":[[:space:]]*[0-9]*/\"step\": $2/" "bad$1/step_000006/state.json"
  e2e_prog 1 "bad$1" ./gpt --resume "bad$1" --checkpoint-dir "bad$1"
  e2e_says "bad$1" "$3"
  [ "$(ls "bad$1")" = step_000006 ] || fail "bad$1: the run wrote into its checkpoint directory"
}
bad_state frac 3.7 "step_000006/state.json: step, seed and data_offset must be whole numbers"
bad_state other 3 "step_000006/state.json: state.json says step 3, the directory's name step 6"
rm -rf badpast && mkdir badpast && cp -r gpt.ck/step_000006 badpast/last # a checkpoint named by the user
sed -i "s/\"step\":[[:space:]]*[0-9]*/\"step\": 1e12/" badpast/last/state.json
e2e_prog 1 badpast ./gpt --resume badpast/last
e2e_says badpast "badpast/last: at step 1000000000000, past the plan's 6 steps"
rm -rf odd && mkdir odd && cp -r gpt.ck/step_000003 odd/ && cp -r gpt.ck/step_000006 odd/step_6
e2e_prog 0 odd ./gpt --resume odd --steps 4
e2e_says odd "resumed from odd/step_000003 at step 3"
e2e_prog 0 done ./gpt --resume gpt.ck --steps 4
e2e_says done "nothing to train: the run starts at step 6, and --steps stops it at step 4"
# a step directory newer than the newest complete checkpoint but without its state.json is named
# in a warning, and the resume takes the complete one; with none complete, the error names it
rm -rf torn && mkdir torn && cp -r gpt.ck/step_000003 torn/ && mkdir torn/step_000005
e2e_prog 0 torn ./gpt --resume torn --steps 4
e2e_says torn "warning: torn/step_000005 has no state.json" "resumed from torn/step_000003 at step 3"
rm -rf torn/step_000003
e2e_prog 1 torn_only ./gpt --resume torn
e2e_says torn_only "torn: no complete checkpoint in it: step_000005/ has no state.json"
# resuming on other data is said: the checkpoint records how many tokens its run's --data held
grep -q '"data_tokens":' gpt.ck/step_000003/state.json || fail "state.json has no data_tokens"
for i in $(seq 200); do printf '%d+%d=%d; ' "$i" $((i * 5 % 11)) $((i + i * 5 % 11)); done >short.txt
"$cplanc" data text short.txt -o short.bin >/dev/null 2>&1 || fail "cplanc data text short.txt"
e2e_prog 0 otherdata ./gpt --resume gpt.ck/step_000003 --steps 4 --data short.bin
e2e_says otherdata "was written reading" "tokens of data, --data short.bin has"
e2e_prog 0 samedata ./gpt --resume gpt.ck/step_000003 --steps 4
grep -q "tokens of data" samedata.err && { cat samedata.err; fail "a warning about the data on the same data"; }
echo "gpt: damaged or foreign checkpoints are refused by name; nothing to train is said; torn and other data are said"

e2e_build gpt_accum gpt_small.cplan --set train.strategy.micro=2
grep -q "micro 2 x accum 2" <(./gpt_accum --steps 1 2>&1) || fail "gpt_accum does not accumulate"
same_run gpt_accum gpt_accum --threads 1 --checkpoint-every 2 -- 3 6

e2e_build adder adder_tiny.cplan
grep -q "micro 4 x accum 2" <(./adder --steps 1 2>&1) || fail "adder does not accumulate"
same_run adder adder --threads 1 --checkpoint-every 100 -- 1 4 6
grep -q '"val_loss"' adder.pieces.jsonl || fail "adder: no evaluation in the metrics"
echo "ok"
