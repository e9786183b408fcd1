"""16-bit floats (float16, bfloat16) end to end: storage types computed in float32 and rounded
once per operator (tessera/dtypes.py). Every float operator on the CPU, and the main strategies
for CUDA and HIP through the CPU emulator of the GPU thread model, against float32 NumPy rounded
to the 16-bit type; the promotion rules; the conversions on every 16-bit pattern; determinism."""
import os
import shutil
import sys

import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera import op, ops
from tessera.errors import DTypeError

from conftest import TOL, attention_reference
from cases import EXAMPLES, normal_attrs

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes (the bf16 extra)")
HALVES = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}


@pytest.fixture(params=sorted(HALVES))
def half(request):
    return HALVES[request.param]


def ulps(got, want):
    """Distance in units in the last place of the 16-bit type (bits mapped to a monotone
    integer line; NaN against NaN is 0)."""
    def line(a):
        b = a.view(np.uint16).astype(np.int32)
        return np.where(b & 0x8000, -(b & 0x7fff), b)
    both_nan = np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
    return np.where(both_nan, 0, np.abs(line(got) - line(want)))


def assert_half_close(got, want, scale=1.0):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.dtype not in TOL:
        np.testing.assert_array_equal(got, want)
        return 0
    rtol, atol = TOL[got.dtype]
    if got.dtype.kind == "c":          # op.complex of 16-bit parts: complex64, both parts
        np.testing.assert_allclose(got, want, rtol=rtol * scale, atol=atol * scale)
        return 0
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                               rtol=rtol * scale, atol=atol * scale, equal_nan=True)
    return int(ulps(got, want).max()) if got.dtype.itemsize == 2 and got.size else 0


def reference(name, arrays, attrs, out_dtype):
    """The operator's NumPy reference on float32 copies, rounded once to the result dtype."""
    opdef = ops.get(name)
    wide = [a.astype(np.float32) if a.dtype in HALVES.values() else a for a in arrays]
    return np.asarray(opdef.reference(wide, normal_attrs(opdef, wide, attrs))).astype(out_dtype)


def function_of(name, n, attrs, listed):
    def apply(*xs):
        return ts.trace.apply(name, list(xs), **attrs) if listed else \
            ts.trace.apply(name, *xs, **attrs)
    names = ", ".join(f"x{i}" for i in range(n))
    return ts.function(eval(f"lambda {names}: apply({names})", {"apply": apply})), apply


FLOAT_OPS = sorted(n for n in EXAMPLES if n not in ("random_uniform", "random_normal"))


@pytest.mark.parametrize("name", FLOAT_OPS)
def test_every_operator_in_16_bits_on_the_cpu(name, half, rng):
    make, attrs = EXAMPLES[name]
    listed = ops.get(name).nin == -1
    inputs = make(rng)
    args = [np.asarray(a).astype(half) if np.asarray(a).dtype.kind == "f" else np.asarray(a)
            for a in (inputs[0] if listed else inputs)]
    if not any(a.dtype == half for a in args):
        pytest.skip(f"{name}'s example has no float operand")
    f, apply = function_of(name, len(args), attrs, listed)
    try:
        got = f(*args)
    except DTypeError:
        pytest.skip(f"{name} does not take {half}")
    want = reference(name, args, attrs, got.dtype)
    worst = assert_half_close(got, want, scale=2)
    assert_half_close(ts.interpret(f, *args), want, scale=2)
    assert_half_close(apply(*args), want, scale=2)                  # eager
    if got.dtype == half:
        assert worst <= 2 or name in ("sum", "var", "sub", "layernorm", "rmsnorm")


