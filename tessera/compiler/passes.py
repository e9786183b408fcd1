"""Graph IR → Graph IR passes: canonicalisation (pattern rewrites to a fixpoint) and
decomposition of composite operators into primitive ones."""
from __future__ import annotations

import numpy as np

from .. import ops
from ..errors import TesseraError
from ..ops.registry import run_reference
from ..shapes import same
from .graph_ir import Builder, Graph, Node, Value

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


def transpose_of_transpose(g: Graph, n: Node):
    if n.op != "transpose":
        return None
    src = n.inputs[0]
    if src.node is not None and src.node.op == "transpose":
        inner, outer = src.node.attrs["perm"], n.attrs["perm"]
        perm = [inner[p] for p in outer]
        if perm == sorted(perm):
            return src.node.inputs[0]
        new = g.apply("transpose", [src.node.inputs[0]], {"perm": perm}, loc=n.loc, origin=n.origin)
        g.nodes.remove(new.node)
        g.nodes.insert(g.nodes.index(n), new.node)
        return new
    if n.attrs["perm"] == sorted(n.attrs["perm"]):
        return src
    return None


def remove_noops(g: Graph, n: Node):
    """cast to the same dtype, reshape/broadcast to the same shape: the input itself."""
    if n.op in ("cast", "reshape", "broadcast_to") and n.inputs[0].type == n.out.type:
        return n.inputs[0]
    if n.op == "reshape" and n.inputs[0].node is not None and n.inputs[0].node.op == "reshape":
        new = g.apply("reshape", [n.inputs[0].node.inputs[0]], {"shape": list(n.out.type.shape)},
                      loc=n.loc, origin=n.origin)
        g.nodes.remove(new.node)
        g.nodes.insert(g.nodes.index(n), new.node)
        return new
    if n.op == "slice" and all(s == 0 and st == 1 and same(e, d) for s, e, st, d in zip(
            n.attrs["starts"], n.attrs["stops"], n.attrs["steps"], n.inputs[0].type.shape)):
        return n.inputs[0]
    return None


RULES = [fold_constants, transpose_of_transpose, remove_noops]


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
            from .graph_ir import make_attrs
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

    def op(self, name, *inputs, **attrs):
        return self._emit(name, list(inputs), attrs, self.loc, self.origin)


# ---- pattern recognition on the primitive graph ---------------------------------------------------
def _producer(v, op):
    return v.node if v.node is not None and v.node.op == op else None


def _scalar_const(v):
    n = _producer(v, "const")
    return float(n.attrs["value"]) if n is not None and n.attrs["value"].ndim == 0 else None


def recognise_attention(g: Graph, n: Node):
    """matmul(softmax_lastaxis(scale * matmul(q, kT) + mask), v) -> attention(q, k, v, mask).

    Every intermediate must have no other user (else the scores are needed anyway). The
    softmax is matched in its primitive form, so a hand-written one is found too."""
    if n.op != "matmul" or not n.out.type.dtype.is_float:
        return None
    users = {}
    for m in g.nodes:
        for v in m.inputs:
            users.setdefault(v.id, []).append(m)
    outputs = {v.id for v in g.outputs}

    def only_for(v, *consumers):
        return v.id not in outputs and sorted(map(id, users.get(v.id, []))) == \
            sorted(map(id, consumers))

    p, v_in = n.inputs
    div = _producer(p, "div")
    if div is None or not only_for(p, n):
        return None
    e, z = div.inputs
    exp, total = _producer(e, "exp"), _producer(z, "sum")
    if exp is None or total is None or total.inputs[0] is not e or not only_for(e, div, total) \
            or not only_for(z, div):
        return None
    last = e.type.rank - 1
    if total.attrs["axis"] != [last] or not total.attrs["keepdim"]:
        return None
    sub = _producer(exp.inputs[0], "sub")
    if sub is None or not only_for(exp.inputs[0], exp):
        return None
    x, mx = sub.inputs
    mx_node = _producer(mx, "max")
    if mx_node is None or mx_node.inputs[0] is not x or mx_node.attrs["axis"] != [last] or \
            not mx_node.attrs["keepdim"] or not only_for(mx, sub) or not only_for(x, sub, mx_node):
        return None
    scale, mask = 1.0, None
    while _producer(x, "matmul") is None:                 # walk the score epilogue back to q @ kT
        step = x.node
        if step is None or step.op not in ("mul", "div", "add"):
            return None
        a, b = step.inputs
        if step.op in ("mul", "div") and _scalar_const(b) is not None:
            scale = scale * _scalar_const(b) if step.op == "mul" else scale / _scalar_const(b)
            x = a
        elif step.op == "mul" and _scalar_const(a) is not None:
            scale, x = scale * _scalar_const(a), b
        elif step.op == "add" and mask is None and a.type.shape == step.out.type.shape:
            mask, x = b, a
        elif step.op == "add" and mask is None and b.type.shape == step.out.type.shape:
            mask, x = a, b
        else:
            return None
        if not only_for(x, step):
            return None
    scores = x.node
    q, kt = scores.inputs
    if scores.out.type.shape[:-1] != p.type.shape[:-1] or scores.out.type.dtype != n.out.type.dtype:
        return None
    if mask is not None and (mask.type.dtype != n.out.type.dtype or _depends_on(mask, scores)):
        return None
    perm = list(range(kt.type.rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    if _producer(kt, "transpose") is not None and kt.node.attrs["perm"] == perm:
        k = kt.node.inputs[0]
    else:
        k = _insert_before(g, n, "transpose", [kt], {"perm": perm})
    if mask is None:
        mask = g.const(np.zeros((), dtype=n.out.type.dtype.np), loc=n.loc, origin=n.origin)
        g.nodes.remove(mask.node)
        g.nodes.insert(g.nodes.index(n), mask.node)
    return _insert_before(g, n, "attention", [q, k, v_in, mask],
                          {"scale": scale, "causal": False}, origin=None)


def _depends_on(v, node) -> bool:
    stack, seen = [v], set()
    while stack:
        u = stack.pop()
        if u.node is None or u.id in seen:
            continue
        if u.node is node:
            return True
        seen.add(u.id)
        stack.extend(u.node.inputs)
    return False


def _insert_before(g: Graph, n: Node, op: str, inputs, attrs, origin="same") -> Value:
    new = g.apply(op, inputs, attrs, loc=n.loc, origin=n.origin if origin == "same" else origin)
    g.nodes.remove(new.node)
    g.nodes.insert(g.nodes.index(n), new.node)
    return new


PRIMITIVE_RULES = RULES + [recognise_attention]
