"""How the C-style targets (C, CUDA, HIP) spell each operator: one table, operator name -> C.

The operator library (tessera/ops/) says what an operator means (its dtype rule, NumPy reference,
adjoint, and which generic lowering it takes: elementwise, reduction, scan, ...); this table says
how C writes it, and the renderer (target/cstyle.py) looks an OpCall up here by its operator's
name, as a compiler's code-for-op table does. A new elementwise operator is one registry entry
plus its row here. Our own transcendentals are C source in libm.h (see libm.py).

A row holds templates by the compute dtype's kind ('f', 'i', 'u', 'b'; see by_kind) per role:
  elem     out = expr(operands): {0}, {1}, ... are the operands (already in their operand
           dtypes). A template keyed by a conversion ("f64->f16") serves that pair of compute and
           result dtypes before the kind's. Or a function (attrs, kind) -> template.
  init     the accumulator's first value (a reduction, a scan): a C literal ("0", "-INFINITY")
  combine  the accumulator's next value, over {acc} and {x}
  better   whether {x} wins over (argmax) or goes before (sort) {best}
  helpers  C functions the templates call, emitted once per program before the kernels: a
           chunk, or a tuple of chunks (shared chunks are the same text, dependencies first; a
           ByDType holds other chunks for float64)
In every template {T} is the C type of the result, {F} the libm suffix ("f" for float, "" for
double), {S} the compute dtype's short name, {U} the unsigned type integer arithmetic wraps in,
{IMIN}/{IMAX} the integer's limits and {H} the prefix of the target's 16-bit conversions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ... import dtypes as dt
from ...errors import CompileError, DTypeError
from . import libm


def by_kind(table: dict, kind: str):
    """A template table's entry for a dtype kind ('f', 'i', 'u', 'b'): its own, else, for an
    unsigned kind, the signed one's (C spells most integer arithmetic alike), else '*'."""
    return table.get(kind) or (table.get("i") if kind == "u" else None) or table.get("*")


class ByDType(tuple):
    """Helper chunks that differ between float32 and float64 (picked by the renderer)."""
    def __new__(cls, f32, f64):
        self = super().__new__(cls, f32)
        self.f64 = f64
        return self


@dataclass(frozen=True)
class Spelling:
    """One operator's row (see the module's docstring)."""
    elem: dict | Callable | None = None
    init: dict | None = None
    combine: dict | None = None
    better: dict | None = None
    helpers: dict = field(default_factory=dict)


C: dict[str, Spelling] = {}


def spell(name: str, elem=None, helpers=None, **roles):
    C[name] = Spelling(elem=elem, helpers=helpers or {}, **roles)


def template(op: str, role: str, attrs: dict, kind: str, conversion: str = "") -> str:
    """The template for `op`'s `role` at a compute dtype of `kind` (a conversion such as
    "f64->f16" first, for elem)."""
    table = getattr(C[op], role) if op in C else None
    if callable(table):
        t = table(attrs, kind)
    else:
        t = table and (conversion and table.get(conversion) or by_kind(table, kind)) or None
    if t is None:
        raise CompileError(f"the C-style targets have no spelling of {op}"
                           f"{'' if role == 'elem' else '.' + role} for dtype kind {kind!r}",
                           hint="add one to its row in tessera/compiler/spelling/__init__.py")
    return t


def helpers(op: str, kind: str, wide: bool) -> tuple[str, ...]:
    """The helper chunks `op`'s templates call at a compute dtype of `kind` (`wide`: 64-bit)."""
    chunks = by_kind(C[op].helpers, kind) if op in C else None
    if wide and hasattr(chunks, "f64"):
        chunks = chunks.f64
    return (chunks,) if isinstance(chunks, str) else tuple(chunks or ())


