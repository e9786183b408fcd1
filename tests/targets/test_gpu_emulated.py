"""Tessera programs lowered for CUDA and HIP (lower_schedule_gpu + render_cuda / render_hip), run in the
CPU emulator of the GPU thread model (tests/gpu_emulator; warps of 32 and of 64), against NumPy:
every GPU strategy, on shapes with 1, primes and odd sizes. Each program runs twice: as
planned, then with its blocks and threads in reverse order on at most 3 blocks (so the grid-
and block-stride loops go round several times). Both runs must give the same bits: a race, or a
result that depends on the order threads arrive or on the grid, shows up as a difference."""
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

import tessera as ts
from tessera import nn, op
from tessera.errors import CompileError
from tessera.compiler.spelling.libm import FROM_C_LIBRARY

from conftest import assert_close, assert_within_dot_bound, attention_reference
from gpu_emulator import run_program

if shutil.which(os.environ.get("CXX") or "g++") is None:
    pytest.skip("the CUDA emulator needs a C++20 compiler (g++)", allow_module_level=True)


def sum_bound(x64, axis):
    """A float32 sum's classical error bound, (n + 1) eps sum|x|, plus its final rounding."""
    n = x64.size // np.asarray(x64.sum(axis=axis)).size
    eps = np.finfo(np.float32).eps
    return (n + 1) * eps * np.abs(x64).sum(axis=axis) + eps * np.abs(x64.sum(axis=axis))


def qkv(rng, b, sq, sk, d, dv):
    return tuple(rng.standard_normal((*b, s, n)).astype(np.float32)
                 for s, n in [(sq, d), (sk, d), (sk, dv)])


@pytest.fixture(params=["cuda", "hip"])
def target(request):
    return request.param


def run_twice(prog, arrays) -> list:
    """A GPU program's results in the emulator: run as planned, then reversed on at most 3
    blocks, with the same bits."""
    try:
        first = run_program(prog, *arrays)
    except CompileError as e:
        if "no such instruction" in str(e):       # the assembler met PTX (mma.sync, ldmatrix)
            pytest.skip("inline PTX (tensor-core mma.sync) cannot run in the CPU emulator")
        raise
    second = run_program(prog, *arrays, reverse=True, max_blocks=3)
    for a, b in zip(first, second):
        assert a.tobytes() == b.tobytes(), "the reversed run on 3 blocks gave other bits"
    return first


def emulate(target, fn, *arrays, strategies=None):
    """fn lowered for `target` and run twice in the emulator: its result (or results).
    `strategies`: the kernels' strategies the test means to exercise."""
    prog = ts.function(fn).lower(*arrays, target=target)
    if strategies is not None:
        assert [k.strategy for k in prog.schedule_ir.kernels] == strategies
    out = run_twice(prog, arrays)
    return out[0] if len(out) == 1 else out


def cpu(fn, *arrays):
    return ts.function(fn)(*arrays)


def with_knobs(target, fn, arrays, knobs: dict):
    """fn lowered for `target` with `knobs` in place of its kernels' own, run twice: its
    result."""
    from tessera.compiler.lower import lower_schedule_gpu
    from tessera.compiler.target.gpu import render_cuda, render_hip
    prog = ts.function(fn).lower(*arrays, target=target)
    for k in prog.schedule_ir.kernels:
        k.knobs = {**k.knobs, **knobs}
    tile = lower_schedule_gpu(prog.schedule_ir, target).verify()
    assert all(k.launch["block"] == knobs.get("threads", k.launch["block"]) for k in tile.kernels)
    render = render_cuda if target == "cuda" else render_hip
    return run_twice(SimpleNamespace(graph_ir=prog.graph_ir, schedule_ir=prog.schedule_ir,
                                     tile_ir=tile, target=target, target_code=render(tile)),
                     arrays)[0]


# ---- one thread per element ----------------------------------------------------------------------
@pytest.mark.parametrize("xs,ys", [((7,), (7,)), ((33, 1), (1, 5)), ((3, 1, 129), (129,)),
                                   ((1,), (2, 3)), ((), (4,))])
def test_pointwise_with_broadcasting(target, xs, ys, rng):
    x = rng.standard_normal(xs).astype(np.float32)
    y = rng.standard_normal(ys).astype(np.float32)
    fn = lambda x, y: op.tanh(x) * y + op.sigmoid(x - y) / (op.abs(y) + 1)   # noqa: E731
    got = emulate(target, fn, x, y, strategies=["pointwise"])
    assert_close(got, ts.interpret(fn, x, y), scale=5)
    # the same helpers and the same roundings as the CPU's C: the same bits
    assert got.tobytes() == cpu(fn, x, y).tobytes()


UNARY = ["neg", "abs", "sqrt", "sin", "cos", "exp", "tanh", "erf", "log", "rsqrt", "sigmoid",
         "silu", "gelu", "relu", "log1p", "expm1", "softplus"]
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt",
          "ge"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_elementwise_operator(target, dtype, rng):
    """One multi-output program per dtype: every helper the registry emits compiles and runs."""
    x = (rng.standard_normal((3, 37)) * 2).astype(dtype)
    y = (rng.random((37,)) + 0.5).astype(dtype)

    def fn(x, y):
        ax = op.abs(x) + 0.25                   # inside the domain of sqrt, log, rsqrt, pow
        return ([getattr(op, name)(ax if name in ("sqrt", "log", "rsqrt", "log1p") else x)
                 for name in UNARY] + [getattr(op, name)(ax, y) for name in BINARY]
                + [op.where(x > y, x, y), op.cast(x * 100, "int32"),
                   op.gelu(x, approximate="tanh")])
    got = emulate(target, fn, x, y)
    for name, g, w, c in zip(UNARY + BINARY + ["where", "cast", "gelu_tanh"], got,
                             ts.interpret(fn, x, y), cpu(fn, x, y)):
        if g.dtype.kind == "f":
            assert_close(g, np.asarray(w, dtype=g.dtype), scale=20)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)
        if dtype.__name__ not in FROM_C_LIBRARY.get(name, ()):     # the C library's are its own
            assert g.tobytes() == c.tobytes(), f"{name}: other bits than the CPU's"


def test_counter_based_random_numbers(target):
    fn = lambda s: op.random_uniform((5, 67), s, offset=2**31)   # noqa: E731
    seed = np.array(12345, np.int64)
    got = emulate(target, fn, seed)
    np.testing.assert_array_equal(got, ts.interpret(fn, seed))


