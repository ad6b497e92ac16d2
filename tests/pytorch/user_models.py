#!/usr/bin/python3
"""user_models.py CPLANC [MODEL...]: models a PyTorch user writes first (tests/pytorch/user_models/*.cplan:
an MLP classifier, a post-norm BERT encoder with bidirectional attention and -1 targets, a LLaMA block
with rope and SwiGLU written by hand, shape ops (reshape, permute, transpose, negative slices, concat,
split, broadcasting), an MSE regression, a tied embedding with i32 arithmetic and a hand-written causal
mask, edge cases of maximum/max ties, pow and two-sided broadcasting, abs, clamp and where, Python's % and //,
i32 tokens sliced into inputs and targets (through shape ops and sum/mean/max), PyTorch's type
promotion of i32 tensors meeting floats, cross_entropy's ignore_index, softmax over an axis other than
the last and reductions over axes that are not adjacent, cross-attention, sdpa's attn_mask and
attn_bias, min, argmin, logsumexp, var and std, where of two i32 branches, heads wider than 128, grouped-query attention with enable_gqa, expand and repeat_interleave, flatten, unsqueeze and squeeze, the exact gelu and erf), each trained one step of
sgd(lr = 1) by cplan from its --save-init params, and the same model in PyTorch (f64) from those params:
the loss must agree within 1e-5 (relative) and each param's gradient (init - final) within 1e-4 of its
largest element.  Exit 0 when every model agrees.  CPLAN_DIST=1 (or all, or config labels) also
trains each model under distributed strategies on CPU ranks against its single-device run (see DIST)."""
import sys, os, json, subprocess, math, shutil, tempfile, time
import numpy as np, torch
import torch.nn.functional as F
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ref import st_read, st_write
torch.set_default_dtype(torch.float64)
rng = np.random.default_rng(0)
def lin(x, p, name, bias=True):
    y = x @ p[name + '.weight']
    return y + p[name + '.bias'] if bias else y
def ln(x, p, name, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], p[name + '.weight'], p[name + '.bias'], eps)
def gelu(x): return F.gelu(x, approximate='tanh')
def heads(x, h):
    B, T, C = x.shape
    return x.view(B, T, h, C // h).transpose(1, 2)
def merge(x):
    B, h, T, d = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d)
def sdpa(q, k, v, is_causal=False, scale=None):
    sc = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if is_causal:
        T = q.shape[-2]
        sc = sc.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float('-inf'))
    return torch.softmax(sc, -1) @ v
def ce(logits, t):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1).long(), ignore_index=-1)
def rope(x, base=10000.0):
    *_, T, d = x.shape
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos * inv
    c, s = torch.cos(ang), torch.sin(ang)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1)
    return out.flatten(-2)

MODELS = {}
def model(name, data):
    def deco(f):
        MODELS[name] = (data, f); return f
    return deco

B = 4
@model('m1_mlp', lambda: {'x': rng.normal(size=(B, 6)).astype(np.float32), 'y': np.array([0, 2, 1, 2], np.int32)})
def m1(p, d):
    h = torch.relu(lin(d['x'], p, 'fc1'))
    h = torch.tanh(lin(h, p, 'fc2'))
    return ce(lin(h, p, 'head'), d['y'])

@model('m2_bert', lambda: {'idx': rng.integers(0, 20, size=(B, 8)).astype(np.int32),
                           'targets': np.where(rng.random((B, 8)) < 0.4, rng.integers(0, 20, size=(B, 8)), -1).astype(np.int32)})
def m2(p, d):
    x = ln(p['wte'][d['idx'].long()] + p['wpe'], p, 'ln_emb')
    for i in range(2):
        s = f'layers.{i}.block.'
        q, k, v = (heads(lin(x, p, s + n), 2) for n in 'qkv')
        a = lin(merge(sdpa(q, k, v)), p, s + 'o')
        x = ln(x + a, p, s + 'ln1', 1e-12)
        f = lin(gelu(lin(x, p, s + 'fc1')), p, s + 'fc2')
        x = ln(x + f, p, s + 'ln2', 1e-12)
    return ce(x @ p['wte'].T, d['targets'])

@model('m3_llama', lambda: {'idx': rng.integers(0, 16, size=(B, 8)).astype(np.int32),
                            'targets': rng.integers(0, 16, size=(B, 8)).astype(np.int32)})
def m3(p, d):
    x = p['emb'][d['idx'].long()]
    def rms(x, w, eps=1e-6): return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w
    pr = lambda x, n: x @ p[n + '.weight']
    h = rms(x, p['attn_norm.weight'])
    q = rope(heads(pr(h, 'wq'), 2)); k = rope(heads(pr(h, 'wk'), 2)); v = heads(pr(h, 'wv'), 2)
    x = x + pr(merge(sdpa(q, k, v, is_causal=True)), 'wo')
    h = rms(x, p['ones_w_0.weight'])
    x = x + pr(F.silu(pr(h, 'w1')) * pr(h, 'w3'), 'w2')
    return ce(pr(x, 'out'), d['targets'])

