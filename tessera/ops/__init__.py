"""The operator registry, filled by importing each family of operators once (and the user's
tile kernels' operator, tile_program, by tessera/kernel/operator.py)."""
from . import (attention, complex, conv, elementwise, host, linalg, movement,  # noqa: F401
               nn, random, reduction, regions, sorting, spectral)
from .registry import REGISTRY, OpDef, get

__all__ = ["REGISTRY", "OpDef", "get"]
