"""`make bench`: tessera against NumPy and the peers that are installed (PyTorch eager,
torch.compile, jax.jit), on the same inputs, interleaved, median after warm-up. Every result is
checked against a float64 NumPy reference; ratios are printed and written to
benchmarks/results/, never asserted (benchmarks are not tests).

    python -m benchmarks.bench [--only softmax_4096,matmul_1024] [--repeat 7] [--quick]
                               [--json PATH] [--wait-quiet S] [--list] [--as-avx2]
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

import tessera as ts
from tessera import Tensor, Tile, nn, op, tile
from tessera.runtime import tunedb

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# Between two timed calls: BLAS and OpenMP worker threads (NumPy's OpenBLAS, tessera's libgomp,
# PyTorch's OpenMP and MKL, XLA's pool) spin for a while after a call and take the 2 cores from
# whoever runs next. The harness sleeps this long, then makes untimed calls to wake the next
# implementation's own threads, as a loop calling it would have them, then times one call.
SETTLE_S = 0.2
# An implementation slower than this is not woken first: waking threads costs well under 1% of it.
WAKE_BELOW_S = 0.2
# Untimed calls before each timed one: up to this many, until WAKE_S has passed (one was not
# enough on a 2-core Xeon VM, whose second core took 4-8 ms to come back after the pause).
WAKE_CALLS = 3
WAKE_S = 0.02
PEERS = ("torch eager", "torch.compile", "jax.jit", "scipy", "onnxruntime")
TORCH = ("torch eager", "torch.compile")


# ---- the tessera functions, written as a user would ----------------------------------------------
@ts.function
def matmul(a: Tensor["M", "K"], b: Tensor["K", "N"]) -> Tensor["M", "N"]:
    return a @ b


@ts.function
def gelu_chain(x: Tensor["N"], w: Tensor["N"], b: Tensor["N"]) -> Tensor["N"]:
    return op.gelu(x * w + b, approximate="tanh")


@ts.function
def softmax(x: Tensor["R", "C"]) -> Tensor["R", "C"]:
    return op.softmax(x, axis=-1)


@ts.function
def layernorm(x: Tensor["R", "C"]) -> Tensor["R", "C"]:
    return op.layernorm(x, eps=1e-5)


@ts.function
def attention(q: Tensor["B", "H", "S", 64], k: Tensor["B", "H", "S", 64],
              v: Tensor["B", "H", "S", 64]) -> Tensor["B", "H", "S", 64]:
    return op.attention(q, k, v)                      # scale 1/sqrt(64)


@ts.function
def attention_written(q: Tensor["B", "H", "S", 64], k: Tensor["B", "H", "S", 64],
                      v: Tensor["B", "H", "S", 64]) -> Tensor["B", "H", "S", 64]:
    # the same, spelled out: the compiler is meant to recognise it as one attention kernel
    return op.softmax(op.matmul(q, op.transpose(k)) * 0.125, axis=-1) @ v


@ts.function
def matmul_bias_gelu(x: Tensor["M", "K"], w: Tensor["K", "N"], b: Tensor["N"]) -> Tensor["M", "N"]:
    return op.gelu(x @ w + b, approximate="tanh")


# the seeds' tile kernels (@ts.kernel, README "Tile kernels"): matmul_kernel with f32 inputs,
# safe_softmax as written
@ts.kernel
def matmul_kernel(A: Tile["M", "K", ts.float32], B: Tile["K", "N", ts.float32],
                  C: Tile["M", "N", ts.float32]):
    ctx = tile.context()
    A_shared = tile.load(A, shape=(ctx.BM, ctx.BK), prefetch=2)
    B_shared = tile.load(B, shape=(ctx.BK, ctx.BN), prefetch=2)
    accumulator = tile.zeros((ctx.BM, ctx.BN), dtype=ts.float32)
    for k in tile.range_k(0, ctx.K, ctx.BK):
        A_tile = tile.load_partition(A_shared, k)
        B_tile = tile.load_partition(B_shared, k)
        accumulator += tile.mma(A_tile, B_tile)
    tile.store(C, accumulator)


@ts.kernel
def safe_softmax(x: Tile["R", "C", ts.float32]) -> Tile["R", "C", ts.float32]:
    max_val = tile.max(x, axis=-1, keepdim=True)
    exp_x = tile.exp(x - max_val)
    return exp_x / tile.sum(exp_x, axis=-1, keepdim=True)


def tile_function(kernel):
    """A case's builder: the tessera Function that a call of the tile kernel runs, for the
    case's arrays (so the tuned column and the profiler see it as any function). The call
    `kernel(A, B, C)` adds its argument checks and, for a stored output, the copy of the result
    into the caller's array; the Function, like `a @ b`, returns a new array."""
    def build(*arrays):
        return kernel.function(kernel.body([ts.dtypes.get(a.dtype) for a in arrays]))
    return build


# ---- NumPy: the reference (run in float64) and a peer (run in float32) ---------------------------
@ts.function
def rfft_rows(x: Tensor["R", "N"]):
    return op.rfft(x, axis=-1)


@ts.function
def rfft2_image(x: Tensor["R", "N"]):
    return op.rfft2(x)


@ts.function
def fft_line(z):
    return op.fft(z)


def complex_parts(outs):
    """A complex result (or a list of its rows, as the peers' harness gives them) as one flat
    float array of its parts."""
    outs = outs if isinstance(outs, list) else [outs]
    return np.concatenate([np.ravel(np.stack([np.real(o), np.imag(o)], -1)) for o in outs])


def fft_flops(x, real=False):
    """5 n log2 n per complex line (half for a real one): the usual FFT count."""
    n = x.shape[-1]
    return (2.5 if real else 5) * x.size * math.log2(n)


MLP_SIZES = (784, 512, 512, 10)
MLP_LR = 0.01
_mlp = nn.MLP(list(MLP_SIZES), activation="relu")


@ts.function
def mlp_step(w1, b1, w2, b2, w3, b3, x, y):
    """One SGD step, written as a user would: value_and_grad over a parameter pytree."""
    params = {"layers": [{"w": w1, "b": b1}, {"w": w2, "b": b2}, {"w": w3, "b": b3}]}
    loss, grads = ts.value_and_grad(lambda p: nn.cross_entropy(_mlp(p, x), y))(params)
    new = [p - MLP_LR * g for p, g in zip(ts.pytree.leaves(params), ts.pytree.leaves(grads))]
    return (loss, *new)


def mlp_inputs(rng, quick):
    params = _mlp.init(seed=0)
    flat = [a for layer in params["layers"] for a in (layer["w"], layer["b"])]
    batch = 64 if quick else 256
    return flat + [f32(rng, batch, MLP_SIZES[0]),
                   rng.integers(0, MLP_SIZES[-1], batch).astype(np.int64)]


def mlp_step_np(w1, b1, w2, b2, w3, b3, x, y):
    """Forward and a hand-written backward in NumPy (float32, or float64 as the reference)."""
    y = y.astype(np.int64)
    h1 = np.maximum(x @ w1 + b1, 0)
    h2 = np.maximum(h1 @ w2 + b2, 0)
    z = h2 @ w3 + b3
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    n = len(y)
    loss = -np.log(p[np.arange(n), y]).mean()
    dz = p
    dz[np.arange(n), y] -= 1
    dz /= n
    dw3, db3 = h2.T @ dz, dz.sum(0)
    d2 = (dz @ w3.T) * (h2 > 0)
    dw2, db2 = h1.T @ d2, d2.sum(0)
    d1 = (d2 @ w2.T) * (h1 > 0)
    dw1, db1 = x.T @ d1, d1.sum(0)
    grads = (dw1, db1, dw2, db2, dw3, db3)
    return [np.asarray(loss, x.dtype)] + [w - MLP_LR * g for w, g in
                                          zip((w1, b1, w2, b2, w3, b3), grads)]


def mlp_step_torch(t, w1, b1, w2, b2, w3, b3, x, y):
    params = [w.detach().requires_grad_() for w in (w1, b1, w2, b2, w3, b3)]
    with t.enable_grad():
        h = x
        for i in range(0, 6, 2):
            h = h @ params[i] + params[i + 1]
            if i < 4:
                h = t.relu(h)
        loss = t.nn.functional.cross_entropy(h, y)
        grads = t.autograd.grad(loss, params)
    return [loss.detach()] + [p.detach() - MLP_LR * g for p, g in zip(params, grads)]


def mlp_loss_jax(ps, x, y):
    """The MLP's cross-entropy in JAX (ps: w1, b1, w2, b2, w3, b3; relu between layers)."""
    import jax
    import jax.numpy as jnp
    h = x
    for i in range(0, 6, 2):
        h = h @ ps[i] + ps[i + 1]
        if i < 4:
            h = jnp.maximum(h, 0)
    logp = jax.nn.log_softmax(h)
    return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()


def mlp_step_jax(jnp, w1, b1, w2, b2, w3, b3, x, y):
    import jax
    ps = [w1, b1, w2, b2, w3, b3]
    loss, grads = jax.value_and_grad(lambda ps: mlp_loss_jax(ps, x, y))(ps)
    return [loss] + [p - MLP_LR * g for p, g in zip(ps, grads)]


