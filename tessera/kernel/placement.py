"""After tracing: the grid of programs, and each load's placement against it.

The output's axes make the grid (an atomic kernel's: its loads' blocked axes); every load then
learns, per axis, where a program reads: its block of the grid ("grid"), all of the dimension
("whole"), a block at a time in a range_k loop ("stream"), or at explicit offsets ("offset").
"""
from __future__ import annotations

from ..errors import ShapeError, TracingError
from .ir import AtomicStmt, KernelBody, KernelValue, LoadStmt, PartStmt, StoreStmt, type_text, walk


def resolve(body: KernelBody):
    """Tie the output's axes to the grid and check every load against it. Sets
    body.grid: [(dim, block size Ix or None for whole)] per output axis; each LoadStmt's place:
    per axis "grid", "whole", "stream" or "offset"."""
    out = body.output
    if out is None:
        raise TracingError(f"tile kernel {body.name} neither stores into a parameter nor "
                           "returns a tile", hint="end it with tile.store(C, acc) or "
                                                  "return a tile")
    if isinstance(out, AtomicStmt):
        body.grid = _load_grid(body)
        _place_loads(body)
        _place_atomics(body)
        return
    if isinstance(out, StoreStmt):
        v, dims, offsets = out.value, body.param(out.param).dims, out.offsets
    else:                                   # a ReturnStmt
        v = out.value
        dims = [d for d in v.dims]
        offsets = None
        if any(d is None for d in dims):
            raise ShapeError(f"tile kernel {body.name} returns a tile whose axes are not all "
                             f"tied to a parameter's dimension", received=type_text(v),
                             hint="return a tile computed from loads (a reduction keeps its "
                                  "axis only with keepdim=True)")
    grid = []
    for i, (d, s) in enumerate(zip(dims, v.shape)):
        if offsets is not None:
            grid.append((d, s if not (s.op == "dim") else None))
        elif s.op == "dim":
            if s.args[0] != d:
                raise ShapeError(f"the output's axis {i} runs over {d} but the stored tile's "
                                 f"size there is all of {s.args[0]}", received=type_text(v))
            grid.append((d, None))
        elif s.op == "const" and s.args[0] == 1 and v.dims[i] is None:
            raise ShapeError(f"the output's axis {i} ({d}): the stored tile has size 1 there, "
                             "a reduced axis", received=type_text(v),
                             hint="a reduction over a program's block covers only that block")
        else:
            grid.append((d, s))
    named = [d for d, s in grid if s is not None]
    if len(set(named)) != len(named):
        raise ShapeError(f"tile kernel {body.name}: two axes of its output run over the same "
                         f"dimension, so a program's block of it is ambiguous",
                         received=" x ".join(map(str, dims)),
                         hint="give the output's axes different dimension names")
    body.grid = grid
    _place_loads(body)


def _load_grid(body) -> list:
    """An atomic kernel's grid: the axes its loads take in blocks (neither whole nor streamed
    by load_partition), in the order the body first loads them."""
    grid = {}                           # dimension -> its block (first load first)
    for st in walk(body.stmts):
        if not isinstance(st, LoadStmt) or st.offsets is not None or st.out.stream:
            continue
        for d, s in zip(body.param(st.param).dims, st.out.shape):
            if not (s.op == "dim" and s.args[0] == d):
                grid.setdefault(d, s)
    return list(grid.items())


def _place_atomics(body):
    """A block atomic_add is placed as a store is: along an axis the grid walks, at the
    program's block (the tile must be that block); along any other, at 0 (or offset=)."""
    gridded = {d: s for d, s in body.grid}
    for st in walk(body.stmts):
        if not isinstance(st, AtomicStmt) or st.index is not None or st.offsets is not None:
            continue
        p, v = body.param(st.param), st.value
        for i, (d, s) in enumerate(zip(p.dims, v.shape)):
            if d in gridded and gridded[d] != s:
                raise ShapeError(f"tile.atomic_add into {p.name}: the grid walks {d} in blocks "
                                 f"of {gridded[d]}, the tile's axis {i} is {s}",
                                 location=st.loc, received=type_text(v),
                                 hint=f"add a tile of the program's block of {d}, or place it "
                                      f"with offset=")


def _place_loads(body):
    """Each load's placement against the grid (LoadStmt.place)."""
    gridded = {d: s for d, s in body.grid if s is not None}
    for st in walk(body.stmts):
        if not isinstance(st, LoadStmt):
            continue
        p = body.param(st.param)
        out = st.out
        if st.offsets is not None:
            st.place = ("offset",) * len(p.dims)
            continue
        place = []
        for d, s in zip(p.dims, out.shape):
            if s.op == "dim" and s.args[0] == d:
                place.append("whole")
            elif d in gridded and gridded[d] == s:
                place.append("grid")
            elif d in gridded:
                raise ShapeError(f"tile.load of {p.name}: the grid walks {d} in blocks of "
                                 f"{gridded[d]}, the load takes blocks of {s}",
                                 location=st.loc, received=type_text(out),
                                 hint=f"load {d} in blocks of {gridded[d]} (or whole: "
                                      f"ctx.{d})")
            else:
                place.append("stream")
        if out.stream and "stream" not in place:
            raise ShapeError(f"tile.load_partition of a tile.load of {p.name} that has no "
                             f"axis in blocks the grid does not walk: nothing to partition",
                             location=st.loc, received=type_text(out),
                             hint="load_partition takes a load with one axis in blocks of a "
                                  "dimension the output does not have (ctx.BK of K)")
        if "stream" in place and not out.stream:
            axis = place.index("stream")
            raise ShapeError(f"tile.load of {p.name}: its axis {axis} takes blocks of "
                             f"{out.shape[axis]} of {p.dims[axis]}, which the grid does not "
                             f"walk", location=st.loc, received=type_text(out),
                             hint=f"read it a block at a time with tile.load_partition(tile, "
                                  f"k) in a tile.range_k loop, or load all of it (ctx."
                                  f"{p.dims[axis]})")
        if place.count("stream") > 1:
            raise ShapeError(f"tile.load of {p.name} streams two axes", location=st.loc,
                             received=type_text(out))
        st.place = tuple(place)
    for st in walk(body.stmts):
        for a in st.reads():
            if isinstance(a, KernelValue) and a.stream and not isinstance(st, PartStmt):
                raise ShapeError(f"{a}, a tile.load streamed by tile.load_partition, is used "
                                 f"whole", location=st.loc,
                                 hint="use the partitions tile.load_partition gives")


