"""Structured control flow (ts.fori_loop, ts.while_loop, ts.scan, ts.cond): compiled for the CPU,
interpreted and eager, against Python loops over NumPy written here on fresh random inputs;
the Graph IR's nested bodies, the C loops, closures, pytree carries, nesting, and the errors."""
import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.errors import DifferentiationError, ShapeError, TracingError

from conftest import assert_close


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def run_all(fn, *args):
    """fn compiled, interpreted (the Graph IR's references) and eager: the three results."""
    f = ts.function(fn)
    return f(*args), f.interpret(*args), fn(*args)


def same(a, b):
    for x, y in zip(ts.pytree.leaves(a), ts.pytree.leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


@pytest.mark.parametrize("lo, hi", [(0, 0), (0, 1), (2, 9), (0, 31)])
def test_fori_loop_against_a_python_loop(lo, hi, rng):
    w = f32(rng, 40, 5)
    x = f32(rng, 5)

    def f(x, w):
        return ts.fori_loop(lo, hi, lambda i, acc: op.tanh(acc * 0.9 + w[i]), x)
    want = x.copy()
    for i in range(lo, hi):
        want = np.tanh(want * np.float32(0.9) + w[i]).astype(np.float32)
    got, interp, eager = run_all(f, x, w)
    assert_close(got, want)
    assert_close(interp, want)
    same(interp, eager)                # the Graph IR's references are the Python loop's


def test_while_loop_normalises_as_the_seeds_write_it(rng):
    """The seeds' `while tessera.norm(x) > threshold: x = normalize(x)`."""
    x = f32(rng, 7, 3) * 50

    def normalize(x):
        return x * 0.5

    def f(x):
        return ts.while_loop(lambda x: op.norm(x) > 1.0, normalize, x)
    want = x.copy()
    while np.linalg.norm(want) > 1.0:
        want = want * np.float32(0.5)
    got, interp, eager = run_all(f, x)
    assert_close(got, want)
    same(got, interp)                  # halving is exact: the C loop's bits are NumPy's
    same(got, eager)
    assert np.linalg.norm(got) <= 1.0


def test_while_loop_with_a_counter_in_the_carry_and_zero_trips(rng):
    x = f32(rng, 4)
    n = int(rng.integers(0, 12))

    def f(x):
        def body(c):
            i, v = c
            return i + 1, v * 1.5 + 1.0
        return ts.while_loop(lambda c: c[0] < n, body, (0, x))
    i, v = ts.function(f)(x)
    want = x.copy()
    for _ in range(n):
        want = want * np.float32(1.5) + np.float32(1.0)
    assert i.dtype == np.int32 and int(i) == n
    assert_close(v, want)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [0, 1, 13])
def test_scan_carries_and_stacks_ys(length, reverse, rng):
    h0 = f32(rng, 3)
    xs = {"a": f32(rng, length, 3), "b": f32(rng, length, 2, 3)}

    def f(h0, xs):
        def step(h, x):
            new = op.tanh(h * 0.5 + x["a"] + x["b"].sum(axis=0))
            return new, (h.sum(), new * 2.0)
        return ts.scan(step, h0, xs, reverse=reverse)
    h, ys_sum, ys_new = h0.copy(), np.zeros(length, np.float32), np.zeros((length, 3), np.float32)
    for t in (range(length - 1, -1, -1) if reverse else range(length)):
        new = np.tanh(h * np.float32(0.5) + xs["a"][t] + xs["b"][t].sum(axis=0))
        ys_sum[t], ys_new[t] = h.sum(), new * np.float32(2.0)
        h = new
    got = ts.function(f)(h0, xs)
    carry, (s, n) = got
    assert_close(carry, h)
    assert s.shape == (length,) and n.shape == (length, 3)
    assert_close(s, ys_sum)
    assert_close(n, ys_new)
    interp = ts.function(f).interpret(h0, xs)
    for a, b in zip(ts.pytree.leaves(got), ts.pytree.leaves(interp)):
        assert_close(a, b)
    if length:
        same(interp, f(h0, xs))


