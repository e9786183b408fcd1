"""The profiler: `with tessera.profiler() as prof: fn(x)` records every kernel launch of the
programs run inside it (timed in the generated C with a monotonic clock), and relates each
kernel's FLOPs and bytes to the machine's measured FMA peak and copy bandwidth."""
from __future__ import annotations

import contextlib
import ctypes
import html
import json
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BackendUnavailableError
from . import cache

_state = threading.local()


def current():
    """The recorder programs report to on this thread, or None outside `with profiler()`."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


@dataclass
class Launch:
    function: str
    shapes: str
    kernel: object              # the Schedule IR kernel
    index: int                  # its position in the program
    seconds: float
    start: float                # seconds since the profile began


class Profile:
    """Every launch recorded inside one `with profiler()` block, and their aggregates."""

    def __init__(self):
        self.launches: list[Launch] = []
        self._t0 = time.perf_counter()
        self._peaks = None

    def record(self, program, seconds):
        """Called by Program.run with each kernel's time for one call."""
        end = time.perf_counter() - self._t0
        start = end - sum(seconds)
        s = program.schedule_ir
        shapes = ", ".join(f"{k}={v}" for k, v in s.bindings.items()) or \
            ", ".join(str(p.type) for p in program.graph_ir.params)
        for i, (k, sec) in enumerate(zip(s.kernels, seconds)):
            self.launches.append(Launch(s.name, shapes, k, i, float(sec), start))
            start += float(sec)

    # -- aggregates ------------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        """One row per (function, shapes, kernel), in first-launch order."""
        groups: dict = {}
        for launch in self.launches:
            groups.setdefault((launch.function, launch.shapes, launch.index), []).append(launch)
        peaks = self.peaks()
        out = []
        for (fn, shapes, _), ls in groups.items():
            k = ls[0].kernel
            times = [x.seconds for x in ls]
            med = statistics.median(times)
            gflops = k.flops / med / 1e9 if med > 0 else float("nan")
            gbs = k.bytes / med / 1e9 if med > 0 else float("nan")
            out.append({"function": fn, "shapes": shapes, "kernel": k.name,
                        "strategy": k.strategy, "fuses": " ".join(k.fused_labels()),
                        "calls": len(times), "median_ms": med * 1e3, "min_ms": min(times) * 1e3,
                        "flops": k.flops, "bytes": k.bytes, "gflops": gflops, "gbs": gbs,
                        "peak_pct": 100 * gflops / peaks["fma_gflops"],
                        "bandwidth_pct": 100 * gbs / peaks["copy_gbs"]})
        return out

    def peaks(self) -> dict:
        if self._peaks is None:
            self._peaks = machine_peaks()
        return self._peaks

    def summary(self, print_it: bool = True) -> str:
        rows = self.rows()
        head = ("kernel", "strategy", "calls", "median ms", "GFLOP/s", "GB/s", "% peak", "% bw")
        lines = [[r["kernel"], r["strategy"], str(r["calls"]), f"{r['median_ms']:.3f}",
                  f"{r['gflops']:.1f}", f"{r['gbs']:.1f}", f"{r['peak_pct']:.0f}",
                  f"{r['bandwidth_pct']:.0f}"] for r in rows]
        widths = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h)
                  for i, h in enumerate(head)]
        fmt = lambda cells: "  ".join(c.ljust(w) if i < 2 else c.rjust(w)      # noqa: E731
                                      for i, (c, w) in enumerate(zip(cells, widths)))
        p = self.peaks()
        text = [f"tessera profile: {len(self.launches)} launches; machine: "
                f"{p['fma_gflops']:.0f} GFLOP/s FMA peak, {p['copy_gbs']:.1f} GB/s copy "
                f"({p['threads']} threads)", fmt(head)]
        function = None
        for r, cells in zip(rows, lines):
            if (r["function"], r["shapes"]) != function:
                function = (r["function"], r["shapes"])
                text.append(f"@{r['function']} [{r['shapes']}]")
            text.append(fmt(cells))
        out = "\n".join(text)
        if print_it:
            print(out)
        return out

    def to_pandas(self):
        try:
            import pandas as pd
        except ImportError:
            raise BackendUnavailableError("Profile.to_pandas needs pandas",
                                          hint="pip install pandas (or tessera[lab])") from None
        return pd.DataFrame(self.rows())

    def export_chrome_trace(self, path) -> None:
        """Chrome trace-event JSON (chrome://tracing, Perfetto): one complete event per launch."""
        events = [{"name": x.kernel.name, "cat": x.kernel.strategy, "ph": "X", "pid": os.getpid(),
                   "tid": 0, "ts": x.start * 1e6, "dur": x.seconds * 1e6,
                   "args": {"function": x.function, "shapes": x.shapes, "flops": x.kernel.flops,
                            "bytes": x.kernel.bytes, "fuses": " ".join(x.kernel.fused_labels())}}
                  for x in self.launches]
        cache.atomic_write(Path(path),
                           json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}).encode())

    def __str__(self):
        return self.summary(print_it=False)

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))

    def _repr_html_(self):
        rows = self.rows()
        cols = ["kernel", "strategy", "fuses", "calls", "median_ms", "gflops", "gbs", "peak_pct",
                "bandwidth_pct"]
        head = "".join(f"<th>{c}</th>" for c in cols)
        body = "".join("<tr>" + "".join(
            f"<td>{html.escape(str(r[c]) if isinstance(r[c], (str, int)) else f'{r[c]:.3g}')}</td>"
            for c in cols) + "</tr>" for r in rows)
        return f"<table class=\"tessera-profile\"><tr>{head}</tr>{body}</table>"


