"""Debug mode (the first NaN or Inf, by operator and line), differential debugging against the
NumPy references and float64, and replaying a saved call in another process."""
import logging
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import tessera as ts
from tessera import op


def _line_of(marker: str) -> int:
    """The line of this file holding `marker` (a planted operator's line)."""
    with open(__file__) as f:
        lines = [i for i, text in enumerate(f, start=1) if marker in text and "_line_of" not in text]
    assert len(lines) == 1, marker
    return lines[0]


def fifty_ops(x, plant: int):
    """50 operators; the one at `plant` takes the log of a negative number somewhere."""
    for i in range(50):
        if i == plant:
            x = op.log(x - 0.75)                 # PLANTED
        elif i % 2:
            x = op.tanh(x) * 0.5 + 0.4
        else:
            x = op.sigmoid(x)
    return x


def test_debug_mode_names_the_planted_operator_and_its_line(rng):
    x = rng.uniform(-1, 1, (8, 16)).astype(np.float32)
    f = ts.function(lambda x: fifty_ops(x, plant=31))
    quiet = f(x)
    assert np.isnan(quiet).any()                 # without debug mode: NaN comes back quietly
    with ts.debug_mode():
        with pytest.raises(ts.NumericalError) as info:
            f(x)
    e = info.value
    assert e.op == "log" and e.location.lineno == _line_of("# PLANTED")
    assert "NaN" in e.summary and "from finite inputs" in e.summary
    assert "%sub" in e.received and "min" in e.received and e.hint.startswith("log of zero")
    # found even where a later operator hides it (NaN != NaN: the where picks 0)
    def hidden(x):
        y = fifty_ops(x, plant=3)
        return op.where(y == y, y, 0.0)
    g = ts.function(hidden)
    assert np.isfinite(g(x)).all()
    with ts.debug.numerical(), pytest.raises(ts.NumericalError, match="log produced"):
        g(x)


def test_results_in_debug_mode_are_the_programs_and_nothing_changes_after(rng):
    x = rng.standard_normal((5, 7)).astype(np.float32)
    f = ts.function(lambda x: op.softmax(op.exp(x) * 2.0 - x, axis=-1))
    before = f(x)
    source = f.lower(x).target_code
    with ts.debug_mode():
        during = f(x)
    assert during.tobytes() == before.tobytes()
    assert f(x).tobytes() == before.tobytes() and f.lower(x).target_code == source


def test_infinities_from_a_mask_are_not_errors_but_bad_arguments_are(rng):
    s = rng.standard_normal((3, 9)).astype(np.float32)
    masked = ts.function(lambda s: op.softmax(op.where(s > 0, s, -np.inf), axis=-1))
    with ts.debug_mode():
        got = masked(np.abs(s))
    np.testing.assert_allclose(got, ts.interpret(masked, np.abs(s)), rtol=1e-6)
    s[1, 2] = np.nan
    with ts.debug_mode(), pytest.raises(ts.NumericalError, match="argument %s holds 1 NaN"):
        masked(s)


def test_gradients_are_checked_too():
    g = ts.grad(lambda x: op.sum(op.sqrt(x)))
    x = np.array([0.0, 1.0, 4.0], np.float32)
    assert np.isinf(g(x)[0])
    with ts.debug_mode(), pytest.raises(ts.NumericalError, match="div produced 0 NaN and 1 Inf"):
        g(x)


def test_semantic_mode_logs_every_operators_types(rng, caplog):
    f = ts.function(lambda a, b: op.relu(a @ b))
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="tessera.debug"), ts.debug.semantic():
        f(a, b)
    text = caplog.text
    assert "matmul: f32[2,3], f32[3,4] -> f32[2,4]" in text and "relu: f32[2,4] -> f32[2,4]" in text


# ---- compare ---------------------------------------------------------------------------------------
def test_compare_finds_the_operator_that_loses_the_answer(rng):
    x = rng.uniform(0.5, 1.5, 64).astype(np.float32)

    def f(x):
        y = op.exp(x) * 3.0
        big = y + 1e6
        return big - 1e6                         # CANCELS: float32 keeps 1/16 of y's unit
    report = ts.debug.compare(f, x, against="float64")
    first = report.first
    assert first["op"] == "sub" and first["line"].endswith(f":{_line_of('# CANCELS')}")
    assert [r["ok"] for r in report.rows] == [True, True, True, False]
    # the same float32 program against the float32 references: every operator agrees
    same = ts.debug.compare(f, x, against="interpret")
    assert same.first is None and all(r["rel_err"] < 1e-6 for r in same.rows)
    assert "first beyond its tolerance" in str(report) and "<b>sub</b>" in report._repr_html_()
    assert list(report.table()["op"]) == ["exp", "mul", "add", "sub"]


def test_compare_against_a_callable_and_stated_tolerances(rng):
    x = rng.standard_normal((4, 6))
    f = ts.function(lambda x: op.tanh(x) * 2.0)
    assert ts.debug.compare(f, x, against=lambda x: np.tanh(x) * 2.0).first is None
    off = ts.debug.compare(f, x, against=lambda x: np.tanh(x) * 2.0 + 1e-6)
    assert off.first is not None and off.rows[0]["rtol"] == ts.debug.default_rtol(np.float64)
    assert ts.debug.compare(f, x, against=lambda x: np.tanh(x) * 2.0 + 1e-6, rtol=1e-3).first is None
    assert ts.debug.default_rtol(np.float32) == pytest.approx(np.sqrt(np.finfo(np.float32).eps))
    with pytest.raises(ts.ArgumentError, match="(?s)compare against .float32.*a target"):
        ts.debug.compare(f, x, against="float32")


