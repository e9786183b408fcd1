"""The GPU suite on a real device (`make gpu-check`): every case of test_gpu_emulated.py, lowered
for this machine's GPU and run through CuPy twice (bitwise the same bits), against the same NumPy
references. Without a device each case skips, saying so."""
import pytest

import test_gpu_emulated as emulated
from test_gpu_emulated import *  # noqa: F401,F403 - the same cases, collected here on the device

pytestmark = pytest.mark.gpu


@pytest.fixture
def target():
    from tessera.runtime.gpu import runnable_targets
    found = runnable_targets()
    if not found:
        pytest.skip("needs a GPU: CuPy finds no device here (make gpu-check runs these on one)")
    return found[0]


def run_on_device(prog, *arrays, reverse=False, max_blocks=None):
    """What the emulator's run_program does, on the device (which orders its threads itself)."""
    import cupy
    from tessera.compiler.pipeline import GPUProgram
    if not isinstance(prog, GPUProgram):            # with_knobs' program with other knobs
        prog = GPUProgram(prog.graph_ir, prog.graph_ir, prog.schedule_ir, prog.tile_ir,
                          prog.target_code, prog.target)
    return [cupy.asnumpy(a) for a in prog.run(*arrays)]


@pytest.fixture(autouse=True)
def on_device(monkeypatch):
    monkeypatch.setattr(emulated, "run_program", run_on_device)
