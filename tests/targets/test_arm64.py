"""ARM64 for real: programs lowered for `cpu:armv8-a` on this machine, cross-compiled with Debian's
aarch64-linux-gnu-gcc (tessera's own flags for that level) beside a small C driver, and run under
qemu-aarch64 with OpenMP on two threads. Every strategy and storage dtype is covered; each result
is compared with NumPy (the interpreter) and, bit for bit, with the program this machine runs.

The numerics contract across ISAs holds for tessera's own code (arithmetic, our
transcendentals, every routine). libm's functions (sin, cos, pow, float64 log) are the C
library's, which need not round alike on two architectures: they are checked against NumPy
only."""
import os
import shutil
import subprocess

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.runtime import toolchain
from tessera.runtime.program import results

from conftest import TOL, assert_close

CROSS = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")
SYSROOT = "/usr/aarch64-linux-gnu"
pytestmark = pytest.mark.skipif(
    CROSS is None or QEMU is None or not os.path.isdir(SYSROOT),
    reason="needs Debian's gcc-aarch64-linux-gnu and qemu-user (.ci/run installs them)")

LEVEL = "armv8-a"


def driver_source(prog) -> str:
    """A main() that loads the inputs and constants from files, allocates every other buffer
    poisoned with 0xff bytes (NaN for floats), runs the program's entry point and writes every
    buffer back: the CPU runtime's buffer table, in C."""
    lines = ["#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>",
             "int tessera_entry(void** b);",
             "static void* load(const char* dir, int i, size_t n) {",
             "  char path[4096]; snprintf(path, sizeof path, \"%s/b%d.bin\", dir, i);",
             "  void* p = malloc(n ? n : 1); FILE* f = fopen(path, \"rb\");",
             "  if (!f || fread(p, 1, n, f) != n) { perror(path); exit(2); }",
             "  fclose(f); return p;", "}",
             "int main(int argc, char** argv) {",
             f"  void* b[{max(1, len(prog.tile_ir.buffers))}];"]
    for i, b in enumerate(prog.tile_ir.buffers):
        if b.role in ("input", "const"):
            lines.append(f"  b[{i}] = load(argv[1], {i}, {b.nbytes});")
        else:
            lines.append(f"  b[{i}] = malloc({max(1, b.nbytes)}); memset(b[{i}], 0xff, "
                         f"{b.nbytes});")
    lines += ["  int s = tessera_entry(b);", "  if (s) { printf(\"status %d\\n\", s); return 3; }"]
    for i, b in enumerate(prog.tile_ir.buffers):
        if b.role not in ("input", "const"):
            lines += [f"  {{ char path[4096]; snprintf(path, sizeof path, \"%s/o{i}.bin\", argv[1]);",
                      f"    FILE* f = fopen(path, \"wb\"); fwrite(b[{i}], 1, {b.nbytes}, f); "
                      "fclose(f); }"]
    return "\n".join(lines + ["  return 0;", "}"]) + "\n"


