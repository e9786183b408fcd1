"""matmul and data movement, compiled, against NumPy."""
import numpy as np
import pytest

import tessera as ts
from tessera import op

from conftest import assert_close, assert_within_dot_bound

MATMUL = [((1, 1), (1, 1)), ((3, 5), (5, 7)), ((13, 1), (1, 17)), ((31, 37), (37, 1)),
          ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 3)), ((3, 4), (4,)),
          ((5,), (5,)), ((1, 3, 2, 4), (5, 1, 4, 6)), ((7, 1, 2, 3), (3, 2))]


@pytest.mark.parametrize("sa,sb", MATMUL)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_matmul(sa, sb, dtype, rng):
    if np.dtype(dtype).kind == "i":
        a, b = (rng.integers(-5, 6, size=s).astype(dtype) for s in (sa, sb))
    else:
        a, b = (rng.standard_normal(s).astype(dtype) for s in (sa, sb))
    f = ts.function(lambda a, b: a @ b)
    assert_within_dot_bound(f(a, b), a, b)


def test_matmul_larger_parallel(rng):
    a = rng.standard_normal((97, 129)).astype(np.float32)
    b = rng.standard_normal((129, 211)).astype(np.float32)
    f = ts.function(lambda a, b: op.matmul(a, b))
    assert f.lower(a, b).schedule_ir.kernels[0].knobs["parallel"]
    assert_within_dot_bound(f(a, b), a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_few_rows_have_the_bits_of_the_same_rows_in_a_large_product(dtype, rng):
    """Up to eight rows against B with contiguous rows stream B unpacked (decoding's
    matrix-vector products); 32 rows go through the packed micro-kernel. Every element is
    the same fma chain either way: K with a tail past four, N with a tail past a vector, A
    read through a transpose."""
    k, n = 203, 77
    a = rng.standard_normal((32, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    f = ts.function(lambda a, b: a @ b)
    whole = f(a, b)
    assert_within_dot_bound(whole, a, b)
    for m in (1, 2, 3, 4, 5, 8):
        np.testing.assert_array_equal(f(a[:m], b), whole[:m])
        at = np.ascontiguousarray(a[:m].T)
        np.testing.assert_array_equal(ts.function(lambda t, b: op.transpose(t) @ b)(at, b),
                                      whole[:m])


# Both operands views of one array: the second's view is composed with the first's (a slice
# under a transpose), not read from the array's start (issue 39: wrong values, and a SIGSEGV
# when a broadcast's transpose walked past the end of its one row).
VIEW_PAIRS = {
    "m[1:] @ m[1:].T": lambda m: m[1:] @ m[1:].T,
    "m[::-1].T @ m[::-1]": lambda m: m[::-1].T @ m[::-1],
    "m[::2].T @ m[::2]": lambda m: m[::2].T @ m[::2],
    "m[1:, ::-1] @ m[1:, ::-1].T + 1": lambda m: m[1:, ::-1] @ m[1:, ::-1].T + 1,
    "m[2:7] @ reshape(m[2:7])": lambda m: m[2:7] @ op.reshape(m[2:7], (m.shape[1], 5)),
    "batched views": lambda m: (lambda t: t[:, ::-1] @ op.transpose(t[:, ::-1], (0, 2, 1)))(
        op.reshape(m[:8], (2, 4, m.shape[1]))),
}


@pytest.mark.parametrize("name", sorted(VIEW_PAIRS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_matmul_of_two_views_of_one_array(name, dtype, rng):
    m = (rng.integers(-5, 6, (9, 5)) if dtype is np.int64 else rng.standard_normal((9, 5)))
    m = m.astype(dtype)
    f = VIEW_PAIRS[name]
    got = ts.function(f)(m)
    want = ts.interpret(f, m)
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype is np.float32 else 1e-12)
    if "reshape" not in name:       # (NumPy has no op.reshape/op.transpose to call)
        np.testing.assert_allclose(got, f(m), rtol=1e-5 if dtype is np.float32 else 1e-12)


def test_matmul_of_a_broadcast_and_its_transpose(rng):
    """b @ b.T of a row broadcast to a square: every element is the row's squared norm (it read
    past the row and crashed the interpreter)."""
    x = rng.standard_normal((1, 257)).astype(np.float32)
    got = ts.function(lambda x: (lambda b: b @ op.transpose(b))(op.broadcast_to(x, (257, 257))))(x)
    want = np.broadcast_to(x, (257, 257)) @ np.broadcast_to(x, (257, 257)).T
    assert_within_dot_bound(got, np.broadcast_to(x, (257, 257)),
                            np.broadcast_to(x, (257, 257)).T)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_attention_from_the_seeds(rng):
    @ts.graph.module("attention")
    def attention(Q, K, V):
        S = op.matmul(Q, K.T)
        A = op.softmax(S)
        return op.matmul(A, V)

    q, k, v = (rng.standard_normal((2, 16, 8)).astype(np.float32) for _ in range(3))
    s = q @ k.transpose(0, 2, 1)
    e = np.exp(s - s.max(-1, keepdims=True))
    assert_close(attention(q, k, v), (e / e.sum(-1, keepdims=True)) @ v, scale=10)
    assert attention.name == "attention"


def test_transpose_permute_T(rng):
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    f = ts.function(lambda x: (x.T, op.transpose(x, [2, 0, 1]), op.permute(x, 1, 2, 0),
                               x.transpose(0, 2, 1)))
    outs = f(x)
    wants = [x.swapaxes(-1, -2), x.transpose(2, 0, 1), x.transpose(1, 2, 0), x.transpose(0, 2, 1)]
    for got, want in zip(outs, wants):
        assert_close(got, want)


TRANSPOSED = [((1024, 1000), [1, 0], slice(None)), ((3, 147, 130), [0, 2, 1], slice(None)),
              ((2, 70, 9, 33), [0, 3, 2, 1], slice(None)), ((40, 300), [1, 0], slice(1, -2)),
              ((20, 64, 64), [2, 1, 0], slice(None, None, -1))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,perm,rows", TRANSPOSED)
def test_a_transposition_copy_is_numpys_in_the_transpose_routine(shape, perm, rows, dtype, rng):
    """A copy whose output is contiguous along an axis the input strides over (and the input
    along another) calls the transposition routine (its 8x8 or 4x4 squares, their blocks'
    edges, views: a slice, a flip): NumPy's transpose, element for element, NaN included."""
    x = rng.standard_normal(shape).astype(dtype)
    x.flat[::7] = np.nan
    f = ts.function(lambda x: op.transpose(x[rows], perm=perm))
    prog = f.lower(x)
    assert {k.strategy for k in prog.schedule_ir.kernels} == {"copy"}
    assert f"ts_transpose_{'f32' if dtype == np.float32 else 'f64'}(" in prog.target_code
    assert f(x).tobytes() == np.ascontiguousarray(np.transpose(x[rows], perm)).tobytes()


def test_reshape_expand_squeeze_broadcast(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    f = ts.function(lambda x: (x.reshape(3, -1), x.reshape(2, 2, 6), op.expand_dims(x, 1),
                               op.squeeze(op.expand_dims(x, 0)), op.broadcast_to(x[:, :1], (4, 5)),
                               op.broadcast_to(x, (3, 4, 6))))
    outs = f(x)
    wants = [x.reshape(3, -1), x.reshape(2, 2, 6), x[:, None], x,
             np.broadcast_to(x[:, :1], (4, 5)), np.broadcast_to(x, (3, 4, 6))]
    for got, want in zip(outs, wants):
        assert_close(got, np.array(want))


@pytest.mark.parametrize("key", [
    (slice(1, 3),), (slice(None, None, 2), 1), (Ellipsis, slice(None, None, -1)),
    (None, slice(2, None), slice(None, -1)), (-1,), (slice(-3, None), None, 0),
    (1, 2), (slice(5, 1, -2), slice(None, None, 3))])
def test_slicing(key, rng):
    x = rng.standard_normal((7, 5)).astype(np.float32)
    f = ts.function(lambda x: x[key])
    assert_close(f(x), np.array(x[key]))


def test_every_slice_of_a_short_axis_is_pythons(rng):
    """Every start, stop and step in [-7, 7] (and None) on an axis of 5, eagerly and compiled
    (a sample): a negative step starting before the beginning is empty, as in Python (it read
    as "from the last element": x[-10::-1] gave the whole axis reversed)."""
    x = np.arange(5.0)
    bounds = [None] + list(range(-7, 8))
    keys = [slice(a, b, c) for a in bounds for b in bounds for c in [None, -3, -2, -1, 1, 2, 3]]
    for key in keys:
        np.testing.assert_array_equal(op.slice(x, [key.start], [key.stop], [key.step]), x[key],
                                      err_msg=str(key))
    for i in rng.choice(len(keys), 24, replace=False):
        key = keys[i]
        got = ts.function(lambda x: x[key])(x)
        np.testing.assert_array_equal(got, x[key], err_msg=str(key))
    m = rng.standard_normal((4, 6))
    f = ts.function(lambda m: (m[-10::-1, -7:-2:-1], m[::-1, -9::-2]))
    for got, want in zip(f(m), (m[-10::-1, -7:-2:-1], m[::-1, -9::-2])):
        np.testing.assert_array_equal(got, want)


def test_repeat_interleave_is_numpys_repeat_with_its_gradient(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    for axis in (0, 1, -1):
        f = ts.function(lambda x: op.repeat_interleave(x, 3, axis))
        np.testing.assert_array_equal(f(x), np.repeat(x, 3, axis=axis))
    g = rng.standard_normal((2, 6, 4))
    dx = ts.grad(lambda x, g: op.sum(op.repeat_interleave(x, 2, axis=1) * g))(
        x.astype(np.float64), g)
    np.testing.assert_allclose(dx, g.reshape(2, 3, 2, 4).sum(axis=2), rtol=1e-12)
    with pytest.raises(ts.ArgumentError, match="repeats must be an int"):
        op.repeat_interleave(x, 0, axis=1)


def test_flat_index_reports_a_coordinate_past_its_own_axis(rng):
    """A coordinate outside its axis must not land in a neighbouring row of the flat axis."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    f = ts.function(lambda x, i, j: op.take(op.reshape(x, [12]), op.flat_index([i, j], [3, 4]),
                                            axis=0))
    i, j = rng.integers(-3, 3, 5), rng.integers(-4, 4, 5)
    np.testing.assert_array_equal(f(x, i, j), x[i, j])
    for bad_i, bad_j in ((0, 4), (0, -5), (3, 0), (-4, 0)):   # each would alias a valid row
        with pytest.raises(ts.RuntimeFault, match="out of range"):
            f(x, np.array([0, bad_i]), np.array([1, bad_j]))
    with pytest.raises(ts.ArgumentError, match=r"outside \[-3, 3\)"):
        op.flat_index([np.array([3])], [3])


def test_concat_split(rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((2, 5)).astype(np.float64)
    c = rng.standard_normal((2, 1)).astype(np.float32)
    f = ts.function(lambda a, b, c: op.concat([a, b, c], axis=1))
    assert_close(f(a, b, c), np.concatenate([a, b, c], axis=1))
    g = ts.function(lambda a: op.concat([a, a * 2], axis=0))
    assert_close(g(a), np.concatenate([a, a * 2], axis=0))
    x = rng.standard_normal((4, 9)).astype(np.float32)
    s = ts.function(lambda x: op.split(x, 3, axis=1))
    for got, want in zip(s(x), np.split(x, 3, axis=1)):
        assert_close(got, np.array(want))
    s2 = ts.function(lambda x: op.split(x, [1, 3], axis=0))
    for got, want in zip(s2(x), np.split(x, [1, 3], axis=0)):
        assert_close(got, np.array(want))


def test_take_and_embedding(rng):
    table = rng.standard_normal((11, 6)).astype(np.float32)
    ids = rng.integers(-11, 11, size=(3, 4)).astype(np.int64)
    f = ts.function(lambda t, i: op.embedding(t, i))
    assert_close(f(table, ids), np.take(table, ids, axis=0))
    g = ts.function(lambda t, i: op.take(t, i, axis=1))
    ids32 = rng.integers(0, 6, size=(5,)).astype(np.int32)
    assert_close(g(table, ids32), np.take(table, ids32, axis=1))
    h = ts.function(lambda t, i: t[i] * 2)
    assert_close(h(table, ids32), table[ids32] * 2)


def test_pipeline_from_the_seeds(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    f = ts.function(lambda x: op.pipeline([op.matmul(x, x.T), op.relu, op.layernorm]))
    y = np.maximum(x @ x.T, 0)
    want = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5)
    assert_close(f(x), want, scale=20)
    assert_close(op.pipeline([x, op.relu, op.exp]), np.exp(np.maximum(x, 0)))


def test_eager_ops_match_numpy(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 2)).astype(np.float32)
    assert_close(op.matmul(a, b), a @ b, scale=5)
    assert_close(op.sum(a, axis=0), a.sum(0))
    assert_close(op.softmax(a), np.exp(a) / np.exp(a).sum(-1, keepdims=True), scale=5)
    assert_close(op.concat([a, a], axis=0), np.concatenate([a, a]))
    assert_close(op.reshape(a, [-1]), a.ravel())


def test_interpret_agrees_with_compiled(rng):
    @ts.function
    def f(x: ts.Tensor["N", "D"], w: ts.Tensor["D", "H"]) -> ts.Tensor["N", "H"]:
        return op.gelu(op.layernorm(x) @ w)

    x = rng.standard_normal((5, 12)).astype(np.float32)
    w = rng.standard_normal((12, 7)).astype(np.float32)
    assert_close(f(x, w), ts.interpret(f, x, w), scale=10)


# ---- scatter_add -------------------------------------------------------------------------------
def _add_at(target, idx, src, axis):
    """NumPy's unbuffered add, in index order (repeated indices add up)."""
    out = target.copy()
    n = target.shape[axis]
    flat = idx.reshape(-1)
    rows = src.reshape(target.shape[:axis] + (flat.size,) + target.shape[axis + 1:])
    np.add.at(np.moveaxis(out, axis, 0), np.where(flat < 0, flat + n, flat),
              np.moveaxis(rows, axis, 0))
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("tshape,ishape,axis", [((6, 3), (9,), 0), ((2, 5, 3), (4, 2), 1),
                                                ((4, 7), (11,), 1), ((5,), (), 0),
                                                ((300, 64), (2000,), 0)])
def test_scatter_add_is_numpys_add_at_bit_for_bit(dtype, tshape, ishape, axis, rng):
    n = tshape[axis]
    idx = rng.integers(-n, n, size=ishape)                  # repeats and negative indices
    sshape = tshape[:axis] + ishape + tshape[axis + 1:]
    if np.dtype(dtype).kind == "f":
        t, s = (rng.standard_normal(sh).astype(dtype) for sh in (tshape, sshape))
    else:
        t, s = (rng.integers(-50, 50, size=sh).astype(dtype) for sh in (tshape, sshape))
    f = ts.function(lambda t, i, s: op.scatter_add(t, i, s, axis=axis))
    want = _add_at(t, idx, s, axis)
    assert f(t, idx, s).tobytes() == want.tobytes()
    assert op.scatter_add(t, idx, s, axis=axis).tobytes() == want.tobytes()     # eager


def test_scatter_add_into_a_computed_target_and_as_takes_transpose(rng):
    t, s = rng.standard_normal((5, 4)), rng.standard_normal((3, 4))
    idx = np.array([4, 0, 4])
    f = ts.function(lambda t, s: op.scatter_add(op.exp(t) * 0.0, idx, s * 2.0) + 1.0)
    np.testing.assert_array_equal(f(t, s), _add_at(np.zeros((5, 4)), idx, s * 2.0, 0) + 1.0)
    # <take(x), g> = <x, scatter_add(0, idx, g)>: the adjoint pair, exactly (small integers)
    x, g = rng.integers(-5, 5, (5, 4)).astype(np.float64), rng.integers(-5, 5, (3, 4)) * 1.0
    lhs = (op.take(x, idx, axis=0) * g).sum()
    rhs = (x * op.scatter_add(np.zeros_like(x), idx, g)).sum()
    assert lhs == rhs


def test_scatter_add_reports_a_bad_index_and_refuses_bad_operands(rng):
    f = ts.function(lambda t, i, s: op.scatter_add(t, i, s))
    t, s = np.zeros((3, 2), np.float32), np.ones((2, 2), np.float32)
    with pytest.raises(ts.RuntimeFault, match="out of range"):
        f(t, np.array([0, 3]), s)
    with pytest.raises(ts.ShapeError, match="shape take"):
        op.scatter_add(t, np.array([0, 1, 2]), s)
    with pytest.raises(ts.DTypeError, match="same dtype"):
        op.scatter_add(t, np.array([0, 1]), s.astype(np.float64))
    with pytest.raises(ts.DTypeError, match="int32 or int64"):
        op.scatter_add(t, np.array([0.0, 1.0]), s)