def test_scan_with_a_length_and_no_xs_as_jax_spells_it(rng):
    """ts.scan(f, init, length=n) runs f(carry, None) n times, compiled and eagerly, its
    gradient too; a length that is not xs's is a ShapeError."""
    x, w = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)

    def f(x, w):
        return ts.scan(lambda h, _: (op.tanh(h * w + 0.5), op.sum(h)), x, length=7)
    h, ys = x.astype(np.float64), []
    for _ in range(7):
        ys.append(h.sum())
        h = np.tanh(h * w + 0.5)
    for got in (ts.function(f)(x, w), f(x, w)):
        np.testing.assert_allclose(got[0], h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], ys, rtol=1e-5, atol=1e-5)
    back = ts.function(lambda x: ts.scan(lambda c, _: (c * 2.0 + 1.0, None), x, length=3,
                                         reverse=True))(x)
    np.testing.assert_allclose(back[0], x * 8 + 7, rtol=1e-6)
    assert ts.check_grad(lambda x, w: op.sum(f(x, w)[0]), x, w) < 1e-5
    with pytest.raises(ts.ShapeError, match="length=4"):
        ts.function(lambda x: ts.scan(lambda c, t: (c + t, None), x[0], x, length=4))(x)
    with pytest.raises(ts.ArgumentError, match="xs or length"):
        ts.scan(lambda c, t: (c, None), x)


def test_scan_without_ys(rng):
    x, xs = f32(rng, 4), f32(rng, 6, 4)
    carry, ys = ts.function(lambda x, xs: ts.scan(lambda c, t: (c + t, None), x, xs))(x, xs)
    assert ys is None
    assert_close(carry, x + xs.sum(axis=0))


def test_cond_takes_one_branch(rng):
    x = f32(rng, 6)

    def f(x, flip):
        return ts.cond(flip.sum() > 0, lambda x: op.exp(x), lambda x: -x * 3.0, x)
    F = ts.function(f)
    assert_close(F(x, np.ones(2, np.float32)), np.exp(x))
    assert_close(F(x, -np.ones(2, np.float32)), -x * np.float32(3.0))
    assert len(F.programs.by_key) == 1          # one program serves both branches


def test_cond_on_a_concrete_predicate_picks_at_trace_time(rng):
    x = f32(rng, 3)
    g = ts.function(lambda x: ts.cond(True, lambda x: x + 1.0, lambda x: x - 1.0, x))
    assert_close(g(x), x + np.float32(1.0))
    assert "cond" not in str(g.lower(x).graph_ir)


@pytest.mark.parametrize("n", [5, 3_000_001])
def test_swapped_carries_and_unchanged_ones(n, rng):
    """A body giving back another carry (a swap: through a staging buffer of its own, not the
    stack, whatever the size) or its own input unchanged."""
    a, b = f32(rng, n), f32(rng, n)
    steps = 7

    def f(a, b):
        return ts.fori_loop(0, steps, lambda i, c: (c[1], c[0] + 1.0, c[2]), (a, b, a * 2.0))
    x, y, z = ts.function(f)(a, b)
    p, q = a.copy(), b.copy()
    for _ in range(steps):
        p, q = q, p + np.float32(1.0)
    assert_close(x, p)
    assert_close(y, q)
    same(z, a * np.float32(2.0))


def test_nested_loops_closures_and_pytrees(rng):
    w = f32(rng, 4, 3)
    x = f32(rng, 3)

    def f(x, w):
        def outer(i, c):
            inner = ts.fori_loop(0, 3, lambda j, a: a + w[i] * 0.25, c["acc"])
            return {"acc": inner, "n": c["n"] + 1}
        return ts.fori_loop(0, 4, outer, {"acc": x, "n": 0})
    got = ts.function(f)(x, w)
    want = x.copy()
    for i in range(4):
        for _ in range(3):
            want = want + w[i] * np.float32(0.25)
    assert_close(got["acc"], want)
    assert int(got["n"]) == 4
    same(got, f(x, w))


