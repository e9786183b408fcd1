"""The seeds' standard library in tessera.nn (FlashAttention2, FlashDecoding,
SlidingWindowAttention, ALiBi, FusedLinearGeLU/SiLU, SwiGLU, SwitchTransformer, FusedAdamW,
FusedSGD), each against PyTorch, transformers or NumPy on fresh inputs, compiled and eager."""
import numpy as np
import pytest

import tessera as ts
from tessera import nn, op, optim

torch = pytest.importorskip("torch", reason="the references are PyTorch's")
F = torch.nn.functional


def test_every_name_of_the_seeds_standard_library_imports():
    from tessera.nn import (ALiBi, FlashAttention2, FlashDecoding, FusedAdamW,  # noqa: F401
                            FusedLinearGeLU, FusedLinearSiLU, FusedSGD, GroupNorm, LayerNorm,
                            MixtureOfExperts, RMSNorm, RoPE, SlidingWindowAttention,
                            SwitchTransformer, TopKRouter)
    assert FusedAdamW is optim.AdamW and FusedSGD is optim.SGD


def _qkv(rng, sq=6, sk=9, heads=4, d=8):
    return [rng.standard_normal((2, heads, s, d)).astype(np.float32) for s in (sq, sk, sk)]


def _sdpa_and_grads(q, k, v, g, **kw):
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    out = F.scaled_dot_product_attention(tq, tk, tv, **kw)
    (out * torch.from_numpy(g)).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() for t in (tq, tk, tv)]


def _ours_and_grads(layer, q, k, v, g):
    out = ts.function(lambda q, k, v: layer({}, q, k, v))(q, k, v)
    grads = ts.grad(lambda q, k, v, g: op.sum(layer({}, q, k, v) * g), argnums=(0, 1, 2))(
        q, k, v, g)
    return out, grads


def _close(got, want, tol=2e-5):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_flash_attention_2_is_pytorchs_forward_and_backward(rng):
    q, k, v = _qkv(rng, sq=9)
    g = rng.standard_normal(q.shape[:-1] + (8,)).astype(np.float32)
    out, grads = _ours_and_grads(nn.FlashAttention2(causal=True, scale=0.3), q, k, v, g)
    want, want_grads = _sdpa_and_grads(q, k, v, g, is_causal=True, scale=0.3)
    _close(out, want)
    for a, b in zip(grads, want_grads):
        _close(a, b)


@pytest.mark.parametrize("window", [1, 3, 20])
def test_sliding_window_attention_is_pytorchs_with_the_window_as_a_mask(window, rng):
    """Query i (at key position i + Sk - Sq) sees keys j with i - window < j <= i: Mistral's."""
    q, k, v = _qkv(rng)
    g = rng.standard_normal(q.shape).astype(np.float32)
    pos = np.arange(6)[:, None] + 3
    keep = torch.from_numpy((np.arange(9)[None] <= pos) & (np.arange(9)[None] > pos - window))
    out, grads = _ours_and_grads(nn.SlidingWindowAttention(window), q, k, v, g)
    want, want_grads = _sdpa_and_grads(q, k, v, g, attn_mask=keep)
    _close(out, want)
    for a, b in zip(grads, want_grads):
        _close(a, b)


