"""Multi-head attention (with an optional causal mask and rotary position embedding), a pre-norm
Transformer block, and the seeds' KVCache for incremental decoding."""
from __future__ import annotations

import math

import numpy as np

from .. import op
from ..trace import dtype_of
from ..errors import ArgumentError
from .layers import MLP, LayerNorm, Linear, Module, RMSNorm, _shape, dropout


# ---- rotary position embedding -------------------------------------------------------------------
_ROPE_SCALING = {"linear": ("factor",),
                 "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings"),
                 "yarn": ("factor", "original_max_position_embeddings")}


def rope_frequencies(dim: int, base: float = 10000.0, scaling: dict | None = None):
    """(inverse frequencies [dim/2] in float64, the factor cos and sin are multiplied by) of a
    rotary embedding over ``dim`` features: base**(-2i/dim), or those stretched for contexts
    longer than the model was trained on by ``scaling`` (transformers' ``rope_parameters``:
    ``{"rope_type": ...}`` with its settings):
      - ``linear``: every frequency divided by ``factor`` (position interpolation);
      - ``llama3``: Llama 3.1's: wavelengths over ``original_max_position_embeddings /
        low_freq_factor`` divided by ``factor``, under ``.../ high_freq_factor`` kept, those
        between blended linearly in the context's count of turns;
      - ``yarn``: each frequency between extrapolated and divided by ``factor`` by a ramp over
        the dimensions that turn ``beta_fast`` .. ``beta_slow`` times in the original context
        (bounds floored and ceiled unless ``truncate`` is false), cos and sin scaled by
        ``attention_factor`` (default 0.1 ln(factor) + 1, or the ratio of that with ``mscale``
        and ``mscale_all_dim``).
    ``dynamic`` and ``longrope`` are refused: their frequencies change with the longest position
    of each call, so a cache's keys would be rotated by tables the next step no longer uses."""
    inv = base ** (-np.arange(0, dim // 2, dtype=np.float64) * 2.0 / dim)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv, 1.0
    if kind not in _ROPE_SCALING:
        why = " (its frequencies follow each call's longest position)" \
            if kind in ("dynamic", "longrope") else ""
        raise ArgumentError(f"a RoPE scaling of type {kind!r} is not supported{why}",
                            expected="default, " + ", ".join(_ROPE_SCALING))
    missing = [k for k in _ROPE_SCALING[kind] if scaling.get(k) is None]
    if missing:
        raise ArgumentError(f"a {kind!r} RoPE scaling needs {', '.join(missing)}")
    if kind == "linear":
        return inv / scaling["factor"], 1.0
    context = scaling["original_max_position_embeddings"]
    if kind == "llama3":
        factor, low, high = (scaling[k] for k in ("factor", "low_freq_factor",
                                                  "high_freq_factor"))
        wavelength = 2 * math.pi / inv
        smooth = (context / wavelength - low) / (high - low)
        blended = (1 - smooth) * inv / factor + smooth * inv
        return np.where(wavelength > context / low, inv / factor,
                        np.where(wavelength < context / high, inv, blended)), 1.0
    factor = scaling["factor"]
    attention = scaling.get("attention_factor")
    if attention is None:
        def mscale(m):
            return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = mscale(m) / mscale(m_all) if m and m_all else mscale(1)

    def turns_dim(turns):          # the dimension whose wavelength fits `turns` in the context
        return dim * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = turns_dim(scaling.get("beta_fast") or 32), turns_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    ramp = np.clip((np.arange(dim // 2) - lo) / ((hi - lo) or 0.001), 0, 1)
    return inv / factor * ramp + inv * (1 - ramp), float(attention)


def rope_tables(seq: int, dim: int, base: float = 10000.0, offset: int = 0, dtype=np.float32,
                positions=None, scaling: dict | None = None):
    """(cos [S, 1, dim/2], signed sin [S, 2, dim/2]) for ``rope``: angle[p, i] = (offset + p) *
    base**(-2i/dim), computed in float64 and rounded once. ``positions`` (an int array [..., S])
    gives each row its own positions instead (a batch decoding sequences of different lengths):
    the tables are then [..., S, 1, dim/2] and [..., S, 2, dim/2]. ``scaling``: a context
    extension's frequencies and factor (``rope_frequencies``)."""
    inv, factor = rope_frequencies(dim, base, scaling)
    pos = (offset + np.arange(seq, dtype=np.float64)) if positions is None else \
        np.asarray(positions, np.float64)
    ang = pos[..., None] * inv
    cos, sin = factor * np.cos(ang)[..., None, :], factor * np.sin(ang)[..., None, :]
    return cos.astype(dtype), np.concatenate([-sin, sin], axis=-2).astype(dtype)


def rope(x, base: float = 10000.0, offset: int = 0, tables=None, scaling: dict | None = None):
    """Rotary position embedding over x [..., S, D] (D even), position p = offset + row.

    The "rotate-half" convention (GPT-NeoX, LLaMA as most code writes it): feature i pairs with
    i + D/2, and the pair turns by the angle (offset + p) * base**(-2i/D):
        out[..., :h] = x1 cos - x2 sin,   out[..., h:] = x2 cos + x1 sin   (h = D/2).
    Written without a concat: x viewed as [..., S, 2, h], its halves swapped by a reversed slice
    (a view), so ``x * cos + swapped * (-sin, +sin)`` is one pointwise kernel.

    ``tables``: ``rope_tables``'s (cos, signed sin) given as arguments instead of made here, so a
    compiled decoding step serves every position (KVCache.rope_tables); base and offset are
    then theirs. Tables with leading axes (``rope_tables(positions=...)``) broadcast against
    x's leading axes: [B, 1, S, 1, D/2] turns every head of row b by that row's positions.
    ``scaling``: a context extension (``rope_frequencies``) for the tables made here."""
    shape = _shape(x)
    s, d = shape[-2], shape[-1]
    if not isinstance(d, int) or d % 2:
        raise ArgumentError(f"rope needs an even feature size, not {d}")
    if tables is None:
        cos, ssin = rope_tables(s, d, base, offset, np.dtype(getattr(x.dtype, "np", x.dtype)),
                                scaling=scaling)
    else:
        cos, ssin = tables
        if tuple(_shape(cos)[-3:]) != (s, 1, d // 2) or \
                tuple(_shape(ssin)[-3:]) != (s, 2, d // 2):
            raise ArgumentError(f"rope tables for {s} positions of {d} features are shaped "
                                f"{[s, 1, d // 2]} and {[s, 2, d // 2]}, not "
                                f"{list(_shape(cos))} and {list(_shape(ssin))}",
                                hint="make them with rope_tables(S, D, offset=...)")
    x2 = op.reshape(x, list(shape[:-1]) + [2, d // 2])
    swapped = x2[..., ::-1, :]
    return op.reshape(x2 * cos + swapped * ssin, list(shape))


class RoPE(Module):
    """Rotary position embedding as a module without parameters: ``RoPE()(params, x)``;
    ``scaling`` stretches it past a trained context (``rope_frequencies``)."""

    def __init__(self, base: float = 10000.0, scaling: dict | None = None):
        self.base, self.scaling = float(base), scaling
        rope_frequencies(2, self.base, scaling)            # (a bad scaling refused here)

    def __call__(self, params, x, offset: int = 0, **kw):
        return rope(x, self.base, offset, scaling=self.scaling)


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


# ---- the seeds' attention variants ---------------------------------------------------------------
def sliding_window_mask(sq: int, sk: int, window: int, dtype=np.float32) -> np.ndarray:
    """The additive mask [sq, sk] of causal attention within a window (Mistral's): query i,
    at position i + sk - sq of the keys, sees the ``window`` keys ending at its own."""
    if window < 1:
        raise ArgumentError(f"a sliding window holds at least one key, not {window}")
    pos = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    return np.where((j <= pos) & (j > pos - window), 0.0, -np.inf).astype(dtype)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi's per-head slopes (Press et al.): 2^(-8 h / n) for n a power of two; otherwise
    those of the power of two below, then every other slope of the power above (BLOOM's and
    transformers' rule)."""
    def powers(n):
        start = 2.0 ** (-8.0 / n)
        return start ** np.arange(1, n + 1)
    low = 2 ** int(np.floor(np.log2(num_heads)))
    slopes = powers(low)
    if low < num_heads:
        slopes = np.concatenate([slopes, powers(2 * low)[0::2][:num_heads - low]])
    return slopes


def alibi_bias(num_heads: int, sq: int, sk: int, dtype=np.float32) -> np.ndarray:
    """The additive bias [H, sq, sk]: -slope_h * (distance from query i's position back to
    key j); keys ahead of the query get a positive bias, for a causal mask to hide."""
    pos = np.arange(sq)[:, None] + (sk - sq)
    dist = np.arange(sk)[None, :] - pos
    return (alibi_slopes(num_heads)[:, None, None] * dist[None]).astype(dtype)


def grouped_query_attention(q, k, v, mask=None, causal=False, scale=None):
    """``op.attention`` with fewer key/value heads than query heads (grouped-query attention:
    q [B, H, Sq, D], k and v [B, KV, Sk, D], KV dividing H, each key/value head serving H/KV
    consecutive query heads). The query heads are viewed as [B, KV, H/KV, Sq, D] against keys
    broadcast over the group, so no key or value is copied per query head. ``mask`` broadcasts
    to [B, 1 or H, Sq, Sk]."""
    b, h, sq, d = _shape(q)
    kv = _shape(k)[-3]
    if kv == h:
        return op.attention(q, k, v, mask=mask, causal=causal, scale=scale)
    if h % kv:
        raise ArgumentError(f"{h} query heads do not share {kv} key/value heads evenly")
    g = h // kv
    if mask is not None:
        shape = list(_shape(mask))
        shape = [1] * (4 - len(shape)) + shape
        mask = op.reshape(mask, shape[:1] + ([kv, g] if shape[1] == h else [1, 1]) + shape[2:])
    out = op.attention(op.reshape(q, [b, kv, g, sq, d]), op.expand_dims(k, 2),
                       op.expand_dims(v, 2), mask=mask, causal=causal, scale=scale)
    return op.reshape(out, [b, h, sq, _shape(v)[-1]])


class FlashAttention2(Module):
    """The seeds' FlashAttention2: softmax(scale q k^T + mask) v as one fused flash-attention
    kernel forward and backward (``op.attention``: online softmax over key blocks, no [Sq, Sk]
    matrix in memory). No parameters. q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv];
    ``causal`` aligns the last query with the last key; ``window`` keeps only the last
    ``window`` keys of each query (causal); ``alibi`` adds ALiBi's linear biases (q's heads on
    axis -3). A query that sees no key gets 0."""

    def __init__(self, causal: bool = False, scale: float | None = None,
                 window: int | None = None, alibi: bool = False):
        self.causal, self.scale = bool(causal), scale
        self.window, self.alibi = (None if window is None else int(window)), bool(alibi)
        if self.window is not None and self.window < 1:
            raise ArgumentError(f"a sliding window holds at least one key, not {window}")

    def bias(self, q, k):
        """The additive mask this layer adds for q and k's shapes (None when none)."""
        sq, sk = _shape(q)[-2], _shape(k)[-2]
        bias = None
        if self.window is not None:
            bias = sliding_window_mask(sq, sk, self.window)
        if self.alibi:
            if len(_shape(q)) < 3:
                raise ArgumentError("ALiBi needs q's heads on axis -3",
                                    received=f"q of shape {tuple(_shape(q))}")
            a = alibi_bias(_shape(q)[-3], sq, sk)
            bias = a if bias is None else a + bias
        return bias

    def __call__(self, params, q, k, v, mask=None, **kw):
        bias = self.bias(q, k)
        if mask is not None:
            bias = mask if bias is None else mask + bias
        causal = self.causal and self.window is None      # (a window is causal already)
        return op.attention(q, k, v, mask=bias, causal=causal, scale=self.scale)


class SlidingWindowAttention(FlashAttention2):
    """The seeds' SlidingWindowAttention (Mistral's): causal attention in which each query sees
    only the ``window`` most recent keys, its own included."""

    def __init__(self, window: int, scale: float | None = None, alibi: bool = False):
        super().__init__(causal=True, scale=scale, window=window, alibi=alibi)


class ALiBi(FlashAttention2):
    """The seeds' ALiBi: attention with linear biases instead of position embeddings, causal by
    default (as BLOOM and MPT use it)."""

    def __init__(self, causal: bool = True, scale: float | None = None):
        super().__init__(causal=causal, scale=scale, alibi=True)


def flash_decoding(q, k, v, mask=None, block: int = 256, scale: float | None = None):
    """The seeds' FlashDecoding: a few queries q [..., T, D] against a long KV cache k, v
    [..., S, D]. The cache is split into blocks of ``block`` keys; each block's attention is
    computed on its own (its own maximum, sum and weighted values), then the blocks are
    combined by rescaling to the overall maximum and summing across blocks in one reduction. The
    blocks are fixed by ``block`` alone, so the bits do not depend on how many threads take
    them. ``mask`` is additive and broadcasts to [..., T, S] (e.g. -inf on unused cache slots).
    A query that sees no key gets 0."""
    shape_k, shape_q = _shape(k), _shape(q)
    s, d, t = shape_k[-2], shape_q[-1], shape_q[-2]
    # (a Python float: a NumPy float64 scalar would promote the whole computation)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    nb = -(-s // block)
    pad = nb * block - s
    lead = list(shape_k[:-2])
    rank = len(shape_k)
    scores = op.matmul(q, op.transpose(k, list(range(rank - 2)) + [rank - 1, rank - 2])) * scale
    if mask is not None:
        scores = scores + mask
    if pad:                         # the last block filled with keys nobody sees
        d_s, d_v = (dtype_of(x).np for x in (scores, v))
        scores = op.concat([scores, op.broadcast_to(np.asarray(-np.inf, d_s),
                                                    [*_shape(scores)[:-1], pad])], axis=-1)
        v = op.concat([v, op.broadcast_to(np.zeros((), d_v), lead + [pad, _shape(v)[-1]])],
                      axis=-2)
    lead_q = list(_shape(scores)[:-2])
    blocks = op.reshape(scores, lead_q + [t, nb, block])                 # [..., T, nb, blk]
    m = op.max(blocks, axis=-1, keepdim=True)                            # each block's max
    m_safe = op.where(m == -np.inf, 0.0, m)
    p = op.exp(blocks - m_safe)
    l_b = op.sum(p, axis=-1)                                             # [..., T, nb]
    vb = op.reshape(v, lead + [nb, block, _shape(v)[-1]])                # [..., nb, blk, Dv]
    pb = op.transpose(p, list(range(len(lead_q))) + [len(lead_q) + 1, len(lead_q),
                                                     len(lead_q) + 2])   # [..., nb, T, blk]
    o_b = op.matmul(pb, vb)                                              # [..., nb, T, Dv]
    m_b = op.squeeze(m, axis=-1)                                         # [..., T, nb]
    top = op.max(m_b, axis=-1, keepdim=True)
    w = op.where(m_b == -np.inf, 0.0, op.exp(m_b - op.where(top == -np.inf, 0.0, top)))
    total = op.sum(w * l_b, axis=-1, keepdim=True)                       # [..., T, 1]
    w_t = op.expand_dims(op.transpose(w, list(range(len(lead_q))) + [len(lead_q) + 1,
                                                                     len(lead_q)]), -1)
    out = op.sum(w_t * o_b, axis=-3)                                     # [..., T, Dv]
    return op.where(total == 0.0, 0.0, out / op.where(total == 0.0, 1.0, total))


class FlashDecoding(Module):
    """The seeds' FlashDecoding as a layer without parameters (see ``flash_decoding``)."""

    def __init__(self, block: int = 256, scale: float | None = None):
        if block < 1:
            raise ArgumentError(f"FlashDecoding's block holds at least one key, not {block}")
        self.block, self.scale = int(block), scale

    def __call__(self, params, q, k, v, mask=None, **kw):
        return flash_decoding(q, k, v, mask, self.block, self.scale)
