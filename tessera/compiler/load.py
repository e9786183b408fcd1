"""``ts.load``: the programs of a saved file (compiler/saved.py) back, ready to run, or compiled
again for this machine when asked."""
from __future__ import annotations

import pickle
import platform

import numpy as np

from ..errors import ArgumentError, BackendUnavailableError
from ..runtime import isa, targets, toolchain
from .driver import compile_graph
from .program import GPUProgram, Program
from .saved import read


class ProgramSet:
    """Several programs of one function, one per shape (a saved ``tessera_server`` file): a call
    runs the one whose argument types match, or says which there are."""

    def __init__(self, programs: list):
        self.programs = programs

    def program_for(self, arrays):
        types = [(np.dtype(a.dtype), tuple(a.shape)) if hasattr(a, "shape") and
                 hasattr(a, "dtype") else (np.asarray(a).dtype, np.shape(a)) for a in arrays]
        for p in self.programs:
            if types == [(np.dtype(q.type.dtype.np), tuple(q.type.shape))
                         for q in p.graph_ir.params]:
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


def load(path, recompile: bool = False):
    """The Program saved at `path` (a ProgramSet when it holds several), ready to run on NumPy
    arrays. A program this machine cannot run is an error naming both machines, unless
    `recompile` (then its Graph IR is compiled here: needs a C compiler)."""
    manifest, members = read(path)
    progs = [_load_one(path, manifest, entry, members, f"p{k}/", recompile)
             for k, entry in enumerate(manifest["programs"])]
    return progs[0] if len(progs) == 1 else ProgramSet(progs)


def _load_one(path, manifest, entry, members, at, recompile):
    levels = pickle.loads(members[at + "levels.pkl"])
    graph_ir, output_structure = levels[0], levels[6]
    target = targets.of(entry["target"])
    if target.gpu:                              # runs where CuPy finds a device (on first run)
        program = GPUProgram(*levels[:6], output_structure=output_structure,
                             dynamic_sizes=entry.get("dynamic_sizes"))
        program.saved_ptx = {arch: members[f"{at}ptx/{arch}.ptx"]
                             for arch in entry.get("archs", [])}
        return program
    here, level = platform.machine(), entry["level"]
    if not (manifest["machine"] == here and isa.runs_here(level)):
        if recompile:
            return compile_graph(graph_ir, target.name, output_structure)
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
            return compile_graph(graph_ir, target.name, output_structure)
        raise BackendUnavailableError(f"{path}: its shared object does not load here: {e}",
                                      hint="ts.load(..., recompile=True)") from None
    return Program(*levels[:6], lib, output_structure,
                   dynamic_sizes=entry.get("dynamic_sizes"))