# ---- helper chunks ----------------------------------------------------------------------------
SELECT = ByDType(libm.chunks("ts_self"), libm.chunks("ts_sel"))   # ts_sel{F}: c ? a : b by masks
# NaN-propagating max and min through mask selects: a float ternary becomes a branch that keeps
# a fused loop holding one from vectorising on AVX2 and NEON
_FMAX = "TS_INLINE {T} ts_max{F}({T} a, {T} b) { return ts_sel{F}((a > b) | (a != a), a, b); }"
_FMIN = "TS_INLINE {T} ts_min{F}({T} a, {T} b) { return ts_sel{F}((a < b) | (a != a), a, b); }"
FMAX = ByDType((*SELECT, _FMAX), (*SELECT.f64, _FMAX))
FMIN = ByDType((*SELECT, _FMIN), (*SELECT.f64, _FMIN))
SIGMOID = "TS_INLINE {T} ts_sigmoid{F}({T} x) { return ({T})1 / (({T})1 + ts_exp{F}(-x)); }"
GELU = ("TS_INLINE {T} ts_gelu_tanh{F}({T} x) { return ({T})0.5 * x * (({T})1 + ts_tanh{F}("
        "({T})0.7978845608028654 * (x + ({T})0.044715 * x * x * x))); }\n"
        "TS_INLINE {T} ts_gelu_erf{F}({T} x) { return ({T})0.5 * x * "
        "(({T})1 + ts_erf{F}(x * ({T})0.7071067811865476)); }")
# log(1 + x) and exp(x) - 1 without their cancellation near 0, on our own log and exp: Goldberg's
# and Kahan's rewrites, log(u) * x / (u - 1) with u = 1 + x and (u - 1) * x / log(u) with
# u = exp(x): the rounding of u cancels, leaving the error of log or exp plus a few roundings
# (within 2.4 ulp, softplus 2.6, float32 and float64, over 4.8 million values spread across 31
# decades: tests/ops/test_elementwise.py). Selects through masks (no branch, so
# the loop vectorises; an unselected division by zero is an IEEE inf, no trap); the edges: u == 1
# gives x (its sign of zero too), overflow inf, expm1 of a large negative -1.
LOG1P = ("TS_INLINE {T} ts_log1p{F}({T} x) {\n"
         "  {T} u = ({T})1 + x, d = u - ({T})1;\n"
         "  {T} r = ts_log{F}(u) * (x / ts_sel{F}(d == 0, ({T})1, d));\n"
         "  r = ts_sel{F}(d == 0, x, r);\n"
         "  return ts_sel{F}(x == ({T})INFINITY, x, r);\n"
         "}")
EXPM1 = ("TS_INLINE {T} ts_expm1{F}({T} x) {\n"
         "  {T} u = ts_exp{F}(x), d = u - ({T})1, l = ts_log{F}(u);\n"
         "  {T} r = d * (x / ts_sel{F}(l == 0, ({T})1, l));\n"
         "  r = ts_sel{F}(d == 0, x, r);\n"
         "  r = ts_sel{F}(d == -1, ({T})-1, r);\n"
         "  return ts_sel{F}(u == ({T})INFINITY, u, r);\n"
         "}")
# softplus(x) = log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): no overflow, and exact where
# PyTorch's threshold switches to x (the correction is below half an ulp of x there)
SOFTPLUS = ("TS_INLINE {T} ts_softplus{F}({T} x) "
            "{ return ts_max{F}(x, ({T})0) + ts_log1p{F}(ts_exp{F}(-fabs{F}(x))); }")


def math_helpers(*names, extra=()):
    """Helper chunks for kind "f": our transcendentals (libm.h) for float32 and, as `.f64`, for
    float64, then the operator's own chunks (`extra`: a chunk, or a ByDType of chunks per dtype
    such as FMAX), each listed once, dependencies first."""
    f32, f64 = [], []
    for n in names:
        f32 += [c for c in libm.F32[n] if c not in f32]
        f64 += [c for c in libm.F64[n] if c not in f64]
    for e in extra:
        by_dtype = isinstance(e, ByDType)
        f32 += [c for c in (e if by_dtype else (e,)) if c not in f32]
        f64 += [c for c in (e.f64 if by_dtype else (e,)) if c not in f64]
    return {"f": ByDType(tuple(f32), tuple(f64))}


