"""The whole lowering: Graph IR → (canonicalise, decompose) → Schedule IR → Tile IR → C → a
loaded shared object, wrapped in a Program that runs on NumPy arrays."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import ArgumentError, BackendUnavailableError, ShapeError, TesseraError
from ..ops.host import HOST_OPS
from ..ops.regions import REGION_OPS
from ..runtime import cache, isa, targets, tunedb
from ..types import type_of_array
from . import dynamic
from .graph_ir import Graph, Node
from .lower import lower_schedule, lower_schedule_gpu
from .passes import PRIMITIVE_RULES, canonicalize, decompose, split_complex
from .scheduler import build_schedule, checked_record, kernel_signature
from .program import GPUProgram, Program, ProgramLevels, ShapeGenericLibrary
from . import target as renderers  # noqa: F401 (importing them registers their targets)


MAX_ELEMENTS = 2 ** 62      # indices are int64 in generated code; keep products far from overflow


def check_sizes(g: Graph):
    for n in g.nodes:
        t = n.out.type
        if t.numel() > MAX_ELEMENTS:
            raise ShapeError(f"a tensor of {t.numel()} elements is too large to compile",
                             function=g.name, location=n.loc, op=n.op, received=str(t),
                             expected="at most 2**62 elements")


def prepare(graph: Graph) -> tuple[Graph, Graph]:
    """The canonical Graph IR and its primitive form (composites decomposed, patterns raised)."""
    g = canonicalize(graph.clone()).verify()
    prim = canonicalize(split_complex(decompose(g)), PRIMITIVE_RULES).verify()
    check_sizes(prim)
    return g, prim


def schedule_graph(prim: Graph, target: str, schedule=None, tuned=True):
    """Schedule IR with knobs from the heuristics, the autotuning database (unless tuned=False or
    TESSERA_AUTOTUNE=0) and the user's Schedule."""
    db = tunedb.active() if tuned else None
    fusion = schedule is None or schedule.fusion is not False
    if db is None:
        return build_schedule(prim, target, fusion=fusion, user=schedule).verify()
    path, exact = db

    def lookup(k):
        record = tunedb.tuned_knobs(path, kernel_signature(k), target)
        if record is None:
            return None
        knobs, why = checked_record(k, record, exact)
        if why:
            tunedb.warn_bad_record(path, k.name, why)
        return knobs
    return build_schedule(prim, target, fusion=fusion, user=schedule, tuned=lookup).verify()


def available_targets() -> list[str]:
    """The registered targets this machine can run: cpu (with a C compiler), cuda or hip where
    CuPy finds a device, and any other whose Target says so."""
    return [t.name for t in targets.all_targets() if t.runs_here()]


def auto_target(arrays) -> str:
    """target="auto": the GPU of CuPy inputs when there is one, else the CPU."""
    if any(hasattr(a, "__cuda_array_interface__") for a in arrays):
        runnable = [t.name for t in targets.all_targets() if t.gpu and t.runs_here()]
        if runnable:
            return runnable[0]
    return "cpu"


def resolve_target(target: str, arrays=()) -> str:
    """The canonical target: "auto" chosen from the arrays, "cpu" -> "cpu:<ISA level>"."""
    if target == "auto":
        target = auto_target(arrays)
    return targets.resolve(target)


def compile_graph(graph: Graph, target: str = "cpu", output_structure=None,
                  schedule=None):
    """The program of a graph for a target; its results come back as the graph returned them
    (graph.output_structure unless `output_structure` says otherwise)."""
    output_structure = output_structure or graph.output_structure
    target = resolve_target(target)
    if _calls_host(graph):
        return SplitProgram(graph, target, output_structure, schedule)
    g, prim, schedule, tile = lower_graph(graph, target, schedule)
    t = targets.of(target)
    source, lib = t.compile(tile, graph.name, target)
    if t.gpu:
        return GPUProgram(g, prim, schedule, tile, source, target,
                          output_structure=output_structure)
    return Program(g, prim, schedule, tile, source, target, lib, output_structure)


def lower_graph(graph: Graph, target: str, schedule=None) -> tuple:
    """(canonical Graph IR, primitive Graph IR, Schedule IR, verified Tile IR) of a graph for
    a resolved target."""
    g, prim = prepare(graph)
    sched = schedule_graph(prim, target, schedule)
    if targets.is_gpu(target):
        return g, prim, sched, lower_schedule_gpu(sched, target).verify()
    return g, prim, sched, lower_schedule(sched).verify()


