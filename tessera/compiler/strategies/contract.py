"""contract: a matmul with its elementwise epilogue (scale, bias, activation, residual).

The contraction reads its operands from memory, a view of one (x @ w.T) in place. A float
product is a fixed grid of (batch, row tile, column tile) tasks, each one call of the GEMM
routine (routines/c_gemm.py on the CPU: packed panels, a register-tiled micro-kernel;
routines/gpu_gemm.py on GPUs: a block's tile, tensor cores where the dtype has them) and then
the epilogue over the finished tile while it is in cache. The grid depends on the shapes and
knobs only, never on the thread count. The exact int32 product of 8-bit matrices
(matmul_integer) runs the same grid over the int8 GEMM routine (routines/gemm_i8.c) on the CPU;
other integer products are plain loops with no epilogue.
"""
from __future__ import annotations

from types import SimpleNamespace

from ... import dtypes as dt
from ...ops import registry as R
from ...runtime import targets
from ..dynamic import representative
from ..emit import (Emitter, Names, batch_strides, contiguous, grid_from_cpu_nests, idx_div,
                    idx_min, idx_mod, launch_of, loop_nest, operand, read, unflatten)
from ..groups import Group, identity_map, is_elementwise, is_view
from ..schedule_ir import Kernel
from ..tile_ir import (Addr, Barrier, Bin, Call, Const, Decl, Load, Loop, Store, Var, idx_add,
                       idx_mul, linear)
from .base import PARALLEL_MIN_FLOPS, Strategy, register
from .routines import c_gemm, gpu_gemm

GPU_MIN_TILE = 16


def is_contraction(n) -> bool:
    return isinstance(n.opdef.lowering, R.Contract)


def gpu_routine_takes(c) -> bool:
    """Whether the GPU's GEMM routine computes contraction node c (float operands of the
    product's dtype); the others are plain loops."""
    return c.out.type.dtype.is_float and c.op != "matmul_int8_weight"


def routine_dtype(c) -> str | None:
    """The GEMM routine's dtype for contraction node c on the CPU: the product's ("f32",
    "bf16"), the operand pair's for 8-bit integers ("i8u8") and int8 weights ("f32i8"), None
    for plain loops."""
    if c.op == "matmul_int8_weight":
        return "f32i8"
    if c.out.type.dtype.is_float:
        return c.out.type.dtype.short
    if c.op == "matmul_integer":
        return "".join(v.type.dtype.short for v in c.inputs)
    return None


