"""Normalisations over an axis, written as decompositions into primitive operators.

Each keeps an independent NumPy reference, so the tests check the decomposition, not just
restate it. Each has its own adjoint in closed form, in terms of its output (not the
derivative of its decomposition, which would keep every intermediate alive).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..types import TensorType
from ..errors import ShapeError
from .registry import OpDef, norm_axis, ref_errstate, register


def _float_input(b, x):
    t = b.type(x)
    f = dt.default_float_for(t.dtype)
    return (x if f == t.dtype else b.op("cast", x, dtype=f.name)), f


def _axis_normalize(ts, a):
    return {**a, "axis": norm_axis(a["axis"], ts[0].rank, ts[0])}


def _nonempty_axis(t, axis, opname):
    ax = norm_axis(axis, t.rank, t)
    if t.shape[ax] == 0:
        raise ShapeError(f"{opname} over an empty axis ({ax}) has no value", received=str(t))
    return ax


def _same_shape_float(ts, a):
    t = ts[0]
    norm_axis(a["axis"], t.rank, t)
    return TensorType(dt.default_float_for(t.dtype), t.shape)


def _softmax_like(ts, a):
    _nonempty_axis(ts[0], a["axis"], "this normalisation")
    return _same_shape_float(ts, a)


def _float_ref(fn):
    def ref(xs, a):
        x = xs[0]
        f = dt.default_float_for(dt.from_numpy(x.dtype)).np
        with ref_errstate():
            return np.asarray(fn(x.astype(f), a), dtype=f)
    return ref


# softmax ---------------------------------------------------------------------------------------
def _softmax_decompose(b, xs, a):
    x, _ = _float_input(b, xs[0])
    m = b.op("max", x, axis=[a["axis"]], keepdim=True)
    e = b.op("exp", b.op("sub", x, m))
    return b.op("div", e, b.op("sum", e, axis=[a["axis"]], keepdim=True))


def _softmax_ref(x, a):
    e = np.exp(x - x.max(axis=a["axis"], keepdims=True))
    return e / e.sum(axis=a["axis"], keepdims=True)


def _rowsum(b, t, a):
    return b.op("sum", t, axis=[a["axis"]], keepdim=True)


def _rowmean(b, t, a):
    return b.op("mean", t, axis=[a["axis"]], keepdim=True)


def _softmax_vjp(b, xs, y, g, a):                  # y (g - sum(g y))
    return [b.op("mul", y, b.op("sub", g, _rowsum(b, b.op("mul", g, y), a)))]


register(OpDef("softmax", 1, {"axis": -1}, infer=_softmax_like,
               normalize=_axis_normalize, reference=_float_ref(_softmax_ref),
               decompose=_softmax_decompose, vjp=_softmax_vjp, decompose_in_f32=True,
               doc="exp(x - max) / sum(exp(x - max)) over axis"))


# log_softmax -----------------------------------------------------------------------------------
def _log_softmax_decompose(b, xs, a):
    x, _ = _float_input(b, xs[0])
    z = b.op("sub", x, b.op("max", x, axis=[a["axis"]], keepdim=True))
    lse = b.op("log", b.op("sum", b.op("exp", z), axis=[a["axis"]], keepdim=True))
    return b.op("sub", z, lse)


def _log_softmax_ref(x, a):
    z = x - x.max(axis=a["axis"], keepdims=True)
    return z - np.log(np.exp(z).sum(axis=a["axis"], keepdims=True))


def _log_softmax_vjp(b, xs, y, g, a):              # g - softmax(x) sum(g), softmax = exp(y)
    return [b.op("sub", g, b.op("mul", b.op("exp", y), _rowsum(b, g, a)))]


register(OpDef("log_softmax", 1, {"axis": -1}, infer=_softmax_like,
               normalize=_axis_normalize, reference=_float_ref(_log_softmax_ref),
               decompose=_log_softmax_decompose, vjp=_log_softmax_vjp, decompose_in_f32=True,
               doc="x - logsumexp(x) over axis, stably"))


# logsumexp -------------------------------------------------------------------------------------
def _lse_infer(ts, a):
    t = ts[0]
    ax = _nonempty_axis(t, a["axis"], "logsumexp")
    shape = tuple(1 if k == ax else d for k, d in enumerate(t.shape)) if a["keepdim"] else \
        tuple(d for k, d in enumerate(t.shape) if k != ax)
    return TensorType(dt.default_float_for(t.dtype), shape)


def _lse_decompose(b, xs, a):
    x, f = _float_input(b, xs[0])
    m = b.op("max", x, axis=[a["axis"]], keepdim=True)
    # a row's max that is not finite shifts by 0 instead (m - m is 0 only for a finite m):
    # a row of -inf is log(0) = -inf, as SciPy, JAX and PyTorch say, not -inf - -inf = NaN
    m = b.op("where", b.op("eq", b.op("sub", m, m), b.const(0.0, f)), m, b.const(0.0, f))
    s = b.op("sum", b.op("exp", b.op("sub", x, m)), axis=[a["axis"]], keepdim=True)
    out = b.op("add", b.op("log", s), m)
    if not a["keepdim"]:
        out = b.op("reshape", out, shape=list(_lse_infer([b.type(xs[0])], a).shape))
    return out


def _lse_ref(x, a):
    m = x.max(axis=a["axis"], keepdims=True)
    m = np.where(np.isfinite(m), m, 0).astype(m.dtype)
    out = np.log(np.exp(x - m).sum(axis=a["axis"], keepdims=True)) + m
    return out if a["keepdim"] else np.squeeze(out, axis=a["axis"])


def _lse_vjp(b, xs, y, g, a):                      # g softmax(x) = g exp(x - y)
    x = xs[0]
    if not a["keepdim"]:
        keep = [1 if k == a["axis"] else d for k, d in enumerate(x.shape)]
        y, g = b.op("reshape", y, shape=keep), b.op("reshape", g, shape=keep)
    return [b.op("mul", g, b.op("exp", b.op("sub", x, y)))]


register(OpDef("logsumexp", 1, {"axis": -1, "keepdim": False}, infer=_lse_infer,
               normalize=_axis_normalize, reference=_float_ref(_lse_ref),
               decompose=_lse_decompose, vjp=_lse_vjp, decompose_in_f32=True,
               doc="log(sum(exp(x))) over axis, stably"))


# layernorm / rmsnorm (the affine weight and bias are separate mul/add nodes) ----------------------
def _layernorm_decompose(b, xs, a):
    x, f = _float_input(b, xs[0])
    ax = [a["axis"]]
    m = b.op("mean", x, axis=ax, keepdim=True)
    d = b.op("sub", x, m)
    v = b.op("mean", b.op("mul", d, d), axis=ax, keepdim=True)
    return b.op("mul", d, b.op("rsqrt", b.op("add", v, b.const(a["eps"], f))))


def _layernorm_ref(x, a):
    m = x.mean(axis=a["axis"], keepdims=True)
    v = ((x - m) ** 2).mean(axis=a["axis"], keepdims=True)
    return (x - m) / np.sqrt(v + x.dtype.type(a["eps"]))


def _layernorm_vjp(b, xs, y, g, a):
    """rstd (g - mean(g) - y mean(g y)), rstd = 1/sqrt(var + eps) recomputed from x."""
    rstd = b.op("rsqrt", b.op("add", b.op("var", xs[0], axis=[a["axis"]], keepdim=True), a["eps"]))
    centred = b.op("sub", b.op("sub", g, _rowmean(b, g, a)), b.op("mul", y, _rowmean(b, b.op("mul", g, y), a)))
    return [b.op("mul", rstd, centred)]


register(OpDef("layernorm", 1, {"axis": -1, "eps": 1e-5}, infer=_same_shape_float,
               normalize=_axis_normalize, reference=_float_ref(_layernorm_ref),
               decompose=_layernorm_decompose, vjp=_layernorm_vjp, decompose_in_f32=True,
               doc="(x - mean) / sqrt(var + eps) over axis"))


def _rmsnorm_decompose(b, xs, a):
    x, f = _float_input(b, xs[0])
    ms = b.op("mean", b.op("mul", x, x), axis=[a["axis"]], keepdim=True)
    return b.op("mul", x, b.op("rsqrt", b.op("add", ms, b.const(a["eps"], f))))


def _rmsnorm_ref(x, a):
    return x / np.sqrt((x * x).mean(axis=a["axis"], keepdims=True) + x.dtype.type(a["eps"]))


def _rmsnorm_vjp(b, xs, y, g, a):
    """r (g - y mean(g y)), r = 1/sqrt(mean(x x) + eps) recomputed from x."""
    x = xs[0]
    r = b.op("rsqrt", b.op("add", _rowmean(b, b.op("mul", x, x), a), a["eps"]))
    return [b.op("mul", r, b.op("sub", g, b.op("mul", y, _rowmean(b, b.op("mul", g, y), a))))]


register(OpDef("rmsnorm", 1, {"axis": -1, "eps": 1e-6}, infer=_same_shape_float,
               normalize=_axis_normalize, reference=_float_ref(_rmsnorm_ref),
               decompose=_rmsnorm_decompose, vjp=_rmsnorm_vjp, decompose_in_f32=True,
               doc="x / sqrt(mean(x*x) + eps) over axis"))
