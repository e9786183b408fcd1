"""Fault tolerance: background checkpoints (checkpoint.save_async), the checkpointed loop
(@ts.checkpoint(interval=...)) rolling back on a DeviceError or recover_and_continue() under
@ts.fault_tolerant, and MPI jobs whose rank is killed with SIGKILL at a random step, started
again by dist.launch and by `python -m tessera.dist.supervise ... mpiexec ...`, ending with the
bits of a run that was never interrupted."""
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tessera as ts
from tessera import checkpoint, dist, op
from tessera.dist.launch import mpiexec


def _update(state, i):
    """A deterministic step: its data drawn from the step's number."""
    m = np.random.default_rng(i).standard_normal(state["w"].shape) * 0.3
    return {"w": np.tanh(state["w"] * 1.01 + m), "seen": state["seen"] + [i]}


def test_save_async_copies_the_values_then_writes_them_in_the_background(tmp_path,
                                                                           monkeypatch):
    """The caller may change its arrays at once; the write happens in another thread (held back
    here until the test releases it), and wait() returns once it is in place."""
    release = threading.Event()
    real = checkpoint._write_npy

    def held(path, arr):
        release.wait(60)
        return real(path, arr)
    monkeypatch.setattr(checkpoint, "_write_npy", held)
    w = np.arange(6.0)
    pending = checkpoint.save_async(tmp_path / "c", {"w": w}, step=7)
    w[:] = -1                               # the caller goes on, changing its array
    assert not pending.done() and checkpoint.latest_step(tmp_path / "c") is None
    release.set()
    pending.wait()
    params, _, step = checkpoint.load(tmp_path / "c")
    np.testing.assert_array_equal(params["w"], np.arange(6.0))
    assert step == 7 and pending.done()


def test_a_failed_background_save_raises_at_wait_and_keeps_the_old_checkpoint(tmp_path):
    checkpoint.save(tmp_path / "c", {"w": np.ones(3)}, step=1)
    with pytest.raises(ts.ArgumentError):           # a leaf it cannot save: at once
        checkpoint.save_async(tmp_path / "c", {"w": object()}, step=2)
    (tmp_path / "file").write_text("not a directory")
    pending = checkpoint.save_async(tmp_path / "file", {"w": np.ones(3)}, step=2)
    with pytest.raises(ts.ArgumentError, match="is not a directory"):
        pending.wait()
    assert checkpoint.latest_step(tmp_path / "c") == 1


def test_a_checkpointed_loop_resumes_from_its_last_checkpoint(tmp_path):
    loop = ts.checkpoint(interval=4, path=tmp_path / "run")(_update)
    start = {"w": np.linspace(-1, 1, 7), "seen": []}
    whole = ts.checkpoint(interval=4, path=tmp_path / "whole")(_update)(start, 10)
    assert whole["seen"] == list(range(10))
    part = loop(start, 6)                   # stops after step 5; its last checkpoint: 4
    assert part["seen"] == list(range(6)) and checkpoint.latest_step(tmp_path / "run") == 4
    resumed = loop(start, 10)               # a new run: from step 4, not 0
    assert resumed["seen"] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    np.testing.assert_array_equal(resumed["w"], whole["w"])


@pytest.mark.parametrize("order", ["checkpoint outside", "fault_tolerant outside"])
def test_a_device_error_rolls_the_loop_back_and_ends_with_the_same_bits(tmp_path, order, rng):
    fail_at = {int(rng.integers(1, 12)), int(rng.integers(1, 12))}

    def step(state, i):
        if i in fail_at:
            fail_at.discard(i)
            raise ts.DeviceError("an injected device fault")
        return _update(state, i)
    mark, keep = ts.fault_tolerant(max_restarts=2), ts.checkpoint(interval=3, path=tmp_path / "r")
    loop = keep(mark(step)) if order == "checkpoint outside" else mark(keep(step))
    start = {"w": np.linspace(-1, 1, 5), "seen": []}
    got = loop(start, 12)
    want = ts.checkpoint(interval=3, path=tmp_path / "clean")(_update)(start, 12)
    np.testing.assert_array_equal(got["w"], want["w"])
    assert got["seen"] == list(range(12))