def test_pointwise_integers_and_booleans(target, rng):
    i = rng.integers(-100, 100, (17, 3)).astype(np.int32)
    j = rng.integers(-100, 100, (3,)).astype(np.int64)
    fn = lambda i, j: (op.where(i > j, i * 3, j - i), i >= 0)    # noqa: E731
    got = emulate(target, fn, i, j)
    want = ts.interpret(fn, i, j)
    for g, w in zip(got, want):
        assert_close(g, w)


def test_pointwise_float64_transcendentals(target, rng):
    """Our float64 polynomials give the CPU's bits; float64 log is the C library's
    (FROM_C_LIBRARY): within its bound, its bits the target's own."""
    x = rng.standard_normal((5, 67))
    ours = lambda x: op.exp(x) + op.erf(x) * op.tanh(x)            # noqa: E731
    with_log = lambda x: op.exp(x) + op.erf(x) * op.log(op.abs(x) + 1)  # noqa: E731
    for fn in (ours, with_log):
        got = emulate(target, fn, x)
        assert_close(got, ts.interpret(fn, x), scale=10)
        if fn is ours:
            assert got.tobytes() == cpu(fn, x).tobytes()


@pytest.mark.parametrize("shape,perm", [((5, 7), (1, 0)), ((5, 7, 3), (2, 0, 1)),
                                        ((1, 33, 2), (0, 2, 1))])
def test_copy_and_transpose(target, shape, perm, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    got = emulate(target, lambda x: op.permute(x, perm) * 1, x)
    np.testing.assert_array_equal(got, np.transpose(x, perm))
    got = emulate(target, lambda x: op.permute(x, perm), x)        # a pure copy
    np.testing.assert_array_equal(got, np.transpose(x, perm))


def test_concat(target, rng):
    a = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal((4, 1)).astype(np.float32)
    c = rng.standard_normal((4, 7)).astype(np.float32)
    got = emulate(target, lambda a, b, c: op.concat([a, b, c], axis=1), a, b, c)
    np.testing.assert_array_equal(got, np.concatenate([a, b, c], axis=1))
    got = emulate(target, lambda a: op.concat([a, a * 2, a], axis=0), a)
    np.testing.assert_array_equal(got, np.concatenate([a, a * 2, a], axis=0))


def test_a_constant_pad_is_one_kernel(target, rng):
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    pads = [[0, 0], [1, 0], [2, 1], [0, 3]]
    got = emulate(target, lambda x: op.pad(x, pads, value=-2.5), x, strategies=["concat"])
    np.testing.assert_array_equal(got, np.pad(x, pads, constant_values=-2.5))


@pytest.mark.parametrize("axis", [0, 1])
def test_take_with_negative_indices(target, axis, rng):
    table = rng.standard_normal((11, 6)).astype(np.float32)
    n = table.shape[axis]
    ids = rng.integers(-n, n, (3, 5)).astype(np.int64)
    got = emulate(target, lambda t, i: op.take(t, i, axis=axis), table, ids, strategies=["gather"])
    np.testing.assert_array_equal(got, np.take(table, ids, axis=axis))


def test_take_out_of_range_is_a_runtime_fault(target, rng):
    table = rng.standard_normal((11, 6)).astype(np.float32)
    ids = np.array([3, -11, 11, 0], np.int32)
    prog = ts.function(lambda t, i: op.take(t, i, axis=0) * 2).lower(table, ids, target=target)
    with pytest.raises(ts.RuntimeFault, match="out of range"):
        run_program(prog, table, ids)
    ids[2] = -1
    np.testing.assert_array_equal(run_program(prog, table, ids)[0], np.take(table, ids, 0) * 2)


@pytest.mark.parametrize("shape,axis", [((1,), 0), ((7,), 0), ((5, 33), 1), ((33, 5), 0),
                                        ((2, 3, 9), 1)])
def test_sorts_are_the_cpus_bits(target, shape, axis, rng):
    """A thread per element ranks it: the CPU's merge sort's permutation (ties in index order,
    NaN last, first descending)."""
    x = np.round(rng.standard_normal(shape) * 2).astype(np.float32)
    x.reshape(-1)[rng.integers(0, x.size)] = np.nan
    fn = lambda x: (op.argsort(x, axis=axis), op.sort(x, axis=axis, descending=True),   # noqa: E731
                    op.topk(x, 1, axis=axis)[1])
    for got, want in zip(emulate(target, fn, x), cpu(fn, x)):
        assert got.tobytes() == want.tobytes()


# ---- control flow: the host runs the loops around the launches --------------------------------
def test_control_flow_is_the_cpus_bits(target, rng):
    """fori_loop, while_loop, scan (both directions) and cond, and a differentiated loop
    (save=true and a reverse scan): the host's loops around the GPU kernels give the CPU's
    entry point's bits."""
    x, w = rng.standard_normal(5).astype(np.float32), rng.standard_normal((6, 5)).astype(np.float32)

    def fn(x, w):
        a = ts.fori_loop(0, 6, lambda i, c: c * 0.5 + w[i], x)
        b = ts.while_loop(lambda v: op.norm(v) > 0.5, lambda v: v * 0.75, x * 4.0)
        c, ys = ts.scan(lambda h, t: (h * 0.25 + t, (h, h.min())), x, w)   # (exact: a
        # float sum may round otherwise on a GPU)
        r, rys = ts.scan(lambda h, t: (h + t, h.max()), x, w, reverse=True)
        d = ts.cond(x.sum() > 0, lambda v: v * 3.0, lambda v: v - 1.0, x)
        s, t = ts.fori_loop(0, 3, lambda i, p: (p[1], p[0] + 1.0), (x, x * 2.0))   # a swap
        return a, b, c, ys[0], ys[1], r, rys, d, s, t

    for k, (got, want) in enumerate(zip(emulate(target, fn, x, w), cpu(fn, x, w))):
        assert got.tobytes() == want.tobytes(), k
    for ck in (None, 4):                # checkpointed: nested loops, a segment run again
        grad = ts.grad(lambda x, w: (ts.fori_loop(0, 6, lambda i, c: c * w[i] + 1.0, x,
                                                  checkpoint=ck) ** 2).sum())
        got = run_twice(grad.lower(x, w, target=target), [x, w])[0]
        assert got.tobytes() == grad(x, w).tobytes()


def test_complex_carries_are_the_cpus_bits(target, rng):
    """Complex carries, xs and ys (their parts carried side by side) in fori_loop, scan and cond
    on the host's loops: the CPU's bits, complex arrays in and out."""
    z = (rng.standard_normal(5) + 1j * rng.standard_normal(5)).astype(np.complex64)
    xs = (rng.standard_normal((4, 5)) + 1j * rng.standard_normal((4, 5))).astype(np.complex64)

    def fn(z, xs):
        a = ts.fori_loop(0, 3, lambda i, c: c * (0.5 + 0.25j) + xs[i], z)
        c, ys = ts.scan(lambda h, x: (h * x * 0.5, op.real(h)), z, xs, reverse=True)
        d = ts.cond(op.abs(z).sum() > 1, lambda v: v * 2j, lambda v: -v, z)
        return a, c, ys, d

    for k, (got, want) in enumerate(zip(emulate(target, fn, z, xs), cpu(fn, z, xs))):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), k


