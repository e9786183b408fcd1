"""Reverse-mode automatic differentiation as a Graph IR transform.

``backward`` differentiates a range of a graph's nodes (those one call added to a graph being
traced, or a whole imported graph): it walks them from the outputs back to the arguments, calls
each operator's adjoint rule (the ``vjp`` of its registry entry) with a Builder writing into the
same graph, and accumulates the cotangents. So the backward graph is ordinary Graph IR: it prints
with the forward graph, compiles through the same pipeline and fuses like anything else; and the
backward nodes have adjoints themselves, which is what makes grad of grad work. No tracer is
needed: any Graph can be differentiated.

Decisions:
* Only the nodes in ``graph.nodes[start:end]`` are differentiated; anything made before
  (captured tensors, the caller's earlier work) is a constant here. Nesting therefore needs no
  tags: an outer derivative walks a range that holds the inner forward *and* backward nodes.
* Only float values carry cotangents. An integer or bool value (indices, masks, argmax) stops
  the gradient, so a float that depends on the arguments only through one gets none.
* A node is visited only if it depends on an argument and its result reaches an output, so an
  operator without an adjoint raises ``DifferentiationError`` (naming it, the user's line and
  the function) only where its derivative is really needed; an operator registered with
  ``differentiable=False`` has a zero derivative instead.
* A rule may return a cotangent in the output's broadcast shape or another float dtype;
  ``fit`` sums it back to the input's shape (the one shared broadcasting adjoint, ``sum_to``)
  and casts it to the input's dtype.
* Nodes a rule made that no kept cotangent uses (the cotangent of a constant exponent, say)
  are removed at once, so the printed graph holds only what the gradient needs. Backward nodes
  carry the source location of the forward node they differentiate.
* Accumulation order is fixed (reverse node order, then operand order): the graph, and so the
  compiled gradient, is the same on every trace.
"""
from __future__ import annotations

import numpy as np

from ..errors import DifferentiationError, TesseraError, enrich
from ..ops.regions import REGION_OPS
from ..ops.registry import sum_to
from ..types import TensorType
from .graph_ir import Builder, Graph, Node, Region, Value


def is_float(v: Value) -> bool:
    """Does v carry a cotangent (a float, or a complex by the conjugate convention)?"""
    return v.type.dtype.is_inexact


def fit(b: Builder, ct: Value, value_type) -> Value:
    """A cotangent in its value's shape and dtype."""
    ct = sum_to(b, ct, value_type.shape)
    if ct.dtype != value_type.dtype:
        ct = b.op("cast", ct, dtype=value_type.dtype.name)
    return ct


def backward(g: Graph, start: int, end: int, outputs, cotangents, wrt, function: str | None = None,
             loc=None) -> list:
    """Cotangents of ``wrt`` (values made before ``start``) given ``cotangents`` of ``outputs``
    (Graph IR values), through the nodes ``g.nodes[start:end]``. Returns one value per ``wrt``
    item, or None where no path leads from it to an output (the caller picks zeros). The nodes
    made for the outputs' cotangents carry ``loc``; every other backward node, the location of
    the forward node it differentiates."""
    nodes = g.nodes[start:end]
    active = {w.id for w in wrt if is_float(w)}
    for n in nodes:
        if n.inputs and is_float(n.out) and any(v.id in active for v in n.inputs):
            active.add(n.out.id)
    ct: dict = {}

    def accumulate(b, v, c):
        prev = ct.get(v.id)
        ct[v.id] = c if prev is None else b.op("add", prev, c)

    seed = Builder(g, loc)
    for o, c in zip(outputs, cotangents):
        if c is not None and o.id in active:
            accumulate(seed, o, fit(seed, c, o.type))
    done = set()                        # regions whose adjoint has been written
    for n in reversed(nodes):
        if n.op in REGION_OPS:          # one adjoint for all of a region's results
            region = n.attrs["region"]
            if region in done:
                continue
            done.add(region)
            cts = {m.attrs["result"]: ct.pop(m.out.id) for m in g.siblings(n) if m.out.id in ct}
            if not cts:
                continue
            try:
                res = region_adjoint(g, n, cts, function)
            except TesseraError as e:
                raise enrich(e, function=function, location=region.loc, op=n.op) from None
            done.add(n.attrs["region"])     # (a loop's results now come from a saving scan)
            b = Builder(g, n.loc)
            for v, r in zip(n.inputs, res):
                if r is not None and v.id in active:
                    accumulate(b, v, fit(b, r, v.type))
            continue
        gy = ct.pop(n.out.id, None)
        if gy is None:
            continue
        opdef = n.opdef
        if opdef.vjp is None:
            if not opdef.differentiable:
                continue
            raise DifferentiationError(
                f"{n.op} has no adjoint rule, so this function cannot be differentiated through "
                "it", function=function, location=n.loc, op=n.op,
                hint=f"give the {n.op} entry of the operator registry a vjp (in "
                     f"tessera/ops/), written with other operators")
        before = len(g.nodes)
        b = Builder(g, n.loc)
        try:
            res = opdef.vjp(b, list(n.inputs), n.out, gy, n.attrs)
            if len(res) != len(n.inputs):
                raise DifferentiationError(f"the adjoint of {n.op} returned {len(res)} "
                                           f"cotangents for {len(n.inputs)} operands")
            touched = []
            for v, r in zip(n.inputs, res):
                if r is not None and v.id in active:
                    accumulate(b, v, fit(b, r, v.type))
                    touched.append(v.id)
        except TesseraError as e:
            raise enrich(e, function=function, location=n.loc, op=n.op) from None
        _prune(g, before, {ct[i].id for i in touched})
    return [ct.get(w.id) for w in wrt]


