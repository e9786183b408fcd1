"""ONNX in and out: ``ts.onnx.export(fn, path, *example)`` and ``ts.onnx.import_model(model)``.

    ts.onnx.export(fn, "m.onnx", x, w, opset_version=17)    # also fn.export(...)
    g = ts.onnx.import_model("m.onnx")                       # a tessera Function
    y = g(x, w)

Export traces ``fn`` on the example arguments and writes its Graph IR (the operators the user
wrote, before decomposition) as ONNX nodes, one table entry per tessera operator (`EXPORT`),
constants as initializers; the model passes ``onnx.checker`` and runs in
``onnx.reference.ReferenceEvaluator`` (and onnxruntime) to the same results. Import reads an
ONNX graph (a path, bytes or a ModelProto) into a tessera Function of the graph's inputs, its
initializers as constants, one table entry per ONNX operator (`IMPORT`). Either way an operator
without an entry is one ``TesseraError`` listing them all. Needs the ``onnx`` package.
"""
from __future__ import annotations

import inspect
import itertools
import math

import numpy as np

from . import dtypes as dt
from . import op
from .errors import ArgumentError, TesseraError, UnsupportedDTypeError
from .function import Function, extensions
from .control import cond as ts_cond, scan as ts_scan, while_loop as ts_while_loop
from .trace import Traced, dtype_of

OPSET = 17
# The newest opset whose operators' rules the importer was checked against (ONNX's node tests
# of onnx 1.23); a later onnx release's newer opsets are not yet claimed.
NEWEST_CHECKED_OPSET = 28
# The newest opset the exporter writes (each operator by that opset's spelling)
NEWEST_EXPORTED_OPSET = 21


def _onnx():
    try:
        import onnx
    except ImportError:
        raise TesseraError("ONNX import and export need the onnx package",
                           hint="pip install onnx") from None
    return onnx


_ONNX_DTYPE = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6,
               "int64": 7, "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13,
               "bfloat16": 16, "float8_e4m3fn": 17, "float8_e5m2": 19}
_FROM_ONNX_DTYPE = {v: k for k, v in _ONNX_DTYPE.items()}


def _tessera_dtype(code, node) -> str:
    """The tessera dtype name of an ONNX element type, or a TesseraError naming both."""
    if code in _FROM_ONNX_DTYPE:
        return _FROM_ONNX_DTYPE[code]
    onnx = _onnx()
    name = onnx.helper.tensor_dtype_to_string(code) if code in onnx.helper.get_all_tensor_dtypes() \
        else f"element type {code}"
    raise UnsupportedDTypeError(f"{node.op_type} node {node.name or node.output[0]!r} uses "
                                f"{name}, which tessera's dtype table lacks",
                                expected=", ".join(_ONNX_DTYPE))


# ---- export ------------------------------------------------------------------------------------
class _Writer:
    def __init__(self, onnx, names, opset):
        self.onnx, self.h, self.opset = onnx, onnx.helper, opset
        self.nodes, self.inits, self.names, self.k = [], [], names, 0

    def fresh(self, hint="t"):
        self.k += 1
        return f"_{hint}{self.k}"

    def node(self, kind, inputs, out=None, **attrs):
        out = out or self.fresh(kind.lower())
        self.nodes.append(self.h.make_node(kind, list(inputs), [out], **attrs))
        return out

    def const(self, array, hint="c"):
        name = self.fresh(hint)
        self.inits.append(self.onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values):
        return self.const(np.asarray(list(values), dtype=np.int64), "ints")

    def reduce(self, kind, x, axes, keepdims, dtype, out=None, out_dtype=None):
        """A Reduce* node as the opset spells it: axes an input from opset 18 (ReduceSum's from
        13), an attribute before; a bool max or min (any, all) through int32 before opset 20,
        which first allows bool; an input of another dtype than the result (a count of bools,
        the mean of integers) cast to the result's first, as tessera computes it."""
        out_dtype = out_dtype or dtype
        if out_dtype != dtype:
            x, dtype = self.node("Cast", [x], to=_ONNX_DTYPE[out_dtype.name]), out_dtype
        through_int = dtype.is_bool and self.opset < 20
        if through_int:
            x = self.node("Cast", [x], to=_ONNX_DTYPE["int32"])
        if kind == "ReduceSum" or self.opset >= 18:
            y = self.node(kind, [x, self.ints(axes)], None if through_int else out,
                          keepdims=keepdims)
        else:
            y = self.node(kind, [x], None if through_int else out, axes=list(axes),
                          keepdims=keepdims)
        return self.node("Cast", [y], out, to=_ONNX_DTYPE["bool"]) if through_int else y


def _unary(kind):
    return lambda w, n, xs, out: w.node(kind, xs, out)


def _axes(n) -> list:
    """A reduction's axes as a list (None: all of them)."""
    axes = n.attrs["axis"]
    if axes is None:
        return list(range(n.inputs[0].type.rank))
    return [axes] if isinstance(axes, int) else list(axes)


def _reduce(kind):
    def write(w, n, xs, out):
        axes = _axes(n)
        keep = int(bool(n.attrs.get("keepdim", False)))
        return w.reduce(kind, xs[0], axes, keep, n.inputs[0].type.dtype, out,
                        n.out.type.dtype)
    return write


def _slice(w, n, xs, out):
    starts, stops, steps, axes = [], [], [], []
    for ax, (a, b, s) in enumerate(zip(n.attrs["starts"], n.attrs["stops"], n.attrs["steps"])):
        if a is None and b is None and s == 1:
            continue
        big = np.iinfo(np.int64).max
        starts.append(a if a is not None else (0 if s > 0 else -1))
        stops.append(b if b is not None else (big if s > 0 else -big))
        steps.append(s)
        axes.append(ax)
    if not axes:
        return w.node("Identity", xs, out)
    return w.node("Slice", [xs[0], w.ints(starts), w.ints(stops), w.ints(axes), w.ints(steps)],
                  out)


def _layernorm(w, n, xs, out):
    d = n.inputs[0].type
    size = d.shape[n.attrs["axis"]]
    ones = w.const(np.ones(size, d.dtype.np), "ones")
    zeros = w.const(np.zeros(size, d.dtype.np), "zeros")
    return w.node("LayerNormalization", [xs[0], ones, zeros], out, axis=n.attrs["axis"],
                  epsilon=float(n.attrs["eps"]))


def _var(w, n, xs, out):
    axes = _axes(n)
    mean = w.reduce("ReduceMean", xs[0], axes, 1, n.inputs[0].type.dtype)
    dev = w.node("Sub", [xs[0], mean])
    sq = w.node("Mul", [dev, dev])
    total = w.reduce("ReduceSum", sq, axes, int(bool(n.attrs["keepdim"])), n.out.type.dtype)
    count = math.prod(n.inputs[0].type.shape[a] for a in axes) - n.attrs.get("ddof", 0)
    return w.node("Div", [total, w.const(np.asarray(count, n.out.type.dtype.np))], out)


def _rmsnorm(w, n, xs, out):
    ax = n.attrs["axis"]
    sq = w.node("Mul", [xs[0], xs[0]])
    ms = w.reduce("ReduceMean", sq, [ax], 1, n.out.type.dtype)
    eps = w.const(np.asarray(n.attrs["eps"], n.out.type.dtype.np))
    root = w.node("Sqrt", [w.node("Add", [ms, eps])])
    return w.node("Mul", [xs[0], w.node("Reciprocal", [root])], out)


def _attention(w, n, xs, out):
    q, k, v, mask = xs
    tq, tk = n.inputs[0].type, n.inputs[1].type
    perm = list(range(tk.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    scores = w.node("MatMul", [q, w.node("Transpose", [k], perm=perm)])
    scale = n.attrs["scale"] if n.attrs["scale"] is not None else 1 / math.sqrt(tq.shape[-1])
    d = n.out.type.dtype.np
    scores = w.node("Add", [w.node("Mul", [scores, w.const(np.asarray(scale, d))]), mask])
    if n.attrs["causal"]:
        sq, sk = tq.shape[-2], tk.shape[-2]
        keep = np.tril(np.ones((sq, sk), bool), k=sk - sq)
        scores = w.node("Add", [scores, w.const(np.where(keep, 0, -np.inf).astype(d))])
    # a query that sees no key (its scores all -inf) gets 0, as op.attention's, not NaN
    dead = w.node("Equal", [w.reduce("ReduceMax", scores, [tq.rank - 1], 1, n.out.type.dtype),
                            w.const(np.asarray(-np.inf, d))])
    probs = w.node("Where", [dead, w.const(np.asarray(0, d)),
                             w.node("Softmax", [scores], axis=-1)])
    return w.node("MatMul", [probs, v], out)


def _cast(w, n, xs, out):
    if "float8" in n.attrs["dtype"]:       # tessera's cast to fp8 rounds, ONNX's saturates
        return w.node("Cast", xs, out, to=_ONNX_DTYPE[n.attrs["dtype"]], saturate=0)
    return w.node("Cast", xs, out, to=_ONNX_DTYPE[n.attrs["dtype"]])


def _gelu(w, n, xs, out):
    d = n.out.type.dtype.np
    if n.attrs.get("approximate", "none") == "tanh":
        c = w.const(np.asarray(math.sqrt(2 / math.pi), d))
        cube = w.node("Mul", [w.node("Mul", [xs[0], xs[0]]), xs[0]])
        inner = w.node("Add", [xs[0], w.node("Mul", [cube, w.const(np.asarray(0.044715, d))])])
        t = w.node("Tanh", [w.node("Mul", [inner, c])])
    else:
        t = w.node("Erf", [w.node("Div", [xs[0], w.const(np.asarray(math.sqrt(2), d))])])
    one_plus = w.node("Add", [t, w.const(np.asarray(1, d))])
    return w.node("Mul", [w.node("Mul", [xs[0], w.const(np.asarray(0.5, d))]), one_plus], out)


def _flat_pads(pairs) -> list:
    """(before, after) pairs as ONNX's pads: every begin, then every end."""
    return [p[0] for p in pairs] + [p[1] for p in pairs]


def _e_conv(w, n, xs, out):
    a = n.attrs
    kind = "ConvTranspose" if n.op == "conv_transpose" else "Conv"
    extra = {"output_padding": list(a["output_padding"])} if kind == "ConvTranspose" else {}
    return w.node(kind, xs, out, strides=list(a["stride"]), pads=_flat_pads(a["padding"]),
                  dilations=list(a["dilation"]), group=a["groups"], **extra)


def _e_pool(w, n, xs, out):
    a = n.attrs
    common = dict(kernel_shape=list(a["kernel"]), strides=list(a["stride"]),
                  pads=_flat_pads(a["padding"]), ceil_mode=int(a["ceil_mode"]))
    if any(d != 1 for d in a["dilation"]):
        if n.op == "avg_pool" and w.opset < 19:
            raise ArgumentError(f"ONNX's AveragePool takes dilations from opset 19; this "
                                f"export writes opset {w.opset}", hint="opset_version=19")
        common["dilations"] = list(a["dilation"])
    if n.op == "max_pool":
        return w.node("MaxPool", xs, out, **common)
    return w.node("AveragePool", xs, out, count_include_pad=int(a["count_include_pad"]),
                  **common)


def _e_pad(w, n, xs, out):
    """ONNX's Pad (opset 11 on): pads and the constant as inputs; wrap is circular."""
    a = n.attrs
    mode = {"circular": "wrap"}.get(a["mode"], a["mode"])
    ins = [xs[0], w.ints(_flat_pads(a["pads"]))]
    if mode == "constant":
        ins.append(w.const(np.asarray(a["value"], n.out.type.dtype.np)))
    return w.node("Pad", ins, out, mode=mode)


def _bitwise(kind, logical):
    """A bitwise operator: ONNX's Bitwise* (opset 18 on), or And/Or/Xor/Not on bools."""
    def write(w, n, xs, out):
        if n.out.type.dtype.is_bool:
            return w.node(logical, xs, out)
        if w.opset < 18:
            raise TesseraError(
                f"{n.op} on integers needs ONNX opset 18 or later (Bitwise{kind})",
                received=f"opset_version={w.opset}", hint="export with opset_version=18 or later")
        return w.node("Bitwise" + kind, xs, out)
    return write


def _shift(w, n, xs, out):
    if not n.out.type.dtype.is_unsigned:
        raise TesseraError(
            f"ONNX's BitShift takes unsigned integers; {n.op} here shifts "
            f"{n.out.type.dtype.name}", hint="cast to the unsigned dtype of the same width first")
    return w.node("BitShift", xs, out, direction="LEFT" if n.op == "left_shift" else "RIGHT")


EXPORT = {
    **{name: _unary(kind) for name, kind in [
        ("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"), ("pow", "Pow"),
        ("neg", "Neg"), ("abs", "Abs"), ("exp", "Exp"), ("log", "Log"), ("sqrt", "Sqrt"),
        ("sin", "Sin"), ("cos", "Cos"), ("tanh", "Tanh"), ("erf", "Erf"), ("relu", "Relu"),
        ("sigmoid", "Sigmoid"), ("floor", "Floor"), ("ceil", "Ceil"), ("round", "Round"),
        ("sign", "Sign"), ("where", "Where"),
        ("eq", "Equal"), ("lt", "Less"), ("le", "LessOrEqual"), ("gt", "Greater"),
        ("ge", "GreaterOrEqual"), ("matmul", "MatMul"),
        ("matmul_integer", "MatMulInteger")]},
    # ONNX's Max and Min take no bools: theirs are Or and And
    "maximum": lambda w, n, xs, out: w.node("Or" if n.out.type.dtype.is_bool else "Max", xs,
                                            out),
    "minimum": lambda w, n, xs, out: w.node("And" if n.out.type.dtype.is_bool else "Min", xs,
                                            out),
    "ne": lambda w, n, xs, out: w.node("Not", [w.node("Equal", xs)], out),
    "bitwise_and": _bitwise("And", "And"), "bitwise_or": _bitwise("Or", "Or"),
    "bitwise_xor": _bitwise("Xor", "Xor"), "bitwise_not": _bitwise("Not", "Not"),
    "left_shift": _shift, "right_shift": _shift,
    "rsqrt": lambda w, n, xs, out: w.node("Reciprocal", [w.node("Sqrt", xs)], out),
    "silu": lambda w, n, xs, out: w.node("Mul", [xs[0], w.node("Sigmoid", xs)], out),
    "gelu": _gelu,
    "cast": _cast,
    "transpose": lambda w, n, xs, out: w.node("Transpose", xs, out, perm=list(n.attrs["perm"])),
    "reshape": lambda w, n, xs, out: w.node("Reshape", [xs[0], w.ints(n.out.type.shape)], out),
    "broadcast_to": lambda w, n, xs, out: w.node("Expand", [xs[0], w.ints(n.out.type.shape)],
                                                 out),
    "expand_dims": lambda w, n, xs, out: w.node("Unsqueeze", [xs[0], w.ints([n.attrs["axis"]])],
                                                out),
    "squeeze": lambda w, n, xs, out: w.node("Reshape", [xs[0], w.ints(n.out.type.shape)], out),
    "slice": _slice,
    "concat": lambda w, n, xs, out: w.node("Concat", xs, out, axis=n.attrs["axis"]),
    "take": lambda w, n, xs, out: w.node("Gather", xs, out, axis=n.attrs["axis"]),
    "sum": _reduce("ReduceSum"), "prod": _reduce("ReduceProd"),
    "mean": _reduce("ReduceMean"), "max": _reduce("ReduceMax"),
    "min": _reduce("ReduceMin"), "logsumexp": _reduce("ReduceLogSumExp"),
    "var": _var,
    "argmax": lambda w, n, xs, out: _arg("ArgMax", w, n, xs, out),
    "argmin": lambda w, n, xs, out: _arg("ArgMin", w, n, xs, out),
    "cumsum": lambda w, n, xs, out: w.node("CumSum", [xs[0], w.const(
        np.asarray(n.attrs["axis"], np.int64))], out),
    "softmax": lambda w, n, xs, out: w.node("Softmax", xs, out, axis=n.attrs["axis"]),
    "log_softmax": lambda w, n, xs, out: w.node("LogSoftmax", xs, out, axis=n.attrs["axis"]),
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "attention": _attention,
    "conv": _e_conv,
    "conv_transpose": _e_conv,
    "max_pool": _e_pool,
    "avg_pool": _e_pool,
    "pad": _e_pad,
}


def _arg(kind, w, n, xs, out):
    if n.attrs["axis"] is None:          # over the flattened tensor, as NumPy's argmax
        flat = w.node("Reshape", [xs[0], w.ints([-1])])
        return w.node(kind, [flat], out, axis=0, keepdims=0)
    return w.node(kind, xs, out, axis=n.attrs["axis"], keepdims=int(n.attrs["keepdim"]))


def export(fn, path, *example, opset_version: int = OPSET, **kwargs):
    """Write ``fn`` traced on the example arguments as an ONNX model at ``path`` (a str or
    path; None: only return it); returns the ModelProto."""
    onnx = _onnx()
    f = fn if isinstance(fn, Function) else Function(fn)
    if not OPSET <= opset_version <= NEWEST_EXPORTED_OPSET:
        raise ArgumentError(f"tessera writes ONNX opsets {OPSET} to {NEWEST_EXPORTED_OPSET} "
                            f"(each by its own spelling), not {opset_version}")
    g = f.lower(*example, **kwargs).graph_ir
    missing = sorted({n.op for n in g.nodes if n.op != "const" and n.op not in EXPORT})
    if missing:
        raise TesseraError(f"{f.name} uses {len(missing)} operator(s) with no ONNX form yet: "
                           + ", ".join(missing),
                           hint="each needs an entry in tessera/onnx.py's EXPORT table")
    names = {p.id: p.param_name for p in g.params}
    w = _Writer(onnx, names, opset_version)
    for i, o in enumerate(g.outputs):
        names.setdefault(o.id, f"output_{i}")
    out_names = [f"output_{i}" for i in range(len(g.outputs))]
    value = {p.id: p.param_name for p in g.params}
    for n in g.nodes:
        if n.op == "const":
            value[n.out.id] = w.const(np.asarray(n.attrs["value"], n.out.type.dtype.np))
            continue
        xs = [value[v.id] for v in n.inputs]
        value[n.out.id] = EXPORT[n.op](w, n, xs, None)
    for o, name in zip(g.outputs, out_names):         # outputs under their own names
        w.node("Identity", [value[o.id]], name)

    def info(name, t):
        return onnx.helper.make_tensor_value_info(name, _ONNX_DTYPE[t.dtype.name],
                                                  list(t.shape))
    graph = onnx.helper.make_graph(
        w.nodes, f.name.replace("<", "").replace(">", "") or "tessera",
        [info(p.param_name, p.type) for p in g.params],
        [info(name, o.type) for o, name in zip(g.outputs, out_names)], w.inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(
        "", opset_version)], producer_name="tessera")
    onnx.checker.check_model(model, full_check=True)
    if path is not None:
        onnx.save(model, str(path))
    return model


extensions.register_exporter("onnx", export)      # Function.export(format="onnx")


# ---- import ------------------------------------------------------------------------------------
def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            from onnx import helper
            return helper.get_attribute_value(a)
    return default


def _ints(value):
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _i_reduce(kind):
    def read(node, xs):
        axes = _attr(node, "axes")
        if axes is None and len(xs) > 1 and xs[1] is not None:
            axes = _ints(xs[1])
        if not axes and _attr(node, "noop_with_empty_axes", 0):
            return xs[0]
        keep = bool(_attr(node, "keepdims", 1))
        rank = len(xs[0].shape)
        axes = sorted(a % rank for a in axes) if axes else list(range(rank))
        if kind in ("max", "min", "logsumexp") and any(xs[0].shape[a] == 0 for a in axes):
            return _empty_reduction(kind, xs[0], axes, keep)
        if kind == "logsumexp":             # one axis: the reduced ones moved last, merged
            return _logsumexp(xs[0], axes, keep)
        y = getattr(op, kind)(xs[0], axis=axes if len(axes) > 1 else axes[0], keepdim=keep)
        return _as_dtype(y, xs[0]) if kind in ("sum", "prod") else y    # (ONNX keeps int32)
    return read


def _empty_reduction(kind, x, axes, keep):
    """ONNX's value of a max, min or log-sum-exp over no element (tessera's, as NumPy's,
    raise): -inf (max, logsumexp) or +inf, an integer dtype's least or greatest value, False
    or True."""
    d = dtype_of(x)
    lo, hi = (-np.inf, np.inf) if d.is_float else d.int_range
    shape = [1 if k in axes else n for k, n in enumerate(x.shape)] if keep else \
        [n for k, n in enumerate(x.shape) if k not in axes]
    return np.full(shape, hi if kind == "min" else lo, dtype=d.np)


def _logsumexp(x, axes, keep):
    shape = list(x.shape)
    rest = [k for k in range(len(shape)) if k not in axes]
    moved = op.transpose(x, perm=rest + axes) if rest + axes != list(range(len(shape))) else x
    flat = op.reshape(moved, shape=[shape[k] for k in rest] + [-1])
    y = op.logsumexp(flat, axis=-1)
    out = [1 if k in axes else shape[k] for k in range(len(shape))] if keep else \
        [shape[k] for k in rest]
    return op.reshape(y, shape=out)


def _i_cumulative(kind):
    """CumSum and CumProd: reverse by flipping the axis, exclusive by shifting the running
    values one place (the identity first)."""
    def read(node, xs):
        x, axis = xs[0], int(np.asarray(xs[1]))
        rank = len(x.shape)
        axis %= rank
        flip = dict(starts=[None] * rank, stops=[None] * rank,
                    steps=[-1 if k == axis else 1 for k in range(rank)])
        if _attr(node, "reverse", 0):
            x = op.slice(x, **flip)
        y = getattr(op, kind)(x, axis=axis)
        if _attr(node, "exclusive", 0):
            one = [1 if k == axis else s for k, s in enumerate(x.shape)]
            first = op.broadcast_to(op.cast(np.asarray(int(kind == "cumprod")), y.dtype.name),
                                    shape=one)
            y = op.concat([first, op.slice(y, starts=[None] * rank, steps=[1] * rank,
                                           stops=[-1 if k == axis else None
                                                  for k in range(rank)])], axis=axis)
        if _attr(node, "reverse", 0):
            y = op.slice(y, **flip)
        return _as_dtype(y, xs[0])         # (ONNX keeps an int32 sum or product int32)
    return read


def _i_arg(f, node, xs):
    """argmax/argmin; select_last_index: of the axis reversed, counted back from the end."""
    x, axis = xs[0], _attr(node, "axis", 0)
    keep = bool(_attr(node, "keepdims", 1))
    if not _attr(node, "select_last_index", 0):
        return f(x, axis=axis, keepdim=keep)
    rank = len(x.shape)
    rev = [-1 if k == axis % rank else 1 for k in range(rank)]
    i = f(op.slice(x, starts=[None] * rank, stops=[None] * rank, steps=rev), axis=axis,
          keepdim=keep)
    return (x.shape[axis] - 1) - i


def _i_div(node, xs):
    a, b = xs                              # integers: truncated towards zero, as C
    return op.trunc_divide(a, b) if dtype_of(a).is_int else op.div(a, b)


def _i_slice(node, xs):
    x = xs[0]
    rank = len(x.shape)
    starts, ends = _ints(xs[1]), _ints(xs[2])
    axes = _ints(xs[3]) if len(xs) > 3 and xs[3] is not None else list(range(len(starts)))
    steps = _ints(xs[4]) if len(xs) > 4 and xs[4] is not None else [1] * len(starts)
    a, b, s = [None] * rank, [None] * rank, [1] * rank
    for ax, st, en, sp in zip(axes, starts, ends, steps):
        n = x.shape[ax % rank]
        a[ax % rank] = max(min(st, n), -n - 1) if abs(st) < 2 ** 62 else None
        b[ax % rank] = None if abs(en) >= 2 ** 62 or (sp > 0 and en >= n) else en
        s[ax % rank] = sp
    return op.slice(x, starts=a, stops=b, steps=s)


def _trailing(node, x):
    """(the axis a normalisation starts at, x with the axes from there on merged into one,
    a function giving a merged result x's shape back)."""
    shape = tuple(x.shape)
    axis = _attr(node, "axis", -1) % len(shape)
    if axis == len(shape) - 1:
        return axis, x, lambda y: y
    return (axis, op.reshape(x, shape=[math.prod(shape[:axis]), -1]),
            lambda y: op.reshape(y, shape=list(shape)))


def _i_layernorm(node, xs):
    """Normalised over the axes from `axis` on (as one, reshaped); (Y, Mean, InvStdDev)."""
    x = xs[0]
    shape = tuple(x.shape)
    eps = _attr(node, "epsilon", 1e-5)
    axis, flat, back = _trailing(node, x)
    y = back(op.layernorm(flat, eps=eps, axis=-1))
    if len(xs) > 1 and xs[1] is not None:
        y = y * xs[1]
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2]
    kept = list(shape[:axis]) + [1] * (len(shape) - axis)
    mean = op.mean(flat, axis=-1, keepdim=True)
    var = op.mean((flat - mean) ** 2, axis=-1, keepdim=True)
    return (y, op.reshape(mean, shape=kept), op.reshape(op.rsqrt(var + eps), shape=kept))


