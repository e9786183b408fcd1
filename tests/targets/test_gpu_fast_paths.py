"""The GPU kernels' fast paths, in the CPU emulator of the GPU thread model against NumPy:

- pointwise vector path (strategies/pointwise.py): where a row is a multiple of the lanes, a
  thread reads each contiguous input and writes each output `lanes` elements at a time (16
  bytes), when every such buffer is aligned; a caller's view at an odd element offset takes the
  scalar loop (the emulator traps misaligned accesses, as a GPU faults on them);
- resident rows (strategies/row.py): a row of up to ROW_RESIDENT elements per thread is read
  into registers once, and every pass (max, sum, the output) works from there.
Each must give the bits of the path it replaces."""
import os
import re
import shutil

import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera import op
from tessera.compiler.strategies import pointwise as pointwise_strategy
from tessera.compiler.strategies import row as row_strategy
from tessera.compiler.tile_ir import If, Load, Loop, VecLoad, VecStore, walk_exprs

from conftest import assert_close, nvrtc_or_skip
from gpu_emulator import KernelFault, compile_source, device_empty, launch, run_program

if shutil.which(os.environ.get("CXX") or "g++") is None:
    pytest.skip("the CUDA emulator needs a C++20 compiler (g++)", allow_module_level=True)

BF16 = dt.bfloat16.np


@pytest.fixture(params=["cuda", "hip"])
def target(request):
    return request.param


@pytest.fixture(autouse=True)
def full_resident_rows(monkeypatch):
    """These tests size their rows as 256 threads of ROW_RESIDENT elements each: a row's block
    takes 256 threads up to that width (long rows' blocks get more threads, fewer elements each,
    on the device a faster choice that would hide the cases here)."""
    monkeypatch.setattr(row_strategy, "GPU_ROW_PER_THREAD", row_strategy.ROW_RESIDENT)


def statements(stmts):
    for s in stmts:
        yield s
        yield from statements(getattr(s, "body", []))
        yield from statements(getattr(s, "orelse", []))


def run_shifted(prog, arrays, shift: int):
    """The program run with every buffer starting `shift` elements into its allocation (a view
    at an element offset, as a caller's slice may be): the scalar fallback when not aligned."""
    module = compile_source(prog.target_code, prog.graph_ir.name, prog.target)
    table, keep = {}, []
    for b in prog.tile_ir.buffers:
        d = b.type.dtype.np
        raw = device_empty((b.type.numel() + shift,), d,
                           fill=np.nan if d.kind == "f" else (True if d.kind == "b" else -7))
        keep.append(raw)
        view = raw[shift:].reshape(tuple(b.type.shape))
        if b.role == "input":
            view[...] = arrays[b.param]
        elif b.role == "const":
            view[...] = np.asarray(b.data, dtype=d)
        table[b.name] = view
    status = device_empty((1 + prog.tile_ir.workspace,), np.int32, fill=0)
    kernels = {k.name: k for k in prog.tile_ir.kernels}
    for name, bufs in prog.tile_ir.calls:
        cfg = kernels[name].launch
        launch(module, name, cfg["grid"], cfg["block"], [table[n] for n in bufs] + [status])
        assert status[0] == 0
    return [np.array(table[b.name]) for b in prog.schedule_ir.outputs]


def fn(x, b, c, t):
    """Contiguous x, a row b broadcast over rows, a column c broadcast along rows, and t read
    through a transpose: vector loads for x and b only; two outputs, both vector stores."""
    return op.abs(x) * b + c - op.permute(t, (1, 0)), x > b


def inputs(rng, d, rows=4, cols=48):
    def u(*shape):
        a = rng.uniform(-3, 3, size=shape)
        return (a * 10).astype(d) if np.dtype(d).kind in "iu" else a.astype(d)
    return u(rows, cols), u(cols), u(rows, 1), u(cols, rows)


