"""Tracing a function into Graph IR, and checking what it returns against its annotation: on
concrete sizes for a call, on the annotations' symbols for the symbolic check and `graph_ir`,
and inline into the caller's graph when it is called on traced tensors."""
from __future__ import annotations

import contextlib
import os

import numpy as np

from .. import dtypes as dt
from .. import numerics, pytree
from ..compiler.graph_ir import Graph
from ..errors import _PKG_DIR, ArgumentError, ShapeError, TesseraError, enrich
from ..runtime import cache
from ..shapes import Sym, evaluate, same
from ..trace import Trace, Traced, frame_location, tracing
from ..types import TensorType
from .binding import Signature, TreeArg


def trace(sig: Signature, fn, types: dict, statics: dict, bindings=None,
          may_return_none: bool = False) -> Graph:
    """The Graph IR of fn called on tensors of these types (and these static values); the
    graph's output_structure and output_tree say how the results were returned."""
    g = Graph(sig.name, bindings=bindings)
    tr = Trace(g, sig.name)
    call_args = {}
    for p in sig.params:
        tree = statics.get(p.name)
        if isinstance(tree, TreeArg):
            call_args[p.name] = tree.treedef.unflatten(
                [Traced(g.add_param(x, types[x]), tr) if kind == "param" else x
                 for kind, x in tree.slots])
        elif p.name in types:
            call_args[p.name] = Traced(g.add_param(p.name, types[p.name]), tr)
            if p.spec is not None and p.spec.policy is not None:    # an annotation's policy
                tr.policies[call_args[p.name]._value.id] = p.spec.policy
        else:
            call_args[p.name] = statics[p.name]
    cache.count("traces")
    with tracing(tr), _policy_region(sig):
        try:
            result = fn(**call_args)
        except TesseraError as e:
            if e.partial_graph is None:     # raised outside an op (`range(S)`, an `if`)
                e.partial_graph = g
            raise enrich(e, function=sig.name, location=raising_user_line(e))
        structure, tree = "single", None
        items = [result]
        if _is_nested(result) or (result is None and may_return_none):
            # a dict, or containers (or None) inside a tuple/list: a pytree of results,
            # compiled as a flat list and rebuilt after each call
            items, tree = pytree.flatten(result)
            structure = "list"
        elif isinstance(result, (tuple, list)):
            structure = "tuple" if isinstance(result, tuple) else "list"
            items = list(result)
        outs = []
        for r in items:
            if isinstance(r, Traced):
                if r._trace is not tr:
                    raise TesseraError("returned a tensor traced in another function",
                                       function=sig.name)
                outs.append(r._value)
            elif r is None:
                raise TesseraError(f"{sig.name} returned None", function=sig.name,
                                   location=sig.def_loc, hint="return a tensor")
            else:
                try:
                    outs.append(g.const(np.asarray(r)))
                except TesseraError as e:
                    raise enrich(e, function=sig.name) from None
    g.outputs = outs
    g.output_structure = structure
    g.output_tree = tree
    return g


def symbolic_types(sig: Signature, arrays: dict, default_dtype=None) -> dict:
    """The parameters' types with the annotations' symbols for sizes (the arrays' own sizes
    where an argument is not annotated); with `default_dtype`, also the annotated parameters
    that have no array (from the annotations alone)."""
    types = {}
    specs = {p.name: p.spec for p in sig.params}
    for name, arr in arrays.items():          # parameters and pytree leaves
        spec = specs.get(name)
        dims = spec.dims if spec is not None and spec.dims is not None else arr.shape
        types[name] = TensorType(dt.from_numpy(arr.dtype), tuple(dims))
    for p in sig.params:
        if p.name in arrays:
            continue
        if p.spec is not None and default_dtype is not None:
            if p.spec.dims is None:
                raise ArgumentError(f"{p.name} is annotated with a bare Tensor: its rank is "
                                    "unknown until a call", function=sig.name)
            types[p.name] = TensorType(p.spec.dtype or default_dtype, p.spec.dims)
    return types


