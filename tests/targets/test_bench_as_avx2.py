"""`python -m benchmarks.bench --as-avx2` measures as an AVX2-only machine would: it starts
again with tessera's x86-64-v3 target and every peer's switch set (NumPy reads its own when
imported, so the process must be a new one), and the results say so."""
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="--as-avx2 names x86-64 levels; this machine is not x86-64")
def test_as_avx2_runs_the_cases_at_x86_64_v3_with_the_peers_held_to_avx2(tmp_path):
    from benchmarks.bench import AS_AVX2
    out = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k not in AS_AVX2}
    r = subprocess.run([sys.executable, "-m", "benchmarks.bench", "--as-avx2", "--quick",
                        "--only", "layernorm_4096", "--repeat", "1", "--tune", "0",
                        "--json", str(out)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["machine"]["isa_level"] == "x86-64-v3"
    assert {k: res["machine"]["env"].get(k) for k in AS_AVX2} == AS_AVX2
    (row,) = res["results"]
    assert row["status"]["tessera"] == "ok"          # checked against the float64 reference
    assert "every peer held to AVX2" in r.stdout