# Integer arithmetic wraps around, as NumPy's does: it runs in the unsigned type {U} (where C
# defines overflow; a narrower type would be promoted to int) and is converted back to {T}
# (modulo 2^bits). Every integer result is in {T}'s range, so fused expressions stay exact.
def _wrapping(sym, *operands):
    return "(({T})(" + f" {sym} ".join("({U})" + o for o in operands) + "))"


INT_ADD, INT_SUB, INT_MUL = (_wrapping(c, "{0}", "{1}") for c in "+-*")
INT_ADD_ACC, INT_MUL_ACC = _wrapping("+", "{acc}", "{x}"), _wrapping("*", "{acc}", "{x}")
INT_NEG = _wrapping("-", "0", "{0}")
INT_FMA = "(({T})(({U}){0} * ({U}){1} + ({U}){2}))"
INT_POW = ("TS_INLINE {T} ts_ipow_{S}({T} b, {T} e) { {T} r = 1; "
           "if (e < 0) return (b == 1) ? 1 : (b == -1 ? ((e & 1) ? -1 : 1) : 0);"
           " while (e) { if (e & 1) r = ({T})(({U})r * ({U})b); b = ({T})(({U})b * ({U})b);"
           " e >>= 1; } return r; }")
# A float into a narrower integer or an unsigned one goes through int64 (NumPy's result on x86
# for values within int32's range). Outside the integer's range ONNX, NumPy and C leave it
# undefined (C's conversion may trap or differ by ISA); here it is the value truncated toward
# zero, modulo 2^bits, while |value| < 2^63 (2^64 into uint64), and 0 beyond and for NaN.
_IN_I64 = "({0} > -9.2233720368547758e18 && {0} < 9.2233720368547758e18)"
_F_TO_I = "(({T})(%s ? (int64_t){0} : 0))" % _IN_I64
_F_TO_U64 = ("({0} < 0 ? (%s ? (uint64_t)(int64_t){0} : 0) : "
             "({0} < 1.8446744073709552e19 ? (uint64_t){0} : 0))" % _IN_I64)
FLOAT_TO_INT = {f"{f}->{i}": _F_TO_I for f in ("f16", "bf16", "f8e4m3", "f8e5m2", "f32", "f64")
                for i in ("i8", "i16", "u8", "u16", "u32")} | \
    {f"{f}->u64": _F_TO_U64 for f in ("f16", "bf16", "f8e4m3", "f8e5m2", "f32", "f64")}

# Python's and NumPy's floor division and remainder: the remainder takes the divisor's sign.
# Floats follow NumPy's divmod step by step (fmod, then a quotient snapped to an integer), so
# the bits are NumPy's; by zero: a / b and NaN. Integers: by zero 0, and MIN // -1 wraps to MIN
# (C's own division would trap), both as NumPy gives them.
FLOOR_DIVMOD_F = (
    "TS_INLINE {T} ts_mod_{S}({T} a, {T} b) {\n"
    "  {T} m = fmod{F}(a, b);\n"
    "  if (b == 0) return m;\n"
    "  if (m != 0) { if ((b < 0) != (m < 0)) m += b; }\n"
    "  else m = copysign{F}(({T})0, b);\n"
    "  return m;\n"
    "}\n"
    "TS_INLINE {T} ts_floordiv_{S}({T} a, {T} b) {\n"
    "  if (b == 0) return a / b;\n"
    "  {T} m = fmod{F}(a, b), d = (a - m) / b;\n"
    "  if (m != 0 && (b < 0) != (m < 0)) d -= 1;\n"
    "  if (d == 0) return copysign{F}(({T})0, a / b);\n"
    "  {T} f = floor{F}(d);\n"
    "  return d - f > ({T})0.5 ? f + 1 : f;\n"
    "}")
