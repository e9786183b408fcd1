"""Stochastic variational inference: ``SVI(model, guide, optim, loss=Trace_ELBO(n))``.

    guide = AutoNormal(model)                    # or AutoMultivariateNormal(model)
    svi = SVI(model, guide, ts.optim.Adam(1e-2), loss=Trace_ELBO(num_particles=10))
    result = svi.run(0, 2000, X, y)              # params, the losses
    guide.median(result.params)                  # site values at the guide's centre
    guide.sample_posterior(1, result.params, 500)

A guide is a reparameterised Gaussian in the model's unconstrained space (the same supports and
bijections as MCMC): each draw is loc + scale * eps (mean field) or loc + L eps (a full lower-
triangular L), mapped onto the supports. The ELBO, its particles and the guide's draws are
tessera operators with counter-based noise keyed by the step's seed, so one SVI step (the
loss, its gradient by ``ts.value_and_grad`` and the optimizer's update) is one compiled
function, and a run repeats bit for bit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import op
from ..autodiff import value_and_grad
from ..control import scan
from ..errors import TesseraError
from ..function import function
from .distributions import Distribution, Normal, _normal
from .handlers import log_joint
from .infer import SiteLayout

LOG_2PI = math.log(2 * math.pi)


class _AutoGuide:
    """What both guides share: the model's unobserved sites in one flat unconstrained vector
    (infer.SiteLayout, as MCMC has them)."""
    def __init__(self, model, init_scale=0.1):
        self.model, self.init_scale = model, float(init_scale)
        self.layout = None

    def _setup(self, args, kwargs):
        if self.layout is None:
            self.layout = SiteLayout(self.model, args, kwargs)
            self.dim = self.layout.dim

    def _values(self, z):
        return self.layout.values(z)

    def _draw(self, params, seed, offset):
        """(site values, log q of them): one reparameterised draw."""
        eps = _normal((self.dim,), seed, offset)
        z, log_q = self._transform(params, eps)
        values, jac = self._values(z)
        return values, log_q - jac

    def median(self, params) -> dict:
        """Site values at the guide's centre (its loc, mapped onto the supports)."""
        values, _ = self._values(np.asarray(params["loc"], np.float64))
        return {k: np.asarray(v) for k, v in values.items()}

    def sample_posterior(self, seed, params, num_samples) -> dict:
        """`num_samples` draws of every site from the fitted guide: {name: (n, *shape)}."""
        draws = [self._draw(params, seed, k << 32)[0] for k in range(num_samples)]
        return {k: np.asarray([np.asarray(d[k]) for d in draws]) for k in draws[0]}


class AutoNormal(_AutoGuide):
    """A mean-field Gaussian: params {"loc", "log_scale"} over the flat unconstrained vector."""

    def init(self, args, kwargs):
        self._setup(args, kwargs)
        return {"loc": np.zeros(self.dim), "log_scale": np.full(self.dim,
                                                                math.log(self.init_scale))}

    def _transform(self, params, eps):
        scale = op.exp(params["log_scale"])
        z = params["loc"] + scale * eps
        log_q = op.sum(-0.5 * eps * eps - params["log_scale"]) - 0.5 * self.dim * LOG_2PI
        return z, log_q

    def scale(self, params):
        return np.exp(np.asarray(params["log_scale"]))


class AutoMultivariateNormal(_AutoGuide):
    """A full-covariance Gaussian: params {"loc", "tril"}; L is tril's strictly lower part
    plus exp of its diagonal (so L stays a Cholesky factor)."""

    def init(self, args, kwargs):
        self._setup(args, kwargs)
        d = self.dim
        return {"loc": np.zeros(d), "tril": np.eye(d) * math.log(self.init_scale)}

    def _factor(self, tril):
        d = self.dim
        lower = np.tril(np.ones((d, d)), -1).astype(bool)
        diag = np.eye(d, dtype=bool)
        return op.where(lower, tril, op.where(diag, op.exp(tril), 0.0))

    def _transform(self, params, eps):
        L = self._factor(params["tril"])
        z = params["loc"] + op.matmul(L, eps)
        log_det = op.sum(op.where(np.eye(self.dim, dtype=bool), params["tril"], 0.0))
        log_q = -0.5 * op.sum(eps * eps) - log_det - 0.5 * self.dim * LOG_2PI
        return z, log_q

    def covariance(self, params):
        L = np.asarray(self._factor(np.asarray(params["tril"], np.float64)))
        return L @ L.T


@dataclass
class Trace_ELBO:
    """The evidence lower bound's estimate from `num_particles` reparameterised draws of the
    guide; the loss is its negative."""
    num_particles: int = 1

    def loss(self, model, guide, params, seed, args, kwargs):
        total = None
        for k in range(self.num_particles):
            values, log_q = guide._draw(params, seed, k << 32)
            elbo = log_joint(model, values, *args, **kwargs) - log_q
            total = elbo if total is None else total + elbo
        return -total / self.num_particles


RUN_CHUNK = 100     # the steps `SVI.run` takes per compiled call


@dataclass
class SVIResult:
    params: dict
    losses: np.ndarray
    state: object = None


