"""row: reductions sharing one domain and one set of reduced axes that do not keep the innermost
axis (softmax, layernorm, logsumexp, ... however they were written), with their elementwise
prologue and epilogue.

A row kernel evaluates its prologue once per pass over the row (layernorm then softmax: four
passes). An expensive producer (a transcendental such as gelu's erf) that another strategy would
take as its epilogue (a matmul computes it once, while its tile is in cache) stays out of a
row kernel of more than one pass, which would compute it on every pass.
CPU: one row at a time, each reduction a pass into `lanes` accumulators; a whole-tensor
reduction in fixed chunks. GPU: one block per row, a fixed shuffle tree; a short row stays in
registers between passes; a whole-tensor reduction over many blocks and a last-ticket block.
"""
from __future__ import annotations

from ... import dtypes as dt
from ...errors import ArgumentError
from ...ops import registry as R
from ...runtime import targets
from ..dynamic import is_dynamic, representative
from ..emit import (Emitter, idx_min, launch_of, loop_nest, prod, reduction_plan,
                    split_index, store_all)
from ..groups import Group, identity_map, is_column, is_elementwise, is_reduce, reduce_out_map
from ..schedule_ir import Kernel
from ..tile_ir import (Assign, Bin, BlockReduce, Cast, Const, Decl, Expr, If, Load, Local, Loop, OpCall,
                       Shared, Store, ThreadIndex, Ticket, Var, Workspace, idx_add, idx_mul)
from .base import REGISTRY, Strategy, register, worth_threads

EXPENSIVE_FLOPS = 8     # an elementwise op this costly (exp, erf, tanh polynomials) is not worth
                        # evaluating again on every pass of a row kernel
LANES = {4: 16, 8: 8}   # accumulators per reduction, by element size: one vector register each;
                        # fixed, so the association is too (16-bit floats accumulate in f32: by
                        # f32's size)
GPU_ROW_THREADS = (256, 1024)   # a row's block: up to 256 threads, up to 1024 for long rows:
GPU_ROW_PER_THREAD = 16         # enough that each takes at most 16 elements (an 8192-wide softmax
                                # ran 1.7x faster on 512 threads than on 256 or 1024, an H200)
GPU_WARP_MULTIPLE = 64          # blocks are whole warps on both targets (HIP's are 64 wide)


class ReductionStrategy(Strategy):
    """What row and column reductions share: the group over the reduction's input, the cost,
    and the `lanes` knob (accumulators per reduction, the seeds' `vector`)."""
    knobs = ("lanes",)
    numeric_knobs = ("lanes",)
    aliases = {"vector": "lanes"}

    def claims(self, n) -> bool:
        return is_reduce(n) and self.column == is_column(*reduction_axes(n))

    def start(self, n) -> Group:
        domain, axes = reduction_axes(n)
        grp = Group(self.name, n, domain, axes)
        grp.maps[n.out.id] = reduce_out_map(n, domain)
        return grp

    def node_flops(self, n) -> int:
        return n.inputs[0].type.numel()

    def cpu_knobs(self, k) -> dict:
        return {"parallel": worth_threads(prod(k.group.domain)),
                "lanes": LANES.get(k.output.type.dtype.compute.itemsize, 8)}

    def user_knobs(self, schedule) -> dict:
        out = super().user_knobs(schedule)
        if schedule.vector_width is not None:
            out["lanes"] = schedule.vector_width
        return out

    def space(self, k) -> dict:
        return {"lanes": [4, 8, 16, 32]}


def reduction_axes(n) -> tuple:
    return tuple(n.inputs[0].type.shape), tuple(sorted(n.attrs["axis"]))


