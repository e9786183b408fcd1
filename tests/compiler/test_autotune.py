"""Autotuning: the search on small kernels, the SQLite database across processes, key
invalidation, concurrency, corruption, and the decorator."""
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import tessera as ts
from tessera.compiler import knob_search as at
from tessera import op
from tessera.runtime import tunedb

from conftest import assert_within_dot_bound

SMALL = {"BM": [48, 96], "BN": [64, 128], "BK": [128]}   # a few candidates: tests stay quick


def mm_bias(a, b, c):
    return ts.op.gelu(a @ b + c)


def softmax(x):
    return ts.op.softmax(x, axis=-1)


@pytest.fixture
def db(tmp_path, monkeypatch):
    path = tmp_path / "tune.sqlite"
    monkeypatch.setenv("TESSERA_AUTOTUNE_DB", str(path))
    return path


def mm_inputs(rng, m=70, k=90, n=150):
    return (rng.standard_normal((m, k), dtype=np.float32),
            rng.standard_normal((k, n), dtype=np.float32),
            rng.standard_normal(n, dtype=np.float32))


def run_py(code: str, env_extra: dict) -> subprocess.CompletedProcess:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]  # this file, conftest
    env = {**os.environ, **env_extra, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, cwd=os.path.dirname(__file__), timeout=300)


def test_search_finds_checked_candidates(rng, db):
    f = ts.function(mm_bias)
    a, b, c = mm_inputs(rng)
    want = f(a, b, c)
    r = ts.autotune(f, a, b, c, space=SMALL, budget_s=30, repeats=3, progress=False)
    (kt,) = r.kernels
    assert kt.strategy == "contract"
    statuses = {c.status for c in kt.candidates}
    assert statuses <= set(at.STATUSES) and "default" in statuses
    # the space: the default plus every valid combination of the given values, each tried once
    tried = [c.knobs for c in kt.candidates]
    assert len({tuple(sorted(k.items())) for k in tried}) == len(tried)
    d = kt.default_knobs        # the user's values, and the default's (the baseline)
    for cand in kt.candidates[1:]:
        assert cand.knobs["tile_m"] in (48, 96, d["tile_m"])
        assert cand.knobs["tile_n"] in (64, 128, d["tile_n"])
        assert cand.knobs["tile_k"] in (128, d["tile_k"]) and cand.knobs["parallel"] in (0, 1)
    # tile sizes never change a bit (the numerics contract): every checked candidate is exact
    assert all(x.bitwise for x in kt.candidates if x.status in ("ok", "slower", "default"))
    best = next(x for x in kt.candidates if x.knobs == kt.best_knobs)
    assert best.status in ("ok", "default") and kt.best_s > 0 and kt.default_s > 0
    got = r.program(a, b, c)
    assert got.tobytes() == want.tobytes()
    df = r.to_pandas()
    assert {"kernel", "tile_m", "tile_n", "tile_k", "parallel", "time_ms", "speedup",
            "status"} <= set(df.columns)
    assert len(df) == len(kt.candidates) and df["best"].sum() == 1
    assert "k0_" in str(r) and "candidates" in str(r)


def test_tuned_knobs_apply_to_later_compilations(rng, db):
    a, b, c = mm_inputs(rng)
    r = ts.autotune(mm_bias, a, b, c, space=SMALL, budget_s=30, repeats=3, progress=False)
    ts.reset_cache_stats()
    prog = ts.function(mm_bias).lower(a, b, c)
    (k,) = prog.kernels
    assert k.tuned and ts.cache_stats()["tuned_hits"] == 1
    assert {n: k.knobs[n] for n in r.kernels[0].best_knobs} == r.kernels[0].best_knobs
    assert "knobs (tuned)" in str(prog.schedule_ir)
    # TESSERA_AUTOTUNE=0 ignores the database
    os.environ["TESSERA_AUTOTUNE"] = "0"
    try:
        assert not ts.function(mm_bias).lower(a, b, c).kernels[0].tuned
    finally:
        del os.environ["TESSERA_AUTOTUNE"]
    # other shapes are another kernel: no record
    a2, b2, c2 = mm_inputs(rng, 71)
    assert not ts.function(mm_bias).lower(a2, b2, c2).kernels[0].tuned


