"""Multi-head attention (with an optional causal mask and rotary position embedding) and a
pre-norm Transformer block."""
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


def rope(x, base: float = 10000.0, offset: int = 0):
    """Rotary position embedding over x [..., S, D] (D even), position p = offset + row.

    The "rotate-half" convention (GPT-NeoX, LLaMA as most code writes it): feature i pairs with
    i + D/2, and the pair turns by the angle (offset + p) * base**(-2i/D):
        out[..., :h] = x1 cos - x2 sin,   out[..., h:] = x2 cos + x1 sin   (h = D/2).
    Written without a concat: x viewed as [..., S, 2, h], its halves swapped by a reversed slice
    (a view), so ``x * cos + swapped * (-sin, +sin)`` is one pointwise kernel."""
    shape = _shape(x)
    s, d = shape[-2], shape[-1]
    if not isinstance(d, int) or d % 2:
        raise ArgumentError(f"rope needs an even feature size, not {d}")
    cos, ssin = rope_tables(s, d, base, offset, np.dtype(getattr(x.dtype, "np", x.dtype)))
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

    def __call__(self, params, x, context=None, mask=None, causal=None, rope_offset: int = 0,
                 **kw):
        kv = x if context is None else context
        q, k, v = (self._heads(self.proj[n](params[n], t)) for n, t in (("q", x), ("k", kv),
                                                                         ("v", kv)))
        if self.rope:
            q = rope(q, self.rope_base, rope_offset)
            k = rope(k, self.rope_base, rope_offset)
        o = op.attention(q, k, v, mask=mask, causal=self.causal if causal is None else causal)
        r = len(_shape(o))
        o = op.permute(o, list(range(r - 3)) + [r - 2, r - 3, r - 1])   # [..., S, H, dh]
        o = op.reshape(o, list(_shape(o)[:-2]) + [self.dim])
        return self.proj["o"](params["o"], o)


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
