"""Every registered operator: compiled, interpreted and eager results agree with its NumPy
reference. Registering an operator without an example here fails the first test."""
import numpy as np
import pytest

import tessera as ts
from tessera import ops

from conftest import assert_close


def f32(rng, *shape, lo=-3, hi=3):
    # float64: normalising 3 values can be ill-conditioned (a tiny variance), which no float32
    # tolerance survives; float32 accuracy is tested with error bounds in the other files
    return rng.uniform(lo, hi, size=shape)


# name -> (inputs from rng, attrs)
EXAMPLES = {
    **{n: (lambda r: [f32(r, 3, 5)], {}) for n in
       ["neg", "abs", "exp", "sin", "cos", "tanh", "sigmoid", "relu", "gelu", "silu", "erf"]},
    "log": (lambda r: [f32(r, 3, 5, lo=0.1)], {}),
    "sqrt": (lambda r: [f32(r, 3, 5, lo=0)], {}),
    "rsqrt": (lambda r: [f32(r, 3, 5, lo=0.1)], {}),
    **{n: (lambda r: [f32(r, 4, 1, 3), f32(r, 5, 1)], {}) for n in
       ["add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"]},
    "div": (lambda r: [f32(r, 4, 3), f32(r, 3, lo=0.5)], {}),
    "pow": (lambda r: [f32(r, 4, 3, lo=0.1), f32(r, 3)], {}),
    "where": (lambda r: [f32(r, 4, 3) > 0, f32(r, 4, 3), f32(r, 3)], {}),
    "cast": (lambda r: [f32(r, 4, 3) * 10], {"dtype": "int32"}),
    **{n: (lambda r: [f32(r, 3, 4, 5)], {"axis": [0, 2], "keepdim": True}) for n in
       ["sum", "max", "min", "mean", "var"]},
    "argmax": (lambda r: [f32(r, 3, 7)], {"axis": 1}),
    "argmin": (lambda r: [f32(r, 3, 7)], {"axis": 0, "keepdim": True}),
    **{n: (lambda r: [f32(r, 2, 3, 6)], {"axis": 1}) for n in
       ["softmax", "log_softmax", "logsumexp", "layernorm", "rmsnorm"]},
    "matmul": (lambda r: [f32(r, 2, 3, 4), f32(r, 4, 5)], {}),
    "attention": (lambda r: [f32(r, 2, 5, 4), f32(r, 2, 7, 4), f32(r, 2, 7, 3), f32(r, 5, 7)],
                  {"causal": True}),
    "transpose": (lambda r: [f32(r, 2, 3, 4)], {"perm": [1, 2, 0]}),
    "reshape": (lambda r: [f32(r, 2, 3, 4)], {"shape": [4, -1]}),
    "broadcast_to": (lambda r: [f32(r, 3, 1)], {"shape": [2, 3, 5]}),
    "slice": (lambda r: [f32(r, 6, 5)], {"starts": [1, None], "stops": [None, 0],
                                        "steps": [2, -1]}),
    "concat": (lambda r: [[f32(r, 2, 3), f32(r, 4, 3)]], {"axis": 0}),
    "take": (lambda r: [f32(r, 5, 3), r.integers(-5, 5, size=(2, 2))], {"axis": 0}),
    "expand_dims": (lambda r: [f32(r, 2, 3)], {"axis": -1}),
    "squeeze": (lambda r: [f32(r, 2, 1, 3)], {"axis": 1}),
    "random_uniform": (lambda r: [r.integers(-2**40, 2**40, size=()),
                                  r.integers(0, 2**40, size=(4, 5))], {}),
}


def test_every_operator_has_an_example():
    assert set(EXAMPLES) == set(ops.REGISTRY)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_compiled_interpreted_eager_agree_with_reference(name, rng):
    make, attrs = EXAMPLES[name]
    inputs = make(rng)
    opdef = ops.get(name)
    listed = opdef.nin == -1                      # concat takes one list of tensors
    args = inputs[0] if listed else inputs
    want = np.asarray(opdef.reference(args, _normal(opdef, args, attrs)))

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


def _normal(opdef, arrays, attrs):
    from tessera.compiler.graph_ir import make_attrs
    from tessera.types import type_of_array
    return make_attrs(opdef, attrs, [type_of_array(np.asarray(a)) for a in arrays])
