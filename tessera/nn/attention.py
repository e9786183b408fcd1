"""Multi-head attention (with an optional causal mask and rotary position embedding), a pre-norm
Transformer block, and the seeds' KVCache for incremental decoding."""
from __future__ import annotations

import numpy as np

from .. import op
from ..errors import ArgumentError
from .layers import MLP, LayerNorm, Linear, Module, RMSNorm, _shape, dropout


# ---- rotary position embedding -------------------------------------------------------------------
def rope_tables(seq: int, dim: int, base: float = 10000.0, offset: int = 0, dtype=np.float32):
    """(cos [S, 1, dim/2], signed sin [S, 2, dim/2]) for ``rope``: angle[p, i] = (offset + p) *
    base**(-2i/dim), computed in float64 and rounded once."""
    inv = base ** (-np.arange(0, dim // 2, dtype=np.float64) * 2.0 / dim)
    ang = (offset + np.arange(seq, dtype=np.float64))[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    return cos.astype(dtype), np.concatenate([-sin, sin], axis=1).astype(dtype)


def rope(x, base: float = 10000.0, offset: int = 0, tables=None):
    """Rotary position embedding over x [..., S, D] (D even), position p = offset + row.

    The "rotate-half" convention (GPT-NeoX, LLaMA as most code writes it): feature i pairs with
    i + D/2, and the pair turns by the angle (offset + p) * base**(-2i/D):
        out[..., :h] = x1 cos - x2 sin,   out[..., h:] = x2 cos + x1 sin   (h = D/2).
    Written without a concat: x viewed as [..., S, 2, h], its halves swapped by a reversed slice
    (a view), so ``x * cos + swapped * (-sin, +sin)`` is one pointwise kernel.

    ``tables``: ``rope_tables``'s (cos, signed sin) given as arguments instead of made here, so a
    compiled decoding step serves every position (KVCache.rope_tables); base and offset are
    then theirs."""
    shape = _shape(x)
    s, d = shape[-2], shape[-1]
    if not isinstance(d, int) or d % 2:
        raise ArgumentError(f"rope needs an even feature size, not {d}")
    if tables is None:
        cos, ssin = rope_tables(s, d, base, offset, np.dtype(getattr(x.dtype, "np", x.dtype)))
    else:
        cos, ssin = tables
        if tuple(_shape(cos)) != (s, 1, d // 2) or tuple(_shape(ssin)) != (s, 2, d // 2):
            raise ArgumentError(f"rope tables for {s} positions of {d} features are shaped "
                                f"{[s, 1, d // 2]} and {[s, 2, d // 2]}, not "
                                f"{list(_shape(cos))} and {list(_shape(ssin))}",
                                hint="make them with rope_tables(S, D, offset=...)")
    x2 = op.reshape(x, list(shape[:-1]) + [2, d // 2])
    swapped = x2[..., ::-1, :]
    return op.reshape(x2 * cos + swapped * ssin, list(shape))


class RoPE(Module):
    """Rotary position embedding as a module without parameters: ``RoPE()(params, x)``."""

    def __init__(self, base: float = 10000.0):
        self.base = float(base)

    def __call__(self, params, x, offset: int = 0, **kw):
        return rope(x, self.base, offset)


# ---- multi-head attention ------------------------------------------------------------------------
class MultiHeadAttention(Module):
    """softmax(q k^T / sqrt(d_head) [+ mask] [causal]) v per head, then an output projection.

    params {"q", "k", "v", "o"}: Linear params ([dim, dim] weights, PyTorch's init). x is
    [..., S, dim]; ``context`` (cross-attention, keys and values from it) is [..., Sk, dim].
    Heads are split with a reshape and a transpose, attention is ``op.attention`` (one fused
    flash-attention kernel), ``rope=True`` rotates q and k (``rope``) before it."""

    def __init__(self, dim: int, num_heads: int, causal: bool = False, rope: bool = False,
                 rope_base: float = 10000.0, bias: bool = True, dtype=np.float32):
        if dim % num_heads:
            raise ArgumentError(f"dim {dim} does not split into {num_heads} heads")
        self.dim, self.num_heads, self.causal, self.rope, self.rope_base = \
            int(dim), int(num_heads), bool(causal), bool(rope), float(rope_base)
        self.head_dim = self.dim // self.num_heads
        if self.rope and self.head_dim % 2:
            raise ArgumentError(f"rope needs an even head size, not {self.head_dim}")
        self.proj = {n: Linear(dim, dim, bias, dtype) for n in "qkvo"}

    def init_params(self, key):
        return {n: m.init_params(key.child(n)) for n, m in self.proj.items()}

    def _heads(self, t):
        """[..., S, dim] -> [..., H, S, dh]."""
        shape = _shape(t)
        t = op.reshape(t, list(shape[:-1]) + [self.num_heads, self.head_dim])
        r = len(shape) + 1
        return op.permute(t, list(range(r - 3)) + [r - 2, r - 3, r - 1])

    def _merge(self, params, o):
        """[..., H, S, dh] -> the output projection of [..., S, dim]."""
        r = len(_shape(o))
        o = op.permute(o, list(range(r - 3)) + [r - 2, r - 3, r - 1])   # [..., S, H, dh]
        o = op.reshape(o, list(_shape(o)[:-2]) + [self.dim])
        return self.proj["o"](params["o"], o)

    def __call__(self, params, x, context=None, mask=None, causal=None, rope_offset: int = 0,
                 **kw):
        kv = x if context is None else context
        q, k, v = (self._heads(self.proj[n](params[n], t)) for n, t in (("q", x), ("k", kv),
                                                                         ("v", kv)))
        if self.rope:
            q = rope(q, self.rope_base, rope_offset)
            k = rope(k, self.rope_base, rope_offset)
        o = op.attention(q, k, v, mask=mask, causal=self.causal if causal is None else causal)
        return self._merge(params, o)

    def decode(self, params, x, cache_k, cache_v, mask, tables=None):
        """Incremental decoding: attention of T new positions x [B, T, dim] to a KVCache's
        buffers and to themselves, without recomputing the prefix. cache_k, cache_v: the
        cache's buffers [B, H, S_max, dh] (``cache.k``, ``cache.v``); mask: ``cache.mask(T)``;
        tables: ``cache.rope_tables(T)`` when the layer rotates (rope=True). The shapes do not
        depend on the position, so one compiled step serves all of them.
        Returns (out [B, T, dim], k, v): k and v [B, H, T, dh] for ``cache.append``."""
        q, k, v = (self._heads(self.proj[n](params[n], x)) for n in "qkv")
        if self.rope:
            if tables is None:
                raise ArgumentError("decode of a rotary attention layer needs the rope tables "
                                    "of the new positions", hint="tables=cache.rope_tables(T)")
            q, k = rope(q, tables=tables), rope(k, tables=tables)
        o = op.attention(q, op.concat([cache_k, k], axis=-2), op.concat([cache_v, v], axis=-2),
                         mask=mask)
        return self._merge(params, o), k, v


class TransformerBlock(Module):
    """A pre-norm Transformer block:
        x = x + dropout(attn(norm1(x)));   x = x + dropout(mlp(norm2(x)))
    with ``norm`` "layernorm" or "rmsnorm", mlp = Linear(dim, hidden) -> activation (gelu) ->
    Linear(hidden, dim), hidden = mlp_ratio * dim. params {"norm1", "attn", "norm2", "mlp"}."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, norm: str = "layernorm",
                 causal: bool = False, rope: bool = False, dropout: float = 0.0,
                 activation="gelu", eps: float | None = None, dtype=np.float32):
        norms = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}
        if norm not in norms:
            raise ArgumentError(f"unknown norm {norm!r}", expected="layernorm or rmsnorm")
        kw = {} if eps is None else {"eps": eps}
        self.dim, self.norm, self.dropout = int(dim), norm, float(dropout)
        self.norm1 = norms[norm](dim, dtype=dtype, **kw)
        self.norm2 = norms[norm](dim, dtype=dtype, **kw)
        self.attn = MultiHeadAttention(dim, num_heads, causal=causal, rope=rope, dtype=dtype)
        self.mlp = MLP([dim, int(mlp_ratio * dim), dim], activation=activation, dtype=dtype)
        self.streams = 2 if self.dropout > 0 else 0

    def init_params(self, key):
        return {n: getattr(self, n).init_params(key.child(n))
                for n in ("norm1", "attn", "norm2", "mlp")}

    def __call__(self, params, x, mask=None, seed=None, train=None, stream=0, **kw):
        h = self.attn(params["attn"], self.norm1(params["norm1"], x), mask=mask)
        x = x + dropout(h, self.dropout, seed, train, stream)
        h = self.mlp(params["mlp"], self.norm2(params["norm2"], x))
        return x + dropout(h, self.dropout, seed, train, stream + 1)

    def decode(self, params, x, cache_k, cache_v, mask, tables=None):
        """The block over T new positions x [B, T, dim] given its layer's KVCache (see
        MultiHeadAttention.decode; no dropout: decoding is inference). Returns (x, k, v)."""
        h, k, v = self.attn.decode(params["attn"], self.norm1(params["norm1"], x), cache_k,
                                   cache_v, mask, tables)
        x = x + h
        return x + self.mlp(params["mlp"], self.norm2(params["norm2"], x)), k, v


# ---- the KV cache --------------------------------------------------------------------------------
class KVCache:
    """The seeds' KVCache: one attention layer's keys and values of the positions decoded so
    far, shape ("B", "H", "S_max", "D_h"), so that each new token attends to its prefix without
    recomputing it.

    The buffers keep their shape whatever the length (unused slots hidden by ``mask``), so one
    compiled decoding step serves every position:

        caches = [nn.KVCache(B, heads, max_len, head_dim) for _ in blocks]
        x, k, v = block.decode(p, x_new, c.k, c.v, c.mask(T), c.rope_tables(T))  # compiled
        c.append(k, v)                                                           # on the host

    ``append`` writes in place (the seeds' append effect) and refuses to run past ``max_len``;
    ``keys`` and ``values`` are views of the filled part."""

    def __init__(self, batch: int, heads: int, max_len: int, head_dim: int,
                 dtype=np.float32, rope_base: float = 10000.0):
        dims = {"batch": batch, "heads": heads, "max_len": max_len, "head_dim": head_dim}
        for name, n in dims.items():
            if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
                raise ArgumentError(f"KVCache {name} must be a positive integer, not {n!r}")
        self.shape = (int(batch), int(heads), int(max_len), int(head_dim))
        self.dtype = np.dtype(getattr(dtype, "np", dtype))
        self.rope_base = float(rope_base)
        self.k = np.zeros(self.shape, self.dtype)
        self.v = np.zeros(self.shape, self.dtype)
        self.length = 0

    def __repr__(self):
        b, h, s, d = self.shape
        return f"KVCache(B={b}, H={h}, S_max={s}, D_h={d}, {self.dtype}, length={self.length})"

    @property
    def max_len(self) -> int:
        return self.shape[2]

    @property
    def keys(self) -> np.ndarray:
        return self.k[:, :, :self.length]

    @property
    def values(self) -> np.ndarray:
        return self.v[:, :, :self.length]

    def append(self, k, v) -> None:
        """Write the keys and values [B, H, T, D_h] of T new positions after the filled ones."""
        k, v = np.asarray(k), np.asarray(v)
        b, h, _, d = self.shape
        for name, t in (("keys", k), ("values", v)):
            if t.ndim != 4 or t.shape[:2] != (b, h) or t.shape[3] != d:
                raise ArgumentError(f"KVCache.append: {name} shaped {list(t.shape)}, expected "
                                    f"[{b}, {h}, T, {d}]")
        if k.shape != v.shape:
            raise ArgumentError(f"KVCache.append: keys {list(k.shape)} and values "
                                f"{list(v.shape)} differ")
        t = k.shape[2]
        if self.length + t > self.max_len:
            raise ArgumentError(f"KVCache is full: {self.length} positions held, {t} more do "
                                f"not fit in max_len={self.max_len}",
                                hint="make the cache longer, or reset() it")
        self.k[:, :, self.length:self.length + t] = k
        self.v[:, :, self.length:self.length + t] = v
        self.length += t

    def reset(self) -> None:
        """Forget every position (the buffers are kept)."""
        self.length = 0

    def mask(self, new: int = 1) -> np.ndarray:
        """The additive mask [new, S_max + new] of ``new`` positions attending to the buffers
        followed by their own keys: filled slots visible, empty ones -inf, the new ones causal."""
        m = np.full((new, self.max_len + new), -np.inf, np.float32)
        m[:, :self.length] = 0
        m[:, self.max_len:] = np.triu(np.full((new, new), -np.inf, np.float32), 1)
        return m

    def rope_tables(self, new: int = 1):
        """``rope_tables`` for the next ``new`` positions (from ``length`` on)."""
        return rope_tables(new, self.shape[3], self.rope_base, self.length, self.dtype)
