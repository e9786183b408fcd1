"""The engines that move blocks between devices, and the one order every reduction takes.

Two engines share one primitive, `exchange`: within each group of a mesh axis, every member sends
one array to every member (an all-to-all); gathers and reductions are built on it in
tessera/dist/collectives.py. `MPIEngine` is MPI through mpi4py, one process per device (under
``mpiexec``); `VirtualEngine` holds every device's block in this process (a notebook on one
machine). Reductions never use MPI's own: `tree_reduce` combines the members' terms by one fixed
pairwise tree in rank order, so a result has the same bits under either engine, any MPI library
and any message size (MPI_Allreduce picks its algorithm, and so its rounding, by size).
"""
from __future__ import annotations

import os

import numpy as np

from ..errors import ShardingError

_MPI_ENV = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


def under_mpi() -> bool:
    """Launched by mpiexec (the launcher's environment variables), unless TESSERA_DIST says."""
    choice = os.environ.get("TESSERA_DIST", "").lower()
    if choice in ("virtual", "mpi"):
        return choice == "mpi"
    return any(v in os.environ for v in _MPI_ENV)


def engine_for(mesh):
    if under_mpi():
        eng = MPIEngine.world()
        if eng.size > 1 or mesh.size == 1:
            if eng.size != mesh.size:
                raise ShardingError(f"the mesh has {mesh.size} devices and mpiexec started "
                                    f"{eng.size} ranks", hint=f"mpiexec -n {mesh.size} ...")
            return eng
    return VirtualEngine(mesh.size)


def tree_reduce(terms: list, op: str) -> np.ndarray:
    """The terms combined pairwise in rank order, ((t0 t1) (t2 t3)) ..., an odd last term carried
    up; 16-bit floats combined in float32 and rounded once. ``mean`` is the sum divided by the
    count."""
    dtype = terms[0].dtype
    wide = np.float32 if dtype.itemsize == 2 and dtype.kind not in "iub" else None
    level = [t.astype(wide) if wide else t for t in terms]
    fn = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}[op]
    while len(level) > 1:
        nxt = [fn(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    out = level[0]
    if op == "mean":
        out = out / np.asarray(len(terms), dtype=out.dtype)
    return np.asarray(out, dtype=dtype)


class VirtualEngine:
    """Every device of the mesh in this process: a block per rank, exchanged in memory."""
    name = "virtual"

    def __init__(self, size: int):
        self.size = size
        self.ranks = tuple(range(size))     # the ranks whose blocks this process holds

    def exchange(self, mesh, axes, sends: dict) -> dict:
        """``sends[r][j]``: what rank r sends the j-th member of its group over ``axes``.
        Returns ``recv[r][j]``: what r got from its j-th member."""
        out = {}
        for r in sends:
            group = mesh.group(r, axes)
            me = group.index(r)
            out[r] = [sends[g][me] for g in group]
        return out

    def barrier(self):
        pass


class MPIEngine:
    """One MPI rank per device (mpi4py). A group's communicator is made once per (mesh, axes)."""
    name = "mpi"
    _world = None

    @classmethod
    def world(cls) -> "MPIEngine":
        if cls._world is None:
            from mpi4py import MPI
            cls._world = cls(MPI.COMM_WORLD)
        return cls._world

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.ranks = (self.rank,)
        self._groups: dict = {}

    def _comm(self, mesh, axes):
        key = (tuple(mesh.shape.items()), tuple(axes))
        if key not in self._groups:
            group = mesh.group(self.rank, axes)
            color = min(group)                   # the same for every member of the group
            self._groups[key] = self.comm.Split(color, group.index(self.rank))
        return self._groups[key]

    def exchange(self, mesh, axes, sends: dict) -> dict:
        from mpi4py import MPI
        comm = self._comm(mesh, axes)
        pieces = [np.ascontiguousarray(p) for p in sends[self.rank]]
        meta = comm.alltoall([(p.shape, p.dtype) for p in pieces])
        send_bytes = [p.reshape(-1).view(np.uint8) for p in pieces]
        scounts = [b.size for b in send_bytes]
        rcounts = [int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for s, d in meta]
        sbuf = np.concatenate(send_bytes) if send_bytes else np.zeros(0, np.uint8)
        rbuf = np.empty(sum(rcounts), np.uint8)
        comm.Alltoallv([sbuf, scounts, _displs(scounts), MPI.BYTE],
                       [rbuf, rcounts, _displs(rcounts), MPI.BYTE])
        out, at = [], 0
        for (shape, dtype), n in zip(meta, rcounts):
            out.append(rbuf[at:at + n].view(dtype).reshape(shape))
            at += n
        return {self.rank: out}

    def barrier(self):
        self.comm.Barrier()


def _displs(counts):
    return [int(x) for x in np.concatenate([[0], np.cumsum(counts)[:-1]])] if counts else []
