"""Complex numbers: op.real, op.imag, op.conj, op.complex, and the rules by which the compiler
computes every operator that takes complex tensors on their real and imaginary parts.

complex64 and complex128 tensors are stored as NumPy stores them (parts interleaved), so arrays
go in and out without a copy. No kernel ever sees a complex value: before scheduling, the
compiler's complex pass (compiler/passes.py, `split_complex`) gives each complex value of the
primitive graph two float values, its parts, by the rules below (a parameter's parts are read
in place from the interleaved memory, a result's written back into it). The arithmetic is
NumPy's formula for each operator, so results agree with NumPy's to the last bits of the float
operations involved (complex division by Smith's method, as NumPy). One exception, C99's
(Annex G) rather than NumPy's: a product with a real operand scales both parts (two products,
not four; NumPy promotes the real operand to complex first, so an infinite part times its zero
imaginary part makes a NaN there, and a zero's sign may differ).

An operator takes complex tensors only where it has a rule here; any other is an
UnsupportedDTypeError at the line that calls it (in a traced function and eagerly alike).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError
from ..types import TensorType
from .registry import REGISTRY, OpDef, broadcast_shapes, register


# ---- the operators -------------------------------------------------------------------------------
def _part_infer(types, attrs):
    t = types[0]
    return TensorType(t.dtype.part if t.dtype.is_complex else dt.default_float_for(t.dtype),
                      t.shape)


def _complex_infer(types, attrs):
    for t in types:
        if t.dtype.is_complex:
            raise DTypeError("op.complex takes real parts", received=str(t),
                             hint="op.real(z) and op.imag(z) give a complex tensor's parts")
    d = dt.result_type(*(dt.default_float_for(t.dtype) for t in types))
    return TensorType(dt.complex128 if d is dt.float64 else dt.complex64,
                      broadcast_shapes(types))


def _conj_infer(types, attrs):
    return types[0]


def _on_real(what):
    """real, imag and conj of a real tensor need no kernel of their own."""
    def decompose(b, xs, attrs):
        x = xs[0]
        if x.dtype.is_complex:
            return None                     # the complex pass's rule (RULES)
        d = dt.default_float_for(x.dtype)
        x = x if x.dtype == d or what == "conj" else b.op("cast", x, dtype=d.name)
        if what == "imag":              # +0 everywhere (x * 0 would be -0, or NaN at inf)
            return b.op("broadcast_to", b.const(np.zeros((), d.np), None), shape=list(x.shape))
        return x
    return decompose


register(OpDef("real", 1, infer=_part_infer, reference=lambda a, t: np.real(a[0]),
               decompose=_on_real("real"),
               doc="the real part of a complex tensor (a real tensor unchanged, as a float)"))
register(OpDef("imag", 1, infer=_part_infer, reference=lambda a, t: np.imag(a[0]),
               decompose=_on_real("imag"),
               doc="the imaginary part of a complex tensor (zeros for a real one)"))
register(OpDef("conj", 1, infer=_conj_infer, reference=lambda a, t: np.conj(a[0]),
               decompose=_on_real("conj"),
               doc="the complex conjugate (a real tensor unchanged)"))
register(OpDef("complex", 2, infer=_complex_infer,
               reference=lambda a, t: a[0] + 1j * a[1].astype(np.result_type(a[1], np.float32)),
               doc="re + i im, from two real tensors (broadcast; complex64 from float32 parts, "
                   "complex128 from float64)"))


# ---- the rules: each takes parts (a real Value, or a complex one's (re, im)) ------------------------
def _re(x):
    return x[0] if isinstance(x, tuple) else x


def _im(b, x, like):
    """The imaginary part of x (zeros of like's real dtype and x's shape for a real x)."""
    if isinstance(x, tuple):
        return x[1]
    zero = b.const(np.zeros((), like.part.np), None)
    return b.op("broadcast_to", zero, shape=list(x.shape))


def _real(b, x, d):
    """x's real part in d (a real x cast)."""
    r = _re(x)
    return r if r.dtype == d else b.op("cast", r, dtype=d.name)


