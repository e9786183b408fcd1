"""Graph IR → Graph IR passes: canonicalisation (constant folding, each operator's own rewrite
rules, CSE and DCE, to a fixpoint), decomposition of composite operators into primitive ones,
and on the primitive graph each operator's recognition of its hand-written form (attention).
The rules live in the operators' registry entries: no pass names an operator."""
from __future__ import annotations

import numpy as np

from .. import ops
from ..errors import TesseraError
from ..ops.registry import run_reference
from ..types import TensorType
from .graph_ir import Builder, Graph, Node, Region, Value, make_attrs

FOLD_LIMIT = 1 << 16          # fold constants up to this many elements


# ---- rewrite rules: (graph, node) -> replacement Value or None -----------------------------------
def fold_constants(g: Graph, n: Node):
    if n.op == "const" or not n.inputs or any(v.node is None or v.node.op != "const"
                                              for v in n.inputs):
        return None
    if not n.out.type.is_static or n.out.type.numel() > FOLD_LIMIT:
        return None
    arrays = [v.node.attrs["value"] for v in n.inputs]
    try:
        result = run_reference(n.opdef, arrays, n.attrs)
    except IndexError:
        return None                     # leave it for the kernel to report
    return _insert_const(g, n, np.asarray(result, dtype=n.out.type.dtype.np))


def _insert_const(g, n, value):
    c = Node("const", [], {"value": np.array(value, order="C")}, n.out.type, n.loc, n.origin)
    c.attrs["value"].setflags(write=False)
    g.nodes.insert(g.nodes.index(n), c)
    return c.out


def simplify(g: Graph, n: Node):
    """The node's own operator's canonicalisation rules (its registry entry's `simplify`)."""
    if n.op == "const":
        return None
    for rule in n.opdef.simplify:
        new = rule(g, n)
        if new is not None:
            return new
    return None


def recognise(g: Graph, n: Node):
    """An operator recognising its hand-written form ending at n (its entry's `recognise`)."""
    for opdef in ops.REGISTRY.values():
        if opdef.recognise is not None:
            new = opdef.recognise(g, n)
            if new is not None:
                return new
    return None


RULES = [fold_constants, simplify]


def _cse_key(n: Node):
    if n.op == "const":
        v = n.attrs["value"]
        return ("const", v.dtype.str, v.shape, v.tobytes())
    return (n.op, tuple(v.id for v in n.inputs), repr(sorted(n.attrs.items())))


def cse(g: Graph) -> bool:
    seen, changed = {}, False
    for n in list(g.nodes):
        key = _cse_key(n)
        if key in seen:
            g.replace_uses(n.out, seen[key])
            changed = True
        else:
            seen[key] = n.out
    return changed


def dce(g: Graph) -> bool:
    live = {v.id for v in g.outputs}
    keep = []
    for n in reversed(g.nodes):
        if n.out.id in live:
            keep.append(n)
            live.update(v.id for v in n.inputs)
    changed = len(keep) != len(g.nodes)
    g.nodes = list(reversed(keep))
    return changed


def canonicalize(g: Graph, rules=RULES) -> Graph:
    """Apply the rewrite rules, CSE and DCE until nothing changes. Mutates and returns g."""
    for _ in range(100):
        changed = False
        for n in list(g.nodes):
            if n not in g.nodes:
                continue
            for rule in rules:
                new = rule(g, n)
                if new is not None and new is not n.out:
                    g.replace_uses(n.out, new)
                    changed = True
                    break
        changed |= cse(g)
        changed |= dce(g)
        if not changed:
            break
    return g


# ---- decomposition -------------------------------------------------------------------------------
def decompose(g: Graph) -> Graph:
    """A new graph in primitive operators; each node made from a composite notes its origin."""
    names = g.names()
    out = Graph(g.name, bindings=g.bindings)
    vmap: dict[int, Value] = {p.id: out.add_param(p.param_name, p.type) for p in g.params}

    def emit(op, inputs, attrs, loc, origin):
        """Add op, expanding it recursively while its entry decomposes it."""
        opdef = ops.get(op)
        if opdef.decompose is not None:
            b = _ExpandingBuilder(out, loc, origin, emit)
            types = [v.type for v in inputs]
            result = opdef.decompose(b, inputs, make_attrs(opdef, attrs, types))
            if result is not None:
                return result
        return out.apply(op, inputs, attrs, loc=loc, origin=origin)

    for n in g.nodes:
        origin = n.origin or f"{names[n.out.id]}:{n.op}"
        if n.op == "const":
            c = Node("const", [], n.attrs, n.out.type, n.loc, origin)
            out.nodes.append(c)
            vmap[n.out.id] = c.out
            continue
        inputs = [vmap[v.id] for v in n.inputs]
        try:
            vmap[n.out.id] = emit(n.op, inputs, n.attrs, n.loc, origin)
        except TesseraError as e:
            if e.location is None:
                e.location, e.op = n.loc, n.op
            raise
    out.outputs = [vmap[v.id] for v in g.outputs]
    return out


