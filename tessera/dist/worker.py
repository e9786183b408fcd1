"""One rank of a ``dist.launch`` job: ``python -m mpi4py -m tessera.dist.worker JOB``.

Runs the pickled function; writes ``result.<rank>`` (its return value, pickled), ``output.<rank>``
(what it printed) and, if it raised, ``error.<rank>`` (the traceback) into JOB, each under a
temporary name renamed when complete, then re-raises so that mpi4py aborts every rank.
"""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import sys
import traceback
from pathlib import Path


def _write(path: Path, data: bytes):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(job: Path):
    from mpi4py import MPI
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    want = int(os.environ.get("TESSERA_LAUNCH_NPROCS", size))
    if size != want:            # every process a world of its own: the wrong launcher
        _write(job / f"mismatch.{os.getpid()}",
               f"this process is rank {rank} of a world of {size} where {want} ranks were "
               f"started: the launcher is not one of the MPI library mpi4py uses "
               f"({MPI.Get_library_version().splitlines()[0].strip()}); set "
               "TESSERA_MPIEXEC to that library's mpiexec".encode())
        sys.exit(1)
    fn, args, kwargs = pickle.loads((job / "job.pkl").read_bytes())
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            result = fn(*args, **kwargs)
    except BaseException as e:
        _write(job / f"output.{rank}", out.getvalue().encode())
        tb = traceback.format_exception(type(e), e, e.__traceback__.tb_next)   # from fn down
        _write(job / f"error.{rank}", "".join(tb).encode())
        raise
    _write(job / f"output.{rank}", out.getvalue().encode())
    import cloudpickle
    _write(job / f"result.{rank}", cloudpickle.dumps(result))
    MPI.COMM_WORLD.Barrier()      # no rank leaves while another may still need it


if __name__ == "__main__":
    main(Path(sys.argv[1]))
