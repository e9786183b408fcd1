"""Graph IR drawn as a picture: a Drawing (boxes, shape-labelled edges, kernel clusters) built from
a Graph or a Program, and its Graphviz DOT text.

How Schedule IR kernels map back to Graph IR nodes (the clusters):
- A primitive node's `origin` ("%3:softmax") names the Graph IR node it came from; decompose()
  names origins after the canonical graph, which is the Program's `graph_ir`.
- A node whose primitives land in several kernels (softmax over axis 0: max, exp, sum, div) is
  drawn once, in the kernel that computes its result (the last of them in schedule order); each
  earlier kernel gets a dashed "part" box naming the primitives it runs for that node, with
  dashed edges along the buffers those kernels pass on (labelled with the buffers' types).
- A node no primitive names was replaced on the way down: absorbed by a pattern (attention:
  transpose, matmul, softmax, matmul become one node without an origin) or merged with an equal
  computation by CSE. Absorbed nodes go to the kernel of the primitive that replaced them (the
  node whose value it stands for, and the unnamed nodes above it); the rest go to the kernel of
  their first consumer, or to the kernel writing the output they are.
- A constant is drawn in the kernel that reads it when only one does (it is compiled into that
  kernel: a literal, or a buffer only it reads), else outside every cluster. A kernel left
  without a node (nothing mapped to it) gets a box listing what it fuses, so every kernel has a
  cluster.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from ..compiler.graph_ir import Graph, Node, SourceLocation, Value, format_value
from ..compiler.schedule_ir import body_kernels
from ..ops.regions import REGION_OPS
from ..errors import ArgumentError, TesseraError
from .tables import knob_text

ATTR_WIDTH = 32          # characters per line of a node's attributes


@dataclass
class Box:
    id: str                 # deterministic: p<k> params, n<i> nodes, o<j> outputs, ...
    kind: str               # param | op | const | output | part | failing
    lines: list             # (text, style): style head | attr | loc | note
    cluster: int | None = None      # index of the kernel it is drawn in
    failing: bool = False


@dataclass
class Edge:
    src: str
    dst: str
    label: str              # the type flowing on it: f32[B,S,D]
    dashed: bool = False


@dataclass
class Cluster:
    name: str               # the kernel's name (k0_mean)
    label: str              # "k0_mean · row"
    tooltip: str = ""


@dataclass
class Drawing:
    title: str
    boxes: list = field(default_factory=list)      # topological order
    edges: list = field(default_factory=list)
    clusters: list = field(default_factory=list)   # in schedule order


# ---- what to draw --------------------------------------------------------------------------------
def _source(obj, level: str):
    """(graph, schedule or None, primitive graph or None, the error drawn by default)."""
    if level not in ("graph", "primitive"):
        raise ArgumentError(f"unknown graph level {level!r}", expected="'graph' or 'primitive'")
    if isinstance(obj, TesseraError):
        if obj.partial_graph is None:
            raise ArgumentError(f"this {type(obj).__name__} carries no partial graph to draw",
                                hint="only errors raised while tracing do")
        return obj.partial_graph, None, None, obj
    if isinstance(obj, Graph):
        return obj, None, None, None
    schedule = getattr(obj, "schedule_ir", None)
    if schedule is not None:                                 # a Program
        graph = obj.graph_ir if level == "graph" else obj.primitive_ir
        return graph, schedule, obj.primitive_ir, None
    graph = getattr(obj, "graph_ir", None)                   # a tessera Function
    if isinstance(graph, Graph):
        return graph, None, None, None
    raise ArgumentError(f"cannot draw a {type(obj).__name__}",
                        expected="a Graph, a Program, a tessera function or a traced error")


def drawing(obj, *, clusters: bool = True, failing=None, title=None,
            level: str = "graph") -> Drawing:
    """The boxes, edges and clusters of obj's Graph IR (see the module's docstring)."""
    from ..dist.spmd import Plan
    if isinstance(obj, Plan):
        return sharded_drawing(obj, title)
    graph, schedule, prim, default_failing = _source(obj, level)
    if failing is None:
        failing = default_failing
    names = graph.names()
    index = {n: i for i, n in enumerate(graph.nodes)}
    box_of = {p.id: f"p{k}" for k, p in enumerate(graph.params)}
    box_of.update({n.out.id: f"n{i}" for i, n in enumerate(graph.nodes)})

    if title is None:
        title = f"@{graph.name}"
        if graph.bindings:
            title += " [" + ", ".join(f"{k}={v}" for k, v in graph.bindings.items()) + "]"
        if level == "primitive":
            title += " (primitive)"
        if isinstance(obj, TesseraError):
            title += " (trace stopped)"
    d = Drawing(title)

    home, parts = {}, {}
    if clusters and schedule is not None:
        d.clusters = [Cluster(k.name, f"{k.name} · {k.strategy}" + (" (tuned)" if k.tuned else ""),
                              knob_text(k.knobs))
                      for k in schedule.kernels]
        home, parts = _homes(graph, schedule, prim, level)

    first = {}                          # a region -> its first result's node: one box for all
    for n in graph.nodes:
        if n.op in REGION_OPS:
            f = first.setdefault(n.attrs["region"], n)
            box_of[n.out.id] = box_of[f.out.id]
    marked, extra = _failing(graph, failing, names)
    for k, p in enumerate(graph.params):
        d.boxes.append(Box(f"p{k}", "param", [(f"%{p.param_name}", "head"), (str(p.type), "attr")],
                           failing=p is marked))
    for i, n in enumerate(graph.nodes):
        if n.op in REGION_OPS:
            if first[n.attrs["region"]] is n:
                _draw_region(d, graph, n, f"n{i}", names, box_of, None, marked)
            continue
        for ki, ops in parts.get(n, []):
            d.boxes.append(Box(f"n{i}k{ki}", "part", [(f"{names[n.out.id]} {n.op} (part)", "head"),
                                                      (" ".join(ops), "attr")], cluster=ki))
        d.boxes.append(Box(f"n{i}", "const" if n.op == "const" else "op", _node_lines(n, names),
                           cluster=home.get(n), failing=n is marked))
        for v in n.inputs:
            d.edges.append(Edge(box_of[v.id], f"n{i}", str(v.type)))
    for n, pieces in parts.items():
        d.edges += _part_edges(n, index[n], pieces, home[n], schedule)
    for j, v in enumerate(graph.outputs):
        label = "return" if len(graph.outputs) == 1 else f"return #{j}"
        d.boxes.append(Box(f"o{j}", "output", [(label, "head")]))
        d.edges.append(Edge(box_of[v.id], f"o{j}", str(v.type)))
    if extra is not None:
        lines, inputs = extra
        d.boxes.append(Box("failed", "failing", lines, failing=True))
        d.edges += [Edge(box_of[v.id], "failed", str(v.type)) for v in inputs if v.id in box_of]
    used = {b.cluster for b in d.boxes}
    inside = {k.name for k in body_kernels(schedule.steps if schedule is not None else ())}
    for ki, c in enumerate(d.clusters):          # a kernel nothing maps to still shows up
        if ki not in used and c.name in (k.name for k in schedule.kernels) and \
                c.name not in inside:          # (a body's kernels: its nodes are drawn)
            k = schedule.kernels[ki]
            lines = [(k.op, "head"), (" ".join(k.fused_labels()), "attr")]
            d.boxes.append(Box(f"k{ki}", "part", lines, cluster=ki))
    return d


def sharded_drawing(plan, title=None) -> Drawing:
    """A sharded plan (tessera.dist): every edge labelled with its sharded type
    (``f32[1024@dp, 1024]``), each inserted collective a box of its own (its steps, the bytes
    each rank receives, the line that needed it), the mesh in the title."""
    from ..dist.spmd import Collective
    graph = plan.graph
    names = graph.names()
    d = Drawing(title or f"@{graph.name} on {plan.mesh}")
    box_of = {}
    for k, p in enumerate(graph.params):
        box_of[(p.id, plan.layouts[p.id])] = f"p{k}"
        d.boxes.append(Box(f"p{k}", "param", [(f"%{p.param_name}", "head"),
                                              (plan.type_of(p), "attr")]))
    c, index = 0, {id(n): j for j, n in enumerate(graph.nodes)}
    for it in plan.items:
        if isinstance(it, Collective):
            lines = [(" then ".join(kind for kind, _, _ in it.steps), "head")]
            lines += [(f"over {axis}: {b:,} bytes per rank", "attr")
                      for (_, axis, _), b in zip(it.steps, it.bytes)]
            if it.loc is not None:
                lines.append((f"for {it.loc}", "loc"))
            d.boxes.append(Box(f"c{c}", "collective", lines))
            d.edges.append(Edge(box_of[(it.src.id, it.before)], f"c{c}",
                                plan.type_of(it.src, it.before)))
            box_of[(it.src.id, it.after)] = f"c{c}"
            c += 1
            continue
        j = index[id(it)]
        d.boxes.append(Box(f"n{j}", "const" if it.op == "const" else "op",
                           _node_lines(it, names)))
        for (vid, lay), v in zip(plan.reads.get(id(it), []), it.inputs):
            d.edges.append(Edge(box_of[(vid, lay)], f"n{j}", plan.type_of(v, lay)))
        box_of[(it.out.id, plan.layouts[it.out.id])] = f"n{j}"
    for j, v in enumerate(graph.outputs):
        label = "return" if len(graph.outputs) == 1 else f"return #{j}"
        d.boxes.append(Box(f"o{j}", "output", [(label, "head")]))
        d.edges.append(Edge(box_of[(v.id, plan.layouts[v.id])], f"o{j}", plan.type_of(v)))
    return d


def _draw_region(d: Drawing, graph: Graph, n: Node, box: str, names: dict, box_of: dict,
                 cluster, marked):
    """A control-flow operator: one box for its results, and a cluster per body holding the
    body's graph, its parameters fed by the operands they stand for, its results flowing back
    into the operator's box."""
    region = n.attrs["region"]
    sibs = graph.siblings(n)
    head = ", ".join(names[m.out.id] for m in sibs) + f" = {n.op}"
    attrs = ", ".join(f"{k}={format_value(v)}" for k, v in region.attrs.items()
                      if k != "carries")
    lines = [(head, "head")] + ([(attrs, "attr")] if attrs else [])
    if n.loc is not None:
        lines.append((str(n.loc), "loc"))
    d.boxes.append(Box(box, "op", lines, cluster=cluster, failing=n is marked))
    for v in dict.fromkeys(n.inputs):
        d.edges.append(Edge(box_of[v.id], box, str(v.type)))
    for role, body in region.bodies.items():
        ci = len(d.clusters)
        d.clusters.append(Cluster(f"{box}_{role}", f"{names[n.out.id]} {n.op} · {role}",
                                  f"the {role} graph of {n.op}, traced once"))
        _draw_body(d, body, f"{box}{role}_", ci, _body_sources(region, role, n.inputs),
                   box_of)
        d.edges.append(Edge(f"{box}{role}_y", box, ", ".join(str(v.type) for v in body.outputs),
                            dashed=True))


