"""``tessera.optim``: SGD, Adam and AdamW, gradient clipping and loss scaling, functionally.

    opt = optim.Adam(lr=1e-3)
    state = opt.init(params)                               # a pytree of arrays, with a step counter
    params, state = opt.update(grads, state, params)       # new trees; nothing is mutated

``update`` is written with tessera operators, so it runs eagerly on NumPy arrays and traces into
a compiled training step, where each parameter's update is elementwise code the compiler fuses
per parameter (the scalars every parameter shares, such as Adam's bias corrections, are
computed once per step). The
formulas are PyTorch's (torch.optim.SGD, Adam, AdamW with their defaults), so hyperparameters
carry over.

The step counter is an int64 tensor in the state, so bias corrections are tensors too and a
compiled step never recompiles as it advances. Bias corrections are 1 - beta**t computed as
1 - exp(t * log(beta)) in float64 (with tessera's own exp, identical on every target), then
rounded to the parameters' dtype.
"""
from __future__ import annotations

import math

import numpy as np

from . import op
from .errors import ArgumentError
from .pytree import flatten, leaves as tree_leaves, tree_map


def _dtype_name(x) -> str:
    d = getattr(x, "dtype", None)
    return np.dtype(getattr(d, "np", d) if d is not None else np.asarray(x).dtype).name


def _zeros_like(x):
    return np.zeros(np.shape(x) if not hasattr(x, "shape") else tuple(x.shape),
                    dtype=_dtype_name(x))


def _scalar_as(x, like):
    """A 0-d tensor (or Python number) in the dtype of ``like``."""
    if isinstance(x, (int, float)):
        return x
    return op.cast(x, _dtype_name(like)) if _dtype_name(x) != _dtype_name(like) else x


