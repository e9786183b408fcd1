"""Autotuning: search each kernel's knobs, measure the candidates properly, keep the best in the
autotuning database (tessera/runtime/tunedb.py), which later compilations read.

A search (`tune_program`):
1. The function is scheduled with the heuristics' knobs (the database ignored). Each kernel is cut
   out into a program of its own (what it reads become parameters) and the chain of these
   programs runs on the example arguments: every kernel gets real inputs (gather indices stay in
   range, softmax rows are real rows), and the default's output to check candidates against.
2. Kernels are tuned most expensive first; the budget is shared out in proportion to their
   default times.
3. Candidates come from the kernel's knob space (knobs.py: kernels.knob_space, narrowed by the
   user's `space`), less the invalid ones (kernels.invalid_knobs), in the search's order:
   grid (every combination, nearest the default first), random (a seeded shuffle) or beam (from
   the default, change one knob by one step, keep the best few, repeat).
4. Candidates compile in batches on a thread pool (each compile is its own gcc process), never
   while one is being timed: lowered, rendered and built as compile_graph does, by the target's
   own renderer and build step (runtime/targets.py).
5. A candidate runs once (warm-up; its output is checked against the default's; a run longer
   than the timeout marks it "timed out": runs are never interrupted), then up to `repeats` timed
   runs of the kernel alone (C's monotonic clock, through the program's timed entry). Inputs
   smaller than twice the last-level cache rotate among copies, so caches are as cold as inside
   a real program. A candidate whose best run is already `prune` x the leader's median stops
   early ("slower").
6. The default and the leaders are timed again, interleaved; the fastest wins, but a candidate
   within `tie` of it loses to the default, then to the candidate earlier in the space's order,
   so noise never flips a choice back and forth.

Checks (knobs.compare): knobs other than NUMERIC_KNOBS must not change one bit of a kernel's
output (the numerics contract), so a candidate that does is "wrong result"; a numeric knob
(lanes) may change the last bits, within a tolerance, and the table says whether the bits are
the default's.

The search reports its progress to the bar the caller gives (Settings.progress; the user's side,
tessera/autotune.py, shows one in a terminal or a notebook) and returns a TuneResult: data, text
and a table.
"""
from __future__ import annotations

import dataclasses
import math
import os
import random
import sqlite3
import statistics
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..errors import ArgumentError, RuntimeFault, TesseraError
from ..runtime import targets, tunedb
from .lower import lower_schedule
from .schedule_ir import Buffer, Kernel, ScheduleProgram
from .scheduler import invalid_knobs, kernel_signature
from .knobs import (GPU_KNOBS, REL_TOL, compare, enumerate_grid,  # noqa: F401 (the search's names)
                    kernel_space, program_threads, resolve_space)

SEARCHES = ("grid", "random", "beam")     # how candidates are ordered (not a kernel strategy)
STATUSES = ("default", "ok", "slower", "same code", "failed to compile", "wrong result",
            "timed out")


@dataclass
class Candidate:
    kernel: str
    order: int                     # position in the space's order (ties go to the lower)
    knobs: dict                    # every knob of the kernel
    changed: dict                  # the knobs that differ from the default's
    status: str = "pending"
    times: list = field(default_factory=list)
    bitwise: bool | None = None    # output bit-identical to the default's
    message: str = ""
    program: object = None         # (tile program, library) once compiled
    confirmed: float | None = None # median seconds in the final, interleaved round

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None


@dataclass
class KernelTuning:
    name: str
    strategy: str
    flops: int
    bytes: int
    default_knobs: dict
    best_knobs: dict
    default_s: float
    best_s: float
    candidates: list
    key: str = ""

    @property
    def speedup(self) -> float:
        return self.default_s / self.best_s if self.best_s else 1.0


