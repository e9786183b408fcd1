"""Drawings as images a notebook shows without trusting it.

JupyterLab and Notebook 7 sanitise what an untrusted notebook shows (GitHub's viewer sanitises
HTML too): an `<svg>` inside HTML is stripped to its bare text, and an `image/svg+xml` output is
skipped for its text/plain. A PNG output, and an `<img>` whose source is a data URI, survive. So
a drawing is an Image: a PNG (Graphviz's `dot -Tpng`, or Agg for a figure) beside the SVG, for
the front end to pick; and a drawing inside an HTML page (the explorer's sections) is an `<img>`
of its SVG.
"""
from __future__ import annotations

import base64
import os
import re
import struct
import subprocess
from html import escape

from ..errors import ArgumentError, BackendUnavailableError
from .figures import figure_png, figure_svg
from .graph import drawing, to_dot
from .svg import DOT_TIMEOUT_S, drawing_svg

PNG_DPI = 144           # drawn at 1.5x and shown at its size in CSS pixels: sharp on HiDPI screens


def data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def img_html(svg: str, alt: str) -> str:
    """An `<img>` of the SVG: kept by the HTML sanitisers that strip an inline `<svg>`."""
    m = re.search(r'<svg[^>]*\swidth="([\d.]+)(pt|px)?"', svg)
    width = ""
    if m:           # Graphviz sizes its drawings in points: shown at the same size as inline
        px = float(m.group(1)) * (96 / 72 if m.group(2) == "pt" else 1)
        width = f' width="{px:.0f}"'
    return (f'<img src="{data_uri(svg)}" alt="{escape(alt)}"{width} '
            f'style="max-width:100%;height:auto">')


def _png_width(png: bytes) -> int:
    return struct.unpack(">I", png[16:20])[0]


class Image:
    """A drawing for a notebook: its SVG text, a PNG when one could be rendered, and a line of
    text. As a cell's value it shows the PNG in an untrusted notebook and the SVG in a trusted
    one; without a PNG, an HTML `<img>` of the SVG stands in for it."""

    def __init__(self, svg: str, png: bytes | None, text: str, png_dpi: int = PNG_DPI):
        self.svg, self.png, self.text, self.png_dpi = svg, png, text, png_dpi

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": self.text, "image/svg+xml": self.svg}
        if self.png is None:
            return {**bundle, "text/html": img_html(self.svg, self.text)}
        bundle["image/png"] = base64.b64encode(self.png).decode()
        shown = round(_png_width(self.png) * 96 / self.png_dpi)
        return bundle, {"image/png": {"width": shown}}

    def __repr__(self):
        return self.text

    def save(self, path) -> "os.PathLike":
        """Write the SVG (a .svg path) or the PNG (.png) atomically; returns the path."""
        from pathlib import Path

        from ..runtime.cache import atomic_write
        path = Path(path)
        if path.suffix == ".svg":
            data = self.svg.encode()
        elif path.suffix == ".png":
            if self.png is None:
                raise BackendUnavailableError("no PNG of this drawing: Graphviz's dot renders "
                                              "graphs to PNG", hint="apt-get install graphviz, "
                                              "or save it as .svg")
            data = self.png
        else:
            raise ArgumentError(f"cannot save a drawing as {path.name!r}",
                                expected="a .svg or .png path")
        atomic_write(path, data)
        return path


def _dot_png(dot_text: str, timeout: float):
    """PNG bytes from Graphviz (which drew the SVG, so it is there), or None if it fails."""
    try:
        run = subprocess.run(["dot", "-Tpng", f"-Gdpi={PNG_DPI}"], input=dot_text.encode(),
                             capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    ok = run.returncode == 0 and run.stdout.startswith(b"\x89PNG")
    return run.stdout if ok else None


def graph_image(obj, *, layout: str | None = None, **kw) -> Image:
    """The drawing of graph_svg(obj, layout=layout, **kw) as an Image for a notebook, with a
    PNG from Graphviz when it draws the graph."""
    d = drawing(obj, **kw)
    svg, by_dot = drawing_svg(d, layout)
    png = _dot_png(to_dot(d), DOT_TIMEOUT_S) if by_dot else None
    return Image(svg, png, f"<drawing of {d.title}: {len(d.boxes)} boxes>")


def figure_image(fig) -> Image:
    """A matplotlib figure as an Image (SVG and PNG)."""
    return Image(figure_svg(fig), figure_png(fig, dpi=PNG_DPI), "<figure>")
