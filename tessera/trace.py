"""Tracing: running a Python function on traced tensors records Graph IR.

``apply`` is the one door every operator goes through. Inside a traced function it adds a node
(with the user's file and line); outside, on NumPy arrays, it checks the same shape and dtype
rules and runs the operator's NumPy reference, so ``op.*`` works eagerly too.
"""
from __future__ import annotations

import contextlib
import linecache
import threading

import numpy as np

from . import dtypes as dt
from . import numerics, ops
from .compiler.graph_ir import Graph, SourceLocation, Value, check_op
from .ops.registry import (PYTHON_BINARY, PYTHON_UNARY, install_operators, is_scalar,
                           operand_dtypes, ref_errstate, run_reference)
from .errors import (ArgumentError, DTypeError, RuntimeFault, ShapeError, SymbolicValueError,
                     TesseraError, TracingError, enrich, first_user_frame)
from .shapes import Sym
from .types import TensorType, type_of_array

_state = threading.local()


def static_range(*bounds):
    """``range(*bounds)`` unrolled while tracing, the seeds' ``tessera.static_range``: the loop
    body is traced once per step, so every bound must be a concrete Python int (a Python
    ``range`` does the same; this one says why when a bound is a tensor or a symbolic size)."""
    return range(*static_ints("static_range", bounds,
                              "its steps are unrolled at trace time; a symbolic size "
                              "(Tensor[\"N\"]) has no value until the function is lowered: "
                              "take it from an unannotated parameter's shape"))


def static_ints(name: str, bounds, hint: str) -> list:
    """Loop bounds that must be Python ints while tracing, or a TracingError saying what each
    one is instead (a traced tensor, a symbolic size)."""
    for b in bounds:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)):
            what = ("a traced tensor" if isinstance(b, Traced) else
                    f"the symbolic size {b}" if isinstance(b, Sym) else repr(b))
            raise TracingError(f"{name} needs int bounds, not {what}", location=user_location(),
                               hint=hint)
    return [int(b) for b in bounds]


def is_training() -> bool:
    """Whether code runs in training mode: True unless inside ``with ts.training(False):``. A
    static switch, read when a function is traced (``if ts.is_training():`` picks a branch
    then, as the seeds write it) and part of every compiled program's cache key, so one
    function keeps a training and an inference program side by side."""
    return getattr(_state, "training", True)


@contextlib.contextmanager
def training(mode: bool = True):
    """``with ts.training(False):`` runs (and traces) the block in inference mode: dropout is
    off and ``ts.is_training()`` is False; the previous mode comes back after the block."""
    if not isinstance(mode, (bool, np.bool_)):
        raise ArgumentError(f"ts.training takes True or False, not {mode!r}",
                            location=user_location())
    before = is_training()
    _state.training = bool(mode)
    try:
        yield
    finally:
        _state.training = before


def user_location() -> SourceLocation | None:
    """Where the user wrote the op: the innermost frame outside the tessera package."""
    f, _ = first_user_frame()
    return None if f is None else frame_location(f, f.f_lineno)


def frame_location(frame, lineno: int) -> SourceLocation:
    """Line `lineno` of the code a frame runs, with its text."""
    fn = frame.f_code.co_filename
    text = linecache.getline(fn, lineno, frame.f_globals).strip()
    return SourceLocation(fn, lineno, text, frame.f_code.co_name)


class Trace:
    def __init__(self, graph: Graph, function_name: str, parent: "Trace | None" = None):
        self.graph = graph
        self.function_name = function_name
        self.parent = parent            # the enclosing trace of a control-flow body
        self.captured: list = []        # the enclosing trace's tensors this body uses
        self._captures: dict = {}       # their value ids -> this graph's parameters
        self.policies: dict = {}        # value id -> the NumericalPolicy its tensor carries
        self.rounded = 0                # stochastic roundings so far (each its own stream)
        self.loop = None                # a loop body's (kind, ...): see control._trace_body
        self.loop_index = None          # a fori_loop body's counter

    def encloses(self, other: "Trace") -> bool:
        t = self.parent
        while t is not None and t is not other:
            t = t.parent
        return t is other

    def capture(self, x: "Traced") -> "Traced":
        """A tensor of an enclosing trace, used in this body: a parameter of the body's graph,
        and an operand of the control-flow node (captured through every level between)."""
        if x._trace is not self.parent:
            x = self.parent.capture(x)
        param = self._captures.get(x._value.id)
        if param is None:
            param = self.graph.add_param(f"cap{len(self.captured)}", x.type)
            self._captures[x._value.id] = param
            self.captured.append(x)
        return Traced(param, self)


