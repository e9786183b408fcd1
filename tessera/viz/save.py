"""Saving drawings to files: a graph (as SVG) or a matplotlib figure."""
from __future__ import annotations

from pathlib import Path

from ..runtime.cache import atomic_write
from .figures import figure_svg
from .svg import graph_svg


def save_svg(obj, path, **kw) -> Path:
    """Write graph_svg(obj, **kw) to path (a matplotlib Figure: figure_svg(obj)), atomically:
    a reader sees the old file or the new one, never a part. Returns the path."""
    if hasattr(obj, "savefig"):
        text = figure_svg(obj)
    else:
        text = graph_svg(obj, **kw)
    path = Path(path)
    atomic_write(path, text.encode())
    return path
