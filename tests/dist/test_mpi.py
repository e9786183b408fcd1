"""tessera.dist on real MPI ranks (mpi4py and the mpich wheel, 4 ranks oversubscribing the
machine's cores), launched with dist.launch: the same programs give the bits they give on
virtual devices, the collectives the bits of their fixed tree, and a failed, dying or hanging
rank is a RankFailure in the launching process."""
import numpy as np
import pytest

import tessera as ts
from tessera import dist, op
from tessera.errors import RankFailure, ShardingError

pytest.importorskip("mpi4py", reason="the test extra installs mpi4py (pip install mpi4py mpich)")


def _programs(seed):
    """The seeds' example, a contraction over a split dimension, reductions: run on whatever
    engine the mesh finds (MPI under dist.launch, virtual devices here)."""
    mesh = dist.Mesh(axes=["dp"], devices=range(4))
    X = dist.tensor((64, 24), layout=dist.ShardSpec(("row",), ("dp",)), mesh=mesh,
                    init="uniform", seed=seed)
    Y = op.pipeline([op.matmul(X, X.T), op.relu, op.layernorm])
    A = dist.tensor((16, 32), layout=dist.ShardSpec.per_dim(None, "dp"), mesh=mesh,
                    init="uniform", seed=seed + 1)
    B = dist.tensor((32, 8), layout=dist.ShardSpec.per_dim("dp", None), mesh=mesh,
                    init="uniform", seed=seed + 2)
    C = op.relu(A @ B - 4.0)
    return {"Y": dist.gather(Y), "C": dist.gather(C), "sum": dist.gather(X.sum(axis=0)),
            "max": dist.gather(X.max(axis=0)), "layout": Y.type_str, "engine": mesh.engine.name}


def test_mpi_ranks_give_the_virtual_devices_bits(rng):
    seed = int(rng.integers(1 << 30))
    results = dist.launch(_programs, 4, seed)
    here = _programs(seed)
    assert here["engine"] == "virtual"
    assert [r["engine"] for r in results] == ["mpi"] * 4
    for r in results:
        assert r["layout"] == "f32[64@dp, 64]"
        for k in ("Y", "C", "sum", "max"):
            np.testing.assert_array_equal(r[k], here[k])
    x = op.random_uniform((64, 24), seed)
    np.testing.assert_array_equal(here["Y"], ts.function(
        lambda a: op.layernorm(op.relu(op.matmul(a, a.T))))(x))


def _reduce_per_rank(seed, n):
    rank = dist.rank()
    mine = np.random.default_rng(seed + rank).standard_normal(n).astype(np.float32)
    mesh = dist.Mesh(axes=["dp"], devices=range(dist.world_size()))
    grads = {"w": mine, "b": [mine[:5] * 2]}
    out = ts.collectives.all_reduce(grads, op="sum", axis="dp", mesh=mesh)
    gathered = ts.collectives.all_gather(mine[:6], axis="dp", mesh=mesh)
    native = ts.collectives.all_reduce(mine, op="sum", axis="dp", mesh=mesh, order="native")
    return out["w"], out["b"][0], gathered, native


@pytest.mark.parametrize("n", [7, 1 << 20])      # MPI would pick another algorithm for each
def test_all_reduce_of_each_ranks_array_is_the_fixed_tree(rng, n):
    seed = int(rng.integers(1 << 30))
    results = dist.launch(_reduce_per_rank, 4, seed, n)
    terms = [np.random.default_rng(seed + r).standard_normal(n).astype(np.float32)
             for r in range(4)]
    want = (terms[0] + terms[1]) + (terms[2] + terms[3])
    want_b = (terms[0][:5] * 2 + terms[1][:5] * 2) + (terms[2][:5] * 2 + terms[3][:5] * 2)
    for w, b, g, native in results:
        np.testing.assert_array_equal(w, want)
        np.testing.assert_array_equal(b, want_b)
        np.testing.assert_array_equal(g, np.concatenate([t[:6] for t in terms]))
        # MPI's own order: the same sum to rounding, its bits not promised
        np.testing.assert_allclose(native, want, rtol=1e-5, atol=1e-5)


