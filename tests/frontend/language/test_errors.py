"""Bad input: every kind gets its own clear TesseraError, naming the user's line."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, op

HERE = os.path.basename(__file__)


def x32(*shape):
    return np.zeros(shape, np.float32)


def test_forgotten_keepdim_names_line_op_types_and_hint():
    @ts.function
    def adaptive_pooling(x: Tensor["B", "C", "H", "W"]) -> Tensor["B", "C", 1, 1]:
        pooled = x.mean(axis=(2, 3))
        return pooled

    with pytest.raises(ts.ShapeError) as e:
        adaptive_pooling(x32(2, 3, 4, 5))
    msg = str(e.value)
    line = adaptive_pooling.fn.__code__.co_firstlineno + 2
    assert f"ShapeError in adaptive_pooling at {HERE}:{line} (mean)" in msg
    assert "expected  f32[B,C,1,1]" in msg and "received  f32[B,C]" in msg
    assert "keepdim=True" in msg
    # the symbolic graph alone reports the same, before any data exists
    with pytest.raises(ts.ShapeError, match="keepdim"):
        adaptive_pooling.graph_ir


def test_transposed_operand_is_caught_symbolically_even_when_sizes_agree():
    @ts.function
    def scores(q: Tensor["B", "S", "D"], k: Tensor["B", "S", "D"]):
        return q @ k                      # should be q @ k.T

    with pytest.raises(ts.ShapeError) as e:
        scores(x32(2, 4, 4), x32(2, 4, 4))    # S == D here: only the symbols tell
    msg = str(e.value)
    assert "(matmul)" in msg and "f32[B,S,D] @ f32[B,S,D]" in msg
    assert "second operand's last axis (D)" in msg and "transpose the second operand" in msg
    assert f"{HERE}:" in msg and "return q @ k" in msg


def test_a_transpose_too_many_is_hinted_without_naming_another_variable():
    @ts.function
    def attend(p: Tensor["S", "S"], v: Tensor["S", "D"]):
        return p @ v.T                    # should be p @ v

    with pytest.raises(ts.ShapeError) as e:
        attend(x32(4, 4), x32(4, 3))
    msg = str(e.value)
    assert "return p @ v.T" in msg and "or drop its .T" in msg and "b.T" not in msg


def test_broadcast_failure_hint():
    @ts.function
    def f(x: Tensor["S", "D"], y: Tensor["D", "S"]):
        return x + y

    with pytest.raises(ts.ShapeError, match="missing transpose"):
        f(x32(3, 3), x32(3, 3))
    g = ts.function(lambda a, b: a * b)
    with pytest.raises(ts.ShapeError, match=r"\[3,4\] and \[5\]"):
        g(x32(3, 4), x32(5))


def test_symbol_disagreement_between_arguments():
    @ts.function
    def f(x: Tensor["B", "D"], y: Tensor["B", "D"]):
        return x + y

    with pytest.raises(ts.ShapeError, match="B=4 from 'x' axis 0, B=5 from 'y' axis 0"):
        f(x32(4, 3), x32(5, 3))


def test_wrong_rank_dtype_count_and_unsupported_dtype():
    @ts.function
    def f(x: Tensor["B", "D", ts.float64], n: Tensor["B"]):
        return x.sum(axis=1) + n

    with pytest.raises(ts.ShapeError, match="rank 3, the annotation rank 2"):
        f(np.zeros((2, 3, 1)), np.zeros(2))
    with pytest.raises(ts.DTypeError, match="wrong dtype") as e:
        f(x32(2, 3), np.zeros(2))
    assert "expected  f64[B,D]" in str(e.value)
    with pytest.raises(ts.ArgumentError, match="missing a required argument"):
        f(np.zeros((2, 3)))
    with pytest.raises(ts.ArgumentError, match="too many"):
        f(np.zeros((2, 3)), np.zeros(2), np.zeros(2))
    with pytest.raises(ts.UnsupportedDTypeError, match="datetime64"):
        f(np.zeros((2, 3)), np.zeros(2, "datetime64[s]"))
    with pytest.raises(ts.UnsupportedDTypeError, match="float16"):
        ts.function(lambda x: x + 1)(np.zeros(3, np.complex256 if hasattr(np, "complex256")
                                              else np.longdouble))
    with pytest.raises(ts.UnsupportedDTypeError, match="sin does not take complex"):
        ts.function(lambda x: op.sin(x))(np.zeros(3, np.complex64))


def test_fixed_size_in_annotation():
    @ts.function
    def f(x: Tensor["B", 3]):
        return x * 2

    with pytest.raises(ts.ShapeError, match="size 4 on axis 1, the annotation 3"):
        f(x32(2, 4))


def test_dtype_errors_in_ops():
    with pytest.raises(ts.DTypeError, match="condition must be a bool"):
        ts.function(lambda x: op.where(x, x, 0))(x32(3))
    with pytest.raises(ts.DTypeError, match="indices must be int32 or int64"):
        ts.function(lambda t, i: op.take(t, i))(x32(4, 2), x32(3))
    with pytest.raises(ts.DTypeError, match="not defined for bool"):
        ts.function(lambda b: -b)(np.zeros(3, bool))
    with pytest.raises(ts.DTypeError, match="matmul of bool"):
        ts.function(lambda a: a @ a)(np.zeros((2, 2), bool))


def test_other_shape_errors():
    with pytest.raises(ts.ShapeError, match="keep the number of elements"):
        ts.function(lambda x: x.reshape(4, 4))(x32(3, 5))
    with pytest.raises(ts.ShapeError, match="axis 2 is out of range"):
        ts.function(lambda x: x.sum(axis=2))(x32(3, 5))
    with pytest.raises(ts.ShapeError, match="equal dimensions elsewhere"):
        ts.function(lambda a, b: op.concat([a, b], axis=0))(x32(2, 3), x32(2, 4))
    with pytest.raises(ts.ShapeError, match="no identity"):
        ts.function(lambda x: x.max(axis=0))(x32(0, 3))
    with pytest.raises(ts.ShapeError, match="squeeze of axis 0"):
        ts.function(lambda x: op.squeeze(x, 0))(x32(2, 3))


def test_eager_errors_name_the_line():
    with pytest.raises(ts.ShapeError) as e:
        op.matmul(x32(3, 4), x32(3, 4))
    assert f"{HERE}:" in str(e.value) and "(matmul)" in str(e.value)


def test_out_of_range_index_raises_instead_of_crashing():
    f = ts.function(lambda t, i: op.take(t, i))
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    with pytest.raises(ts.RuntimeFault, match="out of range") as e:
        f(table, np.array([0, 4], dtype=np.int64))
    assert "(take)" in str(e.value)
    np.testing.assert_array_equal(f(table, np.array([-1, 0])), table[[-1, 0]])
    with pytest.raises(ts.RuntimeFault):
        f(table, np.array([-5]))
    with pytest.raises(ts.RuntimeFault):
        op.take(table, np.array([9]))          # eager: the same contract


def test_traced_tensor_misuse():
    with pytest.raises(ts.TesseraError, match="no truth value"):
        ts.function(lambda x: x if x > 0 else -x)(x32(3))
    with pytest.raises(ts.TesseraError, match="cannot become a NumPy array"):
        ts.function(lambda x: np.sum(np.asarray(x)))(x32(3))


def test_unannotated_graph_ir_asks_for_arguments():
    f = ts.function(lambda a, b: a + b)
    with pytest.raises(ts.ArgumentError, match="lower"):
        f.graph_ir
    f(x32(2), x32(2))
    assert "add" in str(f.graph_ir)


def test_missing_c_compiler(tmp_path):
    code = textwrap.dedent("""
        import numpy as np, tessera as ts
        try:
            ts.function(lambda x: x * 3.5 + 1)(np.ones(5, np.float32))
        except ts.CompilerNotFoundError as e:
            print("CAUGHT", type(e).__name__, isinstance(e, ts.BackendUnavailableError))
            print(e)
    """)
    env = dict(os.environ, CC="no-such-cc-tessera", TESSERA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "CAUGHT CompilerNotFoundError True" in out.stdout, out.stderr
    assert "no-such-cc-tessera" in out.stdout


def test_compile_error_shows_source_path_and_log(tmp_path, monkeypatch):
    from tessera.runtime import toolchain
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    with pytest.raises(ts.CompileError) as e:
        toolchain.build("int tessera_entry(void** b) { return undeclared_name; }\n", "broken")
    msg = str(e.value)
    assert "source: " in msg and "undeclared_name" in msg
    src = msg.split("source: ")[1].split()[0]
    assert os.path.exists(src)
    # nothing but the kept source is left: no half-written shared object
    leftovers = [p.name for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".c")]
    assert leftovers == []


def test_error_classes_are_specific():
    @ts.function
    def f(x: Tensor["B", "D"], y: Tensor["B", "D"]):
        return x + y

    with pytest.raises(ts.RankError):
        f(x32(2, 3, 1), x32(2, 3))
    with pytest.raises(ts.SymbolMismatchError):
        f(x32(2, 3), x32(2, 4))
    assert issubclass(ts.RankError, ts.ShapeError) and issubclass(ts.SymbolMismatchError,
                                                                  ts.ShapeError)


def test_return_annotation_uses_the_call_bindings(rng):
    @ts.function
    def proj(x: Tensor["B", "D"], w) -> Tensor["B", "D"]:
        return x @ w                       # w is unannotated: its sizes are concrete

    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(proj(x, np.eye(4, dtype=np.float32)), x, rtol=1e-6)
    with pytest.raises(ts.ShapeError, match="return annotation"):
        proj(x, np.ones((4, 5), np.float32))

    @ts.function
    def fresh(x: Tensor["B", "D"]) -> Tensor["B", "K"]:     # K: whatever comes out
        return op.concat([x, x], axis=1)

    assert fresh(x).shape == (3, 8)
