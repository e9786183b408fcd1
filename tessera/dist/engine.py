"""The engines that move blocks between devices, and the one order every reduction takes.

The engines share one primitive, `exchange`: within each group of a mesh axis, every member sends
one array to every member (an all-to-all); gathers and reductions are built on it in
tessera/dist/collectives.py. `MPIEngine` is MPI through mpi4py, one process per device (under
``mpiexec``); `NCCLEngine` moves a CUDA mesh's blocks by NCCL between ranks with a GPU each;
`VirtualEngine` holds every device's block in this process (a notebook on one machine).
Reductions never use MPI's own: `tree_reduce` combines the members' terms by one fixed pairwise
tree in rank order, so a result has the same bits under either engine, any MPI library
and any message size (MPI_Allreduce picks its algorithm, and so its rounding, by size).
"""
from __future__ import annotations

import os
import time

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
    """MPI under mpiexec (NCCL for a CUDA mesh whose ranks each have a GPU of their own), else
    virtual devices."""
    if under_mpi():
        eng = MPIEngine.world()
        if eng.size > 1 or mesh.size == 1:
            if eng.size != mesh.size:
                raise ShardingError(f"the mesh has {mesh.size} devices and mpiexec started "
                                    f"{eng.size} ranks", hint=f"mpiexec -n {mesh.size} ...")
            if mesh.target == "cuda" and NCCLEngine.usable(eng):
                return NCCLEngine.world(eng)
            return eng
    return VirtualEngine(mesh.size)


def on_gpu(x) -> bool:
    return hasattr(x, "__cuda_array_interface__")


def to_host(x):
    return x.get() if on_gpu(x) else x


