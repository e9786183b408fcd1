"""Our transcendentals (tessera/compiler/spelling/libm.h), compiled through the public API: the
largest error in ulp against a float64 reference (float32 functions) or a long double one (float64
functions) over dense sweeps, the edges of every branch and clamp, fresh random inputs and
random bit patterns; the special values; no libm call left in the generated C; gcc vectorises
each function inside `#pragma omp simd`; the vector and scalar code give the same bits."""
import ctypes
import math
import platform
import re
import shutil
import subprocess

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.compiler.spelling import libm
from tessera.runtime import isa
from tessera.runtime.toolchain import flags

# The bounds the chunks' comments state. float32: the largest error over every float32 input,
# so no input can exceed them. float64: measured on 10^8 samples (0.63, 0.80, 1.02 ulp); the
# bound asserted leaves room for inputs the samples missed.
F32_BOUND = {"exp": 0.61, "tanh": 0.76, "erf": 0.99, "log": 0.92}
F64_BOUND = {"exp": 1.0, "tanh": 1.0, "erf": 1.5}
SUBNORMAL_BOUND = 1.0       # exp's gradual underflow is rounded twice: 0.76 (f32), 0.77 (f64)

F32_RANGE = {"exp": (-104.0, 89.0), "tanh": (-10.0, 10.0), "erf": (-4.5, 4.5), "log": (0.0, 1e4)}
F64_RANGE = {"exp": (-746.0, 710.0), "tanh": (-20.0, 20.0), "erf": (-6.5, 6.5)}
# every input of the float32 sweep between these (branch switches, clamps, overflow, underflow)
F32_EDGES = {
    "exp": [(-103.99, -103.95), (-87.5, -87.3), (88.71, 88.73), (0.34, 0.35), (-0.35, -0.34)],
    "tanh": [(0.0155, 0.0157), (0.124, 0.126), (9.0, 9.02), (1e-8, 1.05e-8)],
    "erf": [(0.98, 1.02), (3.91, 3.93), (1e-8, 1.05e-8)],
    "log": [(0.99, 1.01), (1.414, 1.4143), (1e-45, 1e-44), (1.17e-38, 1.18e-38), (3.4e38, 3.4028e38)],
}
F64_EDGES = {"exp": [(-745.2, -745.1), (709.7, 709.8), (-708.5, -708.3)],
             "tanh": [(2.0 ** -21, 2.0 ** -19), (19.0, 19.1)], "erf": [(0.99, 1.01), (5.9, 5.95)]}


def f32_between(lo, hi, odd):
    """Every float32 in [lo, hi] (and in [-hi, -lo] when the function is odd)."""
    if hi <= 0:
        return -f32_between(-hi, -lo, odd)
    a, b = (int(np.float32(v).view(np.int32)) for v in (lo, hi))
    assert 0 <= a <= b < a + 2_000_000, "an edge is a short interval on one side of 0"
    x = np.arange(a, b + 1, dtype=np.int64).astype(np.int32).view(np.float32)
    return np.concatenate([x, -x]) if odd else x


def spacing_units(got, want, mant, emin):
    """|got - want| in units of the spacing of the format at the exact value `want` (the
    subnormal spacing below the normal range)."""
    _, e = np.frexp(np.abs(want))
    exp = np.maximum(e.astype(np.int64) - 1, emin)
    return np.abs(got.astype(want.dtype) - want) / np.ldexp(want.dtype.type(1), exp - mant)


def check_ulps(name, x, got, want, mant, emin, big, bound):
    """Normal results within `bound`, subnormal ones within SUBNORMAL_BOUND; results that
    round past the largest finite value must be inf, NaN must be NaN."""
    with np.errstate(over="ignore", invalid="ignore"):
        want_r = want.astype(got.dtype)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{name}: NaN at x={x[np.isnan(got) != nan][:5]}"
    inf = np.isinf(want_r)
    assert np.array_equal(got[inf], want_r[inf]), f"{name}: inf mismatch at x={x[inf][:5]}"
    keep = ~nan & ~inf
    err = spacing_units(got[keep], want[keep], mant, emin)
    normal = np.abs(want[keep]) >= big
    if normal.any():
        worst = np.argmax(np.where(normal, err, -1))
        assert err[worst] <= bound, \
            f"{name}: {float(err[worst]):.3f} ulp at x={x[keep][worst]!r} (bound {bound})"
    if (~normal).any():
        assert err[~normal].max() <= SUBNORMAL_BOUND, f"{name}: subnormal results"


