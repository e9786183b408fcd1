"""The OpenMP team between calls: tessera asks libgomp to spin longer before its workers sleep
(waking one costs up to a scheduler tick on a VM), unless the user chose a policy."""
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
