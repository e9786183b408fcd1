"""Odd inputs and symbolic shapes, found by review: each was a silent wrong answer, a crash or a
raw Python exception."""
import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, op

from conftest import assert_close


@pytest.mark.parametrize("dtype", [">f4", ">f8", ">i4", ">i8"])
def test_big_endian_inputs_and_constants(dtype, rng):
    x = (rng.standard_normal(7) * 10).astype(dtype)
    assert_close(ts.function(lambda x: x * 2)(x), (x * 2).astype(x.dtype.newbyteorder("=")))
    assert_close(ts.function(lambda x: x.sum())(x), np.asarray(x.sum()).astype(
        np.sum(x).dtype.newbyteorder("=")))
    c = np.arange(7).astype(dtype)
    assert_close(ts.function(lambda y: y + c)(np.zeros(7, c.dtype.newbyteorder("="))),
                 c.astype(c.dtype.newbyteorder("=")))
    assert_close(op.add(x, x), (x + x).astype(x.dtype.newbyteorder("=")))


def test_return_annotation_checked_when_python_uses_sizes():
    @ts.function
    def f(x: Tensor["S"]) -> Tensor["S"]:
        return op.concat([x[i:i + 1] * 1 for i in range(x.shape[0])] + [x])

    with pytest.raises(ts.ShapeError, match="return annotation"):
        f(np.ones(3, np.float32))

    @ts.function
    def g(x: Tensor["S"]) -> Tensor["S", "S"]:
        return x.sum() * int(x.shape[0])

    with pytest.raises(ts.ShapeError, match="return annotation"):
        g(np.ones(3, np.float32))


def test_open_and_negative_slices_on_symbolic_axes(rng):
    @ts.function
    def h(x: Tensor["S"]) -> Tensor["S"]:
        return x[1:]

    with pytest.raises(ts.ShapeError, match="return annotation"):
        h.graph_ir
    with pytest.raises(ts.ShapeError, match="return annotation"):
        h(np.ones(3, np.float32))

    @ts.function
    def k(x: Tensor["B", "S"]):
        return x[:, 1:-1] + x[:, 2:] [:, :-0 or None][:, :x.shape[1] - 2]

    assert str(k.graph_ir.outputs[0].type) == "f32[B,S-2]"
    x = rng.standard_normal((2, 6)).astype(np.float32)
    assert_close(k(x), x[:, 1:-1] + x[:, 2:][:, :4])


def test_symbolic_slice_past_the_end_is_clamped_at_the_call():
    @ts.function
    def f(x: Tensor["S"]) -> Tensor[5]:
        return x[:5]

    with pytest.raises(ts.ShapeError, match="return annotation"):
        f(np.ones(3, np.float32))
    assert f(np.ones(9, np.float32)).shape == (5,)


def test_static_arguments_that_compare_equal_are_different_keys():
    g = ts.function(lambda x, s: x * s[0])
    xi = np.ones(3, np.int32)
    assert g(xi, (1,)).dtype == np.int32
    assert g(xi, (1.0,)).dtype == np.float64
    f = ts.function(lambda x, s: x * s)
    x = np.ones(3, np.float32)
    f(x, 0.0)
    assert np.signbit(f(x, -0.0)).all()
    hb = ts.function(lambda x, s: x * s[0])
    b = np.array([True])
    assert hb(b, (True,)).dtype == np.bool_ and hb(b, (1,)).dtype == np.int64


def test_out_of_range_axes_raise():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ts.ShapeError, match="out of range"):
        ts.function(lambda x: x.transpose(2, 1))(x)
    with pytest.raises(ts.ShapeError, match="out of range"):
        op.transpose(x, [3, 0])
    with pytest.raises(ts.ShapeError, match="out of range"):
        op.split(np.ones((2, 2, 2)), 2, axis=3)
    with pytest.raises(ts.ArgumentError, match="sections"):
        op.split(x, -1)
    with pytest.raises(ts.ArgumentError, match="sections"):
        op.split(x, 0)


