"""JAX functions as tessera functions (tessera/jaxpr.py), against JAX itself on fresh random
inputs: values, gradients (jax.grad), control flow, and the errors for what is not mapped."""
import numpy as np
import pytest

import tessera as ts
from tessera import op

jax = pytest.importorskip("jax", reason="ts.from_jax converts JAX functions")
jnp = jax.numpy


def close(got, want, tol=2e-6):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max(
        initial=0)))


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def mlp(p, x):
    h = jax.nn.gelu(x @ p["w1"] + p["b1"], approximate=False)
    h = jax.nn.relu(h) + jax.nn.silu(h) * 0.5
    mean = h.mean(-1, keepdims=True)
    h = (h - mean) * jax.lax.rsqrt(((h - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    logits = h @ p["w2"]
    return {"probs": jax.nn.softmax(logits, axis=-1), "lse": jax.nn.logsumexp(logits, -1),
            "pick": jnp.argmax(logits, -1)}


def params(rng, d=6, h=16, k=5):
    return {"w1": f32(rng, d, h) * 0.4, "b1": f32(rng, h), "w2": f32(rng, h, k) * 0.3}


def test_mlp_with_pytrees_matches_jax_and_is_a_compiled_function(rng):
    p, x = params(rng), f32(rng, 8, 6)
    f = ts.from_jax(mlp, p, x)
    assert isinstance(f, ts.Function)
    got, want = f(p, x), mlp(p, x)
    assert set(got) == set(want)                       # the same pytree comes back
    for k in want:
        close(got[k], want[k])
    assert got["pick"].dtype == np.int32               # JAX's dtypes (x64 off)
    p2, x2 = params(rng), f32(rng, 8, 6)               # fresh values, the same program
    close(f(p2, x2)["probs"], mlp(p2, x2)["probs"])
    prog = f.lower(p, x)
    assert "matmul" in str(prog.graph_ir) and prog.schedule_ir.kernels


def test_gradients_match_jax_grad(rng):
    p, x = params(rng), f32(rng, 8, 6)
    y = rng.integers(0, 5, size=8)
    onehot = np.eye(5, dtype=np.float32)[y]
    f = ts.from_jax(mlp, p, x)
    loss = lambda p, x, t: -op.sum(t * op.log(f(p, x)["probs"]))              # noqa: E731
    jloss = lambda p, x, t: -(t * jnp.log(mlp(p, x)["probs"])).sum()          # noqa: E731
    got, want = ts.grad(loss)(p, x, onehot), jax.grad(jloss)(p, x, onehot)
    for k in want:
        close(got[k], want[k], tol=2e-5)
    # a whole JAX loss converted, differentiated by tessera's own rules
    whole = ts.from_jax(jloss, p, x, onehot)
    for k, g in ts.grad(whole)(p, x, onehot).items():
        close(g, want[k], tol=2e-5)


def attention_block(x, wq, wk, wv):
    q, k, v = x @ wq, x @ wk, x @ wv
    s = jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(q.shape[-1]).astype(np.float32)
    mask = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
    s = jnp.where(mask, s, -1e9)
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, -1), v)


def test_attention_written_in_jax_numpy(rng):
    x, ws = f32(rng, 2, 7, 8), [f32(rng, 8, 8) * 0.3 for _ in range(3)]
    f = ts.from_jax(attention_block, x, *ws)
    close(f(x, *ws), attention_block(x, *ws))
    g = ts.grad(lambda x, a, b, c: op.sum(f(x, a, b, c) ** 2))(x, *ws)
    close(g, jax.grad(lambda x, *w: (attention_block(x, *w) ** 2).sum())(x, *ws), tol=3e-5)


# (name, function, argument maker): each primitive family on random values
CASES = [
    ("exp2_log1p_expm1", lambda x: (jnp.exp2(x), jnp.log1p(jnp.abs(x) * 1e-4), jnp.expm1(x * 1e-3),
                                    jnp.expm1(x)), lambda r: [f32(r, 4, 9)]),
    ("softplus_log_sigmoid", lambda x: (jax.nn.softplus(x * 10), jax.nn.log_sigmoid(x * 10)),
     lambda r: [f32(r, 4, 9)]),
    ("round_both_ways", lambda x: (jnp.round(x), jax.lax.round(x, 0), jnp.floor(x), jnp.ceil(x)),
     lambda r: [np.concatenate([f32(r, 20) * 4, np.float32([0.5, -0.5, 1.5, -2.5, 2.5])])]),
    ("int_division_and_remainder", lambda a, b: (a // b, a % b, jax.lax.div(a, b),
                                                 jax.lax.rem(a, b)),
     lambda r: [r.integers(-50, 50, 40).astype(np.int32),
                r.choice([-7, -3, -1, 1, 2, 5], 40).astype(np.int32)]),
    ("float_remainder", lambda a, b: (a % b, jax.lax.rem(a, b)),
     lambda r: [f32(r, 30) * 10, np.where(r.random(30) < 0.5, -1, 1).astype(np.float32) * 3]),
    ("integer_pow_and_square", lambda x: (x ** 3, x ** -2, jnp.square(x), x ** 0, x ** 7),
     lambda r: [f32(r, 3, 5) + 3]),
    ("compare_select_clip", lambda x, y: (jnp.where((x > y) & ~(x < -1) | (y > 2), x, y),
                                          jnp.clip(x, -0.5, 0.7), jnp.maximum(x, y),
                                          jnp.isfinite(jnp.asarray(x) / (y > 0)), jnp.sign(x)),
     lambda r: [f32(r, 6, 4), f32(r, 4)]),
    ("reductions", lambda x: (x.sum(0), x.max((0, 2)), x.min(), jnp.argmin(x, 1), x.mean(),
                              jnp.any(x > 2, axis=1), jnp.all(x > -3)),
     lambda r: [f32(r, 3, 5, 4)]),
    ("cumulative", lambda x: (jnp.cumsum(x, 1), jnp.cumprod(x, 0),
                              jax.lax.cumsum(x, axis=1, reverse=True)),
     lambda r: [f32(r, 4, 6)]),
    ("movement", lambda x: (jnp.flip(x, (0, 1)), jnp.pad(x, ((1, 2), (0, 3)), constant_values=7),
                            jnp.concatenate([x, x * 2], 0), jnp.split(x, [2, 3], 1)[1],
                            x[1:, ::2], x.T.reshape(-1), x[None, :, None].squeeze(0),
                            jnp.broadcast_to(x[:, :1], (4, 6)), jnp.arange(6) * x[0]),
     lambda r: [f32(r, 4, 6)]),
    ("gather_rows", lambda w, ids: (w[ids], jnp.take(w, ids, axis=0), w[ids[:, None]].sum(1)),
     lambda r: [f32(r, 9, 5), r.integers(-9, 9, 7).astype(np.int32)]),
    ("sorting", lambda x: (jnp.sort(x), jnp.argsort(x, axis=0), jax.lax.top_k(x, 3)),
     lambda r: [f32(r, 5, 6)]),
    ("dot_general_forms", lambda a, b, v: (jnp.einsum("ijk,ikl->ijl", a, b),
                                           jnp.einsum("ijk,ljk->il", a, a), a @ v, v @ b[0],
                                           jnp.tensordot(a, b, ((0, 2), (0, 1))),
                                           jnp.dot(v, v)),
     lambda r: [f32(r, 3, 4, 5), f32(r, 3, 5, 2), f32(r, 5)]),
    ("special_functions", lambda x: (jax.scipy.special.gammaln(x), jax.scipy.special.digamma(x),
                                     jax.grad(lambda x: jax.scipy.special.gammaln(x).sum())(x)),
     lambda r: [np.exp(f32(r, 40) * 3)]),
    ("dtypes", lambda x: (x.astype(jnp.bfloat16) * 3, (x * 100).astype(jnp.int32),
                          jnp.float16(1.5) * x.astype(jnp.float16)),
     lambda r: [f32(r, 4, 5)]),
]


@pytest.mark.parametrize("name,fn,make", CASES, ids=[c[0] for c in CASES])
def test_primitive_families_match_jax(rng, name, fn, make):
    args = make(rng)
    got = jax.tree_util.tree_leaves(ts.from_jax(fn, *args)(*args))
    want = jax.tree_util.tree_leaves(fn(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.asarray(g).dtype == np.asarray(w).dtype
        if np.asarray(w).dtype.kind in "iub" or name in ("round_both_ways", "sorting"):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))     # exact
        else:
            tol = 1e-2 if np.asarray(w).dtype.itemsize == 2 else 2e-6
            close(np.asarray(g, np.float64), np.asarray(w, np.float64), tol=tol)


def rnn(W, h0, xs):
    def step(h, x):
        h = jnp.tanh(h @ W + x)
        return h, h.sum()
    h, ys = jax.lax.scan(step, h0, xs)
    back, _ = jax.lax.scan(lambda c, x: (c * 0.5 + x, None), h, xs, reverse=True)
    c = jax.lax.fori_loop(0, 5, lambda i, c: c * 1.5 + i, h)
    w = jax.lax.while_loop(lambda c: c[0] < 100.0, lambda c: (c[0] * 2.0, c[1] + 1),
                           (jnp.abs(h).sum() + 1.0, 0))
    z = jax.lax.cond(h.sum() > 0, lambda a: a * 2.0, lambda a: a - 1.0, h)
    sw = jax.lax.switch(jnp.argmax(h), [lambda a: a + 1.0, lambda a: a * 3.0, lambda a: -a], h)
    return h, ys, back, c, w, z, sw


def test_control_flow_becomes_tessera_control_flow(rng):
    for _ in range(3):                                 # several draws: each branch of cond
        W, h0, xs = f32(rng, 3, 3) * 0.5, f32(rng, 3), f32(rng, 6, 3)
        f = ts.from_jax(rnn, W, h0, xs)
        got, want = jax.tree_util.tree_leaves(f(W, h0, xs)), \
            jax.tree_util.tree_leaves(rnn(W, h0, xs))
        for g, w in zip(got, want):
            close(g, w, tol=5e-6)
    assert "scan" in str(f.lower(W, h0, xs).graph_ir)
    g = ts.grad(lambda W, h0, xs: op.sum(f(W, h0, xs)[1]))(W, h0, xs)
    close(g, jax.grad(lambda *a: rnn(*a)[1].sum())(W, h0, xs), tol=2e-5)


def test_stop_gradient_is_a_zero_derivative(rng):
    x = f32(rng, 5)
    f = ts.from_jax(lambda x: (jax.lax.stop_gradient(x) * x).sum(), x)
    close(ts.grad(f)(x), jax.grad(lambda x: (jax.lax.stop_gradient(x) * x).sum())(x))
    close(ts.grad(lambda x: op.sum(op.stop_gradient(x) * x))(x), x)       # op.stop_gradient


def test_unmapped_primitives_listed_at_once_with_their_lines(rng):
    def model(x):
        y = jnp.linalg.cholesky(x @ x.T + 3 * jnp.eye(4))
        return jnp.fft.fft(x).real + jax.lax.cummax(y, axis=0).sum()
    with pytest.raises(ts.TesseraError) as e:
        ts.from_jax(model, f32(rng, 4, 4))
    text = str(e.value)
    assert "2 JAX primitive(s)" not in text and "cholesky" in text and "cummax" in text
    assert "fft" in text and "test_jax.py:" in text
    with pytest.raises(ts.TesseraError, match="could not trace"):
        ts.from_jax(lambda x: x[int(x.sum())], f32(rng, 3))         # JAX's own refusal
    with pytest.raises(ts.TesseraError, match="gather is not mapped"):
        x = f32(rng, 4, 4)
        ts.from_jax(lambda x, i: x[:, i], x, np.array([0, 2], np.int32))(
            x, np.array([0, 2], np.int32))


def test_constants_captured_by_the_jax_function(rng):
    table = f32(rng, 3, 4)
    x = f32(rng, 2, 3)
    f = ts.from_jax(lambda x: jnp.tanh(x @ table) + jnp.arange(4.0), x)
    close(f(x), jnp.tanh(x @ table) + jnp.arange(4.0))


def test_jax_arrays_in_jax_arrays_out(rng):
    p, x = params(rng), f32(rng, 8, 6)
    f = ts.from_jax(mlp, p, x)
    jp, jx = jax.tree_util.tree_map(jnp.asarray, p), jnp.asarray(x)
    got = f(jp, jx)
    assert all(isinstance(v, jax.Array) for v in got.values())
    for k, v in f(p, x).items():                         # the same program, the same bits
        np.testing.assert_array_equal(np.asarray(got[k]), v)
    assert isinstance(f(p, jx)["probs"], np.ndarray)     # mixed: NumPy, as always


def test_a_new_shape_is_a_clear_error(rng):
    p, x = params(rng), f32(rng, 8, 6)
    f = ts.from_jax(mlp, p, x)
    with pytest.raises(ts.ArgumentError, match=r"float32\[4, 6\].*converted from JAX for "
                                               r"float32\[8, 6\]"):
        f(p, f32(rng, 4, 6))
    with pytest.raises(ts.ArgumentError, match="float64"):
        f(p, x.astype(np.float64))


def indexing(x, v, i):
    x = jnp.asarray(x)
    rows = jax.lax.fori_loop(0, 3, lambda k, c: c + x[k] * 2, jnp.zeros(x.shape[1]))
    return (rows, jax.lax.dynamic_update_slice(x, v, (1, 2)),
            jax.lax.dynamic_update_slice(x, v, (i, i + 5)),            # clamped, as JAX
            x.at[jnp.array([0, 2, 0])].add(v[0, 0]), jnp.prod(x, axis=0), jnp.prod(x[:2]),
            jax.lax.dynamic_slice(x, (i, i), (2, 3)))


def test_dynamic_indexing_scatter_and_products(rng):
    x, v = f32(rng, 3, 4), f32(rng, 1, 2)
    for i in (1, -3, 7):                         # inside, and clamped from either side
        i = np.int32(i)
        f = ts.from_jax(indexing, x, v, i)
        for g, w in zip(f(x, v, i), indexing(x, v, i)):
            close(g, w)
    loss = lambda x, v, i: sum(jnp.sum(jnp.sin(o)) for o in indexing(x, v, i))   # noqa: E731
    f = ts.from_jax(loss, x, v, np.int32(1))
    got = ts.grad(f, argnums=(0, 1))(x, v, np.int32(1))
    want = jax.grad(loss, argnums=(0, 1))(x, v, np.int32(1))
    for g, w in zip(got, want):
        close(g, w, tol=2e-5)
