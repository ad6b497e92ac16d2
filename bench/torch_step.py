#!/usr/bin/python3
"""torch_step.py: the PyTorch half of bench/cpu_step.sh: times training steps of the same GPT.

  torch_step.py --plan plan.json --init init.safetensors --tokens bench_tokens.bin
                --heads 8 --steps 20 --threads 2

The model, its params (cplan's --save-init file, or a fresh normal(0.02) init without --init),
the data order, AdamW with two param groups, the schedule and clipping are those of
tests/pytorch/ref.py, in f32. A step is timed from the batch to the end of opt.step(). Prints one
JSON object per step ({"step", "loss", "ms"}), like the cplan program's --metrics.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "pytorch"))
import ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--init")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with open(args.plan) as f:
        plan = json.load(f)
    tr = plan["train"]
    n, t = tr["batch"], plan["seq_len"]
    if args.init:
        params = ref.st_read(args.init)
    else:
        rng = np.random.default_rng(0)
        params = {p["name"]: (rng.standard_normal(p["shape"]) * 0.02).astype(np.float32)
                  for p in plan["param_tensors"]}
    named = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in params.items()}
    model = ref.make_model(named, argparse.Namespace(heads=args.heads, norm_eps=1e-5,
                                                     rope_base=10000.0))
    opt = ref.make_optimizer(named, tr["optimizer"])
    toks = ref.tokens_read(args.tokens)
    for s in range(args.steps):
        t0 = time.perf_counter()
        lr = ref.lr_at(tr["schedule"], tr["optimizer"]["lr"], tr["steps"], s)
        for g in opt.param_groups:
            g["lr"] = lr
        idx, tgt = ref.tokens_batch(toks, n, t, s)
        loss = ref.cross_entropy(model.forward(named, idx), tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if tr.get("clip") is not None:
            torch.nn.utils.clip_grad_norm_(list(named.values()), max_norm=tr["clip"])
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        print(json.dumps({"step": s, "loss": loss.item(), "ms": ms}), flush=True)


if __name__ == "__main__":
    main()
