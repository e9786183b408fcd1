"""The GPU backends' code, checked without a GPU: every strategy and every registered operator
(f32, f64, f16, bf16, and int/bool where an operator takes them) lowered for CUDA and HIP, the Tile IR
verified, and all of it compiled by NVRTC for sm_80 and sm_90 and by hipcc for gfx90a (one
translation unit per compile). Structure: shuffles and barriers in row kernels, routine calls in
matmuls, sane launches, no floating-point atomics, a Tile IR that prints its mapping."""
import re
from dataclasses import replace

import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera import ops
from tessera.compiler.lower import lower_schedule_gpu
from tessera.compiler.driver import prepare
from tessera.compiler.scheduler import build_schedule
from tessera.compiler.target.gpu import render_cuda, render_hip
from tessera.compiler.tile_ir import (Barrier, BlockReduce, Call, Const, Loop, Shared, Store,
                                      TileKernel, TileProgram, Var)
from tessera.errors import (BackendUnavailableError, CompileError, IRVerificationError)
from tessera.runtime import gpu_toolchain as tc
from tessera.runtime import targets

from conftest import hipcc_or_skip, nvrtc_or_skip
from cases import graph, lower, registry_cases, strategy_cases

RENDER = {"cuda": render_cuda, "hip": render_hip}
WARP = {"cuda": 32, "hip": 64}     # the hardware's: NVIDIA's warps, CDNA's wavefronts


@pytest.fixture(scope="module")
def programs():
    """target -> {case: TileProgram}, for fresh random example data."""
    rng = np.random.default_rng()
    cases = {**registry_cases(rng), **strategy_cases(rng)}
    return {t: {n: lower(fn, args, t) for n, (fn, args) in cases.items()} for t in RENDER}


def one_unit(progs: dict, target: str) -> str:
    """Every program's kernels in one translation unit (kernel names made unique)."""
    kernels = [replace(k, name=f"p{i}_{k.name}")
               for i, p in enumerate(progs.values()) for k in p.kernels]
    return RENDER[target](TileProgram("batch", kernels, [], []))


def _which_fails(progs, target, compile_):
    """After a failed batch: the first case that fails on its own, with its error."""
    for name, p in progs.items():
        try:
            compile_(RENDER[target](p))
        except CompileError as e:
            return f"case {name}:\n{e}"
    return "only the batch fails"


# ---- compile checks ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_cuda_kernel_compiles_with_nvrtc(programs, arch):
    nvrtc_or_skip()
    progs = programs["cuda"]
    try:
        ptx = tc.nvrtc_compile(one_unit(progs, "cuda"), arch=arch, name="batch.cu")
    except CompileError:
        pytest.fail(_which_fails(progs, "cuda", lambda s: tc.nvrtc_compile(s, arch=arch)))
    n = sum(len(p.kernels) for p in progs.values())
    assert ptx.count(b".entry ") == n and f".target {arch}".encode() in ptx


def test_every_hip_kernel_compiles_with_hipcc(programs):
    hipcc_or_skip()
    progs = programs["hip"]
    try:
        code = tc.hip_compile_check(one_unit(progs, "hip"), arch="gfx90a")
    except CompileError:
        pytest.fail(_which_fails(progs, "hip", tc.hip_compile_check))
    assert code[:4] == b"\x7fELF" or b"__CLANG_OFFLOAD_BUNDLE__" in code[:64]


def test_cases_cover_every_operator_and_strategy(programs):
    """A new registry entry is compile-checked on GPUs without touching this file; every
    strategy appears."""
    names = programs["cuda"].keys()
    # (host calls never become kernels: a program with one runs on the CPU, in parts)
    assert {n.split("-")[0] for n in names} >= set(ops.REGISTRY) - set(ops.host.HOST_OPS)
    strategies = {k.strategy for p in programs["cuda"].values() for k in p.kernels}
    want = {"pointwise", "copy", "row", "reduce", "argreduce", "concat", "gather", "contract"}
    assert strategies >= want | {"attention"}
    kinds = {n.rsplit("-", 1)[1] for n in names}
    assert kinds >= {"f32", "f64", "f16", "bf16", "i32", "i64", "bool"}


@pytest.mark.parametrize("name", ["matmul-epilogue-float32", "attention-float64"])
def test_routine_kernels_call_their_routine_then_a_barrier(programs, name):
    if name not in programs["cuda"]:
        pytest.skip(f"the routine {name.split('-')[0]} needs is not in the tree yet")
    p = programs["cuda"][name]
    (k,) = p.kernels
    (fn,) = {s.fn for s in walk(k.body) if isinstance(s, Call)}
    src = render_cuda(p)
    head, kernel = src.split('extern "C"')
    assert re.search(rf"\b{fn}\(", head)                      # defined before the kernel
    assert re.search(rf"\n\s+{fn}\(\(in0 \+[^;]*\);\n\s+__syncthreads\(\);", kernel)
    assert k.launch["block"] == k.knobs["threads"]
    assert "barrier" in str(p) and f"call {fn}(" in str(p)


def walk(stmts):
    for s in stmts:
        yield s
        yield from walk(getattr(s, "body", []))
        yield from walk(getattr(s, "orelse", []))


