"""Schedule IR → Tile IR: each strategy becomes a loop nest.

Dispatch is on the registry entry's lowering descriptor, never on the operator's name. Every
buffer is contiguous, so an operand is described by an offset and one stride per output axis
(0 where it broadcasts); adjacent axes that stay contiguous for every operand are merged.
"""
from __future__ import annotations

from .. import dtypes as dt
from ..ops import registry as R
from .schedule_ir import Kernel, Schedule
from .tile_ir import (Assign, Bin, Cast, CheckIndex, Const, Decl, Expr, Load, Loop, OpCall, Param,
                      Select, Store, TileKernel, TileProgram, Var, idx_add, idx_mul, linear)


def contiguous(shape):
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return list(reversed(out))


def broadcast_strides(in_shape, out_shape):
    cs = contiguous(in_shape)
    pad = len(out_shape) - len(in_shape)
    return [0 if k < pad or in_shape[k - pad] == 1 else cs[k - pad] for k in range(len(out_shape))]


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


class _Names:
    def __init__(self):
        self.n = 0

    def __call__(self, prefix):
        self.n += 1
        return f"{prefix}{self.n - 1}"


def _nest(extents, names, parallel: bool, simd: bool, inner_kinds=None):
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
        return Const(b.data.item(), b.type.dtype)
    return Load(b.name, index)


def _params(k: Kernel):
    ps, seen = [], set()
    for b in k.inputs:
        if b.role != "inline" and b.name not in seen:
            seen.add(b.name)
            ps.append(Param(b.name, b.type.dtype, b.type.shape, "in", b.label))
    ps.append(Param(k.output.name, k.output.type.dtype, k.output.type.shape, "out"))
    return ps


def _attrs_key(attrs):
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))


def _finish(k: Kernel, body_holder, loops, stmts):
    """Put stmts in the innermost loop (or at top level for a rank-0 nest)."""
    if body_holder is None:
        return stmts
    body_holder.extend(stmts)
    return loops


# ---- strategies ----------------------------------------------------------------------------------
def lower_elementwise(k: Kernel, desc, code):
    names = _Names()
    out = k.output.type
    shape = list(out.shape)
    tensors = [b for b in k.inputs if b.role != "inline"]
    strides = [contiguous(shape)] + [broadcast_strides(list(b.type.shape), shape) for b in tensors]
    ext, strides = coalesce(shape, strides)
    loops, inner, vars_ = _nest(ext, names, k.knobs.get("parallel"), k.knobs.get("simd"))
    stmts, args = [], []
    tensor_pos = {id(b): i for i, b in enumerate(tensors)}
    for b in k.inputs:
        if b.role == "inline":
            args.append(read(b, None))
        else:
            v = names("v")
            stmts.append(Decl(v, b.type.dtype, read(b, linear(vars_, strides[1 + tensor_pos[id(b)]]))))
            args.append(Var(v))
    compute = k.inputs[-1].type.dtype
    call = OpCall(k.op, "elem", _attrs_key(k.attrs), compute, out.dtype, tuple(args))
    stmts.append(Store(k.output.name, linear(vars_, strides[0]), call))
    return _finish(k, inner, loops, stmts)


def lower_view(k: Kernel, desc, code):
    names = _Names()
    src = k.inputs[0]
    out = k.output.type
    offset, in_strides = desc.strides(src.type, out, k.attrs)
    shape = list(out.shape)
    ext, (os_, is_) = coalesce(shape, [contiguous(shape), list(in_strides)])
    loops, inner, vars_ = _nest(ext, names, k.knobs.get("parallel"), k.knobs.get("simd"))
    stmt = Store(k.output.name, linear(vars_, os_), read(src, linear(vars_, is_, offset)))
    return _finish(k, inner, loops, [stmt])


def _groups(in_shape, reduced):
    """Coalesced (extents, in strides, out strides) of the kept and of the reduced axes."""
    cs = contiguous(in_shape)
    kept = [a for a in range(len(in_shape)) if a not in reduced]
    out_cs = contiguous([in_shape[a] for a in kept])
    kept_ext, (kept_in, kept_out) = coalesce([in_shape[a] for a in kept],
                                              [[cs[a] for a in kept], out_cs])
    red_ext, (red_in,) = coalesce([in_shape[a] for a in sorted(reduced)],
                                  [[cs[a] for a in sorted(reduced)]])
    return kept_ext, kept_in, kept_out, red_ext, red_in


