"""Distributions whose densities are tessera operators: ``log_prob`` runs eagerly on arrays and
traces into a tessera function (so a model's log joint and its gradient compile like anything
else), with ``mean``, ``variance``, ``support`` and ``sample``.

Parameters are numbers, arrays or traced tensors and broadcast together (the batch shape); a
value's log density is elementwise over it. The log-gamma terms (the normalising constants of
Gamma, Beta, StudentT, Dirichlet, and Poisson's log k!) are exact (``math.lgamma``) for
parameters known when tracing (constants, data) and ``op.lgamma`` for traced ones, so a
concentration or a degree of freedom may itself be a site that NUTS or SVI infers.

Sampling is counter-based and needs a seed: the reparameterisable distributions (Normal,
LogNormal, HalfNormal, Cauchy, HalfCauchy, Exponential, Uniform, MultivariateNormal) transform
``op.random_uniform`` numbers, so a draw is the same on every target and thread count, compiled
or eager, and gradients flow through it; the others (Gamma, Beta, StudentT, Dirichlet, Poisson,
Bernoulli, Categorical) draw eagerly from NumPy's counter-based Philox generator keyed by the
seed (the same draws on every machine with the same NumPy).
"""
from __future__ import annotations

import math

import numpy as np

from .. import op
from ..errors import ArgumentError, TesseraError
from ..trace import Traced, dtype_of, user_location

LOG_2PI = math.log(2 * math.pi)


# ---- supports and their bijections to unconstrained space ------------------------------------
class Constraint:
    """A support: ``check(value)`` (a bool tensor), and the bijection from the real line
    (``to_constrained``, ``to_unconstrained``, ``log_abs_det_jacobian`` of to_constrained at
    the unconstrained point), which inference samples through."""
    name = "real"

    def check(self, x):
        return x == x                                 # (every number but NaN)

    def to_constrained(self, u):
        return u

    def to_unconstrained(self, x):
        return x

    def log_abs_det_jacobian(self, u):
        return op.mul(u, 0.0)

    def __repr__(self):
        return self.name


class _Positive(Constraint):
    name = "positive"

    def check(self, x):
        return x > 0

    def to_constrained(self, u):
        return op.exp(u)

    def to_unconstrained(self, x):
        return op.log(x)

    def log_abs_det_jacobian(self, u):
        return u


class _Interval(Constraint):
    def __init__(self, lo, hi):
        self.lo, self.hi = lo, hi
        self.name = f"interval({lo}, {hi})"

    def check(self, x):
        return op.minimum(x > self.lo, x < self.hi)

    def to_constrained(self, u):
        return self.lo + (self.hi - self.lo) * op.sigmoid(u)

    def to_unconstrained(self, x):
        p = (x - self.lo) / (self.hi - self.lo)
        return op.log(p) - op.log(1 - p)

    def log_abs_det_jacobian(self, u):
        # log((hi - lo) * s * (1 - s)) with s = sigmoid(u), written to stay finite for big |u|
        return op.log(self.hi - self.lo) - op.softplus(u) - op.softplus(-u)


class _Discrete(Constraint):
    def __init__(self, name, check):
        self.name, self._check = name, check

    def check(self, x):
        return self._check(x)

    def to_constrained(self, u):
        raise TesseraError(f"a {self.name} site is discrete: it has no unconstrained form",
                           hint="observe it, or marginalise it out")

    to_unconstrained = log_abs_det_jacobian = to_constrained