@model('m4_shapes', lambda: {'x': rng.normal(size=(B, 6, 4)).astype(np.float32), 'y': rng.random((B, 2)).astype(np.float32)})
def m4(p, d):
    x = d['x']
    h = torch.relu(x @ p['dense_0.w'] + p['dense_0.b'])
    h = h.reshape(B, 6, 2, 4).permute(0, 2, 1, 3).transpose(-1, -2)
    a = h[..., 1:4]; b = h[..., 0:2]
    c = torch.cat([a, b * 2.0], -1)
    pp, qq = torch.split(x * p['s'], 3, dim=1)
    m = c.amax(-1) + c.mean(-1)
    r = m.sum(-1) + (pp * qq).sum((1, 2)).reshape(B, 1)
    pred = torch.sigmoid(r @ p['out.w'] + p['out.b'])
    return ((pred - d['y']) ** 2).mean()

@model('m5_reg', lambda: {'x': rng.normal(size=(B, 5)).astype(np.float32), 'y': rng.normal(size=(B, 1)).astype(np.float32)})
def m5(p, d):
    pred = gelu(d['x'] @ p['mlp_0.w1'] + p['mlp_0.b1']) @ p['mlp_0.w2']
    return ((pred - d['y']) ** 2).mean()

@model('m6_tied', lambda: {'idx': rng.integers(0, 12, size=(B, 6)).astype(np.int32),
                           'targets': rng.integers(0, 12, size=(B, 6)).astype(np.int32)})
def m6(p, d):
    idx = d['idx'].long(); w = p['wte']
    x = w[idx] + 0.5 * w[12 - 1 - idx]
    pos = torch.arange(6)
    mask = (pos[:, None] >= pos[None, :]).double()
    sc = x @ x.transpose(-1, -2) / math.sqrt(8.0)
    sc = sc * mask + (1 - mask) * -1e9
    y = torch.softmax(sc, -1) @ x
    return ce(y @ w.T, d['targets'])

@model('m7_edge', lambda: {'x': rng.normal(size=(B, 4)).astype(np.float32), 'z': rng.normal(size=(B, 3, 4)).astype(np.float32)})
def m7(p, d):
    h = d['x'] @ p['w']; c = p['c']
    r = torch.maximum(h, torch.tensor(0.0)) + torch.minimum(c, h)
    t = torch.maximum(c, c * 2.0)  # c = 0: a tie everywhere, whose gradient maximum splits in halves
    q = torch.pow(h * h + 1.0, 1.5) + torch.pow(h, 2.0) + torch.pow(h, 3.0)
    tt = t.reshape(1, 4) + 0.0 * h  # ties along the axis: max's gradient goes to the first maximum
    m = tt.gather(-1, tt.argmax(-1, keepdim=True)).squeeze(-1)
    lsm = torch.log_softmax(h, -1)
    bb = h.reshape(B, 1, 4) * p['u']
    mm = (bb + d['z']) @ p['v']
    cc = torch.cat([mm, d['z'].sum(-1).reshape(B, 3, 1), mm * mm], -1)
    cm = cc.mean(0).flatten()
    return r.mean() + q.mean() * 0.01 + m.mean() + t.mean() - lsm.mean() + (torch.softmax(cc, -1) * cc).mean() + cm[cm.argmax()]

@model('m8_select', lambda: {'x': rng.normal(size=(B, 4)).astype(np.float32), 'y': rng.normal(size=(B, 4)).astype(np.float32),
                             'k': rng.integers(-4, 6, size=(B, 4)).astype(np.int32)})
def m8(p, d):
    x, y, g = d['x'], d['y'], p['g']
    h = x @ p['w']
    a = h.abs() + g.abs()
    c2 = torch.clamp(h, min=-0.3, max=0.4)
    c1 = torch.clamp(h * 2.0, min=0.1)
    cm = torch.clamp(g, max=0.2)
    cp = torch.clamp(h, 0.5, -0.5)  # min > max: max everywhere, no gradient
    wn = torch.where(h > 0, h * g, 0.0)
    wb = torch.where(x < y, p['b0'], h)
    wc = torch.where(g > 0, h, -h)
    ki = (d['k'] - 2).abs() + torch.clamp(d['k'], 0, 3)
    assert ki.dtype == torch.int32
    return (a.mean() + (c2 * c2).mean() + c1.mean() + cm.mean() + cp.mean() + (wn * wn).mean() + (wb * y).mean() + wc.mean()
            + (ki.double() * h).mean())

@model('m9_divmod', lambda: {'x': (rng.normal(size=(B, 4)) * 2).astype(np.float32),
                             'k': rng.integers(-9, 10, size=(B, 4)).astype(np.int32)})
def m9(p, d):
    x, k = d['x'], d['k']
    h = x @ p['w']
    r = torch.remainder(h, 0.7)
    s = torch.remainder(h, p['m'].abs() + 0.5)
    n = torch.remainder(h * 3.0, -1.3)
    q = torch.div(h.detach(), 0.25, rounding_mode='floor')
    ki = torch.remainder(k, 3) + torch.div(k, -2, rounding_mode='floor') + torch.remainder(k * 7, -4)
    assert ki.dtype == torch.int32
    return r.mean() + (s * s).mean() + n.mean() + (q * h).mean() + (ki.double() * h).mean()

