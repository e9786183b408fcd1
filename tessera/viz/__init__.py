"""tessera.viz: pure functions that draw Tessera's objects as DOT, SVG, HTML, figures and tables.

No widgets and no IPython here (tessera.lab builds on these); pandas, matplotlib and pygments are
imported by the functions that need them. Every HTML and SVG text is the same for the same input.

    graph_dot(obj, clusters=True, failing=None, title=None)   Graphviz DOT of a Graph IR
    graph_svg(obj, **kw), save_svg(obj, path, **kw)            the same as SVG (dot, or built-in)
    graph_image(obj, **kw), figure_image(fig)                  a drawing for a notebook: PNG + SVG
    schedule_rows(s), schedule_table(s)                        one row per Schedule IR kernel
    profile_rows(p), profile_table(p)                          a Profile's per-kernel rows
    profile_figure(p), roofline_figure(p, peaks=None)          its times and its roofline
    autotune_rows(r), autotune_table(r), autotune_figure(r)    an autotuning result's candidates
    highlight_html(text, language)                             C / CUDA / HIP / IR as HTML
    figure_svg(fig), figure_png(fig), html_table(rows)         rendering helpers
    img_html(svg, alt)                                         an SVG as an <img> inside HTML
    block_rows(x), block_html(x)                               a mesh's devices, a DTensor's blocks
"""
from .code import highlight_html
from .figures import autotune_figure, figure_png, figure_svg, profile_figure, roofline_figure
from .graph import graph_dot
from .image import Image, figure_image, graph_image, img_html
from .save import save_svg
from .svg import graph_svg
from .tables import (autotune_rows, autotune_table, block_html, block_rows, html_table,
                     profile_rows, profile_table, schedule_rows, schedule_table)

__all__ = ["graph_dot", "graph_svg", "save_svg", "schedule_rows", "schedule_table",
           "highlight_html", "profile_rows", "profile_table", "profile_figure", "roofline_figure",
           "autotune_rows", "autotune_table", "autotune_figure", "figure_svg", "figure_png",
           "html_table", "Image", "graph_image", "figure_image", "img_html", "block_rows",
           "block_html"]
