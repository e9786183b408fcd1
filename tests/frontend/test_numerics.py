"""Numerical policies (tessera/numerics.py) and stochastic rounding: each policy changes the
bits it should (float64 accumulation against exact integer sums; saturation; stochastic
rounding unbiased, reproducible, the same on every target) and nothing else; where a policy
comes from (region, function, annotation) and that it keys the caches; loss scaling in grad;
to_mixed_precision."""
import os
import shutil
import sys

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.errors import ArgumentError, DTypeError

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 and fp8 need ml_dtypes")
NARROW = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16),
          np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)]


def neighbours(x, d):
    """The two values of dtype d around each float32 x (equal where x is one)."""
    w = x.astype(d)
    bits = w.view(f"uint{8 * d.itemsize}").astype(np.int64)
    step = np.where(np.abs(w.astype(np.float32)) < np.abs(x), 1, -1)
    other = (bits + step).astype(f"uint{8 * d.itemsize}").view(d)
    return w.astype(np.float32), other.astype(np.float32)


# ---- stochastic rounding ------------------------------------------------------------------------
@pytest.mark.parametrize("d", NARROW, ids=lambda d: d.name)
def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour(d, rng):
    """2000 values, each rounded 2048 times (each element its own counter): every result is
    one of the two neighbours, and each value's mean is x within 6 standard deviations of
    the mean of 2048 draws (p (1 - p) / n, in units of the neighbours' distance)."""
    top = float(ml_dtypes.finfo(d).max) / 4
    x = (rng.uniform(-1, 1, 2000) * rng.choice([1e-3, 1.0, top], 2000)).astype(np.float32)
    n = 2048
    f = ts.function(lambda x: op.round_stochastic(op.broadcast_to(x, [n, 2000]), d, seed=11))
    got = np.asarray(f(x)).astype(np.float32)
    a, b = neighbours(x, d)
    assert ((got == a) | (got == b)).all()
    lo = np.where(np.abs(a) < np.abs(b), a, b)
    gap = np.abs(b - a)
    p = np.where(gap > 0, np.abs(x - lo) / np.where(gap > 0, gap, 1), 0)
    mean = got.astype(np.float64).mean(0)
    bound = 6 * np.sqrt(p * (1 - p) / n) * gap + 1e-7 * gap
    assert (np.abs(mean - x) <= bound).all()
    exact = x.astype(d).astype(np.float32)                   # representable values stay put
    np.testing.assert_array_equal(np.asarray(f(exact)).astype(np.float32)[0], exact)


@pytest.mark.parametrize("target", ["cpu", "cuda", "hip"])
def test_stochastic_rounding_same_bits_everywhere(target, rng):
    """Compiled on each target, eager (the NumPy reference) and on a second call: one answer."""
    x = (rng.standard_normal((33, 65)) * 100).astype(np.float32)
    for d in NARROW:
        f = ts.function(lambda x: op.round_stochastic(x * 1.5, d, seed=5, offset=7))
        want = op.round_stochastic(x * np.float32(1.5), d, seed=5, offset=7)
        if target == "cpu":
            got = np.asarray(f(x))
            np.testing.assert_array_equal(np.asarray(f(x)).view(np.uint8), got.view(np.uint8))
        else:
            if shutil.which(os.environ.get("CXX") or "g++") is None:
                pytest.skip("the CUDA emulator needs a C++20 compiler (g++)")
            sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            import gpu_emulator
            got = gpu_emulator.run_program(f.lower(x, target=target), x)[0]
        np.testing.assert_array_equal(got.view(np.uint8), np.asarray(want).view(np.uint8))
        other = np.asarray(op.round_stochastic(x * np.float32(1.5), d, seed=6, offset=7))
        assert (other.view(np.uint8) != got.view(np.uint8)).any()       # another stream


