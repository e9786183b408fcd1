"""The scheduler: Graph IR (primitive, concrete) → Schedule IR, fusion groups become kernels
with knobs and a cost (FLOPs, bytes) each. What a kernel's knobs are, their defaults per target and the values
the autotuner may try come from its strategy (tessera/compiler/strategies/); this file holds
what every strategy shares."""
from __future__ import annotations

from ..runtime import targets
from . import strategies
from .fusion import fuse
from .graph_ir import Graph, format_attrs, format_value
from .groups import Group, is_reduce, is_reshape
from .passes import PRIMITIVE_RULES, canonicalize, decompose, split_complex
from .schedule_ir import Buffer, Kernel, RegionStep, ScheduleProgram, storage


def build_schedule(g: Graph, target: str = "cpu", fusion: bool = True, user=None,
                   tuned=None) -> ScheduleProgram:
    """Knobs, weakest first: the heuristics', `tuned(kernel)` (the autotuning database's record,
    or None), an operator's own tile_shape, then `user` (a tessera.Schedule)."""
    ctx = _Context(target, fusion, user, tuned)
    of: dict[int, Buffer] = {}
    for k, p in enumerate(g.params):
        # the compiler names every buffer itself: a user's parameter called `out0`, `int` or
        # `INFINITY` must not meet a temporary, a C keyword or a macro
        of[p.id] = ctx.buffer(Buffer(f"in{k}", p.type, "input", param=k, label=p.param_name))
    out_ids = {v.id: k for k, v in reversed(list(enumerate(g.outputs)))}
    steps = _schedule_nodes(g, ctx, of, out_ids, "")
    outputs = [of[v.id] for v in g.outputs]
    regions = any(isinstance(st, RegionStep) for st in steps)
    schedule = ScheduleProgram(g.name, g.bindings, target, ctx.buffers, ctx.kernels, outputs,
                        steps if regions else None)
    plan_memory(schedule)
    return schedule


class _Context:
    """What scheduling a graph and its regions' bodies shares: the buffers and kernels made so
    far (one table and one list for the whole program) and how to choose knobs."""

    def __init__(self, target, fusion, user, tuned):
        self.target, self.fusion, self.user, self.tuned = target, fusion, user, tuned
        self.buffers: list[Buffer] = []
        self.kernels: list[Kernel] = []
        self.consts = self.regions = 0

    def buffer(self, b: Buffer) -> Buffer:
        self.buffers.append(b)
        return b


def _schedule_nodes(g: Graph, ctx: _Context, of: dict, out_ids: dict, prefix: str) -> list:
    """The steps computing g's nodes (its parameters already in `of`): a kernel per fusion group
    and a RegionStep per control-flow operator. `out_ids`: which values are the program's
    outputs (none inside a body); `prefix` names a body's temporaries apart."""
    for n in g.nodes:
        if n.op == "const":
            value = n.attrs["value"]
            role, kind = ("inline", "lit") if value.ndim == 0 else ("const", "c")
            of[n.out.id] = ctx.buffer(Buffer(f"{kind}{ctx.consts}", n.out.type, role, value))
            ctx.consts += 1
    steps, n_temp = [], 0

    def result_buffer(v):
        nonlocal n_temp
        if v.id in out_ids:
            return ctx.buffer(Buffer(f"out{out_ids[v.id]}", v.type, "output"))
        n_temp += 1
        return ctx.buffer(Buffer(f"{prefix}t{n_temp - 1}", v.type, "temp"))

    seen_regions = set()
    for grp in fuse(g, enabled=ctx.fusion):
        if not strategies.of(grp).makes_kernels:        # control flow: a region step
            region = grp.root.attrs["region"]
            if region not in seen_regions:
                seen_regions.add(region)
                steps.append(_schedule_region(g, grp.root, ctx, of, result_buffer))
            continue
        v = grp.root.out
        if reads_in_place(grp, of, out_ids):
            of[v.id] = ctx.buffer(Buffer(f"{prefix}rs{len(ctx.buffers)}", v.type, "alias",
                                         data=of[grp.root.inputs[0].id]))
            continue
        b = result_buffer(v)
        of[v.id] = b
        stores = []
        for n in grp.stores:            # (a body's) outputs by definition: nothing outside
            sb = result_buffer(n.out)   # reads them
            of[n.out.id] = sb
            stores.append((n.out, sb))
        inside = {n.out.id for n in grp.nodes}
        inputs, reads = [], {}
        for n in grp.nodes:
            for x in n.inputs:
                if x.id not in inside and x.id not in reads:
                    reads[x.id] = of[x.id]
                    if of[x.id] not in inputs:
                        inputs.append(of[x.id])
        k = Kernel(name=f"k{len(ctx.kernels)}_{label(grp)}", strategy=grp.kind, op=grp.root.op,
                   attrs=dict(grp.root.attrs), inputs=inputs, output=b, fuses=list(grp.nodes),
                   group=grp, reads=reads, stores=stores)
        k.flops = kernel_flops(grp)
        k.bytes = sum(x.nbytes for x in inputs if x.role != "inline") + \
            sum(x.nbytes for x in k.outputs)
        k.knobs = default_knobs(k, ctx.target)
        record = ctx.tuned(k) if ctx.tuned is not None else None
        if record:
            k.knobs.update(record)
            k.tuned = True
        strategy = strategies.of(k)
        k.knobs.update(strategy.op_knobs(grp))
        if ctx.user is not None:
            k.knobs.update(strategy.user_knobs(ctx.user))
        ctx.kernels.append(k)
        steps.append(k)
    return steps


