"""Kept for users' imports: `@ts.kernel` lives in tessera/kernel/ (this re-exports its names)."""
from .kernel.annotations import Tile, TileSpec  # noqa: F401
from .kernel.function import KernelFunction, is_tile_kernel, kernel  # noqa: F401
from .kernel.interpreter import interpret  # noqa: F401
from .kernel.ir import KernelBody  # noqa: F401