def current_trace() -> Trace | None:
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def tracing(trace: Trace):
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(trace)
    try:
        yield trace
    finally:
        stack.pop()


class Traced:
    """A tensor inside a traced function: Python operators and methods become Graph IR nodes."""
    __slots__ = ("_value", "_trace")

    def __init__(self, value: Value, trace: Trace):
        self._value = value
        self._trace = trace

    # -- type -------------------------------------------------------------------------------
    @property
    def type(self) -> TensorType:
        return self._value.type

    @property
    def shape(self) -> tuple:
        return self._value.type.shape

    @property
    def dtype(self):
        return self._value.type.dtype

    @property
    def ndim(self) -> int:
        return self._value.type.rank

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a rank-0 tensor")
        return self.shape[0]

    def __iter__(self):
        n = self.shape[0] if self.shape else None
        if n is None:
            raise TracingError("cannot iterate over a rank-0 tensor", location=user_location())
        if not isinstance(n, int):
            raise SymbolicValueError("cannot iterate over a tensor whose first axis is symbolic",
                                     location=user_location(), received=str(self.type),
                                     hint="index it, or leave the parameter unannotated")
        return (self[i] for i in range(n))

    def __repr__(self):
        return f"<traced {self.type}>"

    def __bool__(self):
        raise TracingError("a traced tensor has no truth value while tracing",
                           location=user_location(),
                           hint="a Python if or while runs once, at trace time: use "
                                "ts.cond(pred, true_fn, false_fn, *operands) or "
                                "ts.while_loop(cond_fn, body, init) (or op.where(c, a, b) to "
                                "pick elements)")

    def __array__(self, *a, **k):
        raise TracingError("a traced tensor cannot become a NumPy array inside a tessera function",
                           location=user_location(),
                           hint="use op.* functions (they trace), not np.* functions")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """np.exp(t), ndarray + t, np.maximum(t, 0): NumPy ufuncs trace as their operators."""
        name = _ufunc_ops().get(ufunc.__name__)
        if method != "__call__" or name is None or kwargs:
            what = ufunc.__name__ + ("" if method == "__call__" else f".{method}")
            raise TracingError(f"np.{what} cannot trace a tessera tensor"
                               + (" with keyword arguments" if name and kwargs else ""),
                               location=user_location(),
                               hint="use the op.* function, or a method of the tensor")
        return apply(name, *inputs)

    def __array_function__(self, func, types, args, kwargs):
        raise TracingError(f"np.{func.__name__} cannot trace a tessera tensor",
                           location=user_location(),
                           hint=f"use the op.* function (e.g. op.{func.__name__}) or a method")

    def _no_number(self, *a):
        raise TracingError("a traced tensor has no Python value (a number, a list) while "
                           "tracing", location=user_location(), received=str(self.type),
                           hint="keep it a tensor inside the function (op.* functions take "
                                "0-d tensors), or return it and call .item() or .tolist() "
                                "on the result")

    __float__ = __int__ = __complex__ = __index__ = item = tolist = numpy = _no_number

    # -- arithmetic -------------------------------------------------------------------------
    # (Python's operators build nodes: installed from ops.registry's table below apply)
    def __pos__(self): return self
    __hash__ = object.__hash__

    # -- methods ----------------------------------------------------------------------------
    @property
    def T(self):
        return apply("transpose", self) if self.ndim >= 2 else self

    def transpose(self, *perm):
        perm = perm[0] if len(perm) == 1 and isinstance(perm[0], (list, tuple)) else perm
        return apply("transpose", self, perm=list(perm) if perm else None)

    permute = transpose

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape
        return apply("reshape", self, shape=list(shape))

    def astype(self, dtype):
        return apply("cast", self, dtype=dtype)

    def sum(self, axis=None, keepdim=False): return apply("sum", self, axis=axis, keepdim=keepdim)
    def mean(self, axis=None, keepdim=False): return apply("mean", self, axis=axis, keepdim=keepdim)
    def max(self, axis=None, keepdim=False): return apply("max", self, axis=axis, keepdim=keepdim)
    def min(self, axis=None, keepdim=False): return apply("min", self, axis=axis, keepdim=keepdim)

    def var(self, axis=None, keepdim=False, correction=0):
        return apply("var", self, axis=axis, keepdim=keepdim, correction=correction)

    def argmax(self, axis=None, keepdim=False):
        return apply("argmax", self, axis=axis, keepdim=keepdim)

    def argmin(self, axis=None, keepdim=False):
        return apply("argmin", self, axis=axis, keepdim=keepdim)

    def unsqueeze(self, axis): return apply("expand_dims", self, axis=axis)
    def squeeze(self, axis=None): return apply("squeeze", self, axis=axis)
    def exp(self): return apply("exp", self)
    def log(self): return apply("log", self)
    def sqrt(self): return apply("sqrt", self)

    def __getitem__(self, key):
        return index(self, key)


