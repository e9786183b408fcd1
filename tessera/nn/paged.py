"""The seeds' PagedAttention: a KV cache kept in fixed-size blocks drawn from one pool, each
sequence holding a list of blocks (its block table), as vLLM serves many sequences of different
lengths from one memory without reserving the longest length for each.

The pool lives on the host as NumPy arrays, written in place between compiled steps (as
``KVCache.append`` does); a compiled step reads a sequence's keys through its block table (a
``take`` of whole blocks), so one step serves every length up to its table width:

    cache = nn.PagedKVCache(layers=2, kv_heads=4, head_dim=16, num_blocks=64, block_size=16)
    cache.add("a"); cache.reserve("a", 40)                 # blocks for 40 positions
    table = cache.table(["a", None], width=4)              # [2, 4] block ids (None: a free row)
    mask = cache.mask(["a", None], width=4, new=1)         # [2, 1, 1, 4 * 16 + 1]
    out = nn.paged_attention(q, k, v, cache.k[l], cache.v[l], table, mask)   # compiled
    cache.write("a", ks, vs)                               # the step's new keys, on the host
"""
from __future__ import annotations

import numpy as np

from .. import op
from ..errors import ArgumentError, TesseraError
from .attention import grouped_query_attention
from .layers import Module, _shape


def paged_attention(q, k, v, k_pool, v_pool, table, mask, scale=None):
    """Attention of T new positions to their sequences' cached keys and to themselves.

    q [B, H, T, D]; k, v [B, KV, T, D] (the new positions' keys and values; KV divides H:
    grouped-query attention); k_pool, v_pool [N, KV, block, D] (one layer of a
    ``PagedKVCache``); table [B, W] int (each row's first W blocks, ``PagedKVCache.table``);
    mask [B, 1, T, W * block + T] additive (``PagedKVCache.mask``: filled slots and the new
    positions' causal band visible, the rest -inf). Returns [B, H, T, D]."""
    b, d = _shape(q)[0], _shape(q)[-1]
    kv, block = _shape(k_pool)[1], _shape(k_pool)[2]
    w = _shape(table)[-1]

    def cached(pool, new):                   # [B, W, KV, blk, D] -> [B, KV, W * blk + T, D]
        blocks = op.transpose(op.take(pool, table, axis=0), [0, 2, 1, 3, 4])
        return op.concat([op.reshape(blocks, [b, kv, w * block, d]), new], axis=2)
    return grouped_query_attention(q, cached(k_pool, k), cached(v_pool, v), mask=mask,
                                   scale=scale)


class PagedAttention(Module):
    """``paged_attention`` as a layer without parameters (the seeds' name)."""

    def __init__(self, scale: float | None = None):
        self.scale = scale

    def __call__(self, params, q, k, v, k_pool, v_pool, table, mask, **kw):
        return paged_attention(q, k, v, k_pool, v_pool, table, mask, self.scale)