def test_stochastic_rounding_gradient_is_straight_through(rng):
    """d/dx of sum(w * round_stochastic(x)) is w, in x's dtype (the rounding's expectation is
    x; the cotangent passes through the rounded bfloat16 value, so it is w rounded to nearest
    bfloat16), also when a stochastic policy inserts the rounding."""
    x = rng.standard_normal((6, 9)).astype(np.float32)
    w = rng.standard_normal((6, 9)).astype(np.float32)
    g = ts.grad(lambda x: op.sum(op.cast(op.round_stochastic(x, ts.bf16, seed=2), ts.f32) * w))
    got = np.asarray(g(x))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, w.astype(ml_dtypes.bfloat16).astype(np.float32))
    xb = x.astype(ml_dtypes.bfloat16)
    with ts.policy(rounding="stochastic"):
        gb = np.asarray(ts.grad(lambda x: op.sum(op.cast(x * 2, ts.f32) * w))(xb))
    np.testing.assert_array_equal(gb, (w.astype(ml_dtypes.bfloat16).astype(np.float32) * 2)
                                  .astype(ml_dtypes.bfloat16))


def test_stochastic_rounding_in_loops_draws_anew_each_iteration():
    """1 + 1000 x 0.001 in bfloat16 inside a fori_loop: to nearest every step rounds back to 1;
    stochastically the 512 walks average the exact sum (each step's draw its own: a fixed
    threshold would be biased), within 6 standard deviations of a mean of 512 walks (each
    walk's variance at most 1000 steps x ulp**2 / 4, the ulp 2**-7 in [1, 2)). Two nested
    loops of 10 x 100 draw as one loop of 1000; a scan body has no counter: an error."""
    bf = ml_dtypes.bfloat16
    step = np.asarray(1e-3, bf)

    def walk(t):
        return ts.fori_loop(0, 1000, lambda i, c: c + step, t)

    def nested(t):
        return ts.fori_loop(0, 10, lambda j, c: ts.fori_loop(0, 100, lambda i, c2: c2 + step,
                                                             c), t)
    P = ts.NumericalPolicy(rounding="stochastic", seed=4)
    ones = np.ones(512, bf)
    assert (np.asarray(ts.function(walk)(ones)) == 1).all()
    got = np.asarray(ts.function(walk, policy=P)(ones)).astype(np.float64)
    exact = 1 + 1000 * float(step)
    assert abs(got.mean() - exact) <= 6 * np.sqrt(1000 * 2.0 ** -14 / 4 / 512)
    assert len(np.unique(got)) > 10                       # walks that differ
    np.testing.assert_array_equal(np.asarray(ts.function(nested, policy=P)(ones)),
                                  got.astype(bf))
    scan = ts.function(lambda t: ts.scan(lambda c, x: (c + x, None), t,
                                         np.ones((5, 512), bf))[0], policy=P)
    with pytest.raises(ts.TracingError, match="scan body would draw the same numbers"):
        scan(ones)


# ---- accumulation --------------------------------------------------------------------------------
def test_float64_accumulation_rounds_the_exact_sum_once(rng):
    """Integer-valued float32 data whose sums need more than 24 bits: accumulated in float64
    they are exact, so the result is the exact sum rounded once (NumPy's int64 sum, cast)."""
    x = rng.integers(-2 ** 20, 2 ** 20, size=(6, 5000)).astype(np.float32)
    a = rng.integers(-1000, 1000, size=(40, 300)).astype(np.float32)
    b = rng.integers(-1000, 1000, size=(300, 30)).astype(np.float32)
    f = ts.function(lambda x, a, b: (op.sum(x, axis=-1), a @ b, op.cumsum(x, axis=-1)))
    with ts.policy(accumulation=ts.float64):
        s, m, c = f(x, a, b)
    xi, ai, bi = (v.astype(np.int64) for v in (x, a, b))
    np.testing.assert_array_equal(s, xi.sum(-1).astype(np.float32))
    np.testing.assert_array_equal(m, (ai @ bi).astype(np.float32))
    np.testing.assert_array_equal(c, np.cumsum(xi, -1).astype(np.float32))
    g = f.lower(x, a, b).graph_ir
    assert "policy" not in str(g)                    # outside the region: the plain program
    with ts.policy(accumulation=ts.float64):
        text = str(f.lower(x, a, b).graph_ir)
    assert "from policy(acc=f64):sum" in text and "f64[40,30]" in text