# ---- Fourier transforms: a block per line, the Stockham stages in shared memory -----------------
@pytest.mark.parametrize("n", [1, 2, 7, 12, 64, 100, 1000])
def test_transforms_are_the_cpus_bits(target, n, rng):
    """The GPU's stages are the routine's butterflies in the routine's order, its table the
    routine's twiddles: every transform (complex both ways, real both ways, a prologue and a
    view gathered in) gives the CPU's bits, in float32 and float64."""
    for d in (np.float32, np.float64):
        re, im = rng.standard_normal((2, 3, n)).astype(d)
        w = rng.standard_normal(n // 2 + 1).astype(d)

        def fn(a, b, w):
            z = op.fft(op.complex(a, b), axis=-1)
            back = op.ifft(op.complex(op.transpose(a, perm=[1, 0]), 0.0), axis=0, norm="ortho")
            return (op.real(z), op.imag(z), op.real(back),
                    op.irfft(op.rfft(a * 2.0) * w, n=n), op.imag(op.rfft(b, axis=0)))
        for k, (got, want) in enumerate(zip(emulate(target, fn, re, im, w), cpu(fn, re, im, w))):
            assert got.tobytes() == want.tobytes(), (d, k)


def test_complex_arguments_and_results_are_the_cpus_bits(target, rng):
    """Complex arrays go to the kernels as their interleaved parts and come back as complex,
    as on the CPU: arithmetic, a transform, a reduction."""
    z = (rng.standard_normal((4, 12)) + 1j * rng.standard_normal((4, 12))).astype(np.complex64)
    w = (rng.standard_normal(12) + 1j * rng.standard_normal(12)).astype(np.complex128)

    def fn(z, w):
        y = op.fft(z * 2.0 + op.conj(z), axis=-1)
        return y, op.sum(y * w, axis=0), op.abs(z)
    for got, want in zip(emulate(target, fn, z, w), cpu(fn, z, w)):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("n,d,memory", [(37, np.float32, {"shared"}), (74, np.float64, {"shared"}),
                                        (2 * 509, np.float32, {"shared", "workspace"}),
                                        (4096, np.float64, {"workspace"}),
                                        (1 << 15, np.float64, {"phases"}),
                                        (16411, np.float32, {"phases"}),
                                        (1 << 18, np.float32, {"phases"})])
def test_bluestein_and_long_lines_are_the_cpus_bits(target, n, d, memory, rng):
    """A prime factor above 31 (37; 74 = 2 x 37, a real line packed as 37 complex values; 509)
    makes the transform a Bluestein one on the GPU as in the routine; planes and tables beyond
    a block's shared memory (1018 complex points' 2048-point convolution in float32, 4096
    points of float64) live in the block's own part of the workspace. A line longer than 2^14
    points (2^15; the prime 16411 and its 32805-point convolution) takes the whole grid, a
    launch per step, every line's planes in the workspace; on the CPU a line of 2^18 points
    runs its stages in cache-sized blocks (the routine's ts_fft_blocked, one line at a time)
    and 3 lines of 2^15 float64 as one block of lines. Each gives the CPU's bits, complex and
    real, both ways."""
    re, im = rng.standard_normal((2, 3, n)).astype(d)

    def fn(a, b):
        z = op.ifft(op.fft(op.complex(a, b), axis=-1) * 0.5, axis=-1)
        return op.real(z), op.imag(z), op.irfft(op.rfft(a) * 2.0, n=n)
    prog = ts.function(fn).lower(re, im, target=target)
    ffts = [k for k in prog.tile_ir.kernels if k.strategy == "fft"]
    assert {"phases" if k.phase_of else "workspace" if k.launch.get("workspace") else "shared"
            for k in ffts} == memory
    for k, (got, want) in enumerate(zip(run_twice(prog, (re, im)), cpu(fn, re, im))):
        assert got.tobytes() == want.tobytes(), k


def test_phased_transforms_run_in_a_loop_and_share_a_workspace(target, rng):
    """A long line's transform is several launches (phases); in a fori_loop the host runs all
    of them each step. A kernel's phases share one workspace; the kernels' lie one after
    another."""
    n = 1 << 15
    x = rng.standard_normal((1, n)).astype(np.float32)
    fn = lambda x: ts.fori_loop(0, 3, lambda i, c: op.irfft(op.rfft(c) * 0.5, n=n) + 1.0, x)
    prog = ts.function(fn).lower(x, target=target)
    tile = prog.tile_ir
    bases = tile.workspace_bases()
    ffts = [ks for name, ks in tile.phases.items() if "fft" in name]
    assert len(ffts) == 2 and all(len(ks) > 3 for ks in ffts)
    assert [len({bases[k] for k in ks}) for ks in ffts] == [1, 1]
    assert bases[ffts[0][0]] != bases[ffts[1][0]]
    got = run_twice(prog, (x,))[0]
    assert got.tobytes() == cpu(fn, x).tobytes()


# ---- rows: one block per row ---------------------------------------------------------------------
ROWS = [1, 7, 33, 1000]


@pytest.mark.parametrize("n", ROWS)
def test_softmax_and_logsumexp_rows(target, n, rng):
    x = (rng.standard_normal((3, n)) * 3).astype(np.float32)
    fn = lambda x: (op.softmax(x, axis=-1), op.logsumexp(x, axis=-1))   # noqa: E731
    s, lse = emulate(target, fn, x)
    x64 = x.astype(np.float64)
    m = x64.max(-1, keepdims=True)
    want_lse = np.log(np.exp(x64 - m).sum(-1, keepdims=True)) + m
    assert_close(s, np.exp(x64 - want_lse).astype(np.float32), scale=5)
    assert_close(lse, want_lse[:, 0].astype(np.float32), scale=5)


@pytest.mark.parametrize("n", ROWS)
def test_layernorm_and_rmsnorm_rows(target, n, rng):
    x = rng.standard_normal((2, 3, n)).astype(np.float32) * 2 + 1
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    fn = lambda x, w, b: (op.layernorm(x, w, b), op.rmsnorm(x))       # noqa: E731
    ln, rms = emulate(target, fn, x, w, b)
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    sd = np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    r = np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6)
    if n > 1:                   # one element: x - mean is a rounding error, amplified by 1/eps
        assert_close(ln, ((x64 - mu) / sd * w + b).astype(np.float32), scale=10)
    assert_close(rms, (x64 / r).astype(np.float32), scale=10)


