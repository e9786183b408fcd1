"""The int8 GEMM routine behind op.matmul_integer (ONNX's MatMulInteger, QLinearMatMul): NumPy's
int32 product of the widened operands, exactly (wrapping past int32), for every operand
signedness, shape, stride and zero point, at every x86 ISA level this CPU runs; and each level's
routine uses that level's integer dot product. (ARM64, NEON and sdot: tests/targets/test_arm64.py.)
"""
import platform
import shutil
import subprocess

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.compiler.target.c import routine_library_source
from tessera.runtime import isa
from tessera.runtime.toolchain import flags
from tessera.trace import apply

X86_LEVELS = ["generic", "x86-64-v2", "x86-64-v3", "x86-64-v3+vnni", "x86-64-v4",
              "x86-64-v4+vnni", "x86-64-v4+amx"]
PAIRS = ["i8i8", "u8i8", "i8u8", "u8u8"]
x86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 levels")


def ints(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def exact(a, b):
    """a @ b in int64, wrapped to int32 as the int32 product wraps."""
    return (np.asarray(a).astype(np.int64) @ np.asarray(b).astype(np.int64)).astype(np.int32)


def types(pair):
    return [np.int8 if p == "i8" else np.uint8 for p in (pair[:2], pair[2:])]


def level_here(level):
    if not isa.runs_here(level):
        pytest.skip(f"this CPU cannot run {level} code (it runs {isa.host_level()})")
    return f"cpu:{level}"


@x86
@pytest.mark.parametrize("level", X86_LEVELS)
@pytest.mark.parametrize("pair", PAIRS)
def test_every_shape_and_stride_is_numpys_int32_product(rng, level, pair):
    target = level_here(level)
    ta, tb = types(pair)
    f = ts.function(lambda a, b: op.matmul_integer(a, b), target=target)
    ft = ts.function(lambda a, w: op.matmul_integer(a, w.T), target=target)  # w read in place
    fs = ts.function(lambda a, b: op.matmul_integer(a[:, 1::2], b[::2, 3:]), target=target)
    # micro-tile edges, few rows or columns, K across the 512 block, tasks over 256 x 512
    for m, k, n in [(1, 1, 1), (7, 0, 5), (3, 9, 70), (13, 17, 19), (97, 64, 33), (6, 300, 64),
                    (300, 1100, 530)]:
        a, b = ints(rng, ta, (m, k)), ints(rng, tb, (k, n))
        got = f(a, b)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, exact(a, b))
        np.testing.assert_array_equal(ft(a, np.ascontiguousarray(b.T)), exact(a, b))
    a, b = ints(rng, ta, (33, 90)), ints(rng, tb, (90, 70))
    np.testing.assert_array_equal(fs(a, b), exact(a[:, 1::2], b[::2, 3:]))


@x86
@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4", "x86-64-v4+vnni", "x86-64-v4+amx"])
def test_sums_past_int32_wrap_as_numpys(rng, level):
    """255 * 255 * 40000 overflows int32: the product wraps modulo 2^32, on every path."""
    target = level_here(level)
    a = np.full((6, 40000), 255, np.uint8)
    a[:, ::7] = ints(rng, np.uint8, a[:, ::7].shape)
    b = np.full((40000, 9), 255, np.uint8)
    got = ts.function(lambda a, b: op.matmul_integer(a, b), target=target)(a, b)
    want = exact(a, b)
    assert (a.astype(np.int64) @ b.astype(np.int64)).max() > 2 ** 31    # (it does wrap)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("pair", PAIRS)
def test_zero_points_batches_and_vectors(rng, pair):
    """Zero points come off through the operands' sums: one number, per row of a, per column
    of b; broadcast batches; 1-D operands."""
    ta, tb = types(pair)
    a, b = ints(rng, ta, (3, 1, 21, 40)), ints(rng, tb, (2, 40, 17))
    za, zb = ints(rng, ta, (21,)), ints(rng, tb, (17,))
    f = ts.function(lambda a, b, za, zb: (op.matmul_integer(a, b, za, zb),
                                          op.matmul_integer(a, b, za[3], zb[5]),
                                          op.matmul_integer(a, b, None, zb),
                                          op.matmul_integer(a[0, 0, 0], b[1]),
                                          op.matmul_integer(a[0, 0], b[1, :, 2])))
    full, scalar, only_b, vec_mat, mat_vec = f(a, b, za, zb)
    wa, wb = a.astype(np.int64), b.astype(np.int64)
    np.testing.assert_array_equal(full, exact(wa - za[:, None], wb - zb))
    np.testing.assert_array_equal(scalar, exact(wa - za[3], wb - zb[5]))
    np.testing.assert_array_equal(only_b, exact(wa, wb - zb))
    np.testing.assert_array_equal(vec_mat, exact(a[0, 0, 0], b[1]))
    np.testing.assert_array_equal(mat_vec, exact(a[0, 0], b[1, :, 2]))
    assert ts.function(lambda a, b: op.matmul_integer(a, b)).lower(a, b).target_code.count(
        f"ts_gemm_tile_{pair}(") >= 1


