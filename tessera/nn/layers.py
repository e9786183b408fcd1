"""Functional layers: a module holds hyperparameters only; its parameters are a plain pytree.

    layer = nn.Linear(784, 512)
    params = layer.init(seed)          # {"w": f32[784, 512], "b": f32[512]} (NumPy arrays)
    y = layer(params, x)               # traced inside a tessera function, eager on NumPy arrays

Every layer computes with ``op.*`` functions and Python operators, which trace inside a
``tessera.function`` and run the operators' NumPy references on arrays, so one definition serves
the compiled program and the reference it is tested against.

Randomness (dropout) is stateless: a call takes ``seed`` (a Python int or an integer tensor, so a
compiled training step takes a fresh seed per call without recompiling) and ``stream``; each
dropout site of a composite module gets its own stream, a separate range of the generator's
counters (``stream << 40``), so one seed drives all of them without overlap. ``train`` defaults
to "training mode and a seed was given": ``mlp(p, x)`` is inference, ``mlp(p, x, seed=s)``
training, and ``train=False`` or ``with ts.training(False):`` (``ts.is_training()``, traced as a
static switch) turns dropout off whatever the seed; an explicit ``train=`` wins over the mode.
"""
from __future__ import annotations

import numpy as np

from .. import op
from ..errors import ArgumentError
from ..trace import is_training
from .init import Key, as_key, kaiming_uniform, normal, ones, zeros

STREAM_SHIFT = 40          # a dropout site owns counters [stream << 40, (stream + 1) << 40)


def _shape(x):
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


# ---- activations -------------------------------------------------------------------------------
ACTIVATIONS = {
    "relu": op.relu,
    "gelu": op.gelu,
    "gelu_tanh": lambda x: op.gelu(x, approximate="tanh"),
    "tanh": op.tanh,
    "sigmoid": op.sigmoid,
    "silu": op.silu,
    "softplus": op.softplus,
    "elu": op.elu,
    "selu": op.selu,
    "leaky_relu": op.leaky_relu,
    "mish": op.mish,
    "hardswish": op.hardswish,
    "identity": lambda x: x,
}


def activation(name):
    """An activation by name (relu, gelu, gelu_tanh, tanh, sigmoid, silu, softplus, elu, selu,
    leaky_relu, mish, hardswish, identity), a callable
    (returned as is) or None (identity)."""
    if name is None:
        return ACTIVATIONS["identity"]
    if callable(name):
        return name
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ArgumentError(f"unknown activation {name!r}",
                            expected=", ".join(sorted(ACTIVATIONS))) from None


# ---- the module base ---------------------------------------------------------------------------
class Module:
    """Hyperparameters plus two functions: ``init(seed) -> params`` and
    ``__call__(params, *inputs, ...)``. ``streams`` is how many dropout streams a call uses."""
    streams = 0

    def init(self, seed=0):
        """The parameters, a pytree of NumPy arrays, deterministic in ``seed`` (an int or an
        nn.init.Key): the same seed gives the same bits on every machine."""
        return self.init_params(as_key(seed))

    def init_params(self, key: Key):
        return {}

    def __call__(self, params, x, **kw):
        raise NotImplementedError

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class Linear(Module):
    """y = x @ w + b, with w of shape [in, out] (so no transpose is needed) and b of shape [out].

    Init (PyTorch's nn.Linear): w and b ~ U(-1/sqrt(in), 1/sqrt(in)). Inputs of any rank
    [..., in]: leading axes are flattened into one matrix product and restored."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=np.float32):
        self.in_features, self.out_features, self.bias, self.dtype = \
            int(in_features), int(out_features), bool(bias), np.dtype(dtype)

    def init_params(self, key):
        shape = (self.in_features, self.out_features)
        p = {"w": kaiming_uniform(key.child("w"), shape, self.in_features, dtype=self.dtype)}
        if self.bias:
            p["b"] = kaiming_uniform(key.child("b"), (self.out_features,), self.in_features,
                                     dtype=self.dtype)
        return p

    def __call__(self, params, x, **kw):
        return linear(x, params["w"], params.get("b"))


def linear(x, w, b=None):
    """x @ w (+ b) over the last axis of x; w may be int8 weights with their scales,
    ``{"int8": [K, N], "scale": [N]}`` as ``nn.quantize_int8`` makes them."""
    if isinstance(w, dict):
        n = _shape(w["int8"])[-1]

        def product(a):
            return op.matmul_int8_weight(a, w["int8"], w["scale"])
    else:
        n = _shape(w)[-1]

        def product(a):
            return op.matmul(a, w)
    shape = _shape(x)
    if len(shape) > 2:
        y = op.reshape(product(op.reshape(x, [-1, shape[-1]])), list(shape[:-1]) + [n])
    else:
        y = product(x)
    return y if b is None else y + b


class FusedLinearGeLU(Linear):
    """The seeds' FusedLinearGeLU: gelu(x @ w + b) (``approximate`` "none" or "tanh"), the
    activation applied in the matmul's epilogue: compiled, the GEMM kernel writes the activated
    result and the pre-activation never goes to memory. Linear's params and init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 approximate: str = "none", dtype=np.float32):
        super().__init__(in_features, out_features, bias, dtype)
        self.approximate = approximate

    def __call__(self, params, x, **kw):
        return op.gelu(super().__call__(params, x), approximate=self.approximate)


