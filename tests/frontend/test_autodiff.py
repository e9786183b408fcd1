"""Automatic differentiation: every differentiable operator's adjoint against float64 finite
differences (ts.check_grad), higher order, vjp/jvp against Jacobians built by finite
differences, pytrees, integer inputs, the printed backward graph, compiled vs interpreted,
missing adjoints, determinism, and grad inside a compiled training step."""
import numpy as np
import pytest

import tessera as ts
from tessera import op, ops


def Z(r, *shape):
    return U(r, *shape) + 1j * U(r, *shape)


def U(r, *shape, lo=-2.0, hi=2.0):
    return r.uniform(lo, hi, size=shape)


def away(r, *shape):
    """Values at least 0.2 from 0 (abs, relu: no kink within a finite-difference step)."""
    return r.uniform(0.2, 2.0, size=shape) * r.choice([-1.0, 1.0], size=shape)


def pos(r, *shape):
    return r.uniform(0.3, 2.0, size=shape)


def between(r, *shape):
    """Values 0.1 to 0.4 past an integer: no jump of floor, ceil, round or sign within a
    finite-difference step."""
    return r.integers(-3, 3, size=shape) + r.uniform(0.1, 0.4, size=shape)


def divmod_operands(r):
    """b away from 0, and a / b 0.2 to 0.8 past an integer: no jump of a // b or a % b."""
    b = r.uniform(0.7, 1.3, size=3) * r.choice([-1.0, 1.0], size=3)
    return [b * (r.integers(-3, 3, size=(4, 3)) + r.uniform(0.2, 0.8, size=(4, 3))), b]


UNARY_SHAPES = [(3, 5), (1, 4), (), (2, 1, 3)]
BINARY_SHAPES = [((4, 1, 3), (5, 1)), ((3,), (2, 3)), ((), (2, 2)), ((1,), (3, 1))]


def unary(name, make=U, **attrs):
    return [(lambda x, n=name: getattr(op, n)(x, **attrs), lambda r, s=s: [make(r, *s)])
            for s in UNARY_SHAPES]


def binary(name, ma=U, mb=U):
    return [(lambda a, b, n=name: getattr(op, n)(a, b),
             lambda r, sa=sa, sb=sb: [ma(r, *sa), mb(r, *sb)]) for sa, sb in BINARY_SHAPES]


def reduction(name, make=U, **extra):
    def case(shape, axis, keep):      # a closure: default arguments would be parameters
        return (lambda x: getattr(op, name)(x, axis=axis, keepdim=keep, **extra),
                lambda r: [make(r, *shape)])
    return [case(*c) for c in [((3, 4, 5), [0, 2], True), ((3, 4), 1, False),
                               ((4,), None, False), ((2, 1, 3), None, True)]]


def norm(name):
    return [(lambda x, n=name, a=axis: getattr(op, n)(x, axis=a), lambda r, s=shape: [U(r, *s)])
            for shape, axis in [((2, 3, 6), 1), ((4, 5), -1), ((1, 7), 1)]]


