"""JAX functions as tessera functions: ``ts.from_jax(fn, *example_args)``.

    f = ts.from_jax(jax_fn, params, x)        # jax.make_jaxpr, then primitives onto the registry
    y = f(params, x)                          # compiled like any tessera function
    g = ts.grad(lambda p, x: op.sum(f(p, x)))(params, x)

``jax.make_jaxpr`` traces the function on the example arguments (arrays, or pytrees of them:
dicts, lists, tuples) into a jaxpr; each of its primitives maps onto tessera operators (the
table `PRIMITIVES` below, one entry per primitive), traced into a tessera ``Function`` with the
same parameters, taking and returning the same pytrees. Calls inside the jaxpr (``jit``,
``custom_jvp_call``, ``custom_vjp_call``, ``remat``) are inlined: their bodies are primitives
too, and tessera differentiates the result with its own rules. Shapes and dtypes are those of
the example arguments (a new shape is a new conversion), as for ``jax.jit``.

What differs from JAX, on purpose: an index out of range in a gather is tessera's
``RuntimeFault``, where JAX clamps or fills; results agree with JAX's within rounding (JAX's
CPU backend sums matrix products in its own order). A primitive without an entry is a
``TesseraError`` listing every unsupported primitive of the function at once, each with the
line of the JAX code that made it.
"""
from __future__ import annotations

import inspect

import numpy as np

from . import dtypes as dt
from . import op
from .errors import ArgumentError, TesseraError
from .function import Function
from .trace import dtype_of


def _shape(x):
    return tuple(np.shape(x)) if not hasattr(x, "shape") else tuple(x.shape)


def _dtype(d) -> str:
    return dt.get(np.dtype(d).name).name


def _reshape(x, shape):
    return x if _shape(x) == tuple(shape) else op.reshape(x, shape=[int(s) for s in shape])


def _transpose(x, perm):
    return x if list(perm) == list(range(len(perm))) else op.transpose(x, perm=list(perm))


def _dot_general(lhs, rhs, dimension_numbers, preferred_element_type=None, **_):
    """A contraction as one batched matmul: lhs to (batch, free, contracted), rhs to (batch,
    contracted, free), each flattened to a matrix per batch; the result in JAX's order
    (batch, lhs free, rhs free)."""
    (lc, rc), (lb, rb) = dimension_numbers
    ls, rs = _shape(lhs), _shape(rhs)
    lfree = [d for d in range(len(ls)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rs)) if d not in rc and d not in rb]
    if preferred_element_type is not None:
        want = _dtype(preferred_element_type)
        lhs = lhs if dtype_of(lhs).name == want else op.cast(lhs, want)
        rhs = rhs if dtype_of(rhs).name == want else op.cast(rhs, want)
    batch = [ls[d] for d in lb]
    size = lambda dims, s: int(np.prod([s[d] for d in dims], dtype=np.int64))    # noqa: E731
    a = _reshape(_transpose(lhs, list(lb) + lfree + list(lc)),
                 batch + [size(lfree, ls), size(lc, ls)])
    b = _reshape(_transpose(rhs, list(rb) + list(rc) + rfree),
                 batch + [size(rc, rs), size(rfree, rs)])
    return _reshape(op.matmul(a, b), batch + [ls[d] for d in lfree] + [rs[d] for d in rfree])


def _broadcast_in_dim(x, shape, broadcast_dimensions, **_):
    kept = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        kept[dst] = _shape(x)[src]
    x = _reshape(x, kept)
    return x if tuple(kept) == tuple(shape) else op.broadcast_to(x, shape=[int(s) for s in shape])


def _integer_pow(x, y):
    """x ** y by repeated squaring, the multiplications JAX makes (so the same bits)."""
    n, acc = abs(y), None
    if n == 0:
        return op.broadcast_to(np.ones((), dtype_of(x).np), shape=list(_shape(x)))
    base = x
    while n:
        if n & 1:
            acc = base if acc is None else acc * base
        n >>= 1
        if n:
            base = base * base
    return op.div(1, acc) if y < 0 else acc


def _div(a, b):
    return op.trunc_divide(a, b) if dtype_of(a).is_int else op.div(a, b)


def _select_n(which, *cases):
    if len(cases) == 2 and dtype_of(which).is_bool:
        return op.where(which, cases[1], cases[0])
    out = cases[0]
    for i, c in enumerate(cases[1:], 1):
        out = op.where(which == i, c, out)
    return out


def _bools(name, fn):
    def rule(*xs):
        if not all(dtype_of(x).is_bool for x in xs):
            raise TesseraError(f"jax.lax.{name} of integers (bitwise) is not mapped: tessera "
                               "has no bitwise operators")
        return fn(*xs)
    return rule


