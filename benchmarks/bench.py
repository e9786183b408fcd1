"""`make bench`: tessera against NumPy and the peers that are installed (PyTorch eager,
torch.compile, jax.jit), on the same inputs, interleaved, median after warm-up. Every result is
checked against NumPy; ratios are printed and written to benchmarks/results/, never asserted.

    python -m benchmarks.bench [--only softmax,matmul_1024] [--repeat 7] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import tessera as ts
from tessera import op

RESULTS = Path(__file__).resolve().parent / "results"
SETTLE_S = 0.2


# ---- cases ----------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    goal: str                      # what the issue asks, in words
    target: float                  # the speed-up over NumPy the goal needs (1.0: not slower)
    inputs: callable               # rng, quick -> list of float32 arrays
    numpy: callable                # the reference, and NumPy's entry
    tessera: callable              # a function written with tessera.op
    torch: callable | None = None  # (torch module, tensors) -> tensor
    jax: callable | None = None    # (jax.numpy, arrays) -> array
    flops: callable = None         # inputs -> FLOPs (for GFLOP/s)
    bytes: callable = None         # inputs -> bytes moved at least (for GB/s)
    rtol: float = 1e-4
    peers_goal: bool = False       # the goal also says "not slower than PyTorch"
    extra: dict = field(default_factory=dict)


def gelu_np(x):
    return 0.5 * x * (1 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x ** 3)))


def softmax_np(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def layernorm_np(x):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(x.var(-1, keepdims=True) + np.float32(1e-5))


def attention_np(q, k, v):
    return softmax_np(q @ np.swapaxes(k, -1, -2) * np.float32(1 / math.sqrt(q.shape[-1]))) @ v


def f32(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def matmul_case(n):
    return Case(f"matmul_{n}", "≥1.3× NumPy (OpenBLAS)", 1.3,
                lambda r, q: [f32(r, n // (2 if q else 1), n), f32(r, n, n // (2 if q else 1))],
                lambda a, b: a @ b, lambda a, b: a @ b,
                torch=lambda t, a, b: a @ b, jax=lambda jnp, a, b: a @ b,
                flops=lambda a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1],
                bytes=lambda a, b: 4 * (a.size + b.size + a.shape[0] * b.shape[1]))


CASES = [
    matmul_case(1024),
    matmul_case(2048),
    Case("gelu(x*w+b)", "≥6× NumPy and ≥80% of copy bandwidth", 6.0,
         lambda r, q: [f32(r, (1 if q else 16) << 20) for _ in range(3)],
         lambda x, w, b: gelu_np(x * w + b),
         lambda x, w, b: op.gelu(x * w + b, approximate="tanh"),
         torch=lambda t, x, w, b: t.nn.functional.gelu(x * w + b, approximate="tanh"),
         jax=lambda jnp, x, w, b: __import__("jax").nn.gelu(x * w + b, approximate=True),
         flops=lambda x, w, b: 20 * x.size, bytes=lambda x, w, b: 16 * x.size),
    Case("softmax_4096", "≥4× NumPy, not slower than PyTorch", 4.0,
         lambda r, q: [f32(r, 1024 if q else 4096, 4096)], softmax_np, lambda x: op.softmax(x),
         torch=lambda t, x: t.softmax(x, -1), jax=lambda jnp, x: __import__("jax").nn.softmax(x),
         flops=lambda x: 14 * x.size, bytes=lambda x: 8 * x.size, peers_goal=True),
    Case("layernorm_4096", "≥4× NumPy, not slower than PyTorch", 4.0,
         lambda r, q: [f32(r, 1024 if q else 4096, 4096)], layernorm_np,
         lambda x: op.layernorm(x),
         torch=lambda t, x: t.nn.functional.layer_norm(x, x.shape[-1:]),
         jax=lambda jnp, x: (x - x.mean(-1, keepdims=True))
         / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5),
         flops=lambda x: 8 * x.size, bytes=lambda x: 8 * x.size, peers_goal=True),
    Case("attention", "≥3× NumPy, not slower than PyTorch SDPA", 3.0,
         lambda r, q: [f32(r, 2 if q else 8, 8, 512 if q else 1024, 64) for _ in range(3)],
         attention_np, lambda q, k, v: op.attention(q, k, v),
         torch=lambda t, q, k, v: t.nn.functional.scaled_dot_product_attention(q, k, v),
         jax=lambda jnp, q, k, v: __import__("jax").nn.dot_product_attention(
             q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))
         .transpose(0, 2, 1, 3),
         flops=lambda q, k, v: 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3],
         bytes=lambda q, k, v: 16 * q.size, rtol=1e-3, peers_goal=True),
    Case("matmul+bias+gelu", "faster than NumPy's matmul alone", 1.0,
         lambda r, q: [f32(r, 1024 if q else 4096, 1024), f32(r, 1024, 1024 if q else 4096),
                       f32(r, 1024 if q else 4096)],
         lambda x, w, b: gelu_np(x @ w + b), lambda x, w, b: op.gelu(x @ w + b, approximate="tanh"),
         torch=lambda t, x, w, b: t.nn.functional.gelu(x @ w + b, approximate="tanh"),
         jax=lambda jnp, x, w, b: __import__("jax").nn.gelu(x @ w + b, approximate=True),
         flops=lambda x, w, b: 2 * x.shape[0] * x.shape[1] * w.shape[1],
         bytes=lambda x, w, b: 4 * (x.size + w.size + x.shape[0] * w.shape[1]),
         extra={"compare": "numpy_matmul_only"}),
    # The training step (784-512-512-10 MLP, batch 256, against PyTorch eager and torch.compile)
    # joins here with the autodiff issue: it needs ts.grad and ts.optim.
]


# ---- peers ----------------------------------------------------------------------------------------
def load_peers():
    peers = {}
    try:
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
        peers["torch"] = torch
    except ImportError:
        pass
    try:
        import jax
        jax.config.update("jax_platforms", "cpu")
        peers["jax"] = jax
    except ImportError:
        pass
    return peers


def implementations(case: Case, arrays, peers):
    """name -> a zero-argument callable returning a NumPy array (or a reason it is missing)."""
    impls = {"numpy": lambda: case.numpy(*arrays)}
    if case.extra.get("compare") == "numpy_matmul_only":
        impls["numpy matmul alone"] = lambda: arrays[0] @ arrays[1]
    fn = ts.function(case.tessera, name=case.name.replace("+", "_").replace("(", "_")
                     .replace(")", "").replace("*", "x"))
    impls["tessera"] = lambda: fn(*arrays)
    torch = peers.get("torch")
    if torch is not None and case.torch is not None:
        ta = [torch.from_numpy(a) for a in arrays]
        eager = lambda: case.torch(torch, *ta)            # noqa: E731

        def run_eager():
            with torch.no_grad():
                return eager().numpy()
        impls["torch eager"] = run_eager
        try:
            compiled = torch.compile(lambda *xs: case.torch(torch, *xs))

            def run_compiled():
                with torch.no_grad():
                    return compiled(*ta).numpy()
            impls["torch.compile"] = run_compiled
        except Exception as e:                              # noqa: BLE001
            impls["torch.compile"] = f"n/a ({type(e).__name__})"
    else:
        impls["torch eager"] = impls["torch.compile"] = "not installed"
    jax = peers.get("jax")
    if jax is not None and case.jax is not None:
        ja = [jax.numpy.asarray(a) for a in arrays]
        jitted = jax.jit(lambda *xs: case.jax(jax.numpy, *xs))
        impls["jax.jit"] = lambda: np.asarray(jitted(*ja).block_until_ready())
    else:
        impls["jax.jit"] = "not installed"
    return impls, fn


def run_case(case: Case, rng, repeat: int, quick: bool, peers) -> dict:
    arrays = case.inputs(rng, quick)
    impls, fn = implementations(case, arrays, peers)
    want = case.numpy(*arrays).astype(np.float64)
    scale = float(np.abs(want).max()) or 1.0
    row = {"case": case.name, "goal": case.goal, "shapes": [list(a.shape) for a in arrays],
           "times_ms": {}, "min_ms": {}, "status": {}}
    t = time.perf_counter()
    try:
        fn(*arrays)
        row["tessera_first_call_ms"] = (time.perf_counter() - t) * 1e3
    except ts.TesseraError as e:
        impls["tessera"] = f"error: {e.summary}"
    live = {}
    for name, impl in impls.items():
        if isinstance(impl, str):
            row["status"][name] = impl
            continue
        try:
            got = impl()                                    # warm-up (compiles, caches)
            impl()
        except Exception as e:                              # noqa: BLE001
            row["status"][name] = f"error: {type(e).__name__}: {str(e)[:80]}"
            continue
        if name != "numpy matmul alone":
            err = float(np.abs(np.asarray(got, np.float64) - want).max()) / scale
            row["status"][name] = "ok" if err <= case.rtol else f"MISMATCH (rel err {err:.1e})"
        else:
            row["status"][name] = "ok"
        live[name] = impl
    samples = {name: [] for name in live}
    for _ in range(repeat):                                 # interleaved rounds
        for name, impl in live.items():
            # BLAS and OpenMP worker threads spin for a while after a call, taking the cores
            # from whoever runs next: let them go to sleep, then wake this one's threads with
            # an untimed call, as a loop calling it would have them
            time.sleep(SETTLE_S)
            impl()
            t = time.perf_counter()
            impl()
            samples[name].append(time.perf_counter() - t)
    for name, s in samples.items():
        row["times_ms"][name] = statistics.median(s) * 1e3
        row["min_ms"][name] = min(s) * 1e3
    tt = row["times_ms"].get("tessera")
    if tt:
        base = row["times_ms"].get("numpy matmul alone", row["times_ms"].get("numpy"))
        row["speedup_vs_numpy"] = base / tt if base else None
        peer_times = [row["times_ms"][p] for p in ("torch eager", "torch.compile", "jax.jit")
                      if p in row["times_ms"]]
        row["speedup_vs_best_peer"] = min(peer_times) / tt if peer_times else None
        met = row["speedup_vs_numpy"] is not None and row["speedup_vs_numpy"] >= case.target
        if case.peers_goal and "torch eager" in row["times_ms"]:
            met = met and row["times_ms"]["torch eager"] >= tt
        row["goal_met"] = bool(met)
        if case.flops:
            row["tessera_gflops"] = case.flops(*arrays) / tt / 1e6
        if case.bytes:
            row["tessera_gbs"] = case.bytes(*arrays) / tt / 1e6
        with ts.profiler() as prof:
            fn(*arrays)
        row["kernels"] = [{k: r[k] for k in ("kernel", "strategy", "median_ms", "gflops", "gbs")}
                          for r in prof.rows()]
    return row


# ---- report ---------------------------------------------------------------------------------------
def machine() -> dict:
    info = {"host": socket.gethostname(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "cores": os.cpu_count(),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f
                               if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    try:
        info["tessera_rev"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                             capture_output=True, text=True,
                                             cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        info["tessera_rev"] = "unknown"
    cfg = np.show_config(mode="dicts") if "mode" in np.show_config.__code__.co_varnames else {}
    info["numpy_blas"] = cfg.get("Build Dependencies", {}).get("blas", {}).get("name", "?") \
        if isinstance(cfg, dict) else "?"
    peaks = ts.machine_peaks()
    info["fma_gflops"], info["copy_gbs"] = peaks["fma_gflops"], peaks["copy_gbs"]
    return info


def print_table(rows, info, peers):
    print(f"\n{info['cpu']}, {info['cores']} cores; measured peak {info['fma_gflops']:.0f} "
          f"GFLOP/s, copy {info['copy_gbs']:.1f} GB/s; numpy {info['numpy']} "
          f"({info['numpy_blas']}); peers: {', '.join(peers) or 'none installed'}")
    names = ["tessera", "numpy", "numpy matmul alone", "torch eager", "torch.compile", "jax.jit"]
    head = f"{'case':<18}" + "".join(f"{n:>20}" for n in names) + f"{'vs numpy':>10}{'goal':>6}"
    print(head)
    for r in rows:
        cells = []
        for n in names:
            if n in r["times_ms"]:
                flag = "" if r["status"].get(n) == "ok" else "!"
                cells.append(f"{r['times_ms'][n]:>18.2f}{flag:1} ")
            else:
                cells.append(f"{'-':>20}")
        sp = r.get("speedup_vs_numpy")
        print(f"{r['case']:<18}" + "".join(cells) + (f"{sp:>9.2f}×" if sp else f"{'-':>10}")
              + f"{'yes' if r.get('goal_met') else 'no':>6}")
        extras = []
        if "tessera_gflops" in r:
            extras.append(f"{r['tessera_gflops']:.0f} GFLOP/s "
                          f"({100 * r['tessera_gflops'] / info['fma_gflops']:.0f}% of peak)")
        if "tessera_gbs" in r:
            extras.append(f"{r['tessera_gbs']:.1f} GB/s "
                          f"({100 * r['tessera_gbs'] / info['copy_gbs']:.0f}% of copy)")
        bad = {n: s for n, s in r["status"].items() if s != "ok" and s != "not installed"}
        if bad:
            extras.append("; ".join(f"{n}: {s}" for n, s in bad.items()))
        print(f"{'':<18}  goal: {r['goal']}; tessera " + ", ".join(extras))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="smaller shapes")
    ap.add_argument("--json", help="where to write the results (default benchmarks/results/)")
    args = ap.parse_args(argv)
    cases = CASES
    if args.only:
        wanted = set(args.only.split(","))
        cases = [c for c in CASES if c.name in wanted]
        if not cases:
            ap.error(f"no case named {args.only}; cases: {', '.join(c.name for c in CASES)}")
    peers = load_peers()
    info = machine()
    rng = np.random.default_rng(0)
    rows = []
    for case in cases:
        print(f"running {case.name} ...", file=sys.stderr, flush=True)
        rows.append(run_case(case, rng, args.repeat, args.quick, peers))
    print_table(rows, info, peers)
    out = Path(args.json) if args.json else \
        RESULTS / f"{info['date'][:10]}-{info['host']}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": info, "quick": args.quick, "repeat": args.repeat,
                               "results": rows}, indent=1, default=float) + "\n")
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()
