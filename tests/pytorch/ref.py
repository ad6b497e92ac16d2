#!/usr/bin/python3
"""ref.py: the PyTorch reference for cplan's training programs (tests/pytorch/compare.sh).

It rebuilds a cplan model in PyTorch from the params the program wrote with --save-init and
trains it with exactly the semantics of docs/language.md §8, so the losses of the two can be
compared step by step:

  * params keep cplan's names (param paths, "h.0.attn.c_attn.weight") and layouts: a linear
    weight is [in, out] and is applied as x @ weight (NOT torch's x @ weight.T);
  * ops: gelu is the tanh approximation, layer_norm uses the biased variance, rms_norm is
    x / sqrt(mean(x^2) + eps) * w, sdpa scales by 1/sqrt(d) and masks keys after the query,
    split_heads puts channel c = head*(C/h) + j in head `head` (view(B,T,h,d).transpose(1,2)),
    rope rotates the interleaved pairs (x[2i], x[2i+1]) by pos * base^(-2i/d), cross_entropy
    is the mean over targets != -1;
  * data: llm.c token files; sample j of step s reads tokens [o + j*T, o + j*T + T + 1) with
    o = (s mod S)*N*T and S = floor((ntokens - 1) / (N*T));
  * optimizer: torch.optim.AdamW (or SGD) with weight decay only on params of rank >= 2 (two
    param groups), the lr of every step set from the schedule of §8 through param_group['lr'],
    clip_grad_norm_(max_norm = clip) (its 1e-6 is §8's).

The architecture is read off the param names (wte/wpe: GPT-2; tok_embeddings: LLaMA), sizes off
their shapes; what names cannot say (heads, norm eps, rope base) comes from flags, and the train
settings come from `cplanc check --json` (--plan).  The safetensors package is not installed
here, so the file has its own small reader and writer.

Usage: ref.py --plan plan.json --init init.safetensors --tokens tokens.bin --heads 4
              [--out losses.jsonl] [--save-final final.safetensors] [--dtype f64|f32]
       ref.py --selftest     (random init, checks loss at init ~ log(vocab) and that it drops)
Prints one JSON object per step: {"step": s, "loss": ..., "lr": ..., "grad_norm": ...}.
"""
import argparse
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

# ---- safetensors ------------------------------------------------------------------------------

ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
             "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16}


def st_read(path):
    """Returns {name: numpy array} of a safetensors file (bf16 and bool are not needed here)."""
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen])
    data = blob[8 + hlen:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in ST_DTYPES:
            raise SystemExit(f"{path}: tensor {name}: dtype {t['dtype']} not supported by ref.py")
        lo, hi = t["data_offsets"]
        arr = np.frombuffer(data[lo:hi], dtype=ST_DTYPES[t["dtype"]]).copy()
        out[name] = arr.reshape(t["shape"])
    return out


def st_write(path, tensors):
    """Writes {name: numpy array} as safetensors, tensors in the dict's order."""
    names = {v: k for k, v in ST_DTYPES.items()}
    header, chunks, off = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        raw = arr.tobytes()
        header[name] = {"dtype": names[arr.dtype.type], "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)  # the format pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


# ---- llm.c token files -----------------------------------------------------------------------

TOKENS_MAGIC, TOKENS_VERSION = 20240520, 1


def tokens_write(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [TOKENS_MAGIC, TOKENS_VERSION, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.asarray(tokens, dtype=np.uint16).tobytes())


def tokens_read(path):
    raw = np.fromfile(path, dtype=np.uint8)
    header = raw[:1024].view(np.int32)
    if header[0] != TOKENS_MAGIC or header[1] != TOKENS_VERSION:
        raise SystemExit(f"{path}: not an llm.c token file")
    toks = raw[1024:].view(np.uint16).astype(np.int64)
    if len(toks) != header[2]:
        raise SystemExit(f"{path}: header says {header[2]} tokens, file has {len(toks)}")
    return toks


def tokens_batch(toks, n, t, step):
    """(inputs, targets) of step `step` (§8): sample j reads [o + j*T, o + j*T + T + 1)."""
    s_count = (len(toks) - 1) // (n * t)
    if s_count == 0:
        raise SystemExit(f"token file too small: {len(toks)} tokens, need {n * t + 1}")
    o = (step % s_count) * n * t
    rows = np.stack([toks[o + j * t: o + j * t + t + 1] for j in range(n)])
    return torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())


# ---- the ops of §8 ----------------------------------------------------------------------------

def layer_norm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)  # biased variance, as cplan


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def split_heads(x, h):
    b, t, c = x.shape
    return x.view(b, t, h, c // h).transpose(1, 2)  # channel c = head*(C/h) + j


def merge_heads(x):
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def sdpa(q, k, v, causal):
    d, t = q.shape[-1], q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
    if causal:
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)  # keys after the query position
        att = att.masked_fill(mask, float("-inf"))
    return torch.softmax(att, dim=-1) @ v


def rope(x, base):
    """Rotates the pairs (x[2i], x[2i+1]) by pos * base^(-2i/d), pos the index along dim -2."""
    t, d = x.shape[-2], x.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64)
    pos = torch.arange(t, dtype=torch.float64)
    ang = pos[:, None] * torch.pow(torch.tensor(float(base), dtype=torch.float64), -2.0 * i / d)
    cs, sn = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cs - x1 * sn, x0 * sn + x1 * cs), dim=-1).flatten(-2)


