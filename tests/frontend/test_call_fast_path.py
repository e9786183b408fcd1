"""A warm call's fast path: arrays of types seen before go straight to their program. It must
give what the full path gives, and step aside for everything the full path handles."""
import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, op
from tessera.errors import ShapeError
from tessera.function import fastpath
from tessera.runtime import isa


@ts.function
def affine(x: Tensor["B", "N"], w: Tensor["N"]) -> Tensor["B", "N"]:
    return x * w + 1.0


def test_a_warm_call_skips_binding_and_tracing_and_gives_the_same_results(rng):
    f = ts.function(lambda x, w: op.softmax(x * w))
    x, w = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    first = f(x, w)
    before = ts.cache_stats()
    outs = [f(x, w) for _ in range(3)]
    after = ts.cache_stats()
    assert after["traces"] == before["traces"] and after["compiles"] == before["compiles"]
    assert after["memory_hits"] - before["memory_hits"] == 3
    assert len(f._fast) == 1
    for o in outs:
        assert o.tobytes() == first.tobytes()
    assert outs[0] is not outs[1]                   # a fresh result array every call
    outs[0][:] = 0
    assert f(x, w).tobytes() == first.tobytes()


def test_numpy_scalars_take_the_fast_path_with_their_own_values(rng):
    """A NumPy scalar is a 0-d tensor argument: warm calls with it skip the binding too, and
    each call reads the value it was given (a new value is not a new program)."""
    f = ts.function(lambda x, s, k: x * s + op.cast(k, "float32"))
    x = rng.standard_normal(6).astype(np.float32)
    f(x, np.float32(2.0), np.int64(1))
    before = ts.cache_stats()
    for _ in range(3):
        s, k = np.float32(rng.standard_normal()), np.int64(rng.integers(-5, 5))
        got = f(x, s, k)
        np.testing.assert_array_equal(got, x * s + np.float32(k))
    after = ts.cache_stats()
    assert after["memory_hits"] - before["memory_hits"] == 3
    assert after["traces"] == before["traces"] and len(f._fast) == 1
    np.testing.assert_array_equal(f(x, np.float64(0.5), np.int64(0)), x * np.float32(0.5))


def test_pytree_arguments_take_the_fast_path_with_the_full_paths_bits(rng, monkeypatch):
    """A training step's dicts of parameters and optimiser state skip the binding on warm calls
    (keyed by their structure), and give the full path's bits; another structure (keys in
    another order, a Python number inside) is a key of its own or the full path."""
    mlp, opt = ts.nn.MLP([6, 8, 3]), ts.optim.Adam(1e-2)

    def train(params, state, x, y):
        loss, grads = ts.value_and_grad(lambda p: ts.nn.mse(mlp(p, x), y))(params)
        params, state = opt.update(grads, state, params)
        return loss, params, state
    x, y = rng.standard_normal((5, 6)).astype(np.float32), rng.standard_normal((5, 3)).astype(
        np.float32)

    def run(step, n=4):
        params = mlp.init(seed=3)
        state, losses = opt.init(params), []
        for _ in range(n):
            loss, params, state = step(params, state, x, y)
            losses.append(float(loss))
        return losses, params
    fast = ts.function(train)
    run(fast, 1)
    before = ts.cache_stats()
    losses, params = run(fast)
    after = ts.cache_stats()
    assert after["memory_hits"] - before["memory_hits"] == 4 and after["traces"] == before["traces"]
    monkeypatch.setattr(fastpath, "FAST_ENTRIES", 0)
    full_losses, full_params = run(ts.function(train))
    assert losses == full_losses
    for a, b in zip(ts.pytree.leaves(params), ts.pytree.leaves(full_params)):
        assert a.tobytes() == b.tobytes()
    # a dict with its keys in another order is another structure: still the right answer
    f = ts.function(lambda d: d["a"] * 2 + d["b"])
    a, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    np.testing.assert_array_equal(f({"a": a, "b": b}), a * 2 + b)
    np.testing.assert_array_equal(f({"b": b, "a": a}), a * 2 + b)
    np.testing.assert_array_equal(f({"a": a, "b": b}), a * 2 + b)
    np.testing.assert_array_equal(f({"a": a, "b": 1.5}), a * 2 + np.float32(1.5))


def test_new_shapes_dtypes_and_layouts_take_the_full_path(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.standard_normal(6).astype(np.float32)
    np.testing.assert_allclose(affine(x, w), x * w + 1, rtol=1e-6)
    y = rng.standard_normal((9, 6)).astype(np.float32)
    np.testing.assert_allclose(affine(y, w), y * w + 1, rtol=1e-6)          # a new size
    z = rng.standard_normal((6, 4)).astype(np.float32).T                   # not contiguous
    np.testing.assert_allclose(affine(z, w), z * w + 1, rtol=1e-6)
    big = x.astype(">f4")                                                  # big-endian
    np.testing.assert_allclose(affine(big, w), x * w + 1, rtol=1e-6)
    assert affine(x.astype(np.float64), w.astype(np.float64)).dtype == np.float64
    assert affine(x, w=w).shape == x.shape                                 # a keyword
    assert affine(x.tolist(), w).shape == x.shape                          # a list


def test_errors_still_name_the_users_line_after_a_warm_call(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.standard_normal(6).astype(np.float32)
    affine(x, w)
    affine(x, w)
    with pytest.raises(ShapeError, match="N=6 from 'x' axis 1, N=5 from 'w' axis 0"):
        affine(x, w[:5].copy())


def test_structured_results_and_the_profiler(rng):
    f = ts.function(lambda x: (op.sum(x, axis=0), {"m": op.max(x), "e": [op.exp(x)]}))
    x = rng.standard_normal((3, 8)).astype(np.float32)
    a = f(x)
    with ts.profiler() as prof:
        b = f(x)
    assert prof.calls == 1                         # the fast path is profiled too
    assert isinstance(b, tuple) and set(b[1]) == {"m", "e"} and isinstance(b[1]["e"], list)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1]["e"][0], b[1]["e"][0])
    g = ts.function(lambda x: [x + 1, x * 2])
    assert isinstance(g(x), list) and isinstance(g(x), list)


def test_the_cpu_target_environment_is_part_of_the_key(rng, monkeypatch):
    f = ts.function(lambda x: op.exp(x))
    x = rng.standard_normal(33).astype(np.float32)
    monkeypatch.delenv(isa.ENV, raising=False)
    host = f(x)
    monkeypatch.setenv(isa.ENV, "generic")
    assert f(x).tobytes() == host.tobytes()
    assert f.programs.last.target == "cpu:generic"
    assert len(f._fast) == 2


def test_forget_programs_drops_the_launchers(rng):
    f = ts.function(lambda x: x + 1)
    x = np.ones(3, np.float32)
    f(x)
    f.forget_programs()
    assert not f._fast and not f.programs.by_key
    np.testing.assert_array_equal(f(x), x + 1)


def test_read_only_and_empty_arrays(rng):
    f = ts.function(lambda x, y: x * 2 + y)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    x.setflags(write=False)
    y = rng.standard_normal(4).astype(np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(f(x, y), x * 2 + y)
    e = np.zeros((0, 4), np.float32)
    for _ in range(2):
        assert f(e, y).shape == (0, 4)
