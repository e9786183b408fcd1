"""The shared cases: an example of every registered operator (EXAMPLES), and the corpus of
programs the code-generation tests lower (every operator in every dtype it takes, and each
strategy's shapes). Registering an operator without an example fails tests/ops/test_registry.py."""
import numpy as np

import tessera as ts
from tessera import Tile, tile
from tessera import dtypes as dt
from tessera import ops
from tessera.compiler.graph_ir import Graph, make_attrs
from tessera.compiler.scheduler import build_schedule
from tessera.compiler.lower import lower_schedule_gpu
from tessera.compiler.driver import prepare
from tessera.compiler.tile_ir import TileProgram
from tessera.errors import DTypeError, TesseraError
from tessera.trace import Trace, Traced, apply, tracing
from tessera.types import type_of_array


def f32(rng, *shape, lo=-3, hi=3):
    # float64: normalising 3 values can be ill-conditioned (a tiny variance), which no float32
    # tolerance survives; float32 accuracy is tested with error bounds in the other files
    return rng.uniform(lo, hi, size=shape)


# name -> (inputs from rng, attrs)
EXAMPLES = {
    **{n: (lambda r: [f32(r, 3, 5)], {}) for n in
       ["neg", "stop_gradient", "abs", "exp", "sin", "cos", "tanh", "sigmoid", "relu", "gelu",
        "silu", "erf"]},
    "log": (lambda r: [f32(r, 3, 5, lo=0.1)], {}),
    "log1p": (lambda r: [f32(r, 3, 5, lo=-0.9)], {}),
    **{n: (lambda r: [f32(r, 3, 5) * 4], {}) for n in ["expm1", "softplus"]},
    "sqrt": (lambda r: [f32(r, 3, 5, lo=0)], {}),
    "rsqrt": (lambda r: [f32(r, 3, 5, lo=0.1)], {}),
    **{n: (lambda r: [f32(r, 4, 1, 3), f32(r, 5, 1)], {}) for n in
       ["add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"]},
    "div": (lambda r: [f32(r, 4, 3), f32(r, 3, lo=0.5)], {}),
    # bits: integers as they are (the dtype variants keep them), bool where NumPy takes it
    **{n: (lambda r: [r.integers(-2**31, 2**31, size=(4, 3)), r.integers(-99, 99, size=3)], {})
       for n in ["bitwise_and", "bitwise_or", "bitwise_xor"]},
    "bitwise_not": (lambda r: [r.integers(-99, 99, size=(3, 5)) > 0], {}),
    **{n: (lambda r: [r.integers(-2**40, 2**40, size=(4, 3)), r.integers(-2, 70, size=3)], {})
       for n in ["left_shift", "right_shift"]},
    **{n: (lambda r: [f32(r, 3, 5) * 4], {}) for n in ["floor", "ceil", "round", "sign"]},
    **{n: (lambda r: [f32(r, 4, 3) * 5, f32(r, 3, lo=0.5) * np.array([1, -1, 1])], {})
       for n in ["mod", "floor_divide"]},
    "pow": (lambda r: [f32(r, 4, 3, lo=0.1), f32(r, 3)], {}),
    "atan2": (lambda r: [f32(r, 4, 3), f32(r, 3)], {}),
    "fma": (lambda r: [f32(r, 4, 3), f32(r, 3), f32(r, 4, 1)], {}),
    "where": (lambda r: [f32(r, 4, 3) > 0, f32(r, 4, 3), f32(r, 3)], {}),
    "cast": (lambda r: [f32(r, 4, 3) * 10], {"dtype": "int32"}),
    **{n: (lambda r: [f32(r, 3, 4, 5)], {"axis": [0, 2], "keepdim": True}) for n in
       ["sum", "max", "min", "mean", "var"]},
    "prod": (lambda r: [f32(r, 3, 4, 5, lo=0.5, hi=1.5)], {"axis": [0, 2], "keepdim": False}),
    "cumsum": (lambda r: [f32(r, 3, 4, 5)], {"axis": 1}),
    # complex: their parts (the other operators' complex forms: tests/ops/test_complex.py)
    **{n: (lambda r: [(f32(r, 3, 4) + 1j * f32(r, 3, 4)).astype(np.complex64)], {}) for n in
       ["real", "imag", "conj"]},
    "complex": (lambda r: [f32(r, 3, 4), f32(r, 4)], {}),
    "scatter_add": (lambda r: [f32(r, 5, 3), np.array([0, -1, 4, 0]), f32(r, 4, 3)], {"axis": 0}),
    "cumprod": (lambda r: [f32(r, 3, 6, lo=0.5, hi=1.5)], {"axis": -1}),
    "argsort": (lambda r: [np.round(f32(r, 3, 9))], {"axis": 1}),        # ties
    "sort": (lambda r: [f32(r, 4, 3)], {"axis": 0, "descending": True}),
    "take_along_axis": (lambda r: [f32(r, 3, 5), r.integers(-5, 5, size=(3, 4))], {"axis": 1}),
    "argmax": (lambda r: [f32(r, 3, 7)], {"axis": 1}),
    "argmin": (lambda r: [f32(r, 3, 7)], {"axis": 0, "keepdim": True}),
    **{n: (lambda r: [f32(r, 2, 3, 6)], {"axis": 1}) for n in
       ["softmax", "log_softmax", "logsumexp", "layernorm", "rmsnorm"]},
    "matmul": (lambda r: [f32(r, 2, 3, 4), f32(r, 4, 5)], {}),
    "bitcast": (lambda r: [f32(r, 3, 5).astype(np.float32)], {"dtype": "int32"}),
    "matmul_integer": (lambda r: [r.integers(-128, 128, (2, 3, 40)).astype(np.int8),
                                  r.integers(0, 256, (40, 5)).astype(np.uint8)], {}),
    "matmul_int8_weight": (lambda r: [f32(r, 2, 3, 40).astype(np.float32),
                                      r.integers(-127, 128, (40, 37)).astype(np.int8)], {}),
    "pad": (lambda r: [f32(r, 2, 5, 6)], {"pads": [[0, 0], [2, 1], [-1, 3]], "mode": "reflect"}),
    "conv": (lambda r: [f32(r, 2, 4, 7, 6), f32(r, 6, 2, 3, 2)],
             {"stride": [2, 1], "padding": [[1, 0], [1, 1]], "dilation": [1, 2], "groups": 2}),
    "conv_transpose": (lambda r: [f32(r, 1, 4, 5, 4), f32(r, 4, 3, 3, 2)],
                       {"stride": [2, 1], "padding": [[1, 1], [0, 0]],
                        "output_padding": [1, 0], "groups": 2}),
    "max_pool": (lambda r: [f32(r, 2, 3, 7, 6)],
                 {"kernel": [3, 2], "stride": [2, 2], "padding": [1, 0], "ceil_mode": True}),
    "max_pool_indices": (lambda r: [f32(r, 2, 3, 7, 6)],
                         {"kernel": [3, 2], "stride": [2, 2], "padding": [1, 0]}),
    "conv_weight_grad": (lambda r: [f32(r, 2, 4, 7, 6), f32(r, 2, 6, 3, 6)],
                         {"kernel": [3, 2], "stride": [2, 1], "padding": [[1, 0], [1, 1]],
                          "dilation": [1, 2], "groups": 2}),
    "col2im": (lambda r: [f32(r, 2, 3, 6, 4, 5)],
               {"image": [7, 6], "kernel": [3, 2], "stride": [2, 1], "padding": [[1, 1], [0, 1]],
                "dilation": [1, 2]}),
    "fold_windows": (lambda r: [f32(r, 2, 3, 7, 6)],
                     {"kernel": [3, 2], "stride": [2, 1], "padding": [[1, 1], [0, 1]],
                      "dilation": [1, 2], "combine": "maximum"}),
    "avg_pool": (lambda r: [f32(r, 2, 3, 7, 6)],
                 {"kernel": [3, 2], "stride": [2, 1], "padding": [1, 1], "ceil_mode": True,
                  "count_include_pad": False}),
    "attention": (lambda r: [f32(r, 2, 5, 4), f32(r, 2, 7, 4), f32(r, 2, 7, 3), f32(r, 5, 7)],
                  {"causal": True}),
    "transpose": (lambda r: [f32(r, 2, 3, 4)], {"perm": [1, 2, 0]}),
    "reshape": (lambda r: [f32(r, 2, 3, 4)], {"shape": [4, -1]}),
    "broadcast_to": (lambda r: [f32(r, 3, 1)], {"shape": [2, 3, 5]}),
    "slice": (lambda r: [f32(r, 6, 5)], {"starts": [1, None], "stops": [None, 0],
                                        "steps": [2, -1]}),
    "concat": (lambda r: [[f32(r, 2, 3), f32(r, 4, 3)]], {"axis": 0}),
    "take": (lambda r: [f32(r, 5, 3), r.integers(-5, 5, size=(2, 2))], {"axis": 0}),
    "expand_dims": (lambda r: [f32(r, 2, 3)], {"axis": -1}),
    "squeeze": (lambda r: [f32(r, 2, 1, 3)], {"axis": 1}),
    "random_uniform": (lambda r: [r.integers(-2**40, 2**40, size=()),
                                  r.integers(0, 2**40, size=(4, 5))], {}),
    "round_stochastic": (lambda r: [f32(r, 4, 5) * 100, r.integers(-2**40, 2**40, size=()),
                                    r.integers(0, 2**40, size=(4, 5))], {"dtype": "bfloat16"}),
    # the Fourier transforms (tests/ops/test_spectral.py: sizes, norms, accuracy) and their
    # primitives (the parts of a complex result on a last axis of 2)
    "fft": (lambda r: [f32(r, 3, 6) + 1j * f32(r, 3, 6)], {"n": 8}),
    "ifft": (lambda r: [f32(r, 5, 3) + 1j * f32(r, 5, 3)], {"axis": 0, "norm": "ortho"}),
    "rfft": (lambda r: [f32(r, 3, 7)], {}),
    "irfft": (lambda r: [f32(r, 3, 5) + 1j * f32(r, 3, 5)], {"n": 9, "norm": "forward"}),
    "dft": (lambda r: [f32(r, 3, 12), f32(r, 3, 12)], {"axis": 1, "inverse": True, "scale": 0.5}),
    "dft_r2c": (lambda r: [f32(r, 7, 3)], {"axis": 0}),
    "dft_c2r": (lambda r: [f32(r, 3, 5), f32(r, 3, 5)], {"axis": 1, "n": 8}),
}



