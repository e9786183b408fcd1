"""concat: each input copied into its region of the output along an axis, alone. CPU: a loop
nest per operand (one buffer may be concatenated twice). GPU: those nests on the grid.
"""
from __future__ import annotations

from ...ops import registry as R
from ..emit import Names, coalesce, contiguous, finish, grid_from_cpu_nests, nest, read
from ..schedule_ir import Kernel
from ..tile_ir import Cast, Store, linear
from .base import Strategy, register


class ConcatStrategy(Strategy):
    name = "concat"
    grows = False

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Concat)

    def lower_cpu(self, k, code):
        return lower_concat(k, code)

    def lower_gpu(self, k, code, target, knobs):
        return grid_from_cpu_nests(self.lower_cpu(k, code), knobs)


register(ConcatStrategy())


def lower_concat(k: Kernel, code):
    names = Names()
    out = k.output.type
    axis = k.attrs["axis"]
    ocs = contiguous(out.shape)
    stmts, offset = [], 0
    for v in k.group.root.inputs:       # per operand: one buffer may be concatenated twice
        b = k.reads[v.id]
        shape = list(b.type.shape)
        ext, (is_, os_) = coalesce(shape, [contiguous(shape), list(ocs)])
        loops, inner, vars_ = nest(ext, names, k.knobs.get("parallel"), k.knobs.get("simd"))
        st = Store(k.output.name, linear(vars_, os_, offset * ocs[axis]),
                   Cast(out.dtype, read(b, linear(vars_, is_))))
        stmts += finish(k, inner, loops, [st])
        offset += b.type.shape[axis]
    return stmts
