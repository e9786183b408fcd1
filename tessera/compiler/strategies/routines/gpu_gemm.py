"""Hand-written GPU GEMM routines (CUDA and HIP) as source chunks.

`gemm_routine(lang, dtype, tile_m, tile_n, tile_k, threads)` returns `(name, chunks)`; the chunks
(deduplicated by the renderer: the helpers are shared by every variant and by gpu_attention)
define

    __device__ void <name>(const T* A, long long a_rs, long long a_cs,
                           const T* B, long long b_rs, long long b_cs,
                           TO* C, long long ldc, long long K, long long mt, long long nt)

which all `threads` threads of a 1-D block call together. It overwrites

    C[i*ldc + j] = sum_k A[i*a_rs + k*a_cs] * B[k*b_rs + j*b_cs],   0 <= i < mt, 0 <= j < nt

for mt <= tile_m, nt <= tile_n and any K >= 0 (K = 0 stores zeros), then returns. Operands may
have any element strides: a transposed view is read in place. T is float / double, or
`unsigned short` holding f16 / bf16 bits; TO = T (f16/bf16 results are rounded to nearest even
from the f32 accumulator; NaN stays NaN). The routine starts with a barrier, so a caller may
call it again at once for its next tile; its shared memory is static (`__shared__` inside the
routine) and counts against the kernel's 48 KiB static limit.

Numerics. f32/f64 (and the SIMT f16/bf16 path): every C element is the chain
acc = fma(a_k, b_k, acc) for k = 0, 1, ..., K-1 from acc = 0 - the CPU routine's chain
(c_gemm.py), so GPU and CPU results are bitwise equal, and no knob changes a bit. Each fma is an
explicit fmaf/fma call and nothing else is computed in floating point, so the result does not
depend on --fmad / -ffp-contract (pass --fmad=false / -ffp-contract=off for the rest of a kernel).
Tensor cores (CUDA f16/bf16): k goes by in steps of 16 from 0, one mma.sync per step per output
fragment, accumulated in f32; the hardware's rounding inside one step is its own, so results
are bitwise reproducible run to run and for every tile knob on one GPU model, but not equal to
the CPU's chain (tests compare with a float64 reference).

Routines and why they are tiled as they are. H100 SXM: 132 SMs, 228 KiB shared memory and
64K registers per SM; FP32 67 TFLOP/s, FP64 34, dense bf16/f16 989 (wgmma). Shared memory and
registers are ptxas's (CUDA 13.2, sm_90) for a grid-stride test kernel; the fractions of peak
are estimates from the instruction mix, to be measured on a lent GPU:

* SIMT (f32, f64; HIP f16/bf16). A tile_m x tile_n block tile; each thread owns a TM x TN
  register tile (TM*TN = tile_m*tile_n/threads, at most 256 bytes of accumulators), its rows
  and columns in 16-byte groups spread across the tile, so each shared-memory read is one
  16-byte vector and a warp's reads are broadcasts or conflict-free. A and B are staged tile_k
  deep, transposed to k-major (As[k][m], Bs[k][n]; rows padded by 16 bytes so the transposing
  stores do not conflict) and double-buffered: slice s+1 is loaded into registers while slice s
  is computed, one barrier per slice. Global loads are per element (any strides), the operand's
  unit-stride index along consecutive threads (coalesced for either layout).
  f32 128 x 128 x 8, 256 threads (8 x 8 per thread: per k step 4 vector loads for 64 fmas):
  16.5 KiB shared, ~150 registers (143 in the renderer's kernel), one block of 8 warps per SM;
  expected 55-70% of the FP32 peak (cuBLAS sgemm ~75-80%).
  f64 64 x 64 x 8, 256 threads (4 x 4): 16.5 KiB, 80 registers, 3 blocks per SM; ~60% of FP64.
* Tensor cores (CUDA f16/bf16, sm_80+). mma.sync.m16n8k16 (f32 accumulation) on ldmatrix
  fragments; the warps split the block tile into warp tiles (128 x 128 with 4 warps: 64 x 64
  each, 4 x 8 mma tiles, 128 accumulators); cp.async (16 bytes, zero-filling past the edges)
  fills a ring of 2-4 tile_k-deep stages, as many as fit 48 KiB (3 for 128 x 128 x 32: 48 KiB
  exactly), one barrier per stage. Each operand keeps its global layout in shared memory
  (k- or m/n-contiguous, chosen at run time from the strides: one template instance per pair)
  and is read with ldmatrix or ldmatrix.trans; 16-byte chunks are XOR-swizzled so the 8 rows
  of every ldmatrix phase hit 8 different bank groups. Operands without a unit stride or not
  16-byte aligned take a scalar path into the same layout (slow, correct). Tiles smaller than
  the warps can split leave the extra warps loading only. 128 x 128 x 32 with 128 threads: 48 KiB,
  250 registers, 2 blocks (8 warps) per SM; expected 55-65% of cuBLAS on H100 (cuBLAS uses
  wgmma, TMA and deeper pipelines in dynamic shared memory), ~75% on A100.
* HIP f16/bf16: the SIMT routine with f32 accumulation. MFMA (gfx90a) is future work: its
  register layouts cannot be checked here without an AMD GPU or an emulator of them.

`TSG_PORTABLE_MMA` (a macro defined before the chunks) replaces the tensor-core PTX (cp.async,
ldmatrix, mma.sync, cvt) with C++ doing the same data movement through warp shuffles, so a CPU
emulator of the CUDA thread model runs the tensor-core routines' own indexing (the tests do).
C must not overlap A or B.
"""
from __future__ import annotations

