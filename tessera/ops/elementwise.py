"""Elementwise operators: one entry each (dtype rule, NumPy reference, adjoint). How a target
spells one is not here: the C-style targets' templates are tessera/compiler/spelling/."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError
from .registry import (REGISTRY, Elementwise, OpDef, broadcast_shapes, check_no_bool, cj,
                       ref_errstate, register)
from ..types import TensorType


# ---- dtype rules: (operand dtypes or weak scalars) -> (operand dtypes, result dtype) -------------
def unary_float(ds, attrs):
    f = dt.ufunc_float_for(dt.result_type(ds[0]))
    return [f], f


def unary_same(allow_bool=True):
    def rule(ds, attrs):
        d = dt.result_type(ds[0])
        if not allow_bool:
            check_no_bool(d, attrs.get("_op", "this op"))
        return [d], d
    return rule


def binary_arith(allow_bool=True):
    def rule(ds, attrs):
        t = dt.result_type(*ds)
        if not allow_bool:
            check_no_bool(t, attrs.get("_op", "this op"))
        return [t, t], t
    return rule


def _abs_rule(ds, attrs):
    d = dt.result_type(ds[0])
    return [d], d.part          # |z| of a complex z is real


def true_divide(ds, attrs):
    t = dt.default_float_for(dt.result_type(*ds))
    return [t, t], t


def binary_float(ds, attrs):
    t = dt.ufunc_float_for(dt.result_type(*ds))
    return [t, t], t


def compare(ds, attrs):
    t = dt.result_type(*ds)
    return [t, t], dt.bool_


def where_rule(ds, attrs):
    c = ds[0]
    if isinstance(c, dt.DType) and not c.is_bool:
        raise DTypeError("where's condition must be a bool tensor", expected="bool",
                         received=c.short, hint="compare first, e.g. op.where(x > 0, x, 0)")
    t = dt.result_type(ds[1], ds[2])
    return [dt.bool_, t, t], t


def integer_bits(allow_bool=True):
    """Bitwise operators: integers (and bool, as NumPy's & | ^ ~ take it), never floats."""
    def rule(ds, attrs):
        t = dt.result_type(*ds)
        if not (t.is_int or allow_bool and t.is_bool):
            raise DTypeError(f"{attrs.get('_op', 'this op')} takes integer "
                             f"{'or bool ' if allow_bool else ''}tensors", received=t.short,
                             hint="cast to an integer dtype first")
        return [t] * len(ds), t
    return rule


def cast_rule(ds, attrs):
    if attrs.get("dtype") is None:
        raise DTypeError("cast needs a dtype", hint="op.cast(x, tessera.float32)")
    out = dt.get(attrs["dtype"])
    out.np          # bf16 and fp8 need ml_dtypes: an UnsupportedDTypeError here, at the cast
    return [dt.result_type(ds[0])], out


def bitcast_rule(ds, attrs):
    if attrs.get("dtype") is None:
        raise DTypeError("bitcast needs a dtype", hint="op.bitcast(x, tessera.int32)")
    src, out = ds[0], dt.get(attrs["dtype"])
    if src.itemsize != out.itemsize or src.is_complex or out.is_complex:
        raise DTypeError(f"bitcast reads the bits of {src.name} as another dtype of the same "
                         f"width, not {out.name}", received=f"{src.name} -> {out.name}",
                         hint="cast converts values between widths")
    if src.is_narrow or out.is_narrow:          # (computed in float32: no bits to copy there)
        raise DTypeError(f"bitcast of 16- and 8-bit floats is not supported yet "
                         f"({src.name} -> {out.name})",
                         hint="bitcast their uint16 or uint8 storage instead")
    return [src], out


def _fma_rule(ds, attrs):
    t = dt.result_type(*ds)
    check_no_bool(t, "fma")
    return [t, t, t], t


def _fma_ref(a, b, c):
    d = np.result_type(a, b, c)
    if d == np.float32:
        return (a.astype(np.float64) * b + c).astype(np.float32)
    return a * b + c


def elementwise_infer(opdef):
    def infer(types, attrs):
        _, out = opdef.dtype_rule([t.dtype for t in types], {**attrs, "_op": opdef.name})
        return TensorType(out, broadcast_shapes(types))
    return infer


def elementwise(name, nin, dtype_rule, reference, flops=1, attrs=None, doc=""):
    opdef = OpDef(name=name, nin=nin, attrs=attrs or {}, dtype_rule=dtype_rule,
                  reference=reference, lowering=Elementwise(flops), doc=doc)
    opdef.infer = elementwise_infer(opdef)
    return register(opdef)


def _pow_ref(a, b):
    if a.dtype.kind != "i":
        return np.power(a, b)
    # NumPy raises for negative integer exponents; the kernel cannot, so both give what the
    # exact result rounds to toward zero: 1 and -1 stay +-1, everything else becomes 0.
    out = np.power(a, np.maximum(b, 0))
    neg = b < 0
    return np.where(neg, np.where(a == 1, 1, np.where(a == -1, np.where(b % 2, -1, 1), 0)),
                    out).astype(out.dtype)


def _pow_by_products(g, n):
    """x ** k for a constant k of 1 to 4 as products, which vectorise where pow is a call into
    the C library (GPT-2's gelu has x ** 3.0): float32 and narrower through float64, where x*x is
    exact and x**3, x**4 round once there and once to the result (pow's own result but for
    double-rounding ties, well within the library's error bound); float64 only x ** 2 = x*x,
    rounded once as pow is. Integers keep their exact pow."""
    x, e = n.inputs
    if e.node is None or e.node.op != "const" or e.node.attrs["value"].shape != () or \
            x.type != n.out.type or not n.out.type.dtype.is_float:
        return None
    k = float(e.node.attrs["value"])
    d = n.out.type.dtype
    if k not in (1, 2, 3, 4) or (d == dt.float64 and k > 2):
        return None
    if k == 1:
        return x

    def op(name, *inputs, **attrs):
        return g.move_before(g.apply(name, list(inputs), attrs, loc=n.loc, origin=n.origin), n)
    w = x if d == dt.float64 else op("cast", x, dtype="float64")
    sq = op("mul", w, w)
    p = sq if k == 2 else op("mul", sq, w) if k == 3 else op("mul", sq, sq)
    return p if d == dt.float64 else op("cast", p, dtype=d.name)


def _as_float(x):
    """An integer or bool operand of a float-valued reference in its result dtype (NumPy's
    ufuncs convert so themselves; these references are written in float arithmetic)."""
    return x if x.dtype.kind in "fc" else \
        x.astype(dt.ufunc_float_for(dt.from_numpy(x.dtype)).np)


def _erf_ref(x):
    x = _as_float(x)
    out = np.asarray(np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)), dtype=np.float64)
    return out.astype(x.dtype)


