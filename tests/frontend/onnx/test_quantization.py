"""Linear quantization: op.quantize_linear / dequantize_linear / dynamic_quantize_linear /
matmul_integer / conv_integer / qlinear_matmul / qlinear_conv, and ONNX models using them,
against ONNX's reference evaluator, onnxruntime (where installed) and PyTorch, on fresh random
data; and a float MLP quantized by onnxruntime's own quantization tool, imported and run."""
import numpy as np
import pytest

import tessera as ts
from tessera import op

onnx = pytest.importorskip("onnx", reason="the ONNX models need the onnx package")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

try:
    import onnxruntime as ort
except ImportError:                     # (the test extra installs it; a bare checkout may not)
    ort = None

ORT_REASON = "onnxruntime is not installed (pip install onnxruntime, in the test extra)"


def one_node(kind, inputs, consts, outputs, opset=21, **attrs):
    """A one-node model: `inputs` {name: array} graph inputs, `consts` {name: array or None
    (an omitted optional input)} initializers, `outputs` {name: dtype}."""
    names = [n if (n in inputs or consts.get(n) is not None) else "" for n in
             list(inputs) + list(consts)]
    while names and not names[-1]:
        names.pop()
    node = h.make_node(kind, names, list(outputs), **attrs)
    ins = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in inputs.items()]
    outs = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(np.dtype(d)), None)
            for n, d in outputs.items()]
    inits = [nh.from_array(np.asarray(a), n) for n, a in consts.items() if a is not None]
    return h.make_model(h.make_graph([node], kind, ins, outs, inits),
                        opset_imports=[h.make_opsetid("", opset)])


def check(model, inputs, runtime=True):
    """tessera's import of the model equals ONNX's reference evaluator and onnxruntime."""
    got = ts.onnx.import_model(model)(*inputs.values())
    got = list(got) if isinstance(got, tuple) else [got]
    for want in [ReferenceEvaluator(model).run(None, inputs)] + (
            [ort.InferenceSession(model.SerializeToString(), providers=[
                "CPUExecutionProvider"]).run(None, inputs)] if runtime and ort else []):
        for g, w in zip(got, want):
            g = np.asarray(g)
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    return got


def scales(rng, n, dtype=np.float32):
    return rng.uniform(0.005, 0.05, n).astype(dtype)


@pytest.mark.parametrize("qtype", [np.uint8, np.int8, np.uint16, np.int16])
@pytest.mark.parametrize("mode", ["tensor", "axis", "block"])
def test_quantize_and_dequantize_linear_match_the_reference(qtype, mode, rng):
    x = (rng.standard_normal((4, 6, 5)) * 3).astype(np.float32)
    # saturation at both ends (within int32 once divided: ONNX's reference converts through it)
    x[0, 0, :3] = [0.0, 1e6, -1e6]
    info = np.iinfo(qtype)
    if mode == "tensor":
        shape, attrs = (), {}
    elif mode == "axis":
        shape, attrs = (6,), {"axis": 1}
    else:
        shape, attrs = (4, 3, 5), {"axis": 1, "block_size": 2}
    s = scales(rng, shape)
    zp = rng.integers(info.min // 4, info.max // 4, shape).astype(qtype)
    q = check(one_node("QuantizeLinear", {"x": x}, {"s": s, "zp": zp}, {"q": qtype}, **attrs),
              {"x": x}, runtime=qtype in (np.uint8, np.int8))[0]
    assert q.dtype == qtype and q.min() == info.min and q.max() == info.max
    check(one_node("DequantizeLinear", {"q": q}, {"s": s, "zp": zp}, {"y": np.float32},
                   **attrs),
          {"q": q}, runtime=qtype in (np.uint8, np.int8))
    # the round trip is within half a step of the value where it did not saturate, and
    # float32's rounding of the quotient x / s and the product (q - zp) s (a quotient near
    # k + 1/2 may round to it and then to even: seed 3320472123's int16 blocks)
    y = op.dequantize_linear(q, s, zp, **attrs)
    step = op.dequantize_linear(np.ones_like(q), s, np.zeros_like(zp), **attrs)
    inside = (q > info.min) & (q < info.max)
    assert (np.abs(y - x)[inside] <= (step / 2 + np.abs(x) * 2.0**-22)[inside]).all()


def test_quantize_to_fp8_and_without_a_zero_point(rng):
    import ml_dtypes
    x = (rng.standard_normal((3, 8)) * 100).astype(np.float32)
    s = np.float32(0.25)
    zp = np.zeros((), ml_dtypes.float8_e4m3fn)
    check(one_node("QuantizeLinear", {"x": x}, {"s": s, "zp": zp}, {"q": zp.dtype}, opset=19),
          {"x": x}, runtime=False)
    check(one_node("QuantizeLinear", {"x": x}, {"s": s, "zp": None}, {"q": np.uint8},
                   opset=13),
          {"x": x})                                                     # uint8 by default


def test_dynamic_quantize_linear_matches_onnxruntime(rng):
    for x in [rng.standard_normal((5, 7)).astype(np.float32) * 4,
              rng.uniform(0.5, 2, (9,)).astype(np.float32),            # no negative value
              -rng.uniform(0.5, 2, (3, 3)).astype(np.float32),
              np.zeros((2, 2), np.float32)]:
        # all zeros: the scale is 1/255 by ONNX's reference (tessera's), 1 by onnxruntime's
        check(one_node("DynamicQuantizeLinear", {"x": x}, {},
                       {"q": np.uint8, "s": np.float32, "zp": np.uint8}, opset=11),
              {"x": x}, runtime=bool(x.any()))


@pytest.mark.parametrize("atype, btype", [(np.uint8, np.int8), (np.int8, np.int8),
                                          (np.uint8, np.uint8)])
def test_matmul_integer_is_exact(atype, btype, rng):
    a = rng.integers(np.iinfo(atype).min, np.iinfo(atype).max, (2, 19, 40), endpoint=True)
    b = rng.integers(np.iinfo(btype).min, np.iinfo(btype).max, (40, 33), endpoint=True)
    a, b = a.astype(atype), b.astype(btype)
    azp = np.asarray(rng.integers(0, 9), atype)
    bzp = rng.integers(0, 9, 33).astype(btype)                       # per column
    want = (a.astype(np.int64) - azp) @ (b.astype(np.int64) - bzp)
    got = ts.function(lambda a, b: op.matmul_integer(a, b, azp, bzp))(a, b)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want.astype(np.int32))
    check(one_node("MatMulInteger", {"a": a, "b": b}, {"azp": azp, "bzp": bzp},
                   {"y": np.int32}, opset=10), {"a": a, "b": b})


