"""tessera.nn: every layer and loss against NumPy written independently here, compiled (inside a
tessera function) and eagerly; deterministic init; dropout masks."""
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tessera as ts
import tessera.nn as nn
from tessera import op
from tessera.errors import ArgumentError
from tessera.pytree import leaves as tree_leaves

from conftest import assert_close


def both(fn, *trees):
    """fn's result compiled and eagerly."""
    return ts.function(fn)(*trees), fn(*trees)


def close(got, want, scale=20):
    assert_close(np.asarray(got), np.asarray(want, dtype=np.asarray(got).dtype), scale=scale)


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- NumPy references (float64) ---------------------------------------------------------------
def np_layernorm(x, w=None, b=None, eps=1e-5):
    x = x.astype(np.float64)
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def np_rmsnorm(x, w, eps=1e-6):
    x = x.astype(np.float64)
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w


def np_gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def np_softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_rope(x, base=10000.0, offset=0):
    """Rotate-half RoPE via complex numbers: feature pair (i, i + D/2) is the complex number
    x_i + j x_{i+D/2}, multiplied by exp(j (offset + p) base^(-2i/D))."""
    d = x.shape[-1]
    h = d // 2
    z = x[..., :h].astype(np.float64) + 1j * x[..., h:].astype(np.float64)
    p = offset + np.arange(x.shape[-2])
    theta = p[:, None] * base ** (-2.0 * np.arange(h) / d)[None, :]
    r = z * np.exp(1j * theta)
    return np.concatenate([r.real, r.imag], axis=-1)


def np_mha(params, x, heads, causal=False, rope=False, context=None, mask=None):
    kv = x if context is None else context

    def lin(p, t):
        return t.astype(np.float64) @ p["w"] + p["b"]
    q, k, v = lin(params["q"], x), lin(params["k"], kv), lin(params["v"], kv)
    *lead, s, d = q.shape
    sk = k.shape[-2]
    dh = d // heads
    out = np.zeros(q.shape)
    for h in range(heads):
        sl = slice(h * dh, (h + 1) * dh)
        qh, kh, vh = q[..., sl], k[..., sl], v[..., sl]
        if rope:
            qh, kh = np_rope(qh), np_rope(kh)
        sc = qh @ np.swapaxes(kh, -1, -2) / math.sqrt(dh)
        if mask is not None:
            sc = sc + mask
        if causal:
            sc = np.where(np.arange(sk)[None, :] <= np.arange(s)[:, None] + sk - s, sc, -np.inf)
        out[..., sl] = np_softmax(sc) @ vh
    return lin(params["o"], out)


def np_mlp(params, x, act):
    h = x.astype(np.float64)
    layers = params["layers"]
    for i, p in enumerate(layers):
        h = h @ p["w"] + p["b"]
        if i < len(layers) - 1:
            h = act(h)
    return h


# ---- init --------------------------------------------------------------------------------------
MODULES = [lambda: nn.Linear(7, 5), lambda: nn.MLP([4, 8, 3]), lambda: nn.Embedding(10, 6),
           lambda: nn.LayerNorm(6), lambda: nn.RMSNorm(6), lambda: nn.MultiHeadAttention(8, 2),
           lambda: nn.TransformerBlock(8, 2, norm="rmsnorm", rope=True)]


@pytest.mark.parametrize("make", MODULES)
def test_init_is_deterministic_in_the_seed(make):
    a, b, c = make().init(3), make().init(3), make().init(4)
    la, lb, lc = tree_leaves(a), tree_leaves(b), tree_leaves(c)
    assert la and all(x.dtype == np.float32 for x in la)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(la, lb))
    random_leaves = [(x, z) for x, z in zip(la, lc) if np.unique(x).size > 1]
    if isinstance(make(), (nn.LayerNorm, nn.RMSNorm)):
        assert not random_leaves                        # ones and zeros
    else:
        assert random_leaves and all(not np.array_equal(x, z) for x, z in random_leaves)