@model('m10_slice_tokens', lambda: {'tok': rng.integers(0, 16, size=(B, 9)).astype(np.int32)})
def m10(p, d):
    tok, wte, w = d['tok'], p['wte'], p['w']
    idx, targets = tok[:, :-1], tok[:, 1:]
    a = idx.reshape(B, 2, 4)
    ti, pi = a.transpose(-1, -2), a.permute(2, 0, 1)
    mh = merge(heads(a, 2).transpose(-1, -2))
    p1, p2 = torch.cat([targets, idx[:, 3:5]], 1).split(5, 1)
    cc = torch.cat([p2, p1[:, 0:3]], -1)
    s, mx = tok.sum(1, dtype=torch.int32), (a - 20).amax((1, 2))
    f = ti.reshape(B, 8) + pi.permute(1, 0, 2).reshape(B, 8) * 2 - mh.reshape(B, 8) + cc * 3
    assert f.dtype == torch.int32 and mx.dtype == torch.int32
    g = (f + s.reshape(B, 1) + mx.reshape(B, 1)).double() * 0.01 + ti.double().mean((1, 2)).reshape(B, 1) * 0.1
    h = F.embedding(idx.long(), wte) @ w
    return ce(h @ wte.T, targets) + (g * h.sum(-1)).mean() * (tok.sum().double() * 0.001 + tok.double().mean() * 0.01)

@model('m11_promote', lambda: {'x': rng.normal(size=(B, 4)).astype(np.float32),
                               'k': rng.integers(-4, 6, size=(B, 4)).astype(np.int32)})
def m11(p, d):
    x, k, g = d['x'], d['k'], p['g']
    h = x @ p['w']
    a = k * h
    b = h / (k * k + 1)
    c = torch.maximum(h, k) + torch.minimum(k - 2, h * g)
    e = torch.where(h > 0, k, h * g)
    s = torch.sqrt(k * k) + torch.exp(-(k * k)) + torch.sigmoid(k) + torch.pow(k.abs(), 1.5)
    n = -k + torch.relu(k) + torch.square(k)
    assert n.dtype == torch.int32 and s.dtype == torch.float64
    m = k.sum() * 0.01 + (k > 0.5) + k * 1.0
    cc = torch.cat([k, h], -1) * 0.1
    return (a.mean() + (b * b).mean() + c.mean() + e.mean() + (s * h).mean() + (n.double() * h).mean() + (m * h).mean()
            + (cc * cc).mean())

@model('m12_ignore', lambda: {'idx': rng.integers(0, 7, size=(B, 6)).astype(np.int32),
                              'targets': np.where(rng.random((B, 6)) < 0.5, rng.integers(0, 7, size=(B, 6)), -100).astype(np.int32)})
def m12(p, d):
    logits = F.embedding(d['idx'].long(), p['wte']) @ p['w']
    ce100 = F.cross_entropy(logits.reshape(-1, 7), d['targets'].reshape(-1).long(), ignore_index=-100)
    ce0 = F.cross_entropy(logits.reshape(-1, 7), d['idx'].reshape(-1).long(), ignore_index=0)
    ls = F.cross_entropy(logits.reshape(-1, 7) * 0.5, d['targets'].reshape(-1).long(), ignore_index=-100, label_smoothing=0.2)
    return ce100 + 0.5 * ce0 + ls

@model('m13_axes', lambda: {'x': rng.normal(size=(B, 6)).astype(np.float32)})
def m13(p, d):
    h = (d['x'] @ p['w']).reshape(-1, 3, 4) * p['u']
    g = h.reshape(-1, 3, 2, 2)
    s1 = torch.softmax(h, 1)
    s0 = torch.log_softmax(g, -3)
    r1 = g.sum((1, 3))
    r2 = (g * g).mean((0, 2), keepdim=True)
    r3 = g.max(3).values.max(1).values  # cplan's max gives a tie all to the first maximal element
    r4 = g.sum((0, 2, 3))
    return (s1 * h).mean() + (s0 * g).mean() + (r1 * r1).mean() + r2.mean() + r3.mean() + (r4 * r4).mean()

@model('m14_cross', lambda: {'x': rng.normal(size=(B, 3, 8)).astype(np.float32), 'enc': rng.normal(size=(B, 5, 6)).astype(np.float32)})
def m14(p, d):
    x, enc = d['x'], d['enc']
    def attn(q, k, v, is_causal=False):  # torch's scaled_dot_product_attention (this torch lacks it)
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if is_causal:  # top-left: query i sees keys j <= i
            s = s.masked_fill(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril().logical_not(), float('-inf'))
        return torch.softmax(s, -1) @ v
    q, k, v = heads(x @ p['wq'], 2), heads(enc @ p['wk'], 2), heads(enc @ p['wv'], 2)
    y = merge(attn(q, k, v))
    yc = merge(attn(q, k, v, is_causal=True))
    ys = merge(attn(q, q, heads(x @ p['wx'], 2), is_causal=True))
    u = heads(enc @ p['wu'], 2)
    yf, yfc = merge(attn(q, k, u)), merge(attn(q, k, u, is_causal=True))
    yg = merge(attn(q, k[:, :, 0:2], u[:, :, 3:5], is_causal=True))
    return ((y * y).mean() + (yc * yc).mean() + (ys * ys).mean() + yc.mean() + (yf * yf).mean() + (yfc * yfc).mean()
            + (yg * yg).mean())

