"""The operator registry: one entry per operator, holding everything about it.

An entry carries the operator's attributes and defaults, its dtype rule, its shape rule (with the
errors it raises), its NumPy reference, and how it reaches code: either a *decomposition* into
other operators (softmax → max, sub, exp, sum, div) or a *lowering descriptor* that the compiler's
generic lowerings read (elementwise, a reduction, a contraction, a strided view, ...). No compiler
file grows an ``if op == ...`` branch: adding an operator is adding an entry (and, for one the
C-style targets compute from templates, its row in tessera/compiler/spelling/, which says how C
spells it: operators say what, targets say how).
"""
from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError, DifferentiationError, ShapeError
from ..shapes import Sym, fmt_shape, prod, same
from ..types import TensorType


# ---- lowering descriptors (plain data the compiler reads) ---------------------------------------
# They say which generic lowering an operator takes, never how a target spells it: the C-style
# targets' templates are a table keyed by the operator's name (tessera/compiler/spelling/).
@dataclass(frozen=True)
class Elementwise:
    """out = f(operands), element by element (broadcasting); `flops` per element, for costs."""
    flops: int = 1


@dataclass(frozen=True)
class Reduce:
    """acc = init; acc = combine(acc, x) over the reduced axes, in a fixed order."""


@dataclass(frozen=True)
class Scatter:
    """out = target, then out[.., idx[q], ..] += src[.., q, ..] for q in order: repeated indices
    add up in index order (no atomics), with the gather's bounds check."""


@dataclass(frozen=True)
class Scan:
    """out[.., i, ..] = combine(out[.., i-1, ..], x[.., i, ..]) along one axis, in order from
    init: a running sum or product, the same order on every target."""


@dataclass(frozen=True)
class ArgReduce:
    """Index of the first element that wins ``better`` (NaN wins, as in NumPy)."""


@dataclass(frozen=True)
class Sort:
    """A stable sort of each line along one axis: the indices (argsort) or the values (sort)
    in the order ``better`` defines (x goes before best; descending swaps its operands), equal
    elements in index order."""
    values: bool                # store the sorted values, else their indices


@dataclass(frozen=True)
class Spectral:
    """A batch of discrete Fourier transforms along one axis (ops/spectral.py): kind "c2c" (a
    complex transform of the parts re, im), "r2c" (a real line's n/2 + 1 frequencies) or "c2r"
    (back to n reals); the parts of a complex result lie on a last axis of 2."""
    kind: str


@dataclass(frozen=True)
class Contract:
    """Batched matmul: out[b, i, j] = sum_k a[b, i, k] * b[b, k, j]."""


def contiguous_strides(shape) -> tuple:
    """A row-major array's strides in elements (symbolic sizes allowed)."""
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s *= d
    return tuple(reversed(strides))


@dataclass(frozen=True)
class View:
    """out[idx] = in[...] with no arithmetic (transpose, slice, broadcast, reshape).

    `index_map(in_type, out_type, attrs) -> (starts, axes)` says which input element an output
    index reads: along input axis a, starts[a] plus m * idx[k] for each output axis k with
    axes[k] == (a, m); axes[k] None is a broadcast axis. Maps of this form compose (a view of a
    view is one view of the buffer: `compose_views`). A reshape (reshape=True, no index map)
    keeps the flat order instead: a contiguous buffer's reshape moves nothing."""
    index_map: Callable | None = None
    reshape: bool = False

    def strides(self, ti, to, attrs) -> tuple:
        """(offset, strides per output axis) in elements of the input, read as contiguous."""
        if self.reshape:
            return 0, contiguous_strides(to.shape)
        starts, axes = self.index_map(ti, to, attrs)
        cs = contiguous_strides(ti.shape)
        return (sum(s * c for s, c in zip(starts, cs)),
                tuple(0 if ax is None else ax[1] * cs[ax[0]] for ax in axes))


