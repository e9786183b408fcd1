import os
import tempfile

import numpy as np
import pytest

# Every test run gets its own kernel cache, and output buffers are poisoned with NaN (or a
# sentinel) before each run, so an element a kernel forgets to write fails the comparison.
_CACHE = tempfile.mkdtemp(prefix="tessera-test-cache-")
os.environ["TESSERA_CACHE_DIR"] = _CACHE
os.environ["TESSERA_POISON"] = "1"

# Tolerances per dtype, in one place: (rtol, atol).
TOL = {
    np.dtype(np.float32): (2e-5, 2e-6),
    np.dtype(np.float64): (1e-12, 1e-13),
}


def assert_close(got, want, dtype=None, rtol=None, atol=None, scale=1.0):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    if got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
        return
    r, a = TOL[got.dtype]
    np.testing.assert_allclose(got, want, rtol=(rtol or r) * scale, atol=(atol or a) * scale,
                               equal_nan=True)


@pytest.fixture
def rng(request):
    # fresh inputs every run; the seed is printed on failure so a case can be replayed
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def cache_dir():
    return _CACHE
