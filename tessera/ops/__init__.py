"""The operator registry, filled by importing each family of operators once."""
from . import (attention, elementwise, linalg, movement, nn, random, reduction,  # noqa: F401
               regions, sorting)
from .registry import REGISTRY, OpDef, get

__all__ = ["REGISTRY", "OpDef", "get"]
