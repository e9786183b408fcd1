"""The C-style renderer every target shares: expressions, statements, loops, kernels.

Subclasses say how a loop kind is spelled (OpenMP pragmas on the CPU; grid and block indices on
GPUs), how kernels and the entry point are declared, and what goes in the prelude.
"""
from __future__ import annotations

import math

from ... import dtypes as dt
from ...ops import registry as R
from ..tile_ir import (Addr, Assign, Bin, Call, Cast, CheckIndex, Const, Decl, Load, Local, Loop,
                       OpCall, Select, Store, TileKernel, TileProgram, Var, walk_exprs)

INT_LIMITS = {"i32": ("INT32_MIN", "INT32_MAX"), "i64": ("INT64_MIN", "INT64_MAX"),
              "bool": ("0", "1")}


def fill(template: str, **subs) -> str:
    """Replace {name} tokens literally (C code is full of braces str.format would trip on)."""
    for k, v in subs.items():
        template = template.replace("{" + k + "}", v)
    return template


class CStyleRenderer:
    index_type = "int64_t"
    restrict = "restrict"

    # -- literals and types ------------------------------------------------------------------------
    def ctype(self, d: dt.DType) -> str:
        return d.c_type

    def literal(self, value, d) -> str:
        if d is None:
            return str(int(value))
        if d.is_bool:
            return "1" if bool(value) else "0"
        if d.is_int:
            v = int(value)
            return f"{v}LL" if d.itemsize == 8 else str(v)
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "-INFINITY"
        text = repr(v)
        return text + "f" if d.itemsize == 4 else text

    @staticmethod
    def suffix(d: dt.DType) -> str:
        return "f" if d.is_float and d.itemsize == 4 else ""

    def subs(self, compute: dt.DType, out: dt.DType) -> dict:
        lo, hi = INT_LIMITS.get(compute.short, ("0", "0"))
        return {"T": self.ctype(out), "F": self.suffix(compute), "S": compute.short,
                "IMIN": lo, "IMAX": hi}

    # -- expressions -----------------------------------------------------------------------------
    def expr(self, e) -> str:
        if isinstance(e, Var):
            return e.name
        if isinstance(e, Const):
            return self.literal(e.value, e.dtype)
        if isinstance(e, Load):
            return f"{e.buf}[{self.expr(e.index)}]"
        if isinstance(e, Bin):
            return f"({self.expr(e.a)} {e.op} {self.expr(e.b)})"
        if isinstance(e, Cast):
            return f"(({self.ctype(e.dtype)}){self.expr(e.e)})"
        if isinstance(e, Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, OpCall):
            return self.opcall(e)
        if isinstance(e, Addr):
            return "0" if e.buf is None else f"({e.buf} + {self.expr(e.index)})"
        raise TypeError(f"cannot render {e!r}")

    def template(self, e: OpCall) -> str:
        desc = R.get(e.op).lowering
        kind = e.compute.kind
        if e.role == "elem":
            return desc.template(dict(e.attrs), kind)
        table = {"combine": getattr(desc, "combine", None), "init": getattr(desc, "init", None),
                 "better": getattr(desc, "better", None)}[e.role]
        return table.get(kind) or table["*"]

    def opcall(self, e: OpCall) -> str:
        text = fill(self.template(e), **self.subs(e.compute, e.out))
        if e.role == "combine":
            return fill(text, acc=self.expr(e.args[0]), x=self.expr(e.args[1]))
        if e.role == "better":
            return fill(text, x=self.expr(e.args[0]), best=self.expr(e.args[1]))
        return fill(text, **{str(i): self.expr(a) for i, a in enumerate(e.args)})

    def helpers(self, program: TileProgram) -> list[str]:
        """Helper functions the program's OpCalls need, each once, in first-use order."""
        out = []
        for k in program.kernels:
            for e in walk_exprs(k.body):
                if not isinstance(e, OpCall):
                    continue
                chunks = R.get(e.op).lowering.helpers.get(e.compute.kind) \
                    if hasattr(R.get(e.op).lowering, "helpers") else None
                # a str, or a tuple of chunks that several operators share (each emitted once);
                # a tuple may carry other chunks for float64 (`.f64`)
                if e.compute.itemsize == 8 and hasattr(chunks, "f64"):
                    chunks = chunks.f64
                for text in ((chunks,) if isinstance(chunks, str) else chunks or ()):
                    h = fill(text, **self.subs(e.compute, e.compute))
                    if h not in out:
                        out.append(h)
        return out

    # -- statements ------------------------------------------------------------------------------
    def loop_header(self, s: Loop, k: TileKernel) -> list[str]:
        return []

    def loop_range(self, s: Loop) -> tuple[str, str]:
        """A loop's first index and its step, as C (GPUs start and stride by thread)."""
        return "0", f"++{s.var}"

    def stmt(self, s, k: TileKernel, depth: int, out: list):
        pad = "  " * depth
        if isinstance(s, Loop):
            out.extend(pad + line for line in self.loop_header(s, k))
            it = self.index_type
            extent = s.extent if isinstance(s.extent, int) else self.expr(s.extent)
            start, step = self.loop_range(s)
            out.append(f"{pad}for ({it} {s.var} = {start}; {s.var} < {extent}; {step}) {{")
            for c in s.body:
                self.stmt(c, k, depth + 1, out)
            out.append(pad + "}")
        elif isinstance(s, Decl):
            out.append(f"{pad}{self.ctype(s.dtype)} {s.name} = {self.expr(s.init)};")
        elif isinstance(s, Local):
            out.append(f"{pad}{self.ctype(s.dtype)} {s.name}[{s.size}];")
        elif isinstance(s, Call):
            out.append(f"{pad}{s.fn}({', '.join(self.expr(a) for a in s.args)});")
        elif isinstance(s, Assign):
            out.append(f"{pad}{s.name} = {self.expr(s.value)};")
        elif isinstance(s, Store):
            out.append(f"{pad}{s.buf}[{self.expr(s.index)}] = {self.expr(s.value)};")
        elif isinstance(s, CheckIndex):
            out.append(f"{pad}if ({s.name} < 0) {s.name} += {s.extent};")
            out.append(f"{pad}if ({s.name} < 0 || {s.name} >= {s.extent}) {{")
            out.extend(pad + "  " + line for line in self.flag_error(s.code))
            out.append(f"{pad}  {s.name} = 0;")
            out.append(pad + "}")
        else:
            raise TypeError(f"cannot render {s!r}")

    def flag_error(self, code: int) -> list[str]:
        return [f"ts_status = {code};"]

    # -- kernels ---------------------------------------------------------------------------------
    def param_decl(self, p) -> str:
        const = "const " if p.mode == "in" else ""
        return f"{const}{self.ctype(p.dtype)}* {self.restrict} {p.name}"

    def kernel(self, k: TileKernel) -> str:
        params = ", ".join(self.param_decl(p) for p in k.params)
        names = "".join(f"; {p.name} is %{p.label}" for p in k.params if p.label)
        lines = [f"/* {k.strategy}: {k.origin}{names} */",
                 f"{self.kernel_qualifier()} {k.name}({params}) {{", "  int ts_status = 0;"]
        for s in k.body:
            self.stmt(s, k, 1, lines)
        lines += ["  return ts_status;", "}"]
        return "\n".join(lines)

    def kernel_qualifier(self) -> str:
        return "static int"

    def prelude(self) -> str:
        return ""

    def routines(self, program: TileProgram) -> list[str]:
        """The hand-written routines the program's Calls need, each once."""
        keys = []
        for k in program.kernels:
            for s in _statements(k.body):
                if isinstance(s, Call) and s.routine not in keys:
                    keys.append(s.routine)
        out = []
        for key in keys:
            for chunk in self.routine_source(key):       # shared chunks (ISA macros) once
                if chunk not in out:
                    out.append(chunk)
        return out

    def routine_source(self, key: str) -> list[str]:
        raise NotImplementedError(f"this target has no routine {key}")

    def render(self, program: TileProgram) -> str:
        parts = [self.prelude()]
        parts += self.helpers(program)
        parts += [c for c in self.routines(program) if c not in parts]   # exp: once for both
        parts += [self.kernel(k) for k in program.kernels]
        parts.append(self.entry(program))
        return "\n\n".join(p for p in parts if p) + "\n"

    def entry(self, program: TileProgram) -> str:
        raise NotImplementedError


def _statements(stmts):
    for s in stmts:
        yield s
        if isinstance(s, Loop):
            yield from _statements(s.body)
