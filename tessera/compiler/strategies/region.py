"""region: a control-flow operator (fori_loop, while_loop, scan, cond), never a kernel. Its
results are sibling nodes that start groups of their own and take nothing in; the kernels pass
schedules its bodies' kernels inside a RegionStep (compiler/scheduler.py) and the C renderer
writes the loop or branch around them in the program's entry point."""
from __future__ import annotations

from ...ops.regions import REGION_OPS
from .base import Strategy, register


class RegionStrategy(Strategy):
    name = "region"
    makes_kernels = False
    grows = False

    def claims(self, n) -> bool:
        return n.op in REGION_OPS


register(RegionStrategy())
