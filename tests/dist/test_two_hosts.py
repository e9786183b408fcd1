"""Two hosts: two network namespaces joined by a veth pair stand in for two machines, and
``mpiexec -f hostfile`` starts one rank on each (its ssh launcher replaced by a script entering
the namespace named by the host's address), so every byte between the ranks crosses the
"network". The sharded program gives the bits it gives on virtual devices."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tessera import dist, op

pytest.importorskip("mpi4py", reason="the test extra installs mpi4py (pip install mpi4py mpich)")

PROGRAM = """
import numpy as np
from tessera import dist, op
mesh = dist.Mesh(axes=["dp"], devices=range(2))
X = dist.tensor((32, 16), layout=dist.ShardSpec(("row",), ("dp",)), mesh=mesh,
                init="uniform", seed={seed})
Y = op.pipeline([op.matmul(X, X.T), op.relu, op.layernorm])
s = dist.gather(X.sum(axis=0))
y = dist.gather(Y)
import subprocess
mine = [a for a in subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True,
                                  text=True).stdout.split() if a.startswith("10.")]
np.save("{out}/y.%d.npy" % dist.rank(), y)
np.save("{out}/s.%d.npy" % dist.rank(), s)
open("{out}/addr.%d" % dist.rank(), "w").write(mine[0])   # (two ranks' prints interleave)
"""

FAKE_SSH = """#!/bin/bash
# ssh's stand-in for mpiexec: the host is an address; run the command in its namespace
while [[ "$1" == -* ]]; do case "$1" in -x|-q|-T) shift;; *) shift 2;; esac; done
host="$1"; shift
case "$host" in
  {a1}) ns={ns1};;
  {a2}) ns={ns2};;
  *) echo "unknown host $host" >&2; exit 1;;
esac
exec ip netns exec "$ns" bash -c "$*"
"""


def _sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip")
    tag = f"{os.getpid() % 10000}"
    ns1, ns2, v1, v2 = f"tsh1-{tag}", f"tsh2-{tag}", f"tsa{tag}", f"tsb{tag}"
    net = 10 + os.getpid() % 200
    a1, a2 = f"10.{net}.77.1", f"10.{net}.77.2"
    try:
        _sh("ip", "netns", "add", ns1)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"this machine refuses network namespaces: {e.stderr.strip()}")
    try:
        _sh("ip", "netns", "add", ns2)
        _sh("ip", "link", "add", v1, "type", "veth", "peer", "name", v2)
        _sh("ip", "link", "set", v1, "netns", ns1)
        _sh("ip", "link", "set", v2, "netns", ns2)
        for ns, v, a in ((ns1, v1, a1), (ns2, v2, a2)):
            _sh("ip", "-n", ns, "addr", "add", f"{a}/24", "dev", v)
            _sh("ip", "-n", ns, "link", "set", v, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield ns1, ns2, a1, a2
    finally:
        for ns in (ns1, ns2):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_one_rank_on_each_of_two_hosts(two_hosts, tmp_path, rng):
    ns1, ns2, a1, a2 = two_hosts
    seed = int(rng.integers(1 << 30))
    ssh = tmp_path / "fake-ssh"
    ssh.write_text(FAKE_SSH.format(a1=a1, a2=a2, ns1=ns1, ns2=ns2))
    ssh.chmod(0o755)
    (tmp_path / "hosts").write_text(f"{a1}:1\n{a2}:1\n")
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(PROGRAM.format(seed=seed, out=tmp_path)))
    from tessera.dist.launch import mpiexec
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               OMP_NUM_THREADS="1")
    run = subprocess.run(["ip", "netns", "exec", ns1, *mpiexec(), "-launcher", "ssh",
                          "-launcher-exec", str(ssh), "-f", str(tmp_path / "hosts"), "-n", "2",
                          sys.executable, "-m", "mpi4py", str(script)],
                         capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    # each rank ran in its own namespace, with its own address
    assert [(tmp_path / f"addr.{r}").read_text() for r in (0, 1)] == [f"{a1}/24", f"{a2}/24"]
    mesh = dist.Mesh(axes=["dp"], devices=range(2))
    X = dist.tensor((32, 16), layout=dist.ShardSpec(("row",), ("dp",)), mesh=mesh,
                    init="uniform", seed=seed)
    y = dist.gather(op.pipeline([op.matmul(X, X.T), op.relu, op.layernorm]))
    s = dist.gather(X.sum(axis=0))
    for r in range(2):
        np.testing.assert_array_equal(np.load(tmp_path / f"y.{r}.npy"), y)
        np.testing.assert_array_equal(np.load(tmp_path / f"s.{r}.npy"), s)
