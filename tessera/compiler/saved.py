"""Saved programs: ``prog.save("model.tsr")`` writes the file; ``ts.load("model.tsr")``
(compiler/load.py) reads it back.

One file (a zip) holds a compiled CPU program whole: a manifest (format, versions, the target
and its ISA level, the machine, the arguments and results, a SHA-256 digest of every other
member), the IR levels (pickled: Graph IR, its primitive form, Schedule IR with its knobs, Tile
IR), the generated C and the routine libraries' C, and one standalone shared object built from
all of them, which needs no compiler and no kernel cache to load. A CUDA program holds its
source and the PTX NVRTC made of it for each architecture saved (sm_80 and sm_90 by default),
which the GPU driver loads (and compiles for a later GPU) with no NVRTC where it runs; a HIP
program holds its source, compiled where it loads. ``ts.load`` checks the digests
before mapping anything (a damaged file is an error naming the member, never a crash in the
loader), refuses a program this machine cannot run (another architecture or ISA level) naming
both, and with ``recompile=True`` compiles the saved Graph IR for this machine instead (the same
bits: the numerics contract holds across ISA levels). The file is written atomically: an
interrupted save leaves no half-written file. Like any pickle or shared object, load only files
you trust.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import platform
import tempfile
import zipfile
from pathlib import Path

from ..errors import ArgumentError, BackendUnavailableError, TesseraError
from ..runtime import isa, targets, toolchain
from ..version import __version__

# version 2: the tile-kernel statements moved to tessera.kernel (their pickled Tile IR changed)
# version 3: the Schedule IR's program class is schedule_ir.ScheduleProgram (was Schedule), the
# kernel language's statements are LoadStmt, MmaStmt, ... (were Load, Mma, ...)
FORMAT, VERSION = "tessera-program", 3


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# the architectures a saved CUDA program carries PTX for (each runs on its own and every later
# GPU: the driver compiles PTX for the device it loads on)
CUDA_ARCHS = ("sm_80", "sm_90")


def _levels(program) -> bytes:
    return pickle.dumps((program.graph_ir, program.primitive_ir, program.schedule_ir,
                         program.tile_ir, program.target_code, program.target,
                         program.output_structure), protocol=pickle.HIGHEST_PROTOCOL)


def _gpu_members(program, at: str, archs) -> tuple[dict, dict]:
    """(members, manifest entry fields) of a CUDA or HIP program: its source, and for CUDA
    the PTX NVRTC makes of it for each architecture (NVRTC is needed here, not where it loads)."""
    from ..runtime.gpu import NVRTC_OPTIONS
    from ..runtime.gpu_toolchain import nvrtc_compile, nvrtc_version
    target = targets.of(program.target)
    members = {f"{at}source/program{target.extension}": program.target_code.encode(),
               f"{at}levels.pkl": _levels(program)}
    if target.name != "cuda":               # HIP: compiled where it loads (ROCm's hiprtc)
        return members, {"archs": []}
    archs = list(archs or CUDA_ARCHS)
    for arch in archs:
        members[f"{at}ptx/{arch}.ptx"] = nvrtc_compile(
            program.target_code, arch=arch, name=program.graph_ir.name, options=NVRTC_OPTIONS)
    return members, {"archs": archs, "nvrtc": nvrtc_version()}


def save(programs, path, archs=None) -> Path:
    """Write a Program (CPU, CUDA or HIP), or a list of them (the same function at several
    shapes, which ``ts.load`` gives back as one ProgramSet), to `path`; returns the path. A
    CUDA program carries PTX for `archs` (default CUDA_ARCHS)."""
    programs = list(programs) if isinstance(programs, (list, tuple)) else [programs]
    members, entries = {}, []
    for k, program in enumerate(programs):
        if getattr(program, "target_code", None) is None:      # (not a Program)
            raise ArgumentError(f"a {type(program).__name__} cannot be saved",
                                hint="save a program from fn.lower(*arrays)")
        if targets.is_gpu(program.target):
            at = f"p{k}/"
            gpu_members, fields = _gpu_members(program, at, archs)
            members.update(gpu_members)
            entries.append({"name": program.graph_ir.name, "target": program.target,
                            "level": None, **fields,
                            "dynamic_sizes": program.dynamic_sizes,
                            "inputs": {p.param_name: str(p.type)
                                       for p in program.graph_ir.params},
                            "outputs": [str(v.type) for v in program.graph_ir.outputs]})
            continue
        if not program._runs_here and program._lib is None:
            raise BackendUnavailableError(f"program @{program.graph_ir.name} is for "
                                          f"{isa.describe(program.level)}, not built here: "
                                          "save it on a machine of that architecture")
        sources = {"program.c": program.target_code, **program.routine_sources}
        at = f"p{k}/"
        members.update({f"{at}source/{name}": text.encode() for name, text in sources.items()})
        members[f"{at}lib/program.so"] = toolchain.build_standalone(sources, program.level)
        members[f"{at}levels.pkl"] = _levels(program)
        entries.append({"name": program.graph_ir.name, "target": program.target,
                        "level": program.level,
                        # a shape-generic library's sizes (compiler/dynamic.py)
                        "dynamic_sizes": program.dynamic_sizes,
                        "inputs": {p.param_name: str(p.type) for p in program.graph_ir.params},
                        "outputs": [str(v.type) for v in program.graph_ir.outputs]})
    manifest = {
        "format": FORMAT, "version": VERSION, "tessera": __version__,
        "machine": platform.machine(),
        "compiler": _compiler_version(),
        "programs": entries,
        "digests": {name: _sha(data) for name, data in members.items()},
    }
    path = Path(path)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(manifest, indent=1))
        for name, data in members.items():
            z.writestr(name, data)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".",
                               prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getvalue())
        os.chmod(tmp, 0o644)                # (mkstemp's file is private)
        os.replace(tmp, path)               # whole, or not at all
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _compiler_version():
    try:
        return toolchain.compiler_version(toolchain.find_compiler())
    except BackendUnavailableError:         # (a GPU program saved where no C compiler is)
        return None


def read_manifest(path) -> dict:
    """The manifest of a saved program (what it was built for, from what)."""
    return read(path)[0]


def read(path) -> tuple[dict, dict]:
    """(manifest, {member name: bytes}) of a saved program, every digest checked."""
    try:
        with zipfile.ZipFile(path) as z:
            manifest = json.loads(z.read("manifest.json"))
            members = {name: z.read(name) for name in z.namelist() if name != "manifest.json"}
    except FileNotFoundError:
        raise ArgumentError(f"no saved program at {path}") from None
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, OSError, EOFError) as e:
        raise TesseraError(f"{path} is not a readable saved program: {e}",
                           hint="the file is damaged or not made by prog.save") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise TesseraError(f"{path} is not a saved tessera program of format version {VERSION}",
                           received=f"{manifest.get('format')} {manifest.get('version')}")
    digests = manifest.get("digests", {})
    for name in sorted(set(digests) | set(members)):
        if name not in members or _sha(members[name]) != digests.get(name):
            what = "is missing" if name not in members else "differs from its digest"
            raise TesseraError(f"{path} is damaged: its member {name} {what}",
                               hint="save the program again")
    return manifest, members
