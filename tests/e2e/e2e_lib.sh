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
set -u

fail() {
  echo "FAILED: $*"
  exit 1
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
  timeout 120 "$@" 2>"$label.err"
  rc=$?
  if [ "$rc" = 124 ]; then fail "$label: '$*' hung (killed after 120 s)"; fi
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
