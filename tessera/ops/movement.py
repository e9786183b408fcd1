"""Data movement: transpose, reshape, broadcast_to, slice (strided views of their input),
concat, take (gather), and expand_dims/squeeze (decomposed into reshape)."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError, SymbolicValueError
from ..shapes import Sym, exact_div, fmt_shape, prod, same
from ..types import TensorType
from .registry import (Concat, Gather, OpDef, Scatter, View, broadcast_shapes,
                       contiguous_strides, flip, norm_axis, producer, register, sum_to, zeros)


# ---- transpose ---------------------------------------------------------------------------------
def _transpose_normalize(types, attrs):
    rank = types[0].rank
    perm = attrs["perm"]
    if perm is None:
        perm = list(range(rank))
        if rank >= 2:
            perm[-2], perm[-1] = perm[-1], perm[-2]
    if not isinstance(perm, (list, tuple)) or len(perm) != rank:
        raise ShapeError(f"perm {perm!r} is not a permutation of the {rank} axes",
                         received=str(types[0]))
    perm = [norm_axis(p, rank, types[0]) for p in perm]
    if sorted(perm) != list(range(rank)):
        raise ShapeError(f"perm {perm} repeats an axis", received=str(types[0]))
    return {"perm": perm}


def _transpose_vjp(b, xs, y, g, a):                 # the inverse permutation
    inverse = [0] * len(a["perm"])
    for k, p in enumerate(a["perm"]):
        inverse[p] = k
    return [b.op("transpose", g, perm=inverse)]


def _reshape_back(b, xs, y, g, a):                   # reshape, expand_dims, squeeze
    return [b.op("reshape", g, shape=list(xs[0].shape))]


def same_type_is_input(g, n):
    """A view (or cast) whose result has its input's type is its input."""
    return n.inputs[0] if n.inputs[0].type == n.out.type else None


def _transpose_of_transpose(g, n):
    src = n.inputs[0]
    inner = producer(src, "transpose")
    if inner is not None:
        perm = [inner.attrs["perm"][p] for p in n.attrs["perm"]]
        if perm == sorted(perm):
            return inner.inputs[0]
        return g.move_before(g.apply("transpose", [inner.inputs[0]], {"perm": perm}, loc=n.loc,
                                     origin=n.origin), n)
    if n.attrs["perm"] == sorted(n.attrs["perm"]):
        return src
    return None


def _reshape_of_reshape(g, n):
    inner = producer(n.inputs[0], "reshape")
    if inner is None:
        return None
    return g.move_before(g.apply("reshape", [inner.inputs[0]], {"shape": list(n.out.type.shape)},
                                 loc=n.loc, origin=n.origin), n)


register(OpDef(
    "transpose", 1, {"perm": None}, normalize=_transpose_normalize,
    vjp=_transpose_vjp,
    infer=lambda ts, a: ts[0].with_shape(tuple(ts[0].shape[p] for p in a["perm"])),
    reference=lambda xs, a: np.transpose(xs[0], a["perm"]),
    lowering=View(lambda ti, to, a: ([0] * ti.rank, [(p, 1) for p in a["perm"]])),
    simplify=[_transpose_of_transpose],
    doc="permute axes; default swaps the last two (like .T)"))


def as_dims(shape, what: str) -> list:
    """A user's shape argument as a list of ints (NumPy ints accepted) and symbols."""
    if isinstance(shape, (int, np.integer, Sym)):
        shape = [shape]
    if not isinstance(shape, (list, tuple)):
        raise ShapeError(f"{what} needs a shape (a list of sizes), not {shape!r}")
    out = []
    for d in shape:
        if isinstance(d, Sym):
            out.append(d.simplify())
        elif isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)):
            out.append(int(d))
        else:
            raise ShapeError(f"{what}: a size must be an int or a symbolic size, not {d!r}")
    return out


# ---- reshape -----------------------------------------------------------------------------------
def _has_opaque(dims) -> bool:
    return any(isinstance(d, Sym) and d.opaque() for d in dims)