class TuneResult:
    """What a search found: one row per candidate (`to_pandas()`), the chosen knobs per kernel
    (`best`), and the whole program's time with the default and the tuned knobs."""

    def __init__(self, function: str, kernels: list, db_path, search: str, budget_s: float,
                 elapsed_s: float, ignored: list, recorded=()):
        self.function = function
        self.recorded = list(recorded)      # kernels whose result came from the database
        self.kernels: list[KernelTuning] = kernels
        self.db_path = db_path
        self.search = search
        self.budget_s = budget_s
        self.elapsed_s = elapsed_s
        self.ignored = ignored              # knob names of the space that the CPU does not use
        self.default_s: float | None = None  # the whole program, default knobs
        self.tuned_s: float | None = None    # the whole program, tuned knobs

    @property
    def best(self) -> dict:
        return {k.name: dict(k.best_knobs) for k in self.kernels}

    @property
    def speedup(self) -> float | None:
        return self.default_s / self.tuned_s if self.default_s and self.tuned_s else None

    def rows(self) -> list[dict]:
        out = []
        for kt in self.kernels:
            for c in kt.candidates:
                t = c.median
                out.append({"kernel": kt.name, "strategy": kt.strategy, "candidate": c.order,
                            **{f"knob:{n}": v for n, v in c.knobs.items()},
                            "time_ms": None if t is None else t * 1e3,
                            "confirmed_ms": None if c.confirmed is None else c.confirmed * 1e3,
                            "speedup": None if not t else kt.candidates[0].median / t,
                            "gflops": None if not t else kt.flops / t / 1e9,
                            "status": c.status, "bitwise": c.bitwise,
                            "best": c.knobs == kt.best_knobs and c.status in ("ok", "default"),
                            "message": c.message})
        return out

    def to_pandas(self):
        import pandas as pd
        rows = self.rows()
        df = pd.DataFrame(rows)
        df.columns = [c[5:] if c.startswith("knob:") else c for c in df.columns]
        return df

    def summary(self) -> str:
        lines = [f"autotune @{self.function}: {self.search}, {self.elapsed_s:.1f} s of "
                 f"{self.budget_s:.0f} s budget, database {self.db_path}"]
        for kt in self.kernels:
            tried = sum(c.status not in ("pending",) for c in kt.candidates)
            changed = {n: v for n, v in kt.best_knobs.items() if kt.default_knobs.get(n) != v}
            lines.append(f"  {kt.name:<28} {kt.strategy:<9} {tried:>3} candidates  "
                         f"{kt.default_s * 1e3:9.3f} ms -> {kt.best_s * 1e3:9.3f} ms  "
                         f"x{kt.speedup:.2f}  {changed or 'default knobs'}"
                         + ("  (recorded)" if kt.name in self.recorded else ""))
        if self.recorded:
            lines.append("  (recorded): the database's result of an earlier search with these "
                         "settings and at least this budget; force=True searches again")
        if self.speedup:
            lines.append(f"  whole program: {self.default_s * 1e3:.3f} ms -> "
                         f"{self.tuned_s * 1e3:.3f} ms (x{self.speedup:.2f})")
        if self.ignored:
            lines.append(f"  not used on this target: {', '.join(self.ignored)}")
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self):
        return f"<TuneResult @{self.function}: {len(self.kernels)} kernels tuned>"

    def _repr_html_(self):
        try:
            table = self.to_pandas().to_html(index=False, na_rep="", float_format="%.4g")
        except ImportError:
            table = ""
        from html import escape
        return f"<pre>{escape(self.summary())}</pre>{table}"


# ---- kernels cut out into programs of their own ------------------------------------------------
def single_kernel(schedule: ScheduleProgram, k: Kernel, knobs: dict) -> ScheduleProgram:
    """A schedule running only kernel k with these knobs: what it reads become inputs 0, 1, ...
    (constants stay constants) and what it writes the output."""
    mapping, buffers, n_in = {}, [], 0
    for b in k.inputs:
        if b.role in ("inline", "const"):
            nb = b
        else:
            nb = Buffer(f"in{n_in}", b.type, "input", param=n_in, label=b.label or b.name)
            n_in += 1
        mapping[id(b)] = nb
        buffers.append(nb)
    outs = [Buffer(f"out{i}", b.type, "output") for i, b in enumerate(k.outputs)]
    kk = dataclasses.replace(k, inputs=[mapping[id(b)] for b in k.inputs], output=outs[0],
                             stores=[(v, o) for (v, _), o in zip(k.stores, outs[1:])],
                             reads={v: mapping[id(b)] for v, b in k.reads.items()},
                             knobs=dict(knobs))
    s = ScheduleProgram(f"{schedule.name}_{k.name}", schedule.bindings, schedule.target,
                 buffers + outs, [kk], outs)
    return s.verify()


