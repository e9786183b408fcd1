"""``dist.launch(fn, nprocs, *args)``: run a function on n MPI ranks from a notebook or a script.

The function and its arguments are pickled by value (cloudpickle: a notebook's functions too),
``mpiexec -n N python -m mpi4py -m tessera.dist.worker JOB`` runs it on every rank (``-m
mpi4py``: an exception on one rank aborts the job instead of leaving the others waiting in a
collective), and each rank writes its result, its output and any error into JOB. The caller gets
the results in rank order; each rank's output is printed in rank order (deterministic, unlike
output interleaved by the launcher); a failed rank is a `RankFailure` naming it and its error,
raised here; a job past ``timeout`` seconds is killed, never left hanging.
"""
from __future__ import annotations

import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import BackendUnavailableError, RankFailure
from .engine import MPIEngine, under_mpi


def rank() -> int:
    """This process's MPI rank (0 outside mpiexec)."""
    if not under_mpi():
        return 0
    return MPIEngine.world().rank


def world_size() -> int:
    """The number of MPI ranks (1 outside mpiexec)."""
    if not under_mpi():
        return 1
    return MPIEngine.world().size


def mpiexec() -> list:
    """The launcher: TESSERA_MPIEXEC (a command line, for the launcher of the MPI library
    mpi4py was built with: ``"mpiexec --oversubscribe"`` for Open MPI, ``"srun"``), else the
    one beside this Python (the mpich wheel's), else the system's."""
    if os.environ.get("TESSERA_MPIEXEC"):
        return shlex.split(os.environ["TESSERA_MPIEXEC"])
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        raise BackendUnavailableError("no mpiexec found", hint="pip install mpi4py mpich (or "
                                      "your cluster's MPI module, and TESSERA_MPIEXEC)")
    return [found]


def launch(fn, nprocs: int, *args, timeout: float = 600, threads: int | None = None,
           max_restarts: int | None = None, **kwargs):
    """fn(*args, **kwargs) on ``nprocs`` MPI ranks; returns the list of their results in rank
    order. ``threads``: each rank's kernel threads (OMP_NUM_THREADS), by default the cores
    shared out (at least 1). ``max_restarts`` (default: ``fn``'s, when it is marked
    ``ts.fault_tolerant``, else 0): a job whose rank died (killed, crashed) or failed with a
    `DeviceError` is started again, so many times at most; a ``ts.checkpoint`` loop in it
    resumes from its last complete checkpoint."""
    try:
        import cloudpickle
        import mpi4py  # noqa: F401  (the ranks import it; fail here, clearly, if it is missing)
    except ImportError as e:
        raise BackendUnavailableError(f"dist.launch needs {e.name}",
                                      hint="pip install mpi4py mpich cloudpickle") from None
    nprocs = int(nprocs)
    restarts = getattr(fn, "max_restarts", 0) if max_restarts is None else int(max_restarts)
    job = Path(tempfile.mkdtemp(prefix="tessera-launch-"))
    try:
        (job / "job.pkl").write_bytes(cloudpickle.dumps((fn, args, kwargs)))
        for attempt in range(restarts + 1):
            try:
                return _run(job, nprocs, timeout, threads)
            except RankFailure as e:
                if attempt == restarts or not getattr(e, "restartable", False):
                    raise
                print(f"dist.launch: {e.summary.splitlines()[0]}; starting the job again "
                      f"(restart {attempt + 1} of {restarts})")
                for p in job.iterdir():
                    if p.name != "job.pkl":
                        p.unlink()
    finally:
        shutil.rmtree(job, ignore_errors=True)


def _run(job: Path, nprocs: int, timeout: float, threads):
    """One run of the job: the results in rank order, or a RankFailure (``restartable`` when a
    rank died or failed with a DeviceError)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["OMP_NUM_THREADS"] = str(threads or max(1, (os.cpu_count() or 1) // nprocs))
    env.pop("TESSERA_DIST", None)
    env["TESSERA_LAUNCH_NPROCS"] = str(nprocs)
    cmd = [*mpiexec(), "-n", str(nprocs), sys.executable, "-m", "mpi4py", "-m",
           "tessera.dist.worker", str(job)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        launcher_out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        _print_outputs(job, nprocs)
        raise RankFailure(f"dist.launch: the {nprocs} ranks ran past {timeout} s and were "
                          "killed", hint="a rank waiting in a collective the others never "
                                         "reached? raise timeout= for long jobs") from None
    _print_outputs(job, nprocs)
    mismatch = sorted(job.glob("mismatch.*"))
    if mismatch:
        raise RankFailure(f"dist.launch: {mismatch[0].read_text()}")
    errors = sorted(job.glob("error.*"), key=lambda p: int(p.suffix[1:]))
    if errors:
        r = int(errors[0].suffix[1:])
        text = errors[0].read_text()
        e = RankFailure(f"rank {r} of {nprocs} failed:\n{text}", rank=r)
        e.restartable = "DeviceError" in text.strip().splitlines()[-1]
        raise e
    missing = [r for r in range(nprocs) if not (job / f"result.{r}").exists()]
    if missing:     # a rank died (killed, os._exit, a crash): the launcher ended the rest
        e = RankFailure(f"rank(s) {', '.join(map(str, missing))} of {nprocs} ended "
                        f"without a result (mpiexec's exit code {proc.returncode}): a "
                        "rank died and the launcher stopped the others",
                        rank=missing[0],
                        received=launcher_out.decode(errors="replace")[-2000:])
        e.restartable = True
        raise e
    return [pickle.loads((job / f"result.{r}").read_bytes()) for r in range(nprocs)]


class ModuleByName:
    """A module a `%%tessera --mesh` cell reads, sent by name (each rank imports it)."""

    def __init__(self, name: str):
        self.name = name


def run_source(source: str, inputs: dict, axes: dict, filename: str = "<cell>"):
    """One rank's run of a `%%tessera --mesh` cell: ``source`` executed with the notebook's
    values it reads (``inputs``; modules re-imported) and ``mesh``, the mesh of every rank on
    ``axes``. Returns the value of its last line when that is an expression, else None."""
    import ast
    import importlib
    from .layout import Mesh
    ns = {"__name__": "__mesh_cell__"}
    for name, value in inputs.items():
        ns[name] = importlib.import_module(value.name) if isinstance(value, ModuleByName) else value
    ns["mesh"] = Mesh(axes=dict(axes))
    tree = ast.parse(source, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, filename, "exec"), ns)
    if last is None:
        return None
    return eval(compile(ast.Expression(last.value), filename, "eval"), ns)


def _print_outputs(job: Path, nprocs: int):
    for r in range(nprocs):
        path = job / f"output.{r}"
        text = path.read_text(errors="replace") if path.exists() else ""
        for line in text.splitlines():
            print(f"[rank {r}] {line}")
