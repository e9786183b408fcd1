"""Tile kernels (`@ts.kernel`, tessera/kernel/): the seeds' matmul_kernel and safe_softmax as
written, against NumPy on ragged shapes, with f32 and bf16 inputs; the same bits as op.matmul,
across block sizes and thread settings, and in the CUDA and HIP emulator; errors named at the
user's line before anything runs. (The CUDA and HIP versions: tests/targets/test_gpu_emulated.py,
and on a device test_gpu_device.py.)"""
import numpy as np
import pytest

import tessera as ts
from tessera import Tile, bf16, f32, tile
from tessera.errors import ArgumentError, DTypeError, ShapeError, TracingError

from cases import tile_column_sums, tile_histogram
from cases import tile_matmul as matmul_f32
from conftest import assert_within_dot_bound


@ts.kernel
def matmul_kernel(A: Tile["M", "K", bf16], B: Tile["K", "N", bf16], C: Tile["M", "N", f32]):
    ctx = tile.context()
    A_shared = tile.load(A, shape=(ctx.BM, ctx.BK), prefetch=2)
    B_shared = tile.load(B, shape=(ctx.BK, ctx.BN), prefetch=2)
    accumulator = tile.zeros((ctx.BM, ctx.BN), dtype=f32)
    for k in tile.range_k(0, ctx.K, ctx.BK):
        A_tile = tile.load_partition(A_shared, k)
        B_tile = tile.load_partition(B_shared, k)
        accumulator += tile.mma(A_tile, B_tile)
    tile.store(C, accumulator)


@ts.kernel
def safe_softmax(x: Tile["R", "C", f32]) -> Tile["R", "C", f32]:
    max_val = tile.max(x, axis=-1, keepdim=True)
    exp_x = tile.exp(x - max_val)
    return exp_x / tile.sum(exp_x, axis=-1, keepdim=True)


SHAPES = [(1, 1, 1), (7, 13, 5), (97, 31, 61), (64, 64, 64), (130, 300, 3)]


def softmax_ref(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_seed_matmul_f32_matches_numpy_and_op_matmul_bit_for_bit(rng, m, k, n):
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    C = np.full((m, n), np.nan, np.float32)
    assert matmul_f32(A, B, C) is C
    assert_within_dot_bound(C, A, B)
    # one FMA chain per element over k in order: op.matmul's own
    assert C.tobytes() == ts.function(lambda a, b: a @ b)(A, B).tobytes()


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_seed_matmul_bf16_inputs_accumulate_in_f32(rng, m, k, n):
    A = rng.standard_normal((m, k)).astype(bf16.np)
    B = rng.standard_normal((k, n)).astype(bf16.np)
    C = np.zeros((m, n), np.float32)
    matmul_kernel(A, B, C)
    a, b = A.astype(np.float32), B.astype(np.float32)      # exact
    assert_within_dot_bound(C, a, b)


@pytest.mark.parametrize("r,c", [(1, 1), (5, 1000), (130, 7), (64, 64)])
def test_seed_softmax_matches_numpy(rng, r, c):
    x = (rng.standard_normal((r, c)) * 5).astype(np.float32)
    y = safe_softmax(x)
    assert y.dtype == np.float32 and y.shape == (r, c)
    np.testing.assert_allclose(y, softmax_ref(x), rtol=2e-6 * np.log2(c + 1) + 1e-6, atol=1e-7)


@pytest.mark.parametrize("r,c", [(3, 17), (37, 1000), (5, 4099)])
def test_seed_softmax_gives_op_softmax_bits(rng, r, c):
    # reductions in the row strategy's order (16 lanes for float32, then the lanes in order)
    x = (rng.standard_normal((r, c)) * 4).astype(np.float32)
    want = ts.function(lambda v: ts.op.softmax(v, axis=-1))(x)
    assert safe_softmax(x).tobytes() == want.tobytes()


def test_the_fma_chains_and_the_gemm_routine_agree(rng):
    """A loop that is not the bare `acc += mma(...)` runs the FMA chains from the tiles instead
    of the GEMM routine: the same bits either way."""
    @ts.kernel
    def matmul_and_colsum(A: Tile["M", "K", f32], B: Tile["K", "N", f32], C: Tile["M", "N", f32]):
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BM, ctx.BK))
        b = tile.load(B, shape=(ctx.BK, ctx.BN))
        acc = tile.zeros((ctx.BM, ctx.BN))
        ones = tile.zeros((ctx.BM, ctx.BN))
        for k in tile.range_k(0, ctx.K, ctx.BK):
            b_k = tile.load_partition(b, k)
            acc += tile.mma(tile.load_partition(a, k), b_k)
            ones += 0.0
        tile.store(C, acc + ones)
    A = rng.standard_normal((70, 130), dtype=np.float32)
    B = rng.standard_normal((130, 45), dtype=np.float32)
    got = matmul_and_colsum(A, B, np.zeros((70, 45), np.float32))
    assert "call ts_gemm" not in str(matmul_and_colsum.lower(A, B, np.zeros((70, 45),
                                                                         np.float32)).tile_ir)
    assert "call ts_gemm" in str(matmul_f32.lower(A, B, np.zeros((70, 45), np.float32)).tile_ir)
    assert got.tobytes() == matmul_f32(A, B, np.zeros((70, 45), np.float32)).tobytes()


