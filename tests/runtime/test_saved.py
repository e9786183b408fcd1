"""Saved programs (tessera/compiler/saved.py): the same bits after ts.load, in this process and
in a fresh one with no C compiler on PATH; a damaged file, another machine, an interrupted save
each handled without a crash or a half-written file."""
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.compiler import saved


def _model(x, w, b):
    h = op.gelu(x @ w + b)
    return op.layernorm(h, axis=-1) + op.softmax(x @ w, axis=-1), op.sum(h, axis=0)


def _inputs(rng):
    return (rng.standard_normal((40, 24)).astype(np.float32),
            rng.standard_normal((24, 16)).astype(np.float32),
            rng.standard_normal(16).astype(np.float32))


def _same_bits(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))


def _rewrite(src, dst, change):
    """A copy of the zip at src with change(name, data) -> data applied to every member."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, change(name, zin.read(name)))


def test_load_gives_the_same_bits(tmp_path, rng):
    fn = ts.function(_model)
    args = _inputs(rng)
    prog = fn.lower(*args)
    path = prog.save(tmp_path / "m.tsr")
    loaded = ts.load(path)
    assert str(loaded.graph_ir) == str(prog.graph_ir) and loaded.target == prog.target
    fresh = _inputs(rng)
    _same_bits(loaded(*fresh), fn(*fresh))
    manifest = saved.read_manifest(path)
    (entry,) = manifest["programs"]
    assert entry["inputs"] == {"x": "f32[40,24]", "w": "f32[24,16]", "b": "f32[16]"}
    assert {"p0/levels.pkl", "p0/lib/program.so", "p0/source/program.c"} <= \
        set(manifest["digests"])
    assert any(k.startswith("p0/source/routine_gemm") for k in manifest["digests"])


def test_load_in_a_fresh_process_without_a_compiler(tmp_path, rng):
    fn = ts.function(_model)
    args = _inputs(rng)
    fn.lower(*args).save(tmp_path / "m.tsr")
    np.savez(tmp_path / "in.npz", *args)
    script = """
import shutil, sys, numpy as np, tessera as ts
from tessera.runtime import toolchain
assert shutil.which("gcc") is None and shutil.which("cc") is None
try:
    toolchain.find_compiler()
    raise SystemExit("a compiler was found")
except ts.CompilerNotFoundError:
    pass
a = np.load(sys.argv[1] + "/in.npz")
out = ts.load(sys.argv[1] + "/m.tsr")(a["arr_0"], a["arr_1"], a["arr_2"])
np.savez(sys.argv[1] + "/out.npz", *out)
"""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "CC": "cc", "TESSERA_CACHE_DIR": str(tmp_path / "c")}
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = np.load(tmp_path / "out.npz")
    _same_bits([out["arr_0"], out["arr_1"]], fn(*args))


def test_damaged_and_foreign_files_are_refused(tmp_path, rng):
    args = _inputs(rng)
    fn = ts.function(_model)
    good = fn.lower(*args).save(tmp_path / "m.tsr")

    def flip(name, data):
        return data[:100] + bytes([data[100] ^ 1]) + data[101:] \
            if name == "p0/lib/program.so" else data
    _rewrite(good, tmp_path / "bad.tsr", flip)
    with pytest.raises(ts.TesseraError, match="damaged: its member p0/lib/program.so differs"):
        ts.load(tmp_path / "bad.tsr")
    (tmp_path / "cut.tsr").write_bytes(good.read_bytes()[:5000])
    with pytest.raises(ts.TesseraError, match="not a readable saved program"):
        ts.load(tmp_path / "cut.tsr")

    def elsewhere(name, data):
        if name != "manifest.json":
            return data
        m = json.loads(data)
        m["machine"] = "riscv64"
        return json.dumps(m).encode()
    _rewrite(good, tmp_path / "riscv.tsr", elsewhere)
    with pytest.raises(ts.BackendUnavailableError, match="(?s)riscv64.*recompile=True"):
        ts.load(tmp_path / "riscv.tsr")
    _same_bits(ts.load(tmp_path / "riscv.tsr", recompile=True)(*args), fn(*args))


def test_an_interrupted_save_leaves_the_old_file(tmp_path, rng, monkeypatch):
    args = _inputs(rng)
    path = ts.function(_model).lower(*args).save(tmp_path / "m.tsr")
    before = path.read_bytes()

    def broken(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(zipfile.ZipFile, "writestr", broken)
    with pytest.raises(KeyboardInterrupt):
        ts.function(lambda x: x * 2).lower(args[0]).save(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tsr"]


def test_tessera_server_export_serves_several_batch_sizes(tmp_path, rng):
    """The seeds' export(format="tessera_server", batch_sizes=...): one file, a program per
    batch size, each call dispatched by its arguments' shapes."""
    x, w, b = _inputs(rng)
    fn = ts.function(_model)
    path = fn.export(tmp_path / "server.tsr", x, w, b, format="tessera_server",
                     batch_sizes=[1, 8, 32], batch_argnums=(0,))
    served = ts.load(path)
    assert len(served.programs) == 3
    for n in (1, 8, 32):
        xs = rng.standard_normal((n, 24)).astype(np.float32)
        _same_bits(served(xs, w, b), fn(xs, w, b))
    with pytest.raises(ts.ArgumentError, match="no saved program takes these arguments"):
        served(x[:5], w, b)