class _Simplex(Constraint):
    """Vectors of positive entries summing to 1 along the last axis; the bijection is the
    additive log-ratio: the last entry's log fixed at 0 (K-1 free coordinates)."""
    name = "simplex"

    def check(self, x):
        return op.minimum(op.min(x, axis=-1) >= 0, op.abs(op.sum(x, axis=-1) - 1) < 1e-6)

    def to_constrained(self, u):
        zeros = op.mul(op.slice(u, starts=[None] * (len(_shape(u)) - 1) + [0],
                                stops=[None] * (len(_shape(u)) - 1) + [1],
                                steps=[1] * len(_shape(u))), 0.0)
        return op.softmax(op.concat([u, zeros], axis=-1), axis=-1)

    def to_unconstrained(self, x):
        logs = op.log(x)
        rank = len(_shape(x))
        last = op.slice(logs, starts=[None] * (rank - 1) + [-1], stops=[None] * rank,
                        steps=[1] * rank)
        return op.slice(logs - last, starts=[None] * rank,
                        stops=[None] * (rank - 1) + [-1], steps=[1] * rank)

    def log_abs_det_jacobian(self, u):
        # the softmax onto the first K-1 coordinates: the log of prod(p_i), i = 1..K
        full = self.to_constrained(u)
        return op.sum(op.log(full), axis=-1)


real = Constraint()
positive = _Positive()
unit_interval = _Interval(0.0, 1.0)
simplex = _Simplex()
boolean = _Discrete("boolean", lambda x: op.maximum(x == 0, x == 1))
nonnegative_integer = _Discrete("nonnegative_integer",
                                lambda x: op.minimum(x >= 0, op.floor(x) == x))


class _Condition(Constraint):
    """A condition a parameter must meet (validation only: not a support to sample through)."""
    def __init__(self, name, check):
        self.name, self._check = name, check

    def check(self, x):
        return self._check(x)


nonnegative = _Condition("nonnegative", lambda x: x >= 0)
probability = _Condition("in [0, 1]", lambda x: op.minimum(x >= 0, x <= 1))


def interval(lo, hi) -> Constraint:
    return _Interval(lo, hi)


def integer_interval(lo, hi) -> Constraint:
    return _Discrete(f"integer_interval({lo}, {hi})",
                     lambda x: op.minimum(op.minimum(x >= lo, x <= hi), op.floor(x) == x))


# ---- helpers ---------------------------------------------------------------------------------
def _shape(x) -> tuple:
    return tuple(x.shape) if hasattr(x, "shape") else ()


def _known(x, what: str):
    """A parameter needed as a number (to draw from): an array, or an error."""
    if isinstance(x, Traced):
        raise TesseraError(f"{what} must be known when tracing (a number or an array, not a "
                           "traced tensor): drawing from it runs in NumPy",
                           hint="give it as a constant, or observe the site")
    return np.asarray(x, dtype=np.float64)


_math_lgamma = np.vectorize(math.lgamma, otypes=[np.float64])


def _lgamma(x):
    """log Gamma: exact for a known array, ``op.lgamma`` for a traced tensor."""
    return op.lgamma(x) if isinstance(x, Traced) else _math_lgamma(np.asarray(x, np.float64))


def _float(x):
    """A parameter as it enters the density: a traced tensor, or a float array."""
    if isinstance(x, Traced):
        return x
    a = np.asarray(x)
    return a if a.dtype.kind == "f" else a.astype(np.float32 if a.dtype.kind in "biu" and
                                                  a.dtype.itemsize <= 4 else np.float64)


def _uniform(shape, seed, offset=0):
    """Uniform (0, 1) numbers: op.random_uniform's [0, 1) moved off 0 by half a step."""
    u = op.random_uniform(list(shape), seed, offset=offset, dtype="float64")
    return op.maximum(u, 2.0 ** -54)


def _normal(shape, seed, offset=0):
    """Standard normal numbers by Box-Muller from two counter-based uniform streams."""
    n = int(np.prod(shape, dtype=np.int64))
    u1, u2 = _uniform(shape, seed, offset), _uniform(shape, seed, offset + n)
    return op.sqrt(-2.0 * op.log(u1)) * op.cos(2 * math.pi * u2)


def _numpy_rng(seed):
    if isinstance(seed, Traced):
        raise TesseraError("this distribution draws eagerly (NumPy's Philox): give the seed as "
                           "an int, outside a traced function")
    return np.random.Generator(np.random.Philox(key=int(seed)))


