"""Schedule IR → Tile IR: each kernel's strategy becomes a loop nest.

Dispatch is on the kernel's strategy and, inside it, on each node's lowering descriptor, never
on an operator's name. Every buffer is contiguous, so a read is an offset and one stride per
domain axis (0 where it broadcasts); adjacent axes that stay contiguous for every access merge.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from .. import dtypes as dt
from ..errors import ArgumentError, DTypeError
from ..ops import registry as R
from .fusion import identity_map, map_from, squeezes_only
from .schedule_ir import Kernel, Schedule
from .tile_ir import (Addr, Assign, Call, Bin, Cast, CheckIndex, Const, Decl, Expr, Load, Local, Loop, OpCall, Param,
                      Select, Store, TileKernel, TileProgram, Var, idx_add, idx_mul, linear)


def contiguous(shape):
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return list(reversed(out))


def coalesce(extents, stride_lists):
    """Drop size-1 axes; merge axis i into i+1 when every operand steps through both as one."""
    keep = [k for k, e in enumerate(extents) if e != 1]
    ext = [extents[k] for k in keep]
    strides = [[s[k] for k in keep] for s in stride_lists]
    k = len(ext) - 2
    while k >= 0:
        if all(s[k] == s[k + 1] * ext[k + 1] for s in strides):
            ext[k] *= ext[k + 1]
            for s in strides:
                s[k] = s[k + 1]
            del ext[k + 1]
            for s in strides:
                del s[k + 1]
        k -= 1
    return ext, strides


class _Names:
    """Fresh local names. Buffers are named in*, out*, t*, c*, lit*: no prefix here may be one
    of those followed by digits."""

    def __init__(self):
        self.n = 0

    def __call__(self, prefix):
        self.n += 1
        return f"{prefix}{self.n - 1}"


def _nest(extents, names, parallel: bool, simd: bool):
    """Loops over `extents` (outermost first); returns (outer loop list, innermost body, vars)."""
    vars_, loops = [], []
    for k, e in enumerate(extents):
        kind = "serial"
        if k == 0 and parallel:
            kind = "parallel"
        if k == len(extents) - 1 and simd:
            kind = "parallel+vector" if kind == "parallel" else "vector"
        v = names("i")
        vars_.append(Var(v))
        loops.append(Loop(v, e, kind))
    for outer, inner in zip(loops, loops[1:]):
        outer.body.append(inner)
    body = loops[-1].body if loops else None
    return loops[:1], body, vars_


def read(b, index) -> Expr:
    """Element `index` of buffer b; a 0-d constant the scheduler inlined is its literal."""
    if b.role == "inline":
        return Const(b.data.item(), b.type.dtype)
    return Load(b.name, index)


def _params(k: Kernel):
    ps, seen = [], set()
    for b in k.inputs:
        if b.role != "inline" and b.name not in seen:
            seen.add(b.name)
            ps.append(Param(b.name, b.type.dtype, b.type.shape, "in", b.label))
    for b in k.outputs:
        ps.append(Param(b.name, b.type.dtype, b.type.shape, "out"))
    return ps


def _attrs_key(attrs):
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))


def _finish(k: Kernel, body_holder, loops, stmts):
    """Put stmts in the innermost loop (or at top level for a rank-0 nest)."""
    if body_holder is None:
        return stmts
    body_holder.extend(stmts)
    return loops


# ---- fused groups --------------------------------------------------------------------------------
class Emitter:
    """Builds the expression for any value of a fusion group at the current point of a loop nest.

    The loop nest walks the group's domain; `loops` lists, per loop, the domain axes it covers
    (adjacent axes merged when every access steps through them as one). A value outside the
    group, or a view of one, is a load whose index is linear in the loop variables; an
    elementwise value is computed from its inputs, once per loop body (a Decl), so a value used
    twice is computed once. Row-level values of row groups live in `scalars`."""

    def __init__(self, k: Kernel, names):
        self.k, self.grp, self.names = k, k.group, names
        self.inside = {n.out.id for n in self.grp.nodes}
        self.scalars: dict[int, Expr] = {}
        self.stashed: set = set()      # values a row kernel parked in its output row
        self.memo: dict = {}
        self.loads: dict = {}          # Load -> the expression standing for it (vector lanes)

    # -- where values live -------------------------------------------------------------------------
    def leaf(self, v, m):
        """(buffer, offset, strides per domain axis) of a value read from memory, or None."""
        k, grp = self.k, self.grp
        if v.id not in self.inside:
            b = k.reads[v.id]
            return b, 0, self._spread(m, contiguous(v.type.shape))
        n = v.node
        if grp.anchor is not None and n is grp.anchor:
            return k.output, 0, self._spread(m, contiguous(v.type.shape))
        if isinstance(n.opdef.lowering, R.View) and not squeezes_only(n):
            b, offset, strides = view_source(k, n)
            return b, offset, self._spread(m, strides)
        return None

    def _spread(self, m, strides):
        S = [0] * len(self.grp.domain)
        for a, s in zip(m, strides):
            if a is not None:
                S[a] += s
        return S

    def reads(self, v, m, out=None):
        """Every (buffer, offset, strides per domain axis) the group reads to compute v."""
        out = [] if out is None else out
        if v.id in self.scalars or self._inline_const(v):
            return out
        lf = self.leaf(v, m)
        if lf is not None:
            out.append(lf)
            return out
        n = v.node
        if isinstance(n.opdef.lowering, R.Reduce):
            return self.reads(n.inputs[0], identity_map(n.inputs[0].type.shape), out)
        for u in n.inputs:
            self.reads(u, map_from(n, m, u), out)
        return out

    def accesses(self, v, m):
        """Every strides list the group reads with, for choosing which axes can merge."""
        return [S for _, _, S in self.reads(v, m)]

    def _inline_const(self, v):
        return v.id not in self.inside and self.k.reads[v.id].role == "inline"

    # -- expressions -------------------------------------------------------------------------------
    def value(self, v, m, body: list, idx: dict) -> Expr:
        """v (with axis map m) at the loop point idx (loop number -> index Expr)."""
        if v.id in self.scalars:
            return self.scalars[v.id]
        if v.id in self.stashed:
            load = Load(self.k.output.name, self.out_index(idx))
            return self.loads.get(load, load)
        if self._inline_const(v):
            return read(self.k.reads[v.id], None)
        lf = self.leaf(v, m)
        if lf is not None:
            b, offset, S = lf
            load = Load(b.name, self.index(S, idx, offset))
            return self.loads.get(load, load)
        n = v.node
        if isinstance(n.opdef.lowering, R.View):          # a reshape that only renames axes
            u = n.inputs[0]
            return self.value(u, map_from(n, m, u), body, idx)
        key = (v.id, m, id(body))
        if key not in self.memo:
            args = tuple(self.value(u, map_from(n, m, u), body, idx) for u in n.inputs)
            compute = n.inputs[-1].type.dtype
            call = OpCall(n.op, "elem", _attrs_key(n.attrs), compute, n.out.type.dtype, args)
            name = self.names("v")
            body.append(Decl(name, n.out.type.dtype, call))
            self.memo[key] = Var(name)
        return self.memo[key]

    def index(self, S, idx, offset=0) -> Expr:
        e = Const(offset)
        for loop, axes in enumerate(self.loops):
            stride = S[axes[-1]]
            if stride and loop in idx:
                e = idx_add(e, idx_mul(idx[loop], Const(stride)))
        return e

    # -- the loop structure ------------------------------------------------------------------------
    def plan_loops(self, classes):
        """Group domain axes into loops: `classes` lists runs of axes (in loop order) that may
        merge; axes of size 1 get no loop. Sets self.loops (list of axis lists)."""
        grp = self.grp
        out_S = self._spread(grp.maps[grp.root.out.id], contiguous(grp.root.out.type.shape))
        access = self.accesses(grp.root.out, grp.maps[grp.root.out.id]) + [out_S]
        if grp.anchor is not None:
            access = [out_S]
        loops = []
        for run in classes:
            run = [a for a in run if grp.domain[a] != 1]
            cur = []
            for a in run:
                if cur and all(S[cur[-1]] == S[a] * grp.domain[a] for S in access) \
                        and cur[-1] + 1 == a:
                    cur.append(a)
                else:
                    if cur:
                        loops.append(cur)
                    cur = [a]
            if cur:
                loops.append(cur)
        self.loops = loops
        return loops

    def extent(self, loop) -> int:
        e = 1
        for a in self.loops[loop]:
            e *= self.grp.domain[a]
        return e

    def out_index(self, idx):
        grp = self.grp
        S = self._spread(grp.maps[grp.root.out.id], contiguous(grp.root.out.type.shape))
        return self.index(S, idx)


def _loop_nest(em: Emitter, loop_ids, parallel: bool, vector_last: bool):
    """Loops for the given loop numbers (outermost first): (outer list, innermost body, idx)."""
    idx, outer, body = {}, [], None
    for pos, lid in enumerate(loop_ids):
        kind = "parallel" if pos == 0 and parallel else "serial"
        if pos == len(loop_ids) - 1 and vector_last:
            kind = "parallel+vector" if kind == "parallel" else "vector"
        v = em.names("i")
        loop = Loop(v, em.extent(lid), kind)
        idx[lid] = Var(v)
        (outer if body is None else body).append(loop)
        body = loop.body
    return outer, body, idx


def lower_pointwise(k: Kernel, code):
    em = Emitter(k, _Names())
    grp = k.group
    loops = em.plan_loops([list(range(len(grp.domain)))])
    outer, body, idx = _loop_nest(em, range(len(loops)), k.knobs.get("parallel"),
                                  k.knobs.get("simd"))
    stmts = [] if body is None else body
    _store_all(em, k, stmts, idx)
    return outer if body is not None else stmts


def reduction_plan(k: Kernel):
    """A reduction group's Emitter and its loops (by number) over the kept axes and over the
    reduced ones, adjacent axes merged where every access allows."""
    em = Emitter(k, _Names())
    red = list(k.group.reduced)
    kept = [a for a in range(len(k.group.domain)) if a not in red]
    loops = em.plan_loops([kept, red])
    kept_loops = [i for i, axes in enumerate(loops) if axes[0] not in red]
    red_loops = [i for i, axes in enumerate(loops) if axes[0] in red]
    return em, kept_loops, red_loops


def lower_row(k: Kernel, code):
    """Reductions over the same axes with their prologue and epilogue, one row at a time: each
    reduction is a pass over the row into `lanes` accumulators (a fixed association that does
    not depend on threads or on how many rows there are), values that are constant along the
    row are computed once per row, and a last pass writes the row's output."""
    em, kept_loops, red_loops = reduction_plan(k)
    grp = k.group
    outer, row, idx = _loop_nest(em, kept_loops, k.knobs.get("parallel"), False)
    row_body = [] if row is None else row
    lanes = k.knobs.get("lanes", 8)
    reductions = [n for n in grp.nodes if isinstance(n.opdef.lowering, R.Reduce)]
    # the chunked association depends on the size alone: `parallel` only says who runs chunks
    whole = not kept_loops and len(red_loops) == 1 and len(reductions) == 1 and \
        em.extent(red_loops[0]) >= 2 * WHOLE_CHUNK

    def reduce(n, stash):
        if whole:
            return _chunked_reduction(em, n, row_body, red_loops[0], lanes,
                                      bool(k.knobs.get("parallel")))
        return _row_reduction(em, n, row_body, idx, red_loops, lanes, stash=stash)
    if row_values(em, k, row_body, idx, reduce, stash=not whole):
        inner_outer, inner, ridx = _loop_nest(em, red_loops, False, True)
        body = inner if inner is not None else row_body
        full = {**idx, **ridx}
        _store_all(em, k, body, full)
        row_body.extend(inner_outer)
    else:
        _store_all(em, k, row_body, idx)
    return outer if row is not None else row_body


