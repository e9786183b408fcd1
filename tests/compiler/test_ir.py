"""The four IR levels: text forms, verifiers, and each canonicalisation rewrite."""
import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, op
from tessera.compiler.graph_ir import Graph
from tessera.compiler.tile_ir import Const, Decl, Loop, Param, Store, TileKernel, Var
from tessera.runtime import isa
from tessera.types import TensorType

from conftest import assert_within_dot_bound


@ts.function
def layer_norm(x: Tensor["B", "S", "D"]) -> Tensor["B", "S", "D"]:
    mean = x.mean(axis=-1, keepdim=True)
    var = x.var(axis=-1, keepdim=True)
    return (x - mean) / op.sqrt(var + 1e-5)


def ops_of(graph):
    return [n.op for n in graph.nodes]


def test_symbolic_graph_text_has_types_and_source_lines():
    text = str(layer_norm.graph_ir)
    lines = text.splitlines()
    assert lines[0] == "graph @layer_norm(%x: f32[B,S,D]) -> f32[B,S,D] {"
    assert lines[-2:] == ["  return %6", "}"]
    line = layer_norm.fn.__code__.co_firstlineno
    assert f"%0 = mean(%x) {{axis=[2], keepdim=true}}" in text
    assert f": f32[B,S,1]  # test_ir.py:{line + 2}" in text
    assert "const() {value=1e-05}" in text and "sqrt(%4)" in text
    layer_norm.graph_ir.verify()


def test_symbolic_dims_flow_through_reshape_and_concat():
    @ts.function
    def f(x: Tensor["B", "S", "D"]):
        y = x.reshape(-1, x.shape[-1])
        return op.concat([y, y], axis=0)

    g = f.graph_ir
    assert str(g.outputs[0].type) == "f32[2*B*S,D]"
    assert "reshape(%x) {shape=[B*S,D]}" in str(g)


def test_lowered_program_has_every_level(rng):
    x = rng.standard_normal((4, 16, 32)).astype(np.float32)
    prog = layer_norm.lower(x)
    assert "graph @layer_norm [B=4, S=16, D=32](%x: f32[4,16,32])" in str(prog.graph_ir)
    sched = prog.schedule_ir
    assert str(sched).startswith(
        f"schedule @layer_norm [B=4, S=16, D=32] target=cpu:{isa.default_level()} {{")
    assert [k.strategy for k in sched.kernels] == ["row"]     # the whole layernorm is one kernel
    for k in sched.kernels:
        assert k.fuses and k.knobs is not None and k.bytes > 0
        assert all(n.origin for n in k.fuses)
    assert "kernel k0_" in str(prog.tile_ir) and "for." in str(prog.tile_ir)
    assert "int tessera_entry(void** b)" in prog.target_code
    assert "-ffast-math" not in prog.target_code
    np.testing.assert_allclose(prog(x), layer_norm(x))


def compiled_graph(fn, *args):
    return ts.function(fn).lower(*args).graph_ir


def test_constant_folding(rng):
    x = rng.standard_normal(5).astype(np.float32)
    g = compiled_graph(lambda x: x + op.exp(op.cast(np.arange(5), ts.float32)) * 2.0, x)
    assert ops_of(g) == ["const", "add"]
    np.testing.assert_allclose(ts.function(lambda x: x + op.exp(op.cast(
        np.arange(5), ts.float32)) * 2.0)(x), x + np.exp(np.arange(5, dtype=np.float32)) * 2,
        rtol=1e-6)


def test_cse_and_dce(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)

    def f(x):
        unused = op.exp(x) * 7       # noqa: F841  (dead)
        return op.tanh(x) + op.tanh(x)

    g = compiled_graph(f, x)
    assert ops_of(g) == ["tanh", "add"]


