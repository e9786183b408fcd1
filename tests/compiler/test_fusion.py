"""Fusion: which kernels the Schedule IR makes, and that fused kernels compute what NumPy does."""
import numpy as np
import pytest

import tessera as ts
from tessera import op

from conftest import assert_close, assert_within_dot_bound


def kernels(fn, *args):
    return ts.function(fn).lower(*args).schedule_ir.kernels


def strategies(fn, *args):
    return [k.strategy for k in kernels(fn, *args)]


def np_softmax(x, axis=-1):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_layernorm(x, w, b, eps=1e-5):
    x = x.astype(np.float64)
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


def hand_softmax(x):
    e = op.exp(x - op.max(x, axis=-1, keepdim=True))
    return e / op.sum(e, axis=-1, keepdim=True)


@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (1, 17), (5, 37), (7, 3, 64), (2, 256)])
def test_softmax_is_one_row_kernel_written_either_way(rng, shape):
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    for fn in (lambda x: op.softmax(x), hand_softmax):
        assert strategies(fn, x) == ["row"]
        assert_close(ts.function(fn)(x), np_softmax(x).astype(np.float32))


@pytest.mark.parametrize("shape", [(4, 1), (6, 33), (2, 3, 130)])
def test_normalisations_are_one_row_kernel(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32)
    x64 = x.astype(np.float64)
    cases = [
        (lambda x, w, b: op.layernorm(x, w, b), np_layernorm(x, w, b)),
        (lambda x, w, b: op.rmsnorm(x) * w,
         x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w),
        (lambda x, w, b: op.logsumexp(x, axis=-1),
         np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1)) + x64.max(-1)),
        (lambda x, w, b: op.log_softmax(x), np.log(np_softmax(x))),
        (lambda x, w, b: x.var(axis=-1), x64.var(-1)),
        (lambda x, w, b: x - x.mean(axis=-1, keepdim=True), x64 - x64.mean(-1, keepdims=True)),
    ]
    for fn, want in cases:
        assert strategies(fn, x, w, b) == ["row"], fn
        assert_close(ts.function(fn)(x, w, b), want.astype(np.float32), scale=20)


def test_elementwise_chain_with_broadcasting_is_one_kernel(rng):
    x = rng.standard_normal((33, 65)).astype(np.float32)
    w = rng.standard_normal(65).astype(np.float32)
    b = rng.standard_normal((33, 1)).astype(np.float32)
    fn = lambda x, w, b: op.gelu(x * w + b) - op.tanh(b) * 2      # noqa: E731
    ks = kernels(fn, x, w, b)
    assert [k.strategy for k in ks] == ["pointwise"]
    assert len(ks[0].fuses) >= 5 and ks[0].bytes == 4 * (x.size * 2 + w.size + b.size)
    assert_close(ts.function(fn)(x, w, b), ts.interpret(fn, x, w, b), scale=5)


def test_views_are_read_in_place(rng):
    x = rng.standard_normal((17, 9)).astype(np.float32)
    y = rng.standard_normal((9, 17)).astype(np.float32)
    for fn in (lambda x, y: x.T * y + 1, lambda x, y: op.broadcast_to(x, (3, 17, 9)) * 2, lambda x, y: x[::2, 1:4] + 1,
               lambda x, y: x.reshape(9, 17) - y):
        assert strategies(fn, x, y) == ["pointwise"]
        np.testing.assert_array_equal(ts.function(fn)(x, y), ts.interpret(fn, x, y))