FLOOR_DIVMOD_I = (
    "TS_INLINE {T} ts_mod_{S}({T} a, {T} b) {\n"
    "  if (b == 0 || b == -1) return 0;\n"
    "  {T} r = a % b;\n"
    "  return (r != 0 && (r < 0) != (b < 0)) ? r + b : r;\n"
    "}\n"
    "TS_INLINE {T} ts_floordiv_{S}({T} a, {T} b) {\n"
    "  if (b == 0) return 0;\n"
    "  if (b == -1) return ({T})(0 - (uint64_t)a);\n"
    "  {T} q = a / b;\n"
    "  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;\n"
    "}")
FLOOR_DIVMOD_U = (
    "TS_INLINE {T} ts_mod_{S}({T} a, {T} b) { return b == 0 ? 0 : a % b; }\n"
    "TS_INLINE {T} ts_floordiv_{S}({T} a, {T} b) { return b == 0 ? 0 : a / b; }")
FLOOR_DIVMOD = {"f": FLOOR_DIVMOD_F, "i": FLOOR_DIVMOD_I, "u": FLOOR_DIVMOD_U}

# bitcast: the float <-> integer pairs copy through a union (the others are C conversions
# between integers of one width: the same bits)
_BITCASTS = [("f32", "i32"), ("f32", "u32"), ("i32", "f32"), ("u32", "f32"),
             ("f64", "i64"), ("f64", "u64"), ("i64", "f64"), ("u64", "f64")]
_CTYPE = {"f32": "float", "f64": "double", "i32": "int32_t", "u32": "uint32_t", "i64": "int64_t",
          "u64": "uint64_t"}
BITS = "\n".join(f"TS_INLINE {_CTYPE[b]} ts_bits_{a}_{b}({_CTYPE[a]} x) "
                 f"{{ union {{ {_CTYPE[a]} a; {_CTYPE[b]} b; }} u; u.a = x; return u.b; }}"
                 for a, b in _BITCASTS)

# random_uniform's counter-based SplitMix64 (tessera/ops/random.py has its NumPy form)
MIX64 = ("TS_INLINE uint64_t ts_mix64(uint64_t z) { "
         "z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL; "
         "z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL; return z ^ (z >> 31); }")
RAND_BITS = ("TS_INLINE uint64_t ts_rand_bits(uint64_t seed, uint64_t n) { "
             "return ts_mix64(ts_mix64(seed) + (n + 1) * 0x9E3779B97F4A7C15ULL); }")


# ---- elementwise ------------------------------------------------------------------------------
spell("neg", {"*": "(-{0})", "i": INT_NEG})
spell("abs", {"f": "fabs{F}({0})", "i": "({0} < 0 ? %s : {0})" % INT_NEG, "u": "{0}", "b": "{0}"})
for _name in ("sqrt", "sin", "cos"):
    spell(_name, {"f": _name + "{F}({0})"})
# ts_exp{F} etc.: {F} picks ts_expf (float32) or ts_exp (float64), both defined in libm.h
for _name in ("exp", "tanh", "erf", "log"):
    spell(_name, {"f": "ts_" + _name + "{F}({0})"}, math_helpers(_name))
spell("rsqrt", {"f": "(({T})1 / sqrt{F}({0}))"})
spell("sigmoid", {"f": "ts_sigmoid{F}({0})"}, math_helpers("exp", extra=(SIGMOID,)))
spell("log1p", {"f": "ts_log1p{F}({0})"}, math_helpers("log", extra=(SELECT, LOG1P)))
spell("expm1", {"f": "ts_expm1{F}({0})"}, math_helpers("exp", "log", extra=(SELECT, EXPM1)))
spell("softplus", {"f": "ts_softplus{F}({0})"},
      math_helpers("exp", "log", extra=(FMAX, LOG1P, SOFTPLUS)))