class RowStrategy(ReductionStrategy):
    name = "row"
    column = False

    def absorb(self, grp, p, m, users) -> bool:
        if is_elementwise(p) and p.opdef.lowering.flops >= EXPENSIVE_FLOPS and \
                passes(grp) > 1 and any(s.takes_as_epilogue(p, users) for s in REGISTRY.values()):
            return False
        if is_reduce(p):
            return self._absorb_reduce(grp, p, m)
        return super().absorb(grp, p, m, users)

    def adopt(self, grp, p, m) -> bool:
        """A pointwise group meeting a reduction becomes a row group over the reduction's
        domain: its maps were over the root's axes; the reduction's output says which domain
        axis each of those is."""
        return grp.kind == "pointwise" and is_reduce(p) and self._absorb_reduce(grp, p, m)

    @staticmethod
    def _absorb_reduce(grp, p, m) -> bool:
        domain, axes = reduction_axes(p)
        if not axes or is_column(domain, axes):
            return False     # column reductions keep their own kernel (and epilogues theirs)
        natural = reduce_out_map(p, domain)
        if grp.kind == "row":
            if domain != grp.domain or axes != grp.reduced or m != natural:
                return False
            grp.maps[p.out.id] = m
            return True
        if grp.domain == domain:
            rebase = {k: k for k in range(len(domain))}
            if m != natural:
                return False
        else:
            rebase = _rebase_through(m, natural)
        if rebase is None or any(d != 1 and k not in rebase for k, d in enumerate(grp.domain)):
            return False

        def moved(vm):
            return tuple(None if a is None else rebase[a] for a in vm)
        new_maps = {vid: moved(vm) for vid, vm in grp.maps.items()}
        grp.kind, grp.domain, grp.reduced, grp.maps = "row", domain, axes, new_maps
        grp.maps[p.out.id] = natural
        return True

    def gpu_knobs(self, k, target) -> dict:
        """A row's thread count (and so its association) depends on the row's length alone,
        never on how many rows there are or on the device."""
        grp = k.group
        width = prod(grp.domain[a] for a in grp.reduced)
        m = GPU_WARP_MULTIPLE
        up = lambda n: max(m, -(-n // m) * m)                          # noqa: E731
        return {"threads": max(min(GPU_ROW_THREADS[0], up(width)),
                               min(GPU_ROW_THREADS[1], up(-(-width // GPU_ROW_PER_THREAD))))}

    def lower_cpu(self, k, code):
        return lower_row(k, code)

    def lower_gpu(self, k, code, target, knobs):
        return gpu_row(k, code, target, knobs)


def _rebase_through(m, natural):
    """Old domain axis -> new domain axis, read off the reduction's output: m says which old
    axis each output axis walks, `natural` which new one."""
    rebase = {}
    for old, new in zip(m, natural):
        if old is not None:
            if new is None or rebase.get(old, new) != new:
                return None
            rebase[old] = new
    return rebase


def passes(grp: Group) -> int:
    """How many times a row group's prologue runs per element: once per reduction, and once
    more for the output when the root spans the reduced axes."""
    reductions = sum(1 for n in grp.nodes if is_reduce(n))
    root_map = grp.maps[grp.root.out.id]
    return reductions + any(a in grp.reduced for a in root_map if a is not None)


register(RowStrategy())


def lower_row(k: Kernel, code):
    """Reductions over the same axes with their prologue and epilogue, one row at a time: each
    reduction is a pass over the row into `lanes` accumulators (a fixed association that does
    not depend on threads or on how many rows there are), values that are constant along the
    row are computed once per row, and a last pass writes the row's output."""
    em, kept_loops, red_loops = reduction_plan(k)
    grp = k.group
    outer, row, idx = loop_nest(em, kept_loops, k.knobs.get("parallel"), False)
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
        inner_outer, inner, ridx = loop_nest(em, red_loops, False, True)
        body = inner if inner is not None else row_body
        full = {**idx, **ridx}
        store_all(em, k, body, full)
        row_body.extend(inner_outer)
    else:
        store_all(em, k, row_body, idx)
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
        m = grp.maps.get(n.out.id)
        if m is None:                   # a view under a view, read through it (fusion.py)
            continue
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
    if not d.is_narrow:
        return value
    name = em.names("r")
    body.append(Decl(name, d, Cast(d, value)))
    return Var(name)


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
    outer, body, ridx = loop_nest(em, outer_red, False, False)
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
    # (a dynamic extent keeps both loops at every size: see compiler/dynamic.py)
    if chunks or is_dynamic(n_inner):
        c, lane = names("ch"), names("l")
        lane_loop = Loop(lane, lanes, "vector")
        update(lane_loop.body, lane,
               idx_add(start, idx_add(idx_mul(Var(c), Const(lanes)), Var(lane))))
        target.append(Loop(c, chunks, "serial", [lane_loop]))
    if tail or is_dynamic(n_inner):
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
    # (a dynamic size: room for the chunks of its bucket's largest, the same for all of it)
    row_body.append(Local(part, od, -(-representative(total_n) // size)))
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


# ---- rows: one block per row ---------------------------------------------------------------------
ROW_RESIDENT = 32      # a row of up to threads * 32 elements stays in registers: read once
ROW_REGISTERS = 64     # 32-bit registers per thread for a resident row's arrays


def gpu_row(k: Kernel, code, target, knobs):
    """CPU row-group semantics (prologue, reductions, row scalars, the stash, the epilogue and
    every extra store), one block per row. Thread t takes the row's elements t, t + threads,
    t + 2 threads, ... in every pass. Where the row fits (ROW_RESIDENT per thread), each thread
    first loads its elements of the inputs the row reads into registers (within a budget), and
    the stash lives in registers too: the passes read no memory, and a softmax row costs one
    read and one write.
    Either way the same elements meet in the same order: the same bits."""
    em, kept_loops, red_loops = reduction_plan(k)
    kext = [em.extent(i) for i in kept_loops]
    rext = [em.extent(i) for i in red_loops]
    threads = knobs["threads"]
    warp = targets.of(target).warp
    if threads % warp:                  # the block reduction shuffles whole warps
        raise ArgumentError(f"{k.name}: {threads} threads per block is not a whole number of "
                            f"{target} warps of {warp}", received=f"threads={threads}",
                            expected=f"a multiple of {warp}")
    r = em.names("row")
    idx = dict(zip(kept_loops, split_index(Var(r), kext)))
    row_body, shared = [], []
    width = prod(rext)
    per_thread = -(-width // threads)
    grp = k.group
    n_passes = passes(grp)
    resident = 1 < per_thread <= ROW_RESIDENT and n_passes > 1     # (one pass reads once anyway)
    t, j = em.names("it"), em.names("j")

    def point_of(jv):
        return {**idx, **dict(zip(red_loops, split_index(jv, rext)))}

    def over_row(body_of):
        """A pass over the row's elements; body_of(loop body, loop point). Resident: the same
        loop variables in every pass, so that every pass reads the registers alike."""
        if not resident:
            jj = em.names("j")
            loop = Loop(jj, width, "thread")
            body_of(loop.body, point_of(Var(jj)))
            return loop
        inside = []
        body_of(inside, point_of(Var(j)))
        return Loop(t, per_thread, "unroll", [
            Decl(j, dt.int64, idx_add(ThreadIndex(), idx_mul(Var(t), Const(threads)))),
            If(Bin("<", Var(j), Const(width)), inside)])
    if resident:
        _keep_row_in_registers(em, k, row_body, over_row, point_of(Var(j)), kept_loops,
                               red_loops, Var(t), per_thread)

    rows = prod(kext)
    chunks = min(WHOLE_CHUNKS, width // (threads * WHOLE_PER_THREAD))
    if rows == 1 and n_passes == 1 and chunks > 1:       # one value from a big tensor
        return _two_stage_reduction(em, k, point_of, width, chunks, threads)

    def reduce(n, stash):
        return _block_reduction(em, n, row_body, over_row, shared, threads, stash)
    if row_values(em, k, row_body, idx, reduce):
        row_body.append(over_row(lambda body, point: store_all(em, k, body, point)))
    else:                       # one value per row: thread 0 stores it
        one = Loop(em.names("j"), 1, "thread")
        store_all(em, k, one.body, idx)
        row_body.append(one)
    return shared + [Loop(r, rows, "block", row_body)], launch_of(rows, threads, per_block=True)


WHOLE_CHUNKS = 1024        # blocks of a whole-tensor reduction at most (the partials' count)
WHOLE_PER_THREAD = 16      # elements per thread of a chunk, at least


def _two_stage_reduction(em: Emitter, k: Kernel, point_of, width, chunks, threads):
    """One value from `width` elements (a sum, a max, a mean: one reduction, then scalar
    arithmetic), over `chunks` blocks. Block c reduces elements [c*C, (c+1)*C) in the row
    kernels' order and writes its partial to the workspace; the block that takes the last
    ticket (an integer atomic) reduces the partials in order, 0 to chunks-1, and stores the
    result. The chunks depend on the size alone: the same bits whichever block ends last, and
    with any number of blocks (a block-stride loop over chunks)."""
    names = em.names
    (n,) = [n for n in k.group.nodes if isinstance(n.opdef.lowering, R.Reduce)]
    x = n.inputs[0]
    xd, od = x.type.dtype, n.out.type.dtype.compute
    size = -(-width // chunks)
    c, part, scratch, ticket = names("chunk"), names("part"), names("red"), names("ticket")
    head = [Shared(scratch, od, threads // 32 + 1),
            Workspace(part, od, 1, chunks)]           # int 0: the ticket counter
    body = []

    def combine(acc, v):
        return Assign(acc, OpCall(n.op, "combine", (), xd, od, (Var(acc), v)))

    def block_total(values, extent, body):
        """Decl acc; a thread loop over extent adding values(j); the block's total."""
        acc, jj, total = names("acc"), names("j"), names("s")
        body.append(Decl(acc, od, OpCall(n.op, "init", (), xd, od, ())))
        loop = Loop(jj, extent, "thread")
        loop.body.append(combine(acc, values(Var(jj), loop.body)))
        body += [loop, BlockReduce(total, od, Var(acc), n.op, xd, scratch)]
        return Var(total)

    def reduce(node, stash):
        start = idx_mul(Var(c), Const(size))
        partial = block_total(
            lambda jj, b: em.value(x, identity_map(x.type.shape), b, point_of(idx_add(start, jj))),
            idx_min(Const(size), Bin("-", Const(width), start)), body)
        body.append(Loop(names("j"), 1, "thread", [Store(part, Var(c), partial)]))
        body.append(Ticket(ticket, 0))
        result = names("total")
        body.append(Decl(result, od, OpCall(n.op, "init", (), xd, od, ())))
        last = If(Bin("==", Var(ticket), Const(chunks - 1)), [], uniform=True)
        total = block_total(lambda jj, b: Load(part, jj), chunks, last.body)
        last.body.append(Assign(result, total))
        body.append(last)
        return Var(result)
    row_values(em, k, body, {}, reduce)
    store = Loop(names("j"), 1, "thread")             # the last block's thread 0
    store_all(em, k, store.body, {})
    body.append(If(Bin("==", Var(ticket), Const(chunks - 1)), [store], uniform=True))
    # the workspace starts after the status word: at 4 bytes past an aligned address, so with an
    # even count of ints per kernel every kernel's partials (int 1) are 8-byte aligned
    ints = 1 + chunks * max(1, od.itemsize // 4)
    launch = {**launch_of(chunks, threads, per_block=True), "workspace": ints + ints % 2}
    return head + [Loop(c, chunks, "block", body)], launch


def _keep_row_in_registers(em: Emitter, k: Kernel, row_body, over_row, point, kept_loops,
                           red_loops, lane, size):
    """Register arrays for a resident row, one per input element stream that moves along the
    row, within ROW_REGISTERS per thread: the streams that also move from row to row first (a
    weight every row shares stays in L1 anyway), then the stash, then the others. A first
    pass fills them, and from then on they stand for those loads; whatever does not fit is
    read again from memory, as it is without registers."""
    grp = k.group
    streams = {}
    for v in [grp.root.out] + [v for v, _ in k.stores]:
        for b, offset, S in em.reads(v, grp.maps[v.id]):
            if any(S[em.loops[i][-1]] for i in red_loops):
                load = Load(b.name, em.index(S, point, offset))
                shared_by_rows = kept_loops and not any(S[em.loops[i][-1]] for i in kept_loops)
                streams.setdefault(load, (2 if shared_by_rows else 0, b.type.dtype.compute))
    reductions = [n for n in grp.nodes if isinstance(n.opdef.lowering, R.Reduce)]
    if _stashable(grp, reductions) is not None:
        stash = Load(k.output.name, em.out_index(point))
        streams[stash] = (1, k.output.type.dtype.compute)
    budget, kept = ROW_REGISTERS, {}
    for load, (_, d) in sorted(streams.items(), key=lambda item: item[1][0]):   # stable
        cost = size * max(1, d.itemsize // 4)
        if cost <= budget:
            budget -= cost
            kept[load] = Local(em.names("reg"), d, size)
    row_body += kept.values()
    fill = [(load, reg) for load, reg in kept.items() if load.buf != k.output.name]
    if fill:
        row_body.append(over_row(lambda body, _: body.extend(
            Store(reg.name, lane, load) for load, reg in fill)))
    for load, reg in kept.items():
        em.loads[load] = Load(reg.name, lane)


def _block_reduction(em: Emitter, n, row_body, over_row, shared, threads, stash):
    """Each thread combines its elements of the row (j = thread, thread + threads, ...) in
    order into `acc`, then the block combines the threads' accumulators. With a stash, each
    element is parked in the output row (or the register standing for it) for the last
    pass."""
    names = em.names
    x = n.inputs[0]
    xm = identity_map(x.type.shape)
    xd, od = x.type.dtype, n.out.type.dtype.compute    # 16-bit: f32 accumulators
    acc = names("acc")
    row_body.append(Decl(acc, od, OpCall(n.op, "init", (), xd, od, ())))

    def accumulate(body, point):
        v = em.value(x, xm, body, point)
        if stash is not None:           # this thread reads the element back in the last pass
            where = Load(em.k.output.name, em.out_index(point))
            where = em.loads.get(where, where)
            body.append(Store(where.buf, where.index, v))
        body.append(Assign(acc, OpCall(n.op, "combine", (), xd, od, (Var(acc), v))))
    row_body.append(over_row(accumulate))
    scratch, total = names("red"), names("s")
    shared.append(Shared(scratch, od, threads // 32 + 1))
    row_body.append(BlockReduce(total, od, Var(acc), n.op, xd, scratch))
    return Var(total)
