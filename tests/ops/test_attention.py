"""Attention: op.attention and the recognised hand-written pattern, one flash-attention kernel."""
import numpy as np
import pytest

import tessera as ts
from tessera import op

from conftest import assert_close
from conftest import attention_reference as np_attention


def qkv(rng, b, sq, sk, d, dv, dtype=np.float32):
    return (rng.standard_normal((*b, sq, d)).astype(dtype),
            rng.standard_normal((*b, sk, d)).astype(dtype),
            rng.standard_normal((*b, sk, dv)).astype(dtype))


def strategies(fn, *args):
    return [k.strategy for k in ts.function(fn).lower(*args).schedule_ir.kernels]


@pytest.mark.parametrize("b,sq,sk,d,dv", [((), 1, 1, 1, 1), ((2,), 5, 7, 8, 3),
                                          ((2, 3), 67, 67, 64, 64), ((1, 2), 130, 61, 80, 17)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_op_matches_numpy(rng, b, sq, sk, d, dv, causal):
    q, k, v = qkv(rng, b, sq, sk, d, dv)
    fn = lambda q, k, v: op.attention(q, k, v, causal=causal)     # noqa: E731
    assert strategies(fn, q, k, v) == ["attention"]
    assert_close(ts.function(fn)(q, k, v), np_attention(q, k, v, causal=causal).astype(np.float32),
                 scale=20)
    assert_close(ts.interpret(fn, q, k, v),
                 np_attention(q, k, v, causal=causal).astype(np.float32), scale=20)


def test_hand_written_attention_is_recognised(rng):
    q, k, v = qkv(rng, (2, 4), 33, 45, 16, 16)
    mask = np.where(rng.random((33, 45)) < 0.2, -np.inf, 0).astype(np.float32)

    def hand(q, k, v, mask):
        s = q @ op.transpose(k, (0, 1, 3, 2)) * 0.25 + mask
        e = op.exp(s - op.max(s, axis=-1, keepdim=True))
        return e / op.sum(e, axis=-1, keepdim=True) @ v

    def named(q, k, v, mask):
        return op.softmax(q @ op.transpose(k, (0, 1, 3, 2)) / 4.0 + mask) @ v
    want = np_attention(q, k, v, mask=mask, scale=0.25).astype(np.float32)
    for fn in (hand, named):
        # (beside it, the mask's row maximum and the NaN of rows it drops throughout: below)
        assert strategies(fn, q, k, v, mask) == ["attention", "row", "pointwise"]
        assert_close(ts.function(fn)(q, k, v, mask), want, scale=20)
    assert strategies(lambda q, k, v: op.softmax(q @ op.transpose(k, (0, 1, 3, 2))) @ v,
                      q, k, v) == ["attention"]


@pytest.mark.parametrize("mask_shape", [(33, 45), (45,), (2, 1, 1, 45), (2, 4, 33, 1), ()])
def test_hand_written_attention_keeps_the_programs_values_where_the_mask_drops_a_row(
        mask_shape, rng):
    """softmax(scores + mask) of a row the mask drops throughout is NaN (-inf - -inf), in NumPy
    and the interpreter; recognised as op.attention (whose such rows are 0) it must stay NaN,
    and every other row keeps its value (+inf and NaN in the mask give NaN rows, as written)."""
    q, k, v = qkv(rng, (2, 4), 33, 45, 16, 16)
    mask = np.where(rng.random(mask_shape) < 0.3, -np.inf, 0).astype(np.float32)
    if mask.ndim:
        flat = mask.reshape(-1, mask.shape[-1])
        flat[0] = -np.inf
        flat[-1, 0] = np.inf if len(flat) > 2 else flat[-1, 0]
        flat[len(flat) // 2, -1] = np.nan if len(flat) > 2 else flat[len(flat) // 2, -1]

    def hand(q, k, v, mask):
        return op.softmax(q @ op.transpose(k, (0, 1, 3, 2)) * 0.25 + mask) @ v
    f = ts.function(hand)
    got, interp = f(q, k, v, mask), ts.interpret(f, q, k, v, mask)
    with np.errstate(invalid="ignore"):
        s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * 0.25 + mask
        e = np.exp(s - s.max(-1, keepdims=True))
        want = (e / e.sum(-1, keepdims=True)) @ v
    assert "attention" in strategies(hand, q, k, v, mask)
    for out in (got, interp):
        np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
        assert_close(np.nan_to_num(out), np.nan_to_num(want).astype(np.float32), scale=20)


def test_heads_split_from_a_sequence_layout_are_read_in_place(rng):
    B, S, H, D = 2, 40, 3, 8
    x = rng.standard_normal((B, S, 3 * H * D)).astype(np.float32)

    def mha(x):
        q, k, v = (x[:, :, i * H * D:(i + 1) * H * D].reshape(B, S, H, D).transpose(0, 2, 1, 3)
                   for i in range(3))
        return op.attention(q, k, v, causal=True)
    ks = ts.function(mha).lower(x).schedule_ir.kernels
    assert [k.strategy for k in ks][-1] == "attention"
    ref = ts.interpret(mha, x)
    assert_close(ts.function(mha)(x), ref, scale=20)


def test_scores_that_are_needed_elsewhere_are_not_fused_away(rng):
    q, k, v = qkv(rng, (2,), 9, 11, 4, 4)

    def fn(q, k, v):
        p = op.softmax(q @ op.transpose(k, (0, 2, 1)))
        return p @ v, p
    assert "attention" not in strategies(fn, q, k, v)


def test_long_sequences_never_hold_the_scores(rng):
    S, D = 4096, 64
    q, k, v = qkv(rng, (1,), S, S, D, D)
    prog = ts.function(lambda q, k, v: op.softmax(q @ op.transpose(k, (0, 2, 1)) * 0.125) @ v) \
        .lower(q, k, v)
    biggest = max(b.nbytes for b in prog.schedule_ir.buffers if b.role != "inline")
    assert biggest < S * S                 # no S x S buffer anywhere (f32 would be 4*S*S bytes)
    got = prog(q[:, :], k, v)
    rows = rng.choice(S, 5, replace=False)
    want = np_attention(q[:, rows], k, v, scale=0.125)
    assert_close(got[:, rows], want.astype(np.float32), scale=50)


def test_attention_rows_do_not_depend_on_the_batch_or_the_block(rng):
    q, k, v = qkv(rng, (3,), 100, 77, 32, 32)
    f = ts.function(lambda q, k, v: op.attention(q, k, v, causal=True))
    full = f(q, k, v)
    assert full[1:2].tobytes() == f(q[1:2], k[1:2], v[1:2]).tobytes()
    small = f.with_schedule(ts.Schedule(block=(16, 16)))(q, k, v)
    assert small.tobytes() == full.tobytes()


def test_fully_masked_rows_give_zero_and_bad_shapes_are_errors(rng):
    q, k, v = qkv(rng, (), 4, 6, 8, 8)
    mask = np.zeros((4, 6), np.float32)
    mask[2] = -np.inf
    out = ts.function(lambda q, k, v, m: op.attention(q, k, v, mask=m))(q, k, v, mask)
    assert np.all(out[2] == 0) and np.all(np.isfinite(out))
    with pytest.raises(ts.ShapeError, match="feature size"):
        ts.function(lambda q, k, v: op.attention(q, k[:, :4], v))(q, k, v)
    with pytest.raises(ts.ShapeError, match="number of keys"):
        ts.function(lambda q, k, v: op.attention(q, k, v[:5]))(q, k, v)
    with pytest.raises(ts.ArgumentError, match="every key would be masked"):
        ts.function(lambda q, k, v: op.attention(q, k, v, mask=-np.inf))(q, k, v)
    with pytest.raises(ts.DTypeError, match="additive"):
        ts.function(lambda q, k, v: op.attention(q, k, v, mask=q[:, :1] > 0))(q, k, v)