def _partwise(b, xs, attrs, out, op):
    """Operators linear in their complex operands with real coefficients (moving elements,
    adding, summing): the operator on each part (an index operand passed to both)."""
    d = out.dtype.part
    pairs = [x if isinstance(x, tuple) else (_real(b, x, d), _im(b, x, out.dtype))
             if x.dtype.is_inexact else (x, x) for x in xs]
    return (b.op(op, *[p[0] for p in pairs], **attrs), b.op(op, *[p[1] for p in pairs], **attrs))


def _listed(op):
    def rule(b, xs, attrs, out):
        d = out.dtype.part
        parts = [(_real(b, x, d), _im(b, x, out.dtype)) for x in xs]
        return (b.op(op, [p[0] for p in parts], **attrs), b.op(op, [p[1] for p in parts], **attrs))
    return rule


def _binary(op):
    """add and sub: each part; a real operand has no imaginary part to add."""
    def rule(b, xs, attrs, out):
        d = out.dtype.part
        x, y = xs
        re = b.op(op, _real(b, x, d), _real(b, y, d))
        if isinstance(x, tuple) and isinstance(y, tuple):
            im = b.op(op, x[1], y[1])
        elif isinstance(x, tuple):
            im = x[1]
        else:
            im = y[1] if op == "add" else b.op("neg", y[1])
        return re, im
    return rule


def _is_zero(v) -> bool:
    """Is v zeros the rules made (a real value's imaginary part: `_im`)?"""
    c = _constant(v)
    return c is not None and not np.any(c)


def _mul(b, xs, attrs, out):
    d = out.dtype.part
    # a real value promoted to complex (x * w, w real) scales both parts: 2 products, not 4
    x, y = (v[0] if isinstance(v, tuple) and _is_zero(v[1]) else v for v in xs)
    if not isinstance(x, tuple) and not isinstance(y, tuple):    # both real after all
        p = b.op("mul", _real(b, x, d), _real(b, y, d))
        return p, _im(b, p, out.dtype)
    if not isinstance(x, tuple) or not isinstance(y, tuple):     # a real factor scales both
        z, r = (y, x) if isinstance(y, tuple) else (x, y)
        r = _real(b, r, d)
        return b.op("mul", z[0], r), b.op("mul", z[1], r)
    (a, c), (e, f) = x, y                                  # (a + ic)(e + if)
    return (b.op("sub", b.op("mul", a, e), b.op("mul", c, f)),
            b.op("add", b.op("mul", a, f), b.op("mul", c, e)))


def _div(b, xs, attrs, out):
    """Smith's method (NumPy's): scale by the larger part of the divisor, no overflow in |y|^2."""
    d = out.dtype.part
    x, y = xs
    a, c = _real(b, x, d), _im(b, x, out.dtype)
    if not isinstance(y, tuple):
        r = _real(b, y, d)
        return b.op("div", a, r), b.op("div", c, r)
    e, f = y
    big_e = b.op("ge", b.op("abs", e), b.op("abs", f))
    # |e| >= |f|: r = f/e, den = e + f r, (a + c r)/den, (c - a r)/den
    r1 = b.op("div", f, e)
    den1 = b.op("add", e, b.op("mul", f, r1))
    re1 = b.op("div", b.op("add", a, b.op("mul", c, r1)), den1)
    im1 = b.op("div", b.op("sub", c, b.op("mul", a, r1)), den1)
    # else: r = e/f, den = f + e r, (a r + c)/den, (c r - a)/den
    r2 = b.op("div", e, f)
    den2 = b.op("add", f, b.op("mul", e, r2))
    re2 = b.op("div", b.op("add", b.op("mul", a, r2), c), den2)
    im2 = b.op("div", b.op("sub", b.op("mul", c, r2), a), den2)
    return b.op("where", big_e, re1, re2), b.op("where", big_e, im1, im2)


def _neg(b, xs, attrs, out):
    return b.op("neg", xs[0][0]), b.op("neg", xs[0][1])


def _exp(b, xs, attrs, out):
    re, im = xs[0]
    m = b.op("exp", re)
    return b.op("mul", m, b.op("cos", im)), b.op("mul", m, b.op("sin", im))


