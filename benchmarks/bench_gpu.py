"""`make gpu-check`'s benchmarks: tessera's CUDA kernels against the device's own floors and
peers, on one machine with an NVIDIA GPU, in one run. Ratios are printed and written to
benchmarks/results/, never asserted.

    python -m benchmarks.bench_gpu [--repeat 20] [--quick] [--json PATH] [--only PART ...]

- softmax and layernorm over 8192 x 8192 f32: achieved bytes/s (one read and one write of the
  matrix) as a share of the measured device-to-device copy bandwidth (goal: 80%).
- matmul 4096 and 8192: tessera against cuBLAS in f32, f16 (CuPy's matmul) and bf16 (PyTorch's;
  CuPy 14's bfloat16 arrays feed tessera); goal for 16-bit inputs: 70%.
- attention B=8, H=16, S=2048, D=64 in bf16 (goal: 60%) and f32: tessera against PyTorch's
  scaled_dot_product_attention (flash attention where PyTorch has it).
- Fourier transforms against cuFFT (CuPy's): rfft of 4096 x 1024 f32 (shared memory), fft of
  4096 x 1009 complex64 (Bluestein) and of one line of 2^20 complex64 (the block's workspace).
- one SGD step of the CPU benchmark's MLP (784-512-512-10, batch 256) against PyTorch eager.
- launch overhead: host time per call of a one-kernel program, against CuPy and PyTorch.
Every timing uses CUDA events around a batch of calls, after a warm-up, median of `repeat`
batches, the implementations interleaved; every result is checked against a reference (its
error is a column). One part's failure is a row saying why; the others still run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
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
    """Median milliseconds per call of fn() by CUDA events around a batch of calls (as many as
    take about 2 ms, so that the host's time between launches hides behind the device's where
    the calls are asynchronous), after two warm-up calls."""
    fn(), fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    fn()
    end.record()
    end.synchronize()
    calls = max(1, min(100, int(2.0 / max(cupy.cuda.get_elapsed_time(start, end), 1e-3))))
    times = []
    for _ in range(repeat):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / calls)
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
    ap.add_argument("--only", nargs="+", default=None, metavar="PART",
                    help="run these parts alone: " + " ".join(p.__name__.strip("_") for p in PARTS))
    args = ap.parse_args(argv)
    import cupy
    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    rows = []
    for part in PARTS:
        if args.only and part.__name__.strip("_") not in args.only:
            continue
        try:
            rows += part(cupy, torch, rng, args)
        except Exception as e:          # one part's failure is a row; the others still run
            rows.append({"case": part.__name__.strip("_"), "impl": "tessera",
                         "note": f"failed: {type(e).__name__}: {str(e)[:300]}"})
    _report(cupy, torch, rows, args.json)


def _bandwidth_bound(cupy, torch, rng, args):
    n = 2048 if args.quick else 8192
    x = cupy.asarray(rng.standard_normal((n, n), dtype=np.float32))
    y = cupy.empty_like(x)
    copy_ms = interleaved(cupy, {"copy": lambda: cupy.copyto(y, x)}, args.repeat)["copy"]
    bw = 2 * x.nbytes / copy_ms / 1e6
    rows = [{"case": f"copy {n}x{n} f32", "impl": "cupy.copyto", "ms": copy_ms, "GB/s": bw,
             "ratio": 1.0, "goal": None}]
    for name, fn, ref in (("softmax", softmax, _softmax_ref),
                          ("layernorm", layernorm, _layernorm_ref)):
        got = fn(x)
        err = float(cupy.abs(got - ref(cupy, x)).max())
        ms = interleaved(cupy, {name: lambda: fn(x)}, args.repeat)[name]
        gbs = 2 * x.nbytes / ms / 1e6
        rows.append({"case": f"{name} {n}x{n} f32", "impl": "tessera", "ms": ms, "GB/s": gbs,
                     "ratio": gbs / bw, "goal": 0.8, "max_err": err})
    return rows


def _matmuls(cupy, torch, rng, args):
    rows = []
    for size in ((1024, 2048) if args.quick else (4096, 8192)):
        a32 = rng.standard_normal((size, size), dtype=np.float32)
        b32 = rng.standard_normal((size, size), dtype=np.float32)
        for dtype in ("float32", "float16", "bfloat16"):
            np_dtype = ts.dtypes.bfloat16.np if dtype == "bfloat16" else np.dtype(dtype)
            a, b = cupy.asarray(a32.astype(np_dtype)), cupy.asarray(b32.astype(np_dtype))
            goal = None if dtype == "float32" else 0.7
            if dtype == "bfloat16":     # cuBLAS through PyTorch: CuPy's bf16 matmul is partial
                if torch is None:
                    continue
                ta, tb = (torch.as_tensor(v, device="cuda").to(torch.bfloat16)
                          for v in (a32, b32))
                rows += _versus(cupy, f"matmul {size} {dtype}", lambda: matmul(a, b),
                                "cuBLAS (torch.matmul)", lambda: torch.matmul(ta, tb),
                                2 * size ** 3, args.repeat, goal=goal,
                                check=lambda: _rel_err(cupy, matmul(a, b),
                                                       ta.float() @ tb.float()))
            else:
                rows += _versus(cupy, f"matmul {size} {dtype}", lambda: matmul(a, b),
                                "cuBLAS (cupy.matmul)", lambda: cupy.matmul(a, b),
                                2 * size ** 3, args.repeat, goal=goal,
                                check=lambda: _rel_err(cupy, matmul(a, b), cupy.matmul(a, b)))
    return rows


@ts.function(target="cuda")
def rfft(x):
    return op.rfft(x, axis=-1)


@ts.function(target="cuda")
def fft(z):
    return op.fft(z, axis=-1)


def _ffts(cupy, torch, rng, args):
    """Our transforms against cuFFT; flops as FFT benchmarks count them (5 n log2 n a complex
    line, half that a real one)."""
    rows = []
    cases = [("rfft", (512 if args.quick else 4096, 1024)),
             ("fft", (256 if args.quick else 4096, 1009)),
             ("fft", (1, 1 << (16 if args.quick else 20)))]
    for name, (lines, n) in cases:
        x = rng.standard_normal((lines, n), dtype=np.float32)
        if name == "fft":
            x = (x + 1j * rng.standard_normal((lines, n), dtype=np.float32)).astype(np.complex64)
        ours, peer = (rfft, cupy.fft.rfft) if name == "rfft" else (fft, cupy.fft.fft)
        xd = cupy.asarray(x)
        flops = lines * 5 * n * np.log2(n) / (2 if name == "rfft" else 1)
        rows += _versus(cupy, f"{name} {lines}x{n} {x.dtype}", lambda: ours(xd), "cuFFT",
                        lambda: peer(xd, axis=-1), flops, args.repeat,
                        check=lambda: _rel_err(cupy, ours(xd), peer(xd.astype(
                            cupy.complex128 if name == "fft" else cupy.float64), axis=-1)))
    return rows


def _attention(cupy, torch, rng, args):
    if torch is None:
        return [{"case": "attention", "impl": "tessera", "note": "no PyTorch: no peer"}]
    B, H, S, D = (2, 4, 512, 64) if args.quick else (8, 16, 2048, 64)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = []
    host = [rng.standard_normal((B, H, S, D), dtype=np.float32) for _ in range(3)]
    for dtype, goal in (("bfloat16", 0.6), ("float32", None)):
        np_dtype = ts.dtypes.bfloat16.np if dtype == "bfloat16" else np.float32
        q, k, v = (cupy.asarray(h.astype(np_dtype)) for h in host)
        tq, tk, tv = (torch.as_tensor(h, device="cuda").to(getattr(torch, dtype)) for h in host)
        ref = sdpa(tq.float(), tk.float(), tv.float())
        rows += _versus(cupy, f"attention B{B} H{H} S{S} D{D} {dtype}",
                        lambda: attention(q, k, v), "torch SDPA", lambda: sdpa(tq, tk, tv),
                        4 * B * H * S * S * D, args.repeat, goal=goal,
                        check=lambda: _rel_err(cupy, attention(q, k, v), ref))
    return rows


def _training(cupy, torch, rng, args):
    """One SGD step of the CPU benchmark's MLP (784-512-512-10, batch 256) on the device."""
    from . import bench
    step = ts.function(bench.mlp_step.fn, target="cuda")
    host = bench.mlp_inputs(rng, args.quick)
    dev = [cupy.asarray(h) for h in host]
    want = bench.mlp_step_np(*[h.astype(np.float64) if h.dtype.kind == "f" else h
                               for h in host])
    err = max(float(abs(cupy.asnumpy(g) - w).max()) for g, w in zip(step(*dev), want))
    impls = {"tessera": lambda: step(*dev)}
    if torch is not None:
        tdev = [torch.as_tensor(h, device="cuda") for h in host]
        impls["torch eager"] = lambda: bench.mlp_step_torch(torch, *tdev)
    t = interleaved(cupy, impls, args.repeat)
    with ts.profiler() as prof:         # where the step's time goes, kernel by kernel
        for _ in range(5):
            step(*dev)
    prof.summary()
    flops = bench.mlp_flops(*host)
    rows = [{"case": "mlp train step 784-512-512-10 b256 f32", "impl": "tessera",
             "ms": t["tessera"], "TFLOP/s": flops / t["tessera"] / 1e9, "max_err": err,
             "ratio": t.get("torch eager", np.nan) / t["tessera"], "goal": 1.0}]
    if "torch eager" in t:
        rows.append({"case": rows[0]["case"], "impl": "torch eager", "ms": t["torch eager"]})
    return rows


