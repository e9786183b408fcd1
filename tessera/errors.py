"""One error hierarchy for every way a Tessera program can be wrong.

A message says what is wrong, where (the user's file and line, and the op), what was expected,
what came, and a hint when one is known.
"""
from __future__ import annotations

import os
import sys

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def first_user_frame(start: int = 1):
    """(frame, depth): the innermost caller outside the tessera package (and contextlib), and
    how many frames above the caller of this function it is. (None, depth) if there is none."""
    f, depth = sys._getframe(start + 1), 1
    while f is not None:
        name = f.f_code.co_filename
        if not os.path.abspath(name).startswith(_PKG_DIR) and "contextlib" not in name:
            return f, depth
        f, depth = f.f_back, depth + 1
    return None, depth


class TesseraError(Exception):
    """Base of every error Tessera raises on purpose."""

    def __init__(self, message: str, *, function: str | None = None, location=None,
                 op: str | None = None, expected: str | None = None,
                 received: str | None = None, hint: str | None = None):
        self.summary = message
        self.function = function
        self.location = location          # a SourceLocation or None
        self.op = op
        self.expected = expected
        self.received = received
        self.hint = hint
        self.partial_graph = None         # a trace that stopped here: the Graph IR built so far
        self.failed_inputs = ()           # and the values the failing op was given
        super().__init__(self._format())

    def _format(self) -> str:
        head = type(self).__name__
        where = []
        if self.function:
            where.append(f"in {self.function}")
        if self.location is not None:
            where.append(f"at {self.location}")
        if self.op:
            where.append(f"({self.op})")
        lines = [" ".join([head] + where) if where else head, f"  {self.summary}"]
        if self.location is not None and getattr(self.location, "text", None):
            lines.append(f"  | {self.location.text}")
        if self.expected is not None:
            lines.append(f"  expected  {self.expected}")
        if self.received is not None:
            lines.append(f"  received  {self.received}")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self._format()

    def _render_traceback_(self):
        # IPython shows these lines instead of a long traceback through the compiler.
        return self._format().splitlines()


class ShapeError(TesseraError):
    """Shapes that do not fit an operator, an annotation or each other."""


class RankError(ShapeError):
    """An argument's rank differs from its annotation's."""


class SymbolMismatchError(ShapeError):
    """Arguments bind one symbolic dimension to two sizes (B=4 here, B=5 there)."""


class SymbolicValueError(ShapeError):
    """Python code asked a symbolic dimension for its number while tracing."""


class DTypeError(TesseraError):
    """A dtype an operator does not accept, or two that do not promote."""


class UnsupportedDTypeError(DTypeError):
    """A dtype Tessera does not (yet) compute with."""


class ArgumentError(TesseraError):
    """Wrong number or kind of arguments to a Tessera function or operator."""


class AnnotationError(ArgumentError, TypeError):
    """A Tensor[...] annotation that cannot be read: a dimension that is neither a name nor a
    size (still a TypeError, as Python's own annotation errors are)."""


class TracingError(TesseraError):
    """A traced tensor used where a concrete value is needed (if, float(), np.* functions)."""


class CompileError(TesseraError):
    """The system compiler rejected generated code; the message holds its log and the source path."""


class BackendUnavailableError(TesseraError):
    """A backend (C compiler, CUDA, HIP) is missing on this machine."""


class CompilerNotFoundError(BackendUnavailableError):
    """No C compiler could be run."""


class IRVerificationError(TesseraError):
    """An IR object is malformed: a compiler bug, never the user's fault."""


class RuntimeFault(TesseraError):
    """A kernel detected bad data while running (an index out of range, say)."""


class ResourceError(TesseraError):
    """Memory for a program's buffers could not be had."""


class DifferentiationError(TesseraError):
    """A function cannot be differentiated as asked: an operator without an adjoint rule, a
    non-float or non-scalar output given to grad, a cotangent of the wrong shape."""


class GradientCheckError(TesseraError, AssertionError):
    """``tessera.check_grad`` found a gradient that disagrees with finite differences."""


class ShardingError(TesseraError):
    """A sharded tensor's layout is not possible: a mesh axis the mesh lacks, a dimension that
    does not divide by its mesh axes, two meshes in one operation (tessera.dist)."""


class DeviceError(TesseraError):
    """A device failed while running a program (a GPU's driver or runtime error): what
    ``ts.fault_tolerant`` and ``ts.recover_and_continue`` roll back from."""


class RankFailure(TesseraError):
    """A rank of a distributed run failed (or died, or ran past its time): raised in the
    launching process with the rank and its error (tessera.dist.launch)."""

    def __init__(self, message: str, *, rank: int | None = None, **kw):
        self.rank = rank
        super().__init__(message, **kw)


def enrich(err: TesseraError, *, function=None, location=None, op=None) -> TesseraError:
    """The error with what it did not know yet filled in: the function, the line, the operator."""
    if err.function is None and function:
        err.function = function
    if err.location is None and location is not None:
        err.location = location
    if err.op is None and op:
        err.op = op
    err.args = (err._format(),)         # repr() and pickling see the whole message
    return err
