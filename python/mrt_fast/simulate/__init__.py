"""The paper's controlled experiments, reproducible on CPU with one call.

``run(quick=False, out=None, seed=0)`` runs every experiment, writes one PNG per
figure and ``results.json`` under ``out`` (when given) and returns the numbers;
each experiment is also its own function:

* :func:`variance_law` — Fig 1(a), variance of the empirical loss vs K;
* :func:`cost_budget` — Fig 1(b), test NLL vs K at a fixed prompt + response budget;
* :func:`selector_emse` — Fig 1(c), bias^2 + Tr Cov of each selector's gradient;
* :func:`topk_pool_sweep` — top-K bias as the candidate pool grows;
* :func:`token_transformer` — the ranking again with a small causal transformer;
* :func:`per_prompt_k` — per-prompt K (Neyman allocation from a noisy pilot) vs uniform K;
* :func:`interval_coverage` — coverage of the advisor's bootstrap intervals and of the Bernstein bound.

Needs the ``torch`` extra (CPU is enough).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from mrt_fast.simulate._estimate import decompose, k_star
from mrt_fast.simulate._coverage import interval_coverage
from mrt_fast.simulate._per_prompt_k import per_prompt_k
from mrt_fast.simulate._mdn_experiments import PAPER_BUDGET_MIN, PAPER_K_STAR, PAPER_VARIANCE, cost_budget, variance_law
from mrt_fast.simulate._selectors import selector_emse, topk_pool_sweep
from mrt_fast.simulate._tokens import token_transformer
from mrt_fast.simulate.report import comparison_rows, plot_all

__all__ = [
    "PAPER_BUDGET_MIN", "PAPER_K_STAR", "PAPER_VARIANCE", "comparison_rows", "cost_budget", "decompose",
    "interval_coverage", "k_star", "per_prompt_k", "plot_all", "run", "selector_emse", "token_transformer", "topk_pool_sweep", "variance_law",
]

#: experiment sizes: the paper's for the full run, a small version for tests
FULL = {
    "variance_law": {},
    "cost_budget": {},
    "selector_emse": {},
    "topk_pool_sweep": {},
    "token_transformer": {},
    "per_prompt_k": {},
    "interval_coverage": {},
}
QUICK = {
    "variance_law": {"trials": 100, "est_prompts": 100, "est_responses": 50},
    "cost_budget": {"seeds": 3, "epochs": 150, "ks": (1, 2, 4, 8, 16), "test_prompts": 50, "test_responses": 50},
    "selector_emse": {"n_prompts": 8, "pools": 60, "target_responses": 300},
    "topk_pool_sweep": {"n_prompts": 8, "pools": 40, "ns": (8, 32, 128), "target_responses": 300},
    "token_transformer": {"ks": (1, 4), "selectors": ("random", "top", "grades"), "n_prompts": 64, "steps": 120},
    "per_prompt_k": {"n_prompts": 60, "spreads": (0.0, 1.0), "pilots": (2, 8), "trials": 8},
    "interval_coverage": {"n_prompts": (20, 200), "trials": 20, "n_boot": 200},
}


def run(quick: bool = False, out: str | Path | None = None, seed: int = 0, threads: int = 2, progress=None) -> dict:
    """Run every experiment; with ``out``, write figures and ``results.json`` there."""
    import torch

    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    torch.set_num_threads(int(threads))
    sizes = QUICK if quick else FULL
    t0 = time.perf_counter()
    res: dict = {"quick": bool(quick), "seed": seed, "threads": int(threads)}
    steps = [
        ("variance_law", variance_law),
        ("cost_budget", cost_budget),
        ("selector_emse", selector_emse),
        ("topk_pool_sweep", topk_pool_sweep),
        ("token_transformer", token_transformer),
        ("per_prompt_k", per_prompt_k),
        ("interval_coverage", interval_coverage),
    ]
    for name, fn in steps:
        if progress is not None:
            progress(name)
        kw = dict(sizes[name])
        if name == "cost_budget":
            kw["ratio"] = res["variance_law"]["ratio"]
        res[name] = fn(seed=seed, **kw)
    if not quick:
        if progress is not None:
            progress("selector_emse (trained network)")
        res["selector_emse_trained"] = selector_emse(seed=seed, model="trained")
    res["total_seconds"] = time.perf_counter() - t0
    res["comparison"] = comparison_rows(res)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        res["figures"] = [p.name for p in plot_all(res, out)]
        from mrt_fast._util.files import write_text

        write_text(out / "results.json", json.dumps(res, indent=1, default=float))
    return res
