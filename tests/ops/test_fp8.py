"""fp8 storage (float8_e4m3fn, float8_e5m2) end to end: every pattern widened exactly and a
float32 or float64 rounded once to nearest even (the expected bits from exact arithmetic,
conftest.round_to_narrow_bits) on the CPU, and for CUDA and HIP through the emulator of the GPU
thread model; saturating casts; every float operator on the CPU against float32 NumPy rounded
once; the promotion rules; matmul of fp8 operands with per-tensor scales."""
import os
import platform
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera import op, ops
from tessera.errors import DTypeError
from tessera.runtime import toolchain

from cases import EXAMPLES, normal_attrs
from conftest import round_to_narrow_bits

ml_dtypes = pytest.importorskip("ml_dtypes", reason="the fp8 formats need ml_dtypes (the bf16 extra)")
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
FP8 = {"e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "e5m2": np.dtype(ml_dtypes.float8_e5m2)}


@pytest.fixture(params=sorted(FP8))
def fp8(request):
    return FP8[request.param]


def _emulator():
    if shutil.which(os.environ.get("CXX") or "g++") is None:
        pytest.skip("the CUDA emulator needs a C++20 compiler (g++)")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
    import gpu_emulator
    return gpu_emulator


def run_on(fn, target, *arrays):
    """fn's result on the CPU, or on "cuda"/"hip" through the emulator."""
    if target == "cpu":
        return np.asarray(fn(*arrays))
    return _emulator().run_program(fn.lower(*arrays, target=target), *arrays)[0]


def ulps(got, want):
    """Distance in fp8 units in the last place (sign-magnitude bits mapped to a monotone line;
    NaN against NaN is 0)."""
    def line(a):
        b = a.view(np.uint8).astype(np.int32)
        return np.where(b & 0x80, -(b & 0x7f), b)
    both_nan = np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
    return np.where(both_nan, 0, np.abs(line(got) - line(want)))


def assert_same_fp8(got, want):
    """Bit for bit, NaN against NaN of either payload."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want.astype(np.float32))
    assert np.isnan(got[nan].astype(np.float32)).all()
    np.testing.assert_array_equal(got.view(np.uint8)[~nan], want.view(np.uint8)[~nan])


def rounded(x, fp8):
    """x (any float or int dtype) rounded once to fp8 by exact arithmetic, as an fp8 array."""
    return round_to_narrow_bits(np.asarray(x).astype(np.float64), fp8.name).view(fp8)


def hard_float32s(fp8, rng):
    """float32 values that test rounding to fp8: every fp8 value, the midpoints between
    neighbours (ties) and the floats just either side of them, random bit patterns, overflow."""
    wide = np.arange(256, dtype=np.uint8).view(fp8).astype(np.float32)
    w = np.sort(wide[np.isfinite(wide)].astype(np.float64))
    mid = ((w[:-1] + w[1:]) / 2).astype(np.float32)
    top = float(ml_dtypes.finfo(fp8).max)
    edges = np.float32([top, top * 1.03, top * 1.0625, top * 1.07, 1e30, np.inf, 1e-30, 1e-40,
                        0.0, np.nan])
    bits = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([wide, mid, np.nextafter(mid, np.float32(0)),
                        np.nextafter(mid, np.float32(np.inf)), edges, bits])
    return np.concatenate([x, -x])


@pytest.mark.parametrize("target", ["cpu", "cuda", "hip"])
def test_conversions_on_every_pattern(fp8, target, rng):
    """Widening is exact for all 256 patterns; narrowing rounds to nearest even (ties,
    subnormals, overflow to inf or, in e4m3fn, to NaN); NaN stays NaN."""
    bits = np.arange(256, dtype=np.uint8).view(fp8)
    widen = ts.function(lambda x: op.cast(x, dtype="float32"))
    got = run_on(widen, target, bits)
    want = bits.astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    assert np.isnan(got[nan]).all() and nan.sum() == (2 if fp8.name.endswith("fn") else 6)

    x = hard_float32s(fp8, rng)
    narrow = ts.function(lambda x: op.cast(x, dtype=fp8.name))
    assert_same_fp8(run_on(narrow, target, x), rounded(x, fp8))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_saturating_cast_clamps_overflow_to_the_largest_finite_value(fp8, target, rng):
    x = hard_float32s(fp8, rng)
    top = np.float32(ml_dtypes.finfo(fp8).max)
    sat = ts.function(lambda x: op.cast(x, dtype=fp8.name, saturate=True))
    with np.errstate(invalid="ignore"):
        want = np.where(np.isnan(x), x, np.clip(x, -top, top)).astype(fp8)
    assert_same_fp8(run_on(sat, target, x), want)
    # the 16-bit formats saturate too, and a saturating cast to a wider float is a plain one
    for d in (np.float16, ml_dtypes.bfloat16):
        top16 = np.float32(ml_dtypes.finfo(d).max)
        got = run_on(ts.function(lambda x: op.cast(x, dtype=np.dtype(d).name, saturate=True)),
                     target, x)
        want = np.where(np.isnan(x), x, np.clip(x, -top16, top16)).astype(d)
        np.testing.assert_array_equal(got.view(np.uint16)[~np.isnan(x)],
                                      want.view(np.uint16)[~np.isnan(x)])


def test_casts_between_narrow_formats_and_from_float64(fp8, rng):
    """float64, float16 and bfloat16 to fp8 round the value once (a double too: not through
    float32), and fp8 widens exactly into every wider float."""
    h = hard_float32s(fp8, rng).astype(np.float64)
    x64 = np.concatenate([h, h * (1 + 2.0 ** -40), h * (1 - 2.0 ** -40),
                          rng.standard_normal(5000) * 30])
    for src in (np.float64, np.float16, ml_dtypes.bfloat16):
        with np.errstate(all="ignore"):
            x = x64.astype(src)
        got = ts.function(lambda v: op.cast(v, dtype=fp8.name))(x)
        assert_same_fp8(got, rounded(x, fp8))
    bits = np.arange(256, dtype=np.uint8).view(fp8)
    for dst in (np.float64, np.float16, ml_dtypes.bfloat16):
        got = np.asarray(ts.function(lambda v: op.cast(v, dtype=np.dtype(dst).name))(bits))
        want = bits.astype(np.float32).astype(dst)
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


FLOAT_OPS = sorted(n for n in EXAMPLES if n not in ("random_uniform", "random_normal"))


@pytest.mark.parametrize("name", FLOAT_OPS)
def test_every_operator_in_fp8_on_the_cpu(name, fp8, rng):
    """Each operator on fp8 operands computes in float32 and rounds its fp8 result once: within
    one fp8 ulp of float32 NumPy rounded once (the float32 arithmetic of a kernel and of NumPy
    may differ in their last bits, which can cross a rounding boundary); compiled, interpreted
    and eager fp8 results agree bit for bit."""
    make, attrs = EXAMPLES[name]
    listed = ops.get(name).nin == -1
    inputs = make(rng)
    args = [np.asarray(a).astype(fp8) if np.asarray(a).dtype.kind == "f" else np.asarray(a)
            for a in (inputs[0] if listed else inputs)]
    if not any(a.dtype == fp8 for a in args):
        pytest.skip(f"{name}'s example has no float operand")

    def apply(*xs):
        return ts.trace.apply(name, list(xs), **attrs) if listed else \
            ts.trace.apply(name, *xs, **attrs)
    names = ", ".join(f"x{i}" for i in range(len(args)))
    f = ts.function(eval(f"lambda {names}: apply({names})", {"apply": apply}))
    try:
        got = np.asarray(f(*args))
    except DTypeError:
        pytest.skip(f"{name} does not take {fp8} (a DTypeError says so)")
    opdef = ops.get(name)
    wide = [a.astype(np.float32) if a.dtype == fp8 else a for a in args]
    with np.errstate(all="ignore"):
        want = np.asarray(opdef.reference(wide, normal_attrs(opdef, wide, attrs))).astype(got.dtype)
    for other in (np.asarray(ts.interpret(f, *args)), np.asarray(apply(*args))):
        assert other.dtype == got.dtype
        if got.dtype == fp8:
            np.testing.assert_array_equal(other.view(np.uint8), got.view(np.uint8))
    if got.dtype == fp8:
        assert got.size == 0 or ulps(got, want).max() <= 1
    elif got.dtype.kind in "fc":
        if name in ("matmul", "attention"):
            assert got.dtype == np.float32        # fp8 operands: a float32 result
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


def test_promotion_rules():
    e4, e5, f16, bf16, f32 = (np.ones(3, d) for d in (FP8["e4m3"], FP8["e5m2"], np.float16,
                                                       ml_dtypes.bfloat16, np.float32))
    assert op.add(e4, e4).dtype == e4.dtype and op.add(e5, 2.5).dtype == e5.dtype
    assert op.add(e4, e5).dtype == np.float16          # f16 holds both exactly
    assert op.add(e4, bf16).dtype == bf16.dtype and op.add(e5, f16).dtype == np.float16
    assert op.add(e4, f32).dtype == np.float32 and op.sum(e5).dtype == e5.dtype
    assert dt.result_type(dt.float8_e5m2, dt.int32) == dt.result_type(dt.float16, dt.int32)
    assert (e4 @ e4.reshape(3, 1)).dtype == np.float32


@pytest.mark.parametrize("target", ["cpu", "cuda", "hip"])
def test_scaled_matmul(fp8, target, rng):
    """op.matmul(a8, b8, scale_a=, scale_b=): the fp8 operands widened exactly, a float32
    product, the scales' product applied to it once (as fp8 GEMMs apply theirs)."""
    a = (rng.standard_normal((37, 70)) * 8).astype(fp8)
    b = (rng.standard_normal((70, 29)) * 8).astype(fp8)
    sa, sb = np.float32(0.37), np.float32(1.9)
    f = ts.function(lambda a, b, sa, sb: op.matmul(a, b, scale_a=sa, scale_b=sb))
    got = run_on(f, target, a, b, sa, sb)
    exact = a.astype(np.float64) @ b.astype(np.float64) * (np.float64(sa) * np.float64(sb))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-4 * np.abs(exact).max())
    plain = ts.function(lambda a, b: op.matmul(a, b, scale_a=0.5, scale_b=4.0))
    unscaled = ts.function(lambda a, b: op.matmul(a, b))
    np.testing.assert_array_equal(np.asarray(plain(a, b)), np.asarray(unscaled(a, b)) * 2)


