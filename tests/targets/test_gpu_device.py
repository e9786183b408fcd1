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
    from tessera.compiler.program import GPUProgram
    if not isinstance(prog, GPUProgram):            # with_knobs' program with other knobs
        prog = GPUProgram(prog.graph_ir, prog.graph_ir, prog.schedule_ir, prog.tile_ir,
                          prog.target_code, prog.target)
    return [cupy.asnumpy(a) for a in prog.run(*arrays)]


@pytest.fixture(autouse=True)
def on_device(monkeypatch):
    monkeypatch.setattr(emulated, "run_program", run_on_device)


def test_debugging_tools_on_the_device(target):
    """Debug mode, compare and the memory report with the program on the device (CuPy arrays
    in): the probe runs there, the checks read its results back."""
    import cupy
    import numpy as np
    import tessera as ts
    from tessera import op
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((4, 8)).astype(np.float32))
    w = cupy.asarray((30 * rng.standard_normal((8, 5))).astype(np.float32))
    f = ts.function(lambda x, w: op.log(op.exp(x @ w)), target=target)
    quiet = cupy.asnumpy(f(x, w))
    assert np.isinf(quiet).any()
    with ts.debug_mode(), pytest.raises(ts.NumericalError, match="exp produced 0 NaN and"):
        f(x, w)
    g = ts.function(lambda x, w: op.log_softmax(x @ w, axis=-1), target=target)
    with ts.debug_mode():
        checked = g(x, w)
    assert cupy.asnumpy(checked).tobytes() == cupy.asnumpy(g(x, w)).tobytes()
    assert ts.debug.compare(g, x, w, against="interpret").first is None
    # the CPU program against the device's, operator by operator: the same bits
    on_cpu = ts.function(lambda x, w: op.log_softmax(x @ w, axis=-1))
    report = ts.debug.compare(on_cpu, cupy.asnumpy(x), cupy.asnumpy(w), against=target)
    assert all(r["max_abs_err"] == 0 for r in report.rows), str(report)
    assert ts.profile_memory(g, x, w).inputs == x.nbytes + w.nbytes


def test_a_phased_transform_profiles_as_one_kernel(target):
    """A long line's transform runs as several launches; the profile shows the schedule's one
    kernel, with the phases' times summed."""
    import cupy
    import numpy as np
    import tessera as ts
    from tessera import op
    z = cupy.asarray((np.random.default_rng(0).standard_normal((2, 1 << 16)) * (1 + 1j))
                     .astype(np.complex64))
    f = ts.function(lambda z: op.fft(z, axis=-1), target=target)
    prog = f.lower(z)
    assert len(prog.tile_ir.kernels) > len(prog.schedule_ir.kernels)
    with ts.profiler() as prof:
        got = f(z)
    rows = prof.rows()
    assert [r["kernel"] for r in rows] == [k.name for k in prog.schedule_ir.kernels]
    assert all(r["median_ms"] > 0 for r in rows)
    np.testing.assert_allclose(cupy.asnumpy(got), np.fft.fft(cupy.asnumpy(z), axis=-1),
                               rtol=0, atol=2e-3 * np.sqrt(1 << 16))


def test_a_saved_cuda_program_runs_from_its_ptx(target, tmp_path, rng):
    """A saved CUDA program loads its own PTX for this device (the newest saved architecture it
    runs), compiling nothing: the same bits as the program compiled here."""
    import numpy as np
    import tessera as ts
    from tessera import op
    if target != "cuda":
        pytest.skip("PTX is CUDA's")
    fn = ts.function(lambda x, w: op.softmax(op.tanh(x @ w), axis=-1))
    x = rng.standard_normal((64, 32)).astype(np.float32)
    w = rng.standard_normal((32, 48)).astype(np.float32)
    prog = fn.lower(x, w, target="cuda")
    loaded = ts.load(prog.save(tmp_path / "m.tsr"))
    before = ts.cache_stats()["compiles"]
    got = run_on_device(loaded, x, w)
    assert ts.cache_stats()["compiles"] == before          # from the file, not NVRTC
    np.testing.assert_array_equal(got[0], run_on_device(prog, x, w)[0])