def _round(x, rounding_method=1):
    even = op.round(x)
    if int(rounding_method) == 1:                   # to nearest even, as tessera's round
        return even
    trunc = op.where(x < 0, op.ceil(x), op.floor(x))  # away from zero on ties
    return op.where(op.abs(x - trunc) == 0.5, trunc + op.sign(x), even)


def _iota(dtype, shape, dimension, **_):
    line = np.arange(shape[dimension], dtype=dt.get(_dtype(dtype)).np)
    kept = [1] * len(shape)
    kept[dimension] = shape[dimension]
    return np.ascontiguousarray(np.broadcast_to(line.reshape(kept), shape))


def _slice(x, start_indices, limit_indices, strides=None):
    return op.slice(x, starts=list(start_indices), stops=list(limit_indices),
                    steps=list(strides) if strides else [1] * len(start_indices))


def _rev(x, dimensions):
    rank = len(_shape(x))
    return op.slice(x, starts=[None] * rank, stops=[None] * rank,
                    steps=[-1 if d in dimensions else 1 for d in range(rank)])


def _pad(x, value, padding_config):
    for axis, (lo, hi, interior) in enumerate(padding_config):
        if int(interior) or lo < 0 or hi < 0:
            raise TesseraError("jax.lax.pad with interior or negative padding is not mapped")
        parts = []
        for n in (int(lo), None, int(hi)):
            if n is None:
                parts.append(x)
            elif n:
                shape = list(_shape(x))
                shape[axis] = n
                parts.append(op.broadcast_to(op.cast(value, dtype_of(x).name), shape=shape))
        x = parts[0] if len(parts) == 1 else op.concat(parts, axis=axis)
    return x


def _split(x, sizes, axis):
    return op.split(x, list(np.cumsum(sizes)[:-1]), axis=axis)


def _gather(x, idx, dimension_numbers, slice_sizes, **_):
    """The gather of `x[ids]`, `jnp.take(x, ids, axis=0)` and embedding lookups: whole rows of
    axis 0 picked by the last index column; other forms are not mapped."""
    d = dimension_numbers
    shape = _shape(x)
    rows = tuple(slice_sizes) == (1,) + shape[1:]
    out_rank = len(_shape(idx)) - 1 + len(shape) - 1
    if not (tuple(d.collapsed_slice_dims) == (0,) and tuple(d.start_index_map) == (0,)
            and not tuple(getattr(d, "operand_batching_dims", ())) and rows
            and _shape(idx)[-1:] == (1,)
            and tuple(d.offset_dims) == tuple(range(out_rank - len(shape) + 1, out_rank))):
        raise TesseraError(f"this form of jax.lax.gather is not mapped ({d})",
                           hint="tessera maps gathers of whole rows along axis 0 "
                                "(x[ids], jnp.take(x, ids, axis=0))")
    return op.take(x, _reshape(idx, _shape(idx)[:-1]), axis=0)


def _start(s, n, k):
    """A slice's start clamped into [0, n - k], as JAX clamps it (a literal stays a number)."""
    if isinstance(s, np.ndarray) and s.ndim == 0:
        return min(max(int(s), 0), n - k)
    return op.clamp(op.cast(s, "int64"), 0, n - k)


def _dynamic_slice(x, *starts, slice_sizes):
    """The window of `slice_sizes` at `starts` (scalars, traced or not): a static slice where
    the start is known, else a take of the window's indices along that axis."""
    for d, (s, k) in enumerate(zip(starts, slice_sizes)):
        n = _shape(x)[d]
        if k == n:
            continue
        at = _start(s, n, k)
        if isinstance(at, int):
            x = op.slice(x, starts=[at if j == d else None for j in range(len(_shape(x)))],
                         stops=[at + k if j == d else None for j in range(len(_shape(x)))],
                         steps=[1] * len(_shape(x)))
        else:
            x = op.take(x, at + np.arange(k, dtype=np.int64), axis=d)
    return x


def _dynamic_update_slice(x, update, *starts):
    """x with `update` written at `starts` (clamped as JAX does): the update spread over x's
    shape by a take per axis, then selected where each axis is inside the window."""
    inside, spread = None, update
    for d, s in enumerate(starts):
        n, k = _shape(x)[d], _shape(update)[d]
        pos = np.arange(n, dtype=np.int64) - _start(s, n, k)       # (a number or traced)
        spread = op.take(spread, op.clamp(pos, 0, k - 1), axis=d)
        here = op.minimum(pos >= 0, pos < k)
        shape = [1] * len(_shape(x))
        shape[d] = n
        here = op.reshape(here, shape=shape)
        inside = here if inside is None else op.minimum(inside, here)
    return x if inside is None else op.where(inside, spread, x)