def test_init_distributions():
    w = nn.Linear(400, 300).init(0)
    bound = 1 / math.sqrt(400)
    for x in (w["w"], w["b"]):
        assert np.abs(x).max() <= bound and np.abs(x).max() > 0.98 * bound
    assert abs(w["w"].std() - bound / math.sqrt(3)) < 0.01 * bound
    assert abs(w["w"].mean()) < 0.01 * bound
    assert not np.array_equal(w["w"][:, :1].ravel()[:300], w["b"])   # separate streams
    e = nn.Embedding(1000, 100).init(1)["table"]
    assert abs(e.mean()) < 0.01 and abs(e.std() - 1) < 0.01
    ln = nn.LayerNorm(5).init(0)
    assert np.array_equal(ln["weight"], np.ones(5)) and np.array_equal(ln["bias"], np.zeros(5))


def test_keys_name_their_streams():
    k = nn.Key(5)
    assert k.child("w").value != k.child("b").value != k.child(0).value
    assert k.child("w").value == nn.Key(5).child("w").value
    # a parameter's values do not depend on which other parameters the module has
    assert np.array_equal(nn.Linear(3, 4).init(9)["w"], nn.Linear(3, 4, bias=False).init(9)["w"])


# ---- layers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5, 7), (1, 7), (2, 3, 7)])
def test_linear(shape, rng):
    lin = nn.Linear(7, 5)
    p = lin.init(int(rng.integers(1 << 30)))
    x = f32(rng, *shape)
    for y in both(lambda p, x: lin(p, x), p, x):
        close(y, x.astype(np.float64) @ p["w"] + p["b"])
    nb = nn.Linear(7, 5, bias=False)
    q = nb.init(0)
    assert set(q) == {"w"}
    close(ts.function(lambda p, x: nb(p, x))(q, x), x.astype(np.float64) @ q["w"])


@pytest.mark.parametrize("act,np_act", [("relu", lambda h: np.maximum(h, 0)), ("gelu", np_gelu),
                                        ("tanh", np.tanh)])
def test_mlp(act, np_act, rng):
    mlp = nn.MLP([6, 16, 9, 4], activation=act)
    p = mlp.init(int(rng.integers(1 << 30)))
    assert [l["w"].shape for l in p["layers"]] == [(6, 16), (16, 9), (9, 4)]
    x = f32(rng, 11, 6)
    for y in both(lambda p, x: mlp(p, x), p, x):
        close(y, np_mlp(p, x, np_act))


def test_sequential(rng):
    seq = nn.Sequential(nn.Linear(5, 8), op.relu, nn.LayerNorm(8), nn.Linear(8, 2))
    p = seq.init(2)
    x = f32(rng, 4, 5)
    l0, _, ln, l1 = p["layers"]
    h = np_layernorm(np.maximum(x.astype(np.float64) @ l0["w"] + l0["b"], 0), ln["weight"],
                     ln["bias"])
    for y in both(lambda p, x: seq(p, x), p, x):
        close(y, h @ l1["w"] + l1["b"])


def test_embedding(rng):
    emb = nn.Embedding(13, 6)
    p = emb.init(1)
    ids = rng.integers(0, 13, size=(4, 5))
    for y in both(lambda p, i: emb(p, i), p, ids):
        assert np.array_equal(y, p["table"][ids])


def test_norms(rng):
    x = f32(rng, 3, 4, 24) * 3 + 1
    ln, rn = nn.LayerNorm(24), nn.RMSNorm(24)
    pl = {"weight": f32(rng, 24), "bias": f32(rng, 24)}
    pr = {"weight": f32(rng, 24)}
    for y in both(lambda p, x: ln(p, x), pl, x):
        close(y, np_layernorm(x, pl["weight"], pl["bias"]))
    for y in both(lambda p, x: rn(p, x), pr, x):
        close(y, np_rmsnorm(x, pr["weight"]))
    bare = nn.LayerNorm(24, affine=False)
    assert bare.init(0) == {}
    close(ts.function(lambda p, x: bare(p, x))({}, x), np_layernorm(x))


