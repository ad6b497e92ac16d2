#!/usr/bin/env bash
# bad_indices.sh CPLANC SRCDIR: `tensors` data whose class targets or embedding indices are out of
# range (PyTorch raises IndexError there) stop the program with exit 1 and a message naming the op,
# the value and the range; they used to abort in a kernel assertion ("internal error", SIGABRT).
# PyTorch's ignored target -100 is such an error, with a hint to pass ignore_index = -100, which
# the last program does.
set -u
# shellcheck source=tests/e2e/e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
cat >m.cplan <<'CPLAN'
model m(V: int = 5, D: int = 4, K: int = 3) {
  input idx: i32[B]
  input y: i32[B]
  param wte: [V, D] = normal(0.1)
  param w: [D, K] = normal(0.1)
  loss = cross_entropy(embedding(wte, idx) @ w, y)
}
train {
  model = m()
  data  = tensors("good.safetensors")
  batch = 4
  steps = 1
}
CPLAN
python3 - <<'PY' || fail "cannot write the data files"
import json, struct
def write(path, tensors):
    header, blob = {}, b""
    for name, vals in tensors.items():
        raw = struct.pack("<%di" % len(vals), *vals)
        header[name] = {"dtype": "I32", "shape": [len(vals)], "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + blob)
write("good.safetensors", {"idx": [0, 1, 4, 2], "y": [0, 2, -1, 1]})
write("bad_target.safetensors", {"idx": [0, 1, 4, 2], "y": [0, 3, 1, 1]})
write("neg_target.safetensors", {"idx": [0, 1, 4, 2], "y": [0, 1, -2, 1]})
write("torch_ignore.safetensors", {"idx": [0, 1, 4, 2], "y": [0, -100, 2, 1]})
write("bad_index.safetensors", {"idx": [0, 5, 4, 2], "y": [0, 1, 1, 1]})
PY
e2e_build prog m.cplan
e2e_prog 0 good ./prog --quiet
e2e_prog 1 bad_target ./prog --quiet --data bad_target.safetensors
e2e_says bad_target "error: cross_entropy: target 3 at position 1" "[0, 3) or -1"
e2e_prog 1 neg_target ./prog --quiet --data neg_target.safetensors
e2e_says neg_target "target -2 at position 2"
# PyTorch's ignored target -100: cplan ignores -1 unless told, and the hint says how
e2e_prog 1 torch_ignore ./prog --quiet --data torch_ignore.safetensors
e2e_says torch_ignore "target -100 at position 1" "ignore_index = -100)"
sed 's/cross_entropy(embedding(wte, idx) @ w, y)/cross_entropy(embedding(wte, idx) @ w, y, ignore_index = -100)/' m.cplan >m100.cplan
e2e_build prog100 m100.cplan
e2e_prog 0 torch_ignore100 ./prog100 --quiet --data torch_ignore.safetensors
e2e_prog 1 bad_index ./prog --quiet --data bad_index.safetensors
e2e_says bad_index "error: embedding: index 5 at position 1" "[0, 5)"
# under tp = 2 the table (5 rows) and the head (3 classes) are padded to 6 and 4 (exact padding,
# compiler/vocab_pad.c): an index or target in the padding is still out of the model's range
if command -v "${MPIEXEC:-mpirun}" >/dev/null; then
  e2e_mpi
  printf '\nmesh pair {\n  shape  = [cpu = 2]\n  device = cpu\n}\n' >>m.cplan
  e2e_build prog_tp m.cplan --set train.mesh=pair --set train.strategy.tp=2
  e2e_prog 0 tp_good "$mpirun" -np 2 --oversubscribe ./prog_tp --quiet
  e2e_prog 1 tp_bad_index "$mpirun" -np 2 --oversubscribe ./prog_tp --quiet --data bad_index.safetensors
  e2e_says tp_bad_index "error: embedding: index 5 at position 1" "[0, 5)"
  e2e_prog 1 tp_bad_target "$mpirun" -np 2 --oversubscribe ./prog_tp --quiet --data bad_target.safetensors
  e2e_says tp_bad_target "error: cross_entropy: target 3 at position 1" "[0, 3) or -1"
fi
echo ok