def normal_attrs(opdef, arrays, attrs):
    """The attributes as the operator normalises them for these arrays."""
    return make_attrs(opdef, attrs, [type_of_array(np.asarray(a)) for a in arrays])


def graph(fn, arrays, name="f") -> Graph:
    """The Graph IR of fn on arrays' types (a tuple result is several outputs)."""
    g = Graph(name)
    tr = Trace(g, name)
    xs = [Traced(g.add_param(f"x{i}", type_of_array(np.asarray(a))), tr)
          for i, a in enumerate(arrays)]
    with tracing(tr):
        r = fn(*xs)
    outs = list(r) if isinstance(r, tuple) else [r]
    g.outputs = [o._value for o in outs]
    g.output_structure, g.output_tree = ("tuple" if isinstance(r, tuple) else "single"), None
    return g


def lower(fn, arrays, target) -> TileProgram:
    _, prim = prepare(graph(fn, arrays))
    return lower_schedule_gpu(build_schedule(prim, target), target).verify()


# ---- the cases: every registered operator in every dtype it takes, and each strategy ------------
def _variants(arrays):
    """The example's arrays as f32, f64, f16, bf16, the two fp8 formats, i8, i32, i64, u8, u64
    and bool (float arrays converted; into the integers through int64, so a negative value
    wraps into the unsigned ones)."""
    def conv(to):
        return [np.asarray(a).astype(np.int64).astype(to) if np.asarray(a).dtype.kind == "f" and
                np.dtype(to).kind in "iu" else
                np.asarray(a).astype(to) if np.asarray(a).dtype.kind == "f" else a
                for a in arrays]
    return {"f32": conv(np.float32), "f64": conv(np.float64), "f16": conv(np.float16),
            "bf16": conv(dt.bfloat16.np), "f8e4m3": conv(dt.float8_e4m3fn.np),
            "f8e5m2": conv(dt.float8_e5m2.np), "i8": conv(np.int8), "i32": conv(np.int32),
            "i64": conv(np.int64), "u8": conv(np.uint8), "u64": conv(np.uint64), "bool": [np.asarray(a) > 0 if np.asarray(a).dtype.kind == "f"
                                            else a for a in arrays]}


