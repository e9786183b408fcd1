"""Tile IR: loop nests mapped to hardware, shared by every target.

Loops carry a kind: on the CPU serial, parallel, vector, parallel+vector; on GPUs `grid` (one
iteration per thread of the launch, grid-stride), `block` (one per block, block-stride) and
`thread` (the block's threads over an extent, block-stride), plus serial. Kernels read and write
buffers with explicit flat indices; elementwise and reduction arithmetic stays an ``OpCall``
naming its registry entry, which each renderer turns into its language. GPU kernels add shared
buffers, barriers and block-wide reductions, and carry a launch configuration.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace

from .. import dtypes as dt
from ..errors import IRVerificationError
from .graph_ir import format_attrs, format_value


# ---- expressions ---------------------------------------------------------------------------------
class Expr:
    pass


@dataclass(frozen=True)
class Var(Expr):
    name: str

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class Const(Expr):
    value: object
    dtype: object = None          # a DType, or None for an index constant

    def __str__(self):
        return format_value(self.value)


@dataclass(frozen=True)
class Load(Expr):
    buf: str
    index: Expr

    def __str__(self):
        return f"{self.buf}[{self.index}]"


@dataclass(frozen=True)
class Bin(Expr):
    op: str
    a: Expr
    b: Expr

    def __str__(self):
        return f"({self.a} {self.op} {self.b})"


@dataclass(frozen=True)
class Cast(Expr):
    dtype: dt.DType
    e: Expr

    def __str__(self):
        return f"{self.dtype.short}({self.e})"


@dataclass(frozen=True)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr

    def __str__(self):
        return f"select({self.cond}, {self.a}, {self.b})"


@dataclass(frozen=True)
class OpCall(Expr):
    """Arithmetic from a registry entry: role 'elem', 'combine' (acc, x) or 'better' (x, best)."""
    op: str
    role: str
    attrs: tuple                  # sorted (name, value) pairs
    compute: dt.DType             # picks the template kind and the helpers' types
    out: dt.DType
    args: tuple

    def __str__(self):
        name = self.op if self.role == "elem" else f"{self.op}.{self.role}"
        extra = format_attrs({k: v for k, v in self.attrs if k != "dtype"})
        return f"{name}({', '.join(map(str, self.args))})" + (f" {extra}" if extra else "")


@dataclass(frozen=True)
class Addr(Expr):
    """A pointer to buf[index] (an argument of a Call); buf None is the null pointer."""
    buf: str | None
    index: Expr = None

    def __str__(self):
        return "null" if self.buf is None else f"&{self.buf}[{self.index}]"


@dataclass(frozen=True)
class ThreadIndex(Expr):
    """The thread's index in its block (GPU kernels)."""

    def __str__(self):
        return "thread"


@dataclass(frozen=True)
class Aligned(Expr):
    """True when buffer `buf`'s address is a multiple of `bytes` (a GPU kernel's vector path
    needs it; a caller's array may be a view at any element offset)."""
    buf: str
    bytes: int

    def __str__(self):
        return f"aligned({self.buf}, {self.bytes})"


def idx_add(a, b):
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value)
    return Bin("+", a, b)


def idx_mul(a, b):
    if isinstance(b, Const):
        if b.value == 0:
            return Const(0)
        if b.value == 1:
            return a
        if isinstance(a, Const):
            return Const(a.value * b.value)
    return Bin("*", a, b)


def linear(vars_, strides, offset=0) -> Expr:
    e = Const(offset)
    for v, s in zip(vars_, strides):
        e = idx_add(e, idx_mul(v, Const(s)))
    return e


# ---- statements ----------------------------------------------------------------------------------
class Stmt:
    pass


@dataclass
class Loop(Stmt):
    var: str
    extent: object                # an int, or an index Expr (the edge tiles of a tiled loop)
    kind: str                     # CPU_LOOPS or GPU_LOOPS below
    body: list = field(default_factory=list)