@pytest.mark.parametrize("block", [(16, 16, 16), (32, 64, 8), (128, 16, 64)])
def test_block_sizes_and_threads_change_no_bit(rng, block):
    A = rng.standard_normal((97, 75), dtype=np.float32)
    B = rng.standard_normal((75, 53), dtype=np.float32)
    want = matmul_f32(A, B, np.zeros((97, 53), np.float32))
    for parallel in (True, False):
        k = ts.kernel(matmul_f32.fn, schedule=ts.Schedule(block=block, parallel=parallel))
        got = k(A, B, np.zeros((97, 53), np.float32))
        assert got.tobytes() == want.tobytes()
        prog = k.lower(A, B, np.zeros((97, 53), np.float32))
        knobs = prog.schedule_ir.kernels[0].knobs
        assert (knobs["tile_m"], knobs["tile_n"], knobs["tile_k"]) == block


def test_a_fused_epilogue_written_by_hand(rng):
    @ts.kernel
    def linear_gelu(X: Tile["M", "K", f32], W: Tile["K", "N", f32], b: Tile["N", f32],
                    Y: Tile["M", "N", f32]):
        ctx = tile.context()
        x = tile.load(X, shape=(ctx.BM, ctx.BK))
        w = tile.load(W, shape=(ctx.BK, ctx.BN))
        acc = tile.zeros((ctx.BM, ctx.BN))
        for k in tile.range_k(0, ctx.K, ctx.BK):
            acc += tile.mma(tile.load_partition(x, k), tile.load_partition(w, k))
        bias = tile.load(b, shape=(ctx.BN,))
        tile.store(Y, tile.maximum(acc + bias, 0.0))
    X = rng.standard_normal((45, 70), dtype=np.float32)
    W = rng.standard_normal((70, 33), dtype=np.float32)
    b = rng.standard_normal(33, dtype=np.float32)
    Y = linear_gelu(X, W, b, np.zeros((45, 33), np.float32))
    want = np.maximum(X.astype(np.float64) @ W + b, 0)
    np.testing.assert_allclose(Y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_offsets_from_program_ids(rng):
    @ts.kernel
    def scale_rows(X: Tile["R", "C", f32], Y: Tile["R", "C", f32]):
        ctx = tile.context()
        row = tile.program_id(0) * ctx.BM
        x = tile.load(X, shape=(ctx.BM, ctx.C), offset=(row, 0))
        tile.store(Y, x * 2.0 + 1.0, offset=(row, 0))
    X = rng.standard_normal((37, 11), dtype=np.float32)
    Y = scale_rows(X, np.zeros_like(X))
    np.testing.assert_array_equal(Y, X * 2.0 + 1.0)


@pytest.mark.parametrize("axis", [0, 1])
def test_a_tile_reduced_after_it_is_made_is_made_in_the_reductions_loop(rng, axis):
    """`e = exp(..)` used twice is kept in a tile; a sum along its rows right after it computes
    and stores each element in its own loop (one pass, no read back), with the unfused order's
    bits: the GPU lowering, which keeps two passes, gives the same bits
    (tests/targets/test_gpu_emulated). Along the columns it stays two passes (the made tile's
    rows vectorised, then the sum)."""
    @ts.kernel
    def exp_over_sum(x: Tile["R", "C", f32]) -> Tile["R", "C", f32]:
        e = tile.exp(x * 0.5)
        return e / tile.sum(e, axis=axis, keepdim=True)

    x = rng.standard_normal((37, 70), dtype=np.float32)
    text = str(exp_over_sum.lower(x).tile_ir)
    made = [line.split(":")[0].strip() for line in text.splitlines() if "exp(" in line]
    summed = [line for line in text.splitlines() if "= sum.combine(acc" in line]
    from_register = [line.endswith(f", {e})") for line, e in zip(summed, made)]
    if axis == 1:
        assert len(summed) == len(made) == 2 and all(from_register)   # the chunks' and the tail's
    else:
        assert len(made) == 1 and not any(from_register)
    e64 = np.exp(x.astype(np.float64) * 0.5)
    np.testing.assert_allclose(exp_over_sum(x), e64 / e64.sum(axis, keepdims=True),
                               rtol=2e-6 * np.log2(x.shape[axis] + 1) + 1e-6)


def test_the_program_is_a_program(rng):
    x = rng.standard_normal((9, 40), dtype=np.float32)
    prog = safe_softmax.lower(x)
    [k] = prog.schedule_ir.kernels
    assert k.strategy == "tile"
    assert "strategy=tile" in str(prog.tile_ir)
    assert "tile kernel safe_softmax" in str(prog.graph_ir)
    np.testing.assert_array_equal(prog(x), safe_softmax(x))
    text = safe_softmax.ir(x)
    assert "reduce(" in text and "test_tile_kernels.py" in text


def test_the_reference_interpreter_agrees(rng):
    from tessera.kernel.interpreter import interpret
    A = rng.standard_normal((40, 23), dtype=np.float32)
    B = rng.standard_normal((23, 17), dtype=np.float32)
    C = np.zeros((40, 17), np.float32)
    body = matmul_f32.body([ts.float32] * 3)
    assert_within_dot_bound(interpret(body, [A, B, C]), A, B)
    x = rng.standard_normal((13, 29), dtype=np.float32)
    y = interpret(safe_softmax.body([ts.float32]), [x])
    np.testing.assert_allclose(y, softmax_ref(x), rtol=1e-5, atol=1e-7)


# ---- errors, before anything runs ---------------------------------------------------------------
def _line_of(fn, text):
    import inspect
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, s in enumerate(lines) if text in s)


