"""fft: a batch of discrete Fourier transforms along one axis (the dft primitives of
ops/spectral.py), alone. CPU: blocks of lines in parallel; a block's lines are gathered into
two private planes (real and imaginary parts, element-major, so the routine's vector
instructions run across the lines), transformed in place by the FFT routine (routines/fft.c:
mixed-radix Stockham, Bluestein for large prime factors, packed real transforms) and scattered
to the output times the norm's factor. A line is one fixed chain of operations whichever block
or lane it is in, so neither threads nor the batch change a bit.
"""
from __future__ import annotations

import math

from ... import dtypes as dt
from ...errors import BackendUnavailableError
from ...ops import registry as R
from ..emit import Emitter, Names, contiguous, idx_min, prod, split_index
from ..groups import Group, identity_map
from ..tile_ir import (Addr, Bin, Call, Const, Decl, Load, Loop, Scratch, Store, Var, idx_add,
                       idx_mul, linear)
from .base import PARALLEL_MIN_ELEMENTS, Strategy, register
from .routines import routine_text, specialise

ROUTINE = routine_text("fft.c")
SCRATCH = routine_text("scratch.c")
KIND_CODE = {("c2c", False): 0, ("c2c", True): 1, ("r2c", False): 2, ("c2r", False): 3}


class FFT(Strategy):
    name = "fft"
    routines = {"fft": "ts_fft_{S}"}

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Spectral)

    def start(self, n) -> Group:
        """The domain is the input's shape: a transform gathers its lines through the elementwise
        producers and views it takes in (a spectral filter's weighting, a complex parameter's
        parts read in place). The output walks the domain's other axes."""
        domain = tuple(n.inputs[0].type.shape)
        grp = Group(self.name, n, domain)
        axis, rank = n.attrs["axis"], len(domain)
        out = n.out.type.shape
        grp.maps[n.out.id] = tuple(None if k == axis or k >= rank or out[k] == 1 else k
                                   for k in range(len(out)))
        return grp

    def node_flops(self, n) -> int:
        """5 n log2 n per complex line (the radix-2 count, as FFT benchmarks quote); half that
        for a real one."""
        kind = n.opdef.lowering.kind
        t = n.inputs[0].type
        points = n.attrs["n"] if kind == "c2r" else t.shape[n.attrs["axis"]]
        lines = t.numel() // max(1, t.shape[n.attrs["axis"]])
        flops = 5 * points * max(1.0, math.log2(max(points, 1)))
        return int(lines * flops / (1 if kind == "c2c" else 2))

    def cpu_knobs(self, k) -> dict:
        t = k.inputs[0].type
        lines = t.numel() // max(1, t.shape[k.attrs["axis"]])
        return {"parallel": lines >= 2 and k.output.type.numel() >= PARALLEL_MIN_ELEMENTS // 16}

    def lower_cpu(self, k, code):
        return lower_fft(k, code)

    def lower_gpu(self, k, code, target, knobs):
        raise BackendUnavailableError(
            f"the Fourier transforms run on the CPU only so far ({k.op} in {k.name})",
            hint="use target='cpu' for a function with op.fft, op.rfft and their kin")

    def c_routine(self, name, dtype):
        t = {"f32": "float", "f64": "double"}[dtype]
        return ["#include <stdlib.h>", specialise(SCRATCH, S=dtype, T=t),
                specialise(ROUTINE, S=dtype, T=t)]


register(FFT())


def lanes_for(n: int, lines: int) -> int:
    """Lines transformed together (the routine's vectors run across them): as many as keep a
    block's two planes and its work near 256 KiB of float32, at most 32, at most the lines."""
    v = 1
    while v < 32 and v * 2 * n <= 1 << 15 and v < lines:
        v *= 2
    return v


def lower_fft(k, code):
    """Blocks of V lines (V: lanes_for), in parallel: each line gathered into the block's two
    planes (element-major: element j of lane v at j * count + v; a real line of even n packed
    as n/2 complex values) through the group's prologue, one routine call for the block, each
    line scattered to the output times the norm's factor."""
    names = Names()
    em = Emitter(k, names)
    node = k.group.root
    kind = node.opdef.lowering.kind
    axis, d = node.attrs["axis"], k.output.type.dtype
    domain = list(k.group.domain)
    em.loops = [[a] for a in range(len(domain))]    # an index per domain axis
    out_shape = list(k.output.type.shape)
    n = node.attrs["n"] if kind == "c2r" else domain[axis]
    kept = [a for a in range(len(domain)) if a != axis]
    extents = [domain[a] for a in kept]
    cout = contiguous(out_shape)
    total = prod(extents)
    if total == 0:
        return []
    V = lanes_for(n, total)
    plane = V * (n + 1)
    blk, cnt, v, line, j, buf = (names(w) for w in ("blk", "count", "v", "line", "j", "planes"))
    i64 = dt.int64
    jv = Var(j)
    two = lambda i, o: idx_add(idx_mul(i, Const(2)), Const(o))
    packed = kind != "c2c" and n % 2 == 0         # a real line as n/2 complex values
    bodies = []                                   # (the emitter's memo keys on id(body))

    def per_line(stmts_of):
        """A loop over the block's lines, each line's indices placed, around stmts_of(where,
        at_out): where(i) the domain point of the line's element i, at_out(i) the output's
        index of it."""
        kvars = split_index(Var(line), extents)
        where = lambda i: {**dict(zip(kept, kvars)), axis: i}
        at_out = lambda i: idx_add(linear(kvars, [cout[a] for a in kept]),
                                   idx_mul(i, Const(cout[axis])))
        return Loop(v, Var(cnt), "serial", [
            Decl(line, i64, idx_add(idx_mul(Var(blk), Const(V)), Var(v))),
            *stmts_of(where, at_out)])

    def slot(part, i):                        # element i of the lane in plane part (0 re, 1 im)
        return idx_add(Const(part * plane), idx_add(idx_mul(i, Var(cnt)), Var(v)))

    def put(part, i, value_of, point):
        """The statements storing the prologue's value at a domain point into a plane."""
        body = []
        bodies.append(body)
        body.append(Store(buf, slot(part, i), value_of(body, point)))
        return body

    def operand(u):
        m = k.group.maps.get(u.id) or identity_map(u.type.shape)    # (a leaf: read as it is)
        return lambda body, point: em.value(u, m, body, point)

    def gather(where, at_out):
        x = node.inputs[0]
        if kind == "r2c" and packed:
            body = put(0, jv, operand(x), where(two(jv, 0))) + \
                put(1, jv, operand(x), where(two(jv, 1)))
            return [Loop(j, n // 2, "serial", body)]
        if kind == "r2c":
            body = put(0, jv, operand(x), where(jv)) + [Store(buf, slot(1, jv), Const(0, d))]
            return [Loop(j, n, "serial", body)]
        return [Loop(j, domain[axis], "serial",
                     [s for p, u in enumerate(node.inputs[:2])
                      for s in put(p, jv, operand(u), where(jv))])]

    s = node.attrs["scale"]
    scaled = (lambda e: e) if s == 1.0 else (lambda e: Bin("*", e, Const(s, d)))

    def scatter(where, at_out):
        out = k.output.name
        if kind != "c2r":                         # the parts on the output's last axis of 2
            return [Loop(j, out_shape[axis], "serial",
                         [Store(out, idx_add(at_out(jv), Const(p)), scaled(Load(buf, slot(p, jv))))
                          for p in (0, 1)])]
        if packed:
            return [Loop(j, n // 2, "serial",
                         [Store(out, at_out(two(jv, p)), scaled(Load(buf, slot(p, jv))))
                          for p in (0, 1)])]
        return [Loop(j, n, "serial", [Store(out, at_out(jv), scaled(Load(buf, slot(0, jv))))])]

    code_kind = KIND_CODE[kind, bool(node.attrs.get("inverse"))]
    blocks = -(-total // V)
    body = [Decl(cnt, i64, idx_min(Const(V), Bin("-", Const(total), idx_mul(Var(blk), Const(V))))),
            Scratch(buf, d, 2 * plane, code, [
                per_line(gather),
                Call(f"ts_fft_{d.short}", (Addr(buf, Const(0)), Addr(buf, Const(plane)), Const(n),
                                           Var(cnt), Const(code_kind)), f"fft:{d.short}", code),
                per_line(scatter)])]
    return [Loop(blk, blocks, "parallel" if k.knobs.get("parallel") and blocks > 1 else "serial",
                 body)]