def reads_in_place(grp: Group, of: dict, out_ids: dict) -> bool:
    """Whether a group is a reshape alone of a value in memory (kept apart by its several
    users: the layer's input its forward and backward products read), which its users then
    read where it lies: the same elements in the same order, no kernel. Not a program's output,
    which has memory of its own. The reshape's value is an alias of its source's buffer (a
    kernel is passed the source: lower.py)."""
    n = grp.root
    return grp.nodes == [n] and is_reshape(n) and n.out.id not in out_ids and \
        n.out.type.is_static and of[n.inputs[0].id].role in ("temp", "input", "output", "const")


def _schedule_region(g: Graph, node, ctx: _Context, of: dict, result_buffer) -> RegionStep:
    """A control-flow operator's step: a buffer for every result (the carries live there while
    the loop runs, used or not), and each body scheduled into the same program, its parameters
    aliases of the buffers the kind passes it."""
    region = node.attrs["region"]
    r = ctx.regions
    ctx.regions += 1
    prefix = f"r{r}_"
    sibs = {m.attrs["result"]: m for m in g.siblings(node)}
    results = []
    for i, t in enumerate(region.types):
        m = sibs.get(i)
        b = result_buffer(m.out) if m is not None else \
            ctx.buffer(Buffer(f"{prefix}c{i}", t, "temp"))
        if m is not None:
            of[m.out.id] = b
        results.append(b)
    operands = [of[v.id] for v in node.inputs]
    own = operands[:region.operands]
    step = RegionStep(region.kind, own, results, {}, dict(region.attrs), loc=region.loc,
                      var=f"r{r}_step")
    kind = region.kind
    if kind == "fori_loop":
        t = region.bodies["body"].params[0].type
        step.counter = ctx.buffer(Buffer(f"{prefix}i", t, "temp"))
    start = region.operands
    for role, body in region.bodies.items():
        caps = operands[start:start + region.captures[role]]
        start += region.captures[role]
        if kind == "fori_loop":       # (save=true: the stacked carries follow the carries)
            passed = [step.counter] + results[:region.attrs.get("carries", len(results))]
        elif kind in ("while_loop",):
            passed = list(results)
        elif kind == "scan":
            carries = region.attrs["carries"]
            passed = list(results[:carries]) + [("slice", x) for x in own[carries:]]
        else:                           # cond: the operands after the predicate
            passed = own[1:]
        prim = canonicalize(split_complex(decompose(canonicalize(body.clone()).verify())),
                            PRIMITIVE_RULES).verify()
        body_of = {}
        for k, (p, src) in enumerate(zip(prim.params, passed + caps)):
            if not isinstance(src, tuple) and src.role == "inline":
                body_of[p.id] = src     # a literal: the body's kernels write it in place
            elif isinstance(src, tuple):
                body_of[p.id] = ctx.buffer(Buffer(f"{prefix}{role}_x{k}", p.type, "slice",
                                                  data=(src[1], step.var)))
            else:
                body_of[p.id] = ctx.buffer(Buffer(f"{prefix}{role}_a{k}", p.type, "alias",
                                                  data=src))
        body_steps = _schedule_nodes(prim, ctx, body_of, {}, f"{prefix}{role}_")
        step.bodies[role] = (body_steps, [body_of[v.id] for v in prim.outputs])
    if kind != "cond":                  # a body giving back another carry's old value
        k = region.attrs.get("carries", len(results))
        homes = {id(b): j for j, b in enumerate(results[:k])}
        for j, out in enumerate(step.bodies["body"][1][:k]):
            if homes.get(id(storage(out)), j) != j:
                step.staging[j] = ctx.buffer(Buffer(f"{prefix}s{j}", out.type, "temp"))
    return step


