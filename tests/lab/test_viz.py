"""tessera.viz on real traced and compiled functions: the DOT's shape flow against shapes worked
out with NumPy and from the Graph's values, kernel clusters against the Schedule, determinism,
the built-in SVG layout, failing-node marking, tables, highlighting, and figures of a real
profile and a real autotuning run."""
import base64
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html import unescape

import numpy as np
import pytest

import tessera as ts
import tessera.viz as viz
from tessera import Tensor, op

DOT = shutil.which("dot")
needs_dot = pytest.mark.skipif(DOT is None, reason="Graphviz's dot is not installed")
SVG_NS = "{http://www.w3.org/2000/svg}"


# ---- functions to draw ---------------------------------------------------------------------------
def attention_fn(Q, K, V):
    S = op.matmul(Q, K.T)
    A = op.softmax(S)
    return op.matmul(A, V)


def layer_norm_fn(x: Tensor["B", "S", "D"]) -> Tensor["B", "S", "D"]:
    mean = x.mean(axis=-1, keepdim=True)
    var = x.var(axis=-1, keepdim=True)
    return (x - mean) / op.sqrt(var + 1e-5)


def dense_gelu_fn(x: Tensor["B", "D"], w: Tensor["D", "H"], b: Tensor["H"]):
    return op.gelu(x @ w + b)


def split_softmax_fn(x):
    return op.softmax(x, axis=0) * 2.0, op.sum(x.reshape(-1)), x.T @ x


def bad_fn(x: Tensor["B", "S", "D"], w: Tensor["S", "D"]):
    y = op.exp(x)
    return y @ w


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- reading DOT back ----------------------------------------------------------------------------
def label_of(dtype, shape) -> str:
    """An edge label worked out here: dtype's IR spelling and the dims."""
    short = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64", "bool": "bool"}
    return f"{short[np.dtype(dtype).name]}[{','.join(str(d) for d in shape)}]"


def parse_dot(text):
    """(edges [(tail, head, label)], clusters {name: [node names]}), by Graphviz itself
    (dot -Tjson0) when installed, else by a reading of the DOT text's lines."""
    if DOT is not None:
        run = subprocess.run([DOT, "-Tjson0"], input=text.encode(), capture_output=True,
                             timeout=60)
        assert run.returncode == 0, run.stderr.decode()
        g = json.loads(run.stdout)
        objs = g["objects"]
        name = {o["_gvid"]: o["name"] for o in objs if "nodes" not in o and "_gvid" in o}
        clusters = {o["name"]: sorted(name[i] for i in o.get("nodes", []))
                    for o in objs if o["name"].startswith("cluster_")}
        edges = [(name[e["tail"]], name[e["head"]], e["label"]) for e in g.get("edges", [])]
        return edges, clusters
    edges = re.findall(r'^\s*"(\w+)" -> "(\w+)" \[label="([^"]*)"', text, flags=re.M)
    clusters, current = {}, None
    for line in text.splitlines():
        m = re.match(r'\s*subgraph "(cluster_\w+)" \{', line)
        if m:
            current = clusters.setdefault(m.group(1), [])
        elif line == "  }":
            current = None
        elif current is not None and re.match(r'\s*"(\w+)" \[', line):
            current.append(re.match(r'\s*"(\w+)" \[', line).group(1))
    return edges, {k: sorted(v) for k, v in clusters.items()}


def expected_edges(graph):
    """Every Graph IR edge (operand -> node, result -> return) with its label, from the values."""
    ids = {p.id: f"p{k}" for k, p in enumerate(graph.params)}
    ids.update({n.out.id: f"n{i}" for i, n in enumerate(graph.nodes)})
    edges = [(ids[v.id], f"n{i}", label_of(v.type.dtype.np, v.type.shape))
             for i, n in enumerate(graph.nodes) for v in n.inputs]
    edges += [(ids[v.id], f"o{j}", label_of(v.type.dtype.np, v.type.shape))
              for j, v in enumerate(graph.outputs)]
    return collections.Counter(edges)


def svg_texts(svg: str) -> list:
    root = ET.fromstring(svg)
    return ["".join(t.itertext()) for t in root.iter(SVG_NS + "text")]


