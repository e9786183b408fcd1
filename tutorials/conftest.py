"""nbval on the tutorials: cells tagged `gpu` need a GPU (CuPy with a device); without one they
are skipped, with that reason, and the notebook goes on."""
import pytest


def pytest_collection_modifyitems(config, items):
    gpu_cells = [item for item in items
                 if "gpu" in getattr(getattr(item, "cell", None), "metadata", {}).get("tags", [])]
    if not gpu_cells:
        return
    from tessera.runtime.gpu import runnable_targets
    if runnable_targets():
        return
    skip = pytest.mark.skip(reason="a cell tagged gpu: no GPU here (CuPy finds no device)")
    for item in gpu_cells:
        item.add_marker(skip)