def registry_cases(rng):
    cases = {}
    for name in sorted(EXAMPLES):
        make, attrs = EXAMPLES[name]
        listed = ops.get(name).nin == -1
        inputs = make(rng)
        for tag, args in _variants(inputs[0] if listed else inputs).items():
            def fn(*xs, name=name, attrs=attrs, listed=listed):
                return apply(name, list(xs), **attrs) if listed else apply(name, *xs, **attrs)
            try:
                graph(fn, args)
            except (DTypeError, TesseraError):
                continue                # this operator does not take this dtype
            cases[f"{name}-{tag}"] = (fn, args)
    return cases


# tile kernels (@ts.kernel) the tests share: a float32 matmul with the bare range_k loop, the
# seeds' safe_softmax (tests/frontend/test_tile_kernels.py holds their texts as written), a matmul
# whose loop is not the bare one, with 1, 2 or 3 stages, and two kernels of integer atomics
@ts.kernel
def tile_matmul(A: Tile["M", "K", dt.float32], B: Tile["K", "N", dt.float32],
                C: Tile["M", "N", dt.float32]):
    ctx = tile.context()
    a = tile.load(A, shape=(ctx.BM, ctx.BK))
    b = tile.load(B, shape=(ctx.BK, ctx.BN))
    acc = tile.zeros((ctx.BM, ctx.BN))
    for k in tile.range_k(0, ctx.K, ctx.BK):
        acc += tile.mma(tile.load_partition(a, k), tile.load_partition(b, k))
    tile.store(C, acc)