# ---- the shape flow ------------------------------------------------------------------------------
def test_attention_edges_carry_the_shapes_numpy_computes(rng):
    B, S, D = (int(v) for v in rng.integers(2, 9, size=3))
    Q, K, V = f32(rng, B, S, D), f32(rng, B, S, D), f32(rng, B, S, D)
    prog = ts.function(attention_fn).lower(Q, K, V)
    # the same computation in NumPy, value by value
    KT = K.transpose(0, 2, 1)
    scores = Q @ KT
    A = np.exp(scores - scores.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)
    out = A @ V
    want = collections.Counter(label_of(np.float32, a.shape)
                               for a in (K, Q, KT, scores, A, V, out))
    edges, _ = parse_dot(viz.graph_dot(prog))
    assert collections.Counter(label for _, _, label in edges) == want
    assert collections.Counter(edges) == expected_edges(prog.graph_ir)


def test_symbolic_layernorm_edges_carry_symbolic_shapes():
    fn = ts.function(layer_norm_fn)
    edges, clusters = parse_dot(viz.graph_dot(fn))
    assert clusters == {}                 # no schedule: nothing to cluster
    labels = collections.Counter(label for _, _, label in edges)
    # x feeds mean, var and sub; mean/var/add/sqrt results are [B,S,1]; eps is a scalar
    assert labels == {"f32[B,S,D]": 5, "f32[B,S,1]": 4, "f32[]": 1}
    assert collections.Counter(edges) == expected_edges(fn.graph_ir)


def test_dense_gelu_shapes_and_one_fused_cluster(rng):
    B, D, H = (int(v) for v in rng.integers(3, 40, size=3))
    x, w, b = f32(rng, B, D), f32(rng, D, H), f32(rng, H)
    prog = ts.function(dense_gelu_fn).lower(x, w, b)
    text = viz.graph_dot(prog)
    edges, clusters = parse_dot(text)
    assert collections.Counter(edges) == expected_edges(prog.graph_ir)
    assert {label for _, _, label in edges} == {label_of(np.float32, s) for s in
                                                 (x.shape, w.shape, b.shape, (x @ w).shape)}
    kernels = prog.schedule_ir.kernels
    assert len(kernels) == 1 and kernels[0].strategy == "contract"
    ops = [n.op for n in prog.graph_ir.nodes]
    assert clusters == {f"cluster_{kernels[0].name}":
                        sorted(f"n{i}" for i, o in enumerate(ops) if o != "const")}
    assert f"{kernels[0].name} · contract" in text


@pytest.mark.parametrize("name", ["attention", "layernorm", "split_softmax"])
def test_clusters_are_the_schedule_kernels(rng, name):
    fn, args = {"attention": (attention_fn, [f32(rng, 2, 16, 8)] * 3),
                "layernorm": (layer_norm_fn, [f32(rng, 3, 5, 33)]),
                "split_softmax": (split_softmax_fn, [f32(rng, 9, 7)])}[name]
    prog = ts.function(fn).lower(*args)
    kernels = prog.schedule_ir.kernels
    edges, clusters = parse_dot(viz.graph_dot(prog))
    assert sorted(clusters) == sorted(f"cluster_{k.name}" for k in kernels)
    assert all(members for members in clusters.values())
    placed = [m for members in clusters.values() for m in members]
    assert len(placed) == len(set(placed))                 # a node sits in one cluster at most
    graph = prog.graph_ir
    names = graph.names()
    for i, n in enumerate(graph.nodes):
        if n.op == "const":
            continue
        assert f"n{i}" in placed, f"{names[n.out.id]} {n.op} in no cluster"
        # the kernel writing this node's value: the last with a primitive it came from
        homes = [k for k in kernels if any(p.origin == f"{names[n.out.id]}:{n.op}"
                                           for p in k.fuses)]
        if homes:
            assert f"n{i}" in clusters[f"cluster_{homes[-1].name}"]
        for k in homes[:-1]:              # earlier kernels hold a part of it
            assert f"n{i}k{kernels.index(k)}" in clusters[f"cluster_{k.name}"]
    if name == "attention":               # one attention kernel absorbs every operator
        assert len(kernels) == 1 and kernels[0].strategy == "attention"
        assert clusters[f"cluster_{kernels[0].name}"] == sorted(
            f"n{i}" for i, n in enumerate(graph.nodes) if n.op != "const")
    if name == "split_softmax":           # softmax over axis 0 spans several kernels
        parts = [e for e in edges if re.fullmatch(r"n\d+k\d+", e[0])]
        assert parts and all(re.fullmatch(r"f32\[\d+(,\d+)*\]", e[2]) for e in parts)