# ---- distributions ---------------------------------------------------------------------------
class Distribution:
    """A distribution over values of ``batch_shape + event_shape``; ``log_prob`` sums over the
    event axes only (a vector for MultivariateNormal and Dirichlet)."""
    support: Constraint = real
    arg_constraints: dict = {}      # parameter -> the Constraint its values must meet
    reparameterized = False
    event_rank = 0

    def __class_getitem__(cls, item):
        """``Distribution[Tensor["B", "D"]]``: the seeds' annotation of a model's result (the
        class itself: what the tensor's shape will be is the distribution's to say)."""
        return cls

    def __init__(self, shape=None, **params):
        self.params = {k: _float(v) for k, v in params.items()}
        for k, v in self.params.items():
            setattr(self, k, v)
        self._validate()
        shapes = [_shape(v) for v in self.params.values()]
        event = [s[len(s) - self.event_rank:] if self.event_rank else () for s in shapes]
        batch = np.broadcast_shapes(*[s[:len(s) - self.event_rank] for s in shapes]) \
            if shapes else ()
        self.event_shape = tuple(max(event, key=len)) if event else ()
        self.batch_shape = tuple(np.broadcast_shapes(batch, tuple(shape))) if shape is not None \
            else tuple(batch)

    def _validate(self):
        """Parameters known now (not traced) meet their constraints, as PyTorch checks by
        default: HalfCauchy(-1.0) is an error at the user's line, not a NaN log_prob later."""
        for name, c in self.arg_constraints.items():
            v = self.params.get(name)
            if v is None or isinstance(v, Traced):
                continue
            ok = np.broadcast_to(np.asarray(c.check(v), dtype=bool), np.shape(v))
            if not ok.all():
                bad = np.asarray(v)[~ok].ravel()[:3]
                raise ArgumentError(f"{type(self).__name__}'s {name} must be {c.name}",
                                    location=user_location(), expected=c.name,
                                    received=", ".join(map(str, bad.tolist())) +
                                    (", ..." if (~ok).sum() > 3 else ""))

    @property
    def shape(self) -> tuple:
        return self.batch_shape + self.event_shape

    def sample(self, seed, sample_shape=()):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}(batch_shape={self.batch_shape}" + \
            (f", event_shape={self.event_shape}" if self.event_shape else "") + ")"

    def _expand(self, x, sample_shape=()):
        return op.broadcast_to(x, shape=list(sample_shape) + list(self.shape))


class Normal(Distribution):
    reparameterized = True

    arg_constraints = {"loc": real, "scale": positive}
    def __init__(self, loc=0.0, scale=1.0, shape=None):
        super().__init__(shape, loc=loc, scale=scale)

    def log_prob(self, x):
        z = (x - self.loc) / self.scale
        return -0.5 * z * z - op.log(self.scale) - 0.5 * LOG_2PI

    @property
    def mean(self):
        return self._expand(self.loc)

    @property
    def variance(self):
        return self._expand(self.scale * self.scale)

    def sample(self, seed, sample_shape=(), offset=0):
        shape = tuple(sample_shape) + self.shape
        return self.loc + self.scale * _normal(shape, seed, offset)


class LogNormal(Distribution):
    support = positive
    reparameterized = True

    arg_constraints = {"loc": real, "scale": positive}
    def __init__(self, loc=0.0, scale=1.0, shape=None):
        super().__init__(shape, loc=loc, scale=scale)

    def log_prob(self, x):
        return Normal(self.loc, self.scale).log_prob(op.log(x)) - op.log(x)

    @property
    def mean(self):
        return self._expand(op.exp(self.loc + self.scale * self.scale / 2))

    @property
    def variance(self):
        s2 = self.scale * self.scale
        return self._expand((op.exp(s2) - 1) * op.exp(2 * self.loc + s2))

    def sample(self, seed, sample_shape=(), offset=0):
        return op.exp(Normal(self.loc, self.scale, self.batch_shape).sample(
            seed, sample_shape, offset))


