"""tessera.runtime.gpu, the CUDA/HIP runtime, without a GPU.

Two halves. Here, as on every CPU-only machine: no CuPy, so GPU programs say why they cannot run,
`auto` stays on the CPU, and the PTX cache key is checked with a real NVRTC compile. Then the
runtime's launch sequence end to end, through `FakeCuPy`: a test double of the part of CuPy the
runtime calls, whose "device" is the CPU emulator of tests/gpu_emulator. It computes nothing of
its own: kernels really run (the program's CUDA/HIP source compiled under cuda_emu.h), PTX files
are checked against NVRTC's own output, and every launch is recorded, so the results are compared
with NumPy and the launches with the Tile IR.
"""
import importlib.util
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, op
from tessera.compiler.driver import auto_target, available_targets
from tessera.compiler.program import GPUProgram
from tessera.errors import (ArgumentError, BackendUnavailableError, ResourceError,
                            RuntimeFault)
from tessera.runtime import cache, gpu

HAVE_CUPY = importlib.util.find_spec("cupy") is not None
no_cupy = pytest.mark.skipif(HAVE_CUPY, reason="CuPy is installed here: these check its absence")


def _nvrtc():
    from tessera.runtime.gpu_toolchain import nvrtc_library
    try:
        nvrtc_library()
        return True
    except BackendUnavailableError:
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc(), reason="needs NVRTC (pip install nvidia-cuda-nvrtc)")
needs_gxx = pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "g++") is None,
                               reason="the CUDA emulator needs a C++20 compiler (g++)")


def softmax_and_column_sum(x: Tensor["N", "M"], w: Tensor["M"]):
    y = op.softmax(x * w)
    return op.sum(y, axis=0), y, x          # two kernels; an output that is an input