CPU_LOOPS = {"serial", "parallel", "vector", "parallel+vector"}
GPU_LOOPS = {"serial", "unroll", "grid", "block", "thread"}   # unroll: a constant trip count,
                                                              # fully unrolled (register arrays)


@dataclass
class Local(Stmt):
    """A small array in registers or on the stack (a reduction's lane accumulators)."""
    name: str
    dtype: dt.DType
    size: int


@dataclass
class Decl(Stmt):
    name: str
    dtype: dt.DType
    init: Expr


@dataclass
class Assign(Stmt):
    name: str
    value: Expr


@dataclass
class Store(Stmt):
    buf: str
    index: Expr
    value: Expr


@dataclass
class VecLoad(Stmt):
    """Declares `name`, `lanes` consecutive elements buf[index], buf[index + 1], ... read in
    one access (index a multiple of lanes, buf aligned to the whole access); lane l is read as
    Load(name, Const(l)). The elements keep the parameter's storage (16-bit floats as bits)."""
    name: str
    dtype: dt.DType
    buf: str
    index: Expr
    lanes: int


@dataclass
class VecStore(Stmt):
    """buf[index + l] = values[l] for every lane l, written in one access (aligned as VecLoad)."""
    buf: str
    index: Expr
    values: tuple


@dataclass
class If(Stmt):
    """`body` where cond holds, else `orelse`. `uniform`: cond is the same in every thread of
    the block, so the bodies may hold barriers and block reductions (a block's ticket)."""
    cond: Expr
    body: list
    orelse: list = field(default_factory=list)
    uniform: bool = False


@dataclass
class Workspace(Stmt):
    """Declares buffer `name`: `size` elements of dtype at int `offset` of the launch's
    workspace, which the runtime zeroes before every run (the ints after the status word).
    Blocks write it and other blocks read it, so it is volatile (no stale cached copies)."""
    name: str
    dtype: dt.DType
    offset: int
    size: int


@dataclass
class Ticket(Stmt):
    """Declares int `name` in every thread of the block: how many blocks took a ticket of the
    workspace counter at int `counter` before this one (after a fence: what the block wrote
    before is visible to whoever takes a later ticket). An integer atomic: the one who gets the
    last ticket knows every other block is done."""
    name: str
    counter: int


@dataclass
class CheckIndex(Stmt):
    """Wrap a negative index once; if still out of [0, extent) record `code` and use 0."""
    name: str
    extent: int
    code: int


@dataclass
class Call(Stmt):
    """A call of a hand-written routine of the target (the GEMM tile, the attention block);
    `routine` names its source, which the renderer emits once. With a `fail_code`, the routine
    returns nonzero when it cannot get its scratch memory, and the kernel then reports
    -fail_code (the kernel's code, negated: out of memory, not a bad index)."""
    fn: str
    args: tuple
    routine: str
    fail_code: int = 0


@dataclass
class Shared(Stmt):
    """A block's shared-memory array (GPU kernels; declared at kernel level)."""
    name: str
    dtype: dt.DType
    size: int


@dataclass
class Barrier(Stmt):
    """Every thread of the block waits here; the block's shared and global writes before it are
    visible to its threads after it."""


@dataclass
class BlockReduce(Stmt):
    """Declares `name`: `op`'s combine over `value` of every thread of the block, the same bits
    in every thread. The order is fixed (a shuffle tree inside each warp, then the warps' results
    in order through the shared array `scratch`), so the result is reproducible."""
    name: str
    dtype: dt.DType
    value: Expr
    op: str
    compute: dt.DType            # the reduced values' dtype (picks the combine template)
    scratch: str                 # a Shared buffer of dtype, at least block/32 + 1 long

    def combine(self, acc: Expr, x: Expr) -> OpCall:
        return OpCall(self.op, "combine", (), self.compute, self.dtype, (acc, x))


