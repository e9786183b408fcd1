"""Autotuning, the user's side: `ts.autotune(fn, *example_args)` and the seeds' decorator
`@ts.kernel.autotune(space=..., metric=..., timeout_ms=..., cache=...)`.

Both search each kernel of the compiled function (tessera/compiler/knob_search.py says how) and
record the chosen knobs in the autotuning database; every later compilation of the same kernel
(same structure, shapes, dtypes, target, machine and compiler) reads them from there, in this
process or the next, without searching again. TESSERA_AUTOTUNE=0 turns all of it off. The
search shows its progress here (Progress): a line in a terminal, a bar in a notebook.
"""
from __future__ import annotations

import functools
import statistics
import sys
import time
import weakref

from .compiler import strategies
from .compiler.knob_search import SEARCHES, Settings, TuneResult, tune_program
from .compiler.knobs import kernel_space, program_threads, resolve_space
from .errors import ArgumentError, TesseraError
from .function import Function
from .function.tracing import inside_trace
from .runtime import tunedb

METRICS = ("time", "latency", "throughput")


class Progress:
    """A search's progress bar: a line redrawn on stderr in a terminal, an HTML bar in a notebook
    (its text form holds no timings, so a saved notebook compares equal run after run)."""

    def __init__(self, total: int, label: str):
        self.total, self.done, self.label, self.note = max(total, 1), 0, label, ""
        self._handle = None
        if _in_notebook():
            from IPython.display import display
            self._handle = display(self._bundle(""), raw=True, display_id=True)

    def _bundle(self, note):
        from html import escape
        text = f"{self.label}: {self.done}/{self.total} candidates"
        return {"text/plain": text,
                "text/html": f"<progress value='{self.done}' max='{self.total}' "
                             f"style='width:30em'></progress> {escape(text)} {escape(note)}"}

    def update(self, n=1, note=""):
        self.done = min(self.total, self.done + n)
        self.note = note
        if self._handle is not None:
            self._handle.update(self._bundle(note), raw=True)
        elif sys.stderr.isatty():           # a log gets the last line only (close)
            self._draw("\r")

    def _draw(self, end):
        width = 30
        fill = int(width * self.done / self.total)
        sys.stderr.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] "
                         f"{self.done}/{self.total} {self.note[:40]:<40}{end}")
        sys.stderr.flush()

    def close(self):
        if self._handle is None:
            self._draw("\n")


def _in_notebook() -> bool:
    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip is not None and hasattr(ip, "get_ipython") else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _as_function(fn) -> Function:
    if isinstance(fn, AutotunedFunction):
        return fn.function
    if isinstance(fn, Function):
        return fn
    if callable(fn):
        return Function(fn)
    raise ArgumentError(f"autotune needs a tessera function, not {fn!r}")


def _settings(budget_s, search, metric, timeout_ms, repeats, seed, workers, progress,
              exact=False, strategy=None, force=False):
    search = strategy if strategy is not None else search    # (its former name)
    if metric not in METRICS:
        raise ArgumentError(f"unknown autotune metric {metric!r}", expected=" or ".join(METRICS))
    if search not in SEARCHES:
        raise ArgumentError(f"unknown autotune search {search!r}",
                            expected=" or ".join(SEARCHES))
    if not (isinstance(budget_s, (int, float)) and budget_s > 0):
        raise ArgumentError(f"autotune budget_s must be a positive number, not {budget_s!r}")
    if timeout_ms is not None and not (isinstance(timeout_ms, (int, float)) and timeout_ms > 0):
        raise ArgumentError(f"autotune timeout_ms must be a positive number, not {timeout_ms!r}")
    if not (isinstance(repeats, int) and repeats >= 1):
        raise ArgumentError(f"autotune repeats must be a positive integer, not {repeats!r}")
    return Settings(budget_s=float(budget_s), search=search, repeats=repeats,
                    timeout_s=None if timeout_ms is None else timeout_ms / 1e3, seed=seed,
                    workers=workers, progress=Progress if progress else None,
                    exact=bool(exact), force=bool(force))


def _fixed_knobs(f: Function, schedule) -> dict:
    """Per kernel, the knobs the user set (a Schedule, an op's tile_shape): never searched."""
    out = {}
    for k in schedule.kernels:
        strategy = strategies.of(k)
        fixed = set(strategy.user_knobs(f.schedule)) if f.schedule is not None else set()
        out[k.name] = fixed | set(strategy.op_knobs(k.group))
    return out


