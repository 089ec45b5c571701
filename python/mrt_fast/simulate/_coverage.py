"""Are the advisor's intervals honest? Coverage of the bootstrap intervals and of the Bernstein bound.

Data with known truth, K responses for each of Np prompts (``SETTINGS``):

* ``bernoulli``: prompt means mu_i ~ Beta(a, b), losses l_ij ~ Bernoulli(mu_i)
  (a 0/1 loss: bounded in [0, 1], so the Bernstein bound applies);
  V_x = Var(mu), V_y|x = E[mu (1 - mu)];
* ``normal``: mu_i ~ N(0, 0.05), l_ij ~ N(mu_i, 0.2) (ratio 4);
* ``student_t``: as ``normal`` with Student-t (5 degrees of freedom) prompt effects and noise, scaled
  to the same variances (heavy tails: kurtosis 9);
* ``small_vx``: as ``normal`` with V_x = 0.0125 (ratio 16, K* = 4 at equal costs);
* ``gamma``: mu_i = exp(N(0, 0.25)), l_ij ~ Gamma(2, mu_i / 2) (a skewed positive loss whose
  noise grows with the prompt's mean, like a per-response NLL);
* ``unequal_k``: as ``bernoulli`` with K_i drawn uniformly from 2..2K-2 (mean K).

For each Np, ``trials`` data sets; every interval method in ``methods`` is computed from the same
resamples of the same data set (`mrt_fast.variance.intervals`, as `variance_budget` calls it:
the same prompts in the same order and the same seed, so the ``auto`` row is what
`variance_budget(..., n_boot, seed)` reports). The table gives how often each method's interval
(nominal ``level``) contains the true V_x, V_y|x, ratio and K*, how often its upper end for K* is
infinite (the data cannot rule out V_x = 0), and how often the Bernstein bound (failure
probability delta) holds for |R_hat - R| (R the population risk), with the true variances and with
the estimated ones plugged in.
"""

from __future__ import annotations

import math

import numpy as np

from mrt_fast.variance.intervals import bootstrap_intervals
from mrt_fast.variance.accumulator import VarianceAccumulator
from mrt_fast.variance.law import bernstein_bound

SETTINGS = ("bernoulli", "normal", "student_t", "small_vx", "gamma", "unequal_k")
_T_DF = 5
_GAMMA_S2, _GAMMA_SHAPE = 0.25, 2.0


def _truth(setting, a, b):
    """(V_x, V_y|x, population risk) of a setting."""
    if setting in ("bernoulli", "unequal_k"):
        m = a / (a + b)
        var_mu = a * b / ((a + b) ** 2 * (a + b + 1))
        return var_mu, m - (var_mu + m * m), m
    if setting == "small_vx":
        return 0.0125, 0.2, 0.0
    if setting == "gamma":
        e = math.exp(_GAMMA_S2)
        return (e - 1.0) * e, e * e / _GAMMA_SHAPE, math.exp(_GAMMA_S2 / 2)
    if setting in ("normal", "student_t"):
        return 0.05, 0.2, 0.0
    raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")


def _draw(rng, setting, n_prompts, k, a, b, v_x, v_y):
    """(prompt ids, losses) of one data set."""
    ks = rng.integers(2, 2 * k - 1, n_prompts) if setting == "unequal_k" else np.full(n_prompts, k)
    ids = np.repeat(np.arange(n_prompts), ks)
    if setting in ("bernoulli", "unequal_k"):
        mu = rng.beta(a, b, n_prompts)
        return ids, (rng.random(len(ids)) < mu[ids]).astype(np.float64)
    if setting == "student_t":
        sd = math.sqrt(_T_DF / (_T_DF - 2.0))
        mu = math.sqrt(v_x) * rng.standard_t(_T_DF, n_prompts) / sd
        return ids, mu[ids] + math.sqrt(v_y) * rng.standard_t(_T_DF, len(ids)) / sd
    if setting == "gamma":
        mu = np.exp(rng.normal(0.0, math.sqrt(_GAMMA_S2), n_prompts))
        return ids, rng.gamma(_GAMMA_SHAPE, mu[ids] / _GAMMA_SHAPE)
    mu = rng.normal(0.0, math.sqrt(v_x), n_prompts)
    return ids, rng.normal(mu[ids], math.sqrt(v_y))


