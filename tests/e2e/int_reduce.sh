#!/usr/bin/env bash
# int_reduce.sh CPLANC SRCDIR: sum, mean and max of i32 tensors (the targets, the inputs' rows) in a
# built CPU program, as metrics, against the same figures computed by Python from the token file
# (step s reads tokens [(s-1)·B·T, s·B·T], targets shifted by one).
# shellcheck source=tests/e2e/e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
cp "$src/tests/e2e/int_reduce.cplan" .
e2e_tokens tokens.bin
e2e_build ir int_reduce.cplan
e2e_prog 0 run ./ir --metrics m.jsonl
python3 - <<'PY' || fail "the i32 reductions differ from Python's"
import json, struct
raw = open("tokens.bin", "rb").read()
n = struct.unpack("<i", raw[8:12])[0]
tok = struct.unpack("<%dH" % n, raw[1024:1024 + 2 * n])
B, T = 4, 8
for line in open("m.jsonl"):
    m = json.loads(line)
    s = m["step"]
    o = (s - 1) * B * T
    tg = tok[o + 1:o + 1 + B * T]
    rows = [tok[o + j * T:o + (j + 1) * T] for j in range(B)]
    want = {"tsum": sum(tg), "tmean": sum(tg) / (B * T), "tmax": max(tg),
            "rowmax_mean": sum(max(r) for r in rows) / B}
    for k, v in want.items():
        assert abs(m[k] - v) <= 1e-5 * max(1, abs(v)), (s, k, m[k], v)
    print("step %d: %s" % (s, {k: m[k] for k in want}))
PY
echo "ok"
