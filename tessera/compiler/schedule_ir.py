"""Schedule IR: the graph cut into kernels, specialised to concrete shapes.

A kernel names its strategy (pointwise, reduce, contract, copy, gather, concat), the primitive
Graph IR nodes it fuses, the buffers it reads and writes, its knobs and its cost.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import IRVerificationError
from ..types import TensorType
from .graph_ir import format_attrs, format_value


_IDENT = re.compile(r"^[a-z][a-z0-9_]*$")     # lower case: no clash with C macros or types
VIEWS = ("inline", "alias", "slice")          # buffer roles without memory of their own


@dataclass
class Buffer:
    name: str                      # an identifier the compiler chose: safe in any target language
    type: TensorType
    role: str                      # input | output | temp | const | inline
    data: object = None            # the array of a const or inline buffer
    param: int | None = None       # inputs: which parameter of the graph
    label: str = ""                # inputs: the user's parameter name, for display
    slot: int | None = None        # temps: the memory slot the planner gave it

    @property
    def nbytes(self) -> int:
        return self.type.numel() * self.type.dtype.itemsize

    def ref(self) -> str:
        if self.role == "inline":
            return format_value(self.data)
        return f"%{self.label}" if self.role == "input" else self.name


@dataclass
class Kernel:
    name: str
    strategy: str
    op: str                        # the primitive operator (its registry entry drives lowering)
    attrs: dict
    inputs: list                   # Buffers
    output: Buffer
    fuses: list                    # primitive Graph IR nodes
    knobs: dict = field(default_factory=dict)
    flops: int = 0
    bytes: int = 0
    tuned: bool = False            # knobs came from the autotuning database
    stores: list = field(default_factory=list)   # more outputs: (Graph IR value, Buffer)
    group: object = field(default=None, repr=False)   # the fusion group (for lowering)
    reads: dict = field(default_factory=dict, repr=False)  # Graph IR value id -> Buffer read

    @property
    def outputs(self) -> list:
        """Every buffer the kernel writes: its output, then the extra stores."""
        return [self.output] + [b for _, b in self.stores]

    def fused_labels(self) -> list[str]:
        """The Graph IR operators this kernel computes: a decomposed operator once by its
        origin (%0:softmax), a user's primitive by its name."""
        out = []
        for n in self.fuses:
            name = n.origin or n.op
            if not n.origin or name not in out:
                out.append(name)
        return out


@dataclass(eq=False)
class RegionStep:
    """A control-flow operator as the program runs it: its bodies' steps inside a loop or a
    branch. `operands`: the buffers the kind reads (initial carries, xs, the predicate);
    `results`: the buffers it leaves its results in (the carries while it runs); `bodies`: role
    -> (steps, output buffers). A body reads its parameters through alias buffers (role "alias":
    `data` is the buffer it stands for; "slice": `data` is (xs buffer, loop variable), the
    step's slice of it), so no parameter is ever copied in."""
    kind: str
    operands: list
    results: list
    bodies: dict
    attrs: dict
    counter: Buffer | None = None   # fori_loop: the buffer holding i
    staging: dict = field(default_factory=dict)   # carry j -> where its new value waits when
                                                  # it is another carry's old one (a swap)
    var: str = ""                   # the loop variable of the entry point (fori_loop, scan)
    loc: object = None