def test_the_graph_ir_prints_the_bodies_and_the_c_has_the_loop(rng):
    x, w = f32(rng, 4), f32(rng, 10, 4)
    f = ts.function(lambda x, w: ts.fori_loop(0, 10, lambda i, acc: acc * 0.5 + w[i], x))
    prog = f.lower(x, w)
    text = str(prog.graph_ir)
    assert "fori_loop(%x, %w) {lo=0, hi=10}" in text
    assert "body = graph @body(%i: i32[], %a0: f32[4], %cap0: f32[10,4])" in text
    assert "fori_loop(%x) {lo=0, hi=10} -> out0 {" in str(prog.schedule_ir)
    assert "for (int64_t r0_step = 0LL; r0_step < 10LL; ++r0_step)" in prog.target_code
    assert len(prog.kernels) == 2           # the body's kernels, compiled once


def test_loops_are_deterministic_and_profiled(rng):
    x, w = f32(rng, 64), f32(rng, 50, 64)
    f = ts.function(lambda x, w: ts.fori_loop(0, 50, lambda i, a: op.sin(a) + w[i], x))
    first = f(x, w)
    with ts.profiler() as prof:
        again = f(x, w)
    same(first, again)
    rows = prof.rows()          # each body kernel's time summed over the loop's 50 steps
    assert {r["kernel"] for r in rows} == {k.name for k in f.lower(x, w).kernels}
    assert all(r["calls"] == 1 and r["median_ms"] > 0 for r in rows)


def test_training_switch_inside_a_body(rng):
    x = f32(rng, 5)

    def f(x):
        return ts.fori_loop(0, 2, lambda i, v: v + (1.0 if ts.is_training() else 10.0), x)
    F = ts.function(f)
    assert_close(F(x), x + np.float32(2.0))
    with ts.training(False):
        assert_close(F(x), x + np.float32(20.0))


def test_annotated_functions_check_and_print_loops_symbolically(rng):
    from tessera import Tensor

    @ts.function
    def f(h0: Tensor["D"], xs: Tensor["T", "D"]) -> Tensor["D"]:
        h, ys = ts.scan(lambda h, x: (h * 0.5 + x, h.sum()), h0, xs)
        return ts.fori_loop(0, 3, lambda i, v: v + 1.0, h)
    text = str(f.graph_ir)
    assert "scan(%h0, %xs) {length=T, reverse=false}  : f32[D], f32[T]" in text
    h0, xs = f32(rng, 3), f32(rng, 5, 3)
    want = h0.copy()
    for t in range(5):
        want = want * np.float32(0.5) + xs[t]
    assert_close(f(h0, xs), want + np.float32(3.0))


# ---- errors ------------------------------------------------------------------------------------
def test_a_carry_that_changes_shape_or_dtype_is_a_shape_error(rng):
    x = f32(rng, 4)
    with pytest.raises(ShapeError, match="carry 0 as f32\\[\\]") as info:
        ts.function(lambda x: ts.fori_loop(0, 3, lambda i, v: v.sum(), x))(x)
    assert "lambda i, v: v.sum()" in str(info.value)          # the body's line
    with pytest.raises(ShapeError, match="f64\\[4\\]"):
        ts.function(lambda x: ts.while_loop(lambda v: v.sum() > 0,
                                            lambda v: v.astype("float64"), x))(x)
    with pytest.raises(ShapeError, match="another structure"):
        ts.function(lambda x: ts.fori_loop(0, 3, lambda i, c: (c[0],), (x, x)))(x)
    with pytest.raises(ShapeError, match="false_fn gives back result 0"):
        ts.function(lambda x: ts.cond(x.sum() > 0, lambda x: x, lambda x: x.sum(), x))(x)
    with pytest.raises(ShapeError, match="one element"):
        ts.function(lambda x: ts.cond(x > 0, lambda x: x, lambda x: -x, x))(x)


