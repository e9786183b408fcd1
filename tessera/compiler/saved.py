"""Saved programs: ``prog.save("model.tsr")`` and ``ts.load("model.tsr")``.

One file (a zip) holds a compiled CPU program whole: a manifest (format, versions, the target
and its ISA level, the machine, the arguments and results, a SHA-256 digest of every other
member), the IR levels (pickled: Graph IR, its primitive form, Schedule IR with its knobs, Tile
IR), the generated C and the routine libraries' C, and one standalone shared object built from
all of them, which needs no compiler and no kernel cache to load. ``ts.load`` checks the digests
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

import numpy as np

from ..errors import ArgumentError, BackendUnavailableError, TesseraError
from ..runtime import isa, toolchain
from ..version import __version__

FORMAT, VERSION = "tessera-program", 1


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save(programs, path) -> Path:
    """Write a CPU Program, or a list of them (the same function at several shapes, which
    ``ts.load`` gives back as one ProgramSet), to `path`; returns the path."""
    from .pipeline import Program
    programs = list(programs) if isinstance(programs, (list, tuple)) else [programs]
    members, entries = {}, []
    for k, program in enumerate(programs):
        if not isinstance(program, Program):
            raise ArgumentError(f"only CPU programs can be saved yet, not "
                                f"{type(program).__name__}", hint="lower for target='cpu'")
        if not program._runs_here and program._lib is None:
            raise BackendUnavailableError(f"program @{program.graph_ir.name} is for "
                                          f"{isa.describe(program.level)}, not built here: "
                                          "save it on a machine of that architecture")
        sources = {"program.c": program.target_code, **program.routine_sources}
        at = f"p{k}/"
        members.update({f"{at}source/{name}": text.encode() for name, text in sources.items()})
        members[f"{at}lib/program.so"] = toolchain.build_standalone(sources, program.level)
        members[f"{at}levels.pkl"] = pickle.dumps(
            (program.graph_ir, program.primitive_ir, program.schedule_ir, program.tile_ir,
             program.target_code, program.target, program.output_structure),
            protocol=pickle.HIGHEST_PROTOCOL)
        entries.append({"name": program.graph_ir.name, "target": program.target,
                        "level": program.level,
                        "inputs": {p.param_name: str(p.type) for p in program.graph_ir.params},
                        "outputs": [str(v.type) for v in program.graph_ir.outputs]})
    manifest = {
        "format": FORMAT, "version": VERSION, "tessera": __version__,
        "machine": platform.machine(),
        "compiler": toolchain.compiler_version(toolchain.find_compiler()),
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


class ProgramSet:
    """Several programs of one function, one per shape (a saved ``tessera_server`` file): a call
    runs the one whose argument types match, or says which there are."""

    def __init__(self, programs: list):
        self.programs = programs

    def program_for(self, arrays):
        types = [(np.asarray(a).dtype, np.shape(a)) for a in arrays]
        for p in self.programs:
            if types == p._param_types:
                return p
        have = "; ".join(", ".join(str(v.type) for v in p.graph_ir.params)
                         for p in self.programs)
        got = ", ".join(f"{d}{list(shape)}" for d, shape in types)
        raise ArgumentError(f"no saved program takes these arguments ({got})", expected=have,
                            hint="save one for these shapes too")

    def __call__(self, *arrays):
        return self.program_for(arrays)(*arrays)

    def __repr__(self):
        return f"<ProgramSet @{self.programs[0].graph_ir.name}: {len(self.programs)} shapes>"


def read_manifest(path) -> dict:
    """The manifest of a saved program (what it was built for, from what)."""
    return _open(path)[0]


def _open(path):
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


def load(path, recompile: bool = False):
    """The Program saved at `path` (a ProgramSet when it holds several), ready to run on NumPy
    arrays. A program this machine cannot run is an error naming both machines, unless
    `recompile` (then its Graph IR is compiled here: needs a C compiler)."""
    manifest, members = _open(path)
    progs = [_load_one(path, manifest, entry, members, f"p{k}/", recompile)
             for k, entry in enumerate(manifest["programs"])]
    return progs[0] if len(progs) == 1 else ProgramSet(progs)


def _load_one(path, manifest, entry, members, at, recompile):
    from .pipeline import Program, compile_graph
    levels = pickle.loads(members[at + "levels.pkl"])
    graph_ir, output_structure = levels[0], levels[6]
    here, level = platform.machine(), entry["level"]
    if not (manifest["machine"] == here and isa.runs_here(level)):
        if recompile:
            return compile_graph(graph_ir, "cpu", output_structure)
        raise BackendUnavailableError(
            f"{path} holds a program built for {isa.describe(level)} on {manifest['machine']}; "
            f"this machine is {here} running {isa.describe(isa.host_level())}",
            hint=f"ts.load({str(path)!r}, recompile=True) compiles its Graph IR here "
                 "(needs a C compiler)")
    try:
        lib = toolchain.load_standalone(members[at + "lib/program.so"],
                                        manifest["digests"][at + "lib/program.so"])
    except OSError as e:
        if recompile:
            return compile_graph(graph_ir, "cpu", output_structure)
        raise BackendUnavailableError(f"{path}: its shared object does not load here: {e}",
                                      hint="ts.load(..., recompile=True)") from None
    return Program(*levels[:6], lib, output_structure)