def compose_views(chain) -> tuple:
    """The (offset, strides per output axis) of a chain of view nodes, the outermost first,
    over the flat buffer under the last: the index maps composed down to the first reshape,
    which must begin a run of reshapes reaching the buffer (they keep its flat order; a
    reshape above a moving view has no strides, and fusion never builds that chain)."""
    top, moving = chain[0], []
    for n in chain:
        if n.opdef.lowering.reshape:
            break
        moving.append(n)
    rest = chain[len(moving):]
    if not all(n.opdef.lowering.reshape for n in rest):
        raise AssertionError("a view chain with a reshape above a moving view")
    base = rest[0].out.type if rest else chain[-1].inputs[0].type
    if not moving:
        return 0, contiguous_strides(top.out.type.shape)
    starts, axes = moving[0].opdef.lowering.index_map(moving[0].inputs[0].type,
                                                       moving[0].out.type, moving[0].attrs)
    for n in moving[1:]:                  # (starts, axes) over n's output -> over its input
        s2, a2 = n.opdef.lowering.index_map(n.inputs[0].type, n.out.type, n.attrs)
        starts = [s + sum(a2[a][1] * starts[a] for a in range(len(a2))
                          if a2[a] is not None and a2[a][0] == b) for b, s in enumerate(s2)]
        axes = [None if ax is None or a2[ax[0]] is None else (a2[ax[0]][0], a2[ax[0]][1] * ax[1])
                for ax in axes]
    cs = contiguous_strides(base.shape)
    return (sum(s * c for s, c in zip(starts, cs)),
            tuple(0 if ax is None else ax[1] * cs[ax[0]] for ax in axes))


@dataclass(frozen=True)
class Concat:
    """Copy each input into its region of the output along an axis."""


@dataclass(frozen=True)
class Pad:
    """A constant pad: the input copied into the interior of the output, its border filled
    (one pass, where a pad per axis would concatenate, copying the whole once per axis)."""


@dataclass(frozen=True)
class Conv:
    """A convolution computed whole, as an implicit GEMM: the weight times the input's windows,
    which never exist in memory."""


@dataclass(frozen=True)
class ConvWeightGrad:
    """A convolution's weight gradient computed whole: the cotangent times the input's windows
    over every image and position, the windows packed from the input as the product reads
    them."""


@dataclass(frozen=True)
class Col2Im:
    """The windows' adjoint computed whole: each element of the image summed over the kernel
    offsets in order, read from the windows' cotangent where it lies."""


@dataclass(frozen=True)
class Pool:
    """Each window of an image folded by an elementwise combination over its taps in order
    (fold_windows: the pools), read from the input where it lies."""


@dataclass(frozen=True)
class Gather:
    """out = table[..., idx, ...] with a bounds check that reports instead of crashing."""


@dataclass(frozen=True)
class Attention:
    """softmax(scale * q @ k^T + mask [causal]) @ v, blockwise with an online softmax: the
    Sq x Sk scores never exist in memory."""


@dataclass(frozen=True)
class UserTileKernel:
    """A user's tile kernel (tessera/kernel/): its traced body, run program by program over
    the blocks of its output."""