def test_python_if_on_a_tensor_points_at_cond_and_while_loop(rng):
    def f(x):
        if x.sum() > 0:
            return x
        return -x
    with pytest.raises(TracingError) as info:
        ts.function(f)(f32(rng, 3))
    assert "if x.sum() > 0:" in str(info.value)
    assert "ts.cond" in info.value.hint and "ts.while_loop" in info.value.hint


def test_fori_loop_bounds_are_static(rng):
    with pytest.raises(TracingError, match="int bounds") as info:
        ts.function(lambda x, n: ts.fori_loop(0, n.sum(), lambda i, v: v, x))(
            f32(rng, 3), np.ones(2, np.int32))
    assert "while_loop" in info.value.hint


# ---- reverse mode -------------------------------------------------------------------------------
def f64(rng, *shape):
    return rng.standard_normal(shape)


def test_fori_loop_gradient_against_finite_differences(rng):
    x, w = f64(rng, 4), f64(rng, 7, 4)

    def loss(x, w):
        return ts.fori_loop(0, 7, lambda i, a: op.tanh(a * 0.9 + w[i]), x).sum()
    assert ts.check_grad(loss, x, w) < 1e-5
    text = str(ts.grad(loss).lower(x, w).graph_ir)
    assert "fori_loop(%x, %w) {lo=0, hi=7, save=true}" in text    # the carries kept...
    assert "{length=7, reverse=true}" in text                      # ...for a reverse scan


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_gradient_through_carries_ys_xs_and_captures(reverse, rng):
    x, xs, v = f64(rng, 3), f64(rng, 5, 3), f64(rng, 3)

    def loss(x, xs, v):
        def step(c, t):
            h, n = c
            h2 = op.sin(h) * t + v
            return (h2, n + 1), (h * t).sum()
        (h, n), ys = ts.scan(step, (x, 0), xs, reverse=reverse)
        return h.sum() + (ys * ys).sum()
    assert ts.check_grad(loss, x, xs, v) < 1e-6


def test_cond_gradient_takes_the_branch_taken(rng):
    x, w = f64(rng, 4), f64(rng, 2, 4)

    def loss(x, w):
        return ts.cond(x.sum() > 0, lambda a: (a * w[0]).sum(),
                       lambda a: (op.exp(a) * w[1]).sum(), x)
    for sign in (1.0, -1.0):
        assert ts.check_grad(loss, np.abs(x) * sign, w) < 1e-6
    g = ts.grad(loss)(np.abs(x), w)
    assert np.array_equal(g, w[0])


def test_nested_loops_second_order_and_jvp(rng):
    x, w = f64(rng, 4), f64(rng, 3, 4)

    def nested(x, w):
        def outer(i, c):
            acc, n = c
            return ts.fori_loop(0, 2, lambda j, a: op.sin(a) + w[i] * 0.5, acc), n + 1
        a, _ = ts.fori_loop(0, 3, outer, (x, 0))
        return (a * a).sum()
    assert ts.check_grad(nested, x, w) < 1e-5

    def f(x):
        return ts.fori_loop(0, 3, lambda i, a: a * a * 0.5 + 0.1, x).sum()
    g = ts.grad(f)
    assert ts.check_grad(lambda x: (g(x) * w[0]).sum(), x) < 1e-6    # Hessian-vector
    t = f64(rng, 4)
    _, tangent = ts.jvp(f, (x,), (t,))
    assert_close(tangent, np.dot(g(x), t))


