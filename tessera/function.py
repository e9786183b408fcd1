"""``@tessera.function``: a Python function traced into Graph IR, shape-checked symbolically,
compiled per input signature and cached.

    @ts.function
    def layer_norm(x: Tensor["B", "S", "D"]) -> Tensor["B", "S", "D"]: ...

A call binds the symbols from the arrays (B=4, S=16, D=32), checks the symbolic graph once per
signature, then runs the compiled program for these concrete shapes (compiling it the first time;
later calls, and later processes through the disk cache, compile nothing).

Arguments and results may be pytrees (tessera/pytree.py): an unannotated argument that is a
dict, or a list/tuple holding arrays, becomes one tensor parameter per array leaf (named after
its path: ``params_layers_0_w``), its other leaves static values; the structure and the static
leaves are part of the cache key. A list of Python numbers is still one array and a tuple of
them a static value. A result holding dicts (or containers, or None, inside a tuple or list)
comes back with the same structure.
"""
from __future__ import annotations

import functools
import inspect
import linecache
import os
import re

import numpy as np

from . import dtypes as dt
from . import pytree
from .compiler.graph_ir import Graph, SourceLocation
from .errors import (_PKG_DIR, ArgumentError, DTypeError, RankError, RuntimeFault, ShapeError,
                     SymbolicValueError, SymbolMismatchError, TesseraError, enrich)
from .ops.registry import run_reference
from .runtime import cache
from .runtime.isa import ENV as CPU_TARGET_ENV
from .schedule import Schedule
from .shapes import Sym, evaluate, fmt_shape, same
from .trace import Trace, Traced, frame_location, tracing
from .types import TensorType, spec_of, type_of_array


class _Param:
    def __init__(self, p: inspect.Parameter):
        self.name = p.name
        self.spec = spec_of(p.annotation) if p.annotation is not inspect.Parameter.empty else None
        # each annotated dimension as (size, None) or (None, symbol name), for fast binding
        self.dims = None if self.spec is None or self.spec.dims is None else [
            (d, None) if isinstance(d, int) else (None, str(d)) for d in self.spec.dims]


