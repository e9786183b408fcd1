"""pool: fold_windows (the pools' windows: max_pool's maxima, avg_pool's sums) with its
elementwise epilogue (avg_pool's division by the window counts, an activation).

On the CPU a fixed grid of tasks, each a block of planes (one channel of one image) or a tile
of whole output rows of one, each one call of the pool routine (routines/c_pool.py: the rows
read laid out once with the combination's identity as padding, the stride's column phases
apart, each block of outputs folded in registers) and then the epilogue over its finished
outputs. GPUs fold an output element per thread. Either way each window is folded over its taps
in order from the first: the bits of the chain of elementwise maxima or sums over the windows'
slices the operator decomposes into (ops/conv.py), which other dtypes and symbolic shapes run.
"""
from __future__ import annotations

import math

from ... import dtypes as dt
from ...ops import registry as R
from ..dynamic import representative
from ..emit import idx_div, idx_min, idx_mod, launch_of, read, split_index, unflatten
from ..tile_ir import Addr, Assign, Bin, Call, Const, Decl, Loop, OpCall, Select, Store, Var, \
    idx_add, idx_mul
from .base import PARALLEL_MIN_FLOPS, Strategy, register
from .conv import ConvStrategy, _epilogue_loops, _kernel_parts
from .routines import c_pool, specialise

# A task takes whole planes while they hold fewer outputs than this, else whole rows of one
TASK_OUTPUTS = 1 << 14
COMBINE = {"maximum": 0, "add": 1, "argmax": 2}


def geometry(n) -> dict:
    """fold_windows' sizes, its spatial axes padded in front to three."""
    x, out, a = n.inputs[0].type.shape, n.out.type.shape, n.attrs
    lead = 3 - (len(x) - 2)
    pad3 = lambda v, fill: [fill] * lead + list(v)      # noqa: E731
    return {"N": x[0], "C": x[1], "in": pad3(x[2:], 1), "k": pad3(a["kernel"], 1),
            "out": pad3(out[2:], 1), "s": pad3(a["stride"], 1), "d": pad3(a["dilation"], 1),
            "p": pad3([lo for lo, _ in a["padding"]], 0), "P": math.prod(out[2:]),
            "KK": math.prod(a["kernel"]), "combine": a["combine"]}


