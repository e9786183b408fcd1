"""Debugging tools: where the first NaN or Inf came from, which operator first parts from a
reference, a failing call saved to be replayed elsewhere, and what a program holds in memory.

    with ts.debug_mode():            # or ts.debug.numerical() / ts.debug.semantic()
        loss = step(params, batch)   # NumericalError at the operator and line of the first NaN

    report = ts.debug.compare(fn, x, against="float64")   # operator by operator
    ts.debug.dump("bad.tsdebug", fn, x);  ts.debug.replay("bad.tsdebug")
    ts.profile_memory(fn, x)         # peak, results, temporaries, line by line
    ts.analyze_performance(fn, x)    # kernels ranked, against the roofline, with suggestions

Debug mode runs a call through a probe: the same program compiled with every operator's result
kept as an output (fusion still fuses; the kernels write what they would have thrown away), so
each operator's values are the compiled code's own. Off, nothing changes: a call reads one
hook (function/extensions.py), set only while a debug block is open in some thread (`on`
counts them). A program's probe is compiled once and kept with it.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import math
import os
import pickle
import platform
import threading
import zipfile
from dataclasses import dataclass, field

import numpy as np

from . import dtypes as dt
from .errors import ArgumentError, TesseraError
from .function import Function, extensions
from .version import __version__

log = logging.getLogger("tessera.debug")
_state = threading.local()
on = 0                          # debug blocks open in any thread: a call's whole cost when 0
_count = threading.Lock()


class NumericalError(TesseraError):
    """An operator produced NaN or Inf from finite inputs (found by debug mode)."""


# ---- switching it on ----------------------------------------------------------------------------
def active() -> frozenset:
    """The checks on in this thread: {"numerical", "semantic"}, or empty."""
    return getattr(_state, "checks", frozenset())


@contextlib.contextmanager
def _checks(*names):
    global on
    before = active()
    _state.checks = before | frozenset(names)
    with _count:
        on += 1
        extensions.register(debug=(active, checked_call))   # calls look while a block is open
    try:
        yield
    finally:
        _state.checks = before
        with _count:
            on -= 1
            if not on:
                extensions.register(debug=None)


def debug_mode():
    """``with ts.debug_mode():`` every tessera function called in the block checks its
    operators' results (numerical) and logs each operator's shapes (semantic)."""
    return _checks("numerical", "semantic")


def numerical():
    """``with ts.debug.numerical():`` the first NaN or Inf an operator produces from finite
    inputs is a NumericalError naming the operator and the line, with its inputs' statistics."""
    return _checks("numerical")


def semantic():
    """``with ts.debug.semantic():`` each operator's line and result type are logged (logger
    ``tessera.debug``, level INFO) as calls run. Indices out of range are RuntimeFaults with or
    without it."""
    return _checks("semantic")


# ---- the probe: every operator's result -----------------------------------------------------------
def _observed(g) -> list:
    """The nodes whose results a probe keeps: all but constants."""
    return [n for n in g.nodes if n.op != "const"]


def _probe(prog):
    """The program of prog's Graph IR with every operator's result an output too, after the
    graph's own outputs (made once per program)."""
    probe = getattr(prog, "_debug_probe", None)
    if probe is None:
        from .compiler.driver import compile_graph
        g = prog.graph_ir.clone()
        g.outputs = list(g.outputs) + [n.out for n in _observed(g)]
        g.output_tree, g.output_structure = None, "list"
        probe = prog._debug_probe = (compile_graph(g, prog.target), g)
    return probe


def _host(a) -> np.ndarray:
    return np.asarray(a.get() if hasattr(a, "__cuda_array_interface__") else a)


def _values(prog, arrays: list):
    """(the call's results, {value id: array} of the parameters and every operator's result,
    the probe's graph)."""
    probe, g = _probe(prog)
    out = probe.run(*arrays)
    k = len(prog.graph_ir.outputs)
    env = {p.id: _host(a) for p, a in zip(g.params, arrays)}
    env.update((n.out.id, _host(a)) for n, a in zip(_observed(g), out[k:]))
    for n in g.nodes:
        if n.op == "const":
            env[n.out.id] = np.asarray(n.attrs["value"])
    return out[:k], env, g