# ---- structure -----------------------------------------------------------------------------------
def test_row_kernel_reduces_with_shuffles_and_barriers(programs):
    for target, shfl in (("cuda", "__shfl_down_sync(0xffffffffu, "), ("hip", "__shfl_down(")):
        p = programs[target]["softmax(7, 33)-float32"]
        (k,) = p.kernels
        src = RENDER[target](p)
        assert shfl in src and "__syncthreads();" in src and "__shared__ float" in src
        offsets = re.findall(r"__shfl_down\w*\((?:0xffffffffu, )?\w+, (\d+)", src)
        assert max(map(int, offsets)) == WARP[target] // 2     # the warp size of the target
        assert targets.of(target).warp == WARP[target]
        assert k.launch == {"grid": 7, "block": 64, "shared": 0}
        text = str(p)
        assert "launch{grid=7, block=64" in text and "for.block" in text and \
            "for.thread" in text and "shared red" in text and "block_reduce.max" in text


def test_launch_configurations_are_sane(programs):
    for target, progs in programs.items():
        for name, p in progs.items():
            for k in p.kernels:
                L = k.launch
                assert L["block"] % WARP[target] == 0 and L["block"] <= 1024, (name, L)
                assert 1 <= L["grid"] <= 65535 * 8 and L["shared"] == 0, (name, L)
                assert f"__launch_bounds__({L['block']})" in RENDER[target](p)
    rows = programs["cuda"]["softmax(2, 3, 1000)-float64"].kernels[0]
    assert rows.launch == {"grid": 6, "block": 256, "shared": 0}
    wide = programs["cuda"]["softmax(2, 70001)-float32"].kernels[0]
    assert wide.launch["block"] == 1024 and wide.launch["grid"] == 2


def test_a_row_uses_the_same_threads_whatever_the_batch(rng):
    """A row's association depends on its length only: 1 row or 5 rows, same block."""
    one = lower(lambda x: ts.op.sum(x, axis=-1), [rng.standard_normal((1, 300))], "cuda")
    five = lower(lambda x: ts.op.sum(x, axis=-1), [rng.standard_normal((5, 300))], "cuda")
    assert one.kernels[0].launch["block"] == five.kernels[0].launch["block"] == 256


def test_no_floating_point_atomics_and_a_plain_status_store(programs):
    for target, progs in programs.items():
        src = one_unit(progs, target)
        assert not re.search(r"atomic\w*\s*\(\s*(\(\s*(float|double)\s*\*|&?\s*(out|t)\d)", src)
        # the atomics: a big whole-tensor reduction's ticket, an int of the workspace, and a
        # tile kernel's integer atomic_add (into an int or unsigned long long)
        tickets = re.findall(r"atomic\w*\(([^,]*),", src)
        assert tickets and all(re.fullmatch(r"ts_status \+ \d+", t) or
                               re.fullmatch(r"\((int|unsigned long long)\*\)\(out\d+ \+ .*\)", t)
                               for t in tickets)
        assert any(t.startswith("(unsigned long long*)") for t in tickets)
    take = render_cuda(programs["cuda"]["take-float32"])
    assert "*ts_status = 1;" in take and "int* ts_status)" in take


def test_kernel_signature_is_the_runtime_contract(programs):
    p = programs["cuda"]["broadcast-view-float32"]
    (k,) = p.kernels
    src = render_cuda(p)
    sig = (f'extern "C" __global__ void __launch_bounds__({k.launch["block"]}) {k.name}('
           "const float* __restrict__ in0, const float* __restrict__ in1, "
           "float* __restrict__ out0, int* ts_status)")
    assert sig in src
    assert "#include" not in src and "for (long long g" in src
    hip = render_hip(programs["hip"]["broadcast-view-float32"])
    assert hip.count("#include") == 1 and "#include <hip/hip_runtime.h>" in hip


def test_cpu_tile_ir_is_unchanged_by_the_gpu_statements(rng):
    from tessera.compiler.lower import lower_schedule
    _, prim = prepare(graph(lambda x: ts.op.softmax(x, axis=-1), [rng.standard_normal((4, 9))]))
    cpu = lower_schedule(build_schedule(prim, "cpu")).verify()
    assert all(k.launch is None for k in cpu.kernels) and "launch{" not in str(cpu)
    assert "threads" not in build_schedule(prim, "cpu").kernels[0].knobs


# ---- the verifier --------------------------------------------------------------------------------
def _kernel(body, launch={"grid": 1, "block": 64, "shared": 0}):
    from tessera.compiler.tile_ir import Param
    return TileKernel("k", "row", [Param("out0", dt.float32, (4,), "out")], body, {}, "",
                      launch=launch)


