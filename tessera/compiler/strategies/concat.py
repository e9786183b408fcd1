"""concat: each input copied into its region of the output along an axis, alone; a constant pad
likewise, its input into the interior and the value into each slab of the border. CPU: a loop
nest per operand (one buffer may be concatenated twice) or slab. GPU: those nests on the grid.
"""
from __future__ import annotations

from ...ops import registry as R
from ..emit import Names, coalesce, contiguous, finish, grid_from_cpu_nests, nest, read
from ..schedule_ir import Kernel
from ..tile_ir import Cast, Const, Store, linear
from .base import Strategy, register


class ConcatStrategy(Strategy):
    name = "concat"
    grows = False

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, (R.Concat, R.Pad))

    def lower_cpu(self, k, code):
        if isinstance(k.group.root.opdef.lowering, R.Pad):
            return lower_pad(k)
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


def lower_pad(k: Kernel):
    """The input into the interior, then along each axis in turn the slabs before and after it
    (their extent inside the interior along the axes before, whole along those after)."""
    names = Names()
    out = k.output.type
    x = k.reads[k.group.root.inputs[0].id]
    pads = k.attrs["pads"]
    ocs = contiguous(out.shape)
    parts = [(list(x.type.shape), sum(lo * s for (lo, _), s in zip(pads, ocs)), x)]
    for a, (lo, hi) in enumerate(pads):
        inner = [n for n in x.type.shape[:a]]
        at = sum(p[0] * s for p, s in zip(pads[:a], ocs))
        for start, size in ((0, lo), (lo + x.type.shape[a], hi)):
            if size:
                parts.append((inner + [size] + list(out.shape[a + 1:]), at + start * ocs[a],
                              None))
    stmts = []
    value = Const(k.attrs["value"], out.dtype)
    for shape, offset, src in parts:
        ext, (os_, is_) = coalesce(shape, [list(ocs), contiguous(shape)])
        loops, inner, vars_ = nest(ext, names, k.knobs.get("parallel"), k.knobs.get("simd"))
        st = Store(k.output.name, linear(vars_, os_, offset),
                   value if src is None else read(src, linear(vars_, is_)))
        stmts += finish(k, inner, loops, [st])
    return stmts
