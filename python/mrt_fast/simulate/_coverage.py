"""Are the advisor's intervals honest? Coverage of the bootstrap intervals and of the Bernstein bound.

Data with known truth, K responses for each of Np prompts:

* ``bernoulli``: prompt means mu_i ~ Beta(a, b), losses l_ij ~ Bernoulli(mu_i)
  (a 0/1 loss: bounded in [0, 1], so the Bernstein bound applies);
  V_x = Var(mu), V_y|x = E[mu (1 - mu)];
* ``normal``: mu_i ~ N(0, V_x), l_ij ~ N(mu_i, V_y|x) (bootstrap only).

For each Np, ``trials`` data sets go through `variance_budget`; the table
reports how often the percentile bootstrap interval (nominal ``level``)
contains the true V_x, V_y|x, ratio and K*, and how often the Bernstein bound
(failure probability delta) holds for |R_hat - R| (R the population risk),
with the true variances and with the estimated ones plugged in.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from ..variance import bernstein_bound, variance_budget


def _draw(rng, setting, n_prompts, k, a, b, v_x, v_y):
    if setting == "bernoulli":
        mu = rng.beta(a, b, n_prompts)
        return (rng.random((n_prompts, k)) < mu[:, None]).astype(np.float64)
    mu = rng.normal(0.0, math.sqrt(v_x), n_prompts)
    return rng.normal(mu[:, None], math.sqrt(v_y), (n_prompts, k))


def interval_coverage(
    seed: int = 0,
    n_prompts: tuple = (20, 50, 200, 1000),
    k: int = 4,
    settings: tuple = ("bernoulli", "normal"),
    trials: int = 200,
    n_boot: int = 400,
    level: float = 0.95,
    delta: float = 0.05,
    beta_ab: tuple = (2.0, 5.0),
) -> dict:
    """Coverage by setting and Np (see the module doc); ``rows`` is the table."""
    rng = np.random.default_rng(seed)
    a, b = beta_ab
    m = a / (a + b)
    var_mu = a * b / ((a + b) ** 2 * (a + b + 1))
    truth = {"bernoulli": (var_mu, m - (var_mu + m * m), m), "normal": (0.05, 0.2, 0.0)}
    rows = []
    for setting in settings:
        v_x, v_y, risk = truth[setting]
        ratio, ks = v_y / v_x, math.sqrt(v_y / v_x)
        for n in n_prompts:
            hit = {name: 0 for name in ("v_x", "v_y_given_x", "ratio", "k_star")}
            bern_true = bern_est = 0
            for t in range(trials):
                x = _draw(rng, setting, n, k, a, b, v_x, v_y)
                df = pl.DataFrame({"prompt_id": np.repeat(np.arange(n), k), "loss": x.ravel()})
                rep = variance_budget(df, n_boot=n_boot, seed=int(rng.integers(2**31)), ci_level=level,
                                      loss_bound=1.0)
                for name, true in (("v_x", v_x), ("v_y_given_x", v_y), ("ratio", ratio), ("k_star", ks)):
                    lo, hi = rep.ci[name]
                    hit[name] += lo <= true <= hi
                if setting == "bernoulli":
                    err = abs(float(x.mean()) - risk)
                    bern_true += err <= float(bernstein_bound(v_x, v_y, k, n, delta=delta, loss_bound=1.0))
                    bern_est += err <= float(bernstein_bound(rep.v_x, rep.v_y_given_x, k, n, delta=delta,
                                                             loss_bound=1.0))
            row = {"setting": setting, "n_prompts": n, "k": k, "true_ratio": ratio, "true_k_star": ks,
                   **{f"cover_{name}": h / trials for name, h in hit.items()}}
            if setting == "bernoulli":
                row["bernstein_true"] = bern_true / trials
                row["bernstein_estimated"] = bern_est / trials
            rows.append(row)
    return {"trials": trials, "n_boot": n_boot, "level": level, "delta": delta, "rows": rows}


def markdown_table(res: dict) -> str:
    head = ("| setting | Np | V_x | V_y\\|x | ratio | K* | Bernstein (true V) | Bernstein (estimated V) |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|\n")

    def pct(v):
        return "—" if v is None else f"{100 * v:.1f}%"

    return head + "\n".join(
        f"| {r['setting']} | {r['n_prompts']} | {pct(r['cover_v_x'])} | {pct(r['cover_v_y_given_x'])} | "
        f"{pct(r['cover_ratio'])} | {pct(r['cover_k_star'])} | {pct(r.get('bernstein_true'))} | "
        f"{pct(r.get('bernstein_estimated'))} |" for r in res["rows"]) + "\n"
