"""fft: a batch of discrete Fourier transforms along one axis (the dft primitives of
ops/spectral.py), alone. CPU: the lines in parallel, each gathered into a private buffer
(interleaved complex, 2n + 2 elements), transformed in place by the FFT routine
(routines/fft.c: mixed-radix Stockham, Bluestein for large prime factors, packed real
transforms) and scattered to the output, times the norm's factor. A line is one fixed chain
of operations, so neither threads nor the batch change a bit.
"""
from __future__ import annotations

import math

from ...errors import BackendUnavailableError
from ...ops import registry as R
from ..emit import Names, coalesce, contiguous, finish, nest, read
from ..tile_ir import Addr, Bin, Call, Const, Load, Loop, Scratch, Store, Var, idx_add, idx_mul, \
    linear
from .base import PARALLEL_MIN_ELEMENTS, Strategy, register
from .routines import routine_text, specialise

ROUTINE = routine_text("fft.c")
SCRATCH = routine_text("scratch.c")
KIND_CODE = {("c2c", False): 0, ("c2c", True): 1, ("r2c", False): 2, ("c2r", False): 3}


class FFT(Strategy):
    name = "fft"
    grows = False
    routines = {"fft": "ts_fft_{S}"}

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Spectral)

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


def lower_fft(k, code):
    names = Names()
    kind = R.get(k.op).lowering.kind
    axis, d = k.attrs["axis"], k.output.type.dtype
    x = k.inputs[0]
    in_shape, out_shape = list(x.type.shape), list(k.output.type.shape)
    n = k.attrs["n"] if kind == "c2r" else in_shape[axis]
    pairs_out = kind != "c2r"                       # the result's parts on a last axis of 2
    kept = [a for a in range(len(in_shape)) if a != axis]
    cin, cout = contiguous(in_shape), contiguous(out_shape)
    lines, (line_in, line_out) = coalesce([in_shape[a] for a in kept],
                                          [[cin[a] for a in kept], [cout[a] for a in kept]])
    outer, inner, kvars = nest(lines, names, k.knobs.get("parallel"), False)
    buf, j = names("line"), names("j")
    at_in = lambda i: idx_add(linear(kvars, line_in), idx_mul(i, Const(cin[axis])))
    at_out = lambda i: idx_add(linear(kvars, line_out), idx_mul(i, Const(cout[axis])))
    two = lambda i, part: idx_add(idx_mul(i, Const(2)), Const(part))
    jv = Var(j)
    if kind == "r2c":
        load = [Store(buf, jv, read(x, at_in(jv)))]
    else:                                           # the parts, interleaved
        load = [Store(buf, two(jv, p), read(v, at_in(jv))) for p, v in enumerate(k.inputs[:2])]
    s = k.attrs["scale"]
    scaled = (lambda e: e) if s == 1.0 else (lambda e: Bin("*", e, Const(s, d)))
    if pairs_out:
        store = [Store(k.output.name, idx_add(at_out(jv), Const(p)),
                       scaled(Load(buf, two(jv, p)))) for p in (0, 1)]
    else:
        store = [Store(k.output.name, at_out(jv), scaled(Load(buf, jv)))]
    code_kind = KIND_CODE[kind, bool(k.attrs.get("inverse"))]
    body = [Loop(j, in_shape[axis], "serial", load),
            Call(f"ts_fft_{d.short}", (Addr(buf, Const(0)), Const(n), Const(code_kind)),
                 f"fft:{d.short}", code),
            Loop(j, out_shape[axis], "serial", store)]
    return finish(k, inner, outer, [Scratch(buf, d, 2 * n + 2, code, body)])
