"""Arrays from other libraries, and tessera functions inside PyTorch.

    x = ts.from_dlpack(torch_tensor)     # a NumPy array on the same memory (no copy)
    y = f(torch_a, torch_b)              # a tessera function on PyTorch tensors: PyTorch out
    layer = ts.to_torch(f)               # a torch.autograd.Function: forward compiled by
    loss = layer(w, x).sum()             # tessera, backward by ts.vjp
    loss.backward()

Inputs: any object with ``__dlpack__`` (PyTorch, JAX, NumPy itself) is read through DLPack, on
the same memory when the layout allows (NumPy's rules: a strided view stays a view; Tessera's
kernels read their inputs and never write them, so sharing is safe). A PyTorch tensor that
requires grad is read detached; bfloat16 and fp8 tensors, which DLPack cannot hand to NumPy,
are read as their bits and viewed as ml_dtypes' types; a tensor on a GPU is an
``ArgumentError`` for a CPU program (``.cpu()`` it), never a silent copy.

Results: when every array argument of a call is a PyTorch tensor, the results come back as
PyTorch tensors (on the results' own memory, no copy); when every one is a JAX array, as JAX
arrays (JAX copies them onto its device); otherwise NumPy arrays, as always.
"""
from __future__ import annotations

import sys

import numpy as np

from . import dtypes as dt
from .autodiff import vjp
from .errors import ArgumentError
from .function import Function, extensions
from .pytree import flatten, tree_map

# torch dtypes DLPack cannot give NumPy: (the integer type of their bits, the NumPy dtype name)
_BITS = {"bfloat16": ("int16", "bfloat16"), "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
         "float8_e5m2": ("uint8", "float8_e5m2")}


def _torch():
    return sys.modules.get("torch")      # (never imported here: a tensor means it was)


def is_torch(x) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_jax(x) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Array)


def is_foreign(x) -> bool:
    """An array of another library that DLPack reads (not NumPy's, not a GPU array the GPU
    runtime takes as it is)."""
    return not isinstance(x, (np.ndarray, np.generic)) and hasattr(x, "__dlpack__") and \
        (is_torch(x) or not hasattr(x, "__cuda_array_interface__"))


def from_dlpack(x) -> np.ndarray:
    """A NumPy array of x (anything with ``__dlpack__``), sharing its memory where possible."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch(x):
        return _from_torch(x)
    try:
        return np.from_dlpack(x)
    except (BufferError, TypeError, RuntimeError) as e:
        raise ArgumentError(f"cannot read a {type(x).__name__} through DLPack: {e}",
                            hint="convert it to a NumPy array first") from None


def _from_torch(t) -> np.ndarray:
    t = t.detach()
    if t.device.type != "cpu":
        raise ArgumentError(f"a PyTorch tensor on {t.device} given to a CPU program",
                            received=f"torch.{str(t.dtype).split('.')[-1]} on {t.device}",
                            hint="move it with .cpu(), or call a function with target=\"cuda\"")
    name = str(t.dtype).split(".")[-1]
    if name in _BITS:
        torch = _torch()
        bits, npname = _BITS[name]
        return np.from_dlpack(t.view(getattr(torch, bits))).view(dt.get(npname).np)
    if t.is_conj() or t.is_neg():          # lazy conjugates and negations: resolved (a copy)
        t = t.resolve_conj().resolve_neg()
    try:
        return np.from_dlpack(t)
    except (BufferError, TypeError, RuntimeError) as e:
        raise ArgumentError(f"cannot read a torch.{name} tensor: {e}") from None


def as_array(x):
    """An argument as the array a program takes: foreign arrays through DLPack, the rest as
    NumPy reads them."""
    return from_dlpack(x) if is_foreign(x) else np.asarray(x)


def results_like(args) -> str | None:
    """"torch" ("jax") when every array among the arguments (pytree leaves included) is a
    PyTorch tensor (a JAX array), else None (NumPy results)."""
    arrays = [a for a in flatten(list(args))[0]
              if isinstance(a, np.ndarray) or hasattr(a, "__dlpack__")]
    for kind, test in (("torch", is_torch), ("jax", is_jax)):
        if arrays and all(test(a) for a in arrays):
            return kind
    return None


def to_torch_tensor(a):
    """A NumPy result as a PyTorch tensor on the same memory (bfloat16 and fp8 by their bits)."""
    torch = _torch()
    a = np.asarray(a)
    if a.dtype.name in _BITS:
        bits, _ = _BITS[a.dtype.name]
        return torch.from_numpy(a.view(bits)).view(getattr(torch, a.dtype.name))
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def convert_results(out, kind: str | None):
    """The results of a call in the callers' array type (a pytree of arrays; None stays)."""
    if kind is None:
        return out
    convert = to_torch_tensor if kind == "torch" else sys.modules["jax"].numpy.asarray
    return tree_map(lambda r: convert(r) if isinstance(r, (np.ndarray, np.generic)) else r, out)


# ---- tessera functions inside PyTorch ------------------------------------------------------------
def to_torch(fn):
    """``fn`` (a tessera function or a Python function of tessera operators) as a PyTorch
    autograd function: called on tensors it runs the compiled program and returns tensors;
    ``backward`` runs the compiled vjp (``ts.vjp``), so it trains inside a PyTorch loop.
    Arguments that are not tensors pass through as static values (no gradient); results may
    be a tensor or a tuple of them."""
    import torch

    f = fn if isinstance(fn, Function) else Function(fn)

    class TesseraFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            arrays = [from_dlpack(a) if isinstance(a, torch.Tensor) else a for a in args]
            out, back = vjp(f, *arrays)
            ctx.back, ctx.single = back, not isinstance(out, (tuple, list))
            ctx.args = [a.dtype if isinstance(a, torch.Tensor) else None for a in args]
            outs = [out] if ctx.single else list(out)
            if not all(isinstance(o, (np.ndarray, np.generic)) for o in outs):
                raise ArgumentError(f"to_torch({f.name}): results must be a tensor or a tuple "
                                    "of tensors", received=type(out).__name__)
            outs = tuple(to_torch_tensor(o) for o in outs)
            return outs[0] if ctx.single else outs

        @staticmethod
        def backward(ctx, *grads):       # (PyTorch gives zeros for results not used)
            cts = [from_dlpack(g.contiguous()) for g in grads]
            gs = ctx.back(cts[0] if ctx.single else tuple(cts))
            return tuple(None if d is None or g is None else to_torch_tensor(g).to(d)
                         for g, d in zip(gs, ctx.args))

    def call(*args):
        return TesseraFunction.apply(*args)

    call.__name__ = call.__qualname__ = f"to_torch({f.name})"
    call.__doc__ = f.__doc__
    call.function = f
    return call


# a tessera function reads these arrays and answers in their type
extensions.register(as_array=as_array,
                    convert_results=lambda out, args: convert_results(out, results_like(args)))
