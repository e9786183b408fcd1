"""`make sweep`: run tests again and again, each run on fresh random inputs (the `rng` fixture
draws a new seed per test and run), and list every test that failed with the seeds that replay
it (`TESSERA_TEST_SEED=<seed> pytest <test id>`). A bound a test sets on random data can sit a
percent of seeds from failing; one CI run rarely shows it, a sweep of a few hundred does.

    python tests/sweep.py --runs 50 tests/frontend/prob tests/ops/test_random.py [-- -n 2]
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET


def test_id(classname: str, name: str) -> str:
    """pytest's id of a JUnit report's test case: its module's file, class, name."""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        if os.path.exists(os.path.join(*parts[:i]) + ".py"):
            return "::".join(["/".join(parts[:i]) + ".py", *parts[i:], name])
    return f"{classname}::{name}"


def sweep(paths: list, runs: int, extra: list) -> tuple[dict, int]:
    """{test id: [seed of each failing run ("?" where the test drew none)]} and the number of
    test runs, over `runs` pytest processes on `paths`."""
    failed, total = collections.defaultdict(list), 0
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "run.xml")
        for run in range(runs):
            if os.path.exists(report):
                os.remove(report)
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "-o", "junit_logging=system-out", f"--junitxml={report}",
                                *extra, *paths], capture_output=True, text=True)
            if not os.path.exists(report):          # pytest stopped before running anything
                sys.exit(f"pytest ran nothing (exit {r.returncode}):\n{r.stdout[-3000:]}")
            for case in ET.parse(report).iter("testcase"):
                if case.find("skipped") is not None:
                    continue
                total += 1
                if case.find("failure") is None and case.find("error") is None:
                    continue
                seed = re.search(r"rng seed (\d+)", case.findtext("system-out") or "")
                failed[test_id(case.get("classname"), case.get("name"))].append(
                    seed[1] if seed else "?")
            tail = r.stdout.strip().splitlines()
            print(f"run {run + 1}/{runs}: {tail[-1] if tail else f'exit {r.returncode}'}",
                  flush=True)
    return failed, total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="pytest runs (default 20)")
    ap.add_argument("paths", nargs="+", help="test files, folders or ids; after --: pytest's")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    failed, total = sweep(args.paths, args.runs, extra)
    print(f"\n{total} test runs, {sum(map(len, failed.values()))} failed")
    for name, seeds in sorted(failed.items(), key=lambda t: -len(t[1])):
        print(f"  {len(seeds)}/{args.runs}  {name}  seeds {' '.join(seeds)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
