#!/usr/bin/env bash
# compare.sh CPLANC MODEL.cplan: trains MODEL with cplan and with PyTorch from the same initial
# params and data, and checks that the losses of every step agree (relative difference <= 2e-4).
#
# In a temp dir: writes the model's token file (tokens.bin, beside the copied .cplan, since
# data paths are relative to the .cplan file), builds the program, runs it with --save-init
# (the initial params, which ref.py starts from) and --metrics, runs tests/pytorch/ref.py with
# the train settings of `cplanc check --json`, and compares (compare.py).  Flags ref.py cannot
# read off the params (heads, ...) come from the model's `# REF:` line.  When the program
# takes --save FILE the final params are compared too, but only reported.
# Exit status: 0 match, 1 mismatch or failure.  CPLAN_KEEP=1 keeps the temp dir.
set -u
if [ $# -ne 2 ]; then echo "usage: $0 CPLANC MODEL.cplan" >&2; exit 2; fi
cplanc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
model=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
here=$(cd "$(dirname "$0")" && pwd)
py=${CPLAN_PYTHON:-/usr/bin/python3}   # Debian's python3-torch lives there, not in a pyenv
base=$(basename "$model" .cplan)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_pytorch.XXXXXX")
if [ "${CPLAN_KEEP:-0}" = 1 ]; then echo "keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi

# run LABEL CMD...: runs CMD in the temp dir, logging to LABEL.log; on failure shows the log.
run() {
  local label=$1; shift
  if ! (cd "$tmp" && "$@") >"$tmp/$label.log" 2>&1; then
    echo "FAILED: $label: $*"; tail -n 40 "$tmp/$label.log"; exit 1
  fi
}

if ! "$py" -c 'import torch, numpy' 2>/dev/null; then
  echo "FAILED: $py has no torch/numpy (Debian: apt-get install python3-torch python3-numpy)"; exit 1
fi
cp "$model" "$tmp/$base.cplan"
# the train settings for ref.py; stderr has a warning that tokens.bin is not written yet
if ! (cd "$tmp" && "$cplanc" check --json "$base.cplan" >plan.json 2>check.log); then
  echo "FAILED: cplanc check --json $base.cplan"; cat "$tmp/check.log"; exit 1
fi
run tokens "$py" "$here/compare.py" tokens plan.json tokens.bin
run build "$cplanc" build "$base.cplan" -o prog

save=()
if (cd "$tmp" && ./prog --help 2>&1 | grep -q -e '--save[ =]' -e '--save$'); then
  save=(--save final.safetensors)
fi
run train ./prog --save-init init.safetensors --metrics metrics.jsonl --quiet "${save[@]}"

ref_flags=$(sed -n 's/^# REF: *//p' "$model" | head -n 1)
# shellcheck disable=SC2086  # ref_flags is a list of flags
run ref "$py" "$here/ref.py" --plan plan.json --init init.safetensors --tokens tokens.bin \
  --out ref.jsonl --save-final ref_final.safetensors $ref_flags

final=()
if [ ${#save[@]} -gt 0 ] && [ -f "$tmp/final.safetensors" ]; then
  final=(--final final.safetensors ref_final.safetensors)
fi
echo "$base: cplan vs PyTorch ($("$py" -c 'import torch; print(torch.__version__)'), f64)"
(cd "$tmp" && "$py" "$here/compare.py" losses metrics.jsonl ref.jsonl "${final[@]}")
