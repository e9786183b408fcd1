"""The C-style renderer every target shares: expressions, statements, loops, kernels.

Subclasses say how a loop kind is spelled (OpenMP pragmas on the CPU; grid and block indices on
GPUs), how kernels and the entry point are declared, and what goes in the prelude.

Narrow floats (16-bit and fp8, see tessera.dtypes) are converted here, in one place, for every
strategy: a kernel parameter of a narrow dtype is a pointer to its bits; every other value of
that dtype (a Decl, a Local, a Shared element, a literal) is a float32 holding a value the
narrow type represents. So a Load from a narrow parameter widens (exactly), a Store to one
narrows (round to nearest even), and an expression that makes a narrow value (an OpCall whose
result is narrow, a Cast to a narrow type, a Store into a narrow Local) rounds its float32
result to the narrow grid: an operator's result is rounded once whether it is stored or fused.
Operator templates and helpers see the compute dtype (float32). The conversions are the
target's `half_helpers` (one text for both, strategies/routines/half.h; fp8.h and sround.h
after it for a program using fp8 or stochastic rounding), emitted whenever a kernel converts (a
narrow value may live only inside a fused kernel, with no narrow parameter).
float64 -> float16 goes through float32 rounded to odd, so it rounds once, as NumPy does.
"""
from __future__ import annotations

import math

from ... import dtypes as dt
from .. import spelling
from ..dynamic import C_HELPERS, c_expr, is_dynamic
from ..strategies.routines import narrow_conversions, specialise
from ..tile_ir import (Addr, Aligned, Assign, AtomicAdd, Bin, Call, Cast, CheckIndex, Const, Decl,
                       If, Load, Local, Loop, OpCall, Select, Shared, Store, TileKernel,
                       TileProgram, Var, all_statements, walk_exprs)

INT_LIMITS = {**{f"i{n}": (f"INT{n}_MIN", f"INT{n}_MAX") for n in (8, 16, 32, 64)},
              **{f"u{n}": ("0", f"UINT{n}_MAX") for n in (8, 16, 32, 64)}, "bool": ("0", "1")}


