"""tessera.dist on virtual devices (one process): layouts, sharding rules, pending reductions and
the fixed-order collectives, each against NumPy or the single-process compiled program on fresh
random inputs. Real MPI ranks: tests/dist/test_mpi.py."""
import numpy as np
import pytest

import tessera as ts
from tessera import dist, op
from tessera.dist.engine import tree_reduce
from tessera.errors import ShardingError

ROW = dist.ShardSpec(("row",), ("dp",))


@pytest.fixture
def mesh4():
    return dist.Mesh(axes=["dp"], devices=range(4))


def test_the_seeds_example_gives_the_single_process_bits(rng, mesh4):
    """op.pipeline([op.matmul(X, X.T), op.relu, op.layernorm]) on a row-split X: X.T's columns
    are gathered (the axis cannot split both the rows and the columns), every rank runs the
    compiled GEMM and layernorm on its rows, and the result has the bits of the program run
    whole (the kernels are batch-invariant)."""
    x = rng.standard_normal((96, 40)).astype(np.float32)
    X = dist.shard(x, ROW, mesh4)
    assert repr(X) == "DTensor(f32[96@dp, 40] on Mesh(dp=4; virtual))"
    Y = op.pipeline([op.matmul(X, X.T), op.relu, op.layernorm])
    assert Y.type_str == "f32[96@dp, 96]"
    whole = ts.function(lambda a: op.layernorm(op.relu(op.matmul(a, a.T))))(x)
    np.testing.assert_array_equal(dist.gather(Y), whole)
    np.testing.assert_allclose(whole, _layernorm(np.maximum(x @ x.T, 0)), rtol=1e-4, atol=1e-5)


def _layernorm(a, eps=1e-5):
    a = a.astype(np.float64)
    m = a.mean(-1, keepdims=True)
    return (a - m) / np.sqrt(a.var(-1, keepdims=True) + eps)


def test_dist_tensor_draws_the_same_numbers_on_any_mesh():
    """init="uniform": each rank draws its block by the elements' global indices, so the tensor
    is op.random_uniform's whatever the mesh and layout."""
    want = op.random_uniform((12, 8), 7)
    for axes, spec in ((["dp"], ROW), (["a", "b"], dist.ShardSpec(("row", "col"), ("a", "b"))),
                       (["a", "b"], dist.ShardSpec.per_dim(None, ("a", "b")))):
        mesh = dist.Mesh(axes=axes, devices=range(4))
        X = dist.tensor((12, 8), layout=spec, mesh=mesh, init="uniform", seed=7)
        np.testing.assert_array_equal(dist.gather(X), want)


def test_a_mesh_infers_its_axis_sizes_and_orders_its_ranks():
    m = dist.Mesh(axes=["tp", "pp", "dp"], devices=range(8))
    assert m.shape == {"tp": 2, "pp": 2, "dp": 2}
    assert dist.Mesh(axes=["a", "b"], devices=range(12)).shape == {"a": 3, "b": 4}
    assert dist.Mesh(axes={"tp": 4, "dp": 2}).shape == {"tp": 4, "dp": 2}
    # row-major: the last axis varies fastest; a group over an axis is in that axis' order
    assert m.coords(5) == {"tp": 1, "pp": 0, "dp": 1}
    assert m.group(5, ("tp",)) == [1, 5] and m.group(5, ("pp", "dp")) == [4, 5, 6, 7]


def test_the_seeds_2d_layout_splits_rows_and_columns():
    m = dist.Mesh(axes=["tp", "pp", "dp"], devices=range(8))
    W = dist.tensor(shape=(64, 32), layout=dist.ShardSpec(partition=("row", "col"),
                                                          mesh_axes=("tp", "pp")),
                    mesh=m, dtype="bf16", init="uniform", seed=1)
    assert W.type_str == "bf16[64@tp, 32@pp]" and W.dtype == ts.bf16.np
    assert {b.shape for b in W.blocks.values()} == {(32, 16)}
    # the dp axis replicates: ranks differing only in dp hold the same block
    np.testing.assert_array_equal(W.blocks[0], W.blocks[1])
    whole = op.random_uniform((64, 32), 1).astype(ts.bf16.np)
    np.testing.assert_array_equal(dist.gather(W), whole)
    np.testing.assert_array_equal(W.blocks[m.rank_of({"tp": 1, "pp": 0, "dp": 0})],
                                  whole[32:, :16])