# ---- the entry ---------------------------------------------------------------------------------
@dataclass
class OpDef:
    name: str
    nin: int                           # number of tensor operands (-1: a list)
    attrs: dict = field(default_factory=dict)          # attribute name -> default
    infer: Callable | None = None      # (types, attrs) -> TensorType  (raises ShapeError/DTypeError)
    dtype_rule: Callable | None = None # elementwise: (dtypes) -> (operand dtypes, out dtype)
    reference: Callable | None = None  # (arrays, attrs) -> ndarray
    decompose: Callable | None = None  # (builder, values, attrs) -> value, or None if primitive
    lowering: object = None
    normalize: Callable | None = None  # (types, attrs) -> attrs with defaults resolved
    doc: str = ""
    differentiable: bool = True
    ufunc: str | None = None           # the NumPy ufunc it stands for (np.exp on a traced tensor)
    # The adjoint: (builder, input values, output value, output cotangent, attrs) -> one
    # cotangent per input (None where there is none: indices, conditions), written with the
    # builder (b.op: other operators), as a decomposition is, so the backward graph is ordinary
    # Graph IR and any graph can be differentiated; a cotangent may keep the output's broadcast
    # shape (the autodiff pass sums it back with `sum_to`). See tessera/compiler/backward.py.
    vjp: Callable | None = None
    # A composite that computes (softmax, layernorm, mean, ...): on 16-bit inputs its
    # decomposition runs in float32 and its result is rounded once, as its reference is
    # (16-bit intermediates would round at every step).
    decompose_in_f32: bool = False
    # Sums or products of many terms (a reduction, a contraction, a running sum; every
    # decompose_in_f32 composite): a numerical policy's accumulation=float64 widens their
    # operands (tessera/numerics.py)
    accumulates: bool = False
    # Canonicalisation rules for nodes of this operator: (graph, node) -> the Value that
    # replaces the node's result (a no-op cast: its input), or None. Applied to a fixpoint.
    simplify: list = field(default_factory=list)
    # On the primitive graph: (graph, node) -> a Value of this operator replacing the node's
    # result where the node ends a hand-written form of it (attention's pattern), or None.
    recognise: Callable | None = None
    # A composite whose decomposition takes complex operands itself (the transforms), though
    # the complex pass has no rule for it (ops/complex.py)
    takes_complex: bool = False

    @property
    def makes_values(self) -> bool:
        """Computes new values, not copies of its operands' elements: a policy's rounding
        (stochastic, saturating) applies to its narrow results."""
        return self.decompose_in_f32 or isinstance(
            self.lowering, (Elementwise, Reduce, Scan, Contract, Conv, Attention))

    def __repr__(self):
        return f"<op {self.name}>"


REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in REGISTRY:
        raise ValueError(f"operator {opdef.name} registered twice")
    if opdef.decompose_in_f32:
        opdef.decompose = _half_in_f32(opdef, opdef.decompose)
        opdef.accumulates = True
    REGISTRY[opdef.name] = opdef
    return opdef


def _half_in_f32(opdef: OpDef, decompose: Callable) -> Callable:
    """The decomposition with 16-bit float inputs cast to float32 and the result cast back to
    the operator's dtype (one rounding, to nearest even)."""
    def run(b, xs, attrs):
        types = [b.type(x) for x in xs]
        if not any(t.dtype.is_narrow for t in types):
            return decompose(b, xs, attrs)
        out = opdef.infer(types, attrs).dtype
        wide = [b.op("cast", x, dtype="float32") if t.dtype.is_narrow else x
                for x, t in zip(xs, types)]
        r = decompose(b, wide, attrs)
        return r if b.type(r).dtype == out else b.op("cast", r, dtype=out.name)
    return run


def get(name: str) -> OpDef:
    return REGISTRY[name]


# ---- helpers shared by the shape rules ---------------------------------------------------------
def norm_axis(axis, rank: int, t: TensorType, what="axis") -> int:
    try:
        axis = operator.index(axis)
    except TypeError:
        raise ShapeError(f"{what} must be an integer, not {axis!r}", received=str(t)) from None
    if rank == 0:
        raise ShapeError(f"a rank-0 tensor has no {what} {axis}", received=str(t),
                         hint="use axis=None, or reshape to rank 1 first")
    if not -rank <= axis < rank:
        raise ShapeError(f"{what} {axis} is out of range for a rank-{rank} tensor",
                         expected=f"{what} in [{-rank}, {rank - 1}]", received=str(t))
    return axis % rank


def norm_axes(axis, t: TensorType) -> tuple:
    if axis is None:
        return tuple(range(t.rank))
    if isinstance(axis, (list, tuple)):
        axes = tuple(norm_axis(a, t.rank, t) for a in axis)
        if len(set(axes)) != len(axes):
            raise ShapeError(f"repeated axis in {tuple(axis)}", received=str(t))
        return tuple(sorted(axes))
    return (norm_axis(axis, t.rank, t),)


