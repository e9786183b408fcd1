"""Pytrees: nested dicts, lists, tuples and namedtuples whose leaves are tensors.

A training step takes ``params`` as a dict of arrays and ``ts.grad`` returns gradients of the
same shape; this module is the one place that takes such structures apart and puts them back.

Decisions (as in JAX, with two simplifications):
* containers are ``dict`` (keys kept in insertion order, which is part of the structure),
  ``list``, ``tuple`` and namedtuples; ``None`` is an empty container (no leaves), so a gradient
  that does not exist can sit in a tree as ``None``;
* everything else is a leaf: arrays, traced tensors, Python numbers, strings. What a leaf
  *means* is the caller's business (``ts.function`` makes array leaves tensor parameters and
  keeps Python numbers as static values, part of the cache key).

``flatten(tree) -> (leaves, treedef)``; ``treedef.unflatten(leaves)`` rebuilds the tree;
``treedef`` is hashable and prints compactly (``{w: *, b: *}``), so it can key a cache.
"""
from __future__ import annotations

__all__ = ["TreeDef", "flatten", "unflatten", "leaves", "tree_map", "is_container"]


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def is_container(x) -> bool:
    return x is None or isinstance(x, (dict, list, tuple))


class TreeDef:
    """The shape of a pytree without its leaves."""
    __slots__ = ("kind", "meta", "children", "num_leaves", "_key")

    def __init__(self, kind: str, meta=None, children=()):
        self.kind = kind                      # leaf | none | dict | list | tuple | namedtuple
        self.meta = meta                      # dict keys, or the namedtuple's class
        self.children = tuple(children)
        self.num_leaves = 1 if kind == "leaf" else sum(c.num_leaves for c in self.children)
        self._key = (kind, meta, tuple(c._key for c in self.children))

    def unflatten(self, leaves):
        leaves = list(leaves)
        if len(leaves) != self.num_leaves:
            raise ValueError(f"the tree {self} holds {self.num_leaves} leaves, got {len(leaves)}")
        it = iter(leaves)
        return self._build(it)

    def _build(self, it):
        if self.kind == "leaf":
            return next(it)
        if self.kind == "none":
            return None
        items = [c._build(it) for c in self.children]
        if self.kind == "dict":
            return dict(zip(self.meta, items))
        if self.kind == "list":
            return items
        if self.kind == "namedtuple":
            return self.meta(*items)
        return tuple(items)

    def paths(self) -> list[tuple]:
        """Per leaf, the keys and indices leading to it (for naming graph parameters)."""
        if self.kind == "leaf":
            return [()]
        keys = self.meta if self.kind == "dict" else range(len(self.children))
        if self.kind == "namedtuple":
            keys = self.meta._fields
        return [(k,) + p for k, c in zip(keys, self.children) for p in c.paths()]

    def path_names(self) -> list[str]:
        """Per leaf, its keys joined by "/" ("blocks/0/attn/q/w": how checkpoints and layouts
        name leaves)."""
        return ["/".join(str(k) for k in keys) for keys in self.paths()]

    def __eq__(self, other):
        return isinstance(other, TreeDef) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        inner = [repr(c) for c in self.children]
        if self.kind == "dict":
            return "{" + ", ".join(f"{k}: {s}" for k, s in zip(self.meta, inner)) + "}"
        if self.kind == "list":
            return "[" + ", ".join(inner) + "]"
        if self.kind == "namedtuple":
            return f"{self.meta.__name__}(" + ", ".join(inner) + ")"
        return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"


LEAF = TreeDef("leaf")


def flatten(tree, is_leaf=None):
    """(leaves in order, treedef). ``is_leaf(x)`` may stop the descent at a container."""
    out = []
    return out, _flatten(tree, out, is_leaf)


def _flatten(x, out, is_leaf):
    if is_leaf is not None and is_leaf(x):
        out.append(x)
        return LEAF
    if x is None:
        return TreeDef("none")
    if isinstance(x, dict):
        keys = tuple(x)
        return TreeDef("dict", keys, [_flatten(x[k], out, is_leaf) for k in keys])
    if isinstance(x, list):
        return TreeDef("list", None, [_flatten(v, out, is_leaf) for v in x])
    if isinstance(x, tuple):
        kind, meta = ("namedtuple", type(x)) if _is_namedtuple(x) else ("tuple", None)
        return TreeDef(kind, meta, [_flatten(v, out, is_leaf) for v in x])
    out.append(x)
    return LEAF


def unflatten(treedef: TreeDef, leaves):
    return treedef.unflatten(leaves)


def leaves(tree) -> list:
    return flatten(tree)[0]


def tree_map(fn, tree, *rest):
    """fn over the leaves of ``tree`` (and the matching leaves of ``rest``, same structure)."""
    xs, td = flatten(tree)
    others = []
    for r in rest:
        ys, td2 = flatten(r)
        if td2 != td:
            raise ValueError(f"tree structures differ: {td} and {td2}")
        others.append(ys)
    return td.unflatten([fn(x, *ys) for x, *ys in zip(xs, *others)])
