"""The operator registry, filled by importing each family of operators once."""
from . import (attention, complex, elementwise, host, linalg, movement, nn,  # noqa: F401
               random, reduction, regions, sorting, spectral, tile_program)
from .registry import REGISTRY, OpDef, get

__all__ = ["REGISTRY", "OpDef", "get"]