def _body_sources(region, role: str, operands) -> dict:
    """Body parameter index -> the operand of the region's node it stands for."""
    own = operands[:region.operands]
    body = region.bodies[role]
    caps = region.body_operands(role, list(operands))
    kind = region.kind
    k = region.attrs.get("carries", len(region.types))
    passed = ([None] + list(own[:k]) if kind == "fori_loop" else
              list(own[1:]) if kind == "cond" else list(own))
    passed = passed[:len(body.params) - len(caps)]
    return {j: v for j, v in enumerate(passed + list(caps)) if v is not None}


def _draw_body(d: Drawing, body: Graph, prefix: str, ci: int, sources: dict, outer: dict):
    names = body.names()
    box_of = {p.id: f"{prefix}p{k}" for k, p in enumerate(body.params)}
    box_of.update({m.out.id: f"{prefix}n{i}" for i, m in enumerate(body.nodes)})
    first = {}
    for m in body.nodes:
        if m.op in REGION_OPS:
            f = first.setdefault(m.attrs["region"], m)
            box_of[m.out.id] = box_of[f.out.id]
    for k, p in enumerate(body.params):
        d.boxes.append(Box(f"{prefix}p{k}", "param", [(f"%{p.param_name}", "head"),
                                                      (str(p.type), "attr")], cluster=ci))
        if k in sources:
            d.edges.append(Edge(outer[sources[k].id], f"{prefix}p{k}", str(p.type),
                                dashed=True))
    for i, m in enumerate(body.nodes):
        if m.op in REGION_OPS:
            if first[m.attrs["region"]] is m:
                _draw_region(d, body, m, f"{prefix}n{i}", names, box_of, ci, None)
            continue
        d.boxes.append(Box(f"{prefix}n{i}", "const" if m.op == "const" else "op",
                           _node_lines(m, names), cluster=ci))
        for v in m.inputs:
            d.edges.append(Edge(box_of[v.id], f"{prefix}n{i}", str(v.type)))
    d.boxes.append(Box(f"{prefix}y", "output", [("yield", "head")], cluster=ci))
    for v in body.outputs:
        d.edges.append(Edge(box_of[v.id], f"{prefix}y", str(v.type)))


