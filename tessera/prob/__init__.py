"""Probabilistic programming on the compiler (the seeds' ``Distribution[Tensor[...]]``):
distributions whose log densities are tessera operators, and models written with ``sample``
statements, interpreted by effect handlers. ``W ~ Normal(...)`` is not Python: the seeds'
statement is ``W = sample("W", Normal(...))``.

    from tessera.prob import Normal, HalfCauchy, sample, seed, trace, log_joint

    def regression(X, y=None):
        w = sample("w", Normal(0.0, 1.0, shape=(X.shape[-1],)))
        sigma = sample("sigma", HalfCauchy(1.0))
        return sample("y", Normal(X @ w, sigma), obs=y)

    with seed(0), trace() as tr:              # prior draws, every site recorded
        regression(X)
    lp = ts.function(lambda w, s: log_joint(regression, {"w": w, "sigma": s}, X, y))

Inference (NUTS, HMC, SVI) builds on these: see the README's section.
"""
from .distributions import (Bernoulli, Beta, Categorical, Cauchy, Constraint, Dirichlet,
                            Distribution, Exponential, Gamma, HalfCauchy, HalfNormal, LogNormal,
                            MultivariateNormal, Normal, Poisson, StudentT, Uniform, boolean,
                            integer_interval, interval, nonnegative_integer, positive, real,
                            simplex, unit_interval)
from .handlers import (Handler, Model, condition, log_joint, probabilistic, sample, seed,
                       substitute, trace)
from .infer import Posterior, mcmc
from .svi import (SVI, AutoMultivariateNormal, AutoNormal, SVIResult, Trace_ELBO, Variational,
                  elbo, kl_divergence, variational)
from . import diagnostics

__all__ = ["Distribution", "Normal", "LogNormal", "HalfNormal", "Cauchy", "HalfCauchy",
           "Exponential", "Uniform", "Gamma", "Beta", "StudentT", "Bernoulli", "Categorical",
           "Poisson", "Dirichlet", "MultivariateNormal", "Constraint", "real", "positive",
           "unit_interval", "simplex", "boolean", "nonnegative_integer", "interval",
           "integer_interval", "sample", "trace", "seed", "substitute", "condition",
           "log_joint", "Handler", "mcmc", "Posterior", "diagnostics", "SVI", "Trace_ELBO",
           "AutoNormal", "AutoMultivariateNormal", "SVIResult", "Model", "probabilistic",
           "kl_divergence", "variational", "Variational", "elbo"]
