"""Gradual migration from PyTorch, in the seeds' spelling.

    fn, params = migrate.from_pytorch(model, x)   # the whole model: ts.from_torch (tessera/aten.py)
    layer = migrate.wrap_pytorch(torch_layer)     # one PyTorch layer kept as it is, inside a
    y = layer(h)                                  # tessera function: run eagerly by PyTorch

``wrap_pytorch`` is for what ``from_torch`` cannot import yet (an operator without an entry, a
custom CUDA extension) or what should stay PyTorch's: the layer runs in PyTorch, on the CPU,
between the compiled parts of the function that calls it (a **graph break**: the program is
compiled in parts cut at each call, tessera/compiler/driver.py's `SplitProgram`; fusion does not
cross the call). Its inputs reach PyTorch as tensors on copies of the arrays, its result comes
back as a NumPy array of the dtype PyTorch gives. Gradients flow through it to its inputs
(``torch.autograd.grad`` on the layer, run again on the saved inputs); the layer's own parameters
stay PyTorch's (frozen for ``ts.grad``: train them with ``torch.optim``). The layer must be a
function of its inputs (eval mode: dropout and batch-norm statistics updates would run once per
call and once more per gradient). One tensor result; tensor arguments only.
"""
from __future__ import annotations

import numpy as np

from . import dtypes as dt
from .aten import from_torch as from_pytorch
from .errors import ArgumentError, SymbolicValueError, TesseraError
from .ops.host import HostFunction
from .trace import apply
from .types import TensorType

__all__ = ["from_pytorch", "wrap_pytorch", "TorchLayer"]


class TorchLayer:
    """A PyTorch module or function of tensors, callable on tessera tensors and arrays."""

    def __init__(self, layer, name=None):
        import torch
        self.layer = layer
        self.name = name or ("torch:" + (type(layer).__name__ if isinstance(layer, torch.nn.Module)
                                         else getattr(layer, "__name__", "fn")))
        self._types: dict = {}
        self.host = HostFunction(self.name, self._call, self._result_type, self._adjoint)

    def __call__(self, *xs):
        if not xs:
            raise ArgumentError(f"{self.name} takes at least one tensor")
        return apply("host_call", list(xs), fn=self.host)

    def __repr__(self):
        return f"<wrapped PyTorch layer {self.name}>"

    # -- what the host runs ------------------------------------------------------------------------
    def _tensors(self, arrays, grad=False):
        import torch
        from .interop import to_torch_tensor
        return [to_torch_tensor(np.array(a)).requires_grad_(grad and a.dtype.kind == "f")
                for a in arrays]                  # copies: the layer may write its inputs

    def _result(self, y):
        import torch
        from .interop import from_dlpack
        if not isinstance(y, torch.Tensor):
            raise TesseraError(f"{self.name} returned {type(y).__name__}, not one tensor",
                               hint="wrap a function that returns one tensor")
        return np.array(from_dlpack(y.detach().cpu()))

    def _call(self, arrays):
        import torch
        with torch.no_grad():
            return self._result(self.layer(*self._tensors(arrays)))

    def _result_type(self, types) -> TensorType:
        """The layer run once on zeros of the operands' types (kept per types)."""
        key = tuple(types)
        if key not in self._types:
            if any(not t.is_static for t in types):
                raise SymbolicValueError(f"{self.name} needs concrete shapes (a PyTorch layer "
                                         "runs on arrays)")
            zeros = [np.zeros(tuple(t.shape), t.dtype.np) for t in types]
            try:
                y = self._call(zeros)
            except TesseraError:
                raise
            except Exception as e:            # the layer's own refusal of these shapes
                raise ArgumentError(f"{self.name} refused operands "
                                    f"{', '.join(str(t) for t in types)}: {type(e).__name__}: "
                                    f"{str(e).splitlines()[0] if str(e) else ''}") from None
            self._types[key] = TensorType(dt.from_numpy(y.dtype), tuple(y.shape))
        return self._types[key]

    def _adjoint(self, i: int) -> HostFunction:
        """Operand i's cotangent from (*operands, cotangent): the layer run again with autograd
        on the operands, then torch.autograd.grad."""
        def call(arrays):
            import torch
            *operands, ct = arrays
            xs = self._tensors(operands, grad=True)
            with torch.enable_grad():
                y = self.layer(*xs)
                g, = torch.autograd.grad(y, xs[i], grad_outputs=self._tensors([ct])[0].to(y.dtype),
                                         allow_unused=True)
            if g is None:                     # the result does not depend on operand i
                return np.zeros(operands[i].shape, operands[i].dtype)
            return self._result(g)

        def result_type(types):
            return types[i]
        return HostFunction(f"{self.name}.vjp[{i}]", call, result_type)


def wrap_pytorch(layer, name=None) -> TorchLayer:
    """A PyTorch module (or function of tensors) callable inside tessera functions, run by
    PyTorch between the compiled parts (a graph break); see the module's docstring."""
    import torch
    if not (isinstance(layer, torch.nn.Module) or callable(layer)):
        raise ArgumentError("wrap_pytorch takes a torch.nn.Module or a function of tensors",
                            received=type(layer).__name__)
    return TorchLayer(layer, name)