def lower_reduce(k: Kernel, desc, code):
    names = _Names()
    x = k.inputs[0]
    xd, od = x.type.dtype, k.output.type.dtype
    kept_ext, kept_in, kept_out, red_ext, red_in = _groups(list(x.type.shape), set(k.attrs["axis"]))
    if kept_in and kept_in[-1] == 1 and red_ext:
        return _reduce_into_rows(k, names, x, kept_ext, kept_in, kept_out, red_ext, red_in)
    acc_d = od
    outer, inner, kvars = _nest(kept_ext, names, k.knobs.get("parallel"), False)
    rloops, rinner, rvars = _nest(red_ext, names, False, False)
    acc = names("acc")
    v = names("v")
    update = [Decl(v, xd, read(x, linear(kvars + rvars, kept_in + red_in))),
              Assign(acc, OpCall(k.op, "combine", (), xd, acc_d, (Var(acc), Var(v))))]
    body = [Decl(acc, acc_d, OpCall(k.op, "init", (), xd, acc_d, ()))]
    body += _finish(k, rinner, rloops, update)
    body.append(Store(k.output.name, linear(kvars, kept_out), Var(acc)))
    return _finish(k, inner, outer, body)


def _reduce_into_rows(k, names, x, kept_ext, kept_in, kept_out, red_ext, red_in):
    """The contiguous axis is kept: accumulate whole rows of the output in place, so the inner
    loop reads memory in order and vectorises. Each output element still combines its inputs
    in the same order as the scalar form, so the result is bitwise the same."""
    xd, od = x.type.dtype, k.output.type.dtype
    n = kept_ext[-1]
    outer, inner, kvars = _nest(kept_ext[:-1], names, k.knobs.get("parallel"), False)
    obase = linear(kvars, kept_out[:-1])
    xbase = linear(kvars, kept_in[:-1])
    j = names("j")
    init = Loop(j, n, "vector", [Store(k.output.name, idx_add(obase, Var(j)),
                                       OpCall(k.op, "init", (), xd, od, ()))])
    rloops, rinner, rvars = _nest(red_ext, names, False, False)
    j2, v = names("j"), names("v")
    oidx = idx_add(obase, Var(j2))
    update = Loop(j2, n, "vector", [
        Decl(v, xd, read(x, idx_add(linear(rvars, red_in), idx_add(xbase, Var(j2))))),
        Store(k.output.name, oidx,
              OpCall(k.op, "combine", (), xd, od, (Load(k.output.name, oidx), Var(v))))])
    body = [init] + _finish(k, rinner, rloops, [update])
    return _finish(k, inner, outer, body)


def lower_argreduce(k: Kernel, desc, code):
    names = _Names()
    x = k.inputs[0]
    xd = x.type.dtype
    shape = list(x.type.shape)
    axis = k.attrs["axis"]
    if axis is None:
        kept_ext, kept_in, kept_out, red_ext, red_in = [], [], [], [x.type.numel()], [1]
    else:
        kept_ext, kept_in, kept_out, red_ext, red_in = _groups(shape, {axis})
    outer, inner, kvars = _nest(kept_ext, names, k.knobs.get("parallel"), False)
    base = linear(kvars, kept_in)
    bi, bv, v, better = names("best_i"), names("best_v"), names("v"), names("better")
    body = [Decl(bi, dt.int64, Const(0)), Decl(bv, xd, read(x, base))]
    if red_ext:
        r = names("r")
        loop = Loop(r, red_ext[0], "serial", [
            Decl(v, xd, read(x, linear([*kvars, Var(r)], kept_in + red_in))),
            Decl(better, dt.bool_, OpCall(k.op, "better", (), xd, dt.bool_, (Var(v), Var(bv)))),
            Assign(bv, Select(Var(better), Var(v), Var(bv))),
            Assign(bi, Select(Var(better), Var(r), Var(bi)))])
        body.append(loop)
    body.append(Store(k.output.name, linear(kvars, kept_out), Var(bi)))
    return _finish(k, inner, outer, body)


