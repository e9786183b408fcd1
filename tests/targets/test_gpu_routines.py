"""The hand-written GPU routines (tessera/compiler/target/gpu_gemm.py, gpu_attention.py).

Compiled: every dtype and several knob sets, all in one translation unit per language (the
routines share their helper chunks), by NVRTC for sm_80 and sm_90 (ptxas runs, so shared memory
over 48 KiB fails too) and by hipcc for gfx90a.
Run: in the CPU emulator of the CUDA thread model (tests/gpu_emulator) on fresh random inputs,
against float64 NumPy references; f32/f64 bitwise against the CPU routines (the same fma
chains); the tensor-core GEMM through TSG_PORTABLE_MMA (its cp.async, ldmatrix and mma.sync done
by warp shuffles: the routine's own indexing is what runs); each launch repeated with threads
and blocks in reverse order, bitwise equal.
On a GPU (marked gpu): the same kernels through CuPy, the real tensor cores included.
"""
import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

import tessera as ts
from tessera.compiler.strategies.routines import c_attention
from tessera.compiler.strategies.routines import gpu_attention as GA
from tessera.compiler.strategies.routines import gpu_gemm as GG
from tessera.errors import ArgumentError, UnsupportedDTypeError
from tessera.compiler.spelling import libm
from tessera.runtime import gpu_toolchain as tc
from tessera.runtime import isa
from tessera.runtime.toolchain import find_compiler, flags

from conftest import assert_within_dot_bound, attention_reference, hipcc_or_skip, nvrtc_or_skip

CUDA_PRELUDE = """\
typedef int int32_t;
typedef long long int64_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#define TS_INLINE static __device__ __forceinline__
"""
HIP_PRELUDE = "#include <hip/hip_runtime.h>\n#define TS_INLINE static __device__ __forceinline__\n"
STORE = {"f32": "float", "f64": "double", "f16": "unsigned short", "bf16": "unsigned short"}
ARITH = {"f32": "float", "f64": "double", "f16": "float", "bf16": "float"}
EXP = {"f32": libm.F32["exp"], "f64": libm.F64["exp"], "f16": libm.F32["exp"],
       "bf16": libm.F32["exp"]}


def unit(lang, pieces, defines=""):
    """One translation unit: prelude, then each chunk once (as the renderer deduplicates)."""
    out, seen = [CUDA_PRELUDE if lang == "cuda" else HIP_PRELUDE, defines], set()
    for p in pieces:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return "\n".join(out)


def gemm_kernel(kname, routine, dtype, tile_m, tile_n, threads, out=None):
    """Block t of the grid-stride loop computes C's tile t: back-to-back calls per block when
    the grid is smaller than the tile count. C is `out`'s (default: the inputs' dtype)."""
    T, TC = STORE[dtype], STORE[out or dtype]
    return f"""
extern "C" __global__ void __launch_bounds__({threads}) {kname}(
    const {T}* A, long long a_rs, long long a_cs, const {T}* B, long long b_rs, long long b_cs,
    {TC}* C, long long ldc, long long M, long long N, long long K) {{
  const long long tn = (N + {tile_n} - 1) / {tile_n}, tiles = (M + {tile_m} - 1) / {tile_m} * tn;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {{
    const long long i0 = t / tn * {tile_m}, j0 = t % tn * {tile_n};
    {routine}(A + i0 * a_rs, a_rs, a_cs, B + j0 * b_cs, b_rs, b_cs, C + i0 * ldc + j0, ldc, K,
              M - i0 < {tile_m} ? M - i0 : {tile_m}, N - j0 < {tile_n} ? N - j0 : {tile_n});
  }}
}}
"""


def attention_kernel(kname, routine, dtype, threads):
    """(batch*head, query block) pairs over a grid-stride loop; p holds the sizes and strides
    (every argument is pointer-sized for the emulator: the scale comes by pointer)."""
    T, R = STORE[dtype], ARITH[dtype]
    return f"""
extern "C" __global__ void __launch_bounds__({threads}) {kname}(
    const {T}* Q, const {T}* K, const {T}* V, const {T}* M, {T}* O, const {R}* scale,
    const long long* p) {{
  /* p: BH, Sq, Sk, D, Dv, causal, offset, rows per call, then (head, row) strides of Q, K, V,
     O and (head, row, key) of M */
  const long long nqb = (p[1] + p[7] - 1) / p[7];
  for (long long t = blockIdx.x; t < p[0] * nqb; t += gridDim.x) {{
    const long long bh = t / nqb, q0 = t % nqb * p[7];
    const long long nq = p[1] - q0 < p[7] ? p[1] - q0 : p[7];
    {routine}(Q + bh * p[8], p[9], K + bh * p[10], p[11], V + bh * p[12], p[13],
              M ? M + bh * p[16] : M, p[17], p[18], O + bh * p[14], p[15], q0, nq, p[2], p[3],
              p[4], *scale, (int)p[5], p[6]);
  }}
}}
"""


