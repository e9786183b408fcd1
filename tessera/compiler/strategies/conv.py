"""conv: a convolution with its elementwise epilogue (bias, activation, residual, batch norm
folded at inference), as an implicit GEMM.

Per image and group, the output is W [O/g, Cg*KK] @ B [Cg*KK, P] with B the input's windows
(k = (c, kd, kh, kw), P the output positions): the contract strategy's product, with B packed
straight from the input (routines/c_conv.py), so the windows never exist in memory; a tile of
whole output rows whose channels fill the routine's channel vectors is computed direct, the
windows' values broadcast from the input rows laid out padded (no B packed). A fixed grid
of (image, group, row tile, column tile) tasks, each one call of the routine and then the
epilogue over the finished tile; small images go several to a task, their positions its
columns. Every element is the GEMM's fma chain over k from 0: the bits of the im2col matmul
the operator decomposes into, on every ISA, thread count and tile. On small images the direct
path leaves out the taps in the padding (fma(w, 0, c) is c for a finite w: the same bits, but
for the sign of a zero output where products underflow past the subnormals; a K block with a
weight that is not finite runs every tap, so inf x 0 still gives the matmul's NaN).

GPUs run the same chains, an output element per thread (a direct loop; tensor cores are
future work). The operator is primitive for float32 and float64 operands of static shapes;
other convolutions decompose into windows and a matmul (ops/conv.py).
"""
from __future__ import annotations

from ... import dtypes as dt
from ...ops import registry as R
from ..dynamic import representative
from ..emit import Emitter, Names, contiguous, idx_div, idx_min, idx_mod, launch_of, operand, \
    prod, read, split_index, unflatten
from ..tile_ir import Addr, Assign, Bin, Call, Const, Decl, Loop, OpCall, Select, Store, Var, \
    idx_add, idx_mul
from .base import PARALLEL_MIN_FLOPS, register
from .contract import ContractStrategy, even_tile, task_tiles
from .routines import c_conv, c_gemm


# Tiles of whole output rows at least this long pack B from the rows laid out padded
# (conv.c: TS_CONV_SHORT_RUN / 2)
ROWS_LAID_OUT = 16


def geometry(n) -> dict:
    """The convolution's sizes, its spatial axes padded in front to three."""
    x, w = (v.type.shape for v in n.inputs)
    out = n.out.type.shape
    a = n.attrs
    lead = 3 - (len(x) - 2)
    pad3 = lambda v, fill: [fill] * lead + list(v)      # noqa: E731
    G = a["groups"]
    return {"N": x[0], "C": x[1], "O": w[0], "G": G, "Cg": x[1] // G, "Og": w[0] // G,
            "in": pad3(x[2:], 1), "k": pad3(w[2:], 1), "out": pad3(out[2:], 1),
            "s": pad3(a["stride"], 1), "d": pad3(a["dilation"], 1),
            "p": pad3([lo for lo, _ in a["padding"]], 0),
            "P": prod(out[2:]), "KK": prod(w[2:])}