class PoolStrategy(ConvStrategy):
    """The convolution's grouping (a node with its elementwise epilogue, reading its input as
    it lies) with a tiling and routine of its own."""
    name = "pool"
    knobs = ("tile_n",)
    aliases = {"BN": "tile_n"}
    routines = {"pool": "ts_pool_tile_{S}"}

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Pool)

    def node_flops(self, n) -> int:
        return n.out.type.numel() * (geometry(n)["KK"] - 1)

    def cpu_knobs(self, k) -> dict:
        g = geometry(k.group.anchor)
        row, P = g["out"][2], g["P"]
        tile = P * max(1, TASK_OUTPUTS // P) if P <= TASK_OUTPUTS else \
            max(1, TASK_OUTPUTS // row) * row
        return {"parallel": representative(k.flops + k.bytes) >= PARALLEL_MIN_FLOPS,
                "simd": True, "tile_n": tile}

    def gpu_knobs(self, k, target) -> dict:
        return {"threads": 256}

    def op_knobs(self, grp) -> dict:
        return {}

    def user_knobs(self, schedule) -> dict:
        return Strategy.user_knobs(self, schedule)

    def space(self, k) -> dict:
        return {}

    def invalid(self, k, knobs) -> str | None:
        return None

    def lower_cpu(self, k, code):
        return lower_pool_tiles(k)

    def lower_gpu(self, k, code, target, knobs):
        return lower_pool_direct(k, knobs)

    def c_routine(self, name, dtype):
        return c_pool.pool_source(dtype)


register(PoolStrategy())


def _epilogue(k, em, grp, first_plane, planes, j0, nt, names, merged, body):
    """The epilogue over a task's finished outputs: planes first_plane.. (+ planes), positions
    j0 .. j0 + nt of each."""
    g = {"C": grp.anchor.out.type.shape[1]}
    i, jj = names("i"), names("j")
    epi = Loop(jj, nt, "vector" if k.knobs.get("simd") else "serial")
    plane = idx_add(first_plane, Var(i))
    pos = idx_add(j0, Var(jj))
    point = {0: idx_div(plane, g["C"]), 1: idx_mod(plane, g["C"])}
    if merged:
        if len(grp.domain) > 2:
            point[2] = pos
    else:
        point |= {2 + q: e for q, e in enumerate(unflatten(pos, list(grp.domain[2:])))}
    value = em.value(grp.root.out, grp.maps[grp.root.out.id], epi.body, point)
    epi.body.append(Store(k.output.name, em.out_index(point), value))
    body.append(Loop(i, planes, "serial", [epi]))


def lower_pool_tiles(k):
    """Tasks of whole planes (small planes: several a task) or of whole output rows of one
    plane, each one routine call, then the epilogue over what it wrote."""
    names, em, grp, n, g, _, (X, x_off) = _kernel_parts(k, geometry)
    merged = _epilogue_loops(em, g)
    d = n.inputs[0].type.dtype              # (argmax: int64 offsets out of d's windows)
    routine = specialise(PoolStrategy.routines["pool"], S=d.short)
    NC, P, NT = g["N"] * g["C"], g["P"], k.knobs["tile_n"]
    inplane = math.prod(g["in"])
    t = names("task")
    geo = [Const(v) for key in ("in", "k", "out", "s", "d", "p") for v in g[key]]
    combine = Const(COMBINE[g["combine"]])
    if NT >= P:                                  # whole planes, NT // P of them a task
        per = NT // P
        first, count = names("plane"), names("planes")
        decls = [Decl(first, dt.int64, idx_mul(Var(t), Const(per))),
                 Decl(count, dt.int64, idx_min(Const(per), Bin("-", Const(NC), Var(first))))]
        args = (Addr(X.name, idx_add(Const(x_off), idx_mul(Var(first), Const(inplane)))),
                Addr(k.output.name, idx_mul(Var(first), Const(P))), Const(P), Const(0),
                combine, *geo, Var(count), Const(inplane), Const(P))
        body = decls + [Call(routine, args, f"pool:{d.short}")]
        if grp.root is not grp.anchor:
            _epilogue(k, em, grp, Var(first), Var(count), Const(0), P, names, merged, body)
        tasks = -(-NC // per)
    else:                                        # whole rows of one plane
        tiles = -(-P // NT)
        plane, j0, nt = names("plane"), names("j0"), names("nt")
        decls = [Decl(plane, dt.int64, idx_div(Var(t), tiles)),
                 Decl(j0, dt.int64, idx_mul(idx_mod(Var(t), tiles), Const(NT))),
                 Decl(nt, dt.int64, idx_min(Const(NT), Bin("-", Const(P), Var(j0))))]
        args = (Addr(X.name, idx_add(Const(x_off), idx_mul(Var(plane), Const(inplane)))),
                Addr(k.output.name, idx_add(idx_mul(Var(plane), Const(P)), Var(j0))), Var(nt),
                Var(j0), combine, *geo, Const(1), Const(inplane), Const(P))
        body = decls + [Call(routine, args, f"pool:{d.short}")]
        if grp.root is not grp.anchor:
            _epilogue(k, em, grp, Var(plane), 1, Var(j0), Var(nt), names, merged, body)
        tasks = NC * tiles
    return [Loop(t, tasks, "parallel" if k.knobs.get("parallel") else "serial", body)]


def lower_pool_direct(k, knobs):
    """GPUs: an output element per thread, folded over the taps in order (from -inf for the
    largest, -0 for a sum: the identities that leave the first tap's value as it is), then the
    epilogue at that element."""
    names, em, grp, n, g, d, (X, x_off) = _kernel_parts(k, geometry)
    em.loops = [[a] for a in range(len(grp.domain))]
    NC, P = g["N"] * g["C"], g["P"]
    e = names("e")
    plane, pos = split_index(Var(e), [NC, P])
    acc, kv = names("acc"), names("k")
    taps = unflatten(Var(kv), g["k"])
    coords = [idx_add(Bin("-", idx_mul(o, Const(s)), Const(p)), idx_mul(q, Const(dd)))
              for o, q, s, dd, p in zip(unflatten(pos, g["out"]), taps, g["s"], g["d"],
                                        g["p"])]
    inside = None
    for v, size in zip(coords, g["in"]):
        test = Bin("&&", Bin(">=", v, Const(0)), Bin("<", v, Const(size)))
        inside = test if inside is None else Bin("&&", inside, test)
    where = plane
    for v, size in zip(coords, g["in"]):
        where = idx_add(idx_mul(where, Const(size)), v)
    add = g["combine"] == "add"
    xd = n.inputs[0].type.dtype
    xv = Select(inside, read(X, idx_add(Const(x_off), where)),
                Const(0.0 if add else -math.inf, xd))
    if g["combine"] == "argmax":   # from -inf and 0: after tap 0 its value and 0, as argmax starts
        v, better, at = names("v"), names("better"), names("at")
        body = [Decl(acc, xd, Const(-math.inf, xd)), Decl(at, dt.int64, Const(0)),
                Loop(kv, g["KK"], "serial", [
                    Decl(v, xd, xv),
                    Decl(better, dt.bool_, OpCall("argmax", "better", (), xd, dt.bool_,
                                                  (Var(v), Var(acc)))),
                    Assign(acc, Select(Var(better), Var(v), Var(acc))),
                    Assign(at, Select(Var(better), Var(kv), Var(at)))]),
                Store(k.output.name, Var(e), Var(at))]
    else:
        fold = OpCall(g["combine"], "elem", (), d, d, (Var(acc), xv))
        body = [Decl(acc, d, Const(-0.0 if add else -math.inf, d)),
                Loop(kv, g["KK"], "serial", [Assign(acc, fold)]),
                Store(k.output.name, Var(e), Var(acc))]
    if grp.root is not grp.anchor:       # (argmax's int64 takes no epilogue: never here)
        point = {0: idx_div(plane, g["C"]), 1: idx_mod(plane, g["C"])} | {
            2 + q: v for q, v in enumerate(unflatten(pos, list(grp.domain[2:])))}
        tail = []
        value = em.value(grp.root.out, grp.maps[grp.root.out.id], tail, point)
        body += tail + [Store(k.output.name, em.out_index(point), value)]
    total = NC * P
    return [Loop(e, total, "grid", body)], launch_of(total, knobs["threads"])