# ---- dropout -----------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [0.1, 0.5, 0.8])
def test_dropout_mask_and_scale(rate, rng):
    x = f32(rng, 64, 257) + 5          # no zeros in x: a zero in y means dropped
    seed = int(rng.integers(0, 2**62))
    drop = nn.Dropout(rate)
    f = ts.function(lambda p, x, s: drop(p, x, seed=s, train=True))
    y = f({}, x, np.int64(seed))
    assert y.tobytes() == drop({}, x, seed=seed).tobytes()          # compiled == reference
    assert y.tobytes() == f({}, x, np.int64(seed)).tobytes()        # same mask on every run
    kept = y != 0
    # kept elements are x / (1 - rate) exactly as float32 computes it
    scale = np.float32(1.0 / (1.0 - rate))
    assert np.array_equal(y[kept], x[kept] * scale)
    # the keep fraction is within 6 standard deviations of 1 - rate
    n = x.size
    assert abs(kept.mean() - (1 - rate)) < 6 * math.sqrt(rate * (1 - rate) / n)
    # the mask is the generator's: u >= rate
    u = op.random_uniform(x.shape, seed)
    assert np.array_equal(kept, u >= np.float32(rate))
    # another seed or stream gives another mask
    assert not np.array_equal(kept, f({}, x, np.int64(seed + 1)) != 0)
    assert not np.array_equal(kept, drop({}, x, seed=seed, stream=1) != 0)


def test_dropout_off_and_edge_rates(rng):
    x = f32(rng, 5, 6)
    assert nn.Dropout(0.5)({}, x, seed=1, train=False) is x
    assert nn.Dropout(0.0)({}, x, seed=1) is x
    assert np.array_equal(nn.Dropout(1.0)({}, x, seed=1), np.zeros_like(x))
    assert nn.Dropout(0.5)({}, x) is x               # no seed: inference
    with pytest.raises(ArgumentError):
        nn.Dropout(0.5)({}, x, train=True)           # training needs a seed
    with pytest.raises(ArgumentError):
        nn.Dropout(1.5)


def test_mlp_dropout_sites_use_separate_streams(rng):
    mlp = nn.MLP([8, 32, 32, 2], dropout=0.5)
    p = mlp.init(0)
    x = f32(rng, 16, 8)
    f = ts.function(lambda p, x, s: mlp(p, x, seed=s, train=True))
    y = f(p, x, np.int64(7))
    assert y.tobytes() == f(p, x, np.int64(7)).tobytes()
    close(y, mlp(p, x, seed=7, train=True))
    # by hand: stream i for the dropout after hidden layer i
    h = x
    for i, lp in enumerate(p["layers"]):
        h = h @ lp["w"] + lp["b"]
        if i < 2:
            keep = op.random_uniform(h.shape, 7, offset=i << 40) >= np.float32(0.5)
            h = np.where(keep, np.maximum(h, 0) * np.float32(2.0), 0).astype(np.float32)
    close(y, h)
    close(mlp(p, x), np_mlp(p, x, lambda h: np.maximum(h, 0)))   # eval: no dropout


def test_training_mode_is_a_static_switch_in_the_cache_key(rng):
    """`with ts.training(False):` turns dropout off and flips ts.is_training() at trace time;
    one function keeps both programs and each call runs the one of its mode."""
    x = f32(rng, 32, 48) + 5
    seed = int(rng.integers(0, 2**62))
    drop = nn.Dropout(0.5)

    def step(x, s):
        y = drop({}, x, seed=s)
        return y * 3.0 if ts.is_training() else y - 1.0

    f = ts.function(step)
    assert ts.is_training()
    ts.reset_cache_stats()
    train = f(x, np.int64(seed))
    mask = op.random_uniform(x.shape, seed) >= np.float32(0.5)
    close(train, np.where(mask, x * np.float32(2.0), 0) * np.float32(3.0))
    with ts.training(False):
        assert not ts.is_training()
        close(f(x, np.int64(seed)), x - np.float32(1.0))      # no dropout, the other branch
        close(step(x, seed), x - np.float32(1.0))             # eagerly too
        with ts.training(True):
            assert f(x, np.int64(seed)).tobytes() == train.tobytes()
        assert not ts.is_training()
    assert ts.is_training()
    assert f(x, np.int64(seed)).tobytes() == train.tobytes()
    assert ts.cache_stats()["traces"] == 2          # one trace per mode, then cache hits
    # an explicit train= wins over the mode
    with ts.training(False):
        assert not np.array_equal(drop({}, x, seed=seed, train=True), x)
    with pytest.raises(ArgumentError, match="True or False"):
        with ts.training("no"):
            pass


