"""Graph IR (primitive, concrete) → Schedule IR: fusion groups become kernels, with knobs from
heuristics and a cost (FLOPs, bytes) for each."""
from __future__ import annotations

from ..ops import registry as R
from .fusion import Group, fuse
from .graph_ir import Graph
from .schedule_ir import Buffer, Kernel, Schedule

PARALLEL_MIN_ELEMENTS = 1 << 16     # below this, starting threads costs more than it saves
PARALLEL_MIN_FLOPS = 1 << 20
LANES = {4: 16, 8: 8}               # accumulators per row reduction, by element size: one
                                    # vector register each; fixed, so the association is too
                                    # (16-bit floats accumulate in f32: by f32's size)


def build_schedule(g: Graph, target: str = "cpu", fusion: bool = True, user=None,
                   tuned=None) -> Schedule:
    """Knobs, weakest first: the heuristics', `tuned(kernel)` (the autotuning database's record,
    or None), an operator's own tile_shape, then `user` (a tessera.Schedule)."""
    buffers: list[Buffer] = []
    of: dict[int, Buffer] = {}
    for k, p in enumerate(g.params):
        # the compiler names every buffer itself: a user's parameter called `out0`, `int` or
        # `INFINITY` must not meet a temporary, a C keyword or a macro
        of[p.id] = Buffer(f"in{k}", p.type, "input", param=k, label=p.param_name)
        buffers.append(of[p.id])
    n_const = 0
    for n in g.nodes:
        if n.op == "const":
            value = n.attrs["value"]
            role, prefix = ("inline", "lit") if value.ndim == 0 else ("const", "c")
            of[n.out.id] = Buffer(f"{prefix}{n_const}", n.out.type, role, value)
            buffers.append(of[n.out.id])
            n_const += 1
    out_ids = {v.id: k for k, v in reversed(list(enumerate(g.outputs)))}
    kernels, n_temp = [], 0
    for grp in fuse(g, enabled=fusion):
        v = grp.root.out
        if v.id in out_ids:
            b = Buffer(f"out{out_ids[v.id]}", v.type, "output")
        else:
            b = Buffer(f"t{n_temp}", v.type, "temp")
            n_temp += 1
        of[v.id] = b
        buffers.append(b)
        stores = []
        for n in grp.stores:            # outputs by definition: nothing outside reads them
            sb = Buffer(f"out{out_ids[n.out.id]}", n.out.type, "output")
            of[n.out.id] = sb
            buffers.append(sb)
            stores.append((n.out, sb))
        inside = {n.out.id for n in grp.nodes}
        inputs, reads = [], {}
        for n in grp.nodes:
            for x in n.inputs:
                if x.id not in inside and x.id not in reads:
                    reads[x.id] = of[x.id]
                    if of[x.id] not in inputs:
                        inputs.append(of[x.id])
        k = Kernel(name=f"k{len(kernels)}_{label(grp)}", strategy=grp.kind, op=grp.root.op,
                   attrs=dict(grp.root.attrs), inputs=inputs, output=b, fuses=list(grp.nodes),
                   group=grp, reads=reads, stores=stores)
        k.flops = kernel_flops(grp)
        k.bytes = sum(x.nbytes for x in inputs if x.role != "inline") + \
            sum(x.nbytes for x in k.outputs)
        k.knobs = gpu_knobs(k, target) if target in GPU_TARGETS else default_knobs(k)
        record = tuned(k) if tuned is not None else None
        if record:
            k.knobs.update(record)
            k.tuned = True
        tile = grp.anchor.attrs.get("tile_shape") if grp.anchor is not None else None
        if tile and k.strategy == "contract":       # op.matmul(..., tile_shape=(BM, BN, BK))
            k.knobs.update(zip(("tile_m", "tile_n", "tile_k"), tile))
        if user is not None:
            k.knobs.update(user.knobs_for(k.strategy))
        kernels.append(k)
    outputs = [of[v.id] for v in g.outputs]
    schedule = Schedule(g.name, g.bindings, target, buffers, kernels, outputs)
    plan_memory(schedule)
    return schedule