@pytest.mark.parametrize("n", ROWS)
def test_sum_and_max_rows(target, n, rng):
    x = rng.standard_normal((5, n)).astype(np.float32)
    s, m = emulate(target, lambda x: (op.sum(x, axis=-1), op.max(x, axis=-1)), x)
    x64 = x.astype(np.float64)
    want = x64.sum(-1)
    assert (np.abs(s - want) <= sum_bound(x64, -1)).all()
    np.testing.assert_array_equal(m, x.max(-1))


def test_whole_tensor_sum_is_one_block(target, rng):
    x = rng.standard_normal((37, 29)).astype(np.float32)
    prog = ts.function(lambda x: op.sum(x)).lower(x, target=target)
    assert [k.launch["grid"] for k in prog.tile_ir.kernels] == [1]
    got = emulate(target, lambda x: op.sum(x), x)
    x64 = x.astype(np.float64)
    assert abs(got - x64.sum()) <= sum_bound(x64, None)


@pytest.mark.parametrize("warps", [1, 3, None])
def test_row_thread_counts(target, warps, rng):
    """Blocks of one warp, of a warp count not a power of two, and of the most threads."""
    threads = 1024 if warps is None else warps * (32 if target == "cuda" else 64)
    x = (rng.standard_normal((3, 1000)) * 3).astype(np.float32)
    got = with_knobs(target, lambda x: op.softmax(x, axis=-1), [x], {"threads": threads})
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    assert_close(got, (e / e.sum(-1, keepdims=True)).astype(np.float32), scale=5)


# ---- one thread per output -----------------------------------------------------------------------
@pytest.mark.parametrize("shape,axis", [((33, 7), 0), ((4, 5, 6), (0, 2)), ((1000, 3), 0)])
def test_column_reductions(target, shape, axis, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    s, m = emulate(target, lambda x: (op.sum(x, axis=axis), op.min(x, axis=axis)), x)
    x64 = x.astype(np.float64)
    want = x64.sum(axis)
    assert (np.abs(s - want) <= sum_bound(x64, axis)).all()
    np.testing.assert_array_equal(m, x.min(axis))


@pytest.mark.parametrize("axis", [None, 0, -1])
def test_argmax(target, axis, rng):
    x = rng.integers(0, 4, (7, 13)).astype(np.float32)         # ties: the first wins
    got = emulate(target, lambda x: op.argmax(x, axis=axis), x)
    np.testing.assert_array_equal(got, np.argmax(x, axis=axis))


# ---- matmul: blocks calling the GEMM routine -----------------------------------------------------
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (13, 17, 19), (130, 20, 129), (5, 0, 3)])
def test_matmul_f32(target, m, k, n, rng):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = emulate(target, lambda a, b: a @ b, a, b, strategies=["contract"])
    assert_within_dot_bound(got, a, b)
    # one fma chain per element from k = 0, as the CPU's routine: the same bits
    assert got.tobytes() == cpu(lambda a, b: a @ b, a, b).tobytes()


@pytest.mark.parametrize("tiles", [(16, 16, 8, 32), (32, 64, 8, 32), (64, 32, 4, 128),
                                   (16, 16, 16, 32), (128, 128, 8, 1024)])
def test_matmul_tiles_do_not_change_bits(target, tiles, rng):
    a = rng.standard_normal((70, 37)).astype(np.float32)
    b = rng.standard_normal((37, 45)).astype(np.float32)
    knobs = dict(zip(["tile_m", "tile_n", "tile_k", "threads"], tiles))
    got = with_knobs(target, lambda a, b: a @ b, [a, b], knobs)
    assert got.tobytes() == cpu(lambda a, b: a @ b, a, b).tobytes()


def test_matmul_f64_and_transposed_operand(target, rng):
    a = rng.standard_normal((67, 33))
    w = rng.standard_normal((70, 33))
    got = emulate(target, lambda a, w: a @ w.T, a, w, strategies=["contract"])
    assert_within_dot_bound(got, a, np.ascontiguousarray(w.T))


def test_matmul_with_fused_bias_gelu(target, rng):
    a = rng.standard_normal((37, 24)).astype(np.float32)
    w = rng.standard_normal((24, 45)).astype(np.float32)
    bias = rng.standard_normal(45).astype(np.float32)
    fn = lambda a, w, b: op.gelu(a @ w + b)                      # noqa: E731
    got = emulate(target, fn, a, w, bias, strategies=["contract"])
    assert_close(got, ts.interpret(fn, a, w, bias), scale=20)


@pytest.mark.parametrize("ashape,bshape", [((3, 20, 12), (3, 12, 9)),
                                           ((3, 1, 20, 12), (4, 12, 9)), ((2, 5, 7), (7, 6))])
def test_batched_and_broadcast_matmul(target, ashape, bshape, rng):
    a = rng.standard_normal(ashape).astype(np.float32)
    b = rng.standard_normal(bshape).astype(np.float32)
    got = emulate(target, lambda a, b: a @ b, a, b)
    shape = np.broadcast_shapes(ashape[:-2], bshape[:-2])
    assert_within_dot_bound(got, np.broadcast_to(a, shape + ashape[-2:]),
                            np.broadcast_to(b, shape + bshape[-2:]))


def test_int8_weight_matmul_with_its_epilogue(target, rng):
    """float32 rows times int8 weights on a GPU: plain loops that widen each weight, then the
    fused epilogue (the per-column scale, a bias, an activation) over the finished rows."""
    x = rng.standard_normal((2, 7, 40)).astype(np.float32)
    w = rng.integers(-127, 128, (40, 23)).astype(np.int8)
    s = rng.uniform(0.01, 0.1, 23).astype(np.float32)
    bias = rng.standard_normal(23).astype(np.float32)
    fn = lambda x, w, s, b: op.gelu(op.matmul_int8_weight(x, w, s) + b)      # noqa: E731
    got = emulate(target, fn, x, w, s, bias, strategies=["contract"])
    assert_close(got, ts.interpret(fn, x, w, s, bias), scale=20)


