"""fft: a batch of discrete Fourier transforms along one axis (the dft primitives of
ops/spectral.py), with the elementwise prologue and views it gathers its lines through.
CPU: blocks of lines in parallel, one call of the FFT routine a block (routines/fft.c:
mixed-radix Stockham on two element-major planes, so its vector instructions run across the
lines; Bluestein for large prime factors, packed real transforms, cache-sized blocks of the
stages for planes beyond L2). Lines read as they lie and written where they go (a complex
array's pairs, a real line of even n) the routine reads and writes itself (lower_fft_rows; a
long complex line alone: lower_fft_pairs); lines computed on the way in (a spectral filter's
weighting) are gathered here into rows of two private planes and scattered back times the
norm's factor. A line is one fixed chain of operations whichever block or lane it is in, so
neither threads nor the batch nor the path change a bit.
GPUs: the routine's steps written in Tile IR (lower_fft_gpu), a block per line in shared
memory or its part of the workspace, or for a long line each step a launch over the whole grid.
"""
from __future__ import annotations

import functools
import math

from ... import dtypes as dt
from ...ops import registry as R
from ..emit import Emitter, Names, contiguous, idx_min, launch_of, prod, split_index
from ..groups import Group, identity_map, map_from
from ..tile_ir import (Addr, Assign, Barrier, Bin, Call, Cast, Const, Decl, If, Load, Loop, OpCall,
                       Scratch, Select, Shared, Store, ThreadIndex, Var, Workspace, idx_add,
                       idx_mul, linear)
from .base import PARALLEL_MIN_FLOPS, Strategy, register
from .routines import routine_text, specialise

ROUTINE = routine_text("fft.c")
SCRATCH = routine_text("scratch.c")
LONG_LINE = 1 << 16                 # a line this long is worth threads of its own (as the routine's
                                    # stages, TS_FFT_PARALLEL)
KIND_CODE = {("c2c", False): 0, ("c2c", True): 1, ("r2c", False): 2, ("c2r", False): 3}


class FFTStrategy(Strategy):
    name = "fft"
    routines = {"fft": "ts_fft_{S}", "fft_pairs": "ts_fft_pairs_{S}"}

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
        """Threads over blocks of lines; a single line long enough gathers, transforms and
        scatters with threads instead. Below a million FLOPs (the other strategies' bar) one
        thread: 512 lines of 64 points take 0.2 ms alone, and waking a second thread cost
        12 ms on a loaded 2-core machine."""
        domain = k.group.domain
        n = domain[k.group.root.attrs["axis"]]
        lines = prod(domain) // max(1, n)
        return {"parallel": (lines >= 2 or n >= LONG_LINE) and k.flops >= PARALLEL_MIN_FLOPS}

    def lower_cpu(self, k, code):
        return lower_fft(k, code)

    def gpu_knobs(self, k, target) -> dict:
        return {"threads": GPU_FFT_THREADS}

    def lower_gpu(self, k, code, target, knobs):
        return lower_fft_gpu(k, knobs)

    def c_routine(self, name, dtype):
        t = {"f32": "float", "f64": "double"}[dtype]
        return ["#include <stdlib.h>", specialise(SCRATCH, S=dtype, T=t),
                specialise(ROUTINE, COS_SIN=c_cos_sin(), S=dtype, T=t)]


register(FFTStrategy())


