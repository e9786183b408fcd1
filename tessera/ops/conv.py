"""Convolutions, padding and pooling over 1, 2 or 3 spatial dimensions.

Layout: channels first, as PyTorch and ONNX store them: an input is [N, C, *spatial], a
convolution's weight [O, C / groups, *kernel] and a transposed convolution's [C, O / groups,
*kernel]; a channels-last tensor is permuted first (`op.permute(x, 0, 3, 1, 2)`). Padding is a
pair (before, after) per spatial axis after normalisation ("same" and "valid" as PyTorch means
them).

A float32 or float64 convolution of static shapes is computed whole by the conv strategy
(compiler/strategies/conv.py: an implicit GEMM, the windows never in memory). Other
convolutions, and the pools, decompose into operators the compiler has: the padded input's
windows, one strided slice per kernel offset, stacked (im2col) and multiplied with the weight as
one batched matmul per group (the same sums, in the same order, as the implicit GEMM's); a pool
reduces the stacked windows. Each has its own
adjoint: a convolution's data gradient is the transposed convolution and its weight gradient
conv_weight_grad, the cotangent's matmul with the windows over every image and position (for
float32 and float64 of static shapes one kernel of its own strategy, compiler/strategies/
conv_grad.py, the windows never in memory); a pool's gradient goes back to its windows (col2im:
each offset's slice adjoint).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from .. import dtypes as dt
from ..errors import ArgumentError, DTypeError, ShapeError, SymbolicValueError
from ..shapes import Sym, prod
from ..types import TensorType
from .registry import Col2Im, Conv, ConvWeightGrad, OpDef, Pad, Pool, flip, register, zeros


# ---- attributes ---------------------------------------------------------------------------------
def _spatial(t, what: str) -> int:
    n = t.rank - 2
    if n not in (1, 2, 3):
        raise ShapeError(f"{what} takes [N, C, *spatial] with 1, 2 or 3 spatial axes",
                         expected="rank 3, 4 or 5", received=str(t))
    for d in t.shape[1:]:
        if isinstance(d, Sym):
            raise SymbolicValueError(f"{what} needs concrete channel and spatial sizes (the "
                                     "batch may be symbolic)", received=str(t),
                                     hint="leave these sizes unannotated, or give numbers")
    return n


def _ints(v, n: int, name: str, least: int = 1) -> list:
    vals = [v] * n if isinstance(v, (int, np.integer)) else list(v)
    if len(vals) != n or not all(isinstance(x, (int, np.integer)) for x in vals):
        raise ArgumentError(f"{name} is an int or {n} ints (one per spatial axis)",
                            received=repr(v))
    if any(x < least for x in vals):
        raise ArgumentError(f"{name} must be at least {least}", received=repr(v))
    return [int(x) for x in vals]


def _pairs(p, n: int, name: str = "padding") -> list:
    """Padding as [before, after] per spatial axis, from an int, n ints or n pairs."""
    if isinstance(p, (int, np.integer)):
        p = [p] * n
    p = list(p)
    if len(p) != n:
        raise ArgumentError(f"{name} is an int, {n} ints or {n} (before, after) pairs",
                            received=repr(p))
    out = [[int(x), int(x)] if isinstance(x, (int, np.integer)) else [int(y) for y in x]
           for x in p]
    if any(len(x) != 2 for x in out):
        raise ArgumentError(f"{name} is an int, {n} ints or {n} (before, after) pairs",
                            received=repr(p))
    return out


def _window_attrs(a, n: int, what: str) -> dict:
    """A window operator's kernel, stride and dilation (ints per spatial axis) and padding
    ((before, after) pairs, none negative), normalised; stride and dilation 1 and padding 0
    where None."""
    out = {"kernel": _ints(a["kernel"], n, "kernel"),
           "stride": _ints(1 if a["stride"] is None else a["stride"], n, "stride"),
           "dilation": _ints(1 if a["dilation"] is None else a["dilation"], n, "dilation"),
           "padding": _pairs(0 if a["padding"] is None else a["padding"], n)}
    if any(p < 0 for pair in out["padding"] for p in pair):
        raise ArgumentError(f"{what}'s padding is not negative", received=repr(a["padding"]))
    return out


def _conv_padding(p, n, kernel, dilation, stride) -> list:
    if isinstance(p, str):
        if p == "valid":
            return [[0, 0]] * n
        if p != "same":
            raise ArgumentError(f"padding {p!r}: a number, pairs, 'same' or 'valid'")
        if any(s != 1 for s in stride):
            raise ArgumentError("padding='same' needs stride 1 (as in PyTorch)",
                                received=f"stride {stride}",
                                hint="give the pads as pairs for a strided convolution")
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        return [[t // 2, t - t // 2] for t in total]
    pads = _pairs(p, n)
    if any(x < 0 for pair in pads for x in pair):
        raise ArgumentError("a convolution's padding is not negative", received=repr(p))
    return pads


def _out_size(size, before, after, k, stride, dilation, ceil=False) -> int:
    span = size + before + after - dilation * (k - 1) - 1
    out = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + before:
        out -= 1                        # (PyTorch: the last window starts inside)
    return out


def _float_operands(ds, what, ints=False):
    """Float operands (fp8 computed in float32), or integers where `ints` (a convolution of
    integers, ONNX's ConvInteger: exact, wrapping as an integer matmul does)."""
    d = dt.result_type(*ds)
    if not (d.is_float or ints and d.is_int):
        raise DTypeError(f"{what} takes {'float or integer' if ints else 'float'} tensors",
                         received=d.short, hint="cast to float32 first")
    d = dt.float32 if d.is_fp8 else d
    return [d] * len(ds), d


# ---- pad ----------------------------------------------------------------------------------------
PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "circular": "wrap"}


def _pad_normalize(ts, a):
    t = ts[0]
    pads = a["pads"]
    if isinstance(pads, (int, np.integer)):
        pads = [[int(pads), int(pads)]] * t.rank
    pads = [list(p) if isinstance(p, (list, tuple)) else [p, p] for p in pads]
    if len(pads) != t.rank or any(len(p) != 2 or not all(isinstance(x, (int, np.integer))
                                                         for x in p) for p in pads):
        raise ArgumentError(f"pads is an int or {t.rank} (before, after) pairs, one per axis",
                            received=repr(a["pads"]))
    if a["mode"] not in PAD_MODES:
        raise ArgumentError(f"pad mode {a['mode']!r}", expected=", ".join(PAD_MODES))
    return {"pads": [[int(x) for x in p] for p in pads], "mode": a["mode"],
            "value": float(a["value"])}


def _pad_infer(ts, a):
    t = ts[0]
    shape = []
    for k, (d, (lo, hi)) in enumerate(zip(t.shape, a["pads"])):
        if lo == hi == 0:
            shape.append(d)
            continue
        if isinstance(d, Sym):
            raise SymbolicValueError(f"pad along axis {k} needs its size", received=str(t))
        inner = d + min(lo, 0) + min(hi, 0)
        if inner < 0 or (a["mode"] != "constant" and inner == 0 and (lo > 0 or hi > 0)):
            raise ShapeError(f"pad: axis {k} of size {d} has nothing left to pad from",
                             received=str(t))
        if a["mode"] == "reflect" and max(lo, hi) > inner - 1:
            raise ShapeError(f"reflect padding of {max(lo, hi)} along axis {k} needs more than "
                             f"{max(lo, hi)} elements, not {inner}", received=str(t))
        if a["mode"] == "circular" and max(lo, hi) > inner:
            raise ShapeError(f"circular padding of {max(lo, hi)} along axis {k} wraps past its "
                             f"{inner} elements", received=str(t))
        shape.append(d + lo + hi)
    return t.with_shape(tuple(shape))