def m15_data():
    idx = rng.integers(1, 9, size=(B, 6)).astype(np.int32)
    for b in range(B): idx[b, 6 - b:] = 0  # b padding tokens at the end of sample b
    idx[0, 0] = 0  # and sample 0's first: its first query has no key under causal
    return {'idx': idx, 'targets': np.where(idx == 0, -100, rng.integers(0, 9, size=(B, 6))).astype(np.int32)}

@model('m15_mask', m15_data)
def m15(p, d):
    idx = d['idx'].long()
    x = F.embedding(idx, p['wte'])
    q, k, v = (heads(t, 2) for t in (x @ p['wqkv']).split(8, -1))
    keep = (idx != 0).reshape(B, 1, 1, 6)
    def attn(mask, bias=None):  # torch's scaled_dot_product_attention with a bool attn_mask (this torch lacks it)
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if bias is not None: s = s + bias
        s = s.masked_fill(mask.logical_not(), float('-inf'))
        none = torch.isneginf(s).all(-1, keepdim=True)  # its _safe_softmax (2.5 on): a row with no key is 0
        return torch.softmax(s.masked_fill(none, 0.0), -1).masked_fill(none, 0.0) @ v
    y1 = merge(attn(keep))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    y2 = merge(attn(keep & causal, p['rel']))
    y3 = merge(attn(keep & causal))
    y4 = merge(attn(torch.arange(6) != 2))
    logits = (y1 + y2 + y3 + y4) @ p['wte'].T
    return F.cross_entropy(logits.reshape(-1, 9), d['targets'].reshape(-1).long(), ignore_index=-100)

@model('m16_reduce', lambda: {'x': rng.normal(size=(B, 6)).astype(np.float32), 'k': rng.integers(-5, 5, size=(B, 6)).astype(np.int32)})
def m16(p, d):
    h, k = (d['x'] @ p['w']).reshape(-1, 2, 3), d['k']
    a = h.min(-1).values + h.min()
    lse = torch.logsumexp(h, (1, 2)) + torch.logsumexp(h, 1, keepdim=True).sum((1, 2)) + torch.logsumexp(h, (0, 1, 2))
    v = h.var(-1) + h.var((0, 2), keepdim=True).sum() + h.var(unbiased=False)
    s = h.std(1) + h.std()
    ki = k.min(1).values + k.argmin(-1) + h.argmin(1).sum(1)
    return a.mean() + lse.mean() + v.mean() + s.mean() + (ki.double() * h.mean((1, 2))).mean()


@model('m17_where_i32', lambda: {'tok': rng.integers(0, 9, size=(B, 7)).astype(np.int32)})
def m17(p, d):
    idx, nxt = d['tok'][:, :6].long(), d['tok'][:, 1:].long()
    targets = torch.where(nxt == 0, -1, nxt)
    ids = torch.where(idx > 4, idx - 5, torch.arange(6).reshape(1, 6) % 9)
    assert targets.dtype == torch.int64 and ids.dtype == torch.int64
    h = F.embedding(idx, p['wte']) + F.embedding(ids, p['wte'])
    logits = h @ p['w']
    small = torch.where(idx < 2, idx, 7)
    return ce(logits, targets) + 0.01 * (small.double() * h.mean(-1)).mean()

@model('m18_wide_heads', lambda: {'idx': rng.integers(0, 11, size=(B, 5)).astype(np.int32),
                                  'targets': rng.integers(0, 11, size=(B, 5)).astype(np.int32)})
def m18(p, d):
    x = F.embedding(d['idx'].long(), p['wte'])
    q, k, v = (heads(x @ p[w], 2) for w in ('wq', 'wk', 'wv'))
    a = merge(sdpa(q, k, v, True)) + merge(sdpa(q, k, v, scale=0.3))
    return ce((x + a) @ p['wte'].T, d['targets'])

@model('m19_gqa', lambda: {'idx': rng.integers(0, 13, size=(B, 6)).astype(np.int32),
                           'targets': rng.integers(0, 13, size=(B, 6)).astype(np.int32)})
def m19(p, d):
    x = p['emb'][d['idx'].long()]
    q = rope(heads(x @ p['wq'], 4)); k = rope(heads(x @ p['wk'], 2)); v = heads(x @ p['wv'], 2)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    k2 = k[:, :, None].expand(-1, -1, 2, -1, -1).reshape(-1, 4, 6, 4)
    a = sdpa(q, kr, vr, True) + sdpa(q, k2, vr) * 0.5 + sdpa(q, kr, vr, True) * 0.25
    x = x + merge(a) @ p['wo']
    shift = d['idx'][:, None].expand(-1, 2, -1)
    return ce(x @ p['emb'].T, d['targets']) + 0.01 * shift.double().mean()

@model('m20_views', lambda: {'x': rng.normal(size=(B, 2, 3, 4)).astype(np.float32), 'y': rng.normal(size=(B,)).astype(np.float32)})
def m20(p, d):
    h = torch.relu(d['x'].flatten(1) @ p['w1'])
    h = h * h.mean(-1).unsqueeze(-1) * p['g'].unsqueeze(0)
    rows = d['x'].flatten(start_dim=2)
    pred = (h @ p['w2']).squeeze(1) + rows.flatten(1, -1).mean(-1)
    return ((pred - d['y']) ** 2).mean()

