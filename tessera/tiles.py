"""Tile programs: `@ts.kernel`, the seeds' second way to program Tessera.

A tile kernel is a Python function over `Tile["M", "K", bf16]` parameters whose body uses the
`tessera.tile` builtins (load, store, mma, reductions, elementwise math). Its body is traced once
per parameter dtypes into a `KernelBody`: a short list of tile statements over symbolic sizes
(the problem's dimensions M, K, N and the launch's knobs BM, BN, BK), checked as it is traced.
The kernel then becomes one Graph IR node, `tile_program`, which the `tile` strategy
(compiler/strategies/tiles.py) lowers to Tile IR for the CPU and the GPUs: so a tile kernel has a
Program like any function, and the explorer, `%%tessera`, the profiler and the autotuner work on
it unchanged.

What a program computes. The kernel's output (the parameter it `tile.store`s into, or the tile
it returns) is cut into blocks; one program computes one block, and the programs run in
parallel. The block is the stored tile's shape: `tile.store(C, acc)` with acc of shape
(BM, BN) makes a grid of ceil(M/BM) x ceil(N/BN) programs. Every tile axis is tied to a
dimension of a parameter by its name, so the compiler places each load: an axis over a
dimension the grid blocks is the program's block of it, an axis over a whole dimension
(`ctx.K`) is all of it, and an axis over a dimension in blocks the grid does not walk is a
stream, read a block at a time by `tile.load_partition(stream, k)` in a `tile.range_k` loop.
A parameter used as a value without `tile.load` is its block of BM rows along its first axis
and all of its other axes (a rank-1 parameter: all of it). At ragged edges loads read zeros
beyond the tensor (`other=`), reductions and `mma` run over the valid part only, and stores
write only what lies inside the output.
"""
from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field

from . import dtypes as dt
from .errors import (ArgumentError, DTypeError, RuntimeFault, ShapeError, TesseraError,
                     TracingError)
from .trace import user_location
from .types import TensorSpec

KNOBS = ("BM", "BN", "BK", "warps", "stages", "vector")
BLOCK_KNOBS = ("BM", "BN", "BK")


# ---- Tile[...] annotations -----------------------------------------------------------------------
@dataclass(frozen=True)
class TileSpec:
    dims: tuple                 # dimension names, one per axis
    dtype: object = None        # a DType, or None: the argument's

    def __repr__(self):
        parts = [repr(d) for d in self.dims] + ([self.dtype.short] if self.dtype else [])
        return f"Tile[{', '.join(parts)}]"


class _TileMeta(type):
    def __getitem__(cls, items):
        items = items if isinstance(items, tuple) else (items,)
        dims, dtype = [], None
        for it in items:
            if isinstance(it, str) and dtype is None and it.isidentifier() and \
                    it not in dt._BY_NAME:
                dims.append(it)
            elif isinstance(it, str) and it.isidentifier() and it not in dt._BY_NAME:
                raise ArgumentError(f"Tile[...]: the dtype comes last, after the dimensions "
                                    f"(got {it!r} after it)", location=user_location())
            else:
                try:
                    dtype = dt.get(it)
                except TesseraError:
                    raise ArgumentError(f"Tile[...] takes dimension names then an optional "
                                        f"dtype, not {it!r}", location=user_location(),
                                        hint='Tile["M", "K", bf16]') from None
        return TileSpec(tuple(dims), dtype)


class Tile(metaclass=_TileMeta):
    """The annotation of a tile kernel's parameter: `Tile["M", "K", bf16]` (dimension names,
    then an optional dtype)."""


# ---- symbolic sizes and indices ------------------------------------------------------------------
@dataclass(frozen=True, eq=True)
class Ix:
    """An index or size of a tile program: a constant, a knob (BM), a dimension (K), a program
    id, a loop variable, or arithmetic on those. Symbolic while the kernel is traced."""
    op: str                     # const knob dim pid nprog var + - * // %
    args: tuple = ()

    def __str__(self):
        if self.op == "const":
            return str(self.args[0])
        if self.op in ("knob", "dim", "var"):
            return str(self.args[0])
        if self.op in ("pid", "nprog"):
            return f"{'program_id' if self.op == 'pid' else 'num_programs'}({self.args[0]})"
        return f"({self.args[0]} {self.op} {self.args[1]})"

    __repr__ = __str__

    def _bin(self, op, other, swap=False):
        o = ix(other, "an index expression")
        return Ix(op, (o, self) if swap else (self, o))

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, True)
    def __floordiv__(self, o): return self._bin("//", o)
    def __mod__(self, o): return self._bin("%", o)

    def __index__(self):
        raise TracingError(f"{self} is symbolic while the kernel is traced: it has no Python "
                           f"value", location=user_location(),
                           hint="use it as a tile shape, a tile.range_k bound or an offset")

    def __bool__(self):
        raise TracingError(f"a Python if on {self}, a symbolic size", location=user_location(),
                           hint="a tile program's control flow cannot depend on sizes")

    @property
    def is_size(self) -> bool:
        return self.op in ("const", "knob", "dim")


def ix(x, what="a size") -> Ix:
    if isinstance(x, Ix):
        return x
    if isinstance(x, (bool,)) or not isinstance(x, int) and not hasattr(x, "__index__"):
        raise ArgumentError(f"{what} must be an integer or a symbolic size, not {x!r}",
                            location=user_location())
    return Ix("const", (int(x),))


def size_of(x, what) -> Ix:
    s = ix(x, what)
    if not s.is_size:
        raise ShapeError(f"{what} must be a constant, a knob (ctx.BM) or a dimension (ctx.K), "
                         f"not {s}", location=user_location(),
                         hint="tile shapes are static per launch: arithmetic on them is not "
                              "supported")
    if s.op == "const" and s.args[0] < 1:
        raise ShapeError(f"{what} must be at least 1, not {s}", location=user_location())
    return s


ONE = Ix("const", (1,))


# ---- the traced body -----------------------------------------------------------------------------
@dataclass(eq=False)
class Value:
    """A tile value: its shape (sizes), dtype, the dimension each axis runs over (None where
    unknown yet), and the statement that made it."""
    id: int
    shape: tuple
    dtype: dt.DType
    dims: list
    loc: object
    kind: str = "tile"          # tile, or stream (a load to be read by load_partition)
    param: str = ""             # a stream's (or a direct use's) parameter

    def __str__(self):
        return f"%t{self.id}"


@dataclass(eq=False)
class Stmt:
    kind: str                   # load part full elem reduce mma update loop store return
    out: Value | None
    args: tuple
    attrs: dict
    loc: object
    body: list = field(default_factory=list)     # a loop's statements

    def __str__(self):
        a = ", ".join(map(str, self.args))
        at = " ".join(f"{k}={v}" for k, v in self.attrs.items() if k != "offsets" or v)
        head = (f"{self.out}: {_type(self.out)} = " if self.out is not None else "")
        return f"{head}{self.kind}({a}){(' ' + at) if at else ''}"


