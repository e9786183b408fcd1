"""Automatic differentiation: ``grad``, ``value_and_grad``, ``vjp``, ``jvp``, ``laplacian`` and
``check_grad``.

    loss_grad = ts.grad(loss, argnums=0)        # a tessera Function
    g = loss_grad(params, x, y)                 # compiled (per shapes, cached), on NumPy arrays
    print(loss_grad.lower(params, x, y).graph_ir)   # forward and backward in one Graph IR

Each transform returns a tessera ``Function`` whose body runs the differentiated function
inline and then its backward (tessera/compiler/backward.py), so everything a Function does
works: called on arrays it traces, compiles and caches like any other; called inside another
trace (``ts.function(train_step)``, or a grad of a grad) it inlines; ``.graph_ir`` (annotated
functions), ``.lower(*args)`` and ``.interpret(*args)`` show and check it.

Decisions:
* ``argnums`` (an int or a tuple of ints) picks positional parameters; an argument may be a
  pytree (nested dicts/lists/tuples of arrays) and its gradient has the same structure.
* No gradient is ``None``: for an integer or bool argument (or leaf), and a static value in a
  pytree. A float argument the result does not depend on gets zeros. A Python number passed
  where a gradient is asked becomes a float64 array.
* ``grad`` needs a float scalar result (rank 0, or every axis of size 1).
* A numerical policy's ``loss_scale`` s (on the function, or the region it is traced in):
  the backward starts from s instead of 1 and the gradients are divided by s at the end.
* ``jvp`` is the transpose trick, not forward-mode rules: the vjp map u -> J^T u is linear, so
  its own vjp with cotangent t is J t. It needs only the adjoint rules (and their adjoints,
  which the higher-order tests check), and costs about a forward and two backward passes.
* ``laplacian`` is grad of grad over unit vectors, no Hessian: d+1 backward passes for d
  input features (CSE shares the common forward and first backward when compiled).
* Inlined into a caller, the differentiated arguments get fresh SSA values (a cast to their
  own dtype, removed when compiled), so the caller's other uses of the same tensor (a closure
  over it) stay constants: ``grad(lambda y: y * x)(x)`` is ``x``, not ``2 x``.
"""
from __future__ import annotations

import inspect

import numpy as np

from . import dtypes as dt, numerics, pytree
from .compiler import backward as _ad
from .errors import ArgumentError, DifferentiationError, GradientCheckError
from .function import Function, TreeArg, def_location, evaluate_graph
from .shapes import same
from .trace import Traced, apply, current_trace, user_location
from .types import type_of_array

__all__ = ["grad", "value_and_grad", "vjp", "jvp", "laplacian", "check_grad"]


# ---- the Function a transform returns --------------------------------------------------------
class Transformed(Function):
    """A tessera Function made by a transform of ``transformed`` (grad, vjp, jvp, ...)."""
    _may_return_none = True

    def __init__(self, body, transformed, name: str, sig: inspect.Signature, wrt=(),
                 schedule=None):
        body.__signature__ = sig
        body.__name__ = body.__qualname__ = name
        base = transformed.fn if isinstance(transformed, Function) else transformed
        body.__doc__ = getattr(base, "__doc__", None)
        super().__init__(body, name=name, target=getattr(transformed, "target", "cpu"),
                         schedule=schedule or getattr(transformed, "schedule", None))
        self.signature.def_loc = def_location(base) or self.signature.def_loc
        # a dynamic function's transform is dynamic in the same symbols (compiler/dynamic.py)
        self.programs.dynamic = tuple(
            s for s in getattr(transformed, "dynamic", ()) if s in self.symbols())
        self.transformed = transformed
        self._wrt = tuple(wrt)                # parameter names whose leaves are differentiated

    def _bind(self, args, kwargs):
        bound = self.signature.bind_python(args, kwargs)
        for name in self._wrt:                # a Python number asked for a gradient: an array
            x = bound.arguments[name]
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                bound.arguments[name] = np.asarray(float(x))
        return super()._bind(bound.args, bound.kwargs)

    def _inline(self, args, kwargs):
        bound = self.signature.bind_python(args, kwargs)
        for name in self._wrt:                # fresh values: see the module's docstring
            x = bound.arguments[name]
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                x = np.asarray(float(x))      # as _bind does
            bound.arguments[name] = pytree.tree_map(_fresh, x)
        return super()._inline(bound.args, bound.kwargs)

    def with_schedule(self, schedule) -> "Transformed":
        return Transformed(self.fn, self.transformed, self.name, self.signature.sig, self._wrt,
                           schedule=schedule)