def test_control_flow_bodies_are_drawn_as_clusters(rng):
    """A region is one box for all its results; each body is a cluster of its own graph, its
    parameters fed (dashed) by the operands they stand for, its yield flowing into the region;
    no kernel cluster claims the region or a body's kernels."""
    x, w = rng.standard_normal(4).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32)

    def fn(x, w):
        h, ys = ts.scan(lambda h, t: (h * 0.5 + t, h.sum()), x, w)
        return ts.while_loop(lambda v: v.sum() > 1.0, lambda v: v * 0.5, h) + ys.sum()
    prog = ts.function(fn).lower(x, w)
    dot = viz.graph_dot(prog)
    assert dot == viz.graph_dot(prog)               # deterministic: no addresses
    assert "0x" not in dot and "region=" not in dot
    clusters = re.findall(r'subgraph "cluster_([^"]+)"', dot)
    assert {"n0_body", "n2_cond", "n2_body"} <= set(clusters)
    assert "%0, %1 = scan" in dot and "length=10" not in dot and "length=6" in dot
    d = viz.graph.drawing(prog)
    region_boxes = [b for b in d.boxes if b.lines[0][0].endswith(("= scan", "= while_loop"))]
    assert len(region_boxes) == 2 and all(b.cluster is None for b in region_boxes)
    assert any(e.src == "n0body_y" and e.dst == "n0" for e in d.edges)
    assert any(e.src == "p0" and e.dst == "n0body_p0" and e.dashed for e in d.edges)
    assert "<svg" in viz.graph_image(prog, layout="python").svg     # without Graphviz too


def test_primitive_level_clusters_hold_exactly_the_fused_nodes(rng):
    prog = ts.function(split_softmax_fn).lower(f32(rng, 6, 11))
    _, clusters = parse_dot(viz.graph_dot(prog, level="primitive"))
    index = {n: i for i, n in enumerate(prog.primitive_ir.nodes)}
    for k in prog.schedule_ir.kernels:
        fused = sorted(f"n{index[n]}" for n in k.fuses)
        inline = [m for m in clusters[f"cluster_{k.name}"] if m not in fused]
        assert all(prog.primitive_ir.nodes[int(m[1:])].op == "const" for m in inline)
        assert set(fused) <= set(clusters[f"cluster_{k.name}"])


def test_clusters_off_and_plain_graphs(rng):
    prog = ts.function(split_softmax_fn).lower(f32(rng, 4, 3))
    edges, clusters = parse_dot(viz.graph_dot(prog, clusters=False))
    assert clusters == {} and collections.Counter(edges) == expected_edges(prog.graph_ir)
    assert parse_dot(viz.graph_dot(prog.graph_ir))[1] == {}
    assert viz.graph_dot(prog, title="my title").count('"my title"') == 2


# ---- determinism ---------------------------------------------------------------------------------
def test_same_graph_same_text_and_fresh_lowerings_agree(rng):
    x = f32(rng, 5, 12)
    a = ts.function(split_softmax_fn).lower(x)
    b = ts.function(split_softmax_fn).lower(f32(rng, 5, 12))     # a fresh trace and compile
    assert a is not b and a.graph_ir is not b.graph_ir
    for kw in ({}, {"clusters": False}, {"level": "primitive"}, {"failing": 1}):
        assert viz.graph_dot(a, **kw) == viz.graph_dot(a, **kw) == viz.graph_dot(b, **kw)
        assert viz.graph_svg(a, layout="python", **kw) == viz.graph_svg(b, layout="python", **kw)
    if DOT is not None:
        assert viz.graph_svg(a, layout="dot") == viz.graph_svg(b, layout="dot")
    assert not re.search(r"0x[0-9a-f]{6,}", viz.graph_dot(a))