def _sigmoid_ref(x):
    x = _as_float(x)
    with ref_errstate():
        return (1 / (1 + np.exp(-x))).astype(x.dtype)


def _gelu_ref(x, approximate):
    x = _as_float(x)
    if approximate == "tanh":
        c = np.sqrt(2 / np.pi)
        return (0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x ** 3)))).astype(x.dtype)
    return (0.5 * x * (1 + _erf_ref(x / np.sqrt(2.0)))).astype(x.dtype)


def _log1p_ref(x):
    with ref_errstate():
        return np.log1p(x)


def _expm1_ref(x):
    with ref_errstate():
        return np.expm1(x)


def _softplus_ref(x):
    x = _as_float(x)
    with ref_errstate():
        return (np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))).astype(x.dtype)


with np.errstate(all="ignore"):
    elementwise("neg", 1, unary_same(allow_bool=False), lambda a, t: -a[0], doc="-x")
    elementwise("abs", 1, _abs_rule, lambda a, t: np.abs(a[0]), doc="|x|")
    for _name, _fn in [("sqrt", np.sqrt), ("sin", np.sin), ("cos", np.cos)]:
        elementwise(_name, 1, unary_float, (lambda fn: lambda a, t: fn(a[0]))(_fn), flops=8,
                    doc=f"{_name}(x)")
    for _name, _fn in [("exp", np.exp), ("tanh", np.tanh), ("erf", _erf_ref), ("log", np.log)]:
        elementwise(_name, 1, unary_float, (lambda fn: lambda a, t: fn(a[0]))(_fn), flops=12,
                    doc=f"{_name}(x) (our own polynomial, tessera/compiler/spelling/libm.h)")
    elementwise("rsqrt", 1, unary_float, lambda a, t: 1 / np.sqrt(_as_float(a[0])), flops=2,
                doc="1/sqrt(x)")
    elementwise("sigmoid", 1, unary_float, lambda a, t: _sigmoid_ref(a[0]), flops=14,
                doc="1/(1+exp(-x))")
    elementwise("log1p", 1, unary_float, lambda a, t: _log1p_ref(a[0]), flops=16,
                doc="log(1 + x), accurate near 0")
    elementwise("expm1", 1, unary_float, lambda a, t: _expm1_ref(a[0]), flops=28,
                doc="exp(x) - 1, accurate near 0")
    elementwise("softplus", 1, unary_float, lambda a, t: _softplus_ref(a[0]), flops=30,
                doc="log(1 + exp(x)), without overflow")
    elementwise("silu", 1, unary_float, lambda a, t: _as_float(a[0]) * _sigmoid_ref(a[0]),
                flops=15, doc="x*sigmoid(x)")
    elementwise("gelu", 1, unary_float,
                lambda a, t: _gelu_ref(a[0], t.get("approximate", "none")), flops=20,
                attrs={"approximate": "none"},
                doc="x*Phi(x); approximate='tanh' gives the tanh form")
    elementwise("relu", 1, unary_same(), lambda a, t: np.maximum(a[0], a[0].dtype.type(0)),
                doc="max(x, 0); NaN stays NaN")

    # an identity whose result is a constant to autodiff (differentiable=False: a zero
    # derivative), as jax.lax.stop_gradient and torch's detach
    elementwise("stop_gradient", 1, unary_same(), lambda a, t: a[0].copy(),
                flops=0, doc="x, with no gradient flowing back through it")
    REGISTRY["stop_gradient"].differentiable = False

    # rounding: exact, so every target gives NumPy's bits; integers are already integral
    # (NumPy 2 keeps their dtype); round is half to even
    for _name, _fn in [("floor", np.floor), ("ceil", np.ceil), ("round", np.round)]:
        elementwise(_name, 1, unary_same(allow_bool=False),
                    (lambda fn: lambda a, t: fn(a[0]))(_fn), doc=f"{_name}(x), elementwise")
    elementwise("sign", 1, unary_same(allow_bool=False), lambda a, t: np.sign(a[0]),
                doc="-1, 0 or 1 by the sign of x (0 for -0.0); NaN stays NaN")

    elementwise("add", 2, binary_arith(), lambda a, t: np.add(a[0], a[1]), doc="a + b")
    elementwise("sub", 2, binary_arith(allow_bool=False), lambda a, t: np.subtract(a[0], a[1]),
                doc="a - b")
    elementwise("mul", 2, binary_arith(), lambda a, t: np.multiply(a[0], a[1]), doc="a * b")
    elementwise("div", 2, true_divide, lambda a, t: np.true_divide(a[0], a[1]),
                doc="a / b (true division)")
    elementwise("pow", 2, binary_arith(allow_bool=False), lambda a, t: _pow_ref(a[0], a[1]),
                flops=8, doc="a ** b")
    REGISTRY["pow"].simplify = [_pow_by_products]
    elementwise("atan2", 2, binary_float, lambda a, t: np.arctan2(a[0], a[1]), flops=20,
                doc="the angle of the point (x, y) = (b, a) from the x axis, in (-pi, pi] "
                    "(NumPy's arctan2)")
    elementwise("maximum", 2, binary_arith(), lambda a, t: np.maximum(a[0], a[1]),
                doc="elementwise max; NaN propagates")
    elementwise("minimum", 2, binary_arith(), lambda a, t: np.minimum(a[0], a[1]),
                doc="elementwise min; NaN propagates")
    elementwise("mod", 2, binary_arith(allow_bool=False), lambda a, t: np.remainder(a[0], a[1]),
                flops=4,
                doc="a - floor(a / b) * b: the remainder with the divisor's sign (Python's %, "
                    "NumPy's remainder)")
    elementwise("floor_divide", 2, binary_arith(allow_bool=False),
                lambda a, t: np.floor_divide(a[0], a[1]), flops=4,
                doc="floor(a / b) (Python's //, NumPy's floor_divide); integers by zero give 0")
    # bits: NumPy's, shifts included: a shift by the width or more (or a negative one, which
    # NumPy reads as unsigned) gives 0, or -1 for a negative integer shifted right (C leaves
    # both undefined)
    for _name, _sym, _fn in [("bitwise_and", "&", np.bitwise_and), ("bitwise_or", "|", np.bitwise_or),
                             ("bitwise_xor", "^", np.bitwise_xor)]:
        elementwise(_name, 2, integer_bits(), (lambda fn: lambda a, t: fn(a[0], a[1]))(_fn),
                    doc=f"a {_sym} b, bitwise")
    elementwise("bitwise_not", 1, integer_bits(), lambda a, t: np.invert(a[0]),
                doc="~x, bitwise (not, for bool)")
    elementwise("left_shift", 2, integer_bits(allow_bool=False),
                lambda a, t: np.left_shift(a[0], a[1]), doc="a << b (0 when b is the width or more)")
    elementwise("right_shift", 2, integer_bits(allow_bool=False),
                lambda a, t: np.right_shift(a[0], a[1]),
                doc="a >> b, arithmetic for signed integers")
    for _name in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "left_shift",
                  "right_shift"):
        REGISTRY[_name].differentiable = False
    for _name, _sym, _fn in [("eq", "==", np.equal), ("ne", "!=", np.not_equal),
                             ("lt", "<", np.less), ("le", "<=", np.less_equal),
                             ("gt", ">", np.greater), ("ge", ">=", np.greater_equal)]:
        elementwise(_name, 2, compare, (lambda fn: lambda a, t: fn(a[0], a[1]))(_fn),
                    doc=f"a {_sym} b")
        REGISTRY[_name].differentiable = False     # a bool result carries no gradient
    elementwise("where", 3, where_rule, lambda a, t: np.where(a[0], a[1], a[2]),
                doc="cond ? a : b")
    # a * b + c rounded once (the C library's fma): the step of every matmul chain, and of a
    # tile kernel's mma. The reference widens float32 to float64 (the product exact there, the
    # sum rounded twice: an ulp apart at most, in rare ties); float64's rounds a * b first
    elementwise("fma", 3, _fma_rule, lambda a, t: _fma_ref(*a), flops=2,
                doc="a * b + c, rounded once")
    # into a narrow float the value is rounded once (dtypes.convert)
    elementwise("cast", 1, cast_rule, lambda a, t: dt.convert(a[0], t["dtype"]),
                attrs={"dtype": None},
                doc="convert to another dtype (into a narrow float: the value rounded once)")
    elementwise("bitcast", 1, bitcast_rule, lambda a, t: a[0].view(dt.get(t["dtype"]).np),
                attrs={"dtype": None},
                doc="the same bits read as another dtype of the same width (NumPy's view, "
                    "ONNX's BitCast, PyTorch's Tensor.view(dtype)); a byte into bool is "
                    "whether it is nonzero")
    REGISTRY["bitcast"].normalize = lambda ts, a: {"dtype": dt.get(a["dtype"]).name}
    REGISTRY["bitcast"].differentiable = False      # (bits: no derivative)
    REGISTRY["cast"].normalize = lambda ts, a: {"dtype": dt.get(a["dtype"]).name}
    REGISTRY["cast"].simplify = [lambda g, n: n.inputs[0] if n.inputs[0].type == n.out.type
                                 else None]                      # a cast to its own dtype

