"""The emitter every strategy lowers with: Schedule IR kernels to Tile IR statements.

Lowering dispatches on the kernel's strategy (tessera/compiler/strategies/) and, inside it, on
each node's lowering descriptor, never on an operator's name. Every buffer is contiguous, so a
read is an offset and one stride per domain axis (0 where it broadcasts); adjacent axes that stay
contiguous for every access merge. The CPU and the GPUs share the Emitter (the expression of any
value of a fusion group at a point of a loop nest); only the loop structure differs, and the
helpers for the GPUs' (grids, blocks, launches) are here too.
"""
from __future__ import annotations

from ..ops import registry as R
from .groups import LEAF, identity_map, is_reshape, map_from, squeezes_only
from .dynamic import is_dynamic, scalar_value
from .schedule_ir import Kernel
from .tile_ir import (Bin, Const, Decl, Expr, Load, Loop, OpCall, Param, Select, Store, Var,
                      idx_add, idx_mul, substitute)


def contiguous(shape) -> list:
    """Row-major strides (the views' own, ops/registry.py), as a list."""
    return list(R.contiguous_strides(shape))


def coalesce(extents, stride_lists):
    """Drop size-1 axes; merge axis i into i+1 when every operand steps through both as one."""
    keep = [k for k, e in enumerate(extents) if e != 1]
    ext = [extents[k] for k in keep]
    strides = [[s[k] for k in keep] for s in stride_lists]
    k = len(ext) - 2
    while k >= 0:
        if all(s[k] == s[k + 1] * ext[k + 1] for s in strides):
            ext[k] *= ext[k + 1]
            for s in strides:
                s[k] = s[k + 1]
            del ext[k + 1]
            for s in strides:
                del s[k + 1]
        k -= 1
    return ext, strides


class Names:
    """Fresh local names. Buffers are named in*, out*, t*, c*, lit*: no prefix here may be one
    of those followed by digits."""

    def __init__(self):
        self.n = 0

    def __call__(self, prefix):
        if prefix in ("in", "out", "t", "c", "lit"):
            raise ValueError(f"local names may not look like buffers: {prefix!r}")
        self.n += 1
        return f"{prefix}{self.n - 1}"


def axis_groups(in_shape, reduced):
    """(kept extents, their strides in the input, their strides in an output of the kept axes,
    reduced extents, their input strides), each group coalesced."""
    cs = contiguous(in_shape)
    kept = [a for a in range(len(in_shape)) if a not in reduced]
    out_cs = contiguous([in_shape[a] for a in kept])
    kept_ext, (kept_in, kept_out) = coalesce([in_shape[a] for a in kept],
                                              [[cs[a] for a in kept], out_cs])
    red_ext, (red_in,) = coalesce([in_shape[a] for a in sorted(reduced)],
                                  [[cs[a] for a in sorted(reduced)]])
    return kept_ext, kept_in, kept_out, red_ext, red_in


def nest(extents, names, parallel: bool, simd: bool):
    """Loops over `extents` (outermost first); returns (outer loop list, innermost body, vars)."""
    vars_, loops = [], []
    for k, e in enumerate(extents):
        kind = "serial"
        if k == 0 and parallel:
            kind = "parallel"
        if k == len(extents) - 1 and simd:
            kind = "parallel+vector" if kind == "parallel" else "vector"
        v = names("i")
        vars_.append(Var(v))
        loops.append(Loop(v, e, kind))
    for outer, inner in zip(loops, loops[1:]):
        outer.body.append(inner)
    body = loops[-1].body if loops else None
    return loops[:1], body, vars_


def read(b, index) -> Expr:
    """Element `index` of buffer b; a 0-d constant the scheduler inlined is its literal."""
    if b.role == "inline":
        return Const(scalar_value(b.data), b.type.dtype)
    return Load(b.name, index)


def params(k: Kernel):
    ps, seen = [], set()
    for b in k.inputs:
        if b.role != "inline" and b.name not in seen:
            seen.add(b.name)
            ps.append(Param(b.name, b.type.dtype, b.type.shape, "in", b.label))
    for b in k.outputs:
        ps.append(Param(b.name, b.type.dtype, b.type.shape, "out"))
    return ps


