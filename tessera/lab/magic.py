"""`%%tessera` and `%tessera`: the compiler inside the notebook."""
from __future__ import annotations

import ast
import inspect
import types

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from ..errors import ArgumentError, TesseraError
from ..function import Function, def_location
from ..runtime import targets
from ..types import TensorSpec
from .explorer import LEVELS, Explorer, needs_arrays, parse_shapes


@magics_class
class TesseraMagics(Magics):

    @magic_arguments.magic_arguments()
    @magic_arguments.argument("function", nargs="?",
                              help="(line magic) a tessera function of the namespace to explore")
    @magic_arguments.argument("--target", default="cpu",
                              help="where to lower: cpu, cpu:LEVEL (an ISA level such as "
                                   "x86-64-v3), cuda, hip, or auto (a GPU when there is one, "
                                   "else the CPU)")
    @magic_arguments.argument("--shapes", default=None, metavar="B=8,S=128,D=64",
                              help="concrete sizes for the symbolic dimensions; without them the "
                                   "explorer shows the symbolic Graph IR")
    @magic_arguments.argument("--show", default=",".join(LEVELS), metavar="LEVELS",
                              help="the IR levels to show, from graph,schedule,tile,target")
    @magic_arguments.argument("--profile", action="store_true",
                              help="run the program on example inputs and show per-kernel times "
                                   "and a roofline")
    @magic_arguments.argument("--autotune", action="store_true",
                              help="search the kernels' knobs and show the candidates")
    @magic_arguments.argument("--budget", type=float, default=10.0, metavar="SECONDS",
                              help="the autotuning budget (default 10 s)")
    @magic_arguments.argument("--dynamic", default="", metavar="B,S",
                              help="symbols whose sizes vary from call to call: the cell's "
                                   "functions compile shape-generic libraries for them "
                                   "(ts.function(f, dynamic=...))")
    @magic_arguments.argument("--name", default=None,
                              help="which function of the cell to explore (default: the last "
                                   "one defined)")
    @magic_arguments.argument("--mesh", default=None, metavar="dp=2,tp=2",
                              help="run the cell on MPI ranks instead, one per device of a mesh "
                                   "with these axes: there `mesh` is that mesh and the "
                                   "notebook's values the cell reads are copied in; each rank's "
                                   "output is shown in rank order, and the cell's value is the "
                                   "list of every rank's last expression")
    @magic_arguments.argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                              help="with --mesh: how long the ranks may run (default 600 s)")
    @line_cell_magic
    def tessera(self, line, cell=None):
        """Compile the tessera functions a cell defines and explore the last one.

        A plain `def` whose parameters carry Tensor[...] annotations becomes a tessera function
        too. The functions are bound in the notebook's namespace; the explorer shows the Graph IR
        with every edge's shape (and the fused kernels as clusters), the Schedule, Tile and
        Target levels, and, when asked, a profile and an autotuning search. A shape error stops
        the cell with the lines of the error, pointing at the cell's own line numbers, and the
        graph traced so far with the failing operator marked.

        As a line magic, `%tessera fn --shapes B=8` explores a function defined earlier, and a
        bare `%tessera` prints what this machine can target. `%%tessera --mesh dp=4` runs the
        cell on MPI ranks instead (see the option).
        """
        __tracebackhide__ = True    # an error in the cell shows the cell's frames, not ours
        args = magic_arguments.parse_argstring(self.tessera, line)
        if args.mesh is not None:
            if cell is None or args.function:
                raise UsageError("--mesh runs a cell: %%tessera --mesh dp=4 on its own line")
            return _run_on_mesh(self.shell, cell, args.mesh, args.timeout)
        try:
            sizes = parse_shapes(args.shapes)
        except ArgumentError as e:
            raise UsageError(f"--shapes: {e.summary}") from None
        show = [s.strip() for s in args.show.split(",") if s.strip()]
        bad = [s for s in show if s not in LEVELS]
        if bad:
            raise UsageError(f"--show: unknown level {bad[0]!r}; choose from {', '.join(LEVELS)}")
        target = _resolve_target(args.target)
        options = dict(target=target, show=show, profile=args.profile, autotune=args.autotune,
                       budget_s=args.budget)
        if cell is None:
            return self._line(args, sizes, options)
        if args.function:
            raise UsageError("%%tessera takes no function name; use --name to pick one of the "
                             "cell's functions")
        dynamic = tuple(s.strip() for s in args.dynamic.split(",") if s.strip())
        defined = self._run_cell(cell, dynamic)
        ns = self.shell.user_ns
        if args.name is not None:
            chosen = _as_tessera_function(ns.get(args.name))
            if chosen is None:
                raise UsageError(f"--name {args.name}: no tessera function of that name")
        elif defined:
            chosen = defined[-1]
        else:
            print("%%tessera: the cell defines no tessera function (a def whose parameters "
                  "carry Tensor[...] annotations, or one made with tessera.function)")
            return None
        for fn in defined:      # the others too, where the sizes are all they need
            if fn is not chosen and fn.symbols() and set(fn.symbols()) <= set(sizes) and \
                    not needs_arrays(fn):
                _explore(fn, sizes, options, build=False)
        return _explore(chosen, sizes, options)

    def _line(self, args, sizes, options):
        if not args.function:
            from ..version import __version__
            from ..compiler.driver import available_targets
            print(f"tessera {__version__}: targets on this machine: "
                  f"{', '.join(available_targets())}")
            return None
        fn = self.shell.user_ns.get(args.function)
        if fn is None:
            raise UsageError(f"%tessera: {args.function!r} is not defined")
        fn = _as_tessera_function(fn) or fn
        if not _is_tessera_function(fn) and not hasattr(fn, "schedule_ir"):
            raise UsageError(f"%tessera: {args.function} is neither a tessera function nor a "
                             "program")
        return _explore(fn, sizes, options)

    def _run_cell(self, cell: str, dynamic=()) -> list:
        """Run the cell in the user's namespace a statement at a time, as IPython does, binding
        each annotated plain function as a tessera one as soon as its `def` has run (so the
        cell's own later lines call the compiled function, and an error leaves every function
        defined before it bound), dynamic in those of `dynamic`'s symbols it has. Returns the
        tessera functions the cell defined, in order."""
        __tracebackhide__ = True
        shell = self.shell
        # one blank line for the %%tessera line, so code line numbers are the cell's own
        source = "\n" + cell
        filename = shell.compile.cache(source, _running_cell(shell), raw_code=source)
        tree = shell.compile.ast_parse(source, filename)
        ns = shell.user_ns
        found = {}
        for node in tree.body:
            before = dict(ns)
            exec(shell.compile(ast.Module([node], type_ignores=[]), filename, "exec"), ns)
            for name in [n for n in found if n not in ns]:      # deleted
                del found[name]
            for name, value in list(ns.items()):
                if before.get(name, before) is value:
                    continue
                found.pop(name, None)           # rebound: now last, or gone
                if isinstance(value, types.FunctionType) and _defined_in(value, filename) and \
                        _tensor_annotated(value):
                    value = ns[name] = _bind(value, dynamic)
                if _is_tile_kernel(value) and _defined_in(value.fn, filename):
                    found[name] = value.as_function()      # the kernel stays as it is in ns
                elif _is_tessera_function(value) and _defined_in(_root(value), filename):
                    found[name] = value
        return list(found.values())


