"""What the `tessera.tile` builtins do (builtins.py is their public face): each checks its
operands where the user wrote the call and appends its statement (ir.py) to the body being
traced. Also the values a body holds: `ParamRef` (a parameter, a tensor in memory) and
`TileValue` (a tile, whose Python operators are elementwise builtins)."""
from __future__ import annotations

from .. import dtypes as dt
from ..errors import ArgumentError, DTypeError, ShapeError, TesseraError, TracingError
from ..ops import registry as R
from ..ops.registry import install_operators
from ..trace import user_location
from .index import ONE, Ix, ix, size_of
from .ir import AtomicStmt, ElemStmt, FullStmt, KernelParam, KernelValue, LoadStmt, LoopStmt, \
    MmaStmt, PartStmt, ReduceStmt, StoreStmt, UpdateStmt, type_text, walk
from .tracer import Tracer, tracer


class ParamRef:
    """A parameter inside the body: a tensor in memory. Loaded with tile.load, stored into with
    tile.store; used as a value, it is its block (see the package's docstring)."""

    def __init__(self, t: Tracer, p: KernelParam):
        self._t, self._p = t, p

    def __repr__(self):
        return f"<tile parameter {self._p.name}: Tile[{', '.join(self._p.dims)}]>"

    def _value(self) -> KernelValue:
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

    def __init__(self, t: Tracer, v: KernelValue):
        self._v, self._t = v, t

    @property
    def shape(self):
        return self._v.shape

    @property
    def dtype(self):
        return self._v.dtype

    def __repr__(self):
        return f"<tile {type_text(self._v)}>"

    # (Python's operators are elementwise tile operations: installed from ops.registry's table
    # below elementwise)
    __hash__ = None

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


def wrap(t, v: KernelValue) -> TileValue:
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
    t.emit(LoadStmt(out=v, param=p.name, offsets=offsets, other=float(other), prefetch=prefetch))
    return wrap(t, v)


def load_partition(stream, k) -> TileValue:
    t = tracer()
    v = as_value(stream)
    if v is None or not any(isinstance(s, LoadStmt) and s.out is v for s in walk(t.body.stmts)):
        raise ArgumentError("tile.load_partition takes a tile made by tile.load",
                            location=user_location())
    k = ix(k, "tile.load_partition's index")
    t.check_index(k, "tile.load_partition")
    if not t.loops:
        raise TracingError("tile.load_partition outside a tile.range_k loop",
                           location=user_location(),
                           hint="for k in tile.range_k(0, ctx.K, ctx.BK): "
                                "a = tile.load_partition(a_stream, k)")
    v.stream = True
    out = t.new(v.shape, v.dtype, v.dims)
    t.emit(PartStmt(out=out, stream=v, k=k))
    return wrap(t, out)


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
    t.emit(FullStmt(out=v, value=value))
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
    tiles = [v for v in vals if isinstance(v, KernelValue)]
    if not tiles:
        raise ArgumentError(f"tile.{op} needs a tile operand", location=user_location())
    items = [v.dtype if isinstance(v, KernelValue) else v for v in vals]
    try:
        operand, out = opdef.dtype_rule(items, {**opdef.attrs, **attrs, "_op": op})
    except TesseraError as e:
        e.location = user_location()
        raise
    shape, dims = _broadcast([v.shape for v in tiles], [v.dims for v in tiles], op)
    v = t.new(shape, tile_dtype(out), dims)
    t.emit(ElemStmt(out=v, args=tuple(vals), op=op,
                operand=tuple(tile_dtype(d) for d in operand), extra=dict(attrs)))
    return wrap(t, v)


install_operators(TileValue, elementwise,
                  ["add", "sub", "mul", "div", "pow", "neg", "abs", "lt", "le", "gt", "ge", "eq", "ne"])
install_operators(TileValue, elementwise, ["mod", "floor_divide"], reflected=False)


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
    t.emit(ReduceStmt(out=out, x=v, op=op, axis=axis, keepdim=bool(keepdim)))
    return wrap(t, out)


