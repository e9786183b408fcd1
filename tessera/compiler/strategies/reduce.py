"""reduce: a reduction that keeps the innermost axis (column sums), with its elementwise
prologue. Each column combines its elements into `lanes` accumulators exactly as a row reduction
does (element r into lane r % lanes), so a column gives the same bits alone as inside a wider
tensor. CPU: a block of output columns accumulates at once, so the inner loop reads memory in
order and vectorises. GPU: adjacent threads own adjacent columns (coalesced reads).
"""
from __future__ import annotations

from ..dynamic import is_dynamic, representative
from ..emit import launch_of, loop_nest, prod, reduction_plan, split_index
from ..groups import identity_map
from ..schedule_ir import Kernel
from ..tile_ir import Assign, Const, Decl, Load, Local, Loop, OpCall, Store, Var, idx_add, idx_mul
from .base import register
from .row import ReductionStrategy


class ColumnReduceStrategy(ReductionStrategy):
    name = "reduce"
    column = True

    def lower_cpu(self, k, code):
        return lower_column_reduce(k, code)

    def lower_gpu(self, k, code, target, knobs):
        return gpu_column_reduce(k, code, target, knobs)


register(ColumnReduceStrategy())


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
    # a block's columns, a number: a dynamic width's bucket's widest block, so that its
    # accumulators have room at every size of the bucket (min of the width itself took the
    # size it was traced at as the block: a width of 25 ran 25 blocks of 25, out of bounds)
    jb = min(representative(width), COLUMN_BLOCK)
    outer, body, idx = loop_nest(em, outer_ids, k.knobs.get("parallel"), False)
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
        r_outer, r_body, ridx = loop_nest(em, red_ids[:-1], False, False)
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
        # (a dynamic extent keeps both loops at every size: see compiler/dynamic.py)
        if chunks or is_dynamic(n_red):
            c, l2 = names("ch"), names("l")
            lane_loop = Loop(l2, lanes, "serial")
            update(lane_loop.body, Var(l2), idx_add(idx_mul(Var(c), Const(lanes)), Var(l2)))
            target.append(Loop(c, chunks, "serial", [lane_loop]))
        if tail or is_dynamic(n_red):   # the last elements, element t into lane t
            t = names("tl")
            tail_loop = Loop(t, tail, "serial")
            update(tail_loop.body, Var(t), idx_add(Const(chunks * lanes), Var(t)))
            target.append(tail_loop)
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
    if rest or is_dynamic(width):
        row.extend(block(Const(full * jb), rest))
    return outer if body is not None else row


# ---- one thread per output -----------------------------------------------------------------------
def gpu_column_reduce(k: Kernel, code, target, knobs):
    """A reduction keeping the innermost axis: adjacent threads own adjacent output columns
    (coalesced reads), each combining its column's elements in order."""
    em, kept_ids, red_ids = reduction_plan(k)
    n = k.group.root
    kext = [em.extent(i) for i in kept_ids]
    x = n.inputs[0]
    xd, od = x.type.dtype, n.out.type.dtype.compute    # 16-bit: f32 accumulators
    g, acc = em.names("g"), em.names("acc")
    idx = dict(zip(kept_ids, split_index(Var(g), kext)))
    body = [Decl(acc, od, OpCall(n.op, "init", (), xd, od, ()))]
    outer, inner, ridx = loop_nest(em, red_ids, False, False)
    target_body = body if inner is None else inner
    v = em.value(x, identity_map(x.type.shape), target_body, {**idx, **ridx})
    target_body.append(Assign(acc, OpCall(n.op, "combine", (), xd, od, (Var(acc), v))))
    body += outer
    body.append(Store(k.output.name, em.out_index(idx), Var(acc)))
    total = prod(kext)
    return [Loop(g, total, "grid", body)], launch_of(total, knobs["threads"])
