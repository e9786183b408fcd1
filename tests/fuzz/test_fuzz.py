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


def _program(seed, body):
    src = "def prog(x0):\n" + body + "    v0 = K.start(x0, 'float32')\n    return (v0,)\n"
    return fuzzer.Program(src, [{"shape": [2, 3], "dtype": "float32", "layout": "reversed",
                                 "alias": None, "special": False}], "float32", seed, True)


def test_a_crash_is_blamed_on_the_program_that_dies_alone():
    """A program that kills its process later (as memory it corrupted would, in the next
    program's code) is the failure, not the program that was running: the programs up to it
    run again alone, and the first that dies alone is named (its replay line reproduces it);
    where none dies alone, the seeds to replay in one process are named."""
    later = _program(1, "    __import__('threading').Timer(0.5, lambda: __import__('os').kill(\n"
                        "        __import__('os').getpid(), 11)).start()\n")
    slow = _program(2, "    __import__('time').sleep(2)\n")
    [(seed, digest, failure)] = fuzzer.run_in_child([slow, later, slow])
    assert seed == 1 and digest is None and "running it alone" in failure
    setter = _program(3, "    __import__('builtins')._fuzz_flag = True\n")
    dies_after = _program(4, "    if getattr(__import__('builtins'), '_fuzz_flag', False):\n"
                             "        __import__('os').kill(__import__('os').getpid(), 11)\n")
    [(seed, _, failure)] = fuzzer.run_in_child([setter, dies_after])
    assert seed == 4 and "none of which dies alone" in failure and "--seed 3,4" in failure