def compile_single(schedule: ScheduleProgram, k: Kernel, knobs: dict):
    """(Tile IR, loaded library, source) of kernel k alone with these knobs: lowered, rendered
    and built by its target as compile_graph builds a whole program."""
    s = single_kernel(schedule, k, knobs)
    tile = lower_schedule(s).verify()
    source, lib = targets.of(schedule.target).compile(tile, s.name, schedule.target)
    return tile, lib, source


class KernelRunner:
    """Runs one single-kernel program on fixed inputs, timing the kernel alone; `copies` sets of
    buffers are rotated so that small working sets do not stay in cache between runs."""

    def __init__(self, compiled, inputs: list, copies: int = 1):
        import ctypes
        tile, lib = compiled[:2]
        self._entry = getattr(lib, "tessera_entry_timed")
        self._seconds = (ctypes.c_double * 1)()
        self._tables, self._ptrs, self.outputs = [], [], []
        for c in range(copies):
            table = []
            for b in tile.buffers:
                if b.role == "input":
                    table.append(inputs[b.param] if c == 0 else inputs[b.param].copy())
                elif b.role == "const":
                    table.append(b.data)
                else:
                    table.append(np.empty(tuple(b.type.shape), dtype=b.type.dtype.np))
                    if c == 0:
                        self.outputs.append(table[-1])
            self._tables.append(table)
            self._ptrs.append((ctypes.c_void_p * max(1, len(table)))(
                *[a.ctypes.data for a in table]))
        self._next = 0

    def run(self) -> float:
        ptrs = self._ptrs[self._next]
        self._next = (self._next + 1) % len(self._ptrs)
        if self._entry(ptrs, self._seconds):
            raise RuntimeFault("an index is out of range while tuning")
        return self._seconds[0]

    def sample(self, floor: float = 50e-6) -> float:
        """Seconds per run, from back-to-back runs adding up to at least `floor`: the clock's
        granularity (tens of ns) and jitter then stay small against a tiny kernel's time."""
        total, n = 0.0, 0
        while total < floor and n < 10000:
            total += self.run()
            n += 1
        return total / n

    def warm(self):
        """One run on every copy: pages touched, threads awake, code in the instruction cache."""
        for _ in self._ptrs:
            self.run()

    def result(self) -> list:
        """The outputs of copy 0, in the kernel's order (run first)."""
        self._next = 0
        self.run()
        return [o.copy() for o in self.outputs]


def last_level_cache_bytes() -> int:
    best = 0
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in os.listdir(root):
            try:
                with open(f"{root}/{d}/size") as f:
                    text = f.read().strip()
            except OSError:
                continue
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
    except (OSError, ValueError):
        pass
    return best or 32 << 20


def _out_bytes(k: Kernel) -> int:
    return sum(b.nbytes for b in k.outputs)


def _copies(inputs, out_bytes) -> int:
    """Enough input/output copies that one round of runs touches twice the last-level cache."""
    ws = sum(a.nbytes for a in inputs) + out_bytes
    want = 2 * last_level_cache_bytes()
    return 1 if ws >= want else min(8, math.ceil(want / max(ws, 1)))


# ---- the search -----------------------------------------------------------------------------------
class NoProgress:
    """Progress reported nowhere (Settings.progress None): the bar's interface, which
    tessera/autotune.py's bar has too."""

    def __init__(self, total: int, label: str):
        self.total = total

    def update(self, n=1, note=""):
        pass

    def close(self):
        pass


@dataclass
class Settings:
    budget_s: float = 60.0
    search: str = "grid"
    repeats: int = 7
    timeout_s: float | None = None     # None: 20 x the default's run, at least 0.2 s
    prune: float = 1.3
    tie: float = 0.02
    beam_width: int = 3
    seed: int = 0
    workers: int = 0                   # 0: the machine's cores
    progress: object = None            # (total, label) -> a bar with update and close; None: none
    top: int = 3                       # leaders timed again against the default
    exact: bool = False                # only knobs that keep every bit of the default's results
    force: bool = False                # search even where the database holds a result