def _ufunc_ops() -> dict:
    global _UFUNC_OPS
    if _UFUNC_OPS is None:
        _UFUNC_OPS = {d.ufunc: d.name for d in ops.REGISTRY.values() if d.ufunc}
    return _UFUNC_OPS


_UFUNC_OPS = None


# ---- the one door ------------------------------------------------------------------------------
def apply(name: str, *args, **attrs):
    opdef = ops.get(name)
    flat = list(args[0]) if opdef.nin == -1 else list(args)
    for a in flat:      # a sharded tensor (tessera.dist) runs the operator by its own rules
        hook = getattr(type(a), "__tessera_apply__", None)
        if hook is not None:
            return hook(opdef, args, attrs)
    trace = current_trace()
    if not getattr(_state, "in_policy", False):
        policy = _policy_for(flat, trace)
        if policy is not None and not policy.is_default:
            return _apply_with_policy(policy, opdef, flat, attrs, trace)
    traced = [a for a in flat if isinstance(a, Traced)]
    if traced:
        if trace is not None:       # a control-flow body uses its function's tensors
            flat = [trace.capture(a) if isinstance(a, Traced) and trace.encloses(a._trace) else a
                    for a in flat]
            traced = [a for a in flat if isinstance(a, Traced)]
        if trace is None or any(a._trace is not trace for a in traced):
            raise TracingError(f"{name} got a tensor traced in another function (or one that "
                               "escaped its trace)", location=user_location(), op=name,
                               hint="pass tensors between tessera functions as arguments")
        return _apply_traced(trace, opdef, flat, attrs)
    return _apply_eager(opdef, flat, attrs)


def _apply_traced(trace: Trace, opdef, args, attrs):
    loc = user_location()
    g = trace.graph
    try:
        items = []
        for a in args:
            if isinstance(a, Traced):
                items.append(a._value)
            elif is_scalar(a):
                items.append(a)
            else:
                items.append(g.const(_as_array(a), loc=loc))
        want = operand_dtypes(opdef, [v.type.dtype if isinstance(v, Value) else v for v in items],
                               attrs)
        values = []
        for k, v in enumerate(items):
            if isinstance(v, Value):
                if want is not None and v.type.dtype != want[k]:
                    v = g.apply("cast", [v], {"dtype": want[k].name}, loc=loc)
            else:
                v = g.const(v, want[k] if want is not None else None, loc=loc)
            values.append(v)
        out = g.apply(opdef.name, values, attrs, loc=loc, origin=getattr(_state, "origin", None))
    except TesseraError as e:
        if e.partial_graph is None:     # what the trace had built when this op failed: the
            e.partial_graph = g         # notebook draws it with the failing op marked
            e.failed_inputs = [a._value for a in args if isinstance(a, Traced)]
        raise enrich(e, function=trace.function_name, location=loc, op=opdef.name)
    return Traced(out, trace)