def test_dot_text_renders_with_graphviz(rng):
    if DOT is None:
        pytest.skip("Graphviz's dot is not installed: the DOT is checked by reading it only")
    prog = ts.function(layer_norm_fn).lower(f32(rng, 2, 3, 7))
    run = subprocess.run([DOT, "-Tsvg"], input=viz.graph_dot(prog).encode(),
                         capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr.decode()
    texts = svg_texts(run.stdout.decode())
    for _, _, label in expected_edges(prog.graph_ir):
        assert label in texts
    svg = viz.graph_svg(prog)
    assert svg.startswith("<svg") and "Generated by graphviz" not in svg and "<!--" not in svg
    assert sorted(svg_texts(svg)) == sorted(texts)


# ---- the built-in layout -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["attention", "split_softmax", "grad"])
def test_fallback_svg_is_xml_with_every_node_and_label(rng, monkeypatch, name):
    monkeypatch.setenv("TESSERA_NO_DOT", "1")
    if name == "grad":
        def loss(w, x):
            return op.mean(op.gelu(x @ w) ** 2)
        prog = ts.grad(loss).lower(f32(rng, 5, 3), f32(rng, 8, 5))
    else:
        fn, args = {"attention": (attention_fn, [f32(rng, 2, 8, 4)] * 3),
                    "split_softmax": (split_softmax_fn, [f32(rng, 8, 5)])}[name]
        prog = ts.function(fn).lower(*args)
    svg = viz.graph_svg(prog)             # TESSERA_NO_DOT: the built-in layout
    assert svg == viz.graph_svg(prog, layout="python")
    root = ET.fromstring(svg)
    texts = collections.Counter(svg_texts(svg))
    graph = prog.graph_ir
    names = graph.names()
    for p in graph.params:
        assert texts[f"%{p.param_name}"] >= 1
    for n in graph.nodes:
        want = f"{names[n.out.id]} = {n.op}" if n.op != "const" else f"{names[n.out.id]} = "
        assert any(t.startswith(want) for t in texts), want
        if n.loc is not None and n.op != "const":
            assert texts[str(n.loc)] >= 1
    labels = [g for g in root.iter(SVG_NS + "g") if g.get("class") == "edge-label"]
    got = collections.Counter("".join(g.itertext()) for g in labels)
    every = collections.Counter(label for _, _, label in parse_dot(viz.graph_dot(prog))[0])
    assert got == every                   # the Graph IR's edges, and those between parts
    assert not collections.Counter(label for _, _, label in expected_edges(graph)) - got
    clusters = [g for g in root.iter(SVG_NS + "g") if g.get("class") == "cluster"]
    assert len(clusters) == len(prog.schedule_ir.kernels)
    for k in prog.schedule_ir.kernels:
        assert any(t.startswith(k.name + " · " + k.strategy) for t in texts)
    for r in root.iter(SVG_NS + "rect"):       # every box inside the picture
        x, y = float(r.get("x")), float(r.get("y"))
        assert 0 <= x and x + float(r.get("width")) <= float(root.get("width")) + 1
        assert 0 <= y and y + float(r.get("height")) <= float(root.get("height")) + 1


def _boxes_and_edges(svg: str):
    """({box id: (x, y, w, h)}, [(src, dst, points along its path)], [label rects])."""
    root = ET.fromstring(svg)
    boxes, edges, labels = {}, [], []
    for g in root.iter(SVG_NS + "g"):
        title = g.find(SVG_NS + "title")
        if g.get("class") == "node":
            r = g.find(SVG_NS + "rect")
            boxes[title.text] = tuple(float(r.get(a)) for a in ("x", "y", "width", "height"))
        elif g.get("class") == "edge":
            src, dst = unescape(title.text).split(" -> ")
            edges.append((src, dst, _path_points(g.find(SVG_NS + "path").get("d"))))
        elif g.get("class") == "edge-label":
            r = g.find(SVG_NS + "rect")
            labels.append(tuple(float(r.get(a)) for a in ("x", "y", "width", "height")))
    return boxes, edges, labels


def _path_points(d: str) -> list:
    """Points every 1/20 along each segment of an SVG path of M, L and C commands."""
    pts, at = [], None
    for cmd, args in re.findall(r"([MLC])([^MLC]*)", d):
        xy = [tuple(map(float, p.split(","))) for p in args.split()]
        if cmd == "M":
            at = xy[0]
        elif cmd == "L":
            pts += [(at[0] + (xy[0][0] - at[0]) * t / 20, at[1] + (xy[0][1] - at[1]) * t / 20)
                    for t in range(21)]
            at = xy[0]
        else:
            p0, p1, p2, p3 = at, *xy
            for i in range(21):
                t = i / 20
                u = 1 - t
                pts.append(tuple(u ** 3 * a + 3 * u * u * t * b + 3 * u * t * t * c + t ** 3 * e
                                 for a, b, c, e in zip(p0, p1, p2, p3)))
            at = p3
    return pts


def _inside(p, r, pad=1.0) -> bool:
    x, y, w, h = r
    return x + pad < p[0] < x + w - pad and y + pad < p[1] < y + h - pad


def _overlap(a, b) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def mlp_fn(x, w1, w2):
    h = op.relu(x @ w1)
    y = h @ w2 + x @ w1 @ w2
    return op.softmax(y + op.sum(x)), h


@pytest.mark.parametrize("name", ["block", "attention", "mlp", "grad"])
def test_fallback_edges_go_around_boxes_and_labels_clear_them(rng, name):
    """Without Graphviz: an edge across several layers (or rows of a kernel's cluster) takes a
    lane of its own in each, so no edge passes behind a box it does not join (the residual of a
    block does not seem to feed its gelu), and no shape label covers a box's text."""
    def block(x: Tensor["B", "S", "D"], w: Tensor["D", "D"], b: Tensor["D"]):
        return op.layernorm(op.gelu(x @ w + b) + x)
    subject = {"block": lambda: ts.function(block).graph_ir,
               "attention": lambda: ts.function(attention_fn).lower(*[f32(rng, 2, 8, 4)] * 3),
               "mlp": lambda: ts.function(mlp_fn).lower(f32(rng, 4, 6), f32(rng, 6, 6),
                                                        f32(rng, 6, 6)),
               "grad": lambda: ts.grad(lambda w, x: op.mean(op.gelu(x @ w) ** 2)).lower(
                   f32(rng, 5, 3), f32(rng, 8, 5))}[name]()
    for clusters in (False, True):
        svg = viz.graph_svg(subject, layout="python", clusters=clusters)
        boxes, edges, labels = _boxes_and_edges(svg)
        assert edges and labels
        for label in labels:
            assert not any(_overlap(label, b) for b in boxes.values()), (name, label)
        for src, dst, pts in edges:
            for box, r in boxes.items():
                if box not in (src, dst):
                    assert not any(_inside(p, r) for p in pts), (name, src, dst, box)


def test_save_svg_writes_the_same_text_atomically(rng, tmp_path):
    prog = ts.function(dense_gelu_fn).lower(f32(rng, 4, 6), f32(rng, 6, 5), f32(rng, 5))
    path = viz.save_svg(prog, tmp_path / "g.svg", layout="python")
    assert path.read_text() == viz.graph_svg(prog, layout="python")
    ET.fromstring(path.read_text())
    assert os.listdir(tmp_path) == ["g.svg"]       # no temporary left behind


# ---- the failing node ----------------------------------------------------------------------------
# ---- drawings for a notebook: shown untrusted too ------------------------------------------------
def _png_size(png: bytes) -> tuple:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


@needs_dot
def test_graph_image_is_a_png_beside_its_svg(rng, tmp_path):
    prog = ts.function(dense_gelu_fn).lower(f32(rng, 4, 6), f32(rng, 6, 5), f32(rng, 5))
    image = viz.graph_image(prog)
    data, meta = image._repr_mimebundle_()
    # no HTML: JupyterLab would prefer it to the PNG; the PNG is what an untrusted notebook shows
    assert set(data) == {"text/plain", "image/svg+xml", "image/png"}
    assert data["image/svg+xml"] == viz.graph_svg(prog)
    png = base64.b64decode(data["image/png"])
    w, h = _png_size(png)
    # drawn at 144 dpi, shown at its size in CSS pixels (Graphviz's SVG is sized in points)
    svg_w = float(re.search(r'<svg[^>]*width="([\d.]+)pt"', data["image/svg+xml"]).group(1))
    assert meta == {"image/png": {"width": round(w * 96 / 144)}}
    assert abs(w - svg_w * 2) <= 4 and h > 50
    assert image.save(tmp_path / "g.png").read_bytes() == png
    assert image.save(tmp_path / "g.svg").read_text() == data["image/svg+xml"]
    with pytest.raises(ts.ArgumentError, match=".svg or .png"):
        image.save(tmp_path / "g.pdf")


def test_without_dot_graph_image_is_an_img_of_its_svg(rng, monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_NO_DOT", "1")
    prog = ts.function(dense_gelu_fn).lower(f32(rng, 4, 6), f32(rng, 6, 5), f32(rng, 5))
    data = viz.graph_image(prog)._repr_mimebundle_()
    assert set(data) == {"text/plain", "image/svg+xml", "text/html"}
    page = data["text/html"]
    assert "<svg" not in page                   # an <img>: kept by the HTML sanitisers
    src = re.fullmatch(r'<img src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"[^>]*>',
                       page).group(1)
    assert base64.b64decode(src).decode() == viz.graph_svg(prog, layout="python")
    with pytest.raises(ts.BackendUnavailableError, match="PNG"):
        viz.graph_image(prog).save(tmp_path / "g.png")


def test_figure_image_holds_the_same_figure_twice(profiled):
    fig = viz.roofline_figure(profiled[0])
    data, meta = viz.figure_image(fig)._repr_mimebundle_()
    assert data["image/svg+xml"] == viz.figure_svg(fig)
    w, h = _png_size(base64.b64decode(data["image/png"]))
    inches = fig.get_size_inches()
    assert (w, h) == (round(inches[0] * 144), round(inches[1] * 144))
    assert meta["image/png"]["width"] == round(w * 96 / 144)


def test_trace_error_draws_the_partial_graph_and_the_failing_op():
    with pytest.raises(ts.ShapeError) as info:
        ts.function(bad_fn).graph_ir
    err = info.value
    text = viz.graph_dot(err)
    edges, _ = parse_dot(text)
    # exp(x) was traced; the matmul was not: it is drawn red, fed by the values it was given
    assert ("p0", "n0", "f32[B,S,D]") in edges
    assert collections.Counter((s, label) for s, d, label in edges if d == "failed") == \
        {("n0", "f32[B,S,D]"): 1, ("p1", "f32[S,D]"): 1}
    failed = [line for line in text.splitlines() if line.startswith('  "failed" [')][0]
    assert "#d93025" in failed and "matmul" in failed and "test_viz.py:" in failed
    svg = viz.graph_svg(err, layout="python")
    assert any("matmul" in t for t in svg_texts(svg)) and "#d93025" in svg


def test_failing_marks_one_node_by_index_name_location_or_node(rng):
    prog = ts.function(layer_norm_fn).lower(f32(rng, 2, 3, 4))
    graph = prog.graph_ir
    sqrt = next(i for i, n in enumerate(graph.nodes) if n.op == "sqrt")
    node = graph.nodes[sqrt]

    def red(text):
        return sorted(re.findall(r'^\s*"(\w+)" \[.*color="#d93025"', text, flags=re.M))
    assert red(viz.graph_dot(prog)) == []
    for how in (sqrt, f"%{sqrt}", node, node.out):
        assert red(viz.graph_dot(prog, failing=how)) == [f"n{sqrt}"]
    assert red(viz.graph_dot(prog, failing="%x")) == ["p0"]
    # a location: the last node on that line
    at = [i for i, n in enumerate(graph.nodes) if n.loc == node.loc]
    assert red(viz.graph_dot(prog, failing=str(node.loc))) == [f"n{at[-1]}"]
    assert red(viz.graph_dot(prog, failing=node.loc)) == [f"n{at[-1]}"]
    # a location no node has: a box of its own
    assert red(viz.graph_dot(prog, failing="elsewhere.py:1")) == ["failed"]
    for bad in (99, "%99", "nonsense", 2.5):
        with pytest.raises(ts.ArgumentError):
            viz.graph_dot(prog, failing=bad)


def test_user_errors_are_tessera_errors(rng):
    with pytest.raises(ts.ArgumentError):
        viz.graph_dot(42)
    with pytest.raises(ts.ArgumentError):
        viz.graph_dot(ts.ShapeError("no trace here"))
    prog = ts.function(dense_gelu_fn).lower(f32(rng, 2, 3), f32(rng, 3, 4), f32(rng, 4))
    with pytest.raises(ts.ArgumentError):
        viz.graph_dot(prog, level="tile")
    with pytest.raises(ts.ArgumentError):
        viz.graph_svg(prog, layout="neato")
    with pytest.raises(ts.ArgumentError):
        viz.schedule_rows(prog.graph_ir)
    with pytest.raises(ts.ArgumentError):
        viz.highlight_html("x", "fortran")


# ---- tables --------------------------------------------------------------------------------------
def test_schedule_rows_follow_the_kernels(rng):
    B, D, H = (int(v) for v in rng.integers(2, 50, size=3))
    prog = ts.function(dense_gelu_fn).lower(f32(rng, B, D), f32(rng, D, H), f32(rng, H))
    rows = viz.schedule_rows(prog)
    assert rows == viz.schedule_rows(prog.schedule_ir)
    (row,) = rows
    (k,) = prog.schedule_ir.kernels
    assert row["name"] == k.name and row["strategy"] == "contract"
    assert row["fuses"].split() == ["%0:matmul", "%1:add", "%2:gelu"]
    assert row["bytes"] == 4 * (B * D + D * H + H + B * H)        # read x, w, b; write y
    assert row["flops"] >= 2 * B * D * H
    assert row["intensity"] == pytest.approx(row["flops"] / row["bytes"])
    assert row["knobs"] == ", ".join(f"{a}={str(v).lower() if isinstance(v, bool) else v}"
                                     for a, v in k.knobs.items())
    assert row["tuned"] is k.tuned and row["output"] == f"out0: f32[{B},{H}]"

    prog = ts.function(split_softmax_fn).lower(f32(rng, 7, 3))
    rows = viz.schedule_rows(prog)
    assert [r["name"] for r in rows] == [k.name for k in prog.schedule_ir.kernels]
    assert [r["fuses"] for r in rows] == [" ".join(k.fused_labels())
                                          for k in prog.schedule_ir.kernels]
    df = viz.schedule_table(prog)
    assert list(df["name"]) == [r["name"] for r in rows] and list(df.columns)[:2] == [
        "name", "strategy"]


def test_html_table_is_plain_escaped_and_aligned():
    rows = [{"kernel": "k<0>", "ms": 0.123456, "n": 3, "ok": True},
            {"kernel": "k1", "ms": float("nan"), "extra": None}]
    html = viz.html_table(rows)
    assert html == viz.html_table(rows)
    root = ET.fromstring(html)
    head = [th.text for th in root.iter("th")]
    assert head == ["kernel", "ms", "n", "ok", "extra"]
    cells = [[td.text or "" for td in tr.iter("td")] for tr in root.iter("tr")][1:]
    assert cells == [["k<0>", "0.1235", "3", "yes", ""], ["k1", "", "", "", ""]]
    assert "&lt;0&gt;" in html and re.search(r'text-align:right;[^"]*">3<', html)
    assert "padding" in html and "nowrap" in html                 # readable cells
    labelled = viz.html_table([{"median_ms": 1.5, "peak_pct": 20.0, "kernel": "k0"}])
    assert [th.text for th in ET.fromstring(labelled).iter("th")] == \
        ["median ms", "% of peak", "kernel"]
    assert [th.text for th in ET.fromstring(viz.html_table(rows, ["n", "kernel"])).iter(
        "th")] == ["n", "kernel"]


# ---- highlighting --------------------------------------------------------------------------------
def test_highlight_without_pygments_escapes(monkeypatch):
    monkeypatch.setitem(sys.modules, "pygments", None)       # as if it were not installed
    code = '#include <stdio.h>\nint main() { return 1 < 2 && "a"; }'
    html = viz.highlight_html(code, "c")
    assert "<stdio.h>" not in html and "&lt;stdio.h&gt;" in html and "&amp;&amp;" in html
    assert unescape(re.sub(r"<[^>]+>", "", html)).strip() == code


def test_highlight_with_pygments_inline_styles(rng):
    pytest.importorskip("pygments", reason="pygments is optional")
    prog = ts.function(dense_gelu_fn).lower(f32(rng, 2, 3), f32(rng, 3, 4), f32(rng, 4))
    for text, language in ((str(prog.graph_ir), "ir"), (str(prog.schedule_ir), "ir"),
                           (str(prog.tile_ir), "ir"), (prog.target_code, "c"),
                           ("__global__ void k(float* x) { x[threadIdx.x] = 0; }", "cuda"),
                           ("__global__ void k(float* x) { x[0] = 0; }", "hip")):
        html = viz.highlight_html(text, language)
        assert html == viz.highlight_html(text, language)
        assert 'style="' in html and "class=\"highlight\"" in html and "<style" not in html
        assert unescape(re.sub(r"<[^>]+>", "", html)).rstrip("\n") == text.rstrip("\n")
    ir = viz.highlight_html(str(prog.graph_ir), "ir")
    # the IR lexer gives values, types and comments their own colours
    style = {text: css for css, text in re.findall(r'<span style="([^"]+)">([^<]+)</span>', ir)}
    assert style["%x"] != style["f32[2,3]"] != style["graph"]
    assert any(t.startswith("# test_viz.py:") for t in style)


# ---- profiles ------------------------------------------------------------------------------------
@pytest.fixture
def profiled(rng):
    f = ts.function(dense_gelu_fn)
    g = ts.function(split_softmax_fn)
    args = (f32(rng, 32, 64), f32(rng, 64, 48), f32(rng, 48))
    y = f32(rng, 16, 24)
    f(*args), g(y)
    with ts.profiler() as prof:
        for _ in range(3):
            f(*args)
            g(y)
    return prof, f.lower(*args), g.lower(y)


def test_profile_rows_and_table_reuse_the_profile(profiled):
    prof, pf, pg = profiled
    rows = viz.profile_rows(prof)
    base = prof.rows()
    assert len(rows) == len(pf.kernels) + len(pg.kernels)
    for r, b in zip(rows, base):
        assert {k: v for k, v in r.items() if k != "intensity"} == b
        assert r["intensity"] == pytest.approx(b["flops"] / b["bytes"])
    df = viz.profile_table(prof)
    assert list(df["kernel"]) == [r["kernel"] for r in rows]
    assert np.allclose(df["median_ms"], [r["median_ms"] for r in rows])


def test_profile_and_roofline_figures(profiled):
    prof, pf, pg = profiled
    rows = prof.rows()
    fig = viz.profile_figure(prof)
    (ax,) = fig.axes
    bars = ax.patches
    assert len(bars) == len(rows)
    assert [b.get_width() for b in bars] == pytest.approx([r["median_ms"] for r in rows])
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"{r['function']}.{r['kernel']}" for r in rows]

    peaks = {"fma_gflops": 400.0, "copy_gbs": 50.0}
    fig = viz.roofline_figure(prof, peaks=peaks)
    (ax,) = fig.axes
    roof, *points = ax.get_lines()
    assert max(roof.get_ydata()) == pytest.approx(400.0)
    x, y = roof.get_xdata(), roof.get_ydata()
    assert np.allclose(y, np.minimum(400.0, 50.0 * x))
    shown = [r for r in rows if r["flops"] > 0]
    got = sorted((p.get_xdata()[0], p.get_ydata()[0]) for p in points)
    want = sorted((r["flops"] / r["bytes"], r["gflops"]) for r in shown)
    assert np.allclose(got, want)
    fig = viz.roofline_figure(prof)                   # the machine's measured peaks
    assert max(fig.axes[0].get_lines()[0].get_ydata()) == pytest.approx(
        prof.peaks()["fma_gflops"])
    with pytest.raises(ts.ArgumentError):
        viz.roofline_figure(prof, peaks={"fma": 1})
    for draw in (viz.profile_figure, viz.roofline_figure):   # nothing recorded: says so
        (ax,) = draw(ts.profiler()).axes
        assert [t.get_text() for t in ax.texts] == ["no kernel launches recorded"]


def test_figure_svg_and_png_are_stable(profiled):
    prof = profiled[0]
    fig = viz.profile_figure(prof)
    a, b = viz.figure_svg(fig), viz.figure_svg(fig)
    assert a == b and a.startswith("<svg")
    assert "dc:date" not in a and "<?xml" not in a
    ET.fromstring(a)
    png = viz.figure_png(fig)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png == viz.figure_png(fig)
    import matplotlib
    assert matplotlib.rcParams["svg.hashsalt"] is None            # nothing leaked
    if "matplotlib.pyplot" in sys.modules:
        import matplotlib.pyplot as plt
        assert plt.get_fignums() == []


# ---- autotuning ----------------------------------------------------------------------------------
def test_autotune_table_and_figure(rng, tmp_path):
    f = ts.function(dense_gelu_fn)
    args = (f32(rng, 48, 64), f32(rng, 64, 96), f32(rng, 96))
    result = ts.autotune(f, *args, budget_s=2, progress=False, cache=str(tmp_path / "t.db"))
    cands = [(kt, c) for kt in result.kernels for c in kt.candidates]
    assert cands
    df = viz.autotune_table(result)
    assert len(df) == len(cands)
    assert list(df["kernel"]) == [kt.name for kt, _ in cands]
    assert list(df["status"]) == [c.status for _, c in cands]
    for knob in result.kernels[0].default_knobs:
        assert knob in df.columns
    changed = list(df["changed"])
    assert changed[0] == "default"
    for text, (_, c) in zip(changed, cands):
        assert text == "default" if not c.changed else all(f"{k}=" in text for k in c.changed)
    rows = viz.autotune_rows(result)
    assert [r["changed"] for r in rows] == changed
    assert ET.fromstring(viz.html_table(rows)) is not None

    fig = viz.autotune_figure(result)
    tuned = [kt for kt in result.kernels if kt.candidates]
    assert len(fig.axes) == len(tuned)
    for ax, kt in zip(fig.axes, tuned):
        assert ax.get_title().startswith(kt.name)
        lines = ax.get_lines()
        stars = [ln for ln in lines if ln.get_marker() == "*"]
        assert len(stars) == sum(1 for c in kt.candidates if c.knobs == kt.best_knobs
                                 and c.status in ("ok", "default"))
        timed = [c for c in kt.candidates if c.median is not None]
        dots = [ln for ln in lines if ln.get_marker() == "o" and ln.get_markerfacecolor() != "none"]
        assert sorted(ln.get_ydata()[0] for ln in dots) == pytest.approx(
            sorted(c.median * 1e3 for c in timed))
    ET.fromstring(viz.figure_svg(fig))


# ---- import cost ---------------------------------------------------------------------------------
def test_import_loads_no_heavy_package():
    code = ("import sys, tessera.viz; print(sorted(m for m in ('pandas', 'matplotlib', "
            "'pygments', 'IPython', 'ipywidgets', 'graphviz', 'tessera.lab') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
