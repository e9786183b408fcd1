"""scan: a running sum or product along one axis (cumsum, cumprod), alone. CPU: a loop per
line of the axis, each element combined into the accumulator in order and stored (in 16 bits:
a float32 accumulator, each output rounded once); the lines in parallel. GPU: that nest on the
grid, a thread per line.
"""
from __future__ import annotations

from ...ops import registry as R
from ..emit import Names, axis_groups, contiguous, finish, grid_from_cpu_nests, nest, read
from ..tile_ir import Assign, Decl, Loop, OpCall, Store, Var, linear
from .base import Strategy, register, worth_threads


class ScanStrategy(Strategy):
    name = "scan"
    grows = False

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Scan)

    def node_flops(self, n) -> int:
        return n.inputs[0].type.numel()

    def cpu_knobs(self, k) -> dict:
        lines = k.output.type.numel() // max(1, k.output.type.shape[k.attrs["axis"]])
        return {"parallel": lines >= 2 and worth_threads(k.inputs[0].type.numel())}

    def lower_cpu(self, k, code):
        return lower_scan(k)

    def lower_gpu(self, k, code, target, knobs):
        return grid_from_cpu_nests(self.lower_cpu(k, code), knobs)


register(ScanStrategy())


def lower_scan(k):
    names = Names()
    x = k.inputs[0]
    shape, axis = list(x.type.shape), k.attrs["axis"]
    xd, od = x.type.dtype, k.output.type.dtype.compute      # 16-bit: a float32 accumulator
    kept_ext, kept_st, _, _, _ = axis_groups(shape, {axis})  # (input, output: one layout)
    outer, inner, kvars = nest(kept_ext, names, k.knobs.get("parallel"), False)
    acc, r = names("acc"), names("r")
    at = linear([*kvars, Var(r)], kept_st + [contiguous(shape)[axis]])
    body = [Decl(acc, od, OpCall(k.op, "init", (), xd, od, ())),
            Loop(r, shape[axis], "serial", [
                Assign(acc, OpCall(k.op, "combine", (), xd, od, (Var(acc), read(x, at)))),
                Store(k.output.name, at, Var(acc))])]
    return finish(k, inner, outer, body)