def test_mma_of_incompatible_tiles_names_the_line():
    def bad(A: Tile["M", "K", f32], B: Tile["K", "N", f32], C: Tile["M", "N", f32]):
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BM, ctx.BK))
        b = tile.load(B, shape=(ctx.BN, ctx.BK))
        tile.store(C, tile.mma(a, b))
    k = ts.kernel(bad)
    with pytest.raises(ShapeError, match="incompatible") as e:
        k(np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32))
    assert e.value.location.lineno == _line_of(bad, "tile.mma")


def test_python_if_on_a_tile_is_an_error():
    def bad(x: Tile["R", "C", f32]) -> Tile["R", "C", f32]:
        if tile.max(x) > 0:
            return x
        return x * 2
    with pytest.raises(TracingError, match="Python if") as e:
        ts.kernel(bad)(np.zeros((2, 3), np.float32))
    assert "tile.where" in e.value.hint
    assert e.value.location.lineno == _line_of(bad, "if tile.max")


def test_float_atomics_are_refused_for_determinism():
    def bad(x: Tile["R", "C", f32], y: Tile["R", "C", f32]):
        tile.atomic_add(y, x)
    with pytest.raises(DTypeError, match="order"):
        ts.kernel(bad)(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32))


def test_a_load_against_the_grid_is_an_error():
    def bad(A: Tile["M", "K", f32], C: Tile["M", "K", f32]):
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BN, ctx.K))
        tile.store(C, tile.load(A, shape=(ctx.BM, ctx.K)) + a)
    with pytest.raises(ShapeError):
        ts.kernel(bad)(np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32))


