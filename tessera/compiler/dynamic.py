"""Shape-generic programs: one compiled library serving every size of a function's dynamic
symbols (``ts.function(f, dynamic=("B",))``).

A dynamic symbol's size enters the trace as a `DynamicSize`: an int, equal to the call's size,
for every decision the compiler makes (a loop unrolled, a tile picked, a knob chosen), that
also carries each derived size's expression in the symbols as the shape checker's `shapes.Sym`
(32*B, ((B+15)//16), (B%16)): one symbolic size for checking, generic code and the printed IR.
Lowered, the program's Tile IR holds these sizes where it holds numbers; rendered, each is its
expression in the symbols, which the generated code takes as arguments. So the C computes, at
run time, what the compiler computed for the first size.

What the compiler decided from the value (an unrolled tail, a tile size) holds only for some
sizes. So a program is never reused on faith: a call at a new size lowers the function again
(Python only, no C compiler) and runs a generic library only where its Tile IR, evaluated at
the new sizes, is exactly the new size's Tile IR, buffers and calls included. Then every
statement, in order, is what the specialised program would run: the same bits (the numerics
contract: a sum's order depends on the shapes, never on how they were compiled). Where it is
not, the new size's program is compiled, itself generic, and serves its own sizes (a bucket:
the sizes whose decisions it shares).
"""
from __future__ import annotations

import dataclasses
import operator

import numpy as np

from ..shapes import Sym

# Python's floor division and modulo (C's / and % truncate toward zero), for the C and the GPU
# renderers (`TS_INLINE`: each target's qualifiers)
C_HELPERS = """\
TS_INLINE int64_t ts_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
TS_INLINE int64_t ts_floormod(int64_t a, int64_t b) { return a - ts_floordiv(a, b) * b; }"""


class DynamicSize(int):
    """A size whose value is known now and whose expression in the dynamic symbols is kept: an
    int carrying a `shapes.Sym` (`sym`, the one symbolic size of the shape checker) and the
    symbols' sizes in this call (`sizes`, for `representative`). Arithmetic with ints and other
    DynamicSizes computes both. A result whose expression is a constant (-(-B // B) is 1) stays
    a DynamicSize: the IR does not fold it, so the programs of neighbouring sizes (where the
    same size is -(-B // 4)) keep one structure and one library."""

    def __new__(cls, value: int, sym, sizes: dict):
        self = int.__new__(cls, value)
        self.sym, self.sizes = sym, sizes
        return self

    @classmethod
    def symbol(cls, name: str, value: int) -> "DynamicSize":
        return cls(value, Sym.var(name), {name: int(value)})

    def __reduce__(self):           # pickled (a cache key) as the plain number it equals
        return (int, (int(self),))


def _sym(x):
    return x.sym if isinstance(x, DynamicSize) else int(x)


def _make(op: str, a, b):
    fn = _OPS[op]
    sym, value = fn(_sym(a), _sym(b)), fn(int(a), int(b))
    sizes = a.sizes if isinstance(a, DynamicSize) else b.sizes
    if isinstance(b, DynamicSize) and b.sizes is not sizes:
        sizes = {**sizes, **b.sizes}
    return DynamicSize(value, sym, sizes)


def _combine(op: str):
    def forward(a, b):
        if type(b) is bool or not isinstance(b, int):
            return NotImplemented
        return _make(op, a, b)

    def backward(a, b):
        if type(b) is bool or not isinstance(b, int):
            return NotImplemented
        return _make(op, b, a)
    return forward, backward


_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
        "%": operator.mod}
for _op, _name in (("+", "add"), ("-", "sub"), ("*", "mul"), ("//", "floordiv"), ("%", "mod")):
    _f, _b = _combine(_op)
    setattr(DynamicSize, f"__{_name}__", _f)
    setattr(DynamicSize, f"__r{_name}__", _b)


def _pow(a, p):
    if type(p) is not int or p < 0:
        return NotImplemented
    out = 1
    for _ in range(p):
        out = out * a
    return out