def f32_inputs(name, rng):
    lo, hi = F32_RANGE[name]
    odd = name in ("tanh", "erf")
    bits = rng.integers(0, 0x7F800000, 400_000, dtype=np.int32).view(np.float32)   # all binades
    parts = [np.linspace(lo, hi, 1_000_001, dtype=np.float32),
             rng.uniform(lo, hi, 200_000).astype(np.float32),
             (rng.standard_normal(200_000) * (hi - lo) / 8).astype(np.float32),
             bits if name == "log" else np.concatenate([bits, -bits])]
    parts += [f32_between(a, b, odd) for a, b in F32_EDGES[name]]
    x = np.concatenate(parts)
    return np.abs(x) if name == "log" else x


def f32_reference(name, x):
    x64 = x.astype(np.float64)
    if name == "erf":
        return np.asarray(np.frompyfunc(math.erf, 1, 1)(x64), dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        return getattr(np, name)(x64)


@pytest.mark.parametrize("name", sorted(F32_BOUND))
def test_float32_error_bound(rng, name):
    x = f32_inputs(name, rng)
    got = ts.function(lambda x: getattr(op, name)(x))(x)
    assert got.dtype == np.float32
    check_ulps(name, x, got, f32_reference(name, x), 23, -126,
               np.finfo(np.float32).tiny, F32_BOUND[name])


# ---- float64 against long double (expl, tanhl, erfl from the C library) --------------------
@pytest.fixture(scope="module")
def long_double_ref(tmp_path_factory):
    """name -> f(float64 array) -> np.longdouble array, computed by the C library's long
    double functions (NumPy has no erf, and ctypes returns long double as a Python float)."""
    if np.finfo(np.longdouble).nmant < 63:
        pytest.skip("long double is not the 80-bit format here: no reference for float64")
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    d = tmp_path_factory.mktemp("ldref")
    src = d / "ref.c"
    src.write_text("#include <math.h>\n#include <stdint.h>\n" + "".join(
        f"void r_{n}(const double* x, long double* y, int64_t k) "
        f"{{ for (int64_t i = 0; i < k; ++i) y[i] = {n}l((long double)x[i]); }}\n"
        for n in ("exp", "tanh", "erf")))
    lib_path = d / "ref.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src), "-o", str(lib_path), "-lm"],
                   check=True)
    lib = ctypes.CDLL(str(lib_path))

    def ref(name, x):
        x = np.ascontiguousarray(x, np.float64)
        y = np.empty(x.shape, np.longdouble)
        getattr(lib, "r_" + name)(x.ctypes.data_as(ctypes.c_void_p),
                                  y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.size))
        return y
    return ref


@pytest.mark.parametrize("name", sorted(F64_BOUND))
def test_float64_error_bound(rng, name, long_double_ref):
    lo, hi = F64_RANGE[name]
    odd = name != "exp"
    mags = np.exp(rng.uniform(np.log(1e-300), np.log(max(-lo, hi)), 200_000))
    parts = [np.linspace(lo, hi, 400_001), rng.uniform(lo, hi, 400_000),
             rng.uniform(-1.5, 1.5, 200_000), mags, -mags]
    parts += [rng.uniform(a, b, 50_000) * s for a, b in F64_EDGES[name]
              for s in ((1, -1) if odd else (1,))]
    x = np.concatenate(parts)
    got = ts.function(lambda x: getattr(op, name)(x))(x)
    assert got.dtype == np.float64
    check_ulps(name, x, got, long_double_ref(name, x), 52, -1022,
               np.finfo(np.float64).tiny, F64_BOUND[name])


