"""matplotlib figures of a Profile (per-kernel times, the roofline) and an autotuning result, and
their SVG/PNG. Figures are built with matplotlib.figure.Figure on an Agg canvas, never pyplot: no
window opens and no global figure list grows."""
from __future__ import annotations

import io
import math

from ..errors import ArgumentError, BackendUnavailableError
from .svg import svg_body

STATUS_COLORS = {"default": "#1a73e8", "ok": "#188038", "slower": "#f29900",
                 "same code": "#9aa0a6", "failed to compile": "#d93025",
                 "wrong result": "#a50e0e", "timed out": "#7627bb", "pending": "#dadce0"}


def new_figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise BackendUnavailableError("tessera.viz figures need matplotlib, which is not "
                                      "installed", hint="pip install matplotlib") from None
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def finish(fig):
    """Lay the figure out once and keep that layout: the constrained-layout solver would run
    again on every save and move things by a last digit, so two saves would differ."""
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    return fig


def _kernel_labels(rows) -> list[str]:
    """Kernel names, prefixed with the function (and shapes) when a profile has several."""
    groups = list(dict.fromkeys((r["function"], r["shapes"]) for r in rows))
    fns = {f for f, _ in groups}
    if len(groups) == 1:
        return [r["kernel"] for r in rows]
    if len(fns) == len(groups):
        return [f"{r['function']}.{r['kernel']}" for r in rows]
    return [f"{r['function']}[{r['shapes']}].{r['kernel']}" for r in rows]


def _nothing(message: str):
    """A figure that says there is nothing to draw (an empty profile, a search with no
    candidates), so a viewer can show it like any other."""
    fig = new_figure(6, 1.2)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=10, color="#5f6368")
    return finish(fig)


def profile_figure(profile):
    """A horizontal bar per kernel: its median time in ms (the minimum marked), first on top."""
    rows = profile.rows()
    if not rows:
        return _nothing("no kernel launches recorded")
    labels = _kernel_labels(rows)
    fig = new_figure(7, 1.0 + 0.32 * len(rows))
    ax = fig.add_subplot()
    y = list(range(len(rows)))
    med = [r["median_ms"] for r in rows]
    ax.barh(y, med, color=[STATUS_COLORS["default"]] * len(rows), height=0.6, label="median")
    ax.plot([r["min_ms"] for r in rows], y, "|", color="#202124", markersize=12, label="min")
    for yi, r in zip(y, rows):
        ax.annotate(f" {r['median_ms']:.3g} ms  {r['strategy']}", (r["median_ms"], yi),
                    va="center", fontsize=8, color="#3c4043")
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time per launch (ms)")
    ax.set_xlim(0, max(med) * 1.35 or 1)
    ax.set_title(f"kernel times ({profile.calls} program runs)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))   # beside: no bar hidden
    return finish(fig)


def roofline_figure(profile, peaks=None):
    """Log-log roofline: each kernel's arithmetic intensity (FLOPs per byte moved) against its
    achieved GFLOP/s, under the machine's measured FMA peak and copy-bandwidth roof (peaks: a
    dict with fma_gflops and copy_gbs; default the Profile's, from machine_peaks()). Kernels
    without FLOPs (copies) have no place on it and are counted in the title."""
    rows = profile.rows()
    if not rows:
        return _nothing("no kernel launches recorded")
    peaks = peaks if peaks is not None else profile.peaks()
    try:
        peak, bw = float(peaks["fma_gflops"]), float(peaks["copy_gbs"])
    except (KeyError, TypeError, ValueError):
        raise ArgumentError("peaks must be a dict with fma_gflops and copy_gbs",
                            received=repr(peaks)) from None
    labels = _kernel_labels(rows)
    shown = [(lab, r) for lab, r in zip(labels, rows)
             if r["flops"] > 0 and r["bytes"] > 0 and 0 < r["gflops"] < math.inf]
    fig = new_figure(7, 4.5)
    ax = fig.add_subplot()
    ridge = peak / bw
    xs = [r["flops"] / r["bytes"] for _, r in shown]
    lo = min(xs + [ridge]) / 8
    hi = max(xs + [ridge]) * 8
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(peak, bw * x) for x in grid], color="#202124", linewidth=1.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ys = [r["gflops"] for _, r in shown] + [peak]
    ax.set_ylim(min(ys) / 4, peak * 3)
    ax.set_xlim(lo, hi)
    # the roofs' labels sit just above their lines, the bandwidth's along its slope
    ax.annotate(f"FMA peak {peak:.0f} GFLOP/s", (hi, peak), xytext=(-4, 3),
                textcoords="offset points", ha="right", va="bottom", fontsize=8)
    x0 = max(lo * 1.5, min(ys) / 4 / bw * 2)       # where the bandwidth line is in view
    (ax0, ay0), (ax1, ay1) = ax.transData.transform([(x0, bw * x0), (x0 * 2, bw * x0 * 2)])
    ax.annotate(f"copy {bw:.1f} GB/s", (x0, bw * x0), xytext=(0, 4), textcoords="offset points",
                ha="left", va="bottom", fontsize=8, rotation_mode="anchor",
                rotation=math.degrees(math.atan2(ay1 - ay0, ax1 - ax0)))
    for (lab, r), x in zip(shown, xs):
        ax.plot([x], [r["gflops"]], "o", color=STATUS_COLORS["default"])
        ax.annotate(lab, (x, r["gflops"]), xytext=(5, 0), textcoords="offset points",
                    fontsize=7, va="center")
    ax.set_xlabel("arithmetic intensity (FLOPs / byte)")
    ax.set_ylabel("achieved GFLOP/s")
    left_out = len(rows) - len(shown)
    note = f" ({left_out} kernels without FLOPs not shown)" if left_out else ""
    ax.set_title("roofline" + note, fontsize=10)
    ax.grid(True, which="major", linewidth=0.3)
    return finish(fig)