@model('m21_gelu_erf', lambda: {'x': rng.normal(size=(B, 6)).astype(np.float32), 'y': np.array([0, 2, 1, 1], np.int32)})
def m21(p, d):
    h = d['x'] @ p['w1']
    z = F.gelu(h) + 0.5 * gelu(h) + 0.25 * torch.erf(h * 0.3)
    return ce(z @ p['w2'] + torch.erf(d['x']) @ p['w3'], d['y'])

@model('m22_matmul_bcast', lambda: {'idx': rng.integers(0, 13, size=(B, 6)).astype(np.int32),
                                    'targets': rng.integers(0, 13, size=(B, 6)).astype(np.int32)})
def m22(p, d):
    x = p['emb'][d['idx'].long()]
    q = heads(x @ p['wq'], 4).reshape(B, 2, 2, 6, 4)
    k = heads(x @ p['wk'], 2)[:, :, None]
    v = heads(x @ p['wv'], 2)[:, :, None]
    a = (torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v).reshape(B, 4, 6, 4)
    a = a @ p['wh'] + a @ p['ws']
    x = x + merge(a) @ p['wo']
    return ce(x @ p['emb'].T, d['targets'])

@model('m23_losses', lambda: {'x': rng.normal(size=(B, 6)).astype(np.float32), 'y': rng.normal(size=(B, 2)).astype(np.float32),
                              'labels': rng.integers(0, 2, size=(B, 3)).astype(np.int32)})
def m23(p, d):
    h = torch.tanh(d['x'] @ p['w1'])
    pred, logits = h @ p['w2'], h @ p['w3'] * 3.0
    return (F.mse_loss(pred, d['y']) + 0.5 * F.l1_loss(pred, d['y']) +
            F.binary_cross_entropy_with_logits(logits, d['labels'].double()))

@model('m24_activations', lambda: {'idx': rng.integers(0, 11, size=(B, 6)).astype(np.int32),
                                   'y': np.array([0, 3, 1, 2], np.int32)})
def m24(p, d):
    idx = d['idx'].long()
    x = F.layer_norm(p['emb'][idx.masked_fill(idx > 8, 0)], (8,), p['ln.weight'], None, 1e-5)
    h = F.softplus(x @ p['w1']) + F.softplus(x @ p['w1'], beta=2.0) * 0.5 + F.leaky_relu(x @ p['w1'], 0.2)
    h = F.elu(h @ p['w1'] - 1.0) + F.elu(h @ p['w1'], alpha=0.5) + F.leaky_relu(h)
    a, c = (h @ p['w2']).chunk(2, -1)
    r = torch.stack([a, c], -1).reshape(B, 6, 16) @ p['w4']
    s = r.masked_fill((idx == 0)[..., None], -1e9)
    pr = torch.softmax(s, -1)
    pooled = torch.stack([a, c])
    return ce((pr * 4.0 + pooled.sum(0)).mean(1) @ p['w3'], d['y'])

@model('m25_sincos', lambda: {'idx': rng.integers(0, 13, size=(B, 6)).astype(np.int32),
                              'targets': rng.integers(0, 13, size=(B, 6)).astype(np.int32)})
def m25(p, d):
    pos = torch.arange(6, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(4, dtype=torch.float64)[None] * -1.1512925464970228)
    ang = pos * freq
    x = p['emb'][d['idx'].long()] + torch.cat([torch.sin(ang), torch.cos(ang)], -1)
    h = x @ p['w']
    a, b = h.chunk(2, -1)
    r = torch.cat([a * torch.cos(ang) - b * torch.sin(ang), a * torch.sin(ang) + b * torch.cos(ang)], -1)
    g = x @ p['w2']
    return ce((r + 0.3 * torch.sin(g) + 0.2 * torch.cos(g * 2.0)) @ p['emb'].T, d['targets'])

# CPLAN_EMU=BUILD_DIR: the CUDA program (a mesh of one h100_sxm, precision CPLAN_EMU_PRECISION, default
# f32) instead of the CPU one, compiled against the CUDA emulator of BUILD_DIR (tests/cuda/emu, as
# tests/cuda/emu_program.sh does) and run from the CPU program's initial params; bf16 and f16 store
# activations in 16 bits, so their tolerances are looser.
EMU = os.environ.get('CPLAN_EMU')
EMU_PREC = os.environ.get('CPLAN_EMU_PRECISION', 'f32')
TOL = {'f32': (1e-5, 1e-4), 'bf16': (2e-2, 5e-2), 'f16': (5e-3, 2e-2)}[EMU_PREC if EMU else 'f32']
# the models whose cross_entropy ignores targets unevenly over the samples run on the emulator in
# micro-batches (gradient accumulation) against PyTorch's whole batch: the CUDA program's
# cross_entropy weights (RtRun.ce_weight: the mean over the step's targets, docs/language.md Batches)
EMU_MICRO = {'m2_bert': 1, 'm12_ignore': 1, 'm15_mask': 2, 'm17_where_i32': 1}
# m4_shapes ends in a sigmoid near saturation: 1 - pred of a bf16 pred keeps one or two significant
# bits, so its param gradients are off by up to ~8% in bf16 (PyTorch's autocast runs sigmoid in bf16
# too); its loss stays within the tolerance
GRAD_TOL = {'m4_shapes': 0.15} if EMU and EMU_PREC == 'bf16' else {}


