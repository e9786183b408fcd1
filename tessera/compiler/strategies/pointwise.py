"""pointwise and copy: one value per element of the root's domain.

pointwise: elementwise nodes, with broadcasting, computed as one expression per element (views
of inputs read in place). A function output computed elementwise on the same domain joins as a
second store (an optimizer's new moment beside the new parameter). copy: a view that moves
elements (a transpose, a slice) of a value in memory, alone.
CPU: a loop nest over the domain, adjacent axes merged, `omp parallel` outside and `omp simd`
inside; a float copy that transposes (the output contiguous where the input strides) calls the
transposition routine per block of output rows instead. GPU: one thread per element, or per
16 bytes of elements where the layout allows.
"""
from __future__ import annotations

from ... import dtypes as dt
from ...ops import registry as R
from ..emit import (Emitter, Names, contiguous, idx_div, idx_min, idx_mod, launch_of, loop_nest,
                    prod, split_index, store_all)
from ..groups import identity_map, is_elementwise, is_view, map_from, squeezes_only
from ..schedule_ir import Kernel
from ..tile_ir import Addr, Aligned, Bin, Call, Const, Decl, If, Load, Loop, Var, VecLoad, \
    VecStore, idx_add, idx_mul
from .base import Strategy, register
from .routines import c_transpose
from .row import EXPENSIVE_FLOPS


class PointwiseStrategy(Strategy):
    name = "pointwise"
    knobs = ("unroll",)

    def claims(self, n) -> bool:
        return is_elementwise(n) or squeezes_only(n)

    def absorb(self, grp, p, m, users) -> bool:
        # an expensive producer read through a doubling broadcast (a complex result's parts
        # interleaved) would be computed twice: it keeps a kernel of its own
        if is_elementwise(p) and p.opdef.lowering.flops >= EXPENSIVE_FLOPS and any(
                grp.domain[a] > 1 for a in set(range(len(grp.domain))) - set(m)) and \
                any(u.op == "broadcast_to" for u in grp.nodes):
            return False
        return super().absorb(grp, p, m, users)

    def absorb_output(self, grp, p, users, group_of) -> bool:
        """A function output computed elementwise on the group's domain, used only inside it:
        its inputs are read once, and it is never read back from memory."""
        us = users.get(p.out.id, [])
        if not is_elementwise(p) or not us or any(group_of.get(u) is not grp for u in us) or \
                tuple(p.out.type.shape) != grp.domain or any(u.out.id not in grp.maps for u in us):
            return False        # (a view read through: the group reads p from memory)
        maps = {map_from(u, grp.maps[u.out.id], p.out) for u in us}
        if maps != {identity_map(grp.domain)}:
            return False
        grp.maps[p.out.id] = identity_map(grp.domain)
        grp.stores.append(p)
        return True

    def node_flops(self, n) -> int:
        desc = n.opdef.lowering
        return n.out.type.numel() * desc.flops if isinstance(desc, R.Elementwise) else 0

    def space(self, k) -> dict:
        return {"unroll": [1, 2, 4, 8]}

    def lower_cpu(self, k, code):
        return lower_pointwise(k, code)

    def lower_gpu(self, k, code, target, knobs):
        return gpu_pointwise(k, code, target, knobs)


class CopyStrategy(PointwiseStrategy):
    name = "copy"
    grows = False
    routines = {"transpose": "ts_transpose_{S}"}

    def claims(self, n) -> bool:
        return is_view(n) and not squeezes_only(n)

    def lower_cpu(self, k, code):
        return lower_transposition(k) or lower_pointwise(k, code)

    def c_routine(self, name, dtype):
        return c_transpose.transpose_source(dtype)


register(PointwiseStrategy())
register(CopyStrategy())


def lower_pointwise(k: Kernel, code):
    em = Emitter(k, Names())
    grp = k.group
    loops = em.plan_loops([list(range(len(grp.domain)))])
    if len(loops) > 1 and em.extent(len(loops) - 1) == 2:
        # an innermost pair (a complex value's parts): written out twice under the vector loop
        last = len(loops) - 1
        outer, body, idx = loop_nest(em, range(last), k.knobs.get("parallel"),
                                     k.knobs.get("simd"))
        for j in range(2):
            em.memo.clear()
            store_all(em, k, body, {**idx, last: Const(j)})
        return outer
    outer, body, idx = loop_nest(em, range(len(loops)), k.knobs.get("parallel"),
                                  k.knobs.get("simd"))
    stmts = [] if body is None else body
    store_all(em, k, stmts, idx)
    return outer if body is not None else stmts


# A task of a transposition copies this many of the output's rows (the input's columns)
TRANSPOSE_ROWS = 64


