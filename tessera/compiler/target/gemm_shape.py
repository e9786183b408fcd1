"""The GEMM micro-kernel's shape, chosen per machine by measurement, not per ISA name.

Cores that share an instruction set want different register blockings: Zen 4 runs AVX-512 on
256-bit halves, Zen 5 and Intel's server cores on two full 512-bit FMA ports, with different load
ports and latencies. So the first routine library built for a vector family (AVX-512, AVX2) on
this machine times each candidate shape (rows of A x vectors of B's columns, its accumulators in
registers) on products run as programs run them (tasks over every thread: a large one and an
MLP layer's) and keeps the fastest by the geometric mean of its rates; the float32 and float64
GEMMs and the convolution's implicit GEMM use it. The direct convolution's micro-tile
(routines/conv.c: output positions broadcast from the laid-out input rows, vectors of output
channels) loads differently, so it is measured apart, the first time a convolution's library is
built, on a convolution (`kernel="conv"`). Each choice is cached as
JSON beside the machine's peaks, keyed by kernel, CPU fingerprint, family, compiler and thread
count.

Every shape computes each element as the same fma chain over k, so the choice never changes a
bit; only speed. `TESSERA_GEMM_SHAPE=4x4` (rows x vectors; `TESSERA_CONV_SHAPE` the direct
convolution's) forces a candidate, `default` the ISA's own shape (the generated-sources record
uses it); levels without vector FMAs have one shape, and so does a process without the cache
(TESSERA_NO_CACHE=1). The C target asks (`target.c.gemm_shape`, `conv_shape`,
`gemm_shape_report`: it hands this module the routine library's text);
`ts.gemm_shape_report()` says what was measured.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import threading

from ...errors import BackendUnavailableError
from ...runtime import cache, isa
from ...runtime.probe import measuring_lock
from ...runtime.toolchain import build, compiler_version, cpu_fingerprint, find_compiler
from ..strategies.routines import routine_text

ENV = "TESSERA_GEMM_SHAPE"
VERSION = 3                     # bump when the probe, the candidates or the routine change

# (rows, vectors) per vector family, the ISA's own first; each fits its registers (AVX-512: 32,
# AVX2: 16) with the B vectors and a broadcast.
CANDIDATES = {"avx512": [(8, 2), (4, 4), (6, 4), (8, 3), (12, 2)],
              "avx2": [(6, 2), (4, 3), (4, 2)]}
PROBE_ROUNDS = 12
MARGIN = 1.03                   # another shape replaces the ISA's own only when this much faster

# per kernel: the variable that forces its shape, its probe's driver (appended to a candidate's
# float32 library) and entry, and the products it times (the driver's arguments, their flops).
# A kernel of several products is scored by the geometric mean of their rates: a shape that
# wins a large product by a little can lose a small one by more (AVX-512 6x4 against 8x2 on a
# Xeon: 4% faster at 2048^3, 3-5% slower at the MLP step's 256 x 784 x 512 in 128 x 128 tiles).
KERNELS = {
    # m, n, k, task tile rows and columns: 1024^3 in 256 x 256 tiles (2.1 GFLOP) and an MLP
    # layer's 256 x 784 x 512 in 128 x 128 (0.2 GFLOP)
    "gemm": {"env": ENV, "what": "GEMM", "driver": routine_text("gemm_shape_probe.c"),
             "probe": "ts_gemm_shape_probe",
             "products": [((1024, 1024, 1024, 256, 256), 2 * 1024 ** 3),
                          ((256, 512, 784, 128, 128), 2 * 256 * 512 * 784)]},
    # 4 images of 128 channels 28x28 by a 3x3 kernel to 128 channels (ResNet's second stage):
    # one task an image, about 0.9 GFLOP a run
    "conv": {"env": "TESSERA_CONV_SHAPE", "what": "direct convolution",
             "driver": routine_text("conv_shape_probe.c"), "probe": "ts_conv_shape_probe",
             "products": [((128, 28), 2 * 4 * 128 * 28 * 28 * 128 * 9)]},
}
_lock = threading.Lock()
_memo: dict[tuple, dict] = {}


def family(level: str) -> str | None:
    """The vector family whose micro-kernel a level's routines compile to, or None (one shape)."""
    needs = isa.LEVELS[level].needs
    if "avx512f" in needs:
        return "avx512"
    if {"avx2", "fma"} <= needs:
        return "avx2"
    return None


def forced(level: str, kernel: str = "gemm"):
    """The kernel's variable ($TESSERA_GEMM_SHAPE, $TESSERA_CONV_SHAPE) for this level: (rows,
    vectors), "default", or None when unset."""
    env = KERNELS[kernel]["env"]
    text = os.environ.get(env, "").strip().lower()
    if not text:
        return None
    if text == "default":
        return "default"
    fam = family(level)
    options = CANDIDATES.get(fam, [])
    try:
        rows, vectors = (int(p) for p in text.split("x"))
    except ValueError:
        rows = vectors = None
    if (rows, vectors) not in options:
        raise BackendUnavailableError(
            f"${env}={text!r} is not a {KERNELS[kernel]['what']} micro-kernel shape of {level}",
            expected=" or ".join(["default"] + [f"{r}x{v}" for r, v in options]),
            hint=f"unset {env} to use the shape measured best on this machine")
    return rows, vectors


