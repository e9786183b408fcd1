"""Fusion: the primitive graph cut into groups, each of which becomes one kernel.

Groups grow from their root (the value a kernel writes) towards its producers. A producer joins
when every one of its users is already in the group, so nothing a group computes is needed
elsewhere, and when the group can compute it in place instead of reading it from memory. Which
node starts which kind of group, and which producers each kind takes in, is each strategy's
rule (tessera/compiler/strategies/); this file holds the growth every kind shares.
"""
from __future__ import annotations

import heapq

from . import strategies
from .graph_ir import Graph, Node
from .groups import LEAF, Group, is_reshape, is_view, map_from


def fuse(g: Graph, enabled: bool = True) -> list[Group]:
    index = {n: i for i, n in enumerate(g.nodes)}
    users: dict[int, list[Node]] = {}
    for n in g.nodes:
        for v in n.inputs:
            users.setdefault(v.id, []).append(n)
    outputs = {v.id for v in g.outputs}
    group_of: dict[Node, Group] = {}
    groups = []
    for n in reversed(g.nodes):
        if n in group_of or n.op == "const":
            continue
        grp = strategies.owner(n).start(n)
        grp.nodes.append(n)
        group_of[n] = grp
        if enabled and strategies.of(grp).grows:
            _grow(grp, n, index, users, outputs, group_of)
        grp.order(index)
        groups.append(grp)
    groups.sort(key=lambda grp: index[grp.root])
    return groups


def _grow(grp: Group, root: Node, index, users, outputs, group_of):
    heap = []

    def push_producers(n):
        for v in n.inputs:
            if v.node is not None and v.node.op != "const" and v.node not in group_of:
                heapq.heappush(heap, -index[v.node])

    push_producers(root)
    nodes = {i: n for n, i in index.items()}
    while heap:
        p = nodes[-heapq.heappop(heap)]
        if p in group_of:
            continue
        if _absorb(grp, p, users, outputs, group_of):
            group_of[p] = grp
            grp.nodes.append(p)
            push_producers(p)


def _moves(n: Node) -> bool:
    """A view that moves elements by a strided index map (a slice, a transpose): one that
    view_source composes with the views above and below it."""
    return is_view(n) and not is_reshape(n) and n.op != "broadcast_to"


def _absorb(grp: Group, p: Node, users, outputs, group_of) -> bool:
    own = strategies.of(grp)
    if p.out.id in outputs:
        return own.absorb_output(grp, p, users, group_of)
    us = users.get(p.out.id, [])
    if not us or any(group_of.get(u) is not grp for u in us):
        return False
    if grp.anchor is not None and any(u is grp.anchor for u in us):
        # the anchor reads its operands from memory; a view its other users view again is
        # composed with theirs (x[1:] @ x[1:].T), which a reshape above it would not allow
        return own.absorb_operand(grp, p) and (is_reshape(p) or not any(
            is_reshape(u) for u in us if u is not grp.anchor))
    if is_reshape(p) and all(is_view(u) and u.out.id not in grp.maps for u in us):
        return True      # a view of a reshape reads the reshape's source: same flat layout
    if _moves(p) and own.fuses_views and all(_moves(u) for u in us):
        return True      # a view of a view (a flip under a transpose): one strided read of
                         # the source, composed (emit.view_source), not a copy in between
    if any(u.out.id not in grp.maps for u in us):
        return False     # a user that reads its operand from memory (an anchor's view)
    maps = {map_from(u, grp.maps[u.out.id], p.out) for u in us}
    if len(maps) != 1 or LEAF in maps:
        return False
    (m,) = maps
    if own.absorb(grp, p, m, users):
        return True
    return any(s.adopt(grp, p, m) for s in strategies.REGISTRY.values() if s is not own)