class FusedLinearSiLU(Linear):
    """The seeds' FusedLinearSiLU: silu(x @ w + b), fused as FusedLinearGeLU is."""

    def __call__(self, params, x, **kw):
        return op.silu(super().__call__(params, x))


class SwiGLU(Module):
    """The gated MLP of LLaMA and its descendants: (silu(x @ w_gate) * (x @ w_up)) @ w_down,
    without biases. params {"gate", "up", "down"} (Linear params, PyTorch's init)."""

    def __init__(self, dim: int, hidden: int, dtype=np.float32):
        self.dim, self.hidden = int(dim), int(hidden)
        self.gate = Linear(dim, hidden, False, dtype)
        self.up = Linear(dim, hidden, False, dtype)
        self.down = Linear(hidden, dim, False, dtype)

    def init_params(self, key):
        return {n: getattr(self, n).init_params(key.child(n)) for n in ("gate", "up", "down")}

    def __call__(self, params, x, **kw):
        h = op.silu(self.gate(params["gate"], x)) * self.up(params["up"], x)
        return self.down(params["down"], h)


class Dropout(Module):
    """Zero each element with probability ``rate`` and scale the rest by 1/(1 - rate) (inverted
    dropout), in training only. The mask is ``op.random_uniform(x.shape, seed, offset) >= rate``:
    a pure function of (seed, stream, element index), so the same seed gives the same mask on
    every run, at every thread count, compiled or eager. Active when a ``seed`` is given in
    training mode (``ts.is_training()``; off under ``with ts.training(False):``), or when
    ``train=True`` (which then needs a seed)."""
    streams = 1

    def __init__(self, rate: float):
        if not 0.0 <= rate <= 1.0:
            raise ArgumentError(f"dropout rate must be in [0, 1], not {rate}")
        self.rate = float(rate)

    def __call__(self, params, x, seed=None, train=None, stream=0, **kw):
        return dropout(x, self.rate, seed, train, stream)


def dropout(x, rate, seed=None, train=None, stream=0):
    """Inverted dropout of x (see Dropout); ``train=None`` means "a seed was given, in training
    mode"."""
    if train is None:
        train = seed is not None and is_training()
    if not train or rate == 0.0:
        return x
    if rate == 1.0:
        return x * 0.0
    if seed is None:
        raise ArgumentError("dropout in training needs a seed",
                            hint="pass seed=... (an int, or an integer tensor argument)")
    u = op.random_uniform(_shape(x), seed, offset=int(stream) << STREAM_SHIFT)
    return op.where(u >= rate, x * (1.0 / (1.0 - rate)), 0.0)


