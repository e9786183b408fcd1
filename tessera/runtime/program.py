"""A program as the runtime runs it, the same way on every target: a table of buffers (the
caller's inputs, constants, outputs and temporaries) and a list of steps over it.

Steps today are kernel launches (`Launch`); collectives, host loops and loads of saved
artifacts are to come, each a step of its own. A target's executor says how launches run: the
CPU (runtime/cpu.py) runs a program's launches in one call of its C entry point (calling into
C once per kernel would cost what a small kernel does), a GPU (runtime/gpu.py) launches each
through CuPy. What is the same everywhere lives here: the steps, the plan of the buffer table,
the results handed back, and what a kernel's status code means.

A program here is anything with the compiler's IR levels (`graph_ir`, `schedule_ir`,
`tile_ir`): the runtime reads them and imports nothing of the compiler.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ResourceError, RuntimeFault


@dataclass(frozen=True)
class Launch:
    """Run kernel `kernel` of the program on the buffers named `args`, in order."""
    kernel: str
    args: tuple


def steps_of(tile_program) -> list:
    """The steps of a tile program: its kernel launches in order."""
    return [Launch(name, tuple(args)) for name, args in tile_program.calls]


def launches_only(steps) -> bool:
    return all(isinstance(s, Launch) for s in steps)


def buffer_plan(buffers) -> list:
    """Per runtime buffer, where its memory comes from: ("input", k), ("const", array) or
    ("alloc", shape, dtype, poison value, buffer) or ("temp", slot, ...same). Worked out once
    per program."""
    plan = []
    for b in buffers:
        if b.role == "input":
            plan.append(("input", b.param))
        elif b.role == "const":
            plan.append(("const", b.data))
        else:
            d = b.type.dtype
            kind = "temp" if b.slot is not None else "alloc"
            plan.append((kind, tuple(b.type.shape), d.np, d.poison, b))
    return plan


def results(program, buffers: dict, xp) -> list:
    """The outputs, in order, from a run's buffers by name (xp: NumPy or CuPy). A 0-d constant
    becomes an array; an input, a constant or a buffer returned twice is copied, so no caller's
    or shared array is handed out."""
    out, seen = [], set()
    for b in program.schedule_ir.outputs:
        if b.role == "inline":
            arr = xp.array(b.data)
        else:
            arr = buffers[b.name]
            if b.role in ("input", "const") or b.name in seen:
                arr = arr.copy()
        seen.add(b.name)
        out.append(arr)
    return out


def status_error(program, code: int) -> RuntimeFault:
    """The error a kernel's nonzero status code stands for: its position + 1 (a bad index),
    negated (a routine without scratch memory)."""
    kernels = program.schedule_ir.kernels
    if 1 <= -code <= len(kernels):     # a routine found no scratch memory
        k = kernels[-code - 1]
        return ResourceError(f"{k.name} could not allocate its scratch memory",
                             function=program.graph_ir.name, location=k.fuses[0].loc,
                             op=k.fuses[0].op, hint="free memory, or use smaller shapes")
    if not 1 <= code <= len(kernels):
        return RuntimeFault(f"a kernel set its status to {code}, which names no kernel",
                            function=program.graph_ir.name)
    k = kernels[code - 1]
    node = k.fuses[0]
    return RuntimeFault(f"an index is out of range in {k.name} (graph node "
                        f"{node.origin or node.op})", function=program.graph_ir.name,
                        location=node.loc, op=node.op,
                        hint="indices must lie in [-n, n) for an axis of size n")


def no_memory(program, b) -> ResourceError:
    """The error for a buffer the runtime could not allocate."""
    node = next(k.fuses[0] for k in program.schedule_ir.kernels if b in k.outputs)
    return ResourceError(f"cannot allocate {b.nbytes / 2**30:.1f} GiB for {b.name}, the "
                         f"result of {node.origin or node.op}", function=program.graph_ir.name,
                         location=node.loc, op=node.op, received=str(b.type),
                         hint="use smaller shapes, or reduce inside the function so the large "
                              "result is never materialised")