class HalfNormal(Distribution):
    support = positive
    reparameterized = True

    arg_constraints = {"scale": positive}
    def __init__(self, scale=1.0, shape=None):
        super().__init__(shape, scale=scale)

    def log_prob(self, x):
        return Normal(0.0, self.scale).log_prob(x) + math.log(2)

    @property
    def mean(self):
        return self._expand(self.scale * math.sqrt(2 / math.pi))

    @property
    def variance(self):
        return self._expand(self.scale * self.scale * (1 - 2 / math.pi))

    def sample(self, seed, sample_shape=(), offset=0):
        return op.abs(Normal(0.0, self.scale, self.batch_shape).sample(seed, sample_shape,
                                                                       offset))


class Cauchy(Distribution):
    reparameterized = True

    arg_constraints = {"loc": real, "scale": positive}
    def __init__(self, loc=0.0, scale=1.0, shape=None):
        super().__init__(shape, loc=loc, scale=scale)

    def log_prob(self, x):
        z = (x - self.loc) / self.scale
        return -math.log(math.pi) - op.log(self.scale) - op.log(1 + z * z)

    mean = property(lambda self: self._expand(np.nan + 0 * self.loc))
    variance = property(lambda self: self._expand(np.inf + 0 * self.scale))

    def sample(self, seed, sample_shape=(), offset=0):
        u = _uniform(tuple(sample_shape) + self.shape, seed, offset)
        return self.loc + self.scale * op.sin(math.pi * (u - 0.5)) / op.cos(math.pi * (u - 0.5))


class HalfCauchy(Distribution):
    support = positive
    reparameterized = True

    arg_constraints = {"scale": positive}
    def __init__(self, scale=1.0, shape=None):
        super().__init__(shape, scale=scale)

    def log_prob(self, x):
        return Cauchy(0.0, self.scale).log_prob(x) + math.log(2)

    mean = property(lambda self: self._expand(np.inf + 0 * self.scale))
    variance = property(lambda self: self._expand(np.inf + 0 * self.scale))

    def sample(self, seed, sample_shape=(), offset=0):
        return op.abs(Cauchy(0.0, self.scale, self.batch_shape).sample(seed, sample_shape,
                                                                       offset))


class Exponential(Distribution):
    support = positive
    reparameterized = True

    arg_constraints = {"rate": positive}
    def __init__(self, rate=1.0, shape=None):
        super().__init__(shape, rate=rate)

    def log_prob(self, x):
        return op.log(self.rate) - self.rate * x

    mean = property(lambda self: self._expand(1 / self.rate))
    variance = property(lambda self: self._expand(1 / (self.rate * self.rate)))

    def sample(self, seed, sample_shape=(), offset=0):
        return -op.log(_uniform(tuple(sample_shape) + self.shape, seed, offset)) / self.rate


class Uniform(Distribution):
    reparameterized = True

    arg_constraints = {"low": real, "high": real}
    def __init__(self, low=0.0, high=1.0, shape=None):
        super().__init__(shape, low=low, high=high)
        known = not isinstance(self.low, Traced) and not isinstance(self.high, Traced)
        if known and not np.all(np.asarray(self.low) < np.asarray(self.high)):
            raise ArgumentError("Uniform's low must be below its high", location=user_location(),
                                expected="low < high", received=f"{low}, {high}")
        if known and np.ndim(self.low) == 0 and np.ndim(self.high) == 0:
            self.support = interval(float(self.low), float(self.high))

    def log_prob(self, x):
        inside = op.minimum(x >= self.low, x < self.high)
        return op.where(inside, -op.log(self.high - self.low), -np.inf)

    mean = property(lambda self: self._expand((self.low + self.high) / 2))
    variance = property(lambda self: self._expand((self.high - self.low) ** 2 / 12))

    def sample(self, seed, sample_shape=(), offset=0):
        u = _uniform(tuple(sample_shape) + self.shape, seed, offset)
        return self.low + (self.high - self.low) * u