def test_record_read_in_another_process(rng, db, tmp_path):
    """A record written by one process steers another's compilation (knobs chosen here on
    purpose, away from the heuristics', so their effect is visible)."""
    code = """
        import numpy as np, tessera as ts
        from tessera.compiler.scheduler import kernel_signature
        from tessera.runtime import tunedb
        def mm(a, b):
            return a @ b
        a = np.ones((64, 80), np.float32); b = np.ones((80, 96), np.float32)
        prog = ts.function(mm).lower(a, b)
        k = prog.kernels[0]
        if MODE == "write":
            key, parts = tunedb.make_key(kernel_signature(k), prog.target)   # "cpu:<ISA level>"
            tunedb.open_db(None).put(key, parts, kernel=k.name, strategy=k.strategy,
                                     knobs={"tile_m": 12, "tile_n": 32, "parallel": False},
                                     default_knobs={}, best_s=1.0, default_s=2.0, measurements=[])
        else:
            print(k.tuned, k.knobs["tile_m"], k.knobs["tile_n"], k.knobs["parallel"])
            np.testing.assert_array_equal(prog(a, b), a @ b)
    """
    w = run_py("MODE = 'write'\n" + textwrap.dedent(code), {})
    assert w.returncode == 0, w.stderr
    r = run_py("MODE = 'read'\n" + textwrap.dedent(code), {})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "12", "32", "False"]
    # the same kernel under another thread count is another machine for the tuner
    r1 = run_py("MODE = 'read'\n" + textwrap.dedent(code), {"OMP_NUM_THREADS": "1"})
    assert r1.returncode == 0, r1.stderr
    assert r1.stdout.split()[0] == "False"


def test_key_changes_with_compiler_flags_and_hardware(rng, db, monkeypatch):
    from tessera.runtime import toolchain
    a, b, c = mm_inputs(rng)
    ts.autotune(mm_bias, a, b, c, space=SMALL, budget_s=20, repeats=2, progress=False)
    assert ts.function(mm_bias).lower(a, b, c).kernels[0].tuned
    monkeypatch.setattr(toolchain, "CFLAGS", toolchain.CFLAGS + ("-DTESSERA_TEST_FLAG",))
    assert not ts.function(mm_bias).lower(a, b, c).kernels[0].tuned
    monkeypatch.undo()
    monkeypatch.setenv("TESSERA_AUTOTUNE_DB", str(db))
    monkeypatch.setattr(toolchain, "cpu_fingerprint", lambda: "another-cpu")
    assert not ts.function(mm_bias).lower(a, b, c).kernels[0].tuned


def test_compare_rules():
    x = np.linspace(-1, 1, 100, dtype=np.float32)
    y = x.copy()
    y[3] = np.nextafter(y[3], np.float32(2))
    assert at.compare(x, x.copy(), {"tile_m": 6}) == ("ok", True, "")
    # a knob that must keep every bit, and bits changed: a wrong result
    assert at.compare(y, x, {"tile_m": 6})[0] == "wrong result"
    # a numeric knob may change the last bits, within the tolerance
    status, bitwise, _ = at.compare(y, x, {"lanes": 32})
    assert status == "ok" and bitwise is False
    z = x.copy()
    z[5] += 0.1
    assert at.compare(z, x, {"lanes": 32})[0] == "wrong result"
    n = x.copy()
    n[0] = np.nan
    assert at.compare(n, x, {"lanes": 32})[0] == "wrong result"