def autotune(fn, *args, budget_s: float = 60.0, search: str = "grid", space: dict | None = None,
             metric: str = "time", timeout_ms: float | None = None, repeats: int = 7,
             cache=None, kernels=None, seed: int = 0, workers: int = 0, progress: bool = True,
             exact: bool = False, strategy: str | None = None, force: bool = False,
             **kwargs) -> TuneResult:
    """Search the knobs of every kernel of `fn` compiled for these example arguments.

    budget_s: wall-clock seconds for the whole search (shared among kernels by their cost).
    search: "grid" (every valid combination, nearest the default first), "random" (a shuffle
        seeded by `seed`) or "beam" (one knob one step at a time from the default); `strategy`
        is its former name, still accepted.
    space: narrows or widens the knob values, e.g. {"BM": [96, 192], "BN": [256, 512],
        "threads": [1, 2]}; the seeds' names BM/BN/BK (tile sizes; BM is also attention's
        block_q) and vector (row lanes) are accepted; warps and stages are GPU knobs, kept and
        reported unused on the CPU.
    metric: "time" (or "latency") or "throughput": a kernel's work is fixed, so both rank
        candidates by their median time; the table shows GFLOP/s too.
    timeout_ms: a candidate whose first run takes longer is marked timed out (runs are not
        interrupted); default 20x the default knobs' run, at least 200 ms.
    cache: the database file (default $TESSERA_AUTOTUNE_DB, else autotune.sqlite in the cache
        directory). kernels: names of the kernels to tune (default all).
    exact: search only knobs that keep every bit of the default knobs' results. Without it a
        row reduction may also try other lane counts, which change the association of its sums:
        the last bits may differ from the untuned program's (checked within a tolerance, and
        still the same on every run and thread count).
    force: search again even where the database holds a kernel's result from a search with the
        same settings and space and at least this budget (by default that result is returned,
        marked recorded; a larger budget or other settings search anew).

    Returns a TuneResult: `.to_pandas()` has one row per candidate (knobs, time, speed-up over
    the default, status: default, ok, slower, failed to compile, wrong result, timed out),
    `.best` the chosen knobs, `.speedup` the whole program's gain, `.program` the tuned program.
    """
    settings = _settings(budget_s, search, metric, timeout_ms, repeats, seed, workers, progress,
                         exact, strategy, force)
    from .kernel.function import KernelFunction
    if isinstance(fn, KernelFunction):          # a tile kernel: its function at these dtypes
        fn = fn.function(fn.checked_body(args))
    return _autotune(_as_function(fn), args, kwargs, settings, space, cache, kernels)


def _autotune(f: Function, args, kwargs, settings, space, cache, kernels) -> TuneResult:
    """ts.autotune with the function's own arguments kept apart from the search's."""
    resolve_space(space)                    # bad names or values fail before anything runs
    if isinstance(kernels, str):
        kernels = [kernels]
    base = f.with_schedule(f.schedule)       # a fresh copy: its own program cache
    try:
        with tunedb.using(None):            # the heuristics' knobs are the baseline
            default_prog, arrays = base._program(args, kwargs, f.target)
        if not hasattr(default_prog, "schedule_ir"):
            raise ArgumentError(f"{f.name} computes nothing to tune (its results are static)")
        names = [k.name for k in default_prog.schedule_ir.kernels]
        if kernels is not None:
            unknown = [k for k in kernels if k not in names]
            if unknown:
                raise ArgumentError(f"autotune: {f.name} has no kernel {unknown[0]!r}",
                                    expected=", ".join(names))
        result = tune_program(f.name, default_prog.schedule_ir, list(arrays.values()), settings,
                              space, _fixed_knobs(f, default_prog.schedule_ir),
                              set(kernels) if kernels is not None else None, cache)
        tuned = f.with_schedule(f.schedule)
        with tunedb.using(result.db_path, exact=settings.exact):
            tuned_prog, _ = tuned._program(args, kwargs, f.target)
    except TesseraError as e:
        raise e.with_traceback(None) from None
    if any(k.best_knobs != k.default_knobs for k in result.kernels):
        result.default_s, result.tuned_s = _time_pair(default_prog, tuned_prog,
                                                      list(arrays.values()), settings.repeats)
    result.program = tuned_prog
    f.forget_programs()     # its next call compiles anew and reads the database
    return result


def _time_pair(a, b, arrays, repeats) -> tuple[float, float]:
    """Median wall seconds of two programs on the same inputs, interleaved."""
    ta, tb = [], []
    a.run(*arrays), b.run(*arrays)
    for _ in range(repeats):
        for prog, times in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            prog.run(*arrays)
            times.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