# ---- numerical policies (tessera/numerics.py), carried out as ordinary operators ----------------
def _policy_for(flat, trace):
    """The policy an operator runs under: the innermost region's, else its operands' (or
    None)."""
    policy = numerics.current()
    if policy is None and trace is not None and trace.policies:
        found = {trace.policies.get(a._value.id) for a in flat if isinstance(a, Traced)}
        found.discard(None)
        if len(found) > 1:
            raise ArgumentError("the operands carry different numerical policies: "
                                + " and ".join(sorted(map(str, found))),
                                location=user_location(),
                                hint="choose one for the operator with `with ts.policy(...):`")
        policy = found.pop() if found else None
    return policy


def _apply_with_policy(policy, opdef, flat, attrs, trace):
    """The operator as `policy` says: operands widened to float64 where it accumulates in
    float64, a narrow result computed in float32 and rounded as the policy rounds (saturating,
    stochastic), each step an ordinary operator marked in the Graph IR as the policy's."""
    _state.in_policy = True
    try:
        result = _policy_steps(policy, opdef, flat, attrs, trace)
    finally:
        _state.in_policy = False
        _state.origin = None
    if trace is not None and isinstance(result, Traced) and numerics.current() is None:
        trace.policies[result._value.id] = policy      # (an annotation's policy travels on)
    return result


def _policy_steps(policy, opdef, flat, attrs, trace):
    def run(args):
        return apply(opdef.name, *([args] if opdef.nin == -1 else args), **attrs)

    floats = [a for a in flat if _is_tensor(a) and dtype_of(a).is_float]
    if opdef.accumulates:
        for a in floats:
            policy.check_accumulation(dtype_of(a))
    acc64 = policy.accumulation is dt.float64 and opdef.accumulates and \
        any(dtype_of(a) is not dt.float64 for a in floats)
    rounds = policy.changes_rounding and opdef.makes_values
    out = _natural_dtype(opdef, flat, attrs) if acc64 or rounds else None
    rounds = rounds and out.is_narrow
    if not acc64 and not rounds:
        return run(flat)
    _state.origin = f"{policy}:{opdef.name}"      # (Graph IR: "from <policy>:<operator>")
    wide = dt.float64 if acc64 else dt.float32
    if opdef.name == "cast":            # its wide value is its operand's: only the rounding
        r = apply("cast", flat[0], dtype=wide.name)     # is the policy's
    else:
        r = run([apply("cast", a, dtype=wide.name)
                 if _is_tensor(a) and dtype_of(a).is_float and dtype_of(a).itemsize < wide.itemsize
                 else a for a in flat])
    if not rounds:
        return apply("cast", r, dtype=out.name)
    if dtype_of(r) is dt.float64:
        r = apply("cast", r, dtype="float32")
    if policy.saturate:
        r = apply("minimum", apply("maximum", r, -out.max_finite), out.max_finite)   # op.clamp
    if policy.rounding == "stochastic":
        return _round_stochastic(r, out, policy, trace)
    return apply("cast", r, dtype=out.name)


def _round_stochastic(r, out, policy, trace):
    """r rounded stochastically to `out` from this operator's stream; inside fori_loop bodies
    each iteration's elements take counters of their own (the element's index plus the
    iteration's number among every enclosing loop's times the size), so no two iterations
    draw the same numbers."""
    seed = _stream_seed(policy, trace)
    position, count = loop_position(trace) if trace is not None else (None, 1)
    if position is None:
        return apply("round_stochastic", r, seed, element_counters(_shape(r)), dtype=out.name)
    numel = int(np.prod(_shape(r), dtype=np.int64))
    if numel * count >= 2 ** 63:
        raise TracingError(f"stochastic rounding of {numel} elements over {count} loop "
                           "iterations needs more than 2**63 counters", location=user_location())
    counters = apply("add", element_counters(_shape(r)), apply("mul", position, numel))
    return apply("round_stochastic", r, seed, counters, dtype=out.name)