def test_a_tile_made_in_a_loop_cannot_leave_it():
    def bad(A: Tile["M", "K", f32], B: Tile["K", "N", f32], C: Tile["M", "N", f32]):
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BM, ctx.BK))
        b = tile.load(B, shape=(ctx.BK, ctx.BN))
        for k in tile.range_k(0, ctx.K, ctx.BK):
            acc = tile.mma(tile.load_partition(a, k), tile.load_partition(b, k))
        tile.store(C, acc)
    with pytest.raises(TracingError, match="loop") as e:
        ts.kernel(bad)(*(np.zeros((4, 4), np.float32),) * 3)
    assert "acc +=" in e.value.hint


def test_a_break_in_range_k_is_an_error():
    """The loop is traced once and runs for every k: a break would be silently ignored."""
    def bad(A: Tile["M", "K", f32], B: Tile["K", "N", f32], C: Tile["M", "N", f32]):
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BM, ctx.BK))
        b = tile.load(B, shape=(ctx.BK, ctx.BN))
        acc = tile.zeros((ctx.BM, ctx.BN))
        for k in tile.range_k(0, ctx.K, ctx.BK):
            acc += tile.mma(tile.load_partition(a, k), tile.load_partition(b, k))
            break
        tile.store(C, acc)
    with pytest.raises(TracingError, match="break") as e:
        ts.kernel(bad)(*(np.zeros((4, 4), np.float32),) * 3)
    assert e.value.location.lineno == _line_of(bad, "for k in tile.range_k")


@pytest.mark.parametrize("case", ["dtype", "rank", "size", "overlap", "outside"])
def test_bad_arguments_write_nothing(case):
    A = np.ones((6, 5), np.float32)
    B = np.ones((5, 4), np.float32)
    C = np.full((6, 4), 7.0, np.float32)
    if case == "dtype":
        with pytest.raises(DTypeError, match="bf16|bfloat16"):
            matmul_kernel(A, B, C)
    elif case == "rank":
        with pytest.raises(ShapeError, match="rank"):
            matmul_f32(A, B, C[0])
    elif case == "size":
        with pytest.raises(ShapeError, match="dimension N"):
            matmul_f32(A, B, np.full((6, 3), 7.0, np.float32))
    elif case == "overlap":
        X = np.ones((6, 6), np.float32)
        with pytest.raises(ArgumentError, match="overlaps"):
            matmul_f32(X[:, :5], X[:5, :4], X[:, 2:])
        assert (X == 1).all()
    else:
        with pytest.raises(TracingError, match="@ts.kernel|@tessera.kernel"):
            tile.load(A, shape=(2, 2))
    assert (C == 7).all()


def test_interpret_and_eager_run_the_body_with_numpy(rng):
    x = rng.standard_normal((6, 21)).astype(np.float32)
    f = safe_softmax.as_function()
    np.testing.assert_allclose(ts.interpret(f, x), softmax_ref(x), rtol=1e-5, atol=1e-7)


def test_the_autotuner_takes_a_tile_kernel(rng, tmp_path):
    A = rng.standard_normal((96, 64), dtype=np.float32)
    B = rng.standard_normal((64, 80), dtype=np.float32)
    C = np.zeros((96, 80), np.float32)
    space = {"BM": [16, 32], "BN": [16, 32], "BK": [32]}
    with ts.runtime.tunedb.using(str(tmp_path / "t.db")):
        result = ts.autotune(matmul_f32, A, B, C, space=space, budget_s=10, progress=False)
    assert {"tile_m", "tile_n"} <= set(result.best[next(iter(result.best))])

    @ts.kernel.autotune(space=space, cache=str(tmp_path / "k.db"), budget_s=10, progress=False)
    def tuned(A: Tile["M", "K", f32], B: Tile["K", "N", f32], C: Tile["M", "N", f32]):
        matmul_f32.fn(A, B, C)          # a kernel's Python body, traced inside another
    got = tuned(A, B, C)
    assert got.tobytes() == matmul_f32(A, B, C.copy()).tobytes()      # no knob changes a bit
    assert len(tuned.results) == 1 and "knobs (tuned)" in str(tuned.lower(A, B, C).schedule_ir)