def test_failed_and_timed_out_candidates_are_reported(rng, db, monkeypatch):
    real = at.compile_single

    def flaky(schedule, k, knobs):
        if knobs.get("tile_m") == 48:
            raise ts.CompileError("the C compiler rejected it (test)")
        return real(schedule, k, knobs)
    monkeypatch.setattr(at, "compile_single", flaky)
    a, b, c = mm_inputs(rng)
    r = ts.autotune(mm_bias, a, b, c, space=SMALL, budget_s=30, repeats=2, progress=False)
    by = {x.knobs["tile_m"]: x.status for x in r.kernels[0].candidates if x.order}
    assert by[48] == "failed to compile"
    assert r.kernels[0].best_knobs["tile_m"] != 48
    monkeypatch.undo()
    monkeypatch.setenv("TESSERA_AUTOTUNE_DB", str(db))
    r = ts.autotune(mm_bias, a, b, c, space=SMALL, budget_s=30, repeats=2, timeout_ms=1e-6,
                    progress=False)
    kt = r.kernels[0]
    assert {x.status for x in kt.candidates[1:]} == {"timed out"}
    assert kt.best_knobs == kt.default_knobs


def test_searches_and_tie_rule(rng, db):
    x = rng.standard_normal((256, 300), dtype=np.float32)
    want = ts.function(softmax)(x)
    orders = []
    for _ in range(2):
        r = ts.autotune(softmax, x, search="random", seed=7, budget_s=20, repeats=2,
                        progress=False)
        orders.append([c.knobs for c in r.kernels[0].candidates])
    assert orders[0] == orders[1]           # a seeded shuffle
    r = ts.autotune(softmax, x, strategy="beam", budget_s=20, repeats=2, progress=False)  # (old name)
    assert r.search == "beam"
    kt = r.kernels[0]
    for c in kt.candidates[1:]:             # beam steps one knob from a member of the beam
        assert sum(c.knobs[n] != kt.default_knobs[n] for n in c.knobs) >= 1
    got = r.program(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    exact = ts.autotune(softmax, x, exact=True, budget_s=20, repeats=2, progress=False)
    assert all("lanes" not in c.changed for c in exact.kernels[0].candidates)
    assert exact.program(x).tobytes() == want.tobytes()


def test_tie_rule():
    """Within the tie margin the default wins, then the candidate earliest in the order."""
    field = [at.Candidate("k", i, {"u": i}, {"u": i}, "ok") for i in range(4)]
    assert at.pick(field, {0: 1.0, 1: 0.99, 2: 0.995, 3: 1.2}, 0.02).order == 0
    assert at.pick(field, {0: 1.0, 1: 0.90, 2: 0.89, 3: 1.2}, 0.02).order == 1
    assert at.pick(field, {0: 1.0, 1: 0.90, 2: 0.80, 3: 0.81}, 0.02).order == 2
    assert at.pick(field[1:], {1: 0.5, 2: 0.5, 3: 0.5}, 0.0).order == 1


def test_grid_order_nearest_first(rng, db):
    f = ts.function(mm_bias)
    a, b, c = mm_inputs(rng)
    prog = f.lower(a, b, c)
    k = prog.kernels[0]
    space = at.kernel_space(k, 2, {}, set())
    combos = at.enumerate_grid(k, space)
    changed = [sum(cmb[n] != k.knobs[n] for n in cmb) for cmb in combos]
    assert changed == sorted(changed) and changed[0] == 0


def test_tuned_program_is_deterministic_across_threads(rng, db, tmp_path):
    a, b, c = mm_inputs(rng, 130, 70, 200)
    r = ts.autotune(mm_bias, a, b, c, space={"BM": [48, 96], "BN": [64]}, budget_s=20,
                    repeats=2, progress=False)
    np.savez(tmp_path / "in.npz", a=a, b=b, c=c)
    knobs = json.dumps(r.kernels[0].best_knobs)
    code = f"""
        import json, numpy as np, tessera as ts
        from tessera.compiler.scheduler import kernel_signature
        from tessera.runtime import tunedb
        from test_autotune import mm_bias
        d = np.load({str(tmp_path / 'in.npz')!r})
        f = ts.function(mm_bias)
        prog = f.lower(d["a"], d["b"], d["c"])
        k = prog.kernels[0]
        key, parts = tunedb.make_key(kernel_signature(k), prog.target)
        tunedb.open_db(None).put(key, parts, kernel=k.name, strategy=k.strategy,
                                 knobs=json.loads({knobs!r}), default_knobs={{}}, best_s=1.0,
                                 default_s=1.0, measurements=[])
        f = ts.function(mm_bias)
        assert f.lower(d["a"], d["b"], d["c"]).kernels[0].tuned
        np.save({str(tmp_path / 'out.npy')!r}, f(d["a"], d["b"], d["c"]))
    """
    for threads in ("1", "2"):
        p = run_py(code, {"OMP_NUM_THREADS": threads})
        assert p.returncode == 0, p.stderr
        got = np.load(tmp_path / "out.npy")
        assert got.tobytes() == r.program(a, b, c).tobytes()
    ref = (a.astype(np.float64) @ b.astype(np.float64) + c)
    assert np.abs(r.program(a, b, c) - ts.interpret(mm_bias, a, b, c)).max() < \
        1e-4 * np.abs(ref).max()


def test_concurrent_tuning_processes(rng, db, tmp_path):
    code = """
        import numpy as np, tessera as ts
        def mm(a, b):
            return a @ b
        rng = np.random.default_rng(SEED)
        a = rng.standard_normal((40, 50), dtype=np.float32)
        b = rng.standard_normal((50, N), dtype=np.float32)
        r = ts.autotune(mm, a, b, space={"BM": [12, 24], "BN": [32, 64]}, budget_s=30,
                        repeats=2, progress=False)
        print(len(r.kernels[0].candidates))
    """
    procs = [subprocess.Popen([sys.executable, "-c", f"SEED, N = {i}, {60 + i}\n" +
                               textwrap.dedent(code)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=dict(os.environ))
             for i in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = con.execute("SELECT knobs, measurements FROM tuned").fetchall()
    assert len(rows) == 3
    for knobs, meas in rows:
        # the user's values or the default's (n itself)
        assert json.loads(knobs)["tile_n"] in (32, 64, 60, 61, 62) and len(json.loads(meas)) > 1


def test_concurrent_writers_threads(db):
    import threading
    d = tunedb.open_db(db)
    errors = []

    def writer(t):
        try:
            for i in range(30):
                key, parts = tunedb.make_key(f"sig{t}-{i}", "cpu")
                d.put(key, parts, kernel="k", strategy="row", knobs={"lanes": i},
                      default_knobs={}, best_s=1.0, default_s=1.0, measurements=[])
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(d.rows()) == 120


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_database_is_reported_and_rebuilt(rng, tmp_path, monkeypatch, damage):
    path = tmp_path / "bad.sqlite"
    monkeypatch.setenv("TESSERA_AUTOTUNE_DB", str(path))
    a, b, c = mm_inputs(rng)
    ts.autotune(mm_bias, a, b, c, space=SMALL, budget_s=20, repeats=2, progress=False)
    tunedb.open_db(path).close()
    tunedb._open_dbs.clear()
    tunedb._warned.clear()
    data = path.read_bytes()
    path.write_bytes(os.urandom(4096) if damage == "garbage" else data[:len(data) // 3])
    for extra in ("-wal", "-shm"):
        (tmp_path / f"bad.sqlite{extra}").unlink(missing_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = ts.function(mm_bias).lower(a, b, c)     # reads the damaged file
    np.testing.assert_allclose(prog(a, b, c), ts.interpret(mm_bias, a, b, c), rtol=1e-4,
                               atol=1e-4)
    if damage == "garbage":
        assert any("corrupt" in str(w.message) for w in caught)
        assert list(tmp_path.glob("bad.sqlite.corrupt-*"))
    # the database works again: a new search writes to it
    r = ts.autotune(mm_bias, a, b, c, space=SMALL, budget_s=20, repeats=2, progress=False)
    assert tunedb.open_db(path).get(r.kernels[0].key) is not None


def test_decorator_tunes_once_then_reads_the_database(rng, tmp_path, monkeypatch):
    path = tmp_path / "deco.sqlite"
    monkeypatch.delenv("TESSERA_AUTOTUNE_DB", raising=False)

    @ts.kernel.autotune(space={"BM": [48, 96], "BN": [64], "warps": [4, 8], "stages": [2]},
                        metric="throughput", timeout_ms=200, cache=str(path), budget_s=20,
                        progress=False)
    def mm(a, b):
        return a @ b

    a = rng.standard_normal((60, 70), dtype=np.float32)
    b = rng.standard_normal((70, 80), dtype=np.float32)
    assert_within_dot_bound(mm(a, b), a, b)
    (r,) = mm.results.values()
    assert set(r.ignored) == {"warps", "stages"} and path.exists()
    assert_within_dot_bound(mm(a, b), a, b)
    assert len(mm.results) == 1                    # no second search
    assert mm.lower(a, b).kernels[0].tuned
    # the default database was not touched
    assert not (tmp_path / "autotune.sqlite").exists()
    # another process: the knobs are found, nothing is searched
    code = f"""
        import numpy as np, tessera as ts
        @ts.kernel.autotune(space={{"BM": [48, 96], "BN": [64]}}, cache={str(path)!r},
                            progress=False)
        def mm(a, b):
            return a @ b
        a = np.ones((60, 70), np.float32); b = np.ones((70, 80), np.float32)
        assert (mm(a, b) == 70).all()
        print(len(mm.results), mm.lower(a, b).kernels[0].tuned)
    """
    p = run_py(code, {})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "True"]


def test_progress_bar_and_bad_arguments(rng, db, capsys):
    x = rng.standard_normal((64, 100), dtype=np.float32)
    ts.autotune(softmax, x, budget_s=10, repeats=2)
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.strip()]      # not a terminal: one line
    assert line.startswith("autotune k0_softmax [") and "best x" in line
    with pytest.raises(ts.ArgumentError, match="unknown knob 'BQ'"):
        ts.autotune(softmax, x, space={"BQ": [1]})
    with pytest.raises(ts.ArgumentError, match="search 'anneal'"):
        ts.autotune(softmax, x, search="anneal")
    with pytest.raises(ts.ArgumentError, match="metric"):
        ts.autotune(softmax, x, metric="energy")
    with pytest.raises(ts.ArgumentError, match="budget_s"):
        ts.autotune(softmax, x, budget_s=0)
    with pytest.raises(ts.ArgumentError, match="positive integers"):
        ts.autotune(softmax, x, space={"BM": [0, 64]})


def test_pointwise_knobs_compile_and_no_op_knobs_are_not_measured(rng, db):
    x = rng.standard_normal((40, 3000), dtype=np.float32)
    f = ts.function(lambda x: op.tanh(x.T) * 2.0 + 1.0)       # a 2-D nest: unroll applies
    r = ts.autotune(f, x, budget_s=20, repeats=2, progress=False)
    kt = r.kernels[0]
    statuses = [c.status for c in kt.candidates]
    assert "failed to compile" not in statuses and "wrong result" not in statuses
    assert any("unroll" in c.changed for c in kt.candidates if c.status in ("ok", "slower"))
    np.testing.assert_array_equal(r.program(x), f(x))
    # a rank-0 sum: parallel changes nothing in its code, so it is not measured again
    r = ts.autotune(lambda x: op.sum(x), x[0], budget_s=5, repeats=2, exact=True,
                    progress=False)
    assert {c.status for c in r.kernels[0].candidates[1:]} <= {"same code", "ok", "slower"}


def test_parallel_never_changes_bits(rng):
    """A whole-tensor sum is chunked by its size, whoever runs the chunks."""
    x = rng.standard_normal(70001, dtype=np.float32)
    a = ts.function(lambda x: op.sum(x))(x)
    b = ts.function(lambda x: op.sum(x), schedule=ts.Schedule(parallel=False))(x)
    assert a.tobytes() == b.tobytes()
    np.testing.assert_allclose(a, x.astype(np.float64).sum(), rtol=1e-5,
                               atol=1e-6 * np.abs(x).sum())     # the sum may cancel to near 0


def test_compare_with_infinities():
    inf = np.inf
    assert at.compare([np.array([inf, 5., -7.])], [np.array([inf, 1., 2.])],
                      {"lanes": 4})[0] == "wrong result"
    assert at.compare([np.array([inf, 1.])], [np.array([-inf, 1.])],
                      {"lanes": 4})[0] == "wrong result"
    assert at.compare([np.array([inf, np.nan, 1.0])], [np.array([inf, np.nan, 1.0 + 1e-13])],
                      {"lanes": 4})[0] == "ok"


def test_decorator_tunes_each_specialisation_and_keeps_its_own_arguments(rng, tmp_path):
    path = tmp_path / "spec.sqlite"

    @ts.kernel.autotune(cache=str(path), budget_s=5, repeats=2, progress=False)
    def f(x, axis, seed):
        return op.softmax(x * seed, axis=axis)

    x = rng.standard_normal((30, 40), dtype=np.float32)
    np.testing.assert_allclose(f(x, -1, seed=2.0), ts.interpret(f.function, x, -1, 2.0),
                               rtol=1e-5, atol=1e-6)
    f(x, 0, seed=2.0)                   # another static argument: another kernel, searched
    assert len(f.results) == 2
    assert all(k.tuned for k in f.lower(x, 0, seed=2.0).kernels)
    with pytest.raises(ts.ArgumentError, match="no kernel 'k9'"):
        ts.autotune(f, x, -1, 2.0, kernels=["k9"], cache=str(path))


def test_exact_ignores_recorded_lanes(rng, tmp_path):
    from tessera.compiler.scheduler import kernel_signature
    path = tmp_path / "exact.sqlite"
    x = rng.standard_normal((64, 333), dtype=np.float32)
    fn = lambda x: op.sum(x * x, axis=-1)                   # noqa: E731
    prog = ts.function(fn).lower(x)
    k = prog.kernels[0]
    key, parts = tunedb.make_key(kernel_signature(k), prog.target)
    tunedb.open_db(path).put(key, parts, kernel=k.name, strategy=k.strategy,
                             knobs={"lanes": 4, "parallel": k.knobs["parallel"]},
                             default_knobs={}, best_s=1.0, default_s=1.0, measurements=[])
    plain = ts.function(fn)(x)
    with tunedb.using(path):
        assert ts.function(fn).lower(x).kernels[0].knobs["lanes"] == 4
    exact = ts.kernel.autotune(fn, cache=str(path), exact=True, budget_s=2, progress=False)
    assert exact(x).tobytes() == plain.tobytes()


def test_bad_records_and_bad_paths(rng, tmp_path):
    from tessera.compiler.scheduler import kernel_signature
    path = tmp_path / "bad.sqlite"
    x = rng.standard_normal((8, 50), dtype=np.float32)
    fn = lambda x: op.sum(x, axis=-1)                       # noqa: E731
    prog = ts.function(fn).lower(x)
    k = prog.kernels[0]
    key, parts = tunedb.make_key(kernel_signature(k), prog.target)
    for record in ({"lanes": 0}, {"lanes": "8"}, {"lanes": 100000}, {"warp_size": 3}):
        tunedb.open_db(path).put(key, parts, kernel=k.name, strategy=k.strategy, knobs=record,
                                 default_knobs={}, best_s=1.0, default_s=1.0, measurements=[])
        tunedb._warned.clear()
        with tunedb.using(path), pytest.warns(RuntimeWarning, match="do not fit"):
            got = ts.function(fn)(x)
        np.testing.assert_allclose(got, x.sum(-1), rtol=1e-5, atol=1e-5)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(ts.ArgumentError, match="not a file"):
        ts.autotune(fn, x, cache=str(folder), budget_s=1, progress=False)
    assert folder.is_dir()
    with pytest.raises(ts.ArgumentError, match="accumulators"):
        ts.autotune(fn, x, space={"vector": [16384]})


def test_new_database_opened_by_many_processes_at_once(tmp_path):
    path = tmp_path / "fresh.sqlite"
    code = f"""
        import sys
        from tessera.runtime import tunedb
        i = int(sys.argv[1])
        key, parts = tunedb.make_key(f"sig{{i}}", "cpu")
        tunedb.open_db({str(path)!r}).put(key, parts, kernel="k", strategy="row",
            knobs={{"lanes": i + 1}}, default_knobs={{}}, best_s=1.0, default_s=1.0,
            measurements=[])
    """
    procs = [subprocess.Popen([sys.executable, "-W", "error::RuntimeWarning", "-c",
                               textwrap.dedent(code), str(i)], stderr=subprocess.PIPE,
                              text=True) for i in range(6)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert len(tunedb.TuneDB(path).rows()) == 6
    assert not list(tmp_path.glob("fresh.sqlite.corrupt-*"))


def test_a_forked_child_opens_its_own_connection(tmp_path):
    import multiprocessing as mp
    path = tmp_path / "fork.sqlite"
    db = tunedb.open_db(path)
    db.rows()                           # the parent holds a connection
    ctx = mp.get_context("fork")
    with ctx.Pool(2) as pool:
        pool.map(_put_in_child, [(str(path), i) for i in range(4)])
    assert len(db.rows()) == 4


def _put_in_child(job):
    path, i = job
    key, parts = tunedb.make_key(f"child{i}", "cpu")
    tunedb.open_db(path).put(key, parts, kernel="k", strategy="row", knobs={"lanes": 8},
                             default_knobs={}, best_s=1.0, default_s=1.0, measurements=[])


def test_a_second_search_returns_the_recorded_result_unless_asked_for_more(rng, db):
    x = rng.standard_normal((256, 300), dtype=np.float32)
    first = ts.autotune(softmax, x, budget_s=4, repeats=2, progress=False)
    assert first.recorded == [] and first.kernels
    again = ts.autotune(softmax, x, budget_s=4, repeats=2, progress=False)
    assert again.recorded == [k.name for k in first.kernels] and again.best == first.best
    kt, kt0 = again.kernels[0], first.kernels[0]
    assert [c.knobs for c in kt.candidates] == [c.knobs for c in kt0.candidates]
    assert [c.times for c in kt.candidates] == [c.times for c in kt0.candidates]
    assert "(recorded)" in str(again) and again.program is not None
    np.testing.assert_array_equal(again.program(x), first.program(x))
    smaller = ts.autotune(softmax, x, budget_s=2, repeats=2, progress=False)
    assert smaller.recorded                                  # a smaller budget: the record serves
    for more in (dict(budget_s=8), dict(budget_s=4, force=True), dict(budget_s=4, exact=True),
                 dict(budget_s=4, search="beam"), dict(budget_s=4, space={"vector": [4, 8]}),
                 dict(budget_s=4, timeout_ms=50)):
        r = ts.autotune(softmax, x, repeats=2, progress=False, **more)
        assert r.recorded == [], more                        # asked for more, or otherwise


def test_a_database_from_before_search_records_is_read_and_extended(tmp_path):
    import sqlite3
    path = tmp_path / "old.sqlite"
    old = tunedb._TABLE.replace(",\n    search TEXT                  -- JSON: how it was searched "
                                "(search, space, exact, budget_s)", "")
    assert "search TEXT" not in old
    with sqlite3.connect(path) as c:
        c.execute(old)
        c.execute("INSERT INTO tuned VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  ("k1", "k0_x", "row", "sig", "cpu", "hw", "cc", '{"lanes": 4}', "{}", 1.0, 2.0,
                   "[]", 0.0))
    db = tunedb.open_db(path)
    assert db.get("k1")["knobs"] == {"lanes": 4} and db.record("k1")["search"] is None
    db.put("k2", {"signature": "s", "target": "cpu", "hardware": "hw", "compiler": "cc"},
           kernel="k", strategy="row", knobs={"lanes": 8}, default_knobs={}, best_s=1.0,
           default_s=1.0, measurements=[], search={"search": "grid", "budget_s": 3.0})
    assert db.record("k2")["search"] == {"search": "grid", "budget_s": 3.0}
