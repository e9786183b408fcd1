"""The notebook extension, driven in a real IPython shell and in a real Jupyter kernel."""
import base64
import importlib.util
import re

import numpy as np
import pytest

IPython = pytest.importorskip("IPython", reason="the lab needs IPython (the test extra has it)")
from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

import tessera as ts  # noqa: E402

ATTENTION = '''
from tessera import Tensor, op

def attention(q: Tensor["B", "S", "D"], k: Tensor["B", "S", "D"], v: Tensor["B", "S", "D"]):
    s = op.matmul(q, k.T) * 0.125
    return op.matmul(op.softmax(s), v)
'''


@pytest.fixture
def shell():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "tessera")
    yield ip
    ip.reset()


def run_magic(ip, line, cell):
    with capture_output() as cap:
        result = ip.run_cell_magic("tessera", line, cell)
    return result, cap


def test_cell_binds_a_compiled_function_that_matches_numpy(shell, rng):
    explorer, _ = run_magic(shell, "--shapes B=2,S=8,D=4", ATTENTION)
    fn = shell.user_ns["attention"]
    assert isinstance(fn, ts.Function)              # the plain def became a tessera function
    q, k, v = (rng.standard_normal((3, 5, 4)).astype(np.float32) for _ in range(3))
    s = q @ k.transpose(0, 2, 1) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(fn(q, k, v), want, rtol=1e-5, atol=1e-6)
    assert explorer.program is not None and explorer.sizes == {"B": 2, "S": 8, "D": 4}


def test_explorer_html_holds_every_level_and_the_shape_labels(shell):
    explorer, _ = run_magic(shell, "--shapes B=2,S=8,D=4", ATTENTION)
    page = explorer._repr_mimebundle_()["text/html"]
    assert "<svg" not in page                   # stripped from an untrusted notebook's HTML
    page = _drawn(page)
    for title in ("Graph", "Schedule", "Tile", "Target"):
        assert f"<b>{title}</b>" in page
    prog = explorer.program
    # every Graph IR value's concrete type labels an edge of the drawing
    for n in prog.graph_ir.nodes:
        assert str(n.out.type) in page, n.out.type
    for k in prog.schedule_ir.kernels:                  # each kernel in the schedule table
        assert k.name in page
    assert "kernel k" in _text(page)                     # the Tile IR
    assert "tessera_entry" in page                       # the C
    # static: no addresses, no random ids, same page from a second lowering
    assert not re.search(r"0x[0-9a-f]{6,}", page)
    again, _ = run_magic(shell, "--shapes B=2,S=8,D=4", ATTENTION)
    assert _drawn(again._repr_mimebundle_()["text/html"]) == page


def test_without_shapes_the_graph_is_symbolic_and_asks_for_sizes(shell):
    explorer, _ = run_magic(shell, "", ATTENTION)
    assert explorer.program is None
    page = _drawn(explorer._repr_html_())
    assert "f32[B,S,D]" in page and "f32[B,S,S]" in page
    assert "--shapes B=8,S=8,D=8" in page
    assert "symbolic" in explorer._repr_mimebundle_()["text/plain"]


def test_show_selects_levels_and_name_picks_a_function(shell):
    cell = ATTENTION + '''
def scale(x: Tensor["N"]):
    return x * 2.0
'''
    explorer, _ = run_magic(shell, "--shapes B=2,S=4,D=4 --show graph,tile --name attention",
                            cell)
    assert explorer.name == "attention"
    assert [k for k, _ in explorer.sections] == ["graph", "tile"]
    last, _ = run_magic(shell, "--shapes N=5", cell)        # default: the last one defined
    assert last.name == "scale"


