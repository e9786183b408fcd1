"""Tensor types and the ``Tensor[...]`` annotation."""
from __future__ import annotations

from dataclasses import dataclass

from . import dtypes as dt
from .errors import AnnotationError
from .numerics import NumericalPolicy
from .shapes import dim, fmt_shape, is_static


@dataclass(frozen=True)
class TensorType:
    """dtype[dims]: what flows along a Graph IR edge. Dims are ints or symbols."""
    dtype: dt.DType
    shape: tuple

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(is_static(d) for d in self.shape)

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, tuple(shape))

    def __str__(self) -> str:
        return f"{self.dtype.short}{fmt_shape(self.shape)}"


class TensorSpec:
    """The value of ``Tensor["B", "S", "D"]`` or ``Tensor["B", "D", tessera.float64]``.

    Dims are symbol names or ints; an optional dtype comes next, then an optional
    tessera.NumericalPolicy that the tensor carries into the operators it flows through. A bare
    ``Tensor`` accepts any shape. (The seeds' ``Tensor[..., dtype=bf16]`` and ``bf16
    @NumericalPolicy(...)`` are not valid Python; pass the dtype, then the policy, as the last
    items instead.)
    """

    def __init__(self, dims, dtype=None, policy=None):
        self.dims = None if dims is None else tuple(dim(d) for d in dims)
        self.dtype = None if dtype is None else dt.get(dtype)
        self.policy = policy

    def __repr__(self):
        if self.dims is None:
            return "Tensor"
        items = [repr(str(d)) if not isinstance(d, int) else str(d) for d in self.dims]
        if self.dtype is not None:
            items.append(f"tessera.{self.dtype.name}")
        if self.policy is not None:
            items.append(repr(self.policy))
        return f"Tensor[{', '.join(items)}]"

    def type_str(self, dtype=None) -> str:
        d = self.dtype or dtype
        prefix = d.short if d is not None else "?"
        return prefix + ("[...]" if self.dims is None else fmt_shape(self.dims))


class _TensorMeta(type):
    def __getitem__(cls, items) -> TensorSpec:
        if not isinstance(items, tuple):
            items = (items,)
        dtype = policy = None
        if items and isinstance(items[-1], NumericalPolicy):
            policy, items = items[-1], items[:-1]
        if items and isinstance(items[-1], (dt.DType,)):
            dtype, items = items[-1], items[:-1]
        for it in items:
            if isinstance(it, (dt.DType, NumericalPolicy)) or not isinstance(it, (str, int)) or \
                    isinstance(it, bool) \
                    or (isinstance(it, int) and it < 0) or \
                    (isinstance(it, str) and not it.isidentifier()):
                raise AnnotationError(
                    f"Tensor[...] takes dimension names or sizes >= 0, then an optional dtype "
                    f"and an optional NumericalPolicy last; got {it!r}", received=repr(it),
                    hint="a dimension is one name (\"B\"); sizes computed from names (B*S) come "
                         "out of reshape and concat inside the function")
        return TensorSpec(items, dtype, policy)

    def __repr__(cls):
        return "Tensor"


class Tensor(metaclass=_TensorMeta):
    """Annotation for tensor parameters: ``x: Tensor["B", "S", "D"]``."""


def spec_of(annotation):
    """The TensorSpec an annotation stands for, or None if it is not a tensor annotation."""
    if isinstance(annotation, TensorSpec):
        return annotation
    if annotation is Tensor:
        return TensorSpec(None)
    return None


def type_of_array(a) -> TensorType:
    return TensorType(dt.from_numpy(a.dtype), tuple(int(s) for s in a.shape))