def _interpreted(prog, arrays: list):
    """As _values, for a program in parts (tessera/compiler/driver.py's SplitProgram): the
    graph evaluated with the NumPy references, host calls run by the host."""
    g = prog.graph_ir
    env = {p.id: _host(a) for p, a in zip(g.params, arrays)}

    def keep(r, n):
        env[n.out.id] = np.asarray(r, dtype=n.out.type.dtype.np)
        return env[n.out.id]
    return g.evaluate(arrays, keep=keep), env, g


def checked_call(fn, args, kwargs):
    """A tessera Function's call in debug mode (Function.__call__ comes here)."""
    prog, arrays = fn._program(args, kwargs, fn.target)
    if not hasattr(prog, "graph_ir") or not prog.graph_ir.outputs:   # (nothing runs)
        return _structured(prog, prog.run())
    if hasattr(prog, "parts"):      # cut at host calls: no probe; the operators interpreted
        results, env, g = _interpreted(prog, list(arrays.values()))
    else:
        results, env, g = _values(prog, list(arrays.values()))
    checks = active()
    if "semantic" in checks:
        for n in _observed(g):
            log.info("%s %s: %s -> %s", n.loc or g.name, n.op,
                     ", ".join(str(v.type) for v in n.inputs), n.out.type)
    if "numerical" in checks:
        _first_non_finite(g, env)
    return _structured(prog, results)


def _structured(prog, out):
    if prog.output_tree is not None:
        return prog.output_tree.unflatten(out)
    s = prog.output_structure
    return out[0] if s in (None, "single") else (tuple(out) if s == "tuple" else list(out))


# ---- NaN and Inf ------------------------------------------------------------------------------------
SUGGESTIONS = {
    "exp": "exp overflows above 88 in float32: use op.softmax or op.logsumexp, or subtract the "
           "maximum first",
    "log": "log of zero or of a negative number: add a small eps, or use op.log_softmax",
    "div": "division by zero (a variance or a norm that is 0?): add eps to the denominator",
    "rsqrt": "rsqrt of zero or of a negative number: add eps (as layernorm does)",
    "sqrt": "sqrt of a negative number: clamp at 0 first, or add eps",
    "pow": "pow of a negative base to a non-integer power, or an overflow: check the base's sign",
    "matmul": "a sum of products overflowed: scale the inputs or accumulate in float64",
    "sum": "a sum overflowed: scale the inputs or accumulate in float64",
    "mul": "a product overflowed (or 0 times Inf)",
    "sub": "Inf - Inf: an overflow upstream of it",
    "cast": "the value does not fit the narrower dtype: scale it or keep the wider one",
}


def _is_float(a) -> bool:
    return a.dtype.kind in "fc" or a.dtype == dt.bfloat16.np


def _finite(a) -> bool:
    return not _is_float(a) or bool(np.isfinite(a.astype(np.complex128 if a.dtype.kind == "c"
                                                           else np.float64)).all())


def stats(a) -> dict:
    """min, max, mean, std of the finite values, and the counts of NaN and Inf."""
    a = np.asarray(a)
    if a.dtype.kind == "c":
        a = np.abs(a.astype(np.complex128))
    x = a.astype(np.float64).ravel()
    ok = x[np.isfinite(x)]
    pick = (lambda f: float(f(ok))) if ok.size else (lambda f: float("nan"))
    return {"shape": tuple(a.shape), "min": pick(np.min), "max": pick(np.max),
            "mean": pick(np.mean), "std": pick(np.std), "nan": int(np.isnan(x).sum()),
            "inf": int(np.isinf(x).sum())}


def _describe(name, s) -> str:
    return (f"{name}: {list(s['shape'])} min {s['min']:.4g} max {s['max']:.4g} mean "
            f"{s['mean']:.4g} std {s['std']:.4g} NaN {s['nan']} Inf {s['inf']}")