# ---- special values ------------------------------------------------------------------------
BIG = {np.float32: 1e30, np.float64: 1e300}
SPECIAL = {
    "exp": lambda big: {np.nan: np.nan, np.inf: np.inf, -np.inf: 0.0, 0.0: 1.0, -0.0: 1.0,
                        big: np.inf, -big: 0.0},
    "tanh": lambda big: {np.nan: np.nan, np.inf: 1.0, -np.inf: -1.0, 30.0: 1.0, -30.0: -1.0,
                         big: 1.0, -big: -1.0},
    "erf": lambda big: {np.nan: np.nan, np.inf: 1.0, -np.inf: -1.0, 12.0: 1.0, -12.0: -1.0,
                        big: 1.0, -big: -1.0},
    "log": lambda big: {np.nan: np.nan, np.inf: np.inf, -np.inf: np.nan, 0.0: -np.inf,
                        -0.0: -np.inf, -1.0: np.nan, 1.0: 0.0, -big: np.nan},
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_special_values(name, dtype):
    cases = SPECIAL[name](BIG[dtype])
    x = np.array(list(cases), dtype)
    got = ts.function(lambda x: getattr(op, name)(x))(x)
    np.testing.assert_array_equal(got, np.array(list(cases.values()), dtype))
    if name in ("tanh", "erf"):          # odd: the sign of zero survives
        z = ts.function(lambda x: getattr(op, name)(x))(np.array([-0.0, 0.0], dtype))
        assert np.signbit(z).tolist() == [True, False]


def test_overflow_and_underflow_edges():
    x = np.array([88.72283, 88.72284, -87.33654, -103.972076, -103.972084], np.float32)
    y = ts.function(lambda x: op.exp(x))(x)
    assert np.isfinite(y[0]) and y[1] == np.inf                 # largest float32 is 3.40282e38
    assert y[2] >= np.finfo(np.float32).tiny * 0.99999          # normal down to -87.336
    assert y[3] == np.float32(2.0 ** -149) and y[4] == 0        # e^x either side of 2^-150


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["tanh", "erf"])
def test_odd_bitwise(rng, name, dtype):
    x = (rng.standard_normal(100_000) * 3).astype(dtype)
    f = ts.function(lambda x: getattr(op, name)(x))
    assert np.array_equal(f(-x), -f(x))


# ---- no libm in the generated code -----------------------------------------------------------
def _code(fn, x):
    code = ts.function(fn).lower(x).target_code
    return re.sub(r"/\*.*?\*/", "", code, flags=re.S)          # not the chunks' comments


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_no_libm_call_in_generated_code(dtype):
    x = np.ones(1 << 20, dtype)
    code = _code(lambda x: op.exp(x) + op.tanh(x) + op.erf(x) + op.sigmoid(x) + op.silu(x)
                 + op.gelu(x) + op.gelu(x, approximate="tanh")
                 + (op.log(x) if dtype == np.float32 else 0), x)
    names = ["exp", "tanh", "erf", "log"] if dtype == np.float32 else ["exp", "tanh", "erf"]
    for name in names:
        assert f"ts_{name}{'f' if dtype == np.float32 else ''}(" in code
    calls = re.findall(r"(?<![\w.])(expf?|tanhf?|erff?|logf?)\s*\(", code)
    if dtype == np.float64:       # float64 log is a libm wrapper, and only it calls log()
        calls = [c for c in calls if c != "log"]
    assert not calls, f"libm calls left: {sorted(set(calls))}"


def test_each_chunk_emitted_once():
    x = np.ones(4096, np.float32)
    code = ts.function(lambda x: op.erf(op.exp(x)) + op.sigmoid(x) + op.gelu(x)).lower(x).target_code
    assert code.count("TS_INLINE float ts_expf(") == 1
    assert code.count("TS_INLINE float ts_erff(") == 1
    assert code.index("float ts_expf(") < code.index("float ts_erff(")


# ---- gcc vectorises them at every SIMD level; vector and scalar code agree bit for bit -------
# Each ISA level is named (never -march=native), so these tests mean the same on any machine:
# the vectorisation check only compiles, so it runs for every x86 level on any x86 machine.
FUNCS = {"expf": ("float", libm.F32["exp"]), "tanhf": ("float", libm.F32["tanh"]),
         "erff": ("float", libm.F32["erf"]), "logf": ("float", libm.F32["log"]),
         "exp": ("double", libm.F64["exp"]), "tanh": ("double", libm.F64["tanh"]),
         "erf": ("double", libm.F64["erf"])}
HEADER = ["#include <math.h>", "#include <stdint.h>", "#include <string.h>",
          "#define TS_INLINE static inline"]
SIMD_LEVELS = ["x86-64-v3", "x86-64-v4"]     # AVX2 + FMA, AVX-512