def _reduce_each_way(seed, n):
    """Every op and dtype of the pairwise all-reduce, a pytree packed into one buffer (reduced in
    place) and a single array (reduced into a new one), called twice (the scratch reused)."""
    rank = dist.rank()
    g = np.random.default_rng(seed + rank)
    mesh = dist.Mesh(axes=["dp"], devices=range(dist.world_size()))
    arrays = {"f32": g.standard_normal(n).astype(np.float32), "f64": g.standard_normal(n),
              "i32": g.integers(-1000, 1000, n).astype(np.int32),
              "bf16": g.standard_normal(n).astype(ts.bf16.np)}
    kept = {k: v.copy() for k, v in arrays.items()}
    out = {}
    for kind in ("sum", "mean", "max", "min"):
        for _ in range(2):
            out[kind] = ts.collectives.all_reduce({**arrays, "pair": [arrays["f32"][:3]]},
                                                  op=kind, axis="dp", mesh=mesh)
        out[kind + " alone"] = ts.collectives.all_reduce(arrays["f32"], op=kind, axis="dp",
                                                         mesh=mesh)
    assert all(np.array_equal(arrays[k], kept[k]) for k in arrays)      # inputs untouched
    return out


@pytest.mark.parametrize("ranks", [2, 3])
def test_every_op_and_dtype_reduces_by_the_tree(rng, ranks):
    seed, n = int(rng.integers(1 << 30)), int(rng.integers(5, 3000))
    from tessera.dist.engine import tree_reduce
    terms = []
    for r in range(ranks):
        g = np.random.default_rng(seed + r)
        terms.append({"f32": g.standard_normal(n).astype(np.float32), "f64": g.standard_normal(n),
                      "i32": g.integers(-1000, 1000, n).astype(np.int32),
                      "bf16": g.standard_normal(n).astype(ts.bf16.np)})
    for got in dist.launch(_reduce_each_way, ranks, seed, n):
        for kind in ("sum", "mean", "max", "min"):
            for k in ("f32", "f64", "i32", "bf16"):
                if kind == "mean" and k == "i32":
                    continue
                want = tree_reduce([t[k] for t in terms], kind)
                np.testing.assert_array_equal(got[kind][k], want, err_msg=f"{kind} {k}")
            np.testing.assert_array_equal(got[kind]["pair"][0], tree_reduce(
                [t["f32"][:3] for t in terms], kind))
            np.testing.assert_array_equal(got[kind + " alone"], tree_reduce(
                [t["f32"] for t in terms], kind))


def _fails_on_rank_2():
    if dist.rank() == 2:
        raise ValueError("rank two is unhappy")
    mesh = dist.Mesh(axes=["dp"], devices=range(4))
    return dist.gather(dist.tensor((8,), dist.ShardSpec(("row",), ("dp",)), mesh))


def test_a_rank_that_raises_is_a_rank_failure_naming_it():
    with pytest.raises(RankFailure, match="rank 2 of 4 failed") as e:
        dist.launch(_fails_on_rank_2, 4, timeout=120)
    assert e.value.rank == 2
    assert "rank two is unhappy" in str(e.value) and "_fails_on_rank_2" in str(e.value)


def _hangs():
    import time
    print("started")
    if dist.rank() == 1:
        time.sleep(600)
    return dist.rank()


def test_a_hanging_rank_is_killed_at_the_timeout(capsys):
    with pytest.raises(RankFailure, match="ran past 8 s"):
        dist.launch(_hangs, 2, timeout=8)


def _wrong_mesh():
    return dist.Mesh(axes=["dp"], devices=range(2))


def test_a_mesh_that_is_not_the_ranks_is_an_error():
    with pytest.raises(RankFailure, match="ShardingError") as e:
        dist.launch(_wrong_mesh, 4, timeout=120)
    assert "mpiexec -n 2" in str(e.value)


def test_output_arrives_in_rank_order(capsys):
    def hello():
        print(f"hello from {dist.rank()} of {dist.world_size()}")
        return dist.rank() * 10
    assert dist.launch(hello, 3) == [0, 10, 20]
    out = capsys.readouterr().out.splitlines()
    assert out == [f"[rank {r}] hello from {r} of 3" for r in range(3)]


def test_a_plain_collective_needs_mpi_here():
    with pytest.raises(ShardingError, match="one process per device"):
        ts.collectives.all_reduce(np.ones(2), axis="dp",
                                  mesh=dist.Mesh(axes=["dp"], devices=range(2)))


