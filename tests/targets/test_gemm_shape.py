"""The GEMM micro-kernel's shape and the direct convolution's, chosen per machine
(compiler/target/gemm_shape.py): every candidate gives the same bits as the ISA's own shape
(float32 and float64 products with edges, transposed operands and K blocks; the convolution's
implicit GEMM and its direct path), each measurement picks a candidate and is cached, and a wrong
$TESSERA_GEMM_SHAPE or $TESSERA_CONV_SHAPE is a clear error. The levels named are the vector
families' (x86-64-v3: AVX2, x86-64-v4: AVX-512), each where this CPU runs it."""
import json
import platform

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.compiler.target import gemm_shape as gs
from tessera.compiler.target.c import (conv_shape, gemm_shape, gemm_shape_report,
                                       routine_library_source)
from tessera.errors import BackendUnavailableError
from tessera.runtime import isa

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="the candidate shapes are x86-64's (AVX2, AVX-512)")
LEVELS = [lv for lv in ("x86-64-v3", "x86-64-v4") if isa.runs_here(lv)]


def _products(level, rng):
    """Results of products whose tiles cover the micro-kernel's edges and K blocks."""
    out = []
    for dtype in (np.float32, np.float64):
        f = ts.function(lambda a, b: a @ b, target=f"cpu:{level}")
        ft = ts.function(lambda a, b: a.T @ b.T, target=f"cpu:{level}")
        for m, k, n in [(37, 300, 83), (130, 513, 260), (9, 40, 70)]:
            a = rng.standard_normal((m, k)).astype(dtype)
            b = rng.standard_normal((k, n)).astype(dtype)
            got = f(a, b)
            np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
            out += [got, ft(np.ascontiguousarray(a.T), np.ascontiguousarray(b.T))]
    conv = ts.function(lambda x, w: op.conv(x, w, padding=1), target=f"cpu:{level}")
    out.append(conv(rng.standard_normal((2, 19, 13, 11)).astype(np.float32),
                    rng.standard_normal((24, 19, 3, 3)).astype(np.float32)))
    for dtype in (np.float32, np.float64):     # the direct path: 192 channels fill every
        out.append(conv(rng.standard_normal((2, 30, 9, 11)).astype(dtype),  # shape's vectors
                        rng.standard_normal((192, 30, 3, 3)).astype(dtype)))
    return out


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kernel", ["gemm", "conv"])
def test_every_candidate_shape_gives_the_same_bits(level, kernel, monkeypatch):
    seed = np.random.SeedSequence().entropy
    env = gs.KERNELS[kernel]["env"]
    monkeypatch.setenv(gs.ENV, "default")
    monkeypatch.setenv(gs.KERNELS["conv"]["env"], "default")
    want = _products(level, np.random.default_rng(seed))
    for rows, vectors in gs.CANDIDATES[gs.family(level)][1:]:
        monkeypatch.setenv(env, f"{rows}x{vectors}")
        assert (gemm_shape if kernel == "gemm" else conv_shape)(level) == (rows, vectors)
        got = _products(level, np.random.default_rng(seed))
        for g, w in zip(got, want):
            assert g.tobytes() == w.tobytes(), (level, kernel, rows, vectors, g.shape)


def test_a_shape_reaches_the_libraries_that_have_a_micro_kernel():
    shaped = routine_library_source("gemm:f32", (4, 4))
    assert "#define TS_MICRO_MR 4" in shaped and "#define TS_MICRO_NV 4" in shaped
    assert "#define TS_MICRO_MR" not in routine_library_source("gemm:f32")
    assert "#define TS_MICRO_MR" in routine_library_source("conv:f64", (4, 4))
    assert routine_library_source("attention:f32", (4, 4)) == \
        routine_library_source("attention:f32")
    direct = routine_library_source("conv:f32", None, (6, 4))
    assert "#define TS_MICRO_DMR 6" in direct and "#define TS_MICRO_DNV 4" in direct
    assert "#define TS_MICRO_MR" not in direct
    assert "#define TS_MICRO_DMR" not in routine_library_source("gemm:f32", (4, 4), (6, 4))


@pytest.mark.skipif(not isa.runs_here("x86-64-v3"), reason="a CPU without AVX2")
@pytest.mark.parametrize("kernel", ["gemm", "conv"])
def test_the_measurement_picks_a_candidate_and_is_cached(kernel, tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(gs.KERNELS[kernel]["env"], raising=False)
    report = gemm_shape_report("x86-64-v3", kernel=kernel)
    assert report["kernel"] == kernel and tuple(report["shape"]) in gs.CANDIDATES["avx2"]
    assert set(report["gflops"]) == {f"{r}x{v}" for r, v in gs.CANDIDATES["avx2"]}
    assert all(g > 0 for g in report["gflops"].values())
    best = max(report["gflops"].values())
    assert report["gflops"]["x".join(map(str, report["shape"]))] * gs.MARGIN >= best
    [path] = (tmp_path / "machine").glob(f"{kernel}-shape-*.json")
    chosen = tuple(report["shape"])        # what programs built now take: the measured shape
    assert (gemm_shape if kernel == "gemm" else conv_shape)("x86-64-v3") == \
        (None if chosen == gs.CANDIDATES["avx2"][0] else chosen)

    def no_measuring(*a):
        raise AssertionError("measured again")
    monkeypatch.setattr(gs, "_measure", no_measuring)
    assert gemm_shape_report("x86-64-v3", kernel=kernel) == report
    path.write_text("{not json")                    # damaged: measured again, rewritten
    monkeypatch.undo()
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    again = gemm_shape_report("x86-64-v3", kernel=kernel)
    assert tuple(again["shape"]) in gs.CANDIDATES["avx2"]
    assert json.loads(path.read_text())["shape"] == again["shape"]


@pytest.mark.parametrize("kernel", ["gemm", "conv"])
def test_a_wrong_shape_names_the_variable(kernel, monkeypatch):
    env = gs.KERNELS[kernel]["env"]
    monkeypatch.setenv(env, "5x5")
    level = LEVELS[-1] if LEVELS else "x86-64-v3"
    with pytest.raises(BackendUnavailableError, match=env) as e:
        gs.forced(level, kernel)
    assert "default" in str(e.value) and "x".join(map(str, gs.CANDIDATES[gs.family(level)][0])) \
        in str(e.value)
    assert gemm_shape("x86-64-v2") is None           # (one shape: nothing to choose)