class Gamma(Distribution):
    """Gamma(concentration, rate): density rate^a x^(a-1) e^(-rate x) / Gamma(a)."""
    support = positive

    arg_constraints = {"concentration": positive, "rate": positive}
    def __init__(self, concentration, rate=1.0, shape=None):
        super().__init__(shape, concentration=concentration, rate=rate)

    def log_prob(self, x):
        a = self.concentration
        norm = _lgamma(a)
        return a * op.log(self.rate) + (a - 1) * op.log(x) - self.rate * x - norm

    mean = property(lambda self: self._expand(self.concentration / self.rate))
    variance = property(lambda self: self._expand(self.concentration / self.rate ** 2))

    def sample(self, seed, sample_shape=()):
        a, r = (_known(v, "a parameter drawn from") for v in (self.concentration, self.rate))
        shape = tuple(sample_shape) + self.shape
        return _numpy_rng(seed).gamma(np.broadcast_to(a, shape), 1.0, shape) / r


class Beta(Distribution):
    support = unit_interval

    arg_constraints = {"concentration1": positive, "concentration0": positive}
    def __init__(self, concentration1, concentration0, shape=None):
        super().__init__(shape, concentration1=concentration1, concentration0=concentration0)

    def log_prob(self, x):
        a, b = self.concentration1, self.concentration0
        lbeta = _lgamma(a) + _lgamma(b) - _lgamma(a + b)
        return (a - 1) * op.log(x) + (b - 1) * op.log(1 - x) - lbeta

    @property
    def mean(self):
        return self._expand(self.concentration1 / (self.concentration1 + self.concentration0))

    @property
    def variance(self):
        a, b = self.concentration1, self.concentration0
        return self._expand(a * b / ((a + b) ** 2 * (a + b + 1)))

    def sample(self, seed, sample_shape=()):
        a = _known(self.concentration1, "a parameter drawn from")
        b = _known(self.concentration0, "a parameter drawn from")
        shape = tuple(sample_shape) + self.shape
        return _numpy_rng(seed).beta(np.broadcast_to(a, shape), np.broadcast_to(b, shape))


class StudentT(Distribution):
    arg_constraints = {"df": positive, "loc": real, "scale": positive}
    def __init__(self, df, loc=0.0, scale=1.0, shape=None):
        super().__init__(shape, df=df, loc=loc, scale=scale)

    def log_prob(self, x):
        v = self.df
        norm = _lgamma((v + 1) / 2) - _lgamma(v / 2) - 0.5 * op.log(v * np.pi)
        z = (x - self.loc) / self.scale
        return norm - op.log(self.scale) - (self.df + 1) / 2 * op.log(1 + z * z / self.df)

    @property
    def mean(self):
        return self._expand(op.where(self.df > 1, self.loc + 0 * self.df, np.nan))

    @property
    def variance(self):
        v = self.df
        return self._expand(op.where(v > 2, self.scale ** 2 * v / (v - 2),
                                     op.where(v > 1, np.inf, np.nan)))

    def sample(self, seed, sample_shape=()):
        v = _known(self.df, "a parameter drawn from")
        shape = tuple(sample_shape) + self.shape
        return np.asarray(self.loc) + np.asarray(self.scale) * \
            _numpy_rng(seed).standard_t(np.broadcast_to(v, shape), shape)


class Bernoulli(Distribution):
    support = boolean

    arg_constraints = {"probs": probability, "logits": real}
    def __init__(self, probs=None, logits=None, shape=None):
        if (probs is None) == (logits is None):
            raise ArgumentError("Bernoulli takes probs or logits, one of them")
        if logits is not None:
            super().__init__(shape, logits=logits)
        else:
            super().__init__(shape, probs=probs)

    def _logits(self):
        if "logits" in self.params:
            return self.logits
        return op.log(self.probs) - op.log(1 - self.probs)

    def log_prob(self, x):
        s = self._logits()                          # x log p + (1-x) log(1-p), stably
        return x * s - op.softplus(s)

    @property
    def mean(self):
        return self._expand(op.sigmoid(self._logits()))

    @property
    def variance(self):
        p = op.sigmoid(self._logits())
        return self._expand(p * (1 - p))

    def sample(self, seed, sample_shape=()):
        p = np.asarray(op.sigmoid(self._logits()))
        shape = tuple(sample_shape) + self.shape
        return (_numpy_rng(seed).random(shape) < p).astype(np.float32)