def search_record(settings: Settings, space: dict) -> dict:
    """How a kernel was searched, as the database keeps it: a later search with the same
    settings and no larger budget returns the recorded result instead of searching again."""
    return {"search": settings.search, "seed": settings.seed if settings.search == "random"
            else None, "exact": settings.exact, "budget_s": settings.budget_s,
            "repeats": settings.repeats, "timeout_s": settings.timeout_s,
            "space": {n: list(v) for n, v in sorted(space.items())}}


def _covers(recorded: dict | None, wanted: dict) -> bool:
    if not recorded:
        return False
    same = {k: v for k, v in recorded.items() if k != "budget_s"} == \
        {k: v for k, v in wanted.items() if k != "budget_s"}
    return same and recorded.get("budget_s", 0) >= wanted["budget_s"]


def recorded_tuning(k: Kernel, row: dict) -> KernelTuning:
    """A kernel's tuning as the database recorded it (its candidates' measurements)."""
    default = row["default_knobs"]
    cands = []
    for i, m in enumerate(row["measurements"]):
        knobs = m["knobs"]
        cands.append(Candidate(k.name, i, knobs, {n: v for n, v in knobs.items()
                                                   if default.get(n) != v},
                               m["status"], list(m.get("times_s") or []), m.get("bitwise"),
                               "recorded"))
    return KernelTuning(k.name, k.strategy, k.flops, k.bytes, dict(default), dict(row["knobs"]),
                        row["default_s"], row["best_s"], cands)


def tune_program(name: str, schedule: ScheduleProgram, inputs: list, settings: Settings, user_space=None,
                 fixed=None, only=None, db_path=None) -> TuneResult:
    """Search every tunable kernel of a scheduled program (built with the heuristics' knobs) on
    its example inputs, store each kernel's choice in the database and return what was found.
    A kernel the database holds a result for, from a search with the same settings and space
    and at least this budget, is not searched again (unless settings.force): its recorded
    result is returned."""
    if settings.search not in SEARCHES:
        raise ArgumentError(f"unknown autotune search {settings.search!r}",
                            expected=" or ".join(SEARCHES))
    user, ignored = resolve_space(user_space)
    start = time.perf_counter()
    cpus = program_threads()
    workers = settings.workers or max(1, min(os.cpu_count() or 1, 8))
    # 0. the kernels to search: those with no recorded result of these settings and budget
    tunable, recorded, db = [], {}, tunedb.open_db(db_path)
    keys = {}                               # kernel -> (key, its parts, how it is searched)
    for k in schedule.kernels:
        if only is not None and k.name not in only:
            continue
        space = kernel_space(k, cpus, user, (fixed or {}).get(k.name, set()), settings.exact)
        if not any(len(v) > 1 for v in space.values()):
            continue
        key, parts = tunedb.make_key(kernel_signature(k), schedule.target)
        keys[k.name] = key, parts, search_record(settings, space)
        try:
            row = None if settings.force else db.record(key)
        except sqlite3.Error:
            row = None                      # (unreadable: search)
        if row is not None and _covers(row["search"], keys[k.name][2]):
            recorded[k.name] = recorded_tuning(k, row)
            recorded[k.name].key = key
        else:
            tunable.append((k, space))
    results = []
    if tunable:
        results = _search(schedule, inputs, tunable, settings, workers, start)
    for kt, (k, _) in zip(results, tunable):
        key, parts, how = keys[k.name]
        kt.key = key
        try:
            db.put(key, parts, kernel=k.name, strategy=k.strategy,
                   knobs={n: v for n, v in kt.best_knobs.items() if v is not None},
                   default_knobs=kt.default_knobs, best_s=kt.best_s, default_s=kt.default_s,
                   measurements=[{"knobs": c.knobs, "status": c.status, "median_s": c.median,
                                  "times_s": c.times, "bitwise": c.bitwise}
                                 for c in kt.candidates],
                   search=how)
        except sqlite3.Error as e:          # the search stands; only its record is lost
            warnings.warn(f"tessera: cannot write the autotuning database {db.path} ({e}); "
                          "the result is not recorded", RuntimeWarning, stacklevel=3)
            break
    return TuneResult(name, results + list(recorded.values()), db.path, settings.search,
                      settings.budget_s, time.perf_counter() - start, ignored, recorded)