def test_shape_error_names_the_cell_line_shows_the_partial_graph_and_raises(shell):
    cell = '''from tessera import Tensor, op

def bad(x: Tensor["B", "S", "D"], w: Tensor["E", "F"]):
    y = op.exp(x)
    return op.matmul(y, w)
'''
    n = shell.execution_count
    with capture_output() as cap:
        result = shell.run_cell("%%tessera --shapes B=2,S=3,D=4,E=5,F=6\n" + cell)
    err = result.error_in_exec
    assert isinstance(err, ts.ShapeError)                 # still raised: run-all stops
    # `return op.matmul(y, w)` is line 6 of the cell In[n] (line 1 is the %%tessera line)
    assert str(err.location) == f"In[{n}]:6"
    shown = cap.stdout + cap.stderr
    assert f"In[{n}]:6" in shown and "return op.matmul(y, w)" in shown
    assert "Traceback" not in shown                     # a few lines, not the compiler's stack
    page = _drawn(cap.outputs[0].data["text/html"])       # the explorer of the partial graph
    assert "f32[B,S,D]" in page and "exp" in page and "matmul" in page
    # the error is said once, by the raised error: the drawing names the operator and line only
    assert "return op.matmul(y, w)" not in _text(page) and f"matmul at In[{n}]:6" in page


def test_dynamic_compiles_a_shape_generic_library(shell):
    explorer, _ = run_magic(shell, "--shapes B=3,S=8,D=4 --dynamic B", ATTENTION)
    assert explorer.program.dynamic_sizes == {"B": 3}
    page = _drawn(explorer._repr_mimebundle_()["text/html"])
    assert "ts_size_B" in page and "shape-generic library" in page
    fn = shell.user_ns["attention"]
    assert fn.dynamic == ("B",)
    x = np.random.default_rng(0).standard_normal((4, 8, 4)).astype(np.float32)
    ts.reset_cache_stats()
    fn(x, x, x)                             # a new size of B, in 3's bucket: the library serves it
    assert ts.cache_stats()["dynamic_reuses"] == 1


def test_bad_options_are_usage_errors(shell):
    with pytest.raises(UsageError):
        shell.run_cell_magic("tessera", "--target tpu", ATTENTION)
    with pytest.raises(UsageError):
        shell.run_cell_magic("tessera", "--shapes B=two", ATTENTION)
    with pytest.raises(UsageError):
        shell.run_cell_magic("tessera", "--show graph,assembly", ATTENTION)
    assert "--shapes" in shell.find_cell_magic("tessera").__doc__     # what %%tessera? prints


def test_line_magic_explores_a_defined_function(shell):
    shell.run_cell(ATTENTION)
    with capture_output():
        explorer = shell.run_line_magic("tessera", "attention --shapes B=1,S=4,D=4 --show schedule")
    assert [k for k, _ in explorer.sections] == ["schedule"]
    with capture_output() as cap:
        shell.run_line_magic("tessera", "")
    assert "cpu" in cap.stdout


def test_profile_and_autotune_tabs(shell):
    explorer, _ = run_magic(shell, "--shapes N=256 --profile --autotune --budget 2", '''
from tessera import Tensor, op
def norm(x: Tensor["N", "N"]):
    return op.softmax(x)
''')
    keys = [k for k, _ in explorer.sections]
    assert keys[-2:] == ["profile", "autotune"]
    assert explorer.profile.launches and explorer.tuning is not None
    page = explorer.html()
    assert "<svg" not in page and explorer.program.schedule_ir.kernels[0].name in page
    svgs = _drawings(page)      # the graph, the profile's two figures, the autotuner's
    assert len(svgs) == 4 and all(s.startswith("<svg") for s in svgs)