class Categorical(Distribution):
    """Over 0..K-1 along the last axis of probs or logits."""

    arg_constraints = {"probs": nonnegative, "logits": real}
    def __init__(self, probs=None, logits=None, shape=None):
        if (probs is None) == (logits is None):
            raise ArgumentError("Categorical takes probs or logits, one of them")
        super().__init__(None, **({"logits": logits} if logits is not None else
                                   {"probs": probs}))
        table = self.logits if "logits" in self.params else self.probs
        self.num_categories = _shape(table)[-1]
        self.batch_shape = _shape(table)[:-1] if shape is None else tuple(
            np.broadcast_shapes(_shape(table)[:-1], tuple(shape)))
        self.event_shape = ()
        self.support = integer_interval(0, self.num_categories - 1)

    def _log_probs(self):
        if "logits" in self.params:
            return op.log_softmax(self.logits, axis=-1)
        return op.log(self.probs / op.sum(self.probs, axis=-1, keepdim=True))

    def log_prob(self, x):
        table = op.broadcast_to(self._log_probs(),
                                shape=list(np.broadcast_shapes(_shape(x), self.batch_shape)) +
                                [self.num_categories])
        idx = op.expand_dims(op.cast(op.broadcast_to(x, shape=list(_shape(table)[:-1])),
                                     "int64"), axis=-1)
        return op.squeeze(op.take_along_axis(table, idx, axis=-1), axis=-1)

    @property
    def mean(self):
        p = op.exp(self._log_probs())
        return op.sum(p * np.arange(self.num_categories), axis=-1)

    @property
    def variance(self):
        p = op.exp(self._log_probs())
        k = np.arange(self.num_categories)
        m = op.sum(p * k, axis=-1, keepdim=True)
        return op.sum(p * (k - m) ** 2, axis=-1)

    def sample(self, seed, sample_shape=()):
        p = np.exp(np.asarray(self._log_probs(), np.float64))
        shape = tuple(sample_shape) + self.batch_shape
        u = _numpy_rng(seed).random(shape + (1,))
        return (np.cumsum(np.broadcast_to(p, shape + p.shape[-1:]), axis=-1) < u).sum(-1) \
            .clip(0, self.num_categories - 1).astype(np.int64)


class Poisson(Distribution):
    support = nonnegative_integer

    arg_constraints = {"rate": nonnegative}
    def __init__(self, rate, shape=None):
        super().__init__(shape, rate=rate)

    def log_prob(self, x):
        return x * op.log(self.rate) - self.rate - _lgamma(x + 1)

    mean = property(lambda self: self._expand(self.rate))
    variance = property(lambda self: self._expand(self.rate))

    def sample(self, seed, sample_shape=()):
        r = _known(self.rate, "a parameter drawn from")
        shape = tuple(sample_shape) + self.shape
        return _numpy_rng(seed).poisson(np.broadcast_to(r, shape)).astype(np.float64)


class Dirichlet(Distribution):
    support = simplex
    event_rank = 1

    arg_constraints = {"concentration": positive}
    def __init__(self, concentration, shape=None):
        super().__init__(shape, concentration=concentration)

    def log_prob(self, x):
        a = self.concentration
        norm = op.sum(_lgamma(a), axis=-1) - _lgamma(op.sum(a, axis=-1))
        return op.sum((a - 1) * op.log(x), axis=-1) - norm

    @property
    def mean(self):
        a = self.concentration
        return self._expand(a / op.sum(a, axis=-1, keepdim=True))

    @property
    def variance(self):
        a = self.concentration
        a0 = op.sum(a, axis=-1, keepdim=True)
        return self._expand(a * (a0 - a) / (a0 * a0 * (a0 + 1)))

    def sample(self, seed, sample_shape=()):
        a = _known(self.concentration, "a parameter drawn from")
        shape = tuple(sample_shape) + self.shape
        g = _numpy_rng(seed).gamma(np.broadcast_to(a, shape), 1.0, shape)
        return g / g.sum(-1, keepdims=True)