def _fresh(x):
    """A differentiated leaf, inlined: a new SSA value (a float NumPy array becomes one too,
    so it gets a gradient like a traced tensor; a Python number in a pytree stays static)."""
    if isinstance(x, Traced):
        return apply("cast", x, dtype=x.dtype.name) if x.dtype.is_inexact else x
    if _is_float_array(x):
        trace = current_trace()
        return Traced(trace.graph.const(np.asarray(x)), trace)
    return x


def _derived(fn, key, make):
    """One transformed Function per (fn, transform), kept on fn itself, so ts.grad(f) in a
    loop compiles once (and is collected with f)."""
    table = getattr(fn, "__dict__", {}).get("_tessera_derived")
    if table is None:
        table = {}
        try:
            fn._tessera_derived = table
        except (AttributeError, TypeError):
            return make()
    if key not in table:
        table[key] = make()
    return table[key]


def _signature(fn) -> inspect.Signature:
    if isinstance(fn, Function):
        sig = fn.signature.sig
    else:
        if not callable(fn):
            raise ArgumentError(f"differentiation needs a function, got {fn!r}")
        try:
            sig = inspect.signature(fn, eval_str=True)
        except (NameError, TypeError, ValueError) as e:
            raise ArgumentError(f"cannot read the signature of {_name(fn)}: {e}") from None
    return sig.replace(return_annotation=inspect.Signature.empty)


def _name(fn) -> str:
    return fn.name if isinstance(fn, Function) else getattr(fn, "__name__", "f").replace(
        "<lambda>", "lambda").strip("<>")