DynamicSize.__pow__ = _pow
DynamicSize.__neg__ = lambda a: _make("-", 0, a)
DynamicSize.__pos__ = lambda a: a
DynamicSize.__divmod__ = lambda a, b: (a // b, a % b)
DynamicSize.__rdivmod__ = lambda a, b: (b // a, b % a) if isinstance(b, int) else NotImplemented


def is_dynamic(x) -> bool:
    return isinstance(x, DynamicSize)


class SizeConstant(np.ndarray):
    """A 0-d constant of the Graph IR whose value is a DynamicSize (`dynamic_value`): a mean's
    count. The emitter reads it as that size, so the C computes it from the symbols."""
    dynamic_value = None


def size_constant(arr: np.ndarray, size: DynamicSize) -> np.ndarray:
    out = arr.view(SizeConstant)
    out.dynamic_value = size
    return out


def scalar_value(arr: np.ndarray):
    """A 0-d constant's value: its DynamicSize when it has one, else the number."""
    size = arr.dynamic_value if type(arr) is SizeConstant else None
    return size if size is not None else arr.item()


def evaluate(x, sizes: dict):
    """x at these sizes of the symbols (a plain int), x itself when it is not a DynamicSize."""
    if not isinstance(x, DynamicSize):
        return x
    return x.sym.evaluate(sizes) if isinstance(x.sym, Sym) else x.sym


def c_expr(x) -> str:
    """x as a C expression of int64_t (the symbols are ts_size_<name>), from its terms."""
    return _c_dim(x.sym if isinstance(x, DynamicSize) else int(x))


def _c_dim(d) -> str:
    if not isinstance(d, Sym):
        return f"{d}LL" if abs(d) > 2 ** 31 - 1 else str(d)
    terms = []
    for monomial, coeff in d.ordered_terms():
        factors = [_c_atom(a) for a, p in monomial for _ in range(p)]
        if coeff != 1 or not factors:
            factors.append(_c_dim(coeff))
        terms.append(factors[0] if len(factors) == 1 else f"({' * '.join(factors)})")
    return terms[0] if len(terms) == 1 else f"({' + '.join(terms)})"


def _c_atom(a) -> str:
    if isinstance(a, str):
        return f"ts_size_{a}"
    helper = "ts_floordiv" if a.op == "//" else "ts_floormod"
    return f"{helper}({_c_dim(a.num)}, {_c_dim(a.den)})"


def representative(x):
    """x with each dynamic symbol at the power of two at or above its size (a plain int; x
    itself when it is not dynamic). The strategies choose knobs (tiles, serial or parallel) by
    it, so that the sizes of a bucket (2**(k-1), 2**k] share their knobs and one generic library
    serves them all; knobs never change a result's bits."""
    if not isinstance(x, DynamicSize):
        return x
    return evaluate(x, {name: 1 << (v - 1).bit_length() if v > 1 else v
                        for name, v in x.sizes.items()})


def form_key(x):
    """A hashable stand-in for x that is the same at every size: its Sym (a plain int is
    itself)."""
    return x.sym if isinstance(x, DynamicSize) else x


_FIELDS: dict = {}      # dataclass -> its fields' names (dataclasses.fields is slow)


def _fields_of(cls) -> tuple:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def same_at(a, b, sizes: dict) -> bool:
    """Whether two IR objects (dataclasses, lists, tuples, dicts, numbers) are equal with every
    DynamicSize in either evaluated at `sizes`."""
    if isinstance(a, DynamicSize) or isinstance(b, DynamicSize):
        return evaluate(a, sizes) == evaluate(b, sizes)
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is list or kind is tuple:
        return len(a) == len(b) and all(same_at(x, y, sizes) for x, y in zip(a, b))
    if kind is dict:
        return a.keys() == b.keys() and all(same_at(a[k], b[k], sizes) for k in a)
    if dataclasses.is_dataclass(kind):
        return all(same_at(getattr(a, f), getattr(b, f), sizes) for f in _fields_of(kind))
    return a == b


_RENDERED = {("Const", "value"), ("Loop", "extent"), ("Scratch", "size")}


def _rendered(owner, field: str) -> bool:
    """Whether the C renders this field of a Tile IR object through its expression (where a
    DynamicSize stays one): an index constant's value, a loop's extent, a heap scratch's
    length."""
    return (type(owner).__name__, field) in _RENDERED


def freeze(x, owner=None, field: str = ""):
    """A copy of a tile program for a shape-generic build: sizes the C renders as expressions
    stay DynamicSizes, every other (a local array's length, a knob) becomes the number it is
    now, as the C will hold it."""
    if isinstance(x, DynamicSize):
        return x if _rendered(owner, field) else int(x)
    if isinstance(x, (list, tuple)):
        items = [freeze(v, owner, field) for v in x]
        return items if isinstance(x, list) else tuple(items)
    if isinstance(x, dict):
        return {k: freeze(v, owner, field) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: freeze(getattr(x, f.name), x, f.name)
                                         for f in dataclasses.fields(x) if f.init})
    return x


def structure(tile) -> tuple:
    """What a tile program's code is made of: its kernels (names, strategies, parameters'
    names, dtypes and modes, bodies, knobs, a GPU kernel's block, shared memory and workspace),
    its launches, its buffer table (names, roles, dtypes, in order) and its control flow. Two programs with equal
    structures render the same code; sizes of buffers, the data of constants and a GPU launch's
    grid (its loops stride over whatever grid runs them) are not part of it: the runtime passes
    them."""
    return (tuple((k.name, k.strategy, tuple((p.name, p.dtype, p.mode) for p in k.params),
                   k.body, k.knobs, k.launch and {key: v for key, v in k.launch.items()
                                                 if key != "grid"})
                  for k in tile.kernels),
            tuple((name, tuple(args)) for name, args in tile.calls),
            tuple((b.name, b.role, b.type.dtype) for b in tile.buffers),
            _steps(tile.steps), {name: _buffer(b) for name, b in tile.views.items()})


def _buffer(b) -> tuple | None:
    """What control-flow code reads of a buffer: its name, role and dtype, its bytes (copied
    and strided by), and what a view stands for (an inline constant: its value)."""
    if b is None:
        return None
    if b.role == "inline":
        data = b.data.tolist()
    elif b.role == "slice":
        data = (b.data[0].name, b.data[1])
    else:
        data = b.data.name if b.role == "alias" else None
    return b.name, b.role, b.type.dtype, b.nbytes, data


def _steps(steps) -> tuple | None:
    """A program's control flow as its entry point runs it: kernels by name, regions with their
    kind, loop variable, bounds, buffers and bodies."""
    if steps is None:
        return None
    out = []
    for st in steps:
        if not hasattr(st, "bodies"):
            out.append(st.name)
            continue
        out.append((st.kind, st.var, dict(st.attrs), tuple(map(_buffer, st.operands)),
                    tuple(map(_buffer, st.results)), _buffer(st.counter),
                    {j: _buffer(b) for j, b in st.staging.items()},
                    {role: (_steps(body), tuple(map(_buffer, outs)))
                     for role, (body, outs) in st.bodies.items()}))
    return tuple(out)