def _needs_nvrtc():
    from tessera.runtime.gpu_toolchain import nvrtc_library
    try:
        nvrtc_library()
    except ts.BackendUnavailableError:
        pytest.skip("saving a CUDA program compiles its PTX with NVRTC (the nvidia-cuda-nvrtc "
                    "wheel of the test extra)")


def test_a_cuda_program_saves_its_ptx_per_architecture(tmp_path, rng):
    """The PTX for each architecture, its source and levels; loaded, the same program (run here
    by the GPU emulator), whose first run on a device loads the saved PTX (no NVRTC:
    tests/targets/test_gpu_device.py checks it on one)."""
    _needs_nvrtc()
    from gpu_emulator import emulator
    fn = ts.function(_model)
    args = _inputs(rng)
    prog = fn.lower(*args, target="cuda")
    path = prog.save(tmp_path / "m.tsr", archs=["sm_80", "sm_86", "sm_90"])
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
        entry, = manifest["programs"]
        assert entry["target"] == "cuda" and entry["archs"] == ["sm_80", "sm_86", "sm_90"]
        for arch in entry["archs"]:
            ptx = z.read(f"p0/ptx/{arch}.ptx").decode()
            assert f".target {arch}" in ptx
            assert all(f".entry {k.name}(" in ptx for k in prog.kernels)
        assert z.read("p0/source/program.cu").decode() == prog.target_code
    loaded = ts.load(path)
    assert sorted(loaded.saved_ptx) == ["sm_80", "sm_86", "sm_90"]
    assert loaded.target_code == prog.target_code and str(loaded) == str(prog)
    got = emulator.run_program(loaded, *args)
    for g, w in zip(got, fn(*args)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    hip = fn.lower(*args, target="hip").save(tmp_path / "h.tsr")
    with zipfile.ZipFile(hip) as z:                 # HIP: its source, compiled where it loads
        assert sorted(z.namelist()) == ["manifest.json", "p0/levels.pkl", "p0/source/program.hip"]
    assert ts.load(hip).target == "hip"


def test_tessera_server_export_for_cuda(tmp_path, rng):
    _needs_nvrtc()
    fn = ts.function(lambda x, w: op.tanh(x @ w))
    x, w = rng.standard_normal((4, 8)).astype(np.float32), \
        rng.standard_normal((8, 3)).astype(np.float32)
    path = fn.export(tmp_path / "s.tsr", x, w, format="tessera_server", batch_sizes=[1, 8],
                     batch_argnums=[0], target="cuda")
    served = ts.load(path)
    assert [p.target for p in served.programs] == ["cuda", "cuda"]
    assert served.program_for([x[:1], w]).graph_ir.params[0].type.shape == (1, 8)
    with pytest.raises(ts.ArgumentError, match="no saved program takes"):
        served.program_for([x, w])