def _scatter_add(x, idx, updates, dimension_numbers, update_jaxpr=None, **_):
    """x.at[ids].add(rows): whole rows of axis 0 added at the last index column (in index
    order, no atomics); other forms are not mapped."""
    d = dimension_numbers
    out_rank = len(_shape(updates))
    if not (tuple(d.inserted_window_dims) == (0,) and tuple(d.scatter_dims_to_operand_dims)
            == (0,) and not tuple(getattr(d, "operand_batching_dims", ()))
            and _shape(idx)[-1:] == (1,) and tuple(d.update_window_dims) ==
            tuple(range(out_rank - len(_shape(x)) + 1, out_rank))):
        raise TesseraError(f"this form of jax.lax.scatter_add is not mapped ({d})",
                           hint="tessera maps adds of whole rows along axis 0 "
                                "(x.at[ids].add(rows))")
    ids = _reshape(idx, _shape(idx)[:-1])
    lead = len(_shape(ids))
    rows = _reshape(updates, [int(np.prod(_shape(ids), dtype=np.int64))] +
                    list(_shape(updates)[lead:]))
    return op.scatter_add(x, _reshape(ids, [-1]) if lead != 1 else ids, rows, axis=0)


def _reduce_prod(x, axes, **_):
    """A product along each axis in turn: the last of its running product (in order)."""
    for axis in sorted(axes, reverse=True):
        rank = len(_shape(x))
        x = op.squeeze(op.slice(op.cumprod(x, axis=axis), starts=[
            -1 if j == axis else None for j in range(rank)], stops=[None] * rank,
            steps=[1] * rank), axis=axis)
    return x


def _cumulative(name):
    def rule(x, axis, reverse=False):
        if not reverse:
            return getattr(op, name)(x, axis=axis)
        return _rev(getattr(op, name)(_rev(x, (axis,)), axis=axis), (axis,))
    return rule


def _argreduce(name):
    def rule(x, axes, index_dtype):
        (axis,) = axes
        out = getattr(op, name)(x, axis=axis)
        want = _dtype(index_dtype)
        return out if dtype_of(out).name == want else op.cast(out, want)
    return rule


def _reduce(name):
    return lambda x, axes, **_: getattr(op, name)(x, axis=list(axes)) if axes else x


# primitive name -> a function of its operands and parameters giving tessera values
PRIMITIVES = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b, **_: a * b,
    "div": _div, "rem": lambda a, b: op.fmod(a, b), "neg": lambda x: -x,
    "max": lambda a, b: op.maximum(a, b),
    "min": lambda a, b: op.minimum(a, b), "pow": lambda a, b: a ** b,
    "integer_pow": _integer_pow, "square": lambda x: x * x,
    "exp": lambda x, **_: op.exp(x), "log": lambda x, **_: op.log(x),
    "exp2": lambda x, **_: op.pow(np.asarray(2, dtype_of(x).np), x),
    "log1p": lambda x, **_: op.log1p(x), "expm1": lambda x, **_: op.expm1(x),
    "tanh": lambda x, **_: op.tanh(x), "logistic": lambda x, **_: op.sigmoid(x),
    "sqrt": lambda x, **_: op.sqrt(x), "rsqrt": lambda x, **_: op.rsqrt(x),
    "sin": lambda x, **_: op.sin(x), "cos": lambda x, **_: op.cos(x),
    "erf": lambda x: op.erf(x),
    "lgamma": lambda x: op.lgamma(x), "digamma": lambda x: op.digamma(x),    # (x > 0)
    "erfc": lambda x: 1 - op.erf(x),         # (absolute accuracy only where erfc is tiny: x > 3)
    "atan2": lambda a, b: op.atan2(a, b),
    "abs": lambda x: op.abs(x), "sign": lambda x: op.sign(x),
    "floor": lambda x: op.floor(x), "ceil": lambda x: op.ceil(x), "round": _round,
    "is_finite": lambda x: x - x == 0,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "and": _bools("bitwise_and", op.minimum), "or": _bools("bitwise_or", op.maximum),
    "not": _bools("bitwise_not", lambda x: x == False),                 # noqa: E712
    "xor": _bools("bitwise_xor", lambda a, b: a != b),
    "select_n": _select_n,
    "clamp": lambda lo, x, hi: op.minimum(op.maximum(x, lo), hi),
    "stop_gradient": lambda x: op.stop_gradient(x),
    "convert_element_type": lambda x, new_dtype, **_: op.cast(x, _dtype(new_dtype)),
    "copy": lambda x: x, "copy_p": lambda x: x,
    "reduce_sum": _reduce("sum"), "reduce_max": _reduce("max"), "reduce_min": _reduce("min"),
    "reduce_and": lambda x, axes, **_: op.min(x, axis=list(axes)),
    "reduce_or": lambda x, axes, **_: op.max(x, axis=list(axes)),
    "argmax": _argreduce("argmax"), "argmin": _argreduce("argmin"),
    "cumsum": _cumulative("cumsum"), "cumprod": _cumulative("cumprod"),
    "dot_general": _dot_general,
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": lambda x, new_sizes, **_: _reshape(x, new_sizes),
    "squeeze": lambda x, dimensions: _reshape(
        x, [s for k, s in enumerate(_shape(x)) if k not in dimensions]),
    "transpose": lambda x, permutation: _transpose(x, permutation),
    "concatenate": lambda *xs, dimension: op.concat(list(xs), axis=dimension),
    "slice": _slice, "rev": _rev, "pad": _pad, "split": _split,
    "iota": _iota, "gather": _gather, "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice, "scatter-add": _scatter_add,
    "scatter_add": _scatter_add, "reduce_prod": _reduce_prod,
}
def _closed(body):
    """(jaxpr, its constants) of a closed or open jaxpr."""
    return (body.jaxpr, list(body.consts)) if hasattr(body, "consts") else (body, [])


