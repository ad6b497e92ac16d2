#!/usr/bin/env bash
# int_reduce.sh CPLANC SRCDIR: sum, mean and max of i32 tensors (the targets, the inputs' rows) and
# float() of them (i32 -> f32, then f32 arithmetic; past 2^24 rounded as numpy's astype(float32)) in a
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
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]  # rounded to nearest, as numpy's float32
raw = open("tokens.bin", "rb").read()
n = struct.unpack("<i", raw[8:12])[0]
tok = struct.unpack("<%dH" % n, raw[1024:1024 + 2 * n])
B, T = 4, 8
for line in open("m.jsonl"):
    m = json.loads(line)
    s = m["step"]
    o = (s - 1) * B * T
    tg = tok[o + 1:o + 1 + B * T]
    ids = tok[o:o + B * T]
    rows = [ids[j * T:(j + 1) * T] for j in range(B)]
    want = {"tsum": sum(tg), "tmean": sum(tg) / (B * T), "tmax": max(tg),
            "rowmax_mean": sum(max(r) for r in rows) / B,
            "thalf": sum(t / 2.0 for t in tg) / (B * T),
            "ratio": sum(i / (t + 1) for i, t in zip(ids, tg)) / (B * T)}
    big = f32(max(ids) * 33554467)  # float(idx * 33554467): past 2^25, so f32 rounds it (to a multiple of 4)
    assert max(ids) * 33554467 > 2 ** 24 and m["big"] == big, (s, "big", m["big"], big)
    for k, v in want.items():
        assert abs(m[k] - v) <= 1e-5 * max(1, abs(v)), (s, k, m[k], v)
    print("step %d: %s, big %s" % (s, {k: m[k] for k in want}, m["big"]))
PY
echo "ok"