class ScheduleProgram:
    """A graph's Schedule IR: its kernels (fusion groups with knobs), buffers and control flow
    (not tessera.Schedule, the user's scheduling directives)."""
    def __init__(self, name, bindings, target, buffers, kernels, outputs, steps=None):
        self.name = name
        self.bindings = dict(bindings or {})
        self.target = target
        self.buffers: list[Buffer] = buffers
        self.kernels: list[Kernel] = kernels           # every kernel, bodies' included
        self.outputs: list[Buffer] = outputs
        self.steps: list = kernels if steps is None else steps   # Kernels and RegionSteps
        self.slots: list[int] = []     # bytes of each temporary memory slot (plan_memory)

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    def verify(self):
        names = [b.name for b in self.buffers]
        if len(set(names)) != len(names):
            raise IRVerificationError(f"schedule @{self.name}: two buffers share a name")
        bad = [n for n in names if not _IDENT.match(n)]
        if bad:
            raise IRVerificationError(f"schedule @{self.name}: buffer name {bad[0]!r} is not a "
                                      "plain identifier")
        known = set(names)
        written = {b.name for b in self.buffers
                   if b.role in ("input", "const") + VIEWS}
        written |= {b.name for st in self.steps if isinstance(st, RegionStep)
                    for b in region_written(st)}
        for k in self.kernels:
            for b in k.inputs:
                if b.name not in known:
                    raise IRVerificationError(f"schedule @{self.name}: {k.name} reads unknown "
                                              f"buffer {b.name}")
                if b.name not in written:
                    raise IRVerificationError(f"schedule @{self.name}: {k.name} reads {b.name} "
                                              "before any kernel writes it")
            for out in k.outputs:
                if out.role not in ("temp", "output"):
                    raise IRVerificationError(f"schedule @{self.name}: {k.name} writes a "
                                              f"read-only buffer {out.name}")
                if not out.type.is_static:
                    raise IRVerificationError(f"schedule @{self.name}: {k.name} has a symbolic "
                                              "shape")
                written.add(out.name)
        for b in self.outputs:
            if b.name not in written:
                raise IRVerificationError(f"schedule @{self.name}: output {b.name} never written")
        return self

    def __str__(self):
        head = f"schedule @{self.name}"
        if self.bindings:
            head += " [" + ", ".join(f"{k}={v}" for k, v in self.bindings.items()) + "]"
        lines = [f"{head} target={self.target} {{"]
        for b in self.buffers:
            if b.role not in VIEWS:
                slot = f"  @slot{b.slot}" if b.slot is not None else ""
                lines.append(f"  {b.role:<6} {b.ref()}: {b.type}{slot}")
        lines += format_steps(self.steps, "  ")
        lines.append("  return " + ", ".join(b.ref() for b in self.outputs))
        lines.append("}")
        return "\n".join(lines)

    def __repr__(self):
        return f"<ScheduleProgram @{self.name}: {len(self.kernels)} kernels>"

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))



def region_written(st: RegionStep) -> list:
    """The buffers a region step writes: its results, counter and bodies' outputs (nested)."""
    out = list(st.results) + ([st.counter] if st.counter is not None else []) + \
        list(st.staging.values())
    for steps, outputs in st.bodies.values():
        out += outputs
        for inner in steps:
            if isinstance(inner, RegionStep):
                out += region_written(inner)
    return out


def body_kernels(steps) -> list:
    """The kernels inside the region steps among `steps` (at any depth)."""
    out = []
    for st in steps:
        if isinstance(st, RegionStep):
            for body, _ in st.bodies.values():
                out += [k for k in body if not isinstance(k, RegionStep)] + body_kernels(body)
    return out


def format_steps(steps, pad: str) -> list:
    lines = []
    for k in steps:
        if isinstance(k, RegionStep):
            attrs = format_attrs({a: v for a, v in k.attrs.items() if a != "carries"})
            lines.append(f"{pad}{k.kind}({', '.join(b.ref() for b in k.operands)})"
                         f"{' ' + attrs if attrs else ''} -> {', '.join(b.ref() for b in k.results)}"
                         " {")
            for role, (body, outputs) in k.bodies.items():
                lines.append(f"{pad}  {role}:")
                lines += format_steps(body, pad + "    ")
                lines.append(f"{pad}    yield " + ", ".join(b.ref() for b in outputs))
            lines.append(f"{pad}}}")
            continue
        args = ", ".join(b.ref() for b in k.inputs)
        if len(k.fuses) == 1:
            attrs = format_attrs(k.attrs)
            head = f"{k.strategy} {k.op}({args})" + (f" {attrs}" if attrs else "")
        else:
            head = f"{k.strategy}({args})"
        lines.append(f"{pad}{k.name} = {head} -> {', '.join(b.ref() for b in k.outputs)}")
        lines.append(f"{pad}     fuses {{{' '.join(k.fused_labels())}}}"
                     f"   knobs{' (tuned)' if k.tuned else ''} {format_attrs(k.knobs) or '{}'}"
                     f"   cost {{flops={k.flops:.3g}, bytes={k.bytes:.3g}}}")
    return lines


def storage(b: Buffer) -> Buffer:
    """The buffer whose memory b uses: itself, or what an alias (or a slice's xs) stands for."""
    while b.role in ("alias", "slice"):
        b = b.data[0] if b.role == "slice" else b.data
    return b