def _loop_source(name):
    t, chunks = FUNCS[name]
    src = "\n".join(HEADER + list(chunks) + [
        f"void run({t}* restrict y, const {t}* restrict x, int64_t n) {{",
        "  #pragma omp simd", "  for (int64_t i = 0; i < n; ++i)", f"    y[i] = ts_{name}(x[i]);", "}"])
    line = src[:src.index("  for (int64_t i")].count("\n") + 1
    return src + "\n", line


def _gcc_flags(level, omp=True):
    return [f for f in flags("gcc", level) if f not in ("-shared", "-fPIC")
            and (omp or f != "-fopenmp")]


needs_x86_gcc = pytest.mark.skipif(
    shutil.which("gcc") is None or platform.machine() not in ("x86_64", "AMD64"),
    reason="needs gcc for x86-64 (the levels tested are x86 ones)")


@needs_x86_gcc
@pytest.mark.parametrize("level", SIMD_LEVELS)
@pytest.mark.parametrize("name", sorted(FUNCS))
def test_gcc_vectorises_the_loop(tmp_path, name, level):
    src, line = _loop_source(name)
    path = tmp_path / "v.c"
    path.write_text(src)
    out = subprocess.run(["gcc", *_gcc_flags(level), "-c", "-fopt-info-vec-optimized", str(path),
                          "-o", str(tmp_path / "v.o")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # gcc names the loop by its `for` line or its body's line
    assert re.search(rf"v\.c:({line}|{line + 1}):\d+: optimized: loop vectorized", out.stderr), \
        out.stderr


@needs_x86_gcc
@pytest.mark.parametrize("level", SIMD_LEVELS)
def test_a_select_on_a_bool_mask_vectorises(tmp_path, level):
    """A kernel reading a bool array is vectorised: masks are bytes in the generated C (gcc
    gives a load of _Bool no vector type, which left every masked loop scalar)."""
    m, x = np.ones(4096, bool), np.ones(4096, np.float32)
    f = ts.function(lambda m, x: op.where(m, x * 2.0, op.exp(x)))
    src = f.lower(m, x, target=f"cpu:{level}").target_code
    path = tmp_path / "k.c"
    path.write_text(src)
    loop = next(i for i, t in enumerate(src.split("\n"), 1)
                if t.strip().startswith("for (int64_t i0"))
    out = subprocess.run(["gcc", *_gcc_flags(level), "-c", "-fopt-info-vec-optimized", str(path),
                          "-o", str(tmp_path / "k.o")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert re.search(rf"k\.c:({loop}|{loop + 1}):\d+: optimized: loop vectorized", out.stderr), \
        out.stderr


@needs_x86_gcc
@pytest.mark.parametrize("level", SIMD_LEVELS)
@pytest.mark.parametrize("name", sorted(FUNCS))
def test_vector_and_scalar_code_agree(tmp_path, rng, name, level):
    if not isa.runs_here(level):
        pytest.skip(f"this CPU cannot run {isa.describe(level)} code "
                    f"(it runs {isa.describe(isa.host_level())})")
    src, _ = _loop_source(name)
    (tmp_path / "v.c").write_text(src)
    libs = {}
    for kind, extra in [("vector", []), ("scalar", ["-fno-tree-vectorize"])]:
        so = tmp_path / f"{kind}.so"
        fl = [*_gcc_flags(level, omp=kind == "vector"), "-shared", "-fPIC"]   # no omp simd
        subprocess.run(["gcc", *fl, *extra, str(tmp_path / "v.c"), "-o", str(so), "-lm"],
                       check=True)
        libs[kind] = ctypes.CDLL(str(so))
    dtype = np.float32 if FUNCS[name][0] == "float" else np.float64
    itype = np.int32 if dtype == np.float32 else np.int64
    x = np.concatenate([rng.integers(np.iinfo(itype).min, np.iinfo(itype).max, 100_003,
                                     dtype=itype).view(dtype),
                        (rng.standard_normal(100_000) * 5).astype(dtype)])
    outs = []
    for kind in ("vector", "scalar"):
        y = np.empty_like(x)
        libs[kind].run(y.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p),
                       ctypes.c_int64(x.size))
        outs.append(y.view(itype))
    nan = np.isnan(outs[0].view(dtype))
    assert np.array_equal(nan, np.isnan(outs[1].view(dtype)))
    assert np.array_equal(outs[0][~nan], outs[1][~nan])
