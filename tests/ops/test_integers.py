"""The integer dtypes (int8, int16, int32, int64, uint8, uint16, uint32, uint64) through the
compiler, against NumPy on fresh random values that include each dtype's extremes: every
operator that takes integers gives NumPy's bits (arithmetic wrapping around, inside fused
kernels too), promotion is NumPy's, casts between every pair are NumPy's (floats into integers
within the range NumPy defines), and reductions, matmuls and copies keep the dtype as NumPy does."""
import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera import op, ops
from tessera.errors import TesseraError

from cases import EXAMPLES, normal_attrs
from conftest import assert_close

INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
NEW = [np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64]


def ints(rng, shape, dtype, lo=None, hi=None):
    """Random values over the dtype's whole range (or [lo, hi]), a tenth of them its extremes
    and the small values where wrapping and signs matter (min, max, -1, 0, 1)."""
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    x = rng.integers(lo, hi, size=shape, dtype=dtype, endpoint=True)
    edges = np.array([v for v in (info.min, info.max, -1, 0, 1, 2) if lo <= v <= hi],
                     dtype=dtype)
    pick = rng.random(shape) < 0.1
    return np.where(pick, rng.choice(edges, size=shape), x).astype(dtype)


def _int_variant(name, arrays, dtype, rng):
    """The operator's example with its float operands replaced by integers of dtype (index
    operands and masks kept), or None where the example has no float operand."""
    out, any_float = [], False
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind == "f":
            any_float = True
            small = name in ("pow", "cumprod")            # keep the exponents and products sane
            out.append(ints(rng, a.shape, dtype, *((0, 5) if small else (None, None))))
        else:
            out.append(a)
    return out if any_float else None


@pytest.mark.parametrize("dtype", NEW)
def test_every_operator_taking_integers_gives_numpys_bits(dtype, rng):
    """Each registered operator's example (tests/cases.py) in this integer dtype: compiled,
    interpreted and eager results equal its NumPy reference; an operator that refuses integers
    says so with a TesseraError."""
    ran, refused = [], []
    for name in sorted(EXAMPLES):
        make, attrs = EXAMPLES[name]
        opdef = ops.get(name)
        listed = opdef.nin == -1
        inputs = make(rng)
        args = _int_variant(name, inputs[0] if listed else inputs, dtype, rng)
        if args is None:
            continue

        def apply(*xs, name=name, attrs=attrs, listed=listed):
            return ts.trace.apply(name, list(xs), **attrs) if listed else \
                ts.trace.apply(name, *xs, **attrs)
        try:
            eager = apply(*args)
        except TesseraError:
            refused.append(name)
            continue
        with np.errstate(all="ignore"):
            want = np.asarray(opdef.reference(args, normal_attrs(opdef, args, attrs)))
        want = want.astype(np.asarray(eager).dtype)
        f = ts.function(eval("lambda " + ", ".join(f"x{i}" for i in range(len(args))) +
                             ": apply(" + ", ".join(f"x{i}" for i in range(len(args))) + ")",
                             {"apply": apply}))
        scale = 64 if want.dtype.kind == "f" else 1      # float results (sqrt, mean) of ints
        for got in (f(*args), ts.interpret(f, *args), eager):
            assert_close(got, want, scale=scale)
        ran.append(name)
    # the integer operators: arithmetic, comparisons, rounding, reductions, scans, copies, sorts
    for must in ("add", "sub", "mul", "neg", "abs", "pow", "mod", "floor_divide", "maximum",
                 "sign", "eq", "lt", "where", "fma", "sum", "max", "argmin", "cumsum", "cumprod",
                 "matmul", "transpose", "slice", "concat", "take", "pad", "sort", "argsort",
                 "scatter_add", "cast", "sqrt", "mean", "prod", "conv", "max_pool"):
        assert must in ran, f"{must} did not run on {np.dtype(dtype)} (refused: {refused})"


