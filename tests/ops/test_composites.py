"""Operators written as compositions of registered ones (op.norm, op.one_hot), and the
trace-time loop ts.static_range, against NumPy on fresh random inputs."""
import math

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, op

from conftest import assert_close


def _vector_norm(x, ord, axis, keepdim):
    a = np.abs(x.astype(np.float64))
    kw = dict(axis=axis, keepdims=keepdim)
    if ord == math.inf:
        return a.max(**kw)
    if ord == -math.inf:
        return a.min(**kw)
    if ord == 0:
        return (a != 0).sum(**kw).astype(np.float64)
    return (a ** ord).sum(**kw) ** (1 / ord)


@pytest.mark.parametrize("ord", [2, 1, 3, 0.5, math.inf, -math.inf, 0])
@pytest.mark.parametrize("axis,keepdim", [(None, False), (1, False), ((0, 2), True), (-1, True)])
def test_norm_matches_numpy(ord, axis, keepdim, rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    x[0, 0, :2] = 0                                       # zeros for ord=0
    if isinstance(axis, int):                              # NumPy's own vector norm
        want = np.linalg.norm(x.astype(np.float64), ord=ord, axis=axis, keepdims=keepdim)
    else:
        want = _vector_norm(x, ord, axis, keepdim)
    want = want.astype(np.float32)
    f = ts.function(lambda x: op.norm(x, ord, axis=axis, keepdim=keepdim))
    assert_close(f(x), want, scale=8)
    assert_close(op.norm(x, ord, axis=axis, keepdim=keepdim), want, scale=8)


def test_norm_gradient_and_bad_orders(rng):
    ts.check_grad(lambda x: op.sum(op.norm(x, 2, axis=-1)) + op.sum(op.norm(x, 3, axis=0)),
                  rng.uniform(0.5, 2, (3, 4)))
    for bad in (-1, "fro", float("nan"), True):
        with pytest.raises(ts.ArgumentError, match="not a vector norm"):
            op.norm(np.ones(3), bad)


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_one_hot_matches_an_identity_lookup(dtype, rng):
    idx = rng.integers(-2, 7, size=(4, 5))               # some outside [0, 5): rows of zeros
    table = np.vstack([np.eye(5), np.zeros((1, 5))])      # row 5: the out-of-range one
    want = table[np.where((idx >= 0) & (idx < 5), idx, 5)].astype(dtype)
    f = ts.function(lambda i: op.one_hot(i, 5, dtype=dtype))
    got = f(idx)
    assert got.dtype == np.dtype(dtype) and got.shape == (4, 5, 5)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(op.one_hot(idx, 5, dtype=dtype), want)
    with pytest.raises(ts.ArgumentError, match="positive int"):
        op.one_hot(idx, 0)


def test_static_range_unrolls_at_trace_time(rng):
    @ts.function
    def powers(x):
        acc, term = x * 0 + 1, x * 0 + 1
        for k in ts.static_range(1, 6):
            term = term * x / k
            acc = acc + term
        return acc                                          # exp(x) to five terms
    x = rng.uniform(-1, 1, 7)
    want = sum(x ** k / math.factorial(k) for k in range(6))
    np.testing.assert_allclose(powers(x), want, rtol=1e-12)
    assert [n.op for n in powers.lower(x).graph_ir.nodes].count("div") == 5


def test_static_range_on_a_symbolic_size_says_why():
    @ts.function
    def f(x: Tensor["N"]):
        for _ in ts.static_range(x.shape[0]):
            x = x + 1
        return x
    with pytest.raises(ts.TracingError, match="symbolic size N") as info:
        f.graph_ir
    assert "ts.static_range(x.shape[0])" in str(info.value) and info.value.hint


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_fmod_and_trunc_divide_match_c(dtype, rng):
    """C's remainder and quotient toward zero against NumPy's fmod and a truncated true
    quotient, every sign pairing, zeros, tiny remainders beside large divisors, inf and NaN."""
    d = np.dtype(dtype)
    if d.kind == "f":
        a = np.concatenate([rng.standard_normal(200) * 50, [5.0, -5.0, 1e-30, -1e-30, 7.5, np.inf,
                                                            np.nan, 0.0, 3.0]]).astype(d)
        b = np.concatenate([rng.standard_normal(200) * 7, [3.0, 3.0, -1.0, 1.0, np.inf, 2.0,
                                                           2.0, 1.0, 0.0]]).astype(d)
    else:
        a = rng.integers(-1000, 1000, 300).astype(d)
        b = rng.choice([-13, -4, -1, 1, 3, 7, 250], 300).astype(d)
    got_r = ts.function(lambda a, b: op.fmod(a, b))(a, b)
    got_q = ts.function(lambda a, b: op.trunc_divide(a, b))(a, b)
    with np.errstate(all="ignore"):
        want_r = np.fmod(a, b)
        want_q = np.trunc(a / b) if d.kind == "f" else (np.abs(a) // np.abs(b)) * np.sign(a * b)
    np.testing.assert_array_equal(got_r, want_r.astype(d))         # exact, NaN where NumPy's
    np.testing.assert_array_equal(got_q, want_q.astype(d))
    np.testing.assert_array_equal(op.fmod(a, b), want_r.astype(d))  # eager, the same


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lgamma_and_digamma_against_scipy(dtype, rng):
    """op.lgamma and op.digamma on x > 0 (tiny to large, and around 1 and 2 where lgamma is
    0) against SciPy: compiled and eager, their gradients digamma's and trigamma's."""
    from scipy import special
    x = np.concatenate([np.exp(rng.uniform(np.log(1e-4), np.log(1e5), 400)),
                        rng.uniform(0.5, 3.0, 200), [1.0, 2.0]]).astype(dtype)
    x64 = x.astype(np.float64)
    tol = 1e-13 if dtype == "float64" else 2e-5          # relative above 1, absolute below
    for f, ref in ((op.lgamma, special.gammaln), (op.digamma, special.digamma)):
        want = ref(x64)
        for got in (ts.function(lambda x: f(x))(x), f(x)):
            assert got.dtype == x.dtype
            err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
            assert err.max() < tol, (f.__name__, x64[err.argmax()], err.max())
    if dtype == "float64":
        g = ts.grad(lambda x: op.sum(op.lgamma(x)))(x)
        np.testing.assert_allclose(g, special.digamma(x), rtol=1e-12, atol=1e-12)
        h = ts.grad(lambda x: op.sum(op.digamma(x)))(x)
        np.testing.assert_allclose(h, special.polygamma(1, x), rtol=1e-12, atol=1e-12)
    with np.errstate(all="ignore"):
        assert np.isnan(op.lgamma(np.array([-0.5, -1.0]))).all()


# ---- activations composed of registered operators, against PyTorch's ---------------------------
ACTIVATIONS = {
    "elu": (lambda x: op.elu(x, 0.7), lambda F, t: F.elu(t, 0.7)),
    "celu": (lambda x: op.celu(x, 1.3), lambda F, t: F.celu(t, 1.3)),
    "selu": (op.selu, lambda F, t: F.selu(t)),
    "leaky_relu": (lambda x: op.leaky_relu(x, 0.2), lambda F, t: F.leaky_relu(t, 0.2)),
    "hardtanh": (lambda x: op.hardtanh(x, -2.0, 1.5), lambda F, t: F.hardtanh(t, -2.0, 1.5)),
    "hardsigmoid": (op.hardsigmoid, lambda F, t: F.hardsigmoid(t)),
    "hardswish": (op.hardswish, lambda F, t: F.hardswish(t)),
    "softsign": (op.softsign, lambda F, t: F.softsign(t)),
    "mish": (op.mish, lambda F, t: F.mish(t)),
    "log_sigmoid": (op.log_sigmoid, lambda F, t: F.logsigmoid(t)),
    "softplus_beta": (lambda x: op.softplus(x, beta=2.5), lambda F, t: F.softplus(t, 2.5, 1e9)),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activations_match_pytorch(name, dtype, rng):
    torch = pytest.importorskip("torch", reason="PyTorch is the reference (make setup has it)")
    import torch.nn.functional as F
    fn, ref = ACTIVATIONS[name]
    x = (rng.standard_normal((7, 33)) * 4).astype(dtype)
    x[0, :3] = [0.0, -3.0, 3.0]                         # kinks and corners
    want = ref(F, torch.from_numpy(x.astype(np.float64))).numpy()
    assert_close(ts.function(lambda x: fn(x))(x), want.astype(dtype), scale=8)
    assert_close(fn(x), want.astype(dtype), scale=8)     # eager


def test_logaddexp_matches_numpy_and_activations_differentiate(rng):
    a, b = rng.standard_normal((4, 9)) * 30, rng.standard_normal(9) * 30
    a[0, :2] = -np.inf
    b[:2] = -np.inf
    assert_close(ts.function(op.logaddexp)(a, b), np.logaddexp(a, b))
    x = rng.uniform(0.2, 2.0, (3, 5)) * rng.choice([-1.0, 1.0], (3, 5))    # off the kinks
    for name, (fn, _) in sorted(ACTIVATIONS.items()):
        if name not in ("hardtanh", "hardsigmoid", "hardswish"):    # their kinks are at +-1, +-3
            ts.check_grad(fn, x)                         # raises on a mismatch
    # (moderate values: beside a value of 30, a gradient of 1e-8 is below what central
    # differences resolve)
    ts.check_grad(op.logaddexp, a[1:] / 10, b[2:3] * np.ones(9) / 10, atol=1e-6)
