"""A function's signature and the binding of a call's arguments to it: arrays to tensor
parameters (pytree arguments to one parameter per array leaf), other values to static ones,
each annotated parameter's dtype, rank and sizes checked, and its symbols bound (B=4, S=16)."""
from __future__ import annotations

import inspect
import linecache
import re

import numpy as np

from .. import dtypes as dt
from .. import pytree
from ..compiler.graph_ir import SourceLocation
from ..errors import ArgumentError, DTypeError, RankError, ShapeError, SymbolMismatchError, enrich
from ..shapes import Sym, evaluate, fmt_shape, same
from ..types import spec_of
from . import extensions


class AnnotatedParam:
    """One parameter of a traced function with its annotation (`Tensor["B", "S"]`), if any."""

    def __init__(self, p: inspect.Parameter):
        self.name = p.name
        self.spec = spec_of(p.annotation) if p.annotation is not inspect.Parameter.empty else None
        # each annotated dimension as (size, None) or (None, symbol name), for fast binding
        self.dims = None if self.spec is None or self.spec.dims is None else [
            (d, None) if isinstance(d, int) else (None, str(d)) for d in self.spec.dims]


class Signature:
    """What a call is checked against: the parameters with their annotations, the return
    annotation, and where the function was defined (for messages)."""

    def __init__(self, fn, name: str):
        self.name = name
        try:
            sig = inspect.signature(fn, eval_str=True)
        except (NameError, TypeError, ValueError) as e:
            raise ArgumentError(f"cannot read the signature of {fn.__name__}: {e}") from None
        self.sig = sig
        self.params = [AnnotatedParam(p) for p in sig.parameters.values()]
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
            raise ArgumentError(f"{name}: *args and **kwargs parameters are not supported")
        ret = sig.return_annotation
        self.ret_spec = None if ret is inspect.Signature.empty else spec_of(ret)
        self.def_loc = def_location(fn)
        self.policy = None              # the function's NumericalPolicy (Function sets it)

    def __repr__(self):
        return ", ".join(f"{p.name}: {p.spec!r}" if p.spec else p.name for p in self.params)

    # -- binding ---------------------------------------------------------------------------------
    def bind(self, args, kwargs):
        """(tensor arrays by param, static values, bindings) with every mismatch reported."""
        bound = self.bind_python(args, kwargs)
        arrays, statics, bindings, origin = {}, {}, {}, {}
        for p in self.params:
            x = bound.arguments[p.name]
            if p.spec is None and is_tree(x):
                statics[p.name] = self._bind_tree(p.name, x, arrays)
                continue
            if p.spec is None and not is_arraylike(x):
                try:
                    hash(x)
                except TypeError:
                    raise ArgumentError(f"argument {p.name!r} is neither an array nor a hashable "
                                        f"static value: {type(x).__name__}",
                                        function=self.name) from None
                statics[p.name] = x
                continue
            try:
                # a CuPy array stays on its device; PyTorch's and JAX's through DLPack
                arr = x if on_device(x) else extensions.as_array(x)
            except ValueError as e:
                raise ArgumentError(f"argument {p.name!r} is not an array: {e}",
                                    function=self.name) from None
            if arr.dtype == object:             # None, a string, a ragged list
                raise ArgumentError(
                    f"argument {p.name!r} is {type(x).__name__}, not an array of numbers",
                    function=self.name, location=self.def_loc,
                    expected=p.spec.type_str() if p.spec is not None else "an array",
                    received=repr(x)[:60])
            try:
                d = dt.from_numpy(arr.dtype)
            except DTypeError as e:
                e.summary = f"argument {p.name!r}: {e.summary}"
                raise enrich(e, function=self.name) from None
            if p.spec is not None:
                self.check_spec(p, arr.shape, d, bindings, origin)
            arrays[p.name] = arr if arr is x and on_device(x) else dt.native(arr)
        return arrays, statics, bindings

    def _bind_tree(self, name: str, tree, arrays: dict) -> "TreeArg":
        """A nested dict/list/tuple argument: each array leaf becomes a tensor parameter named
        after its path (params_w1), each other leaf a static value of the tree."""
        leaves, treedef = pytree.flatten(tree)
        taken = {p.name for p in self.params} | set(arrays)
        slots = []
        for path, leaf in zip(treedef.paths(), leaves):
            if not is_arraylike(leaf):
                try:
                    hash(leaf)
                except TypeError:
                    raise ArgumentError(f"argument {name!r} holds {type(leaf).__name__} at "
                                        f"{path_str(path)}: neither an array nor a hashable "
                                        "static value", function=self.name) from None
                slots.append(("static", leaf))
                continue
            arr = leaf if on_device(leaf) else extensions.as_array(leaf)   # CuPy leaves stay put
            try:
                dt.from_numpy(arr.dtype)
            except DTypeError as e:
                e.summary = f"argument {name!r} at {path_str(path)}: {e.summary}"
                raise enrich(e, function=self.name) from None
            pname = leaf_name(name, path, taken)
            taken.add(pname)
            arrays[pname] = arr if arr is leaf and on_device(leaf) else dt.native(arr)
            slots.append(("param", pname))
        return TreeArg(treedef, slots)

    def bind_python(self, args, kwargs) -> inspect.BoundArguments:
        try:
            bound = self.sig.bind(*args, **kwargs)
        except TypeError as e:
            raise ArgumentError(f"{self.name}() {e}", function=self.name,
                                location=self.def_loc,
                                expected=f"{self.name}{self.sig}") from None
        bound.apply_defaults()
        return bound

    def check_spec(self, p, shape, d, bindings, origin):
        """Check one argument's dtype, rank and sizes against its annotation; bind its symbols.

        `shape` may hold symbols (a call from inside another trace); those bind like sizes."""
        spec = p.spec
        received = f"{d.short}{fmt_shape(shape)}"      # for the messages below
        if spec.dtype is not None and spec.dtype != d:
            raise DTypeError(f"argument {p.name!r} has the wrong dtype", function=self.name,
                             location=self.def_loc, expected=spec.type_str(), received=received,
                             hint=f"convert with x.astype(np.{spec.dtype.name})")
        if p.dims is None:
            return
        if len(shape) != len(p.dims):
            raise RankError(f"argument {p.name!r} has rank {len(shape)}, the annotation rank "
                            f"{len(p.dims)}", function=self.name, location=self.def_loc,
                            expected=spec.type_str(d), received=received)
        for k, ((want, name), got) in enumerate(zip(p.dims, shape)):
            if name is None:
                if not same(want, got):
                    raise ShapeError(f"argument {p.name!r} has size {got} on axis {k}, the "
                                     f"annotation {want}", function=self.name,
                                     location=self.def_loc, expected=spec.type_str(d),
                                     received=received)
                continue
            if name in bindings and not same(bindings[name], got):
                raise SymbolMismatchError(
                    f"the arguments disagree on {name}: {name}={bindings[name]} from "
                    f"{origin[name]}, {name}={got} from {p.name!r} axis {k}",
                    function=self.name, location=self.def_loc,
                    expected=spec.type_str(d) + f" with {name}={bindings[name]}",
                    received=received)
            bindings[name] = got
            origin.setdefault(name, f"{p.name!r} axis {k}")

    # -- what the annotations say ----------------------------------------------------------------
    def annotated(self) -> bool:
        """Does some parameter carry a Tensor annotation with a rank?"""
        return any(p.spec is not None and p.spec.dims is not None for p in self.params)

    def spec_dims(self, name):
        for p in self.params:
            if p.name == name and p.spec is not None:
                return p.spec.dims
        return None

    def annotated_symbols(self) -> set:
        return {a for p in self.params if p.spec is not None and p.spec.dims is not None
                for d in p.spec.dims if isinstance(d, Sym) for a in d.atoms()}

    def symbols(self) -> list[str]:
        """The symbolic dimension names of the annotations, in order of first appearance."""
        out = []
        for p in self.params:
            for d in (p.spec.dims or ()) if p.spec is not None else ():
                for name in ([] if isinstance(d, int) else sorted(d.atoms())):
                    if name not in out:
                        out.append(name)
        return out

    def example_args(self, sizes: dict | None = None, seed: int = 0) -> list:
        """Arrays for the annotated parameters with these sizes for the symbols: standard normal
        floats from a fixed seed, zeros for integers, False for bools."""
        sizes = dict(sizes or {})
        missing = [s for s in self.symbols() if s not in sizes]
        if missing:
            raise ArgumentError(f"{self.name} needs sizes for {', '.join(missing)}",
                                function=self.name,
                                hint="give every symbol, e.g. " +
                                     ",".join(f"{s}=8" for s in self.symbols()))
        rng = np.random.default_rng(seed)
        args = []
        for p in self.params:
            if p.spec is None or p.spec.dims is None:
                default = self.sig.parameters[p.name].default
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


