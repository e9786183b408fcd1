"""Target renderers: Tile IR → source text. One C-style base; each language differs only where
it must. Importing them registers their targets (runtime/targets.py): the CPU in c.py, CUDA and
HIP in gpu.py."""
from . import c, gpu  # noqa: F401
