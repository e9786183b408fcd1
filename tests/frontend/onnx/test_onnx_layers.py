"""ONNX's layer operators as PyTorch exports them, against PyTorch: the recurrent layers (RNN,
GRU, LSTM, imported onto ts.scan; also one-node models with what PyTorch's export never writes,
sequence lengths, initial states, peepholes, clipping, linear_before_reset, batch-first layout,
against onnxruntime), grid sampling (GridSample, AffineGrid), Col2Im, MaxUnpool, STFT,
RoiAlign (against onnxruntime), DeformConv and Det. (ONNX's own node tests of them:
tests/frontend/onnx/test_onnx_node.py.)"""
import io
import warnings

import numpy as np
import pytest

import tessera as ts

onnx = pytest.importorskip("onnx", reason="ONNX import needs the onnx package")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402

try:
    import onnxruntime as ort
except ImportError:                     # (the test extra installs it; a bare checkout may not)
    ort = None


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_pytorchs_layers_exported_by_torch_onnx(kind, rng):
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    torch.manual_seed(int(rng.integers(1 << 30)))
    layer = getattr(torch.nn, kind)(input_size=5, hidden_size=7, num_layers=2,
                                    bidirectional=True, batch_first=True).eval()
    x = torch.from_numpy(rng.standard_normal((3, 6, 5)).astype(np.float32))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(layer, (x,), buf, opset_version=17, dynamo=False)
    model = onnx.load_from_string(buf.getvalue())
    assert kind in {n.op_type for n in model.graph.node}
    got = ts.onnx.import_model(model)(x.numpy())
    with torch.no_grad():
        want = layer(x)
    for g, w in zip(got, [want[0], *(want[1] if kind == "LSTM" else [want[1]])]):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(ort is None, reason="onnxruntime is not installed (the test extra has it)")
@pytest.mark.parametrize("kind, attrs", [
    ("LSTM", {"direction": "bidirectional"}),
    ("LSTM", {"direction": "reverse", "clip": 0.7, "input_forget": 0}),
    ("LSTM", {"layout": 1, "activations": ["HardSigmoid", "Tanh", "Tanh"],
              "activation_alpha": [0.3], "activation_beta": [0.4]}),
    ("GRU", {"direction": "bidirectional", "linear_before_reset": 1}),
    ("GRU", {"direction": "reverse"}),
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Tanh"]}),
])
def test_one_node_models_match_onnxruntime(kind, attrs, rng):
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    seq, batch, size, hidden = 5, 4, 3, 6
    layout = attrs.get("layout", 0)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)         # noqa: E731
    x = f32(batch, seq, size) if layout else f32(seq, batch, size)
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    arrays = {"X": x, "W": f32(dirs, gates * hidden, size) * 0.5,
              "R": f32(dirs, gates * hidden, hidden) * 0.5, "B": f32(dirs, 2 * gates * hidden),
              "sequence_lens": rng.integers(1, seq + 1, batch).astype(np.int32),
              "initial_h": f32(*state)}
    if kind == "LSTM":
        arrays.update(initial_c=f32(*state), P=f32(dirs, 3 * hidden))
    outs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])

    def model(arrays, attrs):
        node = h.make_node(kind, list(arrays), outs, hidden_size=hidden, **attrs)
        graph = h.make_graph([node], kind, [
            h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in arrays.items()], [h.make_tensor_value_info(o, T.FLOAT, None)
                                          for o in outs])
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 14)])
    got = ts.onnx.import_model(model(arrays, attrs))(*arrays.values())
    if layout:      # (onnxruntime runs only layout 0: the same model on transposed arrays)
        swap = {"X": (1, 0, 2), "initial_h": (1, 0, 2), "initial_c": (1, 0, 2)}
        arrays = {n: a.transpose(swap[n]) if n in swap else a for n, a in arrays.items()}
        attrs = {k: v for k, v in attrs.items() if k != "layout"}
    want = ort.InferenceSession(model(arrays, attrs).SerializeToString(), providers=[
        "CPUExecutionProvider"]).run(None, arrays)
    if layout:
        want = [want[0].transpose(2, 0, 1, 3)] + [w.transpose(1, 0, 2) for w in want[1:]]
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)


