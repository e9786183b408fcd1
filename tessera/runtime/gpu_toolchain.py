"""Compile checks for generated GPU source, with no GPU needed: CUDA through the NVRTC shared
library (ctypes; the `nvidia-cuda-nvrtc` wheel or the system's CUDA), HIP through `hipcc`.

Both return the compiled artifact (PTX text as bytes, an AMD code object) and raise
`BackendUnavailableError` when the compiler is missing, `CompileError` (with the log and the
numbered source) when it rejects the code.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import shutil
import subprocess
import sys
import tempfile

from ..errors import BackendUnavailableError, CompileError

HIP_TIMEOUT_S = 300


def _nvrtc_candidates() -> list[str]:
    """libnvrtc.so* paths: $TESSERA_NVRTC, the pip wheels beside this interpreter, then the
    system's CUDA (the loader's own search last)."""
    env = os.environ.get("TESSERA_NVRTC")
    found = [env] if env else []
    for base in sys.path:
        found += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvrtc.so*")),
                        reverse=True)
    for root in (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            found += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")), reverse=True)
    found += ["libnvrtc.so"]
    # the builtins library sits beside the real one and is loaded by it, not by us
    return [p for p in found if "builtins" not in os.path.basename(p)]


@functools.lru_cache(maxsize=None)
def nvrtc_library():
    """The NVRTC library (a ctypes CDLL), or BackendUnavailableError."""
    tried = []
    for path in _nvrtc_candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            tried.append(path)
            continue
        c, p, sz = ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t
        lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(p), c, c, ctypes.c_int,
                                           ctypes.POINTER(c), ctypes.POINTER(c)]
        lib.nvrtcCompileProgram.argtypes = [p, ctypes.c_int, ctypes.POINTER(c)]
        for fn in ("nvrtcGetProgramLogSize", "nvrtcGetPTXSize"):
            getattr(lib, fn).argtypes = [p, ctypes.POINTER(sz)]
        for fn in ("nvrtcGetProgramLog", "nvrtcGetPTX"):
            getattr(lib, fn).argtypes = [p, ctypes.c_char_p]
        lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(p)]
        lib.nvrtcGetErrorString.restype = c
        return lib
    raise BackendUnavailableError("NVRTC (the CUDA runtime compiler) is not installed",
                                  received=", ".join(tried[:4]) or None,
                                  hint="pip install nvidia-cuda-nvrtc, or set TESSERA_NVRTC to "
                                       "a libnvrtc.so")


def nvrtc_version() -> str:
    lib = nvrtc_library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


# --fmad=false: the numerics contract writes FMAs explicitly (as -ffp-contract=off does on the
# CPU), so the GPU computes what the source says. No -default-device: every device function
# of ours says __device__, and a host-only mistake should fail here, not at launch.
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false")


def nvrtc_compile(source: str, arch: str = "sm_80", name: str = "tessera.cu",
                  options=NVRTC_OPTIONS) -> bytes:
    """PTX for `source` (CUDA C++ with no #include of system headers) for `arch` (sm_80, ...)."""
    lib = nvrtc_library()
    prog = ctypes.c_void_p()
    _nvrtc_check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(),
                                             0, None, None), "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in (f"--gpu-architecture={arch}", *options)]
        status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        if status != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value + 1)
            lib.nvrtcGetProgramLog(prog, log)
            raise _compile_error(f"NVRTC {nvrtc_version()} rejected {name} for {arch}",
                                 log.value.decode(errors="replace"), source)
        size = ctypes.c_size_t()
        _nvrtc_check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value)
        _nvrtc_check(lib, lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.raw.rstrip(b"\0")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _nvrtc_check(lib, status: int, what: str):
    if status != 0:
        raise CompileError(f"{what} failed: {lib.nvrtcGetErrorString(status).decode()}")


def find_hipcc() -> str:
    path = shutil.which(os.environ.get("HIPCC") or "hipcc")
    if path is None:
        raise BackendUnavailableError("hipcc (the HIP compiler) is not installed",
                                      hint="apt-get install hipcc, or set $HIPCC")
    return path


def hip_compile_check(source: str, arch: str = "gfx90a", name: str = "tessera.hip") -> bytes:
    """An AMD code object for `source` (HIP C++), built by `hipcc --genco` for `arch`."""
    hipcc = find_hipcc()
    with tempfile.TemporaryDirectory(prefix="tessera-hip-") as tmp:
        src, out = os.path.join(tmp, name), os.path.join(tmp, "out.co")
        with open(src, "w") as f:
            f.write(source)
        cmd = [hipcc, "--genco", f"--offload-arch={arch}", "-O3", "-ffp-contract=off",
               src, "-o", out]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HIP_TIMEOUT_S,
                                  env={**os.environ, "HIP_PLATFORM": "amd"})
        except subprocess.TimeoutExpired:
            raise CompileError(f"hipcc took over {HIP_TIMEOUT_S}s on {name}") from None
        except OSError as e:
            raise BackendUnavailableError(f"hipcc cannot be run: {e}") from None
        if proc.returncode != 0:
            raise _compile_error(f"hipcc rejected {name} for {arch} (exit {proc.returncode})",
                                 (proc.stderr or proc.stdout), source)
        with open(out, "rb") as f:
            return f.read()


def _compile_error(head: str, log: str, source: str) -> CompileError:
    lines = log.strip().splitlines()
    numbered = "\n".join(f"  {i:5d} {line}" for i, line in enumerate(source.splitlines(), 1))
    return CompileError(head + "\n" + "\n".join("  | " + line for line in lines[:60])
                        + "\n  source:\n" + numbered)