from ....errors import ArgumentError, UnsupportedDTypeError
from . import half_conversions, routine_text, specialise

LANGS = ("cuda", "hip")
DTYPES = ("f32", "f64", "f16", "bf16")
DT_CODE = {"f32": 0, "f64": 1, "f16": 2, "bf16": 3}       # tsg_dt<DT> in the C++ below
STORAGE = {"f32": "float", "f64": "double", "f16": "unsigned short", "bf16": "unsigned short"}
_ARITH_BYTES = {"f32": 4, "f64": 8, "f16": 4, "bf16": 4}   # f16/bf16 are staged as f32 (SIMT)
SMEM_LIMIT = 48 << 10          # static shared memory per block
MAX_STAGES = 4

# (tile_m, tile_n, tile_k, threads) a caller can start from; see the module docstring. CUDA
# 16-bit: 128x256 tiles on 16 warps ran 4096^3 1.1x faster than 128x128 on 4 (an H200, 2026-11-26)
DEFAULT_KNOBS = {
    "cuda": {"f32": (128, 128, 8, 256), "f64": (64, 64, 8, 256),
             "f16": (128, 256, 32, 512), "bf16": (128, 256, 32, 512)},
    "hip": {"f32": (128, 128, 8, 256), "f64": (64, 64, 8, 256),
            "f16": (128, 128, 8, 256), "bf16": (128, 128, 8, 256)},
}

# ---- shared helpers (one chunk per language, also used by gpu_attention) ----------------------

_LANG_MACROS = {
    "cuda": """\
#define TSG_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define TSG_SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l))
#define TSG_NOCONTRACT          /* NVRTC: every rounding-sensitive operation is an intrinsic */""",
    "hip": """\
#define TSG_SHFL_XOR(v, m) __shfl_xor((v), (m))
#define TSG_SHFL(v, l) __shfl((v), (l))
/* hipcc contracts a*b+c across statements by default; each routine body opts out */
#define TSG_NOCONTRACT _Pragma("clang fp contract(off)")""",
}

_COMMON = specialise(routine_text("gpu_common.cuh"), HALF=half_conversions("gpu"))

COMMON = {lang: f"/* ---- tessera GPU routines: shared helpers ({lang}) ---- */\n{macros}\n{_COMMON}"
          for lang, macros in _LANG_MACROS.items()}

# ---- SIMT GEMM (f32, f64; f16/bf16 staged as f32) ---------------------------------------------

_SIMT = routine_text("gemm_simt.cuh")

# ---- tensor-core GEMM (CUDA, f16/bf16, sm_80+) ------------------------------------------------

MMA_OPS = routine_text("mma_ops.cuh")

_MMA = routine_text("gemm_mma.cuh")

_WRAPPER = routine_text("gemm_wrapper.cuh")


def check_lang_dtype(lang: str, dtype: str, what: str) -> None:
    if lang not in LANGS:
        raise ArgumentError(f"{what}: unknown GPU language {lang!r}", expected=" or ".join(LANGS),
                            received=repr(lang))
    if dtype not in DTYPES:
        raise UnsupportedDTypeError(f"{what}: no GPU routine for dtype {dtype!r}",
                                    expected=", ".join(DTYPES), received=repr(dtype))


