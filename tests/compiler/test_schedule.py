"""User knobs: tessera.Schedule attached to a function, and op.matmul(..., tile_shape=...)."""
import json

import numpy as np
import pytest

import tessera as ts
from tessera import op

from conftest import assert_close, assert_within_dot_bound


def test_schedule_derivation_and_files(tmp_path):
    s = ts.Schedule(name="mine", block=(64, 128), warps=8, stages=3, vector_width=8)
    assert s.with_stages(4).stages == 4 and s.stages == 3
    assert s.with_block(32, 32, 16).block == (32, 32, 16)
    path = tmp_path / "mine.sched"
    s.save(path)
    assert ts.Schedule.load(path) == s
    assert json.loads(path.read_text())["block"] == [64, 128]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".sched-")]


@pytest.mark.parametrize("bad", [dict(block=(0, 4)), dict(block=(1, 2, 3, 4)),
                                 dict(vector_width=0), dict(stages="3"), dict(block=(2.5, 4))])
def test_bad_knobs_are_argument_errors(bad):
    with pytest.raises(ts.ArgumentError, match="Schedule"):
        ts.Schedule(**bad)


def test_unreadable_schedule_file_is_an_argument_error(tmp_path):
    p = tmp_path / "x.sched"
    p.write_text("{not json")
    with pytest.raises(ts.ArgumentError, match="cannot read schedule"):
        ts.Schedule.load(p)
    p.write_text(json.dumps({"format": 1, "blokc": [1, 2]}))
    with pytest.raises(ts.ArgumentError, match="unknown knobs"):
        ts.Schedule.load(p)


def test_schedule_knobs_reach_the_kernels(rng):
    x = rng.standard_normal((6, 50)).astype(np.float32)
    f = ts.function(lambda x: op.softmax(x))
    g = f.with_schedule(ts.Schedule(vector_width=4, parallel=False))
    (k,) = g.lower(x).schedule_ir.kernels
    assert k.knobs["lanes"] == 4 and k.knobs["parallel"] is False
    assert f.lower(x).schedule_ir.kernels[0].knobs["lanes"] != 4      # f itself is unchanged
    # another association of the row sums: not the same bits in general, same values
    assert_close(g(x), f(x), scale=2)


def test_matmul_tile_shape_sets_the_tiles(rng):
    a = rng.standard_normal((70, 33)).astype(np.float32)
    b = rng.standard_normal((33, 90)).astype(np.float32)
    f = ts.function(lambda a, b: op.matmul(a, b, tile_shape=(16, 32, 8)))
    (k,) = f.lower(a, b).schedule_ir.kernels
    assert (k.knobs["tile_m"], k.knobs["tile_n"], k.knobs["tile_k"]) == (16, 32, 8)
    got = f(a, b)
    assert_within_dot_bound(got, a, b)
    # every element is the same chain of fused multiply-adds whatever the tiles
    assert got.tobytes() == ts.function(lambda a, b: a @ b)(a, b).tobytes()
    with pytest.raises(ts.ShapeError, match="tile_shape"):
        ts.function(lambda a, b: op.matmul(a, b, tile_shape=(0, 4)))(a, b)


def test_fusion_can_be_turned_off_without_changing_a_bit(rng):
    """Schedule(fusion=False): one kernel per primitive operator, for comparisons; every result
    keeps its bits (each operator rounds its own result either way)."""
    x = rng.standard_normal((37, 101)).astype(np.float32)
    w = rng.standard_normal((101, 64)).astype(np.float32)
    f = ts.function(lambda x, w: op.softmax(op.layernorm(op.gelu(x) * 2.0) @ w, axis=-1))
    unfused = f.with_schedule(ts.Schedule(fusion=False))
    fused_n, unfused_n = len(f.lower(x, w).kernels), len(unfused.lower(x, w).kernels)
    assert unfused_n > fused_n + 5
    assert f(x, w).tobytes() == unfused(x, w).tobytes()
    assert "fusion=False" in str(ts.Schedule(fusion=False))
    assert ts.Schedule(fusion=False).key() != ts.Schedule().key()      # a separate program