def _type(v: Value) -> str:
    return f"{v.dtype.short}[{', '.join(map(str, v.shape))}]" + \
        (" stream" if v.kind == "stream" else "")


@dataclass(eq=False)
class Param:
    name: str
    dims: tuple
    dtype: dt.DType
    read: bool = False          # the body reads it (a load, a direct use)
    written: bool = False       # the body stores into it


class KernelBody:
    """A traced tile kernel: parameters, statements, and what it outputs (one parameter
    stored into, or a returned tile)."""

    def __init__(self, name: str, params: list):
        self.name = name
        self.params = params                     # Param, in the signature's order
        self.stmts: list = []
        self.knobs: list = []                    # the knobs the body uses, in KNOBS order
        self.output = None                       # ("store" | "atomic", param) or ("return", v)
        self.out_dtype = None                    # a returned tile's stored dtype, if annotated
        self.n = 0
        self.updated: set = set()                # ids of values updated in place
        self.uses: dict = {}                     # value id -> how many statements read it

    def param(self, name) -> Param:
        return next(p for p in self.params if p.name == name)

    def interpret(self, arrays, knobs=None):
        """The output computed with NumPy, program by program (the operator's reference)."""
        return interpret(self, arrays, knobs)

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
                if s.kind == "loop":
                    lines.append(f"{pad}for {s.attrs['var']} in range_k({s.args[0]}, {s.args[1]}, "
                                 f"{s.args[2]}) {{")
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


# ---- the tracer ----------------------------------------------------------------------------------
_state = threading.local()


def tracer() -> "Tracer":
    t = getattr(_state, "tracer", None)
    if t is None:
        raise TracingError("tile builtins are for the body of an @ts.kernel function",
                           location=user_location(),
                           hint="decorate the function with @tessera.kernel")
    return t


class Tracer:
    def __init__(self, body: KernelBody):
        self.body = body
        self.block = body.stmts                  # where statements go (a loop's body inside it)
        self.loops: list = []                    # open range_k loops (their Stmt)
        self.made_in: dict = {}                  # value id -> the loops open where it was made
        self.direct: dict = {}                   # parameter name -> its direct-use Value
        self.broken = None                       # where a range_k loop was left by a break

    def new(self, shape, dtype, dims, kind="tile", param="") -> Value:
        b = self.body
        v = Value(b.n, tuple(shape), dtype, list(dims), user_location(), kind, param)
        b.n += 1
        self.made_in[v.id] = tuple(id(lp) for lp in self.loops)
        return v

    def emit(self, kind, out, args, attrs=None, body=None, loc=None) -> Stmt:
        for a in args:
            if isinstance(a, Value):
                self.check_scope(a)
                self.body.uses[a.id] = self.body.uses.get(a.id, 0) + 1
        s = Stmt(kind, out, tuple(args), attrs or {}, loc or user_location(), body or [])
        self.block.append(s)
        return s

    def check_scope(self, v: Value):
        made, now = self.made_in.get(v.id, ()), tuple(id(lp) for lp in self.loops)
        if now[:len(made)] != made:
            raise TracingError(f"{v} was made inside a tile.range_k loop that has ended",
                               location=user_location(),
                               hint="carry a tile through a loop by updating it in place: "
                                    "acc = tile.zeros(...) before the loop, acc += ... inside")

    def check_index(self, e: "Ix", what: str):
        """A loop variable in e must belong to an open range_k loop."""
        open_vars = {lp.attrs["var"] for lp in self.loops}
        stack = [e]
        while stack:
            x = stack.pop()
            if x.op == "var" and x.args[0] not in open_vars:
                raise TracingError(f"{what} uses the variable of a tile.range_k loop that has "
                                   "ended", location=user_location())
            stack += [a for a in x.args if isinstance(a, Ix)]

    def use_knob(self, name):
        if name not in self.body.knobs:
            self.body.knobs.append(name)
            self.body.knobs.sort(key=KNOBS.index)


class Context:
    """`tile.context()`: the launch's knobs (BM BN BK warps stages vector) and the problem's
    dimensions (ctx.M, ctx.K, ...), symbolic while the kernel is traced."""

    def __init__(self, t: Tracer):
        self._t = t

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in KNOBS:
            self._t.use_knob(name)
            return Ix("knob", (name,))
        dims = {d for p in self._t.body.params for d in p.dims}
        if name in dims:
            return Ix("dim", (name,))
        raise ArgumentError(f"tile.context() has no {name!r}", location=user_location(),
                            expected=f"a knob ({' '.join(KNOBS)}) or a dimension of the "
                                     f"parameters ({' '.join(sorted(dims))})")


class ParamRef:
    """A parameter inside the body: a tensor in memory. Loaded with tile.load, stored into with
    tile.store; used as a value, it is its block (see the module's docstring)."""

    def __init__(self, t: Tracer, p: Param):
        self._t, self._p = t, p

    def __repr__(self):
        return f"<tile parameter {self._p.name}: Tile[{', '.join(self._p.dims)}]>"

    def _value(self) -> Value:
        t, p = self._t, self._p
        v = t.direct.get(p.name)
        if v is None:
            if len(p.dims) > 1:
                t.use_knob("BM")
            shape = [Ix("knob", ("BM",)) if i == 0 and len(p.dims) > 1 else Ix("dim", (d,))
                     for i, d in enumerate(p.dims)]
            v = load(self, shape=tuple(shape))._v
            t.direct[p.name] = v
        return v

    # a parameter in arithmetic is its block
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(wrap(self._t, self._value()), name)


def _value_method(name):
    def m(self, *a):
        return getattr(wrap(self._t, self._value()), name)(*a)
    return m


for _m in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
           "__rtruediv__", "__neg__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__",
           "__eq__", "__ne__", "__pow__", "__rpow__", "__mod__", "__floordiv__", "__abs__"):
    setattr(ParamRef, _m, _value_method(_m))


def as_value(x):
    if isinstance(x, ParamRef):
        return x._value()
    if isinstance(x, TileValue):
        return x._v
    return None


