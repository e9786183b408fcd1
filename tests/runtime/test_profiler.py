"""The profiler: launches recorded from real compiled programs, their aggregates, the views
(text, HTML, DataFrame, chrome trace) and the machine probe with its cache."""
import json
import statistics
import sys
import threading

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.runtime import probe
from tessera.runtime import profiler as profiler_mod
from tessera.runtime import toolchain


def _kernel_times(prof, kernel):
    return [x.seconds for x in prof.launches if x.kernel is kernel]


@pytest.fixture
def softmax_and_sum(rng):
    x = rng.standard_normal((64, 300)).astype(np.float32)
    f = ts.function(lambda x: (op.softmax(x), op.sum(op.exp(x), axis=0)))
    f(x)                                                  # compiled outside any profile
    return f, x, f.lower(x).schedule_ir.kernels


def test_every_launch_is_recorded_and_aggregated(softmax_and_sum):
    f, x, kernels = softmax_and_sum
    assert len(kernels) >= 1
    f(x)                                                  # not recorded: no profile open
    with ts.profiler() as prof:
        for _ in range(7):
            f(x)
    f(x)                                                  # not recorded either
    assert prof.calls == 7 and len(prof.launches) == 7 * len(kernels)
    assert [x.index for x in prof.launches] == list(range(len(kernels))) * 7
    assert all(x.seconds > 0 for x in prof.launches)

    rows = prof.rows()
    assert len(rows) == len(kernels)
    assert [r["kernel"] for r in rows] == [k.name for k in kernels]
    peaks = prof.peaks()
    for r, k in zip(rows, kernels):
        times = _kernel_times(prof, k)
        assert len(times) == 7 == r["calls"]
        med = statistics.median(times)
        assert r["median_ms"] == pytest.approx(med * 1e3)
        assert r["min_ms"] == pytest.approx(min(times) * 1e3)
        assert r["total_ms"] == pytest.approx(sum(times) * 1e3)
        assert r["flops"] == k.flops and r["bytes"] == k.bytes
        assert r["strategy"] == k.strategy and r["fuses"] == " ".join(k.fused_labels())
        assert r["median_ms"] > 0 and r["min_ms"] > 0
        assert r["gflops"] == pytest.approx(k.flops / med / 1e9)
        assert r["gbs"] == pytest.approx(k.bytes / med / 1e9)
        assert r["peak_pct"] == pytest.approx(100 * r["gflops"] / peaks["fma_gflops"])
        assert r["bandwidth_pct"] == pytest.approx(100 * r["gbs"] / peaks["copy_gbs"])
        assert r["function"] == "<lambda>" and r["shapes"] == "f32[64,300]"


def test_a_float64_kernel_is_measured_against_the_float64_peak(rng):
    f = ts.function(lambda a, b: op.tanh(a @ b))
    a, b = rng.standard_normal((64, 48)), rng.standard_normal((48, 32))     # float64
    with ts.profiler() as prof:
        f(a, b)
    peaks = prof.peaks()
    (row,) = prof.rows()
    assert row["peak_pct"] == pytest.approx(100 * row["gflops"] / peaks["fma64_gflops"])
    assert "f64)" in prof.summary(print_it=False)


def test_even_number_of_calls_takes_the_mean_of_the_middle_two(softmax_and_sum):
    f, x, kernels = softmax_and_sum
    with ts.profiler() as prof:
        for _ in range(4):
            f(x)
    for r, k in zip(prof.rows(), kernels):
        times = sorted(_kernel_times(prof, k))
        assert r["median_ms"] == pytest.approx((times[1] + times[2]) / 2 * 1e3)


def test_rows_are_per_function_shapes_and_kernel(rng):
    @ts.function
    def g(x: ts.Tensor["B", "D"]):
        return op.relu(x) * 2

    h = ts.function(lambda x: op.exp(x))
    a = rng.standard_normal((8, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5)).astype(np.float32)
    with ts.profiler() as prof:
        for _ in range(3):
            g(a)
            g(b)
            h(a)
    rows = prof.rows()
    kernels = {key: g.lower(arr).schedule_ir.kernels for key, arr in (("a", a), ("b", b))}
    kh = h.lower(a).schedule_ir.kernels
    assert len(rows) == len(kernels["a"]) + len(kernels["b"]) + len(kh)
    assert {(r["function"], r["shapes"]) for r in rows} == {
        ("g", "B=8, D=5"), ("g", "B=3, D=5"), ("<lambda>", "f32[8,5]")}
    assert all(r["calls"] == 3 for r in rows)
    text = prof.summary(print_it=False)
    assert "@g [B=8, D=5]" in text and "@g [B=3, D=5]" in text


