"""host_call: a Python function the host runs between a program's kernels (a graph break).

``tessera.migrate.wrap_pytorch`` puts a PyTorch layer into a tessera function this way: the
node's ``fn`` attribute is a `HostFunction` (its name, the call on NumPy arrays, the rule giving
its result type, and its adjoint per operand, itself a host function). The compiler never makes
a kernel of it: a graph holding host calls is compiled in parts, the graph cut at each call
(tessera/compiler/driver.py, `SplitProgram`), and the host runs the call on the arrays the part
before it left. Eager mode and the interpreter call it through the reference.
"""
from __future__ import annotations

from ..errors import DifferentiationError
from .registry import OpDef, register

HOST_OPS = ("host_call",)


class HostFunction:
    """A host function: ``call(arrays) -> array``, ``result_type(types) -> TensorType``,
    ``adjoint(i)`` -> the HostFunction of (*operands, cotangent) giving operand i's cotangent
    (None: not differentiable). Shown in the IR by its name; one object per function, so equal
    calls share programs."""

    def __init__(self, name, call, result_type, adjoint=None):
        self.name, self.call, self.result_type = name, call, result_type
        self._adjoint = adjoint
        self._adjoints: dict = {}

    def adjoint(self, i: int) -> "HostFunction":
        if self._adjoint is None:
            raise DifferentiationError(f"{self.name} has no adjoint (a derivative of a "
                                       "derivative through a host call is not supported)")
        if i not in self._adjoints:
            self._adjoints[i] = self._adjoint(i)
        return self._adjoints[i]

    def __repr__(self):
        return self.name


def _vjp(b, xs, y, g, attrs):
    fn = attrs["fn"]
    return [b.op("host_call", *xs, g, fn=fn.adjoint(i)) if x.type.dtype.is_float else None
            for i, x in enumerate(xs)]


register(OpDef(
    "host_call", -1, {"fn": None},
    infer=lambda types, a: a["fn"].result_type(types),
    reference=lambda arrays, a: a["fn"].call(list(arrays)),
    vjp=_vjp,
    doc="fn(*operands) run by the host between kernels (a graph break): "
        "tessera.migrate.wrap_pytorch"))
