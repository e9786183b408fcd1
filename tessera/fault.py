"""Fault tolerance, the seeds' way: ``@ts.fault_tolerant(max_restarts=3)`` and
``ts.recover_and_continue()`` on ``ts.DeviceError``, over the checkpointed loop of
``@ts.checkpoint(interval=...)`` (tessera/checkpoint.py):

    @ts.checkpoint(interval=100, path="run/ckpt")
    @ts.fault_tolerant(max_restarts=3)
    def train(state, step):             # the loop's step: (state, step) -> state
        ...
    state = train(state, steps=10_000)  # resumes from run/ckpt when it holds a checkpoint

In one process, a `DeviceError` in a step rolls the loop back to its last checkpoint and goes
on, up to ``max_restarts`` times. Across processes, a rank that dies (killed, a crash) takes its
job down; the job is started again, and its loop resumes from the last complete checkpoint:
`dist.launch` does so itself for a function marked ``fault_tolerant`` (up to its
``max_restarts``), and ``python -m tessera.dist.supervise --max-restarts 3 -- mpiexec ...``
does it for a job started from a shell.
"""
from __future__ import annotations

import functools
import sys

from . import checkpoint
from .errors import ArgumentError, DeviceError


def fault_tolerant(fn=None, *, max_restarts: int = 3):
    """Mark ``fn`` as restartable up to ``max_restarts`` times. On a checkpointed loop's step
    (either order of the two decorators) the loop rolls back to its last checkpoint on a
    `DeviceError`; on any other function, a `DeviceError` calls it again (a checkpointed loop
    called again resumes from its checkpoint). `dist.launch` starts a job whose rank died
    again, up to ``max_restarts`` times."""
    if int(max_restarts) < 0:
        raise ArgumentError("max_restarts is a count, 0 or more", received=repr(max_restarts))
    max_restarts = int(max_restarts)

    def wrap(f):
        if isinstance(f, checkpoint.Checkpointed):
            f.step = _marked(f.step, max_restarts)
            return f
        return _marked(f, max_restarts, retry=True)
    return wrap if fn is None else wrap(fn)


def _marked(f, max_restarts, retry=False):
    @functools.wraps(f)
    def call(*args, **kwargs):
        if not retry or checkpoint._running:   # a loop's step: the loop rolls back
            return f(*args, **kwargs)
        for attempt in range(max_restarts + 1):
            try:
                return f(*args, **kwargs)
            except DeviceError:
                checkpoint.wait()
                if attempt == max_restarts:
                    raise
    call.max_restarts = max_restarts
    return call


def recover_and_continue():
    """In a checkpointed loop's step (typically in ``except ts.DeviceError:``): roll the loop
    back to its last checkpoint and go on from there (counted against its ``max_restarts``).
    Elsewhere a `RollBack` error that says so."""
    error = sys.exc_info()[1]
    raise checkpoint.RollBack(error if isinstance(error, DeviceError) else None)