spell("silu", {"f": "({0} * ts_sigmoid{F}({0}))"}, math_helpers("exp", extra=(SIGMOID,)))


def _gelu(attrs, kind):
    if attrs.get("approximate", "none") not in ("none", "tanh"):
        raise DTypeError(f"gelu's approximate must be 'none' or 'tanh', "
                         f"not {attrs['approximate']!r}")
    return "ts_gelu_tanh{F}({0})" if attrs.get("approximate") == "tanh" else "ts_gelu_erf{F}({0})"


spell("gelu", _gelu, math_helpers("tanh", "erf", extra=(GELU,)))
spell("relu", {"f": "ts_max{F}({0}, ({T})0)", "i": "({0} > 0 ? {0} : 0)", "b": "{0}"},
      {"f": FMAX})
spell("stop_gradient", {"*": "{0}"})
# rounding: exact, so every target gives NumPy's bits (round: rint, half to even in the default
# rounding mode); integers are already integral
for _name, _c in [("floor", "floor"), ("ceil", "ceil"), ("round", "rint")]:
    spell(_name, {"f": _c + "{F}({0})", "i": "{0}"})
spell("sign", {"f": "ts_sel{F}({0} != {0}, {0}, ({T})(({0} > 0) - ({0} < 0)))",
               "i": "({T})(({0} > 0) - ({0} < 0))"}, {"f": SELECT})
spell("add", {"*": "({0} + {1})", "i": INT_ADD, "b": "({0} | {1})"})
spell("sub", {"*": "({0} - {1})", "i": INT_SUB})
spell("mul", {"*": "({0} * {1})", "i": INT_MUL, "b": "({0} & {1})"})
spell("div", {"f": "({0} / {1})"})
spell("pow", {"f": "pow{F}({0}, {1})", "i": "ts_ipow_{S}({0}, {1})"}, {"i": INT_POW})
spell("atan2", {"f": "atan2{F}({0}, {1})"})
spell("maximum", {"f": "ts_max{F}({0}, {1})", "i": "({0} > {1} ? {0} : {1})", "b": "({0} | {1})"},
      {"f": FMAX})
spell("minimum", {"f": "ts_min{F}({0}, {1})", "i": "({0} < {1} ? {0} : {1})", "b": "({0} & {1})"},
      {"f": FMIN})
spell("mod", {"*": "ts_mod_{S}({0}, {1})"}, FLOOR_DIVMOD)
spell("floor_divide", {"*": "ts_floordiv_{S}({0}, {1})"}, FLOOR_DIVMOD)
for _name, _sym in [("bitwise_and", "&"), ("bitwise_or", "|"), ("bitwise_xor", "^")]:
    spell(_name, {"*": "(({T})({0} %s {1}))" % _sym})
spell("bitwise_not", {"*": "(({T})~{0})", "b": "(!{0})"})
# shifts as NumPy's: by the width or more (or a negative count, which NumPy reads as unsigned)
# 0, or -1 for a negative integer shifted right (C leaves both undefined)
_FITS = "(({U}){1} < sizeof({T}) * 8)"
spell("left_shift", {"i": "(%s ? ({T})(({U}){0} << {1}) : 0)" % _FITS})
spell("right_shift", {"i": "(%s ? ({T})({0} >> {1}) : ({0} < 0 ? -1 : 0))" % _FITS,
                      "u": "(%s ? ({T})({0} >> {1}) : 0)" % _FITS})
for _name, _sym in [("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"),
                    ("ge", ">=")]:
    spell(_name, {"*": "({0} %s {1})" % _sym})
