"""The notebook side of Tessera: the IPython extension and the IR explorer.

    %load_ext tessera

    %%tessera --shapes B=8,S=128,D=64
    def attention(q: Tensor["B","S","D"], k: Tensor["B","S","D"], v: Tensor["B","S","D"]):
        return op.softmax(q @ k.T) @ v

The cell runs in the notebook's namespace; its tessera functions (and plain `def`s whose
parameters carry `Tensor[...]` annotations, which become tessera functions) are bound there, and
the explorer of the last one is displayed: Graph (the shape flow, fusion clusters), Schedule,
Tile, Target, Profile and Autotune. `tessera.lab.explore(fn, shapes)` gives the same explorer
outside the magic; and with the extension loaded a Function or a Program as a cell's value shows
its explorer, a Graph IR its drawing, a Schedule or Tile IR its table or highlighted text. Everything drawn comes from `tessera.viz`; nothing imports this package.
"""
from __future__ import annotations

from .explorer import Explorer, explore, parse_shapes

__all__ = ["Explorer", "explore", "parse_shapes", "load_ipython_extension"]


def load_ipython_extension(ipython):
    from . import display
    from .magic import TesseraMagics
    ipython.register_magics(TesseraMagics)
    display.register(ipython)       # a Function, a Program or an IR as a cell's value: rich


def unload_ipython_extension(ipython):
    # IPython keeps registered magics; a later %load_ext registers them again, which is harmless
    from . import display
    display.unregister(ipython)