def _parse_mesh(spec: str) -> dict:
    """'dp=2,tp=2' -> {'dp': 2, 'tp': 2}."""
    axes = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, eq, size = part.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier() or not size.strip().isdigit() or \
                int(size) < 1 or name in axes:
            raise UsageError(f"--mesh {spec!r}: each axis as name=size, sizes positive, "
                             "names distinct (--mesh dp=2,tp=2)")
        axes[name] = int(size)
    if not axes:
        raise UsageError("--mesh needs axes: --mesh dp=4")
    return axes


def _run_on_mesh(shell, cell: str, spec: str, timeout: float):
    """The cell on as many MPI ranks as the mesh has devices (`dist.launch`), with the
    notebook's values it reads (modules by name); the list of the ranks' last values."""
    import math

    from ..dist.launch import ModuleByName, launch, run_source
    try:
        from cloudpickle import dumps
    except ImportError:             # launch says what to install
        dumps = repr
    axes = _parse_mesh(spec)
    tree = ast.parse(cell)
    names = [n for n in ast.walk(tree) if isinstance(n, ast.Name)]
    reads = {n.id for n in names if isinstance(n.ctx, ast.Load)}
    # a name the cell also assigns may not need the notebook's value: sent when it can be
    assigned = {n.id for n in names if not isinstance(n.ctx, ast.Load)}
    inputs = {}
    for name in sorted(reads):
        if name == "mesh" or name.startswith("_") or name not in shell.user_ns:
            continue
        value = shell.user_ns[name]
        if isinstance(value, types.ModuleType):
            inputs[name] = ModuleByName(value.__name__)
            continue
        try:
            dumps(value)
        except Exception as e:                              # noqa: BLE001
            if name in assigned:
                continue
            raise UsageError(f"--mesh: the notebook's {name!r} cannot be copied to the ranks "
                             f"({type(e).__name__}: {e}); make it in the cell") from None
        inputs[name] = value
    results = launch(run_source, math.prod(axes.values()), cell, inputs, axes,
                     timeout=timeout)
    return None if all(r is None for r in results) else results


