"""Graph IR as SVG: Graphviz's `dot` when it is installed, else a small layered layout in pure
Python (boxes in topological layers, kernel clusters as rectangles, edges as curves with their
type labels, an edge across several layers down a lane of its own in each). Both give the same
text for the same graph on every run."""
from __future__ import annotations

import heapq
import os
import re
import shutil
import subprocess
import warnings
from html import escape

from ..errors import ArgumentError, BackendUnavailableError
from .graph import FILL, RED, Drawing, drawing, to_dot

DOT_TIMEOUT_S = 30.0
SIZE = {"head": 12, "attr": 10, "loc": 9, "note": 9}
COLOR = {"head": "#202124", "attr": "#3c4043", "loc": "#80868b", "note": "#1a73e8"}
CHAR = 0.61             # a monospace glyph's advance, per unit of font size
LINE = 1.3              # line height, per unit of font size
PAD_X, PAD_Y = 8, 5     # inside a box
GAP_X = 18              # between boxes (and clusters) side by side
GAP_Y = 44              # between layers: room for an edge label
CLUSTER_PAD, CLUSTER_LABEL = 10, 18
LABEL_SIZE = 9
MARGIN = 12
LANE = 14               # the slot a long edge takes in each layer it passes


def svg_body(text: str) -> str:
    """The <svg> element alone: no XML prolog, doctype or comments (graphviz's name its
    version), so the text embeds in HTML and does not change with the tool's version banner."""
    text = re.sub(r"<!--.*?-->\n?", "", text, flags=re.S)
    start = text.find("<svg")
    return text[start:].strip() + "\n" if start >= 0 else text


def graph_svg(obj, *, layout: str | None = None, timeout: float = DOT_TIMEOUT_S, **kw) -> str:
    """SVG text of graph_dot(obj, **kw) (same keywords). layout: "dot" (Graphviz's dot binary),
    "python" (the built-in layered layout), or None: dot when it is on PATH and TESSERA_NO_DOT
    is not set, else python (also when dot fails or takes longer than `timeout` seconds)."""
    return drawing_svg(drawing(obj, **kw), layout, timeout)[0]


def drawing_svg(d: Drawing, layout: str | None = None, timeout: float = DOT_TIMEOUT_S) -> tuple:
    """(SVG text of the Drawing, whether Graphviz's dot drew it): see graph_svg."""
    if layout not in (None, "dot", "python"):
        raise ArgumentError(f"unknown layout {layout!r}", expected="'dot', 'python' or None")
    if layout == "python" or layout is None and os.environ.get("TESSERA_NO_DOT") == "1":
        return layout_svg(d), False
    exe = shutil.which("dot")
    if exe is None:
        if layout == "dot":
            raise BackendUnavailableError("Graphviz's dot is not installed",
                                          hint="apt-get install graphviz, or layout='python'")
        return layout_svg(d), False
    try:
        run = subprocess.run([exe, "-Tsvg"], input=to_dot(d).encode(), capture_output=True,
                             timeout=timeout)
        if run.returncode == 0:
            return svg_body(run.stdout.decode()), True
        why = run.stderr.decode(errors="replace").strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        why = str(e)
    if layout == "dot":
        raise BackendUnavailableError(f"dot failed: {why}")
    warnings.warn(f"tessera.viz: dot failed ({why}); drawing with the built-in layout",
                  RuntimeWarning, stacklevel=3)
    return layout_svg(d), False


# ---- the built-in layout -------------------------------------------------------------------------
def _box_size(lines) -> tuple:
    w = max(len(t) * CHAR * SIZE[s] for t, s in lines) + 2 * PAD_X
    h = sum(SIZE[s] * LINE for _, s in lines) + 2 * PAD_Y
    return w, h


def _topo_order(keys, edges, rank) -> dict:
    """Position of each key in a topological order of edges (Kahn's, lowest rank first; on a
    cycle the lowest-ranked key left goes next)."""
    keys = sorted(keys, key=rank.__getitem__)
    succs = {k: [] for k in keys}
    indeg = dict.fromkeys(keys, 0)
    for a, b in edges:
        if a != b:
            succs[a].append(b)
            indeg[b] += 1
    ready = [(rank[k], k) for k in keys if indeg[k] == 0]
    heapq.heapify(ready)
    done, pos = set(), {}
    while len(pos) < len(keys):
        if not ready:
            k = next(k for k in keys if k not in done)
            heapq.heappush(ready, (rank[k], k))
        _, k = heapq.heappop(ready)
        if k in done:
            continue
        done.add(k)
        pos[k] = len(pos)
        for b in succs[k]:
            indeg[b] -= 1
            if indeg[b] == 0 and b not in done:
                heapq.heappush(ready, (rank[b], b))
    return pos


