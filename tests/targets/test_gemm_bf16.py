"""bf16 matmuls on AVX-512 BF16's dot product of pairs (vdpbf16ps), at the ISA level
x86-64-v4+bf16 that only a choice selects: each element is the float32 chain in the
instruction's order (per pair of k, the odd product first, each addition rounded; denormal
operands read as zero), rounded once to bf16, whatever the tiles, the K blocks and the threads;
every other level keeps the FMA chain over k in order. The reference is NumPy's float32
arithmetic in that order."""
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

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes (the bf16 extra)")
BF16 = np.dtype(ml_dtypes.bfloat16)
LEVEL = "x86-64-v4+bf16"
x86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 levels")


def dot_order(a, b):
    """a @ b (bf16 [..., M, K] and [..., K, N]) in vdpbf16ps's order in float32: for each pair
    (2p, 2p + 1), c += a[2p+1] b[2p+1], then c += a[2p] b[2p] (the products are exact in
    float32; numpy rounds each addition), subnormal operands as zero; rounded to bf16."""
    a, b = (np.asarray(x).astype(np.float32) for x in (a, b))
    a, b = (np.where(np.abs(x) < np.finfo(np.float32).tiny, np.float32(0) * x, x) for x in (a, b))
    k = a.shape[-1]
    c = np.zeros(np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1])),
                 np.float32)
    for p in range(0, k, 2):
        if p + 1 < k:
            c = c + a[..., :, p + 1, None] * b[..., p + 1, None, :]
        c = c + a[..., :, p, None] * b[..., p, None, :]
    return c.astype(BF16)


def bf16(rng, *shape):
    return rng.standard_normal(shape).astype(BF16)


def here():
    if not isa.runs_here(LEVEL):
        pytest.skip(f"this CPU has no AVX-512 BF16 (it runs {isa.describe(isa.host_level())}); "
                    "test_the_level_multiplies_with_vdpbf16ps still builds the routine")
    return f"cpu:{LEVEL}"


@x86
def test_bf16_products_are_the_dot_products_chains(rng):
    """Micro-tile edges (8 x 32), few rows or columns, odd K, K across the routine's blocks,
    tasks over several tiles; transposed operands read in place (each side: A's rows adjacent or
    with contiguous k take different packing paths), strided views, a broadcast batch; K = 0
    gives zeros."""
    target = here()
    f = ts.function(lambda a, b: a @ b, target=target)
    ft = ts.function(lambda a, w: a @ w.T, target=target)
    fa = ts.function(lambda at, b: at.T @ b, target=target)
    fs = ts.function(lambda a, b: a[:, 1::2] @ b[::2, 3:], target=target)
    for m, k, n in [(1, 1, 1), (7, 0, 5), (3, 9, 70), (13, 17, 19), (97, 64, 33),
                    (1, 300, 200), (9, 1031, 40), (300, 513, 530)]:
        a, b = bf16(rng, m, k), bf16(rng, k, n)
        got = f(a, b)
        assert got.dtype == BF16
        assert got.tobytes() == dot_order(a, b).tobytes(), (m, k, n)
        assert ft(a, np.ascontiguousarray(b.T)).tobytes() == got.tobytes()
        assert fa(np.ascontiguousarray(a.T), b).tobytes() == got.tobytes()
    a, b = bf16(rng, 20, 46), bf16(rng, 45, 40)
    assert fs(a, b).tobytes() == dot_order(a[:, 1::2], b[::2, 3:]).tobytes()
    a, b = bf16(rng, 3, 1, 10, 33), bf16(rng, 4, 33, 9)
    assert f(a, b).tobytes() == dot_order(a, b).tobytes()


@x86
def test_the_order_is_the_instructions_not_the_fma_chains(rng):
    """Products 2^24, 1, -2^24, 1 along k: the FMA chain (every other level) loses the first 1
    to rounding and ends at 1; the pairs' order adds 1 + 2^24 first, loses it, and ends at 0. A
    subnormal operand reads as zero here, and keeps its value on the FMA path."""
    a = np.array([[2.0 ** 12, 1, -(2.0 ** 12), 1], [2.0 ** -130, 0, 0, 0]]).astype(BF16)
    b = np.array([[2.0 ** 12], [1], [2.0 ** 12], [1]]).astype(BF16)
    fma = ts.function(lambda a, b: a @ b, target="cpu:x86-64-v2")(a, b)
    assert fma[0, 0] == 1
    assert fma[1, 0] == BF16.type(2.0 ** -130 * 2.0 ** 12)
    assert dot_order(a, b)[0, 0] == 0 and dot_order(a, b)[1, 0] == 0
    got = ts.function(lambda a, b: a @ b, target=here())(a, b)
    assert got.tobytes() == dot_order(a, b).tobytes()