# CPLAN_DIST=1: after the single-device CPU run, each model is rebuilt with pinned strategies on a mesh
# of CPU ranks (DIST_CONFIGS: dp, tp, dp x tp, sequence parallelism, pp, ZeRO 1-3, recompute,
# micro-batches) and run under mpirun on loopback from the single-device run's initial params; the loss
# (1e-5 relative) and every param's gradient (init - final, 1e-4 of its largest element) must equal the
# single-device run's (which the PyTorch check above holds to PyTorch). A build that refuses a strategy
# must be a known, legitimate refusal (DIST_REFUSALS); any other refusal, a crash, a hang (timeout) or a
# mismatch fails. CPLAN_DIST=1 runs DIST_CTEST (a subset per model that keeps the ctest under ~6
# minutes on 2 cores); CPLAN_DIST=all runs every config on every model; CPLAN_DIST=LABEL,LABEL... those.
DIST = os.environ.get('CPLAN_DIST') if os.environ.get('CPLAN_DIST', '0') not in ('', '0') else None
# label: (ranks, strategy fields)
DIST_CONFIGS = {
    'dp2': (2, ['dp=2']),
    'tp2': (2, ['tp=2']),
    'dp2tp2': (4, ['dp=2', 'tp=2']),
    'dp2tp2sp2': (4, ['dp=2', 'tp=2', 'sp=2']),
    'pp2': (2, ['pp=2', 'micro=1']),
    'zero1': (2, ['dp=2', 'zero=1']),
    'zero2': (2, ['dp=2', 'zero=2', 'micro=1']),
    'zero3': (2, ['dp=2', 'zero=3']),
    'micro1': (1, ['micro=1']),
    'full1': (1, ['recompute="full"', 'micro=2']),
    'sel_dp2': (2, ['dp=2', 'recompute="selective"', 'micro=1']),
    'tp2micro': (2, ['tp=2', 'micro=2']),
    'zero1tp2': (4, ['dp=2', 'tp=2', 'zero=1', 'micro=1']),
    'zero3tp2': (4, ['dp=2', 'tp=2', 'zero=3']),
    'full_tp2': (2, ['tp=2', 'recompute="full"']),
    'pp2dp2': (4, ['dp=2', 'pp=2', 'micro=1']),
    'pp2tp2': (4, ['tp=2', 'pp=2', 'micro=2']),
    'pp2gpipe': (2, ['pp=2', 'micro=1', 'pipeline="gpipe"']),
    'pp2full': (2, ['pp=2', 'micro=1', 'recompute="full"']),
    'pp2zero1': (4, ['dp=2', 'pp=2', 'zero=1', 'micro=1']),
}
# the ctest's subset (every model, 8 of the 20 configs: about 3 minutes on 2 cores; all 20 about 5.5):
# tp alone, dp x tp x sp on 4 ranks, ZeRO 1, 2 (with accumulation), ZeRO 3 with tp, pp with dp (m2_bert,
# the model with layers), full recompute with accumulation on one device, selective recompute with dp
# and accumulation
DIST_CTEST = ['tp2', 'dp2tp2sp2', 'zero1', 'zero2', 'zero3tp2', 'pp2dp2', 'full1', 'sel_dp2']
# The refusals that are legitimate (each an error at the strategy, as docs/language.md §7 lists them):
# (models or None for any, labels, a substring of the build's error)
DIST_REFUSALS = [
    (None, ['pp2', 'pp2dp2', 'pp2tp2', 'pp2gpipe', 'pp2full', 'pp2zero1'], "exceeds the model's 0 layers"),  # pp cuts layers (for loops); only m2_bert has them
    (None, ['dp2tp2sp2'], 'does not divide the sequence length'),  # m5 [B, 5], m10 [B, 9], m14 [B, 3, 8]
    # a linear's output dim tp does not divide (3 classes, a vocabulary of 7): column-parallel needs it
    # (Megatron's ColumnParallelLinear asserts it too; cplan does not fall back to a whole weight here,
    # as it does for an embedding table, see the report of the sweep)
    (['m1_mlp', 'm12_ignore', 'm17_where_i32', 'm21_gelu_erf'], ['tp2', 'dp2tp2', 'dp2tp2sp2', 'tp2micro', 'zero1tp2', 'zero3tp2', 'full_tp2'],
     'which column-parallel splits'),
]
# Models whose loss is not a mean of per-sample terms: splitting the batch into micro-batches (dp,
# micro) changes the number they compute, in cplan as in PyTorch's DDP and gradient accumulation (the
# loss of each micro-batch, averaged). Under a strategy with micro-batches of m < batch samples they
# are compared with the single-device program of micro = m instead (the same micro-batches on one
# device), so that what is tested is the strategy and not the partition of the batch. (cross_entropy
# with ignored targets is not among them: its mean is over the step's targets under every strategy,
# docs/language.md, Batches, label_smoothing's term too; m2_bert, m12_ignore, m15_mask and m17_where_i32
# are compared with the whole batch on one device.) Those where a nonlinear function reads a
# reduction over the batch (LOWERED_DIFFERS) compute another number again under dp with tp, pp or
# ZeRO: the SPMD lowering all-reduces the reduction first (the function sees the whole batch's
# value), where plain dp applies it to each rank's; there they are run but not compared.
BATCH_COUPLED = {
    'm7_edge': 'a mean over the batch dim, its argmax',
    'm10_slice_tokens': 'sum and mean of the whole token tensor times a batch mean',
    'm11_promote': 'the sum of the whole i32 tensor times each sample',
    'm13_axes': 'squares of sums over the batch dim',
    'm16_reduce': 'min, logsumexp and var over the batch dim',
}
LOWERED_DIFFERS = {'m7_edge', 'm10_slice_tokens', 'm11_promote', 'm13_axes', 'm16_reduce'}
MPIRUN = os.environ.get('MPIEXEC') or shutil.which('mpirun')