class Sequential(Module):
    """Modules applied in order; params {"layers": [p0, p1, ...]}. Keyword arguments (seed,
    train) reach every layer; each layer that draws random numbers gets its own streams."""

    def __init__(self, *layers):
        self.layers = list(layers[0]) if len(layers) == 1 and isinstance(layers[0], (list, tuple)) \
            else list(layers)
        self.streams = sum(getattr(m, "streams", 0) for m in self.layers)

    def init_params(self, key):
        k = key.child("layers")
        return {"layers": [m.init_params(k.child(i)) if isinstance(m, Module) else {}
                           for i, m in enumerate(self.layers)]}

    def __call__(self, params, x, stream=0, **kw):
        for m, p in zip(self.layers, params["layers"]):
            if isinstance(m, Module):
                x = m(p, x, stream=stream, **kw)
                stream += m.streams
            else:
                x = m(x)                 # a plain function, e.g. op.relu
        return x


class MLP(Module):
    """Linear layers of the given sizes with an activation between them (none after the last
    unless ``final_activation``), and dropout after each hidden activation when ``dropout`` > 0.

    ``MLP([784, 512, 512, 10], activation="relu")``: params {"layers": [Linear params, ...]}."""

    def __init__(self, sizes, activation="relu", final_activation=None, dropout: float = 0.0,
                 bias: bool = True, dtype=np.float32):
        sizes = [int(s) for s in sizes]
        if len(sizes) < 2:
            raise ArgumentError("an MLP needs at least an input and an output size")
        self.sizes, self.activation, self.final_activation = sizes, activation, final_activation
        self.dropout = float(dropout)
        self.linears = [Linear(a, b, bias, dtype) for a, b in zip(sizes[:-1], sizes[1:])]
        self.streams = len(self.linears) - 1 if self.dropout > 0 else 0

    def init_params(self, key):
        k = key.child("layers")
        return {"layers": [m.init_params(k.child(i)) for i, m in enumerate(self.linears)]}

    def __call__(self, params, x, seed=None, train=None, stream=0, **kw):
        act, last = activation(self.activation), len(self.linears) - 1
        for i, (m, p) in enumerate(zip(self.linears, params["layers"])):
            x = m(p, x)
            if i < last:
                x = dropout(act(x), self.dropout, seed, train, stream + i)
            elif self.final_activation is not None:
                x = activation(self.final_activation)(x)
        return x


class Embedding(Module):
    """Rows of a [num, dim] table picked by integer ids: ``take(table, ids, axis=0)``.
    Init (PyTorch's nn.Embedding): N(0, 1)."""

    def __init__(self, num_embeddings: int, dim: int, dtype=np.float32):
        self.num_embeddings, self.dim, self.dtype = int(num_embeddings), int(dim), np.dtype(dtype)

    def init_params(self, key):
        return {"table": normal(key.child("table"), (self.num_embeddings, self.dim),
                                dtype=self.dtype)}

    def __call__(self, params, ids, **kw):
        return op.embedding(params["table"], ids)


class LayerNorm(Module):
    """(x - mean) / sqrt(var + eps) over the last axis, then * weight + bias.
    Init: weight 1, bias 0. ``affine=False``: no parameters."""

    def __init__(self, dim: int, eps: float = 1e-5, affine: bool = True, bias: bool = True,
                 dtype=np.float32):
        self.dim, self.eps, self.affine, self.bias, self.dtype = \
            int(dim), float(eps), bool(affine), bool(bias), np.dtype(dtype)

    def init_params(self, key):
        if not self.affine:
            return {}
        p = {"weight": ones((self.dim,), self.dtype)}
        if self.bias:
            p["bias"] = zeros((self.dim,), self.dtype)
        return p

    def __call__(self, params, x, **kw):
        return op.layernorm(x, params.get("weight"), params.get("bias"), eps=self.eps)


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) over the last axis, then * weight. Init: weight 1."""

    def __init__(self, dim: int, eps: float = 1e-6, affine: bool = True, dtype=np.float32):
        self.dim, self.eps, self.affine, self.dtype = int(dim), float(eps), bool(affine), \
            np.dtype(dtype)

    def init_params(self, key):
        return {"weight": ones((self.dim,), self.dtype)} if self.affine else {}

    def __call__(self, params, x, **kw):
        return op.rmsnorm(x, params.get("weight"), eps=self.eps)