DROPOUT_PROGRAM = textwrap.dedent("""
    import hashlib, numpy as np, tessera as ts
    import tessera.nn as nn
    x = np.random.default_rng(1).standard_normal((300, 700)).astype(np.float32)
    f = ts.function(lambda x, s: nn.Dropout(0.4)({}, x, seed=s))
    print(hashlib.sha256(f(x, np.int64(SEED)).tobytes()).hexdigest())
""")


def test_dropout_mask_is_the_same_for_every_thread_count(rng):
    seed = int(rng.integers(0, 2**62))

    def run(threads):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        out = subprocess.run([sys.executable, "-c", DROPOUT_PROGRAM.replace("SEED", str(seed))],
                             env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()
    import hashlib
    x = np.random.default_rng(1).standard_normal((300, 700)).astype(np.float32)
    want = hashlib.sha256(nn.Dropout(0.4)({}, x, seed=seed).tobytes()).hexdigest()
    assert run(1) == run(2) == want


# ---- attention ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5, 8), (2, 7, 16), (2, 3, 4, 6)])
def test_rope(shape, rng):
    x = f32(rng, *shape)
    for y in both(lambda x: nn.rope(x), x):
        close(y, np_rope(x))
    close(ts.function(lambda x: nn.RoPE(500.0)({}, x, offset=3))(x), np_rope(x, 500.0, 3))
    # a rotation: the norm of every pair is kept
    y = nn.rope(x)
    h = shape[-1] // 2
    close(y[..., :h] ** 2 + y[..., h:] ** 2, x[..., :h] ** 2 + x[..., h:] ** 2)
    with pytest.raises(ArgumentError):
        nn.rope(f32(rng, 3, 5))


@pytest.mark.parametrize("causal,rope,shape", [(False, False, (2, 9, 16)),
                                               (True, False, (2, 9, 16)),
                                               (True, True, (2, 9, 16)), (True, True, (7, 16))])
def test_multi_head_attention(causal, rope, shape, rng):
    mha = nn.MultiHeadAttention(16, 4, causal=causal, rope=rope)
    p = mha.init(int(rng.integers(1 << 30)))
    x = f32(rng, *shape)
    for y in both(lambda p, x: mha(p, x), p, x):
        close(y, np_mha(p, x, 4, causal=causal, rope=rope), scale=50)


def test_cross_attention_and_mask(rng):
    mha = nn.MultiHeadAttention(12, 3)
    p = mha.init(5)
    x, ctx = f32(rng, 2, 5, 12), f32(rng, 2, 8, 12)
    mask = np.where(rng.random((5, 8)) < 0.3, -np.inf, 0).astype(np.float32)
    mask[:, 0] = 0                                   # every query sees a key
    for y in both(lambda p, x, c, m: mha(p, x, context=c, mask=m), p, x, ctx, mask):
        close(y, np_mha(p, x, 3, context=ctx, mask=mask), scale=50)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_transformer_block(norm, rng):
    blk = nn.TransformerBlock(16, 2, mlp_ratio=2, norm=norm, causal=True, rope=True)
    p = blk.init(int(rng.integers(1 << 30)))
    for leaf in ("weight", "bias"):               # non-trivial affine parameters
        if leaf in p["norm1"]:
            p["norm1"][leaf] = f32(rng, 16)
            p["norm2"][leaf] = f32(rng, 16)
    x = f32(rng, 2, 6, 16)

    def np_norm(q, t):
        return np_layernorm(t, q["weight"], q["bias"]) if norm == "layernorm" else \
            np_rmsnorm(t, q["weight"])
    h = x + np_mha(p["attn"], np_norm(p["norm1"], x), 2, causal=True, rope=True)
    want = h + np_mlp(p["mlp"], np_norm(p["norm2"], h), np_gelu)
    for y in both(lambda p, x: blk(p, x), p, x):
        close(y, want, scale=100)


@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 2, 1]])
def test_kv_cache_decoding_equals_the_full_causal_forward(chunks, rng):
    """Decoding with the seeds' KVCache, a few positions at a time through one compiled step,
    gives each position the output of the whole causal sequence at once: the prefix is read
    from the cache, never recomputed."""
    blk = nn.TransformerBlock(16, 2, mlp_ratio=2, causal=True, rope=True)
    p = blk.init(int(rng.integers(1 << 30)))
    x = f32(rng, 2, sum(chunks), 16)
    full = ts.function(lambda p, x: blk(p, x))(p, x)
    cache = nn.KVCache(2, 2, 10, 8)
    step = ts.function(lambda p, x, k, v, m, t: blk.decode(p, x, k, v, m, t))
    ts.reset_cache_stats()
    at = 0
    for t in chunks:
        y, k, v = step(p, x[:, at:at + t], cache.k, cache.v, cache.mask(t), cache.rope_tables(t))
        close(y, full[:, at:at + t], scale=50)
        cache.append(k, v)
        at += t
    assert ts.cache_stats()["traces"] == len(set(chunks))     # one step per chunk size
    assert cache.length == at and cache.keys.shape == (2, 2, at, 8)
    # the cached keys are the rotated keys of the whole sequence
    kh = np.asarray(blk.attn._heads(blk.attn.proj["k"](p["attn"]["k"],
                                    blk.norm1(p["norm1"], x))))
    close(cache.keys, np_rope(kh), scale=50)
    with pytest.raises(ArgumentError, match="full"):
        cache.append(*(np.zeros((2, 2, 11 - at, 8), np.float32),) * 2)
    with pytest.raises(ArgumentError, match="expected"):
        cache.append(np.zeros((2, 3, 1, 8)), np.zeros((2, 3, 1, 8)))
    with pytest.raises(ArgumentError, match="rope tables"):
        blk.decode(p, x[:, :2], cache.k, cache.v, cache.mask(2), cache.rope_tables(1))
    with pytest.raises(ArgumentError, match="needs the rope tables"):
        blk.decode(p, x[:, :1], cache.k, cache.v, cache.mask(1))