@dataclass
class Param:
    name: str
    dtype: dt.DType
    shape: tuple
    mode: str                     # in | out
    label: str = ""               # the user's name for an input, shown beside ours


@dataclass
class TileKernel:
    name: str
    strategy: str
    params: list
    body: list
    knobs: dict
    origin: str = ""
    launch: dict | None = None    # GPU kernels: {"grid": blocks, "block": threads, "shared":
                                  # dynamic shared bytes}; None on the CPU

    def __str__(self):
        ps = ", ".join(f"{p.mode} {p.name}" + (f"=%{p.label}" if p.label else "")
                       + f": {p.dtype.short}{list(p.shape)}" for p in self.params)
        head = f"kernel {self.name}({ps}) strategy={self.strategy}"
        if self.launch is not None:
            static = sum(s.size * s.dtype.itemsize for s in self.body if isinstance(s, Shared))
            head += (f" launch{{grid={self.launch['grid']}, block={self.launch['block']}, "
                     f"shared={self.launch['shared']}+{static}B static}}")
        lines = [head + " {"]
        _print_block(self.body, lines, 1)
        lines.append("}")
        return "\n".join(lines)

    def verify(self):
        names = {p.name for p in self.params}
        if len(names) != len(self.params):
            raise IRVerificationError(f"{self.name}: two parameters share a name")
        outs = {p.name for p in self.params if p.mode == "out"}
        sizes = {p.name: _numel(p.shape) for p in self.params}
        gpu = self.launch is not None
        shared = {}
        if gpu:
            self._verify_launch()

        def walk(stmts, scope, divergent=None, top=False):
            """divergent: the kind of the enclosing loop whose trip count differs between the
            block's threads (grid, thread), where no barrier may stand."""
            scope = set(scope)
            for s in stmts:
                if isinstance(s, (Shared, Barrier, BlockReduce)) and not gpu:
                    raise IRVerificationError(f"{self.name}: {type(s).__name__} in a CPU kernel")
                if isinstance(s, (Barrier, BlockReduce, Ticket)) or \
                        (isinstance(s, Call) and gpu):
                    if divergent:
                        raise IRVerificationError(
                            f"{self.name}: {type(s).__name__.lower()} inside a {divergent}, "
                            "where the block's threads diverge")
                if isinstance(s, Loop):
                    if s.kind not in (GPU_LOOPS if gpu else CPU_LOOPS):
                        raise IRVerificationError(f"{self.name}: a {s.kind} loop in a "
                                                  f"{'GPU' if gpu else 'CPU'} kernel")
                    if isinstance(s.extent, int) and s.extent < 0:
                        raise IRVerificationError(f"{self.name}: loop {s.var} has extent {s.extent}")
                    if isinstance(s.extent, Expr):
                        _check_expr(s.extent, scope, names, self.name)
                    if s.var in scope or s.var in names:
                        raise IRVerificationError(f"{self.name}: {s.var} is declared twice")
                    inner = divergent or \
                        (f"{s.kind} loop" if s.kind in ("grid", "thread") else None)
                    walk(s.body, scope | {s.var}, inner)
                elif isinstance(s, Shared):
                    if not top:
                        raise IRVerificationError(f"{self.name}: shared {s.name} is not declared "
                                                  "at kernel level")
                    if s.name in names or s.size <= 0:
                        raise IRVerificationError(f"{self.name}: bad shared buffer {s.name}")
                    names.add(s.name)
                    outs.add(s.name)
                    sizes[s.name] = s.size
                    shared[s.name] = s
                elif isinstance(s, Barrier):
                    pass
                elif isinstance(s, BlockReduce):
                    _check_expr(s.value, scope, names, self.name)
                    scratch = shared.get(s.scratch)
                    if scratch is None or scratch.dtype != s.dtype or \
                            scratch.size < self.launch["block"] // 32 + 1:
                        raise IRVerificationError(f"{self.name}: {s.name}'s scratch {s.scratch} "
                                                  "is not a large enough shared buffer of its "
                                                  "dtype")
                    if s.name in scope or s.name in names:
                        raise IRVerificationError(f"{self.name}: {s.name} is declared twice")
                    scope.add(s.name)
                elif isinstance(s, Local):
                    if s.name in scope or s.name in names:
                        raise IRVerificationError(f"{self.name}: {s.name} is declared twice")
                    names.add(s.name)
                    outs.add(s.name)
                    sizes[s.name] = s.size
                elif isinstance(s, Decl):
                    _check_expr(s.init, scope, names, self.name)
                    if s.name in scope or s.name in names:
                        raise IRVerificationError(f"{self.name}: {s.name} is declared twice")
                    scope.add(s.name)
                elif isinstance(s, Assign):
                    if s.name not in scope:
                        raise IRVerificationError(f"{self.name}: assigns undeclared {s.name}")
                    _check_expr(s.value, scope, names, self.name)
                elif isinstance(s, Store):
                    if s.buf not in outs:
                        raise IRVerificationError(f"{self.name}: stores to {s.buf}, not an output")
                    if isinstance(s.index, Const) and not 0 <= s.index.value < sizes[s.buf]:
                        raise IRVerificationError(f"{self.name}: stores outside {s.buf} "
                                                  f"(index {s.index.value})")
                    _check_expr(s.index, scope, names, self.name)
                    _check_expr(s.value, scope, names, self.name)
                elif isinstance(s, If):       # (a barrier under a condition may deadlock)
                    _check_expr(s.cond, scope, names, self.name)
                    inner = divergent if s.uniform else divergent or "condition"
                    walk(s.body, scope, inner)
                    walk(s.orelse, scope, inner)
                elif isinstance(s, Workspace):
                    if not gpu or s.name in scope or s.name in names or s.size <= 0 or \
                            s.offset + s.size * s.dtype.itemsize // 4 > \
                            self.launch.get("workspace", 0):
                        raise IRVerificationError(f"{self.name}: bad workspace {s.name}")
                    names.add(s.name)
                    outs.add(s.name)
                    sizes[s.name] = s.size
                elif isinstance(s, Ticket):
                    if not 0 <= s.counter < self.launch.get("workspace", 0):
                        raise IRVerificationError(f"{self.name}: ticket counter {s.counter} is "
                                                  "outside the workspace")
                    if s.name in scope or s.name in names:
                        raise IRVerificationError(f"{self.name}: {s.name} is declared twice")
                    scope.add(s.name)
                elif isinstance(s, VecLoad):
                    if not gpu or s.buf not in sizes or s.lanes < 1:
                        raise IRVerificationError(f"{self.name}: bad vector load {s.name} of "
                                                  f"{s.buf}")
                    _check_expr(s.index, scope, names, self.name)
                    if s.name in scope or s.name in names:
                        raise IRVerificationError(f"{self.name}: {s.name} is declared twice")
                    names.add(s.name)
                    sizes[s.name] = s.lanes
                elif isinstance(s, VecStore):
                    if not gpu or s.buf not in outs:
                        raise IRVerificationError(f"{self.name}: vector store to {s.buf}, not an "
                                                  "output")
                    for e in (s.index, *s.values):
                        _check_expr(e, scope, names, self.name)
                elif isinstance(s, CheckIndex):
                    if s.name not in scope:
                        raise IRVerificationError(f"{self.name}: checks undeclared {s.name}")
                elif isinstance(s, Call):
                    for a in s.args:
                        if isinstance(a, Addr) and a.buf is not None and a.buf not in names:
                            raise IRVerificationError(f"{self.name}: {s.fn} gets unknown "
                                                      f"buffer {a.buf}")
                        _check_expr(a, scope, names, self.name)
        walk(self.body, (), top=True)
        return self

    def _verify_launch(self):
        launch = self.launch
        if not {"grid", "block", "shared"} <= set(launch) <= {"grid", "block", "shared",
                                                               "workspace"} or \
                not all(isinstance(v, int) for v in launch.values()) or \
                launch.get("workspace", 0) < 0:
            raise IRVerificationError(f"{self.name}: launch {launch} is not "
                                      "{grid, block, shared[, workspace]} in integers")
        if not 1 <= launch["grid"] <= 2 ** 31 - 1 or not 1 <= launch["block"] <= 1024 or \
                launch["block"] % 32 or launch["shared"] < 0:
            raise IRVerificationError(f"{self.name}: launch grid={launch['grid']} "
                                      f"block={launch['block']} is out of range (block: a "
                                      "multiple of 32 up to 1024)")


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _check_expr(e, scope, bufs, kname):
    if isinstance(e, Var) and e.name not in scope:
        raise IRVerificationError(f"{kname}: uses {e.name} outside its scope")
    if isinstance(e, (Load, Aligned)) and e.buf not in bufs:
        raise IRVerificationError(f"{kname}: loads from unknown buffer {e.buf}")
    for child in _children(e):
        _check_expr(child, scope, bufs, kname)


