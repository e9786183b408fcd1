"""A tessera function called with sharded tensors: sharding propagation on its Graph IR, then
SPMD execution with the existing compiler.

`plan` walks the traced (global) Graph IR once: every value gets a layout from the same rules
the eager operators use (tessera/dist/tensor.py), and where an operand's layout is not the one
its operator needs, the collectives that move it (`moves`) are inserted before the node, each
remembering the user line of the operator that needed it. The plan's operators between two
collectives form a segment; each segment is one tessera function of the local blocks (so it is
fused and compiled as any program), and every rank runs the segments in order, the engine
carrying out the collectives between them. `str(plan)` prints the Graph IR with the sharding in
every type (``f32[1024@dp, 1024]``) and the collectives as nodes; `comm_report()` lists the bytes
each one moves, from the cost function the rules use.

Autodiff comes with it: ``ts.grad(f)`` traces the gradient graph on the global types, and the
same pass shards it.
"""
from __future__ import annotations

import numpy as np

from ..compiler.graph_ir import format_attrs
from ..errors import IRVerificationError, ShardingError
from ..function import Function, extensions, function, tracing
from ..function.interpreter import structured
from .layout import Layout
from .moves import apply_moves, bytes_moved, moves
from .tensor import DTensor, _fixed_arity, _rule, _run, apply_local, local_attrs, shard


class _Abstract:
    """What a sharding rule reads of an operand: its global shape, layout and mesh."""

    def __init__(self, shape, layout, mesh):
        self.shape, self.layout, self.mesh = tuple(shape), layout, mesh

    @property
    def ndim(self):
        return len(self.shape)


class Collective:
    """Value ``src`` moved from one layout to another by ``steps`` (see `moves`), for the node
    at ``loc`` (the user's line that needed it)."""

    def __init__(self, src, before: Layout, after: Layout, steps, loc, block_bytes, mesh):
        self.src, self.before, self.after, self.steps, self.loc = src, before, after, steps, loc
        self.bytes = bytes_moved(mesh, steps, block_bytes)


class Plan:
    """The sharded program: ``items`` in order, each a Graph IR node or a `Collective`;
    ``layouts`` maps each value id to its layout."""

    def __init__(self, graph, mesh, layouts, items, reads):
        self.graph, self.mesh, self.layouts, self.items = graph, mesh, layouts, items
        self.reads = reads        # id(node) -> the (value id, layout) it reads
        self._segments = None

    # ---- what a user reads -----------------------------------------------------------------
    def type_of(self, v, layout=None) -> str:
        return (layout or self.layouts[v.id]).type_str(v.shape, v.type.dtype.short)

    def __str__(self):
        names = self.graph.names()
        params = ", ".join(f"{names[p.id]}: {self.type_of(p)}" for p in self.graph.params)
        lines = [f"sharded graph @{self.graph.name}({params}) on {self.mesh} {{"]
        rows, k = [], 0
        var = {(v.id, self.layouts[v.id]): names[v.id] for v in self.graph.params}
        for it in self.items:
            if isinstance(it, Collective):
                src = var[(it.src.id, it.before)]
                for kind, axis, kw in it.steps:      # one line per step, each named
                    detail = ", ".join(f"{a}={b}" for a, b in kw.items())
                    left = f"%c{k} = {kind}({src}) {{axis={axis}" + \
                        (f", {detail}}}" if detail else "}")
                    rows.append((left, self.type_of(it.src, it.after),
                                 f"# for {it.loc}" if it.loc else ""))
                    src = f"%c{k}"
                    k += 1
                var[(it.src.id, it.after)] = src
                continue
            var[(it.out.id, self.layouts[it.out.id])] = names[it.out.id]
            args = ", ".join(var[r] for r in self.reads.get(id(it), []))
            attrs = format_attrs(it.attrs)
            rows.append((f"{names[it.out.id]} = {it.op}({args})" + (f" {attrs}" if attrs else ""),
                         self.type_of(it.out),
                         f"# {it.loc}" if it.loc else ""))
        w1 = min(max((len(r[0]) for r in rows), default=0), 56)
        w2 = min(max((len(r[1]) for r in rows), default=0), 30)
        lines += [f"  {a:<{w1}}  : {b:<{w2}}  {c}".rstrip() for a, b, c in rows]
        lines.append("  return " + ", ".join(f"{names[v.id]}: {self.type_of(v)}"
                                             for v in self.graph.outputs))
        lines.append("}")
        return "\n".join(lines)

    def __repr__(self):
        n = sum(isinstance(it, Collective) for it in self.items)
        return f"<sharded plan @{self.graph.name}: {len(self.graph.nodes)} nodes, {n} " \
               f"collectives on {self.mesh}>"

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))

    def comm_report(self):
        """One row per collective step: what it moves, for which line, the bytes each rank
        receives (a pandas DataFrame when pandas is installed, else a list of dicts)."""
        names = self.graph.names()
        rows = []
        for it in self.items:
            if isinstance(it, Collective):
                for (kind, axis, _), b in zip(it.steps, it.bytes):
                    rows.append({"collective": kind, "axis": axis, "value": names[it.src.id],
                                 "from": self.type_of(it.src, it.before),
                                 "to": self.type_of(it.src, it.after),
                                 "bytes per rank": int(b), "for": str(it.loc or "")})
        try:
            import pandas as pd
        except ImportError:
            return rows
        return pd.DataFrame(rows, columns=["collective", "axis", "value", "from", "to",
                                           "bytes per rank", "for"])

    @property
    def bytes_per_rank(self) -> int:
        return sum(int(b) for it in self.items if isinstance(it, Collective) for b in it.bytes)

    # ---- running ----------------------------------------------------------------------------
    def segments(self):
        """The items grouped: runs of nodes (each compiled as one function) and collectives."""
        if self._segments is None:
            self._segments = _segment(self)
        return self._segments

    def run(self, inputs: list) -> list:
        """inputs: per graph parameter a DTensor in its planned layout. Returns DTensors."""
        mesh = self.mesh
        env = {(p.id, self.layouts[p.id]): x.blocks for p, x in zip(self.graph.params, inputs)}
        for seg in self.segments():
            if isinstance(seg, Collective):
                key = (seg.src.id, seg.before)
                env[(seg.src.id, seg.after)] = apply_moves(mesh, dict(env[key]), seg.steps)
                continue
            fn, ins, outs = seg
            operands = {r: [env[v][r] for v in ins] for r in mesh.engine.ranks}
            got = _run(mesh, fn, operands)
            for j, var in enumerate(outs):
                env[var] = {r: got[r][j] for r in got}
        out = []
        for v in self.graph.outputs:
            lay = self.layouts[v.id]
            out.append(DTensor(mesh, v.shape, v.type.dtype.np, lay, env[(v.id, lay)]))
        return out