def _abs(b, xs, attrs, out):
    """|z| without overflow in re^2 + im^2: m sqrt((re/m)^2 + (im/m)^2), m = max(|re|, |im|)."""
    re, im = (b.op("abs", p) for p in xs[0])
    m = b.op("maximum", re, im)
    safe = b.op("where", b.op("gt", m, 0.0), m, 1.0)
    s, t = b.op("div", re, safe), b.op("div", im, safe)
    return b.op("mul", m, b.op("sqrt", b.op("add", b.op("mul", s, s), b.op("mul", t, t))))


def _log(b, xs, attrs, out):
    """log|z| + i angle(z), |z| without overflow (as abs)."""
    re, im = xs[0]
    return b.op("log", _abs(b, xs, attrs, out)), b.op("atan2", im, re)


def _sqrt(b, xs, attrs, out):
    """The principal root by NumPy's (C99's csqrt) formula, without cancellation: t =
    sqrt((|re| + |z|) / 2); re >= 0: (t, im / 2t); re < 0: (|im| / 2t, t with im's sign)."""
    re, im = xs[0]
    t = b.op("sqrt", b.op("mul", b.op("add", b.op("abs", re), _abs(b, xs, attrs, out)), 0.5))
    safe = b.op("where", b.op("gt", t, 0.0), t, 1.0)             # z = 0: both parts 0
    half = b.op("div", b.op("mul", im, 0.5), safe)
    # im's sign bit: below 0, or -0 (1 / -0 = -inf)
    negative = b.op("where", b.op("lt", im, 0.0), True, b.op("lt", b.op("div", 1.0, im), 0.0))
    signed_t = b.op("where", negative, b.op("neg", t), t)
    right = b.op("ge", re, 0.0)
    return (b.op("where", right, t, b.op("abs", half)), b.op("where", right, half, signed_t))


def _constant(v):
    """The value of v where the rules' graph holds it as a constant (through broadcasts and
    casts: a Python scalar's), else None."""
    n = v.node
    while n is not None and n.op in ("broadcast_to", "cast"):
        n = n.inputs[0].node
    return n.attrs["value"] if n is not None and n.op == "const" else None


def _small_integer(c):
    """The integer n, |n| < 100, that every element of constant c is, else None."""
    if c is None or not np.size(c):
        return None
    n = float(np.ravel(c)[0])
    return int(n) if n.is_integer() and abs(n) < 100 and np.all(c == n) else None


def _pow(b, xs, attrs, out):
    """z ** w by NumPy's cases. An exponent known when tracing to be one integer n, |n| < 100
    (`z ** 2`): binary powering with complex products, 1 / z^-n for n < 0 (exact where the
    products are: 1j ** 2 is -1). Otherwise exp(w log z), with w = 0 giving 1 and z = 0 giving 0
    where Re w > 0, NaN where not."""
    d = out.dtype.part
    z, w = xs
    z = (_real(b, z, d), _im(b, z, out.dtype))
    w_re, w_im = _real(b, w, d), (w[1] if isinstance(w, tuple) else None)
    k = _small_integer(_constant(w_re))
    if k is not None and (w_im is None or _is_zero(w_im)):
        re1 = b.op("broadcast_to", b.const(np.ones((), d.np), None), shape=list(out.shape))
        one = (re1, _im(b, re1, out.dtype))
        acc, base, m = None, z, abs(k)
        while m:
            if m & 1:
                acc = base if acc is None else _mul(b, [acc, base], {}, out)
            m >>= 1
            if m:
                base = _mul(b, [base, base], {}, out)
        acc = tuple(b.op("broadcast_to", p, shape=list(out.shape)) for p in acc or one)
        return _div(b, [one, acc], {}, out) if k < 0 else acc
    w_im = _im(b, w, out.dtype) if w_im is None else w_im
    lr, li = _log(b, [z], {}, out)                          # log z = lr + i li
    er = b.op("sub", b.op("mul", w_re, lr), b.op("mul", w_im, li))
    ei = b.op("add", b.op("mul", w_re, li), b.op("mul", w_im, lr))
    pr, pi = _exp(b, [(er, ei)], {}, out)
    zero_z = b.op("where", b.op("eq", z[0], 0.0), b.op("eq", z[1], 0.0), False)
    zero_w = b.op("where", b.op("eq", w_re, 0.0), b.op("eq", w_im, 0.0), False)
    zero, nan = (b.const(np.asarray(v, d.np), None) for v in (0.0, np.nan))
    at_zero = b.op("where", b.op("gt", w_re, 0.0), zero, nan)
    parts = []
    for p, unit in ((pr, 1.0), (pi, 0.0)):
        p = b.op("where", zero_z, at_zero, p)
        parts.append(b.op("broadcast_to", b.op("where", zero_w, unit, p), shape=list(out.shape)))
    return tuple(parts)


