"""The profiler: `with tessera.profiler() as prof: fn(x)` records every kernel launch of the
programs run inside the block on this thread (each kernel timed in the generated C with a
monotonic clock, or by CUDA events on a GPU), and relates each kernel's FLOPs and bytes to the
peaks of what ran it: the CPU's measured FMA peak and copy bandwidth (`machine_peaks`, measured
once by a small probe and cached), a GPU's measured device-to-device copy bandwidth (its
target's `peaks`: `runtime.gpu.device_peaks`; no FMA peak is measured there, so its % peak
stays empty).

    with ts.profiler() as prof:
        for _ in range(10):
            f(x)
    prof.summary()                      # prints the table (and returns it)
    prof.to_pandas()                    # the same rows as a DataFrame (pandas is optional)
    prof.export_chrome_trace("f.json")  # chrome://tracing, ui.perfetto.dev
"""
from __future__ import annotations

import html
import json
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import BackendUnavailableError
from . import cache, targets
from .probe import machine_peaks

__all__ = ["profiler", "Profile", "Launch", "current", "machine_peaks", "MemoryReport",
           "memory_of"]

_state = threading.local()


def current():
    """The recorder programs report to on this thread (the innermost open profile), or None
    outside `with profiler()`."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


def profiler() -> "Profile":
    """A new Profile; use it as a context manager. Inside the block every program run on this
    thread reports its kernels' times to it. Blocks nest (records go to the innermost only), and
    a Profile may be entered again to add more launches to it."""
    return Profile()


@dataclass(frozen=True)
class Launch:
    """One kernel launch: which kernel of which program, how long, and when."""
    function: str               # the program's function name
    shapes: str                 # its symbol bindings ("B=8, S=128"), or its parameter types
    kernel: object              # the Schedule IR kernel
    index: int                  # the kernel's position in its program
    seconds: float              # wall time of this launch (monotonic clock, in the C code)
    start: float                # seconds since the profile began (laid out one after another)
    call: int                   # which program run of this profile the launch belongs to
    thread: int                 # the native id of the thread that ran it
    device: str = "cpu"         # "cpu", or the GPU target ("cuda", "hip") that ran it


# The aggregated rows' columns, in order (also the DataFrame's).
COLUMNS = ("function", "shapes", "index", "kernel", "strategy", "calls", "median_ms", "min_ms",
           "total_ms", "flops", "bytes", "gflops", "gbs", "peak_pct", "bandwidth_pct", "fuses",
           "knobs")


class Profile:
    """Every launch recorded inside `with profiler()` blocks, and their aggregates: one row per
    (function, shapes, kernel) with the median and minimum time, achieved GFLOP/s and GB/s (from
    the median) and their share of the machine's FMA peak and copy bandwidth."""

    def __init__(self):
        self.launches: list[Launch] = []
        self.calls = 0                  # program runs recorded
        self._t0 = time.perf_counter()
        self._peaks = {}                # device -> its peaks
        self._programs = {}             # id -> each program run, in order of its first run
        self._lock = threading.Lock()

    # -- recording -------------------------------------------------------------------------------
    def __enter__(self) -> "Profile":
        stack = getattr(_state, "stack", None)
        if stack is None:
            stack = _state.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc):
        stack = _state.stack
        for i in range(len(stack) - 1, -1, -1):     # the innermost entry of this profile
            if stack[i] is self:
                del stack[i]
                break
        return False

    def record(self, program, seconds) -> None:
        """Called by Program.run after one call, with each kernel's seconds (in kernel order).
        The call's kernels are laid out one after another, ending now."""
        now = time.perf_counter()
        s = program.schedule_ir
        seconds = [float(x) for x in seconds][:len(s.kernels)]
        shapes = _shapes(program)
        thread = threading.get_native_id()
        device = program.target if targets.is_gpu(program.target) else "cpu"
        with self._lock:
            self._programs.setdefault(id(program), program)
            call = self.calls
            self.calls += 1
            start = now - self._t0 - sum(seconds)
            for i, (k, sec) in enumerate(zip(s.kernels, seconds)):
                self.launches.append(Launch(s.name, shapes, k, i, sec, start, call, thread,
                                            device))
                start += sec

    def memory(self) -> list[MemoryReport]:
        """The memory report of each program run in this profile (in order of first run)."""
        return [memory_of(p) for p in list(self._programs.values())]

    # -- aggregates ------------------------------------------------------------------------------
    def peaks(self, device: str = "cpu") -> dict:
        """The peaks the percentages of `device`'s kernels are relative to: its target's
        (a GPU target's `peaks`: the current device's, runtime.gpu.device_peaks), else this
        CPU's (`machine_peaks`)."""
        if device not in self._peaks:
            self._peaks[device] = (targets.of(device).peaks or machine_peaks)()
        return self._peaks[device]

    def rows(self) -> list[dict]:
        """One row per (function, shapes, kernel), in order of first launch; keys: COLUMNS."""
        groups: dict = {}
        for x in list(self.launches):
            k = x.kernel
            key = (x.function, x.shapes, x.index, k.name, k.strategy, k.flops, k.bytes, x.device)
            groups.setdefault(key, []).append(x)
        out = []
        for (fn, shapes, index, name, strategy, flops, nbytes, device), ls in groups.items():
            peaks = self.peaks(device)
            times = [x.seconds for x in ls]
            med = statistics.median(times)
            gflops = flops / med / 1e9 if med > 0 else math.nan
            gbs = nbytes / med / 1e9 if med > 0 else math.nan
            k = ls[0].kernel
            out.append({
                "function": fn, "shapes": shapes, "index": index, "kernel": name,
                "strategy": strategy, "calls": len(times), "median_ms": med * 1e3,
                "min_ms": min(times) * 1e3, "total_ms": sum(times) * 1e3,
                "flops": flops, "bytes": nbytes, "gflops": gflops, "gbs": gbs,
                "peak_pct": 100.0 * gflops / fma_peak(peaks, k),
                "bandwidth_pct": 100.0 * gbs / peaks["copy_gbs"],
                "fuses": " ".join(k.fused_labels()),
                "knobs": ", ".join(f"{a}={b}" for a, b in k.knobs.items())})
        return out

    # -- views -----------------------------------------------------------------------------------
    _HEAD = ("kernel", "strategy", "calls", "median ms", "min ms", "FLOPs", "bytes", "GFLOP/s",
             "GB/s", "% peak", "% bw", "fuses")

    @staticmethod
    def _cells(r) -> list[str]:
        return [r["kernel"], r["strategy"], str(r["calls"]), f"{r['median_ms']:.4f}",
                f"{r['min_ms']:.4f}", _si(r["flops"]), _si(r["bytes"]) + "B",
                f"{r['gflops']:.1f}", f"{r['gbs']:.1f}", _pct(r["peak_pct"]),
                _pct(r["bandwidth_pct"]), r["fuses"]]

    def _caption(self) -> list[str]:
        head = (f"tessera profile: {self.calls} program run{'s' * (self.calls != 1)}, "
                f"{len(self.launches)} kernel launch{'es' * (len(self.launches) != 1)}")
        if not self.launches:
            return [head]
        lines = [head]
        for device in dict.fromkeys(x.device for x in self.launches):
            p = self.peaks(device)
            if device != "cpu":
                lines.append(f"{device} device: {p['name']}, {p['copy_gbs']:.0f} GB/s "
                             "device-to-device copy (no FMA peak measured: % peak empty)")
                continue
            busy = "" if p.get("settled", True) else " (measured on a busy machine: likely low)"
            lines.append(f"machine: {p['fma_gflops']:.0f} GFLOP/s f32 FMA peak"
                         + (f" ({p['fma64_gflops']:.0f} f64)" if p.get("fma64_gflops") else "")
                         + ", "
                         f"{p['copy_gbs']:.1f} GB/s copy, {p['threads']} threads{busy}")
        return lines

    def summary(self, print_it: bool = True) -> str:
        """The table of rows as text, grouped by function and shapes; printed unless
        print_it=False, and returned."""
        rows = self.rows()
        lines = [self._cells(r) for r in rows]
        widths = [max([len(h)] + [len(c[i]) for c in lines]) for i, h in enumerate(self._HEAD)]
        left = {0, 1, len(self._HEAD) - 1}

        def fmt(cells):
            return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

        text = self._caption()
        group = None
        for r, cells in zip(rows, lines):
            if (r["function"], r["shapes"]) != group:
                group = (r["function"], r["shapes"])
                per_call = sum(x["median_ms"] for x in rows
                               if (x["function"], x["shapes"]) == group)
                text += ["", f"@{r['function']} [{r['shapes']}]  {per_call:.4f} ms per call "
                             "(sum of kernel medians)", fmt(self._HEAD)]
            text.append(fmt(cells))
        out = "\n".join(text)
        if print_it:
            print(out)
        return out

    def __str__(self) -> str:
        return self.summary(print_it=False)

    def __repr__(self) -> str:
        return (f"<tessera Profile: {self.calls} program runs, {len(self.launches)} kernel "
                "launches>")

    def _repr_pretty_(self, p, cycle):
        p.text(repr(self) if cycle else str(self))

    def _repr_html_(self) -> str:
        """An HTML table (no ids, no addresses: stable across runs for nbval)."""
        rows = self.rows()
        esc = html.escape
        caption = "<br>".join(esc(x) for x in self._caption())
        out = [f'<table class="tessera-profile"><caption style="text-align:left">{caption}'
               "</caption>"]
        head = "".join(f"<th>{esc(h)}</th>" for h in self._HEAD)
        group = None
        for r in rows:
            if (r["function"], r["shapes"]) != group:
                group = (r["function"], r["shapes"])
                out.append(f'<tr><th colspan="{len(self._HEAD)}" style="text-align:left">'
                           f"@{esc(r['function'])} [{esc(r['shapes'])}]</th></tr><tr>{head}</tr>")
            cells = self._cells(r)
            out.append("<tr>" + "".join(
                f'<td style="text-align:{"left" if i in (0, 1, len(cells) - 1) else "right"}">'
                f"{esc(c)}</td>" for i, c in enumerate(cells)) + "</tr>")
        out.append("</table>")
        return "".join(out)

    def to_pandas(self, launches: bool = False):
        """The rows as a pandas DataFrame (columns: COLUMNS); with launches=True, one row per
        launch instead (function, shapes, index, kernel, strategy, call, thread, start_ms,
        ms, flops, bytes). Needs pandas."""
        try:
            import pandas as pd
        except ImportError:
            raise BackendUnavailableError("Profile.to_pandas needs pandas, which is not installed",
                                          hint="pip install pandas") from None
        if launches:
            cols = ("function", "shapes", "index", "kernel", "strategy", "call", "thread",
                    "start_ms", "ms", "flops", "bytes")
            return pd.DataFrame([(x.function, x.shapes, x.index, x.kernel.name, x.kernel.strategy,
                                  x.call, x.thread, x.start * 1e3, x.seconds * 1e3, x.kernel.flops,
                                  x.kernel.bytes) for x in self.launches], columns=list(cols))
        return pd.DataFrame(self.rows(), columns=list(COLUMNS))

    def chrome_trace(self) -> dict:
        """The Chrome trace-event document: one complete ("X") event per launch, times in µs
        since the profile began, plus process and thread name metadata ("M") events."""
        pid = os.getpid()
        events = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                   "args": {"name": "tessera"}}]
        for tid in dict.fromkeys(x.thread for x in self.launches):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"name": f"tessera kernels (thread {tid})"}})
        for x in self.launches:
            k = x.kernel
            events.append({
                "name": k.name, "cat": k.strategy, "ph": "X", "pid": pid, "tid": x.thread,
                "ts": x.start * 1e6, "dur": x.seconds * 1e6,
                "args": {"function": x.function, "shapes": x.shapes, "call": x.call,
                         "strategy": k.strategy, "flops": k.flops, "bytes": k.bytes,
                         "fuses": " ".join(k.fused_labels()),
                         "knobs": {str(a): _jsonable(b) for a, b in k.knobs.items()}}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path) -> Path:
        """Write the Chrome trace-event JSON to path (atomically); open it in chrome://tracing or
        ui.perfetto.dev. Returns the path."""
        path = Path(path)
        cache.atomic_write(path, json.dumps(self.chrome_trace()).encode())
        return path


# ---- memory --------------------------------------------------------------------------------------
@dataclass(repr=False)
class MemoryReport:
    """What a program holds while it runs, from its memory plan (the Schedule IR's buffers and
    slots): the arguments, the results, the constants, and the temporaries after the planner
    let those whose lifetimes do not overlap share a slot. Scratch a kernel allocates inside
    itself (an FFT's planes, a sort's buffer) is not counted."""
    function: str
    shapes: str
    inputs: int                 # bytes of the arguments
    outputs: int                # bytes of the results
    constants: int              # bytes of the constant arrays the program holds
    temporaries: int            # bytes of the temporaries' slots (after sharing)
    unshared: int               # bytes the temporaries would take each in its own memory
    buffers: list               # a row per buffer: name, role, type, bytes, slot, op, line

    @property
    def peak(self) -> int:
        """Bytes held at once at most: arguments, results, constants and every slot."""
        return self.inputs + self.outputs + self.constants + self.temporaries

    def by_line(self) -> list[dict]:
        """Per user line (in order of first use): bytes of the results and of the temporaries
        its operators write (temporaries before sharing)."""
        out: dict = {}
        for b in self.buffers:
            if b["role"] in ("temp", "output"):
                row = out.setdefault(b["line"], {"line": b["line"], "text": b["text"],
                                                 "outputs": 0, "temporaries": 0, "ops": []})
                row["outputs" if b["role"] == "output" else "temporaries"] += b["bytes"]
                if b["op"] not in row["ops"]:
                    row["ops"].append(b["op"])
        return list(out.values())

    def to_pandas(self, by_line: bool = False):
        import pandas as pd
        return pd.DataFrame(self.by_line() if by_line else self.buffers)

    def __str__(self):
        lines = [f"memory of {self.function} ({self.shapes}): peak {_bytes(self.peak)} = "
                 f"arguments {_bytes(self.inputs)} + results {_bytes(self.outputs)} + constants "
                 f"{_bytes(self.constants)} + temporaries {_bytes(self.temporaries)} (each in "
                 f"its own memory: {_bytes(self.unshared)})",
                 f"  {'results':>10} {'temporaries':>12}  line: ops"]
        for r in self.by_line():
            lines.append(f"  {_bytes(r['outputs']):>10} {_bytes(r['temporaries']):>12}  "
                         f"{r['line'] or '?'}: {' '.join(r['ops'])}")
        return "\n".join(lines)

    def __repr__(self):
        return f"<MemoryReport {str(self).splitlines()[0]}>"

    def _repr_html_(self):
        rows = "".join(f"<tr><td>{html.escape(r['line'])}</td><td><code>{html.escape(r['text'])}"
                       f"</code></td><td>{_bytes(r['outputs'])}</td>"
                       f"<td>{_bytes(r['temporaries'])}</td><td>{html.escape(' '.join(r['ops']))}"
                       f"</td></tr>" for r in self.by_line())
        head = html.escape(str(self).splitlines()[0])
        return (f"<p>{head}</p><table><tr><th>line</th><th>code</th><th>results</th>"
                f"<th>temporaries</th><th>ops</th></tr>{rows}</table>")


def _bytes(n: int) -> str:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def memory_of(program) -> MemoryReport:
    """The MemoryReport of a compiled program (CPU or GPU)."""
    s = program.schedule_ir
    writer = {}                                  # buffer name -> the Graph IR node writing it
    for k in s.kernels:
        group = getattr(k, "group", None)
        writer[k.output.name] = group.root if group is not None else (k.fuses or [None])[-1]
        for value, b in k.stores:
            writer[b.name] = value.node
    rows, total = [], {"input": 0, "output": 0, "const": 0, "temp": 0}
    for b in s.buffers:
        if b.role not in total:
            continue
        total[b.role] += b.nbytes
        n = writer.get(b.name)
        loc = getattr(n, "loc", None)
        op = (n.origin.split(":")[-1] if getattr(n, "origin", None) else n.op) if n else ""
        rows.append({"name": b.ref(), "role": b.role, "type": str(b.type), "bytes": b.nbytes,
                     "slot": b.slot, "op": op, "line": str(loc) if loc else "",
                     "text": getattr(loc, "text", "") or ""})
    return MemoryReport(s.name, _shapes(program), total["input"], total["output"],
                        total["const"], sum(s.slots), total["temp"], rows)


def fma_peak(peaks: dict, kernel) -> float:
    """The FMA peak a kernel's GFLOP/s are measured against: float64's for a kernel writing
    float64 (where the probe measured it), float32's for every other."""
    if kernel.output.type.dtype.name == "float64" and peaks.get("fma64_gflops"):
        return peaks["fma64_gflops"]
    return peaks["fma_gflops"]


def _pct(x) -> str:
    return "-" if math.isnan(x) else f"{x:.1f}"


def _shapes(program) -> str:
    s = program.schedule_ir
    if s.bindings:
        return ", ".join(f"{k}={v}" for k, v in s.bindings.items())
    graph = getattr(program, "graph_ir", None)
    return ", ".join(str(p.type) for p in getattr(graph, "params", ()))


def _si(x) -> str:
    """1234567 -> '1.23M'."""
    x = float(x)
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def _jsonable(v):
    return v if isinstance(v, (bool, int, float, str)) or v is None else str(v)