def _node_lines(n: Node, names: dict) -> list:
    if n.op == "const":
        return [(f"{names[n.out.id]} = {format_value(n.attrs['value'])}", "head")]
    lines = [(f"{names[n.out.id]} = {n.op}", "head")]
    attrs = [f"{k}={format_value(v)}" for k, v in n.attrs.items() if v is not None]
    line = ""
    for a in attrs:                                # wrap the attributes at about ATTR_WIDTH
        a = a if len(a) <= ATTR_WIDTH else a[:ATTR_WIDTH - 1] + "…"
        if line and len(line) + 2 + len(a) > ATTR_WIDTH:
            lines.append((line, "attr"))
            line = ""
        line = f"{line}, {a}" if line else a
    if line:
        lines.append((line, "attr"))
    if n.loc is not None:
        lines.append((str(n.loc), "loc"))
    if n.origin:
        lines.append((f"from {n.origin}", "note"))
    return lines


# ---- kernels -> Graph IR nodes -------------------------------------------------------------------
def _homes(graph: Graph, schedule, prim, level: str):
    """kernel_homes (or, for the primitive graph, the kernels' own nodes), with each constant
    that only one kernel reads placed in that kernel: it is compiled into it."""
    if level == "primitive":
        home, parts = {n: ki for ki, k in enumerate(schedule.kernels) for n in k.fuses}, {}
    else:
        home, parts = kernel_homes(graph, schedule, prim)
    readers = {}
    for c in graph.nodes:
        for v in c.inputs:
            readers.setdefault(v.id, set()).add(home.get(c))
    returned = {v.id for v in graph.outputs}
    for n in graph.nodes:
        at = readers.get(n.out.id, {None})
        if n.op == "const" and len(at) == 1 and None not in at and n.out.id not in returned:
            home[n] = next(iter(at))
    return home, parts


