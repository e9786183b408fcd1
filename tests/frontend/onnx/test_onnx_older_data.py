"""The older test data the onnx wheel ships (onnx/backend/test/data: `simple`,
`pytorch-converted`, `pytorch-operator`; models of opsets 6 to 12 with inputs and expected
outputs, written by other tools) through ts.onnx.import_model, each read by its own opset's
rules (a Clip of opset 6 clamps by its attributes, a Squeeze of opset 11 drops only its axes).
A model runs and must pass unless it needs what tessera does not import, said per model."""
import glob
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX import needs the onnx package")
from onnx import numpy_helper  # noqa: E402

import tessera as ts  # noqa: E402

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
KINDS = ("simple", "pytorch-converted", "pytorch-operator")
CASES = sorted(c for k in KINDS for c in glob.glob(os.path.join(DATA, k, "*"))
               if os.path.exists(os.path.join(c, "model.onnx")))
NOT_IMPORTED = {   # operators outside the importer's scope, each with its reason
    "Gradient": "the training operator set's symbolic gradient (ts.grad is tessera's)",
    "SequenceConstruct": "sequence values", "SequenceInsert": "sequence values",
    "SequenceAt": "sequence values", "SequenceEmpty": "sequence values",
    "SequenceErase": "sequence values", "SequenceLength": "sequence values",
    "SplitToSequence": "sequence values", "ConcatFromSequence": "sequence values",
    "StringNormalizer": "string tensors",
}


def _tensors(folder, kind):
    paths = glob.glob(os.path.join(folder, f"{kind}_*.pb"))
    paths.sort(key=lambda p: int(p.rsplit("_", 1)[1][:-3]))
    return [numpy_helper.to_array(onnx.load_tensor(p)) for p in paths]


def test_the_wheel_ships_the_older_data():
    assert len(CASES) >= 130, len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[f"{os.path.basename(os.path.dirname(c))}/"
                                             f"{os.path.basename(c)}" for c in CASES])
def test_older_onnx_data(case):
    model = onnx.load(os.path.join(case, "model.onnx"))
    outside = sorted({n.op_type for n in model.graph.node} & set(NOT_IMPORTED))
    if outside:
        pytest.skip(f"{outside[0]}: {NOT_IMPORTED[outside[0]]}")
    fn = ts.onnx.import_model(model)
    sets = sorted(glob.glob(os.path.join(case, "test_data_set_*")))
    assert sets
    for folder in sets:
        ins, outs = _tensors(folder, "input"), _tensors(folder, "output")
        with np.errstate(all="ignore"):
            got = fn(*ins)
        got = [got] if len(outs) == 1 else list(got)
        assert len(got) == len(outs)
        for g, o in zip(got, outs):
            g = np.asarray(g)
            assert g.shape == o.shape and g.dtype == o.dtype, (g.shape, g.dtype, o.shape, o.dtype)
            if o.dtype.kind in "fc":
                np.testing.assert_allclose(g, o, rtol=1e-3, atol=1e-5)
            else:
                np.testing.assert_array_equal(g, o)
