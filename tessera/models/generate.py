"""Text generation for the zoo's decoder models: greedy or sampled decoding over a paged KV
cache, many prompts of different lengths served together by continuous batching.

    out = models.generate(model, params, [[1, 5, 9], [1, 7]], max_new_tokens=20,
                          temperature=0.8, top_k=50, top_p=0.95, seed=0, stop_tokens=[2])

How it runs:
- **Prefill**: a new prompt runs alone through the model's ``prefill`` step (its length rounded
  up to a power of two, at least 8, with padding after its tokens that none of them sees), its
  keys and values written into the blocks reserved for it (prompt + max_new_tokens positions).
- **Decoding**: one compiled ``decode`` step gives every busy slot of the batch its next token,
  reading each row's cache through its block table; the table's width is the busy rows' block
  count rounded up to a power of two, so a handful of compiled steps serve every length.
- **Continuous batching**: ``batch_size`` slots; a sequence that stops (a stop token, or
  max_new_tokens) frees its slot and its blocks at once and the next waiting prompt takes them.
- **Sampling** follows transformers' order (temperature, then top-k, then top-p) on the step's
  float32 logits, in float64; each prompt draws from its own generator seeded by
  ``(seed, its index)``, so its tokens do not depend on the batch it shared or the slot it
  took. temperature=0 is greedy (the first largest logit).

A model provides ``cache_shape()``, ``rope_tables(positions)``, ``window`` (its sliding
window, or None), ``prefill`` and ``decode`` (``LLaMA``, ``Mistral`` and ``Qwen2`` do)."""
from __future__ import annotations

from collections import deque

import numpy as np

from ..errors import ArgumentError, TesseraError
from ..function import function
from ..nn.paged import PagedKVCache


def sampling_distribution(logits, temperature=1.0, top_k=None, top_p=None) -> np.ndarray:
    """The probabilities [..., V] a sampled step draws from, in float64: logits / temperature,
    then all but the top_k largest removed (ties at the k-th kept), then the smallest tail whose
    total is at most 1 - top_p removed (the most likely token always kept), then softmax."""
    z = np.asarray(logits, np.float64) / float(temperature)
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.sort(z, axis=-1)[..., -int(top_k), None]
        z = np.where(z < kth, -np.inf, z)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(z, axis=-1, kind="stable")               # ascending
        srt = np.take_along_axis(z, order, axis=-1)
        p = np.exp(srt - srt[..., -1:])
        cum = np.cumsum(p / p.sum(axis=-1, keepdims=True), axis=-1)
        drop = cum <= 1.0 - float(top_p)
        drop[..., -1] = False
        np.put_along_axis(z, order, np.where(drop, -np.inf, srt), axis=-1)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def _bucket(n: int, least: int = 1) -> int:
    return max(least, 1 << (int(n) - 1).bit_length())


def _prompts(prompts, vocab):
    if isinstance(prompts, np.ndarray) and prompts.ndim == 2:
        prompts = list(prompts)
    if isinstance(prompts, np.ndarray) or not isinstance(prompts, (list, tuple)) or \
            not prompts or np.ndim(prompts[0]) != 1:
        raise ArgumentError("generate: prompts are a list of token-id sequences (or a 2-D "
                            "array, one prompt per row)")
    out = []
    for i, p in enumerate(prompts):
        a = np.asarray(p)
        if a.ndim != 1 or not a.size or a.dtype.kind not in "iu":
            raise ArgumentError(f"generate: prompt {i} is not a non-empty sequence of token ids")
        if a.min() < 0 or a.max() >= vocab:
            raise ArgumentError(f"generate: prompt {i} holds a token id outside [0, {vocab})")
        out.append(a.astype(np.int64))
    return out


def _steps(model):
    """The model's compiled prefill and decode steps (compiled once per model object)."""
    steps = getattr(model, "_generation_steps", None)
    if steps is None:
        steps = model._generation_steps = (function(model.prefill), function(model.decode))
    return steps