def attrs_key(attrs):
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))


def finish(k: Kernel, body_holder, loops, stmts):
    """Put stmts in the innermost loop (or at top level for a rank-0 nest)."""
    if body_holder is None:
        return stmts
    body_holder.extend(stmts)
    return loops


# ---- fused groups --------------------------------------------------------------------------------
class Emitter:
    """Builds the expression for any value of a fusion group at the current point of a loop nest.

    The loop nest walks the group's domain; `loops` lists, per loop, the domain axes it covers
    (adjacent axes merged when every access steps through them as one). A value outside the
    group, or a view of one, is a load whose index is linear in the loop variables; an
    elementwise value is computed from its inputs, once per loop body (a Decl), so a value used
    twice is computed once. Row-level values of row groups live in `scalars`."""

    def __init__(self, k: Kernel, names):
        self.k, self.grp, self.names = k, k.group, names
        self.inside = {n.out.id for n in self.grp.nodes}
        self.scalars: dict[int, Expr] = {}
        self.stashed: set = set()      # values a row kernel parked in its output row
        self.memo: dict = {}
        self.loads: dict = {}          # Load -> the expression standing for it (vector lanes)

    # -- where values live -------------------------------------------------------------------------
    def leaf(self, v, m):
        """(buffer, offset, strides per domain axis) of a value read from memory, or None."""
        k, grp = self.k, self.grp
        if v.id not in self.inside:
            b = k.reads[v.id]
            return b, 0, self._spread(m, contiguous(v.type.shape))
        n = v.node
        if grp.anchor is not None and n is grp.anchor:
            return k.output, 0, self._spread(m, contiguous(v.type.shape))
        if isinstance(n.opdef.lowering, R.View) and not squeezes_only(n) and \
                not self._broadcast_of_computed(n):
            b, offset, strides = view_source(k, n)
            return b, offset, self._spread(m, strides)
        return None

    def _broadcast_of_computed(self, n) -> bool:
        """A broadcast the group evaluates at the broadcast point instead of reading it from
        memory (map_from lets one in where it at most doubles: a complex result's parts): one of
        a value the group computes, or of a view that moves elements (evaluated, as the
        group maps it, rather than composed by view_source)."""
        if n.op != "broadcast_to" or map_from(n, tuple(range(len(n.out.type.shape))),
                                              n.inputs[0]) == LEAF:
            return False
        u, moved = n.inputs[0], False
        while u.id in self.inside and isinstance(u.node.opdef.lowering, R.View):
            moved = moved or not is_reshape(u.node)
            u = u.node.inputs[0]
        return u.id in self.inside or moved

    def _spread(self, m, strides):
        S = [0] * len(self.grp.domain)
        for a, s in zip(m, strides):
            if a is not None:
                S[a] += s
        return S

    def reads(self, v, m, out=None):
        """Every (buffer, offset, strides per domain axis) the group reads to compute v."""
        out = [] if out is None else out
        if v.id in self.scalars or self._inline_const(v):
            return out
        lf = self.leaf(v, m)
        if lf is not None:
            if lf[0].role != "inline":          # (a view of an inlined 0-d constant: its literal)
                out.append(lf)
            return out
        n = v.node
        if isinstance(n.opdef.lowering, R.Reduce):
            return self.reads(n.inputs[0], identity_map(n.inputs[0].type.shape), out)
        for u in n.inputs:
            self.reads(u, map_from(n, m, u), out)
        return out

    def accesses(self, v, m):
        """Every strides list the group reads with, for choosing which axes can merge."""
        return [S for _, _, S in self.reads(v, m)]

    def _inline_const(self, v):
        return v.id not in self.inside and self.k.reads[v.id].role == "inline"

    # -- expressions -------------------------------------------------------------------------------
    def value(self, v, m, body: list, idx: dict) -> Expr:
        """v (with axis map m) at the loop point idx (loop number -> index Expr)."""
        if v.id in self.scalars:
            return self.scalars[v.id]
        if v.id in self.stashed:
            load = Load(self.k.output.name, self.out_index(idx))
            return self.loads.get(load, load)
        if self._inline_const(v):
            return read(self.k.reads[v.id], None)
        lf = self.leaf(v, m)
        if lf is not None:
            b, offset, S = lf
            load = read(b, self.index(S, idx, offset))      # (a view of an inlined constant:
            return self.loads.get(load, load)               # its literal)
        n = v.node
        if isinstance(n.opdef.lowering, R.View):          # a reshape that only renames axes
            u = n.inputs[0]
            return self.value(u, map_from(n, m, u), body, idx)
        key = (v.id, m, id(body))
        if key not in self.memo:
            args = tuple(self.value(u, map_from(n, m, u), body, idx) for u in n.inputs)
            compute = n.inputs[-1].type.dtype
            call = OpCall(n.op, "elem", attrs_key(n.attrs), compute, n.out.type.dtype, args)
            name = self.names("v")
            body.append(Decl(name, n.out.type.dtype, call))
            self.memo[key] = Var(name)
        return self.memo[key]

    def index(self, S, idx, offset=0) -> Expr:
        e = Const(offset)
        for loop, axes in enumerate(self.loops):
            stride = S[axes[-1]]
            if stride and loop in idx:
                e = idx_add(e, idx_mul(idx[loop], Const(stride)))
        return e

    # -- the loop structure ------------------------------------------------------------------------
    def plan_loops(self, classes):
        """Group domain axes into loops: `classes` lists runs of axes (in loop order) that may
        merge; axes of size 1 get no loop. Sets self.loops (list of axis lists)."""
        grp = self.grp
        out_S = self._spread(grp.maps[grp.root.out.id], contiguous(grp.root.out.type.shape))
        access = self.accesses(grp.root.out, grp.maps[grp.root.out.id]) + [out_S]
        if grp.anchor is not None:
            access = [out_S]
        loops = []
        for run in classes:
            run = [a for a in run if grp.domain[a] != 1]
            cur = []
            for a in run:
                if cur and all(S[cur[-1]] == S[a] * grp.domain[a] for S in access) \
                        and cur[-1] + 1 == a:
                    cur.append(a)
                else:
                    if cur:
                        loops.append(cur)
                    cur = [a]
            if cur:
                loops.append(cur)
        self.loops = loops
        return loops

    def extent(self, loop) -> int:
        e = 1
        for a in self.loops[loop]:
            e *= self.grp.domain[a]
        return e

    def out_index(self, idx):
        grp = self.grp
        S = self._spread(grp.maps[grp.root.out.id], contiguous(grp.root.out.type.shape))
        return self.index(S, idx)