# name -> list of (function, inputs from rng[, check_grad keywords])
CASES = {
    "neg": unary("neg"), "sin": unary("sin"), "cos": unary("cos"), "exp": unary("exp"),
    "tanh": unary("tanh"), "erf": unary("erf"), "sigmoid": unary("sigmoid"),
    "silu": unary("silu"), "log1p": unary("log1p", pos), "expm1": unary("expm1"),
    "softplus": unary("softplus"), "abs": unary("abs", away), "relu": unary("relu", away),
    "sqrt": unary("sqrt", pos), "log": unary("log", pos), "rsqrt": unary("rsqrt", pos),
    "gelu": unary("gelu") + [(lambda x: op.gelu(x, approximate="tanh"),
                              lambda r: [U(r, 3, 4)])],
    "add": binary("add"), "sub": binary("sub"), "mul": binary("mul"),
    "div": binary("div", U, away),
    "pow": binary("pow", pos, U) + [(lambda x: x ** 3, lambda r: [U(r, 2, 3)]),
                                    (lambda x: op.pow(2.5, x), lambda r: [U(r, 4)])],
    "maximum": binary("maximum"), "minimum": binary("minimum"),
    **{n: unary(n, between) for n in ("floor", "ceil", "round", "sign")},
    "mod": [(lambda a, b: op.mod(a, b), divmod_operands), (lambda a, b: a % b, divmod_operands)],
    "floor_divide": [(lambda a, b: a // b, divmod_operands)],
    "where": [(lambda c, a, b: op.where(c, a, b),
               lambda r: [U(r, 4, 3) > 0, U(r, 4, 3), U(r, 3)]),
              (lambda c, a, b: op.where(c, a, b), lambda r: [U(r, 2, 1) > 0, U(r, 1, 3), U(r)])],
    "cast": [(lambda x: op.cast(op.cast(x, "float32"), "float64") * 2.0,
              lambda r: [U(r, 3, 2)], dict(eps=1e-2, rtol=1e-4, atol=1e-6))],
    "cumsum": [(lambda x: op.cumsum(x, axis=1) * op.cumsum(x, axis=0), lambda r: [U(r, 3, 4)]),
               (lambda x: op.cumsum(x), lambda r: [U(r, 5)])],
    # complex parts (gradients of complex inputs: d/dre + i d/dim, checked on both parts)
    "real": [(lambda z: op.real(z) * op.imag(z), lambda r: [Z(r, 3, 4)]),
             (lambda x: op.real(x) * x, lambda r: [U(r, 5)])],
    "imag": [(lambda z: op.imag(z * z), lambda r: [Z(r, 6)])],
    "conj": [(lambda z: op.real(op.conj(z) * op.exp(z * 0.5)), lambda r: [Z(r, 2, 3)])],
    "complex": [(lambda x, y: op.abs(op.complex(x, y) * op.complex(y, 0.5)),
                 lambda r: [U(r, 4), U(r, 3, 4)])],
    # a zero among the factors: the adjoint divides by nothing
    "cumprod": [(lambda x: op.cumprod(x, axis=0) * op.cumprod(x, axis=1),
                 lambda r: [U(r, 3, 4) * (np.arange(12).reshape(3, 4) != 5)]),
                (lambda x: op.cumprod(x), lambda r: [U(r, 7)])],
    "sum": reduction("sum"), "mean": reduction("mean"), "max": reduction("max"),
    # zeros among the factors (one, then two in one product): no division in the adjoint
    "prod": reduction("prod") + [
        (lambda x: op.prod(x, axis=[0, 2]), lambda r: [U(r, 2, 3, 4) * (
            np.arange(24).reshape(2, 3, 4) % 7 != 3)]),
        (lambda x: op.prod(x, axis=1, keepdim=True), lambda r: [U(r, 3, 5) * (
            np.arange(15).reshape(3, 5) % 5 > 1)])],
    "min": reduction("min"), "var": reduction("var") + reduction("var", correction=1)[:2],
    "softmax": norm("softmax"), "log_softmax": norm("log_softmax"),
    "layernorm": norm("layernorm"), "rmsnorm": norm("rmsnorm"),
    "logsumexp": norm("logsumexp") + [(lambda x: op.logsumexp(x, axis=0, keepdim=True),
                                       lambda r: [U(r, 3, 4)])],
    "matmul": [(lambda a, b: a @ b, lambda r, sa=sa, sb=sb: [U(r, *sa), U(r, *sb)])
               for sa, sb in [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 3)),
                              ((2, 3, 4), (4,)), ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 2))]],
    "pad": [(lambda x, m=mode: op.pad(x, [[0, 0], [2, 1], [-1, 3]], mode=m, value=0.5),
             lambda r: [U(r, 2, 5, 6)]) for mode in ("constant", "reflect", "edge", "circular")],
    "conv": [(lambda x, w: op.conv(x, w, stride=2, padding=1, groups=2),
              lambda r: [U(r, 1, 4, 6, 5), U(r, 6, 2, 3, 3)]),
             (lambda x, w: op.conv(x, w, dilation=2, padding="same"),
              lambda r: [U(r, 2, 3, 7), U(r, 2, 3, 3)])],
    "conv_transpose": [(lambda x, w: op.conv_transpose(x, w, stride=2, padding=1,
                                                       output_padding=1),
                        lambda r: [U(r, 1, 3, 4, 3), U(r, 3, 2, 3, 3)])],
    "conv_weight_grad": [(lambda x, g: op.conv_weight_grad(x, g, kernel=[3, 2], stride=[2, 1],
                                                          padding=[[1, 0], [0, 1]],
                                                          dilation=[1, 2], groups=2),
                          lambda r: [U(r, 2, 4, 7, 6), U(r, 2, 6, 3, 5)])],
    "col2im": [(lambda c: op.col2im(c, image=[7, 6], kernel=[3, 2], stride=[2, 1],
                                    padding=[[1, 1], [0, 1]], dilation=[1, 2]),
                lambda r: [U(r, 2, 3, 6, 4, 5)])],
    "max_pool": [(lambda x: op.max_pool(x, 3, 2, 1, ceil_mode=True),
                  lambda r: [U(r, 2, 2, 7, 6)])],
    "avg_pool": [(lambda x: op.avg_pool(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                  lambda r: [U(r, 2, 2, 7, 6)])],
    "attention": [
        (lambda q, k, v: op.attention(q, k, v),
         lambda r: [U(r, 2, 3, 4), U(r, 2, 5, 4), U(r, 2, 5, 3)]),
        (lambda q, k, v, m: op.attention(q, k, v, m, causal=True),
         lambda r: [U(r, 2, 5, 4), U(r, 7, 4), U(r, 1, 7, 3), U(r, 5, 7)]),
        (lambda q, k, v: op.attention(q, k, v, causal=True, scale=0.7),
         lambda r: [U(r, 1, 4, 2), U(r, 1, 3, 2), U(r, 1, 3, 2)]),    # a row sees no key
    ],
    "transpose": [(lambda x: op.transpose(x, perm=[1, 2, 0]), lambda r: [U(r, 2, 3, 4)]),
                  (lambda x: x.T, lambda r: [U(r, 3, 1)])],
    "reshape": [(lambda x: x.reshape(4, -1), lambda r: [U(r, 2, 3, 4)]),
                (lambda x: x.reshape([]), lambda r: [U(r, 1, 1)])],
    "broadcast_to": [(lambda x: op.broadcast_to(x, [2, 3, 5]), lambda r: [U(r, 3, 1)]),
                     (lambda x: op.broadcast_to(x, [4, 2]), lambda r: [U(r)])],
    "slice": [(lambda x: x[1::2, ::-1], lambda r: [U(r, 6, 5)]),
              (lambda x: x[:, 1:3], lambda r: [U(r, 2, 4)]),
              (lambda x: x[-2::-3, 2:], lambda r: [U(r, 8, 3)]),
              (lambda x: x[5:], lambda r: [U(r, 3)])],                   # empty: zero gradient
    "concat": [(lambda a, b: op.concat([a, b, op.exp(a)], axis=1),     # a reaches it twice
                lambda r: [U(r, 2, 3), U(r, 2, 1)]),
               (lambda a, b, c: op.concat([a, b, c], axis=0),
                lambda r: [U(r, 1, 3), U(r, 2, 3), U(r, 4, 3)])],
    "take": [(lambda x, i: op.take(x, i, axis=0),
              lambda r: [U(r, 5, 3), np.array([[0, -1], [4, 0]])]),
             (lambda x, i: op.take(x, i, axis=1), lambda r: [U(r, 2, 4, 3), np.array([3, 3, 1])])],
    "scatter_add": [(lambda t, s: op.scatter_add(t, np.array([1, -1, 1, 0]), s, axis=1),
                     lambda r: [U(r, 2, 3, 2), U(r, 2, 4, 2)])],
    "take_along_axis": [(lambda x, i: op.take_along_axis(x, i, axis=1),
                         lambda r: [U(r, 3, 4), np.array([[0, 0, -1], [3, 1, 2], [2, 2, 2]])])],
    "sort": [(lambda x: op.sort(x, axis=0) * op.sort(x, axis=1, descending=True),
              lambda r: [U(r, 4, 5)]),
             (lambda x: op.topk(x, 2)[0], lambda r: [U(r, 3, 6)])],
    "expand_dims": [(lambda x: op.expand_dims(x, axis=-1), lambda r: [U(r, 2, 3)])],
    "atan2": binary("atan2", U, away),
    "fma": [(lambda a, b, c: op.fma(a, b, c), lambda r: [U(r, 3, 4), U(r, 4), U(r, 3, 1)])],
    # the transforms (more: tests/ops/test_spectral.py) and their primitives on parts
    "fft": [(lambda z: op.real(op.fft(z, n=6) * op.fft(z, n=6)), lambda r: [Z(r, 3, 5)]),
            (lambda x: op.fft(x, axis=0, norm="ortho"), lambda r: [U(r, 4, 3)])],
    "ifft": [(lambda z: op.imag(op.ifft(z, n=4, norm="forward") * op.ifft(z, n=4, norm="forward")),
              lambda r: [Z(r, 2, 7)])],
    "rfft": [(lambda x: op.real(op.rfft(x) * op.rfft(x)), lambda r: [U(r, 3, 6)]),
             (lambda x: op.rfft(x, n=7, axis=0), lambda r: [U(r, 5, 2)])],
    "irfft": [(lambda z: op.irfft(z), lambda r: [Z(r, 2, 5)]),
              (lambda z: op.irfft(z, n=9, norm="ortho"), lambda r: [Z(r, 3, 4)])],
    "dft": [(lambda a, b: op.dft(a, b, axis=0, inverse=True, scale=0.5),
             lambda r: [U(r, 6, 2), U(r, 6, 2)])],
    "dft_r2c": [(lambda x: op.dft_r2c(x, scale=0.25), lambda r: [U(r, 3, 8)]),
                (lambda x: op.dft_r2c(x), lambda r: [U(r, 7)])],
    "dft_c2r": [(lambda a, b: op.dft_c2r(a, b, n=8, scale=2.0), lambda r: [U(r, 2, 5), U(r, 2, 5)]),
                (lambda a, b: op.dft_c2r(a, b, n=7), lambda r: [U(r, 4), U(r, 4)])],
    "squeeze": [(lambda x: op.squeeze(x, axis=1), lambda r: [U(r, 2, 1, 3)])],
}


