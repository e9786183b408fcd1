"""The machine's roofs, measured: the float32 and float64 FMA peaks of all threads and the copy
bandwidth.

`machine_peaks()` runs a small C probe (built with the project's own flags, so it sees the
same vector units and OpenMP runtime as generated code) once per machine and caches the result as
JSON in the cache directory, keyed by the CPU fingerprint and the OpenMP thread count."""
from __future__ import annotations

import ctypes
import json
import math
import os
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from ..errors import first_user_frame
from . import cache

# Bump when the probe or its result format changes: older cached results are then ignored.
PROBE_VERSION = 3

# The probe's C (built with the project's flags: the same vector units and OpenMP as kernels)
_SOURCE = (Path(__file__).parent / "probe.c").read_text()

# Many short timed runs in a few bursts a little apart, keeping the fastest: a run that another
# process interrupts is slow, the shorter the runs the more of them go through whole on a
# shared machine, and the pauses let a neighbour's burst of memory traffic pass.
_FMA_RUN_S = 1e-3             # one timed FMA run
_FMA_RUNS = 10                # per burst
_COPY_CHUNKS = 4              # the copy is timed a quarter of the arrays at a time
_COPY_RUNS = 8                # per burst
_BURSTS = 3
_PAUSE_S = 0.15
_ATTEMPTS_S = 0.75            # a new attempt starts only within this time
_SETTLED = 3                  # settled: this many runs lie within 10% of the best

_lock = threading.Lock()
_memo: dict[str, dict] = {}   # measured in this process (used when the cache is off)
_warned: set[str] = set()


def _library():
    from .isa import host_level
    from .toolchain import build
    lib = build(_SOURCE, "machine probe", host_level())   # the machine's own roof
    lib.tessera_probe_threads.restype = ctypes.c_int
    lib.tessera_probe_threads.argtypes = []
    lib.tessera_probe_chains.restype = ctypes.c_int
    lib.tessera_probe_chains.argtypes = []
    lib.tessera_probe_fma.restype = ctypes.c_double
    lib.tessera_probe_fma.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.tessera_probe_fma64.restype = ctypes.c_double
    lib.tessera_probe_fma64.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.tessera_probe_fill.restype = None
    lib.tessera_probe_fill.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.tessera_probe_copy.restype = ctypes.c_double
    lib.tessera_probe_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def peaks_path(key: str):
    """Where the measured peaks for `key` (CPU fingerprint and thread count) are cached."""
    return cache.cache_dir() / "machine" / f"peaks-v{PROBE_VERSION}-{key}.json"


def machine_peaks(refresh: bool = False) -> dict:
    """This machine's float32 FMA peak and copy bandwidth, measured once and cached.

    Returns a dict: `fma_gflops` (float32 FMA throughput of all OpenMP threads in GFLOP/s, an FMA
    counting as two FLOPs), `fma64_gflops` (the same in float64), `copy_gbs` (a large array copy over all threads, in GB/s counting
    the bytes read and the bytes written), `threads`, `cpu` (the CPU fingerprint the kernel
    cache uses), `key`, `probe` (the probe's version) and `settled` (False when other work kept
    interrupting the probe: the numbers are then likely low).

    Settled results are cached as JSON under `<cache dir>/machine/`, keyed by CPU and thread
    count (OMP_NUM_THREADS); a damaged file is measured again; an unsettled result is returned
    but not cached. `refresh=True` measures again and rewrites the file. With
    `TESSERA_NO_CACHE=1` the probe runs once per process."""
    from .toolchain import cpu_fingerprint
    lib = _library()
    threads = int(lib.tessera_probe_threads())
    fingerprint = cpu_fingerprint()
    key = f"{fingerprint}-{threads}t"
    with _lock:
        if not cache.cache_enabled():
            if refresh or key not in _memo:
                _memo[key] = _result(lib, key, threads, fingerprint)
            return dict(_memo[key])
        path = peaks_path(key)
        if not refresh:
            data = _read(path, key)
            if data is not None:
                return data
        with measuring_lock(path):
            if not refresh:             # another process may have measured while we waited
                data = _read(path, key, quiet=True)
                if data is not None:
                    return data
            data = _result(lib, key, threads, fingerprint)
            if data["settled"]:
                try:
                    cache.atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode())
                except OSError:
                    pass                # an unwritable cache only costs a measurement next time
        return data


def _result(lib, key, threads, fingerprint) -> dict:
    m = measure(lib)
    fma, fma64, copy, settled = m["fma_gflops"], m["fma64_gflops"], m["copy_gbs"], m["settled"]
    if not settled and "unsettled" not in _warned:
        _warned.add("unsettled")
        _warn(f"tessera: the machine was busy while its peaks were measured ({fma:.0f} "
              f"GFLOP/s FMA, {copy:.1f} GB/s copy: likely low), so they are not cached; "
              "measure again on a quiet machine with tessera.machine_peaks(refresh=True)")
    return {"fma_gflops": fma, "fma64_gflops": fma64, "copy_gbs": copy, "threads": threads,
            "cpu": fingerprint,
            "key": key, "probe": PROBE_VERSION, "settled": settled}


def _valid(data, key) -> bool:
    if not isinstance(data, dict) or data.get("key") != key or data.get("probe") != PROBE_VERSION:
        return False
    for name in ("fma_gflops", "fma64_gflops", "copy_gbs"):
        v = data.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            return False
    return isinstance(data.get("threads"), int) and data.get("settled") is True