# ---- edge cases (each once a bug): offsets below 0, partial stores, nested loops, aliasing ----
def _check(kernel, args, want):
    got = kernel(*[a.copy() for a in args])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ts.interpret(kernel.as_function(), *args), want,
                               rtol=1e-5, atol=1e-5)


def test_offsets_below_zero_read_other_and_write_nothing_outside(rng):
    @ts.kernel
    def previous_row(X: Tile["R", "C", f32], Y: Tile["R", "C", f32]):
        ctx = tile.context()
        row = tile.program_id(0) * ctx.BM
        tile.store(Y, tile.load(X, shape=(ctx.BM, ctx.C), offset=(row - 1, 0)),
                   offset=(row, 0))

    @ts.kernel
    def next_row(X: Tile["R", "C", f32], Y: Tile["R", "C", f32]):
        ctx = tile.context()
        row = tile.program_id(0) * ctx.BM
        tile.store(Y, tile.load(X, shape=(ctx.BM, ctx.C), offset=(row, 0)),
                   offset=(row - 1, 0))
    X = rng.standard_normal((9, 5)).astype(np.float32)
    k = ts.kernel(previous_row.fn, schedule=ts.Schedule(block=(4, 4)))
    _check(k, [X, np.zeros_like(X)], np.vstack([np.zeros((1, 5)), X[:-1]]))
    k = ts.kernel(next_row.fn, schedule=ts.Schedule(block=(4, 4)))
    # the programs store rows -1..10, each the tile read at +1 (row -1 and rows past 8 are
    # outside: dropped; row 8 is X's row 9, outside X: `other`)
    _check(k, [X, np.full_like(X, 7.0)], np.vstack([X[1:], np.zeros((1, 5))]))


def test_a_partial_store_keeps_the_callers_values(rng):
    @ts.kernel
    def first_rows(X: Tile["R", "C", f32], Y: Tile["R", "C", f32]):
        x = tile.load(X, shape=(2, tile.context().C), offset=(0, 0))
        tile.store(Y, x * 10.0, offset=(0, 0))
    X = rng.standard_normal((6, 3)).astype(np.float32)
    _check(first_rows, [X, np.full_like(X, 7.0)], np.vstack([X[:2] * 10, np.full((4, 3), 7)]))


def test_accumulators_in_nested_loops_and_reading_themselves(rng):
    @ts.kernel
    def twice(A: Tile["M", "K", f32], B: Tile["K", "N", f32], C: Tile["M", "N", f32]):
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BM, ctx.BK))
        b = tile.load(B, shape=(ctx.BK, ctx.BN))
        acc = tile.zeros((ctx.BM, ctx.BN))
        for _ in tile.range_k(0, 2, 1):
            for k in tile.range_k(0, ctx.K, ctx.BK):
                acc += tile.mma(tile.load_partition(a, k), tile.load_partition(b, k))
        tile.store(C, acc)

    @ts.kernel
    def plus_product(X: Tile["R", "C", f32], W: Tile["C", "C", f32]) -> Tile["R", "C", f32]:
        ctx = tile.context()
        acc = tile.zeros((ctx.BM, ctx.C))
        acc += tile.load(X, shape=(ctx.BM, ctx.C))
        acc += tile.mma(acc, tile.load(W, shape=(ctx.C, ctx.C)))     # reads acc, then adds
        return acc
    A = rng.standard_normal((20, 30)).astype(np.float32)
    B = rng.standard_normal((30, 10)).astype(np.float32)
    _check(twice, [A, B, np.zeros((20, 10), np.float32)], 2 * (A.astype(np.float64) @ B))
    X = rng.standard_normal((9, 4)).astype(np.float32)
    W = rng.standard_normal((4, 4)).astype(np.float32)
    _check(plus_product, [X, W], X + X.astype(np.float64) @ W)