def row_values(em: Emitter, k: Kernel, row_body: list, idx, reduce, stash: bool = True) -> bool:
    """A row group's values that are one per row, in the group's order: each reduction through
    `reduce(node, stash)` (its result rounded to its dtype), every elementwise value constant
    along the row computed once. With `stash`, the last reduction parks its input in the output
    row (see _stashable) when that saves recomputing it. Returns whether the root spans the row,
    so that a last pass over the row writes the output."""
    grp = k.group
    reduced = set(grp.reduced)
    reductions = [n for n in grp.nodes if isinstance(n.opdef.lowering, R.Reduce)]
    stashed = _stashable(grp, reductions) if stash else None
    for n in grp.nodes:
        m = grp.maps[n.out.id]
        if isinstance(n.opdef.lowering, R.Reduce):
            last = stashed is not None and n is reductions[-1]
            em.scalars[n.out.id] = rounded(em, n, row_body, reduce(n, stashed if last else None))
            if last:
                em.stashed.add(stashed.id)
        elif n is not grp.root and isinstance(n.opdef.lowering, R.Elementwise) and \
                not any(a in reduced for a in m if a is not None):
            em.scalars[n.out.id] = em.value(n.out, m, row_body, idx)
    return any(a in reduced for a in grp.maps[grp.root.out.id] if a is not None)


