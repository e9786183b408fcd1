"""The dtype table: names, NumPy and C equivalents, and NumPy's promotion rules.

Narrow floats - 16-bit (float16, bfloat16) and 8-bit (float8_e4m3fn, float8_e5m2) - are
storage types: a kernel loads their bits, widens them exactly to float32 (their `compute`
dtype), computes every operator in float32 and rounds to nearest even once, when the operator's
narrow result is made (NaN stays NaN; overflow gives inf, or NaN in float8_e4m3fn, which has no
inf). Sums, matmuls and attention accumulate in float32. So an operator's narrow result is
float32 arithmetic rounded once - fused or not, on every target, and in the NumPy references
(`ops.registry.run_reference`). bfloat16 and the fp8 formats need the optional `ml_dtypes`
package (`pip install tessera[bf16]`), which gives NumPy the dtypes; a numerical policy
(tessera.numerics) may round stochastically or saturate instead.

Casts round once: any value (float64, int32 and int64 included) cast to a narrow float is its
exact value rounded once to nearest even, as NumPy's float64 -> float16 and ml_dtypes' casts
since 0.7 are (ml_dtypes 0.5 rounded a double through float32, twice). Kernels reach it through
float32 rounded to odd (half.h), which keeps the information one rounding needs; the references
through `convert`, whatever ml_dtypes is installed. Copies (transpose, slice, take, concat)
keep a 16-bit value's bits; arithmetic (neg and abs included) quiets a signalling NaN.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import DTypeError, UnsupportedDTypeError


@dataclass(frozen=True)
class DType:
    name: str          # public name, e.g. "float32"
    short: str         # IR spelling, e.g. "f32"
    kind: str          # "f" float, "i" signed int, "u" unsigned int, "b" bool, "c" complex
    itemsize: int
    c_type: str        # storage type in C
    accum: str         # name of the dtype reductions accumulate in
    supported: bool = True   # False: storage reserved, no kernels yet

    @property
    def np(self) -> np.dtype:
        if self.name in _ML_DTYPES:
            try:
                import ml_dtypes  # optional: gives NumPy bfloat16 and the fp8 formats
            except ImportError:
                raise UnsupportedDTypeError(
                    f"{self.name} needs the ml_dtypes package", received=self.name,
                    hint="pip install ml_dtypes (the tessera[bf16] extra)") from None
            return np.dtype(getattr(ml_dtypes, self.name))
        return np.dtype(self.name if self.name != "bool" else np.bool_)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        """A signed or unsigned integer dtype."""
        return self.kind in "iu"

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "u"

    @property
    def int_range(self) -> tuple[int, int]:
        """An integer (or bool) dtype's least and greatest values."""
        if self.is_bool:
            return 0, 1
        info = np.iinfo(self.np)
        return int(info.min), int(info.max)

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def is_complex(self) -> bool:
        """complex64 or complex128: stored as NumPy stores it (real and imaginary parts
        interleaved); the compiler computes on the two parts as float tensors."""
        return self.kind == "c"

    @property
    def is_inexact(self) -> bool:
        """A float or complex dtype: values that carry gradients."""
        return self.kind in "fc"

    @property
    def part(self) -> "DType":
        """A complex dtype's real and imaginary parts' dtype (float32, float64)."""
        return _BY_NAME[self.accum] if self.is_complex else self

    @property
    def is_narrow(self) -> bool:
        """A float narrower than float32 (16 or 8 bits): stored narrow, computed in float32."""
        return self.kind == "f" and self.itemsize < 4

    @property
    def is_fp8(self) -> bool:
        return self.kind == "f" and self.itemsize == 1

    @property
    def max_finite(self) -> float:
        """The largest finite value of a float dtype (where saturation clamps to)."""
        if self.name in _ML_DTYPES:
            import ml_dtypes                # (self.np has checked it is there)
            return float(ml_dtypes.finfo(self.np).max)
        return float(np.finfo(self.np).max)

    @property
    def poison(self):
        """What an output or temporary is filled with before a run under TESSERA_POISON=1, so
        an element a kernel forgets to write shows: NaN, True, or an unlikely integer."""
        if self.is_float or self.is_complex:
            return np.nan
        # (wrapped into a narrower integer)
        return True if self.is_bool else np.array(-987654321).astype(self.np)[()]

    @property
    def compute(self) -> "DType":
        """The dtype arithmetic on values of this dtype runs in (float32 for 16-bit floats)."""
        return _BY_NAME[self.accum] if self.is_narrow else self

    def __repr__(self) -> str:
        return f"tessera.{self.name}"

    def __str__(self) -> str:
        return self.short