def _name(v) -> str:
    return f"%{v.param_name}" if v.param_name else f"%{v.node.op}"


def _first_non_finite(g, env):
    for p in g.params:
        a = env[p.id]
        if not _finite(a):
            s = stats(a)
            raise NumericalError(f"the argument %{p.param_name} holds {s['nan']} NaN and "
                                 f"{s['inf']} Inf", function=g.name,
                                 received=_describe(f"%{p.param_name}", s))
    finite = {}                                 # value id -> whether it is finite (once each)

    def ok(v):
        if v.id not in finite:
            finite[v.id] = _finite(env[v.id])
        return finite[v.id]
    for n in _observed(g):
        a = env[n.out.id]
        if ok(n.out) or not all(ok(v) for v in n.inputs):
            continue
        s = stats(a)
        inputs = "\n    ".join(_describe(_name(v), stats(env[v.id])) for v in n.inputs)
        raise NumericalError(
            f"{n.op} produced {s['nan']} NaN and {s['inf']} Inf (of {a.size} values) from "
            f"finite inputs", function=g.name, location=n.loc, op=n.op,
            received="its inputs\n    " + inputs if inputs else None,
            hint=SUGGESTIONS.get(n.op))


# ---- differential debugging ---------------------------------------------------------------------
def default_rtol(d) -> float:
    """The tolerance `compare` states by default: the square root of the dtype's epsilon (half
    its digits: 3.4e-4 for float32 and complex64, 1.5e-8 for float64, 0.031 for float16, 0.088
    for bfloat16); 0 for integers and bools (exact)."""
    d = np.dtype(d)
    if d == dt.bfloat16.np:
        return float(np.sqrt(2.0 ** -7))
    return float(np.sqrt(np.finfo(d).eps)) if d.kind in "fc" else 0.0


@dataclass(repr=False)
class Comparison:
    """`compare`'s report: a row per operator, in program order."""
    against: str
    rows: list = field(default_factory=list)

    @property
    def first(self) -> dict | None:
        """The first operator beyond its tolerance (None: none is)."""
        return next((r for r in self.rows if not r["ok"]), None)

    def table(self):
        """The rows as a pandas DataFrame."""
        try:
            import pandas as pd
        except ImportError:
            raise ArgumentError("Comparison.table needs pandas",
                                hint="pip install pandas (or read .rows)") from None
        return pd.DataFrame(self.rows)

    def __str__(self):
        head = f"{'#':>3} {'op':<12} {'dtype':<9} {'rel err':>10} {'rtol':>9}  line"
        lines = [f"tessera against {self.against}", head]
        for r in self.rows:
            mark = "" if r["ok"] else "  <- first beyond its tolerance" if r is self.first else "  x"
            lines.append(f"{r['index']:>3} {r['op']:<12} {r['dtype']:<9} {r['rel_err']:>10.3g} "
                         f"{r['rtol']:>9.2g}  {r['line']}{mark}")
        return "\n".join(lines)

    def __repr__(self):
        first = self.first
        return (f"<Comparison against {self.against}: " +
                ("every operator within its tolerance>" if first is None else
                 f"first beyond its tolerance {first['op']} at {first['line']}>"))

    def _repr_html_(self):
        first = self.first
        what = "every operator within its tolerance" if first is None else (
            f"first beyond its tolerance: <b>{first['op']}</b> at {first['line']} "
            f"(relative error {first['rel_err']:.3g}, tolerance {first['rtol']:.2g})")
        try:
            body = self.table().to_html(index=False)
        except ArgumentError:
            body = f"<pre>{self}</pre>"
        return f"<p>tessera against {self.against}: {what}</p>{body}"


