#!/usr/bin/env bash
# signals.sh CPLANC SRCDIR: SIGINT and SIGTERM sent from outside to a real built program.  The
# program (gpt_small built for 100,000 steps) runs in the background; once it has written a few
# steps of metrics, `kill -INT` (then, in a second run, `kill -TERM`) must make it finish its
# step, write a checkpoint (into --checkpoint-dir, or ./ckpt without one) and exit 0, with
# every finished step in the metrics.  `--resume` then continues from that checkpoint, and the
# steps it adds must equal, bit for bit, those of a straight run to the same step.  The same signal
# sent twice at once (timeout(1) signals the process, then its group) is one request, not a kill.
set -u
# shellcheck source=tests/e2e/e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
cp "$src/tests/e2e/gpt_small.cplan" .
e2e_tokens tokens.bin
e2e_build gpt gpt_small.cplan --set train.steps=100000

# interrupt NAME SIGNAL CKDIR FLAGS...: runs ./gpt FLAGS in the background, sends SIGNAL once
# it has finished 3 steps, and checks the exit and the checkpoint; sets $stopped (steps done).
interrupt() {
  local name=$1 sig=$2 ckdir=$3 pid rc i
  shift 3
  ./gpt --threads 1 --metrics "$name.jsonl" "$@" 2>"$name.err" &
  pid=$!
  for i in $(seq 400); do # up to 20 s
    [ -f "$name.jsonl" ] && [ "$(grep -c . "$name.jsonl")" -ge 3 ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  # twice: the signal again 0.5 ms later, once the handler has run (closer ones merge into one)
  local n=1
  [ "$name" = twice ] && n=2
  python3 -c 'import os, signal, sys, time
for k in range(int(sys.argv[3])):
    if k: time.sleep(0.0005)
    os.kill(int(sys.argv[1]), getattr(signal, "SIG" + sys.argv[2]))' "$pid" "$sig" "$n" 2>/dev/null ||
    { cat "$name.err"; fail "$name: the program ended before the signal"; }
  for _ in $(seq 400); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    fail "$name: still running 20 s after SIG$sig"
  fi
  wait "$pid"
  rc=$?
  [ "$rc" = 0 ] || { cat "$name.err"; fail "$name: exit status $rc after SIG$sig, expected 0"; }
  stopped=$(grep -c . "$name.jsonl")
  [ "$stopped" -ge 3 ] || fail "$name: $stopped steps before SIG$sig"
  local what=interrupted
  [ "$sig" = TERM ] && what=terminated
  e2e_says "$name" "$what after step $stopped" "--resume $ckdir"
  [ -f "$ckdir/$(printf 'step_%06d' "$stopped")/state.json" ] ||
    { ls -R "$ckdir"; fail "$name: no checkpoint of step $stopped in $ckdir"; }
  echo "$name: SIG$sig after step $stopped: exit 0, checkpoint in $ckdir"
}

# resume_same NAME CKDIR: 3 more steps with --resume, against a straight run to the same step.
resume_same() {
  local name=$1 ckdir=$2 to=$((stopped + 3))
  e2e_prog 0 "$name.resume" ./gpt --threads 1 --resume "$ckdir" --steps "$to" --metrics "$name.jsonl"
  e2e_says "$name.resume" "resumed from $ckdir"
  e2e_prog 0 "$name.straight" ./gpt --threads 1 --steps "$to" --metrics "$name.straight.jsonl" --quiet
  [ "$(grep -c . "$name.jsonl")" = "$to" ] || fail "$name: not $to metrics lines after the resume"
  if ! diff <(e2e_det "$name.straight.jsonl") <(e2e_det "$name.jsonl") >"$name.diff"; then
    cat "$name.diff"
    fail "$name: the interrupted and resumed run differs from the straight one (< straight)"
  fi
  echo "$name: resumed to step $to, the same as a straight run"
}

interrupt int INT ck --checkpoint-dir ck
resume_same int ck
interrupt term TERM ckpt
resume_same term ckpt
rm -rf ckpt
interrupt twice TERM ckpt

# `cplanc run` of a 2-device mesh runs the program under mpirun, which on SIGINT/SIGTERM aborts
# the job (the ranks get SIGTERM, then SIGKILL a second later) and exits 1, and on a second one
# before the job is down exits at once, leaving the ranks: cplanc passes the signal to the ranks
# instead, and the run stops
# as one program does (exit 0, a checkpoint). SIGINT to cplanc alone (kill), then twice at once to
# its whole process group (Ctrl-C, twice, at a terminal; timeout(1) also signals both ways).
e2e_mpi
{ cat gpt_small.cplan; printf '\nmesh laptop {\n  shape  = [cpu = 2]\n  device = cpu\n}\n'; } >gpt_mr.cplan
export CPLAN_CACHE=$tmp/cache
mr=(gpt_mr.cplan --set train.mesh=laptop --set train.strategy.dp=2 --set train.steps=100000)
e2e_prog 0 run_build "$cplanc" run "${mr[@]}" -- --steps 1 # builds into the cache
# interrupt_run NAME TO N [AFTER]: `cplanc run` as a process group of its own, as a shell's
# foreground job (perl's setpgrp, then exec: the same pid; not setsid, whose new session the busy
# ranks can starve this script's out of the CPUs for the whole run); SIGINT N times to TO (its pid,
# or its group) once step 3 is done, or AFTER seconds from the start (the ranks are then being
# started, loading, or in MPI_Init: a rank signalled before its handlers were in died of it).
interrupt_run() {
  local name=$1 to=$2 n=$3 after=${4:-} pid rc
  perl -e 'setpgrp(0, 0) or die "setpgrp: $!"; exec @ARGV or die "exec: $!"' "$cplanc" run "${mr[@]}" -- \
    --threads 1 --metrics "$name.jsonl" --checkpoint-dir "$name.ck" 2>"$name.err" &
  pid=$!
  sleep 0.2
  [ "$(ps -o pgid= -p "$pid" | tr -d ' ')" = "$pid" ] || { kill "$pid"; fail "$name: cplanc run is not a group of its own"; }
  SECONDS=0
  while [ -z "$after" ] && [ "$SECONDS" -lt 30 ] && kill -0 "$pid" 2>/dev/null; do
    [ -n "$(sed -n '3{p;q}' "$name.jsonl" 2>/dev/null)" ] && break
    sleep 0.05
  done
  [ -z "$after" ] || sleep "$after"
  python3 -c 'import os, signal, sys, time
pid = int(sys.argv[1]) * (-1 if sys.argv[2] == "group" else 1)
for k in range(int(sys.argv[3])):
    if k: time.sleep(0.0005)
    os.kill(pid, signal.SIGINT)' "$pid" "$to" "$n" 2>/dev/null ||
    { tail -20 "$name.err"; fail "$name: cplanc run ended before the signal"; }
  SECONDS=0
  while [ "$SECONDS" -lt 20 ] && kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid"
    pkill -KILL -f -- "$CPLAN_CACHE/" # the ranks, in process groups of their own
    fail "$name: cplanc run still running 20 s after SIGINT"
  fi
  wait "$pid"
  rc=$?
  [ "$rc" = 0 ] || { tail -20 "$name.err"; fail "$name: cplanc run exited with $rc after SIGINT, expected 0"; }
  stopped=$(grep -c . "$name.jsonl")
  e2e_says "$name" "2 ranks" "interrupted after step $stopped" "--resume $name.ck"
  [ -f "$name.ck/$(printf 'step_%06d' "$stopped")/state.json" ] ||
    { ls -R "$name.ck"; fail "$name: no checkpoint of step $stopped in $name.ck"; }
  echo "$name: SIGINT x$n to the $to of cplanc run (2 ranks) after step $stopped: exit 0, checkpoint"
}
interrupt_run run_pid pid 1
interrupt_run run_group group 2
for after in 0 0.1 0.2 0.3 0.4; do interrupt_run "run_start$after" pid 1 "$after"; done
echo "ok"