def knob_error(what: str, message: str, received: str, hint: str | None = None):
    return ArgumentError(f"{what}: {message}", received=received, hint=hint)


def register_tile(rows: int, cols: int, threads: int) -> tuple[int, int]:
    """(TM, TN): each of `threads` threads owns TM x TN of a rows x cols tile, TM*TN =
    rows*cols/threads, as square as powers of two allow (TN >= TM). (0, 0) if impossible."""
    per, rem = divmod(rows * cols, threads)
    if rem or per < 1 or per & (per - 1):
        return 0, 0
    tm = 1 << ((per.bit_length() - 1) // 2)
    tn = per // tm
    return (tm, tn) if rows % tm == 0 and cols % tn == 0 else (0, 0)


def simt_plan(dtype: str, tile_m: int, tile_n: int, tile_k: int, threads: int) -> dict:
    """The SIMT routine's derived sizes (register tile, shared memory), checked."""
    what = f"gemm_routine({dtype}, {tile_m}x{tile_n}x{tile_k}, threads={threads})"
    if threads < 32 or threads > 1024 or threads % 32:
        raise knob_error(what, "threads must be a multiple of 32 in 32..1024", str(threads))
    if min(tile_m, tile_n, tile_k) < 1 or max(tile_m, tile_n) > 512 or tile_k > 64:
        raise knob_error(what, "tiles must be 1..512 (tile_k 1..64)",
                          f"{tile_m}x{tile_n}x{tile_k}")
    tm, tn = register_tile(tile_m, tile_n, threads)
    size = _ARITH_BYTES[dtype]
    if not tm or tm * tn * size > 256:
        raise knob_error(what, "tile_m*tile_n/threads must be a power of two that tiles the "
                          f"block, at most {256 // size} accumulators per thread",
                          f"{tile_m * tile_n / threads:g} per thread",
                          hint="e.g. 128x128 (f32) or 64x64 (f64) with 256 threads")
    vec = 16 // size
    smem = 2 * tile_k * (tile_m + tile_n + 2 * vec) * size
    if smem > SMEM_LIMIT:
        raise knob_error(what, f"needs {smem} bytes of shared memory (limit {SMEM_LIMIT})",
                          f"tile_k={tile_k}", hint="lower tile_k")
    return {"TM": tm, "TN": tn, "smem": smem, "accumulators": tm * tn}


def mma_plan(dtype: str, tile_m: int, tile_n: int, tile_k: int, threads: int) -> dict:
    """The tensor-core routine's warp layout, pipeline depth and shared memory, checked."""
    what = f"gemm_routine(cuda, {dtype}, {tile_m}x{tile_n}x{tile_k}, threads={threads})"
    if threads not in (32, 64, 128, 256, 512):
        raise knob_error(what, "tensor-core routine needs 1, 2, 4, 8 or 16 warps", str(threads))
    if tile_m % 16 or tile_n % 16 or tile_k % 16 or min(tile_m, tile_n, tile_k) < 16 \
            or tile_k > 64 or max(tile_m, tile_n) > 256:
        raise knob_error(what, "tile_m, tile_n must be multiples of 16 up to 256 and tile_k "
                          "one of 16, 32, 48, 64", f"{tile_m}x{tile_n}x{tile_k}")
    warps, best = threads // 32, None
    for wm in range(1, warps + 1):             # warps past WM*WN only load (small tiles)
        for wn in range(1, warps // wm + 1):
            if tile_m % (16 * wm) or tile_n % (16 * wn):
                continue
            wtm, wtn = tile_m // wm, tile_n // wn
            key = (-wm * wn, abs(wtm - wtn), -wtn)    # busy warps, square tiles, wide ones
            if best is None or key < best[0]:
                best = (key, wm, wn)
    _, wm, wn = best
    acc = (tile_m // wm) * (tile_n // wn) // 32
    if acc > 128:
        raise knob_error(what, f"{acc} f32 accumulators per thread (at most 128)",
                          f"{tile_m}x{tile_n} over {warps} warps", hint="use more threads")
    stage = 2 * tile_k * (tile_m + tile_n)
    stages = min(MAX_STAGES, SMEM_LIMIT // stage)
    if stages < 2:
        raise knob_error(what, f"two {stage}-byte stages exceed {SMEM_LIMIT} bytes of shared "
                          "memory", f"{tile_m}x{tile_n}x{tile_k}", hint="lower tile_k")
    return {"WM": wm, "WN": wn, "stages": stages, "smem": stages * stage, "accumulators": acc}


def uses_tensor_cores(lang: str, dtype: str) -> bool:
    return lang == "cuda" and dtype in ("f16", "bf16")


def gemm_routine(lang: str, dtype: str, tile_m: int, tile_n: int, tile_k: int,
                 threads: int) -> tuple[str, list[str]]:
    """(name, chunks) of the block-level GEMM routine described in the module docstring.

    lang "cuda" | "hip"; dtype "f32" | "f64" | "f16" | "bf16" (inputs; the output has the same
    dtype). CUDA f16/bf16 use tensor cores (`mma_routine`, sm_80+), everything else the SIMT
    routine (`simt_routine`). Raises ArgumentError for knobs the routine cannot take (with the
    limit in the message), UnsupportedDTypeError for a dtype."""
    check_lang_dtype(lang, dtype, "gemm_routine")
    if uses_tensor_cores(lang, dtype):
        return mma_routine(dtype, tile_m, tile_n, tile_k, threads)
    return simt_routine(lang, dtype, tile_m, tile_n, tile_k, threads)


def simt_routine(lang: str, dtype: str, tile_m: int, tile_n: int, tile_k: int,
                 threads: int) -> tuple[str, list[str]]:
    """The SIMT routine for any dtype (f16/bf16 staged and accumulated in f32): what HIP uses
    for every dtype, and CUDA for f32/f64 (tests run its f16/bf16 form in the CUDA emulator)."""
    check_lang_dtype(lang, dtype, "simt_routine")
    tile_m, tile_n, tile_k, threads = int(tile_m), int(tile_n), int(tile_k), int(threads)
    p = simt_plan(dtype, tile_m, tile_n, tile_k, threads)
    name = f"tsg_gemm_{dtype}_{tile_m}x{tile_n}x{tile_k}_t{threads}"
    call = (f"tsg_gemm_simt<{DT_CODE[dtype]}, {tile_m}, {tile_n}, {tile_k}, {threads}, "
            f"{p['TM']}, {p['TN']}>")
    doc = (f"{tile_m}x{tile_n}x{tile_k} SIMT GEMM, {threads} threads of {p['TM']}x{p['TN']}, "
           f"{p['smem']} B shared")
    wrapper = specialise(_WRAPPER, doc=doc, name=name, T=STORAGE[dtype], TC=STORAGE[dtype],
                         call=call)
    return name, [COMMON[lang], _SIMT, wrapper]


def mma_routine(dtype: str, tile_m: int, tile_n: int, tile_k: int,
                threads: int, out: str | None = None) -> tuple[str, list[str]]:
    """The CUDA tensor-core routine (f16/bf16 inputs, f32 accumulation, sm_80+); its output in
    the inputs' dtype, or with ``out="f32"`` the f32 accumulator itself (a tile kernel's
    ``acc += tile.mma(a, b)`` with an f32 accumulator)."""
    if out not in (None, dtype, "f32"):
        raise UnsupportedDTypeError(f"mma_routine writes {dtype} or f32, not {out}")
    out = None if out == dtype else out
    check_lang_dtype("cuda", dtype, "mma_routine")
    if dtype not in ("f16", "bf16"):
        raise UnsupportedDTypeError(f"mma_routine: tensor cores take f16 or bf16, not {dtype}")
    tile_m, tile_n, tile_k, threads = int(tile_m), int(tile_n), int(tile_k), int(threads)
    p = mma_plan(dtype, tile_m, tile_n, tile_k, threads)
    name = f"tsg_gemm_mma_{dtype}_{tile_m}x{tile_n}x{tile_k}_t{threads}" + \
        ("_f32out" if out else "")
    tc = STORAGE["f32"] if out else STORAGE[dtype]
    call = (f"tsg_gemm_mma<{DT_CODE[dtype]}, {tile_m}, {tile_n}, {tile_k}, {threads}, "
            f"{p['WM']}, {p['WN']}, {p['stages']}, {tc}>")
    doc = (f"{tile_m}x{tile_n}x{tile_k} tensor-core GEMM, {threads // 32} warps, "
           f"{p['WM']}x{p['WN']} of them computing, {p['stages']} stages, {p['smem']} B shared, "
           f"{p['accumulators']} f32 accumulators/thread")
    wrapper = specialise(_WRAPPER, doc=doc, name=name, T=STORAGE[dtype], TC=tc, call=call)
    return name, [COMMON["cuda"], MMA_OPS, _MMA, wrapper]
