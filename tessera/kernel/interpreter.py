"""The reference of a tile kernel: its body run with NumPy, one program at a time.

What eager calls, `ts.interpret` and the debugger compute (the `tile_program` operator's
reference). Each statement class has its method here (RUN_STMT); mma and sums run in
float64. Every tile keeps its valid extent per axis (what lies inside the tensor), which
reductions, mma and the stores respect, as the compiled kernels do.
"""
from __future__ import annotations

import numpy as np

from ..errors import RuntimeFault
from ..ops import registry as R
from .ir import AtomicStmt, ElemStmt, FullStmt, KernelBody, KernelValue, LoadStmt, LoopStmt, \
    MmaStmt, PartStmt, ReduceStmt, ReturnStmt, StoreStmt, UpdateStmt


def interpret(body: KernelBody, arrays, knobs=None):
    """The kernel's output computed with NumPy, one program at a time (the operator's
    reference: eager calls, ts.interpret, the debugger). mma and sums run in float64."""
    knobs = {"BM": 64, "BN": 64, "BK": 64, **(knobs or {})}
    arrays = [np.asarray(a) for a in arrays]
    dims = {}
    for p, a in zip(body.params, arrays):
        dims.update(zip(p.dims, a.shape))
    launch = _Launch(body, arrays, dims, knobs)
    for pid in np.ndindex(*launch.grid):
        _Program(launch, pid).run(body.stmts)
    return launch.dst