def cross_entropy(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=-1)  # mean over targets != -1


def linear(p, name, x):
    y = x @ p[name + ".weight"]  # cplan's weight is [in, out]
    return y + p[name + ".bias"] if name + ".bias" in p else y


# ---- the models ---------------------------------------------------------------------------------

def count_layers(p, prefix):
    return len({k.split(".")[1] for k in p if k.startswith(prefix + ".")})


class Gpt:
    """GPT-2 as examples/gpt.cplan and stdlib nn: learned positions, pre-norm blocks, tied head."""

    def __init__(self, heads, eps=1e-5):
        self.heads, self.eps = heads, eps

    def forward(self, p, idx):
        t = idx.shape[1]
        x = p["wte"][idx] + p["wpe"][torch.arange(t)]
        for i in range(count_layers(p, "h")):
            h = f"h.{i}"
            a = layer_norm(x, p[h + ".ln_1.weight"], p[h + ".ln_1.bias"], self.eps)
            q, k, v = linear(p, h + ".attn.c_attn", a).chunk(3, dim=-1)
            y = sdpa(split_heads(q, self.heads), split_heads(k, self.heads),
                     split_heads(v, self.heads), causal=True)
            x = x + linear(p, h + ".attn.c_proj", merge_heads(y))
            m = layer_norm(x, p[h + ".ln_2.weight"], p[h + ".ln_2.bias"], self.eps)
            m = F.gelu(linear(p, h + ".mlp.c_fc", m), approximate="tanh")
            x = x + linear(p, h + ".mlp.c_proj", m)
        x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], self.eps)
        return x @ p["wte"].t()


class Llama:
    """LLaMA as stdlib nn's llama_attention and swiglu: RMSNorm, rope, SwiGLU, untied head."""

    def __init__(self, heads, eps=1e-5, base=10000.0):
        self.heads, self.eps, self.base = heads, eps, base

    def forward(self, p, idx):
        x = p["tok_embeddings"][idx]
        for i in range(count_layers(p, "layers")):
            ly = f"layers.{i}"
            a = rms_norm(x, p[ly + ".attention_norm.weight"], self.eps)
            q = rope(split_heads(linear(p, ly + ".attention.wq", a), self.heads), self.base)
            k = rope(split_heads(linear(p, ly + ".attention.wk", a), self.heads), self.base)
            v = split_heads(linear(p, ly + ".attention.wv", a), self.heads)
            x = x + linear(p, ly + ".attention.wo", merge_heads(sdpa(q, k, v, causal=True)))
            m = rms_norm(x, p[ly + ".ffn_norm.weight"], self.eps)
            g = F.silu(linear(p, ly + ".feed_forward.w1", m)) * linear(p, ly + ".feed_forward.w3", m)
            x = x + linear(p, ly + ".feed_forward.w2", g)
        return linear(p, "output", rms_norm(x, p["norm.weight"], self.eps))


