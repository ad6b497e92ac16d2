#!/usr/bin/env bash
# gpt_gpu.sh: the issue-6 check of the CUDA training program against the CPU backend.
#   gpt_gpu.sh CPLANC SRCDIR [MODEL...]           build, run and compare here (a machine with a GPU)
#   gpt_gpu.sh --prepare DIR CPLANC SRCDIR [MODEL...]   build the GPU programs and run the CPU side
#                                                 here, into DIR (for a GPU machine that cannot build
#                                                 cplan: copy DIR there)
#   gpt_gpu.sh --check DIR                        run DIR's GPU programs and compare (on the GPU machine)
# Each model (default: gpt_small llama_small of tests/e2e) is built with train.steps = 20 for the
# default CPU mesh (f32) and for a mesh of one h100_sxm (the CUDA backend, codegen/emit_cu.c) once
# per precision in CPLAN_GPU_PRECISIONS (default "f32 bf16 f16"); all train 20 steps from the same
# initial params on the same data. Tolerances, relative, on the 20 losses and gradient norms:
# f32 1e-3, bf16 and f16 2e-2 (the issue's); final params: f32 within 1e-3 absolute (the low
# precisions' are printed, not checked: Adam turns bf16 rounding of tiny gradients into +-lr
# steps). f16 must skip no step (its loss_scale and skipped_steps metrics are read). Prints the worst
# differences; exit 0 when within, 1 not. CPLAN_GPU_KEEP=DIR copies metrics, logs and generated
# sources there.
set -u
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
fail() { echo "gpt_gpu.sh: FAILED: $*"; exit 1; }
mode=all
if [ "${1:-}" = --prepare ]; then mode=prepare; dir=$2; shift 2; fi
if [ "${1:-}" = --check ]; then mode=check; dir=$(cd "$2" && pwd); shift 2; fi
precs=${CPLAN_GPU_PRECISIONS:-f32 bf16 f16}

