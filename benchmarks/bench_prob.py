"""NUTS against NumPyro: effective samples per second on the same models, data, chain counts and
draw counts, in one run (issue 17's goal: at least NumPyro's on the CPU), and PyMC's where it is
installed; and SVI's time per run and per step against NumPyro's.

    .venv/bin/python -m benchmarks.bench_prob [--quick] [--json PATH]

Each sampler runs its chains both ways it can on one CPU device (chain_method "sequential" and
"vectorized"; PyMC in one process, and in one per core), and the ratio is tessera's faster way
against NumPyro's faster (and PyMC's). Each runs twice: the first run compiles (reported), the
second is timed, warm-up included. The figure of merit is the smallest bulk ESS over every scalar
of every site (tessera.prob.diagnostics for all, so the same estimator judges each) divided by
the wall time. A sampler that is missing shows why.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

import tessera as ts
from tessera.prob import Bernoulli, HalfCauchy, Normal, diagnostics, sample

RESULTS = Path(__file__).resolve().parent / "results"
Y8 = np.array([28., 8, -3, 7, -1, 1, 18, 12])
S8 = np.array([15., 10, 16, 11, 9, 11, 10, 18])


def eight_schools(sigma, y=None):
    mu = sample("mu", Normal(0.0, 5.0))
    tau = sample("tau", HalfCauchy(5.0))
    z = sample("theta_tilde", Normal(0.0, 1.0, shape=(8,)))
    return sample("y", Normal(mu + tau * z, sigma), obs=y)


def logistic(X, y=None):
    w = sample("w", Normal(0.0, 1.0, shape=(X.shape[1],)))
    b = sample("b", Normal(0.0, 1.0))
    return sample("y", Bernoulli(logits=X @ w + b), obs=y)


def numpyro_models():
    import numpyro
    import numpyro.distributions as dist

    def eight(sigma, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        z = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0).expand([8]))
        numpyro.sample("y", dist.Normal(mu + tau * z, sigma), obs=y)

    def logit(X, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Bernoulli(logits=X @ w + b), obs=y)
    return {"eight_schools": eight, "logistic_1000": logit}


def cases(quick):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 5))
    y = (rng.random(1000) < 1 / (1 + np.exp(-(X @ rng.normal(size=5) + 0.3)))).astype(float)
    draws = (300, 300) if quick else (1000, 1000)
    return [("eight_schools", eight_schools, (S8,), {"y": Y8}, draws),
            ("logistic_1000", logistic, (X,), {"y": y}, draws)]


def min_ess(samples: dict) -> float:
    out = []
    for x in samples.values():
        x = np.asarray(x, np.float64)
        for idx in np.ndindex(*x.shape[2:]):
            out.append(diagnostics.ess_bulk(x[(slice(None), slice(None)) + idx]))
    return float(min(out))


def run_tessera(model, args, kwargs, warmup, draws, chains, method="sequential"):
    run = ts.mcmc(model, num_samples=draws, num_warmup=warmup, num_chains=chains, seed=0,
                  chain_method=method)
    t = time.perf_counter()
    run(*args, **kwargs)
    first = time.perf_counter() - t
    t = time.perf_counter()
    post = run(*args, **kwargs)
    return first, time.perf_counter() - t, post.samples, post.divergences


def pymc_models():
    import pymc as pm

    def eight(sigma, y=None):
        with pm.Model() as m:
            mu = pm.Normal("mu", 0.0, 5.0)
            tau = pm.HalfCauchy("tau", 5.0)
            z = pm.Normal("theta_tilde", 0.0, 1.0, shape=8)
            pm.Normal("y", mu + tau * z, sigma=sigma, observed=y)
        return m

    def logit(X, y=None):
        with pm.Model() as m:
            w = pm.Normal("w", 0.0, 1.0, shape=X.shape[1])
            b = pm.Normal("b", 0.0, 1.0)
            pm.Bernoulli("y", logit_p=X @ w + b, observed=y)
        return m
    return {"eight_schools": eight, "logistic_1000": logit}


def run_pymc(build, args, kwargs, warmup, draws, chains, cores=1):
    import pymc as pm
    model = build(*args, **kwargs)

    def sample(seed):
        with model:
            return pm.sample(draws, tune=warmup, chains=chains, cores=cores, random_seed=seed,
                             progressbar=False, compute_convergence_checks=False)
    t = time.perf_counter()
    sample(0)
    first = time.perf_counter() - t
    t = time.perf_counter()
    idata = sample(1)
    wall = time.perf_counter() - t
    names = [v.name for v in model.free_RVs]
    samples = {k: np.asarray(idata.posterior[k].values) for k in names}
    return first, wall, samples, int(np.asarray(idata.sample_stats["diverging"]).sum())


def run_numpyro(model, args, kwargs, warmup, draws, chains, method="sequential"):
    import jax
    from numpyro.infer import MCMC, NUTS
    mcmc = MCMC(NUTS(model), num_warmup=warmup, num_samples=draws, num_chains=chains,
                chain_method=method, progress_bar=False)
    t = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    first = time.perf_counter() - t
    t = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(1), *args, **kwargs)
    jax.block_until_ready(mcmc.get_samples())
    wall = time.perf_counter() - t
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    div = int(np.asarray(mcmc.get_extra_fields()["diverging"]).sum())
    return first, wall, samples, div


def svi_row(quick) -> dict:
    """SVI on the logistic regression (AutoNormal, Adam 1e-2, one particle): the wall time of
    a run of `steps` (after a first run that compiles tessera's programs; NumPyro's svi.run
    compiles its loop on every call) and the time per step once running, from a run ten times
    as long; each the best of three."""
    steps = 500 if quick else 2000
    _, _, (X,), kw, _ = cases(quick)[1]
    row = {"case": "svi_logistic_1000", "steps": steps}

    def timed(run, n):
        t = time.perf_counter()
        losses = run(n)
        return time.perf_counter() - t, float(np.mean(np.asarray(losses)[-100:]))

    def tessera_run(n):
        from tessera.prob import SVI, AutoNormal, Trace_ELBO
        svi = SVI(logistic, AutoNormal(logistic), ts.optim.Adam(1e-2), loss=Trace_ELBO(1))
        return svi.run(0, n, X, **kw).losses

    def numpyro_run(n):
        import jax
        import numpyro
        from numpyro.infer import SVI, Trace_ELBO
        from numpyro.infer.autoguide import AutoNormal
        m = numpyro_models()["logistic_1000"]
        svi = SVI(m, AutoNormal(m), numpyro.optim.Adam(1e-2), Trace_ELBO())
        out = svi.run(jax.random.PRNGKey(0), n, X, progress_bar=False, **kw).losses
        return jax.block_until_ready(out)
    for who, run in (("tessera", tessera_run), ("numpyro", numpyro_run)):
        try:
            first, _ = timed(run, steps)
            # the best of three (NumPyro's compile time inside each run varies)
            wall, loss = min(timed(run, steps) for _ in range(3))
            longer = min(timed(run, 10 * steps)[0] for _ in range(3))
            row[who] = {"first_s": first, "wall_s": wall, "final_loss": loss,
                        "step_us": (longer - wall) / (9 * steps) * 1e6}
        except Exception as e:                              # noqa: BLE001
            row[who] = {"status": f"error ({type(e).__name__}: {e})"}
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_prob")
    ap.add_argument("--quick", action="store_true", help="300 warm-up and 300 draws per chain")
    ap.add_argument("--json", help="where to write the results")
    args = ap.parse_args(argv)
    try:
        peers = numpyro_models()
        peer_error = None
    except ImportError as e:
        peers, peer_error = {}, f"n/i ({e}; pip install numpyro)"
    try:
        pymc_peers = pymc_models()
        pymc_error = None
    except ImportError as e:
        pymc_peers, pymc_error = {}, f"n/i ({e}; pip install pymc)"
    import logging
    logging.getLogger("pymc").setLevel(logging.ERROR)       # (its per-run sampler notes)
    cores = min(4, os.cpu_count() or 1)
    rows = []
    for name, model, margs, kw, (warmup, draws) in cases(args.quick):
        row = {"case": name, "chains": 4, "warmup": warmup, "draws": draws}
        ts_vectorized = lambda *a: run_tessera(*a, method="vectorized")     # noqa: E731
        vectorized = lambda *a: run_numpyro(*a, method="vectorized")      # noqa: E731
        pymc_parallel = lambda *a: run_pymc(*a, cores=cores)               # noqa: E731
        for who, runner, m in (("tessera", run_tessera, model),
                               ("tessera vectorized", ts_vectorized, model),
                               ("numpyro", run_numpyro, peers.get(name)),
                               ("numpyro vectorized", vectorized, peers.get(name)),
                               ("pymc", run_pymc, pymc_peers.get(name)),
                               (f"pymc {cores} processes", pymc_parallel, pymc_peers.get(name))):
            if m is None:
                row[who] = {"status": pymc_error if who.startswith("pymc") else peer_error}
                continue
            try:
                first, wall, samples, div = runner(m, margs, kw, warmup, draws, 4)
                ess = min_ess(samples)
                row[who] = {"first_s": first, "wall_s": wall, "min_ess_bulk": ess,
                            "ess_per_s": ess / wall, "divergences": div}
            except Exception as e:                          # noqa: BLE001
                row[who] = {"status": f"error ({type(e).__name__}: {e})"}
        ours = max((row[k]["ess_per_s"] for k in ("tessera", "tessera vectorized")
                    if "ess_per_s" in row[k]), default=None)
        best = max((row[k]["ess_per_s"] for k in ("numpyro", "numpyro vectorized")
                    if "ess_per_s" in row[k]), default=None)
        if ours and best:
            row["ratio"] = ours / best
        best_pymc = max((row[k]["ess_per_s"] for k in row if k.startswith("pymc")
                         and "ess_per_s" in row[k]), default=None)
        if ours and best_pymc:
            row["ratio_pymc"] = ours / best_pymc
        rows.append(row)
    print(f"{platform.processor() or platform.machine()}; tessera {ts.__version__}")
    print(f"{'case':16s} {'sampler':19s} {'first s':>8s} {'wall s':>8s} {'min ESS':>8s} "
          f"{'ESS/s':>8s} {'div':>4s}")
    for row in rows:
        for who in [k for k in row if isinstance(row[k], dict)]:
            r = row[who]
            if "status" in r:
                print(f"{row['case']:16s} {who:19s} {r['status']}")
            else:
                print(f"{row['case']:16s} {who:19s} {r['first_s']:8.2f} {r['wall_s']:8.2f} "
                      f"{r['min_ess_bulk']:8.0f} {r['ess_per_s']:8.1f} {r['divergences']:4d}")
        if "ratio" in row:
            goal = "met" if row["ratio"] >= 1 else "no"
            print(f"{'':16s} tessera's best / NumPyro's best, ESS per second: {row['ratio']:.2f}x "
                  f"(goal >= 1x: {goal})")
        if "ratio_pymc" in row:
            print(f"{'':16s} tessera's best / PyMC's best, ESS per second: "
                  f"{row['ratio_pymc']:.2f}x")
    svi = svi_row(args.quick)
    print(f"\n{svi['case']} ({svi['steps']} steps)   first s   wall s   us/step  final loss")
    for who in ("tessera", "numpyro"):
        r = svi[who]
        if "status" in r:
            print(f"{who:28s} {r['status']}")
        else:
            print(f"{who:28s} {r['first_s']:8.2f} {r['wall_s']:8.2f} {r['step_us']:9.1f} "
                  f"{r['final_loss']:10.2f}")
    if "wall_s" in svi["tessera"] and "wall_s" in svi["numpyro"]:
        t, n = svi["tessera"], svi["numpyro"]
        print(f"{'':28s} NumPyro / tessera time: {n['wall_s'] / t['wall_s']:.2f}x a run, "
              f"{n['step_us'] / t['step_us']:.2f}x a step")
    rows.append(svi)
    out = Path(args.json) if args.json else RESULTS / "prob-latest.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"quick": args.quick, "results": rows}, indent=1, default=str))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
