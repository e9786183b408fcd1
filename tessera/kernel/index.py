"""`Ix`: a size or index of a tile kernel's body, symbolic while the body is traced.

A constant, a knob (ctx.BM), a dimension (ctx.K), a program id, a range_k loop's variable, or
arithmetic on those. The user's code holds them (ctx.BM, k, program_id(0)); the statements keep
them; the interpreter and the strategy evaluate them by `op`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ArgumentError, ShapeError, TracingError
from ..trace import user_location


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
