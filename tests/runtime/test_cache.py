"""Caches: in memory per input signature, on disk content-addressed across processes, written
atomically, corrupt entries rebuilt."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera.runtime import cache

PROGRAM = textwrap.dedent("""
    import numpy as np, tessera as ts
    from tessera import op
    @ts.function
    def f(x: ts.Tensor["N", "D"]):
        return op.softmax(x * 1.25 + 0.5)
    x = np.linspace(-1, 1, 60, dtype=np.float32).reshape(6, 10)
    y = f(x)
    e = np.exp(x * 1.25 + 0.5 - (x * 1.25 + 0.5).max(-1, keepdims=True))
    assert np.allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-5)
    s = ts.cache_stats()
    print("compiles", s["compiles"], "disk_hits", s["disk_hits"])
""")


def run(tmp_path, **env):
    full = dict(os.environ, TESSERA_CACHE_DIR=str(tmp_path), **env)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=full, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_second_call_compiles_nothing(rng):
    ts.reset_cache_stats()
    f = ts.function(lambda x: op_chain(x))
    x = rng.standard_normal((7, 3)).astype(np.float32)
    f(x)
    first = ts.cache_stats()
    assert first["compiles"] + first["disk_hits"] == 1
    f(x)
    f(x + 1)                      # same signature, new values
    after = ts.cache_stats()
    assert after["compiles"] == first["compiles"] and after["disk_hits"] == first["disk_hits"]
    assert after["traces"] == first["traces"] and after["memory_hits"] == 2
    f(x[:5])                      # a new shape specialises anew
    assert ts.cache_stats()["traces"] > after["traces"]


def op_chain(x):
    return (x * 2).sum(axis=0)


def test_new_process_hits_the_disk_cache(tmp_path):
    assert run(tmp_path) == ["compiles", "1", "disk_hits", "0"]
    assert run(tmp_path) == ["compiles", "0", "disk_hits", "1"]
    so = list(Path(tmp_path).rglob("*.so"))
    assert len(so) == 1 and so[0].with_suffix(".c").exists()
    assert not list(Path(tmp_path).rglob(".tmp-*"))


def test_no_cache_bypasses_the_disk(tmp_path):
    assert run(tmp_path, TESSERA_NO_CACHE="1") == ["compiles", "1", "disk_hits", "0"]
    assert not list(Path(tmp_path).rglob("*.so"))


def test_corrupt_entry_is_reported_and_rebuilt(tmp_path):
    run(tmp_path)
    so = next(Path(tmp_path).rglob("*.so"))
    so.write_bytes(b"\x7fELF truncated")
    full = dict(os.environ, TESSERA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-W", "always", "-c", PROGRAM], env=full,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "corrupt kernel cache entry" in out.stderr
    assert out.stdout.split() == ["compiles", "1", "disk_hits", "0"]
    assert run(tmp_path) == ["compiles", "0", "disk_hits", "1"]


def test_concurrent_processes_share_one_entry(tmp_path):
    full = dict(os.environ, TESSERA_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", PROGRAM], env=full, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert len(list(Path(tmp_path).rglob("*.so"))) == 1
    assert not list(Path(tmp_path).rglob(".tmp-*"))
    assert run(tmp_path) == ["compiles", "0", "disk_hits", "1"]


def test_a_compile_killed_by_sigkill_leaves_no_temporary_for_good(tmp_path):
    """SIGKILL during a compile (here: a compiler that sleeps first) leaves its temporaries;
    the next process using the cache deletes those an hour old, and never a fresh one (a live
    writer's)."""
    import shutil
    import signal
    import time
    cc = tmp_path / "slow-cc"
    cc.write_text("#!/bin/sh\ncase \"$*\" in *.tmp-*) sleep 60;; esac\n"   # (its probes: quick)
                  f"exec {shutil.which('gcc') or shutil.which('cc')} \"$@\"\n")
    cc.chmod(0o755)
    cache_root = tmp_path / "cache"
    full = dict(os.environ, TESSERA_CACHE_DIR=str(cache_root), CC=str(cc))
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], env=full)
    deadline = time.time() + 120
    while not list(cache_root.rglob(".tmp-*.so")) and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    orphans = list(cache_root.rglob(".tmp-*"))
    assert orphans, "the killed compile left no temporary to clean up"
    old = time.time() - 2 * cache.STALE_TEMPORARY_S
    for p in orphans:
        os.utime(p, (old, old))
    fresh = orphans[0].with_name(".tmp-a-live-writer.so")
    fresh.write_bytes(b"")
    assert run(cache_root) == ["compiles", "1", "disk_hits", "0"]
    assert list(cache_root.rglob(".tmp-*")) == [fresh]


def test_atomic_write_leaves_old_or_new(tmp_path):
    target = tmp_path / "a" / "file.bin"
    cache.atomic_write(target, b"old")

    class Boom(Exception):
        pass

    class Exploding(bytes):
        pass

    real_fsync = os.fsync
    try:
        os.fsync = lambda fd: (_ for _ in ()).throw(Boom())
        try:
            cache.atomic_write(target, b"new-but-interrupted")
        except Boom:
            pass
    finally:
        os.fsync = real_fsync
    assert target.read_bytes() == b"old"
    assert [p.name for p in target.parent.iterdir()] == ["file.bin"]


def test_cache_key_covers_source_flags_and_cpu():
    from tessera.runtime import toolchain
    cc = toolchain.find_compiler()
    a = toolchain.artifact_key("int x;", cc, "x86-64-v3")
    assert a == toolchain.artifact_key("int x;", cc, "x86-64-v3")
    assert a != toolchain.artifact_key("int y;", cc, "x86-64-v3")
    assert a != toolchain.artifact_key("int x;", cc, "x86-64-v4")
    old = toolchain.CFLAGS
    try:
        toolchain.CFLAGS = old + ("-DX",)
        assert a != toolchain.artifact_key("int x;", cc, "x86-64-v3")
    finally:
        toolchain.CFLAGS = old
    assert "-ffast-math" not in toolchain.CFLAGS and "-ffp-contract=off" in toolchain.CFLAGS