def _children(e):
    if isinstance(e, Load):
        return [e.index]
    if isinstance(e, Bin):
        return [e.a, e.b]
    if isinstance(e, Cast):
        return [e.e]
    if isinstance(e, Select):
        return [e.cond, e.a, e.b]
    if isinstance(e, OpCall):
        return list(e.args)
    if isinstance(e, Addr):
        return [] if e.index is None else [e.index]
    return []


def walk_exprs(stmts):
    """Every expression in a statement list, depth first."""
    for s in stmts:
        if isinstance(s, Loop):
            yield from walk_exprs(s.body)
            continue
        roots = {Decl: lambda s: [s.init], Assign: lambda s: [s.value],
                 Store: lambda s: [s.index, s.value], VecLoad: lambda s: [s.index],
                 VecStore: lambda s: [s.index, *s.values], If: lambda s: [s.cond],
                 BlockReduce: lambda s: [s.value, s.combine(Var("a"), Var("b"))],
                 Call: lambda s: list(s.args)}.get(type(s), lambda s: [])(s)
        stack = list(roots)
        while stack:
            e = stack.pop()
            yield e
            stack.extend(_children(e))
        if isinstance(s, If):
            yield from walk_exprs(s.body)
            yield from walk_exprs(s.orelse)


def _print_block(stmts, lines, depth):
    pad = "  " * depth
    for s in stmts:
        if isinstance(s, Loop):
            lines.append(f"{pad}for.{s.kind} {s.var} in 0..{s.extent} {{")
            _print_block(s.body, lines, depth + 1)
            lines.append(f"{pad}}}")
        elif isinstance(s, Decl):
            lines.append(f"{pad}{s.name}: {s.dtype.short} = {s.init}")
        elif isinstance(s, Assign):
            lines.append(f"{pad}{s.name} = {s.value}")
        elif isinstance(s, Store):
            lines.append(f"{pad}{s.buf}[{s.index}] = {s.value}")
        elif isinstance(s, Workspace):
            lines.append(f"{pad}workspace {s.name}: {s.dtype.short}[{s.size}] at +{s.offset}")
        elif isinstance(s, Ticket):
            lines.append(f"{pad}{s.name}: i32 = block_ticket(workspace[{s.counter}])")
        elif isinstance(s, If):
            lines.append(f"{pad}if {s.cond} {{")
            _print_block(s.body, lines, depth + 1)
            if s.orelse:
                lines.append(f"{pad}}} else {{")
                _print_block(s.orelse, lines, depth + 1)
            lines.append(f"{pad}}}")
        elif isinstance(s, VecLoad):
            lines.append(f"{pad}{s.name}: {s.dtype.short}x{s.lanes} = vload {s.buf}[{s.index}]")
        elif isinstance(s, VecStore):
            lines.append(f"{pad}vstore {s.buf}[{s.index}] = "
                         f"({', '.join(map(str, s.values))})")
        elif isinstance(s, CheckIndex):
            lines.append(f"{pad}check {s.name} in 0..{s.extent} else error {s.code}")
        elif isinstance(s, Local):
            lines.append(f"{pad}local {s.name}: {s.dtype.short}[{s.size}]")
        elif isinstance(s, Call):
            lines.append(f"{pad}call {s.fn}({', '.join(map(str, s.args))})")
        elif isinstance(s, Shared):
            lines.append(f"{pad}shared {s.name}: {s.dtype.short}[{s.size}]")
        elif isinstance(s, Barrier):
            lines.append(f"{pad}barrier")
        elif isinstance(s, BlockReduce):
            lines.append(f"{pad}{s.name}: {s.dtype.short} = block_reduce.{s.op}({s.value}) "
                         f"via {s.scratch}")