def kernel_homes(graph: Graph, schedule, prim: Graph | None):
    """({Graph IR node: index of the kernel it is drawn in}, {node: [(kernel index, [primitive
    ops])] for the earlier kernels of a node split over several})."""
    names = graph.names()
    by_origin = {f"{names[n.out.id]}:{n.op}": n for n in graph.nodes}
    kernels_of, ops_in, strays = {}, {}, []
    inside = {k.name for k in body_kernels(schedule.steps)}   # a loop body's: its own nodes
    for ki, k in enumerate(schedule.kernels):
        if k.name in inside:
            continue
        for p in k.fuses:
            n = by_origin.get(p.origin)
            if n is None:
                strays.append((ki, p))
                continue
            ks = kernels_of.setdefault(n, [])
            if ki not in ks:
                ks.append(ki)
            ops_in.setdefault((n, ki), []).append(p.op)
    home = {n: ks[-1] for n, ks in kernels_of.items()}
    parts = {n: [(ki, ops_in[n, ki]) for ki in ks[:-1]] for n, ks in kernels_of.items()
             if len(ks) > 1}

    def unnamed(v):
        return v.node is not None and v.node.op != "const" and v.node not in home

    if prim is not None and strays:                 # nodes a pattern absorbed
        users = {}
        for m in prim.nodes:
            for v in m.inputs:
                users.setdefault(v.id, []).append(m)
        for ki, p in strays:
            stack = [graph.outputs[j] for j, v in enumerate(prim.outputs) if v is p.out]
            for m in users.get(p.out.id, []):
                consumer = by_origin.get(m.origin)
                if consumer is not None:
                    stack += consumer.inputs
            while stack:
                v = stack.pop()
                if unnamed(v):
                    home[v.node] = ki
                    stack += v.node.inputs
    writer = {b.name: ki for ki, k in enumerate(schedule.kernels) for b in k.outputs}
    out_kernel = {}
    for v, b in zip(graph.outputs, schedule.outputs):
        if b.name in writer:
            out_kernel.setdefault(v.id, writer[b.name])
    consumers = {}
    for n in graph.nodes:
        for v in n.inputs:
            consumers.setdefault(v.id, []).append(n)
    for n in reversed(graph.nodes):                 # nodes CSE merged: with their consumer
        if n.op == "const" or n in home or n.op in REGION_OPS:
            continue
        ki = next((home[c] for c in consumers.get(n.out.id, []) if c in home),
                  out_kernel.get(n.out.id))
        if ki is not None:
            home[n] = ki
    return home, parts