def _exported(torch, fn, *args, opset=20):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(fn, args, buf, opset_version=opset, dynamo=False)
    return onnx.load_from_string(buf.getvalue())


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_matches_pytorch(mode, padding, align, rng):
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    F = torch.nn.functional

    class Warp(torch.nn.Module):
        def forward(self, x, theta):
            grid = F.affine_grid(theta, [2, 3, 7, 9], align_corners=align)
            return F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align)
    x = torch.from_numpy(rng.standard_normal((2, 3, 6, 5)).astype(np.float32))
    # rotations, scales and shifts that reach past the borders
    theta = torch.from_numpy((np.eye(2, 3) * 1.3 + rng.uniform(-0.6, 0.6, (2, 2, 3)))
                             .astype(np.float32))
    model = _exported(torch, Warp(), x, theta)
    assert {"GridSample", "AffineGrid"} <= {n.op_type for n in model.graph.node}
    got = ts.onnx.import_model(model)(x.numpy(), theta.numpy())
    with torch.no_grad():
        want = Warp()(x, theta).numpy()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_volumetric_grid_sample_matches_pytorch(mode, rng):
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    x = torch.from_numpy(rng.standard_normal((2, 2, 4, 5, 3)).astype(np.float32))
    grid = torch.from_numpy(rng.uniform(-1.2, 1.2, (2, 3, 4, 2, 3)).astype(np.float32))

    class Sample(torch.nn.Module):
        def forward(self, x, g):
            return torch.nn.functional.grid_sample(x, g, mode=mode, align_corners=False)
    model = _exported(torch, Sample(), x, grid)
    got = ts.onnx.import_model(model)(x.numpy(), grid.numpy())
    want = Sample()(x, grid).numpy()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def _one_node_model(kind, arrays, outs, opset, consts=None, **attrs):
    """A one-node model of graph inputs `arrays` and initializers `consts` (names in order)."""
    from onnx import numpy_helper as nh
    consts = consts or {}
    node = h.make_node(kind, list(arrays) + list(consts), list(outs), **attrs)
    graph = h.make_graph([node], kind, [
        h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in arrays.items()], [h.make_tensor_value_info(o, t, None)
                                      for o, t in outs.items()],
        [nh.from_array(np.asarray(a), n) for n, a in consts.items()])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


@pytest.mark.parametrize("attrs", [{}, {"strides": [2, 1], "dilations": [1, 2],
                                        "pads": [1, 0, 2, 1]}])
def test_col2im_is_pytorchs_fold(attrs, rng):
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    image, block = [9, 8], [3, 2]
    s, d = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    p = attrs.get("pads", [0, 0, 0, 0])
    grid = [(image[i] + p[i] + p[2 + i] - d[i] * (block[i] - 1) - 1) // s[i] + 1
            for i in range(2)]
    x = rng.standard_normal((2, 3 * 6, grid[0] * grid[1])).astype(np.float32)
    model = _one_node_model("Col2Im", {"x": x}, {"y": T.FLOAT}, 18,
                            {"image": np.array(image), "block": np.array(block)}, **attrs)
    got = ts.onnx.import_model(model)(x)
    # (PyTorch's fold pads symmetrically: pad, fold, then crop the asymmetric excess)
    big = torch.nn.functional.fold(torch.from_numpy(x), [image[0] + p[0] + p[2],
                                                         image[1] + p[1] + p[3]],
                                   block, dilation=d, stride=s)
    want = big[:, :, p[0]:p[0] + image[0], p[1]:p[1] + image[1]].numpy()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_max_unpool_of_overlapping_windows_is_pytorchs(rng):
    """MaxPool's indices (overlapping 3x3 windows, stride 1: a maximum is often picked by
    several windows) unpooled: PyTorch's max_unpool2d, exactly."""
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    pool = h.make_node("MaxPool", ["x"], ["v", "i"], kernel_shape=[3, 3], strides=[1, 1])
    unpool = h.make_node("MaxUnpool", ["v", "i"], ["y"], kernel_shape=[3, 3], strides=[1, 1])
    graph = h.make_graph([pool, unpool], "unpool", [
        h.make_tensor_value_info("x", T.FLOAT, x.shape)],
        [h.make_tensor_value_info("y", T.FLOAT, None)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 22)])
    got = ts.onnx.import_model(model)(x)
    v, i = torch.nn.functional.max_pool2d(torch.from_numpy(x), 3, 1, return_indices=True)
    want = torch.nn.functional.max_unpool2d(v, i, 3, 1, output_size=x.shape[2:]).numpy()
    assert np.asarray(got).tobytes() == want.tobytes()