def test_transpose_of_transpose_and_noop_cast(rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    g = compiled_graph(lambda x: x.T.T.astype(ts.float32) + 1, x)
    assert "transpose" not in ops_of(g) and "cast" not in ops_of(g)
    g2 = compiled_graph(lambda x: op.transpose(op.transpose(x, [1, 2, 0]), [1, 2, 0]), x)
    assert ops_of(g2) == ["transpose"] and g2.nodes[0].attrs["perm"] == [2, 0, 1]
    out = ts.function(lambda x: op.transpose(op.transpose(x, [1, 2, 0]), [1, 2, 0]))(x)
    np.testing.assert_array_equal(out, x.transpose(1, 2, 0).transpose(1, 2, 0))


def test_decomposition_marks_origins(rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    prog = ts.function(lambda x: op.softmax(x)).lower(x)
    prim = prog.primitive_ir
    assert {n.op for n in prim.nodes} == {"max", "sub", "exp", "sum", "div"}
    assert all(n.origin == "%0:softmax" for n in prim.nodes)


def test_graph_verifier_catches_malformed_ir():
    g = Graph("bad")
    x = g.add_param("x", TensorType(ts.float32, (3,)))
    y = g.apply("exp", [x])
    z = g.apply("neg", [y])
    g.outputs = [z]
    g.verify()
    g.nodes.reverse()                          # use before definition
    with pytest.raises(ts.IRVerificationError, match="before it is defined"):
        g.verify()
    g.nodes.reverse()
    g.nodes[1].out.type = TensorType(ts.float32, (4,))
    with pytest.raises(ts.IRVerificationError, match="disagrees"):
        g.verify()


def test_tile_verifier_catches_malformed_ir():
    p_in = Param("a", ts.float32, (4,), "in")
    p_out = Param("o", ts.float32, (4,), "out")
    ok = TileKernel("k", "copy", [p_in, p_out], [Loop("i", 4, "serial", [
        Store("o", Var("i"), Const(0.0, ts.float32))])], {})
    ok.verify()
    bad = TileKernel("k", "copy", [p_in, p_out], [Store("a", Const(0), Const(0.0, ts.float32))], {})
    with pytest.raises(ts.IRVerificationError, match="not an output"):
        bad.verify()
    scope = TileKernel("k", "copy", [p_in, p_out], [Loop("i", 4, "serial", []),
                                                   Store("o", Var("i"), Const(0.0, ts.float32))], {})
    with pytest.raises(ts.IRVerificationError, match="outside its scope"):
        scope.verify()


def test_outputs_that_are_inputs_or_constants(rng):
    x = rng.standard_normal(3).astype(np.float32)
    f = ts.function(lambda x: (x, np.float32(2.0), x * 1))
    a, b, c = f(x)
    np.testing.assert_array_equal(a, x)
    assert a is not x and float(b) == 2.0
    np.testing.assert_array_equal(c, x)


def test_static_arguments_specialise(rng):
    @ts.function
    def scale(x: Tensor["N"], k):
        return x * k

    x = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(scale(x, 2.0), x * 2)
    np.testing.assert_allclose(scale(x, 3.0), x * 3)
    np.testing.assert_allclose(scale(x, k=0.5), x * 0.5)


def test_tessera_functions_compose(rng):
    @ts.function
    def norm(x: Tensor["N", "D"]) -> Tensor["N", "D"]:
        return op.layernorm(x)

    @ts.function
    def block(x: Tensor["N", "D"], w: Tensor["D", "D"]) -> Tensor["N", "D"]:
        return x + norm(op.relu(x @ w))

    x = rng.standard_normal((5, 6)).astype(np.float32)
    w = rng.standard_normal((6, 6)).astype(np.float32)
    h = np.maximum(x @ w, 0)
    want = x + (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(block(x, w), want, rtol=1e-4, atol=1e-5)
    assert "layernorm" in str(block.graph_ir)

    @ts.function
    def wrong(x: Tensor["N", "D"]):
        return norm(x.reshape(-1))            # rank 1 where norm wants rank 2

    with pytest.raises(ts.RankError):
        wrong(x)


def test_numpy_arrays_and_scalars_meet_traced_tensors(rng):
    w = rng.standard_normal((4, 3)).astype(np.float32)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    f = ts.function(lambda x: (np.float32(2) * x, w.T @ x.T, np.ones(4, np.float32) + x))
    a, b, c = f(x)
    np.testing.assert_allclose(a, 2 * x)
    assert_within_dot_bound(b, w.T, x.T)
    np.testing.assert_allclose(c, 1 + x)


def test_iterating_a_traced_tensor(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    f = ts.function(lambda x: sum(row * i for i, row in enumerate(x)))
    np.testing.assert_allclose(f(x), sum(r * i for i, r in enumerate(x)), rtol=1e-6,
                               atol=1e-6)

    @ts.function
    def g(x: Tensor["N", "D"]):
        return [r for r in x]

    with pytest.raises(ts.TesseraError, match="symbolic"):
        g.graph_ir
    h = ts.function(lambda x: [r * 2 for r in x])
    for got, want in zip(h(x), x * 2):
        np.testing.assert_allclose(got, want)


def test_verifiers_reject_what_the_compiler_never_makes():
    g = Graph("bad")
    x = g.add_param("x", TensorType(ts.float32, (3,)))
    g.outputs = []
    with pytest.raises(ts.IRVerificationError, match="returns nothing"):
        g.verify()
    y = g.apply("exp", [x])
    g.outputs = [y]
    g.nodes[0].inputs.append(x)                  # exp with two operands
    with pytest.raises(ts.IRVerificationError, match="operands"):
        g.verify()
    g.nodes[0].inputs.pop()
    g.nodes[0].op = "no_such_op"
    with pytest.raises(ts.IRVerificationError, match="unknown operator"):
        g.verify()
    g2 = Graph("dup")
    g2.add_param("x", TensorType(ts.float32, (3,)))
    g2.outputs = [g2.add_param("x", TensorType(ts.float32, (3,)))]
    with pytest.raises(ts.IRVerificationError, match="twice"):
        g2.verify()

    p_in = Param("a", ts.float32, (4,), "in")
    p_out = Param("o", ts.float32, (4,), "out")
    twice = TileKernel("k", "copy", [p_in, p_out], [
        Decl("v", ts.float32, Const(0.0, ts.float32)), Decl("v", ts.float32, Const(1.0, ts.float32))],
        {})
    with pytest.raises(ts.IRVerificationError, match="declared twice"):
        twice.verify()
    outside = TileKernel("k", "copy", [p_in, p_out], [Store("o", Const(4), Const(0.0, ts.float32))], {})
    with pytest.raises(ts.IRVerificationError, match="outside"):
        outside.verify()


def test_swapped_kernel_arguments_fail_verification(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    prog = ts.function(lambda x, y: x @ y).lower(x, x.T.copy())
    name, args = prog.tile_ir.calls[0]
    prog.tile_ir.calls[0] = (name, [args[1], args[0], args[2]])
    with pytest.raises(ts.IRVerificationError, match="gets"):
        prog.tile_ir.verify()