def _search(schedule: ScheduleProgram, inputs: list, tunable: list, settings: Settings, workers: int,
            start: float) -> list:
    """KernelTuning of each (kernel, space) of `tunable`, most expensive first."""
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        # 1. every kernel alone, default knobs, in program order: real inputs for each
        compiled = list(pool.map(lambda k: compile_single(schedule, k, k.knobs), schedule.kernels))
        env = {b.name: b.data for b in schedule.buffers if b.role == "const"}
        env.update({b.name: np.ascontiguousarray(inputs[b.param]) for b in schedule.buffers
                    if b.role == "input"})
        wanted = {k.name for k, _ in tunable}
        last_read = {b.name: i for i, k in enumerate(schedule.kernels) for b in k.inputs}
        defaults = {}
        for i, (k, comp) in enumerate(zip(schedule.kernels, compiled)):
            args = [env[b.name] for b in k.inputs if b.role not in ("inline", "const")]
            runner = KernelRunner(comp, args)
            out = runner.result()
            for b, o in zip(k.outputs, out):
                env[b.name] = o
            if k.name in wanted:
                runner.warm()
                defaults[k.name] = (comp, args, out, statistics.median(
                    runner.sample() for _ in range(3)))
            for b in k.inputs:          # intermediates live until their last reader ran
                if last_read.get(b.name) == i and b.role in ("temp", "output"):
                    env.pop(b.name, None)
        del env
        # 2. the tunable kernels, most expensive first (the caller's list, sorted in place)
        tunable.sort(key=lambda ks: -defaults[ks[0].name][3])
        results = []
        for i, (k, space) in enumerate(tunable):
            left = settings.budget_s - (time.perf_counter() - start)
            weight = sum(defaults[kk.name][3] for kk, _ in tunable[i:])
            budget = max(0.0, left * defaults[k.name][3] / weight) if weight else left
            results.append(_tune_kernel(k, space, defaults.pop(k.name), budget, settings, pool,
                                        schedule))
        return results
    finally:
        pool.shutdown(wait=True)


def _tune_kernel(k, space, default, budget_s, st: Settings, pool, schedule) -> KernelTuning:
    comp, args, default_out, default_t = default
    runner = KernelRunner(comp, args, _copies(args, _out_bytes(k)))
    t0 = time.perf_counter()
    names = list(space)
    dflt = {n: k.knobs.get(n) for n in names}
    timeout = st.timeout_s if st.timeout_s is not None else max(0.2, 20 * default_t)
    base = Candidate(k.name, 0, dict(dflt), {}, "default")
    base.program, base.bitwise = comp, True
    base.times = _measure(runner, st.repeats, None, st.prune)[0]
    cands, seen = [base], {_freeze(dflt): base}
    sources = {comp[2]: 0}
    grid = [c for c in enumerate_grid(k, space) if _freeze(c) not in seen] \
        if st.search != "beam" else []

    def make(combo):
        c = Candidate(k.name, len(cands), combo, {n: v for n, v in combo.items() if dflt[n] != v})
        cands.append(c)
        seen[_freeze(combo)] = c
        return c

    def evaluate(batch):
        """Compile a batch in parallel, then time each alone."""
        def build(c):
            try:
                c.program = compile_single(schedule, k, {**k.knobs, **c.knobs})
            except TesseraError as e:
                c.status, c.message = "failed to compile", e.summary.splitlines()[0][:200]
        list(pool.map(build, batch))
        for c in batch:
            same = sources.get(c.program[2]) if c.program is not None else None
            if same is not None:    # a knob with no effect here: nothing new to measure
                c.status, c.message = "same code", f"the C of candidate {same}"
            elif c.program is not None:
                sources[c.program[2]] = c.order
                _run_candidate(c, args, _out_bytes(k), default_out, st, timeout,
                               _leader(cands))
            bar.update(1, f"best x{base.median / max(_leader(cands).median, 1e-12):.2f}")

    bar = (st.progress or NoProgress)(len(grid), f"autotune {k.name}")
    try:
        batch_size = max(2, 2 * (st.workers or min(os.cpu_count() or 1, 8)))
        if st.search in ("grid", "random"):
            combos = grid
            if st.search == "random":
                random.Random(st.seed).shuffle(combos)
            for i in range(0, len(combos), batch_size):
                if time.perf_counter() - t0 > budget_s:
                    break
                evaluate([make(c) for c in combos[i:i + batch_size]])
        else:
            beam = [base]
            while time.perf_counter() - t0 <= budget_s:
                fresh = []
                for member in beam:
                    for n in names:
                        vals = space[n]
                        at = vals.index(member.knobs[n]) if member.knobs[n] in vals else 0
                        for j in (at - 1, at + 1):
                            if 0 <= j < len(vals):
                                combo = {**member.knobs, n: vals[j]}
                                if _freeze(combo) not in seen and \
                                        invalid_knobs(k, {**k.knobs, **combo}) is None:
                                    fresh.append(make(combo))     # make() marks it seen
                if not fresh:
                    break
                bar.total = len(cands) - 1
                before = _leader(cands).median
                evaluate(fresh)
                ranked = sorted((c for c in cands if c.status in ("ok", "default")),
                                key=lambda c: (c.median, c.order))
                beam = ranked[:st.beam_width]
                if _leader(cands).median >= before * (1 - st.tie):
                    break       # a round without a real gain: the beam has converged
    finally:
        bar.close()
    best, confirmed = _final_round(base, cands, args, k, st)
    for c in cands:
        c.confirmed = confirmed.get(c.order)
    return KernelTuning(k.name, k.strategy, k.flops, k.bytes, dict(dflt), dict(best.knobs),
                        confirmed[0], confirmed[best.order], cands)