def test_policy_changes_nothing_where_nothing_accumulates_or_rounds(rng):
    x = rng.standard_normal((7, 50)).astype(np.float32)
    f = ts.function(lambda x: op.tanh(x) * 2 + op.exp(x[:, :3].T).sum())
    plain = np.asarray(f(x))
    with ts.policy(rounding="stochastic", saturate=True):       # float32 results: unchanged
        np.testing.assert_array_equal(np.asarray(f(x)), plain)
        assert "policy" not in str(f.lower(x).graph_ir)


def test_less_accumulation_than_storage_is_an_error(rng):
    x = rng.standard_normal(10)
    f = ts.function(lambda x: op.sum(x * 2))
    with ts.policy(accumulation=ts.float32), pytest.raises(DTypeError) as e:
        f(x)
    assert "test_numerics.py" in str(e.value) and "float64" in str(e.value)
    with pytest.raises(DTypeError):
        ts.NumericalPolicy(accumulation=ts.bfloat16)
    with pytest.raises(ArgumentError):
        ts.NumericalPolicy(rounding="down")
    with pytest.raises(ArgumentError):
        ts.NumericalPolicy(deterministic=False)


# ---- rounding policies ------------------------------------------------------------------------------
def test_saturate_and_stochastic_policies_on_narrow_results(rng):
    x = rng.uniform(-3, 3, size=(8, 64)).astype(ml_dtypes.bfloat16)
    h = x.astype(np.float16)
    f = ts.function(lambda x: op.exp(x * 6) - 1)
    assert np.isinf(np.asarray(f(h)).astype(np.float32)).any()
    with ts.policy(saturate=True):
        sat = np.asarray(f(h)).astype(np.float32)
    assert np.isfinite(sat).all() and sat.max() == 65504.0
    with np.errstate(over="ignore"):                    # (float16 overflow, clamped after)
        want = np.minimum(np.exp(h.astype(np.float32) * 6).astype(np.float16)
                          .astype(np.float32), 65504.0)  # each operator's result rounded, clamped
    np.testing.assert_array_equal(sat, (want - 1).astype(np.float16).astype(np.float32))

    policy = ts.NumericalPolicy(rounding="stochastic", seed=3)
    with ts.policy(policy):
        r1, r2 = np.asarray(f(x)), np.asarray(f(x))
        text = str(f.lower(x).graph_ir)
    np.testing.assert_array_equal(r1.view(np.uint16), r2.view(np.uint16))   # reproducible
    assert text.count("round_stochastic(") == 3          # mul, exp, sub: three streams
    assert (r1.view(np.uint16) != np.asarray(f(x)).view(np.uint16)).any()  # not nearest
    y = rng.uniform(-3, 3, size=(8, 64)).astype(ml_dtypes.bfloat16)
    with ts.policy(policy):
        prod = np.asarray(ts.function(lambda x, y: x * y)(x, y)).astype(np.float32)
    exact = x.astype(np.float32) * y.astype(np.float32)      # (exact: 8 + 8 bits)
    a, b = neighbours(exact, np.dtype(ml_dtypes.bfloat16))
    assert ((prod == a) | (prod == b)).all() and (prod != a).any() and (prod != b).any()


def test_policy_on_an_annotation_travels_with_the_tensor(rng):
    P = ts.NumericalPolicy(rounding="stochastic", seed=1)

    @ts.function
    def f(x: ts.Tensor["N", ts.bf16, P], y):
        return (x * 3 + 1, y * 3)
    x = rng.standard_normal(64).astype(ml_dtypes.bfloat16)
    text = str(f.lower(x, x).graph_ir)
    assert text.count("round_stochastic(") == 2        # x * 3 and + 1; y's product is plain
    assert "Tensor['N', tessera.bfloat16, NumericalPolicy(" in repr(f.signature)

    @ts.function
    def g(x: ts.Tensor["N", ts.bf16, P], y: ts.Tensor["N", ts.bf16, ts.NumericalPolicy(
            saturate=True)]):
        return x + y
    with pytest.raises(ArgumentError, match="different numerical policies"):
        g(x, x)


