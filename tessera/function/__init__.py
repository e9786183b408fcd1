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

The rooms, the data passing one way: a call takes the fast path (fastpath.py) or binds its
arguments (binding.py), finds or makes its program (programs.py: the cache), which traces the
function (tracing.py); `interpret` evaluates the traced graph instead (interpreter.py). Debug
mode, ONNX export and other libraries' arrays come from modules above this package, which
register themselves in extensions.py when imported.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from .. import dtypes as dt, numerics, pytree
from ..compiler.graph_ir import Graph
from ..compiler.saved import save
from ..errors import ArgumentError, SymbolicValueError, TesseraError
from ..runtime import cache
from ..runtime.isa import ENV as CPU_TARGET_ENV
from ..schedule import Schedule
from ..trace import is_training
from ..types import type_of_array
from . import extensions, fastpath, tracing
from .binding import Signature, TreeArg, def_location  # noqa: F401 (the transforms use them)
from .interpreter import evaluate_graph, structured
from .programs import ProgramCache


class Function:
    _may_return_none = False     # a transform's result may be None (no gradient)

    def __init__(self, fn, name: str | None = None, target: str = "cpu", schedule=None,
                 policy=None, dynamic=()):
        if not callable(fn):
            raise ArgumentError(f"tessera.function needs a Python function, got {fn!r}")
        if not hasattr(fn, "__name__"):         # a callable object (a model): its __call__
            name = name or type(fn).__name__
            fn = fn.__call__
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name or fn.__name__
        self.target = target
        if schedule is not None and not isinstance(schedule, Schedule):
            raise ArgumentError(f"schedule must be a tessera.Schedule, not {schedule!r}")
        self.schedule = schedule
        self.signature = Signature(fn, self.name)
        # a numerical policy around the whole body (tessera/numerics.py)
        self.policy = self.signature.policy = None if policy is None else \
            numerics.as_policy(policy)
        self.programs = ProgramCache(self.signature, fn, self._may_return_none,
                                     _dynamic_symbols(dynamic, self.signature, self.name))
        self._fast: dict = {}           # (CPU target env, array types) -> launcher

    def __repr__(self):
        return f"<tessera.function {self.name}({self.signature!r})>"

    @property
    def dynamic(self) -> tuple:
        """The symbols whose sizes vary from call to call (compiler/dynamic.py)."""
        return self.programs.dynamic

    # -- a call ----------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        checks = extensions.debug        # (set while a debug block is open: tessera/debug.py)
        if checks is not None and checks[0]() and not tracing.inside_trace(args, kwargs):
            try:
                return checks[1](self, args, kwargs)
            except TesseraError as e:
                raise e.with_traceback(None) from None
        key = None if kwargs else fastpath.array_signature(args)
        leaves = args
        if key is None and not kwargs and any(type(a) in (dict, list, tuple) for a in args):
            tree = fastpath.tree_signature(args)
            if tree is not None:
                leaves, key = tree
        if key is not None:
            # "cpu" resolves through the environment; the training mode and a policy region
            # are traced in
            key = (os.environ.get(CPU_TARGET_ENV), is_training(), numerics.current(), key)
            launch = self._fast.get(key)
            if launch is not None:
                cache.count("memory_hits")
                try:
                    return launch(leaves)
                except TesseraError as e:
                    raise e.with_traceback(None) from None
        if tracing.inside_trace(args, kwargs):
            return self._inline(args, kwargs)
        sharded = _call_hook(args, kwargs)
        if sharded is not None:        # sharded tensors (tessera.dist): planned and run SPMD
            try:
                return sharded(self, args, kwargs)
            except TesseraError as e:
                raise e.with_traceback(None) from None
        try:
            prog, arrays = self._program(args, kwargs, self.target)
            if key is not None and len(self._fast) < fastpath.FAST_ENTRIES:
                launch = fastpath.launcher(prog, leaves, arrays)
                if launch is not None:
                    self._fast[key] = launch
            if prog.output_tree is not None:
                out = prog.output_tree.unflatten(prog.run(*arrays.values()))
            else:
                out = prog(*arrays.values())
            # PyTorch tensors in, PyTorch tensors out (tessera/interop.py registers it)
            convert = extensions.convert_results
            return out if convert is None else convert(out, [*args, *kwargs.values()])
        except TesseraError as e:
            raise e.with_traceback(None) from None

    # the steps a transform (tessera/autodiff.py) adjusts
    def _bind(self, args, kwargs):
        return self.signature.bind(args, kwargs)

    def _inline(self, args, kwargs):
        return tracing.inline(self.signature, self.fn, args, kwargs)

    def _trace(self, types: dict, statics: dict, bindings=None) -> Graph:
        return self.programs.trace(types, statics, bindings)

    def _program(self, args, kwargs, target):
        return self.programs.program(self._bind(args, kwargs), target, self.schedule)

    # -- public -----------------------------------------------------------------------------------
    @property
    def graph_ir(self) -> Graph:
        """The symbolic Graph IR, traced from the annotations (float32 where they name no dtype)."""
        params = self.signature.params
        annotated = [p for p in params if p.spec is not None]
        missing = [p.name for p in params if p.spec is None]
        if missing or not annotated:
            if self.programs.last is not None:
                return self.programs.last.graph_ir
            raise ArgumentError(f"{self.name} has unannotated parameters ({', '.join(missing)}); "
                                "its Graph IR needs example arguments", function=self.name,
                                hint=f"use {self.name}.lower(*arrays).graph_ir, or annotate them "
                                     "with Tensor[...]")
        try:
            g = self._trace(tracing.symbolic_types(self.signature, {}, dt.float32), {})
        except TesseraError as e:
            raise e.with_traceback(None) from None
        except TypeError as e:
            raise SymbolicValueError(f"{self.name} cannot be traced with symbolic sizes: {e}",
                                     function=self.name, location=self.signature.def_loc,
                                     hint=f"its code needs sizes as numbers; use "
                                          f"{self.name}.lower(*arrays).graph_ir") from None
        try:
            tracing.check_graph_return(self.signature, g, {}, None)
        except TesseraError as e:
            raise e.with_traceback(None) from None
        return g

    def lower(self, *args, target: str | None = None, **kwargs):
        """The Program for these arguments: every IR level, the C source, and the compiled code."""
        try:
            return self._program(args, kwargs, target or self.target)[0]
        except TesseraError as e:
            raise e.with_traceback(None) from None

    def export(self, path, *example, format: str = "onnx", opset_version: int = 17,
               batch_sizes=None, batch_argnums=None, **kwargs):
        """This function traced on the example arguments, written to `path`: an ONNX model
        (``format="onnx"``, tessera/onnx.py; returns the ModelProto), or the seeds'
        ``format="tessera_server"``: the programs for each of `batch_sizes` (the first axis
        of the arguments in `batch_argnums`, default every array argument; CPU ones unless
        ``target="cuda"`` or ``"hip"``) in one saved file that ``ts.load`` serves without a
        compiler (compiler/saved.py; returns the path)."""
        if format == "tessera_server":
            return self._export_server(path, example, batch_sizes, batch_argnums, kwargs)
        if format not in extensions.exporters:      # (tessera/onnx.py registers "onnx")
            raise ArgumentError(f"export format must be 'onnx' or 'tessera_server', not "
                                f"{format!r}")
        return extensions.exporters[format](self, path, *example, opset_version=opset_version,
                                            **kwargs)

    def _export_server(self, path, example, batch_sizes, batch_argnums, kwargs):
        nums = batch_argnums if batch_argnums is not None else [
            k for k, a in enumerate(example) if isinstance(a, np.ndarray) and a.ndim >= 1]
        programs = []
        for b in (batch_sizes or [None]):
            args = [np.zeros((int(b),) + np.shape(a)[1:], np.asarray(a).dtype)
                    if b is not None and k in nums else a for k, a in enumerate(example)]
            programs.append(self.lower(*args, **kwargs))
        return save(programs, path)

    def forget_programs(self):
        """Drop every compiled program (and fast-path launcher): the next call compiles anew."""
        self.programs.forget()
        self._fast.clear()

    def symbols(self) -> list[str]:
        """The symbolic dimension names of the annotations, in order of first appearance."""
        return self.signature.symbols()

    def example_args(self, sizes: dict | None = None, seed: int = 0) -> list:
        """Arrays for the annotated parameters with these sizes for the symbols (`B=8, S=128`):
        standard normal floats from a fixed seed, zeros for integers, False for bools. What the
        notebook explorer lowers and profiles with when given only shapes."""
        return self.signature.example_args(sizes, seed)

    def specialize(self, sizes: dict | None = None, target: str | None = None):
        """The Program for these symbol sizes (arrays made by `example_args`)."""
        return self.lower(*self.example_args(sizes), target=target)

    def with_schedule(self, schedule) -> "Function":
        """The same function compiled with these knobs (a new Function; this one is unchanged)."""
        return Function(self.fn, name=self.name, target=self.target, schedule=schedule,
                        policy=self.policy, dynamic=self.dynamic)

    def interpret(self, *args, **kwargs):
        """Run the traced graph with each operator's NumPy reference (no compiler involved)."""
        try:
            arrays, statics, bindings = self._bind(args, kwargs)
            self.programs.check_symbolic(arrays, statics, bindings)
            g = self._trace({n: type_of_array(a) for n, a in arrays.items()}, statics, bindings)
            tracing.check_graph_return(self.signature, g, bindings, bindings)
            out = evaluate_graph(g, list(arrays.values()))
        except TesseraError as e:
            raise e.with_traceback(None) from None
        return structured(g, out)


