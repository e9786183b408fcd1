"""attention: softmax(scale * q @ k^T + mask [causal]) @ v, one task per (batch, block of
queries), each one call of the attention routine (routines/c_attention.py on the CPU,
routines/gpu_attention.py on GPUs), which streams the keys in blocks with an online softmax, so
the Sq x Sk scores never exist. Its operands are read from memory, views of them in place where
their rows are contiguous.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ... import dtypes as dt
from ...errors import ArgumentError, DTypeError
from ...ops import registry as R
from ...runtime import targets
from ..dynamic import representative
from ..emit import (Names, batch_strides, contiguous, idx_div, idx_min, idx_mod, launch_of,
                    operand, unflatten)
from ..groups import Group, is_view, unit_inner_stride
from ..schedule_ir import Kernel
from ..spelling import libm
from ..tile_ir import Addr, Barrier, Bin, Call, Const, Decl, Loop, Var, idx_mul, linear
from .base import PARALLEL_MIN_FLOPS, Strategy, register
from .routines import c_attention, gpu_attention


class AttentionStrategy(Strategy):
    name = "attention"
    fuses_views = False
    knobs = ("block_q",)
    aliases = {"BM": "block_q"}
    routines = {"attention": "ts_attention_block_{S}"}

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Attention)

    def start(self, n) -> Group:
        return Group(self.name, n, tuple(n.out.type.shape), anchor=n)

    def absorb_operand(self, grp, p) -> bool:
        return is_view(p) and unit_inner_stride(p)

    def node_flops(self, n) -> int:
        """q @ k^T and p @ v, plus the softmax."""
        q, kk, v = n.inputs[:3]
        rows = n.out.type.numel() // max(1, v.type.shape[-1])
        return rows * kk.type.shape[-2] * (2 * q.type.shape[-1] + 2 * v.type.shape[-1] + 5)

    def cpu_knobs(self, k) -> dict:
        """block_q halved until the problem has MIN_TASKS tasks (both cores get work)."""
        shape = [representative(d) for d in k.group.anchor.out.type.shape]   # (see contract)
        heads = 1
        for e in shape[:-2]:
            heads *= e
        bq = c_attention.DEFAULT_BLOCKS["block_q"]
        while bq > 16 and heads * -(-shape[-2] // bq) < c_attention.MIN_TASKS:
            bq //= 2
        return {"parallel": representative(k.flops) >= PARALLEL_MIN_FLOPS, "block_q": bq}

    def gpu_knobs(self, k, target) -> dict:
        anchor = k.group.anchor
        t = targets.of(target)
        bq, threads = gpu_attention.DEFAULT_KNOBS[t.knob_table][anchor.inputs[0].type.dtype.short]
        sq = anchor.out.type.shape[-2]
        while bq > 16 and bq >= 2 * sq:
            bq //= 2
        return {"block_q": bq, "threads": threads}

    def user_knobs(self, schedule) -> dict:
        out = super().user_knobs(schedule)
        if schedule.block is not None:
            out["block_q"] = schedule.block[0]
        return out

    def space(self, k) -> dict:
        return {"block_q": [16, 32, 64, 128]}

    def invalid(self, k, knobs) -> str | None:
        sq = k.group.anchor.out.type.shape[-2]
        if knobs["block_q"] >= 2 * max(sq, 16) and knobs["block_q"] != k.knobs.get("block_q"):
            return f"block_q={knobs['block_q']} exceeds the queries"
        return None

    def lower_cpu(self, k, code):
        return lower_attention(k, code)

    def lower_gpu(self, k, code, target, knobs):
        return gpu_attention_blocks(k, code, target, knobs)

    def c_routine(self, name, dtype):
        exp = libm.F32["exp"] if dtype == "f32" else libm.F64["exp"]
        return [*exp, c_attention.attention_source(dtype)]

    def c_half_routine(self, name):
        return c_attention.HALF_ROUTINE

    def gpu_routine(self, lang, name, dtype, sizes):
        exp = libm.F32["exp"] if dtype != "f64" else libm.F64["exp"]
        return [*exp, *gpu_attention.attention_routine(lang, dtype, *sizes)[1]]


register(AttentionStrategy())


def lower_attention(k: Kernel, code):
    """One task per (batch, block of queries); the routine streams keys in blocks with an online
    softmax, so the Sq x Sk scores never exist."""
    d = k.output.type.dtype
    task = attention_task(k, Names(), k.knobs.get("block_q", 64))
    body = task.decls + [Call(f"ts_attention_block_{d.short}", task.args, f"attention:{d.short}",
                              code if d.is_narrow else 0)]     # 16-bit: widened scratch (c.py)
    return [Loop(task.var, task.tasks, "parallel" if k.knobs.get("parallel") else "serial", body)]


def attention_task(k: Kernel, names, block_q: int) -> SimpleNamespace:
    """One (batch, block of queries) task of attention: its variable `var` over `tasks`, the
    statement placing it (q0) and the routine's arguments (those of ts_attention_block_*)."""
    n = k.group.anchor
    q, kk, v, mask = n.inputs
    out = list(n.out.type.shape)
    batch, Sq, Dv = out[:-2], out[-2], out[-1]
    Sk, D = kk.type.shape[-2], q.type.shape[-1]
    d = k.output.type.dtype
    bq = min(block_q, max(Sq, 1))
    nqb = -(-Sq // bq)
    nb = 1
    for e in batch:
        nb *= e
    t = names("task")
    bidx = unflatten(idx_div(Var(t), nqb), batch) if batch else []
    q0 = names("q0")
    args = []
    for val in (q, kk, v):
        b, off, st = operand(k, val)
        base = linear(bidx, batch_strides(list(val.type.shape), st, batch), off)
        args += [Addr(b.name, base), Const(st[-2])]
    if mask.id in k.reads and k.reads[mask.id].role == "inline":
        args += [Addr(None), Const(0), Const(0)]
        if not np.isfinite(k.reads[mask.id].data):
            raise ArgumentError("attention's mask is a single non-finite number: every key would "
                                "be masked", location=k.group.anchor.loc, op="attention",
                                hint="pass a mask with 0 where a key is kept")
    else:
        b, off, st = operand(k, mask)
        if b.type.dtype != d:       # the routines read the mask as d: other bits would be garbage
            raise DTypeError(f"attention's mask is {b.type.dtype.name}, but q, k and v compute in "
                             f"{d.name}", location=n.loc, op="attention",
                             received=b.type.dtype.name, expected=d.name,
                             hint=f"op.cast(mask, dtype='{d.name}')")
        full = list(mask.type.shape)
        pad = len(out) - len(full)
        st = [0] * pad + [0 if full[i] == 1 else st[i] for i in range(len(full))]
        args += [Addr(b.name, linear(bidx, st[:-2], off)), Const(st[-2]), Const(st[-1])]
    obase = linear(bidx, contiguous(batch + [Sq, Dv])[:-2])
    args += [Addr(k.output.name, obase), Const(Dv), Var(q0),
             idx_min(Const(bq), Bin("-", Const(Sq), Var(q0))), Const(Sk), Const(D), Const(Dv),
             Const(n.attrs["scale"], d), Const(int(n.attrs["causal"])), Const(Sk - Sq)]
    decls = [Decl(q0, dt.int64, idx_mul(idx_mod(Var(t), nqb), Const(bq)))]
    return SimpleNamespace(var=t, tasks=nb * nqb, decls=decls, args=tuple(args), block_q=bq)


def gpu_attention_blocks(k: Kernel, code, target, knobs):
    """One block per (batch, query block) calling the GPU routine."""
    threads = knobs["threads"]
    task = attention_task(k, Names(), knobs["block_q"])
    d = k.output.type.dtype.short
    fn, _ = gpu_attention.attention_routine(targets.of(target).language, d, knobs["block_q"],
                                            threads)                # nq <= block_q
    body = task.decls + [Call(fn, task.args, f"attention:{d}:{knobs['block_q']}:{threads}"),
                         Barrier()]         # the routine's shared memory is free again after it
    return [Loop(task.var, task.tasks, "block", body)], launch_of(task.tasks, threads, per_block=True)