def rounded(em: Emitter, n, body: list, value: Expr) -> Expr:
    """A reduction's result in the operator's dtype: a 16-bit result, accumulated in float32,
    is rounded once here (as the operator's reference is), before anything fused uses it."""
    d = n.out.type.dtype
    if not d.is_half:
        return value
    name = em.names("r")
    body.append(Decl(name, d, Cast(d, value)))
    return Var(name)


def _store_all(em: Emitter, k: Kernel, body: list, idx):
    """The kernel's output and its extra stores (values on the root's domain and layout)."""
    grp = k.group
    for v, b in [(grp.root.out, k.output)] + k.stores:
        body.append(Store(b.name, em.out_index(idx), em.value(v, grp.maps[v.id], body, idx)))


def _stashable(grp, reductions):
    """The input of the last reduction, when the output row needs it again (softmax's exp):
    the reduction's pass parks it in the output row and the last pass reads it back instead
    of computing it twice. Same expression, same bits."""
    if not reductions or grp.root is reductions[-1]:
        return None
    x = reductions[-1].inputs[0]
    root = grp.root.out
    if x.node is None or x.node not in grp.nodes or not isinstance(x.node.opdef.lowering,
                                                                   R.Elementwise):
        return None
    if tuple(root.type.shape) != tuple(grp.domain) or root.type.dtype != x.type.dtype or \
            grp.maps[root.id] != identity_map(grp.domain):
        return None
    stack, seen = [grp.root], set()          # is x in the root's expression (not via a scalar)?
    while stack:
        n = stack.pop()
        for u in n.inputs:
            if u is x:
                return x
            if u.node is not None and u.node in grp.nodes and u.id not in seen and \
                    not isinstance(u.node.opdef.lowering, R.Reduce):
                seen.add(u.id)
                stack.append(u.node)
    return None


