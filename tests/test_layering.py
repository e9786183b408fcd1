"""Imports run one way: the layers of the README's "Layering" section, bottom first. A module may
import from its own layer and the layers below it, never from one above (lazy imports inside
functions count too). The test reads the imports from the source; nothing is imported."""
import ast
from pathlib import Path

import tessera

ROOT = Path(tessera.__file__).parent

# bottom first; a module belongs to the first layer with a prefix naming it or a package above it
LAYERS = [
    ("core", ["tessera.version", "tessera.errors", "tessera.dtypes", "tessera.shapes",
              "tessera.numerics", "tessera.types", "tessera.pytree"]),
    ("operators", ["tessera.ops"]),
    ("runtime", ["tessera.runtime"]),
    ("IR data", ["tessera.compiler.graph_ir", "tessera.compiler.schedule_ir",
                 "tessera.compiler.tile_ir", "tessera.compiler.dynamic"]),
    ("spellings", ["tessera.compiler.spelling"]),
    ("graph passes", ["tessera.compiler.passes", "tessera.compiler.backward",
                      "tessera.compiler.groups"]),
    ("the emitter", ["tessera.compiler.emit"]),
    ("strategies", ["tessera.compiler.strategies"]),
    ("fusion and scheduling", ["tessera.compiler.fusion", "tessera.compiler.scheduler"]),
    ("lowering", ["tessera.compiler.lower"]),
    ("renderers", ["tessera.compiler.target"]),
    ("driver and search", ["tessera.compiler"]),
    # the front end, in layers
    ("tracing", ["tessera.trace", "tessera.op", "tessera.schedule"]),
    ("function", ["tessera.function"]),
    ("transforms", ["tessera.control", "tessera.graph", "tessera.autodiff"]),
    ("tile kernels", [
        "tessera.tiles",
        "tessera.tile",
        "tessera.kernel",
    ]),
    ("libraries", ["tessera.nn", "tessera.optim", "tessera.prob", "tessera.models"]),
    ("tools and bridges", ["tessera.autotune", "tessera.debug", "tessera.interop", "tessera.aten",
                           "tessera.jaxpr", "tessera.migrate", "tessera.onnx"]),
    ("meshes", ["tessera.dist", "tessera.collectives", "tessera.checkpoint", "tessera.fault"]),
    ("viz", ["tessera.viz"]),
    ("lab", ["tessera.lab"]),
    ("public surface", ["tessera"]),      # the package's __init__: what `import tessera` gives
]


def layer_of(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and to the README")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT.parent / rel).with_suffix(".py").exists() or (ROOT.parent / rel).is_dir()


def imports(path: Path):
    """(imported module, line) for every import of a tessera module in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "tessera":
                continue
            for alias in node.names:          # `from .. import ops` imports the module ops
                sub = f"{target}.{alias.name}"
                yield (sub if is_module(sub) else target), node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tessera":
                    yield alias.name, node.lineno


def test_every_import_runs_down_the_layers():
    backwards = []
    for path in sorted(ROOT.rglob("*.py")):
        here = module_name(path)
        for target, line in imports(path):
            if layer_of(target) > layer_of(here):
                backwards.append(f"{path.relative_to(ROOT.parent)}:{line}: {here} "
                                 f"({LAYERS[layer_of(here)][0]}) imports {target} "
                                 f"({LAYERS[layer_of(target)][0]})")
    assert not backwards, "imports that run back up:\n" + "\n".join(backwards)


def test_the_layers_name_every_module_and_the_test_sees_imports():
    names = [module_name(p) for p in ROOT.rglob("*.py")]
    for name in names:
        layer_of(name)
    # the reader itself: a known import, a relative one and a lazy one
    found = dict(imports(ROOT / "compiler" / "lower.py"))
    assert "tessera.compiler.strategies" in found and "tessera.runtime.targets" in found
    lazy = {t for t, _ in imports(ROOT / "schedule.py")}
    assert "tessera.compiler.strategies" in lazy


def test_no_circle_of_imports():
    """Within a layer too, no module reaches itself through its imports (lazy ones counted: a
    lazy import is for an optional dependency or import time, never to break a circle). A
    package's __init__ importing its own modules is not a circle (Python runs it first)."""
    edges = {}
    for path in ROOT.rglob("*.py"):
        here = module_name(path)
        edges[here] = {t for t, _ in imports(path)
                       if t != here and not (path.name == "__init__.py" and
                                             t.startswith(here + "."))
                       and not here.startswith(t + ".")}     # (a module's own package)
    circles, done = [], set()

    def visit(m, stack):
        if m in stack:
            circles.append(" -> ".join(stack[stack.index(m):] + [m]))
            return
        if m in done:
            return
        for t in sorted(edges.get(m, ())):
            visit(t, stack + [m])
        done.add(m)
    for m in sorted(edges):
        visit(m, [])
    assert not circles, "circles of imports:\n" + "\n".join(circles)