def dist(cplanc, name, wd, single):
    """The strategies of DIST against the single-device run (its init.st, final.st, m.jsonl)."""
    labels = list(DIST_CONFIGS) if DIST == 'all' else DIST_CTEST if DIST == '1' else DIST.split(',')
    src = f'{wd}/{name}-mesh.cplan'
    with open(f'{wd}/{name}.cplan') as fh, open(src, 'w') as out:
        out.write(fh.read() + '\nmesh laptop {\n  shape  = [cpu = 1]\n  device = cpu\n}\n')
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1', OMPI_MCA_btl='self,vader',
               OMPI_MCA_rmaps_base_oversubscribe='1')
    init, final, loss = single
    ok = True
    refs = {}

    def reference(m):  # the single-device program with micro-batches of m samples: (final params, loss)
        if m not in refs:
            if not run([[cplanc, 'build', f'{name}.cplan', '-o', f'prog-micro{m}', '--set', f'train.strategy.micro={m}'],
                        [f'./prog-micro{m}', '--init', 'init.st', '--save', f'final-micro{m}.st', '--metrics',
                         f'm-micro{m}.jsonl', '--quiet']], wd, f'{name} (one device, micro = {m})'):
                refs[m] = None
            else:
                refs[m] = (st_read(f'{wd}/final-micro{m}.st'),
                           [json.loads(l) for l in open(f'{wd}/m-micro{m}.jsonl') if l.strip()][0]['loss'])
        return refs[m]
    for label in labels:
        t0 = time.time()
        n, fields = DIST_CONFIGS[label]
        st = dict(f.split('=', 1) for f in fields)
        micro = int(st.get('micro', B // int(st.get('dp', 1))))
        ref_final, ref_loss, vs = final, loss, ''
        lowered = int(st.get('dp', 1)) > 1 and any(k in st for k in ('tp', 'zero', 'pp'))
        if name in BATCH_COUPLED and micro < B and not (lowered and name in LOWERED_DIFFERS):
            ref = reference(micro)
            if ref is None:
                ok = False; continue
            (ref_final, ref_loss), vs = ref, f' vs micro={micro} on one device'
        sets = ['--set', 'train.mesh=laptop', '--set', f'mesh.laptop.shape.cpu={n}']
        for f in fields: sets += ['--set', 'train.strategy.' + f]
        prog = f'prog-{label}'
        r = subprocess.run([cplanc, 'build', src, '-o', prog] + sets, cwd=wd, capture_output=True, text=True)
        if r.returncode:
            err = (r.stdout + r.stderr).strip()
            want = [w for ms, ls, w in DIST_REFUSALS if (ms is None or name in ms) and label in ls and w in err]
            if want:
                print(f'  {label}: refused (legitimate): {want[0]}')
                continue
            ok = False
            print(f'  {label}: FAILED: the build refuses {" ".join(fields)} (exit {r.returncode}):\n{err}')
            continue
        cmd = ([MPIRUN, '-np', str(n), '--oversubscribe'] if n > 1 else []) + \
            [f'./{prog}', '--init', 'init.st', '--save', f'final-{label}.st', '--metrics', f'm-{label}.jsonl', '--quiet']
        try:
            r = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, env=env, timeout=120)
        except subprocess.TimeoutExpired:
            ok = False
            print(f'  {label}: FAILED: {" ".join(cmd)} hung (killed after 120 s)')
            continue
        if r.returncode:
            ok = False
            print(f'  {label}: FAILED: {" ".join(cmd)} (exit {r.returncode})\n{r.stdout}{r.stderr}')
            continue
        rec = [json.loads(l) for l in open(f'{wd}/m-{label}.jsonl') if l.strip()][0]
        fin = st_read(f'{wd}/final-{label}.st')
        if name in LOWERED_DIFFERS and lowered:  # it built and ran; its numbers are another model's
            print(f'  {label} ({" ".join(fields)}): ran, not compared: {BATCH_COUPLED[name]}, and dp with tp, pp '
                  'or ZeRO (the SPMD lowering) reduces over the whole batch where plain dp reduces per rank')
            continue
        rel = abs(rec['loss'] - ref_loss) / abs(ref_loss)
        bad = [] if rel <= 1e-5 else [f'loss {rec["loss"]:.7g} vs {ref_loss:.7g} (rel {rel:.2e})']
        worst = 0
        for k in init:
            g1 = init[k].astype(np.float64) - ref_final[k]
            if k not in fin:
                bad.append(f'{k} not saved'); continue
            g = init[k].astype(np.float64) - fin[k]
            err = np.abs(g - g1).max() / (1e-3 + np.abs(g1).max())
            worst = max(worst, err)
            if err > 1e-4:
                bad.append(f'gradient {k}: {err:.2e} of max|g| {np.abs(g1).max():.3e}: {g.ravel()[:4]} vs {g1.ravel()[:4]}')
        ok = ok and not bad
        print(f'  {label} ({" ".join(fields)}){vs}: ' + ('MISMATCH: ' + '; '.join(bad) if bad else
                                                    f'ok (worst gradient error {worst:.1e}, {time.time() - t0:.1f} s)'))
    return ok


def run(cmds, wd, name):
    for cmd in cmds:
        r = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, shell=isinstance(cmd, str))
        if r.returncode:
            print(f'FAILED: {name}: {cmd if isinstance(cmd, str) else " ".join(cmd)} (exit {r.returncode})\n{r.stdout}{r.stderr}')
            return False
    return True


