"""The GEMM routine behind float matmuls: correct for any shape and strides, and the same bits
whatever the tiles, the batch, the thread count or the instruction set."""
import ctypes
import platform
import shutil
import subprocess

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.runtime import isa
from tessera.runtime.toolchain import flags

from conftest import assert_within_dot_bound


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 0, 5), (13, 17, 19), (97, 64, 33), (6, 300, 64),
                                   (200, 31, 129), (1, 70, 45), (1, 300, 1000)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shapes_and_dtypes(rng, m, k, n, dtype):
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    got = ts.function(lambda a, b: a @ b)(a, b)
    assert_within_dot_bound(got, a, b)
    wt = np.ascontiguousarray(b.T)
    got_t = ts.function(lambda a, w: a @ w.T)(a, wt)       # the transpose is read in place
    assert got_t.tobytes() == got.tobytes()


def test_rows_and_tiles_do_not_change_bits(rng):
    a = rng.standard_normal((150, 70)).astype(np.float32)
    b = rng.standard_normal((70, 90)).astype(np.float32)
    full = ts.function(lambda a, b: a @ b)(a, b)
    assert full[37:38].tobytes() == ts.function(lambda a, b: a @ b)(a[37:38], b).tobytes()
    wt = np.ascontiguousarray(b.T)      # one row against columns read in place: their chains
    assert full[37:38].tobytes() == ts.function(lambda a, w: a @ w.T)(a[37:38], wt).tobytes()
    for tile in [(6, 32, 8), (17, 5, 70), (150, 90, 1)]:
        f = ts.function(lambda a, b: op.matmul(a, b, tile_shape=tile))
        assert f(a, b).tobytes() == full.tobytes(), tile
    # A's rows read in place by the micro-kernel (the last partial panel packed) against A
    # packed from a transposed view, every tile
    at = np.ascontiguousarray(a.T)
    for tile in [(6, 32, 8), (17, 5, 70), (64, 96, 256)]:
        f = ts.function(lambda at, b: op.matmul(at.T, b, tile_shape=tile))
        assert f(at, b).tobytes() == full.tobytes(), tile


def test_batched_with_broadcast_batch(rng):
    a = rng.standard_normal((3, 1, 20, 12)).astype(np.float32)
    b = rng.standard_normal((4, 12, 9)).astype(np.float32)
    got = ts.function(lambda a, b: a @ b)(a, b)
    assert got.shape == (3, 4, 20, 9)
    assert_within_dot_bound(got, np.broadcast_to(a, (3, 4, 20, 12)),
                            np.broadcast_to(b, (3, 4, 12, 9)))


@pytest.mark.skipif(shutil.which("gcc") is None or platform.machine() != "x86_64",
                    reason="needs gcc on x86-64")
@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v2"])     # AVX2 + FMA; SSE, no FMA
def test_narrower_instruction_sets_give_the_same_bits(rng, tmp_path, level):
    if not isa.runs_here(level):
        pytest.skip(f"this CPU cannot run {level} code")
    a = rng.standard_normal((45, 77)).astype(np.float32)
    b = rng.standard_normal((77, 50)).astype(np.float32)
    prog = ts.function(lambda a, b: a @ b).lower(a, b)
    src = tmp_path / "p.c"
    src.write_text(prog.target_code)
    for file, text in prog.routine_sources.items():      # the GEMM routine's library
        (tmp_path / file).write_text(text)
    so = tmp_path / "p.so"
    out = subprocess.run(["gcc", *flags("gcc", level), "-o", str(so), str(src),
                          *[str(tmp_path / f) for f in prog.routine_sources], "-lm"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    lib = ctypes.CDLL(str(so))
    got = np.empty((45, 50), np.float32)
    table = [a, b, got]
    assert [bf.name for bf in prog.tile_ir.buffers] == ["in0", "in1", "out0"]
    ptrs = (ctypes.c_void_p * 3)(*[x.ctypes.data for x in table])
    assert lib.tessera_entry(ptrs) == 0
    assert got.tobytes() == prog(a, b).tobytes()


def test_matmul_and_attention_share_one_program(rng):
    x = rng.standard_normal((2, 16, 8)).astype(np.float32)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    f = ts.function(lambda x, w: op.attention(op.exp(x @ w) * 0.1, x, x))   # exp twice over
    assert [k.strategy for k in f.lower(x, w).schedule_ir.kernels] == ["contract", "attention"]
    np.testing.assert_allclose(f(x, w), ts.interpret(f, x, w), rtol=1e-4, atol=1e-5)


def test_task_tiles_are_even(rng):
    """The grid cuts each side into as many tiles as the default tile would, all of one size
    but the last, none larger (784 rows in 256s: 200 x 3 + 184, not 256 x 3 + 16), and the
    product's bits are those of another tiling."""
    from tessera.compiler.strategies.contract import even_tile, task_tiles
    for _ in range(200):
        size, tile, step = int(rng.integers(1, 5000)), int(rng.integers(1, 1100)), 8
        even = even_tile(size, tile, step)
        assert even <= max(tile, 1) or even == size
        assert -(-size // even) == -(-size // min(tile, size))
        assert even in (tile, size) or even % step == 0
        last = size - (-(-size // even) - 1) * even
        assert 0 < last <= even
    assert task_tiles(784, 512, 1, "f32")["tile_m"] == 200
    a = rng.standard_normal((784, 256)).astype(np.float32)
    b = rng.standard_normal((256, 512)).astype(np.float32)
    got = ts.function(lambda a, b: a @ b)(a, b)
    other = ts.function(lambda a, b: op.matmul(a, b, tile_shape=(256, 512, 256)))(a, b)
    assert got.tobytes() == other.tobytes()
    assert_within_dot_bound(got, a, b)


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,k,n", [(5, 300, 70), (70, 600, 257), (130, 33, 3), (40, 1, 64)])
def test_16_bit_products_are_the_float32_chains_rounded_once(rng, half, m, k, n):
    """At the host's level a 16-bit matmul widens its operands into the float32 routine's
    panels (or copies, for few rows): the bits of the float32 product of the widened operands,
    rounded once, for contiguous and transposed operands."""
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes")
    d = np.dtype(getattr(ml_dtypes, half) if half == "bfloat16" else np.float16)
    a = rng.uniform(-2, 2, (m, k)).astype(d)
    b = rng.uniform(-2, 2, (k, n)).astype(d)
    wide = ts.function(lambda a, b: a @ b)(a.astype(np.float32), b.astype(np.float32))
    got = ts.function(lambda a, b: a @ b)(a, b)
    assert got.dtype == d
    np.testing.assert_array_equal(got.view(np.uint16), wide.astype(d).view(np.uint16))
    got_t = ts.function(lambda at, bt: at.T @ bt.T)(np.ascontiguousarray(a.T),
                                                    np.ascontiguousarray(b.T))
    np.testing.assert_array_equal(got_t.view(np.uint16), got.view(np.uint16))