def _matmul(b, xs, attrs, out):
    d = out.dtype.part
    (a, c), (e, f) = [(_real(b, x, d), _im(b, x, out.dtype)) for x in xs]
    return (b.op("sub", b.op("matmul", a, e), b.op("matmul", c, f)),
            b.op("add", b.op("matmul", a, f), b.op("matmul", c, e)))


def _cast(b, xs, attrs, out):
    x = xs[0]
    if out.dtype.is_complex:
        d = out.dtype.part
        return _real(b, x, d), (b.op("cast", x[1], dtype=d.name) if isinstance(x, tuple) and
                                x[1].dtype != d else _im(b, x, out.dtype))
    return b.op("cast", x[0], dtype=out.dtype.name)     # the real part, as NumPy


def _eq_ne(op):
    def rule(b, xs, attrs, out):
        d = dt.result_type(*[(x[0] if isinstance(x, tuple) else x).dtype for x in xs])
        like = dt.complex128 if d is dt.float64 else dt.complex64
        (a, c), (e, f) = [(_real(b, x, d), _im(b, x, like)) for x in xs]
        same_re, same_im = b.op(op, a, e), b.op(op, c, f)
        # eq: both parts equal; ne: either differs
        return (b.op("where", same_re, same_im, False) if op == "eq" else
                b.op("where", same_re, True, same_im))
    return rule


def _where(b, xs, attrs, out):
    c, x, y = xs
    return (b.op("where", c, _real(b, x, out.dtype.part), _real(b, y, out.dtype.part)),
            b.op("where", c, _im(b, x, out.dtype), _im(b, y, out.dtype)))


# ---- adjoints (PyTorch's convention: the gradient of a real loss is d/dre + i d/dim) ----------------
def _real_vjp(b, xs, y, g, a):
    return [b.op("complex", g, 0.0) if xs[0].dtype.is_complex else g]


def _imag_vjp(b, xs, y, g, a):
    return [b.op("complex", 0.0, g) if xs[0].dtype.is_complex else None]


REGISTRY["real"].vjp = _real_vjp
REGISTRY["imag"].vjp = _imag_vjp
REGISTRY["conj"].vjp = lambda b, xs, y, g, a: [b.op("conj", g)]
REGISTRY["complex"].vjp = lambda b, xs, y, g, a: [b.op("real", g), b.op("imag", g)]


RULES = {
    "real": lambda b, xs, attrs, out: xs[0][0],
    "imag": lambda b, xs, attrs, out: xs[0][1],
    "conj": lambda b, xs, attrs, out: (xs[0][0], b.op("neg", xs[0][1])),
    "complex": lambda b, xs, attrs, out: tuple(
        b.op("broadcast_to", _real(b, x, out.dtype.part), shape=list(out.shape)) for x in xs),
    "add": _binary("add"), "sub": _binary("sub"), "mul": _mul, "div": _div, "neg": _neg,
    "exp": _exp, "abs": _abs, "log": _log, "sqrt": _sqrt, "pow": _pow, "matmul": _matmul,
    "cast": _cast, "where": _where,
    "eq": _eq_ne("eq"), "ne": _eq_ne("ne"),
    "concat": _listed("concat"),
}
for _op in ("sum", "mean", "cumsum", "transpose", "reshape", "broadcast_to", "expand_dims",
            "squeeze", "slice", "take", "take_along_axis", "scatter_add", "stop_gradient"):
    RULES[_op] = (lambda op: lambda b, xs, attrs, out: _partwise(b, xs, attrs, out, op))(_op)
