"""MCMC on a model's compiled log density: ``ts.mcmc(model, algorithm="NUTS")(*args)``.

    posterior = ts.mcmc(regression, algorithm="NUTS", num_samples=1000, num_warmup=500,
                        num_chains=4, seed=0)(X, y)
    posterior.summary()                   # mean, sd, quantiles, R-hat, bulk and tail ESS per site
    posterior.predict(X_new)              # posterior predictive draws of the observed site
    posterior.uncertainty(X_new)          # their mean and sd

The sampler moves in unconstrained space: each unobserved site's support maps the real line
onto it (tessera/prob/distributions.py), and the potential is minus the log joint there plus
the log Jacobians. The potential and its gradient are one compiled tessera function
(``ts.value_and_grad`` over a flat float64 vector), and a whole NUTS subtree another: its
2^depth leapfrog steps in a compiled loop, its U-turn and divergence checks and its proposal
computed from them in the same call, so a transition costs a call per doubling, not per step
(and with ``chain_method="vectorized"`` one call per doubling for all the chains). The
doubling, the momentum draws and the adaptation run in NumPy around them. NUTS is the
multinomial No-U-Turn sampler (Betancourt 2017: biased progressive sampling between subtrees,
uniform within them, the generalised U-turn criterion, checked also between merged subtrees
as Stan and NumPyro do), HMC a fixed number of leapfrog steps with a Metropolis correction; both
adapt the step size by dual averaging (Hoffman and Gelman 2014, target acceptance 0.8) and a
diagonal (or dense) inverse mass matrix in Stan's windows (75 fast, doubling slow windows from
25, 50 terminal). Every random number comes from NumPy's counter-based Philox keyed by
(seed, chain): the same seed gives the same chains bit for bit on every run and thread count.
A divergent transition (the energy error above 1000) ends its trajectory and is counted, not
raised.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import op
from ..autodiff import value_and_grad
from ..control import scan
from ..errors import ArgumentError, TesseraError
from ..function import function
from . import diagnostics
from .handlers import log_joint, seed as seed_handler, substitute, trace

MAX_DELTA_H = 1000.0


# ---- the model in unconstrained space ----------------------------------------------------------
class SiteLayout:
    """A model's unobserved sites laid out in one flat unconstrained vector (what MCMC moves
    and the SVI guides draw): `values(z)` gives the site values on their supports and the log
    Jacobian of the map, in tessera operators; `constrained(z)` the values as NumPy arrays."""

    def __init__(self, model, args, kwargs, seed_value=0):
        with seed_handler(seed_value), trace() as tr:
            model(*args, **kwargs)
        self.model, self.args, self.kwargs = model, args, kwargs
        self.sites = [s for s in tr.sites.values() if not s["observed"]]
        if not self.sites:
            raise ArgumentError("the model has no unobserved sites to infer")
        self.observed = {k: v for k, v in tr.sites.items() if v["observed"]}
        self.ushapes = {s["name"]: np.shape(s["dist"].support.to_unconstrained(
            np.asarray(s["value"]))) for s in self.sites}
        self.sizes = {k: int(np.prod(v, dtype=np.int64)) for k, v in self.ushapes.items()}
        self.dim = sum(self.sizes.values())

    def split(self, z):
        """The flat vector as {site: unconstrained array}."""
        out, at = {}, 0
        for name, n in self.sizes.items():
            out[name] = z[at:at + n].reshape(self.ushapes[name])
            at += n
        return out

    def constrained(self, z) -> dict:
        """Site values for a point in unconstrained space (NumPy arrays)."""
        parts = self.split(np.asarray(z, np.float64))
        return {s["name"]: np.asarray(s["dist"].support.to_constrained(parts[s["name"]]))
                for s in self.sites}

    def values(self, z):
        """(site values, log |det J|) at a flat point z (a tensor), in tessera operators."""
        values, jac, at = {}, None, 0
        for s in self.sites:
            name, support = s["name"], s["dist"].support
            n = self.sizes[name]
            part = op.slice(z, starts=[at], stops=[at + n], steps=[1])
            if self.ushapes[name] != (n,):
                part = op.reshape(part, shape=list(self.ushapes[name]))
            at += n
            values[name] = support.to_constrained(part)
            lj = op.sum(support.log_abs_det_jacobian(part))
            jac = lj if jac is None else jac + lj
        return values, jac


class _Unconstrained(SiteLayout):
    """The layout with its potential (minus the log joint plus the log Jacobian) and gradient,
    one compiled function; a leapfrog trajectory of it and a whole NUTS subtree, two more."""

    def __init__(self, model, args, kwargs, seed_value):
        super().__init__(model, args, kwargs, seed_value)
        self._compile()

    def _compile(self):
        def potential(z):
            values, jac = self.values(z)
            return -(log_joint(self.model, values, *self.args, **self.kwargs) + jac)
        grad = value_and_grad(function(potential, name="potential"))

        def velocity(inv_mass, r):         # M^-1 r (a diagonal or dense inverse mass matrix)
            dense = len(inv_mass.shape) == 2
            if len(r.shape) == 2:
                return op.matmul(r, inv_mass) if dense else r * inv_mass
            return op.matmul(inv_mass, r) if dense else inv_mass * r

        def trajectory(z, r, g, step, inv_mass, ticks):
            # len(ticks) leapfrog steps from (z, r), g the gradient at z: every step's
            # position, momentum, potential and gradient
            def leapfrog(carry, _):
                z, r, g = carry
                r = r - 0.5 * step * g
                z = z + step * velocity(inv_mass, r)
                u, g = grad(z)
                r = r - 0.5 * step * g
                return (z, r, g), (z, r, u, g)
            return scan(leapfrog, (z, r, g), ticks)[1]

        def energy_error(Z, R, U, inv_mass, h0):
            V = velocity(inv_mass, R)
            h = U + 0.5 * op.sum(R * V, axis=1)
            return V, op.where(op.abs(h) < math.inf, h - h0, math.inf)   # not finite: inf

        def path(z, r, g, step, inv_mass, h0, ticks):
            Z, R, U, G = trajectory(z, r, g, step, inv_mass, ticks)
            return Z, R, U, G, energy_error(Z, R, U, inv_mass, h0)[1]

        def rows(*xs):
            return op.concat([op.reshape(x, [1, -1]) for x in xs], axis=0)

        def turning(v_begin, v_end, r_sum):
            # 1 where the momenta at a stretch's two ends (as velocities) turn against the
            # stretch's momentum sum: the generalised No-U-Turn criterion, rows at once
            return op.maximum(op.cast(op.sum(v_begin * r_sum, axis=-1) <= 0, "float64"),
                              op.cast(op.sum(v_end * r_sum, axis=-1) <= 0, "float64"))

        def subtree(edge, scalars, inv_mass, ticks):
            # NUTS's subtree of n = len(ticks) = 2^depth steps, what its recursive
            # construction decides, from all n steps at once: it stops at the first step
            # that diverges or that ends a block of 2, 4, ... aligned steps (the subtrees it
            # merges) that turns (`turned`); its proposal is a step drawn in proportion to
            # exp(-dh), what uniform progressive sampling within it amounts to. Gives (first
            # failing step or n, whether it diverged there, the acceptance statistic summed
            # over the steps taken, the log weight, the momentum sum, the far edge (z, r, u,
            # g), the proposal (z, u, g), the near edge's momentum). Few arrays in and out,
            # since each costs the call time: edge = rows (z, r, g), scalars = (step, h0,
            # uniform); out the scalars and the rows (r sum, edge z, r, g, proposal z, g,
            # first r). Merging two halves A then B (in the order built) turns where A's first
            # and B's last momenta turn against the whole sum, or, as Stan and NumPyro also
            # demand between the halves, A with B's first step (A's first and B's first
            # against A's sum plus B's first momentum) or A's last step with B (A's last and
            # B's last against A's last momentum plus B's sum).
            z, r, g, step, h0, uniform = edge[0], edge[1], edge[2], \
                scalars[0], scalars[1], scalars[2]
            n, d = ticks.shape[0], z.shape[0]
            Z, R, U, G = trajectory(z, r, g, step, inv_mass, ticks)
            V, dh = energy_error(Z, R, U, inv_mass, h0)
            diverged = op.cast(dh > MAX_DELTA_H, "float64")
            fails, size = diverged, 2
            while size <= n:
                m, h = n // size, size // 2
                halves_r = op.reshape(R, [m, 2, h, d])
                halves_v = op.reshape(V, [m, 2, h, d])
                sums = op.sum(halves_r, axis=2)               # (block, half, d)
                a_sum, b_sum = sums[:, 0, :], sums[:, 1, :]
                a_first_v, a_last_v = halves_v[:, 0, 0, :], halves_v[:, 0, h - 1, :]
                b_first_v, b_last_v = halves_v[:, 1, 0, :], halves_v[:, 1, h - 1, :]
                turned = op.maximum(op.maximum(
                    turning(a_first_v, b_last_v, a_sum + b_sum),
                    turning(a_first_v, b_first_v, a_sum + halves_r[:, 1, 0, :])),
                    turning(a_last_v, b_last_v, halves_r[:, 0, h - 1, :] + b_sum))
                at_end = op.concat([op.broadcast_to(0.0, [m, size - 1]),
                                    op.reshape(turned, [m, 1])], axis=1)
                fails = op.maximum(fails, op.reshape(at_end, [n]))
                size *= 2
            steps = np.arange(n, dtype=np.float64)
            first = op.where(op.max(fails) > 0, op.cast(op.argmax(fails), "float64"), float(n))
            taken = op.cast(steps <= first, "float64")
            accept = op.sum(taken * op.minimum(1.0, op.exp(-op.maximum(dh, -700.0))))
            diverged_first = op.sum(diverged * op.cast(steps == first, "float64"))
            log_w = -dh
            top = op.max(log_w)
            w = op.exp(log_w - top)
            total = op.sum(w)
            pick = op.minimum(op.sum(op.cast(op.cumsum(w, axis=0) <= uniform * total,
                                             "int32")), n - 1)
            last = n - 1
            return (rows(first, diverged_first, accept, top + op.log(total), U[last],
                         op.take(U, pick, axis=0)),
                    rows(op.sum(R, axis=0), Z[last], R[last], G[last], op.take(Z, pick, axis=0),
                         op.take(G, pick, axis=0), R[0]))

        def subtrees(edges, scalars, inv_masses, ticks):
            # a subtree per chain (one row of each operand a chain), in a loop over them
            def one(carry, chain):
                return carry, subtree(*chain, ticks)
            return scan(one, np.zeros(()), (edges, scalars, inv_masses))[1]
        self._value_and_grad = grad
        self._path = function(path, name="leapfrog_path")
        self._subtrees = function(subtrees, name="nuts_subtrees")

    def value_and_grad(self, z):
        u, g = self._value_and_grad(np.asarray(z, np.float64))
        return float(u), np.asarray(g, np.float64)

    def path(self, z, r, g, step, inv_mass, h0, n):
        """n leapfrog steps (one compiled call): positions, momenta, potentials, gradients,
        energy errors against h0."""
        return self._path(z, r, g, np.asarray(step, np.float64), inv_mass,
                          np.asarray(h0, np.float64), np.zeros(n))

    def subtrees(self, edges, scalars, inv_masses, n):
        """NUTS's subtrees of n steps, one per chain, in one compiled call: edges (chains, 3,
        dim) the rows z, r, g; scalars (chains, 3) the signed step, h0 and a uniform draw.
        Gives per chain (first failing step or n, whether it diverged there, summed
        acceptance, log weight, far edge's potential, proposal's potential) and the rows
        (momentum sum, far edge's z, r, g, proposal's z, g, near edge's r)."""
        return self._subtrees(edges, scalars, inv_masses, np.zeros(n))


# ---- step size and mass matrix adaptation -----------------------------------------------------
class _DualAveraging:
    def __init__(self, step, target=0.8, gamma=0.05, t0=10.0, kappa=0.75):
        self.mu, self.target, self.gamma, self.t0, self.kappa = \
            math.log(10 * step), target, gamma, t0, kappa
        self.t, self.h, self.log_avg = 0, 0.0, 0.0

    def update(self, accept) -> float:
        self.t += 1
        eta = 1 / (self.t + self.t0)
        self.h = (1 - eta) * self.h + eta * (self.target - accept)
        log_step = self.mu - math.sqrt(self.t) / self.gamma * self.h
        w = self.t ** -self.kappa
        self.log_avg = w * log_step + (1 - w) * self.log_avg
        return math.exp(log_step)

    @property
    def final(self) -> float:
        return math.exp(self.log_avg)


def _windows(num_warmup):
    """The ends of Stan's slow windows (the inverse mass matrix is re-estimated at each)."""
    if num_warmup < 20:
        return []
    start, end_buffer = 75, 50
    if num_warmup < start + end_buffer + 25:
        start, end_buffer = int(0.15 * num_warmup), int(0.1 * num_warmup)
    ends, size, at = [], 25, start
    while at + size <= num_warmup - end_buffer:
        nxt = at + size
        if nxt + 2 * size > num_warmup - end_buffer:
            nxt = num_warmup - end_buffer
        ends.append(nxt)
        at, size = nxt, size * 2
    return ends


# ---- the samplers ------------------------------------------------------------------------------
@dataclass
class _State:
    z: np.ndarray
    u: float
    grad: np.ndarray


class _Kernel:
    def __init__(self, target: _Unconstrained, rng, dense: bool, max_tree_depth: int,
                 num_steps: int | None):
        self.target, self.rng, self.dense = target, rng, dense
        self.max_depth, self.num_steps = max_tree_depth, num_steps
        self.inv_mass = np.eye(target.dim) if dense else np.ones(target.dim)
        self._chol = np.eye(target.dim) if dense else np.ones(target.dim)

    def set_inv_mass(self, inv_mass):
        self.inv_mass = inv_mass
        if self.dense:
            self._chol = np.linalg.cholesky(np.linalg.inv(inv_mass))   # momentum ~ N(0, M)
        else:
            self._chol = 1 / np.sqrt(inv_mass)

    def momentum(self):
        eps = self.rng.standard_normal(self.target.dim)
        return self._chol @ eps if self.dense else self._chol * eps

    def velocity(self, r):
        return self.inv_mass @ r if self.dense else self.inv_mass * r

    def kinetic(self, r) -> float:
        return 0.5 * float(r @ self.velocity(r))

    def path(self, s: _State, r, step, n, h0):
        """n leapfrog steps from (s, r): positions, momenta, potentials, gradients, and
        energy errors against h0 (inf where the energy is not finite)."""
        return self.target.path(s.z, r, s.grad, step, self.inv_mass, h0, n)

    # -- HMC --------------------------------------------------------------------------------
    def hmc(self, s: _State, step):
        r0 = self.momentum()
        z, _, u, g, dh = self.path(s, r0, step, self.num_steps, s.u + self.kinetic(r0))
        if np.any(dh > MAX_DELTA_H):
            return s, 0.0, True, self.num_steps
        accept = 1.0 if dh[-1] <= 0 else math.exp(-dh[-1])
        new = _State(z[-1], float(u[-1]), g[-1])
        return (new if self.rng.random() < accept else s), accept, False, self.num_steps

    def turning(self, r_begin, r_end, r_sum) -> bool:
        """Whether a stretch whose end momenta are r_begin, r_end turns against its sum."""
        return float(self.velocity(r_begin) @ r_sum) <= 0 or \
            float(self.velocity(r_end) @ r_sum) <= 0


def _nuts(kernels: list, states: list, steps: list) -> list:
    """One NUTS transition (multinomial, iterative doubling) of each chain, the chains in
    lockstep: at each doubling one compiled call builds every chain's subtree (a chain that
    has stopped rides along, its result unused, so the call's shapes stay put). Each chain
    draws from its own generator in the order a chain alone would, so its draws are the same
    whichever chains run beside it. Gives per chain (state, acceptance, divergent, steps)."""
    target = kernels[0].target
    chains = range(len(kernels))
    r0 = [k.momentum() for k in kernels]
    h0 = [s.u + k.kinetic(r) for s, k, r in zip(states, kernels, r0)]
    left, right = [(s, r) for s, r in zip(states, r0)], [(s, r) for s, r in zip(states, r0)]
    proposal, log_w, r_sum = list(states), [0.0] * len(kernels), [r.copy() for r in r0]
    accept, taken, divergent = [0.0] * len(kernels), [0] * len(kernels), [False] * len(kernels)
    active = list(chains)
    inv_masses = np.stack([k.inv_mass for k in kernels])
    direction = [1] * len(kernels)
    scalars = np.zeros((len(kernels), 3))
    for depth in range(kernels[0].max_depth):
        if not active:
            break
        n = 2 ** depth
        for c in active:
            direction[c] = 1 if kernels[c].rng.random() < 0.5 else -1
            scalars[c] = direction[c] * steps[c], h0[c], kernels[c].rng.random()
        edges = np.stack([np.stack([e[0].z, e[1], e[0].grad]) for e in
                          (right[c] if direction[c] > 0 else left[c] for c in chains)])
        stat, rows = target.subtrees(edges, scalars, inv_masses, n)
        for c in list(active):
            first, diverged, acc, sub_log_w, u, pu = stat[c].ravel().tolist()
            first = int(first)
            accept[c] += acc
            taken[c] += min(first + 1, n)
            if first < n:                    # diverged or turned inside: discarded
                divergent[c] = divergent[c] or bool(diverged)
                active.remove(c)
                continue
            sub_r, z, r, g, pz, pg, near_r = rows[c]
            # the tree's two parts in space, for the checks between them: (sum, the momentum
            # at the side where they meet)
            if direction[c] > 0:
                parts = (r_sum[c], right[c][1]), (sub_r, near_r)
                right[c] = (_State(z, u, g), r)
            else:
                parts = (sub_r, near_r), (r_sum[c], left[c][1])
                left[c] = (_State(z, u, g), r)
            # biased progressive sampling: move to the new subtree's proposal
            if math.log(kernels[c].rng.random() + 1e-300) < sub_log_w - log_w[c]:
                proposal[c] = _State(pz, pu, pg)
            log_w[c] = float(np.logaddexp(log_w[c], sub_log_w))
            r_sum[c] = r_sum[c] + sub_r
            (left_sum, left_inner), (right_sum, right_inner) = parts
            k, r_left, r_right = kernels[c], left[c][1], right[c][1]
            if k.turning(r_left, r_right, r_sum[c]) or \
                    k.turning(r_left, right_inner, left_sum + right_inner) or \
                    k.turning(left_inner, r_right, left_inner + right_sum):
                active.remove(c)
    return [(proposal[c], accept[c] / max(taken[c], 1), divergent[c], taken[c])
            for c in chains]


def _initial_step(kernel: _Kernel, s: _State) -> float:
    """Hoffman and Gelman's heuristic: double or halve until one leapfrog step's acceptance
    crosses one half."""
    step = 1.0
    r = kernel.momentum()
    h0 = s.u + kernel.kinetic(r)

    def half_accepted(step):        # (a step whose energy is not finite has dh = inf)
        return -kernel.path(s, r, step, 1, h0)[4][0] > math.log(0.5)
    direction = 1 if half_accepted(step) else -1
    for _ in range(100):
        step *= 2.0 ** direction
        ok = half_accepted(step)
        if (direction == 1 and not ok) or (direction == -1 and ok):
            break
    return step


class _Chain:
    """One chain's state, adaptation and draws."""

    def __init__(self, target: _Unconstrained, rng, dense, max_tree_depth, num_steps, init,
                 num_warmup):
        self.kernel = _Kernel(target, rng, dense, max_tree_depth, num_steps)
        z = rng.uniform(-2, 2, target.dim) if init is None else np.asarray(init, np.float64)
        for _ in range(100):
            u, g = target.value_and_grad(z)
            if math.isfinite(u) and np.all(np.isfinite(g)):
                break
            z = rng.uniform(-2, 2, target.dim)
        else:
            raise TesseraError("no finite starting point in 100 tries: the model's log density "
                               "is not finite near the origin of unconstrained space")
        self.state, self.dense, self.num_warmup = _State(z, u, g), dense, num_warmup
        self.step = _initial_step(self.kernel, self.state)
        self.adapt = _DualAveraging(self.step)
        self.windows, self.window = _windows(num_warmup), []
        self.draws, self.divergences, self.steps, self.accepts = [], 0, 0, []

    def moved(self, i, state, accept, divergent, n):
        """After move i: adapt (in warm-up) or keep the draw."""
        self.state = state
        if i >= self.num_warmup:
            self.draws.append(state.z)
            self.divergences += bool(divergent)
            self.steps += n
            self.accepts.append(accept)
            return
        self.step = self.adapt.update(accept)
        self.window.append(state.z)
        if self.windows and i + 1 == self.windows[0]:
            self.windows.pop(0)
            w = np.asarray(self.window)
            k, dim = len(w), w.shape[1]
            if self.dense:
                cov = np.cov(w.T).reshape(dim, dim)
                inv = (k / (k + 5)) * cov + 1e-3 * (5 / (k + 5)) * np.eye(dim)
            else:
                inv = (k / (k + 5)) * w.var(axis=0, ddof=1) + 1e-3 * (5 / (k + 5))
            self.kernel.set_inv_mass(inv)
            self.window = []
            self.step = _initial_step(self.kernel, state)
            self.adapt = _DualAveraging(self.step)
        if i + 1 == self.num_warmup:
            self.step = self.adapt.final

    def result(self):
        return np.asarray(self.draws), {
            "divergences": self.divergences, "step_size": self.step, "num_steps": self.steps,
            "accept": float(np.mean(self.accepts)) if self.accepts else float("nan"),
            "inv_mass": self.kernel.inv_mass}


def _run_chains(target: _Unconstrained, algorithm, num_warmup, num_samples, rngs, dense,
                max_tree_depth, num_steps, init) -> list:
    """Chains (one per generator) moved in lockstep: [(draws, info)] in their order."""
    chains = [_Chain(target, rng, dense, max_tree_depth, num_steps, init, num_warmup)
              for rng in rngs]
    for i in range(num_warmup + num_samples):
        if algorithm == "NUTS":
            moves = _nuts([c.kernel for c in chains], [c.state for c in chains],
                          [c.step for c in chains])
        else:
            moves = [c.kernel.hmc(c.state, c.step) for c in chains]
        for chain, move in zip(chains, moves):
            chain.moved(i, *move)
    return [c.result() for c in chains]


# ---- the user's entry point --------------------------------------------------------------------
def _data_key(args, kwargs):
    """What a run's compiled potential depends on: the data's values (folded into it as
    constants), so a second run on the same data traces nothing, and data changed in place
    are never served the old ones. A fresh object (so a fresh compile) where an argument's
    value cannot be keyed."""
    import hashlib

    def key(v):
        if isinstance(v, (np.ndarray, np.generic)):
            a = np.ascontiguousarray(v)
            return ("array", a.dtype.str, a.shape, hashlib.blake2b(a.tobytes()).hexdigest())
        if v is None or isinstance(v, (bool, int, float, str)):
            return (type(v).__name__, v)
        if isinstance(v, (tuple, list)):
            return (type(v).__name__,) + tuple(key(x) for x in v)
        if isinstance(v, dict):
            return ("dict",) + tuple((k, key(x)) for k, x in sorted(v.items()))
        raise TypeError
    try:
        return key(tuple(args)), key(dict(kwargs))
    except TypeError:
        return object()             # unkeyable: a fresh compile, as before


def mcmc(model, algorithm="NUTS", num_samples=1000, num_warmup=500, num_chains=4, seed=0,
         dense_mass=False, max_tree_depth=10, num_steps=None, init=None,
         chain_method="sequential"):
    """A function of the model's arguments that runs the chains and gives a `Posterior`.
    ``algorithm``: "NUTS" or "HMC" (``num_steps`` leapfrog steps per move). ``chain_method``
    (NumPyro's names): "sequential" runs the chains one after another; "vectorized" moves
    them in lockstep, each NUTS doubling one compiled call for all of them (fewer calls; the
    chains that stopped early ride along). A chain's draws are the same bits either way."""
    if algorithm not in ("NUTS", "HMC"):
        raise ArgumentError(f"mcmc's algorithm is 'NUTS' or 'HMC', not {algorithm!r}")
    if algorithm == "HMC" and not num_steps:
        raise ArgumentError("HMC needs num_steps (leapfrog steps per move)")
    if num_samples < 1 or num_warmup < 0 or num_chains < 1:
        raise ArgumentError("mcmc needs num_samples >= 1, num_warmup >= 0, num_chains >= 1")
    if chain_method not in ("sequential", "vectorized"):
        raise ArgumentError(f"mcmc's chain_method is 'sequential' or 'vectorized', not "
                            f"{chain_method!r}")

    targets = {}        # the data's contents -> their compiled potential (the last ones only)

    def run(*args, **kwargs):
        key = _data_key(args, kwargs)
        if key not in targets:
            targets.clear()
            targets[key] = _Unconstrained(model, args, kwargs, seed)
        target = targets[key]
        rngs = [np.random.Generator(np.random.Philox(key=[int(seed), c]))
                for c in range(num_chains)]

        def run_chains(rngs):
            return _run_chains(target, algorithm, num_warmup, num_samples, rngs, dense_mass,
                               max_tree_depth, num_steps, init)
        if chain_method == "vectorized":
            runs = run_chains(rngs)
        else:
            runs = [r for rng in rngs for r in run_chains([rng])]
        return Posterior(target, np.asarray([r[0] for r in runs]), [r[1] for r in runs], seed)
    return run


class Posterior:
    """The draws of every unobserved site, ``samples[name]``: (chains, draws, *shape)."""

    def __init__(self, target: _Unconstrained, z: np.ndarray, infos: list, seed):
        self.target, self.infos, self.seed = target, infos, seed
        values = [[target.constrained(p) for p in chain] for chain in z]
        self.samples = {s["name"]: np.asarray([[v[s["name"]] for v in chain]
                                               for chain in values])
                        for s in target.sites}
        self.divergences = sum(i["divergences"] for i in infos)

    def __repr__(self):
        c, d = next(iter(self.samples.values())).shape[:2]
        return (f"<Posterior: {c} chains x {d} draws of {', '.join(self.samples)}; "
                f"{self.divergences} divergences>")

    def flat(self, name) -> np.ndarray:
        x = self.samples[name]
        return x.reshape((-1,) + x.shape[2:])

    def summary(self, prob=0.9):
        """A DataFrame: per site and element, mean, sd, the central `prob` interval, the
        median, split R-hat, bulk and tail ESS."""
        import pandas as pd
        lo, hi = (1 - prob) / 2, 1 - (1 - prob) / 2
        rows = []
        for name, x in self.samples.items():
            shape = x.shape[2:]
            for idx in np.ndindex(*shape):
                d = x[(slice(None), slice(None)) + idx]
                label = name + (str(list(idx)) if idx else "")
                rows.append({"site": label, "mean": d.mean(), "sd": d.std(ddof=1),
                             f"{lo:.0%}": np.quantile(d, lo), "median": np.median(d),
                             f"{hi:.0%}": np.quantile(d, hi), "r_hat": diagnostics.rhat(d),
                             "ess_bulk": diagnostics.ess_bulk(d),
                             "ess_tail": diagnostics.ess_tail(d)})
        return pd.DataFrame(rows).set_index("site")

    def predict(self, *args, site=None, num_draws=None, **kwargs):
        """Posterior predictive draws of the observed site (or `site`), one per posterior
        draw (the first `num_draws`), as an array (draws, *shape)."""
        names = list(self.target.observed)
        name = site or (names[0] if len(names) == 1 else None)
        if name is None:
            raise ArgumentError("the model observes several sites: name one with site=",
                                expected=", ".join(names))
        out = []
        total = next(iter(self.samples.values())).shape[0] * \
            next(iter(self.samples.values())).shape[1]
        for k in range(min(total, num_draws or total)):
            values = {n: self.flat(n)[k] for n in self.samples}
            with seed_handler((int(self.seed) << 24) + k), substitute(values), trace() as tr:
                self.target.model(*args, **kwargs)
            if name not in tr.sites:
                raise ArgumentError(f"the model has no site {name!r}")
            out.append(np.asarray(tr.sites[name]["value"]))
        return np.asarray(out)

    def uncertainty(self, *args, **kwargs):
        """(mean, sd) of the posterior predictive draws."""
        y = self.predict(*args, **kwargs)
        return y.mean(axis=0), y.std(axis=0, ddof=1)


__all__ = ["mcmc", "Posterior", "SiteLayout"]