def test_var_correction_larger_than_count():
    x = np.arange(6., dtype=np.float32).reshape(2, 3)
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"), np.errstate(divide="ignore"):
        want = np.var(x, axis=1, ddof=5)
    assert_close(ts.function(lambda x: x.var(axis=1, correction=5))(x), want)
    assert_close(op.var(x, axis=1, correction=5), want)


def test_mixed_int_and_array_index_is_refused_not_transposed():
    x = np.ones((4, 5, 6), np.float32)
    with pytest.raises(ts.TesseraError, match="integer-array index"):
        ts.function(lambda x: x[0, :, np.array([1, 2])])(x)
    f = ts.function(lambda x: x[0][:, np.array([1, 2])])
    assert_close(f(x), x[0][:, [1, 2]])


def test_inlined_call_checks_the_return_annotation():
    @ts.function
    def inner(a: Tensor["S"]) -> Tensor["S"]:
        return op.concat([a, a])

    outer = ts.function(lambda x: inner(x) * 2)
    with pytest.raises(ts.ShapeError, match="return annotation"):
        outer(np.ones(3, np.float32))


@pytest.mark.parametrize("name", ["sum", "max", "min", "argmax", "mean", "softmax",
                                  "logsumexp", "layernorm", "rmsnorm", "log_softmax"])
def test_rank0_with_an_axis_is_a_shape_error(name):
    x = np.array(2.0, np.float32)
    for axis in (0, -1):
        with pytest.raises(ts.ShapeError, match="rank-0"):
            ts.function(lambda x: getattr(op, name)(x, axis=axis))(x)
        with pytest.raises(ts.ShapeError, match="rank-0"):
            getattr(op, name)(x, axis=axis)
    if name in ("sum", "max", "min", "argmax", "mean"):
        assert_close(ts.function(lambda x: getattr(op, name)(x))(x),
                     np.asarray(getattr(np, name)(x)))


def test_scalar_constants_feed_every_kind_of_kernel(rng):
    x = rng.standard_normal((5, 3)).astype(np.float32)
    assert_close(ts.function(lambda x: x[np.array(3)])(x), x[3])
    assert_close(ts.function(lambda x: op.take(x, np.array(-1), axis=1))(x), x[:, -1])
    big = ts.function(lambda x: op.broadcast_to(np.float32(1.5), (300, 300)) + x[0, 0])
    assert_close(big(x), np.full((300, 300), 1.5, np.float32) + x[0, 0])


def test_numpy_integers_in_shapes(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    f = ts.function(lambda x: (x.reshape(np.int64(6)), x.reshape(np.int64(-1), np.int32(2)),
                               x[np.int64(1):], op.broadcast_to(x, (np.int64(4), 2, 3))))
    a, b, c, d = f(x)
    assert_close(a, x.reshape(6))
    assert_close(b, x.reshape(-1, 2))
    assert_close(c, x[1:])
    assert_close(d, np.broadcast_to(x, (4, 2, 3)).copy())


def test_cache_entry_without_entry_point_is_rebuilt(tmp_path, monkeypatch):
    import subprocess
    import sys
    from pathlib import Path
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    prog = ("import numpy as np, tessera as ts\n"
            "print(ts.function(lambda x: x + 1)(np.zeros(3, np.float32)).tolist())\n"
            "print(ts.cache_stats()['compiles'])")
    run = lambda: subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True)  # noqa
    assert run().stdout.split("\n")[:2] == ["[1.0, 1.0, 1.0]", "1"]
    so = next(Path(tmp_path).rglob("*.so"))
    other = tmp_path / "other.c"
    other.write_text("int something_else(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(other)], check=True)
    out = run()
    assert out.stdout.split("\n")[:2] == ["[1.0, 1.0, 1.0]", "1"], out.stderr
    assert "corrupt kernel cache entry" in out.stderr


BAD_CALLS = [
    lambda x: op.concat([]),
    lambda x: x.reshape(None),
    lambda x: x.reshape("a"),
    lambda x: x.sum(axis="a"),
    lambda x: x.sum(axis=1.5),
    lambda x: x.reshape(2.0, 3),
    lambda x: op.broadcast_to(x, 3),
    lambda x: op.broadcast_to(x, ("A", 3)),
    lambda x: op.slice(x),
    lambda x: op.softmax(x, axis=[0, 1]),
    lambda x: np.sum(x),
    lambda x: float(x),
    lambda x: x.astype(np.int32) + 2 ** 40,
    lambda x: x.astype(np.int32) < 2 ** 40,
]


def test_huge_python_int_against_a_float_tensor_follows_numpy():
    x = np.ones((2, 3), np.float32)
    assert_close(ts.function(lambda x: x + 2 ** 70)(x), x + 2 ** 70)


@pytest.mark.parametrize("k", range(len(BAD_CALLS)))
def test_bad_calls_raise_tessera_errors(k):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ts.TesseraError):
        ts.function(BAD_CALLS[k])(x)


