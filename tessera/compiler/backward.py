"""Reverse-mode automatic differentiation as a Graph IR transform.

``backward`` differentiates a range of a graph's nodes (those one call added to a graph being
traced, or a whole imported graph): it walks them from the outputs back to the arguments, calls
each operator's adjoint rule (the ``vjp`` of its registry entry) with a Builder writing into the
same graph, and accumulates the cotangents. So the backward graph is ordinary Graph IR: it prints
with the forward graph, compiles through the same pipeline and fuses like anything else; and the
backward nodes have adjoints themselves, which is what makes grad of grad work. No tracer is
needed: any Graph can be differentiated.

Decisions:
* Only the nodes in ``graph.nodes[start:end]`` are differentiated; anything made before
  (captured tensors, the caller's earlier work) is a constant here. Nesting therefore needs no
  tags: an outer derivative walks a range that holds the inner forward *and* backward nodes.
* Only float values carry cotangents. An integer or bool value (indices, masks, argmax) stops
  the gradient, so a float that depends on the arguments only through one gets none.
* A node is visited only if it depends on an argument and its result reaches an output, so an
  operator without an adjoint raises ``DifferentiationError`` (naming it, the user's line and
  the function) only where its derivative is really needed; an operator registered with
  ``differentiable=False`` has a zero derivative instead.
* A rule may return a cotangent in the output's broadcast shape or another float dtype;
  ``fit`` sums it back to the input's shape (the one shared broadcasting adjoint, ``sum_to``)
  and casts it to the input's dtype.
* Nodes a rule made that no kept cotangent uses (the cotangent of a constant exponent, say)
  are removed at once, so the printed graph holds only what the gradient needs. Backward nodes
  carry the source location of the forward node they differentiate.
* Accumulation order is fixed (reverse node order, then operand order): the graph, and so the
  compiled gradient, is the same on every trace.
"""
from __future__ import annotations

from ..errors import DifferentiationError, TesseraError, enrich
from ..ops.registry import sum_to
from .graph_ir import Builder, Graph, Value


def is_float(v: Value) -> bool:
    return v.type.dtype.is_float


def fit(b: Builder, ct: Value, value_type) -> Value:
    """A cotangent in its value's shape and dtype."""
    ct = sum_to(b, ct, value_type.shape)
    if ct.dtype != value_type.dtype:
        ct = b.op("cast", ct, dtype=value_type.dtype.name)
    return ct


def backward(g: Graph, start: int, end: int, outputs, cotangents, wrt, function: str | None = None,
             loc=None) -> list:
    """Cotangents of ``wrt`` (values made before ``start``) given ``cotangents`` of ``outputs``
    (Graph IR values), through the nodes ``g.nodes[start:end]``. Returns one value per ``wrt``
    item, or None where no path leads from it to an output (the caller picks zeros). The nodes
    made for the outputs' cotangents carry ``loc``; every other backward node, the location of
    the forward node it differentiates."""
    nodes = g.nodes[start:end]
    active = {w.id for w in wrt if is_float(w)}
    for n in nodes:
        if n.inputs and is_float(n.out) and any(v.id in active for v in n.inputs):
            active.add(n.out.id)
    ct: dict = {}

    def accumulate(b, v, c):
        prev = ct.get(v.id)
        ct[v.id] = c if prev is None else b.op("add", prev, c)

    seed = Builder(g, loc)
    for o, c in zip(outputs, cotangents):
        if c is not None and o.id in active:
            accumulate(seed, o, fit(seed, c, o.type))
    for n in reversed(nodes):
        gy = ct.pop(n.out.id, None)
        if gy is None:
            continue
        opdef = n.opdef
        if opdef.vjp is None:
            if not opdef.differentiable:
                continue
            raise DifferentiationError(
                f"{n.op} has no adjoint rule, so this function cannot be differentiated through "
                "it", function=function, location=n.loc, op=n.op,
                hint=f"give the {n.op} entry of the operator registry a vjp (in "
                     f"tessera/ops/), written with other operators")
        before = len(g.nodes)
        b = Builder(g, n.loc)
        try:
            res = opdef.vjp(b, list(n.inputs), n.out, gy, n.attrs)
            if len(res) != len(n.inputs):
                raise DifferentiationError(f"the adjoint of {n.op} returned {len(res)} "
                                           f"cotangents for {len(n.inputs)} operands")
            touched = []
            for v, r in zip(n.inputs, res):
                if r is not None and v.id in active:
                    accumulate(b, v, fit(b, r, v.type))
                    touched.append(v.id)
        except TesseraError as e:
            raise enrich(e, function=function, location=n.loc, op=n.op) from None
        _prune(g, before, {ct[i].id for i in touched})
    return [ct.get(w.id) for w in wrt]


def _prune(g, before: int, roots: set):
    """Drop the nodes made since ``before`` that no root needs (nothing else can use them)."""
    live, keep = set(roots), []
    for m in reversed(g.nodes[before:]):
        if m.out.id in live:
            keep.append(m)
            live.update(v.id for v in m.inputs)
    g.nodes[before:] = keep[::-1]