def test_updates_comparisons_and_masked_operands(rng):
    @ts.kernel
    def shifted(X: Tile["R", "C", f32]) -> Tile["R", "C", f32]:
        x = X * 2.0
        x += 1.0
        return tile.where(X == 0.5, -1.0, x)

    @ts.kernel
    def col_sums(A: Tile["K", "N", f32], C: Tile["M", "N", f32]):
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BK, ctx.BN), other=float("nan"))   # NaN past K
        acc = tile.zeros((ctx.BM, ctx.BN))
        for k in tile.range_k(0, ctx.K, ctx.BK):
            acc += tile.mma(tile.full((ctx.BM, ctx.BK), 1.0), tile.load_partition(a, k))
        tile.store(C, acc)
    X = np.round(rng.standard_normal((5, 8)) * 2) / 4
    X = X.astype(np.float32)
    _check(shifted, [X], np.where(X == 0.5, -1.0, X * 2 + 1))
    A = rng.standard_normal((5, 3)).astype(np.float32)
    _check(col_sums, [A, np.zeros((4, 3), np.float32)], np.tile(A.sum(0), (4, 1)))


@pytest.mark.parametrize("shape", [(3, 0), (0, 5)])
def test_empty_tensors(shape):
    x = np.zeros(shape, np.float32)
    assert safe_softmax(x).shape == shape
    C = matmul_f32(np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32),
                   np.full((3, 4), 7.0, np.float32))
    np.testing.assert_array_equal(C, np.zeros((3, 4)))


def test_more_mistakes_are_named():
    def two_axes_one_dim(X: Tile["N", "K", f32], Y: Tile["K", "N", f32]) -> Tile["N", "N"]:
        ctx = tile.context()
        a = tile.load(X, shape=(ctx.BM, ctx.BK))
        b = tile.load(Y, shape=(ctx.BK, ctx.BM))
        acc = tile.zeros((ctx.BM, ctx.BM))
        for k in tile.range_k(0, ctx.K, ctx.BK):
            acc += tile.mma(tile.load_partition(a, k), tile.load_partition(b, k))
        return acc

    def partition_of_a_whole_load(A: Tile["M", "K", f32], C: Tile["M", "K", f32]):
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BM, ctx.K))
        acc = tile.zeros((ctx.BM, ctx.K))
        for k in tile.range_k(0, ctx.K, ctx.BK):
            acc += tile.load_partition(a, k)
        tile.store(C, acc)

    def sibling_loops(A: Tile["M", "K", f32], C: Tile["M", "K", f32]):
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BM, ctx.BK))
        acc = tile.zeros((ctx.BM, ctx.BK))
        for k in tile.range_k(0, ctx.K, ctx.BK):
            t = tile.load_partition(a, k)
        for k in tile.range_k(0, ctx.K, ctx.BK):
            acc += t
        tile.store(C, acc)

    def loop_variable_after_its_loop(X: Tile["R", "C", f32], Y: Tile["R", "C", f32]):
        ctx = tile.context()
        for k in tile.range_k(0, ctx.R, ctx.BM):
            pass
        tile.store(Y, tile.load(X, shape=(ctx.BM, ctx.C), offset=(k, 0)), offset=(0, 0))
    x = np.zeros((4, 4), np.float32)
    for fn, err, what in [(two_axes_one_dim, ShapeError, "same dimension"),
                          (partition_of_a_whole_load, ShapeError, "nothing to partition"),
                          (sibling_loops, TracingError, "loop that has ended"),
                          (loop_variable_after_its_loop, TracingError, "loop that has ended")]:
        with pytest.raises(err, match=what):
            ts.kernel(fn)(*[x] * (len(fn.__annotations__) - ("return" in fn.__annotations__)))


