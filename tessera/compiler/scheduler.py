"""Graph IR (primitive, concrete) → Schedule IR: one kernel per primitive node, knobs from
heuristics, and a cost (FLOPs, bytes) for each kernel.

The fusion issue replaces ``group`` with real fusion; everything downstream already takes a
kernel that fuses a list of nodes.
"""
from __future__ import annotations

from ..ops.registry import (ArgReduce, Concat, Contract, Elementwise, Gather, Reduce, View)
from .graph_ir import Graph
from .schedule_ir import Buffer, Kernel, Schedule

STRATEGY = {Elementwise: "pointwise", Reduce: "reduce", ArgReduce: "reduce",
            Contract: "contract", View: "copy", Concat: "concat", Gather: "gather"}

PARALLEL_MIN_ELEMENTS = 1 << 16     # below this, starting threads costs more than it saves
PARALLEL_MIN_FLOPS = 1 << 20


def build_schedule(g: Graph, target: str = "cpu") -> Schedule:
    buffers: list[Buffer] = []
    of: dict[int, Buffer] = {}
    for k, p in enumerate(g.params):
        # the compiler names every buffer itself: a user's parameter called `out0`, `int` or
        # `INFINITY` must not meet a temporary, a C keyword or a macro
        of[p.id] = Buffer(f"in{k}", p.type, "input", param=k, label=p.param_name)
        buffers.append(of[p.id])
    out_ids = {v.id: k for k, v in reversed(list(enumerate(g.outputs)))}
    kernels, n_temp, n_const = [], 0, 0
    for n in g.nodes:
        if n.op == "const":
            value = n.attrs["value"]
            if value.ndim == 0:
                b = Buffer(f"lit{n_const}", n.out.type, "inline", value)
            else:
                b = Buffer(f"c{n_const}", n.out.type, "const", value)
            n_const += 1
        elif n.out.id in out_ids:
            b = Buffer(f"out{out_ids[n.out.id]}", n.out.type, "output")
        else:
            b = Buffer(f"t{n_temp}", n.out.type, "temp")
            n_temp += 1
        of[n.out.id] = b
        buffers.append(b)
        if n.op == "const":
            continue
        lowering = n.opdef.lowering
        if lowering is None:
            raise NotImplementedError(f"{n.op} has neither a lowering nor a decomposition")
        k = Kernel(name=f"k{len(kernels)}_{n.op}", strategy=STRATEGY[type(lowering)], op=n.op,
                   attrs=dict(n.attrs), inputs=[of[v.id] for v in n.inputs], output=b, fuses=[n])
        k.flops = kernel_flops(k, lowering)
        k.bytes = sum(x.nbytes for x in k.inputs if x.role != "inline") + b.nbytes
        k.knobs = default_knobs(k)
        kernels.append(k)
    outputs = [of[v.id] for v in g.outputs]
    return Schedule(g.name, g.bindings, target, buffers, kernels, outputs)


def kernel_flops(k: Kernel, lowering) -> int:
    out = k.output.type
    if isinstance(lowering, Elementwise):
        return out.numel() * lowering.flops
    if isinstance(lowering, (Reduce, ArgReduce)):
        return k.inputs[0].type.numel()
    if isinstance(lowering, Contract):
        a = k.inputs[0].type
        return 2 * out.numel() * a.shape[-1]
    return 0


def default_knobs(k: Kernel) -> dict:
    out = k.output.type
    if k.strategy == "contract":
        return {"parallel": k.flops >= PARALLEL_MIN_FLOPS, "simd": True}
    if k.strategy == "reduce":
        rows = out.numel()
        return {"parallel": rows >= 2 and k.inputs[0].type.numel() >= PARALLEL_MIN_ELEMENTS}
    return {"parallel": out.numel() >= PARALLEL_MIN_ELEMENTS, "simd": True}
