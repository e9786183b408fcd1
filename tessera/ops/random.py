"""Counter-based random numbers: ``random_uniform(seed, counter)``.

A stateless generator: the number for an element is a pure function of (seed, counter), so the
same seed gives the same numbers on every run, for every thread count, in every kernel that
fuses it, and in the NumPy reference (which computes the same integer hash, bit for bit).

The generator is SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014) used as a counter-based one: its n-th output from the state ``s`` is
``mix64(s + n * GAMMA)``, so any element can be computed on its own. The state is the seed
passed through ``mix64`` first, so seeds 0, 1, 2, ... give unrelated streams (not shifted
copies of one another). Output n of seed s:

    bits = mix64(mix64(s) + (n + 1) * GAMMA)                     (all arithmetic mod 2**64)
    float32: (bits >> 40) * 2**-24,  float64: (bits >> 11) * 2**-53       -- in [0, 1)

The float conversions are exact (a 24- or 53-bit integer times a power of two), so compiled and
reference results agree bitwise. Counters are the caller's business: ``op.random_uniform``
builds the row-major element index plus an offset; distinct (seed, counter) pairs never collide
within a stream of 2**64 numbers.

It is an elementwise operator over two integer operands (broadcasting as usual), so it fuses
into whatever consumes it (dropout's mask is computed inside the kernel that applies it).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError
from .elementwise import elementwise

GAMMA = 0x9E3779B97F4A7C15
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB
_U64 = (1 << 64) - 1

def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (NumPy wraps uint64 arithmetic mod 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(M2)
    return z ^ (z >> np.uint64(31))


def random_bits(seed, counter) -> np.ndarray:
    """The 64 random bits for (seed, counter), as uint64: the generator's NumPy form."""
    with np.errstate(over="ignore"):
        s = mix64(np.asarray(seed).astype(np.uint64))
        n = np.asarray(counter).astype(np.uint64)
        return mix64(s + (n + np.uint64(1)) * np.uint64(GAMMA))


def _reference(arrays, attrs):
    bits = random_bits(arrays[0], arrays[1])
    if attrs["dtype"] == "float64":
        return (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return ((bits >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)).astype(np.float32)


def _dtype_rule(ds, attrs):
    out = dt.get(attrs.get("dtype") or "float32")
    if out not in (dt.float32, dt.float64):
        raise DTypeError("random_uniform makes float32 or float64", received=out.name)
    ins = []
    for name, d in zip(("seed", "counter"), ds):
        if isinstance(d, dt.DType):
            if not d.is_int:
                raise DTypeError(f"random_uniform's {name} must be an integer tensor",
                                 expected="i32 or i64", received=d.short)
            ins.append(d)
        elif isinstance(d, int) and not isinstance(d, bool):
            ins.append(dt.int64)          # a Python int: the seed or counter as int64
        else:
            raise DTypeError(f"random_uniform's {name} must be an integer, not {d!r}")
    return ins, out


_op = elementwise(
    "random_uniform", 2, _dtype_rule, _reference, flops=12, attrs={"dtype": "float32"},
    doc="uniform [0, 1) numbers from (seed, counter) by counter-based SplitMix64; "
        "op.random_uniform(shape, seed, offset) builds the counters")
_op.differentiable = False
_op.normalize = lambda ts, a: {"dtype": dt.get(a.get("dtype") or "float32").name}


# ---- stochastic rounding ----------------------------------------------------------------------
# round_stochastic(x, seed, counter, dtype=<narrow float>): x (float32) rounded to one of its two
# neighbours in the narrow format, the one farther from zero with probability |x - nearer| /
# |farther - nearer|, from the uniform float32 that random_uniform gives for (seed, counter).
# The probability is an exact quotient (the neighbours' distance is a power of two) compared
# with a 24-bit uniform, so the result is unbiased wherever that quotient has at most 24
# fractional bits (every normal x). Beyond the largest finite value, and for NaN, it rounds as
# the nearest-even cast does. (Its C: sround.h beside half.h, strategies/routines/.)
def _sround_rule(ds, attrs):
    out = dt.get(attrs.get("dtype") or "float16")
    out.np          # bf16 and fp8 need ml_dtypes: say so at this operator
    if not out.is_narrow:
        raise DTypeError("round_stochastic rounds to a 16-bit or fp8 float",
                         expected="float16, bfloat16, float8_e4m3fn or float8_e5m2",
                         received=out.name)
    x = ds[0]
    if isinstance(x, dt.DType) and not x.is_float:
        raise DTypeError("round_stochastic rounds a float tensor", received=x.short)
    ins, _ = _dtype_rule(ds[1:], {})
    return [dt.float32] + ins, out


def _sround_reference(arrays, attrs):
    out = dt.get(attrs["dtype"]).np
    x = np.asarray(arrays[0], np.float32)
    u = _reference([arrays[1], arrays[2]], {"dtype": "float32"})
    x, u = np.broadcast_arrays(x, u)
    w = x.astype(out)
    wf = w.astype(np.float32)
    ubits = np.dtype(f"uint{8 * out.itemsize}")
    b = w.view(ubits)
    step = np.where(np.abs(wf) < np.abs(x), 1, -1).astype(np.int64)
    o = (b.astype(np.int64) + step).astype(ubits).view(out).astype(np.float32)
    up = np.abs(wf) < np.abs(o)
    lo, hi = np.where(up, wf, o), np.where(up, o, wf)
    big = np.float32(np.finfo(np.float32).max)
    plain = (wf == x) | ~(np.abs(wf) <= big) | ~(np.abs(o) <= big)
    with np.errstate(all="ignore"):
        p = np.abs(x - lo) / np.abs(hi - lo)
    return np.where(plain, wf, np.where(u < p, hi, lo)).astype(out)


_op = elementwise(
    "round_stochastic", 3, _sround_rule, _sround_reference, flops=16, attrs={"dtype": None},
    doc="x rounded to a narrow float dtype stochastically (unbiased) from the counter-based "
        "stream (seed, counter): numerical policies' rounding=\"stochastic\"")
# straight through, as a cast: the rounding's expected value is x
_op.vjp = lambda b, xs, y, g, a: [b.op("cast", g, dtype=xs[0].dtype.name), None, None]
_op.normalize = lambda ts, a: {"dtype": dt.get(a.get("dtype") or "float16").name}