def mma(a, b) -> TileValue:
    t = tracer()
    va, vb = as_value(a), as_value(b)
    if va is None or vb is None:
        raise ArgumentError("tile.mma takes two tiles", location=user_location())
    if len(va.shape) != 2 or len(vb.shape) != 2:
        raise ShapeError("tile.mma multiplies two rank-2 tiles", location=user_location(),
                         received=f"{type_text(va)} and {type_text(vb)}")
    if va.shape[1] != vb.shape[0]:
        raise ShapeError("tile.mma of incompatible tiles: a's columns are not b's rows",
                         location=user_location(), received=f"{type_text(va)} @ {type_text(vb)}",
                         hint="mma(a: [BM, BK], b: [BK, BN]) -> [BM, BN]")
    if not (va.dtype.is_float and vb.dtype.is_float):
        raise DTypeError("tile.mma multiplies float tiles", location=user_location(),
                         received=f"{va.dtype.name} and {vb.dtype.name}")
    d = dt.float64 if dt.float64 in (va.dtype, vb.dtype) else dt.float32
    out = t.new((va.shape[0], vb.shape[1]), d, [va.dims[0], vb.dims[1]])
    t.emit(MmaStmt(out=out, a=va, b=vb))
    return wrap(t, out)


def update(target: TileValue, op, value):
    """target op= value, in place: how a tile is carried through a range_k loop."""
    t = tracer()
    v = as_value(value)
    tv = target._v
    if v is None and not R.is_scalar(value):
        raise ArgumentError(f"an in-place update takes a tile or a number, not {value!r}",
                            location=user_location())
    shape = v.shape if v is not None else tv.shape
    bshape, _ = _broadcast([tv.shape, shape], [tv.dims, v.dims if v else [None] * len(shape)],
                           op)
    if bshape != tv.shape:
        raise ShapeError("an in-place update would change the tile's shape",
                         location=user_location(),
                         received=f"{type_text(tv)} {op}= {type_text(v) if v else value}")
    if v is not None:
        vd = [None] * (len(tv.dims) - len(v.dims)) + list(v.dims)
        tv.dims = [a or b for a, b in zip(tv.dims, vd)]
    t.body.updated.add(tv.id)
    t.emit(UpdateStmt(target=tv, value=v if v is not None else value, op=op))
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
                         received=type_text(v), expected=f"Tile[{', '.join(p.dims)}]")
    if t.loops:
        raise TracingError("tile.store inside a tile.range_k loop", location=user_location(),
                           hint="accumulate in the loop, store once after it")
    if t.body.output is not None:
        raise TracingError("a tile kernel has one output: a second tile.store, or a store "
                           "beside a return or an atomic_add", location=user_location())
    p.written = True
    t.body.output = t.emit(StoreStmt(value=v, param=p.name,
                                 offsets=_offsets(offset, len(p.dims), "tile.store")))


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
                             received=f"{type_text(v)} at {type_text(iv)}")
    elif v is None:
        raise ArgumentError(f"tile.atomic_add of a number into {p.name} needs index= (the "
                            f"elements to add it to)", location=user_location(),
                            hint="or add a tile: tile.full(shape, value, dtype)")
    elif len(v.shape) != len(p.dims):
        raise ShapeError(f"tile.atomic_add of a rank-{len(v.shape)} tile into {p.name} "
                         f"(rank {len(p.dims)})", location=user_location(), received=type_text(v),
                         expected=f"Tile[{', '.join(p.dims)}]")
    if t.body.output is not None and not (isinstance(t.body.output, AtomicStmt) and
                                          t.body.output.param == p.name):
        raise TracingError("a tile kernel has one output: tile.atomic_add into "
                           f"{p.name} beside another store, return or atomic_add",
                           location=user_location())
    p.read = p.written = True          # the adds start from the caller's values
    s = t.emit(AtomicStmt(value=v if v is not None else value, index=iv, param=p.name,
                      offsets=_offsets(offset, len(p.dims), "tile.atomic_add")))
    t.body.output = t.body.output or s


def _is_number(x) -> bool:
    return R.is_scalar(x) and not isinstance(x, bool)


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
        s = LoopStmt(start=self.start, stop=self.stop, step=self.step, var=var,
                 stages=self.stages, loc=user_location())
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


