#!/usr/bin/env python3
"""compare_runs.py DEVICE LABEL PREC CPU.jsonl OTHER.jsonl CPU.st OTHER.st [FIRST]

A CUDA training program's run (on a GPU, or on the CUDA emulator: DEVICE names which in the
messages) against the CPU backend's from the same initial params: tests/gpu/gpt_gpu.sh and
tests/cuda/emu_program.sh. OTHER's steps are compared with the CPU run's steps FIRST.. (the same
count). Tolerances, relative, on every step's loss and gradient norm: 1e-3 when PREC starts with
f32, 2e-2 otherwise (bf16, f16: the issue's); final params within 1e-3 absolute in f32 (the low
precisions' are printed, not checked: Adam turns bf16 rounding of tiny gradients into +-lr steps).
An f16 run (PREC starts with f16) must skip no step (its skipped_steps metric) and, under 1000 steps,
report the starting loss scale 2^16 on every line (metrics summed over tp ranks). Prints the worst
differences; exit 0 when within, else a FAILED line. Steps that evaluated (val_loss) must have done so
in both runs, and their val_loss is held to the same tolerance."""
import json
import struct
import sys


def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}


def main(argv):
    device, label, prec, m1, m2, p1, p2 = argv[1:8]
    first = int(argv[8]) if len(argv) > 8 else 0
    tol = 1e-3 if prec.startswith("f32") else 2e-2
    A = [json.loads(l) for l in open(m1)][first:]
    B = [json.loads(l) for l in open(m2)]
    if len(A) != len(B) or not A:
        return "FAILED: %s %s: %d CPU and %d %s steps" % (label, prec, len(A), len(B), device)
    extra = ""
    if prec.startswith("f16"):
        skipped = B[-1].get("skipped_steps")
        if skipped is None:
            return "FAILED: %s %s: no skipped_steps metric" % (label, prec)
        extra = ", loss_scale %g, skipped steps %d" % (B[-1]["loss_scale"], skipped)
        if skipped != 0:
            return "FAILED: %s %s: %d steps skipped (an overflow at loss scale %g)" % (label, prec, skipped,
                                                                                     B[-1]["loss_scale"])
        # no skip and fewer than 1000 steps: the scale is still its start, 2^16, on every line
        bad = [x["loss_scale"] for x in B if x.get("loss_scale") != 65536]
        if len(B) < 1000 and bad:
            return "FAILED: %s %s: loss_scale %g, expected 65536 (no step skipped)" % (label, prec, bad[0])
    worst = 0.0
    for s, (x, y) in enumerate(zip(A, B)):
        if ("val_loss" in x) != ("val_loss" in y):
            return "FAILED: %s %s: step %d: %s evaluated, %s did not" % (
                label, prec, first + s, *(("CPU", device) if "val_loss" in x else (device, "CPU")))
        for what in ("loss", "grad_norm", "val_loss"):
            if what not in x:
                continue
            u, v = x[what], y[what]
            r = abs(u - v) / max(abs(u), 1e-12)
            worst = max(worst, r)
            if not r <= tol:
                return "FAILED: %s %s: step %d %s: %s %.8f vs CPU %.8f (relative %.2e > %g)" % (
                    label, prec, first + s, what, device, v, u, r, tol)
    ta, tb = tensors(p1), tensors(p2)
    if ta.keys() != tb.keys():
        return "FAILED: %s %s: the saved params have different names" % (label, prec)

    # gpt's key bias has an exactly zero gradient (rounding noise that Adam turns into +-lr steps)
    def skip(k, i, n):
        return k.endswith("attn.c_attn.bias") and n // 3 <= i < 2 * n // 3

    pw = max(abs(x - y) for k in ta for i, (x, y) in enumerate(zip(ta[k], tb[k])) if not skip(k, i, len(ta[k])))
    print("ok: %s %s: %d steps, %s vs CPU: worst relative loss/grad_norm difference %.2e (tolerance %g), worst param "
          "difference %.2e; final loss %.6f (CPU %.6f)%s" % (label, prec, len(A), device, worst, tol, pw,
                                                            B[-1]["loss"], A[-1]["loss"], extra))
    if prec.startswith("f32") and not pw <= 1e-3:
        return "FAILED: %s %s: params differ by %.2e > 1e-3" % (label, prec, pw)
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv))
