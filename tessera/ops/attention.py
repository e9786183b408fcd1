"""Scaled dot-product attention as one operator with its own (flash-attention) lowering.

`op.attention(q, k, v, mask=None, causal=False, scale=None)`; the compiler also rewrites the
pattern written out by hand (matmul, scale, additive mask, softmax, matmul) into this operator.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError, SymbolicValueError
from ..shapes import same
from ..types import TensorType
from .registry import (Attention, OpDef, broadcast_shapes, dim_value, producer, ref_errstate,
                       register)


def _infer(ts, a):
    q, k, v, mask = ts
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.rank < 2:
            raise ShapeError(f"attention's {name} needs rank 2 or more ([..., S, D])",
                             received=str(t))
    d = _dtypes([q.dtype, k.dtype, v.dtype, mask.dtype], a)[1]
    if not d.is_float:
        raise DTypeError("attention needs float q, k and v", received=d.short,
                         hint="cast to float32 first")
    if not same(q.shape[-1], k.shape[-1]):
        raise ShapeError(f"q and k must share the feature size: {q.shape[-1]} vs {k.shape[-1]}",
                         expected="q: [..., Sq, D], k: [..., Sk, D]", received=f"{q} and {k}")
    if not same(k.shape[-2], v.shape[-2]):
        raise ShapeError(f"k and v must have the same number of keys: {k.shape[-2]} vs "
                         f"{v.shape[-2]}", expected="k: [..., Sk, D], v: [..., Sk, Dv]",
                         received=f"{k} and {v}")
    batch = broadcast_shapes([q.with_shape(q.shape[:-2]), k.with_shape(k.shape[:-2]),
                              v.with_shape(v.shape[:-2])])
    scores = TensorType(d, batch + (q.shape[-2], k.shape[-2]))
    try:
        full = broadcast_shapes([scores, mask])
    except ShapeError as e:
        e.summary = "the mask does not broadcast to the scores [..., Sq, Sk]: " + e.summary
        raise
    if len(full) != len(scores.shape) or not all(same(x, y) for x, y in zip(full, scores.shape)):
        raise ShapeError("the mask must broadcast to the scores' shape",
                         expected=str(scores), received=str(mask))
    if mask.dtype.is_bool:
        raise DTypeError("attention's mask is additive (0 to keep, -inf to drop), not bool",
                         hint="op.where(keep, 0.0, -np.inf)")
    return TensorType(d, batch + (q.shape[-2], v.shape[-1]))


def _dtypes(ds, attrs):
    """q, k, v and the mask all in q, k and v's promoted dtype: the kernels read one type.
    fp8 operands widen to float32, and so does the result (as matmul's)."""
    d = dt.result_type(*ds[:3])
    d = dt.float32 if d.is_fp8 else d
    mask = ds[3]
    if isinstance(mask, dt.DType) and mask.is_bool:
        raise DTypeError("attention's mask is additive (0 to keep, -inf to drop), not bool",
                         hint="op.where(keep, 0.0, -np.inf)")
    return [d, d, d, d], d


def _normalize(ts, a):
    scale = a["scale"]
    if scale is None:
        scale = 1.0 / math.sqrt(ts[0].shape[-1]) if isinstance(ts[0].shape[-1], int) else None
    return {"scale": None if scale is None else float(scale), "causal": bool(a["causal"])}


def causal_keep(sq: int, sk: int):
    """Query i sees key j when j <= i + (sk - sq): the last query sees every key."""
    return np.tril(np.ones((sq, sk), dtype=bool), k=sk - sq)


def _reference(xs, a):
    q, k, v, mask = xs
    f = np.result_type(q, k, v)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    s = q64 @ np.swapaxes(k64, -1, -2) * a["scale"] + mask.astype(np.float64)
    if a["causal"]:
        s = np.where(causal_keep(s.shape[-2], s.shape[-1]), s, -np.inf)
    with ref_errstate():
        m = s.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        e = np.exp(s - m)
        z = e.sum(axis=-1, keepdims=True)
        p = np.where(z > 0, e / np.where(z > 0, z, 1), 0)     # a row with no key gives 0
    return (p @ v64).astype(f)


def _vjp(b, xs, y, g, a):
    """The attention backward with ordinary operators. For now it recomputes the probabilities
    P = softmax(scale q k^T + mask) and materialises them (Sq x Sk per batch entry), as the
    reference does (a query that sees no key has P = 0); a blockwise backward kernel that
    recomputes P per tile, like the forward, is future work.
        dV = P^T g,  dP = g V^T,  dS = P (dP - rowsum(dP P)),
        dQ = scale dS K,  dK = scale dS^T Q,  dmask = dS
    Broadcast batch axes (and the mask's broadcast) are summed back by the autodiff pass."""
    q, k, v, mask = xs
    scale = a["scale"]
    if scale is None:                          # only with a symbolic feature size
        scale = b.op("rsqrt", dim_value(b, q.shape[-1], g))
    s = b.op("mul", b.op("matmul", q, b.op("transpose", k)), scale)
    s = b.op("add", s, b.op("cast", mask, dtype=g.dtype.name))
    if a["causal"]:
        sq, sk = s.shape[-2], s.shape[-1]
        if not (isinstance(sq, int) and isinstance(sk, int)):
            raise SymbolicValueError("causal attention's adjoint needs concrete sequence "
                                     "lengths", received=str(y.type),
                                     hint="trace with concrete sizes (call it, or "
                                          ".lower(*arrays))")
        s = b.op("where", causal_keep(sq, sk), s, -math.inf)
    m = b.op("max", s, axis=[-1], keepdim=True)
    m = b.op("where", b.op("eq", m, -math.inf), 0.0, m)          # a row without keys: exp gives 0
    e = b.op("exp", b.op("sub", s, m))
    z = b.op("sum", e, axis=[-1], keepdim=True)
    p = b.op("div", e, b.op("where", b.op("gt", z, 0.0), z, 1.0))
    dv = b.op("matmul", b.op("transpose", p), g)
    dp = b.op("matmul", g, b.op("transpose", v))
    ds = b.op("mul", p, b.op("sub", dp, b.op("sum", b.op("mul", dp, p), axis=[-1], keepdim=True)))
    dq = b.op("mul", b.op("matmul", ds, k), scale)
    dk = b.op("mul", b.op("matmul", b.op("transpose", ds), q), scale)
    return [dq, dk, dv, ds]


# ---- the hand-written form, recognised on the primitive graph --------------------------------
def _scalar_const(v):
    n = producer(v, "const")
    return float(n.attrs["value"]) if n is not None and n.attrs["value"].ndim == 0 else None


def _recognise(g, n):
    """matmul(softmax_lastaxis(scale * matmul(q, kT) + mask), v) -> attention(q, k, v, mask).

    Every intermediate must have no other user (else the scores are needed anyway). The
    softmax is matched in its primitive form, so a hand-written one is found too."""
    if n.op != "matmul" or not n.out.type.dtype.is_float:
        return None
    users = {}
    for m in g.nodes:
        for v in m.inputs:
            users.setdefault(v.id, []).append(m)
    outputs = {v.id for v in g.outputs}

    def only_for(v, *consumers):
        return v.id not in outputs and sorted(map(id, users.get(v.id, []))) == \
            sorted(map(id, consumers))

    p, v_in = n.inputs
    div = producer(p, "div")
    if div is None or not only_for(p, n):
        return None
    e, z = div.inputs
    exp, total = producer(e, "exp"), producer(z, "sum")
    if exp is None or total is None or total.inputs[0] is not e or not only_for(e, div, total) \
            or not only_for(z, div):
        return None
    last = e.type.rank - 1
    if total.attrs["axis"] != [last] or not total.attrs["keepdim"]:
        return None
    sub = producer(exp.inputs[0], "sub")
    if sub is None or not only_for(exp.inputs[0], exp):
        return None
    x, mx = sub.inputs
    mx_node = producer(mx, "max")
    if mx_node is None or mx_node.inputs[0] is not x or mx_node.attrs["axis"] != [last] or \
            not mx_node.attrs["keepdim"] or not only_for(mx, sub) or not only_for(x, sub, mx_node):
        return None
    scale, mask = 1.0, None
    while producer(x, "matmul") is None:                 # walk the score epilogue back to q @ kT
        step = x.node
        if step is None or step.op not in ("mul", "div", "add"):
            return None
        a, b = step.inputs
        if step.op in ("mul", "div") and _scalar_const(b) is not None:
            scale = scale * _scalar_const(b) if step.op == "mul" else scale / _scalar_const(b)
            x = a
        elif step.op == "mul" and _scalar_const(a) is not None:
            scale, x = scale * _scalar_const(a), b
        elif step.op == "add" and mask is None and a.type.shape == step.out.type.shape:
            mask, x = b, a
        elif step.op == "add" and mask is None and b.type.shape == step.out.type.shape:
            mask, x = a, b
        else:
            return None
        if not only_for(x, step):
            return None
    scores = x.node
    q, kt = scores.inputs
    if scores.out.type.shape[:-1] != p.type.shape[:-1] or scores.out.type.dtype != n.out.type.dtype:
        return None
    if mask is not None and (mask.type.dtype != n.out.type.dtype or _depends_on(mask, scores)):
        return None
    perm = list(range(kt.type.rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    if producer(kt, "transpose") is not None and kt.node.attrs["perm"] == perm:
        k = kt.node.inputs[0]
    else:
        k = g.move_before(g.apply("transpose", [kt], {"perm": perm}, loc=n.loc,
                                  origin=n.origin), n)
    if mask is None:
        mask = g.move_before(g.const(np.zeros((), dtype=n.out.type.dtype.np), loc=n.loc,
                                     origin=n.origin), n)
        return g.move_before(g.apply("attention", [q, k, v_in, mask],
                                     {"scale": scale, "causal": False}, loc=n.loc), n)

    def add(op, inputs, attrs=None):
        return g.move_before(g.apply(op, inputs, attrs, loc=n.loc, origin=n.origin), n)

    def const(value):
        return g.move_before(g.const(value, n.out.type.dtype, loc=n.loc, origin=n.origin), n)
    out = add("attention", [q, k, v_in, mask], {"scale": scale, "causal": False})
    # the program's softmax of a row that the mask drops throughout is NaN (-inf - -inf), where
    # attention gives 0: those rows stay NaN, so the rewrite keeps the program's values
    row = add("max", [mask], {"axis": [mask.type.rank - 1], "keepdim": True}) \
        if mask.type.rank else mask
    dropped = add("eq", [row, const(-np.inf)])
    return add("where", [dropped, const(np.nan), out])


def _depends_on(v, node) -> bool:
    stack, seen = [v], set()
    while stack:
        u = stack.pop()
        if u.node is None or u.id in seen:
            continue
        if u.node is node:
            return True
        seen.add(u.id)
        stack.extend(u.node.inputs)
    return False


def _decompose(b, xs, attrs):
    """fp8 operands widened exactly to float32 (a primitive otherwise)."""
    if not any(b.type(x).dtype.is_fp8 for x in xs):
        return None
    wide = [b.op("cast", x, dtype="float32") if b.type(x).dtype.is_fp8 else x for x in xs]
    return b.op("attention", *wide, **attrs)


register(OpDef("attention", 4, {"scale": None, "causal": False}, infer=_infer,
               dtype_rule=_dtypes, decompose=_decompose, accumulates=True,
               normalize=_normalize, reference=_reference, lowering=Attention(), vjp=_vjp,
               recognise=_recognise,
               doc="softmax(scale * q @ k^T + mask, causal) @ v without materialising the "
                   "scores; scale defaults to 1/sqrt(D)"))
