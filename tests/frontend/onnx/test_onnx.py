"""ONNX export and import (tessera/onnx.py) against ONNX's own reference evaluator: exported
models pass onnx.checker and compute what the tessera function computes; models written with
onnx.helper (not by tessera) import to what the reference computes; unsupported operators are
listed at once."""
import sys

import numpy as np
import pytest

import tessera as ts
from tessera import op

onnx = pytest.importorskip("onnx", reason="ONNX import and export need the onnx package")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402


def _many(x, w, ids, table):   # (any: a bool max; maximum of bools: Or; counts and shares)
    h = op.gelu(x @ w) + op.take(table, ids, axis=0)
    h = op.layernorm(h, axis=-1) * 2.0
    s = op.softmax(op.transpose(h), axis=0)
    z = op.concat([s[:, 1:3], op.reshape(op.mean(h, axis=0), [-1, 1]), s[::-1, :1]], axis=1)
    return (z, op.sum(op.rsqrt(h * h + 1), axis=1, keepdim=True), op.argmax(h, axis=1),
            op.var(h, axis=0), op.rmsnorm(op.tanh(h), axis=-1), op.logsumexp(h, axis=1),
            op.cast(op.where(h > 0, h, -h) <= 1.0, "float32"), op.cumsum(op.silu(h), axis=1),
            op.max(op.maximum(h > 1.0, h < -1.0), axis=1), op.sum(h > 0, axis=0),
            op.mean(h > 0.5, axis=1))


@pytest.mark.parametrize("opset", [17, 18, 19, 20, 21])
def test_export_runs_in_the_reference_evaluator(opset, tmp_path, rng):
    """Each opset's spelling (reductions' axes an input from 18; a bool max through int32
    before 20), checked by onnx.checker with full shape inference."""
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w = rng.standard_normal((4, 6)).astype(np.float32)
    ids = rng.integers(0, 7, 5)
    table = rng.standard_normal((7, 6)).astype(np.float32)
    fn = ts.function(_many)
    model = fn.export(tmp_path / "m.onnx", x, w, ids, table, opset_version=opset)  # checked
    assert (tmp_path / "m.onnx").exists() and model.opset_import[0].version == opset
    ref = ReferenceEvaluator(model).run(None, {"x": x, "w": w, "ids": ids, "table": table})
    got = fn(x, w, ids, table)
    assert len(ref) == len(got)
    for r, g in zip(ref, got):
        assert r.dtype == g.dtype and r.shape == g.shape
        np.testing.assert_allclose(r, g, rtol=1e-5, atol=1e-5)
    again = ts.onnx.import_model(tmp_path / "m.onnx")(x, w, ids, table)   # and back
    for a, g in zip(again, got):
        np.testing.assert_allclose(a, g, rtol=1e-6, atol=1e-6)
    try:
        import onnxruntime
    except ImportError:                 # (the test extra installs it)
        return
    rt = onnxruntime.InferenceSession(model.SerializeToString(),
                                      providers=["CPUExecutionProvider"])
    for r, g in zip(rt.run(None, {"x": x, "w": w, "ids": ids, "table": table}), got):
        assert r.dtype == g.dtype and r.shape == g.shape
        np.testing.assert_allclose(r, g, rtol=1e-5, atol=1e-5)


def _integers(a, b, s):
    return (a + b, a * b - a, op.sum(a, axis=0), op.prod(b, axis=1), op.max(a, axis=1),
            (a & b) | (a ^ 3), ~b, s << 2, s >> 1, op.cast(a, "uint16") + 300,
            op.quantize_linear(op.cast(a, "float32") * 0.7, np.float32(0.5), np.int8(3)))


@pytest.mark.parametrize("opset", [18, 21])
def test_integer_programs_export(opset, rng):
    """int8 arithmetic (wrapping), integer sums and products (int64), bits and shifts (BitShift
    of unsigned integers), casts and quantization: ONNX's reference evaluator gives tessera's
    bits."""
    a = rng.integers(-128, 128, (4, 5)).astype(np.int8)
    b = rng.integers(-128, 128, (4, 5)).astype(np.int8)
    s = rng.integers(0, 256, (4, 5)).astype(np.uint8)
    fn = ts.function(_integers)
    model = fn.export(None, a, b, s, opset_version=opset)
    got = fn(a, b, s)
    with np.errstate(over="ignore"):
        ref = ReferenceEvaluator(model).run(None, {"a": a, "b": b, "s": s})
    for r, g in zip(ref, got):
        assert r.dtype == g.dtype and r.shape == g.shape
        np.testing.assert_array_equal(r, g)
    with pytest.raises(ts.TesseraError, match="BitShift takes unsigned integers"):
        ts.function(lambda a: a << 1).export(None, a, opset_version=opset)