def _cases():
    for name in sorted(CASES):
        for k, case in enumerate(CASES[name]):
            yield pytest.param(name, case, id=f"{name}-{k}")


def test_every_differentiable_operator_is_covered():
    want = {n for n, d in ops.REGISTRY.items() if d.differentiable}
    # control flow's adjoints: tests/frontend/language/test_control_flow.py; round_stochastic's
    # rule is straight through, a convention no finite difference reproduces (a rounding is a
    # staircase): tests/frontend/test_numerics.py checks it exactly; a host call's is PyTorch's
    # autograd: tests/frontend/interop/test_interop.py
    assert set(CASES) == want - set(ops.regions.REGION_OPS) - {"round_stochastic"} - \
        set(ops.host.HOST_OPS)


def test_nondifferentiable_operators_say_so():
    for name in ["eq", "ne", "lt", "le", "gt", "ge", "argmax", "argmin"]:
        assert not ops.get(name).differentiable
    missing = {n for n, d in ops.REGISTRY.items() if d.differentiable and d.vjp is None}
    # control flow's adjoints are the autodiff pass's own (compiler/backward.py)
    assert missing == set(ops.regions.REGION_OPS)


@pytest.mark.parametrize("name, case", list(_cases()))
def test_adjoint_matches_finite_differences(name, case, rng):
    fn, make = case[0], case[1]
    kw = case[2] if len(case) > 2 else {}
    assert np.isfinite(ts.check_grad(fn, *make(rng), **kw))    # it raises on a mismatch