def np_softmax_rows(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---- no CuPy here ------------------------------------------------------------------------------
@no_cupy
def test_without_cupy_gpu_programs_lower_but_say_why_they_cannot_run(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.standard_normal(6).astype(np.float32)
    fn = ts.function(softmax_and_column_sum, target="cuda")
    prog = fn.lower(x, w)                      # every level and the source, on any machine
    assert isinstance(prog, GPUProgram) and 'extern "C" __global__' in prog.target_code
    for call in (lambda: fn(x, w), lambda: prog(x, w)):
        with pytest.raises(BackendUnavailableError) as info:
            call()
        assert "CuPy is not installed" in str(info.value) and "lower" in info.value.hint
    assert gpu.runnable_targets() == []
    assert "cuda" not in available_targets() and "hip" not in available_targets()


@no_cupy
def test_auto_target_stays_on_the_cpu_for_numpy_inputs(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    w = rng.standard_normal(5).astype(np.float32)
    assert auto_target([x, w]) == "cpu"
    fn = ts.function(softmax_and_column_sum, target="auto")
    total, y, same = fn(x, w)
    want = np_softmax_rows(x * w)
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(total, want.sum(0), rtol=1e-5)
    assert fn.lower(x, w).target.startswith("cpu:") and same is not x and np.array_equal(same, x)


# ---- the PTX cache -----------------------------------------------------------------------------
@needs_nvrtc
def test_ptx_cache_key_holds_source_and_architecture(rng, monkeypatch):
    from tessera.runtime.gpu_toolchain import nvrtc_compile
    x, w = np.ones((3, 5), np.float32), np.ones(5, np.float32)
    source = ts.function(softmax_and_column_sum).lower(x, w, target="cuda").target_code
    other = ts.function(softmax_and_column_sum).lower(x[:2], w, target="cuda").target_code
    path = gpu.ptx_path(source, "sm_80")
    assert path == gpu.ptx_path(source, "sm_80")                  # stable
    assert path.parent == cache.cache_dir() / "kernels" and path.name.startswith("cuda-sm_80-")
    assert len({path, gpu.ptx_path(source, "sm_90"), gpu.ptx_path(other, "sm_80")}) == 3
    written = gpu._compile_ptx(source, "sm_90", "softmax")
    ptx = written.read_bytes()
    assert written == gpu.ptx_path(source, "sm_90") and ptx == nvrtc_compile(source, "sm_90")
    assert b".target sm_90" in ptx and b".entry k0_softmax(" in ptx
    assert not list(written.parent.glob(".tmp-*"))                # renamed into place
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")                   # bypassed: nothing cached
    private = gpu.ptx_path(source, "sm_90")
    assert private.parent != written.parent and private.name == written.name


# ---- a CuPy double over the CPU emulator ---------------------------------------------------------
class DeviceArray:
    """A CuPy array stand-in: emulated device memory (guard pages around it) on one device."""

    def __init__(self, mem: np.ndarray, device: int):
        self._mem, self.device = mem, device

    shape = property(lambda self: self._mem.shape)
    dtype = property(lambda self: self._mem.dtype)
    nbytes = property(lambda self: self._mem.nbytes)
    flags = property(lambda self: self._mem.flags)
    T = property(lambda self: DeviceArray(self._mem.T, self.device))

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self._mem.ctypes.data, False), "strides": self._mem.strides}

    def __array__(self, *args, **kwargs):      # as CuPy: no silent copies to the host
        raise TypeError("Implicit conversion to a NumPy array is not allowed")

    def __getitem__(self, index):
        return DeviceArray(self._mem[index], self.device)

    def get(self):
        return np.array(self._mem)

    def copy(self):
        from gpu_emulator import to_device
        return DeviceArray(to_device(self._mem), self.device)

    def fill(self, value):
        self._mem.fill(value)


class FakeCuPy:
    """What tessera.runtime.gpu uses of CuPy, the same names and call forms (RawModule loads
    lazily, kernels take `(grid,), (block,), args, shared_mem=`), over the emulator."""

    # ptx_isa: the newest PTX ISA its driver loads (by default newer than any NVRTC's, so the
    # test does not depend on the installed NVRTC's release)
    def __init__(self, hip=False, devices=1, ptx_isa=(99, 0), memory=1 << 30):
        self.hip, self.devices, self.ptx_isa, self.memory = hip, devices, ptx_isa, memory
        self.current = 0
        self.sources = []               # CUDA/HIP sources the tests lowered: what PTX came from
        self.launches, self.modules, self.transfers = [], [], 0
        outer = self

        class CUDADriverError(RuntimeError):
            pass

        class OutOfMemoryError(MemoryError):
            pass

        class Event:
            def record(self):
                self.t = time.perf_counter()

            def synchronize(self):      # the fake's kernels ran when launched
                pass

        def getDeviceCount():
            if outer.devices is None:
                raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
            return outer.devices

        def getDeviceProperties(device):
            return {"warpSize": 64 if outer.hip else 32, "gcnArchName": b"gfx90a:sramecc+:xnack-",
                    "name": b"Emulated GPU"}

        self.cuda = SimpleNamespace(
            runtime=SimpleNamespace(is_hip=hip, getDeviceCount=getDeviceCount,
                                    getDeviceProperties=getDeviceProperties),
            driver=SimpleNamespace(CUDADriverError=CUDADriverError),
            memory=SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
            Device=lambda: SimpleNamespace(id=outer.current, compute_capability="90"),
            Event=Event, get_elapsed_time=lambda s, e: (e.t - s.t) * 1e3)
        self.int32, self.float32 = np.int32, np.float32
        self.ndarray = DeviceArray

    # -- arrays --------------------------------------------------------------------------------
    def asarray(self, a):
        from gpu_emulator import to_device
        if isinstance(a, DeviceArray):
            return a if a.device == self.current else DeviceArray(to_device(a._mem),
                                                                   self.current)
        self.transfers += 1
        return DeviceArray(to_device(np.asarray(a)), self.current)

    def array(self, a):                 # always a copy, as cupy.array
        from gpu_emulator import to_device
        self.transfers += 1
        return DeviceArray(to_device(np.array(a)), self.current)

    def ascontiguousarray(self, a):
        from gpu_emulator import to_device
        return a if a._mem.flags.c_contiguous else DeviceArray(to_device(a._mem), a.device)

    def empty(self, shape, dtype):
        from gpu_emulator import device_empty
        if int(np.prod(shape)) * np.dtype(dtype).itemsize > self.memory:
            raise self.cuda.memory.OutOfMemoryError(f"out of memory allocating {shape}")
        return DeviceArray(device_empty(shape, dtype), self.current)

    def copyto(self, dst, src):
        dst._mem[...] = src._mem

    def zeros(self, shape, dtype):
        from gpu_emulator import device_empty
        return DeviceArray(device_empty(shape, dtype, fill=0), self.current)

    # -- modules -------------------------------------------------------------------------------
    def RawModule(self, *, code=None, path=None, options=()):
        assert (code is None) != (path is None)
        return _Module(self, code, path, options)

    def source_of(self, ptx: bytes) -> str:
        """The registered source NVRTC turns into exactly this PTX (what a driver would run)."""
        from tessera.runtime.gpu_toolchain import nvrtc_compile
        for source in reversed(self.sources):
            if nvrtc_compile(source, "sm_90") == ptx:
                return source
        raise self.cuda.driver.CUDADriverError("CUDA_ERROR_INVALID_PTX: a PTX no test made")


class _Module:
    def __init__(self, fake, code, path, options):
        self.fake, self.code, self.path, self.options = fake, code, path, options
        self.emulated = None
        fake.modules.append(self)

    def _load(self):
        """As cuModuleLoad: a PTX file newer than the driver, or damaged, is refused here."""
        from gpu_emulator import compile_source
        fake = self.fake
        source = self.code
        if source is None:
            ptx = Path(self.path).read_bytes()
            version = next((line.split()[1] for line in ptx.decode(errors="replace").splitlines()
                            if line.startswith(".version ")), None)
            if version is None or b".target sm_90" not in ptx:
                raise fake.cuda.driver.CUDADriverError("CUDA_ERROR_INVALID_PTX")
            if tuple(int(v) for v in version.split(".")) > fake.ptx_isa:
                raise fake.cuda.driver.CUDADriverError("CUDA_ERROR_UNSUPPORTED_PTX_VERSION")
            source = fake.source_of(ptx)
        self.emulated = compile_source(source, "fake", "hip" if fake.hip else "cuda")

    def get_function(self, name):
        if self.emulated is None:
            self._load()
        if f" {name}(" not in self.emulated.source:
            raise self.fake.cuda.driver.CUDADriverError("CUDA_ERROR_NOT_FOUND")
        return _Kernel(self, name)


_device_lock = threading.Lock()


class _Kernel:
    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, grid, block, args, *, shared_mem=0):
        from gpu_emulator import launch
        fake = self.module.fake
        assert type(grid) is tuple and type(block) is tuple    # CuPy's Function types them
        for a in args:      # pointers only, on this device (a host pointer faults on a GPU)
            assert isinstance(a, DeviceArray) and a.device == fake.current, a
        with _device_lock:  # one launch at a time, each with the block's own shared memory
            fake.launches.append((self.name, grid, block, shared_mem, [id(a) for a in args]))
            launch(self.module.emulated, self.name, grid, block, [a._mem for a in args],
                   shared_mem)


