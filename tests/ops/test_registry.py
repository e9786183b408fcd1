"""Every registered operator: compiled, interpreted and eager results agree with its NumPy
reference. Registering an operator without an example (tests/cases.py) fails the first test."""
import numpy as np
import pytest

import tessera as ts
from tessera import ops

from cases import EXAMPLES, normal_attrs
from conftest import assert_close


def test_every_operator_has_an_example():
    # control flow's operators carry nested graphs: tests/frontend/language/test_control_flow.py
    # (host calls run Python between kernels, never a kernel:
    # tests/frontend/interop/test_interop.py; a tile kernel's node carries its traced body:
    # tests/frontend/test_tile_kernels.py)
    assert set(EXAMPLES) == set(ops.REGISTRY) - set(ops.regions.REGION_OPS) - \
        set(ops.host.HOST_OPS) - {"tile_program"}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_compiled_interpreted_eager_agree_with_reference(name, rng):
    make, attrs = EXAMPLES[name]
    inputs = make(rng)
    opdef = ops.get(name)
    listed = opdef.nin == -1                      # concat takes one list of tensors
    args = inputs[0] if listed else inputs
    want = np.asarray(opdef.reference(args, normal_attrs(opdef, args, attrs)))

    def apply(*xs):
        return ts.trace.apply(name, list(xs), **attrs) if listed else \
            ts.trace.apply(name, *xs, **attrs)

    # a fixed-arity function (tessera functions take no *args)
    f = ts.function(eval("lambda " + ", ".join(f"x{i}" for i in range(len(args))) + ": apply("
                         + ", ".join(f"x{i}" for i in range(len(args))) + ")", {"apply": apply}))
    assert_close(f(*args), want, scale=4)
    assert_close(ts.interpret(f, *args), want, scale=4)
    assert_close(apply(*args), want, scale=4)     # eager
    assert hasattr(ts.op, name)


def test_an_operator_is_a_function_tessera_can_compile(rng):
    """op.gelu, op.softmax, op.add: their signatures name the operands and the attributes, so
    ts.function(op.softmax) compiles them as written (it refused their *args before)."""
    import inspect
    from tessera import op
    x, y = rng.standard_normal((2, 4, 5)).astype(np.float32)
    assert str(inspect.signature(op.softmax)) == "(x, axis=-1)"
    assert list(inspect.signature(op.add).parameters) == ["x0", "x1"]
    np.testing.assert_array_equal(ts.function(op.softmax)(x),
                                  ts.function(lambda v: op.softmax(v, axis=-1))(x))
    np.testing.assert_array_equal(ts.function(op.add)(x, y), x + y)
    np.testing.assert_array_equal(ts.function(op.gelu)(x), ts.function(lambda v: op.gelu(v))(x))
    np.testing.assert_array_equal(op.softmax(x=x), op.softmax(x))       # by name, eagerly too
