"""bf16 matmuls on AMX's tile dot product (tdpbf16ps), at the ISA level x86-64-v4+amx that only
a choice selects. What the instruction computes per C element over its 32 values of k: two
float32 chains from +0, one over the even k and one over the odd (each addition of an exact
product rounded), then c += (even + odd); the routine issues one instruction per 32 k from k = 0,
so the bits do not depend on tiles, K blocks or threads. The reference is NumPy's float32
arithmetic in that order; the tests that run AMX code skip on machines without it (the level's
assembly and the order's reference are checked everywhere)."""
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
LEVEL = "x86-64-v4+amx"
CHUNK = 32                                  # k per tdpbf16ps: a tile row of 64 bytes
x86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 levels")


def amx_order(a, b):
    """a @ b (bf16 [..., M, K] and [..., K, N]) in the tiles' order in float32: per chunk of 32
    k from k = 0, the even k's products chained from 0, the odd k's likewise, then
    c = c + (even + odd) (the products are exact in float32; NumPy rounds each addition);
    subnormal operands as zero; rounded once to bf16."""
    a, b = (np.asarray(x).astype(np.float32) for x in (a, b))
    a, b = (np.where(np.abs(x) < np.finfo(np.float32).tiny, np.float32(0) * x, x) for x in (a, b))
    k = a.shape[-1]
    c = np.zeros(np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1])),
                 np.float32)
    for k0 in range(0, k, CHUNK):
        chains = [np.zeros_like(c), np.zeros_like(c)]
        for j in range(k0, min(k0 + CHUNK, k)):
            chains[j % 2] = chains[j % 2] + a[..., :, j, None] * b[..., j, None, :]
        c = c + (chains[0] + chains[1])
    return c.astype(BF16)


def bf16(rng, *shape):
    return rng.standard_normal(shape).astype(BF16)


def here():
    if not isa.runs_here(LEVEL):
        pytest.skip(f"this CPU has no AMX tiles (it runs {isa.describe(isa.host_level())}); "
                    "test_the_level_multiplies_on_tiles still builds the routine")
    return f"cpu:{LEVEL}"


def crafted():
    """Rows whose products tell the orders apart: 2^24, 1, -2^24, 1 along k (the FMA chain
    ends at 1, vdpbf16ps's pairs at 0, the tiles' two chains at 2); 2^24 and 1 at k = 0, 1 and
    -2^24 and 1 at k = 32, 33 (in one chunk: 2; in two, as the tiles run: 1)."""
    a = np.zeros((2, 34), np.float32)
    b = np.zeros((34, 1), np.float32)
    a[0, :4], b[:4, 0] = [2.0 ** 12, 1, -(2.0 ** 12), 1], [2.0 ** 12, 1, 2.0 ** 12, 1]
    a[1, [0, 1, 32, 33]] = [2.0 ** 12, 1, -(2.0 ** 12), 1]
    b[[32, 33], 0] = [2.0 ** 12, 1]
    return a.astype(BF16), b.astype(BF16)


def test_the_reference_tells_the_orders_apart():
    """The reference itself, on the crafted rows (no AMX needed): the tiles' order is neither
    the FMA chain's (the host's default level) nor the dot product of pairs', and its chunks
    are 32 k."""
    a, b = crafted()
    assert amx_order(a, b)[:, 0].astype(np.float32).tolist() == [2.0, 1.0]
    fma = ts.function(lambda a, b: a @ b)(a, b)
    assert fma[:, 0].astype(np.float32).tolist() == [1.0, 1.0]


@x86
def test_bf16_products_are_the_tiles_chains(rng):
    """Block edges (32 x 32), few rows or columns, K under, at and across a chunk and the
    routine's K blocks, tasks over several tiles; transposed operands read in place (A's rows
    adjacent take the packing's strided path), strided views, a broadcast batch; K = 0 gives
    zeros; the crafted rows."""
    target = here()
    f = ts.function(lambda a, b: a @ b, target=target)
    ft = ts.function(lambda a, w: a @ w.T, target=target)
    fa = ts.function(lambda at, b: at.T @ b, target=target)
    fs = ts.function(lambda a, b: a[:, 1::2] @ b[::2, 3:], target=target)
    for m, k, n in [(1, 1, 1), (7, 0, 5), (3, 9, 70), (13, 17, 19), (97, 64, 33),
                    (1, 300, 200), (9, 1031, 40), (33, 32, 31), (300, 513, 530)]:
        a, b = bf16(rng, m, k), bf16(rng, k, n)
        got = f(a, b)
        assert got.dtype == BF16
        assert got.tobytes() == amx_order(a, b).tobytes(), (m, k, n)
        assert ft(a, np.ascontiguousarray(b.T)).tobytes() == got.tobytes()
        assert fa(np.ascontiguousarray(a.T), b).tobytes() == got.tobytes()
    a, b = bf16(rng, 20, 46), bf16(rng, 45, 40)
    assert fs(a, b).tobytes() == amx_order(a[:, 1::2], b[::2, 3:]).tobytes()
    a, b = bf16(rng, 3, 1, 10, 33), bf16(rng, 4, 33, 9)
    assert f(a, b).tobytes() == amx_order(a, b).tobytes()
    a, b = crafted()
    assert f(a, b).tobytes() == amx_order(a, b).tobytes()


