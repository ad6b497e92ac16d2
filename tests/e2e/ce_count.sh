#!/usr/bin/env bash
# ce_count.sh CPLANC SRCDIR: cross_entropy's mean over the step's targets (docs/language.md, Batches).
# tests/e2e/ce_count.cplan on data whose samples keep from 1 to 6 of their targets (the rest padding
# or -100) trains and evaluates like the whole batch on one device (e2e_close: losses, gradient norms,
# val_loss, params) in micro-batches of 1 (accumulation 4), on dp 2, on dp 2 with micro-batches of 1,
# and on dp 2 x tp 2 (the lowered plan). A mean of the micro-batches' means differs here by about 1%
# (checked when the runtime's counting was taken out).
# shellcheck source=e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
e2e_mpi

python3 - <<'PY' || fail "writing the data"
import json, struct
def st(path, tensors):
    h, body = {}, b""
    for k, (shape, vals) in tensors.items():
        d = struct.pack("<%di" % len(vals), *vals)
        h[k] = {"dtype": "I32", "shape": shape, "data_offsets": [len(body), len(body) + len(d)]}
        body += d
    hb = json.dumps(h).encode()
    hb += b" " * (-len(hb) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + body)
for path, n, salt in (("cc.safetensors", 24, 1), ("cc_val.safetensors", 8, 7)):
    tok, lab = [], []
    for i in range(n):
        keep = (i * salt) % 6 + 1                       # targets this sample keeps: 1 .. 6
        row = [(i * 5 + j * 3 + salt) % 8 + 1 for j in range(7)]
        tok += row[:keep + 1] + [0] * (6 - keep)         # padding after them
        lab += [(i + 2 * j) % 9 if j < 7 - keep else -100 for j in range(6)]
    st(path, {"tok": ([n, 7], tok), "labels": ([n, 6], lab)})
PY

e2e_laptop <"$src/tests/e2e/ce_count.cplan" >cc.cplan
e2e_build one cc.cplan
e2e_prog 0 one ./one --save one.st --metrics one.jsonl
grep -q val_loss one.jsonl || fail "no val_loss in one.jsonl"
e2e_build micro1 cc.cplan --set train.strategy.micro=1
e2e_prog 0 micro1 ./micro1 --save micro1.st --metrics micro1.jsonl
e2e_close micro1 one.jsonl micro1.jsonl one.st micro1.st
for v in "2 dp=2" "2 dp=2 micro=1" "4 dp=2 tp=2 micro=1"; do
  set -- $v
  n=$1 name=$(echo "${*:2}" | tr ' =' '_-')
  sets=(--set train.mesh=laptop --set "mesh.laptop.shape.cpu=$n")
  for f in "${@:2}"; do sets+=(--set "train.strategy.$f"); done
  e2e_build "$name" cc.cplan "${sets[@]}"
  e2e_prog 0 "$name" "$mpirun" --oversubscribe -np "$n" "./$name" --save "$name.st" --metrics "$name.jsonl"
  e2e_close "$name" one.jsonl "$name.jsonl" one.st "$name.st"
done
echo ok
