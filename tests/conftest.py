import atexit
import os
import shutil
import tempfile

import numpy as np
import pytest

from narrow_reference import round_to_narrow_bits  # noqa: F401  (for the tests)

# Every test run gets its own kernel cache, and output buffers are poisoned with NaN (or a
# sentinel) before each run, so an element a kernel forgets to write fails the comparison.
_CACHE = tempfile.mkdtemp(prefix="tessera-test-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ["TESSERA_CACHE_DIR"] = _CACHE
os.environ["TESSERA_POISON"] = "1"
# The ISA's own GEMM micro-kernel shape, and the direct convolution's: every fresh cache
# directory (a subprocess's, a test's) would otherwise first measure the machine's best (about
# 5 s each). Every shape gives the same bits; tests/targets/test_gemm_shape.py runs each
# candidate, and the measurements.
os.environ["TESSERA_GEMM_SHAPE"] = "default"
os.environ["TESSERA_CONV_SHAPE"] = "default"

# Tolerances per dtype, in one place: (rtol, atol).
TOL = {
    np.dtype(np.float32): (2e-5, 2e-6),
    np.dtype(np.float64): (1e-12, 1e-13),
    # 16-bit floats against float32 arithmetic rounded once: 2 ulps relative (eps: 2^-10 for
    # f16, 2^-7 for bf16), 1 ulp of 1 absolute (inputs of unit scale; cancellation near 0)
    np.dtype(np.float16): (2 ** -9, 2 ** -10),
}
TOL[np.dtype(np.complex64)] = TOL[np.dtype(np.float32)]      # on the modulus of the error
TOL[np.dtype(np.complex128)] = TOL[np.dtype(np.float64)]
try:
    import ml_dtypes
    TOL[np.dtype(ml_dtypes.bfloat16)] = (2 ** -6, 2 ** -7)
except ImportError:
    pass


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


def assert_within_dot_bound(got, a, b):
    """A matmul against the float64 product, within the classical forward error bound of a
    K-term dot product in the inputs' precision: |err| <= K * eps * (|a| @ |b|) (+ a tiny floor)."""
    got = np.asarray(got)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = a64 @ b64
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want.astype(got.dtype))
        return
    k = a.shape[-1]
    eps = np.finfo(got.dtype).eps
    bound = k * eps * (np.abs(a64) @ np.abs(b64)) + np.finfo(got.dtype).tiny
    err = np.abs(got.astype(np.float64) - want)
    assert got.shape == want.shape and got.dtype == np.result_type(a, b)
    assert (err <= bound).all(), f"max err {err.max()} over bound {bound[err > bound].min()}"


def nvrtc_or_skip():
    """Skip the calling test, saying why, where the NVRTC library is not installed."""
    from tessera.errors import BackendUnavailableError
    from tessera.runtime import gpu_toolchain as tc
    try:
        tc.nvrtc_library()
    except BackendUnavailableError as e:
        pytest.skip(f"NVRTC is not installed: {e.summary}")


def hipcc_or_skip():
    """Skip the calling test, saying why, where hipcc is not installed."""
    from tessera.errors import BackendUnavailableError
    from tessera.runtime import gpu_toolchain as tc
    try:
        tc.find_hipcc()
    except BackendUnavailableError as e:
        pytest.skip(f"hipcc is not installed: {e.summary}")


def onnx_exported_by_pytorch(module, *args) -> bytes:
    """PyTorch's ONNX exporter's file for module on args (torch.export, then onnxscript's
    translation, opset 18), written through a temporary file (a BytesIO destination is
    deprecated) with its weights inside."""
    import contextlib
    import io
    import torch
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
        path = os.path.join(folder, "model.onnx")
        torch.onnx.export(module, args, path, dynamo=True, opset_version=18,
                          external_data=False)
        with open(path, "rb") as f:
            return f.read()


def attention_reference(q, k, v, mask=None, causal=False, scale=None):
    """float64 softmax(scale * q k^T + mask) v, the reference of every attention test: the mask
    read in q's dtype (as the kernels read it), a bottom-right causal horizon, and 0 for a row
    that sees no key (every key masked, or none at all)."""
    q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q64 @ np.swapaxes(k64, -1, -2) * np.float64(scale)
    if mask is not None:
        s = s + np.asarray(mask, q.dtype).astype(np.float64)
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.tril(np.ones((sq, sk), bool), k=sk - sq), s, -np.inf)
    m = s.max(-1, keepdims=True) if s.shape[-1] else np.zeros(s.shape[:-1] + (1,))
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(-1, keepdims=True)
    return np.where(z > 0, e / np.where(z > 0, z, 1), 0) @ v64


@pytest.fixture
def rng(request):
    # fresh inputs every run; the seed is printed on failure so a case can be replayed
    # (TESSERA_TEST_SEED=<seed> pytest <test id>)
    seed = int(os.environ.get("TESSERA_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def cache_dir():
    return _CACHE


def pytest_collection_modifyitems(config, items):
    """nbval: notebook cells tagged `gpu` need a GPU (CuPy with a device); without one they skip,
    with that reason, and the notebook goes on. (Here rather than in tutorials/, where a second
    conftest module would shadow this one's helpers.)"""
    gpu_cells = [item for item in items
                 if "gpu" in getattr(getattr(item, "cell", None), "metadata", {}).get("tags", [])]
    if not gpu_cells:
        return
    from tessera.runtime.gpu import runnable_targets
    if runnable_targets():
        return
    skip = pytest.mark.skip(reason="a notebook cell tagged gpu: no GPU here (CuPy finds no device)")
    for item in gpu_cells:
        item.add_marker(skip)