class TileValue:
    """A tile inside the body: Python operators are elementwise tile operations."""
    __slots__ = ("_v", "_t")

    def __init__(self, t: Tracer, v: Value):
        self._v, self._t = v, t

    @property
    def shape(self):
        return self._v.shape

    @property
    def dtype(self):
        return self._v.dtype

    def __repr__(self):
        return f"<tile {_type(self._v)}>"

    def __add__(self, o): return elementwise("add", self, o)
    def __radd__(self, o): return elementwise("add", o, self)
    def __sub__(self, o): return elementwise("sub", self, o)
    def __rsub__(self, o): return elementwise("sub", o, self)
    def __mul__(self, o): return elementwise("mul", self, o)
    def __rmul__(self, o): return elementwise("mul", o, self)
    def __truediv__(self, o): return elementwise("div", self, o)
    def __rtruediv__(self, o): return elementwise("div", o, self)
    def __neg__(self): return elementwise("neg", self)
    def __lt__(self, o): return elementwise("lt", self, o)
    def __le__(self, o): return elementwise("le", self, o)
    def __gt__(self, o): return elementwise("gt", self, o)
    def __ge__(self, o): return elementwise("ge", self, o)

    def __eq__(self, o): return elementwise("eq", self, o)            # noqa: E704
    def __ne__(self, o): return elementwise("ne", self, o)            # noqa: E704
    __hash__ = None
    def __pow__(self, o): return elementwise("pow", self, o)
    def __rpow__(self, o): return elementwise("pow", o, self)
    def __mod__(self, o): return elementwise("mod", self, o)
    def __floordiv__(self, o): return elementwise("floor_divide", self, o)
    def __abs__(self): return elementwise("abs", self)

    def __iadd__(self, o): return update(self, "add", o)
    def __isub__(self, o): return update(self, "sub", o)
    def __imul__(self, o): return update(self, "mul", o)

    def __bool__(self):
        raise TracingError("a Python if (or and/or/not, while) on a tile value: its elements "
                           "are not known while the kernel is traced", location=user_location(),
                           hint="choose elementwise with tile.where(cond, a, b)")

    def __iter__(self):
        raise TracingError("iterating over a tile value", location=user_location(),
                           hint="loop over blocks with tile.range_k")

    def __array__(self, *a, **k):
        raise TracingError("a tile value is not a NumPy array while the kernel is traced",
                           location=user_location(), hint="use the tile builtins (tile.exp, ...)")


def wrap(t, v: Value) -> TileValue:
    return TileValue(t, v)


# ---- the builtins' semantics (tessera.tile is their public face) ---------------------------------
def _shape(shape, what) -> tuple:
    if not isinstance(shape, (tuple, list)):
        shape = (shape,)
    return tuple(size_of(s, f"{what}'s size {i}") for i, s in enumerate(shape))


def _check_param(x, what) -> ParamRef:
    if not isinstance(x, ParamRef):
        raise ArgumentError(f"{what} takes a kernel parameter (a Tile[...] argument), not "
                            f"{x!r}", location=user_location())
    return x


def _offsets(offsets, rank, what):
    if offsets is None:
        return None
    if not isinstance(offsets, (tuple, list)):
        offsets = (offsets,)
    if not isinstance(offsets, (tuple, list)) or len(offsets) != rank:
        raise ShapeError(f"{what}: offset needs one index per axis ({rank})",
                         received=repr(offsets), location=user_location())
    out = tuple(ix(o, "an offset") for o in offsets)
    for o in out:
        tracer().check_index(o, what)
    return out


def load(x, shape=None, *, offset=None, other=0.0, prefetch=None) -> TileValue:
    t = tracer()
    p = _check_param(x, "tile.load")._p
    if shape is None:
        return wrap(t, ParamRef(t, p)._value())
    shape = _shape(shape, "tile.load")
    if len(shape) != len(p.dims):
        raise ShapeError(f"tile.load of {p.name} (rank {len(p.dims)}) with a rank-"
                         f"{len(shape)} shape", location=user_location(),
                         expected=f"one size per axis of Tile[{', '.join(p.dims)}]",
                         received=str(tuple(map(str, shape))))
    for s in shape:
        if s.op == "knob":
            t.use_knob(s.args[0])
    offsets = _offsets(offset, len(p.dims), "tile.load")
    prefetch = _buffers(prefetch, "tile.load's prefetch")
    p.read = True
    # an axis in blocks of a dimension it does not span whole may be a stream: decided once the
    # grid is known (resolve); the value is a tile until then
    v = t.new(shape, tile_dtype(p.dtype), p.dims)
    v.param = p.name
    t.emit("load", v, (), {"param": p.name, "offsets": offsets, "other": float(other),
                            "prefetch": prefetch})
    return wrap(t, v)


def load_partition(stream, k) -> TileValue:
    t = tracer()
    v = as_value(stream)
    if v is None or not any(s.kind == "load" and s.out is v for s in _all(t.body.stmts)):
        raise ArgumentError("tile.load_partition takes a tile made by tile.load",
                            location=user_location())
    k = ix(k, "tile.load_partition's index")
    t.check_index(k, "tile.load_partition")
    if not t.loops:
        raise TracingError("tile.load_partition outside a tile.range_k loop",
                           location=user_location(),
                           hint="for k in tile.range_k(0, ctx.K, ctx.BK): "
                                "a = tile.load_partition(a_stream, k)")
    v.kind = "stream"
    out = t.new(v.shape, v.dtype, v.dims)
    t.emit("part", out, (v,), {"k": k})
    return wrap(t, out)


def _all(stmts):
    for s in stmts:
        yield s
        yield from _all(s.body)


def tile_dtype(d: dt.DType) -> dt.DType:
    """Tiles hold 16-bit and 8-bit floats widened to float32 (rounded once when stored)."""
    return dt.float32 if d.is_narrow else d


def full(shape, value, dtype=None) -> TileValue:
    t = tracer()
    shape = _shape(shape, "tile.full")
    for s in shape:
        if s.op == "knob":
            t.use_knob(s.args[0])
    d = tile_dtype(dt.get(dtype if dtype is not None else
                          (dt.float32 if isinstance(value, float) else dt.int64)))
    v = t.new(shape, d, [None] * len(shape))
    t.emit("full", v, (), {"value": value})
    return wrap(t, v)


def _broadcast(shapes, dims_list, op) -> tuple:
    rank = max(len(s) for s in shapes)
    out, odims = [], []
    for i in range(rank):
        size, dim = ONE, None
        for s, d in zip(shapes, dims_list):
            k = i - (rank - len(s))
            if k < 0 or s[k] == ONE:
                continue
            if size != ONE and s[k] != size:
                raise ShapeError(f"tile.{op}: tile shapes do not broadcast at axis {i - rank}",
                                 location=user_location(),
                                 received=" and ".join("(" + ", ".join(map(str, s)) + ")"
                                                       for s in shapes),
                                 hint="equal sizes or 1 on every axis (right-aligned)")
            size = s[k]
            dim = dim or d[k]
        out.append(size)
        odims.append(dim)
    return tuple(out), odims