def _read(path, key, quiet=False):
    """The cached result, or None when missing; a damaged one is reported once and ignored."""
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if _valid(data, key):
        return data
    if not quiet and str(path) not in _warned:
        _warned.add(str(path))
        _warn(f"tessera: damaged machine-peaks cache entry {path}; measuring again")
    return None


def _warn(message: str):
    _, depth = first_user_frame()       # the warning points at the user's line
    warnings.warn(message, RuntimeWarning, stacklevel=depth + 1)


class measuring_lock:
    """An exclusive lock beside the cache file, so that two processes do not run a probe of the
    machine at once (they would halve each other's numbers). Does nothing where flock is
    missing."""

    def __init__(self, path):
        self.path = path.with_name(".probe.lock")
        self.fd = None

    def __enter__(self):
        try:
            import fcntl
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except (ImportError, OSError):
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)         # closing releases the lock
        return False


def _copy_array_bytes() -> int:
    """Bytes per copy array: four times the largest cache (so a quarter of the array is never
    in cache when it is copied again), between 128 and 512 MiB."""
    largest = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            if entry.startswith("index"):
                with open(os.path.join(base, entry, "size")) as f:
                    text = f.read().strip()
                size = int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0)
                largest = max(largest, size)
    except (OSError, ValueError):
        pass
    return min(max(4 * largest, 128 << 20), 512 << 20)


def _settled(times) -> bool:
    """Whether the best time was reached again: a few runs within 10% of it (a time can only
    come out long, never short, so the best of repeated runs is the estimate)."""
    best = min(times)
    return sum(t <= best * 1.1 for t in times) >= _SETTLED


def measure(lib=None) -> dict:
    """Run the probe now: {fma_gflops, fma64_gflops, copy_gbs, settled} (float32's and
    float64's FMA GFLOP/s, copy GB/s; settled: whether the runs agreed). Each number is the best of
    many short runs taken in three bursts (about 0.5 s on a quiet machine, most of it pauses and
    mapping the copy arrays' pages). While the runs do not settle (other work keeps
    interrupting them) it tries again while under 0.75 s have passed, keeping the best."""
    lib = lib or _library()
    threads = int(lib.tessera_probe_threads())
    chains = int(lib.tessera_probe_chains())
    params = np.array([0.999999, 1e-7], np.float32)      # chains settle near 0.1: never subnormal
    out = np.zeros(max(threads, 1), np.float32)

    params64, out64 = params.astype(np.float64), np.zeros(max(threads, 1), np.float64)

    def fma(iters):
        return lib.tessera_probe_fma(params.ctypes.data, iters, out.ctypes.data)

    def fma64(iters):
        return lib.tessera_probe_fma64(params64.ctypes.data, iters, out64.ctypes.data)

    n = _copy_array_bytes() // 4
    chunk = n // _COPY_CHUNKS
    src, dst = np.empty(n, np.float32), np.empty(n, np.float32)
    lib.tessera_probe_fill(src.ctypes.data, dst.ctypes.data, n)

    def copy(i):
        c = (i % _COPY_CHUNKS) * chunk
        return lib.tessera_probe_copy(src[c:].ctypes.data, dst[c:].ctypes.data, chunk)

    start = time.perf_counter()
    fma_gflops = copy_gbs = fma64_gflops = 0.0
    while True:
        # Calibrate: grow a run until it is long enough to time, then size the real runs.
        iters, t = 1024, 0.0
        fma(iters)                                        # wake the thread team
        while iters < (1 << 40):
            t = min(fma(iters) for _ in range(3))
            if t >= 2e-4:
                break
            iters *= 4
        iters = max(1, int(iters * _FMA_RUN_S / max(t, 1e-9)))
        lib.tessera_probe_copy(src.ctypes.data, dst.ctypes.data, n)  # a whole warm-up pass
        fma_times, copy_times, fma64_times = [], [], []
        for burst in range(_BURSTS):
            if burst:
                time.sleep(_PAUSE_S)
            fma_times += [fma(iters) for _ in range(_FMA_RUNS)]
            copy_times += [copy(i) for i in range(_COPY_RUNS)]
            fma64_times += [fma64(iters) for _ in range(_FMA_RUNS)]
        fma_gflops = max(fma_gflops,
                         2.0 * chains * iters * threads / max(min(fma_times), 1e-12) / 1e9)
        copy_gbs = max(copy_gbs, 2.0 * 4 * chunk / max(min(copy_times), 1e-12) / 1e9)
        fma64_gflops = max(fma64_gflops, 2.0 * (chains // 2) * iters * threads /
                           max(min(fma64_times), 1e-12) / 1e9)
        settled = (_settled(fma_times) and _settled(copy_times)
                   and min(fma_times) >= 0.5 * _FMA_RUN_S)   # runs of the intended length
        if settled or time.perf_counter() - start > _ATTEMPTS_S:
            break
        time.sleep(_PAUSE_S)
    if not np.isfinite(out).all() or not np.isfinite(out64).all() or \
            dst[n // 2 + 7] != src[n // 2 + 7]:
        raise AssertionError("the machine probe computed garbage")           # pragma: no cover
    return {"fma_gflops": fma_gflops, "fma64_gflops": fma64_gflops, "copy_gbs": copy_gbs,
            "settled": settled}