def resolve_reshape(t: TensorType, shape) -> tuple:
    shape = as_dims(shape, "reshape")
    if sum(1 for d in shape if isinstance(d, int) and d == -1) > 1:
        raise ShapeError("reshape takes at most one -1", received=str(shape))
    for d in shape:
        if isinstance(d, int) and d < -1:
            raise ShapeError(f"negative dimension {d} in reshape", received=str(shape))
    total = prod(t.shape)
    if -1 in [d for d in shape if isinstance(d, int)]:
        i = next(k for k, d in enumerate(shape) if isinstance(d, int) and d == -1)
        known = prod(shape[:i] + shape[i + 1:])
        if same(known, 0):
            raise ShapeError("cannot infer -1 when other dimensions are 0", received=str(shape))
        q = exact_div(total, known)
        if q is None:
            if isinstance(total, int) and isinstance(known, int):
                raise ShapeError(f"cannot reshape {t} into {fmt_shape(shape)}: {total} elements "
                                 f"do not divide into rows of {known}")
            q = Sym.lift(total) // known
        shape[i] = q
    out = tuple(shape)
    new = prod(out)
    # Provably different counts fail here: two numbers, or two symbolic products. A symbol
    # against a number (N vs 12) is left to the call's concrete trace, like broadcasting.
    both_static = isinstance(new, int) and isinstance(total, int)
    both_symbolic = isinstance(new, Sym) and isinstance(total, Sym)
    if not same(new, total) and (both_static or (both_symbolic and
                                                 not _has_opaque(out + tuple(t.shape)))):
        raise ShapeError(f"reshape must keep the number of elements ({total})",
                         expected=f"{t.dtype.short}[... {total} elements]",
                         received=f"{t.dtype.short}{fmt_shape(out)}")
    return out


register(OpDef(
    "reshape", 1, {"shape": None},
    normalize=lambda ts, a: {"shape": list(resolve_reshape(ts[0], a["shape"]))},
    infer=lambda ts, a: ts[0].with_shape(resolve_reshape(ts[0], a["shape"])),
    reference=lambda xs, a: np.reshape(xs[0], [int(d) for d in a["shape"]]),
    lowering=View(reshape=True),
    vjp=_reshape_back, simplify=[same_type_is_input, _reshape_of_reshape],
    doc="same elements, new shape; one dimension may be -1"))


# ---- broadcast_to ------------------------------------------------------------------------------
def _broadcast_to_infer(ts, a):
    t = ts[0]
    target = tuple(as_dims(a["shape"], "broadcast_to"))
    if len(target) < t.rank:
        raise ShapeError("broadcast_to cannot drop axes", expected=fmt_shape(target),
                         received=str(t))
    out = broadcast_shapes([t, t.with_shape(target)])
    if not all(same(x, y) for x, y in zip(out, target)):
        raise ShapeError(f"cannot broadcast {t} to {fmt_shape(target)}",
                         expected=fmt_shape(target), received=str(t))
    return t.with_shape(target)


def _broadcast_map(ti, to, a):
    pad = to.rank - ti.rank
    return [0] * ti.rank, [None if k < pad or ti.shape[k - pad] == 1 else (k - pad, 1)
                           for k in range(to.rank)]


register(OpDef(
    "broadcast_to", 1, {"shape": None},
    normalize=lambda ts, a: {"shape": as_dims(a["shape"], "broadcast_to")},
    infer=_broadcast_to_infer,
    reference=lambda xs, a: np.broadcast_to(xs[0], [int(d) for d in a["shape"]]).copy(),
    lowering=View(_broadcast_map), vjp=lambda b, xs, y, g, a: [sum_to(b, g, xs[0].shape)],
    simplify=[same_type_is_input], doc="repeat size-1 (and missing leading) axes"))


# ---- slice -------------------------------------------------------------------------------------
def slice_dim(n, start, stop, step, axis, t):
    """The (start, stop, step, length) of a Python slice over a dimension, symbolic or not."""
    start, stop, step = (_slice_bound(v, t) for v in (start, stop, step))
    step = 1 if step is None else step
    if step == 0:
        raise ShapeError("slice step cannot be zero", received=str(t))
    if isinstance(n, int):
        s0, s1, st = slice(start, stop, step).indices(n)
        length = len(range(s0, s1, st))
        if length == 0:             # (x[-10::-1] gives a start of -1: read again, the last)
            return 0, 0, 1, 0
        # keep the normal form idempotent: a stop of -1 (before index 0) would re-read as "last"
        return s0, (None if s1 < 0 else s1), st, length
    if step != 1:
        raise ShapeError(f"axis {axis} has the symbolic size {n}: only step-1 slices are "
                         "supported on it", received=str(t),
                         hint="leave this parameter unannotated to trace with concrete sizes")
    # Python's clamping needs the size: on a symbolic axis the slice is assumed to fit, and the
    # call's concrete trace (which clamps exactly) is what runs.
    s0 = 0 if start is None else (start if isinstance(start, Sym) or start >= 0 else n + start)
    s1 = n if stop is None else (stop if isinstance(stop, Sym) or stop >= 0 else n + stop)
    return s0, s1, 1, s1 - s0


