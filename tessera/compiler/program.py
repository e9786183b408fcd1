"""The programs the compiler gives: every IR level to read, the source, and a run on arrays.
`Program` runs a loaded C library on the CPU, `GPUProgram` a CUDA or HIP module (compiled on
its first run); `ShapeGenericLibrary` is a compiled library that serves many sizes
(compiler/dynamic.py). compiler/driver.py makes them."""
from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, BackendUnavailableError
from ..runtime import isa, targets
from ..runtime.cpu import CpuExecutor
from ..runtime.profiler import memory_of
from ..runtime.program import steps_of
from ..types import type_of_array
from . import dynamic
from .graph_ir import Graph
from .saved import save
from .target.c import routine_library_source
from .target.cstyle import routine_keys


class ProgramLevels:
    """What every program shows: the IR levels, the source, and how it prints."""

    def __init__(self, graph_ir: Graph, primitive_ir: Graph, schedule_ir, tile_ir, target_code,
                 target, output_structure):
        self.graph_ir = graph_ir
        self.primitive_ir = primitive_ir
        self.schedule_ir = schedule_ir
        self.tile_ir = tile_ir
        self.target_code = target_code
        self.target = target
        self.output_structure = output_structure
        self.steps = steps_of(tile_ir)      # what the runtime runs (kernel launches, in order)
        # complex arrays are passed as their float parts, interleaved (no copy): ops/complex.py
        self._complex_in = [p.type.dtype.is_complex for p in graph_ir.params]
        outs = [v.type if v.type.dtype.is_complex else None for v in graph_ir.outputs]
        self._complex_out = outs if any(outs) else None
        self.has_complex = any(self._complex_in) or self._complex_out is not None

    def as_parts(self, arrays: list) -> list:
        """Checked arguments as the kernels take them: a complex array viewed as its float parts
        on a last axis of 2 (NumPy's or CuPy's: a view, no copy; C-contiguous arrays)."""
        # (a trailing axis of 1 first: NumPy views no 0-d array as another itemsize)
        return [a.reshape(tuple(p.type.shape) + (1,)).view(a.real.dtype) if c else a
                for a, c, p in zip(arrays, self._complex_in, self.graph_ir.params)]

    def as_complex(self, outs: list, xp) -> list:
        """Results as the user gets them: a complex result's float parts viewed as complex."""
        if not self._complex_out:
            return outs
        return [a if t is None else
                xp.ascontiguousarray(a).view(t.dtype.np).reshape(tuple(t.shape))
                for a, t in zip(outs, self._complex_out)]

    @property
    def kernels(self):
        return self.schedule_ir.kernels

    def memory(self):
        """What the program holds while it runs, line by line (a profiler.MemoryReport)."""
        return memory_of(self)

    @property
    def output_tree(self):
        """The structure of a pytree of results (None for a tensor, a tuple or a list)."""
        return self.graph_ir.output_tree

    def save(self, path, archs=None):
        """This program in one file that ``ts.load`` runs without a compiler (every IR level,
        the source, a standalone shared object or, for CUDA, PTX per architecture in `archs`;
        digests: tessera/compiler/saved.py)."""
        return save(self, path, archs=archs)

    def __call__(self, *arrays):
        out = self.run(*arrays)
        return out[0] if self.output_structure in (None, "single") else \
            (tuple(out) if self.output_structure == "tuple" else list(out))

    def __str__(self):
        return "\n\n".join([str(self.graph_ir), str(self.schedule_ir), str(self.tile_ir),
                            self.target_code])

    def __repr__(self):
        return (f"<Program @{self.graph_ir.name} target={self.target}: "
                f"{len(self.schedule_ir.kernels)} kernels>")


