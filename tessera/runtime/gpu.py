"""Running CUDA and HIP programs through CuPy.

CUDA: the source is compiled by NVRTC for the device's architecture, the PTX is kept in the
kernel cache (the architecture, NVRTC's version and the options are in its key; written under
a temporary name and renamed), loaded as a `cupy.RawModule` and launched on CuPy arrays. Where
the driver cannot load that PTX (it is older than our NVRTC), or our NVRTC is missing, CuPy's
own NVRTC compiles the source. HIP: the same source path through the ROCm build of CuPy, which
compiles with hipRTC and keeps its own cache. Every kernel has the signature the GPU renderers
emit: one pointer per parameter, then `int* ts_status`, launched on a 1-D grid.

Inputs are checked before anything is copied to the device; NumPy inputs are copied, CuPy
inputs used in place (a copy only when not C-contiguous or on another device). Each launch is
timed with CUDA events when a profiler is open. Results are CuPy arrays on the current device.
A run waits for its kernels only where one can flag an error (an index check, say) in the status
word; otherwise it returns once they are queued on CuPy's current stream, as CuPy's own
operations do.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np

from .. import dtypes as dt
from ..errors import ArgumentError, BackendUnavailableError, DeviceError, ResourceError
from ..types import type_of_array
from . import cache, profiler, targets
from .gpu_toolchain import NVRTC_OPTIONS, nvrtc_compile, nvrtc_version
from .program import HostSteps, no_memory, results, status_error

# clang compiles HIP with -ffp-contract=fast by default: a*b+c would become an FMA, against the
# numerics contract (hipcc's compile check in CI passes the same flag)
HIP_OPTIONS = ("-std=c++17", "-ffp-contract=off")
_load_lock = threading.Lock()           # one compile per program, whatever the threads
_generic_modules: dict = {}     # (target, source, device) -> a shape-generic module, loaded


def _cupy():
    try:
        import cupy
    except ModuleNotFoundError as e:
        if e.name != "cupy":
            raise BackendUnavailableError(f"CuPy cannot be imported: {e}") from None
        raise BackendUnavailableError(
            "CuPy is not installed, so GPU programs cannot run here",
            hint="pip install 'tessera[cuda]' on a machine with an NVIDIA GPU (fn.lower(..., "
                 "target='cuda') still shows every IR level and the source)") from None
    except Exception as e:      # a CuPy built for another CUDA, a missing shared library
        raise BackendUnavailableError(f"CuPy cannot be imported: {e}") from None
    return cupy


def runnable_targets() -> list[str]:
    """["cuda"] or ["hip"] where CuPy sees a device, else []."""
    try:
        cupy = _cupy()
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return []
    except Exception:           # no CuPy, no driver, no device: all mean "cannot run here"
        return []
    return ["hip" if cupy.cuda.runtime.is_hip else "cuda"]


_ready = {}                     # target -> the CuPy module that found a device for it


def _require(target: str):
    cupy = _cupy()
    if _ready.get(target) is cupy:
        return cupy
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:      # CUDARuntimeError: no driver
        raise BackendUnavailableError(f"no GPU driver answers: {e}") from None
    if count < 1:
        raise BackendUnavailableError("CuPy finds no GPU on this machine")
    built = "hip" if cupy.cuda.runtime.is_hip else "cuda"
    if built != target:
        raise BackendUnavailableError(f"this CuPy is built for {built}, the program for {target}",
                                      hint=f"lower with target={built!r}")
    _ready[target] = cupy
    return cupy


def _properties(cupy) -> dict:
    return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)


def device_arch(cupy) -> str:
    if cupy.cuda.runtime.is_hip:
        name = _properties(cupy)["gcnArchName"]
        return name.decode() if isinstance(name, bytes) else str(name)
    return "sm_" + cupy.cuda.Device().compute_capability


def ptx_path(source: str, arch: str) -> Path:
    """Where the PTX of `source` for `arch` lives: the kernel cache, keyed by everything that
    changes the PTX (or a directory of this process's own under TESSERA_NO_CACHE=1)."""
    from ..version import __version__
    key = hashlib.sha256("\0".join([source, arch, nvrtc_version(), *NVRTC_OPTIONS,
                                    str(cache.SCHEMA_VERSION), __version__]).encode())
    root = cache.cache_dir() / "kernels" if cache.cache_enabled() else _private_dir()
    return root / f"cuda-{arch}-{key.hexdigest()[:32]}.ptx"


_private = []


def _private_dir() -> Path:
    """A directory for this process's PTX, removed at exit. (CuPy loads a module from its path
    again on each further device, so the file must outlive the load.)"""
    if not _private:
        _private.append(Path(tempfile.mkdtemp(prefix="tessera-ptx-")))
        atexit.register(shutil.rmtree, _private[0], ignore_errors=True)
    return _private[0]


def _compile_ptx(source: str, arch: str, name: str) -> Path:
    path = ptx_path(source, arch)
    ptx = nvrtc_compile(source, arch=arch, name=name, options=NVRTC_OPTIONS)
    cache.count("compiles")
    try:
        cache.atomic_write(path, ptx)
    except OSError as e:        # a read-only cache: this process's own directory instead
        warnings.warn(f"tessera: the kernel cache {path.parent} cannot be used ({e}); "
                      "keeping PTX in a temporary directory", stacklevel=3)
        path = _private_dir() / path.name
        cache.atomic_write(path, ptx)
    return path


def _functions(module, names) -> tuple:
    # CuPy loads (or compiles) a module lazily: get_function is where a driver error surfaces
    return module, {n: module.get_function(n) for n in names}


def _saved_module(program, cupy, names):
    """A loaded file's PTX for the newest saved architecture this device runs (the driver
    compiles it for the device), or None when there is none."""
    have = int(device_arch(cupy)[3:])
    fits = sorted((int(a[3:]), a) for a in program.saved_ptx if int(a[3:]) <= have)
    if not fits:
        return None
    arch = fits[-1][1]
    path = _private_dir() / f"saved-{arch}-{hashlib.sha256(program.saved_ptx[arch]).hexdigest()[:32]}.ptx"
    if not path.exists():
        cache.atomic_write(path, program.saved_ptx[arch])
    return _functions(cupy.RawModule(path=str(path)), names)


def _cuda_module(program, cupy, names) -> tuple:
    source, name = program.target_code, program.graph_ir.name
    if program.saved_ptx:
        module = _saved_module(program, cupy, names)
        if module is not None:
            return module
    try:
        arch = device_arch(cupy)
        path = ptx_path(source, arch)
        fresh = not path.exists()
        if fresh:
            path = _compile_ptx(source, arch, name)
        else:
            cache.count("disk_hits")
    except BackendUnavailableError:         # no NVRTC of ours: CuPy's compiles the source
        return _functions(cupy.RawModule(code=source, options=NVRTC_OPTIONS), names)
    for _ in range(2):
        try:
            return _functions(cupy.RawModule(path=str(path)), names)
        except cupy.cuda.driver.CUDADriverError as e:
            error = e
            if fresh:
                break
            # a cached file the driver refuses: damaged, or from a newer NVRTC; compile it anew
            cache.count("rebuilt_corrupt")
            path.unlink(missing_ok=True)
            path, fresh = _compile_ptx(source, arch, name), True
    warnings.warn(f"tessera: the GPU driver cannot load PTX from NVRTC ({error}); compiling "
                  "with CuPy's NVRTC instead", stacklevel=3)
    return _functions(cupy.RawModule(code=source, options=NVRTC_OPTIONS), names)


def load_module(program, cupy):
    """(RawModule, {kernel name: RawKernel}) of the program, compiled on first use."""
    if program._module is not None:
        return program._module
    names = [k.name for k in program.tile_ir.kernels]
    if not names:                       # every result is an input or a constant
        return None, {}
    # the programs of one shape-generic module (every size it serves) share it, loaded once
    shared = (program.target, program.target_code, cupy.cuda.Device().id) \
        if getattr(program, "dynamic_sizes", None) else None
    with _load_lock:
        if shared is not None and shared in _generic_modules:
            program._module = _generic_modules[shared]
        if program._module is None:
            written = targets.of(program.target).warp   # what its shuffle trees assume
            warp = _properties(cupy).get("warpSize", written)
            if warp != written:
                raise BackendUnavailableError(
                    f"this GPU runs warps of {warp} threads; tessera's {program.target} kernels "
                    f"are written for {written}",
                    hint="the HIP kernels need 64-wide wavefronts: a CDNA GPU (gfx90a, gfx942)")
            if targets.of(program.target).language == "hip":
                program._module = _functions(cupy.RawModule(code=program.target_code,
                                                            options=HIP_OPTIONS), names)
            else:
                program._module = _cuda_module(program, cupy, names)
            if shared is not None:
                _generic_modules[shared] = program._module
    return program._module


def _checked(cupy, program, p, a):
    """One argument checked against its parameter (nothing is copied yet)."""
    if not isinstance(a, cupy.ndarray):
        if not hasattr(a, "__cuda_array_interface__"):
            a = dt.native(np.asarray(a))
        elif not isinstance(getattr(a, "dtype", None), np.dtype):
            a = cupy.asarray(a)         # PyTorch's or Numba's device array: a view, no copy
    if tuple(a.shape) != tuple(p.type.shape) or a.dtype != p.type.dtype.np:
        raise ArgumentError(f"program @{program.graph_ir.name} was specialised for "
                            f"%{p.param_name}: {p.type}", expected=str(p.type),
                            received=str(type_of_array(a)),
                            hint="call the tessera function instead: it specialises anew")
    return a


def _to_device(cupy, program, p, a):
    """On the current device, C-contiguous (another device's array is copied here)."""
    try:
        return cupy.ascontiguousarray(cupy.asarray(a))
    except cupy.cuda.memory.OutOfMemoryError:
        raise ResourceError(f"cannot copy %{p.param_name} ({a.nbytes / 2**30:.2f} GiB) to the "
                            "GPU: its memory is full", function=program.graph_ir.name,
                            received=str(p.type)) from None


def _device_consts(program, cupy) -> dict:
    """The program's constant tensors on the current device (copied once per device)."""
    per_device = program.__dict__.setdefault("_device_consts", {})
    device = cupy.cuda.Device().id
    if device not in per_device:
        per_device[device] = {b.name: cupy.asarray(b.data) for b in program.tile_ir.buffers
                              if b.role == "const"}
    return per_device[device]


_peaks = {}                     # device id -> device_peaks()


def device_peaks() -> dict:
    """The current GPU's peaks for the profiler: its device-to-device copy bandwidth (bytes read
    plus written by a 128 MiB copy, the best of 5 timed by CUDA events, after one warm-up),
    measured once per device and process; no FMA peak is measured (NaN)."""
    cupy = _cupy()
    device = cupy.cuda.Device().id
    if device not in _peaks:
        x = cupy.empty(32 << 20, dtype=cupy.float32)
        y = cupy.empty(32 << 20, dtype=cupy.float32)
        cupy.copyto(y, x)
        best = float("inf")
        for _ in range(5):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            cupy.copyto(y, x)
            end.record()
            end.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, end) / 1e3)
        name = _properties(cupy)["name"]
        _peaks[device] = {"name": name.decode() if isinstance(name, bytes) else str(name),
                          "copy_gbs": 2 * x.nbytes / best / 1e9, "fma_gflops": float("nan")}
    return _peaks[device]