# ---- the knob sets every compile check covers -------------------------------------------------
GEMM_KNOBS = {   # (tile_m, tile_n, tile_k, threads); CUDA f16/bf16 are the tensor-core routine
    "f32": [(128, 128, 8, 256), (64, 64, 16, 128), (16, 32, 8, 64), (32, 64, 4, 256)],
    "f64": [(64, 64, 8, 256), (32, 32, 8, 64), (16, 16, 16, 64)],
    "f16": [(128, 128, 32, 128), (64, 64, 64, 128), (16, 16, 32, 128)],
    "bf16": [(128, 128, 32, 128), (128, 256, 32, 256), (32, 64, 16, 64)],
}
HIP_16BIT_KNOBS = [(128, 128, 8, 256), (64, 64, 16, 128)]     # the SIMT routine
ATTENTION_KNOBS = {"f32": [(64, 256), (64, 128), (16, 128)], "f64": [(64, 256), (32, 128)],
                   "f16": [(64, 128), (32, 128)], "bf16": [(64, 128), (128, 256), (16, 64)]}
HIP_16BIT_ATTENTION_KNOBS = [(64, 256), (32, 128)]


def all_routines(lang):
    """(kernel source, routine chunks) for every knob set of both routines."""
    pieces, kernels = [], []
    for dtype, knob_sets in GEMM_KNOBS.items():
        if lang == "hip" and dtype in ("f16", "bf16"):
            knob_sets = HIP_16BIT_KNOBS
        for knobs in knob_sets:
            name, chunks = GG.gemm_routine(lang, dtype, *knobs)
            pieces += chunks
            kernels.append(gemm_kernel(f"k_{name}", name, dtype, knobs[0], knobs[1], knobs[3]))
    for dtype, knob_sets in ATTENTION_KNOBS.items():
        if lang == "hip" and dtype in ("f16", "bf16"):
            knob_sets = HIP_16BIT_ATTENTION_KNOBS
        for bq, threads in knob_sets:
            name, chunks = GA.attention_routine(lang, dtype, bq, threads)
            pieces += [*EXP[dtype], *chunks]
            kernels.append(attention_kernel(f"k_{name}", name, dtype, threads))
    return unit(lang, pieces) + "\n".join(kernels)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_routine_compiles_with_nvrtc(arch):
    nvrtc_or_skip()
    ptx = tc.nvrtc_compile(all_routines("cuda"), arch).decode()
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx and "cp.async.cg" in ptx
    assert "cvt.rn.bf16x2.f32" in ptx and "cvt.rn.f16x2.f32" in ptx     # attention's P


def test_every_routine_compiles_with_hipcc():
    hipcc_or_skip()
    assert len(tc.hip_compile_check(all_routines("hip"), "gfx90a")) > 0


# ---- knobs and names ---------------------------------------------------------------------------
def test_names_encode_dtype_and_knobs_and_helpers_are_shared():
    names = {GG.gemm_routine("cuda", d, *k)[0] for d, ks in GEMM_KNOBS.items() for k in ks}
    assert len(names) == sum(len(ks) for ks in GEMM_KNOBS.values())
    a = GA.attention_routine("hip", "f32", 64, 256)
    b = GA.attention_routine("hip", "f32", 32, 256)
    assert a[0] != b[0] and a[1][:-1] == b[1][:-1]
    assert GG.gemm_routine("hip", "f32", 64, 64, 8, 256)[1][0] is a[1][0]   # one helper chunk
    for lang in ("cuda", "hip"):
        for dtype in GG.DTYPES:
            knobs = GG.DEFAULT_KNOBS[lang][dtype]
            assert GG.gemm_routine(lang, dtype, *knobs)[0].startswith("tsg_gemm_")
            bq, threads = GA.DEFAULT_KNOBS[lang][dtype]
            assert GA.attention_routine(lang, dtype, bq, threads)[0].startswith("tsa_")