def test_error_explorer_for_a_function_without_shapes_in_a_kernel():
    """A real Jupyter kernel runs a notebook whose %%tessera cell has a shape error: the cell's
    output names its line and the run stops there."""
    nbformat = pytest.importorskip("nbformat", reason="needs nbformat (test extra)")
    nbclient = pytest.importorskip("nbclient", reason="needs nbclient (test extra)")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext tessera"),
                nbformat.v4.new_code_cell(
                    "%%tessera\nfrom tessera import Tensor, op\n\n"
                    "def f(q: Tensor['B', 'S', 'D'], k: Tensor['B', 'S', 'D']):\n"
                    "    return op.matmul(q, k)\n"),
                nbformat.v4.new_code_cell("print('not reached')")]
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3")
    with pytest.raises(nbclient.exceptions.CellExecutionError) as info:
        client.execute()
    outputs = nb.cells[1].outputs
    error = next(o for o in outputs if o.output_type == "error")
    assert error.ename == "ShapeError"
    assert any("In[2]:5" in line for line in error.traceback)     # the second cell run
    html_out = [o for o in outputs if o.output_type == "display_data"]
    assert html_out and "f32[B,S,D]" in _drawn(html_out[0].data["text/html"])
    assert "application/vnd.jupyter.widget-view+json" not in html_out[0].data   # no 1-tab widget
    assert not nb.cells[2].outputs and "not reached" not in str(info.value)


def _text(page: str) -> str:
    return re.sub(r"<[^>]+>", "", page)


_IMG = re.compile(r'<img src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"[^>]*>')


def _drawings(page: str) -> list:
    """The SVG texts of a page's drawings (each an <img> of its SVG)."""
    return [base64.b64decode(m).decode() for m in _IMG.findall(page)]


def _drawn(page: str) -> str:
    """The page with each drawing's SVG text in place of its <img>, to read its labels."""
    return _IMG.sub(lambda m: base64.b64decode(m.group(1)).decode(), page)


# ---- odd cells ---------------------------------------------------------------------------------
def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)          # IPython's colours


def test_functions_are_bound_as_defined_and_an_error_keeps_them(shell, rng):
    """The cell's own later lines call the compiled function; an exception after the defs
    leaves them bound (as a plain cell would leave its defs), and its traceback shows the
    cell's lines, not the magic's frames."""
    cell = '''import numpy as np
from tessera import Tensor, op
def double(x: Tensor["N"]):
    return x * 2.0
seen = type(double).__name__, double(np.arange(3, dtype=np.float32))
raise ValueError("after the defs")
'''
    with capture_output() as cap:
        result = shell.run_cell("%%tessera --shapes N=3\n" + cell)
    assert isinstance(result.error_in_exec, ValueError)
    kind, out = shell.user_ns["seen"]
    assert kind == "Function" and np.array_equal(out, [0.0, 2.0, 4.0])
    assert isinstance(shell.user_ns["double"], ts.Function)
    x = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_array_equal(shell.user_ns["double"](x), x * 2)
    shown = _plain(cap.stdout + cap.stderr)
    assert "line 7" in shown and 'raise ValueError("after the defs")' in shown
    assert "magic.py" not in shown and "_run_cell" not in shown


def test_a_transform_defined_last_is_explored(shell, rng):
    explorer, _ = run_magic(shell, "--shapes N=6", '''
import tessera as ts
from tessera import Tensor, op
def energy(x: Tensor["N"]):
    return op.sum(x * x)
def other(x: Tensor["N"]):
    return x + 1.0
force = ts.grad(energy)
''')
    assert explorer.name == "grad_energy" and explorer.program is not None
    x = rng.standard_normal(6).astype(np.float32)
    np.testing.assert_allclose(shell.user_ns["force"](x), 2 * x, rtol=1e-6)


def test_rebinding_and_deleting_in_the_cell_pick_the_last_live_function(shell):
    explorer, _ = run_magic(shell, "--shapes N=4", '''
from tessera import Tensor
def first(x: Tensor["N"]):
    return x * 2.0
def second(x: Tensor["N"]):
    return x * 3.0
del second
''')
    assert explorer.name == "first" and "second" not in shell.user_ns


