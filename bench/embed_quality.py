"""What a fast embedding costs the selectors, scored by MiniLM.

For each data set and K, every selector keeps K responses per prompt twice:
once choosing with MiniLM embeddings, once with the fast tier's (modes for the
stratified selector are k-means on the same embeddings, K modes per pool, as
in ``mrt demo``). Both kept sets are then scored with MiniLM, as the demo
scores them: coverage = mean over a pool's candidates of the max cosine to a
kept one, diversity = 1 - mean pairwise cosine of the kept ones, averaged over
pools. The gap is (coverage with fast - coverage with MiniLM) / coverage with
MiniLM; the ranking is the order of the five selectors by coverage.

Each gap comes with a 95% interval from a paired bootstrap over pools (pools
resampled with replacement, the same draw for both picks). The strict ranking
compares point estimates, so two selectors whose coverages differ by less than
the noise of the pools swap on a hair; the *resolved* comparison keeps only
the pairs of selectors that MiniLM's own picks separate (the paired bootstrap
interval of their coverage difference excludes 0) and counts how many of
those the fast tier reverses.
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

METHODS = ("random", "top", "diverse", "grades", "stratified")
BOOTSTRAP = 2000


def _kept_scores(df: pl.DataFrame, kept: pl.DataFrame, x_ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per pool (coverage, diversity), pools in a fixed order, under the reference embeddings ``x_ref``."""
    from mrt_fast.demo import kept_metrics

    covs, divs = [], []
    rows = df.select("__row", "prompt_id").group_by("prompt_id", maintain_order=True).agg(pl.col("__row"))
    kept_by = dict(kept.select("prompt_id", "__row").group_by("prompt_id").agg(pl.col("__row")).iter_rows())
    for pid, prow in rows.iter_rows():
        prow = np.asarray(prow)
        pos = np.searchsorted(prow, np.sort(np.asarray(kept_by[pid])))
        div, cov = kept_metrics(x_ref[prow], pos)
        covs.append(cov)
        divs.append(div)
    return np.asarray(covs, dtype=np.float64), np.asarray(divs, dtype=np.float64)


def _draws(n_pools: int, seed: int = 0) -> np.ndarray:
    """(BOOTSTRAP, n_pools) pool indices, the same for every comparison of a data set."""
    return np.random.default_rng(seed).integers(0, n_pools, size=(BOOTSTRAP, n_pools))


def gap_interval(c_ref: np.ndarray, c_fast: np.ndarray, draws: np.ndarray) -> tuple[float, float]:
    """95% paired-bootstrap interval of (mean c_fast - mean c_ref) / mean c_ref over pools."""
    r, f = c_ref[draws].mean(axis=1), c_fast[draws].mean(axis=1)
    lo, hi = np.percentile((f - r) / r, [2.5, 97.5])
    return float(lo), float(hi)


def separated(c_a: np.ndarray, c_b: np.ndarray, draws: np.ndarray) -> int:
    """+1 if a's coverage is above b's with 95% paired-bootstrap confidence, -1 if below, 0 if not separated."""
    d = (c_a - c_b)[draws].mean(axis=1)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return 1 if lo > 0 else -1 if hi < 0 else 0


def select_all(df: pl.DataFrame, x: np.ndarray, k: int) -> dict[str, pl.DataFrame]:
    """Every selector's kept rows at K = k choosing with embeddings ``x``."""
    from mrt_fast.select import SmallPoolWarning, select
    from mrt_fast.modes import pool_modes

    t = df.with_columns(pl.Series("embedding", x, dtype=pl.Array(pl.Float32, x.shape[1])))
    t = pool_modes(t, by="prompt_id", embedding="embedding", n_modes=k, seed=0)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        for m in METHODS:
            out[m] = select(t, k, m, seed=0)
    return out