@contextlib.contextmanager
def profiler():
    """Record every kernel launch on this thread inside the block (nestable: the innermost
    profile records)."""
    prof = Profile()
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(prof)
    try:
        yield prof
    finally:
        stack.remove(prof)


# ---- the machine's peaks --------------------------------------------------------------------------
_PROBE = r"""
#include <math.h>
#include <stdint.h>
#include <omp.h>
/* b[0]: float out[256]; b[1]: int64 iterations. Independent fma chains per thread. */
int tessera_entry(void** b) {
  float* out = (float*)b[0];
  int64_t iters = *(int64_t*)b[1];
  #pragma omp parallel
  {
    float acc[128];
    int t = omp_get_thread_num();
    for (int i = 0; i < 128; ++i) acc[i] = 1e-3f * (float)(i + t + 1);
    float m = out[255], a = out[254];
    for (int64_t it = 0; it < iters; ++it) {
      #pragma omp simd
      for (int i = 0; i < 128; ++i) acc[i] = fmaf(acc[i], m, a);
    }
    float s = 0;
    for (int i = 0; i < 128; ++i) s += acc[i];
    if (t < 250) out[t] = s;
  }
  return 0;
}
/* b[0]: src, b[1]: dst, b[2]: int64 n */
int tessera_copy(void** b) {
  const float* restrict src = (const float*)b[0];
  float* restrict dst = (float*)b[1];
  int64_t n = *(int64_t*)b[2];
  #pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
  return 0;
}
int tessera_threads(void) { return omp_get_max_threads(); }
int tessera_entry_timed(void** b, double* t) { (void)t; return tessera_entry(b); }
"""
_peaks_lock = threading.Lock()


def machine_peaks(refresh: bool = False) -> dict:
    """This machine's float32 FMA peak (GFLOP/s, all threads) and copy bandwidth (GB/s, read +
    write), measured once by a small probe and cached per CPU and thread count."""
    from .toolchain import build, cpu_fingerprint
    lib = build(_PROBE, "machine_probe")
    lib.tessera_threads.restype = ctypes.c_int
    threads = lib.tessera_threads()
    key = f"{cpu_fingerprint()}-{threads}"
    path = cache.cache_dir() / "machine" / f"{key}.json"
    with _peaks_lock:
        if not refresh and cache.cache_enabled():
            try:
                data = json.loads(path.read_text())
                if data.get("key") == key and data["fma_gflops"] > 0 and data["copy_gbs"] > 0:
                    return data
            except (OSError, ValueError, KeyError, TypeError):
                pass                        # missing or damaged: measure again
        data = {"key": key, "threads": threads, **_measure(lib)}
        if cache.cache_enabled():
            try:
                cache.atomic_write(path, json.dumps(data, indent=1).encode())
            except OSError:
                pass                        # an unwritable cache only costs a re-measure
        return data


def _measure(lib) -> dict:
    out = np.zeros(256, np.float32)
    out[255], out[254] = 0.999999, 1e-7
    iters = np.array([200_000], np.int64)
    args = (ctypes.c_void_p * 2)(out.ctypes.data, iters.ctypes.data)
    lib.tessera_entry(args)                                 # warm up the threads
    threads = lib.tessera_threads()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        lib.tessera_entry(args)
        best = min(best, time.perf_counter() - t)
    fma = 2 * 128 * iters[0] * threads / best / 1e9
    n = 32 << 20                                             # 128 MiB per array
    src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
    count = np.array([n], np.int64)
    cargs = (ctypes.c_void_p * 3)(src.ctypes.data, dst.ctypes.data, count.ctypes.data)
    lib.tessera_copy(cargs)
    best = float("inf")
    for _ in range(4):
        t = time.perf_counter()
        lib.tessera_copy(cargs)
        best = min(best, time.perf_counter() - t)
    return {"fma_gflops": float(fma), "copy_gbs": float(2 * 4 * n / best / 1e9)}
