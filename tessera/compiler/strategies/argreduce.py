"""argreduce: the index of the first element that wins (argmax, argmin; NaN wins, as in NumPy),
alone. CPU: a loop per output over its reduced elements in order. GPU: that nest on the grid.
"""
from __future__ import annotations

from ... import dtypes as dt
from ...ops import registry as R
from ..emit import Names, axis_groups, finish, grid_from_cpu_nests, nest, read
from ..schedule_ir import Kernel
from ..tile_ir import Assign, Const, Decl, Loop, OpCall, Select, Store, Var, linear
from .base import Strategy, register, worth_threads


class ArgReduce(Strategy):
    name = "argreduce"
    grows = False

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.ArgReduce)

    def node_flops(self, n) -> int:
        return n.inputs[0].type.numel()

    def cpu_knobs(self, k) -> dict:
        return {"parallel": k.output.type.numel() >= 2 and
                worth_threads(k.inputs[0].type.numel())}

    def lower_cpu(self, k, code):
        return lower_argreduce(k, code)

    def lower_gpu(self, k, code, target, knobs):
        return grid_from_cpu_nests(self.lower_cpu(k, code), knobs)


register(ArgReduce())


def lower_argreduce(k: Kernel, code):
    names = Names()
    x = k.inputs[0]
    xd = x.type.dtype
    shape = list(x.type.shape)
    axis = k.attrs["axis"]
    if axis is None:
        kept_ext, kept_in, kept_out, red_ext, red_in = [], [], [], [x.type.numel()], [1]
    else:
        kept_ext, kept_in, kept_out, red_ext, red_in = axis_groups(shape, {axis})
    outer, inner, kvars = nest(kept_ext, names, k.knobs.get("parallel"), False)
    base = linear(kvars, kept_in)
    bi, bv, v, better = names("best_i"), names("best_v"), names("v"), names("better")
    body = [Decl(bi, dt.int64, Const(0)), Decl(bv, xd, read(x, base))]
    if red_ext:
        r = names("r")
        loop = Loop(r, red_ext[0], "serial", [
            Decl(v, xd, read(x, linear([*kvars, Var(r)], kept_in + red_in))),
            Decl(better, dt.bool_, OpCall(k.op, "better", (), xd, dt.bool_, (Var(v), Var(bv)))),
            Assign(bv, Select(Var(better), Var(v), Var(bv))),
            Assign(bi, Select(Var(better), Var(r), Var(bi)))])
        body.append(loop)
    body.append(Store(k.output.name, linear(kvars, kept_out), Var(bi)))
    return finish(k, inner, outer, body)