def quality_rows(name: str, df: pl.DataFrame, x_ref: np.ndarray, x_fast: np.ndarray, ks=(2, 4),
                 tier: str = "static") -> list[dict]:
    """One row per (K, selector): coverage/diversity of MiniLM's and the fast tier's picks, under MiniLM."""
    df = df.sort("prompt_id", maintain_order=True).with_row_index("__row") if "__row" not in df.columns else df
    n_pools = int(df["prompt_id"].n_unique())
    draws = _draws(n_pools)
    rows = []
    per_pool: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
    for k in ks:
        ref = select_all(df, x_ref, k)
        fast = select_all(df, x_fast, k)
        for m in METHODS:
            c_ref, d_ref = _kept_scores(df, ref[m], x_ref)
            c_fast, d_fast = _kept_scores(df, fast[m], x_ref)
            per_pool[(k, m)] = (c_ref, c_fast)
            same = set(ref[m]["__row"].to_list()) == set(fast[m]["__row"].to_list())
            lo, hi = gap_interval(c_ref, c_fast, draws)
            cr, cf = float(c_ref.mean()), float(c_fast.mean())
            rows.append({
                "tier": tier, "dataset": name, "pools": n_pools, "texts": df.height, "k": k, "selector": m,
                "coverage_minilm": cr, "coverage_fast": cf, "coverage_gap": (cf - cr) / cr,
                "coverage_gap_ci95": [lo, hi], "diversity_minilm": float(d_ref.mean()),
                "diversity_fast": float(d_fast.mean()), "same_picks": same,
            })
    for k in ks:
        sub = [r for r in rows if r["k"] == k]
        r_ref = _ranking(sub, "coverage_minilm")
        r_fast = _ranking(sub, "coverage_fast")
        separated_pairs, reversed_pairs = [], []
        for i, a in enumerate(METHODS):
            for b in METHODS[i + 1 :]:
                sign = separated(per_pool[(k, a)][0], per_pool[(k, b)][0], draws)
                if sign:
                    hi_, lo_ = (a, b) if sign > 0 else (b, a)
                    separated_pairs.append(f"{hi_} > {lo_}")
                    fast = {r["selector"]: r["coverage_fast"] for r in sub}
                    if fast[hi_] < fast[lo_]:
                        reversed_pairs.append(f"{hi_} > {lo_}")
        for r in sub:
            r["ranking_minilm"] = " > ".join(r_ref)
            r["ranking_fast"] = " > ".join(r_fast)
            r["same_ranking"] = r_ref == r_fast
            r["pairs_separated_by_minilm"] = separated_pairs
            r["separated_pairs_reversed"] = reversed_pairs
    return rows


def _ranking(rows: list[dict], key: str, tol: float = 1e-9) -> list[str]:
    """Selectors by decreasing coverage; ties (within ``tol``) are written ``a = b`` in selector order."""
    order = sorted(rows, key=lambda r: (-round(r[key] / tol) * tol, METHODS.index(r["selector"])))
    out: list[str] = []
    prev = None
    for r in order:
        if prev is not None and abs(prev - r[key]) <= tol:
            out[-1] = out[-1] + " = " + r["selector"]
        else:
            out.append(r["selector"])
        prev = r[key]
    return out


def markdown(rows: list[dict]) -> str:
    """The quality table of one tier's rows."""
    tier = rows[0]["tier"] if rows else "fast"
    head = (f"| data (pools, texts) | K | selector | coverage, MiniLM picks | coverage, {tier} picks | gap | gap 95% CI | "
            f"diversity, MiniLM picks | diversity, {tier} picks | same ranking | separated pairs reversed |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['dataset']} ({r['pools']}, {r['texts']}) | {r['k']} | {r['selector']} | {r['coverage_minilm']:.4f} | "
        f"{r['coverage_fast']:.4f} | {100 * r['coverage_gap']:+.2f}% | "
        f"[{100 * r['coverage_gap_ci95'][0]:+.2f}, {100 * r['coverage_gap_ci95'][1]:+.2f}] | "
        f"{r['diversity_minilm']:.4f} | {r['diversity_fast']:.4f} | {'yes' if r['same_ranking'] else 'no'} | "
        f"{len(r['separated_pairs_reversed'])} of {len(r['pairs_separated_by_minilm'])} |\n"
        for r in rows
    )
    return head + body