def _positional(sig) -> list[str]:
    return [p.name for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _argnums(argnums, names, fname):
    single = not isinstance(argnums, (tuple, list))
    nums = (argnums,) if single else tuple(argnums)
    for k in nums:
        if not isinstance(k, int) or isinstance(k, bool) or not -len(names) <= k < len(names):
            raise ArgumentError(f"argnums {argnums!r} does not name positional parameters of "
                                f"{fname}", expected=f"integers in [0, {len(names)})",
                                received=repr(argnums))
    return tuple(k % len(names) for k in nums), single


def _full_like(t: Traced, value):
    """A tensor of t's shape and dtype filled with a number (symbolic sizes allowed)."""
    c = Traced(t._trace.graph.const(dt.convert(value, t.dtype)), t._trace)
    return apply("broadcast_to", c, shape=list(t.shape))


def _float_leaf(x) -> bool:
    return isinstance(x, Traced) and x.dtype.is_inexact


def _backward(trace, start, end, outputs, seeds, wrt, fname) -> list:
    """compiler.backward.backward on this trace's graph: Traced in, Traced (or None) out."""
    cts = _ad.backward(trace.graph, start, end, [o._value for o in outputs],
                       [None if s is None else s._value for s in seeds],
                       [w._value for w in wrt], fname, loc=user_location())
    return [None if c is None else Traced(c, trace) for c in cts]


def _gradients(trace, start, end, outputs, seeds, trees, fname):
    """Cotangents of every float leaf of ``trees`` (pytrees of Traced), as trees of the same
    structure (None where a leaf has no gradient)."""
    flat = [(leaves, td) for leaves, td in map(pytree.flatten, trees)]
    wrt = [x for leaves, _ in flat for x in leaves if _float_leaf(x)]
    cts = iter(_backward(trace, start, end, outputs, seeds, wrt, fname))
    return [_fill(leaves, td, cts) for leaves, td in flat]


def _fill(leaves, td, values):
    """The tree for `leaves` holding the next of `values` at each float leaf (zeros where it is
    None: nothing depends on that leaf) and None at the others."""
    values, out = iter(values), []
    for x in leaves:
        if _float_leaf(x):
            c = next(values)
            out.append(_full_like(x, 0) if c is None else c)
        else:
            out.append(None)
    return td.unflatten(out)


def _as_traced(x, trace) -> Traced | None:
    if isinstance(x, Traced):
        return x
    try:
        arr = np.asarray(x)
    except Exception:
        return None
    if arr.dtype.kind not in "fiub":
        return None
    return Traced(trace.graph.const(arr), trace)


def _trace_or_fail(fname):
    trace = current_trace()
    if trace is None:      # only reachable by calling a transform's body directly
        raise DifferentiationError("a transform's body runs inside a trace", function=fname)
    return trace


# ---- grad / value_and_grad ----------------------------------------------------------------------
def grad(fn, argnums=0, has_aux=False) -> Function:
    """The gradient of ``fn`` (a float scalar result) with respect to argument(s) ``argnums``.

    Returns a tessera Function: ``ts.grad(f)(x)`` has x's shape (or pytree structure);
    ``argnums=(0, 1)`` gives a tuple; ``has_aux=True``: ``fn`` returns ``(loss, aux)`` and the
    gradient comes as ``(grads, aux)``."""
    key = ("grad", argnums if isinstance(argnums, int) else tuple(argnums), bool(has_aux))
    return _derived(fn, key, lambda: _make_grad(fn, argnums, has_aux, False))


def value_and_grad(fn, argnums=0, has_aux=False) -> Function:
    """Like ``grad``, returning ``(value, grads)`` (with ``has_aux``: ``((value, aux), grads)``)
    from one trace: the forward is computed once."""
    key = ("value_and_grad", argnums if isinstance(argnums, int) else tuple(argnums),
           bool(has_aux))
    return _derived(fn, key, lambda: _make_grad(fn, argnums, has_aux, True))


def _make_grad(fn, argnums, has_aux, with_value):
    sig = _signature(fn)
    fname = _name(fn)
    names = _positional(sig)
    nums, single = _argnums(argnums, names, fname)
    wrt = [names[k] for k in nums]

    def body(*args, **kwargs):
        trace = _trace_or_fail(fname)
        bound = sig.bind(*args, **kwargs)
        start = len(trace.graph.nodes)
        out = fn(*bound.args, **bound.kwargs)
        end = len(trace.graph.nodes)
        aux = None
        if has_aux:
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise DifferentiationError(f"{fname} must return (loss, aux) with has_aux=True",
                                           function=fname, received=type(out).__name__)
            out, aux = out
        loss = _scalar_result(out, trace, fname)
        scale = _loss_scale(fn)
        grads = _gradients(trace, start, end, [loss], [_full_like(loss, scale)],
                           [bound.arguments[n] for n in wrt], fname)
        if scale != 1.0:        # the backward ran on loss * scale: its gradients, unscaled
            grads = [pytree.tree_map(lambda g: g if g is None else apply("div", g, scale), t)
                     for t in grads]
        grads = grads[0] if single else tuple(grads)
        if with_value:
            return ((loss, aux) if has_aux else loss), grads
        return (grads, aux) if has_aux else grads

    prefix = "value_and_grad" if with_value else "grad"
    return Transformed(body, fn, f"{prefix}_{fname}", sig, wrt)


def _loss_scale(fn) -> float:
    """The loss scale of fn's numerical policy, else of the region it is traced in (1.0:
    none). The backward starts from this cotangent instead of 1, which is differentiating
    loss * scale: small gradients of narrow dtypes keep their bits instead of flushing to 0."""
    policy = getattr(fn, "policy", None) or numerics.current()
    return 1.0 if policy is None else policy.loss_scale


def _scalar_result(out, trace, fname) -> Traced:
    t = _as_traced(out, trace)
    if t is None or not t.dtype.is_float:
        raise DifferentiationError(f"grad needs a float scalar result; {fname} returned "
                                   f"{t.type if t is not None else type(out).__name__}",
                                   function=fname, hint="return a loss (op.sum or op.mean of "
                                   "the values), or use ts.vjp for other results")
    if not all(isinstance(d, int) and d == 1 for d in t.shape):
        raise DifferentiationError(f"grad needs a scalar result; {fname} returned {t.type}",
                                   function=fname, expected="a rank-0 tensor",
                                   received=str(t.type),
                                   hint="reduce it (op.sum, op.mean), or use ts.vjp")
    return t


# ---- vjp / jvp ----------------------------------------------------------------------------------
def vjp(fn, *primals, has_aux=False):
    """``(out, vjp_fn)``: ``fn(*primals)`` and the function taking a cotangent of ``out``
    (same structure; a Python number for a scalar) to the cotangents of every primal, as a
    tuple (None for integer primals). ``vjp_fn.function`` is the tessera Function it calls,
    of (*primals, cotangent). With ``has_aux``: ``(out, vjp_fn, aux)``."""
    n = len(primals)
    back = _derived(fn, ("vjp", n, bool(has_aux)), lambda: _make_vjp(fn, n, has_aux))
    out = _forward(fn)(*primals)
    aux = None
    if has_aux:
        out, aux = out

    def vjp_fn(cotangent):
        return back(*primals, cotangent)

    vjp_fn.function = back
    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def _forward(fn) -> Function:
    return fn if isinstance(fn, Function) else _derived(fn, ("forward",), lambda: Function(fn))


def _primal_signature(sig, n, extra, fname):
    names = _positional(sig)
    if n > len(names):
        raise ArgumentError(f"{fname} takes {len(names)} positional arguments, got {n} primals")
    params = [p.replace(default=inspect.Parameter.empty,
                        kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
              for p in list(sig.parameters.values())[:n]]
    taken = {p.name for p in params}
    for base in extra:
        name = base
        while name in taken:
            name += "_"
        taken.add(name)
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD))
    return inspect.Signature(params), [p.name for p in params]


