"""sort, argsort, topk, take_along_axis and segment_sum, compiled for the CPU, against NumPy
(stable sorts: equal elements in index order, NaN last ascending and first descending) and
PyTorch's topk where installed."""
import numpy as np
import pytest

import tessera as ts
from tessera import op


def stable_argsort(a, axis, descending=False):
    """NumPy's stable argsort; descending: equal elements still in index order, NaN first."""
    if not descending:
        return np.argsort(a, axis=axis, kind="stable")
    n = a.shape[axis]
    return np.flip(n - 1 - np.argsort(np.flip(a, axis), axis=axis, kind="stable"), axis)


def values(rng, dtype, shape):
    """Fresh values with many ties, a -0.0 beside 0.0, and NaN and infinities in floats."""
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind == "i":
        return rng.integers(-4, 4, shape).astype(dtype)
    a = np.round(rng.standard_normal(shape) * 2) / 2
    flat = a.reshape(-1)
    for k, v in zip(rng.permutation(flat.size)[:4], [np.nan, -0.0, np.inf, -np.inf]):
        flat[k] = v
    return a.astype(dtype)


SHAPES = [((0,), 0), ((1,), 0), ((2,), 0), ((3,), -1), ((7,), 0), ((97,), 0), ((1000,), 0),
          ((4, 33), 1), ((33, 4), 0), ((3, 5, 17), 1), ((2, 3, 1), 2), ((3, 0, 2), 1),
          ((6, 1025), -1)]


@pytest.mark.parametrize("shape,axis", SHAPES)
@pytest.mark.parametrize("descending", [False, True])
def test_argsort_and_sort_are_numpys_stable_sort(shape, axis, descending, rng):
    x = values(rng, np.float32, shape)
    f = ts.function(lambda x: (op.argsort(x, axis=axis, descending=descending),
                               op.sort(x, axis=axis, descending=descending)))
    idx, got = f(x)
    want = stable_argsort(x, axis, descending)
    assert idx.dtype == np.int64 and np.array_equal(idx, want)
    assert got.tobytes() == np.take_along_axis(x, want, axis).tobytes()   # -0.0 and NaN bits


@pytest.mark.parametrize("dtype", [np.float64, np.float16, "bfloat16", np.int32, np.int64,
                                   np.bool_])
def test_every_dtype(dtype, rng):
    if dtype == "bfloat16":
        ml = pytest.importorskip("ml_dtypes", reason="bfloat16 arrays come from ml_dtypes")
        dtype = ml.bfloat16
    x = values(rng, dtype, (5, 40))
    f = ts.function(lambda x: (op.argsort(x, axis=1), op.sort(x, axis=0, descending=True)))
    idx, got = f(x)
    wide = x.astype(np.float64) if x.dtype.kind == "V" or str(x.dtype) == "bfloat16" else x
    assert np.array_equal(idx, stable_argsort(wide, 1))
    assert got.tobytes() == np.take_along_axis(x, stable_argsort(wide, 0, True), 0).tobytes()


def test_eager_calls_use_the_references(rng):
    x = values(rng, np.float64, (4, 9))
    assert np.array_equal(op.argsort(x, axis=0), stable_argsort(x, 0))
    v, i = op.topk(x, 3)
    assert np.array_equal(i, stable_argsort(x, -1, True)[:, :3])


def test_sort_fuses_with_its_neighbours_and_runs_in_parallel(rng):
    x = rng.standard_normal((64, 2048)).astype(np.float32)
    f = ts.function(lambda x: op.sort(x * 2.0, axis=1)[:, ::-1] + 1.0)
    prog = f.lower(x)
    sort = [k for k in prog.schedule_ir.kernels if k.strategy == "sort"]
    assert len(sort) == 1 and sort[0].knobs["parallel"]
    np.testing.assert_array_equal(f(x), np.sort(x * 2.0, axis=1)[:, ::-1] + 1.0)


@pytest.mark.parametrize("n,k", [(1, 1), (8, 2), (64, 8), (97, 0), (97, 97), (1000, 5)])
def test_topk_takes_ties_to_the_lower_index(n, k, rng):
    x = np.round(rng.standard_normal((6, n)) * 2).astype(np.float32)      # many ties
    v, i = ts.function(lambda x: op.topk(x, k))(x)
    want = stable_argsort(x, -1, True)[:, :k]
    assert np.array_equal(i, want) and v.tobytes() == np.take_along_axis(x, want, -1).tobytes()
    vs, is_ = ts.function(lambda x: op.topk(x, k, axis=1, largest=False))(x)
    assert np.array_equal(is_, stable_argsort(x, 1)[:, :k])


def test_topk_values_are_pytorchs(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is the peer topk is checked against")
    x = np.round(rng.standard_normal((6, 50)) * 2).astype(np.float32)
    v, _ = ts.function(lambda x: op.topk(x, 7))(x)
    tv, _ = torch.topk(torch.from_numpy(x), 7, dim=-1)
    np.testing.assert_array_equal(v, tv.numpy())         # (PyTorch leaves ties' order open)


def test_topk_routing_picks_the_experts_a_reference_picks(rng):
    """Mixture-of-experts routing: the top-2 experts per token and their softmax weights."""
    logits = rng.standard_normal((128, 8)).astype(np.float32)

    @ts.function
    def route(logits):
        w, e = op.topk(op.softmax(logits, axis=-1), 2)
        return w / op.sum(w, axis=-1, keepdim=True), e

    w, e = route(logits)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = stable_argsort(p, -1, True)[:, :2]
    assert np.array_equal(e, want)
    top = np.take_along_axis(p, want, -1)
    np.testing.assert_allclose(w, top / top.sum(-1, keepdims=True), rtol=1e-6)


def test_bad_arguments_are_named():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ts.ArgumentError, match="k=5"):
        op.topk(x, 5)
    with pytest.raises(ts.ShapeError, match="rank-0"):
        ts.function(lambda x: op.sort(x))(np.float32(1))
    with pytest.raises(ts.ShapeError, match="axis"):
        op.argsort(x, axis=2)