def _launch(cupy, torch, rng, args):
    """Host wall time per call of a one-kernel program on 1024 floats (synchronised once at
    the end of 2000 calls): the fixed cost each call adds."""
    add = ts.function(lambda x: x + 1.0, target="cuda")
    x = cupy.asarray(rng.standard_normal(1024, dtype=np.float32))
    impls = {"tessera": lambda: add(x), "cupy": lambda: x + 1.0}
    if torch is not None:
        tx = torch.as_tensor(x, device="cuda")
        impls["torch"] = lambda: tx + 1.0
    rows = []
    for name, fn in impls.items():
        fn(), fn()
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(2000):
            fn()
        cupy.cuda.Device().synchronize()
        us = (time.perf_counter() - start) / 2000 * 1e6
        rows.append({"case": "launch overhead x+1 (1024 f32)", "impl": name, "us/call": us})
    return rows


PARTS = (_bandwidth_bound, _matmuls, _attention, _ffts, _training, _launch)


def _rel_err(cupy, got, ref):
    """|got - ref| / |ref| in float64 or complex128 (ref a CuPy array, a torch tensor or a
    NumPy array)."""
    if ref is None:
        return None
    got = cupy.asarray(got)
    wide = cupy.complex128 if got.dtype.kind == "c" else cupy.float64
    got = got.astype(wide)
    if hasattr(ref, "detach"):
        ref = cupy.asarray(ref.detach().float())
    ref = cupy.asarray(ref).astype(wide)
    return float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref))