def _pad_ref(xs, a):
    x = xs[0]
    crop = tuple(slice(max(0, -lo), x.shape[k] - max(0, -hi))
                 for k, (lo, hi) in enumerate(a["pads"]))
    x = x[crop]
    width = [(max(lo, 0), max(hi, 0)) for lo, hi in a["pads"]]
    if a["mode"] == "constant":
        return np.pad(x, width, mode="constant", constant_values=a["value"])
    return np.pad(x, width, mode=PAD_MODES[a["mode"]])


def _axis_slice(b, x, axis, start, stop, step=1):
    rank = len(x.shape)
    return b.op("slice", x, starts=[start if k == axis else None for k in range(rank)],
                stops=[stop if k == axis else None for k in range(rank)],
                steps=[step if k == axis else 1 for k in range(rank)])


def _resized(shape, axis, n):
    return [n if k == axis else d for k, d in enumerate(shape)]


def _pad_decompose(b, xs, a):
    x = xs[0]
    t = b.type(x)
    if a["mode"] == "constant" and all(lo >= 0 and hi >= 0 for lo, hi in a["pads"]) and \
            all(isinstance(d, int) for d in t.shape) and not t.dtype.is_complex:
        return None                  # one kernel (the concat strategy's): registry.Pad
    for axis, (lo, hi) in enumerate(a["pads"]):
        if lo < 0 or hi < 0:                                # negative pads crop
            n = b.type(x).shape[axis]
            x = _axis_slice(b, x, axis, max(0, -lo), n - max(0, -hi))
        lo, hi = max(lo, 0), max(hi, 0)
        if lo == hi == 0:
            continue
        n = b.type(x).shape[axis]
        shape = list(b.type(x).shape)
        mode = a["mode"]
        if mode == "constant":
            before = b.op("broadcast_to", b.const_like(a["value"], x),
                          shape=_resized(shape, axis, lo)) if lo else None
            after = b.op("broadcast_to", b.const_like(a["value"], x),
                         shape=_resized(shape, axis, hi)) if hi else None
        elif mode == "edge":
            before = b.op("broadcast_to", _axis_slice(b, x, axis, 0, 1),
                          shape=_resized(shape, axis, lo)) if lo else None
            after = b.op("broadcast_to", _axis_slice(b, x, axis, n - 1, n),
                         shape=_resized(shape, axis, hi)) if hi else None
        elif mode == "reflect":                          # x[lo], ..., x[1] | x | x[n-2], ...
            before = _axis_slice(b, x, axis, lo, 0, -1) if lo else None
            after = _axis_slice(b, x, axis, n - 2, n - 2 - hi if hi < n - 1 else None,
                                -1) if hi else None
        else:                                            # circular: the other end's elements
            before = _axis_slice(b, x, axis, n - lo, n) if lo else None
            after = _axis_slice(b, x, axis, 0, hi) if hi else None
        x = b.op("concat", [p for p in (before, x, after) if p is not None], axis=axis)
    return x


def _place(b, piece, axis, start, n):
    """``piece`` set at ``start`` along ``axis`` of zeros of size n (a slice's adjoint)."""
    shape = list(piece.shape)
    parts = []
    if start:
        parts.append(zeros(b, piece, _resized(shape, axis, start)))
    parts.append(piece)
    rest = n - start - shape[axis]
    if rest:
        parts.append(zeros(b, piece, _resized(shape, axis, rest)))
    return parts[0] if len(parts) == 1 else b.op("concat", parts, axis=axis)


def _pad_vjp(b, xs, y, g, a):
    """Each axis in turn, last first: the inner cotangent, plus (reflect, edge, circular) the
    padding's cotangents added where they were read from; then a crop's zeros put back."""
    shapes = [list(xs[0].shape)]
    for axis, (lo, hi) in enumerate(a["pads"]):       # the shape after each axis is padded
        s = list(shapes[-1])
        s[axis] = s[axis] + lo + hi
        shapes.append(s)
    for axis in reversed(range(len(a["pads"]))):
        lo, hi = a["pads"][axis]
        if lo == hi == 0:
            continue
        n0 = shapes[axis][axis]                        # this axis' size before padding
        cl, ch = max(0, -lo), max(0, -hi)
        n = n0 - cl - ch                               # after the crop
        lo, hi = max(lo, 0), max(hi, 0)
        inner = _axis_slice(b, g, axis, lo, lo + n)
        if a["mode"] == "reflect":
            if lo:
                inner = b.op("add", inner, _place(b, flip(b, _axis_slice(b, g, axis, 0, lo),
                                                          axis), axis, 1, n))
            if hi:
                tail = flip(b, _axis_slice(b, g, axis, lo + n, lo + n + hi), axis)
                inner = b.op("add", inner, _place(b, tail, axis, n - 1 - hi, n))
        elif a["mode"] == "edge":
            if lo:
                first = b.op("sum", _axis_slice(b, g, axis, 0, lo), axis=[axis], keepdim=True)
                inner = b.op("add", inner, _place(b, first, axis, 0, n))
            if hi:
                last = b.op("sum", _axis_slice(b, g, axis, lo + n, lo + n + hi), axis=[axis],
                            keepdim=True)
                inner = b.op("add", inner, _place(b, last, axis, n - 1, n))
        elif a["mode"] == "circular":
            if lo:
                inner = b.op("add", inner, _place(b, _axis_slice(b, g, axis, 0, lo), axis,
                                                  n - lo, n))
            if hi:
                inner = b.op("add", inner, _place(b, _axis_slice(b, g, axis, lo + n,
                                                                 lo + n + hi), axis, 0, n))
        g = _place(b, inner, axis, cl, n0) if cl or ch else inner
    return [g]


register(OpDef("pad", 1, {"pads": 0, "mode": "constant", "value": 0.0},
               normalize=_pad_normalize, infer=_pad_infer, reference=_pad_ref,
               decompose=_pad_decompose, vjp=_pad_vjp, lowering=Pad(),
               doc="pad every axis by (before, after): constant (value), reflect (without the "
                   "edge), edge, or circular; a negative pad crops"))


# ---- convolution --------------------------------------------------------------------------------
def _conv_normalize(ts, a):
    x, w = ts[0], ts[1]
    n = _spatial(x, "conv")
    if w.rank != n + 2:
        raise ShapeError(f"a {n}-d convolution's weight is [O, C / groups, *kernel] of rank "
                         f"{n + 2}", received=f"{x} and weight {w}")
    stride, dilation = _ints(a["stride"], n, "stride"), _ints(a["dilation"], n, "dilation")
    groups = a["groups"]
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ArgumentError("groups is a positive int", received=repr(groups))
    out = {**a, "stride": stride, "dilation": dilation, "groups": int(groups),
           "padding": _conv_padding(a["padding"], n, list(w.shape[2:]), dilation, stride)}
    if "output_padding" in a:
        out["output_padding"] = _ints(a["output_padding"], n, "output_padding", least=0)
    return out