def test_export_attention(rng):
    q, k, v = (rng.standard_normal((2, 3, s, 8)).astype(np.float32) for s in (5, 7, 7))
    fn = ts.function(lambda q, k, v: op.attention(q, k, v, causal=True))
    model = ts.onnx.export(fn, None, q, k, v)
    (ref,) = ReferenceEvaluator(model).run(None, {"q": q, "k": k, "v": v})
    np.testing.assert_allclose(ref, fn(q, k, v), rtol=1e-5, atol=1e-6)


CONV_EXPORTS = {
    "conv": lambda x, w: op.conv(x, w, stride=2, padding=((1, 0), (1, 2)), groups=2),
    "conv_transpose": lambda x, w: op.conv_transpose(x, w[:4], stride=2, padding=1,
                                                     output_padding=1),
    "pools": lambda x, w: op.max_pool(x, 3, 2, 1, ceil_mode=True) +
    op.avg_pool(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    "pads": lambda x, w: op.pad(x, [[0, 0], [0, 0], [2, 1], [1, 3]], mode="reflect") * 2 +
    op.pad(x, [[0, 0], [1, 0], [2, 1], [1, 3]], value=1.5)[:, :4] +
    op.pad(x, [[0, 0], [0, 0], [2, 1], [1, 3]], mode="circular"),
    "batch_norm and resize": lambda x, w: op.resize(op.batch_norm(x, None, None, training=True),
                                                    scale=2.0, mode="linear"),
}


@pytest.mark.parametrize("name", sorted(CONV_EXPORTS))
def test_export_the_convolution_family(name, rng):
    """Conv, ConvTranspose, MaxPool, AveragePool and Pad written as ONNX's own operators (the
    compositions as theirs): ONNX's reference evaluator agrees, and the model reads back."""
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    fn = ts.function(CONV_EXPORTS[name])
    model = ts.onnx.export(fn, None, x, w)
    ops = {n.op_type for n in model.graph.node}
    assert {"conv": {"Conv"}, "conv_transpose": {"ConvTranspose"}, "pools": {"MaxPool",
            "AveragePool"}, "pads": {"Pad"}}.get(name, set()) <= ops
    feeds = {i.name: v for i, v in zip(model.graph.input, (x, w))}
    (ref,) = ReferenceEvaluator(model).run(None, feeds)
    want = fn(x, w)
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ts.onnx.import_model(model)(*feeds.values()), want, rtol=1e-6,
                               atol=1e-6)


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_import_models_written_with_onnx_helper(rng):
    f32 = TensorProto.FLOAT
    w = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Relu", ["g"], ["r"]),
        helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(
            np.array([0, 2, 3], np.int64))),
        helper.make_node("Reshape", ["r", "shape"], ["rs"]),
        helper.make_node("ReduceMean", ["rs"], ["m"], axes=[2], keepdims=0),
        helper.make_node("Softmax", ["m"], ["sm"], axis=-1),
        helper.make_node("Constant", [], ["st"], value=numpy_helper.from_array(
            np.array([-1], np.int64))),
        helper.make_node("Constant", [], ["en"], value=numpy_helper.from_array(
            np.array([-100], np.int64))),
        helper.make_node("Constant", [], ["ax"], value=numpy_helper.from_array(
            np.array([0], np.int64))),
        helper.make_node("Constant", [], ["sp"], value=numpy_helper.from_array(
            np.array([-2], np.int64))),
        helper.make_node("Slice", ["sm", "st", "en", "ax", "sp"], ["sl"]),
        helper.make_node("Unsqueeze", ["sl", "ax"], ["u"]),
        helper.make_node("Greater", ["u", "half"], ["gt"]),
        helper.make_node("Where", ["gt", "u", "half"], ["wh"]),
        helper.make_node("Cast", ["wh"], ["out"], to=TensorProto.DOUBLE),
        helper.make_node("ReduceSum", ["out"], ["total"], keepdims=1),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", f32, [5, 4])],
                   [helper.make_tensor_value_info("out", TensorProto.DOUBLE, [1, 3, 2]),
                    helper.make_tensor_value_info("total", TensorProto.DOUBLE, [1, 1, 1])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
                    numpy_helper.from_array(np.float32(0.5), "half")])
    onnx.checker.check_model(model)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = ts.onnx.import_model(model.SerializeToString())(x)
    for r, g in zip(want, got):
        assert r.shape == g.shape and r.dtype == g.dtype
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_unsupported_operators_are_listed_at_once(rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    fn = ts.function(lambda x: op.sort(x, axis=-1) + op.cumprod(x, axis=0))
    with pytest.raises(ts.TesseraError, match="2 operator.*cumprod, sort"):
        fn.export(None, x)
    shapes = _model([helper.make_node("Unique", ["x"], ["y"]),       # (data-dependent shapes)
                     helper.make_node("NonZero", ["y"], ["z"])],
                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                    [helper.make_tensor_value_info("z", TensorProto.INT64, None)])
    with pytest.raises(ts.TesseraError, match="2 operator.*NonZero, Unique"):
        ts.onnx.import_model(shapes)


@pytest.mark.parametrize("kind", ["GatherND", "ScatterND"])
def test_an_index_past_its_own_axis_is_reported(kind, rng):
    """GatherND/ScatterND address rows through one flat index: [0, 4] on a [3, 4] tensor is
    out of range (the reference evaluator raises), not row 1's first element."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
           helper.make_tensor_value_info("i", TensorProto.INT64, [2, 2])]
    node = helper.make_node(kind, ["x", "i"] + (["u"] if kind == "ScatterND" else []), ["y"])
    if kind == "ScatterND":
        ins.append(helper.make_tensor_value_info("u", TensorProto.FLOAT, [2]))
    out = [2] if kind == "GatherND" else [3, 4]
    m = _model([node], ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)])
    fn = ts.onnx.import_model(m)
    feeds = {"x": x, "i": np.array([[2, 1], [0, -1]]), "u": np.float32([5, 6])}
    args = [feeds[v.name] for v in m.graph.input]
    want = ReferenceEvaluator(m).run(None, {v.name: feeds[v.name] for v in m.graph.input})[0]
    np.testing.assert_array_equal(fn(*args), want)
    args[1] = np.array([[2, 1], [0, 4]])
    with pytest.raises(ts.RuntimeFault, match="out of range"):
        fn(*args)


def test_without_onnx_says_how_to_install(monkeypatch, rng):
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ts.TesseraError, match="pip install onnx"):
        ts.function(lambda x: x * 2).export(None, rng.standard_normal(3))


# ---- older opsets, each read by its own rules --------------------------------------------------
def _one_node_model(opset, node, inputs, out_shape=None, out_type=TensorProto.FLOAT):
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                       list(a.shape)) for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", out_type, out_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _softmax_2d(x, axis):
    flat = x.reshape(int(np.prod(x.shape[:axis])), -1).astype(np.float64)
    e = np.exp(flat - flat.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)


def _older_cases(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    one = rng.standard_normal((1, 3, 1)).astype(np.float32)
    return {   # name: (opset, node, inputs, what NumPy gives)
        "clip_attributes": (6, helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.25),
                            {"x": x}, np.clip(x, -0.5, 0.25)),
        "squeeze_axes_attribute": (11, helper.make_node("Squeeze", ["x"], ["y"], axes=[0]),
                                   {"x": one}, one[0]),
        "unsqueeze_axes_attribute": (11, helper.make_node("Unsqueeze", ["x"], ["y"],
                                                          axes=[0, 3]), {"x": x},
                                     np.expand_dims(x, (0, 3))),
        "slice_attributes": (9, helper.make_node("Slice", ["x"], ["y"], starts=[1, -3],
                                                 ends=[3, 100], axes=[1, 2]), {"x": x},
                             x[:, 1:3, -3:]),
        "softmax_2d_coercion": (11, helper.make_node("Softmax", ["x"], ["y"]), {"x": x},
                                _softmax_2d(x, 1)),
        "log_softmax_2d_coercion": (11, helper.make_node("LogSoftmax", ["x"], ["y"], axis=2),
                                    {"x": x}, np.log(_softmax_2d(x, 2))),
        "add_broadcast_at_axis": (6, helper.make_node("Add", ["x", "b"], ["y"], broadcast=1,
                                                      axis=1), {"x": x, "b": b},
                                  x + b[:, None]),
        "reshape_shape_attribute": (4, helper.make_node("Reshape", ["x"], ["y"],
                                                        shape=[4, 0, 2]), {"x": x},
                                    x.reshape(4, 3, 2)),
        "prelu_per_channel": (6, helper.make_node("PRelu", ["x", "b"], ["y"]), {"x": x, "b": b},
                              np.where(x < 0, x * b[:, None], x)),
    }


@pytest.mark.parametrize("name", sorted(_older_cases(np.random.default_rng(0))))
def test_an_older_opsets_node_is_read_by_its_rules(name, rng):
    """Each of these reads wrongly, or not at all, by the newest opset's rules (a Clip of opset 6
    came back unclamped; a Squeeze of opset 11 dropped every size-1 axis)."""
    opset, node, inputs, want = _older_cases(rng)[name]
    fn = ts.onnx.import_model(_one_node_model(opset, node, inputs))
    got = fn(*inputs.values())
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_older_schema_tessera_does_not_read_is_refused_by_name(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    tiles, axis = np.asarray(2, np.int64), np.asarray(1, np.int64)
    model = _one_node_model(5, helper.make_node("Tile", ["x", "t", "a"], ["y"]),
                            {"x": x, "t": tiles, "a": axis})
    with pytest.raises(ts.TesseraError, match="Tile as ONNX opset 5 defines it"):
        ts.onnx.import_model(model)


def test_a_cast_to_a_type_tessera_lacks_is_a_tessera_error(rng):
    """(It was a bare KeyError from the importer's dtype table.)"""
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for to in (TensorProto.INT4, TensorProto.FLOAT8E4M3FNUZ, TensorProto.INT2):
        model = _one_node_model(21, helper.make_node("Cast", ["x"], ["y"], to=to), {"x": x},
                                out_type=to)
        with pytest.raises(ts.errors.UnsupportedDTypeError,
                           match=helper.tensor_dtype_to_string(to).split(".")[-1]):
            ts.onnx.import_model(model)(x)


# ---- control flow: If, Loop and Scan onto ts.cond, ts.while_loop and ts.scan --------------------
def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_a_loop_that_stops_on_a_computed_condition_runs_as_a_while_loop(rng):
    """Loop(M, cond, x): x = x * 1.5 + 1 while i < M and sum(x) < limit; the condition is
    computed from the carried value (data-dependent), against ONNX's reference evaluator."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["x_in", "k"], ["xm"]),
         helper.make_node("Add", ["xm", "one"], ["x_out"]),
         helper.make_node("ReduceSum", ["x_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 _f("x_in", [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _f("x_out", [3])],
        [numpy_helper.from_array(np.asarray(1.5, np.float32), "k"),
         numpy_helper.from_array(np.asarray(1.0, np.float32), "one")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "x"], ["y"], body=body)], "g",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []), _f("x", [3]),
         _f("limit", [])], [_f("y", [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    fn = ts.onnx.import_model(model)
    for _ in range(3):
        x = rng.standard_normal(3).astype(np.float32)
        limit = np.float32(rng.uniform(5, 200))
        feeds = {"M": np.asarray(int(rng.integers(2, 12)), np.int64), "cond": np.asarray(True),
                 "x": x, "limit": limit}
        want = ReferenceEvaluator(model).run(None, feeds)[0]
        np.testing.assert_allclose(fn(*feeds.values()), want, rtol=1e-6)


def test_a_scan_over_an_inner_axis_in_reverse_is_numpys(rng):
    """Scan: a running sum state and the running products as scan output, the input scanned
    along axis 1 backwards and the output stacked on axis 1 (ONNX's reference evaluator does
    not run reversed scans: a NumPy loop is the reference)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])],
        "body", [_f("s_in", [2]), _f("x_t", [2])], [_f("s_out", [2]), _f("y_t", [2])])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["s", "x"], ["s_last", "ys"], body=body, num_scan_inputs=1,
                          scan_input_axes=[1], scan_input_directions=[1],
                          scan_output_axes=[1])], "g",
        [_f("s", [2]), _f("x", [2, 5])], [_f("s_last", [2]), _f("ys", [2, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    s, x = rng.standard_normal(2).astype(np.float32), rng.standard_normal((2, 5)).astype(
        np.float32)
    state, ys = s, []               # (in float32, as the model: a float64 reference's sums
    for j in reversed(range(5)):    # can cancel to where float32's rounding is 2e-6 of them)
        state = state + x[:, j]
        ys.append(state * x[:, j])
    got = ts.onnx.import_model(model)(s, x)
    np.testing.assert_allclose(got[0], state, rtol=1e-6)
    np.testing.assert_allclose(got[1], np.stack(ys, axis=1), rtol=1e-6)


def test_an_if_on_a_computed_condition_runs_both_branches_as_ts_cond(rng):
    then = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["t"])], "then", [],
                             [_f("t", [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [_f("e", [4])])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
         helper.make_node("Greater", ["total", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
        [_f("x", [4])], [_f("y", [4])],
        [numpy_helper.from_array(np.asarray(0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    fn = ts.onnx.import_model(model)
    for sign in (1, -1):
        x = np.abs(rng.standard_normal(4)).astype(np.float32) * sign
        np.testing.assert_allclose(fn(x), ReferenceEvaluator(model).run(None, {"x": x})[0])