class Function:
    _may_return_none = False     # a transform's result may be None (no gradient)

    def __init__(self, fn, name: str | None = None, target: str = "cpu", schedule=None):
        if not callable(fn):
            raise ArgumentError(f"tessera.function needs a Python function, got {fn!r}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name or fn.__name__
        self.target = target
        if schedule is not None and not isinstance(schedule, Schedule):
            raise ArgumentError(f"schedule must be a tessera.Schedule, not {schedule!r}")
        self.schedule = schedule
        try:
            sig = inspect.signature(fn, eval_str=True)
        except (NameError, TypeError, ValueError) as e:
            raise ArgumentError(f"cannot read the signature of {fn.__name__}: {e}") from None
        self._sig = sig
        self._params = [_Param(p) for p in sig.parameters.values()]
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
            raise ArgumentError(f"{self.name}: *args and **kwargs parameters are not supported")
        ret = sig.return_annotation
        self._ret_spec = None if ret is inspect.Signature.empty else spec_of(ret)
        self._checked: set = set()      # signatures whose symbolic trace has been checked
        self._programs: dict = {}       # concrete key -> Program
        self._fast: dict = {}           # (CPU target env, array types) -> launcher
        self._last_program = None
        self._def_loc = _def_location(fn)

    def __repr__(self):
        params = ", ".join(f"{p.name}: {p.spec!r}" if p.spec else p.name for p in self._params)
        return f"<tessera.function {self.name}({params})>"

    # -- binding arguments ------------------------------------------------------------------------
    def _bind(self, args, kwargs):
        """(tensor arrays by param, static values, bindings) with every mismatch reported."""
        bound = self._bind_python(args, kwargs)
        arrays, statics, bindings, origin = {}, {}, {}, {}
        for p in self._params:
            x = bound.arguments[p.name]
            if p.spec is None and _is_tree(x):
                statics[p.name] = self._bind_tree(p.name, x, arrays)
                continue
            if p.spec is None and not _is_arraylike(x):
                try:
                    hash(x)
                except TypeError:
                    raise ArgumentError(f"argument {p.name!r} is neither an array nor a hashable "
                                        f"static value: {type(x).__name__}",
                                        function=self.name) from None
                statics[p.name] = x
                continue
            try:
                arr = x if _on_device(x) else np.asarray(x)   # a CuPy array stays on its device
            except ValueError as e:
                raise ArgumentError(f"argument {p.name!r} is not an array: {e}",
                                    function=self.name) from None
            try:
                d = dt.from_numpy(arr.dtype)
            except DTypeError as e:
                e.summary = f"argument {p.name!r}: {e.summary}"
                raise enrich(e, function=self.name) from None
            if p.spec is not None:
                self._check_spec(p, arr.shape, d, bindings, origin)
            arrays[p.name] = arr if arr is x and _on_device(x) else dt.native(arr)
        return arrays, statics, bindings

    def _bind_tree(self, name: str, tree, arrays: dict) -> "_TreeArg":
        """A nested dict/list/tuple argument: each array leaf becomes a tensor parameter named
        after its path (params_w1), each other leaf a static value of the tree."""
        leaves, treedef = pytree.flatten(tree)
        taken = {p.name for p in self._params} | set(arrays)
        slots = []
        for path, leaf in zip(treedef.paths(), leaves):
            if not _is_arraylike(leaf):
                try:
                    hash(leaf)
                except TypeError:
                    raise ArgumentError(f"argument {name!r} holds {type(leaf).__name__} at "
                                        f"{_path_str(path)}: neither an array nor a hashable "
                                        "static value", function=self.name) from None
                slots.append(("static", leaf))
                continue
            arr = leaf if _on_device(leaf) else np.asarray(leaf)   # CuPy leaves stay put
            try:
                dt.from_numpy(arr.dtype)
            except DTypeError as e:
                e.summary = f"argument {name!r} at {_path_str(path)}: {e.summary}"
                raise enrich(e, function=self.name) from None
            pname = _leaf_name(name, path, taken)
            taken.add(pname)
            arrays[pname] = arr if arr is leaf and _on_device(leaf) else dt.native(arr)
            slots.append(("param", pname))
        return _TreeArg(treedef, slots)

    def _bind_python(self, args, kwargs) -> inspect.BoundArguments:
        try:
            bound = self._sig.bind(*args, **kwargs)
        except TypeError as e:
            raise ArgumentError(f"{self.name}() {e}", function=self.name,
                                location=self._def_loc,
                                expected=f"{self.name}{self._sig}") from None
        bound.apply_defaults()
        return bound

    def _check_spec(self, p, shape, d, bindings, origin):
        """Check one argument's dtype, rank and sizes against its annotation; bind its symbols.

        `shape` may hold symbols (a call from inside another trace); those bind like sizes."""
        spec = p.spec
        received = f"{d.short}{fmt_shape(shape)}"      # for the messages below
        if spec.dtype is not None and spec.dtype != d:
            raise DTypeError(f"argument {p.name!r} has the wrong dtype", function=self.name,
                             location=self._def_loc, expected=spec.type_str(), received=received,
                             hint=f"convert with x.astype(np.{spec.dtype.name})")
        if p.dims is None:
            return
        if len(shape) != len(p.dims):
            raise RankError(f"argument {p.name!r} has rank {len(shape)}, the annotation rank "
                            f"{len(p.dims)}", function=self.name, location=self._def_loc,
                            expected=spec.type_str(d), received=received)
        for k, ((want, name), got) in enumerate(zip(p.dims, shape)):
            if name is None:
                if not same(want, got):
                    raise ShapeError(f"argument {p.name!r} has size {got} on axis {k}, the "
                                     f"annotation {want}", function=self.name,
                                     location=self._def_loc, expected=spec.type_str(d),
                                     received=received)
                continue
            if name in bindings and not same(bindings[name], got):
                raise SymbolMismatchError(
                    f"the arguments disagree on {name}: {name}={bindings[name]} from "
                    f"{origin[name]}, {name}={got} from {p.name!r} axis {k}",
                    function=self.name, location=self._def_loc,
                    expected=spec.type_str(d) + f" with {name}={bindings[name]}",
                    received=received)
            bindings[name] = got
            origin.setdefault(name, f"{p.name!r} axis {k}")

    # -- tracing ----------------------------------------------------------------------------------
    def _trace(self, types: dict, statics: dict, bindings=None) -> Graph:
        g = Graph(self.name, bindings=bindings)
        trace = Trace(g, self.name)
        call_args = {}
        for p in self._params:
            tree = statics.get(p.name)
            if isinstance(tree, _TreeArg):
                call_args[p.name] = tree.treedef.unflatten(
                    [Traced(g.add_param(x, types[x]), trace) if kind == "param" else x
                     for kind, x in tree.slots])
            elif p.name in types:
                call_args[p.name] = Traced(g.add_param(p.name, types[p.name]), trace)
            else:
                call_args[p.name] = statics[p.name]
        cache.count("traces")
        with tracing(trace):
            try:
                result = self.fn(**call_args)
            except TesseraError as e:
                if e.partial_graph is None:     # raised outside an op (`range(S)`, an `if`)
                    e.partial_graph = g
                raise enrich(e, function=self.name, location=_raising_user_line(e))
            structure, tree = "single", None
            items = [result]
            if _is_nested(result) or (result is None and self._may_return_none):
                # a dict, or containers (or None) inside a tuple/list: a pytree of results,
                # compiled as a flat list and rebuilt after each call
                items, tree = pytree.flatten(result)
                structure = "list"
            elif isinstance(result, (tuple, list)):
                structure = "tuple" if isinstance(result, tuple) else "list"
                items = list(result)
            outs = []
            for r in items:
                if isinstance(r, Traced):
                    if r._trace is not trace:
                        raise TesseraError("returned a tensor traced in another function",
                                           function=self.name)
                    outs.append(r._value)
                elif r is None:
                    raise TesseraError(f"{self.name} returned None", function=self.name,
                                       location=self._def_loc, hint="return a tensor")
                else:
                    try:
                        outs.append(g.const(np.asarray(r)))
                    except TesseraError as e:
                        raise enrich(e, function=self.name) from None
        g.outputs = outs
        g.output_structure = structure
        g.output_tree = tree
        return g

    def _symbolic_types(self, arrays: dict, default_dtype=None) -> dict:
        types = {}
        specs = {p.name: p.spec for p in self._params}
        for name, arr in arrays.items():          # parameters and pytree leaves
            spec = specs.get(name)
            dims = spec.dims if spec is not None and spec.dims is not None else arr.shape
            types[name] = TensorType(dt.from_numpy(arr.dtype), tuple(dims))
        for p in self._params:
            if p.name in arrays:
                continue
            if p.spec is not None and default_dtype is not None:
                if p.spec.dims is None:
                    raise ArgumentError(f"{p.name} is annotated with a bare Tensor: its rank is "
                                        "unknown until a call", function=self.name)
                types[p.name] = TensorType(p.spec.dtype or default_dtype, p.spec.dims)
        return types

    def _check_return(self, outputs, translate: dict, values: dict | None, reduced: bool):
        """The result against the return annotation.

        `translate` maps the annotation's symbols into the trace's dimensions (empty for a trace
        made from the annotations themselves); `values` are the call's sizes, when known.
        A symbol against another symbol must be the same symbol; a size against a symbol, or an
        expression Tessera cannot reason about, is compared by value at the call. A symbol only
        the return annotation names takes whatever size comes out."""
        spec = self._ret_spec
        if spec is None or spec.dims is None:
            return
        if len(outputs) != 1:
            raise ShapeError(f"{self.name} returns {len(outputs)} tensors; the annotation one",
                             function=self.name, location=self._def_loc)
        t, node = outputs[0]
        known = self._annotated_symbols() | set(translate)
        fresh = {}
        ok = t.rank == len(spec.dims) and (spec.dtype is None or spec.dtype == t.dtype)
        for want, got in zip(spec.dims, t.shape) if ok else ():
            name = str(want)
            if isinstance(want, Sym) and name not in known:
                ok &= same(fresh.setdefault(name, got), got)
                continue
            w = translate.get(name, want) if isinstance(want, Sym) else want
            if same(w, got):
                continue
            if isinstance(w, int) and isinstance(got, int):
                ok = False
            elif isinstance(w, Sym) and isinstance(got, Sym) and not (_opaque(w) or _opaque(got)):
                ok = False
            elif values is not None:
                try:
                    ok &= evaluate(w, values) == evaluate(got, values)
                except KeyError:
                    pass
        if not ok:
            hint = None
            if t.rank < len(spec.dims) and reduced:
                hint = "did you forget keepdim=True?"
            elif t.rank == len(spec.dims) and sorted(map(str, t.shape)) == sorted(map(str, spec.dims)):
                hint = "the dimensions are all there in another order: a missing transpose?"
            received = str(t)
            syms = sorted({a for d in t.shape if isinstance(d, Sym) for a in d.atoms()
                           if values and a in values})
            if syms:
                received += " with " + ", ".join(f"{a}={values[a]}" for a in syms)
            raise ShapeError("the result does not match the return annotation",
                             function=self.name, location=node.loc if node else self._def_loc,
                             op=node.op if node else None, expected=spec.type_str(t.dtype),
                             received=received, hint=hint)

    def _check_graph_return(self, g: Graph, translate: dict, values):
        self._check_return([(v.type, v.node) for v in g.outputs], translate, values,
                           _has_reduction(g))

    def _annotated_symbols(self) -> set:
        return {a for p in self._params if p.spec is not None and p.spec.dims is not None
                for d in p.spec.dims if isinstance(d, Sym) for a in d.atoms()}

    def _check_symbolic(self, arrays, statics, bindings):
        if not any(p.spec is not None and p.spec.dims is not None for p in self._params):
            return
        key = (tuple((n, str(a.dtype), None if _spec_dims(self, n) is not None else a.shape)
                     for n, a in arrays.items()), _static_key(statics),
               tuple(sorted(bindings.items())) if self._ret_spec is not None else None)
        if key in self._checked:
            return
        try:
            g = self._trace(self._symbolic_types(arrays), statics)
        except (SymbolicValueError, TypeError):
            # The function computes with a size in Python (int(D), range(S)): only the concrete
            # trace that follows can check it.
            self._checked.add(key)
            return
        self._check_graph_return(g, {}, bindings)
        self._checked.add(key)

    # -- public -----------------------------------------------------------------------------------
    @property
    def graph_ir(self) -> Graph:
        """The symbolic Graph IR, traced from the annotations (float32 where they name no dtype)."""
        annotated = [p for p in self._params if p.spec is not None]
        missing = [p.name for p in self._params if p.spec is None]
        if missing or not annotated:
            if self._last_program is not None:
                return self._last_program.graph_ir
            raise ArgumentError(f"{self.name} has unannotated parameters ({', '.join(missing)}); "
                                "its Graph IR needs example arguments", function=self.name,
                                hint=f"use {self.name}.lower(*arrays).graph_ir, or annotate them "
                                     "with Tensor[...]")
        try:
            g = self._trace(self._symbolic_types({}, dt.float32), {})
        except TesseraError as e:
            raise e.with_traceback(None) from None
        except TypeError as e:
            raise SymbolicValueError(f"{self.name} cannot be traced with symbolic sizes: {e}",
                                     function=self.name, location=self._def_loc,
                                     hint=f"its code needs sizes as numbers; use "
                                          f"{self.name}.lower(*arrays).graph_ir") from None
        try:
            self._check_graph_return(g, {}, None)
        except TesseraError as e:
            raise e.with_traceback(None) from None
        return g

    def lower(self, *args, target: str | None = None, **kwargs):
        """The Program for these arguments: every IR level, the C source, and the compiled code."""
        try:
            return self._program(args, kwargs, target or self.target)[0]
        except TesseraError as e:
            raise e.with_traceback(None) from None

    def _program(self, args, kwargs, target):
        arrays, statics, bindings = self._bind(args, kwargs)
        from .compiler.pipeline import resolve_target
        target = resolve_target(target, arrays.values())     # "cpu" -> "cpu:<ISA level>"
        key = (target, tuple((n, a.dtype.str, a.shape) for n, a in arrays.items()),
               _static_key(statics), self.schedule.key() if self.schedule else None)
        prog = self._programs.get(key)
        if prog is not None:
            cache.count("memory_hits")
            self._last_program = prog
            return prog, arrays
        self._check_symbolic(arrays, statics, bindings)
        types = {n: type_of_array(a) for n, a in arrays.items()}
        g = self._trace(types, statics, bindings)
        self._check_graph_return(g, bindings, bindings)
        if not g.outputs:                       # nothing to compute: every result is static
            prog = _NoProgram(g)
        else:
            from .compiler.pipeline import compile_graph
            prog = compile_graph(g, target, g.output_structure, self.schedule)
        prog.output_tree = g.output_tree
        self._programs[key] = prog
        self._last_program = prog
        return prog, arrays

    def __call__(self, *args, **kwargs):
        # The fast path: arrays whose types were seen before go straight to their program,
        # with no binding, annotation check or tracing (they were all done the first time).
        key = None if kwargs else _array_signature(args)
        if key is not None:
            key = (os.environ.get(CPU_TARGET_ENV), key)   # "cpu" resolves through it
            launch = self._fast.get(key)
            if launch is not None:
                cache.count("memory_hits")
                try:
                    return launch(args)
                except TesseraError as e:
                    raise e.with_traceback(None) from None
        if _inside_trace(args, kwargs):
            return self._inline(args, kwargs)
        try:
            prog, arrays = self._program(args, kwargs, self.target)
            if key is not None:
                self._remember(key, args, prog, arrays)
            if prog.output_tree is not None:
                return prog.output_tree.unflatten(prog.run(*arrays.values()))
            return prog(*arrays.values())
        except TesseraError as e:
            raise e.with_traceback(None) from None

    def forget_programs(self):
        """Drop every compiled program (and fast-path launcher): the next call compiles anew."""
        self._programs.clear()
        self._fast.clear()

    def _remember(self, key, args, prog, arrays):
        """Keep a launcher for the fast path when these arrays are exactly what the program
        takes: positional, in parameter order, C-contiguous, native and of its dtypes."""
        from .compiler.pipeline import Program
        if not isinstance(prog, Program) or not prog._runs_here or len(arrays) != len(args) \
                or len(self._fast) >= _FAST_ENTRIES:
            return
        for arr, a, (npd, _) in zip(arrays.values(), args, prog._param_types):
            if arr is not a or a.dtype != npd:
                return
        execute, tree, structure = prog._execute, prog.output_tree, prog.output_structure
        if tree is not None:
            launch = lambda a: tree.unflatten(execute(list(a)))          # noqa: E731
        elif structure in (None, "single"):
            launch = lambda a: execute(list(a))[0]                       # noqa: E731
        elif structure == "tuple":
            launch = lambda a: tuple(execute(list(a)))                   # noqa: E731
        else:
            launch = lambda a: list(execute(list(a)))                    # noqa: E731
        self._fast[key] = launch

    def _inline(self, args, kwargs):
        """Called on traced tensors from inside another tessera function: check the annotations
        against the traced types, then trace the body into the caller's graph."""
        bound = self._bind_python(args, kwargs)
        bindings, origin = {}, {}
        for p in self._params:
            x = bound.arguments[p.name]
            if p.spec is not None and isinstance(x, Traced):
                self._check_spec(p, x.shape, x.dtype, bindings, origin)
        result = self.fn(*bound.args, **bound.kwargs)
        if self._ret_spec is not None and isinstance(result, Traced):
            self._check_return([(result.type, result._value.node)], bindings, None,
                               _has_reduction_upto(result._value))
        return result

    def symbols(self) -> list[str]:
        """The symbolic dimension names of the annotations, in order of first appearance."""
        out = []
        for p in self._params:
            for d in (p.spec.dims or ()) if p.spec is not None else ():
                for name in ([] if isinstance(d, int) else sorted(d.atoms())):
                    if name not in out:
                        out.append(name)
        return out

    def example_args(self, sizes: dict | None = None, seed: int = 0) -> list:
        """Arrays for the annotated parameters with these sizes for the symbols (`B=8, S=128`):
        standard normal floats from a fixed seed, zeros for integers, False for bools. What the
        notebook explorer lowers and profiles with when given only shapes."""
        sizes = dict(sizes or {})
        missing = [s for s in self.symbols() if s not in sizes]
        if missing:
            raise ArgumentError(f"{self.name} needs sizes for {', '.join(missing)}",
                                function=self.name,
                                hint="give every symbol, e.g. " +
                                     ",".join(f"{s}=8" for s in self.symbols()))
        rng = np.random.default_rng(seed)
        args = []
        for p in self._params:
            if p.spec is None or p.spec.dims is None:
                default = self._sig.parameters[p.name].default
                if default is inspect.Parameter.empty:
                    raise ArgumentError(f"{self.name}: parameter {p.name!r} has no Tensor[...] "
                                        "annotation with a rank, so its shape is unknown",
                                        function=self.name,
                                        hint="annotate it, or call lower() with arrays")
                args.append(default)
                continue
            shape = tuple(evaluate(d, sizes) for d in p.spec.dims)
            d = p.spec.dtype or dt.float32
            if d.is_float:
                args.append(rng.standard_normal(shape).astype(d.np))
            else:
                args.append(np.zeros(shape, dtype=d.np))
        return args

    def specialize(self, sizes: dict | None = None, target: str | None = None):
        """The Program for these symbol sizes (arrays made by `example_args`)."""
        return self.lower(*self.example_args(sizes), target=target)

    def with_schedule(self, schedule) -> "Function":
        """The same function compiled with these knobs (a new Function; this one is unchanged)."""
        return Function(self.fn, name=self.name, target=self.target, schedule=schedule)

    def interpret(self, *args, **kwargs):
        """Run the traced graph with each operator's NumPy reference (no compiler involved)."""
        try:
            arrays, statics, bindings = self._bind(args, kwargs)
            self._check_symbolic(arrays, statics, bindings)
            g = self._trace({n: type_of_array(a) for n, a in arrays.items()}, statics, bindings)
            self._check_graph_return(g, bindings, bindings)
            out = evaluate_graph(g, list(arrays.values()))
        except TesseraError as e:
            raise e.with_traceback(None) from None
        if g.output_tree is not None:
            return g.output_tree.unflatten(out)
        return out[0] if g.output_structure == "single" else (
            tuple(out) if g.output_structure == "tuple" else out)


def _raising_user_line(e: BaseException):
    """Where in the user's code an exception raised inside the library came from: the
    innermost frame of its traceback outside the tessera package."""
    loc, tb = None, e.__traceback__
    while tb is not None:
        if not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PKG_DIR):
            loc = frame_location(tb.tb_frame, tb.tb_lineno)
        tb = tb.tb_next
    return loc


