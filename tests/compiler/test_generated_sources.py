"""The generated sources, held still: for every case of the GPU code-generation corpus (every
registered operator in every dtype it takes, and each strategy's shapes), the C of the CPU
program, the CUDA and HIP programs, their printed Schedule IR and Tile IR, every CPU routine
library, each kernel's knobs and its autotuning space, the user-schedule path, and the
gradient of every differentiable operator (its Graph IR and CUDA). Their SHA-256 digests are recorded in
generated_sources.json beside this file.

A refactor of the compiler must leave every digest alone. A change that means to alter the
generated code records the new digests in the same commit, and says why in its message:

    python tests/compiler/test_generated_sources.py --update
    python tests/compiler/test_generated_sources.py --dump DIR      # every text, to diff two commits

The case data is fresh and random, but no source depends on it: only on shapes, dtypes and attributes.
"""
import hashlib
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))     # tests/: the shared cases

import tessera as ts  # noqa: E402
from tessera import ops  # noqa: E402
from tessera.compiler.lower import lower_schedule  # noqa: E402
from tessera.compiler.lower import lower_schedule_gpu  # noqa: E402
from tessera.compiler.driver import prepare  # noqa: E402
from tessera.compiler.scheduler import build_schedule, invalid_knobs, knob_space  # noqa: E402
from tessera.compiler.target.c import render_c, routine_library_source  # noqa: E402
from tessera.compiler.target.gpu import render_cuda, render_hip  # noqa: E402

from cases import EXAMPLES, graph, registry_cases, strategy_cases  # noqa: E402

RECORD = Path(__file__).with_name("generated_sources.json")
LEVEL = "x86-64-v3"
ROUTINES = [f"{r}:{d}" for r in ("gemm", "attention") for d in ("f32", "f64", "f16", "bf16")] + \
    ["conv:f32", "conv:f64"]
SCHEDULES = [ts.Schedule(block=(32, 64, 128)), ts.Schedule(block=(16, 16), vector_width=4),
             ts.Schedule(parallel=False)]


def _knobs_text(s) -> str:
    lines = []
    for k in s.kernels:
        space = knob_space(k, 64)
        lines.append(f"{k.name} {k.strategy} flops={k.flops} bytes={k.bytes} "
                     f"knobs={sorted(k.knobs.items())} space={sorted(space.items())}")
        for name, values in sorted(space.items()):
            for v in values:
                why = invalid_knobs(k, {**k.knobs, name: v})
                if why:
                    lines.append(f"  {name}={v}: {why}")
    return "\n".join(lines)


def texts():
    """name -> text, every generated text of the corpus."""
    rng = np.random.default_rng()
    cases = {**registry_cases(rng), **strategy_cases(rng)}
    out = {}
    for name, (fn, args) in sorted(cases.items()):
        _, prim = prepare(graph(fn, args))
        cpu = build_schedule(prim, f"cpu:{LEVEL}").verify()
        tile = lower_schedule(cpu).verify()
        out[f"{name}/c"] = render_c(tile, LEVEL)
        out[f"{name}/tile-ir"] = str(tile)
        out[f"{name}/schedule-ir"] = str(cpu)
        out[f"{name}/cpu-knobs"] = _knobs_text(cpu)
        for target, render in (("cuda", render_cuda), ("hip", render_hip)):
            s = build_schedule(prim, target).verify()
            tile = lower_schedule_gpu(s, target).verify()
            out[f"{name}/{target}"] = render(tile)
            out[f"{name}/{target}-tile-ir"] = str(tile)
            out[f"{name}/{target}-knobs"] = _knobs_text(s)
        if name.startswith(("matmul-epilogue", "attention-", "softmax(7, 33)", "column-sum")):
            for i, user in enumerate(SCHEDULES):
                s = build_schedule(prim, f"cpu:{LEVEL}", user=user, fusion=i != 2).verify()
                out[f"{name}/schedule{i}"] = render_c(lower_schedule(s).verify(), LEVEL)
    for key in ROUTINES:
        out[f"routine/{key}"] = routine_library_source(key)
    out.update(gradient_texts(rng))
    return out


def gradient_texts(rng) -> dict:
    """The gradient of every differentiable operator's example (summed to a scalar, with
    respect to every float argument): its Graph IR and its CUDA (lowered, not compiled)."""
    out = {}
    for name in sorted(EXAMPLES):
        make, attrs = EXAMPLES[name]
        opdef = ops.get(name)
        if not opdef.differentiable or opdef.nin == -1:
            continue
        args = [np.asarray(a) for a in make(rng)]
        floats = tuple(i for i, a in enumerate(args) if a.dtype.kind == "f")
        if not floats:
            continue
        params = ", ".join(f"x{i}" for i in range(len(args)))
        f = eval(f"lambda {params}: ts.op.sum(apply({params}))",
                 {"ts": ts, "apply": lambda *xs: ts.trace.apply(name, *xs, **attrs)})
        try:
            prog = ts.grad(ts.function(f), argnums=floats).lower(*args, target="cuda")
        except ts.DifferentiationError:
            continue                # an integer result (argmax, comparisons): no gradient
        # (each node names the line it came from: this file's lines move as it is edited)
        out[f"grad-{name}/graph-ir"] = re.sub(rf"{Path(__file__).name}:\d+", "here",
                                              str(prog.graph_ir))
        out[f"grad-{name}/cuda"] = prog.target_code
    return out


def digests(named) -> dict:
    return {name: hashlib.sha256(text.encode()).hexdigest() for name, text in named.items()}


def test_generated_sources_are_unchanged():
    want = json.loads(RECORD.read_text())
    got = digests(texts())
    changed = sorted(n for n in set(want) | set(got) if want.get(n) != got.get(n))
    assert not changed, (f"{len(changed)} generated texts differ from {RECORD.name}, e.g. "
                         f"{changed[:8]}; if the change is meant, record it: python "
                         f"tests/compiler/{Path(__file__).name} --update")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--update"]:
        RECORD.write_text(json.dumps(digests(texts()), indent=0, sort_keys=True) + "\n")
    elif sys.argv[1:2] == ["--dump"]:
        root = Path(sys.argv[2])
        for name, text in texts().items():
            path = root / name.replace(":", "_")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    else:
        sys.exit(__doc__)
