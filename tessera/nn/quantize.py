"""Weight-only int8 quantization: each output column of a float weight [K, N] as int8 with one
float32 scale, symmetric (no zero point): w ~ int8 * scale, |error| <= scale / 2. Activations
stay float32; ``nn.linear`` multiplies them by the bytes directly (``op.matmul_int8_weight``),
so a product reads a quarter of the float32 weight's bytes."""
from __future__ import annotations

import numpy as np

from ..errors import ArgumentError


def quantize_int8(w) -> dict:
    """{"int8": int8 [K, N], "scale": float32 [N]} of a float weight [K, N] (tessera's [in,
    out] layout): scale = max |w[:, j]| / 127, the int8 values round(w / scale) (an all-zero
    column: scale 1, zeros)."""
    w = np.asarray(w)
    if w.ndim != 2 or w.dtype.kind != "f":
        raise ArgumentError(f"quantize_int8 takes a float weight matrix [in, out], not "
                            f"{w.dtype}{list(w.shape)}")
    w = w.astype(np.float32)
    top = np.abs(w).max(axis=0)
    scale = np.where(top > 0, top / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return {"int8": q, "scale": scale}


def dequantize_int8(qw: dict) -> np.ndarray:
    """The float32 weight an int8 one stands for: int8 * scale."""
    return qw["int8"].astype(np.float32) * qw["scale"]