# ---- shape-generic programs (compiler/dynamic.py) ------------------------------------------------
def compile_dynamic(graph: Graph, target: str, sizes: dict, generics: list,
                    output_structure=None, schedule=None):
    """The program of a graph traced with DynamicSizes for the dynamic symbols (`sizes`: each
    symbol's size in this call), running one of `generics` (ShapeGenericLibrary objects or GPU
    modules of the same function, earlier sizes) where one serves it, else a new shape-generic
    one, which joins `generics`. A graph with host calls, or for another CPU architecture, gets
    a specialised program."""
    output_structure = output_structure or graph.output_structure
    target = resolve_target(target)
    t, level = targets.of(target), targets.level(target)
    if _calls_host(graph) or not (t.gpu or isa.same_arch(level)):
        return compile_graph(graph, target, output_structure, schedule)
    g, prim, sched, tile = lower_graph(graph, target, schedule)
    here = dynamic.structure(tile)
    generic = next((gen for gen in generics if gen.serves(here, sizes)), None)
    if generic is not None:
        cache.count("dynamic_reuses")
    else:
        frozen = replace(tile, kernels=dynamic.freeze(tile.kernels))
        source, lib = t.compile(frozen, graph.name, target, list(sizes))
        generic = ShapeGenericLibrary(frozen, source, lib)
        if all(gen.source != source for gen in generics):   # (threads may race to one)
            generics.append(generic)
    values = {s: int(v) for s, v in sizes.items()}
    if t.gpu:
        return GPUProgram(g, prim, sched, tile, generic.source, target,
                          output_structure=output_structure, dynamic_sizes=values)
    return Program(g, prim, sched, tile, generic.source, target, generic.library,
                   output_structure, dynamic_sizes=values)


# ---- graph breaks ---------------------------------------------------------------------------------
class HostPart:
    """A host call between two compiled parts: the node, run by the host on the arrays named by
    its operands."""

    def __init__(self, node):
        self.node = node

    def run(self, env: dict):
        n = self.node
        out = np.asarray(n.attrs["fn"].call([env[v.id] for v in n.inputs]))
        t = n.out.type
        if out.shape != tuple(t.shape) or out.dtype != t.dtype.np:
            raise TesseraError(f"{n.attrs['fn'].name} returned "
                               f"{type_of_array(out)}, where its first call gave {t}",
                               location=n.loc, op=n.op,
                               hint="a host call must give the same shape and dtype each time")
        env[n.out.id] = out


class CompiledPart:
    """The nodes between two host calls as a program of their own: its parameters are the
    values they read from before (the function's parameters, earlier parts' results), its
    results the values read after."""

    def __init__(self, graph: Graph, reads: list, writes: list, program):
        self.graph, self.reads, self.writes, self.program = graph, reads, writes, program

    def run(self, env: dict):
        outs = self.program.run(*[env[v.id] for v in self.reads])
        env.update(zip((v.id for v in self.writes), outs))


def _bodies(n) -> list:
    region = n.attrs.get("region") if n.op in REGION_OPS else None
    return list(region.bodies.values()) if region is not None else []


def _calls_host(graph: Graph) -> bool:
    return any(n.op in HOST_OPS or any(_calls_host(b) for b in _bodies(n)) for n in graph.nodes)


def split_at_host_calls(graph: Graph) -> list:
    """The graph's nodes in order as compiled parts (graphs) and host calls: [(nodes, host
    node or None)], each run of nodes ending at the host call after it (None: the last)."""
    for n in graph.nodes:
        if any(_calls_host(b) for b in _bodies(n)):
            raise TesseraError("a host call (a wrapped PyTorch layer) inside a control-flow "
                               "body is not supported", function=graph.name, location=n.loc,
                               op=n.op, hint="call it outside the loop, or import the layer "
                                             "with ts.from_torch")
    runs, current = [], []
    for n in graph.nodes:
        if n.op in HOST_OPS:
            runs.append((current, n))
            current = []
        else:
            current.append(n)
    runs.append((current, None))
    return runs