@ts.kernel
def tile_softmax(x: Tile["R", "C"]) -> Tile["R", "C"]:
    e = tile.exp(x - tile.max(x, axis=-1, keepdim=True))
    return e / tile.sum(e, axis=-1, keepdim=True)


def _abs_matmul(stages):
    def abs_matmul(A: Tile["M", "K", dt.float32], B: Tile["K", "N", dt.float32],
                   C: Tile["M", "N", dt.float32]):
        """|A| @ B: not the bare GEMM loop, so the kernel keeps its own partitions (on GPUs in
        rings of `stages` buffers)."""
        ctx = tile.context()
        a = tile.load(A, shape=(ctx.BM, ctx.BK))
        b = tile.load(B, shape=(ctx.BK, ctx.BN))
        acc = tile.zeros((ctx.BM, ctx.BN))
        for k in tile.range_k(0, ctx.K, ctx.BK, stages=stages):
            acc += tile.mma(tile.abs(tile.load_partition(a, k)), tile.load_partition(b, k))
        tile.store(C, acc)
    return ts.kernel(abs_matmul)


tile_abs_matmul = {n: _abs_matmul(n) for n in (1, 2, 3)}      # by stages


@ts.kernel
def tile_histogram(x: Tile["N"], counts: Tile["B"]):
    """counts[x[i]] += 1 for every i: integer atomics, from blocks of x."""
    ctx = tile.context()
    tile.atomic_add(counts, 1, index=tile.load(x, shape=(ctx.BM,)))


@ts.kernel
def tile_column_sums(x: Tile["R", "C"], total: Tile["One", "C"]):
    """total += the column sums of x: each program's block summed, then added atomically."""
    ctx = tile.context()
    xb = tile.load(x, shape=(ctx.BM, ctx.C))
    tile.atomic_add(total, tile.sum(xb, axis=0, keepdim=True))