def _first_cases():
    for name in sorted(CASES):
        yield pytest.param(name, CASES[name][0], id=name)


def _float_positions(xs):
    return tuple(k for k, x in enumerate(xs) if np.asarray(x).dtype.kind in "fc")


def _positional(n, body):
    """body(*args) as a function of n named parameters (tessera functions take no *args)."""
    import inspect
    def f(*a, **k):
        return body(*a, *k.values())
    f.__signature__ = inspect.Signature([inspect.Parameter(
        f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD) for i in range(n)])
    return f


@pytest.mark.parametrize("name, case", list(_first_cases()))
def test_second_derivatives_compose(name, case, rng):
    """The backward graph is differentiable again: grad of (|grad|^2) against finite
    differences of the first gradient (as compiled), for every operator."""
    fn, make = case[0], case[1]
    xs = make(rng)
    w = rng.standard_normal(np.shape(fn(*xs)))
    fl = _float_positions(xs)
    first = ts.grad(_positional(len(xs), lambda *a: op.sum(fn(*a) * w)), argnums=fl)
    square = _positional(len(xs), lambda *a: sum(op.sum(op.real(g * op.conj(g)))
                                                 for g in first(*a)))     # |g|^2, complex too
    # check_grad raises on a mismatch beyond atol + rtol |value|; no absolute bound on top:
    # a layernorm over 3 values with a tiny spread has second derivatives of 1e5 (seed 3383311870)
    assert np.isfinite(ts.check_grad(square, *xs, argnums=fl, rtol=1e-5, atol=1e-6))


@pytest.mark.parametrize("name, case", list(_first_cases()))
def test_jvp_by_transposition_matches_directional_differences(name, case, rng):
    """jvp is the vjp of the vjp: it differentiates every adjoint rule with respect to its
    cotangent, so this checks that every rule is linear in it and composes."""
    fn, make = case[0], case[1]
    kw = case[2] if len(case) > 2 else {}
    xs = make(rng)
    fl = _float_positions(xs)
    tangents = [rng.standard_normal(np.shape(x)) if k in fl else np.zeros_like(x)
                for k, x in enumerate(xs)]
    out, tangent = ts.jvp(fn, xs, tangents)
    h = kw.get("eps", 1e-6)
    shift = lambda s: [x + s * t if k in fl else x for k, (x, t) in enumerate(zip(xs, tangents))]
    want = (np.asarray(fn(*shift(h))) - np.asarray(fn(*shift(-h)))) / (2 * h)
    np.testing.assert_allclose(out, fn(*xs), rtol=kw.get("rtol", 1e-12), atol=1e-12)
    np.testing.assert_allclose(tangent, want, rtol=kw.get("rtol", 1e-6) * 10, atol=1e-6)


# ---- higher order -------------------------------------------------------------------------------
def mlp(x, w1, b1, w2):
    return op.sum(op.tanh(x @ w1 + b1) @ w2)


def test_grad_of_grad_matches_finite_differences_of_the_gradient(rng):
    x, w1, b1, w2 = U(rng, 2, 3), U(rng, 3, 4), U(rng, 4), U(rng, 4, 2)
    first = ts.grad(mlp)                       # d/dx, itself checked against its interpreter
    assert ts.check_grad(first, x, w1, b1, w2) < 1e-6
    # and the mixed second derivatives through grad(grad) with respect to the weights
    second = ts.grad(lambda x, w1, b1, w2: op.sum(first(x, w1, b1, w2) ** 2), argnums=(0, 1))
    gx, gw1 = second(x, w1, b1, w2)
    ts.check_grad(lambda x, w1: op.sum(first(x, w1, b1, w2) ** 2), x, w1)
    assert gx.shape == x.shape and gw1.shape == w1.shape


