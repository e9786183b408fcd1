"""tessera.dist's scaling against torch.distributed (DDP on gloo) and JAX (one process, XLA's host
platform forced to 4 devices), on 1, 2 and 4 ranks, in one run:

1. a data-parallel training step (SGD, lr 0.01) of a 784-1024-1024-10 relu MLP with softmax
   cross-entropy, global batch 512: tessera under ``dist.launch`` (each rank's gradients from a
   compiled ``ts.value_and_grad`` on its part of the batch, then (a) a plain
   ``ts.collectives.all_reduce(grads, op="mean")`` or (b) ``dist.batch_mean`` over 8
   micro-batches, whose bits do not depend on the rank count); DDP on gloo under
   ``torch.multiprocessing.spawn``; JAX's ``shard_map`` with ``pmean`` under ``jit``;
2. a tensor-parallel matmul C = A @ B, A split by rows over the ranks, B whole on each: tessera's
   DTensors (``dist.shard``, ``op.matmul``; the sharded result, and the result gathered with
   ``dist.gather``), each torch rank's block product (and ``all_gather``), JAX's sharded ``jit``
   (result sharded, and replicated).

    .venv/bin/python -m benchmarks.bench_dist [--quick] [--json PATH]

Each rank count runs in its own job; inside it the cases are interleaved round by round, each
timed step preceded by a barrier; the median of the timed steps after warm-up on rank 0 is
reported. Each rank gets cores // ranks threads (at least 1), so every job uses the whole machine:
4 ranks oversubscribe 2 cores. Efficiency is measured against that limit: the same step run by
1 rank with 1 thread pinned to one core, divided by (the cores × the time). Results are checked:
one step from the common initialisation against a float64 NumPy step (loss and parameter
updates), every loss and final parameter finite, every gathered product against NumPy.
Ratios are printed and written to benchmarks/results/, never asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:            # the ranks import this module by name
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

SIZES = (784, 1024, 1024, 10)
BATCH = 512
LR = 0.01
MICRO = 8
RANKS = (1, 2, 4)
LOSS_TOL = 1e-5          # the first loss against the float64 step's, relative
STEP_TOL = 1e-2          # the parameter updates against it (see step_error)
TP_TOL = 1e-4            # the gathered product: max error / max |reference|
GOAL_AT = 2              # the goal: >= 1.2x DDP-gloo at 2 ranks
GOAL = 1.2


def settings(quick: bool) -> dict:
    return {"warmup": 2, "steps": 6, "tp_n": 1024} if quick else \
        {"warmup": 3, "steps": 20, "tp_n": 1536}


# ---- the common problem --------------------------------------------------------------------------
def init_params() -> list:
    """w1, b1, w2, b2, w3, b3 (He-normal weights, small biases), float32, seed 0."""
    g = np.random.default_rng(0)
    out = []
    for a, b in zip(SIZES[:-1], SIZES[1:]):
        out.append((g.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32))
        out.append((g.standard_normal(b) * 0.01).astype(np.float32))
    return out


def data():
    g = np.random.default_rng(1)
    return (g.standard_normal((BATCH, SIZES[0])).astype(np.float32),
            g.integers(0, SIZES[-1], BATCH).astype(np.int64))


def tp_inputs(n: int):
    g = np.random.default_rng(2)
    return (g.standard_normal((n, n)).astype(np.float32),
            g.standard_normal((n, n)).astype(np.float32))


def reference_step(params, x, y):
    """One SGD step in float64 NumPy with bench.py's hand-written backward: (loss, new
    parameters)."""
    from .bench import MLP_LR, mlp_step_np
    assert MLP_LR == LR
    out = mlp_step_np(*[p.astype(np.float64) for p in params], x.astype(np.float64), y)
    return float(out[0]), out[1:]


_REF: dict = {}                     # the float64 reference step, computed once


def step_error(loss, new_params) -> tuple[float, float]:
    """(the loss' relative error, the largest over the parameters of |update - reference
    update| / |reference update| in the Frobenius norm; the update is lr x the gradient). The
    norm, not the largest element: a pre-activation within rounding of zero takes the other
    side of the relu in float32 (a different one in each library), which moves a whole row of
    a weight's gradient by a few percent of its largest element but the norm by ~1e-3."""
    if "ref" not in _REF:
        x, y = data()
        _REF["ref"] = reference_step(init_params(), x, y)
    ref_loss, ref_new = _REF["ref"]
    err = 0.0
    for p0, p1, r in zip(init_params(), new_params, ref_new):
        d = np.asarray(p1, np.float64) - p0
        dr = r - p0
        err = max(err, float(np.linalg.norm(d - dr) / np.linalg.norm(dr)))
    return abs(float(loss) - ref_loss) / abs(ref_loss), err