def elementwise(op, *args, **attrs) -> TileValue:
    from .ops import registry as R
    t = tracer()
    opdef = R.get(op)
    if not isinstance(opdef.lowering, R.Elementwise):
        raise ArgumentError(f"tile.{op} is not an elementwise primitive",
                            location=user_location())
    vals = []
    for a in args:
        v = as_value(a)
        if v is None:
            if not R.is_scalar(a):
                raise ArgumentError(f"tile.{op}: an operand must be a tile or a Python number, "
                                    f"not {a!r}", location=user_location())
            vals.append(a)
        else:
            vals.append(v)
    tiles = [v for v in vals if isinstance(v, Value)]
    if not tiles:
        raise ArgumentError(f"tile.{op} needs a tile operand", location=user_location())
    items = [v.dtype if isinstance(v, Value) else v for v in vals]
    try:
        operand, out = opdef.dtype_rule(items, {**opdef.attrs, **attrs, "_op": op})
    except TesseraError as e:
        e.location = user_location()
        raise
    shape, dims = _broadcast([v.shape for v in tiles], [v.dims for v in tiles], op)
    v = t.new(shape, tile_dtype(out), dims)
    t.emit("elem", v, vals, {"op": op, "operand": tuple(tile_dtype(d) for d in operand),
                             **attrs})
    return wrap(t, v)


def reduce(op, x, axis=-1, keepdim=False) -> TileValue:
    t = tracer()
    v = as_value(x)
    if v is None:
        raise ArgumentError(f"tile.{op} takes a tile, not {x!r}", location=user_location())
    if not isinstance(axis, int) or not -len(v.shape) <= axis < len(v.shape):
        raise ShapeError(f"tile.{op}: axis {axis!r} out of range for a rank-{len(v.shape)} tile",
                         location=user_location())
    axis %= len(v.shape)
    if op in ("max", "min") and v.dtype.is_bool:
        raise DTypeError(f"tile.{op} of a bool tile", location=user_location())
    shape = [ONE if i == axis else s for i, s in enumerate(v.shape)]
    dims = [None if i == axis else d for i, d in enumerate(v.dims)]
    if not keepdim:
        del shape[axis], dims[axis]
    d = v.dtype if op != "sum" or not v.dtype.is_bool else dt.int64
    out = t.new(shape, d, dims)
    t.emit("reduce", out, (v,), {"op": op, "axis": axis, "keepdim": bool(keepdim)})
    return wrap(t, out)


def mma(a, b) -> TileValue:
    t = tracer()
    va, vb = as_value(a), as_value(b)
    if va is None or vb is None:
        raise ArgumentError("tile.mma takes two tiles", location=user_location())
    if len(va.shape) != 2 or len(vb.shape) != 2:
        raise ShapeError("tile.mma multiplies two rank-2 tiles", location=user_location(),
                         received=f"{_type(va)} and {_type(vb)}")
    if va.shape[1] != vb.shape[0]:
        raise ShapeError("tile.mma of incompatible tiles: a's columns are not b's rows",
                         location=user_location(), received=f"{_type(va)} @ {_type(vb)}",
                         hint="mma(a: [BM, BK], b: [BK, BN]) -> [BM, BN]")
    if not (va.dtype.is_float and vb.dtype.is_float):
        raise DTypeError("tile.mma multiplies float tiles", location=user_location(),
                         received=f"{va.dtype.name} and {vb.dtype.name}")
    d = dt.float64 if dt.float64 in (va.dtype, vb.dtype) else dt.float32
    out = t.new((va.shape[0], vb.shape[1]), d, [va.dims[0], vb.dims[1]])
    t.emit("mma", out, (va, vb))
    return wrap(t, out)


def update(target: TileValue, op, value):
    """target op= value, in place: how a tile is carried through a range_k loop."""
    t = tracer()
    v = as_value(value)
    tv = target._v
    from .ops.registry import is_scalar
    if v is None and not is_scalar(value):
        raise ArgumentError(f"an in-place update takes a tile or a number, not {value!r}",
                            location=user_location())
    shape = v.shape if v is not None else tv.shape
    bshape, _ = _broadcast([tv.shape, shape], [tv.dims, v.dims if v else [None] * len(shape)],
                           op)
    if bshape != tv.shape:
        raise ShapeError("an in-place update would change the tile's shape",
                         location=user_location(),
                         received=f"{_type(tv)} {op}= {_type(v) if v else value}")
    if v is not None:
        vd = [None] * (len(tv.dims) - len(v.dims)) + list(v.dims)
        tv.dims = [a or b for a, b in zip(tv.dims, vd)]
    t.body.updated.add(tv.id)
    t.emit("update", None, (tv, v if v is not None else value), {"op": op})
    return target


def store(x, value, *, offset=None):
    t = tracer()
    p = _check_param(x, "tile.store")._p
    v = as_value(value)
    if v is None:
        raise ArgumentError(f"tile.store into {p.name} takes a tile", location=user_location())
    if len(v.shape) != len(p.dims):
        raise ShapeError(f"tile.store of a rank-{len(v.shape)} tile into {p.name} "
                         f"(rank {len(p.dims)})", location=user_location(),
                         received=_type(v), expected=f"Tile[{', '.join(p.dims)}]")
    if t.loops:
        raise TracingError("tile.store inside a tile.range_k loop", location=user_location(),
                           hint="accumulate in the loop, store once after it")
    if t.body.output is not None:
        raise TracingError("a tile kernel has one output: a second tile.store, or a store "
                           "beside a return or an atomic_add", location=user_location())
    p.written = True
    t.body.output = ("store", p.name)
    t.emit("store", None, (v,), {"param": p.name,
                                 "offsets": _offsets(offset, len(p.dims), "tile.store")})


ATOMIC_DTYPES = (dt.int32, dt.int64)     # the widths GPUs add atomically


