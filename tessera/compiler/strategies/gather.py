"""gather: out[p, q, r] = x[p, idx[q], r] with a bounds check per index that reports (the
kernel's code in the status word) instead of crashing, alone. CPU: one index load and check per
gathered row, then the row copied. GPU: one thread per output element, each checking its index.
"""
from __future__ import annotations

from ... import dtypes as dt
from ...ops import registry as R
from ..emit import Names, finish, launch_of, nest_keep, prod, read, split_index
from ..schedule_ir import Kernel
from ..tile_ir import Cast, CheckIndex, Const, Decl, Loop, Store, Var, idx_add, idx_mul
from .base import Strategy, register


class Gather(Strategy):
    name = "gather"
    grows = False

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Gather)

    def lower_cpu(self, k, code):
        return lower_gather(k, code)

    def lower_gpu(self, k, code, target, knobs):
        return gpu_gather(k, code, target, knobs)


register(Gather())


def lower_gather(k: Kernel, code):
    names = Names()
    x, idx = k.inputs
    axis = k.attrs["axis"]
    xs = list(x.type.shape)
    P = 1
    for d in xs[:axis]:
        P *= d
    n = xs[axis]
    Rn = 1
    for d in xs[axis + 1:]:
        Rn *= d
    Q = idx.type.numel()
    # one index load and bounds check per gathered row, then the row is copied
    outer, inner, (p, q) = nest_keep([P, Q], names, k.knobs.get("parallel"), False)
    iv = names("idx")
    r = Var(names("r")) if Rn != 1 else Const(0)
    src = idx_add(idx_mul(idx_add(idx_mul(p, Const(n)), Var(iv)), Const(Rn)), r)
    dst = idx_add(idx_mul(idx_add(idx_mul(p, Const(Q)), q), Const(Rn)), r)
    copy = Store(k.output.name, dst, read(x, src))
    if Rn != 1:
        copy = Loop(r.name, Rn, "vector" if k.knobs.get("simd") else "serial", [copy])
    stmts = [Decl(iv, dt.int64, Cast(dt.int64, read(idx, q))), CheckIndex(iv, n, code), copy]
    return finish(k, inner, outer, stmts)


def gpu_gather(k: Kernel, code, target, knobs):
    """out[p, q, r] = x[p, idx[q], r]: one thread per output element, each checking its index
    (a bad one stores the kernel's code in *ts_status and reads row 0)."""
    names = Names()
    x, idx = k.inputs
    axis = k.attrs["axis"]
    xs = list(x.type.shape)
    P, n, Rn, Q = prod(xs[:axis]), xs[axis], prod(xs[axis + 1:]), idx.type.numel()
    g, iv = names("g"), names("idx")
    p, q, r = split_index(Var(g), [P, Q, Rn])
    src = idx_add(idx_mul(idx_add(idx_mul(p, Const(n)), Var(iv)), Const(Rn)), r)
    body = [Decl(iv, dt.int64, Cast(dt.int64, read(idx, q))), CheckIndex(iv, n, code),
            Store(k.output.name, Var(g), read(x, src))]
    total = P * Q * Rn
    return [Loop(g, total, "grid", body)], launch_of(total, knobs["threads"])