def lower_contract(k: Kernel, desc, code):
    names = _Names()
    a, b = k.inputs
    out = k.output.type
    M, K_, N = a.type.shape[-2], a.type.shape[-1], b.type.shape[-1]
    batch = list(out.shape[:-2])
    a_b = [s * M * K_ for s in broadcast_strides(list(a.type.shape[:-2]), batch)] if batch else []
    b_b = [s * K_ * N for s in broadcast_strides(list(b.type.shape[:-2]), batch)] if batch else []
    o_b = [s * M * N for s in contiguous(batch)]
    bext, (a_b, b_b, o_b) = coalesce(batch, [a_b, b_b, o_b]) if batch else ([], ([], [], []))
    par = bool(k.knobs.get("parallel"))
    bl, binner, bvars = _nest(bext, names, par, False)
    i, kk, j, j2, av = names("i"), names("k"), names("j"), names("j"), names("a")
    abase, bbase, obase = linear(bvars, a_b), linear(bvars, b_b), linear(bvars, o_b)
    orow = idx_add(obase, idx_mul(Var(i), Const(N)))
    oidx = lambda jv: idx_add(orow, Var(jv))   # noqa: E731
    d = out.dtype
    simd = "vector" if k.knobs.get("simd") else "serial"
    row = Loop(i, M, "parallel" if par and not bext else "serial", [
        Loop(j, N, simd, [Store(k.output.name, oidx(j), Const(0, d))]),
        Loop(kk, K_, "serial", [
            Decl(av, d, read(a, idx_add(idx_add(abase, idx_mul(Var(i), Const(K_))), Var(kk)))),
            Loop(j2, N, simd, [Store(k.output.name, oidx(j2), Bin("+", Load(k.output.name, oidx(j2)),
                 Bin("*", Var(av), read(b, idx_add(idx_add(bbase, idx_mul(Var(kk), Const(N))),
                                                   Var(j2))))))])])])
    return _finish(k, binner, bl, [row])


def lower_concat(k: Kernel, desc, code):
    names = _Names()
    out = k.output.type
    axis = k.attrs["axis"]
    ocs = contiguous(out.shape)
    stmts, offset = [], 0
    for b in k.inputs:
        shape = list(b.type.shape)
        ext, (is_, os_) = coalesce(shape, [contiguous(shape), list(ocs)])
        loops, inner, vars_ = _nest(ext, names, k.knobs.get("parallel"), k.knobs.get("simd"))
        st = Store(k.output.name, linear(vars_, os_, offset * ocs[axis]),
                   Cast(out.dtype, read(b, linear(vars_, is_))))
        stmts += _finish(k, inner, loops, [st])
        offset += b.type.shape[axis]
    return stmts


def lower_gather(k: Kernel, desc, code):
    names = _Names()
    x, idx = k.inputs
    axis = k.attrs["axis"]
    xs = list(x.type.shape)
    P = 1
    for d in xs[:axis]:
        P *= d
    n = xs[axis]
    Rn = 1
    for d in xs[axis + 1:]:
        Rn *= d
    Q = idx.type.numel()
    # one index load and bounds check per gathered row, then the row is copied
    outer, inner, (p, q) = _nest_keep([P, Q], names, k.knobs.get("parallel"), False)
    iv = names("idx")
    r = Var(names("r")) if Rn != 1 else Const(0)
    src = idx_add(idx_mul(idx_add(idx_mul(p, Const(n)), Var(iv)), Const(Rn)), r)
    dst = idx_add(idx_mul(idx_add(idx_mul(p, Const(Q)), q), Const(Rn)), r)
    copy = Store(k.output.name, dst, read(x, src))
    if Rn != 1:
        copy = Loop(r.name, Rn, "vector" if k.knobs.get("simd") else "serial", [copy])
    stmts = [Decl(iv, dt.int64, Cast(dt.int64, read(idx, q))), CheckIndex(iv, n, code), copy]
    return _finish(k, inner, outer, stmts)


def _nest_keep(extents, names, parallel, simd):
    """Like _nest, but every axis gets a variable (Const(0) for size-1 axes, which get no loop)."""
    real = [e for e in extents if e != 1]
    outer, inner, vars_ = _nest(real, names, parallel, simd)
    it = iter(vars_)
    return outer, inner, [next(it) if e != 1 else Const(0) for e in extents]


LOWERINGS = {R.Elementwise: lower_elementwise, R.View: lower_view, R.Reduce: lower_reduce,
             R.ArgReduce: lower_argreduce, R.Contract: lower_contract, R.Concat: lower_concat,
             R.Gather: lower_gather}


def lower_schedule(s: Schedule) -> TileProgram:
    kernels, calls = [], []
    for code, k in enumerate(s.kernels, start=1):
        desc = R.get(k.op).lowering
        body = LOWERINGS[type(desc)](k, desc, code)
        params = _params(k)
        kernels.append(TileKernel(k.name, k.strategy, params, body, dict(k.knobs),
                                  " ".join(k.fused_labels())))
        calls.append((k.name, [p.name for p in params]))
    buffers = [b for b in s.buffers if b.role != "inline"]
    return TileProgram(s.name, kernels, calls, buffers)