def test_profiles_nest_and_record_into_the_innermost(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    f = ts.function(lambda x: x * 2)
    n = len(f.lower(x).schedule_ir.kernels)
    assert profiler_mod.current() is None
    with ts.profiler() as outer:
        assert profiler_mod.current() is outer
        f(x)
        with ts.profiler() as inner:
            assert profiler_mod.current() is inner
            f(x)
            f(x)
        assert profiler_mod.current() is outer
        f(x)
    assert profiler_mod.current() is None
    assert len(outer.launches) == 2 * n and outer.calls == 2
    assert len(inner.launches) == 2 * n and inner.calls == 2
    f(x)
    assert len(outer.launches) == 2 * n                   # nothing after the block
    with outer:                                           # a profile may be entered again
        f(x)
    assert outer.calls == 3


def test_a_profile_records_only_its_own_thread(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    f = ts.function(lambda x: x + 1)
    f(x)
    seen = []

    def work():
        seen.append(profiler_mod.current())
        f(x)

    with ts.profiler() as prof:
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert seen == [None] and prof.launches == []


def test_chrome_trace_lays_each_call_out_in_sequence(softmax_and_sum, tmp_path):
    f, x, kernels = softmax_and_sum
    with ts.profiler() as prof:
        for _ in range(4):
            f(x)
    path = tmp_path / "trace.json"
    assert prof.export_chrome_trace(path) == path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]   # no temporaries left
    doc = json.loads(path.read_text())
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(prof.launches) == 4 * len(kernels)
    for e, launch in zip(events, prof.launches):
        assert e["name"] == launch.kernel.name and e["cat"] == launch.kernel.strategy
        assert isinstance(e["pid"], int) and e["tid"] == launch.thread
        assert e["dur"] == pytest.approx(launch.seconds * 1e6) and e["dur"] > 0
        assert e["ts"] >= 0
        assert e["args"]["flops"] == launch.kernel.flops
        assert e["args"]["bytes"] == launch.kernel.bytes
        assert e["args"]["strategy"] == launch.kernel.strategy
    by_call = {}
    for e in events:
        by_call.setdefault(e["args"]["call"], []).append(e)
    assert sorted(by_call) == [0, 1, 2, 3]
    for evs in by_call.values():                          # one call's kernels back to back
        assert len(evs) == len(kernels)
        for a, b in zip(evs, evs[1:]):
            assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=1e-3)
    ordered = [by_call[c] for c in sorted(by_call)]
    for a, b in zip(ordered, ordered[1:]):                # and the calls never overlap
        assert b[0]["ts"] >= a[-1]["ts"] + a[-1]["dur"] - 1e-3
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    assert {e["name"] for e in meta} == {"process_name", "thread_name"}


def test_summary_text_and_notebook_views(softmax_and_sum, capsys):
    f, x, kernels = softmax_and_sum
    with ts.profiler() as prof:
        for _ in range(3):
            f(x)
    text = prof.summary()
    assert capsys.readouterr().out.strip() == text.strip()
    for k in kernels:
        assert k.name in text and k.strategy in text
    assert "@<lambda> [f32[64,300]]" in text and "GFLOP/s" in text and "% peak" in text
    assert str(prof) == text
    printed = []

    class Printer:
        def text(self, s):
            printed.append(s)

    prof._repr_pretty_(Printer(), False)
    assert printed == [text]
    page = prof._repr_html_()
    assert page == prof._repr_html_()                     # stable: no ids, no addresses
    assert page.startswith("<table") and page.endswith("</table>")
    assert " id=" not in page and "0x" not in page
    assert "@&lt;lambda&gt;" in page
    assert all(k.name in page for k in kernels)


def test_an_empty_profile_needs_no_probe(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the probe ran")

    monkeypatch.setattr(profiler_mod, "machine_peaks", boom)
    with ts.profiler() as prof:
        pass
    assert prof.rows() == [] and "0 kernel launches" in prof.summary(print_it=False)
    assert "<table" in prof._repr_html_()


def test_to_pandas(softmax_and_sum):
    pd = pytest.importorskip("pandas", reason="pandas is an optional dependency")
    f, x, kernels = softmax_and_sum
    with ts.profiler() as prof:
        f(x)
        f(x)
    df = prof.to_pandas()
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == list(profiler_mod.COLUMNS)
    assert list(df["kernel"]) == [k.name for k in kernels] and list(df["calls"]) == [2] * len(kernels)
    raw = prof.to_pandas(launches=True)
    assert len(raw) == 2 * len(kernels) and (raw["ms"] > 0).all()


def test_to_pandas_without_pandas_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)      # makes `import pandas` fail
    with pytest.raises(ts.BackendUnavailableError, match="pandas"):
        ts.profiler().to_pandas()


