"""Contractions: matmul (2-D, batched, broadcast batch dimensions, 1-D operands) and the exact
int32 product of 8-bit integer matrices."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError
from ..shapes import Sym, same
from ..types import TensorType
from .registry import Contract, OpDef, broadcast_shapes, cj, register, sum_to


def _matmul_infer(types, attrs):
    a, b = types
    d = _matmul_dtypes([a.dtype, b.dtype], attrs)[1]
    if d.is_bool:
        raise DTypeError("matmul of bool tensors", received=f"{a} @ {b}",
                         hint="cast to a numeric dtype first")
    return _product_type(a, b, d)


def _product_type(a, b, d):
    """The type of a @ b with NumPy's shapes (batch broadcasting, 1-D operands), dtype d."""
    if a.rank == 0 or b.rank == 0:
        raise ShapeError("matmul needs operands of rank 1 or more", received=f"{a} @ {b}",
                         hint="use op.mul (or *) to scale by a scalar")
    ash = a.shape if a.rank >= 2 else (1,) + a.shape
    bsh = b.shape if b.rank >= 2 else b.shape + (1,)
    ka, kb = ash[-1], bsh[-2]
    if not same(ka, kb) and (isinstance(ka, Sym) == isinstance(kb, Sym)):
        hint = None
        # (the operands as the user wrote them may already be transposed: `p @ v.T`)
        if b.rank >= 2 and same(ash[-1], bsh[-1]):
            hint = (f"the second operand's last axis ({bsh[-1]}) matches the first's inner size: "
                    "transpose the second operand, or drop its .T")
        elif a.rank >= 2 and same(ash[-2], bsh[-2]):
            hint = (f"the first operand's rows ({ash[-2]}) match the second's inner size: "
                    "transpose the first operand, or drop its .T")
        raise ShapeError(f"inner dimensions differ: {ka} vs {kb}",
                         expected=f"{a.dtype.short}[...,M,K] @ {b.dtype.short}[...,K,N]",
                         received=f"{a} @ {b}", hint=hint)
    try:
        batch = broadcast_shapes([TensorType(d, ash[:-2]), TensorType(d, bsh[:-2])])
    except ShapeError as e:
        e.summary = "batch dimensions do not broadcast: " + e.summary
        e.received = f"{a} @ {b}"
        raise
    shape = batch + ((ash[-2],) if a.rank >= 2 else ()) + ((bsh[-1],) if b.rank >= 2 else ())
    return TensorType(d, shape)


def _matmul_dtypes(ds, attrs):
    """Both operands in the promoted dtype; fp8 operands widen to float32 and give a float32
    product (fp8 is storage: its products accumulate and stay in float32, as fp8 GEMMs do)."""
    d = dt.result_type(*ds)
    d = dt.float32 if d.is_fp8 else d
    return [d, d], d


def _matmul_decompose(b, xs, attrs):
    x, y = xs
    tx, ty = b.type(x), b.type(y)
    if tx.dtype.is_fp8 or ty.dtype.is_fp8:      # widened exactly, a float32 product
        return b.op("matmul", *[b.op("cast", v, dtype="float32") for v in (x, y)],
                    tile_shape=attrs.get("tile_shape"))
    return _as_matrices(b, "matmul", x, y, tile_shape=attrs.get("tile_shape"))


def _as_matrices(b, name, x, y, **attrs):
    """A product with a 1-D operand as one of matrices (a row, a column), reshaped back; None
    (primitive) when both are matrices already."""
    tx, ty = b.type(x), b.type(y)
    if tx.rank >= 2 and ty.rank >= 2:
        return None
    x2 = b.op("reshape", x, shape=[1, tx.shape[0]]) if tx.rank == 1 else x
    y2 = b.op("reshape", y, shape=[ty.shape[0], 1]) if ty.rank == 1 else y
    out = b.op(name, x2, y2, **attrs)
    return b.op("reshape", out, shape=list(_product_type(tx, ty, b.type(out).dtype).shape))


def _matmul_normalize(types, attrs):
    tile = attrs.get("tile_shape")
    if tile is not None:
        if not isinstance(tile, (tuple, list)) or len(tile) not in (2, 3) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tile):
            raise ShapeError(f"tile_shape must be (BM, BN) or (BM, BN, BK) of positive integers, "
                             f"not {tile!r}")
        tile = list(tile)
    return {"tile_shape": tile}


def _rows(b, t):
    return b.op("reshape", t, shape=[-1, t.shape[-1]])