@pytest.mark.parametrize("d", [np.float32, np.float64, np.float16, BF16, np.int32, np.int64])
def test_vector_path_gives_the_cpu_bits_aligned_or_not(target, d, rng):
    arrays = inputs(rng, d)
    prog = ts.function(fn).lower(*arrays, target=target)
    lanes = min(8, 16 // np.dtype(d).itemsize)
    k = prog.tile_ir.kernels[0]                     # the first output's kernel
    (branch,) = k.body
    assert isinstance(branch, If) and isinstance(branch.orelse[0], Loop)
    loads = [s for s in statements(branch.body) if isinstance(s, VecLoad)]
    (store,) = [s for s in statements(branch.body) if isinstance(s, VecStore)]
    assert sorted(s.buf for s in loads) == ["in0", "in1"] and {s.lanes for s in loads} == {lanes}
    assert len(store.values) == lanes and "ts_vec<" in prog.target_code
    # the launch covers the lane groups: one thread per `lanes` elements
    assert k.launch["grid"] * k.launch["block"] >= arrays[0].size // lanes
    assert all(isinstance(k.body[0], If) for k in prog.tile_ir.kernels)

    want = ts.function(fn)(*arrays)                 # the CPU's C
    ref = ts.interpret(fn, *arrays)
    aligned = run_program(prog, *arrays)
    again = run_program(prog, *arrays, reverse=True, max_blocks=1)
    for shift in (1, 3):                            # views at odd element offsets
        for got in (aligned, again, run_shifted(prog, arrays, shift)):
            for g, w, r in zip(got, want, ref):
                assert g.tobytes() == w.tobytes()
                assert_close(g, np.asarray(r, dtype=g.dtype))


@pytest.mark.parametrize("cols", [47, 4, 1])
def test_rows_that_are_not_a_multiple_of_the_lanes_stay_scalar(target, cols, rng):
    x = rng.standard_normal((3, cols)).astype(np.float32)
    prog = ts.function(lambda x: op.exp(x) + 1).lower(x, target=target)
    has_vector = any(isinstance(s, VecLoad) for k in prog.tile_ir.kernels
                     for s in statements(k.body))
    assert has_vector == (cols % 4 == 0 and cols >= 4)
    (got,) = run_program(prog, x)
    assert got.tobytes() == ts.function(lambda x: op.exp(x) + 1)(x).tobytes()


def test_half_copies_keep_their_bits_through_vector_lanes(target):
    """A 16-bit copy moves bits: NaN payloads and signed zeros included."""
    bits = np.array([0x7e01, 0xfe42, 0x8000, 0x0000, 0x7c00, 0x0001, 0x3c00, 0xfc00] * 4,
                    np.uint16)
    for half in (np.float16, BF16):
        x = bits.view(half).reshape(4, 8)
        copy = ts.function(lambda x: op.reshape(x, (8, 4))).lower(x, target=target)
        assert [k.strategy for k in copy.schedule_ir.kernels] == ["copy"]
        assert "vload" in str(copy.tile_ir)
        (got,) = run_program(copy, x)
        assert got.view(np.uint16).tobytes() == bits.tobytes()


def test_vector_code_compiles_for_every_storage_size(target):
    """One program per storage size (1, 2, 4 and 8 bytes), compiled by NVRTC or hipcc in
    test_gpu_codegen; here: the vector type the source names has the right width."""
    for d, lanes in [(np.bool_, 8), (np.float16, 8), (np.float32, 4), (np.float64, 2)]:
        x = np.ones((2, 16), d)
        prog = ts.function(lambda x: op.reshape(x, (4, 8))).lower(x, target=target)
        ctype = {1: "bool", 2: "uint16_t", 4: "float", 8: "double"}[np.dtype(d).itemsize]
        assert re.search(rf"ts_vec<{ctype}, {lanes}> vl\d+ = \*\(const ts_vec<{ctype}, "
                         rf"{lanes}>\*\)\(in0 \+", prog.target_code)


# ---- resident rows -------------------------------------------------------------------------------
ROWS = {
    "softmax": (lambda x: op.softmax(x, axis=-1), lambda x: np.exp(x - x.max(-1, keepdims=True))
                / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)),
    "layernorm": (lambda x: op.layernorm(x, axis=-1), lambda x: (x - x.mean(-1, keepdims=True))
                  / np.sqrt(x.var(-1, keepdims=True) + 1e-5)),
    "logsumexp": (lambda x: op.logsumexp(x, axis=-1), lambda x: np.log(np.exp(x).sum(-1))),
    "two-outputs": (lambda x: (op.softmax(x * 2, axis=-1), op.sum(x, axis=-1)),
                    lambda x: (np.exp(2 * x) / np.exp(2 * x).sum(-1, keepdims=True), x.sum(-1))),
}


def input_loads(prog):
    """How many loads of the kernels' inputs the Tile IR holds (registers are Locals)."""
    ins = {p.name for k in prog.tile_ir.kernels for p in k.params if p.mode == "in"}
    return sum(isinstance(e, Load) and e.buf in ins
               for k in prog.tile_ir.kernels for e in walk_exprs(k.body))