def _part_edges(n: Node, i: int, pieces, main: int, schedule) -> list:
    """Dashed edges along the buffers a split node's kernels pass on to each other."""
    mine = {ki for ki, _ in pieces}
    edges = []
    for ki in sorted(mine):
        src = f"n{i}k{ki}"
        sent = False
        for b in schedule.kernels[ki].outputs:
            for kj, k in enumerate(schedule.kernels):
                reads = any(b is x for x in k.inputs)
                if kj != ki and reads and (kj in mine or kj == main):
                    dst = f"n{i}k{kj}" if kj in mine else f"n{i}"
                    edges.append(Edge(src, dst, str(b.type), dashed=True))
                    sent = True
        if not sent:
            edges.append(Edge(src, f"n{i}", str(schedule.kernels[ki].output.type), dashed=True))
    return edges


# ---- the failing node ----------------------------------------------------------------------------
def _failing(graph: Graph, failing, names):
    """(the param Value or Node to mark, or None; (lines, input values) of a box to add, or None).

    failing: a Node or Value of the graph, a node's index or display name ("%3", "%x"), a
    SourceLocation or "file:line", or a TesseraError (its location and op; an error from a trace
    names an op the graph never got, which is added as a box fed by the values it was given)."""
    if failing is None:
        return None, None
    if isinstance(failing, TesseraError):
        if failing.partial_graph is None and failing.location is not None:
            hit = _at(graph, failing.location, failing.op)
            if hit is not None:
                return hit, None
        lines = [(f"✗ {failing.op or type(failing).__name__}", "head")]
        for text in _wrap(failing.summary, 40)[:4]:
            lines.append((text, "attr"))
        for what, text in (("expected", failing.expected), ("received", failing.received)):
            if text is not None:
                lines.append((f"{what} {text}"[:60], "attr"))
        if failing.location is not None:
            lines.append((str(failing.location), "loc"))
        return None, (lines, list(failing.failed_inputs or ()))
    if isinstance(failing, Node):
        if any(failing is n for n in graph.nodes):
            return failing, None
    elif isinstance(failing, Value):
        if any(failing is p for p in graph.params):
            return failing, None
        if failing.node is not None and any(failing.node is n for n in graph.nodes):
            return failing.node, None
    elif isinstance(failing, int) and not isinstance(failing, bool):
        if 0 <= failing < len(graph.nodes):
            return graph.nodes[failing], None
    elif isinstance(failing, (str, SourceLocation)):
        by_name = {names[p.id]: p for p in graph.params}
        by_name.update({names[n.out.id]: n for n in graph.nodes})
        if isinstance(failing, str) and failing in by_name:
            return by_name[failing], None
        if isinstance(failing, SourceLocation) or ":" in failing:
            hit = _at(graph, failing, None)
            if hit is not None:
                return hit, None
            return None, ([("✗ failed here", "head"), (str(failing), "loc")], [])
    raise ArgumentError(f"failing={failing!r} names nothing in graph @{graph.name}",
                        expected="a node or value of the graph, its index or name (%3), a "
                                 "location (file.py:12) or a TesseraError")


def _at(graph: Graph, loc, op):
    """The last node at this location (and of this op, when given)."""
    def same(n):
        if n.loc is None:
            return False
        return n.loc == loc if isinstance(loc, SourceLocation) else str(n.loc) == loc
    hits = [n for n in graph.nodes if same(n) and (op is None or n.op == op)]
    return hits[-1] if hits else None


