"""Sorting along an axis: argsort and sort (stable: equal elements keep their index order; NaN
last ascending, first descending, as NumPy and PyTorch). op.topk is their first k (tessera/op.py).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..errors import ShapeError
from ..types import TensorType
from .movement import along_transpose
from .registry import OpDef, Sort, norm_axis, register

def _normalize(types, attrs):
    t = types[0]
    return {"axis": norm_axis(attrs["axis"], t.rank, t), "descending": bool(attrs["descending"])}


def _infer(out_dtype):
    def infer(types, attrs):
        t = types[0]
        if t.rank == 0:
            raise ShapeError("sorting a rank-0 tensor (there is no axis)", received=str(t),
                             hint="reshape it to [1] first")
        norm_axis(attrs["axis"], t.rank, t)
        return TensorType(out_dtype or t.dtype, t.shape)
    return infer


def argsort_ref(a, axis, descending):
    """NumPy's stable argsort; descending: the ascending order of the reversed line, reversed
    (equal elements stay in index order, NaN comes first)."""
    if not descending:
        return np.argsort(a, axis=axis, kind="stable").astype(np.int64)
    n = a.shape[axis]
    up = np.argsort(np.flip(a, axis), axis=axis, kind="stable")
    return np.flip(n - 1 - up, axis).astype(np.int64)


def _sort_vjp(b, xs, y, g, a):
    """Each element's cotangent goes back where it came from: take_along_axis's transpose by
    the sort's permutation (recomputed)."""
    perm = b.op("argsort", xs[0], axis=a["axis"], descending=a["descending"])
    return [along_transpose(b, xs[0], perm, g, a["axis"])]


register(OpDef(
    "argsort", 1, {"axis": -1, "descending": False}, infer=_infer(dt.int64),
    normalize=_normalize,
    reference=lambda xs, t: argsort_ref(xs[0], t["axis"], t["descending"]),
    lowering=Sort(values=False), differentiable=False,
    doc="the indices that sort x along axis (stable: equal elements in index order; NaN last, "
        "first when descending), int64"))

register(OpDef(
    "sort", 1, {"axis": -1, "descending": False}, infer=_infer(None),
    normalize=_normalize,
    reference=lambda xs, t: np.take_along_axis(
        xs[0], argsort_ref(xs[0], t["axis"], t["descending"]), axis=t["axis"]),
    lowering=Sort(values=True), vjp=_sort_vjp,
    doc="x sorted along axis (stable; NaN last, first when descending)"))