def test_a_view_of_a_view_is_read_through_both(rng):
    """A flip under a transpose (a stride-1 data gradient's weights), a slice under a
    transpose under a slice: one kernel reading the source through the composed views, not a
    copy per view; and a reduction of such a view (a row kernel)."""
    x = rng.standard_normal((6, 5, 3, 3)).astype(np.float32)
    for fn in (lambda x: op.transpose(x[:, :, ::-1, ::-1], (1, 0, 2, 3)) * 1,
               lambda x: op.transpose(x[1:, ::2], (2, 0, 3, 1))[::-1] + 1,
               lambda x: op.exp(op.transpose(x[:, :3], (1, 0, 2, 3))).sum() + x):
        assert strategies(fn, x) in (["pointwise"], ["row", "pointwise"]), fn
        got, want = ts.function(fn)(x), ts.interpret(fn, x)
        assert_close(got, want, scale=4)
    stride_1 = lambda g, w: op.conv_transpose(g, w, padding=1)       # noqa: E731
    g = rng.standard_normal((2, 6, 7, 7)).astype(np.float32)
    assert [k.strategy for k in kernels(stride_1, g, x)] == ["pointwise", "conv"]


def test_a_value_used_by_two_kernels_is_written_once(rng):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    fn = lambda x: (op.exp(x) + 1, op.sum(op.exp(x) + 1, axis=0))     # noqa: E731
    # exp(x)+1 is an output: it is materialised and the column sum reads it
    assert strategies(fn, x) == ["pointwise", "reduce"]
    got = ts.function(fn)(x)
    want = ts.interpret(fn, x)
    for g, w in zip(got, want):
        assert_close(g, w, scale=10)


def test_a_reshape_two_kernels_read_is_no_kernel(rng):
    """A layer's input x.reshape(-1, D), which two products read (forward and the weight
    gradient), is an alias of the value it reshapes, read where it lies; the value's memory
    stays its own until the alias's last reader (later temporaries would take a freed slot)."""
    x = rng.standard_normal((4, 8, 16)).astype(np.float32)
    w1 = rng.standard_normal((16, 16)).astype(np.float32)
    w2 = rng.standard_normal((16, 16)).astype(np.float32)

    def fn(x, w1, w2):
        r = op.tanh(x).reshape(32, 16)          # a temporary, reshaped; read by two products
        a = op.exp(r @ w1)                      # its own temporaries after the tanh's
        b = op.sin(a * 0.5) @ w2
        return op.sum(r @ w2 + b, axis=0)
    ks = kernels(fn, x, w1, w2)
    assert not any(k.op == "reshape" for k in ks)
    prog = ts.function(fn).lower(x, w1, w2)
    alias = [b for b in prog.schedule_ir.buffers if b.role == "alias"]
    assert len(alias) == 1 and tuple(alias[0].type.shape) == (32, 16)
    assert alias[0].data.role == "temp"
    got = ts.function(fn)(x, w1, w2)
    want = ts.interpret(fn, x, w1, w2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_column_reduction_fuses_its_prologue(rng):
    x = rng.standard_normal((301, 45)).astype(np.float32)
    fn = lambda x: op.sum(op.exp(x) * x, axis=0)     # noqa: E731
    assert strategies(fn, x) == ["reduce"]
    x64 = x.astype(np.float64)
    assert_close(ts.function(fn)(x), (np.exp(x64) * x64).sum(0).astype(np.float32), scale=20)


@pytest.mark.parametrize("shape", [((1, 1), (1, 1)), ((5, 7), (7, 3)), ((3, 64, 33), (33, 65)),
                                   ((2, 1, 9, 4), (3, 4, 5))])
def test_matmul_epilogue_is_fused(rng, shape):
    a = rng.standard_normal(shape[0]).astype(np.float32)
    w = rng.standard_normal(shape[1]).astype(np.float32)
    bias = rng.standard_normal(shape[1][-1]).astype(np.float32)
    fn = lambda a, w, bias: op.gelu(a @ w * 0.5 + bias)     # noqa: E731
    ks = kernels(fn, a, w, bias)
    assert [k.strategy for k in ks] == ["contract"]
    a64, w64 = a.astype(np.float64), w.astype(np.float64)
    y = a64 @ w64 * 0.5 + bias
    from math import erf
    want = 0.5 * y * (1 + np.vectorize(erf)(y / np.sqrt(2)))
    assert_close(ts.function(fn)(a, w, bias), want.astype(np.float32), scale=50)


def test_an_expensive_producer_stays_in_the_matmul_epilogue_not_a_multi_pass_row(rng):
    """layernorm then softmax pass over a row four times, and a row kernel's prologue runs on
    every pass: the gelu (an erf polynomial) goes to the matmul's epilogue instead, computed
    once; a cheap bias add, or a row kernel with one pass, still takes its producers."""
    x = rng.standard_normal((33, 20)).astype(np.float32)
    w = rng.standard_normal((20, 48)).astype(np.float32) * np.float32(0.3)
    b = rng.standard_normal(48).astype(np.float32)

    def block(x, w, b):
        return op.softmax(op.layernorm(op.gelu(x @ w) + b), axis=-1)
    ks = kernels(block, x, w, b)
    assert [k.strategy for k in ks] == ["contract", "row"]
    assert "%1:gelu" in ks[0].fused_labels() and "%2:add" in ks[1].fused_labels()
    from math import erf
    h = x.astype(np.float64) @ w.astype(np.float64)
    h = 0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2))) + b
    h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    assert_close(ts.function(block)(x, w, b), np_softmax(h).astype(np.float32), scale=50)
    # one pass (a sum), or no matmul to take it: the row kernel keeps the gelu
    assert strategies(lambda x, w: op.sum(op.gelu(x @ w), axis=-1), x, w) == ["contract", "row"]
    assert "gelu" in " ".join(kernels(lambda x, w: op.sum(op.gelu(x @ w), axis=-1), x, w)[1]
                              .fused_labels())
    assert strategies(lambda x: op.softmax(op.gelu(x), axis=-1), x) == ["row"]