def plan(graph, mesh, param_layouts: list) -> Plan:
    """Sharding propagation over ``graph`` (global types), parameters in ``param_layouts``."""
    from ..ops.regions import REGION_OPS
    layouts = {p.id: lay for p, lay in zip(graph.params, param_layouts)}
    have = {(p.id, layouts[p.id]) for p in graph.params}
    items, reads = [], {}
    live = {v.id for v in graph.outputs}        # a result nobody uses is neither moved nor run
    for n in reversed(graph.nodes):
        if n.out.id in live:
            live.update(v.id for v in n.inputs)
    for n in graph.nodes:
        if n.out.id not in live:
            continue
        if n.op == "const":
            layouts[n.out.id] = Layout.replicated(len(n.out.shape))
            have.add((n.out.id, layouts[n.out.id]))
            items.append(n)
            continue
        if n.op in REGION_OPS:
            raise ShardingError(f"{n.op} (control flow) in a function called with sharded "
                                "tensors is not supported yet", location=n.loc, op=n.op,
                                hint="call it on dist.gather(x), or write the loop in Python")
        # a pending value already reduced for another use is read reduced: carrying the
        # pending sum on would take the reduction again further on
        seen = [layouts[v.id] if not layouts[v.id].partial or
                (v.id, Layout(layouts[v.id].dims)) not in have else Layout(layouts[v.id].dims)
                for v in n.inputs]
        xs = [_Abstract(v.shape, lay, mesh) for v, lay in zip(n.inputs, seen)]
        need, out = _rule(n.opdef, n.attrs, xs, n.out.type)
        try:                # a rule's layouts are layouts: each axis used once, blocks divide
            for v, lay in [*zip(n.inputs, need), (n.out, out)]:
                lay.check(v.shape, mesh, f"the layout of {n.op}")
        except ShardingError as e:
            raise IRVerificationError(f"the sharding rule of {n.op} gave an invalid layout: "
                                      f"{e.summary}", location=n.loc, op=n.op) from None
        for v, lay in zip(n.inputs, need):
            if (v.id, lay) in have:
                continue
            src = layouts[v.id]         # moved from the layout it was made in
            block = int(np.prod(src.local_shape(v.shape, mesh), dtype=np.int64)) * \
                v.type.dtype.itemsize
            items.append(Collective(v, src, lay, moves(src, lay), n.loc, block, mesh))
            have.add((v.id, lay))
        reads[id(n)] = [(v.id, lay) for v, lay in zip(n.inputs, need)]
        items.append(n)
        layouts[n.out.id] = out
        have.add((n.out.id, out))
    return Plan(graph, mesh, layouts, items, reads)


