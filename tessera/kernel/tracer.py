"""The tracer a tile kernel's body runs under: where statements go, which values are in scope,
which knobs the body uses; and `tile.context()`, the body's view of the knobs and dimensions."""
from __future__ import annotations

import threading

from ..errors import ArgumentError, TracingError
from ..trace import user_location
from .index import Ix
from .ir import KernelBody, KernelStmt, KernelValue

KNOBS = ("BM", "BN", "BK", "warps", "stages", "vector")
BLOCK_KNOBS = ("BM", "BN", "BK")

_state = threading.local()


def tracer() -> "Tracer":
    t = getattr(_state, "tracer", None)
    if t is None:
        raise TracingError("tile builtins are for the body of an @ts.kernel function",
                           location=user_location(),
                           hint="decorate the function with @tessera.kernel")
    return t


def tracing(t: "Tracer | None") -> "Tracer | None":
    """Make t the thread's tracer (None: none); returns the one before."""
    before = getattr(_state, "tracer", None)
    _state.tracer = t
    return before


class Tracer:
    def __init__(self, body: KernelBody):
        self.body = body
        self.block = body.stmts                  # where statements go (a loop's body inside it)
        self.loops: list = []                    # open range_k loops (their LoopStmt statement)
        self.made_in: dict = {}                  # value id -> the loops open where it was made
        self.direct: dict = {}                   # parameter name -> its direct-use KernelValue
        self.broken = None                       # where a range_k loop was left by a break

    def new(self, shape, dtype, dims) -> KernelValue:
        b = self.body
        v = KernelValue(b.n, tuple(shape), dtype, list(dims), user_location())
        b.n += 1
        self.made_in[v.id] = tuple(id(lp) for lp in self.loops)
        return v

    def emit(self, s: KernelStmt) -> KernelStmt:
        """Append s where the body is, after checking its operands are in scope."""
        for a in s.reads():
            if isinstance(a, KernelValue):
                self.check_scope(a)
                self.body.uses[a.id] = self.body.uses.get(a.id, 0) + 1
        s.loc = s.loc or user_location()
        self.block.append(s)
        return s

    def check_scope(self, v: KernelValue):
        made, now = self.made_in.get(v.id, ()), tuple(id(lp) for lp in self.loops)
        if now[:len(made)] != made:
            raise TracingError(f"{v} was made inside a tile.range_k loop that has ended",
                               location=user_location(),
                               hint="carry a tile through a loop by updating it in place: "
                                    "acc = tile.zeros(...) before the loop, acc += ... inside")

    def check_index(self, e: Ix, what: str):
        """A loop variable in e must belong to an open range_k loop."""
        open_vars = {lp.var for lp in self.loops}
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