def test_function_policy_and_cache_keys(rng):
    x = rng.standard_normal((4, 3000)).astype(np.float32) * 1000
    plain = ts.function(lambda x: op.sum(x, axis=-1))
    wide = ts.function(lambda x: op.sum(x, axis=-1), policy=ts.NumericalPolicy(
        accumulation=ts.float64))
    want = x.astype(np.float64).sum(-1).astype(np.float32)
    got_plain = np.asarray(plain(x))
    np.testing.assert_array_equal(np.asarray(wide(x)), want)
    with ts.policy(accumulation=ts.float64):             # a region: its own program
        np.testing.assert_array_equal(np.asarray(plain(x)), want)
    np.testing.assert_array_equal(np.asarray(plain(x)), got_plain)   # and back (fast path)
    assert "from policy(acc=f64)" in str(wide.lower(x).graph_ir)


# ---- loss scaling -------------------------------------------------------------------------------------
def test_loss_scale_keeps_small_float16_gradients(rng):
    """A backward whose middle cotangent is about 1e-8 flushes to zero in float16 (smallest
    subnormal 6e-8) and loses the whole gradient; the policy's loss scale 2**10 keeps it,
    and in float32 a power-of-two scale changes no bit."""
    x = rng.uniform(0.5, 1.0, 100).astype(np.float16)

    def loss(x):
        return op.sum(((x * 1e4) * 1e-4) * 1e-4)
    plain = ts.grad(ts.function(loss))(x)
    scaled = ts.grad(ts.function(loss, policy=ts.NumericalPolicy(loss_scale=2.0 ** 10)))(x)
    assert (np.asarray(plain) == 0).all()
    np.testing.assert_allclose(np.asarray(scaled).astype(np.float64), 1e-4, rtol=0.02)

    x32 = rng.standard_normal(50).astype(np.float32)
    g1 = ts.grad(ts.function(lambda x: op.sum(op.tanh(x) ** 2)))(x32)
    with ts.policy(loss_scale=1024.0):
        g2 = ts.grad(ts.function(lambda x: op.sum(op.tanh(x) ** 2)))(x32)
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g2))


# ---- to_mixed_precision ---------------------------------------------------------------------------------
def test_to_mixed_precision_fp8_storage(rng):
    params = {"w": (rng.standard_normal((64, 32)) * 0.02).astype(np.float32),
              "b": np.zeros(32, np.float32), "steps": np.int64(3)}
    mp = ts.to_mixed_precision(params, compute=ts.bf16, accumulate=ts.f32, storage=ts.fp8)
    assert mp.stored["w"].dtype == ml_dtypes.float8_e4m3fn and mp.stored["steps"] == 3
    stored, f32 = mp.nbytes()
    assert stored < f32 / 3
    scale = float(mp.scales["w"])
    assert np.log2(scale) == int(np.log2(scale))                # a power of two
    assert np.abs(params["w"]).max() / scale <= 448
    back = mp.unpack()
    assert back["w"].dtype == ml_dtypes.bfloat16
    w = back["w"].astype(np.float32)
    # e4m3: 3 mantissa bits (relative error 2**-4), below 2**-6 * scale subnormal steps
    assert (np.abs(w - params["w"]) <= np.abs(params["w"]) * 2 ** -4 + 2 ** -10 * scale).all()

    x = rng.standard_normal((5, 64)).astype(np.float32)

    @ts.function(policy=mp.policy)
    def layer(stored, scales, x):
        p = mp.unpack(stored, scales)
        return op.cast(x, ts.bf16) @ p["w"] + p["b"]
    got = np.asarray(layer(mp.stored, mp.scales, x)).astype(np.float32)
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32) @ w
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2 ** -7 * np.abs(want).max())
