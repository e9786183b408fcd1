"""A random-program fuzzer: small tessera programs (elementwise chains, reductions, softmax,
matmuls, views with negative steps, broadcasts, reshapes, concats, casts) on awkward inputs
(size-0 and size-1 axes, views and aliased arguments, NaN and infinities, every storage dtype),
each checked against an independent float64 NumPy evaluation of the same program (this file's
own NumPy spellings, not tessera's references), against ts.interpret, for the same bits on a
second call, at another thread count and shape-generically (dynamic=True), and for gradients
against central finite differences.

A program is data (`Program`: its source over a namespace `K`, and how to make its inputs), so
a failure prints a program that can be read and replayed, and `regressions.json` beside this
file keeps the ones that once failed (the test replays them every run).

    python tests/fuzz/fuzzer.py --seconds 3600      # make fuzz: fresh seeds until the time is up
    python tests/fuzz/fuzzer.py --seed 1234         # one program, printed and checked
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
REGRESSIONS = HERE / "regressions.json"
SIZES = (1, 2, 3, 5, 7)            # an axis' size (0 added with a small probability)
STORAGE = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "bool")
LAYOUTS = ("contiguous", "reversed", "transposed", "strided", "broadcast", "fortran")


@dataclasses.dataclass
class Program:
    """`source` defines `prog(x0, x1, ...)` over the namespace K (this file's TesseraK or
    NumpyK); each input is {"shape", "dtype", "layout", "special", "alias"} (alias: the index of
    an earlier input it is the same array as). `compute` is the float dtype the program
    computes in (its inputs are cast to it first); `smooth`: no kinks, so finite differences
    check its gradient."""
    source: str
    inputs: list
    compute: str
    seed: int
    smooth: bool

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# ---- the two namespaces a program runs over -----------------------------------------------------
class NumpyK:
    """float64 NumPy, written here (not tessera's registry references)."""
    float_dtype = np.float64

    @staticmethod
    def start(x, compute):           # the input as the program computes with it
        return np.asarray(x).astype(np.float64).astype(compute).astype(np.float64)

    add, sub, mul = staticmethod(np.add), staticmethod(np.subtract), staticmethod(np.multiply)
    maximum, minimum = staticmethod(np.maximum), staticmethod(np.minimum)
    neg, abs, tanh = staticmethod(np.negative), staticmethod(np.abs), staticmethod(np.tanh)

    @staticmethod
    def sigmoid(x):
        return 0.5 * (1 + np.tanh(x / 2))

    @staticmethod
    def soft_exp(x):                 # exp of a bounded value: no overflow in any dtype
        return np.exp(np.tanh(x))

    @staticmethod
    def where_gt(a, b):              # (a margin: values equal but for rounding pick alike)
        return np.where(a > b + 0.25, a, b * 0.5)

    @staticmethod
    def reduce(name, x, axis, keepdim):          # sum, mean, max, min
        return getattr(np, name)(x, axis=axis, keepdims=keepdim)

    @staticmethod
    def softmax(x, axis):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)

    matmul, transpose = staticmethod(np.matmul), staticmethod(np.transpose)
    broadcast_to, reshape = staticmethod(np.broadcast_to), staticmethod(np.reshape)
    concat = staticmethod(np.concatenate)

    @staticmethod
    def slice(x, key):
        return x[key]

    @staticmethod
    def round_to(x, dtype):           # a cast to a narrower float and back: rounded once,
        from narrow_reference import round_to_narrow_bits     # by exact arithmetic
        import ml_dtypes
        narrow = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
        return round_to_narrow_bits(x, dtype).view(narrow).astype(np.float64)