@pytest.fixture
def fake(monkeypatch):
    double = FakeCuPy()
    monkeypatch.setitem(sys.modules, "cupy", double)
    return double


def softmax_case(fake, rng):
    """Fresh (x, w) and softmax_and_column_sum on the fake's GPU."""
    x = rng.standard_normal((5, 37)).astype(np.float32)
    w = rng.standard_normal(37).astype(np.float32)
    return x, w, on_gpu(fake, softmax_and_column_sum, x, w)


def on_gpu(fake, fn, *example, target="cuda"):
    """fn as a tessera function for the fake's GPU, its source registered for the fake's
    "driver" (as if lowered by the same tessera)."""
    f = ts.function(fn, target=target)
    lowered = f.lower(*example, target="cuda" if target == "auto" else target)
    fake.sources.append(lowered.target_code)
    return f




@needs_nvrtc
@needs_gxx
def test_launch_sequence_results_and_cache(fake, rng):
    x, w, f = softmax_case(fake, rng)
    before = cache.cache_stats()["compiles"]
    total, y, same = f(x, w)                                   # NumPy in, device arrays out
    assert all(isinstance(r, DeviceArray) for r in (total, y, same))
    want = np_softmax_rows(x.astype(np.float64) * w)
    np.testing.assert_allclose(y.get(), want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(total.get(), want.sum(0), rtol=2e-6)
    assert np.array_equal(same.get(), x)
    prog = f.lower(x, w)
    # one launch per Tile IR call, with its kernel's grid, block and shared memory, its
    # buffers in order and the status word last (one status for the whole run)
    kernels = {k.name: k.launch for k in prog.tile_ir.kernels}
    assert [(n, g, b, s) for n, g, b, s, _ in fake.launches] == [
        (n, (kernels[n]["grid"],), (kernels[n]["block"],), kernels[n]["shared"])
        for n, _ in prog.tile_ir.calls]
    (_, _, _, _, a0), (_, _, _, _, a1) = fake.launches
    assert a0[2] == a1[0] and a0[-1] == a1[-1] and len(a0) == 4 and len(a1) == 3
    # the PTX is NVRTC's for this device's architecture, in the cache, compiled once
    assert cache.cache_stats()["compiles"] == before + 1
    assert gpu.ptx_path(prog.target_code, "sm_90").exists()
    fake.launches.clear()
    again = f(x, w)
    assert [r.get().tobytes() for r in again] == [r.get().tobytes() for r in (total, y, same)]
    assert cache.cache_stats()["compiles"] == before + 1 and len(fake.modules) == 1
    # a fresh program (another process, say) loads the cached PTX without compiling
    prog2 = ts.function(softmax_and_column_sum, target="cuda").lower(x, w)
    assert prog2 is not prog and prog2.target_code == prog.target_code
    prog2(x, w)
    assert cache.cache_stats()["compiles"] == before + 1 and len(fake.modules) == 2


@needs_nvrtc
@needs_gxx
def test_device_inputs_auto_target_noncontiguous_and_fresh_outputs(fake, rng):
    x = rng.standard_normal((37, 5)).astype(np.float32)       # given transposed: not contiguous
    w = rng.standard_normal(37).astype(np.float32)
    f = on_gpu(fake, softmax_and_column_sum, x.T.copy(), w, target="auto")
    dx, dw = fake.asarray(x).T, fake.asarray(w)
    assert auto_target([dx, dw]) == "cuda" and auto_target([x.T, w]) == "cpu"
    fake.transfers = 0
    total, y, same = f(dx, dw)
    assert fake.transfers == 0                                # device inputs stay there
    np.testing.assert_allclose(y.get(), np_softmax_rows(x.T.astype(np.float64) * w),
                               rtol=2e-6, atol=1e-7)
    # an output that is an input is a copy: writing to it leaves the caller's array alone
    assert same is not dx and np.array_equal(same.get(), x.T)
    same.fill(0.0)
    assert np.array_equal(dx.get(), x.T)


def where_and_index(t: Tensor["N", "M"], m: Tensor["N", "M", ts.bool_], s: Tensor[()],
                    i: Tensor["K", ts.int64]):
    picked = op.where(m, t, s)
    return op.take(picked, i, axis=0), m, op.sum(op.cast(m, ts.int64))


@needs_nvrtc
@needs_gxx
@pytest.mark.parametrize("n", [0, 3])
def test_bool_int64_scalar_and_empty_tensors(fake, rng, n):
    """bool arrays (1 byte, as C++ bool), int64 (long long), a 0-d input, and empty tensors
    (a launch still has grid >= 1; its loops run 0 times)."""
    t = rng.standard_normal((n, 4)).astype(np.float32)
    m = rng.random((n, 4)) < 0.5
    s = np.asarray(rng.standard_normal(), np.float32)
    i = rng.integers(-n, n, size=5 if n else 0).astype(np.int64)
    f = on_gpu(fake, where_and_index, t, m, s, i)
    got, mask, count = (r.get() for r in f(t, m, s, i))
    np.testing.assert_array_equal(got, np.where(m, t, s)[i])
    assert mask.dtype == np.bool_ and np.array_equal(mask, m)
    assert count.dtype == np.int64 and count.shape == () and count == m.sum()
    assert all(g[0] >= 1 for _, g, _, _, _ in fake.launches)


@needs_nvrtc
@needs_gxx
def test_a_bad_index_is_a_runtime_fault_naming_the_op(fake, rng):
    t = rng.standard_normal((3, 4)).astype(np.float32)
    m, s = np.ones((3, 4), bool), np.asarray(0, np.float32)
    f = on_gpu(fake, where_and_index, t, m, s, np.zeros(2, np.int64))
    with pytest.raises(RuntimeFault) as info:
        f(t, m, s, np.array([0, 3], np.int64))
    assert info.value.op == "take" and "out of range" in info.value.summary
    assert info.value.location is not None and info.value.location.function == "where_and_index"


@needs_nvrtc
@needs_gxx
def test_a_run_waits_for_its_kernels_only_where_one_can_flag_an_error(fake, rng, monkeypatch):
    """Reading the status word back waits for the kernels: a program with no index check
    returns with its kernels queued, one with an index check reads the word (and so raises)."""
    reads = []
    get = DeviceArray.get
    monkeypatch.setattr(DeviceArray, "get", lambda a: reads.append(a) or get(a))
    x, w, f = softmax_case(fake, rng)
    assert not f.lower(x, w, target="cuda").tile_ir.flags_errors
    total, y, _ = f(x, w)
    assert reads == []
    np.testing.assert_allclose(y.get(), np_softmax_rows(x * w), rtol=1e-5)
    reads.clear()
    t = rng.standard_normal((3, 4)).astype(np.float32)
    m, s = rng.random((3, 4)) < 0.5, np.asarray(0, np.float32)
    g = on_gpu(fake, where_and_index, t, m, s, np.zeros(2, np.int64))
    assert g.lower(t, m, s, np.zeros(2, np.int64), target="cuda").tile_ir.flags_errors
    g(t, m, s, np.array([2, 0], np.int64))
    assert len(reads) == 1


@needs_nvrtc
@needs_gxx
def test_device_arrays_take_the_call_fast_path_after_the_first_call(fake, rng):
    x, w, f = softmax_case(fake, rng)
    xd, wd = fake.asarray(x), fake.asarray(w)
    f(xd, wd)
    before = cache.cache_stats()["memory_hits"]
    total, y, same = f(xd, wd)
    assert cache.cache_stats()["memory_hits"] == before + 1
    np.testing.assert_allclose(y.get(), np_softmax_rows(x * w), rtol=1e-5)
    np.testing.assert_allclose(total.get(), np_softmax_rows(x * w).sum(0), rtol=1e-5)
    np.testing.assert_array_equal(same.get(), x)
    with pytest.raises(ts.TesseraError, match="disagree on M"):   # the slow path checks it
        f(fake.asarray(x[:, :3]), wd)


@needs_nvrtc
@needs_gxx
def test_the_profiler_gets_each_kernels_event_time(fake, rng):
    x = rng.standard_normal((4, 9)).astype(np.float32)
    w = rng.standard_normal(9).astype(np.float32)
    f = on_gpu(fake, softmax_and_column_sum, x, w)
    with ts.profiler() as prof:
        f(x, w)
        f(x, w)
    prog = f.lower(x, w)
    assert [(l.call, l.kernel.name) for l in prof.launches] == \
        [(c, k.name) for c in range(2) for k in prog.schedule_ir.kernels]
    assert all(0 < l.seconds < 60 and l.device == "cuda" for l in prof.launches)
    # the percentages are the device's: its measured copy bandwidth, no FMA peak (not the CPU's)
    peaks = prof.peaks("cuda")
    assert peaks["name"] == "Emulated GPU" and peaks["copy_gbs"] > 0
    for r in prof.rows():
        assert r["bandwidth_pct"] == pytest.approx(100 * r["gbs"] / peaks["copy_gbs"])
        assert np.isnan(r["peak_pct"])
    text = prof.summary(print_it=False)
    assert "cuda device: Emulated GPU" in text and "GFLOP/s f32 FMA peak" not in text


@needs_nvrtc
@needs_gxx
def test_a_driver_older_than_our_nvrtc_gets_cupys_compile(fake, rng):
    """PTX ISA 9.x from NVRTC 13 on a 12.x driver: cuModuleLoad refuses it when CuPy loads the
    module (at get_function, not at RawModule()); the runtime compiles with CuPy's NVRTC."""
    fake.ptx_isa = (1, 0)           # older than any NVRTC's PTX
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    f = on_gpu(fake, softmax_and_column_sum, x, w)
    with pytest.warns(UserWarning, match="cannot load PTX"):
        total, y, _ = f(x, w)
    np.testing.assert_allclose(y.get(), np_softmax_rows(x.astype(np.float64) * w),
                               rtol=2e-6, atol=1e-7)
    assert [m.code is not None for m in fake.modules] == [False, True]
    assert fake.modules[-1].options == gpu.NVRTC_OPTIONS


@needs_nvrtc
@needs_gxx
def test_a_damaged_cache_entry_is_rebuilt(fake, rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    f = on_gpu(fake, softmax_and_column_sum, x, w)
    path = gpu.ptx_path(fake.sources[-1], "sm_90")
    cache.atomic_write(path, b"//\n// Generated by NVIDIA NVVM Compiler\n.vers")   # cut short
    _, y, _ = f(x, w)
    np.testing.assert_allclose(y.get(), np_softmax_rows(x.astype(np.float64) * w),
                               rtol=2e-6, atol=1e-7)
    assert b".entry k0_softmax(" in path.read_bytes()
    assert [m.code for m in fake.modules] == [None, None]       # our PTX both times


@needs_nvrtc
@needs_gxx
def test_no_cache_writes_nothing_to_the_cache(fake, rng, monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = rng.standard_normal((2, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    f = on_gpu(fake, softmax_and_column_sum, x, w)
    _, y, _ = f(x, w)
    np.testing.assert_allclose(y.get(), np_softmax_rows(x.astype(np.float64) * w),
                               rtol=2e-6, atol=1e-7)
    assert not any(tmp_path.rglob("*.ptx"))


@needs_nvrtc
@needs_gxx
def test_first_calls_from_threads_compile_once(fake, rng):
    x = rng.standard_normal((6, 10)).astype(np.float32)
    w = rng.standard_normal(10).astype(np.float32)
    f = on_gpu(fake, softmax_and_column_sum, x, w)
    prog = f.lower(x, w)
    before = cache.cache_stats()["compiles"]
    start, out = threading.Barrier(3), []

    def call():
        start.wait()
        out.append(prog(x, w)[1].get())
    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake.modules) == 1 and cache.cache_stats()["compiles"] == before + 1
    assert len(out) == 3 and all(o.tobytes() == out[0].tobytes() for o in out)


@needs_gxx
def test_hip_compiles_with_hiprtc_options_that_keep_the_numerics(monkeypatch, rng):
    fake = FakeCuPy(hip=True)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    x = rng.standard_normal((3, 70)).astype(np.float32)
    w = rng.standard_normal(70).astype(np.float32)
    f = on_gpu(fake, softmax_and_column_sum, x, w, target="hip")
    _, y, _ = f(x, w)
    np.testing.assert_allclose(y.get(), np_softmax_rows(x.astype(np.float64) * w),
                               rtol=2e-6, atol=1e-7)
    assert fake.modules[0].code is not None and "-ffp-contract=off" in fake.modules[0].options
    with pytest.raises(BackendUnavailableError, match="built for hip"):
        ts.function(softmax_and_column_sum, target="cuda")(x, w)
    assert gpu.runnable_targets() == ["hip"] and auto_target([fake.asarray(x)]) == "hip"


def test_arguments_are_checked_before_any_copy_to_the_device(fake, rng):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    prog = ts.function(softmax_and_column_sum).lower(x, w, target="cuda")
    fake.transfers = 0
    with pytest.raises(ArgumentError, match="takes 2 arrays"):
        prog.run(x)
    with pytest.raises(ArgumentError) as info:
        prog.run(x, w.astype(np.float64))
    assert info.value.expected == "f32[8]" and info.value.received == "f64[8]"
    with pytest.raises(ArgumentError):
        prog.run(x[:2], w)
    assert fake.transfers == 0 and not fake.modules


def test_no_device_or_no_driver_is_backend_unavailable(fake, rng):
    x = np.ones((2, 3), np.float32)
    prog = ts.function(softmax_and_column_sum).lower(x, np.ones(3, np.float32), target="cuda")
    for devices, message in [(0, "finds no GPU"), (None, "no GPU driver answers")]:
        fake.devices = devices
        assert gpu.runnable_targets() == [] and auto_target([fake.asarray(x)]) == "cpu"
        with pytest.raises(BackendUnavailableError, match=message):
            prog(x, np.ones(3, np.float32))


@needs_nvrtc
@needs_gxx
def test_out_of_device_memory_is_a_resource_error(fake, rng):
    x = rng.standard_normal((4, 16)).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    f = on_gpu(fake, softmax_and_column_sum, x, w)
    fake.memory = 100                     # bytes: the 4x16 softmax (256 B) does not fit
    with pytest.raises(ResourceError, match="cannot allocate"):
        f(x, w)


def test_a_wave32_gpu_is_refused_for_hip_kernels(monkeypatch):
    fake = FakeCuPy(hip=True)
    fake.cuda.runtime.getDeviceProperties = lambda device: {"warpSize": 32,
                                                             "gcnArchName": b"gfx1100"}
    monkeypatch.setitem(sys.modules, "cupy", fake)
    x = np.ones((2, 3), np.float32)
    prog = ts.function(softmax_and_column_sum).lower(x, np.ones(3, np.float32), target="hip")
    with pytest.raises(BackendUnavailableError, match="warps of 32"):
        prog(x, np.ones(3, np.float32))


def test_a_program_without_kernels_loads_no_module(fake, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    f = ts.function(lambda x: (x, x), target="cuda")
    a, b = f(x)
    assert not fake.modules and not fake.launches
    assert a is not b and np.array_equal(a.get(), x) and np.array_equal(b.get(), x)


CONSTANT = np.arange(5, dtype=np.float32)


def with_a_constant(x: Tensor["N"]):
    return x + CONSTANT, op.add(CONSTANT, 0.0), 3.0 * op.sum(x)


@needs_nvrtc
@needs_gxx
def test_a_constant_result_is_a_copy_and_inline_scalars_come_back(fake, rng):
    x = rng.standard_normal(5).astype(np.float32)
    f = on_gpu(fake, with_a_constant, x)
    shifted, const, total = f(x)
    np.testing.assert_array_equal(shifted.get(), x + CONSTANT)
    assert np.array_equal(const.get(), CONSTANT) and total.shape == ()
    np.testing.assert_allclose(total.get(), 3.0 * x.astype(np.float64).sum(), rtol=1e-6,
                               atol=1e-6)
    const.fill(-1.0)                                  # the caller's copy, not the program's
    assert np.array_equal(f(x)[1].get(), CONSTANT)


@needs_nvrtc
@needs_gxx
def test_a_two_stage_sum_gets_a_zeroed_workspace_every_run(fake, rng):
    """A big sum is several blocks and a ticket counter in the workspace after the status
    word: the runtime zeroes it for every run, so the second run sums again (a counter left
    at its end would make no block the last one)."""
    x = rng.standard_normal(70001).astype(np.float32)
    f = on_gpu(fake, lambda x: op.sum(x), x)
    prog = f.lower(x)
    assert prog.tile_ir.workspace > 0 and prog.tile_ir.kernels[0].launch["grid"] > 1
    first, second = f(x).get(), f(x).get()
    assert first.tobytes() == second.tobytes()
    np.testing.assert_allclose(first, x.astype(np.float64).sum(), rtol=1e-5,
                               atol=1e-6 * np.abs(x).sum())


@needs_nvrtc
@needs_gxx
def test_a_gpu_fault_is_a_device_error_a_checkpointed_loop_rolls_back_from(fake, rng, tmp_path,
                                                                           monkeypatch):
    """A driver error during a launch (CUDA_ERROR_ILLEGAL_ADDRESS, here injected on the 5th
    launch) is a ts.DeviceError naming the program; a ts.checkpoint loop marked
    fault_tolerant rolls back to its last checkpoint and ends with the bits of a run without
    the fault."""
    x, w, f = softmax_case(fake, rng)

    @ts.checkpoint(interval=2, path=tmp_path / "faulty")
    @ts.fault_tolerant(max_restarts=2)
    def step(state, i):
        total, y, _ = f(state["x"] + np.float32(i) * 0.01, w)
        return {"x": y.get() * 3}
    calls = {"n": 0}
    real = _Kernel.__call__

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 5:
            raise fake.cuda.driver.CUDADriverError("CUDA_ERROR_ILLEGAL_ADDRESS")
        return real(self, *a, **k)
    monkeypatch.setattr(_Kernel, "__call__", flaky)
    with pytest.raises(ts.DeviceError, match="the GPU failed running @"):
        calls["n"] = 4
        f(x, w)
    calls["n"] = 0                  # (two launches a step: the third step's first faults)
    got = step({"x": x}, 6)
    assert step.restarts == 1
    monkeypatch.setattr(_Kernel, "__call__", real)
    clean = ts.checkpoint(interval=2, path=tmp_path / "clean")(step.step)
    np.testing.assert_array_equal(got["x"], clean({"x": x}, 6)["x"])
