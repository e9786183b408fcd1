"""`make notebooks`: execute tutorials and worked models in place with a real kernel (in the
notebook's own folder), as nbval will check them.
Cells tagged `gpu` run only where a GPU exists; elsewhere they are left as they are."""
import os
import sys

import nbformat
from nbclient import NotebookClient


def execute(path: str, gpu: bool):
    nb = nbformat.read(path, as_version=4)
    kept = [c for c in nb.cells if gpu or "gpu" not in c.metadata.get("tags", [])]
    run = nbformat.v4.new_notebook(cells=kept, metadata=nb.metadata)
    NotebookClient(run, timeout=600, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": os.path.dirname(path) or "."}}).execute()
    _drop_widget_state(nb)
    nbformat.write(nb, path)        # the kept cells are the same objects, now with outputs


WIDGET = "application/vnd.jupyter.widget-view+json"


def _drop_widget_state(nb):
    """A saved notebook keeps each explorer's static HTML, not the live widget: its view and
    state carry random model ids (nbval skips them; git would not)."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET in data and len(data) > 1:
                del data[WIDGET]


if __name__ == "__main__":
    from tessera.runtime.gpu import runnable_targets
    has_gpu = bool(runnable_targets())
    for p in sys.argv[1:]:
        print("executing", p, "(with GPU cells)" if has_gpu else "")
        execute(p, has_gpu)