def broadcast_shapes(types) -> tuple:
    """NumPy broadcasting over symbolic dims: equal dims, or 1 against anything."""
    rank = max((t.rank for t in types), default=0)
    out = []
    for i in range(rank):
        d_out = 1
        for t in types:
            k = i - (rank - t.rank)
            if k < 0:
                continue
            d = t.shape[k]
            if same(d, 1):
                continue
            if same(d_out, 1) or same(d_out, d):
                d_out = d
            elif isinstance(d_out, int) and isinstance(d, int):
                _broadcast_fail(types, i - rank)
            elif isinstance(d_out, Sym) and isinstance(d, Sym):
                _broadcast_fail(types, i - rank)
            else:
                # a symbol against a concrete size: the symbol must take that size at the call,
                # which the call's own (concrete) trace checks.
                d_out = d if isinstance(d, int) else d_out
        out.append(d_out)
    return tuple(out)


def _broadcast_fail(types, axis):
    shapes = [fmt_shape(t.shape) for t in types]
    hint = None
    if len(types) == 2 and types[0].rank == types[1].rank and \
            sorted(map(str, types[0].shape)) == sorted(map(str, types[1].shape)):
        hint = "the operands hold the same dimensions in another order: a missing transpose?"
    elif len(types) == 2:
        hint = "insert a size-1 axis (x[:, None] or keepdim=True) where one operand should broadcast"
    raise ShapeError(f"shapes do not broadcast at axis {axis}",
                     expected="equal dimensions or 1 on every axis (right-aligned)",
                     received=" and ".join(shapes), hint=hint)


def ref_errstate():
    return np.errstate(all="ignore")


def run_reference(opdef: OpDef, arrays, attrs):
    """An operator's NumPy reference, quietly: IEEE results (inf, nan) are answers here, not
    events to warn about. Narrow float operands (16 and 8 bits) are widened to float32 first
    (exactly), so the reference computes in float32 like the kernels; every caller then casts the
    result to the operator's dtype, which rounds a narrow result once, to nearest even (see
    tessera.dtypes)."""
    arrays = [_widen_half(a) for a in arrays]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return opdef.reference(arrays, attrs)


_NARROW_NAMES = {d.name for d in dt.ALL if d.is_narrow}


def _widen_half(a):
    if isinstance(a, np.ndarray) and a.dtype.name in _NARROW_NAMES:
        return a.astype(np.float32)
    return a


def check_no_bool(d: dt.DType, opname: str):
    if d.is_bool:
        raise DTypeError(f"{opname} is not defined for bool tensors", received="bool",
                         hint="cast to an integer or float dtype first")


def is_scalar(x) -> bool:
    """A Python number (which takes the dtype its operation gives it), not a NumPy scalar."""
    return isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic)


def operand_dtypes(opdef, items, attrs):
    """Promotion: the dtype each operand (a dtype, or a Python number) is converted to before
    the operator (None: the operator has no promotion rule)."""
    if opdef.dtype_rule is None:
        return None
    operand, _ = opdef.dtype_rule(items, {**opdef.attrs, **attrs, "_op": opdef.name})
    return operand


# ---- helpers for adjoint (vjp) rules ------------------------------------------------------------
# A rule is vjp(b, xs, y, g, attrs): b a Builder (tessera/compiler/graph_ir.py) writing into the
# graph being differentiated, xs the operands, y the result, g y's cotangent (Graph IR values);
# it returns one cotangent per operand (None where there is none).
def zeros(b, like, shape=None):
    """Zeros in ``like``'s dtype, of ``like``'s shape or ``shape`` (sizes may be symbolic)."""
    return b.op("broadcast_to", b.const_like(0, like),
                shape=list(like.shape if shape is None else shape))


def cj(b, v):
    """v's conjugate where v is complex: a holomorphic operator's cotangent is g times the
    conjugate of its derivative (PyTorch's convention: a real loss's gradient is
    d/dre + i d/dim)."""
    return b.op("conj", v) if v.dtype.is_complex else v


def flip(b, x, axis):
    """``x`` reversed along ``axis`` (a slice with step -1)."""
    rank = len(x.shape)
    return b.op("slice", x, starts=[None] * rank, stops=[None] * rank,
                steps=[-1 if i == axis else 1 for i in range(rank)])