@pytest.mark.parametrize("call,error,words", [
    (lambda: GG.gemm_routine("opencl", "f32", 64, 64, 8, 256), ArgumentError, "opencl"),
    (lambda: GG.gemm_routine("cuda", "i32", 64, 64, 8, 256), UnsupportedDTypeError, "i32"),
    (lambda: GG.gemm_routine("cuda", "f32", 64, 64, 8, 100), ArgumentError, "multiple of 32"),
    (lambda: GG.gemm_routine("cuda", "f32", 128, 128, 8, 64), ArgumentError, "accumulators"),
    (lambda: GG.gemm_routine("hip", "f32", 128, 128, 64, 256), ArgumentError, "shared memory"),
    (lambda: GG.gemm_routine("cuda", "bf16", 128, 128, 8, 128), ArgumentError, "tile_k"),
    (lambda: GG.gemm_routine("cuda", "f16", 256, 256, 32, 64), ArgumentError, "accumulators"),
    (lambda: GA.attention_routine("cuda", "f32", 64, 96), ArgumentError, "multiple of 64"),
    (lambda: GA.attention_routine("cuda", "f64", 256, 64), ArgumentError, "values per thread"),
    (lambda: GA.attention_routine("cuda", "f64", 128, 256), ArgumentError, "shared memory"),
    (lambda: GA.attention_routine("hip", "u8", 64, 256), UnsupportedDTypeError, "u8"),
])
def test_bad_knobs_are_clear_errors(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_plans_fit_the_static_shared_memory():
    for dtype in GG.DTYPES:
        for lang in ("cuda", "hip"):
            tm, tn, tk, threads = GG.DEFAULT_KNOBS[lang][dtype]
            plan = (GG.mma_plan if GG.uses_tensor_cores(lang, dtype) else GG.simt_plan)(
                dtype, tm, tn, tk, threads)
            assert plan["smem"] <= GG.SMEM_LIMIT
        for lang in ("cuda", "hip"):
            bq, threads = GA.DEFAULT_KNOBS[lang][dtype]
            plan = (GA.mma_attention_plan(dtype, bq, threads) if GA.uses_tensor_cores(lang, dtype)
                    else GA.attention_plan(dtype, bq, threads))
            assert plan["smem"] <= GG.SMEM_LIMIT
    assert GG.mma_plan("bf16", 128, 128, 32, 128)["stages"] == 3
    small = GG.mma_plan("bf16", 16, 16, 32, 128)          # one warp computes, three load
    assert small["WM"] * small["WN"] == 1


# ---- the emulator ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def emu():
    if shutil.which(os.environ.get("CXX") or "g++") is None:
        pytest.skip("the CUDA emulator needs g++")
    import gpu_emulator
    return gpu_emulator


def to_bf16(x):
    """bf16 bits nearest to float32 x (ties to even), computed independently of the routine's
    bit trick: the two candidates compared in float64."""
    x = np.ascontiguousarray(x, np.float32)
    u = x.view(np.uint32)
    lo = (u >> 16).astype(np.uint32)
    hi = lo + 1

    def value(b):
        v = (b << 16).view(np.float32).astype(np.float64)
        return np.where((b & 0x7fff) == 0x7f80, np.copysign(2.0 ** 128, v), v)  # past the max
    with np.errstate(invalid="ignore"):            # NaN inputs: replaced below
        x64 = x.astype(np.float64)
        d_lo, d_hi = np.abs(x64 - value(lo)), np.abs(value(hi) - x64)
        up = (d_hi < d_lo) | ((d_hi == d_lo) & (lo & 1 == 1))
    return np.where(np.isnan(x), 0x7fc0, np.where(up, hi, lo)).astype(np.uint16)


def from_bits(bits, dtype):
    bits = np.asarray(bits, np.uint16)
    if dtype == "f16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def as_dtype(x, dtype):
    """Device representation (array) and exact float64 values of x in `dtype`."""
    if dtype == "f16":
        bits = x.astype(np.float16).view(np.uint16)
    elif dtype == "bf16":
        bits = to_bf16(x)
    else:
        a = x.astype(np.float32 if dtype == "f32" else np.float64)
        return a, a.astype(np.float64)
    return bits, from_bits(bits, dtype)


def test_f16_bf16_conversions_round_to_nearest_even(emu, rng):
    src = unit("cuda", [GG.COMMON["cuda"]]) + """
extern "C" __global__ void convert(const float* x, unsigned short* h, unsigned short* b,
                                   float* hx, float* bx, long long n) {
  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    h[i] = tsg_f32_to_f16(x[i]);
    b[i] = tsg_f32_to_bf16(x[i]);
    hx[i] = tsg_f16_to_f32(h[i]);
    bx[i] = tsg_bf16_to_f32(b[i]);
  }
}"""
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.996, 65520, -65520,
                        2.0 ** -14, 2.0 ** -24, 2.0 ** -25, -(2.0 ** -25) * 1.0001, 3 * 2.0 ** -25,
                        1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8,
                        3.3895314e38, 3.4028235e38, 1e-45, -1.17549435e-38], np.float32)
    bits = rng.integers(0, 2 ** 32, 40000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = (rng.standard_normal(20000) * np.exp2(rng.integers(-30, 20, 20000))).astype(np.float32)
    x = np.concatenate([special, bits, scaled])
    n = x.size
    mod = emu.compile_source(src, "convert")
    h, b = emu.device_empty(n, np.uint16), emu.device_empty(n, np.uint16)
    hx, bx = emu.device_empty(n, np.float32), emu.device_empty(n, np.float32)
    emu.launch(mod, "convert", 64, 256, [emu.to_device(x), h, b, hx, bx, n])
    nan = np.isnan(x)
    with np.errstate(over="ignore"):
        want_h = x.astype(np.float16)
    assert np.isnan(np.array(h).view(np.float16)[nan]).all()
    assert (np.array(h)[~nan] == want_h.view(np.uint16)[~nan]).all()
    assert (np.array(b)[~nan] == to_bf16(x)[~nan]).all()
    assert np.isnan(from_bits(np.array(b), "bf16")[nan]).all()
    assert (np.array(hx)[~nan] == want_h[~nan].astype(np.float32)).all()       # exact widening
    assert (np.array(bx)[~nan] == from_bits(np.array(b), "bf16")[~nan]).all()


def place(emu, x, layout):
    """x (rows x cols, device representation) in device memory as `layout`: "row" (row-major),
    "col" (its transpose, read in place) or "gap" (neither stride 1: rows 2*cols+1 apart,
    columns 2 apart, NaN between). Returns (array, row stride, column stride)."""
    rows, cols = x.shape
    if x.size == 0:
        return emu.to_device(np.zeros(1, x.dtype)), max(cols, 1), 1
    if layout == "row":
        return emu.to_device(np.ascontiguousarray(x)), cols, 1
    if layout == "col":
        return emu.to_device(np.ascontiguousarray(x.T)), 1, rows
    rs = 2 * cols + 1
    store = np.full(max(1, rows * rs), 0x7fff if x.dtype == np.uint16 else np.nan, x.dtype)
    idx = np.arange(rows)[:, None] * rs + 2 * np.arange(cols)[None, :]
    store[idx.ravel()] = x.ravel()
    return emu.to_device(store), rs, 2


class Gemm:
    """One routine in an emulator module; `run` multiplies device-representation matrices."""

    def __init__(self, emu, lang_routine, dtype, knobs, portable=False, out=None):
        name, chunks = lang_routine
        self.emu, self.dtype, self.knobs, self.out = emu, dtype, knobs, out
        defines = "#define TSG_PORTABLE_MMA 1\n" if portable else ""
        src = unit("cuda", chunks, defines) + gemm_kernel("gemm", name, dtype, knobs[0],
                                                           knobs[1], knobs[3], out)
        self.module = emu.compile_source(src, name)

    def run(self, a, b, la="row", lb="row", grid=None, reverse=False, shift_a=False):
        emu = self.emu
        (M, K), N = a.shape, b.shape[1]
        A, a_rs, a_cs = place(emu, a, la)
        B, b_rs, b_cs = place(emu, b, lb)
        if shift_a:                   # A one element past a 16-byte boundary: no cp.async
            A2 = emu.device_empty(A.size + 1, A.dtype)
            A2[1:] = A.ravel()
            A = A2.ctypes.data + A.itemsize
        c_dtype = np.float32 if self.out == "f32" else a.dtype
        C = emu.device_empty((M, N), c_dtype, fill=0x7fff if c_dtype == np.uint16 else np.nan)
        tm, tn, _, threads = self.knobs
        tiles = -(-M // tm) * -(-N // tn)
        emu.launch(self.module, "gemm", grid or max(1, tiles), threads,
                   [A, a_rs, a_cs, B, b_rs, b_cs, C, N, M, N, K], reverse=reverse)
        return np.array(C)


def cpu_matmul(a, b):
    return ts.function(lambda a, b: a @ b)(a, b)


@pytest.mark.parametrize("dtype,knobs", [("f32", (32, 32, 8, 64)), ("f32", (128, 128, 8, 256)),
                                         ("f64", (64, 64, 8, 256)), ("f64", (16, 16, 16, 64))])
def test_simt_gemm_equals_the_cpu_routine_bit_for_bit(emu, rng, dtype, knobs):
    g = Gemm(emu, GG.gemm_routine("cuda", dtype, *knobs), dtype, knobs)
    npd = np.float32 if dtype == "f32" else np.float64
    tm, tn, tk, _ = knobs
    shapes = [(1, 1, 1), (tm, tn, tk), (2 * tm + 3, tn + 1, 3 * tk + 5), (tm - 1, 2 * tn - 1, 1),
              (7, 5, 0)]
    layouts = [("row", "row"), ("col", "row"), ("row", "col"), ("col", "col"), ("gap", "gap")]
    for (m, n, k), (la, lb) in zip(shapes, layouts):
        a = rng.standard_normal((m, k)).astype(npd)
        b = rng.standard_normal((k, n)).astype(npd)
        got = g.run(a, b, la, lb)
        assert_within_dot_bound(got, a, b)
        assert got.tobytes() == cpu_matmul(a, b).tobytes(), (m, n, k, la, lb)
        again = g.run(a, b, la, lb, grid=2, reverse=True)        # back-to-back calls per block
        assert again.tobytes() == got.tobytes()


def check_16bit(got_bits, a64, b64, dtype):
    """The exact product rounded once to the output dtype, plus the f32 accumulation's error."""
    got, want = from_bits(got_bits, dtype), a64 @ b64
    half_ulp = 2.0 ** (-8 if dtype == "bf16" else -11)
    tol = half_ulp * np.abs(want) + a64.shape[1] * 2.0 ** -23 * (np.abs(a64) @ np.abs(b64))
    assert not np.isnan(got).any(), "unwritten (poisoned) output"
    err = np.abs(got - want)
    assert (err <= tol + 1e-30).all(), f"max err {err.max()}, {(err / (tol + 1e-30)).max()} tol"


@pytest.mark.parametrize("dtype,knobs", [("bf16", (64, 64, 32, 128)), ("f16", (32, 64, 16, 128)),
                                         ("bf16", (128, 128, 32, 128)), ("f16", (16, 16, 32, 128))])
def test_tensor_core_gemm_data_movement(emu, rng, dtype, knobs):
    """The tensor-core routine with its PTX replaced by warp-shuffle equivalents: every shared
    layout (A k- or m-contiguous, B n- or k-contiguous), the scalar path (no unit stride, or
    misaligned), edges in every dimension, several tiles per block."""
    g = Gemm(emu, GG.mma_routine(dtype, *knobs), dtype, knobs, portable=True)
    tm, tn, tk, _ = knobs
    cases = [((tm, tn, tk), "row", "row", False), ((tm + 5, tn + 3, tk + 9), "col", "row", False),
             ((2 * tm - 1, tn + 7, 3 * tk + 1), "row", "col", False),
             ((tm + 1, 2 * tn + 1, 2 * tk), "col", "col", False),
             ((tm + 3, tn - 3, tk + 8), "gap", "gap", False),
             ((2 * tm, tn, 2 * tk + 3), "row", "row", True), ((5, 3, 0), "row", "row", False)]
    for (m, n, k), la, lb, shift in cases:
        a, a64 = as_dtype(rng.standard_normal((m, k)), dtype)
        b, b64 = as_dtype(rng.standard_normal((k, n)), dtype)
        got = g.run(a, b, la, lb, shift_a=shift)
        check_16bit(got, a64, b64, dtype)
        assert g.run(a, b, la, lb, grid=1, reverse=True, shift_a=shift).tobytes() == got.tobytes()


@pytest.mark.parametrize("dtype,knobs", [("bf16", (64, 64, 32, 128)), ("f16", (32, 64, 16, 128))])
def test_tensor_core_gemm_with_an_f32_output(emu, rng, dtype, knobs):
    """out="f32" (a tile kernel's f32 accumulator): the accumulator itself, so rounding it to
    the 16-bit dtype gives the 16-bit routine's output bit for bit; within the f32
    accumulation's bound of the exact product."""
    g16 = Gemm(emu, GG.mma_routine(dtype, *knobs), dtype, knobs, portable=True)
    g32 = Gemm(emu, GG.mma_routine(dtype, *knobs, out="f32"), dtype, knobs, portable=True,
               out="f32")
    tm, tn, tk, _ = knobs
    for (m, n, k), la, lb in [((tm + 5, tn + 3, tk + 9), "row", "row"),
                              ((2 * tm - 1, tn + 7, 3 * tk + 1), "col", "col")]:
        a, a64 = as_dtype(rng.standard_normal((m, k)), dtype)
        b, b64 = as_dtype(rng.standard_normal((k, n)), dtype)
        wide = g32.run(a, b, la, lb)
        assert wide.dtype == np.float32 and not np.isnan(wide).any()
        narrow = g16.run(a, b, la, lb)
        rounded = wide.astype(np.float16).view(np.uint16) if dtype == "f16" else to_bf16(wide)
        np.testing.assert_array_equal(rounded, narrow)
        want = a64 @ b64
        tol = k * 2.0 ** -23 * (np.abs(a64) @ np.abs(b64))
        assert (np.abs(wide - want) <= tol + 1e-30).all()


def test_tensor_core_shared_layout_is_a_conflict_free_permutation(emu):
    """tsg_at<W>(r, c): each row's W elements land in that row, each once, and the 8 rows one
    ldmatrix phase reads (rows 8q .. 8q+7, one 16-byte chunk) hit 8 different bank groups."""
    widths = (16, 32, 64, 128, 256)
    rows = 16
    calls = "\n".join(f"  for (int r = 0; r < {rows}; ++r) for (int c = 0; c < {w}; ++c) "
                      f"*o++ = tsg_at<{w}>(r, c);" for w in widths)
    src = unit("cuda", GG.mma_routine("bf16", 16, 16, 16, 32)[1], "#define TSG_PORTABLE_MMA 1\n")
    mod = emu.compile_source(src + f'extern "C" __global__ void at(int* o) {{\n{calls}\n}}\n',
                             "swizzle")
    out = emu.device_empty(rows * sum(widths), np.int32)
    emu.launch(mod, "at", 1, 1, [out])
    start = 0
    for w in widths:
        at = np.array(out[start:start + rows * w]).reshape(rows, w)
        start += rows * w
        assert (np.sort(at, axis=1) == np.arange(rows * w).reshape(rows, w)).all(), w
        for r0 in range(0, rows, 8):
            for c in range(0, w, 8):
                groups = (2 * at[r0:r0 + 8, c] // 16) % 8
                assert len(set(groups)) == 8, (w, r0, c, groups)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_simt_16bit_gemm_the_hip_path(emu, rng, dtype):
    knobs = (32, 32, 8, 64)
    g = Gemm(emu, GG.simt_routine("cuda", dtype, *knobs), dtype, knobs)
    for (m, n, k), la, lb in [((45, 37, 29), "row", "col"), ((32, 32, 8), "col", "row")]:
        a, a64 = as_dtype(rng.standard_normal((m, k)), dtype)
        b, b64 = as_dtype(rng.standard_normal((k, n)), dtype)
        check_16bit(g.run(a, b, la, lb), a64, b64, dtype)


# ---- attention ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_attention(tmp_path_factory):
    """The CPU routine built with the GPU's key block, driven over [B, H] with OpenMP."""
    parts = ["#include <math.h>\n#include <stdint.h>\n#include <string.h>\n"
             "#define TS_INLINE static inline\n", *libm.F32["exp"], *libm.F64["exp"]]
    for dt in ("f32", "f64"):
        parts += [c_attention.attention_source(dt, block_k=GA.BLOCK_K),
                  c_attention.driver_source(dt)]
    d = tmp_path_factory.mktemp("cpu_attention")
    (d / "a.c").write_text("\n".join(parts))
    cc = find_compiler()
    r = subprocess.run([cc, *flags(cc, isa.host_level()), str(d / "a.c"), "-o", str(d / "a.so"),
                        "-lm"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    lib = ctypes.CDLL(str(d / "a.so"))

    def run(q, k, v, mask, causal, scale):
        B, H, Sq, D = q.shape
        Sk, Dv = k.shape[2], v.shape[3]
        o = np.full((B, H, Sq, Dv), np.nan, q.dtype)
        strides = [np.array([s // x.itemsize for s in x.strides], np.int64)
                   for x in (q, k, v, o, mask if mask is not None else q)]
        if mask is None:
            strides[4][:] = 0
        f = getattr(lib, "tsa_run_f32" if q.dtype == np.float32 else "tsa_run_f64")
        P, I = ctypes.c_void_p, ctypes.c_int64
        real = ctypes.c_float if q.dtype == np.float32 else ctypes.c_double
        f.argtypes = [P] * 10 + [I] * 6 + [real, ctypes.c_int, I, I, ctypes.c_int]
        f(q.ctypes.data, strides[0].ctypes.data, k.ctypes.data, strides[1].ctypes.data,
          v.ctypes.data, strides[2].ctypes.data, None if mask is None else mask.ctypes.data,
          strides[4].ctypes.data, o.ctypes.data, strides[3].ctypes.data, B, H, Sq, Sk, D, Dv,
          scale, int(causal), Sk - Sq, 64, 1)
        return o
    return run


class Attention:
    def __init__(self, emu, dtype, block_q, threads, routine=GA.attention_routine,
                 portable=False):
        self.emu, self.dtype, self.block_q, self.threads = emu, dtype, block_q, threads
        name, chunks = routine("cuda", dtype, block_q, threads)
        defines = "#define TSG_PORTABLE_MMA 1\n" if portable else ""
        src = unit("cuda", [*EXP[dtype], *chunks], defines) + attention_kernel(
            "attention", name, dtype, threads)
        self.module = emu.compile_source(src, name)

    def run(self, q, k, v, mask, causal, scale, rows=None, reverse=False, grid=None):
        """q [BH, Sq, D], k [BH, Sk, D], v [BH, Sk, Dv] in device representation; mask
        [BH or 1, Sq or 1, Sk] (broadcast axes get stride 0); `rows` per routine call."""
        emu = self.emu
        BH, Sq, D = q.shape
        Sk, Dv = k.shape[1], v.shape[2]
        rows = rows or self.block_q
        out = emu.device_empty((BH, Sq, Dv), q.dtype, fill=0x7fff if q.dtype == np.uint16
                               else np.nan)
        ms = [0, 0, 0] if mask is None else \
            [0 if n == 1 else s // mask.itemsize for n, s in zip(mask.shape, mask.strides)]
        p = np.array([BH, Sq, Sk, D, Dv, int(causal), Sk - Sq, rows, Sq * D, D, Sk * D, D,
                      Sk * Dv, Dv, Sq * Dv, Dv, *ms], np.int64)
        dev = [emu.to_device(x if x.size else np.zeros(1, x.dtype)) for x in (q, k, v)]
        mdev = None if mask is None else emu.to_device(np.ascontiguousarray(mask))
        real = np.float64 if self.dtype == "f64" else np.float32
        tasks = BH * -(-Sq // rows)
        emu.launch(self.module, "attention", grid or max(1, tasks), self.threads,
                   [*dev, mdev, out, emu.to_device(np.array([scale], real)), emu.to_device(p)],
                   reverse=reverse)
        return np.array(out)


def attention_cases():
    """(BH, Sq, Sk, D, Dv, mask kind, causal, rows per call)"""
    return [(2, 37, 45, 16, 24, None, False, None), (1, 70, 150, 33, 40, None, True, None),
            (1, 40, 17, 8, 8, None, True, 5),              # Sq > Sk: the first rows see nothing
            (2, 9, 130, 100, 130, "full", False, None),    # Q streamed, O as the accumulator
            (1, 20, 64, 64, 64, "row", True, 7),           # one mask row for every query
            (1, 12, 70, 5, 3, "holes", False, None),       # -inf entries, a fully masked row
            (1, 6, 0, 4, 5, None, False, None)]            # no key at all


def make_mask(rng, kind, BH, Sq, Sk, dtype):
    if kind is None:
        return None
    if kind == "row":
        return rng.standard_normal((1, 1, Sk)).astype(dtype)
    m = rng.standard_normal((BH, Sq, Sk)).astype(dtype)
    if kind == "holes":
        m[rng.random(m.shape) < 0.3] = -np.inf
        m[:, 2, :] = -np.inf
    return m


@pytest.mark.parametrize("dtype,block_q,threads", [("f32", 64, 256), ("f32", 16, 128),
                                                   ("f64", 64, 256), ("f64", 32, 128)])
def test_attention_against_numpy_and_the_cpu_routine(emu, rng, cpu_attention, dtype, block_q,
                                                     threads):
    att = Attention(emu, dtype, block_q, threads)
    npd = np.float32 if dtype == "f32" else np.float64
    for BH, Sq, Sk, D, Dv, kind, causal, rows in attention_cases():
        q, k, v = (rng.standard_normal(s).astype(npd) for s in
                   ((BH, Sq, D), (BH, Sk, D), (BH, Sk, Dv)))
        mask = make_mask(rng, kind, BH, Sq, Sk, npd)
        scale = npd(1 / np.sqrt(D))
        got = att.run(q, k, v, mask, causal, scale, rows=rows)
        assert not np.isnan(got).any(), "unwritten output"
        want = attention_reference(q.astype(np.float64), k.astype(np.float64),
                                   v.astype(np.float64), mask, causal, np.float64(scale))
        tol = (2e-5 if dtype == "f32" else 1e-12) * max(1.0, float(np.abs(v).max(initial=0)))
        assert np.abs(got - want).max(initial=0) <= tol, (BH, Sq, Sk, D, Dv, kind, causal)
        m4 = None if mask is None else np.broadcast_to(mask[None], (1, BH, Sq, Sk))
        cpu = cpu_attention(q[None], k[None], v[None], m4, causal, scale)
        assert got.tobytes() == cpu[0].tobytes(), (BH, Sq, Sk, D, Dv, kind, causal)
        again = att.run(q, k, v, mask, causal, scale, rows=rows, reverse=True, grid=1)
        assert again.tobytes() == got.tobytes()


@pytest.mark.parametrize("dtype,tensor_cores", [("bf16", True), ("f16", True), ("bf16", False),
                                                ("f16", False)])
def test_attention_16bit(emu, rng, dtype, tensor_cores):
    """f16/bf16 storage, f32 softmax and accumulation, one rounding at the end: within half an
    output ulp of the float64 result of the same (rounded) inputs, plus the f32 arithmetic's
    error; the tensor-core routine (PTX emulated) also rounds P to the input dtype for P V."""
    if tensor_cores:
        att = Attention(emu, dtype, 32, 64, lambda lang, *a: GA.mma_attention_routine(*a),
                        portable=True)
    else:
        att = Attention(emu, dtype, 32, 128, GA.simt_attention_routine)
    cases = attention_cases()[:6] + [(1, 20, 80, 200, 140, "full", True, None)]  # D, Dv > 128
    for BH, Sq, Sk, D, Dv, kind, causal, rows in cases:
        (q, q64), (k, k64), (v, v64) = (as_dtype(rng.standard_normal(s), dtype) for s in
                                        ((BH, Sq, D), (BH, Sk, D), (BH, Sk, Dv)))
        mask = make_mask(rng, kind, BH, Sq, Sk, np.float32)
        m = None if mask is None else as_dtype(mask, dtype)
        scale = 1 / np.sqrt(D)
        got_bits = att.run(q, k, v, None if m is None else m[0], causal, scale, rows=rows)
        got = from_bits(got_bits, dtype)
        want = attention_reference(q64, k64, v64, None if m is None else m[1], causal,
                                   np.float64(np.float32(scale)))
        half_ulp = 2.0 ** (-8 if dtype == "bf16" else -11)
        vmax = float(np.abs(v64).max(initial=0))
        err = np.abs(got - want)
        assert (err <= half_ulp * np.abs(want) + (half_ulp if tensor_cores else 2e-5) * vmax).all(), \
            (BH, Sq, Sk, D, Dv, kind, causal, err.max())
        again = att.run(q, k, v, None if m is None else m[0], causal, scale, rows=rows,
                        reverse=True, grid=1)
        assert again.tobytes() == got_bits.tobytes()


# ---- a real GPU ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_on_a_cuda_device(rng, dtype):
    """The same GEMM kernels on the device (the tensor cores themselves for f16/bf16)."""
    from tessera.runtime.gpu import runnable_targets
    if "cuda" not in runnable_targets():
        pytest.skip("no CUDA device (CuPy with a GPU) here")
    import cupy
    knobs = GG.DEFAULT_KNOBS["cuda"][dtype]
    name, chunks = GG.gemm_routine("cuda", dtype, *knobs)
    src = unit("cuda", chunks) + gemm_kernel("gemm", name, dtype, knobs[0], knobs[1], knobs[3])
    fn = cupy.RawModule(code=src, options=tc.NVRTC_OPTIONS).get_function("gemm")
    m, n, k = 300, 260, 200
    a, a64 = as_dtype(rng.standard_normal((m, k)), dtype)
    b, b64 = as_dtype(rng.standard_normal((k, n)), dtype)
    for at, bt in [(False, False), (True, True)]:
        A = cupy.asarray(np.ascontiguousarray(a.T) if at else a)
        B = cupy.asarray(np.ascontiguousarray(b.T) if bt else b)
        C = cupy.full((m, n), 0x7fff if a.dtype == np.uint16 else np.nan, a.dtype)
        tiles = -(-m // knobs[0]) * -(-n // knobs[1])
        ll = np.int64
        fn((tiles,), (knobs[3],), (A, ll(1 if at else k), ll(m if at else 1), B,
                                    ll(1 if bt else n), ll(k if bt else 1), C, ll(n), ll(m),
                                    ll(n), ll(k)))
        got = cupy.asnumpy(C)
        if dtype == "f32":
            assert_within_dot_bound(got, a, b)
        else:
            check_16bit(got, a64, b64, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_attention_on_a_cuda_device(rng, dtype):
    from tessera.runtime.gpu import runnable_targets
    if "cuda" not in runnable_targets():
        pytest.skip("no CUDA device (CuPy with a GPU) here")
    import cupy
    bq, threads = (64, 128) if dtype == "bf16" else (64, 256)
    name, chunks = GA.attention_routine("cuda", dtype, bq, threads)
    src = unit("cuda", [*EXP[dtype], *chunks]) + attention_kernel("attention", name, dtype,
                                                                   threads)
    fn = cupy.RawModule(code=src, options=tc.NVRTC_OPTIONS).get_function("attention")
    BH, Sq, Sk, D, Dv = 3, 200, 333, 64, 64
    (q, q64), (k, k64), (v, v64) = (as_dtype(rng.standard_normal(s), dtype) for s in
                                    ((BH, Sq, D), (BH, Sk, D), (BH, Sk, Dv)))
    for causal in (False, True):
        out = cupy.full((BH, Sq, Dv), 0x7fff if q.dtype == np.uint16 else np.nan, q.dtype)
        p = np.array([BH, Sq, Sk, D, Dv, int(causal), Sk - Sq, bq, Sq * D, D, Sk * D, D,
                      Sk * Dv, Dv, Sq * Dv, Dv, 0, 0, 0], np.int64)
        scale = np.array([1 / np.sqrt(D)], np.float32)
        fn((BH * -(-Sq // bq),), (threads,), (cupy.asarray(q), cupy.asarray(k), cupy.asarray(v),
                                              np.uint64(0), out, cupy.asarray(scale),
                                              cupy.asarray(p)))
        got = cupy.asnumpy(out)
        got = from_bits(got, dtype) if dtype == "bf16" else got.astype(np.float64)
        want = attention_reference(q64, k64, v64, None, causal, np.float64(scale[0]))
        tol = 2.0 ** -8 * (np.abs(want) + np.abs(v64).max()) if dtype == "bf16" else 2e-5
        assert (np.abs(got - want) <= tol).all()