def test_integer_matmul(target, rng):
    a = rng.integers(-9, 9, (6, 11)).astype(np.int32)
    b = rng.integers(-9, 9, (11, 5)).astype(np.int32)
    np.testing.assert_array_equal(emulate(target, lambda a, b: a @ b, a, b), a @ b)


# ---- convolution: an output element per thread, the CPU's chains --------------------------------
@pytest.mark.parametrize("xs,ws,attrs", [((2, 3, 7, 6), (4, 3, 3, 3), {"padding": 1}),
                                         ((1, 4, 9), (4, 2, 3), {"stride": 2, "groups": 2}),
                                         ((1, 2, 4, 5, 3), (3, 2, 2, 3, 1),
                                          {"padding": (1, 0, 1), "dilation": (2, 1, 1)})])
def test_convolution_gives_the_cpu_bits(target, xs, ws, attrs, rng):
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    shape = (1, ws[0]) + (1,) * (len(xs) - 2)

    def fn(x, w, b):
        return op.relu(op.conv(x, w, **attrs) + op.reshape(b, shape))
    got = emulate(target, fn, x, w, b, strategies=["conv"])
    assert got.tobytes() == cpu(fn, x, w, b).tobytes()


# ---- a convolution's weight gradient: an output element per thread, the CPU's chains -----------
@pytest.mark.parametrize("xs,ws,attrs", [((2, 3, 7, 6), (4, 3, 3, 3), {"padding": 1}),
                                         ((3, 4, 9), (4, 2, 3), {"stride": 2, "groups": 2}),
                                         ((1, 2, 4, 5, 3), (3, 2, 2, 3, 1),
                                          {"padding": (1, 0, 1), "dilation": (2, 1, 1)})])
def test_a_weight_gradient_gives_the_cpu_bits(target, xs, ws, attrs, rng):
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    m = rng.standard_normal(ws).astype(np.float32)
    gy = rng.standard_normal(op.conv(x, w, **attrs).shape).astype(np.float32)

    def fn(x, gy, m):             # an optimiser's momentum: the gradient's epilogue
        dw = op.conv_weight_grad(x, gy, kernel=list(ws[2:]), **attrs)
        return m * 0.9 + dw
    got = emulate(target, fn, x, gy, m, strategies=["conv_weight_grad"])
    assert got.tobytes() == cpu(fn, x, gy, m).tobytes()


# ---- col2im: an image element per thread summing the offsets in order, the CPU's bits ---------
@pytest.mark.parametrize("image,kernel,stride,pad", [((9, 8), (3, 3), 2, 1), ((13,), (4,), 3, 2),
                                                     ((4, 5, 6), (2, 2, 3), 1, 1)])