@x86
def test_tiles_and_k_blocks_do_not_change_bits(rng):
    """Task tiles of every shape and K blocks of any length (rounded up to whole chunks by the
    routine): the same bits. The task grid never depends on the thread count."""
    target = here()
    a, b = bf16(rng, 150, 700), bf16(rng, 700, 90)
    full = ts.function(lambda a, b: a @ b, target=target)(a, b)
    assert full.tobytes() == amx_order(a, b).tobytes()
    for tile in [(8, 32, 64), (17, 5, 71), (150, 90, 1), (64, 64, 699)]:
        f = ts.function(lambda a, b: op.matmul(a, b, tile_shape=tile), target=target)
        assert f(a, b).tobytes() == full.tobytes(), tile


@x86
@pytest.mark.parametrize("level", ["x86-64-v4+bf16", LEVEL])
def test_the_level_multiplies_on_tiles(tmp_path, level):
    """Compiled for a named level (never -march=native): the bf16 routine multiplies with
    tdpbf16ps at x86-64-v4+amx only (and not with vdpbf16ps there); the f16 routine never
    uses the tiles."""
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
        amx = level == LEVEL and dtype == "bf16"
        assert ("tdpbf16ps" in r.stdout) == amx, dtype
        if amx:
            assert "vdpbf16ps" not in r.stdout


@x86
def test_each_int8_pair_has_its_tile_instruction(tmp_path):
    """The int8 GEMM at the level: each signedness pair multiplies with its own tdpb*d, so no
    operand is biased (the values: test_gemm_int8.py, which runs every level)."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("needs gcc (.ci/run installs it)")
    for pair, ins in {"i8i8": "tdpbssd", "u8i8": "tdpbusd", "i8u8": "tdpbsud",
                      "u8u8": "tdpbuud"}.items():
        src = tmp_path / f"gemm_{pair}.c"
        src.write_text(routine_library_source(f"gemm:{pair}"))
        opts = [f for f in flags(cc, LEVEL) if f not in ("-shared", "-fopenmp")]
        r = subprocess.run([cc, *opts, "-S", str(src), "-o", "-"], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        found = {i for i in ("tdpbssd", "tdpbusd", "tdpbsud", "tdpbuud") if i in r.stdout}
        assert found == {ins}, pair


def test_no_host_takes_the_level_by_itself(monkeypatch):
    """Its bits are its own, so a machine with AMX still defaults to the FMA chains."""
    monkeypatch.setattr(isa, "_arch", lambda: "x86_64")
    monkeypatch.setattr(isa, "_host_features", lambda: isa.LEVELS[LEVEL].needs)
    isa.host_level.cache_clear()
    try:
        assert isa.host_level() == "x86-64-v4+vnni"
    finally:
        isa.host_level.cache_clear()


@x86
def test_without_tiles_the_chains_are_the_same(rng, tmp_path):
    """The routine's fallback when the kernel refuses the tiles' state or scratch memory (one
    element at a time in the tiles' order, DAZ and FTZ by hand) gives the tiles' bits: both
    called straight from the routine library's source, with subnormal operands, products
    under float32's normal range (flushed by both), K across chunks and odd."""
    import ctypes
    here()
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("needs gcc (.ci/run installs it)")
    src = tmp_path / "amx.c"
    src.write_text(routine_library_source("gemm:bf16") + """
void loops(const uint16_t* A, const uint16_t* B, uint16_t* C, int64_t m, int64_t k, int64_t n) {
  ts_amx_loops(A, k, 1, B, n, 1, C, n, k, m, n);
}
void tiles(const uint16_t* A, const uint16_t* B, uint16_t* C, int64_t m, int64_t k, int64_t n) {
  ts_gemm_amx_bf16(A, k, 1, B, n, 1, C, n, k, m, n, 64);
}
""")
    so = tmp_path / "amx.so"
    opts = [f for f in flags(cc, LEVEL) if f != "-fopenmp"]
    r = subprocess.run([cc, *opts, str(src), "-o", str(so)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    lib = ctypes.CDLL(str(so))
    m, k, n = 37, 101, 45
    a, b = bf16(rng, m, k), bf16(rng, k, n)
    a[3, 5] = BF16.type(2.0 ** -130)                    # a subnormal operand
    a[4] *= BF16.type(2.0 ** -70)                       # products near 2^-140: flushed
    b[:, 6] *= BF16.type(2.0 ** -60)
    a[:2, :34], b[:34, :1] = crafted()
    a[:2, 34:] = 0
    outs = []
    i64 = ctypes.c_int64
    for fn in (lib.loops, lib.tiles):
        out = np.zeros((m, n), BF16)
        fn(*(x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, out)), i64(m), i64(k), i64(n))
        outs.append(out)
    assert outs[0].tobytes() == outs[1].tobytes()
    assert outs[1][:2, 0].astype(np.float32).tolist() == [2.0, 1.0]
    assert outs[1][4, 6] == 0 and outs[1][3, 0] == amx_order(a, b)[3, 0]
    normal = np.ones((m, n), bool)
    normal[4, :], normal[:, 6] = False, False
    assert (outs[1][normal] == amx_order(a, b)[normal]).all()