def _freeze(knobs: dict) -> tuple:
    return tuple(sorted(knobs.items()))


def _leader(cands) -> Candidate:
    ok = [c for c in cands if c.status in ("ok", "default") and c.times]
    return min(ok, key=lambda c: (c.median, c.order))


def _run_candidate(c: Candidate, args, out_bytes, default_out, st, timeout, leader):
    runner = KernelRunner(c.program, args, _copies(args, out_bytes))
    try:
        first = time.perf_counter()
        out = runner.result()
        if time.perf_counter() - first > timeout:
            c.status, c.message = "timed out", f"one run took over {timeout * 1e3:.0f} ms"
            return
    except RuntimeFault as e:
        c.status, c.message = "wrong result", str(e)
        return
    c.status, c.bitwise, c.message = compare(out, default_out, c.changed)
    if c.status != "ok":
        return
    c.times, pruned = _measure(runner, st.repeats, leader.median, st.prune)
    if pruned:
        c.status = "slower"
        c.message = f"stopped after {len(c.times)} runs: over x{st.prune} the leader"


def _measure(runner, repeats, leader, prune) -> tuple[list, bool]:
    runner.warm()
    times = []
    for i in range(repeats):
        times.append(runner.sample())
        if leader is not None and i >= 1 and min(times) > prune * leader:
            return times, True
    return times, False


def _final_round(base, cands, args, k, st) -> tuple:
    """The default and the leaders, timed again in turn: (winner by the tie rule, {order: median
    seconds of this round})."""
    leaders = sorted((c for c in cands if c.status == "ok" and c.times),
                     key=lambda c: (c.median, c.order))[:st.top]
    entrants = [base] + leaders
    runners = [KernelRunner(c.program, args, _copies(args, _out_bytes(k))) for c in entrants]
    times = {c.order: [] for c in entrants}
    for r in runners:
        r.warm()
    for _ in range(st.repeats):
        for c, r in zip(entrants, runners):
            times[c.order].append(r.sample())
    medians = {o: statistics.median(t) for o, t in times.items()}
    return pick(entrants, medians, st.tie), medians


def pick(entrants, medians: dict, tie: float) -> Candidate:
    """The fastest; but among those within `tie` of it, the default (order 0), else the one
    earliest in the space's order: the same measurements always give the same choice, and noise
    alone never moves a kernel off its default."""
    fastest = min(medians[c.order] for c in entrants)
    return min((c for c in entrants if medians[c.order] <= fastest * (1 + tie)),
               key=lambda c: c.order)