def _layers(keys, edges, order, floating=frozenset()) -> tuple:
    """Longest-path layers over the edges that go forward in `order` (which breaks any cycle),
    with the `floating` sources (constants) just above their first successor instead of at the
    top: ({key: layer}, {key: predecessors}, {key: successors})."""
    preds = {k: [] for k in keys}
    succs = {k: [] for k in keys}
    for a, b in edges:
        if a != b and order[a] < order[b]:
            preds[b].append(a)
            succs[a].append(b)
    layer = {}
    for k in sorted(keys, key=order.__getitem__):
        layer[k] = max((layer[p] + 1 for p in preds[k]), default=0)
    for k in sorted(keys, key=order.__getitem__, reverse=True):
        if k in floating and not preds[k] and succs[k]:
            layer[k] = max(0, min(layer[s] for s in succs[k]) - 1)
    return layer, preds, succs


def layout_svg(d: Drawing) -> str:
    order = {b.id: i for i, b in enumerate(d.boxes)}
    size = {b.id: _box_size(b.lines) for b in d.boxes}
    consts = {b.id for b in d.boxes if b.kind == "const"}
    item = {b.id: ("c", b.cluster) if b.cluster is not None else ("b", b.id) for b in d.boxes}
    first = {}
    for b in d.boxes:
        first.setdefault(item[b.id], order[b.id])
    item_edges = [(item[e.src], item[e.dst]) for e in d.edges]
    item_order = _topo_order(list(first), item_edges, first)
    members = {}
    for b in d.boxes:
        members.setdefault(item[b.id], []).append(b.id)

    # inside each cluster: rows of members by their own longest-path layers
    inner, item_size = {}, {}
    for it, ids in members.items():
        if it[0] == "b":
            item_size[it] = size[ids[0]]
            continue
        mine = set(ids)
        sub, _, _ = _layers(ids, [(e.src, e.dst) for e in d.edges
                                  if e.src in mine and e.dst in mine], order, consts)
        rows = [[i for i in ids if sub[i] == r] for r in range(max(sub.values()) + 1)]
        rows = [r for r in rows if r]
        # inside the cluster too, an edge passing a row goes down a lane at the row's end
        row_of = {i: n for n, r in enumerate(rows) for i in r}
        for k, e in enumerate(d.edges):
            src, dst = row_of.get(e.src), row_of.get(e.dst)
            if src is None and dst is None or e.src == e.dst:
                continue
            passed = range(0 if src is None else src + 1, len(rows) if dst is None else dst)
            for n in passed:
                rows[n].append(("lane", k))
                size[("lane", k)] = (LANE, 0)
        widths = [sum(size[i][0] for i in r) + GAP_X * (len(r) - 1) for r in rows]
        heights = [max(size[i][1] for i in r) for r in rows]
        label_w = len(d.clusters[it[1]].label) * CHAR * 10 + 2 * CLUSTER_PAD
        w = max(max(widths) + 2 * CLUSTER_PAD, label_w)
        h = CLUSTER_LABEL + sum(heights) + GAP_Y * (len(rows) - 1) + 2 * CLUSTER_PAD
        inner[it] = (rows, widths, heights)
        item_size[it] = (w, h)

    layer, preds, succs = _layers(list(members), item_edges, item_order,
                                  {("b", i) for i in consts})
    # an edge across several layers takes a lane of its own in each layer it passes (a dummy
    # item there), so it goes around the boxes of those layers instead of behind them
    lanes = {}
    for a, b in dict.fromkeys(item_edges):
        if a == b or layer[b] - layer[a] <= 1:
            continue
        chain = [("lane", a, b, lay) for lay in range(layer[a] + 1, layer[b])]
        for k, lane in enumerate(chain):
            layer[lane] = layer[a] + 1 + k
            preds[lane] = [chain[k - 1] if k else a]
            item_size[lane] = (LANE, 0)
            item_order[lane] = item_order[a]
        lanes[(a, b)] = chain

    # layers top to bottom; within one, items ordered by their predecessors' mean x
    pos, centre, rows_at = {}, {}, {}
    title_h = 24
    y = MARGIN + title_h
    items = [*members, *(lane for chain in lanes.values() for lane in chain)]
    for lay in range(max(layer.values(), default=-1) + 1):
        row = [it for it in items if layer[it] == lay]
        if not row:
            continue

        def key(it):
            xs = [centre[p] for p in preds[it] if p in centre]
            return (sum(xs) / len(xs) if xs else float("inf"), item_order[it])
        row.sort(key=key)
        width = sum(item_size[it][0] for it in row) + GAP_X * (len(row) - 1)
        x = -width / 2
        for it in row:
            pos[it] = (x, y)
            centre[it] = x + item_size[it][0] / 2
            x += item_size[it][0] + GAP_X
        rows_at[lay] = (y, max(item_size[it][1] for it in row))
        y += rows_at[lay][1] + GAP_Y
    left = min(x for x, _ in pos.values())
    right = max(x + item_size[it][0] for it, (x, _) in pos.items())
    width = max(right - left, len(d.title) * CHAR * 13) + 2 * MARGIN
    height = y - GAP_Y + MARGIN
    shift = MARGIN - left + (width - 2 * MARGIN - (right - left)) / 2

    rect = {}                   # box id -> (x, y, w, h), absolute
    inner_lanes = {}            # edge index -> [(x, top, bottom)] of lanes inside clusters
    entry = {}                  # box id -> the top of the region an edge from outside enters
    clusters = []
    for it, (x, y0) in pos.items():
        x += shift
        if it[0] == "lane":
            continue
        if it[0] == "b":
            rect[it[1]] = (x, y0, *item_size[it])
            entry[it[1]] = y0
            continue
        w, h = item_size[it]
        clusters.append((it[1], x, y0, w, h))
        rows, widths, heights = inner[it]
        ry = y0 + CLUSTER_PAD + CLUSTER_LABEL
        for n, (r, rw, rh) in enumerate(zip(rows, widths, heights)):
            bx = x + (w - rw) / 2
            for i in r:
                if i[0] == "lane":
                    inner_lanes.setdefault(i[1], []).append((bx + LANE / 2, ry, ry + rh))
                else:
                    rect[i] = (bx, ry, *size[i])
                    entry[i] = y0 if n == 0 else ry
                bx += size[i][0] + GAP_X
            ry += rh + GAP_Y

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="DejaVu Sans Mono, Menlo, '
           f'Consolas, monospace">',
           f"<title>{escape(d.title)}</title>",
           f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
           f'<text x="{width / 2:.1f}" y="{MARGIN + 14}" text-anchor="middle" font-size="13" '
           f'font-family="Helvetica, Arial, sans-serif" fill="#202124">{escape(d.title)}</text>']
    for ki, x, y0, w, h in sorted(clusters):
        c = d.clusters[ki]
        out.append(f'<g class="cluster"><title>{escape(c.name)}: {escape(c.tooltip)}</title>'
                   f'<rect x="{x:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{h:.1f}" rx="6" '
                   f'fill="#f1f5fb" stroke="#8ab4f8"/>'
                   f'<text x="{x + CLUSTER_PAD:.1f}" y="{y0 + CLUSTER_PAD + 9:.1f}" font-size="10" '
                   f'fill="#174ea6">{escape(c.label)}</text></g>')
    via = {}                    # edge index -> (x, top, bottom) of each lane it passes
    for k, e in enumerate(d.edges):
        chain = lanes.get((item[e.src], item[e.dst]), ())
        via[k] = sorted([(pos[lane][0] + shift + LANE / 2, rows_at[lane[3]][0],
                          sum(rows_at[lane[3]])) for lane in chain] + inner_lanes.get(k, []),
                        key=lambda v: v[1])
    curves, labels = _edges_svg(d, rect, entry, via)
    out += curves
    for b in d.boxes:
        x, y0, w, h = rect[b.id]
        fill = FILL["failing" if b.failing else b.kind]
        stroke = RED if b.failing else "#5f6368"
        dash = ' stroke-dasharray="4 3"' if b.kind == "part" else ""
        out.append(f'<g class="node"><title>{escape(b.id)}</title>'
                   f'<rect x="{x:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{h:.1f}" rx="4" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="{2 if b.failing else 1}"'
                   f"{dash}/>")
        ty = y0 + PAD_Y
        for text, style in b.lines:
            ty += SIZE[style] * LINE
            weight = ' font-weight="bold"' if style == "head" else ""
            out.append(f'<text x="{x + w / 2:.1f}" y="{ty - SIZE[style] * 0.3:.1f}" '
                       f'text-anchor="middle" font-size="{SIZE[style]}" fill="{COLOR[style]}"'
                       f"{weight}>{escape(text)}</text>")
        out.append("</g>")
    out += labels
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _bezier(p0, p1, p2, p3, t):
    u = 1 - t
    return u ** 3 * p0 + 3 * u * u * t * p1 + 3 * u * t * t * p2 + t ** 3 * p3


