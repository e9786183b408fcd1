"""Structured control flow: ``ts.fori_loop``, ``ts.while_loop``, ``ts.scan`` and ``ts.cond``.

    x = ts.while_loop(lambda x: op.norm(x) > threshold, normalize, x)
    total = ts.fori_loop(0, 10, lambda i, acc: acc + w[i], acc0)
    h, ys = ts.scan(lambda h, x_t: (cell(h, x_t), h), h0, xs)
    y = ts.cond(x.sum() > 0, lambda x: x * 2, lambda x: -x, x)

Inside a tessera function each is one Graph IR region operator whose bodies are nested graphs,
traced once (whatever the trip count) and printed inside it; compiled for the CPU, the loop runs
in the program's C entry point around the body's kernels, which are compiled once; on a GPU the
host runs it around their launches. On NumPy arrays (outside any function) each runs eagerly as
the Python loop it stands for.

Decisions:
* Carries, xs and operands are pytrees of tensors (nested tuples, lists, dicts). A Python float
  among them becomes a float32 tensor, an int an int32 tensor, a bool a bool one; a NumPy array
  keeps its dtype.
* A body must give back carries of the structure, shapes and dtypes it was given: anything else
  is a ShapeError naming the body's line (a loop's carry cannot change type between steps).
* A body may use the enclosing function's tensors (a closure): they become the region's operands
  (``cap0``, ``cap1``, ... in the body's graph).
* ``fori_loop``'s bounds are Python ints (the trip count is static; use ``while_loop`` for a
  bound known only at run time); its counter is an int32 tensor (int64 beyond 2**31).
* ``cond``'s predicate is a tensor of one element (nonzero is true). A predicate that is a Python
  or NumPy value while tracing picks its branch at trace time; only that branch is traced.
* The training switch (``ts.is_training()``), like every Python value, is read when the body is
  traced.
* Reverse mode (compiler/backward.py): a differentiated fori_loop or scan keeps the carries
  each step began with (``save=true``), and a reverse scan runs the body's backward graph over
  them, so the forward runs once; a cond's adjoint is a cond of its branches' backward graphs.
  Gradients of gradients and ``ts.jvp`` work the same way. A while_loop differentiates forward
  only: its reverse mode is a DifferentiationError naming its line and suggesting fori_loop.
* ``checkpoint=k`` (fori_loop, scan) is the seeds' ``ts.checkpoint``, as a keyword of the loop
  so that it is part of the traced program: the loop becomes an outer loop over segments of k
  steps, each an inner loop, then the steps left over; differentiated, the outer loop keeps one
  carry per segment and each segment's backward runs its inner loop again.
"""
from __future__ import annotations

import numpy as np

from . import dtypes as dt
from . import pytree
from .compiler.graph_ir import Graph, Region
from .errors import ArgumentError, ShapeError, TesseraError, TracingError, enrich
from .function.binding import def_location
from .trace import Trace, Traced, apply, current_trace, static_ints, tracing, user_location
from .types import TensorType

__all__ = ["fori_loop", "while_loop", "scan", "cond"]


# ---- eager forms: the Python loops the operators stand for ---------------------------------------
def _eager(x):
    return x if isinstance(x, np.ndarray) else np.asarray(x, dtype=_scalar_dtype(x))


def _scalar_dtype(x):
    if isinstance(x, bool):
        return np.bool_
    if isinstance(x, int):
        return np.int32
    if isinstance(x, float):
        return np.float32
    return None


def _leaves(tree):
    return pytree.flatten(tree)[0]


def _tracing(*trees):
    """The trace these operands belong to (the current one), or None to run eagerly."""
    trace = current_trace()
    if trace is not None:
        return trace
    if any(isinstance(x, Traced) for t in trees for x in _leaves(t)):
        raise TracingError("a control-flow operator got a tensor that escaped its trace",
                           location=user_location())
    return None


def _check_bounds(lo, hi):
    return static_ints("fori_loop", (lo, hi),
                       "its trip count is static; for a bound known only at run time, use "
                       "ts.while_loop with the counter in the carry")


