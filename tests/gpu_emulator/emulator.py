"""CUDA C on the CPU: compile a kernel source against cuda_emu.h with g++, launch its kernels on
NumPy arrays, and run a tessera GPU program (TileProgram + render_cuda) the way the CUDA runtime
would, so generated GPU kernels are tested against NumPy where there is no GPU.

The execution model (blocks one at a time, the threads of a block as fibers, deadlocks and races
made visible) is described at the top of cuda_emu.h. Buffers this module allocates sit between
guard pages, poisoned (NaN, or a sentinel) where a kernel should write them, so an access out of
bounds or an element left unwritten fails the test instead of passing by luck.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import weakref
from pathlib import Path

import numpy as np

from tessera.runtime.program import HostSteps, status_error
from tessera.errors import (ArgumentError, CompileError, CompilerNotFoundError,
                            TesseraError)

HEADER = Path(__file__).with_name("cuda_emu.h")
# TSG_PORTABLE_MMA: gpu_gemm's tensor-core routine with its PTX (cp.async, ldmatrix, mma.sync)
# replaced by warp-shuffle C++ that moves the same data. -fno-weak: the statics of templates
# (shared arrays in template routines) become plain symbols of the module, not process-wide
# unique ones. -fstack-clash-protection: a large local array touches its stack pages in order,
# so an overflow hits the fiber's guard page. -ffp-contract=off: as NVRTC with --fmad=false.
# -fsanitize=alignment as a trap: an access through a misaligned pointer (a 16-byte vector load
# of a float at an odd offset) is a fault, as a GPU's "misaligned address" is; x86 would allow it.
KERNEL_FLAGS = ("-DTSG_PORTABLE_MMA", "-std=c++20", "-O1", "-fPIC", "-shared",
                "-fvisibility=hidden", "-fno-weak", "-ffp-contract=off", "-fno-strict-aliasing",
                "-fstack-clash-protection", "-fsanitize=alignment",
                "-fsanitize-undefined-trap-on-error", "-w")
RUNTIME_FLAGS = ("-std=c++20", "-O2", "-fPIC", "-shared", "-pthread", "-DTSEMU_RUNTIME")
TIME_LIMIT_S = 120.0              # per launch: an endless loop fails instead of hanging CI
MAX_DYNAMIC_SHARED = 227 << 10    # per block on an H100 (after an opt-in)
COMPILE_TIMEOUT_S = 300


class KernelFault(TesseraError):
    """The emulator caught a kernel doing what a GPU would not survive or would compute garbage
    from: a deadlock at a barrier, an access outside its buffers, a launch the hardware refuses."""


# ---- compiling -------------------------------------------------------------------------------
def _cache_dir() -> Path:
    root = os.environ.get("TESSERA_CACHE_DIR") or os.path.join(tempfile.gettempdir(),
                                                               f"tessera-{os.getuid()}")
    path = Path(root) / "cuda_emu"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.lru_cache(maxsize=None)
def _compiler() -> tuple[str, str]:
    cxx = shutil.which(os.environ.get("CXX") or "g++")
    if cxx is None:
        raise CompilerNotFoundError("the CUDA emulator needs a C++20 compiler: g++ is not on PATH",
                                    hint="apt-get install g++, or point $CXX at one")
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    return cxx, out.stdout.splitlines()[0] if out.stdout else cxx


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


_build_lock = threading.Lock()


def _build(args: list, source_path: Path, out: Path, what: str, libs=()):
    """Run the compiler into a temporary name, then rename: a killed run leaves no half file."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = [_compiler()[0], *args, str(source_path), "-o", str(tmp)]
    try:
        proc = subprocess.run(cmd + [*libs, "-lm"], capture_output=True, text=True,
                              timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CompileError(f"g++ took over {COMPILE_TIMEOUT_S}s on {what}",
                           hint=f"source: {source_path}") from None
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        log = "\n".join("  | " + line for line in (proc.stderr or proc.stdout).splitlines()[:40])
        raise CompileError(f"g++ rejected {what} under the CUDA emulator (exit "
                           f"{proc.returncode})\n  source: {source_path}\n{log}")
    os.replace(tmp, out)


@functools.lru_cache(maxsize=None)
def _runtime() -> ctypes.CDLL:
    """The scheduler library every kernel module links against (built once per header)."""
    header = HEADER.read_text()
    so = _cache_dir() / f"libtsemu-{_digest(header, RUNTIME_FLAGS, _compiler()[1])}.so"
    with _build_lock:
        if not so.exists():
            _build([*RUNTIME_FLAGS, "-x", "c++"], HEADER, so, "the emulator runtime")
    lib = ctypes.CDLL(str(so))
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    uint3 = ctypes.POINTER(ctypes.c_uint)
    lib.tsemu_launch.argtypes = [vp, ctypes.c_int, ctypes.POINTER(vp), uint3, uint3, sz,
                                 ctypes.POINTER(vp), ctypes.POINTER(sz), ctypes.c_int, ctypes.c_int,
                                 ctypes.c_int, ctypes.c_double, ctypes.c_char_p, sz]
    lib.tsemu_launch.restype = ctypes.c_int
    lib.tsemu_alloc.argtypes = [sz]
    lib.tsemu_alloc.restype = vp
    lib.tsemu_free.argtypes = [vp, sz]
    lib.tsemu_damaged.argtypes = [vp, sz, ctypes.POINTER(ctypes.c_int)]
    lib.tsemu_damaged.restype = ctypes.c_longlong
    return lib


# `extern __shared__ T name[];` (dynamic shared memory) cannot be a macro: it becomes a pointer
# into the runtime's poisoned area. `static __shared__` would say static twice.
_EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+((?:[\w:]+\s+|__align__\s*\(\s*\d+\s*\)\s*|"
                            r"\*\s*)+?)(\w+)\s*\[\s*\]\s*;")
_ALIGN = re.compile(r"__align__\s*\(\s*\d+\s*\)")
_STATIC_SHARED = re.compile(r"\bstatic\s+__shared__\b|\b__shared__\s+static\b")
_SYSTEM_STDINT = re.compile(r"#\s*include\s*[<\"](?:stdint\.h|cstdint)[>\"]")
_HIP_RUNTIME = re.compile(r"#\s*include\s*[<\"]hip/hip_runtime\.h[>\"]")
WARP_SIZE = {"cuda": 32, "hip": 64}


def emulator_source(source: str, lang: str = "cuda") -> str:
    """The CUDA (or HIP) source as g++ compiles it under cuda_emu.h."""
    def dynamic(m):
        ctype = _ALIGN.sub("", m.group(1)).strip()
        return f"{ctype}* const {m.group(2)} = ({ctype}*)tsemu_dynamic_shared;"
    text = _STATIC_SHARED.sub("__shared__", _EXTERN_SHARED.sub(dynamic, source))
    return _HIP_RUNTIME.sub("", text) if lang == "hip" else text   # cuda_emu.h stands in


def _defines(source: str, lang: str) -> list:
    """What cuda_emu.h (included first) must know of the source."""
    return (["-DTSEMU_SYSTEM_STDINT"] if _SYSTEM_STDINT.search(source) else []) + \
        (["-DTSEMU_HIP"] if lang == "hip" else [])


class Module:
    """A compiled CUDA source: its kernels, by name, are launched with `launch`."""

    def __init__(self, path: Path, source: str, lang: str):
        self.path = path
        self.source = source
        self.warp_size = WARP_SIZE[lang]
        self.lib = ctypes.CDLL(str(path))
        self.shared = self._shared_variables()

    def _shared_variables(self) -> list:
        """(address, bytes) of every uninitialised function-local static in the loaded module
        (__shared__ arrays take no initializer), from its symbol table; templates' included."""
        out = subprocess.run(["nm", "--defined-only", "-S", str(self.path)], capture_output=True,
                             text=True, timeout=60).stdout
        symbols = [line.split() for line in out.splitlines()]
        marker = next(int(f[0], 16) for f in symbols if f[-1] == "tsemu_module_marker")
        bias = ctypes.cast(self.lib.tsemu_module_marker, ctypes.c_void_p).value - marker
        return [(bias + int(f[0], 16), int(f[1], 16)) for f in symbols
                if len(f) == 4 and f[2] in "bB" and f[3].startswith("_ZZ")]

    def kernel(self, name: str) -> int:
        try:
            fn = getattr(self.lib, name)
        except AttributeError:
            raise KernelFault(f"no kernel named {name} in {self.path.with_suffix('.cpp')}",
                              hint='kernels must be declared extern "C" __global__') from None
        return ctypes.cast(fn, ctypes.c_void_p).value

    def __repr__(self):
        return f"<cuda_emu.Module {self.path.name}>"


_modules: dict[str, Module] = {}


def compile_source(source: str, name: str = "kernels", lang: str = "cuda") -> Module:
    """Compile CUDA C source (or HIP: lang "hip", warps of 64), cached by content, into a module
    of launchable kernels."""
    if lang not in WARP_SIZE:
        raise KernelFault(f"the emulator runs CUDA or HIP, not {lang!r}")
    text = emulator_source(source, lang)
    flags = [*KERNEL_FLAGS, *_defines(source, lang), "-include", str(HEADER)]
    runtime = _runtime()
    key = _digest(HEADER.read_text(), flags, _compiler()[1], runtime._name, text)
    with _build_lock:
        if key not in _modules:
            so = _cache_dir() / f"{key}.so"
            if not so.exists():
                cpp = so.with_suffix(".cpp")
                cpp.write_text(text)
                _build(flags, cpp, so, name, [runtime._name])
            _modules[key] = Module(so, source, lang)
        return _modules[key]


# ---- device memory ---------------------------------------------------------------------------
_allocations: dict[int, int] = {}      # data address -> bytes, for every live guarded buffer
_PAGE = os.sysconf("SC_PAGE_SIZE")


def device_empty(shape, dtype, fill=None) -> np.ndarray:
    """A NumPy array in emulated device memory: guard pages on both sides, 0xff slack bytes
    (checked after each launch), filled with `fill` if given (else 0xff bytes: NaN or -1)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in np.atleast_1d(shape)) if np.ndim(shape) else (int(shape),)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    rt = _runtime()
    ptr = rt.tsemu_alloc(nbytes)
    if not ptr:
        raise MemoryError(f"cannot map {nbytes} bytes of emulated device memory")
    raw = (ctypes.c_char * nbytes).from_address(ptr)
    _allocations[ptr] = nbytes
    weakref.finalize(raw, _free, rt, ptr, nbytes)
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if fill is not None:
        arr.fill(fill)
    return arr


def _free(rt, ptr, nbytes):
    _allocations.pop(ptr, None)
    rt.tsemu_free(ptr, nbytes)


def to_device(a) -> np.ndarray:
    """A copy of `a` in emulated device memory (cudaMemcpy host to device)."""
    a = np.asarray(a)
    out = device_empty(a.shape, a.dtype)
    out[...] = a
    return out


def _describe_address(addr: int, pointers: list) -> str:
    """Where a faulting address lies relative to the nearest guarded argument."""
    best = None
    for k, ptr in enumerate(pointers):
        nbytes = _allocations.get(ptr)
        if nbytes is not None:
            off = addr - ptr
            gap = -off if off < 0 else max(0, off - nbytes + 1)
            if best is None or gap < best[0]:
                best = (gap, k, off, nbytes)
    if best is None or best[0] > 1 << 26:
        return ""
    _, k, off, nbytes = best
    where = (f"{-off} bytes before the start" if off < 0 else
             f"{off - nbytes} bytes past the end" if off >= nbytes else f"byte {off}")
    return f": {where} of argument {k} ({nbytes} bytes)"


# ---- launching -------------------------------------------------------------------------------
def _dim3(v, what) -> tuple:
    dims = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    if not 1 <= len(dims) <= 3:
        raise KernelFault(f"{what} {v!r} must be an int or 1 to 3 ints")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def _check_config(kernel, grid, block, shared):
    threads = block[0] * block[1] * block[2]
    bad = None
    if min(grid + block) < 1:
        bad = "every grid and block dimension must be at least 1"
    elif block[0] > 1024 or block[1] > 1024 or block[2] > 64 or threads > 1024:
        bad = f"a block has at most 1024 threads (x, y <= 1024, z <= 64); got {block}"
    elif grid[0] >= 2 ** 31 or grid[1] > 65535 or grid[2] > 65535:
        bad = f"grid {grid} exceeds (2^31 - 1, 65535, 65535)"
    elif not 0 <= shared <= MAX_DYNAMIC_SHARED:
        bad = f"{shared} bytes of dynamic shared memory (at most {MAX_DYNAMIC_SHARED})"
    if bad:
        raise KernelFault(f"launch of {kernel} refused (invalid configuration): {bad}")


def _pointer(a) -> int:
    if a is None:
        return 0
    if isinstance(a, np.ndarray):
        if not a.flags.c_contiguous:
            raise KernelFault("a kernel argument must be a C-contiguous array",
                              hint="np.ascontiguousarray, or to_device")
        return a.ctypes.data
    if isinstance(a, (int, np.integer)):      # passed by value: an integer, pointer-sized
        return int(a)
    return ctypes.cast(a, ctypes.c_void_p).value or 0


def launch(module: Module, kernel: str, grid, block, args: list, shared: int = 0, *,
           reverse: bool = False, time_limit: float = TIME_LIMIT_S):
    """Launch `kernel<<<grid, block, shared>>>(*args)` and wait for it. `args` are arrays
    (device pointers), ctypes pointers, None, or Python ints (passed by value; every parameter
    must be pointer-sized: no float or struct by value). `reverse` runs blocks and threads in
    the opposite order: a correct kernel gives the same bits either way."""
    fn = module.kernel(kernel)
    grid, block = _dim3(grid, "grid"), _dim3(block, "block")
    _check_config(kernel, grid, block, shared)
    pointers = [_pointer(a) for a in args]
    err = ctypes.create_string_buffer(1024)
    status = _runtime().tsemu_launch(
        fn, len(pointers), (ctypes.c_void_p * max(1, len(pointers)))(*pointers),
        (ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared,
        (ctypes.c_void_p * max(1, len(module.shared)))(*[a for a, _ in module.shared]),
        (ctypes.c_size_t * max(1, len(module.shared)))(*[n for _, n in module.shared]),
        len(module.shared), module.warp_size, int(reverse), time_limit, err, len(err))
    if status:
        message = err.value.decode(errors="replace")
        m = re.search(r"(?:read|write|access) at address (0x[0-9a-f]+)", message)
        if m:
            message += _describe_address(int(m.group(1), 16), pointers)
        raise KernelFault(f"{kernel}<<<{grid}, {block}, {shared}>>>: {message}")
    damaged = ctypes.c_int()
    for k, ptr in enumerate(pointers):
        if ptr in _allocations:
            off = _runtime().tsemu_damaged(ptr, _allocations[ptr], ctypes.byref(damaged))
            if damaged.value:
                where = (f"{-off} bytes before its start" if off < 0
                         else f"{off - _allocations[ptr]} bytes past its end")
                raise KernelFault(f"{kernel}<<<{grid}, {block}, {shared}>>> wrote outside "
                                  f"argument {k}: {where} ({_allocations[ptr]} bytes)")


# ---- tessera GPU programs --------------------------------------------------------------------
def _poison(dtype: np.dtype):
    from tessera import dtypes
    return dtypes.from_numpy(dtype).poison          # (the CPU runtime's)


def run_program(program, *arrays, reverse: bool = False, max_blocks: int | None = None,
                time_limit: float = TIME_LIMIT_S) -> list:
    """Run a GPU program (`fn.lower(*arrays, target="cuda")` or "hip": anything with graph_ir,
    schedule_ir, tile_ir, target_code and target) in the emulator as the GPU runtime would: the
    same buffer table and results, outputs and temporaries poisoned first (NaN or a sentinel),
    ts_status checked after every launch (RuntimeFault). Results are NumPy copies.
    `max_blocks` launches at most that many blocks: kernels whose loops stride over the grid
    must give the same bits with fewer blocks, each doing several iterations."""
    params = program.graph_ir.params
    if len(arrays) != len(params):
        raise ArgumentError(f"program @{program.graph_ir.name} takes {len(params)} arrays, "
                            f"got {len(arrays)}")
    module = compile_source(program.target_code, program.graph_ir.name,
                            getattr(program, "target", "cuda"))
    if hasattr(program, "as_parts"):        # complex arrays as their parts, as the runtime
        arrays = program.as_parts([np.require(a, requirements="C") for a in arrays])
    table = {}
    for b in program.tile_ir.buffers:
        npd = b.type.dtype.np
        if b.role == "input":
            a = np.asarray(arrays[b.param])
            if a.shape != tuple(b.type.shape) or a.dtype != npd:
                raise ArgumentError(f"%{params[b.param].param_name} must be {b.type}, got "
                                    f"{a.dtype}{list(a.shape)}")
            table[b.name] = to_device(a)
        elif b.role == "const":
            table[b.name] = to_device(np.asarray(b.data, dtype=npd))
        else:
            table[b.name] = device_empty(tuple(b.type.shape), npd, fill=_poison(npd))
    status = device_empty((1 + program.tile_ir.workspace,), np.int32, fill=0)   # + workspace
    kernels = {k.name: k for k in program.tile_ir.kernels}
    # a shape-generic module's kernels take the sizes last, by value (int64: pointer-sized)
    sizes = [int(v) for v in (getattr(program, "dynamic_sizes", None) or {}).values()]

    def launch_one(name, arrays):
        cfg = kernels[name].launch
        grid = cfg["grid"] if max_blocks is None else min(cfg["grid"], max_blocks)
        launch(module, name, grid, cfg["block"], list(arrays) + [status] + sizes,
               cfg.get("shared", 0), reverse=reverse, time_limit=time_limit)
        if status[0]:
            raise status_error(program, int(status[0]))
    HostSteps(program.tile_ir, table, launch_one).run()   # the GPU runtime's host side
    results = []
    for b in program.schedule_ir.outputs:
        results.append(np.array(b.data) if b.role == "inline" else np.array(table[b.name]))
    return program.as_complex(results, np) if hasattr(program, "as_complex") else results