def _conv_infer(ts, a):
    x, w = ts
    _float_operands([x.dtype, w.dtype], "conv", ints=True)
    _spatial(w, "conv's weight")
    n, g = x.rank - 2, a["groups"]
    C, O = x.shape[1], w.shape[0]
    if C % g or O % g:
        raise ShapeError(f"conv's groups ({g}) must divide its {C} input and {O} output "
                         "channels", received=f"{x} and weight {w}")
    if w.shape[1] != C // g:
        raise ShapeError(f"conv's weight has {w.shape[1]} input channels per group where "
                         f"the input's {C} channels in {g} group(s) give {C // g}",
                         expected=f"weight [{O}, {C // g}, *kernel]", received=str(w))
    spatial = []
    for k in range(n):
        (lo, hi), kk = a["padding"][k], w.shape[2 + k]
        size = _out_size(x.shape[2 + k], lo, hi, kk, a["stride"][k], a["dilation"][k])
        if size < 1:
            raise ShapeError(f"conv's kernel ({kk}, dilation {a['dilation'][k]}) is larger "
                             f"than the padded input along spatial axis {k} "
                             f"({x.shape[2 + k]} + {lo + hi})", received=f"{x} and weight {w}")
        spatial.append(size)
    d = _float_operands([x.dtype, w.dtype], "conv", ints=True)[1]
    return TensorType(d, (x.shape[0], O, *spatial))


def _offset_slices(b, x, kernel, a, out_spatial, fill=0.0):
    """The padded input's strided slice [N, C, *out_spatial] under each kernel offset, in
    order (padding filled with ``fill``)."""
    pads = [[0, 0], [0, 0]] + [list(p) for p in a["padding"]]
    xp = b.op("pad", x, pads=pads, mode="constant", value=fill) \
        if any(any(p) for p in pads) else x
    for offset in itertools.product(*[range(k) for k in kernel]):
        starts = [None, None] + [o * d for o, d in zip(offset, a["dilation"])]
        stops = [None, None] + [o * d + (m - 1) * s + 1 for o, d, m, s in
                                zip(offset, a["dilation"], out_spatial, a["stride"])]
        yield b.op("slice", xp, starts=starts, stops=stops, steps=[1, 1] + list(a["stride"]))


def _windows(b, x, kernel, a, out_spatial, fill=0.0):
    """The padded input's windows: [N, C, prod(kernel), *out_spatial], one strided slice per
    kernel offset (im2col), padding filled with ``fill``."""
    cols = [b.op("expand_dims", sl, axis=2)
            for sl in _offset_slices(b, x, kernel, a, out_spatial, fill)]
    return cols[0] if len(cols) == 1 else b.op("concat", cols, axis=2), len(kernel)