def _prune(g, before: int, roots: set):
    """Drop the nodes made since ``before`` that no root needs (nothing else can use them)."""
    live, keep = set(roots), []
    for m in reversed(g.nodes[before:]):
        if m.out.id in live:
            keep.append(m)
            live.update(v.id for v in m.inputs)
    g.nodes[before:] = keep[::-1]


# ---- control flow ------------------------------------------------------------------------------
# A loop's adjoint is a loop: the forward loop keeps each step's carries (a fori_loop becomes a
# scan over its counters, its results unchanged and the carries before each step stacked beside
# them), and a reverse scan runs the body's own backward graph over them, the cotangents of the
# carries (and the sums for the captured tensors) as its carries, the xs' cotangents as its ys.
# A cond's adjoint is a cond of the two branches' backward graphs. A while loop has no adjoint:
# its trip count is unknown until it runs.


def region_adjoint(g: Graph, node: Node, cts: dict, function) -> list:
    """Cotangents of a region node's operands given those of its results (index -> value)."""
    region = node.attrs["region"]
    if region.kind == "cond":
        return _cond_adjoint(g, node, cts, function)
    if region.kind == "while_loop":
        raise DifferentiationError(
            "reverse-mode differentiation through ts.while_loop is not supported",
            hint="a while loop's trip count is known only when it runs: write the loop with "
                 "ts.fori_loop (a static trip count) to differentiate it")
    return _loop_adjoint(g, node, cts, function)


def _zeros(b: Builder, t: TensorType) -> Value:
    return b.op("broadcast_to", b.const(np.zeros((), t.dtype.np), None), shape=list(t.shape))


def _clone(dst: Graph, src: Graph, pmap: dict) -> list:
    """src's nodes appended to dst, its parameters read as pmap says (src param id -> dst
    value); returns src's outputs in dst."""
    vmap = dict(pmap)
    for n in src.nodes:
        m = Node(n.op, [vmap[v.id] for v in n.inputs], n.attrs, n.out.type, n.loc, n.origin)
        dst.nodes.append(m)
        vmap[n.out.id] = m.out
    return [vmap[v.id] for v in src.outputs]


def _body_backward(graph: Graph, src: Graph, pmap: dict, seeds: list, wrt: list, function):
    """src cloned into graph (its parameters as pmap says) and differentiated there: the
    cotangents of `wrt` given `seeds` for src's outputs (None: no cotangent)."""
    start = len(graph.nodes)
    outs = _clone(graph, src, pmap)
    return backward(graph, start, len(graph.nodes), outs, seeds, wrt, function)


def _add_region(g: Graph, region: Region, operands: list, loc) -> list:
    return [g.apply("scan" if region.kind == "scan" else region.kind, operands,
                    {"region": region, "result": i}, loc=loc)
            for i in range(len(region.types))]