def _slice_bound(v, t):
    if v is None or isinstance(v, Sym):
        return v
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return int(v)
    raise ShapeError(f"slice bounds must be ints, not {v!r}", received=str(t))


def _slice_normalize(ts, a):
    t = ts[0]
    if not all(isinstance(a[k], (list, tuple)) for k in ("starts", "stops")) or \
            not isinstance(a["steps"] or [], (list, tuple)):
        raise ShapeError("slice needs lists of starts, stops (and steps), one per axis",
                         received=str(t))
    starts, stops, steps = list(a["starts"]), list(a["stops"]), list(a["steps"] or [1] * t.rank)
    if not len(starts) == len(stops) == len(steps) == t.rank:
        raise ShapeError("slice needs one start, stop and step per axis", received=str(t))
    out = [slice_dim(n, s0, s1, st, k, t) for k, (n, s0, s1, st) in
           enumerate(zip(t.shape, starts, stops, steps))]
    return {"starts": [o[0] for o in out], "stops": [o[1] for o in out],
            "steps": [o[2] for o in out]}


def _slice_infer(ts, a):
    t = ts[0]
    n = _slice_normalize(ts, a)
    shape = []
    for d, s0, s1, st in zip(t.shape, n["starts"], n["stops"], n["steps"]):
        if isinstance(d, int):
            shape.append(len(range(*slice(s0, s1, st).indices(d))))
        else:
            shape.append((Sym.lift(s1) - s0))
    return t.with_shape(tuple(d.simplify() if isinstance(d, Sym) else d for d in shape))


def _slice_map(ti, to, a):
    return list(a["starts"]), [(k, st) for k, st in enumerate(a["steps"])]


def _slice_ref(xs, a):
    idx = tuple(slice(s0, s1, st) for s0, s1, st in zip(a["starts"], a["stops"], a["steps"]))
    return xs[0][idx].copy()


def _slice_vjp(b, xs, y, g, a):
    """Scatter the cotangent back into zeros, axis by axis, with concat (there is no pad
    operator): a negative step reverses first, a step s > 1 interleaves s-1 zeros per element."""
    x = xs[0]
    if any(isinstance(d, int) and d == 0 for d in y.shape):
        return [zeros(b, x)]
    for k, (n, s0, st) in enumerate(zip(x.shape, a["starts"], a["steps"])):
        length = g.shape[k]
        if st == 1 and same(s0, 0) and same(length, n):
            continue
        if st < 0:                                  # reversed: place it forward
            g = flip(b, g, k)
            s0, st = s0 + (length - 1) * st, -st
        span = length
        if st > 1:
            shape = list(g.shape)
            wide = shape[:k + 1] + [1] + shape[k + 1:]
            gaps = shape[:k + 1] + [st - 1] + shape[k + 1:]
            g = b.op("concat", [b.op("reshape", g, shape=wide), zeros(b, g, gaps)], axis=k + 1)
            span = (length - 1) * st + 1
            g = b.op("reshape", g, shape=shape[:k] + [length * st] + shape[k + 1:])
            g = b.op("slice", g, starts=[0 if j == k else None for j in range(g.ndim)],
                   stops=[span if j == k else None for j in range(g.ndim)], steps=[1] * g.ndim)
        # zeros before, then after: two concats of two operands each, never [z, g, z] with
        # z twice (equal zeros are one value after CSE, and a concat with a repeated operand
        # miscompiles: see tests/frontend/test_autodiff.py::test_concat_with_a_repeated_operand)
        before, after = s0, n - s0 - span
        pad = lambda size: zeros(b, g, list(g.shape[:k]) + [size] + list(g.shape[k + 1:]))  # noqa
        if not same(before, 0):
            g = b.op("concat", [pad(before), g], axis=k)
        if not same(after, 0):
            g = b.op("concat", [g, pad(after)], axis=k)
    return [g]


def _whole_slice(g, n):
    """A slice that takes every element in order is its input."""
    if all(s == 0 and st == 1 and same(e, d) for s, e, st, d in zip(
            n.attrs["starts"], n.attrs["stops"], n.attrs["steps"], n.inputs[0].type.shape)):
        return n.inputs[0]
    return None


