"""Schedule IR → Tile IR for GPUs (CUDA, HIP): every strategy mapped onto grid, blocks and threads.

The expressions come from lower.py's Emitter, as on the CPU; only the loop structure differs:
- pointwise, copy, gather: the domain flattened, one thread per element (a grid-stride loop);
  pointwise and copy take 16 bytes per thread through vector accesses where the layout allows;
- row: one block per row (block-stride over rows); the block's threads stride over the row,
  each accumulating its elements in order, then a BlockReduce (a fixed shuffle tree and the
  warps in order): reproducible bits that depend on the row's length, never on the grid. A
  short enough row stays in registers between passes. A whole-tensor reduction is one row:
  a single block, or for a big one to a single value, many blocks and a last-ticket block;
- reduce (columns), argreduce: one thread per output, its reduced elements in order;
- concat, integer matmul: the CPU's loop nests with their independent outer loops flattened
  onto the grid;
- float matmul: one block per (batch, row tile, column tile) task calling the GEMM routine,
  then a barrier and the fused epilogue over the tile by the block's threads;
- attention: one block per (batch, query block) calling the attention routine.
No floating-point atomics anywhere; an out-of-range gather index is a plain int store of the
kernel's code into *ts_status.
"""
from __future__ import annotations

from .. import dtypes as dt
from ..errors import ArgumentError, BackendUnavailableError
from ..ops import registry as R
from .fusion import identity_map
from .lower import (LOWERINGS, Emitter, _Names, _params, _loop_nest, _stashable, _store_all,
                    attention_task, contiguous, gemm_task, idx_div, idx_min, read,
                    reduction_plan, row_values, unflatten)
from .schedule_ir import Kernel, Schedule
from .scheduler import GPU_TARGETS, gpu_knobs
from .tile_ir import (Aligned, Assign, Barrier, Bin, BlockReduce, Call, Cast, CheckIndex, Const,
                      Decl, If, Load, Local, Loop, OpCall, Shared, Store, ThreadIndex, Ticket,
                      TileKernel, TileProgram, Var, VecLoad, VecStore, Workspace, idx_add, idx_mul,
                      substitute)

WARP = {"cuda": 32, "hip": 64}     # lanes per warp (a wavefront of gfx90a on HIP)
GRID_CAP = 65535 * 8               # blocks per launch at most; grid-stride loops cover the rest


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _split(flat, extents) -> list:
    """Per-axis indices (outermost first) of a flat index below prod(extents): the outermost
    needs no remainder (64-bit division is slow on GPUs)."""
    if not extents:
        return []
    return [idx_div(flat, _prod(extents[1:])), *unflatten(flat, extents)[1:]]