class _ExpandingBuilder(Builder):
    def __init__(self, graph, loc, origin, emit):
        super().__init__(graph, loc, origin)
        self._emit = emit

    def add(self, name, values, attrs):
        return self._emit(name, values, attrs, self.loc, self.origin)


PRIMITIVE_RULES = RULES + [recognise]


# ---- complex values as their parts -----------------------------------------------------------------
def split_complex(g: Graph) -> Graph:
    """The primitive graph with every complex value computed as two float values, its real and
    imaginary parts, by each operator's rule (ops/complex.py). A complex parameter becomes a
    float parameter with a last axis of 2 (the interleaved memory, read in place) and a complex
    result is written back into that layout, so the program takes and gives NumPy's complex
    arrays viewed as floats. A control-flow region's complex carries, operands and results
    become two each, its bodies split alike (`_split_body`). A graph without complex values is
    returned as it is."""
    if not any(v.type.dtype.is_complex for v in _values(g)):
        return g
    out = Graph(g.name, bindings=g.bindings)
    out.output_structure, out.output_tree = g.output_structure, g.output_tree
    parts: dict = {}
    for p in g.params:
        d = p.type.dtype
        if not d.is_complex:
            parts[p.id] = out.add_param(p.param_name, p.type)
            continue
        shape = list(p.type.shape)
        q = out.add_param(p.param_name, TensorType(d.part, (*shape, 2)))
        b = Builder(out, None, f"%{p.param_name}:complex")
        parts[p.id] = tuple(b.op("reshape", b.op("slice", q, starts=[None] * len(shape) + [k],
                                                 stops=[None] * len(shape) + [k + 1],
                                                 steps=None), shape=shape)
                            for k in (0, 1))
    _split_nodes(g, out, parts)
    outs = []
    for v in g.outputs:
        x = parts[v.id]
        if isinstance(x, tuple):
            b = Builder(out, None, "%return:complex")
            shape = list(v.type.shape)
            whole = _interleaved(x, shape)
            if whole is not None:                      # (a transform's result: as it is)
                x = whole
            elif all(tuple(p.type.shape) == tuple(shape) for p in x):
                # the parts interleaved by a select over a last axis of 2: the group computing
                # them writes the result (one pointwise kernel for z * w, not seven)
                pair = [b.op("broadcast_to", b.op("reshape", p, shape=shape + [1]),
                             shape=shape + [2]) for p in x]
                x = b.op("where", b.const(np.array([True, False]), None), *pair)
            else:
                x = b.op("concat", [b.op("reshape", b.op("broadcast_to", p, shape=shape),
                                         shape=shape + [1]) for p in x], axis=len(shape))
        outs.append(x)
    out.outputs = outs
    return out


def _interleaved(pair, shape) -> Value | None:
    """The value whose last axis of 2 holds the pair's parts, in order, where the pair was
    read off one (a transform's result, a complex parameter), else None."""
    sources = []
    for k, p in enumerate(pair):
        while p.node is not None and p.node.op == "broadcast_to" and \
                tuple(p.node.inputs[0].type.shape) == tuple(p.type.shape):
            p = p.node.inputs[0]                 # (a broadcast to its own shape)
        r = p.node
        s = r.inputs[0].node if r is not None and r.op == "reshape" else None
        if s is None or s.op != "slice" or tuple(s.inputs[0].type.shape) != (*shape, 2) or \
                list(s.attrs["starts"]) != [0] * len(shape) + [k] or \
                list(s.attrs["stops"]) != [*shape, k + 1] or \
                any(step != 1 for step in s.attrs["steps"]):
            return None
        sources.append(s.inputs[0])
    return sources[0] if sources[0] is sources[1] else None


