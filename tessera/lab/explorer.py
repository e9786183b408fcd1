"""The IR explorer: one function (or program) seen at every level, as notebook tabs.

An Explorer computes its sections once (lowering, and profiling or autotuning when asked) and
shows them two ways: a static HTML page (`<details>` sections, no script, no random ids, no
addresses, drawings as `<img>`s of their SVG) that a saved notebook renders untrusted and that
nbval compares, and, in a live kernel with ipywidgets, a Tab widget over the same sections.
"""
from __future__ import annotations

import html
import re

from .. import viz
from ..errors import ArgumentError, TesseraError
from ..function import Function

LEVELS = ("graph", "schedule", "tile", "target")
TITLES = {"graph": "Graph", "schedule": "Schedule", "tile": "Tile", "target": "Target",
          "profile": "Profile", "autotune": "Autotune"}
_SIZE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)\s*$")
_SCROLL = "max-height:32em;overflow:auto"


def parse_shapes(text: str | None) -> dict:
    """"B=8,S=128,D=64" -> {"B": 8, "S": 128, "D": 64}."""
    if not text:
        return {}
    sizes = {}
    for item in text.split(","):
        m = _SIZE.match(item)
        if m is None:
            raise ArgumentError(f"cannot read the size {item.strip()!r}",
                                expected="NAME=INT items separated by commas, e.g. B=8,S=128,D=64")
        if m.group(1) in sizes:
            raise ArgumentError(f"the size of {m.group(1)} is given twice")
        sizes[m.group(1)] = int(m.group(2))
    return sizes


def needs_arrays(fn) -> list:
    """The parameters of a tessera function that sizes alone cannot make arguments for: no
    Tensor[...] annotation with a rank, and no default."""
    params = fn.signature.sig.parameters
    return [p.name for p in fn.signature.params if (p.spec is None or p.spec.dims is None) and
            params[p.name].default is params[p.name].empty]


def explore(subject, shapes=None, *, target: str = "cpu", show=LEVELS, profile: bool = False,
            autotune: bool = False, budget_s: float = 10.0) -> "Explorer":
    """The explorer of a tessera function (symbolic, or lowered for `shapes`, a dict or
    "B=8,S=128" text) or of a Program (`fn.lower(*arrays)`)."""
    sizes = parse_shapes(shapes) if isinstance(shapes, str) else dict(shapes or {})
    return Explorer(subject, sizes, target=target, show=show, profile=profile,
                    autotune=autotune, budget_s=budget_s)