@pytest.mark.parametrize("name", sorted(ROWS))
@pytest.mark.parametrize("d,width", [(np.float32, 1000), (np.float64, 300), (np.float16, 513)])
def test_resident_rows_read_once_and_give_the_bits_of_the_passes(target, name, d, width, rng,
                                                                 monkeypatch):
    fn, ref = ROWS[name]
    x = rng.standard_normal((3, width)).astype(d)
    prog = ts.function(fn).lower(x, target=target)
    assert "for.unroll" in str(prog.tile_ir) and "local reg" in str(prog.tile_ir)
    assert input_loads(prog) == len(prog.tile_ir.kernels)      # one load of x per kernel
    got = run_program(prog, x)
    again = run_program(prog, x, reverse=True, max_blocks=2)
    monkeypatch.setattr(row_strategy, "ROW_RESIDENT", 0)          # every pass reads memory
    passes = ts.function(fn).lower(x, target=target)
    assert "for.unroll" not in str(passes.tile_ir) and input_loads(passes) > input_loads(prog)
    want = run_program(passes, x)
    refs = ref(x.astype(np.float64))
    for g, a, w, r in zip(got, again, want, refs if isinstance(refs, tuple) else (refs,)):
        assert g.tobytes() == a.tobytes() == w.tobytes()
        assert_close(g, r.astype(g.dtype), scale=10 if d == np.float32 else 1)


def test_rows_longer_than_the_registers_hold_take_the_passes(target, rng):
    threads = row_strategy.GPU_ROW_THREADS[1]                      # the most a row's block has
    x = rng.standard_normal((2, threads * row_strategy.ROW_RESIDENT + 1)).astype(np.float32)
    prog = ts.function(lambda x: op.softmax(x, axis=-1)).lower(x, target=target)
    assert prog.tile_ir.kernels[0].launch["block"] == threads
    assert "for.unroll" not in str(prog.tile_ir) and "for.thread" in str(prog.tile_ir)
    (got,) = run_program(prog, x, max_blocks=1)
    e = np.exp(x - x.max(-1, keepdims=True))
    assert_close(got, (e / e.sum(-1, keepdims=True)).astype(np.float32), scale=10)


def test_registers_go_to_the_row_streams_first_within_the_budget(target, rng, monkeypatch):
    """A layernorm with weight and bias over rows of 32 elements per thread: x (read by every
    pass) takes the registers first, the weight what is left; the bias is read from memory in
    the last pass. The bits of the passes all the same."""
    width = 256 * row_strategy.ROW_RESIDENT
    x = rng.standard_normal((2, width)).astype(np.float32)
    w, b = (rng.standard_normal(width).astype(np.float32) for _ in range(2))
    fn = lambda x, w, b: op.layernorm(x, axis=-1) * w + b          # noqa: E731
    prog = ts.function(fn).lower(x, w, b, target=target)
    text = str(prog.tile_ir)
    assert text.count("local reg") == row_strategy.ROW_REGISTERS // row_strategy.ROW_RESIDENT
    (got,) = run_program(prog, x, w, b, max_blocks=1)
    monkeypatch.setattr(row_strategy, "ROW_RESIDENT", 0)
    (want,) = run_program(ts.function(fn).lower(x, w, b, target=target), x, w, b, max_blocks=1)
    assert got.tobytes() == want.tobytes()
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    assert_close(got, (ref * w + b).astype(np.float32), scale=20)


def test_a_row_read_in_one_pass_is_not_kept(target, rng):
    """A plain row sum reads each element once: registers would only add a loop."""
    x = rng.standard_normal((3, 1000)).astype(np.float32)
    prog = ts.function(lambda x: op.sum(x, axis=-1)).lower(x, target=target)
    assert "for.unroll" not in str(prog.tile_ir) and "local reg" not in str(prog.tile_ir)
    (got,) = run_program(prog, x)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(-1), rtol=1e-5,
                               atol=1e-6 * np.abs(x).sum(-1).max())