def main(cplanc, name, tmp):
    data_fn, f = MODELS[name]
    wd = os.path.join(tmp, name)
    os.makedirs(wd)
    shutil.copy(os.path.join(HERE, 'user_models', name + '.cplan'), wd)
    data = data_fn()
    st_write(f'{wd}/data.safetensors', data)
    if not run([[cplanc, 'build', f'{name}.cplan', '-o', 'prog'],
                ['./prog', '--save-init', 'init.st', '--save', 'final.st', '--metrics', 'm.jsonl', '--quiet']], wd, name):
        return False
    if EMU:
        with open(f'{wd}/{name}.cplan', 'a') as fh:
            fh.write('\nmesh gpu1 {\n  shape  = [gpu = 1]\n  device = h100_sxm\n}\n')
        env = {}
        for line in open(os.path.join(EMU, 'tests', 'cuda_emu', 'program.env')):
            k, _, v = line.strip().partition('=')
            if k: env[k] = v.strip("'")
        if not run([[cplanc, 'build', f'{name}.cplan', '-o', 'prog-real', '--set', 'train.mesh=gpu1', '--set',
                     f'train.precision={EMU_PREC}', '--keep-c', 'keep'] +
                    (['--set', f'train.strategy.micro={EMU_MICRO[name]}'] if name in EMU_MICRO else []),
                    f"{env['EMU_CC']} {env['EMU_CFLAGS']} keep/plan.c -o prog-emu {env['EMU_LIBS']}",
                    ['./prog-emu', '--init', 'init.st', '--save', 'final_emu.st', '--metrics', 'm_emu.jsonl', '--quiet']], wd, name):
            return False
    out = '_emu' if EMU else ''
    init, final = st_read(f'{wd}/init.st'), st_read(f'{wd}/final{out}.st')
    rec = [json.loads(l) for l in open(f'{wd}/m{out}.jsonl') if l.strip()][0]
    p = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in init.items()}
    d = {k: torch.tensor(v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in data.items()}
    loss = f(p, d)
    loss.backward()
    rel = abs(rec['loss'] - loss.item()) / abs(loss.item())
    ok = rel <= TOL[0]
    print(f'{name}{" (emulated CUDA, " + EMU_PREC + ")" if EMU else ""}: loss cplan {rec["loss"]:.7g} torch {loss.item():.7g} rel {rel:.2e}{"" if ok else "  MISMATCH"}')
    worst = 0
    for k in init:
        g_c = init[k].astype(np.float64) - final[k]
        g_t = p[k].grad.numpy() if p[k].grad is not None else np.zeros_like(g_c)
        err = np.abs(g_c - g_t).max() / (1e-3 + np.abs(g_t).max())
        worst = max(worst, err)
        if err > GRAD_TOL.get(name, TOL[1]):
            ok = False
            print(f'  GRADIENT MISMATCH {k}: {err:.2e} of max|g| {np.abs(g_t).max():.3e}: cplan {g_c.ravel()[:4]} torch {g_t.ravel()[:4]}')
    print(f'  worst gradient error {worst:.2e}')
    if DIST and not EMU:
        ok = dist(cplanc, name, wd, (init, final, rec['loss'])) and ok
    return ok


if __name__ == '__main__':
    if len(sys.argv) < 2:
        raise SystemExit('usage: user_models.py CPLANC [MODEL...]')
    cplanc = os.path.abspath(sys.argv[1])
    if DIST and not MPIRUN:
        print('skipped: no mpirun (CPLAN_DIST)')
        sys.exit(77)
    names = sys.argv[2:] or list(MODELS)
    tmp = tempfile.mkdtemp(prefix='cplan_user_models.')
    try:
        bad = [n for n in names if not main(cplanc, n, tmp)]
    finally:
        if os.environ.get('CPLAN_KEEP') == '1': print('keeping', tmp)
        else: shutil.rmtree(tmp)
    print('FAILED: ' + ', '.join(bad) if bad else 'ok')
    sys.exit(1 if bad else 0)