def make_model(params, args):
    if "wte" in params and "wpe" in params:
        return Gpt(args.heads, args.norm_eps)
    if "tok_embeddings" in params:
        return Llama(args.heads, args.norm_eps, args.rope_base)
    raise SystemExit("ref.py: unknown architecture (expected wte/wpe or tok_embeddings params)")


# ---- schedule and optimizer ---------------------------------------------------------------------

def lr_at(sched, lr, steps, s):
    """The learning rate of step s (from 0) of `steps`, §8."""
    kind = sched.get("kind", "constant")
    if kind == "constant":
        return lr
    warmup = int(sched.get("warmup", 0))
    if s < warmup:
        return lr * (s + 1) / warmup
    if kind == "cosine":
        lo = sched.get("min_lr", 0.0)
        return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup)))
    if kind == "linear":
        end = sched.get("end_lr", 0.0)
        return lr + (end - lr) * (s - warmup) / (steps - warmup)
    raise SystemExit(f"ref.py: schedule {kind} not supported")


def make_optimizer(named, opt):
    """Two groups: weight decay on params of rank >= 2 only (matrices and embeddings)."""
    decay = [t for t in named.values() if t.dim() >= 2]
    other = [t for t in named.values() if t.dim() < 2]
    wd = opt.get("weight_decay", 0.01 if opt["kind"] == "adamw" else 0.0)
    groups = [{"params": decay, "weight_decay": wd}, {"params": other, "weight_decay": 0.0}]
    if opt["kind"] == "adamw":
        betas = tuple(opt.get("betas", (0.9, 0.999)))
        return torch.optim.AdamW(groups, lr=opt["lr"], betas=betas, eps=opt.get("eps", 1e-8))
    if opt["kind"] == "sgd":
        return torch.optim.SGD(groups, lr=opt["lr"], momentum=opt.get("momentum", 0.0),
                               nesterov=bool(opt.get("nesterov", False)))
    raise SystemExit(f"ref.py: optimizer {opt['kind']} not supported")


# ---- training -------------------------------------------------------------------------------------

def train(params_np, conf, toks, model, dtype, out=sys.stdout):
    """Trains `conf["steps"]` steps; returns (losses, final params as numpy)."""
    named = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in params_np.items()}
    opt = make_optimizer(named, conf["optimizer"])
    n, t, steps = conf["batch"], conf["seq_len"], conf["steps"]
    losses = []
    for s in range(steps):
        lr = lr_at(conf["schedule"], conf["optimizer"]["lr"], steps, s)
        for g in opt.param_groups:
            g["lr"] = lr
        idx, tgt = tokens_batch(toks, n, t, s)
        loss = cross_entropy(model.forward(named, idx), tgt)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        grads = [p.grad for p in named.values() if p.grad is not None]
        norm = torch.norm(torch.stack([torch.norm(g) for g in grads])).item()
        if conf.get("clip") is not None:
            torch.nn.utils.clip_grad_norm_(list(named.values()), max_norm=conf["clip"])
        opt.step()
        losses.append(loss.item())
        print(json.dumps({"step": s, "loss": loss.item(), "lr": lr, "grad_norm": norm}),
              file=out, flush=True)
    final = {k: v.detach().to(torch.float32).numpy() for k, v in named.items()}
    return losses, final


def conf_from_plan(path, args):
    """Train settings from `cplanc check --json`: batch, steps, T, optimizer, schedule, clip."""
    with open(path) as f:
        plan = json.load(f)
    tr = plan.get("train")
    if not tr:
        raise SystemExit(f"{path}: no train block")
    conf = {"batch": tr["batch"], "steps": tr["steps"], "seq_len": plan["seq_len"],
            "optimizer": tr["optimizer"], "schedule": tr["schedule"], "clip": tr["clip"]}
    if args.steps is not None:
        conf["steps"] = args.steps
    return conf


# ---- self-test: no cplan needed -------------------------------------------------------------------