def atomic_add(x, value, *, offset=None, index=None):
    """x[block] += value (a tile of x's rank, placed as tile.store places it), or with
    `index=`: x[index[e]] += value[e] for every valid element e of an integer tile (x of rank
    1; value a tile of index's shape or a number). Every program adds into x, which starts
    from the caller's values. Integers only: their sums do not depend on the order the
    programs arrive in."""
    t = tracer()
    p = _check_param(x, "tile.atomic_add")._p
    v, iv = as_value(value), None
    vd = v.dtype if v is not None else dt.get(type(value)) if _is_number(value) else None
    if vd is None:
        raise ArgumentError(f"tile.atomic_add into {p.name} takes a tile or a number, not "
                            f"{value!r}", location=user_location())
    if p.dtype.is_float or vd.is_float:
        raise DTypeError("tile.atomic_add of floats: the sum would depend on the order the "
                         "programs arrive in, and Tessera's results never do",
                         location=user_location(),
                         hint="reduce within a program (tile.sum), or store partial results "
                              "and sum them in a second kernel")
    if p.dtype not in ATOMIC_DTYPES:
        raise DTypeError(f"tile.atomic_add into {p.name} ({p.dtype.name}): atomics add int32 "
                         f"or int64", location=user_location(),
                         hint="count into an int32 or int64 array")
    if index is not None:
        iv = as_value(index)
        if iv is None or iv.dtype.is_float or iv.dtype.is_bool:
            raise ArgumentError("tile.atomic_add's index is a tile of integers",
                                location=user_location(), received=repr(index))
        if len(p.dims) != 1:
            raise ShapeError(f"tile.atomic_add with index= adds into a rank-1 parameter; "
                             f"{p.name} has rank {len(p.dims)}", location=user_location())
        if offset is not None:
            raise ArgumentError("tile.atomic_add takes offset= or index=, not both",
                                location=user_location())
        if v is not None and v.shape != iv.shape:
            raise ShapeError("tile.atomic_add: the values' tile and the index tile differ in "
                             "shape", location=user_location(),
                             received=f"{_type(v)} at {_type(iv)}")
    elif v is None:
        raise ArgumentError(f"tile.atomic_add of a number into {p.name} needs index= (the "
                            f"elements to add it to)", location=user_location(),
                            hint="or add a tile: tile.full(shape, value, dtype)")
    elif len(v.shape) != len(p.dims):
        raise ShapeError(f"tile.atomic_add of a rank-{len(v.shape)} tile into {p.name} "
                         f"(rank {len(p.dims)})", location=user_location(), received=_type(v),
                         expected=f"Tile[{', '.join(p.dims)}]")
    if t.body.output is not None and t.body.output != ("atomic", p.name):
        raise TracingError("a tile kernel has one output: tile.atomic_add into "
                           f"{p.name} beside another store, return or atomic_add",
                           location=user_location())
    p.read = p.written = True          # the adds start from the caller's values
    t.body.output = ("atomic", p.name)
    t.emit("atomic", None, (v if v is not None else value, iv),
           {"param": p.name, "offsets": _offsets(offset, len(p.dims), "tile.atomic_add")})


def _is_number(x) -> bool:
    from .ops.registry import is_scalar
    return is_scalar(x) and not isinstance(x, bool)


def _buffers(n, what):
    """A number of buffers (range_k's stages, load's prefetch): None, a positive int or a knob
    (ctx.stages); True is double buffering, False none."""
    if isinstance(n, bool):
        return 2 if n else 1
    if n is None or isinstance(n, Ix) and n.op == "knob" or isinstance(n, int) and n >= 1:
        return n
    raise ArgumentError(f"{what} is a number of buffers (1, 2, 3 ...) or ctx.stages, not "
                        f"{n!r}", location=user_location())


class RangeK:
    """`for k in tile.range_k(start, stop, step)`: a loop over blocks of a dimension (the body
    is traced once, with k symbolic)."""

    def __init__(self, start, stop, step, stages):
        self.start, self.stop, self.step = ix(start), ix(stop), size_of(step, "range_k's step")
        self.stages = _buffers(stages, "tile.range_k's stages")

    def __iter__(self):
        t = tracer()
        for e in (self.step, self.stages):
            if isinstance(e, Ix) and e.op == "knob":
                t.use_knob(e.args[0])
        var = f"k{len(t.loops)}"
        s = Stmt("loop", None, (self.start, self.stop, self.step),
                 {"var": var, "stages": self.stages}, user_location())
        t.block.append(s)
        outer = t.block
        t.loops.append(s)
        t.block = s.body
        try:
            yield Ix("var", (var,))
        except GeneratorExit:       # the body left the loop (a break): noted, refused below
            t.broken = s.loc
            raise
        finally:
            t.loops.pop()
            t.block = outer


def _axis(axis, what) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int) or axis < 0:
        raise ArgumentError(f"{what} takes an axis of the grid (0, 1, ...), not {axis!r}",
                            location=user_location())
    return axis


def program_id(axis) -> Ix:
    tracer()
    return Ix("pid", (_axis(axis, "tile.program_id"),))


def num_programs(axis) -> Ix:
    tracer()
    return Ix("nprog", (_axis(axis, "tile.num_programs"),))


# ---- after tracing: the grid and each load's placement -------------------------------------------
def resolve(body: KernelBody):
    """Tie the output's axes to the grid and check every load against it. Sets
    body.grid: [(dim, block size Ix or None for whole)] per output axis; each load statement's
    attrs["place"]: per axis "grid", "whole", "stream" or "offset"."""
    kind, what = body.output or (None, None)
    if kind is None:
        raise TracingError(f"tile kernel {body.name} neither stores into a parameter nor "
                           "returns a tile", hint="end it with tile.store(C, acc) or "
                                                  "return a tile")
    if kind == "atomic":
        body.grid = _load_grid(body)
        _place_loads(body)
        _place_atomics(body)
        return
    if kind == "store":
        st = next(s for s in body.stmts if s.kind == "store")
        v, dims, offsets = st.args[0], body.param(what).dims, st.attrs["offsets"]
    else:
        v = what
        dims = [d for d in v.dims]
        offsets = None
        if any(d is None for d in dims):
            raise ShapeError(f"tile kernel {body.name} returns a tile whose axes are not all "
                             f"tied to a parameter's dimension", received=_type(v),
                             hint="return a tile computed from loads (a reduction keeps its "
                                  "axis only with keepdim=True)")
    grid = []
    for i, (d, s) in enumerate(zip(dims, v.shape)):
        if offsets is not None:
            grid.append((d, s if not (s.op == "dim") else None))
        elif s.op == "dim":
            if s.args[0] != d:
                raise ShapeError(f"the output's axis {i} runs over {d} but the stored tile's "
                                 f"size there is all of {s.args[0]}", received=_type(v))
            grid.append((d, None))
        elif s.op == "const" and s.args[0] == 1 and v.dims[i] is None:
            raise ShapeError(f"the output's axis {i} ({d}): the stored tile has size 1 there, "
                             "a reduced axis", received=_type(v),
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
    for st in _all(body.stmts):
        if st.kind != "load" or st.attrs["offsets"] is not None or st.out.kind == "stream":
            continue
        for d, s in zip(body.param(st.attrs["param"]).dims, st.out.shape):
            if not (s.op == "dim" and s.args[0] == d):
                grid.setdefault(d, s)
    return list(grid.items())


def _place_atomics(body):
    """A block atomic_add is placed as a store is: along an axis the grid walks, at the
    program's block (the tile must be that block); along any other, at 0 (or offset=)."""
    gridded = {d: s for d, s in body.grid}
    for st in _all(body.stmts):
        if st.kind != "atomic" or st.args[1] is not None or st.attrs["offsets"] is not None:
            continue
        p, v = body.param(st.attrs["param"]), st.args[0]
        for i, (d, s) in enumerate(zip(p.dims, v.shape)):
            if d in gridded and gridded[d] != s:
                raise ShapeError(f"tile.atomic_add into {p.name}: the grid walks {d} in blocks "
                                 f"of {gridded[d]}, the tile's axis {i} is {s}",
                                 location=st.loc, received=_type(v),
                                 hint=f"add a tile of the program's block of {d}, or place it "
                                      f"with offset=")


def _place_loads(body):
    """Each load's placement against the grid (attrs["place"])."""
    gridded = {d: s for d, s in body.grid if s is not None}
    for st in _all(body.stmts):
        if st.kind != "load":
            continue
        p = body.param(st.attrs["param"])
        out = st.out
        if st.attrs["offsets"] is not None:
            st.attrs["place"] = ("offset",) * len(p.dims)
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
                                 location=st.loc, received=_type(out),
                                 hint=f"load {d} in blocks of {gridded[d]} (or whole: "
                                      f"ctx.{d})")
            else:
                place.append("stream")
        if out.kind == "stream" and "stream" not in place:
            raise ShapeError(f"tile.load_partition of a tile.load of {p.name} that has no "
                             f"axis in blocks the grid does not walk: nothing to partition",
                             location=st.loc, received=_type(out),
                             hint="load_partition takes a load with one axis in blocks of a "
                                  "dimension the output does not have (ctx.BK of K)")
        if "stream" in place and out.kind != "stream":
            axis = place.index("stream")
            raise ShapeError(f"tile.load of {p.name}: its axis {axis} takes blocks of "
                             f"{out.shape[axis]} of {p.dims[axis]}, which the grid does not "
                             f"walk", location=st.loc, received=_type(out),
                             hint=f"read it a block at a time with tile.load_partition(tile, "
                                  f"k) in a tile.range_k loop, or load all of it (ctx."
                                  f"{p.dims[axis]})")
        if place.count("stream") > 1:
            raise ShapeError(f"tile.load of {p.name} streams two axes", location=st.loc,
                             received=_type(out))
        st.attrs["place"] = tuple(place)
    for st in _all(body.stmts):
        for a in st.args:
            if isinstance(a, Value) and a.kind == "stream" and st.kind != "part":
                raise ShapeError(f"{a}, a tile.load streamed by tile.load_partition, is used "
                                 f"whole", location=st.loc,
                                 hint="use the partitions tile.load_partition gives")