@x86
def test_tiles_and_k_blocks_do_not_change_bits(rng):
    """Task tiles of every shape, K blocks of odd length (kept even by the routine, so no pair
    straddles two): the same bits. The task grid never depends on the thread count."""
    target = here()
    a, b = bf16(rng, 150, 700), bf16(rng, 700, 90)
    full = ts.function(lambda a, b: a @ b, target=target)(a, b)
    assert full.tobytes() == dot_order(a, b).tobytes()
    for tile in [(8, 32, 64), (17, 5, 71), (150, 90, 1), (64, 64, 699)]:
        f = ts.function(lambda a, b: op.matmul(a, b, tile_shape=tile), target=target)
        assert f(a, b).tobytes() == full.tobytes(), tile


@x86
@pytest.mark.parametrize("level", ["x86-64-v4+vnni", LEVEL])
def test_the_level_multiplies_with_vdpbf16ps(tmp_path, level):
    """Compiled for a named level (never -march=native): the bf16 routine's inner loop is
    vdpbf16ps at x86-64-v4+bf16 only; the f16 routine never uses it."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("needs gcc (.ci/run installs it)")
    for dtype in ("bf16", "f16"):
        src = tmp_path / f"gemm_{dtype}.c"
        src.write_text(routine_library_source(f"gemm:{dtype}"))
        opts = [f for f in flags(cc, level) if f not in ("-shared", "-fopenmp")]
        r = subprocess.run([cc, *opts, "-S", str(src), "-o", "-"], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        assert ("vdpbf16ps" in r.stdout) == (level == LEVEL and dtype == "bf16"), dtype


def test_no_host_takes_the_level_by_itself(monkeypatch):
    """Its bits are its own, so a machine with AVX-512 BF16 still defaults to the FMA chains."""
    monkeypatch.setattr(isa, "_arch", lambda: "x86_64")
    monkeypatch.setattr(isa, "_host_features", lambda: isa.LEVELS[LEVEL].needs)
    isa.host_level.cache_clear()
    try:
        assert isa.host_level() == "x86-64-v4+vnni"
    finally:
        isa.host_level.cache_clear()


@x86
def test_without_memory_for_packing_the_chains_are_the_same(rng, tmp_path):
    """The routine's fallback when scratch memory is refused (one element at a time, the
    instruction's order, DAZ and FTZ by hand) gives the packed path's bits: both called
    straight from the routine library's source, a subnormal operand and odd K included."""
    import ctypes
    here()
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("needs gcc (.ci/run installs it)")
    src = tmp_path / "dot.c"
    src.write_text(routine_library_source("gemm:bf16") + """
void loops(const uint16_t* A, const uint16_t* B, uint16_t* C, int64_t m, int64_t k, int64_t n) {
  ts_dot_loops(A, k, 1, B, n, 1, C, n, k, m, n);
}
""")
    so = tmp_path / "dot.so"
    opts = [f for f in flags(cc, LEVEL) if f != "-fopenmp"]
    r = subprocess.run([cc, *opts, str(src), "-o", str(so)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    lib = ctypes.CDLL(str(so))
    m, k, n = 13, 37, 45
    a, b = bf16(rng, m, k), bf16(rng, k, n)
    a[3, 5] = BF16.type(2.0 ** -130)
    a[0] = 0                    # (element [0, 0]: 0 in the pairs' order, 1 in the FMA chain's)
    a[0, :4], b[:4, 0] = np.array([[2.0 ** 12, 1, -(2.0 ** 12), 1], [2.0 ** 12, 1, 2.0 ** 12, 1]],
                                  np.float32).astype(BF16)
    out = np.zeros((m, n), BF16)
    i64 = ctypes.c_int64
    lib.loops(*(x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, out)), i64(m), i64(k), i64(n))
    assert out.tobytes() == dot_order(a, b).tobytes() and out[0, 0] == 0
    packed = ts.function(lambda a, b: a @ b, target=f"cpu:{LEVEL}")(a, b)
    assert out.tobytes() == packed.tobytes()