def _launch(work: int, threads: int, per_block: bool = False) -> dict:
    """A launch for `work` iterations of a grid loop (one per thread), or of a block loop (one
    per block) when per_block. Shared memory is static (Shared statements): none dynamic."""
    blocks = work if per_block else -(-work // threads)
    return {"grid": max(1, min(blocks, GRID_CAP)), "block": threads, "shared": 0}


# ---- one thread per element, or per vector of elements -----------------------------------------
VECTOR_BYTES = 16                  # the widest load a thread issues (ld.global.v4.f32)
MAX_LANES = 8


def gpu_pointwise(k: Kernel, code, target, knobs):
    """One thread per element; where the innermost axis allows, one thread per `lanes`
    consecutive elements instead, each contiguous input read and each output written in one
    16-byte access. The vector path runs when every such buffer is aligned (a caller's view may
    not be); otherwise the scalar loop does the same work. Both compute every element alike:
    the same bits either way."""
    em = Emitter(k, _Names())
    loops = em.plan_loops([list(range(len(k.group.domain)))])
    extents = [em.extent(i) for i in range(len(loops))]
    g = em.names("g")
    body = []
    _store_all(em, k, body, dict(enumerate(_split(Var(g), extents))))
    n = _prod(extents)
    scalar = Loop(g, n, "grid", body)
    vector = _vector_pointwise(em, k, extents)
    if vector is None:
        return [scalar], _launch(n, knobs["threads"])
    aligned, loop, lanes = vector
    return [If(aligned, [loop], [scalar])], _launch(n // lanes, knobs["threads"])


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
    idx = dict(enumerate(_split(Var(gv), extents[:last] + [extents[last] // lanes])))
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
    return cond, Loop(gv, _prod(extents) // lanes, "grid", body), lanes


def gpu_gather(k: Kernel, code, target, knobs):
    """out[p, q, r] = x[p, idx[q], r]: one thread per output element, each checking its index
    (a bad one stores the kernel's code in *ts_status and reads row 0)."""
    names = _Names()
    x, idx = k.inputs
    axis = k.attrs["axis"]
    xs = list(x.type.shape)
    P, n, Rn, Q = _prod(xs[:axis]), xs[axis], _prod(xs[axis + 1:]), idx.type.numel()
    g, iv = names("g"), names("idx")
    p, q, r = _split(Var(g), [P, Q, Rn])
    src = idx_add(idx_mul(idx_add(idx_mul(p, Const(n)), Var(iv)), Const(Rn)), r)
    body = [Decl(iv, dt.int64, Cast(dt.int64, read(idx, q))), CheckIndex(iv, n, code),
            Store(k.output.name, Var(g), read(x, src))]
    total = P * Q * Rn
    return [Loop(g, total, "grid", body)], _launch(total, knobs["threads"])


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
    if threads % WARP[target]:          # the block reduction shuffles whole warps
        raise ArgumentError(f"{k.name}: {threads} threads per block is not a whole number of "
                            f"{target} warps of {WARP[target]}", received=f"threads={threads}",
                            expected=f"a multiple of {WARP[target]}")
    r = em.names("row")
    idx = dict(zip(kept_loops, _split(Var(r), kext)))
    row_body, shared = [], []
    width = _prod(rext)
    per_thread = -(-width // threads)
    grp = k.group
    passes = sum(isinstance(n.opdef.lowering, R.Reduce) for n in grp.nodes) + \
        any(a in grp.reduced for a in grp.maps[grp.root.out.id] if a is not None)
    resident = 1 < per_thread <= ROW_RESIDENT and passes > 1     # (one pass reads once anyway)
    t, j = em.names("it"), em.names("j")

    def point_of(jv):
        return {**idx, **dict(zip(red_loops, _split(jv, rext)))}

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

    rows = _prod(kext)
    chunks = min(WHOLE_CHUNKS, width // (threads * WHOLE_PER_THREAD))
    if rows == 1 and passes == 1 and chunks > 1:       # one value from a big tensor
        return _two_stage_reduction(em, k, point_of, width, chunks, threads)

    def reduce(n, stash):
        return _block_reduction(em, n, row_body, over_row, shared, threads, stash)
    if row_values(em, k, row_body, idx, reduce):
        row_body.append(over_row(lambda body, point: _store_all(em, k, body, point)))
    else:                       # one value per row: thread 0 stores it
        one = Loop(em.names("j"), 1, "thread")
        _store_all(em, k, one.body, idx)
        row_body.append(one)
    return shared + [Loop(r, rows, "block", row_body)], _launch(rows, threads, per_block=True)


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
    _store_all(em, k, store.body, {})
    body.append(If(Bin("==", Var(ticket), Const(chunks - 1)), [store], uniform=True))
    # the workspace starts after the status word: at 4 bytes past an aligned address, so with an
    # even count of ints per kernel every kernel's partials (int 1) are 8-byte aligned
    ints = 1 + chunks * max(1, od.itemsize // 4)
    launch = {**_launch(chunks, threads, per_block=True), "workspace": ints + ints % 2}
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
    idx = dict(zip(kept_ids, _split(Var(g), kext)))
    body = [Decl(acc, od, OpCall(n.op, "init", (), xd, od, ()))]
    outer, inner, ridx = _loop_nest(em, red_ids, False, False)
    target_body = body if inner is None else inner
    v = em.value(x, identity_map(x.type.shape), target_body, {**idx, **ridx})
    target_body.append(Assign(acc, OpCall(n.op, "combine", (), xd, od, (Var(acc), v))))
    body += outer
    body.append(Store(k.output.name, em.out_index(idx), Var(acc)))
    total = _prod(kext)
    return [Loop(g, total, "grid", body)], _launch(total, knobs["threads"])


def gpu_from_cpu_nests(k: Kernel, code, target, knobs):
    """argreduce, concat, integer matmul: the CPU lowering, each top-level loop nest's perfectly
    nested outer loops (independent iterations in these lowerings) flattened onto the grid, the
    rest serial per thread. Statements outside any loop run on one thread."""
    stmts = LOWERINGS[k.strategy](k, code)
    names = _Names()
    if not all(isinstance(s, Loop) and isinstance(s.extent, int) for s in stmts):
        g = names("gone")
        return [Loop(g, 1, "grid", _serial(stmts))], _launch(1, knobs["threads"])
    out, most = [], 1
    for s in stmts:
        nest = [s]
        while len(nest[-1].body) == 1 and isinstance(nest[-1].body[0], Loop) and \
                isinstance(nest[-1].body[0].extent, int):
            nest.append(nest[-1].body[0])
        g = names("gflat")
        extents = [lp.extent for lp in nest]
        values = {lp.var: e for lp, e in zip(nest, _split(Var(g), extents))}
        out.append(Loop(g, _prod(extents), "grid", substitute(_serial(nest[-1].body), values)))
        most = max(most, _prod(extents))
    return out, _launch(most, knobs["threads"])


def _serial(stmts):
    out = []
    for s in stmts:
        if isinstance(s, Loop):
            s = Loop(s.var, s.extent, "serial", _serial(s.body))
        out.append(s)
    return out


# ---- blocks calling the hand-written routines ----------------------------------------------------
def gpu_contract(k: Kernel, code, target, knobs):
    if not k.output.type.dtype.is_float:
        return gpu_from_cpu_nests(k, code, target, knobs)
    from .target.gpu_gemm import gemm_routine
    names = _Names()
    em = Emitter(k, names)
    grp = k.group
    threads = knobs["threads"]
    tiles = knobs["tile_m"], knobs["tile_n"], knobs["tile_k"]
    task = gemm_task(k, em, *tiles[:2])     # (the routine gets the knobs' tile: mt <= tile_m)
    d = grp.anchor.inputs[0].type.dtype.short
    fn, _ = gemm_routine(target, d, *tiles, threads)
    key = ":".join(map(str, ("gemm", d, *tiles, threads)))
    body = task.decls + [Call(fn, task.args, key),
                         Barrier()]         # the block's raw tile is visible to all its threads
    if grp.root is not grp.anchor:
        e = names("e")
        epi = Loop(e, Bin("*", task.mt, task.nt), "thread")
        point = task.point(Bin("/", Var(e), task.nt), Bin("%", Var(e), task.nt))
        value = em.value(grp.root.out, grp.maps[grp.root.out.id], epi.body, point)
        epi.body.append(Store(k.output.name, em.out_index(point), value))
        body.append(epi)
    return [Loop(task.var, task.tasks, "block", body)], _launch(task.tasks, threads, per_block=True)


def gpu_attention(k: Kernel, code, target, knobs):
    from .target.gpu_attention import attention_routine
    threads = knobs["threads"]
    task = attention_task(k, _Names(), knobs["block_q"])
    d = k.output.type.dtype.short
    fn, _ = attention_routine(target, d, knobs["block_q"], threads)   # nq <= block_q
    body = task.decls + [Call(fn, task.args, f"attention:{d}:{knobs['block_q']}:{threads}"),
                         Barrier()]         # the routine's shared memory is free again after it
    return [Loop(task.var, task.tasks, "block", body)], _launch(task.tasks, threads, per_block=True)


GPU_LOWERINGS = {"pointwise": gpu_pointwise, "copy": gpu_pointwise, "row": gpu_row,
                 "reduce": gpu_column_reduce, "contract": gpu_contract,
                 "argreduce": gpu_from_cpu_nests, "concat": gpu_from_cpu_nests,
                 "gather": gpu_gather, "attention": gpu_attention}


def lower_schedule_gpu(s: Schedule, target: str) -> TileProgram:
    """The GPU Tile IR of a schedule (knobs from build_schedule(..., target=target); a schedule
    built for another target gets the GPU heuristics' knobs)."""
    if target not in GPU_TARGETS:
        raise BackendUnavailableError(f"{target!r} is not a GPU target",
                                      expected=" or ".join(GPU_TARGETS))
    kernels, calls = [], []
    for code, k in enumerate(s.kernels, start=1):
        knobs = k.knobs if s.target == target else gpu_knobs(k, target)
        body, launch = GPU_LOWERINGS[k.strategy](k, code, target, knobs)
        params = _params(k)
        kernels.append(TileKernel(k.name, k.strategy, params, body, dict(knobs),
                                  " ".join(k.fused_labels()), launch=launch))
        calls.append((k.name, [p.name for p in params]))
    return TileProgram(s.name, kernels, calls, [b for b in s.buffers if b.role != "inline"])
