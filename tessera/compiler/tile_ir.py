"""Tile IR: loop nests mapped to hardware, shared by every target.

Loops carry a kind: on the CPU serial, parallel, vector, parallel+vector; on GPUs `grid` (one
iteration per thread of the launch, grid-stride), `block` (one per block, block-stride) and
`thread` (the block's threads over an extent, block-stride), plus serial. Kernels read and write
buffers with explicit flat indices; elementwise and reduction arithmetic stays an ``OpCall``
naming its registry entry, which each renderer turns into its language. GPU kernels add shared
buffers, barriers and block-wide reductions, and carry a launch configuration.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from .. import dtypes as dt
from .dynamic import is_dynamic
from ..errors import IRVerificationError
from ..shapes import show
from .graph_ir import format_attrs, format_value


# ---- expressions ---------------------------------------------------------------------------------
class Expr:
    children = ()       # the fields holding sub-expressions (a tuple field: each element)


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
        if is_dynamic(self.value):          # (a mean's count: its expression, 16*B)
            return show(self.value)
        return format_value(self.value)


@dataclass(frozen=True)
class Load(Expr):
    children = ("index",)
    buf: str
    index: Expr

    def __str__(self):
        return f"{self.buf}[{self.index}]"


@dataclass(frozen=True)
class Bin(Expr):
    children = ("a", "b")
    op: str
    a: Expr
    b: Expr

    def __str__(self):
        return f"({self.a} {self.op} {self.b})"


@dataclass(frozen=True)
class Cast(Expr):
    children = ("e",)
    dtype: dt.DType
    e: Expr

    def __str__(self):
        return f"{self.dtype.short}({self.e})"


@dataclass(frozen=True)
class Select(Expr):
    children = ("cond", "a", "b")
    cond: Expr
    a: Expr
    b: Expr

    def __str__(self):
        return f"select({self.cond}, {self.a}, {self.b})"


@dataclass(frozen=True)
class OpCall(Expr):
    """Arithmetic from a registry entry: role 'elem', 'combine' (acc, x) or 'better' (x, best)."""
    children = ("args",)
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
    children = ("index",)
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


def _is(e, value) -> bool:
    """e is the constant `value` at every size (a dynamic size is 0 or 1 only at some:
    compiler/dynamic.py)."""
    return isinstance(e, Const) and e.value == value and not is_dynamic(e.value)


def idx_add(a, b):
    if _is(a, 0):
        return b
    if _is(b, 0):
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value)
    return Bin("+", a, b)


def idx_mul(a, b):
    if isinstance(b, Const):
        if _is(b, 0):
            return Const(0)
        if _is(b, 1):
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
    """A statement declares its parts once: the fields holding expressions (`exprs`) and those
    holding statement lists (`blocks`); walking, substitution and printing read these."""
    exprs = ()
    blocks = ()

    def expressions(self) -> list:
        return _fields(self, self.exprs)

    def head(self) -> str:
        """How the statement prints (its first line, for one with blocks)."""
        raise NotImplementedError

    def lines(self, depth: int) -> list:
        pad = "  " * depth
        if not self.blocks:
            return [pad + self.head()]
        out = [f"{pad}{self.head()} {{"]
        for name in self.blocks:
            out += _printed(getattr(self, name), depth + 1)
        return out + [pad + "}"]


def _fields(node, names) -> list:
    out = []
    for name in names:
        v = getattr(node, name)
        if isinstance(v, tuple):
            out += [x for x in v if isinstance(x, Expr)]
        elif isinstance(v, Expr):
            out.append(v)
    return out


@dataclass
class Loop(Stmt):
    exprs = ("extent",)
    blocks = ("body",)
    var: str
    extent: object                # an int, or an index Expr (the edge tiles of a tiled loop)
    kind: str                     # CPU_LOOPS or GPU_LOOPS below
    body: list = field(default_factory=list)

    def head(self) -> str:
        return f"for.{self.kind} {self.var} in 0..{show(self.extent)}"


CPU_LOOPS = {"serial", "parallel", "vector", "parallel+vector"}
GPU_LOOPS = {"serial", "unroll", "grid", "block", "thread"}   # unroll: a constant trip count,
                                                              # fully unrolled (register arrays)


@dataclass
class Local(Stmt):
    """A small array in registers or on the stack (a reduction's lane accumulators)."""
    name: str
    dtype: dt.DType
    size: int

    def head(self) -> str:
        return f"local {self.name}: {self.dtype.short}[{self.size}]"


@dataclass
class Scratch(Stmt):
    """`body` with `name`, a private array of `size` elements too large for the stack (a
    line's merge buffers), taken from the heap for the body and given back after it (CPU
    kernels). Without the memory the kernel reports -code (out of memory) and skips the body."""
    blocks = ("body",)
    name: str
    dtype: dt.DType
    size: int
    code: int
    body: list = field(default_factory=list)

    def head(self) -> str:
        return f"scratch {self.name}: {self.dtype.short}[{show(self.size)}]"


@dataclass
class Decl(Stmt):
    exprs = ("init",)
    name: str
    dtype: dt.DType
    init: Expr

    def head(self) -> str:
        return f"{self.name}: {self.dtype.short} = {self.init}"


@dataclass
class Assign(Stmt):
    exprs = ("value",)
    name: str
    value: Expr

    def head(self) -> str:
        return f"{self.name} = {self.value}"


@dataclass
class Store(Stmt):
    exprs = ("index", "value")
    buf: str
    index: Expr
    value: Expr

    def head(self) -> str:
        return f"{self.buf}[{self.index}] = {self.value}"


@dataclass
class AtomicAdd(Stmt):
    """buf[index] += value, atomically: integers only (a tile kernel's tile.atomic_add), whose
    sums do not depend on the order threads arrive in."""
    exprs = ("index", "value")
    buf: str
    index: Expr
    value: Expr

    def head(self) -> str:
        return f"atomic {self.buf}[{self.index}] += {self.value}"


@dataclass
class VecLoad(Stmt):
    """Declares `name`, `lanes` consecutive elements buf[index], buf[index + 1], ... read in
    one access (index a multiple of lanes, buf aligned to the whole access); lane l is read as
    Load(name, Const(l)). The elements keep the parameter's storage (16-bit floats as bits)."""
    exprs = ("index",)
    name: str
    dtype: dt.DType
    buf: str
    index: Expr
    lanes: int

    def head(self) -> str:
        return f"{self.name}: {self.dtype.short}x{self.lanes} = vload {self.buf}[{self.index}]"


@dataclass
class VecStore(Stmt):
    """buf[index + l] = values[l] for every lane l, written in one access (aligned as VecLoad)."""
    exprs = ("index", "values")
    buf: str
    index: Expr
    values: tuple

    def head(self) -> str:
        return f"vstore {self.buf}[{self.index}] = ({', '.join(map(str, self.values))})"


@dataclass
class If(Stmt):
    """`body` where cond holds, else `orelse`. `uniform`: cond is the same in every thread of
    the block, so the bodies may hold barriers and block reductions (a block's ticket)."""
    exprs = ("cond",)
    blocks = ("body", "orelse")
    cond: Expr
    body: list
    orelse: list = field(default_factory=list)
    uniform: bool = False

    def head(self) -> str:
        return f"if {self.cond}"

    def lines(self, depth: int) -> list:
        pad = "  " * depth
        out = [f"{pad}if {self.cond} {{", *_printed(self.body, depth + 1)]
        if self.orelse:
            out += [f"{pad}}} else {{", *_printed(self.orelse, depth + 1)]
        return out + [pad + "}"]


@dataclass
class Workspace(Stmt):
    """Declares buffer `name`: `size` elements of dtype at int `offset` of the launch's
    workspace, which the runtime zeroes before every run (the ints after the status word).
    Shared by the blocks (per_block 0): blocks write it and other blocks read it, so it is
    volatile (no stale cached copies), unless only later launches read it (volatile False).
    Or each block's own (per_block: the ints from one block's copy to the next, the block's
    index times it added): a barrier orders its threads' accesses, as for shared memory."""
    name: str
    dtype: dt.DType
    offset: int
    size: int
    per_block: int = 0
    volatile: bool = True         # False: only later launches read what a block writes here
                                  # (phases of one kernel), which a launch boundary orders

    def head(self) -> str:
        own = f" + block * {self.per_block}" if self.per_block else ""
        return f"workspace {self.name}: {self.dtype.short}[{self.size}] at +{self.offset}{own}"


@dataclass
class Ticket(Stmt):
    """Declares int `name` in every thread of the block: how many blocks took a ticket of the
    workspace counter at int `counter` before this one (after a fence: what the block wrote
    before is visible to whoever takes a later ticket). An integer atomic: the one who gets the
    last ticket knows every other block is done."""
    name: str
    counter: int

    def head(self) -> str:
        return f"{self.name}: i32 = block_ticket(workspace[{self.counter}])"


@dataclass
class CheckIndex(Stmt):
    """Wrap a negative index once; if still out of [0, extent) record `code` and use 0."""
    name: str
    extent: int
    code: int

    def head(self) -> str:
        return f"check {self.name} in 0..{show(self.extent)} else error {self.code}"


@dataclass
class Call(Stmt):
    """A call of a hand-written routine of the target (the GEMM tile, the attention block);
    `routine` names its source, which the renderer emits once. With a `fail_code`, the routine
    returns nonzero when it cannot get its scratch memory, and the kernel then reports
    -fail_code (the kernel's code, negated: out of memory, not a bad index)."""
    exprs = ("args",)
    fn: str
    args: tuple
    routine: str
    fail_code: int = 0

    def head(self) -> str:
        return f"call {self.fn}({', '.join(map(str, self.args))})"


@dataclass
class Shared(Stmt):
    """A block's shared-memory array (GPU kernels; declared at kernel level)."""
    name: str
    dtype: dt.DType
    size: int

    def head(self) -> str:
        return f"shared {self.name}: {self.dtype.short}[{self.size}]"


@dataclass
class Barrier(Stmt):
    """Every thread of the block waits here; the block's shared and global writes before it are
    visible to its threads after it."""

    def head(self) -> str:
        return "barrier"


@dataclass
class BlockReduce(Stmt):
    """Declares `name`: `op`'s combine over `value` of every thread of the block, the same bits
    in every thread. The order is fixed (a shuffle tree inside each warp, then the warps' results
    in order through the shared array `scratch`), so the result is reproducible."""
    exprs = ("value",)
    name: str
    dtype: dt.DType
    value: Expr
    op: str
    compute: dt.DType            # the reduced values' dtype (picks the combine template)
    scratch: str                 # a Shared buffer of dtype, at least block/32 + 1 long

    def combine(self, acc: Expr, x: Expr) -> OpCall:
        return OpCall(self.op, "combine", (), self.compute, self.dtype, (acc, x))

    def expressions(self) -> list:      # the combine too: its template's helpers are needed
        return [self.value, self.combine(Var("a"), Var("b"))]

    def head(self) -> str:
        return (f"{self.name}: {self.dtype.short} = block_reduce.{self.op}({self.value}) "
                f"via {self.scratch}")


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
    phase_of: str = ""            # a GPU phase: the schedule kernel it is part of (its phases
                                  # launch one after another and share one workspace)

    def __str__(self):
        ps = ", ".join(f"{p.mode} {p.name}" + (f"=%{p.label}" if p.label else "")
                       + f": {p.dtype.short}[{', '.join(map(show, p.shape))}]" for p in self.params)
        head = f"kernel {self.name}({ps}) strategy={self.strategy}"
        if self.launch is not None:
            static = sum(s.size * s.dtype.itemsize for s in self.body if isinstance(s, Shared))
            head += (f" launch{{grid={self.launch['grid']}, block={self.launch['block']}, "
                     f"shared={self.launch['shared']}+{static}B static}}")
        return "\n".join([head + " {", *_printed(self.body, 1), "}"])

    def verify(self):
        if len({p.name for p in self.params}) != len(self.params):
            raise IRVerificationError(f"{self.name}: two parameters share a name")
        if self.launch is not None:
            self._verify_launch()
        _Verifier(self).walk(self.body, (), top=True)
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


class _Verifier:
    """A kernel's body checked statement by statement, each by the method named for its class
    (``check_Loop``): names declared once and used in scope, stores only to outputs and inside
    constant bounds, GPU-only statements only on the GPU, and no barrier where the block's
    threads diverge."""

    def __init__(self, k: TileKernel):
        self.k, self.name, self.gpu = k, k.name, k.launch is not None
        self.names = {p.name for p in k.params}
        self.outs = {p.name for p in k.params if p.mode == "out"}
        self.sizes = {p.name: _numel(p.shape) for p in k.params}
        self.shared = {}

    def fail(self, text: str):
        raise IRVerificationError(f"{self.name}: {text}")

    def walk(self, stmts, scope, divergent=None, top=False):
        """divergent: the kind of the enclosing loop or condition whose trip count differs
        between the block's threads (grid, thread), where no barrier may stand."""
        scope = set(scope)
        for s in stmts:
            if isinstance(s, (Shared, Barrier, BlockReduce)) and not self.gpu:
                self.fail(f"{type(s).__name__} in a CPU kernel")
            if isinstance(s, (Barrier, BlockReduce, Ticket)) or (isinstance(s, Call) and self.gpu):
                if divergent:
                    self.fail(f"{type(s).__name__.lower()} inside a {divergent}, where the "
                              "block's threads diverge")
            check = getattr(self, "check_" + type(s).__name__, None)
            if check is None:
                self.fail(f"{type(s).__name__} is not a Tile IR statement")
            check(s, scope, divergent, top)

    def expr(self, e, scope):
        _check_expr(e, scope, self.names, self.name)

    def declare(self, name, scope):
        """A name new to the kernel and the scope, now in the scope."""
        if name in scope or name in self.names:
            self.fail(f"{name} is declared twice")
        scope.add(name)

    def buffer(self, name, size):
        """A buffer of the kernel's own (shared, scratch, local, workspace): stored into."""
        self.names.add(name)
        self.outs.add(name)
        self.sizes[name] = size

    def check_Loop(self, s, scope, divergent, top):
        if s.kind not in (GPU_LOOPS if self.gpu else CPU_LOOPS):
            self.fail(f"a {s.kind} loop in a {'GPU' if self.gpu else 'CPU'} kernel")
        if isinstance(s.extent, int) and s.extent < 0:
            self.fail(f"loop {s.var} has extent {s.extent}")
        if isinstance(s.extent, Expr):
            self.expr(s.extent, scope)
        if s.var in scope or s.var in self.names:
            self.fail(f"{s.var} is declared twice")
        inner = divergent or (f"{s.kind} loop" if s.kind in ("grid", "thread") else None)
        self.walk(s.body, scope | {s.var}, inner)

    def check_Shared(self, s, scope, divergent, top):
        if not top:
            self.fail(f"shared {s.name} is not declared at kernel level")
        if s.name in self.names or s.size <= 0:
            self.fail(f"bad shared buffer {s.name}")
        self.buffer(s.name, s.size)
        self.shared[s.name] = s

    def check_Barrier(self, s, scope, divergent, top):
        pass

    def check_BlockReduce(self, s, scope, divergent, top):
        self.expr(s.value, scope)
        scratch = self.shared.get(s.scratch)
        if scratch is None or scratch.dtype != s.dtype or \
                scratch.size < self.k.launch["block"] // 32 + 1:
            self.fail(f"{s.name}'s scratch {s.scratch} is not a large enough shared buffer of "
                      "its dtype")
        self.declare(s.name, scope)

    def check_Scratch(self, s, scope, divergent, top):
        if self.gpu or s.name in scope or s.name in self.names or s.size <= 0:
            self.fail(f"bad scratch {s.name}")
        self.buffer(s.name, s.size)
        self.walk(s.body, scope, divergent)

    def check_Local(self, s, scope, divergent, top):
        if s.name in scope or s.name in self.names:
            self.fail(f"{s.name} is declared twice")
        self.buffer(s.name, s.size)

    def check_Decl(self, s, scope, divergent, top):
        self.expr(s.init, scope)
        self.declare(s.name, scope)

    def check_Assign(self, s, scope, divergent, top):
        if s.name not in scope:
            self.fail(f"assigns undeclared {s.name}")
        self.expr(s.value, scope)

    def check_Store(self, s, scope, divergent, top):
        if s.buf not in self.outs:
            self.fail(f"stores to {s.buf}, not an output")
        if isinstance(s.index, Const) and not 0 <= s.index.value < self.sizes[s.buf]:
            self.fail(f"stores outside {s.buf} (index {s.index.value})")
        self.expr(s.index, scope)
        self.expr(s.value, scope)

    check_AtomicAdd = check_Store

    def check_If(self, s, scope, divergent, top):      # (a barrier under a condition may deadlock)
        self.expr(s.cond, scope)
        inner = divergent if s.uniform else divergent or "condition"
        self.walk(s.body, scope, inner)
        self.walk(s.orelse, scope, inner)

    def check_Workspace(self, s, scope, divergent, top):
        launch = self.k.launch or {}
        end = s.offset + -(-s.size * s.dtype.itemsize // 4)
        copies = launch.get("grid", 1) if s.per_block else 1
        if not self.gpu or s.name in scope or s.name in self.names or s.size <= 0 or \
                (s.per_block and end > s.per_block) or \
                s.per_block * (copies - 1) + end > launch.get("workspace", 0):
            self.fail(f"bad workspace {s.name}")
        self.buffer(s.name, s.size)

    def check_Ticket(self, s, scope, divergent, top):
        if not 0 <= s.counter < (self.k.launch or {}).get("workspace", 0):
            self.fail(f"ticket counter {s.counter} is outside the workspace")
        self.declare(s.name, scope)

    def check_VecLoad(self, s, scope, divergent, top):
        if not self.gpu or s.buf not in self.sizes or s.lanes < 1:
            self.fail(f"bad vector load {s.name} of {s.buf}")
        self.expr(s.index, scope)
        if s.name in scope or s.name in self.names:
            self.fail(f"{s.name} is declared twice")
        self.names.add(s.name)
        self.sizes[s.name] = s.lanes

    def check_VecStore(self, s, scope, divergent, top):
        if not self.gpu or s.buf not in self.outs:
            self.fail(f"vector store to {s.buf}, not an output")
        for e in (s.index, *s.values):
            self.expr(e, scope)

    def check_CheckIndex(self, s, scope, divergent, top):
        if s.name not in scope:
            self.fail(f"checks undeclared {s.name}")

    def check_Call(self, s, scope, divergent, top):
        for a in s.args:
            if isinstance(a, Addr) and a.buf is not None and a.buf not in self.names:
                self.fail(f"{s.fn} gets unknown buffer {a.buf}")
            self.expr(a, scope)


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


def _children(e) -> list:
    return _fields(e, type(e).children)


def walk_exprs(stmts):
    """Every expression in a statement list, depth first."""
    for s in stmts:
        stack = list(s.expressions())
        while stack:
            e = stack.pop()
            yield e
            stack.extend(_children(e))
        for name in s.blocks:
            yield from walk_exprs(getattr(s, name))


def all_statements(stmts):
    """Every statement, nested ones included, in order."""
    for s in stmts:
        yield s
        for name in s.blocks:
            yield from all_statements(getattr(s, name))


def _printed(stmts, depth) -> list:
    return [line for s in stmts for line in s.lines(depth)]


def substitute(stmts, values: dict) -> list:
    """The statements with each Var named in `values` replaced by that expression (a loop's
    index given a new meaning); loops and bodies are copied, the input is untouched."""
    def ex(e):
        if isinstance(e, Var):
            return values.get(e.name, e)
        changed = _replaced(e, type(e).children, ex)
        return replace(e, **changed) if changed else e

    return [replace(s, **_replaced(s, s.exprs, ex),
                    **{name: substitute(getattr(s, name), values) for name in s.blocks})
            for s in stmts]


def _replaced(node, names, ex) -> dict:
    """{field: new value} for the expression fields `names` of node, each expression mapped."""
    out = {}
    for name in names:
        v = getattr(node, name)
        if isinstance(v, tuple):
            out[name] = tuple(ex(x) if isinstance(x, Expr) else x for x in v)
        elif isinstance(v, Expr):
            out[name] = ex(v)
    return out


@dataclass
class TileProgram:
    name: str
    kernels: list
    calls: list                   # (kernel name, [buffer names]) in launch order
    buffers: list                 # the runtime buffer table (schedule Buffers, no inline ones)
    steps: list | None = None     # with control flow: the schedule's steps (Kernels and
                                  # RegionSteps), which the entry point runs in loops
    views: dict = field(default_factory=dict)   # name -> the alias, slice and inline Buffers
                                                # the steps pass (no memory of their own)

    def __str__(self):
        return "\n\n".join(str(k) for k in self.kernels) or f"// {self.name}: no kernels"

    def workspace_bases(self) -> dict:
        """GPU kernels' workspaces lie one after another, in kernel order, after the status
        word (the phases of one kernel share theirs): kernel name -> its first int."""
        return self._workspace[0]

    @functools.cached_property          # (read by every GPU run: a program's kernels are set)
    def _workspace(self):
        bases, first, n = {}, {}, 0
        for k in self.kernels:
            group = k.phase_of or k.name
            if group not in first:
                first[group] = n
                n += (k.launch or {}).get("workspace", 0)
            bases[k.name] = first[group]
        return bases, n

    @property
    def workspace(self) -> int:
        """Ints of zeroed workspace the runtime allocates after the status word."""
        return self._workspace[1]

    @functools.cached_property
    def phases(self) -> dict:
        """Schedule kernel name -> the tile kernels that run it, in launch order (itself alone,
        or its GPU phases)."""
        out: dict = {}
        for k in self.kernels:
            out.setdefault(k.phase_of or k.name, []).append(k.name)
        return out

    @property
    def flags_errors(self) -> bool:
        """Whether a kernel can store an error code in the status word (an index check, a routine
        or scratch that can fail): the GPU runtime waits to read the word back only then."""
        return any(isinstance(s, (CheckIndex, Scratch)) or (isinstance(s, Call) and s.fail_code)
                   for k in self.kernels for s in all_statements(k.body))

    def verify(self):
        known = {b.name: b for b in self.buffers}
        known.update(self.views)
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