# ---- the public operators --------------------------------------------------------------------
def fori_loop(lo, hi, body, init, checkpoint=None):
    """``carry = body(i, carry)`` for ``i`` in ``range(lo, hi)``; returns the last carry.
    ``checkpoint=k`` (True: about the square root of the trip count): reverse mode keeps the
    carry of every k-th step only and recomputes the others a segment at a time (see
    `_segments`)."""
    lo, hi = _check_bounds(lo, hi)
    trace = _tracing(init)
    k = _segment_length(checkpoint, hi - lo) if trace is not None and hi <= 2**31 else 0
    if k:
        whole = (hi - lo) // k * k

        def segment(s, carry):
            start = s * k + lo                          # the segment's first counter
            return fori_loop(0, k, lambda j, c: body(start + j, c), carry)
        carry = fori_loop(0, whole // k, segment, init)
        return fori_loop(lo + whole, hi, body, carry) if lo + whole < hi else carry
    if trace is None:
        carry = pytree.tree_map(_eager, init)
        for i in range(lo, hi):
            carry = body(np.int32(i) if -2**31 <= i < 2**31 else np.int64(i), carry)
        return carry
    counter = dt.int32 if -2**31 <= lo and hi <= 2**31 else dt.int64
    carries, tree = _operands(trace, init)
    types = [c.type for c in carries]
    body_g, cap = _trace_body(trace, "body", body, [("i", TensorType(counter, ()))],
                              [tree], [types],
                              lambda res: _same_carry(res, tree, types, body, "body"),
                              loop=("fori_loop", lo, hi - lo))
    out = _region(trace, "fori_loop", {"body": body_g}, carries, [cap], types,
                  {"lo": lo, "hi": hi})
    return tree.unflatten(out)


def while_loop(cond_fn, body, init):
    """``while cond_fn(carry): carry = body(carry)``; returns the last carry. ``cond_fn`` gives
    a tensor of one element (nonzero is true)."""
    trace = _tracing(init)
    if trace is None:
        carry = pytree.tree_map(_eager, init)
        while _truth(cond_fn(carry), cond_fn):
            carry = body(carry)
        return carry
    carries, tree = _operands(trace, init)
    types = [c.type for c in carries]
    cond_g, cap_c = _trace_body(trace, "cond", cond_fn, [], [tree], [types],
                                lambda res: _predicate(res, cond_fn), loop=("while_loop",))
    body_g, cap_b = _trace_body(trace, "body", body, [], [tree], [types],
                                lambda res: _same_carry(res, tree, types, body, "body"),
                                loop=("while_loop",))
    out = _region(trace, "while_loop", {"cond": cond_g, "body": body_g}, carries,
                  [cap_c, cap_b], types, {})
    return tree.unflatten(out)


def scan(f, init, xs=None, length=None, reverse: bool = False, checkpoint=None):
    """``carry, y_t = f(carry, x_t)`` for each slice ``x_t`` of xs along its first axis (last
    to first when ``reverse``); returns ``(carry, ys)``, the ys stacked along a new first axis
    in the order of xs (``ys`` is None when f gives None for y). Without xs, ``length`` steps
    of ``f(carry, None)`` (JAX's spelling); with both, length must be xs's. ``checkpoint=k``
    (True: about the square root of the length): reverse mode keeps every k-th carry only
    (`_segments`)."""
    if xs is None:
        if length is None:
            raise ArgumentError("scan needs xs or length=", location=user_location())
        if not isinstance(length, (int, np.integer)) or isinstance(length, bool) or length < 0:
            raise ArgumentError(f"scan's length must be a non-negative integer, not "
                                f"{length!r}", location=user_location())
        body = f
        return scan(lambda c, _: body(c, None), init, np.zeros(int(length), np.float32),
                    reverse=reverse, checkpoint=checkpoint)
    trace = _tracing(init, xs)
    x_leaves, x_tree = pytree.flatten(xs)
    asked, length = length, _scan_length(x_leaves)
    if asked is not None and asked != length:
        raise ShapeError(f"scan's length={asked!r} is not its xs's length {length}",
                         location=user_location())
    k = _segment_length(checkpoint, length) if trace is not None else 0
    if k:
        return _segments(f, init, xs, reverse, k, length)
    if trace is None:
        carry = pytree.tree_map(_eager, init)
        x_leaves = [_eager(x) for x in x_leaves]
        outs = [None] * length
        for t in (range(length - 1, -1, -1) if reverse else range(length)):
            carry, y = _pair(f(carry, x_tree.unflatten([x[t] for x in x_leaves])), f)
            outs[t] = y
        if length == 0 or outs[0] is None:
            return carry, None
        y_leaves, y_tree = pytree.flatten(outs[0])
        stacked = [np.stack([np.asarray(_leaves(outs[t])[j]) for t in range(length)])
                   for j in range(len(y_leaves))]
        return carry, y_tree.unflatten(stacked)
    carries, tree = _operands(trace, init)
    xvals, _ = _operands(trace, xs)
    types = [c.type for c in carries]
    slices = [TensorType(x.type.dtype, tuple(x.type.shape[1:])) for x in xvals]
    y_info = {}

    def check(res):
        carry, y = _pair(res, f)
        out = _same_carry(carry, tree, types, f, "f")
        y_leaves, y_info["tree"] = pytree.flatten(y)
        return out + [_as_value(y, current_trace()) for y in y_leaves]
    body_g, cap = _trace_body(trace, "body", f, [], [tree, x_tree], [types, slices], check,
                              loop=("scan",))
    y_types = [TensorType(v.type.dtype, (length, *v.type.shape))
               for v in body_g.outputs[len(carries):]]
    out = _region(trace, "scan", {"body": body_g}, carries + xvals, [cap], types + y_types,
                  {"length": length, "reverse": bool(reverse), "carries": len(carries)})
    carry = tree.unflatten(out[:len(carries)])
    y_tree = y_info["tree"]
    return carry, (None if y_tree.kind == "none" else y_tree.unflatten(out[len(carries):]))


def _segment_length(checkpoint, n: int) -> int:
    """The segment length `checkpoint` asks for over n steps; 0 where segments would not help
    (none asked for, or one step or all of them in a segment)."""
    if checkpoint is None or checkpoint is False:
        return 0
    if checkpoint is True:
        k = max(1, round(n ** 0.5))
    elif isinstance(checkpoint, (int, np.integer)) and not isinstance(checkpoint, bool) \
            and checkpoint >= 1:
        k = int(checkpoint)
    else:
        raise ArgumentError(f"checkpoint must be True or a number of steps >= 1, not "
                            f"{checkpoint!r}", location=user_location())
    return k if 1 < k < n else 0


def _segments(f, init, xs, reverse, k, length):
    """A checkpointed scan: an outer scan over whole segments of k steps, each an inner scan,
    then the steps left over (first, when reversed). Differentiated, the outer loop keeps the
    carries segments begin with and the backward of a segment runs its inner scan again, keeping
    that segment's carries: about length/k + k carries held instead of length, the same values
    (the body's arithmetic is the same; sums for captured tensors add up segment by segment)."""
    whole = length // k * k
    head = pytree.tree_map(lambda x: apply("reshape", x[:whole],
                                           shape=[whole // k, k, *x.shape[1:]]), xs)
    tail = pytree.tree_map(lambda x: x[whole:], xs) if whole < length else None

    def segment(carry, x_seg):
        return scan(f, carry, x_seg, reverse=reverse)
    ys, carry = {}, init
    for name in ("tail", "head") if reverse else ("head", "tail"):
        part = head if name == "head" else tail
        if part is not None:
            carry, ys[name] = scan(segment if name == "head" else f, carry, part,
                                   reverse=reverse)
    if ys["head"] is None:
        return carry, None
    flat = pytree.tree_map(lambda y: apply("reshape", y, shape=[whole, *y.shape[2:]]),
                           ys["head"])
    if tail is None:
        return carry, flat
    return carry, pytree.tree_map(lambda a, b: apply("concat", [a, b], axis=0), flat, ys["tail"])


def cond(pred, true_fn, false_fn, *operands):
    """``true_fn(*operands)`` if pred else ``false_fn(*operands)``: both branches must give
    results of the same structure, shapes and dtypes. ``pred`` is a tensor of one element."""
    trace = _tracing(pred, operands)
    if trace is None or not isinstance(pred, Traced):
        branch = true_fn if _truth(pred, None) else false_fn
        return branch(*(pytree.tree_map(_eager, operands) if trace is None else operands))
    p = _predicate_value(trace, pred)
    vals, tree = _operands(trace, list(operands))
    types = [v.type for v in vals]
    shape = {}

    def first(res):
        leaves, shape["tree"] = pytree.flatten(res)
        shape["types"] = [_as_value(x, current_trace()).type for x in leaves]
        return [_as_value(x, current_trace()) for x in leaves]
    true_g, cap_t = _trace_body(trace, "true", true_fn, [], [tree], [types],
                                first, spread=True)

    def second(res):
        return _same_carry(res, shape["tree"], shape["types"], false_fn, "false_fn",
                           what="result", other="true_fn's")
    false_g, cap_f = _trace_body(trace, "false", false_fn, [], [tree], [types],
                                 second, spread=True)
    out = _region(trace, "cond", {"true": true_g, "false": false_g}, [p] + vals,
                  [cap_t, cap_f], shape["types"], {})
    return shape["tree"].unflatten(out)


# ---- tracing the bodies -------------------------------------------------------------------------
def _operands(trace: Trace, tree):
    """The leaves of a pytree as values of the trace (arrays and numbers become constants)."""
    leaves, treedef = pytree.flatten(tree)
    return [_as_value(x, trace) for x in leaves], treedef


def _as_value(x, trace: Trace):
    if isinstance(x, Traced):
        if x._trace is not trace and trace.encloses(x._trace):
            x = trace.capture(x)
        if x._trace is not trace:
            raise TracingError("a tensor traced in another function reached a control-flow "
                               "operator", location=user_location())
        return x._value
    if x is None:
        raise TracingError("a control-flow carry or result is None", location=user_location(),
                           hint="carries are tensors (or pytrees of tensors)")
    try:
        arr = np.asarray(x, dtype=_scalar_dtype(x))
    except (TypeError, ValueError) as e:
        raise ArgumentError(f"cannot make a tensor of {type(x).__name__}: {e}") from None
    dt.from_numpy(arr.dtype)
    return trace.graph.const(dt.native(arr), loc=user_location())


def _trace_body(trace: Trace, role: str, fn, extra: list, trees: list, types: list, finish,
                spread: bool = False, loop: tuple | None = None):
    """fn traced into a graph of its own: parameters `extra` ((name, type) pairs), then one per
    leaf of each tree (typed by `types`), then its captures; `finish` turns what fn returned
    into the graph's output values (checking them). `loop`: the body runs once per iteration
    of this loop (its kind; a fori_loop's lo and trip count, its counter the first of
    `extra`), which stochastic rounding needs (trace.loop_position). Returns (graph, captured
    tensors)."""
    if not callable(fn):
        raise ArgumentError(f"a control-flow body must be callable, not {fn!r}",
                            location=user_location())
    g = Graph(role)
    body = Trace(g, trace.function_name, parent=trace)
    args = [Traced(g.add_param(name, t), body) for name, t in extra]
    if loop is not None:
        body.loop = loop
        body.loop_index = args[0] if loop[0] == "fori_loop" else None
    k = 0
    for tree, ts in zip(trees, types):
        leaves = []
        for t in ts:
            leaves.append(Traced(g.add_param(f"a{k}", t), body))
            k += 1
        args.append(tree.unflatten(leaves))
    if spread:
        args = list(args[0])
    with tracing(body):
        try:
            g.outputs = finish(fn(*args))
        except TesseraError as e:
            if e.location is None:
                e.location = def_location(fn)
            raise enrich(e, function=trace.function_name)
    # the captures were added after the kind's parameters, in first-use order
    return g, list(body.captured)


def _region(trace: Trace, kind: str, bodies: dict, operands: list, caps: list, types: list,
            attrs: dict):
    loc = user_location()
    captures = {}
    values = list(operands)
    for role, cap in zip(bodies, caps):
        captures[role] = len(cap)
        values += [_as_value(c, trace) for c in cap]
    region = Region(kind, bodies, len(operands), captures, types, attrs, loc)
    g = trace.graph
    out = []
    for i in range(len(types)):
        try:
            out.append(Traced(g.apply(kind, values, {"region": region, "result": i}, loc=loc),
                              trace))
        except TesseraError as e:
            raise enrich(e, function=trace.function_name, location=loc, op=kind)
    return out


def _same_carry(res, tree, types, fn, name, what="carry", other="its input's"):
    leaves, got = pytree.flatten(res)
    where = def_location(fn)
    if got != tree:
        raise ShapeError(f"{name} gives back a {what} of another structure than {other}",
                         location=where, expected=repr(tree), received=repr(got),
                         hint="a loop's carry keeps its structure from step to step")
    trace = current_trace()
    values = []
    for k, (x, t) in enumerate(zip(leaves, types)):
        if not isinstance(x, Traced) and np.ndim(x) == 0 and not isinstance(x, np.ndarray):
            x = dt.convert(x, t.dtype)      # a Python number takes the carry's dtype
        v = _as_value(x, trace)
        if v.type != t:
            raise ShapeError(f"{name} gives back {what} {k} as {v.type}; {other} is {t}",
                             location=v.node.loc if v.node is not None and v.node.loc else where,
                             expected=str(t), received=str(v.type),
                             hint=("both branches give results of the same shapes and "
                                   "dtypes" if what == "result" else
                                   "a carry keeps its shape and dtype from step to step: cast "
                                   "or reshape it in the body"))
        values.append(v)
    return values


def _predicate(res, fn):
    leaves = _leaves(res)
    if len(leaves) != 1:
        raise ShapeError("a while_loop's cond gives one tensor of one element",
                         location=def_location(fn), received=f"{len(leaves)} values")
    trace = current_trace()
    x = leaves[0]
    if not isinstance(x, Traced):
        x = Traced(_as_value(np.asarray(bool(x)), trace), trace)
    return [_predicate_value(trace, x, fn)]


def _predicate_value(trace: Trace, x: Traced, fn=None):
    """A one-element tensor as a rank-0 bool value (nonzero is true)."""
    if isinstance(x, Traced) and x._trace is not trace and trace.encloses(x._trace):
        x = trace.capture(x)
    t = x.type
    if not t.is_static or t.numel() != 1:
        raise ShapeError("a control-flow predicate is a tensor of one element",
                         location=def_location(fn) if fn else user_location(),
                         received=str(t), hint="reduce it first: x.sum() > 0, op.norm(x) > t")
    if t.rank:
        x = apply("reshape", x, shape=[])
    if t.dtype != dt.bool_:
        x = apply("ne", x, 0)
    return x._value


def _truth(p, fn) -> bool:
    a = np.asarray(p)
    if a.size != 1:
        raise ShapeError("a control-flow predicate is a tensor of one element",
                         location=def_location(fn) if fn else user_location(),
                         received=f"an array of shape {a.shape}")
    return bool(a.reshape(()))


def _pair(res, f):
    if not (isinstance(res, (tuple, list)) and len(res) == 2):
        raise ShapeError("a scan's f gives back (carry, y)", location=def_location(f),
                         received=type(res).__name__, hint="return (carry, None) for no ys")
    return res


def _scan_length(x_leaves) -> int:
    if not x_leaves:
        raise ArgumentError("scan needs xs (a tensor, or a pytree of tensors)",
                            location=user_location())
    lengths = {tuple(np.shape(x) if not isinstance(x, Traced) else x.shape)[:1]
               for x in x_leaves}
    if len(lengths) != 1 or () in lengths:
        raise ShapeError("scan's xs all have the same first axis",
                         location=user_location(), received=str(sorted(map(str, lengths))))
    (length,) = lengths.pop()
    return length           # (a symbol while a function is checked with symbolic sizes)