class Optimizer:
    """``init(params) -> state`` and ``update(grads, state, params) -> (params, state)``.

    ``lr`` is a float or a schedule: a function of the step count (a float64 0-d tensor, 1 on
    the first update) built from tessera operators, e.g. ``lambda t: 1e-3 * op.minimum(t / 100,
    1.0)`` for a linear warm-up."""

    def __init__(self, lr):
        if not callable(lr) and not (isinstance(lr, (int, float)) and lr >= 0):
            raise ArgumentError(f"lr must be a non-negative number or a schedule, not {lr!r}")
        self.lr = lr

    def _lr(self, t):
        return self.lr(t) if callable(self.lr) else float(self.lr)

    def init(self, params) -> dict:
        return {"step": np.zeros((), np.int64)}

    def update(self, grads, state, params):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class SGD(Optimizer):
    """PyTorch's SGD: g += weight_decay * p; with momentum, buf = g on the first step and
    buf = momentum * buf + (1 - dampening) * g after; g = g + momentum * buf (nesterov) or buf;
    p -= lr * g. State: {"step", "momentum"} (no buffers without momentum)."""

    def __init__(self, lr=1e-2, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
        super().__init__(lr)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ArgumentError("nesterov momentum needs momentum > 0 and dampening = 0")
        self.momentum, self.dampening, self.nesterov, self.weight_decay = \
            float(momentum), float(dampening), bool(nesterov), float(weight_decay)

    def init(self, params):
        state = super().init(params)
        if self.momentum:
            state["momentum"] = tree_map(_zeros_like, params)
        return state

    def update(self, grads, state, params):
        step = state["step"] + 1
        lr = self._lr(op.cast(step, "float64"))
        first = state["step"] == 0
        mu, damp, wd = self.momentum, self.dampening, self.weight_decay

        def one(g, p, buf):
            if wd:
                g = g + wd * p
            if mu:
                buf = op.where(first, g, mu * buf + (1.0 - damp) * g)
                g = g + mu * buf if self.nesterov else buf
            return p - _scalar_as(lr, p) * g, buf
        new_p, new_b = _per_leaf(one, 2, grads, params, state.get("momentum"))
        new_state = {"step": step}
        if mu:
            new_state["momentum"] = new_b
        return new_p, new_state


class Adam(Optimizer):
    """PyTorch's Adam: g += weight_decay * p (L2, coupled); m = b1 m + (1 - b1) g;
    v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
    State: {"step", "m", "v"}."""
    decoupled = False

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(lr)
        b1, b2 = betas
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ArgumentError(f"Adam's betas must be in [0, 1), not {betas}")
        self.betas, self.eps, self.weight_decay = (float(b1), float(b2)), float(eps), \
            float(weight_decay)

    def init(self, params):
        return {**super().init(params), "m": tree_map(_zeros_like, params),
                "v": tree_map(_zeros_like, params)}

    def update(self, grads, state, params):
        b1, b2 = self.betas
        step = state["step"] + 1
        t = op.cast(step, "float64")
        lr = self._lr(t)
        # scalars shared by every parameter: computed once, in float64, then rounded
        step_size = lr / (1.0 - _pow(b1, t))
        bc2_sqrt = op.sqrt(1.0 - _pow(b2, t))
        scalars = {}

        def shared(p):
            d = _dtype_name(p)
            if d not in scalars:
                decay = 1.0 - lr * self.weight_decay if self.decoupled and self.weight_decay \
                    else None
                scalars[d] = [None if s is None else _scalar_as(s, p)
                              for s in (step_size, bc2_sqrt, decay)]
            return scalars[d]

        def one(g, p, m, v):
            size, bc2, decay = shared(p)
            if self.weight_decay and not self.decoupled:
                g = g + self.weight_decay * p
            if decay is not None:
                p = p * decay
            m = b1 * m + (1.0 - b1) * g
            v = b2 * v + (1.0 - b2) * (g * g)
            return p - size * m / (op.sqrt(v) / bc2 + self.eps), m, v
        new_p, new_m, new_v = _per_leaf(one, 3, grads, params, state["m"],
                                         state["v"])
        return new_p, {"step": step, "m": new_m, "v": new_v}


class AdamW(Adam):
    """PyTorch's AdamW: Adam with decoupled weight decay, p *= 1 - lr * weight_decay before the
    Adam step (default weight_decay 0.01)."""
    decoupled = True

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(lr, betas, eps, weight_decay)


def _pow(beta: float, t):
    """beta ** t for a float64 tensor t, as exp(t * log(beta)) (beta = 0 gives 0 for t >= 1)."""
    if beta == 0.0:
        return 0.0
    return op.exp(t * math.log(beta))


def _per_leaf(fn, n_out, grads, params, *states):
    """fn(g, p, *state leaves) -> n_out values, leaf by leaf; n_out trees shaped like params.
    A state of None gives None leaves (SGD without momentum keeps no buffers)."""
    pl, d = flatten(params)
    gl, gd = flatten(grads)
    if gd != d:
        raise ArgumentError(f"grads and params have different tree structures: {gd} and {d}")
    sl = [[None] * len(pl) if t is None else tree_leaves(t) for t in states]
    outs = [fn(g, p, *xs) for g, p, *xs in zip(gl, pl, *sl)]
    return tuple(d.unflatten([o[k] for o in outs]) for k in range(n_out))


# ---- gradient clipping ------------------------------------------------------------------------
def global_norm(tree):
    """sqrt(sum of squares of every element of every leaf), summed leaf by leaf in tree order."""
    total = None
    for g in tree_leaves(tree):
        s = op.sum(g * g)
        total = s if total is None else total + s
    if total is None:
        return np.zeros((), np.float32)
    return op.sqrt(total)


def clip_by_global_norm(grads, max_norm: float, eps: float = 1e-6):
    """(grads scaled by min(1, max_norm / (norm + eps)), norm), as torch.nn.utils.
    clip_grad_norm_ does: the direction is kept, the global norm becomes at most max_norm."""
    norm = global_norm(grads)
    coef = op.minimum(max_norm / (norm + eps), 1.0)
    return tree_map(lambda g: g * _scalar_as(coef, g), grads), norm


# ---- loss scaling --------------------------------------------------------------------------------
class LossScaler:
    """Loss scaling for low-precision training: multiply the loss by ``scale`` before
    differentiating, divide the gradients by it after.

    Static (``dynamic=False``): the scale never changes. Dynamic (PyTorch's GradScaler rule):
    on a step whose gradients hold an inf or a NaN the scale is multiplied by
    ``backoff_factor`` and the step should be skipped (``select``); after ``growth_interval``
    finite steps in a row it is multiplied by ``growth_factor``. The state is a pytree
    {"scale": f32[], "good_steps": i64[]} carried by the training step like the optimizer's:

        loss, grads = ts.value_and_grad(lambda p: scaler.scale(loss_fn(p), sstate))(params)
        grads = scaler.unscale(grads, sstate)
        ok = scaler.finite(grads)
        new_params, new_ostate = opt.update(grads, ostate, params)
        params, ostate = scaler.select(ok, (new_params, new_ostate), (params, ostate))
        sstate = scaler.update(sstate, ok)
    """

    def __init__(self, init_scale: float = 2.0 ** 16, dynamic: bool = True,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        if init_scale <= 0 or growth_factor < 1 or not 0 < backoff_factor <= 1 or \
                growth_interval < 1:
            raise ArgumentError("LossScaler needs init_scale > 0, growth_factor >= 1, "
                                "0 < backoff_factor <= 1 and growth_interval >= 1")
        self.init_scale, self.dynamic = float(init_scale), bool(dynamic)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)

    def init(self) -> dict:
        return {"scale": np.asarray(self.init_scale, np.float32),
                "good_steps": np.zeros((), np.int64)}

    def _scale(self, state):
        return self.init_scale if state is None else state["scale"]

    def scale(self, loss, state=None):
        return loss * _scalar_as(self._scale(state), loss)

    def unscale(self, grads, state=None):
        inv = 1.0 / self._scale(state)
        return tree_map(lambda g: g * _scalar_as(inv, g), grads)

    @staticmethod
    def finite(grads):
        """A bool 0-d tensor: every element of every gradient is finite. (g * 0 is 0 for a
        finite g and NaN for inf or NaN, and a sum holding one NaN is NaN.)"""
        total = None
        for g in tree_leaves(grads):
            s = op.sum(op.mul(g, 0.0))      # op.mul: quiet about inf * 0 when eager
            total = s if total is None else total + s
        return np.asarray(True) if total is None else total == 0.0

    def update(self, state, finite):
        """The next state after a step whose gradients were ``finite`` (or not)."""
        if not self.dynamic:
            return state
        good = op.where(finite, state["good_steps"] + 1, 0)
        grow = good >= self.growth_interval
        scale = op.where(finite, op.where(grow, state["scale"] * self.growth_factor,
                                          state["scale"]),
                         state["scale"] * self.backoff_factor)
        return {"scale": scale, "good_steps": op.where(grow, 0, good)}

    @staticmethod
    def select(finite, new, old):
        """``new`` where the step was finite, else ``old``, leaf by leaf (skips a bad step)."""
        return tree_map(lambda a, b: op.where(finite, a, b), new, old)


# The seeds' names of the fused optimizers: every optimizer here is one, as its update of each
# parameter is elementwise code that a compiled training step fuses into one kernel per parameter
FusedAdamW = AdamW
FusedSGD = SGD
