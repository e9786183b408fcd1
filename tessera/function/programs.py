"""A function's compiled programs: one per (target, argument types, static values, schedule),
each made once (binding, the symbolic check, the concrete trace, compiling) and kept."""
from __future__ import annotations

from .. import numerics
from ..errors import SymbolicValueError
from ..runtime import cache
from ..trace import is_training
from ..types import type_of_array
from . import tracing
from .binding import Signature, static_key


class ProgramCache:
    def __init__(self, sig: Signature, fn, may_return_none: bool, dynamic=()):
        self.sig, self.fn, self.may_return_none = sig, fn, may_return_none
        self.dynamic = tuple(dynamic)   # the symbols whose sizes compile once (dynamic.py)
        self.generics: dict = {}        # key without the dynamic sizes -> [ShapeGeneric]
        self.by_key: dict = {}          # concrete key -> Program
        self.checked: set = set()       # signatures whose symbolic trace has been checked
        self.last = None                # the program of the latest call

    def trace(self, types: dict, statics: dict, bindings=None):
        return tracing.trace(self.sig, self.fn, types, statics, bindings, self.may_return_none)

    def program(self, bound, target: str, schedule):
        """(Program, arrays) for a bound call (Signature.bind's result) on a target."""
        arrays, statics, bindings = bound
        from ..compiler.driver import compile_graph, resolve_target
        target = resolve_target(target, arrays.values())     # "cpu" -> "cpu:<ISA level>"
        key = (target, tuple((n, a.dtype.str, a.shape) for n, a in arrays.items()),
               static_key(statics), schedule.key() if schedule else None, is_training(),
               numerics.current())
        prog = self.by_key.get(key)
        if prog is not None:
            cache.count("memory_hits")
            self.last = prog
            return prog, arrays
        self.check_symbolic(arrays, statics, bindings)
        sizes = {s: bindings[s] for s in self.dynamic if s in bindings}
        if sizes:
            prog = self.dynamic_program(key, arrays, statics, bindings, sizes, target, schedule)
        else:
            g = self.trace({n: type_of_array(a) for n, a in arrays.items()}, statics, bindings)
            tracing.check_graph_return(self.sig, g, bindings, bindings)
            prog = compile_graph(g, target, schedule=schedule) if g.outputs else NoProgram(g)
        self.by_key[key] = prog
        self.last = prog
        return prog, arrays

    def dynamic_program(self, key, arrays, statics, bindings, sizes, target, schedule):
        """The program of a call whose dynamic symbols have these sizes: traced with each as a
        DynamicSize, run by a shape-generic library of an earlier size where one serves it
        (compiler/dynamic.py)."""
        from ..compiler.dynamic import DynamicSize
        from ..compiler.driver import compile_dynamic
        symbolic = {s: DynamicSize.symbol(s, v) for s, v in sizes.items()}
        traced = {**bindings, **symbolic}
        types = {}
        for n, a in arrays.items():
            t = type_of_array(a)
            dims = self.sig.spec_dims(n)
            if dims is not None and len(dims) == len(t.shape):
                # (a dimension is a number or one name: "B" is B's DynamicSize)
                t = t.with_shape(symbolic.get(str(d), size) for d, size in zip(dims, t.shape))
            types[n] = t
        g = self.trace(types, statics, traced)
        tracing.check_graph_return(self.sig, g, bindings, bindings)
        if not g.outputs:
            return NoProgram(g)
        # the generics of the same call but for these sizes (the arrays' dynamic dimensions
        # read as their symbols)
        shapes = tuple((n, str(a.dtype), tuple(t.shape)) for (n, a), t in
                       zip(arrays.items(), types.values()))
        family = (key[0], _symbolic_key(shapes)) + key[2:]
        generics = self.generics.setdefault(family, [])
        return compile_dynamic(g, target, sizes, generics, schedule=schedule)

    def check_symbolic(self, arrays, statics, bindings):
        """Trace once per signature with the annotations' symbols for sizes and check the
        result against the return annotation (what a concrete trace cannot prove for all
        sizes)."""
        if not self.sig.annotated():
            return
        key = (tuple((n, str(a.dtype), None if self.sig.spec_dims(n) is not None else a.shape)
                     for n, a in arrays.items()), static_key(statics),
               tuple(sorted(bindings.items())) if self.sig.ret_spec is not None else None,
               is_training(), numerics.current())
        if key in self.checked:
            return
        try:
            g = self.trace(tracing.symbolic_types(self.sig, arrays), statics)
        except (SymbolicValueError, TypeError):
            # The function computes with a size in Python (int(D), range(S)): only the concrete
            # trace that follows can check it.
            self.checked.add(key)
            return
        tracing.check_graph_return(self.sig, g, {}, bindings)
        self.checked.add(key)

    def forget(self):
        self.by_key.clear()


class NoProgram:
    """What a call compiles to when all its results are static (e.g. only None gradients)."""

    def __init__(self, g):
        self.graph_ir = g
        self.output_structure = g.output_structure
        self.output_tree = g.output_tree

    def run(self, *arrays):
        return []


def _symbolic_key(shapes) -> tuple:
    """Shapes with each dynamic size written as its form (the same for every size)."""
    from ..compiler.dynamic import form_key
    return tuple((n, d, tuple(form_key(x) for x in shape)) for n, d, shape in shapes)
