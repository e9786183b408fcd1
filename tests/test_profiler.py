"""The profiler: per-kernel launches, their aggregates, the chrome trace and the machine probe."""
import json
import statistics

import numpy as np
import pytest

import tessera as ts
from tessera import op


def test_profile_records_every_kernel_launch(rng, tmp_path):
    x = rng.standard_normal((64, 300)).astype(np.float32)
    f = ts.function(lambda x: (op.softmax(x), op.sum(op.exp(x), axis=0)))
    f(x)                                                  # compiled outside the profile
    kernels = f.lower(x).schedule_ir.kernels
    with ts.profiler() as prof:
        for _ in range(5):
            f(x)
    f(x)                                                  # not recorded
    assert len(prof.launches) == 5 * len(kernels)
    rows = prof.rows()
    assert [r["kernel"] for r in rows] == [k.name for k in kernels]
    for r, k in zip(rows, kernels):
        times = [x.seconds for x in prof.launches if x.kernel is k]
        assert r["calls"] == 5 and r["median_ms"] == pytest.approx(statistics.median(times) * 1e3)
        assert r["flops"] == k.flops and r["bytes"] == k.bytes and r["median_ms"] > 0
        assert r["gflops"] == pytest.approx(k.flops / statistics.median(times) / 1e9)
    text = prof.summary(print_it=False)
    assert all(k.name in text for k in kernels)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert len(events) == len(prof.launches) and all(e["ph"] == "X" for e in events)
    for a, b in zip(events, events[1:]):                  # one call's kernels run in sequence
        assert b["ts"] >= a["ts"] + a["dur"] - 1e-3


def test_profiles_nest_and_stay_on_their_thread(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    f = ts.function(lambda x: x * 2)
    with ts.profiler() as outer:
        f(x)
        with ts.profiler() as inner:
            f(x)
        f(x)
    assert len(outer.launches) == 2 and len(inner.launches) == 1
    assert ts.runtime.profiler.current() is None


def test_to_pandas(rng):
    pd = pytest.importorskip("pandas", reason="pandas is an optional dependency")
    f = ts.function(lambda x: op.relu(x))
    with ts.profiler() as prof:
        f(rng.standard_normal(10).astype(np.float32))
    df = prof.to_pandas()
    assert isinstance(df, pd.DataFrame) and list(df["kernel"]) == ["k0_relu"]


def test_machine_peaks_are_measured_once_and_remeasured_when_damaged():
    from tessera.runtime import cache
    first = ts.machine_peaks()
    assert first["fma_gflops"] > 1 and first["copy_gbs"] > 0.1 and first["threads"] >= 1
    path = cache.cache_dir() / "machine" / f"{first['key']}.json"
    assert json.loads(path.read_text()) == first
    assert ts.machine_peaks() == first                    # from the file
    path.write_text("{not json")
    again = ts.machine_peaks()
    assert again["fma_gflops"] > 1 and json.loads(path.read_text()) == again