def substitute(stmts, values: dict) -> list:
    """The statements with each Var named in `values` replaced by that expression (a loop's
    index given a new meaning); loops and bodies are copied, the input is untouched."""
    def ex(e):
        if isinstance(e, Var):
            return values.get(e.name, e)
        kids = {f.name: getattr(e, f.name) for f in fields(e)} if is_dataclass(e) else {}
        changed = {k: ex(v) for k, v in kids.items() if isinstance(v, Expr)}
        if isinstance(e, OpCall):
            changed["args"] = tuple(ex(a) for a in e.args)
        return replace(e, **changed) if changed else e

    out = []
    for s in stmts:
        if isinstance(s, Loop):
            extent = ex(s.extent) if isinstance(s.extent, Expr) else s.extent
            out.append(Loop(s.var, extent, s.kind, substitute(s.body, values)))
        elif isinstance(s, Call):
            out.append(replace(s, args=tuple(ex(a) for a in s.args)))
        elif isinstance(s, If):
            out.append(If(ex(s.cond), substitute(s.body, values), substitute(s.orelse, values),
                          s.uniform))
        elif isinstance(s, VecStore):
            out.append(VecStore(s.buf, ex(s.index), tuple(ex(v) for v in s.values)))
        else:
            out.append(replace(s, **{f.name: ex(getattr(s, f.name)) for f in fields(s)
                                     if isinstance(getattr(s, f.name), Expr)}))
    return out