def test_third_derivative_closed_form(rng):
    x = U(rng, 5)
    d1 = ts.grad(lambda x: op.sum(op.sin(x)))
    d2 = ts.grad(lambda x: op.sum(d1(x)))
    d3 = ts.grad(lambda x: op.sum(d2(x)))
    np.testing.assert_allclose(d1(x), np.cos(x), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(d2(x), -np.sin(x), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(d3(x), -np.cos(x), rtol=1e-13, atol=1e-14)


def test_a_closure_over_the_argument_stays_a_constant(rng):
    x = U(rng, 3)
    # d/dy (y * x) at y = x is x, not 2x: the inner grad's argument is a fresh value
    f = ts.function(lambda x: ts.grad(lambda y: op.sum(y * x))(x))
    np.testing.assert_array_equal(f(x), x)
    # a NumPy array at a differentiated position inside a trace gets a gradient too
    w = U(rng, 3)
    g = ts.function(lambda x: ts.grad(lambda w, x: op.sum(w * x * x))(w, x))
    np.testing.assert_allclose(g(x), x * x, rtol=1e-15)


def test_laplacian_closed_form_and_batched_mlp(rng):
    x = U(rng, 4)
    lap = ts.laplacian(lambda x: op.sum(x ** 3) + op.sum(op.sin(x)))
    np.testing.assert_allclose(lap(x), np.sum(6 * x - np.sin(x)), rtol=1e-12, atol=1e-13)
    # a PINN-style batch: u(x_n) = tanh(x_n W1 + b1) W2, one value per point
    pts, w1, b1, w2 = U(rng, 5, 2), U(rng, 2, 6), U(rng, 6), U(rng, 6, 1)

    def u(p):
        return np.tanh(p @ w1 + b1) @ w2
    got = ts.laplacian(lambda p: op.tanh(p @ w1 + b1) @ w2)(pts)
    h = 1e-4
    want = np.zeros((5, 1))
    for i in range(2):
        e = np.zeros(2)
        e[i] = h
        want += (u(pts + e) - 2 * u(pts) + u(pts - e)) / h ** 2
    assert got.shape == (5, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---- value_and_grad, vjp, jvp -------------------------------------------------------------------
def test_value_and_grad_and_aux(rng):
    x, w1, b1, w2 = U(rng, 2, 3), U(rng, 3, 4), U(rng, 4), U(rng, 4, 2)
    value, grads = ts.value_and_grad(mlp, argnums=(1, 3))(x, w1, b1, w2)
    np.testing.assert_allclose(value, np.sum(np.tanh(x @ w1 + b1) @ w2), rtol=1e-13, atol=1e-13)
    t = 1 - np.tanh(x @ w1 + b1) ** 2
    np.testing.assert_allclose(grads[0], x.T @ (t * w2.sum(1)), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(grads[1], np.tanh(x @ w1 + b1).sum(0)[:, None] * np.ones((4, 2)),
                               rtol=1e-12, atol=1e-13)

    def with_aux(x):
        y = op.exp(x)
        return op.sum(y), y
    (v, aux), g = ts.value_and_grad(with_aux, has_aux=True)(x)
    np.testing.assert_allclose(aux, np.exp(x), rtol=1e-13)
    np.testing.assert_allclose(g, np.exp(x), rtol=1e-13)
    g2, aux2 = ts.grad(with_aux, has_aux=True)(x)
    np.testing.assert_array_equal(g2, g)


def vector_fn(a, b):
    """R^{3x2} x R^2 -> (R^4, R^{2}): a nonlinear map with two outputs."""
    y = op.tanh(op.reshape(a, [6])[:4] * 2.0) * op.sum(b)
    return y, op.sin(a[0] * b)


def vector_fn_np(a, b):
    return np.tanh(a.reshape(6)[:4] * 2.0) * np.sum(b), np.sin(a[0] * b)


def fd_jacobian(f, args, h=1e-6):
    """d(flattened outputs)/d(flattened args) by central differences in NumPy."""
    flat = np.concatenate([a.ravel() for a in args])
    sizes = [a.size for a in args]

    def call(v):
        parts, k = [], 0
        for a, n in zip(args, sizes):
            parts.append(v[k:k + n].reshape(a.shape))
            k += n
        return np.concatenate([np.ravel(o) for o in f(*parts)])
    cols = []
    for i in range(flat.size):
        e = np.zeros_like(flat)
        e[i] = h
        cols.append((call(flat + e) - call(flat - e)) / (2 * h))
    return np.stack(cols, axis=1)


def test_vjp_and_jvp_against_the_jacobian(rng):
    a, b = U(rng, 3, 2), U(rng, 2)
    J = fd_jacobian(vector_fn_np, [a, b])            # [4 + 2, 6 + 2]
    out, back = ts.vjp(vector_fn, a, b)
    for got, want in zip(out, vector_fn_np(a, b)):
        np.testing.assert_allclose(got, want, rtol=1e-13)
    u = (U(rng, 4), U(rng, 2))
    ga, gb = back(u)
    np.testing.assert_allclose(np.concatenate([ga.ravel(), gb]), J.T @ np.concatenate(u),
                               rtol=1e-7, atol=1e-8)
    t = (U(rng, 3, 2), U(rng, 2))
    out2, tangent = ts.jvp(vector_fn, (a, b), t)
    np.testing.assert_allclose(np.concatenate([np.ravel(x) for x in tangent]),
                               J @ np.concatenate([t[0].ravel(), t[1]]), rtol=1e-7, atol=1e-8)
    assert back.function.name == "vjp_vector_fn"


def test_vjp_of_a_scalar_takes_a_number(rng):
    x = U(rng, 3)
    out, back = ts.vjp(lambda x: op.sum(x * x), x)
    (g,) = back(1.0)
    np.testing.assert_allclose(g, 2 * x, rtol=1e-14)


# ---- broadcasting, integer inputs, pytrees ------------------------------------------------------
def test_broadcast_gradients_come_back_in_the_input_shape(rng):
    a, b, c = U(rng, 4, 3), U(rng, 1, 3), U(rng)
    ga, gb, gc = ts.grad(lambda a, b, c: op.sum(a * b + c), argnums=(0, 1, 2))(a, b, c)
    assert ga.shape == (4, 3) and gb.shape == (1, 3) and gc.shape == ()
    np.testing.assert_allclose(gb, a.sum(0, keepdims=True), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(gc, 12.0)


def test_integer_inputs_get_none(rng):
    x, idx = U(rng, 5, 3), np.array([4, 0, 0])
    gx, gi = ts.grad(lambda x, i: op.sum(op.take(x, i) ** 2), argnums=(0, 1))(x, idx)
    assert gi is None
    want = np.zeros_like(x)
    np.add.at(want, idx, 2 * x[idx])
    np.testing.assert_allclose(gx, want, rtol=1e-13)
    assert ts.grad(lambda i: op.sum(op.cast(i, "float64")))(idx) is None
    # inside a dict: None at the integer leaf
    g = ts.grad(lambda p: op.sum(op.take(p["table"], p["ids"])))({"table": x, "ids": idx})
    assert g["ids"] is None and g["table"].shape == x.shape


def test_a_float_argument_the_result_ignores_gets_zeros(rng):
    x, y = U(rng, 3), U(rng, 2, 2)
    gx, gy = ts.grad(lambda x, y: op.sum(x), argnums=(0, 1))(x, y)
    np.testing.assert_array_equal(gy, np.zeros((2, 2)))


def loss_tree(params, x):
    h = op.tanh(x @ params["layers"][0]["w"] + params["layers"][0]["b"])
    out = h @ params["layers"][1]["w"]
    return op.mean(out ** 2) * params["scale"]


def make_tree(rng):
    return {"layers": [{"w": U(rng, 3, 4), "b": U(rng, 4)}, {"w": U(rng, 4, 2)}],
            "scale": 0.5}


def test_gradients_of_nested_dict_and_list_parameters(rng):
    # sums of signed terms can cancel to near 0, where a purely relative tolerance is meaningless
    params, x = make_tree(rng), U(rng, 5, 3)
    g = ts.grad(loss_tree)(params, x)
    assert set(g) == {"layers", "scale"} and g["scale"] is None   # a static number: no gradient
    assert g["layers"][0]["w"].shape == (3, 4) and g["layers"][1]["w"].shape == (4, 2)
    w1, b1, w2 = params["layers"][0]["w"], params["layers"][0]["b"], params["layers"][1]["w"]
    h = np.tanh(x @ w1 + b1)
    dout = 0.5 * 2 * (h @ w2) / (5 * 2)
    np.testing.assert_allclose(g["layers"][1]["w"], h.T @ dout, rtol=1e-12, atol=1e-13)
    dpre = (dout @ w2.T) * (1 - h ** 2)
    np.testing.assert_allclose(g["layers"][0]["w"], x.T @ dpre, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(g["layers"][0]["b"], dpre.sum(0), rtol=1e-12, atol=1e-13)
    assert ts.check_grad(loss_tree, params, x) < 1e-6


def test_a_training_step_in_one_compiled_graph(rng):
    params, x = make_tree(rng), U(rng, 5, 3).astype(np.float32)
    params = ts.pytree.tree_map(lambda a: a.astype(np.float32) if isinstance(a, np.ndarray)
                                else a, params)

    @ts.function
    def step(params, x):
        loss, grads = ts.value_and_grad(loss_tree)(params, x)
        layers = [{k: p[k] - 0.1 * gp[k] for k in p}
                  for p, gp in zip(params["layers"], grads["layers"])]
        return loss, {"layers": layers, "scale": params["scale"]}

    loss, new = step(params, x)
    g = ts.grad(loss_tree)(params, x)
    assert isinstance(loss, np.ndarray) and loss.dtype == np.float32
    np.testing.assert_allclose(new["layers"][0]["w"], params["layers"][0]["w"]
                               - 0.1 * g["layers"][0]["w"], rtol=1e-6, atol=1e-7)
    assert new["scale"] == 0.5 and new["layers"][0]["b"].dtype == np.float32
    graph = str(step.lower(params, x).graph_ir)      # forward, backward and update: one graph
    assert graph.count("matmul") >= 4 and "tanh" in graph
    loss2, _ = step(new, x)
    assert loss2 < loss


# ---- the backward graph, compiled vs interpreted, errors, determinism ---------------------------
def test_the_backward_graph_prints(rng):
    @ts.function
    def f(x: ts.Tensor["B", "D"], w: ts.Tensor["D", "H"]):
        return op.sum(op.softmax(op.tanh(x @ w)))

    text = str(ts.grad(f, argnums=1).graph_ir)
    assert text.startswith("graph @grad_f(%x: f32[B,D], %w: f32[D,H]) -> f32[D,H]")
    body = text.split("softmax", 1)[1]                # the backward follows the forward
    for want in ["transpose(%x)", "matmul", "sub(", "mul(", "sum("]:
        assert want in body, want


def test_a_symbolic_backward_graph_then_its_compiled_gradient(rng):
    @ts.function
    def f(x: ts.Tensor["B", "S", "D"], w: ts.Tensor["D", "H"], b: ts.Tensor["H"]):
        h = op.layernorm(x) @ w + b
        h = op.gelu(h) + op.relu(h) * op.sigmoid(h)
        h = op.concat([h[:, 1:], h[:, :1]], axis=1)
        h = op.where(h > 0, h, op.exp(h) - 1)
        y = op.logsumexp(op.log_softmax(h), axis=-1) + op.var(h, axis=-1) \
            + op.max(op.rmsnorm(h), axis=-1)
        return op.mean(y) + op.sum(op.transpose(h, [2, 0, 1]).reshape(-1, 2) ** 2) * 0.01

    g = ts.grad(f, argnums=(0, 1, 2))
    text = str(g.graph_ir)
    assert "-> f32[B,S,D], f32[D,H], f32[H]" in text and "reshape(%0) {shape=[B*S,D]}" in text
    x, w, b = (U(rng, *s) for s in [(2, 5, 4), (4, 6), (6,)])
    for got, want in zip(g(x, w, b), g.interpret(x, w, b)):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-13)
    ts.check_grad(f, x, w, b)


def test_compiled_gradient_equals_interpreted(rng):
    x, w1, b1, w2 = U(rng, 2, 3), U(rng, 3, 4), U(rng, 4), U(rng, 4, 2)
    g = ts.grad(lambda x, w1, b1, w2: op.mean(op.softmax(op.tanh(x @ w1 + b1) @ w2)
                                               * op.layernorm(x @ w1)[:, :2]), argnums=(0, 1, 2))
    for a, b in zip(g(x, w1, b1, w2), g.interpret(x, w1, b1, w2)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_a_missing_adjoint_names_the_op_and_line(monkeypatch, rng):
    monkeypatch.setattr(ops.get("sin"), "vjp", None)

    def f(x):
        return op.sum(op.sin(x) * 2.0)   # the sin line
    with pytest.raises(ts.DifferentiationError) as e:
        ts.grad(f)(U(rng, 3))
    text = str(e.value)
    assert "(sin)" in text and "no adjoint" in text and "the sin line" in text and "in f" in text
    # off the differentiated path it is not needed
    ts.grad(lambda x, y: op.sum(x * op.sin(y)))(U(rng, 3), U(rng, 3))


def test_grad_of_a_non_scalar_is_an_error(rng):
    with pytest.raises(ts.DifferentiationError, match="scalar"):
        ts.grad(lambda x: x * 2.0)(U(rng, 3))
    with pytest.raises(ts.ArgumentError, match="argnums"):
        ts.grad(lambda x: op.sum(x), argnums=1)(U(rng, 3))


def test_check_grad_reports_a_wrong_rule(monkeypatch, rng):
    monkeypatch.setattr(ops.get("sin"), "vjp", lambda b, xs, y, g, a: [g])   # wrong: not cos
    with pytest.raises(ts.GradientCheckError) as e:
        ts.check_grad(lambda x: op.sum(op.sin(x)), U(rng, 4))
    assert isinstance(e.value, AssertionError) and "finite differences" in str(e.value)


def test_check_grad_allows_the_differences_rounding_only(monkeypatch, rng):
    """f = sum(sin x) + 1e8: each evaluation carries ~1e-8 of rounding, so at a step of 1e-6
    the central difference of a slope of ~1 is off by ~1e-2. That is the difference's noise,
    not a wrong gradient; a slope wrong by one part in a thousand, on a function of ~1, is
    still found."""
    x, c = U(rng, 5), np.full(4, 5e3)
    assert ts.check_grad(lambda x, c: op.sum(op.sin(x)) + op.sum(c * c), x, c, argnums=0) < 0.1
    monkeypatch.setattr(ops.get("sin"), "vjp", lambda b, xs, y, g, a: [b.op(
        "mul", b.op("mul", g, b.op("cos", xs[0])), b.const_like(1.001, g))])
    with pytest.raises(ts.GradientCheckError, match="rounding"):
        ts.check_grad(lambda x: op.sum(op.sin(x)), x)


def test_compiled_gradient_is_bitwise_deterministic(rng):
    x, w1, b1, w2 = (U(rng, *s).astype(np.float32) for s in [(64, 48), (48, 96), (96,), (96, 8)])
    g = ts.grad(lambda x, w1, b1, w2: op.mean(op.log_softmax(op.tanh(x @ w1 + b1) @ w2)),
                argnums=(1, 2, 3))
    first = g(x, w1, b1, w2)
    second = g(x, w1, b1, w2)
    for a, b in zip(first, second):
        assert a.dtype == np.float32 and a.tobytes() == b.tobytes()


def test_grad_is_cached_per_function():
    def f(x):
        return op.sum(x)
    assert ts.grad(f) is ts.grad(f) and ts.grad(f, 0) is not ts.value_and_grad(f, 0)


def test_random_numbers_are_constants_of_the_gradient(rng):
    x = U(rng, 2, 3)
    g = ts.grad(lambda x: op.sum(x * op.random_uniform([2, 3], seed=5, dtype="float64")))(x)
    np.testing.assert_array_equal(g, op.random_uniform([2, 3], seed=5, dtype="float64"))


def test_concat_with_a_repeated_operand(rng):
    """Regression: a kernel reads a buffer once, but a concat copies it once per operand."""
    a, b = U(rng, 2, 3), U(rng, 2, 1)
    f = ts.function(lambda a, b: op.concat([a, b, a], axis=1))
    np.testing.assert_array_equal(f(a, b), np.concatenate([a, b, a], axis=1))


def test_slice_adjoint_compiled_at_run_time(rng):
    """Large enough not to be folded: the padding zeros go in two concats (see above)."""
    x = U(rng, 300, 7)
    g = ts.grad(lambda x: op.sum(op.exp(x[:, 2:5])) + op.sum(op.sin(x[::-2, 1:6:3])))(x)
    want = np.zeros_like(x)
    want[:, 2:5] += np.exp(x[:, 2:5])
    want[::-2, 1:6:3] += np.cos(x[::-2, 1:6:3])
    np.testing.assert_allclose(g, want, rtol=1e-13, atol=1e-15)


def test_a_narrowing_round_trip_rounds_every_element(rng):
    """Regression: gcc 12's SLP vectorizer copied (double)(float)x as x in a short unrolled
    loop (hence -fno-tree-slp-vectorize in the C flags)."""
    x = U(rng, 6)
    f = ts.function(lambda x: op.cast(op.cast(x, "float32"), "float64"))
    np.testing.assert_array_equal(f(x), x.astype(np.float32).astype(np.float64))


def test_a_graph_built_without_a_tracer_is_differentiated(rng):
    """The backward pass needs a Graph, not a trace: a graph written node by node (as an
    importer would) gets its gradient graph, which compiles and matches the closed form."""
    from tessera.compiler.backward import backward
    from tessera.compiler.graph_ir import Builder, Graph
    from tessera.compiler.driver import compile_graph
    from tessera.types import type_of_array
    x, w = rng.standard_normal((5, 4)), rng.standard_normal((4, 3))
    g = Graph("imported")
    px, pw = g.add_param("x", type_of_array(x)), g.add_param("w", type_of_array(w))
    b = Builder(g)
    h = b.op("tanh", b.op("matmul", px, pw))
    loss = b.op("sum", b.op("mul", h, h))
    end = len(g.nodes)
    dx, dw = backward(g, 0, end, [loss], [b.const(1.0, "float64")], [px, pw])
    g.outputs, g.output_structure, g.output_tree = [dx, dw], "tuple", None
    got_dx, got_dw = compile_graph(g.verify(), "cpu", "tuple")(x, w)
    t = np.tanh(x @ w)
    d = 2 * t * (1 - t * t)                   # d(sum h^2)/d(xw)
    np.testing.assert_allclose(got_dx, d @ w.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_dw, x.T @ d, rtol=1e-12, atol=1e-12)