def test_matmul_with_residual_and_transposed_weight(rng):
    x = rng.standard_normal((31, 40)).astype(np.float32)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    r = rng.standard_normal((31, 24)).astype(np.float32)
    fn = lambda x, w, r: x @ w.T + r      # noqa: E731
    assert strategies(fn, x, w, r) == ["contract"]       # w.T is read in place, not copied
    got = ts.function(fn)(x, w, r)
    assert_within_dot_bound(got - r, x, w.T)


def test_matmul_output_also_used_elsewhere_is_not_fused_away(rng):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    fn = lambda x, w: (x @ w, op.relu(x @ w))     # noqa: E731
    assert strategies(fn, x, w) == ["contract", "pointwise"]
    y, z = ts.function(fn)(x, w)
    assert_within_dot_bound(y, x, w)
    np.testing.assert_array_equal(z, np.maximum(y, 0))


def test_fusion_can_be_read_in_the_schedule(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    text = str(ts.function(lambda x: op.softmax(x)).lower(x).schedule_ir)
    assert "k0_softmax = row(%x) -> out0" in text and "fuses {%0:softmax}" in text


def random_program(rng, depth=8):
    """A random composition of elementwise ops, broadcasting, reductions (keepdim or not, last
    or first axis) and views, over x [A, B], y [B], z [A, 1]: fusion must never change a value."""
    steps = []
    for _ in range(depth):
        steps.append((int(rng.integers(0, 9)), int(rng.integers(0, 1000))))

    def fn(x, y, z):
        vals = [x]
        for kind, r in steps:
            a = vals[r % len(vals)]
            full = a.ndim == 2 and a.shape == x.shape
            if kind == 0:
                v = op.tanh(a) * 1.5
            elif kind == 1:
                v = a + y if full else a - 1.0
            elif kind == 2:
                v = a * z if full else op.exp(a * 0.1)
            elif kind == 3 and full:
                v = op.sum(a, axis=-1, keepdim=True) / 7.0
            elif kind == 4 and full:
                v = op.max(op.abs(a), axis=-1, keepdim=True)
            elif kind == 5 and full:
                v = op.sum(a * a, axis=0)          # a column reduction, shape [B]
            elif kind == 6 and full:
                v = op.sum(op.relu(a), axis=-1)    # no keepdim: shape [A]
            elif kind == 7:
                v = a - vals[(r // 7) % len(vals)] if a.shape == vals[(r // 7) % len(vals)].shape \
                    else a * 0.5
            else:
                v = a + vals[-1] if a.shape == vals[-1].shape else op.neg(a)
            if v.ndim == 1 and v.shape[0] == x.shape[0]:
                v = v.reshape(x.shape[0], 1)       # a renaming reshape back to [A, 1]
            if v.ndim == 2 and v.shape[1] == 1 and kind % 2:
                v = v + x                          # broadcast back to the full shape
            vals.append(v)
        return vals[-1] + vals[len(vals) // 2].sum() * 0.0 if vals[-1].ndim else vals[-1]
    return fn


@pytest.mark.parametrize("case", range(12))
def test_random_fused_programs_match_the_interpreter(rng, case):
    A, B = int(rng.integers(1, 40)), int(rng.integers(1, 70))
    x = rng.standard_normal((A, B)).astype(np.float32)
    y = rng.standard_normal(B).astype(np.float32)
    z = rng.standard_normal((A, 1)).astype(np.float32)
    fn = random_program(rng)
    want = ts.interpret(fn, x, y, z)
    got = ts.function(fn)(x, y, z)
    # (a random program may overflow: the tolerance scales with the finite values, and the
    # infinities and NaNs must sit in the same places)
    finite = np.abs(np.asarray(want)[np.isfinite(want)])
    scale = 1 + float(finite.max()) if finite.size else 1
    assert_close(got, want, atol=1e-5 * scale * B, rtol=1e-4)


def adam_like(p, g, m, v, lr):
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * g * g
    return p - lr * m2 / (op.sqrt(v2) + 1e-8), m2, v2


def test_outputs_on_one_domain_share_one_kernel(rng):
    """An optimizer step: the new moments are outputs and inputs of the new parameter; one kernel
    reads p, g, m, v once and writes all three."""
    p, g, m = (rng.standard_normal((33, 70)).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal((33, 70))).astype(np.float32)
    lr = np.float32(0.01)
    (k,) = kernels(adam_like, p, g, m, v, lr)
    assert k.strategy == "pointwise" and len(k.outputs) == 3
    got = ts.function(adam_like)(p, g, m, v, lr)
    want = ts.interpret(adam_like, p, g, m, v, lr)
    for a, b in zip(got, want):
        assert_close(a, b)
    m64, g64, v64 = (x.astype(np.float64) for x in (m, g, v))
    assert_close(got[1], (0.9 * m64 + 0.1 * g64).astype(np.float32))
    assert_close(got[2], (0.999 * v64 + 0.001 * g64 * g64).astype(np.float32))


def test_extra_stores_only_on_the_same_domain(rng):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)

    def broadcast_output(x, b):         # b * 2 is [16], the user reads it on [8, 16]
        s = b * 2.0
        return x + s, s

    def used_elsewhere(x):              # e is also reduced by another kernel
        e = op.exp(x)
        return e * 2.0, e, op.sum(e, axis=0)

    assert len(kernels(broadcast_output, x, b)) == 2
    got = ts.function(broadcast_output)(x, b)
    assert_close(got[0], x + b * 2.0)
    assert_close(got[1], b * 2.0)
    got = ts.function(used_elsewhere)(x)
    for a, w in zip(got, ts.interpret(used_elsewhere, x)):
        assert_close(a, w)


def test_same_output_returned_twice_and_stored(rng):
    x = rng.standard_normal((5, 9)).astype(np.float32)

    def twice(x):
        y = x * 3.0
        return op.tanh(y), y, y

    got = ts.function(twice)(x)
    assert_close(got[1], x * 3.0)
    assert_close(got[2], x * 3.0)
    assert got[1] is not got[2]
    assert_close(got[0], np.tanh(x * np.float32(3.0)))