def random_params(kind, vocab, t, c, layers, rng):
    """A cplan-like init: normal(0.02) matrices, ones/zeros for norms and biases."""
    p = {}
    nrm = lambda *s: (rng.standard_normal(s) * 0.02).astype(np.float32)
    if kind == "gpt":
        p["wte"], p["wpe"] = nrm(vocab, c), nrm(t, c)
        for i in range(layers):
            h = f"h.{i}."
            p[h + "ln_1.weight"], p[h + "ln_1.bias"] = np.ones(c, np.float32), np.zeros(c, np.float32)
            p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"] = nrm(c, 3 * c), np.zeros(3 * c, np.float32)
            p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"] = nrm(c, c), np.zeros(c, np.float32)
            p[h + "ln_2.weight"], p[h + "ln_2.bias"] = np.ones(c, np.float32), np.zeros(c, np.float32)
            p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"] = nrm(c, 4 * c), np.zeros(4 * c, np.float32)
            p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"] = nrm(4 * c, c), np.zeros(c, np.float32)
        p["ln_f.weight"], p["ln_f.bias"] = np.ones(c, np.float32), np.zeros(c, np.float32)
    else:
        p["tok_embeddings"] = nrm(vocab, c)
        for i in range(layers):
            ly = f"layers.{i}."
            p[ly + "attention_norm.weight"] = np.ones(c, np.float32)
            for w in ("wq", "wk", "wv", "wo"):
                p[ly + f"attention.{w}.weight"] = nrm(c, c)
            p[ly + "ffn_norm.weight"] = np.ones(c, np.float32)
            p[ly + "feed_forward.w1.weight"] = nrm(c, 3 * c)
            p[ly + "feed_forward.w3.weight"] = nrm(c, 3 * c)
            p[ly + "feed_forward.w2.weight"] = nrm(3 * c, c)
        p["norm.weight"], p["output.weight"] = np.ones(c, np.float32), nrm(c, vocab)
    return p


