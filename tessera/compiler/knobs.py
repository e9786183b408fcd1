"""The knob rules of a search (compiler/knob_search.py runs it): the knob names a user's space
may use (ours, the seeds' aliases, and the GPU knobs, kept and reported unused on the CPU), the
values each kernel's search takes and in which order, and how much a candidate's output may
differ from the default's (the numerics contract: only NUMERIC_KNOBS may change bits, within a
tolerance)."""
from __future__ import annotations

import itertools
import os

import numpy as np

from ..errors import ArgumentError
from .scheduler import (ALIASES, KNOB_NAMES, MAX_LANES, NUMERIC_KNOBS, invalid_knobs,
                      knob_space)
from .schedule_ir import Kernel

# GPU-only knobs, accepted and reported unused on the CPU
GPU_KNOBS = ("warps", "stages")
REL_TOL = {4: 1e-4, 8: 1e-10, 2: 1e-2}      # numeric knobs: max |diff| / max |default|


# ---- the search spaces ----------------------------------------------------------------------------
def resolve_space(user_space: dict | None) -> tuple[dict, list]:
    """The user's space in our knob names, per strategy: ({(strategy|None, knob): values},
    ignored GPU knobs). Bad names or values raise."""
    if user_space is None:
        return {}, []
    if not isinstance(user_space, dict):
        raise ArgumentError(f"autotune space must be a dict of knob -> values, not {user_space!r}")
    out, ignored = {}, []
    for name, values in user_space.items():
        if isinstance(values, (int, bool)):
            values = [values]
        if not isinstance(values, (list, tuple)) or not values:
            raise ArgumentError(f"autotune space[{name!r}] must be a non-empty list of values")
        if name in GPU_KNOBS:
            ignored.append(name)
            continue
        if name == "parallel":
            if not all(isinstance(v, bool) for v in values):
                raise ArgumentError(f"autotune space['parallel'] takes True/False, not {values!r}")
        elif not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                     or (name == "threads" and v == 0) for v in values):
            raise ArgumentError(f"autotune space[{name!r}] must hold positive integers, "
                                f"not {list(values)!r}")
        elif name in ("lanes", "vector") and max(values) > MAX_LANES:
            raise ArgumentError(f"autotune space[{name!r}] goes up to {MAX_LANES} accumulators, "
                                f"not {max(values)}")
        if name in ALIASES:
            for strategy, knob in ALIASES[name].items():
                out[(strategy, knob)] = list(values)
        elif name in KNOB_NAMES:
            out[(None, name)] = list(values)
        else:
            raise ArgumentError(f"autotune space has an unknown knob {name!r}",
                                expected=", ".join(list(KNOB_NAMES) + list(ALIASES) + list(GPU_KNOBS)))
    return out, ignored


def kernel_space(k: Kernel, cpus: int, user: dict, fixed: set, exact: bool = False) -> dict:
    """The knob values to search for kernel k; `exact` leaves out the knobs that may change the
    last bits of its results."""
    space = knob_space(k, cpus)
    if exact:
        for knob in NUMERIC_KNOBS:
            space.pop(knob, None)
    for (strategy, knob), values in user.items():
        if (knob in space or knob == "threads") and strategy in (None, k.strategy):
            values = list(dict.fromkeys(values))
            default = k.knobs.get(knob, 0 if knob == "threads" else None)
            if default is not None and default not in values:   # the baseline is a candidate
                values = sorted(values + [default], key=lambda v: (isinstance(v, bool), v))
            space[knob] = values
    for knob in fixed:                  # set by the user's Schedule or tile_shape: not tuned
        space.pop(knob, None)
    return space


def enumerate_grid(k: Kernel, space: dict) -> list[dict]:
    """Every valid combination, the default first, then by distance from the default (knobs
    changed, then steps along each knob's list)."""
    names = list(space)
    default = {n: k.knobs.get(n) for n in names}

    def distance(combo):
        changed = sum(combo[n] != default[n] for n in names)
        steps = sum(abs(space[n].index(combo[n]) - space[n].index(default[n]))
                    if default[n] in space[n] else 1 for n in names)
        return changed, steps
    combos = [dict(zip(names, vals)) for vals in itertools.product(*(space[n] for n in names))]
    combos = [c for c in combos if invalid_knobs(k, {**k.knobs, **c}) is None]
    return sorted(combos, key=distance)


def program_threads() -> int:
    """The threads a parallel kernel runs on (OMP_NUM_THREADS, else the cores)."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(env) if env.isdigit() and int(env) > 0 else (os.cpu_count() or 1)


# ---- a candidate's output against the default's -------------------------------------------------
def compare(kernel_outs, default_outs, changed: dict) -> tuple:
    """(status, bitwise, message) of a candidate's outputs against the default's."""
    worst = ("ok", True, "")
    for a, b in zip(_listed(kernel_outs), _listed(default_outs)):
        verdict = _compare_one(a, b, changed)
        if verdict[0] != "ok":
            return verdict
        if not verdict[1]:
            worst = verdict
    return worst


def _listed(x):
    return x if isinstance(x, (list, tuple)) else [x]


def _compare_one(a, b, changed: dict) -> tuple:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.tobytes() == b.tobytes():
        return "ok", True, ""
    if not set(changed) & NUMERIC_KNOBS:
        return "wrong result", False, f"bits differ, though {sorted(changed)} must not change them"
    if a.dtype.kind not in "fc":
        return "wrong result", False, "integer results differ"
    fin_a, fin_b = np.isfinite(a), np.isfinite(b)
    na, nb = a[~fin_a], b[~fin_b]
    if (fin_a != fin_b).any() or not ((np.isnan(na) & np.isnan(nb)) | (na == nb)).all():
        return "wrong result", False, "other infinities or NaNs"
    ok = fin_a
    scale = float(np.max(np.abs(b[ok]), initial=0.0)) or 1.0
    err = float(np.max(np.abs(a[ok].astype(np.float64) - b[ok]), initial=0.0)) / scale
    if not err <= REL_TOL.get(a.dtype.itemsize, 1e-4):
        return "wrong result", False, f"relative error {err:.2g}"
    return "ok", False, f"relative error {err:.2g}"
