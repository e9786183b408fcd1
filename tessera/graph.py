"""``graph.module(name)``: the seeds' spelling of a named tessera function."""
from __future__ import annotations

from .compiler.graph_ir import Graph
from .function import Function


def module(name: str, *, target: str = "cpu"):
    """Decorator: ``@graph.module("attention")`` compiles the function under that name."""
    if callable(name):
        return Function(name)
    return lambda fn: Function(fn, name=name, target=target)


__all__ = ["module", "Graph"]
