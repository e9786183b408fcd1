"""A program as the runtime runs it, the same way on every target: a table of buffers (the
caller's inputs, constants, outputs and temporaries) and a list of steps over it.

Steps are kernel launches (`KernelLaunch`) and control-flow regions, which the CPU's entry point
runs as C loops and a GPU program from the host (`HostSteps`); collectives and loads of saved
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
class KernelLaunch:
    """Run kernel `kernel` of the program on the buffers named `args`, in order."""
    kernel: str
    args: tuple


def steps_of(tile_program) -> list:
    """The steps of a tile program: its kernel launches in order."""
    return [KernelLaunch(name, tuple(args)) for name, args in tile_program.calls]


def launches_only(steps) -> bool:
    return all(isinstance(s, KernelLaunch) for s in steps)


class HostSteps:
    """A GPU program's steps run from the host: kernel launches in order, and a control-flow
    region (fori_loop, while_loop, scan, cond) as a Python loop or branch around its bodies'
    launches, what the C entry point does on the CPU (compiler/target/c.py): carries copied into
    the region's result buffers, a body's parameters read in place (a slice of xs is a view of
    the step's row), the body's results copied back after each step (swaps staged), a
    predicate read back to the host (a wait for the kernels before it).

    `table`: buffer name -> array (CuPy's, or the emulator's); `launch(name, arrays)` launches
    one kernel on its arguments."""

    def __init__(self, tile_program, table: dict, launch):
        self.p, self.table, self.launch = tile_program, table, launch
        self.args = dict(tile_program.calls)
        self.phases = tile_program.phases
        self.loop = {}                  # loop variable -> its value now

    def run(self):
        if self.p.steps is None:
            for name, args in self.p.calls:
                self.launch(name, [self.named(a) for a in args])
        else:
            self.steps(self.p.steps)

    def array(self, b):
        if b.role == "alias":                   # (a reshape read in place: its shape)
            a = self.array(b.data)
            shape = tuple(b.type.shape)
            return a.reshape(shape) if b.type.is_static and tuple(a.shape) != shape else a
        if b.role == "slice":
            base, var = b.data
            return self.array(base)[self.loop[var], ...]     # (a view, even of a row of one)
        if b.role == "inline":
            return b.data
        return self.table[b.name]

    def named(self, name: str):
        b = self.p.views.get(name)
        return self.table[name] if b is None else self.array(b)

    def steps(self, steps):
        for st in steps:
            if hasattr(st, "bodies"):
                self.region(st)
            else:
                for phase in self.phases.get(st.name, (st.name,)):
                    self.launch(phase, [self.named(a) for a in self.args[phase]])

    def truth(self, b) -> bool:
        v = self.array(b)
        return bool(v.item() if hasattr(v, "item") else v)

    def set(self, dst, value):
        self.array(dst)[...] = value

    def region(self, st):
        if st.kind == "cond":
            steps, outputs = st.bodies["true" if self.truth(st.operands[0]) else "false"]
            self.steps(steps)
            for dst, src in zip(st.results, outputs):
                self.set(dst, self.array(src))
            return
        carries = st.attrs.get("carries", len(st.results))
        for dst, src in zip(st.results[:carries], st.operands[:carries]):
            self.set(dst, self.array(src))
        body, outputs = st.bodies["body"]
        if st.kind == "fori_loop":
            lo = st.attrs["lo"]
            for i in range(lo, st.attrs["hi"]):
                self.set(st.counter, i)
                for stack, c in zip(st.results[carries:], st.results[:carries]):   # save=true
                    self.array(stack)[i - lo] = self.array(c)
                self.steps(body)
                self.carry_back(st, outputs)
        elif st.kind == "while_loop":
            cond, (pred,) = st.bodies["cond"]
            while True:
                self.steps(cond)
                if not self.truth(pred):
                    break
                self.steps(body)
                self.carry_back(st, outputs)
        else:                           # scan
            n = st.attrs["length"]
            for t in (range(n - 1, -1, -1) if st.attrs["reverse"] else range(n)):
                self.loop[st.var] = t
                self.steps(body)
                for ys, y in zip(st.results[carries:], outputs[carries:]):
                    self.array(ys)[t] = self.array(y)
                self.carry_back(st, outputs)

    def carry_back(self, st, outputs):
        """As the C entry point: another carry's old value waits in its staging buffer."""
        carries = st.attrs.get("carries", len(st.results))
        for j, stage in st.staging.items():
            self.set(stage, self.array(outputs[j]))
        for j, dst in enumerate(st.results[:carries]):
            src = self.array(st.staging.get(j, outputs[j]))
            if self.array(dst) is not src:
                self.set(dst, src)


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