def _median_ms(ts: list) -> float:
    return 1e3 * statistics.median(ts)


def _summary(ts: list) -> dict:
    return {"median_ms": _median_ms(ts), "min_ms": 1e3 * min(ts),
            "samples_ms": [round(1e3 * t, 3) for t in ts]}


def _rounds(cases: dict, warmup: int, steps: int, barrier) -> dict:
    """Every case once per round, interleaved, a barrier before each; the times after warm-up."""
    times = {k: [] for k in cases}
    for i in range(warmup + steps):
        for name, fn in cases.items():
            barrier()
            t = time.perf_counter()
            fn()
            dt = time.perf_counter() - t
            if i >= warmup:
                times[name].append(dt)
    return times


# ---- tessera: one dist.launch job per rank count -------------------------------------------------
def tessera_rank(cfg: dict):
    import tessera as ts
    from mpi4py import MPI
    from tessera import dist, nn, op

    comm = MPI.COMM_WORLD
    r, n = dist.rank(), dist.world_size()
    mesh = dist.Mesh(axes=["dp"], devices=range(n))
    flat = init_params()
    params = {"layers": [{"w": flat[i], "b": flat[i + 1]} for i in range(0, 6, 2)]}
    x, y = data()
    b = BATCH // n
    xl, yl = x[r * b:(r + 1) * b], y[r * b:(r + 1) * b]
    mlp = nn.MLP(list(SIZES), activation="relu")

    def loss_fn(p, xb, yb):
        return nn.cross_entropy(mlp(p, xb), yb)
    vg = ts.value_and_grad(loss_fn)
    opt = ts.optim.SGD(LR)
    update = ts.function(lambda g, s, p: opt.update(g, s, p))

    # rank 0 compiles (or loads from the disk cache) first; the others then load its kernels
    first_t = time.perf_counter()
    if r:
        comm.Barrier()
    _, g0 = vg(params, xl, yl)
    vg(params, x[:BATCH // MICRO], y[:BATCH // MICRO])
    update(g0, opt.init(params), params)
    if not r:
        comm.Barrier()
    first_s = time.perf_counter() - first_t

    def all_reduce_step(st):
        p, s = st
        loss, g = vg(p, xl, yl)
        g = ts.collectives.all_reduce(g, op="mean", axis="dp", mesh=mesh)
        p, s = update(g, s, p)
        return (p, s), loss

    def batch_mean_step(st):
        p, s = st
        loss, g = dist.batch_mean(lambda mb: vg(p, mb[0], mb[1]), (x, y),
                                  micro_batches=MICRO, axis="dp", mesh=mesh)
        p, s = update(g, s, p)
        return (p, s), loss

    def no_reduction_step(st):            # the bound: each rank's gradients, not reduced
        p, s = st
        loss, g = vg(p, xl, yl)
        p, s = update(g, s, p)
        return (p, s), loss

    out = {"first_call_s": first_s, "checks": {}}
    state, losses, cases = {}, {}, {}
    for name, step in (("all_reduce", all_reduce_step), ("batch_mean", batch_mean_step),
                       ("no_reduction", no_reduction_step)):
        st, loss = step((params, opt.init(params)))       # the checked first step
        if name != "no_reduction":
            loss = ts.collectives.all_reduce(np.asarray(loss), op="mean", axis="dp", mesh=mesh)
            out["checks"][name] = (float(loss), [np.asarray(a) for a in ts.pytree.leaves(st[0])])
        state[name], losses[name] = st, []

        def run(name=name, step=step):
            state[name], loss = step(state[name])
            losses[name].append(loss)
        cases[name] = run

    tp = cfg["tp_n"]
    A, B = tp_inputs(tp)
    tmesh = dist.Mesh(axes=["tp"], devices=range(n))
    Ad = dist.shard(A, dist.ShardSpec.per_dim("tp", None), tmesh)
    Bd = dist.shard(B, None, tmesh)
    op.matmul(Ad, Bd)                                     # compiles, rank 0 first
    gathered = {}

    def tp_gathered():
        gathered["C"] = dist.gather(op.matmul(Ad, Bd))
    cases["tp_sharded"] = lambda: op.matmul(Ad, Bd)
    cases["tp_gathered"] = tp_gathered

    times = _rounds(cases, cfg["warmup"], cfg["steps"], comm.Barrier)
    finite = {k: bool(all(np.isfinite(np.asarray(v)).all() for v in losses[k]) and
                      all(np.isfinite(np.asarray(a)).all() for a in ts.pytree.leaves(state[k][0])))
              for k in losses}
    if r:
        return None
    out.update(times={k: _summary(v) for k, v in times.items()}, finite=finite,
               tp_C=gathered["C"], engine=mesh.engine.name)
    return out


def run_tessera(n: int, cfg: dict, threads: int) -> dict:
    from tessera import dist
    from benchmarks import bench_dist as me        # pickled by reference: the ranks import it
    t = time.perf_counter()
    res = dist.launch(me.tessera_rank, n, cfg, threads=threads, timeout=600)[0]
    res["job_s"] = time.perf_counter() - t
    return res


# ---- PyTorch: DDP on gloo, one torch.multiprocessing.spawn job per rank count --------------------
def torch_rank(rank: int, n: int, cfg: dict, threads: int, port: int, out_path: str):
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    tdist.init_process_group("gloo", rank=rank, world_size=n)
    flat = init_params()
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    with torch.no_grad():
        for k, lin in enumerate(model[::2]):
            lin.weight.copy_(torch.from_numpy(flat[2 * k].T.copy()))
            lin.bias.copy_(torch.from_numpy(flat[2 * k + 1]))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    x, y = data()
    b = BATCH // n
    xl = torch.from_numpy(x[rank * b:(rank + 1) * b])
    yl = torch.from_numpy(y[rank * b:(rank + 1) * b])
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(xl), yl)
        loss.backward()
        opt.step()
        return loss.detach()

    t = time.perf_counter()
    loss = step()                                           # the checked first step
    first_s = time.perf_counter() - t
    tdist.all_reduce(loss, op=tdist.ReduceOp.SUM)
    check = (float(loss) / n, [a for lin in model[::2]
                               for a in (lin.weight.detach().numpy().T.copy(),
                                         lin.bias.detach().numpy().copy())])

    A, B = tp_inputs(cfg["tp_n"])
    m = cfg["tp_n"] // n
    Ab, Bt = torch.from_numpy(A[rank * m:(rank + 1) * m]), torch.from_numpy(B)
    gathered = {}

    def ddp_case():
        losses.append(step())

    def mm():
        with torch.no_grad():
            Ab @ Bt

    def mm_gather():
        with torch.no_grad():
            c = Ab @ Bt
            parts = [torch.empty_like(c) for _ in range(n)]
            tdist.all_gather(parts, c)
            gathered["C"] = torch.cat(parts)

    mm()
    times = _rounds({"ddp": ddp_case, "tp_sharded": mm, "tp_gathered": mm_gather},
                    cfg["warmup"], cfg["steps"], tdist.barrier)
    finite = bool(all(torch.isfinite(v).all() for v in losses) and
                  all(torch.isfinite(p).all() for p in model.parameters()))
    if rank == 0:
        res = {"first_call_s": first_s, "checks": {"ddp": check},
               "times": {k: _summary(v) for k, v in times.items()},
               "finite": {"ddp": finite}, "tp_C": gathered["C"].numpy()}
        Path(out_path).write_bytes(pickle.dumps(res))
    tdist.barrier()
    tdist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(n: int, cfg: dict, threads: int) -> dict:
    import torch.multiprocessing as mp
    from benchmarks import bench_dist as me
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as d:
        out = Path(d) / "rank0.pkl"
        t = time.perf_counter()
        mp.spawn(me.torch_rank, args=(n, cfg, threads, _free_port(), str(out)), nprocs=n,
                 join=True)
        res = pickle.loads(out.read_bytes())
    res["job_s"] = time.perf_counter() - t
    return res


# ---- JAX: one process, XLA's host platform forced to 4 devices (a subprocess) --------------------
def jax_child(cfg: dict, ranks, out_path: str):
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from .bench import mlp_loss_jax
    x, y = data()
    A, B = tp_inputs(cfg["tp_n"])
    flat = init_params()

    def local(ps, xb, yb):
        loss, g = jax.value_and_grad(mlp_loss_jax)(ps, xb, yb)
        g = jax.lax.pmean(g, "dp")
        return jax.lax.pmean(loss, "dp"), [p - LR * gi for p, gi in zip(ps, g)]

    res = {"devices": [str(d) for d in jax.devices()], "jax": jax.__version__, "per_n": {}}
    cases, state, losses, first = {}, {}, {}, {}
    for n in ranks:
        mesh = Mesh(np.array(jax.devices()[:n]), ("dp",))
        rep, row = NamedSharding(mesh, P()), NamedSharding(mesh, P("dp"))
        step = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp"), P("dp")),
                                     out_specs=(P(), P()), check_vma=False))
        ps = [jax.device_put(p, rep) for p in flat]
        xs, ys = jax.device_put(x, row), jax.device_put(y.astype(np.int32), row)
        t = time.perf_counter()
        loss, ps = jax.block_until_ready(step(ps, xs, ys))   # compiles; the checked first step
        first[n] = time.perf_counter() - t
        res["per_n"][n] = {"first_call_s": first[n],
                           "checks": {"jax": (float(loss), [np.asarray(p) for p in ps])}}
        state[n], losses[n] = ps, []

        def dp(n=n, step=step, xs=xs, ys=ys):
            loss, state[n] = jax.block_until_ready(step(state[n], xs, ys))
            losses[n].append(loss)
        tmesh = Mesh(np.array(jax.devices()[:n]), ("tp",))
        As = jax.device_put(A, NamedSharding(tmesh, P("tp", None)))
        Bs = jax.device_put(B, NamedSharding(tmesh, P()))
        sharded = jax.jit(jnp.matmul, out_shardings=NamedSharding(tmesh, P("tp", None)))
        whole = jax.jit(jnp.matmul, out_shardings=NamedSharding(tmesh, P()))
        jax.block_until_ready((sharded(As, Bs), whole(As, Bs)))
        res["per_n"][n]["tp_C"] = np.asarray(whole(As, Bs))
        cases[(n, "jax")] = dp
        cases[(n, "tp_sharded")] = lambda f=sharded, a=As, b=Bs: jax.block_until_ready(f(a, b))
        cases[(n, "tp_gathered")] = lambda f=whole, a=As, b=Bs: jax.block_until_ready(f(a, b))
    times = _rounds(cases, cfg["warmup"], cfg["steps"], lambda: None)
    for (n, name), ts_ in times.items():
        res["per_n"][n].setdefault("times", {})[name] = _summary(ts_)
    for n in ranks:
        res["per_n"][n]["finite"] = {"jax": bool(
            all(np.isfinite(np.asarray(v)).all() for v in losses[n]) and
            all(np.isfinite(np.asarray(p)).all() for p in state[n]))}
    Path(out_path).write_bytes(pickle.dumps(res))


