"""The random-program fuzzer (fuzzer.py beside this file) as a test: fresh programs every run
(their entropy printed; a failure prints the program and how to replay it), each in a child
process (a crash fails the program that was running, not the suite), checked against float64
NumPy, ts.interpret, a second call, dynamic shapes and finite differences; then the same
programs at one thread, which must give the same bits; and the kept regressions."""
import numpy as np
import pytest

import fuzzer

FRESH = 100         # programs per run (about 20 s); `make fuzz` runs for as long as asked


@pytest.fixture(scope="module")
def fresh():
    entropy = np.random.SeedSequence().entropy
    print(f"fuzz entropy {entropy}")
    seeds = np.random.default_rng(entropy).integers(0, 2 ** 62, FRESH)
    programs = [fuzzer.generate(int(s)) for s in seeds]
    return programs, fuzzer.run_in_child(programs)


def test_fresh_random_programs_agree_with_numpy(fresh):
    _, results = fresh
    failures = [f for _, _, f in results if f]
    assert not failures, "\n\n".join(failures)
    assert len(results) == FRESH


def test_fresh_random_programs_give_the_same_bits_on_one_thread(fresh):
    programs, results = fresh
    one = {s: d for s, d, _ in fuzzer.run_in_child(programs, threads=1)}
    differ = [fuzzer.describe(p) for p, (s, d, _) in zip(programs, results)
              if d is not None and one.get(s) != d]
    assert not differ, "other bits on one thread than on the default threads:\n\n" + \
        "\n\n".join(differ)


def test_kept_regressions_pass():
    programs = fuzzer.regressions()
    if not programs:
        pytest.skip("no regression kept yet")
    failures = [f for _, _, f in fuzzer.run_in_child(programs) if f]
    assert not failures, "\n\n".join(failures)


def test_the_fuzzer_finds_a_wrong_answer(monkeypatch):
    """The checks can fail: a reference tanh one part in a thousand off is caught."""
    monkeypatch.setattr(fuzzer.NumpyK, "tanh", staticmethod(lambda x: np.tanh(x) * 1.001))
    src = ("def prog(x0):\n    v0 = K.start(x0, 'float32')\n    v1 = K.tanh(v0)\n"
           "    return (v1,)\n")
    p = fuzzer.Program(src, [{"shape": [3, 5], "dtype": "float32", "layout": "reversed",
                              "alias": None, "special": False}], "float32", 7, True)
    with pytest.raises(fuzzer.Failure, match="compiled vs float64 NumPy"):
        fuzzer.check(p)
