"""`@ts.kernel`: `KernelFunction`, what the decorator makes of a function over Tile[...]
parameters: traced once per parameter dtypes, checked on every call, run as a tessera function
of one `tile_program` node."""
from __future__ import annotations

from .. import dtypes as dt
from ..errors import ArgumentError, DTypeError, ShapeError, TracingError
from ..trace import apply, user_location
from ..types import TensorSpec
from . import lowering, operator  # noqa: F401 (register tile_program, the node this module
                                  # makes, and its strategy)
from .annotations import TileSpec
from .interpreter import interpret
from .ir import KernelBody, KernelParam, KernelValue, ReturnStmt, type_text
from .placement import resolve
from .semantic import ParamRef, as_value
from .tracer import Tracer, tracing


class KernelFunction:
    """`@ts.kernel def f(A: Tile[...], ...)`: call it with arrays to run it; `lower(...)` gives
    its Program. A parameter the body stores into is the output: the kernel computes it into a
    new array and copies that into the caller's array, which the call returns (a kernel that
    returns a tile returns a new array)."""

    def __init__(self, fn, target="cpu", schedule=None):
        import functools
        import inspect
        functools.update_wrapper(self, fn)
        self.fn, self.name, self.target, self.schedule = fn, fn.__name__, target, schedule
        try:
            sig = inspect.signature(fn, eval_str=True)
        except Exception as e:                       # noqa: BLE001 (an annotation that fails)
            raise ArgumentError(f"cannot read the signature of {fn.__name__}: {e}") from None
        self.specs = []
        for p in sig.parameters.values():
            if not isinstance(p.annotation, TileSpec):
                raise ArgumentError(f"tile kernel {self.name}: parameter {p.name!r} needs a "
                                    f"Tile[...] annotation", hint='A: Tile["M", "K", f32]')
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise ArgumentError(f"tile kernel {self.name}: *args, **kwargs and "
                                    f"keyword-only parameters are not supported ({p.name})")
            self.specs.append((p.name, p.annotation))
        ret = sig.return_annotation
        if ret is not sig.empty and not isinstance(ret, TileSpec):
            raise ArgumentError(f"tile kernel {self.name}: the return annotation must be a "
                                f"Tile[...], not {ret!r}")
        self.returns = ret if isinstance(ret, TileSpec) else None
        self.tuning = None              # @ts.kernel.autotune: wraps each function
        self.bodies: dict = {}          # parameter dtypes -> KernelBody
        self.functions: dict = {}       # (parameter dtypes, target) -> Function

    def __repr__(self):
        ps = ", ".join(f"{n}: {s!r}" for n, s in self.specs)
        return f"<tessera tile kernel {self.name}({ps})>"

    # -- tracing -----------------------------------------------------------------------------------
    def body(self, dtypes) -> KernelBody:
        dtypes = tuple(dtypes)
        b = self.bodies.get(dtypes)
        if b is None:
            b = self.bodies[dtypes] = self._trace(dtypes)
        return b

    def _trace(self, dtypes) -> KernelBody:
        params = [KernelParam(n, s.dims, d) for (n, s), d in zip(self.specs, dtypes)]
        body = KernelBody(self.name, params)
        t = Tracer(body)
        before = tracing(t)
        try:
            ret = self.fn(*[ParamRef(t, p) for p in params])
            if t.broken is not None:
                raise TracingError("a break (or return) out of a tile.range_k loop: the loop is "
                                   "traced once and runs for every k, so it would be ignored",
                                   location=t.broken,
                                   hint="narrow the loop's range instead (range_k's stop)")
            if ret is not None:
                v = as_value(ret)
                if v is None:
                    raise TracingError(f"tile kernel {self.name} returns {ret!r}, not a tile")
                if body.output is not None:
                    raise TracingError("a tile kernel has one output: it stores into a "
                                       "parameter and returns a tile")
                self._check_return(v, body)
                body.output = t.emit(ReturnStmt(value=v, loc=v.loc))   # (the caller's frame varies)
        finally:
            tracing(before)
        resolve(body)
        return body

    def _check_return(self, v: KernelValue, body: KernelBody):
        """The returned tile against the return annotation: the same dimensions in order; its
        dtype, if named, is what the result is stored as (rounded once)."""
        spec = self.returns
        if spec is None:
            return
        if tuple(v.dims) != tuple(spec.dims):
            raise ShapeError(f"tile kernel {self.name} returns a tile over "
                             f"[{', '.join(str(d) for d in v.dims)}], its annotation says "
                             f"{spec!r}", location=v.loc, received=type_text(v))
        if spec.dtype is not None:
            body.out_dtype = spec.dtype

    # -- calls -------------------------------------------------------------------------------------
    def _output_arg(self, body, args):
        return args[[n for n, _ in self.specs].index(body.output_param)]

    def _check(self, args):
        """The body for these arguments' dtypes, after checking them; an error names the
        caller's line (found only then: calls pay nothing for it)."""
        import numpy as np
        if len(args) != len(self.specs):
            raise ArgumentError(f"tile kernel {self.name} takes {len(self.specs)} arrays, got "
                                f"{len(args)}", location=user_location())
        sizes, dtypes = {}, []
        for (name, spec), a in zip(self.specs, args):
            if not hasattr(a, "shape") or not hasattr(a, "dtype"):
                raise ArgumentError(f"argument {name!r} of {self.name} must be an array, not "
                                    f"{type(a).__name__}", location=user_location())
            d = dt.get(a.dtype)
            if spec.dtype is not None and d != spec.dtype:
                raise DTypeError(f"argument {name!r} of {self.name} is {d.name}, its annotation "
                                 f"{spec!r} says {spec.dtype.name}", location=user_location(),
                                 hint=f"convert it: {name}.astype(...)")
            if len(a.shape) != len(spec.dims):
                raise ShapeError(f"argument {name!r} of {self.name} has rank {len(a.shape)}, "
                                 f"its annotation {spec!r} rank {len(spec.dims)}",
                                 location=user_location())
            for dname, n in zip(spec.dims, a.shape):
                if sizes.setdefault(dname, n) != n:
                    raise ShapeError(f"dimension {dname} is {sizes[dname]} in one argument "
                                     f"and {n} in {name!r} of {self.name}",
                                     location=user_location())
            dtypes.append(d)
        body = self.body(dtypes)
        if body.output_param is not None:
            out = self._output_arg(body, args)
            if isinstance(out, np.ndarray) and not out.flags.writeable:
                raise ArgumentError(f"output {body.output_param!r} of {self.name} is read-only",
                                    location=user_location())
            for p, a in zip(body.params, args):
                if p.read and p.name != body.output_param and a is not out and _overlap(a, out):
                    raise ArgumentError(f"output {body.output_param!r} of {self.name} overlaps "
                                        f"input {p.name!r}", location=user_location(),
                                        hint="pass a separate output array")
        return body

    def function(self, body: KernelBody, target=None):
        """The tessera function running this body: one tile_program node over every
        parameter (an output parameter is an operand for its shape only, unless read)."""
        import inspect
        from ..function import Function
        target = target or self.target
        key = (tuple(p.dtype for p in body.params), target)
        f = self.functions.get(key)
        if f is None:
            names = [p.name for p in body.params]

            def run(*xs, **named):
                xs = list(xs) + [named[n] for n in names[len(xs):]]
                return apply("tile_program", xs, kernel=body)
            # Tensor annotations from the Tile ones: the function's symbols are the kernel's
            # dimensions (the explorer lowers it from sizes alone)
            run.__signature__ = inspect.Signature(
                [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                   annotation=TensorSpec(p.dims, p.dtype))
                 for p in body.params])
            run.__name__ = run.__qualname__ = self.name
            f = Function(run, name=self.name, target=target, schedule=self.schedule)
            if self.tuning is not None:
                f = self.tuning(f)
            self.functions[key] = f
        return f

    def __call__(self, *args, target=None):
        body = self._check(args)
        result = self.function(body, target)(*args)
        if body.output_param is not None:
            out = self._output_arg(body, args)
            if hasattr(result, "get") and not hasattr(out, "get"):    # a GPU's result, a
                result = result.get()                                   # NumPy output
            out[...] = result
            return out
        return result

    def checked_body(self, args) -> KernelBody:
        """The body for these arguments, after the call's checks (dtypes, ranks, sizes)."""
        return self._check(args)

    @property
    def results(self) -> dict:
        """@ts.kernel.autotune: the searches' results (argument types -> TuneResult) of every
        dtype and target this kernel ran at."""
        out = {}
        for f in self.functions.values():
            out.update(getattr(f, "results", {}))
        return out

    def as_function(self, target=None):
        """The tessera function of this kernel at its annotated dtypes (float32 where a Tile
        annotation names none): what `%%tessera` explores."""
        return self.function(self.body([s.dtype or dt.float32 for _, s in self.specs]), target)

    def lower(self, *args, target=None):
        """The Program for these arguments (Graph, Schedule and Tile IR, target source)."""
        body = self._check(args)
        return self.function(body, target).lower(*args)

    def interpret(self, *args, knobs=None):
        """The output for these arguments computed with NumPy, program by program (the
        operator's reference; `knobs`: the block sizes, {"BM": 16}). Unlike a call, it writes
        into no argument: the stored-into parameter's new value is returned."""
        return interpret(self._check(args), list(args), knobs)

    def ir(self, *args) -> str:
        """The traced tile statements for these arguments' dtypes."""
        return self._check(args).text()


def _overlap(a, b) -> bool:
    """Do arrays a and b share memory (NumPy's check; device arrays by their byte ranges)?"""
    import numpy as np
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.shares_memory(a, b)
    ia, ib = (getattr(x, "__cuda_array_interface__", None) for x in (a, b))
    if ia is None or ib is None:
        return False                    # one on the host, one on a device
    lo_a, lo_b = ia["data"][0], ib["data"][0]
    return lo_a < lo_b + b.nbytes and lo_b < lo_a + a.nbytes


def is_tile_kernel(fn) -> bool:
    """Is fn a Python function whose parameters are all Tile[...]-annotated?"""
    import inspect
    try:
        ps = inspect.signature(fn, eval_str=True).parameters.values()
    except Exception:                               # noqa: BLE001 (not ours to judge)
        return False
    return bool(ps) and all(isinstance(p.annotation, TileSpec) for p in ps)


def kernel(fn=None, *, target="cpu", schedule=None):
    """`@ts.kernel`: a tile kernel (see the package's docstring)."""
    if fn is None:
        return lambda f: KernelFunction(f, target=target, schedule=schedule)
    return KernelFunction(fn, target=target, schedule=schedule)