# ---- the convolution family ----------------------------------------------------------------------
def _window_pads(node, x, kernel, strides, dilations):
    """ONNX's pads [begin..., end...] or auto_pad as (before, after) pairs per spatial axis."""
    n = len(kernel)
    auto = _attr(node, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pairs = []
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            pairs.append([small, big] if auto == "SAME_UPPER" else [big, small])
        return pairs
    if auto == "VALID":
        return [[0, 0]] * n
    pads = list(_attr(node, "pads", [0] * (2 * n)))
    return [[pads[k], pads[n + k]] for k in range(n)]


def _window_attrs(node, x, kernel):
    n = len(kernel)
    strides = list(_attr(node, "strides", [1] * n))
    dilations = list(_attr(node, "dilations", [1] * n))
    return strides, dilations, _window_pads(node, x, kernel, strides, dilations)


def _conv_attrs(node, x, w) -> dict:
    """A Conv-like node's window as op.conv's keywords."""
    kernel = list(_attr(node, "kernel_shape", w.shape[2:]))
    strides, dilations, pads = _window_attrs(node, x, kernel)
    return {"stride": strides, "padding": pads, "dilation": dilations,
            "groups": _attr(node, "group", 1)}


def _i_conv(node, xs):
    return op.conv(xs[0], xs[1], xs[2] if len(xs) > 2 else None,
                   **_conv_attrs(node, xs[0], xs[1]))


def _i_conv_integer(node, xs):
    return op.conv_integer(*(list(xs) + [None, None])[:4], **_conv_attrs(node, xs[0], xs[1]))


def _i_qlinear_conv(node, xs):
    ys = list(xs) + [None] * (9 - len(xs))
    return op.qlinear_conv(*ys[:8], bias=ys[8], **_conv_attrs(node, xs[0], xs[3]))


def _quant_dtype(node):
    """A (de)quantizing node's output_dtype attribute, or None (its inputs decide)."""
    code = _attr(node, "output_dtype", 0)
    return _tessera_dtype(code, node) if code else None


def _i_quantize(node, xs):
    x, scale = xs[0], xs[1]
    zp = xs[2] if len(xs) > 2 else None
    precision = _attr(node, "precision", 0)
    if precision:
        p = _tessera_dtype(precision, node)
        x, scale = op.cast(x, p), op.cast(scale, p)
    return op.quantize_linear(x, scale, zp, axis=_attr(node, "axis", 1),
                              block_size=_attr(node, "block_size", 0),
                              dtype=_quant_dtype(node),
                              saturate=bool(_attr(node, "saturate", 1)))


def _i_dequantize(node, xs):
    return op.dequantize_linear(xs[0], xs[1], xs[2] if len(xs) > 2 else None,
                                axis=_attr(node, "axis", 1),
                                block_size=_attr(node, "block_size", 0),
                                dtype=_quant_dtype(node))


def _i_conv_transpose(node, xs):
    """ONNX's ConvTranspose: output_shape, when given, sets the pads (SAME_UPPER's split of
    the total unless auto_pad is SAME_LOWER)."""
    y, w = xs[0], xs[1]
    kernel = list(_attr(node, "kernel_shape", w.shape[2:]))
    n = len(kernel)
    strides = list(_attr(node, "strides", [1] * n))
    dilations = list(_attr(node, "dilations", [1] * n))
    extra = list(_attr(node, "output_padding", [0] * n))
    auto = _attr(node, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    shape = _attr(node, "output_shape")
    if shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        want = list(shape)[-n:] if shape is not None else \
            [size * s for size, s in zip(y.shape[2:], strides)]
        pads = []
        for i, (size, k, s, d, m) in enumerate(zip(y.shape[2:], kernel, strides, dilations,
                                                   want)):
            total = s * (size - 1) + extra[i] + ((k - 1) * d + 1) - m
            small, big = total // 2, total - total // 2      # (floor division, as ONNX's)
            lo, hi = (small, big) if auto == "SAME_UPPER" else (big, small)
            if hi < 0:                   # an output longer than the padding-free one
                extra[i], hi = extra[i] - hi, 0
            pads.append([lo, hi])
    elif auto == "VALID":
        pads = [[0, 0]] * n
    else:
        flat = list(_attr(node, "pads", [0] * (2 * n)))
        pads = [[flat[k], flat[n + k]] for k in range(n)]
    bias = xs[2] if len(xs) > 2 else None
    return op.conv_transpose(y, w, bias, stride=strides, padding=pads, output_padding=extra,
                             dilation=dilations, groups=_attr(node, "group", 1))


def _i_pool(kind):
    def read(node, xs):
        x = xs[0]
        kernel = list(_attr(node, "kernel_shape"))
        strides, dilations, pads = _window_attrs(node, x, kernel)
        attrs = {"kernel": kernel, "stride": strides, "padding": pads,
                 "ceil_mode": bool(_attr(node, "ceil_mode", 0))}
        if kind == "max":
            y = op.max_pool(x, dilation=dilations, **attrs)
            if len(node.output) < 2 or not node.output[1]:
                return y
            # ONNX counts over the whole tensor, PyTorch (max_pool_indices) within the plane;
            # storage_order=1: the plane's position in column-major order
            N, C, *sizes = x.shape
            plane = math.prod(sizes)
            base = (np.arange(N * C, dtype=np.int64) * plane).reshape([N, C] + [1] * len(sizes))
            i = op.max_pool_indices(x, dilation=dilations, **attrs)
            if _attr(node, "storage_order", 0):
                rest, i_col = i, 0
                for k in reversed(range(len(sizes))):
                    coord, rest = rest % sizes[k], rest // sizes[k]
                    i_col = i_col + coord * math.prod(sizes[:k])
                i = i_col
            return y, i + base
        return op.avg_pool(x, count_include_pad=bool(_attr(node, "count_include_pad", 0)),
                           dilation=dilations, **attrs)
    return read


def _i_lp_pool(node, xs):
    """LpPool: the sum of |x|^p over each window (the padding's zeros in it) to the power
    1/p, as a mean over the padded window times its size."""
    p = float(_attr(node, "p", 2))
    x = xs[0]
    kernel = list(_attr(node, "kernel_shape"))
    strides, dilations, pads = _window_attrs(node, x, kernel)
    mean = op.avg_pool(op.abs(x) ** p, kernel=kernel, stride=strides, padding=pads,
                       dilation=dilations, ceil_mode=bool(_attr(node, "ceil_mode", 0)),
                       count_include_pad=True)
    return (mean * float(math.prod(kernel))) ** (1.0 / p)


def _i_lp_normalization(node, xs):
    """x / its Lp norm along axis (p 1 or 2; a zero norm gives 0)."""
    x, p, axis = xs[0], _attr(node, "p", 2), _attr(node, "axis", -1)
    if p not in (1, 2):
        raise TesseraError(f"LpNormalization node {node.name!r}: p must be 1 or 2, not {p}")
    n = op.sum(op.abs(x), axis=axis, keepdim=True) if p == 1 else \
        op.sqrt(op.sum(x * x, axis=axis, keepdim=True))
    return op.where(n == 0, 0.0, x / op.where(n == 0, 1.0, n))


def _i_rotary_embedding(node, xs):
    """RotaryEmbedding (opset 23): x [B, H, S, D] or [B, S, H*D] (num_heads), the first
    rotary_embedding_dim features of each head rotated by cos/sin caches [B, S, r/2] or, with
    position_ids [B, S], rows of [max_position, r/2]; halves (or, interleaved, even and odd
    features) are the pairs."""
    x, cos, sin = xs[0], xs[1], xs[2]
    ids = xs[3] if len(xs) > 3 else None
    shape = list(x.shape)
    if len(shape) == 4:
        v = op.transpose(x, perm=[0, 2, 1, 3])                  # [B, S, H, D]
    else:
        heads = _attr(node, "num_heads", 0)
        if not heads:
            raise TesseraError(f"RotaryEmbedding node {node.name!r}: a 3-D input needs "
                               "num_heads")
        v = op.reshape(x, [shape[0], shape[1], heads, shape[2] // heads])
    d = v.shape[3]
    r = _attr(node, "rotary_embedding_dim", 0) or d
    if ids is not None:
        cos, sin = op.take(cos, ids, axis=0), op.take(sin, ids, axis=0)
    cos, sin = op.expand_dims(cos, axis=2), op.expand_dims(sin, axis=2)
    turn, keep = v[:, :, :, :r], v[:, :, :, r:]
    if _attr(node, "interleaved", 0):
        x1, x2 = turn[:, :, :, 0::2], turn[:, :, :, 1::2]
    else:
        x1, x2 = turn[:, :, :, :r // 2], turn[:, :, :, r // 2:]
    re, im = cos * x1 - sin * x2, sin * x1 + cos * x2
    if _attr(node, "interleaved", 0):
        turned = op.reshape(op.concat([op.expand_dims(re, axis=-1), op.expand_dims(im, axis=-1)],
                                      axis=-1), list(turn.shape))
    else:
        turned = op.concat([re, im], axis=-1)
    out = op.concat([turned, keep], axis=-1) if r < d else turned
    return op.transpose(out, perm=[0, 2, 1, 3]) if len(shape) == 4 else op.reshape(out, shape)


def _i_center_crop_pad(node, xs):
    """CenterCropPad: each named axis cropped or zero-padded to its size around the centre
    (the odd element at the end), one constant pad (negative pads crop)."""
    x, sizes = xs[0], _ints(xs[1])
    rank = len(x.shape)
    axes = [a % rank for a in (_attr(node, "axes") or range(rank))]
    pads = [[0, 0] for _ in range(rank)]
    for a, want in zip(axes, sizes):
        d = abs(want - x.shape[a])
        sign = 1 if want > x.shape[a] else -1
        pads[a] = [sign * (d // 2), sign * (d - d // 2)]
    return op.pad(x, pads) if any(any(p) for p in pads) else x


def _i_reverse_sequence(node, xs):
    """ReverseSequence: along time_axis, each batch row's first sequence_lens[b] elements
    reversed, the rest in place (a take_along_axis of computed positions)."""
    x, lens = xs[0], op.cast(xs[1], "int64")
    b_ax, t_ax = _attr(node, "batch_axis", 1), _attr(node, "time_axis", 0)
    rank, T = len(x.shape), x.shape[t_ax]
    t = np.arange(T, dtype=np.int64).reshape([-1 if k == t_ax else 1 for k in range(rank)])
    n = op.reshape(lens, [-1 if k == b_ax else 1 for k in range(rank)])
    where = op.where(t < n, n - 1 - t, t)
    return op.take_along_axis(x, op.broadcast_to(where, list(x.shape)), axis=t_ax)


def _i_pad(node, xs):
    """Pad: pads (and the constant) as inputs from opset 11, attributes before; axes from 18."""
    x = xs[0]
    rank = len(x.shape)
    mode = _attr(node, "mode", b"constant")
    mode = {"wrap": "circular"}.get(mode.decode() if isinstance(mode, bytes) else mode,
                                     mode.decode() if isinstance(mode, bytes) else mode)
    if len(xs) > 1 and xs[1] is not None:
        flat = _ints(xs[1])
        value = float(np.asarray(xs[2]).reshape(-1)[0]) if len(xs) > 2 and xs[2] is not None \
            else 0.0
    else:
        flat = list(_attr(node, "pads"))
        value = float(_attr(node, "value", 0.0))
    axes = [a % rank for a in _ints(xs[3])] if len(xs) > 3 and xs[3] is not None \
        else list(range(rank))
    k = len(axes)
    pads = [[0, 0] for _ in range(rank)]
    for j, a in enumerate(axes):
        pads[a] = [flat[j], flat[k + j]]
    return op.pad(x, pads, mode=mode, value=value)


def _text(node, name, default):
    v = _attr(node, name, default)
    return v.decode() if isinstance(v, bytes) else v


def _i_resize(node, xs):
    """Resize (opsets 10-19): scales or sizes as inputs (roi only for tf_crop_and_resize,
    which is not imported), over ``axes`` (opset 18) or every axis."""
    x = xs[0]
    rank = len(x.shape)
    axes = [a % rank for a in _attr(node, "axes", range(rank))]
    coords = _text(node, "coordinate_transformation_mode", "half_pixel")
    roi = None
    if coords == "tf_crop_and_resize":
        flat = [float(v) for v in np.asarray(xs[1]).reshape(-1)]
        k = len(flat) // 2
        roi_axes = axes if k == len(axes) else list(range(rank))
        roi = {a: (flat[j], flat[k + j]) for j, a in enumerate(roi_axes)}
    policy = _text(node, "keep_aspect_ratio_policy", "stretch")
    scales = xs[2] if len(xs) > 2 and xs[2] is not None and np.asarray(xs[2]).size else None
    sizes = xs[3] if len(xs) > 3 and xs[3] is not None else None
    if len(node.input) == 2:                     # opset 10: (X, scales)
        scales = xs[1]
    mode = _text(node, "mode", "nearest")
    kw = dict(mode=mode, coordinate_transformation_mode=coords,
              nearest_mode=_text(node, "nearest_mode", "round_prefer_floor"),
              cubic_coeff_a=float(_attr(node, "cubic_coeff_a", -0.75)),
              exclude_outside=bool(_attr(node, "exclude_outside", 0)),
              antialias=bool(_attr(node, "antialias", 0)),
              **({"roi": roi, "extrapolation_value": float(_attr(node, "extrapolation_value",
                                                                 0.0))} if roi else {}))
    if sizes is not None:
        sizes = _ints(sizes)
        if policy != "stretch":          # one scale for every axis: the smaller or larger
            pick = min if policy == "not_larger" else max
            scale = pick(m / x.shape[a] for a, m in zip(axes, sizes))
            sizes = [int(np.floor(scale * x.shape[a] + 0.5)) for a in axes]
        return op.resize(x, size=sizes, axes=axes, **kw)
    factors = [float(v) for v in np.asarray(scales).reshape(-1)]
    keep = [(a, f) for a, f in zip(axes, factors) if f != 1.0]
    if roi:                              # a region of interest resizes even at scale 1
        keep = [(a, f) for a, f in zip(axes, factors) if f != 1.0 or roi[a] != (0.0, 1.0)]
    if not keep:
        return x
    return op.resize(x, scale=[f for _, f in keep], axes=[a for a, _ in keep], **kw)


def _i_upsample(node, xs):
    """Upsample (deprecated): scales as an attribute (opset 7) or input (9); asymmetric
    coordinates, nearest with floor."""
    x = xs[0]
    scales = _attr(node, "scales") if len(xs) < 2 else [float(v) for v in
                                                        np.asarray(xs[1]).reshape(-1)]
    mode = _text(node, "mode", "nearest")
    keep = [(a, float(f)) for a, f in enumerate(scales) if float(f) != 1.0]
    if not keep:
        return x
    return op.resize(x, scale=[f for _, f in keep], axes=[a for a, _ in keep],
                     mode="linear" if mode in ("linear", "bilinear") else "nearest",
                     coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def _i_group_norm(node, xs):
    """GroupNormalization: scale and bias per group in opset 18, per channel from 21."""
    x, scale, bias = xs
    groups = _attr(node, "num_groups")
    C = x.shape[1]
    if scale.shape[0] != C:                      # opset 18: one per group
        scale = op.reshape(op.broadcast_to(op.reshape(scale, (groups, 1)), (groups, C // groups)),
                           (C,))
        bias = op.reshape(op.broadcast_to(op.reshape(bias, (groups, 1)), (groups, C // groups)),
                          (C,))
    return op.group_norm(x, groups, scale, bias, eps=_attr(node, "epsilon", 1e-5))


IMPORT = {
    **{kind: (lambda name: lambda node, xs: getattr(op, name)(*xs))(name) for kind, name in [
        ("Add", "add"), ("Sub", "sub"), ("Mul", "mul"),
        ("Neg", "neg"), ("Abs", "abs"), ("Exp", "exp"), ("Log", "log"), ("Sqrt", "sqrt"),
        ("Sin", "sin"), ("Cos", "cos"), ("Tanh", "tanh"), ("Erf", "erf"), ("Relu", "relu"),
        ("Sigmoid", "sigmoid"), ("Floor", "floor"), ("Ceil", "ceil"), ("Round", "round"),
        ("Sign", "sign"), ("Where", "where"), ("Equal", "eq"), ("Less", "lt"),
        ("LessOrEqual", "le"), ("Greater", "gt"), ("GreaterOrEqual", "ge"),
        ("MatMul", "matmul")]},
    # ONNX's Pow keeps the base's type whatever the exponent's (NumPy would promote)
    "Pow": lambda node, xs: op.pow(xs[0], _as_dtype(xs[1], xs[0])),
    "Div": _i_div,
    "Max": lambda node, xs: _fold(op.maximum, xs),
    "Min": lambda node, xs: _fold(op.minimum, xs),
    "Sum": lambda node, xs: _fold(op.add, xs),
    "Not": lambda node, xs: op.logical_not(xs[0]),
    "Reciprocal": lambda node, xs: op.div(1.0, xs[0]),
    "Identity": lambda node, xs: xs[0],
    # to fp8, ONNX saturates unless told not to (saturate=0)
    "Cast": lambda node, xs: op.cast(xs[0], _tessera_dtype(_attr(node, "to"), node),
                                     saturate=bool(_attr(node, "saturate", 1)) and
                                     "float8" in _tessera_dtype(_attr(node, "to"), node)),
    "Transpose": lambda node, xs: op.transpose(
        xs[0], perm=list(_attr(node, "perm", range(len(xs[0].shape))[::-1]))),
    "Reshape": lambda node, xs: op.reshape(xs[0], shape=_reshape_target(
        xs[0], _ints(xs[1]), _attr(node, "allowzero", 0))),
    "Expand": lambda node, xs: op.broadcast_to(xs[0], shape=list(np.broadcast_shapes(
        tuple(xs[0].shape), tuple(_ints(xs[1]))))),
    "Unsqueeze": lambda node, xs: _unsqueeze(xs[0], _ints(xs[1])),
    "Squeeze": lambda node, xs: _squeeze(xs[0], xs[1] if len(xs) > 1 else None),
    "Slice": _i_slice,
    "Concat": lambda node, xs: op.concat(list(xs), axis=_attr(node, "axis")),
    "Gather": lambda node, xs: op.take(xs[0], xs[1], axis=_attr(node, "axis", 0)),
    "ReduceSum": _i_reduce("sum"), "ReduceMean": _i_reduce("mean"),
    "ReduceMax": _i_reduce("max"), "ReduceMin": _i_reduce("min"),
    "ReduceLogSumExp": _i_reduce("logsumexp"), "ReduceProd": _i_reduce("prod"),
    "ArgMax": lambda node, xs: _i_arg(op.argmax, node, xs),
    "ArgMin": lambda node, xs: _i_arg(op.argmin, node, xs),
    "CumSum": _i_cumulative("cumsum"),
    "Softmax": lambda node, xs: op.softmax(xs[0], axis=_attr(node, "axis", -1)),
    "LogSoftmax": lambda node, xs: op.log_softmax(xs[0], axis=_attr(node, "axis", -1)),
    "LayerNormalization": _i_layernorm,
    "Gemm": lambda node, xs: _gemm(node, xs),
    "Conv": _i_conv,
    "ConvInteger": _i_conv_integer,
    "QLinearConv": _i_qlinear_conv,
    "QuantizeLinear": _i_quantize,
    "DequantizeLinear": _i_dequantize,
    "DynamicQuantizeLinear": lambda node, xs: op.dynamic_quantize_linear(xs[0]),
    "MatMulInteger": lambda node, xs: op.matmul_integer(*(list(xs) + [None, None])[:4]),
    "QLinearMatMul": lambda node, xs: op.qlinear_matmul(*xs),
    "ConvTranspose": _i_conv_transpose,
    "MaxPool": _i_pool("max"),
    "AveragePool": _i_pool("avg"),
    "LpPool": _i_lp_pool,
    "ReverseSequence": _i_reverse_sequence,
    "CenterCropPad": _i_center_crop_pad,
    "LpNormalization": _i_lp_normalization,
    "RotaryEmbedding": _i_rotary_embedding,
    "GlobalAveragePool": lambda node, xs: op.global_avg_pool(xs[0]),
    "GlobalMaxPool": lambda node, xs: op.global_max_pool(xs[0]),
    "Pad": _i_pad,
    "Resize": _i_resize,
    "Upsample": _i_upsample,
    "BatchNormalization": lambda node, xs: op.batch_norm(
        xs[0], xs[3], xs[4], xs[1], xs[2], eps=_attr(node, "epsilon", 1e-5)),
    "InstanceNormalization": lambda node, xs: op.instance_norm(
        xs[0], xs[1], xs[2], eps=_attr(node, "epsilon", 1e-5)),
    "GroupNormalization": _i_group_norm,
    "DepthToSpace": lambda node, xs: op.depth_to_space(xs[0], _attr(node, "blocksize"),
                                                       _text(node, "mode", "DCR")),
    "SpaceToDepth": lambda node, xs: op.space_to_depth(xs[0], _attr(node, "blocksize"),
                                                       _text(node, "mode", "DCR")),
}


def _as_dtype(x, like):
    d = dtype_of(like)
    return x if dtype_of(x) == d else op.cast(x, d.name)


def _fold(f, xs):
    out = xs[0]
    for x in xs[1:]:
        out = f(out, x)
    return out


def _reshape_target(x, shape, allowzero=0):
    """ONNX's 0 copies the input's size on that axis (unless allowzero: then it is 0)."""
    return [x.shape[k] if s == 0 and not allowzero else s for k, s in enumerate(shape)]


def _unsqueeze(x, axes):
    rank = len(x.shape) + len(axes)
    for a in sorted(a % rank for a in axes):
        x = op.expand_dims(x, axis=a)
    return x


def _squeeze(x, axes):
    """Without axes: every axis of size 1."""
    shape = list(x.shape)
    drop = [a % len(shape) for a in _ints(axes)] if axes is not None else \
        [k for k, d in enumerate(shape) if d == 1]
    return op.reshape(x, shape=[d for k, d in enumerate(shape) if k not in drop])


def _gemm(node, xs):
    a, b = xs[0], xs[1]
    if _attr(node, "transA", 0):
        a = op.transpose(a)
    if _attr(node, "transB", 0):
        b = op.transpose(b)
    y = op.matmul(a, b) * _attr(node, "alpha", 1.0)
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2] * _attr(node, "beta", 1.0)
    return y


def import_model(model):
    """A tessera Function of an ONNX model's graph inputs (a path, bytes or a ModelProto)."""
    onnx = _onnx()
    if isinstance(model, bytes):
        model = onnx.load_from_string(model)
    elif isinstance(model, str) or hasattr(model, "__fspath__"):
        model = onnx.load(str(model))
    graph = model.graph
    opset = _model_opset(model)
    missing = sorted({n.op_type + (f" (domain {n.domain})" if n.domain not in ("", "ai.onnx")
                                   else "")
                      for n in _all_nodes(graph) if n.op_type not in IMPORT or
                      n.domain not in ("", "ai.onnx")})
    if missing:
        raise TesseraError(f"the ONNX model uses {len(missing)} operator(s) tessera does not "
                           "import yet: " + ", ".join(missing),
                           hint="each needs an entry in tessera/onnx.py's IMPORT table")
    run = _GraphRunner(onnx, opset)
    run.check(graph)
    consts = run.constants(graph)
    inputs = [i.name for i in graph.input if i.name not in consts]
    params = [n if n.isidentifier() else f"x{k}" for k, n in enumerate(inputs)]
    static = {p for name, p in zip(inputs, params) if name in _shape_inputs(graph)}
    declared = {i.name: dt.get(_FROM_ONNX_DTYPE[i.type.tensor_type.elem_type]).np
                for i in graph.input if i.type.tensor_type.elem_type in _FROM_ONNX_DTYPE}

    def body(*args, **kw):
        bound = body.__signature__.bind(*args, **kw).arguments
        env = {name: np.asarray(bound[p], declared.get(name)) if p in static else bound[p]
               for name, p in zip(inputs, params)}          # (run adds the initializers)
        outs = run(graph, env)
        return outs[0] if len(outs) == 1 else tuple(outs)

    body.__signature__ = inspect.Signature(
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params])
    name = graph.name if graph.name.isidentifier() else "onnx_model"
    body.__name__ = body.__qualname__ = name
    return _Imported(body, name=name, static=static) if static else Function(body, name=name)


def _all_nodes(graph):
    """The graph's nodes and those of its subgraphs (If's branches, Loop's and Scan's
    bodies)."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == a.GRAPH:
                yield from _all_nodes(a.g)


class _GraphRunner:
    """Evaluates a graph's nodes in order over an environment of named values (a subgraph sees
    its enclosing graph's values), each node by its reader for the model's opset; If, Loop and
    Scan run their subgraphs through ts.cond, ts.while_loop and ts.scan."""

    def __init__(self, onnx, opset):
        self.onnx, self.opset, self.readers = onnx, opset, {}
        self._consts: dict = {}         # id(graph) -> its initializers as arrays, made once

    def constants(self, graph) -> dict:
        if id(graph) not in self._consts:
            self._consts[id(graph)] = {t.name: self.onnx.numpy_helper.to_array(t)
                                       for t in graph.initializer}
        return self._consts[id(graph)]

    def check(self, graph):
        for n in _all_nodes(graph):
            if n.op_type != "Constant" and n.op_type not in self.readers:
                self.readers[n.op_type] = _reader(n.op_type, self.opset)

    def __call__(self, graph, env):
        env = {**env, **self.constants(graph)}
        for node in graph.node:
            xs = [env[i] if i else None for i in node.input]
            if node.op_type == "Constant":
                env[node.output[0]] = _constant(self.onnx, node)
                continue
            if node.op_type in _CONTROL:
                out = _CONTROL[node.op_type](self, node, xs, env)
            else:
                out = self.readers[node.op_type](node, xs)
            for name, value in zip(node.output, out if isinstance(out, tuple) else (out,)):
                if name:
                    env[name] = value
        return [env[o.name] for o in graph.output]

    def subgraph(self, graph, env, *values):
        """The subgraph's outputs with its inputs bound to values (in order)."""
        inner = dict(env)
        inner.update({i.name: v for i, v in zip(graph.input, values)})
        return self(graph, inner)


def _one(values):
    return values[0] if len(values) == 1 else tuple(values)


def _if(run, node, xs, env):
    """If: the branch a constant condition picks, or ts.cond of both (the same structure)."""
    then, other = _attr(node, "then_branch"), _attr(node, "else_branch")
    pred = xs[0]
    if isinstance(pred, (np.ndarray, np.generic, bool)):
        return tuple(run.subgraph(then if bool(np.asarray(pred).reshape(-1)[0]) else other,
                                  env))
    out = ts_cond(op.reshape(pred, shape=[1]), lambda: _one(run.subgraph(then, env)),
                  lambda: _one(run.subgraph(other, env)))
    return out if isinstance(out, tuple) else (out,)


def _loop(run, node, xs, env):
    """Loop: body(i, cond, *carried) -> (cond, *carried, *scanned). Without scanned outputs,
    ts.while_loop while i < M and cond; with them, the trip count M must be fixed and the
    body's condition a constant true (their stacked length is then M): ts.scan over M steps."""
    body = _attr(node, "body")
    trips, cond, carried = xs[0], xs[1], list(xs[2:])
    n_scanned = len(body.output) - 1 - len(carried)
    if n_scanned:
        if trips is None or not isinstance(trips, np.ndarray):
            raise TesseraError("a Loop with scan outputs needs a constant trip count (its "
                               "outputs' length)")
        m = int(trips)
        if m <= _UNROLL_UP_TO:               # the counter a constant: it may slice, or shape
            vs, ys = list(carried), []
            for i in range(m):
                outs = run.subgraph(body, env, np.asarray(i, np.int64), np.asarray(True), *vs)
                _constant_true(outs[0])
                vs, y = list(outs[1:1 + len(vs)]), outs[1 + len(vs):]
                ys.append([op.expand_dims(t, axis=0) for t in y])
            stacked = [op.concat([y[j] for y in ys], axis=0) if m else None
                       for j in range(n_scanned)]
            if not m:
                raise TesseraError("a Loop with scan outputs and no iterations has outputs of "
                                   "no known shape: not imported")
            return (*vs, *stacked)

        def step(c, _):
            i, vs = c
            outs = run.subgraph(body, env, i, np.asarray(True), *vs)
            _constant_true(outs[0])
            return (i + 1, tuple(outs[1:1 + len(vs)])), tuple(outs[1 + len(vs):])
        (_, last), ys = ts_scan(step, (np.asarray(0, np.int64), tuple(carried)), length=m)
        return (*last, *ys)

    def keep_going(c):
        i, go = c[0], c[1]
        more = go if trips is None else op.minimum(i < trips, op.cast(go, "bool"))
        return op.reshape(op.cast(more, "bool"), shape=[1])

    def step(c):
        i, _, *vs = c
        outs = run.subgraph(body, env, i, c[1], *vs)
        return (i + 1, op.cast(outs[0], "bool"), *outs[1:])
    go = np.asarray(True) if cond is None else op.cast(cond, "bool")
    final = ts_while_loop(keep_going, step, (np.asarray(0, np.int64), go, *carried))
    return tuple(final[2:])


# A Loop with scan outputs and a fixed trip count up to this is unrolled (its counter then a
# constant in each copy of the body); longer ones run as ts.scan
_UNROLL_UP_TO = 64


def _constant_true(cond):
    """A Loop body's condition output when it has scan outputs: their length must be fixed."""
    if cond is not None and (not isinstance(cond, (np.ndarray, np.generic, bool)) or
                             not bool(np.asarray(cond).reshape(-1)[0])):
        raise TesseraError("a Loop with scan outputs whose body may stop early (its condition "
                           "output is computed) has a data-dependent length: not imported")


def _scan(run, node, xs, env):
    """Scan (opset 9 on): body(*states, *slices) -> (*states, *scanned), over the scan inputs'
    axes in their directions; the scanned outputs stacked on their axes in theirs."""
    body = _attr(node, "body")
    k = _attr(node, "num_scan_inputs")
    states, inputs = list(xs[:len(xs) - k]), list(xs[len(xs) - k:])
    in_axes = list(_attr(node, "scan_input_axes", [0] * k))
    in_dirs = list(_attr(node, "scan_input_directions", [0] * k))
    n_out = len(body.output) - len(states)
    out_axes = list(_attr(node, "scan_output_axes", [0] * n_out))
    out_dirs = list(_attr(node, "scan_output_directions", [0] * n_out))
    seq = []
    for x, axis, rev in zip(inputs, in_axes, in_dirs):
        rank = len(x.shape)
        axis %= rank
        if axis:
            x = op.transpose(x, perm=[axis] + [a for a in range(rank) if a != axis])
        seq.append(_flip0(x) if rev else x)

    def step(c, x_t):
        outs = run.subgraph(body, env, *c, *x_t)
        return tuple(outs[:len(c)]), tuple(outs[len(c):])
    last, ys = ts_scan(step, tuple(states), tuple(seq))
    stacked = []
    for y, axis, rev in zip(ys, out_axes, out_dirs):
        y = _flip0(y) if rev else y
        rank = len(y.shape)
        axis %= rank
        if axis:
            perm = list(range(1, rank))
            perm.insert(axis, 0)
            y = op.transpose(y, perm=perm)
        stacked.append(y)
    return (*last, *stacked)


def _flip0(x):
    rank = len(x.shape)
    return op.slice(x, starts=[None] * rank, stops=[None] * rank,
                    steps=[-1] + [1] * (rank - 1))


_CONTROL = {"If": _if, "Loop": _loop, "Scan": _scan}


def _constant(onnx, node):
    """A Constant node's value: a tensor, or one of the list and scalar forms."""
    value = _attr(node, "value")
    if value is not None:
        return onnx.numpy_helper.to_array(value)
    for name, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                        ("value_int", np.int64), ("value_ints", np.int64)):
        v = _attr(node, name)
        if v is not None:
            return np.asarray(v, dtype=dtype)
    raise TesseraError(f"a Constant node of a form tessera does not read: "
                       f"{[a.name for a in node.attribute]}")


# operator -> the positions of its inputs that give shapes, axes or slice bounds: values the
# compiler needs when it traces, so graph inputs feeding them are static arguments
_SHAPE_POSITIONS = {"Reshape": (1,), "Expand": (1,), "Unsqueeze": (1,), "Squeeze": (1,),
                    "Slice": (1, 2, 3, 4), "ReduceSum": (1,), "ReduceMean": (1,),
                    "ReduceMax": (1,), "ReduceMin": (1,), "ReduceLogSumExp": (1,),
                    "ReduceProd": (1,),
                    "CumSum": (1,), "Pad": (1, 2, 3), "Resize": (1, 2, 3), "Upsample": (1,),
                    "Loop": (0,)}


_TYPE_ONLY = {("CastLike", 1)}      # inputs whose values the output does not read (their type)


def _shape_inputs(graph) -> set:
    """The names whose values shape positions read, and the values those are computed from
    (a window's size cast, then fed to Range), but not through Shape or Size, which read
    only a shape."""
    nodes = list(_all_nodes(graph))       # (a subgraph's nodes read the outer values by name)
    names = {node.input[k] for node in nodes
             for k in _SHAPE_POSITIONS.get(node.op_type, ()) if k < len(node.input)}
    while True:
        more = {i for node in nodes if node.op_type not in ("Shape", "Size")
                and set(node.output) & names
                for k, i in enumerate(node.input) if i and (node.op_type, k) not in _TYPE_ONLY}
        more |= {o.name for node in nodes if set(node.output) & names   # If's branches' results
                 for a in node.attribute if a.type == a.GRAPH for o in a.g.output}
        more -= names
        if not more:
            return names
        names |= more


def _static(value):
    """A shape-giving argument as a static value: a Python number, or a tuple of ints (the body
    gives it back the graph's declared dtype: a Range's bounds)."""
    a = np.asarray(value)
    return a.item() if a.ndim == 0 else tuple(v.item() for v in a.reshape(-1))  # (floats stay)


class _Imported(Function):
    """An imported model whose graph inputs give shapes or axes (a Reshape's shape fed by the
    caller): those arguments are static values, so each new value traces anew (and the fast
    path, keyed by array types alone, is never taken for them)."""
    def __init__(self, fn, name, static):
        super().__init__(fn, name=name)
        self._static = static

    def _statics(self, args, kwargs):
        names = [p.name for p in self.signature.params]
        args = [_static(a) if names[k] in self._static else a for k, a in enumerate(args)]
        kwargs = {k: _static(v) if k in self._static else v for k, v in kwargs.items()}
        return args, kwargs

    def __call__(self, *args, **kwargs):
        args, kwargs = self._statics(args, kwargs)
        return super().__call__(*args, **kwargs)

    def lower(self, *args, target=None, **kwargs):
        args, kwargs = self._statics(args, kwargs)
        return super().lower(*args, target=target, **kwargs)


# ---- more of ONNX's operators, each written with tessera's -------------------------------------
def _static_ints(node, value, what):
    """A value the import needs at trace time (a shape, a count), as ints."""
    if isinstance(value, Traced):
        raise TesseraError(f"{node.op_type}'s {what} must be known when the model is traced "
                           "(a constant or an initializer), not computed from its inputs")
    return _ints(value)


def _i_shape(node, xs):
    shape = list(xs[0].shape)
    start, end = _attr(node, "start", 0), _attr(node, "end", None)
    return np.asarray(shape[start:end], dtype=np.int64)


def _i_constant_of_shape(node, xs):
    value = _attr(node, "value")
    fill = _onnx().numpy_helper.to_array(value) if value is not None else \
        np.zeros(1, np.float32)
    return np.full(_static_ints(node, xs[0], "shape"), fill.reshape(-1)[0], dtype=fill.dtype)


def _i_range(node, xs):
    if any(isinstance(x, Traced) for x in xs):
        raise TesseraError("Range's bounds must be known when the model is traced")
    # (one-element tensors read as the scalars ONNX asks for, as its reference evaluator does)
    start, limit, delta = (np.asarray(x).reshape(-1)[0] for x in xs)
    return np.arange(start, limit, delta, dtype=np.asarray(xs[0]).dtype)


def _i_flatten(node, xs):
    shape = list(xs[0].shape)
    axis = _attr(node, "axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    return op.reshape(xs[0], shape=[math.prod(shape[:axis]), math.prod(shape[axis:])])


def _i_split(node, xs):
    x, axis = xs[0], _attr(node, "axis", 0)
    n = x.shape[axis]
    sizes = _attr(node, "split")
    if len(xs) > 1 and xs[1] is not None:
        sizes = _static_ints(node, xs[1], "split sizes")
    if sizes is None:
        k = _attr(node, "num_outputs") or len(node.output)
        each = -(-n // k)                           # the last part takes what is left
        sizes = [min(each, n - each * i) for i in range(k)]
    bounds = list(np.cumsum(sizes)[:-1])
    return tuple(op.split(x, bounds, axis=axis))


def _i_mod(node, xs):
    a, b = xs
    return op.fmod(a, b) if _attr(node, "fmod", 0) else op.mod(a, b)


def _i_clip(node, xs):
    lo = xs[1] if len(xs) > 1 else None
    hi = xs[2] if len(xs) > 2 else None
    if lo is None and hi is None:
        return xs[0]
    return op.clamp(xs[0], _as_dtype(lo, xs[0]) if lo is not None else None,
                    _as_dtype(hi, xs[0]) if hi is not None else None)


def _i_topk(node, xs):
    k = _static_ints(node, xs[1], "K")[0]
    values, idx = op.topk(xs[0], k, axis=_attr(node, "axis", -1),
                          largest=bool(_attr(node, "largest", 1)))
    return values, idx


def _i_gather_elements(node, xs):
    x, idx, axis = xs[0], xs[1], _attr(node, "axis", 0)
    n = x.shape[axis]
    return op.take_along_axis(x, op.where(idx < 0, idx + n, idx), axis=axis)


def _i_trilu(node, xs):
    x = xs[0]
    k = int(np.asarray(xs[1])) if len(xs) > 1 and xs[1] is not None else 0
    n, m = x.shape[-2], x.shape[-1]
    rows, cols = np.arange(n)[:, None], np.arange(m)[None, :]
    keep = cols - rows >= k if _attr(node, "upper", 1) else cols - rows <= k
    return op.where(keep, x, op.cast(np.zeros((), np.int64), dtype_of(x).name))


def _i_reduce_composite(kind):
    def read(node, xs):
        x = xs[0]
        inner = {"ReduceL1": lambda: op.abs(x), "ReduceL2": lambda: x * x,
                 "ReduceSumSquare": lambda: x * x, "ReduceLogSum": lambda: x}[kind]()
        y = _i_reduce("sum")(node, [inner] + list(xs[1:]))
        return op.sqrt(y) if kind == "ReduceL2" else op.log(y) if kind == "ReduceLogSum" \
            else y
    return read


def _i_onehot(node, xs):
    idx, values = xs[0], xs[2]
    depth = int(_static_ints(node, xs[1], "depth")[0])
    idx = op.cast(idx, "int64")
    idx = op.where(idx < 0, idx + depth, idx)
    hit = op.one_hot(idx, depth, dtype="bool")
    y = op.where(hit, values[1], values[0])
    axis = _attr(node, "axis", -1) % len(y.shape)
    if axis != len(y.shape) - 1:
        rank = len(y.shape)
        perm = list(range(rank - 1))
        perm.insert(axis, rank - 1)
        y = op.transpose(y, perm=perm)
    return y


def _i_hardmax(node, xs):
    x, axis = xs[0], _attr(node, "axis", -1)
    n = x.shape[axis]
    hit = op.one_hot(op.argmax(x, axis=axis), n, dtype=dtype_of(x).name)
    rank = len(x.shape)
    axis %= rank
    if axis != rank - 1:
        perm = list(range(rank - 1))
        perm.insert(axis, rank - 1)
        hit = op.transpose(hit, perm=perm)
    return hit


def _i_tile(node, xs):
    x, reps = xs[0], _static_ints(node, xs[1], "repeats")
    shape = list(x.shape)
    spread = [d for s in shape for d in (1, s)]
    full = [d for r, s in zip(reps, shape) for d in (r, s)]
    y = op.broadcast_to(op.reshape(x, shape=spread), shape=full)
    return op.reshape(y, shape=[r * s for r, s in zip(reps, shape)])


def _i_rmsnorm(node, xs):
    _, flat, back = _trailing(node, xs[0])
    y = back(op.rmsnorm(flat, eps=_attr(node, "epsilon", 1e-5), axis=-1))
    return y * xs[1] if len(xs) > 1 and xs[1] is not None else y


def _i_batchnorm(node, xs):
    """Inference: (x - mean) / sqrt(var + eps) * scale + bias, per channel (axis 1)."""
    if _attr(node, "training_mode", 0):
        raise TesseraError("BatchNormalization in training mode is not imported (inference "
                           "only)")
    x, scale, bias, mean, var = xs
    kept = [1, -1] + [1] * (len(x.shape) - 2)
    at = lambda v: op.reshape(v, shape=kept)           # noqa: E731
    return (x - at(mean)) * op.rsqrt(at(var) + _attr(node, "epsilon", 1e-5)) * at(scale) + \
        at(bias)


def _i_instancenorm(node, xs):
    x, scale, bias = xs
    axes = list(range(2, len(x.shape)))
    kept = [1, -1] + [1] * (len(x.shape) - 2)
    mean = op.mean(x, axis=axes, keepdim=True)
    var = op.mean((x - mean) ** 2, axis=axes, keepdim=True)
    return (x - mean) * op.rsqrt(var + _attr(node, "epsilon", 1e-5)) * \
        op.reshape(scale, shape=kept) + op.reshape(bias, shape=kept)


def _i_mvn(node, xs):
    x = xs[0]
    axes = [a % len(x.shape) for a in _attr(node, "axes", [0, 2, 3])]
    mean = op.mean(x, axis=axes, keepdim=True)
    return (x - mean) / op.sqrt(op.mean((x - mean) ** 2, axis=axes, keepdim=True))


def _i_dropout(node, xs):
    """Inference (no training_mode, or a constant false one): the input, and a mask of ones."""
    training = xs[2] if len(xs) > 2 else None
    if training is not None and (not isinstance(training, np.ndarray) or bool(training)):
        raise TesseraError("Dropout in training mode is not imported (random masks)")
    return xs[0], np.ones(tuple(xs[0].shape), dtype=bool)


def _i_isinf(node, xs):
    x = xs[0]
    pos = op.eq(x, np.inf) if _attr(node, "detect_positive", 1) else None
    neg = op.eq(x, -np.inf) if _attr(node, "detect_negative", 1) else None
    if pos is None and neg is None:
        return op.broadcast_to(np.zeros((), bool), shape=list(x.shape))
    return pos if neg is None else neg if pos is None else op.maximum(pos, neg)


def _i_global_pool(kind):
    def read(node, xs):
        axes = list(range(2, len(xs[0].shape)))
        return getattr(op, kind)(xs[0], axis=axes, keepdim=True)
    return read


def _nll(logp, target, weight, reduction, ignore_index):
    """ONNX's NegativeLogLikelihoodLoss of log-probabilities [N, C, d...] at the targets
    [N, d...]: each -logp[target] weighted by weight[target] (0 where target is ignore_index);
    "mean" divides by the sum of those weights, as ONNX (and PyTorch) do."""
    t = op.cast(target, "int64")
    valid = None if ignore_index is None else t != ignore_index
    if valid is not None:
        t = op.where(valid, t, 0)
    picked = op.squeeze(op.take_along_axis(logp, op.expand_dims(t, 1), axis=1), axis=1)
    d = dtype_of(logp).name
    w = op.take(weight, t, axis=0) if weight is not None else None
    if valid is not None:
        w = op.where(valid, w if w is not None else op.cast(np.ones((), np.int64), d),
                     op.cast(np.zeros((), np.int64), d))
    loss = -picked if w is None else -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return op.sum(loss)
    return op.mean(loss) if w is None else op.sum(loss) / op.sum(w)


def _i_nll(node, xs):
    weight = xs[2] if len(xs) > 2 else None
    return _nll(xs[0], xs[1], weight, _text(node, "reduction", "mean"), _attr(node, "ignore_index"))


def _i_softmax_cross_entropy(node, xs):
    """(loss, log_prob): the NLL of log_softmax over axis 1."""
    logp = op.log_softmax(xs[0], axis=1)
    weight = xs[2] if len(xs) > 2 else None
    loss = _nll(logp, xs[1], weight, _text(node, "reduction", "mean"), _attr(node, "ignore_index"))
    return (loss, logp) if len([o for o in node.output if o]) > 1 else loss


def _heads_4d(x, heads):
    """[B, S, heads * D] -> [B, heads, S, D] (ONNX Attention's 3-D inputs)."""
    b, n, hidden = x.shape
    return op.transpose(op.reshape(x, shape=[b, n, heads, hidden // heads]), perm=[0, 2, 1, 3])


def _band(sq, sk, offset, left, right, causal):
    """The additive [sq, sk] (or [B, 1, sq, sk] for per-batch offsets) of the keys j that query
    i, at position i + offset, may see: j <= i + offset when causal, within left keys behind
    and right keys ahead when those are >= 0 (-1: unbounded)."""
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    diff = (i + offset if isinstance(offset, int) else
            op.reshape(offset, shape=[-1, 1, 1, 1]) + i) - j
    keep = ([diff >= 0] if causal else []) + ([diff <= left] if left >= 0 else []) + \
        ([diff >= -right] if right >= 0 else [])
    if isinstance(offset, int):
        return np.where(np.logical_and.reduce(keep), 0.0, -np.inf).astype(np.float32)
    allowed = keep[0]
    for more in keep[1:]:
        allowed = op.minimum(allowed, more)              # (and, for booleans)
    return op.where(allowed, 0.0, -np.inf)


def _i_attention(node, xs):
    """ONNX's Attention (opsets 23-25): 3-D inputs split into q_num_heads/kv_num_heads heads, a
    past key/value cache concatenated in front (the present key/value outputs), a boolean or
    additive mask padded to the keys, bottom-right causal masking and sliding windows offset by
    the cache (per batch with nonpad_kv_seqlen), grouped-query heads repeated in place, a
    softcap before the mask, a row that sees no key 0; the fourth output the scores at the
    stage qk_matmul_output_mode names. Without a softcap or that output it is op.attention."""
    q, k, v = xs[:3]
    mask, past_k, past_v, nonpad = (xs[i] if len(xs) > i else None for i in range(3, 7))
    three_d = len(q.shape) == 3
    if three_d:
        q = _heads_4d(q, _attr(node, "q_num_heads"))
        k, v = (_heads_4d(t, _attr(node, "kv_num_heads")) for t in (k, v))
    if past_k is not None:
        k, v = op.concat([past_k, k], axis=2), op.concat([past_v, v], axis=2)
    present_k, present_v = k, v
    d = dtype_of(q).name
    sq, sk = q.shape[2], k.shape[2]
    if mask is not None:
        if dtype_of(mask).is_bool:
            mask = op.where(mask, 0.0, -np.inf)
        if mask.shape[-1] < sk:
            mask = op.pad(mask, [[0, 0]] * (len(mask.shape) - 1) + [[0, sk - mask.shape[-1]]],
                          value=-np.inf)
    causal = bool(_attr(node, "is_causal", 0))
    left, right = _attr(node, "left_window_size", -1), _attr(node, "right_window_size", -1)
    offset = past_k.shape[2] if past_k is not None else \
        (op.cast(nonpad, "int64") - sq if nonpad is not None else 0)
    bias = mask
    if causal or left >= 0 or right >= 0:
        band = _band(sq, sk, offset, left, right, causal)
        bias = band if bias is None else bias + band
    if nonpad is not None:
        seen = np.arange(sk)[None, :] < op.expand_dims(op.cast(nonpad, "int64"), 1)
        pad = op.reshape(op.where(seen, 0.0, -np.inf), shape=[-1, 1, 1, sk])
        bias = pad if bias is None else bias + pad
    if bias is not None:
        bias = op.cast(bias, d)
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:
        k, v = (op.repeat_interleave(t, heads // kv_heads, axis=1) for t in (k, v))
    scale = _attr(node, "scale")
    scale = 1 / math.sqrt(q.shape[3]) if scale is None else scale
    softcap = _attr(node, "softcap", 0.0)
    mode = _attr(node, "qk_matmul_output_mode", 0)
    want_qk = len(node.output) > 3 and node.output[3]
    if not softcap and not want_qk:
        y = op.attention(q, k, v, mask=bias, scale=scale)
        qk = None
    else:
        scores = op.matmul(q, op.transpose(k, perm=[0, 1, 3, 2])) * op.cast(
            np.asarray(scale), d)
        if softcap:
            scores = op.tanh(scores / softcap) * softcap
        qk = scores
        biased = scores if bias is None else scores + bias
        if mode == 2:
            qk = biased
        probs = op.softmax(biased, axis=-1)
        if bias is not None:
            dead = op.max(bias, axis=-1, keepdim=True) == -np.inf
            probs = op.where(dead, op.cast(np.zeros((), np.int64), d), probs)
        if mode == 3:
            qk = probs
        y = op.matmul(probs, v)
    if three_d:
        b, h, n, dv = y.shape
        y = op.reshape(op.transpose(y, perm=[0, 2, 1, 3]), shape=[b, n, h * dv])
    return (y, present_k, present_v, qk)[:len(node.output)]


def _column(indices, j):
    """indices[..., j]."""
    rank = len(indices.shape)
    return op.squeeze(op.slice(indices, starts=[None] * (rank - 1) + [j],
                               stops=[None] * (rank - 1) + [j + 1], steps=[1] * rank), axis=-1)


def _scatter_flat(data, lin, updates, reduction, node):
    """data [M, rest...] with updates [*lin.shape, rest...] written (or added) at rows lin."""
    if reduction in ("mul", "max", "min"):
        return _scatter_dense(data, lin, updates, reduction, node)
    d = dtype_of(data).name
    zero = op.cast(np.zeros((), np.int64), d)
    placed = op.scatter_add(op.broadcast_to(zero, shape=list(data.shape)), lin,
                            op.cast(updates, d), axis=0)
    if reduction == "add":
        return data + placed
    hit = op.scatter_add(op.broadcast_to(np.zeros((), np.int64), shape=list(data.shape)), lin,
                         op.broadcast_to(np.ones((), np.int64), shape=list(updates.shape)),
                         axis=0)
    return op.where(hit > 0, placed, data)              # (ONNX: indices without repeats)


# A scatter by mul, max or min compares every row with every update ([rows, updates, rest...]):
# refused above this many elements, rather than filling the memory
_DENSE_SCATTER_LIMIT = 1 << 26


def _scatter_dense(data, lin, updates, reduction, node):
    """data [M, rest...] combined by mul/max/min with updates [*lin.shape, rest...] at rows lin
    (repeats combine too): each row against every update, then a reduction over the updates."""
    shape, rest = list(data.shape), list(data.shape[1:])
    u = math.prod(lin.shape)
    if shape[0] * u * math.prod(rest) > _DENSE_SCATTER_LIMIT:
        raise TesseraError(f"{node.op_type} with reduction={reduction!r} of {u} updates into "
                           f"{shape[0]} rows is too large for tessera's dense form")
    t = dtype_of(data)
    hit = op.reshape(np.arange(shape[0])[:, None] == op.reshape(lin, shape=[1, u]),
                     shape=[shape[0], u] + [1] * len(rest))                 # [M, U, 1...]
    upd = op.expand_dims(op.reshape(op.cast(updates, t.name), shape=[u] + rest), 0)
    if reduction == "mul":
        vals = op.where(hit, upd, op.cast(np.ones((), np.int64), t.name))
        n = len(rest) + 2
        last = op.slice(op.cumprod(vals, axis=1), starts=[None, u - 1] + [None] * (n - 2),
                        stops=[None] * n, steps=[1] * n)
        return data * op.squeeze(last, axis=1)
    big = np.inf if t.is_float else np.iinfo(t.np).max
    fill = op.cast(np.asarray(-big if reduction == "max" else big), t.name)
    best = (op.max if reduction == "max" else op.min)(op.where(hit, upd, fill), axis=1)
    touched = op.max(op.cast(hit, "bool"), axis=1)
    pick = op.maximum if reduction == "max" else op.minimum
    return op.where(touched, pick(data, best), data)


def _i_scatter_nd(node, xs):
    data, indices, updates = xs
    k = indices.shape[-1]
    shape = list(data.shape)
    flat = op.reshape(data, shape=[math.prod(shape[:k])] + shape[k:])
    lin = op.flat_index([_column(indices, j) for j in range(k)], shape[:k])
    out = _scatter_flat(flat, lin, updates, _text(node, "reduction", "none"), node)
    return op.reshape(out, shape=shape)


def _i_scatter_elements(node, xs):
    data, indices, updates = xs
    shape, rank = list(data.shape), len(data.shape)
    axis = _attr(node, "axis", 0) % rank
    grid = [indices if a == axis else
            np.arange(indices.shape[a]).reshape([-1 if b == a else 1 for b in range(rank)])
            for a in range(rank)]
    lin = op.flat_index([op.broadcast_to(op.cast(g, "int64"), shape=list(indices.shape))
                   for g in grid], shape)
    out = _scatter_flat(op.reshape(data, shape=[-1]), lin, updates,
                        _text(node, "reduction", "none"), node)
    return op.reshape(out, shape=shape)


def _i_gather_nd(node, xs):
    data, indices = xs
    b, k = _attr(node, "batch_dims", 0), indices.shape[-1]
    shape = list(data.shape)
    coords = [np.arange(shape[a]).reshape([-1 if c == a else 1
                                           for c in range(len(indices.shape) - 1)])
              for a in range(b)] + [_column(indices, j) for j in range(k)]
    lin = op.flat_index(coords, shape[:b + k])
    flat = op.reshape(data, shape=[math.prod(shape[:b + k])] + shape[b + k:])
    return op.take(flat, lin, axis=0)


def _unary_attrs(f):
    return lambda node, xs: f(xs[0], lambda name, default: _attr(node, name, default))


IMPORT.update({
    "Shape": _i_shape,
    "Size": lambda node, xs: np.asarray(math.prod(xs[0].shape), dtype=np.int64),
    "ConstantOfShape": _i_constant_of_shape,
    "Range": _i_range,
    "CastLike": lambda node, xs: op.cast(xs[0], dtype_of(xs[1]).name,
                                         saturate=bool(_attr(node, "saturate", 1)) and
                                         "float8" in dtype_of(xs[1]).name),
    "Flatten": _i_flatten,
    "Split": _i_split,
    "Mod": _i_mod,
    "And": lambda node, xs: op.logical_and(*xs), "Or": lambda node, xs: op.logical_or(*xs),
    "Xor": lambda node, xs: op.logical_xor(*xs),
    "BitwiseAnd": lambda node, xs: op.bitwise_and(*xs),
    "BitwiseOr": lambda node, xs: op.bitwise_or(*xs),
    "BitwiseXor": lambda node, xs: op.bitwise_xor(*xs),
    "BitwiseNot": lambda node, xs: op.bitwise_not(xs[0]),
    "BitShift": lambda node, xs: (op.left_shift if _attr(node, "direction") in (b"LEFT", "LEFT")
                                  else op.right_shift)(*xs),
    "Clip": _i_clip,
    "TopK": _i_topk,
    "GatherElements": _i_gather_elements,
    "CumProd": _i_cumulative("cumprod"),
    "Einsum": lambda node, xs: op.einsum(_attr(node, "equation").decode()
                                         if isinstance(_attr(node, "equation"), bytes)
                                         else _attr(node, "equation"), *xs),
    "Trilu": _i_trilu,
    **{k: _i_reduce_composite(k) for k in ("ReduceL1", "ReduceL2", "ReduceSumSquare",
                                           "ReduceLogSum")},
    "OneHot": _i_onehot,
    "Hardmax": _i_hardmax,
    "Tile": _i_tile,
    "RMSNormalization": _i_rmsnorm,
    "BatchNormalization": _i_batchnorm,
    "InstanceNormalization": _i_instancenorm,
    "MeanVarianceNormalization": _i_mvn,
    "Dropout": _i_dropout,
    "IsNaN": lambda node, xs: op.ne(xs[0], xs[0]),
    "IsInf": _i_isinf,
    "GlobalAveragePool": _i_global_pool("mean"), "GlobalMaxPool": _i_global_pool("max"),
    "Mean": lambda node, xs: _fold(op.add, xs) / len(xs),
    "Gelu": lambda node, xs: op.gelu(xs[0], approximate=_attr(node, "approximate", "none")
                                     if not isinstance(_attr(node, "approximate"), bytes)
                                     else _attr(node, "approximate").decode()),
    "Elu": _unary_attrs(lambda x, a: op.elu(x, a("alpha", 1.0))),
    "Celu": _unary_attrs(lambda x, a: op.celu(x, a("alpha", 1.0))),
    "Selu": _unary_attrs(lambda x, a: a("gamma", 1.0507009873554805) *
                         op.elu(x, a("alpha", 1.6732632423543772))),
    "LeakyRelu": _unary_attrs(lambda x, a: op.leaky_relu(x, a("alpha", 0.01))),
    "ThresholdedRelu": _unary_attrs(lambda x, a: op.where(x > a("alpha", 1.0), x, 0.0)),
    "HardSigmoid": _unary_attrs(lambda x, a: op.clamp(a("alpha", 0.2) * x + a("beta", 0.5),
                                                      0.0, 1.0)),
    "Attention": _i_attention,
    "ScatterND": _i_scatter_nd,
    "ScatterElements": _i_scatter_elements,
    "Scatter": _i_scatter_elements,            # (its name before opset 11)
    "GatherND": _i_gather_nd,
    "NegativeLogLikelihoodLoss": _i_nll,
    "SoftmaxCrossEntropyLoss": _i_softmax_cross_entropy,
    "Shrink": _unary_attrs(lambda x, a: op.where(
        x > a("lambd", 0.5), x - a("bias", 0.0),
        op.where(x < -a("lambd", 0.5), x + a("bias", 0.0), 0.0))),
    "HardSwish": lambda node, xs: op.hardswish(xs[0]),
    "Softplus": lambda node, xs: op.softplus(xs[0]),
    "Softsign": lambda node, xs: op.softsign(xs[0]),
    "Mish": lambda node, xs: op.mish(xs[0]),
    "Swish": _unary_attrs(lambda x, a: x * op.sigmoid(a("alpha", 1.0) * x)),
    "PRelu": lambda node, xs: op.where(xs[0] < 0, _as_dtype(xs[1], xs[0]) * xs[0], xs[0]),
    "Sinh": lambda node, xs: (op.exp(xs[0]) - op.exp(-xs[0])) / 2,
    "Cosh": lambda node, xs: (op.exp(xs[0]) + op.exp(-xs[0])) / 2,
    "Tan": lambda node, xs: op.sin(xs[0]) / op.cos(xs[0]),
    "Atan": lambda node, xs: op.atan2(xs[0], op.cast(np.ones((), np.int64),
                                                      dtype_of(xs[0]).name)),
    "Asin": lambda node, xs: op.atan2(xs[0], op.sqrt((1 - xs[0]) * (1 + xs[0]))),
    "Acos": lambda node, xs: op.atan2(op.sqrt((1 - xs[0]) * (1 + xs[0])), xs[0]),
    "Asinh": lambda node, xs: op.sign(xs[0]) * op.log(op.abs(xs[0]) + op.sqrt(
        xs[0] * xs[0] + 1)),
    "Acosh": lambda node, xs: op.log(xs[0] + op.sqrt((xs[0] - 1) * (xs[0] + 1))),
    "Atanh": lambda node, xs: 0.5 * op.log((1 + xs[0]) / (1 - xs[0])),
    "EyeLike": lambda node, xs: np.eye(*xs[0].shape, k=_attr(node, "k", 0), dtype=(
        dtype_of(xs[0]).np if _attr(node, "dtype") is None
        else np.dtype(_tessera_dtype(_attr(node, "dtype"), node)))),
})
_SHAPE_POSITIONS.update({"ConstantOfShape": (0,), "Range": (0, 1, 2), "Split": (1,),
                         "TopK": (1,), "Tile": (1,), "OneHot": (1,), "CumProd": (1,),
                         "Trilu": (1,), "ReduceL1": (1,), "ReduceL2": (1,),
                         "ReduceSumSquare": (1,), "ReduceLogSum": (1,), "CenterCropPad": (1,)})

# ---- signal processing and more activations ------------------------------------------------------
def _known_int(x, node, what):
    """A scalar input the model must give as a constant (a window's size, a DFT's length)."""
    if isinstance(x, Traced):
        raise TesseraError(f"{node.op_type} node {node.name!r}: {what} must be known when the "
                           "model is traced")
    return int(np.asarray(x).reshape(-1)[0])


_WINDOWS = {    # n / N as t: the window's value (ONNX's formulas, PyTorch's windows)
    "HannWindow": lambda t: np.sin(np.pi * t) ** 2,
    "HammingWindow": lambda t: 25 / 46 - (1 - 25 / 46) * np.cos(2 * np.pi * t),
    "BlackmanWindow": lambda t: 0.42 - 0.5 * np.cos(2 * np.pi * t) + 0.08 * np.cos(4 * np.pi * t),
}


def _i_window(node, xs):
    """A window of the given size (periodic: N = size, else size - 1), computed in float64 and
    rounded once to output_datatype: a constant of the model."""
    size = _known_int(xs[0], node, "the window's size")
    period = size if _attr(node, "periodic", 1) else size - 1
    with np.errstate(all="ignore"):
        w = _WINDOWS[node.op_type](np.arange(size, dtype=np.float64) / period)
    return w.astype(np.dtype(_tessera_dtype(_attr(node, "output_datatype", 1), node)))


def _i_dft(node, xs, axis=None):
    """DFT (opset 20; 17 with the axis an attribute): the signal's last axis holds its real part
    (size 1) or real and imaginary parts (size 2), and so does the result; onto op.fft, ifft,
    rfft and irfft (inverse and onesided: a real signal back from half a spectrum); 16-bit
    signals transform in float32."""
    x = xs[0]
    rank, parts = len(x.shape), x.shape[-1]
    if axis is None:
        axis = _known_int(xs[2], node, "the axis") if len(xs) > 2 and xs[2] is not None else -2
    axis %= rank
    if axis == rank - 1 or parts not in (1, 2):
        raise TesseraError(f"DFT node {node.name!r}: the last axis holds the real and imaginary "
                           f"parts (size 1 or 2, here {parts}) and is not the transform's axis")
    n = _known_int(xs[1], node, "dft_length") if len(xs) > 1 and xs[1] is not None else None
    return _spectrum(x, axis, n, _attr(node, "inverse", 0), _attr(node, "onesided", 0))


def _spectrum(x, axis, n, inverse, onesided):
    """DFT's transform of x (its last axis the parts) along `axis`, as DFT's result."""
    parts = x.shape[-1]
    d = dtype_of(x)
    work = x if d in (dt.float32, dt.float64) else op.cast(x, dtype="float32")
    sig = op.reshape(work, shape=list(x.shape[:-1])) if parts == 1 else \
        op.complex(work[..., 0], work[..., 1])
    if inverse and onesided:
        y = op.irfft(sig, n=n if n is not None else 2 * (x.shape[axis] - 1), axis=axis)
        return op.cast(op.expand_dims(y, axis=-1), dtype=d.name)
    if inverse:
        y = op.ifft(sig, n=n, axis=axis)
    elif onesided and parts == 1:
        y = op.rfft(sig, n=n, axis=axis)
    else:
        y = op.fft(sig, n=n, axis=axis)
        if onesided:
            y = y[(slice(None),) * axis + (slice(0, y.shape[axis] // 2 + 1),)]
    out = op.concat([op.expand_dims(op.real(y), axis=-1), op.expand_dims(op.imag(y), axis=-1)],
                    axis=-1)
    return op.cast(out, dtype=d.name)


def _i_lrn(node, xs):
    """Local response normalisation across channels: x / (bias + alpha / size * the sum of
    squares over the channel window [c - (size-1)//2, c + size//2 ... clipped])^beta."""
    x, size = xs[0], _attr(node, "size")
    alpha, beta, bias = _attr(node, "alpha", 1e-4), _attr(node, "beta", 0.75), _attr(node, "bias",
                                                                                    1.0)
    lo, channels = (size - 1) // 2, x.shape[1]
    sq = op.pad(x * x, pads=[[0, 0], [lo, size - 1 - lo]] + [[0, 0]] * (len(x.shape) - 2))
    total = sq[:, 0:channels]
    for i in range(1, size):
        total = total + sq[:, i:i + channels]
    return x / op.pow(bias + (alpha / size) * total, beta)


IMPORT.update({
    **{k: _i_window for k in _WINDOWS},
    "DFT": _i_dft,
    "LRN": _i_lrn,
    "SwiGLU": lambda node, xs: xs[0] * op.sigmoid(_attr(node, "alpha", 1.0) * xs[0]) * xs[1],
})
_SHAPE_POSITIONS.update({**{k: (0,) for k in _WINDOWS}, "DFT": (1, 2)})


# ---- recurrent layers (RNN, GRU, LSTM) -----------------------------------------------------------
# name -> (how many of activation_alpha/_beta it reads, the activation of x given them);
# defaults as the ONNX operators of those names
_RNN_ACTIVATIONS = {
    "tanh": ((), lambda x: op.tanh(x)),
    "sigmoid": ((), lambda x: op.sigmoid(x)),
    "relu": ((), lambda x: op.relu(x)),
    "softsign": ((), lambda x: x / (1 + op.abs(x))),
    "softplus": ((), lambda x: op.softplus(x)),
    "affine": ((1.0, 0.0), lambda x, a, b: a * x + b),
    "leakyrelu": ((0.01,), lambda x, a: op.where(x < 0, a * x, x)),
    "thresholdedrelu": ((1.0,), lambda x, a: op.where(x > a, x, 0.0)),
    "scaledtanh": ((1.0, 1.0), lambda x, a, b: a * op.tanh(b * x)),
    "hardsigmoid": ((0.2, 0.5), lambda x, a, b: op.clamp(a * x + b, 0.0, 1.0)),
    "elu": ((1.0,), lambda x, a: op.where(x < 0, a * (op.exp(x) - 1), x)),
}
_RNN_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_RNN_DEFAULT = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _rnn_activations(node, count):
    """The node's activation functions, `count` per direction, as callables."""
    names = [n.decode() if isinstance(n, bytes) else n for n in
             _attr(node, "activations", _RNN_DEFAULT[node.op_type] * count)]
    alphas = list(_attr(node, "activation_alpha", []))
    betas = list(_attr(node, "activation_beta", []))
    out = []
    for name in names:
        if name.lower() not in _RNN_ACTIVATIONS:
            raise TesseraError(f"{node.op_type} node {node.name!r}: the activation {name!r} is "
                               "not one of ONNX's", expected=", ".join(_RNN_ACTIVATIONS))
        defaults, f = _RNN_ACTIVATIONS[name.lower()]
        args = [(alphas if i == 0 else betas).pop(0) if (alphas if i == 0 else betas) else d
                for i, d in enumerate(defaults)]
        out.append(lambda x, f=f, args=args: f(x, *args))
    return out


def _i_recurrent(node, xs):
    """RNN, GRU and LSTM (opsets 14 on: `layout`; 7 on otherwise): each direction one ts.scan
    over time, the input's products with W computed for every step at once beforehand. With
    sequence_lens, a sequence's steps past its length keep its state and output zeros."""
    kind, G = node.op_type, _RNN_GATES[node.op_type]
    X, W, R, B, lens, h0, c0, P = (list(xs) + [None] * 8)[:8]
    H = _attr(node, "hidden_size")
    direction = _text(node, "direction", "forward")
    layout, clip = _attr(node, "layout", 0), _attr(node, "clip")
    if layout:                              # [batch, seq, ...] -> [seq, batch, ...]
        X = op.transpose(X, perm=[1, 0, 2])
        h0, c0 = (None if v is None else op.transpose(v, perm=[1, 0, 2]) for v in (h0, c0))
    T, N = X.shape[0], X.shape[1]
    dirs = 2 if direction == "bidirectional" else 1
    per = len(_RNN_DEFAULT[kind])
    acts = _rnn_activations(node, dirs)
    d_x = dtype_of(X)
    mask = None
    if lens is not None:                    # [T, N, 1]: step t of sequence b is real
        steps = np.arange(T, dtype=np.int64).reshape(T, 1)
        mask = op.expand_dims(op.cast(steps < op.cast(lens, dtype="int64"), dtype=d_x.name),
                              axis=-1)
    lbr = kind == "GRU" and _attr(node, "linear_before_reset", 0)
    coupled = kind == "LSTM" and _attr(node, "input_forget", 0)

    def pre(v):                              # a gate's pre-activation, clipped if asked
        return v if clip is None else op.clamp(v, -clip, clip)

    ys, hs, cs = [], [], []
    for d in range(dirs):
        f, g, h_act = (acts[d * per:(d + 1) * per] + [None, None])[:3]
        Wd, Rd = W[d], R[d]
        xw = op.matmul(X, op.transpose(Wd))                     # [T, N, G*H]
        rb = None
        if B is not None:
            wb, rb = B[d, :G * H], B[d, G * H:]
            xw = xw + (wb + rb if not lbr else wb + op.concat(
                [rb[:2 * H], op.cast(np.zeros(H), dtype=d_x.name)], axis=0))
        zeros = op.cast(np.zeros((N, H)), dtype=d_x.name)
        h = zeros if h0 is None else h0[d]
        c = zeros if c0 is None else c0[d]
        pi = po = pf = None
        if P is not None:
            pi, po, pf = P[d, :H], P[d, H:2 * H], P[d, 2 * H:]

        def step(carry, inp, Rd=Rd, rb=rb, f=f, g=g, h_act=h_act, pi=pi, po=po, pf=pf):
            h, c = carry
            xt, mt = inp if mask is not None else (inp, None)
            if kind == "RNN":
                h_new, c_new = f(pre(xt + op.matmul(h, op.transpose(Rd)))), c
            elif kind == "GRU":
                hr = op.matmul(h, op.transpose(Rd[:2 * H]))
                z = f(pre(xt[:, :H] + hr[:, :H]))
                r = f(pre(xt[:, H:2 * H] + hr[:, H:]))
                if lbr:
                    inner = op.matmul(h, op.transpose(Rd[2 * H:]))
                    inner = inner if rb is None else inner + rb[2 * H:]
                    hh = g(pre(xt[:, 2 * H:] + r * inner))
                else:
                    hh = g(pre(xt[:, 2 * H:] + op.matmul(r * h, op.transpose(Rd[2 * H:]))))
                h_new, c_new = (1 - z) * hh + z * h, c
            else:                                               # LSTM: gates i, o, f, c
                s = xt + op.matmul(h, op.transpose(Rd))
                gi, go, gf, gc = s[:, :H], s[:, H:2 * H], s[:, 2 * H:3 * H], s[:, 3 * H:]
                i = f(pre(gi if pi is None else gi + pi * c))
                fg = 1 - i if coupled else f(pre(gf if pf is None else gf + pf * c))
                c_new = fg * c + i * g(pre(gc))
                o = f(pre(go if po is None else go + po * c_new))
                h_new = o * h_act(c_new)
            if mt is None:
                return (h_new, c_new), h_new
            keep = 1 - mt
            return (mt * h_new + keep * h, mt * c_new + keep * c), mt * h_new

        (hT, cT), y = ts_scan(step, (h, c), xw if mask is None else (xw, mask),
                              reverse=direction == "reverse" or d == 1)
        ys.append(op.expand_dims(y, axis=1))                     # [T, 1, N, H]
        hs.append(op.expand_dims(hT, axis=0))
        cs.append(op.expand_dims(cT, axis=0))
    Y = ys[0] if dirs == 1 else op.concat(ys, axis=1)
    Yh = hs[0] if dirs == 1 else op.concat(hs, axis=0)
    Yc = cs[0] if dirs == 1 else op.concat(cs, axis=0)
    if layout:                              # Y [N, T, dirs, H]; Y_h, Y_c [N, dirs, H]
        Y = op.transpose(Y, perm=[2, 0, 1, 3])
        Yh, Yc = (op.transpose(v, perm=[1, 0, 2]) for v in (Yh, Yc))
    return (Y, Yh, Yc) if kind == "LSTM" else (Y, Yh)


IMPORT.update({k: _i_recurrent for k in _RNN_GATES})


# ---- sampling on grids (GridSample, AffineGrid) --------------------------------------------------
def _cubic_weights(t):
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 from the floor."""
    a = -0.75

    def near(s):                            # |s| <= 1
        return ((a + 2) * s - (a + 3)) * s * s + 1

    def far(s):                             # 1 < |s| < 2
        return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _reflect(v, lo, hi):
    """v reflected by the nearer border until it lies in [lo, hi] (ONNX's GridSample)."""
    span = hi - lo
    below, above = v < lo, v > hi
    d = op.where(below, lo - v, op.where(above, v - hi, 0.0))
    turns = op.floor(d / span)
    r = d - turns * span
    even = (turns - 2 * op.floor(turns / 2)) == 0
    from_lo, from_hi = lo + r, hi - r
    return op.where(below, op.where(even, from_lo, from_hi),
                    op.where(above, op.where(even, from_hi, from_lo), v))


def _i_grid_sample(node, xs):
    """GridSample (opset 16 on; 20 on for 3-D volumes): X [N, C, *S] sampled at grid
    [N, *O, k] (normalised coordinates, the last spatial axis first), nearest, (bi/tri)linear or
    bicubic, zeros, border or reflection padding: each tap of the interpolation one gather over
    the flattened spatial axes, weighted, as ONNX's reference reads its pixels (bicubic with
    border padding as PyTorch and onnxruntime: see below)."""
    x, grid = xs
    mode = _text(node, "mode", "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)      # (opset 16's names)
    pad = _text(node, "padding_mode", "zeros")
    align = bool(_attr(node, "align_corners", 0))
    if mode not in ("nearest", "linear", "cubic") or pad not in ("zeros", "border", "reflection"):
        raise TesseraError(f"GridSample node {node.name!r}: mode {mode!r} or padding_mode "
                           f"{pad!r} is not ONNX's")
    dims = list(x.shape[2:])
    k = len(dims)
    us = [(g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
          for g, size in ((grid[..., k - 1 - i], size) for i, size in enumerate(dims))]
    return _sample(x, us, mode, pad, align)


def _sample(x, us, mode, pad, align):
    """x [N, C, *S] sampled at pixel coordinates us (one [N, *O] tensor per spatial axis), as
    GridSample samples: [N, C, *O]."""
    N, C, dims = x.shape[0], x.shape[1], list(x.shape[2:])
    k, out = len(dims), list(us[0].shape[1:])
    taps_per_axis = []
    for size, u in zip(dims, us):           # per spatial axis: [(index, weight, valid), ...]
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if mode == "nearest":
            u = op.round(u)
        # a coordinate out of bounds moves in (cubic: only its taps do, as in PyTorch and
        # onnxruntime; ONNX's reference clamps a cubic's coordinate first for border padding)
        if pad == "border" and mode != "cubic":
            u = op.where((u < lo) | (u > hi), op.clamp(u, 0.0, size - 1.0), u)
        elif pad == "reflection" and mode != "cubic":
            u = _reflect(u, lo, hi)
        if mode == "nearest":
            taps = [(u, None)]
        else:
            base = op.floor(u)
            t = u - base
            taps = [(base, 1 - t), (base + 1, t)] if mode == "linear" else \
                [(base + (j - 1), w) for j, w in enumerate(_cubic_weights(t))]
        fetched = []
        for idx, w in taps:                 # a tap's pixel index as the padding reads it
            if pad == "reflection":
                idx = op.clamp(_reflect(idx, lo, hi), 0.0, size - 1.0)
            valid = None
            if pad == "zeros":
                valid = op.cast((idx >= 0) & (idx <= size - 1), dtype=dtype_of(x).name)
            index = op.cast(op.clamp(idx, 0.0, size - 1.0), dtype="int64")
            fetched.append((index, w, valid))
        taps_per_axis.append(fetched)
    flat_x = op.reshape(x, shape=[N, C, math.prod(dims)])
    m = math.prod(out)
    strides = [math.prod(dims[i + 1:]) for i in range(k)]
    total = None
    for combo in itertools.product(*taps_per_axis):
        index, weight = None, None
        for (idx, w, valid), stride in zip(combo, strides):
            term = idx * stride
            index = term if index is None else index + term
            for f in (w, valid):
                if f is not None:
                    weight = f if weight is None else weight * f
        where = op.broadcast_to(op.reshape(index, shape=[N, 1, m]), shape=[N, C, m])
        v = op.take_along_axis(flat_x, where, axis=2)
        if weight is not None:
            v = v * op.reshape(op.cast(weight, dtype=dtype_of(x).name), shape=[N, 1, m])
        total = v if total is None else total + v
    return op.reshape(total, shape=[N, C, *out])


def _i_affine_grid(node, xs):
    """AffineGrid (opset 20): theta [N, 2, 3] or [N, 3, 4] applied to the normalised grid of the
    given size's spatial axes: the sampling grid [N, *S, k] (the last axis first)."""
    theta, size = xs
    if isinstance(size, Traced):
        raise TesseraError("AffineGrid's size must be known when the model is traced")
    dims = _ints(size)[2:]
    align = bool(_attr(node, "align_corners", 0))
    axes = [np.linspace(-1, 1, s) if align else (2 * np.arange(s) + 1) / s - 1 for s in dims]
    mesh = np.meshgrid(*axes, indexing="ij")          # per spatial axis, [*S]
    base = np.stack([m.reshape(-1) for m in mesh[::-1]] + [np.ones(math.prod(dims))], axis=-1)
    d = dtype_of(theta)
    out = op.matmul(op.cast(base, dtype=d.name), op.transpose(theta, perm=[0, 2, 1]))
    return op.reshape(out, shape=[theta.shape[0], *dims, len(dims)])


IMPORT.update({"GridSample": _i_grid_sample, "AffineGrid": _i_affine_grid})
_SHAPE_POSITIONS.update({"AffineGrid": (1,)})


def _i_stft(node, xs):
    """STFT (opset 17): signal [B, L, 1 or 2] cut into frames of frame_length every frame_step
    (1 + (L - frame_length) // frame_step of them), each weighted by the window and
    transformed: [B, frames, bins, 2] (bins: frame_length // 2 + 1 when onesided)."""
    x, step, window, length = (list(xs) + [None] * 4)[:4]
    step = _known_int(step, node, "frame_step")
    length = _known_int(length, node, "frame_length") if length is not None else \
        window.shape[0] if window is not None else x.shape[-2]
    frames = 1 + (x.shape[1] - length) // step
    index = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    cut = op.take(x, index, axis=1)                         # [B, frames, length, parts]
    if window is not None:
        cut = cut * op.reshape(_as_dtype(window, x), shape=[length, 1])
    return _spectrum(cut, 2, length, 0, _attr(node, "onesided", 1))


def _i_mel_weight_matrix(node, xs):
    """MelWeightMatrix (opset 17): [dft_length // 2 + 1, num_mel_bins] triangular filters
    between mel-spaced frequencies (mel = 2595 log10(1 + f / 700)) on the DFT's bins, as ONNX
    defines them: a constant of the model."""
    mels, dft, rate = (_known_int(v, node, "MelWeightMatrix's sizes") for v in xs[:3])
    lo_hz, hi_hz = (float(np.asarray(v).reshape(-1)[0]) for v in xs[3:5])

    def mel(f):
        return 2595 * np.log1p(f / 700) / np.log(10)
    step = (mel(hi_hz) - mel(lo_hz)) / (mels + 2)
    hz = 700 * np.expm1((np.arange(mels + 2) * step + mel(lo_hz)) / 2595 * np.log(10))
    edge = (((dft + 1) * hz) // rate).astype(np.int64)      # each filter's left, centre, right
    out = np.zeros((dft // 2 + 1, mels))
    for i in range(mels):
        left, centre, right = edge[i:i + 3]
        if centre == left:
            out[centre, i] = 1
        else:
            j = np.arange(left, centre + 1)
            out[j, i] = (j - left) / (centre - left)
        if right > centre:
            j = np.arange(centre, right)
            out[j, i] = (right - j) / (right - centre)
    return out.astype(np.dtype(_tessera_dtype(_attr(node, "output_datatype", 1), node)))


def _i_col2im(node, xs):
    """Col2Im (opset 18): columns [N, C * prod(block), L] summed back into the image (the
    convolution's im2col undone): op.col2im on the columns as [N, C, prod(block), *grid]."""
    x, image, block = xs[0], _ints(xs[1]), _ints(xs[2])
    k = len(block)
    strides = list(_attr(node, "strides", [1] * k))
    dilations = list(_attr(node, "dilations", [1] * k))
    flat = list(_attr(node, "pads", [0] * (2 * k)))
    pads = [[flat[i], flat[k + i]] for i in range(k)]
    per = math.prod(block)
    N, CK, L = x.shape
    grid = [(image[i] + sum(pads[i]) - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
            for i in range(k)]
    if CK % per or math.prod(grid) != L:
        raise TesseraError(f"Col2Im node {node.name!r}: {L} columns of {CK} values do not tile "
                           f"an image of {image} in blocks of {block}",
                           expected=f"[N, C * {per}, {math.prod(grid)}]")
    return op.col2im(op.reshape(x, shape=[N, CK // per, per, *grid]), image=image, kernel=block,
                     stride=strides, padding=pads, dilation=dilations)


def _i_max_unpool(node, xs):
    """MaxUnpool (opset 11): X's values written at MaxPool's flat indices into zeros of the
    unpooled shape ((in - 1) * stride + kernel - pads), placed at the start of output_shape when
    given. Overlapping windows repeat an index, always with the same value: the values are
    summed in float64 and divided by their count, which gives that value exactly."""
    x, index = xs[0], xs[1]
    kernel = list(_attr(node, "kernel_shape"))
    k = len(kernel)
    strides = list(_attr(node, "strides", [1] * k))
    flat = list(_attr(node, "pads", [0] * (2 * k)))
    shape = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * strides[i] + kernel[i] - flat[i]
                                 - flat[k + i] for i in range(k)]
    lin = op.reshape(op.cast(index, dtype="int64"), shape=[-1])
    size = math.prod(shape)
    placed = op.scatter_add(op.cast(np.zeros(size), dtype="float64"), lin,
                            op.reshape(op.cast(x, dtype="float64"), shape=[-1]))
    hits = op.scatter_add(op.cast(np.zeros(size, np.int64), dtype="int64"), lin,
                          op.cast(np.ones(math.prod(x.shape), np.int64), dtype="int64"))
    y = op.cast(op.where(hits > 0, placed / op.cast(op.maximum(hits, 1), dtype="float64"), 0.0),
                dtype=dtype_of(x).name)
    y = op.reshape(y, shape=shape)
    if len(xs) > 2 and xs[2] is not None:
        want = _ints(xs[2])
        if any(w < s for w, s in zip(want, shape)):
            raise TesseraError(f"MaxUnpool node {node.name!r}: output_shape {want} is smaller "
                               f"than the unpooled shape {shape}")
        y = op.pad(y, pads=[[0, w - s] for w, s in zip(want, shape)])
    return y


def _i_tensor_scatter(node, xs):
    """TensorScatter (opset 24): the cache with each batch row's update written along `axis`
    from its write index (0 without write_indices; modulo the cache's length when circular)."""
    past, update = xs[0], xs[1]
    writes = xs[2] if len(xs) > 2 else None
    rank = len(past.shape)
    axis = _attr(node, "axis", -2) % rank
    mode = _text(node, "mode", "linear")
    size, length = past.shape[axis], update.shape[axis]
    at = [1] * rank
    at[axis] = size
    where = op.reshape(op.cast(np.arange(size), dtype="int64"), shape=at)
    if writes is not None:
        where = where - op.reshape(op.cast(writes, dtype="int64"), shape=[-1] + [1] * (rank - 1))
    if mode == "circular":
        where = op.where(where < 0, where + size, where)
    valid = (where >= 0) & (where < length)
    fill = list(update.shape)
    fill[axis] = size
    picked = op.take_along_axis(update, op.broadcast_to(op.clamp(where, 0, length - 1),
                                                        shape=fill), axis=axis)
    return op.where(valid, picked, past)


IMPORT.update({"STFT": _i_stft, "MelWeightMatrix": _i_mel_weight_matrix, "Col2Im": _i_col2im,
               "MaxUnpool": _i_max_unpool, "TensorScatter": _i_tensor_scatter})
_SHAPE_POSITIONS.update({"STFT": (1, 3), "MelWeightMatrix": (0, 1, 2, 3, 4),
                         "Col2Im": (1, 2), "MaxUnpool": (2,)})


# ---- recent LLMs' state-space layers (Gated DeltaNet, Mamba): LinearAttention, the causal conv
def _heads(x, heads):
    """[B, T, H*D] -> [T, B, H, D] (time first, for ts.scan), in float32."""
    b, t, hd = x.shape
    return op.transpose(op.reshape(op.cast(x, dtype="float32"), shape=[b, t, heads, hd // heads]),
                        perm=[1, 0, 2, 3])


def _i_linear_attention(node, xs):
    """LinearAttention (opset 27): a recurrent state S [B, H_kv, d_k, d_v] per key/value head,
    updated per token by the update_rule (linear: S + k v^T; gated: exp(g) S + k v^T; delta and
    gated_delta: the delta rule with rate beta) and read by each query head of its group:
    o_t = scale q_t^T S_t. One ts.scan over time, in float32."""
    q, k, v, past, decay, beta = (list(xs) + [None] * 6)[:6]
    rule = _text(node, "update_rule", "gated_delta")
    hq, hkv = _attr(node, "q_num_heads"), _attr(node, "kv_num_heads")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta") or not hq or not hkv or \
            hq % hkv or gating != (decay is not None) or delta != (beta is not None):
        raise TesseraError(f"LinearAttention node {node.name!r}: update_rule {rule!r} with "
                           f"q_num_heads {hq}, kv_num_heads {hkv} and these inputs is not "
                           "ONNX's", hint="gated rules take decay, delta rules take beta; "
                                          "q_num_heads is a multiple of kv_num_heads")
    B, T = q.shape[0], q.shape[1]
    dk, dv, group = q.shape[-1] // hq, v.shape[-1] // hkv, hq // hkv
    scale = _attr(node, "scale", 0.0) or 1 / math.sqrt(dk)
    steps = [_heads(q, hq), _heads(k, hkv), _heads(v, hkv)]
    if gating:              # [T, B, H_kv, 1 or d_k]: per head or per key feature
        steps.append(_heads(decay, hkv))
    if delta:               # [T, B, H_kv or 1, 1]
        steps.append(op.expand_dims(op.transpose(op.cast(beta, dtype="float32"),
                                                 perm=[1, 0, 2]), axis=-1))
    state = op.cast(np.zeros((B, hkv, dk, dv)), dtype="float32") if past is None else \
        op.cast(past, dtype="float32")

    def step(s, inp):
        qt, kt, vt = inp[:3]
        rest = list(inp[3:])
        if gating:
            s = s * op.expand_dims(op.exp(rest.pop(0)), axis=-1)
        if delta:
            got = op.sum(s * op.expand_dims(kt, axis=-1), axis=-2)         # S^T k
            vt = rest.pop(0) * (vt - got)
        s = s + op.expand_dims(kt, axis=-1) * op.expand_dims(vt, axis=-2)
        read = s if group == 1 else op.reshape(op.broadcast_to(
            op.expand_dims(s, axis=2), shape=[B, hkv, group, dk, dv]), shape=[B, hq, dk, dv])
        return s, scale * op.sum(op.expand_dims(qt, axis=-1) * read, axis=-2)   # [B, H_q, d_v]
    final, out = ts_scan(step, state, tuple(steps))
    out = op.reshape(op.transpose(out, perm=[1, 0, 2, 3]), shape=[B, T, hq * dv])
    return (op.cast(out, dtype=dtype_of(q).name),
            op.cast(final, dtype=dtype_of(past if past is not None else q).name))


def _i_causal_conv_with_state(node, xs):
    """CausalConvWithState (opset 27): a depthwise convolution over time of the past state (the
    last k - 1 steps, zeros without one) followed by the input, optionally with SiLU; returns
    the output and the new state."""
    x, w, bias, past = (list(xs) + [None] * 4)[:4]
    act = _text(node, "activation", "none")
    if act not in ("none", "silu", "swish"):
        raise TesseraError(f"CausalConvWithState node {node.name!r}: activation {act!r} is not "
                           "none, silu or swish")
    N, C, _ = x.shape
    k = w.shape[2]
    if past is None:
        past = op.cast(np.zeros((N, C, k - 1)), dtype=dtype_of(x).name)
    padded = op.concat([past, x], axis=2)
    y = op.conv(padded, w, bias, groups=C)
    if act != "none":
        y = op.cast(op.silu(op.cast(y, dtype="float32")), dtype=dtype_of(x).name)
    return y, padded[:, :, padded.shape[2] - (k - 1):]


IMPORT["BitCast"] = lambda node, xs: op.bitcast(xs[0], _tessera_dtype(_attr(node, "to"), node))
IMPORT.update({"LinearAttention": _i_linear_attention,
               "CausalConvWithState": _i_causal_conv_with_state})


def _i_det(node, xs):
    """Det (opset 11): the determinants of [..., n, n] matrices by Gaussian elimination with
    partial pivoting (n steps, unrolled: n is static): the product of the pivots, its sign
    flipped by each row swap."""
    a = xs[0]
    n = a.shape[-1]
    lead, d = list(a.shape[:-2]), dtype_of(a)
    if n != a.shape[-2]:
        raise TesseraError(f"Det node {node.name!r}: the matrices are not square ({a.shape})")
    rows = np.arange(n)
    sign, pivots = None, []
    for k in range(n):
        p = op.argmax(op.abs(a[..., k:, k]), axis=-1) + k           # [...]: the pivot's row
        pk = op.expand_dims(p, axis=-1)
        order = op.where(rows == k, pk, op.where(rows == pk, k, rows))      # swap rows k, p
        a = op.take_along_axis(a, op.broadcast_to(op.expand_dims(order, axis=-1),
                                                  shape=lead + [n, n]), axis=-2)
        flip = op.where(p == k, 1.0, -1.0)
        sign = flip if sign is None else sign * flip
        pivot = a[..., k, k]
        pivots.append(pivot)
        if k + 1 < n:
            safe = op.expand_dims(op.where(pivot == 0, 1.0, pivot), axis=-1)
            factor = op.where(op.expand_dims(pivot == 0, axis=-1), 0.0, a[..., k + 1:, k] / safe)
            below = a[..., k + 1:, :] - op.expand_dims(factor, axis=-1) * a[..., k:k + 1, :]
            a = op.concat([a[..., :k + 1, :], below], axis=-2)
    total = pivots[0]
    for v in pivots[1:]:
        total = total * v
    return op.cast(total * sign, dtype=d.name) if n else op.cast(np.ones(lead), dtype=d.name)


IMPORT["Det"] = _i_det


def _roi_axis(start, bin_size, pooled, samples, size):
    """The sample coordinates along one axis of every roi ([R, pooled * samples]): their two
    taps' indices and weights, as RoiAlign's bilinear sampling reads them (a sample past -1 or
    the size reads nothing: its mask is 0)."""
    at = (np.arange(pooled)[:, None] + (np.arange(samples)[None, :] + 0.5) / samples).reshape(-1)
    v = op.expand_dims(start, axis=-1) + op.expand_dims(bin_size, axis=-1) * \
        op.cast(at, dtype=dtype_of(start).name)
    inside = op.cast((v >= -1.0) & (v <= size), dtype=dtype_of(v).name)
    v = op.maximum(v, 0.0)
    low = op.floor(v)
    top = low >= size - 1
    low = op.where(top, size - 1.0, low)
    v = op.where(top, low, v)
    high = op.where(top, low, low + 1)
    frac = v - low
    return [(low, (1 - frac) * inside), (high, frac * inside)]


def _i_roi_align(node, xs, coordinates="half_pixel"):
    """RoiAlign (opset 16; 10 with output_half_pixel's coordinates): each roi's pooled bins
    averaged (or maxed) over sampling_ratio x sampling_ratio bilinear samples, as Mask R-CNN's
    RoIAlign; every sample one weighted gather from the roi's image."""
    x, rois, batch = xs
    mode = _text(node, "mode", "avg")
    oh, ow = _attr(node, "output_height", 1), _attr(node, "output_width", 1)
    ratio, scale = _attr(node, "sampling_ratio", 0), _attr(node, "spatial_scale", 1.0)
    half = _text(node, "coordinate_transformation_mode", coordinates) == "half_pixel"
    if ratio <= 0:
        raise TesseraError(f"RoiAlign node {node.name!r}: sampling_ratio 0 (as many samples as "
                           "each roi's size asks) gives a number of samples known only from the "
                           "rois' values", hint="export with a positive sampling_ratio "
                                                "(torchvision's MultiScaleRoIAlign uses 2)")
    N, C, H, W = x.shape
    R = rois.shape[0]
    box = op.cast(rois, dtype=dtype_of(x).name) * scale - (0.5 if half else 0.0)
    x1, y1, x2, y2 = (box[:, i] for i in range(4))
    height, width = y2 - y1, x2 - x1
    if not half:                            # (malformed rois become 1 x 1)
        height, width = op.maximum(height, 1.0), op.maximum(width, 1.0)
    ys = _roi_axis(y1, height / oh, oh, ratio, H)          # [R, oh * s] each
    xs_ = _roi_axis(x1, width / ow, ow, ratio, W)
    image = op.take(op.reshape(x, shape=[N, C, H * W]), op.cast(batch, dtype="int64"), axis=0)
    m = oh * ratio * ow * ratio
    taps = []
    for (yi, yw), (xi, xw) in itertools.product(ys, xs_):
        index = op.expand_dims(yi, axis=-1) * W + op.expand_dims(xi, axis=-2)   # [R, oh s, ow s]
        weight = op.expand_dims(yw, axis=-1) * op.expand_dims(xw, axis=-2)
        where = op.broadcast_to(op.reshape(op.cast(index, dtype="int64"), shape=[R, 1, m]),
                                shape=[R, C, m])
        taps.append(op.take_along_axis(image, where, axis=2) * op.reshape(weight, shape=[R, 1, m]))
    if mode == "max":
        v = taps[0]
        for t in taps[1:]:
            v = op.maximum(v, t)
    else:
        v = taps[0] + taps[1] + taps[2] + taps[3]
    v = op.reshape(v, shape=[R, C, oh, ratio, ow, ratio])
    if mode == "max":
        return op.max(v, axis=[3, 5])
    return op.sum(v, axis=[3, 5]) / (ratio * ratio)


IMPORT["RoiAlign"] = _i_roi_align


def _i_deform_conv(node, xs):
    """DeformConv (opset 19; 2-D): each kernel tap of each output position samples the input
    bilinearly (zeros outside) at its place moved by the offsets (one set per offset group),
    times the mask; the samples are then contracted with the weights per group, a matmul."""
    x, w, offset, bias, mask = (list(xs) + [None] * 5)[:5]
    if len(x.shape) != 4:
        raise TesseraError(f"DeformConv node {node.name!r}: only 2-D images are imported "
                           f"(here {len(x.shape) - 2}-D)")
    N, C, H, W_ = x.shape
    O, per_group = w.shape[0], w.shape[1]
    kh, kw = list(_attr(node, "kernel_shape", w.shape[2:]))
    sh, sw = list(_attr(node, "strides", [1, 1]))
    dh, dw = list(_attr(node, "dilations", [1, 1]))
    pads = list(_attr(node, "pads", [0, 0, 0, 0]))
    groups, og = _attr(node, "group", 1), _attr(node, "offset_group", 1)
    oh, ow = offset.shape[2], offset.shape[3]
    K = kh * kw
    off = op.reshape(offset, shape=[N, og, K, 2, oh, ow])
    m = None if mask is None else op.reshape(mask, shape=[N, og, K, oh, ow])
    rows = op.cast(np.arange(oh)[:, None] * sh - pads[0] + np.zeros((1, ow)),
                   dtype=dtype_of(x).name)
    cols = op.cast(np.arange(ow)[None, :] * sw - pads[1] + np.zeros((oh, 1)),
                   dtype=dtype_of(x).name)
    span = C // og
    samples = []                            # per offset group: [N, C/og, K, oh, ow]
    for g in range(og):
        part = x[:, g * span:(g + 1) * span]
        taps = []
        for t in range(K):
            i, j = divmod(t, kw)
            y = rows + i * dh + off[:, g, t, 0]
            z = cols + j * dw + off[:, g, t, 1]
            v = _sample(part, [y, z], "linear", "zeros", True)              # [N, C/og, oh, ow]
            if m is not None:
                v = v * op.expand_dims(m[:, g, t], axis=1)
            taps.append(op.expand_dims(v, axis=2))
        samples.append(op.concat(taps, axis=2))
    cols_ = op.concat(samples, axis=1) if og > 1 else samples[0]            # [N, C, K, oh, ow]
    cols_ = op.reshape(cols_, shape=[N, groups, per_group * K, oh * ow])
    weights = op.reshape(w, shape=[groups, O // groups, per_group * K])
    y = op.reshape(op.matmul(weights, cols_), shape=[N, O, oh, ow])
    return y if bias is None else y + op.reshape(bias, shape=[1, O, 1, 1])


IMPORT["DeformConv"] = _i_deform_conv

# ---- older opsets ------------------------------------------------------------------------------
# An operator's IMPORT reader follows its schemas from a first version on (ONNX's since_version;
# by default every version: the later ones only added types). Older schemas that spell it
# otherwise (attributes that became inputs, softmax over a 2-D coercion, broadcasting by
# attribute) are read by their own reader here, or refused: none is read by the newer rules.
# op -> (the first schema version IMPORT's reader follows, [(a version, the reader of the
# schemas from that version on, or None: refused), ...] newest first)
OLDER: dict = {}


def _model_opset(model) -> int:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise TesseraError("the ONNX model imports no version of the default operator set")
    return versions[0]


def _reader(op_type, opset):
    """The function reading op_type's nodes by the rules of the model's opset."""
    onnx = _onnx()
    try:
        since = onnx.defs.get_schema(op_type, opset, "").since_version
    except onnx.defs.SchemaError:
        raise TesseraError(f"ONNX opset {opset} has no operator {op_type}") from None
    first, older = OLDER.get(op_type, (1, []))
    if since >= first:
        return IMPORT[op_type]
    older = next((read for start, read in older if since >= start), None)
    if older is None:
        raise TesseraError(f"{op_type} as ONNX opset {opset} defines it (its schema of version "
                           f"{since}) is not imported; tessera reads {op_type} from opset "
                           f"{first} on", hint="convert the model to a newer opset first "
                           "(onnx.version_converter.convert_version)")
    return older


def _legacy_broadcast(read):
    """Binary operators before opset 7: B broadcasts only when `broadcast` is set, and then
    from `axis` of A on (trailing ones appended), not NumPy's right alignment."""
    def older(node, xs):
        a, b = xs
        axis = _attr(node, "axis")
        if _attr(node, "broadcast", 0) and axis is not None:
            rank_a, shape_b = len(a.shape), list(b.shape)
            axis %= rank_a
            b = op.reshape(b, shape=shape_b + [1] * (rank_a - axis - len(shape_b)))
        return read(node, [a, b])
    return older


def _coerced_2d(kind):
    """Softmax, LogSoftmax and Hardmax before opset 13: over x flattened to 2-D at `axis`
    (default 1), every axis from there on as one."""
    def older(node, xs):
        x = xs[0]
        shape = list(x.shape)
        axis = _attr(node, "axis", 1) % len(shape)
        flat = op.reshape(x, shape=[math.prod(shape[:axis]), math.prod(shape[axis:])])
        if kind == "Hardmax":
            y = op.one_hot(op.argmax(flat, axis=1), flat.shape[1], dtype=dtype_of(x).name)
        else:
            y = getattr(op, {"Softmax": "softmax", "LogSoftmax": "log_softmax"}[kind])(
                flat, axis=1)
        return op.reshape(y, shape=shape)
    return older


def _i_slice_v1(node, xs):
    """Slice before opset 10: starts, ends and axes as attributes, no steps."""
    starts = list(_attr(node, "starts"))
    axes = _attr(node, "axes")
    return _i_slice(node, [xs[0], starts, list(_attr(node, "ends")),
                           list(axes) if axes is not None else None])


def _i_clip_v6(node, xs):
    """Clip before opset 11: min and max as attributes (defaults: the float range)."""
    lo, hi = _attr(node, "min"), _attr(node, "max")
    return op.clamp(xs[0], lo, hi)


def _i_cast_v1(node, xs):
    """Cast in opset 1: `to` names the type as a string."""
    to = _attr(node, "to")
    onnx = _onnx()
    code = onnx.TensorProto.DataType.Value(to.decode() if isinstance(to, bytes) else to)
    return op.cast(xs[0], _tessera_dtype(code, node))


def _i_prelu_v6(node, xs):
    """PRelu before opset 7: a slope of one value per channel (axis 1) or of x's shape."""
    x, slope = xs
    rank, shape = len(x.shape), list(slope.shape)
    if rank > 1 and len(shape) == 1 and shape[0] == x.shape[1] != 1:
        slope = op.reshape(slope, shape=[shape[0]] + [1] * (rank - 2))
    return IMPORT["PRelu"](node, [x, slope])


def _i_batchnorm_v6(node, xs):
    """BatchNormalization before opset 7: is_test says inference, spatial=0 (statistics per
    element) is not read."""
    if not _attr(node, "is_test", 0) or not _attr(node, "spatial", 1):
        raise TesseraError("BatchNormalization of opset 6 or older is imported only for "
                           "inference over the channels (is_test=1, spatial=1)")
    return _i_batchnorm(node, xs[:5])


def _i_batchnorm_v7(node, xs):
    """BatchNormalization in opsets 7-13: more than one output means training."""
    if len([o for o in node.output if o]) > 1:
        raise TesseraError("BatchNormalization in training mode is not imported (inference "
                           "only)")
    if not _attr(node, "spatial", 1):
        raise TesseraError("BatchNormalization with spatial=0 (statistics per element) is "
                           "not imported")
    return _i_batchnorm(node, xs)


def _i_dropout_v6(node, xs):
    """Dropout before opset 7: is_test=0 (the default) means training."""
    if not _attr(node, "is_test", 0) and _attr(node, "ratio", 0.5):
        raise TesseraError("Dropout in training mode (is_test=0) is not imported")
    return _i_dropout(node, xs[:1])


OLDER.update({
    **{k: (7, [(1, _legacy_broadcast(IMPORT[k]))]) for k in
       ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less")},
    **{k: (13, [(1, _coerced_2d(k))]) for k in ("Softmax", "LogSoftmax", "Hardmax")},
    "Clip": (11, [(1, _i_clip_v6)]),
    "Slice": (10, [(1, _i_slice_v1)]),
    "Squeeze": (13, [(1, lambda node, xs: _squeeze(xs[0], _attr(node, "axes")))]),
    "Unsqueeze": (13, [(1, lambda node, xs: _unsqueeze(xs[0], list(_attr(node, "axes"))))]),
    "TopK": (10, [(1, lambda node, xs: _i_topk(node, [xs[0], np.asarray([_attr(node, "k")])]))]),
    "Reshape": (5, [(1, lambda node, xs: op.reshape(xs[0], shape=_reshape_target(
        xs[0], list(_attr(node, "shape")))))]),
    "Cast": (6, [(1, _i_cast_v1)]),
    "Concat": (4, [(1, lambda node, xs: op.concat(list(xs), axis=_attr(node, "axis", 1)))]),
    "PRelu": (7, [(1, _i_prelu_v6)]),
    "BatchNormalization": (14, [(7, _i_batchnorm_v7), (1, _i_batchnorm_v6)]),
    "Dropout": (7, [(1, _i_dropout_v6)]),
    "Tile": (6, []),                    # (tiles and axis as inputs)
    "Upsample": (7, []),                # (width_scale and height_scale)
    "Pad": (2, []),                     # (paddings)
    "Split": (2, []),                   # (the sizes as an input or an attribute)
    "DFT": (20, [(17, lambda node, xs: _i_dft(node, xs[:2], axis=_attr(node, "axis", 1)))]),
    **{k: (7, []) for k in ("RNN", "GRU", "LSTM")},    # (opset 1's output_sequence, ...)
    "RoiAlign": (16, [(10, lambda node, xs: _i_roi_align(node, xs, "output_half_pixel"))]),
})


IMPORT["Constant"] = None         # (read in import_model: its value is an attribute)
IMPORT.update({k: None for k in _CONTROL})      # (run by _GraphRunner: they need subgraphs)
OLDER["Scan"] = (9, [])             # (opset 8's Scan: a batch axis and sequence lengths)
__all__ = ["export", "import_model", "EXPORT", "IMPORT", "OPSET"]