def _split_nodes(g: Graph, out: Graph, parts: dict):
    """g's nodes into out, each complex value as its (re, im) pair in `parts` (value id -> a
    Value or a pair, the parameters' already there)."""
    for n in g.nodes:
        if n.out.id in parts:               # a region's later result, made with its first
            continue
        b = Builder(out, n.loc, n.origin)
        if n.op == "const":
            v = n.attrs["value"]
            parts[n.out.id] = (b.const(v.real.copy(), None), b.const(v.imag.copy(), None)) \
                if v.dtype.kind == "c" else b.const(v, None)
            continue
        xs = [parts[v.id] for v in n.inputs]
        if n.op in ops.regions.REGION_OPS:
            _split_region(g, out, n, xs, parts)
            continue
        complex_in = any(isinstance(x, tuple) for x in xs)
        if not complex_in and not n.out.type.dtype.is_complex:
            parts[n.out.id] = out.apply(n.op, xs, n.attrs, loc=n.loc, origin=n.origin)
            continue
        parts[n.out.id] = ops.complex.RULES[n.op](b, xs, n.attrs, n.out.type)


def _widths(types) -> list:
    """How many values each of these types becomes: 2 for a complex one."""
    return [2 if t.dtype.is_complex else 1 for t in types]


def _flat(items) -> list:
    return [y for x in items for y in (x if isinstance(x, tuple) else (x,))]


def _part_types(types) -> list:
    return [t for u in types for t in ((TensorType(u.dtype.part, u.shape),) * 2
                                       if u.dtype.is_complex else (u,))]


def _split_region(g: Graph, out: Graph, n: Node, xs: list, parts: dict):
    """A control-flow region whose carries, operands or results may be complex: each becomes its
    two parts, in place (so the kinds' orders hold), the counts in its attrs widened to match,
    its bodies split by `_split_body`; its results' siblings made together."""
    region = n.attrs["region"]
    sibs = g.siblings(n)
    if not any(isinstance(x, tuple) for x in xs) and \
            not any(t.dtype.is_complex for t in region.types):    # (complex inside: per body)
        for s in sibs:
            parts[s.out.id] = out.apply(s.op, [parts[v.id] for v in s.inputs], s.attrs,
                                        loc=s.loc, origin=s.origin)
        return
    widths = _widths([v.type for v in n.inputs])
    operands = sum(widths[:region.operands])
    captures, at = {}, region.operands
    for role in region.bodies:
        captures[role] = sum(widths[at:at + region.captures[role]])
        at += region.captures[role]
    attrs = dict(region.attrs)
    for key in ("carries", "saves"):        # counts of leading results
        if key in attrs and not isinstance(attrs[key], bool):
            attrs[key] = sum(_widths(region.types[:attrs[key]]))
    split = Region(region.kind, {r: _split_body(body) for r, body in region.bodies.items()},
                   operands, captures, _part_types(region.types), attrs, region.loc)
    flat = _flat(xs)
    made = [out.apply(n.op, flat, {"region": split, "result": i}, loc=n.loc, origin=n.origin)
            for i in range(len(split.types))]
    at, by_result = 0, []
    for t in region.types:
        by_result.append(tuple(made[at:at + 2]) if t.dtype.is_complex else made[at])
        at += 2 if t.dtype.is_complex else 1
    for s in sibs:
        parts[s.out.id] = by_result[s.attrs["result"]]


def _split_body(body: Graph) -> Graph:
    """A region's body, decomposed, with each complex parameter and output as two float ones,
    its real part first (what `_split_region` passes and expects)."""
    body = decompose(canonicalize(body.clone()).verify())
    out = Graph(body.name, bindings=body.bindings)
    parts: dict = {}
    for p in body.params:
        if p.type.dtype.is_complex:
            t = TensorType(p.type.dtype.part, p.type.shape)
            parts[p.id] = (out.add_param(f"{p.param_name}_re", t),
                           out.add_param(f"{p.param_name}_im", t))
        else:
            parts[p.id] = out.add_param(p.param_name, p.type)
    _split_nodes(body, out, parts)
    b = Builder(out, None, "%return:complex")
    out.outputs = []
    for v in body.outputs:
        x = parts[v.id]
        if isinstance(x, tuple):            # (a real value made complex: its parts' shapes)
            x = tuple(b.op("broadcast_to", p, shape=list(v.type.shape)) for p in x)
        out.outputs += list(x) if isinstance(x, tuple) else [x]
    return out


def _values(g: Graph):
    yield from g.params
    for n in g.nodes:
        yield n.out
