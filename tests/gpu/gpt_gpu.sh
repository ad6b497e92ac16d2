#!/usr/bin/env bash
# gpt_gpu.sh CPLANC SRCDIR [MODEL...]: the issue-6 GPU check of the CUDA training program, for a
# machine with a GPU (tests/gpu/run.sh calls it). Each model (default: gpt_small llama_small of
# tests/e2e) is built twice with train.steps = 20: for the default CPU mesh and for a mesh of one
# h100_sxm (the CUDA backend, codegen/emit_cu.c); both train 20 steps from the same initial params
# on the same data. The 20 losses and gradient norms must agree within 1e-3 relative (f32), and
# the final params within 1e-3 absolute. Prints the worst differences; exit 0 when within, 1 not.
# CPLAN_GPU_KEEP=DIR copies the metrics, logs and generated sources there (for a failure's study).
set -u
cplanc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
src=$(cd "$2" && pwd)
shift 2
models=${*:-gpt_small llama_small}
work=$(mktemp -d "${TMPDIR:-/tmp}/cplan-gpu-XXXXXX")
keep() { [ -n "${CPLAN_GPU_KEEP:-}" ] && mkdir -p "$CPLAN_GPU_KEEP" && cp -r "$work"/*.jsonl "$work"/*.log "$work"/keep-* "$CPLAN_GPU_KEEP"/ 2>/dev/null; rm -rf "$work"; }
trap keep EXIT
cd "$work" || exit 1
fail() { echo "gpt_gpu.sh: FAILED: $*"; exit 1; }

for i in $(seq 300); do printf '%d+%d=%d; ' "$i" $((i * 7 % 13)) $((i + i * 7 % 13)); done >tokens.txt
"$cplanc" data text tokens.txt -o tokens.bin >/dev/null 2>&1 || fail "cplanc data text"

for m in $models; do
  { cat "$src/tests/e2e/$m.cplan"; printf '\nmesh gpu1 {\n  shape  = [gpu = 1]\n  device = h100_sxm\n}\n'; } >"$m.cplan"
  "$cplanc" build "$m.cplan" -o "$m-cpu" --set train.steps=20 2>"$m-cpu.log" || { cat "$m-cpu.log"; fail "build $m (cpu)"; }
  "$cplanc" build "$m.cplan" -o "$m-gpu" --set train.steps=20 --set train.mesh=gpu1 --keep-c "keep-$m" 2>"$m-gpu.log" ||
    { cat "$m-gpu.log"; fail "build $m (cuda)"; }
  timeout 120 "./$m-cpu" --quiet --save-init "$m-init.st" --save "$m-cpu.st" --metrics "$m-cpu.jsonl" ||
    fail "$m: the CPU program"
  timeout 300 "./$m-gpu" --init "$m-init.st" --save "$m-gpu.st" --metrics "$m-gpu.jsonl" ||
    fail "$m: the CUDA program exited with status $?"
  python3 - "$m" "$m-cpu.jsonl" "$m-gpu.jsonl" "$m-cpu.st" "$m-gpu.st" <<'PY' || exit 1
import json, struct, sys
label, m1, m2, p1, p2 = sys.argv[1:]
def losses(path):
    return [(j["loss"], j["grad_norm"]) for j in map(json.loads, open(path))]
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    base = 8 + n
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             b[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in h.items()}
a, b = losses(m1), losses(m2)
if len(a) != 20 or len(b) != 20:
    sys.exit("FAILED: %s: %d CPU and %d GPU losses, expected 20" % (label, len(a), len(b)))
worst = 0.0
for s, (x, y) in enumerate(zip(a, b)):
    for what, u, v in (("loss", x[0], y[0]), ("grad_norm", x[1], y[1])):
        r = abs(u - v) / max(abs(u), 1e-12)
        worst = max(worst, r)
        if r > 1e-3:
            sys.exit("FAILED: %s: step %d %s: GPU %.8f vs CPU %.8f (relative %.2e > 1e-3)" % (label, s, what, v, u, r))
ta, tb = tensors(p1), tensors(p2)
if ta.keys() != tb.keys():
    sys.exit("FAILED: %s: the saved params have different names" % label)
# gpt's key bias has an exactly zero gradient (rounding noise that Adam turns into +-lr steps)
def skip(k, i, n):
    return k.endswith("attn.c_attn.bias") and n // 3 <= i < 2 * n // 3
pw = max(abs(x - y) for k in ta for i, (x, y) in enumerate(zip(ta[k], tb[k])) if not skip(k, i, len(ta[k])))
print("%s: 20 steps, GPU vs CPU: worst relative loss/grad_norm difference %.2e, worst param difference %.2e; "
      "final loss GPU %.6f CPU %.6f" % (label, worst, pw, b[-1][0], a[-1][0]))
if pw > 1e-3:
    sys.exit("FAILED: %s: params differ by %.2e > 1e-3" % (label, pw))
PY
done
echo "gpt_gpu.sh: ok"