class ContractStrategy(Strategy):
    name = "contract"
    knobs = ("tile_m", "tile_n", "tile_k")
    aliases = {"BM": "tile_m", "BN": "tile_n", "BK": "tile_k"}
    routines = {"gemm": "ts_gemm_tile_{S}"}

    # -- fusion ----------------------------------------------------------------------------------
    def claims(self, n) -> bool:
        return is_contraction(n)

    def start(self, n) -> Group:
        grp = super().start(n)
        grp.anchor = n
        return grp

    def absorb_operand(self, grp, p) -> bool:
        return is_view(p)

    def adopt(self, grp, p, m) -> bool:
        """A pointwise group whose producer is a float contraction (a node this strategy
        claims) of its domain becomes the contraction's epilogue."""
        if grp.kind != "pointwise" or not self.claims(p) or grp.stores:
            return False     # (the GEMM epilogue writes one output)
        shape = tuple(p.out.type.shape)
        if shape != grp.domain or m != identity_map(shape) or not p.out.type.dtype.is_float:
            return False
        if grp.root.out.type.dtype != p.out.type.dtype:
            return False     # the product is accumulated in the output buffer: same type
        if any(n is not p and not (is_elementwise(n) or is_view(n)) for n in grp.nodes):
            return False
        grp.kind, grp.anchor = self.name, p
        grp.maps[p.out.id] = m
        return True

    def takes_as_epilogue(self, p, users) -> bool:
        """Could p end a matmul's epilogue: a chain of single-use elementwise nodes back to a
        float contraction of p's shape and dtype (what adopt will take)?"""
        stack = [p]
        while stack:
            n = stack.pop()
            for v in n.inputs:
                u = v.node
                if u is None or u.op == "const" or len(users.get(v.id, [])) != 1:
                    continue
                if self.claims(u):
                    if tuple(u.out.type.shape) == tuple(p.out.type.shape) and \
                            u.out.type.dtype == p.out.type.dtype and u.out.type.dtype.is_float:
                        return True
                elif is_elementwise(u):
                    stack.append(u)
        return False

    # -- cost and knobs --------------------------------------------------------------------------
    def node_flops(self, n) -> int:
        return 2 * n.out.type.numel() * n.inputs[0].type.shape[-1]

    def cpu_knobs(self, k) -> dict:
        knobs = {"parallel": representative(k.flops) >= PARALLEL_MIN_FLOPS, "simd": True}
        d = routine_dtype(k.group.anchor)
        if d is not None:                  # (16-bit products run the float32 routine's tiles)
            knobs.update(gemm_tiles(k.group.anchor, "i8" if d in c_gemm.INT8_PAIRS
                                    else k.output.type.dtype.compute.short))
        return knobs

    def gpu_knobs(self, k, target) -> dict:
        anchor = k.group.anchor
        if not gpu_routine_takes(anchor):
            return super().gpu_knobs(k, target)
        tm, tn, tk, threads = gpu_gemm.DEFAULT_KNOBS[targets.of(target).knob_table][
            anchor.inputs[0].type.dtype.short]
        shape = anchor.out.type.shape
        # a tile no larger than the matrix needs, in powers of two, still one element or more
        # per thread
        while tm > GPU_MIN_TILE and tm >= 2 * shape[-2] and tm * tn >= 2 * threads:
            tm //= 2
        while tn > GPU_MIN_TILE and tn >= 2 * shape[-1] and tm * tn >= 2 * threads:
            tn //= 2
        return {"tile_m": tm, "tile_n": tn, "tile_k": tk, "threads": threads}

    def op_knobs(self, grp) -> dict:
        tile = grp.anchor.attrs.get("tile_shape")    # op.matmul(..., tile_shape=(BM, BN, BK))
        return dict(zip(("tile_m", "tile_n", "tile_k"), tile)) if tile else {}

    def user_knobs(self, schedule) -> dict:
        out = super().user_knobs(schedule)
        if schedule.block is not None:
            out["tile_m"], out["tile_n"] = schedule.block[:2]
            if len(schedule.block) == 3:
                out["tile_k"] = schedule.block[2]
        return out

    def space(self, k) -> dict:
        if "tile_m" not in k.knobs:
            return {}
        return {"tile_m": [48, 96, 192, 256, 384], "tile_n": [64, 128, 256, 512, 1024],
                "tile_k": [128, 256, 512]}

    def invalid(self, k, knobs) -> str | None:
        if "tile_m" not in knobs:
            return None
        shape = k.group.anchor.out.type.shape
        M, N, K = shape[-2], shape[-1], k.group.anchor.inputs[0].type.shape[-1]
        # a tile at least twice the matrix is the matrix: keep only the smallest such size
        for name, size, step in (("tile_m", M, 6), ("tile_n", N, 32), ("tile_k", K, 128)):
            if knobs[name] >= 2 * max(size, step) and knobs[name] != k.knobs.get(name):
                return f"{name}={knobs[name]} exceeds the matrix"
        return None

    # -- lowering and routines -------------------------------------------------------------------
    def lower_cpu(self, k, code):
        if routine_dtype(k.group.anchor) is not None:
            return lower_gemm_tiles(k)
        return lower_contract_loops(k)

    def lower_gpu(self, k, code, target, knobs):
        if not gpu_routine_takes(k.group.anchor):
            return grid_from_cpu_nests(lower_contract_loops(k), knobs)
        return gpu_contract(k, code, target, knobs)

    def c_routine(self, name, dtype):
        if dtype in c_gemm.INT8_PAIRS:
            return c_gemm.int8_gemm_source(dtype)
        if dtype == "f32i8":
            return c_gemm.int8_weight_gemm_source()
        return c_gemm.gemm_source(dtype)

    def c_half_routine(self, name):
        return c_gemm.HALF_ROUTINE

    def gpu_routine(self, lang, name, dtype, sizes):
        if ">" in dtype:        # "bf16>f32": 16-bit operands into f32 (a tile kernel's acc)
            src, out = dtype.split(">")
            return list(gpu_gemm.mma_routine(src, *sizes, out=out)[1])
        return list(gpu_gemm.gemm_routine(lang, dtype, *sizes)[1])


register(ContractStrategy())


def gemm_tiles(c, dtype_short: str) -> dict:
    """Task tiles for a matmul on the CPU (task_tiles of its shapes)."""
    shape = [representative(d) for d in c.out.type.shape]     # (a dynamic size: its bucket's)
    batch = 1
    for d in shape[:-2]:
        batch *= d
    return task_tiles(shape[-2], shape[-1], batch, dtype_short)


