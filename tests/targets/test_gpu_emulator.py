"""The CUDA emulator itself (tests/gpu_emulator), on hand-written kernels: indices, barriers,
shuffles, votes, atomics and intrinsics against NumPy; the bugs it exists to catch (deadlocks,
races, out-of-bounds accesses, unwritten shared memory) reported, and the process unharmed."""
import ctypes
import os
import shutil
import signal

import numpy as np
import pytest

from gpu_emulator import (KernelFault, compile_source, device_empty, emulator_source, launch,
                          to_device)
from tessera.errors import BackendUnavailableError, CompileError

from conftest import assert_close

if shutil.which(os.environ.get("CXX") or "g++") is None:
    pytest.skip("the CUDA emulator needs a C++20 compiler (g++)", allow_module_level=True)

# Every kernel here is valid CUDA (test_source_is_valid_cuda); the buggy ones are bugs a compiler
# does not see.
SOURCE = r"""
extern "C" __global__ void axpy_2d(const float* __restrict__ x, const float* __restrict__ y,
                                   const float* a, float* out, int rows, int cols) {
  int r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows && c < cols) out[r * cols + c] = __fmaf_rn(a[0], x[r * cols + c], y[r * cols + c]);
}

extern "C" __global__ void coordinates(int* out) {   // who am I, in every dimension
  int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  int* o = out + 6 * (b * blockDim.x * blockDim.y * blockDim.z + t);
  o[0] = blockIdx.x; o[1] = blockIdx.y; o[2] = blockIdx.z;
  o[3] = threadIdx.x; o[4] = threadIdx.y; o[5] = threadIdx.z;
}

#define TILE 32
extern "C" __global__ void transpose(const float* x, float* out, int rows, int cols) {
  __shared__ float tile[TILE][TILE + 1];
  int c = blockIdx.x * TILE + threadIdx.x, r0 = blockIdx.y * TILE;
  for (int k = threadIdx.y; k < TILE; k += blockDim.y)
    if (r0 + k < rows && c < cols) tile[k][threadIdx.x] = x[(r0 + k) * cols + c];
  __syncthreads();
  int oc = r0 + threadIdx.x, or0 = blockIdx.x * TILE;
  for (int k = threadIdx.y; k < TILE; k += blockDim.y)
    if (or0 + k < cols && oc < rows) out[(or0 + k) * rows + oc] = tile[threadIdx.x][k];
}

extern "C" __global__ void row_sum(const float* x, float* out, int n) {
  __shared__ float part[1024];
  float s = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) s += x[blockIdx.x * n + j];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}

extern "C" __global__ void row_sum_warps(const float* x, float* out, int n) {
  __shared__ float warp_sums[32];
  float s = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) s += x[blockIdx.x * n + j];
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
  }
}

/* out[mode][width][thread] for the four shuffles, widths 32..1, with b = params[mode] */
template <class T> __device__ T shuffled(T v, int mode, int b, int w) {
  switch (mode) {
    case 0: return __shfl_sync(0xffffffffu, v, b, w);
    case 1: return __shfl_up_sync(0xffffffffu, v, b, w);
    case 2: return __shfl_down_sync(0xffffffffu, v, b, w);
    default: return __shfl_xor_sync(0xffffffffu, v, b, w);
  }
}
extern "C" __global__ void shuffles(const int* params, int* out_i, double* out_d,
                                    long long* out_l) {
  int t = threadIdx.x, n = blockDim.x;
  for (int mode = 0; mode < 4; ++mode)
    for (int k = 0, w = 32; w >= 1; ++k, w /= 2) {
      int at = (mode * 6 + k) * n + t;
      out_i[at] = shuffled(t * 7 + 3, mode, params[mode], w);
      out_d[at] = shuffled(t + 0.25, mode, params[mode], w);
      out_l[at] = shuffled(t * 1000000007LL, mode, params[mode], w);
    }
}

extern "C" __global__ void votes(const int* pred, unsigned* out) {
  int t = threadIdx.x, p = pred[t];
  unsigned* o = out + 7 * t;
  o[0] = __ballot_sync(0xffffffffu, p);
  o[1] = __any_sync(0xffffffffu, p);
  o[2] = __all_sync(0xffffffffu, p);
  o[3] = __syncthreads_count(p);
  o[4] = __syncthreads_and(p);
  o[5] = __syncthreads_or(p);
  __syncwarp();
  o[6] = __activemask();
}

extern "C" __global__ void partial_warp(int* out, int delta) {   // blockDim 40: warp 1 has 8
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
  if (delta) out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, delta);
}

extern "C" __global__ void atomics(const int* v, int n, int* hist, long long* big,
                                   unsigned* small, int* exch, int* cas_sum) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    atomicAdd(&hist[v[i] & 15], 1);
    atomicMax(big, (long long)v[i] * 1000003LL);
    atomicMin(small, (unsigned)v[i]);
    atomicExch(exch, 7);
    int old = *cas_sum, seen;
    while ((seen = atomicCAS(cas_sum, old, old + v[i])) != old) old = seen;
  }
}

extern "C" __global__ void reverse_dynamic(const float* x, float* out) {
  extern __shared__ __align__(16) float buf[];
  int t = threadIdx.x, base = blockIdx.x * blockDim.x;
  buf[t] = x[base + t];
  __syncthreads();
  out[base + t] = buf[blockDim.x - 1 - t];
}

extern "C" __global__ void intrinsics(const float* a, const float* b, float* f, int* i,
                                      unsigned* u) {
  int t = threadIdx.x;
  float p = a[t] * b[t];
  f[5 * t + 0] = __fmaf_rn(a[t], b[t], -p);       /* the product's rounding error: exact */
  f[5 * t + 1] = __int_as_float(__float_as_int(a[t]) ^ (int)0x80000000);
  f[5 * t + 2] = max(a[t], b[t]) + min(a[t], 1.0);   /* float, double: double */
  f[5 * t + 3] = a[t] > 0.f ? rsqrtf(a[t]) : __int_as_float(0xff800000);
  f[5 * t + 4] = __longlong_as_double(__double_as_longlong((double)b[t]));
  i[3 * t + 0] = __popc((unsigned)__float_as_int(a[t]));
  i[3 * t + 1] = __clz(t) + __ffs(t * 12);
  i[3 * t + 2] = min(t - 50, 3);
  u[t] = __brev((unsigned)t * 2654435761u);
}

/* ---- kernels with the bugs the emulator must catch ---- */
extern "C" __global__ void divergent_barrier(int* out) {
  if (threadIdx.x < 40) __syncthreads();
  out[threadIdx.x] = 1;
}
extern "C" __global__ void shuffle_after_return(int* out) {
  if (threadIdx.x == 3) return;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
}
extern "C" __global__ void mixed_warp_ops(int* out) {
  if (threadIdx.x % 2) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
  else out[threadIdx.x] = __ballot_sync(0xffffffffu, 1);
}
extern "C" __global__ void half_mask(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, (int)threadIdx.x, 1);
}
extern "C" __global__ void offset_write(float* out, int offset) {
  out[(int)threadIdx.x + offset] = 1.f;
}
extern "C" __global__ void offset_read(const float* x, float* out, int offset) {
  out[threadIdx.x] = x[(int)threadIdx.x + offset];
}
extern "C" __global__ void unwritten_shared(float* out) {
  __shared__ float s[64];
  if (threadIdx.x < 60) s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = s[threadIdx.x];
}
extern "C" __global__ void missing_barrier(float* out) {
  __shared__ float s[128];
  s[threadIdx.x] = threadIdx.x;
  out[threadIdx.x] = s[127 - threadIdx.x];       /* another thread's element, no barrier */
}
extern "C" __global__ void reused_too_early(const float* x, float* out, int n) {
  __shared__ float s[64];
  float acc = 0.f;
  for (int k = 0; k < n; k += 64) {               /* no barrier before the tile is refilled */
    s[threadIdx.x] = x[k + threadIdx.x];
    __syncthreads();
    acc += s[63 - threadIdx.x];
  }
  out[threadIdx.x] = acc;
}
extern "C" __global__ void spin(const int* flag) { while (*(volatile const int*)flag == 0) {} }
extern "C" __global__ void trap_at(int who) { if (threadIdx.x == who) __trap(); }
extern "C" __global__ void divide(const int* d, int* out) {
  out[threadIdx.x] = 100 / d[threadIdx.x];
}
extern "C" __global__ void deep_stack(int* out, int n) {
  volatile int big[200000];
  for (int k = 0; k < n; ++k) big[k] = k;
  out[threadIdx.x] = big[n - 1];
}
"""


