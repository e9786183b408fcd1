"""The targets programs are compiled for, one registered object each.

Everything that once switched on a target's name (the driver, the GPU lowering's warp size, the
knob heuristics, the runtime, the profiler, saved programs, the explorer) reads the Target
instead, so a new target is one `register` call and its renderer: no compiler file changes.
The built-in ones are registered where their renderers are defined (compiler/target/c.py: the
CPU; compiler/target/gpu.py: CUDA and HIP); tests/compiler/test_targets.py adds one from
outside the compiler.

A target's name is what `target=` says. A target with ISA levels (the CPU) is also named with
one, "cpu:x86-64-v3" (runtime/isa.py), and its canonical name always carries it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import BackendUnavailableError
from . import isa
from .toolchain import find_compiler


@dataclass(frozen=True)
class Target:
    name: str
    language: str               # of its source: "c", "cuda", "hip" (the routines' spellings,
                                # the explorer's highlighting)
    extension: str              # of its source file (saved programs, debug dumps)
    # (tile program, ISA level or None, dynamic symbols or None) -> source text
    render: Callable = field(repr=False)
    # (target, source, tile program, name, level) -> loaded library, or None where this machine
    # cannot build it (another architecture). None: a GPU target, compiled when it first runs
    build: Callable | None = field(default=None, repr=False)
    gpu: bool = False           # runs on a CuPy device (GPUProgram), else through ctypes (Program)
    warp: int = 1               # lanes per warp: what the GPU shuffle trees are written for
    levels: bool = False        # named with a CPU ISA level, "name:LEVEL"
    compiler: str | None = None  # the C compiler driver (None: $CC, else cc)
    knobs_like: str = ""        # the target whose heuristic knobs it takes ("": its own)
    # whether this machine runs its programs (None: a C compiler is found)
    available: Callable | None = field(default=None, repr=False)
    # () -> the device's peaks the profiler's percentages are relative to (None: this CPU's,
    # runtime/probe.py's machine_peaks)
    peaks: Callable | None = field(default=None, repr=False)
    about: str = ""

    @property
    def knob_table(self) -> str:
        return self.knobs_like or self.name

    def compile(self, tile, name: str, spec: str, symbols=None):
        """(source, loaded library) of a tile program for `spec` (this target, with its level):
        rendered, then built where this target builds (the library is None for a GPU target,
        compiled when it first runs, and for a level of another architecture)."""
        lv = level(spec)
        source = self.render(tile, lv, symbols)
        return source, (None if self.build is None else self.build(self, source, tile, name, lv))

    def runs_here(self) -> bool:
        if self.available is not None:
            return bool(self.available())
        try:
            find_compiler(self.compiler)
            return True
        except BackendUnavailableError:
            return False


_REGISTRY: dict[str, Target] = {}


def register(target: Target) -> Target:
    """Add a target (or replace one of the same name); it is usable from then on."""
    if not target.name or ":" in target.name:
        raise BackendUnavailableError(f"a target's name must be non-empty without ':' "
                                      f"(got {target.name!r})")
    _REGISTRY[target.name] = target
    return target


def unregister(name: str):
    _REGISTRY.pop(name, None)


def names() -> list[str]:
    return list(_REGISTRY)


def all_targets() -> list[Target]:
    return list(_REGISTRY.values())


def _unknown(spec) -> BackendUnavailableError:
    levelled = [f"{t.name}:LEVEL" for t in _REGISTRY.values() if t.levels]
    return BackendUnavailableError(f"target {spec!r} does not exist",
                                   expected=" or ".join(names() + levelled + ["auto"]),
                                   hint="CPU levels: " + ", ".join(isa.LEVELS))


def of(spec: str) -> Target:
    """The Target of a name, canonical or not ("cpu", "cpu:x86-64-v3", "cuda")."""
    base = spec.split(":", 1)[0] if isinstance(spec, str) else None
    t = _REGISTRY.get(base)
    if t is None or (":" in spec and not t.levels):
        raise _unknown(spec)
    return t


def resolve(spec: str) -> str:
    """The canonical name: a levelled target gets its level ("cpu" -> "cpu:<default level>",
    $TESSERA_CPU_TARGET or the host's), a named level is checked."""
    t = of(spec)
    if not t.levels:
        return t.name
    level = spec.split(":", 1)[1] if ":" in spec else isa.default_level()
    return f"{t.name}:{isa.check_level(level, f'target {spec!r}')}"


def level(spec: str) -> str | None:
    """The ISA level a target is for (None for a target without levels)."""
    return resolve(spec).split(":", 1)[1] if of(spec).levels else None


def is_gpu(spec: str) -> bool:
    return of(spec).gpu


def gpu_targets() -> list[str]:
    return [t.name for t in _REGISTRY.values() if t.gpu]
