"""Complex tensors: complex64 and complex128 in and out without a copy, the parts operators, the
arithmetic, exp, abs, matmul, reductions and movement on complex values, compiled against NumPy
on fresh random inputs (sizes 0, 1 and primes), promotion as NumPy, gradients by PyTorch's
convention against finite differences, and the operators that refuse complex saying so."""
import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.errors import UnsupportedDTypeError

from conftest import assert_close


def cplx(rng, *shape, dtype=np.complex64):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / b}


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (3, 13)])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_arithmetic_against_numpy(name, shape, dtype, rng):
    a, b = cplx(rng, *shape, dtype=dtype), cplx(rng, *shape, dtype=dtype)
    fn = BINARY[name]
    got = ts.function(fn)(a, b)
    assert got.dtype == dtype
    assert_close(got, fn(a, b), scale=4)


def test_mixed_real_and_complex_promote_as_numpy(rng):
    z, x32, x64 = cplx(rng, 5), rng.standard_normal(5).astype(np.float32), rng.standard_normal(5)
    cases = [lambda z, x, y: z * x, lambda z, x, y: z + y, lambda z, x, y: x / z,
             lambda z, x, y: z * 2.5 - 1j, lambda z, x, y: y - z]
    for fn in cases:
        got, want = ts.function(fn)(z, x32, x64), fn(z, x32, x64)
        assert got.dtype == want.dtype
        assert_close(got, want, scale=4)


def test_parts_exp_abs_conj(rng):
    z = cplx(rng, 4, 9)
    z[0, 0] = 0                                   # |0| = 0, no 0/0
    f = ts.function(lambda z: (op.real(z), op.imag(z), op.conj(z), op.abs(z), op.exp(z * 0.1)))
    re, im, cj, ab, ex = f(z)
    big = np.array([3e30 + 4e30j], np.complex64)    # |z| without overflow in re^2 + im^2
    assert_close(ts.function(lambda z: op.abs(z))(big), np.abs(big))
    assert re.tobytes() == z.real.tobytes() and im.tobytes() == z.imag.tobytes()
    assert cj.tobytes() == np.conj(z).tobytes()
    assert ab.dtype == np.float32 and ab[0, 0] == 0
    assert_close(ab, np.abs(z), scale=2)
    assert_close(ex, np.exp(z * np.float32(0.1)), scale=4)
    x, y = rng.standard_normal(4).astype(np.float32), rng.standard_normal((3, 4))
    got = ts.function(lambda x, y: op.complex(x, y))(x, y)
    assert got.dtype == np.complex128 and got.tobytes() == (x + 1j * y).tobytes()


def test_matmul_reductions_and_movement(rng):
    a, b = cplx(rng, 2, 5, 7), cplx(rng, 7, 3)
    assert_close(ts.function(lambda a, b: a @ b)(a, b), a @ b, scale=20)
    fns = [lambda z: op.sum(z, axis=1), lambda z: op.mean(z), lambda z: op.transpose(z),
           lambda z: op.reshape(z, [10, 7]), lambda z: z[:, 1:4, ::2],
           lambda z: op.concat([z, z * 2], axis=2), lambda z: op.take(z, np.array([4, 0]), axis=1),
           lambda z: op.broadcast_to(z[0], [3, 5, 7]), lambda z: op.cumsum(z, axis=2),
           lambda z: op.where(op.real(z) > 0, z, 0)]
    for fn in fns:
        assert_close(ts.function(fn)(a), fn(a), scale=8)


def test_zero_copy_layout_and_comparisons(rng):
    z = cplx(rng, 6)
    prog = ts.function(lambda z: z * 2).lower(z)
    assert "%z: c64[6]" in str(prog.graph_ir)
    assert "%z: f32[6,2]" in str(prog.primitive_ir)         # the interleaved parts, in place
    assert not any("c64" in str(b.type) for b in prog.tile_ir.buffers)
    eq = ts.function(lambda a, b: (a == b, a != b))
    w = z.copy()
    w[2] += 1j
    e, n = eq(z, w)
    assert e.tolist() == (z == w).tolist() and n.tolist() == (z != w).tolist()


def test_gradients_follow_pytorch_convention(rng):
    """A real loss's gradient with respect to z is dL/dre + i dL/dim (torch's z.grad): for
    L = sum |z|^2 it is 2 z; check_grad differentiates both parts numerically."""
    z = cplx(rng, 5, dtype=np.complex128)
    g = ts.grad(lambda z: op.sum(op.real(z * op.conj(z))))(z)
    assert_close(g, 2 * z)
    w = cplx(rng, 5, 3, dtype=np.complex128)
    loss = lambda z, w: op.sum(op.abs(op.exp(z * 0.3) @ w / (w + 2.0)))   # noqa: E731
    assert ts.check_grad(lambda z, w: loss(z.reshape(1, 5), w), z, w) < 1e-6