def test_public_names():
    assert ts.profiler is profiler_mod.profiler and ts.machine_peaks is probe.machine_peaks
    assert "profiler" in ts.__all__ and "machine_peaks" in ts.__all__


# ---- the machine probe ---------------------------------------------------------------------------
def test_machine_peaks_measures_this_machine():
    peaks = ts.machine_peaks()                            # the real probe (or its cached result)
    assert peaks["fma_gflops"] > 0 and peaks["copy_gbs"] > 0 and peaks["threads"] >= 1
    # float64 chains: half the lanes a vector, as many vectors: about half float32's rate
    if peaks["settled"]:
        assert 0.25 * peaks["fma_gflops"] < peaks["fma64_gflops"] < 0.9 * peaks["fma_gflops"]
    assert peaks["cpu"] == toolchain.cpu_fingerprint()
    assert peaks["key"].endswith(f"-{peaks['threads']}t")
    if peaks["settled"]:
        path = probe.peaks_path(peaks["key"])
        assert json.loads(path.read_text()) == peaks


@pytest.fixture
def fake_probe(monkeypatch, tmp_path):
    """A private cache directory and a counted, instant stand-in for the measurement."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TESSERA_NO_CACHE", raising=False)
    monkeypatch.setattr(probe, "_memo", {})
    monkeypatch.setattr(probe, "_warned", set())
    runs = []

    def measure(lib=None):
        runs.append(1)
        return {"fma_gflops": 100.0 + len(runs), "fma64_gflops": 50.0 + len(runs),
                "copy_gbs": 10.0 + len(runs), "settled": True}

    monkeypatch.setattr(probe, "measure", measure)
    return runs


def test_machine_peaks_are_measured_once_and_cached(fake_probe):
    first = ts.machine_peaks()
    assert len(fake_probe) == 1 and first["fma_gflops"] == 101.0 and first["copy_gbs"] == 11.0
    path = probe.peaks_path(first["key"])
    assert json.loads(path.read_text()) == first
    assert ts.machine_peaks() == first and len(fake_probe) == 1      # from the file
    data = json.loads(path.read_text())
    data["fma_gflops"] = 123.5                            # the file is what is read
    path.write_text(json.dumps(data))
    assert ts.machine_peaks()["fma_gflops"] == 123.5 and len(fake_probe) == 1
    again = ts.machine_peaks(refresh=True)
    assert len(fake_probe) == 2 and again["fma_gflops"] == 102.0
    assert json.loads(path.read_text()) == again
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".tmp")] == []


@pytest.mark.parametrize("damage", ["{not json", "", "[]", '{"fma_gflops": -1}', "null"])
def test_a_damaged_peaks_file_is_measured_again(fake_probe, damage):
    first = ts.machine_peaks()
    path = probe.peaks_path(first["key"])
    path.write_text(damage)
    with pytest.warns(RuntimeWarning, match="damaged machine-peaks cache entry"):
        again = ts.machine_peaks()
    assert len(fake_probe) == 2 and again["fma_gflops"] == 102.0
    assert json.loads(path.read_text()) == again          # and rewritten whole


def test_a_result_for_other_hardware_is_not_used(fake_probe):
    first = ts.machine_peaks()
    path = probe.peaks_path(first["key"])
    data = dict(first, key="0123456789abcdef-2t")
    path.write_text(json.dumps(data))
    with pytest.warns(RuntimeWarning):
        assert ts.machine_peaks()["fma_gflops"] == 102.0


def test_an_unsettled_measurement_is_not_cached(fake_probe, monkeypatch):
    monkeypatch.setattr(probe, "measure", lambda lib=None: {
        "fma_gflops": fake_probe.append(1) or 5.0, "fma64_gflops": 2.5, "copy_gbs": 1.0,
        "settled": False})
    with pytest.warns(RuntimeWarning, match="busy"):
        peaks = ts.machine_peaks()
    assert peaks["settled"] is False and not probe.peaks_path(peaks["key"]).exists()


def test_no_cache_measures_once_per_process(fake_probe, monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    first = ts.machine_peaks()
    assert ts.machine_peaks() == first and len(fake_probe) == 1
    assert not (tmp_path / "machine").exists()
    assert ts.machine_peaks(refresh=True)["fma_gflops"] == 102.0
