"""tile: the strategy lowering a user's tile kernel (`@ts.kernel`) to Tile IR, alone. It is
registered with the compiler's strategies from here, beside the kernel language it reads (as a
strategy from outside the compiler would be: tests/compiler/test_strategies.py), when
function.py, which makes tile_program nodes, is imported.

One program per block of the output. Every tile is a buffer of its static shape (the knobs'
sizes): a local array on the CPU (the heap past LOCAL_MAX_BYTES), a shared array on GPUs;
an elementwise value is computed where it is used unless it reads a tile updated in place or
is costly and used twice (then kept in a tile: on the CPU made in the loop of a reduction
along its rows right after it, `e = exp(x - m); tile.sum(e)` one pass).
A load fills its tile from the tensor over the valid part of the block (the rest `other`); a
reduction runs over the valid part of its axis, in index order; `mma` is one FMA chain per
element over k in index order (so `acc += mma(a, b)` over a range_k loop gives op.matmul's bits);
a store writes the valid part of the output block.
CPU: the programs in parallel, each tile loop serial with its innermost axis vectorised. GPU: a
block per program, each tile loop over the block's threads with a barrier after it; the same
chains in the same order, so the same bits as the CPU.
Each statement class of the body (tessera/kernel/ir.py) has its method in _Lower (LOWER_STMT).
"""
from __future__ import annotations

from .. import dtypes as dt
from ..compiler.emit import (Names, attrs_key, contiguous, idx_min, launch_of, prod, read,
                             split_index)
from ..compiler.strategies import Strategy, register
from ..compiler.strategies.routines import gpu_gemm
from ..compiler.strategies.row import EXPENSIVE_FLOPS
from ..compiler.tile_ir import (Addr, Assign, AtomicAdd, Barrier, Bin, Call, Cast, CheckIndex,
                                Const, Decl, If, Load, Local, Loop, OpCall, Scratch, Select,
                                Shared, Store, Var, idx_add, idx_mul, linear)
from ..errors import BackendUnavailableError, TesseraError
from ..ops import registry as R
from ..runtime import targets
from . import ir as kir

KNOB_OF = {"BM": "tile_m", "BN": "tile_n", "BK": "tile_k"}
CPU_BLOCK = {"tile_m": 64, "tile_n": 64, "tile_k": 64}
CPU_MMA_BLOCK = {"tile_m": 128, "tile_n": 128}
GPU_BLOCK = {"tile_m": 32, "tile_n": 32, "tile_k": 32}
GPU_MMA_BLOCK = {"tile_m": 64, "tile_n": 64, "tile_k": 16}    # the SIMT GEMM routine's 16 per
                                                              # thread, 33 KiB of shared memory
LOCAL_MAX_BYTES = 1 << 16       # a CPU tile kept on the stack (larger ones: the heap)
ROW_ELEMENTS = 1 << 14          # a direct use's block: BM rows of at most this many elements
GPU_ROW_ELEMENTS = 1 << 11      # (on GPUs, where the block's tiles share 48 KiB)
GPU_SHARED_MAX = 48 * 1024      # static shared memory of a block
MMA_ROWS, MMA_WIDTH = 4, 64    # a CPU mma's register block: 4 rows of 64 bytes
LANES = {4: 16, 8: 8}           # a reduction's accumulators by element size: the row strategy's
MAX_STAGES = 4                  # a pipelined range_k loop's buffers per partition (GPUs)