@pytest.mark.parametrize("target", ["cuda", "hip"])
def test_gpu_pointwise_and_rows_in_fp8(fp8, target, rng):
    """A fused pointwise chain and row reductions in fp8 on the GPU give the CPU's bits."""
    x = rng.uniform(-3, 3, size=(6, 300)).astype(fp8)
    y = rng.uniform(-3, 3, size=(300,)).astype(fp8)
    for fn in (lambda x, y: op.tanh(x) * y + op.exp(x * 0.5),
               lambda x, y: op.softmax(x + y, axis=-1),
               lambda x, y: op.sum(x * y, axis=-1)):
        f = ts.function(fn)
        assert_same_fp8(run_on(f, target, x, y), f(x, y))


def test_fp8_without_ml_dtypes_says_how_to_install(monkeypatch, rng):
    """Without ml_dtypes (None in sys.modules makes its import fail) NumPy has no fp8 dtype: a
    cast to one is an UnsupportedDTypeError at the user's line, with the install line."""
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    x = rng.standard_normal(8).astype(np.float32)
    f = ts.function(lambda x: op.cast(x, ts.fp8))
    with pytest.raises(ts.UnsupportedDTypeError) as e:
        f(x)
    text = str(e.value)
    assert "float8_e4m3fn needs the ml_dtypes package" in text and "pip install ml_dtypes" in text
    assert "test_fp8.py" in text


