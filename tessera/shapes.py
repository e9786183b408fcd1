"""Symbolic dimensions.

A dimension is an ``int`` or a ``Sym``: a polynomial with integer coefficients over named symbols
("B", "S") and opaque atoms (such as ``(D//3)``, where division is not exact). Polynomials give
reshape and concat exact symbolic shapes (``B*S``, ``2*S``); equality is structural, so two
different symbols are two different dimensions even when they happen to be equal at a call.
"""
from __future__ import annotations

import re
from typing import Union

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Sym:
    __slots__ = ("terms",)

    def __init__(self, terms):
        # terms: {monomial: coeff}; a monomial is a sorted tuple of (atom, power)
        self.terms = {m: c for m, c in terms.items() if c != 0}

    @staticmethod
    def var(name: str) -> "Sym":
        return Sym({((name, 1),): 1})

    # -- construction helpers -------------------------------------------------------------
    @staticmethod
    def lift(x) -> "Sym":
        if isinstance(x, Sym):
            return x
        return Sym({(): int(x)})

    def simplify(self) -> "Dim":
        """An int when the polynomial is a constant."""
        if not self.terms:
            return 0
        if list(self.terms) == [()]:
            return self.terms[()]
        return self

    # -- arithmetic ---------------------------------------------------------------------------
    def __add__(self, other):
        o = Sym.lift(other)
        t = dict(self.terms)
        for m, c in o.terms.items():
            t[m] = t.get(m, 0) + c
        return Sym(t).simplify()

    __radd__ = __add__

    def __neg__(self):
        return Sym({m: -c for m, c in self.terms.items()})

    def __sub__(self, other):
        return self + (-Sym.lift(other))

    def __rsub__(self, other):
        return Sym.lift(other) - self

    def __mul__(self, other):
        o = Sym.lift(other)
        t = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in o.terms.items():
                m = _mono_mul(m1, m2)
                t[m] = t.get(m, 0) + c1 * c2
        return Sym(t).simplify()

    __rmul__ = __mul__

    def __floordiv__(self, other):
        q = exact_div(self, other)
        if q is not None:
            return q
        return Sym.var(f"({self}//{_paren(other)})")

    def __rfloordiv__(self, other):
        q = exact_div(other, self)
        return q if q is not None else Sym.var(f"({other}//{_paren(self)})")

    def __truediv__(self, other):
        return self.__floordiv__(other)

    def __mod__(self, other):
        return Sym.var(f"({self}%{_paren(other)})")

    # -- comparison ---------------------------------------------------------------------------
    def __eq__(self, other):
        if isinstance(other, (int, Sym)):
            return self.terms == Sym.lift(other).terms
        return NotImplemented

    def __hash__(self):
        return hash(tuple(sorted(self.terms.items())))

    def __bool__(self):
        return bool(self.terms)

    def __index__(self):
        from .errors import SymbolicValueError
        raise SymbolicValueError(f"the symbolic dimension {self} has no value while tracing",
                         hint="shape-dependent Python code (range(S), int(D)) needs concrete "
                              "shapes: leave that parameter unannotated or use its size inside ops")

    __int__ = __index__

    # -- values -------------------------------------------------------------------------------
    def atoms(self) -> set[str]:
        return {a for m in self.terms for a, _ in m}

    def evaluate(self, bindings: dict) -> int:
        total = 0
        for m, c in self.terms.items():
            v = c
            for atom, p in m:
                v *= _eval_atom(atom, bindings) ** p
            total += v
        return total

    def __str__(self):
        parts = []
        for m, c in sorted(self.terms.items(), key=lambda mc: (-len(mc[0]), mc[0])):
            body = "*".join(a if p == 1 else f"{a}**{p}" for a, p in m)
            if not body:
                parts.append(str(c))
            elif c == 1:
                parts.append(body)
            elif c == -1:
                parts.append("-" + body)
            else:
                parts.append(f"{c}*{body}")
        s = "+".join(parts).replace("+-", "-")
        return s or "0"

    def __repr__(self):
        return f"Sym({str(self)!r})"


Dim = Union[int, Sym]


def _paren(x) -> str:
    s = str(x)
    return s if _NAME.match(s) or s.isdigit() else f"({s})"


def _mono_mul(a, b):
    powers = dict(a)
    for atom, p in b:
        powers[atom] = powers.get(atom, 0) + p
    return tuple(sorted(powers.items()))


def exact_div(a, b):
    """a / b when it is exact as a polynomial (b a single monomial), else None."""
    a, b = Sym.lift(a), Sym.lift(b)
    if len(b.terms) != 1:
        return a.simplify() if a == b else None
    (bm, bc), = b.terms.items()
    out = {}
    for m, c in a.terms.items():
        powers = dict(m)
        for atom, p in bm:
            if powers.get(atom, 0) < p:
                return None
            powers[atom] -= p
        if c % bc:
            return None
        nm = tuple(sorted((x, p) for x, p in powers.items() if p))
        out[nm] = out.get(nm, 0) + c // bc
    return Sym(out).simplify()


def _eval_atom(atom: str, bindings: dict) -> int:
    if atom in bindings:
        return int(bindings[atom])
    names = {n: int(v) for n, v in bindings.items()}
    try:
        return int(eval(atom, {"__builtins__": {}}, names))  # atoms are our own printed forms
    except NameError:
        raise KeyError(atom) from None


def dim(x) -> Dim:
    """A dimension from an int or a symbol name."""
    if isinstance(x, Sym):
        return x.simplify()
    if isinstance(x, str):
        if not _NAME.match(x):
            raise ValueError(f"{x!r} is not a valid dimension name")
        return Sym.var(x)
    if isinstance(x, bool):
        raise TypeError("a dimension cannot be a bool")
    return int(x)


def is_static(d: Dim) -> bool:
    return isinstance(d, int)


def evaluate(d: Dim, bindings: dict) -> int:
    return d if isinstance(d, int) else d.evaluate(bindings)


def same(a: Dim, b: Dim) -> bool:
    return Sym.lift(a) == Sym.lift(b)


def prod(dims) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d if isinstance(out, Sym) or isinstance(d, Sym) else out * d
    return out.simplify() if isinstance(out, Sym) else out


def fmt_shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"