def test_the_return_annotation_is_checked_and_names_the_stored_dtype(rng):
    def transposed(x: Tile["R", "C", f32]) -> Tile["C", "R", f32]:
        return x * 2.0
    with pytest.raises(ShapeError, match="annotation"):
        ts.kernel(transposed)(np.zeros((2, 3), np.float32))

    @ts.kernel
    def softmax_bf16(x: Tile["R", "C", f32]) -> Tile["R", "C", bf16]:
        e = tile.exp(x - tile.max(x, axis=-1, keepdim=True))
        return e / tile.sum(e, axis=-1, keepdim=True)
    x = rng.standard_normal((5, 40)).astype(np.float32)
    y = softmax_bf16(x)
    assert y.dtype == bf16.np
    # rounded once from the float32 result
    np.testing.assert_array_equal(y, safe_softmax(x).astype(bf16.np))
    assert ts.interpret(softmax_bf16.as_function(), x).dtype == bf16.np


def test_stages_change_no_bit_and_nothing_on_the_cpu(rng):
    """range_k's stages (and load's prefetch) pipeline the partitions on GPUs
    (tests/targets/test_gpu_emulated.py); on the CPU the same program runs."""
    from cases import tile_abs_matmul
    A = rng.standard_normal((37, 75), dtype=np.float32)
    B = rng.standard_normal((75, 29), dtype=np.float32)
    want = tile_abs_matmul[1](A, B, np.zeros((37, 29), np.float32))
    assert_within_dot_bound(want, np.abs(A), B)
    for stages in (2, 3):
        got = tile_abs_matmul[stages](A, B, np.zeros((37, 29), np.float32))
        assert got.tobytes() == want.tobytes()

    # stages=ctx.stages takes the knob (a Schedule's stages, or the autotuner's)
    def knob(A: Tile["M", "K", f32], B: Tile["K", "N", f32], C: Tile["M", "N", f32]):
        ctx = tile.context()
        a, b = tile.load(A, shape=(ctx.BM, ctx.BK)), tile.load(B, shape=(ctx.BK, ctx.BN))
        acc = tile.zeros((ctx.BM, ctx.BN))
        for k in tile.range_k(0, ctx.K, ctx.BK, stages=ctx.stages):
            acc += tile.mma(tile.abs(tile.load_partition(a, k)), tile.load_partition(b, k))
        tile.store(C, acc)
    C = np.zeros((37, 29), np.float32)
    for n in (1, 3):
        k = ts.kernel(knob, schedule=ts.Schedule(block=(32, 32, 16), stages=n))
        assert k(A, B, C.copy()).tobytes() == want.tobytes()
        rings = [s for s in k.lower(A, B, C, target="cuda").tile_ir.kernels[0].body
                 if getattr(s, "name", "").startswith("ring")]
        assert [s.size for s in rings] == ([n * 32 * 16, n * 16 * 32] if n > 1 else [])

    def bad(A: Tile["M", "K", f32], C: Tile["M", "K", f32]):
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BM, ctx.BK), prefetch=0.5)
        tile.store(C, a)
    with pytest.raises(ArgumentError, match="number of buffers") as e:
        ts.kernel(bad)(np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32))
    assert e.value.location.lineno == _line_of(bad, "prefetch=")