def check_return(sig: Signature, outputs, translate: dict, values: dict | None, reduced: bool):
    """The result against the return annotation.

    `translate` maps the annotation's symbols into the trace's dimensions (empty for a trace
    made from the annotations themselves); `values` are the call's sizes, when known.
    A symbol against another symbol must be the same symbol; a size against a symbol, or an
    expression Tessera cannot reason about, is compared by value at the call. A symbol only
    the return annotation names takes whatever size comes out."""
    spec = sig.ret_spec
    if spec is None or spec.dims is None:
        return
    if len(outputs) != 1:
        raise ShapeError(f"{sig.name} returns {len(outputs)} tensors; the annotation one",
                         function=sig.name, location=sig.def_loc)
    t, node = outputs[0]
    known = sig.annotated_symbols() | set(translate)
    fresh = {}
    ok = t.rank == len(spec.dims) and (spec.dtype is None or spec.dtype == t.dtype)
    for want, got in zip(spec.dims, t.shape) if ok else ():
        name = str(want)
        if isinstance(want, Sym) and name not in known:
            ok &= same(fresh.setdefault(name, got), got)
            continue
        w = translate.get(name, want) if isinstance(want, Sym) else want
        if same(w, got):
            continue
        if isinstance(w, int) and isinstance(got, int):
            ok = False
        elif isinstance(w, Sym) and isinstance(got, Sym) and not (_opaque(w) or _opaque(got)):
            ok = False
        elif values is not None:
            try:
                ok &= evaluate(w, values) == evaluate(got, values)
            except KeyError:
                pass
    if not ok:
        hint = None
        if t.rank < len(spec.dims) and reduced:
            hint = "did you forget keepdim=True?"
        elif t.rank == len(spec.dims) and sorted(map(str, t.shape)) == sorted(map(str, spec.dims)):
            hint = "the dimensions are all there in another order: a missing transpose?"
        received = str(t)
        syms = sorted({a for d in t.shape if isinstance(d, Sym) for a in d.atoms()
                       if values and a in values})
        if syms:
            received += " with " + ", ".join(f"{a}={values[a]}" for a in syms)
        raise ShapeError("the result does not match the return annotation",
                         function=sig.name, location=node.loc if node else sig.def_loc,
                         op=node.op if node else None, expected=spec.type_str(t.dtype),
                         received=received, hint=hint)


def check_graph_return(sig: Signature, g: Graph, translate: dict, values):
    check_return(sig, [(v.type, v.node) for v in g.outputs], translate, values, has_reduction(g))


def inline(sig: Signature, fn, args, kwargs):
    """A call on traced tensors from inside another tessera function: the annotations checked
    against the traced types, then the body traced into the caller's graph."""
    bound = sig.bind_python(args, kwargs)
    bindings, origin = {}, {}
    for p in sig.params:
        x = bound.arguments[p.name]
        if p.spec is not None and isinstance(x, Traced):
            sig.check_spec(p, x.shape, x.dtype, bindings, origin)
    with _policy_region(sig):
        result = fn(*bound.args, **bound.kwargs)
    if sig.ret_spec is not None and isinstance(result, Traced):
        check_return(sig, [(result.type, result._value.node)], bindings, None,
                     has_reduction_upto(result._value))
    return result


def _policy_region(sig: Signature):
    """The function's own policy around its body (nothing when it has none)."""
    return numerics.policy(sig.policy) if sig.policy is not None else contextlib.nullcontext()


def inside_trace(args, kwargs) -> bool:
    """Is any argument, or any leaf of a container argument, a traced tensor? (Arrays are
    checked directly: this runs on every call.)"""
    for a in (*args, *kwargs.values()):
        if isinstance(a, Traced):
            return True
        if isinstance(a, (dict, list, tuple)) and \
                any(isinstance(leaf, Traced) for leaf in pytree.leaves(a)):
            return True
    return False


def raising_user_line(e: BaseException):
    """Where in the user's code an exception raised inside the library came from: the
    innermost frame of its traceback outside the tessera package."""
    loc, tb = None, e.__traceback__
    while tb is not None:
        if not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PKG_DIR):
            loc = frame_location(tb.tb_frame, tb.tb_lineno)
        tb = tb.tb_next
    return loc


def _is_nested(result) -> bool:
    return isinstance(result, dict) or isinstance(result, (list, tuple)) and any(
        pytree.is_container(r) for r in result)


def _opaque(d) -> bool:
    """A dimension holding an expression Tessera cannot reason about, such as (D//3)."""
    return isinstance(d, Sym) and d.opaque()


def has_reduction_upto(v) -> bool:
    seen, stack = set(), [v]
    while stack:
        x = stack.pop()
        if x.node is None or x.id in seen:
            continue
        seen.add(x.id)
        if x.node.attrs.get("keepdim") is False:
            return True
        stack.extend(x.node.inputs)
    return False


def has_reduction(g: Graph) -> bool:
    """Does the graph reduce away an axis (a keepdim=False reduction) on the way to its outputs?"""
    return any(has_reduction_upto(v) for v in g.outputs)