class CStyleRenderer:
    index_type = "int64_t"
    restrict = "restrict"

    half_prefix = "ts"             # the 16-bit conversions are <prefix>_f16_to_f32 and so on
    half_lang = "c"                # their spelling (routines.HALF_SPELLING)

    # -- literals and types ------------------------------------------------------------------------
    def ctype(self, d: dt.DType) -> str:
        """The C type of a value of d (float for 16-bit floats)."""
        return d.compute.c_type

    def storage_type(self, d: dt.DType) -> str:
        """The C type of an element of a kernel parameter of dtype d."""
        return d.c_type

    def widen(self, d: dt.DType, bits: str) -> str:
        self._uses_half = True
        self._uses_fp8 |= d.is_fp8
        return f"{self.half_prefix}_{d.short}_to_f32({bits})"

    def narrow(self, d: dt.DType, value: str) -> str:
        self._uses_half = True
        self._uses_fp8 |= d.is_fp8
        return f"{self.half_prefix}_f32_to_{d.short}({value})"

    def round_half(self, d: dt.DType, value: str) -> str:
        """value (a float) rounded to d's grid, still a float."""
        return self.widen(d, self.narrow(d, value))

    def half_helpers(self) -> list[str]:
        """The chunks defining the conversions (when a program uses a 16-bit dtype)."""
        return []

    def literal(self, value, d) -> str:
        if d is None:
            return str(int(value))
        if d.is_bool:
            return "1" if bool(value) else "0"
        if d.is_int:
            v = int(value)
            if d.is_unsigned:
                return f"{v}ULL" if d.itemsize == 8 else f"{v}U"
            if v == -2 ** 63:              # (9223372036854775808LL alone does not fit)
                return "INT64_MIN"
            return f"{v}LL" if d.itemsize == 8 else str(v)
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "-INFINITY"
        text = repr(v)
        return text + "f" if d.compute.itemsize == 4 else text

    @staticmethod
    def suffix(d: dt.DType) -> str:
        return "f" if d.is_float and d.itemsize == 4 else ""

    def subs(self, compute: dt.DType, out: dt.DType) -> dict:
        compute = compute.compute
        lo, hi = INT_LIMITS.get(compute.short, ("0", "0"))
        # {U}: the unsigned type integer arithmetic runs in, so it wraps (signed overflow is
        # undefined in C; a narrower type would be promoted to int), as wide as the operands or
        # the result (a sum of int8 accumulates in int64)
        wide = max(compute.itemsize, out.compute.itemsize) == 8
        return {"T": self.ctype(out), "F": self.suffix(compute), "S": compute.short,
                "H": self.half_prefix, "IMIN": lo, "IMAX": hi,
                "U": "uint64_t" if wide else "uint32_t"}

    # -- expressions -----------------------------------------------------------------------------
    def expr(self, e) -> str:
        """e's text: the method named for its class (``expr_Load``); a renderer adds its own
        expressions' methods (a GPU's ``expr_ThreadIndex``)."""
        render = getattr(self, "expr_" + type(e).__name__, None)
        if render is None:
            raise TypeError(f"cannot render {e!r}")
        return render(e)

    def expr_Var(self, e: Var) -> str:
        return e.name

    def expr_Const(self, e: Const) -> str:
        return self.literal(e.value, e.dtype)

    def expr_Load(self, e: Load) -> str:
        text = f"{e.buf}[{self.expr(e.index)}]"
        d = self._halves.get(e.buf)
        return self.widen(d, text) if d is not None else text

    def expr_Bin(self, e: Bin) -> str:
        return f"({self.expr(e.a)} {e.op} {self.expr(e.b)})"

    def expr_Cast(self, e: Cast) -> str:
        text = f"(({self.ctype(e.dtype)}){self.expr(e.e)})"
        return self.round_half(e.dtype, text) if e.dtype.is_narrow else text

    def expr_Select(self, e: Select) -> str:
        return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"

    def expr_OpCall(self, e: OpCall) -> str:
        return self.opcall(e)

    def expr_Addr(self, e: Addr) -> str:
        return "0" if e.buf is None else f"({e.buf} + {self.expr(e.index)})"

    def expr_Aligned(self, e: Aligned) -> str:
        return f"((((unsigned long long){e.buf}) & {e.bytes - 1}u) == 0)"

    def template(self, e: OpCall) -> str:
        """The call's C template, from the spelling table by its operator's name."""
        conversion = f"{e.compute.short}->{e.out.short}" if e.role == "elem" else ""
        return spelling.template(e.op, e.role, dict(e.attrs), e.compute.kind, conversion)

    def opcall(self, e: OpCall, rounded: bool = True) -> str:
        """The call as C; a 16-bit result is rounded to its grid unless `rounded` is False
        (the caller narrows it at once)."""
        template = self.template(e)
        self._uses_sround |= "{H}_sround_" in template      # stochastic rounding (sround.h)
        text = specialise(template, **self.subs(e.compute, e.out))
        if e.role == "combine":
            text = specialise(text, acc=self.expr(e.args[0]), x=self.expr(e.args[1]))
        elif e.role == "better":
            text = specialise(text, x=self.expr(e.args[0]), best=self.expr(e.args[1]))
        else:
            text = specialise(text, **{str(i): self.expr(a) for i, a in enumerate(e.args)})
        return self.round_half(e.out, text) if rounded and e.out.is_narrow else text

    def stored(self, buf: str, value) -> str:
        """The C for storing `value` into buf: narrowed into a 16-bit parameter (its bits
        copied when it is loaded from a parameter of the same dtype), rounded into a 16-bit
        Local or Shared array."""
        d = self._halves.get(buf)
        if d is not None:
            if isinstance(value, Cast) and value.dtype == d:     # a copy (concat): its bits
                value = value.e
            if isinstance(value, Load) and self._halves.get(value.buf) == d:
                return f"{value.buf}[{self.expr(value.index)}]"
            if isinstance(value, OpCall) and value.out == d:
                return self.narrow(d, self.opcall(value, rounded=False))
            return self.narrow(d, self.expr(value))
        d = self._local_halves.get(buf)
        if d is not None:
            return self.round_half(d, self.expr(value))
        return self.expr(value)

    def helpers(self, program: TileProgram) -> list[str]:
        """Helper functions the program's OpCalls need, each once, in first-use order."""
        out = []
        for k in program.kernels:
            for e in walk_exprs(k.body):
                if not isinstance(e, OpCall):
                    continue
                # chunks that several operators share are the same text (each emitted once)
                for text in spelling.helpers(e.op, e.compute.kind, e.compute.itemsize == 8):
                    h = specialise(text, **self.subs(e.compute, e.compute.compute))
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
        """s's lines, appended to out at this depth: the method named for its class
        (``stmt_Loop``); a renderer adds its own statements' methods (C's ``stmt_Scratch``, a
        GPU's ``stmt_Shared``)."""
        render = getattr(self, "stmt_" + type(s).__name__, None)
        if render is None:
            raise TypeError(f"cannot render {s!r}")
        render(s, k, depth, out)

    def stmts(self, body, k: TileKernel, depth: int, out: list):
        for s in body:
            self.stmt(s, k, depth, out)

    def stmt_Loop(self, s: Loop, k: TileKernel, depth: int, out: list):
        pad = "  " * depth
        out.extend(pad + line for line in self.loop_header(s, k))
        it = self.index_type
        extent = self.literal(s.extent, None) if isinstance(s.extent, int) else \
            self.expr(s.extent)
        start, step = self.loop_range(s)
        out.append(f"{pad}for ({it} {s.var} = {start}; {s.var} < {extent}; {step}) {{")
        self.stmts(s.body, k, depth + 1, out)
        out.append(pad + "}")

    def stmt_If(self, s: If, k: TileKernel, depth: int, out: list):
        pad = "  " * depth
        out.append(f"{pad}if ({self.expr(s.cond)}) {{")
        self.stmts(s.body, k, depth + 1, out)
        if s.orelse:
            out.append(pad + "} else {")
            self.stmts(s.orelse, k, depth + 1, out)
        out.append(pad + "}")

    def stmt_Decl(self, s: Decl, k: TileKernel, depth: int, out: list):
        out.append(f"{'  ' * depth}{self.ctype(s.dtype)} {s.name} = {self.expr(s.init)};")

    def stmt_Local(self, s: Local, k: TileKernel, depth: int, out: list):
        out.append(f"{'  ' * depth}{self.ctype(s.dtype)} {s.name}[{s.size}];")

    def stmt_Call(self, s: Call, k: TileKernel, depth: int, out: list):
        pad = "  " * depth
        call = f"{s.fn}({', '.join(self.expr(a) for a in s.args)})"
        if s.fail_code:
            out.append(f"{pad}if ({call}) {{")
            out.extend(pad + "  " + line for line in self.flag_error(-s.fail_code))
            out.append(pad + "}")
        else:
            out.append(f"{pad}{call};")

    def stmt_Assign(self, s: Assign, k: TileKernel, depth: int, out: list):
        out.append(f"{'  ' * depth}{s.name} = {self.expr(s.value)};")

    def stmt_Store(self, s: Store, k: TileKernel, depth: int, out: list):
        out.append(f"{'  ' * depth}{s.buf}[{self.expr(s.index)}] = "
                   f"{self.stored(s.buf, s.value)};")

    def stmt_AtomicAdd(self, s: AtomicAdd, k: TileKernel, depth: int, out: list):
        out.extend("  " * depth + line for line in self.atomic_add(s, k))

    def stmt_CheckIndex(self, s: CheckIndex, k: TileKernel, depth: int, out: list):
        pad = "  " * depth
        out.append(f"{pad}if ({s.name} < 0) {s.name} += {s.extent};")
        out.append(f"{pad}if ({s.name} < 0 || {s.name} >= {s.extent}) {{")
        out.extend(pad + "  " + line for line in self.flag_error(s.code))
        out.append(f"{pad}  {s.name} = 0;")
        out.append(pad + "}")

    def atomic_add(self, s, k: TileKernel) -> list[str]:
        """An integer add into a parameter that other threads add into too (OpenMP's)."""
        return ["#pragma omp atomic", f"{s.buf}[{self.expr(s.index)}] += {self.expr(s.value)};"]

    def flag_error(self, code: int) -> list[str]:
        return [f"ts_status = {code};"]

    # -- kernels ---------------------------------------------------------------------------------
    def param_decl(self, p) -> str:
        const = "const " if p.mode == "in" else ""
        return f"{const}{self.storage_type(p.dtype)}* {self.restrict} {p.name}"

    def begin_kernel(self, k: TileKernel):
        """Note the kernel's 16-bit buffers: parameters hold bits, other arrays floats."""
        self._halves = {p.name: p.dtype for p in k.params if p.dtype.is_narrow}
        self._local_halves = {s.name: s.dtype for s in all_statements(k.body)
                              if isinstance(s, (Local, Shared)) and s.dtype.is_narrow}

    _halves: dict = {}
    _local_halves: dict = {}
    _uses_half = False              # set by any conversion the kernels render
    _uses_fp8 = _uses_sround = False

    def kernel(self, k: TileKernel) -> str:
        self.begin_kernel(k)
        params = ", ".join([self.param_decl(p) for p in k.params] + self.size_params())
        names = "".join(f"; {p.name} is %{p.label}" for p in k.params if p.label)
        lines = [f"/* {k.strategy}: {k.origin}{names} */",
                 f"{self.kernel_qualifier()} {k.name}({params}) {{", "  int ts_status = 0;"]
        for s in k.body:
            self.stmt(s, k, 1, lines)
        lines += ["  return ts_status;", "}"]
        return "\n".join(lines)

    def size_params(self) -> list[str]:
        """Parameters every kernel takes after its buffers (a shape-generic program's sizes)."""
        return []

    def kernel_qualifier(self) -> str:
        return "static int"

    def prelude(self) -> str:
        return ""

    def routines(self, program: TileProgram) -> list[str]:
        """The hand-written routines the program's Calls need, each once."""
        out = []
        for key in routine_keys(program):
            for chunk in self.routine_source(key):       # shared chunks (ISA macros) once
                if chunk not in out:
                    out.append(chunk)
        return out

    def routine_source(self, key: str) -> list[str]:
        raise NotImplementedError(f"this target has no routine {key}")

    def render(self, program: TileProgram) -> str:
        self._uses_half = self._uses_fp8 = self._uses_sround = False
        kernels = [self.kernel(k) for k in program.kernels]
        parts = [self.prelude()]
        if self._uses_half:
            parts += self.half_helpers()
            parts += narrow_conversions(self.half_lang, self._uses_fp8, self._uses_sround)
        parts += [h for h in self.helpers(program) if h not in parts]
        parts += [c for c in self.routines(program) if c not in parts]   # exp: once for both
        parts += kernels
        parts.append(self.entry(program))
        return "\n\n".join(p for p in parts if p) + "\n"

    def entry(self, program: TileProgram) -> str:
        raise NotImplementedError


class ShapeGeneric:
    """A renderer of a shape-generic program (compiler/dynamic.py), before a target's renderer
    in the bases: a size computed from the dynamic symbols is its expression in them, and every
    kernel takes the symbols' sizes (int64) after its other parameters."""

    def __init__(self, symbols: list, *args):
        super().__init__(*args)
        self.symbols = list(symbols)

    def prelude(self) -> str:
        return super().prelude() + "\n\n" + C_HELPERS

    def literal(self, value, d) -> str:
        if is_dynamic(value):
            text = c_expr(value)
            return text if d is None else f"(({self.ctype(d)}){text})"
        return super().literal(value, d)

    def size_params(self) -> list[str]:
        return [f"const int64_t ts_size_{s}" for s in self.symbols]


def routine_keys(program: TileProgram) -> list[str]:
    """The routines ("gemm:f32") the program's kernels call, in order of first use."""
    keys = []
    for k in program.kernels:
        for s in all_statements(k.body):
            if isinstance(s, Call) and s.routine not in keys:
                keys.append(s.routine)
    return keys