def check_ops():
    """Op-level checks of the semantic details against direct formulas."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    # rope: pair i of position pos turns by pos * base^(-2i/d); position 0 is unchanged
    y = rope(x, 10000.0)
    assert torch.allclose(y[..., 0, :], x[..., 0, :])
    pos, i, d = 3, 2, 8
    a = pos * 10000.0 ** (-2.0 * i / d)
    x0, x1 = x[..., pos, 2 * i], x[..., pos, 2 * i + 1]
    assert torch.allclose(y[..., pos, 2 * i], x0 * math.cos(a) - x1 * math.sin(a))
    assert torch.allclose(y[..., pos, 2 * i + 1], x0 * math.sin(a) + x1 * math.cos(a))
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1))  # a rotation
    # split_heads: channel c = head*(C/h) + j
    z = torch.arange(2 * 3 * 12, dtype=torch.float64).view(2, 3, 12)
    s = split_heads(z, 4)
    assert s.shape == (2, 4, 3, 3) and s[1, 2, 1, 0] == z[1, 1, 2 * 3 + 0]
    assert torch.equal(merge_heads(s), z)
    # sdpa: causal row 0 attends only to key 0; scale 1/sqrt(d)
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64) for _ in range(3))
    o = sdpa(q, k, v, causal=True)
    assert torch.allclose(o[..., 0, :], v[..., 0, :])
    w = torch.softmax((q[0, 1, 2] @ k[0, 1, :3].t()) / math.sqrt(8), -1)
    assert torch.allclose(o[0, 1, 2], w @ v[0, 1, :3])
    # layer_norm: biased variance
    r = torch.randn(4, 6, dtype=torch.float64)
    ln = layer_norm(r, torch.ones(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64), 1e-5)
    assert torch.allclose(ln, (r - r.mean(-1, keepdim=True)) / torch.sqrt(r.var(-1, unbiased=False, keepdim=True) + 1e-5))
    # gelu: the tanh approximation
    g = F.gelu(r, approximate="tanh")
    assert torch.allclose(g, 0.5 * r * (1 + torch.tanh(math.sqrt(2 / math.pi) * (r + 0.044715 * r ** 3))))
    # cross_entropy: mean over targets != -1 only
    lg = torch.randn(2, 3, 5, dtype=torch.float64)
    tg = torch.tensor([[1, -1, 4], [-1, -1, 0]])
    ls = -torch.log_softmax(lg, -1)
    want = (ls[0, 0, 1] + ls[0, 2, 4] + ls[1, 2, 0]) / 3
    assert torch.allclose(cross_entropy(lg, tg), want)
    # schedule: warmup then cosine down to min_lr at the end
    sc = {"kind": "cosine", "warmup": 2, "min_lr": 1e-4}
    assert lr_at(sc, 1e-3, 6, 0) == 5e-4 and lr_at(sc, 1e-3, 6, 2) == 1e-3
    assert abs(lr_at(sc, 1e-3, 6, 4) - (1e-4 + 0.45e-3)) < 1e-12
    # data order: step s reads from o = (s mod S)*N*T
    toks = np.arange(200)
    inp, tgt = tokens_batch(toks, 4, 16, 4)  # S = 3, so step 4 reads from 64
    assert inp[0, 0] == 64 and inp[1, 0] == 80 and tgt[3, 15] == 64 + 3 * 16 + 16


def selftest():
    check_ops()
    print("ops: ok")
    rng = np.random.default_rng(0)
    vocab, t = 64, 16
    with tempfile.TemporaryDirectory() as d:
        # a learnable stream: each token mostly follows its predecessor by +1
        toks = [0]
        for _ in range(4000):
            toks.append((toks[-1] + 1) % vocab if rng.random() < 0.8 else int(rng.integers(vocab)))
        tokens_write(os.path.join(d, "tokens.bin"), toks)
        toks = tokens_read(os.path.join(d, "tokens.bin"))
        for kind in ("gpt", "llama"):
            p = random_params(kind, vocab, t, 32, 2, rng)
            st_write(os.path.join(d, "init.safetensors"), p)
            back = st_read(os.path.join(d, "init.safetensors"))
            assert all(np.array_equal(back[k], p[k]) for k in p)
            args = argparse.Namespace(heads=4, norm_eps=1e-5, rope_base=10000.0)
            model = make_model(back, args)
            conf = {"batch": 8, "steps": 60, "seq_len": t, "clip": 1.0,
                    "optimizer": {"kind": "adamw", "lr": 3e-3, "betas": [0.9, 0.95],
                                  "eps": 1e-8, "weight_decay": 0.1},
                    "schedule": {"kind": "cosine", "warmup": 2, "min_lr": 1e-4}}
            with open(os.devnull, "w") as null:
                losses, _ = train(back, conf, toks, model, torch.float64, out=null)
            first, last = losses[0], sum(losses[-5:]) / 5
            print(f"{kind}: loss at init {first:.4f} (log vocab {math.log(vocab):.4f}), "
                  f"after 60 steps {last:.4f}")
            assert abs(first - math.log(vocab)) < 0.05, "loss at init should be ~log(vocab)"
            assert last < first - 1.0, "loss should drop on a learnable stream"
    print("selftest: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", help="`cplanc check --json` output of the model")
    ap.add_argument("--init", help="the program's --save-init file")
    ap.add_argument("--tokens", help="the token file")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    ap.add_argument("--rope-base", type=float, default=10000.0)
    ap.add_argument("--steps", type=int, help="override the plan's steps (schedule too)")
    ap.add_argument("--dtype", choices=("f32", "f64"), default="f64",
                    help="f64 (default) makes the reference's own rounding negligible")
    ap.add_argument("--out", help="write the JSON lines here instead of stdout")
    ap.add_argument("--save-final", help="write the trained params as safetensors (F32)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.selftest:
        return selftest()
    if not args.plan or not args.init or not args.tokens:
        ap.error("--plan, --init and --tokens are required (or --selftest)")
    conf = conf_from_plan(args.plan, args)
    params = st_read(args.init)
    toks = tokens_read(args.tokens)
    dtype = torch.float64 if args.dtype == "f64" else torch.float32
    out = open(args.out, "w") if args.out else sys.stdout
    _, final = train(params, conf, toks, make_model(params, args), dtype, out=out)
    if args.save_final:
        st_write(args.save_final, final)


if __name__ == "__main__":
    main()