@pytest.mark.parametrize("opset", [17, 21])
def test_matmul_integer_exports_as_matmul_integer(opset, rng):
    """The 8-bit product and its zero-point corrections exported, then run by ONNX's reference
    evaluator and onnxruntime: the product of the widened operands."""
    a = rng.integers(0, 256, (5, 40)).astype(np.uint8)
    b = rng.integers(-128, 128, (40, 7)).astype(np.int8)
    zb = rng.integers(-128, 128, (7,)).astype(np.int8)
    model = ts.onnx.export(lambda a, b, zb: op.matmul_integer(a, b, None, zb), None, a, b, zb,
                           opset_version=opset)
    onnx.checker.check_model(model, full_check=True)
    assert "MatMulInteger" in {n.op_type for n in model.graph.node}
    feeds = dict(zip([i.name for i in model.graph.input], [a, b, zb]))
    want = a.astype(np.int32) @ (b.astype(np.int32) - zb)
    for run in [ReferenceEvaluator(model).run] + ([ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]).run] if ort else []):
        np.testing.assert_array_equal(run(None, feeds)[0], want)


def test_pytorchs_int_mm_imports(rng):
    torch = pytest.importorskip("torch", reason="from_torch needs PyTorch")
    x = torch.from_numpy(rng.integers(-128, 128, (32, 72)).astype(np.int8))
    y = torch.from_numpy(rng.integers(-128, 128, (72, 40)).astype(np.int8))
    f, params = ts.from_torch(lambda x, y: torch._int_mm(x, y), x, y)
    got = f(params, x.numpy(), y.numpy())
    np.testing.assert_array_equal(got, torch._int_mm(x, y).numpy())


def test_conv_integer_and_qlinear_conv_match_pytorch_and_onnxruntime(rng):
    torch = pytest.importorskip("torch", reason="the convolution reference is PyTorch's")
    x = rng.integers(0, 256, (2, 4, 9, 8)).astype(np.uint8)
    w = rng.integers(-128, 128, (6, 2, 3, 3)).astype(np.int8)
    xzp, wzp = np.uint8(7), rng.integers(-3, 4, 6).astype(np.int8)
    want = torch.nn.functional.conv2d(
        torch.tensor(x.astype(np.float64) - 7), torch.tensor(
            w.astype(np.float64) - wzp.reshape(6, 1, 1, 1)), stride=2, padding=1, groups=2)
    got = ts.function(lambda x, w: op.conv_integer(x, w, xzp, wzp, stride=2, padding=1,
                                                   groups=2))(x, w)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want.numpy().astype(np.int32))
    check(one_node("ConvInteger", {"x": x}, {"w": w, "xzp": xzp}, {"y": np.int32},
                   opset=10, strides=[2, 2], pads=[1, 1, 1, 1], group=2), {"x": x})
    bias = rng.integers(-500, 500, 6).astype(np.int32)
    model = one_node("QLinearConv", {"x": x}, {
        "xs": np.float32(0.02), "xzp": xzp, "w": w, "ws": scales(rng, 6), "wzp": np.zeros(6, np.int8),
        "ys": np.float32(0.9), "yzp": np.uint8(128), "b": bias}, {"y": np.uint8}, opset=10,
        strides=[2, 2], pads=[1, 1, 1, 1], group=2)
    got = ts.onnx.import_model(model)(x)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    if ort is not None:     # onnxruntime requantizes in float32: a step apart at a rounding tie
        rt = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        assert np.abs(got.astype(int) - rt).max() <= 1 and (got != rt).mean() < 0.01