def test_promotion_rules():
    f16, bf16, f32 = (np.ones(3, d) for d in (np.float16, ml_dtypes.bfloat16, np.float32))
    assert (op.add(f16, f16).dtype, op.add(bf16, bf16).dtype) == (f16.dtype, bf16.dtype)
    assert op.add(f16, bf16).dtype == np.float32 and op.add(bf16, f32).dtype == np.float32
    assert op.mul(f16, 2.5).dtype == f16.dtype and op.mul(bf16, 3).dtype == bf16.dtype
    assert op.exp(bf16).dtype == bf16.dtype and op.sum(f16).dtype == f16.dtype
    assert (f16 < 1).dtype == np.bool_

    @ts.function
    def mixed(a, b, c):
        return a * b + c
    assert mixed(f16, bf16, f16).dtype == np.float32
    assert dt.result_type(dt.bfloat16, dt.int32) == dt.result_type(dt.float16, dt.int32)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_conversions_on_every_16_bit_pattern(half, target):
    """Widening is exact for all 65536 patterns; narrowing rounds to nearest even like NumPy
    (ml_dtypes), ties, overflow to inf and subnormals included; NaN stays NaN."""
    bits = np.arange(1 << 16, dtype=np.uint16).view(half)
    wide = bits.astype(np.float32)
    with np.errstate(all="ignore"):          # f32 values exactly halfway between neighbours
        w64 = wide.astype(np.float64)        # (ties: to even), just off them, and edge cases
        mid = ((w64[:-1] + w64[1:]) / 2).astype(np.float32)
        f32 = np.concatenate([wide, mid, np.nextafter(mid, np.float32(0)),
                              np.nextafter(mid, np.float32(np.inf)),
                              np.float32([65519.99, 65520.0, 3.4e38, 1e-40, 2.9e-8, -0.0])])
        want = f32.astype(half)
    widen = ts.function(lambda x: op.cast(x, dtype="float32"))
    narrow = ts.function(lambda x: op.cast(x, dtype=half.name))
    if target == "cpu":
        got_w, got_n = widen(bits), narrow(f32)
    else:
        emu = pytest.importorskip("gpu_emulator")
        got_w = emu.run_program(widen.lower(bits, target="cuda"), bits)[0]
        got_n = emu.run_program(narrow.lower(f32, target="cuda"), f32)[0]
    nan = np.isnan(wide)
    np.testing.assert_array_equal(got_w.view(np.uint32)[~nan], wide.view(np.uint32)[~nan])
    assert np.isnan(got_w[nan]).all()
    nan = np.isnan(f32)
    np.testing.assert_array_equal(got_n.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(got_n[nan].astype(np.float32)).all()


def test_deterministic(half, rng):
    @ts.function
    def f(a, b, x):
        return op.layernorm(op.relu(a @ b), axis=-1) + op.softmax(x, axis=-1)
    a, b, x = (rng.standard_normal(s).astype(half) for s in [(37, 61), (61, 50), (37, 50)])
    r1, r2 = f(a, b, x), f(a, b, x)
    np.testing.assert_array_equal(r1.view(np.uint16), r2.view(np.uint16))


# ---- CUDA and HIP through the emulator -----------------------------------------------------------
def _emulator():
    if shutil.which(os.environ.get("CXX") or "g++") is None:
        pytest.skip("the CUDA emulator needs a C++20 compiler (g++)")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
    import gpu_emulator
    return gpu_emulator


def _sum(x):
    return x.astype(np.float32).sum(-1)


def _per_op(x, f):
    """f(round, x in float32), with round(v): v rounded to x's 16-bit dtype and widened back."""
    return f(lambda v: np.asarray(v).astype(x.dtype).astype(np.float32), x.astype(np.float32))


GPU_CASES = {   # name: (function, shapes, float32 NumPy reference, scale of the tolerance)
    "matmul-epilogue": (lambda a, b, c: op.relu(a @ b + c), [(2, 33, 20), (20, 45), (45,)],
                        lambda a, b, c: np.maximum(
                            (a.astype(np.float32) @ b.astype(np.float32)).astype(a.dtype)
                            .astype(np.float32) + c.astype(np.float32), 0), 1),
    "matmul-big": (lambda a, b: a @ b, [(130, 70), (70, 257)],
                   lambda a, b: a.astype(np.float32) @ b.astype(np.float32), 1),
    # each operator's 16-bit result is rounded once, fused or not (the numerics contract): the
    # reference rounds where the kernel does, since tanh(x) * y + exp(x / 2) can cancel
    "pointwise": (lambda x, y: op.tanh(x) * y + op.exp(x * 0.5), [(7, 129), (129,)],
                  lambda x, y: _per_op(x, lambda r, xf: r(r(r(np.tanh(xf)) * y.astype(np.float32))
                                                        + r(np.exp(r(xf * 0.5))))), 1),
    "softmax": (lambda x: op.softmax(x, axis=-1), [(5, 1000)],
                lambda x: np.exp(x.astype(np.float32) - x.astype(np.float32).max(-1)[:, None])
                / np.exp(x.astype(np.float32)
                         - x.astype(np.float32).max(-1)[:, None]).sum(-1)[:, None], 1),
    "layernorm": (lambda x: op.layernorm(x, axis=-1), [(6, 257)],
                  lambda x: (lambda z: (z - z.mean(-1, keepdims=True))
                             / np.sqrt(z.var(-1, keepdims=True) + 1e-5))(x.astype(np.float32)), 1),
    "row-sum": (lambda x: op.sum(x, axis=-1), [(9, 300)], _sum, 4),
    "column-max": (lambda x: op.max(x, axis=0), [(33, 17)],
                   lambda x: x.astype(np.float32).max(0), 1),
    "attention": (lambda q, k, v: op.attention(q, k, v), [(2, 70, 64), (2, 33, 64), (2, 33, 64)],
                  lambda q, k, v: attention_reference(q, k, v).astype(np.float32), 2),
    "attention-causal": (lambda q, k, v: op.attention(q, k, v, causal=True),
                         [(1, 48, 32), (1, 48, 32), (1, 48, 32)],
                         lambda q, k, v: attention_reference(q, k, v, causal=True)
                         .astype(np.float32), 2),
}


@pytest.mark.parametrize("target", ["cuda", "hip"])
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_strategies_in_16_bits(case, target, half, rng):
    emu = _emulator()
    fn, shapes, ref, scale = GPU_CASES[case]
    arrays = [rng.uniform(-2, 2, size=s).astype(half) for s in shapes]
    f = ts.function(eval("lambda " + ", ".join(f"x{i}" for i in range(len(arrays)))
                         + ": fn(" + ", ".join(f"x{i}" for i in range(len(arrays))) + ")",
                         {"fn": fn}))
    prog = f.lower(*arrays, target=target)
    got = emu.run_program(prog, *arrays)[0]
    again = emu.run_program(prog, *arrays, reverse=True, max_blocks=3)[0]
    np.testing.assert_array_equal(got.view(np.uint16), again.view(np.uint16))
    want = np.asarray(ref(*arrays)).astype(half)
    assert got.dtype == half
    assert_half_close(got, want, scale=scale)
    assert_half_close(got, f(*arrays), scale=scale)                 # the CPU's result
