"""Per-prompt K against uniform K at the same total, with a pilot's estimation noise (NumPy only).

Prompt i has a true mean loss mu_i ~ N(0, V_x) and a within-prompt standard
deviation sigma_i = sigma_0 exp(s z_i - s^2 / 2), z_i ~ N(0, 1): ``s`` (the
log-sd of sigma) sets how unequal the prompts' noise is (s = 0: all equal).
A pilot draws ``n0`` normal losses per prompt; `mrt_fast.variance.allocate.allocate_k`
turns them into K_i (shrunk or raw variances) for a total of R = Np * K
responses, each K_i capped by a pool of ``pool`` candidates. The variance of
the per-prompt-averaged risk is then exact given the true sigma_i:

    Var = V_x / Np + sum_i sigma_i^2 / K_i / Np^2,

and the gain is Var(uniform K) / Var(allocation), averaged over pilots (with
its 10th percentile: how bad an unlucky pilot is). The oracle allocates with
the true sigma_i. The pilot's own responses are not counted in R.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from mrt_fast.variance.allocate import allocate_k, neyman_allocation, within_variance


def per_prompt_k(
    seed: int = 0,
    n_prompts: int = 200,
    k: int = 4,
    pool: int = 16,
    spreads: tuple = (0.0, 0.25, 0.5, 0.75, 1.0),
    pilots: tuple = (2, 4, 8),
    v_x_over_v_y: tuple = (0.0, 0.25),
    trials: int = 40,
    sigma0: float = 1.0,
) -> dict:
    """Gain of per-prompt K over uniform K by spread, pilot size and shrinkage (see the module doc)."""
    rng = np.random.default_rng(seed)
    total = n_prompts * k
    caps = np.full(n_prompts, pool)
    sizes = pl.DataFrame({"prompt_id": np.arange(n_prompts), "pool_size": caps})
    rows = []
    for s in spreads:
        for n0 in pilots:
            acc = {name: [] for name in ("oracle", "shrunk", "raw")}
            for _ in range(trials):
                sig = sigma0 * np.exp(s * rng.standard_normal(n_prompts) - s * s / 2)
                x = rng.normal(0.0, sig[:, None], (n_prompts, n0))
                s2 = x.var(1, ddof=1)
                v_pool = float(s2.mean())
                stats = pl.DataFrame({"prompt_id": np.arange(n_prompts), "count": np.full(n_prompts, n0),
                                      "var": s2})
                uni = within_variance(sig**2, neyman_allocation(np.ones(n_prompts), total, 1, caps))
                ks = {
                    "oracle": neyman_allocation(sig**2, total, 1, caps),
                    "shrunk": allocate_k(stats, 0.0, v_pool, total, pool_sizes=sizes).table["k"].to_numpy(),
                    "raw": allocate_k(stats, 0.0, v_pool, total, pool_sizes=sizes, shrink=0).table["k"].to_numpy(),
                }
                for name, kk in ks.items():
                    acc[name].append((uni, within_variance(sig**2, kk)))
            for ratio in v_x_over_v_y:
                v_x = ratio * sigma0**2
                row = {"spread": s, "cv_sigma": float(np.sqrt(np.exp(s * s) - 1)), "pilot": n0, "v_x_over_v_y": ratio}
                for name, pairs in acc.items():
                    g = np.array([(v_x / n_prompts + u) / (v_x / n_prompts + a) for u, a in pairs])
                    row[f"gain_{name}"] = float(g.mean())
                    row[f"gain_{name}_p10"] = float(np.quantile(g, 0.1))
                rows.append(row)
    return {"n_prompts": n_prompts, "k": k, "pool": pool, "trials": trials, "rows": rows}


def markdown_table(res: dict) -> str:
    """The result as a markdown table (one row per spread x pilot x V_x / V_y|x)."""
    head = ("| CV(sigma) | pilot n0 | V_x/V_y|x | oracle | shrunk (p10) | raw (p10) |\n"
            "|---:|---:|---:|---:|---:|---:|\n")
    lines = [f"| {r['cv_sigma']:.2f} | {r['pilot']} | {r['v_x_over_v_y']:g} | {r['gain_oracle']:.3f} | "
             f"{r['gain_shrunk']:.3f} ({r['gain_shrunk_p10']:.3f}) | {r['gain_raw']:.3f} ({r['gain_raw_p10']:.3f}) |"
             for r in res["rows"]]
    return head + "\n".join(lines) + "\n"