def _train(seed, steps=3, virtual_devices=None):
    """A small MLP trained with Adam, the gradient a batch_mean over 8 micro-batches."""
    import tessera as ts
    from tessera import dist, op
    g = np.random.default_rng(seed)
    x = g.standard_normal((64, 10)).astype(np.float32)
    y = g.standard_normal((64, 1)).astype(np.float32)
    params = {"w1": g.standard_normal((10, 16)).astype(np.float32) * 0.3,
              "w2": g.standard_normal((16, 1)).astype(np.float32) * 0.3}
    n = virtual_devices or dist.world_size()
    mesh = dist.Mesh(axes=["dp"], devices=range(n))

    def loss(p, xb, yb):
        h = op.tanh(xb @ p["w1"])
        return op.mean((h @ p["w2"] - yb) ** 2)
    vg = ts.value_and_grad(loss)
    opt = ts.optim.Adam(1e-2)
    state = opt.init(params)
    update = ts.function(lambda g_, s, p: opt.update(g_, s, p))
    for _ in range(steps):
        value, grads = dist.batch_mean(lambda b: vg(params, b[0], b[1]), (x, y),
                                       micro_batches=8, axis="dp", mesh=mesh)
        params, state = update(grads, state, params)
    return value, params


def test_data_parallel_training_has_the_same_bits_on_1_2_and_4_ranks(rng):
    seed = int(rng.integers(1 << 30))
    one = _train(seed, virtual_devices=1)
    four_virtual = _train(seed, virtual_devices=4)
    runs = [dist.launch(_train, n, seed)[0] for n in (2, 4)]
    for value, params in [four_virtual] + runs:
        np.testing.assert_array_equal(value, one[0])
        for k in params:
            np.testing.assert_array_equal(params[k], one[1][k])


def test_batch_mean_checks_its_shares():
    mesh = dist.Mesh(axes=["dp"], devices=range(4))
    with pytest.raises(ShardingError, match="power of two"):
        dist.batch_mean(lambda b: b, np.ones((12, 2)), micro_batches=12, mesh=mesh)
    with pytest.raises(ShardingError, match="equal micro-batches"):
        dist.batch_mean(lambda b: b, np.ones((10, 2)), micro_batches=8, mesh=mesh)


def test_a_launcher_of_another_mpi_is_a_clear_error(monkeypatch, tmp_path):
    """mpiexec from one MPI and mpi4py on another start n worlds of one rank each: said so."""
    fake = tmp_path / "singletons"
    fake.write_text('#!/bin/bash\nshift 2\nfor i in 1 2; do env -u PMI_SIZE -u PMI_RANK '
                    '-u PMI_FD -u PMI_PORT -u PMI_ID "$@" & done; wait\n')
    fake.chmod(0o755)
    monkeypatch.setenv("TESSERA_MPIEXEC", str(fake))
    with pytest.raises(RankFailure, match="TESSERA_MPIEXEC"):
        dist.launch(_hello_plain, 2, timeout=120)


def _hello_plain():
    return dist.rank()


def _pipeline_run(seed, micro_batches, n_stages=4):
    """A 4-stage tanh MLP trained through dist.Pipeline (stage s on rank s)."""
    from tessera import dist, op
    g = np.random.default_rng(seed)
    params = [{"w": g.standard_normal((8, 8)).astype(np.float32) * 0.5,
               "b": g.standard_normal(8).astype(np.float32) * 0.1} for _ in range(n_stages)]
    x = g.standard_normal((32, 8)).astype(np.float32)
    y = g.standard_normal((32, 8)).astype(np.float32)
    mesh = dist.Mesh(axes=["pp"], devices=range(n_stages))

    def stage(p, h):
        return op.tanh(h @ p["w"] + p["b"])
    pipe = dist.Pipeline([stage] * n_stages, mesh=mesh, axis="pp",
                         loss=lambda out, t: op.mean((out - t) ** 2))
    loss, grads = pipe.value_and_grad(params, x, y, micro_batches=micro_batches)
    return loss, grads, mesh.engine.name, dist.rank()


@pytest.mark.parametrize("micro_batches", [8, 2])       # 2 < 4 stages: no steady state
def test_a_pipeline_on_4_ranks_gives_the_virtual_devices_bits(rng, micro_batches):
    seed = int(rng.integers(1 << 30))
    here_loss, here_grads, engine, _ = _pipeline_run(seed, micro_batches)
    assert engine == "virtual"
    for loss, grads, engine, rank in dist.launch(_pipeline_run, 4, seed, micro_batches):
        assert engine == "mpi"
        np.testing.assert_array_equal(loss, here_loss)
        for s, g in enumerate(grads):            # each rank holds its own stage's gradients
            if s != rank:
                assert g is None
                continue
            for k in g:
                np.testing.assert_array_equal(g[k], here_grads[s][k])
    # against the whole model's gradient (the mean over the batch), within rounding
    g = np.random.default_rng(seed)
    params = [{"w": g.standard_normal((8, 8)).astype(np.float32) * 0.5,
               "b": g.standard_normal(8).astype(np.float32) * 0.1} for _ in range(4)]
    x = g.standard_normal((32, 8)).astype(np.float32)
    y = g.standard_normal((32, 8)).astype(np.float32)

    def whole(ps, xb, yb):
        h = xb
        for p in ps:
            h = op.tanh(h @ p["w"] + p["b"])
        return op.mean((h - yb) ** 2)
    loss, grads = ts.value_and_grad(whole)(params, x, y)
    np.testing.assert_allclose(here_loss, loss, rtol=1e-5)
    for s in range(4):
        for k in ("w", "b"):
            np.testing.assert_allclose(here_grads[s][k], grads[s][k], rtol=1e-4, atol=1e-6)