def test_compare_against_another_isa_level_finds_the_same_bits(rng):
    """The contract, operator by operator: the generic C build gives this machine's bits."""
    f = ts.function(lambda x, w: op.softmax(op.gelu(x @ w) * 2.0 + op.tanh(x[:, :1]), axis=-1))
    x, w = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32)
    report = ts.debug.compare(f, x, w, against="cpu:generic")
    assert len(report.rows) == 7 and all(r["max_abs_err"] == 0 for r in report.rows)


# ---- dump and replay -------------------------------------------------------------------------------
def test_a_dumped_call_replays_bit_for_bit_in_a_fresh_process(rng, tmp_path):
    x = rng.standard_normal((6, 10)).astype(np.float32)
    w = rng.standard_normal((10, 3)).astype(np.float32)
    f = ts.function(lambda x, w: op.logsumexp(op.gelu(x @ w), axis=-1))
    path = tmp_path / "call.tsdebug"
    ts.debug.dump(path, f, x, w)
    assert not os.path.exists(f"{path}.part")
    code = ("import sys, tessera as ts; r = ts.debug.replay(sys.argv[1]); print(r); "
            "sys.exit(0 if r.identical else 1)")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the same bits" in done.stdout
    r = ts.debug.replay(path)
    assert r.identical and r.outputs[0].tobytes() == f(x, w).tobytes()


def test_a_damaged_replay_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.tsdebug"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ts.ArgumentError, match="not a tessera replay file"):
        ts.debug.replay(bad)
    other = tmp_path / "other.tsdebug"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("manifest.json", '{"format": "something else"}')
    with pytest.raises(ts.ArgumentError, match="not a tessera replay file|something else"):
        ts.debug.replay(other)


# ---- memory and bottlenecks ----------------------------------------------------------------------
def test_the_memory_report_adds_up_and_names_the_lines(rng):
    def mlp(x, w1, w2):
        h = op.relu(x @ w1)                      # HIDDEN
        return op.softmax(h @ w2, axis=-1), op.sum(h, axis=0)
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((64, 32), (32, 128), (128, 8)))
    r = ts.profile_memory(mlp, x, w1, w2)
    assert r.inputs == x.nbytes + w1.nbytes + w2.nbytes
    assert r.outputs == (64 * 8 + 128) * 4
    prog = ts.function(mlp).lower(x, w1, w2)
    temps = [b for b in prog.schedule_ir.buffers if b.role == "temp"]
    assert r.unshared == sum(b.nbytes for b in temps) and r.temporaries == sum(prog.schedule_ir.slots)
    assert r.peak == r.inputs + r.outputs + r.constants + r.temporaries
    hidden = [row for row in r.by_line() if row["line"].endswith(f":{_line_of('# HIDDEN')}")]
    assert hidden and hidden[0]["temporaries"] >= 64 * 128 * 4 and "relu" in hidden[0]["ops"]
    assert "peak" in str(r) and "<table>" in r._repr_html_()
    # as a decorator, and from a profile
    watched = ts.profile_memory(mlp)
    out = watched(x, w1, w2)
    assert watched.memory.peak == r.peak and out[1].shape == (128,)
    with ts.profiler() as prof:
        ts.function(mlp)(x, w1, w2)
    assert [m.peak for m in prof.memory()] == [r.peak]


def test_analyze_performance_ranks_kernels_and_backs_each_suggestion(rng):
    def f(x, w):
        h = op.tanh(x @ w)
        return op.softmax(op.cumsum(h, axis=-1) * 2.0, axis=-1)
    x = rng.standard_normal((128, 64)).astype(np.float32)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    r = ts.analyze_performance(f, x, w, repeat=3)
    prog = ts.function(f).lower(x, w)
    assert sorted(row["kernel"] for row in r.rows) == sorted(k.name for k in prog.schedule_ir.kernels)
    assert [row["median_ms"] for row in r.rows] == sorted((row["median_ms"] for row in r.rows),
                                                         reverse=True)
    assert sum(row["share"] for row in r.rows) == pytest.approx(1.0)
    ridge = r.peaks["fma_gflops"] / r.peaks["copy_gbs"]
    for row in r.rows:
        assert row["bound"] == ("memory" if row["intensity"] < ridge else "compute")
    # the cumsum's temporary goes to the softmax alone: the round trip is priced at the
    # measured bandwidth
    trip = [t for t in r.suggestions if "read back" in t["suggestion"]]
    temp = [b for b in prog.schedule_ir.buffers if b.role == "temp" and
            any(b is k.output for k in prog.schedule_ir.kernels if k.strategy == "scan")]
    bounds = {row["strategy"]: row["bound"] for row in r.rows}
    assert bool(trip) == (bounds["scan"] == bounds["row"] == "memory")
    if trip:
        assert trip[0]["saving_ms"] == pytest.approx(2 * temp[0].nbytes / r.peaks["copy_gbs"] / 1e6)
    assert "suggestions" in str(r) and "<table>" in r._repr_html_()


def test_a_loop_is_checked_as_one_operator():
    f = ts.function(lambda x: ts.fori_loop(0, 5, lambda i, c: op.exp(c) * 3.0, x))  # LOOP
    x = np.ones(4, np.float32)
    assert np.isinf(f(x)).all()
    with ts.debug_mode(), pytest.raises(ts.NumericalError) as info:
        f(x)
    assert info.value.op == "fori_loop" and info.value.location.lineno == _line_of("# LOOP")