def test_unsupported_operators_and_targets_say_so(rng):
    z = cplx(rng, 3)
    for fn in (lambda z: op.sin(z), lambda z: op.tanh(z), lambda z: op.max(z), lambda z: op.lt(z, z)):
        with pytest.raises(UnsupportedDTypeError, match="does not take complex"):
            ts.function(fn)(z)
        with pytest.raises(UnsupportedDTypeError, match="does not take complex"):
            fn(z)                                  # eagerly too: the same rule


def test_a_real_factor_scales_both_parts(rng):
    """z * w with w real: two products (C99's mixed product), NumPy's bits on finite values."""
    z = (rng.standard_normal((3, 5)) + 1j * rng.standard_normal((3, 5))).astype(np.complex64)
    w = rng.standard_normal(5).astype(np.float32)
    f = ts.function(lambda a, b: a * b)
    np.testing.assert_array_equal(f(z, w), z * w)
    assert sum(n.op == "mul" for n in f.lower(z, w).primitive_ir.nodes) == 2


@pytest.mark.parametrize("name", ["log", "sqrt"])
def test_log_and_sqrt_of_complex_are_numpys(name, rng):
    """The principal branches, at zero, on the negative real axis (both signs of a zero
    imaginary part) and near overflow too; within a few ulps of NumPy's."""
    z = rng.standard_normal((4, 6)) + 1j * rng.standard_normal((4, 6))
    z[0, :5] = [0, -2, -3j, 1e300 + 1e300j, complex(-4, -0.0)]
    f = ts.function(lambda a: getattr(op, name)(a))
    with np.errstate(divide="ignore"):
        want = getattr(np, name)(z)
        # (log|z| near |z| = 1 is near 0: its error is absolute, an ulp of |z|, where NumPy's
        # clog takes log1p; hence the atol)
        np.testing.assert_allclose(f(z), want, rtol=4e-16, atol=4e-16 if name == "log" else 0)
    z64 = z[1:].astype(np.complex64)
    np.testing.assert_allclose(f(z64), getattr(np, name)(z64.astype(np.complex128)), rtol=3e-7,
                               atol=3e-7 if name == "log" else 0)
    assert np.isfinite(ts.check_grad(lambda a: getattr(op, name)(a), z[1:]))


def test_pow_is_numpys(rng):
    """z ** n for an integer known when tracing: NumPy's binary powering with complex products
    (exact where they are: 1j ** 2 is -1, (1 + 1j) ** 2 is 2j; NumPy's own products may use
    FMAs, so an ulp apart elsewhere); any other exponent (complex, real, a tensor) exp(w log z)
    within a few ulps; w = 0 gives 1, z = 0 gives 0 where Re w > 0 and NaN elsewhere, as NumPy;
    a real base with a complex exponent."""
    z = rng.standard_normal((3, 7)) + 1j * rng.standard_normal((3, 7))
    z[0, :4] = [1j, -2, 0, 1 + 1j]
    for k in (2, 3, 7, -1, -3, 0):
        with np.errstate(all="ignore"):             # 0 ** -1, on both sides
            got = ts.function(lambda a: a ** k)(z)
            exact = np.power(z[0, :4], k)
        fin = np.isfinite(np.power(z[1:], k))
        np.testing.assert_allclose(got[1:][fin], np.power(z[1:], k)[fin], rtol=abs(k) * 3e-16)
        np.testing.assert_array_equal(got[0, :4][np.isfinite(exact)], exact[np.isfinite(exact)])
    w = rng.standard_normal((3, 7)) + 1j * rng.standard_normal((3, 7))
    w[0, :5] = [2, 0, 0, -1, 1j]
    z[0, 3:5] = [0, 0]
    f = ts.function(lambda a, b: op.pow(a, b))
    with np.errstate(all="ignore"):
        want = np.power(z, w)
        got = f(z, w)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        fin = ~np.isnan(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=2e-15, atol=1e-300)
        for e in (0.5, -1.5, 2.5j):
            np.testing.assert_allclose(ts.function(lambda a: a ** e)(z[1:]), z[1:] ** e,
                                       rtol=2e-15)
        r = rng.random(7) + 0.1
        np.testing.assert_allclose(f(r, w[1]), np.power(r, w[1]), rtol=2e-15)
    z64, w64 = z[1:].astype(np.complex64), w[1:].astype(np.complex64)
    np.testing.assert_allclose(f(z64, w64), np.power(z64.astype(complex), w64.astype(complex)),
                               rtol=2e-6)
    # gradients off the branch cut of log, where central differences are smooth
    zg = 1.5 + 0.3 * (rng.standard_normal((2, 5)) + 1j * rng.standard_normal((2, 5)))
    wg = 0.5 * (rng.standard_normal((2, 5)) + 1j * rng.standard_normal((2, 5)))
    assert np.isfinite(ts.check_grad(lambda a, b: op.pow(a, b), zg, wg))
    assert np.isfinite(ts.check_grad(lambda a: a ** 3, z[1:]))


