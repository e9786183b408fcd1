"""argreduce: the index of the first element that wins (argmax, argmin; NaN wins, as in NumPy),
with its elementwise prologue (argmax(cast(mask)) reads the mask: the cast is never stored).
CPU: a loop per output over its reduced elements in order. GPU: that nest on the grid.
"""
from __future__ import annotations

from ... import dtypes as dt
from ...ops import registry as R
from ..emit import finish, grid_from_cpu_nests, loop_nest, prod, reduction_plan
from ..groups import Group, identity_map
from ..schedule_ir import Kernel
from ..tile_ir import Assign, Const, Decl, OpCall, Select, Store, Var, linear
from .base import Strategy, register, worth_threads


class ArgReduceStrategy(Strategy):
    name = "argreduce"

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.ArgReduce)

    def start(self, n) -> Group:
        """The group over the input's shape: its reduced axes (every axis when axis is None),
        and the output's map onto them (kept axes; reduced ones, kept as 1, map to none)."""
        domain = tuple(n.inputs[0].type.shape)
        axis = n.attrs["axis"]
        red = tuple(range(len(domain))) if axis is None else (axis,)
        grp = Group(self.name, n, domain, red)
        if not n.attrs["keepdim"]:
            out = tuple(None if domain[a] == 1 else a for a in range(len(domain)) if a not in red)
        else:
            out = tuple(None if a in red or domain[a] == 1 else a for a in range(len(domain)))
        grp.maps[n.out.id] = out
        return grp

    def node_flops(self, n) -> int:
        return n.inputs[0].type.numel()

    def cpu_knobs(self, k) -> dict:
        return {"parallel": k.output.type.numel() >= 2 and worth_threads(prod(k.group.domain))}

    def lower_cpu(self, k, code):
        return lower_argreduce(k, code)

    def lower_gpu(self, k, code, target, knobs):
        return grid_from_cpu_nests(self.lower_cpu(k, code), knobs)


register(ArgReduceStrategy())


def lower_argreduce(k: Kernel, code):
    """Per output: the best so far starts at the first reduced element, then every reduced
    element in row-major order is compared with it (r, its flat index among them, is the
    answer's)."""
    em, kept_ids, red_ids = reduction_plan(k)
    names = em.names
    n = k.group.root
    x = n.inputs[0]
    xm, xd = identity_map(x.type.shape), x.type.dtype
    outer, inner, idx = loop_nest(em, kept_ids, k.knobs.get("parallel"), False)
    body = []
    bi, bv = names("best_i"), names("best_v")
    first = em.value(x, xm, body, {**idx, **{lid: Const(0) for lid in red_ids}})
    body += [Decl(bi, dt.int64, Const(0)), Decl(bv, xd, first)]
    if red_ids:
        r_outer, r_body, ridx = loop_nest(em, red_ids, False, False)
        extents = [em.extent(lid) for lid in red_ids]
        strides = [prod(extents[q + 1:]) for q in range(len(extents))]
        r = linear([ridx[lid] for lid in red_ids], strides)
        v, better = names("v"), names("better")
        r_body += [Decl(v, xd, em.value(x, xm, r_body, {**idx, **ridx})),
                   Decl(better, dt.bool_, OpCall(n.op, "better", (), xd, dt.bool_,
                                                 (Var(v), Var(bv)))),
                   Assign(bv, Select(Var(better), Var(v), Var(bv))),
                   Assign(bi, Select(Var(better), r, Var(bi)))]
        body += r_outer
    body.append(Store(k.output.name, em.out_index(idx), Var(bi)))
    return finish(k, inner, outer, body)