def test_transformer_block_dropout_is_deterministic(rng):
    blk = nn.TransformerBlock(8, 2, dropout=0.2)
    p = blk.init(0)
    x = f32(rng, 2, 4, 8)
    f = ts.function(lambda p, x, s: blk(p, x, seed=s, train=True))
    a = f(p, x, np.int64(3))
    assert a.tobytes() == f(p, x, np.int64(3)).tobytes()
    assert not np.array_equal(a, f(p, x, np.int64(4)))
    close(a, blk(p, x, seed=3, train=True), scale=50)


# ---- losses ------------------------------------------------------------------------------------
def np_log_softmax(z):
    z = z.astype(np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
def test_cross_entropy(smoothing, rng):
    c = 7
    z = f32(rng, 12, c) * 3
    y = rng.integers(0, c, size=12)
    lp = np_log_softmax(z)
    nll = -lp[np.arange(12), y]
    want = ((1 - smoothing) * nll + smoothing * (-lp.mean(-1))).mean()   # PyTorch's definition
    for got in both(lambda z, y: nn.cross_entropy(z, y, label_smoothing=smoothing), z, y):
        assert got.dtype == np.float32
        close(got, want)
    per = nn.cross_entropy(z, y.astype(np.int32), smoothing, reduction="none")
    close(per, (1 - smoothing) * nll + smoothing * (-lp.mean(-1)))


def test_cross_entropy_is_safe_for_huge_logits_and_takes_probabilities(rng):
    z = (f32(rng, 4, 3, 5) * 1e4).astype(np.float32)
    y = rng.integers(0, 5, size=(4, 3))
    for got in both(lambda z, y: nn.cross_entropy(z, y), z, y):
        assert np.isfinite(got)
        close(got, -np_log_softmax(z)[np.arange(4)[:, None], np.arange(3)[None], y].mean(),
              scale=20)
    t = np_softmax(f32(rng, 4, 3, 5).astype(np.float64)).astype(np.float32)
    for got in both(lambda z, t: nn.cross_entropy(z, t), z / 1e4, t):
        close(got, -(t * np_log_softmax(z / 1e4)).sum(-1).mean())


def test_mse_and_kl(rng):
    a, b = f32(rng, 6, 5), f32(rng, 6, 5)
    for got in both(lambda a, b: nn.mse(a, b), a, b):
        close(got, ((a.astype(np.float64) - b) ** 2).mean())
    lp, lq = np_log_softmax(a), np_log_softmax(b)
    want = (np.exp(lp) * (lp - lq)).sum(-1).mean()
    for got in both(lambda a, b: nn.kl_divergence(a, b), a, b):
        close(got, want)
    for got in both(lambda a, b: nn.kl_divergence(a, b, from_logits=False),
                    lp.astype(np.float32), lq.astype(np.float32)):
        close(got, want)
    close(nn.kl_divergence(a, a), 0.0)
    # P with a zero probability: that term is 0, not nan
    with np.errstate(divide="ignore"):
        p0 = np.log(np.array([[0.5, 0.0, 0.5, 0.0]], np.float32))
    q = np.log(np.full((1, 4), 0.25, np.float32))
    close(nn.kl_divergence(p0, q, from_logits=False), np.log(2))


def _moe_by_token(p, x, top_k, capacity):
    """MixtureOfExperts token by token in float64: each group's first choices before its
    second choices, in token order, an expert full after `capacity` tokens."""
    e_count = p["w1"].shape[0]
    out = np.zeros(x.shape)
    silu = lambda v: v / (1 + np.exp(-v))
    dropped = 0
    for g in range(x.shape[0]):
        logits = x[g].astype(np.float64) @ p["router"]["w"]
        order = np.argsort(-logits, axis=-1, kind="stable")[:, :top_k]
        top = np.take_along_axis(logits, order, -1)
        gates = np.exp(top - top.max(-1, keepdims=True))
        gates /= gates.sum(-1, keepdims=True)
        used = np.zeros(e_count, int)
        for j in range(top_k):
            for s in range(x.shape[1]):
                e = order[s, j]
                if used[e] == capacity:
                    dropped += 1
                    continue
                used[e] += 1
                out[g, s] += gates[s, j] * (silu(x[g, s] @ p["w1"][e]) @ p["w2"][e])
    return out, dropped


@pytest.mark.parametrize("top_k,capacity_factor", [(1, 2.0), (2, 1.0), (2, 0.5)])
def test_mixture_of_experts_against_a_token_loop(rng, top_k, capacity_factor):
    """Top-k routing with GPT-OSS's gates (a softmax of the k logits), capacity in token order
    with first choices first, dropped tokens contributing 0; the balancing loss against its
    formula; gradients against finite differences."""
    moe = nn.MixtureOfExperts(16, 24, 4, top_k=top_k, capacity_factor=capacity_factor)
    p = moe.init(int(rng.integers(1 << 30)))
    x = rng.standard_normal((3, 10, 16)).astype(np.float32)
    y, aux = ts.function(lambda p, x: moe(p, x, return_aux=True))(p, x)
    want, dropped = _moe_by_token(p, x, top_k, moe.router.capacity(10))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    if capacity_factor == 0.5:          # per group 20 choices for 4 x 3 slots: 8 dropped
        assert dropped >= 24
    probs = np.exp(x @ p["router"]["w"])
    probs /= probs.sum(-1, keepdims=True)
    f = np.bincount(probs.argmax(-1).ravel(), minlength=4) / 30
    np.testing.assert_allclose(aux, 4 * np.sum(f * probs.mean((0, 1))), rtol=1e-5)

    def loss(w2):
        return op.mean(moe({**p, "w2": w2}, x) ** 2)
    g = ts.grad(loss)(p["w2"])
    d = rng.standard_normal(p["w2"].shape)
    d /= np.linalg.norm(d)
    h = 1e-3
    fd = (float(loss(p["w2"] + h * d.astype(np.float32))) -
          float(loss(p["w2"] - h * d.astype(np.float32)))) / (2 * h)
    np.testing.assert_allclose(np.sum(g * d), fd, rtol=2e-2, atol=1e-6)


def test_mixture_of_experts_refuses_a_flat_input():
    moe = nn.MixtureOfExperts(8, 8, 2)
    with pytest.raises(ts.TesseraError, match="groups, tokens"):
        moe(moe.init(0), np.zeros((5, 8), np.float32))


def test_convolution_layers_match_pytorchs_modules(rng):
    """nn.Conv2d / ConvTranspose2d / BatchNorm2d / GroupNorm / pools / Upsample given the
    parameters of PyTorch's modules compute PyTorch's outputs; their own initialisations have
    PyTorch's bounds and shapes."""
    torch = pytest.importorskip("torch", reason="PyTorch's modules are the reference")
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    tx = torch.from_numpy(x)
    conv = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
    ours = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
    p = {"w": conv.weight.detach().numpy(), "b": conv.bias.detach().numpy()}
    np.testing.assert_allclose(ts.function(lambda x: ours(p, x))(x), conv(tx).detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    mine = ours.init(seed=0)
    bound = 1 / np.sqrt(2 * 9)
    assert mine["w"].shape == (6, 2, 3, 3) and np.abs(mine["w"]).max() <= bound
    assert np.abs(mine["b"]).max() <= bound
    up = torch.nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
    theirs = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
    p = {"w": up.weight.detach().numpy(), "b": up.bias.detach().numpy()}
    assert theirs.init(0)["w"].shape == tuple(up.weight.shape)
    np.testing.assert_allclose(ts.function(lambda x: theirs(p, x))(x), up(tx).detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    bn, tbn = nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)
    params = bn.init(0)
    tbn.train()
    want = tbn(tx).detach().numpy()
    np.testing.assert_allclose(bn(params, x, train=True), want, rtol=1e-4, atol=1e-5)
    params = bn.update(params, x)
    np.testing.assert_allclose(params["running_mean"], tbn.running_mean.numpy(), rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(params["running_var"], tbn.running_var.numpy(), rtol=1e-5)
    tbn.eval()
    with ts.training(False):             # (training mode is the default, as PyTorch's)
        got = ts.function(lambda x: bn(params, x))(x)
    np.testing.assert_allclose(got, tbn(tx).detach().numpy(), rtol=1e-4, atol=1e-5)
    for ours, theirs in [(nn.GroupNorm(2, 4), torch.nn.GroupNorm(2, 4)),
                         (nn.MaxPool2d(3, 2, 1), torch.nn.MaxPool2d(3, 2, 1)),
                         (nn.AvgPool2d(2, ceil_mode=True), torch.nn.AvgPool2d(2, ceil_mode=True)),
                         (nn.AdaptiveAvgPool2d((3, 2)), torch.nn.AdaptiveAvgPool2d((3, 2))),
                         (nn.Upsample(scale_factor=2, mode="bilinear"),
                          torch.nn.Upsample(scale_factor=2, mode="bilinear")),
                         (nn.Upsample(size=(5, 7), mode="nearest"),
                          torch.nn.Upsample(size=(5, 7), mode="nearest"))]:
        np.testing.assert_allclose(ts.function(lambda x: ours(ours.init(0), x))(x),
                                   theirs(tx).detach().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=type(ours).__name__)


def test_dropout2d_drops_whole_channels(rng):
    x = np.ones((4, 16, 5, 5), np.float32)
    y = nn.Dropout2d(0.5)({}, x, seed=3, train=True)
    per_channel = y.reshape(4, 16, -1)
    assert np.all((per_channel == 0).all(-1) | (per_channel == 2).all(-1))
    assert 0 < (per_channel[..., 0] == 0).sum() < 64
    np.testing.assert_array_equal(nn.Dropout2d(0.5)({}, x), x)        # inference: as is
