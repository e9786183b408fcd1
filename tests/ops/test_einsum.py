"""op.einsum against np.einsum on fresh random inputs: compiled, eager and in gradients (through
the operators it lowers to), symbolic shapes, and the specs it refuses."""
import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, op

from conftest import assert_close

SPECS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 6, 4)]),          # attention scores
    ("ij->ji", [(3, 4)]),
    ("ijk->kj", [(2, 3, 4)]),                                    # a sum, then a transpose
    ("ij->", [(3, 4)]),
    ("i,i->", [(7,), (7,)]),
    ("ij,ij->i", [(3, 4), (3, 4)]),                              # batch only: a row dot
    ("i,j->ij", [(3,), (4,)]),                                   # outer product
    ("ij,kl->ijkl", [(2, 3), (4, 5)]),
    ("abc,cd->abd", [(2, 3, 4), (4, 5)]),
    ("ijk,jkl,lm->im", [(2, 3, 4), (3, 4, 5), (5, 6)]),         # two letters contracted at once
    ("ab,bc,cd,de->ae", [(2, 3), (3, 4), (4, 5), (5, 6)]),
    ("ab,cb", [(3, 4), (5, 4)]),                                 # implicit: 'ac'
    ("ba,cb->ca", [(4, 3), (5, 4)]),
    ("ij,jk,ik->", [(3, 4), (4, 5), (3, 5)]),
    ("bn,bnd->bd", [(1, 1), (1, 1, 3)]),                         # size-1 axes
]


def _fn(spec, n, wrap="{}"):
    """lambda x0, x1, ...: op.einsum(spec, x0, x1, ...), inside `wrap` (tessera functions take
    a fixed number of parameters)."""
    params = ", ".join(f"x{i}" for i in range(n))
    return eval(f"lambda {params}: " + wrap.format(f"op.einsum(spec, {params})"),
                {"op": op, "spec": spec})


@pytest.mark.parametrize("spec,shapes", SPECS, ids=[s for s, _ in SPECS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_numpy(spec, shapes, dtype, rng):
    xs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    want = np.einsum(spec, *[x.astype(np.float64) for x in xs])
    f = ts.function(_fn(spec, len(xs)))
    got = f(*xs)
    assert got.dtype == dtype and got.shape == want.shape
    assert_close(got, want.astype(dtype), scale=16)
    assert_close(op.einsum(spec, *xs), want.astype(dtype), scale=16)     # eager


def test_integers_are_exact(rng):
    a, b = rng.integers(-9, 9, (4, 5)), rng.integers(-9, 9, (5, 3))
    np.testing.assert_array_equal(ts.function(lambda a, b: op.einsum("ij,jk->ki", a, b))(a, b),
                                  np.einsum("ij,jk->ki", a, b))


GRAD = ["bhqd,bhkd->bhqk", "ijk->kj", "ij,ij->i", "ijk,jkl,lm->im", "ab,cb"]


@pytest.mark.parametrize("spec", GRAD)
def test_gradients_against_finite_differences(spec, rng):
    shapes = dict(SPECS)[spec]
    xs = [rng.uniform(-1, 1, s) for s in shapes]
    ts.check_grad(_fn(spec, len(xs), "op.sum(op.tanh({}))"), *xs)


def test_symbolic_shapes_flow_and_lower_to_one_matmul():
    @ts.function
    def scores(q: Tensor["B", "S", "D"], k: Tensor["B", "T", "D"]):
        return op.einsum("bsd,btd->bst", q, k)
    g = scores.graph_ir
    assert str(g.outputs[0].type) == "f32[B,S,T]"
    assert [n.op for n in g.nodes] == ["transpose", "matmul"]       # no reshape that does nothing


def test_a_size_mismatch_is_a_shape_error_at_the_users_line():
    @ts.function
    def bad(q: Tensor["B", "S", "D"], k: Tensor["B", "T", "E"]):
        return op.einsum("bsd,btd->bst", q, k)
    with pytest.raises(ts.ShapeError, match="'d' is D in one operand and E") as info:
        bad.graph_ir
    assert "return op.einsum" in str(info.value)


@pytest.mark.parametrize("spec,shapes,match", [
    ("ii->i", [(3, 3)], "distinct letters"),
    ("...ij,jk->...ik", [(2, 3, 4), (4, 5)], "'...' is not supported"),
    ("ij,jk->ik", [(3, 4)], "names 2 operand"),
    ("ijk,jk->ik", [(3, 4), (4, 5)], "rank 2 but 'ijk'"),
    ("ij,jk->iz", [(3, 4), (4, 5)], "'z' is in no operand"),
    ("i1,1k->ik", [(3, 4), (4, 5)], "distinct letters"),
])
def test_refused_specs_say_why(spec, shapes, match):
    with pytest.raises(ts.ArgumentError, match=match):
        op.einsum(spec, *[np.ones(s, np.float32) for s in shapes])