def test_results_do_not_depend_on_the_thread_count(rng, monkeypatch):
    x = np.round(rng.standard_normal((300, 257)) * 3).astype(np.float32)
    runs = []
    for threads in ("1", "2"):
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        runs.append(ts.function(lambda x: op.argsort(x, axis=0))(x).tobytes())
    assert runs[0] == runs[1] == stable_argsort(x, 0).tobytes()


# ---- take_along_axis ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape,ishape,axis", [((3, 5), (3, 4), 1), ((6, 2, 3), (9, 2, 3), 0),
                                               ((2, 7, 3), (2, 1, 3), 1), ((4,), (0,), 0)])
def test_take_along_axis_is_numpys(shape, ishape, axis, rng):
    x = rng.standard_normal(shape)
    n = shape[axis]
    idx = rng.integers(-n, n, ishape)
    f = ts.function(lambda x, i: op.take_along_axis(x, i, axis=axis))
    want = np.take_along_axis(x, np.where(idx < 0, idx + n, idx), axis)
    np.testing.assert_array_equal(f(x, idx), want)
    np.testing.assert_array_equal(op.take_along_axis(x, idx, axis=axis), want)   # eager


def test_take_along_axis_reports_an_index_out_of_its_axis(rng):
    """An index past the axis that would still land inside the tensor is a fault, not a read
    of the next line."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    f = ts.function(lambda x, i: op.take_along_axis(x, i, axis=1))
    with pytest.raises(ts.RuntimeFault, match="out of range"):
        f(x, np.array([[0], [4], [1]]))
    with pytest.raises(ts.ShapeError, match="off the axis"):
        op.take_along_axis(x, np.zeros((2, 4), np.int64), axis=1)


def test_sort_gradient_goes_back_to_each_elements_place(rng):
    x = rng.standard_normal((4, 6))
    g = rng.standard_normal((4, 6))
    dx = ts.grad(lambda x: op.sum(op.sort(x, axis=1, descending=True) * g))(x)
    want = np.zeros_like(x)
    np.put_along_axis(want, stable_argsort(x, 1, True), g, 1)
    np.testing.assert_array_equal(dx, want)


def test_takes_gradient_is_a_scatter_add_not_a_one_hot_matmul(rng):
    x = rng.standard_normal((50, 3)).astype(np.float32)
    ids = np.array([4, 4, 7, -1, 4])
    g = ts.function(ts.grad(lambda x: op.sum(op.take(x, ids, axis=0) ** 2)))
    ops_used = {n.op for n in g.lower(x).primitive_ir.nodes}
    assert "scatter_add" in ops_used and "matmul" not in ops_used
    want = np.zeros_like(x)
    np.add.at(want, ids, 2 * x[ids])
    np.testing.assert_array_equal(g(x), want)


# ---- segment_sum -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_segment_sum_is_add_at_in_row_order(dtype, rng):
    data = (rng.standard_normal((40, 3)) * 10).astype(dtype)
    ids = rng.integers(0, 6, 40)
    got = ts.function(lambda d, i: op.segment_sum(d, i, num_segments=7))(data, ids)
    want = np.zeros((7, 3), dtype)
    np.add.at(want, ids, data)
    assert got.tobytes() == want.tobytes()
    assert op.segment_sum(data, ids, 7).tobytes() == want.tobytes()


def test_segment_sum_into_a_large_zero_target(rng):
    """Big enough for its zero target to be a parallel kernel of its own: a broadcast of an
    inlined 0-d constant, whose literal the kernel writes (it once loaded from a buffer that no
    kernel has: an IRVerificationError)."""
    data = rng.standard_normal((8192, 16)).astype(np.float32)
    ids = rng.integers(0, 9000, 8192)
    got = ts.function(lambda d, i: op.segment_sum(d, i, num_segments=9000))(data, ids)
    want = np.zeros((9000, 16), np.float32)
    np.add.at(want, ids, data)
    assert got.tobytes() == want.tobytes()
    full = ts.function(lambda x: op.broadcast_to(np.float32(1.5), [600, 300]) + x[0, 0])(data)
    np.testing.assert_array_equal(full, np.full((600, 300), 1.5, np.float32) + data[0, 0])


def test_segment_sum_reports_a_bad_id(rng):
    f = ts.function(lambda d, i: op.segment_sum(d, i, num_segments=3))
    with pytest.raises(ts.RuntimeFault, match="out of range"):
        f(np.ones((4,), np.float32), np.array([0, 1, 3, 2]))
    with pytest.raises(ts.ArgumentError, match="num_segments"):
        op.segment_sum(np.ones(3), np.zeros(3, np.int64), -1)
