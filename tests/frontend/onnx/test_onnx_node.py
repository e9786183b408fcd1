"""ONNX's own backend node tests (onnx.backend.test.case.node: each a one-operator model with
inputs and expected outputs) through ts.onnx.import_model, for every test whose operators the
importer's table has. A test runs and must pass unless it needs what tessera does not have, said
per test: a dtype outside tessera's table (int4, int2, the fp8 "fnuz" formats, ...), training
mode, or an einsum diagonal.

    python tests/frontend/onnx/test_onnx_node.py   # the per-operator counts (the README's table)
"""
import collections
import sys
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX import needs the onnx package")
from onnx import numpy_helper  # noqa: E402

import tessera as ts  # noqa: E402
from tessera import dtypes as dt  # noqa: E402
from tessera.errors import UnsupportedDTypeError  # noqa: E402

def _cases():
    from onnx.backend.test.case import node
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    out = []
    for c in cases:
        nodes = list(_nodes(c.model.graph))
        if {n.op_type for n in nodes} <= set(ts.onnx.IMPORT) and \
                all(n.domain in ("", "ai.onnx") for n in nodes):
            out.append(c)
    return out


def _nodes(graph):
    """The graph's nodes and its subgraphs' (If's branches, Loop's and Scan's bodies)."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(a.g)


CASES = _cases()


def _array(x):
    return numpy_helper.to_array(x) if hasattr(x, "dims") else np.asarray(x)


def why_not(case):
    """The reason this case cannot pass in tessera, or None."""
    for ins, outs in case.data_sets:
        for a in (*ins, *outs):
            a = _array(a)
            try:
                dt.from_numpy(a.dtype)
            except UnsupportedDTypeError:
                return f"uses {a.dtype.name}, which tessera's dtype table lacks"
    opset = max((o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx")),
                default=0)
    if opset > ts.onnx.NEWEST_CHECKED_OPSET:
        return (f"opset {opset}, newer than the importer was checked against "
                f"({ts.onnx.NEWEST_CHECKED_OPSET}: a newer onnx release's cases)")
    if "training" in case.name:
        return "training mode (random dropout masks, batch statistics): the importer reads " \
               "inference graphs and says so for these"
    if any(n.op_type == "Scan" for n in case.model.graph.node) and opset < 9:
        return "opset 8's Scan (a batch axis and sequence lengths): the importer reads Scan " \
               "from opset 9 on and says so"
    if case.name == "test_einsum_batch_diagonal":
        return "a letter repeated in one operand (a diagonal): op.einsum refuses it, saying so"
    return None


TRANSFORMS = ("DFT", "STFT")


def run_case(case):
    for ins, outs in case.data_sets:
        ins = [_array(a) for a in ins]
        outs = [_array(o) for o in outs]
        got = ts.onnx.import_model(case.model)(*ins)
        got = [got] if len(outs) == 1 else list(got)
        assert len(got) == len(outs)
        for g, o in zip(got, outs):
            g = np.asarray(g)
            assert g.shape == o.shape and g.dtype == o.dtype, (g.dtype, g.shape, o.dtype, o.shape)
            if o.dtype.kind in "fc" or o.dtype.name in ("bfloat16",) or "float8" in o.dtype.name:
                # 16-bit results: within two ulps of the dtype (the reference rounds after other
                # steps than tessera, which computes each operator in float32, rounded once;
                # an expanded function takes many steps)
                ulp = {2: 2.0 ** -6 if o.dtype.name == "bfloat16" else 2.0 ** -9}.get(
                    o.dtype.itemsize, 0.0)
                atol = case.atol
                if any(n.op_type in TRANSFORMS for n in case.model.graph.node):
                    # a transform's round-off is relative to its largest coefficient: where the
                    # exact value is 0, the cases' own outputs hold float32 noise of one FFT
                    # (1.9e-7 of coefficients near 5e3) or float64's of another
                    atol = max(atol, 4 * np.finfo(o.dtype).eps * float(np.abs(o).max()))
                np.testing.assert_allclose(g.astype(np.float64), o.astype(np.float64),
                                           rtol=max(case.rtol, ulp), atol=atol,
                                           equal_nan=True)
            else:
                np.testing.assert_array_equal(g, o)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_onnx_node_case(case):
    reason = why_not(case)
    if reason is not None:
        pytest.skip(reason)
    with np.errstate(all="ignore"):
        run_case(case)


def test_the_importer_covers_these_operators():
    """Every operator in the import table is exercised by some node test (or is Constant,
    which every other test uses)."""
    seen = {n.op_type for c in CASES for n in c.model.graph.node}
    assert set(ts.onnx.IMPORT) - seen <= {"Constant"}


if __name__ == "__main__":
    counts = collections.defaultdict(lambda: [0, 0, 0])
    for case in CASES:
        key = case.model.graph.node[-1].op_type
        counts[key][1] += 1
        if why_not(case) is not None:
            counts[key][2] += 1
            continue
        try:
            with np.errstate(all="ignore"):
                run_case(case)
            counts[key][0] += 1
        except Exception as e:                  # (a report: every failure counted)
            print(case.name, type(e).__name__, str(e).splitlines()[0][:120], file=sys.stderr)
    total = [sum(v[i] for v in counts.values()) for i in range(3)]
    print(f"{total[0]} of {total[1]} node tests pass ({total[2]} need what tessera lacks)")
    print(", ".join(f"{k} {p}/{n}" + (f" ({s} n/a)" if s else "")
                    for k, (p, n, s) in sorted(counts.items())))