def loop_nest(em: Emitter, loop_ids, parallel: bool, vector_last: bool):
    """Loops for the given loop numbers (outermost first): (outer list, innermost body, idx)."""
    idx, outer, body = {}, [], None
    for pos, lid in enumerate(loop_ids):
        kind = "parallel" if pos == 0 and parallel else "serial"
        if pos == len(loop_ids) - 1 and vector_last:
            kind = "parallel+vector" if kind == "parallel" else "vector"
        v = em.names("i")
        loop = Loop(v, em.extent(lid), kind)
        idx[lid] = Var(v)
        (outer if body is None else body).append(loop)
        body = loop.body
    return outer, body, idx


def reduction_plan(k: Kernel):
    """A reduction group's Emitter and its loops (by number) over the kept axes and over the
    reduced ones, adjacent axes merged where every access allows."""
    em = Emitter(k, Names())
    red = list(k.group.reduced)
    kept = [a for a in range(len(k.group.domain)) if a not in red]
    loops = em.plan_loops([kept, red])
    kept_loops = [i for i, axes in enumerate(loops) if axes[0] not in red]
    red_loops = [i for i, axes in enumerate(loops) if axes[0] in red]
    return em, kept_loops, red_loops


def store_all(em: Emitter, k: Kernel, body: list, idx):
    """The kernel's output and its extra stores (values on the root's domain and layout)."""
    grp = k.group
    for v, b in [(grp.root.out, k.output)] + k.stores:
        body.append(Store(b.name, em.out_index(idx), em.value(v, grp.maps[v.id], body, idx)))


