"""Every elementwise operator, compiled, against NumPy formulas written here (not the registry's
references), over shapes with 1s, primes, odd sizes, broadcasting and non-contiguous inputs."""
import math

import numpy as np
import pytest

import tessera as ts
from tessera import op

from conftest import assert_close

ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x):
    return np.asarray(ERF(x.astype(np.float64)), dtype=np.float64).astype(x.dtype)


def sig(x):
    return 1 / (1 + np.exp(-x))


UNARY = {
    "neg": (op.neg, lambda x: -x, None),
    "abs": (op.abs, np.abs, None),
    "exp": (op.exp, np.exp, (-20, 20)),
    "log": (op.log, np.log, (1e-3, 50)),
    "sqrt": (op.sqrt, np.sqrt, (0, 50)),
    "rsqrt": (op.rsqrt, lambda x: 1 / np.sqrt(x), (1e-2, 50)),
    "sin": (op.sin, np.sin, None),
    "cos": (op.cos, np.cos, None),
    "tanh": (op.tanh, np.tanh, None),
    "sigmoid": (op.sigmoid, sig, None),
    "relu": (op.relu, lambda x: np.where(x > 0, x, 0).astype(x.dtype), None),
    "gelu": (op.gelu, lambda x: 0.5 * x * (1 + erf(x / np.sqrt(x.dtype.type(2)))), None),
    "gelu_tanh": (lambda x: op.gelu(x, approximate="tanh"),
                  lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
                  None),
    "silu": (op.silu, lambda x: x * sig(x), None),
    "erf": (op.erf, erf, None),
    "log1p": (op.log1p, np.log1p, (-0.99, 50)),
    "expm1": (op.expm1, np.expm1, (-30, 30)),
    "softplus": (op.softplus, lambda x: np.logaddexp(x, x.dtype.type(0)), (-40, 40)),
}

SHAPES = [(), (1,), (7,), (1, 1), (3, 5), (13, 1, 17), (2, 3, 4, 5), (1031,)]


def sample(rng, shape, dtype, domain=None):
    lo, hi = domain or (-4, 4)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary(name, dtype, rng):
    fn, ref, domain = UNARY[name]
    for shape in SHAPES:
        x = sample(rng, shape, dtype, domain)
        f = ts.function(lambda x: fn(x))
        with np.errstate(all="ignore"):
            want = np.asarray(ref(x)).astype(dtype)
        assert_close(f(x), want, scale=4)
        assert_close(fn(x), want, scale=4)          # eager, same rules


BINARY = {
    "add": (op.add, np.add), "sub": (op.sub, np.subtract), "mul": (op.mul, np.multiply),
    "div": (op.div, np.true_divide), "maximum": (op.maximum, np.maximum),
    "minimum": (op.minimum, np.minimum), "pow": (op.pow, np.power),
}
COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
           "gt": np.greater, "ge": np.greater_equal}
BROADCAST = [((3, 5), (3, 5)), ((3, 5), (5,)), ((3, 1), (1, 5)), ((1,), (7, 1, 3)),
             ((2, 1, 4), (3, 1)), ((), (6,)), ((13,), ())]


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_binary(name, dtype, rng):
    fn, ref = BINARY[name]
    if name == "div" and np.dtype(dtype).kind == "i":
        pass                                           # true division: ints become float64
    for sa, sb in BROADCAST:
        if np.dtype(dtype).kind == "f":
            a = sample(rng, sa, dtype, (0.5, 3) if name == "pow" else None)
            b = sample(rng, sb, dtype)
            if name == "div":
                b = np.where(np.abs(b) < 0.1, 1, b).astype(dtype)
        else:
            a = rng.integers(-9, 10, size=sa).astype(dtype)
            b = rng.integers(1 if name in ("pow", "div") else -9, 4 if name == "pow" else 10,
                             size=sb).astype(dtype)
        f = ts.function(lambda a, b: fn(a, b))
        assert_close(f(a, b), ref(a, b), scale=8)


@pytest.mark.parametrize("name", sorted(COMPARE))
def test_compare(name, rng):
    a = rng.integers(-3, 3, size=(4, 7)).astype(np.float32)
    b = rng.integers(-3, 3, size=(7,)).astype(np.float32)
    f = ts.function(lambda a, b: getattr(op, name)(a, b))
    assert_close(f(a, b), COMPARE[name](a, b))