class TesseraK:
    """The same operators, traced by tessera."""

    def __init__(self, op, compute):
        self.op, self.compute = op, compute

    def start(self, x, compute):
        return self.op.cast(x, compute)

    def add(self, a, b):
        return a + b

    def sub(self, a, b):
        return a - b

    def mul(self, a, b):
        return a * b

    def maximum(self, a, b):
        return self.op.maximum(a, b)

    def minimum(self, a, b):
        return self.op.minimum(a, b)

    def neg(self, x):
        return -x

    def abs(self, x):
        return self.op.abs(x)

    def tanh(self, x):
        return self.op.tanh(x)

    def sigmoid(self, x):
        return self.op.sigmoid(x)

    def soft_exp(self, x):
        return self.op.exp(self.op.tanh(x))

    def where_gt(self, a, b):
        return self.op.where(a > b + 0.25, a, b * 0.5)

    def reduce(self, name, x, axis, keepdim):
        return getattr(self.op, name)(x, axis=axis, keepdim=keepdim)

    def softmax(self, x, axis):
        return self.op.softmax(x, axis=axis)

    def matmul(self, a, b):
        return a @ b

    def transpose(self, x, perm):
        return self.op.transpose(x, perm)

    def slice(self, x, key):
        return x[key]

    def broadcast_to(self, x, shape):
        return self.op.broadcast_to(x, shape)

    def reshape(self, x, shape):
        return self.op.reshape(x, shape)

    def concat(self, xs, axis):
        return self.op.concat(xs, axis=axis)

    def round_to(self, x, dtype):
        return self.op.cast(self.op.cast(x, dtype), self.compute)


# ---- generation -------------------------------------------------------------------------------
class _Gen:
    def __init__(self, seed: int):
        self.r = np.random.default_rng(seed)
        self.lines, self.values, self.smooth = [], [], True

    def pick(self, xs):
        return xs[int(self.r.integers(len(xs)))]

    def size(self):
        return 0 if self.r.random() < 0.06 else int(self.pick(SIZES))

    def emit(self, expr, shape):
        name = f"v{len(self.values)}"
        self.lines.append(f"    {name} = {expr}")
        self.values.append((name, tuple(shape)))
        return name, tuple(shape)

    def step(self):
        r = self.r
        # (the newest value half the time: chains of views and operators, not only inputs)
        name, shape = self.values[-1] if r.random() < 0.5 else self.pick(self.values)
        rank = len(shape)
        kind = self.pick(["unary", "binary", "binary", "reduce", "softmax", "matmul", "view",
                          "view", "concat", "round"])
        if kind == "unary":
            f = self.pick(["neg", "tanh", "sigmoid", "soft_exp", "abs"])
            self.smooth &= f != "abs"
            return self.emit(f"K.{f}({name})", shape)
        if kind == "binary":
            others = [(n, s) for n, s in self.values if _broadcastable(s, shape)]
            other, oshape = self.pick(others)
            f = self.pick(["add", "sub", "mul", "maximum", "minimum", "where_gt"])
            self.smooth &= f in ("add", "sub", "mul")
            a, b = (name, other) if r.random() < 0.5 else (other, name)
            return self.emit(f"K.{f}({a}, {b})", np.broadcast_shapes(shape, oshape))
        if kind == "reduce" and rank:
            axis = int(r.integers(rank))
            keep = bool(r.random() < 0.5)
            f = self.pick(["sum", "mean", "max", "min"])
            if f in ("max", "min") and shape[axis] == 0:
                f = "sum"                # (no identity: an error in NumPy and in tessera)
            self.smooth &= f in ("sum", "mean")
            out = tuple(1 if k == axis else d for k, d in enumerate(shape)) if keep else \
                tuple(d for k, d in enumerate(shape) if k != axis)
            return self.emit(f"K.reduce({f!r}, {name}, {axis}, {keep})", out)
        if kind == "softmax" and rank and shape[-1] > 0:
            return self.emit(f"K.softmax({name}, -1)", shape)
        if kind == "matmul" and rank >= 1:
            k = shape[-1]
            for other, oshape in self.values if r.random() < 0.6 else ():
                if len(oshape) >= 2 and oshape[-2] == k and rank >= 2 and \
                        _broadcastable(shape[:-2], oshape[:-2]):
                    out = np.broadcast_shapes(shape[:-2], oshape[:-2]) + (shape[-2], oshape[-1])
                    return self.emit(f"K.matmul({name}, {other})", out)
            if rank >= 2:                # x @ x^T: both operands views of one value
                perm = list(range(rank))
                perm[-1], perm[-2] = perm[-2], perm[-1]
                return self.emit(f"K.matmul({name}, K.transpose({name}, {tuple(perm)}))",
                                 shape[:-1] + (shape[-2],))
        if kind == "view" and rank:
            v = self.pick(["transpose", "slice", "slice", "broadcast", "reshape"])
            if v == "transpose":
                perm = tuple(int(p) for p in r.permutation(rank))
                return self.emit(f"K.transpose({name}, {perm})", tuple(shape[p] for p in perm))
            if v == "slice":
                key, out = [], []
                for d in shape:
                    step = int(self.pick([1, 1, 2, -1, -2, 3]))
                    lo = int(r.integers(-d - 2, d + 3)) if r.random() < 0.6 else None
                    hi = int(r.integers(-d - 2, d + 3)) if r.random() < 0.6 else None
                    key.append(slice(lo, hi, step))
                    out.append(len(range(d)[slice(lo, hi, step)]))
                return self.emit(f"K.slice({name}, {tuple(key)!r})", out)
            if v == "broadcast":
                out = tuple(self.size() if d == 1 else d for d in shape)
                out = ((int(self.pick(SIZES)),) if r.random() < 0.4 else ()) + out
                return self.emit(f"K.broadcast_to({name}, {out})", out)
            n = int(np.prod(shape))
            out = (n,) if r.random() < 0.5 or n == 0 else _factor(n, r)
            return self.emit(f"K.reshape({name}, {out})", out)
        if kind == "concat" and rank:
            axis = int(r.integers(rank))
            same = [(n, s) for n, s in self.values if len(s) == rank and
                    all(a == b for k, (a, b) in enumerate(zip(s, shape)) if k != axis)]
            parts = [name] + [self.pick(same)[0] for _ in range(int(r.integers(1, 3)))]
            total = sum(dict(self.values)[p][axis] for p in parts)
            out = tuple(total if k == axis else d for k, d in enumerate(shape))
            return self.emit(f"K.concat([{', '.join(parts)}], {axis})", out)
        if kind == "round":
            self.smooth = False          # (a step function to finite differences)
            return self.emit(f"K.round_to({name}, {self.pick(['float16', 'bfloat16'])!r})",
                             shape)
        return self.emit(f"K.tanh({name})", shape)


