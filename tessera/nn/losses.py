"""Losses, each averaged over the batch (every axis but the class axis) unless
``reduction="sum"`` or ``"none"``."""
from __future__ import annotations

import numpy as np

from .. import op
from ..errors import ArgumentError
from .layers import _shape


def _reduce(x, reduction):
    if reduction == "mean":
        return op.mean(x)
    if reduction == "sum":
        return op.sum(x)
    if reduction == "none":
        return x
    raise ArgumentError(f"unknown reduction {reduction!r}", expected="mean, sum or none")


def _np_dtype(x) -> np.dtype:
    """The NumPy dtype of an array, a traced tensor (its tessera dtype's) or a list."""
    d = getattr(x, "dtype", None)
    return np.asarray(x).dtype if d is None else np.dtype(getattr(d, "np", d))


def cross_entropy(logits, labels, label_smoothing: float = 0.0, reduction: str = "mean"):
    """Softmax cross-entropy over the last axis of ``logits`` [..., C].

    ``labels``: integer classes [...] (then ``label_smoothing`` = e mixes the one-hot target
    with the uniform one, as PyTorch does: target = (1 - e) onehot + e / C), or probabilities
    [..., C]. Per example, with z the logits and t the target (summing to 1):
        loss = logsumexp(z) - sum_c t_c z_c
    which equals -sum_c t_c log_softmax(z)_c but needs no log of a probability, so it is finite
    for any finite logits (logsumexp subtracts the row's max first). The one-hot comes from an
    equality between the labels and an arange of the classes, with no gather."""
    shape = _shape(logits)
    c = shape[-1]
    if _np_dtype(labels).kind in "iu":
        e = float(label_smoothing)
        if not 0.0 <= e <= 1.0:
            raise ArgumentError(f"label_smoothing must be in [0, 1], not {e}")
        lab = op.expand_dims(labels, -1)
        hit = lab == np.arange(c, dtype=_np_dtype(labels))
        f = _np_dtype(logits)      # the weights in the logits' dtype (bare floats would be f64)
        target = op.where(hit, np.asarray(1.0 - e + e / c, f), np.asarray(e / c, f))
    else:
        target = labels
    picked = op.sum(target * logits, axis=-1)
    return _reduce(op.logsumexp(logits, axis=-1) - picked, reduction)


def mse(pred, target, reduction: str = "mean"):
    """mean((pred - target)^2) over every element."""
    d = pred - target
    return _reduce(d * d, reduction)


def kl_divergence(p, q, from_logits: bool = True, reduction: str = "mean"):
    """KL(P || Q) = sum_c P_c (log P_c - log Q_c) over the last axis, averaged over the rest.

    Argument order follows the mathematics: P is the reference ("true") distribution and Q the
    approximation, so kl_divergence(p, q) >= 0 and is 0 when they agree. With ``from_logits``
    (the default) p and q are logits (normalised here with log_softmax); otherwise they are
    log-probabilities. (PyTorch's F.kl_div(input, target) is KL(target || exp(input)): the
    order is swapped there, and its input is already a log-probability.)"""
    lp = op.log_softmax(p, axis=-1) if from_logits else p
    lq = op.log_softmax(q, axis=-1) if from_logits else q
    # P_c = 0 contributes 0 (the limit), not 0 * -inf = nan
    per = op.sum(op.where(op.eq(lp, -np.inf), 0.0, op.mul(op.exp(lp), op.sub(lp, lq))), axis=-1)
    return _reduce(per, reduction)
