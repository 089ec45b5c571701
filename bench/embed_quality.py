"""What a fast embedding costs the selectors, scored by MiniLM.

For each data set and K, every selector keeps K responses per prompt twice:
once choosing with MiniLM embeddings, once with the fast tier's (modes for the
stratified selector are k-means on the same embeddings, K modes per pool, as
in ``mrt demo``). Both kept sets are then scored with MiniLM, as the demo
scores them: coverage = mean over a pool's candidates of the max cosine to a
kept one, diversity = 1 - mean pairwise cosine of the kept ones, averaged over
pools. The gap is (coverage with fast - coverage with MiniLM) / coverage with
MiniLM; the ranking is the order of the five selectors by coverage.
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

METHODS = ("random", "top", "diverse", "grades", "stratified")


def _kept_scores(df: pl.DataFrame, kept: pl.DataFrame, x_ref: np.ndarray) -> tuple[float, float]:
    """Mean (coverage, diversity) over pools, under the reference embeddings ``x_ref`` (rows of ``df``)."""
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
    return float(np.mean(covs)), float(np.mean(divs))


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


def quality_rows(name: str, df: pl.DataFrame, x_ref: np.ndarray, x_fast: np.ndarray, ks=(2, 4)) -> list[dict]:
    """One row per (K, selector): coverage/diversity of MiniLM's and the fast tier's picks, under MiniLM."""
    df = df.sort("prompt_id", maintain_order=True).with_row_index("__row") if "__row" not in df.columns else df
    rows = []
    for k in ks:
        ref = select_all(df, x_ref, k)
        fast = select_all(df, x_fast, k)
        for m in METHODS:
            c_ref, d_ref = _kept_scores(df, ref[m], x_ref)
            c_fast, d_fast = _kept_scores(df, fast[m], x_ref)
            same = set(ref[m]["__row"].to_list()) == set(fast[m]["__row"].to_list())
            rows.append({
                "dataset": name, "pools": int(df["prompt_id"].n_unique()), "texts": df.height, "k": k, "selector": m,
                "coverage_minilm": c_ref, "coverage_fast": c_fast, "coverage_gap": (c_fast - c_ref) / c_ref,
                "diversity_minilm": d_ref, "diversity_fast": d_fast, "same_picks": same,
            })
    for k in ks:
        sub = [r for r in rows if r["k"] == k]
        r_ref = _ranking(sub, "coverage_minilm")
        r_fast = _ranking(sub, "coverage_fast")
        for r in sub:
            r["ranking_minilm"] = " > ".join(r_ref)
            r["ranking_fast"] = " > ".join(r_fast)
            r["same_ranking"] = r_ref == r_fast
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
    head = ("| data (pools, texts) | K | selector | coverage, MiniLM picks | coverage, static picks | gap | "
            "diversity, MiniLM picks | diversity, static picks | same ranking |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['dataset']} ({r['pools']}, {r['texts']}) | {r['k']} | {r['selector']} | {r['coverage_minilm']:.4f} | "
        f"{r['coverage_fast']:.4f} | {100 * r['coverage_gap']:+.2f}% | {r['diversity_minilm']:.4f} | "
        f"{r['diversity_fast']:.4f} | {'yes' if r['same_ranking'] else 'no'} |\n"
        for r in rows
    )
    return head + body