def view_source(k: Kernel, n):
    """(buffer, offset, strides per output axis) of a view node read in place, through the
    views the group absorbed between it and a buffer (a slice under a transpose: x[1:].T),
    composed into one (every buffer is contiguous)."""
    chain = [n]
    while chain[-1].inputs[0].id not in k.reads:
        chain.append(chain[-1].inputs[0].node)
    offset, strides = R.compose_views(chain)
    return k.reads[chain[-1].inputs[0].id], offset, list(strides)


def operand(k: Kernel, v):
    """(buffer, offset, strides per axis) of a contraction operand: a buffer, or a view of one
    read in place (x @ w.T never copies w)."""
    if v.id in k.reads:
        return k.reads[v.id], 0, contiguous(v.type.shape)
    return view_source(k, v.node)


def idx_min(a, b):
    return Select(Bin("<", a, b), a, b)


def idx_div(a, e: int):
    return a if e == 1 and not is_dynamic(e) else Bin("/", a, Const(e))


def idx_mod(a, e: int):
    return Const(0) if e == 1 and not is_dynamic(e) else Bin("%", a, Const(e))


def unflatten(flat, extents):
    """Per-axis indices (outermost first) of a flat index over `extents`."""
    out, rest = [], flat
    for e in reversed(extents):
        out.append(idx_mod(rest, e))
        rest = idx_div(rest, e)
    return list(reversed(out))


def batch_strides(shape, strides, batch):
    """An operand's strides over the output's batch axes (0 where it broadcasts)."""
    pad = len(batch) - (len(shape) - 2)
    return [0 if q < pad or shape[q - pad] == 1 else strides[q - pad] for q in range(len(batch))]


def nest_keep(extents, names, parallel, simd):
    """Like nest, but every axis gets a variable (Const(0) for size-1 axes, which get no loop)."""
    real = [e for e in extents if e != 1]
    outer, inner, vars_ = nest(real, names, parallel, simd)
    it = iter(vars_)
    return outer, inner, [next(it) if e != 1 else Const(0) for e in extents]


GRID_CAP = 65535 * 8               # blocks per launch at most; grid-stride loops cover the rest


def prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def split_index(flat, extents) -> list:
    """Per-axis indices (outermost first) of a flat index below prod(extents): the outermost
    needs no remainder (64-bit division is slow on GPUs)."""
    if not extents:
        return []
    return [idx_div(flat, prod(extents[1:])), *unflatten(flat, extents)[1:]]


def launch_of(work: int, threads: int, per_block: bool = False) -> dict:
    """A launch for `work` iterations of a grid loop (one per thread), or of a block loop (one
    per block) when per_block. Shared memory is static (Shared statements): none dynamic."""
    blocks = work if per_block else -(-work // threads)
    return {"grid": max(1, min(blocks, GRID_CAP)), "block": threads, "shared": 0}


def grid_from_cpu_nests(stmts, knobs):
    """(statements, launch) for a GPU from a CPU lowering whose top-level loop nests have
    independent iterations in their perfectly nested outer loops (argreduce, concat, integer
    matmul): those loops flattened onto the grid, the rest serial per thread. Statements
    outside any loop run on one thread."""
    names = Names()
    if not all(isinstance(s, Loop) and isinstance(s.extent, int) for s in stmts):
        g = names("gone")
        return [Loop(g, 1, "grid", serial(stmts))], launch_of(1, knobs["threads"])
    out, most = [], 1
    for s in stmts:
        chain = [s]
        while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], Loop) and \
                isinstance(chain[-1].body[0].extent, int):
            chain.append(chain[-1].body[0])
        g = names("gflat")
        extents = [lp.extent for lp in chain]
        values = {lp.var: e for lp, e in zip(chain, split_index(Var(g), extents))}
        out.append(Loop(g, prod(extents), "grid", substitute(serial(chain[-1].body), values)))
        most = max(most, prod(extents))
    return out, launch_of(most, knobs["threads"])


def serial(stmts):
    """The statements with every loop made serial (one GPU thread runs them)."""
    out = []
    for s in stmts:
        if isinstance(s, Loop):
            s = Loop(s.var, s.extent, "serial", serial(s.body))
        out.append(s)
    return out
