"""The counter-based generator (op.random_uniform): SplitMix64 bit for bit, compiled == reference,
independent of threads, and uniform enough to trust a dropout mask with."""
import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.errors import DTypeError
from tessera.ops.random import mix64, random_bits

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def py_mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def splitmix64(state, n):
    """The sequential SplitMix64 generator (Vigna's splitmix64.c), in Python integers."""
    out = []
    for _ in range(n):
        state = (state + GAMMA) & M64
        out.append(py_mix(state))
    return out


def test_splitmix_published_vector():
    # the first outputs of splitmix64.c seeded with 1234567, as published with it
    want = [6457827717110365317, 3203168211198807973, 9817491932198370423,
            4593380528125082431, 16408922859458223821]
    assert splitmix64(1234567, 5) == want
    states = np.array([(1234567 + (k + 1) * GAMMA) & M64 for k in range(5)], dtype=np.uint64)
    with np.errstate(over="ignore"):
        assert [int(v) for v in mix64(states)] == want


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**62 + 7, -3])
def test_counter_n_is_the_nth_output_of_the_seeded_sequence(seed):
    n = 300
    want = splitmix64(py_mix(seed & M64), n)
    got = random_bits(np.int64(seed), np.arange(n))
    assert [int(v) for v in got] == want


def test_floats_are_the_top_bits(rng):
    seed = int(rng.integers(0, 2**62))
    bits = [int(b) for b in random_bits(np.int64(seed), np.arange(1000))]
    u32 = op.random_uniform((1000,), seed)
    u64 = op.random_uniform((1000,), seed, dtype="float64")
    assert u32.dtype == np.float32 and u64.dtype == np.float64
    assert u32.tolist() == [(b >> 40) / 2.0**24 for b in bits]
    assert u64.tolist() == [(b >> 11) / 2.0**53 for b in bits]


SHAPES = [(), (1,), (7,), (1, 13), (37, 1, 5), (3, 257), (2, 3, 4, 5)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_equals_reference_bitwise(shape, dtype, rng):
    seed = int(rng.integers(-2**62, 2**62))
    offset = int(rng.integers(0, 1000))
    want = op.random_uniform(shape, seed, offset, dtype=dtype)
    assert want.shape == shape and want.dtype == np.dtype(dtype)
    f = ts.function(lambda s: op.random_uniform(shape, s, offset, dtype=dtype))
    assert f(np.int64(seed)).tobytes() == want.tobytes()          # seed as a tensor
    g = ts.function(lambda x: op.random_uniform(shape, seed, offset, dtype=dtype) + x)
    assert g(np.zeros(shape, dtype)).tobytes() == want.tobytes()  # seed as a constant
    assert ts.interpret(f, np.int64(seed)).tobytes() == want.tobytes()


def test_wide_counters_and_int32_seeds(rng):
    # an offset past 2**31 makes the counters int64; an int32 seed tensor works as well
    off = 2**40 * 3 + 5
    want = op.random_uniform((4, 33), 9, off)
    f = ts.function(lambda s: op.random_uniform((4, 33), s, off))
    assert f(np.int32(9)).tobytes() == want.tobytes()
    bits = random_bits(np.int64(9), off + np.arange(4 * 33))
    assert np.array_equal(want.ravel(), (bits >> np.uint64(40)).astype(np.float32) * 2.0**-24)


def test_offsets_continue_the_stream(rng):
    seed = int(rng.integers(0, 2**31))
    whole = op.random_uniform((100,), seed)
    assert np.array_equal(op.random_uniform((60,), seed, offset=40), whole[40:])
    assert np.array_equal(op.random_uniform((10, 10), seed).ravel(), whole)


def test_seeds_give_different_streams(rng):
    s = int(rng.integers(0, 2**31))
    a, b = op.random_uniform((10000,), s), op.random_uniform((10000,), s + 1)
    assert not np.array_equal(a, b)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.05          # |r| ~ N(0, 0.01) for independent draws


def test_uniform_statistics(rng):
    n = 200_000
    u = op.random_uniform((n,), int(rng.integers(0, 2**62))).astype(np.float64)
    assert u.min() >= 0.0 and u.max() < 1.0
    # mean and variance within 6 standard errors
    assert abs(u.mean() - 0.5) < 6 * np.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 6 * np.sqrt(1 / 180 / n)
    # chi-square over 100 buckets: 99 degrees of freedom, p(> 180) ~ 2e-6
    counts = np.bincount((u * 100).astype(int), minlength=100)
    chi2 = ((counts - n / 100) ** 2 / (n / 100)).sum()
    assert chi2 < 180
    # neighbours are uncorrelated
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 6 / np.sqrt(n)


def test_fuses_into_its_consumer():
    f = ts.function(lambda x, s: op.where(op.random_uniform(x.shape, s) >= 0.25, x / 0.75, 0.0))
    prog = f.lower(np.ones((64, 33), np.float32), np.int64(1))
    assert len(prog.schedule_ir.kernels) == 1


def test_bad_operands():
    with pytest.raises(DTypeError):
        op.random_uniform((3,), 1.5)
    with pytest.raises(DTypeError):
        op.random_uniform((3,), np.float32(1))
    with pytest.raises(DTypeError):
        op.random_uniform((3,), 1, dtype="int32")


PROGRAM = textwrap.dedent("""
    import hashlib, numpy as np, tessera as ts
    from tessera import op
    import tessera.nn as nn
    f = ts.function(lambda s: op.random_uniform((301, 1031), s, 17))
    x = np.random.default_rng(0).standard_normal((256, 1030)).astype(np.float32)
    d = ts.function(lambda x, s: nn.dropout(x, 0.3, s, stream=2))
    print(hashlib.sha256(f(np.int64(SEED)).tobytes()).hexdigest()[:16],
          hashlib.sha256(d(x, np.int64(SEED)).tobytes()).hexdigest()[:16])
""")


def test_same_numbers_for_every_thread_count(rng):
    seed = int(rng.integers(0, 2**62))

    def run(threads):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        out = subprocess.run([sys.executable, "-c", PROGRAM.replace("SEED", str(seed))],
                             env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()
    one, two = run(1), run(2)
    assert len(one) == 2 and one == two
    want = op.random_uniform((301, 1031), seed, 17)
    assert one[0] == hashlib.sha256(want.tobytes()).hexdigest()[:16]
