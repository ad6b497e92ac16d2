#!/usr/bin/env bash
# trace.sh CPLANC SRCDIR: --trace FILE.json and the peak memory report of built programs.
# gpt_small (with validation data, eval every 3 steps, accumulation) on one rank and on 2 MPI
# ranks (dp = 2, loopback, --oversubscribe, as dp.sh runs them) with --trace and a checkpoint:
# the trace is valid JSON, every rank has a span for every step, micro-step, data load, update,
# eval and checkpoint; on 2 ranks the comm spans carry bytes whose sum per step equals the
# metrics' comm_bytes of that step; the metrics' peak_rss_bytes >= arena_bytes > 0, and the
# memory lines (one per rank) are printed.  A --trace path that cannot be written fails at once.
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi
e2e_tokens tokens.bin

# validation data (the training file again) and evaluation every 3 steps; a mesh --set resizes
sed -e 's|tokens("tokens.bin")|tokens("tokens.bin", val = "tokens.bin")|' \
    -e 's|^  seed .*|&\n  eval      = { every = 3, batches = 1 }|' "$src/tests/e2e/gpt_small.cplan" >g.cplan
e2e_laptop </dev/null >>g.cplan
{ grep -q 'val = "tokens.bin"' g.cplan && grep -q 'every = 3' g.cplan; } || fail "could not edit gpt_small.cplan"

e2e_build g1 g.cplan --set train.strategy.micro=1
e2e_build g2 g.cplan --set train.strategy.micro=1 --set train.mesh=laptop --set mesh.laptop.shape.cpu=2

e2e_prog 0 one ./g1 --trace t1.json --metrics m1.jsonl --checkpoint-dir ck1
e2e_says one "memory: peak RSS" "arenas" "trace: t1.json"
e2e_prog 0 two "$mpirun" --oversubscribe -np 2 ./g2 --trace t2.json --metrics m2.jsonl --checkpoint-dir ck2
e2e_says two "memory: rank 0: peak RSS" "memory: rank 1: peak RSS" "trace: t2.json"

check() {
  python3 - "$@" <<'PY' || exit 1
import json, sys
from collections import Counter
trace, metrics, nranks, accum = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def die(msg): sys.exit("FAILED: %s: %s" % (trace, msg))
try:
    ev = json.load(open(trace))
except ValueError as e:
    die("not valid JSON: %s" % e)
if not isinstance(ev, list): die("not a JSON array")
lines = [json.loads(l) for l in open(metrics)]
steps = [m["step"] for m in lines]
if steps != list(range(1, 7)): die("metrics steps %s" % steps)
x = [e for e in ev if e.get("ph") == "X"]
for e in x:
    for k in ("name", "pid", "tid", "ts", "dur", "args"):
        if k not in e: die("an event lacks %s: %s" % (k, e))
    if e["dur"] < 0 or e["ts"] < 0 or e["tid"] not in (0, 1): die("bad event %s" % e)
if min(e["ts"] for e in x) != 0: die("the earliest span does not start at 0")
if {e["pid"] for e in x} != set(range(nranks)): die("pids %s" % {e["pid"] for e in x})
names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
for r in range(nranks):
    if names.get((r, 0)) != "compute" or names.get((r, 1)) != "comm": die("lane names %s" % names)
    mine = [e for e in x if e["pid"] == r and e["tid"] == 0]
    c = Counter((e["name"], e["args"].get("step"), e["args"].get("micro")) for e in mine)
    for s in range(1, 7):
        for name in ("step", "update"):
            if c[(name, s, None)] != 1: die("rank %d: %d '%s' spans of step %d" % (r, c[(name, s, None)], name, s))
        for m in range(accum):
            for name in ("data", "micro_step"):
                if c[(name, s, m)] != 1: die("rank %d: no '%s' span of step %d micro %d" % (r, name, s, m))
    for s in (3, 6):
        if c[("eval", s, None)] != 1: die("rank %d: no eval span at step %d" % (r, s))
    if c[("checkpoint", 6, None)] != 1: die("rank %d: no checkpoint span" % r)
    if nranks > 1 and sum(1 for e in mine if e["name"] == "grad_sync") != 6: die("rank %d: grad_sync spans" % r)
comm = [e for e in x if e["tid"] == 1]
if nranks == 1:
    if comm: die("a single rank has comm spans")
else:
    if not all(isinstance(e["args"].get("bytes"), int) and e["args"].get("group") for e in comm):
        die("comm spans without bytes or group")
    for r in range(nranks):
        if sum(1 for e in comm if e["pid"] == r and e["name"] == "all_reduce"
               and e["args"]["bytes"] > 1000) != 6:
            die("rank %d: not one gradient all_reduce per step" % r)
    for m in lines:
        got = sum(e["args"]["bytes"] for e in comm if e["pid"] == 0 and e["args"]["step"] == m["step"])
        if got != m["comm_bytes"]:
            die("step %d: the comm spans of rank 0 hold %d bytes, the metrics' comm_bytes %d"
                % (m["step"], got, m["comm_bytes"]))
last = lines[-1]
rss, arena = last.get("peak_rss_bytes"), last.get("arena_bytes")
if not isinstance(rss, (int, float)) or not isinstance(arena, (int, float)):
    die("the last metrics line lacks peak_rss_bytes or arena_bytes: %s" % last)
if not (0 < arena <= rss < 1 << 36): die("implausible memory: peak RSS %d, arenas %d" % (rss, arena))
PY
}
check t1.json m1.jsonl 1 4
check t2.json m2.jsonl 2 2

# a trace that cannot be written is an error before training (every rank: exit status 1)
e2e_prog 1 badpath ./g1 --trace nodir/t.json
e2e_says badpath "--trace nodir/t.json: cannot open for writing"
grep -q "step 1/" badpath.err && fail "--trace to a bad path trained first"
e2e_prog 1 badpath2 "$mpirun" --oversubscribe -np 2 ./g2 --trace nodir/t.json
e2e_says badpath2 "--trace nodir/t.json: cannot open for writing"
echo ok