def _segment(p: Plan):
    """Runs of nodes between collectives, each as (compiled function, input vars, output vars);
    a var is (value id, layout)."""
    graph, layouts, reads = p.graph, p.layouts, p.reads
    runs, cur = [], []
    for it in p.items:
        if isinstance(it, Collective):
            if cur:
                runs.append(cur)
                cur = []
            runs.append(it)
        else:
            cur.append(it)
    if cur:
        runs.append(cur)
    later_reads = []          # for each run, the vars read after it
    needed = {(v.id, layouts[v.id]) for v in graph.outputs}
    for run in reversed(runs):
        later_reads.append(set(needed))
        if isinstance(run, Collective):
            needed.add((run.src.id, run.before))
        else:
            for n in run:
                needed |= set(reads.get(id(n), []))
    later_reads.reverse()
    out = []
    for run, later in zip(runs, later_reads):
        if isinstance(run, Collective):
            out.append(run)
            continue
        made = {(n.out.id, layouts[n.out.id]) for n in run}
        ins = []
        for n in run:
            for var in reads.get(id(n), []):
                if var not in made and var not in ins:
                    ins.append(var)
        outs = [var for var in [(n.out.id, layouts[n.out.id]) for n in run] if var in later]
        out.append((_segment_function(p.graph.name, run, reads, ins, outs, layouts, p.mesh),
                    ins, outs))
    return out


def _segment_function(name, run, reads, ins, outs, layouts, mesh):
    """One tessera function replaying the run's operators on local blocks."""

    def body(*blocks):
        env = dict(zip(ins, blocks))
        for n in run:
            var = (n.out.id, layouts[n.out.id])
            if n.op == "const":
                env[var] = n.attrs["value"]
            else:
                attrs = local_attrs(n.op, n.attrs, layouts[n.out.id], mesh)
                env[var] = apply_local(n.op, n.opdef.nin == -1,
                                       [env[x] for x in reads[id(n)]], attrs)
        return tuple(env[v] for v in outs)
    body.__name__ = f"{name}_part"
    return function(_fixed_arity(body, len(ins)), target=mesh.target)


# ---- the call ----------------------------------------------------------------------------------
def prepare(fn, args, kwargs):
    """(the plan, its inputs as DTensors) for ``fn`` (a tessera Function) called with DTensors
    among its arguments (in dicts and lists too): traced on the global types and planned once
    per layouts; plain arrays are replicated."""
    from ..pytree import flatten
    leaves, _ = flatten((args, kwargs))
    meshes = {x.mesh for x in leaves if isinstance(x, DTensor)}
    if len(meshes) > 1:
        raise ShardingError(f"{fn.name} got tensors on different meshes",
                            received=" and ".join(map(repr, meshes)))
    mesh = meshes.pop()
    holders = {}

    def stand_in(x):
        # the global shape without its memory: a zero-stride view of one element
        if isinstance(x, DTensor):
            view = np.broadcast_to(np.zeros((), x.dtype), x.shape)
            holders[id(view)] = (x, view)
            return view
        if isinstance(x, dict):
            return {k: stand_in(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(stand_in(v) for v in x)
        return x
    arrays, statics, bindings = fn._bind([stand_in(a) for a in args],
                                         {k: stand_in(v) for k, v in kwargs.items()})
    inputs, key = [], []
    for name, a in arrays.items():
        x = holders[id(a)][0] if id(a) in holders else None
        if x is None:
            x = shard(a, None, mesh)
        inputs.append(x)
        key.append((name, x.shape, x.dtype.str, x.layout))
    cache = fn.__dict__.setdefault("_spmd_plans", {})
    k = (mesh, tuple(key), repr(sorted(statics.items(), key=lambda kv: kv[0])))
    p = cache.get(k)
    if p is None:
        from ..types import type_of_array
        fn.programs.check_symbolic(arrays, statics, bindings)
        g = fn._trace({n: type_of_array(a) for n, a in arrays.items()}, statics, bindings)
        tracing.check_graph_return(fn.signature, g, bindings, bindings)
        p = cache[k] = plan(g, mesh, [x.layout for x in inputs])
    return p, inputs


def call(fn, args, kwargs):
    p, inputs = prepare(fn, args, kwargs)
    return structured(p.graph, p.run(inputs))


extensions.register_caller(DTensor, call)       # a tessera function called with sharded tensors


def plan_for(fn, *args, **kwargs) -> Plan:
    """The sharded plan a call of ``fn`` with these arguments runs, without running it."""
    f = fn if isinstance(fn, Function) else function(fn)
    return prepare(f, args, kwargs)[0]
