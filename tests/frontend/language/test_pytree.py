"""Pytrees (tessera/pytree.py) and tessera functions taking and returning them."""
import collections

import numpy as np
import pytest

import tessera as ts
from tessera import op, pytree

Pair = collections.namedtuple("Pair", "left right")


def test_flatten_unflatten_round_trip():
    a, b, c = np.ones(2), np.zeros(3), np.arange(4)
    tree = {"x": [a, (b, None)], "y": Pair(c, 2.5), "z": {}}
    leaves, td = pytree.flatten(tree)
    assert [id(v) for v in leaves[:3]] == [id(a), id(b), id(c)] and leaves[3] == 2.5
    assert td.num_leaves == 4
    back = td.unflatten(leaves)
    assert back["x"][1][1] is None and isinstance(back["y"], Pair) and back["z"] == {}
    assert back["x"][0] is a and back["y"].right == 2.5
    assert td.paths() == [("x", 0), ("x", 1, 0), ("y", "left"), ("y", "right")]
    assert repr(td) == "{x: [*, (*, None)], y: Pair(*, *), z: {}}"


def test_treedefs_compare_by_structure():
    t1 = pytree.flatten({"w": np.ones(2), "b": [1.0]})[1]
    t2 = pytree.flatten({"w": np.zeros(5), "b": [np.ones(1)]})[1]
    t3 = pytree.flatten({"b": [1.0], "w": np.ones(2)})[1]      # key order is structure
    assert t1 == t2 and hash(t1) == hash(t2) and t1 != t3
    with pytest.raises(ValueError):
        t1.unflatten([1])


def test_tree_map():
    out = pytree.tree_map(lambda x, y: x + y, {"a": 1, "b": (2, 3)}, {"a": 10, "b": (20, 30)})
    assert out == {"a": 11, "b": (22, 33)}
    with pytest.raises(ValueError):
        pytree.tree_map(lambda x, y: x, [1], [1, 2])


def affine(params, x):
    return {"y": x @ params["w"] + params["b"], "norm": op.sum(params["w"] ** 2)}


def test_a_function_takes_and_returns_dicts(rng):
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    x = rng.standard_normal((2, 3))
    f = ts.function(affine)
    out = f(params, x)
    np.testing.assert_allclose(out["y"], x @ params["w"] + params["b"], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(out["norm"], np.sum(params["w"] ** 2), rtol=1e-13)
    interp = f.interpret(params, x)
    assert set(interp) == {"y", "norm"}
    np.testing.assert_allclose(interp["y"], out["y"], rtol=1e-13, atol=1e-13)
    names = [p.param_name for p in f.lower(params, x).graph_ir.params]
    assert names == ["params_w", "params_b", "x"]


def test_the_cache_key_holds_the_structure_and_the_static_leaves(rng):
    calls = []

    @ts.function
    def f(t):
        calls.append(1)
        return t["a"] * t["k"]
    a = rng.standard_normal(3)
    np.testing.assert_allclose(f({"a": a, "k": 2.0}), 2 * a)
    f({"a": a + 1, "k": 2.0})                      # same structure and statics: no new trace
    n = len(calls)
    np.testing.assert_allclose(f({"a": a, "k": 3.0}), 3 * a)   # another static value
    np.testing.assert_allclose(f({"k": 3.0, "a": a}), 3 * a)   # another structure
    assert len(calls) > n and len(f.programs.by_key) == 3


def test_lists_of_numbers_stay_arrays_and_tuples_statics():
    @ts.function
    def f(x, shape):
        return op.reshape(x, list(shape))
    np.testing.assert_array_equal(f([[1.0, 2.0], [3.0, 4.0]], (4,)), [1.0, 2.0, 3.0, 4.0])


def test_leaf_names_are_unique_identifiers(rng):
    @ts.function
    def f(a, a_b):
        return a["b"] + a["layer.0"] + a_b
    x = rng.standard_normal(2)
    np.testing.assert_allclose(f({"b": x, "layer.0": x}, x), 3 * x)
    names = [p.param_name for p in f.lower({"b": x, "layer.0": x}, x).graph_ir.params]
    assert len(set(names)) == 3 and all(n.isidentifier() for n in names)


def test_a_pytree_passes_through_an_inlined_call(rng):
    inner = ts.function(affine)

    @ts.function
    def outer(params, x):
        return inner(params, x)["y"] * 2.0
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    x = rng.standard_normal((2, 3))
    np.testing.assert_allclose(outer(params, x), 2 * (x @ params["w"] + params["b"]), rtol=1e-13,
                               atol=1e-13)


def test_tuples_of_results_with_nested_containers(rng):
    @ts.function
    def f(x):
        return x + 1.0, [x * 2.0, {"z": x}]
    x = rng.standard_normal(3)
    a, (b, c) = f(x)
    np.testing.assert_array_equal(c["z"], x)
    np.testing.assert_array_equal(b, 2 * x)
