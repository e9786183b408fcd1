"""The strategy registry: every operator node has exactly one strategy, every strategy lowers for every
target, and a new strategy is a module of its own: a cumulative sum added here (an operator
with a lowering descriptor of its own and a strategy that claims it) compiles and runs against
NumPy without a line changed anywhere in the compiler."""
from dataclasses import dataclass

import numpy as np
import pytest

import tessera as ts
from tessera import ops
from tessera.compiler import strategies
from tessera.compiler.emit import Names, grid_from_cpu_nests, read
from tessera.compiler.driver import prepare
from tessera.compiler.strategies.base import Strategy
from tessera.compiler.tile_ir import Assign, Bin, Const, Decl, Loop, Store, Var, idx_add, idx_mul
from tessera.ops.registry import OpDef

from conftest import assert_close
from cases import graph, registry_cases, strategy_cases


def test_every_operator_node_has_exactly_one_strategy():
    rng = np.random.default_rng()
    cases = {**registry_cases(rng), **strategy_cases(rng)}
    seen = set()
    for name, (fn, args) in cases.items():
        _, prim = prepare(graph(fn, args))
        for n in prim.nodes:
            if n.op == "const":          # a value in the graph, not an operator
                continue
            claims = [s.name for s in strategies.REGISTRY.values() if s.claims(n)]
            assert len(claims) == 1, (name, n.op, claims)
            seen.update(claims)
    assert seen == set(strategies.REGISTRY)


def test_every_strategy_lowers_for_every_target():
    for s in strategies.REGISTRY.values():
        if not s.makes_kernels:          # control flow: its bodies' kernels lower, not it
            continue
        assert type(s).lower_cpu is not Strategy.lower_cpu, s.name
        assert type(s).lower_gpu is not Strategy.lower_gpu, s.name
        for routine in s.routines:
            assert strategies.routine_owner(routine) is s


def test_knob_names_and_aliases_come_from_the_strategies():
    from tessera.compiler.scheduler import ALIASES, KNOB_NAMES
    assert {"tile_m", "block_q", "lanes", "unroll"} <= set(KNOB_NAMES)
    assert ALIASES["BM"] == {"contract": "tile_m", "conv": "tile_m", "conv_weight_grad": "tile_m",
                             "attention": "block_q", "tile": "tile_m"}
    sched = ts.Schedule(block=(32, 64, 16), vector_width=4, parallel=False)
    assert sched.knobs_for("contract") == {"parallel": False, "tile_m": 32, "tile_n": 64,
                                           "tile_k": 16}
    assert sched.knobs_for("conv") == sched.knobs_for("contract")
    assert sched.knobs_for("row") == {"parallel": False, "lanes": 4}
    assert sched.knobs_for("gather") == {"parallel": False}
    assert sched.knobs_for("tile") == {"parallel": False, "tile_m": 32, "tile_n": 64,
                                       "tile_k": 16}


# ---- a strategy added from outside the compiler --------------------------------------------------
@dataclass(frozen=True)
class UserScan:
    """out[..., j] = x[..., 0] + ... + x[..., j], in order (a lowering of the user's own: the
    compiler's scan strategy claims registry.Scan, not this)."""


class UserScanStrategy(Strategy):
    name = "user_scan"
    grows = False

    def claims(self, n):
        return isinstance(n.opdef.lowering, UserScan)

    def node_flops(self, n):
        return n.inputs[0].type.numel()

    def cpu_knobs(self, k):
        return {"parallel": False}

    def lower_cpu(self, k, code):
        names = Names()
        x = k.inputs[0]
        shape = x.type.shape
        width, rows = shape[-1], x.type.numel() // max(1, shape[-1])
        r, j, acc = names("r"), names("j"), names("acc")
        d = k.output.type.dtype
        at = idx_add(idx_mul(Var(r), Const(width)), Var(j))
        return [Loop(r, rows, "parallel" if k.knobs.get("parallel") else "serial", [
            Decl(acc, d, Const(0, d)),
            Loop(j, width, "serial", [Assign(acc, Bin("+", Var(acc), read(x, at))),
                                      Store(k.output.name, at, Var(acc))])])]

    def lower_gpu(self, k, code, target, knobs):
        return grid_from_cpu_nests(self.lower_cpu(k, code), knobs)


@pytest.fixture
def cumsum():
    opdef = OpDef("test_cumsum", 1, infer=lambda types, attrs: types[0],
                  reference=lambda xs, attrs: np.cumsum(xs[0], axis=-1), lowering=UserScan(),
                  differentiable=False)
    ops.registry.REGISTRY[opdef.name] = opdef
    strategies.register(UserScanStrategy())
    yield opdef
    del ops.registry.REGISTRY[opdef.name]
    del strategies.REGISTRY["user_scan"]


def test_a_new_strategy_compiles_and_runs(cumsum, rng):
    @ts.function
    def f(x):
        return ts.trace.apply("test_cumsum", ts.op.exp(x)) * 2

    x = rng.standard_normal((5, 37))
    got = f(x)
    assert_close(got, np.cumsum(np.exp(x), axis=-1) * 2, scale=8)
    strategies_used = [k.strategy for k in f.lower(x).kernels]
    assert "user_scan" in strategies_used and "pointwise" in strategies_used
    cuda = f.lower(x, target="cuda")          # the GPU lowering, rendered (not run)
    assert "user_scan" in str(cuda.schedule_ir) and "__global__" in cuda.target_code
