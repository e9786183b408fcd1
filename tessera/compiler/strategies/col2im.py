"""col2im: the windows' adjoint (the pools' gradients, a strided transposed convolution's last
step) with its elementwise epilogue.

On the CPU a fixed grid of tasks of whole planes (one channel of one image; small planes
several to a task), each one call of the col2im routine (routines/c_pool.py: each image row
summed over the kernel offsets in order from the windows' cotangent where it lies) and then the
epilogue over its planes. GPUs sum an element per thread. Either way each element is the sum
over the offsets in order of what each offset's slice puts there (+0 where it puts nothing):
the bits of the chain of placed slices the operator decomposes into (ops/conv.py), which other
dtypes and symbolic shapes run.
"""
from __future__ import annotations

import math

from ... import dtypes as dt
from ...ops import registry as R
from ..dynamic import representative
from ..emit import idx_div, idx_min, idx_mod, launch_of, read, split_index, unflatten
from ..tile_ir import Addr, Assign, Bin, Call, Const, Decl, Loop, OpCall, Select, Store, Var, \
    idx_add, idx_mul
from .base import PARALLEL_MIN_FLOPS, register
from .conv import _epilogue_loops, _kernel_parts
from .pool import TASK_OUTPUTS, PoolStrategy, _epilogue
from .routines import c_pool


def geometry(n) -> dict:
    """col2im's sizes (cols [N, C, K, *out] into [N, C, *in]), its spatial axes padded in front
    to three."""
    c, a = n.inputs[0].type.shape, n.attrs
    lead = 3 - (len(c) - 3)
    pad3 = lambda v, fill: [fill] * lead + list(v)      # noqa: E731
    return {"N": c[0], "C": c[1], "in": pad3(a["image"], 1), "k": pad3(a["kernel"], 1),
            "out": pad3(c[3:], 1), "s": pad3(a["stride"], 1), "d": pad3(a["dilation"], 1),
            "p": pad3([lo for lo, _ in a["padding"]], 0), "P": math.prod(c[3:]),
            "KK": math.prod(a["kernel"]), "I": math.prod(a["image"])}


class Col2ImStrategy(PoolStrategy):
    """The pool strategy's grouping and plane tasks, with a routine of its own."""
    name = "col2im"
    routines = {"col2im": "ts_col2im_tile_{S}"}

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Col2Im)

    def node_flops(self, n) -> int:
        return n.out.type.numel() * (geometry(n)["KK"] - 1)

    def cpu_knobs(self, k) -> dict:
        g = geometry(k.group.anchor)
        return {"parallel": representative(k.flops + k.bytes) >= PARALLEL_MIN_FLOPS,
                "simd": True, "tile_n": g["I"] * max(1, TASK_OUTPUTS // max(g["I"], 1))}

    def lower_cpu(self, k, code):
        return lower_col2im_planes(k)

    def lower_gpu(self, k, code, target, knobs):
        return lower_col2im_direct(k, knobs)

    def c_routine(self, name, dtype):
        return c_pool.col2im_source(dtype)


register(Col2ImStrategy())


def lower_col2im_planes(k):
    """Tasks of whole planes, tile_n // I of them each: one routine call, then the epilogue."""
    names, em, grp, n, g, d, (X, x_off) = _kernel_parts(k, geometry)
    merged = _epilogue_loops(em, g)
    NC, I, KP = g["N"] * g["C"], g["I"], g["KK"] * g["P"]
    per = max(1, k.knobs["tile_n"] // max(I, 1))
    t, first, count = names("task"), names("plane"), names("planes")
    geo = [Const(v) for key in ("in", "k", "out", "s", "d", "p") for v in g[key]]
    decls = [Decl(first, dt.int64, idx_mul(Var(t), Const(per))),
             Decl(count, dt.int64, idx_min(Const(per), Bin("-", Const(NC), Var(first))))]
    args = (Addr(X.name, idx_add(Const(x_off), idx_mul(Var(first), Const(KP)))),
            Addr(k.output.name, idx_mul(Var(first), Const(I))), *geo, Var(count), Const(KP),
            Const(I))
    body = decls + [Call(f"ts_col2im_tile_{d.short}", args, f"col2im:{d.short}")]
    if grp.root is not grp.anchor:
        _epilogue(k, em, grp, Var(first), Var(count), Const(0), I, names, merged, body)
    tasks = -(-NC // per)
    return [Loop(t, tasks, "parallel" if k.knobs.get("parallel") else "serial", body)]


def lower_col2im_direct(k, knobs):
    """GPUs: an image element per thread, summed over the kernel offsets in order (the first
    offset's value, then each one's added: +0 where its slice does not reach), then the
    epilogue at that element."""
    names, em, grp, n, g, d, (X, x_off) = _kernel_parts(k, geometry)
    em.loops = [[a] for a in range(len(grp.domain))]
    NC, I, P = g["N"] * g["C"], g["I"], g["P"]
    e = names("e")
    plane, pos = split_index(Var(e), [NC, I])
    acc, kv = names("acc"), names("k")
    taps = unflatten(Var(kv), g["k"])
    inside, where = None, Const(0)
    for i, q, s, dd, p, m in zip(unflatten(pos, g["in"]), taps, g["s"], g["d"], g["p"],
                                 g["out"]):
        t = Bin("-", idx_add(i, Const(p)), idx_mul(q, Const(dd)))      # o * s, if it is one
        test = Bin("&&", Bin(">=", t, Const(0)), Bin("<", t, Const(m * s)))
        if s > 1:
            test = Bin("&&", test, Bin("==", idx_mod(t, s), Const(0)))
        inside = test if inside is None else Bin("&&", inside, test)
        where = idx_add(idx_mul(where, Const(m)), idx_div(t, s) if s > 1 else t)
    at = idx_add(Const(x_off), idx_add(idx_mul(idx_add(idx_mul(plane, Const(g["KK"])), Var(kv)),
                                               Const(P)), where))
    v = Select(inside, read(X, at), Const(0.0, d))
    add = OpCall("add", "elem", (), d, d, (Var(acc), v))
    body = [Decl(acc, d, Const(0.0, d)),
            Loop(kv, g["KK"], "serial", [Assign(acc, Select(Bin("==", Var(kv), Const(0)), v,
                                                            add))]),
            Store(k.output.name, Var(e), Var(acc))]
    if grp.root is not grp.anchor:
        point = {0: idx_div(plane, g["C"]), 1: idx_mod(plane, g["C"])} | {
            2 + q: v for q, v in enumerate(unflatten(pos, list(grp.domain[2:])))}
        tail = []
        value = em.value(grp.root.out, grp.maps[grp.root.out.id], tail, point)
        body += tail + [Store(k.output.name, em.out_index(point), value)]
    total = NC * I
    return [Loop(e, total, "grid", body)], launch_of(total, knobs["threads"])