def test_verify_rejects_misplaced_gpu_statements():
    ok = [Shared("red", dt.float32, 3), Loop("r", 4, "block", [
        BlockReduce("s", dt.float32, Const(1.0, dt.float32), "sum", dt.float32, "red"),
        Loop("j", 1, "thread", [Store("out0", Var("r"), Var("s"))]), Barrier()])]
    _kernel(ok).verify()
    bad = {
        "barrier inside a thread loop": [Loop("j", 4, "thread", [Barrier()])],
        "block reduce inside a grid loop": [Shared("red", dt.float32, 3), Loop("g", 4, "grid", [
            BlockReduce("s", dt.float32, Const(1.0, dt.float32), "sum", dt.float32, "red")])],
        "shared not at kernel level": [Loop("r", 4, "block", [Shared("red", dt.float32, 3)])],
        "scratch too small": [Shared("red", dt.float32, 2), BlockReduce(
            "s", dt.float32, Const(1.0, dt.float32), "sum", dt.float32, "red")],
        "a CPU loop kind": [Loop("i", 4, "parallel", [])],
    }
    for why, body in bad.items():
        with pytest.raises(IRVerificationError):
            _kernel(body).verify()
            pytest.fail(why)
    with pytest.raises(IRVerificationError):                  # a block of 48 threads
        _kernel(ok, {"grid": 1, "block": 48, "shared": 0}).verify()
    with pytest.raises(IRVerificationError):                  # a barrier in a CPU kernel
        _kernel([Barrier()], None).verify()


# ---- the toolchain's errors ----------------------------------------------------------------------
def test_compilers_report_bad_code_with_log_and_source():
    bad = 'extern "C" __global__ void k(int* ts_status) { undefined_thing(); }'
    nvrtc_or_skip()
    with pytest.raises(CompileError, match="undefined_thing") as e:
        tc.nvrtc_compile(bad)
    assert "sm_80" in str(e.value) and "    1 extern" in str(e.value)
    hipcc_or_skip()
    with pytest.raises(CompileError, match="undefined_thing"):
        tc.hip_compile_check("#include <hip/hip_runtime.h>\n" + bad)


def test_missing_compilers_raise_backend_unavailable(monkeypatch):
    monkeypatch.setattr(tc, "_nvrtc_candidates", lambda: ["/nonexistent/libnvrtc.so.99"])
    tc.nvrtc_library.cache_clear()
    try:
        with pytest.raises(BackendUnavailableError, match="NVRTC"):
            tc.nvrtc_compile("")
    finally:
        monkeypatch.undo()
        tc.nvrtc_library.cache_clear()
    monkeypatch.setenv("HIPCC", "no-such-hipcc-here")
    with pytest.raises(BackendUnavailableError, match="hipcc"):
        tc.hip_compile_check("")


def test_lowering_for_an_unknown_target_is_a_clear_error(rng):
    _, prim = prepare(graph(lambda x: x + 1, [rng.standard_normal(3)]))
    with pytest.raises(BackendUnavailableError, match="'metal' does not exist"):
        lower_schedule_gpu(build_schedule(prim, "cpu"), "metal")
    with pytest.raises(BackendUnavailableError, match="not a GPU target"):
        lower_schedule_gpu(build_schedule(prim, "cpu"), "cpu")


def test_hip_row_blocks_are_whole_wavefronts():
    """A block reduction shuffles whole warps: 96 threads is three CUDA warps, but one and a half
    wavefronts of 64 on gfx90a, whose missing lanes a shuffle would read."""
    x = np.zeros((4, 100), np.float32)
    for target, ok in (("cuda", True), ("hip", False)):
        sched = ts.function(lambda x: ts.op.softmax(x)).lower(x, target=target).schedule_ir
        sched.kernels[0].knobs["threads"] = 96
        if ok:
            lower_schedule_gpu(sched, target).verify()
        else:
            with pytest.raises(ts.ArgumentError, match="warps of 64"):
                lower_schedule_gpu(sched, target)


def dynamic_cases(x: ts.Tensor["B", "S", 32], w: ts.Tensor[32, 32]):
    h = ts.op.layernorm(x @ w)
    return (ts.op.softmax(h), ts.op.sum(h, axis=1), ts.op.attention(h, h, h),
            ts.op.sort(h, axis=1), ts.op.mean(h))


@pytest.mark.parametrize("target", ["cuda", "hip"])
def test_shape_generic_modules_compile(target):
    """A dynamic function's module (compiler/dynamic.py): sizes as expressions of ts_size_B and
    ts_size_S, which every kernel takes after ts_status; compiled by NVRTC or hipcc."""
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 20, 32)).astype(np.float32)
    w = rng.standard_normal((32, 32)).astype(np.float32)
    prog = ts.function(dynamic_cases, dynamic=True).lower(x, w, target=target)
    source = prog.target_code
    assert prog.dynamic_sizes == {"B": 3, "S": 20}
    n = len(prog.tile_ir.kernels)
    assert source.count("int* ts_status, const int64_t ts_size_B, const int64_t ts_size_S)") == n
    if target == "cuda":
        nvrtc_or_skip()
        for arch in ("sm_80", "sm_90"):
            assert tc.nvrtc_compile(source, arch=arch, name="dynamic.cu").count(b".entry ") == n
    else:
        hipcc_or_skip()
        code = tc.hip_compile_check(source, arch="gfx90a")
        assert code[:4] == b"\x7fELF" or b"__CLANG_OFFLOAD_BUNDLE__" in code[:64]
