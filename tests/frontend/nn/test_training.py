"""Training end to end: one compiled ts.function computes the loss, the gradients (ts.grad) and
the optimizer update; an MLP learns a synthetic classification set, and the loss curve is the
same bit for bit across runs and thread counts."""
import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tessera as ts
import tessera.nn as nn
import tessera.optim as optim
from tessera.pytree import leaves as tree_leaves

pytestmark = pytest.mark.skipif(not hasattr(ts, "value_and_grad"), reason="needs ts.grad")


def spirals(n, classes, seed, noise=0.03):
    """``classes`` interleaved spiral arms in the plane (a set no linear model separates)."""
    r = np.random.default_rng(seed)
    y = r.integers(0, classes, n)
    t = r.random(n)
    ang = t * 1.75 * np.pi + y * 2 * np.pi / classes
    x = (t + 0.1)[:, None] * np.stack([np.cos(ang), np.sin(ang)], 1)
    return (x + r.standard_normal((n, 2)) * noise).astype(np.float32), y.astype(np.int64)


def make_step(model, opt, clip=None, dropout_seed=False, scaler=None):
    """The training step: loss, grads and update in one graph (optionally clipped, with a
    dropout seed per step, and under a loss scaler)."""
    def loss_fn(params, x, y, seed, sstate):
        logits = model(params, x, seed=seed, train=dropout_seed)
        loss = nn.cross_entropy(logits, y)
        return loss if scaler is None else scaler.scale(loss, sstate)

    def train_step(params, state, x, y, seed, sstate):
        loss, grads = ts.value_and_grad(loss_fn)(params, x, y, seed, sstate)
        if scaler is not None:
            loss, grads = loss / sstate["scale"], scaler.unscale(grads, sstate)
        if clip is not None:
            grads, _ = optim.clip_by_global_norm(grads, clip)
        params, state = opt.update(grads, state, params)
        return loss, params, state
    return train_step


def train(step, params, state, x, y, steps, sstate=None):
    losses = []
    sstate = sstate if sstate is not None else {"scale": np.float32(1)}
    for i in range(steps):
        loss, params, state = step(params, state, x, y, np.int64(i), sstate)
        losses.append(np.asarray(loss))
    return np.array(losses), params, state


def accuracy(model, params, x, y):
    return float((np.argmax(model(params, x), axis=-1) == y).mean())


def test_mlp_learns_spirals():
    x, y = spirals(300, 3, seed=0)
    xt, yt = spirals(300, 3, seed=1)
    mlp, opt = nn.MLP([2, 64, 64, 3], activation="relu"), optim.Adam(0.01)
    assert accuracy(mlp, mlp.init(0), x, y) < 0.6
    step = ts.function(make_step(mlp, opt))
    params = mlp.init(0)
    losses, params, state = train(step, params, opt.init(params), x, y, 300)
    assert int(state["step"]) == 300
    assert losses[-1] < 0.1 * losses[0]
    assert accuracy(mlp, params, x, y) > 0.95
    assert accuracy(mlp, params, xt, yt) > 0.95            # held out, same distribution


