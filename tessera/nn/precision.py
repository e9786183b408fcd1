"""Mixed precision for a parameter pytree: ``ts.to_mixed_precision`` (the seeds' spelling).

    mp = ts.to_mixed_precision(params, compute=ts.bf16, accumulate=ts.f32, storage=ts.fp8)
    @ts.function(policy=mp.policy)
    def loss(stored, scales, x, y):
        p = mp.unpack(stored, scales)                 # bfloat16 parameters, inside the trace
        return nn.mse(model(p, x), y)
    loss(mp.stored, mp.scales, x, y)

Each float leaf is stored in ``storage`` (``compute`` when None). fp8 has too little range for
raw weights (e4m3fn's smallest normal is 2**-6), so a leaf stored in fp8 gets a per-tensor
scale: the power of two that maps its largest magnitude to at most the format's largest finite
value, so dividing and multiplying by it are exact; other storages get the scale 1. ``unpack``
widens each stored leaf exactly, multiplies by its scale and rounds once to ``compute``.
``policy`` accumulates in ``accumulate`` (float32: the default for narrow operands, stated).
Integer and bool leaves pass through unchanged.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as dt
from .. import op
from ..errors import ArgumentError
from ..numerics import NumericalPolicy
from ..pytree import flatten, tree_map


class MixedPrecision:
    def __init__(self, stored, scales, compute: dt.DType, storage: dt.DType,
                 policy: NumericalPolicy):
        self.stored, self.scales = stored, scales
        self.compute, self.storage, self.policy = compute, storage, policy

    def unpack(self, stored=None, scales=None):
        """The parameters in the compute dtype (eager on arrays, or traced on tensors)."""
        stored = self.stored if stored is None else stored
        scales = self.scales if scales is None else scales
        return tree_map(self._leaf, stored, scales)

    def _leaf(self, q, scale):
        d = getattr(q, "dtype", None)
        d = d if isinstance(d, dt.DType) else dt.from_numpy(np.asarray(q).dtype)
        if not d.is_float:
            return q
        if d.is_fp8:
            return op.cast(op.cast(q, dt.float32) * scale, self.compute)
        return op.cast(q, self.compute)

    def nbytes(self) -> tuple[int, int]:
        """(bytes stored, bytes the same leaves take in float32)."""
        leaves = [np.asarray(x) for x in flatten(self.stored)[0]]
        return (sum(x.nbytes for x in leaves),
                sum(x.size * (4 if x.dtype.kind in "fV" else x.itemsize) for x in leaves))

    def __repr__(self):
        stored, f32 = self.nbytes()
        return (f"<MixedPrecision compute={self.compute.name} storage={self.storage.name} "
                f"{self.policy}: {stored} bytes stored, {f32} in float32>")


def to_mixed_precision(params, compute=dt.bfloat16, accumulate=dt.float32, storage=None):
    compute = dt.get(compute)
    storage = compute if storage is None else dt.get(storage)
    if not compute.is_float or not storage.is_float:
        raise ArgumentError(f"compute and storage are float dtypes, not {compute.name} and "
                            f"{storage.name}")
    policy = NumericalPolicy(accumulation=accumulate)

    def store(x):
        a = np.asarray(x)
        if not dt.from_numpy(a.dtype).is_float:
            return a, np.float32(1.0)
        if not storage.is_fp8:
            return dt.convert(a, storage), np.float32(1.0)
        wide = a.astype(np.float32)
        amax = float(np.max(np.abs(wide))) if wide.size else 0.0
        if not math.isfinite(amax):
            raise ArgumentError("a parameter holds inf or NaN: no fp8 scale fits it")
        e = 0 if amax == 0 else math.ceil(math.log2(amax / storage.max_finite))
        scale = np.float32(2.0 ** e)
        return (wide / scale).astype(storage.np), scale

    leaves, td = flatten(params)
    pairs = [store(x) for x in leaves]
    return MixedPrecision(td.unflatten([q for q, _ in pairs]),
                          td.unflatten([s for _, s in pairs]), compute, storage, policy)
