"""scatter: out = target, then out[p, idx[q], r] += src[p, q, r] for q in order (scatter_add),
alone. Each column (p, r) of the output is owned by one loop iteration or thread, which copies
its part of the target and then adds its sources in index order: repeated indices add up in
the same order on every target, without atomics. Indices are checked as the gather checks them.
CPU: the p lines in parallel, r the vector lanes. GPU: a thread per (p, r).
"""
from __future__ import annotations

from ... import dtypes as dt
from ...ops import registry as R
from ..emit import Names, finish, launch_of, nest_keep, prod, read, split_index
from ..tile_ir import Bin, Cast, CheckIndex, Const, Decl, Load, Loop, Store, Var, idx_add, idx_mul
from .base import PARALLEL_MIN_ELEMENTS, Strategy, register


class Scatter(Strategy):
    name = "scatter"
    grows = False

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Scatter)

    def node_flops(self, n) -> int:
        return n.inputs[2].type.numel()

    def cpu_knobs(self, k) -> dict:
        return {"parallel": _shape(k)[0] >= 2 and
                k.inputs[2].type.numel() >= PARALLEL_MIN_ELEMENTS}

    def lower_cpu(self, k, code):
        names = Names()
        P, n, Rr, Q = _shape(k)
        outer, inner, (p,) = nest_keep([P], names, k.knobs.get("parallel"), False)
        j, q, r, iv = names("j"), names("q"), names("r"), names("idx")
        base = idx_mul(p, Const(n * Rr))
        body = [Loop(j, n * Rr, "vector", [
            Store(k.output.name, idx_add(base, Var(j)), read(k.inputs[0], idx_add(base, Var(j))))])]
        body.append(Loop(q, Q, "serial", _load_index(k, Var(q), iv, code, n) + [
            Loop(r, Rr, "vector", [_add(k, p, Var(q), iv, Var(r))])]))
        return finish(k, inner, outer, body)

    def lower_gpu(self, k, code, target, knobs):
        names = Names()
        P, n, Rr, Q = _shape(k)
        g, j, q = names("g"), names("j"), names("q")
        p, r = split_index(Var(g), [P, Rr])
        body = [Loop(j, n, "serial", [
            Store(k.output.name, _at(p, Var(j), r, n, Rr),
                  read(k.inputs[0], _at(p, Var(j), r, n, Rr)))])]
        iv = names("idx")
        body.append(Loop(q, Q, "serial", _load_index(k, Var(q), iv, code, n) +
                         [_add(k, p, Var(q), iv, r)]))
        total = P * Rr
        return [Loop(g, total, "grid", body)], launch_of(total, knobs["threads"])


register(Scatter())


def _shape(k):
    """(P, n, R, Q): the target as [P, n, R] around the axis, Q indices."""
    target, idx, _ = k.inputs
    axis, ts = k.attrs["axis"], list(target.type.shape)
    return prod(ts[:axis]), ts[axis], prod(ts[axis + 1:]), idx.type.numel()


def _at(p, row, r, n, Rr):
    return idx_add(idx_mul(idx_add(idx_mul(p, Const(n)), row), Const(Rr)), r)


def _load_index(k, q, iv, code, n) -> list:
    return [Decl(iv, dt.int64, Cast(dt.int64, read(k.inputs[1], q))), CheckIndex(iv, n, code)]


def _add(k, p, q, iv, r):
    """out[p, idx, r] += src[p, q, r]."""
    P, n, Rr, Q = _shape(k)
    dst = _at(p, Var(iv), r, n, Rr)
    src = read(k.inputs[2], idx_add(idx_mul(idx_add(idx_mul(p, Const(Q)), q), Const(Rr)), r))
    return Store(k.output.name, dst, Bin("+", Load(k.output.name, dst), src))