def test_a_function_that_needs_arrays_gets_a_note_not_an_error(shell, rng):
    cell = '''from tessera import Tensor
def scale(x: Tensor["N"], alpha):
    return x * alpha
'''
    explorer, _ = run_magic(shell, "--shapes N=4", cell)
    assert explorer.program is None and "alpha" in explorer.summary()
    page = explorer.html()
    assert page.count("Not available: scale takes alpha") == 4       # each level
    # beside another function, it is skipped rather than lowered from the sizes
    main, _ = run_magic(shell, "--shapes N=4", cell + '''
def main(x: Tensor["N"]):
    return x + 1.0
''')
    assert main.name == "main" and main.program is not None
    # its program, from example arrays, is explored by the line magic
    x = rng.standard_normal(4).astype(np.float32)
    shell.user_ns["prog"] = shell.user_ns["scale"].lower(x, 3.0)
    with capture_output():
        lowered = shell.run_line_magic("tessera", "prog --show schedule")
    assert lowered.program is shell.user_ns["prog"]
    np.testing.assert_allclose(lowered.program(x), x * 3.0, rtol=1e-6)


def test_a_cell_without_tessera_functions_says_so(shell):
    result, cap = run_magic(shell, "", "def plain(a, b):\n    return a + b\nmethod = str.upper\n")
    assert result is None and "defines no tessera function" in cap.stdout
    assert shell.user_ns["plain"](1, 2) == 3                    # left as it was


def test_a_def_tessera_cannot_take_names_its_line(shell):
    cell = 'from tessera import Tensor\n\ndef pack(*xs: Tensor["N"]):\n    return xs[0]\n'
    n = shell.execution_count
    with capture_output():
        result = shell.run_cell("%%tessera\n" + cell)
    err = result.error_in_exec
    assert isinstance(err, ts.ArgumentError) and str(err.location) == f"In[{n}]:4"


def test_duplicate_sizes_are_a_usage_error(shell):
    with pytest.raises(UsageError, match="given twice"):
        shell.run_cell_magic("tessera", "--shapes N=3,N=4", ATTENTION)


def test_static_html_escapes_the_users_source(shell):
    cell = '''from tessera import Tensor, op
def masked(x: Tensor["N"], y: Tensor["N", "M"]):
    return op.where(x < 0, x, 0) @ y  # <script>alert(1)</script>
'''
    n = shell.execution_count
    explorer, _ = run_magic(shell, "--shapes N=3,M=2", cell)
    broken = cell.replace('y: Tensor["N", "M"]', 'y: Tensor["M", "M"]')
    m = shell.execution_count           # the number run_cell gives the broken cell
    with capture_output() as cap:
        shell.run_cell("%%tessera --shapes N=3,M=2\n" + broken)
    page, error_page = _drawn(explorer.html()), _drawn(cap.outputs[0].data["text/html"])
    assert f"In[{n}]:4" in page and "<script>" not in page       # the graph's source lines
    assert f"In[{m}]:4" in error_page and "<script>" not in error_page


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None,
                    reason="checks the notes shown where CuPy is missing")
def test_other_targets_profile_and_autotune_say_why_not(shell):
    explorer, _ = run_magic(shell, "--shapes N=4 --target cuda --profile --autotune --budget 1",
                            "from tessera import Tensor, op\n"
                            "def soft(x: Tensor['N', 'N']):\n    return op.softmax(x)\n")
    assert explorer.program.target == "cuda" and 'extern "C" __global__' in \
        explorer.program.target_code
    notes = explorer.notes
    assert "CuPy is not installed" in notes["profile"]
    assert "own target (cpu), not cuda" in notes["autotune"] and explorer.tuning is None


