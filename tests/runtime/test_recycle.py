"""Large results reuse the memory of dead ones (runtime/recycle.py), never of live ones."""
import gc
import threading

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, op
from tessera.runtime import recycle

N = 1 << 19                  # float32 elements: 2 MiB, over recycle.MIN_BYTES


@ts.function
def scaled(x: Tensor["N"], w: Tensor["N"]) -> Tensor["N"]:
    return x * w + 1.0


@pytest.fixture
def inputs():
    rng = np.random.default_rng()
    return [rng.standard_normal(N, dtype=np.float32) for _ in range(2)]


def want(x, w):
    return x * w + np.float32(1.0)


def test_a_dead_result_lends_its_memory_to_the_next(inputs):
    x, w = inputs
    y = scaled(x, w)
    np.testing.assert_array_equal(y, want(x, w))
    block = recycle.block_of(y)                   # (the lease's: held here, it stays a block)
    del y
    gc.collect()
    z = scaled(w, x)
    assert recycle.block_of(z) is block           # the idle block, not fresh pages
    np.testing.assert_array_equal(z, want(w, x))
    assert not z.flags.owndata and z.flags.writeable and z.flags.c_contiguous
    assert z.ctypes.data % recycle.ALIGN == 0


def test_a_view_keeps_the_memory_from_the_next_result(inputs):
    x, w = inputs
    y = scaled(x, w)
    expected = want(x, w)
    tail = y[5:].reshape(-1)[::3]            # a view of a view: its bases reach the lease
    block = recycle.block_of(y)
    del y
    gc.collect()
    others = [scaled(w, x) for _ in range(3)]
    for z in others:
        assert not np.shares_memory(z, tail)
    np.testing.assert_array_equal(tail, expected[5:][::3])
    del tail
    gc.collect()
    assert recycle.block_of(scaled(x, w)) is block  # now free, and used


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int8", "bool"])
def test_results_keep_their_dtype(dtype, inputs):
    """(ml_dtypes' types have no array-interface type string: the block is viewed as them)"""
    x = np.concatenate([inputs[0]] * 4)      # (one-byte results over MIN_BYTES too)
    f = ts.function(lambda x: op.cast(x * 3.0, dtype))
    got = f(x)
    assert recycle.block_of(got) is not None
    ref = (x * np.float32(3.0)).astype(got.dtype)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8))


def test_small_results_and_other_threads(inputs):
    x, w = inputs
    small = ts.function(lambda a, b: a * b)(x[:100], w[:100])
    assert small.flags.owndata                       # under MIN_BYTES: NumPy's own
    results = [None] * 4

    def run(i):
        results[i] = scaled(x, w + np.float32(i))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r, want(x, w + np.float32(i)))
    assert len({r.ctypes.data for r in results}) == 4


def test_release_frees_the_idle_memory(inputs):
    x, w = inputs
    ys = [scaled(x, w) for _ in range(3)]
    del ys
    gc.collect()
    assert recycle.idle_bytes() >= 3 * 4 * N
    assert recycle.release() >= 3 * 4 * N
    assert recycle.idle_bytes() == 0


def test_the_idle_memory_is_capped(inputs, monkeypatch):
    x, w = inputs
    recycle.release()
    monkeypatch.setattr(recycle, "IDLE_BYTES", 4 * N + recycle.ALIGN)   # room for one block
    ys = [scaled(x, w) for _ in range(3)]
    del ys
    gc.collect()
    assert recycle.idle_bytes() == 4 * N + recycle.ALIGN


def test_the_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("TESSERA_IDLE_RESULTS_MB", "0")
    assert recycle._idle_limit() == 0
    monkeypatch.setenv("TESSERA_IDLE_RESULTS_MB", "64")
    assert recycle._idle_limit() == 64 << 20
    monkeypatch.setenv("TESSERA_IDLE_RESULTS_MB", "lots")
    with pytest.warns(UserWarning, match="not a number"):
        assert recycle._idle_limit() == 512 << 20