@pytest.mark.parametrize("dtype", INTS)
def test_fused_arithmetic_wraps_as_numpy(dtype, rng):
    """Sums, products and negations past the dtype's range wrap inside one fused kernel, before
    a comparison or a division uses them (a C int holding int8 + int8 unwrapped would not)."""
    a, b, c = (ints(rng, (257,), dtype) for _ in range(3))

    def fn(a, b, c):
        s = a * b + c - a
        return op.where(s > c, -s, s // op.maximum(b, 1)), op.abs(a * a) % op.maximum(c, 3)
    got = ts.function(fn)(a, b, c)
    with np.errstate(all="ignore"):
        s = a * b + c - a
        want = (np.where(s > c, -s, s // np.maximum(b, dtype(1))),
                np.abs(a * a) % np.maximum(c, dtype(3)))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == w.dtype


@pytest.mark.parametrize("x", INTS + [np.float16, np.float32, np.float64, np.bool_])
def test_promotion_is_numpys(x, rng):
    """Every pair with an integer side: the result dtype and values of a + b are NumPy's
    (int8 + uint8 is int16, uint64 + int64 is float64), and a Python int is weak."""
    for y in INTS:
        a = ints(rng, (5,), y) if np.dtype(x) == np.bool_ else \
            (rng.standard_normal(5) * 50).astype(x) if np.dtype(x).kind == "f" else \
            ints(rng, (5,), x)
        a = a > 0 if np.dtype(x) == np.bool_ else a
        b = ints(rng, (5,), y, 0, 100)
        with np.errstate(all="ignore"):
            want = a + b
        got = ts.function(lambda a, b: a + b)(a, b)
        assert got.dtype == want.dtype, (x, y)
        assert_close(got, want)
        got = ts.function(lambda b: b * 3 + 1)(b)
        assert got.dtype == b.dtype
        np.testing.assert_array_equal(got, b * 3 + 1)


@pytest.mark.parametrize("to", INTS + [np.float16, np.float32, np.float64, np.bool_])
def test_casts_between_every_pair_are_numpys(to, rng):
    """Into `to` from every integer (wrapping modulo 2^bits into a narrower one) and from floats
    (truncating toward zero, out-of-range values within int32's range wrapping as NumPy's do on
    x86; beyond, NumPy leaves the result undefined)."""
    sources = {d: ints(rng, (64,), d) for d in INTS}
    sources[np.float32] = np.concatenate([rng.uniform(-3e5, 3e5, 40), rng.uniform(-3, 3, 20),
                                          [-0.5, 0.5, -1.5, 2.5]]).astype(np.float32)
    sources[np.float64] = rng.uniform(-2e9, 2e9, 64)
    sources[np.float16] = rng.uniform(-6e4, 6e4, 64).astype(np.float16)
    f = ts.function(lambda x: op.cast(x, dt.from_numpy(np.dtype(to))))
    for src, x in sources.items():
        if np.dtype(to).kind == "u" and np.dtype(src).kind == "f":
            # NumPy into uint64 from a negative float: x86's conversion of the value truncated
            x = np.abs(x) if np.dtype(to) == np.uint64 else x
        with np.errstate(all="ignore"):
            want = x.astype(to)
        got = f(x)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want, err_msg=f"{np.dtype(src)} -> {np.dtype(to)}")


def test_float_to_integer_outside_its_range_is_defined(rng):
    """NaN, infinities and values past int64 give 0 (C leaves these undefined, so ISAs would
    differ); a negative float into uint64 wraps as its truncation into int64 does."""
    x = np.array([np.nan, np.inf, -np.inf, 1e19, -1e19, 3e38, -2.5, -1.0], np.float32)
    for to in (np.int8, np.uint16, np.uint32):
        got = ts.function(lambda v: op.cast(v, dt.from_numpy(np.dtype(to))))(x)
        np.testing.assert_array_equal(got, np.array([0, 0, 0, 0, 0, 0, -2, -1]).astype(to))
    got = ts.function(lambda v: op.cast(v, dt.uint64))(x)
    np.testing.assert_array_equal(got, np.array([0, 0, 0, int(x[3]), 0, 0, 2 ** 64 - 2,
                                                 2 ** 64 - 1], np.uint64))


@pytest.mark.parametrize("dtype", NEW)
def test_reductions_and_scans_widen_as_numpy(dtype, rng):
    x = ints(rng, (6, 33, 5), dtype)
    for fn, ref in [(lambda v: op.sum(v, axis=1), lambda v: np.sum(v, axis=1)),
                    (lambda v: op.sum(v), np.sum),
                    (lambda v: op.max(v, axis=(0, 2)), lambda v: np.max(v, axis=(0, 2))),
                    (lambda v: op.min(v, axis=0), lambda v: np.min(v, axis=0)),
                    (lambda v: op.argmax(v, axis=1), lambda v: np.argmax(v, axis=1)),
                    (lambda v: op.cumsum(v, axis=1), lambda v: np.cumsum(v, axis=1)),
                    (lambda v: op.cumprod(v, axis=2), lambda v: np.cumprod(v, axis=2)),
                    (lambda v: op.mean(v, axis=2), lambda v: np.mean(v, axis=2))]:
        with np.errstate(all="ignore"):
            want = ref(x)
        got = ts.function(fn)(x)
        assert got.dtype == want.dtype
        assert_close(got, want)


@pytest.mark.parametrize("dtype", INTS)
def test_matmul_keeps_the_dtype_and_wraps_as_numpy(dtype, rng):
    """An integer matmul is exact modulo 2^bits, as NumPy's (and PyTorch's) are."""
    for (m, k, n) in [(1, 7, 3), (17, 33, 9), (64, 100, 40)]:
        a, b = ints(rng, (2, m, k), dtype), ints(rng, (k, n), dtype)
        with np.errstate(all="ignore"):
            want = a @ b
        got = ts.function(lambda a, b: a @ b)(a, b)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", NEW)
def test_float_functions_of_integers_take_numpys_float(dtype, rng):
    """sqrt, exp and the like give int8 and uint8 float16, int16 and uint16 float32, as NumPy's
    loops do; true division float64."""
    x = ints(rng, (40,), dtype, 0, 11)
    for fn, ref in [(op.sqrt, np.sqrt), (op.exp, np.exp), (op.sin, np.sin)]:
        got = ts.function(lambda v: fn(v))(x)
        want = ref(x)
        assert got.dtype == want.dtype
        assert_close(got, want, scale=4)
    got = ts.function(lambda v: v / 3)(x)
    assert got.dtype == np.float64
    assert_close(got, x / 3)


def test_integer_values_round_trip_through_every_public_entry(rng):
    """A uint8 image and int8 weights through ts.function, eager ops and ts.interpret alike;
    the dtypes are public names."""
    assert ts.int8 is dt.int8 and ts.uint8 is dt.uint8 and ts.uint64 is dt.uint64
    img = ints(rng, (2, 3, 8, 8), np.uint8)
    w = ints(rng, (3, 3), np.int8, -8, 8)

    def f(img, w):
        v = op.cast(img, ts.int16) - 128
        return op.einsum("nchw,cd->ndhw", v, op.cast(w, ts.int16))
    want = np.einsum("nchw,cd->ndhw", img.astype(np.int16) - 128, w.astype(np.int16))
    for got in (ts.function(f)(img, w), f(img, w), ts.interpret(ts.function(f), img, w)):
        assert got.dtype == np.int16
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", INTS + [np.bool_])
def test_bitwise_operators_and_shifts_are_numpys(dtype, rng):
    """& | ^ ~ << >> as Python operators and op.* functions: NumPy's bits, shifts by the width
    or more (and negative shifts) included, fused with arithmetic."""
    if dtype is np.bool_:
        a, b = rng.random((2, 9, 7)) > 0.5
        got = ts.function(lambda a, b: (a & b, a | ~b, a ^ b))(a, b)
        for g, w in zip(got, (a & b, a | ~b, a ^ b)):
            np.testing.assert_array_equal(g, w)
        return
    bits = 8 * np.dtype(dtype).itemsize
    a = ints(rng, (9, 7), dtype)
    b = ints(rng, (7,), dtype, *((-3, bits + 3) if np.dtype(dtype).kind == "i" else
                                (0, bits + 3)))

    def fn(a, b):
        return a & b, a | b, a ^ b, ~a, a << b, a >> b, op.right_shift(a + a, 1) ^ 5
    got = ts.function(fn)(a, b)
    with np.errstate(all="ignore"):
        want = (a & b, a | b, a ^ b, ~a, np.left_shift(a, b), np.right_shift(a, b),
                np.right_shift(a + a, 1) ^ 5)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    assert_close(op.left_shift(a, b), np.left_shift(a, b))                # eager


def test_bitwise_operators_refuse_floats(rng):
    x = rng.standard_normal(4).astype(np.float32)
    with pytest.raises(TesseraError, match="bitwise_and takes integer or bool"):
        ts.function(lambda v: v & v)(x)
    with pytest.raises(TesseraError, match="left_shift takes integer tensors"):
        ts.function(lambda v: op.left_shift(v > 0, v > 0))(x)