@pytest.fixture(scope="module")
def mod():
    return compile_source(SOURCE, "test_gpu_emulator")


def both_orders(mod, kernel, grid, block, make_args, shared=0):
    """Run forward and with blocks and threads in reverse order; a correct kernel gives the same
    bits. Returns the forward run's arguments."""
    runs = []
    for reverse in (False, True):
        args = make_args()
        launch(mod, kernel, grid, block, args, shared, reverse=reverse)
        runs.append(args)
    for a, b in zip(*runs):
        if isinstance(a, np.ndarray):
            assert a.tobytes() == b.tobytes(), f"{kernel}: the two orders differ"
    return runs[0]


def test_source_is_valid_cuda():
    """The kernels the emulator runs here also compile with NVRTC: no emulator-only leniency."""
    from tessera.runtime.gpu_toolchain import nvrtc_compile
    try:
        ptx = nvrtc_compile(SOURCE, name="test_gpu_emulator.cu")
    except BackendUnavailableError as e:
        pytest.skip(f"NVRTC is not installed: {e.summary}")
    assert b".entry shuffles" in ptx and b".entry atomics" in ptx


def test_2d_grid_and_fma(mod, rng):
    rows, cols = 37, 45
    x, y = (rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(2))
    a = np.float32(rng.standard_normal())
    args = both_orders(mod, "axpy_2d", (3, 5), (16, 8), lambda: [
        to_device(x), to_device(y), to_device([a]), device_empty((rows, cols), np.float32),
        rows, cols])
    got = args[3].astype(np.float64)
    exact = np.float64(a) * x + y        # within 2^-53 of a * x + y (the product is exact)
    # one rounding (the fma's): half an ulp of the result
    half_ulp = 0.5 * np.abs(np.spacing(args[3]))
    assert (np.abs(got - exact) <= half_ulp + np.abs(exact) * 2.0 ** -52).all()


