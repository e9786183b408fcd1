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


def _many(x, w, ids, table):
    h = op.gelu(x @ w) + op.take(table, ids, axis=0)
    h = op.layernorm(h, axis=-1) * 2.0
    s = op.softmax(op.transpose(h), axis=0)
    z = op.concat([s[:, 1:3], op.reshape(op.mean(h, axis=0), [-1, 1]), s[::-1, :1]], axis=1)
    return (z, op.sum(op.rsqrt(h * h + 1), axis=1, keepdim=True), op.argmax(h, axis=1),
            op.var(h, axis=0), op.rmsnorm(op.tanh(h), axis=-1), op.logsumexp(h, axis=1),
            op.cast(op.where(h > 0, h, -h) <= 1.0, "float32"), op.cumsum(op.silu(h), axis=1))


def test_export_runs_in_the_reference_evaluator(tmp_path, rng):
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w = rng.standard_normal((4, 6)).astype(np.float32)
    ids = rng.integers(0, 7, 5)
    table = rng.standard_normal((7, 6)).astype(np.float32)
    fn = ts.function(_many)
    model = fn.export(tmp_path / "m.onnx", x, w, ids, table)       # onnx.checker passed
    assert (tmp_path / "m.onnx").exists() and model.opset_import[0].version == 17
    ref = ReferenceEvaluator(model).run(None, {"x": x, "w": w, "ids": ids, "table": table})
    got = fn(x, w, ids, table)
    assert len(ref) == len(got)
    for r, g in zip(ref, got):
        assert r.dtype == g.dtype and r.shape == g.shape
        np.testing.assert_allclose(r, g, rtol=1e-5, atol=1e-5)
    again = ts.onnx.import_model(tmp_path / "m.onnx")(x, w, ids, table)   # and back
    for a, g in zip(again, got):
        np.testing.assert_allclose(a, g, rtol=1e-6, atol=1e-6)


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
    lrn = _model([helper.make_node("LRN", ["x"], ["y"], size=3),
                  helper.make_node("MaxUnpool", ["y", "i"], ["z"], kernel_shape=[2, 2])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4]),
                  helper.make_tensor_value_info("i", TensorProto.INT64, [1, 1, 4, 4])],
                 [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 1, 8, 8])])
    with pytest.raises(ts.TesseraError, match="2 operator.*LRN, MaxUnpool"):
        ts.onnx.import_model(lrn)


def test_without_onnx_says_how_to_install(monkeypatch, rng):
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ts.TesseraError, match="pip install onnx"):
        ts.function(lambda x: x * 2).export(None, rng.standard_normal(3))