def test_python_operators_and_scalars(rng):
    x = rng.standard_normal((5, 6)).astype(np.float32)
    y = rng.standard_normal((6,)).astype(np.float32)

    @ts.function
    def f(x, y):
        return (-x + 2 * y - x / 3 + x ** 2 - 1.5) * (x > 0.25)

    want = (-x + 2 * y - x / 3 + x ** 2 - 1.5) * (x > 0.25)
    assert_close(f(x, y), want.astype(np.float32), scale=4)


def test_where_and_cast(rng):
    x = rng.standard_normal((4, 9))
    f = ts.function(lambda x: op.where(x > 0, x, 0.5 * x))
    assert_close(f(x), np.where(x > 0, x, 0.5 * x))
    g = ts.function(lambda x: op.cast(x * 10, ts.int32))
    assert_close(g(x), (x * 10).astype(np.int32))
    h = ts.function(lambda x: (x > 0).astype("float32") + x.astype(ts.float32))
    assert_close(h(x), (x > 0).astype(np.float32) + x.astype(np.float32))


@pytest.mark.parametrize("to", ["float32", "float64"])
@pytest.mark.parametrize("via", ["int32", "int64"])
def test_a_float_through_an_integer_truncates_to_plus_zero(to, via, rng):
    """-0.5 -> 0 -> +0.0, as NumPy: gcc's -fno-trapping-math made (float)(int)x a sign-keeping
    truncation (-0.0), which flips the sign of 1 / y."""
    x = np.concatenate([[-0.5, -0.25, -0.99, 0.5, -1.5, 2.5], rng.uniform(-3, 3, 58)])
    x = x.astype(np.float32)
    f = ts.function(lambda x: op.cast(op.cast(x, via), to))
    assert f(x).tobytes() == x.astype(via).astype(to).tobytes()


@pytest.mark.parametrize("pair,want", [
    ((np.float32, np.float64), np.float64), ((np.int32, np.float32), np.float64),
    ((np.int32, np.int64), np.int64), ((np.bool_, np.int32), np.int32),
    ((np.float32, np.float32), np.float32)])
def test_promotion_follows_numpy(pair, want, rng):
    a = rng.integers(0, 5, size=(3, 4)).astype(pair[0])
    b = rng.integers(1, 5, size=(4,)).astype(pair[1])
    f = ts.function(lambda a, b: a + b)
    out = f(a, b)
    assert out.dtype == want == np.result_type(a, b)
    assert_close(out, a + b)


def test_weak_python_scalars_keep_dtype(rng):
    x = rng.standard_normal(8).astype(np.float32)
    i = rng.integers(0, 9, 8).astype(np.int32)
    f = ts.function(lambda x, i: (x * 2.5, i + 3, i * 0.5, op.exp(i)))
    a, b, c, d = f(x, i)
    assert (a.dtype, b.dtype, c.dtype, d.dtype) == (np.float32, np.int32, np.float64, np.float64)
    assert_close(c, i * 0.5)
    assert_close(d, np.exp(i.astype(np.float64)))


def test_non_contiguous_inputs(rng):
    base = rng.standard_normal((8, 10)).astype(np.float32)
    x = base[::2, 1::3]                   # strided view
    y = base.T[:5]                        # transposed view
    f = ts.function(lambda x: op.tanh(x) * 2)
    assert_close(f(x), np.tanh(x) * 2)
    assert_close(f(y), np.tanh(y) * 2)


def test_nan_propagation_matches_numpy():
    x = np.array([1.0, np.nan, -2.0, 3.0], dtype=np.float32)
    y = np.array([np.nan, 0.0, -1.0, 5.0], dtype=np.float32)
    f = ts.function(lambda x, y: (op.maximum(x, y), op.minimum(x, y), op.relu(x)))
    a, b, c = f(x, y)
    assert_close(a, np.maximum(x, y))
    assert_close(b, np.minimum(x, y))
    assert_close(c, np.maximum(x, np.float32(0)))


def test_large_pointwise_runs_parallel(rng):
    x = rng.standard_normal((517, 1031)).astype(np.float32)
    f = ts.function(lambda x: op.sigmoid(x) * x + 1)
    prog = f.lower(x)
    assert prog.schedule_ir.kernels[0].knobs["parallel"]
    assert_close(f(x), (x * sig(x) + 1).astype(np.float32), scale=4)


# ---- rounding, sign, floor division and remainder: exact, so NumPy's bits on every target ----
EDGES = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.0, -7.25, 1e30, -1e-30, np.inf, -np.inf,
         np.nan]


