"""The OpenMP team between calls: tessera asks libgomp to spin longer before its workers sleep
(waking one costs up to a scheduler tick on a VM), unless the user chose a policy; and a call
runs on the cores that other processes leave (runtime/threads.py)."""
import os
import subprocess
import sys

import pytest

from tessera.runtime import toolchain

CODE = ("import os, numpy as np, tessera as ts; ts.function(lambda x: x + 1)(np.ones(3));"
        "print(os.environ.get('GOMP_SPINCOUNT'))")


def _run(env):
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")} | env
    r = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_the_spin_count_is_set_before_libgomp_loads():
    assert _run({}) == toolchain.SPINCOUNT


@pytest.mark.parametrize("env,want", [({"GOMP_SPINCOUNT": "1000"}, "1000"),
                                      ({"OMP_WAIT_POLICY": "passive"}, "None")])
def test_a_users_own_policy_wins(env, want):
    assert _run(env) == want


# (libgomp.so.1 by name: the library the program loaded, whose count the caller's thread keeps)
LOADED = ("import ctypes, numpy as np, tessera as ts; from tessera.runtime import threads;"
          "f = ts.function(lambda x: (x * 2).sum(axis=1)); x = np.ones((512, 512), np.float32);"
          "print(f(x).sum(), threads.chooser.configured, threads.chooser.local.n,"
          "      ctypes.CDLL('libgomp.so.1').omp_get_max_threads())")


def test_calls_run_on_the_cores_other_processes_leave():
    """With more CPU-bound processes than cores, a call runs on one thread (a parallel region
    would wait, at its end, for a descheduled member of its team); the result is the same, and
    the calling thread's OpenMP count is back at 2 after it (PyTorch's kernels share it)."""
    import time
    from tessera.runtime import threads
    n = threads.cores()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(n + 1)]
    try:
        time.sleep(0.5)
        assert threads.busy_elsewhere() >= n
        chooser = threads._Chooser()
        chooser.configured = max(2, chooser.configured)
        assert chooser.threads() == 1
        env = {k: v for k, v in os.environ.items() if k != "TESSERA_ADAPTIVE_THREADS"}
        r = subprocess.run([sys.executable, "-c", LOADED], env=env | {"OMP_NUM_THREADS": "2"},
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        total, configured, given, after = r.stdout.split()
        assert (float(total), configured, given, after) == (512 * 512 * 2.0, "2", "1", "2")
    finally:
        for p in burners:
            p.kill()
            p.wait()