def run_on_arm(prog, arrays, tmp_path):
    """The program's results computed by its C source compiled for ARM64 and run under qemu."""
    d = tmp_path
    (d / "program.c").write_text(prog.target_code)
    (d / "driver.c").write_text(driver_source(prog))
    for file, text in prog.routine_sources.items():         # the GEMM and attention routines
        (d / file).write_text(text)
    flags = [f for f in toolchain.flags(CROSS, prog.target[4:]) if f != "-shared"]
    r = subprocess.run([CROSS, *flags, str(d / "program.c"), str(d / "driver.c"),
                        *[str(d / f) for f in prog.routine_sources], "-o", str(d / "run"), "-lm"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    for i, b in enumerate(prog.tile_ir.buffers):
        if b.role == "input":
            data = np.ascontiguousarray(arrays[b.param], dtype=b.type.dtype.np)
        elif b.role == "const":
            data = np.ascontiguousarray(b.data, dtype=b.type.dtype.np)
        else:
            continue
        (d / f"b{i}.bin").write_bytes(data.tobytes())
    env = dict(os.environ, OMP_NUM_THREADS="2", QEMU_LD_PREFIX=SYSROOT)
    r = subprocess.run([QEMU, "-L", SYSROOT, str(d / "run"), str(d)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    buffers = {}
    for i, b in enumerate(prog.tile_ir.buffers):
        if b.role == "input":
            buffers[b.name] = np.asarray(arrays[b.param])
        elif b.role == "const":
            buffers[b.name] = b.data
        else:
            raw = (d / f"o{i}.bin").read_bytes()
            buffers[b.name] = np.frombuffer(raw, dtype=b.type.dtype.np).reshape(b.type.shape)
    return results(prog, buffers, np)


def _bf16():
    return pytest.importorskip("ml_dtypes").bfloat16


def _with_nans(x):
    """x with NaNs, infinities and zeros of both signs scattered through it (infinities of one
    sign: inf - inf's NaN is negative on x86 and positive on ARM)."""
    flat = x.reshape(-1)
    flat[::23], flat[1::29], flat[3::37], flat[4::41] = np.nan, np.inf, 0.0, -0.0
    return x


def cases(rng):
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)     # noqa: E731
    f64 = lambda *s: rng.standard_normal(s)                         # noqa: E731
    q, k, v = f32(2, 3, 37, 16), f32(2, 3, 45, 16), f32(2, 3, 45, 24)
    mask = np.where(rng.random((37, 45)) < 0.2, -np.inf, 0).astype(np.float32)
    g = f32(129)
    return {
        # pointwise, with our transcendentals, in every float storage dtype
        "pointwise_f32": (lambda x: op.gelu(x) + op.exp(x) * op.tanh(x) - op.erf(x)
                          + op.sigmoid(x) + op.log(op.abs(x) + 1), [f32(33, 129)], True),
        "pointwise_f64": (lambda x: op.gelu(x, approximate="tanh") + op.exp(x) - op.erf(x)
                          + op.silu(x), [f64(33, 129)], True),
        "pointwise_f16": (lambda x: op.gelu(x) * 2 + op.exp(x), [f32(33, 65).astype(np.float16)],
                          True),
        "pointwise_bf16": (lambda x: op.tanh(x) + x * x, [f32(33, 65).astype(_bf16())], True),
        "int_bool_where_cast": (lambda a, b: op.where(a > b, a * 3 - b, op.cast(b, ts.int32))
                                + op.cast(a != 0, ts.int32),
                                [rng.integers(-50, 50, (17, 31)).astype(np.int32),
                                 rng.integers(-50, 50, (31,)).astype(np.int32)], True),
        # row groups, column and whole reductions
        "rows_f32": (lambda x, g: op.softmax(x) + op.layernorm(x, g, g, 1e-5)
                     + op.rmsnorm(x, g, 1e-6), [f32(40, 129), g], True),
        "rows_f64": (lambda x: op.log_softmax(x) + op.var(x, axis=-1, keepdim=True),
                     [f64(40, 129)], True),
        "rows_bf16": (lambda x: op.softmax(x), [f32(40, 129).astype(_bf16())], True),
        "columns_and_whole": (lambda x: (op.sum(x, axis=0), op.mean(x), op.max(x, axis=0),
                                         op.argmax(x, axis=-1)), [f32(300, 77)], True),
        "int_sum": (lambda x: op.sum(x, axis=-1), [rng.integers(-9, 9, (20, 500)).astype(np.int32)],
                    True),
        # contractions: the GEMM routine, batched, with an epilogue; 16-bit on widened copies
        "matmul_f32": (lambda a, b: op.relu(a @ b + 0.5), [f32(67, 131), f32(131, 45)], True),
        "matmul_f64_batched": (lambda a, b: a @ b, [f64(3, 33, 70), f64(3, 70, 29)], True),
        "matmul_f16": (lambda a, b: a @ b, [f32(40, 64).astype(np.float16),
                                           f32(64, 24).astype(np.float16)], True),
        # the convolution routine: its GEMM packing, its direct path (48 output channels),
        # and one channel per group's stencil
        "conv_f32": (lambda x, w, wd, d: (op.conv(x, w, padding=1), op.conv(x, wd, padding=1),
                                          op.conv(x, d, padding=1, groups=4)),
                     [f32(2, 4, 9, 21), f32(5, 4, 3, 3), f32(48, 4, 3, 3), f32(4, 1, 3, 3)],
                     True),
        # small images, whose windows' taps in the padding the direct path and the direct
        # weight gradient skip (a 5x5 image's 3x3 windows: 25% padding)
        "conv_small_f32": (lambda x, w, g: (op.conv(x, w, padding=1),
                                            op.conv_weight_grad(x, g, kernel=[3, 3], padding=1)),
                           [f32(6, 16, 5, 5), f32(48, 16, 3, 3), f32(6, 48, 5, 5)], True),
        # the weight gradient's routine (rows laid out, panels transposed; direct for 48
        # channels) and col2im's phases
        "conv_grads_f32": (lambda x, g, gd, c: (
            op.conv_weight_grad(x, g, kernel=[3, 3], padding=1),
            op.conv_weight_grad(x, gd, kernel=[3, 3], padding=1),
            op.col2im(c, image=[9, 21], kernel=[3, 3], stride=2, padding=1)),
            [f32(2, 4, 9, 21), f32(2, 5, 9, 21), f32(2, 48, 9, 21), f32(2, 3, 9, 5, 11)], True),
        # the pool routine: the largest (NaN propagating), where it is, and the mean of
        # strided windows
        "pools_f32": (lambda x: (op.max_pool(x, 3, 2, 1), op.avg_pool(x, 3, 2, 1),
                                 op.max_pool(x, (2, 3), (1, 3)), op.max_pool_indices(x, 3, 2, 1)),
                      [_with_nans(f32(2, 3, 11, 21))], True),
        "pools_f64": (lambda x: (op.max_pool(x, 3, 2, 1), op.avg_pool(x, (1, 5), 1, (0, 2))),
                      [_with_nans(f64(2, 3, 11, 21))], True),
        # the attention routine
        "attention_f32": (lambda q, k, v, m: op.attention(q, k, v, mask=m),
                          [q, k, v, mask], True),
        "attention_f64_causal": (lambda q, k, v: op.attention(q, k, v, causal=True),
                                 [a.astype(np.float64) for a in (q, k, v)], True),
        # movement: transpose, concat, take, slices
        "movement": (lambda x, i: op.concat([x.T, x[:, :5].T * 2], axis=0)[1:] + 0
                     + op.take(x, i, axis=0).sum(), [f32(9, 14), np.array([3, 0, 8], np.int64)],
                     True),
        # transposition copies: the routine's blocks and their edges
        "transposes": (lambda x, y: (x.T, op.transpose(y, perm=[2, 0, 1]),
                                     op.transpose(y[:, 1:, :], perm=[0, 2, 1])),
                       [f32(70, 45), f64(3, 37, 41)], True),
        # libm's functions: compared with NumPy only
        "libm": (lambda x: op.sin(x) + op.cos(x) + op.pow(op.abs(x), 1.5), [f32(33, 65)], False),
        "scans_and_scatter": (lambda x, i: (op.cumsum(x, axis=1), op.cumprod(x * 0.1 + 1, axis=0),
                                            op.scatter_add(x, i, x[:7] * 2.0)),
                              [f32(33, 65), rng.integers(-33, 33, 7)], True),
        # sorting: the merge sort of each line in its heap scratch
        "sorting": (lambda x: (op.argsort(x, axis=0), op.topk(x, 5)[0],
                               op.sort(op.round(x * 2), axis=1, descending=True)),
                    [f32(33, 65)], True),
        # int8 weights (gemm_w8.c): NEON widens four bytes at a time; the float32 chains
        "int8_weights": (lambda x, y, w, s: (op.matmul_int8_weight(x, w, s),
                                             op.matmul_int8_weight(y, w, s)),
                         [f32(3, 70), f32(20, 70), rng.integers(-127, 128, (70, 45)).astype(
                             np.int8), f32(45)], True),
        # rounding and floor division: exact, NumPy's bits on every ISA
        "rounding_divmod": (lambda x, y, i, j: (op.floor(x * 3) + op.ceil(x) * op.round(x * 2.5)
                                                + op.sign(x) + x % y + x // y, i // j, i % j),
                            [f32(33, 65), f32(65) + 0.5,
                             rng.integers(-50, 50, (33, 65)).astype(np.int32),
                             rng.integers(-5, 5, 65).astype(np.int32)], True),
    }


CASES = list(cases(np.random.default_rng(0)))


@pytest.mark.parametrize("name", CASES)
def test_arm64_results_equal_numpy_and_the_x86_bits(rng, tmp_path, name):
    fn, arrays, same_bits = cases(rng)[name]
    f = ts.function(fn)
    arm = f.lower(*arrays, target=f"cpu:{LEVEL}")
    assert arm.target == f"cpu:{LEVEL}" and "ISA level armv8-a (NEON)" in arm.target_code
    got = run_on_arm(arm, arrays, tmp_path)
    want = ts.interpret(f, *arrays)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    here = f(*arrays)                       # the same program for this machine's level
    here = list(here) if isinstance(here, (tuple, list)) else [here]
    assert len(got) == len(want) == len(here)
    for g, w, h in zip(got, want, here):
        assert g.dtype == h.dtype and g.shape == h.shape
        w = np.asarray(w).astype(g.dtype)
        # (an element that cancels, a weight gradient's sum of 378 products near 0, keeps the
        # rounding errors of its largest terms: absolute errors on the result's scale)
        size = np.abs(w[np.isfinite(w)]).max(initial=1.0) if g.dtype in TOL else 1.0
        assert_close(g, w, scale=8.0, atol=TOL[g.dtype][1] * size if g.dtype in TOL else None)
        if same_bits:
            assert g.tobytes() == h.tobytes(), f"{name}: the ARM64 bits differ from this CPU's"


@pytest.mark.parametrize("level", ["armv8-a", "armv8.2-a+dotprod"])      # NEON; NEON + sdot
@pytest.mark.parametrize("pair", ["i8i8", "u8i8", "i8u8", "u8u8"])
def test_arm64_int8_gemm_is_numpys_int32_product(rng, tmp_path, level, pair):
    """The int8 GEMM routine (sdot on armv8.2-a+dotprod, plain C on armv8-a) under qemu: every
    operand signedness, a transposed operand, edges of every micro-tile, a zero point."""
    ta, tb = (np.int8 if p == "i8" else np.uint8 for p in (pair[:2], pair[2:]))
    a = rng.integers(np.iinfo(ta).min, np.iinfo(ta).max + 1, (2, 37, 203)).astype(ta)
    b = rng.integers(np.iinfo(tb).min, np.iinfo(tb).max + 1, (45, 203)).astype(tb)
    zb = rng.integers(np.iinfo(tb).min, np.iinfo(tb).max + 1, (45,)).astype(tb)
    f = ts.function(lambda a, b, zb: (op.matmul_integer(a, b.T),
                                      op.matmul_integer(a, b.T, None, zb)))
    prog = f.lower(a, b, zb, target=f"cpu:{level}")
    assert f"ts_gemm_tile_{pair}" in prog.target_code
    got = run_on_arm(prog, [a, b, zb], tmp_path)
    wide = a.astype(np.int32)
    np.testing.assert_array_equal(got[0], wide @ b.T.astype(np.int32))
    np.testing.assert_array_equal(got[1], wide @ (b.astype(np.int32) - zb[:, None]).T)