def lower_transposition(k: Kernel):
    """A float32 or float64 copy whose innermost loop writes the output contiguously but reads
    the input with a stride, while another loop reads it contiguously: a call of the
    transposition routine (routines/c_transpose.py) per block of TRANSPOSE_ROWS output rows
    and point of the other loops. None where the copy is not one."""
    d = k.output.type.dtype
    if d.short not in ("f32", "f64") or k.stores:
        return None
    em = Emitter(k, Names())
    grp = k.group
    loops = em.plan_loops([list(range(len(grp.domain)))])
    reads = em.reads(grp.root.out, grp.maps[grp.root.out.id])
    if len(loops) < 2 or len(reads) != 1 or reads[0][0].type.dtype != d:
        return None
    buf, offset, S = reads[0]
    out_S = em._spread(grp.maps[grp.root.out.id], contiguous(grp.root.out.type.shape))
    stride = lambda T, loop: T[loops[loop][-1]]                  # noqa: E731
    last = len(loops) - 1
    rows = [i for i in range(last) if stride(S, i) == 1]
    if stride(out_S, last) != 1 or stride(S, last) in (0, 1) or not rows or \
            min(em.extent(rows[0]), em.extent(last)) < 8 or \
            em.extent(rows[0]) * em.extent(last) < 1024:      # (small: the loop is as good)
        return None
    m = rows[0]
    others = [i for i in range(last) if i != m]
    blocks = -(-em.extent(m) // TRANSPOSE_ROWS)
    t = em.names("task")
    idx = dict(zip(others, split_index(idx_div(Var(t), blocks), [em.extent(i)
                                                                  for i in others])))
    r0 = idx_mul(idx_mod(Var(t), blocks), Const(TRANSPOSE_ROWS))
    idx[m] = r0
    n = em.names("rows")
    body = [Decl(n, dt.int64, idx_min(Const(TRANSPOSE_ROWS), Bin("-", Const(em.extent(m)), r0))),
            Call(f"ts_transpose_{d.short}",
                 (Addr(buf.name, em.index(S, idx, offset)), Const(stride(S, last)),
                  Addr(k.output.name, em.index(out_S, idx)), Const(stride(out_S, m)), Var(n),
                  Const(em.extent(last))), f"transpose:{d.short}")]
    tasks = blocks * prod([em.extent(i) for i in others])
    return [Loop(t, tasks, "parallel" if k.knobs.get("parallel") else "serial", body)]


# ---- one thread per element, or per vector of elements -----------------------------------------
VECTOR_BYTES = 16                  # the widest load a thread issues (ld.global.v4.f32)
MAX_LANES = 8


def gpu_pointwise(k: Kernel, code, target, knobs):
    """One thread per element; where the innermost axis allows, one thread per `lanes`
    consecutive elements instead, each contiguous input read and each output written in one
    16-byte access. The vector path runs when every such buffer is aligned (a caller's view may
    not be); otherwise the scalar loop does the same work. Both compute every element alike:
    the same bits either way."""
    em = Emitter(k, Names())
    loops = em.plan_loops([list(range(len(k.group.domain)))])
    extents = [em.extent(i) for i in range(len(loops))]
    g = em.names("g")
    body = []
    store_all(em, k, body, dict(enumerate(split_index(Var(g), extents))))
    n = prod(extents)
    scalar = Loop(g, n, "grid", body)
    vector = _vector_pointwise(em, k, extents)
    if vector is None:
        return [scalar], launch_of(n, knobs["threads"])
    aligned, loop, lanes = vector
    return [If(aligned, [loop], [scalar])], launch_of(n // lanes, knobs["threads"])


def _vector_pointwise(em: Emitter, k: Kernel, extents):
    """(alignment condition, grid loop, lanes) of the vector path, or None where the output's
    innermost axis is not contiguous or not a multiple of the lanes."""
    grp = k.group
    if not extents or 0 in extents:
        return None
    last = len(extents) - 1

    def contiguous_by(S, offset, lanes):
        """Lane l of a lane group is element index + l, and every group starts aligned."""
        steps = [S[axes[-1]] for axes in em.loops]
        return steps[last] == 1 and offset % lanes == 0 and \
            all(s % lanes == 0 for s in steps[:last])
    stored = [(grp.root.out, k.output)] + k.stores
    reads = [r for v, _ in stored for r in em.reads(v, grp.maps[v.id])]
    wide = [b for b, offset, S in reads if contiguous_by(S, offset, 1)] + [b for _, b in stored]
    lanes = min(MAX_LANES, VECTOR_BYTES // max(b.type.dtype.itemsize for b in wide))
    out_S = em._spread(grp.maps[grp.root.out.id], contiguous(grp.root.out.type.shape))
    if lanes < 2 or extents[last] % lanes or not contiguous_by(out_S, 0, lanes):
        return None
    names = em.names
    gv = names("gv")
    idx = dict(enumerate(split_index(Var(gv), extents[:last] + [extents[last] // lanes])))
    idx[last] = idx_mul(idx[last], Const(lanes))

    def lane_point(lane):
        return {**idx, last: idx_add(idx[last], Const(lane))}
    body, loaded, aligned = [], {}, []
    for b, offset, S in reads:
        if not contiguous_by(S, offset, lanes) or (b.name, offset, tuple(S)) in loaded:
            continue
        name = names("vl")
        loaded[b.name, offset, tuple(S)] = name
        body.append(VecLoad(name, b.type.dtype, b.name, em.index(S, idx, offset), lanes))
        for lane in range(lanes):
            em.loads[Load(b.name, em.index(S, lane_point(lane), offset))] = Load(name, Const(lane))
        aligned.append(Aligned(b.name, lanes * b.type.dtype.itemsize))
    values = {b.name: [] for _, b in stored}
    for lane in range(lanes):
        em.memo.clear()                 # a lane's values are its own
        for v, b in stored:
            values[b.name].append(em.value(v, grp.maps[v.id], body, lane_point(lane)))
    em.loads.clear()
    for _, b in stored:
        body.append(VecStore(b.name, em.out_index(idx), tuple(values[b.name])))
        aligned.append(Aligned(b.name, lanes * b.type.dtype.itemsize))
    conds = list(dict.fromkeys(aligned))
    cond = conds[0]
    for a in conds[1:]:
        cond = Bin("&&", cond, a)
    return cond, Loop(gv, prod(extents) // lanes, "grid", body), lanes
