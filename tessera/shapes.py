"""Symbolic sizes: the one representation of a size in terms of named symbols.

A dimension is an ``int`` or a ``Sym``: a polynomial with integer coefficients over atoms,
which are named symbols ("B", "S") or a floor division or remainder that is not exact
(``Division``: ``(D//3)``, ``(B%16)``, with Python's floor semantics). Polynomials give reshape
and concat exact symbolic shapes (``B*S``, ``2*S``); equality is structural, so two different
symbols are two different dimensions even when they happen to be equal at a call.

The shape checker traces with Syms that have no value; the compiler's shape-generic programs
(`compiler/dynamic.DynamicSize`) carry a Sym beside each size's value, evaluate it here and
render it to C from its terms.
"""
from __future__ import annotations

import dataclasses
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
        return q if q is not None else Division.atom("//", self, other)

    def __rfloordiv__(self, other):
        q = exact_div(other, self)
        return q if q is not None else Division.atom("//", other, self)

    def __truediv__(self, other):
        return self.__floordiv__(other)

    def __mod__(self, other):
        return 0 if exact_div(self, other) is not None else Division.atom("%", self, other)

    def __rmod__(self, other):
        return 0 if exact_div(other, self) is not None else Division.atom("%", other, self)

    # -- comparison ---------------------------------------------------------------------------
    def __eq__(self, other):
        if isinstance(other, (int, Sym)):
            return self.terms == Sym.lift(other).terms
        return NotImplemented

    def __hash__(self):
        return hash(frozenset(self.terms.items()))

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
        """The names of the symbols it is made of (inside its divisions too)."""
        out = set()
        for m in self.terms:
            for a, _ in m:
                out |= {a} if isinstance(a, str) else a.atoms()
        return out

    def opaque(self) -> bool:
        """Whether it holds a division that is not exact, (D//3): a size Tessera cannot
        reason about beyond evaluating it."""
        return any(not isinstance(a, str) for m in self.terms for a, _ in m)

    def evaluate(self, bindings: dict) -> int:
        """Its value with each symbol at its size in ``bindings`` (KeyError for a missing one)."""
        total = 0
        for m, c in self.terms.items():
            v = c
            for atom, p in m:
                v *= (int(bindings[atom]) if isinstance(atom, str) else
                      atom.evaluate(bindings)) ** p
            total += v
        return total

    def ordered_terms(self) -> list:
        """(monomial, coefficient) pairs, highest degree first, in a fixed order: how it prints
        and how the C renders it."""
        return sorted(self.terms.items(),
                      key=lambda mc: (-len(mc[0]), [(_atom_key(a), p) for a, p in mc[0]]))

    def __str__(self):
        parts = []
        for m, c in self.ordered_terms():
            body = "*".join(str(a) if p == 1 else f"{a}**{p}" for a, p in m)
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


@dataclasses.dataclass(frozen=True)
class Division:
    """An atom of a Sym: ``num // den`` or ``num % den`` (op "//" or "%"), floor semantics, kept
    whole because it is not exact as a polynomial."""
    op: str
    num: Dim
    den: Dim

    @staticmethod
    def atom(op: str, num, den) -> Sym:
        return Sym({((Division(op, _dim_of(num), _dim_of(den)), 1),): 1})

    def atoms(self) -> set[str]:
        return {a for d in (self.num, self.den) if isinstance(d, Sym) for a in d.atoms()}

    def evaluate(self, bindings: dict) -> int:
        a, b = evaluate(self.num, bindings), evaluate(self.den, bindings)
        return a // b if self.op == "//" else a % b

    def __str__(self):
        return f"({_paren(self.num)}{self.op}{_paren(self.den)})"


def _dim_of(x) -> Dim:
    return x.simplify() if isinstance(x, Sym) else int(x)


def _atom_key(a) -> tuple:
    return (0, a) if isinstance(a, str) else (1, str(a))


def _paren(x) -> str:
    s = str(x)
    return s if _NAME.match(s) or s.isdigit() else f"({s})"


def _mono_mul(a, b):
    powers = dict(a)
    for atom, p in b:
        powers[atom] = powers.get(atom, 0) + p
    return _monomial(powers)


def _monomial(powers: dict) -> tuple:
    """{atom: power} as a monomial: the atoms with a power, in the fixed order of _atom_key."""
    return tuple(sorted(((a, p) for a, p in powers.items() if p), key=lambda ap: _atom_key(ap[0])))


def exact_div(a, b):
    """a / b when it is exact as a polynomial (b a single monomial, or a itself), else None."""
    a, b = Sym.lift(a), Sym.lift(b)
    if len(b.terms) != 1:
        return 1 if a == b and b.terms else None     # (S0 + S1) / (S0 + S1) is 1
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
        nm = _monomial(powers)
        out[nm] = out.get(nm, 0) + c // bc
    return Sym(out).simplify()


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


def show(d) -> str:
    """A size as the IRs print it: a compiled size that carries its expression in the symbols
    (compiler/dynamic.DynamicSize: an int with a `sym`) prints the expression, 32*B."""
    return str(getattr(d, "sym", d))


def fmt_shape(shape) -> str:
    return "[" + ",".join(map(show, shape)) + "]"