def test_every_coordinate(mod):
    grid, block = (2, 3, 2), (4, 2, 3)
    out = device_empty((12, 24, 6), np.int32)
    launch(mod, "coordinates", grid, block, [out])
    b = np.stack(np.meshgrid(*[np.arange(g) for g in grid], indexing="ij"), -1)
    t = np.stack(np.meshgrid(*[np.arange(n) for n in block], indexing="ij"), -1)
    want = np.concatenate(np.broadcast_arrays(
        b.transpose(2, 1, 0, 3).reshape(12, 1, 3), t.transpose(2, 1, 0, 3).reshape(1, 24, 3)), -1)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("rows,cols", [(67, 45), (1, 33), (32, 32)])
def test_shared_memory_transpose(mod, rows, cols, rng):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    grid = (-(-cols // 32), -(-rows // 32))
    args = both_orders(mod, "transpose", grid, (32, 8), lambda: [
        to_device(x), device_empty((cols, rows), np.float32), rows, cols])
    np.testing.assert_array_equal(args[1], x.T)


@pytest.mark.parametrize("kernel", ["row_sum", "row_sum_warps"])
@pytest.mark.parametrize("threads", [32, 128, 1024])
def test_block_reductions(mod, kernel, threads, rng):
    rows, n = 9, 1000
    x = rng.standard_normal((rows, n)).astype(np.float32)
    args = both_orders(mod, kernel, rows, threads, lambda: [
        to_device(x), device_empty(rows, np.float32), n])
    want = x.astype(np.float64).sum(1)
    bound = n * np.finfo(np.float32).eps * np.abs(x).sum(1)
    assert (np.abs(args[1] - want) <= bound).all()


def shuffle_model(values, mode, b, width, warp=32):
    """CUDA's documented shuffles (HIP's alike) in warps of `warp` lanes: lanes in segments of
    `width`; a source outside the caller's segment (for up: below its start) yields the caller's
    own value."""
    out = np.empty_like(values)
    for lane in range(len(values)):
        base = lane % warp
        lo = base & ~(width - 1)
        hi = lo + width - 1
        if mode == 0:
            src = lo + (b % width)
        elif mode == 1:
            src = base - b if base - b >= lo else base
        elif mode == 2:
            src = base + b if base + b <= hi else base
        else:
            src = base ^ b if base ^ b <= hi else base
        j = lane - base + src
        out[lane] = values[j]
    return out


@pytest.mark.parametrize("params", [(0, 1, 1, 1), (5, 3, 3, 16), (37, 16, 16, 5), (31, 2, 7, 31)])
def test_shuffles(mod, params):
    n = 64
    out = both_orders(mod, "shuffles", 1, n, lambda: [
        to_device(np.array(params, np.int32)), device_empty((4, 6, n), np.int32),
        device_empty((4, 6, n), np.float64), device_empty((4, 6, n), np.int64)])
    t = np.arange(n)
    for mode in range(4):
        for k, w in enumerate([32, 16, 8, 4, 2, 1]):
            for got, values in zip(out[1:], [t * 7 + 3, t + 0.25, t * 1000000007]):
                np.testing.assert_array_equal(got[mode, k],
                                              shuffle_model(values, mode, params[mode], w))


HIP_SOURCE = r"""
#include <hip/hip_runtime.h>
extern "C" __global__ void wave(const int* params, int* out, unsigned long long* ballots) {
  int t = threadIdx.x, n = blockDim.x;
  out[0 * n + t] = __shfl(t * 7 + 3, params[0]);
  out[1 * n + t] = __shfl_up(t * 7 + 3, params[1]);
  out[2 * n + t] = __shfl_down(t * 7 + 3, params[2], 32);
  out[3 * n + t] = __shfl_xor(t * 7 + 3, params[3]);
  ballots[t] = __ballot(t % 3 == 0) ^ (unsigned long long)__any(t == 5) << 63;
  out[4 * n + t] = __all(t < 1000) + warpSize;
}
"""


def test_hip_source_is_valid_hip():
    from tessera.runtime.gpu_toolchain import hip_compile_check
    try:
        assert hip_compile_check(HIP_SOURCE, name="test_gpu_emulator.hip")
    except BackendUnavailableError as e:
        pytest.skip(f"hipcc is not installed: {e.summary}")


@pytest.mark.parametrize("params", [(0, 1, 1, 1), (37, 33, 16, 32), (63, 2, 31, 63)])
def test_hip_wavefronts_of_64(params):
    mod = compile_source(HIP_SOURCE, "hip_wave", lang="hip")
    n = 128
    out, ballots = device_empty((5, n), np.int32), device_empty(n, np.uint64)
    launch(mod, "wave", 1, n, [to_device(np.array(params, np.int32)), out, ballots])
    t = np.arange(n) * 7 + 3
    for mode, width in enumerate([64, 64, 32, 64]):
        np.testing.assert_array_equal(out[mode], shuffle_model(t, mode, params[mode], width, 64))
    ballot = [sum(1 << j for j in range(64) if (64 * w + j) % 3 == 0) for w in (0, 1)]
    want = np.array([ballot[0] ^ 1 << 63] * 64 + [ballot[1]] * 64, np.uint64)
    np.testing.assert_array_equal(ballots, want)
    np.testing.assert_array_equal(out[4], 65)


def test_votes(mod, rng):
    n = 96
    pred = (rng.random(n) < 0.5).astype(np.int32)
    pred[64:] = 1                                       # warp 2: all true
    out = both_orders(mod, "votes", 1, n,
                      lambda: [to_device(pred), device_empty((n, 7), np.uint32)])[1]
    for w in range(3):
        p = pred[32 * w:32 * w + 32]
        ballot = int(sum(int(v) << j for j, v in enumerate(p)))
        np.testing.assert_array_equal(out[32 * w:32 * w + 32, :3],
                                      [[ballot, p.any(), p.all()]] * 32)
    np.testing.assert_array_equal(out[:, 3:6], [[pred.sum(), pred.all(), pred.any()]] * n)
    np.testing.assert_array_equal(out[:, 6], 0xffffffff)


def test_partial_warp(mod):
    out = device_empty(40, np.int32)
    launch(mod, "partial_warp", 1, 40, [out, 0])
    np.testing.assert_array_equal(out, np.arange(40) ^ 1)
    with pytest.raises(KernelFault, match="lane 0 of warp 1 reads lane 8, which does not exist"):
        launch(mod, "partial_warp", 1, 40, [out, 8])     # lane 32 + 8 of warp 1 is not there


def test_integer_atomics(mod, rng):
    n = 5000
    v = rng.integers(0, 1 << 20, n).astype(np.int32)
    args = both_orders(mod, "atomics", 7, 128, lambda: [
        to_device(v), n, device_empty(16, np.int32, fill=0), device_empty(1, np.int64, fill=-1),
        device_empty(1, np.uint32, fill=0xffffffff), device_empty(1, np.int32, fill=0),
        device_empty(1, np.int32, fill=0)])
    np.testing.assert_array_equal(args[2], np.bincount(v & 15, minlength=16))
    assert args[3][0] == v.max().astype(np.int64) * 1000003 and args[4][0] == v.min()
    assert args[5][0] == 7 and args[6][0] == v.astype(np.int64).sum() % 2 ** 32 - (
        2 ** 32 if v.astype(np.int64).sum() % 2 ** 32 >= 2 ** 31 else 0)


def test_float_atomics_are_refused():
    src = 'extern "C" __global__ void k(float* s, const float* x) { atomicAdd(s, x[threadIdx.x]); }'
    with pytest.raises(CompileError, match="determinism"):
        compile_source(src, "float_atomic")


def test_dynamic_shared_memory(mod, rng):
    x = rng.standard_normal(3 * 96).astype(np.float32)
    out = both_orders(mod, "reverse_dynamic", 3, 96, lambda: [
        to_device(x), device_empty(3 * 96, np.float32)], shared=96 * 4)[1]
    np.testing.assert_array_equal(out, x.reshape(3, 96)[:, ::-1].reshape(-1))
    assert "float* const buf = (float*)tsemu_dynamic_shared;" in emulator_source(SOURCE)


def test_intrinsics(mod, rng):
    n = 64
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    f, i, u = (device_empty(s, d) for s, d in [((n, 5), np.float32), ((n, 3), np.int32),
                                                (n, np.uint32)])
    launch(mod, "intrinsics", 1, n, [to_device(a), to_device(b), f, i, u])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    product_error = a64 * b64 - (a * b).astype(np.float64)       # exact in float64
    np.testing.assert_array_equal(f[:, 0], product_error.astype(np.float32))
    np.testing.assert_array_equal(f[:, 1], -a)
    np.testing.assert_array_equal(f[:, 2], np.maximum(a, b) + np.minimum(a, 1.0).astype(np.float32))
    want = np.where(a > 0, np.float32(1) / np.sqrt(np.abs(a)), -np.inf).astype(np.float32)
    assert_close(f[:, 3], want)
    np.testing.assert_array_equal(f[:, 4], b)
    bits = a.view(np.uint32)
    np.testing.assert_array_equal(i[:, 0], [bin(v).count("1") for v in bits])
    t = np.arange(n)
    clz = np.array([32 - int(v).bit_length() for v in t])
    ffs = np.array([(int(v) & -int(v)).bit_length() for v in t * 12])
    np.testing.assert_array_equal(i[:, 1], clz + ffs)
    np.testing.assert_array_equal(i[:, 2], np.minimum(t - 50, 3))
    words = (t.astype(np.uint64) * 2654435761) % 2 ** 32
    np.testing.assert_array_equal(u, [int(f"{int(w):032b}"[::-1], 2) for w in words])


# ---- the bugs -----------------------------------------------------------------------------------
def test_deadlocks_are_reported(mod):
    out = device_empty(64, np.int32)
    with pytest.raises(KernelFault, match="deadlock.* 40 wait at a block barrier, 24 have "
                                          "returned"):
        launch(mod, "divergent_barrier", 1, 64, [out])
    with pytest.raises(KernelFault, match="deadlock.*31 of 32 lanes wait in __shfl_down_sync"):
        launch(mod, "shuffle_after_return", 1, 32, [out])
    with pytest.raises(KernelFault, match="disagree"):
        launch(mod, "mixed_warp_ops", 1, 32, [out])
    with pytest.raises(KernelFault, match="whole warp"):
        launch(mod, "half_mask", 1, 32, [out])


def test_out_of_bounds_accesses(mod):
    out = device_empty(10, np.float32)
    with pytest.raises(KernelFault, match="wrote outside argument 0: 0 bytes past its end"):
        launch(mod, "offset_write", 1, 10, [out, 1])          # one element too far
    with pytest.raises(KernelFault, match="wrote outside argument 0: 8 bytes before its start"):
        launch(mod, "offset_write", 1, 10, [out, -2])
    # past the slack, in the guard page (further away could be another mapping: no fault)
    with pytest.raises(KernelFault, match=r"Segmentation fault \(write .*: 360 bytes past the "
                                          "end of argument 0"):
        launch(mod, "offset_write", 1, 10, [out, 100])
    with pytest.raises(KernelFault, match=r"Segmentation fault \(read .*before the start of "
                                          "argument 0"):
        launch(mod, "offset_read", 1, 10, [out, device_empty(10, np.float32), -1500])  # guard
    got = device_empty(10, np.float32, fill=0)
    launch(mod, "offset_read", 1, 10, [to_device(np.ones(10, np.float32)), got, 1])
    np.testing.assert_array_equal(got, [1] * 9 + [np.nan])  # the slack past the end reads NaN
    launch(mod, "offset_write", 1, 10, [out, 0])            # the slack was made whole again


def test_unwritten_shared_memory_reads_nan(mod):
    out = device_empty(128, np.float32)
    launch(mod, "unwritten_shared", 2, 64, [out])
    want = np.tile(np.r_[np.arange(60), [np.nan] * 4], 2)   # poisoned again in block 1
    np.testing.assert_array_equal(out, want)


def test_missing_barriers_show_in_some_order(mod, rng):
    """Each thread runs to its next barrier before the next starts, so a read of another thread's
    write without a barrier between sees poison in one order or the other."""
    outs = []
    for reverse in (False, True):
        out = device_empty(128, np.float32)
        launch(mod, "missing_barrier", 1, 128, [out], reverse=reverse)
        outs.append(out)
    assert any(not np.array_equal(o, np.arange(127, -1, -1)) for o in outs)
    x = rng.standard_normal(256).astype(np.float32)
    want = x.reshape(4, 64)[:, ::-1].sum(0)
    outs = []
    for reverse in (False, True):
        out = device_empty(64, np.float32)
        launch(mod, "reused_too_early", 1, 64, [to_device(x), out, 256], reverse=reverse)
        outs.append(out)
    assert any(not np.allclose(o, want) for o in outs)


def test_other_faults(mod):
    with pytest.raises(KernelFault, match="time limit of 0.3 s"):
        launch(mod, "spin", 1, 32, [to_device(np.zeros(1, np.int32))], time_limit=0.3)
    with pytest.raises(KernelFault, match=r"__trap\(\) in block \(1,0,0\) thread \(5,0,0\)"):
        launch(mod, "trap_at", 2, 32, [5], reverse=True)
    d = np.ones(32, np.int32)
    d[9] = 0
    with pytest.raises(KernelFault, match=r"Floating point exception.*thread \(9,0,0\)"):
        launch(mod, "divide", 1, 32, [to_device(d), device_empty(32, np.int32)])
    with pytest.raises(KernelFault, match="stack overflow"):
        launch(mod, "deep_stack", 1, 2, [device_empty(2, np.int32), 200000])
    out = device_empty(64, np.int32)
    launch(mod, "partial_warp", 1, 64, [out, 0])          # and the process carries on
    np.testing.assert_array_equal(out, np.arange(64) ^ 1)


def sigaction_handler(sig):
    libc = ctypes.CDLL(None)
    buf = ctypes.create_string_buffer(256)          # struct sigaction: the handler comes first
    assert libc.sigaction(sig, None, buf) == 0
    return buf.raw[:8]


def test_signal_handlers_restored(mod):
    before = [sigaction_handler(s) for s in (signal.SIGSEGV, signal.SIGFPE, signal.SIGBUS)]
    with pytest.raises(KernelFault):
        launch(mod, "offset_write", 1, 10, [device_empty(10, np.float32), 100])
    launch(mod, "offset_write", 1, 10, [device_empty(10, np.float32), 0])
    assert [sigaction_handler(s) for s in (signal.SIGSEGV, signal.SIGFPE, signal.SIGBUS)] == before


def test_bad_launches(mod):
    out = device_empty(64, np.int32)
    with pytest.raises(KernelFault, match="invalid configuration.*1024 threads"):
        launch(mod, "coordinates", 1, 1025, [out])
    with pytest.raises(KernelFault, match="invalid configuration.*at least 1"):
        launch(mod, "coordinates", (0, 1), 32, [out])
    with pytest.raises(KernelFault, match="no kernel named nope"):
        launch(mod, "nope", 1, 32, [out])
    with pytest.raises(CompileError, match="g\\+\\+ rejected broken"):
        compile_source('extern "C" __global__ void k(int* x) { x[0] = undeclared; }', "broken")


def test_modules_are_cached(mod):
    assert compile_source(SOURCE) is mod
    assert mod.path.exists() and mod.shared        # the __shared__ arrays were found