register(OpDef(
    "slice", 1, {"starts": None, "stops": None, "steps": None},
    normalize=_slice_normalize, infer=_slice_infer, reference=_slice_ref,
    lowering=View(_slice_map), vjp=_slice_vjp, simplify=[_whole_slice],
    doc="basic slicing: start, stop and step per axis"))


# ---- concat ------------------------------------------------------------------------------------
def _concat_dtypes(ds, attrs):
    if not ds:
        raise ShapeError("concat needs at least one tensor")
    d = dt.result_type(*ds)
    return [d] * len(ds), d


def _concat_infer(ts, a):
    if not ts:
        raise ShapeError("concat needs at least one tensor")
    d = dt.result_type(*[t.dtype for t in ts])
    r = ts[0].rank
    if r == 0:
        raise ShapeError("concat of rank-0 tensors", received=", ".join(map(str, ts)),
                         hint="reshape them to rank 1 first")
    axis = norm_axis(a["axis"], r, ts[0])
    total = 0
    for t in ts:
        if t.rank != r or not all(same(x, y) for k, (x, y) in enumerate(zip(t.shape, ts[0].shape))
                                  if k != axis):
            raise ShapeError(f"concat along axis {axis} needs equal dimensions elsewhere",
                             received=", ".join(map(str, ts)))
        total = total + t.shape[axis]
    if isinstance(total, Sym):
        total = total.simplify()
    return TensorType(d, ts[0].shape[:axis] + (total,) + ts[0].shape[axis + 1:])


def _concat_vjp(b, xs, y, g, a):                    # each input's slab of the cotangent
    out, start, axis = [], 0, a["axis"]
    for x in xs:
        stop = start + x.shape[axis]
        out.append(b.op("slice", g, starts=[start if k == axis else None for k in range(g.ndim)],
                      stops=[stop if k == axis else None for k in range(g.ndim)],
                      steps=[1] * g.ndim))
        start = stop
    return out


def _concat_of_slices(g, n):
    """Consecutive slices of one tensor along the concat's axis, taking it whole, are that
    tensor (a complex result's parts put back where they were computed: ops/spectral.py)."""
    axis, src, at = n.attrs["axis"], None, 0
    for v in n.inputs:
        s = producer(v, "slice")
        if s is None or src is not None and s.inputs[0] is not src:
            return None
        src = s.inputs[0]
        if src.type.dtype != n.out.type.dtype or src.type.rank != n.out.type.rank:
            return None
        for k, (start, stop, step, d) in enumerate(zip(s.attrs["starts"], s.attrs["stops"],
                                                       s.attrs["steps"], src.type.shape)):
            if step != 1 or (k == axis and not same(start, at)) or \
                    (k != axis and not (start == 0 and same(stop, d))):
                return None
        at = s.attrs["stops"][axis]
    return src if same(at, src.type.shape[axis]) else None


register(OpDef(
    "concat", -1, {"axis": 0}, infer=_concat_infer, dtype_rule=_concat_dtypes,
    normalize=lambda ts, a: {"axis": norm_axis(a["axis"], ts[0].rank, ts[0])} if ts else a,
    reference=lambda xs, a: np.concatenate(xs, axis=a["axis"]), lowering=Concat(),
    vjp=_concat_vjp, simplify=[_concat_of_slices],
    doc="join tensors along an existing axis"))


# ---- take / gather -----------------------------------------------------------------------------
def _take_infer(ts, a):
    x, idx = ts
    if not idx.dtype.is_int:
        raise DTypeError("take's indices must be int32 or int64", expected="i32 or i64",
                         received=str(idx))
    if x.rank == 0:
        raise ShapeError("take from a rank-0 tensor", received=str(x))
    axis = norm_axis(a["axis"], x.rank, x)
    return x.with_shape(x.shape[:axis] + idx.shape + x.shape[axis + 1:])


def _take_ref(xs, a):
    x, idx = xs
    n = x.shape[a["axis"]]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"index out of range for an axis of size {n}")
    return np.take(x, idx, axis=a["axis"])


def _take_vjp(b, xs, y, g, a):
    """The cotangent's slices added back at their indices (scatter_add, take's transpose):
    repeated indices add up in index order. 16-bit tables add in float32, rounded once at the
    end; the indices get none."""
    return [scatter_into_zeros(b, xs[0].shape, xs[1], g, a["axis"]), None]