class MultivariateNormal(Distribution):
    """N(loc, covariance) through its Cholesky factor (``scale_tril``, or computed from
    ``covariance_matrix`` by NumPy): known when tracing, so the whitening is one matmul with
    its inverse, and log det the sum of the log diagonal."""
    reparameterized = True
    event_rank = 1

    arg_constraints = {"loc": real}
    def __init__(self, loc, covariance_matrix=None, scale_tril=None):
        if (covariance_matrix is None) == (scale_tril is None):
            raise ArgumentError("MultivariateNormal takes covariance_matrix or scale_tril, one "
                                "of them")
        if scale_tril is None:
            cov = _known(covariance_matrix, "MultivariateNormal's covariance")
            try:
                scale_tril = np.linalg.cholesky(cov)
            except np.linalg.LinAlgError:
                raise ArgumentError("MultivariateNormal's covariance is not positive "
                                    "definite") from None
        L = _known(scale_tril, "MultivariateNormal's scale_tril")
        diag = np.diagonal(L, axis1=-2, axis2=-1) if L.ndim >= 2 else None
        if diag is None or L.shape[-1] != L.shape[-2] or np.any(np.triu(L, 1) != 0) or \
                not np.all(diag > 0):
            raise ArgumentError("MultivariateNormal's scale_tril must be lower triangular with a "
                                "positive diagonal (a Cholesky factor)", location=user_location(),
                                received=f"shape {L.shape}")
        super().__init__(None, loc=loc)
        self.scale_tril = L
        self.event_shape = (L.shape[-1],)
        self.batch_shape = tuple(np.broadcast_shapes(_shape(self.loc)[:-1], L.shape[:-2]))
        self._inv = np.linalg.inv(L).swapaxes(-1, -2)          # x @ L^-T whitens rows
        self._log_det = np.log(np.abs(np.diagonal(L, axis1=-2, axis2=-1))).sum(-1)

    def log_prob(self, x):
        d = self.event_shape[0]
        diff = x - self.loc
        inv = self._inv.astype(np.dtype(dtype_of(diff).np)) if dtype_of(diff).is_float \
            else self._inv
        z = op.matmul(op.expand_dims(diff, axis=-2), inv) if self._inv.ndim > 2 else \
            op.matmul(diff, inv)
        if self._inv.ndim > 2:
            z = op.squeeze(z, axis=-2)
        return -0.5 * op.sum(z * z, axis=-1) - self._log_det - 0.5 * d * LOG_2PI

    @property
    def mean(self):
        return self._expand(self.loc)

    @property
    def variance(self):
        return self._expand(np.sum(self.scale_tril ** 2, axis=-1))

    @property
    def covariance_matrix(self):
        return self.scale_tril @ self.scale_tril.swapaxes(-1, -2)

    def sample(self, seed, sample_shape=(), offset=0):
        eps = _normal(tuple(sample_shape) + self.shape, seed, offset)
        Lt = self.scale_tril.swapaxes(-1, -2)
        z = op.matmul(op.expand_dims(eps, axis=-2), Lt) if Lt.ndim > 2 else op.matmul(eps, Lt)
        return self.loc + (op.squeeze(z, axis=-2) if Lt.ndim > 2 else z)


__all__ = ["Distribution", "Normal", "LogNormal", "HalfNormal", "Cauchy", "HalfCauchy",
           "Exponential", "Uniform", "Gamma", "Beta", "StudentT", "Bernoulli", "Categorical",
           "Poisson", "Dirichlet", "MultivariateNormal", "Constraint", "real", "positive",
           "unit_interval", "simplex", "boolean", "nonnegative_integer", "interval",
           "integer_interval"]
