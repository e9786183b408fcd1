"""Structured control flow as operators: fori_loop, while_loop, scan and cond. Their nested graphs
live in a Region (tessera/compiler/graph_ir.py) named by each result node's attrs; the front end
is tessera/control.py. Each result's type is the region's; the reference runs the region."""
from __future__ import annotations

from ..errors import DifferentiationError
from .registry import OpDef, register

REGION_OPS = ("fori_loop", "while_loop", "scan", "cond")

_DOC = {
    "fori_loop": "carry = body(i, carry) for i in range(lo, hi)",
    "while_loop": "while cond(carry): carry = body(carry)",
    "scan": "carry, y_t = body(carry, x_t) for each slice t of xs; ys stacked",
    "cond": "true_fn(*operands) if pred else false_fn(*operands)",
}


def _infer(types, attrs):
    return attrs["region"].types[attrs["result"]]


def _reference(arrays, attrs):
    return attrs["region"].run(arrays)[attrs["result"]]


def _no_reverse_mode(kind):
    def vjp(b, xs, y, g, attrs):
        hint = ("a while loop's trip count is known only when it runs: write the loop with "
                "ts.fori_loop (a static trip count) to differentiate it" if kind == "while_loop"
                else "unroll it with ts.static_range for now, or differentiate the body alone")
        raise DifferentiationError(f"reverse-mode differentiation through ts.{kind} is not "
                                   "supported", location=attrs["region"].loc, op=kind, hint=hint)
    return vjp


for _kind in REGION_OPS:
    register(OpDef(_kind, -1, {"region": None, "result": 0}, infer=_infer, reference=_reference,
                   vjp=_no_reverse_mode(_kind), doc=_DOC[_kind]))