# ---- helpers for rewrite rules (simplify, recognise) ---------------------------------------------
def producer(v, op: str):
    """The node making v if it is an `op` node, else None."""
    return v.node if v.node is not None and v.node.op == op else None


def keepdim_shape(shape, axes) -> list:
    return [1 if k in axes else d for k, d in enumerate(shape)]


def sum_to(b, x, shape):
    """The one broadcasting adjoint: sum ``x`` over the axes along which a tensor of ``shape``
    was broadcast to ``x``'s shape (leading axes dropped, size-1 axes kept), so a cotangent
    gets its input's shape back."""
    shape = tuple(shape)
    if len(shape) == x.ndim and all(same(a, b) for a, b in zip(x.shape, shape)):
        return x
    lead = x.ndim - len(shape)
    if lead < 0:
        raise DifferentiationError(f"a cotangent of shape {fmt_shape(x.shape)} is smaller than "
                                   f"its value's {fmt_shape(shape)}")
    kept = [lead + k for k, d in enumerate(shape) if same(d, 1) and not same(x.shape[lead + k], 1)]
    if not kept:                                    # one reduction drops the leading axes
        return b.op("sum", x, axis=list(range(lead)), keepdim=False) if lead else x
    x = b.op("sum", x, axis=list(range(lead)) + kept, keepdim=True)
    return b.op("reshape", x, shape=list(shape)) if lead else x


def dim_value(b, d, like):
    """A size as a number, or, when it is symbolic, as a scalar tensor (a sum of ones along an
    axis of that size: only a symbolic Graph IR meant to be printed needs this; compiled
    programs are traced with concrete sizes)."""
    if not isinstance(d, Sym):
        return d
    return b.op("sum", b.op("broadcast_to", b.const_like(1, like), shape=[d]))


def count_value(b, shape, axes, like):
    """How many elements the axes hold (for mean and var)."""
    n = prod([shape[a] for a in axes])
    return dim_value(b, n, like)


# ---- Python's operators ---------------------------------------------------------------------------
# The operator each dunder applies, for the values users write expressions with (trace.Traced,
# a tile kernel's TileValue): forward and reflected method names (None: no reflected form)
PYTHON_BINARY = {"add": ("__add__", "__radd__"), "sub": ("__sub__", "__rsub__"),
                 "mul": ("__mul__", "__rmul__"), "div": ("__truediv__", "__rtruediv__"),
                 "floor_divide": ("__floordiv__", "__rfloordiv__"),
                 "mod": ("__mod__", "__rmod__"), "pow": ("__pow__", "__rpow__"),
                 "matmul": ("__matmul__", "__rmatmul__"),
                 "bitwise_and": ("__and__", "__rand__"), "bitwise_or": ("__or__", "__ror__"),
                 "bitwise_xor": ("__xor__", "__rxor__"),
                 "left_shift": ("__lshift__", "__rlshift__"),
                 "right_shift": ("__rshift__", "__rrshift__"),
                 "lt": ("__lt__", None), "le": ("__le__", None), "gt": ("__gt__", None),
                 "ge": ("__ge__", None), "eq": ("__eq__", None), "ne": ("__ne__", None)}
PYTHON_UNARY = {"neg": "__neg__", "abs": "__abs__", "bitwise_not": "__invert__"}


def install_operators(cls, apply, ops, reflected=True):
    """Give `cls` the dunders of `ops` (names in PYTHON_BINARY or PYTHON_UNARY), each returning
    apply(op, operands...); reflected=False leaves the reflected forms out (x.__rmod__)."""
    def method(dunder, fn):
        fn.__name__ = fn.__qualname__ = dunder
        setattr(cls, dunder, fn)
    for op in ops:
        if op in PYTHON_UNARY:
            method(PYTHON_UNARY[op], lambda self, _op=op: apply(_op, self))
            continue
        forward, back = PYTHON_BINARY[op]
        method(forward, lambda self, o, _op=op: apply(_op, self, o))
        if back and reflected:
            method(back, lambda self, o, _op=op: apply(_op, o, self))