for _op, _ufunc in [("neg", "negative"), ("abs", "absolute"), ("exp", "exp"), ("log", "log"),
                    ("sqrt", "sqrt"), ("sin", "sin"), ("cos", "cos"), ("tanh", "tanh"),
                    ("add", "add"), ("sub", "subtract"), ("mul", "multiply"),
                    ("div", "divide"), ("pow", "power"), ("maximum", "maximum"),
                    ("atan2", "arctan2"),
                    ("floor", "floor"), ("ceil", "ceil"), ("sign", "sign"),
                    ("mod", "remainder"), ("floor_divide", "floor_divide"),
                    ("minimum", "minimum"), ("eq", "equal"), ("ne", "not_equal"),
                    ("lt", "less"), ("le", "less_equal"), ("gt", "greater"),
                    ("ge", "greater_equal"), ("bitwise_and", "bitwise_and"),
                    ("bitwise_or", "bitwise_or"), ("bitwise_xor", "bitwise_xor"),
                    ("bitwise_not", "invert"), ("left_shift", "left_shift"),
                    ("right_shift", "right_shift")]:
    REGISTRY[_op].ufunc = _ufunc


# ---- adjoints: (inputs, output y, cotangent g, attrs) -> one cotangent per input ----------------
# Cotangents keep the output's (broadcast) shape; the autodiff pass sums them back to each
# input's shape. Conventions at kinks: abs'(0) = 0, relu'(0) = 0, and maximum/minimum give a tie
# to the first operand.
def _gelu_vjp(b, xs, y, g, a):
    x = xs[0]
    if a["approximate"] == "tanh":                  # y = x/2 (1 + t), t = tanh(c (x + k x^3))
        c, k = math.sqrt(2 / math.pi), 0.044715
        t = b.op("tanh", b.op("mul", b.op("add", x, b.op("mul", b.op("mul", b.op("mul", x, x), x), k)), c))
        du = b.op("mul", b.op("add", b.op("mul", b.op("mul", x, x), 3 * k), 1.0), c)
        d = b.op("add", b.op("mul", b.op("add", t, 1.0), 0.5),
               b.op("mul", b.op("mul", b.op("mul", x, 0.5), b.op("sub", 1.0, b.op("mul", t, t))), du))
    else:                                           # Phi(x) + x phi(x)
        cdf = b.op("mul", b.op("add", b.op("erf", b.op("mul", x, 1 / math.sqrt(2))), 1.0), 0.5)
        pdf = b.op("mul", b.op("exp", b.op("mul", b.op("mul", x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
        d = b.op("add", cdf, b.op("mul", x, pdf))
    return [b.op("mul", g, d)]


def _silu_vjp(b, xs, y, g, a):                          # s (1 + x (1 - s))
    s = b.op("sigmoid", xs[0])
    return [b.op("mul", g, b.op("mul", s, b.op("add", b.op("mul", xs[0], b.op("sub", 1.0, s)), 1.0)))]


def _pow_vjp(b, xs, y, g, a):
    base, e = xs
    d_base = b.op("mul", g, cj(b, b.op("mul", e, b.op("pow", base, b.op("sub", e, 1)))))
    # d/de = y log(base); log(1) where base == 0 so 0^e gives 0, not 0 * -inf (as JAX does)
    d_exp = b.op("mul", g, cj(b, b.op("mul", y, b.op("log", b.op("where", b.op("eq", base, 0),
                                                                    1.0, base)))))
    return [d_base, d_exp]


def _erf_slope(b, x):                                  # 2/sqrt(pi) exp(-x^2)
    return b.op("mul", b.op("exp", b.op("neg", b.op("mul", x, x))), 2 / math.sqrt(math.pi))


def _sign_select(b, x, g):                             # g sign(x), with sign(0) = 0
    return b.op("where", b.op("gt", x, 0), g, b.op("where", b.op("lt", x, 0), b.op("neg", g), 0))


def _abs_vjp(b, xs, y, g, a):
    x = xs[0]
    if not x.dtype.is_complex:
        return [_sign_select(b, x, g)]
    unit = b.op("div", x, b.op("where", b.op("gt", y, 0), y, 1.0))     # z/|z| (0 at 0)
    return [b.op("mul", g, unit)]


def _atan2_vjp(b, xs, y, g, a):
    """d atan2(u, v) = (v du - u dv) / (u^2 + v^2)."""
    u, v = xs
    r2 = b.op("add", b.op("mul", u, u), b.op("mul", v, v))
    return [b.op("div", b.op("mul", g, v), r2), b.op("neg", b.op("div", b.op("mul", g, u), r2))]


_VJP = {
    "neg": lambda b, xs, y, g, a: [b.op("neg", g)],
    "abs": _abs_vjp,
    "sqrt": lambda b, xs, y, g, a: [b.op("div", g, b.op("mul", cj(b, y), 2))],
    "sin": lambda b, xs, y, g, a: [b.op("mul", g, b.op("cos", xs[0]))],
    "cos": lambda b, xs, y, g, a: [b.op("neg", b.op("mul", g, b.op("sin", xs[0])))],
    "exp": lambda b, xs, y, g, a: [b.op("mul", g, cj(b, y))],
    "tanh": lambda b, xs, y, g, a: [b.op("mul", g, b.op("sub", 1.0, b.op("mul", y, y)))],
    "erf": lambda b, xs, y, g, a: [b.op("mul", g, _erf_slope(b, xs[0]))],
    "log": lambda b, xs, y, g, a: [b.op("div", g, cj(b, xs[0]))],
    "atan2": _atan2_vjp,
    "rsqrt": lambda b, xs, y, g, a: [b.op("mul", g, b.op("mul", b.op("mul", b.op("mul", y, y), y), -0.5))],
    "sigmoid": lambda b, xs, y, g, a: [b.op("mul", g, b.op("mul", y, b.op("sub", 1.0, y)))],
    "log1p": lambda b, xs, y, g, a: [b.op("div", g, b.op("add", xs[0], 1.0))],
    "expm1": lambda b, xs, y, g, a: [b.op("mul", g, b.op("add", y, 1.0))],
    "softplus": lambda b, xs, y, g, a: [b.op("mul", g, b.op("sigmoid", xs[0]))],
    "silu": _silu_vjp,
    "gelu": _gelu_vjp,
    "relu": lambda b, xs, y, g, a: [b.op("where", b.op("gt", xs[0], 0), g, 0)],
    "add": lambda b, xs, y, g, a: [g, g],
    "fma": lambda b, xs, y, g, a: [b.op("mul", g, cj(b, xs[1])), b.op("mul", g, cj(b, xs[0])), g],
    "sub": lambda b, xs, y, g, a: [g, b.op("neg", g)],
    "mul": lambda b, xs, y, g, a: [b.op("mul", g, cj(b, xs[1])), b.op("mul", g, cj(b, xs[0]))],
    "div": lambda b, xs, y, g, a: [b.op("div", g, cj(b, xs[1])),
                                   b.op("neg", b.op("div", b.op("mul", g, cj(b, y)),
                                                    cj(b, xs[1])))],
    "pow": _pow_vjp,
    "maximum": lambda b, xs, y, g, a: [b.op("where", b.op("ge", xs[0], xs[1]), g, 0),
                                    b.op("where", b.op("ge", xs[0], xs[1]), 0, g)],
    "minimum": lambda b, xs, y, g, a: [b.op("where", b.op("le", xs[0], xs[1]), g, 0),
                                    b.op("where", b.op("le", xs[0], xs[1]), 0, g)],
    "where": lambda b, xs, y, g, a: [None, b.op("where", xs[0], g, 0), b.op("where", xs[0], 0, g)],
    # piecewise constant: zero almost everywhere (as JAX has it); mod is a - b * (a // b)
    **{n: (lambda b, xs, y, g, a: [None]) for n in ("floor", "ceil", "round", "sign")},
    "floor_divide": lambda b, xs, y, g, a: [None, None],
    "mod": lambda b, xs, y, g, a: [g, b.op("neg", b.op("mul", g, b.op("floor_divide", xs[0], xs[1])))],
    # float -> float: the cotangent goes back in the input's dtype; from an integer: none
    "cast": lambda b, xs, y, g, a: [b.op("cast", g, dtype=xs[0].dtype.name)
                                 if xs[0].dtype.is_inexact else None],
}
for _op, _rule in _VJP.items():
    REGISTRY[_op].vjp = _rule