def chosen_shape(level: str, library_source, compiler: str | None = None,
                 kernel: str = "gemm"):
    """(rows, vectors) of the kernel's micro-tile ("gemm", or "conv": the direct convolution's)
    for routine libraries built for `level` on this machine, or None for the ISA's own shape
    (levels of one shape, another architecture, a level this CPU cannot run, the kernel's
    variable set to default, or TESSERA_NO_CACHE). `library_source(shape)`: the float32 library
    with that shape (the C target's: GEMM's, or the convolution's)."""
    fam = family(level)
    if fam is None or not isa.runs_here(level):
        return None
    force = forced(level, kernel)
    if force is not None:
        return None if force == "default" else force
    if not cache.cache_enabled():
        return None             # (nothing kept: measuring in every process would cost seconds)
    shape = tuple(report(level, library_source, compiler, kernel=kernel)["shape"])
    return None if shape == CANDIDATES[fam][0] else shape


def report(level: str | None, library_source, compiler: str | None = None,
           refresh: bool = False, kernel: str = "gemm") -> dict:
    """The measurement behind the kernel's choice for `level` (default: the host's): `shape`
    [rows, vectors], `gflops` per candidate ("8x2": GFLOP/s, the geometric mean over the
    kernel's products), `kernel`, `family`, `threads`, `key`. Measured once per machine and cached; `refresh=True` measures again."""
    level = isa.check_level(level or isa.host_level())
    fam = family(level)
    if fam is None or not isa.runs_here(level):
        raise BackendUnavailableError(
            f"{level} has one {KERNELS[kernel]['what']} micro-kernel shape on this machine: "
            "nothing to measure",
            hint="levels with AVX2 or AVX-512 that this CPU runs have candidates")
    cc = find_compiler(compiler)
    threads = os.environ.get("OMP_NUM_THREADS", "").strip() or "all"
    tag = hashlib.sha256(f"{cc}\n{compiler_version(cc)}".encode()).hexdigest()[:8]
    key = f"{cpu_fingerprint()}-{fam}-{tag}-{threads}t"
    with _lock:
        if not cache.cache_enabled():
            if refresh or (kernel, key) not in _memo:
                _memo[kernel, key] = _measure(level, fam, cc, threads, key, library_source,
                                              kernel)
            return dict(_memo[kernel, key])
        path = cache.cache_dir() / "machine" / f"{kernel}-shape-v{VERSION}-{key}.json"
        with measuring_lock(path):       # (two processes measuring at once halve each other)
            data = None if refresh else _read(path, key, fam)
            if data is None:
                data = _measure(level, fam, cc, threads, key, library_source, kernel)
                try:
                    cache.atomic_write(path, json.dumps(data, indent=1).encode())
                except OSError:
                    pass                 # an unwritable cache only costs a measurement next time
        return data


def _read(path, key, fam):
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None                     # missing or damaged: measured again
    ok = isinstance(data, dict) and data.get("key") == key and \
        isinstance(data.get("shape"), list) and tuple(data["shape"]) in CANDIDATES[fam]
    return data if ok else None


def _measure(level, fam, cc, threads, key, library_source, kernel) -> dict:
    k = KERNELS[kernel]
    probes = {}
    for shape in CANDIDATES[fam]:
        lib = build(library_source(shape) + "\n" + k["driver"],
                    f"the {k['what']} shape probe {shape[0]}x{shape[1]}", level, compiler=cc)
        probe = getattr(lib, k["probe"])
        probe.restype = ctypes.c_double
        probe.argtypes = [ctypes.c_int64] * len(k["products"][0][0]) + [ctypes.c_int]
        for args, _ in k["products"]:
            probe(*args, 1)                                            # (warm: pages, threads)
        probes[shape] = probe
    best_s = {(shape, i): float("inf") for shape in probes for i in range(len(k["products"]))}
    for _ in range(PROBE_ROUNDS):       # interleaved, the fastest run of each kept
        for shape, probe in probes.items():
            for i, (args, _) in enumerate(k["products"]):
                s = probe(*args, 1)
                if s > 0:
                    best_s[shape, i] = min(best_s[shape, i], s)
    rate = {shape: math.prod(1e-9 * flops / best_s[shape, i]
                             for i, (_, flops) in enumerate(k["products"]))
            ** (1 / len(k["products"])) for shape in probes}
    gflops = {f"{r}x{v}": g for (r, v), g in rate.items()}
    default = CANDIDATES[fam][0]
    best = max(rate, key=rate.get)
    if rate[best] < rate[default] * MARGIN:
        best = default                  # within the noise: the ISA's own shape
    return {"shape": list(best), "gflops": gflops, "kernel": kernel, "family": fam,
            "level": level, "threads": threads, "key": key, "version": VERSION}
