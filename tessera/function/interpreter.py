"""The Graph IR interpreter: a graph evaluated node by node with each operator's NumPy reference
(no compiler involved). `ts.interpret` and `check_grad` run on it."""
from __future__ import annotations

from ..compiler.graph_ir import Graph


def evaluate_graph(g: Graph, arrays) -> list:
    """Evaluate a Graph IR node by node with the NumPy references."""
    return g.evaluate(arrays)


def structured(g: Graph, out: list):
    """A flat list of results in the structure the function returned them in."""
    if g.output_tree is not None:
        return g.output_tree.unflatten(out)
    return out[0] if g.output_structure == "single" else (
        tuple(out) if g.output_structure == "tuple" else out)