def test_bad_eager_and_argument_inputs():
    with pytest.raises(ts.TesseraError):
        op.concat([])
    with pytest.raises(ts.TesseraError):
        op.sum(np.ones((2, 3)), axis="a")
    with pytest.raises(ts.ArgumentError, match="not an array"):
        ts.function(lambda x: x + 1)([[1, 2], [3]])
    with pytest.raises(TypeError, match=">= 0"):
        Tensor[-1]
    with pytest.raises(ts.AnnotationError, match="'B\\*S'") as e:   # a TesseraError, with a hint
        Tensor["B*S", "D"]
    assert isinstance(e.value, TypeError) and "reshape" in e.value.hint


def test_python_code_needing_a_symbol_names_the_users_line():
    @ts.function
    def sum_steps(x: Tensor["S"]):
        acc = x[0]
        for i in range(x.shape[0]):
            acc = acc + x[i]
        return acc
    with pytest.raises(ts.SymbolicValueError) as e:
        sum_steps.graph_ir
    assert e.value.location.text == "for i in range(x.shape[0]):"
    assert e.value.partial_graph is not None and "sum_steps" in str(e.value)
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_allclose(sum_steps(x), x[0] + x.sum())     # concrete sizes still work


def test_integer_pow_with_negative_exponents_agrees_everywhere():
    base = np.array([2, 1, -1, -1, 0, 3], np.int64)
    exp_ = np.array([-1, -3, -3, -2, 2, 2], np.int64)
    want = np.array([0, 1, -1, 1, 0, 9], np.int64)
    f = ts.function(lambda a, b: a ** b)
    assert_close(f(base, exp_), want)
    assert_close(ts.interpret(f, base, exp_), want)
    assert_close(op.pow(base, exp_), want)


def test_symbolic_reshape_against_a_number_is_checked_at_the_call(rng):
    @ts.function
    def f(x: Tensor["N"]):
        return x.reshape(3, 4)

    x = rng.standard_normal(12).astype(np.float32)
    assert_close(f(x), x.reshape(3, 4))
    with pytest.raises(ts.ShapeError):
        f(np.ones(10, np.float32))

    @ts.function
    def g(x: Tensor["B", "D"]) -> Tensor["B", "D"]:
        return x.reshape(x.shape[0], 2, -1).reshape(x.shape[0], -1)

    y = rng.standard_normal((3, 4)).astype(np.float32)
    assert_close(g(y), y)

    @ts.function
    def fixed(x: Tensor["S"]) -> Tensor[3]:
        return x

    assert_close(fixed(np.ones(3, np.float32)), np.ones(3, np.float32))
    with pytest.raises(ts.ShapeError):
        fixed(np.ones(4, np.float32))


@pytest.mark.parametrize("name", ["out0", "INFINITY", "t0", "i0", "in0", "ts_status", "int",
                                  "float", "double", "bool", "true", "int64_t", "expf", "b"])
def test_parameter_names_never_reach_generated_code(name):
    g = {"op": op}
    exec(compile(f"def f({name}, y):\n    return op.exp({name}) + y * 2, {name} * 3\n",
                 "<cell>", "exec"), g)
    a = np.arange(4, dtype=np.float32)
    e, t = ts.function(g["f"])(a, a)
    assert_close(e, np.exp(a) + a * 2, scale=2)
    assert_close(t, a * 3)