def _edges_svg(d: Drawing, rect, entry, via) -> tuple:
    """(curves, labels): each edge from a box's bottom to another's top, the ends spread along
    the sides (two operands of one node, or one value used twice, stay apart), down the lanes
    it is given in the layers it passes (via: edge index -> [(x, top, bottom)]); its label
    sits in the gap just above the region it enters (entry: box id -> that region's top),
    where the ends are spread, clear of every box and of the labels placed before it, and is
    drawn over everything else so no box hides it."""
    cx = {i: r[0] + r[2] / 2 for i, r in rect.items()}
    outs, ins = {}, {}
    for k, e in enumerate(d.edges):
        outs.setdefault(e.src, []).append(k)
        ins.setdefault(e.dst, []).append(k)
    start, end = {}, {}
    for ends, side, other in ((outs, start, lambda e: e.dst), (ins, end, lambda e: e.src)):
        for box, ks in ends.items():
            ks = sorted(ks, key=lambda k: (cx[other(d.edges[k])], k))
            x, _, w, _ = rect[box]
            for j, k in enumerate(ks):
                side[k] = x + w * (j + 1) / (len(ks) + 1)
    cluster = {b.id: b.cluster for b in d.boxes}
    failed = {b.id for b in d.boxes if b.failing}
    curves, labels, placed = [], [], []
    for k, e in enumerate(d.edges):
        sx, sy, _, sh = rect[e.src]
        x1, y1 = start[k], sy + sh
        x2, y2 = end[k], rect[e.dst][1]
        path = f"M{x1:.1f},{y1:.1f}"
        for lx, top, bottom in via[k]:       # down each lane, then on from its bottom
            dy = max(18.0, abs(top - y1) / 2)
            path += (f" C{x1:.1f},{y1 + dy:.1f} {lx:.1f},{top - dy:.1f} {lx:.1f},{top:.1f}"
                     f" L{lx:.1f},{bottom:.1f}")
            x1, y1 = lx, bottom
        dy = max(18.0, abs(y2 - y1) / 2)
        xs, ys = (x1, x1, x2, x2), (y1, y1 + dy, y2 - dy, y2)
        color = RED if e.dst in failed else "#5f6368"
        dash = ' stroke-dasharray="4 3"' if e.dashed else ""
        curves.append(f'<g class="edge"><title>{escape(e.src)} -&gt; {escape(e.dst)}</title>'
                      f'<path d="{path} C{x1:.1f},{y1 + dy:.1f} {x2:.1f},'
                      f'{y2 - dy:.1f} {x2:.1f},{y2 - 6:.1f}" fill="none" stroke="{color}"{dash}/>'
                      f'<polygon points="{x2 - 4:.1f},{y2 - 7:.1f} {x2 + 4:.1f},{y2 - 7:.1f} '
                      f'{x2:.1f},{y2:.1f}" fill="{color}"/></g>')
        top = y2 if cluster[e.src] == cluster[e.dst] else entry[e.dst]
        ly = top - GAP_Y / 2
        if ly <= y1 + 6:
            t = 0.5
        else:                       # the curve's point at height ly
            lo, hi = 0.0, 1.0
            for _ in range(30):
                t = (lo + hi) / 2
                lo, hi = (t, hi) if _bezier(*ys, t) < ly else (lo, t)
        lx, ly = _bezier(*xs, t), _bezier(*ys, t)
        lw = len(e.label) * CHAR * LABEL_SIZE + 6

        def free(y):
            return not any(abs(lx - px) < (lw + pw) / 2 and abs(y - py) < 13
                           for px, py, pw in placed) and \
                not any(bx - lw / 2 < lx < bx + bw + lw / 2 and by - 7 < y < by + bh + 7
                        for bx, by, bw, bh in rect.values())
        # nearest free height, first up towards the source, then down
        ly = next((ly + dy for dy in (0, -13, 13, -26, 26, -39) if free(ly + dy)), ly)
        placed.append((lx, ly, lw))
        labels.append(f'<g class="edge-label"><rect x="{lx - lw / 2:.1f}" y="{ly - 7:.1f}" '
                      f'width="{lw:.1f}" height="13" fill="#ffffff" fill-opacity="0.85"/>'
                      f'<text x="{lx:.1f}" y="{ly + 3:.1f}" text-anchor="middle" '
                      f'font-size="{LABEL_SIZE}" fill="#1a5fb4">{escape(e.label)}</text></g>')
    return curves, labels