def _moe_rank(seed, capacity):
    """Expert parallelism: 4 ranks, each holding 16 tokens and one expert. Top-1 routing, each
    rank's tokens bucketed per expert (the first `capacity` of each, in token order; the rest
    dropped), one all_to_all to the experts' ranks, the expert's layer, one all_to_all back."""
    import tessera as ts
    from tessera import dist, op
    rank, p = dist.rank(), dist.world_size()
    mesh = dist.Mesh(axes=["ep"], devices=range(p))
    g = np.random.default_rng(seed)
    x_all = g.standard_normal((p, 16, 8)).astype(np.float32)
    w_gate = g.standard_normal((8, p)).astype(np.float32)
    experts = g.standard_normal((p, 8, 8)).astype(np.float32)
    x = x_all[rank]
    probs = ts.function(lambda v, w: op.softmax(v @ w, axis=-1))(x, w_gate)
    choice = probs.argmax(-1)
    buckets = np.zeros((p, capacity, 8), np.float32)
    slot = np.full(len(x), -1)
    for t, e in enumerate(choice):
        used = int((slot[:t][choice[:t] == e] >= 0).sum())
        if used < capacity:
            slot[t] = used
            buckets[e, used] = x[t]
    arrived = ts.collectives.all_to_all(buckets, axis="ep", mesh=mesh, split_dim=0, concat_dim=0)
    layer = ts.function(lambda v, w: op.gelu(v @ w))
    done = layer(arrived.reshape(-1, 8), experts[rank]).reshape(p, capacity, 8)
    back = ts.collectives.all_to_all(done, axis="ep", mesh=mesh, split_dim=0, concat_dim=0)
    out = np.zeros_like(x)
    for t, e in enumerate(choice):
        if slot[t] >= 0:
            out[t] = probs[t, e] * back[e, slot[t]]
    return out, choice, slot, probs


@pytest.mark.parametrize("capacity", [16, 3])            # room for every token; drops
def test_expert_parallel_moe_with_all_to_all(rng, capacity):
    """The layer's output on the ranks equals the single process's: each kept token through its
    expert's compiled layer (the GEMM is row-invariant: the same bits in any batch), scaled by
    its gate; dropped tokens 0."""
    seed = int(rng.integers(1 << 30))
    results = dist.launch(_moe_rank, 4, seed, capacity)
    g = np.random.default_rng(seed)
    x_all = g.standard_normal((4, 16, 8)).astype(np.float32)
    g.standard_normal((8, 4))
    experts = g.standard_normal((4, 8, 8)).astype(np.float32)
    layer = ts.function(lambda v, w: op.gelu(v @ w))
    dropped = 0
    for r, (out, choice, slot, probs) in enumerate(results):
        for t in range(16):
            e = choice[t]
            if slot[t] < 0:
                dropped += 1
                np.testing.assert_array_equal(out[t], 0)
                continue
            want = probs[t, e] * layer(x_all[r][t:t + 1], experts[e])[0]
            np.testing.assert_array_equal(out[t], want)
    assert (dropped == 0) == (capacity == 16)


def _dies_on_rank_1():
    import os
    mesh = dist.Mesh(axes=["dp"], devices=range(3))
    if dist.rank() == 1:
        os._exit(3)             # no exception, no MPI_Finalize: the process is just gone
    return ts.collectives.all_reduce(np.ones(4), axis="dp", mesh=mesh)


def test_a_rank_that_dies_is_a_rank_failure_not_a_hang():
    """The others wait in a collective for the dead rank: the launcher ends them, and the
    launching process gets a RankFailure saying so (not the timeout's "ran past")."""
    with pytest.raises(RankFailure, match="ended without a result"):
        dist.launch(_dies_on_rank_1, 3, timeout=120)