def same_bits(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


# ---- from the review: a forced misaligned access, mixed outputs, stashes, integers, empties ------
def test_emulator_traps_a_forced_misaligned_vector_access():
    """The alignment check is what keeps the vector path safe: force it off on a view at an
    odd offset and the emulator faults (as a GPU would), so run_shifted tests mean something."""
    x = np.arange(64, dtype=np.float32).reshape(4, 16)
    prog = ts.function(lambda x: x * 2).lower(x, target="cuda")
    cond = "if ((((((unsigned long long)in0) & 15u) == 0) && " \
           "((((unsigned long long)out0) & 15u) == 0))) {"
    assert cond in prog.target_code
    module = compile_source(prog.target_code.replace(cond, "if (1) {"), "forced", "cuda")
    raw_in = device_empty((65,), np.float32, fill=0)
    raw_out = device_empty((65,), np.float32, fill=np.nan)
    raw_in[1:] = x.ravel()
    k = prog.tile_ir.kernels[0]
    with pytest.raises(KernelFault):
        launch(module, k.name, k.launch["grid"], k.launch["block"],
               [raw_in[1:], raw_out[1:], device_empty((1,), np.int32, fill=0)])


def test_three_extra_stores_of_three_dtypes_match_the_scalar_path(target, rng, monkeypatch):
    """One kernel, outputs i32, f64 and f16 (lanes from the widest: 2), against the scalar loop
    (MAX_LANES=1), aligned and shifted."""
    def fn(x, w):
        y = op.cast(x * 3 + w, "float16")
        z = op.cast(op.cast(y, "float32") - x, "float64")
        return z, y, op.cast(z, "int32")
    x = rng.standard_normal((3, 16)).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    prog = ts.function(fn).lower(x, w, target=target)
    (k,) = prog.tile_ir.kernels
    assert len(prog.schedule_ir.kernels[0].stores) == 2 and "vstore" in str(k)
    got = run_program(prog, x, w)
    monkeypatch.setattr(pointwise_strategy, "MAX_LANES", 1)
    scalar = ts.function(fn).lower(x, w, target=target)
    assert "vstore" not in str(scalar.tile_ir)
    same_bits(got, run_program(scalar, x, w))
    for shift in (1, 2, 4):
        same_bits(got, run_shifted(prog, [x, w], shift))
    same_bits(got, run_program(prog, x, w, reverse=True, max_blocks=1))


@pytest.mark.parametrize("d", [np.float32, np.float16, np.float64])
def test_row_with_an_extra_store_and_a_register_stash(target, d, rng, monkeypatch):
    """A row group with an absorbed output (k.stores) and softmax's stash, resident: the stash
    and x in registers; the bits of the passes."""
    def fn(x):
        m = op.max(x, -1, keepdim=True)
        e = op.exp(x - m)
        s = op.sum(e, -1, keepdim=True)
        y = x * 2
        return e / s + y, y
    x = rng.standard_normal((3, 1000)).astype(d)
    prog = ts.function(fn).lower(x, target=target)
    assert [len(k.stores) for k in prog.schedule_ir.kernels] == [1]
    assert str(prog.tile_ir).count("local reg") == 2 and "for.unroll" in str(prog.tile_ir)
    got = run_program(prog, x)
    same_bits(got, run_program(prog, x, reverse=True, max_blocks=1))
    monkeypatch.setattr(row_strategy, "ROW_RESIDENT", 0)
    passes = ts.function(fn).lower(x, target=target)
    assert "for.unroll" not in str(passes.tile_ir)
    same_bits(got, run_program(passes, x))


@pytest.mark.parametrize("width", [300, 4096, 8192])
def test_integer_rows_with_a_stash(target, width, rng, monkeypatch):
    """int64 registers cost two each: at 8192 the stash no longer fits beside x."""
    x = rng.integers(-1000, 1000, (3, width))
    fn = lambda x: (lambda e: e - op.sum(e, -1, keepdim=True))(x * 3)     # noqa: E731
    prog = ts.function(fn).lower(x, target=target)
    assert "for.unroll" in str(prog.tile_ir)
    got = run_program(prog, x)
    np.testing.assert_array_equal(got[0], x * 3 - (x * 3).sum(-1, keepdims=True))
    monkeypatch.setattr(row_strategy, "ROW_RESIDENT", 0)
    same_bits(got, run_program(ts.function(fn).lower(x, target=target), x))


@pytest.mark.parametrize("shape", [(0, 8), (3, 0), (2, 0, 8)])
def test_empty_tensors_take_the_vector_kernel_harmlessly(target, shape):
    x = np.zeros(shape, np.float32)
    y = np.ones(shape[:-1] + (1,), np.float32)
    prog = ts.function(lambda x, y: x + y).lower(x, y, target=target)
    (got,) = run_program(prog, x, y)
    assert got.shape == shape


# ---- what NVRTC makes of them --------------------------------------------------------------------
def test_the_ptx_has_vector_accesses_and_no_local_memory():
    """NVRTC's PTX for sm_90: the pointwise kernel's 16-byte accesses are v4 loads and stores;
    a resident row's register arrays stay registers (fully unrolled: no .local stack), with one
    load per element of the thread's row."""
    from tessera.runtime import gpu_toolchain as tc
    nvrtc_or_skip()
    x = np.zeros((4, 256 * row_strategy.ROW_RESIDENT), np.float32)
    gelu = ts.function(lambda x, b: op.gelu(x + b)).lower(x, x[0], target="cuda")
    ptx = tc.nvrtc_compile(gelu.target_code, arch="sm_90").decode()
    assert len(re.findall(r"ld\.global(?:\.nc)?\.v4\.f32", ptx)) == 2       # x and b
    assert len(re.findall(r"st\.global\.v4\.f32", ptx)) == 1
    softmax = ts.function(lambda x: op.softmax(x, axis=-1)).lower(x, target="cuda")
    ptx = tc.nvrtc_compile(softmax.target_code, arch="sm_90").decode()
    assert ".local" not in ptx
    assert len(re.findall(r"ld\.global(?:\.nc)?\.f32", ptx)) == row_strategy.ROW_RESIDENT


# ---- two-stage whole-tensor reductions -----------------------------------------------------------
@pytest.mark.parametrize("d,name", [(d, name) for d in (np.float32, np.float64, np.float16)
                                    for name in ("sum", "max", "mean")]
                         + [(np.int32, "sum"), (np.int32, "max")])
def test_a_big_reduction_to_one_value_takes_many_blocks(target, d, name, rng):
    """70001 elements: several blocks each reduce a chunk fixed by the size, and the block with
    the last ticket reduces their partials in order: the same bits with 1, 3 or all blocks,
    in either order, within the sum's error bound of NumPy's float64 result."""
    x = rng.standard_normal(70001) * 4
    x = x.astype(d)
    fn = {"sum": lambda x: op.sum(x), "max": lambda x: op.max(x),
          "mean": lambda x: op.mean(x * 2)}[name]
    prog = ts.function(fn).lower(x, target=target)
    (k,) = prog.tile_ir.kernels
    assert k.launch["grid"] > 1 and "block_ticket" in str(prog.tile_ir)
    assert prog.tile_ir.workspace == k.launch["workspace"] > k.launch["grid"]
    got = run_program(prog, x)
    for blocks in (1, 3):
        same_bits(got, run_program(prog, x, reverse=True, max_blocks=blocks))
    x64 = x.astype(np.float64)
    want = {"sum": x64.sum(), "max": x64.max(), "mean": (x64 * 2).mean()}[name]
    if np.dtype(d).kind == "i" or name == "max":
        assert got[0] == np.asarray(want).astype(got[0].dtype)
    else:
        eps = np.finfo(np.float32 if d == np.float16 else d).eps
        scale = 2 / x.size if name == "mean" else 1
        bound = 2 * x.size * eps * np.abs(x64).sum() * scale + \
            np.finfo(got[0].dtype).eps * abs(want)
        assert abs(float(got[0]) - want) <= bound


def test_two_big_reductions_have_their_own_workspace(target, rng):
    """An f32 sum whose counter and partials are an odd number of ints (padded), then an f64
    max: each kernel its own counter and partials, the f64 ones 8-byte aligned."""
    x = rng.standard_normal(4 * 16384 + 5).astype(np.float32)      # 4 blocks of 1024 threads
    y = rng.standard_normal(70001)
    prog = ts.function(lambda x, y: (op.sum(x), op.max(y))).lower(x, y, target=target)
    grids = [k.launch["grid"] for k in prog.tile_ir.kernels]
    assert len(grids) == 2 and (1 + grids[0]) % 2 == 1 and all(g > 1 for g in grids)
    bases = prog.tile_ir.workspace_bases()
    assert all((1 + b + 1) % 2 == 0 for b in bases.values())     # partials at 8-byte addresses
    s, m = run_program(prog, x, y)
    same_bits([s, m], run_program(prog, x, y, reverse=True, max_blocks=2))
    assert m == y.max()
    np.testing.assert_allclose(s, x.astype(np.float64).sum(), rtol=1e-5,
                               atol=1e-6 * np.abs(x).sum())