def test_compiled_step_matches_the_interpreter():
    x, y = spirals(64, 3, seed=2)
    mlp, opt = nn.MLP([2, 16, 3], activation="gelu"), optim.AdamW(0.01, weight_decay=0.1)
    fn = make_step(mlp, opt, clip=0.5)
    step = ts.function(fn)
    params = mlp.init(3)
    state = opt.init(params)
    args = (x, y, np.int64(0), {"scale": np.float32(1)})
    for _ in range(3):
        got = step(params, state, *args)
        want = ts.interpret(fn, params, state, *args)
        for a, b in zip(tree_leaves(got), tree_leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        _, params, state = got


def test_power_of_two_loss_scaling_changes_no_bit():
    """Scaling the loss by 2^k scales every gradient exactly: the curve is the same bits."""
    x, y = spirals(128, 3, seed=4)
    mlp, opt = nn.MLP([2, 32, 3]), optim.SGD(0.1, momentum=0.9)
    sc = optim.LossScaler(2.0 ** 12, dynamic=False)
    plain = ts.function(make_step(mlp, opt))
    scaled = ts.function(make_step(mlp, opt, scaler=sc))
    p = mlp.init(5)
    a, pa, _ = train(plain, p, opt.init(p), x, y, 20)
    b, pb, _ = train(scaled, p, opt.init(p), x, y, 20, sstate=sc.init())
    assert a.tobytes() == b.tobytes()
    assert all(u.tobytes() == v.tobytes() for u, v in zip(tree_leaves(pa), tree_leaves(pb)))
    assert a[-1] < a[0]


PROGRAM = textwrap.dedent("""
    import hashlib, sys, numpy as np, tessera as ts, tessera.nn as nn, tessera.optim as optim
    sys.path.insert(0, TESTS)
    from test_training import make_step, spirals, train
    x, y = spirals(512, 3, seed=7)
    mlp = nn.MLP([2, 256, 256, 3], activation="gelu", dropout=0.1)
    opt = optim.AdamW(3e-3)
    step = ts.function(make_step(mlp, opt, clip=1.0, dropout_seed=True))
    p = mlp.init(11)
    losses, p, _ = train(step, p, opt.init(p), x, y, 15)
    h = hashlib.sha256(losses.tobytes())
    for leaf in ts.pytree.leaves(p):
        h.update(leaf.tobytes())
    print(h.hexdigest(), losses[0], losses[-1])
""")


def test_loss_curves_are_bitwise_identical_across_runs_and_thread_counts():
    """Large enough that matmuls and pointwise kernels run in parallel; with dropout (a seed per
    step), gradient clipping (a global reduction) and AdamW."""
    def run(threads):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        prog = PROGRAM.replace("TESTS", repr(os.path.dirname(__file__)))
        out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True,
                             text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()
    one, two, again = run(1), run(2), run(2)
    assert one[0] == two[0] == again[0]
    assert float(one[2]) < float(one[1])              # and it trains


def test_two_runs_in_process_are_bitwise_identical():
    x, y = spirals(200, 3, seed=9)
    mlp, opt = nn.MLP([2, 32, 32, 3], dropout=0.2), optim.Adam(0.01)
    step = ts.function(make_step(mlp, opt, clip=2.0, dropout_seed=True))
    p = mlp.init(1)
    a, pa, _ = train(step, p, opt.init(p), x, y, 30)
    b, pb, _ = train(ts.function(make_step(mlp, opt, clip=2.0, dropout_seed=True)), p,
                     opt.init(p), x, y, 30)
    assert hashlib.sha256(a.tobytes()).digest() == hashlib.sha256(b.tobytes()).digest()
    assert all(u.tobytes() == v.tobytes() for u, v in zip(tree_leaves(pa), tree_leaves(pb)))


def test_layer_gradients_match_finite_differences(rng):
    """ts.check_grad (float64 central differences) through the nn layers and losses."""
    from tessera import op
    x = rng.standard_normal((2, 5, 8))
    w = rng.standard_normal((2, 5, 8))
    labels = rng.integers(0, 3, (2, 5))
    blk = nn.TransformerBlock(8, 2, mlp_ratio=2, causal=True, rope=True, norm="rmsnorm",
                              dtype=np.float64)
    ln = nn.TransformerBlock(8, 4, mlp_ratio=1, dtype=np.float64)
    mlp = nn.MLP([8, 6, 3], activation="tanh", dtype=np.float64)
    emb = nn.Embedding(10, 8, dtype=np.float64)
    ids = rng.integers(0, 10, (4,))
    cases = [
        (lambda x: op.sum(nn.rope(x, offset=2) * w), (x,)),
        (lambda p, x: op.sum(blk(p, x) * w), (blk.init(0), x)),
        (lambda p, x: op.sum(ln(p, x) * w), (ln.init(1), x)),
        (lambda p, x: nn.cross_entropy(mlp(p, x), labels, label_smoothing=0.1), (mlp.init(2), x)),
        (lambda a: nn.kl_divergence(a, w), (x,)),
        (lambda a: nn.mse(a, w), (x,)),
        (lambda p: op.sum(emb(p, ids) ** 2), (emb.init(3),)),
    ]
    for fn, args in cases:
        assert ts.check_grad(fn, *args) < 1e-5