float16 = DType("float16", "f16", "f", 2, "uint16_t", "float32")
bfloat16 = DType("bfloat16", "bf16", "f", 2, "uint16_t", "float32")
# fp8 (OCP 8-bit floats, as ml_dtypes names them): e4m3fn has no inf (its overflow is NaN, max
# 448), e5m2 is float16's top byte (max 57344, inf)
float8_e4m3fn = DType("float8_e4m3fn", "f8e4m3", "f", 1, "uint8_t", "float32")
float8_e5m2 = DType("float8_e5m2", "f8e5m2", "f", 1, "uint8_t", "float32")
float32 = DType("float32", "f32", "f", 4, "float", "float32")
float64 = DType("float64", "f64", "f", 8, "double", "float64")
# integers: arithmetic wraps around (two's complement, as NumPy's); sums accumulate in the
# 64-bit integer of the same signedness, as NumPy's sum does
int8 = DType("int8", "i8", "i", 1, "int8_t", "int64")
int16 = DType("int16", "i16", "i", 2, "int16_t", "int64")
int32 = DType("int32", "i32", "i", 4, "int32_t", "int64")
int64 = DType("int64", "i64", "i", 8, "int64_t", "int64")
uint8 = DType("uint8", "u8", "u", 1, "uint8_t", "uint64")
uint16 = DType("uint16", "u16", "u", 2, "uint16_t", "uint64")
uint32 = DType("uint32", "u32", "u", 4, "uint32_t", "uint64")
uint64 = DType("uint64", "u64", "u", 8, "uint64_t", "uint64")
bool_ = DType("bool", "bool", "b", 1, "bool", "int64")
# accum: the parts' dtype (a complex never reaches a kernel: see is_complex)
complex64 = DType("complex64", "c64", "c", 8, "", "float32")
complex128 = DType("complex128", "c128", "c", 16, "", "float64")

# the seeds' short names (fp8: the e4m3fn format, the usual one for weights and activations)
f16, bf16, f32, f64 = float16, bfloat16, float32, float64
i8, i16, i32, i64 = int8, int16, int32, int64
u8, u16, u32, u64 = uint8, uint16, uint32, uint64
fp8 = fp8_e4m3 = float8_e4m3fn
fp8_e5m2 = float8_e5m2

_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")
ALL = (float16, bfloat16, float8_e4m3fn, float8_e5m2, float32, float64, int8, int16, int32, int64,
       uint8, uint16, uint32, uint64, bool_, complex64, complex128)
_BY_NAME = {d.name: d for d in ALL} | {d.short: d for d in ALL} | {"bool_": bool_}


def get(x) -> DType:
    """A DType from a DType, a name ("float32", "f32"), a NumPy dtype or a Python type."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    try:
        npd = np.dtype(x)
    except TypeError:
        raise UnsupportedDTypeError(f"{x!r} is not a dtype Tessera knows",
                                    expected=_supported_names()) from None
    return from_numpy(npd)


_FROM_NUMPY: dict = {}


def from_numpy(npd: np.dtype) -> DType:
    hit = _FROM_NUMPY.get(npd)
    if hit is not None:
        return hit
    d = _from_numpy(np.dtype(npd))
    _FROM_NUMPY[npd] = d            # only supported dtypes get here
    return d


def _from_numpy(npd: np.dtype) -> DType:
    d = _BY_NAME.get(npd.name)
    if d is None or not d.supported:
        hint = None
        if d is not None:
            hint = f"{d.name} storage is reserved for a later release; cast to float32"
        raise UnsupportedDTypeError(f"dtype {npd.name} is not supported",
                                    expected=_supported_names(), received=npd.name, hint=hint)
    return d


def _supported_names() -> str:
    return ", ".join(d.name for d in ALL if d.supported)


def result_type(*args) -> DType:
    """NumPy's promotion (NEP 50: Python scalars are weak) over DTypes and Python scalars.

    Narrow floats, in this one place: the narrow dtypes of the operands promote to the narrowest
    of fp8 e4m3, fp8 e5m2, f16, bf16, f32 that holds each of them exactly (f16 with bf16 is
    f32: neither holds the other; either fp8 format fits in f16 and in bf16), a Python scalar
    keeps the tensor's narrow dtype, and otherwise a narrow float promotes as float16 does in
    NumPy (with f32 -> f32, with int32 -> f64)."""
    halves = {a for a in args if isinstance(a, DType) and a.is_narrow}
    half = next(h for h in _NARROW_ORDER if halves <= _HOLDS[h]) if halves else None
    np_args = [(float16 if half.is_narrow else half).np if isinstance(a, DType) and a.is_narrow
               else a.np if isinstance(a, DType) else a for a in args]
    try:
        d = from_numpy(np.result_type(*np_args))
        return half if half is not None and d is float16 else d
    except (TypeError, ValueError) as e:
        raise DTypeError(f"these dtypes do not promote: {e}") from None


# which narrow dtypes each one holds exactly, for result_type
_NARROW_ORDER = (float8_e4m3fn, float8_e5m2, float16, bfloat16, float32)
_HOLDS = {float8_e4m3fn: {float8_e4m3fn}, float8_e5m2: {float8_e5m2},
          float16: {float8_e4m3fn, float8_e5m2, float16},
          bfloat16: {float8_e4m3fn, float8_e5m2, bfloat16},
          float32: {float8_e4m3fn, float8_e5m2, float16, bfloat16}}


def native(arr: np.ndarray) -> np.ndarray:
    """The array in this machine's byte order (kernels read raw memory)."""
    return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))