def strategy_cases(rng):
    def u(*shape, d=np.float32):
        return rng.uniform(-2, 2, size=shape).astype(d)
    op = ts.op
    cases = {}
    for d in (np.float32, np.float64, np.float16, dt.bfloat16.np):
        s = np.dtype(d).name
        for shape in [(1, 1), (3, 1), (7, 33), (2, 3, 1000), (2, 70001)]:
            cases[f"softmax{shape}-{s}"] = (lambda x: op.softmax(x, axis=-1), [u(*shape, d=d)])
            cases[f"layernorm{shape}-{s}"] = (lambda x: op.layernorm(x, axis=-1),
                                              [u(*shape, d=d)])
        cases[f"rmsnorm-{s}"] = (lambda x: op.rmsnorm(x, axis=-1), [u(5, 129, d=d)])
        cases[f"logsumexp-mid-{s}"] = (lambda x: op.logsumexp(x, axis=1), [u(4, 9, 3, d=d)])
        cases[f"whole-sum-{s}"] = (lambda x: op.sum(x), [u(1000, 7, d=d)])
        cases[f"whole-max-{s}"] = (lambda x: op.max(x), [u(70001, d=d)])
        cases[f"whole-normalise-{s}"] = (lambda x: x - op.mean(x), [u(13, 11, d=d)])
        cases[f"column-sum-{s}"] = (lambda x: op.sum(x, axis=0), [u(33, 17, d=d)])
        cases[f"column-max-{s}"] = (lambda x: op.max(x * 2, axis=(0, 1)), [u(3, 5, 7, d=d)])
        cases[f"argmax-all-{s}"] = (lambda x: op.argmax(x), [u(9, 4, d=d)])
        cases[f"argmin-0-{s}"] = (lambda x: op.argmin(x, axis=0), [u(9, 4, d=d)])
        cases[f"broadcast-view-{s}"] = (lambda x, y: op.transpose(x, perm=[1, 0]) * y + 1,
                                        [u(5, 3, d=d), u(5, d=d)])
        cases[f"two-outputs-{s}"] = (lambda x: (op.softmax(x, axis=-1), x * 2), [u(6, 10, d=d)])
        cases[f"concat-{s}"] = (lambda x, y: op.concat([x, y, x], axis=1),
                                [u(2, 3, d=d), u(2, 5, d=d)])
        cases[f"take-{s}"] = (lambda x, i: op.take(x, i, axis=1),
                              [u(3, 7, 5, d=d), rng.integers(-7, 7, size=(2, 3))])
        cases[f"rank0-{s}"] = (lambda x: op.exp(x), [np.asarray(0.5, dtype=d)])
        # rows of a multiple of 8: the pointwise vector path (vload/vstore), two outputs
        cases[f"vector-pointwise-{s}"] = (lambda x, y: (op.gelu(x * y) + 1, x > y),
                                          [u(3, 64, d=d), u(64, d=d)])
        cases[f"matmul-epilogue-{s}"] = (lambda a, b, c: op.relu(a @ b + c),
                                         [u(2, 33, 20, d=d), u(20, 45, d=d), u(45, d=d)])
        cases[f"matmul-view-{s}"] = (lambda a, b: a @ op.transpose(b, perm=[1, 0]),
                                     [u(130, 70, d=d), u(257, 70, d=d)])
        cases[f"matmul-1x1-{s}"] = (lambda a, b: a @ b, [u(1, 1, d=d), u(1, 1, d=d)])
        cases[f"attention-{s}"] = (lambda q, k, v: op.attention(q, k, v),
                                   [u(2, 70, 64, d=d), u(2, 33, 64, d=d), u(2, 33, 64, d=d)])
    cases["vector-pointwise-int"] = (lambda i, j: (i * 3 - j, op.cast(i, "int64") + j),
                                     [rng.integers(-9, 9, size=(5, 16), dtype=np.int32),
                                      rng.integers(-9, 9, size=(16,))])
    cases["matmul-int"] = (lambda a, b: a @ b, [rng.integers(-5, 5, size=(3, 4, 5)),
                                                rng.integers(-5, 5, size=(5, 6))])
    # a user's tile kernel (tile_program, its own strategy; tests/frontend/test_tile_kernels.py)
    body = tile_softmax.body([dt.float32])
    cases["tile_program-f32"] = (lambda x: apply("tile_program", [x], kernel=body), [u(7, 33)])
    piped = tile_abs_matmul[3].body([dt.float32] * 3)
    cases["tile_program-stages"] = (lambda a, b, c: apply("tile_program", [a, b, c], kernel=piped),
                                    [u(37, 75), u(75, 29), u(37, 29)])
    for d in (np.int32, np.int64):
        hist = tile_histogram.body([dt.get(d)] * 2)
        cases[f"tile_program-atomic-{dt.get(d).short}"] = (
            lambda x, c, hist=hist: apply("tile_program", [x, c], kernel=hist),
            [rng.integers(0, 9, 100).astype(d), np.zeros(9, d)])
    # control flow: region steps around their bodies' kernels
    cases["fori_loop-f32"] = (lambda x, w: ts.fori_loop(0, 4, lambda i, c: c * 0.5 + w[i], x),
                          [u(6), u(4, 6)])
    cases["while_loop-f32"] = (lambda x: ts.while_loop(lambda v: op.sum(v * v) > 1.0,
                                                   lambda v: v * 0.5, x * 8.0), [u(5)])
    cases["scan-f32"] = (lambda x, xs: ts.scan(lambda h, t: (h + t, op.max(h)), x, xs,
                                           reverse=True), [u(3), u(5, 3)])
    cases["cond-f32"] = (lambda x: ts.cond(op.sum(x) > 0, lambda v: op.exp(v), lambda v: -v, x),
                     [u(4)])
    return cases
