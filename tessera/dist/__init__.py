"""Meshes and sharded tensors: ``from tessera import dist``.

``dist.Mesh`` arranges devices (MPI ranks under ``mpiexec``, else virtual devices in this
process) on named axes; ``dist.ShardSpec`` says which tensor dimension each axis splits;
``dist.tensor``, ``dist.shard`` and ``dist.gather`` make, split and reassemble sharded tensors
(`DTensor`; ``dist.shard_tree`` a parameter tree, by a layout per leaf path), on which every
``op.*`` runs by its sharding rule; the collectives
(``tessera.collectives``) reduce in one fixed order, so results have the same bits on any engine;
``dist.launch`` runs a function on n MPI ranks from a notebook.
"""
from .data_parallel import batch_mean
from .pipeline import Pipeline
from .collectives import all_gather, all_reduce, all_to_all, reduce_scatter, scatter
from .layout import Layout, Mesh, Partial, ShardSpec
from .launch import launch, rank, world_size
from .spmd import plan_for as plan
from .tensor import DTensor, gather, shard, shard_tree, tensor

__all__ = ["Mesh", "ShardSpec", "Partial", "Layout", "DTensor", "tensor", "shard", "shard_tree",
           "gather", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "scatter",
           "launch", "rank", "world_size", "batch_mean", "plan", "Pipeline"]