# ---- integer atomics ----------------------------------------------------------------------------
@pytest.mark.parametrize("n,bins", [(1, 1), (7, 3), (1000, 37), (4099, 256)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_a_histogram_by_atomic_adds_is_numpys(rng, n, bins, dtype):
    x = rng.integers(0, bins, n).astype(dtype)
    start = rng.integers(-5, 5, bins).astype(dtype)      # the adds start from these (in-out)
    counts = start.copy()
    assert tile_histogram(x, counts) is counts
    np.testing.assert_array_equal(counts, start + np.bincount(x, minlength=bins))
    # any block size, threads or not: the same integers
    for block, parallel in [((16, 16, 16), True), ((128, 16, 16), False)]:
        k = ts.kernel(tile_histogram.fn, schedule=ts.Schedule(block=block, parallel=parallel))
        np.testing.assert_array_equal(k(x, start.copy()), counts)
    # negative indices count from the end, as NumPy's add.at
    counts = start.copy()
    tile_histogram(x - bins, counts)
    np.testing.assert_array_equal(counts, start + np.bincount(x, minlength=bins))


def test_block_atomic_adds_and_the_interpreter(rng):
    x = rng.integers(-1000, 1000, (301, 13)).astype(np.int64)
    total = rng.integers(-9, 9, (1, 13)).astype(np.int64)
    want = total + x.sum(0, keepdims=True)
    np.testing.assert_array_equal(tile_column_sums(x, total.copy()), want)
    before = total.copy()
    np.testing.assert_array_equal(tile_column_sums.interpret(x, total, knobs={"BM": 16}), want)
    np.testing.assert_array_equal(total, before)           # (the interpreter writes into none)
    xs = rng.integers(0, 9, 50).astype(np.int32)
    np.testing.assert_array_equal(tile_histogram.interpret(xs, np.zeros(9, np.int32)),
                                  np.bincount(xs, minlength=9))
    # int32 sums wrap as C's and NumPy's do: the same bits whatever the order
    big = np.full((64, 2), 2**30, np.int32)
    got = tile_column_sums(big, np.zeros((1, 2), np.int32))
    np.testing.assert_array_equal(got, big.sum(0, keepdims=True, dtype=np.int32))


def test_atomic_mistakes_are_named_and_write_nothing():
    counts = np.full(4, 7, np.int32)
    with pytest.raises(ts.RuntimeFault, match="out of range") as e:
        tile_histogram(np.array([1, 4, 2], np.int32), counts)
    assert (counts == 7).all()
    assert e.value.location.lineno > 0

    def into_bool(x: Tile["N", ts.int32], m: Tile["N", ts.bool_]):
        tile.atomic_add(m, tile.load(x), index=tile.load(x))

    def beside_a_store(x: Tile["N", ts.int32], y: Tile["N", ts.int32]):
        tile.store(y, tile.load(x))
        tile.atomic_add(y, tile.load(x))

    def a_number_without_index(x: Tile["N", ts.int32], y: Tile["N", ts.int32]):
        tile.atomic_add(y, 1)

    def index_into_a_matrix(x: Tile["N", ts.int32], y: Tile["N", "N", ts.int32]):
        tile.atomic_add(y, 1, index=tile.load(x))

    def float_index(x: Tile["N", f32], y: Tile["N", ts.int32]):
        tile.atomic_add(y, 1, index=tile.load(x))
    i = np.zeros(4, np.int32)
    for fn, args, err, what in [
            (into_bool, (i, np.zeros(4, bool)), DTypeError, "int32 or int64"),
            (beside_a_store, (i, i.copy()), TracingError, "one output"),
            (a_number_without_index, (i, i.copy()), ArgumentError, "needs index="),
            (index_into_a_matrix, (i, np.zeros((4, 4), np.int32)), ShapeError, "rank-1"),
            (float_index, (np.zeros(4, np.float32), i.copy()), ArgumentError, "integers")]:
        with pytest.raises(err, match=what) as e:
            ts.kernel(fn)(*args)
        assert e.value.location.lineno == _line_of(fn, "tile.atomic_add")


def test_every_statement_class_is_interpreted_and_lowered():
    """A statement class (tessera/kernel/ir.py) without its method in the interpreter or the
    strategy would fail only when a kernel uses it: here it fails at once."""
    from tessera.kernel import lowering as strategy
    from tessera.kernel import interpreter, ir
    kinds = set(ir.KernelStmt.__subclasses__())
    assert kinds == set(interpreter.RUN_STMT) == set(strategy.LOWER_STMT)
    assert len({k.name for k in kinds}) == len(kinds)        # each its own name in the text


def test_ts_kernel_is_the_decorator_beside_the_package():
    """`tessera.kernel` is the kernel language's package and `ts.kernel` the decorator: the
    package is imported before the name is bound (tessera/__init__.py)."""
    import sys

    from tessera.kernel import function

    def copy(x: Tile["N", f32], y: Tile["N", f32]):
        tile.store(y, tile.load(x))
    assert ts.kernel is not sys.modules["tessera.kernel"] and callable(ts.kernel.autotune)
    assert isinstance(ts.kernel(copy), function.KernelFunction)
