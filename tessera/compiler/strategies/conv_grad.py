"""conv_weight_grad: a convolution's weight gradient with its elementwise epilogue (an optimiser's
momentum update), as a GEMM whose B is the input's windows.

Per group, dW [O/g, Cg*KK] = G [O/g, N*P] @ B [N*P, Cg*KK]: G the cotangent's rows, image by
image; B the input's window values, k = (image, position) by j = (c, kd, kh, kw), packed from
the input straight into the micro-kernel's panels (routines/conv.c's ts_conv_wgrad_tile), so
neither the windows nor their transposition exists in memory. A fixed grid of (group, row tile,
column tile) tasks, each one routine call over all of k and then the epilogue over the finished
tile. Every element is the GEMM's fma chain over k from 0: the bits of the windows' matmul the
operator decomposes into (ops/conv.py), on every ISA, thread count and tile.

GPUs run the same chains, an output element per thread.
"""
from __future__ import annotations

import math

from ... import dtypes as dt
from ...ops import registry as R
from ..dynamic import representative
from ..emit import idx_div, idx_min, idx_mod, launch_of, read, split_index, unflatten
from ..tile_ir import Addr, Assign, Bin, Call, Const, Decl, Loop, OpCall, Select, Store, Var, \
    idx_add, idx_mul
from .base import PARALLEL_MIN_FLOPS, register
from .conv import ConvStrategy, _kernel_parts
from .routines import c_gemm

PANEL = 32      # the widest micro-panel's columns (AVX-512's float32)
TAP_ROWS = 8    # a direct micro-tile's rows (its measured shapes' most but 12x2's)
TASKS = c_gemm.MIN_TASKS // 2   # a weight gradient's tasks where its columns allow
ROWS_MIN = 32   # a weight gradient's least row tile: the direct routine's channel block (2
                # AVX-512 vectors of float32; 16 rows ran the stem's gradient at a quarter speed)


def geometry(n) -> dict:
    """The weight gradient's sizes (x [N, C, *in], g [N, O, *out]), its spatial axes padded in
    front to three."""
    x, gt, a = n.inputs[0].type.shape, n.inputs[1].type.shape, n.attrs
    lead = 3 - (len(x) - 2)
    pad3 = lambda v, fill: [fill] * lead + list(v)      # noqa: E731
    G = a["groups"]
    return {"N": x[0], "C": x[1], "O": gt[1], "G": G, "Cg": x[1] // G, "Og": gt[1] // G,
            "in": pad3(x[2:], 1), "k": pad3(a["kernel"], 1), "out": pad3(gt[2:], 1),
            "s": pad3(a["stride"], 1), "d": pad3(a["dilation"], 1),
            "p": pad3([lo for lo, _ in a["padding"]], 0), "P": math.prod(gt[2:]),
            "KK": math.prod(a["kernel"])}


class ConvWeightGradStrategy(ConvStrategy):
    """The convolution's grouping (the node with its elementwise epilogue, reading its
    operands as they lie) with a grid and routine of its own."""
    name = "conv_weight_grad"
    routines = {"conv_weight_grad": "ts_conv_wgrad_tile_{S}"}

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.ConvWeightGrad)

    def cpu_knobs(self, k) -> dict:
        g = geometry(k.group.anchor)
        knobs = {"parallel": representative(k.flops) >= PARALLEL_MIN_FLOPS, "simd": True}
        return knobs | wgrad_tiles(g, k.output.type.dtype.short)

    def product(self, n) -> tuple:
        g = geometry(n)
        return g["Og"], g["Cg"] * g["KK"], g["N"] * g["P"]

    def lower_cpu(self, k, code):
        return lower_wgrad_tiles(k)

    def lower_gpu(self, k, code, target, knobs):
        return lower_wgrad_direct(k, knobs)


register(ConvWeightGradStrategy())