def _broadcastable(a, b) -> bool:
    try:
        np.broadcast_shapes(tuple(a), tuple(b))
        return True
    except ValueError:
        return False


def _factor(n, r):
    divs = [d for d in range(2, n) if n % d == 0]
    if not divs:
        return (1, n)
    d = int(divs[int(r.integers(len(divs)))])
    return (d, n // d)


def generate(seed: int) -> Program:
    g = _Gen(seed)
    r = g.r
    compute = "float64" if r.random() < 0.35 else "float32"
    n_in = int(r.integers(1, 4))
    inputs, params = [], []
    for i in range(n_in):
        rank = int(r.integers(0, 4))
        shape = tuple(g.size() for _ in range(rank))
        if i and r.random() < 0.15:                      # the same array passed twice
            inputs.append({**inputs[int(r.integers(i))], "alias": None})
            inputs[-1]["alias"] = int(r.integers(i))
            shape = tuple(inputs[inputs[-1]["alias"]]["shape"])
        else:
            inputs.append({"shape": list(shape), "dtype": g.pick(STORAGE),
                           "layout": g.pick(LAYOUTS), "alias": None,
                           "special": bool(r.random() < 0.2)})
        params.append(f"x{i}")
        g.lines.append(f"    v{len(g.values)} = K.start(x{i}, {compute!r})")
        g.values.append((f"v{len(g.values)}", shape))
    for _ in range(int(r.integers(1, 7))):
        g.step()
    outs = sorted({g.values[-1][0], g.pick(g.values)[0]})
    special = any(i.get("special") for i in inputs)
    source = (f"def prog({', '.join(params)}):\n" + "\n".join(g.lines) +
              f"\n    return ({', '.join(outs)},)\n")
    return Program(source, inputs, compute, seed, g.smooth and not special)


# ---- inputs -----------------------------------------------------------------------------------
def make_inputs(p: Program, resize: dict | None = None) -> list:
    """The program's inputs; `resize` maps sizes to others (each axis of size d becomes
    resize[d]: the same inputs at other sizes of the same symbols)."""
    import tessera as ts
    r = np.random.default_rng(p.seed + 1)
    arrays = []
    for spec in p.inputs:
        if spec["alias"] is not None:
            arrays.append(arrays[spec["alias"]])
            continue
        shape = tuple(d if resize is None else resize[d] for d in spec["shape"])
        d = ts.dtypes.get(spec["dtype"]).np
        if spec["dtype"] == "bool":
            a = r.random(shape) < 0.5
        elif spec["dtype"].startswith("int"):
            a = r.integers(-4, 5, shape)
        else:
            a = r.uniform(-3, 3, shape)
            if spec["special"] and a.size:
                flat = a.reshape(-1)
                where = r.random(flat.size) < 0.25
                flat[where] = r.choice([np.nan, np.inf, -np.inf], int(where.sum()))
        a = a.astype(d)
        arrays.append(_layout(a, spec["layout"]))
    return arrays


def _layout(a, layout):
    """The same values in another memory layout: a view with negative or wide strides, a
    broadcast, Fortran order."""
    if layout == "reversed" and a.ndim:
        return np.flip(np.flip(a).copy())
    if layout == "transposed" and a.ndim >= 2:
        return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    if layout == "strided" and a.ndim:
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        wide[..., ::2] = a
        return wide[..., ::2]
    if layout == "broadcast" and a.ndim and a.shape[0] == 1:
        return np.broadcast_to(a[:1].copy(), a.shape)
    if layout == "fortran":
        return np.asfortranarray(a)
    return a


# ---- checking -----------------------------------------------------------------------------------
class Failure(AssertionError):
    pass


def _compile_program(p: Program, K):
    ns = {"K": K}
    exec(compile(p.source, f"<fuzz {p.seed}>", "exec"), ns)
    return ns["prog"]


def reference(p: Program, arrays):
    """The program in float64 NumPy, on the inputs as tessera reads them (narrow values widened
    exactly); None where NumPy itself refuses (an error tessera must raise too)."""
    prog = _compile_program(p, NumpyK)
    with np.errstate(all="ignore"):
        try:
            return [np.asarray(o, np.float64) for o in prog(*[np.asarray(a).astype(np.float64)
                                                              for a in arrays])]
        except (ValueError, IndexError):
            return None


def tolerance(p: Program, want):
    """rtol and atol for the compute dtype: float32 sums of a few dozen terms of size <= 3
    (the absolute floor scales with the result's magnitude: cancellation), float16/bfloat16
    roundings inside the program (round_to) give way more."""
    eps = 2.0 ** -52 if p.compute == "float64" else 2.0 ** -23
    scale = max([1.0] + [float(np.max(np.abs(w[np.isfinite(w)]), initial=0)) for w in want])
    if "round_to" in p.source:
        return 0.02, 0.02 * scale      # (a value within an ulp of a 16-bit tie may round
        #                                  either way in float64 and in float32 arithmetic)
    return 2000 * eps, 2000 * eps * scale


def compare(got, want, p: Program, what: str):
    if len(got) != len(want):
        raise Failure(f"{what}: {len(got)} outputs, the reference {len(want)}")
    rtol, atol = tolerance(p, want)
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.shape != w.shape:
            raise Failure(f"{what}: output {k} has shape {g.shape}, the reference {w.shape}")
        g = g.astype(np.float64)
        if "round_to" in p.source:
            # a rounding to 16 bits can land a value on either side of a tie in float64 vs
            # float32 arithmetic: compare where both are finite, NaN where the reference's is
            both = np.isfinite(g) & np.isfinite(w)
            np.testing.assert_allclose(g[both], w[both], rtol=rtol, atol=atol, err_msg=what)
            continue
        if not np.array_equal(np.isnan(g), np.isnan(w)):
            raise Failure(f"{what}: output {k}: NaN at {np.argwhere(np.isnan(g) != np.isnan(w))[:3].tolist()}"
                          f" differs (got {g.ravel()[:6]}, want {w.ravel()[:6]})")
        fin = np.isfinite(w)
        if not np.array_equal(g[~fin & ~np.isnan(w)], w[~fin & ~np.isnan(w)]):
            raise Failure(f"{what}: output {k}: infinities differ")
        if not np.allclose(g[fin], w[fin], rtol=rtol, atol=atol):
            bad = np.argmax(np.abs(g[fin] - w[fin]) - rtol * np.abs(w[fin]))
            raise Failure(f"{what}: output {k}: {g[fin][bad]} vs {w[fin][bad]} "
                          f"(rtol {rtol:.1e}, atol {atol:.1e})")


def digest(outs) -> str:
    """The outputs' bits, every NaN as one (a NaN's sign and payload depend on which operation
    made it, which a vector loop and its scalar tail may order differently)."""
    h = hashlib.sha256()
    for o in outs:
        o = np.ascontiguousarray(o)
        if o.dtype.kind == "f" or o.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            nan = np.isnan(o.astype(np.float32))
            if nan.any():
                o = o.copy()
                o[nan] = np.nan
        h.update(str((o.dtype, o.shape)).encode())
        h.update(o.tobytes())
    return h.hexdigest()[:16]


def check(p: Program) -> str:
    """Run every check on one program; returns the digest of its compiled outputs (for the
    thread-count comparison across processes). Raises Failure with what went wrong."""
    import tessera as ts
    from tessera import op
    arrays = make_inputs(p)
    want = reference(p, arrays)
    fn = ts.function(_compile_program(p, TesseraK(op, p.compute)))
    try:
        got = fn(*arrays)
    except ts.TesseraError as e:
        if want is None:
            return "refused"                # NumPy refuses too: a clear error is right
        raise Failure(f"tessera refused a program NumPy runs: {type(e).__name__}: {e}") from None
    except Exception as e:              # anything else is a crash of ours
        raise Failure(f"{type(e).__name__} (not a TesseraError): {e}") from e
    if want is None:
        raise Failure("NumPy refuses this program, tessera ran it")
    compare(got, want, p, "compiled vs float64 NumPy")
    again = fn(*arrays)
    if digest(again) != digest(got):
        raise Failure("a second call gave other bits")
    interp = ts.interpret(fn, *arrays)
    compare(interp if isinstance(interp, (tuple, list)) else (interp,), want, p,
            "ts.interpret vs float64 NumPy")
    _check_dynamic(p, arrays, got)
    if p.smooth and p.compute == "float64" and all(a.size for a in arrays):
        _check_gradient(p, arrays)
    return digest(got)


def _check_dynamic(p: Program, arrays, got):
    """Shape-generic (dynamic=True over annotated sizes): the same bits as the fixed shapes,
    or a clear refusal at trace time (a slice or reshape a symbolic size cannot express)."""
    import tessera as ts
    from tessera import op
    if not arrays or any(a.ndim == 0 for a in arrays):
        return
    prog = _compile_program(p, TesseraK(op, p.compute))
    sizes, ann = {}, []
    for a in arrays:
        dims = []
        for d in a.shape:
            sizes.setdefault(d, f"S{len(sizes)}")
            dims.append(sizes[d] if d > 1 else d)
        ann.append(ts.Tensor[tuple(dims)])
    prog.__annotations__ = {f"x{i}": t for i, t in enumerate(ann)}
    f = ts.function(prog, dynamic=True)
    try:
        dyn = f(*arrays)
    except ts.TesseraError:
        return
    except Exception as e:
        raise Failure(f"dynamic: {type(e).__name__} (not a TesseraError): {e}") from e
    if digest(dyn) != digest(got):
        raise Failure("dynamic=True gave other bits than the fixed shapes")
    # another size of the same buckets, which the library traced at this one serves: the bits
    # of the fixed shapes at that size, or a clear refusal (the program's own constants may
    # not fit it)
    other = {d: _neighbour(d) for d in sizes}
    if all(o == d for d, o in other.items()):
        return
    moved = make_inputs(p, other)
    try:
        want = ts.function(_compile_program(p, TesseraK(op, p.compute)))(*moved)
    except ts.TesseraError:
        return
    try:
        dyn = f(*moved)
    except ts.TesseraError:
        return
    except Exception as e:
        raise Failure(f"dynamic at {[m.shape for m in moved]}: {type(e).__name__} (not a "
                      f"TesseraError): {e}") from e
    if digest(dyn) != digest(want):
        raise Failure(f"dynamic=True traced at {[a.shape for a in arrays]} gave other bits at "
                      f"{[m.shape for m in moved]} than the fixed shapes there")


def _neighbour(d: int) -> int:
    """Another size in d's bucket (2**(k-1), 2**k] (itself where the bucket has one)."""
    if d <= 2:
        return d
    top = 1 << (d - 1).bit_length()
    return d - 1 if d - 1 > top // 2 else (d + 1 if d + 1 <= top else d)


def _check_gradient(p: Program, arrays):
    """ts.grad of the sum of the first output against central differences along a random
    direction of each float input."""
    import tessera as ts
    from tessera import op
    floats = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]
    if not floats:
        return
    prog = _compile_program(p, TesseraK(op, p.compute))

    params = ", ".join(f"x{i}" for i in range(len(arrays)))      # (grad names its arguments)
    ns = {"prog": prog, "op": op}
    exec(f"def loss({params}):\n    return op.sum(prog({params})[0])\n", ns)
    loss = ns["loss"]
    xs = [np.ascontiguousarray(a, dtype=np.float64) if i in floats else a
          for i, a in enumerate(arrays)]
    if len({id(a) for a in arrays}) != len(arrays):
        return                          # (aliased arguments: one array, two gradients)
    grads = ts.grad(loss, argnums=tuple(floats))(*xs)
    r = np.random.default_rng(p.seed + 2)
    h = 1e-6
    for i, g in zip(floats, grads):
        d = r.standard_normal(xs[i].shape)
        plus, minus = list(xs), list(xs)
        plus[i], minus[i] = xs[i] + h * d, xs[i] - h * d
        with np.errstate(all="ignore"):
            f = [float(np.sum(reference_numpy(p, v)[0])) for v in (plus, minus)]
        if not all(map(math.isfinite, f)):
            continue                    # (a NaN or inf loss has no finite difference)
        fd = (f[0] - f[1]) / (2 * h)
        an = float(np.sum(np.asarray(g) * d))
        if not math.isclose(an, fd, rel_tol=1e-4, abs_tol=1e-5 * max(1.0, abs(fd))):
            raise Failure(f"gradient of input {i}: {an} vs finite differences {fd}")