def _scan(*ins, jaxpr, length, reverse, num_consts, num_carry, **_):
    from .control import scan
    body, body_consts = _closed(jaxpr)
    consts, init, xs = ins[:num_consts], ins[num_consts:num_consts + num_carry], \
        ins[num_consts + num_carry:]
    stepped = list(xs) if xs else [np.arange(length, dtype=np.int32)]    # (a loop: xs unused)

    def step(carry, x):
        outs = _run(body, body_consts, list(consts) + list(carry) + (list(x) if xs else []))
        return outs[:num_carry], outs[num_carry:]
    carry, ys = scan(step, list(init), stepped, reverse=bool(reverse))
    return list(carry) + list(ys or [])


def _while(*ins, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    from .control import while_loop
    cc, bc = ins[:cond_nconsts], ins[cond_nconsts:cond_nconsts + body_nconsts]
    init = ins[cond_nconsts + body_nconsts:]
    (cj, cjc), (bj, bjc) = _closed(cond_jaxpr), _closed(body_jaxpr)
    return list(while_loop(lambda c: _run(cj, cjc, list(cc) + list(c))[0],
                           lambda c: _run(bj, bjc, list(bc) + list(c)), list(init)))


def _cond(index, *operands, branches, **_):
    from .control import cond
    fns = [(lambda b: lambda *xs: _run(*_closed(b), list(xs)))(b) for b in branches]
    if dtype_of(index).is_bool:
        index = op.cast(index, "int32")
    out = fns[0]
    for i, f in enumerate(fns[1:], 1):           # branch i where index == i, else what was
        out = (lambda f, rest, i: lambda *xs: cond(index == i, f, rest, *xs))(f, out, i)
    return list(out(*operands))


def _sort(*xs, dimension, num_keys=1, **_):
    """Every operand in the order that sorts the first (stable; NaN last)."""
    if num_keys != 1:
        raise TesseraError("jax.lax.sort with several keys is not mapped")
    perm = op.argsort(xs[0], axis=dimension)
    return [op.sort(xs[0], axis=dimension)] + [op.take_along_axis(x, perm, axis=dimension)
                                               for x in xs[1:]]


def _top_k(x, k, axis=-1, **_):
    values, idx = op.topk(x, k, axis=axis)
    return [values, op.cast(idx, "int32")]


PRIMITIVES.update({"scan": _scan, "while": _while, "cond": _cond, "sort": _sort,
                   "top_k": _top_k})
# bodies of control flow (checked for support, run by their rules above)
_BODIES = {"scan": ("jaxpr",), "while": ("cond_jaxpr", "body_jaxpr"), "cond": ("branches",)}
# calls whose body is inlined, by the parameter holding it
_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
          "custom_vjp_call_jaxpr": "fun_jaxpr", "remat": "jaxpr", "checkpoint": "jaxpr"}