def _explore(fn, sizes, options, build=True):
    """The explorer of fn (or, with build=False, only its compilation). The symbolic trace
    comes first: it names the user's line of a shape error whatever the sizes."""
    try:
        if _is_tessera_function(fn):
            if all(p.spec is not None and p.spec.dims is not None for p in fn.signature.params):
                fn.graph_ir
            if not build:
                fn.specialize(sizes, options["target"])
                return None
        return Explorer(fn, sizes, **options)
    except TesseraError as e:
        if e.partial_graph is not None:
            display(Explorer(fn, sizes, error=e))
        raise e.with_traceback(None) from None


def _resolve_target(name: str) -> str:
    if name != "auto":
        from ..compiler.driver import resolve_target
        try:
            resolve_target(name)            # checked here; resolved again at each lowering
        except TesseraError as e:
            raise UsageError(f"--target: {e.summary}; {e.hint}") from None
        return name
    from ..compiler.driver import available_targets
    runnable = available_targets()
    return next((t for t in runnable if targets.is_gpu(t)), "cpu")


def _bind(fn, dynamic=()):
    """A plain annotated function as a tessera function, dynamic in those of `dynamic`'s
    symbols its annotations use; an error names its `def` line."""
    try:
        f = Function(fn)
        mine = tuple(s for s in dynamic if s in f.symbols())
        return Function(fn, dynamic=mine) if mine else f
    except TesseraError as e:
        if e.location is None:
            e.location = def_location(fn)
        raise e.with_traceback(None) from None


def _as_tessera_function(x):
    """x as a tessera function (a plain def with Tensor annotations becomes one, a tile kernel
    its function), or None."""
    if isinstance(x, types.FunctionType) and _tensor_annotated(x):
        return _bind(x)
    if _is_tile_kernel(x):
        return x.as_function()
    return x if _is_tessera_function(x) else None


def _root(fn):
    """The Python function a tessera function (or a transform of one, ts.grad(f)) traces."""
    while getattr(fn, "transformed", None) is not None:
        fn = fn.transformed
    return getattr(fn, "fn", fn)


def _is_tile_kernel(x) -> bool:
    from ..kernel.function import KernelFunction
    return isinstance(x, KernelFunction)


def _is_tessera_function(x) -> bool:
    return isinstance(x, Function)


def _running_cell(shell) -> int:
    """The number of the cell running this magic (its In[n]), from the frame of the cell's own
    code: execution_count is already the next cell's number under ipykernel, not under a
    terminal IPython."""
    known = getattr(shell.compile, "_filename_map", {})
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_filename in known:
            return known[frame.f_code.co_filename]
        frame = frame.f_back
    return shell.execution_count


def _defined_in(fn, filename) -> bool:
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_filename == filename


def _tensor_annotated(fn) -> bool:
    try:
        sig = inspect.signature(fn, eval_str=True)
    except (NameError, TypeError, ValueError):
        return False
    return any(isinstance(p.annotation, TensorSpec) for p in sig.parameters.values())