def scatter_into_zeros(b, shape, idx, g, axis):
    """scatter_add(zeros(shape), idx, g, axis) in g's dtype; 16-bit values add in float32,
    rounded once at the end (scatter_add takes no 16-bit target)."""
    wide = g.dtype.is_narrow
    gf = b.op("cast", g, dtype="float32") if wide else g
    dx = b.op("scatter_add", zeros(b, gf, shape), idx, gf, axis=axis)
    return b.op("cast", dx, dtype=g.dtype.name) if wide else dx


register(OpDef(
    "take", 2, {"axis": 0}, infer=_take_infer,
    normalize=lambda ts, a: {"axis": norm_axis(a["axis"], ts[0].rank, ts[0])},
    reference=_take_ref, lowering=Gather(), vjp=_take_vjp,
    doc="select slices by integer indices along an axis (an embedding lookup with axis=0); "
        "negative indices count from the end, out-of-range indices raise"))


# ---- scatter_add: take's transpose ---------------------------------------------------------------
def _scatter_infer(ts, a):
    target, idx, src = ts
    if not idx.dtype.is_int:
        raise DTypeError("scatter_add's indices must be int32 or int64", expected="i32 or i64",
                         received=str(idx))
    if target.rank == 0:
        raise ShapeError("scatter_add into a rank-0 tensor", received=str(target))
    if src.dtype != target.dtype or target.dtype.is_bool or target.dtype.is_narrow:
        raise DTypeError("scatter_add adds src into a target of the same dtype (float32, "
                         "float64, int32 or int64)", expected=target.dtype.short,
                         received=src.dtype.short,
                         hint="cast both to float32 first (16-bit sums would round each add)")
    axis = norm_axis(a["axis"], target.rank, target)
    want = target.shape[:axis] + idx.shape + target.shape[axis + 1:]
    if len(want) != src.rank or not all(same(x, y) for x, y in zip(want, src.shape)):
        raise ShapeError("scatter_add's src must have the shape take(target, index, axis) has",
                         expected=fmt_shape(want), received=str(src))
    return target


def _scatter_ref(xs, a):
    target, idx, src = xs
    axis, n = a["axis"], target.shape[a["axis"]]
    flat = np.asarray(idx).reshape(-1)
    if flat.size and (flat.min() < -n or flat.max() >= n):
        raise IndexError(f"index out of range for an axis of size {n}")
    out = np.array(target, copy=True)
    rows = src.reshape(target.shape[:axis] + (flat.size,) + target.shape[axis + 1:])
    np.add.at(np.moveaxis(out, axis, 0), np.where(flat < 0, flat + n, flat),
              np.moveaxis(rows, axis, 0))                 # in index order, unbuffered
    return out


register(OpDef(
    "scatter_add", 3, {"axis": 0}, infer=_scatter_infer,
    normalize=lambda ts, a: {"axis": norm_axis(a["axis"], ts[0].rank, ts[0])},
    reference=_scatter_ref, lowering=Scatter(),
    vjp=lambda b, xs, y, g, a: [g, None, b.op("take", g, xs[1], axis=a["axis"])],
    doc="target with src's slices added at the indices along axis (take's transpose); "
        "repeated indices add up in index order, deterministically; out-of-range indices raise"))


# ---- expand_dims / squeeze (reshape in disguise) -------------------------------------------------
def _expand_shape(t, axis):
    r = t.rank + 1
    axis = norm_axis(axis, r, t.with_shape(t.shape + (1,)))
    return t.shape[:axis] + (1,) + t.shape[axis:]


def _squeeze_shape(t, axis):
    if axis is None:
        return tuple(d for d in t.shape if not same(d, 1))
    axes = axis if isinstance(axis, (list, tuple)) else [axis]
    axes = {norm_axis(x, t.rank, t) for x in axes}
    for k in axes:
        if not same(t.shape[k], 1):
            raise ShapeError(f"squeeze of axis {k}, which has size {t.shape[k]}, not 1",
                             received=str(t))
    return tuple(d for k, d in enumerate(t.shape) if k not in axes)


register(OpDef(
    "expand_dims", 1, {"axis": 0},
    infer=lambda ts, a: ts[0].with_shape(_expand_shape(ts[0], a["axis"])),
    reference=lambda xs, a: np.expand_dims(xs[0], a["axis"]),
    decompose=lambda b, xs, a: b.op("reshape", xs[0],
                                    shape=list(_expand_shape(b.type(xs[0]), a["axis"]))),
    vjp=_reshape_back,
    doc="insert a size-1 axis"))