# ---- the kernel a user calls ---------------------------------------------------------------------
class KernelFunction:
    """`@ts.kernel def f(A: Tile[...], ...)`: call it with arrays to run it; `lower(...)` gives
    its Program. A parameter the body stores into is the output: the kernel computes it into a
    new array and copies that into the caller's array, which the call returns (a kernel that
    returns a tile returns a new array)."""

    def __init__(self, fn, target="cpu", schedule=None):
        import functools
        import inspect
        functools.update_wrapper(self, fn)
        self.fn, self.name, self.target, self.schedule = fn, fn.__name__, target, schedule
        try:
            sig = inspect.signature(fn, eval_str=True)
        except Exception as e:                       # noqa: BLE001 (an annotation that fails)
            raise ArgumentError(f"cannot read the signature of {fn.__name__}: {e}") from None
        self.specs = []
        for p in sig.parameters.values():
            if not isinstance(p.annotation, TileSpec):
                raise ArgumentError(f"tile kernel {self.name}: parameter {p.name!r} needs a "
                                    f"Tile[...] annotation", hint='A: Tile["M", "K", f32]')
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise ArgumentError(f"tile kernel {self.name}: *args, **kwargs and "
                                    f"keyword-only parameters are not supported ({p.name})")
            self.specs.append((p.name, p.annotation))
        ret = sig.return_annotation
        if ret is not sig.empty and not isinstance(ret, TileSpec):
            raise ArgumentError(f"tile kernel {self.name}: the return annotation must be a "
                                f"Tile[...], not {ret!r}")
        self.returns = ret if isinstance(ret, TileSpec) else None
        self.tuning = None              # @ts.kernel.autotune: wraps each function
        self.bodies: dict = {}          # parameter dtypes -> KernelBody
        self.functions: dict = {}       # (parameter dtypes, target) -> Function

    def __repr__(self):
        ps = ", ".join(f"{n}: {s!r}" for n, s in self.specs)
        return f"<tessera tile kernel {self.name}({ps})>"

    # -- tracing -----------------------------------------------------------------------------------
    def body(self, dtypes) -> KernelBody:
        dtypes = tuple(dtypes)
        b = self.bodies.get(dtypes)
        if b is None:
            b = self.bodies[dtypes] = self._trace(dtypes)
        return b

    def _trace(self, dtypes) -> KernelBody:
        params = [Param(n, s.dims, d) for (n, s), d in zip(self.specs, dtypes)]
        body = KernelBody(self.name, params)
        t = Tracer(body)
        before = getattr(_state, "tracer", None)
        _state.tracer = t
        try:
            ret = self.fn(*[ParamRef(t, p) for p in params])
            if t.broken is not None:
                raise TracingError("a break (or return) out of a tile.range_k loop: the loop is "
                                   "traced once and runs for every k, so it would be ignored",
                                   location=t.broken,
                                   hint="narrow the loop's range instead (range_k's stop)")
            if ret is not None:
                v = as_value(ret)
                if v is None:
                    raise TracingError(f"tile kernel {self.name} returns {ret!r}, not a tile")
                if body.output is not None:
                    raise TracingError("a tile kernel has one output: it stores into a "
                                       "parameter and returns a tile")
                self._check_return(v, body)
                body.output = ("return", v)
                t.emit("return", None, (v,), loc=v.loc)    # (the caller's frame varies)
        finally:
            _state.tracer = before
        resolve(body)
        return body

    def _check_return(self, v: Value, body: KernelBody):
        """The returned tile against the return annotation: the same dimensions in order; its
        dtype, if named, is what the result is stored as (rounded once)."""
        spec = self.returns
        if spec is None:
            return
        if tuple(v.dims) != tuple(spec.dims):
            raise ShapeError(f"tile kernel {self.name} returns a tile over "
                             f"[{', '.join(str(d) for d in v.dims)}], its annotation says "
                             f"{spec!r}", location=v.loc, received=_type(v))
        if spec.dtype is not None:
            body.out_dtype = spec.dtype

    # -- calls -------------------------------------------------------------------------------------
    def _output_arg(self, body, args):
        return args[[n for n, _ in self.specs].index(body.output[1])]

    def _check(self, args):
        """The body for these arguments' dtypes, after checking them; an error names the
        caller's line (found only then: calls pay nothing for it)."""
        import numpy as np
        if len(args) != len(self.specs):
            raise ArgumentError(f"tile kernel {self.name} takes {len(self.specs)} arrays, got "
                                f"{len(args)}", location=user_location())
        sizes, dtypes = {}, []
        for (name, spec), a in zip(self.specs, args):
            if not hasattr(a, "shape") or not hasattr(a, "dtype"):
                raise ArgumentError(f"argument {name!r} of {self.name} must be an array, not "
                                    f"{type(a).__name__}", location=user_location())
            d = dt.get(a.dtype)
            if spec.dtype is not None and d != spec.dtype:
                raise DTypeError(f"argument {name!r} of {self.name} is {d.name}, its annotation "
                                 f"{spec!r} says {spec.dtype.name}", location=user_location(),
                                 hint=f"convert it: {name}.astype(...)")
            if len(a.shape) != len(spec.dims):
                raise ShapeError(f"argument {name!r} of {self.name} has rank {len(a.shape)}, "
                                 f"its annotation {spec!r} rank {len(spec.dims)}",
                                 location=user_location())
            for dname, n in zip(spec.dims, a.shape):
                if sizes.setdefault(dname, n) != n:
                    raise ShapeError(f"dimension {dname} is {sizes[dname]} in one argument "
                                     f"and {n} in {name!r} of {self.name}",
                                     location=user_location())
            dtypes.append(d)
        body = self.body(dtypes)
        if body.output[0] != "return":
            out = self._output_arg(body, args)
            if isinstance(out, np.ndarray) and not out.flags.writeable:
                raise ArgumentError(f"output {body.output[1]!r} of {self.name} is read-only",
                                    location=user_location())
            for p, a in zip(body.params, args):
                if p.read and p.name != body.output[1] and a is not out and _overlap(a, out):
                    raise ArgumentError(f"output {body.output[1]!r} of {self.name} overlaps "
                                        f"input {p.name!r}", location=user_location(),
                                        hint="pass a separate output array")
        return body

    def function(self, body: KernelBody, target=None):
        """The tessera function running this body: one tile_program node over every
        parameter (an output parameter is an operand for its shape only, unless read)."""
        import inspect
        from .function import Function
        from .trace import apply
        target = target or self.target
        key = (tuple(p.dtype for p in body.params), target)
        f = self.functions.get(key)
        if f is None:
            names = [p.name for p in body.params]

            def run(*xs, **named):
                xs = list(xs) + [named[n] for n in names[len(xs):]]
                return apply("tile_program", xs, kernel=body)
            # Tensor annotations from the Tile ones: the function's symbols are the kernel's
            # dimensions (the explorer lowers it from sizes alone)
            run.__signature__ = inspect.Signature(
                [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                   annotation=TensorSpec(p.dims, p.dtype))
                 for p in body.params])
            run.__name__ = run.__qualname__ = self.name
            f = Function(run, name=self.name, target=target, schedule=self.schedule)
            if self.tuning is not None:
                f = self.tuning(f)
            self.functions[key] = f
        return f

    def __call__(self, *args, target=None):
        body = self._check(args)
        result = self.function(body, target)(*args)
        if body.output[0] != "return":
            out = self._output_arg(body, args)
            if hasattr(result, "get") and not hasattr(out, "get"):    # a GPU's result, a
                result = result.get()                                   # NumPy output
            out[...] = result
            return out
        return result

    def checked_body(self, args) -> KernelBody:
        """The body for these arguments, after the call's checks (dtypes, ranks, sizes)."""
        return self._check(args)

    @property
    def results(self) -> dict:
        """@ts.kernel.autotune: the searches' results (argument types -> TuneResult) of every
        dtype and target this kernel ran at."""
        out = {}
        for f in self.functions.values():
            out.update(getattr(f, "results", {}))
        return out

    def as_function(self, target=None):
        """The tessera function of this kernel at its annotated dtypes (float32 where a Tile
        annotation names none): what `%%tessera` explores."""
        return self.function(self.body([s.dtype or dt.float32 for _, s in self.specs]), target)

    def lower(self, *args, target=None):
        """The Program for these arguments (Graph, Schedule and Tile IR, target source)."""
        body = self._check(args)
        return self.function(body, target).lower(*args)

    def ir(self, *args) -> str:
        """The traced tile statements for these arguments' dtypes."""
        return self._check(args).text()


