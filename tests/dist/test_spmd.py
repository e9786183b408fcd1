"""A tessera function called with sharded tensors: the sharding pass on its Graph IR, the
collectives it inserts and what they cost, SPMD execution (the same bits as the eager sharded
operators and, where no sum crosses ranks, as the single-process program), and gradients."""
import numpy as np
import pytest

import tessera as ts
from tessera import dist, nn, op
from tessera.dist.spmd import plan_for

ROW = dist.ShardSpec(("row",), ("dp",))
COL = dist.ShardSpec.per_dim(None, "dp")


@pytest.fixture
def mesh4():
    return dist.Mesh(axes=["dp"], devices=range(4))


@ts.function
def seeds(a):
    return op.layernorm(op.relu(op.matmul(a, a.T)))


def test_the_seeds_example_as_a_function(rng, mesh4):
    x = rng.standard_normal((64, 32)).astype(np.float32)
    X = dist.shard(x, ROW, mesh4)
    Y = seeds(X)
    assert Y.type_str == "f32[64@dp, 64]"
    np.testing.assert_array_equal(dist.gather(Y), seeds(x))
    np.testing.assert_array_equal(dist.gather(Y),
                                  dist.gather(op.layernorm(op.relu(op.matmul(X, X.T)))))
    p = plan_for(seeds, X)
    text = str(p)
    assert "%a: f32[64@dp, 32]" in text and "all_gather(%0) {axis=dp, dim=1}" in text
    assert "matmul(%a, %c0)" in text and "test_spmd.py" in text
    report = p.comm_report()
    assert list(report["collective"]) == ["all_gather"]
    # each rank receives the 3 other blocks of x.T: 3 * 32 * 16 floats
    assert list(report["bytes per rank"]) == [3 * 32 * 16 * 4] == [p.bytes_per_rank]


def test_a_function_is_planned_once_per_layouts(rng, mesh4):
    x = rng.standard_normal((16, 8)).astype(np.float32)
    f = ts.function(lambda a: op.exp(a) * 2.0)
    f(dist.shard(x, ROW, mesh4))
    f(dist.shard(x + 1, ROW, mesh4))
    assert len(f._spmd_plans) == 1
    Z = f(dist.shard(x, COL, mesh4))
    assert len(f._spmd_plans) == 2 and Z.type_str == "f32[16, 8@dp]"
    np.testing.assert_array_equal(dist.gather(Z), f(x))


def test_a_contraction_over_the_split_takes_one_all_reduce(rng, mesh4):
    """a is split by columns, w whole: w is sliced (no communication), the product is a pending
    sum, reduced once before gelu; the later operators run whole on every rank."""
    a = rng.standard_normal((32, 16)).astype(np.float32)
    w = rng.standard_normal((16, 8)).astype(np.float32)

    @ts.function
    def f(a, w):
        h = op.gelu(a @ w)
        return (h * h).sum(), h * 3.0
    A = dist.shard(a, COL, mesh4)
    p = plan_for(f, A, w)
    kinds = list(p.comm_report()["collective"])
    assert kinds == ["slice", "all_reduce"], kinds
    assert "+sum@dp" in str(p)
    s, h = f(A, w)
    want_h = a.astype(np.float64) @ w
    want_h = want_h * 0.5 * (1 + np.vectorize(__import__("math").erf)(want_h / np.sqrt(2)))
    np.testing.assert_allclose(dist.gather(h), want_h * 3.0, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dist.gather(s), (want_h ** 2).sum(), rtol=1e-4)
    # the same bits as the eager sharded operators (one plan, one order)
    he = op.gelu(A @ w)
    np.testing.assert_array_equal(dist.gather(h), dist.gather(he * 3.0))