@pytest.mark.parametrize("onesided", [1, 0])
def test_stft_is_pytorchs(onesided, rng):
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    signal = rng.standard_normal((2, 100)).astype(np.float32)
    window = np.hanning(16).astype(np.float32)
    model = _one_node_model("STFT", {"x": signal[..., None], "window": window},
                            {"y": T.FLOAT}, 17, {"step": np.array(6, np.int64)},
                            onesided=onesided)
    # (inputs in the operator's order: signal, frame_step, window)
    model.graph.node[0].input[:] = ["x", "step", "window"]
    got = np.asarray(ts.onnx.import_model(model)(signal[..., None], window))
    want = torch.stft(torch.from_numpy(signal), 16, 6, window=torch.from_numpy(window),
                      center=False, onesided=bool(onesided), return_complex=True).numpy()
    want = np.stack([want.real, want.imag], axis=-1).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(ort is None, reason="onnxruntime is not installed (the test extra has it)")
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("coordinates", ["half_pixel", "output_half_pixel"])
def test_roi_align_matches_onnxruntime(mode, coordinates, rng):
    x = rng.standard_normal((2, 3, 12, 10)).astype(np.float32)
    corner = rng.uniform(-2, 8, (7, 2))
    rois = np.concatenate([corner, corner + rng.uniform(0.5, 7, (7, 2))], axis=1)
    rois = rois.astype(np.float32)[:, [0, 1, 2, 3]]
    batch = rng.integers(0, 2, 7).astype(np.int64)
    model = _one_node_model("RoiAlign", {"x": x, "rois": rois, "batch": batch}, {"y": T.FLOAT},
                            16, mode=mode, coordinate_transformation_mode=coordinates,
                            output_height=3, output_width=4, sampling_ratio=2,
                            spatial_scale=0.8)
    got = ts.onnx.import_model(model)(x, rois, batch)
    want = ort.InferenceSession(model.SerializeToString(), providers=[
        "CPUExecutionProvider"]).run(None, {"x": x, "rois": rois, "batch": batch})[0]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_det_is_numpys(rng):
    x = rng.standard_normal((3, 4, 6, 6)).astype(np.float32)
    x[0, 1, 2] = 2 * x[0, 1, 4]                                  # a singular one: exactly 0
    model = _one_node_model("Det", {"x": x}, {"y": T.FLOAT}, 22)
    got = np.asarray(ts.onnx.import_model(model)(x))
    want = np.linalg.det(x.astype(np.float64))
    assert got.shape == (3, 4) and got[0, 1] == 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_deform_conv_with_zero_offsets_is_a_convolution_and_moves_with_them(rng):
    """Zero offsets and a mask of ones: ONNX's Conv (against PyTorch); whole-pixel offsets
    read the neighbour they point at."""
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 1], dilations=[1, 2], pads=[1, 2, 0, 1],
                 group=2, offset_group=2)
    out = [(9 + 1 + 0 - 3) // 2 + 1, (8 + 2 + 1 - 5) // 1 + 1]          # [4, 7]
    zero = np.zeros((2, 2 * 2 * 9, *out), np.float32)
    ones = np.ones((2, 2 * 9, *out), np.float32)
    model = _one_node_model("DeformConv", {"x": x, "w": w, "offset": zero, "b": b, "mask": ones},
                            {"y": T.FLOAT}, 22, **attrs)
    f = ts.onnx.import_model(model)
    padded = torch.nn.functional.pad(torch.from_numpy(x), (2, 1, 1, 0))
    want = torch.nn.functional.conv2d(padded, torch.from_numpy(w), torch.from_numpy(b),
                                      stride=(2, 1), dilation=(1, 2), groups=2).numpy()
    np.testing.assert_allclose(np.asarray(f(x, w, zero, b, ones)), want, rtol=1e-4, atol=1e-4)
    # every tap moved one row down (dy = 1): the rows read are one further on, so the row of
    # padding above is not read
    down = zero.copy()
    down[:, 0::2] = 1.0
    padded = torch.nn.functional.pad(torch.from_numpy(x), (2, 1, 0, 0))
    want = torch.nn.functional.conv2d(padded, torch.from_numpy(w), torch.from_numpy(b),
                                      stride=(2, 1), dilation=(1, 2), groups=2).numpy()
    np.testing.assert_allclose(np.asarray(f(x, w, down, b, ones)), want, rtol=1e-4, atol=1e-4)
