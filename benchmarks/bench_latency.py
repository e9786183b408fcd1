"""What a notebook user feels besides throughput, in one run (issue 22's latency goals):

    .venv/bin/python -m benchmarks.bench_latency [--quick] [--json PATH]

1. **A warm call** of a tiny function (`x * 2 + 1` on 8 floats): tessera against jax.jit,
   PyTorch eager and NumPy, median over many calls. Goal: at most 8 µs.
2. **A cold compile** of attention (B=2, H=4, S=128, D=64) and of the MLP training step
   (784-512-512-10, cross-entropy, gradients and an SGD update, batch 256: `make bench`'s
   functions, benchmarks/bench.py) with the routine libraries
   already built (a fresh cache otherwise): the first call's time, against jax.jit's and
   torch.compile's first calls. Goals: 300 ms and 600 ms.
3. **Calls at new sizes**: two functions, an MLP training step (784-256-256-10, loss and
   gradients) and a row function (layernorm then softmax over 1024 columns), called once at each
   of the same random batch sizes (1 to 512), in the same order, by: tessera with
   `dynamic=("B",)` (compiler/dynamic.py), tessera specialising every size (the default),
   jax.jit (which traces and compiles every shape), torch.compile with dynamic=True (one compile
   with symbolic sizes, then guards) and PyTorch eager (which compiles nothing: the floor).
   Reported per implementation: the total seconds over the sizes, the first call, the median of
   the later calls, and for tessera the C compiles run and the shape-generic libraries made; a
   warm call at the last size after. Goal: a call at a new batch size costs no compile.

The disk caches start empty (tessera's in a temporary directory), so a compile is a compile.
Part 2 runs last: torch.compile's first call of a function is much shorter once it has
compiled a similar one in the process (part 2's peers get that advantage, not part 3's).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import tessera as ts
from tessera import Tensor, op

RESULTS = Path(__file__).resolve().parent / "results"
COLS, HIDDEN = 1024, 256


def sizes(quick: bool, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [int(b) for b in rng.choice(np.arange(1, 513), size=8 if quick else 24, replace=False)]


def tessera_functions(dynamic: bool):
    def loss(p, x, y):
        h = op.relu(x @ p["w1"] + p["b1"])
        h = op.relu(h @ p["w2"] + p["b2"])
        z = h @ p["w3"] + p["b3"]
        return op.mean((z - y) * (z - y))

    def step(p, x: Tensor["B", 784], y: Tensor["B", 10]):
        return ts.value_and_grad(loss)(p, x, y)

    def rows(x: Tensor["B", COLS], g: Tensor[COLS]):
        return op.softmax(op.layernorm(x) * g)
    kw = {"dynamic": ("B",)} if dynamic else {}
    return ts.function(step, **kw), ts.function(rows, **kw)


def params(rng):
    def w(*s):
        return (rng.standard_normal(s) * 0.05).astype(np.float32)
    return {"w1": w(784, HIDDEN), "b1": w(HIDDEN), "w2": w(HIDDEN, HIDDEN), "b2": w(HIDDEN),
            "w3": w(HIDDEN, 10), "b3": w(10)}


def inputs(rng, b):
    return (rng.standard_normal((b, 784)).astype(np.float32),
            rng.standard_normal((b, 10)).astype(np.float32),
            rng.standard_normal((b, COLS)).astype(np.float32))


# ---- peers ------------------------------------------------------------------------------------------
def jax_functions():
    import jax
    import jax.numpy as jnp

    def loss(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        h = jax.nn.relu(h @ p["w2"] + p["b2"])
        z = h @ p["w3"] + p["b3"]
        return jnp.mean((z - y) ** 2)

    def rows(x, g):
        m = x.mean(-1, keepdims=True)
        n = (x - m) / jnp.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g
        return jax.nn.softmax(n, axis=-1)
    step = jax.jit(jax.value_and_grad(loss))
    rows = jax.jit(rows)
    return (lambda p, x, y: jax.block_until_ready(step(p, x, y)),
            lambda x, g: jax.block_until_ready(rows(x, g)))


def torch_functions(compiled: bool):
    import torch

    def step(p, x, y):
        p = {k: v.requires_grad_() for k, v in p.items()}
        h = torch.relu(x @ p["w1"] + p["b1"])
        h = torch.relu(h @ p["w2"] + p["b2"])
        z = h @ p["w3"] + p["b3"]
        loss = ((z - y) ** 2).mean()
        return loss, torch.autograd.grad(loss, list(p.values()))

    def rows(x, g):
        return torch.softmax(torch.nn.functional.layer_norm(x, (COLS,)) * g, -1)
    if compiled:
        step, rows = (torch.compile(step, dynamic=True), torch.compile(rows, dynamic=True))

    def run_step(p, x, y):
        return step({k: torch.from_numpy(v.copy()) for k, v in p.items()},
                    torch.from_numpy(x), torch.from_numpy(y))

    def run_rows(x, g):
        with torch.no_grad():
            return rows(torch.from_numpy(x), torch.from_numpy(g))
    return run_step, run_rows


def implementations(peers: set) -> dict:
    out = {"tessera dynamic": lambda: tessera_functions(True),
           "tessera specialised": lambda: tessera_functions(False)}
    if "jax" in peers:
        out["jax.jit"] = jax_functions
    if "torch" in peers:
        out["torch.compile dynamic"] = lambda: torch_functions(True)
        out["torch eager"] = lambda: torch_functions(False)
    return out


def available() -> set:
    out = set()
    for name in ("jax", "torch"):
        try:
            __import__(name)
            out.add(name)
        except ImportError:
            pass
    return out


# ---- 1. a warm call -------------------------------------------------------------------------------
def warm_calls(peers: set, n: int) -> dict:
    """Median µs of a call of x * 2 + 1 on 8 floats, after warm-up, per implementation."""
    x = np.arange(8, dtype=np.float32)
    calls = {"tessera": ts.function(lambda a: a * 2.0 + 1.0), "numpy": lambda a: a * 2.0 + 1.0}
    if "jax" in peers:
        import jax
        jitted = jax.jit(lambda a: a * 2.0 + 1.0)
        xj = jax.numpy.asarray(x)
        calls["jax.jit"] = lambda a: jitted(xj).block_until_ready()
    if "torch" in peers:
        import torch
        xt = torch.from_numpy(x)
        calls["torch eager"] = lambda a: xt * 2.0 + 1.0
    out = {}
    for name, call in calls.items():
        for _ in range(200):
            call(x)
        times = []
        for _ in range(n):
            t = time.perf_counter_ns()
            for _ in range(100):
                call(x)
            times.append((time.perf_counter_ns() - t) / 100 / 1e3)
        out[name] = round(float(np.median(times)), 2)
    return out


# ---- 2. a cold compile ----------------------------------------------------------------------------
def cold_compiles(peers: set) -> dict:
    """The first call's ms of `make bench`'s attention (at B=2, H=4, S=128) and MLP step
    (benchmarks/bench.py: each a new function here), routine libraries built, for tessera,
    jax.jit and torch.compile."""
    from . import bench
    rng = np.random.default_rng(3)
    qkv = [rng.standard_normal((2, 4, 128, 64)).astype(np.float32) for _ in range(3)]
    step = bench.mlp_inputs(rng, quick=False)
    # the routine libraries (GEMM, attention), compiled once per machine, built first
    ts.function(bench.attention.fn)(*[a[:1, :1, :16] for a in qkv])
    ts.function(bench.matmul.fn)(qkv[0][0, 0], qkv[0][0, 0].T)

    def first_call(f, *args):
        t = time.perf_counter()
        f(*args)
        return round((time.perf_counter() - t) * 1e3, 1)
    out = {"tessera": {"attention_ms": first_call(ts.function(bench.attention.fn), *qkv),
                       "mlp_step_ms": first_call(ts.function(bench.mlp_step.fn), *step)}}
    if "jax" in peers:
        import jax
        import jax.numpy as jnp
        jatt = jax.jit(lambda q, k, v: bench._jax_sdpa(jnp, q, k, v))
        jst = jax.jit(lambda *a: bench.mlp_step_jax(jnp, *a))
        out["jax.jit"] = {
            "attention_ms": first_call(lambda *a: jax.block_until_ready(jatt(*a)), *qkv),
            "mlp_step_ms": first_call(lambda *a: jax.block_until_ready(jst(*a)), *step)}
    if "torch" in peers:
        import torch
        tatt = torch.compile(torch.nn.functional.scaled_dot_product_attention)
        tst = torch.compile(lambda *a: bench.mlp_step_torch(torch, *a))
        out["torch.compile"] = {
            "attention_ms": first_call(tatt, *map(torch.from_numpy, qkv)),
            "mlp_step_ms": first_call(tst, *map(torch.from_numpy, step))}
    return out


# ---- 3. calls at new sizes --------------------------------------------------------------------------
def run_sequence(make, batch_sizes, p, g, seed: int) -> dict:
    step, rows = make()
    rng = np.random.default_rng(seed)
    data = [inputs(rng, b) for b in batch_sizes]
    ts.reset_cache_stats()
    times = []
    for x, y, r in data:
        t = time.perf_counter()
        step(p, x, y)
        rows(r, g)
        times.append(time.perf_counter() - t)
    stats = ts.cache_stats()
    row = {"total_s": round(sum(times), 3), "first_s": round(times[0], 3),
           "later_median_ms": round(float(np.median(times[1:])) * 1e3, 2)}
    if hasattr(step, "programs"):
        row["c_compiles"] = stats["compiles"]
        row["generic_libraries"] = sum(len(v) for f in (step, rows)
                                       for v in f.programs.generics.values())
        row["served_by_a_generic"] = stats["dynamic_reuses"]
    # a warm call at the last size, as make bench times one
    warm = []
    x, y, r = data[-1]
    for _ in range(7):
        t = time.perf_counter()
        step(p, x, y)
        rows(r, g)
        warm.append(time.perf_counter() - t)
    row["warm_ms"] = round(float(np.median(warm)) * 1e3, 3)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_latency")
    ap.add_argument("--quick", action="store_true",
                    help="8 sizes instead of 24, fewer warm-call rounds")
    ap.add_argument("--json", help="where to write the results (default "
                                   "benchmarks/results/<date>-latency.json)")
    args = ap.parse_args(argv)
    # empty disk caches: a compile is a compile
    os.environ["TESSERA_CACHE_DIR"] = tempfile.mkdtemp(prefix="tessera-bench-latency-")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from tessera.runtime import isa
    peers = available()
    print(f"ISA level {isa.describe(isa.host_level())}; {platform.processor() or platform.machine()}"
          f", {os.cpu_count()} cores")
    warm = warm_calls(peers, 20 if args.quick else 100)
    print("1. a warm call of x * 2 + 1 on 8 floats (goal: tessera at most 8 µs): " +
          ", ".join(f"{k} {v} µs" for k, v in warm.items()))
    batch_sizes = sizes(args.quick)
    rng = np.random.default_rng(1)
    p, g = params(rng), rng.standard_normal(COLS).astype(np.float32)
    print(f"3. calls at {len(batch_sizes)} new batch sizes (1-512): {batch_sizes}")
    # the GEMM routine library, which every program links, compiled before any is timed
    ts.function(lambda a, b: a @ b)(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32))
    rows = {}
    for name, make in implementations(peers).items():
        try:
            rows[name] = run_sequence(make, batch_sizes, p, g, seed=2)
        except Exception as e:             # a peer that fails says why, the rest go on
            rows[name] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
        r = rows[name]
        if "error" in r:
            print(f"  {name:24s} {r['error']}")
            continue
        extra = "".join(f", {k.replace('_', ' ')} {r[k]}" for k in
                        ("c_compiles", "generic_libraries", "served_by_a_generic") if k in r)
        print(f"  {name:24s} total {r['total_s']:7.2f} s  first {r['first_s']:6.2f} s  "
              f"later calls median {r['later_median_ms']:8.2f} ms  warm {r['warm_ms']:7.3f} ms"
              + extra)
    base = rows.get("tessera dynamic", {}).get("total_s")
    if base:
        print("total time against tessera dynamic: " + ", ".join(
            f"{n} {r['total_s'] / base:.1f}x" for n, r in rows.items() if "total_s" in r))
    # (after the calls at new sizes: torch.compile's first call of a function is much shorter
    # once it has compiled a similar one in the process, which would flatter part 3)
    cold = cold_compiles(peers)
    print("2. a cold compile, routine libraries built (goals: attention 300 ms, MLP step 600 ms):")
    for k, v in cold.items():
        print(f"  {k:24s} attention {v['attention_ms']:8.1f} ms   MLP step {v['mlp_step_ms']:8.1f} ms")
    out = Path(args.json) if args.json else RESULTS / time.strftime("%Y-%m-%d-latency.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"isa": isa.host_level(),
                               "machine": platform.processor() or platform.machine(),
                               "python": sys.version.split()[0], "warm_call_us": warm,
                               "cold_compile": cold, "batch_sizes": batch_sizes,
                               "new_sizes": rows}, indent=1))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
