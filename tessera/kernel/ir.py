"""The traced body of a tile kernel: its values, parameters and statements, one class per kind.

IR data, like the compiler's IR levels: the tracer (tracer.py, builtins.py) builds it, the
placement pass completes it, and the interpreter and the `tile` strategy
(lowering.py) read it, telling statements apart by their class. Indices and
sizes in it are `Ix` expressions (index.py), read through their `op` and `args`.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from .. import dtypes as dt
from ..errors import ShapeError


@dataclass(eq=False)
class KernelValue:
    """A tile value: its shape (sizes), dtype, the dimension each axis runs over (None where
    unknown yet), and where it was made."""
    id: int
    shape: tuple
    dtype: dt.DType
    dims: list
    loc: object
    stream: bool = False        # a load to be read a block at a time by load_partition
    param: str = ""             # a stream's (or a direct use's) parameter

    def __str__(self):
        return f"%t{self.id}"


def type_text(v: KernelValue) -> str:
    return f"{v.dtype.short}[{', '.join(map(str, v.shape))}]" + \
        (" stream" if v.stream else "")


@dataclass(eq=False)
class KernelParam:
    name: str
    dims: tuple
    dtype: dt.DType
    read: bool = False          # the body reads it (a load, a direct use)
    written: bool = False       # the body stores into it


# ---- statements ----------------------------------------------------------------------------------
class KernelStmt:
    """A statement of a body. `reads()` are its operands in order (values, numbers, None),
    `attrs()` the rest as its text form shows them; `out` the value it makes, if any (a
    class attribute None where it makes none: a base-class default would become a field's)."""
    name = ""                   # its name in the body's text

    def reads(self) -> tuple:
        return ()

    def attrs(self) -> dict:
        return {}

    def __str__(self):
        a = ", ".join(map(str, self.reads()))
        at = " ".join(f"{k}={v}" for k, v in self.attrs().items() if k != "offsets" or v)
        head = f"{self.out}: {type_text(self.out)} = " if self.out is not None else ""
        return f"{head}{self.name}({a}){(' ' + at) if at else ''}"


@dataclass(eq=False)
class LoadStmt(KernelStmt):
    """`tile.load(P, shape)`: out is P's tile at the program's place; `place` (per axis "grid",
    "whole", "stream" or "offset") is set by the placement pass."""
    out: KernelValue
    param: str
    offsets: tuple | None
    other: float
    prefetch: object            # None, a number of buffers, or a knob
    loc: object = None
    place: tuple | None = None
    name = "load"

    def attrs(self):
        at = {"param": self.param, "offsets": self.offsets, "other": self.other,
              "prefetch": self.prefetch}
        return at if self.place is None else {**at, "place": self.place}

    @property
    def streamed(self) -> bool:
        return "stream" in self.place


@dataclass(eq=False)
class PartStmt(KernelStmt):
    """`tile.load_partition(stream, k)`: the block of a streamed load at k."""
    out: KernelValue
    stream: KernelValue
    k: object                   # an Ix
    loc: object = None
    name = "part"

    def reads(self):
        return (self.stream,)

    def attrs(self):
        return {"k": self.k}


@dataclass(eq=False)
class FullStmt(KernelStmt):
    """`tile.full(shape, value)` (and tile.zeros)."""
    out: KernelValue
    value: object
    loc: object = None
    name = "full"

    def attrs(self):
        return {"value": self.value}


@dataclass(eq=False)
class ElemStmt(KernelStmt):
    """An elementwise operator of the registry over tiles and numbers, its operands converted
    to `operand` dtypes; `extra` the operator's attributes."""
    out: KernelValue
    args: tuple
    op: str
    operand: tuple
    extra: dict
    loc: object = None
    name = "elem"

    def reads(self):
        return self.args

    def attrs(self):
        return {"op": self.op, "operand": self.operand, **self.extra}


@dataclass(eq=False)
class ReduceStmt(KernelStmt):
    """`tile.max/min/sum(x, axis, keepdim)`."""
    out: KernelValue
    x: KernelValue
    op: str
    axis: int
    keepdim: bool
    loc: object = None
    name = "reduce"

    def reads(self):
        return (self.x,)

    def attrs(self):
        return {"op": self.op, "axis": self.axis, "keepdim": self.keepdim}


@dataclass(eq=False)
class MmaStmt(KernelStmt):
    """`tile.mma(a, b)`: a [m, k] times b [k, n]."""
    out: KernelValue
    a: KernelValue
    b: KernelValue
    loc: object = None
    name = "mma"

    def reads(self):
        return (self.a, self.b)


@dataclass(eq=False)
class UpdateStmt(KernelStmt):
    """`target op= value` in place: how a tile is carried through a range_k loop."""
    out = None
    target: KernelValue
    value: object               # a KernelValue or a number
    op: str
    loc: object = None
    name = "update"

    def reads(self):
        return (self.target, self.value)

    def attrs(self):
        return {"op": self.op}


@dataclass(eq=False)
class LoopStmt(KernelStmt):
    """`for k in tile.range_k(start, stop, step, stages)`: `var` names k; `body` its statements."""
    out = None
    start: object
    stop: object
    step: object
    var: str
    stages: object
    loc: object = None
    body: list = field(default_factory=list)
    name = "loop"

    def reads(self):
        return (self.start, self.stop, self.step)

    def attrs(self):
        return {"var": self.var, "stages": self.stages}


@dataclass(eq=False)
class StoreStmt(KernelStmt):
    """`tile.store(P, value, offset=)`."""
    out = None
    value: KernelValue
    param: str
    offsets: tuple | None
    loc: object = None
    name = "store"

    def reads(self):
        return (self.value,)

    def attrs(self):
        return {"param": self.param, "offsets": self.offsets}


@dataclass(eq=False)
class AtomicStmt(KernelStmt):
    """`tile.atomic_add(P, value, offset=)` (a block) or `(P, value, index=)` (a histogram)."""
    out = None
    value: object               # a KernelValue or a number
    index: KernelValue | None
    param: str
    offsets: tuple | None
    loc: object = None
    name = "atomic"

    def reads(self):
        return (self.value, self.index)

    def attrs(self):
        return {"param": self.param, "offsets": self.offsets}


@dataclass(eq=False)
class ReturnStmt(KernelStmt):
    """`return value`: the kernel's output is a new array."""
    out = None
    value: KernelValue
    loc: object = None
    name = "return"

    def reads(self):
        return (self.value,)


def walk(stmts):
    """Every statement, a loop's body after the loop."""
    for s in stmts:
        yield s
        if isinstance(s, LoopStmt):
            yield from walk(s.body)


# ---- the body ------------------------------------------------------------------------------------
class KernelBody:
    """A traced tile kernel: parameters, statements, and what it outputs (one parameter
    stored into, or a returned tile)."""

    def __init__(self, name: str, params: list):
        self.name = name
        self.params = params                     # KernelParam, in the signature's order
        self.stmts: list = []
        self.knobs: list = []                    # the knobs the body uses, in KNOBS order
        self.output = None                       # what makes the output: the StoreStmt, the first
                                                 # AtomicStmt, or the ReturnStmt
        self.out_dtype = None                    # a returned tile's stored dtype, if annotated
        self.n = 0
        self.updated: set = set()                # ids of values updated in place
        self.uses: dict = {}                     # value id -> how many statements read it

    def param(self, name) -> KernelParam:
        return next(p for p in self.params if p.name == name)

    @property
    def output_param(self) -> str | None:
        """The parameter the kernel stores or adds into; None where it returns a tile."""
        return None if self.output is None or isinstance(self.output, ReturnStmt) \
            else self.output.param

    def sizes(self, types) -> dict:
        """Each dimension name's size in these operand types (one per parameter)."""
        out = {}
        for p, t in zip(self.params, types):
            for d, n in zip(p.dims, t.shape):
                if out.setdefault(d, n) != n:
                    raise ShapeError(f"dimension {d} of tile kernel {self.name} is {out[d]} "
                                     f"and {n}")
        return out

    @property
    def inputs(self) -> list:
        """The parameters the program reads: the node's operands, in signature order."""
        return [p for p in self.params if p.read]

    def text(self) -> str:
        ps = ", ".join(f"{p.name}: Tile[{', '.join(p.dims)}, {p.dtype.short}]"
                       for p in self.params)
        lines = [f"tile kernel @{self.name}({ps}) {{"]

        def emit(stmts, depth):
            for s in stmts:
                pad = "  " * depth
                if isinstance(s, LoopStmt):
                    lines.append(f"{pad}for {s.var} in range_k({s.start}, {s.stop}, "
                                 f"{s.step}) {{")
                    emit(s.body, depth + 1)
                    lines.append(pad + "}")
                else:
                    lines.append(pad + str(s) + (f"    # {_short(s.loc)}" if s.loc else ""))
        emit(self.stmts, 1)
        return "\n".join(lines + ["}"])

    def __str__(self):
        return repr(self)

    def __repr__(self):
        # stable across processes: part of cache and tuning keys through the node's attributes
        h = hashlib.sha1(self.text().encode()).hexdigest()[:12]
        return f"<tile kernel {self.name} {h}>"

    def __hash__(self):
        return hash(repr(self))

    def __eq__(self, other):
        return isinstance(other, KernelBody) and repr(self) == repr(other)


def _short(loc) -> str:
    return f"{os.path.basename(loc.filename)}:{loc.lineno}" if loc is not None else ""