def test_numpy_ufuncs_trace_as_operators(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    f = ts.function(lambda x: (np.exp(x), np.maximum(x, 0), np.matmul(x, w), np.negative(x),
                               np.ones(4, np.float32) * x, x > np.zeros(4, np.float32)))
    outs = f(x)
    wants = (np.exp(x), np.maximum(x, 0), None, -x, x, x > 0)
    for got, want in zip(outs, wants):
        if want is not None:
            assert_close(got, want, scale=2)
    assert "matmul" in str(f.lower(x).graph_ir)
    with pytest.raises(ts.TracingError, match="np.add.reduce"):
        ts.function(lambda x: np.add.reduce(x))(x)
    with pytest.raises(ts.TracingError, match="keyword"):
        ts.function(lambda x: np.exp(x, dtype=np.float64))(x)


def test_softmax_over_an_empty_axis_names_the_line():
    x = np.zeros((0, 3), np.float32)
    for fn in (lambda x: op.softmax(x, axis=0), lambda x: op.logsumexp(x, axis=0)):
        with pytest.raises(ts.ShapeError, match="empty axis") as e:
            ts.function(fn)(x)
        assert "test_odd_inputs.py:" in str(e.value)
        with pytest.raises(ts.ShapeError, match="empty axis"):
            ts.interpret(ts.function(fn), x)
    assert ts.function(lambda x: op.softmax(x, axis=1))(x).shape == (0, 3)


def test_interpret_skips_dead_code_like_the_compiler():
    def f(x, i):
        unused = op.take(x, i)       # noqa: F841  out of range, but never used
        return x * 2

    x = np.ones(3, np.float32)
    i = np.array([7])
    assert_close(ts.function(f)(x, i), x * 2)
    assert_close(ts.interpret(f, x, i), x * 2)


def test_sizes_beyond_int64_indexing_are_shape_errors():
    x = np.ones(1, np.float32)
    with pytest.raises(ts.ShapeError, match="too large") as e:
        ts.function(lambda x: op.sum(op.broadcast_to(x, (2 ** 63,))))(x)
    assert "test_odd_inputs.py:" in str(e.value)


def test_unallocatable_buffer_is_a_resource_error():
    x = np.ones(1, np.float32)
    with pytest.raises(ts.ResourceError, match="broadcast_to") as e:
        ts.function(lambda x: op.broadcast_to(x, (2 ** 42,)))(x)
    assert "test_odd_inputs.py:" in str(e.value)


def test_misuse_of_traced_tensors_is_a_tracing_error():
    x = np.ones(3, np.float32)
    for fn in (lambda x: x if x > 0 else x, lambda x: float(x), lambda x: np.sum(x),
               lambda x: np.asarray(x) + 1, lambda x: x.sum().item(), lambda x: x.tolist(),
               lambda x: x.numpy()):
        with pytest.raises(ts.TracingError) as e:
            ts.function(fn)(x)
        assert "test_odd_inputs.py:" in str(e.value)
    with pytest.raises(ts.TracingError, match=r"call \.item\(\) or \.tolist\(\) on the result"):
        ts.function(lambda x: x.sum().item())(x)
    with pytest.raises(ts.ShapeError, match="out of range"):
        ts.function(lambda x: x[5])(x)
    with pytest.raises(ts.UnsupportedDTypeError) as e:
        ts.function(lambda x: x.astype("datetime64[s]"))(x)
    assert "test_odd_inputs.py:" in str(e.value)


@pytest.mark.parametrize("bad", [None, "abc", object()])
def test_a_non_array_for_an_annotated_argument_names_it(bad):
    """None (or a string) where a Tensor[...] is annotated: an ArgumentError naming the
    argument and its annotation, not "dtype object is not supported"."""
    @ts.function
    def f(x: ts.Tensor["B", "D"]):
        return x * 2
    with pytest.raises((ts.ArgumentError, ts.UnsupportedDTypeError)) as e:
        f(bad)
    text = str(e.value)
    assert "argument 'x'" in text and "dtype object" not in text
    if bad is None:
        assert "NoneType, not an array" in text and "[B,D]" in text
