"""The Fourier transforms against numpy.fft (pocketfft) on fresh random inputs: every size from
1 to primes and 2^20, NumPy's n, axis and norm, the multi-axis compositions, float32 accuracy
within the stated bound, adjoints against finite differences, and the same bits whatever the
thread count or the batch."""
import math

import numpy as np
import pytest

import tessera as ts
from tessera import op

SIZES = [1, 2, 3, 7, 16, 97, 1000, 4096]


def crandn(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def bound(dtype, n, x):
    """The stated float32/float64 accuracy: every output within 2 eps log2(2n) ||x||_2 of the
    exact transform (per line; measured at most 0.75 of it over the sizes tested here)."""
    eps = np.finfo(dtype).eps
    return 2 * eps * math.log2(2 * n) * np.sqrt(np.sum(np.abs(x) ** 2, axis=-1, keepdims=True))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_each_transform_is_within_the_bound_of_numpys(n, dtype, rng):
    cd = np.complex64 if dtype == np.float32 else np.complex128
    z = crandn(rng, 3, n).astype(cd)
    x = rng.standard_normal((3, n)).astype(dtype)
    half = np.fft.rfft(x.astype(np.float64))
    cases = [(op.fft, z, np.fft.fft(z.astype(np.complex128)), {}),
             (op.ifft, z, np.fft.ifft(z.astype(np.complex128), norm="forward"),
              {"norm": "forward"}),
             (op.rfft, x, half, {}),
             (op.irfft, half.astype(cd), np.fft.irfft(half, n, norm="forward"),
              {"n": n, "norm": "forward"})]
    for f, a, want, kw in cases:
        got = ts.function(lambda v: f(v, **kw))(a)
        assert got.dtype == (cd if np.iscomplexobj(want) else dtype)
        err = np.abs(got.astype(want.dtype) - want)
        # (irfft's input holds each frequency but zero and Nyquist for two)
        size = a if f is not op.irfft else np.fft.irfft(half, n, norm="forward")
        assert np.all(err <= bound(dtype, n, size)), (f.__name__, n, err.max())


def test_a_million_points_are_within_the_bound(rng):
    n = 1 << 20
    z = crandn(rng, n).astype(np.complex64)
    got = ts.function(lambda v: op.fft(v))(z)
    want = np.fft.fft(z.astype(np.complex128))
    assert np.abs(got - want).max() <= bound(np.float32, n, z)[0]


@pytest.mark.parametrize("kind", ["fft", "ifft", "rfft", "irfft"])
@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
def test_n_axis_and_norm_are_numpys(kind, norm, rng):
    x = rng.standard_normal((4, 6, 5))
    a = crandn(rng, 4, 6, 5) if kind in ("fft", "ifft", "irfft") else x
    for n, axis in [(None, -1), (9, 1), (3, 0), (11, -1), (1, 2)]:
        if kind == "irfft" and n is None and axis == 0:
            continue
        want = getattr(np.fft, kind)(a, n=n, axis=axis, norm=norm)
        f = ts.function(lambda v: getattr(op, kind)(v, n=n, axis=axis, norm=norm))
        np.testing.assert_allclose(f(a), want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
        np.testing.assert_allclose(getattr(op, kind)(a, n=n, axis=axis, norm=norm), want,
                                   rtol=1e-12, atol=1e-12)          # eager: NumPy's own


def test_integer_and_16_bit_inputs_take_numpys_dtypes(rng):
    i = rng.integers(-5, 5, (3, 8))
    assert ts.function(lambda v: op.fft(v))(i).dtype == np.complex128
    np.testing.assert_allclose(ts.function(lambda v: op.rfft(v))(i), np.fft.rfft(i), atol=1e-12)
    h = rng.standard_normal((3, 8)).astype(np.float16)
    got = ts.function(lambda v: op.rfft(v))(h)
    assert got.dtype == np.complex64
    np.testing.assert_allclose(got, np.fft.rfft(h.astype(np.float64)), atol=1e-5)


@pytest.mark.parametrize("name,kw", [("fft2", {}), ("ifft2", {"norm": "ortho"}),
                                     ("fftn", {"s": (5, 12), "axes": (-2, -1)}), ("ifftn", {"axes": (0, 2)}),
                                     ("fftn", {}), ("fftshift", {}), ("ifftshift", {"axes": 1})])
def test_the_multi_axis_transforms_are_numpys(name, kw, rng):
    z = crandn(rng, 4, 6, 10)
    f = ts.function(lambda v: getattr(op, name)(v, **kw))
    np.testing.assert_allclose(f(z), getattr(np.fft, name)(z, **kw), atol=1e-12)


@pytest.mark.parametrize("kw", [{}, {"s": (5, 9)}, {"axes": (0, 1)}])
def test_real_multi_axis_transforms_are_numpys(kw, rng):
    x = rng.standard_normal((4, 6, 10))
    fwd = ts.function(lambda v: op.rfft2(v, **kw))
    X = fwd(x)
    np.testing.assert_allclose(X, np.fft.rfft2(x, **kw), atol=1e-12)
    back = ts.function(lambda v: op.irfft2(v, **kw))
    np.testing.assert_allclose(back(X), np.fft.irfft2(X, **kw), atol=1e-12)
    np.testing.assert_allclose(ts.function(lambda v: op.rfftn(v))(x), np.fft.rfftn(x), atol=1e-12)
    Y = np.fft.rfftn(x)
    np.testing.assert_allclose(ts.function(lambda v: op.irfftn(v, s=x.shape))(Y),
                               np.fft.irfftn(Y, s=x.shape, axes=(0, 1, 2)), atol=1e-12)


def test_frequencies_are_numpys():
    for n in (1, 2, 7, 10):
        np.testing.assert_array_equal(op.fftfreq(n, 0.1), np.fft.fftfreq(n, 0.1))
        np.testing.assert_array_equal(op.rfftfreq(n), np.fft.rfftfreq(n))
    with pytest.raises(ts.ArgumentError, match="n=0"):
        op.fftfreq(0)


def test_a_spectral_filter_runs_and_zero_batches_are_empty(rng):
    x = rng.standard_normal((5, 64)).astype(np.float32)
    w = np.exp(-np.arange(33) / 6.0).astype(np.float32)
    f = ts.function(lambda v, w: op.irfft(op.rfft(v) * w, n=64))
    np.testing.assert_allclose(f(x, w), np.fft.irfft(np.fft.rfft(x) * w, 64), atol=2e-6)
    empty = np.zeros((0, 8), np.float32)
    assert ts.function(lambda v: op.rfft(v))(empty).shape == (0, 5)


def test_a_transforms_complex_result_is_written_by_the_transform(rng):
    """The complex result of rfft (or fft) is the transform kernel's output itself, its parts
    already interleaved: no kernel copies it; a complex parameter returned as it is is copied
    by the runtime, not by a kernel."""
    x = rng.standard_normal((6, 40)).astype(np.float32)
    f = ts.function(lambda v: op.rfft(v))
    assert [k.strategy for k in f.lower(x).schedule_ir.kernels] == ["fft"]
    np.testing.assert_allclose(f(x), np.fft.rfft(x), atol=2e-5)
    z = (x + 1j * x[::-1]).astype(np.complex64)
    g = ts.function(lambda z: (op.fft(z, axis=0), z))
    assert [k.strategy for k in g.lower(z).schedule_ir.kernels] == ["fft"]
    y, same = g(z)
    np.testing.assert_allclose(y, np.fft.fft(z, axis=0), atol=5e-5)
    assert same is not z and same.tobytes() == z.tobytes()


@pytest.mark.parametrize("case", [
    ("fft", True, {}), ("fft", False, {"n": 9, "norm": "ortho"}), ("ifft", True, {"n": 5}),
    ("fft", True, {"axis": 0, "norm": "forward"}), ("rfft", False, {}),
    ("rfft", False, {"n": 10, "norm": "forward"}), ("rfft", False, {"n": 4}),
    ("irfft", True, {}), ("irfft", True, {"n": 7, "norm": "ortho"}), ("irfft", True, {"n": 15})],
    ids=lambda c: f"{c[0]}{c[2]}")
def test_adjoints_match_finite_differences(case, rng):
    kind, cplx, kw = case
    x = crandn(rng, 3, 7) if cplx else rng.standard_normal((3, 7))
    assert np.isfinite(ts.check_grad(lambda a: getattr(op, kind)(a, **kw), x))


def test_the_same_bits_whatever_the_threads_and_the_batch(rng, monkeypatch):
    x = rng.standard_normal((64, 1000)).astype(np.float32)
    z = crandn(rng, 64, 97).astype(np.complex64)
    runs = []
    for threads in ("1", "2"):
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        runs.append((ts.function(lambda v: op.rfft(v))(x).tobytes(),
                     ts.function(lambda v: op.fft(v))(z).tobytes()))
    serial = ts.function(lambda v: op.rfft(v), schedule=ts.Schedule(parallel=False))(x)
    assert runs[0] == runs[1] and runs[0][0] == serial.tobytes()
    one = ts.function(lambda v: op.rfft(v))(x[5:6])
    assert one.tobytes() == ts.function(lambda v: op.rfft(v))(x)[5:6].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_each_line_of_a_batch_is_its_own_transform(dtype, rng):
    """A block of lines goes through the routine's transposes (whole vector tiles, then the
    edges) and a line alone does not: each line of 37 (a multiple of no tile), at lengths that
    fill tiles and leave edges (97 a Bluestein one), is its own transform bit for bit. A block
    of 16 lines of 16384 points outgrows the caches and runs its stages in cache-sized blocks
    (the routine's ts_fft_blocked), a line alone in passes over its planes: the same bits."""
    cd = np.complex64 if dtype == np.float32 else np.complex128
    for n in (1000, 97, 30, 16384):
        x = rng.standard_normal((37, n)).astype(dtype)
        z = crandn(rng, 37, n).astype(cd)
        half = np.fft.rfft(x).astype(cd)
        for f, a, kw in [(op.rfft, x, {}), (op.fft, z, {}), (op.ifft, z, {}),
                         (op.irfft, half, {"n": n})]:
            fn = ts.function(lambda v: f(v, **kw))
            whole = fn(a)
            for i in (0, 17, 36):
                assert fn(a[i:i + 1]).tobytes() == whole[i:i + 1].tobytes(), (f.__name__, n, i)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_lines_read_in_place_are_the_gathered_bits(dtype, rng):
    """A long complex line read as it lies in its array goes through the routine's
    ts_fft_pairs, whose first pass reads the pairs and whose last writes them (in blocks where
    the planes outgrow L2: 2^18 points). Computed on the way in (times 2, exact in NumPy too),
    the same lines are gathered into planes and scattered back: the same bits, for a slice
    of the batch too, every norm, and a Bluestein length; numpy's values within the bound."""
    cd = np.complex64 if dtype == np.float32 else np.complex128
    for n in (1 << 16, 65537, 1 << 18):
        z = crandn(rng, 3, n).astype(cd)
        for f, norm in [(op.fft, "backward"), (op.ifft, "backward"), (op.ifft, "ortho"),
                        (op.fft, "forward"), (op.ifft, "forward")]:
            direct = ts.function(lambda v: f(v, norm=norm))
            gathered = ts.function(lambda v: f(v * 2, norm=norm))
            assert "ts_fft_pairs" in direct.lower(z).target_code
            assert "ts_fft_pairs" not in gathered.lower(z).target_code
            got = direct(z * 2)
            assert got.tobytes() == gathered(z).tobytes(), (f.__name__, norm, n)
            assert direct(z[1:]).tobytes() == direct(z)[1:].tobytes(), (f.__name__, norm, n)
            ref = getattr(np.fft, f.__name__)(z.astype(np.complex128) * 2, norm=norm)
            size = z * 2 if (f is op.fft) == (norm != "forward") else ref
            assert np.all(np.abs(got - ref) <= bound(dtype, n, size)), (f.__name__, norm, n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_read_in_place_are_the_gathered_bits(dtype, rng):
    """Lines read as they lie and written where they go (a complex array's pairs, a real line of
    even n as n/2 pairs, equally spaced: a slice of columns too) go through the routine's own
    transposes, which conjugate, untangle and scale on the way (ts_fft at step 2); computed on
    the way in (times 2, exact), the same lines are gathered into planes here and scattered
    back: the same bits, for 37 lines (tiles and their edges), every kind and norm, sizes with
    and without whole tiles and a Bluestein one; numpy's values within the bound."""
    cd = np.complex64 if dtype == np.float32 else np.complex128
    for n in (1000, 30, 194, 4096):
        x = rng.standard_normal((37, n + 6)).astype(dtype)
        z = crandn(rng, 37, n).astype(cd)
        half = np.fft.rfft(x[:, :n]).astype(cd)
        for f, a, kw, cut in [(op.rfft, x, {}, True), (op.fft, z, {}, False),
                              (op.ifft, z, {"norm": "ortho"}, False),
                              (op.irfft, half, {"n": n}, False),
                              (op.irfft, half, {"n": n, "norm": "forward"}, False)]:
            take = (lambda v: v[:, :n]) if cut else (lambda v: v)
            direct = ts.function(lambda v: f(take(v), **kw))
            gathered = ts.function(lambda v: f(take(v) * 2, **kw))
            kind = f"ts_fft_{'f32' if dtype == np.float32 else 'f64'}((in0"
            assert kind in direct.lower(a).target_code, (f.__name__, n)
            assert kind not in gathered.lower(a).target_code, (f.__name__, n)
            got = direct(a * 2)
            assert got.tobytes() == gathered(a).tobytes(), (f.__name__, n, kw)
            ref = getattr(np.fft, f.__name__)(take(a).astype(np.complex128 if f is not op.rfft
                                                               else np.float64) * 2, **kw)
            size = take(a) * 2 if f is not op.irfft else ref
            assert np.all(np.abs(got - ref) <= bound(dtype, n, size)), (f.__name__, n, kw)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lines_along_an_outer_axis_are_the_gathered_bits(dtype, rng):
    """Lines along axis 0 read in place lie element-major (element k of every line in row k:
    rfft2's column transforms), which the routine moves a row of lanes at a time: the same bits
    as the lines gathered into planes, each kind (a real line's pairs a row apart, the inverse
    real transform's output likewise), 37 lines (a block and its edge); a middle axis of a
    3-D array (lines not equally spaced) is gathered, and agrees with NumPy."""
    cd = np.complex64 if dtype == np.float32 else np.complex128
    for n in (256, 30):
        x = rng.standard_normal((n, 37)).astype(dtype)
        z = crandn(rng, n, 37).astype(cd)
        half = np.fft.rfft(x, axis=0).astype(cd)
        for f, a, kw in [(op.rfft, x, {}), (op.fft, z, {}), (op.ifft, z, {"norm": "ortho"}),
                         (op.irfft, half, {"n": n})]:
            direct = ts.function(lambda v: f(v, axis=0, **kw))
            gathered = ts.function(lambda v: f(v * 2, axis=0, **kw))
            kind = f"ts_fft_{'f32' if dtype == np.float32 else 'f64'}((in0"
            assert kind in direct.lower(a).target_code, (f.__name__, n)
            assert direct(a * 2).tobytes() == gathered(a).tobytes(), (f.__name__, n, kw)
    y = rng.standard_normal((3, 64, 5)).astype(dtype)
    middle = ts.function(lambda v: op.rfft(v, axis=1))
    assert "ts_fft_" in middle.lower(y).target_code
    assert not any(f"ts_fft_{s}((in0" in middle.lower(y).target_code for s in ("f32", "f64"))
    err = np.abs(middle(y) - np.fft.rfft(y.astype(np.float64), axis=1))
    assert np.all(err <= np.moveaxis(bound(dtype, 64, np.moveaxis(y, 1, -1)), -1, 1))


def test_reversed_and_strided_lines_read_in_place(rng):
    """Views read in place with negative or wider steps (a line reversed, the lines reversed,
    every other element) go to the routine as they lie: the gathered bits, NumPy's values."""
    x = rng.standard_normal((37, 132)).astype(np.float32)      # (66 points every other one)
    for view in (lambda v: v[:, ::-1], lambda v: v[::-1], lambda v: v[:, ::2],
                 lambda v: v[::-1, 1::2]):
        direct = ts.function(lambda v: op.rfft(view(v)))
        gathered = ts.function(lambda v: op.rfft(view(v) * 2))
        assert "ts_fft_f32((in0" in direct.lower(x).target_code
        got = direct(x * 2)
        assert got.tobytes() == gathered(x).tobytes()
        want = np.fft.rfft(view(x.astype(np.float64) * 2))
        assert np.all(np.abs(got - want) <= bound(np.float32, want.shape[-1], view(x * 2)))


def test_bad_arguments_are_named(rng):
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ts.ShapeError, match="n=0"):
        ts.function(lambda v: op.fft(v, n=0))(x)
    with pytest.raises(ts.ShapeError, match="0 points"):
        ts.function(lambda v: op.fft(v))(np.zeros((3, 0), np.float32))
    with pytest.raises(ts.DTypeError, match="real"):
        ts.function(lambda v: op.rfft(v))(x.astype(np.complex64))
    with pytest.raises(ts.ArgumentError, match="norm"):
        ts.function(lambda v: op.fft(v, norm="unitary"))(x)
    with pytest.raises(ts.ShapeError, match="axis 2"):
        ts.function(lambda v: op.fft(v, axis=2))(x)


def test_twiddles_are_within_an_ulp_without_a_c_library(rng):
    """cos_sin (the twiddles' cos and sin on [0, pi/4], the same + and * on every target) against
    their Taylor series summed in 50-digit decimal arithmetic, on fresh angles and the ends."""
    from decimal import Decimal, localcontext

    from tessera.compiler.strategies.fft import cos_sin, unit

    def exact(a):
        with localcontext() as ctx:
            ctx.prec = 50
            x, term, c, s, k = Decimal(a), Decimal(1), Decimal(0), Decimal(0), 0
            while k < 60:                   # term = x^k / k!
                if k % 2 == 0:
                    c += term if k % 4 == 0 else -term
                else:
                    s += term if k % 4 == 1 else -term
                k += 1
                term = term * x / k
            return c, s

    arith = (lambda x, y: x + y, lambda x, y: x - y, lambda x, y: x * y, float)
    angles = list(rng.random(2000) * (math.pi / 4)) + [0.0, 1e-300, 1e-9, math.pi / 4]
    for a in angles:
        for got, want in zip(cos_sin(float(a), *arith), exact(float(a))):
            if want:
                assert abs(Decimal(got) - want) <= Decimal(0.75 * math.ulp(float(want))), a
    for n in (7, 12, 1000, 4096):
        j = np.arange(n)
        w = np.array([complex(*unit(int(k), n)) for k in j])
        # NumPy's own angle 2 pi j / n is rounded: up to 2 pi 2^-53 off
        np.testing.assert_allclose(w, np.exp(-2j * np.pi * j / n), rtol=0, atol=2e-15)


@pytest.mark.parametrize("target", ["cpu", "cuda", "hip"])
def test_no_transform_calls_the_c_library(target, rng):
    """The twiddles are cos_sin's own arithmetic on every target: CUDA's sin and cos are not
    glibc's (an H200 gave other bits), so a call of either would lose the CPU's bits there."""
    import re

    x = rng.standard_normal((3, 1000)).astype(np.float32)
    fn = ts.function(lambda x: (op.real(op.fft(op.complex(x, x))), op.irfft(op.rfft(x), n=1000)))
    prog = fn.lower(x, target=target)
    sources = [prog.target_code, *getattr(prog, "routine_sources", {}).values()]
    assert "ts_fft_cos_sin" in "".join(sources) or target != "cpu"
    for src in sources:
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", src, flags=re.S)       # not the comments
        assert not re.search(r"\b(sin|cos|sinf|cosf)\s*\(", code)


def test_small_transforms_run_on_one_thread_and_big_ones_on_all():
    """Threads only where a transform has a million FLOPs or more, as the other strategies:
    waking a second thread for 512 short lines cost 60 times their work on a loaded machine."""
    def knobs(shape, axis):
        x = np.zeros(shape, np.float32)
        prog = ts.function(lambda x: op.rfft(x, axis=axis)).lower(x)
        (k,) = [k for k in prog.schedule_ir.kernels if k.strategy == "fft"]
        return k.knobs["parallel"]
    assert knobs((32, 64, 16), 1) is False
    assert knobs((256, 1024), 1) is True