@pytest.mark.skipif(shutil.which("gcc") is None or platform.machine() not in ("x86_64", "AMD64"),
                    reason="needs gcc for x86-64 (the levels tested are x86 ones)")
@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])       # AVX2 + FMA, AVX-512
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "saturate"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_narrow_conversions_vectorise(tmp_path, dtype, rounding, level):
    """A fused chain on a narrow dtype (its loads widened, each result rounded, by policy or
    to nearest) is one loop gcc vectorises at each named ISA level: the conversions and the
    stochastic rounding are straight-line code (a branch, or an integer -> float conversion
    AVX2 lacks, would leave the loop scalar)."""
    d = ts.dtypes.get(dtype).np
    x = np.ones(4096, d)
    policy = {"nearest": None, "stochastic": ts.NumericalPolicy(rounding="stochastic"),
              "saturate": ts.NumericalPolicy(saturate=True)}[rounding]
    f = ts.function(lambda x, y: op.tanh(x) * y + op.exp(x * 0.5), policy=policy)
    src = f.lower(x, x, target=f"cpu:{level}").target_code
    path = tmp_path / "k.c"
    path.write_text(src)
    lines = src.split("\n")
    loop = next(i for i, t in enumerate(lines, 1) if t.strip().startswith("for (int64_t i0"))
    flags = [f for f in toolchain.flags("gcc", level) if f not in ("-shared", "-fPIC")]
    out = subprocess.run(["gcc", *flags, "-c", "-fopt-info-vec-optimized", str(path), "-o",
                          str(tmp_path / "k.o")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # gcc names the loop by its `for` line or its body's first line
    assert re.search(rf"k\.c:({loop}|{loop + 1}):\d+: optimized: loop vectorized", out.stderr), \
        out.stderr
