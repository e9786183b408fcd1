"""Deterministic parameter initialisation from a seed.

A ``Key`` is a 64-bit integer. A module's parameters come from its key, and a submodule's or a
parameter's key from its parent's key and its name (``key.child("w")``), so every tensor has its
own stream: adding a parameter does not shift the values of the others, and the result does not
depend on the order in which parameters are drawn. The numbers come from the same counter-based
generator as ``op.random_uniform`` (SplitMix64, tessera/ops/random.py) evaluated with NumPy's
integer arithmetic, so they are the same on every machine and every NumPy version (unlike
``numpy.random.Generator`` streams, which NumPy does not promise to keep).

Distributions (PyTorch's defaults, so models port over with their usual scales):
- ``uniform(shape, lo, hi)``: lo + (hi - lo) * u, u with 53 random bits, in float64, then cast;
- ``normal(shape, std)``: Box-Muller over pairs of uniforms, in float64, then cast;
- ``kaiming_uniform(shape, fan_in, a=sqrt(5))``: U(-b, b), b = sqrt(6 / ((1 + a^2) fan_in)),
  which for PyTorch's a = sqrt(5) is 1/sqrt(fan_in) (nn.Linear's weight and bias);
- ``xavier_uniform(shape, fan_in, fan_out)``: U(-b, b), b = sqrt(6 / (fan_in + fan_out)).
"""
from __future__ import annotations

import math
import zlib

import numpy as np

from ..ops.random import GAMMA, M1, M2, random_bits

_MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    """SplitMix64's finaliser on a Python int (mod 2**64)."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * M1) & _MASK
    z = ((z ^ (z >> 27)) * M2) & _MASK
    return z ^ (z >> 31)


def _as_u64(x) -> int:
    if isinstance(x, str):
        x = zlib.crc32(x.encode()) | (len(x) << 32)       # stable across runs (unlike hash())
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"a seed or key name must be an int or a str, not {x!r}")
    return int(x) & _MASK


class Key:
    """A node in the tree of random streams: ``Key(seed).child("layers").child(0)``."""
    __slots__ = ("value",)

    def __init__(self, seed=0):
        self.value = seed.value if isinstance(seed, Key) else _as_u64(seed)

    def child(self, name) -> "Key":
        k = Key.__new__(Key)
        k.value = _mix(self.value ^ _mix(_as_u64(name) + GAMMA))
        return k

    def __repr__(self):
        return f"Key({self.value:#018x})"

    # -- draws ------------------------------------------------------------------------------------
    def bits(self, n: int) -> np.ndarray:
        return random_bits(np.uint64(self.value), np.arange(n, dtype=np.uint64))

    def uniform(self, shape, lo=0.0, hi=1.0, dtype=np.float32) -> np.ndarray:
        shape = tuple(shape)
        u = (self.bits(math.prod(shape)) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        return (lo + (hi - lo) * u).reshape(shape).astype(dtype)

    def normal(self, shape, std=1.0, mean=0.0, dtype=np.float32) -> np.ndarray:
        shape = tuple(shape)
        n = math.prod(shape)
        b = self.bits(2 * ((n + 1) // 2)) >> np.uint64(11)
        u1 = (b[0::2].astype(np.float64) + 1) * 2.0 ** -53          # (0, 1]: log is finite
        u2 = b[1::2].astype(np.float64) * 2.0 ** -53
        r = np.sqrt(-2.0 * np.log(u1))
        z = np.stack([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)], -1).reshape(-1)
        return (mean + std * z[:n]).reshape(shape).astype(dtype)


def as_key(seed) -> Key:
    return seed if isinstance(seed, Key) else Key(seed)


def zeros(shape, dtype=np.float32) -> np.ndarray:
    return np.zeros(tuple(shape), dtype=dtype)


def ones(shape, dtype=np.float32) -> np.ndarray:
    return np.ones(tuple(shape), dtype=dtype)


def uniform(key, shape, lo=0.0, hi=1.0, dtype=np.float32) -> np.ndarray:
    return as_key(key).uniform(shape, lo, hi, dtype)


def normal(key, shape, std=1.0, dtype=np.float32) -> np.ndarray:
    return as_key(key).normal(shape, std, dtype=dtype)


def kaiming_uniform(key, shape, fan_in, a=math.sqrt(5), dtype=np.float32) -> np.ndarray:
    bound = math.sqrt(6.0 / ((1.0 + a * a) * fan_in)) if fan_in else 0.0
    return uniform(key, shape, -bound, bound, dtype)


def xavier_uniform(key, shape, fan_in, fan_out, gain=1.0, dtype=np.float32) -> np.ndarray:
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out)) if fan_in + fan_out else 0.0
    return uniform(key, shape, -bound, bound, dtype)