class Program(ProgramLevels):
    """A Tessera function specialised to concrete shapes, with every IR level to read."""

    def __init__(self, graph_ir: Graph, primitive_ir: Graph, schedule_ir, tile_ir, target_code,
                 target, library, output_structure=None, dynamic_sizes=None):
        super().__init__(graph_ir, primitive_ir, schedule_ir, tile_ir, target_code, target,
                         output_structure)
        self._lib = library             # None: built for another architecture, not built here
        # {symbol: size} this program runs a shape-generic library at (target_code is that
        # library's source: compiler/dynamic.py); None for a specialised one
        self.dynamic_sizes = dynamic_sizes
        self._param_types = [(p.type.dtype.np, tuple(p.type.shape)) for p in graph_ir.params]
        self.level = targets.level(target)
        self._runs_here = isa.runs_here(self.level)
        self._execute = CpuExecutor(self, library, self.steps).execute   # on checked inputs

    @property
    def routine_sources(self) -> dict:
        """The C of the routine libraries this program is linked against, by file name
        ("routine_gemm_f32.c"): with `target_code`, what a build of the program elsewhere (a
        cross-compiler) compiles, each file a translation unit of its own."""
        return {f"routine_{key.replace(':', '_')}.c": routine_library_source(key)
                for key in routine_keys(self.tile_ir)}

    def run(self, *arrays):
        """Run on NumPy arrays of exactly the specialised types; returns a list of arrays."""
        if not self._runs_here:
            built = "built" if self._lib is not None else "lowered (not compiled: another " \
                                                          "architecture)"
            raise BackendUnavailableError(
                f"program @{self.graph_ir.name} was {built} for {isa.describe(self.level)}, which "
                f"this CPU cannot run (it runs {isa.describe(isa.host_level())})",
                function=self.graph_ir.name,
                hint="its IR levels and C source are all there to read; to run, use target="
                     f"'cpu:{isa.host_level()}' or a level below it")
        params = self.graph_ir.params
        if len(arrays) != len(params):
            raise ArgumentError(f"program @{self.graph_ir.name} takes {len(params)} arrays, "
                                f"got {len(arrays)}")
        inputs = []
        for p, a, (npd, shape) in zip(params, arrays, self._param_types):
            if hasattr(a, "__cuda_array_interface__"):
                raise ArgumentError(f"%{p.param_name} is a GPU array, given to a CPU program",
                                    function=self.graph_ir.name,
                                    hint="use target='cuda' (or 'auto'), or copy it to the "
                                         "host with cupy.asnumpy")
            a = np.asarray(a)
            if a.shape != shape or a.dtype.kind != npd.kind or a.dtype.itemsize != npd.itemsize:
                raise ArgumentError(f"program @{self.graph_ir.name} was specialised for "
                                    f"%{p.param_name}: {p.type}", expected=str(p.type),
                                    received=str(type_of_array(a)),
                                    hint="call the tessera function instead: it specialises anew")
            inputs.append(np.require(a, dtype=npd, requirements="C"))
        return self.as_complex(self._execute(self.as_parts(inputs)), np)


class GPUProgram(ProgramLevels):
    """A program for CUDA or HIP. Every IR level and the source exist on any machine; running
    (on CuPy arrays, or NumPy arrays copied to the device) needs CuPy and a device, and the
    module is compiled on the first run."""

    def __init__(self, *levels, output_structure=None, dynamic_sizes=None):
        super().__init__(*levels, output_structure)
        self.dynamic_sizes = dynamic_sizes      # as Program's: a shape-generic module's sizes
        self._module = None
        self.flags_errors = self.tile_ir.flags_errors   # else a run need not wait for its kernels
        self.saved_ptx: dict = {}       # arch -> PTX, from a saved file (no NVRTC needed)

    def run(self, *arrays):
        from ..runtime import gpu
        return gpu.run(self, arrays)


class ShapeGenericLibrary:
    """A compiled shape-generic library and the frozen tile program it was rendered from."""

    def __init__(self, frozen, source: str, library):
        self.structure = dynamic.structure(frozen)
        self.source, self.library = source, library

    def serves(self, here: tuple, sizes: dict) -> bool:
        """Whether this library, at these sizes, runs exactly the tile program whose
        structure is `here`."""
        return dynamic.same_at(self.structure, here, sizes)
