"""Rich display of Tessera's objects as a cell's value, while the extension is loaded: a
Function or a Program shows its explorer, a Graph IR (or a sharded plan) its drawing (an image
output of its own, which renders in an untrusted notebook too), a Schedule IR its kernel table,
a Tile IR its highlighted text, a mesh its devices and a sharded tensor its blocks (a table).
Each keeps its plain text beside, so nothing is lost where HTML is not shown.
"""
from __future__ import annotations

from .. import viz
from ..errors import TesseraError
from .explorer import code_html, explore, schedule_html


def _explorer(obj, include=None, exclude=None):
    try:
        return explore(obj)._repr_mimebundle_(include, exclude)
    except TesseraError:
        return None         # (what cannot be explored shows as its plain repr)


def _graph(g, include=None, exclude=None):
    bundle, meta = _bundle(viz.graph_image(g)._repr_mimebundle_())
    return {**bundle, "text/plain": str(g)}, meta


def _bundle(shown) -> tuple:
    return shown if isinstance(shown, tuple) else (shown, {})


def _schedule(s, include=None, exclude=None):
    return {"text/plain": str(s), "text/html": schedule_html(s)}


def _tile(t, include=None, exclude=None):
    return {"text/plain": str(t), "text/html": code_html(t, "ir")}


def _blocks(x, include=None, exclude=None):
    return {"text/plain": repr(x), "text/html": viz.block_html(x)}


def formatters() -> dict:
    """type -> mimebundle function, for IPython's mimebundle formatter."""
    from ..compiler.graph_ir import Graph
    from ..compiler.program import GPUProgram, Program
    from ..compiler.schedule_ir import ScheduleProgram
    from ..compiler.tile_ir import TileProgram
    from ..dist import DTensor, Mesh
    from ..dist.spmd import Plan
    from ..function import Function
    return {Function: _explorer, Program: _explorer, GPUProgram: _explorer, Graph: _graph,
            ScheduleProgram: _schedule, TileProgram: _tile, Plan: _graph, DTensor: _blocks,
            Mesh: _blocks}


def register(ipython):
    fmt = ipython.display_formatter.mimebundle_formatter
    for typ, func in formatters().items():
        fmt.for_type(typ, func)


def unregister(ipython):
    fmt = ipython.display_formatter.mimebundle_formatter
    for typ in formatters():
        fmt.type_printers.pop(typ, None)

