"""tile_program: a user's tile kernel (`@ts.kernel`) as one Graph IR node, registered here
beside the kernel language (its reference is the kernel's interpreter), when function.py, which
makes such nodes, is imported.

Its operands are the kernel's parameters in order (a parameter it only stores into is an
operand for its shape); its `kernel` attribute is the traced body (a KernelBody,
tessera/kernel/ir.py), which the `tile` strategy lowers (lowering.py).
Its result is the kernel's output.
"""
from __future__ import annotations

from ..errors import ShapeError
from ..ops.registry import OpDef, UserTileKernel, register
from ..types import TensorType
from .interpreter import interpret


def _infer(types, attrs):
    body = attrs["kernel"]
    if len(types) != len(body.params):
        raise ShapeError(f"tile kernel {body.name} takes {len(body.params)} operands, "
                         f"got {len(types)}")
    if body.output_param is not None:           # a parameter stored (or added) into
        i = [p.name for p in body.params].index(body.output_param)
        return types[i]
    what = body.output.value                    # a returned tile
    dims = body.sizes(types)
    return TensorType(body.out_dtype or what.dtype, tuple(dims[d] for d in what.dims))


def _reference(arrays, attrs):
    return interpret(attrs["kernel"], arrays)     # the body run with NumPy, program by program


register(OpDef(
    "tile_program", -1, {"kernel": None}, infer=_infer, reference=_reference,
    lowering=UserTileKernel(), differentiable=False,
    doc="a user's tile kernel (@ts.kernel): its body run over the blocks of its output"))