class SVI:
    """``init(seed, *args)`` -> state, ``update(state, *args)`` -> (state, loss), ``run(seed,
    num_steps, *args)`` -> SVIResult. One step is one compiled tessera function."""

    def __init__(self, model, guide, optim, loss=None):
        self.model, self.guide, self.optim = model, guide, optim
        self.loss = loss or Trace_ELBO()
        self._steps = {}

    def init(self, seed, *args, **kwargs):
        params = self.guide.init(args, kwargs)
        return {"params": params, "opt": self.optim.init(params),
                "seed": np.asarray((int(seed) << 20) % (1 << 62), np.int64)}

    def _step_fns(self, args, kwargs):
        """(one step, RUN_CHUNK steps in a compiled loop stacking the losses), compiled
        functions of (params, optimiser state, seed)."""
        # the data are constants of the step (exact log-gamma terms, folded): one compiled
        # step per set of data objects, kept with them (so their ids stay theirs)
        key = tuple(map(id, args)), tuple((k, id(v)) for k, v in sorted(kwargs.items()))
        if key not in self._steps:
            def step(params, opt_state, seed):
                def loss(p):
                    return self.loss.loss(self.model, self.guide, p, seed, args, kwargs)
                value, grads = value_and_grad(loss)(params)
                new_params, new_opt = self.optim.update(grads, opt_state, params)
                return new_params, new_opt, value

            def steps(params, opt_state, seed):
                def body(carry, _):
                    p, o, k = carry
                    p, o, value = step(p, o, k)
                    return (p, o, k + 1), value
                (p, o, _), losses = scan(body, (params, opt_state, seed),
                                         np.zeros(RUN_CHUNK))
                return p, o, losses
            self._steps = {key: (function(step, name="svi_step"),
                                 function(steps, name="svi_steps"), args, kwargs)}
        return self._steps[key][:2]

    def update(self, state, *args, **kwargs):
        step = self._step_fns(args, kwargs)[0]
        params, opt, value = step(state["params"], state["opt"], state["seed"])
        return {"params": params, "opt": opt, "seed": state["seed"] + 1}, float(value)

    def evaluate(self, state, *args, **kwargs) -> float:
        """The loss at the state's parameters (its next seed's particles)."""
        return float(self.loss.loss(self.model, self.guide, state["params"], state["seed"],
                                    args, kwargs))

    def run(self, seed, num_steps, *args, **kwargs) -> SVIResult:
        """num_steps updates from `init(seed)`: RUN_CHUNK at a time in one compiled loop, the
        rest one call each (the same steps, the same bits as calling `update`)."""
        state = self.init(seed, *args, **kwargs)
        losses = np.empty(num_steps)
        chunked = self._step_fns(args, kwargs)[1]
        done = 0
        while num_steps - done >= RUN_CHUNK:
            params, opt, losses[done:done + RUN_CHUNK] = chunked(
                state["params"], state["opt"], state["seed"])
            state = {"params": params, "opt": opt, "seed": state["seed"] + RUN_CHUNK}
            done += RUN_CHUNK
        for i in range(done, num_steps):
            state, losses[i] = self.update(state, *args, **kwargs)
        return SVIResult({k: np.asarray(v) for k, v in state["params"].items()}, losses, state)


# ---- amortised inference: the seeds' @tessera.variational and an ELBO of an encoder/decoder ----
def kl_divergence(q, p):
    """KL(q || p) per element, in closed form: Normal against Normal (shapes broadcast)."""
    if isinstance(q, Normal) and isinstance(p, Normal):
        ratio = q.scale / p.scale
        d = (q.loc - p.loc) / p.scale
        return 0.5 * (ratio * ratio + d * d - 1) - op.log(ratio)
    raise TesseraError(f"no closed-form KL({type(q).__name__} || {type(p).__name__}) yet",
                       hint="use Trace_ELBO, which estimates it by sampling")


class Variational:
    """``@ts.variational``: an encoder, (params, x) -> a reparameterised Distribution q(z | x),
    checked to be one (its draws must carry gradients back to the params)."""

    def __init__(self, fn):
        self.fn, self.__name__ = fn, getattr(fn, "__name__", "encoder")
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        q = self.fn(*args, **kwargs)
        if not isinstance(q, Distribution) or not q.reparameterized:
            raise TesseraError(f"{self.__name__} must return a reparameterised Distribution "
                               f"(Normal, LogNormal, ...), not {type(q).__name__}",
                               hint="the ELBO's gradient flows through its draws")
        return q

    def __repr__(self):
        return f"<variational encoder {self.__name__}>"


def variational(fn) -> Variational:
    return Variational(fn)


def elbo(encoder, prior=None, num_particles=1):
    """``@ts.elbo(encoder)`` on a decoder ``(params, z) -> Distribution over x`` gives the loss
    ``(params, x, seed) -> -ELBO``, averaged over the batch (the first axis): the decoder's log
    likelihood of x at `num_particles` reparameterised draws of z ~ encoder(params, x), minus
    the closed-form KL of the encoder's q from `prior` (default Normal(0, 1)), summed over the
    last (latent / data) axes. Tessera operators throughout: compile it, ``ts.grad`` it."""
    prior = prior if prior is not None else Normal(0.0, 1.0)

    def wrap(decoder):
        def neg_elbo(params, x, seed):
            q = encoder(params, x)
            kl = op.sum(kl_divergence(q, prior), axis=-1)
            loglik = None
            for k in range(num_particles):
                z = q.sample(seed, offset=k << 32)
                term = op.sum(decoder(params, z).log_prob(x), axis=-1)
                loglik = term if loglik is None else loglik + term
            return -op.mean(loglik / num_particles - kl)
        neg_elbo.__name__ = f"neg_elbo_{getattr(decoder, '__name__', 'decoder')}"
        return neg_elbo
    return wrap


__all__ = ["SVI", "Trace_ELBO", "AutoNormal", "AutoMultivariateNormal", "SVIResult",
           "kl_divergence", "variational", "Variational", "elbo"]