def _grouped_windows(b, x, kernel, a, out_spatial):
    """[N, groups, C / groups * prod(kernel), prod(out_spatial)]."""
    cols, _ = _windows(b, x, kernel, a, out_spatial)
    N, C = b.type(x).shape[:2]
    g = a["groups"]
    return b.op("reshape", cols, shape=[N, g, C // g * prod(kernel), prod(out_spatial)])


def computed_whole(tx, tw) -> bool:
    """Does the conv strategy compute this convolution (an implicit GEMM, compiler/strategies/
    conv.py)? Float32 and float64 operands of one dtype and static shapes; others decompose."""
    return tx.dtype == tw.dtype and tx.dtype in (dt.float32, dt.float64) and \
        all(isinstance(s, int) for s in (*tx.shape, *tw.shape))


def _conv_decompose(b, xs, a):
    x, w = xs
    t = b.type(w)
    if computed_whole(b.type(x), t):
        return None
    O, kernel = t.shape[0], list(t.shape[2:])
    out = _conv_infer([b.type(x), t], a)
    spatial = list(out.shape[2:])
    cols = _grouped_windows(b, x, kernel, a, spatial)
    g = a["groups"]
    wm = b.op("reshape", w, shape=[g, O // g, t.shape[1] * prod(kernel)])
    y = b.op("matmul", wm, cols)                        # [N, g, O / g, P]
    return b.op("reshape", y, shape=[out.shape[0], O, *spatial])


def _weight_grad(b, x, g, a, kernel):
    """d/dw of conv(x, w) with cotangent g: [O, C / groups, *kernel] (also the weight gradient
    of a transposed convolution, with x its cotangent and g its input)."""
    return b.op("conv_weight_grad", x, g, kernel=list(kernel), stride=list(a["stride"]),
                padding=[list(p) for p in a["padding"]], dilation=list(a["dilation"]),
                groups=a["groups"])


def _skipped_rows(x_shape, y_shape, kernel, a):
    """Per spatial axis, the input's rows past the last window (strides that skip them): the
    transposed convolution's output_padding that gives the input's shape back."""
    extra = []
    for k in range(len(kernel)):
        lo, hi = a["padding"][k]
        made = (y_shape[2 + k] - 1) * a["stride"][k] - lo - hi + \
            a["dilation"][k] * (kernel[k] - 1) + 1
        extra.append(x_shape[2 + k] - made)
    return extra


def _conv_vjp(b, xs, y, g, a):
    x, w = xs
    kernel = list(w.shape[2:])
    dx = b.op("conv_transpose", g, w, stride=a["stride"], padding=a["padding"],
              output_padding=_skipped_rows(x.shape, y.shape, kernel, a),
              dilation=a["dilation"], groups=a["groups"])
    return [dx, _weight_grad(b, x, g, a, kernel)]


def _conv_ref(xs, a):
    wide = np.int64 if np.result_type(*xs).kind in "iu" else np.float64     # (exact)
    x, w = (v.astype(wide) for v in xs)
    N, C = x.shape[:2]
    O, Cg, kernel = w.shape[0], w.shape[1], w.shape[2:]
    G = a["groups"]
    xp = np.pad(x, [(0, 0), (0, 0)] + [tuple(p) for p in a["padding"]])
    spatial = [_out_size(x.shape[2 + k], *a["padding"][k], kernel[k], a["stride"][k],
                         a["dilation"][k]) for k in range(len(kernel))]
    out = np.zeros((N, G, O // G, *spatial), wide)
    xg = xp.reshape(N, G, Cg, *xp.shape[2:])
    wg = w.reshape(G, O // G, Cg, *kernel)
    for offset in itertools.product(*[range(k) for k in kernel]):
        idx = tuple(slice(o * d, o * d + (m - 1) * s + 1, s) for o, d, m, s in
                    zip(offset, a["dilation"], spatial, a["stride"]))
        win = xg[(slice(None),) * 3 + idx]                        # [N, G, Cg, *spatial]
        out += np.einsum("ngc...,goc->ngo...", win, wg[(Ellipsis,) + tuple(offset)])
    return out.reshape(N, O, *spatial).astype(np.result_type(*xs))


register(OpDef("conv", 2, {"stride": 1, "padding": 0, "dilation": 1, "groups": 1},
               normalize=_conv_normalize, infer=_conv_infer, reference=_conv_ref,
               dtype_rule=lambda ds, a: _float_operands(ds, "conv", ints=True),
               decompose=_conv_decompose, vjp=_conv_vjp, accumulates=True, lowering=Conv(),
               doc="cross-correlation of x [N, C, *spatial] with w [O, C/groups, *kernel], "
                   "float or integer (PyTorch's conv1d/2d/3d): stride, padding (ints, pairs, 'same', 'valid'), "
                   "dilation, groups"))


# ---- a convolution's weight gradient -------------------------------------------------------------

def _wgrad_normalize(ts, a):
    n = _spatial(ts[0], "conv_weight_grad")
    _spatial(ts[1], "conv_weight_grad's cotangent")
    if a["kernel"] is None:
        raise ArgumentError("conv_weight_grad needs the weight's kernel size")
    return {**a, **_window_attrs(a, n, "conv_weight_grad"),
            "groups": _ints(a["groups"], 1, "groups")[0]}


def _wgrad_infer(ts, a):
    x, g = ts
    n = len(a["kernel"])
    if g.rank != x.rank:
        raise ShapeError("conv_weight_grad's cotangent has the input's rank",
                         received=f"{x} and {g}")
    if isinstance(x.shape[0], int) and isinstance(g.shape[0], int) and x.shape[0] != g.shape[0]:
        raise ShapeError("conv_weight_grad's cotangent has as many images as its input",
                         received=f"{x} and {g}")
    G = a["groups"]
    if isinstance(x.shape[1], int) and x.shape[1] % G or \
            isinstance(g.shape[1], int) and g.shape[1] % G:
        raise ShapeError(f"conv_weight_grad's channels divide into {G} groups",
                         received=f"{x} and {g}")
    for k in range(n):
        size = x.shape[2 + k]
        if isinstance(size, int) and isinstance(g.shape[2 + k], int):
            want = _out_size(size, *a["padding"][k], a["kernel"][k], a["stride"][k],
                             a["dilation"][k])
            if want != g.shape[2 + k]:
                raise ShapeError(f"conv_weight_grad's cotangent has the convolution's output "
                                 f"shape ({want} along spatial axis {k})", received=f"{x} and {g}")
    d = _float_operands([x.dtype, g.dtype], "conv_weight_grad", ints=True)[1]
    return TensorType(d, (g.shape[1], x.shape[1] // G if isinstance(x.shape[1], int)
                          else x.shape[1], *a["kernel"]))


def _wgrad_decompose(b, xs, a):
    """The windows' matmul: one product per group contracting images and positions together
    ([G, O/G, N P] times [G, N P, Cg K]), the order the conv_weight_grad strategy keeps; float32
    and float64 operands of static shapes are primitive instead."""
    x, g = xs
    if computed_whole(b.type(x), b.type(g)):
        return None
    go = b.type(g)
    N, O, spatial = go.shape[0], go.shape[1], list(go.shape[2:])
    G, kernel = a["groups"], a["kernel"]
    P = prod(spatial)
    cols = _grouped_windows(b, x, kernel, a, spatial)  # [N, G, Cg K, P]
    gm = b.op("reshape", b.op("transpose", b.op("reshape", g, shape=[N, G, O // G, P]),
                              perm=[1, 2, 0, 3]), shape=[G, O // G, N * P])
    cm = b.op("reshape", b.op("transpose", cols, perm=[1, 0, 3, 2]),
              shape=[G, N * P, b.type(cols).shape[2]])
    dw = b.op("matmul", gm, cm)
    C = b.type(x).shape[1]
    return b.op("reshape", dw, shape=[O, C // G, *kernel])


def _wgrad_vjp(b, xs, y, h, a):
    """Linear in each operand: the input's part is the transposed convolution of the
    cotangent g by h, the cotangent's the convolution of x by h."""
    x, g = xs
    kernel = a["kernel"]
    attrs = {"stride": a["stride"], "padding": a["padding"], "dilation": a["dilation"],
             "groups": a["groups"]}
    dx = b.op("conv_transpose", g, h, output_padding=_skipped_rows(x.shape, g.shape, kernel, a),
              **attrs)
    return [dx, b.op("conv", x, h, **attrs)]


def _wgrad_ref(xs, a):
    wide = np.int64 if np.result_type(*xs).kind in "iu" else np.float64     # (exact)
    x, g = (v.astype(wide) for v in xs)
    N, C = x.shape[:2]
    O, kernel, G = g.shape[1], a["kernel"], a["groups"]
    spatial = g.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0)] + [tuple(p) for p in a["padding"]])
    xg = xp.reshape(N, G, C // G, *xp.shape[2:])
    gg = g.reshape(N, G, O // G, *spatial)
    out = np.zeros((G, O // G, C // G, *kernel), wide)
    for offset in itertools.product(*[range(k) for k in kernel]):
        idx = tuple(slice(o * d, o * d + (m - 1) * s + 1, s) for o, d, m, s in
                    zip(offset, a["dilation"], spatial, a["stride"]))
        win = xg[(slice(None),) * 3 + idx].reshape(N, G, C // G, -1)      # [N, G, Cg, P]
        out[(Ellipsis,) + tuple(offset)] = np.einsum("ngcp,ngop->goc", win,
                                                     gg.reshape(N, G, O // G, -1))
    return out.reshape(O, C // G, *kernel).astype(np.result_type(*xs))


register(OpDef("conv_weight_grad", 2, {"kernel": None, "stride": 1, "padding": 0,
                                       "dilation": 1, "groups": 1},
               normalize=_wgrad_normalize, infer=_wgrad_infer, reference=_wgrad_ref,
               dtype_rule=lambda ds, a: _float_operands(ds, "conv_weight_grad", ints=True),
               decompose=_wgrad_decompose, vjp=_wgrad_vjp, accumulates=True,
               lowering=ConvWeightGrad(),
               doc="the gradient of conv(x, w)'s weight w [O, C/groups, *kernel] for the "
                   "cotangent g [N, O, *out] of its output: each element the sum over images "
                   "and positions, in order, of g times the window of x (padding pairs, stride, "
                   "dilation, groups as conv's); computed with the windows never in memory"))


# ---- transposed convolution ----------------------------------------------------------------------
def _conv_t_infer(ts, a):
    y, w = ts
    _spatial(w, "conv_transpose's weight")
    n, g = y.rank - 2, a["groups"]
    C = y.shape[1]
    if C % g or w.shape[0] != C:
        raise ShapeError(f"conv_transpose's weight is [C, O / groups, *kernel] with C = the "
                         f"input's {C} channels, divisible by groups ({g})",
                         received=f"{y} and weight {w}")
    spatial = []
    for k in range(n):
        (lo, hi), kk = a["padding"][k], w.shape[2 + k]
        if a["output_padding"][k] >= max(a["stride"][k], a["dilation"][k]):
            raise ShapeError(f"output_padding ({a['output_padding'][k]}) must be smaller than "
                             f"the stride or the dilation along spatial axis {k}",
                             received=str(a["output_padding"]))
        size = (y.shape[2 + k] - 1) * a["stride"][k] - lo - hi + \
            a["dilation"][k] * (kk - 1) + a["output_padding"][k] + 1
        if size < 1:
            raise ShapeError(f"conv_transpose's padding leaves no output along spatial axis {k}",
                             received=f"{y} and weight {w}")
        spatial.append(size)
    d = _float_operands([y.dtype, w.dtype], "conv_transpose")[1]
    return TensorType(d, (y.shape[0], w.shape[1] * g, *spatial))


SMALL_IMAGE = 256      # positions below which a product takes the batch's images as columns


def _conv_t_decompose(b, xs, a):
    """The convolution's adjoint written out: the weight's transpose times each input
    position's channels (one batched matmul per group) gives every window's contribution,
    which col2im adds into the output where the convolution would have read it."""
    y, w = xs
    ty, tw = b.type(y), b.type(w)
    out = _conv_t_infer([ty, tw], a)
    N, C, spatial = ty.shape[0], ty.shape[1], list(ty.shape[2:])
    G, Og, kernel = a["groups"], tw.shape[1], list(tw.shape[2:])
    if all(s == 1 for s in a["stride"]) and computed_whole(ty, tw):
        # stride 1: a convolution with the kernel flipped, its channels swapped per group and
        # the padding's complement (an implicit GEMM, no col2im)
        pads = [[(k - 1) * d - lo, (k - 1) * d - hi + extra] for (lo, hi), k, d, extra in
                zip(a["padding"], kernel, a["dilation"], a["output_padding"])]
        if all(p >= 0 for pair in pads for p in pair):
            r = tw.rank + 1           # every kernel axis reversed by one slice, then the
            wf = b.op("reshape", w, shape=[G, C // G, Og, *kernel])    # channels swapped: one
            wf = b.op("slice", wf, starts=[None] * r, stops=[None] * r,   # kernel reads w
                      steps=[1, 1, 1] + [-1] * (r - 3))                # through both views
            wf = b.op("transpose", wf, perm=[0, 2, 1, *range(3, r)])
            wf = b.op("reshape", wf, shape=[G * Og, C // G, *kernel])
            return b.op("conv", y, wf, padding=pads, dilation=a["dilation"], groups=G)
    K, P = prod(kernel), prod(spatial)
    wm = b.op("transpose", b.op("reshape", w, shape=[G, C // G, Og * K]))    # [G, Og K, C/G]
    ym = b.op("reshape", y, shape=[N, G, C // G, P])
    if N > 1 and P < SMALL_IMAGE:
        # small images: one product over every image's positions ([G, Og K, C/G] times
        # [G, C/G, N P]) instead of N with P columns each (ResNet's last stage, 2x2 to 4x4:
        # 9 ms at 34 GFLOP/s in products of 4 columns); each element is the same chain over C/G
        ym = b.op("reshape", b.op("transpose", ym, perm=[1, 2, 0, 3]), shape=[G, C // G, N * P])
        cm = b.op("reshape", b.op("matmul", wm, ym), shape=[G, Og * K, N, P])
        cm = b.op("transpose", cm, perm=[2, 0, 1, 3])                     # [N, G, Og K, P]
    else:
        cm = b.op("matmul", wm, ym)
    cols = b.op("reshape", cm, shape=[N, G * Og, K, *spatial])
    return b.op("col2im", cols, image=list(out.shape[2:]), kernel=kernel,
                stride=list(a["stride"]), padding=[list(p) for p in a["padding"]],
                dilation=list(a["dilation"]))


def _conv_t_vjp(b, xs, y, g, a):
    x, w = xs
    conv_attrs = {k: a[k] for k in ("stride", "padding", "dilation", "groups")}
    dx = b.op("conv", g, w, **conv_attrs)
    return [dx, _weight_grad(b, g, x, conv_attrs, list(w.shape[2:]))]


def _conv_t_ref(xs, a):
    y, w = (v.astype(np.float64) for v in xs)
    N, C = y.shape[:2]
    G = a["groups"]
    Og, kernel = w.shape[1], w.shape[2:]
    spatial = _conv_t_infer([TensorType(dt.float64, y.shape), TensorType(dt.float64, w.shape)],
                            a).shape[2:]
    full = [(y.shape[2 + k] - 1) * a["stride"][k] + a["dilation"][k] * (kernel[k] - 1) + 1 +
            a["output_padding"][k] for k in range(len(kernel))]
    out = np.zeros((N, G, Og, *full))
    yg = y.reshape(N, G, C // G, *y.shape[2:])
    wg = w.reshape(G, C // G, Og, *kernel)
    for offset in itertools.product(*[range(k) for k in kernel]):
        idx = tuple(slice(o * d, o * d + (m - 1) * s + 1, s) for o, d, m, s in
                    zip(offset, a["dilation"], y.shape[2:], a["stride"]))
        out[(slice(None),) * 3 + idx] += np.einsum("ngc...,gco->ngo...", yg,
                                                   wg[(Ellipsis,) + tuple(offset)])
    crop = tuple(slice(lo, lo + m) for (lo, _), m in zip(a["padding"], spatial))
    return out[(slice(None),) * 3 + crop].reshape(N, G * Og, *spatial) \
        .astype(np.result_type(*xs))


register(OpDef("conv_transpose", 2, {"stride": 1, "padding": 0, "output_padding": 0,
                                     "dilation": 1, "groups": 1},
               normalize=_conv_normalize, infer=_conv_t_infer, reference=_conv_t_ref,
               dtype_rule=lambda ds, a: _float_operands(ds, "conv_transpose"),
               decompose=_conv_t_decompose, vjp=_conv_t_vjp, decompose_in_f32=True,
               doc="the transposed convolution of x [N, C, *spatial] with w [C, O/groups, "
                   "*kernel] (PyTorch's conv_transpose1d/2d/3d: a convolution's data "
                   "gradient); output_padding adds rows at the end"))


# ---- pooling ------------------------------------------------------------------------------------
def _pool_normalize(ts, a):
    t = ts[0]
    n = _spatial(t, a.get("_op", "pool"))
    kernel = _ints(a["kernel"], n, "kernel") if a["kernel"] is not None else None
    if kernel is None:
        raise ArgumentError("a pool needs its kernel size", hint="op.max_pool(x, kernel=2)")
    stride = kernel if a["stride"] is None else _ints(a["stride"], n, "stride")
    out = {**a, "kernel": kernel, "stride": stride, "ceil_mode": bool(a["ceil_mode"]),
           "padding": _pairs(a["padding"], n)}
    if any(p < 0 for pair in out["padding"] for p in pair):
        raise ArgumentError("a pool's padding is not negative", received=repr(a["padding"]))
    if "dilation" in a:
        out["dilation"] = _ints(a["dilation"], n, "dilation")
    if "count_include_pad" in a:
        out["count_include_pad"] = bool(a["count_include_pad"])
    return out


def _dilations(a):
    return a.get("dilation") or [1] * len(a["kernel"])


def _pool_spatial(t, a, what="pool"):
    """The output's spatial sizes. (A padding wider than half the window, which PyTorch
    refuses and ONNX allows, gives windows without an input element: -inf from max_pool,
    NaN from avg_pool without count_include_pad.)"""
    spatial = []
    for k, (size, (lo, hi), kk, s, d) in enumerate(zip(t.shape[2:], a["padding"], a["kernel"],
                                                       a["stride"], _dilations(a))):
        m = _out_size(size, lo, hi, kk, s, d, a["ceil_mode"])
        if m < 1:
            raise ShapeError(f"{what}'s kernel ({kk}) is larger than the padded input along "
                             f"spatial axis {k} ({size} + {lo + hi})", received=str(t))
        spatial.append(m)
    return spatial


def _pool_infer(what, ints=False):
    def infer(ts, a):
        t = ts[0]
        if not (t.dtype.is_float or ints and t.dtype.is_int):
            raise DTypeError(f"{what} takes a {'float or integer' if ints else 'float'} tensor",
                             received=t.dtype.short)
        return t.with_shape((*t.shape[:2], *_pool_spatial(t, a, what)))
    return infer


def _pool_attrs(a, spatial, size):
    """The window attributes with the right padding grown where ceil mode adds a last,
    partial window (it reads past the padded input: filled like the padding)."""
    pads = []
    for (lo, hi), m, k, s, d, n in zip(a["padding"], spatial, a["kernel"], a["stride"],
                                        _dilations(a), size):
        need = (m - 1) * s + d * (k - 1) + 1 - (n + lo)
        pads.append([lo, max(hi, need)])
    return {"padding": pads, "stride": a["stride"], "dilation": _dilations(a)}


def _pool_windows(b, x, a, fill):
    t = b.type(x)
    spatial = _pool_spatial(t, a)
    w = _pool_attrs(a, spatial, list(t.shape[2:]))
    cols, _ = _windows(b, x, a["kernel"], w, spatial, fill=fill)
    return cols, spatial, w


# Windows of more taps than this are pooled one axis at a time: a max, or a sum, over a box is
# the same over its rows then its columns, and K windows' slices make a graph of K nodes
_SEPARATE_ABOVE = 32


def _pool_axis_by_axis(b, x, a, pool_one):
    """pool_one(b, x, attrs) applied along each spatial axis in turn, when the window is large
    and spans more than one axis; None otherwise."""
    kernel = a["kernel"]
    if prod(kernel) <= _SEPARATE_ABOVE or sum(k > 1 for k in kernel) < 2:
        return None
    n = len(kernel)
    for k in range(n):
        one = lambda v, ident: [v if j == k else ident for j in range(n)]    # noqa: E731
        x = pool_one(b, x, {**a, "kernel": one(kernel[k], 1), "stride": one(a["stride"][k], 1),
                            "padding": one(a["padding"][k], [0, 0]),
                            "dilation": one(_dilations(a)[k], 1)})
    return x


def _lowest(d):
    """What max pooling pads with: -inf, or an integer dtype's least value."""
    return d.int_range[0] if d.is_int else -math.inf


def _fold_normalize(ts, a):
    n = _spatial(ts[0], "fold_windows")
    if a["kernel"] is None:
        raise ArgumentError("fold_windows needs its kernel size")
    out = {**a, **_window_attrs(a, n, "fold_windows")}
    if a["combine"] not in ("maximum", "add", "argmax"):
        raise ArgumentError("fold_windows combines by 'maximum', 'add' or 'argmax'",
                            received=repr(a["combine"]))
    return out


def _fold_infer(ts, a):
    t = ts[0]
    if not (t.dtype.is_float or t.dtype.is_int):
        raise DTypeError("fold_windows takes a float or integer tensor", received=t.dtype.short)
    spatial = [_out_size(size, lo, hi, k, s, d) for size, (lo, hi), k, s, d in
               zip(t.shape[2:], a["padding"], a["kernel"], a["stride"], a["dilation"])]
    if any(m < 1 for m in spatial):
        raise ShapeError("fold_windows' kernel is larger than the padded input", received=str(t))
    if a["combine"] == "argmax":
        return TensorType(dt.int64, (*t.shape[:2], *spatial))
    return t.with_shape((*t.shape[:2], *spatial))


def _fold_fill(d, combine):
    """What the padding reads: the identity of the combination (-inf, an integer's least)."""
    return 0.0 if combine == "add" else _lowest(d)


def _fold_ref(xs, a):
    x = xs[0]
    spatial = list(_fold_infer([TensorType(dt.from_numpy(x.dtype), x.shape)], a).shape[2:])
    width = [(0, 0), (0, 0)] + [(lo, hi) for lo, hi in a["padding"]]
    xp = np.pad(x, width, constant_values=_fold_fill(dt.from_numpy(x.dtype), a["combine"]))
    y = None
    for j, offset in enumerate(itertools.product(*[range(k) for k in a["kernel"]])):
        sl = xp[(slice(None), slice(None)) + tuple(
            slice(o * d, o * d + (m - 1) * s + 1, s)
            for o, d, m, s in zip(offset, a["dilation"], spatial, a["stride"]))]
        if a["combine"] == "argmax":          # argmax's: larger, or NaN where best is not
            if y is None:
                y, best = np.zeros(sl.shape, np.int64), sl.copy()
            larger = np.where(sl != sl, best == best, sl > best)
            y, best = np.where(larger, j, y), np.where(larger, sl, best)
        elif y is None:
            y = sl.copy()
        elif a["combine"] == "add":
            y = y + sl
        else:                                 # ts_max: the later unless the earlier is larger
            y = np.where((y > sl) | (y != y), y, sl)     # or NaN (NaN propagating)
    return y


def _fold_decompose(b, xs, a):
    """The chain over the kernel offsets' strided slices of the input padded with the
    combination's identity, read in place by one pointwise kernel; float32 and float64 inputs
    of static shapes are primitive instead (the pool strategy's routine)."""
    x = xs[0]
    t = b.type(x)
    if folded_whole(t):
        return None
    if t.dtype.is_narrow:               # in float32, rounded once (-inf: not in fp8 e4m3)
        y = b.op("fold_windows", b.op("cast", x, dtype="float32"), **a)
        return y if a["combine"] == "argmax" else b.op("cast", y, dtype=t.dtype.name)
    spatial = list(_fold_infer([t], a).shape[2:])
    if a["combine"] == "argmax":        # over the stacked windows
        cols, _ = _windows(b, x, a["kernel"], a, spatial, fill=_lowest(t.dtype))
        return b.op("argmax", cols, axis=2, keepdim=False)
    y = None
    for sl in _offset_slices(b, x, a["kernel"], a, spatial, fill=_fold_fill(t.dtype,
                                                                              a["combine"])):
        y = sl if y is None else b.op(a["combine"], y, sl)
    return y


def folded_whole(t) -> bool:
    """Does the pool strategy compute fold_windows (compiler/strategies/pool.py)? Float32 and
    float64 inputs of static shapes and one to three spatial axes; others decompose."""
    return t.dtype in (dt.float32, dt.float64) and 3 <= t.rank <= 5 and \
        all(isinstance(s, int) for s in t.shape)


register(OpDef("fold_windows", 1, {"kernel": None, "stride": None, "padding": None,
                                   "dilation": None, "combine": "maximum"},
               normalize=_fold_normalize, infer=_fold_infer, reference=_fold_ref,
               decompose=_fold_decompose, lowering=Pool(), differentiable=False,
               doc="each window of x [N, C, *spatial] folded by the elementwise combine "
                   "('maximum': NaN propagating, or 'add') over the kernel offsets in order, "
                   "the padding (before, after) pairs reading its identity: the pools' "
                   "windows (max_pool, avg_pool), computed in place; 'argmax': the offset of "
                   "each window's first largest element (int64; a NaN the largest), as "
                   "argmax over the stacked windows finds it (max_pool's gradient)"))


def _chain_windows(b, x, a, combine):
    """Each window folded by the elementwise `combine` over the kernel offsets' strided slices
    of the input padded with its identity, in order: what the same reduction over the stacked
    windows computes, read in place instead of stacked in memory first (max_pool 3x3/2 of
    32x64x112x112: 50 ms in 15 kernels)."""
    t = b.type(x)
    spatial = _pool_spatial(t, a)
    w = _pool_attrs(a, spatial, list(t.shape[2:]))
    return b.op("fold_windows", x, kernel=list(a["kernel"]), stride=list(w["stride"]),
                padding=[list(p) for p in w["padding"]], dilation=list(w["dilation"]),
                combine=combine)


def _max_windows(b, x, a):
    """The largest of each window (NaN propagating; of equal elements the later, which tells
    only zeros' signs apart)."""
    return _chain_windows(b, x, a, "maximum")


def _sum_windows(b, x, a):
    """Each window's sum: chained for float32 and float64 (a sum over the stacked windows'
    order and rounding); other dtypes sum wider than they add, so over the windows."""
    if b.type(x).dtype in (dt.float32, dt.float64):
        return _chain_windows(b, x, a, "add")
    cols, _, _ = _pool_windows(b, x, a, 0.0)
    return b.op("sum", cols, axis=[2], keepdim=False)


def _max_pool_decompose(b, xs, a):
    y = _pool_axis_by_axis(b, xs[0], a, _max_windows)
    return y if y is not None else _max_windows(b, xs[0], a)


def _window_counts(a, size, spatial):
    """Per output position, the number of elements its window averages: its taps within the
    padded input (count_include_pad), or within the input itself."""
    counts = []
    for (lo, hi), m, k, s, d, n in zip(a["padding"], spatial, a["kernel"], a["stride"],
                                       _dilations(a), size):
        taps = (np.arange(m) * s - lo)[:, None] + d * np.arange(k)[None, :]
        first, end = (-lo, n + hi) if a["count_include_pad"] else (0, n)
        counts.append(((taps >= first) & (taps < end)).sum(axis=1))
    return _outer(counts)


def _outer(vectors):
    out = np.ones([len(v) for v in vectors])
    for k, v in enumerate(vectors):
        out = out * v.reshape([-1 if j == k else 1 for j in range(len(vectors))])
    return out


def _avg_pool_decompose(b, xs, a):
    x = xs[0]
    total = _pool_axis_by_axis(b, x, a, _sum_windows)
    if total is None:
        total = _sum_windows(b, x, a)
    spatial = list(b.type(total).shape[2:])
    counts = _window_counts(a, list(b.type(x).shape[2:]), spatial)
    return b.op("div", total, b.const(counts.astype(b.type(x).dtype.compute.np), None))


def _col2im(b, shape, cols_grad, kernel, w_attrs, spatial):
    """The adjoint of `_windows`: each kernel offset's slice of the windows' cotangent
    [N, C, K, *spatial] put back where it was read, summed, the padding cut off: an image
    of ``shape`` (the windows' input's)."""
    pads = [[0, 0], [0, 0]] + [list(p) for p in w_attrs["padding"]]
    padded = [d + lo + hi for d, (lo, hi) in zip(shape, pads)]
    total = None
    for j, offset in enumerate(itertools.product(*[range(k) for k in kernel])):
        piece = b.op("squeeze", _axis_slice(b, cols_grad, 2, j, j + 1), axis=[2])
        for k, (o, d, s, m) in enumerate(zip(offset, w_attrs["dilation"], w_attrs["stride"],
                                            spatial)):
            piece = _strided_place(b, piece, 2 + k, o * d, s, m, padded[2 + k])
        total = piece if total is None else b.op("add", total, piece)
    crop = [[-lo, -hi] for lo, hi in pads]
    return b.op("pad", total, pads=crop) if any(any(p) for p in pads) else total


def _strided_place(b, piece, axis, start, step, m, n):
    """``piece`` (m along axis) placed at start, start + step, ... of zeros of size n."""
    if step > 1:
        shape = list(b.type(piece).shape)
        wide = b.op("expand_dims", piece, axis=axis + 1)
        gaps = zeros(b, wide, _resized(list(b.type(wide).shape), axis + 1, step - 1))
        piece = b.op("reshape", b.op("concat", [wide, gaps], axis=axis + 1),
                     shape=_resized(shape, axis, m * step))
        piece = _axis_slice(b, piece, axis, 0, (m - 1) * step + 1)
    return _place(b, piece, axis, start, n)


def _col2im_normalize(ts, a):
    t = ts[0]
    n = t.rank - 3
    if n not in (1, 2, 3):
        raise ShapeError("col2im takes the windows' cotangent [N, C, K, *out] with 1, 2 or 3 "
                         "spatial axes", expected="rank 4, 5 or 6", received=str(t))
    if a["image"] is None or a["kernel"] is None:
        raise ArgumentError("col2im needs the image's spatial size and the kernel size")
    return {**a, **_window_attrs(a, n, "col2im"), "image": _ints(a["image"], n, "image")}


def _col2im_infer(ts, a):
    t = ts[0]
    if not (t.dtype.is_float or t.dtype.is_int):
        raise DTypeError("col2im takes a float or integer tensor", received=t.dtype.short)
    grid = [_out_size(size, lo, hi, k, s, d) for size, (lo, hi), k, s, d in
            zip(a["image"], a["padding"], a["kernel"], a["stride"], a["dilation"])]
    want = [prod(a["kernel"]), *grid]
    if any(isinstance(d, int) and d != w for d, w in zip(t.shape[2:], want)):
        raise ShapeError(f"col2im's windows of {a['kernel']} over an image of {a['image']} are "
                         f"[N, C, {', '.join(map(str, want))}]", received=str(t))
    return t.with_shape((*t.shape[:2], *a["image"]))


def _col2im_decompose(b, xs, a):
    """Each offset's slice placed (zeros around, between a stride's values) and added in order,
    the padding cut off; float32 and float64 of static shapes are primitive instead (the col2im
    strategy: the same sums, read in place), 16-bit and fp8 ones summed in float32."""
    t = b.type(xs[0])
    if t.dtype in (dt.float32, dt.float64) and all(isinstance(s, int) for s in t.shape):
        return None
    if t.dtype.is_narrow:               # in float32, rounded once
        y = b.op("col2im", b.op("cast", xs[0], dtype="float32"), **a)
        return b.op("cast", y, dtype=t.dtype.name)
    return _col2im(b, [*t.shape[:2], *a["image"]], xs[0], a["kernel"], a,
                   list(t.shape[3:]))


def _col2im_vjp(b, xs, y, g, a):
    """Linear: the cotangent's windows (zero padding)."""
    return [_windows(b, g, a["kernel"], a, list(xs[0].shape[3:]))[0]]


def _col2im_ref(xs, a):
    c = xs[0]
    grid = c.shape[3:]
    pads = [(0, 0), (0, 0)] + [tuple(p) for p in a["padding"]]
    out = np.zeros([*c.shape[:2], *(i + lo + hi for i, (lo, hi) in zip(a["image"],
                                                                      a["padding"]))],
                   np.float64 if c.dtype.kind == "f" else c.dtype)     # (integers wrap)
    for j, offset in enumerate(itertools.product(*[range(k) for k in a["kernel"]])):
        idx = tuple(slice(o * d, o * d + (m - 1) * s + 1, s) for o, d, m, s in
                    zip(offset, a["dilation"], grid, a["stride"]))
        out[(slice(None), slice(None)) + idx] += c[:, :, j]
    crop = tuple(slice(lo, lo + i) for (lo, _), i in zip(pads[2:], a["image"]))
    return out[(slice(None), slice(None)) + crop].astype(c.dtype)


register(OpDef("col2im", 1, {"image": None, "kernel": None, "stride": 1, "padding": 0,
                             "dilation": 1},
               normalize=_col2im_normalize, infer=_col2im_infer, reference=_col2im_ref,
               decompose=_col2im_decompose, vjp=_col2im_vjp, lowering=Col2Im(),
               doc="the windows' adjoint: cols [N, C, K, *out] (each kernel offset's values "
                   "over the windows' grid, as the pools' windows stack them) put back into "
                   "an image [N, C, *image] where each window read them, summed over the "
                   "offsets in order (stride, padding pairs, dilation as a pool's); ONNX's "
                   "Col2Im with the columns reshaped"))


def _windows_back(b, x, cols, a, w):
    """A pool's windows' cotangent `cols` summed back into x's image (col2im)."""
    return b.op("col2im", cols, image=list(x.shape[2:]), kernel=list(a["kernel"]),
                stride=list(w["stride"]), padding=[list(p) for p in w["padding"]],
                dilation=list(w["dilation"]))


def _first_largest(b, x, a):
    """Per window, the offset of its first largest element (a NaN the largest), as argmax over
    the stacked windows finds it, read in place (fold_windows' argmax: max_pool 3x3/2 of
    32x64x32x32 stacked its windows in 3.8 ms of pad, slices, concat and argmax); with the
    windows' spatial sizes and attributes."""
    t = b.type(x)
    spatial = _pool_spatial(t, a)
    w = _pool_attrs(a, spatial, list(t.shape[2:]))
    first = b.op("fold_windows", x, kernel=list(a["kernel"]), stride=list(w["stride"]),
                 padding=[list(p) for p in w["padding"]], dilation=list(w["dilation"]),
                 combine="argmax")
    return first, spatial, w


def _max_pool_vjp(b, xs, y, g, a):
    """The cotangent goes to the first largest element of each window (PyTorch's choice;
    a NaN is the largest)."""
    x = xs[0]
    first, spatial, w = _first_largest(b, x, a)                         # [N, C, *sp]
    K = prod(a["kernel"])
    shape = [*b.type(x).shape[:2], K, *spatial]
    pick = b.op("eq", b.op("broadcast_to", b.op("reshape", b.const(np.arange(K), None),
                                                shape=[1, 1, K] + [1] * len(spatial)),
                           shape=shape), b.op("expand_dims", first, axis=2))
    spread = b.op("where", pick, b.op("expand_dims", g, axis=2), 0.0)
    return [_windows_back(b, x, spread, a, w)]


def _avg_pool_vjp(b, xs, y, g, a):
    x = xs[0]
    t = x.type
    spatial = list(y.shape[2:])
    w = _pool_attrs(a, spatial, list(t.shape[2:]))
    counts = _window_counts(a, list(t.shape[2:]), spatial)
    share = b.op("div", g, b.const(counts.astype(t.dtype.compute.np), None))
    K = prod(a["kernel"])
    spread = b.op("broadcast_to", b.op("expand_dims", share, axis=2),
                  shape=[*t.shape[:2], K, *spatial])
    return [_windows_back(b, x, spread, a, w)]


def _pool_ref(kind):
    def ref(xs, a):
        x = xs[0]
        spatial = _pool_spatial(TensorType(dt.float64, x.shape), a)
        w = _pool_attrs(a, spatial, list(x.shape[2:]))
        fill = _lowest(dt.from_numpy(x.dtype)) if kind == "max" else 0.0
        xp = np.pad(x if x.dtype.kind in "iu" else x.astype(np.float64),
                    [(0, 0), (0, 0)] + [tuple(p) for p in w["padding"]], constant_values=fill)
        wins = []
        for offset in itertools.product(*[range(k) for k in a["kernel"]]):
            idx = tuple(slice(o * d, o * d + (m - 1) * s + 1, s) for o, d, m, s in
                        zip(offset, w["dilation"], spatial, w["stride"]))
            wins.append(xp[(slice(None),) * 2 + idx])
        stack = np.stack(wins, axis=2)
        if kind == "max":
            out = np.max(stack, axis=2)
        else:
            out = stack.sum(axis=2) / _window_counts(a, list(x.shape[2:]), spatial)
        return out.astype(x.dtype)
    return ref


register(OpDef("max_pool", 1, {"kernel": None, "stride": None, "padding": 0, "dilation": 1,
                               "ceil_mode": False},
               normalize=_pool_normalize, infer=_pool_infer("max_pool", ints=True),
               reference=_pool_ref("max"), decompose=_max_pool_decompose, vjp=_max_pool_vjp,
               decompose_in_f32=True,   # the padding's -inf, which fp8 e4m3 cannot hold
               doc="the largest element of each window of x [N, C, *spatial], float or integer "
                   "(NaN wins; padding never wins): kernel, stride (default the kernel), padding, dilation, "
                   "ceil_mode, as PyTorch's max_pool1d/2d/3d"))
register(OpDef("avg_pool", 1, {"kernel": None, "stride": None, "padding": 0, "dilation": 1,
                               "ceil_mode": False, "count_include_pad": True},
               normalize=_pool_normalize, infer=_pool_infer("avg_pool"),
               reference=_pool_ref("avg"), decompose=_avg_pool_decompose, vjp=_avg_pool_vjp,
               decompose_in_f32=True,
               doc="the mean of each window of x [N, C, *spatial]: kernel, stride (default the "
                   "kernel), padding, dilation (ONNX's), ceil_mode, count_include_pad "
                   "(PyTorch's default True, ONNX's False), as PyTorch's avg_pool1d/2d/3d"))


def _max_pool_indices_decompose(b, xs, a):
    """Per window, the position of its first largest element within its (n, c) plane, as
    PyTorch's return_indices gives it: the window's argmax offset unravelled over the kernel,
    moved to the input's coordinates, flattened over the spatial axes."""
    x = xs[0]
    j, spatial, _ = _first_largest(b, x, a)                              # [N, C, *spatial]
    sizes = list(b.type(x).shape[2:])
    plane = [prod(sizes[k + 1:]) for k in range(len(sizes))]
    flat = None
    for k, (kk, s, d, (lo, _), m) in enumerate(zip(a["kernel"], a["stride"], _dilations(a),
                                                   a["padding"], spatial)):
        tap = b.op("mod", b.op("floor_divide", j, prod(a["kernel"][k + 1:])), kk)
        start = (np.arange(m) * s - lo).reshape([1, 1] + [-1 if q == k else 1
                                                          for q in range(len(spatial))])
        pos = b.op("add", b.op("mul", tap, d), b.const(start.astype(np.int64), None))
        term = b.op("mul", pos, plane[k])
        flat = term if flat is None else b.op("add", flat, term)
    return flat


def _max_pool_indices_ref(xs, a):
    x = xs[0].astype(np.float64)
    spatial = _pool_spatial(TensorType(dt.float64, x.shape), a)
    w = _pool_attrs(a, spatial, list(x.shape[2:]))
    xp = np.pad(x, [(0, 0), (0, 0)] + [tuple(p) for p in w["padding"]], constant_values=-np.inf)
    out = np.zeros(x.shape[:2] + tuple(spatial), np.int64)
    best = np.full(x.shape[:2] + tuple(spatial), -np.inf)
    first = np.zeros(best.shape, bool)
    for offset in itertools.product(*[range(k) for k in a["kernel"]]):
        idx = tuple(slice(o * d, o * d + (m - 1) * s + 1, s) for o, d, m, s in
                    zip(offset, w["dilation"], spatial, w["stride"]))
        v = xp[(slice(None),) * 2 + idx]
        better = ~first | (v > best) | (np.isnan(v) & ~np.isnan(best))
        pos = 0
        for k, (o, d, s, (lo, _), m) in enumerate(zip(offset, w["dilation"], w["stride"],
                                                      a["padding"], spatial)):
            coord = (np.arange(m) * s - lo + o * d).reshape([-1 if q == k else 1
                                                             for q in range(len(spatial))])
            pos = pos + coord * int(np.prod(x.shape[3 + k:]))
        out = np.where(better, pos, out)
        best = np.where(better, v, best)
        first |= True
    return out


register(OpDef("max_pool_indices", 1, {"kernel": None, "stride": None, "padding": 0,
                                       "dilation": 1, "ceil_mode": False},
               normalize=_pool_normalize,
               infer=lambda ts, a: TensorType(dt.int64, _pool_infer("max_pool")(ts, a).shape),
               reference=_max_pool_indices_ref, decompose=_max_pool_indices_decompose,
               differentiable=False, decompose_in_f32=True,
               doc="where max_pool's value of each window comes from: its position in its "
                   "(n, c) plane, flattened over the spatial axes (PyTorch's return_indices)"))