class Explorer:
    def __init__(self, subject, sizes=None, *, target="cpu", show=LEVELS, profile=False,
                 autotune=False, budget_s=10.0, runs=10, error: TesseraError | None = None):
        self.function = subject if isinstance(subject, Function) else None
        self.program = None if self.function is not None else subject
        self.sizes = dict(sizes or {})
        self.target = target
        self.show = [s for s in LEVELS if s in show]
        self.error = error
        self.profile = self.tuning = None
        self.notes: dict[str, str] = {}          # a section that could not be computed: why
        fn = self.function
        missing = needs_arrays(fn) if fn is not None and error is None else []
        if missing:         # a view of every level needs example arrays; say so in each section
            self.notes = dict.fromkeys(["graph", *self.show], (
                f"{fn.name} takes {', '.join(missing)} without a Tensor[...] annotation, so "
                f"sizes alone cannot lower it: explore a program instead, prog = "
                f"{fn.name}.lower(*arrays), then %tessera prog"))
        elif error is None and fn is not None and (self.sizes or not fn.symbols()):
            self.program = fn.specialize(self.sizes, target)
        if self.program is not None and profile:
            self._profile(runs)
        if self.program is not None and autotune:
            self._autotune(budget_s)
        self.sections = [(key, self._section(key)) for key in self._keys()]

    # -- what to show ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        if self.function is not None:
            return self.function.name
        return self.program.graph_ir.name

    def _keys(self):
        keys = ["graph"] if self.error is not None else list(self.show)
        if self.profile is not None or "profile" in self.notes:
            keys.append("profile")
        if self.tuning is not None or "autotune" in self.notes:
            keys.append("autotune")
        return keys

    def _args(self):
        if self.function is None:
            raise ArgumentError("profiling or autotuning a Program needs its function",
                                hint="explore the tessera function with shapes instead")
        return self.function.example_args(self.sizes)

    def _profile(self, runs):
        from ..runtime.profiler import profiler
        try:
            args = self._args()
            self.program(*args)                 # warm-up: first-touch of buffers, caches
            with profiler() as prof:
                for _ in range(runs):
                    self.program(*args)
            self.profile = prof
        except TesseraError as e:               # no device for this target, say
            self.notes["profile"] = e.summary

    def _autotune(self, budget_s):
        from ..autotune import autotune
        from ..compiler.driver import resolve_target
        if self.function is not None and \
                resolve_target(self.function.target) != self.program.target:
            self.notes["autotune"] = (f"the autotuner searches {self.function.name}'s own target "
                                      f"({self.function.target}), not {self.program.target}")
            return
        try:
            self.tuning = autotune(self.function, *self._args(), budget_s=budget_s,
                                   progress=False)
        except TesseraError as e:
            self.notes["autotune"] = e.summary

    def _section(self, key) -> str:
        prog = self.program
        if key in self.notes:
            return f"<p>Not available: {html.escape(self.notes[key])}</p>"
        if key == "graph":
            return self._graph()
        if prog is None:
            symbols = self.function.symbols() if self.function is not None else []
            example = ",".join(f"{s}=8" for s in symbols)
            return ("<p>The Graph IR is symbolic; give concrete sizes to lower it: "
                    f"<code>%%tessera --shapes {html.escape(example)}</code></p>")
        if key == "schedule":
            return schedule_html(prog.schedule_ir)
        if key == "tile":
            return code_html(prog.tile_ir, "ir")
        if key == "target":
            from ..runtime import targets
            language = targets.of(prog.target).language
            helpers, kernels = split_target_code(prog)
            sizes = getattr(prog, "dynamic_sizes", None)
            note = "" if not sizes else (
                "<p>A shape-generic library: its C reads " +
                ", ".join(f"<code>{s}</code>" for s in sizes) + " at run time and serves every "
                "size whose Tile IR it runs exactly; this program runs it with " +
                ", ".join(f"{s}={v}" for s, v in sizes.items()) + ".</p>")
            if not helpers:
                return note + code_html(kernels, language)
            n = helpers.count("\n") + 1
            return (note + code_html(kernels, language) +
                    f"<details><summary>the {n} lines before the kernels: prelude, our math "
                    f"functions, conversions and routine declarations</summary>"
                    f"{code_html(helpers, language)}</details>")
        if key == "profile":
            figs = [viz.profile_figure(self.profile), viz.roofline_figure(self.profile)]
            return viz.html_table(viz.profile_rows(self.profile)) + "".join(
                f"<div>{viz.img_html(viz.figure_svg(f), alt)}</div>"
                for f, alt in zip(figs, ("time per kernel", "roofline")))
        if key == "autotune":
            fig = viz.autotune_figure(self.tuning)
            return viz.html_table(viz.autotune_rows(self.tuning)) + \
                f"<div>{viz.img_html(viz.figure_svg(fig), 'candidates searched')}</div>"
        raise KeyError(key)

    def _graph(self) -> str:
        e = self.error
        if e is not None:       # the error itself is the cell's error output: said once, there
            where = f" at {e.location}" if e.location is not None else ""
            what = f"{e.op}{where}" if e.op else f"the failing operator{where}"
            img = "" if e.partial_graph is None else viz.img_html(
                viz.graph_svg(e.partial_graph, failing=e), f"the graph traced up to {what}")
            return (f"<p>The graph traced up to the {type(e).__name__}, {html.escape(what)} "
                    f"marked in red:</p>{img}")
        subject = self.program if self.program is not None else self.function.graph_ir
        return viz.img_html(viz.graph_svg(subject), f"Graph IR of @{self.name}")


    # -- the two faces -----------------------------------------------------------------------
    def summary(self) -> str:
        where = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        head = f"Explorer @{self.name}" + (f" [{where}]" if where else "")
        if self.error is not None:
            return f"{head}: stopped by {type(self.error).__name__} (Graph so far)"
        if "graph" in self.notes:
            return f"{head}: {self.notes['graph']}"
        if self.program is None:
            return f"{head}: symbolic Graph IR (give shapes to lower it)"
        n = len(self.program.schedule_ir.kernels)
        tabs = ", ".join(TITLES[k] for k, _ in self.sections)
        return f"{head} target={self.program.target}: {n} kernel{'s' * (n != 1)}; {tabs}"

    def html(self) -> str:
        parts = [f"<div class='tessera-explorer'><p><b>{html.escape(self.summary())}</b></p>"]
        for i, (key, body) in enumerate(self.sections):
            parts.append(f"<details{' open' if i == 0 else ''}><summary><b>{TITLES[key]}</b>"
                         f"</summary>{body}</details>")
        parts.append("</div>")
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self):
        return self.summary()

    def widget(self):
        """A Tab widget over the sections (None without ipywidgets). With a symbolic graph, a
        shapes box above it lowers the function when a line of sizes is entered."""
        try:
            import ipywidgets as w
        except ImportError:
            return None
        tabs = w.Tab(children=[w.HTML(body) for _, body in self.sections])
        for i, (key, _) in enumerate(self.sections):
            tabs.set_title(i, TITLES[key])
        if self.program is not None or self.function is None or self.error is not None or \
                "graph" in self.notes:
            return tabs
        box = w.Text(placeholder=",".join(f"{s}=8" for s in self.function.symbols()),
                     description="shapes", continuous_update=False)
        status = w.HTML()
        out = w.VBox([box, status, tabs])

        def lower(change):
            try:
                new = Explorer(self.function, parse_shapes(change["new"]), target=self.target,
                               show=self.show)
            except TesseraError as e:     # (the previous sizes' tabs would be stale: dropped)
                status.value = f"<pre style='color:#b00'>{html.escape(str(e))}</pre>"
                out.children = [box, status]
                return
            status.value = ""
            out.children = [box, status, new.widget()]
        box.observe(lower, names="value")
        return out

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": self.summary(), "text/html": self.html()}
        if _in_kernel() and self.error is None:     # (an error's graph is one drawing: no tabs)
            w = self.widget()
            view = w._repr_mimebundle_() if w is not None else None
            key = "application/vnd.jupyter.widget-view+json"
            if view and key in view:
                bundle[key] = view[key]
        return bundle


def code_html(obj, language) -> str:
    """An IR or a source, highlighted, in a box that scrolls."""
    return f"<div style='{_SCROLL}'>{viz.highlight_html(str(obj), language)}</div>"


def schedule_html(schedule) -> str:
    """A Schedule IR's kernel table, then its text."""
    return viz.html_table(viz.schedule_rows(schedule)) + code_html(schedule, "ir")


def split_target_code(prog) -> tuple[str, str]:
    """(what comes before the kernels, the kernels and the entry point) of a program's source:
    the user's kernels first, the helpers folded below them. Each kernel's text opens with the
    comment naming its strategy and the operators it computes."""
    code = prog.target_code
    kernels = prog.tile_ir.kernels
    if not kernels:
        return "", code
    at = code.find(f"\n/* {kernels[0].strategy}: {kernels[0].origin}")
    if at < 0:
        return "", code
    return code[:at].rstrip("\n"), code[at + 1:]


def _in_kernel() -> bool:
    """A live Jupyter kernel (where widgets can talk to the front end)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None