@pytest.mark.parametrize("a_spec,b_spec,out,bitwise", [
    (("dp", None), (None, None), "f32[32@dp, 24]", True),       # row-parallel
    ((None, None), (None, "dp"), "f32[32, 24@dp]", True),       # column-parallel
    ((None, "dp"), ("dp", None), "f32[32, 24] +sum@dp", False),  # contraction split: pending
    ((None, "dp"), (None, None), "f32[32, 24] +sum@dp", False),  # b sliced to match
    (("dp", None), (None, "dp"), "f32[32@dp, 24]", True),       # dp wanted twice: b gathered
])
def test_matmul_layouts(rng, mesh4, a_spec, b_spec, out, bitwise):
    a = rng.standard_normal((32, 16)).astype(np.float32)
    b = rng.standard_normal((16, 24)).astype(np.float32)
    A = dist.shard(a, dist.ShardSpec.per_dim(*a_spec), mesh4)
    B = dist.shard(b, dist.ShardSpec.per_dim(*b_spec), mesh4)
    C = op.matmul(A, B)
    assert C.type_str == out
    got = dist.gather(C)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    if bitwise:
        np.testing.assert_array_equal(got, ts.function(lambda x, y: op.matmul(x, y))(a, b))


def test_batched_matmul_keeps_a_split_batch(rng, mesh4):
    a = rng.standard_normal((4, 8, 6)).astype(np.float32)
    b = rng.standard_normal((4, 6, 5)).astype(np.float32)
    spec = dist.ShardSpec(("row",), ("dp",))
    C = op.matmul(dist.shard(a, spec, mesh4), dist.shard(b, spec, mesh4))
    assert C.type_str == "f32[4@dp, 8, 5]"
    np.testing.assert_array_equal(dist.gather(C), ts.function(lambda x, y: x @ y)(a, b))


def test_a_pending_sum_passes_only_through_linear_operators(rng, mesh4):
    """relu of a pending sum is not the sum of relus: relu takes the reduction first. add and
    a scale keep it pending, and the value is right either way."""
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 12)).astype(np.float32)
    A = dist.shard(a, dist.ShardSpec.per_dim(None, "dp"), mesh4)
    B = dist.shard(b, dist.ShardSpec.per_dim("dp", None), mesh4)
    C = A @ B
    want = a.astype(np.float64) @ b
    assert (C + C).type_str == "f32[8, 12] +sum@dp"
    assert (C * 2.0).type_str == "f32[8, 12] +sum@dp"
    R = op.relu(C)
    assert R.type_str == "f32[8, 12]"
    np.testing.assert_allclose(dist.gather(R), np.maximum(want, 0), rtol=1e-5, atol=1e-5)
    # a pending sum plus a whole value: the sum is taken first (else each rank would add it)
    bias = rng.standard_normal(12).astype(np.float32)
    np.testing.assert_allclose(dist.gather(C + bias), want + bias, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dist.gather(op.exp(C * 0.1)), np.exp(want * 0.1), rtol=1e-5)