def _same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.kind == "f":              # any NaN is a NaN; every other value bit for bit
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        got, want = got[~nan], want[~nan]
        assert np.array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")), \
            (got, want)
    else:
        assert np.array_equal(got, want)


@pytest.mark.parametrize("name", ["floor", "ceil", "round", "sign"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_rounding_and_sign_are_numpys_bits(name, dtype, rng):
    ref = {"floor": np.floor, "ceil": np.ceil, "round": np.round, "sign": np.sign}[name]
    if np.dtype(dtype).kind == "f":
        x = np.concatenate([np.array(EDGES), rng.uniform(-40, 40, 1000),
                            np.round(rng.uniform(-20, 20, 200)) + 0.5]).astype(dtype)
    else:
        info = np.iinfo(dtype)
        x = np.concatenate([[0, 1, -1, info.min, info.max],
                            rng.integers(-1000, 1000, 500)]).astype(dtype)
    f = ts.function(lambda x: getattr(op, name)(x))
    with np.errstate(all="ignore"):
        _same_bits(f(x), ref(x))
        _same_bits(getattr(op, name)(x), ref(x))        # eager


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_mod_and_floor_divide_are_pythons_and_numpys(dtype, rng):
    """Every sign combination, zero divisors, infinities and NaN (floats), MIN // -1 and
    MIN % -1 (integers, which C's own / and % would trap on): NumPy's results, bit for bit."""
    if np.dtype(dtype).kind == "f":
        edges = np.array(EDGES, dtype)
        a = np.concatenate([np.repeat(edges, len(edges)), rng.uniform(-50, 50, 2000)])
        b = np.concatenate([np.tile(edges, len(edges)), rng.uniform(-5, 5, 2000)])
    else:
        info = np.iinfo(dtype)
        edges = np.array([0, 1, -1, 2, -2, 7, -7, info.min, info.max], dtype)
        a = np.concatenate([np.repeat(edges, len(edges)), rng.integers(-100, 100, 2000)])
        b = np.concatenate([np.tile(edges, len(edges)), rng.integers(-9, 10, 2000)])
    a, b = a.astype(dtype), b.astype(dtype)
    f = ts.function(lambda a, b: (a // b, a % b, op.floor_divide(a, b), op.mod(a, b)))
    with np.errstate(all="ignore"):
        q, r, q2, r2 = f(a, b)
        _same_bits(q, np.floor_divide(a, b))
        _same_bits(r, np.remainder(a, b))
        _same_bits(q2, q)
        _same_bits(r2, r)
        # Python's identity a == (a // b) * b + a % b, where both are finite and b is not 0
        if np.dtype(dtype).kind == "f":
            ok = (b != 0) & (np.abs(a) < 1e6) & (np.abs(b) < 1e6)     # (finite, and no r that
            # absorbs a into a huge b: -0.5 % 1e30 is 1e30, NumPy's and Python's answer too)
            np.testing.assert_allclose(q[ok] * b[ok] + r[ok], a[ok], rtol=1e-6, atol=1e-5)
            assert np.all((r[ok] == 0) | (np.sign(r[ok]) == np.sign(b[ok])))


def test_clamp_is_numpys_clip(rng):
    x = np.concatenate([rng.uniform(-3, 3, 50), [np.nan, np.inf, -np.inf]]).astype(np.float32)
    lo = rng.uniform(-1, 0, 53).astype(np.float32)
    f = ts.function(lambda x, lo: (op.clamp(x, lo, 1.0), op.clamp(x, min=lo),
                                   op.clamp(x, max=0.5)))
    both, low, high = f(x, lo)
    _same_bits(both, np.clip(x, lo, np.float32(1.0)))
    _same_bits(low, np.maximum(x, lo))
    _same_bits(high, np.minimum(x, np.float32(0.5)))
    with pytest.raises(ts.ArgumentError, match="min, max or both"):
        op.clamp(x)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_constant_small_powers_are_products(rng, dtype):
    """x ** 2.0, 3.0, 4.0 (GPT-2's gelu has x ** 3.0) become products, float32 and narrower
    through float64: within half an ulp of the exact power but for double-rounding ties (one
    ulp), x*x exactly x*x; no call of the C library's pow is left."""
    np_dtype = ts.dtypes.get(dtype).np
    x = (rng.standard_normal(4099) * 5).astype(np_dtype)
    x[:4] = [0, -0.0, np.inf, -np.inf]
    wide = x.astype(np.float64)
    for k in (1.0, 2.0, 3.0, 4.0):
        f = ts.function(lambda x: x ** k)
        got = f(x)
        assert got.dtype == np_dtype
        if dtype == "float64" and k > 2:
            assert "pow" in str(f.lower(x).graph_ir)        # (x*x*x would round twice)
            assert_close(got, wide ** k)
            continue
        assert "pow" not in str(f.lower(x).graph_ir)
        want = (wide * wide if k == 2 else wide * wide * wide if k == 3
                else (wide * wide) ** 2 if k == 4 else wide)
        exact = np.power(x.astype(np.longdouble if np.dtype(np_dtype).itemsize >= 4
                                  else np.float64).astype(np.longdouble), int(k))
        with np.errstate(invalid="ignore", over="ignore"):      # overflow to inf, as pow
            np.testing.assert_array_equal(got, want.astype(np_dtype))   # once from f64
            finite = np.isfinite(exact.astype(np_dtype))
        ulps = np.abs(got[finite].astype(np.longdouble) - exact[finite]) / \
            np.spacing(np.abs(exact[finite].astype(np_dtype))).astype(np.longdouble)
        assert ulps.max() <= 1
    y = rng.uniform(0.5, 2, 7).astype(np_dtype)
    assert "pow" in str(ts.function(lambda x, e: x ** e).lower(y, y).graph_ir)   # not constant
    g = ts.grad(lambda x: op.sum(x ** 3.0))(y)
    assert_close(g.astype(np.float64), 3 * y.astype(np.float64) ** 2,
                 rtol=1e-2 if np.dtype(np_dtype).itemsize == 2 else 1e-6)


# ---- log1p, expm1, softplus: accuracy where the naive forms cancel --------------------------------
def _ulps(got, want, dtype):
    """|got - want| in units of the last place of want rounded to dtype (want in float64 or
    long double)."""
    w = want.astype(dtype)
    spacing = np.spacing(np.abs(w).astype(dtype)).astype(np.longdouble)
    return np.abs(got.astype(np.longdouble) - want) / spacing


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log1p_expm1_softplus_within_three_ulps(dtype, rng):
    """Against float64 references for float32 and long double ones for float64, on values
    spread over every scale (tiny ones where log(1 + x) and exp(x) - 1 lose every digit) and
    on the special values."""
    mags = 10.0 ** rng.uniform(-30, 1.5, 200_000)
    x = (mags * rng.choice([-1.0, 1.0], mags.size)).astype(dtype)
    wide = np.longdouble if dtype == np.float64 else np.float64
    for name, fn, ref, keep in [
            ("log1p", op.log1p, np.log1p, lambda x: x > -1),
            ("expm1", op.expm1, np.expm1, lambda x: x < (88 if dtype == np.float32 else 709)),
            ("softplus", op.softplus, lambda x: np.logaddexp(x, wide(0)), lambda x: x == x)]:
        xs = x[keep(x)]
        got = ts.function(lambda x: fn(x))(xs)
        with np.errstate(all="ignore"):
            want = ref(xs.astype(wide))
        assert _ulps(got, want, dtype).max() <= 3, name     # (at most 2.58 in 4.8M values)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, -2.0, 1e-45 if dtype ==
                        np.float32 else 5e-324, 1000.0, -1000.0], dtype)
    for name, fn, ref in [("log1p", op.log1p, np.log1p), ("expm1", op.expm1, np.expm1),
                          ("softplus", op.softplus, lambda x: np.logaddexp(x, x.dtype.type(0)))]:
        got = ts.function(lambda x: fn(x))(special)
        with np.errstate(all="ignore"):
            want = ref(special)
        np.testing.assert_array_equal(got, want, err_msg=name)
        np.testing.assert_array_equal(np.signbit(got[:2]), np.signbit(want[:2]), err_msg=name)


def test_logical_operators_are_numpys(rng):
    a = rng.integers(-2, 3, (5, 6)).astype(np.int32)
    b = rng.standard_normal((5, 6)) > 0
    c = rng.standard_normal(6).astype(np.float32) * (rng.random(6) > 0.5)
    f = ts.function(lambda a, b, c: (op.logical_and(a, b), op.logical_or(b, c),
                                     op.logical_xor(a, c), op.logical_not(c)))
    for got, want in zip(f(a, b, c), (np.logical_and(a, b), np.logical_or(b, c),
                                      np.logical_xor(a, c), np.logical_not(c))):
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, want)
