"""Discrete Fourier transforms: op.fft, op.ifft, op.rfft, op.irfft along one axis, with NumPy's
``n`` (the input cropped or zero-padded to n points first; irfft's n is its output length) and
``norm`` ("backward": the inverse divides by n; "ortho": both by sqrt(n); "forward": the
forward transform divides by n). The multi-axis transforms (fft2, fftn, rfft2, ...) and
fftfreq / fftshift are compositions of these (tessera/op.py).

Each decomposes into one of three primitives on real tensors, which the `fft` strategy
(compiler/strategies/fft.py) computes with the FFT routine (strategies/routines/fft.c):
``dft(re, im)`` a complex transform, ``dft_r2c(x)`` a real one (the n/2 + 1 non-negative
frequencies), ``dft_c2r(re, im)`` its inverse (the imaginary parts of the zero and Nyquist
frequencies ignored, as NumPy does). Their results put the real and imaginary parts on a last
axis of 2 (the interleaved layout of a complex array), and the decomposition reads the parts
off it, so the complex pass (passes.split_complex) never sees a transform.

Adjoints by the conjugate convention (ops/complex.py): a transform's adjoint is the inverse
transform with the dual norm; rfft's adjoint weights the frequencies that stand for two (all
but zero and Nyquist) by 1/2 before the inverse, and irfft's weights them by 2 after the
forward transform.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as dt
from ..errors import ArgumentError, DTypeError, ShapeError
from ..shapes import Sym
from ..types import TensorType
from .registry import OpDef, Spectral, norm_axis, register

NORMS = ("backward", "ortho", "forward")
DUAL = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


def scale(norm: str, n: int, inverse: bool) -> float:
    """The factor a transform of n points multiplies its unnormalised sums by."""
    if norm == "ortho":
        return 1.0 / math.sqrt(n)
    return 1.0 / n if (norm == "forward") != inverse else 1.0


def complex_of(d: dt.DType) -> dt.DType:
    """The complex dtype a transform of d gives (NumPy's: float32 and 16-bit floats give
    complex64; float64, integers and bool complex128)."""
    if d.is_complex:
        return d
    return dt.complex64 if d in (dt.float32, dt.float16, dt.bfloat16) else dt.complex128


def _length(n, what: str, t) -> int | None:
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ShapeError(f"{what}: n={n!r} is not a number of points", received=str(t),
                         expected="an int >= 1 (or None: the input's length)")
    return int(n)


def _normalize(types, attrs):
    t = types[0]
    if attrs["norm"] not in NORMS:
        raise ArgumentError(f"norm={attrs['norm']!r} is not a normalisation",
                            expected=" or ".join(repr(m) for m in NORMS))
    axis = norm_axis(attrs["axis"], t.rank, t)
    n = _length(attrs["n"], "the transform", t)
    return {"n": n, "axis": axis, "norm": attrs["norm"]}


def _points(t, attrs, what: str):
    """The transform's number of points: n, or the input's length along the axis."""
    n = attrs["n"] if attrs["n"] is not None else t.shape[attrs["axis"]]
    if isinstance(n, Sym):                  # a symbolic size (N // 2 + 1 for rfft)
        return n
    if n < 1:
        raise ShapeError(f"{what} of 0 points along axis {attrs['axis']}", received=str(t),
                         hint="a transform needs at least one point (as NumPy's)")
    return n


def _with(shape, axis, size):
    shape = list(shape)
    shape[axis] = size
    return tuple(shape)


def _infer(kind):
    def infer(types, attrs):
        t, axis = types[0], attrs["axis"]
        if kind == "rfft" and t.dtype.is_complex:
            raise DTypeError("rfft takes a real tensor", received=str(t),
                             hint="op.fft transforms a complex one")
        if kind == "irfft":
            m = t.shape[axis]
            n = attrs["n"] if attrs["n"] is not None else 2 * (m - 1)
            if not isinstance(n, Sym) and n < 1:
                raise ShapeError(f"irfft of {m} frequencies gives 0 points", received=str(t),
                                 hint="pass n= (the output's length)")
            return TensorType(complex_of(t.dtype).part, _with(t.shape, axis, n))
        n = _points(t, attrs, kind)
        out = n // 2 + 1 if kind == "rfft" else n
        return TensorType(complex_of(t.dtype), _with(t.shape, axis, out))
    return infer


def _reference(kind):
    fn = getattr(np.fft, kind)

    def ref(arrays, attrs):
        return fn(arrays[0], n=attrs["n"], axis=attrs["axis"], norm=attrs["norm"])
    return ref


# ---- the decompositions ------------------------------------------------------------------------
def resize(b, x, axis: int, size: int):
    """x cropped or zero-padded at the end of ``axis`` to ``size`` (NumPy's n)."""
    length = x.shape[axis]
    if length == size:
        return x
    rank = len(x.shape)
    if length > size:
        stops = [None] * rank
        stops[axis] = size
        return b.op("slice", x, starts=[None] * rank, stops=stops, steps=None)
    zero = b.op("broadcast_to", b.const_like(0, x), shape=list(_with(x.shape, axis, size - length)))
    return b.op("concat", [x, zero], axis=axis)


def _as(b, x, d: dt.DType):
    return x if x.dtype == d else b.op("cast", x, dtype=d.name)


def _part(b, y, k):
    """Part k (0 real, 1 imaginary) of y's last axis of 2."""
    rank = len(y.shape) - 1
    return b.op("reshape", b.op("slice", y, starts=[None] * rank + [k],
                                stops=[None] * rank + [k + 1], steps=None),
                shape=list(y.shape[:-1]))


def _parts(b, y):
    """The complex tensor whose parts lie on y's last axis of 2."""
    return b.op("complex", _part(b, y, 0), _part(b, y, 1))


def _decompose(kind):
    def decompose(b, xs, attrs):
        x, axis, norm = xs[0], attrs["axis"], attrs["norm"]
        out = complex_of(x.dtype)
        if kind in ("fft", "ifft"):
            n = attrs["n"] or x.shape[axis]
            z = resize(b, _as(b, x, out), axis, n)
            return _parts(b, b.op("dft", b.op("real", z), b.op("imag", z), axis=axis,
                                  inverse=kind == "ifft", scale=scale(norm, n, kind == "ifft")))
        if kind == "rfft":
            n = attrs["n"] or x.shape[axis]
            r = resize(b, _as(b, x, out.part), axis, n)
            return _parts(b, b.op("dft_r2c", r, axis=axis, scale=scale(norm, n, False)))
        n = attrs["n"] or 2 * (x.shape[axis] - 1)
        z = resize(b, _as(b, x, out), axis, n // 2 + 1)
        return b.op("dft_c2r", b.op("real", z), b.op("imag", z), axis=axis, n=n,
                    scale=scale(norm, n, True))
    return decompose


# ---- the adjoints ------------------------------------------------------------------------------
def _halves(b, g, axis: int, n: int, factor: float):
    """g times ``factor`` on the frequencies of a real transform of n points that stand for two
    (all but zero and, for even n, Nyquist), shaped to broadcast along ``axis``."""
    m = n // 2 + 1
    w = np.full(m, factor)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    part = g.dtype.part if g.dtype.is_complex else g.dtype
    w = w.reshape((m,) + (1,) * (len(g.shape) - 1 - axis)).astype(part.np)
    return b.op("mul", g, b.const(w, None))


def _vjp(kind):
    def vjp(b, xs, y, g, a):
        axis, dual = a["axis"], DUAL[a["norm"]]
        length = xs[0].shape[axis]
        if kind in ("fft", "ifft"):
            back = b.op("ifft" if kind == "fft" else "fft", g, axis=axis, norm=dual)
        elif kind == "rfft":
            n = a["n"] or length
            back = b.op("irfft", _halves(b, g, axis, n, 0.5), axis=axis, n=n, norm=dual)
        else:
            n = y.shape[axis]
            back = _halves(b, b.op("rfft", g, axis=axis, norm=dual), axis, n, 2.0)
        return [resize(b, back, axis, length)]
    return vjp


_ATTRS = {"n": None, "axis": -1, "norm": "backward"}
_DOCS = {
    "fft": "the discrete Fourier transform along axis (n: crop or zero-pad to n points first)",
    "ifft": "the inverse discrete Fourier transform along axis (divided by n: norm='backward')",
    "rfft": "the transform of a real tensor: its n // 2 + 1 non-negative frequencies",
    "irfft": "the real tensor of n points (default 2 (m - 1)) whose rfft is the input's "
             "first n // 2 + 1 frequencies (the imaginary parts of zero and Nyquist ignored)",
}
for _kind in ("fft", "ifft", "rfft", "irfft"):
    register(OpDef(_kind, 1, dict(_ATTRS), infer=_infer(_kind), normalize=_normalize,
                   reference=_reference(_kind), decompose=_decompose(_kind), vjp=_vjp(_kind),
                   takes_complex=True, doc=_DOCS[_kind]))


# ---- the primitives ----------------------------------------------------------------------------
def _prim_infer(kind):
    def infer(types, attrs):
        for t in types:
            if not t.dtype.is_float or t.dtype.is_narrow:
                raise DTypeError(f"dft takes float32 or float64 parts", received=str(t))
        t, axis = types[0], attrs["axis"]
        if kind != "r2c" and (types[1].shape != t.shape or types[1].dtype != t.dtype):
            raise ShapeError("dft: the parts differ", received=f"{types[0]} and {types[1]}")
        if kind == "c2r":
            return TensorType(t.dtype, _with(t.shape, axis, attrs["n"]))
        size = t.shape[axis] // 2 + 1 if kind == "r2c" else t.shape[axis]
        return TensorType(t.dtype, (*_with(t.shape, axis, size), 2))
    return infer


def _prim_reference(kind):
    def ref(arrays, attrs):
        axis, s = attrs["axis"], attrs["scale"]
        if kind == "r2c":
            z = np.fft.rfft(arrays[0].astype(np.float64), axis=axis) * s
        else:
            z = arrays[0].astype(np.float64) + 1j * arrays[1]
            if kind == "c2r":
                return np.fft.irfft(z, n=attrs["n"], axis=axis, norm="forward") * s
            z = (np.fft.ifft(z, axis=axis, norm="forward") if attrs["inverse"]
                 else np.fft.fft(z, axis=axis)) * s
        return np.stack([z.real, z.imag], axis=-1)
    return ref


def _prim_vjp(kind):
    """The primitives' adjoints, in the primitives (as the transforms' own, on parts)."""
    def vjp(b, xs, y, g, a):
        axis, s = a["axis"], a["scale"]
        if kind == "c2c":
            back = b.op("dft", _part(b, g, 0), _part(b, g, 1), axis=axis,
                        inverse=not a["inverse"], scale=s)
            return [_part(b, back, 0), _part(b, back, 1)]
        if kind == "r2c":
            n = xs[0].shape[axis]
            gr, gi = (_halves(b, _part(b, g, k), axis, n, 0.5) for k in (0, 1))
            return [b.op("dft_c2r", gr, gi, axis=axis, n=n, scale=s)]
        back = b.op("dft_r2c", g, axis=axis, scale=s)
        return [_halves(b, _part(b, back, k), axis, a["n"], 2.0) for k in (0, 1)]
    return vjp


def _prim_normalize(types, attrs):
    t = types[0]
    return {**attrs, "axis": norm_axis(attrs["axis"], t.rank, t)}


for _name, _kind, _nin, _attrs in (
        ("dft", "c2c", 2, {"axis": -1, "inverse": False, "scale": 1.0}),
        ("dft_r2c", "r2c", 1, {"axis": -1, "scale": 1.0}),
        ("dft_c2r", "c2r", 2, {"axis": -1, "n": 1, "scale": 1.0})):
    register(OpDef(_name, _nin, _attrs, infer=_prim_infer(_kind), normalize=_prim_normalize,
                   reference=_prim_reference(_kind), lowering=Spectral(_kind),
                   vjp=_prim_vjp(_kind),
                   doc=f"the {_kind} transform primitive of the FFT family (ops/spectral.py)"))
