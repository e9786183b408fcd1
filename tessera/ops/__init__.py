"""The operator registry, filled by importing each family of operators once."""
from . import attention, elementwise, linalg, movement, nn, reduction  # noqa: F401  (registers)
from .registry import REGISTRY, OpDef, get

__all__ = ["REGISTRY", "OpDef", "get"]