def _loop_adjoint(g: Graph, node: Node, cts: dict, function) -> list:
    region = node.attrs["region"]
    body = region.bodies["body"]
    fori = region.kind == "fori_loop"
    k = region.attrs.get("carries", len(region.types))
    if fori and region.attrs.get("save"):
        # differentiated again (a Hessian): its stacked carries are outputs too, each step's
        # carry as it began, so the body differentiated gives them back as ys
        plain = Graph("body")
        pmap = {p.id: plain.add_param(p.param_name, p.type) for p in body.params}
        plain.outputs = _clone(plain, body, pmap) + [pmap[p.id] for p in body.params[1:1 + k]]
        body = plain
    ps = body.params
    if fori:
        c_ps, x_ps, caps_ps = ps[1:1 + k], ps[:1], ps[1 + k:]
        n, rev = region.attrs["hi"] - region.attrs["lo"], False
    else:
        m = region.operands - k
        c_ps, x_ps, caps_ps = ps[:k], ps[k:k + m], ps[k + m:]
        n, rev = region.attrs["length"], region.attrs["reverse"]
    sibs = g.siblings(node)
    init, caps = node.inputs[:k], node.inputs[region.operands:]
    stacked = [TensorType(p.type.dtype, (n, *p.type.shape)) for p in c_ps]
    # the forward loop keeps the carries each step starts from: the same body for a fori_loop
    # (save=true), a body that also gives back its carries for a scan. The results' nodes stay
    # where they are (other ranges of this graph are counted by position), now of that region;
    # a loop saving already (differentiated before) is left as it is.
    if region.attrs.get("save") or region.attrs.get("saves"):
        saving, first = region, len(region.types) - k
    elif fori:
        saving, first = Region("fori_loop", {"body": body}, k, dict(region.captures),
                               list(region.types) + stacked,
                               {**region.attrs, "save": True, "carries": k},
                               region.loc), len(region.types)
    else:
        save = Graph("body")
        pmap = {p.id: save.add_param(f"a{j}", p.type) for j, p in enumerate(c_ps + x_ps)}
        pmap.update({p.id: save.add_param(f"cap{j}", p.type) for j, p in enumerate(caps_ps)})
        save.outputs = _clone(save, body, pmap) + [pmap[p.id] for p in c_ps]
        saving, first = Region("scan", {"body": save}, region.operands, dict(region.captures),
                               list(region.types) + stacked, {**region.attrs, "saves": k},
                               region.loc), len(region.types)
    for s in sibs:
        s.attrs = {"region": saving, "result": s.attrs["result"]}
    have = {s.attrs["result"]: s.out for s in sibs}
    saved = [have.get(first + j) or
             g.apply(node.op, list(node.inputs), {"region": saving, "result": first + j},
                     loc=node.loc) for j in range(k)]
    if fori:                            # the counters, as the reverse scan's xs
        d = ps[0].type.dtype
        xs = [Builder(g, node.loc).const(np.arange(region.attrs["lo"], region.attrs["hi"],
                                                   dtype=d.np), None)]
    else:
        xs = node.inputs[k:region.operands]
    n_ys = len(region.types) - k

    # the reverse scan over the saved carries
    fc = [j for j in range(k) if is_float(c_ps[j])]
    fk = [j for j in range(len(caps)) if is_float(caps[j])]
    fx = [j for j in range(len(xs)) if is_float(xs[j])]
    gys = [j for j in range(n_ys) if cts.get(k + j) is not None]
    rb = Graph("body")
    gc = [rb.add_param(f"gc{j}", c_ps[j].type) for j in fc]
    gk = [rb.add_param(f"gk{j}", caps[j].type) for j in fk]
    c_t = [rb.add_param(f"c{j}", p.type) for j, p in enumerate(c_ps)]
    x_t = [rb.add_param(f"x{j}", p.type) for j, p in enumerate(x_ps)]
    gy_t = {j: rb.add_param(f"gy{j}", body.outputs[k + j].type) for j in gys}
    k_t = [rb.add_param(f"cap{j}", p.type) for j, p in enumerate(caps_ps)]
    pmap = {p.id: v for p, v in zip(c_ps + x_ps + caps_ps, c_t + x_t + k_t)}
    seeds = [gc[fc.index(j)] if j in fc else None for j in range(k)] + \
        [gy_t.get(j) for j in range(n_ys)]
    res = _body_backward(rb, body, pmap, seeds, c_t + x_t + k_t, function)
    rc, rx, rk = res[:k], res[k:k + len(x_t)], res[k + len(x_t):]
    b = Builder(rb, node.loc)
    rb.outputs = [fit(b, rc[j], c_ps[j].type) if rc[j] is not None else _zeros(b, c_ps[j].type)
                  for j in fc]
    rb.outputs += [b.op("add", gk[i], fit(b, rk[j], caps[j].type)) if rk[j] is not None
                   else gk[i] for i, j in enumerate(fk)]
    rb.outputs += [fit(b, rx[j], x_ps[j].type) if rx[j] is not None else _zeros(b, x_ps[j].type)
                   for j in fx]
    carries = len(fc) + len(fk)
    types = [c_ps[j].type for j in fc] + [caps[j].type for j in fk] + \
        [TensorType(xs[j].type.dtype, (n, *x_ps[j].type.shape)) for j in fx]
    reverse = Region("scan", {"body": rb}, carries + k + len(xs) + len(gys),
                     {"body": len(caps)}, types,
                     {"length": n, "reverse": not rev, "carries": carries}, region.loc)
    ob = Builder(g, node.loc)
    start = [cts[j] if j in cts else _zeros(ob, c_ps[j].type) for j in fc] + \
        [_zeros(ob, caps[j].type) for j in fk]
    out = _add_region(g, reverse, [*start, *saved, *xs, *(cts[k + j] for j in gys), *caps],
                      node.loc)
    grads = [None] * len(node.inputs)
    for i, j in enumerate(fc):
        grads[j] = out[i]
    for i, j in enumerate(fk):
        grads[region.operands + j] = out[len(fc) + i]
    if not fori:
        for i, j in enumerate(fx):
            grads[k + j] = out[carries + i]
    return grads