def _def_location(fn):
    """The line of the `def` itself (co_firstlineno points at the first decorator)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    line = code.co_firstlineno
    for k in range(line, line + 20):
        text = linecache.getline(code.co_filename, k, getattr(fn, "__globals__", None)).strip()
        if text.startswith(("def ", "async def ")) or "lambda" in text:
            return SourceLocation(code.co_filename, k, text, fn.__name__)
    return SourceLocation(code.co_filename, line, "", fn.__name__)


def evaluate_graph(g: Graph, arrays) -> list:
    """Evaluate a Graph IR node by node with the NumPy references."""
    env = {p.id: np.asarray(a) for p, a in zip(g.params, arrays)}
    live = {v.id for v in g.outputs}
    for n in reversed(g.nodes):        # a result nobody uses is not computed (as when compiled)
        if n.out.id in live:
            live.update(v.id for v in n.inputs)
    for n in g.nodes:
        if n.out.id not in live:
            continue
        if n.op == "const":
            env[n.out.id] = n.attrs["value"]
            continue
        try:
            r = run_reference(n.opdef, [env[v.id] for v in n.inputs], n.attrs)
        except IndexError as e:
            raise RuntimeFault(str(e), function=g.name, location=n.loc, op=n.op) from None
        env[n.out.id] = np.asarray(r, dtype=n.out.type.dtype.np)
    return [np.array(env[v.id]) for v in g.outputs]


_FAST_ENTRIES = 256                 # launchers kept per function (each holds a program)


def _array_signature(args):
    """The key of the fast path: each argument's dtype and shape, or None unless every
    argument is a plain C-contiguous NumPy array."""
    key = []
    for a in args:
        if type(a) is not np.ndarray or not a.flags.c_contiguous:
            return None
        key.append((a.dtype, a.shape))
    return tuple(key)


def _inside_trace(args, kwargs) -> bool:
    """Is any argument, or any leaf of a container argument, a traced tensor? (Arrays are
    checked directly: this runs on every call.)"""
    for a in (*args, *kwargs.values()):
        if isinstance(a, Traced):
            return True
        if isinstance(a, (dict, list, tuple)) and \
                any(isinstance(leaf, Traced) for leaf in pytree.leaves(a)):
            return True
    return False


def _is_arraylike(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic, list)) or hasattr(x, "__array__") or \
        _on_device(x)


def _on_device(x) -> bool:
    """A GPU array (CuPy's, or anything with the CUDA array interface)."""
    return hasattr(x, "__cuda_array_interface__")


def _is_tree(x) -> bool:
    """A pytree argument: a dict, or a list/tuple that holds more than (nested lists of)
    Python numbers: those stay what they were, an array (list) or a static value (tuple)."""
    return isinstance(x, dict) or isinstance(x, (list, tuple)) and not _plain(x)


def _plain(x) -> bool:
    if isinstance(x, (list, tuple)):
        return all(_plain(v) for v in x)
    return isinstance(x, (bool, int, float, complex, str))


def _is_nested(result) -> bool:
    return isinstance(result, dict) or isinstance(result, (list, tuple)) and any(
        pytree.is_container(r) for r in result)


def _path_str(path) -> str:
    return "".join(f"[{k!r}]" for k in path) or "the top"


def _leaf_name(name: str, path, taken) -> str:
    """A graph parameter name for a pytree leaf: an identifier, unique in the graph."""
    base = "_".join([name] + [re.sub(r"\W", "_", str(k)) for k in path])
    out, k = base, 1
    while out in taken:
        out, k = f"{base}_{k}", k + 1
    return out


class _TreeArg:
    """A pytree argument as bound for one call: its structure and, per leaf, the tensor
    parameter it became ("param", name) or its static value ("static", value). Its repr is part
    of the compiled program's cache key."""
    __slots__ = ("treedef", "slots")

    def __init__(self, treedef, slots):
        self.treedef, self.slots = treedef, tuple(slots)

    def __repr__(self):
        kinds = ",".join(x if kind == "param" else f"{type(x).__name__}:{x!r}"
                         for kind, x in self.slots)
        return f"tree{self.treedef!r}<{kinds}>"


class _NoProgram:
    """What a call compiles to when all its results are static (e.g. only None gradients)."""

    def __init__(self, g):
        self.graph_ir = g
        self.output_structure = g.output_structure

    def run(self, *arrays):
        return []


def _spec_dims(fn: Function, name):
    for p in fn._params:
        if p.name == name and p.spec is not None:
            return p.spec.dims
    return None


def _static_key(statics: dict):
    # repr, not ==: 1, 1.0, True and -0.0 trace differently though they compare equal
    return tuple(sorted((k, type(v).__name__, repr(v)) for k, v in statics.items()))


def _opaque(d) -> bool:
    """A dimension holding an expression Tessera cannot reason about, such as (D//3)."""
    return isinstance(d, Sym) and any("(" in a for a in d.atoms())


def _has_reduction_upto(v) -> bool:
    seen, stack = set(), [v]
    while stack:
        x = stack.pop()
        if x.node is None or x.id in seen:
            continue
        seen.add(x.id)
        if x.node.attrs.get("keepdim") is False:
            return True
        stack.extend(x.node.inputs)
    return False


def _has_reduction(g: Graph) -> bool:
    """Does the graph reduce away an axis (a keepdim=False reduction) on the way to its outputs?"""
    return any(_has_reduction_upto(v) for v in g.outputs)


def function(fn=None, *, name: str | None = None, target: str = "cpu", schedule=None):
    """Decorator: compile a Python function with Tessera. ``@function`` or
    ``@function(name=..., schedule=tessera.Schedule(block=(96, 256)))``."""
    if fn is None:
        return lambda f: Function(f, name=name, target=target, schedule=schedule)
    return Function(fn, name=name, target=target, schedule=schedule)


def interpret(fn, *args, **kwargs):
    """Run ``fn`` (a tessera function or a plain Python function) with the NumPy references."""
    f = fn if isinstance(fn, Function) else Function(fn)
    return f.interpret(*args, **kwargs)



