"""Reductions and normalisations, compiled, against NumPy formulas written here."""
import numpy as np
import pytest

import tessera as ts
from tessera import op

from conftest import assert_close

CASES = [((7,), None), ((7,), 0), ((1, 1), None), ((3, 5), 0), ((3, 5), 1), ((3, 5), -1),
         ((4, 1, 6), (0, 2)), ((2, 3, 5, 7), (1, 3)), ((13, 17), None), ((1, 31), 1),
         ((2, 3, 4), (0, 1, 2))]


def reduction_bound(name, x64, axis, keepdim):
    """The classical error bound of a float32 reduction computed one element after another:
    (n - 1) * eps * sum|x| for a sum (divided by n for a mean; var sums squared deviations)."""
    n = x64.size // max(1, np.asarray(np.sum(x64, axis=axis)).size)
    eps = np.finfo(np.float32).eps
    if name in ("max", "min"):
        return 0.0
    if name == "var":
        d = x64 - x64.mean(axis=axis, keepdims=True)
        return 4 * n * eps * np.mean(d * d + np.abs(x64) * np.abs(d), axis=axis, keepdims=keepdim)
    total = np.sum(np.abs(x64), axis=axis, keepdims=keepdim)
    return (n + 1) * eps * (total / n if name == "mean" else total)