def _wide(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    return a.astype(np.float64) if _is_float(a) else a


def _reference_values(g, arrays, wide: bool) -> dict:
    """{value id: array} of every operator's result: the probe's graph evaluated with the
    NumPy references (Graph.evaluate), in the graph's dtypes or (wide) with every float kept in
    float64 and every complex in complex128."""
    keep = (lambda r, n: _wide(r)) if wide else None
    out = g.evaluate([_wide(a) for a in arrays] if wide else arrays, keep)
    observed = _observed(g)
    return {n.out.id: a for n, a in zip(observed, out[len(out) - len(observed):])}


def _errors(got, ref) -> tuple[float, float]:
    """(max |got - ref|, max |got - ref| / max |ref|) over the values; the relative error is 0
    where both agree exactly, NaN and Inf in the same places included."""
    g, r = _wide(got), _wide(ref)
    if not _is_float(g):
        exact = 0.0 if np.array_equal(g, r) else float("inf")
        return exact, exact
    with np.errstate(invalid="ignore"):
        d = np.abs(g - r)
    absolute = 0.0 if g.size == 0 else \
        float(np.nanmax(d)) if np.isfinite(d).any() else float(d.max())
    same = (g == r) | (np.isnan(g) & np.isnan(r))
    if same.all():
        return absolute, 0.0
    if not (np.isfinite(g[~same]).all() and np.isfinite(r[~same]).all()):
        return absolute, float("inf")
    scale = np.abs(r[np.isfinite(r)]).max(initial=0.0)
    return absolute, float(d[~same].max()) / scale if scale > 0 else float("inf")


def compare(fn, *args, against="interpret", rtol: float | None = None, **kwargs) -> Comparison:
    """Run fn's compiled program on these arguments operator by operator beside a reference and
    report each operator's relative error (max |got - ref| / max |ref|) against its tolerance
    (`rtol`, or the square root of its dtype's epsilon: `default_rtol`).

    against: "interpret" (each operator's NumPy reference, in the program's dtypes, on the
    program's own inputs), "float64" (the same in float64 and complex128 throughout, from the
    same arguments: where rounding in the narrow dtype loses the answer), a target ("cuda",
    "hip", "cpu:LEVEL": the same program compiled there, every operator's result read back:
    where two targets part), or a callable (a PyTorch or NumPy function of the same arguments:
    its results against the program's)."""
    fn = fn if isinstance(fn, Function) else Function(fn)
    prog, arrays = fn._program(args, kwargs, fn.target)
    if not hasattr(prog, "schedule_ir"):
        raise ArgumentError(f"{fn.name} computes nothing to compare (all its results are static)")
    results, env, g = _values(prog, list(arrays.values()))
    report = Comparison(against if isinstance(against, str) else
                        getattr(against, "__name__", repr(against)))

    def row(i, op, loc, got, ref):
        tol = rtol if rtol is not None else default_rtol(np.asarray(got).dtype)
        absolute, err = _errors(got, ref)
        report.rows.append({"index": i, "op": op, "line": str(loc) if loc else "",
                            "shape": tuple(np.shape(got)), "dtype": str(np.asarray(got).dtype),
                            "max_abs_err": absolute, "rel_err": float(err),
                            "rtol": float(tol), "ok": bool(err <= tol)})
    if callable(against):
        refs = against(*args, **kwargs)
        refs = list(refs) if isinstance(refs, (tuple, list)) else [refs]
        for i, (got, ref) in enumerate(zip(results, refs)):
            ref = ref.detach().cpu().numpy() if hasattr(ref, "detach") else np.asarray(ref)
            row(i, "result", None, _host(got), ref)
        return report
    params = [env[p.id] for p in g.params]
    if against in ("interpret", "float64"):
        ref = _reference_values(g, params, wide=against == "float64")
    elif _is_target(against):
        ref = _target_values(g, against, params)
    else:
        from .runtime import targets
        raise ArgumentError(f"compare against {against!r}?", expected="'interpret', 'float64', "
                            f"a target ({', '.join(map(repr, targets.names()))}, 'cpu:LEVEL') "
                            "or a callable")
    for i, n in enumerate(_observed(g)):
        row(i, n.op, n.loc, env[n.out.id], ref[n.out.id])
    return report


def _is_target(name) -> bool:
    from .runtime import targets
    try:
        targets.of(name)
        return True
    except TesseraError:
        return False


def _target_values(g, target: str, params) -> dict:
    """{value id: array}: the probe's graph compiled for another target (a GPU, another CPU
    level) and run on the same arguments, every operator's result read back."""
    from .compiler.driver import compile_graph
    out = compile_graph(g, target, output_structure="list").run(*params)
    observed = _observed(g)
    return {n.out.id: _host(a) for n, a in zip(observed, out[len(out) - len(observed):])}


# ---- memory ----------------------------------------------------------------------------------------
def profile_memory(fn, *args, **kwargs):
    """The memory report (peak, arguments, results, temporaries, line by line) of fn's program
    for these arguments: ``ts.profile_memory(fn, x)``. As a decorator (``@ts.profile_memory``)
    the function runs as before and keeps the report of its latest call in `.memory`."""
    f = fn if isinstance(fn, Function) else Function(fn)
    if args or kwargs:
        return f.lower(*args, **kwargs).memory()

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out = f(*args, **kwargs)
        prog = f.programs.last
        wrapper.memory = prog.memory() if hasattr(prog, "schedule_ir") else None
        return out
    wrapper.memory = None
    return wrapper


# ---- bottlenecks ---------------------------------------------------------------------------------
ROOF_LOW = 0.25                 # a kernel under this share of its roof is worth a search
NARROW = {"float32": "bfloat16", "float64": "float32"}


@dataclass(repr=False)
class PerformanceReport:
    """`analyze_performance`'s answer: the kernels ranked by time, each against its roof, and
    suggestions, each with the measured numbers behind it."""
    function: str
    peaks: dict
    rows: list
    suggestions: list
    profile: object             # the Profile it measured (ts.viz.roofline_figure draws it)

    def __repr__(self):
        return f"<PerformanceReport {str(self).splitlines()[0]}>"

    def to_pandas(self, suggestions: bool = False):
        import pandas as pd
        return pd.DataFrame(self.suggestions if suggestions else self.rows)

    def __str__(self):
        lines = [f"{self.function}: {len(self.rows)} kernels; roofs {self.peaks['fma_gflops']:.0f}"
                 f" GFLOP/s, {self.peaks['copy_gbs']:.1f} GB/s",
                 f"  {'kernel':<22} {'share':>6} {'ms':>9} {'FLOP/B':>7} {'bound':<8} "
                 f"{'% roof':>6}  fuses"]
        for r in self.rows:
            lines.append(f"  {r['kernel']:<22} {r['share']:>6.1%} {r['median_ms']:>9.4f} "
                         f"{r['intensity']:>7.2f} {r['bound']:<8} {r['roof_pct']:>6.1f}  "
                         f"{r['fuses']}")
        lines += ["suggestions:"] + [f"  - {x['kernel']}: {x['suggestion']}"
                                     for x in self.suggestions] or ["  (none)"]
        return "\n".join(lines)

    def _repr_html_(self):
        import html as h
        head = "".join(f"<th>{c}</th>" for c in ("kernel", "share", "median ms", "FLOP/B",
                                                  "bound", "% of roof", "fuses"))
        body = "".join(
            f"<tr><td>{h.escape(r['kernel'])}</td><td>{r['share']:.1%}</td>"
            f"<td>{r['median_ms']:.4f}</td><td>{r['intensity']:.2f}</td><td>{r['bound']}</td>"
            f"<td>{r['roof_pct']:.1f}</td><td>{h.escape(r['fuses'])}</td></tr>" for r in self.rows)
        tips = "".join(f"<li><b>{h.escape(x['kernel'])}</b>: {h.escape(x['suggestion'])}</li>"
                       for x in self.suggestions) or "<li>none</li>"
        return (f"<p>{h.escape(str(self).splitlines()[0])}</p><table><tr>{head}</tr>{body}"
                f"</table><p>suggestions</p><ul>{tips}</ul>")


def analyze_performance(fn, *args, repeat: int = 10, **kwargs) -> PerformanceReport:
    """Profile fn on these arguments (`repeat` calls after a warm-up) and rank its kernels by
    time, each placed against the roofline of the measured peaks (memory-bound below the ridge
    FMA peak / copy bandwidth, compute-bound above) with the share of its roof it reaches.
    Suggestions, each with the numbers it rests on: a temporary written by one memory-bound
    kernel and read back by another (the time that round trip costs at the measured bandwidth,
    if fusion's rules could be made to take it), a memory-bound kernel in a narrower dtype
    (the bytes it would save), a kernel far under its roof that has knobs to search."""
    from .compiler import strategies
    from .compiler.scheduler import knob_space
    from .runtime.profiler import fma_peak, profiler
    f = fn if isinstance(fn, Function) else Function(fn)
    prog = f.lower(*args, **kwargs)
    if not hasattr(prog, "schedule_ir") or not prog.schedule_ir.kernels:
        raise ArgumentError(f"{f.name} runs no kernel to analyse")
    f(*args, **kwargs)
    with profiler() as prof:
        for _ in range(max(1, repeat)):
            f(*args, **kwargs)
    device = prog.target if prog.target in ("cuda", "hip") else "cpu"
    peaks = prof.peaks(device)
    bw = float(peaks["copy_gbs"])
    mine = [r for r in prof.rows() if r["function"] == prog.schedule_ir.name]
    total = sum(r["median_ms"] for r in mine) or 1.0
    kernels = {k.name: k for k in prog.schedule_ir.kernels}
    rows = []
    for r in sorted(mine, key=lambda r: -r["median_ms"]):
        fma = fma_peak(peaks, kernels[r["kernel"]])       # (NaN on a GPU: no FMA peak there)
        ridge = fma / bw if fma == fma else math.inf
        intensity = r["flops"] / r["bytes"] if r["bytes"] else math.inf
        memory = intensity < ridge
        roof = bw * intensity if memory else fma
        rows.append({"kernel": r["kernel"], "strategy": r["strategy"], "share": r["median_ms"] / total,
                     "median_ms": r["median_ms"], "flops": r["flops"], "bytes": r["bytes"],
                     "intensity": intensity, "bound": "memory" if memory else "compute",
                     "gflops": r["gflops"], "gbs": r["gbs"],
                     "roof_pct": 100.0 * (r["gbs"] / bw if memory else r["gflops"] / fma),
                     "fuses": r["fuses"]})
    by_name = {r["kernel"]: r for r in rows}
    tips = []
    readers: dict = {}
    for k in prog.schedule_ir.kernels:
        for b in k.inputs:
            readers.setdefault(b.name, []).append(k.name)
    for k in prog.schedule_ir.kernels:
        r = by_name.get(k.name)
        for b in k.outputs:
            users = readers.get(b.name, [])
            if b.role == "temp" and r and r["bound"] == "memory" and len(users) == 1 and \
                    by_name.get(users[0], {}).get("bound") == "memory":
                ms = 2 * b.nbytes / bw / 1e6
                tips.append({"kernel": k.name, "suggestion":
                             f"its temporary {b.name} ({_mib(b.nbytes)}) is written here and read "
                             f"back by {users[0]}: fused, about {ms:.3f} ms less at the measured "
                             f"{bw:.1f} GB/s (fusion's rules kept them apart)", "saving_ms": ms})
    for r in rows:
        k = kernels[r["kernel"]]
        narrow = NARROW.get(k.output.type.dtype.name)
        if r["bound"] == "memory" and narrow and r["share"] >= 0.05:
            ms = r["median_ms"] / 2
            tips.append({"kernel": r["kernel"], "suggestion":
                         f"memory-bound at {r['gbs']:.1f} GB/s on {_mib(r['bytes'])}: in {narrow} "
                         f"it would move half the bytes, about {ms:.3f} ms less", "saving_ms": ms})
        if r["roof_pct"] < 100 * ROOF_LOW and r["share"] >= 0.05 and knob_space(k, os.cpu_count() or 1):
            tips.append({"kernel": r["kernel"], "suggestion":
                         f"{r['roof_pct']:.0f}% of its {r['bound']} roof with the heuristics' "
                         f"knobs ({', '.join(f'{a}={b}' for a, b in k.knobs.items())}): "
                         f"ts.autotune({f.name}, ...) searches {strategies.of(k).name}'s knobs",
                         "saving_ms": None})
    tips.sort(key=lambda x: -(x["saving_ms"] or 0.0))
    return PerformanceReport(f.name, peaks, rows, tips, prof)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


# ---- replay ---------------------------------------------------------------------------------------
FORMAT = "tessera-debug-replay/1"


def dump(path, fn, *args, **kwargs) -> str:
    """Write one call of fn to `path`: its arguments, its Graph IR, the target, the generated
    source, its results (or the error it raised) and the versions; `replay` runs it again. The
    file holds pickled Graph IR: replay only files you made (as with any pickle)."""
    fn = fn if isinstance(fn, Function) else Function(fn)
    prog, arrays = fn._program(args, kwargs, fn.target)
    if not hasattr(prog, "schedule_ir"):
        raise ArgumentError(f"{fn.name} computes nothing to dump (all its results are static)")
    inputs = [_host(a) for a in arrays.values()]
    try:
        outputs, error = [_host(a) for a in prog.run(*arrays.values())], None
    except TesseraError as e:
        outputs, error = [], str(e)
    manifest = {"format": FORMAT, "function": fn.name, "target": prog.target,
                "error": error, "versions": _versions(prog),
                "inputs": [n for n in arrays], "outputs": len(outputs)}
    buf = io.BytesIO()
    np.savez(buf, **{f"in{i}": a for i, a in enumerate(inputs)},
             **{f"out{i}": a for i, a in enumerate(outputs)})
    tmp = f"{path}.part"
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(manifest, indent=1))
            z.writestr("arrays.npz", buf.getvalue())
            z.writestr("graph.pickle", pickle.dumps(prog.graph_ir))
            z.writestr("source.txt", prog.target_code)
        os.replace(tmp, path)             # whole or not at all
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return str(path)


