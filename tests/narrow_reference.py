"""Narrow float formats rounded by exact rational arithmetic: the expected bits of casts,
independent of NumPy's and ml_dtypes' releases (conftest re-exports it for the tests)."""
import math

import numpy as np

# Narrow float formats: (exponent bits, fraction bits, whether the top exponent holds inf).
# float8_e4m3fn has no inf: its top exponent holds numbers up to 448 and NaN (fraction 111).
NARROW_FORMATS = {"float16": (5, 10, True), "bfloat16": (8, 7, True),
                  "float8_e4m3fn": (4, 3, False), "float8_e5m2": (5, 2, True)}


def round_to_narrow_bits(values, fmt: str) -> np.ndarray:
    """Each value (float64 or integer) rounded once to nearest even in a narrow format, as its
    bits, by exact rational arithmetic: an independent reference for casts, whatever NumPy or
    ml_dtypes do. Overflow gives inf (NaN in float8_e4m3fn); NaN gives the quiet NaN with the
    value's sign (compare NaN bits only through isnan)."""
    from fractions import Fraction
    ebits, fbits, has_inf = NARROW_FORMATS[fmt]
    bias = (1 << (ebits - 1)) - 1
    top = (1 << ebits) - 1
    emax = bias if has_inf else top - bias                  # the largest normal exponent
    largest = Fraction((1 << (fbits + 1)) - (1 if has_inf else 2), 1 << fbits) * Fraction(2) ** emax
    out = []
    for v in np.asarray(values).ravel().tolist():
        neg = (v < 0) or (isinstance(v, float) and math.copysign(1.0, v) < 0)
        sign = 1 << (ebits + fbits) if neg else 0
        if isinstance(v, float) and math.isnan(v):
            out.append(sign | (top << fbits) | (1 << (fbits - 1)) | (0 if has_inf else 0x7))
            continue
        if isinstance(v, float) and math.isinf(v):
            out.append(sign | ((top << fbits) if has_inf else 0x7F))
            continue
        a = abs(Fraction(v))
        e = 1 - bias                                          # the exponent of the quantum
        if a:                                                 # floor(log2 a), exactly
            lg = a.numerator.bit_length() - a.denominator.bit_length()
            e = max(e, lg if a >= Fraction(2) ** lg else lg - 1)
        quantum = Fraction(2) ** (e - fbits)
        n = round(a / quantum)                                # ties to even
        r = n * quantum
        if r > largest:
            out.append(sign | ((top << fbits) if has_inf else 0x7F))
            continue
        if n < (1 << fbits):                                  # subnormal (or zero)
            out.append(sign | n)
            continue
        if n >= 1 << (fbits + 1):                             # rounded up to the next binade
            n, e = n >> 1, e + 1
        out.append(sign | ((e + bias) << fbits) | (n - (1 << fbits)))
    return np.array(out, dtype=np.uint16 if ebits + fbits == 15 else np.uint8).reshape(
        np.shape(values))