def test_objects_display_richly_while_the_extension_is_loaded(shell, rng):
    shell.run_cell("from tessera import Tensor, op\n"
                   "def norm(x: Tensor['B', 'D']):\n"
                   "    return op.layernorm(x, axis=-1) * 2\n")
    fn = ts.function(shell.user_ns["norm"])
    prog = fn.lower(rng.standard_normal((4, 16)).astype(np.float32))
    data, _ = shell.display_formatter.format(prog)
    assert "tessera-explorer" in data["text/html"] and prog.kernels[0].name in data["text/html"]
    data, _ = shell.display_formatter.format(fn)            # symbolic: the annotations' graph
    assert "symbolic Graph IR" in data["text/plain"] and "tessera-explorer" in data["text/html"]
    data, _ = shell.display_formatter.format(prog.graph_ir)
    assert data["image/svg+xml"].startswith("<svg") and "layernorm" in data["text/plain"]
    data, _ = shell.display_formatter.format(prog.schedule_ir)
    assert "<table" in data["text/html"] and prog.kernels[0].name in data["text/html"]
    data, _ = shell.display_formatter.format(prog.tile_ir)
    assert "kernel" in data["text/html"] and data["text/plain"] == str(prog.tile_ir)
    shell.run_line_magic("unload_ext", "tessera")
    data, _ = shell.display_formatter.format(prog)            # plain again
    assert set(data) == {"text/plain"} and data["text/plain"].startswith("<Program")


def test_saved_notebooks_mark_cells_with_tags_not_comments():
    """nbval's markers are cell tags (nbval-ignore-output, ...): a `# NBVAL_...` comment would
    show in the reader's cell."""
    import glob
    import os

    import nbformat
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = glob.glob(os.path.join(root, "tutorials", "*.ipynb")) + \
        glob.glob(os.path.join(root, "notebooks", "*.ipynb"))
    assert paths
    for path in paths:
        for cell in nbformat.read(path, as_version=4).cells:
            assert "NBVAL_" not in cell.source, (os.path.basename(path), cell.source[:60])


def test_the_target_tab_opens_on_the_kernels_with_the_helpers_folded(rng):
    from tessera.lab.explorer import explore, split_target_code
    f = ts.function(lambda x: ts.op.gelu(x) * 2)          # gelu brings our erf: many helpers
    for target in ("cpu", "cuda"):
        prog = f.lower(rng.standard_normal((4, 8)).astype(np.float32), target=target)
        helpers, kernels = split_target_code(prog)
        assert prog.target_code.startswith(helpers) and prog.target_code.endswith(kernels)
        assert kernels.startswith("/* pointwise:") and "erf" in helpers and \
            prog.kernels[0].name not in helpers
    page = explore(prog).html()
    target = page[page.index("<b>Target</b>"):]
    assert target.index(prog.kernels[0].name) < target.index("lines before the kernels")


def test_bad_sizes_in_the_explorer_box_drop_the_stale_tabs():
    pytest.importorskip("ipywidgets", reason="the explorer's box is an ipywidget (lab extra)")
    from tessera.lab.explorer import explore
    fn = ts.function(_annotated_exp)
    view = explore(fn).widget()
    box = view.children[0]
    box.value = "N=4"
    assert len(view.children) == 3                      # box, status, the lowered tabs
    box.value = "N=four"
    assert len(view.children) == 2 and "N=four" in view.children[1].value


def _annotated_exp(x: ts.Tensor["N"]):
    return ts.op.exp(x)



def test_an_error_names_the_cell_that_holds_the_line(shell, rng):
    """A function defined in one cell and called from a later one: its error names the
    defining cell as IPython's tracebacks do (In[n]), not only a line number."""
    n = shell.execution_count
    shell.run_cell("import tessera as ts\nfrom tessera import op\n\n@ts.function\n"
                   "def scores(q, k):\n    return op.matmul(q, k)\n", store_history=True)
    shell.run_cell("x = 1", store_history=True)         # another cell in between
    shell.user_ns["q"] = rng.standard_normal((4, 3)).astype(np.float32)
    with capture_output():
        result = shell.run_cell("scores(q, q)", store_history=True)
    err = result.error_in_exec
    assert isinstance(err, ts.ShapeError) and str(err.location) == f"In[{n}]:6"
    assert shell.execution_count == n + 3