def _versions(prog) -> dict:
    from .runtime import isa, targets
    out = {"tessera": __version__, "numpy": np.__version__, "python": platform.python_version(),
           "machine": platform.machine(), "host_isa": isa.host_level()}
    if not targets.is_gpu(prog.target):
        from .runtime.toolchain import compiler_version, find_compiler
        out["cc"] = compiler_version(find_compiler())
    return out


@dataclass
class Replay:
    """`replay`'s answer: the results again, and whether they are the saved ones bit for bit."""
    identical: bool
    outputs: list
    saved: list
    error: str | None
    manifest: dict

    def __str__(self):
        if self.error:
            return f"replayed {self.manifest['function']}: raised again:\n{self.error}"
        same = "the same bits" if self.identical else "OTHER bits than the saved results"
        return f"replayed {self.manifest['function']} on {self.manifest['target']}: {same}"


def replay(path, target: str | None = None) -> Replay:
    """Compile the saved Graph IR again (for the saved target, or `target`), run it on the saved
    arguments and compare the results with the saved ones bit for bit."""
    from .compiler.driver import compile_graph
    try:
        with zipfile.ZipFile(path) as z:
            manifest = json.loads(z.read("manifest.json"))
            arrays = np.load(io.BytesIO(z.read("arrays.npz")))
            graph = pickle.loads(z.read("graph.pickle"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError) as e:
        raise ArgumentError(f"{path} is not a tessera replay file ({type(e).__name__}: {e})",
                            expected=FORMAT) from None
    if manifest.get("format") != FORMAT:
        raise ArgumentError(f"{path} is a {manifest.get('format')!r} file", expected=FORMAT)
    inputs = [arrays[f"in{i}"] for i in range(len(manifest["inputs"]))]
    saved = [arrays[f"out{i}"] for i in range(manifest["outputs"])]
    prog = compile_graph(graph, target or manifest["target"], output_structure="list")
    try:
        outputs, error = [_host(a) for a in prog.run(*inputs)], None
    except TesseraError as e:
        outputs, error = [], str(e)
    identical = error is None and len(outputs) == len(saved) and all(
        a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
        for a, b in zip(outputs, saved))
    return Replay(identical, outputs, saved, error, manifest)
