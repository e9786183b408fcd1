"""Running CUDA and HIP programs through CuPy.

CUDA: the source is compiled by NVRTC for the device's architecture, the PTX is kept in the
kernel cache (the architecture, NVRTC's version and the options are in its key; written under
a temporary name and renamed), loaded as a `cupy.RawModule` and launched on CuPy arrays. HIP:
the same source path through the ROCm build of CuPy, which compiles with hipRTC and keeps its own
cache. Every kernel has the signature the GPU renderers emit: one pointer per parameter, then
`int* ts_status`, launched on a 1-D grid.

Each launch is timed with CUDA events when a profiler is open. Results are CuPy arrays.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from ..errors import ArgumentError, BackendUnavailableError, RuntimeFault
from ..types import type_of_array
from . import profiler
from .gpu_toolchain import NVRTC_OPTIONS


def _cupy():
    try:
        import cupy
    except ImportError:
        raise BackendUnavailableError(
            "CuPy is not installed, so GPU programs cannot run here",
            hint="pip install 'tessera[cuda]' on a machine with an NVIDIA GPU (fn.lower(..., "
                 "target='cuda') still shows every IR level and the source)") from None
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


def _require(target: str):
    cupy = _cupy()
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
    return cupy


def device_arch(cupy) -> str:
    if cupy.cuda.runtime.is_hip:
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        return props["gcnArchName"].decode() if isinstance(props["gcnArchName"], bytes) \
            else str(props["gcnArchName"])
    return "sm_" + cupy.cuda.Device().compute_capability


def load_module(program, cupy):
    """The program's RawModule, compiled on first use (CUDA: NVRTC into the kernel cache)."""
    if program._module is not None:
        return program._module
    source = program.target_code
    if program.target == "hip":
        module = cupy.RawModule(code=source, options=("-std=c++17",))
    else:
        from . import cache
        from .gpu_toolchain import nvrtc_compile, nvrtc_version
        arch = device_arch(cupy)
        from .. import __version__
        key = hashlib.sha256("\0".join([source, arch, nvrtc_version(), *NVRTC_OPTIONS,
                                        str(cache.SCHEMA_VERSION), __version__]).encode())
        path = cache.cache_dir() / "kernels" / f"{program.target}-{arch}-{key.hexdigest()[:32]}.ptx"
        if not path.exists() or not cache.cache_enabled():
            ptx = nvrtc_compile(source, arch=arch, name=program.graph_ir.name,
                                options=NVRTC_OPTIONS)
            cache.atomic_write(path, ptx)
        try:
            module = cupy.RawModule(path=str(path))
        except cupy.cuda.driver.CUDADriverError:
            # a driver older than our NVRTC's PTX: let CuPy compile with its own NVRTC
            module = cupy.RawModule(code=source, options=NVRTC_OPTIONS)
    program._module = (module, {k.name: module.get_function(k.name)
                                for k in program.tile_ir.kernels})
    return program._module


def run(program, arrays) -> list:
    cupy = _require(program.target)
    params = program.graph_ir.params
    if len(arrays) != len(params):
        raise ArgumentError(f"program @{program.graph_ir.name} takes {len(params)} arrays, "
                            f"got {len(arrays)}")
    inputs = []
    for p, a in zip(params, arrays):
        a = cupy.asarray(a)             # NumPy inputs are copied to the device
        want = p.type.dtype.np
        if a.shape != tuple(p.type.shape) or a.dtype != want:
            raise ArgumentError(f"program @{program.graph_ir.name} was specialised for "
                                f"%{p.param_name}: {p.type}", expected=str(p.type),
                                received=str(type_of_array(a)),
                                hint="call the tessera function instead: it specialises anew")
        inputs.append(cupy.ascontiguousarray(a))
    _, functions = load_module(program, cupy)
    consts = getattr(program, "_device_consts", None)
    if consts is None:
        consts = program._device_consts = {b.name: cupy.asarray(b.data)
                                           for b in program.tile_ir.buffers if b.role == "const"}
    poison = os.environ.get("TESSERA_POISON") == "1"
    table = {}
    for b in program.tile_ir.buffers:
        if b.role == "input":
            table[b.name] = inputs[b.param]
        elif b.role == "const":
            table[b.name] = consts[b.name]
        else:
            d = b.type.dtype
            arr = cupy.empty(tuple(b.type.shape), dtype=d.np)
            if poison:
                arr.fill(np.nan if d.is_float else (True if d.is_bool else -987654321))
            table[b.name] = arr
    status = cupy.zeros(1, dtype=cupy.int32)
    kernels = {k.name: k for k in program.tile_ir.kernels}
    recorder = profiler.current()
    events = []
    for name, args in program.tile_ir.calls:
        k = kernels[name]
        launch = k.launch
        if recorder is not None:
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
        functions[name]((launch["grid"],), (launch["block"],),
                        tuple(table[a] for a in args) + (status,),
                        shared_mem=launch.get("shared", 0))
        if recorder is not None:
            end.record()
            events.append((start, end))
    code = int(status.get()[0])         # synchronises
    if code:
        k = program.schedule_ir.kernels[code - 1]
        node = k.fuses[0]
        raise RuntimeFault(f"an index is out of range in {k.name} (graph node "
                           f"{node.origin or node.op})", function=program.graph_ir.name,
                           location=node.loc, op=node.op,
                           hint="indices must lie in [-n, n) for an axis of size n")
    if recorder is not None:
        recorder.record(program, [cupy.cuda.get_elapsed_time(s, e) / 1e3 for s, e in events])
    results, seen = [], set()
    for b in program.schedule_ir.outputs:
        if b.role == "inline":
            arr = cupy.asarray(b.data)
        else:
            arr = table[b.name]
            if b.role in ("input", "const") or b.name in seen:
                arr = arr.copy()
        seen.add(b.name)
        results.append(arr)
    return results