register(OpDef(
    "squeeze", 1, {"axis": None},
    infer=lambda ts, a: ts[0].with_shape(_squeeze_shape(ts[0], a["axis"])),
    reference=lambda xs, a: np.squeeze(xs[0], axis=None if a["axis"] is None else tuple(
        a["axis"]) if isinstance(a["axis"], (list, tuple)) else a["axis"]),
    decompose=lambda b, xs, a: b.op("reshape", xs[0],
                                    shape=list(_squeeze_shape(b.type(xs[0]), a["axis"]))),
    vjp=_reshape_back,
    doc="remove size-1 axes"))


# ---- take_along_axis: a gather with an index per element ----------------------------------------
def _along_infer(ts, a):
    x, idx = ts
    if not idx.dtype.is_int:
        raise DTypeError("take_along_axis's indices must be int32 or int64",
                         expected="i32 or i64", received=str(idx))
    if x.rank == 0 or idx.rank != x.rank:
        raise ShapeError("take_along_axis takes indices of the tensor's rank",
                         expected=f"rank {x.rank} (at least 1)", received=str(idx))
    axis = norm_axis(a["axis"], x.rank, x)
    if not all(same(d, e) for i, (d, e) in enumerate(zip(x.shape, idx.shape)) if i != axis):
        raise ShapeError("take_along_axis's indices must match the tensor's shape off the axis",
                         expected=fmt_shape(x.shape[:axis] + ("*",) + x.shape[axis + 1:]),
                         received=str(idx))
    return x.with_shape(idx.shape)


def _along_ref(xs, a):
    x, idx = xs
    n = x.shape[a["axis"]]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"index out of range for an axis of size {n}")
    return np.take_along_axis(x, np.where(idx < 0, idx + n, idx), axis=a["axis"])


def flat_index(b, x, idx, axis):
    """The row-major position in x of each x[..., idx, ...] along axis, as int64; an index
    outside [-n, n) becomes x's size, which the flat gather or scatter reports."""
    shape = list(x.shape)
    if not all(isinstance(d, int) for d in shape + list(idx.shape)):
        raise SymbolicValueError(f"indices along an axis need concrete sizes, not {x.type}",
                                 hint="trace with concrete sizes (call it, or .lower(*arrays))")
    n, total, strides = shape[axis], prod(shape), contiguous_strides(shape)
    i = b.op("cast", idx, dtype="int64")
    pos = b.op("mul", b.op("where", b.op("lt", i, 0), b.op("add", i, n), i), strides[axis])
    for k, stride in enumerate(strides):                       # the other axes' offsets
        if k != axis and shape[k] > 1:
            at = np.arange(shape[k], dtype=np.int64) * stride
            pos = b.op("add", pos, at.reshape([1] * k + [-1] + [1] * (len(shape) - k - 1)))
    bad = np.int64(total)
    return b.op("where", b.op("ge", i, -n), b.op("where", b.op("lt", i, n), pos, bad), bad)


def _along_decompose(b, xs, a):
    x, idx = xs
    flat = b.op("reshape", x, shape=[-1])
    return b.op("take", flat, flat_index(b, x, idx, a["axis"]), axis=0)


def along_transpose(b, x, idx, g, axis):
    """take_along_axis's transpose: zeros of x's shape with g's elements added at the indices
    (one flat scatter_add: repeated indices add up in order)."""
    flat = scatter_into_zeros(b, [prod(list(x.shape))],
                              b.op("reshape", flat_index(b, x, idx, axis), shape=[-1]),
                              b.op("reshape", g, shape=[-1]), 0)
    return b.op("reshape", flat, shape=list(x.shape))


register(OpDef(
    "take_along_axis", 2, {"axis": -1}, infer=_along_infer,
    normalize=lambda ts, a: {"axis": norm_axis(a["axis"], ts[0].rank, ts[0])},
    reference=_along_ref, decompose=_along_decompose,
    vjp=lambda b, xs, y, g, a: [along_transpose(b, xs[0], xs[1], g, a["axis"]), None],
    doc="x[..., indices[..., i, ...], ...] along axis for each element (as NumPy's "
        "take_along_axis; indices of x's shape off the axis); out-of-range indices raise"))