@dataclass
class TileProgram:
    name: str
    kernels: list
    calls: list                   # (kernel name, [buffer names]) in launch order
    buffers: list                 # the runtime buffer table (schedule Buffers, no inline ones)

    def __str__(self):
        return "\n\n".join(str(k) for k in self.kernels) or f"// {self.name}: no kernels"

    def workspace_bases(self) -> dict:
        """GPU kernels' workspaces lie one after another, in kernel order, after the status
        word: kernel name -> its first int."""
        bases, n = {}, 0
        for k in self.kernels:
            bases[k.name] = n
            n += (k.launch or {}).get("workspace", 0)
        return bases

    @property
    def workspace(self) -> int:
        """Ints of zeroed workspace the runtime allocates after the status word."""
        return sum((k.launch or {}).get("workspace", 0) for k in self.kernels)

    def verify(self):
        known = {b.name: b for b in self.buffers}
        kernels = {k.name: k for k in self.kernels}
        for name, args in self.calls:
            k = kernels.get(name)
            if k is None or len(args) != len(k.params) or any(a not in known for a in args):
                raise IRVerificationError(f"tile program @{self.name}: bad call of {name}")
            for p, a in zip(k.params, args):
                b = known[a]
                if b.type.dtype != p.dtype or tuple(b.type.shape) != tuple(p.shape):
                    raise IRVerificationError(f"tile program @{self.name}: {name} gets {a}: "
                                              f"{b.type} for {p.name}")
        for k in self.kernels:
            k.verify()
        return self

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))
