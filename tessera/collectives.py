"""``tessera.collectives``: the seeds' spelling of the mesh collectives (tessera/dist)."""
from .dist.collectives import all_gather, all_reduce, all_to_all, reduce_scatter, scatter

__all__ = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "scatter"]
