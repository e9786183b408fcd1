"""The operator registry, filled by importing each family of operators once."""
from . import (attention, complex, conv, elementwise, host, linalg, movement,  # noqa: F401
               nn, random, reduction, regions, sorting, spectral, tile_program)
from .registry import REGISTRY, OpDef, get

__all__ = ["REGISTRY", "OpDef", "get"]