def element_counters(shape, offset=0):
    """offset + the row-major index of each element of ``shape``, as a sum of one small
    constant per axis (arange * stride) broadcast together. Inside a trace the constants are
    graph constants and the sum is traced: the compiler folds it into one constant when it is
    small and otherwise computes it inside the kernel that consumes it, so a large draw stores
    no counter tensor. (No compiler support is needed for "the element's index".)"""
    dims = list(shape) if isinstance(shape, (list, tuple)) else [shape]
    if not all(isinstance(d, (int, np.integer)) for d in dims):
        raise SymbolicValueError(f"random numbers need concrete sizes, not {tuple(dims)}",
                                 hint="leave the parameter unannotated to trace with its sizes")
    dims = [int(d) for d in dims]
    offset = int(offset)
    n = int(np.prod(dims, dtype=np.int64))
    wide = offset < 0 or offset + n > np.iinfo(np.int32).max
    itype = np.int64 if wide else np.int32
    total, stride = None, 1
    for k in reversed(range(len(dims))):
        if dims[k] != 1:
            a = np.arange(dims[k], dtype=itype) * itype(stride)
            if total is None:
                a = a + itype(offset)       # the offset rides on the first constant
            a = lift(a.reshape([1] * k + [dims[k]] + [1] * (len(dims) - k - 1)))
            total = a if total is None else apply("add", a, total)
        stride *= dims[k]
    if total is None:                       # every size is 1 (or a rank-0 shape)
        total = lift(np.full(dims, offset, dtype=itype))
    return total


def lift(a):
    """A NumPy constant as a graph constant inside a trace; itself outside one."""
    trace = current_trace()
    return Traced(trace.graph.const(a), trace) if trace is not None else a


def loop_position(trace):
    """(this iteration's number among every enclosing fori_loop's iterations, as a traced
    int64, and how many there are), or (None, 1) outside loops. A while_loop or scan body has
    no counter to key its draws by, so stochastic rounding there is an error rather than the
    same numbers on every step."""
    position, count, t = None, 1, trace
    while t is not None:
        if t.loop is not None and t.loop[0] != "fori_loop":
            raise TracingError(f"stochastic rounding inside a {t.loop[0]} body would draw the "
                               "same numbers on every step", location=user_location(),
                               hint="use fori_loop (its counter keys the draws), or round "
                                    "outside the loop")
        if t.loop is not None:
            _, lo, trips = t.loop
            i = t.loop_index if t is trace else trace.capture(t.loop_index)
            step = apply("sub", apply("cast", i, dtype="int64"), lo)
            position = step if position is None else \
                apply("add", position, apply("mul", step, count))
            count *= trips
        t = t.parent
    return position, count


def _stream_seed(policy, trace) -> int:
    """The seed of the next stochastic rounding's stream: (the policy's seed, the rounding's
    place in the trace, or in the region when eager) through the generator, so each operator
    draws its own numbers and a retrace draws the same ones."""
    from .ops.random import random_bits
    holder = trace if trace is not None else numerics.region_state()
    while getattr(holder, "parent", None) is not None:    # one count for a function and its
        holder = holder.parent                             # control-flow bodies
    k = holder.rounded
    holder.rounded += 1
    return int(random_bits(np.uint64(policy.seed), np.uint64(k)) >> np.uint64(1))


def _natural_dtype(opdef, flat, attrs) -> dt.DType:
    """The result dtype the operator gives these operands without a policy."""
    items = [dtype_of(a) if _is_tensor(a) else a if is_scalar(a) else
             dt.from_numpy(np.asarray(a).dtype) for a in flat]
    want = operand_dtypes(opdef, items, attrs)
    types = [TensorType(want[k] if want is not None else
                        items[k] if _is_tensor(a) else dt.from_numpy(np.asarray(a).dtype),
                        tuple(_shape(a)) if _is_tensor(a) else ()) for k, a in enumerate(flat)]
    return check_op(opdef, attrs, types)[1].dtype


def _is_tensor(a) -> bool:
    return isinstance(a, Traced) or not is_scalar(a)


def dtype_of(a) -> dt.DType:
    """The tessera dtype of a traced tensor, an array or a Python number."""
    return a.dtype if isinstance(a, Traced) else dt.from_numpy(np.asarray(a).dtype)


def _shape(a) -> tuple:
    return a.shape if isinstance(a, Traced) else np.shape(a)


def _as_array(a) -> np.ndarray:
    try:
        arr = np.asarray(a)
    except ValueError as e:
        raise ArgumentError(f"cannot make an array of {type(a).__name__}: {e}") from None
    dt.from_numpy(arr.dtype)      # raises UnsupportedDTypeError
    return dt.native(arr)