@pytest.mark.parametrize("shape,axis", CASES)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "var"])
def test_reduce_float(name, shape, axis, keepdim, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    f = ts.function(lambda x: getattr(op, name)(x, axis=axis, keepdim=keepdim))
    got = f(x)
    x64 = x.astype(np.float64)
    want = np.asarray(getattr(np, name)(x64, axis=axis, keepdims=keepdim))
    assert got.dtype == np.float32 and got.shape == want.shape
    # the bound, plus the float32 rounding of the final result
    tol = reduction_bound(name, x64, axis, keepdim) + np.abs(want) * np.finfo(np.float32).eps
    assert (np.abs(got - want) <= tol).all()


@pytest.mark.parametrize("name", ["sum", "max", "min", "mean"])
def test_reduce_int_and_bool(name, rng):
    i = rng.integers(-50, 50, size=(6, 9)).astype(np.int32)
    f = ts.function(lambda x: getattr(op, name)(x, axis=1))
    want = getattr(np, name)(i, axis=1)
    assert f(i).dtype == want.dtype
    assert_close(f(i), want)
    b = i > 0
    g = ts.function(lambda x: op.sum(x, axis=0))
    assert_close(g(b), np.sum(b, axis=0))


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_argreduce(name, axis, rng):
    x = rng.integers(0, 4, size=(5, 11)).astype(np.float32)   # ties: the first wins
    f = ts.function(lambda x: getattr(op, name)(x, axis=axis))
    assert_close(f(x), np.asarray(getattr(np, name)(x, axis=axis)))
    k = ts.function(lambda x: getattr(op, name)(x, axis=axis, keepdim=True))
    assert_close(k(x), np.asarray(getattr(np, name)(x, axis=axis, keepdims=True)))


def test_argmax_nan_and_ints():
    x = np.array([[1, np.nan, 3], [4, 2, np.nan]], dtype=np.float64)
    assert_close(ts.function(lambda x: op.argmax(x, axis=1))(x), np.argmax(x, axis=1))
    i = np.array([[3, 9, 9], [-1, -5, -1]], dtype=np.int64)
    assert_close(ts.function(lambda x: op.argmin(x, axis=1))(i), np.argmin(i, axis=1))


ARG_OF_COMPUTED = {
    "argmax(cast(mask))": (lambda m, x: op.argmax(op.cast(m, "float32")),
                           lambda m, x: np.argmax(m.astype(np.float32))),
    "argmax(cast(mask), axis=1)": (lambda m, x: op.argmax(op.cast(m, "float32"), axis=1),
                                   lambda m, x: np.argmax(m.astype(np.float32), axis=1)),
    "argmin(x * 2 - 1, axis=0, keepdim)": (
        lambda m, x: op.argmin(x * 2 - 1, axis=0, keepdim=True),
        lambda m, x: np.argmin(x * 2 - 1, axis=0, keepdims=True)),
    "argmax(exp(x[:, ::-1] + x), axis=-1)": (
        lambda m, x: op.argmax(op.exp(x[:, ::-1] + x), axis=-1),
        lambda m, x: np.argmax(np.exp(x[:, ::-1] + x), axis=-1)),
}


@pytest.mark.parametrize("name", sorted(ARG_OF_COMPUTED))
def test_argreduce_reads_its_elementwise_producer_in_place(name, rng):
    """argmax of an elementwise value is one kernel that computes it element by element (over
    2^31 elements a stored cast took 8.4 GB); the first winner, NaN included, as NumPy's."""
    m = rng.random((6, 7, 9)) < 0.3
    x = rng.integers(-3, 4, (6, 7, 9)).astype(np.float32)       # ties: the first wins
    x[2, 3, 4] = np.nan
    fn, ref = ARG_OF_COMPUTED[name]
    f = ts.function(fn)
    assert [k.strategy for k in f.lower(m, x).schedule_ir.kernels] == ["argreduce"]
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(f(m, x), ref(m, x))


def test_long_sum_is_within_its_bound(rng):
    x = rng.uniform(0, 1, size=(3, 100003)).astype(np.float32)
    out = ts.function(lambda x: x.sum(axis=1))(x)
    x64 = x.astype(np.float64)
    want = x64.sum(axis=1)
    assert (np.abs(out - want) <= reduction_bound("sum", x64, 1, False)).all()
    # in practice far inside the worst case: rounding errors of a random walk
    np.testing.assert_allclose(out, want, rtol=1e-4)


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("shape", [(1,), (5,), (3, 7), (2, 3, 129), (1, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_family(shape, dtype, rng):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    for axis in range(-len(shape), len(shape)):
        f = ts.function(lambda x: (op.softmax(x, axis=axis), op.log_softmax(x, axis=axis),
                                   op.logsumexp(x, axis=axis),
                                   op.logsumexp(x, axis=axis, keepdim=True)))
        s, ls, lse, lsek = f(x)
        m = x.max(axis=axis, keepdims=True)
        lse_ref = np.log(np.exp(x - m).sum(axis=axis, keepdims=True)) + m
        assert_close(s, _softmax(x, axis).astype(dtype), scale=5)
        assert_close(ls, (x - lse_ref).astype(dtype), scale=5)
        assert_close(lse, np.squeeze(lse_ref, axis=axis).astype(dtype), scale=5)
        assert_close(lsek, lse_ref.astype(dtype), scale=5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logsumexp_of_infinite_rows_is_scipys(dtype, rng):
    """A row of -inf is -inf (log 0), a row holding +inf is inf, NaN stays NaN: SciPy's,
    JAX's and PyTorch's answers (it was -inf - -inf = NaN), compiled and interpreted."""
    from scipy.special import logsumexp
    x = (rng.standard_normal((6, 9)) * 3).astype(dtype)
    x[0] = -np.inf
    x[1, 4] = np.inf
    x[2, 2] = np.nan
    x[3, ::2] = -np.inf
    f = ts.function(lambda x: op.logsumexp(x, axis=1))
    want = logsumexp(x.astype(np.float64), axis=1)
    for got in (f(x), ts.interpret(f, x)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
        assert_close(got, want.astype(dtype), scale=5)


EMPTY_AXIS = {"sum": (lambda x: op.sum(x, axis=0), lambda x: np.sum(x, axis=0)),
              "mean": (lambda x: op.mean(x, axis=0), lambda x: np.mean(x, axis=0)),
              "max": (lambda x: op.max(x, axis=0), lambda x: np.max(x, axis=0)),
              "min": (lambda x: op.min(x, axis=0), lambda x: np.min(x, axis=0)),
              "var": (lambda x: op.var(x, axis=0), lambda x: np.var(x, axis=0)),
              "softmax": (lambda x: op.softmax(x, axis=0), lambda x: x),
              "argmax": (lambda x: op.argmax(x, axis=0), lambda x: np.argmax(x, axis=0))}


@pytest.mark.parametrize("name", sorted(EMPTY_AXIS))
def test_reducing_an_empty_axis_gives_numpys_empty_result(name):
    """Over axis 0 of a [17, 0] (each of the zero outputs reduces 17 values): an empty result,
    as NumPy's (the column-reduction tiling divided by the zero width)."""
    x = np.ones((17, 0), np.float32)
    fn, ref = EMPTY_AXIS[name]
    want = ref(x)
    got = ts.function(fn)(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert ts.function(lambda x: op.sum(x, axis=1))(x).tolist() == [0.0] * 17


@pytest.mark.parametrize("shape", [(7,), (4, 33), (2, 5, 64)])
def test_layernorm_rmsnorm(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32) * 2 + 1
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32)
    f = ts.function(lambda x, w, b: (op.layernorm(x), op.layernorm(x, w, b, eps=1e-3),
                                     op.rmsnorm(x), op.rmsnorm(x, w)))
    ln, lnwb, rms, rmsw = f(x, w, b)
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    sd = lambda eps: np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + eps)   # noqa: E731
    r = np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6)
    assert_close(ln, ((x64 - mu) / sd(1e-5)).astype(np.float32), scale=10)
    assert_close(lnwb, ((x64 - mu) / sd(1e-3) * w + b).astype(np.float32), scale=10)
    assert_close(rms, (x64 / r).astype(np.float32), scale=10)
    assert_close(rmsw, (x64 / r * w).astype(np.float32), scale=10)


def test_layer_norm_written_by_hand(rng):
    @ts.function
    def layer_norm(x: ts.Tensor["B", "S", "D"]) -> ts.Tensor["B", "S", "D"]:
        mean = x.mean(axis=-1, keepdim=True)
        var = x.var(axis=-1, keepdim=True)
        return (x - mean) / op.sqrt(var + 1e-5)

    for shape in [(4, 16, 32), (1, 1, 7), (3, 5, 257)]:
        x = rng.standard_normal(shape).astype(np.float32)
        want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
        assert_close(layer_norm(x), want, scale=10)


# ---- running sums and products -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.bool_])
def test_scans_are_numpys_in_order(name, dtype, rng):
    """Each element combined into the running value in order, as NumPy's accumulate: the same
    bits (integers and bool accumulate in int64, as NumPy)."""
    ref = getattr(np, name)
    for shape, axis in [((7,), 0), ((3, 5), 1), ((3, 5), 0), ((2, 3, 4), 1), ((2, 3, 4), -1),
                        ((0, 3), 0), ((4, 0), 1), ((1, 1, 9), 2)]:
        if dtype == np.bool_:
            x = rng.random(shape) < 0.5
        elif np.dtype(dtype).kind == "i":
            x = rng.integers(-3, 4, size=shape).astype(dtype)
        else:
            x = rng.uniform(0.5, 1.5, size=shape).astype(dtype) * rng.choice([-1, 1], size=shape)
        f = ts.function(lambda x: getattr(op, name)(x, axis=axis))
        want = ref(x, axis=axis)
        got = f(x)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), (name, shape, axis)
        assert getattr(op, name)(x, axis=axis).tobytes() == want.tobytes()      # eager


def test_a_long_scan_runs_its_lines_in_parallel_with_the_same_bits(rng):
    x = rng.standard_normal((512, 1031)).astype(np.float32)
    prog = ts.function(lambda x: op.cumsum(x, axis=1)).lower(x)
    assert prog.schedule_ir.kernels[0].strategy == "scan"
    assert "omp parallel" in prog.target_code
    assert prog(x).tobytes() == np.cumsum(x, axis=1).tobytes()


def test_cumprod_gradient_is_exact_at_zeros(rng):
    """dx_i = y_(i-1) z_i with z from a reverse scan: no division, so a zero factor gives the
    exact gradient (what dividing y by x would turn into NaN)."""
    x = rng.uniform(0.5, 1.5, 6)
    x[2] = 0.0
    g = ts.grad(lambda x: op.sum(op.cumprod(x)))(x)
    want = [sum(np.prod(np.delete(x[:j + 1], i)) for j in range(i, 6)) for i in range(6)]
    assert np.all(np.isfinite(g))
    assert_close(g, np.array(want))