def plan_memory(s: Schedule):
    """Give temporaries memory slots, two sharing a slot when their lifetimes (first writer to
    last reader) do not overlap. A kernel never reads and writes the same slot."""
    first, last = {}, {}
    for i, k in enumerate(s.kernels):
        first.setdefault(k.output.name, i)
        for b in k.inputs:
            last[b.name] = i
    slots = []                  # [bytes, index of the last kernel using it]
    for b in sorted((b for b in s.buffers if b.role == "temp"), key=lambda b: first[b.name]):
        start, end = first[b.name], last.get(b.name, first[b.name])
        free = [i for i, (size, busy) in enumerate(slots) if busy < start]
        fits = [i for i in free if slots[i][0] >= b.nbytes]
        pick = min(fits, key=lambda i: slots[i][0]) if fits else \
            (max(free, key=lambda i: slots[i][0]) if free else None)
        if pick is None:
            slots.append([b.nbytes, end])
            pick = len(slots) - 1
        slots[pick] = [max(slots[pick][0], b.nbytes), end]
        b.slot = pick
    s.slots = [size for size, _ in slots]


def label(grp: Group) -> str:
    """What the kernel computes, in the user's words: the operator a decomposition came from."""
    head = grp.anchor or next((n for n in grp.nodes if isinstance(n.opdef.lowering, R.Reduce)),
                              grp.root)
    return head.origin.split(":", 1)[1] if head.origin else head.op


def kernel_flops(grp: Group) -> int:
    total = 0
    for n in grp.nodes:
        desc = n.opdef.lowering
        if isinstance(desc, R.Elementwise):
            total += n.out.type.numel() * desc.flops
        elif isinstance(desc, (R.Reduce, R.ArgReduce)):
            total += n.inputs[0].type.numel()
        elif isinstance(desc, R.Contract):
            total += 2 * n.out.type.numel() * n.inputs[0].type.shape[-1]
        elif isinstance(desc, R.Attention):      # q @ k^T and p @ v, plus the softmax
            q, kk, v = n.inputs[:3]
            rows = n.out.type.numel() // max(1, v.type.shape[-1])
            total += rows * kk.type.shape[-2] * (2 * q.type.shape[-1] + 2 * v.type.shape[-1] + 5)
    return total