def row_stride(n: int, packed: bool) -> int:
    """A block's row for one line: the most elements the routine takes or gives for it (a
    packed real line's n/2 + 1 frequencies, else n), rounded up to 16 so rows start where a
    vector does."""
    return -(-(n // 2 + 1 if packed else n) // 16) * 16


def lanes_for(n: int, lines: int) -> int:
    """Lines transformed together (the routine's vectors run across them). A line of
    LONG_LINE points or more alone: its own stages vectorise, and a block of them would not
    stay in cache (rfft of 16 lines of 2^18: 11 ms one at a time, 28 ms in a block of 16).
    Shorter ones 16 at least (an AVX-512 vector of float32; with fewer, the first stages'
    vectors run part empty: rfft of 1024 lines of 4096 took 7.4 ms in blocks of 8 against
    4.6 ms in blocks of 16, of 128 lines of 32768 9.3 ms one at a time against 4.9 ms),
    then more while a block's two planes (2n values a line) stay within 128 KiB of float32,
    32 at most; never more than the lines need. (Zen 4, 2 threads.)"""
    if n >= LONG_LINE:
        return 1
    v = 1
    while v < lines and (v < 16 or (v < 32 and v * 2 * n <= 1 << 15)):
        v *= 2
    return v


class _Lines:
    """What both lowerings know of a transform kernel: the root, its kind and size, the lines of
    its domain (the kept axes), where element i of a line lies in the domain and in the output,
    and the prologue's value at a domain point (through the emitter)."""

    def __init__(self, k, names):
        self.k, self.names = k, names
        self.em = Emitter(k, names)
        node = self.node = k.group.root
        self.kind = node.opdef.lowering.kind
        self.inverse = bool(node.attrs.get("inverse"))
        self.axis, self.d = node.attrs["axis"], k.output.type.dtype
        self.domain = list(k.group.domain)
        self.em.loops = [[a] for a in range(len(self.domain))]    # an index per domain axis
        self.n = node.attrs["n"] if self.kind == "c2r" else self.domain[self.axis]
        self.packed = self.kind != "c2c" and self.n % 2 == 0    # a real line as n/2 complex
        self.kept = [a for a in range(len(self.domain)) if a != self.axis]
        self.extents = [self.domain[a] for a in self.kept]
        self.total = prod(self.extents)
        self.cout = contiguous(list(k.output.type.shape))
        self.bodies = []                          # (the emitter's memo keys on id(body))

    def where(self, kvars, i):
        """The domain point of element i of the line at kvars."""
        return {**dict(zip(self.kept, kvars)), self.axis: i}

    def at_out(self, kvars, i):
        """The output's index of element i of the line at kvars."""
        return idx_add(linear(kvars, [self.cout[a] for a in self.kept]),
                       idx_mul(i, Const(self.cout[self.axis])))

    def value(self, u, point):
        """(statements, expression): operand u of the transform at a domain point."""
        body = []
        self.bodies.append(body)
        m = self.k.group.maps.get(u.id) or identity_map(u.type.shape)   # (a leaf: as it is)
        return body, self.em.value(u, m, body, point)

    def scaled(self, e):
        s = self.node.attrs["scale"]
        return e if s == 1.0 else Bin("*", e, Const(s, self.d))


def two(i, o):
    """Element 2i + o (a real line's packed halves)."""
    return idx_add(idx_mul(i, Const(2)), Const(o))


def lower_fft(k, code):
    """Blocks of V lines (V: lanes_for), in parallel. Lines read in place go to lower_fft_rows
    (a long complex line alone to lower_fft_pairs); the others are each gathered into a row of
    the block's two planes (element j of lane v at v * ld + j; a real line of even n packed as
    n/2 complex values) through the group's prologue, one routine call for the block (which
    transposes the rows for its vectors and back, in place), each line scattered to the output
    times the norm's factor. Rows keep the gather and scatter contiguous: element-major planes
    written here cost twice the transform itself (rfft 4096x1024, Zen 4)."""
    names = Names()
    L = _Lines(k, names)
    node, kind, axis, d, n, packed = L.node, L.kind, L.axis, L.d, L.n, L.packed
    total, domain = L.total, L.domain
    out_shape = list(k.output.type.shape)
    if total == 0:
        return []
    V, ld = lanes_for(n, total), row_stride(n, packed)
    pairs = V == 1 and paired_lines(L)
    if pairs:
        return lower_fft_pairs(L, pairs, code)
    code_kind = KIND_CODE[kind, L.inverse]
    par = "parallel" if k.knobs.get("parallel") and -(-total // V) > 1 else "serial"
    if lines := lines_in_place(L):
        return lower_fft_rows(L, V, code_kind, lines, par, code)
    plane = V * ld
    blk, cnt, v, line, j, buf = (names(w) for w in ("blk", "count", "v", "line", "j", "planes"))
    i64 = dt.int64
    jv = Var(j)
    blocks = -(-total // V)
    # one long line: its gather and scatter in parallel too (the routine's stages are)
    jkind = "parallel" if blocks == 1 and n >= LONG_LINE and k.knobs.get("parallel") else "serial"

    def per_line(stmts_of):
        """A loop over the block's lines, each line's indices placed, around stmts_of(where,
        at_out): where(i) the domain point of the line's element i, at_out(i) the output's
        index of it."""
        kvars = split_index(Var(line), L.extents)
        where, at_out = (lambda i: L.where(kvars, i)), (lambda i: L.at_out(kvars, i))
        return Loop(v, Var(cnt), "serial", [
            Decl(line, i64, idx_add(idx_mul(Var(blk), Const(V)), Var(v))),
            *stmts_of(where, at_out)])

    def slot(part, i):                        # element i of the lane in plane part (0 re, 1 im)
        return idx_add(Const(part * plane), idx_add(idx_mul(Var(v), Const(ld)), i))

    def put(part, u, point):
        """The statements storing operand u's value at a domain point into a plane."""
        body, value = L.value(u, point)
        return body + [Store(buf, slot(part, jv), value)]

    def gather(where, at_out):
        x = node.inputs[0]
        if kind == "r2c" and packed:
            body = put(0, x, where(two(jv, 0))) + put(1, x, where(two(jv, 1)))
            return [Loop(j, n // 2, jkind, body)]
        if kind == "r2c":
            body = put(0, x, where(jv)) + [Store(buf, slot(1, jv), Const(0, d))]
            return [Loop(j, n, jkind, body)]
        return [Loop(j, domain[axis], jkind,
                     [s for p, u in enumerate(node.inputs[:2]) for s in put(p, u, where(jv))])]

    scaled = L.scaled

    def scatter(where, at_out):
        out = k.output.name
        if kind != "c2r":                         # the parts on the output's last axis of 2
            return [Loop(j, out_shape[axis], jkind,
                         [Store(out, idx_add(at_out(jv), Const(p)), scaled(Load(buf, slot(p, jv))))
                          for p in (0, 1)])]
        if packed:
            return [Loop(j, n // 2, jkind,
                         [Store(out, at_out(two(jv, p)), scaled(Load(buf, slot(p, jv))))
                          for p in (0, 1)])]
        return [Loop(j, n, jkind, [Store(out, at_out(jv), scaled(Load(buf, slot(0, jv))))])]

    rows = (Addr(buf, Const(0)), Const(ld), Const(1), Const(plane))   # (the routine in place)
    body = [Decl(cnt, i64, idx_min(Const(V), Bin("-", Const(total), idx_mul(Var(blk), Const(V))))),
            Scratch(buf, d, 2 * plane, code, [
                per_line(gather),
                Call(f"ts_fft_{d.short}", (*rows, *rows, Const(n), Var(cnt), Const(code_kind),
                                           Const(1.0, d)),
                     f"fft:{d.short}", code),
                per_line(scatter)])]
    return [Loop(blk, blocks, par, body)]


def lower_fft_rows(L, V, code_kind, lines, par, code):
    """Blocks of V lines read where they lie and written where they go (lines_in_place), one
    routine call a block: its own moves read and write the pairs (the same values as a gather
    into planes and a scatter back, so the same bits)."""
    names = Names()
    buf, offset, (sld, step, im), (dld, dstep, dim) = lines
    d, blk, cnt = L.d, names("blk"), names("count")
    first = idx_mul(Var(blk), Const(V))
    call = Call(f"ts_fft_{d.short}",
                (Addr(buf.name, idx_add(Const(offset), idx_mul(first, Const(sld)))), Const(sld),
                 Const(step), Const(im), Addr(L.k.output.name, idx_mul(first, Const(dld))),
                 Const(dld), Const(dstep), Const(dim), Const(L.n), Var(cnt), Const(code_kind),
                 Const(L.node.attrs["scale"], d)),
                f"fft:{d.short}", code)
    count = idx_min(Const(V), Bin("-", Const(L.total), first))
    return [Loop(blk, -(-L.total // V), par, [Decl(cnt, dt.int64, count), call])]


def read_in_place(L):
    """(buffer, offset, strides per domain axis) of the transform's input where it is read from
    memory as it lies (no computation on the way, a reshape renaming axes at most): a real
    line's, or a complex one's whose imaginary parts lie one element after the real parts in
    the same buffer (a complex array's pairs); else None."""
    parts = []
    for u in L.node.inputs[:1 if L.kind == "r2c" else 2]:
        m = L.k.group.maps.get(u.id) or identity_map(u.type.shape)
        while (part := L.em.leaf(u, m)) is None and u.id in L.em.inside and \
                isinstance(u.node.opdef.lowering, R.View):   # (a reshape renaming axes)
            u, m = u.node.inputs[0], map_from(u.node, m, u.node.inputs[0])
            if not isinstance(m, tuple):
                return None
        if part is None or part[0].role == "inline":
            return None
        parts.append(part)
    if len(parts) == 2:
        (b0, o0, s0), (b1, o1, s1) = parts
        if b0 is not b1 or o1 != o0 + 1 or s0 != s1:
            return None
    return parts[0]


def paired_lines(L):
    """(buffer, offset, strides per domain axis) of a complex transform's input where its lines
    are read in place as they lie, pairs (re, im) one after another along the axis as in the
    output (the parts of a complex array, no computation on the way), else None."""
    if L.kind != "c2c" or L.n != L.domain[L.axis] or not (source := read_in_place(L)):
        return None
    return source if source[2][L.axis] == 2 and L.cout[L.axis] == 2 else None


def line_spacing(L, strides):
    """The distance between consecutive lines where the lines (the kept axes, row-major) lie
    equally spaced at these strides, else None."""
    axes = [(a, e) for a, e in zip(L.kept, L.extents) if e > 1]
    for (a, _), (b, e) in zip(axes, axes[1:]):
        if strides[a] != strides[b] * e:
            return None
    return strides[axes[-1][0]] if axes else 0


def lines_in_place(L):
    """Where every line is read as it lies and written where it goes, its elements pairs (a
    complex array's parts; a real line of even n as n/2 pairs of neighbours along its axis, in
    and out) and the lines equally spaced: (buffer, offset, and the routine's addressing of the
    input and of the output, each (line spacing, element step, the imaginary part's offset)).
    The routine then moves the lines itself (rows of pairs by tiles, lines along an outer axis
    a row of lanes at a time): no planes gathered and scattered here. Else None."""
    if L.kind != "c2c" and not L.packed:          # (an odd real line is no pairs)
        return None
    if L.domain[L.axis] != (L.n // 2 + 1 if L.kind == "c2r" else L.n):
        return None                               # (cut or padded on the way in)
    if not (source := read_in_place(L)):
        return None
    buf, offset, strides = source
    if L.kind == "r2c":                           # (x_2j, x_2j+1): neighbours along the axis
        step, im = 2 * strides[L.axis], strides[L.axis]
    else:
        step, im = strides[L.axis], 1
    out = L.cout[L.axis]
    dstep, dim = (2 * out, out) if L.kind == "c2r" else (out, 1)
    sld, dld = line_spacing(L, strides), line_spacing(L, L.cout)
    if sld is None or dld is None:
        return None
    return buf, offset, (sld, step, im), (dld, dstep, dim)


def lower_fft_pairs(L, source, code):
    """Each line (long: V = 1) one call of the routine's ts_fft_pairs, from where it lies in
    the input to where it goes in the output: the gather into planes and the scatter back are
    the stages' own first and last passes (the same operations: the same bits)."""
    names = Names()
    buf, offset, strides = source
    d, line = L.d, names("line")
    kvars = split_index(Var(line), L.extents)
    at_in = idx_add(Const(offset), linear(kvars, [strides[a] for a in L.kept]))
    call = Call(f"ts_fft_pairs_{d.short}",
                (Addr(buf.name, at_in), Addr(L.k.output.name, L.at_out(kvars, Const(0))),
                 Const(L.n), Const(int(L.inverse)), Const(L.node.attrs["scale"], d)),
                f"fft_pairs:{d.short}", code)
    parallel = L.k.knobs.get("parallel") and L.total > 1
    return [Loop(line, L.total, "parallel" if parallel else "serial", [call])]


# ---- GPUs: a block per line, the Stockham stages in shared memory -----------------------------
GPU_FFT_THREADS = 256
SHARED_LIMIT = 48 * 1024            # static shared memory per block
MAX_RADIX = 31                      # the routine's TS_FFT_MAX_RADIX
WORKSPACE_BUDGET = 256 << 20        # bytes of global memory for blocks' own planes (at least
                                    # one block's): more lines than fit go round again


def radices(n: int) -> list | None:
    """The routine's factorisation of a complex transform of n points (4s, then 2s, then odd
    primes up to MAX_RADIX), or None where a larger prime factor makes it a Bluestein one."""
    out, rest = [], n
    while rest % 4 == 0:
        out.append(4)
        rest //= 4
    while rest % 2 == 0:
        out.append(2)
        rest //= 2
    f = 3
    while rest > 1 and f <= MAX_RADIX:
        while rest % f == 0:
            out.append(f)
            rest //= f
        f += 2
    return out if rest == 1 else None


# cos and sin of an angle in [0, pi/4], all the twiddles need after the octant reduction: their
# Taylor series to the 18th power (truncation under 1e-19) in double, with + and * alone. No C
# library, which differs between targets (CUDA's sin is not glibc's), and nothing a compiler may
# contract (we build with -ffp-contract=off, NVRTC with --fmad=false): the C routine, the GPU
# kernels and Python (odd radices' constants) compute the same bits. Within 0.74 ulp of the
# exact values (tests/ops/test_spectral.py checks against mpmath).
SIN_TAYLOR = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(1, 9))   # a^3 .. a^17
COS_TAYLOR = tuple((-1) ** k / math.factorial(2 * k) for k in range(2, 10))      # a^4 .. a^18


def smooth(n: int) -> int:
    """The least 2^a 3^b 5^c >= n (the routine's ts_fft_smooth: Bluestein's length)."""
    best = 1 << max(0, n - 1).bit_length()
    f5 = 1
    while f5 < 2 * n:
        f35 = f5
        while f35 < 2 * n:
            v = f35
            while v < n:
                v *= 2
            best = min(best, v)
            f35 *= 3
        f5 *= 5
    return best


def cos_sin(a, add, sub, mul, const):
    """(cos a, sin a) in any algebra: the + - * and constants given (floats, C text, Tile IR)."""
    def horner(z, coefs):
        acc = const(coefs[-1])
        for c in reversed(coefs[:-1]):
            acc = add(const(c), mul(z, acc))
        return acc
    z = mul(a, a)
    sin = add(a, mul(mul(a, z), horner(z, SIN_TAYLOR)))
    h = mul(const(0.5), z)
    w = sub(const(1.0), h)          # 1 - z/2, its rounding error added back: (1 - w) - h
    cos = add(w, add(sub(sub(const(1.0), w), h), mul(mul(z, z), horner(z, COS_TAYLOR))))
    return cos, sin


@functools.cache
def c_cos_sin() -> str:
    """cos_sin as the C routine's ts_fft_cos_sin_{S} (written out once)."""
    c, s = cos_sin("a", lambda x, y: f"({x} + {y})", lambda x, y: f"({x} - {y})",
                   lambda x, y: f"({x} * {y})", repr)
    return ("static void ts_fft_cos_sin_{S}(double a, double* c, double* s) {\n"
            f"  *c = {c};\n  *s = {s};\n}}")


def unit(j: int, N: int) -> tuple[float, float]:
    """e^{-2 pi i j / N} as the routine computes it (ts_fft_unit: the quadrant and octant from
    integers, then cos_sin of the reduced angle)."""
    r = j % N
    q, rem = divmod(4 * r, N)
    arith = (lambda x, y: x + y, lambda x, y: x - y, lambda x, y: x * y, float)
    if 2 * rem <= N:
        cs, sn = cos_sin(1.5707963267948966 * rem / N, *arith)
    else:
        sn, cs = cos_sin(1.5707963267948966 * (N - rem) / N, *arith)
    c, s = [(cs, sn), (-sn, cs), (-cs, -sn), (sn, -cs)][q]
    return c, -s


def lower_fft_gpu(k, knobs):
    """The routine's transform with the operations in the routine's order (the CPU's bits):
    the twiddle table computed as the routine computes its twiddles (cos_sin), the line
    gathered through the prologue, the Stockham stages (the same butterflies), the real
    transforms' untangling, the scatter. A prime factor above 31 makes the complex transform a
    Bluestein one, as in the routine: the chirp and the convolution kernel (an m-point
    transform of the conjugate chirp), two m-point transforms a line.

    A line of up to PHASED_POINTS points: one block per line (grid-stride over the lines), the
    table computed once per block, a barrier between steps; its planes and tables in shared
    memory where they fit, otherwise in the block's own part of the workspace. A longer line:
    each step a phase of its own over the whole grid (every line's butterflies of a stage at
    once), the planes of every line and the tables in the workspace."""
    g = _GPUFFT(k, knobs)
    return g.phases() if g.phased else (g.kernel(), g.launch)


PHASED_POINTS = 1 << 14             # a line this long spreads over the grid, a phase a step
LINE_BLOCKS = 1024                  # blocks a launch of one block per line has at most: each
                                    # computes the tables once for its lines (H200: rfft
                                    # 4096x1024 0.066 -> 0.053 ms, Bluestein 4096x1009 0.92 ->
                                    # 0.70 ms against no cap; 528 and 2048 within 5% of it)
PHASED_BUDGET = 1 << 30             # bytes of workspace the phases may take (every line's planes)


class _GPUFFT(_Lines):
    def __init__(self, k, knobs):
        super().__init__(k, Names())
        n, C, d, nm = self.n, (self.n // 2 if self.packed else self.n), self.d, self.names
        self.C = C                                         # the complex transform's points
        plan = radices(C)
        self.m = 0 if plan is not None else smooth(2 * C - 1)    # Bluestein's length (0: none)
        self.plan = plan if plan is not None else radices(self.m)
        self.N = self.m or n              # the stages' table holds N-th roots of unity
        self.threads = knobs["threads"]
        S = self.S = self.m or C + 1      # a plane's points (the real untangling adds one)
        self.planes = [(nm("ra"), nm("ia")), (nm("rb"), nm("ib"))]
        self.roots = (nm("wr"), nm("wi"))
        sizes = {b: S for pair in self.planes for b in pair}
        sizes.update(dict.fromkeys(self.roots, self.N))
        self.halfroots = self.roots       # the real untangling's n-th roots, k <= C/2
        if self.m:
            self.chirp, self.conv = (nm("cr"), nm("ci")), (nm("kr"), nm("ki"))
            sizes.update(dict.fromkeys(self.chirp, C))
            sizes.update(dict.fromkeys(self.conv, self.m))
            if self.packed:
                self.halfroots = (nm("ur"), nm("ui"))
                sizes.update(dict.fromkeys(self.halfroots, C // 2 + 1))
        self.offset = None                # phases: where the current line's planes start
        # at most LINE_BLOCKS blocks, each computing the table once for all the lines it takes
        self.launch = launch_of(min(self.total, LINE_BLOCKS), self.threads, per_block=True)
        plane_bytes = 4 * S * d.itemsize
        self.phased = S > PHASED_POINTS and self.total * plane_bytes <= PHASED_BUDGET
        if self.phased:                   # every line's planes, one after another
            sizes.update({b: S * max(1, self.total) for pair in self.planes for b in pair})
        elif sum(sizes.values()) * d.itemsize <= SHARED_LIMIT:
            self.memory = [Shared(b, d, size) for b, size in sizes.items()]
            return
        # in the workspace, each buffer at an odd int (8-byte aligned after the status word,
        # as the workspace's base is even), an even count of ints in all
        offsets, at = {}, 1
        for b, size in sizes.items():
            offsets[b] = at
            ints = -(-size * d.itemsize // 4)
            at += ints + ints % 2
        per = at + at % 2
        if self.phased:
            self.memory = [Workspace(b, d, offsets[b], size, volatile=False)
                           for b, size in sizes.items()]
            self.launch = {**launch_of(1, self.threads), "workspace": per}
            return
        blocks = max(1, min(self.launch["grid"], WORKSPACE_BUDGET // (4 * per)))
        self.memory = [Workspace(b, d, offsets[b], size, per_block=per)
                       for b, size in sizes.items()]
        self.launch = {**self.launch, "grid": blocks, "workspace": per * blocks}

    # -- expressions ------------------------------------------------------------------------------
    def c(self, v):
        return Const(v, self.d)

    def neg(self, e, d=None):
        d = d or self.d
        return OpCall("neg", "elem", (), d, d, (e,))

    @staticmethod
    def mul(a, b):
        return Bin("*", a, b)

    def cmul(self, ar, ai, br, bi):               # the routine's TS_CMUL_RE / TS_CMUL_IM
        return (Bin("-", self.mul(ar, br), self.mul(ai, bi)),
                Bin("+", self.mul(ar, bi), self.mul(ai, br)))

    def root(self, index, table=None):            # e^{-2 pi i index / N} from the table
        table = table or self.roots
        return Load(table[0], index), Load(table[1], index)

    def at(self, b, i):
        """Element i of plane b of the current line (phases: every line's planes in one)."""
        return i if self.offset is None else idx_add(self.offset, i)

    def ld(self, b, i):
        return Load(b, self.at(b, i))

    def st(self, b, i, v):
        return Store(b, self.at(b, i), v)

    def decls(self, pairs):
        """Decl a name per (label, expr); returns (statements, label -> Var)."""
        out, vars_ = [], {}
        for label, e in pairs:
            name = self.names(label)
            out.append(Decl(name, self.d, e))
            vars_[label] = Var(name)
        return out, vars_

    def threaded(self, work, make):
        """make(j) for j in [0, work), spread over the block's threads."""
        if work <= 0:
            return []
        it, j = self.names("it"), self.names("j")
        jv = Var(j)
        return [Loop(it, -(-work // self.threads), "serial", [
            Decl(j, dt.int64, idx_add(ThreadIndex(), idx_mul(Var(it), Const(self.threads)))),
            If(Bin("<", jv, Const(work)), make(jv))])]

    # -- the pieces -------------------------------------------------------------------------------
    def table(self, jv, n, dst, r=None):
        """dst[j] = e^{-2 pi i r / n} (r: j, or an index expression in [0, n)) as
        ts_fft_unit: quadrant and octant from integers, cos_sin of the reduced angle in
        double, one rounding."""
        r = jv if r is None else r
        i64, f64, nm = dt.int64, dt.float64, self.names
        q, rem, r2, a, cs, sn = (nm(x) for x in ("q", "rem", "r2", "a", "cs", "sn"))
        small = Bin("<=", idx_mul(Var(rem), Const(2)), Const(n))
        cosa, sina = cos_sin(Var(a), lambda x, y: Bin("+", x, y), lambda x, y: Bin("-", x, y),
                             self.mul, lambda c: Const(c, f64))

        def quad(*v):
            return Select(Bin("==", Var(q), Const(0)), v[0], Select(
                Bin("==", Var(q), Const(1)), v[1], Select(Bin("==", Var(q), Const(2)), v[2], v[3])))
        ng = lambda e: self.neg(e, f64)
        C_ = quad(Var(cs), ng(Var(sn)), ng(Var(cs)), Var(sn))
        S_ = quad(Var(sn), Var(cs), ng(Var(sn)), ng(Var(cs)))
        return [Decl(q, i64, Bin("/", idx_mul(r, Const(4)), Const(n))),
                Decl(rem, i64, Bin("-", idx_mul(r, Const(4)), idx_mul(Var(q), Const(n)))),
                Decl(r2, i64, Select(small, Var(rem), Bin("-", Const(n), Var(rem)))),
                Decl(a, f64, Bin("/", self.mul(Const(1.5707963267948966, f64), Cast(f64, Var(r2))),
                                 Const(float(n), f64))),
                Decl(cs, f64, Select(small, cosa, sina)),
                Decl(sn, f64, Select(small, sina, cosa)),
                Store(dst[0], jv, Cast(self.d, C_)), Store(dst[1], jv, Cast(self.d, ng(S_)))]

    def gather(self, jv):
        ra, ia = self.planes[0]
        x = self.node.inputs[0]
        if self.kind == "r2c" and self.packed:        # x_2j, x_2j+1 as one complex value
            b0, v0 = self.value(x, self.where(self.kvars, two(jv, 0)))
            b1, v1 = self.value(x, self.where(self.kvars, two(jv, 1)))
            return b0 + b1 + [self.st(ra, jv, v0), self.st(ia, jv, v1)]
        if self.kind == "r2c":
            b0, v0 = self.value(x, self.where(self.kvars, jv))
            return b0 + [self.st(ra, jv, v0), self.st(ia, jv, self.c(0.0))]
        b0, v0 = self.value(self.node.inputs[0], self.where(self.kvars, jv))
        b1, v1 = self.value(self.node.inputs[1], self.where(self.kvars, jv))
        return b0 + b1 + [self.st(ra, jv, v0),
                          self.st(ia, jv, self.neg(v1) if self.inverse else v1)]

    def untangle(self, kv, forward):
        """The routine's kind 2 after its transform (forward: X_k, X_{h-k} from Z_k, Z_{h-k})
        or its kind 3 before it (Z from X, the conjugation folded into the stores)."""
        ra, ia = self.planes[0]
        lv = Bin("-", Const(self.C), kv)
        ar, ai, br, bi = self.ld(ra, kv), self.ld(ia, kv), self.ld(ra, lv), self.ld(ia, lv)
        wre, wim = self.root(kv, self.halfroots)      # (n = 2h: the routine's rtw)
        half = (lambda e: self.mul(self.c(0.5), e)) if forward else (lambda e: e)
        out, v = self.decls([("er", half(Bin("+", ar, br))), ("ei", half(Bin("-", ai, bi))),
                             ("dr", half(Bin("-", ar, br))), ("di", half(Bin("+", ai, bi)))])
        if not forward:
            wim = self.neg(wim)                                            # W^-k
        p_ = self.cmul(wre, wim, v["dr"], v["di"])
        q_ = self.cmul(self.neg(wre), wim, self.neg(v["dr"]), v["di"])
        more, w = self.decls([("pr", p_[0]), ("pi", p_[1]), ("qr", q_[0]), ("qi", q_[1])])
        out += more
        if forward:       # e - i W^k d; for l: conj e - i (-conj W^k)(-conj d)
            k_re, k_im = Bin("+", v["er"], w["pi"]), Bin("-", v["ei"], w["pr"])
            l_re, l_im = Bin("+", v["er"], w["qi"]), Bin("-", self.neg(v["ei"]), w["qr"])
        else:             # e + i W^-k d, conjugated
            k_re, k_im = Bin("-", v["er"], w["pi"]), self.neg(Bin("+", v["ei"], w["pr"]))
            l_re = Bin("-", v["er"], w["qi"])
            l_im = self.neg(Bin("+", self.neg(v["ei"]), w["qr"]))
        return out + [self.st(ra, kv, k_re), self.st(ia, kv, k_im),
                      If(Bin("!=", lv, kv), [self.st(ra, lv, l_re), self.st(ia, lv, l_im)])]

    def butterfly(self, bv, r, m, s, src, dst, L):
        """Butterfly bv = j s + q of a stage of radix r (the routine's ts_fft_stage)."""
        nm, n = self.names, self.N
        jj, qq = nm("jj"), nm("q")
        out = [Decl(jj, dt.int64, Bin("/", bv, Const(s))), Decl(qq, dt.int64, Bin("%", bv, Const(s)))]
        J, Q = Var(jj), Var(qq)
        base = idx_add(Q, idx_mul(J, Const(s)))
        ar = [self.ld(src[0], idx_add(base, Const(u * s * m))) for u in range(r)]
        ai = [self.ld(src[1], idx_add(base, Const(u * s * m))) for u in range(r)]
        obase = idx_add(Q, idx_mul(J, Const(s * r)))

        def w(t):                                    # e^{-2 pi i j t / L}
            return self.root(idx_mul(J, Const(t * (n // L))))

        def put(t, pair):
            return [self.st(dst[0], idx_add(obase, Const(t * s)), pair[0]),
                    self.st(dst[1], idx_add(obase, Const(t * s)), pair[1])]
        B = lambda op, a, b: Bin(op, a, b)
        if r == 4:
            more, v = self.decls([
                ("t0r", B("+", ar[0], ar[2])), ("t0i", B("+", ai[0], ai[2])),
                ("t1r", B("-", ar[0], ar[2])), ("t1i", B("-", ai[0], ai[2])),
                ("t2r", B("+", ar[1], ar[3])), ("t2i", B("+", ai[1], ai[3])),
                ("t3r", B("-", ar[1], ar[3])), ("t3i", B("-", ai[1], ai[3]))])
            out += more
            more, b = self.decls([
                ("b1r", B("+", v["t1r"], v["t3i"])), ("b1i", B("-", v["t1i"], v["t3r"])),
                ("b2r", B("-", v["t0r"], v["t2r"])), ("b2i", B("-", v["t0i"], v["t2i"])),
                ("b3r", B("-", v["t1r"], v["t3i"])), ("b3i", B("+", v["t1i"], v["t3r"]))])
            out += more + put(0, (B("+", v["t0r"], v["t2r"]), B("+", v["t0i"], v["t2i"])))
            for t in (1, 2, 3):
                out += put(t, self.cmul(b[f"b{t}r"], b[f"b{t}i"], *w(t)))
            return out
        if r == 2:
            more, v = self.decls([("dr", B("-", ar[0], ar[1])), ("di", B("-", ai[0], ai[1]))])
            return out + more + put(0, (B("+", ar[0], ar[1]), B("+", ai[0], ai[1]))) + \
                put(1, self.cmul(v["dr"], v["di"], *w(1)))
        s0r, s0i = ar[0], ai[0]                      # an odd radix, over the pairs u, r - u
        for u in range(1, r // 2 + 1):
            s0r = B("+", s0r, B("+", ar[u], ar[r - u]))
            s0i = B("+", s0i, B("+", ai[u], ai[r - u]))
        out += put(0, (s0r, s0i))
        oc = [unit(u, r) for u in range(r)]          # (cos, -sin) of 2 pi u / r, in double
        for t in range(1, r // 2 + 1):
            er, ei, fr, fi = ar[0], ai[0], self.c(0.0), self.c(0.0)
            for u in range(1, r // 2 + 1):
                cu, su = oc[(u * t) % r]
                cc, ss = self.c(float(self.d.np.type(cu))), self.c(float(self.d.np.type(-su)))
                er = B("+", er, self.mul(cc, B("+", ar[u], ar[r - u])))
                ei = B("+", ei, self.mul(cc, B("+", ai[u], ai[r - u])))
                fr = B("+", fr, self.mul(ss, B("-", ar[u], ar[r - u])))
                fi = B("+", fi, self.mul(ss, B("-", ai[u], ai[r - u])))
            more, v = self.decls([("er", er), ("ei", ei), ("fr", fr), ("fi", fi)])
            out += more
            out += put(t, self.cmul(B("+", v["er"], v["fi"]), B("-", v["ei"], v["fr"]), *w(t)))
            out += put(r - t, self.cmul(B("-", v["er"], v["fi"]), B("+", v["ei"], v["fr"]),
                                        *w(r - t)))
        return out

    def scatter(self, jv, plane):
        ra, ia = plane
        at, scaled = self.at_out(self.kvars, jv), self.scaled
        out = self.k.output.name
        re_, im_ = self.ld(ra, jv), self.ld(ia, jv)
        if self.kind == "c2c":
            return [Store(out, at, scaled(re_)),
                    Store(out, idx_add(at, Const(1)), scaled(self.neg(im_) if self.inverse else im_))]
        if self.kind == "r2c":
            if not self.packed:                       # (the routine zeroes X_0's imaginary part)
                im_ = Select(Bin("==", jv, Const(0)), self.c(0.0), im_)
            return [Store(out, at, scaled(re_)), Store(out, idx_add(at, Const(1)), scaled(im_))]
        if self.packed:                               # x_2j, x_2j+1 (conjugated back)
            step = self.cout[self.axis]
            at0 = idx_add(linear(self.kvars, [self.cout[a] for a in self.kept]),
                          idx_mul(jv, Const(2 * step)))
            return [Store(out, at0, scaled(re_)),
                    Store(out, idx_add(at0, Const(step)), scaled(self.neg(im_)))]
        return [Store(out, at, scaled(re_))]

    # -- the steps: parts (work, make(j)) that need no barrier between them --------------------------
    ONE = "one"                       # a part's work: one thread's (thread 0 of the block)

    def stages(self, cur):
        """The plan's Stockham stages on the line in planes[cur]: (steps, the index of the
        planes that hold the result)."""
        steps, L, s = [], self.m or self.C, 1
        for r in self.plan:
            m = L // r
            src, dst = self.planes[cur], self.planes[1 - cur]
            steps.append([(m * s, lambda bv, r=r, m=m, s=s, src=src, dst=dst, L=L:
                           self.butterfly(bv, r, m, s, src, dst, L))])
            cur, L, s = 1 - cur, m, s * r
        return steps, cur

    def pointwise(self, work, src, dst, f):
        """A step: dst[p] = f(src[p]'s parts) for p < work (complex values as (re, im) pairs),
        each element read before it is written (src may be dst)."""
        def one(p):
            out, v = self.decls([("xr", self.ld(src[0], p)), ("xi", self.ld(src[1], p))])
            re_, im_ = f(p, v["xr"], v["xi"])
            return out + [self.st(dst[0], p, re_), self.st(dst[1], p, im_)]
        return [(work, one)]

    def bluestein_tables(self):
        """Steps: the chirp e^{-pi i k^2 / C} (k^2 mod 2C: exact in integers) and the
        convolution kernel: the m-point transform of the conjugate chirp wrapped around (zeros
        between), times 1/m in the line's precision, computed in planes[0] (a phase's: line
        0's) as the routine's plan does."""
        C, m, d = self.C, self.m, self.d
        cr, ci = self.chirp
        ra, ia = self.planes[0]
        steps = [[(C, lambda jv: self.table(jv, 2 * C, self.chirp,
                                            Bin("%", idx_mul(jv, jv), Const(2 * C))))]]

        def fill(p):
            kre, kim, back = self.names("kre"), self.names("kim"), Bin("-", Const(m), p)
            return [Decl(kre, d, self.c(0.0)), Decl(kim, d, self.c(0.0)),
                    *[If(Bin("<", at, Const(C)), [Assign(kre, Load(cr, at)),
                                                  Assign(kim, self.neg(Load(ci, at)))])
                      for at in (p, back)],
                    self.st(ra, p, Var(kre)), self.st(ia, p, Var(kim))]
        steps.append([(m, fill)])
        more, cur = self.stages(0)
        inv = self.c(float(d.np.type(1.0 / m)))
        return steps + more + [self.pointwise(m, self.planes[cur], self.conv, lambda p, xr, xi:
                                              (self.mul(xr, inv), self.mul(xi, inv)))]

    def transform(self):
        """Steps: the complex transform of the C points in planes[0], the result left there:
        the stages, or Bluestein's (times the chirp, padded with zeros to m; the m-point
        transform; times the kernel, conjugated; the transform again, which is the inverse of
        the conjugate; conjugated and times the chirp), each step as the routine's."""
        if not self.m:
            steps, cur = self.stages(0)
        else:
            chirp = lambda p: (Load(self.chirp[0], p), Load(self.chirp[1], p))
            first = self.planes[0]
            steps = [[(self.m - self.C, lambda j: [
                self.st(b, idx_add(j, Const(self.C)), self.c(0.0)) for b in first])] +
                self.pointwise(self.C, first, first,
                               lambda p, xr, xi: self.cmul(xr, xi, *chirp(p)))]
            more, cur = self.stages(0)
            steps += more

            def by_kernel(p, xr, xi):
                re_, im_ = self.cmul(xr, xi, Load(self.conv[0], p), Load(self.conv[1], p))
                return re_, self.neg(im_)
            steps.append(self.pointwise(self.m, self.planes[cur], self.planes[cur], by_kernel))
            more, cur = self.stages(cur)
            steps += more + [self.pointwise(self.C, self.planes[cur], first, lambda p, xr, xi:
                                            self.cmul(xr, self.neg(xi), *chirp(p)))]
            cur = 0
        if cur:                                      # the untangling works in the first planes
            steps.append([(self.C, lambda jv: [
                self.st(self.planes[0][0], jv, self.ld(self.planes[1][0], jv)),
                self.st(self.planes[0][1], jv, self.ld(self.planes[1][1], jv))])])
        return steps

    def line_steps(self):
        """The steps of one line: gather, the real inverse's preparation, the transform, the
        real forward's untangling, the scatter."""
        n, C = self.n, self.C
        ra, ia = self.planes[0]
        steps = [[(self.domain[self.axis] if self.kind != "r2c" else C, self.gather)]]
        if self.kind == "c2r" and self.packed:       # X_0 and X_h's real parts into Z_0
            def ends(_):
                x0, xh = self.names("x0"), self.names("xh")
                return [Decl(x0, self.d, self.ld(ra, Const(0))),
                        Decl(xh, self.d, self.ld(ra, Const(C))),
                        self.st(ra, Const(0), Bin("+", Var(x0), Var(xh))),
                        self.st(ia, Const(0), self.neg(Bin("-", Var(x0), Var(xh))))]
            steps.append([(self.ONE, ends),
                          (C // 2, lambda jv: self.untangle(idx_add(jv, Const(1)), False))])
        elif self.kind == "c2r":                     # the Hermitian line, conjugated
            def fill(jv):
                kv, imk = idx_add(jv, Const(1)), self.names("imk")
                mirror = Bin("-", Const(n), kv)
                return [Decl(imk, self.d, self.ld(ia, kv)), self.st(ra, mirror, self.ld(ra, kv)),
                        self.st(ia, mirror, Var(imk)), self.st(ia, kv, self.neg(Var(imk)))]
            steps.append([(self.ONE, lambda _: [self.st(ia, Const(0), self.neg(self.c(0.0)))]),
                          (n // 2, fill)])
        steps += self.transform()
        if self.kind == "r2c" and self.packed:
            def ends(_):
                z0r, z0i = self.names("z0r"), self.names("z0i")
                return [Decl(z0r, self.d, self.ld(ra, Const(0))),
                        Decl(z0i, self.d, self.ld(ia, Const(0))),
                        self.st(ra, Const(0), Bin("+", Var(z0r), Var(z0i))),
                        self.st(ia, Const(0), self.c(0.0)),
                        self.st(ra, Const(C), Bin("-", Var(z0r), Var(z0i))),
                        self.st(ia, Const(C), self.c(0.0))]
            steps.append([(self.ONE, ends),
                          (C // 2, lambda jv: self.untangle(idx_add(jv, Const(1)), True))])
        out_len = n // 2 + 1 if self.kind == "r2c" else C
        steps.append([(out_len, lambda jv: self.scatter(jv, self.planes[0]))])
        return steps

    def table_steps(self):
        """The steps before any line: the roots of unity, the real untangling's, Bluestein's
        chirp and kernel."""
        steps = [[(self.N, lambda jv: self.table(jv, self.N, self.roots))] +
                 ([(self.C // 2 + 1, lambda jv: self.table(jv, self.n, self.halfroots))]
                  if self.halfroots != self.roots else [])]
        return steps + (self.bluestein_tables() if self.m else [])

    # -- one block a line -------------------------------------------------------------------------
    def block_step(self, parts):
        out = []
        for work, make in parts:
            out += [If(Bin("==", ThreadIndex(), Const(0)), make(None))] if work == self.ONE \
                else self.threaded(work, make)
        return out + [Barrier()]

    def kernel(self):
        line = self.names("line")
        self.kvars = split_index(Var(line), self.extents)
        body = [s for step in self.line_steps() for s in self.block_step(step)]
        tables = [s for step in self.table_steps() for s in self.block_step(step)]
        return [*self.memory, *tables, Loop(line, self.total, "block", body)]

    # -- phases over the grid -----------------------------------------------------------------------
    def phases(self):
        """Each step a launch over the grid: a table's entries, or every line's elements (line
        g / work, element g % work, the line's planes at line * S)."""
        out = []
        for lines, lined, steps in ((1, False, self.table_steps()),
                                    (self.total, True, self.line_steps())):
            for step in steps:
                for work, make in step:
                    work = 1 if work == self.ONE else work
                    if work > 0:
                        out.append(self.phase(lines, work, make, lined))
        return out

    def phase(self, lines, work, make, lined):
        g, line, j = self.names("g"), self.names("line"), self.names("j")
        body = [Decl(line, dt.int64, Bin("/", Var(g), Const(work))),
                Decl(j, dt.int64, Bin("%", Var(g), Const(work)))]
        self.kvars = split_index(Var(line), self.extents)
        self.offset = idx_mul(Var(line), Const(self.S)) if lined else None
        body += make(Var(j))
        self.offset = None
        launch = {**launch_of(lines * work, self.threads), "workspace": self.launch["workspace"]}
        return [*self.memory, Loop(g, lines * work, "grid", body)], launch