def _cond_adjoint(g: Graph, node: Node, cts: dict, function) -> list:
    region = node.attrs["region"]
    ops = node.inputs[1:region.operands]
    present = sorted(cts)
    fo = [j for j, v in enumerate(ops) if is_float(v)]
    caps = {r: region.body_operands(r, node.inputs) for r in ("true", "false")}
    fk = {r: [j for j, v in enumerate(caps[r]) if is_float(v)] for r in caps}
    bodies = {}
    for role in ("true", "false"):
        src = region.bodies[role]
        gb = Graph(role)
        o_t = [gb.add_param(f"a{j}", v.type) for j, v in enumerate(ops)]
        g_t = [gb.add_param(f"g{j}", region.types[j]) for j in present]
        k_t = [gb.add_param(f"cap{j}", p.type)
               for j, p in enumerate(src.params[len(ops):])]
        pmap = {p.id: v for p, v in zip(src.params, o_t + k_t)}
        seeds = [g_t[present.index(j)] if j in present else None
                 for j in range(len(region.types))]
        res = _body_backward(gb, src, pmap, seeds, o_t + k_t, function)
        b = Builder(gb, node.loc)
        outs = [fit(b, res[j], ops[j].type) if res[j] is not None else _zeros(b, ops[j].type)
                for j in fo]
        for other in ("true", "false"):
            for j in fk[other]:
                r = res[len(ops) + j] if other == role else None
                outs.append(fit(b, r, caps[other][j].type) if r is not None
                            else _zeros(b, caps[other][j].type))
        gb.outputs = outs
        bodies[role] = gb
    types = [ops[j].type for j in fo] + [caps[r][j].type for r in ("true", "false")
                                         for j in fk[r]]
    adj = Region("cond", bodies, 1 + len(ops) + len(present),
                 {r: len(caps[r]) for r in ("true", "false")}, types, {}, region.loc)
    out = _add_region(g, adj, [node.inputs[0], *ops, *(cts[j] for j in present),
                               *caps["true"], *caps["false"]], node.loc)
    grads = [None] * len(node.inputs)
    for i, j in enumerate(fo):
        grads[1 + j] = out[i]
    at = len(fo)
    for r in ("true", "false"):
        offset = region.operands + (0 if r == "true" else len(caps["true"]))
        for j in fk[r]:
            grads[offset + j] = out[at]
            at += 1
    return grads