class PagedKVCache:
    """Keys and values of many sequences in blocks of ``block_size`` positions drawn from one
    pool: ``k``, ``v`` [layers, num_blocks, kv_heads, block_size, head_dim] (``k[l]`` is
    layer l's pool for ``paged_attention``). A sequence is named by any hashable id: ``add``
    it, ``reserve`` positions (blocks are taken from the free list, lowest first), ``write``
    each step's keys, ``release`` it when done (its blocks go back)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int = 16, dtype=np.float32):
        dims = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim,
                "num_blocks": num_blocks, "block_size": block_size}
        for name, n in dims.items():
            if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
                raise ArgumentError(f"PagedKVCache {name} must be a positive integer, not {n!r}")
        shape = (int(layers), int(num_blocks), int(kv_heads), int(block_size), int(head_dim))
        self.block_size = int(block_size)
        self.k = np.zeros(shape, np.dtype(getattr(dtype, "np", dtype)))
        self.v = np.zeros_like(self.k)
        self._free = list(range(int(num_blocks)))[::-1]        # pop() gives the lowest
        self.blocks: dict = {}
        self.length: dict = {}

    def __repr__(self):
        l, n, kv, bs, d = self.k.shape
        return (f"PagedKVCache(layers={l}, blocks={n}x{bs}, kv_heads={kv}, head_dim={d}, "
                f"sequences={len(self.blocks)}, free blocks={len(self._free)})")

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, positions: int) -> int:
        return -(-int(positions) // self.block_size)

    def add(self, seq) -> None:
        if seq in self.blocks:
            raise ArgumentError(f"PagedKVCache: sequence {seq!r} is already held")
        self.blocks[seq], self.length[seq] = [], 0

    def reserve(self, seq, positions: int) -> None:
        """Make room for ``positions`` more positions of ``seq`` (a TesseraError, nothing
        taken, when the pool has too few free blocks)."""
        need = self.blocks_for(self._held(seq) + positions) - len(self.blocks[seq])
        if need > len(self._free):
            raise TesseraError(f"PagedKVCache: {need} more blocks needed for {seq!r}, "
                               f"{len(self._free)} free",
                               hint="make the cache larger, or release finished sequences")
        self.blocks[seq] += [self._free.pop() for _ in range(max(need, 0))]

    def release(self, seq) -> None:
        """Forget ``seq``; its blocks go back to the pool."""
        self._free += self.blocks.pop(seq)
        self._free.sort(reverse=True)                          # pop() keeps giving the lowest
        del self.length[seq]

    def _held(self, seq) -> int:
        if seq not in self.length:
            raise ArgumentError(f"PagedKVCache: no sequence {seq!r}", hint="add() it first")
        return self.length[seq]

    def write(self, seq, k, v) -> None:
        """Write T new positions' keys and values, k and v [layers, kv_heads, T, head_dim],
        after the ones ``seq`` holds (its blocks reserved beforehand)."""
        k, v = np.asarray(k), np.asarray(v)
        l, _, kv, bs, d = self.k.shape
        if k.shape != v.shape or k.ndim != 4 or k.shape[:2] != (l, kv) or k.shape[3] != d:
            raise ArgumentError(f"PagedKVCache.write: keys {list(k.shape)} and values "
                                f"{list(v.shape)}, expected [{l}, {kv}, T, {d}] each")
        start = self._held(seq)
        pos = start + np.arange(k.shape[2])
        if len(pos) and pos[-1] // bs >= len(self.blocks[seq]):
            raise ArgumentError(f"PagedKVCache.write: {seq!r} has room for "
                                f"{len(self.blocks[seq]) * bs} positions, not {pos[-1] + 1}",
                                hint="reserve() them first")
        blk = np.asarray(self.blocks[seq], np.int64)[pos // bs]
        # the advanced indices (block, slot) go first: [T, layers, kv_heads, head_dim]
        self.k[:, blk, :, pos % bs] = k.transpose(2, 0, 1, 3)
        self.v[:, blk, :, pos % bs] = v.transpose(2, 0, 1, 3)
        self.length[seq] = start + len(pos)

    def table(self, seqs, width: int) -> np.ndarray:
        """[len(seqs), width] int64: each sequence's first ``width`` blocks (0 past its own,
        hidden by ``mask``); a None row is a free slot of the batch."""
        out = np.zeros((len(seqs), int(width)), np.int64)
        for i, s in enumerate(seqs):
            if s is not None:
                held = self.blocks[s][:width]
                out[i, :len(held)] = held
        return out

    def mask(self, seqs, width: int, new: int = 1, window: int | None = None) -> np.ndarray:
        """[len(seqs), 1, new, width * block_size + new] additive float32: a sequence's filled
        slots visible, the rest -inf, then its ``new`` positions causal among themselves (a
        free row sees only the new positions, so its softmax has a key). ``window``: each new
        position sees only the ``window`` most recent positions, its own included (Mistral's
        sliding window)."""
        n = int(width) * self.block_size
        m = np.full((len(seqs), 1, new, n + new), -np.inf, np.float32)
        t, u = np.arange(new)[:, None], np.arange(new)[None, :]
        own = u <= t if window is None else (u <= t) & (t - u < window)
        m[..., n:] = np.where(own, 0.0, -np.inf)
        for i, s in enumerate(seqs):
            if s is not None:
                held = self._held(s)
                if held > n:
                    raise ArgumentError(f"PagedKVCache.mask: {s!r} holds {held} positions, "
                                        f"more than {width} blocks show")
                j = np.arange(held)[None, :]
                seen = np.ones((new, held), bool) if window is None else \
                    (held + t) - j < window
                m[i, 0, :, :held] = np.where(seen, 0.0, -np.inf)
        return m