class AutotunedFunction:
    """A tessera function that tunes itself: the first call with new shapes searches the kernels
    the database has no knobs for (showing progress), records them, then runs tuned; later calls,
    and later processes, find the knobs in the database and run at once."""

    def __init__(self, fn, *, space=None, metric="time", timeout_ms=None, cache=None,
                 budget_s=60.0, search="grid", repeats=7, progress=True, exact=False,
                 strategy=None):
        self.function = _as_function(fn)
        functools.update_wrapper(self, self.function.fn)
        self._settings = _settings(budget_s, search, metric, timeout_ms, repeats, 0, 0, progress,
                                   exact, strategy)
        resolve_space(space)
        self.space, self.metric, self.cache = space, metric, cache
        self.results: dict = {}     # argument types -> the TuneResult of the search they caused
        self._ready = weakref.WeakSet()     # programs whose kernels all have records

    def __repr__(self):
        return f"<tessera autotuned function {self.function.name}>"

    def _db(self):
        if not tunedb.enabled():
            return tunedb.using(None)
        return tunedb.using(self.cache if self.cache is not None else tunedb.default_path(),
                            exact=self._settings.exact)

    def _ensure_tuned(self, args, kwargs):
        if not tunedb.enabled():
            return
        with self._db():
            prog = self.function.lower(*args, **kwargs)
        if prog in self._ready or not hasattr(prog, "schedule_ir"):
            return
        s = self._settings
        fixed = _fixed_knobs(self.function, prog.schedule_ir)
        user, _ = resolve_space(self.space)
        cpus = program_threads()
        missing = [k.name for k in prog.schedule_ir.kernels if not k.tuned and any(
            len(v) > 1 for v in kernel_space(k, cpus, user, fixed[k.name], s.exact).values())]
        if missing:
            key = tuple(str(p.type) for p in prog.graph_ir.params)
            if key in self.results:                 # same types, other static arguments
                key += (len(self.results),)
            self.results[key] = _autotune(self.function, args, kwargs, s, self.space,
                                          self.cache, missing)
            with self._db():
                prog = self.function.lower(*args, **kwargs)
        self._ready.add(prog)

    def __call__(self, *args, **kwargs):
        if inside_trace(args, kwargs):
            return self.function(*args, **kwargs)
        self._ensure_tuned(args, kwargs)
        with self._db():
            return self.function(*args, **kwargs)

    def lower(self, *args, **kwargs):
        """The tuned Program for these arguments (searching first if needed)."""
        self._ensure_tuned(args, kwargs)
        with self._db():
            return self.function.lower(*args, **kwargs)

    @property
    def graph_ir(self):
        return self.function.graph_ir

    def interpret(self, *args, **kwargs):
        return self.function.interpret(*args, **kwargs)


class _KernelTools:
    """`tessera.kernel`: `@ts.kernel` makes a tile kernel (tessera/kernel/); kernel-level tools
    (the seeds' `@tessera.kernel.autotune`)."""

    def __call__(self, fn=None, *, target="cpu", schedule=None):
        from .kernel.function import kernel as tile_kernel
        return tile_kernel(fn, target=target, schedule=schedule)

    @staticmethod
    def autotune(fn=None, *, space=None, metric="time", timeout_ms=None, cache=None,
                 budget_s=60.0, search="grid", repeats=7, progress=True, exact=False,
                 strategy=None):
        """Decorator: `@ts.kernel.autotune(space={"BM": [...], ...}, metric="throughput",
        timeout_ms=200, cache="~/.tessera/autotune.db")` on a tessera function (or a plain
        annotated one). See `tessera.autotune` for the arguments."""
        def wrap(f):
            from .kernel.function import KernelFunction, is_tile_kernel
            if isinstance(f, KernelFunction) or is_tile_kernel(f):
                kf = f if isinstance(f, KernelFunction) else KernelFunction(f)
                # each of its functions (one per dtypes and target) tunes itself
                kf.tuning = functools.partial(
                    AutotunedFunction, space=space, metric=metric, timeout_ms=timeout_ms,
                    cache=cache, budget_s=budget_s, search=search, repeats=repeats,
                    progress=progress, exact=exact, strategy=strategy)
                return kf
            return AutotunedFunction(f, space=space, metric=metric, timeout_ms=timeout_ms,
                                     cache=cache, budget_s=budget_s, search=search,
                                     repeats=repeats, progress=progress, exact=exact,
                                     strategy=strategy)
        return wrap(fn) if fn is not None else wrap


kernel = _KernelTools()