def run_jax(cfg: dict, ranks, serial: bool) -> dict:
    env = dict(os.environ)
    flags = ["--xla_force_host_platform_device_count=4"]
    if serial:
        flags += ["--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1"]
    env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", "")] + flags).strip()
    env["JAX_PLATFORMS"] = "cpu"
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as d:
        out = Path(d) / "jax.pkl"
        cmd = [sys.executable, "-m", "benchmarks.bench_dist", "--jax-child", str(out),
               "--ranks", ",".join(map(str, ranks))] + (["--quick"] if cfg["quick"] else [])
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if p.returncode:
            raise RuntimeError(f"the JAX process failed: {(p.stderr or p.stdout)[-1500:]}")
        res = pickle.loads(out.read_bytes())
    res["job_s"] = time.perf_counter() - t
    res["xla_flags"] = env["XLA_FLAGS"]
    return res


# ---- the run -------------------------------------------------------------------------------------
def _pinned(fn, *args):
    """fn(*args) with this process (and so the jobs it starts) on one core, then restored."""
    if not hasattr(os, "sched_setaffinity"):
        return fn(*args)
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(old)})
    try:
        return fn(*args)
    finally:
        os.sched_setaffinity(0, old)


def _reason(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) < 600 else text[:600] + " ..."


def collect(peer: str, n, res: dict, want_tp_n: int) -> dict:
    """One peer's job result -> its row: times, first call, checks."""
    row = {"times": res["times"], "first_call_s": res.get("first_call_s"),
           "finite": res.get("finite"), "job_s": res.get("job_s"), "checks": {}}
    for name, (loss, params) in res.get("checks", {}).items():
        lerr, uerr = step_error(loss, params)
        ok = lerr < LOSS_TOL and uerr < STEP_TOL
        row["checks"][name] = {"first_loss": loss, "loss_error": lerr, "update_error": uerr,
                               "status": "ok" if ok else "MISMATCH"}
    if res.get("tp_C") is not None:
        A, B = tp_inputs(want_tp_n)
        ref = A.astype(np.float64) @ B.astype(np.float64)
        err = float(np.max(np.abs(res["tp_C"] - ref)) / np.max(np.abs(ref)))
        row["checks"]["tp"] = {"error": err, "status": "ok" if err < TP_TOL else "MISMATCH"}
    return row