def generate(model, params, prompts, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int = 0,
             stop_tokens=(), batch_size: int = 8, block_size: int = 16,
             num_blocks: int | None = None) -> list:
    """Each prompt followed by up to ``max_new_tokens`` generated tokens (fewer when a stop
    token, which is kept, ends it): a list of int64 arrays in the prompts' order. See the
    module's text for how; ``num_blocks`` sizes the cache (default: room for ``batch_size``
    of the longest sequences)."""
    vocab = int(np.shape(params["embed"])[0])
    prompts = _prompts(prompts, vocab)
    for name, v in (("max_new_tokens", max_new_tokens), ("batch_size", batch_size),
                    ("block_size", block_size)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ArgumentError(f"generate: {name} must be a positive int, not {v!r}")
    if not temperature >= 0:
        raise ArgumentError(f"generate: temperature must be >= 0, not {temperature!r}")
    if top_k is not None and (not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise ArgumentError(f"generate: top_k must be a positive int, not {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ArgumentError(f"generate: top_p must lie in (0, 1], not {top_p!r}")
    stop = {int(t) for t in stop_tokens}
    prefill, decode = _steps(model)
    layers, kv, hd = model.cache_shape()
    slots = min(int(batch_size), len(prompts))
    per_seq = -(-(max(len(p) for p in prompts) + max_new_tokens) // block_size)
    num_blocks = per_seq * slots if num_blocks is None else int(num_blocks)
    if num_blocks < per_seq:
        raise TesseraError(f"generate: the longest sequence needs {per_seq} blocks of "
                           f"{block_size}; the cache has {num_blocks}")
    cache = PagedKVCache(layers, kv, hd, num_blocks, block_size)
    out = [list(p) for p in prompts]
    made = [0] * len(prompts)
    rngs = [np.random.default_rng([int(seed), i]) for i in range(len(prompts))]

    def choose(i, logits):
        made[i] += 1
        if temperature == 0:
            token = int(np.argmax(logits))
        else:
            c = np.cumsum(sampling_distribution(logits, temperature, top_k, top_p))
            token = min(int(np.searchsorted(c, rngs[i].random() * c[-1], side="right")),
                        len(c) - 1)
        out[i].append(token)
        return token in stop or made[i] == max_new_tokens

    def start(i):                        # prefill prompt i; True when it is already finished
        n = len(prompts[i])
        cache.add(i)
        cache.reserve(i, n + max_new_tokens)
        t = _bucket(n, 8)
        ids = np.zeros((1, t), np.int64)
        ids[0, :n] = prompts[i]
        cos, ssin = model.rope_tables(np.arange(t)[None])
        logits, ks, vs = prefill(params, ids, cos, ssin, np.array([n - 1]))
        cache.write(i, np.stack([k[0, :, :n] for k in ks]), np.stack([v[0, :, :n] for v in vs]))
        if choose(i, logits[0]):
            cache.release(i)
            return True
        return False

    waiting = deque(range(len(prompts)))
    busy = [None] * slots
    while waiting or any(s is not None for s in busy):
        for j in range(slots):
            while busy[j] is None and waiting and cache.free_blocks >= \
                    cache.blocks_for(len(prompts[waiting[0]]) + max_new_tokens):
                i = waiting.popleft()
                if not start(i):
                    busy[j] = i
        if all(s is None for s in busy):
            continue
        ids = np.array([[out[s][-1] if s is not None else 0] for s in busy], np.int64)
        pos = np.array([[cache.length[s] if s is not None else 0] for s in busy], np.int64)
        width = _bucket(max(cache.blocks_for(cache.length[s]) for s in busy if s is not None))
        cos, ssin = model.rope_tables(pos)
        mask = cache.mask(busy, width)
        window = mask if model.window is None else cache.mask(busy, width, window=model.window)
        logits, ks, vs = decode(params, ids, cos, ssin, cache.table(busy, width), mask, window,
                                list(cache.k), list(cache.v))
        ks, vs = np.stack(ks), np.stack(vs)                     # [layers, B, KV, 1, hd]
        for j, s in enumerate(busy):
            if s is None:
                continue
            cache.write(s, ks[:, j], vs[:, j])
            if choose(s, logits[j]):
                cache.release(s)
                busy[j] = None
    return [np.asarray(o, np.int64) for o in out]
