"""Reductions: sum, max, min (primitive), argmax/argmin, mean/var (decomposed), and the
running sums and products along an axis (cumsum, cumprod)."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError
from ..shapes import prod
from ..types import TensorType
from .registry import (ArgReduce, OpDef, Reduce, Scan, count_value, flip, keepdim_shape,
                       norm_axes, norm_axis, register, zeros)

REDUCE_ATTRS = {"axis": None, "keepdim": False}


def reduced_shape(t: TensorType, axes, keepdim):
    if keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(t.shape))
    return tuple(d for i, d in enumerate(t.shape) if i not in axes)


def normalize_axes(types, attrs):
    return {**attrs, "axis": list(norm_axes(attrs["axis"], types[0])),
            "keepdim": bool(attrs["keepdim"])}


def reduce_infer(out_dtype, needs_elements=False):
    def infer(types, attrs):
        t = types[0]
        axes = norm_axes(attrs["axis"], t)
        if needs_elements and any(t.shape[a] == 0 for a in axes):
            raise ShapeError("this reduction has no identity, and an axis it reduces has size 0",
                             received=str(t))
        return TensorType(out_dtype(t.dtype), reduced_shape(t, axes, attrs["keepdim"]))
    return infer


def sum_dtype(d):
    """NumPy's: a float stays, an integer sums in the 64-bit integer of its signedness (bool in
    int64)."""
    return d if d.is_float or d.is_complex else dt.uint64 if d.is_unsigned else dt.int64


def same_dtype(d):
    return d


def float_dtype(d):
    return dt.default_float_for(d)


def _np_axis(attrs):
    a = attrs["axis"]
    return tuple(a) if isinstance(a, (list, tuple)) else a


# Adjoints of reductions: the cotangent, reshaped to keepdim form, broadcasts back over the
# reduced axes.
def _kept(b, t, x, attrs):
    """t (a reduction's output or its cotangent) with the reduced axes as size-1 axes."""
    return t if attrs["keepdim"] else b.op("reshape", t, shape=keepdim_shape(x.shape, attrs["axis"]))


def _sum_vjp(b, xs, y, g, a):
    return [b.op("broadcast_to", _kept(b, g, xs[0], a), shape=list(xs[0].shape))]


def _extremum_vjp(b, xs, y, g, a):
    """max/min: every element equal to the extremum shares the gradient equally (ties are
    rare with real data; the split is symmetric and deterministic, as PyTorch's amax does)."""
    x = xs[0]
    hit = b.op("eq", x, _kept(b, y, x, a))
    count = b.op("sum", b.op("cast", hit, dtype=g.dtype.name), axis=a["axis"], keepdim=True)
    return [b.op("where", hit, b.op("div", _kept(b, g, x, a), count), 0)]


register(OpDef(
    "sum", 1, dict(REDUCE_ATTRS), infer=reduce_infer(sum_dtype), normalize=normalize_axes,
    reference=lambda a, t: np.sum(a[0], axis=_np_axis(t), keepdims=t["keepdim"],
                                  dtype=sum_dtype(dt.from_numpy(a[0].dtype)).np),
    lowering=Reduce(),
    vjp=_sum_vjp,
    accumulates=True,
    doc="sum over axis (all axes when None)"))

def _prod_vjp(b, xs, y, g, a):
    """d prod / dx_i = the product of the others: the reduced axes moved last and merged, then
    the exclusive running products from each side multiplied (no division, so zeros are exact)."""
    x = xs[0]
    axes, rank = sorted(a["axis"]), len(x.shape)
    n = prod([x.shape[k] for k in axes])
    if n == 0:
        return [zeros(b, x)]
    keep = [k for k in range(rank) if k not in axes]
    perm = keep + axes
    back = [perm.index(k) for k in range(rank)]
    moved = [x.shape[k] for k in perm]
    flat = b.op("reshape", b.op("transpose", x, perm=perm),
                shape=[x.shape[k] for k in keep] + [n])
    one = b.op("broadcast_to", b.const_like(1, flat), shape=[x.shape[k] for k in keep] + [1])

    def exclusive(v):                       # [1, v0, v0 v1, ...]: the running product before i
        last = len(keep)
        head = b.op("slice", v, starts=[None] * (last + 1), stops=[None] * last + [n - 1],
                    steps=[1] * (last + 1))
        return b.op("cumprod", b.op("concat", [one, head], axis=last), axis=last)
    others = b.op("mul", exclusive(flat), flip(b, exclusive(flip(b, flat, len(keep))), len(keep)))
    gk = b.op("reshape", _kept(b, g, x, a), shape=[x.shape[k] for k in keep] + [1])
    d = b.op("mul", gk, b.op("conj", others) if x.dtype.is_complex else others)
    return [b.op("transpose", b.op("reshape", d, shape=moved), perm=back)]


register(OpDef(
    "prod", 1, dict(REDUCE_ATTRS), infer=reduce_infer(sum_dtype), normalize=normalize_axes,
    reference=lambda a, t: np.prod(a[0], axis=_np_axis(t), keepdims=t["keepdim"],
                                   dtype=sum_dtype(dt.from_numpy(a[0].dtype)).np),
    lowering=Reduce(),
    vjp=_prod_vjp, accumulates=True,
    doc="product over axis (all axes when None); integers and bool in int64 or uint64, as "
        "NumPy"))

register(OpDef(
    "max", 1, dict(REDUCE_ATTRS), infer=reduce_infer(same_dtype, True),
    normalize=normalize_axes,
    reference=lambda a, t: np.max(a[0], axis=_np_axis(t), keepdims=t["keepdim"]),
    lowering=Reduce(), vjp=_extremum_vjp,
    doc="maximum over axis; NaN propagates"))

register(OpDef(
    "min", 1, dict(REDUCE_ATTRS), infer=reduce_infer(same_dtype, True),
    normalize=normalize_axes,
    reference=lambda a, t: np.min(a[0], axis=_np_axis(t), keepdims=t["keepdim"]),
    lowering=Reduce(), vjp=_extremum_vjp,
    doc="minimum over axis; NaN propagates"))


def _arg_normalize(types, attrs):
    t = types[0]
    axis = attrs["axis"]
    if isinstance(axis, (list, tuple)):
        raise ShapeError("argmax/argmin take one axis or None", received=str(list(axis)))
    return {**attrs, "axis": None if axis is None else norm_axis(axis, t.rank, t),
            "keepdim": bool(attrs["keepdim"])}


def _arg_infer(types, attrs):
    t = types[0]
    if t.dtype.is_bool:
        raise DTypeError("argmax/argmin of a bool tensor", received="bool",
                         hint="cast to int32 first")
    axes = norm_axes(attrs["axis"], t)
    if any(t.shape[a] == 0 for a in axes) or (attrs["axis"] is None and t.rank and 0 in t.shape):
        raise ShapeError("argmax/argmin over an empty axis", received=str(t))
    return TensorType(dt.int64, reduced_shape(t, axes, attrs["keepdim"]))


for _name, _np_fn, _cmp in [("argmax", np.argmax, ">"), ("argmin", np.argmin, "<")]:
    register(OpDef(
        _name, 1, {"axis": None, "keepdim": False}, infer=_arg_infer,
        normalize=_arg_normalize,
        reference=(lambda fn: lambda a, t: np.asarray(
            fn(a[0], axis=t["axis"], keepdims=t["keepdim"]), dtype=np.int64))(_np_fn),
        lowering=ArgReduce(),
        differentiable=False,
        doc=f"index of the first {'largest' if _cmp == '>' else 'smallest'} element"))


# ---- running sums and products along one axis ---------------------------------------------------
def _scan_normalize(types, attrs):
    t = types[0]
    return {**attrs, "axis": norm_axis(attrs["axis"], t.rank, t)}


def _scan_infer(types, attrs):
    t = types[0]
    norm_axis(attrs["axis"], t.rank, t)
    return TensorType(sum_dtype(t.dtype), t.shape)


def _cumsum_vjp(b, xs, y, g, a):            # each x[i] reaches every y[j], j >= i
    return [flip(b, b.op("cumsum", flip(b, g, a["axis"]), axis=a["axis"]), a["axis"])]


def _cumprod_vjp(b, xs, y, g, a):
    """dx_i = y_(i-1) z_i with z_i = g_i + x_(i+1) z_(i+1): a reverse linear recurrence, run by a
    scan along the axis (moved first), with no division, so zeros in x are exact."""
    x, ax = xs[0], a["axis"]
    rank, n = x.ndim, x.shape[ax]
    if n == 0:
        return [zeros(b, x)]
    perm = [ax] + [i for i in range(rank) if i != ax]
    back = [perm.index(i) for i in range(rank)]
    xt, gt, yt = (b.op("transpose", v, perm=perm) for v in (x, g, y))
    rest = list(xt.shape[1:])

    def rows(v, lo, hi):
        return b.op("slice", v, starts=[lo] + [None] * (rank - 1),
                    stops=[hi] + [None] * (rank - 1), steps=[1] * rank)
    one = b.op("broadcast_to", b.const_like(1, xt), shape=[1] + rest)
    x_next = b.op("concat", [rows(xt, 1, None), one], axis=0)        # x_(i+1) (x_n: any)
    y_prev = b.op("concat", [one, rows(yt, 0, n - 1)], axis=0)       # y_(i-1) (y_(-1) = 1)

    def step(bb, c, s):
        z = bb.op("add", s[0], bb.op("mul", s[1], c[0]))
        return [z], [z]
    _, z = b.scan(step, [zeros(b, xt, rest)], [gt, x_next], reverse=True)
    return [b.op("transpose", b.op("mul", y_prev, z), perm=back)]


for _name, _np_fn in [("cumsum", np.cumsum), ("cumprod", np.cumprod)]:
    register(OpDef(
        _name, 1, {"axis": -1}, infer=_scan_infer, normalize=_scan_normalize,
        reference=(lambda fn: lambda a, t: fn(
            a[0], axis=t["axis"], dtype=sum_dtype(dt.from_numpy(a[0].dtype)).np))(_np_fn),
        lowering=Scan(),
        vjp=_cumsum_vjp if _name == "cumsum" else _cumprod_vjp, accumulates=True,
        doc=f"running {'sum' if _name == 'cumsum' else 'product'} along axis, in order "
            "(integers and bool in int64 or uint64, as NumPy)"))


def _count(t: TensorType, axes):
    return prod([t.shape[a] for a in axes])


def _mean_decompose(b, x, attrs):
    t = b.type(x)
    f = dt.default_float_for(t.dtype)
    if f != t.dtype:
        x = b.op("cast", x, dtype=f.name)
    s = b.op("sum", x, axis=attrs["axis"], keepdim=attrs["keepdim"])
    return b.op("div", s, b.const(_count(t, norm_axes(attrs["axis"], t)), f))


def _mean_vjp(b, xs, y, g, a):
    x = xs[0]
    n = count_value(b, x.shape, a["axis"], g)
    return [b.op("broadcast_to", b.op("div", _kept(b, g, x, a), n), shape=list(x.shape))]


register(OpDef(
    "mean", 1, dict(REDUCE_ATTRS), infer=reduce_infer(float_dtype),
    normalize=normalize_axes,
    reference=lambda a, t: np.mean(a[0], axis=_np_axis(t), keepdims=t["keepdim"]).astype(
        float_dtype(dt.from_numpy(a[0].dtype)).np),
    decompose=lambda b, xs, attrs: _mean_decompose(b, xs[0], attrs), vjp=_mean_vjp,
    decompose_in_f32=True,
    doc="arithmetic mean over axis"))


def _var_decompose(b, xs, attrs):
    x = xs[0]
    t = b.type(x)
    f = dt.default_float_for(t.dtype)
    if f != t.dtype:
        x = b.op("cast", x, dtype=f.name)
    axes = norm_axes(attrs["axis"], t)
    m = b.op("mean", x, axis=list(axes), keepdim=True)
    d = b.op("sub", x, m)
    s = b.op("sum", b.op("mul", d, d), axis=list(axes), keepdim=attrs["keepdim"])
    return b.op("div", s, b.const(max(_count(t, axes) - attrs["correction"], 0), f))


def _var_vjp(b, xs, y, g, a):
    """2 (x - mean) / (n - correction), times the cotangent: not through the decomposition."""
    x = xs[0]
    n = count_value(b, x.shape, a["axis"], g)
    n = n - a["correction"] if isinstance(n, int) else b.op("sub", n, a["correction"])
    d = b.op("sub", x, b.op("mean", x, axis=a["axis"], keepdim=True))
    return [b.op("mul", d, b.op("div", b.op("mul", _kept(b, g, x, a), 2.0), n))]


register(OpDef(
    "var", 1, {**REDUCE_ATTRS, "correction": 0}, infer=reduce_infer(float_dtype),
    normalize=normalize_axes,
    reference=lambda a, t: np.var(a[0], axis=_np_axis(t), keepdims=t["keepdim"],
                                  ddof=t["correction"]).astype(
        float_dtype(dt.from_numpy(a[0].dtype)).np),
    decompose=_var_decompose, decompose_in_f32=True, vjp=_var_vjp,
    doc="variance over axis (correction=1 for the unbiased estimate)"))