def _row_reduction(em: Emitter, n, row_body, idx, red_loops, lanes, start=Const(0),
                   length=None, stash=None) -> Expr:
    """acc[lanes] over the row (elements start .. start+length of the innermost reduced loop,
    all of it by default), then the lanes combined in order; returns the result's Var. With
    `stash`, each element of that value is also written to the output row."""
    names = em.names
    x = n.inputs[0]
    xm = identity_map(x.type.shape)
    xd, od = x.type.dtype, n.out.type.dtype.compute    # 16-bit: f32 accumulators
    init = OpCall(n.op, "init", (), xd, od, ())
    if not red_loops:                      # every reduced axis has size 1 (or the row is empty)
        name = names("s")
        row_body.append(Decl(name, od, OpCall(n.op, "combine", (), xd, od,
                                              (init, em.value(x, xm, row_body, idx)))))
        return Var(name)
    acc = names("acc")
    l0 = names("l")
    row_body.append(Local(acc, od, lanes))
    row_body.append(Loop(l0, lanes, "vector", [Store(acc, Var(l0), init)]))
    outer_red, inner_red = red_loops[:-1], red_loops[-1]
    outer, body, ridx = _loop_nest(em, outer_red, False, False)
    target = row_body if body is None else body
    n_inner = em.extent(inner_red) if length is None else length
    chunks, tail = divmod(n_inner, lanes)

    def update(lane_body, lane_var, inner_index):
        point = {**idx, **ridx, inner_red: inner_index}
        v = em.value(x, xm, lane_body, point)
        if stash is not None:
            lane_body.append(Store(em.k.output.name, em.out_index(point), v))
        lane_body.append(Store(acc, Var(lane_var),
                               OpCall(n.op, "combine", (), xd, od, (Load(acc, Var(lane_var)), v))))
    if chunks:
        c, lane = names("ch"), names("l")
        lane_loop = Loop(lane, lanes, "vector")
        update(lane_loop.body, lane,
               idx_add(start, idx_add(idx_mul(Var(c), Const(lanes)), Var(lane))))
        target.append(Loop(c, chunks, "serial", [lane_loop]))
    if tail:
        lane = names("l")
        tail_loop = Loop(lane, tail, "vector")
        update(tail_loop.body, lane, idx_add(start, idx_add(Const(chunks * lanes), Var(lane))))
        target.append(tail_loop)
    row_body.extend(outer)
    total, l1 = names("s"), names("l")
    row_body.append(Decl(total, od, Load(acc, Const(0))))
    row_body.append(Loop(l1, lanes - 1, "serial", [Assign(total, OpCall(
        n.op, "combine", (), xd, od, (Var(total), Load(acc, idx_add(Var(l1), Const(1))))))]))
    return Var(total)


WHOLE_CHUNK = 1 << 14  # a reduction of a whole tensor splits into chunks of at least this many
MAX_CHUNKS = 4096      # elements, and at most this many chunks: both depend on the size alone


