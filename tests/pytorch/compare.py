#!/usr/bin/python3
"""compare.py: the data-file and comparison halves of tests/pytorch/compare.sh.

  compare.py tokens PLAN.json OUT.bin [COUNT]
      writes an llm.c token file of COUNT (default 200) tokens below the model's vocab (read
      from the plan's embedding table).  200 tokens with batch 4 and T 16 give S = 3 distinct
      steps, so a 6-step run also checks that the data wraps around as §8 says.
  compare.py losses CPLAN_METRICS.jsonl REF.jsonl [--final CPLAN.safetensors REF.safetensors]
      prints the losses of both side by side with their relative difference; exit 1 when a
      step is missing or differs by more than 2e-4 (relative).  The final params, when given,
      are compared too (|a - b| <= 1e-4 * (1 + |b|)), but only reported (Adam turns tiny
      gradient differences into differences of up to lr per step, so params are a noisier
      check than losses).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref import st_read, tokens_write  # noqa: E402

LOSS_RTOL = 2e-4
PARAM_TOL = 1e-4


def plan_vocab(plan):
    for t in plan["param_tensors"]:
        if t["name"] in ("wte", "tok_embeddings"):
            return t["shape"][0]
    raise SystemExit("compare.py: no wte or tok_embeddings param to read the vocab from")


def write_tokens(plan_path, out, count):
    with open(plan_path) as f:
        vocab = plan_vocab(json.load(f))
    # A learnable stream (mostly +1 steps, sometimes a jump) so the loss moves in 6 steps.
    rng = np.random.default_rng(20240520)
    toks = [int(rng.integers(vocab))]
    for _ in range(count - 1):
        toks.append((toks[-1] + 1) % vocab if rng.random() < 0.7 else int(rng.integers(vocab)))
    tokens_write(out, toks)


def train_losses(path):
    """{step: loss} of a metrics JSONL file: training records only (no eval/val records)."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            if "step" not in rec or "loss" not in rec:
                continue
            if any("eval" in k or "val" in k for k in rec) or rec.get("split") not in (None, "train"):
                continue
            out.setdefault(int(rec["step"]), rec)
    return out


def compare_losses(mine_path, ref_path):
    mine, ref = train_losses(mine_path), train_losses(ref_path)
    if not ref:
        print(f"no losses in {ref_path}")
        return False
    # The program may count steps from 0 or from 1: align on order.
    ms, rs = sorted(mine), sorted(ref)
    ok, worst = True, 0.0
    print(f"{'step':>4}  {'cplan':>12}  {'pytorch':>12}  {'rel diff':>9}")
    for i, rstep in enumerate(rs):
        r = ref[rstep]["loss"]
        if i >= len(ms):
            print(f"{rstep:4d}  {'(missing)':>12}  {r:12.7f}")
            ok = False
            continue
        m = mine[ms[i]]["loss"]
        rel = abs(m - r) / max(abs(r), 1e-12)
        worst = max(worst, rel)
        flag = "" if rel <= LOSS_RTOL else "  <-- over tolerance"
        extra = ""
        if "grad_norm" in mine[ms[i]]:
            extra = f"  grad_norm {mine[ms[i]]['grad_norm']:.6g} vs {ref[rstep]['grad_norm']:.6g}"
        print(f"{rstep:4d}  {m:12.7f}  {r:12.7f}  {rel:9.2e}{flag}{extra}")
        ok = ok and rel <= LOSS_RTOL
    print(f"max relative difference {worst:.3e} (tolerance {LOSS_RTOL:g})")
    return ok


def compare_params(mine_path, ref_path):
    mine, ref = st_read(mine_path), st_read(ref_path)
    worst_name, worst = None, 0.0
    missing = [k for k in ref if k not in mine]
    for k, b in ref.items():
        if k not in mine:
            continue
        a = mine[k].astype(np.float64).reshape(b.shape)
        e = np.abs(a - b) / (1.0 + np.abs(b))
        if k.endswith("c_attn.bias"):
            # The k third of the fused q/k/v bias has a zero gradient in exact arithmetic (a
            # constant added to every score of a row cancels in the softmax), so both sides see
            # rounding noise there, which Adam scales up to +-lr: not a meaningful difference.
            third = b.shape[-1] // 3
            e = np.concatenate((e[..., :third], e[..., 2 * third:]), axis=-1)
        err = float(np.max(e)) if e.size else 0.0
        if err > worst:
            worst_name, worst = k, err
    verdict = "within" if worst <= PARAM_TOL and not missing else "OVER"
    print(f"final params: max |a-b|/(1+|b|) = {worst:.3e} ({worst_name}), {verdict} {PARAM_TOL:g}"
          + (f"; missing in cplan's file: {', '.join(missing)}" if missing else "")
          + " (reported, not asserted)")


def main(argv):
    if len(argv) >= 3 and argv[0] == "tokens":
        write_tokens(argv[1], argv[2], int(argv[3]) if len(argv) > 3 else 200)
        return 0
    if len(argv) in (3, 6) and argv[0] == "losses":
        ok = compare_losses(argv[1], argv[2])
        if len(argv) == 6 and argv[3] == "--final":
            compare_params(argv[4], argv[5])
        return 0 if ok else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
