"""Regressions from a review of 16-bit floats and the GPU lowering: float64 -> float16 rounds
once (as NumPy does), a 16-bit value that lives only inside a kernel still gets its conversions,
concat copies 16-bit bits (NaN payloads included), and a 16-bit GEMM or attention whose scratch
memory cannot be had never aborts the user's process."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tessera as ts
from tessera import op

from conftest import attention_reference, round_to_narrow_bits

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes (the bf16 extra)")
BF16 = np.dtype(ml_dtypes.bfloat16)


def emulated(f, arrays, target):
    if shutil.which(os.environ.get("CXX") or "g++") is None:
        pytest.skip("the CUDA emulator needs a C++20 compiler (g++)")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
    from gpu_emulator import run_program
    return run_program(f.lower(*arrays, target=target), *arrays)


def run_on(target, f, *arrays):
    return [f(*arrays)] if target == "cpu" else emulated(f, arrays, target)


def assert_same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def double_rounding_cases(rng, half):
    """Doubles just off a tie of the narrow type (which float32 rounds onto the tie), random
    doubles, and edges (around the overflow threshold, subnormals, signed zero, inf)."""
    bits_type = np.uint16 if half.itemsize == 2 else np.uint8
    top = np.array(ts.dtypes.get(half.name).max_finite, np.float32).astype(half).view(bits_type)
    bits = np.arange(1, int(top), max(1, int(top) // 300), dtype=bits_type)
    grid, nxt = (b.view(half).astype(np.float64) for b in (bits, bits + 1))
    mid = (grid + nxt) / 2
    largest, below = (float(b.view(half).astype(np.float64)) for b in (top, top - 1))
    over = largest + (largest - below) / 2            # the tie between it and overflow
    off = np.concatenate([mid + mid * 2.0 ** -40, mid - mid * 2.0 ** -40])
    edges = [over, over * (1 - 2.0 ** -40), over * (1 + 2.0 ** -40), 1e300, -1e300,
             float(grid[0]) / 2, float(grid[0]) / 2 * (1 + 2.0 ** -40), 5e-324, -0.0,
             np.inf, -np.inf]
    return np.concatenate([off, -off, rng.standard_normal(500) * 100, edges])


NARROW = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


def assert_bits_are(got, fmt, want_bits):
    """got (an array of the narrow format) has the bits want_bits; a NaN only has to be NaN."""
    got = np.asarray(got)
    assert got.dtype == np.dtype(ts.dtypes.get(fmt).np)
    nan = np.isnan(got.astype(np.float32))
    np.testing.assert_array_equal(nan, np.isnan(want_bits.view(got.dtype).astype(np.float32)))
    np.testing.assert_array_equal(got.view(want_bits.dtype)[~nan], want_bits[~nan])


@pytest.mark.parametrize("target", ["cpu", "cuda", "hip"])
def test_float64_to_narrow_floats_rounds_once(target, rng):
    """float64 -> float16, bfloat16 and both fp8 formats: the double rounded once to nearest
    even (through float32 it would round twice: a double just off a tie lands on the tie, then
    on the even neighbour). The expected bits come from exact rational arithmetic
    (conftest.round_to_narrow_bits), not from the installed NumPy or ml_dtypes."""
    for fmt in NARROW:
        half = np.dtype(ts.dtypes.get(fmt).np)
        x = double_rounding_cases(rng, half)
        f = ts.function(lambda a: op.cast(a, dtype=fmt))
        want = round_to_narrow_bits(x, fmt)
        assert_bits_are(run_on(target, f, x)[0], fmt, want)
        assert_bits_are(ts.interpret(f, x), fmt, want)       # the reference agrees
    assert np.float16(1 + 2.0 ** -11 + 2.0 ** -40) != np.float16(np.float32(1 + 2.0 ** -11))


@pytest.mark.parametrize("target", ["cpu", "cuda", "hip"])
def test_wide_integers_to_bfloat16_round_once(target, rng):
    """int32 and int64 -> bfloat16 round the integer once (float32 holds 24 bits: through it an
    integer just off a bfloat16 tie would round twice); int64s of 2^53 and more too, whose
    low bits float64 would round away first."""
    for d in (np.int32, np.int64):
        info = np.iinfo(d)
        tie = np.array([2 ** 31 + 3 * 2 ** 23, 2 ** 30 + 3 * 2 ** 22, 2 ** 27 + 3 * 2 ** 19],
                       np.int64)
        near = np.concatenate([tie - 1, tie + 1, -(tie - 1), tie])
        if d is np.int64:
            big = np.array([2 ** 62 + 2 ** 54, 2 ** 60 + 2 ** 52, 2 ** 55 + 2 ** 47], np.int64)
            near = np.concatenate([near, big - 1, big + 1, -(big - 1), [info.min, info.max]])
        x = np.concatenate([near[(near >= info.min) & (near <= info.max)],
                            rng.integers(info.min, info.max, 300, dtype=d, endpoint=True)]
                           ).astype(d)
        f = ts.function(lambda a: op.cast(a, dtype="bfloat16"))
        want = round_to_narrow_bits(x, "bfloat16")
        assert_bits_are(run_on(target, f, x)[0], "bfloat16", want)
        assert_bits_are(ts.interpret(f, x), "bfloat16", want)


@pytest.mark.parametrize("target", ["cpu", "cuda", "hip"])
def test_16_bit_value_only_inside_a_kernel(target, rng):
    """No 16-bit parameter, yet the fused kernel rounds through 16 bits: the conversions must
    be emitted (they were only when a parameter was 16-bit: an unresolved symbol)."""
    x = rng.standard_normal((3, 50)) * 3
    for half in (np.dtype(np.float16), BF16):
        f = ts.function(lambda a: op.cast(op.cast(a, dtype=half.name), dtype="float32") * 2)
        # x is float64: the cast rounds once, as NumPy's does (not through float32, whose
        # rounding may land on a 16-bit tie: seed 2587266948)
        want = round_to_narrow_bits(x, half.name).view(half).astype(np.float32) * 2
        np.testing.assert_array_equal(run_on(target, f, x)[0], want)
        g = ts.function(lambda a: op.cast(op.sum(op.cast(a, dtype=half.name), axis=-1),
                                          dtype="float64"))
        x32 = x.astype(np.float32)
        want = x32.astype(half).astype(np.float32).sum(-1).astype(half).astype(np.float64)
        # (a sum of 50 signed terms may cancel to near 0: an absolute floor for the float32
        # rounding that differs with the order of the sum)
        np.testing.assert_allclose(run_on(target, g, x32)[0], want, rtol=2 ** -7, atol=1e-4)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_concat_copies_16_bit_bits(target, rng):
    """concat is a copy: signalling NaN payloads and signed zeros keep their bits (as a
    transpose's and a take's already did), instead of being quieted through float32."""
    for half in (np.dtype(np.float16), BF16):
        special = np.array([0x7c01, 0xfd55, 0x7f81, 0xff80, 0x8000, 0x0001], np.uint16)
        bits = np.concatenate([special, rng.integers(0, 1 << 16, 18).astype(np.uint16)])
        a = bits.view(half).reshape(4, 6)
        f = ts.function(lambda x, y: op.concat([x, y], axis=1))
        assert_same_bits(run_on(target, f, a, a[::-1].copy())[0],
                         np.concatenate([a, a[::-1]], axis=1))


NO_SCRATCH = textwrap.dedent("""\
    import resource, sys
    import numpy as np
    import tessera as ts
    from tessera import op
    from tessera.errors import TesseraError
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (4, 1 << 22)).astype(np.float16)
    b = rng.uniform(-1, 1, (1 << 22, 4)).astype(np.float16)
    q = rng.standard_normal((1, 4, 32)).astype(np.float16)
    k, v = (rng.standard_normal((1, 1 << 18, 32)).astype(np.float16) for _ in range(2))
    mm = ts.function(lambda x, y: x @ y)
    at = ts.function(lambda x, y, z: op.attention(x, y, z))
    first = mm(a, b)                     # compiled and run with memory to spare
    at(q, k, v)
    used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (used + (48 << 20), resource.RLIM_INFINITY))
    again = mm(a, b)                     # 128 MiB of f32 scratch is out of reach now
    assert np.array_equal(first.view(np.uint16), again.view(np.uint16)), (first, again)
    try:
        at(q, k, v)                      # 64 MiB of scratch: reported, not abort()
    except TesseraError as e:
        print("attention:", type(e).__name__)
    else:
        print("attention: ran")
    print("done")
    """)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
def test_16_bit_routines_without_scratch_memory_never_abort(tmp_path):
    """The CPU's 16-bit GEMM and attention malloc float32 scratch; when malloc fails they used
    to abort() the user's process. Now the GEMM computes the same chains without scratch (the
    same bits) and attention makes its kernel report a ResourceError."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TESSERA_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", NO_SCRATCH], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "attention: ResourceError" in r.stdout and "done" in r.stdout, r.stdout


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("dtypes", [("float16", "float32"), ("float32", "float64"),
                                    ("bfloat16", "float16")])
def test_attention_mask_of_another_dtype_is_cast_to_qs(target, dtypes, rng):
    """The attention routines read q, k, v and the mask as one dtype: a float32 mask for float16
    q was read as 16-bit bits on the CPU (a silently wrong result) and did not compile for CUDA.
    Now the operator casts the mask to q's dtype first: the same bits as a mask given in q's
    dtype (0 and -inf are exact in every dtype), and the float64 answer."""
    qd, md = (np.dtype(BF16 if n == "bfloat16" else n) for n in dtypes)
    q, k, v = (rng.standard_normal((1, 6, 8)).astype(qd) for _ in range(3))
    mask = np.where(rng.random((6, 6)) < 0.3, -np.inf, 0).astype(np.float32)
    f = ts.function(lambda q, k, v, m: op.attention(q, k, v, mask=m))
    mixed = run_on(target, f, q, k, v, mask.astype(md))[0]
    same = run_on(target, f, q, k, v, mask.astype(qd))[0]
    assert mixed.dtype == qd and mixed.tobytes() == same.tobytes()
    want = attention_reference(q, k, v, mask)       # a row with every key masked: 0
    np.testing.assert_allclose(same.astype(np.float64), want,
                               atol=2e-2 if qd.itemsize == 2 else 1e-5)