class TreeArg:
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


def def_location(fn):
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


def static_key(statics: dict):
    # repr, not ==: 1, 1.0, True and -0.0 trace differently though they compare equal
    return tuple(sorted((k, type(v).__name__, repr(v)) for k, v in statics.items()))


def is_arraylike(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic, list)) or hasattr(x, "__array__") or \
        on_device(x)


def on_device(x) -> bool:
    """A GPU array (CuPy's, or anything with the CUDA array interface)."""
    return hasattr(x, "__cuda_array_interface__")


def is_tree(x) -> bool:
    """A pytree argument: a dict, or a list/tuple that holds more than (nested lists of)
    Python numbers: those stay what they were, an array (list) or a static value (tuple)."""
    return isinstance(x, dict) or isinstance(x, (list, tuple)) and not _plain(x)


def _plain(x) -> bool:
    if isinstance(x, (list, tuple)):
        return all(_plain(v) for v in x)
    return isinstance(x, (bool, int, float, complex, str))


def path_str(path) -> str:
    return "".join(f"[{k!r}]" for k in path) or "the top"


def leaf_name(name: str, path, taken) -> str:
    """A graph parameter name for a pytree leaf: an identifier, unique in the graph."""
    base = "_".join([name] + [re.sub(r"\W", "_", str(k)) for k in path])
    out, k = base, 1
    while out in taken:
        out, k = f"{base}_{k}", k + 1
    return out