def reference_numpy(p: Program, arrays):
    return [np.asarray(o, np.float64) for o in _compile_program(p, NumpyK)(
        *[np.asarray(a, np.float64) for a in arrays])]


def describe(p: Program, err: BaseException | None = None) -> str:
    text = [f"fuzz program (seed {p.seed}, computes in {p.compute}):", p.source.rstrip(),
            "inputs: " + json.dumps(p.inputs)]
    if err is not None:
        text.append(f"failure: {err}")
    text.append(f"replay: python tests/fuzz/fuzzer.py --seed {p.seed}")
    return "\n".join(text)


# ---- runs in a child process ------------------------------------------------------------------
def run_batch(programs: list) -> list:
    """[(seed, digest or None, failure text or None)] for each program; progress on stderr
    ("start <seed>") so that a parent sees which program a crash killed."""
    out = []
    for p in programs:
        print(f"start {p.seed}", file=sys.stderr, flush=True)
        try:
            out.append((p.seed, check(p), None))
        except Failure as e:
            out.append((p.seed, None, describe(p, e)))
        except Exception as e:          # a defect of the fuzzer itself still names its program
            out.append((p.seed, None, describe(p, e)))
    return out


def _child(programs: list, threads: int | None, timeout):
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    payload = json.dumps([p.to_json() for p in programs])
    return subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child"],
                          input=payload, capture_output=True, text=True, env=env,
                          timeout=timeout)