def task_tiles(M: int, N: int, batch: int, dtype_short: str) -> dict:
    """Task tiles of `batch` M x N products on the CPU: the measured best, halved (columns
    first) while there are fewer than MIN_TASKS tasks, then evened out (even_tile: 784 rows in
    256s were three tiles and one of 16, and a thread given two of those sat idle a quarter of
    the product's time; now 200 x 3 + 184).
    Shapes alone decide, never the thread count."""
    mt, nt, kc = c_gemm.DEFAULT_TILE[dtype_short]
    MR = c_gemm.MR
    least_n = 256 if M == 1 else 64     # a row streams B: long runs of each row per task
    while batch * -(-M // mt) * -(-N // nt) < c_gemm.MIN_TASKS and (nt > least_n or mt > 4 * MR):
        if nt > least_n and (nt >= mt or mt <= 4 * MR):
            nt //= 2
        else:
            mt //= 2
    return {"tile_m": even_tile(M, mt, 8), "tile_n": even_tile(N, nt, 32), "tile_k": kc}


def even_tile(size: int, tile: int, step: int) -> int:
    """The tile that cuts `size` into as many tiles as `tile` does, all of one size but the
    last, a multiple of `step` (rows: the micro-kernels' 8 or fewer; columns: their 32-column
    panels), or `tile` where that is no smaller."""
    size = max(size, 1)
    if tile >= size:
        return size
    tiles = -(-size // tile)
    share = -(-size // tiles)             # each tile's share, rounded up
    even = -(-share // step) * step       # to a whole step
    return even if even < tile and -(-size // even) == tiles else tile


def contract_operands(k: Kernel):
    """Per operand: buffer, offset, per-batch-axis strides (0 where broadcast), row and column
    strides; plus M, N, K and the output's batch shape."""
    c = k.group.anchor
    out = list(c.out.type.shape)
    batch = out[:-2]
    ops = []
    for v in c.inputs:
        b, off, st = operand(k, v)
        ops.append((b, off, batch_strides(list(v.type.shape), st, batch), st[-2], st[-1]))
    M, K_ = c.inputs[0].type.shape[-2], c.inputs[0].type.shape[-1]
    return ops, M, out[-1], K_, batch


def lower_gemm_tiles(k: Kernel):
    """Float and 8-bit integer matmuls: a fixed grid of (batch, row tile, column tile) tasks,
    each one call of the packed GEMM routine and then the epilogue over the finished tile while
    it is in cache. The grid depends on the shapes and knobs only, never on the thread count."""
    names = Names()
    em = Emitter(k, names)
    grp = k.group
    d = routine_dtype(grp.anchor)
    task = gemm_task(k, em, k.knobs["tile_m"], k.knobs["tile_n"])
    body = task.decls + [Call(f"ts_gemm_tile_{d}", task.args + (Const(k.knobs["tile_k"]),),
                              f"gemm:{d}")]
    if grp.root is not grp.anchor:
        ii, jj = names("i"), names("j")
        epi = Loop(jj, task.nt, "vector" if k.knobs.get("simd") else "serial")
        point = task.point(Var(ii), Var(jj))
        value = em.value(grp.root.out, grp.maps[grp.root.out.id], epi.body, point)
        epi.body.append(Store(k.output.name, em.out_index(point), value))
        body.append(Loop(ii, task.mt, "serial", [epi]))
    return [Loop(task.var, task.tasks, "parallel" if k.knobs.get("parallel") else "serial", body)]


def gemm_task(k: Kernel, em: Emitter, tile_m: int, tile_n: int) -> SimpleNamespace:
    """One task of a float matmul's grid of (batch, row tile, column tile) tasks: its variable
    `var` over `tasks`, the statements `decls` that place its tile (i0, j0 and the tile's size
    mt x nt), the routine's operands `args` (A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, K, mt, nt)
    and `point(ii, jj)`, the Emitter's loop point of tile element (ii, jj). Shared by every
    target (the CPU's packed routine, a GPU block's)."""
    names = em.names
    ((A, a_off, a_b, a_rs, a_cs), (B, b_off, b_b, b_rs, b_cs)), M, N, K_, batch = \
        contract_operands(k)
    em.loops = [[a] for a in range(len(k.group.domain))]
    MT, NT = min(tile_m, max(M, 1)), min(tile_n, max(N, 1))
    tm, tn = -(-M // MT), -(-N // NT)
    nb = 1
    for e in batch:
        nb *= e
    t = names("task")
    bidx = unflatten(idx_div(Var(t), tm * tn), batch) if batch else []
    i0, j0, mt, nt = names("i0"), names("j0"), names("mt"), names("nt")
    rest = idx_mod(Var(t), tm * tn)
    decls = [Decl(i0, dt.int64, idx_mul(idx_div(rest, tn), Const(MT))),
             Decl(j0, dt.int64, idx_mul(idx_mod(rest, tn), Const(NT))),
             Decl(mt, dt.int64, idx_min(Const(MT), Bin("-", Const(M), Var(i0)))),
             Decl(nt, dt.int64, idx_min(Const(NT), Bin("-", Const(N), Var(j0))))]
    abase = idx_add(linear(bidx, a_b, a_off), idx_mul(Var(i0), Const(a_rs)))
    bbase = idx_add(linear(bidx, b_b, b_off), idx_mul(Var(j0), Const(b_cs)))
    obase = linear(bidx, contiguous(batch + [M, N])[:-2])
    cbase = idx_add(obase, idx_add(idx_mul(Var(i0), Const(N)), Var(j0)))
    args = (Addr(A.name, abase), Const(a_rs), Const(a_cs), Addr(B.name, bbase), Const(b_rs),
            Const(b_cs), Addr(k.output.name, cbase), Const(N), Const(K_), Var(mt), Var(nt))

    def point(ii, jj):
        return {**{q: bidx[q] for q in range(len(batch))},
                len(batch): idx_add(Var(i0), ii), len(batch) + 1: idx_add(Var(j0), jj)}
    return SimpleNamespace(var=t, tasks=nb * tm * tn, decls=decls, args=args, point=point,
                 mt=Var(mt), nt=Var(nt), tile=(MT, NT))


def lower_contract_loops(k: Kernel):
    """Products no routine computes: plain loops, then the epilogue of a float one (fusion gives
    no integer product an epilogue)."""
    names = Names()
    em = Emitter(k, names)
    ((A, a_off, a_b, a_rs, a_cs), (B, b_off, b_b, b_rs, b_cs)), M, N, K_, batch = \
        contract_operands(k)
    em.loops = [[a] for a in range(len(k.group.domain))]
    d = k.output.type.dtype
    par = bool(k.knobs.get("parallel"))
    bl, binner, bidx = loop_nest(em, range(len(batch)), par, False)
    bvars = [bidx[q] for q in range(len(batch))]
    abase = linear(bvars, a_b, a_off)
    bbase = linear(bvars, b_b, b_off)
    obase = linear(bvars, contiguous(batch + [M, N])[:-2])
    i, kk, j, j2, av = names("i"), names("k"), names("j"), names("j"), names("a")
    orow = idx_add(obase, idx_mul(Var(i), Const(N)))
    simd = "vector" if k.knobs.get("simd") else "serial"
    row = Loop(i, M, "parallel" if par and not batch else "serial", [
        Loop(j, N, simd, [Store(k.output.name, idx_add(orow, Var(j)), Const(0, d))]),
        Loop(kk, K_, "serial", [
            Decl(av, d, read(A, idx_add(idx_add(abase, idx_mul(Var(i), Const(a_rs))),
                                        idx_mul(Var(kk), Const(a_cs))))),
            Loop(j2, N, simd, [Store(k.output.name, idx_add(orow, Var(j2)), Bin(
                "+", Load(k.output.name, idx_add(orow, Var(j2))),
                Bin("*", Var(av), read(B, idx_add(idx_add(bbase, idx_mul(Var(kk), Const(b_rs))),
                                                  idx_mul(Var(j2), Const(b_cs)))))))])])])
    grp = k.group
    if grp.root is not grp.anchor:      # (the int8-weight product's epilogue, on a GPU)
        j3 = names("j")
        epi = Loop(j3, N, "serial")
        point = {**{q: bvars[q] for q in range(len(batch))}, len(batch): Var(i),
                 len(batch) + 1: Var(j3)}
        value = em.value(grp.root.out, grp.maps[grp.root.out.id], epi.body, point)
        epi.body.append(Store(k.output.name, em.out_index(point), value))
        row.body.append(epi)
    if binner is None:
        return [row]
    binner.append(row)
    return bl


def gpu_contract(k: Kernel, code, target, knobs):
    names = Names()
    em = Emitter(k, names)
    grp = k.group
    threads = knobs["threads"]
    tiles = knobs["tile_m"], knobs["tile_n"], knobs["tile_k"]
    task = gemm_task(k, em, *tiles[:2])     # (the routine gets the knobs' tile: mt <= tile_m)
    d = grp.anchor.inputs[0].type.dtype.short
    fn, _ = gpu_gemm.gemm_routine(targets.of(target).language, d, *tiles, threads)
    key = ":".join(map(str, ("gemm", d, *tiles, threads)))
    body = task.decls + [Call(fn, task.args, key),
                         Barrier()]         # the block's raw tile is visible to all its threads
    if grp.root is not grp.anchor:
        e = names("e")
        epi = Loop(e, Bin("*", task.mt, task.nt), "thread")
        point = task.point(Bin("/", Var(e), task.nt), Bin("%", Var(e), task.nt))
        value = em.value(grp.root.out, grp.maps[grp.root.out.id], epi.body, point)
        epi.body.append(Store(k.output.name, em.out_index(point), value))
        body.append(epi)
    return [Loop(task.var, task.tasks, "block", body)], launch_of(task.tasks, threads, per_block=True)