def _seed(x, like: Traced, what, fname):
    """A user's cotangent/tangent leaf as a Traced of ``like``'s shape."""
    if not isinstance(x, Traced):
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return _full_like(like, x)
        x = _as_traced(x, like._trace)
    if x is None or len(x.shape) != len(like.shape) or not all(
            same(a, b) for a, b in zip(x.shape, like.shape)):
        raise ArgumentError(f"the {what} does not match the value it belongs to",
                            function=fname, expected=str(like.type),
                            received=str(x.type) if x is not None else "no array")
    return x


def _match(tree, like_td, what, fname):
    """The leaves of a user's cotangent/tangent tree, which must have the value's structure."""
    if not isinstance(tree, (dict, list, tuple)) and like_td.kind == "leaf":
        return [tree]
    leaves, td = pytree.flatten(tree)
    if td != like_td:
        raise ArgumentError(f"the {what} has the structure {td}, the value {like_td}",
                            function=fname)
    return leaves


def _make_vjp(fn, n, has_aux):
    fname = _name(fn)
    sig, names = _primal_signature(_signature(fn), n, ["cotangent"], fname)

    def body(*args, **kwargs):
        trace = _trace_or_fail(fname)
        bound = sig.bind(*args, **kwargs)
        primals = [bound.arguments[k] for k in names[:n]]
        start = len(trace.graph.nodes)
        out = fn(*primals)
        end = len(trace.graph.nodes)
        if has_aux:
            out = out[0]
        leaves, td = pytree.flatten(out)
        cts = _match(bound.arguments[names[n]], td, "cotangent", fname)
        outs, seeds = [], []
        for x, c in zip(leaves, cts):
            if _float_leaf(x) and c is not None:
                outs.append(x)
                seeds.append(_seed(c, x, "cotangent", fname))
        return tuple(_gradients(trace, start, end, outs, seeds, primals, fname))

    return Transformed(body, fn, f"vjp_{fname}", sig, names[:n])