def test_pending_max_and_sum_are_kept_apart(rng, mesh4):
    """A reduction over a split dimension leaves a pending max (or sum): it is taken with its
    own operation, and a max of a pending sum takes the sum first (DTensor's old bug: a max
    applied before the pending reduction)."""
    x = rng.standard_normal((16, 5)).astype(np.float32)
    X = dist.shard(x, ROW, mesh4)
    M = X.max(axis=0)
    assert M.type_str == "f32[5] +max@dp"
    np.testing.assert_array_equal(dist.gather(M), x.max(0))
    np.testing.assert_array_equal(dist.gather(op.relu(M - 0.5)), np.maximum(x.max(0) - 0.5, 0))
    assert X.sum(axis=0).type_str == "f32[5] +sum@dp"
    np.testing.assert_allclose(dist.gather(X.sum(axis=0)), x.sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dist.gather(X.mean(axis=0)), x.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(dist.gather(op.min(X, axis=0)), x.min(0))
    # the max over the rows of a pending sum: the sum first
    a = rng.standard_normal((8, 16)).astype(np.float32)
    A = dist.shard(a, dist.ShardSpec.per_dim(None, "dp"), mesh4)
    S = A.sum(axis=1)
    assert S.type_str == "f32[8] +sum@dp"
    np.testing.assert_allclose(dist.gather(S.max()), a.sum(1).max(), rtol=1e-5)
    # reducing a dimension no axis splits keeps the split of the others
    assert X.sum(axis=1).type_str == "f32[16@dp]"
    np.testing.assert_array_equal(dist.gather(X.sum(axis=1)),
                                  ts.function(lambda v: op.sum(v, axis=1))(x))


def test_elementwise_broadcasting_and_moved_splits(rng, mesh4):
    x = rng.standard_normal((8, 12)).astype(np.float32)
    y = rng.standard_normal((8, 12)).astype(np.float32)
    bias = rng.standard_normal(12).astype(np.float32)
    X = dist.shard(x, ROW, mesh4)
    Yc = dist.shard(y, dist.ShardSpec.per_dim(None, "dp"), mesh4)
    Z = X * Yc + bias                   # Y's columns split moves to rows (one all-to-all)
    assert Z.type_str == "f32[8@dp, 12]"
    np.testing.assert_array_equal(dist.gather(Z), x * y + bias)
    np.testing.assert_array_equal(dist.gather(op.gelu(X)), ts.function(lambda v: op.gelu(v))(x))
    np.testing.assert_array_equal(dist.gather(2.0 - X), 2.0 - x)


def test_operators_over_an_axis_gather_that_axis(rng, mesh4):
    x = rng.standard_normal((8, 12)).astype(np.float32)
    Xc = dist.shard(x, dist.ShardSpec.per_dim(None, "dp"), mesh4)
    S = op.softmax(Xc, axis=-1)
    assert S.type_str == "f32[8, 12]"
    Xr = dist.shard(x, ROW, mesh4)
    assert op.softmax(Xr, axis=-1).type_str == "f32[8@dp, 12]"
    want = ts.function(lambda v: op.softmax(v, axis=-1))(x)
    np.testing.assert_array_equal(dist.gather(S), want)
    np.testing.assert_array_equal(dist.gather(op.softmax(Xr, axis=-1)), want)
    # an operator without a rule: operands gathered, result replicated, still right
    R = op.concat([Xr, Xr], axis=1)
    assert R.type_str == "f32[8, 24]"
    np.testing.assert_array_equal(dist.gather(R), np.concatenate([x, x], axis=1))


def test_all_reduce_is_one_tree_in_rank_order(rng, mesh4):
    """The blocks are the terms, combined ((b0+b1)+(b2+b3)): the same bits whatever engine,
    message size or MPI library. Checked against that tree written in NumPy."""
    terms = [rng.standard_normal(1001).astype(np.float32) * 10 ** k for k in range(4)]
    X = dist.DTensor(mesh4, (1001,), np.float32, dist.Layout(((),)),
                     {r: terms[r] for r in range(4)})
    got = ts.collectives.all_reduce(X, op="sum", axis="dp")
    want = (terms[0] + terms[1]) + (terms[2] + terms[3])
    for r in range(4):
        np.testing.assert_array_equal(got.blocks[r], want)
    mean = ts.collectives.all_reduce({"w": X}, op="mean", axis="dp")["w"]
    np.testing.assert_array_equal(mean.blocks[2], want / np.float32(4))
    mx = ts.collectives.all_reduce(X, op="max", axis="dp")
    np.testing.assert_array_equal(mx.blocks[0], np.max(terms, axis=0))
    # three terms: the odd last one carried up
    np.testing.assert_array_equal(tree_reduce(terms[:3], "sum"),
                                  (terms[0] + terms[1]) + terms[2])


def test_bf16_terms_are_summed_in_float32_and_rounded_once(rng):
    t = [rng.standard_normal(64).astype(ts.bf16.np) for _ in range(4)]
    f = [a.astype(np.float32) for a in t]
    np.testing.assert_array_equal(tree_reduce(t, "sum"),
                                  ((f[0] + f[1]) + (f[2] + f[3])).astype(ts.bf16.np))


def test_gather_scatter_and_all_to_all(rng, mesh4):
    x = rng.standard_normal((8, 12)).astype(np.float32)
    X = dist.shard(x, ROW, mesh4)
    G = ts.collectives.all_gather(X, axis="dp")
    assert G.type_str == "f32[8, 12]"
    np.testing.assert_array_equal(G.blocks[3], x)
    S = ts.collectives.scatter(G, axis="dp", dim=1)
    assert S.type_str == "f32[8, 12@dp]"
    np.testing.assert_array_equal(S.blocks[1], x[:, 3:6])
    T = ts.collectives.all_to_all(X, axis="dp", split_dim=1, concat_dim=0)
    assert T.type_str == "f32[8, 12@dp]"
    np.testing.assert_array_equal(T.blocks[2], x[:, 6:9])
    # reduce-scatter: the members' blocks summed, each keeping its part of dim 0
    terms = [rng.standard_normal((8, 3)).astype(np.float32) for _ in range(4)]
    P = dist.DTensor(mesh4, (8, 3), np.float32, dist.Layout(((), ())), dict(enumerate(terms)))
    RS = ts.collectives.reduce_scatter(P, axis="dp", dim=0)
    assert RS.type_str == "f32[8@dp, 3]"
    want = (terms[0] + terms[1]) + (terms[2] + terms[3])
    np.testing.assert_array_equal(dist.gather(RS), want)


def test_a_pending_sum_becomes_a_split_by_one_reduce_scatter(rng, mesh4):
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 4)).astype(np.float32)
    C = dist.shard(a, dist.ShardSpec.per_dim(None, "dp"), mesh4) @ \
        dist.shard(b, dist.ShardSpec.per_dim("dp", None), mesh4)
    from tessera.dist.collectives import redistribute
    R = redistribute(C, dist.Layout((("dp",), ())))
    assert R.type_str == "f32[8@dp, 4]"
    np.testing.assert_array_equal(dist.gather(R), dist.gather(C))
    np.testing.assert_allclose(dist.gather(R), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_bad_layouts_are_errors_naming_the_line(mesh4):
    with pytest.raises(ShardingError, match="does not divide") as e:
        dist.tensor((10, 4), layout=ROW, mesh=mesh4)
    assert "test_dist.py" in str(e.value) and "never replicates silently" in str(e.value)
    with pytest.raises(ShardingError, match="'tp' is not in the mesh"):
        dist.tensor((8, 4), layout=dist.ShardSpec(("row",), ("tp",)), mesh=mesh4)
    with pytest.raises(ShardingError, match="do not hold 4 devices"):
        dist.Mesh(axes=["a", "b"], devices=range(4), shape=(3, 2))
    other = dist.Mesh(axes=["x"], devices=range(2))
    with pytest.raises(ShardingError, match="different meshes") as e:
        op.add(dist.tensor((8,), ROW, mesh4), dist.tensor((8,), None, other))
    assert "test_dist.py" in str(e.value)
    with pytest.raises(ShardingError, match="dist.gather"):
        np.asarray(dist.tensor((8,), ROW, mesh4))
    with pytest.raises(ShardingError, match="a mesh axis splits two dimensions"):
        dist.tensor((8, 8), dist.ShardSpec(("row", "col"), ("dp", "dp")), mesh4)
    with pytest.raises(ShardingError, match="needs one process per device"):
        ts.collectives.all_reduce(np.ones(3), axis="dp", mesh=mesh4)
    with pytest.raises(ShardingError, match="splits a dimension"):
        ts.collectives.all_reduce(dist.tensor((8,), ROW, mesh4), axis="dp")
    with pytest.raises(ShardingError, match="unknown dimension"):
        dist.ShardSpec(("rows",), ("dp",))


def test_batch_mean_is_the_tree_over_micro_batches(rng):
    """The mean of 8 micro-batches' gradients: the tree ((g0+g1)+(g2+g3))+((g4+g5)+(g6+g7))
    over 8, exactly, on 1, 2 or 4 devices; and the whole batch's gradient to rounding."""
    x = rng.standard_normal((32, 6)).astype(np.float32)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    grad = ts.grad(lambda w, xb: op.mean(op.tanh(xb @ w) ** 2))
    micro = [grad(w, x[4 * j:4 * j + 4]) for j in range(8)]
    pair = [micro[i] + micro[i + 1] for i in range(0, 8, 2)]
    want = ((pair[0] + pair[1]) + (pair[2] + pair[3])) / np.float32(8)
    for n in (1, 2, 4):
        mesh = dist.Mesh(axes=["dp"], devices=range(n))
        got = dist.batch_mean(lambda xb: grad(w, xb), x, micro_batches=8, mesh=mesh)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(want, grad(w, x), rtol=1e-5, atol=1e-6)


def test_a_pipeline_checks_its_stages_and_batch():
    mesh = dist.Mesh(axes=["pp"], devices=range(2))
    with pytest.raises(ShardingError, match="3 stages on a mesh axis of 2"):
        dist.Pipeline([lambda p, h: h] * 3, mesh=mesh, loss=lambda y, t: op.mean(y))
    pipe = dist.Pipeline([lambda p, h: h * p] * 2, mesh=mesh, loss=lambda y, t: op.mean(y - t))
    with pytest.raises(ShardingError, match="equal micro-batches"):
        pipe.value_and_grad([np.float32(1), np.float32(2)], np.ones((10, 2), np.float32),
                            np.ones((10, 2), np.float32), micro_batches=4)
