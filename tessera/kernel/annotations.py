"""`Tile["M", "K", bf16]`: the annotation of a tile kernel's parameter (dimension names, then
an optional dtype)."""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes as dt
from ..errors import ArgumentError, TesseraError
from ..trace import user_location


@dataclass(frozen=True)
class TileSpec:
    dims: tuple                 # dimension names, one per axis
    dtype: object = None        # a DType, or None: the argument's

    def __repr__(self):
        parts = [repr(d) for d in self.dims] + ([self.dtype.short] if self.dtype else [])
        return f"Tile[{', '.join(parts)}]"


class _TileMeta(type):
    def __getitem__(cls, items):
        items = items if isinstance(items, tuple) else (items,)
        dims, dtype = [], None
        for it in items:
            if isinstance(it, str) and dtype is None and it.isidentifier() and \
                    it not in dt._BY_NAME:
                dims.append(it)
            elif isinstance(it, str) and it.isidentifier() and it not in dt._BY_NAME:
                raise ArgumentError(f"Tile[...]: the dtype comes last, after the dimensions "
                                    f"(got {it!r} after it)", location=user_location())
            else:
                try:
                    dtype = dt.get(it)
                except TesseraError:
                    raise ArgumentError(f"Tile[...] takes dimension names then an optional "
                                        f"dtype, not {it!r}", location=user_location(),
                                        hint='Tile["M", "K", bf16]') from None
        return TileSpec(tuple(dims), dtype)


class Tile(metaclass=_TileMeta):
    """The annotation of a tile kernel's parameter: `Tile["M", "K", bf16]` (dimension names,
    then an optional dtype)."""