def test_a_tile_kernel_is_explored_profiled_and_tuned(shell, rng):
    explorer, _ = run_magic(shell, "--shapes R=40,C=300 --profile --autotune --budget 2", '''
import tessera as ts
from tessera import Tile, f32, tile

@ts.kernel
def safe_softmax(x: Tile["R", "C", f32]) -> Tile["R", "C", f32]:
    m = tile.max(x, axis=-1, keepdim=True)
    e = tile.exp(x - m)
    return e / tile.sum(e, axis=-1, keepdim=True)
''')
    kernel = shell.user_ns["safe_softmax"]
    assert isinstance(kernel, ts.tiles.KernelFunction)      # the kernel stays a kernel
    assert [k for k, _ in explorer.sections] == ["graph", "schedule", "tile", "target", "profile",
                                                 "autotune"]
    [k] = explorer.program.schedule_ir.kernels
    assert k.strategy == "tile" and explorer.profile.launches and explorer.tuning is not None
    x = rng.standard_normal((40, 300)).astype(np.float32)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(explorer.program(x), e / e.sum(-1, keepdims=True), rtol=1e-5)


MESH_CELL = '''
from tessera import collectives, dist
mine = a * np.float32(dist.rank() + 1)
print("rank", dist.rank(), "of", mesh.size, "on", mesh.engine.name)
collectives.all_reduce(mine, op="sum", axis="dp", mesh=mesh)
'''


def test_mesh_runs_the_cell_on_mpi_ranks(shell, rng):
    """%%tessera --mesh dp=2: the cell on 2 MPI ranks, `mesh` their mesh, the notebook's `a`
    and `np` copied in, each rank's output in rank order, the ranks' last values as the cell's:
    the fixed tree's sum, bit for bit."""
    pytest.importorskip("mpi4py", reason="--mesh runs MPI ranks (the test extra has mpi4py)")
    a = rng.standard_normal(7).astype(np.float32)
    shell.user_ns.update(a=a, np=np)
    result, cap = run_magic(shell, "--mesh dp=2", MESH_CELL)
    assert len(result) == 2
    for got in result:
        np.testing.assert_array_equal(got, a * np.float32(1) + a * np.float32(2))
    lines = [line for line in cap.stdout.splitlines() if line.startswith("[rank")]
    assert lines == ["[rank 0] rank 0 of 2 on mpi", "[rank 1] rank 1 of 2 on mpi"]


def test_mesh_errors_name_the_rank_and_line(shell):
    pytest.importorskip("mpi4py", reason="--mesh runs MPI ranks (the test extra has mpi4py)")
    with pytest.raises(ts.RankFailure, match=r"(?s)rank 1 of 2.*line 3"):
        run_magic(shell, "--mesh dp=2", "from tessera import dist\nx = 1\n"
                  "assert dist.rank() == 0, 'only rank 0'\n")
    for bad in ("dp", "dp=0", "dp=2,dp=2", "2=dp"):
        with pytest.raises(UsageError, match="--mesh"):
            run_magic(shell, f"--mesh {bad}", "x = 1\n")
    shell.user_ns["gen"] = (i for i in range(3))
    with pytest.raises(UsageError, match="'gen' cannot be copied"):
        run_magic(shell, "--mesh dp=2", "list(gen)\n")


def test_mesh_leaves_behind_what_the_cell_makes_itself(shell):
    """A notebook value that cannot be copied is left behind when the cell assigns the name
    itself."""
    pytest.importorskip("mpi4py", reason="--mesh runs MPI ranks (the test extra has mpi4py)")
    shell.user_ns["gen"] = (i for i in range(3))
    result, _ = run_magic(shell, "--mesh dp=2", "gen = [1, 2]\nsum(gen)\n")
    assert result == [3, 3]