def run_in_child(programs: list, threads: int | None = None, timeout=900) -> list:
    """The programs in a fresh process (a crash kills it, not the caller), optionally at a
    given thread count: [(seed, digest, failure)]; a crash or a hang is a failure. A program
    that corrupts memory may kill the process only in a later one's code, so the programs up
    to the one running are run again alone, in order, and the first that dies alone is the
    failure (its replay line reproduces it); where none does, the one running, with the seeds
    before it to replay in one process."""
    proc = _child(programs, threads, timeout)
    if proc.returncode != 0:
        started = sum(line.startswith("start ") for line in proc.stderr.splitlines())
        ran = programs[:max(1, started)]                # (in order: run_batch's)
        seed = ran[-1].seed
        for q in ran:
            alone = _child([q], threads, timeout)
            if alone.returncode != 0:
                return [(q.seed, None, describe(q, RuntimeError(
                    f"the process died (exit {alone.returncode}) running it alone:\n"
                    f"{alone.stderr[-2000:]}")))]
        seeds = ",".join(str(q.seed) for q in ran)
        return [(seed, None, describe(ran[-1], RuntimeError(
            f"the process died (exit {proc.returncode}) after the programs before it, none "
            f"of which dies alone: replay all in one process with --seed {seeds}\n"
            f"{proc.stderr[-2000:]}")))]
    return [tuple(x) for x in json.loads(proc.stdout.splitlines()[-1])]