def _divmod(n, lanes):
    """(n // lanes, n % lanes) of an index Expr."""
    if isinstance(n, Const):
        return Const(n.value // lanes), Const(n.value % lanes)
    return Bin("/", n, Const(lanes)), Bin("%", n, Const(lanes))


def _below_zero(off, nonneg):
    """How far an offset lies below 0 (0 when it does not): where a tile enters the tensor.
    `nonneg`: the index variables known to be at least 0 (program ids, loops from 0 up)."""
    if isinstance(off, Const):
        return Const(max(0, -off.value))
    if _at_least_zero(off, nonneg):
        return Const(0)
    return Select(Bin("<", off, Const(0)), Bin("-", Const(0), off), Const(0))


def _at_least_zero(e, nonneg) -> bool:
    if isinstance(e, Const):
        return e.value >= 0
    if isinstance(e, Var):
        return e.name in nonneg
    return isinstance(e, Bin) and e.op in ("+", "*", "/", "%") and \
        _at_least_zero(e.a, nonneg) and _at_least_zero(e.b, nonneg)


def _flat(offs, idx, strides):
    """The flat index of tile index idx of a tile at offs in a tensor of these strides."""
    g = Const(0)
    for o, i, st in zip(offs, idx, strides):
        g = idx_add(g, idx_mul(idx_add(o, i), Const(st)))
    return g


def _least(a, b):
    if a == b:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(min(a.value, b.value))
    return idx_min(a, b)


def _span(lo, hi):
    """hi - lo, at least 0."""
    if lo == Const(0):
        return hi
    if isinstance(lo, Const) and isinstance(hi, Const):
        return Const(max(0, hi.value - lo.value))
    d = Bin("-", hi, lo)
    return Select(Bin("<", d, Const(0)), Const(0), d)


def _is(e, op, *args) -> bool:
    """Is e (a tile program's index expression) this one?"""
    return e.op == op and tuple(e.args) == args


def _body(k):
    return k.attrs["kernel"]


def _used(k):
    return [KNOB_OF[n] for n in _body(k).knobs if n in KNOB_OF]


class TileKernelStrategy(Strategy):
    """A user's `@ts.kernel` (the strategy's name, `tile`, is in schedules and tuning keys)."""
    name = "tile"
    grows = False
    fuses_views = False
    knobs = ("tile_m", "tile_n", "tile_k")
    aliases = {"BM": "tile_m", "BN": "tile_n", "BK": "tile_k"}

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.UserTileKernel)

    def absorb(self, grp, p, m, users) -> bool:
        return False

    def node_flops(self, n) -> int:
        body = n.attrs["kernel"]
        dims = body.sizes([v.type for v in n.inputs])
        return _Sizes(body, dims, {**CPU_BLOCK}).flops()

    def _defaults(self, k, block, row_elements=ROW_ELEMENTS):
        body = _body(k)
        dims = body.sizes([b.type for b in _operands(k)])
        out = {}
        for name in _used(k):
            out[name] = block[name]
        # a direct use's block: BM rows, the rest of each row whole
        row = max((prod(b.type.shape[1:]) for b in _operands(k) if len(b.type.shape) > 1),
                  default=1)
        if "tile_m" in out and not _has_mma(body):
            out["tile_m"] = max(1, min(out["tile_m"], row_elements // max(1, row)))
        programs = _Sizes(body, dims, out).programs()
        return out, programs

    def cpu_knobs(self, k) -> dict:
        knobs, programs = self._defaults(k, CPU_BLOCK)
        if _has_mma(_body(k)):
            # larger output blocks amortise the packing of the GEMM routine's operands, where
            # there are still blocks for every thread
            big, n = self._defaults(k, {**CPU_BLOCK, **CPU_MMA_BLOCK})
            if n >= 4:
                knobs, programs = big, n
        return {"parallel": programs >= 2, **knobs}

    def gpu_knobs(self, k, target) -> dict:
        mma = _has_mma(_body(k))
        knobs, _ = self._defaults(k, {**GPU_BLOCK, **(GPU_MMA_BLOCK if mma else {})},
                                  GPU_ROW_ELEMENTS)
        return {"threads": 256, **knobs}

    def user_knobs(self, schedule) -> dict:
        out = super().user_knobs(schedule)
        if schedule.block is not None:
            out.update(zip(("tile_m", "tile_n", "tile_k"), schedule.block))
        if schedule.stages is not None:            # ctx.stages (pipelined loops on GPUs)
            out["stages"] = schedule.stages
        return out

    def space(self, k) -> dict:
        return {name: [16, 32, 64, 128] for name in _used(k)}

    def invalid(self, k, knobs) -> str | None:
        body = _body(k)
        dims = body.sizes([b.type for b in _operands(k)])
        n = _Sizes(body, dims, knobs).largest_tile()
        if n > (1 << 22):
            return f"a tile of {n} elements"
        return None

    def lower_cpu(self, k, code):
        lw = _Lower(k, code, None)
        return lw.keep_output() + lw.program()

    def lower_gpu(self, k, code, target, knobs):
        lw = _Lower(k, code, knobs, target)
        keep, stmts = lw.keep_output(), lw.program()
        main = stmts, launch_of(lw.programs, knobs["threads"], per_block=True)
        if not keep:
            return main
        # the copy is done, across the whole grid, before any program writes
        return [(keep, launch_of(max(1, k.output.type.numel()), knobs["threads"])), main]


register(TileKernelStrategy())


def _operands(k):
    """The kernel's operand buffers, one per parameter of the tile kernel, in order."""
    return [k.reads[v.id] for v in k.group.root.inputs]


def _has_mma(body) -> bool:
    return any(isinstance(s, kir.MmaStmt) for s in kir.walk(body.stmts))


class _Sizes:
    """Sizes of a body at concrete dimensions and knobs."""

    def __init__(self, body, dims, knobs):
        self.body, self.dims, self.knobs = body, dims, knobs

    def size(self, s) -> int:
        if s.op == "const":
            return s.args[0]
        if s.op == "knob":
            return self.knobs.get(KNOB_OF.get(s.args[0], s.args[0]), 1)
        if s.op == "dim":
            return self.dims[s.args[0]]
        raise ValueError(s)

    def grid(self) -> list:
        return [1 if b is None else -(-self.dims[d] // self.size(b)) for d, b in self.body.grid]

    def programs(self) -> int:
        return prod(self.grid())

    def shape(self, v) -> list:
        return [self.size(s) for s in v.shape]

    def largest_tile(self) -> int:
        return max((prod(self.shape(s.out)) for s in kir.walk(self.body.stmts)
                    if s.out is not None), default=1)

    def trips(self, loop) -> int:
        start, stop, step = (self._eval(a) for a in (loop.start, loop.stop, loop.step))
        return max(0, -(-(stop - start) // step)) if start is not None and stop is not None \
            else 1

    def _eval(self, e):
        if e.op in ("const", "knob", "dim"):
            return self.size(e)
        if e.op in ("+", "-", "*", "//", "%"):
            a, b = self._eval(e.args[0]), self._eval(e.args[1])
            if a is None or b is None:
                return None
            return {"+": a + b, "-": a - b, "*": a * b, "//": a // max(b, 1),
                    "%": a % max(b, 1)}[e.op]
        return None

    def flops(self) -> int:
        def count(stmts, times):
            n = 0
            for s in stmts:
                if isinstance(s, kir.LoopStmt):
                    n += count(s.body, times * self.trips(s))
                elif isinstance(s, kir.MmaStmt):
                    n += times * 2 * prod(self.shape(s.out)) * self.size(s.a.shape[1])
                elif isinstance(s, kir.ElemStmt):
                    n += times * prod(self.shape(s.out))
                elif isinstance(s, kir.ReduceStmt):
                    n += times * prod(self.shape(s.x))
            return n
        return self.programs() * count(self.body.stmts, 1)


class _Lower:
    """A body's Tile IR: `knobs` None for the CPU, a GPU kernel's knobs otherwise."""

    def __init__(self, k, code, gpu_knobs, target="cpu"):
        self.k, self.code, self.gpu = k, code, gpu_knobs is not None
        self.target, self.gpu_knobs = target, gpu_knobs
        # the GPU routines are written per language (a registered target names its own)
        self.language = targets.of(target).language if self.gpu else "c"
        self.routine_shared = 0    # GPU: static shared bytes of the routines the kernel calls
        self.body = _body(k)
        ops = _operands(k)
        self.bufs = {p.name: b for p, b in zip(self.body.params, ops)}
        self.dims = self.body.sizes([b.type for b in ops])
        self.sz = _Sizes(self.body, self.dims, k.knobs)
        self.names = Names()
        self.tiles = {}            # value id -> (buffer name, static shape)
        self.views = {}            # value id -> (buffer, its index at a tile index): read in place
        self.inline = {}           # value id -> the elem statement computing it where used
        self.valid = {}            # value id -> per axis, the valid extent (index Expr)
        self.streams = {}          # value id -> its load statement
        self.shared = []           # GPU: the block's shared arrays
        self.pid = {}              # output dimension -> (program index Var, block size)
        self.vars = {}             # loop variable name -> Var
        self.ring = {}             # GPU: a pipelined partition's id -> (ring buffer, shape, size)
        self.base = {}             # value id -> the offset of its current slot in its buffer
        self.nonneg = set()        # index variables known to be at least 0
        self.programs = self.sz.programs()
        self.materialised = self._materialised()

    # -- helpers ---------------------------------------------------------------------------------
    def _materialised(self) -> set:
        """Ids of the elementwise values computed where they are made (into a tile) rather than
        where they are used: those reading (through other elementwise values) a tile updated in
        place, and costly ones (exp, tanh, ...) used more than once."""
        out, reads_updated, cost = set(), set(self.body.updated), {}
        for s in kir.walk(self.body.stmts):
            if not isinstance(s, kir.ElemStmt):
                continue
            ins = [a.id for a in s.args if hasattr(a, "id")]
            cost[s.out.id] = R.get(s.op).lowering.flops + sum(
                cost.get(i, 0) for i in ins if i not in out)
            if any(i in reads_updated for i in ins) or s.out.id in self.body.updated:
                reads_updated.add(s.out.id)
                out.add(s.out.id)
            elif self.body.uses.get(s.out.id, 0) > 1 and cost[s.out.id] >= EXPENSIVE_FLOPS:
                out.add(s.out.id)
        return out

    def size(self, s) -> int:
        return self.sz.size(s)

    def ix(self, e):
        """An index expression of the body as Tile IR."""
        if e.op in ("const", "knob", "dim"):
            return Const(self.size(e))
        if e.op == "var":
            return self.vars[e.args[0]]
        if e.op == "pid":
            axis = e.args[0]
            return self._pid_of_axis(axis)
        if e.op == "nprog":
            g = self.sz.grid()
            return Const(g[e.args[0]] if e.args[0] < len(g) else 1)
        a, b = self.ix(e.args[0]), self.ix(e.args[1])
        if e.op == "+":
            return idx_add(a, b)
        if e.op == "*":
            return idx_mul(a, b)
        return Bin({"-": "-", "//": "/", "%": "%"}[e.op], a, b)

    def _pid_of_axis(self, axis):
        d = self.body.grid[axis][0] if axis < len(self.body.grid) else None
        return self.pid[d][0] if d in self.pid else Const(0)

    def tile(self, v, stmts) -> str:
        """Declare v's buffer; returns its name (the statements after it go into `stmts`, which
        may become the body of a heap scratch)."""
        shape = self.sz.shape(v)
        n = prod(shape)
        name = self.names("tl")
        if self.gpu:
            self.shared.append(Shared(name, v.dtype, max(1, n)))
        elif n * v.dtype.itemsize <= LOCAL_MAX_BYTES:
            stmts.append(Local(name, v.dtype, max(1, n)))
        else:
            sc = Scratch(name, v.dtype, n, self.code, [])
            stmts.append(sc)
            self._into = sc.body
        self.tiles[v.id] = (name, shape)
        return name

    def at(self, v, idx) -> object:
        """v's element at tile index idx (one Expr per axis of v)."""
        if v.id in self.tiles:
            name, shape = self.tiles[v.id]
            idx = [Const(0) if n == 1 else i for i, n in zip(idx, shape)]
            at = linear(idx, contiguous(shape))
            return Load(name, idx_add(self.base[v.id], at) if v.id in self.base else at)
        if v.id in self.views:
            b, where = self.views[v.id]
            idx = [Const(0) if n == 1 else i for i, n in zip(idx, self.sz.shape(v))]
            e = read(b, where(idx))
            return e if b.type.dtype == v.dtype else Cast(v.dtype, e)
        s = self.inline[v.id]
        return self._elem_expr(s, idx)

    def _elem_expr(self, s, idx):
        rank = len(s.out.shape)
        operand = s.operand
        args = []
        for a, d in zip(s.args, operand):
            if hasattr(a, "shape"):
                e = self.at(a, idx[rank - len(a.shape):])
                if a.dtype != d:
                    e = Cast(d, e)
            else:
                e = Const(a, d)
            args.append(e)
        return OpCall(s.op, "elem", attrs_key(s.extra), operand[-1], s.out.dtype,
                      tuple(args))

    def valid_of(self, v):
        return self.valid.get(v.id) or [Const(n) for n in self.sz.shape(v)]

    def _cpu_loops(self, extents, body_fn, stmts, vector=True):
        """CPU loops over `extents` (index Exprs), nested, the innermost vectorised, with
        body_fn(idx)'s statements innermost."""
        idx, inner = [], stmts
        for i, e in enumerate(extents):
            v = self.names("i")
            kind = "vector" if vector and i == len(extents) - 1 else "serial"
            lp = Loop(v, e.value if isinstance(e, Const) else e, kind)
            inner.append(lp)
            inner = lp.body
            idx.append(Var(v))
        inner.extend(body_fn(idx))

    def each(self, shape, extents, body_fn, stmts, vector=True):
        """body_fn(idx) for every tile index below `extents` (valid parts, index Exprs) of a
        tile of static `shape`: CPU loops, or the block's threads over the tile's elements
        (guarded by the extents) and a barrier after them."""
        if not self.gpu:
            return self._cpu_loops(extents, body_fn, stmts, vector)
        if prod(shape) == 0:
            return
        g = self.names("e")
        idx = split_index(Var(g), list(shape)) if shape else []
        cond = None
        for i, (e, n) in enumerate(zip(extents, shape)):
            if isinstance(e, Const) and e.value >= n:
                continue
            c = Bin("<", idx[i], e)
            cond = c if cond is None else Bin("&&", cond, c)
        inner = body_fn(idx)
        stmts.append(Loop(g, prod(shape), "thread",
                          inner if cond is None else [If(cond, inner)]))
        stmts.append(Barrier())

    # -- the program -----------------------------------------------------------------------------
    def keep_output(self) -> list:
        """A store at explicit offsets may leave parts of the output to no program, and atomic
        adds start from the caller's values: those are copied into the output first (a grid
        loop on GPUs)."""
        out = self.body.output
        if isinstance(out, kir.ReturnStmt) or \
                isinstance(out, kir.StoreStmt) and out.offsets is None:
            return []
        src = self.bufs[out.param]
        i = self.names("i")
        n = self.k.output.type.numel()
        kind = "grid" if self.gpu else "parallel+vector"
        return [Loop(i, n, kind, [Store(self.k.output.name, Var(i), read(src, Var(i)))])]

    def program(self):
        body, names = self.body, self.names
        grid = self.sz.grid()
        p = names("prog")
        inner = []
        gidx = split_index(Var(p), grid) if grid else []
        for (d, b), e, n in zip(body.grid, gidx, grid):
            if b is None:
                continue
            v = names("pid")
            self.nonneg.add(v)
            inner.append(Decl(v, dt.int64, e if n > 1 else Const(0)))
            self.pid[d] = (Var(v), self.size(b))
        self._into = inner
        self.emit(body.stmts)
        kind = "block" if self.gpu else ("parallel" if self.k.knobs.get("parallel") else "serial")
        if self.gpu:
            total = sum(s.size * s.dtype.itemsize for s in self.shared) + self.routine_shared
            if total > GPU_SHARED_MAX:
                raise BackendUnavailableError(
                    f"tile kernel {body.name}: its tiles take {total} bytes of shared memory, "
                    f"over a block's {GPU_SHARED_MAX}",
                    hint="smaller blocks: a Schedule or the autotuner's BM/BN/BK")
            return self.shared + [Loop(p, self.programs, kind, inner)]
        return [Loop(p, self.programs, kind, inner)]

    def emit(self, stmts):
        i = 0
        while i < len(stmts):
            s = stmts[i]
            if isinstance(s, kir.LoopStmt) and self._gemm_loop(s):
                i += 1
                continue
            nxt = stmts[i + 1] if i + 1 < len(stmts) else None
            if isinstance(s, kir.MmaStmt) and isinstance(nxt, kir.UpdateStmt) and \
                    nxt.value is s.out and nxt.op == "add" and \
                    nxt.target not in s.reads() and \
                    self.body.uses.get(s.out.id, 0) == 1:
                self.mma(s, into=nxt.target)         # acc += mma(a, b): one chain into acc
                i += 2
                continue
            if self._made_while_reduced(s, nxt):
                self.s_elem(s, fill=False)           # e = f(x); tile.sum(e): one pass
                self.s_reduce(nxt, made=s)
                i += 2
                continue
            LOWER_STMT[type(s)](self, s)
            i += 1

    def _made_while_reduced(self, s, nxt) -> bool:
        """Whether materialised elementwise tile s can be written by the loop of the reduction
        after it (CPU): a reduction along the innermost axis (its vector loop runs along the
        tile's rows) over every element of the tile, so each is computed once as before and
        reduced while in a register rather than read back."""
        if self.gpu or not isinstance(s, kir.ElemStmt) or s.out.id not in self.materialised or \
                not isinstance(nxt, kir.ReduceStmt) or nxt.x is not s.out or \
                nxt.axis != len(s.out.shape) - 1:
            return False
        n = self._elem_valid(s)[nxt.axis]
        return isinstance(n, Const) and n.value == self.sz.shape(s.out)[nxt.axis]

    # -- statements ------------------------------------------------------------------------------
    def _placement(self, st, k_var=None):
        """Per axis of a load's tile: (offset in the tensor, the tile's first and end index
        inside the tensor, the valid extent reductions and mma run over). An explicit
        `offset=` gives the whole tile as valid (what lies outside the tensor is `other`, as
        Triton's masked loads); the grid's and a stream's blocks end at the tensor's edge."""
        v, p = st.out, self.body.param(st.param)
        ext = self.bufs[p.name].type.shape
        out = []
        for i, (place, d, s) in enumerate(zip(st.place, p.dims, v.shape)):
            n, E = self.size(s), ext[i]
            if place == "whole":
                out.append((Const(0), Const(0), Const(E), Const(E)))
                continue
            if place == "grid":
                pid, b = self.pid[d]
                off = idx_mul(pid, Const(b))
                hi = self._clip(off, n, E, exact=E % n == 0)
                out.append((off, Const(0), hi, hi))
                continue
            off = k_var if place == "stream" else self.ix(st.offsets[i])
            hi = self._clip(off, n, E)
            valid = hi if place == "stream" else Const(n)
            out.append((off, _below_zero(off, self.nonneg), hi, valid))
        return [list(x) for x in zip(*out)] if out else [[], [], [], []]

    @staticmethod
    def _clip(off, n, E, exact=False):
        """min(n, E - off), at least 0."""
        if exact:
            return Const(n)
        if isinstance(off, Const):
            return Const(max(0, min(n, E - off.value)))
        rest = Bin("-", Const(E), off)
        m = idx_min(rest, Const(n))
        return Select(Bin("<", m, Const(0)), Const(0), m)

    def s_load(self, st):
        if st.streamed:
            self.streams[st.out.id] = st
            return
        self._fill(st.out, st.param, *self._placement(st), st.other)

    def s_part(self, st):
        src = self.streams[st.stream.id]
        if st.out.id in self.ring:      # pipelined: already filled; its slot and valid part
            self.valid[st.out.id] = self._placement(src, self.ix(st.k))[3]
            return
        self._fill(st.out, src.param, *self._placement(src, self.ix(st.k)), src.other,
                   stream=True)

    def _fill(self, v, param, offs, los, his, valid, other, stream=False):
        """v's tile: the tensor's elements at offs + [lo, hi) per axis, `other` elsewhere."""
        shape = self.sz.shape(v)
        self.valid[v.id] = valid
        b = self.bufs[param]
        strides = contiguous(b.type.shape)

        def where(idx):
            return _flat(offs, idx, strides)
        inside = all(lo == Const(0) and isinstance(hi, Const) and hi.value >= n
                     for lo, hi, n in zip(los, his, shape))
        if inside and not stream and not self.gpu and v.id not in self.body.updated:
            # on the CPU a whole block inside the tensor is read in place (no copy); a stream's
            # blocks are copied, packed for the FMA loops
            self.views[v.id] = (b, where)
            return
        stmts = self._into
        name = self.tile(v, stmts)
        stmts = self._into
        if not inside:
            self.each(shape, [Const(n) for n in shape],
                      lambda idx: [Store(name, linear(idx, contiguous(shape)),
                                         Const(other, v.dtype))], stmts)

        def body(idx):
            idx = [idx_add(lo, i) for lo, i in zip(los, idx)]
            e = read(b, where(idx))
            if b.type.dtype != v.dtype:
                e = Cast(v.dtype, e)
            return [Store(name, linear(idx, contiguous(shape)), e)]
        self.each(shape, [_span(lo, hi) for lo, hi in zip(los, his)], body, stmts)

    def s_full(self, st):
        v = st.out
        name = self.tile(v, self._into)
        shape = self.sz.shape(v)
        self.each(shape, [Const(n) for n in shape],
                  lambda idx: [Store(name, linear(idx, contiguous(shape)),
                                     Const(st.value, v.dtype))], self._into)

    def s_elem(self, st, fill=True):
        v = st.out
        self.valid[v.id] = self._elem_valid(st)
        if v.id not in self.materialised:
            self.inline[v.id] = st
            return
        name = self.tile(v, self._into)
        if not fill:
            return
        shape = self.sz.shape(v)
        self.each(shape, [Const(n) for n in shape],
                  lambda idx: [Store(name, linear(idx, contiguous(shape)),
                                     self._elem_expr(st, idx))], self._into)

    def _elem_valid(self, st):
        v = st.out
        rank = len(v.shape)
        out = [Const(n) for n in self.sz.shape(v)]
        for a in st.args:
            if not hasattr(a, "shape"):
                continue
            va = self.valid_of(a)
            for j, e in enumerate(va):
                i = rank - len(a.shape) + j
                if self.size(a.shape[j]) == 1 or isinstance(e, Const) and \
                        isinstance(out[i], Const) and e.value >= out[i].value:
                    continue
                out[i] = e if isinstance(out[i], Const) else idx_min(out[i], e)
        return out

    def s_reduce(self, st, made=None):
        """A reduction along one axis in the row strategy's order (op.softmax's bits): LANES
        accumulators, element i into lane i % LANES, then the lanes combined in order. `made`:
        the elementwise statement whose tile x is, computed and stored by this loop (CPU)."""
        x, v = st.x, st.out
        axis, op = st.axis, st.op
        name = self.tile(v, self._into)
        shape = self.sz.shape(v)
        kept = [n for i, n in enumerate(self.sz.shape(x)) if i != axis]
        xd, od = x.dtype, v.dtype
        n = self.valid_of(x)[axis]
        valid = [e for i, e in enumerate(self.valid_of(x)) if i != axis]
        if st.keepdim:
            valid.insert(axis, Const(1))
        self.valid[v.id] = valid
        lanes = LANES.get(od.itemsize, 8)
        names = self.names

        def combine(acc, e):
            return OpCall(op, "combine", (), xd, od, (acc, e))

        def element(idx, i):
            return self.at(x, list(idx[:axis]) + [i] + list(idx[axis:]))

        init = OpCall(op, "init", (), xd, od, ())
        if self.gpu:
            return self._gpu_reduce(kept, lanes, n, combine, element, name, shape,
                                    st.keepdim, axis, init, od)
        chunks, tail = _divmod(n, lanes)

        def step(acc, lane, idx, i):
            """lane `lane` of acc combined with element i (made and stored first)"""
            if made is None:
                return [Store(acc, lane, combine(Load(acc, lane), element(idx, i)))]
            at, e = list(idx[:axis]) + [i] + list(idx[axis:]), names("v")
            tile, tshape = self.tiles[x.id]
            return [Decl(e, xd, self._elem_expr(made, at)),
                    Store(tile, linear(at, contiguous(tshape)), Var(e)),
                    Store(acc, lane, combine(Load(acc, lane), Var(e)))]

        def body(idx):
            out_idx = list(idx)
            if st.keepdim:
                out_idx.insert(axis, Const(0))
            c, total, l1 = names("ch"), names("s"), names("l")
            acc, l0, la, lt = names("acc"), names("l"), names("l"), names("l")
            return [
                Local(acc, od, lanes),
                Loop(l0, lanes, "vector", [Store(acc, Var(l0), init)]),
                Loop(c, chunks, "serial", [Loop(la, lanes, "vector", step(
                    acc, Var(la), idx, idx_add(idx_mul(Var(c), Const(lanes)), Var(la))))]),
                *([] if tail == Const(0) else [Loop(lt, tail, "vector", step(
                    acc, Var(lt), idx, idx_add(idx_mul(chunks, Const(lanes)), Var(lt))))]),
                Decl(total, od, Load(acc, Const(0))),
                Loop(l1, lanes - 1, "serial", [Assign(total, combine(
                    Var(total), Load(acc, idx_add(Var(l1), Const(1)))))]),
                Store(name, linear(out_idx, contiguous(shape)), Var(total))]
        self.each(kept, [Const(k) for k in kept], body, self._into, vector=False)

    def _gpu_reduce(self, kept, lanes, n, combine, element, name, shape, keepdim, axis, init,
                    od):
        """A thread per lane of each kept element (the same lanes as the CPU's), the partial
        results in shared memory, then a thread per kept element combining its lanes in order:
        the CPU's bits."""
        names = self.names
        part = names("part")
        self.shared.append(Shared(part, od, max(1, prod(kept)) * lanes))
        chunks, tail = _divmod(n, lanes)

        def lane_body(idx):
            *kidx, lane = idx
            c, a = names("ch"), names("a")
            return [Decl(a, od, init),
                    Loop(c, chunks, "serial", [Assign(a, combine(Var(a), element(
                        kidx, idx_add(idx_mul(Var(c), Const(lanes)), lane))))]),
                    If(Bin("<", lane, tail), [Assign(a, combine(Var(a), element(
                        kidx, idx_add(idx_mul(chunks, Const(lanes)), lane))))]),
                    Store(part, linear(idx, contiguous(kept + [lanes])), Var(a))]
        self.each(kept + [lanes], [Const(k) for k in kept + [lanes]], lane_body, self._into)

        def combine_body(idx):
            total, l1 = names("s"), names("l")
            at = linear(list(idx) + [Const(0)], contiguous(kept + [lanes]))
            out_idx = list(idx)
            if keepdim:
                out_idx.insert(axis, Const(0))
            return [Decl(total, od, Load(part, at)),
                    Loop(l1, lanes - 1, "serial", [Assign(total, combine(
                        Var(total), Load(part, idx_add(at, idx_add(Var(l1), Const(1))))))]),
                    Store(name, linear(out_idx, contiguous(shape)), Var(total))]
        self.each(kept, [Const(k) for k in kept], combine_body, self._into)

    def mma(self, st, into=None):
        a, b = st.a, st.b
        v = into if into is not None else st.out
        if into is None:
            name = self.tile(v, self._into)
            shape = self.sz.shape(v)
            self.each(shape, [Const(n) for n in shape],
                      lambda idx: [Store(name, linear(idx, contiguous(shape)),
                                         Const(0, v.dtype))], self._into)
            self.valid[v.id] = [self.valid_of(a)[0], self.valid_of(b)[1]]
        name, shape = self.tiles[v.id]
        m, n = shape
        kext = _least(self.valid_of(a)[1], self.valid_of(b)[0])
        d = v.dtype

        def term(i, kk, j, acc):
            ea, eb = self.at(a, [i, kk]), self.at(b, [kk, j])
            ea = ea if a.dtype == d else Cast(d, ea)
            eb = eb if b.dtype == d else Cast(d, eb)
            return OpCall("fma", "elem", (), d, d, (ea, eb, acc))
        kv = self.names("kk")
        at = lambda i, j: linear([i, j], contiguous(shape))    # noqa: E731
        if self.gpu:
            s = self.names("s")

            def body(idx):
                i, j = idx
                return [Decl(s, d, Load(name, at(i, j))),
                        Loop(kv, kext.value if isinstance(kext, Const) else kext, "serial",
                             [Assign(s, term(i, Var(kv), j, Var(s)))]),
                        Store(name, at(i, j), Var(s))]
            self.each([m, n], [Const(m), Const(n)], body, self._into, vector=False)
            return
        ke = kext.value if isinstance(kext, Const) else kext
        rows, width = MMA_ROWS, MMA_WIDTH // d.itemsize
        if m % rows or n % width:
            # i, k, j with j innermost (vectorised): each element one chain over k in order
            iv, jv = self.names("i"), self.names("j")
            self._into.append(Loop(iv, m, "serial", [Loop(kv, ke, "serial", [
                Loop(jv, n, "vector", [Store(name, at(Var(iv), Var(jv)), term(
                    Var(iv), Var(kv), Var(jv), Load(name, at(Var(iv), Var(jv)))))])])]))
            return
        # register blocks of rows x width accumulators (the GEMM routine's micro-tile): read
        # from the tile, the chains over k run in registers, written back; the same chains
        i0, j0 = self.names("ib"), self.names("jb")
        regs = self.names("reg")

        def el(rr, jj):
            return (idx_add(idx_mul(Var(i0), Const(rows)), rr),
                    idx_add(idx_mul(Var(j0), Const(width)), jj))

        def lanes(body_fn):
            rv, qv = self.names("r"), self.names("q")
            return Loop(rv, rows, "serial", [Loop(qv, width, "vector", body_fn(Var(rv), Var(qv)))])

        def reg(rr, jj):
            return idx_add(idx_mul(rr, Const(width)), jj)
        self._into.append(Loop(i0, m // rows, "serial", [Loop(j0, n // width, "serial", [
            Local(regs, d, rows * width),
            lanes(lambda rr, jj: [Store(regs, reg(rr, jj), Load(name, at(*el(rr, jj))))]),
            Loop(kv, ke, "serial", [lanes(lambda rr, jj: [Store(regs, reg(rr, jj), term(
                el(rr, jj)[0], Var(kv), el(rr, jj)[1], Load(regs, reg(rr, jj))))])]),
            lanes(lambda rr, jj: [Store(name, at(*el(rr, jj)), Load(regs, reg(rr, jj)))])])]))

    def _gemm_inputs(self, acc_dtype) -> tuple:
        """The operand dtypes the GEMM routine takes into an accumulator of acc_dtype: its own,
        and on CUDA 16-bit ones into f32 (tensor cores)."""
        if self.gpu and acc_dtype == dt.float32 and \
                gpu_gemm.uses_tensor_cores(self.language, "bf16"):
            return (acc_dtype, dt.float16, dt.bfloat16)
        return (acc_dtype,)

    def _gemm_loop(self, loop) -> bool:
        """On the CPU, `for k in range_k(0, K, BK): acc += mma(load_partition(a, k),
        load_partition(b, k))` over all of K, into a tile of zeros nothing else updates, is the
        compiler's GEMM routine on the program's block: the same chain per element over k from
        0 (op.matmul's bits), with the routine's register blocking and packing."""
        body = loop.body
        parts = [s for s in body if isinstance(s, kir.PartStmt)]
        if loop not in self.body.stmts or len(body) != 4 or len(parts) != 2:
            return False
        mma = next((s for s in body if isinstance(s, kir.MmaStmt)), None)
        upd = next((s for s in body if isinstance(s, kir.UpdateStmt)), None)
        if mma is None or upd is None or body.index(mma) + 1 != body.index(upd) or \
                upd.value is not mma.out or upd.op != "add" or \
                {mma.a, mma.b} != {p.out for p in parts} or mma.a is mma.b:
            return False
        acc = upd.target
        made = next((s for s in kir.walk(self.body.stmts) if s.out is acc), None)
        if not isinstance(made, kir.FullStmt) or made.value != 0 or \
                sum(1 for s in kir.walk(self.body.stmts) if isinstance(s, kir.UpdateStmt) and
                    s.target is acc) != 1 or acc.dtype not in (dt.float32, dt.float64):
            return False
        start, stop, step = loop.start, loop.stop, loop.step
        ops = []
        for operand, axis in ((mma.a, 1), (mma.b, 0)):
            part = next(p for p in parts if p.out is operand)
            src = self.streams.get(part.stream.id)
            if src is None or not _is(part.k, "var", loop.var):
                return False
            p = self.body.param(src.param)
            place = src.place
            if place[axis] != "stream" or place.index("stream") != axis or \
                    self.bufs[p.name].type.dtype not in self._gemm_inputs(acc.dtype) or \
                    step != src.out.shape[axis] or not _is(stop, "dim", p.dims[axis]) or \
                    not _is(start, "const", 0):
                return False
            ops.append((part, src))
        (pa, sa), (pb, sb) = ops
        offs_a, _, valid_a, _ = self._placement(sa, Const(0))
        offs_b, _, valid_b, _ = self._placement(sb, Const(0))
        ba, bb = self.bufs[sa.param], self.bufs[sb.param]
        st_a, st_b = contiguous(ba.type.shape), contiguous(bb.type.shape)
        name, shape = self.tiles[acc.id]
        kn = self.dims[self.body.param(sa.param).dims[1]]
        d = acc.dtype.short
        fn, key = f"ts_gemm_tile_{d}", f"gemm:{d}"
        opd = ba.type.dtype.short           # the operands' dtype (16-bit into f32: tensor cores)
        if opd != bb.type.dtype.short:
            return False
        if self.gpu:
            # the GPU GEMM routine on the block's tile, with the kernel's block sizes and
            # threads: SIMT for float32 and float64 (the same chains, the CPU's bits), tensor
            # cores for 16-bit operands into the f32 accumulator (the GPU matmul's order)
            tiles = (shape[0], shape[1], self.k.knobs.get("tile_k", 16),
                     self.gpu_knobs["threads"])
            try:
                if opd != d:
                    fn, _ = gpu_gemm.mma_routine(opd, *tiles, out=d)
                    smem = gpu_gemm.mma_plan(opd, *tiles)["smem"]
                    d = f"{opd}>{d}"
                else:
                    fn, _ = gpu_gemm.gemm_routine(self.language, d, *tiles)
                    smem = gpu_gemm.simt_plan(d, *tiles)["smem"]
            except TesseraError:
                return False              # knobs the routine cannot take: the FMA chains
            self.routine_shared += smem
            key = ":".join(map(str, ("gemm", d, *tiles)))

        args = (Addr(ba.name, _flat(offs_a, [Const(0)] * 2, st_a)), Const(st_a[0]),
                Const(st_a[1]), Addr(bb.name, _flat(offs_b, [Const(0)] * 2, st_b)),
                Const(st_b[0]), Const(st_b[1]),
                Addr(name, Const(0)), Const(shape[1]), Const(kn), valid_a[0], valid_b[1])
        if self.gpu:
            self._into += [Call(fn, args, key), Barrier()]
        else:
            self._into.append(Call(fn, args + (Const(0),), key))     # KC: the routine's own
        return True

    def s_mma(self, st):
        self.mma(st)

    def s_update(self, st):
        tv, val = st.target, st.value
        name, shape = self.tiles[tv.id]
        op = st.op
        d = tv.dtype

        def body(idx):
            cur = Load(name, linear(idx, contiguous(shape)))
            if hasattr(val, "shape"):
                e = self.at(val, idx[len(shape) - len(val.shape):])
                e = e if val.dtype == d else Cast(d, e)
            else:
                e = Const(val, d)
            return [Store(name, linear(idx, contiguous(shape)),
                          OpCall(op, "elem", (), d, d, (cur, e)))]
        self.each(shape, [Const(n) for n in shape], body, self._into)

    def s_loop(self, st):
        start, stop, step = self.ix(st.start), self.ix(st.stop), self.ix(st.step)
        it, kv = self.names("it"), st.var
        var = self.names(kv)
        self.vars[kv] = Var(var)
        self.nonneg.add(it)
        if _at_least_zero(start, self.nonneg):        # k = start + it * step, step >= 1
            self.nonneg.add(var)
        trips = Bin("/", Bin("+", Bin("-", stop, start), Bin("-", step, Const(1))), step)
        if all(isinstance(e, Const) for e in (start, stop, step)):
            trips = Const(max(0, -(-(stop.value - start.value) // step.value)))
        stages = self._stages(st)
        if stages > 1:
            return self._pipelined(st, it, var, start, step, trips, stages)
        outer = self._into
        body = [Decl(var, dt.int64, idx_add(start, idx_mul(Var(it), step)))]
        self._into = body
        self.emit(st.body)
        if self.gpu:
            self._end_with_barrier()
        self._into = outer
        outer.append(Loop(it, trips.value if isinstance(trips, Const) else trips, "serial", body))

    # -- a pipelined range_k loop (GPUs): its partitions loaded stages - 1 iterations ahead ------
    def _stages(self, loop) -> int:
        """How many buffers each partition of this loop gets on a GPU: range_k's `stages`, else
        the largest `prefetch` of the loads it partitions; 1 (no pipelining) on the CPU, for a
        loop without partitions or updating one, or where the buffers would take over half of
        a block's shared memory."""
        parts = [s for s in loop.body if isinstance(s, kir.PartStmt)]
        if not self.gpu or not parts or any(p.out.id in self.body.updated for p in parts):
            return 1
        n = loop.stages
        if n is None:
            n = max((self.streams[p.stream.id].prefetch or 1 for p in parts))
        n = self.size(n) if hasattr(n, "op") else n         # a knob (ctx.stages), or a count
        n = max(1, min(n, MAX_STAGES))
        size = sum(prod(self.sz.shape(p.out)) * p.out.dtype.itemsize for p in parts)
        return n if n * size <= GPU_SHARED_MAX // 2 else 1

    def _pipelined(self, st, it, var, start, step, trips, stages):
        """The loop with each partition in a ring of `stages` shared buffers: before the loop
        the first stages - 1 blocks are loaded; iteration i loads block i + stages - 1 into the
        slot iteration i - 1 read (free since the barrier that ended it) while it computes on
        slot i % stages, loaded at least one barrier earlier. One barrier per iteration instead
        of one more per partition, and the loads of later blocks overlap this one's compute.
        The same values in the same order: the same bits."""
        kv = st.var
        parts = [s for s in st.body if isinstance(s, kir.PartStmt)]
        for p in parts:
            v, shape = p.out, self.sz.shape(p.out)
            name = self.names("ring")
            self.shared.append(Shared(name, v.dtype, stages * max(1, prod(shape))))
            self.tiles[v.id] = (name, shape)
            self.ring[v.id] = (name, shape, max(1, prod(shape)))

        def k_of(i):                                   # the loop variable at iteration i
            return idx_add(start, idx_mul(i, step))

        def fills(i, slot):                            # (the partitions' k read at iteration i)
            self.vars[kv] = k_of(i)
            out = [x for p in parts for x in self._ring_fill(p, slot)]
            return out if isinstance(trips, Const) and isinstance(i, Const) and \
                i.value < trips.value else [If(Bin("<", i, trips), out, uniform=True)]
        outer = self._into
        for j in range(stages - 1):
            if not (isinstance(trips, Const) and j >= trips.value):
                outer.extend(fills(Const(j), Const(j)))
        outer.append(Barrier())
        ahead = idx_add(Var(it), Const(stages - 1))
        body = [Decl(var, dt.int64, k_of(Var(it)))]
        body.extend(fills(ahead, Bin("%", ahead, Const(stages))))
        self.vars[kv] = Var(var)
        for p in parts:
            self.base[p.out.id] = idx_mul(Bin("%", Var(it), Const(stages)),
                                          Const(self.ring[p.out.id][2]))
        self._into = body
        self.emit(st.body)
        self._end_with_barrier()
        self._into = outer
        outer.append(Loop(it, trips.value if isinstance(trips, Const) else trips, "serial", body))

    def _end_with_barrier(self):
        """A GPU loop's body ends with a barrier (the next iteration overwrites its tiles); the
        last tile step's own barrier is that one."""
        if not (self._into and isinstance(self._into[-1], Barrier)):
            self._into.append(Barrier())

    def _ring_fill(self, st, slot) -> list:
        """A partition's block at the loop variable's current binding into ring slot `slot`:
        one pass over the block's threads (`other` outside the tensor), no barrier."""
        v, src = st.out, self.streams[st.stream.id]
        name, shape, n = self.ring[v.id]
        offs, los, his, _ = self._placement(src, self.ix(st.k))
        b = self.bufs[src.param]
        g = self.names("e")
        idx = split_index(Var(g), list(shape)) if shape else []
        cond = None
        for i, lo, hi, m in zip(idx, los, his, shape):
            tests = [] if lo == Const(0) else [Bin(">=", i, lo)]
            if not (isinstance(hi, Const) and hi.value >= m):
                tests.append(Bin("<", i, hi))
            for c in tests:
                cond = c if cond is None else Bin("&&", cond, c)
        e = read(b, _flat(offs, idx, contiguous(b.type.shape)))
        if b.type.dtype != v.dtype:
            e = Cast(v.dtype, e)
        if cond is not None:
            e = Select(cond, e, Const(src.other, v.dtype))
        at = idx_add(idx_mul(slot, Const(n)), linear(idx, contiguous(shape)))
        return [Loop(g, prod(shape), "thread", [Store(name, at, e)])] if prod(shape) else []

    def _store_into(self, v, buf, place_dims, offsets, atomic=False):
        shape = self.sz.shape(v)
        ext = buf.type.shape
        strides = contiguous(ext)
        offs, los, his = [], [], []
        for i, (d, n) in enumerate(zip(place_dims, shape)):
            E = ext[i]
            if offsets is not None:
                off = self.ix(offsets[i])
                lo, hi = _below_zero(off, self.nonneg), self._clip(off, n, E)
            elif d in self.pid:
                pid, b = self.pid[d]
                off, lo = idx_mul(pid, Const(b)), Const(0)
                hi = self._clip(off, n, E, exact=E % n == 0)
            else:
                off, lo, hi = Const(0), Const(0), Const(min(n, E))
            offs.append(off)
            los.append(lo)
            his.append(hi)

        def body(idx):
            idx = [idx_add(lo, i) for lo, i in zip(los, idx)]
            g = _flat(offs, idx, strides)
            e = self.at(v, idx)
            if v.dtype != buf.type.dtype:
                e = Cast(buf.type.dtype, e)
            return [AtomicAdd(buf.name, g, e) if atomic else Store(buf.name, g, e)]
        self.each(shape, [_span(lo, hi) for lo, hi in zip(los, his)], body, self._into,
                  vector=not atomic)

    def s_store(self, st):
        p = self.body.param(st.param)
        self._store_into(st.value, self.k.output, p.dims, st.offsets)

    def s_atomic(self, st):
        """tile.atomic_add: a block added where a store would write it, or each valid element
        of an index tile's (a bad index reports the kernel's status code, as a gather's)."""
        value, index = st.value, st.index
        out = self.k.output
        if index is None:
            p = self.body.param(st.param)
            self._store_into(value, out, p.dims, st.offsets, atomic=True)
            return
        d, n = out.type.dtype, out.type.shape[0]

        def body(idx):
            iv = self.names("ix")
            if hasattr(value, "shape"):
                add = self.at(value, idx)
                add = add if value.dtype == d else Cast(d, add)
            else:
                add = Const(value, d)
            return [Decl(iv, dt.int64, Cast(dt.int64, self.at(index, idx))),
                    CheckIndex(iv, n, self.code), AtomicAdd(out.name, Var(iv), add)]
        self.each(self.sz.shape(index), self.valid_of(index), body, self._into, vector=False)

    def s_return(self, st):
        v = st.value
        self._store_into(v, self.k.output, v.dims, None)


LOWER_STMT = {kir.LoadStmt: _Lower.s_load, kir.PartStmt: _Lower.s_part,
              kir.FullStmt: _Lower.s_full, kir.ElemStmt: _Lower.s_elem,
              kir.ReduceStmt: _Lower.s_reduce, kir.MmaStmt: _Lower.s_mma,
              kir.UpdateStmt: _Lower.s_update, kir.LoopStmt: _Lower.s_loop,
              kir.StoreStmt: _Lower.s_store, kir.AtomicStmt: _Lower.s_atomic,
              kir.ReturnStmt: _Lower.s_return}