def test_qlinear_matmul_matches_the_reference(rng):
    a = rng.integers(0, 256, (3, 30)).astype(np.uint8)
    b = rng.integers(-128, 128, (30, 12)).astype(np.int8)
    model = one_node("QLinearMatMul", {"a": a}, {
        "as": np.float32(0.03), "azp": np.uint8(120), "b": b, "bs": np.float32(0.01),
        "bzp": np.int8(3), "ys": np.float32(0.3), "yzp": np.uint8(100)}, {"y": np.uint8},
        opset=10)
    got = check(model, {"a": a}, runtime=False)[0]
    if ort is not None:
        rt = ort.InferenceSession(model.SerializeToString()).run(None, {"a": a})[0]
        assert np.abs(got.astype(int) - rt).max() <= 1 and (got != rt).mean() < 0.02


def _mlp(rng, path):
    D, H, O = 48, 96, 10
    w1 = (rng.standard_normal((D, H)) / 7).astype(np.float32)
    w2 = (rng.standard_normal((H, O)) / 10).astype(np.float32)
    b1, b2 = (rng.standard_normal(n).astype(np.float32) * 0.1 for n in (H, O))
    g = h.make_graph(
        [h.make_node("MatMul", ["x", "w1"], ["h0"]), h.make_node("Add", ["h0", "b1"], ["h1"]),
         h.make_node("Relu", ["h1"], ["h2"]), h.make_node("MatMul", ["h2", "w2"], ["y0"]),
         h.make_node("Add", ["y0", "b2"], ["y"])], "mlp",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", D])],
        [h.make_tensor_value_info("y", T.FLOAT, ["N", O])],
        [nh.from_array(a, n) for a, n in [(w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2")]])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return D


@pytest.mark.skipif(ort is None, reason=ORT_REASON)
@pytest.mark.parametrize("how", ["dynamic", "static QDQ"])
def test_an_mlp_quantized_by_onnxruntime_imports_and_matches_it(how, rng, tmp_path):
    """onnxruntime.quantization on a float MLP: dynamic (DynamicQuantizeLinear, MatMulInteger)
    and static in the QDQ format (QuantizeLinear/DequantizeLinear around the products):
    tessera's import gives the bits of onnxruntime running the graph as written. onnxruntime's
    default optimizations fuse the QDQ products into integer kernels that requantize in float32,
    a step away from the graph's own value at a rounding tie (3 of 200 random models)."""
    import logging
    from onnxruntime import quantization as oq
    logging.getLogger().setLevel(logging.ERROR)     # (its advice to pre-process the model)
    src, dst = str(tmp_path / "mlp.onnx"), str(tmp_path / "mlp_int8.onnx")
    D = _mlp(rng, src)
    if how == "dynamic":
        oq.quantize_dynamic(src, dst, weight_type=oq.QuantType.QInt8)
    else:
        # (4 batches of 16 rows left 1 in 40 test batches 10% off the float model: saturated)
        batches = iter([{"x": rng.standard_normal((64, D)).astype(np.float32)}
                        for _ in range(8)])

        class Reader(oq.CalibrationDataReader):
            def get_next(self):
                return next(batches, None)
        oq.quantize_static(src, dst, Reader(), quant_format=oq.QuantFormat.QDQ,
                           activation_type=oq.QuantType.QUInt8, weight_type=oq.QuantType.QInt8)
    kinds = {n.op_type for n in onnx.load(dst).graph.node}
    assert ("MatMulInteger" if how == "dynamic" else "QuantizeLinear") in kinds
    x = rng.standard_normal((32, D)).astype(np.float32)
    as_written = ort.SessionOptions()
    as_written.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(dst, as_written, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    got = ts.onnx.import_model(dst)(x)
    np.testing.assert_array_equal(got, want)
    fused = ort.InferenceSession(dst, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    if how == "dynamic":
        np.testing.assert_array_equal(got, fused)
    else:   # at most one output step apart, at a few ties
        graph = onnx.load(dst).graph
        last = next(n for n in graph.node if n.output[0] == "y")
        assert last.op_type == "DequantizeLinear"
        step = next(nh.to_array(t) for t in graph.initializer if t.name == last.input[1])
        assert np.abs(got - fused).max() <= 1.01 * step and (got != fused).mean() < 0.02
    exact = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # int8's error, not a wrong model (a test row past the calibration's range saturates)
    assert np.linalg.norm(got - exact) < 0.1 * np.linalg.norm(exact)


def test_bad_quantization_arguments_say_what(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    with pytest.raises(ts.ArgumentError, match="one per index of axis 1"):
        op.quantize_linear(x, np.ones(4, np.float32), axis=1)
    with pytest.raises(ts.ArgumentError, match="blocks of 4 along axis 1"):
        op.quantize_linear(x, np.ones((4, 3), np.float32), axis=1, block_size=4)
    with pytest.raises(ts.ArgumentError, match="integer or fp8"):
        op.quantize_linear(x, np.float32(0.1), dtype="float32")
    with pytest.raises(ts.ArgumentError, match="zero_point is int8 but the result is uint8"):
        op.quantize_linear(x, np.float32(0.1), np.int8(0), dtype="uint8")
