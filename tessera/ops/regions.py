"""Structured control flow as operators: fori_loop, while_loop, scan and cond. Their nested graphs
live in a Region (tessera/compiler/graph_ir.py) named by each result node's attrs; the front end
is tessera/control.py. Each result's type is the region's; the reference runs the region."""
from __future__ import annotations

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


for _kind in REGION_OPS:
    # (their adjoints are written by the autodiff pass itself, compiler/backward.py: one for
    # all of a region's results)
    # complex carries and operands: split into their parts with the bodies (split_complex)
    register(OpDef(_kind, -1, {"region": None, "result": 0}, infer=_infer, reference=_reference,
                   doc=_DOC[_kind], takes_complex=True))