def test_restarts_are_bounded_and_recover_and_continue_rolls_back(tmp_path):
    @ts.checkpoint(interval=2, path=tmp_path / "a")
    @ts.fault_tolerant(max_restarts=1)
    def always_failing(state, i):
        if i == 3:
            raise ts.DeviceError("this step always fails")
        return _update(state, i)
    with pytest.raises(ts.DeviceError, match="always fails"):
        always_failing({"w": np.zeros(3), "seen": []}, 6)
    assert always_failing.restarts == 1

    once = {"failed": False}

    @ts.checkpoint(interval=2, path=tmp_path / "b")
    def step(state, i):
        try:
            if i == 3 and not once["failed"]:
                once["failed"] = True
                raise ts.DeviceError("lost the device")
        except ts.DeviceError:
            ts.recover_and_continue()           # the seeds' form
        return _update(state, i)
    got = step({"w": np.zeros(3), "seen": []}, 6)
    assert got["seen"] == list(range(6)) and step.restarts == 1
    with pytest.raises(checkpoint.RollBack, match="none is running here"):
        ts.recover_and_continue()


# ---- across MPI ranks -------------------------------------------------------------------------
def _matrix(i):
    return np.random.default_rng(i).standard_normal((8, 8)).astype(np.float32) / 3


def _job_body(path, steps, kill_rank, kill_step, marker):
    """A sharded state updated by a sharded program, checkpointed every 3 steps; on its first
    run one rank kills itself (SIGKILL) at kill_step."""
    mesh = dist.Mesh(axes=["dp"], devices=range(2))
    w0 = dist.tensor((16, 8), layout=dist.ShardSpec(("row",), ("dp",)), mesh=mesh,
                     init="uniform", seed=3)

    @ts.checkpoint(interval=3, path=path)
    def step(state, i):
        if dist.rank() == kill_rank and i == kill_step and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return {"w": op.tanh(state["w"] @ _matrix(i) + 0.1)}
    return dist.gather(step({"w": w0}, steps)["w"])


resilient_job = ts.fault_tolerant(max_restarts=2)(_job_body)


@pytest.fixture
def kill(rng):
    return int(rng.integers(2)), int(rng.integers(1, 11))


def test_dist_launch_starts_a_job_whose_rank_was_killed_again(tmp_path, kill):
    pytest.importorskip("mpi4py", reason="the test extra installs mpi4py (pip install mpich)")
    rank, at = kill
    marker = tmp_path / "killed"
    results = dist.launch(resilient_job, 2, str(tmp_path / "ck"), 12, rank, at, str(marker))
    assert marker.exists(), "the rank was never killed"
    want = _job_body(str(tmp_path / "virtual"), 12, -1, -1, str(marker))
    for r in results:
        np.testing.assert_array_equal(r, want)


def test_a_killed_job_started_from_a_shell_is_started_again_by_supervise(tmp_path, kill):
    pytest.importorskip("mpi4py", reason="the test extra installs mpi4py (pip install mpich)")
    rank, at = kill
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import numpy as np
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from tessera import dist
        from test_fault_tolerance import _job_body
        w = _job_body({str(tmp_path / "ck")!r}, 12, {rank}, {at}, {str(tmp_path / "killed")!r})
        if dist.rank() == 0:
            np.save({str(tmp_path / "out.npy")!r}, w)
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tessera.dist.supervise", "--max-restarts", "2", "--",
           *mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
           str(script)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "starting it again (restart 1 of 2)" in proc.stderr
    want = _job_body(str(tmp_path / "virtual"), 12, -1, -1, "")
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want)
