"""tessera.dist on a GPU (`make gpu-check`): a CUDA mesh keeps its blocks as CuPy arrays and runs
every kernel on the device (the GPU's bits, the same on every run: its reductions do not take
the CPU's order, so against the CPU mesh within rounding); MPI ranks sharing the one GPU stage
blocks through the host and give the virtual devices' bits; a rank with a GPU of its own
exchanges by NCCL. Without a device each test skips, saying so."""
import numpy as np
import pytest

import tessera as ts
from tessera import dist, op

pytestmark = pytest.mark.gpu


@pytest.fixture
def cupy():
    from tessera.runtime.gpu import runnable_targets
    if "cuda" not in runnable_targets():
        pytest.skip("needs a CUDA GPU: CuPy finds no device here (make gpu-check runs these)")
    import cupy
    return cupy


def _programs(target, seed, n=4):
    mesh = dist.Mesh(axes=["dp"], devices=range(n), target=target)
    X = dist.tensor((64, 32), layout=dist.ShardSpec(("row",), ("dp",)), mesh=mesh,
                    init="uniform", seed=seed)
    Y = op.pipeline([op.matmul(X, X.T), op.relu, op.layernorm])
    A = dist.tensor((16, 32), layout=dist.ShardSpec.per_dim(None, "dp"), mesh=mesh,
                    init="uniform", seed=seed + 1)
    f = ts.function(lambda a, w: op.gelu(a @ w).sum(axis=0))
    S = f(A, dist.tensor((32, 8), None, mesh, init="uniform", seed=seed + 2))
    out = {"Y": dist.gather(Y), "S": dist.gather(S), "sum": dist.gather(X.sum(axis=0)),
           "engine": mesh.engine.name}
    return {k: (v.get() if hasattr(v, "get") else v) for k, v in out.items()}


def test_a_cuda_mesh_runs_on_the_device(cupy, rng):
    seed = int(rng.integers(1 << 30))
    mesh = dist.Mesh(axes=["dp"], devices=range(4), target="cuda")
    X = dist.tensor((8, 4), dist.ShardSpec(("row",), ("dp",)), mesh)
    assert all(isinstance(b, cupy.ndarray) for b in X.blocks.values())
    assert isinstance(dist.gather(X), cupy.ndarray)
    gpu, again, cpu = _programs("cuda", seed), _programs("cuda", seed), _programs("cpu", seed)
    for k in ("Y", "S", "sum"):
        np.testing.assert_array_equal(gpu[k], again[k])
        np.testing.assert_allclose(gpu[k], cpu[k], rtol=1e-5, atol=1e-5)


def test_mpi_ranks_sharing_the_gpu_stage_through_the_host(cupy, rng):
    seed = int(rng.integers(1 << 30))
    results = dist.launch(_programs, 2, "cuda", seed, 2, timeout=300)
    here = _programs("cuda", seed, 2)
    for r in results:
        assert r["engine"] == "mpi"          # NCCL refuses two ranks on one GPU
        for k in ("Y", "S", "sum"):
            np.testing.assert_array_equal(r[k], here[k])


def _nccl_rank(seed):
    mesh = dist.Mesh(axes=["dp"], devices=range(1), target="cuda")
    import cupy
    x = cupy.asarray(np.random.default_rng(seed).standard_normal(1000).astype(np.float32))
    X = dist.shard(x, None, mesh)
    g = ts.collectives.all_gather(dist.shard(x, dist.ShardSpec(("row",), ("dp",)), mesh),
                                  axis="dp")
    s = ts.collectives.all_reduce(X, op="sum", axis="dp")
    return mesh.engine.name, dist.gather(s).get(), dist.gather(g).get()


def test_a_rank_with_its_own_gpu_exchanges_by_nccl(cupy, rng):
    try:
        from cupy.cuda import nccl
        nccl.get_version()
    except Exception as e:
        pytest.skip(f"CuPy has no NCCL here: {e}")
    seed = int(rng.integers(1 << 30))
    (engine, s, g), = dist.launch(_nccl_rank, 1, seed, timeout=300)
    x = np.random.default_rng(seed).standard_normal(1000).astype(np.float32)
    assert engine == "nccl"
    np.testing.assert_array_equal(s, x)
    np.testing.assert_array_equal(g, x)
