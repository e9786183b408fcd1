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


class GatherStrategy(Strategy):
    name = "gather"
    grows = False

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Gather)

    def lower_cpu(self, k, code):
        return lower_gather(k, code)

    def lower_gpu(self, k, code, target, knobs):
        return gpu_gather(k, code, target, knobs)


register(GatherStrategy())


def gather_shape(k: Kernel):
    """(P, n, R, Q): the table as [P, n, R] around the gathered axis, Q indices (for a
    scatter, the target and its indices: inputs 0 and 1 as well)."""
    x, idx = k.inputs[:2]
    axis = k.attrs["axis"]
    xs = list(x.type.shape)
    return prod(xs[:axis]), xs[axis], prod(xs[axis + 1:]), idx.type.numel()


def load_index(k: Kernel, q, iv: str, code: int) -> list:
    """Index q of the indices, into `iv`: wrapped once if negative, checked against the axis
    (a bad one reports `code` and reads row 0)."""
    idx = k.inputs[1]
    return [Decl(iv, dt.int64, Cast(dt.int64, read(idx, q))),
            CheckIndex(iv, gather_shape(k)[1], code)]


def gathered(k: Kernel, p, iv: str, r):
    """The read of x[p, iv, r], the table seen as [P, n, R] (the same arithmetic on every
    target)."""
    _, n, R, _ = gather_shape(k)
    return read(k.inputs[0], idx_add(idx_mul(idx_add(idx_mul(p, Const(n)), Var(iv)), Const(R)), r))


def lower_gather(k: Kernel, code):
    names = Names()
    P, _, R, Q = gather_shape(k)
    # one index load and bounds check per gathered row, then the row is copied
    outer, inner, (p, q) = nest_keep([P, Q], names, k.knobs.get("parallel"), False)
    iv = names("idx")
    r = Var(names("r")) if R != 1 else Const(0)
    value = gathered(k, p, iv, r)
    dst = idx_add(idx_mul(idx_add(idx_mul(p, Const(Q)), q), Const(R)), r)
    copy = Store(k.output.name, dst, value)
    if R != 1:
        copy = Loop(r.name, R, "vector" if k.knobs.get("simd") else "serial", [copy])
    return finish(k, inner, outer, load_index(k, q, iv, code) + [copy])


def gpu_gather(k: Kernel, code, target, knobs):
    """out[p, q, r] = x[p, idx[q], r]: one thread per output element, each checking its index
    (a bad one stores the kernel's code in *ts_status and reads row 0)."""
    names = Names()
    P, _, R, Q = gather_shape(k)
    g, iv = names("g"), names("idx")
    p, q, r = split_index(Var(g), [P, Q, R])
    value = gathered(k, p, iv, r)
    body = load_index(k, q, iv, code) + [Store(k.output.name, Var(g), value)]
    total = P * Q * R
    return [Loop(g, total, "grid", body)], launch_of(total, knobs["threads"])
