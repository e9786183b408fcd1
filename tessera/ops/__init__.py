"""The operator registry, filled by importing each family of operators once."""
from . import (attention, complex, elementwise, linalg, movement, nn, random,  # noqa: F401
               reduction, regions, sorting, spectral)
from .registry import REGISTRY, OpDef, get

__all__ = ["REGISTRY", "OpDef", "get"]
