"""Convergence diagnostics of MCMC draws (Vehtari, Gelman, Simpson, Carpenter and Bürkner 2021):
rank-normalised split R-hat, and bulk and tail effective sample sizes from autocorrelations
(Geyer's initial monotone sequence). ``draws``: an array (chains, draws) of one scalar."""
from __future__ import annotations

import math

import numpy as np


def _split(x: np.ndarray) -> np.ndarray:
    """Each chain's two halves as chains of their own (an odd middle draw dropped)."""
    n = x.shape[1] // 2
    return np.concatenate([x[:, :n], x[:, x.shape[1] - n:]], axis=0)


def _normal_quantile(p):
    """The standard normal's quantile function: sqrt(2) erfinv(2p - 1)."""
    p = np.asarray(p, np.float64)
    z = math.sqrt(2) * _erfinv(2 * p - 1)
    return z


def _erfinv(y):
    """Giles' single-precision approximation, refined by two Newton steps on math.erf."""
    y = np.asarray(y, np.float64)
    w = -np.log((1 - y) * (1 + y))
    small = w < 5
    w1, w2 = w - 2.5, np.sqrt(np.maximum(w, 5)) - 3
    p1 = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        p1 = c + p1 * w1
    p2 = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        p2 = c + p2 * w2
    x = np.where(small, p1, p2) * y
    erf = np.vectorize(math.erf, otypes=[np.float64])
    for _ in range(2):                       # Newton on erf(x) = y
        x = x - (erf(x) - y) / (2 / math.sqrt(math.pi) * np.exp(-x * x))
    return x


def _rank_normalize(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(-1)
    order = np.argsort(flat, kind="stable")
    ranks = np.empty(flat.size)
    ranks[order] = np.arange(1, flat.size + 1)
    # average ranks of ties
    _, inv, counts = np.unique(flat, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    ranks = (sums / counts)[inv]
    return _normal_quantile((ranks - 0.375) / (flat.size + 0.25)).reshape(x.shape)


def _rhat(x: np.ndarray) -> float:
    m, n = x.shape
    w = x.var(axis=1, ddof=1).mean()
    b = n * x.mean(axis=1).var(ddof=1)
    if w == 0:
        return float("nan")
    return float(math.sqrt(((n - 1) / n * w + b / n) / w))


def rhat(draws) -> float:
    """Rank-normalised split R-hat: the larger of the bulk's and the folded draws' (tails)."""
    x = _split(np.asarray(draws, np.float64))
    folded = np.abs(x - np.median(x))
    return max(_rhat(_rank_normalize(x)), _rhat(_rank_normalize(folded)))


def _ess(x: np.ndarray) -> float:
    m, n = x.shape
    if n < 4:
        return float("nan")
    centred = x - x.mean(axis=1, keepdims=True)
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(centred, size, axis=1)
    acov = np.fft.irfft(f * np.conj(f), size, axis=1)[:, :n] / n
    w = x.var(axis=1, ddof=1).mean()
    var_plus = (n - 1) / n * w + (x.mean(axis=1).var(ddof=1) if m > 1 else 0.0)
    if var_plus == 0:
        return float("nan")
    rho = 1 - (w - acov.mean(axis=0)) / var_plus
    rho[0] = 1.0
    # Geyer: sums of adjacent pairs while positive, made monotone
    total, prev, t = 0.0, float("inf"), 0
    while t + 1 < n:
        pair = rho[t] + rho[t + 1]
        if pair < 0:
            break
        pair = min(pair, prev)
        total += pair
        prev = pair
        t += 2
    tau = -1 + 2 * total
    return float(m * n / max(tau, 1 / math.log10(m * n)))


def ess_bulk(draws) -> float:
    return _ess(_rank_normalize(_split(np.asarray(draws, np.float64))))


def ess_mean(draws) -> float:
    """The effective sample size of the draws' mean, on their own scale (no rank normalisation):
    what an estimate of E[f] made from draws of f has, e.g. of a variance from squared deviations."""
    return _ess(_split(np.asarray(draws, np.float64)))


def ess_tail(draws) -> float:
    x = _split(np.asarray(draws, np.float64))
    lo, hi = np.quantile(x, [0.05, 0.95])
    return min(_ess((x <= lo).astype(np.float64)), _ess((x <= hi).astype(np.float64)))


__all__ = ["rhat", "ess_bulk", "ess_mean", "ess_tail"]
