"""Rows (lists of dicts), DataFrames and plain HTML tables of a Schedule, a Profile and an
autotuning result. The rows come from the objects' own aggregations; nothing is recomputed."""
from __future__ import annotations

import math
import numbers
from html import escape

import numpy as np

from ..compiler.graph_ir import format_value
from ..errors import ArgumentError, BackendUnavailableError


def _pandas():
    try:
        import pandas as pd
    except ImportError:
        raise BackendUnavailableError("tessera.viz tables need pandas, which is not installed",
                                      hint="pip install pandas, or use the *_rows functions"
                                      ) from None
    return pd


def knob_text(knobs: dict) -> str:
    return ", ".join(f"{k}={format_value(v)}" for k, v in knobs.items())


def _intensity(flops, nbytes) -> float:
    return flops / nbytes if nbytes else math.nan


# ---- Schedule IR ---------------------------------------------------------------------------------
SCHEDULE_COLUMNS = ("name", "strategy", "fuses", "knobs", "tuned", "flops", "bytes", "intensity",
                    "output")


def _schedule(obj):
    s = getattr(obj, "schedule_ir", obj)
    if not hasattr(s, "kernels") or not hasattr(s, "buffers"):
        raise ArgumentError(f"expected a Schedule or a Program, not {type(obj).__name__}")
    return s


def schedule_rows(schedule_or_program) -> list[dict]:
    """One row per kernel: name, strategy, fuses (the Graph IR operators it computes), knobs
    (text), tuned, flops, bytes, intensity (FLOPs per byte moved), output (buffer: type)."""
    s = _schedule(schedule_or_program)
    return [{"name": k.name, "strategy": k.strategy, "fuses": " ".join(k.fused_labels()),
             "knobs": knob_text(k.knobs), "tuned": k.tuned, "flops": k.flops, "bytes": k.bytes,
             "intensity": _intensity(k.flops, k.bytes),
             "output": ", ".join(f"{b.ref()}: {b.type}" for b in k.outputs)}
            for k in s.kernels]


def schedule_table(schedule_or_program):
    """schedule_rows as a pandas DataFrame."""
    return _pandas().DataFrame(schedule_rows(schedule_or_program), columns=list(SCHEDULE_COLUMNS))


# ---- Profile -------------------------------------------------------------------------------------
def profile_rows(profile) -> list[dict]:
    """The Profile's own rows (per function, shapes and kernel: median and min ms, GFLOP/s, GB/s,
    % of the FMA peak and of the copy bandwidth, fuses, knobs) with the intensity added."""
    return [dict(r, intensity=_intensity(r["flops"], r["bytes"])) for r in profile.rows()]


def profile_table(profile):
    """profile_rows as a pandas DataFrame."""
    from ..runtime.profiler import COLUMNS
    return _pandas().DataFrame(profile_rows(profile), columns=list(COLUMNS) + ["intensity"])


# ---- autotuning ----------------------------------------------------------------------------------
def _changed(result) -> list[str]:
    """Per candidate, the knobs that differ from the default's, as text."""
    return [knob_text(c.changed) or "default" for kt in result.kernels for c in kt.candidates]


def autotune_rows(result) -> list[dict]:
    """The TuneResult's rows (one per candidate: knob:<name> columns, time_ms, speedup, gflops,
    status, best, ...) with `changed`: the knobs that differ from the default's, as text."""
    return [dict(r, changed=c) for r, c in zip(result.rows(), _changed(result))]


def autotune_table(result):
    """One row per candidate as a DataFrame: the TuneResult's own (``to_pandas``: knobs without
    their prefix) and `changed`."""
    df = result.to_pandas()
    df["changed"] = _changed(result)
    return df


# ---- HTML ----------------------------------------------------------------------------------------
def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def cell_text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        return "" if math.isnan(v) else f"{float(v):.4g}"
    if isinstance(v, dict):
        return knob_text(v)
    return str(v)


# Headers a reader expects for the rows' field names (the DataFrames keep the field names).
HEADERS = {"median_ms": "median ms", "min_ms": "min ms", "total_ms": "total ms",
           "time_ms": "time ms", "flops": "FLOPs", "gflops": "GFLOP/s", "gbs": "GB/s",
           "peak_pct": "% of peak", "bw_pct": "% of bandwidth", "intensity": "FLOPs/byte",
           "default_ms": "default ms", "best_ms": "best ms", "speedup": "speed-up"}
_CELL = "padding:2px 10px;white-space:nowrap"


def html_table(rows, columns=None, headers=HEADERS) -> str:
    """A plain HTML table of dict rows: columns (default: every key, in order of appearance)
    under readable headers (`headers` maps a field name to its header), numbers right-aligned
    and floats to 4 significant digits, missing cells empty, cells padded and unwrapped, the
    table scrolling sideways when it is wider than its place. Deterministic, and the same in
    every pandas version (it does not use pandas)."""
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f'<th style="text-align:left;{_CELL}">{escape(str(headers.get(c, c)))}</th>'
                   for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            num = _is_number(v)
            cells.append(f'<td style="text-align:{"right" if num else "left"};{_CELL}">'
                         f"{escape(cell_text(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div style="overflow-x:auto"><table class="tessera-table"><thead><tr>{head}</tr>'
            f'</thead><tbody>{"".join(body)}</tbody></table></div>')


def block_rows(x) -> list[dict]:
    """A mesh's devices, one row each: the rank, its coordinate on every axis and, for a sharded
    tensor (tessera.dist), the block it holds (its slices of each dimension, its shape) and
    whether the block is a pending term."""
    from ..dist import DTensor
    mesh = x.mesh if isinstance(x, DTensor) else x
    rows = []
    for r in range(mesh.size):
        row = {"rank": r, **mesh.coords(r)}
        if isinstance(x, DTensor):
            sl = x.layout.block(x.shape, mesh, r)
            row["block"] = "[" + ", ".join(f"{s.start}:{s.stop}" for s in sl) + "]"
            row["shape"] = "x".join(str(s.stop - s.start) for s in sl) or "scalar"
            if x.layout.partial:
                row["holds"] = " ".join(f"a term of the {op} over {a}"
                                        for a, op in x.layout.partial)
        rows.append(row)
    return rows


def block_html(x) -> str:
    """`block_rows` as HTML under the tensor's (or mesh's) text."""
    return f"<div><code>{escape(repr(x))}</code>{html_table(block_rows(x))}</div>"