def _dynamic_symbols(dynamic, sig, name) -> tuple:
    """The checked names of `dynamic=`: symbols of the annotations (True: all of them)."""
    known = sig.symbols()
    if dynamic is True:
        return tuple(known)
    names = (dynamic,) if isinstance(dynamic, str) else tuple(dynamic or ())
    for s in names:
        if s not in known:
            raise ArgumentError(f"dynamic={names!r} names {s!r}, which no annotation of "
                                f"{name} uses", function=name, location=sig.def_loc,
                                expected=" or ".join(map(repr, known)) or "a symbol of a "
                                "Tensor[...] annotation",
                                hint="annotate the parameters whose sizes vary, e.g. "
                                     "x: Tensor[\"B\", 784], and name their symbols")
    return names


def _call_hook(args, kwargs):
    """The call of an argument's type that runs calls itself (extensions.callers: a sharded
    tensor), or None."""
    for x in pytree.flatten((args, kwargs))[0]:
        hook = extensions.callers.get(type(x))
        if hook is not None:
            return hook
    return None


def function(fn=None, *, name: str | None = None, target: str = "cpu", schedule=None,
             policy=None, dynamic=()):
    """Decorator: compile a Python function with Tessera. ``@function`` or
    ``@function(name=..., schedule=tessera.Schedule(block=(96, 256)))``; ``policy=`` a
    tessera.NumericalPolicy for every operator of its body (tessera/numerics.py);
    ``dynamic=("B", "S")``: symbols of the annotations whose sizes vary from call to call (True:
    every symbol), so that a program compiled at one size serves the others where it computes
    exactly what theirs would (compiler/dynamic.py; CPU targets)."""
    if fn is None:
        return lambda f: Function(f, name=name, target=target, schedule=schedule, policy=policy,
                                  dynamic=dynamic)
    return Function(fn, name=name, target=target, schedule=schedule, policy=policy,
                    dynamic=dynamic)


def interpret(fn, *args, **kwargs):
    """Run ``fn`` (a tessera function or a plain Python function) with the NumPy references."""
    f = fn if isinstance(fn, Function) else Function(fn)
    return f.interpret(*args, **kwargs)