def from_jax(fn, *example_args):
    """A tessera Function with ``fn``'s parameters, computing what the JAX function ``fn``
    computes on arguments shaped as ``example_args`` (arrays or pytrees of arrays)."""
    try:
        import jax
    except ImportError:
        raise TesseraError("ts.from_jax needs JAX", hint='pip install "jax[cpu]"') from None
    name = getattr(fn, "__name__", "fn")
    try:
        closed, out_shapes = jax.make_jaxpr(fn, return_shape=True)(*example_args)
    except Exception as e:
        raise TesseraError(f"jax.make_jaxpr could not trace {name}: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}") from None
    _check_supported(closed.jaxpr, name)
    out_tree = jax.tree_util.tree_structure(out_shapes)
    params = _parameters(fn, len(example_args))

    def body(*args, **kw):
        bound = body.__signature__.bind(*args, **kw).arguments
        leaves = jax.tree_util.tree_leaves([bound[p] for p in params],
                                           is_leaf=lambda v: v is None)
        _check_arguments(leaves, closed.jaxpr.invars, name)
        outs = _run(closed.jaxpr, [np.asarray(c) for c in closed.consts], leaves)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    body.__signature__ = inspect.Signature(
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params])
    body.__name__ = body.__qualname__ = name
    body.__doc__ = f"{name}, converted from JAX by jax.make_jaxpr (tessera.from_jax)"
    return Function(body, name=name)


def _check_arguments(leaves, invars, name):
    """The arguments have the example's shapes and dtypes (the jaxpr holds no other)."""
    if len(leaves) != len(invars):
        raise ArgumentError(f"{name} was converted for {len(invars)} array(s) (pytree leaves), "
                            f"got {len(leaves)}")
    for i, (x, v) in enumerate(zip(leaves, invars)):
        have = (tuple(_shape(x)), dtype_of(x).name)
        want = (tuple(v.aval.shape), _dtype(v.aval.dtype))
        if have != want:
            raise ArgumentError(
                f"argument {i} (a pytree leaf) of {name} is {have[1]}{list(have[0])}; it was "
                f"converted from JAX for {want[1]}{list(want[0])}", hint="convert again with "
                "ts.from_jax on examples of the new shapes (a jaxpr holds one shape)")


def _parameters(fn, n) -> list:
    """fn's positional parameter names when it has n plain ones, else a0, a1, ..."""
    try:
        ps = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        ps = []
    plain = [p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(plain) == n == len(ps):
        return plain
    return [f"a{i}" for i in range(n)]


def _inner(eqn):
    """The body of a call primitive, as (jaxpr, its constants)."""
    return _closed(eqn.params[_CALLS[eqn.primitive.name]])


def _run(jaxpr, consts, args) -> list:
    """Evaluate a jaxpr with tessera operators; returns its outputs in order."""
    env = {}

    def read(v):
        if type(v).__name__ == "Literal":
            return np.asarray(v.val, dtype=v.aval.dtype)
        return env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = np.asarray(c)
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        prim = eqn.primitive.name
        if prim in _CALLS:
            body, body_consts = _inner(eqn)
            outs = _run(body, body_consts, ins[len(ins) - len(body.invars):])
        else:
            params = {k: v for k, v in eqn.params.items()
                      if k not in ("accuracy", "out_sharding", "sharding", "out_dtype")}
            outs = PRIMITIVES[prim](*ins, **params)
            outs = list(outs) if eqn.primitive.multiple_results else [outs]
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]


def _check_supported(jaxpr, name):
    missing = {}

    def visit(jx, outer):
        for eqn in jx.eqns:
            prim, where = eqn.primitive.name, _where(eqn) or outer
            if prim in _CALLS:
                visit(_inner(eqn)[0], where)
            for key in _BODIES.get(prim, ()):
                bodies = eqn.params[key]
                for b in (bodies if isinstance(bodies, (tuple, list)) else [bodies]):
                    visit(_closed(b)[0], where)
            if prim not in PRIMITIVES and prim not in _CALLS:
                missing.setdefault(prim, []).append(where)
    visit(jaxpr, "(no source line)")
    if missing:
        lines = [f"  {p}: {len(w)} use(s), first at {w[0]}" for p, w in sorted(missing.items())]
        raise TesseraError(f"{name} uses {len(missing)} JAX primitive(s) tessera does not map "
                           "yet:\n" + "\n".join(lines),
                           hint="each needs an entry in tessera/jaxpr.py's PRIMITIVES table")


def _where(eqn) -> str:
    """The user's line that made a jaxpr equation (JAX's own summary of its source info), or
    "" inside JAX's own functions (the caller then names the line that called them)."""
    try:
        from jax._src import source_info_util
        return source_info_util.summarize(eqn.source_info)
    except Exception:                      # a private helper: a JAX without it gives no line
        return ""


__all__ = ["from_jax", "PRIMITIVES"]