def _wrap(text: str, width: int) -> list:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = ""
        line = f"{line} {word}" if line else word
    return lines + [line] if line else lines


# ---- DOT -----------------------------------------------------------------------------------------
FILL = {"param": "#e8f0fe", "op": "#ffffff", "const": "#f4f4f4", "output": "#e6f4ea",
        "part": "#ffffff", "failing": "#fde2e1", "collective": "#fef7e0"}
SHAPE = {"param": "box", "op": "box", "const": "box", "output": "box", "part": "box",
         "failing": "box", "collective": "box"}
FONT = {"head": (11, "#202124"), "attr": (9, "#3c4043"), "loc": (8, "#80868b"),
        "note": (8, "#1a73e8")}
RED = "#d93025"


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _html_label(lines) -> str:
    parts = []
    for text, style in lines:
        size, color = FONT[style]
        t = html.escape(text)
        parts.append(f"<B>{t}</B>" if style == "head" else
                     f'<FONT POINT-SIZE="{size}" COLOR="{color}">{t}</FONT>')
    return "<" + "<BR/>".join(parts) + ">"


def to_dot(d: Drawing) -> str:
    out = [f"digraph {_quote(d.title)} {{",
           f'  graph [rankdir=TB, nodesep=0.25, ranksep=0.35, fontname="Helvetica", fontsize=13, '
           f"labelloc=t, label={_quote(d.title)}];",
           '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11, '
           'color="#5f6368", margin="0.12,0.05"];',
           '  edge [fontname="Helvetica", fontsize=9, fontcolor="#1a5fb4", color="#5f6368", '
           "arrowsize=0.7];"]

    def box_line(b: Box) -> str:
        style = "rounded,filled" + (",dashed" if b.kind == "part" else "")
        attrs = [f"label={_html_label(b.lines)}", f'style="{style}"',
                 f'fillcolor="{FILL[b.kind] if not b.failing else FILL["failing"]}"',
                 f"shape={SHAPE[b.kind]}"]
        if b.failing:
            attrs += [f'color="{RED}"', "penwidth=2"]
        if b.kind in ("const", "output"):
            attrs.append('margin="0.08,0.03"')
        return f"  {_quote(b.id)} [{', '.join(attrs)}];"

    for b in d.boxes:
        if b.cluster is None:
            out.append(box_line(b))
    for ki, c in enumerate(d.clusters):
        if not any(b.cluster == ki for b in d.boxes):
            continue                            # (a loop body's kernel: its nodes are drawn)
        out.append(f"  subgraph {_quote('cluster_' + c.name)} {{")
        out.append(f"    label={_quote(c.label)}; tooltip={_quote(c.tooltip or c.label)}; "
                   'style="rounded,filled"; fillcolor="#f1f5fb"; color="#8ab4f8"; '
                   'fontsize=10; fontcolor="#174ea6"; labeljust=l;')
        out += ["  " + box_line(b) for b in d.boxes if b.cluster == ki]
        out.append("  }")
    failed = {b.id for b in d.boxes if b.failing}
    for e in d.edges:
        attrs = [f"label={_quote(e.label)}"]
        if e.dashed:
            attrs.append("style=dashed")
        if e.dst in failed:
            attrs.append(f'color="{RED}"')
        out.append(f"  {_quote(e.src)} -> {_quote(e.dst)} [{', '.join(attrs)}];")
    out.append("}")
    return "\n".join(out) + "\n"


def graph_dot(obj, *, clusters: bool = True, failing=None, title=None, level: str = "graph") -> str:
    """Graphviz DOT text of a Graph IR: parameters, operators (op, key attributes, the source
    line), constants and outputs, every edge labelled with the type flowing on it.

    obj: a Graph, a Program (its concrete graph_ir; with clusters=True each Schedule IR kernel is
    a `cluster_<kernel>` subgraph around the nodes it computes), a tessera function (its
    symbolic graph), or a TesseraError from a trace (its partial graph, the failing op marked).
    failing: a node to mark in red (a Node, Value, index, "%3", "file.py:12", SourceLocation or
    TesseraError). level="primitive" draws a Program's primitive graph instead (the nodes the
    kernels fuse). Deterministic: the same graph always gives the same text."""
    return to_dot(drawing(obj, clusters=clusters, failing=failing, title=title, level=level))