def _versus(cupy, case, ours, peer_name, peer, flops, repeat, goal=None, check=None):
    try:
        err = check() if check else None
        t = interleaved(cupy, {"tessera": ours, peer_name: peer}, repeat)
    except Exception as e:              # a row saying why; the next case still runs
        note = e.summary if isinstance(e, ts.TesseraError) else f"{type(e).__name__}: {e}"
        return [{"case": case, "impl": "tessera", "note": note[:400]}]
    return [{"case": case, "impl": "tessera", "ms": t["tessera"],
             "TFLOP/s": flops / t["tessera"] / 1e9, "ratio": t[peer_name] / t["tessera"],
             "goal": goal, "rel_err": err},
            {"case": case, "impl": peer_name, "ms": t[peer_name],
             "TFLOP/s": flops / t[peer_name] / 1e9}]


def _softmax_ref(cupy, x):
    e = cupy.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layernorm_ref(cupy, x):
    m = x.mean(axis=-1, keepdims=True)
    return (x - m) / cupy.sqrt(x.var(axis=-1, keepdims=True) + 1e-5)


def _report(cupy, torch, rows, path):
    props = cupy.cuda.runtime.getDeviceProperties(0)
    device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    for r in rows:
        cells = [f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()]
        print("  ".join(cells))
    from tessera.runtime.gpu_toolchain import nvrtc_version
    versions = {"driver": cupy.cuda.runtime.driverGetVersion(),
                "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(), "cupy": cupy.__version__,
                "nvrtc": nvrtc_version(), "torch": getattr(torch, "__version__", None),
                "numpy": np.__version__}
    print(versions)
    today = datetime.date.today().isoformat()
    path = path or RESULTS / f"{today}-gpu-{device.replace(' ', '_')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"date": today, "device": device, "host": platform.node(),
                                "versions": versions, "tessera": ts.__version__, "rows": rows},
                               indent=1, default=str))
    print(f"written {path}")


if __name__ == "__main__":
    main()