def default_knobs(k: Kernel) -> dict:
    grp = k.group
    numel = 1
    for d in grp.domain:
        numel *= d
    if k.strategy == "contract":
        knobs = {"parallel": k.flops >= PARALLEL_MIN_FLOPS, "simd": True}
        if k.output.type.dtype.is_float:
            knobs.update(gemm_tiles(grp.anchor, k.output.type.dtype.compute.short))
        return knobs
    if k.strategy == "attention":
        from .target.c_attention import DEFAULT_BLOCKS, MIN_TASKS
        shape = grp.anchor.out.type.shape
        heads = 1
        for e in shape[:-2]:
            heads *= e
        bq = DEFAULT_BLOCKS["block_q"]
        while bq > 16 and heads * -(-shape[-2] // bq) < MIN_TASKS:
            bq //= 2
        return {"parallel": k.flops >= PARALLEL_MIN_FLOPS, "block_q": bq}
    if k.strategy == "row":
        return {"parallel": numel >= PARALLEL_MIN_ELEMENTS,
                "lanes": LANES.get(k.output.type.dtype.compute.itemsize, 8)}
    if k.strategy == "reduce":
        return {"parallel": numel >= PARALLEL_MIN_ELEMENTS,
                "lanes": LANES.get(k.output.type.dtype.compute.itemsize, 8)}
    if k.strategy == "argreduce":
        return {"parallel": k.output.type.numel() >= 2 and
                k.inputs[0].type.numel() >= PARALLEL_MIN_ELEMENTS}
    return {"parallel": k.output.type.numel() >= PARALLEL_MIN_ELEMENTS, "simd": True}


def gemm_tiles(c, dtype_short: str) -> dict:
    """Task tiles for a matmul: the measured best, halved (columns first) while the product has
    fewer than MIN_TASKS tasks. Depends on the shapes alone, never on the thread count."""
    from .target.c_gemm import DEFAULT_TILE, MIN_TASKS, MR
    mt, nt, kc = DEFAULT_TILE[dtype_short]
    shape = c.out.type.shape
    M, N = shape[-2], shape[-1]
    batch = 1
    for d in shape[:-2]:
        batch *= d
    while batch * -(-M // mt) * -(-N // nt) < MIN_TASKS and (nt > 64 or mt > 4 * MR):
        if nt > 64 and (nt >= mt or mt <= 4 * MR):
            nt //= 2
        else:
            mt //= 2
    return {"tile_m": min(mt, max(M, 1)), "tile_n": min(nt, max(N, 1)), "tile_k": kc}


# ---- GPU knobs ----------------------------------------------------------------------------------
GPU_TARGETS = ("cuda", "hip")
GPU_THREADS = 256                   # threads per block of elementwise kernels
GPU_ROW_THREADS = (256, 1024)       # a row's block: up to 256 threads, 1024 for rows of 2**16+
GPU_WARP_MULTIPLE = 64              # blocks are whole warps on both targets (HIP's are 64 wide)
GPU_GEMM_MIN_TILE = 16


def gpu_knobs(k: Kernel, target: str) -> dict:
    """Knobs of a CUDA or HIP kernel: threads per block, and the routines' tiles. A row's thread
    count (and so its association) depends on the row's length alone, never on how many rows
    there are or on the device."""
    grp = k.group
    if k.strategy == "row":
        width = 1
        for a in grp.reduced:
            width *= grp.domain[a]
        cap = GPU_ROW_THREADS[1] if width >= 1 << 16 else GPU_ROW_THREADS[0]
        m = GPU_WARP_MULTIPLE
        return {"threads": min(cap, max(m, -(-width // m) * m))}
    if k.strategy == "contract" and k.output.type.dtype.is_float:
        from .target.gpu_gemm import DEFAULT_KNOBS
        tm, tn, tk, threads = DEFAULT_KNOBS[target][grp.anchor.inputs[0].type.dtype.short]
        shape = grp.anchor.out.type.shape
        # a tile no larger than the matrix needs, in powers of two, still one element or more
        # per thread
        while tm > GPU_GEMM_MIN_TILE and tm >= 2 * shape[-2] and tm * tn >= 2 * threads:
            tm //= 2
        while tn > GPU_GEMM_MIN_TILE and tn >= 2 * shape[-1] and tm * tn >= 2 * threads:
            tn //= 2
        return {"tile_m": tm, "tile_n": tn, "tile_k": tk, "threads": threads}
    if k.strategy == "attention":
        from .target.gpu_attention import DEFAULT_KNOBS
        bq, threads = DEFAULT_KNOBS[target][grp.anchor.inputs[0].type.dtype.short]
        sq = grp.anchor.out.type.shape[-2]
        while bq > 16 and bq >= 2 * sq:
            bq //= 2
        return {"block_q": bq, "threads": threads}
    return {"threads": GPU_THREADS}


# ---- what the autotuner may vary --------------------------------------------------------------
# Knobs that change the association of sums, so a candidate's bits may differ from the default's
# (still deterministic). Every other knob must leave every bit alone.
NUMERIC_KNOBS = frozenset({"lanes"})


def knob_space(k: Kernel, cpus: int) -> dict:
    """The values each knob of this kernel may take (the default included). A knob absent here is
    not tuned. `cpus`: the threads the program runs with."""
    space = {"parallel": [False, True]}
    if cpus > 2:
        space["threads"] = [0] + [t for t in (2, 4, 8, 16, 32, 64) if t < cpus]   # 0: all
    if k.strategy == "contract" and "tile_m" in k.knobs:
        space.update(tile_m=[48, 96, 192, 256, 384], tile_n=[64, 128, 256, 512, 1024],
                     tile_k=[128, 256, 512])
    elif k.strategy == "attention":
        space["block_q"] = [16, 32, 64, 128]
    elif k.strategy in ("row", "reduce"):
        space["lanes"] = [4, 8, 16, 32]
    elif k.strategy in ("pointwise", "copy"):
        space["unroll"] = [1, 2, 4, 8]
    for name, value in k.knobs.items():        # the default is always a candidate
        if name in space and value not in space[name]:
            space[name] = sorted(space[name] + [value], key=_knob_order)
    return space


MAX_LANES = 64                      # accumulators live on the stack: keep them small
KNOB_NAMES = ("parallel", "threads", "tile_m", "tile_n", "tile_k", "block_q", "lanes", "unroll")


def checked_record(k: Kernel, record: dict, exact: bool = False) -> tuple:
    """(knobs to apply, or None; why a record was refused, or None). A record from the database
    must name this kernel's knobs with values of the right kind; `exact` drops the knobs that
    may change the last bits of results."""
    space = knob_space(k, 1 << 30)
    out = {}
    for name, value in record.items():
        if name not in KNOB_NAMES or (name not in space and name != "threads"):
            return None, f"unknown knob {name!r}"
        if name == "parallel":
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and \
                (value >= 0 if name == "threads" else value > 0)
            ok = ok and not (name == "lanes" and value > MAX_LANES)
        if not ok:
            return None, f"{name}={value!r}"
        if not (exact and name in NUMERIC_KNOBS):
            out[name] = value
    return out or None, None


def _knob_order(v):
    return (0, v) if isinstance(v, (bool, int)) else (1, str(v))


def invalid_knobs(k: Kernel, knobs: dict) -> str | None:
    """Why these knobs cannot serve this kernel (None when they can)."""
    if knobs.get("threads") and not knobs.get("parallel"):
        return "threads without parallel"
    if knobs.get("lanes", 0) > MAX_LANES:
        return f"lanes={knobs['lanes']} is over {MAX_LANES}"
    if k.strategy == "contract" and "tile_m" in knobs:
        shape = k.group.anchor.out.type.shape
        M, N, K = shape[-2], shape[-1], k.group.anchor.inputs[0].type.shape[-1]
        # a tile at least twice the matrix is the matrix: keep only the smallest such size
        for name, size, step in (("tile_m", M, 6), ("tile_n", N, 32), ("tile_k", K, 128)):
            if knobs[name] >= 2 * max(size, step) and knobs[name] != k.knobs.get(name):
                return f"{name}={knobs[name]} exceeds the matrix"
    if k.strategy == "attention":
        sq = k.group.anchor.out.type.shape[-2]
        if knobs["block_q"] >= 2 * max(sq, 16) and knobs["block_q"] != k.knobs.get("block_q"):
            return f"block_q={knobs['block_q']} exceeds the queries"
    return None


def kernel_signature(k: Kernel) -> str:
    """The kernel's structure as text: its strategy and fused operators with their attributes and
    types, operands numbered by position, not by name, so one kernel has one signature wherever it
    sits in whichever graph."""
    from .graph_ir import format_attrs, format_value
    local, lines = {}, [k.strategy]
    for n in k.fuses:
        args = []
        for x in n.inputs:
            if x.id in local:
                args.append(f"%{local[x.id]}")
            else:
                b = k.reads[x.id]
                args.append(format_value(b.data) if b.role == "inline"
                            else f"${k.inputs.index(b)}:{x.type}")
        local[n.out.id] = len(local)
        attrs = format_attrs({a: v for a, v in n.attrs.items() if not a.startswith("_")})
        lines.append(f"{n.op}({', '.join(args)}) {attrs} : {n.out.type}")
    return "\n".join(lines)