def regressions() -> list:
    if not REGRESSIONS.exists():
        return []
    return [Program(**d) for d in json.loads(REGRESSIONS.read_text())]


def keep_as_regression(p: Program):
    kept = regressions()
    if any(q.source == p.source and q.inputs == p.inputs for q in kept):
        return
    kept.append(p)
    REGRESSIONS.write_text("[\n" + ",\n".join(json.dumps(q.to_json()) for q in kept) + "\n]\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="fuzz for this long")
    ap.add_argument("--seed", help="check this program (printed); several, comma-separated: "
                                   "in this order in one process")
    ap.add_argument("--batch", type=int, default=25, help="programs per child process")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        programs = [Program(**d) for d in json.loads(sys.stdin.read())]
        print(json.dumps(run_batch(programs)))
        return 0
    if a.seed is not None:
        programs = [generate(int(s)) for s in a.seed.split(",")]
        for p in programs:
            print(describe(p))
        res = run_in_child(programs)
        failed = [f for _, _, f in res if f]
        print("\n".join(failed) if failed else f"passed ({', '.join(d for _, d, _ in res)})")
        return 1 if failed else 0
    end, n, failures = time.time() + a.seconds, 0, 0
    entropy = np.random.SeedSequence().entropy
    seeds = np.random.default_rng(entropy)
    print(f"fuzzing for {a.seconds:.0f} s (entropy {entropy})", flush=True)
    while time.time() < end:
        batch = [generate(int(s)) for s in seeds.integers(0, 2 ** 62, a.batch)]
        for seed, dig, fail in run_in_child(batch):
            n += 1
            if fail:
                failures += 1
                print(fail, "\n", flush=True)
                keep_as_regression(next(p for p in batch if p.seed == seed))
    print(f"{n} programs, {failures} failures" + (f" (kept in {REGRESSIONS})" if failures
                                                   else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent.parent))          # this checkout's tessera
    sys.path.insert(1, str(HERE.parent))                 # tests/ (narrow_reference)
    sys.exit(main())
