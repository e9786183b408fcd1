"""`make gpu-check`'s benchmarks: tessera's CUDA kernels against the device's own floors and
peers, on one machine with an NVIDIA GPU, in one run. Ratios are printed and written to
benchmarks/results/, never asserted.

    python -m benchmarks.bench_gpu [--repeat 20] [--quick] [--json PATH]

- softmax and layernorm over 8192 x 8192 f32: achieved bytes/s (one read and one write of the
  matrix) as a share of the measured device-to-device copy bandwidth (goal: 80%).
- matmul 4096 and 8192: tessera against cuBLAS (CuPy's matmul) in f32 and f16 (the goal, 60%, is
  for 16-bit inputs; CuPy has no bfloat16 arrays, and f16 takes the same tensor-core path).
- attention B=8, H=16, S=2048, D=64: tessera against PyTorch's scaled_dot_product_attention
  (goal: 50%).
Every timing uses CUDA events around the call, after a warm-up, median of `repeat` calls, the
implementations interleaved; every result is checked against the peer's.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
from pathlib import Path

import numpy as np

import tessera as ts
from tessera import Tensor, op

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


@ts.function(target="cuda")
def softmax(x: Tensor["R", "C"]) -> Tensor["R", "C"]:
    return op.softmax(x, axis=-1)


@ts.function(target="cuda")
def layernorm(x: Tensor["R", "C"]) -> Tensor["R", "C"]:
    return op.layernorm(x, axis=-1, eps=1e-5)


@ts.function(target="cuda")
def matmul(a: Tensor["M", "K"], b: Tensor["K", "N"]) -> Tensor["M", "N"]:
    return a @ b


@ts.function(target="cuda")
def attention(q: Tensor["B", "H", "S", "D"], k: Tensor["B", "H", "S", "D"],
              v: Tensor["B", "H", "S", "D"]) -> Tensor["B", "H", "S", "D"]:
    return op.attention(q, k, v, causal=False)


def time_ms(cupy, fn, repeat):
    """Median milliseconds of fn() by CUDA events, after two warm-up calls."""
    fn(), fn()
    times = []
    for _ in range(repeat):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def interleaved(cupy, impls: dict, repeat: int) -> dict:
    """Median ms per implementation, the implementations taking turns."""
    out = {name: [] for name in impls}
    for _ in range(repeat):
        for name, fn in impls.items():
            out[name].append(time_ms(cupy, fn, 3))
    return {name: statistics.median(v) for name, v in out.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="smaller shapes")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    import cupy
    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    rows = []
    n = 2048 if args.quick else 8192
    x = cupy.asarray(rng.standard_normal((n, n), dtype=np.float32))
    y = cupy.empty_like(x)
    copy_ms = interleaved(cupy, {"copy": lambda: cupy.copyto(y, x)}, args.repeat)["copy"]
    bw = 2 * x.nbytes / copy_ms / 1e6
    rows.append({"case": f"copy {n}x{n} f32", "impl": "cupy.copyto", "ms": copy_ms,
                 "GB/s": bw, "ratio": 1.0, "goal": None})
    for name, fn, ref in (("softmax", softmax, _softmax_ref), ("layernorm", layernorm,
                                                                  _layernorm_ref)):
        got = fn(x)
        err = float(cupy.abs(got - ref(cupy, x)).max())
        ms = interleaved(cupy, {name: lambda: fn(x)}, args.repeat)[name]
        gbs = 2 * x.nbytes / ms / 1e6
        rows.append({"case": f"{name} {n}x{n} f32", "impl": "tessera", "ms": ms, "GB/s": gbs,
                     "ratio": gbs / bw, "goal": 0.8, "max_err": err})
    for size in ((1024, 2048) if args.quick else (4096, 8192)):
        for dtype in ("float32", "float16"):
            a = cupy.asarray(rng.standard_normal((size, size)).astype(dtype))
            b = cupy.asarray(rng.standard_normal((size, size)).astype(dtype))
            rows += _versus(cupy, f"matmul {size} {dtype}", lambda: matmul(a, b),
                            "cuBLAS (cupy.matmul)", lambda: cupy.matmul(a, b), 2 * size ** 3,
                            args.repeat, goal=0.6 if dtype != "float32" else None)
        rows.append({"case": f"matmul {size} bfloat16", "impl": "tessera",
                     "note": "not measured: CuPy has no bfloat16 arrays (f16 takes the same "
                             "tensor-core path)"})
    if torch is not None:
        B, H, S, D = (2, 4, 512, 64) if args.quick else (8, 16, 2048, 64)
        q, k, v = (cupy.asarray(rng.standard_normal((B, H, S, D), dtype=np.float32))
                   for _ in range(3))
        tq, tk, tv = (torch.as_tensor(t, device="cuda") for t in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        rows += _versus(cupy, f"attention B{B} H{H} S{S} D{D} f32", lambda: attention(q, k, v),
                        "torch SDPA", lambda: sdpa(tq, tk, tv), 4 * B * H * S * S * D,
                        args.repeat, goal=0.5)
    _report(cupy, rows, args.json)


def _versus(cupy, case, ours, peer_name, peer, flops, repeat, goal=None):
    try:
        t = interleaved(cupy, {"tessera": ours, peer_name: peer}, repeat)
    except ts.TesseraError as e:
        return [{"case": case, "impl": "tessera", "note": e.summary}]
    return [{"case": case, "impl": "tessera", "ms": t["tessera"],
             "TFLOP/s": flops / t["tessera"] / 1e9, "ratio": t[peer_name] / t["tessera"],
             "goal": goal},
            {"case": case, "impl": peer_name, "ms": t[peer_name],
             "TFLOP/s": flops / t[peer_name] / 1e9}]


def _softmax_ref(cupy, x):
    e = cupy.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layernorm_ref(cupy, x):
    m = x.mean(axis=-1, keepdims=True)
    return (x - m) / cupy.sqrt(x.var(axis=-1, keepdims=True) + 1e-5)


def _report(cupy, rows, path):
    props = cupy.cuda.runtime.getDeviceProperties(0)
    device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    for r in rows:
        cells = [f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()]
        print("  ".join(cells))
    today = datetime.date.today().isoformat()
    path = path or RESULTS / f"{today}-gpu-{device.replace(' ', '_')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"date": today, "device": device, "host": platform.node(),
                                "tessera": ts.__version__, "rows": rows}, indent=1))
    print(f"written {path}")


if __name__ == "__main__":
    main()