# floats select through bit masks: a float ternary stays a branch, and a loop with a branch
# does not vectorise on AVX2 or NEON
spell("where", {"f": "ts_sel{F}({0}, {1}, {2})", "*": "({0} ? {1} : {2})"}, {"f": SELECT})
# a * b + c rounded once: the C library's fma
spell("fma", {"f": "fma{F}({0}, {1}, {2})", "i": INT_FMA, "*": "({0} * {1} + {2})"})
# into a narrow float, a value float32 cannot hold goes through float32 rounded to odd, whose
# rounding to 16 or 8 bits is then the value's own (one rounding); 32- and 64-bit integer sources
# matter for bfloat16 only (they overflow the others past 2^24)
spell("cast", {**{f"f64->{d}": "{H}_f64_to_f32_odd({0})"
                  for d in ("f16", "bf16", "f8e4m3", "f8e5m2")},
               "i32->bf16": "{H}_f64_to_f32_odd((double){0})",
               "u32->bf16": "{H}_f64_to_f32_odd((double){0})",
               "i64->bf16": "{H}_i64_to_f32_odd({0})",
               "u64->bf16": "{H}_u64_to_f32_odd({0})",
               **FLOAT_TO_INT, "*": "(({T}){0})"})
spell("bitcast", {**{f"{a}->{b}": f"ts_bits_{a}_{b}({{0}})" for a, b in _BITCASTS},
                  "*": "(({T}){0})"}, {k: (BITS,) for k in "fiu"})


def _random_uniform(attrs, kind):
    if attrs.get("dtype", "float32") == "float64":
        return "((double)(ts_rand_bits((uint64_t){0}, (uint64_t){1}) >> 11) * 0x1p-53)"
    # (through int32: AVX2 converts 32-bit integers to float in vectors, not 64-bit ones)
    return "((float)(int32_t)(ts_rand_bits((uint64_t){0}, (uint64_t){1}) >> 40) * 0x1p-24f)"


spell("random_uniform", _random_uniform, {"i": (MIX64, RAND_BITS)})
# the rounding itself is half.h's {H}_sround_<format> (sround.h), from random_uniform's float32
spell("round_stochastic",
      lambda attrs, kind: (f"{{H}}_sround_{dt.get(attrs['dtype']).short}({{0}}, "
                           "(float)(int32_t)(ts_rand_bits((uint64_t){1}, (uint64_t){2}) >> 40)"
                           " * 0x1p-24f)"),
      {"i": (MIX64, RAND_BITS)})

# ---- reductions, scans, argreductions, sorts -----------------------------------------------------
spell("sum", init={"*": "0"}, combine={"*": "({acc} + {x})", "i": INT_ADD_ACC})
spell("prod", init={"*": "1"}, combine={"*": "({acc} * {x})", "i": INT_MUL_ACC})
spell("max", init={"f": "-INFINITY", "i": "{IMIN}", "b": "0"},
      combine={"f": "ts_max{F}({acc}, {x})", "*": "({x} > {acc} ? {x} : {acc})"},
      helpers={"f": FMAX})
spell("min", init={"f": "INFINITY", "i": "{IMAX}", "b": "1"},
      combine={"f": "ts_min{F}({acc}, {x})", "*": "({x} < {acc} ? {x} : {acc})"},
      helpers={"f": FMIN})
spell("cumsum", init={"*": "0"}, combine={"*": "({acc} + {x})", "i": INT_ADD_ACC})
spell("cumprod", init={"*": "1"}, combine={"*": "({acc} * {x})", "i": INT_MUL_ACC})
# the first winner: NaN wins, as in NumPy
for _name, _cmp in [("argmax", ">"), ("argmin", "<")]:
    spell(_name, better={"f": "({x} %s {best} || ({x} != {x} && {best} == {best}))" % _cmp,
                         "*": "({x} %s {best})" % _cmp})
# x goes strictly before best, ascending (descending swaps the operands): NaN after numbers
for _name in ("argsort", "sort"):
    spell(_name, better={"f": "({x} < {best} || ({best} != {best} && {x} == {x}))",
                         "*": "({x} < {best})"})