@pytest.mark.parametrize("heads", [8, 12])
def test_alibi_slopes_are_bloom_s_and_alibi_attention_is_its_formula(heads, rng):
    """The slopes against transformers' BLOOM (a non-power-of-two head count too); the layer
    against softmax(q k^T / sqrt(d) + slope * (j - i) + causal) v in float64 NumPy."""
    transformers = pytest.importorskip("transformers", reason="BLOOM's ALiBi is the reference")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    theirs = build_alibi_tensor(torch.ones(1, 2, dtype=torch.int64), heads, torch.float32)
    np.testing.assert_allclose(nn.alibi_slopes(heads), theirs[:, 0, 1].numpy(), rtol=1e-6)
    q, k, v = _qkv(rng, sq=7, sk=7, heads=heads)
    got = ts.function(lambda q, k, v: nn.ALiBi()({}, q, k, v))(q, k, v)
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / np.sqrt(8)
    s = s + nn.alibi_slopes(heads)[:, None, None] * (np.arange(7)[None] - np.arange(7)[:, None])
    s = np.where(np.tril(np.ones((7, 7), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    _close(got, (p / p.sum(-1, keepdims=True)) @ v)


@pytest.mark.parametrize("block", [4, 5, 64])
def test_flash_decoding_is_attention_over_the_cache(block, rng):
    """A partly filled cache (unused slots masked with -inf; a block may be all unused), a
    cache length that is not a multiple of the block; and a query row that sees no key gets 0,
    as op.attention's."""
    q = rng.standard_normal((2, 3, 2, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 3, 19, 8)).astype(np.float32) for _ in range(2))
    mask = np.where(np.arange(19) < 11, 0.0, -np.inf).astype(np.float32)
    mask = np.broadcast_to(mask, (2, 19)).copy()
    mask[1] = -np.inf                                       # the second query sees nothing
    layer = nn.FlashDecoding(block=block)
    got = ts.function(lambda q, k, v, m: layer({}, q, k, v, mask=m))(q, k, v, mask)
    want = ts.function(lambda q, k, v, m: op.attention(q, k, v, mask=m))(q, k, v, mask)
    assert got.dtype == np.float32             # (it was float64: a NumPy scale promoted it)
    _close(got, want)
    assert not np.any(got[:, :, 1])
    _close(layer({}, q, k, v, mask=mask), want)             # eager


def test_fused_linears_and_swiglu_are_pytorchs(rng):
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    for layer, act in ((nn.FusedLinearGeLU(8, 6), F.gelu),
                       (nn.FusedLinearGeLU(8, 6, approximate="tanh"),
                        lambda t: F.gelu(t, approximate="tanh")),
                       (nn.FusedLinearSiLU(8, 6), F.silu)):
        p = layer.init(int(rng.integers(1 << 30)))
        want = act(F.linear(torch.from_numpy(x), torch.from_numpy(p["w"].T.copy()),
                            torch.from_numpy(p["b"]))).numpy()
        _close(ts.function(lambda p, x: layer(p, x))(p, x), want)
    mlp = nn.SwiGLU(8, 12)
    p = mlp.init(3)
    tx = torch.from_numpy(x)
    want = (F.silu(tx @ torch.from_numpy(p["gate"]["w"])) * (tx @ torch.from_numpy(
        p["up"]["w"]))) @ torch.from_numpy(p["down"]["w"])
    _close(ts.function(lambda p, x: mlp(p, x))(p, x), want.numpy())


def test_switch_transformer_routes_each_token_to_one_expert_scaled_by_its_probability(rng):
    """Against a NumPy float64 reading of the layer (capacity large enough that no token is
    dropped): x + attn(norm1 x), then each token through its argmax expert, times that
    expert's router probability."""
    layer = nn.SwitchTransformer(dim=8, num_heads=2, hidden=16, num_experts=4,
                                 capacity_factor=4.0)
    p = layer.init(int(rng.integers(1 << 30)))
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    got, aux = ts.function(lambda p, x: layer(p, x, return_aux=True))(p, x)

    def norm(t, q):
        t = (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + 1e-5)
        return t * q["weight"] + q["bias"]
    a = p["attn"]
    h = norm(x.astype(np.float64), p["norm1"])
    heads = [(h @ a[n]["w"] + a[n]["b"]).reshape(2, 5, 2, 4).transpose(0, 2, 1, 3) for n in "qkv"]
    s = heads[0] @ np.swapaxes(heads[1], -1, -2) / 2.0
    w = np.exp(s - s.max(-1, keepdims=True))
    o = ((w / w.sum(-1, keepdims=True)) @ heads[2]).transpose(0, 2, 1, 3).reshape(2, 5, 8)
    x1 = x + o @ a["o"]["w"] + a["o"]["b"]
    h2 = norm(x1, p["norm2"])
    logits = h2 @ p["moe"]["router"]["w"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    e = probs.argmax(-1)
    w1, w2 = p["moe"]["w1"][e], p["moe"]["w2"][e]             # [G, S, ...] per token
    y = np.einsum("gsh,gshd->gsd", np.maximum(np.einsum("gsd,gsdh->gsh", h2, w1), 0), w2)
    _close(got, x1 + y * probs.max(-1, keepdims=True), 1e-4)
    assert np.isfinite(aux)