if [ $mode != check ]; then
  cplanc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  src=$(cd "$2" && pwd)
  shift 2
  models=${*:-gpt_small llama_small}
  if [ $mode = prepare ]; then
    mkdir -p "$dir/lib" && dir=$(cd "$dir" && pwd)
    work=$dir
  else
    work=$(mktemp -d "${TMPDIR:-/tmp}/cplan-gpu-XXXXXX")
    keep() { [ -n "${CPLAN_GPU_KEEP:-}" ] && mkdir -p "$CPLAN_GPU_KEEP" && cp -r "$work"/*.jsonl "$work"/*.log "$work"/keep-* "$CPLAN_GPU_KEEP"/ 2>/dev/null; rm -rf "$work"; }
    trap keep EXIT
  fi
  cd "$work" || exit 1
  for i in $(seq 300); do printf '%d+%d=%d; ' "$i" $((i * 7 % 13)) $((i + i * 7 % 13)); done >tokens.txt
  "$cplanc" data text tokens.txt -o tokens.bin >/dev/null 2>&1 || fail "cplanc data text"
  : >runs.txt
  for m in $models; do
    { cat "$src/tests/e2e/$m.cplan"; printf '\nmesh gpu1 {\n  shape  = [gpu = 1]\n  device = h100_sxm\n}\n'; } >"$m.cplan"
    "$cplanc" build "$m.cplan" -o "$m-cpu" --set train.steps=20 2>"$m-cpu.log" || { cat "$m-cpu.log"; fail "build $m (cpu)"; }
    timeout 120 "./$m-cpu" --quiet --save-init "$m-init.st" --save "$m-cpu.st" --metrics "$m-cpu.jsonl" ||
      fail "$m: the CPU program"
    for p in $precs; do
      keepc="--keep-c keep-$m-$p"
      [ $mode = prepare ] && keepc=
      "$cplanc" build "$m.cplan" -o "$m-gpu-$p" --set train.steps=20 --set train.mesh=gpu1 --set train.precision=$p \
        $keepc 2>"$m-gpu-$p.log" || { cat "$m-gpu-$p.log"; fail "build $m (cuda, $p)"; }
      echo "$m $p" >>runs.txt
    done
  done
  if [ $mode = prepare ]; then
    for l in $(while read -r m p; do ldd "./$m-gpu-$p"; done <runs.txt | awk '/=> \/lib/ {print $3}' | sort -u | grep -E "cjson|mpi|open-rte|open-pal|hwloc|event|udev"); do
      cp -L "$l" lib/
    done
    cp "$self" gpt_gpu.sh
    echo "gpt_gpu.sh: prepared $dir (on the GPU machine: $dir/gpt_gpu.sh --check $dir)"
    exit 0
  fi
else
  work=$dir
  cd "$work" || exit 1
  export LD_LIBRARY_PATH=$work/lib:${LD_LIBRARY_PATH:-}
fi

# the GPU runs and the comparison
bad=0
while read -r m p; do
  timeout 300 "./$m-gpu-$p" --init "$m-init.st" --save "$m-gpu-$p.st" --metrics "$m-gpu-$p.jsonl" 2>"$m-gpu-$p.run.log" ||
    { tail -5 "$m-gpu-$p.run.log"; echo "FAILED: $m $p: the CUDA program exited with status $?"; bad=1; continue; }
  python3 - "$m" "$p" "$m-cpu.jsonl" "$m-gpu-$p.jsonl" "$m-cpu.st" "$m-gpu-$p.st" <<'PY' || bad=1
import json, struct, sys
label, prec, m1, m2, p1, p2 = sys.argv[1:]
tol = 1e-3 if prec == "f32" else 2e-2
def lines(path):
    return [json.loads(l) for l in open(path)]
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    base = 8 + n
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             b[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in h.items()}
A, B = lines(m1), lines(m2)
if len(A) != 20 or len(B) != 20:
    sys.exit("FAILED: %s %s: %d CPU and %d GPU steps, expected 20" % (label, prec, len(A), len(B)))
extra = ""
if prec == "f16":
    skipped = B[-1].get("skipped_steps")
    if skipped is None:
        sys.exit("FAILED: %s f16: no skipped_steps metric" % label)
    extra = ", loss_scale %g, skipped steps %d" % (B[-1]["loss_scale"], skipped)
    if skipped != 0:
        sys.exit("FAILED: %s f16: %d steps skipped (an overflow at loss scale %g)" % (label, skipped, B[-1]["loss_scale"]))
worst = 0.0
for s, (x, y) in enumerate(zip(A, B)):
    for what in ("loss", "grad_norm"):
        u, v = x[what], y[what]
        r = abs(u - v) / max(abs(u), 1e-12)
        worst = max(worst, r)
        if r > tol:
            sys.exit("FAILED: %s %s: step %d %s: GPU %.8f vs CPU %.8f (relative %.2e > %g)" % (label, prec, s, what, v, u, r, tol))
ta, tb = tensors(p1), tensors(p2)
if ta.keys() != tb.keys():
    sys.exit("FAILED: %s %s: the saved params have different names" % (label, prec))
# gpt's key bias has an exactly zero gradient (rounding noise that Adam turns into +-lr steps)
def skip(k, i, n):
    return k.endswith("attn.c_attn.bias") and n // 3 <= i < 2 * n // 3
pw = max(abs(x - y) for k in ta for i, (x, y) in enumerate(zip(ta[k], tb[k])) if not skip(k, i, len(ta[k])))
print("%s %s: 20 steps, GPU vs CPU: worst relative loss/grad_norm difference %.2e (tolerance %g), worst param "
      "difference %.2e; final loss GPU %.6f CPU %.6f%s" % (label, prec, worst, tol, pw, B[-1]["loss"], A[-1]["loss"], extra))
if prec == "f32" and pw > 1e-3:
    sys.exit("FAILED: %s: params differ by %.2e > 1e-3" % (label, pw))
PY
done <runs.txt
[ $bad -eq 0 ] || exit 1
echo "gpt_gpu.sh: ok"