def convert(value, d) -> np.ndarray:
    """`np.asarray(value, dtype=d)` under the cast contract above: into a narrow float, the exact
    value rounded once (a double or a wide integer goes through float32 rounded to odd, exact
    or the odd neighbour, whose nearest-even rounding to 16 or 8 bits is the value's own)."""
    d = get(d)
    if not d.is_narrow:
        return np.asarray(value, dtype=d.np)     # (a Python int that does not fit: OverflowError)
    a = np.asarray(value)
    if not (a.dtype.kind in "fiu" and a.dtype.itemsize >= 4 and a.dtype != np.float32):
        return np.asarray(a, dtype=d.np)
    with np.errstate(over="ignore", invalid="ignore"):
        return float32_odd(a).astype(d.np)


def float32_odd(a: np.ndarray) -> np.ndarray:
    """A float64 or integer array as float32 rounded to odd: exact where float32 holds the
    value, else the neighbour whose last bit is 1 (infinity included as a value past the largest
    float: a finite double beyond it gives the largest float)."""
    if a.dtype.kind in "iu" and a.dtype.itemsize == 8:
        # |a| of 2^53 and up: its low 12 bits folded into bit 11 (sticky), which float64 keeps
        # and float32 rounds away, so the conversion to float64 below is exact
        m = a.astype(np.uint64)
        m = np.where(a < 0, np.uint64(0) - m, m) if a.dtype.kind == "i" else m
        folded = (m & ~np.uint64(0xFFF)) | ((m & np.uint64(0xFFF)) != 0).astype(np.uint64) << 11
        m = np.where(m >= np.uint64(1 << 53), folded, m).astype(np.float64)
        a = np.where(a < 0, -m, m) if a.dtype.kind == "i" else m
    a = np.asarray(a, dtype=np.float64)
    f = a.astype(np.float32)
    back = f.astype(np.float64)
    u = np.atleast_1d(f).view(np.uint32).reshape(f.shape)
    bump = (back != a) & ~np.isnan(a) & ((u & 1) == 0)
    step = np.where(np.abs(a) > np.abs(back), np.uint32(1), np.uint32(0xFFFFFFFF))
    return np.where(bump, u + step, u).astype(np.uint32).view(np.float32).reshape(f.shape)


def default_float_for(d: DType) -> DType:
    """The float dtype an integer or bool input becomes in a float-valued op (NumPy: float64);
    a float or complex dtype stays."""
    return d if d.is_float or d.is_complex else float64


def ufunc_float_for(d: DType) -> DType:
    """The float dtype a float-valued elementwise operator (sqrt, exp, ...) gives an input of
    dtype d: NumPy's loop choice, the narrowest float that holds every value of an integer (int8
    and uint8: float16; int16 and uint16: float32; wider: float64); bool float64."""
    if d.is_int and d.itemsize <= 2:
        return float16 if d.itemsize == 1 else float32
    return default_float_for(d)
