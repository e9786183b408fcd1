"""tessera.optim: several steps of each optimizer against NumPy written here from PyTorch's
formulas (compiled and eager), gradient clipping, loss scaling, and the kernels of an Adam step."""
import math

import numpy as np
import pytest

import tessera as ts
import tessera.nn as nn
import tessera.optim as optim
from tessera import op
from tessera.errors import ArgumentError
from tessera.pytree import leaves as tree_leaves, tree_map

from conftest import assert_close


def make_params(rng, dtype):
    return {"w": rng.standard_normal((5, 7)).astype(dtype),
            "layers": [{"b": rng.standard_normal(7).astype(dtype)},
                       {"s": rng.standard_normal(()).astype(dtype)}]}


def grads_for(rng, params, k):
    return tree_map(lambda p: (rng.standard_normal(p.shape) * (k + 1)).astype(p.dtype), params)


# ---- NumPy references, one leaf at a time (PyTorch's single-tensor code paths) -------------------
class NpSGD:
    def __init__(self, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
        self.__dict__.update(lr=lr, mu=momentum, damp=dampening, nest=nesterov,
                             wd=weight_decay)
        self.buf = {}

    def step(self, key, p, g):
        g = g + self.wd * p if self.wd else g
        if self.mu:
            if key not in self.buf:
                self.buf[key] = g.copy()
            else:
                self.buf[key] = self.mu * self.buf[key] + (1 - self.damp) * g
            g = g + self.mu * self.buf[key] if self.nest else self.buf[key]
        return p - self.lr * g


class NpAdam:
    def __init__(self, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
        self.lr, (self.b1, self.b2), self.eps, self.wd, self.dec = lr, betas, eps, \
            weight_decay, decoupled
        self.m, self.v, self.t = {}, {}, {}

    def step(self, key, p, g):
        t = self.t[key] = self.t.get(key, 0) + 1
        if self.dec:
            p = p * (1 - self.lr * self.wd)
        elif self.wd:
            g = g + self.wd * p
        m = self.m[key] = self.b1 * self.m.get(key, 0) + (1 - self.b1) * g
        v = self.v[key] = self.b2 * self.v.get(key, 0) + (1 - self.b2) * g * g
        bc1, bc2 = 1 - self.b1 ** t, 1 - self.b2 ** t
        return p - (self.lr / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + self.eps)


CASES = [
    (lambda: optim.SGD(0.1), lambda: NpSGD(0.1)),
    (lambda: optim.SGD(0.05, momentum=0.9), lambda: NpSGD(0.05, 0.9)),
    (lambda: optim.SGD(0.05, momentum=0.9, dampening=0.3, weight_decay=0.01),
     lambda: NpSGD(0.05, 0.9, 0.3, weight_decay=0.01)),
    (lambda: optim.SGD(0.05, momentum=0.8, nesterov=True), lambda: NpSGD(0.05, 0.8, nesterov=True)),
    (lambda: optim.Adam(0.01), lambda: NpAdam(0.01)),
    (lambda: optim.Adam(0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
     lambda: NpAdam(0.02, (0.8, 0.99), 1e-6, 0.1)),
    (lambda: optim.AdamW(0.01, weight_decay=0.05), lambda: NpAdam(0.01, weight_decay=0.05,
                                                                  decoupled=True)),
    (lambda: optim.Adam(0.01, betas=(0.0, 0.9)), lambda: NpAdam(0.01, (0.0, 0.9))),
]


def run_steps(opt, ref, params, rng, steps, mode):
    upd = ts.function(lambda g, s, p: opt.update(g, s, p)) if mode == "compiled" else opt.update
    state = opt.init(params)
    want = tree_map(lambda p: p.astype(np.float64), params)
    got = params
    for k in range(steps):
        g = grads_for(rng, params, k)
        got, state = upd(g, state, got)
        keys = iter(range(1000))
        want = tree_map(lambda p, gg: ref.step(next(keys), p, gg.astype(np.float64)), want, g)
    assert int(state["step"]) == steps
    return got, want


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("mode", ["compiled", "eager"])
def test_optimizer_steps_against_numpy(case, mode, rng):
    make, make_ref = CASES[case]
    params = make_params(rng, np.float64)
    got, want = run_steps(make(), make_ref(), params, rng, 5, mode)
    for a, b in zip(tree_leaves(got), tree_leaves(want)):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", [1, 4, 6])
def test_optimizer_float32(case, rng):
    make, make_ref = CASES[case]
    params = make_params(rng, np.float32)
    got, want = run_steps(make(), make_ref(), params, rng, 6, "compiled")
    for a, b in zip(tree_leaves(got), tree_leaves(want)):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_state_layout_and_schedule(rng):
    params = make_params(rng, np.float32)
    st = optim.Adam().init(params)
    assert set(st) == {"step", "m", "v"} and st["step"].dtype == np.int64
    assert all(not x.any() for x in tree_leaves(st["m"]) + tree_leaves(st["v"]))
    assert set(optim.SGD(0.1).init(params)) == {"step"}
    # a schedule: lr(t) with t the step count (1, 2, ...)
    opt = optim.SGD(lambda t: 0.1 * op.minimum(t / 2.0, 1.0))
    ref_lrs = [0.05, 0.1, 0.1]
    upd = ts.function(lambda g, s, p: opt.update(g, s, p))
    state, p = opt.init(params), params
    want = tree_map(lambda x: x.astype(np.float64), params)
    for lr in ref_lrs:
        g = grads_for(rng, params, 0)
        p, state = upd(g, state, p)
        want = tree_map(lambda w, gg: w - lr * gg, want, g)
    for a, b in zip(tree_leaves(p), tree_leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ArgumentError):
        optim.Adam(betas=(1.0, 0.9))
    with pytest.raises(ArgumentError):
        optim.SGD(0.1, nesterov=True)


def test_adam_step_kernels(rng):
    """Each parameter's update is pointwise kernels (m, v, p: one each until multi-output fusion),
    and the scalars all parameters share are computed once per step."""
    mlp = nn.MLP([8, 16, 16, 3])
    params = mlp.init(0)
    opt = optim.Adam()
    g = tree_map(np.ones_like, params)
    prog = ts.function(lambda g, s, p: opt.update(g, s, p)).lower(g, opt.init(params), params)
    ks = prog.schedule_ir.kernels
    n = len(tree_leaves(params))
    assert all(k.strategy == "pointwise" for k in ks)
    assert len(ks) <= 3 * n + 4, len(ks)


# ---- clipping ----------------------------------------------------------------------------------
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_by_global_norm(max_norm, rng):
    grads = make_params(rng, np.float32)
    norm = math.sqrt(sum(float((x.astype(np.float64) ** 2).sum()) for x in tree_leaves(grads)))
    coef = min(1.0, max_norm / (norm + 1e-6))
    f = ts.function(lambda g: optim.clip_by_global_norm(g, max_norm))
    for clipped, n in (f(grads), optim.clip_by_global_norm(grads, max_norm)):
        assert_close(np.asarray(n, np.float32), np.float32(norm), scale=10)
        for a, b in zip(tree_leaves(clipped), tree_leaves(grads)):
            assert a.dtype == np.float32
            np.testing.assert_allclose(a, b.astype(np.float64) * coef, rtol=1e-5, atol=1e-7)
    new_norm = math.sqrt(sum(float((x.astype(np.float64) ** 2).sum())
                             for x in tree_leaves(f(grads)[0])))
    assert new_norm <= max_norm * (1 + 1e-5) and (max_norm < norm or new_norm == norm or
                                                  abs(new_norm - norm) < 1e-5 * norm)


# ---- loss scaling ------------------------------------------------------------------------------
def test_static_loss_scaler(rng):
    sc = optim.LossScaler(1024.0, dynamic=False)
    grads = make_params(rng, np.float32)
    loss = np.float32(0.75)
    assert sc.scale(loss) == np.float32(768.0)
    un = sc.unscale(tree_map(lambda g: g * np.float32(1024), grads))
    for a, b in zip(tree_leaves(un), tree_leaves(grads)):
        assert np.array_equal(a, b)           # powers of two scale exactly
    st = sc.init()
    assert sc.update(st, np.asarray(False)) is st


@pytest.mark.parametrize("mode", ["compiled", "eager"])
def test_finite_detects_inf_and_nan_anywhere(mode, rng):
    finite = ts.function(lambda g: optim.LossScaler.finite(g)) if mode == "compiled" else \
        optim.LossScaler.finite
    grads = make_params(rng, np.float32)
    assert bool(finite(grads))
    for bad in (np.inf, -np.inf, np.nan):
        for leaf in range(3):
            g = tree_map(np.copy, grads)
            arr = tree_leaves(g)[leaf]
            arr.reshape(-1)[rng.integers(arr.size)] = bad
            assert not bool(finite(g))
    big = tree_map(lambda x: x / np.abs(x).max() * np.float32(3e38), grads)   # huge, finite
    assert bool(finite(big))


def np_scaler(scale, good, finite, interval, growth=2.0, backoff=0.5):
    if not finite:
        return scale * backoff, 0
    good += 1
    if good == interval:
        return scale * growth, 0
    return scale, good


@pytest.mark.parametrize("mode", ["compiled", "eager"])
def test_dynamic_loss_scaler(mode, rng):
    sc = optim.LossScaler(2.0 ** 10, growth_interval=3)
    upd = ts.function(lambda s, f: sc.update(s, f)) if mode == "compiled" else sc.update
    st = sc.init()
    scale, good = 2.0 ** 10, 0
    for finite in [True, True, True, True, False, True, True, True, False, False, True]:
        st = upd(st, np.asarray(finite))
        scale, good = np_scaler(scale, good, finite, 3)
        assert float(st["scale"]) == scale and int(st["good_steps"]) == good
        assert st["scale"].dtype == np.float32


def test_loss_scaler_skips_a_bad_step(rng):
    """A step under a dynamic scaler: scaled loss -> unscale -> finite? -> update or keep."""
    sc, opt = optim.LossScaler(2.0 ** 8, growth_interval=2), optim.Adam(0.1)
    params = make_params(rng, np.float32)

    def step(params, ostate, sstate, grads_scaled):
        grads = sc.unscale(grads_scaled, sstate)
        ok = sc.finite(grads)
        new_p, new_o = opt.update(grads, ostate, params)
        params, ostate = sc.select(ok, (new_p, new_o), (params, ostate))
        return params, ostate, sc.update(sstate, ok)
    f = ts.function(step)
    ostate, sstate = opt.init(params), sc.init()
    g = grads_for(rng, params, 0)
    scaled = tree_map(lambda x: x * sstate["scale"], g)
    p1, o1, s1 = f(params, ostate, sstate, scaled)
    want_p, _ = opt.update(g, ostate, params)
    for a, b in zip(tree_leaves(p1), tree_leaves(want_p)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(o1["step"]) == 1 and float(s1["scale"]) == 2.0 ** 8
    bad = tree_map(np.copy, scaled)
    bad["w"][0, 0] = np.inf
    p2, o2, s2 = f(p1, o1, s1, bad)
    assert all(np.array_equal(a, b) for a, b in zip(tree_leaves(p2), tree_leaves(p1)))
    assert int(o2["step"]) == 1 and float(s2["scale"]) == 2.0 ** 7
    assert sc.scale(np.float32(3.0), s2) == np.float32(3.0 * 2 ** 7)