def _matmul_vjp(b, xs, y, g, attrs):
    """da = g @ w^T, dw = a^T @ g, a 1-D operand as a matrix with one row (a) or column (w);
    batch axes that were broadcast are summed here, to the operand's shape."""
    a, w = xs
    a2 = a if a.ndim >= 2 else b.op("reshape", a, shape=[1, a.shape[0]])
    w2 = w if w.ndim >= 2 else b.op("reshape", w, shape=[w.shape[0], 1])
    shape = list(y.shape)
    if a.ndim == 1:
        shape.insert(len(shape) - (w.ndim >= 2), 1)
    if w.ndim == 1:
        shape.append(1)
    g2 = b.op("reshape", g, shape=shape) if len(shape) != g.ndim else g
    a2, w2 = cj(b, a2), cj(b, w2)       # (complex operands: g @ conj(w)^T, conj(a)^T @ g)
    da = sum_to(b, b.op("matmul", g2, b.op("transpose", w2)), a2.shape)
    if w2.ndim == 2 and a2.ndim > 2:
        # a weight applied to a batch of rows: contract the batch too, [K, B*M] @ [B*M, N]
        # (no per-batch products to sum afterwards)
        dw = b.op("matmul", b.op("transpose", _rows(b, a2)), _rows(b, g2))
    else:
        dw = sum_to(b, b.op("matmul", b.op("transpose", a2), g2), w2.shape)
    return [b.op("reshape", da, shape=list(a.shape)) if a.ndim == 1 else da,
            b.op("reshape", dw, shape=list(w.shape)) if w.ndim == 1 else dw]


register(OpDef(
    "matmul", 2, {"tile_shape": None}, normalize=_matmul_normalize,
    infer=_matmul_infer, dtype_rule=_matmul_dtypes,
    reference=lambda a, t: np.matmul(a[0], a[1]), decompose=_matmul_decompose,
    lowering=Contract(), ufunc="matmul", vjp=_matmul_vjp, accumulates=True,
    doc="matrix product with NumPy's broadcasting of batch dimensions; tile_shape=(BM, BN, BK) "
        "sets the kernel's tiles"))



# ---- 8-bit integer products ---------------------------------------------------------------------
_BYTES = (dt.int8, dt.uint8)


def _integer_infer(types, attrs):
    a, b = types
    if a.dtype not in _BYTES or b.dtype not in _BYTES:
        raise DTypeError("matmul_integer multiplies int8 and uint8 matrices",
                         received=f"{a} @ {b}",
                         hint="op.matmul_integer(a, b) takes any integers (wider ones are "
                              "widened to int32 first); this operator is its 8-bit core")
    return _product_type(a, b, dt.int32)


register(OpDef(
    "matmul_integer", 2, {}, infer=_integer_infer,
    dtype_rule=lambda ds, attrs: (list(ds), dt.int32),
    reference=lambda a, t: np.matmul(a[0].astype(np.int32), a[1].astype(np.int32)),
    decompose=lambda b, xs, attrs: _as_matrices(b, "matmul_integer", *xs),
    lowering=Contract(), differentiable=False,
    doc="the product of int8 or uint8 matrices, exact in int32 (wrapping past it): ONNX's "
        "MatMulInteger without zero points, torch._int_mm; on the CPU with the integer dot "
        "products of the ISA level (VNNI, NEON's sdot)"))


# ---- int8 weights (weight-only quantization) -----------------------------------------------------
def _int8_weight_infer(types, attrs):
    a, w = types
    if a.dtype != dt.float32 or w.dtype != dt.int8:
        raise DTypeError("matmul_int8_weight multiplies float32 activations by int8 weights",
                         received=f"{a} @ {w}",
                         hint="op.matmul_int8_weight(x, w, scale) takes the weights as "
                              "nn.quantize_int8 gives them")
    return _product_type(a, w, dt.float32)


register(OpDef(
    "matmul_int8_weight", 2, {}, infer=_int8_weight_infer,
    dtype_rule=lambda ds, attrs: (list(ds), dt.float32),
    reference=lambda a, t: np.matmul(a[0], a[1].astype(np.float32)),
    decompose=lambda b, xs, attrs: _as_matrices(b, "matmul_int8_weight", *xs),
    lowering=Contract(), differentiable=False,
    doc="float32 activations times int8 weights, in float32 (each weight widened exactly): "
        "weight-only quantization's product, reading a quarter of float32's bytes; the bits "
        "of matmul(x, float32(w))"))
