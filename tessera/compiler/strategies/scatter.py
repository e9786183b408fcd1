"""scatter: out = target, then out[p, idx[q], r] += src[p, q, r] for q in order (scatter_add),
alone. Each column (p, r) of the output is owned by one loop iteration or thread, which copies
its part of the target and then adds its sources in index order: repeated indices add up in
the same order on every target, without atomics. Indices are checked as the gather checks them.
CPU: the p lines in parallel, r the vector lanes. GPU: a thread per (p, r).
"""
from __future__ import annotations

from ...ops import registry as R
from ..emit import Names, finish, launch_of, nest_keep, read, split_index
from ..tile_ir import Bin, Const, Load, Loop, Store, Var, idx_add, idx_mul
from .base import Strategy, register, worth_threads
from .gather import gather_shape, load_index


class ScatterStrategy(Strategy):
    name = "scatter"
    grows = False

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Scatter)

    def node_flops(self, n) -> int:
        return n.inputs[2].type.numel()

    def cpu_knobs(self, k) -> dict:
        return {"parallel": gather_shape(k)[0] >= 2 and
                worth_threads(k.inputs[2].type.numel())}

    def lower_cpu(self, k, code):
        names = Names()
        P, n, Rr, Q = gather_shape(k)       # the target as [P, n, R] around the axis, Q indices
        outer, inner, (p,) = nest_keep([P], names, k.knobs.get("parallel"), False)
        j, q, r, iv = names("j"), names("q"), names("r"), names("idx")
        base = idx_mul(p, Const(n * Rr))
        body = [Loop(j, n * Rr, "vector", [
            Store(k.output.name, idx_add(base, Var(j)), read(k.inputs[0], idx_add(base, Var(j))))])]
        body.append(Loop(q, Q, "serial", load_index(k, Var(q), iv, code) + [
            Loop(r, Rr, "vector", [_add(k, p, Var(q), iv, Var(r))])]))
        return finish(k, inner, outer, body)

    def lower_gpu(self, k, code, target, knobs):
        names = Names()
        P, n, Rr, Q = gather_shape(k)
        g, j, q = names("g"), names("j"), names("q")
        p, r = split_index(Var(g), [P, Rr])
        body = [Loop(j, n, "serial", [
            Store(k.output.name, _at(p, Var(j), r, n, Rr),
                  read(k.inputs[0], _at(p, Var(j), r, n, Rr)))])]
        iv = names("idx")
        body.append(Loop(q, Q, "serial", load_index(k, Var(q), iv, code) +
                         [_add(k, p, Var(q), iv, r)]))
        total = P * Rr
        return [Loop(g, total, "grid", body)], launch_of(total, knobs["threads"])


register(ScatterStrategy())


def _at(p, row, r, n, Rr):
    return idx_add(idx_mul(idx_add(idx_mul(p, Const(n)), row), Const(Rr)), r)


def _add(k, p, q, iv, r):
    """out[p, idx, r] += src[p, q, r]."""
    P, n, Rr, Q = gather_shape(k)
    dst = _at(p, Var(iv), r, n, Rr)
    src = read(k.inputs[2], idx_add(idx_mul(idx_add(idx_mul(p, Const(Q)), q), Const(Rr)), r))
    return Store(k.output.name, dst, Bin("+", Load(k.output.name, dst), src))