def _chunked_reduction(em: Emitter, n, row_body, red_loop, lanes, parallel: bool) -> Expr:
    """A reduction over a whole tensor: fixed-size chunks reduced in parallel (each into lanes,
    as a row would be), then the chunks' results combined in order. The chunking depends on
    the size only, never on the thread count, so the result does not either."""
    names = em.names
    x = n.inputs[0]
    xd, od = x.type.dtype, n.out.type.dtype.compute    # 16-bit: f32 accumulators
    total_n = em.extent(red_loop)
    size = max(WHOLE_CHUNK, -(-total_n // MAX_CHUNKS))
    full, rest = divmod(total_n, size)
    part, c = names("part"), names("ch")
    row_body.append(Local(part, od, full + (1 if rest else 0)))
    chunk = []
    s_ = _row_reduction(em, n, chunk, {}, [red_loop], lanes, idx_mul(Var(c), Const(size)), size)
    chunk.append(Store(part, Var(c), s_))
    row_body.append(Loop(c, full, "parallel" if parallel else "serial", chunk))
    if rest:
        s_ = _row_reduction(em, n, row_body, {}, [red_loop], lanes, Const(full * size), rest)
        row_body.append(Store(part, Const(full), s_))
    total, i = names("s"), names("ch")
    row_body.append(Decl(total, od, Load(part, Const(0))))
    row_body.append(Loop(i, full + (1 if rest else 0) - 1, "serial", [Assign(total, OpCall(
        n.op, "combine", (), xd, od, (Var(total), Load(part, idx_add(Var(i), Const(1))))))]))
    return Var(total)


COLUMN_BLOCK = 256      # output columns accumulated together by a column reduction


def lower_column_reduce(k: Kernel, code):
    """A reduction that keeps the innermost axis: a block of output columns accumulates at once,
    so the inner loop reads memory in order and vectorises. Each column combines its inputs
    into `lanes` accumulators exactly as a row reduction does (element r into lane r % lanes),
    so a column gives the same bits alone as inside a wider tensor."""
    em, kept_ids, red_ids = reduction_plan(k)
    names = em.names
    n = k.group.root
    outer_ids, inner = kept_ids[:-1], kept_ids[-1]      # inner: the loop over the last axis
    x = n.inputs[0]
    xm = identity_map(x.type.shape)
    xd, od = x.type.dtype, n.out.type.dtype.compute    # 16-bit: f32 accumulators
    lanes = k.knobs.get("lanes", 8)
    width = em.extent(inner)
    jb = min(width, COLUMN_BLOCK)
    outer, body, idx = _loop_nest(em, outer_ids, k.knobs.get("parallel"), False)
    row = [] if body is None else body
    acc = names("acc")
    row.append(Local(acc, od, lanes * jb))
    init = OpCall(n.op, "init", (), xd, od, ())

    def block(start, cols):
        """The statements for output columns start .. start+cols of this row."""
        stmts = []
        l, j = names("l"), names("j")
        stmts.append(Loop(l, lanes, "serial", [Loop(j, cols, "vector", [
            Store(acc, idx_add(idx_mul(Var(l), Const(jb)), Var(j)), init)])]))
        r_outer, r_body, ridx = _loop_nest(em, red_ids[:-1], False, False)
        target = stmts if r_body is None else r_body

        def update(dst, lane, r_index):
            j2 = names("j")
            col = idx_add(start, Var(j2))
            point = {**idx, **ridx, inner: col}
            if red_ids:
                point[red_ids[-1]] = r_index
            upd = Loop(j2, cols, "vector")
            v = em.value(x, xm, upd.body, point)
            slot = idx_add(idx_mul(lane, Const(jb)), Var(j2))
            upd.body.append(Store(acc, slot, OpCall(n.op, "combine", (), xd, od,
                                                    (Load(acc, slot), v))))
            dst.append(upd)
        n_red = em.extent(red_ids[-1]) if red_ids else 1
        chunks, tail = divmod(n_red, lanes)
        if chunks:
            c, l2 = names("ch"), names("l")
            lane_loop = Loop(l2, lanes, "serial")
            update(lane_loop.body, Var(l2), idx_add(idx_mul(Var(c), Const(lanes)), Var(l2)))
            target.append(Loop(c, chunks, "serial", [lane_loop]))
        for t in range(tail):
            update(target, Const(t), Const(chunks * lanes + t))
        stmts.extend(r_outer)
        j3, l3, s_ = names("j"), names("l"), names("s")
        point = {**idx, inner: idx_add(start, Var(j3))}
        stmts.append(Loop(j3, cols, "vector", [
            Decl(s_, od, Load(acc, Var(j3))),
            Loop(l3, lanes - 1, "serial", [Assign(s_, OpCall(n.op, "combine", (), xd, od, (
                Var(s_), Load(acc, idx_add(idx_mul(idx_add(Var(l3), Const(1)), Const(jb)),
                                           Var(j3))))))]),
            Store(k.output.name, em.out_index(point), Var(s_))]))
        return stmts

    full, rest = divmod(width, jb)
    b = names("b")
    row.append(Loop(b, full, "serial", block(idx_mul(Var(b), Const(jb)), jb)))
    if rest:
        row.extend(block(Const(full * jb), rest))
    return outer if body is not None else row


def _groups(in_shape, reduced):
    """Coalesced (extents, in strides, out strides) of the kept and of the reduced axes."""
    cs = contiguous(in_shape)
    kept = [a for a in range(len(in_shape)) if a not in reduced]
    out_cs = contiguous([in_shape[a] for a in kept])
    kept_ext, (kept_in, kept_out) = coalesce([in_shape[a] for a in kept],
                                              [[cs[a] for a in kept], out_cs])
    red_ext, (red_in,) = coalesce([in_shape[a] for a in sorted(reduced)],
                                  [[cs[a] for a in sorted(reduced)]])
    return kept_ext, kept_in, kept_out, red_ext, red_in


def lower_argreduce(k: Kernel, code):
    names = _Names()
    x = k.inputs[0]
    xd = x.type.dtype
    shape = list(x.type.shape)
    axis = k.attrs["axis"]
    if axis is None:
        kept_ext, kept_in, kept_out, red_ext, red_in = [], [], [], [x.type.numel()], [1]
    else:
        kept_ext, kept_in, kept_out, red_ext, red_in = _groups(shape, {axis})
    outer, inner, kvars = _nest(kept_ext, names, k.knobs.get("parallel"), False)
    base = linear(kvars, kept_in)
    bi, bv, v, better = names("best_i"), names("best_v"), names("v"), names("better")
    body = [Decl(bi, dt.int64, Const(0)), Decl(bv, xd, read(x, base))]
    if red_ext:
        r = names("r")
        loop = Loop(r, red_ext[0], "serial", [
            Decl(v, xd, read(x, linear([*kvars, Var(r)], kept_in + red_in))),
            Decl(better, dt.bool_, OpCall(k.op, "better", (), xd, dt.bool_, (Var(v), Var(bv)))),
            Assign(bv, Select(Var(better), Var(v), Var(bv))),
            Assign(bi, Select(Var(better), Var(r), Var(bi)))])
        body.append(loop)
    body.append(Store(k.output.name, linear(kvars, kept_out), Var(bi)))
    return _finish(k, inner, outer, body)


def view_source(k: Kernel, n):
    """(buffer, offset, strides per output axis) of a view node read in place. Its source may
    be a reshape of a buffer: every buffer is contiguous, so a reshape moves nothing."""
    src = n.inputs[0]
    offset, strides = n.opdef.lowering.strides(src.type, n.out.type, n.attrs)
    while src.id not in k.reads:
        src = src.node.inputs[0]            # a reshape the group absorbed
    return k.reads[src.id], offset, list(strides)


def operand(k: Kernel, v):
    """(buffer, offset, strides per axis) of a contraction operand: a buffer, or a view of one
    read in place (x @ w.T never copies w)."""
    if v.id in k.reads:
        return k.reads[v.id], 0, contiguous(v.type.shape)
    return view_source(k, v.node)


def contract_operands(k: Kernel):
    """Per operand: buffer, offset, per-batch-axis strides (0 where broadcast), row and column
    strides; plus M, N, K and the output's batch shape."""
    c = k.group.anchor
    out = list(c.out.type.shape)
    batch = out[:-2]
    ops = []
    for v in c.inputs:
        b, off, st = operand(k, v)
        ops.append((b, off, batch_strides(list(v.type.shape), st, batch), st[-2], st[-1]))
    M, K_ = c.inputs[0].type.shape[-2], c.inputs[0].type.shape[-1]
    return ops, M, out[-1], K_, batch


def lower_contract(k: Kernel, code):
    if k.output.type.dtype.is_float:
        return lower_gemm_tiles(k)
    return lower_contract_loops(k)


def lower_gemm_tiles(k: Kernel):
    """Float matmuls: a fixed grid of (batch, row tile, column tile) tasks, each one call of the
    packed GEMM routine and then the epilogue over the finished tile while it is in cache. The
    grid depends on the shapes and knobs only, never on the thread count."""
    names = _Names()
    em = Emitter(k, names)
    grp = k.group
    d = k.output.type.dtype
    task = gemm_task(k, em, k.knobs["tile_m"], k.knobs["tile_n"])
    body = task.decls + [Call(f"ts_gemm_tile_{d.short}", task.args + (Const(k.knobs["tile_k"]),),
                              f"gemm:{d.short}")]
    if grp.root is not grp.anchor:
        ii, jj = names("i"), names("j")
        epi = Loop(jj, task.nt, "vector" if k.knobs.get("simd") else "serial")
        point = task.point(Var(ii), Var(jj))
        value = em.value(grp.root.out, grp.maps[grp.root.out.id], epi.body, point)
        epi.body.append(Store(k.output.name, em.out_index(point), value))
        body.append(Loop(ii, task.mt, "serial", [epi]))
    return [Loop(task.var, task.tasks, "parallel" if k.knobs.get("parallel") else "serial", body)]


def gemm_task(k: Kernel, em: Emitter, tile_m: int, tile_n: int) -> SimpleNamespace:
    """One task of a float matmul's grid of (batch, row tile, column tile) tasks: its variable
    `var` over `tasks`, the statements `decls` that place its tile (i0, j0 and the tile's size
    mt x nt), the routine's operands `args` (A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, K, mt, nt)
    and `point(ii, jj)`, the Emitter's loop point of tile element (ii, jj). Shared by every
    target (the CPU's packed routine, a GPU block's)."""
    names = em.names
    ((A, a_off, a_b, a_rs, a_cs), (B, b_off, b_b, b_rs, b_cs)), M, N, K_, batch = \
        contract_operands(k)
    em.loops = [[a] for a in range(len(k.group.domain))]
    MT, NT = min(tile_m, max(M, 1)), min(tile_n, max(N, 1))
    tm, tn = -(-M // MT), -(-N // NT)
    nb = 1
    for e in batch:
        nb *= e
    t = names("task")
    bidx = unflatten(idx_div(Var(t), tm * tn), batch) if batch else []
    i0, j0, mt, nt = names("i0"), names("j0"), names("mt"), names("nt")
    rest = idx_mod(Var(t), tm * tn)
    decls = [Decl(i0, dt.int64, idx_mul(idx_div(rest, tn), Const(MT))),
             Decl(j0, dt.int64, idx_mul(idx_mod(rest, tn), Const(NT))),
             Decl(mt, dt.int64, idx_min(Const(MT), Bin("-", Const(M), Var(i0)))),
             Decl(nt, dt.int64, idx_min(Const(NT), Bin("-", Const(N), Var(j0))))]
    abase = idx_add(linear(bidx, a_b, a_off), idx_mul(Var(i0), Const(a_rs)))
    bbase = idx_add(linear(bidx, b_b, b_off), idx_mul(Var(j0), Const(b_cs)))
    obase = linear(bidx, contiguous(batch + [M, N])[:-2])
    cbase = idx_add(obase, idx_add(idx_mul(Var(i0), Const(N)), Var(j0)))
    args = (Addr(A.name, abase), Const(a_rs), Const(a_cs), Addr(B.name, bbase), Const(b_rs),
            Const(b_cs), Addr(k.output.name, cbase), Const(N), Const(K_), Var(mt), Var(nt))

    def point(ii, jj):
        return {**{q: bidx[q] for q in range(len(batch))},
                len(batch): idx_add(Var(i0), ii), len(batch) + 1: idx_add(Var(j0), jj)}
    return SimpleNamespace(var=t, tasks=nb * tm * tn, decls=decls, args=args, point=point,
                 mt=Var(mt), nt=Var(nt), tile=(MT, NT))


def lower_contract_loops(k: Kernel):
    """Integer matmuls: plain loops (fusion gives only float matmuls an epilogue)."""
    names = _Names()
    em = Emitter(k, names)
    ((A, a_off, a_b, a_rs, a_cs), (B, b_off, b_b, b_rs, b_cs)), M, N, K_, batch = \
        contract_operands(k)
    em.loops = [[a] for a in range(len(k.group.domain))]
    d = k.output.type.dtype
    par = bool(k.knobs.get("parallel"))
    bl, binner, bidx = _loop_nest(em, range(len(batch)), par, False)
    bvars = [bidx[q] for q in range(len(batch))]
    abase = linear(bvars, a_b, a_off)
    bbase = linear(bvars, b_b, b_off)
    obase = linear(bvars, contiguous(batch + [M, N])[:-2])
    i, kk, j, j2, av = names("i"), names("k"), names("j"), names("j"), names("a")
    orow = idx_add(obase, idx_mul(Var(i), Const(N)))
    simd = "vector" if k.knobs.get("simd") else "serial"
    row = Loop(i, M, "parallel" if par and not batch else "serial", [
        Loop(j, N, simd, [Store(k.output.name, idx_add(orow, Var(j)), Const(0, d))]),
        Loop(kk, K_, "serial", [
            Decl(av, d, read(A, idx_add(idx_add(abase, idx_mul(Var(i), Const(a_rs))),
                                        idx_mul(Var(kk), Const(a_cs))))),
            Loop(j2, N, simd, [Store(k.output.name, idx_add(orow, Var(j2)), Bin(
                "+", Load(k.output.name, idx_add(orow, Var(j2))),
                Bin("*", Var(av), read(B, idx_add(idx_add(bbase, idx_mul(Var(kk), Const(b_rs))),
                                                  idx_mul(Var(j2), Const(b_cs)))))))])])])
    if binner is None:
        return [row]
    binner.append(row)
    return bl


def idx_min(a, b):
    return Select(Bin("<", a, b), a, b)


def idx_div(a, e: int):
    return a if e == 1 else Bin("/", a, Const(e))


def idx_mod(a, e: int):
    return Const(0) if e == 1 else Bin("%", a, Const(e))


def unflatten(flat, extents):
    """Per-axis indices (outermost first) of a flat index over `extents`."""
    out, rest = [], flat
    for e in reversed(extents):
        out.append(idx_mod(rest, e))
        rest = idx_div(rest, e)
    return list(reversed(out))


def batch_strides(shape, strides, batch):
    """An operand's strides over the output's batch axes (0 where it broadcasts)."""
    pad = len(batch) - (len(shape) - 2)
    return [0 if q < pad or shape[q - pad] == 1 else strides[q - pad] for q in range(len(batch))]


def lower_attention(k: Kernel, code):
    """One task per (batch, block of queries); the routine streams keys in blocks with an online
    softmax, so the Sq x Sk scores never exist."""
    d = k.output.type.dtype
    task = attention_task(k, _Names(), k.knobs.get("block_q", 64))
    body = task.decls + [Call(f"ts_attention_block_{d.short}", task.args, f"attention:{d.short}",
                              code if d.is_half else 0)]     # 16-bit: widened scratch (c.py)
    return [Loop(task.var, task.tasks, "parallel" if k.knobs.get("parallel") else "serial", body)]


def attention_task(k: Kernel, names, block_q: int) -> SimpleNamespace:
    """One (batch, block of queries) task of attention: its variable `var` over `tasks`, the
    statement placing it (q0) and the routine's arguments (those of ts_attention_block_*)."""
    n = k.group.anchor
    q, kk, v, mask = n.inputs
    out = list(n.out.type.shape)
    batch, Sq, Dv = out[:-2], out[-2], out[-1]
    Sk, D = kk.type.shape[-2], q.type.shape[-1]
    d = k.output.type.dtype
    bq = min(block_q, max(Sq, 1))
    nqb = -(-Sq // bq)
    nb = 1
    for e in batch:
        nb *= e
    t = names("task")
    bidx = unflatten(idx_div(Var(t), nqb), batch) if batch else []
    q0 = names("q0")
    args = []
    for val in (q, kk, v):
        b, off, st = operand(k, val)
        base = linear(bidx, batch_strides(list(val.type.shape), st, batch), off)
        args += [Addr(b.name, base), Const(st[-2])]
    if mask.id in k.reads and k.reads[mask.id].role == "inline":
        args += [Addr(None), Const(0), Const(0)]
        if not np.isfinite(k.reads[mask.id].data):
            raise ArgumentError("attention's mask is a single non-finite number: every key would "
                                "be masked", location=k.group.anchor.loc, op="attention",
                                hint="pass a mask with 0 where a key is kept")
    else:
        b, off, st = operand(k, mask)
        if b.type.dtype != d:       # the routines read the mask as d: other bits would be garbage
            raise DTypeError(f"attention's mask is {b.type.dtype.name}, but q, k and v compute in "
                             f"{d.name}", location=n.loc, op="attention",
                             received=b.type.dtype.name, expected=d.name,
                             hint=f"op.cast(mask, dtype='{d.name}')")
        full = list(mask.type.shape)
        pad = len(out) - len(full)
        st = [0] * pad + [0 if full[i] == 1 else st[i] for i in range(len(full))]
        args += [Addr(b.name, linear(bidx, st[:-2], off)), Const(st[-2]), Const(st[-1])]
    obase = linear(bidx, contiguous(batch + [Sq, Dv])[:-2])
    args += [Addr(k.output.name, obase), Const(Dv), Var(q0),
             idx_min(Const(bq), Bin("-", Const(Sq), Var(q0))), Const(Sk), Const(D), Const(Dv),
             Const(n.attrs["scale"], d), Const(int(n.attrs["causal"])), Const(Sk - Sq)]
    decls = [Decl(q0, dt.int64, idx_mul(idx_mod(Var(t), nqb), Const(bq)))]
    return SimpleNamespace(var=t, tasks=nb * nqb, decls=decls, args=tuple(args), block_q=bq)


def lower_concat(k: Kernel, code):
    names = _Names()
    out = k.output.type
    axis = k.attrs["axis"]
    ocs = contiguous(out.shape)
    stmts, offset = [], 0
    for v in k.group.root.inputs:       # per operand: one buffer may be concatenated twice
        b = k.reads[v.id]
        shape = list(b.type.shape)
        ext, (is_, os_) = coalesce(shape, [contiguous(shape), list(ocs)])
        loops, inner, vars_ = _nest(ext, names, k.knobs.get("parallel"), k.knobs.get("simd"))
        st = Store(k.output.name, linear(vars_, os_, offset * ocs[axis]),
                   Cast(out.dtype, read(b, linear(vars_, is_))))
        stmts += _finish(k, inner, loops, [st])
        offset += b.type.shape[axis]
    return stmts


def lower_gather(k: Kernel, code):
    names = _Names()
    x, idx = k.inputs
    axis = k.attrs["axis"]
    xs = list(x.type.shape)
    P = 1
    for d in xs[:axis]:
        P *= d
    n = xs[axis]
    Rn = 1
    for d in xs[axis + 1:]:
        Rn *= d
    Q = idx.type.numel()
    # one index load and bounds check per gathered row, then the row is copied
    outer, inner, (p, q) = _nest_keep([P, Q], names, k.knobs.get("parallel"), False)
    iv = names("idx")
    r = Var(names("r")) if Rn != 1 else Const(0)
    src = idx_add(idx_mul(idx_add(idx_mul(p, Const(n)), Var(iv)), Const(Rn)), r)
    dst = idx_add(idx_mul(idx_add(idx_mul(p, Const(Q)), q), Const(Rn)), r)
    copy = Store(k.output.name, dst, read(x, src))
    if Rn != 1:
        copy = Loop(r.name, Rn, "vector" if k.knobs.get("simd") else "serial", [copy])
    stmts = [Decl(iv, dt.int64, Cast(dt.int64, read(idx, q))), CheckIndex(iv, n, code), copy]
    return _finish(k, inner, outer, stmts)


def _nest_keep(extents, names, parallel, simd):
    """Like _nest, but every axis gets a variable (Const(0) for size-1 axes, which get no loop)."""
    real = [e for e in extents if e != 1]
    outer, inner, vars_ = _nest(real, names, parallel, simd)
    it = iter(vars_)
    return outer, inner, [next(it) if e != 1 else Const(0) for e in extents]


LOWERINGS = {"pointwise": lower_pointwise, "copy": lower_pointwise, "row": lower_row,
             "reduce": lower_column_reduce, "contract": lower_contract,
             "argreduce": lower_argreduce, "concat": lower_concat, "gather": lower_gather,
             "attention": lower_attention}


def lower_schedule(s: Schedule) -> TileProgram:
    kernels, calls = [], []
    for code, k in enumerate(s.kernels, start=1):
        body = LOWERINGS[k.strategy](k, code)
        params = _params(k)
        kernels.append(TileKernel(k.name, k.strategy, params, body, dict(k.knobs),
                                  " ".join(k.fused_labels())))
        calls.append((k.name, [p.name for p in params]))
    buffers = [b for b in s.buffers if b.role != "inline"]
    return TileProgram(s.name, kernels, calls, buffers)
