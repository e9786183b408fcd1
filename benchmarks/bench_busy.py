"""Warm calls on a busy machine (issue 39): three CPU-bound processes compete for the cores while
tessera and PyTorch run the same programs, each at its default threads and at one thread.

    .venv/bin/python -m benchmarks.bench_busy [--quick] [--json PATH]

Programs: the MLP training step of `make bench` (784-512-512-10, batch 256) and, with PyTorch
and transformers installed, the imported 2-layer GPT-2 (benchmarks/bench.py's). Each
configuration runs in a process of its own (its thread settings are read at start): tessera
as it comes (threads chosen per call from the cores other processes leave: runtime/threads.py),
tessera with TESSERA_ADAPTIVE_THREADS=0 (the configured threads whatever the load), tessera on
one thread (OMP_NUM_THREADS=1), PyTorch eager at its default threads and on one. Reported: the
median and 90th percentile of warm calls, and each one's ratio to its own one-thread time under
the same load. Goal: tessera's default at most 2x its one-thread time.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
BURNERS = 3

_MEASURE = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, {root!r})
from benchmarks import bench
which, program, calls = {which!r}, {program!r}, {calls}
rng = np.random.default_rng(0)
if program == "mlp":
    args = bench.mlp_inputs(rng, False)
    if which.startswith("tessera"):
        import tessera as ts
        f = ts.function(bench.mlp_step)
        run = lambda: f(*args)
    else:
        import torch
        if which == "torch-1":
            torch.set_num_threads(1)
        t = [torch.from_numpy(a) for a in args]
        run = lambda: bench.mlp_step_torch(torch, *t)
else:
    x = bench.gpt2_inputs(rng, False)[0]
    import torch
    if which == "torch-1":
        torch.set_num_threads(1)
    if which.startswith("tessera"):
        f = bench.gpt2_tessera(x)
        run = lambda: f(x)
    else:
        tx = torch.from_numpy(x)
        def run():
            with torch.no_grad():
                return bench.gpt2_torch(torch, tx)
for _ in range(5):
    run()
times = []
for _ in range(calls):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
print(json.dumps({{"median_ms": 1e3 * float(np.median(times)),
                  "p90_ms": 1e3 * float(np.percentile(times, 90))}}))
"""

CONFIGS = {"tessera": {}, "tessera-fixed": {"TESSERA_ADAPTIVE_THREADS": "0"},
           "tessera-1": {"OMP_NUM_THREADS": "1"}, "torch": {}, "torch-1": {}}


def measure(which: str, program: str, calls: int) -> dict | str:
    root = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "TESSERA_ADAPTIVE_THREADS")}
    env.update(CONFIGS[which])
    code = _MEASURE.format(root=root, which=which, program=program, calls=calls)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        return (p.stderr.strip().splitlines() or ["failed"])[-1][:160]
    return json.loads(p.stdout.strip().splitlines()[-1])


def burners(n: int) -> list:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls")
    ap.add_argument("--json", help="where to write the results (default "
                                   "benchmarks/results/<date>-busy.json)")
    a = ap.parse_args(argv)
    calls = 20 if a.quick else 60
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        programs = ["mlp", "gpt2"]
    except ImportError:
        programs = ["mlp"]
    rows = {}
    procs = burners(BURNERS)
    try:
        time.sleep(1.0)                     # (the burners running before the first call)
        for program in programs:
            for which in CONFIGS:
                if program == "gpt2" or which.startswith("torch"):
                    try:
                        import torch  # noqa: F401
                    except ImportError:
                        continue
                rows[(program, which)] = measure(which, program, calls)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    from tessera.runtime import isa
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.machine()) \
        if os.path.exists("/proc/cpuinfo") else platform.machine()
    where = f"{cpu}, {isa.host_level()}"
    print(f"warm calls with {BURNERS} CPU-bound processes on {os.cpu_count()} cores ({where}):")
    print(f"{'program':8} {'configuration':15} {'median ms':>10} {'p90 ms':>9} {'/ 1 thread':>11}")
    out = []
    for (program, which), r in rows.items():
        one = rows.get((program, "torch-1" if which.startswith("torch") else "tessera-1"))
        if isinstance(r, str):
            print(f"{program:8} {which:15} {r}")
            out.append({"program": program, "configuration": which, "error": r})
            continue
        ratio = r["median_ms"] / one["median_ms"] if isinstance(one, dict) else None
        print(f"{program:8} {which:15} {r['median_ms']:10.2f} {r['p90_ms']:9.2f} "
              f"{'' if ratio is None else f'{ratio:10.2f}x'}")
        out.append({"program": program, "configuration": which, **r,
                    "ratio_to_one_thread": ratio})
    path = Path(a.json) if a.json else RESULTS / f"{time.strftime('%Y-%m-%d')}-busy.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"burners": BURNERS, "cores": os.cpu_count(),
                                "machine": where,
                                "rows": out}, indent=1) + "\n")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