def jvp(fn, primals, tangents):
    """``(fn(*primals), J t)``: the directional derivative along ``tangents`` (one per primal,
    same structures), by the transpose trick (see the module's docstring). Integer results get
    a None tangent."""
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ArgumentError(f"jvp got {len(primals)} primals and {len(tangents)} tangents")
    n = len(primals)
    return _derived(fn, ("jvp", n), lambda: _make_jvp(fn, n))(*primals, *tangents)


def _make_jvp(fn, n):
    fname = _name(fn)
    base = _signature(fn)
    sig, names = _primal_signature(base, n, [f"t_{k}" for k in _positional(base)[:n]], fname)

    def body(*args, **kwargs):
        trace = _trace_or_fail(fname)
        g = trace.graph
        bound = sig.bind(*args, **kwargs)
        primals = [bound.arguments[k] for k in names[:n]]
        start = len(g.nodes)
        out = fn(*primals)
        end = len(g.nodes)
        leaves, td = pytree.flatten(out)
        outs = [x for x in leaves if _float_leaf(x)]
        us = [_full_like(x, 0) for x in outs]          # any point: the vjp map is linear in u
        mid = len(g.nodes)
        wrt = [x for p in primals for x in pytree.leaves(p) if _float_leaf(x)]
        cts = _backward(trace, start, end, outs, us, wrt, fname)          # J^T u
        stop = len(g.nodes)
        pairs = []                                      # (primal leaf, its tangent), as wrt
        for k, p in enumerate(primals):
            pl, ptd = pytree.flatten(p)
            tl = _match(bound.arguments[names[n + k]], ptd, "tangent", fname)
            pairs += [(x, t) for x, t in zip(pl, tl) if _float_leaf(x)]
        outs2, seeds2 = [], []
        for (x, t), c in zip(pairs, cts):
            if c is not None and t is not None:
                outs2.append(c)
                seeds2.append(_seed(t, x, "tangent", fname))
        jt = _backward(trace, mid, stop, outs2, seeds2, us, fname)   # J t
        return out, _fill(leaves, td, jt)

    return Transformed(body, fn, f"jvp_{fname}", sig, names[:n])


# ---- laplacian ----------------------------------------------------------------------------------
def laplacian(fn, argnum: int = 0) -> Function:
    """sum_i d^2 fn / dx_i^2, i over the last axis of argument ``argnum``.

    For ``x`` of shape [d] and a scalar ``fn`` it is the Laplacian. For a batch of points
    ``x`` [..., d] and ``fn`` giving one value per point ([...] or [..., 1]), it is each point's
    Laplacian, provided each point's value depends on its own row only (an MLP applied row-wise,
    as in a PINN): the derivatives are taken of the sum over the batch. The result has the
    shape of ``fn``'s. Grad of grad over the d unit vectors; d must be a concrete size."""
    return _derived(fn, ("laplacian", argnum), lambda: _make_laplacian(fn, argnum))