class ConvStrategy(ContractStrategy):
    name = "conv"
    routines = {"conv": "ts_conv_tile_{S}"}

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Conv)

    def absorb_operand(self, grp, p) -> bool:
        return False        # the routine reads contiguous operands

    def node_flops(self, n) -> int:
        M, N, K = self.product(n)
        return 2 * M * N * K * n.attrs["groups"]

    def cpu_knobs(self, k) -> dict:
        g = geometry(k.group.anchor)
        knobs = {"parallel": representative(k.flops) >= PARALLEL_MIN_FLOPS, "simd": True}
        d = k.output.type.dtype.short
        tiles = image_tiles(g, d)
        row = g["out"][2]
        if row >= ROWS_LAID_OUT and row <= tiles["tile_n"] < g["P"]:
            tiles["tile_n"] -= tiles["tile_n"] % row    # whole rows: packed from laid-out rows
        if g["Og"] == 1 and g["N"] * g["G"] >= c_gemm.MIN_TASKS:
            # one output channel (depthwise): a task's call costs most of a short one, and
            # whole output rows take the routine's stencil path
            tiles["tile_n"] = min(g["P"], max(1, (1 << 14) // row) * row)
        return knobs | tiles

    def gpu_knobs(self, k, target) -> dict:
        return {"threads": 256}

    def space(self, k) -> dict:
        if "tile_m" not in k.knobs:
            return {}
        return {"tile_m": [48, 96, 192, 384], "tile_n": [64, 128, 256, 512, 1024],
                "tile_k": [64, 128, 256, 512]}

    def product(self, n) -> tuple:
        """The GEMM the node computes: its rows, columns and depth."""
        g = geometry(n)
        return g["Og"], g["N"] * g["P"], g["Cg"] * g["KK"]

    def invalid(self, k, knobs) -> str | None:
        if "tile_m" not in knobs:
            return None
        for name, size, step in zip(("tile_m", "tile_n", "tile_k"),
                                    self.product(k.group.anchor), (6, 32, 64)):
            if knobs[name] >= 2 * max(size, step) and knobs[name] != k.knobs.get(name):
                return f"{name}={knobs[name]} exceeds the product"
        return None

    def lower_cpu(self, k, code):
        return lower_conv_tiles(k)

    def lower_gpu(self, k, code, target, knobs):
        return lower_conv_direct(k, knobs)

    def c_routine(self, name, dtype):
        return c_conv.conv_source(dtype)

    def c_half_routine(self, name):
        raise KeyError(name)        # (16-bit convolutions decompose: ops/conv.py)

    def gpu_routine(self, lang, name, dtype, sizes):
        raise KeyError(name)


register(ConvStrategy())


# Small images' tasks: at most this many columns (a K block's panels of B, 256 rows, in 1 MiB),
# and at least this many (else the weights' packing per task outweighs the product)
SMALL_IMAGE_COLUMNS = (128, 1024)
# and as few as this many tasks where their columns stay within those: every task lays out its
# images' windows and packs its rows of the weights, so fewer, larger tasks do less of both
# (2-core Emerald Rapids, batch 32: 7x7x512 19.3 -> 18.0 ms, 4x4x256 1.65 -> 1.40, 2x2x512
# 1.82 -> 1.45 against MIN_TASKS' 8 tasks)
SMALL_IMAGE_TASKS = c_gemm.MIN_TASKS // 2


def image_tiles(g: dict, d: str) -> dict:
    """Task tiles of the products of the images' positions. Small images (at most 1024
    positions): each task whole images by all the output channels of a group up to the GEMM's
    rows per task, as many images as leave SMALL_IMAGE_TASKS tasks of at most 1024 columns,
    else MIN_TASKS: each task packs the weights it multiplies (A) and the windows (B) once, so
    fewer, squarer tasks pack less (ResNet's 7x7x512 layer at batch 32: 512 x 196 in 8 tasks
    took 32 ms, 256 x 196 in 16 tasks 35 ms; 14x14x256: 256 x 784, 28.5 against 29-31 ms;
    28x28x128: 128 x 784 against 128 x 392, 30.7 against 32.4 ms). A batch whose positions
    all fit one task's least columns (2x2 images at batch 32) is one column of tasks, its rows
    split SMALL_IMAGE_TASKS ways: a column split would pack all the weights again. Where that
    leaves fewer tasks or narrower ones (a small batch), and for larger images: task_tiles'
    grid per image, or over the batch's positions where its tiles take two whole images or
    more (images_per_tile)."""
    least, most = SMALL_IMAGE_COLUMNS
    P, Og, N, G = g["P"], g["Og"], g["N"], g["G"]
    if Og > 1 and P <= most:
        rows, _, kc = c_gemm.DEFAULT_TILE[d]
        mt = even_tile(Og, rows, 8)
        imgs = min(N, most // P, N * G * -(-Og // mt) // c_gemm.MIN_TASKS)
        fewer = min(N, N * G * -(-Og // mt) // SMALL_IMAGE_TASKS)
        if least <= fewer * P <= most:
            imgs = fewer
        if imgs * P >= least:
            return {"tile_m": mt, "tile_n": imgs * P, "tile_k": kc}
        if N * P <= least:
            split = -(-SMALL_IMAGE_TASKS // G)
            return {"tile_m": even_tile(Og, -(-Og // split), 8), "tile_n": N * P, "tile_k": kc}
    tiles = task_tiles(Og, P, N * G, d)
    if Og > 1 and tiles["tile_n"] >= P:
        wide = task_tiles(Og, N * P, G, d)
        if wide["tile_n"] >= 2 * P:
            return wide
    return tiles


def _epilogue_loops(em: Emitter, g: dict):
    """em.loops for the epilogue's points: (image, channel, the spatial axes merged into one
    where every access steps through them as one), and whether they merged."""
    grp = em.grp
    spatial = list(range(2, len(grp.domain)))
    out_S = em._spread(grp.maps[grp.root.out.id], contiguous(grp.root.out.type.shape))
    access = em.accesses(grp.root.out, grp.maps[grp.root.out.id]) + [out_S]
    merged = all(S[a] == S[a + 1] * grp.domain[a + 1] for S in access for a in spatial[:-1])
    em.loops = [[0], [1]] + ([spatial] if merged else [[a] for a in spatial])
    return merged


def _kernel_parts(k, geometry_of=None):
    """What the lowerings start from: names, an Emitter, the group, its anchor (a convolution,
    or the pool strategy's fold_windows with its `geometry_of`), its geometry, the output dtype,
    and each operand's (buffer, offset)."""
    names = Names()
    em = Emitter(k, names)
    n = k.group.anchor
    parts = []
    for v in n.inputs:
        buf, off, strides = operand(k, v)
        if strides != contiguous(v.type.shape):
            raise AssertionError("a window operator's operands are contiguous buffers")
        parts.append((buf, off))
    return (names, em, k.group, n, (geometry_of or geometry)(n), k.output.type.dtype, *parts)


def images_per_tile(g: dict, NT: int) -> int:
    """Whole images a task's columns take when one image has fewer positions than tile_n
    (ResNet's 7x7 and 14x14 layers: 49 columns of one image fill two 32-wide micro-tiles to
    77%, and each task packs the weights for them alone); 1 otherwise, and for one output
    channel per group (depthwise: each image a stencil over its rows)."""
    P = g["P"]
    if g["Og"] == 1 or P >= NT:
        return 1
    imgs = min(g["N"], NT // P)
    return imgs if imgs >= 2 and imgs * P > 2 else 1


def lower_conv_tiles(k):
    """A fixed grid of (image, group, row tile, column tile) tasks, each one routine call and
    then the epilogue over its finished tile; for small images (images_per_tile) a task's
    columns are all positions of a block of images instead of a column tile of one."""
    names, em, grp, n, g, d, (X, x_off), (W, w_off) = _kernel_parts(k)
    merged = _epilogue_loops(em, g)
    M, P, K = g["Og"], g["P"], g["Cg"] * g["KK"]
    MT, NT = k.knobs["tile_m"], k.knobs["tile_n"]
    imgs = images_per_tile(g, NT)
    tm, tn = -(-M // MT), (1 if imgs > 1 else -(-P // NT))
    t = names("task")
    img, grpi = names("img"), names("grp")
    i0, j0, mt, nt = names("i0"), names("j0"), names("mt"), names("nt")
    ni = names("images") if imgs > 1 else None
    rest = idx_mod(Var(t), tm * tn)
    plane = idx_div(Var(t), tm * tn)           # image (or block of images) * G + group
    spatial = g["in"][0] * g["in"][1] * g["in"][2]
    decls = [Decl(img, dt.int64, idx_mul(idx_div(plane, g["G"]), Const(imgs))),
             *([Decl(ni, dt.int64, idx_min(Const(imgs), Bin("-", Const(g["N"]), Var(img))))]
               if imgs > 1 else []),
             Decl(grpi, dt.int64, idx_mod(plane, g["G"])),
             Decl(i0, dt.int64, idx_mul(idx_div(rest, tn), Const(MT))),
             Decl(j0, dt.int64, idx_mul(idx_mod(rest, tn), Const(NT))),
             Decl(mt, dt.int64, idx_min(Const(MT), Bin("-", Const(M), Var(i0)))),
             Decl(nt, dt.int64, idx_min(Const(P if imgs > 1 else NT),
                                        Bin("-", Const(P), Var(j0))))]
    row0 = idx_add(idx_mul(Var(grpi), Const(M)), Var(i0))           # first output channel
    xbase = idx_add(Const(x_off), idx_mul(idx_add(idx_mul(Var(img), Const(g["C"])),
                                                  idx_mul(Var(grpi), Const(g["Cg"]))),
                                          Const(spatial)))
    wbase = idx_add(Const(w_off), idx_mul(row0, Const(K)))
    cbase = idx_add(idx_mul(idx_add(idx_mul(Var(img), Const(g["O"])), row0), Const(P)), Var(j0))
    geo = [Const(spatial)] + [Const(v) for key in ("in", "k", "out", "s", "d", "p")
                              for v in g[key]]
    args = (Addr(W.name, wbase), Const(K), Addr(X.name, xbase), Addr(k.output.name, cbase),
            Const(P), Const(K), Var(mt), Var(nt), Const(k.knobs["tile_k"]), Var(j0), *geo,
            Var(ni) if imgs > 1 else Const(1), Const(g["C"] * spatial), Const(g["O"] * P))
    body = decls + [Call(f"ts_conv_tile_{d.short}", args, f"conv:{d.short}")]
    if grp.root is not grp.anchor:
        ii, jj = names("i"), names("j")
        iv = names("im") if imgs > 1 else None
        epi = Loop(jj, Var(nt), "vector" if k.knobs.get("simd") else "serial")
        pos = idx_add(Var(j0), Var(jj))
        point = {0: idx_add(Var(img), Var(iv)) if imgs > 1 else Var(img),
                 1: idx_add(row0, Var(ii))}
        if merged:
            if len(grp.domain) > 2:
                point[2] = pos
        else:
            point |= {2 + q: e for q, e in enumerate(unflatten(pos, list(grp.domain[2:])))}
        value = em.value(grp.root.out, grp.maps[grp.root.out.id], epi.body, point)
        epi.body.append(Store(k.output.name, em.out_index(point), value))
        rows = Loop(ii, Var(mt), "serial", [epi])
        body.append(Loop(iv, Var(ni), "serial", [rows]) if imgs > 1 else rows)
    tasks = -(-g["N"] // imgs) * g["G"] * tm * tn
    return [Loop(t, tasks, "parallel" if k.knobs.get("parallel") else "serial", body)]


def lower_conv_direct(k, knobs):
    """GPUs: an output element per thread, its fma chain over k = (c, kd, kh, kw) from 0 (the
    CPU's bits), then the epilogue at that element."""
    names, em, grp, n, g, d, (X, x_off), (W, w_off) = _kernel_parts(k)
    em.loops = [[a] for a in range(len(grp.domain))]
    N, O, P = g["N"], g["O"], g["P"]
    e = names("e")
    img, ch, pos = split_index(Var(e), [N, O, P])
    zo, yo, xo = unflatten(pos, g["out"])
    acc, kv = names("acc"), names("k")
    c = idx_div(Var(kv), g["KK"])
    r = idx_mod(Var(kv), g["KK"])
    kz, ky, kx = unflatten(r, g["k"])
    coords = [idx_add(Bin("-", idx_mul(o, Const(s)), Const(p)), idx_mul(q, Const(dd)))
              for o, q, s, dd, p in zip((zo, yo, xo), (kz, ky, kx), g["s"], g["d"], g["p"])]
    inside = None
    for q, (v, size) in enumerate(zip(coords, g["in"])):
        if size == 1 and g["k"][q] == 1 and g["p"][q] == 0:
            continue
        test = Bin("&&", Bin(">=", v, Const(0)), Bin("<", v, Const(size)))
        inside = test if inside is None else Bin("&&", inside, test)
    gi = idx_div(ch, g["Og"])
    chan = idx_add(idx_mul(img, Const(g["C"])), idx_add(idx_mul(gi, Const(g["Cg"])), c))
    where = idx_add(idx_mul(idx_add(idx_mul(chan, Const(g["in"][0])), coords[0]),
                            Const(g["in"][1])), coords[1])
    where = idx_add(Const(x_off), idx_add(idx_mul(where, Const(g["in"][2])), coords[2]))
    xv = read(X, where)
    if inside is not None:
        xv = Select(inside, xv, Const(0.0, d))
    wv = read(W, idx_add(Const(w_off), idx_add(idx_mul(ch, Const(g["Cg"] * g["KK"])), Var(kv))))
    fma = OpCall("fma", "elem", (), d, d, (wv, xv, Var(acc)))
    body = [Decl(acc, d, Const(0.0, d)),
            Loop(kv, g["Cg"] * g["KK"], "serial", [Assign(acc, fma)]),
            Store(k.output.name, Var(e), Var(acc))]
    if grp.root is not grp.anchor:
        point = {0: img, 1: ch} | {2 + q: v for q, v in
                                   enumerate(unflatten(pos, list(grp.domain[2:])))}
        tail = []
        value = em.value(grp.root.out, grp.maps[grp.root.out.id], tail, point)
        body += tail + [Store(k.output.name, em.out_index(point), value)]
    total = N * O * P
    return [Loop(e, total, "grid", body)], launch_of(total, knobs["threads"])