def tree_reduce(terms: list, op: str, out=None) -> np.ndarray:
    """The terms combined pairwise in rank order, ((t0 t1) (t2 t3)) ..., an odd last term carried
    up; 16-bit floats combined in float32 and rounded once. ``mean`` is the sum divided by the
    count. ``out`` (an array of the terms' shape and dtype, 32- or 64-bit floats): where the
    last combination is written, with no new array."""
    dtype = terms[0].dtype
    wide = np.float32 if dtype.itemsize == 2 and dtype.kind not in "iub" else None
    level = [t.astype(wide) if wide else t for t in terms]
    fn = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}[op]
    into = out if out is not None and not wide and dtype.kind == "f" and len(terms) > 1 else None
    while len(level) > 1:       # (NumPy's ufuncs take CuPy arrays to CuPy's: the same IEEE ops)
        last = len(level) == 2 and into is not None
        nxt = [fn(level[i], level[i + 1], out=into) if last else fn(level[i], level[i + 1])
               for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    res = level[0]
    if op == "mean":
        res = np.divide(res, res.dtype.type(len(terms)), out=into) if into is not None else \
            res / res.dtype.type(len(terms))
    return res.astype(dtype, copy=False) if res.ndim else res.reshape(()).astype(dtype)


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
        self._buffers: dict = {}

    def _comm(self, mesh, axes):
        key = (tuple(mesh.shape.items()), tuple(axes))
        if key not in self._groups:
            group = mesh.group(self.rank, axes)
            color = min(group)                   # the same for every member of the group
            self._groups[key] = self.comm.Split(color, group.index(self.rank))
        return self._groups[key]

    def exchange(self, mesh, axes, sends: dict) -> dict:
        """`_pairwise` rounds after the shapes and dtypes are exchanged: several times faster
        than MPICH's Alltoallv on one machine."""
        comm = self._comm(mesh, axes)
        me = comm.Get_rank()
        device = any(on_gpu(x) for x in sends[self.rank])     # CuPy blocks: staged via host
        pieces = [np.ascontiguousarray(to_host(x)) for x in sends[self.rank]]
        meta = comm.alltoall([(x.shape, x.dtype) for x in pieces])
        out = [np.empty(shape, dtype) for shape, dtype in meta]
        out[me][...] = pieces[me]
        _pairwise(comm, lambda to: pieces[to], lambda frm: out[frm])
        if device:
            import cupy
            out = [cupy.asarray(x) for x in out]
        return {self.rank: out}

    def all_reduce_flat(self, mesh, axes, block, op, out=None):
        """`collectives.reduce_blocks` on one host array with MPI's buffers: chunk j of the
        flattened block to member j, the tree over the members' chunks, the reduced chunks
        sent to every member. Each step is `_pairwise` rounds, several times faster than MPICH's
        Alltoallv and Allgatherv on one machine for the same bytes; the chunks arrive in scratch
        kept between calls, where the tree's last sum is written too. ``out``: where the result
        goes (``block`` itself when the caller owns it), else a new array."""
        comm = self._comm(mesh, axes)
        p, me = comm.Get_size(), comm.Get_rank()
        flat = np.ascontiguousarray(block).reshape(-1)
        q, r = divmod(flat.size, p)           # np.array_split's chunks: the first r one longer
        bounds = [k * q + min(k, r) for k in range(p + 1)]
        part = lambda a, k: a[bounds[k]:bounds[k + 1]]
        got = self._scratch((p, bounds[me + 1] - bounds[me]), flat.dtype)
        _pairwise(comm, lambda to: part(flat, to), lambda frm: got[frm])
        terms = [part(flat, k) if k == me else got[k] for k in range(p)]
        reduced = np.ascontiguousarray(tree_reduce(terms, op, out=got[me]))
        out = np.empty(flat.size, flat.dtype) if out is None else out.reshape(-1)
        part(out, me)[...] = reduced
        _pairwise(comm, lambda to: reduced, lambda frm: part(out, frm))
        return out.reshape(block.shape)

    def _scratch(self, shape, dtype):
        """A buffer of this shape and dtype, the same one each call (a few kept)."""
        key = (tuple(int(n) for n in shape), np.dtype(dtype).str)
        buf = self._buffers.pop(key, None)
        if buf is None:
            buf = np.empty(key[0], dtype)
        self._buffers[key] = buf
        while len(self._buffers) > 4:
            del self._buffers[next(iter(self._buffers))]
        return buf

    def native_all_reduce(self, mesh, axes, flat, op):
        """MPI_Allreduce itself (``order="native"``): fast, in whatever order MPI picks."""
        from mpi4py import MPI
        comm = self._comm(mesh, axes)
        out = np.empty_like(flat)
        mpi_op = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
        comm.Allreduce(np.ascontiguousarray(flat), out, op=mpi_op)
        return out / out.dtype.type(comm.Get_size()) if op == "mean" else out

    # point to point (a pipeline's activations and cotangents), pickled: any array
    def isend(self, obj, dest: int, tag: int = 0):
        return self.comm.isend(obj, dest=dest, tag=tag)

    def recv(self, source: int, tag: int = 0):
        req = self.comm.irecv(source=source, tag=tag)
        while True:                      # sleeping between polls, as the barrier does
            done, obj = req.test()
            if done:
                return obj
            time.sleep(0.0005)

    def bcast(self, obj, root: int = 0):
        return self.comm.bcast(obj, root=root)

    def barrier(self):
        """Every rank here. Waiting ranks sleep between polls: MPI's own barrier spins, and on
        an oversubscribed machine the spinning ranks starve the one they wait for (rank 0
        compiling a kernel)."""
        req = self.comm.Ibarrier()
        while not req.Test():
            time.sleep(0.002)


def _bytes(a):
    """A contiguous array's memory as bytes (MPI takes no 16-bit float dtype)."""
    return a.reshape(-1).view(np.uint8)


def _pairwise(comm, send, recv):
    """Every member sends ``send(j)`` to member j and receives ``recv(j)``'s bytes from it, in
    p - 1 rounds of ``Sendrecv`` (round s: to me + s, from me - s), deadlock-free."""
    p, me = comm.Get_size(), comm.Get_rank()
    for s in range(1, p):
        to, frm = (me + s) % p, (me - s) % p
        comm.Sendrecv(_bytes(send(to)), dest=to, recvbuf=_bytes(recv(frm)), source=frm)


class NCCLEngine:
    """One MPI rank per GPU, blocks exchanged by NCCL's send and receive (through CuPy) in one
    group per exchange; MPI only starts the ranks and hands out NCCL's ids. NCCL refuses two
    ranks on one GPU: there the MPI engine stages CuPy blocks through the host instead."""
    name = "nccl"
    _world = None

    @staticmethod
    def usable(mpi) -> bool:
        try:
            import cupy
            from cupy.cuda import nccl  # noqa: F401
            gpus = cupy.cuda.runtime.getDeviceCount()
        except Exception:                # no CuPy, no NCCL, no GPU: MPI stages through the host
            return False
        local = mpi.comm.Split_type(split_type=_shared_type()).Get_size()
        return gpus >= local

    @classmethod
    def world(cls, mpi) -> "NCCLEngine":
        if cls._world is None:
            cls._world = cls(mpi)
        return cls._world

    def __init__(self, mpi):
        import cupy
        self.mpi, self.rank, self.size, self.ranks = mpi, mpi.rank, mpi.size, mpi.ranks
        local = mpi.comm.Split_type(split_type=_shared_type())
        cupy.cuda.Device(local.Get_rank()).use()
        self._comms: dict = {}

    def _comm(self, mesh, axes):
        from cupy.cuda import nccl
        key = (tuple(mesh.shape.items()), tuple(axes))
        if key not in self._comms:
            group = self.mpi._comm(mesh, axes)
            uid = group.bcast(nccl.get_unique_id() if group.Get_rank() == 0 else None, root=0)
            self._comms[key] = nccl.NcclCommunicator(group.Get_size(), uid, group.Get_rank())
        return self._comms[key]

    def exchange(self, mesh, axes, sends: dict) -> dict:
        import cupy
        from cupy.cuda import nccl
        comm = self._comm(mesh, axes)
        group = self.mpi._comm(mesh, axes)
        pieces = [cupy.ascontiguousarray(cupy.asarray(p)) for p in sends[self.rank]]
        meta = group.alltoall([(p.shape, p.dtype) for p in pieces])
        out = [cupy.empty(shape, dtype) for shape, dtype in meta]
        stream = cupy.cuda.get_current_stream()
        nccl.groupStart()
        for j, (p, r) in enumerate(zip(pieces, out)):
            comm.send(p.data.ptr, p.nbytes, nccl.NCCL_UINT8, j, stream.ptr)
            comm.recv(r.data.ptr, r.nbytes, nccl.NCCL_UINT8, j, stream.ptr)
        nccl.groupEnd()
        stream.synchronize()
        return {self.rank: out}

    def barrier(self):
        self.mpi.barrier()

    def __getattr__(self, name):         # the rest (point to point, broadcast) is MPI's
        return getattr(self.mpi, name)


def _shared_type():
    from mpi4py import MPI
    return MPI.COMM_TYPE_SHARED