def mlp_flops(w1, b1, w2, b2, w3, b3, x, y):
    """Forward 2·B·Σ(in·out), backward twice that."""
    return 6 * len(x) * sum(w.shape[0] * w.shape[1] for w in (w1, w2, w3))


def gelu_np(x):
    c = x.dtype.type(math.sqrt(2 / math.pi))
    return 0.5 * x * (1 + np.tanh(c * (x + x.dtype.type(0.044715) * x ** 3)))


def softmax_np(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def layernorm_np(x):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(x.var(-1, keepdims=True) + x.dtype.type(1e-5))


def attention_np(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) * q.dtype.type(1 / math.sqrt(q.shape[-1]))
    return softmax_np(s) @ v


def attention_ref(q, k, v):                           # float64, one batch at a time (memory)
    return np.stack([attention_np(q[i], k[i], v[i]) for i in range(q.shape[0])])


# ---- the peers' versions (imported lazily: each may be missing) ----------------------------------
def _jax_nn():
    import jax.nn
    return jax.nn


def _jax_sdpa(jnp, q, k, v):
    # jax.nn.dot_product_attention takes [batch, seq, heads, dim]
    t = (0, 2, 1, 3)
    return _jax_nn().dot_product_attention(q.transpose(t), k.transpose(t), v.transpose(t)) \
        .transpose(t)


# ---- cases ----------------------------------------------------------------------------------------
Arrays = list


@dataclass
class Case:
    name: str
    what: str                                # what it measures, in words
    goal: str                                # the goal, in words
    inputs: Callable                         # (rng, quick) -> list of float32 arrays
    numpy: Callable | None                   # NumPy: the peer (float32) and the reference (float64)
    tessera: ts.Function | Callable          # or (*arrays) -> the Function, built when it runs
    torch: Callable | None = None            # (torch, *tensors) -> tensor
    jax: Callable | None = None              # (jax.numpy, *arrays) -> array
    flops: Callable | None = None            # arrays -> FLOPs (for GFLOP/s)
    bytes: Callable | None = None            # arrays -> bytes that must move at least (for GB/s)
    atol: float = 2e-5                       # max |got - ref| / max |ref|: relative to magnitude
    min_speedup: float | None = 1.0          # goal: tessera at least this much faster than NumPy
    numpy_base: Callable | None = None       # goal measured against this NumPy instead
    scipy: Callable | None = None            # (scipy, *arrays) -> array, when SciPy is installed
    # (onnxruntime, *arrays) -> a call running a session built once, when it is installed
    onnxruntime: Callable | None = None
    min_bandwidth: float | None = None       # goal: share of the measured copy bandwidth
    # the every-CPU goals (issue 22), on top of the first wave's:
    min_vs_peers: float | None = None        # tessera >= this x the best of NumPy, torch and jax
    min_vs_torch: float | None = None        # tessera >= this x PyTorch's best (eager, compiled)
    min_peak_share: float | None = None      # share of the probe's FMA peak
    integer_ops: bool = False                # flops counts integer operations: no FMA peak
    pair_dots: bool = False                  # flops on bf16 dot products of pairs: no FMA peak
    reference: Callable | None = None        # float64 reference if not `numpy` on float64 inputs
    pack: Callable | None = None             # several outputs -> one flat array to compare
    # a tile kernel's goal: within a factor of tessera's own routine for the same result
    tessera_base: Callable | None = None     # (*arrays) -> that routine's result, timed alike
    tessera_base_name: str = ""              # what it is, in words
    max_vs_base: float | None = None         # goal: tessera's time at most this x the routine's


def f32(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def mm_flops(a, b, *_):
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


def mm_bytes(a, b, *rest):
    return 4 * (a.size + b.size + a.shape[0] * b.shape[1] + sum(x.size for x in rest))


def attn_flops(q, k, v):
    b, h, s, d = q.shape
    return 4 * b * h * s * k.shape[2] * d


def _matmul_case(n):
    return Case(
        f"matmul_{n}", f"f32 matmul {n}×{n} @ {n}×{n} (--quick: half)",
        "≥1.3× NumPy (OpenBLAS); ≥1.15× the best of NumPy, torch and jax, ≥80% of the FMA peak",
        lambda r, q: [f32(r, n >> q, n >> q), f32(r, n >> q, n >> q)],
        lambda a, b: a @ b, matmul,
        torch=lambda t, a, b: a @ b, jax=lambda jnp, a, b: a @ b,
        flops=mm_flops, bytes=mm_bytes, min_speedup=1.3, min_vs_peers=1.15, min_peak_share=0.8)


def _attention_case(name, fn, how):
    return Case(
        name, f"B=8 H=8 S=1024 D=64 ({how}; --quick: B=2 S=512)",
        "≥3× NumPy, ≥1.5× PyTorch SDPA",
        lambda r, q: [f32(r, 2 if q else 8, 8, 512 if q else 1024, 64) for _ in range(3)],
        attention_np, fn,
        torch=lambda t, q, k, v: t.nn.functional.scaled_dot_product_attention(q, k, v),
        jax=_jax_sdpa, flops=attn_flops, bytes=lambda q, k, v: 16 * q.size,
        atol=1e-4, min_speedup=3.0, min_vs_torch=1.5, reference=attention_ref)


CASES = [
    _matmul_case(1024),
    _matmul_case(2048),
    Case("gelu(x*w+b)", "elementwise chain, three 16M-float inputs (--quick: 1M), one kernel",
         "≥6× NumPy and ≥80% of copy bandwidth; ≥1.5× the best peer",
         lambda r, q: [f32(r, 1 << (20 if q else 24)) for _ in range(3)],
         lambda x, w, b: gelu_np(x * w + b), gelu_chain,
         torch=lambda t, x, w, b: t.nn.functional.gelu(x * w + b, approximate="tanh"),
         jax=lambda jnp, x, w, b: _jax_nn().gelu(x * w + b, approximate=True),
         flops=lambda x, w, b: 20 * x.size, bytes=lambda x, w, b: 16 * x.size,
         min_speedup=6.0, min_bandwidth=0.8, min_vs_peers=1.5),
    Case("softmax_4096", "softmax over the last axis of 4096×4096 (--quick: 1024×4096)",
         "≥4× NumPy; ≥1.5× the best peer",
         lambda r, q: [f32(r, 1024 if q else 4096, 4096)], softmax_np, softmax,
         torch=lambda t, x: t.softmax(x, -1), jax=lambda jnp, x: _jax_nn().softmax(x, axis=-1),
         flops=lambda x: 5 * x.size, bytes=lambda x: 8 * x.size,
         min_speedup=4.0, min_vs_peers=1.5),
    Case("layernorm_4096", "layernorm (no affine) over the last axis of 4096×4096 (--quick: 1024)",
         "≥4× NumPy; ≥1.5× the best peer",
         lambda r, q: [f32(r, 1024 if q else 4096, 4096)], layernorm_np, layernorm,
         torch=lambda t, x: t.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5),
         jax=lambda jnp, x: (x - x.mean(-1, keepdims=True))
         / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5),
         flops=lambda x: 7 * x.size, bytes=lambda x: 8 * x.size,
         min_speedup=4.0, min_vs_peers=1.5),
    _attention_case("attention", attention, "op.attention"),
    _attention_case("attention_written", attention_written, "softmax(q @ kᵀ * scale) @ v by hand"),
    Case("matmul+bias+gelu", "gelu(x @ w + b), 4096×1024 @ 1024×4096 (--quick: 1024×1024 @ ×1024)",
         "faster than NumPy's matmul alone",
         lambda r, q: [f32(r, 1024 if q else 4096, 1024), f32(r, 1024, 1024 if q else 4096),
                       f32(r, 1024 if q else 4096)],
         lambda x, w, b: gelu_np(x @ w + b), matmul_bias_gelu,
         torch=lambda t, x, w, b: t.nn.functional.gelu(x @ w + b, approximate="tanh"),
         jax=lambda jnp, x, w, b: _jax_nn().gelu(x @ w + b, approximate=True),
         flops=mm_flops, bytes=mm_bytes, numpy_base=lambda x, w, b: x @ w),
    Case("mlp_train_step", "one SGD step of a 784-512-512-10 relu MLP, batch 256: forward, "
         "cross-entropy, backward, update (--quick: batch 64)",
         "≥1.2× PyTorch (its faster of eager and compiled)",
         mlp_inputs, mlp_step_np, mlp_step, torch=mlp_step_torch, jax=mlp_step_jax,
         flops=mlp_flops, atol=1e-4, min_speedup=None, min_vs_torch=1.2,
         pack=lambda outs: np.concatenate([np.ravel(np.asarray(o, np.float64)) for o in outs])),
]
CASES += [
    Case("tile_matmul_2048", "the seeds' matmul_kernel (a tile kernel) with f32 inputs, "
         "2048×2048 @ 2048×2048 (--quick: 1024)",
         "within 1.3× the time of tessera's own GEMM routine (a @ b)",
         lambda r, q: [f32(r, 2048 >> q, 2048 >> q), f32(r, 2048 >> q, 2048 >> q),
                       np.zeros((2048 >> q, 2048 >> q), np.float32)],
         lambda a, b, c: a @ b, tile_function(matmul_kernel),
         torch=lambda t, a, b, c: a @ b, jax=lambda jnp, a, b, c: a @ b,
         flops=mm_flops, bytes=lambda a, b, c: mm_bytes(a, b), min_speedup=None,
         tessera_base=lambda a, b, c: matmul(a, b), tessera_base_name="a @ b", max_vs_base=1.3),
    Case("tile_softmax_4096", "the seeds' safe_softmax (a tile kernel) over the last axis of "
         "4096×4096 (--quick: 1024×4096)",
         "within 1.2× the time of tessera's fused op.softmax",
         lambda r, q: [f32(r, 1024 if q else 4096, 4096)], softmax_np, tile_function(safe_softmax),
         torch=lambda t, x: t.softmax(x, -1), jax=lambda jnp, x: _jax_nn().softmax(x, axis=-1),
         flops=lambda x: 5 * x.size, bytes=lambda x: 8 * x.size, min_speedup=None,
         tessera_base=softmax, tessera_base_name="op.softmax", max_vs_base=1.2),
]
CASES += [
    Case("rfft_4096x1024", "rfft of 4096 rows of 1024 f32 (--quick: 1024 rows)",
         "≥1.5× numpy.fft; ≥1× torch.fft",
         lambda r, q: [f32(r, 1024 if q else 4096, 1024)],
         lambda x: np.fft.rfft(x, axis=-1), rfft_rows,
         torch=lambda t, x: t.fft.rfft(x), jax=lambda jnp, x: jnp.fft.rfft(x),
         scipy=lambda sp, x: sp.fft.rfft(x), flops=lambda x: fft_flops(x, True),
         bytes=lambda x: 12 * x.size, atol=1e-5, min_speedup=1.5, min_vs_torch=1.0,
         pack=complex_parts),
    Case("rfft2_4096x1024", "rfft2 of a 4096x1024 f32 image (rows, then the columns in place; "
         "--quick: 1024 rows)", "≥1.5× numpy.fft; ≥1× torch.fft",
         lambda r, q: [f32(r, 1024 if q else 4096, 1024)],
         lambda x: np.fft.rfft2(x), rfft2_image,
         torch=lambda t, x: t.fft.rfft2(x), jax=lambda jnp, x: jnp.fft.rfft2(x),
         scipy=lambda sp, x: sp.fft.rfft2(x),
         flops=lambda x: fft_flops(x, True) + fft_flops(x.T[: x.shape[1] // 2 + 1]),
         bytes=lambda x: 20 * x.size, atol=1e-5, min_speedup=1.5, min_vs_torch=1.0,
         pack=complex_parts),
    Case("fft_2^20", "fft of 2^20 complex64 points, one line (--quick: 2^16)",
         "≥1.5× numpy.fft; ≥1× torch.fft",
         lambda r, q: [(f32(r, 1 << (16 if q else 20)) + 1j * f32(r, 1 << (16 if q else 20)))
                       .astype(np.complex64)],
         lambda z: np.fft.fft(z), fft_line,
         torch=lambda t, z: t.fft.fft(z), jax=lambda jnp, z: jnp.fft.fft(z),
         scipy=lambda sp, z: sp.fft.fft(z), flops=fft_flops, bytes=lambda z: 16 * z.size,
         atol=1e-5, min_speedup=1.5, min_vs_torch=1.0, pack=complex_parts,
         reference=lambda z: np.fft.fft(z.astype(np.complex128))),
]


# ---- models that come from elsewhere: a PyTorch model through ts.from_torch, a JAX function
# through ts.from_jax; each built when its case runs (the imports take seconds, and the case is
# an error row where transformers or JAX is missing)
def gpt2_inputs(rng, quick):
    return [f32(rng, 1 if quick else 4, 64 if quick else 128, 256) * 0.5]


def gpt2_model(dtype=None):
    """A randomly initialised 2-layer GPT-2 (n_embd 256, 4 heads), the same weights each time,
    taking input embeddings and giving the last hidden state."""
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(attn_implementation="eager", n_layer=2, n_head=4, n_embd=256,
                                  n_positions=256, vocab_size=100, bos_token_id=0,
                                  eos_token_id=0)
    model = transformers.GPT2Model(cfg).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model.to(dtype) if dtype is not None else model

        def forward(self, x):
            return self.model(inputs_embeds=x).last_hidden_state
    return Hidden()


def gpt2_tessera(x):
    import torch
    fn, params = ts.from_torch(gpt2_model(), torch.from_numpy(x))
    return ts.function(lambda x: fn(params, x), name="gpt2_imported")


def gpt2_torch(t, x):
    model = _GPT2.get("torch") or _GPT2.setdefault("torch", gpt2_model())
    return model(x)


def gpt2_reference(x):
    import torch
    model = _GPT2.get("f64") or _GPT2.setdefault("f64", gpt2_model(torch.float64))
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


_GPT2: dict = {}


def jax_mlp(w1, b1, w2, b2, w3, b3, x):
    """A 784-512-512-10 MLP's forward pass to class probabilities, written in JAX."""
    import jax
    h = jax.nn.relu(x @ w1 + b1)
    h = jax.nn.gelu(h @ w2 + b2, approximate=True)
    return jax.nn.softmax(h @ w3 + b3, axis=-1)


def jax_mlp_inputs(rng, quick):
    return mlp_inputs(rng, quick)[:-1]


def jax_mlp_np(w1, b1, w2, b2, w3, b3, x):
    h = np.maximum(x @ w1 + b1, 0)
    return softmax_np(gelu_np(h @ w2 + b2) @ w3 + b3)


def jax_mlp_tessera(*arrays):
    return ts.from_jax(jax_mlp, *arrays)


CASES += [
    Case("gpt2_imported", "a 2-layer GPT-2 (n_embd 256, 4 heads) from transformers, imported by "
         "ts.from_torch; batch 4 × 128 input embeddings (--quick: 1 × 64)",
         "≥1× PyTorch (its faster of eager and compiled) on PyTorch's own model",
         gpt2_inputs, None, gpt2_tessera, torch=gpt2_torch, reference=gpt2_reference,
         atol=1e-4, min_speedup=None, min_vs_torch=1.0),
    Case("jax_mlp_imported", "a 784-512-512-10 MLP forward (relu, gelu, softmax) written in JAX, "
         "converted by ts.from_jax; batch 256 (--quick: 64)",
         "≥1× the best of NumPy and jax.jit (on JAX's own function)",
         jax_mlp_inputs, jax_mlp_np, jax_mlp_tessera,
         jax=lambda jnp, *a: jax_mlp(*a), flops=lambda *a: mlp_flops(*a, None) / 3,
         atol=1e-4, min_speedup=None, min_vs_peers=1.0),
]


# ---- convolutions (issue 40): ResNet's 3x3 stages, a depthwise 3x3, the stem's max pool --------
def conv_np(x, w, groups=1):
    """NumPy's convolution: 3x3 windows (stride 1, padding 1) as a view, contracted by einsum
    (BLAS through tensordot)."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))   # N C H W 3 3
    if groups == 1:
        return np.einsum("nchwij,ocij->nohw", win, w, optimize=True)
    return np.einsum("nchwij,cij->nchw", win, w[:, 0], optimize=True)        # depthwise


def max_pool_np(x):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    return win.max(axis=(-1, -2))


def _conv_case(hw, c):
    def inputs(r, q):
        return [f32(r, 4 if q else 32, c, hw, hw), f32(r, c, c, 3, 3) * (1 / math.sqrt(9 * c))]
    return Case(
        f"conv3x3_{hw}x{hw}x{c}", f"conv2d 3x3, stride 1, 'same' padding, f32, batch 32 × {c} "
        f"channels {hw}×{hw} -> {c} (--quick: batch 4)",
        "≥1.2× PyTorch's CPU convolution (oneDNN); ≥80% of the FMA peak",
        inputs, conv_np, ts.function(lambda x, w: op.conv(x, w, padding="same")),
        torch=lambda t, x, w: t.nn.functional.conv2d(x, w, padding=1),
        flops=lambda x, w: 2 * x.shape[0] * w.shape[0] * x.shape[2] * x.shape[3] * w[0].size,
        bytes=lambda x, w: 4 * (2 * x.size + w.size), atol=1e-4, min_speedup=None,
        min_vs_torch=1.2, min_peak_share=0.8)


CASES += [_conv_case(hw, c) for hw, c in ((56, 64), (28, 128), (14, 256), (7, 512))]
CASES += [
    Case("depthwise3x3_56x56x128", "depthwise conv2d 3x3 ('same'), f32, batch 32 × 128 channels "
         "56×56 (--quick: batch 4)", "≥70% of the copy bandwidth",
         lambda r, q: [f32(r, 4 if q else 32, 128, 56, 56), f32(r, 128, 1, 3, 3)],
         lambda x, w: conv_np(x, w, groups=128),
         ts.function(lambda x, w: op.conv(x, w, padding="same", groups=128)),
         torch=lambda t, x, w: t.nn.functional.conv2d(x, w, padding=1, groups=128),
         flops=lambda x, w: 18 * x.size, bytes=lambda x, w: 8 * x.size, atol=1e-4,
         min_speedup=None, min_bandwidth=0.7),
    Case("max_pool3x3s2_112x112x64", "max_pool 3x3, stride 2, padding 1 (ResNet's stem), f32, "
         "batch 32 × 64 channels 112×112 (--quick: batch 4)", "≥70% of the copy bandwidth",
         lambda r, q: [f32(r, 4 if q else 32, 64, 112, 112)], max_pool_np,
         ts.function(lambda x: op.max_pool(x, 3, 2, 1)),
         torch=lambda t, x: t.nn.functional.max_pool2d(x, 3, 2, 1),
         bytes=lambda x: 5 * x.size, min_speedup=None, min_bandwidth=0.7),   # 4 B x 1.25 x.size
]
PENDING: dict = {}


# ---- int8 products (issue 42): ONNX's MatMulInteger, int8 x int8 -> int32 ------------------------
def ort_matmul_integer(ort, a, b):
    """onnxruntime's MatMulInteger on a and b, its session built once: a call running it."""
    from onnx import TensorProto, helper
    kind = {np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8}
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "mm", [
        helper.make_tensor_value_info("a", kind[a.dtype], list(a.shape)),
        helper.make_tensor_value_info("b", kind[b.dtype], list(b.shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"a": a, "b": b})


def _int8_case(n, a_type=np.int8):
    """An n x n x n product of 8-bit matrices into int32: int8 x int8 (PyTorch's _int_mm takes
    only these), or uint8 activations x int8 weights (what onnxruntime's quantizer writes), at
    the machine's level (on AMX's tiles where the CPU has them)."""
    ua = a_type == np.uint8
    return Case(
        f"matmul_{'u8' if ua else 'i8'}i8_{n}",
        f"{'uint8' if ua else 'int8'} x int8 -> int32 matmul {n}×{n} @ {n}×{n}, exact (ONNX's "
        "MatMulInteger; --quick: half)",
        "at least PyTorch's _int_mm; side by side with onnxruntime's MatMulInteger" if not ua
        else "side by side with onnxruntime's MatMulInteger (PyTorch has no uint8 x int8 GEMM)",
        lambda r, q: [r.integers(0 if ua else -128, 256 if ua else 128,
                                 (n >> q, n >> q)).astype(a_type),
                      r.integers(-128, 128, (n >> q, n >> q)).astype(np.int8)],
        lambda a, b: a.astype(np.int32) @ b.astype(np.int32),
        ts.function(lambda a, b: op.matmul_integer(a, b)),
        torch=None if ua else (lambda t, a, b: t._int_mm(a, b)), onnxruntime=ort_matmul_integer,
        flops=mm_flops, bytes=lambda a, b: a.size + b.size + 4 * a.shape[0] * b.shape[1],
        atol=0.0, min_speedup=None, min_vs_torch=None if ua else 1.0, integer_ops=True)


CASES += [_int8_case(1024), _int8_case(2048, np.uint8)]


# ---- bf16 products (issue 44): the FMA chains, AVX-512 BF16's dot product of pairs, AMX tiles ----
# The inputs are bf16 bits as uint16 (PyTorch takes no ml_dtypes array): each side views them.
BF16_DOT = "x86-64-v4+bf16"
BF16_AMX = "x86-64-v4+amx"
_BF16_LEVELS = {BF16_DOT: ("_dot", "AVX-512 BF16 vdpbf16ps"), BF16_AMX: ("_amx", "AMX tdpbf16ps")}


def _bf16(x):
    import ml_dtypes
    return x.view(ml_dtypes.bfloat16)


def _on_bf16(fn):
    """fn called on the bits viewed as bf16 (a view: nothing copied). The autotuner searches fn
    itself, on the viewed inputs (`inner`, `view`)."""
    def call(a, b):
        return fn(_bf16(a), _bf16(b))
    call.inner, call.view = fn, _bf16
    return call


def _bf16_case(n, level=None):
    """An n x n x n bf16 product, rounded once to bf16: at the machine's own level (float32 FMA
    chains on widened operands), or at x86-64-v4+bf16 (vdpbf16ps) or x86-64-v4+amx (AMX tiles;
    each a choice, never the host's default) where this CPU runs it (None where it does not)."""
    from tessera.runtime import isa
    dot = level is not None
    if dot and not isa.runs_here(level):
        return None
    target = {"target": f"cpu:{level}"} if dot else {}
    return Case(
        f"matmul_bf16_{n}" + (_BF16_LEVELS[level][0] if dot else ""),
        f"bf16 matmul {n}×{n} @ {n}×{n} into bf16 (--quick: half), "
        + (f"tessera at {level} ({_BF16_LEVELS[level][1]})" if dot else
           "tessera's FMA chains on float32 widened operands"),
        "at least PyTorch's bf16 matmul (issue 44: on a machine with AMX or AVX-512 BF16)"
        if dot else "side by side with PyTorch's bf16 matmul (issue 44)",
        lambda r, q: [(r.standard_normal((n >> q, n >> q), np.float32).view(np.uint32) >> 16)
                      .astype(np.uint16) for _ in range(2)],
        lambda a, b: _bf16(a).astype(np.float64) @ _bf16(b).astype(np.float64),
        lambda a, b: _on_bf16(ts.function(lambda a, b: a @ b, **target)),
        torch=lambda t, a, b: (a.view(t.bfloat16) @ b.view(t.bfloat16)).float(),
        flops=mm_flops, bytes=lambda a, b: 2 * (a.size + b.size + a.shape[0] * b.shape[1]),
        atol=2e-2, min_speedup=None, min_vs_torch=1.0 if dot else None, pair_dots=dot)


CASES += [c for c in (_bf16_case(1024), _bf16_case(2048), _bf16_case(1024, BF16_DOT),
                      _bf16_case(2048, BF16_DOT), _bf16_case(1024, BF16_AMX),
                      _bf16_case(2048, BF16_AMX)) if c is not None]


# ---- a ResNet-18 training step (issue 40): torchvision's architecture (7x7 stem, max pool, four
# stages of two basic blocks, 1000 classes), batch norm in training mode (the batch's statistics),
# cross-entropy, the backward pass and SGD with momentum, written once over either library's
# primitives
RESNET_STAGES, RESNET_LR, RESNET_MOMENTUM = (64, 128, 256, 512), 0.01, 0.9


def resnet18_spec() -> list:
    """(name, shape) of each parameter, in the step's argument order."""
    spec = [("stem", (64, 3, 7, 7)), ("stem_bn_w", (64,)), ("stem_bn_b", (64,))]
    cin = 64
    for stage, c in enumerate(RESNET_STAGES):
        for blk in range(2):
            pre = f"s{stage}b{blk}_"
            spec += [(pre + "c1", (c, cin, 3, 3)), (pre + "bn1_w", (c,)), (pre + "bn1_b", (c,)),
                     (pre + "c2", (c, c, 3, 3)), (pre + "bn2_w", (c,)), (pre + "bn2_b", (c,))]
            if cin != c:
                spec += [(pre + "down", (c, cin, 1, 1)), (pre + "dbn_w", (c,)),
                         (pre + "dbn_b", (c,))]
            cin = c
    return spec + [("fc_w", (512, 1000)), ("fc_b", (1000,))]


def resnet18_inputs(rng, quick):
    """Kaiming-uniform weights, batch norm at 1 and 0, momentum buffers of a few earlier
    steps' size; 64x64 images, batch 32 (--quick: 8)."""
    params, moms = [], []
    for name, shape in resnet18_spec():
        if name.endswith("_w") and len(shape) == 1:
            a = np.ones(shape, np.float32)
        elif len(shape) == 1:
            a = np.zeros(shape, np.float32)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
            a = rng.uniform(-1, 1, shape).astype(np.float32) * np.float32(np.sqrt(3 / fan_in))
        params.append(a)
        moms.append((f32(rng, *shape) * 1e-3).astype(np.float32))
    batch = 8 if quick else 32
    return params + moms + [f32(rng, batch, 3, 64, 64),
                            rng.integers(0, 1000, batch).astype(np.int64)]


def resnet18_loss(P, ps, x, y):
    """The mean cross-entropy of the logits; P: conv, bn, relu, max_pool, mean_hw, ce."""
    it = iter(ps)
    h = P.relu(P.bn(P.conv(x, next(it), 2, 3), next(it), next(it)))
    h = P.max_pool(h)
    cin = 64
    for stage, c in enumerate(RESNET_STAGES):
        for blk in range(2):
            stride = 2 if stage and blk == 0 else 1
            out = P.relu(P.bn(P.conv(h, next(it), stride, 1), next(it), next(it)))
            out = P.bn(P.conv(out, next(it), 1, 1), next(it), next(it))
            short = h if cin == c else P.bn(P.conv(h, next(it), stride, 0), next(it), next(it))
            h, cin = P.relu(out + short), c
    logits = P.mean_hw(h) @ next(it) + next(it)
    return P.ce(logits, y)


def _sgd_momentum(ps, moms, grads):
    new_m = [RESNET_MOMENTUM * m + g for m, g in zip(moms, grads)]
    return [p - RESNET_LR * m for p, m in zip(ps, new_m)], new_m


class _TesseraPrims:
    conv = staticmethod(lambda x, w, s, p: op.conv(x, w, stride=s, padding=p))
    bn = staticmethod(lambda x, w, b: op.batch_norm(x, weight=w, bias=b, training=True))
    relu = staticmethod(op.relu)
    max_pool = staticmethod(lambda x: op.max_pool(x, 3, 2, 1))
    mean_hw = staticmethod(lambda x: op.mean(x, axis=(2, 3)))
    ce = staticmethod(lambda z, y: nn.cross_entropy(z, y))


def resnet18_tessera(*arrays):
    n = len(resnet18_spec())

    def step(a):
        ps, moms, x, y = list(a[:n]), list(a[n:2 * n]), a[-2], a[-1]
        loss, grads = ts.value_and_grad(lambda ps: resnet18_loss(_TesseraPrims, ps, x, y))(ps)
        new_p, new_m = _sgd_momentum(ps, moms, grads)
        return (loss, *new_p, *new_m)
    names = ", ".join(f"a{i}" for i in range(len(arrays)))     # (a function takes no *args)
    return ts.function(eval(f"lambda {names}: step([{names}])", {"step": step}),
                       name="resnet18_step")


@functools.lru_cache(maxsize=None)
def _torch_prims(t):
    """The step's layers for PyTorch: one class per torch module, so that torch.compile's
    guards see the same object every call (a class made per call recompiled the step each
    time until dynamo gave up at its recompile limit)."""
    F = t.nn.functional

    class P:
        conv = staticmethod(lambda x, w, s, p: F.conv2d(x, w, stride=s, padding=p))
        bn = staticmethod(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True))
        relu = staticmethod(t.relu)
        max_pool = staticmethod(lambda x: F.max_pool2d(x, 3, 2, 1))
        mean_hw = staticmethod(lambda x: x.mean(dim=(2, 3)))
        ce = staticmethod(lambda z, y: F.cross_entropy(z, y))
    return P


def resnet18_torch(t, *arrays):
    n = len(resnet18_spec())
    ps = [a.detach().requires_grad_() for a in arrays[:n]]
    moms, x, y = arrays[n:2 * n], arrays[-2], arrays[-1]
    with t.enable_grad():
        loss = resnet18_loss(_torch_prims(t), ps, x, y)
        grads = t.autograd.grad(loss, ps)
    new_p, new_m = _sgd_momentum([p.detach() for p in ps], moms, grads)
    return [loss.detach(), *new_p, *new_m]


def resnet18_reference(*arrays):
    import torch
    return [a.numpy() for a in resnet18_torch(torch, *[torch.from_numpy(a) for a in arrays])]


def resnet18_checked(outs):
    """The loss and the updated parameters, compared with the float64 reference. Not the
    momentum buffers: a ReLU whose input rounds to zero one way and to a few ulps above it the
    other passes a gradient element in one and not the other (one such element, in tessera's
    float32 on the quick run's inputs, moves a weight gradient by 8% of its largest entry;
    any float32 order can meet one); the learning rate scales that into the parameters."""
    n = len(resnet18_spec())
    return np.concatenate([np.ravel(np.asarray(o, np.float64)) for o in outs[:n + 1]])


def resnet18_flops(*arrays):
    """Forward: 2 x multiply-adds of every convolution and the classifier; training three
    times that (the data and weight gradients)."""
    x = arrays[-2]
    hw, total = x.shape[2] // 2, 0
    total += 64 * 3 * 49 * hw * hw
    hw //= 2                                             # (the max pool)
    cin = 64
    for stage, c in enumerate(RESNET_STAGES):
        for blk in range(2):
            if stage and blk == 0:
                hw //= 2
            total += c * cin * 9 * hw * hw + c * c * 9 * hw * hw
            if cin != c:
                total += c * cin * hw * hw
            cin = c
    return 3 * 2 * x.shape[0] * (total + 512 * 1000)


CASES += [
    Case("resnet18_train_step", "one ResNet-18 training step (torchvision's layers, batch norm "
         "on the batch's statistics, cross-entropy, backward, SGD with momentum), 64x64 "
         "images, batch 32 (--quick: 8)",
         "≥1.2× PyTorch eager and ≥1.0× torch.compile",
         resnet18_inputs, None, resnet18_tessera, torch=resnet18_torch,
         reference=resnet18_reference, flops=resnet18_flops, atol=2e-4, min_speedup=None,
         min_vs_torch=1.2, pack=resnet18_checked),
]


# ---- peers ----------------------------------------------------------------------------------------
def load_peers() -> dict:
    """name -> module, or name -> reason it is missing."""
    peers: dict = {}
    try:
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
        peers["torch"] = torch
    except Exception as e:                                  # noqa: BLE001 (ImportError or worse)
        peers["torch"] = "not installed" if isinstance(e, ImportError) else \
            f"n/a (import failed: {type(e).__name__}: {e})"
    try:
        import jax
        jax.config.update("jax_platforms", "cpu")
        import jax.numpy  # noqa: F401
        peers["jax"] = jax
    except Exception as e:                                  # noqa: BLE001
        peers["jax"] = "not installed" if isinstance(e, ImportError) else \
            f"n/a (import failed: {type(e).__name__}: {e})"
    try:
        import onnxruntime
        peers["onnxruntime"] = onnxruntime
    except Exception as e:                                  # noqa: BLE001
        peers["onnxruntime"] = "not installed" if isinstance(e, ImportError) else \
            f"n/a (import failed: {type(e).__name__}: {e})"
    try:
        import scipy.fft
        peers["scipy"] = scipy
    except Exception as e:                                  # noqa: BLE001
        peers["scipy"] = "not installed" if isinstance(e, ImportError) else \
            f"n/a (import failed: {type(e).__name__}: {e})"
    return peers


def _reason(e: BaseException, limit: int = 160) -> str:
    text = (getattr(e, "summary", None) or str(e)).strip().splitlines()
    text = text[0] if text else ""
    return f"{type(e).__name__}: {text[:limit]}"


@dataclass
class Impl:
    call: Callable                       # what is timed
    result: Callable                     # its output -> a NumPy array (not timed)


def _untuned(fn, arrays):
    with tunedb.using(None):            # the heuristics' knobs, whatever a database holds
        return fn(*arrays)


def tuned_impl(case: Case, arrays: Arrays, tune: dict, row: dict):
    """The case's function after a search of `tune["budget_s"]` seconds (its own database)."""
    fn, args = case.tessera, arrays
    if hasattr(fn, "inner"):            # a tessera function on views of the case's inputs
        fn, args = fn.inner, [fn.view(a) for a in arrays]
    t = time.perf_counter()
    r = ts.autotune(fn, *args, budget_s=tune["budget_s"], cache=tune["db"], progress=False)
    row["tuning"] = {"search_s": time.perf_counter() - t, "budget_s": tune["budget_s"],
                     "kernels": [{"kernel": k.name, "strategy": k.strategy,
                                  "candidates": len(k.candidates),
                                  "default_knobs": k.default_knobs, "best_knobs": k.best_knobs,
                                  "default_ms": k.default_s * 1e3, "best_ms": k.best_s * 1e3}
                                 for k in r.kernels]}
    prog = r.program
    return Impl(lambda: prog(*args), case.pack or np.asarray)


def implementations(case: Case, arrays: Arrays, peers: dict, tune: dict | None = None,
                    row: dict | None = None) -> dict:
    """name -> Impl, or name -> the reason it is not there."""
    pack = case.pack or np.asarray
    impls: dict = {"tessera": Impl(lambda: _untuned(case.tessera, arrays), pack),
                   "numpy": Impl(lambda: case.numpy(*arrays), pack) if case.numpy else
                   "n/a (no NumPy version of this case)"}
    if tune:
        try:
            impls["tuned"] = tuned_impl(case, arrays, tune, row)
        except Exception as e:                              # noqa: BLE001
            impls["tuned"] = f"error ({_reason(e)})"
    else:
        impls["tuned"] = "n/a (--tune 0)"
    if case.numpy_base is not None:
        impls["numpy base"] = Impl(lambda: case.numpy_base(*arrays), None)
    if case.tessera_base is not None:
        impls["tessera base"] = Impl(lambda: _untuned(case.tessera_base, arrays), pack)
    torch = peers.get("torch")
    if not isinstance(torch, str) and case.torch is not None:
        ta = [torch.from_numpy(a) for a in arrays]
        fn = case.torch

        def eager():
            with torch.no_grad():
                return fn(torch, *ta)
        to_np = (lambda y: pack([t.detach().numpy() for t in y])) if case.pack else \
            (lambda y: y.numpy())
        impls["torch eager"] = Impl(eager, to_np)
        try:
            torch._dynamo.reset()           # a fresh cache per case: static shapes, no recompile limit
            compiled = torch.compile(lambda *xs: fn(torch, *xs), dynamic=False)

            def run_compiled():
                with torch.no_grad():
                    return compiled(*ta)
            impls["torch.compile"] = Impl(run_compiled, to_np)
        except Exception as e:                              # noqa: BLE001
            impls["torch.compile"] = f"n/a ({_reason(e)})"
    else:
        impls["torch eager"] = impls["torch.compile"] = \
            torch if isinstance(torch, str) else "n/a (no PyTorch version of this case)"
    scipy = peers.get("scipy")
    if case.scipy is not None:
        impls["scipy"] = scipy if isinstance(scipy, str) else \
            Impl(lambda: case.scipy(scipy, *arrays), pack)
    ort = peers.get("onnxruntime")
    if case.onnxruntime is not None:
        impls["onnxruntime"] = ort if isinstance(ort, str) else \
            Impl(case.onnxruntime(ort, *arrays), lambda y: pack(y[0]))
    jax = peers.get("jax")
    if not isinstance(jax, str) and case.jax is not None:
        ja = [jax.device_put(a) for a in arrays]
        jitted = jax.jit(lambda *xs: case.jax(jax.numpy, *xs))
        impls["jax.jit"] = Impl(lambda: jax.block_until_ready(jitted(*ja)),
                                lambda y: pack([np.asarray(a) for a in y]) if case.pack
                                else np.asarray(y))
    else:
        impls["jax.jit"] = jax if isinstance(jax, str) else "n/a (no JAX version of this case)"
    return impls


# ---- one case -------------------------------------------------------------------------------------
def run_case(case: Case, rng, repeat: int, quick: bool, peers: dict, peaks: dict | None,
             tune: dict | None = None) -> dict:
    arrays = case.inputs(rng, quick)
    if not isinstance(case.tessera, ts.Function):
        case.tessera = case.tessera(*arrays)
    row: dict = {"case": case.name, "what": case.what, "goal": case.goal,
                 **({"tessera_base": case.tessera_base_name} if case.tessera_base else {}),
                 "shapes": [list(a.shape) for a in arrays], "tolerance": case.atol,
                 "times_ms": {}, "min_ms": {}, "spread": {}, "first_call_ms": {}, "status": {},
                 "errors": {}}
    want = (case.reference or case.numpy)(*[a.astype(np.float64) if a.dtype.kind == "f" else a
                                            for a in arrays])
    want = np.asarray((case.pack or np.asarray)(want), np.float64)
    scale = float(np.abs(want).max()) or 1.0
    impls = implementations(case, arrays, peers, tune, row)
    live, warm = {}, {}
    for name, impl in impls.items():
        if isinstance(impl, str):
            row["status"][name] = impl
            continue
        try:
            stats0 = ts.cache_stats() if name == "tessera" else None
            t = time.perf_counter()
            got = impl.call()                               # traces and compiles
            row["first_call_ms"][name] = (time.perf_counter() - t) * 1e3
            if stats0 is not None:
                stats1 = ts.cache_stats()
                row["tessera_cache"] = {k: stats1[k] - stats0.get(k, 0) for k in stats1
                                        if isinstance(stats1[k], (int, float))}
            t = time.perf_counter()
            impl.call()
            warm[name] = time.perf_counter() - t
        except Exception as e:                              # noqa: BLE001
            row["status"][name] = ("n/a" if name == "torch.compile" else "error") + \
                f" ({_reason(e)})"
            row["errors"][name] = traceback.format_exc(limit=-6)
            continue
        if impl.result is None:                             # a baseline, not the same result
            row["status"][name] = "ok"
        else:
            try:
                y = np.asarray(impl.result(got), np.float64)
                if y.shape != want.shape:
                    row["status"][name] = f"MISMATCH (shape {y.shape}, want {want.shape})"
                else:
                    err = float(np.nanmax(np.abs(y - want))) / scale
                    if not np.isfinite(y).all():
                        err = float("inf")
                    row.setdefault("error_vs_reference", {})[name] = err
                    row["status"][name] = "ok" if err <= case.atol else \
                        f"MISMATCH (max error {err:.1e} of the magnitude > {case.atol:.0e})"
            except Exception as e:                          # noqa: BLE001
                row["status"][name] = f"MISMATCH ({_reason(e)})"
        live[name] = impl
    samples: dict = {name: [] for name in live}
    cpu0 = cpu_snapshot()
    for _ in range(repeat):                                 # interleaved rounds
        for name, impl in live.items():
            time.sleep(SETTLE_S)
            try:
                if warm[name] < WAKE_BELOW_S:               # wake its threads, untimed
                    t = time.perf_counter()
                    for _ in range(WAKE_CALLS):
                        impl.call()
                        if time.perf_counter() - t > WAKE_S:
                            break
                t = time.perf_counter()
                impl.call()
                samples[name].append(time.perf_counter() - t)
            except Exception as e:                          # noqa: BLE001
                row["status"][name] = f"error ({_reason(e)})"
    row["others_cpu_share"] = others_cpu_share(cpu0, cpu_snapshot())
    for name, s in samples.items():
        if s:
            med = statistics.median(s)
            row["times_ms"][name] = med * 1e3
            row["min_ms"][name] = min(s) * 1e3
            row["spread"][name] = (max(s) - min(s)) / med
            row.setdefault("samples_ms", {})[name] = [x * 1e3 for x in s]
    ratios_and_goal(case, row, arrays, peaks)
    row["kernels"] = profile(case, arrays) if "tessera" in row["times_ms"] else None
    return row


def ratios_and_goal(case: Case, row: dict, arrays: Arrays, peaks: dict | None) -> None:
    times = row["times_ms"]
    tt = times.get("tessera")
    if tt is None:
        row["goal_met"], row["goal_detail"] = False, ["✗ tessera did not run"]
        return
    peer_times = {p: times[p] for p in PEERS if p in times}
    mins = row["min_ms"]
    if "tuned" in times:
        row["speedup_tuned_vs_default"] = tt / times["tuned"]
    if "numpy" in times:
        row["speedup_vs_numpy"] = times["numpy"] / tt
        row["speedup_vs_numpy_by_min"] = mins["numpy"] / mins["tessera"]
    if peer_times:
        best = min(peer_times, key=peer_times.get)
        row["best_peer"], row["speedup_vs_best_peer"] = best, peer_times[best] / tt
        row["speedup_vs_best_peer_by_min"] = min(mins[p] for p in peer_times) / mins["tessera"]
    if case.flops:
        row["tessera_gflops"] = case.flops(*arrays) / tt / 1e6
        row["integer_ops"], row["pair_dots"] = case.integer_ops, case.pair_dots
        if peaks and not case.integer_ops and not case.pair_dots:
            row["tessera_peak_share"] = row["tessera_gflops"] / peaks["fma_gflops"]
    if case.bytes:
        row["tessera_gbs"] = case.bytes(*arrays) / tt / 1e6
        if peaks:
            row["tessera_bandwidth_share"] = row["tessera_gbs"] / peaks["copy_gbs"]
    # the goal: every part met -> True; one part missed -> False; otherwise unknown (None)
    parts = []
    base_name = "numpy base" if case.numpy_base else "numpy"
    base = times.get(base_name)
    if case.min_speedup is None:
        pass                                 # the goal names no NumPy ratio
    elif base is None:
        parts.append((None, f"NumPy ({base_name}) did not run"))
    else:
        r = base / tt
        if case.numpy_base is None:
            parts.append((r >= case.min_speedup, f"{r:.2f}× NumPy (goal ≥{case.min_speedup:g}×)"))
        else:
            parts.append((r > 1.0, f"{r:.2f}× NumPy's matmul alone (goal >1×)"))
    if case.min_bandwidth is not None:
        share = row.get("tessera_bandwidth_share")
        parts.append((None, "copy bandwidth unknown (no tessera.machine_peaks)") if share is None
                     else (share >= case.min_bandwidth,
                           f"{100 * share:.0f}% of copy bandwidth (goal ≥{100 * case.min_bandwidth:.0f}%)"))
    for goal, group, who in ((case.min_vs_peers, ("numpy",) + PEERS, "the best peer"),
                             (case.min_vs_torch, TORCH, "PyTorch's best")):
        if goal is None:
            continue
        rivals = {p: times[p] for p in group if p in times}
        if not rivals:
            parts.append((None, f"{who}: none ran"))
            continue
        best = min(rivals, key=rivals.get)
        r = rivals[best] / tt
        parts.append((r >= goal, f"{r:.2f}× {who} ({best}) (goal ≥{goal:g}×)"))
    if case.max_vs_base is not None:
        base_t = times.get("tessera base")
        if base_t is None:
            parts.append((None, f"tessera's {case.tessera_base_name} did not run"))
        else:
            r = row["time_vs_tessera_base"] = tt / base_t
            parts.append((r <= case.max_vs_base, f"{r:.2f}× the time of tessera's "
                          f"{case.tessera_base_name} (goal ≤{case.max_vs_base:g}×)"))
    if case.min_peak_share is not None:
        share = row.get("tessera_peak_share")
        parts.append((None, "FMA peak unknown (no tessera.machine_peaks)") if share is None
                     else (share >= case.min_peak_share, f"{100 * share:.0f}% of the FMA peak "
                           f"(goal ≥{100 * case.min_peak_share:.0f}%)"))
    if row["status"].get("tessera") != "ok":
        parts.append((False, "tessera's result is wrong"))
    oks = [ok for ok, _ in parts]
    # (a case only side by side has no part: nothing to meet, not "met")
    row["goal_met"] = False if False in oks else (None if None in oks or not oks else True)
    row["goal_detail"] = [("✓ " if ok else "✗ " if ok is False else "? ") + text
                          for ok, text in parts]


MAX_KERNELS = 64                      # kernels a row keeps in the JSON


def profile(case: Case, arrays: Arrays):
    """tessera's per-kernel breakdown, where tessera has a profiler."""
    if not hasattr(ts, "profiler"):
        return None
    try:
        with ts.profiler() as prof:
            for _ in range(3):                              # as the timed rounds run it
                time.sleep(SETTLE_S)
                with ts.profiler():                         # the innermost records: not this call
                    case.tessera(*arrays)
                case.tessera(*arrays)
        if hasattr(prof, "rows"):
            rows = prof.rows()
        elif hasattr(prof, "to_pandas"):
            rows = prof.to_pandas().to_dict("records")
        else:
            return {"summary": str(prof.summary(print_it=False))}
        keep = ("kernel", "strategy", "fuses", "calls", "median_ms", "gflops", "gbs",
                "peak_pct", "bandwidth_pct")
        rows = [{k: r[k] for k in keep if k in r} for r in rows]
        if len(rows) > MAX_KERNELS:      # (a training step has a thousand: the slowest kept)
            rows.sort(key=lambda r: -r.get("median_ms", 0))
            rest = rows[MAX_KERNELS:]
            rows = rows[:MAX_KERNELS] + [{
                "kernel": f"({len(rest)} more)", "strategy": "", "calls": len(rest),
                "median_ms": sum(r.get("median_ms", 0) for r in rest)}]
        return rows
    except Exception as e:                                  # noqa: BLE001
        return {"error": _reason(e)}


def cpu_snapshot():
    """(seconds the whole machine's CPUs were busy, CPU seconds of this process and its threads,
    wall seconds), to tell how much of the machine other processes took during a case."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system, time.perf_counter()


def others_cpu_share(a, b):
    """The share of all cores that other processes used between two snapshots (0 to 1)."""
    if a is None or b is None or b[2] <= a[2]:
        return None
    others = (b[0] - a[0]) - (b[1] - a[1])
    return max(0.0, others / ((b[2] - a[2]) * (os.cpu_count() or 1)))


def wait_quiet(limit_s: float, share: float = 0.10) -> float | None:
    """Wait (at most limit_s) until other processes take under `share` of the cores for 2 s;
    return the share last seen."""
    end, seen = time.perf_counter() + limit_s, None
    while True:
        a = cpu_snapshot()
        time.sleep(2.0)
        seen = others_cpu_share(a, cpu_snapshot())
        if seen is None or seen < share or time.perf_counter() >= end:
            return seen


# ---- the machine ----------------------------------------------------------------------------------
def _run(*cmd) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def machine(peers: dict) -> dict:
    info: dict = {"host": socket.gethostname(), "platform": platform.platform(),
                  "python": platform.python_version(),
                  "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  "cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0))
                  if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                  "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                     "MKL_NUM_THREADS", "TESSERA_CACHE_DIR",
                                                     "TESSERA_NO_CACHE", *AS_AVX2)
                          if k in os.environ}}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                           if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                     if line.startswith("flags"))
        info["simd"] = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl")
                        if f in flags]
        ids = {k: next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                        if line.split(":")[0].strip() == k), "?") for k in ("cpu family", "model")}
        # which generation ("AMD EPYC" alone does not say): AMD's Zen 3 and 4 are family 25,
        # Zen 5 is 26; Intel's cores are family 6, the model telling them apart
        info["cpu_id"] = f"family {ids['cpu family']} model {ids['model']}"
    except (OSError, StopIteration):
        info["cpu"] = platform.processor() or "?"
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                   / 2 ** 30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    info["load_at_start"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    info["cc"] = (_run(os.environ.get("CC", "cc"), "--version").splitlines() or ["?"])[0]
    from tessera.runtime import isa
    info["isa_level"] = isa.default_level()             # what tessera's CPU code is built for
    info["host_isa_level"] = isa.host_level()
    # the micro-kernels programs use here: the GEMM's ($TESSERA_GEMM_SHAPE) and the direct
    # convolution's ($TESSERA_CONV_SHAPE)
    from tessera.compiler.target import c as target_c
    from tessera.compiler.target import gemm_shape as gs
    for kernel, chosen in (("gemm", target_c.gemm_shape), ("conv", target_c.conv_shape)):
        try:
            level, fam = info["isa_level"], gs.family(info["isa_level"])
            used = chosen(level) or (gs.CANDIDATES[fam][0] if fam else None)
            info[f"{kernel}_shape"] = {"shape": "x".join(map(str, used)) if used else "one shape"}
            if fam and isa.runs_here(level):
                info[f"{kernel}_shape"]["measured"] = ts.gemm_shape_report(
                    level, kernel=kernel)["gflops"]
        except Exception as e:                              # noqa: BLE001
            info[f"{kernel}_shape"] = {"shape": f"? ({_reason(e)})"}
    # tessera
    info["tessera"] = getattr(ts, "__version__", "?")
    info["tessera_rev"] = _run("git", "rev-parse", "HEAD").strip() or "unknown"
    dirty = _run("git", "diff-index", "--name-only", "HEAD", "--").split()
    info["tessera_uncommitted"] = dirty     # measured with these files changed from the revision
    # NumPy and its BLAS
    info["numpy"] = np.__version__
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["numpy_blas"] = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
        info["numpy_blas_config"] = blas.get("openblas configuration", "")
    except Exception:                                       # noqa: BLE001
        info["numpy_blas"] = "?"
    # the peers
    for name in ("torch", "jax"):
        mod = peers.get(name)
        info[name] = mod if isinstance(mod, str) else mod.__version__
    torch = peers.get("torch")
    if not isinstance(torch, str):
        try:
            cfg = torch.__config__.show()
            blas = next((p.split("=", 1)[1] for p in cfg.replace(",", " ").split()
                         if p.startswith("BLAS_INFO=")), "?")
            info["torch_build"] = {"blas": blas, "mkldnn": torch.backends.mkldnn.is_available(),
                                   "cuda_build": torch.version.cuda,
                                   "threads": torch.get_num_threads()}
        except Exception as e:                              # noqa: BLE001
            info["torch_build"] = {"error": _reason(e)}
    jax = peers.get("jax")
    if not isinstance(jax, str):
        try:
            import jaxlib
            info["jaxlib"] = jaxlib.__version__
            info["jax_devices"] = [str(d) for d in jax.devices()]
        except Exception as e:                              # noqa: BLE001
            info["jax_devices"] = _reason(e)
    return info


def machine_peaks() -> tuple[dict | None, str]:
    if not hasattr(ts, "machine_peaks"):
        return None, "n/a (no tessera.machine_peaks)"
    try:
        p = ts.machine_peaks()
        return {"fma_gflops": float(p["fma_gflops"]), "copy_gbs": float(p["copy_gbs"])}, \
            f"measured peaks {p['fma_gflops']:.0f} GFLOP/s FMA, {p['copy_gbs']:.1f} GB/s copy"
    except Exception as e:                                  # noqa: BLE001
        return None, f"peaks n/a ({_reason(e)})"


# ---- the report -----------------------------------------------------------------------------------
COLUMNS = ("tessera", "tuned", "numpy") + PEERS


def _cell(row: dict, name: str, width: int) -> str:
    if name in row["times_ms"]:
        flag = "" if row["status"].get(name) == "ok" else "!"
        return f"{row['times_ms'][name]:.2f}{flag}".rjust(width)
    status = row["status"].get(name, "")
    short = "n/i" if status == "not installed" else "err" if status.startswith("error") \
        else "n/a" if status.startswith("n/a") else "-"
    return short.rjust(width)


def print_table(rows: list, info: dict, peaks_text: str, out=sys.stdout) -> None:
    p = lambda *a: print(*a, file=out)                      # noqa: E731
    level = info.get("isa_level", "?")
    built = f"tessera built for {level}" + (
        f" (this CPU runs {info['host_isa_level']})" if info.get("host_isa_level") != level
        else "")
    if all(info.get("env", {}).get(k) == v for k, v in AS_AVX2.items()):
        built += "; every peer held to AVX2 (--as-avx2)"
    if info.get("gemm_shape"):
        built += f", GEMM micro-kernel {info['gemm_shape']['shape']}"
    if info.get("conv_shape"):
        built += f", direct convolution's {info['conv_shape']['shape']}"
    p(f"\n{info['cpu']} ({info.get('cpu_id', '?')}), {info['cores']} cores "
      f"({', '.join(info.get('simd', []))}); {built}; {peaks_text}")
    p(f"numpy {info['numpy']} ({info['numpy_blas']}); torch {info['torch']}; jax {info['jax']}; "
      f"tessera {info['tessera_rev'][:10]}"
      + (f" + {len(info['tessera_uncommitted'])} uncommitted files"
         if info.get("tessera_uncommitted") else ""))
    if info.get("load_at_start") and info["load_at_start"][0] > 0.5:
        p(f"!! load average {info['load_at_start'][0]:.2f} at the start: other processes share "
          f"the {info['cores']} cores, times are noisy")
    if info.get("others_cpu_share") is not None and info["others_cpu_share"] > 0.05:
        p(f"!! other processes used {100 * info['others_cpu_share']:.0f}% of the cores during "
          f"the run: a quiet machine gives steadier numbers")
    p("times: median ms of the interleaved rounds; ×numpy and ×peer: how many times faster "
      "tessera is (>1: tessera faster); ! = result wrong, n/i = not installed")
    w = 14
    head = f"{'case':<18}" + "".join(c.rjust(w) for c in COLUMNS) + \
        f"{'×numpy':>9}{'×peer':>8}  goal"
    p(head)
    p("-" * len(head))
    for r in rows:
        if "fatal" in r:
            p(f"{r['case']:<18}  !! the case failed: {r['fatal']}")
            continue
        sp, bp = r.get("speedup_vs_numpy"), r.get("speedup_vs_best_peer")
        goal = "-" if r.get("goal_detail") == [] else \
            {True: "met", False: "no", None: "?"}[r.get("goal_met")]
        p(f"{r['case']:<18}" + "".join(_cell(r, c, w) for c in COLUMNS)
          + (f"{sp:>8.2f}×" if sp else f"{'-':>9}") + (f"{bp:>7.2f}×" if bp else f"{'-':>8}")
          + f"  {goal}")
        facts = []
        if "tessera" in r["first_call_ms"]:
            c = r.get("tessera_cache", {})
            how = "compiled" if c.get("compiles") else "disk cache" if c.get("disk_hits") else ""
            facts.append(f"first call {r['first_call_ms']['tessera']:.0f} ms"
                         + (f" ({how})" if how else ""))
        if "tessera" in r["min_ms"]:
            facts.append(f"min {r['min_ms']['tessera']:.2f} ms, spread "
                         f"{100 * r['spread']['tessera']:.0f}%")
        if "tessera_gflops" in r:
            share = r.get("tessera_peak_share")
            facts.append(f"{r['tessera_gflops']:.0f} GOP/s (integer; no FMA peak)"
                         if r.get("integer_ops") else
                         f"{r['tessera_gflops']:.0f} GFLOP/s (bf16 pairs; no FMA peak)"
                         if r.get("pair_dots") else
                         f"{r['tessera_gflops']:.0f} GFLOP/s"
                         + (f" ({100 * share:.0f}% of peak)" if share is not None else
                            " (peak n/a)"))
        if "tessera_gbs" in r:
            share = r.get("tessera_bandwidth_share")
            facts.append(f"{r['tessera_gbs']:.1f} GB/s"
                         + (f" ({100 * share:.0f}% of copy)" if share is not None else
                            " (copy n/a)"))
        if r.get("tuning"):
            tn = r["tuning"]
            changed = []
            for k in tn["kernels"]:
                diff = {n: v for n, v in k["best_knobs"].items()
                        if k["default_knobs"].get(n) != v}
                changed.append(f"{k['kernel']} {diff or 'default knobs'}")
            gain = r.get("speedup_tuned_vs_default")
            facts.append(f"tuned {gain:.2f}× the default" if gain else "tuned: no time")
            facts.append(f"search {tn['search_s']:.0f} s: " + "; ".join(changed[:3]))
        if "numpy base" in r["times_ms"]:
            facts.append(f"NumPy matmul alone {r['times_ms']['numpy base']:.2f} ms")
        if "tessera base" in r["times_ms"]:
            facts.append(f"tessera's {r.get('tessera_base', 'own routine')} "
                         f"{r['times_ms']['tessera base']:.2f} ms")
        if bp:
            facts.append(f"best peer {r['best_peer']}")
        if r.get("speedup_vs_numpy_by_min"):
            facts.append(f"by min: {r['speedup_vs_numpy_by_min']:.2f}× numpy"
                         + (f", {r['speedup_vs_best_peer_by_min']:.2f}× peer"
                            if r.get("speedup_vs_best_peer_by_min") else ""))
        if facts:
            p(f"{'':<4}tessera: " + "; ".join(facts))
        p(f"{'':<4}goal {r['goal']}: " + "; ".join(r.get("goal_detail", [])))
        if isinstance(r.get("kernels"), list) and r["kernels"]:
            ks = [f"{k.get('kernel')} [{k.get('strategy')}] {k.get('median_ms', 0):.2f} ms"
                  for k in r["kernels"]]
            p(f"{'':<4}kernels: " + ", ".join(ks[:6]) + (f" (+{len(ks) - 6} more)"
                                                          if len(ks) > 6 else ""))
        others = r.get("others_cpu_share")
        if others is not None and others > 0.05:
            p(f"{'':<4}!! other processes used {100 * others:.0f}% of the cores during the "
              f"timed rounds: these times are disturbed")
        for name, s in r["status"].items():
            if s.startswith("MISMATCH"):
                p(f"{'':<4}!! {name}: {s}")
            elif s.startswith(("error", "n/a")) and s not in (
                    "n/a (no PyTorch version of this case)", "n/a (no JAX version of this case)"):
                p(f"{'':<4}{name}: {s}")
    for name, why in PENDING.items():
        p(f"{name:<18}  not a case yet: {why}")


# An AVX2-only machine on an AVX-512 one: tessera's code for x86-64-v3, and each peer's own switch
# (PyTorch's ATen kernels and torch.compile's C++, oneDNN, MKL, XLA's code generator, NumPy's
# dispatched loops, OpenBLAS's kernels). What a peer picks without a switch (XLA's library calls)
# may still use AVX-512: the JSON's machine.env records the settings.
AS_AVX2 = {"TESSERA_CPU_TARGET": "x86-64-v3", "ATEN_CPU_CAPABILITY": "avx2",
           "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
           "XLA_FLAGS": "--xla_cpu_max_isa=AVX2",
           "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
           "OPENBLAS_CORETYPE": "Haswell"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench",
        description="Time tessera against NumPy, PyTorch eager, torch.compile and jax.jit (those "
                    "installed); print ratios and write JSON to benchmarks/results/.")
    ap.add_argument("--only", help="comma-separated case names (--list shows them)")
    ap.add_argument("--repeat", type=int, default=7, help="interleaved rounds (default 7)")
    ap.add_argument("--quick", action="store_true", help="smaller shapes")
    ap.add_argument("--json", help="where to write the results "
                                   "(default benchmarks/results/<date>-<host>.json)")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="before each case, wait up to S seconds for other processes to leave "
                         "the cores (under 10%% of them for 2 s)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--tune", type=float, default=20, metavar="S",
                    help="autotuning budget per case in seconds for the 'tuned' column "
                         "(default 20; 0: no tuned column)")
    ap.add_argument("--tune-db", metavar="PATH",
                    help="autotuning database to use (default: a fresh one for this run, so "
                         "the column shows what a search within the budget finds)")
    ap.add_argument("--as-avx2", action="store_true",
                    help="measure as an AVX2-only machine would: tessera's x86-64-v3 target "
                         "and every peer held to AVX2 (see AS_AVX2)")
    args = ap.parse_args(argv)
    if args.as_avx2 and any(os.environ.get(k) != v for k, v in AS_AVX2.items()):
        # the peers read these when they are imported, and NumPy is already: start again
        os.environ.update(AS_AVX2)
        os.execv(sys.executable, [sys.executable, "-m", "benchmarks.bench",
                                  *(sys.argv[1:] if argv is None else argv)])
    if args.list:
        for c in CASES:
            print(f"{c.name:<18} {c.what}\n{'':<18} goal: {c.goal}")
        for name, why in PENDING.items():
            print(f"{name:<18} (not yet) {why}")
        return 0
    cases = CASES
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in {c.name for c in CASES}]
        if unknown:
            ap.error(f"no case named {', '.join(unknown)}; cases: "
                     f"{', '.join(c.name for c in CASES)}")
        cases = [c for c in CASES if c.name in wanted]
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    peers = load_peers()
    info = machine(peers)
    peaks, peaks_text = machine_peaks()
    info["peaks"] = peaks
    rng = np.random.default_rng(0)
    tune = None
    if args.tune > 0:
        db = args.tune_db or os.path.join(tempfile.mkdtemp(prefix="tessera-bench-"),
                                          "autotune.sqlite")
        tune = {"budget_s": args.tune, "db": db}
        info["autotune"] = tune
    rows = []
    t0 = time.perf_counter()
    cpu0 = cpu_snapshot()
    for case in cases:
        print(f"[bench] {case.name} ...", file=sys.stderr, flush=True)
        if args.wait_quiet > 0:
            seen = wait_quiet(args.wait_quiet)
            if seen is not None and seen >= 0.10:
                print(f"[bench] still busy ({100 * seen:.0f}% of the cores taken by others); "
                      "going on", file=sys.stderr, flush=True)
        t = time.perf_counter()
        try:
            row = run_case(case, rng, args.repeat, args.quick, peers, peaks, tune)
        except Exception as e:                              # noqa: BLE001
            row = {"case": case.name, "goal": case.goal, "fatal": _reason(e),
                   "traceback": traceback.format_exc()}
        row["wall_s"] = time.perf_counter() - t
        rows.append(row)
    info["load_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    info["others_cpu_share"] = others_cpu_share(cpu0, cpu_snapshot())
    print_table(rows, info, peaks_text)
    suffix = ("-quick" if args.quick else "") + ("-partial" if args.only else "")
    out = Path(args.json) if args.json else \
        RESULTS / f"{info['date'][:10]}-{info['host']}{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": info, "quick": args.quick, "repeat": args.repeat,
                               "settle_s": SETTLE_S, "wall_s": time.perf_counter() - t0,
                               "pending": PENDING, "results": rows},
                              indent=1, default=str, ensure_ascii=False) + "\n")
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