def test_damaged_entry_is_never_mapped(tmp_path):
    # flipped bytes inside a valid-looking ELF would crash dlopen (SIGBUS/SIGSEGV): the digest
    # beside each entry catches it first
    run(tmp_path)
    so = next(Path(tmp_path).rglob("*.so"))
    data = bytearray(so.read_bytes())
    for k in range(2000, min(len(data), 12000), 7):
        data[k] ^= 0xFF
    so.write_bytes(bytes(data))
    full = dict(os.environ, TESSERA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-W", "always", "-c", PROGRAM], env=full,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "corrupt kernel cache entry" in out.stderr and "digest" in out.stderr
    assert out.stdout.split() == ["compiles", "1", "disk_hits", "0"]
    assert run(tmp_path) == ["compiles", "0", "disk_hits", "1"]


def test_unusable_cache_dir_falls_back_with_a_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    full = dict(os.environ, TESSERA_CACHE_DIR=str(blocker / "cache"))
    out = subprocess.run([sys.executable, "-W", "always", "-c", PROGRAM], env=full,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "cannot be used" in out.stderr and "TESSERA_CACHE_DIR" in out.stderr
    assert out.stdout.split() == ["compiles", "1", "disk_hits", "0"]


def test_no_cache_names_files_itself_and_cleans_up(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    evil = ts.function(lambda x: x * 7 + 1, name="../../escape" + "x" * 300)
    np.testing.assert_array_equal(evil(np.ones(3, np.float32)), np.full(3, 8, np.float32))
    assert list(tmp_path.iterdir()) == []                 # nothing left, nothing outside
    assert not (tmp_path.parent.parent / "escape").exists()


def test_threads_build_each_program_once(tmp_path, monkeypatch):
    import threading
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    ts.reset_cache_stats()
    fns = [ts.function(lambda x, k=k: x * (k + 2.5)) for k in range(3)]
    x = np.arange(5, dtype=np.float32)
    errors = []

    def work(i):
        try:
            f = fns[i % 3]
            np.testing.assert_array_equal(f(x), x * np.float32(i % 3 + 2.5))
        except Exception as e:          # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert ts.cache_stats()["compiles"] == 3


ROUTINES = textwrap.dedent("""
    import numpy as np, tessera as ts
    from tessera import op
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((40, 30), np.float32), rng.standard_normal((30, 20), np.float32)
    q = rng.standard_normal((2, 9, 8), np.float32)
    before = ts.cache_stats()["compiles"]
    for f in (lambda a, b: a @ b, lambda a, b: op.relu(a @ b + 1), lambda a, b: a @ b * 2):
        assert np.allclose(ts.function(f)(a, b), f(a, b), atol=1e-4)
    att = ts.function(lambda q: op.attention(q, q, q))(q)
    print("compiles", ts.cache_stats()["compiles"] - before)
""")


def test_routines_compile_once_into_libraries_programs_link_against(tmp_path):
    # three GEMM programs and one attention program: two routine libraries, four programs
    r = subprocess.run([sys.executable, "-c", ROUTINES], capture_output=True, text=True,
                       env=dict(os.environ, TESSERA_CACHE_DIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["compiles", "6"]
    libraries = [p for p in (tmp_path / "kernels").rglob("*.c")
                 if "the routine library" in p.read_text()]
    assert len(libraries) == 2
    # a new process compiles nothing; without the cache the libraries live in a temporary
    # directory for the process and are removed with it
    r = subprocess.run([sys.executable, "-c", ROUTINES], capture_output=True, text=True,
                       env=dict(os.environ, TESSERA_CACHE_DIR=str(tmp_path)))
    assert r.stdout.split() == ["compiles", "0"], r.stderr
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run([sys.executable, "-c", ROUTINES], capture_output=True, text=True,
                       env=dict(os.environ, TESSERA_NO_CACHE="1", TMPDIR=str(tmp)))
    assert r.stdout.split() == ["compiles", "6"], r.stderr
    assert not list(tmp.iterdir())


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="programs find their routine libraries relative to themselves on Linux")
def test_a_moved_cache_keeps_its_programs_that_call_routine_libraries(tmp_path):
    """Programs link their routine libraries by name and find them relative to themselves, so
    a cache moved elsewhere (or mounted at another path) compiles nothing again."""
    first = tmp_path / "first"
    r = subprocess.run([sys.executable, "-c", ROUTINES], capture_output=True, text=True,
                       env=dict(os.environ, TESSERA_CACHE_DIR=str(first)))
    assert r.stdout.split() == ["compiles", "6"], r.stderr
    moved = tmp_path / "moved"
    first.rename(moved)
    r = subprocess.run([sys.executable, "-c", ROUTINES], capture_output=True, text=True,
                       env=dict(os.environ, TESSERA_CACHE_DIR=str(moved)))
    assert r.stdout.split() == ["compiles", "0"], r.stderr


def test_a_program_declares_its_routines_and_carries_their_sources(rng):
    a = rng.standard_normal((12, 9)).astype(np.float32)
    prog = ts.function(lambda a: a @ a.T).lower(a)
    assert "void ts_gemm_tile_f32(" in prog.target_code          # declared ...
    assert "ts_micro_f32" not in prog.target_code                 # ... not defined
    (name, source), = prog.routine_sources.items()
    assert name == "routine_gemm_f32.c" and "\nvoid ts_gemm_tile_f32(" in source
    assert "static void ts_micro_f32(" in source