class SplitProgram:
    """A program with host calls: compiled parts and the host's calls, run in order on one table
    of arrays (a graph break at each call: fusion does not cross it). Every part is an ordinary
    program (`parts`), with its own IR levels."""

    def __init__(self, graph: Graph, target: str, output_structure, schedule=None):
        self.graph_ir, self.target, self.output_structure = graph, target, output_structure
        if targets.is_gpu(target):
            raise BackendUnavailableError(
                "host calls (wrapped PyTorch layers) run in programs for the CPU only",
                function=graph.name, hint="use target='cpu', or import the layer with "
                                          "ts.from_torch")
        const_nodes = {n.out.id: n for n in graph.nodes if n.op == "const"}
        self.consts = {i: n.attrs["value"] for i, n in const_nodes.items()}
        runs = split_at_host_calls(graph)
        later = _reads_after(graph, runs)
        self.parts = []
        for k, (nodes, host) in enumerate(runs):
            mine = {n.out.id for n in nodes}
            writes = [n.out for n in nodes if n.op != "const" and n.out.id in later[k]]
            if writes:
                self.parts.append(self._compile(graph, k, nodes, mine, writes, const_nodes,
                                                target, schedule))
            if host is not None:
                self.parts.append(HostPart(host))

    @staticmethod
    def _compile(graph, k, nodes, mine, writes, const_nodes, target, schedule) -> CompiledPart:
        g = Graph(f"{graph.name}_part{k}", bindings=graph.bindings)
        vmap, reads = {}, []
        for n in nodes:
            for v in n.inputs:
                if v.id in mine or v.id in vmap:
                    continue
                if v.id in const_nodes:         # a constant of another part: its own copy
                    c = const_nodes[v.id]
                    m = Node("const", [], c.attrs, c.out.type, c.loc, c.origin)
                    g.nodes.append(m)
                    vmap[v.id] = m.out
                else:
                    vmap[v.id] = g.add_param(f"v{len(reads)}", v.type)
                    reads.append(v)
            m = Node(n.op, [vmap[v.id] for v in n.inputs], n.attrs, n.out.type, n.loc, n.origin)
            g.nodes.append(m)
            vmap[n.out.id] = m.out
        g.outputs = [vmap[v.id] for v in writes]
        g.output_structure = "list"
        return CompiledPart(g, reads, writes, compile_graph(g, target, schedule=schedule))

    def run(self, *arrays) -> list:
        params = self.graph_ir.params
        if len(arrays) != len(params):
            raise ArgumentError(f"program @{self.graph_ir.name} takes {len(params)} arrays, "
                                f"got {len(arrays)}")
        env = dict(self.consts)
        env.update((p.id, np.asarray(a)) for p, a in zip(params, arrays))
        for part in self.parts:
            part.run(env)
        return [np.array(env[v.id]) for v in self.graph_ir.outputs]

    __call__ = ProgramLevels.__call__
    output_tree = ProgramLevels.output_tree

    @property
    def kernels(self):
        return [k for p in self.parts if isinstance(p, CompiledPart) for k in p.program.kernels]

    @property
    def steps(self):
        return self.parts

    def _levels(self, what):
        raise TesseraError(f"program @{self.graph_ir.name} is in parts, cut at its host calls: "
                           f"its {what} is each part's (prog.parts[i].program.{what})")

    def memory(self):
        self._levels("memory()")

    schedule_ir = property(lambda self: self._levels("schedule_ir"))
    tile_ir = property(lambda self: self._levels("tile_ir"))
    primitive_ir = property(lambda self: self._levels("primitive_ir"))

    @property
    def target_code(self) -> str:
        out = []
        for p in self.parts:
            out.append(p.program.target_code if isinstance(p, CompiledPart) else
                       f"/* host call: {p.node.attrs['fn'].name} (a graph break) */")
        return "\n\n".join(out)

    def save(self, path):
        raise TesseraError(f"program @{self.graph_ir.name} calls the host (a wrapped PyTorch "
                           "layer), which a saved file cannot hold",
                           hint="import the layer with ts.from_torch instead")

    def __str__(self):
        return "\n\n".join([str(self.graph_ir)] + [
            str(p.program) if isinstance(p, CompiledPart) else
            f"host call {p.node.attrs['fn'].name}" for p in self.parts])

    def __repr__(self):
        hosts = sum(isinstance(p, HostPart) for p in self.parts)
        parts = len(self.parts) - hosts
        return (f"<SplitProgram @{self.graph_ir.name} target={self.target}: {parts} compiled "
                f"part{'s' * (parts != 1)}, {hosts} host call{'s' * (hosts != 1)}>")


def _reads_after(graph: Graph, runs) -> list:
    """Per run of nodes, the ids read after it: by later runs' nodes, later host calls (its
    own included) and the graph's outputs."""
    later, seen = [], {v.id for v in graph.outputs}
    for nodes, host in reversed(runs):
        if host is not None:
            seen |= {v.id for v in host.inputs}
        later.append(set(seen))
        for n in nodes:
            seen |= {v.id for v in n.inputs}
    return list(reversed(later))