def test_other_integers_widen_and_bad_dtypes_are_named(rng):
    a, b = ints(rng, np.int16, (5, 7)), ints(rng, np.int8, (7, 3))
    np.testing.assert_array_equal(ts.function(op.matmul_integer)(a, b), exact(a, b))
    core = ts.function(lambda a, b: apply("matmul_integer", a, b))    # the 8-bit primitive
    with pytest.raises(ts.TesseraError, match="int8 and uint8"):
        core(a, b)


# the instruction each level's routine multiplies with ("{vex} vpdpbusd": AVX-VNNI's encoding;
# x86-64-v2 and armv8-a run plain C; x86-64-v4+amx's tiles, with vpdpbusd for few rows)
DOT = {"x86-64-v3": "vpmaddwd", "x86-64-v3+vnni": "vpdpbusd",
       "x86-64-v4": "vpmaddwd", "x86-64-v4+vnni": "vpdpbusd", "x86-64-v4+amx": "tdpbusd",
       "armv8.2-a+dotprod": "sdot"}
COMPILER = {"x86_64": "gcc", "aarch64": "aarch64-linux-gnu-gcc"}


@pytest.mark.parametrize("level", list(DOT))
def test_each_level_multiplies_with_its_dot_product(tmp_path, level):
    """Compiled for a named level (never -march=native), the routine's inner loop is that
    level's instruction: VNNI's vpdpbusd, vpmaddwd on int16 without it, NEON's sdot."""
    cc = shutil.which(COMPILER[isa.LEVELS[level].arch])
    if cc is None:
        pytest.skip(f"needs {COMPILER[isa.LEVELS[level].arch]} (.ci/run installs it)")
    src = tmp_path / "gemm.c"
    src.write_text(routine_library_source("gemm:u8i8"))
    opts = [f for f in flags(cc, level) if f not in ("-shared", "-fopenmp")]
    r = subprocess.run([cc, *opts, "-S", str(src), "-o", "-"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert DOT[level] in r.stdout
    if level.endswith(("vnni", "amx")):
        assert "pmaddwd" not in r.stdout
    # AVX-512 VNNI's level carries the tiles too, behind a run-time check (amx.h); AVX2's and
    # plain AVX-512's never do
    assert ("tdpbusd" in r.stdout) == (level in ("x86-64-v4+vnni", "x86-64-v4+amx"))


@x86
@pytest.mark.parametrize("pair", ["u8i8", "i8i8"])
def test_the_tiles_at_the_vnni_level_run_where_the_cpu_has_them(rng, tmp_path, pair):
    """At x86-64-v4+vnni the routine multiplies on AMX's tiles where CPUID names them and Linux
    grants their state, else with vpdpbusd: both built from the routine library's source (the
    second with the tiles compiled out) and called straight, each is NumPy's product, and the
    tiles ran exactly where /proc/cpuinfo lists amx_int8."""
    import ctypes
    level_here("x86-64-v4+vnni")
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("needs gcc (.ci/run installs it)")
    ta, tb = types(pair)
    ca, cb = ("int8_t" if t == np.int8 else "uint8_t" for t in (ta, tb))
    src = tmp_path / "q.c"
    src.write_text(routine_library_source(f"gemm:{pair}") + f"""
void product(const {ca}* A, const {cb}* B, int32_t* C, int64_t m, int64_t k, int64_t n) {{
  ts_gemm_tile_{pair}(A, k, 1, B, n, 1, C, n, k, m, n, 128);
}}
int tiles_ran(void) {{
#ifdef TS_Q_AMX_{pair}
  {ca} a[16 * 4] = {{0}};
  {cb} b[4 * 16] = {{0}};
  int32_t c[16 * 16];
  return ts_amx_tiles_{pair}(a, 4, 1, b, 16, 1, c, 16, 4, 16, 16, 64);
#else
  return 0;
#endif
}}
""")
    opts = [f for f in flags(cc, "x86-64-v4+vnni") if f != "-fopenmp"]
    libs = []
    for extra in ([], ["-DTS_NO_AMX_AT_RUN_TIME"]):
        so = tmp_path / f"q{len(libs)}.so"
        r = subprocess.run([cc, *opts, *extra, str(src), "-o", str(so)], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        libs.append(ctypes.CDLL(str(so)))
    assert libs[0].tiles_ran() == ("amx_int8" in isa._host_features())
    assert libs[1].tiles_ran() == 0
    i64 = ctypes.c_int64
    for m, k, n in [(4, 1, 4), (37, 300, 45), (64, 129, 96), (130, 700, 70)]:
        a, b = ints(rng, ta, (m, k)), ints(rng, tb, (k, n))
        for lib in libs:
            out = np.zeros((m, n), np.int32)
            lib.product(*(x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, out)),
                        i64(m), i64(k), i64(n))
            np.testing.assert_array_equal(out, exact(a, b))


# ---- int8 weights (op.matmul_int8_weight, weight-only quantization: gemm_w8.c) ---------------
FLOAT_LEVELS = ["generic", "x86-64-v2", "x86-64-v3", "x86-64-v4"]


@x86
@pytest.mark.parametrize("level", FLOAT_LEVELS)
def test_int8_weights_give_the_float32_products_bits(rng, level):
    """x @ int8 weights, scaled per column, is bit for bit the float32 GEMM of the widened
    weights at the same level (the same fma chains), and NumPy's within float32 rounding: few
    rows (streamed bytes) and many (widened into scratch), vector tails, a transposed weight,
    a batch of rows."""
    target = level_here(level)
    f = ts.function(lambda x, w, s: op.matmul_int8_weight(x, w, s), target=target)
    g = ts.function(lambda x, w, s: op.matmul(x, w) * s, target=target)
    ft = ts.function(lambda x, w, s: op.matmul_int8_weight(x, w.T, s), target=target)
    for m, k, n in [(1, 1, 1), (1, 37, 3), (1, 300, 1000), (3, 70, 45), (8, 129, 77),
                    (9, 64, 33), (40, 300, 130)]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = ints(rng, np.int8, (k, n))
        s = rng.uniform(0.001, 0.1, n).astype(np.float32)
        got = f(x, w, s)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, g(x, w.astype(np.float32), s))
        np.testing.assert_array_equal(ft(x, np.ascontiguousarray(w.T), s), got)
        want = (x.astype(np.float64) @ w.astype(np.float64)) * s
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    x3 = rng.standard_normal((2, 5, 40)).astype(np.float32)
    w, s = ints(rng, np.int8, (40, 19)), np.float32(0.5)
    np.testing.assert_array_equal(f(x3, w, s), g(x3, w.astype(np.float32), s))


def test_int8_weights_quantized_and_refused(rng):
    """nn.quantize_int8: per column, |w - int8 * scale| <= scale / 2; nn.linear multiplies by
    the bytes; a float weight, or int8 activations, is a TesseraError naming the operator."""
    w = rng.standard_normal((64, 48)).astype(np.float32)
    w[:, 5] = 0.0
    q = ts.nn.quantize_int8(w)
    assert q["int8"].dtype == np.int8 and q["scale"].shape == (48,)
    # (within float32's rounding of the product int8 * scale: a quotient of exactly k + 1/2
    # rounds to even and lands half a scale away before that rounding)
    assert np.all(np.abs(ts.nn.dequantize_int8(q) - w) <= q["scale"] / 2 + np.abs(w) * 2.0**-22)
    assert np.abs(q["int8"]).max(axis=0)[np.arange(48) != 5].min() == 127
    x = rng.standard_normal((4, 7, 64)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    got = ts.function(lambda x, q, b: ts.nn.linear(x, q, b))(x, q, b)
    np.testing.assert_allclose(got, x @ ts.nn.dequantize_int8(q) + b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ts.TesseraError, match="matmul_int8_weight multiplies float32"):
        ts.function(lambda x, w: op.matmul_int8_weight(x, w))(x, w)
    with pytest.raises(ts.TesseraError, match="float weight matrix"):
        ts.nn.quantize_int8(q["int8"])