def test_complex_carries_in_control_flow(rng):
    """fori_loop, scan (both directions, complex xs and ys), while_loop and cond with complex
    carries, mixed with real ones in a pytree, against the same loops in NumPy; gradients of a
    real loss through them against finite differences."""
    z = rng.standard_normal(4) + 1j * rng.standard_normal(4)
    xs = rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))
    w = rng.standard_normal(4)

    def fn(z, xs, w):
        a, m = ts.fori_loop(0, 3, lambda i, c: (c[0] * c[0] * 0.3 + xs[i] * w, c[1] + op.abs(c[0])),
                            (z, op.abs(z)))
        h, ys = ts.scan(lambda h, x: (h * x * 0.5 + w, h * 1j), z, xs)
        r, rys = ts.scan(lambda h, x: (h + x, op.real(h)), z, xs, reverse=True)
        v = ts.while_loop(lambda v: op.abs(v).sum() < 50, lambda v: v * (1.5 + 0.5j), z)
        d = ts.cond(op.sum(w) > 0, lambda v: v * 2j, lambda v: -v * w, z)
        return a, m, h, ys, r, rys, v, d

    def numpy_fn(z, xs, w):
        a, m = z, np.abs(z)
        for i in range(3):
            a, m = a * a * 0.3 + xs[i] * w, m + np.abs(a)
        h, ys = z, []
        for x in xs:
            ys.append(h * 1j)
            h = h * x * 0.5 + w
        r, rys = z, [None] * 3
        for t in reversed(range(3)):
            rys[t] = r.real
            r = r + xs[t]
        v = z
        while np.abs(v).sum() < 50:
            v = v * (1.5 + 0.5j)
        d = z * 2j if w.sum() > 0 else -z * w
        return a, m, h, np.stack(ys), r, np.stack(rys), v, d

    for got, want in zip(ts.function(fn)(z, xs, w), numpy_fn(z, xs, w)):
        assert got.dtype == np.asarray(want).dtype
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)
    got = ts.function(fn)(z.astype(np.complex64), xs.astype(np.complex64), w.astype(np.float32))
    assert got[0].dtype == np.complex64 and got[1].dtype == np.float32
    loss = lambda z, xs, w: sum(op.sum(op.abs(t) ** 2) for t in fn(z, xs, w)[:6])  # noqa: E731
    assert ts.check_grad(loss, z, xs, w) < 1e-5       # (xs[i]'s adjoint: a complex scatter_add)
    idx = np.array([2, 0, 2])
    want = xs.copy()
    np.add.at(want, idx, xs * 1j)
    np.testing.assert_allclose(ts.function(lambda t, s: op.scatter_add(t, idx, s))(xs, xs * 1j),
                               want, rtol=1e-15)


def test_angle_and_atan2_are_numpys(rng):
    """Within an ulp of the true angle: our atan2 is the C library's (correctly rounded in
    glibc). The reference is NumPy's float64 arctan2 (its own SIMD routine on AVX-512 machines,
    within an ulp); for complex64 that float64 angle rounded to float32, since NumPy's float32
    arctan2 is itself up to 2 ulp off there. The special values (signed zeros, infinities)
    exactly."""
    z = rng.standard_normal(7) + 1j * rng.standard_normal(7)
    x = np.array([-1.0, 2.0, -0.0, np.inf, -np.inf])
    for a in (z, x, z.astype(np.complex64)):
        got = ts.function(lambda v: op.angle(v))(a)
        want = np.angle(a.astype(np.result_type(a, np.complex128)))
        np.testing.assert_array_max_ulp(got, want.astype(got.dtype), maxulp=1)
    got = ts.function(lambda v: op.angle(v))(x)
    np.testing.assert_array_equal(got, np.angle(x))
    np.testing.assert_allclose(op.angle(z, deg=True), np.angle(z, deg=True))
    u, v = rng.standard_normal((2, 5, 3))
    np.testing.assert_array_max_ulp(ts.function(lambda a, b: op.atan2(a, b))(u, v),
                                    np.arctan2(u, v), maxulp=1)
    assert np.isfinite(ts.check_grad(lambda a, b: op.atan2(a, b), u, v))
    assert np.isfinite(ts.check_grad(lambda a: op.angle(a), z))


def test_a_0d_complex_argument_and_result(rng):
    """A 0-d complex array goes in and comes out (NumPy views no 0-d array as another
    itemsize: it crashed with a ValueError), and a strided one is taken as it is."""
    z = np.asarray(np.complex64(rng.standard_normal() + 1j * rng.standard_normal()))
    f = ts.function(lambda a: a * 2.0 + op.conj(a))
    got = f(z)
    assert got.shape == () and got.dtype == np.complex64 and got == z * 2 + np.conj(z)
    w = (rng.standard_normal((2, 6)) + 1j * rng.standard_normal((2, 6)))[:, ::2]
    np.testing.assert_allclose(ts.function(lambda a: op.sum(a, axis=1))(w), w.sum(axis=1))
