"""Models as Python functions of ``sample`` statements, interpreted by effect handlers (as in
NumPyro): ``sample("w", Normal(0, 1))`` asks the handlers on the stack for a value.

    with trace() as tr, seed(0):          # draw every site, record them
        model(X)
    log_joint(model, {"w": w, "b": b}, X, y=y)    # the log density: tessera operators

Handlers: ``seed(s)`` draws each unobserved site (site k of a run from the stream of ``s`` at
its own offset, so a model's draws are the same on every run), ``substitute(values)`` gives
sites values, ``condition(data)`` observes them, ``trace()`` records every site (its
distribution, value, whether observed, the user's line). ``log_joint`` runs the model under
``substitute`` and sums every site's log density; written with tessera's operators, it traces
into a compiled function and ``ts.grad`` differentiates it.
"""
from __future__ import annotations

import threading

import numpy as np

from .. import op
from ..errors import ArgumentError, TesseraError
from ..trace import Traced, user_location

_state = threading.local()


def _stack() -> list:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


class Handler:
    """A context manager on the handler stack: `process(site)` before a value is chosen (the
    innermost handler first), `postprocess(site)` after."""

    def __enter__(self):
        _stack().append(self)
        return self

    def __exit__(self, *exc):
        _stack().remove(self)
        return False

    def process(self, site):
        pass

    def postprocess(self, site):
        pass


class trace(Handler):
    """Records the sites of a run, in order: ``tr.sites[name]`` is a dict with ``dist``,
    ``value``, ``observed`` and ``loc``."""

    def __enter__(self):
        self.sites = {}
        return super().__enter__()

    def postprocess(self, site):
        if site["name"] in self.sites:
            raise TesseraError(f"the model samples the site {site['name']!r} twice",
                               location=site["loc"],
                               hint="give each sample statement its own name")
        self.sites[site["name"]] = site


class seed(Handler):
    """Draws every site no other handler gave a value, site k of the run from stream ``seed``
    at offset k * 2^32 (counter-based: the same draws on every run)."""

    def __init__(self, seed_value: int):
        self.seed_value, self.count = seed_value, 0

    def process(self, site):
        if site["value"] is None:
            dist = site["dist"]
            k, self.count = self.count, self.count + 1
            if dist.reparameterized:
                site["value"] = dist.sample(self.seed_value, offset=k << 32)
            else:                                # (NumPy's Philox: one key per site)
                site["value"] = dist.sample((int(self.seed_value) << 20) + k)


class substitute(Handler):
    """Gives the named sites these values (unobserved sites: what inference proposes)."""

    def __init__(self, values: dict):
        self.values = values

    def process(self, site):
        if site["value"] is None and site["name"] in self.values:
            site["value"] = self.values[site["name"]]


class condition(Handler):
    """Observes the named sites at these values (data)."""

    def __init__(self, data: dict):
        self.data = data

    def process(self, site):
        if site["value"] is None and site["name"] in self.data:
            site["value"] = self.data[site["name"]]
            site["observed"] = True


class _every_site(substitute):
    """substitute, where every unobserved site must have a value (log_joint's)."""

    def process(self, site):
        super().process(site)
        if site["value"] is None:
            raise ArgumentError(f"log_joint got no value for the site {site['name']!r}",
                                location=site["loc"],
                                expected=f"a value for each unobserved site (given: "
                                         f"{', '.join(self.values) or 'none'})")
        if _outside_support(site):      # (checked here, before a later site uses the value)
            raise TesseraError(f"the value of site {site['name']!r} lies outside the support "
                               f"of its {type(site['dist']).__name__} ({site['dist'].support})",
                               location=site["loc"])


def sample(name: str, dist, obs=None):
    """The value of site ``name`` with distribution ``dist``: ``obs`` when given (an
    observation), else what the handlers on the stack give."""
    if not isinstance(name, str):
        raise ArgumentError(f"a sample site's name is a string, not {type(name).__name__}")
    site = {"name": name, "dist": dist, "value": obs, "observed": obs is not None,
            "loc": user_location()}
    if obs is not None:
        _check_observation(site)
    for h in reversed(_stack()):
        h.process(site)
    if site["value"] is None:
        raise TesseraError(f"the site {name!r} has no value: no observation, and no handler "
                           "gave one", location=site["loc"],
                           hint="run the model under seed(...) to draw, or substitute values")
    for h in reversed(_stack()):
        h.postprocess(site)
    return site["value"]


def _check_observation(site):
    obs, dist = site["value"], site["dist"]
    shape = tuple(obs.shape) if hasattr(obs, "shape") else np.shape(obs)
    try:
        fits = tuple(np.broadcast_shapes(shape, dist.shape)) == shape
    except ValueError:
        fits = False
    if not fits:                  # (a distribution's parameters may broadcast up to the data)
        raise TesseraError(f"the observation of site {site['name']!r} has shape {shape}; its "
                           f"distribution's values have shape {tuple(dist.shape)}",
                           location=site["loc"],
                           hint="observe an array of the distribution's shape")


def _outside_support(site) -> bool:
    """Whether a known value lies outside its distribution's support (traced values are
    inference's, which keeps them inside)."""
    v = site["value"]
    if isinstance(v, Traced):
        return False
    try:
        ok = np.asarray(site["dist"].support.check(np.asarray(v)))
    except TesseraError:
        return False
    return not bool(ok.all())


def log_joint(model, values: dict, *args, **kwargs):
    """The model's log density at ``values`` (unobserved sites' values by name; observed ones
    from the model's own ``obs=`` or ``condition``), summed over every site: a tessera
    scalar, traced when called inside a tessera function. A value outside its site's support
    is a TesseraError naming the site and the line."""
    with trace() as tr, _every_site(values):
        model(*args, **kwargs)
    unknown = set(values) - set(tr.sites)
    if unknown:
        raise ArgumentError(f"the model has no site {sorted(unknown)[0]!r}",
                            expected=", ".join(tr.sites))
    total = None
    for site in tr.sites.values():
        lp = op.sum(site["dist"].log_prob(site["value"]))
        total = lp if total is None else total + lp
    if total is None:
        raise TesseraError("the model has no sample sites")
    return total


class Model:
    """``@ts.probabilistic``: a model function, callable as it is, that may end by returning a
    Distribution (the seeds' ``-> Distribution[Tensor[...]]``): that is the likelihood of the
    site ``"obs"``, observed at the call's ``obs=`` (drawn under ``seed`` when not given)."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "model")
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args, obs=None, **kwargs):
        from .distributions import Distribution
        out = self.fn(*args, **kwargs)
        return sample("obs", out, obs=obs) if isinstance(out, Distribution) else out

    def prior(self, seed_value: int, *args, **kwargs) -> dict:
        """One draw of every site from the prior: {name: value}."""
        with seed(seed_value), trace() as tr:
            self(*args, **kwargs)
        return {k: v["value"] for k, v in tr.sites.items()}

    def log_joint(self, values: dict, *args, **kwargs):
        return log_joint(self, values, *args, **kwargs)

    def __repr__(self):
        return f"<probabilistic model {self.__name__}>"


def probabilistic(fn) -> Model:
    """The seeds' ``@tessera.probabilistic``: see Model."""
    return Model(fn)


__all__ = ["sample", "trace", "seed", "substitute", "condition", "log_joint", "Handler",
           "Model", "probabilistic"]
