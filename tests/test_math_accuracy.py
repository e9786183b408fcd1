"""Our float32 exp, tanh and erf (tessera/ops/cmath.py): error bounds in ulp against float64,
special values, and that gcc vectorises them."""
import math
import os
import shutil
import subprocess

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.ops import cmath
from tessera.runtime.toolchain import CFLAGS

BOUNDS = {"exp": 1.0, "tanh": 4.0, "erf": 3.0}       # the ulp bounds the chunks' comments state


def ulps(got, want64):
    """|got - want| in units of the float32 spacing at the true value."""
    with np.errstate(over="ignore"):
        want32 = want64.astype(np.float32)
    keep = np.isfinite(want32) & (np.abs(want32) >= np.finfo(np.float32).tiny)
    spacing = np.spacing(np.abs(want32[keep])).astype(np.float64)
    return np.abs(got[keep].astype(np.float64) - want64[keep]) / spacing


def reference(name, x):
    x64 = x.astype(np.float64)
    if name == "erf":
        return np.array([math.erf(v) for v in x64])
    return getattr(np, name)(x64)


@pytest.mark.parametrize("name", ["exp", "tanh", "erf"])
def test_error_bound_over_the_range(rng, name):
    lo, hi = {"exp": (-103.0, 88.7), "tanh": (-10.0, 10.0), "erf": (-5.0, 5.0)}[name]
    n = 200_001 if name == "erf" else 2_000_001
    x = np.concatenate([np.linspace(lo, hi, n, dtype=np.float32),
                        (rng.standard_normal(n // 4) * hi / 3).astype(np.float32),
                        np.geomspace(1e-30, 1, 10_000).astype(np.float32) * rng.choice([-1, 1], 10_000)])
    got = ts.function(lambda x: getattr(op, name)(x))(x)
    err = ulps(got, reference(name, x))
    assert err.max() <= BOUNDS[name], f"{name}: {err.max():.2f} ulp"


@pytest.mark.parametrize("name,values", [
    ("exp", {np.nan: np.nan, np.inf: np.inf, -np.inf: 0.0, 0.0: 1.0, 89.0: np.inf, -105.0: 0.0}),
    ("tanh", {np.nan: np.nan, np.inf: 1.0, -np.inf: -1.0, 30.0: 1.0, -30.0: -1.0}),
    ("erf", {np.nan: np.nan, np.inf: 1.0, -np.inf: -1.0, 12.0: 1.0, -12.0: -1.0})])
def test_special_values(name, values):
    x = np.array(list(values), np.float32)
    got = ts.function(lambda x: getattr(op, name)(x))(x)
    np.testing.assert_array_equal(got, np.array(list(values.values()), np.float32))
    if name != "exp":               # odd functions keep the sign of zero
        z = ts.function(lambda x: getattr(op, name)(x))(np.array([-0.0, 0.0], np.float32))
        assert np.signbit(z).tolist() == [True, False]


def test_no_libm_call_in_float32_kernels():
    x = np.ones(1 << 16, np.float32)
    code = ts.function(lambda x: op.gelu(op.exp(x)) + op.tanh(x)).lower(x).target_code
    for name in ("expf(", "tanhf(", "erff("):
        assert f" {name}" not in code and f"({name}" not in code and f"={name}" not in code


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
@pytest.mark.parametrize("name", ["expf", "tanhf", "erff"])
def test_gcc_vectorises_them(tmp_path, name):
    src = "\n".join(["#include <math.h>", "#include <stdint.h>", "#include <string.h>",
                     "#define TS_INLINE static inline", cmath.EXPF,
                     cmath.TANHF if name == "tanhf" else "", cmath.ERFF if name == "erff" else "",
                     f"void run(const float* restrict x, float* restrict y, int64_t n) {{",
                     "  #pragma omp simd", "  for (int64_t i = 0; i < n; ++i)",
                     f"    y[i] = ts_{name}(x[i]);", "}"])
    path = tmp_path / "v.c"
    path.write_text(src)
    flags = [f for f in CFLAGS if f not in ("-shared", "-fPIC")]
    out = subprocess.run(["gcc", *flags, "-c", "-fopt-info-vec-optimized", str(path), "-o",
                          os.devnull], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "loop vectorized" in out.stderr