class _Launch:
    """What every program shares: sizes, the grid, the arrays, the output."""

    def __init__(self, body, arrays, dims, knobs):
        self.body, self.dims, self.knobs = body, dims, knobs
        self.grid = [1 if b is None else -(-dims[d] // self.size(b)) for d, b in body.grid]
        self.named = dict(zip([p.name for p in body.params], arrays))
        param = body.output_param
        if param is not None:
            self.dst = np.array(self.named[param])  # what no program stores keeps the caller's
            self.out_dims = body.param(param).dims
        else:
            v = body.output.value
            self.dst = np.zeros([dims[d] for d in v.dims], (body.out_dtype or v.dtype).np)
            self.out_dims = v.dims

    def size(self, s):
        return s.args[0] if s.op == "const" else self.knobs.get(s.args[0], 1) \
            if s.op == "knob" else self.dims[s.args[0]]


class _Program:
    """One program: its tiles (env), their valid extents, the loop variables, the streams."""

    def __init__(self, launch: _Launch, pid):
        self.l, self.pid = launch, pid
        self.at = {d: pid[i] * launch.size(b) for i, (d, b) in enumerate(launch.body.grid)
                   if b is not None}
        self.env, self.valid, self.vars, self.streams = {}, {}, {}, {}

    def ix(self, e):
        if e.op in ("const", "knob", "dim"):
            return self.l.size(e)
        if e.op == "var":
            return self.vars[e.args[0]]
        if e.op == "pid":
            return self.pid[e.args[0]] if e.args[0] < len(self.pid) else 0
        if e.op == "nprog":
            g = self.l.grid
            return g[e.args[0]] if e.args[0] < len(g) else 1
        a, b = self.ix(e.args[0]), self.ix(e.args[1])
        return {"+": a + b, "-": a - b, "*": a * b, "//": a // b, "%": a % b}[e.op]

    def val(self, a, d=None):
        if isinstance(a, KernelValue):
            x = self.env[a.id]
            return x if d is None else x.astype(d.np)
        return np.asarray(a, d.np)

    def run(self, stmts):
        for st in stmts:
            RUN_STMT[type(st)](self, st)

    def fill(self, st: LoadStmt, v: KernelValue, k=None):
        """v: the tensor's block st places (at k along a stream), `other` outside it."""
        p = self.l.body.param(st.param)
        src = self.l.named[p.name]
        shape = [self.l.size(s) for s in v.shape]
        t = np.full(shape, st.other, v.dtype.np)
        offs = []
        for i, place in enumerate(st.place):
            offs.append(0 if place == "whole" else self.at[p.dims[i]] if place == "grid" else
                        k if place == "stream" else self.ix(st.offsets[i]))
        lo = [max(0, -o) for o in offs]
        hi = [max(0, min(n, E - o)) for n, E, o in zip(shape, src.shape, offs)]
        if all(a < b for a, b in zip(lo, hi)):
            t[tuple(slice(a, b) for a, b in zip(lo, hi))] = \
                src[tuple(slice(o + a, o + b) for o, a, b in zip(offs, lo, hi))]
        # an explicit offset's tile is valid whole (what lies outside is `other`)
        self.env[v.id] = t
        self.valid[v.id] = [n if place == "offset" else h
                            for n, h, place in zip(shape, hi, st.place)]

    def load(self, st: LoadStmt):
        if st.streamed:
            self.streams[st.out.id] = st
        else:
            self.fill(st, st.out)

    def part(self, st: PartStmt):
        self.fill(self.streams[st.stream.id], st.out, self.ix(st.k))

    def full(self, st: FullStmt):
        v = st.out
        self.env[v.id] = np.full([self.l.size(s) for s in v.shape], st.value, v.dtype.np)

    def elem(self, st: ElemStmt):
        v = st.out
        args = [self.val(a, d) for a, d in zip(st.args, st.operand)]
        r = R.run_reference(R.get(st.op), args, {**R.get(st.op).attrs, **st.extra})
        self.env[v.id] = np.asarray(r).astype(v.dtype.np)
        self.valid[v.id] = self.elem_valid(st)

    def elem_valid(self, st: ElemStmt):
        rank = len(st.out.shape)
        out = [self.l.size(s) for s in st.out.shape]
        for a in st.args:
            if isinstance(a, KernelValue) and a.id in self.valid:
                for j, n in enumerate(self.valid[a.id]):
                    i = rank - len(a.shape) + j
                    if self.l.size(a.shape[j]) != 1:
                        out[i] = min(out[i], n)
        return out

    def reduce(self, st: ReduceStmt):
        v = st.out
        x, ax = self.env[st.x.id], st.axis
        n = self.valid.get(st.x.id, x.shape)[ax]
        part = np.take(x, range(n), axis=ax)
        fn = {"max": np.max, "min": np.min, "sum": np.sum}[st.op]
        if n == 0:
            r = np.full(part.shape[:ax] + part.shape[ax + 1:],
                        {"max": -np.inf, "min": np.inf, "sum": 0}[st.op])
        else:
            r = fn(part.astype(np.float64) if st.op == "sum" and v.dtype.is_float else part,
                   axis=ax)
        if st.keepdim:
            r = np.expand_dims(r, ax)
        self.env[v.id] = np.asarray(r).astype(v.dtype.np)
        kept = [m for i, m in enumerate(self.valid.get(st.x.id, x.shape)) if i != ax]
        if st.keepdim:
            kept.insert(ax, 1)
        self.valid[v.id] = kept

    def mma(self, st: MmaStmt):
        a, b, env = st.a, st.b, self.env
        va, vb = self.valid.get(a.id, env[a.id].shape), self.valid.get(b.id, env[b.id].shape)
        kv = min(va[1], vb[0])
        env[st.out.id] = (env[a.id][:, :kv].astype(np.float64) @
                          env[b.id][:kv].astype(np.float64)).astype(st.out.dtype.np)
        self.valid[st.out.id] = [va[0], vb[1]]

    def update(self, st: UpdateStmt):
        tv = st.target
        r = R.run_reference(R.get(st.op), [self.env[tv.id], self.val(st.value, tv.dtype)], {})
        self.env[tv.id] = np.asarray(r).astype(tv.dtype.np)

    def loop(self, st: LoopStmt):
        start, stop, step = self.ix(st.start), self.ix(st.stop), self.ix(st.step)
        for kk in range(start, stop, step):
            self.vars[st.var] = kk
            self.run(st.body)

    def store(self, st, add=False):
        """The valid part of the stored tile into the output, at the program's block (or at
        the statement's offsets); `add`: added to what is there."""
        dst = self.l.dst
        x = self.env[st.value.id]
        offsets = getattr(st, "offsets", None)
        offs = [self.ix(o) for o in offsets] if offsets \
            else [self.at.get(d, 0) for d in self.l.out_dims]
        lo = [max(0, -o) for o in offs]
        hi = [max(0, min(s, E - o)) for s, E, o in zip(x.shape, dst.shape, offs)]
        if all(a < b for a, b in zip(lo, hi)):
            into = tuple(slice(o + a, o + b) for o, a, b in zip(offs, lo, hi))
            part = x[tuple(slice(a, b) for a, b in zip(lo, hi))].astype(dst.dtype)
            if add:
                dst[into] += part
            else:
                dst[into] = part

    def atomic(self, st: AtomicStmt):
        if st.index is None:
            return self.store(st, add=True)
        # x[index[e]] += value[e] over the index tile's valid elements
        dst, value, index = self.l.dst, st.value, st.index
        idx = self.env[index.id]
        n = self.valid.get(index.id, idx.shape)
        keep = tuple(slice(0, m) for m in n)
        idx = idx[keep].astype(np.int64).ravel()
        vals = np.broadcast_to(self.val(value, dst.dtype), self.env[index.id].shape)[keep].ravel() \
            if isinstance(value, KernelValue) else np.full(idx.shape, value, dst.dtype)
        bad = (idx < -len(dst)) | (idx >= len(dst))
        if bad.any():
            raise RuntimeFault(f"tile.atomic_add into {st.param}: index {idx[bad][0]} is out "
                               f"of range for {len(dst)} elements", location=st.loc,
                               hint="indices must lie in [-n, n) for an axis of size n")
        np.add.at(dst, idx, vals.astype(dst.dtype))


RUN_STMT = {LoadStmt: _Program.load, PartStmt: _Program.part, FullStmt: _Program.full,
            ElemStmt: _Program.elem, ReduceStmt: _Program.reduce, MmaStmt: _Program.mma,
            UpdateStmt: _Program.update, LoopStmt: _Program.loop, StoreStmt: _Program.store,
            ReturnStmt: _Program.store, AtomicStmt: _Program.atomic}