def machine_info() -> dict:
    from importlib import metadata
    from benchmarks.bench import machine
    peers = {}
    for name in ("torch", "jax"):
        try:
            peers[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            peers[name] = "not installed"
    info = machine(peers)
    for name in ("mpi4py", "mpich"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = "not installed"
    return info


def slug(info: dict) -> str:
    words = [w for w in re.split(r"[^a-z0-9]+", info.get("cpu", "cpu").lower())
             if w and w not in ("amd", "intel", "r", "tm", "cpu", "processor", "core")]
    return "-".join(words[:2] + [info.get("isa_level", ""), f"{info['cores']}core"]).strip("-")


def _ms(row, peer, key):
    try:
        return row[peer]["times"][key]["median_ms"]
    except (KeyError, TypeError):
        return None


def _fmt(v, w=9):
    return f"{v:{w}.1f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"


def report(rows: dict, serial: dict, info: dict, cores: int, cfg: dict) -> list:
    """Print the tables; return the derived numbers (speed-ups, ratios, efficiencies)."""
    derived = []
    dp_cases = [("tessera all_reduce", "tessera", "all_reduce"),
                ("tessera batch_mean", "tessera", "batch_mean"),
                ("(tessera unreduced)", "tessera", "no_reduction"),
                ("torch DDP gloo", "torch", "ddp"), ("jax shard_map", "jax", "jax")]
    tp_cases = [("tessera sharded", "tessera", "tp_sharded"),
                ("tessera +gather", "tessera", "tp_gathered"),
                ("torch block", "torch", "tp_sharded"),
                ("torch +all_gather", "torch", "tp_gathered"),
                ("jax sharded", "jax", "tp_sharded"), ("jax replicated", "jax", "tp_gathered")]
    print(f"\n{info.get('cpu', '?')}, {cores} cores ({', '.join(info.get('simd', []))}); "
          f"tessera built for {info.get('isa_level', '?')}; torch {info.get('torch')}; "
          f"jax {info.get('jax')}; mpi4py {info.get('mpi4py')} (mpich {info.get('mpich')})")
    print(f"threads per rank: cores // ranks (at least 1); {max(RANKS)} ranks on {cores} cores "
          f"OVERSUBSCRIBE the machine (two processes per core)." if max(RANKS) > cores else "")
    print(f"efficiency: the 1-rank, 1-thread time pinned to one core / ({cores} cores x the "
          f"time): 100% = the {cores}-core machine's limit. At 1 rank the process already has "
          f"all {cores} cores, so the speed-up over 1 rank is at most what threads leave on the "
          f"table, not the rank count.")
    print("(tessera unreduced): the same step with each rank's gradients left unreduced, the "
          "bound; the gap to tessera all_reduce is the collective's cost.")
    for title, cases, extra in (
            (f"data-parallel SGD step, MLP {'-'.join(map(str, SIZES))}, global batch {BATCH} "
             f"(ms, median of {cfg['steps']} after {cfg['warmup']} warm-up)", dp_cases, True),
            (f"tensor-parallel matmul {cfg['tp_n']}^3, A split by rows (ms)", tp_cases, False)):
        print(f"\n{title}")
        head = f"{'':22s}{'1 core':>9s}" + "".join(f"{f'{n} rank' + 's' * (n > 1):>9s}"
                                                    for n in RANKS) + \
            "".join(f"{f'x1 @{n}':>8s}" for n in RANKS[1:]) + \
            "".join(f"{f'eff @{n}':>8s}" for n in RANKS)
        print(head)
        print("-" * len(head))
        for label, peer, key in cases:
            base = _ms(serial, peer, key)
            t = {n: _ms(rows[n], peer, key) for n in RANKS}
            line = f"{label:22s}{_fmt(base)}" + "".join(_fmt(t[n]) for n in RANKS)
            d = {"case": label, "peer": peer, "key": key, "one_core_ms": base,
                 "ms": t, "speedup_vs_1_rank": {}, "efficiency": {}}
            for n in RANKS[1:]:
                s = t[1] / t[n] if t[1] and t[n] else None
                d["speedup_vs_1_rank"][n] = s
                line += f"{s:7.2f}x" if s else f"{'-':>8s}"
            for n in RANKS:
                e = base / (min(cores, n * max(1, cores // n)) * t[n]) if base and t[n] else None
                d["efficiency"][n] = e
                line += f"{100 * e:7.0f}%" if e else f"{'-':>8s}"
            print(line)
            derived.append(d)
        # ratios: the peer's time / tessera's (above 1: tessera faster)
        pairs = [("torch DDP gloo", "torch", "ddp"), ("jax shard_map", "jax", "jax")] if extra \
            else [("torch", "torch", None), ("jax", "jax", None)]
        ours = [c for c in cases if c[1] == "tessera" and c[2] != "no_reduction"]
        for label, peer, key in ours:
            for plabel, p, pkey in pairs:
                pk = pkey or key
                vals = []
                for n in RANKS:
                    a, b = _ms(rows[n], "tessera", key), _ms(rows[n], p, pk)
                    vals.append(b / a if a and b else None)
                derived.append({"ratio": f"{plabel} / {label}", "by_ranks": dict(zip(RANKS, vals))})
                print(f"  {plabel} / {label}: " + ", ".join(
                    f"{v:.2f}x @{n}" if v else f"- @{n}" for n, v in zip(RANKS, vals)))
        if extra:
            for label, peer, key in ours:
                a, b = _ms(rows[GOAL_AT], "tessera", key), _ms(rows[GOAL_AT], "torch", "ddp")
                if a and b:
                    verdict = "met" if b / a >= GOAL else "no"
                    print(f"  goal >= {GOAL}x DDP-gloo at {GOAL_AT} ranks, {label}: "
                          f"{b / a:.2f}x ({verdict})")
    disturbed = [f"{peer} {n if n == '1 core' else f'@{n}'} ({100 * r['others_cpu_share']:.0f}%)"
                 for n, row in list(rows.items()) + [("1 core", serial)]
                 for peer, r in row.items() if (r.get("others_cpu_share") or 0) > 0.05]
    if disturbed:
        print("\n!! other processes took cores during these jobs (their times are disturbed): "
              + ", ".join(disturbed))
    print(f"\nchecks: one step from the common initialisation against float64 NumPy (loss "
          f"within {LOSS_TOL:g}, updates within {STEP_TOL:g} in norm), every loss and final "
          f"parameter finite, the gathered product against NumPy (within {TP_TOL:g}):")
    for n, row in list(rows.items()) + [("1 core", serial)]:
        where = f"{n} rank{'s' if n != 1 else ''}" if n != "1 core" else n
        for peer, r in row.items():
            if "status" in r:
                print(f"  {where} {peer}: {r['status']}")
                continue
            bits = []
            for k, c in r["checks"].items():
                if "error" in c:
                    bits.append(f"{k} {c['status']} ({c['error']:.1e})")
                else:
                    bits.append(f"{k} {c['status']} (loss {c['loss_error']:.1e}, updates "
                                f"{c['update_error']:.1e})")
            bad = [k for k, ok in (r.get("finite") or {}).items() if not ok]
            bits.append("finite" if not bad else f"NON-FINITE: {', '.join(bad)}")
            print(f"  {where} {peer}: " + "; ".join(bits))
    return derived


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_dist")
    ap.add_argument("--quick", action="store_true",
                    help="6 timed steps after 2 warm-up, a 1024^3 matmul (instead of 20 after "
                         "3, and 1536^3)")
    ap.add_argument("--json", help="where to write the results (default "
                                   "benchmarks/results/<date>-<machine>-dist.json)")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="before each job, wait up to S seconds for other processes to leave "
                         "the cores (under 10%% of them for 2 s)")
    ap.add_argument("--jax-child", help=argparse.SUPPRESS)
    ap.add_argument("--ranks", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cfg = dict(settings(args.quick), quick=args.quick)
    if args.jax_child:
        jax_child(cfg, [int(r) for r in args.ranks.split(",")], args.jax_child)
        return 0

    from benchmarks.bench import cpu_snapshot, others_cpu_share, wait_quiet
    info = machine_info()
    cores = os.cpu_count() or 1
    t0, cpu0 = time.perf_counter(), cpu_snapshot()
    rows = {n: {} for n in RANKS}
    serial: dict = {}

    def job(label, run):
        """run() (a job) with the share of the cores other processes took meanwhile."""
        print(f"[bench_dist] {label} ...", file=sys.stderr, flush=True)
        if args.wait_quiet > 0:
            wait_quiet(args.wait_quiet)
        a = cpu_snapshot()
        res = run()
        return res, others_cpu_share(a, cpu_snapshot())

    for n in RANKS + ("1 core",):
        where = serial if n == "1 core" else rows[n]
        for peer, run in (("tessera", run_tessera), ("torch", run_torch)):
            if n == "1 core":
                go = lambda run=run: _pinned(run, 1, cfg, 1)          # noqa: E731
            else:
                go = lambda run=run, n=n: run(n, cfg, max(1, cores // n))   # noqa: E731
            try:
                res, others = job(f"{peer}, {n if n == '1 core' else f'{n} ranks'}", go)
                where[peer] = dict(collect(peer, n, res, cfg["tp_n"]), others_cpu_share=others)
            except Exception as e:                          # noqa: BLE001
                where[peer] = {"status": f"error ({_reason(e)})",
                               "traceback": traceback.format_exc()}
    for ranks, serial_run in ((RANKS, False), ((1,), True)):
        try:
            res, others = job(f"jax, {'1 core' if serial_run else 'devices ' + str(RANKS)}",
                              lambda: _pinned(run_jax, cfg, ranks, True) if serial_run
                              else run_jax(cfg, ranks, False))
            info.setdefault("jax_run", {"devices": res["devices"], "xla_flags": res["xla_flags"]})
            for n in ranks:
                row = collect("jax", n, dict(res["per_n"][n], job_s=res["job_s"]), cfg["tp_n"])
                (serial if serial_run else rows[n])["jax"] = dict(row, others_cpu_share=others)
        except Exception as e:                              # noqa: BLE001
            for n in ranks:
                (serial if serial_run else rows[n])["jax"] = {
                    "status": f"error ({_reason(e)})", "traceback": traceback.format_exc()}
    info["load_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    info["others_cpu_share"] = others_cpu_share(cpu0, cpu_snapshot())
    derived = report(rows, serial, info, cores, cfg)
    if info["others_cpu_share"] is not None and info["others_cpu_share"] > 0.05:
        print(f"!! other processes used {100 * info['others_cpu_share']:.0f}% of the cores "
              "during the run: a quiet machine gives steadier numbers")
    out = Path(args.json) if args.json else RESULTS / (
        f"{info['date'][:10]}-{slug(info)}-dist{'-quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": info, "quick": args.quick, "config": cfg,
        "problem": {"mlp": SIZES, "global_batch": BATCH, "optimizer": f"SGD lr {LR}",
                    "loss": "softmax cross-entropy", "micro_batches": MICRO,
                    "tp": f"C = A @ B, {cfg['tp_n']}^3 float32, A split by rows",
                    "threads_per_rank": {n: max(1, cores // n) for n in RANKS}},
        "wall_s": time.perf_counter() - t0,
        "results": {str(n): rows[n] for n in RANKS}, "one_core": serial,
        "derived": derived}, indent=1, default=str, ensure_ascii=False) + "\n")
    print(f"\nresults: {out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
