"""The Graph IR interpreter: a graph evaluated node by node with each operator's NumPy reference
(no compiler involved). `ts.interpret` and `check_grad` run on it."""
from __future__ import annotations

import numpy as np

from ..compiler.graph_ir import Graph
from ..errors import RuntimeFault
from ..ops.registry import run_reference


def evaluate_graph(g: Graph, arrays) -> list:
    """Evaluate a Graph IR node by node with the NumPy references."""
    env = {p.id: np.asarray(a) for p, a in zip(g.params, arrays)}
    live = {v.id for v in g.outputs}
    for n in reversed(g.nodes):        # a result nobody uses is not computed (as when compiled)
        if n.out.id in live:
            live.update(v.id for v in n.inputs)
    for n in g.nodes:
        if n.out.id not in live:
            continue
        if n.op == "const":
            env[n.out.id] = n.attrs["value"]
            continue
        try:
            r = run_reference(n.opdef, [env[v.id] for v in n.inputs], n.attrs)
        except IndexError as e:
            raise RuntimeFault(str(e), function=g.name, location=n.loc, op=n.op) from None
        env[n.out.id] = np.asarray(r, dtype=n.out.type.dtype.np)
    return [np.array(env[v.id]) for v in g.outputs]


def structured(g: Graph, out: list):
    """A flat list of results in the structure the function returned them in."""
    if g.output_tree is not None:
        return g.output_tree.unflatten(out)
    return out[0] if g.output_structure == "single" else (
        tuple(out) if g.output_structure == "tuple" else out)