def wgrad_tiles(g: dict, dtype_short: str) -> dict:
    """Task tiles: every output channel of a group in one tile where the GEMM's row tile holds
    them (B, the windows, costs a gather to pack and is packed once per row tile; G's rows
    cost a copy), the columns split into whole micro-panels until there are MIN_TASKS tasks;
    where they hold a unit of whole panels of TAP_ROWS channels' taps each (the least common
    multiple: 288 columns, 32 channels, for 3x3 kernels), into TASKS tasks of whole units
    (each task copies all of G's rows, and the direct path's micro-tiles are then one tap
    each, whose steps in the padding it skips: ResNet's
    weight gradients at batch 32 on a 2-core Xeon, 8x8x128 1.79 -> 1.46 ms, 16x16x64 1.63 ->
    1.45, 28x28x128 38.4 -> 35.9, 4x4x256 1.30 -> 1.25).
    Where that leaves tasks of one panel (every one copying G's rows for 32 columns: the stem's
    7 x 7 x 3 columns in 5 tasks, 4.4 ms against 2.3 in two row tiles) or a single task, the
    rows split in two instead (every column in each tile), if that moves fewer values (moved)
    or there was one task. Shapes alone decide, never the thread count."""
    mt, _, kc = c_gemm.DEFAULT_TILE[dtype_short]
    M, J = g["Og"], g["Cg"] * g["KK"]
    mt = min(mt, max(M, 1))
    rows = g["G"] * -(-M // mt)
    panels = -(-J // PANEL)
    per = -(-panels // max(1, min(panels, -(-c_gemm.MIN_TASKS // rows))))
    best = (mt, min(per * PANEL, max(J, 1)))
    unit = math.lcm(PANEL, TAP_ROWS * g["KK"])
    if unit <= J:
        cols = -(-J // max(1, -(-TASKS // rows)))
        best = (mt, min(-(-cols // unit) * unit, J))
        per = -(-best[1] // PANEL)
    if per == 1 and M >= 2 * ROWS_MIN:
        halves = (-(-M // 2 // ROWS_MIN) * ROWS_MIN, max(J, 1))
        if rows * panels == 1 or moved(g, *halves) < moved(g, *best):
            best = halves
    return {"tile_m": best[0], "tile_n": best[1], "tile_k": kc}


def moved(g: dict, mt: int, nt: int) -> int:
    """Values the tasks of (mt, nt) tiles move before their products: each copies its rows of G
    (mt x N P) and lays out the input channels its columns span (N x the input's points each)."""
    M, J, KK = g["Og"], g["Cg"] * g["KK"], g["KK"]
    tasks = g["G"] * -(-M // mt) * -(-J // nt)
    channels = min(g["Cg"], -(-nt // KK) + 1)
    return tasks * g["N"] * (mt * g["P"] + channels * math.prod(g["in"]))


def _point(em, grp, row, col, g):
    """The epilogue's loop point of output element (row, col): the output channel and the
    column's (c, *kernel)."""
    em.loops = [[a] for a in range(len(grp.domain))]
    return {0: row} | {1 + q: e for q, e in
                       enumerate(unflatten(col, [g["Cg"], *grp.domain[2:]]))}


def lower_wgrad_tiles(k):
    """A fixed grid of (group, row tile, column tile) tasks, each one routine call over every
    image and position, then the epilogue over its finished tile."""
    names, em, grp, n, g, d, (X, x_off), (Gv, g_off) = _kernel_parts(k, geometry)
    M, J = g["Og"], g["Cg"] * g["KK"]
    MT, NT = k.knobs["tile_m"], k.knobs["tile_n"]
    tm, tn = -(-M // MT), -(-J // NT)
    t, grpi = names("task"), names("grp")
    i0, j0, mt, nt = names("i0"), names("j0"), names("mt"), names("nt")
    rest = idx_mod(Var(t), tm * tn)
    decls = [Decl(grpi, dt.int64, idx_div(Var(t), tm * tn)),
             Decl(i0, dt.int64, idx_mul(idx_div(rest, tn), Const(MT))),
             Decl(j0, dt.int64, idx_mul(idx_mod(rest, tn), Const(NT))),
             Decl(mt, dt.int64, idx_min(Const(MT), Bin("-", Const(M), Var(i0)))),
             Decl(nt, dt.int64, idx_min(Const(NT), Bin("-", Const(J), Var(j0))))]
    row0 = idx_add(idx_mul(Var(grpi), Const(M)), Var(i0))           # first output channel
    spatial = math.prod(g["in"])
    gbase = idx_add(Const(g_off), idx_mul(row0, Const(g["P"])))
    xbase = idx_add(Const(x_off), idx_mul(idx_mul(Var(grpi), Const(g["Cg"])), Const(spatial)))
    cbase = idx_add(idx_mul(row0, Const(J)), Var(j0))
    geo = [Const(spatial)] + [Const(v) for key in ("in", "k", "out", "s", "d", "p")
                              for v in g[key]]
    args = (Addr(Gv.name, gbase), Const(g["O"] * g["P"]), Addr(X.name, xbase),
            Const(g["C"] * spatial), Addr(k.output.name, cbase), Const(J), Const(g["N"]),
            Var(mt), Var(j0), Var(nt), Const(k.knobs["tile_k"]), *geo)
    body = decls + [Call(f"ts_conv_wgrad_tile_{d.short}", args, f"conv_weight_grad:{d.short}")]
    if grp.root is not grp.anchor:
        ii, jj = names("i"), names("j")
        epi = Loop(jj, Var(nt), "vector" if k.knobs.get("simd") else "serial")
        point = _point(em, grp, idx_add(row0, Var(ii)), idx_add(Var(j0), Var(jj)), g)
        value = em.value(grp.root.out, grp.maps[grp.root.out.id], epi.body, point)
        epi.body.append(Store(k.output.name, em.out_index(point), value))
        body.append(Loop(ii, Var(mt), "serial", [epi]))
    tasks = g["G"] * tm * tn
    return [Loop(t, tasks, "parallel" if k.knobs.get("parallel") else "serial", body)]


def lower_wgrad_direct(k, knobs):
    """GPUs: an output element per thread, its fma chain over k = (image, position) from 0 (the
    CPU's bits), then the epilogue at that element."""
    names, em, grp, n, g, d, (X, x_off), (Gv, g_off) = _kernel_parts(k, geometry)
    J = g["Cg"] * g["KK"]
    e = names("e")
    ch, col = split_index(Var(e), [g["O"], J])
    c = idx_div(col, g["KK"])
    taps = unflatten(idx_mod(col, g["KK"]), g["k"])
    acc, kv = names("acc"), names("k")
    img, pos = idx_div(Var(kv), g["P"]), idx_mod(Var(kv), g["P"])
    coords = [idx_add(Bin("-", idx_mul(o, Const(s)), Const(p)), idx_mul(q, Const(dd)))
              for o, q, s, dd, p in zip(unflatten(pos, g["out"]), taps, g["s"], g["d"], g["p"])]
    inside = None
    for q, (v, size) in enumerate(zip(coords, g["in"])):
        if size == 1 and g["k"][q] == 1 and g["p"][q] == 0:
            continue
        test = Bin("&&", Bin(">=", v, Const(0)), Bin("<", v, Const(size)))
        inside = test if inside is None else Bin("&&", inside, test)
    chan = idx_add(idx_mul(img, Const(g["C"])),
                   idx_add(idx_mul(idx_div(ch, g["Og"]), Const(g["Cg"])), c))
    where = chan
    for v, size in zip(coords, g["in"]):
        where = idx_add(idx_mul(where, Const(size)), v)
    xv = read(X, idx_add(Const(x_off), where))
    if inside is not None:
        xv = Select(inside, xv, Const(0.0, d))
    gv = read(Gv, idx_add(Const(g_off), idx_add(idx_mul(idx_add(idx_mul(img, Const(g["O"])), ch),
                                                         Const(g["P"])), pos)))
    fma = OpCall("fma", "elem", (), d, d, (gv, xv, Var(acc)))
    body = [Decl(acc, d, Const(0.0, d)),
            Loop(kv, g["N"] * g["P"], "serial", [Assign(acc, fma)]),
            Store(k.output.name, Var(e), Var(acc))]
    if grp.root is not grp.anchor:
        tail = []
        point = _point(em, grp, ch, col, g)
        value = em.value(grp.root.out, grp.maps[grp.root.out.id], tail, point)
        body += tail + [Store(k.output.name, em.out_index(point), value)]
    total = g["O"] * J
    return [Loop(e, total, "grid", body)], launch_of(total, knobs["threads"])