def _status_word(program, cupy):
    """The kernels' status word and workspace. Zeroed for each run where a kernel can flag an
    error or uses workspace; otherwise one word per program and device that no kernel writes,
    and the run returns without waiting for its kernels (CuPy orders what follows on the stream,
    as for its own kernels)."""
    if program.flags_errors or program.tile_ir.workspace:
        return cupy.zeros(1 + program.tile_ir.workspace, dtype=cupy.int32)
    per_device = program.__dict__.setdefault("_idle_status", {})
    device = cupy.cuda.Device().id
    if device not in per_device:
        per_device[device] = cupy.zeros(1, dtype=cupy.int32)
    return per_device[device]


def run(program, arrays) -> list:
    cupy = _require(program.target)
    params = program.graph_ir.params
    if len(arrays) != len(params):
        raise ArgumentError(f"program @{program.graph_ir.name} takes {len(params)} arrays, "
                            f"got {len(arrays)}")
    checked = [_checked(cupy, program, p, a) for p, a in zip(params, arrays)]
    inputs = program.as_parts([_to_device(cupy, program, p, a) for p, a in zip(params, checked)])
    _, functions = load_module(program, cupy)
    consts = _device_consts(program, cupy)
    poison = os.environ.get("TESSERA_POISON") == "1"
    table = {}
    for b in program.tile_ir.buffers:
        if b.role == "input":
            table[b.name] = inputs[b.param]
        elif b.role == "const":
            table[b.name] = consts[b.name]
        else:
            d = b.type.dtype
            try:
                arr = cupy.empty(tuple(b.type.shape), dtype=d.np)
            except cupy.cuda.memory.OutOfMemoryError:
                raise no_memory(program, b) from None
            if poison:
                arr.fill(d.poison)
            table[b.name] = arr
    status = _status_word(program, cupy)
    # a shape-generic module's kernels take the sizes last (compiler/dynamic.py)
    sizes = tuple(np.int64(v) for v in (program.dynamic_sizes or {}).values())
    kernels = {k.name: k for k in program.tile_ir.kernels}
    phases = program.tile_ir.phases
    order = {phase: i for i, ks in enumerate(phases.values())
             for phase in ks}                   # tile kernel -> its schedule kernel's index
    recorder = profiler.current()
    events = []

    def launch_one(name, arrays):
        launch = kernels[name].launch       # grid >= 1 always: an empty tensor loops 0 times
        if recorder is not None:
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
        functions[name]((launch["grid"],), (launch["block"],),
                        tuple(arrays) + (status,) + sizes, shared_mem=launch["shared"])
        if recorder is not None:
            end.record()
            events.append((order[name], start, end))
    failed = tuple(getattr(getattr(cupy.cuda, m, None), n, None) for m, n in
                   (("driver", "CUDADriverError"), ("runtime", "CUDARuntimeError")))
    try:
        HostSteps(program.tile_ir, table, launch_one).run()   # launches, and regions' loops
        code = int(status.get()[0]) if program.flags_errors else 0   # (waits for the kernels)
    except tuple(f for f in failed if f is not None) as e:
        raise DeviceError(f"the GPU failed running @{program.graph_ir.name}: {e}",
                          hint="ts.fault_tolerant and ts.recover_and_continue roll a "
                               "ts.checkpoint loop back to its last checkpoint") from None
    if code:
        raise status_error(program, code)
    if recorder is not None:            # seconds per kernel (summed over a loop's steps)
        if events:
            events[-1][2].synchronize()
        seconds = [0.0] * len(phases)
        for i, s, e in events:
            seconds[i] += cupy.cuda.get_elapsed_time(s, e) / 1e3
        recorder.record(program, seconds)
    return program.as_complex(results(program, table, cupy), cupy)
