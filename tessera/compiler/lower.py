"""Schedule IR → Tile IR: each kernel lowered by its strategy (tessera/compiler/strategies/), for
the CPU (loop nests: OpenMP across the outermost loop, vector lanes inside) or for a GPU (grid,
blocks and threads; CUDA or HIP).

On GPUs no floating-point atomics are used anywhere; an out-of-range gather index is a plain int
store of the kernel's code into *ts_status.
"""
from __future__ import annotations

from ..errors import BackendUnavailableError
from ..runtime import targets
from . import strategies
from .emit import params
from .schedule_ir import VIEWS, ScheduleProgram
from .scheduler import default_knobs
from .tile_ir import TileKernel, TileProgram


def lower_schedule(s: ScheduleProgram) -> TileProgram:
    kernels, calls = [], []
    for code, k in enumerate(s.kernels, start=1):
        # a kernel whose outputs have no elements (a sum over axis 0 of a [17, 0]) writes
        # nothing: an empty body, not a strategy's tiling of zero-width rows
        empty = all(b.type.is_static and b.type.numel() == 0 for b in k.outputs)
        body = [] if empty else strategies.of(k).lower_cpu(k, code)
        ps = params(k)
        kernels.append(TileKernel(k.name, k.strategy, ps, body, dict(k.knobs),
                                  " ".join(k.fused_labels())))
        calls.append((k.name, [p.name for p in ps]))
    return _program(s, kernels, calls)


def _program(s: ScheduleProgram, kernels, calls) -> TileProgram:
    """The tile program: with control flow, the schedule's steps (the entry point, or the host,
    runs them) and the buffers without memory of their own that they pass."""
    views = {b.name: b for b in s.buffers if b.role in VIEWS}
    buffers = [b for b in s.buffers if b.role not in VIEWS]
    if s.steps is s.kernels:            # launches only (a reshape read in place: an alias)
        return TileProgram(s.name, kernels, calls, buffers,
                           views={n: b for n, b in views.items() if b.role == "alias"})
    return TileProgram(s.name, kernels, calls, buffers, steps=s.steps, views=views)



def lower_schedule_gpu(s: ScheduleProgram, target: str) -> TileProgram:
    """The GPU Tile IR of a schedule (knobs from build_schedule(..., target=target); a schedule
    built for another target gets the GPU heuristics' knobs)."""
    if not targets.is_gpu(target):
        raise BackendUnavailableError(f"{target!r} is not a GPU target",
                                      expected=" or ".join(targets.gpu_targets()))
    kernels, calls = [], []
    for code, k in enumerate(s.kernels, start=1):
        knobs = k.knobs if s.target == target else default_knobs(k, target)
        lowered = strategies.of(k).lower_gpu(k, code, target, knobs)
        ps = params(k)
        if isinstance(lowered, tuple):              # one kernel
            kernels.append(TileKernel(k.name, k.strategy, ps, lowered[0], dict(knobs),
                                      " ".join(k.fused_labels()), launch=lowered[1]))
            calls.append((k.name, [p.name for p in ps]))
            continue
        for i, (body, launch) in enumerate(lowered):   # phases, launched one after another
            name = f"{k.name}_p{i}"
            kernels.append(TileKernel(name, k.strategy, ps, body, dict(knobs),
                                      " ".join(k.fused_labels()), launch=launch,
                                      phase_of=k.name))
            calls.append((name, [p.name for p in ps]))
    return _program(s, kernels, calls)
