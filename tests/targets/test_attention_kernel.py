"""The CPU attention routine (tessera/compiler/target/c_attention.py) on its own: compiled with our
CFLAGS into a test library with its OpenMP driver, called through ctypes, checked against a
float64 NumPy reference; bitwise reproducibility over partitions, threads and ISA paths."""
import ctypes
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tessera.compiler.strategies.routines import c_attention as A
from tessera.compiler.spelling import libm
from tessera.runtime import isa
from tessera.runtime.toolchain import find_compiler, flags

from conftest import attention_reference as reference

PRELUDE = """\
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifndef TS_INLINE
#define TS_INLINE static inline
#endif
"""


def _source():
    parts = [PRELUDE, *libm.F32["exp"], *libm.F64["exp"]]   # the routine needs ts_exp{f,}
    for dt in ("f32", "f64"):
        parts += [A.attention_source(dt), A.driver_source(dt)]
    return "\n".join(parts)


def _compile(tmp, name, source, extra=(), level=None):
    """Built with tessera's flags for ISA `level` (default: this machine's level, the one
    tessera compiles for)."""
    c = tmp / f"{name}.c"
    so = tmp / f"{name}.so"
    c.write_text(source)
    cc = find_compiler()
    r = subprocess.run([cc, *flags(cc, level or isa.host_level()), *extra, str(c), "-o", str(so),
                        "-lm"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return ctypes.CDLL(str(so))


@pytest.fixture(scope="module")
def tmpdir_mod(tmp_path_factory):
    return tmp_path_factory.mktemp("attention_kernel")


@pytest.fixture(scope="module")
def lib(tmpdir_mod):
    return _compile(tmpdir_mod, "attn", _source())


@pytest.fixture(scope="module")
def lib_portable(tmpdir_mod):
    return _compile(tmpdir_mod, "attn_portable", _source(), ["-DTS_ATTENTION_PORTABLE"])


@pytest.fixture(scope="module")
def lib_avx2(tmpdir_mod):
    if not isa.runs_here("x86-64-v3"):
        pytest.skip("the AVX2 path (x86-64-v3) needs a CPU with AVX2 and FMA")
    return _compile(tmpdir_mod, "attn_avx2", _source(), level="x86-64-v3")


_P, _I = ctypes.c_void_p, ctypes.c_int64


def _ctype(dtype):
    return ctypes.c_float if dtype == np.float32 else ctypes.c_double


def _short(dtype):
    return "f32" if dtype == np.float32 else "f64"


def _strides(a):
    assert a.strides[-1] == a.itemsize or a.shape[-1] <= 1 or a.size == 0, \
        "the last axis must be contiguous"
    return np.array([s // a.itemsize for s in a.strides], dtype=np.int64)


def attend(lib, q, k, v, mask=None, causal=False, scale=None, block_q=None, nthreads=0, out=None):
    """q [B, H, Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv] (any strides, last axis contiguous);
    mask broadcastable to [B, H, Sq, Sk] (broadcast axes get stride 0). O is poisoned with NaN."""
    dt = q.dtype
    B, H, Sq, D = q.shape
    Sk, Dv = k.shape[2], v.shape[3]
    o = np.full((B, H, Sq, Dv), np.nan, dt) if out is None else out
    o.fill(np.nan)
    scale = 1 / np.sqrt(D) if scale is None else scale
    if mask is not None:
        mask = np.broadcast_to(np.asarray(mask, dt), (B, H, Sq, Sk))
        ms = np.array([s // mask.itemsize for s in mask.strides], dtype=np.int64)
        mp = mask.ctypes.data
    else:
        ms, mp = np.zeros(4, np.int64), None
    qs, ks, vs, os_ = (_strides(a) for a in (q, k, v, o))
    f = getattr(lib, f"tsa_run_{_short(dt)}")
    f.argtypes = [_P] * 10 + [_I] * 6 + [_ctype(dt), ctypes.c_int, _I, _I, ctypes.c_int]
    f.restype = None
    f(q.ctypes.data, qs.ctypes.data, k.ctypes.data, ks.ctypes.data, v.ctypes.data, vs.ctypes.data,
      mp, ms.ctypes.data, o.ctypes.data, os_.ctypes.data, B, H, Sq, Sk, D, Dv, scale, int(causal),
      Sk - Sq, block_q or A.DEFAULT_BLOCKS["block_q"], nthreads)
    return o


def attend_rows(lib, q, k, v, o, q0, nq, mask=None, causal=False, scale=None):
    """One routine call for rows q0 .. q0+nq of a single head: q [Sq, D], k, v, o 2-D."""
    dt = q.dtype
    Sq, D = q.shape
    Sk, Dv = k.shape[0], v.shape[1]
    scale = 1 / np.sqrt(D) if scale is None else scale
    if mask is not None:
        mask = np.broadcast_to(np.asarray(mask, dt), (Sq, Sk))
        mp = mask.ctypes.data
        mrs, mcs = mask.strides[0] // dt.itemsize, mask.strides[1] // dt.itemsize
    else:
        mp, mrs, mcs = None, 0, 0
    f = getattr(lib, f"tsa_block_{_short(dt)}")
    f.argtypes = [_P, _I, _P, _I, _P, _I, _P, _I, _I, _P, _I, _I, _I, _I, _I, _I, _ctype(dt),
                  ctypes.c_int, _I]
    f.restype = None
    st = lambda a: a.strides[0] // a.itemsize  # noqa: E731
    f(q.ctypes.data, st(q), k.ctypes.data, st(k), v.ctypes.data, st(v), mp, mrs, mcs,
      o.ctypes.data, st(o), q0, nq, Sk, D, Dv, scale, int(causal), Sk - Sq)


def check(got, want, v):
    """float32: within 2e-5 * max|v| (about 150 ulp of the output scale; observed errors are a
    few 1e-7 on unit-normal data); float64: within 1e-12 * max|v|."""
    assert not np.isnan(got).any(), "unwritten (NaN-poisoned) or NaN output"
    vmax = float(np.abs(v).max()) if v.size else 1.0
    tol = (2e-5 if got.dtype == np.float32 else 1e-12) * max(vmax, 1.0)
    err = np.abs(got.astype(np.float64) - want)
    assert err.max(initial=0) <= tol, f"max error {err.max()} > {tol}"


def qkv(rng, b, h, sq, sk, d, dv, dtype=np.float32):
    return (rng.standard_normal((b, h, sq, d)).astype(dtype),
            rng.standard_normal((b, h, sk, d)).astype(dtype),
            rng.standard_normal((b, h, sk, dv)).astype(dtype))


SHAPES = [  # (B, H, Sq, Sk, D, Dv)
    (1, 1, 1, 1, 1, 1),
    (1, 2, 1, 37, 64, 64),
    (2, 1, 37, 1, 16, 8),
    (1, 2, 13, 29, 63, 80),
    (2, 3, 67, 67, 64, 64),
    (1, 2, 130, 61, 80, 17),
    (1, 1, 61, 130, 63, 1),
    (1, 2, 200, 257, 64, 64),
    (2, 1, 5, 300, 8, 3),
    (1, 1, 97, 389, 1, 80),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_matches_float64_reference(lib, rng, shape, causal, dtype):
    B, H, Sq, Sk, D, Dv = shape
    q, k, v = qkv(rng, B, H, Sq, Sk, D, Dv, dtype)
    got = attend(lib, q, k, v, causal=causal)
    check(got, reference(q, k, v, causal=causal), v)


@pytest.mark.parametrize("D", [128, 200, 300])
def test_head_dimension_wider_than_a_packed_slice(lib, rng, D):
    # D > 128 takes the query-slice path (the scores accumulate over several packed slices)
    q, k, v = qkv(rng, 1, 2, 70, 90, D, 40)
    for causal in (False, True):
        check(attend(lib, q, k, v, causal=causal), reference(q, k, v, causal=causal), v)


def test_large_scores_and_a_rising_maximum(lib, rng):
    # near one-hot softmax, and a max that keeps moving block after block (rescaling exercised)
    q, k, v = qkv(rng, 1, 2, 40, 700, 32, 32)
    k = (k + np.linspace(0, 6, 700, dtype=np.float32)[None, None, :, None]).astype(np.float32)
    for scale in (1.0, 0.05):
        for causal in (False, True):
            check(attend(lib, q, k, v, causal=causal, scale=scale),
                  reference(q, k, v, causal=causal, scale=scale), v)


@pytest.mark.parametrize("kind", ["full", "keys", "queries", "transposed", "scalar", "per_head"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_additive_mask_with_broadcast_strides(lib, rng, kind, causal, dtype):
    B, H, Sq, Sk, D, Dv = 2, 3, 45, 150, 24, 20
    q, k, v = qkv(rng, B, H, Sq, Sk, D, Dv, dtype)
    if kind == "full":            # [B, H, Sq, Sk], m_cs = 1
        mask = rng.standard_normal((B, H, Sq, Sk)).astype(dtype)
    elif kind == "keys":          # key padding, broadcast over heads and queries: m_rs = 0
        mask = np.where(rng.random((B, 1, 1, Sk)) < 0.3, -np.inf, 0).astype(dtype)
    elif kind == "queries":       # a per-query bias (some queries dead): m_cs = 0
        mask = rng.standard_normal((1, 1, Sq, 1)).astype(dtype)
        mask[0, 0, [3, 17, 44]] = -np.inf
    elif kind == "transposed":    # a [Sk, Sq] array read transposed: m_rs = 1, m_cs = Sq
        mask = rng.standard_normal((Sk, Sq)).astype(dtype).T
    elif kind == "scalar":        # m_rs = m_cs = 0 (softmax-invariant: checks the addressing)
        mask = np.full((1, 1, 1, 1), 0.75, dtype)
    else:                         # per head [H, Sq, Sk] with -inf sprinkled
        mask = rng.standard_normal((H, Sq, Sk)).astype(dtype)
        mask[rng.random((H, Sq, Sk)) < 0.2] = -np.inf
    got = attend(lib, q, k, v, mask=mask, causal=causal)
    check(got, reference(q, k, v, mask=mask, causal=causal), v)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_fully_masked_rows_are_zero(lib, rng, dtype):
    B, H, Sq, Sk, D, Dv = 1, 2, 50, 140, 16, 24
    q, k, v = qkv(rng, B, H, Sq, Sk, D, Dv, dtype)
    mask = np.zeros((Sq, Sk), dtype)
    dead = [0, 7, 31, 49]
    mask[dead] = -np.inf                   # every key masked for these queries
    mask[10, :130] = -np.inf               # only the last block's keys visible
    mask[11, 3] = 0                        # only one key visible
    mask[11, :3] = mask[11, 4:] = -np.inf
    for causal in (False, True):
        got = attend(lib, q, k, v, mask=mask, causal=causal)
        assert (got[:, :, dead] == 0).all()
        check(got, reference(q, k, v, mask=mask, causal=causal), v)
    # causal with Sq > Sk (bottom-right): the first Sq - Sk queries see no key
    q2, k2, v2 = qkv(rng, 1, 2, 90, 30, 16, 8, dtype)
    got = attend(lib, q2, k2, v2, causal=True)
    assert (got[:, :, :60] == 0).all() and not np.isnan(got).any()
    check(got, reference(q2, k2, v2, causal=True), v2)
    # no keys at all
    q3 = rng.standard_normal((1, 1, 5, 8)).astype(dtype)
    got = attend(lib, q3, np.zeros((1, 1, 0, 8), dtype), np.zeros((1, 1, 0, 4), dtype))
    assert (got == 0).all()


def test_causal_matches_numpy_tril_convention(lib, rng):
    # key j is visible to query i iff np.tril(ones((Sq, Sk)), k=Sk-Sq)[i, j]
    for sq, sk in [(7, 7), (5, 12), (12, 5), (1, 9), (130, 131)]:
        q, k, v = qkv(rng, 1, 1, sq, sk, 8, 4)
        tril = np.tril(np.ones((sq, sk)), k=sk - sq)
        mask = np.where(tril > 0, 0, -np.inf).astype(np.float32)
        causal = attend(lib, q, k, v, causal=True)
        masked = attend(lib, q, k, v, mask=mask)
        check(causal, reference(q, k, v, mask=mask), v)
        np.testing.assert_array_equal(causal, masked)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bshd_layout_read_in_place(lib, rng, causal):
    # [B, S, H, D] tensors, viewed as [B, H, S, D]: row stride H * D, no copies; O likewise
    B, Sq, Sk, H, D, Dv = 2, 70, 93, 3, 40, 24
    q = rng.standard_normal((B, Sq, H, D)).astype(np.float32)
    k = rng.standard_normal((B, Sk, H, D)).astype(np.float32)
    v = rng.standard_normal((B, Sk, H, Dv)).astype(np.float32)
    o = np.full((B, Sq, H, Dv), np.nan, np.float32)
    qv, kv, vv, ov = (a.transpose(0, 2, 1, 3) for a in (q, k, v, o))
    attend(lib, qv, kv, vv, causal=causal, out=ov)
    check(ov, reference(qv, kv, vv, causal=causal), v)
    contiguous = attend(lib, *(np.ascontiguousarray(a) for a in (qv, kv, vv)), causal=causal)
    np.testing.assert_array_equal(ov, contiguous)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_row_independent_of_partition_bitwise(lib, rng, dtype, masked):
    Sq, Sk, D, Dv = 300, 333, 48, 70
    q, k, v = (a[0, 0] for a in qkv(rng, 1, 1, Sq, Sk, D, Dv, dtype))
    mask = None
    if masked:
        mask = rng.standard_normal((Sq, Sk)).astype(dtype)
        mask[rng.random((Sq, Sk)) < 0.1] = -np.inf
    for causal in (False, True):
        ref = np.full((Sq, Dv), np.nan, dtype)
        attend_rows(lib, q, k, v, ref, 0, Sq, mask=mask, causal=causal)
        for cuts in ([0, 1, 2, 65, 66, 190, 300], [0, 7, 100, 101, 299, 300],
                     sorted({0, Sq, *rng.integers(1, Sq, 12).tolist()})):
            o = np.full((Sq, Dv), np.nan, dtype)
            for a, b in zip(cuts[:-1], cuts[1:]):
                attend_rows(lib, q, k, v, o, a, b - a, mask=mask, causal=causal)
            np.testing.assert_array_equal(o, ref)
        # and through the driver with other query blocks
        for bq in (1, 13, 64, 128, 1000):
            o = attend(lib, q[None, None], k[None, None], v[None, None],
                       mask=None if mask is None else mask, causal=causal, block_q=bq)[0, 0]
            np.testing.assert_array_equal(o, ref)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_one_and_two_threads_bitwise_equal(lib, rng, causal):
    q, k, v = qkv(rng, 2, 4, 200, 230, 64, 64)
    mask = rng.standard_normal((1, 4, 200, 230)).astype(np.float32)
    one = attend(lib, q, k, v, mask=mask, causal=causal, nthreads=1)
    two = attend(lib, q, k, v, mask=mask, causal=causal, nthreads=2)
    again = attend(lib, q, k, v, mask=mask, causal=causal, nthreads=2, block_q=17)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one, again)


@pytest.mark.parametrize("path", ["portable", "avx2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_isa_paths_bitwise_equal(request, lib, rng, dtype, path):
    # the native path (AVX-512 here), the AVX2+FMA path and the portable loops do the same
    # operations in the same order
    other = request.getfixturevalue(f"lib_{path}")
    for shape in [(1, 2, 67, 130, 64, 64), (1, 1, 13, 29, 63, 80), (1, 1, 40, 50, 200, 17),
                  (1, 1, 5, 9, 3, 1)]:
        q, k, v = qkv(rng, *shape, dtype)
        mask = rng.standard_normal(shape[2:4]).astype(dtype)
        for causal in (False, True):
            a = attend(lib, q, k, v, mask=mask, causal=causal)
            b = attend(other, q, k, v, mask=mask, causal=causal)
            check(b, reference(q, k, v, mask=mask, causal=causal), v)
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("block_q,block_k", [(1, 1), (16, 16), (5, 33), (100, 7), (256, 256)])
def test_other_block_sizes(tmpdir_mod, rng, block_q, block_k):
    src = "\n".join([PRELUDE, *libm.F32["exp"], A.attention_source("f32", block_q, block_k),
                     A.driver_source("f32")])
    lib = _compile(tmpdir_mod, f"attn_{block_q}_{block_k}", src)
    q, k, v = qkv(rng, 1, 2, 70, 83, 20, 36)
    mask = rng.standard_normal((70, 83)).astype(np.float32)
    for causal in (False, True):
        got = attend(lib, q, k, v, mask=mask, causal=causal, block_q=block_q)
        check(got, reference(q, k, v, mask=mask, causal=causal), v)
        np.testing.assert_array_equal(got, attend(lib, q, k, v, mask=mask, causal=causal,
                                                  block_q=block_q + 3))


def test_source_contract():
    src = A.attention_source("f32")
    assert "static void ts_attention_block_f32(" in src
    assert "ts_expf(" in src and not re.search(r"\bfloat\s+ts_expf\s*\(\s*float[^;]*\{", src)
    assert "malloc" not in src and "omp parallel" not in src
    assert "ts_attention_block_f64(" in A.attention_source("f64")
    assert set(A.DEFAULT_BLOCKS) == {"block_q", "block_k"}
    with pytest.raises(ValueError):
        A.attention_source("f16")
    with pytest.raises(ValueError):
        A.attention_source("f32", block_k=0)
    with pytest.raises(ValueError):                 # too much stack
        A.attention_source("f64", block_q=4096, block_k=4096)
    # both dtypes (and the driver) fit in one translation unit: checked by the `lib` fixture


def test_compiles_without_avx512(tmpdir_mod):
    # the portable fallback is what the x86-64-v2 level (no AVX) compiles
    cc = find_compiler()
    r = subprocess.run([cc, *flags(cc, "x86-64-v2"), "-x", "c", "-", "-o",
                        str(tmpdir_mod / "v2.so")],
                       input=_source(), capture_output=True, text=True)
    if r.returncode != 0 and "x86-64-v2" in r.stderr:
        pytest.skip("the compiler does not know -march=x86-64-v2")
    assert r.returncode == 0, r.stderr


def test_omp_num_threads_in_subprocess_bitwise_equal(lib, tmpdir_mod, rng):
    # DESIGN.md's determinism check: the driver's default team, OMP_NUM_THREADS=1 vs 2
    q, k, v = qkv(rng, 2, 3, 150, 170, 32, 48)
    np.savez(tmpdir_mod / "in.npz", q=q, k=k, v=v)
    script = (
        "import os, sys, numpy as np; sys.path[:0] = [sys.argv[1], os.path.dirname(sys.argv[1])];"
        "import ctypes, test_attention_kernel as t;"
        "d = np.load(sys.argv[2]); lib = ctypes.CDLL(sys.argv[3]);"
        "np.save(sys.argv[4], np.stack([t.attend(lib, d['q'], d['k'], d['v'], causal=c)"
        " for c in (False, True)]))")
    outs = []
    for n in (1, 2):
        out = tmpdir_mod / f"out{n}.npy"
        env = dict(os.environ, OMP_NUM_THREADS=str(n))
        r = subprocess.run([sys.executable, "-c", script, os.path.dirname(os.path.abspath(__file__)),
                            str(tmpdir_mod / "in.npz"), str(tmpdir_mod / "attn.so"), str(out)],
                           env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        outs.append(np.load(out))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0][1], attend(lib, q, k, v, causal=True))