def _make_laplacian(fn, argnum):
    from . import op
    sig = _signature(fn)
    fname = _name(fn)
    names = _positional(sig)
    (argnum,), _ = _argnums(argnum, names, fname)
    forward = _forward(fn)

    def with_sig(f, name):
        f.__signature__, f.__name__ = sig, name
        return f

    def body(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        x = bound.arguments[names[argnum]]
        if not isinstance(x, Traced) or not x.dtype.is_float:
            raise DifferentiationError("laplacian needs a float tensor argument", function=fname)
        out = forward(*bound.args, **bound.kwargs)
        first = _make_grad(with_sig(lambda *a, **k: op.sum(forward(*a, **k)), fname), argnum,
                           False, False)
        d = x.shape[-1] if x.ndim else 1
        if not isinstance(d, int):
            raise DifferentiationError(f"laplacian needs a concrete size for the last axis, not "
                                       f"{d}", function=fname, received=str(x.type))
        total = None
        for i in range(d):
            unit = np.zeros(d if x.ndim else (), dtype=x.dtype.np)
            unit[i if x.ndim else ()] = 1

            def along(*a, _unit=unit, **k):          # d/dx_i of the (summed) value
                return op.sum(first(*a, **k) * _unit)
            h = _make_grad(with_sig(along, fname), argnum, False, False)(*bound.args,
                                                                          **bound.kwargs)
            term = op.sum(h * unit, axis=-1) if x.ndim else h
            total = term if total is None else total + term
        if tuple(total.shape) != tuple(out.shape):
            total = total.reshape(list(out.shape))
        return total

    return Transformed(body, fn, f"laplacian_{fname}", sig)


# ---- check_grad ---------------------------------------------------------------------------------
_F64_EPS = float(np.finfo(np.float64).eps)
_FD_ULPS = 4.0


def check_grad(fn, *args, argnums=None, eps=1e-6, rtol=1e-5, atol=1e-8, seed=0) -> float:
    """Check ``fn``'s compiled gradient against central finite differences, in float64.

    Float arguments (and pytree leaves) are cast to float64. A result that is not a scalar
    (or several results) is reduced to one by a fixed random quadratic form, sum(r1 out +
    r2 out^2 / 2), so any function can be checked, and its backward graph runs compiled even
    where the function is linear. The analytic gradient is the compiled ``ts.grad``; the finite
    differences evaluate the forward with the interpreter (the NumPy references, traced once),
    with the step ``eps * max(1, |x|)``. ``argnums`` defaults to every argument holding a float.

    Returns the largest absolute difference; raises ``GradientCheckError`` (an AssertionError)
    naming the worst element, with both values, where |analytic - numeric| > atol + rtol *
    max(|analytic|, |numeric|) + the central difference's rounding noise (4 ulps of
    |f(x+h)| + |f(x-h)|, over the step 2h: a large function value makes the numeric side noisy)."""
    args = tuple(pytree.tree_map(_to_f64, a) for a in args)
    F = _forward(fn)
    fname = F.name
    if argnums is None:
        argnums = tuple(k for k, a in enumerate(args)
                        if any(_is_float_array(x) for x in pytree.leaves(a)))
        if not argnums:
            raise ArgumentError(f"check_grad: no argument of {fname} holds a float array")
    nums, _ = _argnums(argnums, list(range(len(args))), fname)
    sig = _signature(F)

    out_leaves = pytree.leaves(F.interpret(*args))
    rng = np.random.default_rng(seed)
    scalar = len(out_leaves) == 1 and np.ndim(out_leaves[0]) == 0 and \
        not np.iscomplexobj(out_leaves[0])
    weights = [(rng.standard_normal(np.shape(o)), rng.standard_normal(np.shape(o)))
               if _is_float_array(o) and not scalar else None for o in out_leaves]

    def projected(*a, **k):
        # sum(r1 y + r2 y^2 / 2): the cotangent r1 + r2 y depends on the result, so the
        # backward of a linear function is not folded to a constant but compiled and run
        from . import op
        ys = pytree.leaves(F(*a, **k))
        if scalar:
            return ys[0]
        total = 0.0
        for y, w in zip(ys, weights):
            if w is not None and y.dtype.is_complex:     # a real function of its parts
                re, im = op.real(y), op.imag(y)
                total = total + op.sum(re * w[0]) + op.sum(re * im * (w[1] / 2))
            elif w is not None:
                total = total + op.sum(y * w[0]) + op.sum(y * y * (w[1] / 2))
        return total
    projected.__signature__ = sig
    S = Function(projected, name=f"{fname}_projected")

    analytic = grad(S, argnums=nums)(*args)           # a tuple: nums is one
    # the forward, traced once at these shapes, evaluated by the interpreter per perturbation
    arrays, statics, bindings = S._bind(args, {})
    graph = S._trace({k: type_of_array(a) for k, a in arrays.items()}, statics, bindings)
    keys = list(arrays)
    base = [arrays[k] for k in keys]

    def value(k, arr):
        vals = list(base)
        vals[k] = arr
        return float(evaluate_graph(graph, vals)[0]) if graph.outputs else 0.0

    names = list(S.signature.sig.parameters)
    worst = (0.0, None)
    for pos, g_tree in zip(nums, analytic):
        tree = statics.get(names[pos])
        slots = tree.slots if isinstance(tree, TreeArg) else [("param", names[pos])]
        td = pytree.flatten(args[pos])[1]
        paths = td.paths() if isinstance(tree, TreeArg) else [()]
        g_leaves = pytree.leaves(g_tree) if isinstance(tree, TreeArg) else [g_tree]
        g_iter = iter(g_leaves)
        for (kind, key), path in zip(slots, paths):
            if kind != "param":
                continue
            x = arrays[key]
            if x.dtype.kind not in "fc":        # no gradient (None, not in g_leaves)
                continue
            got = next(g_iter)
            k = keys.index(key)
            for idx in np.ndindex(x.shape):
                # a complex element's gradient is d/dre + i d/dim (PyTorch's convention)
                want, noise = 0.0, 0.0
                for unit in ((1.0, 1j) if x.dtype.kind == "c" else (1.0,)):
                    h = eps * max(1.0, abs(x[idx]))
                    xp, xm = x.copy(), x.copy()
                    xp[idx] += h * unit
                    xm[idx] -= h * unit
                    step = ((xp[idx] - xm[idx]) / unit).real      # (exact, as stored)
                    fp, fm = value(k, xp), value(k, xm)
                    want += unit * (fp - fm) / step
                    # the difference's own rounding: a few ulps of |f| over the step (at
                    # |f| = 1.4e4 and a step of 2e-6 it was off by 1.5e-6)
                    noise += _FD_ULPS * _F64_EPS * (abs(fp) + abs(fm)) / step
                a = np.asarray(got)[idx]
                a, want = (complex(a), complex(want)) if x.dtype.kind == "c" else \
                    (float(a), float(want))
                err = abs(a - want)
                if not err <= atol + rtol * max(abs(a), abs(want)) + noise:   # NaN fails
                    where = f"argument {names[pos]!r}{_path(path)}[{', '.join(map(str, idx))}]"
                    raise GradientCheckError(
                        f"the gradient of {fname} disagrees with finite differences at {where}",
                        function=fname, expected=f"{want!r} (central difference, step {h:.1e})",
                        received=f"{a!r} (compiled gradient); |difference| {err:.3g} > "
                                 f"{atol:g} + {rtol:g} * |value| + {noise:.2g} (rounding)")
                if err > worst[0]:
                    worst = (err, idx)
    return worst[0]


def _path(path) -> str:
    return "".join(f"[{k!r}]" for k in path)


def _is_float_array(x) -> bool:
    """A float or complex array: one that gets a gradient."""
    return isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in "fc"


def _to_f64(x):
    if isinstance(x, float) or _is_float_array(x):
        return np.asarray(x, dtype=np.complex128 if np.iscomplexobj(x) else np.float64)
    return x