def plan_memory(s: ScheduleProgram):
    """Give temporaries memory slots, two sharing a slot when their lifetimes (first writer to
    last reader) do not overlap. A kernel never reads and writes the same slot.

    Lifetimes count top-level steps: a region step writes its results and reads everything its
    bodies read, for the whole loop; the buffers inside its bodies (written and read again on
    every step) get a slot each, shared with nothing."""
    first, last = {}, {}
    for i, k in enumerate(s.steps):
        for b in (k.results if isinstance(k, RegionStep) else [k.output]):
            first.setdefault(b.name, i)
        for b in (_region_reads(k) if isinstance(k, RegionStep) else map(storage, k.inputs)):
            last[b.name] = i
    slots = []                  # [bytes, index of the last kernel using it]
    for b in sorted((b for b in s.buffers if b.role == "temp" and b.name in first),
                    key=lambda b: first[b.name]):
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
    for b in s.buffers:                 # inside loop bodies: a slot each, never shared
        if b.role == "temp" and b.slot is None:
            slots.append([b.nbytes, None])
            b.slot = len(slots) - 1
    s.slots = [size for size, _ in slots]


def _region_reads(st: RegionStep) -> list:
    """Every buffer a region step reads, its bodies' reads included (aliases as what they
    stand for: a slice of xs is xs)."""
    out = list(st.operands)
    for steps, outputs in st.bodies.values():
        for k in steps:
            out += _region_reads(k) if isinstance(k, RegionStep) else k.inputs
        out += outputs
    return [storage(b) for b in out]


def label(grp: Group) -> str:
    """What the kernel computes, in the user's words: the operator a decomposition came from."""
    head = grp.anchor or next((n for n in grp.nodes if is_reduce(n)), grp.root)
    return head.origin.split(":", 1)[1] if head.origin else head.op


def kernel_flops(grp: Group) -> int:
    total = 0
    for n in grp.nodes:
        owner = strategies.owner(n)
        total += owner.node_flops(n) if owner is not None else 0
    return total


def default_knobs(k: Kernel, target: str) -> dict:
    """The strategy's knobs for this kernel on a target (a CPU or a GPU)."""
    strategy = strategies.of(k)
    return strategy.gpu_knobs(k, target) if targets.is_gpu(target) else strategy.cpu_knobs(k)


# ---- what the autotuner may vary --------------------------------------------------------------
BASE_KNOBS = ("parallel", "threads")
KNOB_NAMES = tuple(dict.fromkeys(BASE_KNOBS + tuple(
    n for s in strategies.REGISTRY.values() for n in s.knobs)))
# Knobs that change the association of sums, so a candidate's bits may differ from the default's
# (still deterministic). Every other knob must leave every bit alone.
NUMERIC_KNOBS = frozenset(n for s in strategies.REGISTRY.values() for n in s.numeric_knobs)
# The seeds' names (Triton's) for our knobs: alias -> {strategy: knob}
ALIASES: dict = {}
for _s in strategies.REGISTRY.values():
    for _alias, _knob in _s.aliases.items():
        ALIASES.setdefault(_alias, {})[_s.name] = _knob


def knob_space(k: Kernel, cpus: int) -> dict:
    """The values each knob of this kernel may take (the default included). A knob absent here is
    not tuned. `cpus`: the threads the program runs with."""
    space = {"parallel": [False, True]}
    if cpus > 2:
        space["threads"] = [0] + [t for t in (2, 4, 8, 16, 32, 64) if t < cpus]   # 0: all
    space.update(strategies.of(k).space(k))
    for name, value in k.knobs.items():        # the default is always a candidate
        if name in space and value not in space[name]:
            space[name] = sorted(space[name] + [value], key=_knob_order)
    return space


MAX_LANES = 64                      # accumulators live on the stack: keep them small


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
    return strategies.of(k).invalid(k, knobs)


def kernel_signature(k: Kernel) -> str:
    """The kernel's structure as text: its strategy and fused operators with their attributes and
    types, operands numbered by position, not by name, so one kernel has one signature wherever it
    sits in whichever graph."""
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