def test_col2im_gives_the_cpu_bits(target, image, kernel, stride, pad, rng):
    n = len(image)
    grid = [(i + 2 * pad - k) // stride + 1 for i, k in zip(image, kernel)]
    c = rng.standard_normal((2, 3, int(np.prod(kernel)), *grid)).astype(np.float32)
    c.flat[::3], c.flat[1::7], c.flat[::29] = -0.0, 0.0, np.inf

    def fn(c):
        return op.col2im(c, image=list(image), kernel=list(kernel), stride=[stride] * n,
                         padding=pad) * 2.0
    got = emulate(target, fn, c, strategies=["col2im"])
    assert got.tobytes() == cpu(fn, c).tobytes()


# ---- pools: an output element per thread folding its window, the CPU's bits ----------------------
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("xs,kernel,stride,pad", [((2, 3, 9, 8), 3, 2, 1), ((1, 2, 13), 4, 3, 2),
                                                  ((1, 2, 4, 5, 6), 2, 1, 1)])
def test_pools_give_the_cpu_bits(target, kind, xs, kernel, stride, pad, rng):
    x = -np.abs(rng.standard_normal(xs)).astype(np.float32)    # ties of zeros of both signs
    x.flat[::3], x.flat[1::5], x.flat[::29] = -0.0, 0.0, np.nan

    def fn(x):
        return getattr(op, f"{kind}_pool")(x, kernel, stride, pad) * 2.0
    got = emulate(target, fn, x, strategies=["pool"])
    assert got.tobytes() == cpu(fn, x).tobytes()


@pytest.mark.parametrize("xs,kernel,stride,pad", [((2, 3, 9, 8), 3, 2, 1),
                                                  ((1, 2, 4, 5, 6), 2, 1, 1)])
def test_where_each_windows_largest_lies_gives_the_cpu_bits(target, xs, kernel, stride, pad, rng):
    """fold_windows' argmax (max_pool's gradient, max_pool_indices): a thread per window over
    its taps in order, argmax's choice of the first largest (a NaN the largest)."""
    x = -np.abs(rng.standard_normal(xs)).astype(np.float32)
    x.flat[::3], x.flat[1::5], x.flat[::29], x.flat[2::11] = -0.0, 0.0, np.nan, -np.inf

    def fn(x):
        return op.max_pool_indices(x, kernel, stride, pad)
    got = emulate(target, fn, x)
    assert got.tobytes() == cpu(fn, x).tobytes()


# ---- attention -----------------------------------------------------------------------------------
@pytest.mark.parametrize("b,sq,sk,d,dv", [((), 1, 1, 1, 1), ((2,), 5, 7, 8, 3),
                                          ((1, 2), 67, 40, 16, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention(target, b, sq, sk, d, dv, causal, rng):
    q, k, v = qkv(rng, b, sq, sk, d, dv)
    fn = lambda q, k, v: op.attention(q, k, v, causal=causal)     # noqa: E731
    got = emulate(target, fn, q, k, v, strategies=["attention"])
    assert_close(got, attention_reference(q, k, v, causal=causal).astype(np.float32), scale=20)


def test_attention_wide_heads(target, rng):
    """D beyond what stays resident in shared memory, Dv beyond one register chunk."""
    q, k, v = qkv(rng, (2,), 9, 70, 96, 80)
    fn = lambda q, k, v: op.attention(q, k, v, causal=True)       # noqa: E731
    got = emulate(target, fn, q, k, v, strategies=["attention"])
    assert_close(got, attention_reference(q, k, v, causal=True).astype(np.float32), scale=20)


@pytest.mark.parametrize("block_q,threads", [(16, 64), (32, 128), (64, 256), (32, 64)])
def test_attention_knobs_do_not_change_bits(target, block_q, threads, rng):
    q, k, v = qkv(rng, (1, 2), 37, 70, 16, 24)
    fn = lambda q, k, v: op.attention(q, k, v, causal=True)       # noqa: E731
    got = with_knobs(target, fn, [q, k, v], {"block_q": block_q, "threads": threads})
    assert got.tobytes() == emulate(target, fn, q, k, v).tobytes()
    assert_close(got, attention_reference(q, k, v, causal=True).astype(np.float32), scale=20)


def test_attention_with_mask(target, rng):
    q, k, v = qkv(rng, (2,), 9, 12, 8, 8)
    mask = np.where(rng.random((9, 12)) < 0.3, -np.inf, 0).astype(np.float32)
    mask[4] = -np.inf                                           # a row that sees no key: 0
    fn = lambda q, k, v, m: op.attention(q, k, v, mask=m)       # noqa: E731
    got = emulate(target, fn, q, k, v, mask, strategies=["attention"])
    assert_close(got, attention_reference(q, k, v, mask=mask).astype(np.float32), scale=20)
    assert np.all(got[:, 4] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_gives_the_cpu_bits(target, dtype, causal, rng):
    """The CPU and GPU routines share the online softmax's key block (64) and the order of
    every sum, so f32 and f64 attention gives the same bits on both (the SIMT routine)."""
    q, k, v = (a.astype(dtype) for a in qkv(rng, (2, 3), 130, 97, 64, 40))
    mask = rng.standard_normal((130, 97)).astype(dtype)
    fn = lambda q, k, v, m: op.attention(q, k, v, mask=m, causal=causal)   # noqa: E731
    got = emulate(target, fn, q, k, v, mask, strategies=["attention"])
    assert got.tobytes() == cpu(fn, q, k, v, mask).tobytes()
    assert_close(got, attention_reference(q, k, v, mask=mask, causal=causal).astype(dtype),
                 scale=20)


# ---- more shapes of each strategy, against the operators' NumPy references -----------------------
def _f32(*shape):
    return lambda rng: rng.standard_normal(shape).astype(np.float32)


def _mask(*shape):
    return lambda rng: np.where(rng.random(shape) < 0.3, -np.inf, 0).astype(np.float32)


def _ints(lo, hi, *shape, dtype=np.int32):
    return lambda rng: rng.integers(lo, hi, shape).astype(dtype)


PROGRAMS = {
    "softmax over a middle axis": (lambda x: op.softmax(x, axis=1), [_f32(4, 33, 5)]),
    "row prologue and epilogue": (lambda x, b, y: op.log_softmax(x * 2 + b, axis=-1) * y,
                                  [_f32(6, 45), _f32(45), _f32(6, 1)]),
    "mean and var": (lambda x: (op.mean(x, axis=-1, keepdim=True), op.var(x, axis=0)),
                     [_f32(7, 300)]),
    "integer and boolean reductions": (lambda i: (op.sum(i, axis=1), op.max(i, axis=0),
                                                  op.sum(i > 0, axis=1)), [_ints(-50, 50, 9, 40)]),
    "argmin over a middle axis": (lambda x: op.argmin(x, axis=1), [_ints(0, 3, 4, 9, 5,
                                                                        dtype=np.float32)]),
    "many short rows": (lambda x: op.softmax(x, axis=-1), [_f32(700, 3)]),
    "vector times matrix": (lambda a, b: (a @ b, b.T @ a), [_f32(17), _f32(17, 9)]),
    "transposed left operand": (lambda a, b: a.T @ b, [_f32(17, 9), _f32(17, 11)]),
    "matmul, relu and a residual": (lambda x, w, r: op.relu(x @ w) + r,
                                    [_f32(33, 16), _f32(16, 20), _f32(33, 20)]),
    "strided slice": (lambda x: x[:, 1:9:3] * 1, [_f32(5, 11)]),
    "broadcast copy": (lambda x: op.broadcast_to(x, (4, 3, 5)), [_f32(3, 1)]),
    "many blocks": (lambda x: op.exp(x) * 2, [_f32(100003)]),
    "attention, mask broadcast over rows": (
        lambda q, k, v, m: op.attention(q, k, v, mask=m),
        [_f32(2, 3, 9, 8), _f32(2, 3, 12, 8), _f32(2, 3, 12, 8), _mask(1, 12)]),
    "attention, a mask per batch": (lambda q, k, v, m: op.attention(q, k, v, mask=m),
                                    [_f32(2, 9, 8), _f32(2, 12, 8), _f32(2, 12, 8),
                                     _mask(2, 9, 12)]),
    "attention, more queries than keys": (
        lambda q, k, v: op.attention(q, k, v, causal=True, scale=0.3),
        [_f32(13, 8), _f32(7, 8), _f32(7, 5)]),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_programs_against_references(target, name, rng):
    fn, makers = PROGRAMS[name]
    arrays = [make(rng) for make in makers]
    got = emulate(target, fn, *arrays)
    want = ts.interpret(fn, *arrays)
    got, want = (list(got), list(want)) if isinstance(want, tuple) else ([got], [want])
    for g, w in zip(got, want):
        assert_close(g, np.asarray(w), scale=20)


# ---- a program of several kernels ----------------------------------------------------------------
def test_program_with_temporaries_consts_and_aliases(target, rng):
    x = rng.standard_normal((6, 10)).astype(np.float32)
    w = rng.standard_normal((10, 10)).astype(np.float32)
    c = np.linspace(-1, 1, 10, dtype=np.float32)

    def fn(x, w):
        h = op.softmax(x @ w, axis=-1) * c
        return h @ w.T, op.sum(h, axis=0), x, 2.0
    got = emulate(target, fn, x, w)
    want = ts.interpret(fn, x, w)
    assert len(got) == 4 and len(ts.function(fn).lower(x, w, target=target).tile_ir.kernels) > 1
    for g, want_k in zip(got, want):
        assert_close(g, np.asarray(want_k, dtype=g.dtype), scale=20)


def test_a_barrier_missing_from_generated_code_is_caught(target, rng):
    """The harness itself: the last barrier of a row kernel's block reduction removed (thread 0
    publishes the row's sum, the others read it too early), one of the two runs goes wrong."""
    x = (rng.standard_normal((3, 1000)) * 3).astype(np.float32)
    fn = lambda x: op.softmax(x, axis=-1)                         # noqa: E731
    prog = ts.function(fn).lower(x, target=target)
    cut = prog.target_code.rfind("__syncthreads();")
    broken = SimpleNamespace(graph_ir=prog.graph_ir, schedule_ir=prog.schedule_ir,
                             tile_ir=prog.tile_ir, target=target,
                             target_code=prog.target_code[:cut] + prog.target_code[cut + 16:])
    want = ts.interpret(fn, x)
    runs = [run_program(broken, x, reverse=r)[0] for r in (False, True)]
    assert any(not np.allclose(r, want, rtol=1e-4, equal_nan=False) for r in runs)
    np.testing.assert_allclose(emulate(target, fn, x), want, rtol=1e-4)


# ---- tile kernels (@ts.kernel): a block per program, the CPU's bits ---------------------------
def test_tile_kernels_give_the_cpu_bits(rng, target):
    from cases import tile_matmul, tile_softmax
    A = rng.standard_normal((37, 45), dtype=np.float32)
    B = rng.standard_normal((45, 29), dtype=np.float32)
    C = np.zeros((37, 29), np.float32)
    got = run_twice(tile_matmul.lower(A, B, C, target=target), (A, B, C))[0]
    assert got.tobytes() == tile_matmul(A, B, C.copy()).tobytes()
    x = (rng.standard_normal((23, 101)) * 4).astype(np.float32)
    got = run_twice(tile_softmax.lower(x, target=target), (x,))[0]
    assert got.tobytes() == tile_softmax(x).tobytes()


def test_pipelined_range_k_loops_give_the_same_bits(rng, target):
    """range_k(stages=2 or 3): each partition in a ring of shared buffers, loaded stages - 1
    iterations ahead (one barrier per iteration): the CPU's bits, in the reversed run too."""
    from cases import tile_abs_matmul
    A = rng.standard_normal((37, 75), dtype=np.float32)
    B = rng.standard_normal((75, 29), dtype=np.float32)
    C = np.zeros((37, 29), np.float32)
    want = tile_abs_matmul[1](A, B, C.copy())
    assert_within_dot_bound(want, np.abs(A), B)
    for stages in (1, 2, 3):
        prog = tile_abs_matmul[stages].lower(A, B, C, target=target)
        rings = [s for k in prog.tile_ir.kernels for s in k.body
                 if type(s).__name__ == "Shared" and s.name.startswith("ring")]
        assert len(rings) == (2 if stages > 1 else 0)
        kn = prog.tile_ir.kernels[0].knobs
        if stages > 1:                  # stages copies of the BM x BK and BK x BN partitions
            assert sorted(s.size for s in rings) == sorted(
                stages * kn["tile_k"] * n for n in (kn["tile_m"], kn["tile_n"]))
        got = run_twice(prog, (A, B, C))[0]
        assert got.tobytes() == want.tobytes()


def test_integer_atomics_give_numpys_counts_in_any_order(rng, target):
    """tile.atomic_add as atomicAdd (int32, and int64 through unsigned long long): the
    emulator's reversed run adds in another order and must give the same integers."""
    from cases import tile_column_sums, tile_histogram
    for d in (np.int32, np.int64):
        x = rng.integers(-40, 40, 1000).astype(d)
        start = rng.integers(-5, 5, 40).astype(d)
        got = run_twice(tile_histogram.lower(x, start, target=target), (x, start))[0]
        np.testing.assert_array_equal(got, start + np.bincount(x % 40, minlength=40))
    x = rng.integers(-1000, 1000, (301, 13)).astype(np.int64)
    total = np.ones((1, 13), np.int64)
    got = run_twice(tile_column_sums.lower(x, total, target=target), (x, total))[0]
    np.testing.assert_array_equal(got, 1 + x.sum(0, keepdims=True))
    assert "atomicAdd" in tile_column_sums.lower(x, total, target=target).target_code


def test_a_bf16_tile_matmul_takes_the_tensor_cores_on_cuda(rng, target):
    """The seeds' matmul_kernel (bf16 operands, an f32 accumulator) on CUDA calls the
    tensor-core routine with an f32 output (the emulator runs its portable form): the f32
    accumulator rounded to bf16 is op.matmul's bf16 result on CUDA bit for bit (the same mma
    order), within f32 accumulation of the exact product; HIP keeps the SIMT chains."""
    import tessera as ts
    from tessera import Tile, bf16, f32, tile
    from tessera.dtypes import bfloat16

    @ts.kernel
    def matmul_kernel(A: Tile["M", "K", bf16], B: Tile["K", "N", bf16],
                      C: Tile["M", "N", f32]):
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BM, ctx.BK), prefetch=True)
        b = tile.load(B, shape=(ctx.BK, ctx.BN), prefetch=True)
        acc = tile.zeros((ctx.BM, ctx.BN), dtype=f32)
        for k in tile.range_k(0, ctx.K, ctx.BK):
            acc += tile.mma(tile.load_partition(a, k), tile.load_partition(b, k))
        tile.store(C, acc)
    A = rng.standard_normal((70, 96)).astype(bfloat16.np)
    B = rng.standard_normal((96, 40)).astype(bfloat16.np)
    C = np.zeros((70, 40), np.float32)
    if target != "cuda":
        assert "tsg_gemm_mma" not in matmul_kernel.lower(A, B, C, target=target).target_code
        return
    prog = matmul_kernel.lower(A, B, C, target="cuda")
    assert "_f32out" in prog.target_code and "tsg_gemm_mma_bf16" in prog.target_code
    got = run_twice(prog, (A, B, C))[0]
    exact = A.astype(np.float64) @ B.astype(np.float64)
    bound = 96 * 2.0 ** -23 * (np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)))
    assert (np.abs(got - exact) <= bound).all()
    mm = run_twice(ts.function(lambda a, b: a @ b).lower(A, B, target="cuda"), (A, B))[0]
    assert got.astype(bfloat16.np).tobytes() == np.asarray(mm).astype(bfloat16.np).tobytes()


# ---- dynamic shapes ------------------------------------------------------------------------------
def rows_and_columns(x: ts.Tensor["B", 40], g: ts.Tensor[40]):
    return op.softmax(op.layernorm(x) * g), op.sum(x * x, axis=0), x @ op.transpose(x)


def test_a_shape_generic_module_serves_other_sizes(target, rng):
    """A dynamic function lowered for the GPU: one module (the sizes are its kernels' last
    arguments) for every size of a bucket, with the specialised module's bits."""
    dyn = ts.function(rows_and_columns, dynamic=("B",))
    g = rng.standard_normal(40).astype(np.float32)
    sources = set()
    ts.reset_cache_stats()
    for b in (40, 47, 33, 64):
        x = rng.standard_normal((b, 40)).astype(np.float32)
        prog = dyn.lower(x, g, target=target)
        assert prog.dynamic_sizes == {"B": b}
        sources.add(prog.target_code)
        got = run_twice(prog, [x, g])
        want = run_program(ts.function(rows_and_columns).lower(x, g, target=target), x, g)
        for a, w, c in zip(got, want, cpu(rows_and_columns, x, g)):
            assert a.tobytes() == w.tobytes(), f"B={b}: not the specialised module's bits"
            assert_close(a, c, scale=4)
    assert len(sources) == 1 and "ts_size_B" in sources.pop()
    assert ts.cache_stats()["dynamic_reuses"] == 3


def scan_rows(xs: ts.Tensor["S", "B", 8], h0: ts.Tensor["B", 8]):
    return ts.scan(lambda h, x: (op.tanh(x + h), h * 2.0), h0, xs)


def test_a_shape_generic_module_under_control_flow(target, rng):
    """A scan whose length is dynamic: the host runs the steps of each size's program, the
    kernels of the one generic module."""
    dyn = ts.function(scan_rows, dynamic=True)
    sources = set()
    for s, b in ((5, 3), (7, 3), (6, 4)):
        xs = rng.standard_normal((s, b, 8)).astype(np.float32)
        h0 = rng.standard_normal((b, 8)).astype(np.float32)
        prog = dyn.lower(xs, h0, target=target)
        sources.add(prog.target_code)
        got = run_twice(prog, [xs, h0])
        want = run_program(ts.function(scan_rows).lower(xs, h0, target=target), xs, h0)
        for a, w in zip(got, want):
            assert a.tobytes() == w.tobytes()
    assert len(sources) == 1


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.uint64])
def test_integer_arithmetic_wraps_on_gpus(target, dtype, rng):
    """Integer kernels for CUDA and HIP (the unsigned arithmetic that wraps, the new types'
    typedefs and limits), run in the emulator: NumPy's bits, fused and reduced."""
    info = np.iinfo(dtype)
    a, b = (rng.integers(info.min, info.max, (37, 29), dtype=dtype, endpoint=True)
            for _ in range(2))

    def fn(a, b):
        s = a * b + a - (b >> 1)
        return op.where(s > b, -s, s ^ a), op.max(s, axis=1), op.sum(a, axis=0), \
            op.cast(s, "float32") if dtype != np.uint64 else op.cast(s % 1000, "float32")
    with np.errstate(all="ignore"):
        s = a * b + a - (b >> 1)
        want = (np.where(s > b, -s, s ^ a), s.max(axis=1), a.sum(axis=0),
                s.astype(np.float32) if dtype != np.uint64 else (s % 1000).astype(np.float32))
    for g, w in zip(emulate(target, fn, a, b), want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


# ---- the seeds' standard library -----------------------------------------------------------------
def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _attention_case(layer):
    """(fn, arrays) of an attention layer on q [2, 4, 6, 8] and keys and values of 9."""
    def make(rng):
        return (lambda q, k, v: layer()({}, q, k, v),
                [_f32(rng, 2, 4, 6, 8), _f32(rng, 2, 4, 9, 8), _f32(rng, 2, 4, 9, 8)])
    return make


def _layer_case(layer, *shape):
    """(fn, arrays) of a layer with parameters (its own init) on x of this shape."""
    def make(rng):
        m = layer()
        p = m.init(int(rng.integers(1 << 30)))
        return (lambda x: m(p, x), [_f32(rng, *shape)])
    return make


def _flash_decoding(rng):
    seen = np.where(np.arange(9) < int(rng.integers(1, 9)), 0.0, -np.inf).astype(np.float32)
    return (lambda q, k, v, m: nn.FlashDecoding(block=4)({}, q, k, v, mask=m),
            [_f32(rng, 2, 4, 2, 8), _f32(rng, 2, 4, 9, 8), _f32(rng, 2, 4, 9, 8),
             np.stack([seen, seen[::-1]])])


def _gqa(rng):
    return (lambda q, k, v: nn.grouped_query_attention(q, k, v, causal=True),
            [_f32(rng, 2, 4, 6, 8), _f32(rng, 2, 2, 9, 8), _f32(rng, 2, 2, 9, 8)])


_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
STDLIB = {   # name -> rng -> (fn, arrays)
    "FlashAttention2": _attention_case(lambda: nn.FlashAttention2(causal=True, scale=0.3)),
    "SlidingWindowAttention": _attention_case(lambda: nn.SlidingWindowAttention(3)),
    "ALiBi": lambda rng: (lambda q, k, v: nn.ALiBi()({}, q, k, v),
                          [_f32(rng, 2, 4, 6, 8), _f32(rng, 2, 4, 6, 8), _f32(rng, 2, 4, 6, 8)]),
    "FlashDecoding": _flash_decoding,
    "grouped_query_attention": _gqa,
    "RoPE (llama3)": lambda rng: (lambda x: nn.RoPE(500.0, _LLAMA3)(None, x),
                                  [_f32(rng, 2, 9, 8)]),
    "FusedLinearGeLU": _layer_case(lambda: nn.FusedLinearGeLU(8, 6), 2, 5, 8),
    "FusedLinearSiLU": _layer_case(lambda: nn.FusedLinearSiLU(8, 6), 2, 5, 8),
    "SwiGLU": _layer_case(lambda: nn.SwiGLU(8, 12), 2, 5, 8),
    "GroupNorm": _layer_case(lambda: nn.GroupNorm(2, 4), 2, 4, 5, 5),
    "SwitchTransformer": _layer_case(lambda: nn.SwitchTransformer(
        dim=8, num_heads=2, hidden=16, num_experts=4, capacity_factor=4.0), 2, 5, 8),
}


@pytest.mark.parametrize("name", list(STDLIB))
def test_the_seeds_standard_library_gives_the_cpus_results(target, name, rng):
    """Each layer of the seeds' standard library lowered for the GPU (its attention as the
    fused attention kernel, its epilogues fused into the GEMM, the switch layer's routing
    through sort, gather and scan) gives the CPU's results, in the reversed run too."""
    fn, arrays = STDLIB[name](rng)
    assert_close(emulate(target, fn, *arrays), ts.function(fn)(*arrays), scale=20)