def interval_coverage(
    seed: int = 0,
    n_prompts: tuple = (10, 20, 50, 200, 1000),
    k: int = 4,
    settings: tuple = ("bernoulli", "normal"),
    trials: int = 200,
    n_boot: int = 400,
    level: float = 0.95,
    delta: float = 0.05,
    beta_ab: tuple = (2.0, 5.0),
    methods: tuple = ("studentized", "expanded"),
) -> dict:
    """Coverage by setting, Np and interval method (see the module doc); ``rows`` is the table."""
    rng = np.random.default_rng(seed)
    a, b = beta_ab
    names = ("v_x", "v_y_given_x", "ratio", "k_star")
    rows = []
    for setting in settings:
        v_x, v_y, risk = _truth(setting, a, b)
        ratio, ks = v_y / v_x, math.sqrt(v_y / v_x)
        for n in n_prompts:
            hit = {m: dict.fromkeys(names, 0) for m in methods}
            inf_hi = dict.fromkeys(methods, 0)
            bern_true = bern_est = 0
            for _ in range(trials):
                ids, x = _draw(rng, setting, n, k, a, b, v_x, v_y)
                acc = VarianceAccumulator().update(ids, x)
                pp = acc._core.used_stats()  # the prompts in the order variance_budget resamples them
                boot_seed = int(rng.integers(2**31))
                ci, _, _ = bootstrap_intervals(pp["count"], pp["mean"], pp["m2"], n_boot=n_boot,
                                               rng=np.random.default_rng(boot_seed), cp=1.0, cr=1.0, k_max=1024,
                                               level=level, methods=methods)
                for m in methods:
                    for name, true in zip(names, (v_x, v_y, ratio, ks)):
                        lo, hi = ci[m][name]
                        hit[m][name] += lo <= true <= hi
                    inf_hi[m] += math.isinf(ci[m]["k_star"][1])
                if setting == "bernoulli":
                    s = acc.summary()
                    err = abs(float(x.mean()) - risk)
                    bern_true += err <= float(bernstein_bound(v_x, v_y, k, n, delta=delta, loss_bound=1.0))
                    bern_est += err <= float(bernstein_bound(s["v_x"], s["v_y_given_x"], k, n, delta=delta,
                                                             loss_bound=1.0))
            for m in methods:
                row = {"setting": setting, "n_prompts": n, "k": k, "method": m, "true_ratio": ratio,
                       "true_k_star": ks, **{f"cover_{name}": h / trials for name, h in hit[m].items()},
                       "k_star_upper_inf": inf_hi[m] / trials}
                if setting == "bernoulli":
                    row["bernstein_true"] = bern_true / trials
                    row["bernstein_estimated"] = bern_est / trials
                rows.append(row)
    return {"trials": trials, "n_boot": n_boot, "level": level, "delta": delta, "methods": list(methods),
            "rows": rows}


def markdown_table(res: dict, bernstein: bool = True) -> str:
    """The rows as a markdown table (one line per setting, Np and method)."""
    head = "| setting | Np | method | V_x | V_y\\|x | ratio | K* | K* upper = inf |"
    sep = "|---|---:|---|---:|---:|---:|---:|---:|"
    if bernstein:
        head += " Bernstein (true V) | Bernstein (estimated V) |"
        sep += "---:|---:|"

    def pct(v):
        return "—" if v is None else f"{100 * v:.1f}%"

    lines = [head, sep]
    for r in res["rows"]:
        line = (f"| {r['setting']} | {r['n_prompts']} | {r['method']} | {pct(r['cover_v_x'])} | "
                f"{pct(r['cover_v_y_given_x'])} | {pct(r['cover_ratio'])} | {pct(r['cover_k_star'])} | "
                f"{pct(r['k_star_upper_inf'])} |")
        if bernstein:
            line += f" {pct(r.get('bernstein_true'))} | {pct(r.get('bernstein_estimated'))} |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def comparison_table(res: dict, quantity: str = "k_star") -> str:
    """One quantity's coverage, a column per method (the first method's share of infinite K* upper
    ends last), a line per setting and Np."""
    methods = list(res["methods"])
    head = "| setting | Np | " + " | ".join(methods) + f" | K* upper = inf ({methods[0]}) |"
    sep = "|---|---:|" + "---:|" * (len(methods) + 1)
    rows: dict = {}
    for r in res["rows"]:
        rows.setdefault((r["setting"], r["n_prompts"]), {})[r["method"]] = r
    lines = [head, sep]
    for (setting, n), by in rows.items():
        cells = [f"{100 * by[m][f'cover_{quantity}']:.1f}%" for m in methods]
        inf_hi = 100 * by[methods[0]]["k_star_upper_inf"]
        lines.append(f"| {setting} | {n} | " + " | ".join(cells) + f" | {inf_hi:.1f}% |")
    return "\n".join(lines) + "\n"