def _saved_rows(g, seen=None) -> list:
    """The first dimension of every stacked carry a differentiated loop keeps, nested bodies
    included: how many carries reverse mode holds."""
    seen = set() if seen is None else seen
    out = []
    for n in g.nodes:
        r = n.attrs.get("region")
        if r is None or id(r) in seen:
            continue
        seen.add(id(r))
        if r.attrs.get("save") or r.attrs.get("saves"):
            k = r.attrs.get("carries", len(r.types)) if r.kind == "fori_loop" else r.attrs["saves"]
            out += [t.shape[0] for t in r.types[len(r.types) - k:]]
        for body in r.bodies.values():
            out += _saved_rows(body, seen)
    return out


@pytest.mark.parametrize("reverse", [False, True])
def test_checkpointed_loops_keep_fewer_carries_and_the_same_gradients(reverse, rng):
    """checkpoint=k: reverse mode keeps a carry per segment of k steps (and the steps left
    over), recomputing a segment's carries from its first; values and gradients those of the
    plain loops (the captured tensor's sum adds up segment by segment: to rounding)."""
    n = 23
    xs, h0, w = rng.standard_normal((n, 4)), rng.standard_normal(4), rng.standard_normal(4)

    def make(ck):
        def f(h0, xs, w):
            h, ys = ts.scan(lambda h, x: (op.tanh(h * w + x), h * h), h0, xs, reverse=reverse,
                            checkpoint=ck)
            a = ts.fori_loop(2, n, lambda i, c: op.tanh(c * w + xs[i]), h0, checkpoint=ck)
            return op.sum(h) + op.sum(ys * ys) + op.sum(a * a)
        return f
    plain = ts.value_and_grad(make(None), argnums=(0, 1, 2))(h0, xs, w)
    for ck in (5, True, 7):
        value, grads = ts.value_and_grad(make(ck), argnums=(0, 1, 2))(h0, xs, w)
        np.testing.assert_array_equal(value, plain[0])
        for got, want in zip(grads, plain[1]):
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)
    # finite differences' truncation error grows with the gradient (w's reaches ~100 over 23
    # steps), so the bound is relative to the largest gradient
    scale = max(np.abs(g).max() for g in plain[1])
    assert ts.check_grad(make(5), h0, xs, w) < 1e-6 * scale
    grad_of = lambda ck: ts.grad(make(ck), argnums=(0,)).lower(h0, xs, w).graph_ir  # noqa: E731
    assert sorted(_saved_rows(grad_of(None))) == [n - 2, n]
    # scan: 4 segments of 5 + 3 left over; fori_loop: 4 segments of 5 + 1 left over
    assert sorted(_saved_rows(grad_of(5))) == [1, 3, 4, 4, 5, 5]
    eager = make(5)(h0, xs, w)                  # outside a function: the plain Python loops
    np.testing.assert_allclose(eager, plain[0], rtol=1e-13)
    with pytest.raises(ts.ArgumentError, match="checkpoint must be True or a number"):
        ts.function(lambda h: ts.scan(lambda c, x: (c + x, None), h, xs, checkpoint=0))(h0)


def test_while_loop_reverse_mode_says_why(rng):
    x = f32(rng, 4)
    with pytest.raises(DifferentiationError, match="through ts.while_loop") as info:
        ts.grad(lambda x: ts.while_loop(lambda v: v.sum() < 9, lambda v: v * 2.0, x).sum())(x)
    assert "ts.while_loop(" in str(info.value)          # the loop's line
    assert "fori_loop" in info.value.hint


def test_gpu_programs_lower_their_loops_for_the_host(rng):
    """On a GPU the host runs the loop around the launches (runtime/program.py HostSteps; run
    in the CUDA emulator by tests/targets/test_gpu_emulated.py): lowering needs no device."""
    f = ts.function(lambda x: ts.fori_loop(0, 3, lambda i, v: v * 2.0, x), target="cuda")
    prog = f.lower(f32(rng, 4))
    assert [st.kind for st in prog.tile_ir.steps] == ["fori_loop"]
    assert "__global__" in prog.target_code