def autotune_figure(result):
    """One panel per tuned kernel: each candidate's median time (ms) in the search's order,
    coloured by status; candidates without a time (failed, wrong, timed out) sit on the top edge
    as crosses; the default is ringed, the chosen knobs starred."""
    kernels = [kt for kt in result.kernels if kt.candidates]
    if not kernels:
        return _nothing("no kernel had knobs to search")
    fig = new_figure(7.5, 0.6 + 2.6 * len(kernels))
    axes = fig.subplots(len(kernels), 1, squeeze=False)[:, 0]
    for ax, kt in zip(axes, kernels):
        cands = sorted(kt.candidates, key=lambda c: c.order)
        timed = [c.median * 1e3 for c in cands if c.median is not None]
        top = max(timed, default=1.0) * 1.15
        seen = set()
        for x, c in enumerate(cands):
            color = STATUS_COLORS.get(c.status, "#5f6368")
            label = c.status if c.status not in seen else None
            seen.add(c.status)
            if c.median is None:
                ax.plot([x], [top], "x", color=color, label=label)
                continue
            y = c.median * 1e3
            ax.plot([x], [y], "o", color=color, label=label, markersize=5)
            if c.order == 0:
                ax.plot([x], [y], "o", markersize=11, markerfacecolor="none",
                        markeredgecolor=STATUS_COLORS["default"])
            if c.knobs == kt.best_knobs and c.status in ("ok", "default"):
                ax.plot([x], [y], "*", markersize=14, color="#fbbc04", markeredgecolor="#202124",
                        label="best")
        if len(cands) <= 24:
            from .tables import knob_text
            ax.set_xticks(range(len(cands)), [knob_text(c.changed) or "default" for c in cands],
                          rotation=40, ha="right", fontsize=7)
        else:
            ax.set_xlabel("candidate (search order)")
        ax.set_ylim(0, top * 1.08)
        ax.set_ylabel("ms")
        ax.set_title(f"{kt.name} ({kt.strategy}): {kt.default_s * 1e3:.3g} ms -> "
                     f"{kt.best_s * 1e3:.3g} ms (x{kt.speedup:.2f})", fontsize=9)
        ax.legend(fontsize=7, loc="best")
    return finish(fig)


def figure_svg(fig) -> str:
    """The figure as SVG text: no date, element ids from a fixed salt, so the same figure gives
    the same text on every run (the figures here keep their layout fixed; a figure of your own
    with a layout engine is laid out again by each save); the XML prolog dropped so it embeds
    in HTML."""
    import matplotlib
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "tessera", "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return svg_body(buf.getvalue())


def figure_png(fig, dpi: int = 100) -> bytes:
    """The figure as PNG bytes (Agg)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