def _overlap(a, b) -> bool:
    """Do arrays a and b share memory (NumPy's check; device arrays by their byte ranges)?"""
    import numpy as np
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.shares_memory(a, b)
    ia, ib = (getattr(x, "__cuda_array_interface__", None) for x in (a, b))
    if ia is None or ib is None:
        return False                    # one on the host, one on a device
    lo_a, lo_b = ia["data"][0], ib["data"][0]
    return lo_a < lo_b + b.nbytes and lo_b < lo_a + a.nbytes


def is_tile_kernel(fn) -> bool:
    """Is fn a Python function whose parameters are all Tile[...]-annotated?"""
    import inspect
    try:
        ps = inspect.signature(fn, eval_str=True).parameters.values()
    except Exception:                               # noqa: BLE001 (not ours to judge)
        return False
    return bool(ps) and all(isinstance(p.annotation, TileSpec) for p in ps)


def kernel(fn=None, *, target="cpu", schedule=None):
    """`@ts.kernel`: a tile kernel (see this module's docstring)."""
    if fn is None:
        return lambda f: KernelFunction(f, target=target, schedule=schedule)
    return KernelFunction(fn, target=target, schedule=schedule)


# ---- the reference: the body run program by program on NumPy arrays ------------------------------
def interpret(body: KernelBody, arrays, knobs=None):
    """The kernel's output computed with NumPy, one program at a time (the operator's
    reference: eager calls, ts.interpret, the debugger). mma and sums run in float64."""
    import numpy as np

    from .ops import registry as R
    knobs = {"BM": 64, "BN": 64, "BK": 64, **(knobs or {})}
    arrays = [np.asarray(a) for a in arrays]
    dims = {}
    for p, a in zip(body.params, arrays):
        dims.update(zip(p.dims, a.shape))

    def size(s):
        return s.args[0] if s.op == "const" else knobs.get(s.args[0], 1) if s.op == "knob" \
            else dims[s.args[0]]

    grid = [1 if b is None else -(-dims[d] // size(b)) for d, b in body.grid]
    named = dict(zip([p.name for p in body.params], arrays))
    kind, what = body.output
    if kind in ("store", "atomic"):
        dst = np.array(named[what])         # what no program stores keeps the caller's values
        out_dims = body.param(what).dims
    else:
        dst = np.zeros([dims[d] for d in what.dims], (body.out_dtype or what.dtype).np)
        out_dims = what.dims

    for pid in np.ndindex(*grid):
        at = {d: pid[i] * size(b) for i, (d, b) in enumerate(body.grid) if b is not None}
        env, valid, vars_, streams = {}, {}, {}, {}

        def ix(e):
            if e.op in ("const", "knob", "dim"):
                return size(e)
            if e.op == "var":
                return vars_[e.args[0]]
            if e.op == "pid":
                return pid[e.args[0]] if e.args[0] < len(pid) else 0
            if e.op == "nprog":
                return grid[e.args[0]] if e.args[0] < len(grid) else 1
            a, b = ix(e.args[0]), ix(e.args[1])
            return {"+": a + b, "-": a - b, "*": a * b, "//": a // b, "%": a % b}[e.op]

        def fill(st, k=None):
            v, p = st.out, body.param(st.attrs["param"])
            src = named[p.name]
            shape = [size(s) for s in v.shape]
            t = np.full(shape, st.attrs["other"], v.dtype.np)
            offs = []
            for i, place in enumerate(st.attrs["place"]):
                offs.append(0 if place == "whole" else at[p.dims[i]] if place == "grid" else
                            k if place == "stream" else ix(st.attrs["offsets"][i]))
            lo = [max(0, -o) for o in offs]
            hi = [max(0, min(n, E - o)) for n, E, o in zip(shape, src.shape, offs)]
            if all(a < b for a, b in zip(lo, hi)):
                t[tuple(slice(a, b) for a, b in zip(lo, hi))] = \
                    src[tuple(slice(o + a, o + b) for o, a, b in zip(offs, lo, hi))]
            # an explicit offset's tile is valid whole (what lies outside is `other`)
            env[v.id] = t
            valid[v.id] = [n if place == "offset" else h
                           for n, h, place in zip(shape, hi, st.attrs["place"])]

        def val(a, d=None):
            if isinstance(a, Value):
                x = env[a.id]
                return x if d is None else x.astype(d.np)
            return np.asarray(a, d.np)

        def run(stmts):
            for st in stmts:
                v = st.out
                if st.kind == "load":
                    if "stream" in st.attrs["place"]:
                        streams[v.id] = st
                    else:
                        fill(st)
                elif st.kind == "part":
                    fill(_replace_out(streams[st.args[0].id], v), ix(st.attrs["k"]))
                elif st.kind == "full":
                    env[v.id] = np.full([size(s) for s in v.shape], st.attrs["value"],
                                        v.dtype.np)
                elif st.kind == "elem":
                    attrs = {k: x for k, x in st.attrs.items() if k not in ("op", "operand")}
                    args = [val(a, d) for a, d in zip(st.args, st.attrs["operand"])]
                    r = R.run_reference(R.get(st.attrs["op"]), args, {**R.get(
                        st.attrs["op"]).attrs, **attrs})
                    env[v.id] = np.asarray(r).astype(v.dtype.np)
                    valid[v.id] = _elem_valid(st, valid, size)
                elif st.kind == "reduce":
                    x, ax = env[st.args[0].id], st.attrs["axis"]
                    n = valid.get(st.args[0].id, x.shape)[ax]
                    part = np.take(x, range(n), axis=ax)
                    fn = {"max": np.max, "min": np.min, "sum": np.sum}[st.attrs["op"]]
                    if n == 0:
                        r = np.full(part.shape[:ax] + part.shape[ax + 1:],
                                    {"max": -np.inf, "min": np.inf, "sum": 0}[st.attrs["op"]])
                    else:
                        r = fn(part.astype(np.float64) if st.attrs["op"] == "sum" and
                               v.dtype.is_float else part, axis=ax)
                    if st.attrs["keepdim"]:
                        r = np.expand_dims(r, ax)
                    env[v.id] = np.asarray(r).astype(v.dtype.np)
                    kept = [m for i, m in enumerate(valid.get(st.args[0].id, x.shape))
                            if i != ax]
                    if st.attrs["keepdim"]:
                        kept.insert(ax, 1)
                    valid[v.id] = kept
                elif st.kind == "mma":
                    a, b = st.args
                    va, vb = valid.get(a.id, env[a.id].shape), valid.get(b.id, env[b.id].shape)
                    kv = min(va[1], vb[0])
                    env[v.id] = (env[a.id][:, :kv].astype(np.float64) @
                                 env[b.id][:kv].astype(np.float64)).astype(v.dtype.np)
                    valid[v.id] = [va[0], vb[1]]
                elif st.kind == "update":
                    tv, x = st.args
                    r = R.run_reference(R.get(st.attrs["op"]),
                                        [env[tv.id], val(x, tv.dtype)], {})
                    env[tv.id] = np.asarray(r).astype(tv.dtype.np)
                elif st.kind == "loop":
                    start, stop, step = (ix(a) for a in st.args)
                    for kk in range(start, stop, step):
                        vars_[st.attrs["var"]] = kk
                        run(st.body)
                elif st.kind == "atomic" and st.args[1] is not None:
                    add_at(st)
                elif st.kind in ("store", "return", "atomic"):
                    x = env[st.args[0].id]
                    offs = [ix(o) for o in st.attrs["offsets"]] if st.attrs.get("offsets") \
                        else [at.get(d, 0) for d in out_dims]
                    lo = [max(0, -o) for o in offs]
                    hi = [max(0, min(s, E - o)) for s, E, o in zip(x.shape, dst.shape, offs)]
                    if all(a < b for a, b in zip(lo, hi)):
                        into = tuple(slice(o + a, o + b) for o, a, b in zip(offs, lo, hi))
                        part = x[tuple(slice(a, b) for a, b in zip(lo, hi))].astype(dst.dtype)
                        if st.kind == "atomic":
                            dst[into] += part
                        else:
                            dst[into] = part

        def add_at(st):
            """x[index[e]] += value[e] over the index tile's valid elements."""
            value, index = st.args
            idx = env[index.id]
            n = valid.get(index.id, idx.shape)
            keep = tuple(slice(0, m) for m in n)
            idx = idx[keep].astype(np.int64).ravel()
            vals = np.broadcast_to(val(value, dst.dtype), env[index.id].shape)[keep].ravel() \
                if isinstance(value, Value) else np.full(idx.shape, value, dst.dtype)
            bad = (idx < -len(dst)) | (idx >= len(dst))
            if bad.any():
                raise RuntimeFault(f"tile.atomic_add into {what}: index {idx[bad][0]} is out "
                                   f"of range for {len(dst)} elements", location=st.loc,
                                   hint="indices must lie in [-n, n) for an axis of size n")
            np.add.at(dst, idx, vals.astype(dst.dtype))
        run(body.stmts)
    return dst


def _replace_out(st, v):
    return Stmt(st.kind, v, st.args, st.attrs, st.loc)


def _elem_valid(st, valid, size):
    rank = len(st.out.shape)
    out = [size(s) for s in st.out.shape]
    for a in st.args:
        if isinstance(a, Value) and a.id in valid:
            for j, n in enumerate(valid[a.id]):
                i = rank - len(a.shape) + j
                if size(a.shape[j]) != 1:
                    out[i] = min(out[i], n)
    return out