def test_gradients_of_a_sharded_function(rng, mesh4):
    """ts.grad traces the gradient graph on the global types and the same pass shards it:
    gradients equal the single-process ones (to rounding: the contraction's sum is split), and
    finite differences agree with the single-process gradient."""
    a = rng.standard_normal((16, 12)).astype(np.float32)
    w = rng.standard_normal((12, 4)).astype(np.float32)
    loss = ts.grad(lambda a, w: (op.tanh(a @ w) ** 2).sum(), argnums=(0, 1))
    ga, gw = loss(dist.shard(a, COL, mesh4), w)
    ra, rw = loss(a, w)
    np.testing.assert_allclose(dist.gather(ga), ra, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dist.gather(gw), rw, rtol=1e-4, atol=1e-5)
    # data parallel: rows of the batch split, w whole; its gradient is a pending sum
    ga2, gw2 = loss(dist.shard(a, ROW, mesh4), w)
    assert "+sum@dp" in gw2.type_str
    np.testing.assert_allclose(dist.gather(gw2), rw, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(dist.gather(ga2), ra)      # row-local: the same bits


def test_a_pytree_of_sharded_parameters(rng, mesh4):
    params = {"w": rng.standard_normal((8, 8)).astype(np.float32),
              "b": rng.standard_normal(8).astype(np.float32)}
    x = rng.standard_normal((16, 8)).astype(np.float32)
    sharded = {"w": dist.shard(params["w"], COL, mesh4), "b": dist.shard(params["b"], ROW, mesh4)}

    @ts.function
    def layer(p, x):
        return op.relu(x @ p["w"] + p["b"])
    Y = layer(sharded, x)                     # column-parallel: the output's columns split
    assert Y.type_str == "f32[16, 8@dp]"
    np.testing.assert_array_equal(dist.gather(Y), layer(params, x))


def test_control_flow_in_a_sharded_function_is_a_clear_error(rng, mesh4):
    X = dist.shard(rng.standard_normal((8, 4)).astype(np.float32), ROW, mesh4)
    f = ts.function(lambda a: ts.fori_loop(0, 3, lambda i, c: c * 2.0, a))
    with pytest.raises(ts.ShardingError, match="control flow"):
        f(X)


def test_the_plan_is_drawn_with_its_layouts_and_collectives(rng, mesh4):
    from tessera import viz
    X = dist.shard(rng.standard_normal((16, 8)).astype(np.float32), ROW, mesh4)
    p = dist.plan(seeds, X)
    dot = viz.graph_dot(p)
    assert 'label="f32[16@dp, 8]"' in dot and 'label="f32[8, 16]"' in dot
    assert "all_gather" in dot and "over dp: 384 bytes per rank" in dot
    assert '"c0" -> "n1"' in dot and "Mesh(dp=4; virtual)" in dot
    assert viz.graph_image(p).svg.startswith("<svg")


def test_a_tensor_parallel_mlp_takes_one_all_reduce(rng):
    """Megatron's MLP: the first weight split by columns, the second by rows; the hidden
    activations stay split, and the output is a pending sum: one all-reduce when it is needed."""
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    x = rng.standard_normal((8, 12)).astype(np.float32)
    w1 = rng.standard_normal((12, 16)).astype(np.float32)
    w2 = rng.standard_normal((16, 12)).astype(np.float32)

    @ts.function
    def mlp(x, w1, w2):
        return op.gelu(x @ w1) @ w2
    W1 = dist.shard(w1, dist.ShardSpec.per_dim(None, "tp"), mesh)
    W2 = dist.shard(w2, dist.ShardSpec.per_dim("tp", None), mesh)
    p = dist.plan(mlp, x, W1, W2)
    assert p.comm_report().empty          # nothing moves inside; x is whole on every rank
    Y = mlp(x, W1, W2)
    assert Y.type_str == "f32[8, 12] +sum@tp"
    np.testing.assert_allclose(dist.gather(Y), mlp(x, w1, w2), rtol=1e-4, atol=1e-4)


def test_attention_with_heads_split(rng, mesh4):
    q, k, v = (rng.standard_normal((2, 4, 16, 8)).astype(np.float32) for _ in range(3))
    heads = dist.ShardSpec.per_dim(None, "dp")
    att = ts.function(lambda q, k, v: op.attention(q, k, v, causal=True))
    Q, K, V = (dist.shard(t, heads, mesh4) for t in (q, k, v))
    O = att(Q, K, V)
    assert O.type_str == "f32[2, 4@dp, 16, 8]" and dist.plan(att, Q, K, V).comm_report().empty
    np.testing.assert_array_equal(dist.gather(O), att(q, k, v))
    np.testing.assert_array_equal(dist.gather(op.attention(Q, K, V, causal=True)), att(q, k, v))


@pytest.mark.parametrize("body", [
    lambda v: v[2:5] * 2, lambda v: op.reshape(v, (4, 8)) + 1, lambda v: op.cumsum(v, axis=0),
    lambda v: op.argmax(v, axis=1), lambda v: op.softmax(v, axis=0),
    lambda v: op.exp(v).sum(axis=1, keepdim=True) / v, lambda v: op.where(v > 0.5, v, -v)])
def test_operators_with_and_without_rules_give_the_single_process_bits(rng, mesh4, body):
    """Row-split inputs through indexing, reshapes, scans, argmax, softmax over the split axis
    and comparisons: what has no rule is gathered first, and every result is right."""
    x = rng.standard_normal((8, 4)).astype(np.float32)
    f = ts.function(body)
    np.testing.assert_array_equal(dist.gather(f(dist.shard(x, ROW, mesh4))), f(x))
    np.testing.assert_array_equal(dist.gather(body(dist.shard(x, ROW, mesh4))), f(x))


def test_a_reshape_keeps_a_leading_split(rng, mesh4):
    """[B@dp, S, D] -> [B*S@dp, D] and back: the split stays (the blocks' shapes are local),
    nothing moves, the single-process bits."""
    x = rng.standard_normal((8, 6, 5)).astype(np.float32)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    f = ts.function(lambda v, w: op.reshape(op.reshape(v, (48, 5)) @ w, (8, 6, 3)))
    X = dist.shard(x, ROW, mesh4)
    p = dist.plan(f, X, w)
    assert p.comm_report().empty, str(p)
    Y = f(X, w)
    assert Y.type_str == "f32[8@dp, 6, 3]"
    np.testing.assert_array_equal(dist.gather(Y), f(x, w))
    np.testing.assert_array_equal(dist.gather(op.reshape(X, (48, 5))), x.reshape(48, 5))
    # a reshape the split does not divide gathers first
    np.testing.assert_array_equal(dist.gather(op.reshape(X, (2, 120))), x.reshape(2, 120))


def test_zero_1_sharded_optimizer_state(rng, mesh4):
    """The seeds' ZeRO step: parameters scattered over dp (no communication), each rank's
    gradient a pending sum reduce-scattered onto its shard, Adam's update run on the shards of
    the parameters and moments, the parameters gathered again: the replicated update's bits."""
    w = {"w": rng.standard_normal((16, 8)).astype(np.float32)}
    grads = [{"w": rng.standard_normal((16, 8)).astype(np.float32)} for _ in range(4)]
    opt = ts.optim.Adam(1e-2)
    update = ts.function(lambda g, s, p: opt.update(g, s, p))
    # replicated: the gradient is the tree of the four ranks' gradients
    total = {"w": (grads[0]["w"] + grads[1]["w"]) + (grads[2]["w"] + grads[3]["w"])}
    want, _ = update(total, opt.init(w), w)
    # sharded: each rank holds a quarter of the rows of the parameters and moments
    P = ts.collectives.scatter({"w": dist.shard(w["w"], None, mesh4)}, axis="dp", mesh=mesh4)
    state = opt.init(w)
    S = {"step": state["step"],
         "m": ts.collectives.scatter({"w": dist.shard(state["m"]["w"], None, mesh4)}, axis="dp"),
         "v": ts.collectives.scatter({"w": dist.shard(state["v"]["w"], None, mesh4)}, axis="dp")}
    G = {"w": dist.DTensor(mesh4, (16, 8), np.float32, dist.Layout(((), ())),
                           {r: grads[r]["w"] for r in range(4)})}
    G = ts.collectives.reduce_scatter(G, axis="dp", dim=0)
    assert G["w"].type_str == "f32[16@dp, 8]" and P["w"].type_str == "f32[16@dp, 8]"
    new, S = update(G, S, P)
    assert new["w"].type_str == "f32[16@dp, 8]" and S["m"]["w"].type_str == "f32[16@dp, 8]"
    np.testing.assert_array_equal(dist.gather(ts.collectives.all_gather(new["w"], axis="dp")),
                                  want["w"])


def test_a_sharded_tensor_shows_its_blocks(mesh4):
    """In the notebook a DTensor (and a mesh) displays a table: each device's coordinates and
    the block it holds, pending terms said."""
    from tessera import viz
    mesh = dist.Mesh(axes=["tp", "dp"], devices=range(4))
    X = dist.tensor((8, 6), dist.ShardSpec(("row",), ("tp",)), mesh)
    rows = viz.block_rows(X)
    assert rows[2] == {"rank": 2, "tp": 1, "dp": 0, "block": "[4:8, 0:6]", "shape": "4x6"}
    assert viz.block_rows(mesh)[3] == {"rank": 3, "tp": 1, "dp": 1}
    assert viz.block_rows(X.sum(axis=0))[0]["holds"] == "a term of the sum over tp"
    html = viz.block_html(X)
    assert "f32[8@tp, 6]" in html and "<table" in html and "[4:8, 0:6]" in html
    from tessera.lab.display import formatters
    assert formatters()[dist.DTensor](X)["text/html"] == html


def test_tensor_parallel_attention_moves_nothing_until_its_output(rng):
    """Megatron's attention: q, k, v projections split by columns over tp, the heads taken out
    of the split feature dimension by a reshape (the split moves to the heads), attention per
    head, the heads merged back and the output projection split by rows: a pending sum over tp,
    the only collective. Its bits are the tree of the two halves' products."""
    mesh = dist.Mesh(axes=["dp", "tp"], devices=range(4))
    x = rng.standard_normal((16, 8)).astype(np.float32)
    wq, wk, wv = (rng.standard_normal((8, 32)).astype(np.float32) for _ in range(3))
    wo = rng.standard_normal((32, 8)).astype(np.float32)

    def heads(t):                  # [B*S, H*Dh] -> [B, H, S, Dh]
        return op.permute(op.reshape(t, (2, 8, 4, 8)), 0, 2, 1, 3)

    def att(x, wq, wk, wv, wo):
        o = op.attention(heads(x @ wq), heads(x @ wk), heads(x @ wv), causal=True)
        return op.reshape(op.permute(o, 0, 2, 1, 3), (16, -1)) @ wo
    f = ts.function(att)
    cols, rows = dist.ShardSpec.per_dim(None, "tp"), dist.ShardSpec.per_dim("tp", None)
    args = (dist.shard(x, dist.ShardSpec.per_dim("dp", None), mesh),
            *(dist.shard(w, cols, mesh) for w in (wq, wk, wv)), dist.shard(wo, rows, mesh))
    plan = dist.plan(f, *args)
    assert plan.comm_report().empty, str(plan)      # the pending sum is taken by gather
    Y = f(*args)
    assert Y.type_str == "f32[16@dp, 8] +sum@tp"
    half = ts.function(lambda x, wq, wk, wv, wo: op.reshape(op.permute(op.attention(
        *(op.permute(op.reshape(x @ w, (2, 8, 2, 8)), 0, 2, 1, 3) for w in (wq, wk, wv)),
        causal=True), 0, 2, 1, 3), (16, -1)) @ wo)
    p0, p1 = (half(x, wq[:, s], wk[:, s], wv[:, s], wo[s]) for s in (slice(0, 16), slice(16, 32)))
    np.testing.assert_array_equal(dist.gather(Y), p0 + p1)
    np.testing.assert_allclose(dist.gather(Y), f(x, wq, wk, wv, wo), rtol=1e-4, atol=1e-5)


def test_a_pending_sum_is_taken_before_its_axis_splits_a_result(rng):
    """y = (x @ w1) @ w2 with w1 split by columns and w2 by rows over tp is a pending sum over tp;
    the gradient of mean(y * y) multiplies it by the tp-split activations: the sum must be taken
    first (an axis cannot both split the rows and hold terms of their sum). Found by checking
    the gradient against the single process: it was wrong by the size of its entries."""
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    x = rng.standard_normal((16, 8)).astype(np.float32)
    w1 = (0.3 * rng.standard_normal((8, 32))).astype(np.float32)
    w2 = (0.3 * rng.standard_normal((32, 8))).astype(np.float32)
    g = ts.grad(lambda x, w1, w2: op.mean(((x @ w1) @ w2) * ((x @ w1) @ w2)), argnums=(1, 2))
    W1 = dist.shard(w1, dist.ShardSpec.per_dim(None, "tp"), mesh)
    W2 = dist.shard(w2, dist.ShardSpec.per_dim("tp", None), mesh)
    for got, want in zip(g(x, W1, W2), g(x, w1, w2)):
        assert "+sum@tp" not in got.type_str
        np.testing.assert_allclose(dist.gather(got), want, rtol=1e-5, atol=1e-6)


def test_tensor_parallel_attention_gradients(rng):
    """The gradients of a Megatron attention block's weights (heads split over tp, the batch
    over dp) against the single process's."""
    mesh = dist.Mesh(axes=["dp", "tp"], devices=range(4))
    x = rng.standard_normal((16, 8)).astype(np.float32)
    ws = [(0.3 * rng.standard_normal((8, 32))).astype(np.float32) for _ in range(3)]
    wo = (0.3 * rng.standard_normal((32, 8))).astype(np.float32)

    def heads(t):
        return op.permute(op.reshape(t, (2, 8, 4, 8)), 0, 2, 1, 3)

    def loss(x, wq, wk, wv, wo):
        o = op.attention(heads(x @ wq), heads(x @ wk), heads(x @ wv), causal=True)
        y = op.reshape(op.permute(o, 0, 2, 1, 3), (16, -1)) @ wo
        return op.mean(y * y)
    g = ts.grad(loss, argnums=(1, 2, 3, 4))
    cols, rows = dist.ShardSpec.per_dim(None, "tp"), dist.ShardSpec.per_dim("tp", None)
    got = g(dist.shard(x, dist.ShardSpec.per_dim("dp", None), mesh),
            *(dist.shard(w, cols, mesh) for w in ws), dist.shard(wo, rows, mesh))
    for a, want in zip(got, g(x, *ws, wo)):
        np.testing.assert_allclose(dist.gather(a), want, rtol=1e-4, atol=1e-6)


def test_a_batched_matmul_moves_its_smaller_operand(rng):
    """Experts split over dp, tokens split over dp by group: the tokens go to their experts by
    one all-to-all (the weights are larger); with more tokens than weights the weights are
    gathered instead. Both have the single process's bits (no sum crosses ranks)."""
    mesh = dist.Mesh(axes=["dp"], devices=range(2))
    w = rng.standard_normal((4, 1, 8, 64)).astype(np.float32)
    W = dist.shard(w, dist.ShardSpec.per_dim("dp", None, None, None), mesh)
    for groups, moved in ((2, "all_to_all"), (64, "all_gather")):
        x = rng.standard_normal((4, groups, 3, 8)).astype(np.float32)
        X = dist.shard(x, dist.ShardSpec.per_dim(None, "dp", None, None), mesh)
        p = plan_for(ts.function(lambda a, b: a @ b), X, W)
        kinds = [row["collective"] for row in p.comm_report().to_dict("records")]
        assert kinds == [moved]
        Y = op.matmul(X, W)
        assert Y.type_str == ("f32[4@dp, 2, 3, 64]" if moved == "all_to_all"
                              else f"f32[4, {groups}@dp, 3, 64]")
        np.testing.assert_array_equal(dist.gather(Y), ts.function(lambda a, b: a @ b)(x, w))


def test_routing_operators_keep_a_batch_split(rng, mesh4):
    """topk (argsort, slice, take_along_axis), argmax, expand_dims, squeeze and take along an
    unsplit axis keep the rows' split, moving nothing, with the single process's bits."""
    x = rng.standard_normal((8, 5, 6)).astype(np.float32)
    table = rng.standard_normal((11, 4)).astype(np.float32)
    ids = rng.integers(0, 11, (8, 5))

    def routing(x, table, ids):
        vals, idx = op.topk(x, 2, axis=-1)
        best = op.argmax(x, axis=-1)
        return vals, idx, op.squeeze(op.expand_dims(best, -1), -1), op.take(table, ids, axis=0)
    f = ts.function(routing)
    args = (dist.shard(x, ROW, mesh4), table, dist.shard(ids, ROW, mesh4))
    assert len(plan_for(f, *args).comm_report()) == 0
    for got, want in zip(f(*args), f(x, table, ids)):
        assert "@dp" in got.type_str.split(",")[0]
        np.testing.assert_array_equal(dist.gather(got), want)


def test_a_mixture_of_experts_is_planned_expert_parallel(rng):
    """nn.MixtureOfExperts with its groups and experts split over dp (and, inside each expert,
    the hidden dimension over tp): the plan sends the tokens to their experts and back by two
    all-to-alls and gathers nothing; with experts split over dp alone the output has the
    single process's bits; the gradients agree with the single process's to rounding, the
    experts' own split over dp with no pending sum."""
    mesh = dist.Mesh(axes=["dp", "tp"], devices=range(4))
    moe = nn.MixtureOfExperts(16, 64, 4, top_k=2, capacity_factor=1.0)
    p = moe.init(int(rng.integers(1 << 30)))
    x = rng.standard_normal((4, 12, 16)).astype(np.float32)
    f = ts.function(lambda p, x: moe(p, x))
    X = dist.shard(x, dist.ShardSpec.per_dim("dp", None, None), mesh)
    by_expert = dist.ShardSpec.per_dim("dp", None, None)
    sp = {"router": {"w": p["router"]["w"]}, "w1": dist.shard(p["w1"], by_expert, mesh),
          "w2": dist.shard(p["w2"], by_expert, mesh)}
    report = plan_for(f, sp, X).comm_report()
    assert list(report["collective"]) == ["all_to_all", "all_to_all"]
    assert set(report["axis"]) == {"dp"}
    np.testing.assert_array_equal(dist.gather(f(sp, X)), f(p, x))

    tp = {"router": {"w": p["router"]["w"]},
          "w1": dist.shard(p["w1"], dist.ShardSpec.per_dim("dp", None, "tp"), mesh),
          "w2": dist.shard(p["w2"], dist.ShardSpec.per_dim("dp", "tp", None), mesh)}
    assert "all_gather" not in set(plan_for(f, tp, X).comm_report()["collective"])
    loss = ts.grad(lambda p, x: op.mean(moe(p, x) ** 2))
    got, want = loss(tp, X), loss(p, x)
    assert got["w1"].type_str == "f32[4@dp, 16, 64@tp]"
    for k in ("w1", "w2"):
        np.testing.assert_allclose(dist.gather(got[k]), want[k], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(dist.gather(got["router"]["w"]), want["router"]["w"],
                               rtol=1e-4, atol=1e-7)


def test_a_concat_in_a_sharded_function(rng, mesh4):
    """An operator of a list of operands (concat, and the adjoint of a slice) runs in a planned
    segment as in a single-process one."""
    x = rng.standard_normal((8, 3)).astype(np.float32)
    f = ts.function(lambda x: op.concat([x, op.exp(x)], axis=1))
    np.testing.assert_array_equal(dist.gather(f(dist.shard(x, ROW, mesh4))), f(x))
    g = ts.grad(lambda x: op.sum(op.concat([x, x * x], axis=1)[:, 1:4]))
    np.testing.assert_allclose(dist.gather(g(dist.shard(x, ROW, mesh4))), g(x), rtol=1e-6)


def test_cross_entropy_and_unit_dimensions_keep_a_batch_split(rng, mesh4):
    """logsumexp (cross-entropy's) and var reduce a whole dimension and keep the batch's split;
    a reshape dropping or adding a dimension of size 1 keeps a split next to it."""
    logits = rng.standard_normal((8, 5, 7)).astype(np.float32)
    labels = rng.integers(0, 7, (8, 5))
    w = rng.standard_normal((2, 1, 8, 3)).astype(np.float32)

    def f(z, y, w):
        return (nn.cross_entropy(z, y, reduction="none"), op.var(z, axis=-1),
                op.reshape(w, (2, 8, 3)), op.reshape(op.reshape(w, (2, 8, 3)), (2, 1, 8, 3)))
    f = ts.function(f)
    W = dist.shard(w, dist.ShardSpec.per_dim(None, None, "dp", None), mesh4)
    args = (dist.shard(logits, ROW, mesh4), dist.shard(labels, ROW, mesh4), W)
    assert len(plan_for(f, *args).comm_report()) == 0
    got = f(*args)
    assert [g.type_str for g in got] == ["f32[8@dp, 5]", "f32[8@dp, 5]", "f32[2, 8@dp, 3]",
                                         "f32[2, 1, 8@dp, 3]"]
    for a, b in zip(got, f(logits, labels, w)):
        np.testing.assert_array_equal(dist.gather(a), b)


def test_shard_tree_lays_out_a_pytree(mesh4):
    params = {"attn": [{"w": np.arange(32.0).reshape(4, 8)}], "scale": 2.0,
              "b": np.ones(3, np.float32)}
    by_fn = dist.shard_tree(params, lambda path, shape: COL if path == "attn/0/w" else None,
                            mesh4)
    by_dict = dist.shard_tree(params, {"attn/0/w": COL}, mesh4)
    for t in (by_fn, by_dict):
        assert t["attn"][0]["w"].type_str == "f64[4, 8@dp]" and t["scale"] == 2.0
        assert t["b"].type_str == "f32[3]"
        np.testing.assert_array_equal(dist.gather(t["attn"][0]["w"]), params["attn"][0]["w"])
    with pytest.raises(ts.ShardingError, match="no leaves"):
        dist.shard_tree(params, {"attn/w": COL}, mesh4)


def test_a_0d_value_stays_0d(mesh4, tmp_path):
    """A replicated scalar (an optimizer's step count) keeps its shape through dist.shard and a
    sharded function, so a checkpoint of the state saves."""
    step = dist.shard(np.zeros((), np.int64), None, mesh4)
    x = dist.shard(np.ones((8, 2), np.float32), ROW, mesh4)
    f = ts.function(lambda x, s: (x * 2.0, s + 1))
    y, s = f(x, step)
    assert {b.shape for b in step.blocks.values()} == {b.shape for b in s.blocks.values()} == {()}
    ts.checkpoint.save(tmp_path / "ck", {"x": y}, {"step": s}, step=1)
    _, state, _ = ts.checkpoint.load(tmp_path / "ck", mesh=mesh4)
    assert dist.gather(state["step"]) == 1
