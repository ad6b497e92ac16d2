# shellcheck shell=bash disable=SC2034  # the variables are for the scripts that source this
# e2e_lib.sh: helpers the end-to-end tests of built programs source (resume.sh, bad_data.sh,
# signals.sh, run_cli.sh).  Each test runs in its own temp dir (CPLAN_KEEP=1 keeps it) and
# prints "ok" or "FAILED: ..." with the log that shows why.
#
#   e2e_init CPLANC SRCDIR      sets $cplanc, $src, $tmp, cds into $tmp
#   e2e_tokens FILE             writes an llm.c token file of ~3,200 tokens, all below 64
#   e2e_build NAME MODEL [ARGS] cplanc build MODEL -o NAME ARGS...
#   e2e_prog RC LABEL CMD...    runs CMD (stderr to LABEL.err) and wants exit status RC;
#                               a status >= 128 (a signal: a crash) always fails
#   e2e_says LABEL WORD...      LABEL.err must contain every WORD (fixed strings)
#   e2e_det FILE                the JSONL metrics without the timing and peak RSS fields, for
#                               bitwise compares
#   e2e_laptop < MODEL > OUT    MODEL with a one-CPU mesh `laptop` appended (--set
#                               mesh.laptop.shape.cpu=N and train.mesh=laptop grow it)
set -u

fail() {
  echo "FAILED: $*"
  exit 1
}

e2e_laptop() {
  cat
  printf '\nmesh laptop {\n  shape  = [cpu = 1]\n  device = cpu\n}\n'
}

e2e_init() {
  cplanc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  src=$(cd "$2" && pwd)
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_e2e.XXXXXX")
  if [ "${CPLAN_KEEP:-0}" = 1 ]; then echo "keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
  cd "$tmp" || exit 1
}

# Sums written as text: digits, '+', '=', ';' and ' ' are all bytes below 64, so the file suits
# gpt_small's vocab of 64; 3,164 tokens are 49 steps of its 4 x 16 batch.
e2e_tokens() {
  local i
  for i in $(seq 300); do printf '%d+%d=%d; ' "$i" $((i * 7 % 13)) $((i + i * 7 % 13)); done >"$1.txt"
  "$cplanc" data text "$1.txt" -o "$1" >/dev/null 2>&1 || fail "cplanc data text $1.txt"
}

e2e_build() {
  local name=$1 model=$2
  shift 2
  "$cplanc" build "$model" -o "$name" "$@" 2>"build_$name.log" ||
    { cat "build_$name.log"; fail "cplanc build $model $*"; }
}

# timeout: a hang fails the test instead of the suite's limit
e2e_prog() {
  local want=$1 label=$2 rc
  shift 2
  timeout 300 "$@" 2>"$label.err"
  rc=$?
  if [ "$rc" = 124 ]; then fail "$label: '$*' hung (killed after 300 s)"; fi
  if [ "$rc" -ge 128 ]; then cat "$label.err"; fail "$label: '$*' crashed (exit status $rc)"; fi
  if [ "$rc" != "$want" ]; then
    cat "$label.err"
    fail "$label: '$*' exited with $rc, expected $want"
  fi
}

e2e_says() {
  local label=$1 w
  shift
  for w in "$@"; do
    grep -qF -- "$w" "$label.err" || { cat "$label.err"; fail "$label: the message lacks '$w'"; }
  done
}

e2e_det() {
  sed -e 's/,"ms":[^,}]*//' -e 's/,"tokens_per_s":[^,}]*//' -e 's/,"peak_rss_bytes":[^,}]*//' "$1"
}

# e2e_mpi: mpirun on loopback, also as root; $mpirun is the launcher (ctest passes MPIEXEC).
e2e_mpi() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
  mpirun=${MPIEXEC:-mpirun}
}

# e2e_close LABEL M1.jsonl M2.jsonl P1.st P2.st: the 6 losses and grad norms of two metrics files
# within 2e-4 relative, the params of two safetensors files (F32, same names and shapes) within
# 1e-4. M1/P1 are the single-device run's. Used by the multi-rank tests (dp.sh, tp.sh).
e2e_close() {
  python3 - "$@" <<'PY' || exit 1
import json, struct, sys
RUNTIME = {"step", "loss", "grad_norm", "lr", "ms", "tokens_per_s", "peak_rss_bytes", "arena_bytes", "param_bytes",
           "state_bytes", "mfu", "comm_bytes"}
def losses(path):  # the loss, the gradient norm (clipping and Adam would hide a wrong scale), the metrics
    return [[("loss", j["loss"]), ("grad_norm", j["grad_norm"])] +
            sorted((k, v) for k, v in j.items() if k not in RUNTIME and isinstance(v, (int, float)))
            for j in map(json.loads, open(path))]
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    base = 8 + n
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             b[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in h.items()}
label, m1, m2, p1, p2 = sys.argv[1:]
a, b = losses(m1), losses(m2)
if len(a) != 6 or len(b) != 6:
    sys.exit("FAILED: %s: %d and %d losses, expected 6" % (label, len(a), len(b)))
for s, (x, y) in enumerate(zip(a, b)):
    if [k for k, _ in x] != [k for k, _ in y]:
        sys.exit("FAILED: %s: step %d reports %s vs single-device %s" % (label, s, [k for k, _ in y], [k for k, _ in x]))
    for (what, u), (_, v) in zip(x, y):
        if abs(u - v) > 2e-4 * abs(u) + (0 if what in ("loss", "grad_norm") else 1e-6):
            sys.exit("FAILED: %s: step %d %s %.8f vs single-device %.8f" % (label, s, what, v, u))
ta, tb = tensors(p1), tensors(p2)
if ta.keys() != tb.keys():
    sys.exit("FAILED: %s: the saved params have different names" % label)
# gpt's key bias (c_attn.bias[C:2C]) has an exactly zero gradient (softmax ignores a constant
# added to every score of a row), so its gradient is rounding noise, which Adam's m/sqrt(v)
# turns into steps of +-lr whose sign depends on the summation order: it is not compared.
def skip(k, i, n):
    return k.endswith("attn.c_attn.bias") and n // 3 <= i < 2 * n // 3
worst = max([abs(x - y) for k in ta for i, (x, y) in enumerate(zip(ta[k], tb[k]))
             if not skip(k, i, len(ta[k]))])
if worst > 1e-4:
    sys.exit("FAILED: %s: params differ by %g after training" % (label, worst))
PY
}

# e2e_tail_close LABEL M1.jsonl M2.jsonl N: the last N losses of two metrics files within 2e-4
# relative (a checkpoint resumed under another strategy against the uninterrupted run).
e2e_tail_close() {
  python3 - "$@" <<'PY' || exit 1
import json, sys
label, m1, m2, n = sys.argv[1:]
a = [json.loads(l)["loss"] for l in open(m1)][-int(n):]
b = [json.loads(l)["loss"] for l in open(m2)][-int(n):]
if len(a) != int(n) or len(b) != int(n):
    sys.exit("FAILED: %s: %d and %d losses" % (label, len(a), len(b)))
for s, (x, y) in enumerate(zip(a, b)):
    if abs(x - y) > 2e-4 * abs(x):
        sys.exit("FAILED: %s: loss %d %.8f vs %.8f" % (label, s, y, x))
PY
}