def _apply_eager(opdef, args, attrs):
    try:
        items = [a if is_scalar(a) else _as_array(a) for a in args]
        want = operand_dtypes(opdef, [dt.from_numpy(x.dtype) if isinstance(x, np.ndarray) else x
                                       for x in items], attrs)
        arrays = []
        for k, x in enumerate(items):
            try:
                arrays.append(np.asarray(x) if want is None else dt.convert(x, want[k]))
            except OverflowError as e:
                raise DTypeError(f"{x!r} does not fit in {want[k].name}: {e}") from None
        types = [type_of_array(a) for a in arrays]
        full, out_type = check_op(opdef, attrs, types)
        try:
            result = run_reference(opdef, arrays, full)
        except IndexError as e:
            raise RuntimeFault(str(e)) from None
        with ref_errstate():            # (exp of int8 overflowing float16: inf is the answer)
            return np.asarray(result, dtype=out_type.dtype.np)
    except TesseraError as e:
        raise enrich(e, location=user_location(), op=opdef.name)


install_operators(Traced, apply, [*PYTHON_BINARY, *PYTHON_UNARY])


# ---- Python indexing: basic slices, ints, None, ..., and one integer-array index ----------------
def index(x: Traced, key):
    if not isinstance(key, tuple):
        key = (key,)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise ArgumentError("an index can hold one ... at most", location=user_location())
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > x.ndim:
        raise ShapeError(f"too many indices ({n_real}) for a rank-{x.ndim} tensor",
                           location=user_location(), op="slice", received=str(x.type))
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (x.ndim - n_real))
        else:
            expanded.append(k)
    expanded.extend([slice(None)] * (x.ndim - sum(1 for k in expanded if k is not None)))
    starts, stops, steps, out_shape, array_axis, array_index = [], [], [], [], None, None
    axis = 0
    for k in expanded:
        if k is None:
            out_shape.append(("new",))
            continue
        if isinstance(k, slice):
            starts.append(k.start); stops.append(k.stop); steps.append(1 if k.step is None else k.step)
            out_shape.append(("keep", axis))
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            k = int(k)
            n = x.shape[axis]
            if isinstance(n, int) and not -n <= k < n:
                raise ShapeError(f"index {k} is out of range for axis {axis} of size {n}",
                                   location=user_location(), op="slice", received=str(x.type))
            starts.append(k); stops.append(k + 1 if k != -1 else None); steps.append(1)
            out_shape.append(("drop", axis))
        elif isinstance(k, (Traced, np.ndarray, list)):
            if array_axis is not None or any(
                    isinstance(o, (int, np.integer)) and not isinstance(o, bool) for o in expanded):
                raise ArgumentError("one integer-array index is supported, without integer "
                                   "indices beside it (NumPy would move its axes)",
                                   location=user_location(), op="take",
                                   hint="index in two steps: x[0][:, idx], or use op.take")
            starts.append(None); stops.append(None); steps.append(1)
            array_axis, array_index = axis, k
            out_shape.append(("take", axis))
        else:
            raise ArgumentError(f"unsupported index {k!r}", location=user_location(), op="slice",
                               hint="use slices, ints, None, ... or one integer array")
        axis += 1
    y = x
    if any(not (s is None and e is None and st == 1) for s, e, st in zip(starts, stops, steps)):
        y = apply("slice", x, starts=starts, stops=stops, steps=steps)
    if array_axis is not None:
        y = apply("take", y, array_index, axis=array_axis)
        idx_rank = array_index.ndim if hasattr(array_index, "ndim") else np.asarray(array_index).ndim
    else:
        idx_rank = 0
    # final shape: walk the plan
    shape, ax = [], 0
    for kind in out_shape:
        if kind[0] == "new":
            shape.append(1)
        elif kind[0] == "keep":
            shape.append(y.shape[ax]); ax += 1
        elif kind[0] == "drop":
            ax += 1
        else:
            shape.extend(y.shape[ax:ax + idx_rank]); ax += idx_rank
    if tuple(shape) != tuple(y.shape):
        y = apply("reshape", y, shape=shape)
    return y

